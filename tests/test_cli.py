"""The mgpu command, driven through click's runner on a CPU cluster."""
from __future__ import annotations

import re

import pytest
import scipy.io
from click.testing import CliRunner

import mgpu
from mgpu.cli import main
from mgpu.synthetic import powerlaw_csr


@pytest.fixture
def runner():
    return CliRunner()


def test_version(runner):
    r = runner.invoke(main, ["--version"])
    assert r.exit_code == 0 and mgpu.__version__ in r.output


def test_info_lists_versions_and_workers(runner):
    r = runner.invoke(main, ["info", "--no-gpus"])
    assert r.exit_code == 0, r.output
    assert re.search(r"^  dask\s+\d", r.output, re.MULTILINE)
    assert "cluster: embedded LocalCluster on the CPU" in r.output
    m = re.search(r"^(\d+) worker\(s\), up in", r.output, re.MULTILINE)
    assert m and int(m.group(1)) >= 1
    assert len(re.findall(r"^  tcp://127\.0\.0\.1:\d+ .*CPU: \d+ core", r.output,
                          re.MULTILINE)) == int(m.group(1))


def test_info_without_start(runner):
    r = runner.invoke(main, ["info", "--no-start", "--address", "tcp://10.0.0.1:8786"])
    assert r.exit_code == 0, r.output
    assert "joins the scheduler at tcp://10.0.0.1:8786" in r.output
    assert "worker(s)" not in r.output


def test_run_partition_on_a_file_with_plot(runner, tmp_path):
    S = powerlaw_csr(4000, 900, 50_000, seed=4)
    path = tmp_path / "m.mtx"
    scipy.io.mmwrite(str(path), S)
    png = tmp_path / "balance.png"
    r = runner.invoke(main, ["run", "partition", str(path), "--parts", "4", "--axis", "1",
                             "--no-gpus", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert f"{S.nnz:,} nonzeros" in r.output
    assert "4 chunk(s) along axis 1 (columns)" in r.output
    imb = float(re.search(r"nnz imbalance \(max/mean\) ([\d.]+)", r.output).group(1))
    assert 1.0 <= imb <= 1.0 + S.getnnz(axis=0).max() / (S.nnz / 4)
    chunk_nnz = [int(v.replace(",", "")) for v in
                 re.findall(r"^\s+\d+\s+[\d,]+-[\d,]+\s+([\d,]+)", r.output, re.MULTILINE)]
    assert len(chunk_nnz) == 4 and sum(chunk_nnz) == S.nnz
    assert float(re.search(r"max relative error ([\d.e+-]+)", r.output).group(1)) <= 1e-6
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_run_partition_powerlaw(runner):
    r = runner.invoke(main, ["run", "partition", "--powerlaw", "3000x500", "--nnz", "20000",
                             "--no-gpus"])
    assert r.exit_code == 0, r.output
    assert "power-law 3,000 x 500" in r.output
    err = float(re.search(r"max relative error ([\d.e+-]+)", r.output).group(1))
    assert err <= 1e-6


def test_run_partition_needs_exactly_one_input(runner, tmp_path):
    r = runner.invoke(main, ["run", "partition"])
    assert r.exit_code != 0 and "give either an input file" in r.output
    r = runner.invoke(main, ["run", "partition", "--powerlaw", "12by4"])
    assert r.exit_code != 0 and "expected ROWSxCOLS" in r.output


def test_run_partition_refuses_unreadable_file(runner, tmp_path):
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"\x00\x01garbage")
    r = runner.invoke(main, ["run", "partition", str(bad), "--no-gpus"])
    assert r.exit_code != 0
    assert "Error" in r.output


def test_bench_partition_table(runner, data_dir):
    r = runner.invoke(main, ["bench", "partition", "--data", str(data_dir), "--parts", "4"])
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("| ") and "nnz" not in line
            and "missing" not in line]
    assert len(rows) >= 10
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        imb, bound = float(cells[7]), float(cells[8])
        assert 1.0 <= imb <= bound + 1e-9, line


