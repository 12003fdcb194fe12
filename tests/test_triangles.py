"""Per-vertex triangle counts (``mgpu.triangles``, one masked SpGEMM) against networkx's
``triangles`` and ``transitivity``: random and power-law graphs, the real SNAP graphs, graphs
with self-loops and repeated edges, the refusals of what is not an undirected graph, and the
``mgpu run triangles`` command.

Convention: a self-loop is not an edge of a triangle and repeated entries are one edge.
networkx agrees: ``nx.triangles`` and ``nx.transitivity`` take a vertex's neighbours
without the vertex itself (see :func:`test_networkx_ignores_self_loops_too`), and a
``networkx.Graph`` holds each edge once.
"""
from __future__ import annotations

import importlib

import dask.array as da
import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner

import mgpu
from mgpu.cli import main
from mgpu.models.triangles import summary, top_vertices
from mgpu.ops.jaccard import check_graph


def _on(xp, G):
    """G (scipy) on xp's device: a cupyx CSR matrix for cupy (in float64 where G holds
    integers, which cupyx sparse matrices cannot: networkx's adjacency is int64)."""
    if xp is np:
        return G
    from conftest import to_gpu

    return to_gpu(G if G.dtype.kind in "bf" else G.astype(np.float64))[0]


def _count(xp, G, **kw):
    """mgpu.triangles of G on xp's device, checked to be xp's int64 1-D array, on the host."""
    t = mgpu.triangles(_on(xp, G), **kw)
    assert isinstance(t, xp.ndarray) and t.dtype == np.int64 and t.shape == (G.shape[0],)
    return t if xp is np else t.get()


def _networkx(G):
    """networkx's per-vertex counts of the graph of G's pattern, in vertex order."""
    H = nx.from_scipy_sparse_array(G)
    ref = nx.triangles(H)
    return np.array([ref[i] for i in range(G.shape[0])], dtype=np.int64)


def _adjacency(H):
    return sp.csr_matrix(nx.to_scipy_sparse_array(H, nodelist=range(len(H)), format="csr"))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n, p", [(60, 0.2), (300, 0.03)])
def test_gnp_random_graphs_equal_networkx(xp, seed, n, p):
    H = nx.gnp_random_graph(n, p, seed=seed)
    t = _count(xp, _adjacency(H))
    ref = nx.triangles(H)
    np.testing.assert_array_equal(t, [ref[i] for i in range(n)])
    assert t.sum() > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_powerlaw_cluster_graphs_equal_networkx(xp, seed):
    # hubs and many triangles: Holme and Kim's model, a triad closed after most edges
    H = nx.powerlaw_cluster_graph(800, 4, 0.6, seed=seed)
    G = _adjacency(H)
    t = _count(xp, G)
    np.testing.assert_array_equal(t, _networkx(G))
    s = summary(t, np.diff(G.indptr))
    assert s["triangles"] == sum(nx.triangles(H).values()) // 3
    assert s["edges"] == H.number_of_edges() and s["vertices"] == 800
    assert s["transitivity"] == pytest.approx(nx.transitivity(H), rel=1e-12)


def test_values_and_storage_do_not_matter(xp):
    H = nx.gnp_random_graph(120, 0.1, seed=5)
    G = _adjacency(H)
    ref = _networkx(G)
    W = G.multiply(np.random.default_rng(1).uniform(0.5, 1.5, G.shape)).tocsr()
    W = (W + W.T).tocsr()  # symmetric weights in (1, 3)
    variants = [W, G.astype(np.float32)]
    if xp is np:  # cupyx sparse matrices are float (or complex) CSR, CSC or COO only
        variants += [G.astype(np.int64), G.astype(bool), G.tocoo(), G.tocsc(), sp.csr_array(G)]
    for M in variants:
        np.testing.assert_array_equal(_count(xp, M), ref)


