#!/usr/bin/env bash
# Where a training step's time goes, mirror next to PyTorch: MIRROR_PROFILE's per-op breakdown of
# build/bench/bench_models (each kernel timed; ms summed over the profiled steps, share of the
# step) and torch.profiler's self CPU time per aten op (bench/peer_torch_profile.py, the same
# model sizes, eager, torch.autocast bfloat16 for --bf16), one after the other in one session, for
# the workloads and precisions asked. The peers' Python is bench/peers.sh's (PyPI torch 2.x).
# For issue 19's "where the time goes" when a speed target is missed. A quiet machine matters.
# Usage: bench/run_profile.sh [--models mlp,cnn,gpt] [--bf16] [--build DIR] [--top N]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
models="gpt"
bf16=""
build=build
top=20
while [ $# -gt 0 ]; do
    case "$1" in
    --models) models=${2//,/ }; shift 2 ;;
    --bf16) bf16=--bf16; shift ;;
    --build) build=$2; shift 2 ;;
    --top) top=$2; shift 2 ;;
    *) echo "run_profile.sh: unknown flag $1" >&2; echo "HINT: --models mlp,cnn,gpt --bf16 --build DIR --top N" >&2; exit 2 ;;
    esac
done
{ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release && cmake --build "$build" -j "$(nproc)" --target bench_models; } >&2
IFS=$'\t' read -r py peer < <(bench/peers.sh)
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: /cpu: /'
for m in $models; do
    echo
    echo "## $m ${bf16:-f32}: mirror (MIRROR_PROFILE=1 $build/bench/bench_models --models $m $bf16)"
    out=$(MIRROR_PROFILE=1 "$build/bench/bench_models" --models "$m" $bf16 2>&1) ||
        { echo "$out" | tail -5; echo "run_profile.sh: bench_models failed" >&2; exit 1; }
    prof=$(echo "$out" | sed -n '/^op  *ms  *calls  *share/,/^page faults/p' | head -$((top + 1)))
    [ -n "$prof" ] || { echo "$out" | tail -5; echo "run_profile.sh: bench_models printed no profile" >&2; exit 1; }
    echo "$prof"
    echo "$out" | grep -E "ms/step|tokens/s" | head -2
    echo
    if [ "$py" = none ]; then echo "## $m: torch: n/a ($peer)"; continue; fi
    echo "## $m ${bf16:-f32}: $peer"
    "$py" bench/peer_torch_profile.py "$m" $bf16 --top "$top"
done
