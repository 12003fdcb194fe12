"""Every parameter of every public function and estimator refuses a bad value by name.

scikit-learn's ``generate_invalid_param_val`` idea over mgpu's public API (``mgpu.__all__``,
``mgpu.models.GaP``, ``mgpu.models.GradientMF``, ``mgpu.models.GraphIndex``): for each
parameter in turn, one call with a bad value (a wrong type, a number out of range, an
unknown option, NaN in data, a wrong shape or number of dimensions, shapes that do not
match) and everything else valid. The refusal is a TypeError or ValueError whose message
begins "The '<param>' parameter of <function>" (or "The '<a>' and '<b>' parameters of
<function>" for a pair that does not match). Parameters that no value makes bad are listed in :data:`NEVER_BAD` with the reason;
:func:`test_every_parameter_has_a_bad_value_or_a_reason` keeps both lists complete.

On a CPU LocalCluster the distributed paths refuse before any task reaches the scheduler.
"""
from __future__ import annotations

import inspect
import re

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
import mgpu.models

NAN = float("nan")


def _data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((6, 4))
    S = sp.random(6, 5, density=0.5, format="csr", random_state=rng)
    A, B = rng.standard_normal((6, 3)), rng.standard_normal((5, 3))
    G = sp.csr_matrix(np.ones((4, 4)) - np.eye(4))
    R = sp.random(8, 7, density=0.5, format="csr", random_state=rng)
    R.data = R.data * 4 + 1
    return X, S, A, B, G, R


X, S, A, B, G, R = _data()
ST = S.T.tocsr()  # S's right operand in a product (5 × 6)
XNAN = X.copy()
XNAN[1, 2] = NAN
RNAN = R.copy()
RNAN.data[3] = NAN


def _nan(M):
    """M with a NaN among its (stored) values."""
    M = M.copy()
    (M.data if sp.issparse(M) else M.reshape(-1))[1] = NAN
    return M


def _nn(**kw):
    return mgpu.NearestNeighbors(2, **kw).fit(X)


def _mf(**kw):
    return mgpu.MatrixFactorization(**{"k": 2, "epochs": 1, **kw})


def _gap(**kw):
    return mgpu.models.GaP(**{"topics": 2, "iters": 1, **kw})


def _gmf(**kw):
    return mgpu.models.GradientMF(**{"k": 2, "iters": 1, **kw})


def _gi(**kw):
    return mgpu.models.GraphIndex(2, **{"degree": 4, "candidates": 4, **kw})


_fitted = {}


def _fitted_model(name):
    if name not in _fitted:
        _fitted[name] = {"mf": lambda: _mf().fit(R), "gap": lambda: _gap().fit(R),
                         "gmf": lambda: _gmf().fit(R)}[name]()
    return _fitted[name]