def test_self_loops_and_repeated_edges_count_as_in_networkx(xp):
    H = nx.powerlaw_cluster_graph(200, 3, 0.5, seed=7)
    simple = _adjacency(H).tocoo()
    rng = np.random.default_rng(7)
    loops = rng.choice(200, 40, replace=False)
    again = rng.choice(simple.nnz, 100, replace=False)  # stored twice more
    rows = np.concatenate([simple.row, loops, simple.row[again], simple.row[again]])
    cols = np.concatenate([simple.col, loops, simple.col[again], simple.col[again]])
    # a COO with duplicate entries, kept as duplicates in CSR by building it from arrays
    order = np.lexsort((cols, rows))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=200))])
    G = sp.csr_matrix((np.ones(rows.size), cols[order], indptr), shape=(200, 200))
    assert not G.has_canonical_format and G.diagonal().sum() == 40
    t = _count(xp, G)
    ref = nx.triangles(H)
    np.testing.assert_array_equal(t, [ref[i] for i in range(200)])
    # networkx's own graph with the self-loops gives the same counts
    np.testing.assert_array_equal(t, _networkx(sp.coo_matrix((np.ones(rows.size),
                                                              (rows, cols)), shape=G.shape)))


def test_networkx_ignores_self_loops_too():
    """The convention above, checked on networkx itself: a self-loop makes no triangle and
    does not count in a vertex's degree for ``transitivity``."""
    H = nx.complete_graph(3)
    H.add_edge(3, 2)
    looped = H.copy()
    looped.add_edges_from([(0, 0), (3, 3)])
    assert nx.triangles(looped) == nx.triangles(H) == {0: 1, 1: 1, 2: 1, 3: 0}
    assert nx.transitivity(looped) == nx.transitivity(H) == pytest.approx(0.6)
    G = sp.csr_matrix(nx.to_scipy_sparse_array(looped, nodelist=range(4)))
    t = mgpu.triangles(G)
    assert t.tolist() == [1, 1, 1, 0]
    s = summary(t, np.diff(check_graph(G).indptr))
    assert s == {"vertices": 4, "edges": 4, "triangles": 1, "triples": 5,
                 "transitivity": pytest.approx(0.6)}


def test_symmetrize_takes_either_direction(xp):
    H = nx.gnp_random_graph(150, 0.08, seed=11)
    up = sp.triu(_adjacency(H), k=1).tocsr()  # each edge once, as SNAP lists often are
    e = up.tocoo()
    flip = np.random.default_rng(11).random(e.nnz) < 0.5  # some edges one way, some the other
    mixed = sp.csr_matrix((e.data, (np.where(flip, e.col, e.row), np.where(flip, e.row, e.col))),
                          shape=up.shape)
    ref = _networkx(_adjacency(H))
    for D in (up, mixed):
        np.testing.assert_array_equal(_count(xp, D, symmetrize=True), ref)
    np.testing.assert_array_equal(_count(xp, _adjacency(H), symmetrize=True), ref)


def test_empty_and_edgeless_graphs(xp):
    assert _count(xp, sp.csr_matrix((0, 0))).shape == (0,)
    np.testing.assert_array_equal(_count(xp, sp.identity(5, format="csr")), np.zeros(5))
    star = nx.star_graph(6)  # edges, no triangle, no closed triple
    t = _count(xp, _adjacency(star))
    assert not t.any() and summary(t, np.array([6] + [1] * 6))["transitivity"] == 0.0
    assert summary(np.zeros(3, int), np.zeros(3, int))["transitivity"] == 0.0  # no triples


