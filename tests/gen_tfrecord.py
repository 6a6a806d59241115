#!/usr/bin/env python3
"""TFRecord fixtures written by TensorFlow itself (tests/unit/test_data_tfrecord.c reads them and
checks every value against the same formulas, so CI needs neither Python nor TensorFlow).

    python3 tests/gen_tfrecord.py    # any Python with tensorflow-cpu (e.g. the venv bench/peers.sh prints)

writes tests/fixtures/tfrecord/ (a few KB; commit them):
    examples.tfrecord      7 tf.train.Example records, record i:
                             image/encoded_raw  bytes_list: 12 bytes (i * 31 + k * 7) % 256, k = 0..11
                             label              int64_list: [i * 3 - 5]  (negative for i < 2)
                             weights            float_list: [i + 0.25, -i / 2, 1e-3 * i]
                             big                int64_list: [i * 2**40]
    examples.tfrecord.gz   the same records with TFRecordOptions(compression_type="GZIP")
    sequence.tfrecord      1 tf.train.SequenceExample (not an Example: its features decode as
                           an empty Example, which the reader reports as a missing feature)
The output is deterministic (a second run gives identical files)."""
import os
import sys

import numpy as np
import tensorflow as tf

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tfrecord")


def example(i):
    img = bytes(((i * 31 + k * 7) % 256) for k in range(12))
    f = {
        "image/encoded_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[img])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 3 - 5])),
        "weights": tf.train.Feature(float_list=tf.train.FloatList(value=[i + 0.25, -i / 2, 1e-3 * i])),
        "big": tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 2**40])),
    }
    return tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString(deterministic=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(OUT, "examples.tfrecord")) as w:
        for i in range(7):
            w.write(example(i))
    opts = tf.io.TFRecordOptions(compression_type="GZIP")
    with tf.io.TFRecordWriter(os.path.join(OUT, "examples.tfrecord.gz"), opts) as w:
        for i in range(7):
            w.write(example(i))
    seq = tf.train.SequenceExample()
    seq.feature_lists.feature_list["tokens"].feature.add().int64_list.value.extend([1, 2, 3])
    with tf.io.TFRecordWriter(os.path.join(OUT, "sequence.tfrecord")) as w:
        w.write(seq.SerializeToString(deterministic=True))
    # check: tf.data parses back what was written
    spec = {"image/encoded_raw": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    for i, r in enumerate(tf.data.TFRecordDataset(os.path.join(OUT, "examples.tfrecord.gz"), compression_type="GZIP")):
        e = tf.io.parse_single_example(r, spec)
        assert int(e["label"]) == i * 3 - 5
        assert np.frombuffer(e["image/encoded_raw"].numpy(), np.uint8)[1] == (i * 31 + 7) % 256
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
