#!/usr/bin/env python3
"""tb_compare.py METRICS.jsonl SCALARS.jsonl: every number of metrics.jsonl is a TensorBoard scalar
at the same step with the same value, and TensorBoard holds no scalar that metrics.jsonl lacks.

SCALARS.jsonl holds {"step": S, "tag": T, "value": V} lines (tests/tools/tb_dump's, or
tb_reader.py's from EventAccumulator); other lines are ignored. A metrics key's tag is
eval/X for eval_X, step_time/K for the step-time split, train/K otherwise (train/train_tb.c).
A value matches to the digits metrics.jsonl printed (plus float32 rounding: TensorBoard scalars
are float32). Exit 1 naming the first difference; standard library only. Fails closed: an empty
file on either side is a failure."""
import json
import re
import sys

STEP_TIME = {"data_wait_s", "forward_s", "backward_s", "communication_s", "communication_hidden", "optimizer_s"}


def tag_of(key):
    if key.startswith("eval_"):
        return "eval/" + key[5:]
    return ("step_time/" if key in STEP_TIME else "train/") + key


def tolerance(text, v):
    """Half a unit in the last printed digit, and float32's relative rounding."""
    m = re.fullmatch(r"-?\d*(?:\.(\d+))?(?:[eE]([+-]?\d+))?", text)
    if not m:
        return None
    decimals = len(m.group(1) or "")
    exp = int(m.group(2) or 0)
    return 0.5 * 10.0 ** (exp - decimals) + 1.2e-7 * abs(v) + 1e-30


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: tb_compare.py METRICS.jsonl SCALARS.jsonl")
    want = {}
    with open(sys.argv[1]) as f:
        for line in f:
            obj = json.loads(line)
            step = obj["step"]
            # the printed text of each number, for its tolerance
            for key, text in re.findall(r'"([a-z_]+)": ([-+0-9.eEa-z]+)', line):
                if key in ("step", "time"):
                    continue
                want[(step, tag_of(key))] = (float(obj[key]), text)
    got = {}
    with open(sys.argv[2]) as f:
        for line in f:
            obj = json.loads(line)
            if "value" not in obj:
                continue
            k = (obj["step"], obj["tag"])
            if k in got:
                sys.exit(f"tb_compare: two scalars {k[1]} at step {k[0]}")
            got[k] = float(obj["value"])
    if not want or not got:
        sys.exit(f"tb_compare: nothing to compare ({len(want)} metrics, {len(got)} scalars)")
    for k in sorted(want):
        v, text = want[k]
        if k not in got:
            sys.exit(f"tb_compare: metrics.jsonl has {k[1]} at step {k[0]} = {text}, TensorBoard has no such scalar")
        tol = tolerance(text, v)
        if tol is None or abs(got[k] - v) > tol:
            sys.exit(f"tb_compare: {k[1]} at step {k[0]}: metrics.jsonl {text}, TensorBoard {got[k]!r}")
    extra = sorted(set(got) - set(want))
    if extra:
        sys.exit(f"tb_compare: TensorBoard has {len(extra)} scalars metrics.jsonl lacks, first {extra[0]}")
    print(f"tb_compare: {len(want)} values at {len({s for s, _ in want})} steps agree")


main()
