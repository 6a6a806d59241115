#!/usr/bin/env bash
# TensorBoard's own reader on a mirror run: tests/e2e/tb_reader.py (EventAccumulator, and
# tbparse when installed) against metrics.jsonl, across a resume. Needs PyPI's tensorboard: the
# python in MIRROR_TB_PYTHON, else python3; skipped (77) with the reason when neither imports it.
# Set it up with: python3 -m venv /tmp/venv-tb && /tmp/venv-tb/bin/pip install tensorboard tbparse
# then MIRROR_TB_PYTHON=/tmp/venv-tb/bin/python ctest -R e2e.tensorboard_reader
set -uo pipefail
mirror=${1:?usage: tensorboard_reader.sh MIRROR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
need_fashion_mnist
py=${MIRROR_TB_PYTHON:-python3}
if ! "$py" -c 'import tensorboard.backend.event_processing.event_accumulator' 2>/dev/null; then
    echo "no tensorboard package for $py; skipped (set MIRROR_TB_PYTHON to a python with PyPI's tensorboard)"
    exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run=(--quiet --set train.steps=40 --set train.log_every=5 --set train.eval_every=10 --set checkpoint.every=20
     --set log.histogram_every=20)
"$mirror" train "$root/configs/cnn.yaml" "${run[@]}" --set train.steps=30 --set checkpoint.dir="$work/r" >"$work/1.log" 2>&1
check "the first part trains to step 30" "[ $? -eq 0 ]"
rm -f "$work/r/ckpt-00000030.h5" # killed after the checkpoint of step 20
"$mirror" train "$root/configs/cnn.yaml" "${run[@]}" --set checkpoint.dir="$work/r" >"$work/2.log" 2>&1
check "the resumed run trains from step 20 to 40" "[ $? -eq 0 ] && grep -q 'at step 20' '$work/2.log'"
"$py" "$here/tb_reader.py" "$work/r" "$root/proto/tensorboard.proto" >"$work/py.log" 2>&1
rc=$?
cat "$work/py.log"
check "TensorBoard's EventAccumulator shows metrics.jsonl's numbers, histograms and the config" "[ $rc -eq 0 ]"
finish
