"""Tests of mgpu.io: the real datasets (exact counts from shared/data/README.md) and small
synthetic files of every format, well-formed and malformed."""

from __future__ import annotations

import gzip
import io
import logging
import os
import re
import struct
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from mgpu import io as mio
from mgpu.io import (
    MalformedFileError,
    Ratings,
    TenX,
    detect_format,
    load,
    load_10x,
    load_bow,
    load_docword,
    load_idx,
    load_ldac,
    load_matrix_market,
    load_npz_array,
    load_ratings,
    load_snap,
)


def write(folder: Path, name: str, content: str | bytes, *, gz: bool = False) -> Path:
    data = content.encode() if isinstance(content, str) else content
    path = folder / name
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def truncated_gz(folder: Path, name: str, content: str | bytes) -> Path:
    data = content.encode() if isinstance(content, str) else content
    blob = gzip.compress(data, mtime=0)
    path = folder / name
    path.write_bytes(blob[: len(blob) // 2])
    return path


def gz_lines(path: Path, n: int, skip_comments: str | None = None) -> list[str]:
    """The first n lines of a gzipped text file, parsed by hand (independent of mio)."""
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            if skip_comments and line.startswith(skip_comments):
                continue
            out.append(line.rstrip("\r\n"))
            if len(out) == n:
                break
    return out


# ======================================================================================
# Real data
# ======================================================================================


@pytest.fixture(scope="module")
def slashdot(data_dir: Path) -> sp.csr_matrix:
    return load_snap(data_dir / "graphs/soc-Slashdot0902.txt.gz")


def test_facebook(data_dir):
    path = data_dir / "graphs/facebook_combined.txt.gz"
    A = load_snap(path)
    assert A.shape == (4039, 4039) and A.nnz == 88234 and A.dtype == np.float32
    S = load_snap(path, symmetric=True)
    assert S.nnz == 176468 and (S != S.T).nnz == 0
    assert S.diagonal().sum() == 0 and set(np.unique(S.data)) == {1.0}
    assert np.diff(A.indptr).max() == 1043  # max degree as source, README
    for line in gz_lines(path, 5, skip_comments="#"):
        u, v = map(int, line.split())
        assert A[u, v] == 1 and S[v, u] == 1


def test_email_enron(data_dir):
    A = load_snap(data_dir / "graphs/email-Enron.txt.gz")  # CRLF, no header
    assert A.shape == (36692, 36692) and A.nnz == 367662
    assert (A != A.T).nnz == 0  # stored in both directions already
    assert A.diagonal().sum() == 0 and np.diff(A.indptr).max() == 1383


def test_ca_hepph_relabel(data_dir):
    path = data_dir / "graphs/ca-HepPh.txt.gz"  # tabs, CRLF, no final newline
    A, ids = load_snap(path, relabel=True, return_ids=True)
    assert A.shape == (12008, 12008) and A.nnz == 237010
    assert A.diagonal().sum() == 32 and np.diff(A.indptr).max() == 491
    assert ids.shape == (12008,) and np.all(np.diff(ids) > 0) and ids[-1] == 89208
    assert load_snap(path, relabel=True, self_loops=False).nnz == 237010 - 32
    for line in gz_lines(path, 3):
        u, v = map(int, line.split("\t"))
        assert A[np.searchsorted(ids, u), np.searchsorted(ids, v)] == 1
    assert load_snap(path).shape == (89209, 89209)


def test_p2p_gnutella(data_dir):
    A = load_snap(data_dir / "graphs/p2p-Gnutella31.txt.gz")
    assert A.shape == (62586, 62586) and A.nnz == 147892
    assert np.diff(A.indptr).max() == 78


def test_slashdot(slashdot):
    A = slashdot
    assert A.shape == (82168, 82168) and A.nnz == 948464
    assert A.diagonal().sum() == 78303 and np.diff(A.indptr).max() == 2511


def test_slashdot_symmetric_and_speed(data_dir):
    path = data_dir / "graphs/soc-Slashdot0902.txt.gz"
    t0 = time.perf_counter()
    S = load_snap(path, symmetric=True)
    elapsed = time.perf_counter() - t0
    # 582,533 distinct undirected pairs, 78,303 of them self loops (stored once).
    assert (S.nnz + 78303) // 2 == 582533 and S.diagonal().sum() == 78303
    assert load_snap(path, symmetric=True, self_loops=False).nnz == 2 * (582533 - 78303)
    # Vectorised parsing takes well under a second; a per-token Python loop takes many.
    assert elapsed < 5.0, f"load_snap took {elapsed:.1f}s on soc-Slashdot0902"


@pytest.mark.parametrize(
    "name, n, nnz, symmetric",
    [
        ("memplus", 17758, 126150, False),
        ("bcsstk13", 2003, 83883, True),
        ("s3rmt3m3", 5357, 207695, True),
    ],
)
def test_matrix_market_real(data_dir, name, n, nnz, symmetric):
    path = data_dir / f"matrices/{name}.mtx.gz"
    A = load_matrix_market(path)
    assert isinstance(A, sp.csr_matrix) and A.dtype == np.float64
    assert A.shape == (n, n) and A.nnz == nnz
    assert ((A != A.T).nnz == 0) == symmetric
    # first entry, parsed by hand
    entry = next(s for s in gz_lines(path, 200) if not s.startswith("%"))  # size line
    lines = gz_lines(path, 400)
    first = lines[lines.index(entry) + 1].split()
    i, j, x = int(first[0]) - 1, int(first[1]) - 1, float(first[2])
    assert A[i, j] == pytest.approx(x) and A[j, i] == pytest.approx(x if symmetric else A[j, i])


def test_ap_corpus(data_dir):
    vocab = gz_lines(data_dir / "bow/ap_vocab.txt.gz", 10**6)
    assert len(vocab) == 10473
    path = data_dir / "bow/ap.dat.gz"
    A = load_ldac(path, n_terms=len(vocab))
    assert A.shape == (2246, 10473) and A.nnz == 302031 and A.dtype == np.float32
    assert A.sum() == 435838
    lengths = np.diff(A.indptr)
    assert lengths.min() == 2 and lengths.max() == 409
    assert (load_ldac(path) != A).nnz == 0  # largest id + 1 is the vocabulary size here
    assert (load_bow(path) != A).nnz == 0
    tokens = gz_lines(path, 1)[0].split()
    assert lengths[0] == int(tokens[0])
    for pair in tokens[1:6]:
        term, count = map(int, pair.split(":"))
        assert A[0, term] == count


def test_movielens(data_dir):
    path = data_dir / "ratings/ml-latest-small-2016_ratings.csv.gz"
    R = load_ratings(path)
    assert isinstance(R, Ratings)
    A = R.matrix
    assert A.shape == (671, 9066) and A.nnz == 100004 and A.dtype == np.float32
    assert A.data.min() == 0.5 and A.data.max() == 5.0
    assert np.all(A.data * 2 == np.round(A.data * 2))  # half stars
    assert R.user_ids[0] == 1 and R.user_ids[-1] == 671 and R.item_ids[-1] == 163949
    assert np.all(np.diff(R.item_ids) > 0)
    lines = gz_lines(path, 4)
    assert lines[0].startswith("userId,movieId,rating,timestamp")
    for line in lines[1:]:
        u, m, r = line.split(",")[:3]
        i = np.searchsorted(R.user_ids, int(u))
        j = np.searchsorted(R.item_ids, int(m))
        assert A[i, j] == float(r)


def test_10x_visium(data_dir):
    folder = data_dir / "singlecell/visium_mouse_spaceranger3"
    t = load_10x(folder)
    assert isinstance(t, TenX)
    assert t.matrix.shape == (19465, 2898) and t.matrix.nnz == 1069459
    assert np.issubdtype(t.matrix.dtype, np.integer)
    assert np.diff(t.matrix.indptr).max() == 2686
    assert t.features.shape == (19465, 3) and t.barcodes.shape == (2898,)
    assert list(t.features[0]) == gz_lines(folder / "features.tsv.gz", 1)[0].split("\t")
    assert t.barcodes[0] == gz_lines(folder / "barcodes.tsv.gz", 1)[0]
    lines = gz_lines(folder / "matrix.mtx.gz", 4)
    assert lines[1].startswith("%metadata_json")
    i, j, x = map(int, lines[3].split())
    assert t.matrix[i - 1, j - 1] == x


def test_mnist(data_dir):
    ipath = data_dir / "vectors/mnist_t10k-images-idx3-ubyte.gz"
    lpath = data_dir / "vectors/mnist_t10k-labels-idx1-ubyte.gz"
    X = load_idx(ipath)
    y = load_idx(lpath)
    assert X.shape == (10000, 784) and X.dtype == np.uint8
    assert y.shape == (10000,) and y.dtype == np.uint8 and set(np.unique(y)) == set(range(10))
    assert load_idx(ipath, flatten=False).shape == (10000, 28, 28)
    raw = gzip.decompress(ipath.read_bytes())
    assert struct.unpack(">IIII", raw[:16]) == (0x803, 10000, 28, 28)
    assert bytes(X[0]) == raw[16 : 16 + 784] and bytes(X[-1]) == raw[-784:]
    assert y[0] == gzip.decompress(lpath.read_bytes())[8]


def test_kmnist(data_dir):
    X = load_npz_array(data_dir / "vectors/kmnist-test-imgs.npz", flatten=False)
    y = load_npz_array(data_dir / "vectors/kmnist-test-labels.npz")
    assert X.shape == (10000, 28, 28) and X.dtype == np.uint8
    # images as rows by default, as load_idx gives MNIST's
    np.testing.assert_array_equal(load_npz_array(data_dir / "vectors/kmnist-test-imgs.npz"),
                                  X.reshape(10000, 784))
    assert y.shape == (10000,) and set(np.unique(y)) == set(range(10))


@pytest.mark.parametrize(
    "rel, fmt",
    [
        ("graphs/facebook_combined.txt.gz", "snap"),
        ("graphs/soc-Slashdot0902.txt.gz", "snap"),
        ("graphs/ca-HepPh.txt.gz", "snap"),
        ("matrices/memplus.mtx.gz", "matrix-market"),
        ("bow/ap.dat.gz", "ldac"),
        ("ratings/ml-latest-small-2016_ratings.csv.gz", "ratings"),
        ("singlecell/visium_mouse_spaceranger3", "10x"),
        ("vectors/mnist_t10k-images-idx3-ubyte.gz", "idx"),
        ("vectors/mnist_t10k-labels-idx1-ubyte.gz", "idx"),
        ("vectors/kmnist-test-labels.npz", "npz"),
    ],
)
def test_detect_real(data_dir, rel, fmt):
    assert detect_format(data_dir / rel) == fmt


# ======================================================================================
# SNAP, synthetic
# ======================================================================================

SNAP_TEXT = "#sdsad\n# FromNodeId\tToNodeId\r\n0\t1\r\n1 2\r\n1  2\r\n\n2 2\r\n#asdad\n4 0"


@pytest.mark.parametrize("gz", [False, True])
def test_snap_quirks(tmp_path, gz):
    path = write(tmp_path, "g.txt" + ".gz" * gz, SNAP_TEXT, gz=gz)
    A = load_snap(path)
    expect = np.zeros((5, 5))
    expect[0, 1] = expect[1, 2] = expect[2, 2] = expect[4, 0] = 1
    assert A.dtype == np.float32 and A.has_canonical_format
    np.testing.assert_array_equal(A.toarray(), expect)
    np.testing.assert_array_equal(
        load_snap(path, self_loops=False).toarray(), expect - np.diag([0, 0, 1, 0, 0])
    )
    S = load_snap(path, symmetric=True, dtype=np.float64)
    assert S.dtype == np.float64
    np.testing.assert_array_equal(S.toarray(), np.maximum(expect, expect.T))


def test_snap_relabel_ids(tmp_path):
    path = write(tmp_path, "g.txt", "42 5\n5 10\n10 42\n5 10\n")
    A, ids = load_snap(path, relabel=True, return_ids=True)
    np.testing.assert_array_equal(ids, [5, 10, 42])
    np.testing.assert_array_equal(A.toarray(), [[0, 1, 0], [0, 0, 1], [1, 0, 0]])
    coo = A.tocoo()
    assert sorted(zip(ids[coo.row], ids[coo.col], strict=True)) == [(5, 10), (10, 42), (42, 5)]
    B, plain = load_snap(path, return_ids=True)
    assert B.shape == (43, 43) and np.array_equal(plain, np.arange(43))


def test_sizes_are_weighed_against_the_memory_available(tmp_path, monkeypatch):
    """With 1 MiB available, a SNAP id of a million (16 MB of ids and row pointers) and a
    docword of a million documents are refused with the numbers, before allocating."""
    import types

    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=1 << 20))
    with pytest.raises(ValueError, match=r"node id 1000000 would need 15\.3 MiB .* more than "
                                         r"the 1\.0 MiB available; pass relabel=True"):
        load_snap(write(tmp_path, "g.txt", "0 1000000\n"))
    assert load_snap(write(tmp_path, "g.txt", "0 1000000\n"), relabel=True).shape == (2, 2)
    with pytest.raises(MalformedFileError, match=r"^d\.txt line 1: expected a document count D "
                                                 r"whose row pointers fit .* found 1,000,000"):
        load_docword(write(tmp_path, "d.txt", "1000000\n5\n1\n1 1 1\n"))


