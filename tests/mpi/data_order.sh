#!/usr/bin/env bash
# Exact data order across numbers of ranks under mpirun (docs/DESIGN.md, "Data pipeline
# determinism"; the same with local replicas: tests/unit/test_data_order.c): -np 2 for 30 steps is
# the reference; -np 2 for 15 steps, resumed with -np 1, -np 4 and -np 2 x 2 local replicas to 30,
# consumes exactly the reference's samples in its order (MIRROR_DATA_LOG's per-replica sample logs,
# train/train_data.c, sorted by global position): no sample repeated or skipped, and the resumed
# runs log no "data order starts over"; evaluation over 3 ranks counts each test image exactly once.
# Usage: tests/mpi/data_order.sh MPIEXEC path/to/mirror
set -uo pipefail
mpiexec=${1:?usage: data_order.sh MPIEXEC mirror}
mirror=${2:?}
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"
need_fashion_mnist
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpirun() { timeout 120 "$mpiexec" --oversubscribe "$@"; }

cat >"$tmp/exp.yaml" <<YAML
seed: 3
model: {type: mlp, sizes: [784, 16, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 500}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
schedule: {type: constant}
train: {steps: 30, batch: 16, eval_every: 0, log_every: 10}
checkpoint: {resume: auto}
log: {tensorboard: false}
distribute: {timeout_s: 20}
YAML
# "position index epoch" of every training sample in logs $1.*, sorted by position
samples() { cat "$1".[0-9]* | awk '$1 == "train" { print $2, $3, $4 }' | sort -n -k1,1; }
# the reference's samples from position $1 on
ref_from() { samples "$tmp/ref" | awk -v p="$1" '$1 >= p'; }

MIRROR_DATA_LOG=$tmp/ref mpirun -np 2 "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/ref.d" >"$tmp/ref.out" 2>&1
check "-np 2 trains 30 steps" "grep -q '^trained 30 steps' $tmp/ref.out || { tail -3 $tmp/ref.out; false; }"
check "the reference consumed 480 samples at positions 0..479" \
    "same \"\$(samples $tmp/ref | awk '{ print \$1 }' | tr '\n' ' ')\" \"\$(seq -s ' ' 0 479) \""
MIRROR_DATA_LOG=$tmp/half mpirun -np 2 "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/half.d" \
    --set train.steps=15 >"$tmp/half.out" 2>&1
check "-np 2 trains 15 steps" "[ -f $tmp/half.d/ckpt-00000015.h5 ]"
check "the first 15 steps consumed the reference's first 240 samples" \
    "same \"\$(samples $tmp/half | md5sum)\" \"\$(ref_from 0 | head -240 | md5sum)\""
for run in "np1:-np 1" "np4:-np 4" "np2x2:-np 2 --devices"; do
    tag=${run%%:*}
    args=${run#*:}
    np=$(echo "$args" | awk '{ print $2 }')
    extra=()
    [[ "$args" == *--devices* ]] && extra=(--set 'distribute.devices=[cpu:0, cpu:1]')
    MIRROR_DATA_LOG=$tmp/$tag mpirun -np "$np" "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/$tag.d" \
        --set "checkpoint.resume=$tmp/half.d/ckpt-00000015.h5" "${extra[@]}" >"$tmp/$tag.out" 2>&1
    check "$tag: resumes at step 15 and trains to 30" \
        "grep -q 'resumed from .*ckpt-00000015.h5 at step 15' $tmp/$tag.out && grep -q '^trained' $tmp/$tag.out || { tail -3 $tmp/$tag.out; false; }"
    check "$tag: no 'data order starts over'" "! grep -q 'starts over' $tmp/$tag.out"
    check "$tag: steps 15..29 consume the reference's samples 240..479, in order, none repeated or skipped" \
        "same \"\$(samples $tmp/$tag | md5sum)\" \"\$(ref_from 240 | md5sum)\" && [ \$(samples $tmp/$tag | wc -l) -eq 240 ]"
done

# evaluation over 3 ranks: each of the 10000 test images exactly once (each rank's last batch partial)
MIRROR_DATA_LOG=$tmp/ev mpirun -np 3 "$mirror" train "$tmp/exp.yaml" --set "checkpoint.dir=$tmp/ev.d" \
    --set train.steps=1 --set train.batch=48 --set data.eval.source=idx \
    --set "data.eval.images=$fm/t10k-images-idx3-ubyte.gz" --set "data.eval.labels=$fm/t10k-labels-idx1-ubyte.gz" \
    >"$tmp/ev.out" 2>&1
check "-np 3 evaluates" "grep -q 'eval at step 1' $tmp/ev.out || { tail -3 $tmp/ev.out; false; }"
check "-np 3: evaluation positions and images are 0..9999, each exactly once" \
    "same \"\$(cat $tmp/ev.[0-9]* | awk '\$1 == \"eval\" { print \$2, \$3 }' | sort -n | md5sum)\" \"\$(seq 0 9999 | awk '{ print \$1, \$1 }' | md5sum)\""

finish
