#!/usr/bin/env bash
# The distribution layer's speed on this machine (mpirun, 2 ranks):
#   1. all-reduce bandwidth: mr_comm_allreduce against raw MPI_Allreduce of the same bytes
#      (build/bench/bench_comm), as a ratio (targets: >= 0.95 for large buffers, >= 0.8 for the
#      1-16 KB all-reduces of the per-step agreement);
#   2. the MLP workload (784-1024-1024-10, global batch 256, SGD momentum) trained by 2 ranks with
#      the overlapped bucketed all-reduce, against the same 2 ranks with no gradient exchange
#      (MIRROR_BENCH_NO_ALLREDUCE=1): the communication overhead (target <= 10%) and the share of
#      the all-reduce hidden behind the backward, for several bucket sizes. Each rank runs one
#      OpenMP thread (2 ranks on 2 cores). Median of R runs of S steps; a quiet machine matters.
# Usage: bench/run_dist.sh [--steps S] [--runs R]   (defaults 300 and 3)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
steps=300
runs=3
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "run_dist.sh: unknown flag $1" >&2; echo "HINT: --steps S --runs R" >&2; exit 2 ;;
    esac
done
{ cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j "$(nproc)" --target mirror bench_comm; } >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
fm=/usr/share/datasets/fashion-mnist
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "## all-reduce bandwidth, 2 ranks"
mpirun -np 2 build/bench/bench_comm

cat >"$tmp/mlp.yaml" <<YAML
seed: 1
model: {type: mlp, sizes: [784, 1024, 1024, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 10000}
optimizer: {type: sgd, lr: 0.01, momentum: 0.9}
train: {steps: $steps, batch: 256, eval_every: 0, log_every: $steps}
checkpoint: {every: 0, resume: never}
YAML
# median samples/s, communication_s and communication_hidden of R runs
measure() { # $1: label, $2: no-allreduce 0|1, $3: bucket MB
    local sps=() comm=() hid=()
    for r in $(seq 1 "$runs"); do
        # a fresh run directory each time: resume: never refuses one that holds a checkpoint, and a
        # failed run must not leave the previous run's metrics to be read as its own
        local dir="$tmp/run-$1-$3-$r" log="$tmp/log-$1-$3-$r"
        if ! MIRROR_BENCH_NO_ALLREDUCE=$2 mpirun -np 2 -x MIRROR_BENCH_NO_ALLREDUCE -x OMP_NUM_THREADS build/mirror \
            train "$tmp/mlp.yaml" --set "checkpoint.dir=$dir" --set "distribute.bucket_mb=$3" >"$log" 2>&1; then
            echo "run_dist.sh: the $1 run (bucket_mb $3, run $r) failed; its output:" >&2
            tail -20 "$log" >&2
            exit 1
        fi
        line=$(grep "\"step\": $steps," "$dir/metrics.jsonl" | tail -1)
        if [ -z "$line" ] || ! echo "$line" | grep -q '"samples_per_s"'; then
            echo "run_dist.sh: no metrics line for step $steps in $dir/metrics.jsonl (the $1 run, bucket_mb $3)" >&2
            exit 1
        fi
        sps+=("$(echo "$line" | sed 's/.*"samples_per_s": \([0-9.]*\).*/\1/')")
        comm+=("$(echo "$line" | sed 's/.*"communication_s": \([0-9.]*\).*/\1/')")
        hid+=("$(echo "$line" | sed 's/.*"communication_hidden": \([0-9.]*\).*/\1/')")
    done
    med() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
    echo "$1 $(med "${sps[@]}") $(med "${comm[@]}") $(med "${hid[@]}")"
}
echo
echo "## MLP training step, 2 ranks x 1 thread, global batch 256, $steps steps, median of $runs"
base=$(measure "no-allreduce" 1 4)
base_sps=$(echo "$base" | awk '{ print $2 }')
echo "| all-reduce | samples/s | vs no exchange | exposed comm ms/step | hidden share |"
echo "|---|---:|---:|---:|---:|"
echo "| none (MIRROR_BENCH_NO_ALLREDUCE=1) | $base_sps | 1.00 | - | - |"
for mb in 0.5 1 4 16; do
    m=$(measure "bucket" 0 "$mb")
    echo "$m" | awk -v b="$base_sps" -v mb="$mb" '{ printf "| buckets of %s MB | %.0f | %.2f | %.2f | %.0f%% |\n", mb, $2, $2 / b, 1000 * $3, 100 * $4 }'
done