def test_snap_empty_and_huge_ids(tmp_path):
    assert load_snap(write(tmp_path, "e.txt", "# nothing\n")).shape == (0, 0)
    big = write(tmp_path, "big.txt", "0 9000000000\n")
    with pytest.raises(ValueError, match="relabel=True"):
        load_snap(big)
    assert load_snap(big, relabel=True).shape == (2, 2)


@pytest.mark.parametrize(
    "text, line, found",
    [
        ("0 1\n# c\n2 x\n", 3, "'2 x'"),
        ("0 1\r\n1 2 3\r\n", 2, "'1 2 3'"),
        ("#h\n0 1\n\n7\n", 4, "'7'"),
        ("0 1\n1.5 2\n", 2, "'1.5 2'"),
        ("0 1\n1 2\n-1 2\n", 3, "'-1 2'"),
    ],
)
def test_snap_malformed(tmp_path, text, line, found):
    path = write(tmp_path, "bad.txt", text)
    with pytest.raises(
        MalformedFileError,
        match=rf"^bad\.txt line {line}: expected an edge 'u v' .*non-negative integers.*found {re.escape(found)}",
    ) as err:
        load_snap(path)
    assert err.value.line == line and err.value.path == path


@settings(max_examples=40, deadline=None)
@given(
    edges=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=60),
    sep=st.sampled_from([" ", "\t", "  "]),
    eol=st.sampled_from(["\n", "\r\n"]),
    header=st.booleans(),
    symmetric=st.booleans(),
    self_loops=st.booleans(),
    trailing=st.booleans(),
)
def test_snap_matches_reference(edges, sep, eol, header, symmetric, self_loops, trailing):
    text = ("# Nodes: x Edges: y" + eol) * header
    text += eol.join(f"{u}{sep}{v}" for u, v in edges) + eol * trailing
    n = 1 + max((max(e) for e in edges), default=-1)
    ref = np.zeros((n, n), dtype=np.float32)
    for u, v in edges:
        if u != v or self_loops:
            ref[u, v] = 1
            if symmetric:
                ref[v, u] = 1
    with tempfile.TemporaryDirectory() as d:
        A = load_snap(write(Path(d), "g.txt", text), symmetric=symmetric, self_loops=self_loops)
    assert A.has_canonical_format
    np.testing.assert_array_equal(A.toarray(), ref)


