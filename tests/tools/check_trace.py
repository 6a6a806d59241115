#!/usr/bin/env python3
"""Checks a <run_dir>/trace.json written by `mirror train --set log.trace=[A,B]` (train/trace.c).

Usage: check_trace.py TRACE --replicas N [--names rank|replica] [--steps A B] [--overlap] [--ops]
                      [--partial] [--dropped]

Fails (exit 1, naming what failed) unless:
  - the file parses as JSON, in the Chrome trace event format's object form (traceEvents, otherData);
  - it holds exactly replicas processes, pids 0..N-1, named "rank R" or "replica R" (--names);
  - every process has a training thread whose "step" spans are steps A..B, once each (--steps),
    and spans data_wait, forward, backward, exchange and optimizer inside those steps;
  - on every thread of every process the spans nest: each lies inside the one around it or
    starts after it ended;
  - every span on a communication thread is a collective with integer args bytes > 0 and seq;
  - (--overlap) every process has all-reduces on its communication thread, at least one of them
    (on any process) overlaps one of its own process's backward spans (with --ops: one of the
    backward's kernels, so an all-reduce that merely starts after the last kernel does not count;
    a process without any is noted: on a loaded machine its communication thread may only have
    run once the backward waited), and every flow end has its start;
  - a collective whose result needs every rank's part (allreduce, allgather, reduce_scatter,
    barrier) with the same seq on every process (the same call of one communicator) starts on each
    before it ends on every other, within the measured clock error: aligned clocks (a broadcast
    may end at its root before a receiver entered it, so broadcasts are left out);
  - the clock measurements in otherData have an error bound >= 0, and where two processes share a
    kernel (one clock in truth) the measured offset lies within that bound;
  - nothing was dropped; (--ops) per-op spans (args node) lie inside forward or backward spans.
It prints the numbers it checked (spans, clock error, the overlap found). --partial: the trace of
a run that failed inside its window (only replica 0's spans, otherData.partial set). --dropped: a
window too big for its buffers (otherData.dropped > 0; the tracks end early, so only the format,
the processes, the nesting, the bytes and the clocks are checked). The shell tests run it
(tests/e2e/trace.sh, tests/mpi/trace.sh).
"""
import argparse
import json
import re
import sys

# The writer prints exact nanoseconds as microseconds with three decimals, so ts + dur is exact but
# for the float addition here.
SLACK_US = 1e-6


