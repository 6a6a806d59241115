#!/usr/bin/env bash
# The CPU benchmark with its peers in one run: builds build/ if needed, runs bench_cpu (measured
# peaks, mirror's GEMM next to hand-tuned OpenBLAS, op bandwidths), then PyTorch's GEMM at the
# same shapes when a torch is importable, and prints mirror / torch ratios.
# Usage: bench/run_cpu.sh [--quick]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# (re)build: an incremental build is quick, and a stale binary would measure old code
{ cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j "$(nproc)" --target bench_cpu; } >&2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
build/bench/bench_cpu "$@" | tee "$out"
# the peers' Python: PyPI torch in a venv (bench/peers.sh), Debian's as a named fallback
IFS=$'\t' read -r py peers < <(bench/peers.sh)
if [ "$py" = none ]; then
    echo; echo "(no PyTorch column: $peers)"
    exit 0
fi
echo
echo "# peer: $peers"
echo "| GEMM (M x N x K, B^T?) | mirror GFLOP/s | torch.mm GFLOP/s | mirror / torch |"
echo "|---|---:|---:|---:|"
"$py" bench/peer_torch_gemm.py "$@" | grep -v '^#' | while read -r m n k tb g; do
    t=""
    [ "$tb" = 1 ] && t=" B^T"
    mine=$(grep -F "| $m x $n x $k$t (" "$out" | head -1 | awk -F'|' '{print $3}' | tr -d ' ')
    awk -v a="$mine" -v b="$g" -v s="$m x $n x $k$t" 'BEGIN { printf "| %s | %s | %s | %.2f |\n", s, a, b, (b > 0 ? a / b : 0) }'
done
