#!/usr/bin/env bash
# Input-pipeline throughput, mirror next to tf.data in the same session (issue 4, Speed): the
# Fashion-MNIST training pipeline (decode, normalize to f32, shuffle 10000, batch 128, prefetch)
# with map parallelism 1 and 2, a consumer that does nothing. bench/bench_data.c and
# bench/peer_tfdata.py; prints a table of elements/s, mirror / tf.data (target >= 2x) and mirror /
# the CNN training step's samples/s (target >= 20x; MIRROR_CNN_SAMPLES_PER_S, default 4300).
# tf.data is n/a when TensorFlow cannot be imported (pip install tensorflow-cpu).
# Then the same pipeline from each file format the trainer reads (issue 17, item 5; README "Data
# sources"): copies of the 60000 training images written by tests/tools/data_copy into a temporary
# directory (IDX, HDF5, .npy, TFRecord, 8 TFRecord shards), bench/bench_data_sources.c next to
# bench/peer_tfdata_sources.py (tf.data reading the same files: TFRecordDataset + parse_example,
# map AUTOTUNE, prefetch; mirror maps with one thread as the trainer does), run alternately per source so both see the same machine load; the
# median of --rounds rounds (default 3) of a median of R epochs each; target mirror >= 2x.
# The peers run under bench/peers.sh's Python (PyPI tensorflow-cpu in a venv; PYTHON=... overrides);
# the hdf5 row of tf.data needs h5py in it (pip install h5py), else that row says so.
# Usage: bench/run_data.sh [--runs R] [--rounds K]   (default 3, 3)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
runs=3
rounds=3
py=${PYTHON:-}
if [ -z "$py" ]; then IFS=$'\t' read -r py peers < <(bench/peers.sh); echo "# peers: $peers"; fi
while [ $# -gt 0 ]; do
    case "$1" in
    --runs) runs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "run_data.sh: unknown flag $1" >&2; echo "HINT: --runs R --rounds K" >&2; exit 2 ;;
    esac
done
# (re)build: an incremental build is quick, and a stale binary would measure old code
{ cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j "$(nproc)" --target bench_data bench_data_sources data_copy; } >&2
cnn=${MIRROR_CNN_SAMPLES_PER_S:-4300}
mo=$(mktemp)
to=$(mktemp)
dd=$(mktemp -d)
trap 'rm -rf "$mo" "$to" "$dd"' EXIT
MIRROR_CNN_SAMPLES_PER_S=$cnn build/bench/bench_data --runs "$runs" --parallel 1,2 >"$mo"
"$py" bench/peer_tfdata.py --runs "$runs" --parallel 1,2 >"$to" 2>/dev/null || echo "tf.data unavailable: peer_tfdata.py failed" >"$to"
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

# ---- the same pipeline from each file format (copies of the training set) ----
fm=/usr/share/datasets/fashion-mnist
for f in idx hdf5 npy tfrecord; do
    build/data_copy "$f" "$fm/train-images-idx3-ubyte.gz" "$fm/train-labels-idx1-ubyte.gz" "$dd/tr" >&2
done
build/data_copy tfrecord "$fm/train-images-idx3-ubyte.gz" "$fm/train-labels-idx1-ubyte.gz" "$dd/sh" 0 8 >&2
srate() { awk -v p="source $2:" 'index($0, p) == 1 { print $3 }' "$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; }'; }
echo
echo "# the pipeline from each file format: $rounds rounds of mirror then tf.data per source, median of the rounds (each the median of $runs epochs)"
echo "| source | mirror elements/s | tf.data elements/s | mirror / tf.data |"
echo "|---|---:|---:|---:|"
for s in idx hdf5 npy tfrecord tfrecord_sharded; do
    ms=() ts=()
    for r in $(seq 1 "$rounds"); do
        build/bench/bench_data_sources --dir "$dd" --runs "$runs" --sources "$s" >"$mo"
        "$py" bench/peer_tfdata_sources.py --dir "$dd" --runs "$runs" --sources "$s" >"$to" 2>/dev/null || true
        ms+=("$(srate "$mo" "$s")")
        ts+=("$(srate "$to" "$s")")
    done
    mine=$(printf '%s\n' "${ms[@]}" | grep -E '^[0-9]' | median)
    theirs=$(printf '%s\n' "${ts[@]}" | grep -E '^[0-9]' | median)
    [ -n "$mine" ] || { echo "run_data.sh: bench_data_sources gave no number for $s" >&2; exit 1; }
    [ -n "$theirs" ] || theirs="n/a"
    ratio=$(awk -v a="$mine" -v b="$theirs" 'BEGIN { if (b + 0 > 0) printf "%.1fx", a / b; else print "n/a" }')
    echo "| $s | $mine | $theirs | $ratio |"
done