def fail(msg):
    print("FAILED: " + msg)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--replicas", type=int, required=True)
    ap.add_argument("--names", choices=["rank", "replica"], default="replica")
    ap.add_argument("--steps", type=int, nargs=2)
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--partial", action="store_true")
    ap.add_argument("--dropped", action="store_true")
    a = ap.parse_args()

    try:
        with open(a.trace) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{a.trace} does not parse as JSON: {e}")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail("no traceEvents list (the Chrome trace format's object form)")
    other = doc.get("otherData")
    if not isinstance(other, dict):
        fail("no otherData object")
    evs = doc["traceEvents"]
    for e in evs:
        if not isinstance(e, dict) or e.get("ph") not in ("M", "X", "i", "s", "f") or not isinstance(e.get("pid"), int):
            fail(f"an event that is not a known phase with an integer pid: {e}")
        if e["ph"] != "M" and not (isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0):
            fail(f"an event without a ts >= 0: {e}")
        if e["ph"] == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            fail(f"a span without a dur >= 0: {e}")

    # processes and threads
    want = 1 if a.partial else a.replicas
    pnames = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    if sorted(pnames) != list(range(want)):
        fail(f"processes {sorted(pnames)}, expected pids 0..{want - 1}")
    for pid, name in pnames.items():
        if not re.fullmatch(rf"{a.names} {pid}( \(rank \d+\))?", name):
            fail(f"process {pid} is named '{name}', expected '{a.names} {pid}'")
    tnames = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = {}
    for e in evs:
        if e["ph"] == "X":
            if (e["pid"], e.get("tid")) not in tnames:
                fail(f"a span on a thread without a name: {e}")
            spans.setdefault((e["pid"], e["tid"]), []).append(e)
    def thread(pid, name):
        return [t for (p, t), n in tnames.items() if p == pid and n == name]

    total = sum(len(v) for v in spans.values())
    print(f"trace: {len(evs)} events, {total} spans, {len(pnames)} processes, {len(tnames)} threads")

    # nesting, per thread
    for (pid, tid), ss in spans.items():
        ss.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in ss:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - SLACK_US:
                stack.pop()  # e starts after the top one ended: it is not inside it
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + SLACK_US:
                p = stack[-1]
                fail(f"spans do not nest on {pnames.get(pid)} / {tnames[(pid, tid)]}: {e['name']} "
                     f"[{e['ts']}, {e['ts'] + e['dur']}] overlaps the end of {p['name']} [{p['ts']}, {p['ts'] + p['dur']}]")
            stack.append(e)
    print("ok: the spans nest on every thread")

    def inside(e, outer):
        return any(o["ts"] - SLACK_US <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] + SLACK_US for o in outer)

    # the training thread: the steps and what a step is made of
    backward = {}
    for pid in pnames:
        tids = thread(pid, "training")
        if len(tids) != 1:
            fail(f"{pnames[pid]} has {len(tids)} training threads")
        ss = spans.get((pid, tids[0]), [])
        steps = [e for e in ss if e["name"] == "step"]
        got = sorted(e["args"]["step"] for e in steps)
        if a.steps and not a.dropped and got != list(range(a.steps[0], a.steps[1] + 1)):
            fail(f"{pnames[pid]} traced steps {got}, expected {a.steps[0]}..{a.steps[1]}")
        for need in ("data_wait", "forward", "backward", "exchange", "optimizer"):
            mine = [e for e in ss if e["name"] == need]
            if not mine and not a.partial:
                fail(f"{pnames[pid]}: no {need} span on the training thread")
            if a.partial or a.dropped:
                continue
            if len(mine) < len(steps):
                fail(f"{pnames[pid]}: {len(mine)} {need} spans in {len(steps)} steps")
            for e in mine:
                if not inside(e, steps):
                    fail(f"{pnames[pid]}: a {need} span at {e['ts']} outside every step span")
        backward[pid] = [e for e in ss if e["name"] in ("backward", "forward_backward")]
        # with per-op spans, the backward's kernels: an all-reduce must run beside one of them, not
        # merely start in the few microseconds between the last kernel and the end of the span
        kernels = [e for e in ss if "node" in e.get("args", {}) and inside(e, backward[pid])]
        if kernels:
            backward[pid] = kernels
        if a.ops:
            ops = [e for e in ss if "node" in e.get("args", {})]
            outer = [e for e in ss if e["name"] in ("forward", "backward", "forward_backward")]
            if not ops:
                fail(f"{pnames[pid]}: no per-op spans (log.trace_ops)")
            for e in ops:
                if not inside(e, outer):
                    fail(f"{pnames[pid]}: op span {e['name']} at {e['ts']} outside forward and backward")
            print(f"ok: {pnames[pid]}: {len(ops)} per-op spans, each inside a forward or backward span")
    print(f"ok: every process traced steps {a.steps[0]}..{a.steps[1]}" if a.steps else "ok: every process has steps")

    # the communication threads: collectives with their bytes, overlapping the backward
    overlapping = 0
    for pid in pnames:
        tids = thread(pid, "communication")
        ars = []
        for tid in tids:
            for e in spans.get((pid, tid), []):
                args = e.get("args", {})
                if not (isinstance(args.get("bytes"), int) and args["bytes"] > 0 and isinstance(args.get("seq"), int)):
                    fail(f"{pnames[pid]}: {e['name']} on the communication thread without bytes > 0 and a seq: {e}")
                ars.append(e)
        if a.overlap:
            ars = [e for e in ars if e["name"] == "allreduce"]
            if not ars:
                fail(f"{pnames[pid]}: no all-reduce on a communication thread (overlapped buckets)")
            over = [(e, b) for e in ars for b in backward[pid]
                    if e["ts"] < b["ts"] + b["dur"] and b["ts"] < e["ts"] + e["dur"]]
            what = "kernel of the backward" if backward[pid] and "node" in backward[pid][0].get("args", {}) \
                else "backward span"
            n_over = len({id(x) for x, _ in over})
            overlapping += n_over
            if not over:  # possible on a loaded machine: the thread ran only once the backward waited
                print(f"note: {pnames[pid]}: none of its {len(ars)} all-reduces overlaps a {what}")
                continue
            e, b = over[0]
            hidden = min(e["ts"] + e["dur"], b["ts"] + b["dur"]) - max(e["ts"], b["ts"])
            print(f"ok: {pnames[pid]}: {n_over} of {len(ars)} bucket all-reduces overlap a {what} (e.g. "
                  f"{e['args']['bytes']} bytes at {e['ts']:.1f} us beside {b['name']}, {hidden:.1f} us of it)")
    if a.overlap:
        if overlapping == 0:
            fail("no all-reduce on a communication thread overlaps its process's backward")
        starts = {(e["pid"], e["id"]) for e in evs if e["ph"] == "s"}
        ends = [(e["pid"], e["id"]) for e in evs if e["ph"] == "f"]
        if not ends or any(x not in starts for x in ends):
            fail(f"{len(ends)} flow ends, not every one with its start")
        print(f"ok: {len(ends)} flows from a bucket's queueing to its all-reduce, each with both ends")

    # the clocks: measurements, and what they promise
    clock = other.get("clock", {})
    meas = clock.get("measurements")
    if not isinstance(meas, list) or not isinstance(clock.get("max_error_ns"), int):
        fail("otherData.clock lacks its measurements and max_error_ns")
    for m in meas:
        for off, err in zip(m["offset_ns"], m["error_ns"]):
            if err < 0:
                fail(f"a negative clock error bound: {m}")
            if m["same_kernel"] and abs(off) > err:
                fail(f"replica {m['replica']} shares rank 0's kernel (one clock), yet its measured offset {off} ns "
                     f"lies outside the error bound {err} ns")
    err_us = clock["max_error_ns"] / 1000.0
    if meas:
        print(f"ok: clocks: {len(meas)} other process(es) measured, offsets {[m['offset_ns'] for m in meas]} ns, "
              f"error bound {err_us:.3f} us")
    else:
        print("ok: clocks: one process, one clock (nothing to measure)")

    # aligned clocks: one collective that needs every rank's part (same seq of one communicator on
    # every process) cannot end anywhere before it started everywhere. Not a broadcast: its root
    # may finish (an eager send) before a receiver enters it.
    needs_all = ("allreduce", "allgather", "reduce_scatter", "barrier")
    if len(pnames) > 1:
        worst, calls = None, 0
        for tname in ("training", "communication"):
            by_seq = {}
            for pid in pnames:
                for tid in thread(pid, tname):
                    for e in spans.get((pid, tid), []):
                        if "seq" in e.get("args", {}) and e["name"] in needs_all:
                            by_seq.setdefault(e["args"]["seq"], {})[pid] = e
            for seq, per in by_seq.items():
                if len(per) != len(pnames):
                    continue
                names = {e["name"] for e in per.values()}
                if len(names) != 1:
                    fail(f"collective #{seq} of the {tname} threads is {names} on different processes")
                calls += 1
                last_start = max(e["ts"] for e in per.values())
                first_end = min(e["ts"] + e["dur"] for e in per.values())
                gap = last_start - first_end
                worst = gap if worst is None or gap > worst else worst
                if gap > err_us + 2 * SLACK_US:
                    fail(f"collective #{seq} ({tname} thread) ended on one process {gap:.3f} us before it started on "
                         f"another: the clocks are not aligned within the stated {err_us:.3f} us")
        if calls == 0:
            fail("no collective was traced on every process: cannot check the clock alignment")
        print(f"ok: {calls} collectives start everywhere before they end anywhere (worst {worst:.3f} us, "
              f"allowed {err_us:.3f} us)")

    if a.dropped:
        if not (isinstance(other.get("dropped"), int) and other["dropped"] > 0):
            fail(f"--dropped, but otherData.dropped is {other.get('dropped')}")
        print(f"ok: {other['dropped']} spans dropped and counted")
    elif other.get("dropped") != 0:
        fail(f"otherData.dropped is {other.get('dropped')}")
    if a.partial and not other.get("partial"):
        fail("a partial trace without otherData.partial")
    if not a.partial and "partial" in other:
        fail(f"otherData.partial: {other['partial']}")
    print("check_trace: all checks passed")


if __name__ == "__main__":
    main()
