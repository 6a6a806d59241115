# Shared by the shell tests (tests/e2e/*.sh, tests/mpi/*.sh); source it, don't run it.
# Every helper fails closed: an empty value, a missing file or a non-number is a failure, never a
# pass (tests/e2e/test_lib.sh checks the helpers themselves).
#   need_fashion_mnist     exit 77 (CTest: SKIPPED) without Debian's dataset-fashion-mnist
#   check "what" "test"    evaluates test (without pipefail: a pipeline's verdict is its last
#                          command's), prints ok/FAILED, counts failures; an empty test FAILS
#   finish                 exits 1 naming the count when a check failed, else says all passed
#   is_num V               V is a number (not empty, not "nan")
#   num_lt A B, num_gt A B, num_le A B   numeric comparisons; false when either is not a number
#   same A B               A and B are equal and not empty (two missing outputs are not "equal")
#   nonempty_file F        F exists and is not empty
#   ckpt_close D ABS REL   D is tests/tools/ckpt_diff's line and its params max_abs < ABS and
#                          max_rel < REL (an empty or malformed line fails)
#   ckpt_equal D           D is ckpt_diff's line for bit-identical files
fm=/usr/share/datasets/fashion-mnist
fails=0
need_fashion_mnist() {
    if [ ! -r "$fm/train-images-idx3-ubyte.gz" ]; then echo "no Fashion-MNIST; skipped"; exit 77; fi
}
# The test runs without pipefail: in `echo "$out" | grep -q x` grep exits at its first match, and
# when echo still had output to write it dies of SIGPIPE (141), which pipefail made a failure of a
# test that held; that is timing, so it struck under load (e2e.models' summary check, e2e.cli). A
# pipeline's verdict is its last command's, as the tests are written.
check() {
    if [ -z "${2//[[:space:]]/}" ]; then echo "FAILED: $1 (no test given)"; fails=$((fails + 1)); return 1; fi
    local pf=0 r=0
    if [[ -o pipefail ]]; then pf=1; fi
    set +o pipefail
    eval "$2" || r=1
    if [ $pf -eq 1 ]; then set -o pipefail; fi
    if [ $r -eq 0 ]; then echo "ok: $1"; else echo "FAILED: $1"; fails=$((fails + 1)); return 1; fi
}
finish() {
    local name
    name=$(basename "$0")
    if [ "$fails" -ne 0 ]; then echo "$name: $fails checks failed"; exit 1; fi
    echo "$name: all checks passed"
}
is_num() { [[ "${1:-}" =~ ^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$ ]]; }
num_lt() { is_num "${1:-}" && is_num "${2:-}" && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }
num_gt() { is_num "${1:-}" && is_num "${2:-}" && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 > b + 0) }'; }
num_le() { is_num "${1:-}" && is_num "${2:-}" && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }
same() { [ -n "${1:-}" ] && [ "$1" = "${2:-}" ]; }
nonempty_file() { [ -s "${1:-}" ]; }
ckpt_close() {
    local re='^params max_abs ([^ ]+) max_rel ([^ ;]+); optimizer max_abs ([^ ]+)$'
    [[ "${1:-}" =~ $re ]] || return 1
    local abs=${BASH_REMATCH[1]} rel=${BASH_REMATCH[2]}
    num_lt "$abs" "$2" && num_lt "$rel" "$3"
}
ckpt_equal() { [ "${1:-}" = "params max_abs 0 max_rel 0; optimizer max_abs 0" ]; }
