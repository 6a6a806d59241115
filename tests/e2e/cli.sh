#!/usr/bin/env bash
# End to end through build/mirror: `mirror doctor` passes its self-check (and, on a machine without a
# GPU, says so), a short training run learns and writes its files, rerunning it says it is at its
# last step (exit 0), resume: never into its directory exits 2, a warmup longer than the run warns,
# a diverging run exits 1, a mixed_float16 run whose gradients overflow down to the loss scale's
# floor logs each skipped step naming the layer, then exits 1 naming it with a HINT and saves nothing
# of that step, a bad config exits 2 naming the key with a HINT, a bad --set exits 2, a
# missing data file exits 2, a small sweep writes results.csv (a column per swept key) and skips
# finished trials when run again, but reruns (after moving aside) those whose configuration changed.
# Usage: tests/e2e/cli.sh path/to/mirror  (CTest passes the built binary)
set -uo pipefail
mirror=${1:?usage: cli.sh path/to/mirror}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# 0. mirror doctor: needs no dataset, so it runs (and its failures count) before the skip below
out=$("$mirror" doctor 2>&1); rc=$?
echo "$out" | tail -3
check "doctor exits 0" "[ $rc -eq 0 ]"
check "doctor's CPU GEMM check passes" "echo \"\$out\" | grep -q '^gemm 256x256x256 f32 on cpu: .*PASS\$'"
check "doctor names the CPU GEMM provider and MPI" "echo \"\$out\" | grep -q '^cpu gemm: ' && echo \"\$out\" | grep -q '^mpi: '"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    check "doctor says there is no GPU, and why" "echo \"\$out\" | grep -q '^gpu: none usable (.*); checking the CPU only\$'"
fi
if [ ! -r "$fm/train-images-idx3-ubyte.gz" ] && [ "$fails" -ne 0 ]; then finish; fi
need_fashion_mnist
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. a short run of the default experiment's model
out=$("$mirror" train "$root/configs/default.yaml" --set train.steps=60 --set train.log_every=20 \
      --set train.eval_every=0 --set schedule.warmup=10 --set "checkpoint.dir=$tmp/run" 2>&1)
