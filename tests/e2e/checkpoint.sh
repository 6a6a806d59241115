#!/usr/bin/env bash
# Checkpoints end to end through build/mirror: a run killed with kill -9 at random moments (while
# training and while saving) always leaves a complete checkpoint that loads, and once resumed to
# the end it is bit-identical to a run that never stopped (every parameter and optimizer slot,
# compared by `mirror inspect`'s CRC-32s, and every logged loss and evaluation); SIGTERM saves and
# exits 143, Ctrl-C (SIGINT) saves and exits 130, a second Ctrl-C stops at once; `mirror eval`
# reproduces the final accuracy; `mirror inspect` of a damaged file fails naming it.
# Usage: tests/e2e/checkpoint.sh path/to/mirror
set -uo pipefail
mirror=${1:?usage: checkpoint.sh path/to/mirror}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_fashion_mnist
tmp=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT

steps=1500
cat >"$tmp/exp.yaml" <<YAML
seed: 3
model: {type: mlp, sizes: [784, 512, 512, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 5000}
  eval: {source: idx, images: $fm/t10k-images-idx3-ubyte.gz, labels: $fm/t10k-labels-idx1-ubyte.gz}
optimizer: {type: adamw, lr: 1.0e-3}
schedule: {type: cosine, warmup: 20}
train: {steps: $steps, batch: 64, eval_every: 300, log_every: 25}
checkpoint: {every: 20, keep: 2, resume: auto}
YAML
# the deterministic part of metrics.jsonl (no times, no speeds)
values() { sed -E 's/"time": [^,]*, //; s/, "samples_per_s".*\}/}/' "$1"; }
crcs() { "$mirror" inspect "$1" | grep crc32 | awk '{print $1, $NF}'; }
last_ckpt() { ls "$1"/ckpt-*.h5 2>/dev/null | sort | tail -1; }

# 1. the reference: one uninterrupted run
out=$("$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/a" 2>&1); rc=$?
check "uninterrupted run exits 0" "[ $rc -eq 0 ]"
acc=$(echo "$out" | sed -n 's/.*eval accuracy \([0-9.]*\).*/\1/p' | tail -1)

# 2. kill -9 at random moments (a fixed sequence, so failures reproduce), then resume to the end.
# Each run is killed a random 0-0.5 s after it logs its first step (checkpoints every 20 steps, so
# some kills land while a checkpoint is being written), so the moments do not depend on the speed
# of the machine.
delays=(0.31 0.07 0.45 0.18 0.26 0.02 0.39 0.12 0.49 0.21)
kills=0
started() { grep -q '^step ' "$1" 2>/dev/null; }
for d in "${delays[@]}"; do
    "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/b" >"$tmp/b.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do started "$tmp/b.log" || ! kill -0 "$pid" 2>/dev/null && break; sleep 0.02; done
    sleep "$d"
    if kill -0 "$pid" 2>/dev/null && ! grep -q '^trained' "$tmp/b.log"; then
        kill -9 "$pid" 2>/dev/null && kills=$((kills + 1))
    fi
    wait "$pid" 2>/dev/null
    newest=$(last_ckpt "$tmp/b")
    if [ -n "$newest" ]; then
        "$mirror" inspect "$newest" >/dev/null 2>&1 || { echo "FAILED: newest checkpoint $newest does not load after kill -9"; fails=$((fails + 1)); }
    fi
    n=$(ls "$tmp/b"/ckpt-*.h5 2>/dev/null | wc -l)
    [ "$n" -le 3 ] || { echo "FAILED: keep: 2 left $n checkpoints"; fails=$((fails + 1)); }
done
echo "killed $kills runs; newest checkpoint $(basename "$(last_ckpt "$tmp/b")")"
check "at least 8 runs were killed mid-way" "[ $kills -ge 8 ]"
out=$("$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/b" 2>&1); rc=$?
check "the resumed run exits 0" "[ $rc -eq 0 ]"
check "it says where it resumed" "echo \"\$out\" | grep -q 'resumed from'"
check "no temporary files are left" "[ -d $tmp/b ] && [ -z \"\$(ls $tmp/b | grep tmp)\" ]"
fa=$(printf '%s/ckpt-%08d.h5' "$tmp/a" "$steps"); fb=$(printf '%s/ckpt-%08d.h5' "$tmp/b" "$steps")
check "killed-and-resumed parameters and optimizer state equal the uninterrupted run's" "same \"\$(crcs $fa)\" \"\$(crcs $fb)\""
check "and every logged loss and evaluation" "same \"\$(values $tmp/a/metrics.jsonl)\" \"\$(values $tmp/b/metrics.jsonl)\""

# 3. SIGTERM (preemption): a checkpoint and exit 143; resuming reaches the same end
"$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/c" --set checkpoint.every=0 >"$tmp/c.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do started "$tmp/c.log" && break; sleep 0.02; done
sleep 0.2
kill -TERM "$pid"
wait "$pid"; rc=$?
check "SIGTERM exits 143 ($rc)" "[ $rc -eq 143 ]"
check "SIGTERM says where it saved" "grep -q 'stopped by signal 15' '$tmp/c.log' && [ -n \"\$(last_ckpt $tmp/c)\" ]"
"$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/c" --set checkpoint.every=0 >/dev/null 2>&1
fc=$(printf '%s/ckpt-%08d.h5' "$tmp/c" "$steps")
check "the preempted run resumed to the same parameters" "same \"\$(crcs $fa)\" \"\$(crcs $fc)\""

# 3b. Ctrl-C (SIGINT): the same as SIGTERM, exit 130; resuming reaches the same end
"$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/i" --set checkpoint.every=0 >"$tmp/i.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do started "$tmp/i.log" && break; sleep 0.02; done
sleep 0.2
kill -INT "$pid"
wait "$pid"; rc=$?
check "Ctrl-C exits 130 ($rc)" "[ $rc -eq 130 ]"
check "Ctrl-C saves a checkpoint and says where" "grep -q 'stopped by signal 2' '$tmp/i.log' && [ -n \"\$(last_ckpt $tmp/i)\" ]"
"$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/i" --set checkpoint.every=0 >"$tmp/i2.log" 2>&1
fi_=$(printf '%s/ckpt-%08d.h5' "$tmp/i" "$steps")
check "the interrupted run resumed to the same parameters" "grep -q 'resumed from' $tmp/i2.log && same \"\$(crcs $fa)\" \"\$(crcs $fi_)\""
# a second Ctrl-C during a step (a model whose steps take a while) stops at once: no checkpoint
cat >"$tmp/big.yaml" <<YAML
model: {type: mlp, sizes: [784, 4096, 4096, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 1000}
optimizer: {type: adamw, lr: 1.0e-3}
train: {steps: 1000, batch: 1024, eval_every: 0, log_every: 1}
checkpoint: {dir: $tmp/big, every: 0}
YAML
"$mirror" train "$tmp/big.yaml" >"$tmp/big.log" 2>&1 &
pid=$!
for _ in $(seq 1 1500); do started "$tmp/big.log" && break; sleep 0.02; done
kill -INT "$pid"
for _ in $(seq 1 500); do grep -q 'interrupted:' "$tmp/big.log" && break; sleep 0.01; done
kill -INT "$pid"
wait "$pid"; rc=$?
tail -2 "$tmp/big.log"
check "a second Ctrl-C stops at once ($rc), without a checkpoint" \
      "[ $rc -eq 130 ] && grep -q 'interrupted again' $tmp/big.log && ! grep -q 'stopped by signal' $tmp/big.log && [ -z \"\$(last_ckpt $tmp/big)\" ]"

# 4. eval and inspect
out=$("$mirror" eval "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/a" 2>&1); rc=$?
echo "$out"
check "mirror eval reproduces the final accuracy ($acc)" "is_num '$acc' && [ $rc -eq 0 ] && echo \"\$out\" | grep -q \"accuracy $acc\""
out=$("$mirror" inspect "$fa"); rc=$?
check "inspect shows step, loss scale, parameters and config" \
      "[ $rc -eq 0 ] && echo \"\$out\" | grep -q 'step *$steps' && echo \"\$out\" | grep -q 'loss_scale' && echo \"\$out\" | grep -q 'fc1.weight' && echo \"\$out\" | grep -q 'config:'"
head -c 3000 "$fa" >"$tmp/broken.h5"
out=$("$mirror" inspect "$tmp/broken.h5" 2>&1); rc=$?
check "inspect of a truncated file exits non-zero naming it" "[ $rc -ne 0 ] && echo \"\$out\" | grep -q 'broken.h5' && echo \"\$out\" | grep -q '^HINT: '"
out=$("$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/d" --set "checkpoint.resume=$tmp/broken.h5" 2>&1); rc=$?
check "resume: PATH of a broken file fails naming it" "[ $rc -ne 0 ] && echo \"\$out\" | grep -q 'broken.h5'"

finish
