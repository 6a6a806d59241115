#!/usr/bin/env python3
"""PyTorch peer of bench/bench_train.c: the FULL training step, input pipeline included, with the
interpreter bench/peers.sh gives (PyPI's torch 2.x in a venv; Debian's 1.13 as a fallback).

The models, batches and optimizers are torch_bench.py's (bench/torch_bench.py, imported
from its path, so there is one definition of each model); only the input differs: real files
through torch.utils.data instead of one fixed random batch.
  mlp, cnn : Fashion-MNIST IDX (.gz), read once with gzip + numpy; a Dataset whose __getitem__
             returns (u8 image / 255 as float32, shaped (784) or (1,28,28), label);
             DataLoader(batch, shuffle=True, drop_last=True)
  gpt      : a text file (default runs/data/kjv.txt) read as UTF-8 characters -> ids (the rank of
             each code point among the distinct ones, as mirror's MR_DATA_TEXT_CHARS), windows
             i = ids[i*T : i*T+T+1] (x the first T, y the last T, as mirror's text source),
             DataLoader(32, shuffle=True, drop_last=True); the vocabulary comes from the text
The DataLoader runs with num_workers=0 (batches made in the training thread) and num_workers=1
(one worker process, persistent, prefetching); the faster is reported as the result and both
are in the JSON ("by_workers"). Each DataLoader cycles through epochs for as long as needed.
Methodology (as bench_train.c, which drops its first log interval): S warm-up steps, then R runs
of S steps; the median samples/s over runs (tokens/s = samples/s * 128 for gpt). The time a step
spends in next(loader) is reported as data_wait.
--bf16 wraps the forward in torch.autocast("cpu", dtype=torch.bfloat16) as torch_bench does.
--compile runs the model through torch.compile (inductor, the default mode): the first warm-up step
compiles, its time is reported apart as compile_s and excluded from the rates, as are the other
warm-up steps.

Usage: python3 peer_torch_train.py [--models mlp,cnn,gpt] [--bf16] [--compile] [--steps 30] [--runs 3]
           [--threads 2] [--workers 0,1] [--text PATH] [--data DIR] [--torch-bench PATH]
           [--json OUT] [--no-tune]
Environment tuning: as torch_bench.py (set before torch is imported; an explicit setting wins):
OPENBLAS_CORETYPE=SkylakeX, OMP_WAIT_POLICY=PASSIVE. Prints "torch unavailable: why" and exits 0
when torch cannot be imported.
"""
import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from peer_idx import read_idx  # noqa: E402  (bench/peer_idx.py)

TUNED_ENV = {"OPENBLAS_CORETYPE": "SkylakeX", "OMP_WAIT_POLICY": "PASSIVE"}
if "--no-tune" not in sys.argv:
    for _k, _v in TUNED_ENV.items():
        os.environ.setdefault(_k, _v)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import numpy as np  # noqa: E402
    import torch  # noqa: E402  (must come after the environment setup above)
    import torch.nn.functional as F  # noqa: E402
    from torch.utils.data import DataLoader, Dataset  # noqa: E402
except Exception as e:  # noqa: BLE001 - any import failure means the peer cannot run
    print(f"torch unavailable: {type(e).__name__}: {e}")
    print("HINT: run with the interpreter bench/peers.sh prints (PyPI torch in a venv)")
    sys.exit(0)


def load_torch_bench(path):
    """torch_bench.py as a module (its main() is guarded, its env block uses setdefault)."""
    for p in [path] if path else [os.path.join(ROOT, "bench", "torch_bench.py")]:
        if p and os.path.isfile(p):
            spec = importlib.util.spec_from_file_location("torch_bench", p)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod, os.path.realpath(p)
    sys.exit("peer_torch_train: torch_bench.py not found\nHINT: --torch-bench PATH (bench/torch_bench.py)")


# ----------------------------------------------------------------------------- data


class ImageSet(Dataset):
    """Fashion-MNIST: (image u8 -> float32 / 255 in `shape`, label)."""

    def __init__(self, images, labels, shape):
        self.x, self.y, self.shape = images, labels.astype(np.int64), shape

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i].astype(np.float32) * np.float32(1.0 / 255.0)
        return torch.from_numpy(x.reshape(self.shape)), int(self.y[i])


class TextWindows(Dataset):
    """Non-overlapping windows of context + 1 character ids: (x = ids[i*T:i*T+T], y = shifted by 1)."""

    def __init__(self, ids, context):
        self.ids, self.t = ids, context
        self.n = (len(ids) - 1) // context

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        s = i * self.t
        w = torch.from_numpy(self.ids[s:s + self.t + 1])
        return w[:-1], w[1:]


def read_text_ids(path):
    """The file as UTF-8 code points -> rank among the distinct code points (int64), and the vocab size."""
    with open(path, "rb") as f:
        cps = np.frombuffer(f.read().decode("utf-8").encode("utf-32-le"), dtype=np.uint32)
    vocab = np.unique(cps)
    return np.searchsorted(vocab, cps).astype(np.int64), len(vocab)


def forever(loader):
    while True:
        for b in loader:
            yield b


