#!/usr/bin/env bash
# The FULL training step, input pipeline included, mirror next to PyTorch in the same session:
# bench/bench_train.c (mr_train fed by mirror's pipeline) and bench/peer_torch_train.py
# (torch_bench.py's models fed by torch.utils.data; the faster of DataLoader num_workers 0 and 1),
# both from the same files: Fashion-MNIST IDX for mlp and cnn, a text file as characters for gpt
# (runs/data/kjv.txt from launch/prepare_kjv.sh; gpt is skipped without it). fp32 and bf16
# (mixed_bfloat16 / torch.autocast bfloat16), one process per model, framework and precision so
# each peak RSS is that run's alone. Prints a table of samples/s (tokens/s for gpt), the ratio
# (the issue's target: >= 1.5x in each precision) and peak RSS; PyTorch columns are n/a when
# /usr/bin/python3 cannot import torch.
# On a shared machine other processes distort the rates (mirror's static OpenMP split suffers more
# than torch's passive threads), so each row is followed by the share of the machine's CPU that
# other processes took while each side ran ("other load"), and --wait-idle S waits up to S
# seconds before each process for a 2-second window with the CPUs >= 90% idle, and --max-load P
# runs a process again (at most twice) when other processes took more than P% of the CPUs.
# Usage: bench/run_train.sh [--steps N] [--runs R] [--models mlp,cnn,gpt] [--text PATH] [--build DIR]
#                           [--wait-idle S] [--max-load P]
#        (defaults 30, 3, all three, runs/data/kjv.txt, build, 0, 100)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
steps=30
runs=3
models="mlp cnn gpt"
text=runs/data/kjv.txt
build=build
wait_idle=0
max_load=100
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --models) models=${2//,/ }; shift 2 ;;
    --text) text=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --wait-idle) wait_idle=$2; shift 2 ;;
    --max-load) max_load=$2; shift 2 ;;
    *) echo "run_train.sh: unknown flag $1" >&2
       echo "HINT: --steps N --runs R --models mlp,cnn,gpt --text PATH --build DIR --wait-idle S --max-load P" >&2; exit 2 ;;
    esac
done
# (re)build: an incremental build is quick, and a stale binary would measure old code
{ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release && cmake --build "$build" -j "$(nproc)" --target bench_train; } >&2
have_torch=0
if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then have_torch=1; fi
if [ ! -f "$text" ]; then echo "# no $text: gpt skipped (HINT: launch/prepare_kjv.sh)"; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# "total idle" clock ticks of all CPUs so far
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }
# waits up to $wait_idle seconds for a 2-second window with the CPUs >= 90% idle
await_idle() {
    local t0=$SECONDS a b
    while [ $((SECONDS - t0)) -lt "$wait_idle" ]; do
        a=$(cpu_ticks); sleep 2; b=$(cpu_ticks)
        awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " ");
            exit !((y[1] - x[1]) > 0 && (y[2] - x[2]) >= 0.9 * (y[1] - x[1])) }' && return 0
    done
    return 0
}
# peak RSS in MiB of a command (its stdout goes to $1); "failed" when it fails. Leaves in
# $tmp/load the % of all CPUs' time that other processes used while it ran. With --max-load P it
# runs again (up to twice more) while that share exceeded P%, keeping the last attempt.
peak_rss() {
    local out=$1 a b try
    shift
    for try in 1 2 3; do
        await_idle
        a=$(cpu_ticks)
        if ! /usr/bin/time -f "%M %U %S" -o "$tmp/rss" "$@" >"$out" 2>"$out.err"; then
            echo "?" >"$tmp/load"
            echo failed
            return 0
        fi
        b=$(cpu_ticks)
        awk -v a="$a" -v b="$b" -v hz="$(getconf CLK_TCK)" '{ split(a, x, " "); split(b, y, " ");
            tot = (y[1] - x[1]) / hz; busy = tot - (y[2] - x[2]) / hz; other = busy - $2 - $3;
            printf "%.0f", (tot > 0 && other > 0 ? 100 * other / tot : 0) }' "$tmp/rss" >"$tmp/load"
        [ "$(cat "$tmp/load")" -le "$max_load" ] && break
        echo "run_train.sh: $(cat "$tmp/load")% other load during $*; running it again" >&2
    done
    awk '{ printf "%.0f", $1 / 1024 }' "$tmp/rss"
}
# the median rate of workload $2 in output $1: samples/s, or tokens/s for gpt
rate() {
    if [ "$2" = gpt ]; then awk '$1 == "=" && $3 == "tokens/s" { print $2 }' "$1"
    else awk -v m="$2" '$1 == m && $2 == "batch" { print $4 }' "$1"; fi
}

