#!/usr/bin/env bash
# Training-step throughput and peak memory of the three reference workloads, mirror next to
# PyTorch in the same session (bench/torch_bench.py, tuned as that script does), one
# process per model and framework so each peak RSS is that model's alone. Prints a table of
# samples/s (tokens/s for gpt), the ratio, and peak RSS.
# Usage: bench/run_models.sh [--steps N] [--runs R]   (defaults 30 and 3)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
steps=30
runs=3
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "run_models.sh: unknown flag $1" >&2; echo "HINT: --steps N --runs R" >&2; exit 2 ;;
    esac
done
# (re)build: an incremental build is quick, and a stale binary would measure old code
{ cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j "$(nproc)" --target bench_models; } >&2
torch_bench=""
for p in "$root/bench/torch_bench.py"; do
    [ -f "$p" ] && torch_bench=$p && break
done
have_torch=0
# the peers' Python: PyPI torch in a venv (bench/peers.sh), Debian's as a named fallback
IFS=$'\t' read -r py peers < <(bench/peers.sh)
if [ -n "$torch_bench" ] && [ "$py" != none ]; then have_torch=1; fi
echo "# peer: $peers"

# peak RSS in MiB of a command (its output goes to $2)
peak_rss() {
    local out=$1
    shift
    local t
    t=$(mktemp)
    /usr/bin/time -f "%M" -o "$t" "$@" >"$out" 2>/dev/null || { rm -f "$t"; return 1; }
    awk '{ printf "%.0f", $1 / 1024 }' "$t"
    rm -f "$t"
}

echo "| workload | mirror | PyTorch | mirror / PyTorch | mirror peak RSS MiB | PyTorch peak RSS MiB |"
echo "|---|---:|---:|---:|---:|---:|"
for m in mlp cnn gpt; do
    mo=$(mktemp)
    mrss=$(peak_rss "$mo" build/bench/bench_models --models "$m" --steps "$steps" --runs "$runs" --warmup 5)
    mine=$(awk '/samples\/s/ { for (i = 1; i <= NF; i++) if ($i == "samples/s") print $(i - 1) }' "$mo")
    unit="samples/s"
    if [ "$m" = gpt ]; then mine=$(awk '/tokens\/s/ { print $2 }' "$mo"); unit="tokens/s"; fi
    theirs="n/a"; trss="n/a"; ratio="n/a"
    if [ "$have_torch" = 1 ]; then
        to=$(mktemp)
        trss=$(peak_rss "$to" "$py" "$torch_bench" --models "$m" --steps "$steps" --runs "$runs" --warmup 5)
        theirs=$(awk '/samples\/s/ { for (i = 1; i <= NF; i++) if ($i == "samples/s") print $(i - 1) }' "$to" | head -1)
        if [ "$m" = gpt ]; then theirs=$(awk '/tokens\/s/ { print $2 }' "$to"); fi
        ratio=$(awk -v a="$mine" -v b="$theirs" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
        rm -f "$to"
    fi
    rm -f "$mo"
    echo "| $m ($unit) | $mine | $theirs | $ratio | $mrss | $trss |"
done
