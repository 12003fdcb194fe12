"""Random valid files of every format mgpu.io tells from the content, and of the ones whose
lines read as several formats: each is read as the format it was written in (the same
matrix, the same ids), or refused as ambiguous with the message that says how to choose."""
from __future__ import annotations

import gzip
import io
import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from mgpu import io as mio
from mgpu.io import AmbiguousFormatError

# MGPU_PROPERTY_EXAMPLES=N: N random examples instead of CI's fixed, derandomised set
_RANDOM = int(os.environ.get("MGPU_PROPERTY_EXAMPLES", "0"))
_SETTINGS = settings(max_examples=_RANDOM or 60, deadline=None, derandomize=not _RANDOM,
                     database=None)

_CHOOSE = r"Choose one with fmt=.* \(mgpu\.io\.load\) or --format on the command line"

ids = st.integers(0, 60)
# weights that print and parse back exactly, zeros and negatives included
weights = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32).map(float)


def _write(folder: str, name: str, text: str | bytes, gz: bool) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path = Path(folder) / (name + ".gz" * gz)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def _dense(entries, shape, last: bool = True) -> np.ndarray:
    """The matrix of (row, col, value) triplets: the last value of a repeated pair, or 1."""
    A = np.zeros(shape)
    for r, c, v in entries:
        A[r, c] = v
    return A


def _fits_mm_size_line(rows: list[list[str]]) -> bool:
    """Whether the first row could be a Matrix Market size line of the rows after it."""
    if len(rows[0]) != 3 or not all(t.isdigit() for t in rows[0]):
        return False
    m, n, nnz = (int(t) for t in rows[0])
    return len(rows) - 1 == nnz and all(1 <= int(r[0]) <= m and 1 <= int(r[1]) <= n
                                        for r in rows[1:])


# ----------------------------------------------------------------- formats told apart


@_SETTINGS
@given(edges=st.lists(st.tuples(ids, ids), min_size=1, max_size=30),
       sep=st.sampled_from([" ", "\t"]), comment=st.booleans(), gz=st.booleans())
def test_snap_files_read_as_snap(edges, sep, comment, gz):
    text = "# Directed graph\n" * comment + "".join(f"{u}{sep}{v}\n" for u, v in edges)
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "g.txt", text, gz)
        assert mio.detect_format(path) == "snap"
        assert mio.sniff(path, expect="graph").note is None
        A, node_ids = mio.load(path, relabel=True, return_ids=True)
    np.testing.assert_array_equal(node_ids, sorted({i for e in edges for i in e}))
    pos = {int(i): k for k, i in enumerate(node_ids)}
    n = len(node_ids)
    np.testing.assert_array_equal(
        A.toarray(), _dense([(pos[u], pos[v], 1) for u, v in edges], (n, n)))


@st.composite
def _mm(draw):
    m, n = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    field = draw(st.sampled_from(["real", "integer", "pattern"]))
    cells = draw(st.sets(st.tuples(st.integers(0, m - 1), st.integers(0, n - 1)), max_size=12))
    vals = [draw(st.integers(-50, 50)) or 1 for _ in cells]
    rows, cols = zip(*cells) if cells else ((), ())
    A = sp.coo_matrix((np.array(vals, dtype=float), (rows, cols)), shape=(m, n))
    buf = io.BytesIO()
    scipy.io.mmwrite(buf, A, field=field)
    return buf.getvalue().decode()


@_SETTINGS
@given(text=_mm(), gz=st.booleans())
def test_matrix_market_files_read_as_written_and_refused_without_their_banner(text, gz):
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "m.mtx", text, gz)
        assert mio.detect_format(path) == "matrix-market"
        ref = scipy.io.mmread(io.StringIO(text))
        np.testing.assert_array_equal(mio.load(path).toarray(), ref.toarray())
        # the banner dropped (comments kept, or dropped too): refused, even for a graph job
        lines = text.splitlines(keepends=True)
        for body in ("".join(lines[1:]), "".join(s for s in lines if not s.startswith("%"))):
            bare = _write(d, "bare.txt", body, gz)
            for expect in (None, "graph"):
                with pytest.raises(AmbiguousFormatError, match=r"without its '%%MatrixMarket"):
                    mio.detect_format(bare, expect=expect)


@st.composite
def _docword(draw):
    D, W = draw(st.integers(1, 6)), draw(st.integers(1, 9))
    cells = sorted(draw(st.sets(st.tuples(st.integers(1, D), st.integers(1, W)), min_size=1,
                                max_size=15)))
    counts = [draw(st.integers(1, 40)) for _ in cells]
    return D, W, cells, counts


