"""``mgpu bench ann`` (mgpu.bench.ann): recall and queries/s of the graph index, exact kNN
and the peers, on dense and sparse rows."""
from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner

from mgpu.bench import ann
from mgpu.cli import main


def _data(n=1500, nq=60, d=12, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((20, d)) * 4
    X = c[rng.integers(0, 20, n + nq)] + rng.standard_normal((n + nq, d))
    return X[:n], X[n:]


def test_the_graph_against_exact_neighbours():
    X, Q = _data()
    rows = ann.bench_ann(X, Q, k=5, degree=24, build_candidates=48, candidates=(8, 64),
                         peers=())
    assert [(r["method"], r["candidates"]) for r in rows] == [
        ("mgpu exact", None), ("mgpu graph", 8), ("mgpu graph", 64)]
    assert rows[0]["recall"] == 1.0 and rows[0]["build_s"] is None
    assert rows[1]["recall"] <= rows[2]["recall"] and rows[2]["recall"] > 0.9
    assert all(r["qps"] > 0 and r["note"] is None for r in rows)
    assert rows[1]["build_s"] == rows[2]["build_s"] > 0  # one build, two searches


def test_a_peer_not_installed_is_said(monkeypatch):
    real = importlib.import_module

    def without_hnswlib(name, *a, **kw):
        if name == "hnswlib":
            raise ImportError("no hnswlib here")
        return real(name, *a, **kw)

    monkeypatch.setattr(ann.importlib, "import_module", without_hnswlib)
    X, Q = _data(600, 20)
    rows = ann.bench_ann(X, Q, k=5, degree=8, build_candidates=16, candidates=(16,),
                         peers=("hnswlib",))
    assert rows[-1]["method"] == "hnswlib HNSW" and rows[-1]["note"] == "not installed"
    assert "| hnswlib HNSW | | | | not installed |" in ann.markdown(rows, 5)


def test_sparse_rows_have_no_peer():
    rng = np.random.default_rng(1)
    X = sp.random(800, 300, density=0.05, format="csr", random_state=rng)
    X.data += 1
    rows = ann.bench_ann(X[:700], X[700:], k=5, degree=8, build_candidates=16,
                         candidates=(16,), peers=tuple(ann.PEERS), metric="cosine")
    assert {r["method"] for r in rows if r["note"]} == set(ann.PEERS.values())
    assert all("no peer exists for sparse rows" in r["note"] for r in rows if r["note"])
    assert 0 < rows[1]["recall"] <= 1  # uniform random words: near ties everywhere


@pytest.mark.parametrize("peer", sorted(ann.PEERS))
def test_an_installed_peer_is_measured(peer):
    pytest.importorskip(peer)
    X, Q = _data()
    rows = ann.bench_ann(X, Q, k=5, degree=16, build_candidates=32, candidates=(32,),
                         peers=(peer,), metric="cosine")
    assert rows[-1]["method"] == ann.PEERS[peer] and rows[-1]["recall"] > 0.9


def test_the_command(tmp_path):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "ann.json", tmp_path / "ann.png"
    r = CliRunner().invoke(main, ["bench", "ann", "--clustered", "800x8", "--queries", "50",
                                  "--k", "5", "--degree", "8", "--build-candidates", "16",
                                  "--candidates", "8,16", "--json", str(out), "--plot",
                                  str(png)])
    assert r.exit_code == 0, r.output
    assert "| mgpu graph | 16 |" in r.output and png.stat().st_size > 0
    got = json.loads(out.read_text())
    assert got["k"] == 5 and [row["candidates"] for row in got["rows"][:3]] == [None, 8, 16]


def test_the_command_on_tfidf_rows(tmp_path):
    """--tfidf: sparse synthetic rows, cosine, with no peer (their rows say so)."""
    out = tmp_path / "t.json"
    r = CliRunner().invoke(main, ["bench", "ann", "--tfidf", "1500x800", "--queries", "100",
                                  "--metric", "cosine", "--candidates", "32", "--json",
                                  str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())["rows"]
    assert rows[1]["method"] == "mgpu graph" and rows[1]["recall"] > 0.8
    assert all("no peer exists" in row["note"] for row in rows[2:])


@pytest.mark.parametrize("args,text", [
    ([], "give one of an input file (INPUT), --clustered"),
    (["--clustered", "100x4", "--tfidf", "100x50"], "give one of an input file (INPUT)"),
    (["--clustered", "100x4", "--queries", "100"], "leaves no index"),
])
def test_the_command_refuses(args, text):
    r = CliRunner().invoke(main, ["bench", "ann", *args])
    assert r.exit_code == 2 and text in r.output, r.output


def test_mnist_file(data_dir, tmp_path):
    """A real vectors file: MNIST's images, flattened."""
    path = data_dir / "vectors" / "mnist_t10k-images-idx3-ubyte.gz"
    r = CliRunner().invoke(main, ["bench", "ann", str(path), "--queries", "9500",
                                  "--candidates", "32", "--json", str(tmp_path / "m.json")])
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "m.json").read_text())["rows"]
    graph = [row for row in rows if row["method"] == "mgpu graph"]
    assert graph and graph[0]["recall"] > 0.8


