#!/usr/bin/env bash
# `mpirun -np N build/mirror train CONFIG` end to end: 2 and 4 ranks train the model that one
# process trains with the same global batch (parameters equal within float rounding: the measured
# maximum difference is printed), 2 local replicas (threads) too, a repeated run is bit-identical,
# and the job never hangs: a rank with another config fails the handshake naming it, a rank killed
# with -9, a rank that hangs (SIGSTOP) and a rank whose data is missing all end the job non-zero
# within the deadline with no process left behind.
# Usage: tests/mpi/train.sh MPIEXEC path/to/mirror path/to/ckpt_diff
set -uo pipefail
mpiexec=${1:?usage: train.sh MPIEXEC mirror ckpt_diff}
mirror=${2:?}
diff=${3:?}
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"
need_fashion_mnist
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
mpirun() { timeout 120 "$mpiexec" --oversubscribe "$@"; }
command -v pgrep >/dev/null || { echo "FAILED: no pgrep: the no-process-left-behind checks cannot run"; exit 1; }
leftover() { pgrep -f "$tmp/" >/dev/null; }

cat >"$tmp/exp.yaml" <<YAML
seed: 5
model: {type: mlp, sizes: [784, 128, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 2000}
  eval: {source: idx, images: $fm/t10k-images-idx3-ubyte.gz, labels: $fm/t10k-labels-idx1-ubyte.gz}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
schedule: {type: constant}
train: {steps: 50, batch: 64, eval_every: 0, log_every: 25}
checkpoint: {resume: never}
distribute: {timeout_s: 10}
YAML
ck() { printf '%s/ckpt-%08d.h5' "$1" 50; }

# 1. equivalence: 1 process, 2 and 4 ranks, 2 local replicas, all with the global batch 64
"$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/one" >"$tmp/one.log" 2>&1
check "one process trains" "[ -f $(ck "$tmp/one") ]"
for np in 2 4; do
    out=$(mpirun -np $np "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/np$np" 2>&1); rc=$?
    check "mpirun -np $np exits 0" "[ $rc -eq 0 ]"
    check "-np $np: rank 0 alone prints the result" "[ \$(echo \"\$out\" | grep -c '^trained') -eq 1 ]"
    d=$("$diff" "$(ck "$tmp/one")" "$(ck "$tmp/np$np")"); echo "1 process vs $np ranks: $d"
    check "-np $np equals one process within float rounding" "ckpt_close '$d' 1e-4 1e-3"
done
"$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/local2" --set 'distribute.devices=[cpu:0, cpu:1]' >"$tmp/local2.log" 2>&1
check "2 local replicas (README's devices=[cpu:0, cpu:1]) train and exit 0" "[ -f $(ck "$tmp/local2") ] || { tail -3 $tmp/local2.log; false; }"
d=$("$diff" "$(ck "$tmp/one")" "$(ck "$tmp/local2")"); echo "1 process vs 2 local replicas: $d"
check "2 local replicas equal one process within float rounding" "ckpt_close '$d' 1e-4 1e-3"
mpirun -np 2 "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/np2b" >/dev/null 2>&1
d=$("$diff" "$(ck "$tmp/np2")" "$(ck "$tmp/np2b")")
check "two -np 2 runs are bit-identical ($d)" "ckpt_equal '$d'"

# ranks x local replicas: -np 2 with 2 replicas each (4 replicas, the hierarchical backend), and the
# same with the optimizer sharded over the 4 (its reduce-scatter and all-gather)
for zero in false true; do
    mpirun -np 2 "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/hier-$zero" --set 'distribute.devices=[cpu:0, cpu:1]' \
        --set distribute.shard_optimizer=$zero >/dev/null 2>&1
    d=$("$diff" "$(ck "$tmp/one")" "$(ck "$tmp/hier-$zero")"); echo "1 process vs 2 ranks x 2 replicas (shard_optimizer $zero): $d"
    check "2 ranks x 2 replicas (shard_optimizer $zero) equal one process within float rounding" "ckpt_close '$d' 1e-4 1e-3"
done

# per-rank logs: rank 1 writes its own progress
mpirun -np 2 "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/logs" --set distribute.rank_logs=true >/dev/null 2>&1
check "rank_logs: rank 1's progress is in rank-1.log" "grep -q '^step 50/50' $tmp/logs/rank-1.log"

# ZeRO-1: -np 2 with the optimizer state sharded trains the same bits as without
mpirun -np 2 "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/np2z" --set distribute.shard_optimizer=true >/dev/null 2>&1
d=$("$diff" "$(ck "$tmp/np2")" "$(ck "$tmp/np2z")")
check "-np 2 with shard_optimizer equals -np 2 without, bit for bit ($d)" "ckpt_equal '$d'"

# resume across ranks: -np 2 for 25 steps, then -np 2 resuming to 50 (constant schedule, so the
# two halves are the same run): bit-identical to the straight -np 2 run, each rank restoring its
# own data-iterator state
mpirun -np 2 "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/np2r" --set train.steps=25 >/dev/null 2>&1
out=$(mpirun -np 2 "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/np2r" --set checkpoint.resume=auto 2>&1)
check "-np 2 resumes from its step-25 checkpoint" "echo \"\$out\" | grep -q 'resumed from .*ckpt-00000025.h5 at step 25'"
d=$("$diff" "$(ck "$tmp/np2")" "$(ck "$tmp/np2r")")
check "-np 2: 25 + resume + 25 steps equal 50 straight, bit for bit ($d)" "ckpt_equal '$d'"

# a wrapper that gives rank 1 its own behaviour: $1 is the mode
cat >"$tmp/rank.sh" <<'SH'
#!/usr/bin/env bash
mode=$1; shift
echo $$ >"$(dirname "$0")/rank${OMPI_COMM_WORLD_RANK}.pid"
if [ "${OMPI_COMM_WORLD_RANK}" = 1 ]; then
    case $mode in
    config) exec "$@" --set optimizer.lr=0.01 ;;
    nodata) exec "$@" --set data.train.images=/nonexistent/train-images.gz ;;
    esac
