"""Loaders for the sparse and dense datasets mgpu runs on, into scipy CSR or numpy arrays.

Every loader reads plain or gzip-compressed files (recognised by the gzip magic bytes, not
the name), parses the whole text at once with numpy (``np.loadtxt`` / ``np.fromstring``)
and only walks the file line by line after that fast path has failed, to say exactly where
and why: a :class:`MalformedFileError` names the file, the 1-based line number (counting
every line the file has, comments and headers included), what was expected and what was
found. Binary formats (IDX, ``.npz``) say the byte offset instead.

Formats (``FORMATS`` lists them; :func:`load` detects them from the content):

=================  ==============================================  ==========================
format             files                                           loader
=================  ==============================================  ==========================
``matrix-market``  ``*.mtx``, ``*.mtx.gz``                         :func:`load_matrix_market`
``10x``            folder with ``matrix.mtx[.gz]``, ``features``/   :func:`load_10x`
                   ``genes.tsv[.gz]``, ``barcodes.tsv[.gz]``
``idx``            MNIST-style ``*-ubyte[.gz]``                    :func:`load_idx`
``npz``            ``*.npz`` / ``*.npy`` (never unpickled)          :func:`load_npz_array`
``ratings``        MovieLens ``u.data``, ``ratings.dat``,          :func:`load_ratings`
                   ``ratings.csv``
``docword``        UCI ``docword.*.txt[.gz]``                      :func:`load_docword`
``ldac``           Blei's LDA-C ``*.dat`` (``N id:count ...``)     :func:`load_ldac`
``snap``           SNAP edge lists ``*.txt[.gz]``                  :func:`load_snap`
``weighted-edges`` edge lists ``u v weight [time]``                :func:`load_edges`
``temporal-edges`` edge lists ``u v time`` (the times ignored)     :func:`load_edges`
                                                                   (``values="time"``)
=================  ==============================================  ==========================

Lines of three or four numbers read as ratings (users and items numbered apart) and as a
weighted edge list (one numbering of the nodes) alike: detection does not guess between them.
:func:`load` takes ``expect="graph"`` (or ``"ratings"``) from a caller that knows what it
reads, a MovieLens file name (``u.data``, ``*ratings*``) decides, and otherwise the file is
refused with an :class:`AmbiguousFormatError` that says to pass ``fmt=``.

Every loader keeps the original ids: :class:`Ratings` the user and item ids, :func:`load_snap`
and :func:`load_edges` the node ids (``return_ids=True``), :class:`TenX` the features and
barcodes; Matrix Market and UCI docword indices are the 1-based file indices of the rows and
columns, LDA-C, IDX and npz rows the 0-based positions in the file.

IDX and ``.npz`` give arrays of three or more dimensions alike, as rows of
``prod(rest)`` values (images as rows of pixels, what the distance code takes);
``flatten=False`` keeps the stored shape.

This package imports neither CuPy nor Dask: it produces host data that the caller moves.

One module per family of formats: :mod:`mgpu.io.matrix_market`, :mod:`mgpu.io.graphs`
(SNAP and other edge lists), :mod:`mgpu.io.bow` (UCI docword, LDA-C), :mod:`mgpu.io.ratings`,
:mod:`mgpu.io.tenx`, :mod:`mgpu.io.vectors` (IDX, npz) and :mod:`mgpu.io.detect`
(``FORMATS``, :func:`sniff`, :func:`detect_format`, :func:`load`); :mod:`mgpu.io.errors`
holds :class:`MalformedFileError` and :class:`AmbiguousFormatError`. Import the names from ``mgpu.io``.
"""

from __future__ import annotations

from mgpu.io.bow import load_bow, load_docword, load_ldac
from mgpu.io.detect import FORMATS, KINDS, Sniffed, detect_format, load, sniff
from mgpu.io.errors import AmbiguousFormatError, MalformedFileError
from mgpu.io.errors import StrPath  # noqa: F401 (an mgpu.io name before the split)
from mgpu.io.graphs import load_edges, load_snap
from mgpu.io.matrix_market import load_matrix_market
from mgpu.io.ratings import Ratings, load_ratings
from mgpu.io.tenx import TenX, load_10x
from mgpu.io.vectors import IDX_DTYPES  # noqa: F401 (an mgpu.io name before the split)
from mgpu.io.vectors import load_idx, load_npz_array

__all__ = [
    "FORMATS",
    "KINDS",
    "AmbiguousFormatError",
    "MalformedFileError",
    "Ratings",
    "Sniffed",
    "TenX",
    "detect_format",
    "load",
    "load_10x",
    "load_bow",
    "load_docword",
    "load_edges",
    "load_idx",
    "load_ldac",
    "load_matrix_market",
    "load_npz_array",
    "load_ratings",
    "load_snap",
    "sniff",
]
