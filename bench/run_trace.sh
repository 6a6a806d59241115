#!/usr/bin/env bash
# What log.trace costs a training step (README "Tracing steps"): configs/cnn.yaml for 60 steps,
# metrics.jsonl's samples_per_s over steps 21..60 turned into ms per step, for
#   none        no log.trace
#   outside     log.trace=[61, 61] in a 61-step run: tracks wired up, steps 21..60 outside the window
#   window      log.trace=[21, 60]: every measured step traced
#   window+ops  the same with log.trace_ops: true (a span per kernel)
# each mode run `reps` times, interleaved (a shared machine's load spreads over all); the fastest
# run (load only ever adds time) and the median are shown, and the fastest against none's. A
# step's cost is also computed: the spans per step and replica counted in trace.json times
# bench_trace's cost of a recorded span (next to mirror: build/bench/bench_trace). Prints the CPU.
# Usage: bench/run_trace.sh path/to/mirror [reps] [devices]
# (devices: e.g. '[cpu:0, cpu:1]' for two local replicas; default one replica).
set -euo pipefail
mirror=${1:?usage: run_trace.sh path/to/mirror [reps] [devices]}
reps=${2:-3}
devices=${3:-}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command -v python3 >/dev/null || { echo "run_trace.sh: python3 is needed to read metrics.jsonl; HINT: apt-get install python3"; exit 1; }
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    { echo "run_trace.sh: no Fashion-MNIST (apt-get install dataset-fashion-mnist); not measured"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(getconf _NPROCESSORS_ONLN) cores; OMP_NUM_THREADS=${OMP_NUM_THREADS:-all}"
common=(--set train.steps=60 --set train.log_every=20 --set train.eval_every=0 --set checkpoint.resume=never
        --set checkpoint.every=0 --set log.progress=false --set schedule.warmup=0)
if [ -n "$devices" ]; then common+=(--set "distribute.devices=$devices"); fi
modes=(none outside window window+ops)
for r in $(seq 1 "$reps"); do
    for m in "${modes[@]}"; do
        extra=()
        case $m in
        outside) extra=(--set train.steps=61 --set 'log.trace=[61, 61]') ;;
        window) extra=(--set 'log.trace=[21, 60]') ;;
        window+ops) extra=(--set 'log.trace=[21, 60]' --set log.trace_ops=true) ;;
        esac
        dir="$tmp/$m-$r"
        "$mirror" train "$root/configs/cnn.yaml" "${common[@]}" "${extra[@]}" --set "checkpoint.dir=$dir" >"$dir.log" 2>&1 ||
            { tail -5 "$dir.log"; exit 1; }
        cp "$dir/metrics.jsonl" "$tmp/$m.$r.jsonl"
        case $m in window*) cp "$dir/trace.json" "$tmp/$m.trace.json" ;; esac
    done
done
bench=$(dirname "$mirror")/bench/bench_trace
span_ns=$("$bench" 1 | awk -F'|' '/inside window/ {print $3 + 0}')
[ -n "$span_ns" ] || { echo "run_trace.sh: $bench gave no cost per span"; exit 1; }
echo "a recorded span: $span_ns ns ($bench)"
python3 - "$tmp" "$reps" "$span_ns" "${modes[@]}" <<'PY'
import json, statistics, sys
tmp, reps, span_ns, modes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
def ms_per_step(path):
    rows = [json.loads(l) for l in open(path) if '"samples_per_s"' in l]
    rows = [r for r in rows if 20 < r["step"] <= 60]
    if len(rows) != 2:
        sys.exit(f"run_trace.sh: {path}: expected the intervals ending at steps 40 and 60, got {[r['step'] for r in rows]}")
    sps = statistics.mean(r["samples_per_s"] for r in rows)
    return 1e3 * 128 / sps
def spans_per_step(m):
    try:
        d = json.load(open(f"{tmp}/{m}.trace.json"))
    except OSError:
        return None
    o = d["otherData"]
    n = sum(1 for e in d["traceEvents"] if e["ph"] != "M")
    return n / len(o["parts"]) / (o["steps"][1] - o["steps"][0] + 1)
res = {m: sorted(ms_per_step(f"{tmp}/{m}.{r}.jsonl") for r in range(1, reps + 1)) for m in modes}
base = res["none"][0]
print(f"| mode | ms per step, steps 21..60: fastest of {reps} | median | fastest vs none | events per step and replica | computed cost per step |")
print("|---|---|---|---|---|---|")
for m in modes:
    sp = spans_per_step(m)
    cost = f"{sp * span_ns / 1e3:.1f} us ({sp * span_ns / 1e4 / base:.4f}%)" if sp else "-"
    print(f"| {m} | {res[m][0]:.2f} | {statistics.median(res[m]):.2f} | {100 * (res[m][0] / base - 1):+.1f}% | "
          f"{f'{sp:.0f}' if sp else '-'} | {cost} |")
PY
