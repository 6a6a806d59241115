#!/usr/bin/env bash
# What the user reads: error messages name the config file and key, the data file or the
# checkpoint, never mirror's C source position (that is for MIRROR_LOG=debug), with a HINT that
# fits the error; `mirror help` lists every command; `mirror inspect` of a file another tool wrote
# fails saying so; keys that have no effect for the model are refused and config.yaml lists only
# what applies; progress written to a file (or under mpirun) is one line per log step without
# '\r', --quiet prints none, and on a terminal a message never lands inside a progress line;
# metrics.jsonl's time keeps counting across a resume; doctor names the bf16 GEMM path.
# Usage: tests/e2e/messages.sh path/to/mirror path/to/h5_foreign  (CTest passes both)
set -uo pipefail
mirror=${1:?usage: messages.sh path/to/mirror path/to/h5_foreign}
h5_foreign=${2:?usage: messages.sh path/to/mirror path/to/h5_foreign}
mirror=$(realpath "$mirror") && h5_foreign=$(realpath "$h5_foreign") || exit 1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

# no "main.c:223:"-style position of mirror's own sources in what the user reads (and something to read)
no_c_pos() { [ -n "${1:-}" ] && ! grep -Eq '(^|[ (])[a-z_0-9]+\.(c|cu|h):[0-9]+' <<<"$1"; }

# 1. help
out=$("$mirror" help 2>&1); rc=$?
check "help exits 0" "[ $rc -eq 0 ]"
for c in train eval inspect sweep doctor version help; do
    check "help lists '$c'" "grep -Eq '^  $c( |\$)' <<<\"\$out\""
done
out=$("$mirror" help bogus 2>&1); rc=$?
check "help bogus is a usage error (exit 2) naming it" "[ $rc -eq 2 ] && grep -q \"no command 'bogus'\" <<<\"\$out\" && grep -q '^HINT: ' <<<\"\$out\""

# 2. a missing config file: its name and a HINT about the path, no C position
out=$("$mirror" train missing.yaml 2>&1); rc=$?
echo "$out"
check "missing config exits 2" "[ $rc -eq 2 ]"
check "missing config names the file, no position" "grep -q '^mirror: error: missing.yaml: cannot open' <<<\"\$out\" && no_c_pos \"\$out\""
check "missing config's HINT is about the path" "grep -q '^HINT: check the path of the config file' <<<\"\$out\""
out=$(MIRROR_LOG=debug "$mirror" train missing.yaml 2>&1)
check "MIRROR_LOG=debug prints where the error was raised" "grep -Eq 'raised at [a-z_]+\.c:[0-9]+' <<<\"\$out\""

# 3. mirror inspect of files that are not mirror checkpoints
check "h5_foreign writes its files" "'$h5_foreign' sd.h5 state_dict && '$h5_foreign' other.h5 other && nonempty_file sd.h5 && nonempty_file other.h5"
out=$("$mirror" inspect sd.h5 2>&1); rc=$?
echo "$out" | tail -3
check "inspect of a state_dict file lists its parameters" "grep -q 'fc.weight' <<<\"\$out\""
check "inspect of a state_dict file exits 2 saying it is not a mirror checkpoint" "[ $rc -eq 2 ] && grep -q 'sd.h5 is not a mirror checkpoint' <<<\"\$out\""
check "... with a HINT about init_from and no internal names" "grep -q '^HINT: .*init_from' <<<\"\$out\" && ! grep -q 'MR_' <<<\"\$out\" && no_c_pos \"\$out\""
out=$("$mirror" inspect other.h5 2>&1); rc=$?
check "inspect of an HDF5 file without /params exits 2" "[ $rc -eq 2 ] && grep -q 'other.h5' <<<\"\$out\" && grep -q '^HINT: ' <<<\"\$out\" && no_c_pos \"\$out\""
printf 'not hdf5' >junk.h5
out=$("$mirror" inspect junk.h5 2>&1); rc=$?
check "inspect of a non-HDF5 file exits 2" "[ $rc -eq 2 ] && grep -q 'junk.h5' <<<\"\$out\" && no_c_pos \"\$out\""

