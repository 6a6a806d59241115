#!/usr/bin/env python3
"""PyTorch <-> mirror checkpoints, both ways (not run by CTest; needs python3 with torch and h5py).

    python3 tests/checkpoint_torch_roundtrip.py [MIRROR_CKPT] [--out torch_init.h5] [--sizes 784,256,256,10]

1. Saves the state_dict of a PyTorch MLP (sizes --sizes, parameters named fc1.weight, fc1.bias, ...
   as mirror's `model: {type: mlp}` names them, weights (out, in) as in both) with h5py under
   /params/<name> as f32, to --out. Such a file has no "format" attribute and no crc32s: mirror reads
   it as an `init_from` file (checkpoint/ckpt.h, MR_CKPT_FOREIGN).
2. Given a mirror checkpoint (e.g. runs/mlp/ckpt-00003000.h5), prints its root attribute names, format,
   format_version and step, checks each dataset's crc32 attribute against zlib.crc32 of its
   little-endian bytes, and loads /params into a torch state_dict: into an MLP with load_state_dict
   (strict) when the names are fc1..fcN, else as a plain dict of tensors. Exits 1 on a bad crc32.
"""
import argparse
import re
import sys
import zlib

import h5py
import numpy as np
import torch


class MLP(torch.nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.n = len(sizes) - 1
        for i in range(1, len(sizes)):
            setattr(self, f"fc{i}", torch.nn.Linear(sizes[i - 1], sizes[i]))

    def forward(self, x):
        for i in range(1, self.n + 1):
            x = getattr(self, f"fc{i}")(x)
            x = torch.relu(x) if i < self.n else x
        return x


def save_state_dict(sd, path):
    with h5py.File(path, "w") as f:
        for name, t in sd.items():
            f.create_dataset(f"params/{name}", data=t.detach().cpu().to(torch.float32).numpy())


def load_params(path):
    """/params of a checkpoint as {name: tensor}; exits 1 when a crc32 does not match."""
    sd, bad = {}, []
    with h5py.File(path, "r") as f:
        names = sorted(f.attrs.keys())
        print(f"{path}: attributes {names}")
        print(f"format {f.attrs.get('format')!r}, format_version {f.attrs.get('format_version')}, "
              f"step {f.attrs.get('step')}")

        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            a = obj[()]
            if "crc32" in obj.attrs:
                raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
                if zlib.crc32(raw) != int(obj.attrs["crc32"]):
                    bad.append(name)
            if name.startswith("params/"):
                sd[name[len("params/"):]] = torch.from_numpy(np.asarray(a, dtype=np.float32))

        f.visititems(visit)
    if bad:
        sys.exit(f"{path}: crc32 mismatch in {bad}")
    return sd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt", nargs="?", help="a mirror checkpoint to load")
    ap.add_argument("--out", default="torch_init.h5", help="where to save the torch state_dict")
    ap.add_argument("--sizes", default="784,256,256,10", help="MLP layer sizes")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = MLP([int(s) for s in args.sizes.split(",")])
    save_state_dict(model.state_dict(), args.out)
    print(f"saved {len(model.state_dict())} tensors to {args.out} (/params/<name>, f32)")
    if not args.ckpt:
        return
    sd = load_params(args.ckpt)
    ws = sorted((int(m[1]), v) for k, v in sd.items() if (m := re.fullmatch(r"fc(\d+)\.weight", k)))
    if ws and len(ws) * 2 == len(sd) and [i for i, _ in ws] == list(range(1, len(ws) + 1)):
        sizes = [ws[0][1].shape[1]] + [w.shape[0] for _, w in ws]
        m = MLP(sizes)
        m.load_state_dict(sd, strict=True)
        out = m(torch.zeros(1, sizes[0]))
        print(f"loaded {len(sd)} tensors into MLP{sizes}; logits for a zero input: {out[0, :4].tolist()} ...")
    else:
        print(f"loaded {len(sd)} tensors into a state_dict: " +
              ", ".join(f"{k} {tuple(v.shape)}" for k, v in sorted(sd.items())))


if __name__ == "__main__":
    main()
