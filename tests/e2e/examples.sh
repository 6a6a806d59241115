#!/usr/bin/env bash
# A short run of every example config through build/mirror: the default CNN (float32 and
# mixed_float16), the MLP, the sweep (two trials) and the character-level GPT on the King James
# Bible (launch/prepare_kjv.sh; skipped without Debian's bible-kjv). Each run's loss must fall and
# the classifiers pass an accuracy threshold; the same config twice gives the same metrics bit for
# bit (times and speeds aside).
# Usage: tests/e2e/examples.sh path/to/mirror
set -uo pipefail
mirror=${1:?usage: examples.sh path/to/mirror}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_fashion_mnist
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
values() { sed -E 's/"time": [^,]*, //; s/, "samples_per_s".*\}/}/' "$1"; }
first_loss() { grep samples_per_s "$1" | head -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/'; }
last_loss() { grep samples_per_s "$1" | tail -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/'; }
falls() { num_lt "$(last_loss "$1")" "$(first_loss "$1")"; } # fails closed: no file, no number
above() { num_gt "${1:-}" "$2"; }
accuracy() { echo "$1" | sed -n 's/.*eval accuracy \([0-9.]*\).*/\1/p' | tail -1; }

short="--set train.eval_every=0 --set schedule.warmup=10"
# 1. the default experiment, float32 and mixed_float16
for policy in float32 mixed_float16; do
    out=$("$mirror" train "$root/configs/default.yaml" $short --set train.steps=120 --set train.log_every=40 \
          --set precision.policy=$policy --set "checkpoint.dir=$tmp/default-$policy" 2>&1); rc=$?
    echo "$out" | tail -1
    acc=$(accuracy "$out")
    check "default.yaml ($policy) exits 0" "[ $rc -eq 0 ]"
    check "default.yaml ($policy): the loss falls" "falls $tmp/default-$policy/metrics.jsonl"
    check "default.yaml ($policy): accuracy after 120 steps > 0.72 ($acc)" "above '$acc' 0.72"
done
check "mixed_float16 logs its loss scale" "grep -q '\"loss_scale\": 32768' $tmp/default-mixed_float16/metrics.jsonl"

# 2. the MLP example, twice: the same metrics bit for bit
for run in 1 2; do
    out=$("$mirror" train "$root/configs/mlp.yaml" $short --set train.steps=200 --set train.log_every=50 \
          --set "checkpoint.dir=$tmp/mlp-$run" 2>&1); rc=$?
    check "mlp.yaml run $run exits 0" "[ $rc -eq 0 ]"
done
echo "$out" | tail -1
acc=$(accuracy "$out")
check "mlp.yaml: the loss falls" "falls $tmp/mlp-1/metrics.jsonl"
check "mlp.yaml: accuracy after 200 steps > 0.75 ($acc)" "above '$acc' 0.75"
check "mlp.yaml: two runs, the same metrics bit for bit" "same \"\$(values $tmp/mlp-1/metrics.jsonl)\" \"\$(values $tmp/mlp-2/metrics.jsonl)\""

# 3. the sweep example, cut to two short trials
out=$("$mirror" sweep "$root/configs/sweep.yaml" --set sweep.trials=2 --set train.steps=40 --set train.log_every=20 \
      --set train.eval_every=0 --set schedule.warmup=10 --set "checkpoint.dir=$tmp/sweep" 2>&1); rc=$?
echo "$out" | tail -1
check "sweep.yaml exits 0 with 2 results" "[ $rc -eq 0 ] && [ \$(wc -l < $tmp/sweep/results.csv) -eq 3 ]"
check "each trial learned" "falls $tmp/sweep/trial-000/metrics.jsonl && falls $tmp/sweep/trial-001/metrics.jsonl"

# 4. the character-level GPT on the King James Bible
if command -v bible >/dev/null 2>&1 || [ -r "$root/runs/data/kjv.txt" ]; then
    text="$root/runs/data/kjv.txt"
    if [ ! -r "$text" ]; then
        text="$tmp/kjv.txt"
        "$root/launch/prepare_kjv.sh" "$text" >/dev/null
    fi
    out=$("$mirror" train "$root/configs/gpt/kjv.yaml" --set train.steps=60 --set train.log_every=20 \
          --set train.eval_every=0 --set schedule.warmup=10 --set "data.train.path=$text" --set "data.eval.path=$text" \
          --set "checkpoint.dir=$tmp/gpt" 2>&1); rc=$?
    echo "$out" | grep -E "trained|perplexity|error|HINT" | tail -2
    check "gpt/kjv.yaml exits 0" "[ $rc -eq 0 ]"
    check "gpt/kjv.yaml: the loss falls" "falls $tmp/gpt/metrics.jsonl"
    check "gpt/kjv.yaml prints a sample" "echo \"\$out\" | grep -q '^sample:'"
else
    echo "skipped: gpt/kjv.yaml (no bible-kjv; tests/run.sh installs it)"
fi

finish