# (callable's name, function the refusal names, parameter, bad value, call with it)
CASES = [
    # ------------------------------------------------------------------ ops
    ("row_norms", "row_norms", "X", [[1.0]], lambda v: mgpu.row_norms(v)),
    ("row_norms", "row_norms", "X", np.ones(3), lambda v: mgpu.row_norms(v)),
    ("row_norms", "row_norms", "X", X.astype(complex), lambda v: mgpu.row_norms(v)),
    ("row_norms", "row_norms", "norm", "l3", lambda v: mgpu.row_norms(X, norm=v)),
    ("pairwise_distances", "pairwise_distances", "X", "X",
     lambda v: mgpu.pairwise_distances(v)),
    ("pairwise_distances", "pairwise_distances", "X", XNAN,
     lambda v: mgpu.pairwise_distances(v)),
    ("pairwise_distances", "pairwise_distances", "Y", np.ones((2, 3)),
     lambda v: mgpu.pairwise_distances(X, v)),
    ("pairwise_distances", "pairwise_distances", "Y", XNAN,
     lambda v: mgpu.pairwise_distances(X, v)),
    ("pairwise_distances", "pairwise_distances", "metric", "braycurtis",
     lambda v: mgpu.pairwise_distances(X, metric=v)),
    ("pairwise_distances", "pairwise_distances", "p", -1,
     lambda v: mgpu.pairwise_distances(X, metric="minkowski", p=v)),
    ("pairwise_distances", "pairwise_distances", "p", NAN,
     lambda v: mgpu.pairwise_distances(X, metric="minkowski", p=v)),
    ("knn", "knn", "index", XNAN, lambda v: mgpu.knn(v, X, 2)),
    ("knn", "knn", "index", np.ones(4), lambda v: mgpu.knn(v, X, 2)),
    ("knn", "knn", "queries", np.ones((2, 3)), lambda v: mgpu.knn(X, v, 2)),
    ("knn", "knn", "queries", "q", lambda v: mgpu.knn(X, v, 2)),
    ("knn", "knn", "k", 0, lambda v: mgpu.knn(X, X, v)),
    ("knn", "knn", "k", 7, lambda v: mgpu.knn(X, X, v)),
    ("knn", "knn", "k", "3", lambda v: mgpu.knn(X, X, v)),
    ("knn", "knn", "metric", "nope", lambda v: mgpu.knn(X, X, 2, metric=v)),
    ("knn", "knn", "p", 0, lambda v: mgpu.knn(X, X, 2, metric="minkowski", p=v)),
    ("knn", "knn", "working_memory", "lots", lambda v: mgpu.knn(X, X, 2, working_memory=v)),
    ("knn", "knn", "working_memory", -5, lambda v: mgpu.knn(X, X, 2, working_memory=v)),
    ("knn", "knn", "progress", 3, lambda v: mgpu.knn(X, X, 2, progress=v)),
    ("sddmm", "sddmm", "S", S.toarray(), lambda v: mgpu.sddmm(v, A, B)),
    ("sddmm", "sddmm", "S", _nan(S), lambda v: mgpu.sddmm(v, A, B)),
    ("sddmm", "sddmm", "A", _nan(A), lambda v: mgpu.sddmm(S, v, B)),
    ("sddmm", "sddmm", "A", A[:4], lambda v: mgpu.sddmm(S, v, B)),
    ("sddmm", "sddmm", "A", A.ravel(), lambda v: mgpu.sddmm(S, v, B)),
    ("sddmm", "sddmm", "B", B[:4], lambda v: mgpu.sddmm(S, A, v)),
    ("sddmm", "sddmm", "B", sp.csr_matrix(B), lambda v: mgpu.sddmm(S, A, v)),
    ("sddmm", "sddmm", "B", B[:, :2], lambda v: mgpu.sddmm(S, A, v)),
    ("sddmm", "sddmm", "hadamard", "no", lambda v: mgpu.sddmm(S, A, B, hadamard=v)),
    ("sddmm", "sddmm", "check_finite", None, lambda v: mgpu.sddmm(S, A, B, check_finite=v)),
    ("sddmm", "sddmm", "plan", "p", lambda v: mgpu.sddmm(S, A, B, plan=v)),
    ("sddmm", "sddmm", "device", "tpu", lambda v: mgpu.sddmm(S, A, B, device=v)),
    # the option before the factors' NaN scan
    ("sddmm", "sddmm", "device", "tpu", lambda v: mgpu.sddmm(S, _nan(A), B, device=v)),
    ("sddmm", "sddmm", "working_memory", "lots",
     lambda v: mgpu.sddmm(S, A, B, working_memory=v)),
    ("sddmm", "sddmm", "progress", 3, lambda v: mgpu.sddmm(S, A, B, progress=v)),
    ("sddmm_plan", "sddmm_plan", "S", S.toarray(), lambda v: mgpu.sddmm_plan(v, 3)),
    ("sddmm_plan", "sddmm_plan", "K", 0, lambda v: mgpu.sddmm_plan(S, v)),
    ("sddmm_plan", "sddmm_plan", "K", 1.5, lambda v: mgpu.sddmm_plan(S, v)),
    ("sddmm_plan", "sddmm_plan", "dtype", "int8", lambda v: mgpu.sddmm_plan(S, 3, dtype=v)),
    ("sddmm_plan", "sddmm_plan", "scheme", "dense", lambda v: mgpu.sddmm_plan(S, 3, scheme=v)),
    ("spmv", "spmv", "A", S.toarray(), lambda v: mgpu.spmv(v, np.ones(5))),
    ("spmv", "spmv", "A", _nan(S), lambda v: mgpu.spmv(v, np.ones(5))),
    ("spmv", "spmv", "x", np.ones(4), lambda v: mgpu.spmv(S, v)),
    ("spmv", "spmv", "x", np.ones((5, 1)), lambda v: mgpu.spmv(S, v)),
    ("spmv", "spmv", "x", np.full(5, NAN), lambda v: mgpu.spmv(S, v)),
    ("spmv", "spmv", "check_finite", "no", lambda v: mgpu.spmv(S, np.ones(5), check_finite=v)),
    ("spmv", "spmv", "plan", "cut", lambda v: mgpu.spmv(S, np.ones(5), plan=v)),
    ("spmm", "spmm", "A", [[1.0]], lambda v: mgpu.spmm(v, np.ones((5, 2)))),
    ("spmm", "spmm", "X", np.ones(5), lambda v: mgpu.spmm(S, v)),
    ("spmm", "spmm", "X", np.ones((4, 2)), lambda v: mgpu.spmm(S, v)),
    ("spmm", "spmm", "X", np.full((5, 2), NAN), lambda v: mgpu.spmm(S, v)),
    ("spmm", "spmm", "check_finite", 1, lambda v: mgpu.spmm(S, np.ones((5, 2)),
                                                            check_finite=v)),
    ("spmv_plan", "spmv_plan", "A", np.ones((3, 3)), lambda v: mgpu.spmv_plan(v)),
    ("spgemm", "spgemm", "A", S.toarray(), lambda v: mgpu.spgemm(v, S.T)),
    ("spgemm", "spgemm", "A", _nan(S), lambda v: mgpu.spgemm(v, S.T)),
    ("spgemm", "spgemm", "B", S, lambda v: mgpu.spgemm(S, v)),
    ("spgemm", "spgemm", "B", np.ones((5, 2)), lambda v: mgpu.spgemm(S, v)),
    ("spgemm", "spgemm", "mask", sp.identity(5, format="csr"),
     lambda v: mgpu.spgemm(S, S.T, mask=v)),
    ("spgemm", "spgemm", "mask", sp.csr_matrix((np.zeros(1), ([0], [0])), shape=(6, 6)),
     lambda v: mgpu.spgemm(S, S.T, mask=v)),
    ("spgemm", "spgemm", "to_host", "yes", lambda v: mgpu.spgemm(S, S.T, to_host=v)),
    ("spgemm", "spgemm", "B", _nan(S.T.tocsr()), lambda v: mgpu.spgemm(S, v)),
    ("spgemm", "spgemm", "mask", sp.csr_matrix((5, 6)), lambda v: mgpu.spgemm(S, S.T, mask=v)),
    ("spadd", "spadd", "A", S.toarray(), lambda v: mgpu.spadd(v, S)),
    ("spadd", "spadd", "B", S.T, lambda v: mgpu.spadd(S, v)),
    ("spadd", "spadd", "B", _nan(S), lambda v: mgpu.spadd(S, v)),
    ("spadd", "spadd", "alpha", NAN, lambda v: mgpu.spadd(S, S, alpha=v)),
    ("spadd", "spadd", "beta", "1", lambda v: mgpu.spadd(S, S, beta=v)),
    ("triangles", "triangles", "G", G.toarray(), lambda v: mgpu.triangles(v)),
    ("triangles", "triangles", "G", sp.csr_matrix(np.ones((3, 4))),
     lambda v: mgpu.triangles(v)),
    ("triangles", "triangles", "G", _nan(G), lambda v: mgpu.triangles(v)),
    ("triangles", "triangles", "G", sp.triu(G, format="csr"), lambda v: mgpu.triangles(v)),
    ("triangles", "triangles", "G", da.from_array(G, chunks=2), lambda v: mgpu.triangles(v)),
    ("triangles", "triangles", "symmetrize", "yes",
     lambda v: mgpu.triangles(G, symmetrize=v)),
    ("spgemm", "spgemm", "B", da.from_array(ST.toarray()), lambda v: mgpu.spgemm(S, v)),
    ("spgemm", "spgemm", "parts", 0, lambda v: mgpu.spgemm(S, ST, parts=v)),
    ("spgemm", "spgemm", "parts", 7, lambda v: mgpu.spgemm(S, ST, parts=v)),
    ("spgemm", "spgemm", "client", 3, lambda v: mgpu.spgemm(S, ST, parts=2, client=v)),
    ("spgemm", "spgemm", "progress", 3, lambda v: mgpu.spgemm(S, ST, parts=2, progress=v)),
    # ------------------------------------------------------------------ distributed
    ("jaccard", "jaccard", "G", np.ones((3, 3)), lambda v: mgpu.jaccard(v)),
    ("jaccard", "jaccard", "G", sp.csr_matrix(np.ones((3, 4))), lambda v: mgpu.jaccard(v)),
    ("jaccard", "jaccard", "G", _nan(G), lambda v: mgpu.jaccard(v)),
    ("jaccard", "jaccard", "weighted", "yes", lambda v: mgpu.jaccard(G, weighted=v)),
    ("jaccard", "jaccard", "symmetrize", "yes", lambda v: mgpu.jaccard(G, symmetrize=v)),
    ("jaccard", "jaccard", "parts", 0, lambda v: mgpu.jaccard(G, parts=v)),
    ("jaccard", "jaccard", "client", 3, lambda v: mgpu.jaccard(G, client=v)),
    ("jaccard", "jaccard", "progress", 3, lambda v: mgpu.jaccard(G, progress=v)),
    ("from_scipy", "from_scipy", "S", np.ones((3, 3)), lambda v: mgpu.from_scipy(v)),
    ("from_scipy", "from_scipy", "S", S.astype(complex), lambda v: mgpu.from_scipy(v)),
    ("from_scipy", "from_scipy", "parts", 0, lambda v: mgpu.from_scipy(S, v)),
    ("from_scipy", "from_scipy", "axis", 2, lambda v: mgpu.from_scipy(S, 2, axis=v)),
    ("from_scipy", "from_scipy", "client", 3, lambda v: mgpu.from_scipy(S, 2, client=v)),
    ("from_scipy", "from_scipy", "device", "tpu", lambda v: mgpu.from_scipy(S, 2, device=v)),
    ("from_scipy", "from_scipy", "progress", 3, lambda v: mgpu.from_scipy(S, 2, progress=v)),
    ("gather", "gather", "x", S, lambda v: mgpu.gather(v)),
    ("connect", "connect", "address", 3, lambda v: mgpu.connect(v)),
    ("connect", "connect", "gpus", "yes", lambda v: mgpu.connect(gpus=v, n_workers=1)),
    ("connect", "connect", "n_workers", 0, lambda v: mgpu.connect(gpus=False, n_workers=v)),
    ("connect", "connect", "n_workers", "2", lambda v: mgpu.connect(gpus=False, n_workers=v)),
    ("connect", "connect", "timeout", -1, lambda v: mgpu.connect(gpus=False, timeout=v)),
    ("connect", "connect", "slurm", 3, lambda v: mgpu.connect(slurm=v)),
    ("connect", "connect", "cpu_threads", -1,
     lambda v: mgpu.connect(gpus=False, n_workers=1, cpu_threads=v)),
    ("connect", "connect", "cpu_threads", "2",
     lambda v: mgpu.connect(gpus=False, n_workers=1, cpu_threads=v)),
    ("connect", "connect", "protocol", "nccl",
     lambda v: mgpu.connect(gpus=False, n_workers=1, protocol=v)),
    ("connect", "connect", "protocol", "tcp",  # not the scheme of the scheduler's address
     lambda v: mgpu.connect("ucx://127.0.0.1:8786", protocol=v)),
    # ------------------------------------------------------------------ estimators
    ("NearestNeighbors", "NearestNeighbors", "n_neighbors", 0,
     lambda v: mgpu.NearestNeighbors(v).fit(X)),
    ("NearestNeighbors", "NearestNeighbors", "metric", "nope", lambda v: _nn(metric=v)),
    ("NearestNeighbors", "NearestNeighbors", "p", NAN,
     lambda v: _nn(metric="minkowski", p=v)),
    ("NearestNeighbors.fit", "NearestNeighbors.fit", "X", XNAN, lambda v: _nn().fit(v)),
    ("NearestNeighbors.fit", "NearestNeighbors.fit", "X", "X", lambda v: _nn().fit(v)),
    ("NearestNeighbors.kneighbors", "NearestNeighbors.kneighbors", "X", np.ones((2, 3)),
     lambda v: _nn().kneighbors(v)),
    ("NearestNeighbors.kneighbors", "NearestNeighbors.kneighbors", "X", XNAN,
     lambda v: _nn().kneighbors(v)),
    ("NearestNeighbors.kneighbors", "NearestNeighbors", "n_neighbors", 0,
     lambda v: _nn().kneighbors(n_neighbors=v)),
    ("NearestNeighbors.kneighbors", "NearestNeighbors.kneighbors", "return_distance", "no",
     lambda v: _nn().kneighbors(return_distance=v)),
    ("NearestNeighbors.kneighbors_graph", "NearestNeighbors.kneighbors", "X", "X",
     lambda v: _nn().kneighbors_graph(v)),
    ("NearestNeighbors.kneighbors_graph", "NearestNeighbors", "n_neighbors", 1.5,
     lambda v: _nn().kneighbors_graph(n_neighbors=v)),
    ("NearestNeighbors.kneighbors_graph", "kneighbors_graph", "mode", "weights",
     lambda v: _nn().kneighbors_graph(mode=v)),
    ("MatrixFactorization", "MatrixFactorization", "k", 0, lambda v: _mf(k=v).fit(R)),
    ("MatrixFactorization", "MatrixFactorization", "lr", NAN, lambda v: _mf(lr=v).fit(R)),
    ("MatrixFactorization", "MatrixFactorization", "reg", -1.0, lambda v: _mf(reg=v).fit(R)),
    ("MatrixFactorization", "MatrixFactorization", "epochs", 2.5,
     lambda v: _mf(epochs=v).fit(R)),
    ("MatrixFactorization", "MatrixFactorization", "target_rmse", -1,
     lambda v: _mf(target_rmse=v).fit(R)),
    ("MatrixFactorization", "MatrixFactorization", "mode", "hsgd+",
     lambda v: _mf(mode=v).fit(R)),
    ("MatrixFactorization", "MatrixFactorization", "seed", "x", lambda v: _mf(seed=v).fit(R)),
    ("MatrixFactorization", "MatrixFactorization", "checkpoint_dir", 3,
     lambda v: _mf(checkpoint_dir=v).fit(R)),
    ("MatrixFactorization", "MatrixFactorization", "checkpoint_dir", "/no/such/folder",
     lambda v: _mf(checkpoint_dir=v).fit(R)),
    ("MatrixFactorization", "MatrixFactorization", "calibration", 3,
     lambda v: _mf(calibration=v).fit(R)),
    ("MatrixFactorization.fit", "MatrixFactorization.fit", "R", R.toarray(),
     lambda v: _mf().fit(v)),
    ("MatrixFactorization.fit", "MatrixFactorization.fit", "R", RNAN, lambda v: _mf().fit(v)),
    ("MatrixFactorization.fit", "MatrixFactorization.fit", "test",
     sp.csr_matrix(np.ones((3, 3))), lambda v: _mf().fit(R, v)),
    ("MatrixFactorization.fit", "MatrixFactorization.fit", "callback", 3,
     lambda v: _mf().fit(R, callback=v)),
    ("MatrixFactorization.fit", "MatrixFactorization.fit", "resume", 3,
     lambda v: _mf().fit(R, resume=v)),
    ("MatrixFactorization.predict", "predict", "users", [100],
     lambda v: _fitted_model("mf").predict(v, [0])),
    ("MatrixFactorization.predict", "predict", "users", ["a"],
     lambda v: _fitted_model("mf").predict(v, [0])),
    ("MatrixFactorization.predict", "predict", "items", [-1],
     lambda v: _fitted_model("mf").predict([0], v)),
    ("MatrixFactorization.predict", "predict", "items", [0, 1],
     lambda v: _fitted_model("mf").predict([0], v)),
    ("GraphIndex", "GraphIndex", "n_neighbors", 0,
     lambda v: mgpu.models.GraphIndex(v).fit(X)),
    ("GraphIndex", "GraphIndex", "metric", "manhattan", lambda v: _gi(metric=v).fit(X)),
    ("GraphIndex", "GraphIndex", "degree", 1, lambda v: _gi(degree=v).fit(X)),
    ("GraphIndex", "GraphIndex", "candidates", 1, lambda v: _gi(candidates=v).fit(X)),
    ("GraphIndex", "GraphIndex", "explore", 5, lambda v: _gi(explore=v).fit(X)),
    ("GraphIndex", "GraphIndex", "batch", 0, lambda v: _gi(batch=v).fit(X)),
    ("GraphIndex", "GraphIndex", "diverse", "yes", lambda v: _gi(diverse=v).fit(X)),
    ("GraphIndex", "GraphIndex", "partition", "columns", lambda v: _gi(partition=v).fit(X)),
    ("GraphIndex", "GraphIndex", "probes", 0, lambda v: _gi(probes=v).fit(X)),
    ("GraphIndex", "GraphIndex", "half", "yes", lambda v: _gi(half=v).fit(X)),
    ("GraphIndex.fit", "GraphIndex.fit", "X", XNAN, lambda v: _gi().fit(v)),
    ("GraphIndex.fit", "GraphIndex.fit", "X", da.from_array(X), lambda v: _gi().fit(v)),
    ("GraphIndex.fit", "GraphIndex.fit", "progress", 3, lambda v: _gi().fit(X, progress=v)),
    ("GraphIndex.kneighbors", "GraphIndex.kneighbors", "X", np.ones((2, 3)),
     lambda v: _gi().fit(X).kneighbors(v)),
    ("GraphIndex.kneighbors", "GraphIndex", "n_neighbors", 5,
     lambda v: _gi().fit(X).kneighbors(X, v)),
    ("GraphIndex.kneighbors", "GraphIndex.kneighbors", "return_distance", "no",
     lambda v: _gi().fit(X).kneighbors(X, return_distance=v)),
    ("GraphIndex.save", "GraphIndex.save", "path", 3, lambda v: _gi().fit(X).save(v)),
    ("GraphIndex.load", "GraphIndex.load", "path", None,
     lambda v: mgpu.models.GraphIndex.load(v)),
    ("GaP", "GaP", "topics", 0, lambda v: _gap(topics=v).fit(R)),
    ("GaP", "GaP", "iters", 1.5, lambda v: _gap(iters=v).fit(R)),
    ("GaP", "GaP", "alpha", 0.5, lambda v: _gap(alpha=v).fit(R)),
    ("GaP", "GaP", "beta", NAN, lambda v: _gap(beta=v).fit(R)),
    ("GaP", "GaP", "seed", -1, lambda v: _gap(seed=v).fit(R)),
    ("GaP.fit", "GaP.fit", "S", R.toarray(), lambda v: _gap().fit(v)),
    ("GaP.fit", "GaP.fit", "S", RNAN, lambda v: _gap().fit(v)),
    ("GaP.fit", "GaP.fit", "S", -R, lambda v: _gap().fit(v)),
    ("GaP.fit", "GaP.fit", "client", 3, lambda v: _gap().fit(R, client=v)),
    ("GaP.fit", "GaP.fit", "parts", 0, lambda v: _gap().fit(R, parts=v)),
    ("GaP.fit", "GaP.fit", "progress", 3, lambda v: _gap().fit(R, progress=v)),
    ("GaP.transform", "GaP.transform", "S", R.toarray(),
     lambda v: _fitted_model("gap").transform(v)),
    ("GaP.transform", "GaP.transform", "S", R[:, :4],
     lambda v: _fitted_model("gap").transform(v)),
    ("GaP.transform", "GaP.transform", "S", RNAN,
     lambda v: _fitted_model("gap").transform(v)),
    ("GaP.transform", "GaP.transform", "iters", 0,
     lambda v: _fitted_model("gap").transform(R, iters=v)),
    ("GradientMF", "GradientMF", "k", 0, lambda v: _gmf(k=v).fit(R)),
    ("GradientMF", "GradientMF", "reg", -1, lambda v: _gmf(reg=v).fit(R)),
    ("GradientMF", "GradientMF", "lr", 0, lambda v: _gmf(lr=v).fit(R)),
    ("GradientMF", "GradientMF", "iters", "5", lambda v: _gmf(iters=v).fit(R)),
    ("GradientMF", "GradientMF", "seed", "x", lambda v: _gmf(seed=v).fit(R)),
    ("GradientMF", "GradientMF", "cuda_graph", "no", lambda v: _gmf(cuda_graph=v).fit(R)),
    ("GradientMF.fit", "GradientMF.fit", "R", R.toarray(), lambda v: _gmf().fit(v)),
    ("GradientMF.fit", "GradientMF.fit", "R", RNAN, lambda v: _gmf().fit(v)),
    ("GradientMF.fit", "GradientMF.fit", "test", sp.csr_matrix(np.ones((3, 3))),
     lambda v: _gmf().fit(R, v)),
    ("GradientMF.fit", "GradientMF.fit", "client", 3, lambda v: _gmf().fit(R, client=v)),
    ("GradientMF.fit", "GradientMF.fit", "parts", 0, lambda v: _gmf().fit(R, parts=v)),
    ("GradientMF.fit", "GradientMF.fit", "progress", 3, lambda v: _gmf().fit(R, progress=v)),
    ("GradientMF.predict", "GradientMF.predict", "S", R.toarray(),
     lambda v: _fitted_model("gmf").predict(v)),
    ("GradientMF.predict", "GradientMF.predict", "S", R[:3],
     lambda v: _fitted_model("gmf").predict(v)),
    ("GradientMF.predict", "GradientMF.predict", "check_finite", "no",
     lambda v: _fitted_model("gmf").predict(R, check_finite=v)),
    # ------------------------------------------------------------------ spmd
    ("spmd", "spmd", "fn", 3, lambda v: mgpu.spmd(v, da.zeros((4, 2)))),
    ("spmd", "spmd", "collections", np.ones((4, 2)), lambda v: mgpu.spmd(len, v)),
    ("spmd", "spmd", "collections", da.zeros((4, 2), chunks=(2, 1)),
     lambda v: mgpu.spmd(len, v)),
    ("spmd", "spmd", "args", [1], lambda v: mgpu.spmd(len, da.zeros((4, 2)), args=v)),
    ("spmd", "spmd", "client", 3, lambda v: mgpu.spmd(len, da.zeros((4, 2)), client=v)),
    ("spmd", "spmd", "name", "a b", lambda v: mgpu.spmd(len, da.zeros((4, 2)), name=v)),
    ("spmd", "spmd", "progress", 3, lambda v: mgpu.spmd(len, da.zeros((4, 2)), progress=v)),
    ("spmd", "spmd", "timeout", 0, lambda v: mgpu.spmd(len, da.zeros((4, 2)), timeout=v)),
    ("spmd", "spmd", "restarts", -1, lambda v: mgpu.spmd(len, da.zeros((4, 2)), restarts=v)),
]

