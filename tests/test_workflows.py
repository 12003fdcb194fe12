"""Every script of workflows/ runs end to end, as a user runs it, on small real data from
../shared/data, and prints or writes what it should: values checked against an independent
computation (scikit-learn, dense scipy arithmetic) or against the estimator in this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / "workflows"

pytestmark = pytest.mark.slow


def _data(data_dir: Path, rel: str) -> Path:
    path = data_dir / rel
    if not path.is_file():
        pytest.skip(f"{path.name} not found in {path.parent}")
    return path


def _run(script: str, *args: object, cwd: Path) -> str:
    """Run a workflow as ``python workflows/SCRIPT ARGS`` with this checkout's mgpu."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, str(WORKFLOWS / script), *map(str, args)],
                         capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


def test_every_workflow_is_tested_and_documented():
    scripts = sorted(p.name for p in WORKFLOWS.glob("*.py"))
    assert scripts == ["jaccard_weights.py", "knn_graph.py", "recommender.py",
                       "sddmm_loop.py", "topic_model.py", "triangles.py"]
    readme = (WORKFLOWS / "README.md").read_text()
    for name in scripts:
        assert name in readme
        source = (WORKFLOWS / name).read_text()
        assert 'if __name__ == "__main__":' in source  # spawned workers import the script
        assert "mgpu._" not in source and "from mgpu.distributed" not in source


def test_topic_model_on_the_ap_corpus(data_dir, tmp_path):
    from mgpu import io
    from mgpu.models import GaP

    corpus = _data(data_dir, "bow/ap.dat.gz")
    vocab = _data(data_dir, "bow/ap_vocab.txt.gz")
    stdout = _run("topic_model.py", corpus, "--vocab", vocab, "--topics", 8, "--iters", 4,
                  "--workers", 2, "--cpu", "--out", "topics.json", cwd=tmp_path)
    got = json.loads((tmp_path / "topics.json").read_text())
    S = sp.csr_matrix(io.load(str(corpus)))
    one = GaP(8, iters=4).fit(S)
    ll = [h["loglik_per_token"] for h in got["history"]]
    # float32 counts: the cluster sums the topics' update tile by tile, rounding differently
    np.testing.assert_allclose(ll, [h["loglik_per_token"] for h in one.history_], rtol=1e-6)
    assert ll[-1] > ll[0]
    import gzip

    with gzip.open(vocab, "rt") as f:
        words = [w.strip() for w in f if w.strip()]
    assert got["top_words"] == one.top_words(words, 8)
    assert len(got["tiles"]) == 2
    assert sum(t["rows"] for t in got["tiles"]) == S.shape[0]
    assert sum(t["nnz"] for t in got["tiles"]) == S.nnz
    assert f"topic  7: {' '.join(got['top_words'][7])}" in stdout


def test_knn_graph_of_ap_documents_matches_brute_force(data_dir, tmp_path):
    from sklearn.metrics.pairwise import cosine_distances

    from mgpu import io

    corpus = _data(data_dir, "bow/ap.dat.gz")
    rows, k = 600, 5
    stdout = _run("knn_graph.py", corpus, "--rows", rows, "-k", k, "--metric", "cosine",
                  "--workers", 2, "--cpu", "--out", "knn.npz", cwd=tmp_path)
    G = sp.load_npz(tmp_path / "knn.npz").tocsr()
    S = sp.csr_matrix(io.load(str(corpus)), dtype=np.float64)[:rows]
    D = cosine_distances(S)
    np.fill_diagonal(D, np.inf)  # a row is not its own neighbour
    assert G.shape == (rows, rows) and (np.diff(G.indptr) == k).all()
    i = np.repeat(np.arange(rows), k)
    assert (G.indices != i).all()
    # every listed distance is that pair's, and the k smallest of the row: ties may pick
    # other rows at the same distance, so the distances are compared, not the ids
    np.testing.assert_allclose(G.data, D[i, G.indices], rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.sort(G.data.reshape(rows, k), axis=1),
                               np.sort(D, axis=1)[:, :k], rtol=0, atol=1e-9)
    assert f"mean {G.data.reshape(rows, k)[:, 0].mean():.4f}" in stdout


