"""Dense vectors: MNIST-style IDX files and NumPy ``.npz`` / ``.npy`` archives (never
unpickled).
"""

from __future__ import annotations

import logging
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np

from mgpu.io._common import _read_bytes
from mgpu.io.errors import MalformedFileError, StrPath

logger = logging.getLogger(__name__)

__all__ = ["IDX_DTYPES", "load_idx", "load_npz_array"]


# IDX type codes (third magic byte); all multi-byte types are big-endian.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _idx_header_ok(head: bytes) -> bool:
    return (
        len(head) >= 4
        and head[0] == 0
        and head[1] == 0
        and head[2] in IDX_DTYPES
        and (1 <= head[3] <= 8)
    )


def _rows(X: np.ndarray) -> np.ndarray:
    """An array of three or more dimensions as ``(n, prod(rest))`` rows (``n`` may be 0)."""
    return X.reshape(X.shape[0], int(np.prod(X.shape[1:]))) if X.ndim > 2 else X


def load_idx(path: StrPath, *, flatten: bool = True) -> np.ndarray:
    """Read an IDX file (the MNIST format), plain or gzip.

    The header is two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C
    int32, 0x0D float32, 0x0E float64), the number of dimensions, then one big-endian
    uint32 per dimension; the payload is the big-endian array. MNIST labels have magic
    0x00000801 (1-D uint8), images 0x00000803 (n x 28 x 28 uint8).

    Parameters
    ----------
    path : str or os.PathLike
        IDX file (``*-ubyte`` or ``*-ubyte.gz``).
    flatten : bool, default=True
        Return arrays of three or more dimensions as ``(n, prod(rest))`` (images as rows of
        784 pixels, what the distance code takes); ``False`` keeps the file's shape.

    Returns
    -------
    X : ndarray
        Native byte order, the file's type (uint8 for MNIST), shape ``(n,)`` for labels,
        ``(n, rows * cols)`` for images (``(n, rows, cols)`` with ``flatten=False``).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    MalformedFileError
        On a bad magic number, a header shorter than its dimensions, a payload shorter or
        longer than the dimensions say, or a truncated gzip stream.

    Examples
    --------
    >>> X = load_idx("vectors/mnist_t10k-images-idx3-ubyte.gz")  # doctest: +SKIP
    >>> X.shape, X.dtype  # doctest: +SKIP
    ((10000, 784), dtype('uint8'))
    """
    data = _read_bytes(path)
    if not _idx_header_ok(data[:4]):
        raise MalformedFileError(
            path,
            None,
            "an IDX magic number 0x0000TTDD (T in 08 09 0B 0C 0D 0E, D >= 1)",
            f"0x{data[:4].hex()}" if len(data) >= 4 else f"{len(data)} bytes",
            byte=0,
        )
    dt, ndim = IDX_DTYPES[data[2]], data[3]
    hdr = 4 + 4 * ndim
    if len(data) < hdr:
        raise MalformedFileError(
            path,
            None,
            f"{ndim} big-endian uint32 dimensions",
            f"{len(data) - 4} bytes",
            byte=4,
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    need = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    have = len(data) - hdr
    if have != need:
        shape = " x ".join(map(str, dims))
        raise MalformedFileError(
            path, None, f"{need} bytes of {dt.name} data ({shape})", f"{have}", byte=hdr
        )
    X = np.frombuffer(data, dtype=dt, offset=hdr).reshape(dims)
    X = X.astype(dt.newbyteorder("="), copy=True)  # writable, native order
    if flatten:
        X = _rows(X)
    logger.debug("read %s: %s %s", path, X.shape, X.dtype)
    return X


def load_npz_array(path: StrPath, key: str = "arr_0", *, flatten: bool = True) -> np.ndarray:
    """Read one array from a NumPy ``.npz`` archive (or a ``.npy`` file), never unpickling.

    Arrays of three or more dimensions come back as rows, as :func:`load_idx` gives them, so
    that the same images read the same from either format.

    Parameters
    ----------
    path : str or os.PathLike
        ``.npz`` archive (``np.savez`` / ``np.savez_compressed``) or ``.npy`` file.
    key : str, default="arr_0"
        Name of the array in the archive (ignored for ``.npy``).
    flatten : bool, default=True
        Return arrays of three or more dimensions as ``(n, prod(rest))`` (as
        :func:`load_idx`); ``False`` keeps the stored shape.

    Returns
    -------
    X : ndarray
        The array as stored, flattened to ``(n, prod(rest))`` from three dimensions on
        (KMNIST images: (10000, 784) uint8; (10000, 28, 28) with ``flatten=False``).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    KeyError
        If the archive has no array ``key`` (the message lists those it has).
    MalformedFileError
        If the file is not an npz/npy file, is truncated, or holds an object array (which
        would need unpickling: refused, ``allow_pickle`` stays False).

    Examples
    --------
    >>> load_npz_array("vectors/kmnist-test-labels.npz").shape  # doctest: +SKIP
    (10000,)
    >>> load_npz_array("vectors/kmnist-test-imgs.npz").shape  # doctest: +SKIP
    (10000, 784)
    """
    X = _read_npz(Path(path), key)
    return _rows(X) if flatten else X


def _read_npz(p: Path, key: str) -> np.ndarray:
    expected = "a NumPy .npz/.npy file without object arrays"
    with p.open("rb") as f:  # FileNotFoundError names the path
        try:
            obj = np.load(f, allow_pickle=False)
            if isinstance(obj, np.ndarray):
                return obj
            with obj:
                if key not in obj.files:
                    raise KeyError(f"{p.name} has no array {key!r}; it holds {sorted(obj.files)}")
                return obj[key]
        except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as exc:
            raise MalformedFileError(p, None, expected, f"unreadable data ({exc})") from None
        except (ValueError, SyntaxError, tokenize.TokenError) as exc:
            # numpy refusing pickles, or a bad npy header: numpy parses the header's dict
            # with the tokenizer, which raises its own error on an unbalanced bracket
            raise MalformedFileError(p, None, expected, f"a bad header ({exc})"
                                     if not isinstance(exc, ValueError) else str(exc)) from None
