#!/usr/bin/env python3
"""tf.data peer of bench/bench_data.c: the Fashion-MNIST training pipeline with PyPI's
tensorflow-cpu, the same work: the IDX files decoded once with gzip + numpy (timed apart),
from_tensor_slices -> map(normalize u8 -> f32 / 255, num_parallel_calls P) -> shuffle(10000,
reshuffle each epoch) -> batch(128) -> prefetch(AUTOTUNE), iterated with a consumer that does
nothing. One warm-up epoch, then the median elements/s over --runs epochs (a fresh iterator each,
as bench_data does). Prints "parallel P: X elements/s", or "tf.data unavailable: why" and exits 0
when TensorFlow cannot be imported.
Usage: peer_tfdata.py [--dir DIR] [--runs R] [--parallel 1,2]"""
import argparse
import os
import statistics
import sys
import time
from peer_idx import read_idx  # noqa: E402  (bench/peer_idx.py)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--parallel", default="1,2")
    a = ap.parse_args()
    try:
        import tensorflow as tf
    except Exception as e:  # noqa: BLE001 - any import failure means the peer cannot run
        print(f"tf.data unavailable: {type(e).__name__}: {e}")
        print("HINT: pip install tensorflow-cpu")
        return 0
    t0 = time.perf_counter()
    images = read_idx(os.path.join(a.dir, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(a.dir, "train-labels-idx1-ubyte.gz")).astype("int32")
    print(f"decode (gzip + numpy, once): {time.perf_counter() - t0:.3f} s")
    print(f"tensorflow {tf.__version__}")

    def normalize(x, y):
        return tf.cast(x, tf.float32) * (1.0 / 255.0), y

    for p in [int(v) for v in a.parallel.split(",")]:
        ds = (tf.data.Dataset.from_tensor_slices((images, labels))
              .map(normalize, num_parallel_calls=p)
              .shuffle(10000, seed=42, reshuffle_each_iteration=True)
              .batch(128)
              .prefetch(tf.data.AUTOTUNE))

        def epoch():
            n = 0
            t = time.perf_counter()
            for x, _ in ds:
                n += int(x.shape[0])
            return n, time.perf_counter() - t

        epoch()  # warm-up (tracing, thread pools)
        rates = []
        for _ in range(a.runs):
            n, dt = epoch()
            rates.append(n / dt)
        print(f"parallel {p}: {statistics.median(rates):.0f} elements/s (median of {a.runs} epochs of {n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