# 4. doctor: the bf16 GEMM path, and no two stories about the driver
out=$("$mirror" doctor 2>&1)
check "doctor names the bf16 GEMM path" "grep -q '^cpu gemm bf16: ' <<<\"\$out\""
check "doctor does not say both 'no driver' and 'driver too old'" "grep -q '^gemm 256x256x256 f32 on cpu' <<<\"\$out\" && ! { grep -q 'no NVIDIA driver' <<<\"\$out\" && grep -q 'driver version is insufficient' <<<\"\$out\"; }"

if [ ! -r "$fm/train-images-idx3-ubyte.gz" ] && [ "$fails" -ne 0 ]; then finish; fi
need_fashion_mnist

# 5. keys that have no effect for the model
out=$("$mirror" train "$root/configs/default.yaml" --set model.dropout=0.5 2>&1); rc=$?
echo "$out"
check "--set model.dropout on the cnn exits 2 naming --set and the key" "[ $rc -eq 2 ] && grep -q -- '--set: model.dropout: has no effect with model.type cnn' <<<\"\$out\" && grep -q '^HINT: ' <<<\"\$out\""
cat >cnn_dropout.yaml <<YAML
model: {type: cnn, dropout: 0.5}
data: {train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz}}
YAML
out=$("$mirror" train cnn_dropout.yaml 2>&1); rc=$?
check "model.dropout in a cnn file exits 2 at file:line:col" "[ $rc -eq 2 ] && grep -q 'cnn_dropout.yaml:1:20: model.dropout: has no effect' <<<\"\$out\" && no_c_pos \"\$out\""
out=$("$mirror" train "$root/configs/default.yaml" --set train.batch=100 --set train.accumulate=3 2>&1); rc=$?
check "a cross-key error from --set names --set, not default.yaml:1:1" "[ $rc -eq 2 ] && grep -q -- '--set: train.batch: must be a multiple of train.accumulate' <<<\"\$out\" && ! grep -q 'default.yaml:1:1' <<<\"\$out\""

out=$("$mirror" train "$root/configs/default.yaml" --set data.train.images=/nonexistent.gz 2>&1); rc=$?
check "a missing data file from --set: '--set: data.train.images: no such file', no <file>:1:1" "[ $rc -eq 2 ] && grep -q -- \"--set: data.train.images: no such file '/nonexistent.gz'\" <<<\"\$out\" && ! grep -q ':1:1:' <<<\"\$out\""

