#!/usr/bin/env bash
# emu.gpu_dp: bench/run_gpu_dp.sh (data-parallel GPU training through `mirror train`, README "GPU
# data parallelism") on the CUDA emulator's command line (build/mirror-emu, 4 emulated GPUs, the
# tiny GPT): a row per GPU count with positive numbers, 100% efficiency for 1 GPU by definition,
# the exposed-communication column only for k > 1; and its errors: more GPUs than visible, a bad
# model name. It checks the script and the user path (YAML -> distribute.devices -> NCCL on
# emulated GPUs), not speed: the emulator's timings mean nothing.
# Usage: gpu_dp.sh MIRROR_EMU
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/e2e/lib.sh"
emu=${1:-}
[ -x "$emu" ] || { echo "FAILED: no emulated mirror binary '$emu'"; exit 1; }
export MR_EMU_DEVICES=4
out=$("$root/bench/run_gpu_dp.sh" --mirror "$emu" --model tiny 2>&1); rc=$?
echo "$out"
check "run_gpu_dp.sh on 4 emulated GPUs: exit 0" "[ $rc -eq 0 ]"
row() { echo "$out" | awk -F'|' -v k="$1" '$2 + 0 == k && $2 ~ /[0-9]/ { print }'; }
field() { row "$1" | awk -F'|' -v f="$2" '{ gsub(/[ %]/, "", $f); print $f }'; }
for k in 1 2 4; do
    check "$k GPUs: a row" "[ \$(row $k | wc -l) -eq 1 ]"
    check "$k GPUs: global batch $((4 * k))" "same \"\$(field $k 3)\" $((4 * k))"
    check "$k GPUs: tokens/s > 0" "num_gt \"\$(field $k 4)\" 0"
    check "$k GPUs: ms/step > 0" "num_gt \"\$(field $k 7)\" 0"
    check "$k GPUs: efficiency is a number" "is_num \"\$(field $k 6)\""
done
check "1 GPU: efficiency 100% by definition" "same \"\$(field 1 6)\" 100.0"
check "1 GPU: no exposed communication column" "same \"\$(field 1 8)\" -"
check "2 GPUs: exposed communication is a number" "is_num \"\$(field 2 8)\""
check "no 8-GPU row with 4 GPUs visible" "[ -z \"\$(row 8)\" ]"

out=$("$root/bench/run_gpu_dp.sh" --mirror "$emu" --model tiny --gpus "1 8" 2>&1); rc=$?
check "--gpus 8 with 4 visible: exit 1 naming both counts" \
    "[ $rc -eq 1 ] && echo \"\$out\" | grep -q 'asks for 8 GPUs, .* sees 4'"
out=$("$root/bench/run_gpu_dp.sh" --mirror "$emu" --model huge 2>&1); rc=$?
check "an unknown model: exit 2 with a HINT" "[ $rc -eq 2 ] && echo \"\$out\" | grep -q 'HINT: gpt2, small or tiny'"
out=$(MR_EMU_DEVICES=1 "$root/bench/run_gpu_dp.sh" --mirror "$emu" --model tiny 2>&1); rc=$?
check "one GPU: the 1-GPU row and the reason there is no other" \
    "[ $rc -eq 0 ] && echo \"\$out\" | grep -q 'NCCL refuses two ranks on one GPU' && [ \$(echo \"\$out\" | grep -c '^| [0-9]') -eq 1 ]"
finish