# ======================================================================================
# Errors shared by all readers
# ======================================================================================


@pytest.mark.parametrize(
    "loader, name, content",
    [
        (load_snap, "g.txt.gz", "0 1\n" * 5000),
        (load_matrix_market, "m.mtx.gz", "%%MatrixMarket matrix coordinate real general\n" * 900),
        (load_ldac, "c.dat.gz", "1 0:1\n" * 5000),
        (load_docword, "docword.x.txt.gz", "1\n1\n1\n" + "1 1 1\n" * 5000),
        (load_ratings, "u.data.gz", "1\t2\t3\t4\n" * 5000),
        (load_idx, "x-ubyte.gz", struct.pack(">HBBI", 0, 8, 1, 5000) + bytes(5000)),
        (load, "g.txt.gz", "0 1\n" * 5000),
    ],
)
def test_truncated_gzip(tmp_path, loader, name, content):
    path = truncated_gz(tmp_path, name, content)
    with pytest.raises(
        MalformedFileError,
        match=rf"^{re.escape(name)}: expected a complete gzip stream, found a truncated",
    ):
        loader(path)


def test_corrupt_gzip(tmp_path):
    blob = bytearray(gzip.compress(b"0 1\n" * 100, mtime=0))
    blob[12:20] = b"\xff" * 8
    path = write(tmp_path, "g.txt.gz", bytes(blob))
    with pytest.raises(MalformedFileError, match=r"^g\.txt\.gz: expected a complete gzip"):
        load_snap(path)


@pytest.mark.parametrize(
    "loader",
    [
        load_snap,
        load_matrix_market,
        load_ldac,
        load_docword,
        load_bow,
        load_ratings,
        load_idx,
        load_npz_array,
        load_10x,
        load,
    ],
)
def test_missing_file(tmp_path, loader):
    with pytest.raises(FileNotFoundError, match="nope"):
        loader(tmp_path / "nope")


def test_not_utf8(tmp_path):
    path = write(tmp_path, "g.txt", b"0 1\n1 2\n\xff\xfe 3\n")
    with pytest.raises(
        MalformedFileError, match=r"^g\.txt line 3: expected UTF-8 text, found byte 0xff"
    ):
        load_snap(path)


# ======================================================================================
# Matrix Market, synthetic
# ======================================================================================

MM_GENERAL = """%%MatrixMarket matrix coordinate real general
% a comment
3 4 3
1 1 1.5
3 4 -2
2 1 0.25
"""


@pytest.mark.parametrize("gz", [False, True])
def test_mm_general(tmp_path, gz):
    A = load_matrix_market(write(tmp_path, "m.mtx" + ".gz" * gz, MM_GENERAL, gz=gz))
    assert isinstance(A, sp.csr_matrix) and A.dtype == np.float64
    np.testing.assert_array_equal(A.toarray(), [[1.5, 0, 0, 0], [0.25, 0, 0, 0], [0, 0, 0, -2]])


def test_mm_symmetric_integer_pattern(tmp_path):
    sym = "%%MatrixMarket matrix coordinate integer symmetric\n3 3 3\n1 1 4\n3 1 7\n3 2 1\n"
    A = load_matrix_market(write(tmp_path, "s.mtx", sym))
    assert np.issubdtype(A.dtype, np.integer) and A.nnz == 5
    np.testing.assert_array_equal(A.toarray(), [[4, 0, 7], [0, 0, 1], [7, 1, 0]])
    pat = "%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 2\n2 1\n"
    np.testing.assert_array_equal(
        load_matrix_market(write(tmp_path, "p.mtx", pat)).toarray(), [[0, 1], [1, 0]]
    )


@pytest.mark.parametrize(
    "text, pattern",
    [
        (
            "hello\n1 1 1\n",
            r"^m\.mtx line 1: expected a '%%MatrixMarket matrix \.\.\.' banner, found 'hello'",
        ),
        (
            MM_GENERAL.replace("3 4 -2", "5 4 -2"),
            r"^m\.mtx line 5: expected a valid Matrix Market line, found .*[Rr]ow index",
        ),
        (
            MM_GENERAL.replace("3 4 -2", "3 x -2"),
            r"^m\.mtx line 5: expected a valid Matrix Market line, found .*[Ii]nvalid",
        ),
        (
            MM_GENERAL.replace("3 4 3", "3 4 9"),
            r"^m\.mtx: expected a valid Matrix Market file, found .*[Tt]runcated",
        ),
        (
            MM_GENERAL.replace("coordinate", "foo"),
            r"^m\.mtx line 1: expected a valid Matrix Market line",
        ),
    ],
)
def test_mm_malformed(tmp_path, text, pattern):
    with pytest.raises(MalformedFileError, match=pattern):
        load_matrix_market(write(tmp_path, "m.mtx", text))


