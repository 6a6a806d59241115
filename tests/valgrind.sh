#!/usr/bin/env bash
# Every unit test under valgrind memcheck (errors and definite leaks fail), on a CPU-only build in
# build-valgrind/. Valgrind does not emulate AVX-512, so this also exercises the AVX2/baseline
# paths (OpenBLAS or built-in GEMM, baseline vector loops). Exhaustive loops sample
# (MIRROR_TEST_QUICK=1). Takes a few minutes; not part of tests/run.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
command -v valgrind >/dev/null || { echo "valgrind is not installed. HINT: apt-get install valgrind" >&2; exit 1; }
cmake -S . -B build-valgrind -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMIRROR_CUDA=OFF >/dev/null
cmake --build build-valgrind -j "$(nproc)" >/dev/null
export MIRROR_TEST_QUICK=1
fail=0 ran=0
for t in build-valgrind/test_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    ran=$((ran + 1))
    start=$(date +%s)
    if valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite "$t" >"$t.valgrind.log" 2>&1; then
        echo "valgrind: $(basename "$t") ok ($(( $(date +%s) - start )) s)"
    else
        echo "valgrind: $(basename "$t") FAILED, see $t.valgrind.log"
        fail=1
    fi
done
# no test binary found is a failure, never "all passed"
if [ $ran -eq 0 ]; then echo "valgrind: FAILED: no test binaries in build-valgrind/"; exit 1; fi
echo "valgrind: $ran tests, $([ $fail -eq 0 ] && echo all clean || echo some FAILED)"
exit $fail
