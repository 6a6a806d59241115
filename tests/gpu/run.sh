#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU: configures a CUDA build of the repository that
# holds this script into <repo>/build-gpu, builds it, runs the GPU tests (ctest -R gpu) and the
# GPU GEMM benchmark, then prints a summary table. Exit status: 0 when the tests pass, 1 when a
# step fails. Sized to finish in a few minutes on an H200 (budget: under 8).
# Usage: tests/gpu/run.sh [extra cmake args...]
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$root/build-gpu"
jobs="$(nproc 2>/dev/null || echo 4)"
log="$build/run_gpu.log"
mkdir -p "$build"
: >"$log"

step_status=()
record() { step_status+=("$1|$2|$3"); }

t0=$SECONDS
if cmake -S "$root" -B "$build" -DMIRROR_CUDA=ON -DCMAKE_BUILD_TYPE=Release "$@" >>"$log" 2>&1; then
    record configure ok "$((SECONDS - t0)) s"
else
    record configure FAILED "see $log"
    tail -30 "$log"
    printf '%s\n' "${step_status[@]}"
    exit 1
fi

t0=$SECONDS
if timeout 300 cmake --build "$build" -j "$jobs" >>"$log" 2>&1; then
    record build ok "$((SECONDS - t0)) s"
else
    record build FAILED "see $log"
    grep -E 'error' "$log" | head -30
    printf '%s\n' "${step_status[@]}"
    exit 1
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

t0=$SECONDS
tests_rc=0
(cd "$build" && timeout 240 ctest -R gpu --output-on-failure) || tests_rc=$?
if [ "$tests_rc" -eq 0 ]; then
    record "ctest -R gpu" ok "$((SECONDS - t0)) s"
else
    record "ctest -R gpu" FAILED "rc $tests_rc"
fi

t0=$SECONDS
bench_out="$build/bench_gpu_gemm.txt"
bench_rc=0
timeout 120 "$build/bench/bench_gpu_gemm" 4096 >"$bench_out" 2>&1 || bench_rc=$?
case "$bench_rc" in
0) record bench_gpu_gemm ok "$((SECONDS - t0)) s" ;;
77) record bench_gpu_gemm SKIPPED "no GPU" ;;
*) record bench_gpu_gemm FAILED "rc $bench_rc" ;;
esac

echo
echo "== GPU GEMM benchmark =="
cat "$bench_out"
echo
echo "== summary =="
printf '| %-16s | %-8s | %-20s |\n' step result detail
printf '|%s|%s|%s|\n' '------------------' '----------' '----------------------'
for s in "${step_status[@]}"; do
    IFS='|' read -r name res detail <<<"$s"
    printf '| %-16s | %-8s | %-20s |\n' "$name" "$res" "$detail"
done

if [ "$tests_rc" -ne 0 ] || { [ "$bench_rc" -ne 0 ] && [ "$bench_rc" -ne 77 ]; }; then
    exit 1
fi
exit 0