def test_bench_sddmm_cpu(runner, tmp_path):
    out = tmp_path / "sddmm.json"
    r = runner.invoke(main, ["bench", "sddmm", "--data", str(tmp_path / "none"), "--powerlaw",
                             "2000x700", "--nnz", "20000", "--k", "8,33", "--device", "cpu",
                             "--repeats", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    import json

    rows = json.loads(out.read_text())
    assert [row["K"] for row in rows] == [8, 33]
    for row in rows:
        assert row["device"] == "cpu" and row["matrix"].startswith("power-law 2,000")
        assert row["max_rel_err"] <= 1e-6
        assert row["mgpu_gflops"] > 0 and row["speedup_vs_numpy"] > 0
    assert "| power-law 2,000×700 | 33 |" in r.output


def test_bench_sddmm_loop_on_cpu_workers(runner, tmp_path):
    out = tmp_path / "loop.json"
    r = runner.invoke(main, ["bench", "sddmm-loop", "--powerlaw", "3000x1200", "--nnz",
                             "60000", "--k", "16", "--steps", "6", "--workers", "1,2",
                             "--tiles-per-worker", "2", "--device", "cpu", "--json", str(out)])
    assert r.exit_code == 0, r.output
    import json

    rows = json.loads(out.read_text())
    assert [(row["workers"], row["kind"]) for row in rows] == [
        ("one device", "CPU"), (1, "CPU"), (2, "CPU")]
    for row in rows:  # the same loop from the same factors: one device's numbers
        assert row["correct"] and row["max_rel_err"] <= 1e-5 and row["steps"] == 6
        assert row["margin_error"][1] < 1e-3 * row["margin_error"][0]
        assert row["speedup"] == pytest.approx(rows[0]["loop_s"] / row["loop_s"])
    assert rows[0]["max_rel_err"] == 0.0 and rows[2]["job_s"] > 0
    assert "| 2 CPU |" in r.output


def test_bench_sddmm_scaling_on_cpu_workers(runner, tmp_path):
    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    r = runner.invoke(main, ["bench", "sddmm-scaling", "--powerlaw", "3000x1200", "--nnz",
                             "60000", "--k", "16", "--workers", "1,2", "--tiles-per-worker", "2",
                             "--device", "cpu", "--repeats", "2", "--json", str(out),
                             "--plot", str(png)])
    assert r.exit_code == 0, r.output
    import json

    rows = json.loads(out.read_text())
    assert [(row["workers"], row["tiles"], row["kind"]) for row in rows] == [
        ("one device, no cluster", 1, "CPU"), (1, 2, "CPU"), (2, 4, "CPU")]
    for row in rows:
        assert row["max_rel_err"] <= 1e-6 and row["median_s"] > 0
        assert 1.0 <= row["imbalance"] < 1.5
    assert "speedup" not in rows[0]
    assert rows[1]["speedup"] == 1.0
    assert rows[2]["speedup"] == pytest.approx(rows[1]["median_s"] / rows[2]["median_s"])
    assert "| 2 CPU | 4 |" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_knn_scaling_on_cpu_workers(runner, tmp_path):
    out, png = tmp_path / "knn.json", tmp_path / "knn.png"
    r = runner.invoke(main, ["bench", "knn-scaling", "--corpus", "3000x800", "--density", "0.01",
                             "--queries", "300", "--workers", "1,2", "--device", "cpu",
                             "--repeats", "1", "--metric", "manhattan", "--json", str(out),
                             "--plot", str(png)])
    assert r.exit_code == 0, r.output
    import json

    rows = json.loads(out.read_text())
    assert [(row["workers"], row["kind"]) for row in rows] == [
        ("one device, no cluster", "CPU"), (1, "CPU"), (2, "CPU")]
    assert [row.get("tiles") for row in rows] == [None, 1, 2]
    # every worker count finds exactly the one-device neighbours (ties to the lower id)
    assert [row.get("ids_equal_first") for row in rows] == [None, True, True]
    assert rows[1]["speedup"] == 1.0
    assert rows[2]["speedup"] == pytest.approx(rows[1]["median_s"] / rows[2]["median_s"])
    assert all(row["n_queries"] == 300 and row["qps"] > 0 for row in rows)
    assert "| power-law 3,000×800 | manhattan | 10 | 2 CPU | 2 |" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_sddmm_scaling_refuses_bad_counts(runner):
    r = runner.invoke(main, ["bench", "sddmm-scaling", "--powerlaw", "30x20", "--workers", "0"])
    assert r.exit_code != 0 and "every value must be >= 1" in r.output
    r = runner.invoke(main, ["bench", "sddmm-scaling", "--powerlaw", "30x20", "--workers", "a"])
    assert r.exit_code != 0 and "expected positive integers such as 1,2,4" in r.output
    r = runner.invoke(main, ["bench", "sddmm-scaling", "--powerlaw", "30x20", "--workers", "64",
                             "--device", "gpu"])
    assert r.exit_code != 0 and "GPU(s) are visible" in r.output


def test_run_knn_graph_on_a_file(runner, tmp_path):
    import numpy as np
    import scipy.sparse as sp
    from sklearn.neighbors import NearestNeighbors as SkNN

    S = powerlaw_csr(300, 80, 4000, seed=3).astype(np.float64)
    S = S[np.flatnonzero(np.diff(S.indptr))]  # cosine needs rows with mass
    path = tmp_path / "m.mtx"
    scipy.io.mmwrite(str(path), S)
    out, png = tmp_path / "g.npz", tmp_path / "g.png"
    r = runner.invoke(main, ["run", "knn-graph", str(path), "-k", "5", "--metric", "cosine",
                             "--out", str(out), "--no-gpus", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    G = sp.load_npz(out)
    n = S.shape[0]
    assert G.shape == (n, n) and G.nnz == 5 * n and G.diagonal().max() == 0
    ref = SkNN(n_neighbors=5, metric="cosine", algorithm="brute").fit(S).kneighbors_graph(
        mode="distance")
    np.testing.assert_allclose(np.sort(G.data.reshape(n, 5), axis=1),
                               np.sort(ref.data.reshape(n, 5), axis=1), rtol=1e-5, atol=1e-9)
    assert f"graph: {n:,} nodes, {5 * n:,} edges" in r.output and "mutual edges" in r.output
    assert not list(tmp_path.glob("*.partial.npz"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_knn_graph_refuses_bad_options(runner, tmp_path):
    args = ["run", "knn-graph", "--powerlaw", "50x20", "--nnz", "300"]
    r = runner.invoke(main, args + ["--out", str(tmp_path / "g.txt")])
    assert r.exit_code != 0 and "ending in .npz" in r.output
    r = runner.invoke(main, args + ["--out", str(tmp_path / "g.npz"), "--metric", "foo"])
    assert r.exit_code != 0 and "'metric' parameter of knn-graph" in r.output
    r = runner.invoke(main, args + ["--out", str(tmp_path / "g.npz"), "-k", "50"])
    assert r.exit_code != 0 and "must be in [1, 49]" in r.output
    r = runner.invoke(main, args + ["--out", str(tmp_path / "no" / "g.npz")])
    assert r.exit_code != 0 and "does not exist" in r.output
    assert not (tmp_path / "g.npz").exists()


def test_bench_knn_cpu(runner, tmp_path):
    out = tmp_path / "knn.json"
    r = runner.invoke(main, ["bench", "knn", "--corpus", "3000x500", "--density", "0.01",
                             "--queries", "60", "-k", "5", "--metrics", "cosine,l1",
                             "--json", str(out)])
    assert r.exit_code == 0, r.output
    import json

    rows = json.loads(out.read_text())
    assert [row["metric"] for row in rows] == ["cosine", "manhattan"]
    for row in rows:
        assert row["differing_ids_are_ties"] and row["max_abs_distance_diff"] < 1e-9
        assert row["n_queries"] == 60 and row["mgpu_qps"] > 0 and row["sklearn_qps"] > 0
    r = runner.invoke(main, ["bench", "knn", "--metrics", "cosine,nope"])
    assert r.exit_code != 0 and "'metric' parameter of bench knn" in r.output


def test_gpu_knn_table_says_which_kernel_ran_and_which_peer_was_wrong():
    from mgpu.bench.knn import markdown_gpu

    row = {"metric": "cosine", "mgpu_qps": 50000.0, "kernel": "postings",
           "fused_qps": 19000.0, "postings_qps": 50000.0, "speedup_vs_cusparse": 12.8,
           "peers": {"spgemm_100": "RuntimeError: CUSPARSE_STATUS_INSUFFICIENT_RESOURCES",
                     "spgemm_500": "wrong: k-th distance off mgpu's by 0.5 (relative)",
                     "spgemm_20": "wrong: k-th distance off scikit-learn's by 0.2 (relative)",
                     "spgemm_5": 900.0, "spgemm_best": {"batch": 5, "qps": 900.0},
                     "spmm_500": 3900.0, "spmm_2000": 3910.0}}
    head, rule, line = markdown_gpu([row], "wide").splitlines()
    assert head.count("|") == rule.count("|") == line.count("|")
    assert "| SpGEMM best right (batch) |" in head
    assert ("| wide | cosine | 50,000 | postings | 19,000 | 50,000 | – | – | fails | wrong | "
            "900 (5) | 3,900 | 3,910 | – | – | – | – | 12.8× |") in line


def test_spgemm_gets_smaller_batches_until_one_answers_rightly():
    from mgpu.bench.knn import SPGEMM_SMALLER, spgemm_smaller

    tried = []

    def rate(bs):
        tried.append(bs)
        return {20: "wrong: k-th distance off mgpu's by 0.3 (relative)", 5: 700.0}.get(bs, 1.0)

    peers = {"spgemm_100": "RuntimeError: out of resources", "spgemm_500": "wrong: ..."}
    assert SPGEMM_SMALLER == (20, 5)
    out = spgemm_smaller(peers, rate, 400)
    assert tried == [20, 5]
    assert out == {"spgemm_20": "wrong: k-th distance off mgpu's by 0.3 (relative)",
                   "spgemm_5": 700.0, "spgemm_5_queries": 400,
                   "spgemm_best": {"batch": 5, "qps": 700.0}}
    # a right batch of 100 or 500: no smaller batch, the faster right one is the best
    tried.clear()
    out = spgemm_smaller({"spgemm_100": 2000.0, "spgemm_500": 3000.0}, rate, 400)
    assert tried == [] and out == {"spgemm_best": {"batch": 500, "qps": 3000.0}}
    out = spgemm_smaller({"spgemm_100": 2000.0, "spgemm_500": "wrong: ..."}, rate, 400)
    assert out == {"spgemm_best": {"batch": 100, "qps": 2000.0}}
    # none right at any size: no best, every failure kept
    out = spgemm_smaller(peers, lambda bs: "fails", 400)
    assert out == {"spgemm_20": "fails", "spgemm_5": "fails"}


def test_run_mf_gpu_mode_on_a_cluster_without_gpus(runner, tmp_path, data_dir, monkeypatch):
    import mgpu.distributed.cluster as cl

    monkeypatch.setattr(cl, "visible_gpus", lambda: 0)
    path = data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz"
    for modes in ("gpu", "cpu,hsgd*"):
        r = runner.invoke(main, ["run", "mf", str(path), "--modes", modes, "--epochs", "1",
                                 "--out", str(tmp_path)])
        assert r.exit_code != 0
        assert f"modes {modes.split(',')[-1]} run on GPU workers and no GPU is visible" in r.output


def test_run_mf_on_movielens(runner, tmp_path, data_dir):
    import json

    import numpy as np

    path = data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz"
    png = tmp_path / "rmse.png"
    r = runner.invoke(main, ["run", "mf", str(path), "--modes", "sequential", "-k", "16",
                             "--lr", "0.01", "--epochs", "5", "--target-rmse", "0",
                             "--out", str(tmp_path / "out"), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    h = json.loads((tmp_path / "out" / "history.json").read_text())["sequential"]
    assert [e["epoch"] for e in h] == [1, 2, 3, 4, 5]
    assert h[-1]["test_rmse"] < h[0]["test_rmse"]
    with np.load(tmp_path / "out" / "sequential-factors.npz") as z:
        assert z["P"].shape == (671, 16) and z["Q"].shape[1] == 16
        assert z["user_ids"].shape == (671,)
    assert "sequential: 5 epochs in" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = runner.invoke(main, ["run", "mf", str(path), "--modes", "cpu", "-k", "16", "--epochs",
                             "1", "--cpu-threads", "2", "--out", str(tmp_path / "cpu")])
    assert r.exit_code == 0, r.output
    placed = re.findall(r"(\d+) block runs on the CPU slot\(s\) of (tcp://[\d.:]+) "
                        r"\((\d+) stolen\)", r.output)
    # a line a worker, each with the block runs it had
    assert placed and len({w for _, w, _ in placed}) == len(placed), r.output
    assert all(int(n) > 0 and int(st) <= int(n) for n, _, st in placed), r.output
    r = runner.invoke(main, ["run", "mf", str(path), "--modes", "hsgd+", "--out", str(tmp_path)])
    assert r.exit_code != 0
    assert ("modes must be among sequential, cpu, gpu, hsgd, hsgd-linear, hsgd-static, hsgd*; "
            "got 'hsgd+'") in r.output


def test_bench_mf_on_planted_ratings(runner, tmp_path):
    import json

    out = tmp_path / "mf.json"
    r = runner.invoke(main, ["bench", "mf", "--synthetic", "3000x400:60000", "--modes",
                             "sequential,cpu", "-k", "8", "--lr", "0.02", "--epochs", "4",
                             "--target-rmse", "0", "--json", str(out)])
    assert r.exit_code == 0, r.output
    got = json.loads(out.read_text())
    assert [row["mode"] for row in got["rows"]] == ["sequential", "cpu"]
    for mode in ("sequential", "cpu"):
        h = got["history"][mode]
        assert len(h) == 4 and h[-1]["test_rmse"] < h[0]["test_rmse"]
    assert got["rows"][1]["blocks"] >= 4 and got["rows"][1]["alpha"] is None
    calls = got["rows"][1]["cpu_call_ms"]  # one call a block, each timed on its host
    assert calls["calls"] == got["rows"][1]["blocks"] and calls["run"] > 0
    assert "Where a block call's time went" in r.output and "| cpu | cpu | " in r.output
    assert "| sequential | 4 |" in r.output and "| cpu | 4 |" in r.output
    # each mode on a cluster of its own (sequential needs none), unless --one-cluster
    assert "cpu: on a fresh cluster, " in r.output and "sequential: on a fresh" not in r.output
    r = runner.invoke(main, ["bench", "mf", "--synthetic", "3000x400:60000", "--modes",
                             "sequential,cpu", "-k", "8", "--epochs", "1", "--one-cluster"])
    assert r.exit_code == 0, r.output
    assert "cluster: " in r.output and "on a fresh cluster" not in r.output
    r = runner.invoke(main, ["bench", "mf", "--modes", "sequential"])
    assert r.exit_code != 0 and "give a RATINGS file or --synthetic" in r.output


def test_calibrate_the_cpu_side_and_show_it(runner, tmp_path):
    import dask.config

    with dask.config.set({"mgpu.mf.calibration-cache": str(tmp_path / "cal.json")}):
        r = runner.invoke(main, ["calibrate", "--show"])
        assert r.exit_code != 0 and "no calibration cached yet" in r.output
        png = tmp_path / "cal.png"
        r = runner.invoke(main, ["calibrate", "-k", "8", "--max-ratings", "20000",
                                 "--repeats", "1", "--plot", str(png)])
        assert r.exit_code == 0, r.output
        assert "20,000 |" in r.output and "cpu: linear a=" in r.output
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        r = runner.invoke(main, ["calibrate", "--show"])
        assert r.exit_code == 0 and "|k=8|float64" in r.output


def test_run_jaccard_on_a_snap_file(runner, tmp_path):
    import gzip

    import numpy as np
    import scipy.sparse as sp

    import mgpu

    # a one-way edge list with sparse ids, a comment and a self-loop
    edges = [(10, 20), (20, 30), (10, 30), (30, 40), (40, 40), (50, 10)]
    path = tmp_path / "g.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write("# toy\n" + "".join(f"{u}\t{v}\n" for u, v in edges))
    out, png = tmp_path / "j.npz", tmp_path / "j.png"
    r = runner.invoke(main, ["run", "jaccard", str(path), "--out", str(out), "--no-gpus",
                             "--top", "2", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    J = sp.load_npz(out)
    # nodes 10, 20, 30, 40, 50 -> 0..4: 10-20 and 20-30 share one of four neighbours,
    # 10-30 one of five, the two pendant edges none
    A = sp.csr_matrix((np.ones(5), ([0, 1, 0, 2, 4], [1, 2, 2, 3, 0])), shape=(5, 5))
    ref = mgpu.jaccard(A, symmetrize=True)
    assert (J != ref).nnz == 0 and J.nnz == 10
    assert "weights of 5 edges" in r.output
    assert "  10 -- 20: 0.2500\n  20 -- 30: 0.2500\n" in r.output
    assert sorted(np.round(J.data, 4).tolist()) == [0, 0, 0, 0, 0.2, 0.2, 0.25, 0.25, 0.25, 0.25]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob("*.partial*"))
    with np.load(out) as f:  # the matrix's rows and columns map back to the file's node ids
        np.testing.assert_array_equal(f["node_ids"], [10, 20, 30, 40, 50])
    r = runner.invoke(main, ["run", "jaccard", str(path), "--out", str(tmp_path / "j2.npz"),
                             "--no-gpus", "--strict"])
    assert r.exit_code != 0 and "Pass symmetrize=True" in r.output
    assert not (tmp_path / "j2.npz").exists()


def test_bench_jaccard_cpu(runner, tmp_path):
    import gzip
    import json

    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "g.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{u} {v}\n" for u, v in rng.integers(0, 300, (3000, 2))))
    out = tmp_path / "b.json"
    r = runner.invoke(main, ["bench", "jaccard", str(path), "--repeats", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(out.read_text())
    assert row["max_abs_diff"] < 1e-12 and row["mgpu_edges_per_s"] > 0 and row["speedup"] > 0


def test_run_gradient_mf_cpu(runner, tmp_path):
    import json

    import numpy as np

    rng = np.random.default_rng(2)
    U, V = rng.normal(size=(60, 3)), rng.normal(size=(40, 3))
    users, items = rng.integers(0, 60, 1500), rng.integers(0, 40, 1500)
    pairs = sorted(set(zip(users.tolist(), items.tolist())))
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},{3 + U[u] @ V[i]:.3f},0\n" for u, i in pairs))
    out, png = tmp_path / "als", tmp_path / "als.png"
    r = runner.invoke(main, ["run", "gradient-mf", str(path), "--device", "cpu", "--iters", "150",
                             "-k", "3", "--lr", "0.05", "--reg", "0.001", "--out", str(out),
                             "--plot", str(png)])
    assert r.exit_code == 0, r.output
    hist = json.loads((out / "history.json").read_text())["cpu"]
    assert len(hist) == 150 and all(h["step_s"] > 0 for h in hist)
    # a rank-3 matrix is learnt: the test error falls far below the ratings' spread
    spread = float(np.std([3 + U[u] @ V[i] for u, i in pairs]))
    assert hist[-1]["test_rmse"] < 0.3 * spread < hist[0]["test_rmse"]
    with np.load(out / "cpu-factors.npz") as f:
        assert f["U"].shape == (60, 3) and f["V"].shape == (40, 3)
        # row i of U is the file's user user_ids[i], row j of V its item item_ids[j]
        np.testing.assert_array_equal(f["user_ids"], sorted({u for u, _ in pairs}))
        np.testing.assert_array_equal(f["item_ids"], sorted({i for _, i in pairs}))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = runner.invoke(main, ["run", "gradient-mf", str(path), "--test-fraction", "1.5", "--out",
                             str(out)])
    assert r.exit_code != 0 and "'test_fraction' parameter of split_ratings must be in (0, 1)" in r.output
    diverged = tmp_path / "diverged"
    r = runner.invoke(main, ["run", "gradient-mf", str(path), "--device", "cpu", "--iters", "5",
                             "--lr", "1e200", "--out", str(diverged)])
    assert r.exit_code == 1 and "cpu: GradientMF diverged at step" in r.output, r.output
    assert not (diverged / "history.json").exists() and not list(diverged.glob("*.npz"))
    # the old name still runs the job, says it is deprecated, and is not listed
    r = runner.invoke(main, ["run", "als", str(path), "--device", "cpu", "--iters", "2",
                             "-k", "3", "--out", str(tmp_path / "old")])
    assert r.exit_code == 0 and "'als' is deprecated" in r.output, r.output
    assert json.loads((tmp_path / "old" / "history.json").read_text())["cpu"][-1]["iteration"] == 2
    with np.load(tmp_path / "old" / "cpu-factors.npz") as f:
        assert f["user_ids"].shape == (60,) and f["item_ids"].shape == (40,)
    listing = runner.invoke(main, ["run", "--help"]).output
    assert "gradient-mf" in listing and " als " not in listing


def test_run_gradient_mf_on_the_cluster_by_default_equals_one_device(runner, tmp_path):
    import json

    import numpy as np

    rng = np.random.default_rng(3)
    U, V = rng.normal(size=(50, 3)), rng.normal(size=(30, 3))
    pairs = sorted(set(zip(rng.integers(0, 50, 900).tolist(), rng.integers(0, 30, 900).tolist())))
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},{3 + U[u] @ V[i]:.3f},0\n" for u, i in pairs))
    args = ["-k", "3", "--iters", "12", "--lr", "0.05", "--reg", "0.001"]
    r = runner.invoke(main, ["run", "gradient-mf", str(path), "--workers", "2", "--parts", "3",
                             "--out", str(tmp_path / "c"), *args])
    assert r.exit_code == 0, r.output
    assert "cluster: 2 CPU worker(s)" in r.output and "cluster: test RMSE" in r.output
    r = runner.invoke(main, ["run", "gradient-mf", str(path), "--device", "cpu", "--out",
                             str(tmp_path / "one"), *args])
    assert r.exit_code == 0, r.output
    spread = json.loads((tmp_path / "c" / "history.json").read_text())["cluster"]
    one = json.loads((tmp_path / "one" / "history.json").read_text())["cpu"]
    assert [h["iteration"] for h in spread] == list(range(1, 13))
    for key in ("train_rmse", "test_rmse"):
        # float32 ratings: V's gradient summed tile by tile rounds differently, nothing more
        np.testing.assert_allclose([h[key] for h in spread], [h[key] for h in one], rtol=1e-6)
    assert one[-1]["test_rmse"] < one[0]["test_rmse"]
    with np.load(tmp_path / "c" / "cluster-factors.npz") as c, \
            np.load(tmp_path / "one" / "cpu-factors.npz") as o:
        assert c["U"].shape == (50, 3) and c["V"].shape == (30, 3)
        np.testing.assert_allclose(c["U"], o["U"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(c["V"], o["V"], rtol=0, atol=1e-5)
        assert float(c["mean"]) == float(o["mean"])
    r = runner.invoke(main, ["run", "gradient-mf", str(path), "--device", "cpu", "--workers", "2",
                             "--out", str(tmp_path / "one")])
    assert r.exit_code != 0 and "go with --device cluster (the default)" in r.output


def _toy_corpus(tmp_path):
    """A UCI docword file with two clear topics (documents draw from words 0-4 or 5-9) and
    its vocabulary."""
    import numpy as np

    rng = np.random.default_rng(1)
    lines = []
    docs = []
    for d in range(40):
        words = rng.choice(5, 4, replace=False) + (5 if d % 2 else 0)
        docs.append([(int(w), int(rng.integers(1, 6))) for w in sorted(words)])
    for d, doc in enumerate(docs):
        lines += [f"{d + 1} {w + 1} {c}" for w, c in doc]
    path = tmp_path / "docword.toy.txt"
    path.write_text(f"40\n10\n{len(lines)}\n" + "\n".join(lines) + "\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(f"w{i}" for i in range(10)) + "\n")
    return path, vocab


def test_run_gap_on_the_cluster_and_bench_gap(runner, tmp_path):
    import json

    path, vocab = _toy_corpus(tmp_path)
    out = tmp_path / "gap"
    r = runner.invoke(main, ["run", "gap", str(path), "--device", "cluster", "--workers", "2",
                             "--parts", "3", "--topics", "2", "--iters", "5", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "cluster: 2 CPU worker(s)" in r.output
    tiles = re.findall(r"tile \d: ([\d,]+) rows, [\d,]+ nonzeros on tcp://\S+ \(CPU\)",
                       r.output)
    assert len(tiles) == 3 and sum(int(t.replace(",", "")) for t in tiles) == 40, r.output
    hist = json.loads((out / "history.json").read_text())["cluster"]
    assert [h["iteration"] for h in hist] == [1, 2, 3, 4, 5]
    r = runner.invoke(main, ["run", "gap", str(path), "--device", "cpu", "--parts", "2",
                             "--out", str(out)])
    assert r.exit_code != 0 and "go with --device cluster" in r.output
    js = tmp_path / "gap.json"
    r = runner.invoke(main, ["bench", "gap", str(path), "--workers", "1,2", "--device", "cpu",
                             "--topics", "2", "--iters", "4", "--json", str(js)])
    assert r.exit_code == 0, r.output
    rows = json.loads(js.read_text())
    assert [row["workers"] for row in rows] == ["one device, no cluster", 1, 2]
    assert all(row["loglik_diff"] < 1e-6 for row in rows[1:])
    assert rows[1]["speedup"] == 1.0 and all(row["median_step_s"] > 0 for row in rows)
    r = runner.invoke(main, ["bench", "gap", str(path), "--iters", "2"])
    assert r.exit_code != 0 and "must be >= 3" in r.output


def test_bench_gap_weak_scaling_stacks_the_corpus_per_worker(runner, tmp_path):
    """--weak adds the corpus stacked twice on 2 workers, each corpus against its own
    one-device fit, every iteration's log-likelihood within 1e-6 of it."""
    import json

    path, _ = _toy_corpus(tmp_path)
    js = tmp_path / "weak.json"
    r = runner.invoke(main, ["bench", "gap", str(path), "--workers", "1,2", "--device", "cpu",
                             "--topics", "2", "--iters", "4", "--weak", "--json", str(js)])
    assert r.exit_code == 0, r.output
    rows = json.loads(js.read_text())
    assert [(row["workers"], row["scaling"], row["copies"]) for row in rows] == [
        ("one device, no cluster", "strong", 1), (1, "strong", 1), (2, "strong", 1),
        ("one device, no cluster", "weak", 2), (2, "weak", 2)]
    assert rows[3]["nnz"] == rows[4]["nnz"] == 2 * rows[0]["nnz"]
    assert rows[4]["n_docs"] == 80
    assert all(row["loglik_rel_diff_max"] < 1e-6 for row in rows if row["workers"] != rows[0][
        "workers"])
    assert rows[4]["weak_efficiency"] == rows[1]["median_step_s"] / rows[4]["median_step_s"]
    assert "| weak |" in r.output and "%" in r.output.split("| weak |")[-1]


def test_run_gap_on_the_cluster_by_default_equals_one_device(runner, tmp_path):
    import json

    import numpy as np

    path, _ = _toy_corpus(tmp_path)
    args = ["--topics", "2", "--iters", "6"]
    r = runner.invoke(main, ["run", "gap", str(path), "--workers", "2", "--out",
                             str(tmp_path / "c"), *args])
    assert r.exit_code == 0, r.output
    assert "cluster: 2 CPU worker(s)" in r.output
    tiles = re.findall(r"tile \d: ([\d,]+) rows, [\d,]+ nonzeros on (tcp://\S+) \(CPU\)",
                       r.output)  # one a worker, every document in one
    assert len({w for _, w in tiles}) == len(tiles) == 2, r.output
    assert sum(int(n.replace(",", "")) for n, _ in tiles) == 40, r.output
    r = runner.invoke(main, ["run", "gap", str(path), "--device", "cpu", "--out",
                             str(tmp_path / "one"), *args])
    assert r.exit_code == 0, r.output
    spread = json.loads((tmp_path / "c" / "history.json").read_text())["cluster"]
    one = json.loads((tmp_path / "one" / "history.json").read_text())["cpu"]
    np.testing.assert_allclose([h["loglik_per_token"] for h in spread],
                               [h["loglik_per_token"] for h in one], rtol=1e-6)
    with np.load(tmp_path / "c" / "cluster-topics.npz") as c, \
            np.load(tmp_path / "one" / "cpu-topics.npz") as o:
        np.testing.assert_allclose(c["L"], o["L"], rtol=1e-4, atol=1e-7)


def test_run_gap_on_a_corpus(runner, tmp_path):
    import json

    path, vocab = _toy_corpus(tmp_path)
    out, png = tmp_path / "gap", tmp_path / "gap.png"
    r = runner.invoke(main, ["run", "gap", str(path), "--vocab", str(vocab), "--device", "cpu",
                             "--topics", "2", "--iters", "40", "--out", str(out), "--plot",
                             str(png)])
    assert r.exit_code == 0, r.output
    hist = json.loads((out / "history.json").read_text())["cpu"]
    ll = [h["loglik_per_token"] for h in hist]
    assert len(ll) == 40 and ll[-1] > ll[0] and all(b >= a - 1e-6 for a, b in zip(ll, ll[1:]))
    topics = json.loads((out / "topics.json").read_text())["cpu"]
    halves = [{int(w[1:]) // 5 for w in t[:5]} for t in topics]
    assert sorted(map(len, halves)) == [1, 1] and halves[0] != halves[1]  # the two topics found
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_spmv_synthetic_matrices(runner, tmp_path):
    import json

    out = tmp_path / "spmv.json"
    r = runner.invoke(main, ["bench", "spmv", "--device", "cpu", "--repeats", "1",
                             "--powerlaw", "300x200:2000", "--powerlaw", "300x200:2000:1.2:0",
                             "--banded", "500x5", "--json", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())["rows"]
    assert [row["name"] for row in rows] == ["power-law 300x200", "power-law 300x200 (1.2/0)",
                                             "band 500x5"]
    assert rows[2]["nnz"] == 500 * 5 - 6 and rows[2]["max_row"] == 5
    assert rows[1]["max_row"] > rows[0]["max_row"]  # the steeper rows
    assert all(row["rel_err"] <= 1e-6 and row["kernels_ms"] > 0 for row in rows)
    assert all(row["unchecked_speedup"] == row["peer_ms"] / row["unchecked_ms"] for row in rows)
    import scipy.io
    import scipy.sparse as sp

    paths = []
    for i, density in enumerate((0.01, 0.05)):
        paths.append(tmp_path / f"m{i}.mtx")
        scipy.io.mmwrite(paths[-1], sp.random(200, 200, density=density, random_state=i))
    r = runner.invoke(main, ["bench", "spmv", "--device", "cpu", "--repeats", "1",
                             *map(str, paths), "--banded", "500x5"])
    assert r.exit_code == 0, r.output
    assert "The 2 matrices from files alone: Correlation of time with nnz over 2 matrices" \
        in r.output
    for bad, hint in ((["--powerlaw", "300x200:2000:1:2:3"], "--powerlaw"),
                      (["--banded", "500"], "expected ROWSxCOLS")):
        r = runner.invoke(main, ["bench", "spmv", "--device", "cpu", *bad])
        assert r.exit_code == 2 and hint in r.output, r.output


# ------------------------------------------------------------ files read as they were written

WEIGHTED = "1 2 1.0\n2 3 1.0\n3 4 1.0\n1 3 1.0\n"


def test_run_jaccard_reads_a_weighted_edge_list_as_a_graph_and_says_so(runner, tmp_path):
    """'u v w' lines were read as ratings (3 users x 3 items): '3 nodes ... 1 edge'."""
    import numpy as np
    import scipy.sparse as sp

    path = tmp_path / "w.txt"
    path.write_text(WEIGHTED)
    out = tmp_path / "j.npz"
    r = runner.invoke(main, ["run", "jaccard", str(path), "--out", str(out), "--no-gpus"])
    assert r.exit_code == 0, r.output
    assert "w.txt: read as weighted-edges (an edge list with weights, 3 columns: u v weight) " \
        "as the job reads graphs" in r.output
    assert "w.txt: 4 nodes, 4 stored edges" in r.output  # networkx: 4 nodes, 4 edges
    J = sp.load_npz(out)
    # networkx.jaccard_coefficient on the undirected graph: 1-2 and 1-3 share one of three
    # neighbours... every weight below, by hand
    ref = {(0, 1): 1 / 3, (0, 2): 1 / 4, (1, 2): 1 / 4, (2, 3): 0.0}
    for (u, v), w in ref.items():
        assert J[u, v] == pytest.approx(w) and J[v, u] == pytest.approx(w)
    with np.load(out) as f:
        np.testing.assert_array_equal(f["node_ids"], [1, 2, 3, 4])
    # weights used where the job uses them: Σ min / Σ max over the neighbours
    path.write_text("10 20 2\n20 30 1\n10 30 4\n")
    r = runner.invoke(main, ["run", "jaccard", str(path), "--weighted", "--out", str(out),
                             "--no-gpus"])
    assert r.exit_code == 0, r.output
    A = sp.csr_matrix((np.array([2.0, 1, 4]), ([0, 1, 0], [1, 2, 2])), shape=(3, 3))
    assert (abs(sp.load_npz(out) - mgpu.jaccard(A, weighted=True, symmetrize=True)) > 1e-12
            ).nnz == 0
    # a time is not a weight
    r = runner.invoke(main, ["run", "jaccard", str(path), "--weighted", "--format",
                             "temporal-edges", "--out", str(out), "--no-gpus"])
    assert r.exit_code != 0 and "third column is a time, not a weight" in r.output


def test_run_jobs_refuse_a_file_of_several_formats_and_take_format(runner, tmp_path):
    """partition and knn-graph read 'u v w' lines as ratings, silently; now refused, and
    --format chooses. The graph's npz carries the ids of its rows."""
    import numpy as np
    import scipy.sparse as sp

    path = tmp_path / "w.txt"
    path.write_text(WEIGHTED)
    out = tmp_path / "g.npz"
    for job in (["partition"], ["knn-graph", "-k", "1", "--out", str(out)]):
        r = runner.invoke(main, ["run", *job, str(path), "--no-gpus"])
        assert r.exit_code == 1 and "cannot tell its format" in r.output, r.output
        assert "fmt='ratings' or 'weighted-edges'" in r.output and "--format" in r.output
    r = runner.invoke(main, ["run", "partition", str(path), "--format", "weighted-edges",
                             "--no-gpus"])
    assert r.exit_code == 0 and "w.txt: 5 x 5, 4 nonzeros" in r.output, r.output
    r = runner.invoke(main, ["run", "knn-graph", str(path), "--format", "ratings", "-k", "1",
                             "--metric", "euclidean", "--out", str(out), "--no-gpus"])
    assert r.exit_code == 0, r.output
    assert sp.load_npz(out).shape == (3, 3)
    with np.load(out) as f:  # the users of the ratings reading
        np.testing.assert_array_equal(f["node_ids"], [1, 2, 3])
    r = runner.invoke(main, ["run", "partition", "--powerlaw", "10x10", "--format", "snap"])
    assert r.exit_code != 0 and "--powerlaw reads no file" in r.output
    r = runner.invoke(main, ["run", "partition", str(path), "--format", "csv"])
    assert r.exit_code == 2 and "'csv' is not one of" in r.output


def test_run_gap_writes_the_ids_of_documents_and_words(runner, tmp_path):
    import numpy as np

    path, _ = _toy_corpus(tmp_path)
    out = tmp_path / "gap"
    r = runner.invoke(main, ["run", "gap", str(path), "--device", "cpu", "--topics", "2",
                             "--iters", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    with np.load(out / "cpu-topics.npz") as f:
        assert f["X"].shape == (40, 2) and f["L"].shape == (10, 2)
        # docword's ids are 1-based: row i is document i + 1, word j is word j + 1
        np.testing.assert_array_equal(f["row_ids"], np.arange(1, 41))
        np.testing.assert_array_equal(f["col_ids"], np.arange(1, 11))


def test_bench_mf_scaling_on_cpu_workers(runner, tmp_path):
    """One device, then SPMD fits on 1 and 2 CPU workers, from one start: the training RMSE
    curves agree to rounding and every step is timed."""
    import json

    js = tmp_path / "mf.json"
    r = runner.invoke(main, ["bench", "mf-scaling", "--synthetic", "3000x400:60000",
                             "--workers", "1,2", "--device", "cpu", "-k", "8", "--iters", "4",
                             "--dtype", "float64", "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "| planted 3,000×400 | 8 | 2 CPU |" in r.output
    rows = json.loads(js.read_text())
    assert [row["workers"] for row in rows] == ["one device, no cluster", 1, 2]
    assert all(len(row["train_rmse"]) == 4 for row in rows)
    assert all(row["rmse_rel_diff"] < 1e-12 for row in rows[1:])
    assert all(row["median_step_s"] > 0 and row["speedup"] > 0 for row in rows[1:])
    assert rows[0]["train_rmse"][-1] < rows[0]["train_rmse"][0]
    for bad, words in ((["--iters", "2"], "'--iters': 2 is not in the range x>=3"),
                       (["--synthetic", "30x20"], "expected USERSxITEMS:RATINGS"),
                       (["--lr", "0"], "'--lr': 0.0 is not in the range x>0")):
        r = runner.invoke(main, ["bench", "mf-scaling", *bad])
        assert r.exit_code != 0 and words in r.output, r.output


def test_bench_allreduce_on_cpu_workers(runner, tmp_path):
    """The all-reduce of mgpu.spmd among 2 and 3 CPU workers: the sums are checked on every
    rank and each row has its time and bandwidth; no torch peer on CPU workers."""
    import json

    js = tmp_path / "allreduce.json"
    r = runner.invoke(main, ["bench", "allreduce", "--shape", "500x16", "--workers", "2,3",
                             "--device", "cpu", "--repeats", "3", "--json", str(js)])
    assert r.exit_code == 0, r.output
    rows = json.loads(js.read_text())
    assert [(row["workers"], row["kind"], row["correct"]) for row in rows] == [
        (2, "CPU", True), (3, "CPU", True)]
    assert all(row["bytes"] == 500 * 16 * 4 and row["mgpu_ms"] > 0 and "torch_ms" not in row
               for row in rows)
    assert "| 3 | CPU | 0.0 | True |" in r.output
    r = runner.invoke(main, ["bench", "allreduce", "--shape", "5x"])
    assert r.exit_code != 0 and "--shape" in r.output, r.output
