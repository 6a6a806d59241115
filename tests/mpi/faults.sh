#!/usr/bin/env bash
# The never-hang contract of distribute/comm over MPI, end to end (CTest: mpi.faults).
# Runs test_comm_mpi's fault drills under mpirun -np 2 with a 2 s collective deadline:
#   hang  rank 1 skips an all-reduce (sleeps 120 s): rank 0 must time out naming the collective,
#         abort, and take rank 1 down with it (hangring: the same with 4 MB, the ring path;
#         hangfrag: with 16 KB, the small all-reduce's messages in fragments);
#   die   rank 1 kills itself with SIGKILL before the all-reduce;
#   fail  rank 1 calls mr_comm_abort while rank 0 waits in the all-reduce.
# Each must end non-zero within 30 s, its output must name the collective or the rank, and no
# process of the drill may be left behind. Every mpirun runs under `timeout 60`, so this script
# cannot hang either.
# Usage: tests/mpi/faults.sh path/to/mpiexec path/to/test_comm_mpi
set -uo pipefail
mpiexec=${1:?usage: faults.sh path/to/mpiexec path/to/test_comm_mpi}
prog=${2:?usage: faults.sh path/to/mpiexec path/to/test_comm_mpi}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh" # check (fails closed), num_lt
# without pgrep, "no process left behind" would pass for want of a way to look
command -v pgrep >/dev/null || { echo "FAILED: no pgrep (package procps): cannot check for processes left behind"; exit 1; }

# No process whose command line holds this drill's tag: polls up to 10 s (mpirun reaps its
# children asynchronously), then lists and kills what is left (by pid, so the next drill starts
# clean).
left_behind() {
    local tag=$1 i
    for i in $(seq 1 50); do
        pgrep -f -- "$tag" >/dev/null || return 1
        sleep 0.2
    done
    echo "left behind:"
    pgrep -a -f -- "$tag"
    for pid in $(pgrep -f -- "$tag"); do kill -9 "$pid" 2>/dev/null; done
    return 0
}

drill() {
    local mode=$1 pattern=$2 tag out rc t0 t1
    tag="comm-fault-$mode-$$-$RANDOM"
    echo "== $mode =="
    t0=$(date +%s.%N)
    out=$(timeout -k 5 60 "$mpiexec" -np 2 --oversubscribe "$prog" "$mode" "$tag" 2>&1)
    rc=$?
    t1=$(date +%s.%N)
    local secs
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    echo "$out" | grep -v '^\s*$' | head -40
    echo "-- exit $rc after $secs s"
    check "$mode: the job exits non-zero" "[ $rc -ne 0 ]"
    # (also tells the 60 s guard apart: mpirun's own exit code is 137 when a rank died of SIGKILL)
    check "$mode: ends within 30 s ($secs s)" "num_lt '$secs' 30"
    check "$mode: the output names it ($pattern)" "echo \"\$out\" | grep -Eq -- '$pattern'"
    check "$mode: no process left behind" "! left_behind '$tag'"
}

# rank 0's own deadline message: the collective, its number, the rank, the hint
drill hang 'allreduce #2 \(1000 f32 sum\) on rank 0: no progress for 2 s.*HINT'
drill hangring 'allreduce #2 \(1048576 f32 sum\) on rank 0: no progress for 2 s \(in ring reduce-scatter.*HINT'
drill hangfrag 'allreduce #2 \(4096 f32 sum\) on rank 0: no progress for 2 s \(in recursive-doubling.*HINT'
# mpirun's report or rank 0's deadline message, either naming rank 1 / the collective
drill die 'rank 1 .*(exited on signal 9|Killed)|allreduce #2 .* on rank 0: no progress'
# rank 1's abort names itself, its code and why
drill fail 'rank 1 aborting the job \(code 5\): loss is NaN at step 7'

if [ "$fails" -ne 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "all fault drills passed"
