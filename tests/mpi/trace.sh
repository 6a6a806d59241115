#!/usr/bin/env bash
# `mpirun -np 2 mirror train ... --set log.trace=[3,6]` (README "Tracing steps"): rank 0 gathers
# rank 1's spans and writes one <run_dir>/trace.json that tests/tools/check_trace.py accepts: it
# parses as JSON, holds both ranks, the spans nest on every thread, every all-reduce on the
# communication threads carries its bytes and at least one overlaps a backward span (small
# buckets), per-op spans sit inside forward and backward, a checkpoint save (step 5) and its
# broadcasts are there, and every collective that needs both ranks' parts starts on both ranks
# before it ends on either: the clocks are aligned within the error the ping-pong measured
# (printed). Again with MIRROR_TRACE_CLOCK=measured, so the measured offset (not the shared clock's
# 0) is applied, and with 2 local replicas per rank (4 replicas, hierarchical). Then the checker
# itself must reject doctored copies: rank 1's clock 1 ms off (one way or the other), a span that
# breaks nesting, an all-reduce without its bytes, rank 1 missing, a truncated file.
# Usage: tests/mpi/trace.sh MPIEXEC path/to/mirror
set -uo pipefail
mpiexec=${1:?usage: trace.sh MPIEXEC path/to/mirror}
mirror=${2:?usage: trace.sh MPIEXEC path/to/mirror}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../e2e/lib.sh"
need_fashion_mnist
command -v python3 >/dev/null ||
    { echo "FAILED: no python3: the trace cannot be checked; HINT: apt-get install python3 (tests/run.sh does)"; exit 1; }
