#!/usr/bin/env bash
# Input-pipeline throughput, mirror next to tf.data in the same session (issue 4, Speed): the
# Fashion-MNIST training pipeline (decode, normalize to f32, shuffle 10000, batch 128, prefetch)
# with map parallelism 1 and 2, a consumer that does nothing. bench/bench_data.c and
# bench/peer_tfdata.py; prints a table of elements/s, mirror / tf.data (target >= 2x) and mirror /
# the CNN training step's samples/s (target >= 20x; MIRROR_CNN_SAMPLES_PER_S, default 4300).
# tf.data is n/a when TensorFlow cannot be imported (pip install tensorflow-cpu).
# Usage: bench/run_data.sh [--runs R]   (default 3)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
runs=3
while [ $# -gt 0 ]; do
    case "$1" in
    --runs) runs=$2; shift 2 ;;
    *) echo "run_data.sh: unknown flag $1" >&2; echo "HINT: --runs R" >&2; exit 2 ;;
    esac
done
# (re)build: an incremental build is quick, and a stale binary would measure old code
{ cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j "$(nproc)" --target bench_data; } >&2
cnn=${MIRROR_CNN_SAMPLES_PER_S:-4300}
mo=$(mktemp)
to=$(mktemp)
trap 'rm -f "$mo" "$to"' EXIT
MIRROR_CNN_SAMPLES_PER_S=$cnn build/bench/bench_data --runs "$runs" --parallel 1,2 >"$mo"
python3 bench/peer_tfdata.py --runs "$runs" --parallel 1,2 >"$to" 2>/dev/null || echo "tf.data unavailable: peer_tfdata.py failed" >"$to"
if grep -q "unavailable" "$to"; then echo "# $(grep unavailable "$to" | head -1)"; fi
rate() { awk -v p="parallel $2:" 'index($0, p) == 1 { print $3 }' "$1"; }
echo "# CNN training step: $cnn samples/s; mirror prefetch(AUTO), tf.data prefetch(AUTOTUNE); $runs epochs, median"
echo "| map parallel | mirror elements/s | tf.data elements/s | mirror / tf.data | mirror / CNN step |"
echo "|---:|---:|---:|---:|---:|"
for p in 1 2; do
    mine=$(rate "$mo" $p)
    theirs=$(rate "$to" $p)
    [ -n "$theirs" ] || theirs="n/a"
    ratio=$(awk -v a="$mine" -v b="$theirs" 'BEGIN { if (b + 0 > 0) printf "%.1fx", a / b; else print "n/a" }')
    cnnr=$(awk -v a="$mine" -v b="$cnn" 'BEGIN { printf "%.1fx", a / b }')
    echo "| $p | $mine | $theirs | $ratio | $cnnr |"
done