# parameters that no value makes bad, and why
NEVER_BAD = {
    ("NearestNeighbors.fit", "y"): "ignored, as in scikit-learn (the estimator API's slot)",
    ("GraphIndex.fit", "y"): "ignored, as in scikit-learn (the estimator API's slot)",
}

# the public names that are not functions or estimators with parameters
NOT_CALLED = {"DeviceMemoryError": "an exception class, raised, never called with options"}

METHODS = {"NearestNeighbors": ("fit", "kneighbors", "kneighbors_graph"),
           "MatrixFactorization": ("fit", "predict"),
           "GaP": ("fit", "transform"),
           "GradientMF": ("fit", "predict"),
           "GraphIndex": ("fit", "kneighbors", "save", "load")}


def _public():
    """(name, callable) for every public function, estimator and estimator method."""
    objs = {n: getattr(mgpu, n) for n in mgpu.__all__ if n not in NOT_CALLED}
    objs.update(GaP=mgpu.models.GaP, GradientMF=mgpu.models.GradientMF,
                GraphIndex=mgpu.models.GraphIndex)
    for name, obj in list(objs.items()):
        for method in METHODS.get(name, ()):
            objs[f"{name}.{method}"] = getattr(obj, method)
    return objs


def test_every_parameter_has_a_bad_value_or_a_reason():
    covered = {(c, p) for c, _, p, _, _ in CASES} | set(NEVER_BAD)
    want = set()
    for name, obj in _public().items():
        for param in inspect.signature(obj).parameters:
            if param != "self":
                want.add((name, param))
    assert not want - covered, f"parameters with no bad value tried: {sorted(want - covered)}"
    assert not covered - want, f"cases of no public parameter: {sorted(covered - want)}"
    for name in set(mgpu.__all__) - set(NOT_CALLED):
        assert callable(getattr(mgpu, name))
    assert issubclass(mgpu.DeviceMemoryError, Exception)