rc=$?
echo "$out" | tail -3
check "train exits 0" "[ $rc -eq 0 ]"
check "metrics.jsonl has 3 log lines" "[ \$(grep -c samples_per_s '$tmp/run/metrics.jsonl') -eq 3 ]"
check "metrics.jsonl has the final evaluation" "grep -q eval_accuracy '$tmp/run/metrics.jsonl'"
check "config.yaml is written" "grep -q 'steps: 60' '$tmp/run/config.yaml'"
first=$(grep samples_per_s "$tmp/run/metrics.jsonl" | head -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/')
last=$(grep samples_per_s "$tmp/run/metrics.jsonl" | tail -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/')
check "the loss falls ($first -> $last)" "num_lt '$last' '$first'"
acc=$(echo "$out" | sed -n 's/.*eval accuracy \([0-9.]*\).*/\1/p' | tail -1)
check "accuracy after 60 steps > 0.6 ($acc)" "num_gt '$acc' 0.6"

# 1b. the same command again: the run is at its last step; exit 0, no invented loss
out=$("$mirror" train "$root/configs/default.yaml" --set train.steps=60 --set train.log_every=20 \
      --set train.eval_every=0 --set schedule.warmup=10 --set "checkpoint.dir=$tmp/run" 2>&1); rc=$?
echo "$out" | tail -2
check "rerunning a finished run exits 0 ($rc) saying it is already at its last step" \
      "[ $rc -eq 0 ] && echo \"\$out\" | grep -q 'is already at its last step (60, train.steps)'"
check "...without printing a loss for steps it did not train" "[ -n \"\$out\" ] && ! echo \"\$out\" | grep -qE '^trained|loss [0-9]'"
# resume: never into a directory that holds another run's checkpoints: refused, nothing touched
before=$(ls -l --time-style=full-iso "$tmp/run" | md5sum)
out=$("$mirror" train "$root/configs/default.yaml" --set train.steps=60 --set checkpoint.resume=never \
      --set "checkpoint.dir=$tmp/run" 2>&1); rc=$?
echo "$out" | tail -2
check "resume: never into a run directory with checkpoints exits 2 naming it, with a HINT" \
      "[ $rc -eq 2 ] && echo \"\$out\" | grep -q \"checkpoint.resume: never, but checkpoint.dir '$tmp/run' holds 1 checkpoint\" && echo \"\$out\" | grep -q '^HINT: .*new directory.*resume: auto'"
check "...and leaves the directory as it was" "same \"$before\" \"\$(ls -l --time-style=full-iso $tmp/run | md5sum)\""
# a warmup longer than the run: a warning, not an error (README: train.steps=10 on the default experiment)
out=$("$mirror" train "$root/configs/default.yaml" --set train.steps=10 --set train.eval_every=0 \
      --set "checkpoint.dir=$tmp/short" 2>&1); rc=$?
echo "$out" | tail -1
check "train.steps=10 with schedule.warmup 100 trains (exit $rc) and warns" \
      "[ $rc -eq 0 ] && echo \"\$out\" | grep -q 'warn.*schedule.warmup (100 steps) is longer than train.steps (10)' && [ -f $tmp/short/ckpt-00000010.h5 ]"
# divergence (a non-finite loss) is a failed run: exit 1, as README says
cat >"$tmp/diverge.yaml" <<YAML
model: {type: mlp, sizes: [784, 32, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 1000}
optimizer: {type: sgd, lr: 1.0e+9}
train: {steps: 30, batch: 64, eval_every: 0, log_every: 10}
checkpoint: {dir: $tmp/diverge}
YAML
out=$("$mirror" train "$tmp/diverge.yaml" 2>&1); rc=$?
echo "$out" | tail -2
check "a diverging run exits 1 ($rc) naming the step, with a HINT" \
      "[ $rc -eq 1 ] && echo \"\$out\" | grep -q 'non-finite loss (.*) at step' && echo \"\$out\" | grep -q '^HINT: '"
# f16 overflow (README.md "Overflow reports"): a loss scale so large that fc2's backward GEMM
# overflows f16 at every step; it halves 1e18 -> 5e17 -> 2.5e17 -> 1.25e17 (the floor) over three
# skipped steps, and the fourth overflow stops the run
out=$(timeout 300 "$mirror" train "$root/configs/cnn.yaml" --set precision.policy=mixed_float16 \
      --set precision.loss_scale.initial=1e18 --set precision.loss_scale.min=1.25e17 --set train.steps=20 \
      --set train.eval_every=0 --set checkpoint.every=1 --set "checkpoint.dir=$tmp/overflow" 2>&1); rc=$?
echo "$out" | grep -E 'skipped|error|HINT'
check "three steps skipped, each naming the layer where the overflow started" \
      "[ \$(echo \"\$out\" | grep -cE '^mirror warn: step [123] skipped: non-finite gradients in fc2.weight \(first of [0-9]+ in backward order\), loss scale ') -eq 3 ] && echo \"\$out\" | grep -q 'step 3 skipped: .*, loss scale 2.5e+17 -> 1.25e+17\$'"
check "at the floor the run exits 1 ($rc) naming the step, the layer and the floor" \
      "[ $rc -eq 1 ] && echo \"\$out\" | grep -qE '^mirror: error: step 4: non-finite gradients in fc2.weight \(first of [0-9]+ in backward order\), with the loss scale already at its floor \(precision.loss_scale.min 1.25e\+17\)'"
check "...with a HINT: mixed_bfloat16, optimizer.lr, optimizer.grad_clip" \
      "echo \"\$out\" | grep -q '^HINT: use precision.policy: mixed_bfloat16 .*lower optimizer.lr (0.002), set optimizer.grad_clip'"
check "...having saved the skipped steps' checkpoints and none of step 4" \
      "[ -f '$tmp/overflow/ckpt-00000003.h5' ] && [ ! -e '$tmp/overflow/ckpt-00000004.h5' ]"

# 2. configuration errors: exit 2, the key named, a HINT
out=$("$mirror" train "$root/tests/configs/bad/typo_lr.yaml" 2>&1); rc=$?
check "typo exits 2" "[ $rc -eq 2 ]"
check "typo names file:line:col and suggests lr" "echo \"\$out\" | grep -q \"typo_lr.yaml:4:3: unknown key 'lerning_rate' in optimizer (did you mean 'lr'?)\""
check "a HINT line" "echo \"\$out\" | grep -q '^HINT: '"
out=$("$mirror" train "$root/configs/default.yaml" --set optimizer.lr=fast 2>&1); rc=$?
check "bad --set exits 2 naming the key" "[ $rc -eq 2 ] && echo \"\$out\" | grep -q 'optimizer.lr'"
out=$("$mirror" train "$root/configs/default.yaml" --set data.train.images=/nonexistent.gz 2>&1); rc=$?
check "missing data file exits 2 naming it" "[ $rc -eq 2 ] && echo \"\$out\" | grep -q '/nonexistent.gz'"
out=$("$mirror" frobnicate 2>&1); rc=$?
check "unknown command exits 2" "[ $rc -eq 2 ]"
out=$("$mirror" train "$root/configs/default.yaml" --set 'distribute.devices=[gpu0]' 2>&1); rc=$?
check "a bad device name exits 2 with a HINT" "[ $rc -eq 2 ] && echo \"\$out\" | grep -q \"'gpu0' is not a device\" && echo \"\$out\" | grep -q '^HINT: '"
out=$("$mirror" train "$root/configs/default.yaml" --set 'distribute.devices=[cuda:0, cuda:0]' 2>&1); rc=$?
check "a GPU listed twice exits 2" "[ $rc -eq 2 ] && echo \"\$out\" | grep -q 'cuda:0 is listed twice'"
out=$("$mirror" train "$root/configs/default.yaml" --set 'distribute.devices=[cpu:0, cuda:0]' 2>&1); rc=$?
check "CPU and GPU replicas mixed exits 2" "[ $rc -eq 2 ] && echo \"\$out\" | grep -q 'cannot be mixed'"
if ! nvidia-smi -L >/dev/null 2>&1; then
    out=$("$mirror" train "$root/configs/default.yaml" --set 'distribute.devices=[cuda:0]' --set train.steps=60 \
        --set schedule.warmup=10 --set "checkpoint.dir=$tmp/gpu" 2>&1); rc=$?
    check "training on cuda:0 without a GPU is a configuration error (exit $rc, want 2) with a HINT" "[ $rc -eq 2 ] && echo \"\$out\" | grep -q 'a CUDA device was asked for' && echo \"\$out\" | grep -q 'HINT'"
fi

# 3. a 2-trial grid sweep, run twice: the second run skips both trials
cat >"$tmp/sweep.yaml" <<YAML
model: {type: mlp, sizes: [784, 32, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 1000}
  eval: {source: idx, images: $fm/t10k-images-idx3-ubyte.gz, labels: $fm/t10k-labels-idx1-ubyte.gz}
optimizer: {type: adamw, lr: 1.0e-3}
train: {steps: 30, batch: 64, eval_every: 0, log_every: 30}
checkpoint: {dir: $tmp/sweep}
sweep: {method: grid, metric: eval_accuracy, goal: max, params: {optimizer.lr: [1.0e-3, 3.0e-3]}}
YAML
out=$("$mirror" sweep "$tmp/sweep.yaml" 2>&1); rc=$?
echo "$out" | tail -2
check "sweep exits 0" "[ $rc -eq 0 ]"
check "results.csv has 2 trials" "[ \$(wc -l < '$tmp/sweep/results.csv') -eq 3 ]"
check "results.csv has a column per swept key and each trial's value" \
      "head -1 $tmp/sweep/results.csv | grep -qx 'trial,dir,optimizer.lr,eval_accuracy,loss,rung,steps,seconds,stopped' && grep -q '^0,$tmp/sweep/trial-000,0.001,' $tmp/sweep/results.csv && grep -q '^1,$tmp/sweep/trial-001,0.003,' $tmp/sweep/results.csv"
out=$("$mirror" sweep "$tmp/sweep.yaml" 2>&1); rc=$?
check "a second sweep run skips finished trials" "[ $rc -eq 0 ] && [ \$(echo \"\$out\" | grep -c 'done before') -eq 2 ]"
# train.steps changed: no trial counts; each is moved aside (never resumed from) and run again
out=$("$mirror" sweep "$tmp/sweep.yaml" --set train.steps=40 2>&1); rc=$?
echo "$out" | grep 'another configuration' | head -1
check "after train.steps changed, no trial is 'done before' and each says why it reruns" \
      "[ $rc -eq 0 ] && ! echo \"\$out\" | grep -q 'done before' && [ \$(echo \"\$out\" | grep -c 'run with another configuration (train.steps: 30 -> 40)') -eq 2 ]"
check "...the old trials are kept aside and the new ones trained from step 0 to 40" \
      "[ -f $tmp/sweep/trial-000.old-1/ckpt-00000030.h5 ] && [ -f $tmp/sweep/trial-000/ckpt-00000040.h5 ] && ! ls $tmp/sweep/trial-000 | grep -q ckpt-00000030 && ! grep -q 'resumed from' <<<\"\$out\""
# the search space changed: the trial whose value stayed counts, the other reruns
out=$("$mirror" sweep "$tmp/sweep.yaml" --set train.steps=40 --set 'sweep.params.optimizer.lr=[1.0e-3, 1.0e-2]' 2>&1); rc=$?
check "after the search space changed, the unchanged trial counts and the changed one reruns" \
      "[ $rc -eq 0 ] && echo \"\$out\" | grep -q '^trial-000: done before' && echo \"\$out\" | grep -q 'trial-001 was run with another configuration (optimizer.lr: 0.003 -> 0.01)'"
check "...and results.csv lists the new value" "grep -q '^1,$tmp/sweep/trial-001,0.01,' $tmp/sweep/results.csv && [ \$(wc -l < $tmp/sweep/results.csv) -eq 3 ]"

# 4. a tiny character-level GPT on a text file: the loss falls and a sample is printed
for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done >"$tmp/text.txt"
cat >"$tmp/gpt.yaml" <<YAML
model: {type: gpt, vocab: 30, context: 32, layers: 1, heads: 2, embd: 32}
data:
  train: {source: text, path: $tmp/text.txt, context: 32, shuffle: 100}
  eval: {source: text, path: $tmp/text.txt, context: 32}
optimizer: {type: adamw, lr: 1.0e-2}
train: {steps: 60, batch: 16, eval_every: 0, log_every: 20}
checkpoint: {dir: $tmp/gpt}
YAML
out=$("$mirror" train "$tmp/gpt.yaml" 2>&1); rc=$?
echo "$out" | tail -4
check "gpt train exits 0" "[ $rc -eq 0 ]"
check "gpt prints a sample" "echo \"\$out\" | grep -q '^sample:'"
ppl=$(echo "$out" | sed -n 's/.*eval perplexity \([0-9.]*\).*/\1/p' | tail -1)
check "gpt learns: perplexity < 8 ($ppl; 28 characters)" "num_lt '$ppl' 8"

finish