def test_refuses_what_is_not_an_undirected_graph():
    D = sp.csr_matrix(([1.0, 1.0, 1.0], ([0, 1, 2], [1, 2, 0])), shape=(3, 3))  # a 3-cycle
    with pytest.raises(ValueError, match=r"^The 'G' parameter of triangles must be an "
                                         r"undirected graph, but its pattern is not symmetric "
                                         r"\(first: row 0, column 1\)\. Pass symmetrize=True"):
        mgpu.triangles(D)
    assert mgpu.triangles(D, symmetrize=True).tolist() == [1, 1, 1]
    K4 = np.ones((4, 4)) - np.eye(4)
    with pytest.raises(TypeError, match=r"^The 'G' parameter of triangles must be a sparse "
                                        r"adjacency matrix.*pass scipy\.sparse\.csr_matrix"):
        mgpu.triangles(K4)
    with pytest.raises(TypeError, match=r"^The 'G' parameter of triangles is a dask array, and "
                                        r"the count runs on one device: pass a scipy or "
                                        r"cupyx matrix"):
        mgpu.triangles(da.from_array(sp.csr_matrix(K4), chunks=2))
    with pytest.raises(TypeError, match="is a dask array"):
        mgpu.triangles(da.from_array(K4, chunks=2))
    with pytest.raises(ValueError, match=r"must be a square adjacency matrix\. Got shape "
                                         r"\(3, 4\)"):
        mgpu.triangles(sp.random(3, 4, density=0.5, format="csr", random_state=0))
    bad = sp.csr_matrix(K4)
    bad.data[2] = np.nan
    with pytest.raises(ValueError, match=r"holds NaN or infinity \(first at row 0, column 3\)"):
        mgpu.triangles(bad)
    with pytest.raises((TypeError, ValueError), match="^The 'symmetrize' parameter of "
                                                      "triangles must be a bool"):
        mgpu.triangles(sp.csr_matrix(K4), symmetrize="yes")


def test_a_wrong_product_is_an_error_not_a_count(monkeypatch):
    module = importlib.import_module("mgpu.ops.triangles")  # mgpu.ops.triangles: the function
    real = module.spgemm

    def off_by_half(A, B, *, mask=None):
        C = real(A, B, mask=mask)
        C.data[0] += 0.5
        return C

    monkeypatch.setattr(module, "spgemm", off_by_half)
    K4 = sp.csr_matrix(np.ones((4, 4)) - np.eye(4))
    with pytest.raises(RuntimeError, match=r"row 0 of \(A @ A\) masked by A sums to 6\.5, "
                                           r"which is not an even integer"):
        mgpu.triangles(K4)


def test_the_product_runs_in_float64_whatever_the_input(xp, monkeypatch):
    # float32 sums stop being exact integers at 2**24 (a vertex of degree ~5,800 in a
    # clique): the counts are computed in float64 from every input dtype
    module = importlib.import_module("mgpu.ops.triangles")
    real, seen = module.spgemm, []

    def spy(A, B, *, mask=None):
        seen.append((A.dtype, B.dtype))
        return real(A, B, mask=mask)

    monkeypatch.setattr(module, "spgemm", spy)
    G = _adjacency(nx.complete_graph(5)).astype(np.float32)
    assert _count(xp, G).tolist() == [6] * 5
    assert seen == [(np.float64, np.float64)]


def test_top_vertices_break_ties_by_the_lower_vertex():
    assert top_vertices(np.array([2, 5, 5, 0, 2]), 4) == [(1, 5), (2, 5), (0, 2), (4, 2)]
    assert top_vertices(np.array([1, 2]), 0) == [] and top_vertices(np.array([1]), 5) == [(0, 1)]


# The SNAP graphs in shared/data/graphs with their triangle counts (SNAP's pages give the
# same): facebook stores each edge once, the others both ways (ca-HepPh with 32 self-loops).
REAL_GRAPHS = {
    "facebook_combined.txt.gz": (True, 1_612_010),
    "ca-HepPh.txt.gz": (False, 3_358_499),
    "email-Enron.txt.gz": (False, 727_044),
}


@pytest.mark.parametrize("name", [
    "facebook_combined.txt.gz", "ca-HepPh.txt.gz",
    pytest.param("email-Enron.txt.gz", marks=pytest.mark.slow)])