rows=()
notes=()
for prec in f32 bf16; do
    flag=""
    [ "$prec" = bf16 ] && flag="--bf16"
    for m in $models; do
        if [ "$m" = gpt ] && [ ! -f "$text" ]; then continue; fi
        unit="samples/s"
        [ "$m" = gpt ] && unit="tokens/s"
        mo="$tmp/mirror.$m.$prec"
        mrss=$(peak_rss "$mo" "$build/bench/bench_train" --models "$m" --steps "$steps" --runs "$runs" --text "$text" $flag)
        mload=$(cat "$tmp/load")
        mine=$(rate "$mo" "$m")
        [ -n "$mine" ] || mine="failed"
        split=$(awk '/step split/ { sub(/^ */, ""); sub(/step split \(ms, mean of the timed steps\): /, ""); print }' "$mo")
        notes+=("# mirror $m $prec ms/step: ${split:-n/a}")
        theirs="n/a"; trss="n/a"; ratio="n/a"; tload="n/a"
        if [ "$have_torch" = 1 ]; then
            to="$tmp/torch.$m.$prec"
            trss=$(peak_rss "$to" /usr/bin/python3 bench/peer_torch_train.py --models "$m" --steps "$steps" \
                --runs "$runs" --text "$text" $flag)
            tload=$(cat "$tmp/load")
            theirs=$(rate "$to" "$m")
            if [ -n "$theirs" ]; then
                nw=$(awk -v m="$m" '$1 == m && $2 == "batch" { for (i = 1; i < NF; i++) if ($i == "num_workers") print $(i + 1) }' "$to")
                wait=$(awk -v m="$m" '$1 == m && $2 == "batch" { for (i = 1; i < NF; i++) if ($i == "data_wait") print $(i + 1) }' "$to")
                notes+=("# PyTorch $m $prec: DataLoader num_workers $nw was faster ($(grep -o 'workers [0-9]*: [0-9.]*' "$to" | head -1) samples/s); data_wait ${wait} ms/step")
                ratio=$(awk -v a="$mine" -v b="$theirs" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "n/a" }')
            else
                theirs="failed"
                notes+=("# PyTorch $m $prec: $(grep -m1 -e failed -e Error "$to" "$to.err" 2>/dev/null | cut -c1-200)")
            fi
        fi
        rows+=("| $m ($unit) | $prec | $mine | $theirs | $ratio | $mrss | $trss |")
        [[ $mload =~ ^[0-9]+$ ]] && mload="$mload%"
        [[ $tload =~ ^[0-9]+$ ]] && tload="$tload%"
        notes+=("# other load during $m $prec: mirror $mload, PyTorch $tload of the CPUs")
    done
done
[ "$have_torch" = 1 ] || echo "# PyTorch: n/a (/usr/bin/python3 cannot import torch and numpy)"
echo "# full training step incl. input pipeline; $steps warm-up + $runs x $steps timed steps, median; $(nproc) cores"
for n in "${notes[@]}"; do echo "$n"; done
echo "| workload | precision | mirror | PyTorch | mirror / PyTorch | mirror peak RSS MiB | PyTorch peak RSS MiB |"
echo "|---|---|---:|---:|---:|---:|---:|"
for r in "${rows[@]}"; do echo "$r"; done