@pytest.mark.parametrize(
    "text, pattern",
    [
        (
            MM_GENERAL.replace("3 4 3", "3 4 900000000000"),
            r"^m\.mtx line 3: expected a size line whose 900,000,000,000 entries fit in the \d+ "
            r"bytes that follow it, found '3 4 900000000000'",
        ),
        (
            "%%MatrixMarket matrix array real general\n100000 100000\n1\n2\n",
            r"^m\.mtx line 2: expected a size line whose 10,000,000,000 entries fit in the 4 "
            r"bytes",
        ),
        (
            "%%MatrixMarket matrix array real symmetric\n200000 200000\n1\n",
            r"^m\.mtx line 2: expected a size line whose 20,000,000,000 entries",
        ),
        (
            MM_GENERAL.replace("3 4 3", "1000000000000000 4 3"),
            r"^m\.mtx line 3: expected a row count whose row pointers fit in the [\d,.]+ GiB of "
            r"memory available, found 1,000,000,000,000,000 \([\d,.]+ GiB of row pointers\)",
        ),
    ],
)
def test_mm_sizes_beyond_the_file_are_refused_before_allocating(tmp_path, text, pattern):
    """A size line that declares more entries than the rest of the file can spell, or more
    rows than memory can index, is refused from the header (scipy would first allocate
    terabytes); plain and gzip alike."""
    import tracemalloc

    for name in ("m.mtx", "m.mtx.gz"):
        path = write(tmp_path, name, text, gz=name.endswith(".gz"))
        tracemalloc.start()
        where = pattern.replace("m\\.mtx", name.replace(".", "\\."))
        with pytest.raises(MalformedFileError, match=where):
            load_matrix_market(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 1 << 24, peak


# ======================================================================================
# Bag of words, synthetic
# ======================================================================================

DOCWORD = "4\n5\n5\n1 1 2\n1 3 1\n3 5 4\n1 3 2\n4 2 1\n"


@pytest.mark.parametrize("gz", [False, True])
def test_docword(tmp_path, gz):
    path = write(tmp_path, "docword.t.txt" + ".gz" * gz, DOCWORD, gz=gz)
    A = load_docword(path)
    assert A.shape == (4, 5) and A.dtype == np.float32 and A.has_canonical_format
    expect = np.zeros((4, 5))
    expect[0, 0], expect[0, 2], expect[2, 4], expect[3, 1] = 2, 3, 4, 1  # (1,3) summed
    np.testing.assert_array_equal(A.toarray(), expect)
    assert (load_bow(path) != A).nnz == 0 and detect_format(path) == "docword"


@pytest.mark.parametrize(
    "text, pattern",
    [
        (
            DOCWORD.replace("5\n5\n", "5\n7\n", 1),
            r"^d\.txt line 3: expected NNZ=7 'docID wordID count' lines as declared here, found 5$",
        ),
        (
            DOCWORD.replace("3 5 4", "3 6 4"),
            r"^d\.txt line 6: expected wordID in 1\.\.W \(W=5\), found 6 in '3 6 4'",
        ),
        (
            DOCWORD.replace("3 5 4", "0 5 4"),
            r"^d\.txt line 6: expected docID in 1\.\.D \(D=4, W=5\), found 0",
        ),
        (
            DOCWORD.replace("3 5 4", "3 5 x"),
            r"^d\.txt line 6: expected 'docID wordID count' \(3 non-negative integers\), found '3 5 x'",
        ),
        (
            DOCWORD.replace("1 3 2", "1 3"),
            r"^d\.txt line 7: expected 'docID wordID count' \(3 non-negative integers\), found '1 3'",
        ),
        (
            DOCWORD.replace("1 3 2", "1 3 -2"),
            r"^d\.txt line 7: expected 'docID wordID count' \(non-negative integers\), found '1 3 -2'",
        ),
        (
            "4\nW\n5\n",
            r"^d\.txt line 2: expected the header count W \(one non-negative integer\), found 'W'",
        ),
        ("4\n5\n", r"^d\.txt line 3: expected the header count NNZ .*found end of file"),
        (
            DOCWORD.replace("4\n", "1000000000000000\n", 1),
            r"^d\.txt line 1: expected a document count D whose row pointers fit in the [\d,.]+ "
            r"GiB of memory available, found 1,000,000,000,000,000",
        ),
    ],
)
def test_docword_malformed(tmp_path, text, pattern):
    with pytest.raises(MalformedFileError, match=pattern):
        load_docword(write(tmp_path, "d.txt", text))


LDAC = "2 0:1 3:2\r\n3 1:1 1:2 4:1\r\n0\r\n1 2:5\r\n\r\n"


@pytest.mark.parametrize("gz", [False, True])
def test_ldac(tmp_path, gz):
    path = write(tmp_path, "c.dat" + ".gz" * gz, LDAC, gz=gz)
    A = load_ldac(path)
    assert A.dtype == np.float32 and A.has_canonical_format
    expect = [[1, 0, 0, 2, 0], [0, 3, 0, 0, 1], [0, 0, 0, 0, 0], [0, 0, 5, 0, 0]]
    np.testing.assert_array_equal(A.toarray(), expect)
    B = load_ldac(path, n_terms=7)
    assert B.shape == (4, 7) and (B[:, :5] != A).nnz == 0
    assert (load_bow(path) != A).nnz == 0 and detect_format(path) == "ldac"


@pytest.mark.parametrize(
    "text, pattern",
    [
        (
            "2 0:1 3:2\n3 1:1 4:1\n",
            r"^ap\.dat line 2: expected 'N id:count \.\.\.' with N=3 pairs, found 2$",
        ),
        ("2 0:1 3:2\n1 1:x\n", r"^ap\.dat line 2: expected 'N id:count \.\.\.', found '1 1:x'$"),
        (
            "2 0:1 3:2\n\n1 1:1\n",
            r"^ap\.dat line 2: expected 'N id:count \.\.\.', found an empty line$",
        ),
        ("1 0:1\n1 -1:2\n", r"^ap\.dat line 2: expected 'N id:count \.\.\.', found '1 -1:2'$"),
        (
            "1 0:1\n2 1:1 2:1:1\n",
            r"^ap\.dat line 2: expected 'N id:count \.\.\.', found '2 1:1 2:1:1'$",
        ),
        ("1 0:1\n1 1:99999999999999999999\n", r"^ap\.dat line 2: expected 'N id:count \.\.\.'"),
    ],
)
def test_ldac_malformed(tmp_path, text, pattern):
    with pytest.raises(MalformedFileError, match=pattern):
        load_ldac(write(tmp_path, "ap.dat", text))


def test_ldac_n_terms_too_small(tmp_path):
    with pytest.raises(
        MalformedFileError,
        match=r"^c\.dat line 2: expected term ids in 0\.\.3 \(n_terms=4\), found 4$",
    ):
        load_ldac(write(tmp_path, "c.dat", "1 0:1\n2 1:1 4:1\n"), n_terms=4)


def test_bow_undetectable(tmp_path):
    with pytest.raises(ValueError, match="cannot tell the bag-of-words format.*docword.*LDA-C"):
        load_bow(write(tmp_path, "x.txt", "hello world\n"))
    with pytest.raises(ValueError, match="contradicts the docword header"):
        load_bow(write(tmp_path, "docword.t.txt", DOCWORD), n_terms=9)


@settings(max_examples=30, deadline=None)
@given(
    docs=st.lists(
        st.lists(st.tuples(st.integers(0, 20), st.integers(0, 9)), max_size=8), max_size=12
    )
)
def test_ldac_matches_reference(docs):
    text = "".join(f"{len(d)}" + "".join(f" {t}:{c}" for t, c in d) + "\n" for d in docs)
    n_terms = 21
    ref = np.zeros((len(docs), n_terms), dtype=np.float32)
    for i, d in enumerate(docs):
        for t, c in d:
            ref[i, t] += c
    with tempfile.TemporaryDirectory() as tmp:
        A = load_ldac(write(Path(tmp), "c.dat", text), n_terms=n_terms)
    np.testing.assert_array_equal(A.toarray(), ref)


# ======================================================================================
# Ratings, synthetic
# ======================================================================================

TRIPLETS = [(196, 242, 3.0), (186, 302, 3.0), (22, 377, 1.0), (196, 51, 2.5), (22, 51, 5.0)]


def ratings_files(tmp_path: Path) -> dict[str, Path]:
    ud = "".join(f"{u}\t{i}\t{r:g}\t88125094{k}\n" for k, (u, i, r) in enumerate(TRIPLETS))
    dat = "".join(f"{u}::{i}::{r:g}::97830{k}\n" for k, (u, i, r) in enumerate(TRIPLETS))
    csv = "userId,movieId,rating,timestamp,,,,\n" + "".join(
        f"{u},{i},{r:g},126075914{k},,,,\n" for k, (u, i, r) in enumerate(TRIPLETS)
    )
    return {
        "u.data": write(tmp_path, "u.data", ud),
        "ratings.dat": write(tmp_path, "ratings.dat", dat),
        "ratings.csv.gz": write(tmp_path, "ratings.csv.gz", csv.rstrip("\n"), gz=True),
    }


@pytest.mark.parametrize("which", ["u.data", "ratings.dat", "ratings.csv.gz"])
def test_ratings_formats(tmp_path, which):
    path = ratings_files(tmp_path)[which]
    R = load_ratings(path)
    np.testing.assert_array_equal(R.user_ids, [22, 186, 196])
    np.testing.assert_array_equal(R.item_ids, [51, 242, 302, 377])
    A = R.matrix
    assert A.dtype == np.float32 and A.shape == (3, 4) and A.has_canonical_format
    coo = A.tocoo()
    got = sorted(zip(R.user_ids[coo.row], R.item_ids[coo.col], coo.data, strict=True))
    assert got == sorted(TRIPLETS)
    assert detect_format(path) == "ratings"


def test_ratings_duplicates_keep_last_and_zero_kept(tmp_path, caplog):
    path = write(tmp_path, "u.data", "1\t10\t4\t0\n2\t10\t0\t0\n1\t10\t2\t0\n1\t11\t1\t0\n")
    with caplog.at_level(logging.WARNING, logger="mgpu.io"):
        R = load_ratings(path)
    assert "1 (user, item) pairs are rated more than once; kept the last" in caplog.text
    A = R.matrix
    assert A.nnz == 3  # the rating 0 is stored, the repeated pair once
    np.testing.assert_array_equal(A.toarray(), [[2, 1], [0, 0]])
    coo = A.tocoo()
    assert sorted(zip(coo.row, coo.col, coo.data, strict=True)) == [
        (0, 0, 2.0),
        (0, 1, 1.0),
        (1, 0, 0.0),
    ]


@pytest.mark.parametrize(
    "text, pattern",
    [
        (
            "userId,movieId,rating,timestamp\n1,2,3,4\n1,x,3,4\n",
            r"^r\.csv line 3: expected 'user item rating \.\.\.' .*found '1,x,3,4'",
        ),
        (
            "userId,movieId,rating\n1,2,3\n1,2\n",
            r"^r\.csv line 3: expected 'user item rating \.\.\.'.*found '1,2'",
        ),
        ("1,2,3\n1,2.5,3\n", r"^r\.csv line 2: expected 'user item rating \.\.\.'"),
        (
            "1,2,3\n-1,2,3\n",
            r"^r\.csv line 2: expected non-negative integer ids and a finite rating, found user=-1",
        ),
        (
            "h\n1,2,3\n\n1,2,nan\n",
            r"^r\.csv line 4: expected non-negative integer ids and a finite rating, found .*rating=nan",
        ),
    ],
)
def test_ratings_malformed(tmp_path, text, pattern):
    with pytest.raises(MalformedFileError, match=pattern):
        load_ratings(write(tmp_path, "r.csv", text))


# ======================================================================================
# 10x, synthetic
# ======================================================================================

TENX_MTX = """%%MatrixMarket matrix coordinate integer general
%metadata_json: {"software_version": "spaceranger-3.0.0", "format_version": 2}
3 2 4
1 1 3
3 1 1
2 2 7
3 2 2
"""
FEATURES = "G1\tXkr4\tGene Expression\nG2\tRp1\tGene Expression\nG3\tSox17\tGene Expression\n"
BARCODES = "AAAC-1\nAAAG-1\n"


def make_10x(
    folder: Path, *, gz: bool = True, features: str = FEATURES, fname: str = "features.tsv"
) -> Path:
    folder.mkdir()
    ext = ".gz" if gz else ""
    write(folder, "matrix.mtx" + ext, TENX_MTX, gz=gz)
    write(folder, fname + ext, features, gz=gz)
    write(folder, "barcodes.tsv" + ext, BARCODES, gz=gz)
    return folder


def test_10x(tmp_path):
    t = load_10x(make_10x(tmp_path / "f"))
    np.testing.assert_array_equal(t.matrix.toarray(), [[3, 0], [0, 7], [1, 2]])
    assert t.features.shape == (3, 3) and t.features[2, 1] == "Sox17"
    assert list(t.barcodes) == ["AAAC-1", "AAAG-1"]
    assert detect_format(tmp_path / "f") == "10x"


def test_10x_genes_tsv_plain(tmp_path):
    genes = "".join(line.rsplit("\t", 1)[0] + "\n" for line in FEATURES.splitlines())
    t = load_10x(make_10x(tmp_path / "f", gz=False, features=genes, fname="genes.tsv"))
    assert t.features.shape == (3, 2) and t.features[0, 0] == "G1"


def test_10x_malformed(tmp_path):
    short = "".join(FEATURES.splitlines(keepends=True)[:2])
    with pytest.raises(
        MalformedFileError,
        match=r"^matrix\.mtx\.gz line 3: expected 2 rows \(one per line of features\.tsv\.gz\), found 3$",
    ):
        load_10x(make_10x(tmp_path / "a", features=short))
    ragged = FEATURES.replace("G2\tRp1\tGene Expression", "G2\tRp1")
    with pytest.raises(
        MalformedFileError, match=r"^features\.tsv\.gz line 2: expected 3 tab-separated fields"
    ):
        load_10x(make_10x(tmp_path / "b", features=ragged))
    folder = make_10x(tmp_path / "c")
    (folder / "barcodes.tsv.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"barcodes\.tsv\[\.gz\]"):
        load_10x(folder)


# ======================================================================================
# IDX and npz, synthetic
# ======================================================================================


def idx_bytes(arr: np.ndarray, code: int) -> bytes:
    return (
        struct.pack(">HBB", 0, code, arr.ndim)
        + struct.pack(f">{arr.ndim}I", *arr.shape)
        + (arr.astype(arr.dtype.newbyteorder(">")).tobytes())
    )


@pytest.mark.parametrize("gz", [False, True])
def test_idx(tmp_path, gz):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, size=(7, 4, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=7, dtype=np.uint8)
    ip = write(tmp_path, "x-images-idx3-ubyte" + ".gz" * gz, idx_bytes(imgs, 0x08), gz=gz)
    lp = write(tmp_path, "x-labels-idx1-ubyte" + ".gz" * gz, idx_bytes(labels, 0x08), gz=gz)
    X = load_idx(ip)
    assert X.shape == (7, 12) and X.dtype == np.uint8
    np.testing.assert_array_equal(X, imgs.reshape(7, 12))
    np.testing.assert_array_equal(load_idx(ip, flatten=False), imgs)
    np.testing.assert_array_equal(load_idx(lp), labels)
    X[0, 0] = 1  # writable
    assert detect_format(ip) == "idx"


@pytest.mark.parametrize(
    "dtype, code",
    [(np.int8, 0x09), (np.int16, 0x0B), (np.int32, 0x0C), (np.float32, 0x0D), (np.float64, 0x0E)],
)
def test_idx_dtypes(tmp_path, dtype, code):
    a = np.array([[-3, 100], [7, -100]], dtype=dtype)
    X = load_idx(write(tmp_path, "a-idx2", idx_bytes(a, code)))
    assert X.dtype == np.dtype(dtype) and X.dtype.isnative
    np.testing.assert_array_equal(X, a)


@pytest.mark.parametrize(
    "blob, pattern",
    [
        (
            struct.pack(">HBBIII", 0, 8, 3, 10, 28, 28) + bytes(5000),
            r"^t\-ubyte byte 16: expected 7840 bytes of uint8 data \(10 x 28 x 28\), found 5000$",
        ),
        (
            struct.pack(">HBBI", 0, 8, 1, 3) + bytes(4),
            r"^t\-ubyte byte 8: expected 3 bytes of uint8 data \(3\), found 4$",
        ),
        (
            struct.pack(">HBBI", 0, 0x0B, 1, 3) + bytes(5),
            r"^t\-ubyte byte 8: expected 6 bytes of int16 data \(3\), found 5$",
        ),
        (
            b"\x00\x00\x07\x01" + bytes(8),
            r"^t\-ubyte byte 0: expected an IDX magic number .*found 0x00000701",
        ),
        (
            struct.pack(">HBB", 0, 8, 3) + bytes(6),
            r"^t\-ubyte byte 4: expected 3 big-endian uint32 dimensions, found 6 bytes",
        ),
        (b"\x00\x00", r"^t\-ubyte byte 0: expected an IDX magic number.*found 2 bytes"),
    ],
)
def test_idx_malformed(tmp_path, blob, pattern):
    with pytest.raises(MalformedFileError, match=pattern):
        load_idx(write(tmp_path, "t-ubyte", blob))


def test_npz(tmp_path, monkeypatch):
    calls = []
    real_load = np.load

    def spy(*args, **kw):
        calls.append(kw.get("allow_pickle"))
        return real_load(*args, **kw)

    monkeypatch.setattr(np, "load", spy)
    a, b = np.arange(12, dtype=np.uint8).reshape(3, 4), np.ones(3)
    np.savez(tmp_path / "x.npz", a, labels=b)
    np.save(tmp_path / "y.npy", b)
    np.testing.assert_array_equal(load_npz_array(tmp_path / "x.npz"), a)
    np.testing.assert_array_equal(load_npz_array(tmp_path / "x.npz", key="labels"), b)
    np.testing.assert_array_equal(load_npz_array(tmp_path / "y.npy"), b)
    with pytest.raises(
        KeyError, match=r"x\.npz has no array 'nope'; it holds \['arr_0', 'labels'\]"
    ):
        load_npz_array(tmp_path / "x.npz", key="nope")
    np.savez(tmp_path / "obj.npz", np.array([{"a": 1}], dtype=object))
    with pytest.raises(
        MalformedFileError,
        match=r"^obj\.npz: expected a NumPy \.npz/\.npy file without object arrays, found .*allow_pickle",
    ):
        load_npz_array(tmp_path / "obj.npz")
    write(tmp_path, "t.npz", "0 1\n")
    with pytest.raises(MalformedFileError, match=r"^t\.npz: expected a NumPy"):
        load_npz_array(tmp_path / "t.npz")
    raw = (tmp_path / "x.npz").read_bytes()
    write(tmp_path, "cut.npz", raw[: len(raw) // 2])
    with pytest.raises(MalformedFileError, match=r"^cut\.npz: expected a NumPy"):
        load_npz_array(tmp_path / "cut.npz")
    assert calls and all(c is False for c in calls)
    assert detect_format(tmp_path / "x.npz") == "npz" and detect_format(tmp_path / "y.npy") == "npz"


# ======================================================================================
# load() and detection, synthetic
# ======================================================================================


def test_load_dispatch(tmp_path, caplog):
    snap = write(tmp_path, "g.txt.gz", SNAP_TEXT, gz=True)
    mm = write(tmp_path, "m.mtx", MM_GENERAL)
    ldac = write(tmp_path, "c.dat", LDAC)
    dw = write(tmp_path, "docword.t.txt", DOCWORD)
    idx = write(tmp_path, "l-ubyte", idx_bytes(np.arange(3, dtype=np.uint8), 8))
    np.savez(tmp_path / "v.npz", np.eye(2))
    tenx = make_10x(tmp_path / "tenx")
    rat = ratings_files(tmp_path)
    with caplog.at_level(logging.INFO, logger="mgpu.io"):
        assert load(snap, symmetric=True).nnz == 7
    assert "detected format 'snap'" in caplog.text
    assert load(mm).shape == (3, 4)
    assert load(ldac).shape == (4, 5)
    assert load(dw).shape == (4, 5)
    np.testing.assert_array_equal(load(idx), [0, 1, 2])
    np.testing.assert_array_equal(load(tmp_path / "v.npz"), np.eye(2))
    assert isinstance(load(tenx), TenX)
    for p in rat.values():
        assert isinstance(load(p), Ratings)
    assert load(ldac, fmt="ldac", n_terms=9).shape == (4, 9)


def test_load_unknown(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"^x\.bin: cannot tell its format.*Supported formats: matrix-market.*10x.*idx.*npz.*ratings.*docword.*ldac.*snap",
    ):
        load(write(tmp_path, "x.bin", "hello there\nworld\n"))
    with pytest.raises(ValueError, match="cannot tell"):
        load(write(tmp_path, "empty.txt", ""))
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="not a 10x matrix folder"):
        load(tmp_path / "d")
    with pytest.raises(
        ValueError,
        match=r"The 'fmt' parameter of load must be one of \[.*'snap'.*\]\. Got 'csv' instead",
    ):
        load(write(tmp_path, "g.txt", "0 1\n"), fmt="csv")


def test_error_attributes():
    err = MalformedFileError("/some/where/ap.dat", 17, "'N id:count ...' with N=12 pairs", "11")
    assert str(err) == "ap.dat line 17: expected 'N id:count ...' with N=12 pairs, found 11"
    assert isinstance(err, ValueError) and err.line == 17 and err.path == Path("/some/where/ap.dat")
    assert str(MalformedFileError("x", None, "a", "b", byte=4)) == "x byte 4: expected a, found b"


def test_empty_inputs(tmp_path):
    R = load_ratings(write(tmp_path, "r.csv", "userId,movieId,rating\n"))
    assert R.matrix.shape == (0, 0) and R.user_ids.size == 0
    assert load_ldac(write(tmp_path, "c.dat", "\n\n"), n_terms=5).shape == (0, 5)
    assert load_docword(write(tmp_path, "d.txt", "0\n5\n0\n")).shape == (0, 5)


def test_error_pickles():
    import pickle

    for err in (
        MalformedFileError("d/ap.dat", 3, "x", "y"),
        MalformedFileError("f", None, "a", "b", byte=8),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is MalformedFileError and str(back) == str(err)
        assert (back.line, back.byte, back.path) == (err.line, err.byte, err.path)


def test_crlf_and_blank_lines_in_csv(tmp_path):
    R = load_ratings(write(tmp_path, "r.csv", "userId,movieId,rating\r\n1,2,3.5\r\n\r\n2,2,4\r\n"))
    np.testing.assert_array_equal(R.matrix.toarray(), [[3.5], [4]])
    with pytest.raises(MalformedFileError, match=r"^r\.csv line 3: expected 'user item rating"):
        load_ratings(write(tmp_path, "r.csv", "1,2,3\n2,2,4\n  \n3,2,1\n"))


@pytest.mark.parametrize("bad", [-1, 2.5, "7", True])
def test_ldac_bad_n_terms(tmp_path, bad):
    path = write(tmp_path, "c.dat", LDAC)
    with pytest.raises(
        ValueError,
        match=r"The 'n_terms' parameter of load_ldac must be a non-negative int or None\. Got",
    ):
        load_ldac(path, n_terms=bad)


def test_module_imports_no_gpu_or_dask():
    src = "\n".join(f.read_text() for f in sorted(Path(mio.__file__).parent.glob("*.py")))
    assert not re.search(r"^\s*(import|from)\s+(cupy|dask|distributed)\b", src, re.M)
    assert "allow_pickle=True" not in src and "pickle.load" not in src


# ======================================================================================
# Fuzzed files: truncated, bytes flipped, inserted and deleted, plain and gzip
# ======================================================================================

def _npz_bytes(*, compressed: bool = False, npy: bool = False) -> bytes:
    buf = io.BytesIO()
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    if npy:
        np.save(buf, a)
    else:
        (np.savez_compressed if compressed else np.savez)(buf, a)
    return buf.getvalue()


# One small valid file per format; the numbers stay small so that a mutation (at most a few
# inserted digits) can grow an id or a dimension to thousands, not to an allocation that
# would take the machine's memory.
_FUZZ_SEEDS = {
    "snap": ("g.txt", b"# Directed graph\n# Nodes: 4\n0 1\n1\t2\n2 0\n3 3\n1 2\n"),
    "matrix-market": ("m.mtx", MM_GENERAL.encode()),
    "mm-symmetric": ("s.mtx", b"%%MatrixMarket matrix coordinate integer symmetric\n"
                              b"3 3 3\n1 1 4\n3 1 7\n3 2 1\n"),
    "mm-array": ("a.mtx", b"%%MatrixMarket matrix array real general\n2 2\n1.5\n0\n-2\n3\n"),
    "ldac": ("c.dat", b"2 0:1 3:2\n0\n1 5:7\n3 1:1 2:1 4:9\n"),
    "docword": ("docword.t.txt", b"3\n5\n4\n1 1 2\n1 4 1\n2 5 3\n3 2 1\n"),
    "u.data": ("u.data", b"1\t10\t4\t881250949\n2\t10\t3.5\t881250950\n1\t20\t5\t1\n"),
    "ratings.dat": ("ratings.dat", b"1::10::4::978300760\n2::20::3::978302109\n"),
    "ratings.csv": ("ratings.csv", b"userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n"
                                   b"1,1029,3.0,1260759179\n7,31,4.0,1\n"),
    "idx": ("t-images-idx3-ubyte", struct.pack(">HBBIII", 0, 8, 3, 2, 2, 3) + bytes(range(12))),
    "idx-f8": ("v-idx2-ubyte", struct.pack(">HBBII", 0, 0x0E, 2, 2, 2)
               + np.arange(4, dtype=">f8").tobytes()),
    "npz": ("x.npz", _npz_bytes(compressed=False)),
    "npz-deflate": ("z.npz", _npz_bytes(compressed=True)),
    "npy": ("x.npy", _npz_bytes(npy=True)),
}
_FUZZ_LOADERS = {
    "snap": [load_snap, load],
    "matrix-market": [load_matrix_market, load],
    "mm-symmetric": [load_matrix_market],
    "mm-array": [load_matrix_market],
    "ldac": [load_ldac, load_bow, load],
    "docword": [load_docword, load_bow, load],
    "u.data": [load_ratings, load],
    "ratings.dat": [load_ratings],
    "ratings.csv": [load_ratings, load],
    "idx": [load_idx, load],
    "idx-f8": [load_idx],
    "npz": [load_npz_array, load],
    "npz-deflate": [load_npz_array],
    "npy": [load_npz_array, load],
}


@st.composite
def _mutations(draw, size: int) -> list[tuple[str, int, bytes]]:
    """Up to three edits of a byte string of ``size`` bytes: truncate, flip, insert, delete."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
        at = draw(st.integers(0, max(size, 1)))
        if kind == "flip":
            blob = bytes([draw(st.integers(1, 255))])
        elif kind == "insert":
            blob = draw(st.binary(min_size=1, max_size=2)
                        | st.sampled_from([b"\n", b"\r\n", b" ", b"\t", b"#", b":", b"-", b"9",
                                           b"%", b"\xff", b"\x00", b",", b"::"]))
        else:
            blob = b""
        edits.append((kind, at, blob))
    return edits


def _mutate(data: bytes, edits: list[tuple[str, int, bytes]]) -> bytes:
    for kind, at, blob in edits:
        at = min(at, len(data))
        if kind == "truncate":
            data = data[:at]
        elif kind == "flip" and at < len(data):
            data = data[:at] + bytes([data[at] ^ blob[0]]) + data[at + 1:]
        elif kind == "insert":
            data = data[:at] + blob + data[at:]
        elif kind == "delete":
            data = data[:at] + data[at + 2:]
    return data


def _snap_reference(text: str) -> np.ndarray | None:
    """The adjacency a SNAP edge list must give, parsed by hand; None if it is malformed."""
    edges = []
    for line in text.replace("\r\n", "\n").split("\n"):
        line = line.split("#", 1)[0]
        if not line.strip():
            continue
        tokens = line.split()
        if len(tokens) != 2 or not all(t.isascii() and t.isdigit() for t in tokens):
            return None
        edges.append((int(tokens[0]), int(tokens[1])))
    n = 1 + max((max(e) for e in edges), default=-1)
    A = np.zeros((n, n), dtype=np.float32)
    for u, v in edges:
        A[u, v] = 1
    return A


def _ldac_reference(text: str) -> np.ndarray | None:
    """The matrix an LDA-C corpus must give, parsed by hand; None if it is malformed."""
    lines = text.replace("\r\n", "\n").rstrip(" \t\r\n").split("\n")
    if lines == [""]:
        return np.zeros((0, 0), dtype=np.float32)
    docs = []
    for line in lines:
        tokens = line.split()
        if not tokens or not re.fullmatch(r"\d{1,18}", tokens[0]) or \
                int(tokens[0]) != len(tokens) - 1 or \
                not all(re.fullmatch(r"\d{1,18}:\d{1,18}", t) for t in tokens[1:]) or \
                re.search(r"[^ \t\d:]", line):
            return None
        docs.append([tuple(map(int, t.split(":"))) for t in tokens[1:]])
    n = 1 + max((t for d in docs for t, _ in d), default=-1)
    A = np.zeros((len(docs), n), dtype=np.float32)
    for r, d in enumerate(docs):
        for t, c in d:
            A[r, t] += c
    return A


# MGPU_PROPERTY_EXAMPLES=N: N random examples instead of CI's fixed, derandomised set
_RANDOM = int(os.environ.get("MGPU_PROPERTY_EXAMPLES", "0"))


@settings(max_examples=_RANDOM or 200, deadline=None, derandomize=not _RANDOM, database=None)
@given(
    which=st.sampled_from(sorted(_FUZZ_SEEDS)),
    edits=_mutations(96),
    gz=st.sampled_from(["plain", "gzip", "gzip-mutated"]),
    pick=st.integers(0, 2),
)
def test_loaders_on_fuzzed_files_return_or_name_the_file(which, edits, gz, pick):
    """A damaged file gives a matrix, or a ValueError (MalformedFileError mostly) that names
    the file: never another exception (IndexError, UnicodeDecodeError, EOFError, zlib.error,
    OSError...), never a hang. A SNAP or LDA-C file whose damage leaves a valid file gives
    exactly that file's matrix."""
    name, seed = _FUZZ_SEEDS[which]
    loaders = _FUZZ_LOADERS[which]
    loader = loaders[pick % len(loaders)]
    if gz == "gzip-mutated":  # the compressed stream itself is damaged
        blob, text = _mutate(gzip.compress(seed, mtime=0), edits), None
    else:
        text = _mutate(seed, edits)
        blob = gzip.compress(text, mtime=0) if gz == "gzip" else text
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / (name + ".gz" * (gz != "plain"))
        path.write_bytes(blob)
        start = time.perf_counter()
        try:
            got = loader(path)
        except ValueError as exc:
            assert not isinstance(exc, UnicodeError), repr(exc)
            assert path.name in str(exc), repr(exc)
            got = None
        except KeyError as exc:  # documented: an archive without the array asked for
            assert which.startswith("npz") and path.name in str(exc), repr(exc)
            got = None
        assert time.perf_counter() - start < 5.0
    if text is None or loader not in (load_snap, load_ldac):
        return
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        assert got is None
        return
    ref = (_snap_reference if loader is load_snap else _ldac_reference)(decoded)
    if ref is None:
        assert got is None, f"{which}: malformed text {decoded!r} was loaded"
    else:
        assert got is not None, f"{which}: valid text {decoded!r} was refused"
        np.testing.assert_array_equal(got.toarray(), ref)


def test_npy_header_with_an_unbalanced_bracket(tmp_path):
    """Found by the fuzzer: numpy's header parser let tokenize.TokenError out."""
    blob = bytearray(_npz_bytes(npy=True))
    blob[blob.index(b"{") + 1] = ord("(")  # {('descr': ... never closed
    with pytest.raises(MalformedFileError, match=r"^x\.npy: expected a NumPy \.npz/\.npy file "
                                                 r"without object arrays, found a bad header"):
        load_npz_array(write(tmp_path, "x.npy", bytes(blob)))


@pytest.mark.parametrize("gz", [False, True])
def test_10x_folder_with_a_damaged_file(tmp_path, gz):
    """Every file of a 10x folder cut short at each of several offsets: a TenX, or a
    ValueError naming the damaged file (10x names the matrix file for a count mismatch)."""
    for target, content in (("matrix.mtx", TENX_MTX), ("features.tsv", FEATURES),
                            ("barcodes.tsv", BARCODES)):
        raw = content.encode()
        for cut in sorted({0, 1, len(raw) // 3, len(raw) // 2, len(raw) - 1}):
            folder = make_10x(tmp_path / f"{target}-{cut}-{gz}", gz=gz)
            ext = ".gz" if gz else ""
            write(folder, target + ext, raw[:cut], gz=gz)
            try:
                load_10x(folder)
            except ValueError as exc:
                assert not isinstance(exc, UnicodeError)
                assert re.search(rf"^({re.escape(target)}|matrix\.mtx){re.escape(ext)}",
                                 str(exc)), str(exc)