def _refusal(func: str, param: str) -> str:
    return (rf"^The (?:'\w+' and )?'{re.escape(param)}'(?: and '\w+')? parameters? of "
            rf"{re.escape(func)}\b")


@pytest.mark.parametrize(("name", "func", "param", "bad", "call"), CASES,
                         ids=[f"{c}-{p}-{i}" for i, (c, _, p, _, _) in enumerate(CASES)])
def test_a_bad_value_is_refused_by_name(name, func, param, bad, call):
    with pytest.raises((TypeError, ValueError), match=_refusal(func, param)):
        call(bad)


# ---------------------------------------------------------------- the distributed paths
# With a dask input (or a cluster asked for), the same refusals come before any task is
# sent: the scheduler sees no new task.

def _tasks(dask_scheduler):
    return [str(k) for k in dask_scheduler.tasks]


@pytest.fixture(scope="module")
def tiles(client):
    return {"rows": mgpu.from_scipy(S, 2, axis=0), "cols": mgpu.from_scipy(S, 2, axis=1),
            "index": mgpu.from_scipy(sp.csr_matrix(X), 2, axis=0),
            "graph": G, "ratings": mgpu.from_scipy(R, 2, axis=0)}


DISTRIBUTED = [  # (function, parameter, call on the tiles)
    ("knn", "k", lambda t: mgpu.knn(t["index"], X, 0)),
    ("knn", "queries", lambda t: mgpu.knn(t["index"], XNAN, 2)),
    ("knn", "metric", lambda t: mgpu.knn(t["index"], X, 2, metric="nope")),
    ("knn", "progress", lambda t: mgpu.knn(t["index"], X, 2, progress=3)),
    ("knn", "working_memory", lambda t: mgpu.knn(t["index"], X, 2, working_memory="lots")),
    ("knn", "working_memory", lambda t: mgpu.knn(t["index"], X, 2, working_memory=-5)),
    ("sddmm", "A", lambda t: mgpu.sddmm(t["cols"], A[:4], B)),
    ("sddmm", "B", lambda t: mgpu.sddmm(t["cols"], A, _nan(B))),
    ("sddmm", "hadamard", lambda t: mgpu.sddmm(t["cols"], A, B, hadamard="no")),
    ("sddmm", "plan", lambda t: mgpu.sddmm(t["cols"], A, B, plan="p")),
    ("spmv", "x", lambda t: mgpu.spmv(t["rows"], np.ones(4))),
    ("spmv", "x", lambda t: mgpu.spmv(t["rows"], np.full(5, NAN))),
    ("spmv", "check_finite", lambda t: mgpu.spmv(t["rows"], np.ones(5), check_finite="no")),
    ("spmm", "X", lambda t: mgpu.spmm(t["rows"], np.ones(5))),
    ("spgemm", "B", lambda t: mgpu.spgemm(t["rows"], S)),
    ("spgemm", "B", lambda t: mgpu.spgemm(t["rows"], _nan(ST))),
    ("spgemm", "B", lambda t: mgpu.spgemm(t["rows"], t["rows"])),
    ("spgemm", "mask", lambda t: mgpu.spgemm(t["rows"], ST, mask=sp.csr_matrix((6, 5)))),
    ("spgemm", "parts", lambda t: mgpu.spgemm(t["rows"], ST, parts=2)),
    ("spgemm", "parts", lambda t: mgpu.spgemm(S, ST, parts=7)),
    ("spgemm", "B", lambda t: mgpu.spgemm(S, _nan(ST), parts=2)),
    ("spgemm", "progress", lambda t: mgpu.spgemm(t["rows"], ST, progress=print)),
    ("jaccard", "G", lambda t: mgpu.jaccard(_nan(t["graph"]), parts=2)),
    ("jaccard", "weighted", lambda t: mgpu.jaccard(t["graph"], parts=2, weighted="yes")),
    ("jaccard", "progress", lambda t: mgpu.jaccard(t["graph"], parts=2, progress=3)),
    ("from_scipy", "S", lambda t: mgpu.from_scipy(S.astype(complex), 2)),
    ("from_scipy", "progress", lambda t: mgpu.from_scipy(S, 2, progress=3)),
    ("GaP.fit", "progress", lambda t: _gap().fit(t["ratings"], progress=3)),
    ("GaP.fit", "parts", lambda t: _gap().fit(R, parts=0)),
    ("GaP", "topics", lambda t: _gap(topics=0).fit(t["ratings"])),
    ("GradientMF.fit", "test", lambda t: _gmf().fit(t["ratings"], "test")),
    ("GradientMF.fit", "progress", lambda t: _gmf().fit(R, parts=2, progress=3)),
    ("GradientMF", "lr", lambda t: _gmf(lr=-1).fit(t["ratings"])),
    ("GraphIndex.fit", "X", lambda t: _gi(partition="clusters").fit(t["index"])),
    ("GraphIndex.fit", "metric",
     lambda t: _gi(partition="clusters", metric="inner_product").fit(da.from_array(X))),
]


