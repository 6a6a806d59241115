#!/usr/bin/env bash
# Data-parallel GPU training through the trainer, as a user runs it: `mirror train` of a GPT on
# 1, 2, 4, 8 GPUs of this node (distribute.devices: one replica per GPU, one host thread each,
# gradients over NCCL), the batch per GPU fixed (weak scaling), synthetic tokens (uniform over the
# vocabulary, written here: no data to download). Per row: tokens/s, tokens/s per GPU, scaling
# efficiency (tokens/s over GPUs x the 1-GPU tokens/s), ms per step, and the exposed
# communication: ms per step on k GPUs minus ms per step on 1 (what the exchange adds that the
# backward did not hide; it includes any slowdown from the GPUs sharing host and PCIe/NVLink).
# Timing: metrics.jsonl's samples_per_s of the second log interval (steps/2+1 .. steps), so the
# compilation, the first CUDA graph capture and the allocator's warm-up are not counted.
#
# Usage: bench/run_gpu_dp.sh [--mirror BIN] [--model gpt2|small|tiny] [--steps N] [--gpus "1 2 4 8"]
#                            [--precision mixed_bfloat16|mixed_float16|float32] [--batch B]
#   --mirror  the CLI to run (default build-gpu/mirror, else build/mirror); build/mirror-emu runs on
#             the CUDA emulator (MR_EMU_DEVICES GPUs, default 2; tests/e2e/gpu_dp.sh does, with tiny)
#   --model   gpt2: GPT-2 124M's shape (vocab 50304, context 1024, 12 x 768, batch 8 per GPU);
#             small: vocab 4096, context 256, 4 x 256 (batch 16); tiny: the emulator's (vocab 64,
#             context 16, 2 x 32, batch 4)
#   --gpus    the GPU counts to run (default: 1 and every power of two up to the GPUs present)
# One GPU: only the 1-GPU row (NCCL refuses two ranks on one GPU, "Duplicate GPU detected", so
# data parallelism cannot be exercised there; the script says so). Every run must succeed and
# log its step: a failed run, a missing metrics line or a missing GPU count is an error (exit 1).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mirror=""
model=gpt2
steps=""
gpus=""
precision=mixed_bfloat16
batch=""
while [ $# -gt 0 ]; do
    case "$1" in
    --mirror) mirror=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --gpus) gpus=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    *) echo "run_gpu_dp.sh: unknown flag $1" >&2
       echo "HINT: --mirror BIN --model gpt2|small|tiny --steps N --gpus \"1 2 4\" --precision P --batch B" >&2; exit 2 ;;
    esac
done
if [ -z "$mirror" ]; then
    for m in "$root/build-gpu/mirror" "$root/build/mirror"; do [ -x "$m" ] && { mirror=$m; break; }; done
fi
[ -n "$mirror" ] && [ -x "$mirror" ] || { echo "run_gpu_dp.sh: no mirror binary (build-gpu/mirror, build/mirror); HINT: build first or pass --mirror" >&2; exit 1; }
case "$model" in
gpt2) vocab=50304; ctx=1024; layers=12; heads=12; embd=768; : "${batch:=8}"; : "${steps:=40}" ;;
small) vocab=4096; ctx=256; layers=4; heads=4; embd=256; : "${batch:=16}"; : "${steps:=40}" ;;
tiny) vocab=64; ctx=16; layers=2; heads=2; embd=32; : "${batch:=4}"; : "${steps:=6}" ;;
*) echo "run_gpu_dp.sh: unknown --model $model; HINT: gpt2, small or tiny" >&2; exit 2 ;;
esac
[ "$steps" -ge 2 ] && [ $((steps % 2)) -eq 0 ] || { echo "run_gpu_dp.sh: --steps must be even and >= 2, got $steps" >&2; exit 2; }
# how many GPUs the CLI sees: `mirror doctor` lists them ("gpu K: ...")
ngpu=$("$mirror" doctor 2>/dev/null | grep -c '^gpu [0-9]*:' || true)
if [ "${ngpu:-0}" -lt 1 ]; then
    echo "SKIPPED: $mirror sees no GPU (mirror doctor lists none)"
    exit 77
