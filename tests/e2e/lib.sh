# Shared by the shell tests (tests/e2e/*.sh, tests/mpi/train.sh); source it, don't run it.
#   need_fashion_mnist     exit 77 (CTest: SKIPPED) without Debian's dataset-fashion-mnist
#   check "what" "test"    evaluates test, prints ok/FAILED, counts failures
#   finish                 exits 1 naming the count when a check failed, else says all passed
fm=/usr/share/datasets/fashion-mnist
fails=0
need_fashion_mnist() {
    if [ ! -r "$fm/train-images-idx3-ubyte.gz" ]; then echo "no Fashion-MNIST; skipped"; exit 77; fi
}
check() { if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; fails=$((fails + 1)); fi; }
finish() {
    local name
    name=$(basename "$0")
    if [ "$fails" -ne 0 ]; then echo "$name: $fails checks failed"; exit 1; fi
    echo "$name: all checks passed"
}
