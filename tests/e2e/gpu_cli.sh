#!/usr/bin/env bash
# emu.gpu_cli: the GPU trainer through the command line, on the CUDA emulator (build/mirror-emu,
# README "The CUDA emulator"): an MLP in mixed_float16 (dynamic loss scaling) on one emulated GPU
# stopped at step 20 and resumed to 40 ends on the uninterrupted run's parameters, optimizer state
# and loss scale (checkpoint CRC-32s) and logs the same losses; SIGTERM mid-run saves, exits 143
# and resumes to the same end; two emulated GPUs and the CPU (build/mirror) reach the same final
# loss within a tolerance (another reduction order); eval through the GPU reproduces the accuracy.
# Usage: gpu_cli.sh MIRROR_EMU MIRROR
set -uo pipefail
emu=${1:-}
cpu=${2:-}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$emu" ] && [ -x "$cpu" ] || { echo "FAILED: usage: gpu_cli.sh MIRROR_EMU MIRROR (got '$emu' '$cpu')"; exit 1; }
need_fashion_mnist
export MR_EMU_DEVICES=2
tmp=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
cat >"$tmp/exp.yaml" <<YAML
seed: 3
model: {type: mlp, sizes: [784, 64, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 1000}
  eval: {source: idx, images: $fm/t10k-images-idx3-ubyte.gz, labels: $fm/t10k-labels-idx1-ubyte.gz}
optimizer: {type: adamw, lr: 1.0e-3}
schedule: {type: constant}
precision: {policy: mixed_float16}
train: {steps: 40, batch: 32, eval_every: 0, log_every: 10}
checkpoint: {every: 10, keep: 5, resume: auto}
distribute: {devices: [cuda:0]}
YAML
values() { sed -E 's/"time": [^,]*, //; s/, "samples_per_s".*\}/}/' "$1"; }
crcs() { "$emu" inspect "$1" | grep -E 'crc32|loss_scale' | awk '{print $1, $NF}'; }
final_loss() { sed -n 's/^trained .*: loss \([0-9.]*\).*/\1/p' "$1" | tail -1; }
close() { is_num "${1:-}" && is_num "${2:-}" && awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }
fa=$tmp/a/ckpt-00000040.h5

"$emu" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/a" >"$tmp/a.log" 2>&1; rc=$?
check "one emulated GPU: exit 0" "[ $rc -eq 0 ] && [ -s $fa ]"
check "it trained on the device path" "grep -q 'training on cuda:0' $tmp/a.log"

"$emu" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/b" --set train.steps=20 >"$tmp/b1.log" 2>&1; rc1=$?
"$emu" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/b" >"$tmp/b2.log" 2>&1; rc2=$?
check "stopped at 20, resumed to 40: exit 0 twice" "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q 'resumed from' $tmp/b2.log"
check "the resumed run's parameters, optimizer state and loss scale equal the uninterrupted run's" \
    "same \"\$(crcs $fa)\" \"\$(crcs $tmp/b/ckpt-00000040.h5)\""
# the training lines (the run that stopped at 20 also evaluated there, as a run's end does)
check "and its logged losses" \
    "same \"\$(values $tmp/a/metrics.jsonl | grep '\"loss\"')\" \"\$(values $tmp/b/metrics.jsonl | grep '\"loss\"')\""

"$emu" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/c" --set checkpoint.every=0 >"$tmp/c.log" 2>&1 &
pid=$!
for _ in $(seq 1 1500); do grep -q '^step ' "$tmp/c.log" 2>/dev/null && break; sleep 0.02; done
kill -TERM "$pid"
wait "$pid"; rc=$?
check "SIGTERM on the GPU path: exit 143 and a checkpoint" \
    "[ $rc -eq 143 ] && grep -q 'stopped by signal 15' $tmp/c.log && ls $tmp/c/ckpt-*.h5 >/dev/null 2>&1"
"$emu" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/c" --set checkpoint.every=0 >"$tmp/c2.log" 2>&1; rc=$?
check "the preempted run resumed to the same parameters" \
    "[ $rc -eq 0 ] && same \"\$(crcs $fa)\" \"\$(crcs $tmp/c/ckpt-00000040.h5)\""

"$emu" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/d" --set 'distribute.devices=[cuda:0, cuda:1]' >"$tmp/d.log" 2>&1; rc=$?
check "two emulated GPUs: exit 0" "[ $rc -eq 0 ] && grep -q '2 replicas' $tmp/d.log"
check "two GPUs end on one GPU's loss within 2e-3 ($(final_loss $tmp/d.log) vs $(final_loss $tmp/a.log))" \
    "close \"\$(final_loss $tmp/d.log)\" \"\$(final_loss $tmp/a.log)\" 0.002"
"$cpu" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/e" --set 'distribute.devices=[cpu]' >"$tmp/e.log" 2>&1; rc=$?
check "the CPU ends on the GPU's loss within 2e-3 ($(final_loss $tmp/e.log))" \
    "[ $rc -eq 0 ] && close \"\$(final_loss $tmp/e.log)\" \"\$(final_loss $tmp/a.log)\" 0.002"

acc=$(sed -n 's/.*eval accuracy \([0-9.]*\).*/\1/p' "$tmp/a.log" | tail -1)
out=$("$emu" eval "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/a" 2>&1); rc=$?
check "mirror eval on the GPU reproduces the final accuracy ($acc)" \
    "is_num '$acc' && [ $rc -eq 0 ] && echo \"\$out\" | grep -q \"accuracy $acc\""
finish