fi
if [ -z "$gpus" ]; then
    gpus=1
    for k in 2 4 8; do [ "$k" -le "$ngpu" ] && gpus="$gpus $k"; done
fi
for k in $gpus; do
    [ "$k" -le "$ngpu" ] || { echo "run_gpu_dp.sh: --gpus asks for $k GPUs, $mirror sees $ngpu" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "run_gpu_dp.sh: python3 writes the token file; HINT: apt-get install python3" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# enough tokens for every GPU count's batches without an epoch boundary mattering
ntok=$(( (steps + 2) * batch * ctx * 8 + ctx + 1 ))
python3 - "$tmp/tokens.bin" "$ntok" "$vocab" <<'PY'
import array, random, sys
path, n, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1)
array.array("H", (rng.randrange(vocab) for _ in range(n))).tofile(open(path, "wb"))
PY
half=$((steps / 2))
echo "model $model (vocab $vocab, context $ctx, $layers layers x $embd, $heads heads), $precision, batch $batch per GPU,"
echo "$steps steps (timed: steps $((half + 1))-$steps), $mirror, $ngpu GPU(s) visible"
[ "$ngpu" -ge 2 ] || echo "one GPU: the data-parallel rows need 2 or more (NCCL refuses two ranks on one GPU)"
echo
echo "| GPUs | global batch | tokens/s | tokens/s per GPU | scaling efficiency | ms/step | exposed comm ms/step |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
tok1=""
ms1=""
for k in $gpus; do
    devs=""
    for ((g = 0; g < k; g++)); do devs="$devs${devs:+, }cuda:$g"; done
    dir="$tmp/run-$k"
    cat >"$tmp/gpt-$k.yaml" <<YAML
seed: 1
model: {type: gpt, vocab: $vocab, context: $ctx, layers: $layers, heads: $heads, embd: $embd, dropout: 0.0}
data:
  train: {source: tokens, path: $tmp/tokens.bin, token_bytes: 2, context: $ctx, shuffle: 1000}
optimizer: {type: adamw, lr: 3.0e-4, weight_decay: 0.1, grad_clip: 1.0}
precision: {policy: $precision}
train: {steps: $steps, batch: $((batch * k)), eval_every: 0, log_every: $half}
checkpoint: {dir: $dir, every: 0, resume: never}
distribute: {devices: [$devs]}
log: {progress: false}
YAML
    if ! "$mirror" train "$tmp/gpt-$k.yaml" >"$tmp/log-$k" 2>&1; then
        echo "run_gpu_dp.sh: the $k-GPU run failed; its output:" >&2
        tail -20 "$tmp/log-$k" >&2
        exit 1
    fi
    line=$(grep "\"step\": $steps," "$dir/metrics.jsonl" 2>/dev/null | grep '"samples_per_s"' | tail -1 || true)
    [ -n "$line" ] || { echo "run_gpu_dp.sh: no metrics line for step $steps in $dir/metrics.jsonl ($k GPUs)" >&2; exit 1; }
    sps=$(echo "$line" | sed 's/.*"samples_per_s": \([0-9.e+-]*\).*/\1/')
    read -r tok ms < <(awk -v s="$sps" -v c="$ctx" -v b="$((batch * k))" 'BEGIN { if (s <= 0) exit 1; printf "%.1f %.3f\n", s * c, 1e3 * b / s }') ||
        { echo "run_gpu_dp.sh: bad samples_per_s '$sps' ($k GPUs)" >&2; exit 1; }
    if [ "$k" = 1 ]; then tok1=$tok; ms1=$ms; fi
    awk -v k="$k" -v gb="$((batch * k))" -v tok="$tok" -v ms="$ms" -v tok1="$tok1" -v ms1="$ms1" 'BEGIN {
        eff = tok1 == "" ? "-" : sprintf("%.1f%%", 100 * tok / (k * tok1))
        xc = (ms1 == "" || k == 1) ? "-" : sprintf("%.2f", ms - ms1)
        printf "| %d | %d | %.0f | %.0f | %s | %.2f | %s |\n", k, gb, tok, tok / k, eff, ms, xc }'
done