@_SETTINGS
@given(doc=_docword(), gz=st.booleans())
def test_docword_files_read_as_docword(doc, gz):
    D, W, cells, counts = doc
    text = f"{D}\n{W}\n{len(cells)}\n" + "".join(
        f"{d} {w} {c}\n" for (d, w), c in zip(cells, counts))
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "docword.x.txt", text, gz)
        assert mio.detect_format(path) == "docword"
        A = mio.load(path)
    ref = _dense([(r - 1, c - 1, v) for (r, c), v in zip(cells, counts)], (D, W))
    np.testing.assert_array_equal(A.toarray(), ref)


@_SETTINGS
@given(docs=st.lists(st.dictionaries(st.integers(0, 20), st.integers(1, 9), max_size=5),
                     min_size=1, max_size=8), gz=st.booleans())
def test_ldac_files_read_as_ldac_or_refused_as_ambiguous(docs, gz):
    text = "".join(f"{len(doc)}" + "".join(f" {t}:{c}" for t, c in doc.items()) + "\n"
                   for doc in docs)
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "c.dat", text, gz)
        if text == "0\n0\n0\n":  # an empty docword corpus as much as three empty documents
            with pytest.raises(AmbiguousFormatError, match=_CHOOSE):
                mio.detect_format(path)
            return
        assert mio.detect_format(path) == "ldac"
        A = mio.load(path)
    n = 1 + max((t for doc in docs for t in doc), default=-1)
    ref = _dense([(r, t, c) for r, doc in enumerate(docs) for t, c in doc.items()],
                 (len(docs), n))
    np.testing.assert_array_equal(A.toarray(), ref)


@_SETTINGS
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       dtype=st.sampled_from([(np.uint8, 0x08), (np.int16, 0x0B), (np.float64, 0x0E)]),
       gz=st.booleans(), compressed=st.booleans())
def test_idx_and_npz_files_read_alike(shape, dtype, gz, compressed):
    """The same array written as IDX and as .npz reads the same (three dimensions and more
    as rows, in both)."""
    np_dtype, code = dtype
    a = np.arange(int(np.prod(shape)), dtype=np_dtype).reshape(shape)
    blob = struct.pack(">HBB", 0, code, a.ndim) + struct.pack(f">{a.ndim}I", *a.shape) \
        + a.astype(a.dtype.newbyteorder(">")).tobytes()
    with tempfile.TemporaryDirectory() as d:
        ipath = _write(d, "a-ubyte", blob, gz)
        npath = Path(d) / "a.npz"
        (np.savez_compressed if compressed else np.savez)(npath, a)
        assert mio.detect_format(ipath) == "idx" and mio.detect_format(npath) == "npz"
        X, Y = mio.load(ipath), mio.load(npath)
        np.testing.assert_array_equal(X, Y)
        assert X.shape == Y.shape == (a.reshape(a.shape[0], -1).shape if a.ndim > 2 else a.shape)
        np.testing.assert_array_equal(mio.load_npz_array(npath, flatten=False), a)


# ----------------------------------------------------------------- lines that read as several


@st.composite
def _ratings(draw):
    pairs = draw(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1,
                          max_size=20))
    return [(u, i, draw(st.sampled_from([0.5, 1.0, 2.5, 3.0, 4.0, 5.0]))) for u, i in pairs]


def _check_ratings(R, triplets):
    users = sorted({u for u, _, _ in triplets})
    items = sorted({i for _, i, _ in triplets})
    np.testing.assert_array_equal(R.user_ids, users)
    np.testing.assert_array_equal(R.item_ids, items)
    ref = _dense([(users.index(u), items.index(i), r) for u, i, r in triplets],
                 (len(users), len(items)))
    np.testing.assert_array_equal(R.matrix.toarray(), ref)


@_SETTINGS
@given(triplets=_ratings(), layout=st.sampled_from(["u.data", "ratings.dat", "ratings.csv",
                                                    "header", "plain"]),
       gz=st.booleans())
