#!/usr/bin/env bash
# TensorBoard event files (train/tb.h, train/train_tb.c) through the CLI, read back by
# tests/tools/tb_dump (every record's CRCs checked, decoded with protobuf-c, a SessionLog START
# dropping later steps as TensorBoard does) and compared with metrics.jsonl by tb_compare.py:
#   1. an uninterrupted CNN run: every metrics.jsonl number is a scalar with its value, nothing
#      else is; the config text; histograms of every parameter and gradient with their sizes;
#   2. the same run killed after its last checkpoint (the newest checkpoint deleted: the run is
#      resumed from an older one) and resumed: two files, one curve equal to metrics.jsonl and,
#      for the loss and the evaluation, to the uninterrupted run's;
#   3. a character GPT: tokens/s and perplexity;
#   4. log.tensorboard: false writes nothing; a run directory where tb/ cannot be made fails
#      with the path; a truncated or corrupted event file is reported by record and byte.
# Usage: tensorboard.sh MIRROR TB_DUMP
set -uo pipefail
mirror=${1:?usage: tensorboard.sh MIRROR TB_DUMP}
tb_dump=${2:?usage: tensorboard.sh MIRROR TB_DUMP}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
need_fashion_mnist
command -v python3 >/dev/null || { echo "FAILED: python3 is missing (tests/run.sh installs it)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
compare() { python3 "$here/tb_compare.py" "$@"; }
scalar() { # scalar DUMP TAG STEP: the value, or nothing
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    if o.get("tag") == sys.argv[2] and o.get("step") == int(sys.argv[3]) and "value" in o: print(repr(o["value"]))' "$@"
}

run=(--quiet --set train.steps=60 --set train.log_every=5 --set train.eval_every=15 --set checkpoint.every=30
     --set log.histogram_every=15)

# 1. uninterrupted
"$mirror" train "$root/configs/cnn.yaml" "${run[@]}" --set checkpoint.dir="$work/a" >"$work/a.log" 2>&1
check "the uninterrupted run trains" "[ $? -eq 0 ]"
"$tb_dump" "$work/a/tb" >"$work/a.dump" 2>"$work/a.err"
check "tb_dump reads the run's events" "[ $? -eq 0 ] && nonempty_file '$work/a.dump'"
check "one event file, version brain.Event:2" \
    "[ \$(ls '$work/a/tb' | grep -c tfevents) -eq 1 ] && [ \$(grep -c '\"file_version\": \"brain.Event:2\"' '$work/a.dump') -eq 1 ]"
check "every metrics.jsonl number is a scalar of that value (and no other scalar)" \
    "compare '$work/a/metrics.jsonl' '$work/a.dump'"
check "the training scalars at every log step: 12 steps of train/loss" \
    "[ \$(grep -c '\"tag\": \"train/loss\"' '$work/a.dump') -eq 12 ]"
check "the evaluation at steps 15, 30, 45, 60" \
    "[ \$(grep -c '\"tag\": \"eval/accuracy\"' '$work/a.dump') -eq 4 ] && [ -n \"\$(scalar '$work/a.dump' eval/loss 60)\" ]"
python3 - "$work/a.dump" "$work/a/config.yaml" <<'EOF'
import json, sys
texts = [json.loads(l) for l in open(sys.argv[1]) if '"text"' in l]
want = "```yaml\n" + open(sys.argv[2]).read() + "\n```"
ok = len(texts) == 1 and texts[0]["tag"] == "config" and texts[0]["plugin"] == "text" and texts[0]["step"] == 1
sys.exit(0 if ok and texts[0]["text"] == want else 1)
EOF
check "the resolved config as text (plugin text) at step 1, equal to config.yaml" "[ $? -eq 0 ]"
python3 - "$work/a.dump" <<'EOF'
import json, sys
numel = {"conv1.weight": 288, "conv1.bias": 32, "conv2.weight": 18432, "conv2.bias": 64,
         "fc1.weight": 401408, "fc1.bias": 128, "fc2.weight": 1280, "fc2.bias": 10}
h = [json.loads(l) for l in open(sys.argv[1]) if '"num"' in l]
seen = {(o["step"], o["tag"]) for o in h}
want = {(s, f"{kind}/{n}") for s in (15, 30, 45, 60) for kind in ("params", "grads") for n in numel}
bad = [o for o in h if o["num"] != numel[o["tag"].split("/", 1)[1]] or o["bucket_sum"] != o["num"]
       or not o["limits_sorted"] or o["adjacent_empty"] or not o["min"] <= o["max"]]
print(f"{len(h)} histograms, {len(bad)} bad, {len(want - seen)} missing, {len(seen - want)} extra")
sys.exit(0 if seen == want and len(h) == len(want) and not bad else 1)
EOF
check "histograms of the 8 parameters and gradients at steps 15, 30, 45, 60: sizes, buckets, no adjacent empty buckets" "[ $? -eq 0 ]"

# 2. killed after the checkpoint of step 30 (its step-45 checkpoint lost), resumed
"$mirror" train "$root/configs/cnn.yaml" "${run[@]}" --set train.steps=45 --set checkpoint.dir="$work/b" >"$work/b1.log" 2>&1
check "the first part trains to 45" "[ $? -eq 0 ] && [ -f '$work/b/ckpt-00000045.h5' ] && [ -f '$work/b/ckpt-00000030.h5' ]"
rm -f "$work/b/ckpt-00000045.h5"
# no pause: the resumed run's file sorts after the first one's even within the same second (train/tb.c)
"$mirror" train "$root/configs/cnn.yaml" "${run[@]}" --set checkpoint.dir="$work/b" >"$work/b2.log" 2>&1
check "the resumed run trains from step 30" "[ $? -eq 0 ] && grep -q 'resumed from .*ckpt-00000030.h5 at step 30' '$work/b2.log'"
"$tb_dump" "$work/b/tb" >"$work/b.dump" 2>"$work/b.err"
check "tb_dump reads both files" "[ $? -eq 0 ] && [ \$(ls '$work/b/tb' | grep -c tfevents) -eq 2 ] && grep -q '\"starts\": 2' '$work/b.dump'"
check "the resumed directory is one curve: metrics.jsonl's numbers exactly" "compare '$work/b/metrics.jsonl' '$work/b.dump'"
same_curve=1
for s in 5 30 35 45 50 60; do
    [ -n "$(scalar "$work/a.dump" train/loss $s)" ] && \
        [ "$(scalar "$work/a.dump" train/loss $s)" = "$(scalar "$work/b.dump" train/loss $s)" ] || same_curve=0
done
for s in 15 30 45 60; do
    [ -n "$(scalar "$work/a.dump" eval/loss $s)" ] && \
        [ "$(scalar "$work/a.dump" eval/loss $s)" = "$(scalar "$work/b.dump" eval/loss $s)" ] || same_curve=0
done
check "its loss and evaluation curves equal the uninterrupted run's (steps 35-45 logged twice, shown once)" \
    "[ $same_curve -eq 1 ] && [ \$(grep -c '\"tag\": \"train/loss\"' '$work/b.dump') -eq 12 ]"

# 3. a language model: tokens/s and perplexity (on a text long enough for the evaluation's holdout)
for _ in $(seq 40); do cat "$root/tests/configs/good/tiny.txt"; done >"$work/text.txt"
"$mirror" train "$root/tests/configs/good/gpt_text.yaml" --quiet --set train.steps=6 --set train.log_every=3 \
    --set train.accumulate=1 --set distribute.devices=auto --set distribute.backend=auto \
    --set distribute.shard_optimizer=false --set data.train.path="$work/text.txt" \
    --set data.eval.source=text --set data.eval.path="$work/text.txt" \
    --set train.eval_every=6 --set checkpoint.dir="$work/g" >"$work/g.log" 2>&1
check "the character GPT trains" "[ $? -eq 0 ]"
"$tb_dump" "$work/g/tb" >"$work/g.dump" 2>&1
check "its scalars equal metrics.jsonl, tokens/s and perplexity among them" \
    "compare '$work/g/metrics.jsonl' '$work/g.dump' && [ -n \"\$(scalar '$work/g.dump' train/tokens_per_s 6)\" ] && [ -n \"\$(scalar '$work/g.dump' eval/perplexity 6)\" ]"

# 4. off, unwritable, damaged
"$mirror" train "$root/configs/cnn.yaml" --quiet --set train.steps=4 --set log.tensorboard=false \
    --set checkpoint.dir="$work/off" >"$work/off.log" 2>&1
check "log.tensorboard: false writes no tb/" "[ $? -eq 0 ] && [ -f '$work/off/metrics.jsonl' ] && [ ! -e '$work/off/tb' ]"
mkdir -p "$work/ro" && touch "$work/ro/tb"
"$mirror" train "$root/configs/cnn.yaml" --quiet --set train.steps=4 --set checkpoint.dir="$work/ro" >"$work/ro.log" 2>&1
rc=$?
check "a tb/ that cannot be made: exit 1 naming it" "[ $rc -eq 1 ] && grep -q '$work/ro/tb' '$work/ro.log'"
f=$(ls "$work"/a/tb/events.out.tfevents.* | head -1)
size=$(stat -c %s "$f")
mkdir -p "$work/cut" "$work/flip"
head -c $((size - 7)) "$f" >"$work/cut/events.out.tfevents.1"
"$tb_dump" "$work/cut" >/dev/null 2>"$work/cut.err"
check "a truncated event file: the record and byte, cut short" "[ $? -ne 0 ] && grep -q 'record [0-9]* at byte [0-9]* is cut short' '$work/cut.err'"
cp "$f" "$work/flip/events.out.tfevents.1"
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0xff; open(p, "wb").write(b)' \
    "$work/flip/events.out.tfevents.1"
"$tb_dump" "$work/flip" >/dev/null 2>"$work/flip.err"
check "a damaged byte: the record's CRC-32C does not match" "[ $? -ne 0 ] && grep -q \"CRC-32C does not match\" '$work/flip.err'"
"$tb_dump" "$work/off" >/dev/null 2>&1
check "tb_dump fails on a directory without event files" "[ $? -ne 0 ]"
finish
