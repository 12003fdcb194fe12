"""The pure helpers of ``mgpu bench knn``, on the host: the peers' distance-and-select step
(expanded_select) against scikit-learn's pairwise distances; which batch of which route is
the best, and that mgpu's SpGEMM route is no cuSPARSE peer there nor in the GPU table. On a
GPU, the bench itself times mgpu's SpGEMM route beside the peers."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import pairwise_distances

from mgpu.bench.knn import (MGPU_SPGEMM_BATCHES, best_batch, best_cusparse, expanded_select,
                            markdown_gpu, spgemm_smaller)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_expanded_select_gives_each_querys_k_nearest(metric):
    rng = np.random.default_rng(4)
    X, Q, k = rng.standard_normal((200, 12)), rng.standard_normal((30, 12)), 7
    sq = (X * X).sum(axis=1)
    dist, ids = expanded_select(Q @ X.T, (Q * Q).sum(axis=1), sq, np.sqrt(sq), metric, k)
    ref = pairwise_distances(Q, X, metric=metric)
    assert dist.shape == ids.shape == (30, k)
    np.testing.assert_allclose(dist, np.take_along_axis(ref, ids, 1), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.sort(dist, axis=1), np.sort(ref, axis=1)[:, :k], rtol=1e-9,
                               atol=1e-9)


# what _peer_rates leaves on a wide corpus: cuSPARSE's SpGEMM wrong or failing at 100 and
# 500 (right at 5), mgpu's SpGEMM route right and faster than every cuSPARSE route
WIDE = {"spgemm_100": "RuntimeError: CUSPARSE_STATUS_INSUFFICIENT_RESOURCES",
        "spgemm_500": "wrong: k-th distance off mgpu's by 0.97 (relative)",
        "spgemm_20": "wrong: k-th distance off mgpu's by 0.3 (relative)",
        "spgemm_5": 700.0, "spgemm_5_queries": 400,
        "spgemm_best": {"batch": 5, "qps": 700.0},
        "spmm_500": 3900.0, "spmm_2000": 3910.0,
        "mgpu_spgemm_100": 5000.0, "mgpu_spgemm_500": 9000.0,
        "mgpu_spgemm_2000": "DeviceMemoryError: the result needs 9.1 GiB",
        "mgpu_spgemm_best": {"batch": 500, "qps": 9000.0}}


def test_best_batch_takes_only_the_named_routes_right_batches():
    assert best_batch(WIDE, "spgemm") == {"batch": 5, "qps": 700.0}
    assert best_batch(WIDE, "mgpu_spgemm") == {"batch": 500, "qps": 9000.0}
    assert best_batch(WIDE, "spmm") == {"batch": 2000, "qps": 3910.0}
    # mgpu's keys end as cuSPARSE's do; they are still another route's
    assert best_batch({"mgpu_spgemm_100": 5000.0, "mgpu_spgemm_best": {"batch": 100}},
                      "spgemm") is None
    assert best_batch({"spgemm_100": 5000.0, "spgemm_5_queries": 400.0}, "mgpu_spgemm") is None
    assert best_batch({"spgemm_100": 2000.0, "spgemm_5_queries": 9e9}, "spgemm") == {
        "batch": 100, "qps": 2000.0}


def test_spgemm_smaller_is_blind_to_mgpus_spgemm_route():
    peers = {"spgemm_100": "RuntimeError: out of resources", "spgemm_500": "wrong: ...",
             "mgpu_spgemm_100": 5000.0, "mgpu_spgemm_500": 9000.0, "mgpu_spgemm_2000": 12000.0}
    tried = []

    def rate(bs):
        tried.append(bs)
        return {20: "wrong: k-th distance off mgpu's by 0.3 (relative)", 5: 700.0}.get(bs, 1.0)

    # mgpu's right batches of 100 and 500 neither spare cuSPARSE its smaller batches nor
    # become its best
    out = spgemm_smaller(peers, rate, 400)
    assert tried == [20, 5]
    assert out == {"spgemm_20": "wrong: k-th distance off mgpu's by 0.3 (relative)",
                   "spgemm_5": 700.0, "spgemm_5_queries": 400,
                   "spgemm_best": {"batch": 5, "qps": 700.0}}
    out = spgemm_smaller(peers, lambda bs: "fails", 400)
    assert out == {"spgemm_20": "fails", "spgemm_5": "fails"}
    tried.clear()
    out = spgemm_smaller({**peers, "spgemm_100": 2000.0}, rate, 400)
    assert tried == [] and out == {"spgemm_best": {"batch": 100, "qps": 2000.0}}


def test_best_cusparse_leaves_out_mgpus_routes_and_the_naive_kernel():
    assert best_cusparse(WIDE) == 3910.0
    assert best_cusparse({**WIDE, "naive_union": 1e6, "gemm_2000": 4000.0}) == 4000.0
    assert best_cusparse({"mgpu_spgemm_100": 5000.0, "naive_union": 80.0,
                          "spgemm_100": "wrong: ..."}) is None
    assert best_cusparse({}) is None


def _table(rows):
    """markdown_gpu's table as one dict a row, header → cell."""
    head, rule, *lines = markdown_gpu(rows, "wide").splitlines()
    assert head.count("|") == rule.count("|") and all(
        line.count("|") == head.count("|") for line in lines)
    names = [c.strip() for c in head.strip("|").split("|")]
    return [dict(zip(names, (c.strip() for c in line.strip("|").split("|")))) for line in lines]


