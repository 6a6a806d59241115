#!/usr/bin/env bash
# Checkpoints with PyTorch, both ways (skipped, exit 77, unless /usr/bin/python3 has torch and
# h5py: Debian's python3-torch and python3-h5py): a PyTorch MLP's state_dict saved with h5py is
# evaluated by `mirror eval` and starts a run through checkpoint.init_from, and mirror's test-set
# loss for it equals PyTorch's own to 2e-5; a mirror checkpoint loads into the PyTorch model with
# load_state_dict(strict=True) and its CRC-32s check out (tests/checkpoint_torch_roundtrip.py).
# Usage: tests/e2e/torch_roundtrip.sh path/to/mirror
set -uo pipefail
mirror=${1:?usage: torch_roundtrip.sh path/to/mirror}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
py=/usr/bin/python3
if ! "$py" -c "import torch, h5py" 2>/dev/null || [ ! -r "$fm/t10k-images-idx3-ubyte.gz" ]; then
    echo "no torch + h5py for /usr/bin/python3 (or no Fashion-MNIST); skipped"; exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/exp.yaml" <<YAML
model: {type: mlp, sizes: [784, 64, 10]}
data:
  train: {source: idx, images: $fm/train-images-idx3-ubyte.gz, labels: $fm/train-labels-idx1-ubyte.gz, shuffle: 1000}
  eval: {source: idx, images: $fm/t10k-images-idx3-ubyte.gz, labels: $fm/t10k-labels-idx1-ubyte.gz}
optimizer: {type: adamw, lr: 1.0e-3}
train: {steps: 20, batch: 64, eval_every: 0, log_every: 10}
checkpoint: {dir: $tmp/run, resume: never}
YAML
# 1. PyTorch -> mirror
"$py" "$root/tests/checkpoint_torch_roundtrip.py" --out "$tmp/torch.h5" --sizes 784,64,10 >/dev/null
torch_loss=$("$py" - "$tmp/torch.h5" "$fm" <<'PY'
import gzip, sys, h5py, numpy as np, torch
f = h5py.File(sys.argv[1], "r")
p = {k: torch.from_numpy(np.array(f["params"][k])) for k in f["params"]}
def idx(path):
    with gzip.open(path) as g:
        b = g.read()
    nd = b[3]
    dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(b, np.uint8, offset=4 + 4 * nd).reshape(dims)
x = torch.from_numpy(idx(sys.argv[2] + "/t10k-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255)
y = torch.from_numpy(idx(sys.argv[2] + "/t10k-labels-idx1-ubyte.gz").astype(np.int64))
h = torch.relu(x @ p["fc1.weight"].T + p["fc1.bias"])
print("%.6f" % torch.nn.functional.cross_entropy(h @ p["fc2.weight"].T + p["fc2.bias"], y).item())
PY
)
out=$("$mirror" eval "$tmp/exp.yaml" --checkpoint "$tmp/torch.h5" 2>&1); rc=$?
echo "$out" | tail -1
mirror_loss=$(echo "$out" | sed -n 's/.*eval loss \([0-9.]*\).*/\1/p')
check "mirror eval of a PyTorch state_dict: loss $mirror_loss = PyTorch's $torch_loss" \
      "[ $rc -eq 0 ] && is_num '$mirror_loss' && is_num '$torch_loss' && awk -v a=$mirror_loss -v b=$torch_loss 'BEGIN { d = a - b; exit !(d < 2e-5 && d > -2e-5) }'"
out=$("$mirror" train "$tmp/exp.yaml" --set "checkpoint.init_from=$tmp/torch.h5" 2>&1); rc=$?
check "init_from a PyTorch state_dict trains" "[ $rc -eq 0 ] && echo \"\$out\" | grep -q 'initialised from'"
# 2. mirror -> PyTorch
out=$("$py" "$root/tests/checkpoint_torch_roundtrip.py" "$tmp/run/ckpt-00000020.h5" --out "$tmp/unused.h5" --sizes 784,64,10 2>&1); rc=$?
echo "$out" | tail -2
check "a mirror checkpoint loads into PyTorch (strict) with its CRC-32s checked" "[ $rc -eq 0 ] && echo \"\$out\" | grep -q 'loaded 4 tensors into MLP'"
finish