# ----------------------------------------------------------------------------- harness
def bench(model, opt, dataset, loss_fn, batch, workers, args, bf16):
    kw = {"persistent_workers": True, "prefetch_factor": 2} if workers > 0 else {}
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers, **kw)
    it = forever(loader)
    wait = [0.0]

    def step():
        t0 = time.perf_counter()
        x, y = next(it)
        wait[0] += time.perf_counter() - t0
        opt.zero_grad(set_to_none=True)
        if bf16:
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                out = model(x)
            loss = loss_fn(out.float(), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    loss = step()  # with --compile: the compilation (forward and backward graphs)
    float(loss)
    first_s = time.perf_counter() - t0
    for _ in range(args.steps - 1):  # warm-up: S steps in all, as bench_train's first log interval
        loss = step()
    rates, times = [], []
    wait[0] = 0.0
    for _ in range(args.runs):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        float(loss)  # sync point
        dt = time.perf_counter() - t0
        rates.append(args.steps * batch / dt)
        times.append(dt / args.steps)
    return {
        "samples_per_s_median": round(statistics.median(rates), 1),
        "samples_per_s_runs": [round(r, 1) for r in rates],
        "ms_per_step_median": round(1e3 * statistics.median(times), 3),
        "data_wait_ms": round(1e3 * wait[0] / (args.runs * args.steps), 3),
        "final_loss": round(float(loss), 4),
        "first_step_s": round(first_s, 3),
    }


def run(name, tb, args, bf16):
    if name in ("mlp", "cnn"):
        images = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
        ds = ImageSet(images, labels, (784,) if name == "mlp" else (1, 28, 28))
        batch, loss_fn, extra = (256 if name == "mlp" else 128), F.cross_entropy, {}
    else:
        if not os.path.isfile(args.text):
            print(f"gpt  skipped: no text file {args.text}\nHINT: launch/prepare_kjv.sh writes runs/data/kjv.txt")
            return None
        ids, vocab = read_text_ids(args.text)
        ds = TextWindows(ids, 128)
        batch, extra = 32, {"vocab": vocab}
        loss_fn = lambda logits, y: F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))  # noqa: E731

    def fresh():
        torch.manual_seed(0)
        if name == "mlp":
            m = tb.make_mlp()
            return m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        if name == "cnn":
            m = tb.SmallCNN()
            return m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        m = tb.CharGPT(vocab=extra["vocab"])
        return m, torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1)

    by = {}
    for w in args.workers:
        model, opt = fresh()
        if args.compile:
            model = torch.compile(model)
        by[w] = bench(model, opt, ds, loss_fn, batch, w, args, bf16)
    best = max(by, key=lambda w: by[w]["samples_per_s_median"])
    res = {"model": name, "precision": "bf16" if bf16 else "f32", "batch": batch, "num_workers": best,
           "mode": "torch.compile" if args.compile else "eager"}
    res.update(by[best])
    res["by_workers"] = {str(w): by[w]["samples_per_s_median"] for w in by}
    res.update(extra)
    others = "  ".join(f"workers {w}: {by[w]['samples_per_s_median']:.1f}" for w in by if w != best)
    print(f"{name:<4} batch {batch:4d}  {res['samples_per_s_median']:10.1f} samples/s  "
          f"{res['ms_per_step_median']:8.2f} ms/step  runs={res['samples_per_s_runs']}  loss {res['final_loss']}  "
          f"num_workers {best} (best; {others})  data_wait {res['data_wait_ms']:.2f} ms/step  "
          f"{res['mode']}" + (f"  compile_s {res['first_step_s']:.1f}" if args.compile else ""), flush=True)
    if name == "gpt":
        res["tokens_per_s_median"] = round(res["samples_per_s_median"] * 128, 1)
        print(f"{'':<4} = {res['tokens_per_s_median']:.0f} tokens/s (vocab {extra['vocab']})", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,cnn,gpt")
    ap.add_argument("--bf16", action="store_true", help="forward under torch.autocast(cpu, bfloat16)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (inductor, default mode)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", default="0,1", help="DataLoader num_workers values to try (the fastest is reported)")
    ap.add_argument("--text", default=os.path.join(ROOT, "runs", "data", "kjv.txt"))
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--torch-bench", default=None, help="path of torch_bench.py (default bench/torch_bench.py)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-tune", action="store_true", help="do not set OPENBLAS_CORETYPE / OMP_WAIT_POLICY defaults")
    args = ap.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    tb, tb_path = load_torch_bench(args.torch_bench)

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    info = {
        "framework": "torch", "torch": torch.__version__, "mode": "torch.compile" if args.compile else "eager", "threads": torch.get_num_threads(),
        "precision": "bf16" if args.bf16 else "f32", "torch_bench": tb_path,
        "tuned_env_applied": not args.no_tune,
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")},
        "python": platform.python_version(), "steps": args.steps, "warmup": args.steps, "runs": args.runs,
        "workers_tried": args.workers,
    }
    print("# " + json.dumps(info), flush=True)
    results = []
    for name in args.models.split(","):
        try:
            r = run(name, tb, args, args.bf16)
        except Exception as e:  # noqa: BLE001 - e.g. an op without a bf16 kernel in this torch
            print(f"{name:<4} failed: {e!r}", flush=True)
            r = {"model": name, "precision": info["precision"], "error": repr(e)}
        if r is not None:
            results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