# 6. a run with stdout to a file: one line per log step, no '\r'; config.yaml lists what applies
cat >mlp.yaml <<YAML
model: {type: mlp, sizes: [784, 32, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 1000}
  eval: {source: idx, images: $fm/t10k-images-idx3-ubyte.gz, labels: $fm/t10k-labels-idx1-ubyte.gz}
optimizer: {type: adamw, lr: 1.0e-3}
schedule: {type: constant}
train: {steps: 20, batch: 64, eval_every: 0, log_every: 5}
checkpoint: {dir: $tmp/run}
YAML
"$mirror" train mlp.yaml --set "checkpoint.dir=$tmp/file" >file.out 2>&1; rc=$?
check "train to a file exits 0" "[ $rc -eq 0 ] && nonempty_file file.out"
check "the file has no carriage return" "grep -q '^trained 20 steps' file.out && ! grep -q $'\r' file.out"
check "one progress line per log step (4)" "[ \$(grep -c '^step [0-9]*/20 ' file.out) -eq 4 ]"
check "config.yaml lists the mlp's sizes, not a cnn's or a gpt's keys" "grep -q 'sizes: \[784, 32, 10\]' $tmp/file/config.yaml && ! grep -Eq '^ *(channels|hidden|vocab|layers|dropout|momentum|loss_scale):' $tmp/file/config.yaml"
"$mirror" train mlp.yaml --set "checkpoint.dir=$tmp/quiet" --quiet >quiet.out 2>&1; rc=$?
check "--quiet: no progress lines, the summary still" "[ $rc -eq 0 ] && ! grep -q '^step ' quiet.out && grep -q '^trained 20 steps' quiet.out"
out=$("$mirror" train mlp.yaml --frobnicate 2>&1); rc=$?
check "an unknown option exits 2 with a HINT naming the options" "[ $rc -eq 2 ] && grep -q -- \"unknown argument '--frobnicate'\" <<<\"\$out\" && grep -q '^HINT: .*--quiet' <<<\"\$out\""
if command -v mpirun >/dev/null 2>&1; then
    # mpirun gives its ranks a pseudo-terminal even when its own output goes to a file
    if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
    mpirun -np 1 "$mirror" train mlp.yaml --set "checkpoint.dir=$tmp/mpi" >mpi.out 2>&1; rc=$?
    check "under mpirun to a file: no carriage return, 4 progress lines" "[ $rc -eq 0 ] && ! grep -q $'\r' mpi.out && [ \$(grep -c '^step [0-9]*/20 ' mpi.out) -eq 4 ]"
fi
if command -v script >/dev/null 2>&1; then
    script -qc "'$mirror' train mlp.yaml --set checkpoint.dir=$tmp/tty" /dev/null >tty.out 2>&1
    check "on a terminal progress is rewritten in place" "grep -q $'\rstep 10/20' tty.out"
    check "on a terminal a message starts on a line of its own" "grep -q 'mirror info: saved' tty.out && ! grep -q 'ETA [0-9]*s *mirror' tty.out && ! grep -q 's   eval at' tty.out"
fi

printf 'abc' >bad-images
out=$("$mirror" train mlp.yaml --set "checkpoint.dir=$tmp/bad" --set "data.train.images=$tmp/bad-images" 2>&1); rc=$?
check "a damaged data file: names the file and the offset, a HINT about the file" "[ $rc -ne 0 ] && grep -q 'bad-images: truncated: .* at offset 0' <<<\"\$out\" && grep -q '^HINT: the file named above is damaged' <<<\"\$out\" && no_c_pos \"\$out\""

# 7. metrics.jsonl "time" keeps counting across a resume (carried in the checkpoint)
"$mirror" train mlp.yaml --set "checkpoint.dir=$tmp/res" --set train.steps=10 --quiet >/dev/null 2>&1; rc1=$?
"$mirror" train mlp.yaml --set "checkpoint.dir=$tmp/res" --quiet >/dev/null 2>&1; rc2=$?
times=$(sed -n 's/.*"time": \([0-9.]*\).*/\1/p' "$tmp/res/metrics.jsonl" | tr '\n' ' ')
echo "metrics times: $times"
check "two segments ran" "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]"
check "6 time values (4 log steps, 2 evaluations)" "[ \$(wc -w <<<\"\$times\") -eq 6 ]"
check "time never goes back across the resume" "[ -n \"\$times\" ] && awk -v t=\"\$times\" 'BEGIN { n = split(t, a, \" \"); for (i = 2; i <= n; i++) if (a[i] + 0 < a[i-1] + 0) exit 1 }'"

# 8. eval: a HINT that fits the error
ck=$(ls "$tmp/res"/ckpt-*.h5 | tail -1)
head -c 3000 "$ck" >trunc.h5
out=$("$mirror" eval mlp.yaml --checkpoint trunc.h5 2>&1); rc=$?
check "eval of a truncated checkpoint: exit 2, names it, a HINT about damage" "[ $rc -eq 2 ] && grep -q 'trunc.h5' <<<\"\$out\" && grep -q '^HINT: the file is truncated' <<<\"\$out\" && ! grep -q \"belongs to this config's model\" <<<\"\$out\" && no_c_pos \"\$out\""
out=$("$mirror" eval mlp.yaml --set 'model.sizes=[784, 16, 10]' --checkpoint "$ck" 2>&1); rc=$?
check "eval of another model's checkpoint: the HINT says so" "[ $rc -eq 2 ] && grep -q 'fc1.weight' <<<\"\$out\" && grep -q \"^HINT: check that the checkpoint belongs to this config's model\" <<<\"\$out\" && no_c_pos \"\$out\""

finish
