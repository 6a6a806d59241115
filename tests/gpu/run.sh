#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU: configures a CUDA build of this repository into
# <repo>/build-gpu (code for this machine's GPUs only: -DMIRROR_CUDA_ARCHS=native, which also
# checks that path of cmake/mirror_cuda_archs.cmake), builds it, prints `mirror doctor`, runs the GPU tests
# (ctest -L/-R gpu: op-vs-reference for every op family, the allocator, NCCL, GPU training),
# then the GPU benchmarks (GEMM against cuBLAS alone; the three workloads and a GPT-2-124M-shaped
# model in bf16 with tokens/s and MFU; f32 and TF32; the bf16 GPTs with the composed attention
# instead of the fused op, and with mirror's attention kernels instead of cuDNN's; which attention
# path ran; data parallelism over the GPUs present through `mirror train`,
# bench/run_gpu_dp.sh), and prints a short table last.
# Exit status: 0 when every step passed, 1 otherwise. Sized for under 8 minutes on an H200.
# Usage: tests/gpu/run.sh [extra cmake args...]
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$root/build-gpu"
jobs="$(nproc 2>/dev/null || echo 4)"
log="$build/run_gpu.log"
mkdir -p "$build"
: >"$log"

rows=()
failed=0
record() { rows+=("$1|$2|$3"); case "$2" in ok | SKIPPED) ;; *) failed=1 ;; esac; }

# step NAME TIMEOUT OUTFILE CMD...: runs CMD with a deadline, output to OUTFILE, records the outcome
step() {
    local name="$1" limit="$2" out="$3" t0=$SECONDS rc=0
    shift 3
    timeout "$limit" "$@" >"$out" 2>&1 || rc=$?
    case "$rc" in
    0) record "$name" ok "$((SECONDS - t0)) s" ;;
    77) record "$name" SKIPPED "no GPU" ;;
    124) record "$name" TIMEOUT "over ${limit} s, see $out" ;;
    *) record "$name" FAILED "rc $rc, see $out" ;;
    esac
    return "$rc"
}

summary() {
    echo
    echo "== summary =="
    printf '| %-22s | %-8s | %-40s |\n' step result detail
    printf '|%s|%s|%s|\n' '------------------------' '----------' '------------------------------------------'
    for s in "${rows[@]}"; do
        IFS='|' read -r name res detail <<<"$s"
        printf '| %-22s | %-8s | %-40s |\n' "$name" "$res" "$detail"
    done
}

archs=()  # without nvidia-smi, the default list (every common GPU: a longer build)
command -v nvidia-smi >/dev/null 2>&1 && archs=(-DMIRROR_CUDA_ARCHS=native)
if ! step configure 120 "$build/configure.log" cmake -S "$root" -B "$build" -DMIRROR_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    "${archs[@]}" "$@"; then
    tail -30 "$build/configure.log"; summary; exit 1
fi
if ! step build 360 "$build/build.log" cmake --build "$build" -j "$jobs"; then
    grep -E 'error' "$build/build.log" | head -30; summary; exit 1
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
step doctor 60 "$build/doctor.txt" "$build/mirror" doctor
cat "$build/doctor.txt"

step "ctest gpu" 300 "$build/ctest_gpu.txt" bash -c "cd '$build' && ctest -R '^gpu\.' --output-on-failure"
tail -40 "$build/ctest_gpu.txt"

step bench_gpu_gemm 90 "$build/bench_gpu_gemm.txt" "$build/bench/bench_gpu_gemm"
step "models bf16" 150 "$build/bench_models_bf16.txt" "$build/bench/bench_gpu_models" --bf16 --models mlp,cnn,gpt,gpt2
step "models f32" 90 "$build/bench_models_f32.txt" "$build/bench/bench_gpu_models" --models mlp,cnn,gpt
step "models tf32" 90 "$build/bench_models_tf32.txt" "$build/bench/bench_gpu_models" --tf32 --models mlp,cnn,gpt
# the bf16 GPTs again with the composed attention (batched GEMMs + causal softmax) instead of the
# fused op the bf16 run above used (README.md "Attention"): which is faster on this GPU
step "bf16 composed attn" 90 "$build/bench_models_bf16_composed.txt" \
    env MIRROR_ATTENTION=composed "$build/bench/bench_gpu_models" --bf16 --models gpt,gpt2
# the bf16 GPTs with mirror's own attention kernels instead of cuDNN's flash attention, which the
# bf16 run above used where cuDNN had an engine (docs/DESIGN.md "cuDNN attention"); which path ran
# there: the run names every shape cuDNN refused ("is not available"); gpu.test_gpu_sdpa fails
# naming the case if any of its shapes did not run through cuDNN
step "bf16 kernel attn" 90 "$build/bench_models_bf16_kernels.txt" \
    env MIRROR_CUDNN_SDPA=0 "$build/bench/bench_gpu_models" --bf16 --models gpt,gpt2
if grep -q "cuDNN flash attention .* is not available" "$build/bench_models_bf16.txt" 2>/dev/null; then
    record "attention path" FALLBACK "$(grep -c 'is not available' "$build/bench_models_bf16.txt") shapes: kernels"
else
    record "attention path" ok "bf16 GPTs: cuDNN flash attention"
fi
# data parallelism through the trainer (`mirror train`, distribute.devices over every GPU here,
# NCCL): GPT-2 124M bf16 on 1, 2, 4, 8 GPUs as present; with one GPU only its row (NCCL refuses
# two ranks on one GPU, and the table says so)
step "data parallel gpt2" 180 "$build/bench_gpu_dp.txt" "$root/bench/run_gpu_dp.sh" --mirror "$build/mirror" \
    --model gpt2 --steps 20

for f in bench_gpu_gemm bench_models_bf16 bench_models_f32 bench_models_tf32 bench_models_bf16_composed bench_gpu_dp; do
    echo
    echo "== $f =="
    cat "$build/$f.txt"
done
summary
exit "$failed"
