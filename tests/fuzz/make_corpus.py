#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/ (small valid and invalid inputs).

Run from anywhere: python3 tests/fuzz/make_corpus.py. Deterministic (gzip mtime 0), so rerunning
it changes nothing. Config seeds are tests/configs/{good,bad}/*.yaml with every data path replaced
by /etc/passwd, a file every Debian machine has, so the valid ones parse from any directory."""
import gzip
import os
import re
import struct

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def put(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def gz(data):
    return gzip.compress(data, compresslevel=9, mtime=0)


def idx(type_byte, dims, data):
    return bytes([0, 0, type_byte, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


# ---- idx --------------------------------------------------------------------------------------------
images = idx(8, [3, 2, 2], bytes(range(12)))
labels = idx(8, [3], bytes([1, 0, 9]))
put("idx", "images_3x2x2", images)
put("idx", "labels_3", labels)
put("idx", "images_3x2x2.gz", gz(images))
put("idx", "labels_3.gz", gz(labels))
put("idx", "images_4d", idx(8, [2, 1, 2, 2], bytes(8)))
put("idx", "empty_n0", idx(8, [0, 28, 28], b""))
put("idx", "truncated_data", images[:-3])
put("idx", "trailing_bytes", labels + b"\x00")
put("idx", "bad_magic", b"\x01\x02" + images[2:])
put("idx", "type_f32", idx(0x0D, [2], b"\x00" * 8))
put("idx", "type_bad", idx(0x0A, [2], b"\x00" * 2))
put("idx", "ndim_0", bytes([0, 0, 8, 0]))
put("idx", "huge_dims", idx(8, [0x7FFFFFFF, 0x7FFFFFFF], b""))
put("idx", "short_header", b"\x00\x00\x08\x03\x00\x00")
put("idx", "truncated.gz", gz(images)[:-6])
put("idx", "corrupt.gz", gz(images)[:12] + b"\xff" * 8 + gz(images)[20:])
put("idx", "gzip_trailing_garbage.gz", gz(labels) + b"garbage")
put("idx", "two_members.gz", gz(labels[:6]) + gz(labels[6:]))

# ---- tokens (the fuzzer reads each as u16/u32, raw/llm.c, context 1/3) ------------------------------
def llmc(version, tokens):
    fmt = "<%dH" % len(tokens) if version == 1 else "<%dI" % len(tokens)
    head = struct.pack("<3i", 20240520, version, len(tokens)) + b"\x00" * (1024 - 12)
    return head + struct.pack(fmt, *tokens)


toks = [50256, 15496, 11, 995, 0, 1, 2, 3, 4, 5, 6]
put("tokens", "raw_u16", struct.pack("<%dH" % len(toks), *toks))
put("tokens", "raw_u32", struct.pack("<%dI" % len(toks), *toks))
put("tokens", "llmc_v1_u16", llmc(1, toks))
put("tokens", "llmc_v2_u32", llmc(2, toks))
put("tokens", "llmc_bad_count", llmc(1, toks)[:8] + struct.pack("<i", 99) + llmc(1, toks)[12:])
put("tokens", "llmc_bad_magic", b"\x00" * 4 + llmc(2, toks)[4:])
put("tokens", "llmc_short_header", llmc(1, toks)[:100])
put("tokens", "u32_above_int32", struct.pack("<4I", 1, 0x80000000, 2, 0xFFFFFFFF))
put("tokens", "odd_size", b"\x01\x00\x02\x00\x03")
put("tokens", "one_token", b"\x07\x00")
put("tokens", "empty", b"")

# ---- text -------------------------------------------------------------------------------------------
put("text", "ascii", b"First Citizen:\nBefore we proceed any further, hear me speak.\n")
put("text", "utf8", "héllo wörld — ∑ 𝄞 日本語\n".encode())
put("text", "one_byte", b"a")
put("text", "empty", b"")
put("text", "invalid_continuation", b"ab\xc3\x28cd")
put("text", "overlong", b"ab\xc0\xafcd")
put("text", "surrogate", b"ab\xed\xa0\x80cd")
put("text", "above_10ffff", b"ab\xf4\x90\x80\x80cd")
put("text", "truncated_4byte", b"abcd\xf0\x9f\x98")
put("text", "latin1", "café crème".encode("latin-1"))
tiny = os.path.join(root, "tests", "configs", "good", "tiny.txt")
if os.path.exists(tiny):
    with open(tiny, "rb") as f:
        put("text", "tiny_txt", f.read()[:4096])

# ---- config -----------------------------------------------------------------------------------------
path_keys = re.compile(r"((?:images|labels|path|init_from)\s*:\s*)([^,}\s]+)")
for kind in ("good", "bad"):
    d = os.path.join(root, "tests", "configs", kind)
    for name in sorted(os.listdir(d)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(d, name)) as f:
            text = f.read()
        if name not in ("missing_file.yaml", "missing_init.yaml"):
            text = path_keys.sub(lambda m: m.group(1) + "/etc/passwd", text)
        put("config", kind + "_" + name, text.encode())
put("config", "random_sweep.yaml", b"""data: {train: {source: text, path: /etc/passwd, context: 8}}
model: {type: gpt, vocab: 256, context: 8, layers: 1, heads: 2, embd: 8}
sweep:
  method: random
  trials: 4
  seed: 7
  metric: eval_loss
  goal: min
  params:
    optimizer.lr: {min: 1.0e-4, max: 1.0e-2, log: true}
    train.batch: [8, 16]
""")
put("config", "anchors.yaml", b"""base: &b {source: text, path: /etc/passwd, context: 8}
data: {train: *b}
model: {type: gpt, vocab: 256, context: 8, layers: 1, heads: 2, embd: 8}
""")
