#!/usr/bin/env bash
# log.trace end to end in one process (README "Tracing steps"): `mirror train ... --set
# log.trace=[3,6]` with two local replicas (distribute.devices=[cpu:0, cpu:1]) writes
# <run_dir>/trace.json, which tests/tools/check_trace.py accepts: it parses as JSON, holds both
# replicas, the spans nest on every thread, every all-reduce on the communication threads carries
# its bytes and one overlaps a backward span (small buckets), per-op spans sit inside forward and
# backward (log.trace_ops), the clocks agree. Also: a window past train.steps closes at the run's
# end, and an early stop (train.early_stop) closes it at its step; a run without log.trace writes no
# trace; a run that fails inside its window writes replica 0's spans marked partial and still
# reports its own error; a window too big for MIRROR_TRACE_MB says so when it opens, drops and
# counts the spans past the bound and still writes a well-formed trace. (mpirun: tests/mpi/trace.sh.)
# Usage: tests/e2e/trace.sh path/to/mirror
set -uo pipefail
mirror=${1:?usage: trace.sh path/to/mirror}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
need_fashion_mnist
command -v python3 >/dev/null ||
    { echo "FAILED: no python3: the trace cannot be checked; HINT: apt-get install python3 (tests/run.sh does)"; exit 1; }
checker="$here/../tools/check_trace.py"
[ -r "$checker" ] || { echo "FAILED: $checker is missing"; exit 1; }
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

train() { timeout 300 "$mirror" train "$here/trace_cnn.yaml" "$@"; }
two=(--set 'distribute.devices=[cpu:0, cpu:1]' --set distribute.bucket_mb=0.2)

# 1. two local replicas, steps 3..6 (an evaluation and a checkpoint at step 4 inside), per-op spans
train --set "checkpoint.dir=$tmp/local" --set 'log.trace=[3,6]' --set log.trace_ops=true "${two[@]}" >"$tmp/local.log" 2>&1
rc=$?
check "2 local replicas with log.trace=[3,6] train and exit 0 ($rc)" "[ $rc -eq 0 ] || { tail -5 $tmp/local.log; false; }"
check "...and write trace.json" "nonempty_file $tmp/local/trace.json"
check "...saying so" "grep -q 'trace: steps 3..6 of 2 replicas: [0-9]* spans in $tmp/local/trace.json' $tmp/local.log"
check "...which check_trace.py accepts (JSON, 2 replicas, nesting, bytes, overlap, per-op spans)" \
      "python3 '$checker' $tmp/local/trace.json --replicas 2 --names replica --steps 3 6 --overlap --ops"
check "...with the evaluation and the checkpoint save of step 4 inside" \
      "grep -q '\"name\":\"evaluate\"' $tmp/local/trace.json && grep -q '\"name\":\"checkpoint_save\"' $tmp/local/trace.json"
check "...and no temporary file left" "[ -z \"\$(ls $tmp/local | grep tmp)\" ]"

# 2. a window past train.steps closes when the run ends (one replica: no communication thread)
train --set "checkpoint.dir=$tmp/end" --set 'log.trace=[6,100]' >"$tmp/end.log" 2>&1
rc=$?
check "a window [6, 100] in an 8-step run exits 0 ($rc)" "[ $rc -eq 0 ]"
check "...and traces steps 6..8" \
      "python3 '$checker' $tmp/end/trace.json --replicas 1 --names replica --steps 6 8"

# 3. no window, no trace
train --set "checkpoint.dir=$tmp/none" >"$tmp/none.log" 2>&1
check "without log.trace there is no trace.json" "[ -f $tmp/none/metrics.jsonl ] && [ ! -e $tmp/none/trace.json ]"

# 4. a run that diverges inside its window: its own error, and replica 0's spans up to it
train --set "checkpoint.dir=$tmp/fail" --set 'log.trace=[2,8]' --set optimizer.type=sgd --set optimizer.lr=1e12 \
      "${two[@]}" >"$tmp/fail.log" 2>&1
rc=$?
check "a diverging run fails with exit 1 ($rc) and its own message" \
      "[ $rc -eq 1 ] && grep -q '^mirror: error: .*non-finite loss' $tmp/fail.log"
check "...after writing replica 0's spans, marked partial" \
      "python3 '$checker' $tmp/fail/trace.json --replicas 2 --names replica --partial"

# 6. an early stop inside the window closes it at that step (patience 1, an improvement of 100 needed)
train --set "checkpoint.dir=$tmp/early" --set 'log.trace=[2,8]' --set train.eval_every=1 --set train.early_stop.patience=1 \
      --set train.early_stop.min_delta=100 "${two[@]}" >"$tmp/early.log" 2>&1
rc=$?
check "an early stop at step 2 inside the window exits 0 ($rc)" "[ $rc -eq 0 ] && grep -q 'early stopping at step 2' $tmp/early.log"
check "...and the trace holds steps 2..2" \
      "python3 '$checker' $tmp/early/trace.json --replicas 2 --names replica --steps 2 2"

# 5. a window too big for its bound: said at the start, spans dropped and counted, the run goes on
MIRROR_TRACE_MB=0.02 train --set "checkpoint.dir=$tmp/drop" --set 'log.trace=[2,8]' --set log.trace_ops=true \
    "${two[@]}" >"$tmp/drop.log" 2>&1
rc=$?
check "a window over MIRROR_TRACE_MB=0.02 still trains and exits 0 ($rc)" "[ $rc -eq 0 ]"
check "...warning when the window opens" "grep -q 'log.trace: steps 2..8 need about .* MiB .* over the bound of 0.02 MiB' $tmp/drop.log"
check "...and when it closes, with the count" "grep -q 'trace: [0-9]* spans dropped' $tmp/drop.log"
check "...and the trace it kept is well formed" \
      "python3 '$checker' $tmp/drop/trace.json --replicas 2 --names replica --dropped"

finish
