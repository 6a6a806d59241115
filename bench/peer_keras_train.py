#!/usr/bin/env python3
"""TensorFlow/Keras peer of bench/bench_train.c (the framework MirroredStrategy comes from): Keras
`fit` of the same MLP and CNN as bench/torch_bench.py (784-1024-1024-10 with ReLU at batch 256;
conv 3x3x32 + ReLU + maxpool, conv 3x3x64 + ReLU + maxpool, dense 128 + ReLU, dense 10 at batch
128; SGD lr 0.01 momentum 0.9, cross-entropy over logits), fed by a tf.data pipeline over the same
Fashion-MNIST IDX files: from_tensor_slices(u8 images, labels) -> shuffle(60000) -> map(x / 255,
AUTOTUNE) -> batch(drop_remainder) -> repeat -> prefetch(AUTOTUNE). Images are NHWC (TensorFlow's
CPU convolutions take channels-last). The GPT is not written for Keras (printed as skipped).
--bf16 sets keras.mixed_precision's "mixed_bfloat16" policy (the output layer stays float32).
Keras compiles the step on the first call (tf.function, and XLA where fit's jit_compile="auto"
picks it): the first epoch of S steps is the warm-up and its time is reported as first_epoch_s;
then R epochs of S steps are timed by a callback and the median samples/s is the result.
Prints lines in bench/peer_torch_train.py's format so bench/run_train.sh reads both.

Usage: python3 peer_keras_train.py [--models mlp,cnn] [--bf16] [--steps 30] [--runs 3] [--threads 2]
           [--data DIR] [--json OUT]
Prints "tensorflow unavailable: why" and exits 0 when TensorFlow cannot be imported.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from peer_idx import read_idx  # noqa: E402  (bench/peer_idx.py)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
try:
    import numpy as np  # noqa: E402
    import tensorflow as tf  # noqa: E402
    import keras  # noqa: E402
except Exception as e:  # noqa: BLE001 - any import failure means the peer cannot run
    print(f"tensorflow unavailable: {type(e).__name__}: {e}")
    print("HINT: run with the interpreter bench/peers.sh prints (tensorflow-cpu from PyPI in a venv)")
    sys.exit(0)


def make_model(name):
    L = keras.layers
    if name == "mlp":
        inp = keras.Input((784,))
        x = L.Dense(1024, activation="relu")(inp)
        x = L.Dense(1024, activation="relu")(x)
    else:
        inp = keras.Input((28, 28, 1))
        x = L.MaxPooling2D(2)(L.Conv2D(32, 3, padding="same", activation="relu")(inp))
        x = L.MaxPooling2D(2)(L.Conv2D(64, 3, padding="same", activation="relu")(x))
        x = L.Dense(128, activation="relu")(L.Flatten()(x))
    out = L.Dense(10, dtype="float32")(x)  # logits in float32 under mixed precision
    return keras.Model(inp, out)


class EpochTimes(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.times, self.losses = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self.t0)
        self.losses.append(float((logs or {}).get("loss", float("nan"))))


def run(name, args):
    if name == "gpt":
        print("gpt  skipped: no Keras GPT is written (bench/peer_keras_train.py)")
        return None
    images = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz")).astype(np.int64)
    shape = (784,) if name == "mlp" else (28, 28, 1)
    batch = 256 if name == "mlp" else 128
    ds = tf.data.Dataset.from_tensor_slices((images.reshape((-1,) + shape), labels))
    ds = ds.shuffle(len(labels), seed=0, reshuffle_each_iteration=True)
    ds = ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE)
    keras.utils.set_random_seed(0)
    model = make_model(name)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = EpochTimes()
    model.fit(ds, steps_per_epoch=args.steps, epochs=1 + args.runs, callbacks=[cb], verbose=0, shuffle=False)
    timed = cb.times[1:]
    rates = [args.steps * batch / t for t in timed]
    res = {"model": name, "precision": "bf16" if args.bf16 else "f32", "batch": batch,
           "samples_per_s_median": round(statistics.median(rates), 1),
           "samples_per_s_runs": [round(r, 1) for r in rates],
           "ms_per_step_median": round(1e3 * statistics.median(timed) / args.steps, 3),
           "first_epoch_s": round(cb.times[0], 3), "final_loss": round(cb.losses[-1], 4)}
    print(f"{name:<4} batch {batch:4d}  {res['samples_per_s_median']:10.1f} samples/s  "
          f"{res['ms_per_step_median']:8.2f} ms/step  runs={res['samples_per_s_runs']}  loss {res['final_loss']}  "
          f"keras fit, tf.data  first_epoch_s {res['first_epoch_s']:.1f}", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--bf16", action="store_true", help="keras.mixed_precision policy mixed_bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--text", default=None, help="accepted for bench/run_train.sh's sake; unused")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if args.bf16:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    info = {"framework": "keras", "tensorflow": tf.__version__, "keras": keras.__version__,
            "threads": args.threads, "precision": "bf16" if args.bf16 else "f32",
            "python": platform.python_version(), "steps": args.steps, "warmup": args.steps, "runs": args.runs}
    print("# " + json.dumps(info), flush=True)
    results = []
    for name in args.models.split(","):
        try:
            r = run(name, args)
        except Exception as e:  # noqa: BLE001 - reported in the table as failed
            print(f"{name:<4} failed: {e!r}", flush=True)
            r = {"model": name, "precision": info["precision"], "error": repr(e)}
        if r is not None:
            results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
