#!/usr/bin/env bash
# mirror as an installed library (README "Use mirror as a library"): installs BUILD into a temporary
# prefix and checks what a user of the package gets, never the build tree:
#   - the files: libmirror.so and .a, include/mirror/..., mirror.pc, the CMake package, bin/mirror;
#   - libmirror.so needs no CUDA, cuDNN or NCCL library (ldd);
#   - every installed header compiles alone as C11 and as C++ with only <prefix>/include on the path;
#   - examples/ configured with find_package(mirror) (CMAKE_PREFIX_PATH), shared and static, and
#     compiled with `pkg-config --cflags --libs mirror`; each build trains and must halve its loss.
#   tests/install/install.sh BUILD_DIR [EXTRA_FLAGS]   (EXTRA_FLAGS: e.g. the sanitizer flags of BUILD)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "$1" && pwd)
flags="${2:-}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mirror-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "cmake --install"; }
so=$(find "$prefix" -name libmirror.so -print -quit)
[ -n "$so" ] || fail "no libmirror.so under $prefix"
libdir=$(dirname "$so")
for f in "$libdir/libmirror.a" "$libdir/pkgconfig/mirror.pc" "$libdir/cmake/mirror/mirror-config.cmake" \
         "$prefix/include/mirror/autodiff/nn.h" "$prefix/include/mirror/core/tensor.h" "$prefix/include/mirror/train/train.h" "$prefix/bin/mirror"; do
    [ -f "$f" ] || fail "not installed: ${f#$prefix/}"
done
echo "ok: installed $(find "$prefix" -type f | wc -l) files"
"$prefix/bin/mirror" help >"$tmp/help.txt" 2>&1 || fail "installed bin/mirror help"
grep -q train "$tmp/help.txt" || fail "installed bin/mirror help does not list train"
deps=$(ldd "$so")
[ -n "$deps" ] || fail "ldd printed nothing for $so"
if echo "$deps" | grep -E 'libcuda|libcublas|libcudnn|libnccl'; then fail "libmirror.so needs a CUDA library"; fi
echo "ok: libmirror.so needs no CUDA library"

n=0
cxx=$(command -v c++ || command -v g++ || true)
while IFS= read -r h; do
    rel=${h#$prefix/include/}
    echo "#include <$rel>" >"$tmp/h.c"
    cc -std=c11 -Wall -Werror -fsyntax-only -I"$prefix/include" "$tmp/h.c" 2>"$tmp/h.log" || { cat "$tmp/h.log"; fail "$rel alone as C11"; }
    if [ -n "$cxx" ]; then
        cp "$tmp/h.c" "$tmp/h.cc"
        "$cxx" -std=c++17 -fsyntax-only -I"$prefix/include" "$tmp/h.cc" 2>"$tmp/h.log" || { cat "$tmp/h.log"; fail "$rel alone as C++"; }
    fi
    n=$((n + 1))
done < <(find "$prefix/include/mirror" -name '*.h' | sort)
[ "$n" -gt 10 ] || fail "only $n installed headers"
echo "ok: $n installed headers compile alone (C11${cxx:+ and C++})"

run_example() { # name binary
    "$2" >"$tmp/$1.log" 2>&1 || { cat "$tmp/$1.log"; fail "example ($1) exited non-zero"; }
    grep -E 'loss [0-9.]+ -> [0-9.]+' "$tmp/$1.log" || fail "example ($1) printed no loss"
}
for variant in shared static; do
    static=OFF; [ $variant = static ] && static=ON
    cmake -S "$root/examples" -B "$tmp/cmake-$variant" -DCMAKE_PREFIX_PATH="$prefix" -DMIRROR_EXAMPLE_STATIC=$static \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$tmp/cfg.log" 2>&1 || { cat "$tmp/cfg.log"; fail "configure examples ($variant)"; }
    cmake --build "$tmp/cmake-$variant" >"$tmp/bld.log" 2>&1 || { cat "$tmp/bld.log"; fail "build examples ($variant)"; }
    run_example "cmake-$variant" "$tmp/cmake-$variant/residual_mlp"
done
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046,SC2086
cc -std=c11 $flags "$root/examples/residual_mlp.c" $(pkg-config --cflags --libs mirror) -Wl,-rpath,"$libdir" \
    -o "$tmp/pc-shared" || fail "pkg-config build"
run_example pkg-config "$tmp/pc-shared"
echo "ok: examples/ built against the installed package (CMake shared, CMake static, pkg-config) and trained"