def test_jaccard_weights_of_the_facebook_graph(data_dir, tmp_path):
    from mgpu import io

    graph = _data(data_dir, "graphs/facebook_combined.txt.gz")
    _run("jaccard_weights.py", graph, "--workers", 2, "--cpu", "--top", 5,
         "--out", "j.npz", "--json", "j.json", cwd=tmp_path)
    J = sp.load_npz(tmp_path / "j.npz").tocsr()
    summary = json.loads((tmp_path / "j.json").read_text())
    # |N(i) ∩ N(j)| / |N(i) ∪ N(j)| by dense-free scipy arithmetic on the undirected pattern
    G, ids = io.load_snap(graph, relabel=True, return_ids=True, dtype=np.float64)
    A = sp.csr_matrix(((G + G.T) != 0).astype(np.float64))
    A.setdiag(0)
    A.eliminate_zeros()
    A.sort_indices()
    r, c = A.nonzero()
    common = np.asarray((A @ A)[r, c]).ravel()
    deg = np.diff(A.indptr)
    ref = sp.csr_matrix((common / (deg[r] + deg[c] - common), (r, c)), shape=A.shape)
    J.sort_indices()
    ref.sort_indices()
    assert np.array_equal(J.indptr, ref.indptr) and np.array_equal(J.indices, ref.indices)
    np.testing.assert_allclose(J.data, ref.data, rtol=1e-12, atol=0)
    assert summary["histogram"]["edges"] == 88_234  # SNAP's count of undirected edges
    up = sp.triu(ref, k=1).tocoo()
    order = np.lexsort((up.col, up.row, -up.data))[:5]
    assert summary["top_edges"] == [[int(ids[up.row[o]]), int(ids[up.col[o]]),
                                     pytest.approx(float(up.data[o]), rel=1e-12)]
                                    for o in order]


def test_triangles_of_the_ca_hepph_graph(data_dir, tmp_path):
    import networkx as nx

    from mgpu import io

    # stored both ways, with 32 self-loops (dropped) and ids that are not contiguous
    graph = _data(data_dir, "graphs/ca-HepPh.txt.gz")
    stdout = _run("triangles.py", graph, "--top", 5, "--out", "t.csv", "--json", "t.json",
                  cwd=tmp_path)
    G, ids = io.load_snap(graph, relabel=True, return_ids=True)
    H = nx.from_scipy_sparse_array(G)
    H.remove_edges_from(list(nx.selfloop_edges(H)))
    ref = nx.triangles(H)
    rows = (tmp_path / "t.csv").read_text().splitlines()
    assert rows[0] == "node_id,triangles"
    assert rows[1:] == [f"{ids[v]},{ref[v]}" for v in range(len(ids))]
    got = json.loads((tmp_path / "t.json").read_text())
    s = got["summary"]
    assert s["triangles"] == 3_358_499  # SNAP's count
    assert s["vertices"] == 12_008 and s["edges"] == H.number_of_edges()
    assert s["transitivity"] == pytest.approx(nx.transitivity(H), rel=1e-12)
    assert s["average_clustering"] == pytest.approx(nx.average_clustering(H), rel=1e-12)
    order = sorted(ref, key=lambda v: (-ref[v], v))[:5]
    assert got["top_vertices"] == [[int(ids[v]), ref[v]] for v in order]
    assert f"  vertex {ids[order[0]]}: {ref[order[0]]:,} triangles" in stdout


