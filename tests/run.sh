#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine:
#   1. installs the Debian packages mirror needs that are missing (apt-get; sudo when not root),
#   2. configures and builds build/ (the CPU backend, and the CUDA backend where nvcc exists),
#   3. runs CTest (GPU tests report SKIPPED without a GPU),
#   4. builds build-asan/ (CPU, AddressSanitizer + UndefinedBehaviorSanitizer) and runs CTest there.
# MIRROR_SANITIZE_SUITE=0 skips step 4; MIRROR_CUDA=OFF|ON overrides the CUDA detection.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

packages=(build-essential cmake pkg-config libopenblas0-openmp libcmocka-dev libhdf5-dev libopenmpi-dev
          openmpi-bin libyaml-dev zlib1g-dev protobuf-c-compiler libprotobuf-c-dev dataset-fashion-mnist bible-kjv
          python3 clang) # python3: tests/e2e/*.py and tests/tools/check_trace.py (standard library only); clang: the libFuzzer build
                         # of tests/fuzz (CTest fuzz.libfuzzer)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "tests/run.sh: installing ${missing[*]}"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# launch/demo.sh shares the install step above and builds on its own
if [ "${MIRROR_INSTALL_ONLY:-0}" = "1" ]; then exit 0; fi

jobs=$(nproc 2>/dev/null || echo 2)
cuda="${MIRROR_CUDA:-AUTO}"
# The CUDA toolkit's usual home, for shells whose PATH does not name it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi

echo "== build (Release, MIRROR_CUDA=$cuda) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMIRROR_CUDA="$cuda" >build-configure.log 2>&1 ||
    { cat build-configure.log; exit 1; }
grep -E "mirror: CUDA backend" build-configure.log || true
cmake --build build -j "$jobs"
echo "== tests =="
ctest --test-dir build --output-on-failure -j "$jobs"

if [ "${MIRROR_SANITIZE_SUITE:-1}" != "0" ]; then
    echo "== build-asan (ASan + UBSan, CPU) =="
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMIRROR_SANITIZE=ON -DMIRROR_CUDA=OFF \
        >build-asan-configure.log 2>&1 || { cat build-asan-configure.log; exit 1; }
    cmake --build build-asan -j "$jobs"
    echo "== tests under ASan + UBSan =="
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
        ctest --test-dir build-asan --output-on-failure -j "$jobs"
fi
