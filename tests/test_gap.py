"""The GaP topic model on one device and spread over a cluster: the same iterations."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mgpu.synthetic import powerlaw_corpus
from mgpu.models import GaP
from mgpu.distributed import workers_now


def _corpus() -> sp.csr_matrix:
    return powerlaw_corpus(600, 300, 0.03, seed=3).astype(np.float64)


@pytest.mark.parametrize("parts", [1, 3])
def test_cluster_fit_equals_one_device(client, parts):
    S = _corpus()
    one = GaP(5, iters=6, seed=2).fit(S)
    seen = []
    spread = GaP(5, iters=6, seed=2).fit(S, parts=parts, client=client, progress=seen.append)
    assert [h["iteration"] for h in spread.history_] == list(range(1, 7)) == \
        [h["iteration"] for h in seen]
    np.testing.assert_allclose([h["loglik_per_token"] for h in spread.history_],
                               [h["loglik_per_token"] for h in one.history_], rtol=1e-10)
    np.testing.assert_allclose(spread.X_, one.X_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(spread.L_, one.L_, rtol=1e-9, atol=1e-15)
    assert all(h["step_s"] > 0 for h in spread.history_)
    assert len(spread.tiles_) == parts
    assert sum(t["rows"] for t in spread.tiles_) == S.shape[0]
    assert sum(t["nnz"] for t in spread.tiles_) == S.nnz
    assert {t["worker"] for t in spread.tiles_} <= set(workers_now(client))


def test_cluster_fit_on_the_ap_corpus(client, data_dir):
    from mgpu import io

    S = sp.csr_matrix(io.load(str(data_dir / "bow" / "ap.dat.gz")), dtype=np.float64)
    one = GaP(8, iters=4).fit(S)
    spread = GaP(8, iters=4).fit(S, parts=4, client=client)
    ll = [h["loglik_per_token"] for h in spread.history_]
    np.testing.assert_allclose(ll, [h["loglik_per_token"] for h in one.history_], rtol=1e-9)
    assert ll[-1] > ll[0]


def test_cluster_fit_refuses_bad_input(client):
    with pytest.raises(ValueError, match="topics and iters must be >= 1"):
        GaP(0).fit(_corpus(), client=client)
    with pytest.raises(TypeError, match="must be a scipy sparse matrix"):
        GaP(2).fit(np.ones((3, 3)), client=client)
    with pytest.raises(ValueError, match="non-negative counts"):
        GaP(2).fit(sp.csr_matrix(-np.ones((3, 3))), client=client)


def test_cluster_fit_refuses_nan_and_complex_counts_as_one_device_does(client):
    """NaN and complex counts are refused by name before any tile is placed (scipy input)
    or once the tiles' sums arrive (dask input), never inside a worker."""
    import mgpu

    nan = _corpus()
    nan.data[3] = np.nan
    with pytest.raises(ValueError, match="'S' parameter of GaP.fit holds NaN"):
        GaP(2).fit(nan)
    with pytest.raises(ValueError, match="'S' parameter of GaP.fit on a cluster holds NaN"):
        GaP(2).fit(nan, parts=2, client=client)
    with pytest.raises(ValueError, match="'S' parameter of GaP.fit on a cluster holds NaN"):
        GaP(2).fit(mgpu.from_scipy(nan, 2, client=client))
    cplx = _corpus().astype(np.complex128)
    with pytest.raises(TypeError, match="'S' parameter of GaP.fit must hold real numbers"):
        GaP(2).fit(cplx)
    with pytest.raises(TypeError, match="'S' parameter of GaP.fit on a cluster must hold real "
                                        "numbers"):
        GaP(2).fit(cplx, parts=2, client=client)


def _unsorted_with_duplicates() -> sp.csr_matrix:
    """A corpus whose rows are stored backwards, with one count split in two entries."""
    S = _corpus()
    indptr, indices, data = S.indptr.copy(), S.indices.copy(), S.data.copy()
    for r in range(S.shape[0]):
        a, b = indptr[r], indptr[r + 1]
        indices[a:b], data[a:b] = indices[a:b][::-1].copy(), data[a:b][::-1].copy()
    r = int(np.flatnonzero(np.diff(indptr) >= 1)[0])
    at = indptr[r]
    indices = np.insert(indices, at, indices[at])
    data = np.insert(data, at, 1.0)
    indptr[r + 1:] += 1
    return sp.csr_matrix((data, indices, indptr), shape=S.shape)