def test_recommender_on_movielens(data_dir, tmp_path):
    from mgpu.io import load_ratings
    from mgpu.mf import split_ratings
    from mgpu.models import GradientMF

    path = _data(data_dir, "ratings/ml-latest-small-2016_ratings.csv.gz")
    _run("recommender.py", path, "-k", 8, "--iters", 5, "--workers", 1, "--cpu",
         "--top", 10, "--out", "rec.json", cwd=tmp_path)
    got = json.loads((tmp_path / "rec.json").read_text())
    ratings = load_ratings(path)
    train, test = split_ratings(ratings.matrix, 0.1, 0)
    one = GradientMF(k=8, iters=5).fit(train, test)
    for key in ("train_rmse", "test_rmse"):
        np.testing.assert_allclose([h[key] for h in got["history"]],
                                   [h[key] for h in one.history_], rtol=1e-7)
    assert got["history"][-1]["test_rmse"] < got["history"][0]["test_rmse"]
    assert got["user"] == int(ratings.user_ids[0])
    scores = one.mean_ + one.U_[0] @ one.V_.T
    rated = set(train[0].indices.tolist())
    column = {int(item): j for j, item in enumerate(ratings.item_ids)}
    recs = got["recommendations"]
    assert len(recs) == 10
    assert not rated & {column[r["item"]] for r in recs}  # nothing the user rated
    np.testing.assert_allclose([r["score"] for r in recs],
                               [scores[column[r["item"]]] for r in recs], rtol=1e-5)
    unrated = np.delete(scores, sorted(rated))
    np.testing.assert_allclose([r["score"] for r in recs], np.sort(unrated)[::-1][:10],
                               rtol=1e-5)


def _margin_fit(S: sp.csr_matrix, A: np.ndarray, B: np.ndarray, steps: int):
    """The loop of sddmm_loop.py in float64 scipy arithmetic, on one process."""
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    r, c = np.asarray(S.sum(axis=1)).ravel(), np.asarray(S.sum(axis=0)).ravel()
    A, B, errors = A.astype(np.float64), B.astype(np.float64), []
    for _ in range(steps):
        P = sp.csr_matrix((np.einsum("ik,ik->i", A[rows], B[S.indices]), S.indices,
                           S.indptr), shape=S.shape)
        rs = np.asarray(P.sum(axis=1)).ravel()
        errors.append(np.sqrt(((rs - r) ** 2).sum() / (r ** 2).sum()))
        t = np.where(rs > 0, r / np.where(rs > 0, rs, 1), 1)
        A *= t[:, None]
        col = P.T @ t
        B *= np.where(col > 0, c / np.where(col > 0, col, 1), 1)[:, None]
    return A, B, errors


def test_sddmm_loop_spmd_and_per_call_match_one_process(data_dir, tmp_path):
    from mgpu import io

    corpus = _data(data_dir, "bow/ap.dat.gz")
    stdout = _run("sddmm_loop.py", corpus, "-k", 8, "--steps", 12, "--workers", 2, "--cpu",
                  "--seed", 3, "--out", "loop.json", cwd=tmp_path)
    got = json.loads((tmp_path / "loop.json").read_text())
    S = sp.csr_matrix(io.load(str(corpus)), dtype=np.float32)
    rng = np.random.default_rng(3)
    A0 = rng.uniform(0.5, 1.5, (S.shape[0], 8)).astype(np.float32)
    B0 = rng.uniform(0.5, 1.5, (S.shape[1], 8)).astype(np.float32)
    A, B, errors = _margin_fit(S, A0, B0, 12)
    assert got["tiles"] == 2 and len(got["spmd"]["errors"]) == 12
    for loop in ("spmd", "per_call"):  # float32 against float64: rounding only
        np.testing.assert_allclose(got[loop]["A"], A, rtol=2e-4, atol=1e-4 * np.abs(A).max())
        np.testing.assert_allclose(got[loop]["B"], B, rtol=2e-4, atol=1e-4 * np.abs(B).max())
        np.testing.assert_allclose(got[loop]["errors"][:4], errors[:4], rtol=1e-3)
    assert got["spmd"]["errors"][-1] < 1e-4 * got["spmd"]["errors"][0]
    assert "SPMD step   1: row-margin error" in stdout and "per call:" in stdout
