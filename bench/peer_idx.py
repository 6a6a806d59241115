"""IDX files (MNIST's format, gzipped or not) as numpy arrays, for the peers of bench/ (peer_torch_train.py,
peer_keras_train.py, peer_tfdata.py, peer_tfdata_sources.py): one reader, so every peer decodes the same
bytes. Imported from the scripts' own directory (Python puts it first on sys.path)."""
import gzip


def read_idx(path):
    """The array an IDX file holds: uint8 elements, shape from its header."""
    import numpy as np

    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