def test_ratings_files_read_as_ratings_or_refused_as_ambiguous(triplets, layout, gz):
    """A MovieLens layout ('::', a header naming users and items) or name (u.data) says
    ratings; bare 'user item rating time' lines in a file of another name are refused, and
    read as ratings with expect='ratings' or fmt='ratings'."""
    lines = {
        "u.data": ("u.data", "", "\t"), "ratings.dat": ("ratings.dat", "", "::"),
        "ratings.csv": ("r.csv", "userId,movieId,rating,timestamp\n", ","),
        "header": ("r.txt", "user item rating time\n", " "), "plain": ("r.txt", "", " "),
    }
    name, header, sep = lines[layout]
    text = header + "".join(sep.join(map(str, (u, i, r, 978300760 + k))) + "\n"
                            for k, (u, i, r) in enumerate(triplets))
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, name, text, gz)
        if layout == "plain":
            with pytest.raises(AmbiguousFormatError, match=_CHOOSE):
                mio.load(path)
            R = mio.load(path, expect="ratings")
            _check_ratings(mio.load(path, fmt="ratings"), triplets)
        else:
            assert mio.detect_format(path) == "ratings"
            R = mio.load(path)
    _check_ratings(R, triplets)


@st.composite
def _weighted(draw):
    edges = draw(st.lists(st.tuples(ids, ids, weights), min_size=1, max_size=25))
    return edges, draw(st.sampled_from([3, 4])), draw(st.sampled_from([" ", "\t", ","]))


@_SETTINGS
@given(case=_weighted(), header=st.booleans(), comment=st.booleans(), gz=st.booleans())
def test_weighted_edge_lists_read_as_graphs_or_refused_as_ambiguous(case, header, comment, gz):
    """'u v w [t]' lines: refused without a choice (they read as ratings too), a graph with
    its weights for a graph job (expect='graph') or fmt='weighted-edges', the last weight of
    an edge listed twice kept; a header naming the columns decides alone."""
    edges, ncols, sep = case
    rows = [[str(u), str(v), repr(w)] + ["1700000000"] * (ncols - 3) for u, v, w in edges]
    text = "# a weighted graph\n" * comment \
        + ("source target weight" + " time" * (ncols == 4) + "\n") * header \
        + "".join(sep.join(r) + "\n" for r in rows)
    node_ids = sorted({i for u, v, _ in edges for i in (u, v)})
    pos = {i: k for k, i in enumerate(node_ids)}
    ref = _dense([(pos[u], pos[v], w) for u, v, w in edges], (len(node_ids),) * 2)
    looks_mm = not header and sep != "," and _fits_mm_size_line(rows)
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "g.txt", text, gz)
        if looks_mm:  # refused, whatever the job, with the banner named
            with pytest.raises(AmbiguousFormatError, match="banner"):
                mio.sniff(path, expect="graph")
        elif header:
            assert mio.sniff(path) == mio.sniff(path, expect="graph")
            assert mio.sniff(path).format == "weighted-edges"
        else:
            with pytest.raises(AmbiguousFormatError, match=_CHOOSE):
                mio.load(path)
            found = mio.sniff(path, expect="graph")
            assert found.format == "weighted-edges" and "temporal-edges" in found.note
        for kw in ({"fmt": "weighted-edges"},) + ({"expect": "graph"},) * (not looks_mm):
            A, got_ids = mio.load(path, relabel=True, return_ids=True, dtype=np.float64, **kw)
            np.testing.assert_array_equal(got_ids, node_ids)
            np.testing.assert_array_equal(A.toarray(), ref)
            # the ratings reading (no '#' comments there) numbers users and items apart
            assert comment or mio.load(path, fmt="ratings").matrix.shape == (
                len({u for u, _, _ in edges}), len({v for _, v, _ in edges}))


@_SETTINGS
@given(edges=st.lists(st.tuples(ids, ids, st.integers(0, 2**31)), min_size=1, max_size=25),
       header=st.booleans(), gz=st.booleans())
def test_temporal_edge_lists_read_as_graphs_with_the_times_ignored(edges, header, gz):
    text = "src dst timestamp\n" * header + "".join(f"{u} {v} {t}\n" for u, v, t in edges)
    node_ids = sorted({i for u, v, _ in edges for i in (u, v)})
    pos = {i: k for k, i in enumerate(node_ids)}
    ref = _dense([(pos[u], pos[v], 1) for u, v, _ in edges], (len(node_ids),) * 2)
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "sx.txt", text, gz)
        if header:
            found = mio.sniff(path)
            assert found.format == "temporal-edges" and "ignored" in found.note
            kw = {}
        else:
            kw = {"fmt": "temporal-edges"}
        A, got_ids = mio.load(path, relabel=True, return_ids=True, **kw)
    np.testing.assert_array_equal(got_ids, node_ids)
    np.testing.assert_array_equal(A.toarray(), ref)


# ----------------------------------------------------------------- the examples of issue 35


EXAMPLE = "1 2 1.0\n2 3 1.0\n3 4 1.0\n1 3 1.0\n"


