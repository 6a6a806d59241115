#!/usr/bin/env bash
# `mpirun -np 4 mirror sweep --set sweep.ranks_per_trial=2` (launch/sweep.c): two groups of two
# ranks train two trials at once (both groups start a trial before either finishes one) and the
# sweep ends with the same results.csv as one group (-np 2), trial for trial, with and without
# ASHA; a ranks_per_trial that does not divide the job is refused once; a rank killed with -9 ends
# the job within the deadline with no process left behind, and the rerun finishes the sweep.
# Usage: tests/mpi/sweep.sh MPIEXEC path/to/mirror
set -uo pipefail
mpiexec=${1:?usage: sweep.sh MPIEXEC mirror}
mirror=${2:?}
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"
need_fashion_mnist
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
mpirun() { timeout 300 "$mpiexec" --oversubscribe "$@"; }
command -v pgrep >/dev/null || { echo "FAILED: no pgrep: the no-process-left-behind check cannot run"; exit 1; }

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
checkpoint: {every: 10, keep: 2, resume: never}
distribute: {timeout_s: 10}
sweep: {method: grid, metric: eval_accuracy, goal: max, params: {optimizer.lr: [0.003, 0.01, 0.03, 0.1]}}
YAML
asha=(--set sweep.scheduler.type=asha --set sweep.scheduler.min_steps=10 --set sweep.scheduler.reduction=2)
table() { cut -d, -f1,3-7,9 "$1/results.csv" 2>/dev/null; }

# 1. two groups at once vs one group, grid and ASHA
for mode in grid asha; do
    extra=(); [ $mode = asha ] && extra=("${asha[@]}")
    one=$(mpirun -np 2 "$mirror" sweep "$tmp/sweep.yaml" "${extra[@]}" --set "checkpoint.dir=$tmp/$mode-one" 2>&1); rc1=$?
    two=$(mpirun -np 4 "$mirror" sweep "$tmp/sweep.yaml" "${extra[@]}" --set sweep.ranks_per_trial=2 \
          --set "checkpoint.dir=$tmp/$mode-two" 2>&1); rc2=$?
    echo "$two" | grep -v 'mirror info' | head -6
    check "$mode: -np 2 (one group) and -np 4 in groups of 2 exit 0 ($rc1, $rc2)" "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]"
    check "$mode: both groups were busy at once (each started a trial before the first result)" \
          "awk '/ = / { exit } /\\(group 0, ranks 0-1/ { a = 1 } /\\(group 1, ranks 2-3/ { b = 1 } END { exit !(a && b) }' <<<\"\$two\""
    check "$mode: the same results.csv, trial for trial" \
          "[ \$(table $tmp/$mode-one | wc -l) -eq 5 ] && same \"\$(table $tmp/$mode-one)\" \"\$(table $tmp/$mode-two)\""
done
check "asha in groups: the same schedule as one group" "cmp -s $tmp/asha-one/schedule.txt $tmp/asha-two/schedule.txt"

# 2. a group size that does not divide the job: one message, exit 2
out=$(mpirun -np 4 "$mirror" sweep "$tmp/sweep.yaml" --set sweep.ranks_per_trial=3 --set "checkpoint.dir=$tmp/bad" 2>&1); rc=$?
check "ranks_per_trial=3 of 4 ranks: exit non-zero, said once" \
      "[ $rc -ne 0 ] && [ \$(grep -c 'sweep.ranks_per_trial: 3 does not divide the job.s 4 ranks' <<<\"\$out\") -eq 1 ]"

# 3. a rank killed mid-sweep: the job ends within the deadline; the rerun finishes the sweep
cat >"$tmp/rank.sh" <<'SH'
#!/usr/bin/env bash
echo $$ >"$(dirname "$0")/rank${OMPI_COMM_WORLD_RANK}.pid"
exec "$@"
SH
chmod +x "$tmp/rank.sh"
start=$(date +%s)
mpirun -np 4 "$tmp/rank.sh" "$mirror" sweep "$tmp/sweep.yaml" --set sweep.ranks_per_trial=2 --set train.steps=4000 \
    --set "checkpoint.dir=$tmp/kill" >"$tmp/kill.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do grep -q '(group 1, ranks 2-3' "$tmp/kill.log" 2>/dev/null && break; sleep 0.05; done
sleep 1
pid=$(cat "$tmp/rank3.pid" 2>/dev/null)
check "kill: rank 3 started (its pid is known)" "is_num '$pid'"
kill -9 "$pid"
wait $job; rc=$?
secs=$(( $(date +%s) - start ))
check "kill: the job exits non-zero ($rc) in ${secs}s (deadline 10 s)" "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -le 90 ]"
sleep 0.5
check "kill: no process left behind" "! pgrep -f '$tmp/' >/dev/null"
out=$(mpirun -np 4 "$mirror" sweep "$tmp/sweep.yaml" --set sweep.ranks_per_trial=2 --set train.steps=4000 \
      --set "checkpoint.dir=$tmp/kill" 2>&1); rc=$?
check "kill: the rerun finishes every trial ($rc)" "[ $rc -eq 0 ] && [ \$(grep -c ',completed$' $tmp/kill/results.csv) -eq 4 ]"
finish
