from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from mgpu.partition import axis_counts, grid, imbalance, part_sums, split, split_counts


def _brute_force(counts: list[int], parts: int) -> tuple[int, int]:
    """(smallest possible largest part, smallest possible max - min) over all splits."""
    c = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    n = len(counts)
    best_max, best_spread = None, None
    for cuts in itertools.combinations_with_replacement(range(n + 1), parts - 1):
        b = (0, *cuts, n)
        s = [int(c[b[i + 1]] - c[b[i]]) for i in range(parts)]
        best_max = max(s) if best_max is None else min(best_max, max(s))
        spread = max(s) - min(s)
        best_spread = spread if best_spread is None else min(best_spread, spread)
    return best_max, best_spread


def _check_bounds(b: np.ndarray, n: int, parts: int) -> None:
    assert b.dtype == np.int64
    assert b.shape == (parts + 1,)
    assert b[0] == 0 and b[-1] == n
    assert np.all(np.diff(b) >= 0)


@settings(max_examples=400, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=0, max_size=8),
    parts=st.integers(1, 5),
)
def test_split_matches_brute_force(counts, parts):
    b = split_counts(counts, parts)
    _check_bounds(b, len(counts), parts)
    sums = part_sums(counts, b)
    assert sums.sum() == sum(counts)
    if sum(counts) == 0:
        return
    best_max, best_spread = _brute_force(counts, parts)
    w = max(counts)
    assert sums.max() == best_max, "largest part is not the bottleneck optimum"
    assert sums.max() - sums.min() <= w, "parts differ by more than the largest row"
    assert best_spread <= w


@settings(max_examples=100, deadline=None)
@given(
    counts=st.lists(st.integers(0, 10**6), min_size=1, max_size=400),
    parts=st.integers(1, 64),
)
def test_split_guarantees_on_larger_inputs(counts, parts):
    b = split_counts(counts, parts)
    _check_bounds(b, len(counts), parts)
    sums = part_sums(counts, b)
    w = max(counts)
    assert sums.max() - sums.min() <= w
    assert sums.max() <= -(-sum(counts) // parts) + w


def test_more_parts_than_nonempty_rows():
    counts = [0, 7, 0, 0, 3, 0]
    b = split_counts(counts, 5)
    sums = part_sums(counts, b)
    assert sorted(sums.tolist()) == [0, 0, 0, 3, 7]


def test_more_parts_than_rows_and_empty():
    b = split_counts([4, 4], 6)
    _check_bounds(b, 2, 6)
    assert sorted(part_sums([4, 4], b).tolist()) == [0, 0, 0, 0, 4, 4]
    b = split_counts([], 3)
    assert b.tolist() == [0, 0, 0, 0]
    b = split_counts([0, 0, 0, 0, 0, 0], 3)
    assert b.tolist() == [0, 2, 4, 6]


def test_64bit_nnz():
    # Sums far beyond 2**31, as a matrix with tens of billions of nonzeros has.
    rng = np.random.default_rng(0)
    counts = rng.integers(2**30, 2**32, size=1000, dtype=np.int64)
    b = split_counts(counts, 7)
    sums = part_sums(counts, b)
    assert sums.sum() == counts.sum() > 2**40
    assert sums.max() - sums.min() <= counts.max()


@pytest.mark.parametrize(
    "counts, parts, match",
    [
        ([1, -1], 2, "non-negative"),
        ([[1, 2]], 2, "one-dimensional"),
        ([1, 2], 0, "int >= 1"),
        ([1.5, 2], 2, "whole, finite"),
        ([1, np.nan], 2, "whole, finite"),
    ],
)
def test_split_refuses_bad_input(counts, parts, match):
    with pytest.raises(ValueError, match=match):
        split_counts(counts, parts)


def test_parts_must_be_int():
    with pytest.raises(TypeError, match="'parts'"):
        split_counts([1, 2], 2.0)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_axis_counts_and_split_of_matrices(fmt):
    S = sp.random(300, 120, density=0.05, format="csr", random_state=1)
    M = S.asformat(fmt)
    assert np.array_equal(axis_counts(M, 0), np.diff(S.indptr))
    assert np.array_equal(axis_counts(M, 1), np.diff(S.tocsc().indptr))
    for axis in (0, 1):
        b = split(M, 4, axis=axis)
        blocks = [S[b[i]:b[i + 1]] if axis == 0 else S[:, b[i]:b[i + 1]] for i in range(4)]
        assert sum(x.nnz for x in blocks) == S.nnz
        sums = np.array([x.nnz for x in blocks])
        assert sums.max() - sums.min() <= axis_counts(S, axis).max()


def test_grid_counts_blocks():
    S = sp.random(200, 150, density=0.03, format="csr", random_state=2)
    g = grid(S, 3, 4)
    assert g.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            rs, cs = g.block(i, j)
            assert g.nnz[i, j] == S[rs, cs].nnz
    assert np.array_equal(g.row_bounds, split(S, 3, axis=0))
    assert np.array_equal(g.col_bounds, split(S, 4, axis=1))


def test_imbalance():
    assert imbalance([5, 5, 5]) == 1.0
    assert imbalance([0, 0]) == 1.0
    assert imbalance([9, 3]) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        imbalance([])


REAL = [
    "graphs/soc-Slashdot0902.txt.gz",
    "graphs/email-Enron.txt.gz",
    "graphs/facebook_combined.txt.gz",
    "graphs/ca-HepPh.txt.gz",
    "graphs/p2p-Gnutella31.txt.gz",
    "bow/ap.dat.gz",
    "matrices/memplus.mtx.gz",
    "matrices/bcsstk13.mtx.gz",
    "matrices/s3rmt3m3.mtx.gz",
    "singlecell/visium_mouse_spaceranger3",
]


@pytest.mark.parametrize("rel", REAL)
def test_real_data_imbalance(data_dir, rel):
    """Splits of the real graphs and corpora 4 and 16 ways are within 1% of perfect
    wherever no single row/column exceeds nnz/P, and never off by more than one row."""
    from mgpu import io

    data = io.load(str(data_dir / rel))
    S = getattr(data, "matrix", data)
    for axis in (0, 1):
        counts = axis_counts(S, axis)
        w = counts.max()
        for parts in (4, 16):
            sums = part_sums(counts, split_counts(counts, parts))
            assert sums.sum() == S.nnz
            assert sums.max() - sums.min() <= w
            if w <= S.nnz / parts:
                assert imbalance(sums) <= 1.01, (rel, axis, parts, imbalance(sums))