def test_gpu_table_shows_mgpus_spgemm_route_in_its_own_columns():
    sparse = {"metric": "cosine", "mgpu_qps": 50000.0, "kernel": "postings",
              "fused_qps": 19000.0, "postings_qps": 50000.0, "peers": WIDE,
              "best_cusparse_qps": best_cusparse(WIDE),
              "speedup_vs_cusparse": 50000.0 / best_cusparse(WIDE)}
    dense = {"metric": "euclidean", "mgpu_qps": 8000.0, "kernel": "cublas",
             "peers": {"gemm_500": 4000.0, "gemm_2000": 5000.0}, "speedup_vs_cusparse": 1.6}
    namm = {"metric": "manhattan", "mgpu_qps": 900.0, "kernel": "fused",
            "peers": {"naive_union": 90.0}, "speedup_vs_naive": 10.0}
    batches = " / ".join(map(str, MGPU_SPGEMM_BATCHES))
    assert batches == "100 / 500 / 2000"
    wide, gemm, union = _table([sparse, dense, namm])
    assert list(wide)[:8] == ["corpus", "metric", "mgpu q/s", "kernel", "fused q/s",
                              "postings q/s", f"mgpu SpGEMM route {batches}",
                              "mgpu SpGEMM route best right (batch)"]
    assert wide[f"mgpu SpGEMM route {batches}"] == "5,000 / 9,000 / fails"
    assert wide["mgpu SpGEMM route best right (batch)"] == "9,000 (500)"
    # cuSPARSE's columns and the ratio to the best peer are cuSPARSE's alone
    assert (wide["SpGEMM 100"], wide["SpGEMM 500"]) == ("fails", "wrong")
    assert wide["SpGEMM best right (batch)"] == "700 (5)"
    assert wide["SpMM 2000"] == "3,910"
    assert wide["vs best cuSPARSE/cuBLAS"] == "12.8×"
    for row in (gemm, union):  # no sparse product there: no mgpu SpGEMM route
        assert row[f"mgpu SpGEMM route {batches}"] == "–"
        assert row["mgpu SpGEMM route best right (batch)"] == "–"
    assert gemm["GEMM 2000"] == "5,000" and union["naive union"] == "90"


@pytest.mark.gpu
def test_bench_gpu_times_mgpus_spgemm_route_beside_the_peers():
    from mgpu.bench.knn import bench_gpu
    from mgpu.synthetic import powerlaw_corpus

    X = powerlaw_corpus(3000, 2000, 0.01, seed=1).astype(np.float64)
    X = X[np.flatnonzero(np.diff(X.indptr))]  # as the CLI's corpus: no empty rows
    rows = bench_gpu(X, X[:2500], 10, ("cosine", "manhattan"), sklearn_queries=100,
                     repeats=1)
    cos, man = rows
    peers = cos["peers"]
    for bs in MGPU_SPGEMM_BATCHES:  # right on a corpus this small, so timed
        assert isinstance(peers[f"mgpu_spgemm_{bs}"], float), peers[f"mgpu_spgemm_{bs}"]
    assert peers["mgpu_spgemm_best"] == best_batch(peers, "mgpu_spgemm")
    assert peers["mgpu_spgemm_best"]["qps"] == max(peers[f"mgpu_spgemm_{bs}"]
                                                   for bs in MGPU_SPGEMM_BATCHES)
    assert peers.get("spgemm_best") == best_batch(peers, "spgemm")
    cusparse = [v for key, v in peers.items() if key.startswith(("spgemm_", "spmm_"))
                and isinstance(v, float)]
    assert cos["best_cusparse_qps"] == max(cusparse)
    assert cos["speedup_vs_cusparse"] == pytest.approx(cos["mgpu_qps"] / max(cusparse))
    assert not any(key.startswith("mgpu_spgemm") for key in man["peers"])
    best = peers["mgpu_spgemm_best"]
    assert _table(rows)[0]["mgpu SpGEMM route best right (batch)"] == (
        f"{best['qps']:,.0f} ({best['batch']})")
