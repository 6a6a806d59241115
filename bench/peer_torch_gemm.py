#!/usr/bin/env python3
"""PyTorch's fp32 GEMM at the shapes bench_cpu measures, for a ratio in the same run.

Run by bench/run_cpu.sh. Uses the machine's torch (Debian's python3-torch or PyPI's), tuned as a
careful user would: OPENBLAS_CORETYPE=SkylakeX on AVX-512 (Debian's torch 1.13 runs its BLAS
through OpenBLAS 0.3.21, which does not know newer Xeons) and OMP_WAIT_POLICY=PASSIVE, unless
--no-tune. Prints one line per shape: M N K tb GFLOP/s."""
import os
import sys

if "--no-tune" not in sys.argv:
    with open("/proc/cpuinfo") as f:
        if "avx512f" in f.read():
            os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import time  # noqa: E402

import torch  # noqa: E402

SHAPES = [(1024, 1024, 1024, 0), (2048, 2048, 2048, 0), (4096, 4096, 4096, 0), (256, 1024, 784, 1),
          (256, 1024, 1024, 1), (256, 784, 1024, 0), (32, 100352, 9, 0), (64, 25088, 288, 0), (64, 288, 25088, 1)]


def bench(m, n, k, tb, reps):
    a = torch.rand(m, k) - 0.5
    b = (torch.rand(n, k) - 0.5) if tb else (torch.rand(k, n) - 0.5)
    c = torch.empty(m, n)
    bb = b.t() if tb else b
    torch.mm(a, bb, out=c)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, bb, out=c)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 2.0 * m * n * k / times[len(times) // 2] / 1e9


def main():
    quick = "--quick" in sys.argv
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')}")
    for m, n, k, tb in SHAPES:
        if quick and m == 4096:
            continue
        print(m, n, k, tb, f"{bench(m, n, k, tb, 5 if m >= 2048 else 15):.1f}")


if __name__ == "__main__":
    main()