fi
exec "$@"
SH
chmod +x "$tmp/rank.sh"

# 2. a rank with another config: the handshake names it
start=$(date +%s)
out=$(mpirun -np 2 "$tmp/rank.sh" config "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/cfg" 2>&1); rc=$?
check "a different config on rank 1 fails ($rc) naming the rank" \
      "[ $rc -ne 0 ] && echo \"\$out\" | grep -q 'experiment configuration (YAML after --set) of rank(s) 1'"
check "...within 30 s" "[ \$(( \$(date +%s) - start )) -le 30 ]"

# 3. a rank whose data file is missing: the job ends, naming the file
out=$(mpirun -np 2 "$tmp/rank.sh" nodata "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/nodata" 2>&1); rc=$?
check "a failing rank ends the job ($rc) naming its error" "[ $rc -ne 0 ] && echo \"\$out\" | grep -q '/nonexistent/train-images.gz'"

# 4. kill -9 of rank 1 mid-training, and 5. rank 1 hung (SIGSTOP): the job ends within the deadline
long="--set train.steps=100000 --set train.log_every=100"
for fault in kill hang; do
    rm -f "$tmp"/rank*.pid
    start=$(date +%s)
    mpirun -np 2 "$tmp/rank.sh" none "$mirror" train "$tmp/exp.yaml" $long --set "checkpoint.dir=$tmp/$fault" >"$tmp/$fault.log" 2>&1 &
    job=$!
    for _ in $(seq 1 300); do grep -q '^step ' "$tmp/$fault.log" 2>/dev/null && break; sleep 0.05; done
    pid=$(cat "$tmp/rank1.pid" 2>/dev/null)
    check "$fault: rank 1 started (its pid is known)" "is_num '$pid'"
    if [ $fault = kill ]; then kill -9 "$pid"; else kill -STOP "$pid"; fi
    wait $job; rc=$?
    secs=$(( $(date +%s) - start ))
    tail -3 "$tmp/$fault.log"
    check "$fault rank 1: the job exits non-zero ($rc) in ${secs}s (deadline 10 s)" "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -le 60 ]"
    [ $fault = hang ] && check "the hang is reported naming the collective" "grep -q 'no progress for 10 s' $tmp/hang.log"
    kill -9 "$pid" 2>/dev/null
    sleep 0.5
    check "$fault: no process left behind" "! leftover"
done

finish
