#!/usr/bin/env python3
"""tf.data peer of bench/bench_data_sources.c: the Fashion-MNIST training pipeline from each file
format, reading the same copies in DIR (bench/run_data.sh writes them with tests/tools/data_copy),
the way tf.data's guide reads each:
  idx               the IDX files read with numpy, from_tensor_slices (in memory, as mirror's)
  hdf5              h5py (the dataset read by index batches, as tf.data has no HDF5 reader):
                    range(N) -> shuffle -> batch -> map(numpy_function gathering the rows)
  npy               np.load(mmap_mode="r") -> from_tensor_slices
  tfrecord          TFRecordDataset -> shuffle -> batch -> map(parse_example + decode_raw)
  tfrecord_sharded  the same over the 8 files sh-*.tfrecord (list_files, sorted, interleaved 1)
then map(normalize u8 -> f32 / 255, AUTOTUNE) -> shuffle(10000) -> batch(128) -> prefetch(AUTOTUNE)
(the record formats shuffle before batch and decode after it, tf.data's fast path). One warm-up
epoch, then the median elements/s over --runs epochs. Prints "source NAME: X elements/s", or
"tf.data unavailable: why" and exits 0 when TensorFlow cannot be imported.
Usage: peer_tfdata_sources.py --dir DIR [--runs R] [--sources idx,hdf5,npy,tfrecord,tfrecord_sharded]"""
import argparse
import glob
import os
import statistics
import sys
import time
from peer_idx import read_idx  # noqa: E402  (bench/peer_idx.py)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build(tf, name, d):
    import numpy as np

    AUTO = tf.data.AUTOTUNE

    def norm(x, y):
        return tf.cast(x, tf.float32) * (1.0 / 255.0), tf.cast(y, tf.int32)

    if name in ("idx", "npy"):
        if name == "idx":
            x, y = read_idx(os.path.join(d, "tr.images.idx")), read_idx(os.path.join(d, "tr.labels.idx"))
        else:
            x, y = np.load(os.path.join(d, "tr.x.npy"), mmap_mode="r"), np.load(os.path.join(d, "tr.y.npy"), mmap_mode="r")
        return (tf.data.Dataset.from_tensor_slices((x, y)).map(norm, num_parallel_calls=AUTO)
                .shuffle(10000, seed=42, reshuffle_each_iteration=True).batch(128).prefetch(AUTO))
    if name == "hdf5":
        import h5py

        f = h5py.File(os.path.join(d, "tr.h5"), "r")
        hx, hy = f["x"], f["y"]
        n = hx.shape[0]

        def gather(idx):
            order = np.argsort(idx)
            inv = np.empty_like(order)
            inv[order] = np.arange(len(order))
            s = idx[order]
            return hx[s][inv], hy[s][inv].astype(np.int32)

        def load(idx):
            x, y = tf.numpy_function(gather, [idx], (tf.uint8, tf.int32))
            x.set_shape([None, 28, 28])
            y.set_shape([None])
            return tf.cast(x, tf.float32) * (1.0 / 255.0), y

        return (tf.data.Dataset.range(n).shuffle(10000, seed=42, reshuffle_each_iteration=True).batch(128)
                .map(load, num_parallel_calls=AUTO).prefetch(AUTO))
    files = [os.path.join(d, "tr.tfrecord")] if name == "tfrecord" else sorted(glob.glob(os.path.join(d, "sh-*.tfrecord")))
    spec = {"image/encoded_raw": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(rec):
        e = tf.io.parse_example(rec, spec)
        x = tf.reshape(tf.io.decode_raw(e["image/encoded_raw"], tf.uint8), [-1, 28, 28])
        return tf.cast(x, tf.float32) * (1.0 / 255.0), tf.cast(e["label"], tf.int32)

    return (tf.data.TFRecordDataset(files, num_parallel_reads=None).shuffle(10000, seed=42, reshuffle_each_iteration=True)
            .batch(128).map(parse, num_parallel_calls=AUTO).prefetch(AUTO))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sources", default="idx,hdf5,npy,tfrecord,tfrecord_sharded")
    a = ap.parse_args()
    try:
        import tensorflow as tf
    except Exception as e:  # noqa: BLE001 - any import failure means the peer cannot run
        print(f"tf.data unavailable: {type(e).__name__}: {e}")
        print("HINT: pip install tensorflow-cpu h5py")
        return 0
    print(f"tensorflow {tf.__version__}")
    for name in a.sources.split(","):
        try:
            t0 = time.perf_counter()
            ds = build(tf, name, a.dir)
            open_s = time.perf_counter() - t0
        except ImportError as e:
            print(f"source {name}: unavailable ({e})")
            continue

        def epoch():
            n = 0
            t = time.perf_counter()
            for x, _ in ds:
                n += int(x.shape[0])
            return n, time.perf_counter() - t

        epoch()  # warm-up (tracing, thread pools, page cache)
        rates = []
        for _ in range(a.runs):
            n, dt = epoch()
            rates.append(n / dt)
        print(f"source {name}: {statistics.median(rates):.0f} elements/s (median of {a.runs} epochs of {n}; "
              f"open {open_s:.3f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
