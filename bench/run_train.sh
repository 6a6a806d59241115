#!/usr/bin/env bash
# The FULL training step, input pipeline included, mirror next to its peers in the same session:
# bench/bench_train.c (mr_train fed by mirror's pipeline); bench/peer_torch_train.py (torch_bench.py's
# models fed by torch.utils.data; the faster of DataLoader num_workers 0 and 1) eagerly and under
# torch.compile (inductor, default mode; compile time excluded and printed); and
# bench/peer_keras_train.py (Keras fit from tf.data; mlp and cnn). All read the same files:
# Fashion-MNIST IDX for mlp and cnn, a text file as characters for gpt (runs/data/kjv.txt from
# launch/prepare_kjv.sh; gpt is skipped without it). fp32 and bf16 (mixed_bfloat16 /
# torch.autocast bfloat16 / Keras mixed_bfloat16), one process per model, framework and precision
# so each peak RSS is that run's alone. The peers' Python is bench/peers.sh's (PyPI torch 2.x and
# tensorflow-cpu in a venv, created on first use; Debian's torch 1.13 only as a named fallback).
# Prints a table of samples/s (tokens/s for gpt), mirror's ratio to each peer and peak RSS; a
# peer's columns are n/a when its framework is missing.
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
IFS=$'\t' read -r py peers < <(bench/peers.sh)
have_torch=0 have_tf=0
if [ "$py" != none ]; then
    have_torch=1
    [[ $peers == *tensorflow* ]] && have_tf=1
fi
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
# one peer run: sets theirs (rate or "failed"), trss, tload; $1 label, $2 output, $3... the command
peer() {
    local label=$1 out=$2
    shift 2
    trss=$(peak_rss "$out" "$@")
    tload=$(cat "$tmp/load")
    theirs=$(rate "$out" "$m")
    if [ -z "$theirs" ]; then
        theirs="failed"
        notes+=("# $label $m $prec: $(grep -m1 -e failed -e skipped -e Error "$out" "$out.err" 2>/dev/null | cut -c1-200)")
    fi
    [[ $tload =~ ^[0-9]+$ ]] && tload="$tload%"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "n/a" }'; }
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
        eager="n/a" erss="n/a" eload="n/a" comp="n/a" crss="n/a" cload="n/a" ker="n/a" krss="n/a" kload="n/a"
        if [ "$have_torch" = 1 ]; then
            to="$tmp/torch.$m.$prec"
            peer "torch eager" "$to" "$py" bench/peer_torch_train.py --models "$m" --steps "$steps" --runs "$runs" \
                --text "$text" $flag
            eager=$theirs erss=$trss eload=$tload
            nw=0
            if [ "$eager" != failed ]; then
                nw=$(awk -v m="$m" '$1 == m && $2 == "batch" { for (i = 1; i < NF; i++) if ($i == "num_workers") print $(i + 1) }' "$to")
                wait=$(awk -v m="$m" '$1 == m && $2 == "batch" { for (i = 1; i < NF; i++) if ($i == "data_wait") print $(i + 1) }' "$to")
                notes+=("# torch $m $prec: DataLoader num_workers $nw was faster ($(grep -o 'workers [0-9]*: [0-9.]*' "$to" | head -1) samples/s); data_wait ${wait} ms/step")
            fi
            co="$tmp/compile.$m.$prec"
            peer "torch.compile" "$co" "$py" bench/peer_torch_train.py --compile --workers "${nw:-0}" --models "$m" \
                --steps "$steps" --runs "$runs" --text "$text" $flag
            comp=$theirs crss=$trss cload=$tload
            cs=$(grep -o 'compile_s [0-9.]*' "$co" | head -1)
            [ -n "$cs" ] && notes+=("# torch.compile $m $prec: ${cs/compile_s /compile (first step) }s, excluded")
        fi
        if [ "$have_tf" = 1 ] && [ "$m" != gpt ]; then
            peer "keras" "$tmp/keras.$m.$prec" "$py" bench/peer_keras_train.py --models "$m" --steps "$steps" \
                --runs "$runs" $flag
            ker=$theirs krss=$trss kload=$tload
        fi
        rows+=("| $m ($unit) | $prec | $mine | $eager | $comp | $ker | $(ratio "$mine" "$eager") | $(ratio "$mine" "$comp") | $(ratio "$mine" "$ker") | $mrss | $erss | $crss | $krss |")
        [[ $mload =~ ^[0-9]+$ ]] && mload="$mload%"
        notes+=("# other load during $m $prec: mirror $mload, torch eager $eload, torch.compile $cload, keras $kload of the CPUs")
    done
done
echo "# peers: $peers"
echo "# full training step incl. input pipeline; $steps warm-up + $runs x $steps timed steps, median; $(nproc) cores; cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
for n in "${notes[@]}"; do echo "$n"; done
echo "| workload | precision | mirror | torch eager | torch.compile | keras | / eager | / compile | / keras | mirror RSS MiB | eager RSS | compile RSS | keras RSS |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for r in "${rows[@]}"; do echo "$r"; done
