#!/usr/bin/env bash
# `mirror sweep` end to end (launch/sweep.c): a grid of 4 learning rates, then the same space under
# ASHA (rungs at 10, 20, 40 steps, reduction 2), which must spend fewer steps and reach the grid's
# best metric bit for bit (a promoted trial resumes its rung checkpoint exactly); an ASHA sweep
# killed with -9 mid-rung, and one stopped by SIGTERM, rerun to the same decisions and results;
# a diverging trial is recorded and the sweep goes on; --status prints the table; a second sweep in
# a directory that a running one holds is refused.
# Usage: tests/e2e/sweep.sh path/to/mirror
set -uo pipefail
mirror=${1:?usage: sweep.sh path/to/mirror}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_fashion_mnist
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
command -v flock >/dev/null || { echo "FAILED: no flock (util-linux): the lock check cannot run"; exit 1; }

cat >"$tmp/sweep.yaml" <<YAML
seed: 3
model: {type: mlp, sizes: [784, 32, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 1000}
  eval: {source: idx, images: $fm/t10k-images-idx3-ubyte.gz, labels: $fm/t10k-labels-idx1-ubyte.gz}
optimizer: {type: sgd, lr: 0.05}
schedule: {type: cosine}
train: {steps: 40, batch: 32, eval_every: 0, log_every: 10}
log: {progress: false}
checkpoint: {dir: $tmp/grid, every: 5, keep: 2, resume: never}
sweep: {method: grid, metric: eval_accuracy, goal: max, params: {optimizer.lr: [0.003, 0.01, 0.03, 0.1]}}
YAML
asha=(--set sweep.scheduler.type=asha --set sweep.scheduler.min_steps=10 --set sweep.scheduler.reduction=2)
# results.csv without the wall time: what must be identical between two runs of a sweep
table() { cut -d, -f1,3-7,9 "$1/results.csv" 2>/dev/null; }
steps_in_all() { sed -n 's/.*trials, \([0-9]*\) steps in all.*/\1/p' <<<"$1"; }

# 1. the grid
out=$("$mirror" sweep "$tmp/sweep.yaml" 2>&1); rc=$?
check "grid: exits 0 ($rc)" "[ $rc -eq 0 ]"
check "grid: results.csv has the new columns" \
      "head -1 $tmp/grid/results.csv | grep -qx 'trial,dir,optimizer.lr,eval_accuracy,loss,rung,steps,seconds,stopped'"
check "grid: every trial completed its 40 steps" "[ \$(grep -c ',0,40,[^,]*,completed$' $tmp/grid/results.csv) -eq 4 ]"
grid_steps=$(steps_in_all "$out")
check "grid: 160 steps in all ($grid_steps)" "same '$grid_steps' 160"
best=$(sed -n 2p "$tmp/grid/results.csv")
check "grid: the best trial's checkpoint is printed" "grep -q 'best eval_accuracy = .*checkpoint $tmp/grid/trial-00[0-3]/ckpt-00000040.h5' <<<\"\$out\""

# 2. ASHA over the same space
out=$("$mirror" sweep "$tmp/sweep.yaml" "${asha[@]}" --set "checkpoint.dir=$tmp/asha" 2>&1); rc=$?
check "asha: exits 0 ($rc)" "[ $rc -eq 0 ]"
asha_steps=$(steps_in_all "$out")
check "asha: fewer steps than the grid ($asha_steps < $grid_steps)" "num_lt '$asha_steps' '$grid_steps'"
abest=$(sed -n 2p "$tmp/asha/results.csv")
check "asha: the grid's best metric and loss, bit for bit ('${abest}' vs '${best}')" \
      "same \"\$(cut -d, -f1,3-5 <<<\"\$abest\")\" \"\$(cut -d, -f1,3-5 <<<\"\$best\")\""
check "asha: the best trial reached the last rung at step 40" "grep -q ',2,40,[^,]*,completed$' <<<\"\$abest\""
check "asha: schedule.txt holds 4, 2 and 1 trials" \
      "[ \"\$(awk '/^rung/ { print NF - 5 }' $tmp/asha/schedule.txt | tr '\n' ' ')\" = '4 2 1 ' ]"
check "asha: the others were stopped by asha" "[ \$(grep -c 'stopped by asha at rung' $tmp/asha/results.csv) -eq 3 ]"
status=$("$mirror" sweep --status "$tmp/asha" 2>&1); rc=$?
check "--status exits 0 and prints the table ($rc)" \
      "[ $rc -eq 0 ] && grep -q 'not running' <<<\"\$status\" && [ \$(grep -c 'stopped by asha\|completed' <<<\"\$status\") -eq 4 ]"
out=$("$mirror" sweep --status "$tmp/grid/trial-000" 2>&1); rc=$?
check "--status of a directory that is not a sweep's exits 2 naming it" "[ $rc -eq 2 ] && grep -q 'not a sweep directory' <<<\"\$out\""
first=$(table "$tmp/asha")
out=$("$mirror" sweep "$tmp/sweep.yaml" "${asha[@]}" --set "checkpoint.dir=$tmp/asha" 2>&1); rc=$?
check "asha rerun: every rung is done before, the same table" \
      "[ $rc -eq 0 ] && [ \$(grep -c 'done before' <<<\"\$out\") -eq 7 ] && same \"\$first\" \"\$(table $tmp/asha)\""

# max_steps sets the last rung (and every trial's train.steps); a first rung past it is refused
out=$("$mirror" sweep "$tmp/sweep.yaml" "${asha[@]}" --set sweep.scheduler.max_steps=20 --set "checkpoint.dir=$tmp/asha20" 2>&1); rc=$?
check "max_steps=20: rungs at 10 and 20 steps, the best trained 20" \
      "[ $rc -eq 0 ] && [ \"\$(awk '/^rung/ { print \$4 }' $tmp/asha20/schedule.txt | tr '\n' ' ')\" = '10 20 ' ] && sed -n 2p $tmp/asha20/results.csv | grep -q ',1,20,[^,]*,completed$'"
out=$("$mirror" sweep "$tmp/sweep.yaml" "${asha[@]}" --set sweep.scheduler.min_steps=50 --set "checkpoint.dir=$tmp/asha50" 2>&1); rc=$?
check "min_steps past the last rung: exit 2 naming the key" "[ $rc -eq 2 ] && grep -q 'sweep.scheduler.min_steps: the first rung (50 steps) is past the last' <<<\"\$out\""

# 3. interrupted mid-rung (kill -9, then SIGTERM): the rerun makes the same decisions
for sig in KILL TERM; do
    d=$tmp/asha-$sig
    "$mirror" sweep "$tmp/sweep.yaml" "${asha[@]}" --set "checkpoint.dir=$d" >"$d.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 2000); do ls "$d"/trial-*/rung-1.txt >/dev/null 2>&1 && break; sleep 0.01; done
    kill -$sig $pid
    wait $pid; rc=$?
    n1=$(ls "$d"/trial-*/rung-1.txt 2>/dev/null | wc -l)
    check "$sig: killed mid-rung 1 ($n1 of 2 rung-1 results, none of rung 2; exit $rc)" \
          "[ $n1 -eq 1 ] && ! ls $d/trial-*/rung-2.txt >/dev/null 2>&1 && [ $rc -ne 0 ]"
    [ $sig = TERM ] && check "TERM: exit 143 and the resume hint" "[ $rc -eq 143 ] && grep -q 'run the same command to go on' $d.log"
    out=$("$mirror" sweep "$tmp/sweep.yaml" "${asha[@]}" --set "checkpoint.dir=$d" 2>&1); rc=$?
    check "$sig: the rerun exits 0 with the uninterrupted sweep's table" "[ $rc -eq 0 ] && same \"\$(table $d)\" \"\$(table $tmp/asha)\""
    check "$sig: ...and its schedule" "cmp -s $d/schedule.txt $tmp/asha/schedule.txt"
done

# 4. a diverging trial is recorded, the others go on
out=$("$mirror" sweep "$tmp/sweep.yaml" --set "checkpoint.dir=$tmp/div" --set 'sweep.params.optimizer.lr=[0.1, 1.0e4]' 2>&1); rc=$?
check "a diverging trial: exit 0, recorded as diverged, the other completed" \
      "[ $rc -eq 0 ] && grep -q '^1,.*,diverged: non-finite loss' $tmp/div/results.csv && grep -q '^0,.*,completed$' $tmp/div/results.csv"

# 5. one sweep per directory
flock "$tmp/asha/.lock" sleep 30 &
holder=$!
sleep 0.3
out=$("$mirror" sweep "$tmp/sweep.yaml" "${asha[@]}" --set "checkpoint.dir=$tmp/asha" 2>&1); rc=$?
kill $holder 2>/dev/null
check "a second sweep in a running sweep's directory exits non-zero naming it" \
      "[ $rc -ne 0 ] && grep -q 'another mirror sweep is running in this directory' <<<\"\$out\""
finish
