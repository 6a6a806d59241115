#!/usr/bin/env python3
"""tb_reader.py RUN_DIR PROTO: a mirror run's TensorBoard files read by TensorBoard itself.

1. proto/tensorboard.proto's messages have the field numbers and types of PyPI tensorboard's
   own descriptors (tensorboard.compat.proto): what mirror encodes is what TensorBoard decodes.
2. EventAccumulator (the reader behind TensorBoard's scalar, histogram and text views, with its
   purge of orphaned data on a SessionLog START) over RUN_DIR/tb: every scalar equals
   metrics.jsonl (tests/e2e/tb_compare.py), every parameter has params/ and grads/ histograms
   whose bucket counts sum to num, and the config text is config.yaml.
3. tbparse, when installed, reads the same scalars.
Exit 1 naming the first difference (fail closed: no scalars is a failure)."""
import json
import os
import re
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.compat.proto import event_pb2, histogram_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2

HERE = os.path.dirname(os.path.abspath(__file__))


def check_proto(path):
    """Every field of every message in PROTO against tensorboard's descriptor of that message."""
    text = open(path).read()
    descs = {
        "Event": event_pb2.Event.DESCRIPTOR, "SessionLog": event_pb2.SessionLog.DESCRIPTOR,
        "Summary": summary_pb2.Summary.DESCRIPTOR, "Value": summary_pb2.Summary.Value.DESCRIPTOR,
        "SummaryMetadata": summary_pb2.SummaryMetadata.DESCRIPTOR,
        "PluginData": summary_pb2.SummaryMetadata.PluginData.DESCRIPTOR,
        "HistogramProto": histogram_pb2.HistogramProto.DESCRIPTOR,
        "TensorShapeProto": tensor_shape_pb2.TensorShapeProto.DESCRIPTOR,
        "Dim": tensor_shape_pb2.TensorShapeProto.Dim.DESCRIPTOR, "TensorProto": tensor_pb2.TensorProto.DESCRIPTOR,
    }
    scalar_types = {"double": 1, "float": 2, "int64": 3, "int32": 5, "bool": 8, "string": 9, "bytes": 12}
    checked = 0
    stack = []
    for line in text.splitlines():
        line = line.split("//")[0].strip()
        m = re.match(r"message (\w+) \{", line)
        if m:
            stack.append(m.group(1))
            continue
        if re.match(r"(enum|oneof) \w+ \{", line):
            stack.append(None)
            continue
        if line == "}":
            stack.pop()
            continue
        m = re.match(r"(repeated )?(\w+) (\w+) = (\d+)", line)
        msg = next((s for s in reversed(stack) if s), None)
        if not m or msg is None:
            continue
        if msg not in descs:
            sys.exit(f"tb_reader.py: message {msg} of {path} has no tensorboard descriptor to check against")
        f = descs[msg].fields_by_name.get(m.group(3))
        if f is None:
            sys.exit(f"tb_reader.py: {msg}.{m.group(3)} is not a field of tensorboard's {descs[msg].full_name}")
        if f.number != int(m.group(4)):
            sys.exit(f"tb_reader.py: {msg}.{m.group(3)} = {m.group(4)}, tensorboard's is {f.number}")
        want = scalar_types.get(m.group(2))
        if want is not None and f.type != want:
            sys.exit(f"tb_reader.py: {msg}.{m.group(3)} is {m.group(2)}, tensorboard's has type {f.type}")
        if bool(m.group(1)) != (f.label == 3 if hasattr(f, "label") else f.is_repeated):
            sys.exit(f"tb_reader.py: {msg}.{m.group(3)}: repeated differs from tensorboard's")
        checked += 1
    if checked < 30:
        sys.exit(f"tb_reader.py: only {checked} fields of {path} checked")
    print(f"tb_reader.py: {checked} fields of {os.path.basename(path)} match tensorboard's descriptors")


def main():
    run, proto = sys.argv[1], sys.argv[2]
    check_proto(proto)
    acc = ea.EventAccumulator(os.path.join(run, "tb"), size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    lines = []
    for tag in tags["scalars"]:
        for e in acc.Scalars(tag):
            lines.append(json.dumps({"step": e.step, "tag": tag, "value": e.value}))
    if not lines:
        sys.exit("tb_reader.py: EventAccumulator found no scalars")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        r = subprocess.run([sys.executable, os.path.join(HERE, "tb_compare.py"), os.path.join(run, "metrics.jsonl"), f.name])
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        sys.exit("tb_reader.py: EventAccumulator's scalars differ from metrics.jsonl")
    hists = tags["histograms"]
    params = sorted(t[len("params/"):] for t in hists if t.startswith("params/"))
    if not params or sorted(t[len("grads/"):] for t in hists if t.startswith("grads/")) != params:
        sys.exit(f"tb_reader.py: histograms {hists}: not one params/ and one grads/ per parameter")
    for t in hists:
        for h in acc.Histograms(t):
            v = h.histogram_value
            if v.num <= 0 or sum(v.bucket) != v.num or not v.min <= v.max or len(v.bucket) != len(v.bucket_limit):
                sys.exit(f"tb_reader.py: histogram {t} at step {h.step}: num {v.num}, buckets sum {sum(v.bucket)}")
    texts = acc.Tensors("config") if "config" in tags["tensors"] else []
    want = "```yaml\n" + open(os.path.join(run, "config.yaml")).read() + "\n```"
    got = [t.tensor_proto.string_val[0].decode() for t in texts]
    # one per run start (a resumed run logs its own config, at its first step); the last is
    # the run directory's config.yaml
    starts = len([n for n in os.listdir(os.path.join(run, "tb")) if "tfevents" in n])
    if len(got) != starts or got[-1] != want:
        sys.exit(f"tb_reader.py: {len(got)} config texts for {starts} event files, or the last is not config.yaml")
    print(f"tb_reader.py: EventAccumulator: {len(lines)} scalars, {len(hists)} histogram tags over "
          f"{len(params)} parameters, {len(got)} config texts")
    try:
        from tbparse import SummaryReader
    except ImportError:
        print("tb_reader.py: tbparse not installed; its check skipped")
        return
    df = SummaryReader(os.path.join(run, "tb")).scalars
    if len(df) != len(lines):
        # tbparse reads every event and applies no purge: the resumed steps are there twice
        steps = {(row.tag, row.step) for row in df.itertuples()}
        ours = {(json.loads(l)["tag"], json.loads(l)["step"]) for l in lines}
        if steps != ours:
            sys.exit(f"tb_reader.py: tbparse's scalars ({len(df)}) are not EventAccumulator's ({len(lines)})")
        print(f"tb_reader.py: tbparse: {len(df)} scalar events (it keeps the purged duplicates), the same steps")
    else:
        print(f"tb_reader.py: tbparse: {len(df)} scalars, the same")


main()