def test_a_search_is_timed_as_a_median_after_an_untimed_call(monkeypatch):
    from mgpu.models import GraphIndex

    calls = []
    real = GraphIndex.kneighbors
    monkeypatch.setattr(GraphIndex, "kneighbors",
                        lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    X, Q = _data(400, 10)
    ann.bench_ann(X, Q, k=5, degree=8, build_candidates=16, candidates=(8, 16), peers=(),
                  repeats=4)
    assert len(calls) == 2 * (1 + 4)


def test_the_scaling_command(tmp_path):
    """``mgpu bench ann-scaling`` on a CPU cluster of two workers: the one-device rows, then
    the index cut by clusters (each probes value, with its job's own time) and by rows; the
    recall of each sharded search near the one-device index's; the table's ratios are to
    the one-device row of the same candidates."""
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    r = CliRunner().invoke(main, ["bench", "ann-scaling", "--clustered", "3000x8",
                                  "--queries", "200", "--truth-queries", "150", "--workers",
                                  "2", "--degree", "12", "--build-candidates", "24",
                                  "--candidates", "16,32", "--repeats", "1", "--json",
                                  str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())["rows"]
    assert [(row["method"], row["candidates"]) for row in rows] == [
        ("one process (CPU)", 16), ("one process (CPU)", 32),
        ("2 CPU workers, clusters, probes 1", 16), ("2 CPU workers, clusters, probes 1", 32),
        ("2 CPU workers, clusters, probes 2", 16), ("2 CPU workers, clusters, probes 2", 32),
        ("2 CPU workers, rows", 16), ("2 CPU workers, rows", 32)]
    assert all(row["recall"] > 0.85 for row in rows)
    assert all((row["job_qps"] is not None) == ("clusters" in row["method"]) for row in rows)
    assert [row["workers"] for row in rows] == [None] * 2 + [2] * 6
    ratio = rows[2]["qps"] / rows[0]["qps"]
    assert f"| {rows[2]['qps']:,.0f} | {rows[2]['job_qps']:,.0f} | {ratio:.2f} |" in r.output
    assert png.stat().st_size > 0


@pytest.mark.parametrize("args,text", [
    ([], "give one of an input file (INPUT) and --clustered"),
    (["--clustered", "100x4", "--partitions", "cols"], "give clusters, rows"),
    (["--clustered", "100x4", "--queries", "100"], "leaves no index"),
])
def test_the_scaling_command_refuses(args, text):
    r = CliRunner().invoke(main, ["bench", "ann-scaling", *args])
    assert r.exit_code == 2 and text in r.output, r.output


def test_the_large_command(tmp_path):
    """``mgpu bench ann-large`` on two CPU workers: the rows made on the workers, the exact
    kNN's row first (recall 1), then each probes value at each candidates, with its job's
    own time; the sizes it states are the index's; the shards hold every row."""
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "l.json", tmp_path / "l.png"
    r = CliRunner().invoke(main, ["bench", "ann-large", "--rows", "3000", "--dims", "8",
                                  "--workers", "2", "--queries", "300", "--truth-queries",
                                  "200", "--degree", "12", "--build-candidates", "24",
                                  "--candidates", "16,32", "--batch", "256", "--repeats", "1",
                                  "--json", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    got = json.loads(out.read_text())
    assert got["rows"] == 3000 and got["index_bytes"] == 3000 * (8 * 4 + 12 * 4)
    assert sum(got["shards"]) == 3000 and len(got["shards"]) == 2
    rows = got["results"]
    assert [(row["method"], row["candidates"]) for row in rows] == [
        ("mgpu exact kNN (2 CPU workers)", None),
        ("mgpu graph, 2 CPU workers, clusters, probes 1", 16),
        ("mgpu graph, 2 CPU workers, clusters, probes 1", 32),
        ("mgpu graph, 2 CPU workers, clusters, probes 2", 16),
        ("mgpu graph, 2 CPU workers, clusters, probes 2", 32)]
    assert rows[0]["recall"] == 1.0 and all(row["recall"] > 0.85 for row in rows)
    assert all(row["job_qps"] is not None for row in rows[1:])
    assert "3,000 rows x 8" in r.output and "built 100%" in r.output
    assert png.stat().st_size > 0
    r = CliRunner().invoke(main, ["bench", "ann-large", "--rows", "2000", "--dims", "8",
                                  "--workers", "2", "--partition", "rows", "--queries", "100",
                                  "--degree", "12", "--build-candidates", "24",
                                  "--candidates", "32", "--batch", "256", "--repeats", "1",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())["results"]
    assert [row["method"] for row in rows] == ["mgpu exact kNN (2 CPU workers)",
                                               "mgpu graph, 2 CPU workers, rows"]
    assert rows[1]["recall"] > 0.9 and rows[1]["job_qps"] is None


@pytest.mark.parametrize("args,text", [
    ([], "give one of --rows and --memory"),
    (["--rows", "10", "--memory", "1.1"], "give one of --rows and --memory"),
    (["--memory", "1.1"], "needs --gpu"),
])
def test_the_large_command_refuses(args, text):
    r = CliRunner().invoke(main, ["bench", "ann-large", *args])
    assert r.exit_code == 2 and text in r.output, r.output


def test_the_large_bench_makes_each_workers_rows_there(client, monkeypatch):
    """Each worker makes its share of the rows in tiles of at most ``_TILE`` rows, held on
    it; each row is a centre plus noise of about unit spread; no query is one of them."""
    from mgpu.bench import ann_large
    from mgpu.distributed.cluster import workers_now

    monkeypatch.setattr(ann_large, "_TILE", 700)
    names = sorted(workers_now(client))
    C = np.random.default_rng(0).standard_normal((5, 4)) * 4
    X = ann_large._made(client, C, np.array([0, 1500, 3000]), names, 0, False)
    assert X.chunks == ((700, 700, 100, 700, 700, 100), (4,)) and X.dtype == np.float32
    from mgpu.distributed.collection import block_futures

    blocks = block_futures(X, client)
    held = client.who_has([blocks[(i, 0)] for i in range(6)])
    assert [list(held[blocks[(i, 0)].key]) for i in range(6)] == \
        [[names[0]]] * 3 + [[names[1]]] * 3
    rows = X.compute()
    noise = rows - C[np.argmin(((rows[:, None] - C[None]) ** 2).sum(axis=2), axis=1)]
    assert 0.9 < noise.std() < 1.1 and len(np.unique(rows, axis=0)) == 3000
    queries = ann_large._rows_near(C, 500, 0, False)  # the bench's queries, of seed 0
    assert not (queries[:, None, :] == rows[None]).all(axis=2).any()  # none is a row