checker="$here/../tools/check_trace.py"
[ -r "$checker" ] || { echo "FAILED: $checker is missing"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
mpirun() { timeout 300 "$mpiexec" --oversubscribe "$@"; }

# the shared small CNN (tests/e2e/trace_cnn.yaml) without evaluations, checkpoints at 5
args=(train "$here/../e2e/trace_cnn.yaml" --set train.eval_every=0 --set checkpoint.every=5
      --set distribute.bucket_mb=0.2 --set distribute.timeout_s=60 --set 'log.trace=[3,6]' --set log.trace_ops=true)

# 1. the shared clock (one host: offset 0, the measurement checked against it)
mpirun -np 2 "$mirror" "${args[@]}" --set "checkpoint.dir=$tmp/np2" >"$tmp/np2.log" 2>&1
rc=$?
check "mpirun -np 2 with log.trace=[3,6] exits 0 ($rc)" "[ $rc -eq 0 ] || { tail -5 $tmp/np2.log; false; }"
check "...and rank 0 writes one trace.json" "nonempty_file $tmp/np2/trace.json"
grep 'trace: steps' "$tmp/np2.log"
check "...saying how well the clocks were measured" \
      "grep -q 'trace: steps 3..6 of 2 replicas: .* clocks measured to within [0-9.]* us by ping-pong' $tmp/np2.log"
check "...which check_trace.py accepts (JSON, both ranks, nesting, bytes, overlap, per-op spans, alignment)" \
      "python3 '$checker' $tmp/np2/trace.json --replicas 2 --names rank --steps 3 6 --overlap --ops"
check "...with step 5's checkpoint save and its collectives on both ranks" \
      "python3 -c \"import json,sys; ev=json.load(open('$tmp/np2/trace.json'))['traceEvents']; \
sys.exit(not all(any(e.get('name') == n and e['pid'] == p for e in ev) for n in ('checkpoint_save', 'broadcast') for p in (0, 1)))\""

# 2. the measured offset applied instead of the shared clock's 0
mpirun -np 2 -x MIRROR_TRACE_CLOCK=measured "$mirror" "${args[@]}" --set "checkpoint.dir=$tmp/meas" >"$tmp/meas.log" 2>&1
rc=$?
check "with MIRROR_TRACE_CLOCK=measured it exits 0 ($rc)" "[ $rc -eq 0 ]"
check "...applies the measured offsets" \
      "python3 -c \"import json,sys; o=json.load(open('$tmp/meas/trace.json'))['otherData']; \
m=o['clock']['measurements'][0]; p=o['parts'][1]; \
sys.exit(not (o['clock']['applied'].startswith('measured') and p['clock_shift_ns'] == [-x for x in m['offset_ns']]))\""
check "...and the trace still checks (aligned within the stated error)" \
      "python3 '$checker' $tmp/meas/trace.json --replicas 2 --names rank --steps 3 6 --overlap --ops"

# 2b. ranks x local replicas (the hierarchical backend: 4 replicas, no overlap); the clocks are
# measured between the processes' first replicas over the job's communicator
mpirun -np 2 "$mirror" "${args[@]}" --set "checkpoint.dir=$tmp/hier" --set 'distribute.devices=[cpu:0, cpu:1]' \
    >"$tmp/hier.log" 2>&1
rc=$?
check "-np 2 x 2 local replicas with log.trace exits 0 ($rc)" "[ $rc -eq 0 ] || { tail -5 $tmp/hier.log; false; }"
grep 'trace: steps' "$tmp/hier.log"
check "...and its trace of 4 replicas checks" \
      "python3 '$checker' $tmp/hier/trace.json --replicas 4 --names replica --steps 3 6 --ops"

# 3. the checker fails closed: doctored copies of the good trace are rejected
doctor() { # $1: name, $2: python code changing the event list `ev` (and `d`)
    python3 - "$tmp/np2/trace.json" "$tmp/$1.json" <<PY
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
$2
json.dump(d, open(sys.argv[2], "w"))
PY
}
rejects() { ! python3 "$checker" "$tmp/$1.json" --replicas 2 --names rank --steps 3 6 --overlap --ops >"$tmp/$1.out" 2>&1 &&
            grep -q "FAILED: .*$2" "$tmp/$1.out"; }
# a clock off by more than the longest collective lasted: every collective then starts on one rank
# after it ended on the other, whichever rank waited for whom, so the shift must show both ways
# (a shift of 1 ms shows on a quiet machine, but under load a collective can last longer than that
# on both ranks and hide it: measured, 1 run in 3 with another build on the cores)
shift='1000.0 + max(e.get("dur", 0) for e in ev if e.get("ph") == "X" and "bytes" in e.get("args", {}))'
doctor later "s = $shift
for e in ev:
    if e['pid'] == 1 and 'ts' in e: e['ts'] += s"
doctor earlier "s = $shift
for e in ev:  # rank 1 earlier: rank 0 later (no timestamp goes below 0)
    if e['pid'] == 0 and 'ts' in e: e['ts'] += s"
check "the checker rejects rank 1's clock shifted later by 1 ms + the longest collective (clocks not aligned)" \
      "rejects later 'collective'"
check "...and shifted earlier by as much" "rejects earlier 'collective'"
doctor nesting 'b = next(e for e in ev if e.get("name") == "backward" and e["pid"] == 0)
b["dur"] += 1.0e6'
check "the checker rejects a backward span that overruns its step" "rejects nesting 'spans do not nest'"
doctor nobytes 'tid = next(e["tid"] for e in ev if e.get("name") == "thread_name" and e["args"]["name"] == "communication")
a = next(e for e in ev if e["ph"] == "X" and e["tid"] == tid)
del a["args"]["bytes"]'
check "the checker rejects an all-reduce without its bytes" "rejects nobytes 'without bytes'"
doctor onerank 'd["traceEvents"] = [e for e in ev if e["pid"] == 0]'
check "the checker rejects a trace without rank 1" "rejects onerank 'processes'"
head -c 5000 "$tmp/np2/trace.json" >"$tmp/truncated.json"
check "the checker rejects a truncated file" "rejects truncated 'does not parse'"
check "the checker rejects a missing file" "rejects missing 'does not parse'"

finish
