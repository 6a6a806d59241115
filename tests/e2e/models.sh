#!/usr/bin/env bash
# End to end, models users define (configs/ zoo): `mirror summary` lists a graph's layers with
# shapes and parameter counts and the memory of a training step; the reference CNN written as a
# layer graph (configs/cnn.yaml) trains bit for bit like the cnn shorthand (configs/default.yaml),
# and the GPT graph (configs/gpt/kjv_graph.yaml) like the gpt shorthand (configs/gpt/kjv.yaml), on
# a small text; the ResNet (configs/resnet.yaml: batch norm, residual shortcuts) trains a few steps
# (the loss falls, evaluation runs in eval mode) and its checkpoint holds the batch-norm buffers;
# a graph whose layers do not fit exits 2 naming the layer and its line.
# Usage: tests/e2e/models.sh path/to/mirror
set -uo pipefail
mirror=${1:?usage: models.sh path/to/mirror}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_fashion_mnist
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. summary
out=$("$mirror" summary "$root/configs/resnet.yaml" 2>&1); rc=$?
echo "$out" | tail -4
check "summary exits 0" "[ $rc -eq 0 ]"
check "summary lists a nested layer with its shape and parameters" \
      "echo \"\$out\" | grep -Eq '^ +stage2\.shortcut\.0 +conv2d +\[32, 14, 14\] +512\$'"
check "summary gives the totals" "echo \"\$out\" | grep -q 'parameters 77754 .*buffers 681'"
check "summary gives a training step's activation memory" "echo \"\$out\" | grep -Eq 'one training step of batch 128 in f32: [0-9.]+ MiB of activations'"

# 2. the CNN as a graph trains like the shorthand, bit for bit (same names, same graph)
short=(--set train.steps=30 --set train.log_every=10 --set train.eval_every=0 --set schedule.warmup=5 --quiet)
"$mirror" train "$root/configs/default.yaml" "${short[@]}" --set "checkpoint.dir=$tmp/cnn_short" >"$tmp/a.log" 2>&1; rc1=$?
"$mirror" train "$root/configs/cnn.yaml" "${short[@]}" --set "checkpoint.dir=$tmp/cnn_graph" >"$tmp/b.log" 2>&1; rc2=$?
check "both CNN runs exit 0" "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]"
l1=$(grep -o '"loss": [0-9.e+-]*' "$tmp/cnn_short/metrics.jsonl" | tr '\n' ' ')
l2=$(grep -o '"loss": [0-9.e+-]*' "$tmp/cnn_graph/metrics.jsonl" | tr '\n' ' ')
echo "shorthand: $l1"; echo "graph:     $l2"
check "the graph CNN's losses equal the shorthand's" "same '$l1' '$l2' && [ \$(echo '$l1' | wc -w) -ge 6 ]"

# 3. the GPT as a graph trains like the shorthand (a small text, a few steps)
for i in $(seq 1 60); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done >"$tmp/t.txt"
gpt=(--set "data.train.path=$tmp/t.txt" --set "data.eval.path=$tmp/t.txt" --set model.context=32 --set data.train.context=32
     --set data.eval.context=32 --set train.steps=6 --set train.batch=4 --set train.log_every=2 --set train.eval_every=0
     --set schedule.warmup=2 --quiet)
"$mirror" train "$root/configs/gpt/kjv.yaml" "${gpt[@]}" --set "checkpoint.dir=$tmp/gpt_short" >"$tmp/c.log" 2>&1; rc1=$?
"$mirror" train "$root/configs/gpt/kjv_graph.yaml" "${gpt[@]}" --set "checkpoint.dir=$tmp/gpt_graph" >"$tmp/d.log" 2>&1; rc2=$?
tail -n 2 "$tmp/c.log" "$tmp/d.log"
check "both GPT runs exit 0" "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]"
l1=$(grep -o '"loss": [0-9.e+-]*' "$tmp/gpt_short/metrics.jsonl" | tr '\n' ' ')
l2=$(grep -o '"loss": [0-9.e+-]*' "$tmp/gpt_graph/metrics.jsonl" | tr '\n' ' ')
echo "shorthand: $l1"; echo "graph:     $l2"
check "the graph GPT's losses equal the shorthand's" "same '$l1' '$l2' && [ \$(echo '$l1' | wc -w) -ge 6 ]"

# 4. the ResNet trains a few steps; evaluation in eval mode; the checkpoint has its buffers
out=$("$mirror" train "$root/configs/resnet.yaml" --set train.steps=24 --set train.batch=32 --set train.log_every=8 \
      --set train.eval_every=0 --set schedule.warmup=4 --set "checkpoint.dir=$tmp/resnet" 2>&1); rc=$?
echo "$out" | tail -2
check "the ResNet run exits 0" "[ $rc -eq 0 ]"
first=$(grep samples_per_s "$tmp/resnet/metrics.jsonl" | head -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/')
last=$(grep samples_per_s "$tmp/resnet/metrics.jsonl" | tail -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/')
check "the ResNet's loss falls ($first -> $last)" "num_lt '$last' '$first'"
acc=$(echo "$out" | sed -n 's/.*eval accuracy \([0-9.]*\).*/\1/p' | tail -1)
# (24 steps are too few for the running statistics to be good: the accuracy is not judged, only that
# the evaluation ran; tests/unit/test_layers.c checks the eval-mode arithmetic)
check "the ResNet is evaluated (accuracy $acc)" "num_gt '$acc' 0.05 && num_le '$acc' 1"
ck=$(ls "$tmp"/resnet/ckpt-*.h5 2>/dev/null | tail -1)
ins=$("$mirror" inspect "$ck" 2>&1)
check "its checkpoint holds the batch-norm buffers" "echo \"\$ins\" | grep -q 'stage2.shortcut.1.running_var'"

# 5. a layer that does not fit: exit 2, the layer and its line named
cat >"$tmp/bad.yaml" <<YAML
model:
  type: graph
  input: [1, 28, 28]
  layers:
    - conv2d: {out: 8, kernel: 3}
    - linear: {out: 10}
data: {train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz}}
YAML
out=$("$mirror" train "$tmp/bad.yaml" 2>&1); rc=$?
echo "$out"
check "a bad graph exits 2" "[ $rc -eq 2 ]"
check "... naming the layer, its line and a HINT" \
      "echo \"\$out\" | grep -q 'bad.yaml:6:7: model.layers\[1\] linear: expects 1-d input per sample, got \[8, 26, 26\]' && echo \"\$out\" | grep -q '^HINT: add flatten'"
finish
