#!/usr/bin/env bash
# e2e.cuda_archs: which GPU architectures the CUDA build makes code for (cmake/mirror_cuda_archs.cmake,
# README "GPUs"): the default list (SASS 80, 86, 89, 90, 100 and PTX 100), a user's list sorted with
# PTX of its newest, CMake's own CMAKE_CUDA_ARCHITECTURES spelling, and the configure errors: below
# the floor (sm_80), not a number, native without a GPU (nvidia-smi hidden from PATH), CMake's
# native/all which hide the list. Runs the CMake function directly (cmake -P), in a second.
# Usage: cuda_archs.sh [CMAKE]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/e2e/lib.sh"
drv="$root/tests/tools/cuda_archs.cmake"
cmake_bin=$(command -v "${1:-cmake}") || { echo "FAILED: no cmake"; exit 1; }
run() { "$cmake_bin" "$@" -P "$drv" 2>&1; }

out=$(run); rc=$?
check "default: exit 0" "[ $rc -eq 0 ]"
check "default: SASS 80,86,89,90,100 and PTX 100" \
    "echo \"\$out\" | grep -qx 'cmake=80-real;86-real;89-real;90-real;100 sass=80,86,89,90,100 ptx=100'"

out=$(run -DMIRROR_CUDA_ARCHS="90;80;90"); rc=$?
check "a user's list: sorted, deduplicated, PTX of the newest" \
    "[ $rc -eq 0 ] && echo \"\$out\" | grep -qx 'cmake=80-real;90 sass=80,90 ptx=90'"

out=$(run -DCMAKE_CUDA_ARCHITECTURES="90-real;100-virtual"); rc=$?
check "CMAKE_CUDA_ARCHITECTURES wins, read as SASS/PTX" \
    "[ $rc -eq 0 ] && echo \"\$out\" | grep -qx 'cmake=90-real;100-virtual sass=90 ptx=100'"

out=$(run -DMIRROR_CUDA_ARCHS=75); rc=$?
check "below the floor: configure fails naming the value and the floor" \
    "[ $rc -ne 0 ] && echo \"\$out\" | grep -q 'MIRROR_CUDA_ARCHS: 75 is below 80' && echo \"\$out\" | grep -q 'HINT: '"

out=$(run -DMIRROR_CUDA_ARCHS="sm_90"); rc=$?
check "not a number: configure fails with a HINT" \
    "[ $rc -ne 0 ] && echo \"\$out\" | grep -q \"'sm_90' is not a compute capability\" && echo \"\$out\" | grep -q 'HINT: '"

out=$(PATH=/nonexistent run -DMIRROR_CUDA_ARCHS=native); rc=$?
check "native without a GPU: configure fails with a HINT" \
    "[ $rc -ne 0 ] && echo \"\$out\" | grep -q 'native: no GPU answered nvidia-smi' && echo \"\$out\" | grep -q 'HINT: '"

fake=$(mktemp -d); trap 'rm -rf "$fake"' EXIT
printf '#!/bin/sh\nprintf "9.0\\n8.6\\n9.0\\n"\n' >"$fake/nvidia-smi"; chmod +x "$fake/nvidia-smi"
out=$(PATH="$fake" run -DMIRROR_CUDA_ARCHS=native); rc=$?
check "native: the build machine's GPUs (a fake nvidia-smi: 9.0, 8.6, 9.0)" \
    "[ $rc -eq 0 ] && echo \"\$out\" | grep -qx 'cmake=86-real;90 sass=86,90 ptx=90'"

out=$(run -DCMAKE_CUDA_ARCHITECTURES=native); rc=$?
check "CMake's native: refused, pointing at MIRROR_CUDA_ARCHS=native" \
    "[ $rc -ne 0 ] && echo \"\$out\" | grep -q 'HINT: use -DMIRROR_CUDA_ARCHS=native'"

finish
