#!/usr/bin/env python3
"""torch.profiler's per-op breakdown of one workload's training step (bench/torch_bench.py's models,
the same sizes as mirror's bench_models), to set next to MIRROR_PROFILE's (bench/run_profile.sh).

Profiles S steps after W warm-up steps, eager (torch.autocast bfloat16 with --bf16), T threads;
prints the top N aten ops by self CPU time: ms per step, calls per step, share of the profiled
self time, and the step's wall ms. Exits 1 when the profile is empty.
Usage: peer_torch_profile.py MODEL [--bf16] [--steps S] [--warmup W] [--threads T] [--top N]
"""
import argparse
import importlib.util
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("torch_bench", os.path.join(here, "torch_bench.py"))
tb = importlib.util.module_from_spec(spec)
sys.argv_saved = sys.argv
spec.loader.exec_module(tb)  # applies torch_bench's environment tuning before torch is imported
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def workload(name):
    torch.manual_seed(0)
    if name == "mlp":
        m = tb.make_mlp()
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        return m, opt, torch.randn(256, 784), torch.randint(0, 10, (256,)), F.cross_entropy
    if name == "cnn":
        m = tb.SmallCNN()
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        return m, opt, torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,)), F.cross_entropy
    if name == "gpt":
        m = tb.CharGPT()
        opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1)
        loss = lambda logits, y: F.cross_entropy(logits.reshape(-1, 65), y.reshape(-1))
        return m, opt, torch.randint(0, 65, (32, 128)), torch.randint(0, 65, (32, 128)), loss
    sys.exit(f"peer_torch_profile.py: unknown model {name!r} (mlp, cnn, gpt)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m, opt, x, y, loss_fn = workload(a.model)

    def step():
        opt.zero_grad(set_to_none=True)
        if a.bf16:
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                out = m(x)
            loss = loss_fn(out.float(), y)
        else:
            loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(a.steps):
            step()
    wall = (time.perf_counter() - t0) / a.steps * 1e3
    rows = [e for e in prof.key_averages() if e.key.startswith("aten::") and e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in rows)
    if not rows or total <= 0:
        sys.exit("peer_torch_profile.py: the profile recorded no aten op")
    rows.sort(key=lambda e: -e.self_cpu_time_total)
    print(f"# torch {torch.__version__} {a.model} {'bf16 autocast' if a.bf16 else 'f32'}, {a.threads} threads, "
          f"{a.steps} profiled steps: {wall:.2f} ms/step wall (profiler overhead included)")
    print(f"{'op':<36} {'ms/step':>9} {'calls/step':>10} {'share':>7}")
    for e in rows[: a.top]:
        print(f"{e.key:<36} {e.self_cpu_time_total / 1e3 / a.steps:9.3f} {e.count / a.steps:10.1f} "
              f"{100.0 * e.self_cpu_time_total / total:6.1f}%")


if __name__ == "__main__":
    main()
