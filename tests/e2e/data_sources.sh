#!/usr/bin/env bash
# End to end, the trainer's data sources (README "Data sources"): the default CNN
# (configs/cnn.yaml) trained from HDF5, .npy, .npz, TFRecord (plain and GZIP) copies of
# Fashion-MNIST, and from sharded sets of them (a glob, a list), logs exactly the loss and
# evaluation lines of the same data read from IDX (same order, same bits); with two replicas
# (each reads its shard) a sharded HDF5 set trains like IDX; a run over a sharded set stopped at a
# checkpoint taken after the shuffle has crossed a file boundary resumes to the uninterrupted
# run's final checkpoint, bit for bit; a language model's token file split in two trains like the
# whole file. The copies are written by tests/tools/data_copy (no numpy or TensorFlow needed;
# python3 writes the token file). ~18 runs of 8 to 20 steps.
# Usage: tests/e2e/data_sources.sh path/to/mirror path/to/data_copy
set -uo pipefail
mirror=${1:?usage: data_sources.sh path/to/mirror path/to/data_copy}
copy=${2:?usage: data_sources.sh path/to/mirror path/to/data_copy}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_fashion_mnist
for tool in gzip python3; do
    command -v $tool >/dev/null || { echo "data_sources.sh: $tool not found; HINT: apt-get install $tool"; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

# 3000 training and 500 test images in every format, and sharded sets (7 shards: ~430 elements)
ti=$fm/train-images-idx3-ubyte.gz tl=$fm/train-labels-idx1-ubyte.gz
ei=$fm/t10k-images-idx3-ubyte.gz el=$fm/t10k-labels-idx1-ubyte.gz
for f in idx hdf5 npy npz tfrecord; do
    timeout 120 "$copy" "$f" "$ti" "$tl" tr 3000 && timeout 120 "$copy" "$f" "$ei" "$el" ev 500 \
        || { echo "FAILED: data_copy $f"; exit 1; }
done
for f in hdf5 npy tfrecord; do timeout 120 "$copy" "$f" "$ti" "$tl" sh 3000 7 || { echo "FAILED: data_copy $f shards"; exit 1; }; done
gzip -c tr.tfrecord >tr.tfrecord.gz && gzip -c ev.tfrecord >ev.tfrecord.gz
check "7 HDF5 shards written" "[ \$(ls sh-*-of-00007.h5 | wc -l) -eq 7 ]"

# the model and optimizer of configs/cnn.yaml, 20 short steps, evaluation at 10 and 20
head -n "$(grep -n '^data:' "$root/configs/cnn.yaml" | cut -d: -f1)" "$root/configs/cnn.yaml" | sed '$d' >model.yaml
check "configs/cnn.yaml's model section taken" "grep -q 'conv2d: {out: 64' model.yaml"
run() { # run NAME TRAIN EVAL [extra --set ...]: the config's loss and evaluation lines go to NAME.lines
    local name=$1 train=$2 eval=$3
    shift 3
    { cat model.yaml
      echo "data:"
      echo "  train: {$train, shuffle: 500}"
      echo "  eval: {$eval}"
      echo "optimizer: {type: adamw, lr: 2.0e-3, weight_decay: 0.01}"
      echo "schedule: {type: cosine, warmup: 5}"
      echo "train: {steps: 20, batch: 32, eval_every: 10, log_every: 5}"
      echo "checkpoint: {dir: $name, every: 10, keep: 0, resume: auto}"; } >"$name.yaml"
    timeout 300 "$mirror" train "$name.yaml" --quiet "$@" >"$name.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || { echo "--- $name.log"; tail -5 "$name.log"; }
    sed -E 's/"time": [^,]*, //; s/, "samples_per_s".*\}/}/' "$name/metrics.jsonl" >"$name.lines" 2>/dev/null
    return $rc
}
features='features: {image: {key: image/encoded_raw, dtype: uint8, shape: [28, 28, 1]}, label: {key: label, dtype: int64}}'
run idx "source: idx, images: tr.images.idx, labels: tr.labels.idx" "source: idx, images: ev.images.idx, labels: ev.labels.idx"
check "the IDX run exits 0" "[ $? -eq 0 ]"
check "the IDX run logged 4 losses and 2 evaluations" \
      "[ \$(grep -c '\"loss\"' idx.lines) -eq 4 ] && [ \$(grep -c eval_loss idx.lines) -eq 2 ]"
cat idx.lines
declare -A src=(
    [hdf5]="source: hdf5, path: tr.h5, x_dataset: x, y_dataset: y|source: hdf5, path: ev.h5"
    [npy]="source: npy, images: tr.x.npy, labels: tr.y.npy|source: npy, images: ev.x.npy, labels: ev.y.npy"
    [npz]="source: npy, path: tr.npz, x_dataset: x, y_dataset: y|source: npy, path: ev.npz"
    [tfrecord]="source: tfrecord, path: tr.tfrecord, $features|source: tfrecord, path: ev.tfrecord, $features"
    [tfrecord_gz]="source: tfrecord, path: tr.tfrecord.gz, $features|source: tfrecord, path: ev.tfrecord.gz, $features"
    [hdf5_glob]="source: hdf5, path: 'sh-*.h5'|source: hdf5, path: ev.h5"
    [npy_list]="source: npy, images: [sh-00000-of-00007.x.npy, 'sh-0000[1-6]-of-00007.x.npy'], labels: 'sh-*.y.npy'|source: npy, images: ev.x.npy, labels: ev.y.npy"
    [tfrecord_glob]="source: tfrecord, path: 'sh-*.tfrecord', $features|source: tfrecord, path: [ev.tfrecord], $features"
)
for name in hdf5 npy npz tfrecord tfrecord_gz hdf5_glob npy_list tfrecord_glob; do
    run "$name" "${src[$name]%%|*}" "${src[$name]#*|}"
    rc=$?
    check "$name: exits 0" "[ $rc -eq 0 ]"
    check "$name: the same loss and evaluation lines as IDX" "nonempty_file $name.lines && cmp -s idx.lines $name.lines"
done
check "the saved config keeps a list as a list" "grep -q \"images: \\['sh-00000-of-00007.x.npy', 'sh-0000\\[1-6\\]-of-00007.x.npy'\\]\" npy_list/config.yaml"

# two replicas, each reading its shard of the set: like IDX with two replicas
two=(--set 'distribute.devices=[cpu:0, cpu:1]')
run idx2 "source: idx, images: tr.images.idx, labels: tr.labels.idx" "source: idx, images: ev.images.idx, labels: ev.labels.idx" "${two[@]}"
rc1=$?
run glob2 "source: hdf5, path: 'sh-*.h5'" "source: hdf5, path: ev.h5" "${two[@]}"
rc2=$?
check "two replicas: both runs exit 0" "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]"
check "two replicas: a sharded HDF5 set logs IDX's lines" "nonempty_file glob2.lines && cmp -s idx2.lines glob2.lines"

# resume across a file boundary: 10 steps of 32 with a shuffle buffer of 500 have drawn from the
# second of the 430-element shards; resumed from step 10 the run ends on the same checkpoint
cp -r hdf5_glob resumed && rm resumed/ckpt-00000020.h5
sed -i 's/^checkpoint: {dir: hdf5_glob/checkpoint: {dir: resumed/' hdf5_glob.yaml && cp hdf5_glob.yaml resumed.yaml
timeout 300 "$mirror" train resumed.yaml --quiet >resumed.log 2>&1
check "the resumed run exits 0" "[ $? -eq 0 ]"
check "the resumed run resumed from step 10" "grep -q 'resumed from resumed/ckpt-00000010.h5 at step 10' resumed.log"
crcs() { "$mirror" inspect "$1" | grep crc32 | awk '{print $1, $NF}'; }
a=$(crcs hdf5_glob/ckpt-00000020.h5) b=$(crcs resumed/ckpt-00000020.h5)
check "resumed over the sharded set: the final checkpoint equals the uninterrupted run's" "same \"\$a\" \"\$b\""

# a token set: a language model's token file split in two at a window boundary (the second file
# repeats the last token of the first, as every window needs its next token) trains like the file
python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<4001H', *[(i * 7919 + i // 13) % 61 for i in range(4001)]))" >tok.bin
head -c $(( (16 * 120 + 1) * 2 )) tok.bin >tok-0.bin && tail -c +$(( 16 * 120 * 2 + 1 )) tok.bin >tok-1.bin
lm() { # lm NAME PATH: a small gpt, 8 steps; the loss lines go to NAME.lines
    printf '%s\n' "seed: 2" "model: {type: gpt, vocab: 64, context: 16, layers: 1, heads: 2, embd: 16}" \
        "data: {train: {source: tokens, path: '$2', token_bytes: 2, shuffle: 100}}" \
        "optimizer: {type: adamw, lr: 1.0e-2}" "train: {steps: 8, batch: 4, eval_every: 0, log_every: 2}" \
        "checkpoint: {dir: $1, resume: never}" >"$1.yaml"
    timeout 300 "$mirror" train "$1.yaml" --quiet >"$1.log" 2>&1 || { tail -3 "$1.log"; return 1; }
    grep -o '"loss": [0-9.e+-]*' "$1/metrics.jsonl" >"$1.lines"
}
lm tok_one tok.bin
check "tokens: one file trains" "[ \$(wc -l <tok_one.lines) -eq 4 ]"
lm tok_set 'tok-*.bin'
check "tokens: the two-file set logs the one file's losses" "nonempty_file tok_set.lines && cmp -s tok_one.lines tok_set.lines"

# bad input: one error line naming the file, a HINT, exit 1 (a run-time failure: launch/main.c)
printf 'not hdf5' >sh-00007-of-00007.h5
run bad "source: hdf5, path: 'sh-*.h5'" "source: hdf5, path: ev.h5"
check "a corrupt file in the set exits 1" "[ $? -eq 1 ]"
check "  with one error line naming the file" "[ \$(grep -c '^mirror: error: sh-00007-of-00007.h5: not an HDF5 file' bad.log) -eq 1 ]"
check "  and a HINT" "grep -q '^HINT: ' bad.log"
printf 'x' >tr.y.npy
run bad2 "source: npy, images: tr.x.npy, labels: tr.y.npy" "source: npy, images: ev.x.npy, labels: ev.y.npy"
check "a damaged .npy exits 1 naming the file and offset" "[ $? -eq 1 ] && grep -q '^mirror: error: tr.y.npy: offset 0: bad .npy magic' bad2.log"
finish