def test_fit_leaves_the_callers_matrix_as_it_was(client):
    """Sorting and summing the duplicates of the corpus happen on a copy."""
    S = _unsorted_with_duplicates()
    indices, data = S.indices.copy(), S.data.copy()
    GaP(2, iters=2).fit(S)
    GaP(2, iters=2).fit(S, parts=2, client=client)
    np.testing.assert_array_equal(S.indices, indices)
    np.testing.assert_array_equal(S.data, data)


def test_seed_none_fits_on_one_device_and_on_a_cluster(client):
    S = _corpus()
    for fit in (lambda m: m.fit(S), lambda m: m.fit(S, parts=2, client=client)):
        model = fit(GaP(2, iters=2, seed=None))
        assert model.X_.shape == (S.shape[0], 2) and np.isfinite(model.X_).all()


def test_cluster_fit_of_a_dask_array_keeps_its_tiles(client):
    """A dask array of row tiles fits where its tiles are, as the scipy matrix it holds."""
    import mgpu

    S = _corpus()
    Sd = mgpu.from_scipy(S, 3, client=client)
    one = GaP(5, iters=6, seed=2).fit(S)
    spread = GaP(5, iters=6, seed=2).fit(Sd)
    # the corpus's total and Σ log s! are summed tile by tile: rounding, nothing more
    np.testing.assert_allclose([h["loglik_per_token"] for h in spread.history_],
                               [h["loglik_per_token"] for h in one.history_], rtol=1e-10)
    np.testing.assert_allclose(spread.X_, one.X_, rtol=1e-9, atol=1e-12)
    holders = mgpu.distributed.chunk_workers(Sd, client)
    assert [t["worker"] for t in spread.tiles_] == [holders[(i, 0)][0] for i in range(3)]
    assert [t["rows"] for t in spread.tiles_] == list(Sd.chunks[0])
    with pytest.raises(ValueError, match="non-negative counts"):
        GaP(2).fit(mgpu.from_scipy(sp.csr_matrix(-np.ones((3, 3))), 2, client=client))


def test_transform_finds_the_topics_of_new_documents():
    """Two topics over disjoint words: new documents drawn from one of them load on it."""
    rng = np.random.default_rng(0)
    words = 40
    topic = np.zeros((2, words))
    topic[0, :20] = topic[1, 20:] = 1 / 20
    which = rng.integers(0, 2, 200)
    S = sp.csr_matrix(rng.poisson(30 * topic[which]).astype(np.float64))
    model = GaP(2, iters=40, seed=1).fit(S)
    first = int(np.argmax(model.L_[:20].sum(axis=0)))  # the fitted topic of words 0..19
    new = rng.integers(0, 2, 50)
    X = model.transform(sp.csr_matrix(rng.poisson(30 * topic[new]).astype(np.float64)))
    assert X.shape == (50, 2) and (X >= 0).all()
    assert ((X.argmax(axis=1) == first) == (new == 0)).all()
    with pytest.raises(ValueError, match="must have the fitted 40 words as columns. Got 39"):
        model.transform(sp.csr_matrix((3, 39)))
    with pytest.raises(ValueError, match="not fitted yet"):
        GaP(2).transform(S)


def test_overflow_is_reported_as_gaps_own_not_sddmms():
    """Counts whose total overflows, and updates that overflow float32 (an extreme prior),
    used to end in "the 'A' parameter of sddmm holds NaN": the refusal names GaP's input."""
    huge = sp.csr_matrix(np.array([[1.0, 1e308, 0], [0, 1e308, 1], [2, 0, 1.0]]))
    with pytest.raises(ValueError, match=r"'S' parameter of GaP.fit holds counts whose total "
                                         r"\(inf\) overflows float64"):
        GaP(topics=2, iters=3).fit(huge)
    S = sp.csr_matrix(np.array([[1, 2, 0], [0, 1, 1], [2, 0, 1]], dtype=np.float32))
    with pytest.raises(FloatingPointError, match=r"GaP's updates at iteration \d+ .*overflowed "
                                                 r"float32: the counts of 'S' or the prior"):
        GaP(topics=2, iters=5, alpha=1e30, beta=1e30).fit(S)