def test_a_weighted_edge_list_is_not_taken_for_ratings(tmp_path):
    """'u v w' lines were read as ratings (3 users x 3 items), whatever the caller read."""
    path = tmp_path / "g.txt"
    path.write_text(EXAMPLE)
    with pytest.raises(AmbiguousFormatError, match=r"^g\.txt: cannot tell its format: its "
                       r"lines hold 3 numbers each, which read as ratings or weighted-edges.*"
                       + _CHOOSE):
        mio.load(path)
    A, node_ids = mio.load(path, expect="graph", relabel=True, return_ids=True)
    np.testing.assert_array_equal(node_ids, [1, 2, 3, 4])
    assert A.shape == (4, 4) and A.nnz == 4  # networkx: 4 nodes, 4 edges


def test_a_matrix_market_body_without_its_banner_is_refused(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("4 4 3\n1 2 1.0\n2 3 1.0\n3 4 1.0\n")
    for expect in (None, "graph", "ratings"):
        with pytest.raises(AmbiguousFormatError, match=r"add '%%MatrixMarket matrix coordinate"):
            mio.load(path, expect=expect)


def test_load_reads_a_ratings_file_with_a_header_line(tmp_path):
    """load() refused what load_ratings reads: a whitespace file with a header line."""
    path = tmp_path / "r.txt"
    path.write_text("user item rating\n1 10 4\n2 10 3.5\n")
    R = mio.load(path)
    np.testing.assert_array_equal(R.user_ids, [1, 2])
    np.testing.assert_array_equal(R.matrix.toarray(), [[4], [3.5]])


def test_npz_and_idx_give_images_the_same_shape(tmp_path):
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    np.savez(tmp_path / "x.npz", a)
    (tmp_path / "x-ubyte").write_bytes(struct.pack(">HBBIII", 0, 8, 3, 2, 3, 4) + a.tobytes())
    assert mio.load(tmp_path / "x.npz").shape == mio.load(tmp_path / "x-ubyte").shape == (2, 12)


def test_ambiguous_format_error_pickles_and_expect_is_checked(tmp_path):
    import pickle

    err = AmbiguousFormatError("/a/g.txt", ["ratings", "weighted-edges"], "lines", "Hint.")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.candidates == ("ratings", "weighted-edges")
    assert isinstance(err, ValueError) and str(err).endswith("Hint.")
    path = tmp_path / "g.txt"
    path.write_text("0 1\n")
    with pytest.raises(ValueError, match=r"^The 'expect' parameter of sniff must be one of "
                       r"\['corpus', 'dense', 'graph', 'matrix', 'ratings'\] or None\. Got "
                       r"'graphs' instead\."):
        mio.load(path, expect="graphs")
    with pytest.raises(ValueError, match=r"^The 'values' parameter of load_edges must be one "
                       r"of \['time', 'weight'\]\. Got 'w' instead\."):
        mio.load_edges(path, values="w")


@pytest.mark.parametrize("text, pattern", [
    ("1 2 3\n1 2\n", r"^g\.txt line 2: expected 'u v weight \[time\]' \(3 columns"),
    ("1 2 3\n1 -2 3\n", r"^g\.txt line 2: expected .*non-negative integer ids.*found u=1, v=-2"),
    ("1 2 nan\n", r"^g\.txt line 1: expected .* a finite weight, found u=1, v=2, weight=nan"),
    ("src dst w\n1 2 3\n1 2 x\n", r"^g\.txt line 3: expected .*found '1 2 x'"),
    ("# a comment\n\nsrc dst w\n1 2 3\n1 2\n", r"^g\.txt line 5: expected .*found '1 2'"),
])
def test_weighted_edge_list_malformed(tmp_path, text, pattern):
    path = tmp_path / "g.txt"
    path.write_text(text)
    with pytest.raises(mio.MalformedFileError, match=pattern):
        mio.load_edges(path)


def test_weighted_edge_list_repeated_edge_keeps_the_last_weight(tmp_path, caplog):
    import logging

    path = tmp_path / "g.txt"
    path.write_text("# weights\n5 7 2.5 100\n7 5 0 101\n5 7 4 102 # again\n")
    with caplog.at_level(logging.WARNING, logger="mgpu.io"):
        A, node_ids = mio.load_edges(path, relabel=True, return_ids=True, symmetric=False)
    assert "1 edges are listed more than once; kept the last weight" in caplog.text
    np.testing.assert_array_equal(node_ids, [5, 7])
    assert A.nnz == 2 and A[0, 1] == 4 and A[1, 0] == 0  # the weight 0 stays an edge