def test_real_graph_equals_networkx(data_dir, xp, name):
    """Every vertex of every graph against networkx on the same symmetric adjacency (2 to 7
    s each on one core, most of it networkx's)."""
    from mgpu import io

    path = data_dir / "graphs" / name
    if not path.is_file():
        pytest.skip(f"{name} not found in {path.parent}")
    one_way, total = REAL_GRAPHS[name]
    G = io.load(path)
    if one_way:
        with pytest.raises(ValueError, match="Pass symmetrize=True"):
            mgpu.triangles(G)
    t = _count(xp, G, symmetrize=one_way)
    S = (G + G.T).tocsr() if one_way else G
    H = nx.from_scipy_sparse_array(S)
    ref = nx.triangles(H)
    np.testing.assert_array_equal(t, [ref[i] for i in range(S.shape[0])])
    assert t.sum() == 3 * total
    s = summary(t, np.diff(check_graph(S).indptr))
    assert s["edges"] == H.number_of_edges() - nx.number_of_selfloops(H)
    assert s["transitivity"] == pytest.approx(nx.transitivity(H), rel=1e-12)


# ------------------------------------------------------------------ mgpu run triangles

EDGES = "# toy: a triangle 10-20-30 and 20-30-40, a tail to 50, a self-loop, a repeat\n" \
        "10 20\n20 30\n30 10\n30 40\n40 20\n10 50\n40 40\n20 10\n"


def _reference(text):
    H = nx.Graph()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            u, v = map(int, line.split())
            if u != v:
                H.add_edge(u, v)
    return H


def test_cli_prints_the_totals_and_writes_the_counts(tmp_path):
    path = tmp_path / "toy.txt"
    path.write_text(EDGES)
    H = _reference(EDGES)
    for suffix in ("csv", "npy"):
        out = tmp_path / f"t.{suffix}"
        r = CliRunner().invoke(main, ["run", "triangles", str(path), "--symmetrize",
                                      "--device", "cpu", "--top", "3", "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert "5 vertices, 6 edges; triangles: 2 (counted in " in r.output
        assert (f"global clustering coefficient {nx.transitivity(H):.6f} (10 connected "
                "triples)") in r.output
        assert "one masked SpGEMM" in r.output
        assert "most triangles (vertex id in the file: triangles):\n  20: 2\n  30: 2\n  10: 1\n" \
            in r.output
        assert f"counts written to {out}" in r.output
        ref = nx.triangles(H)
        if suffix == "csv":
            lines = out.read_text().splitlines()
            assert lines[0] == "node_id,triangles"
            assert lines[1:] == [f"{v},{ref[v]}" for v in sorted(ref)]
        else:
            got = np.load(out)
            assert got["node_id"].tolist() == sorted(ref)
            assert got["triangles"].tolist() == [ref[v] for v in sorted(ref)]
    assert not list(tmp_path.glob("*partial*"))


def test_cli_refuses_a_directed_graph_without_symmetrize(tmp_path):
    path = tmp_path / "toy.txt"
    path.write_text(EDGES)
    out = tmp_path / "t.csv"
    r = CliRunner().invoke(main, ["run", "triangles", str(path), "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert ("GRAPH must be an undirected graph, but its pattern is not symmetric (first: an "
            "edge 30 -> 10 without its reverse). Pass --symmetrize") in r.output
    assert not out.exists()
    # stored both ways, it needs no --symmetrize; without --top nothing is listed
    both = tmp_path / "both.txt"
    both.write_text("1 2\n2 1\n2 3\n3 2\n3 1\n1 3\n")
    r = CliRunner().invoke(main, ["run", "triangles", str(both), "--top", "0"])
    assert r.exit_code == 0, r.output
    assert "3 vertices, 3 edges; triangles: 1 (counted in" in r.output
    assert "most triangles" not in r.output
    assert "global clustering coefficient 1.000000 (3 connected triples)" in r.output
