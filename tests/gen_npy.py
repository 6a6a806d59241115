#!/usr/bin/env python3
"""NumPy fixtures written by numpy itself (tests/unit/test_data_npy.c reads them and checks every
value against the same formulas, so CI needs no Python).

    python3 tests/gen_npy.py    # any Python with numpy (e.g. the venv bench/peers.sh prints)

writes tests/fixtures/npy/ (a few KB; commit them). Arrays, element i and value k of it:
    i2.npy      int16 (5, 3): (i * 3 + k) * 1000 - 7000      (negative and positive)
    u4.npy      uint32 (5,): 4000000000 + i                 (beyond int32: widens to int64)
    f4.npy      float32 (5, 2, 2): i + k / 8                (k = 0..3 over the last two dims)
    b1.npy      bool (5,): i % 2 == 1
    v2.npy      uint8 (5, 3) in .npy format version 2.0 (np.lib.format.write_array version=(2, 0)): i * 3 + k
    fortran.npy float64 (5, 3) in Fortran order              (an error)
    object.npy  object (5,)                                  (an error)
    big.npy     >f4 (5,)                                     (an error)
    record.npy  a structured dtype [('a', '<i4'), ('b', '<f4')]   (an error)
    arrays.npz  np.savez: x = u1 (5, 3) i * 3 + k, y = i8 (5,) i - 2
    arrays_c.npz np.savez_compressed of the same (deflated members)
The zip headers carry the time of writing; the arrays are deterministic."""
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "npy")


def main():
    os.makedirs(OUT, exist_ok=True)
    i = np.arange(5)[:, None]
    k = np.arange(3)[None, :]
    np.save(os.path.join(OUT, "i2.npy"), ((i * 3 + k) * 1000 - 7000).astype(np.int16))
    np.save(os.path.join(OUT, "u4.npy"), (4000000000 + np.arange(5)).astype(np.uint32))
    np.save(os.path.join(OUT, "f4.npy"), (np.arange(5)[:, None] + np.arange(4)[None, :] / 8).astype(np.float32).reshape(5, 2, 2))
    np.save(os.path.join(OUT, "b1.npy"), np.arange(5) % 2 == 1)
    with open(os.path.join(OUT, "v2.npy"), "wb") as f:
        np.lib.format.write_array(f, (i * 3 + k).astype(np.uint8), version=(2, 0))
    np.save(os.path.join(OUT, "fortran.npy"), np.asfortranarray((i * 3 + k).astype(np.float64)))
    np.save(os.path.join(OUT, "object.npy"), np.array([1, "a", None, 2.5, (1,)], dtype=object), allow_pickle=True)
    np.save(os.path.join(OUT, "big.npy"), np.arange(5, dtype=">f4"))
    np.save(os.path.join(OUT, "record.npy"), np.zeros(5, dtype=[("a", "<i4"), ("b", "<f4")]))
    x = (i * 3 + k).astype(np.uint8)
    y = (np.arange(5) - 2).astype(np.int64)
    np.savez(os.path.join(OUT, "arrays.npz"), x=x, y=y)
    np.savez_compressed(os.path.join(OUT, "arrays_c.npz"), x=x, y=y)


if __name__ == "__main__":
    main()