@pytest.mark.parametrize(("func", "param", "call"), DISTRIBUTED,
                         ids=[f"{f}-{p}-{i}" for i, (f, p, _) in enumerate(DISTRIBUTED)])
def test_the_distributed_paths_refuse_before_any_task(client, tiles, func, param, call):
    before = set(client.run_on_scheduler(_tasks))
    with pytest.raises((TypeError, ValueError), match=_refusal(func, param)):
        call(tiles)
    assert set(client.run_on_scheduler(_tasks)) - before == set()


# ---------------------------------------------------------------- the data check itself

def test_check_array_words_each_refusal_by_parameter_function_and_device():
    from mgpu.ops.validation import check_array

    F = np.asfortranarray(X)
    out = check_array(F, "X", "f", order="C")
    assert out.flags.c_contiguous and np.array_equal(out, X)
    assert check_array(X, "X", "f", order="C") is X
    with pytest.raises(ValueError, match=r"^The 'X' parameter of f must not be empty\. Got "
                                         r"shape \(0, 4\) instead\.$"):
        check_array(X[:0], "X", "f", ensure_non_empty=True)
    with pytest.raises(TypeError, match=r"^The 'X' parameter of f is on the host, and f takes "
                                        r"GPU data here: pass cupy/cupyx\.$"):
        check_array(X, "X", "f", devices=("gpu",))
    with pytest.raises(TypeError, match=r"^The 'S' parameter of f must be a 2-D numpy array\. "
                                        r"Got csr_matrix instead\.$"):
        check_array(S, "S", "f", accept_sparse=False, devices=("cpu",))
    with pytest.raises(ValueError, match=r"^The 'x' parameter of f must be 1-D\. Got shape "
                                         r"\(6, 4\) instead; a hint\.$"):
        check_array(X, "x", "f", ndim=1, ndim_hint="; a hint")
    with pytest.raises(ValueError, match=r"^The 'S' parameter of f holds NaN or infinity "
                                         r"\(first at row 0, column \d\)\.$"):
        check_array(_nan(S), "S", "f", ensure_all_finite=True)
    assert check_array(XNAN, "X", "f") is XNAN  # values are looked at only when asked
