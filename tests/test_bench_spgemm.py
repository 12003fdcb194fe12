"""``mgpu bench spgemm`` on the host: the rows of a CPU run (products, nnz, errors, ratios,
the form of each input), the check of a peer's result, the report's summary and the command;
``mgpu bench spgemm-scaling`` on CPU workers: its rows, the check of each worker count's C
against one device's, the table and the command.

The GPU side (cupyx and torch peers, peak memory) needs a GPU; what it shares with the CPU
run (the form, the product count, the check of results, the statuses, the table) is tested
here, and the module is imported without CuPy or torch.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from mgpu.bench import spgemm as b
from mgpu.bench import spgemm_scaling as s


def _rows(**kw):
    mats = [("m.mtx", sp.random(120, 120, density=0.05, format="csr", random_state=1)),
            ("g.txt", sp.random(90, 70, density=0.08, format="csr", random_state=2)),
            ("sq.txt", sp.random(80, 80, density=0.06, format="csr", random_state=3))]
    return mats, b.bench_spgemm(mats, 1, device="cpu", **kw)


def _parts(M):
    return M.indptr, M.indices, M.data


# ------------------------------------------------------------------ the form of each input

@pytest.mark.parametrize("form, shape, name, want", [
    ("auto", (5, 5), "bcsstk13.mtx.gz", "AA"),
    ("auto", (5, 5), "m.MTX", "AA"),
    ("auto", (5, 4), "m.mtx", "AAt"),  # not square
    ("auto", (5, 5), "ca-HepPh.txt.gz", "AAt"),  # a graph
    ("auto", (5, 5), "power-law 5x5", "AAt"),
    ("auto", (5, 5), "m.mtx.bak", "AAt"),
    ("AA", (5, 5), "g.txt", "AA"),
    ("AAt", (5, 5), "m.mtx", "AAt"),
    ("AAt", (5, 3), "m.mtx", "AAt"),
])
def test_choose_form(form, shape, name, want):
    assert b.choose_form(form, shape, name) == want


def test_choose_form_refuses_a_bad_form_and_a_square_of_a_rectangle():
    with pytest.raises(ValueError, match=r"The 'form' parameter of bench_spgemm must be a str "
                       r"among \{'AA', 'AAt', 'auto'\}. Got 'AB' instead"):
        b.choose_form("AB", (3, 3), "m.mtx")
    with pytest.raises(ValueError, match="needs square matrices, but g.txt is 5×3"):
        b.choose_form("AA", (5, 3), "g.txt")


def test_products_count_the_b_rows_each_nonzero_of_a_picks():
    A = sp.random(40, 30, density=0.1, format="csr", random_state=5)
    B = sp.random(30, 50, density=0.1, format="csr", random_state=6)
    # the products of the dense triple loop: A[i, k] != 0 and B[k, j] != 0
    dense = int(((A.toarray() != 0).astype(np.int64) @ (B.toarray() != 0)).sum())
    assert b.products(A, B) == dense > 0
    assert b.products(sp.csr_matrix((4, 30)), B) == 0


# ------------------------------------------------------------------ a peer's result checked

def _entries(M):
    """M's entries as (rows, cols, values)."""
    C = M.tocoo()
    return C.row, C.col, C.data


def test_csr_difference_of_one_pattern_stored_alike():
    C = sp.random(30, 40, density=0.2, format="csr", random_state=0)
    assert b.csr_difference(_parts(C), _parts(C), 40) == (0.0, True)
    D = C.copy()
    D.data[7] += 1e-3 * abs(C.data).max()
    err, same = b.csr_difference(_parts(C), _parts(D), 40)
    assert err == pytest.approx(1e-3) and same


def test_csr_difference_ignores_order_duplicates_and_stored_zeros():
    C = sp.random(30, 40, density=0.2, format="csr", random_state=0)
    r, c, v = _entries(C)
    v = v.copy()
    # the same matrix with one entry split in two, a stored zero where C has nothing, and
    # each row's entries in a random order
    i0, j0 = np.argwhere(C.toarray() == 0)[0]
    v[3] /= 2
    r, c, v = np.append(r, [r[3], i0]), np.append(c, [c[3], j0]), np.append(v, [v[3], 0.0])
    order = np.lexsort((np.random.default_rng(1).random(r.size), r))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=30))])
    err, same = b.csr_difference(_parts(C), (indptr, c[order], v[order]), 40)
    assert err < 1e-15 and same
    assert b.csr_difference((indptr, c[order], v[order]), _parts(C), 40)[0] < 1e-15


def test_csr_difference_of_wrong_results():
    C = sp.random(30, 40, density=0.2, format="csr", random_state=0)
    big = abs(C.data).max()
    # all zeros, stored (cuSPARSE's silent failure) or not at all
    zeros = C.copy()
    zeros.data[:] = 0
    assert b.csr_difference(_parts(C), _parts(zeros), 40) == (1.0, False)
    assert b.csr_difference(_parts(C), _parts(sp.csr_matrix(C.shape)), 40) == (1.0, False)
    # an entry missing, an entry too many: counted whole
    missing = C.copy()
    missing.data[4] = 0
    missing.eliminate_zeros()
    err, same = b.csr_difference(_parts(C), _parts(missing), 40)
    assert err == pytest.approx(abs(C.data[4]) / big) and not same
    extra = C + sp.csr_matrix(([0.5 * big], ([0], [int(np.setdiff1d(np.arange(40),
                                                                      C[0].indices)[0])])),
                              shape=C.shape)
    err, same = b.csr_difference(_parts(C), _parts(extra), 40)
    assert err == pytest.approx(0.5) and not same
    nan = C.copy()
    nan.data[2] = np.nan
    assert np.isnan(b.csr_difference(_parts(C), _parts(nan), 40)[0])
    nan_extra = extra.copy()
    nan_extra.data[nan_extra.data == 0.5 * big] = np.nan  # where C has nothing
    assert np.isnan(b.csr_difference(_parts(C), _parts(nan_extra), 40)[0])
    # an empty reference: nothing is right but nothing
    empty = sp.csr_matrix(C.shape)
    assert b.csr_difference(_parts(empty), _parts(empty), 40) == (0.0, True)
    assert b.csr_difference(_parts(empty), _parts(C), 40)[0] > 1e6


def test_csr_difference_in_chunks(monkeypatch):
    C = sp.random(30, 40, density=0.2, format="csr", random_state=0)
    D = C.copy()
    D.data[-1] *= 1.5
    want = b.csr_difference(_parts(C), _parts(D), 40)
    monkeypatch.setattr(b, "_CHUNK", 7)
    assert b.csr_difference(_parts(C), _parts(D), 40) == want
    assert want[0] == pytest.approx(0.5 * abs(C.data[-1]) / abs(C.data).max()) and want[1]
    D.data[3] = np.nan
    assert np.isnan(b.csr_difference(_parts(C), _parts(D), 40)[0])


def test_csr_difference_of_a_cancellation_left_in_one_and_out_of_the_other():
    """A sum that is exactly 0 in one order and a rounding residue in another: the patterns
    differ, the error is the residue's size."""
    C = sp.csr_matrix(np.array([[1.0, 2.0, 0.0], [0.0, 3.0, 4.0]]))
    D = sp.csr_matrix(np.array([[1.0, 2.0, 1e-9], [0.0, 3.0, 4.0]]))
    err, same = b.csr_difference(_parts(C), _parts(D), 3)
    assert err == pytest.approx(1e-9 / 4) and not same


# ------------------------------------------------------------------ a CPU run

def test_cpu_rows_hold_the_products_the_results_and_their_errors():
    mats, rows = _rows()
    assert [(r["name"], r["form"]) for r in rows] == [("m.mtx", "AA"), ("g.txt", "AAt"),
                                                        ("sq.txt", "AAt")]
    for (name, M), r in zip(mats, rows):
        A = sp.csr_matrix(M, dtype=np.float64)
        B = A if r["form"] == "AA" else A.T.tocsr()
        C = A @ B
        want = int(((A.toarray() != 0).astype(np.int64) @ (B.toarray() != 0)).sum())
        assert r["device"] == "cpu" and r["dtype"] == "float32"
        assert r["shape_a"] == list(A.shape) and r["shape_b"] == list(B.shape)
        assert (r["nnz_a"], r["nnz_b"], r["products"], r["nnz_c"]) == (A.nnz, B.nnz, want,
                                                                       C.nnz)
        assert r["checked"] and 0 <= r["rel_err"] < 1e-6
        assert r["mgpu_error"] is None and r["mgpu_ms"] > 0
        assert r["mgpu_gflops"] == pytest.approx(2 * want / r["mgpu_ms"] / 1e6)
        assert r["threads"] is not None and r["threads"] >= 1
        assert r["mgpu_peak_bytes"] is None and r["device_name"] is None
        peer = r["peers"]["scipy"]
        assert list(r["peers"]) == ["scipy"]
        assert peer["status"] == "ok" and peer["error"] is None and peer["same_pattern"]
        assert peer["rel_err"] < 1e-6
        assert peer["ratio"] == pytest.approx(peer["ms"] / r["mgpu_ms"]) and peer["ratio"] > 0
        assert peer["gflops"] == pytest.approx(2 * want / peer["ms"] / 1e6)


def test_float64_and_forms_forced():
    _, rows = _rows(dtype="float64", form="AAt")
    assert {r["form"] for r in rows} == {"AAt"} and {r["dtype"] for r in rows} == {"float64"}
    assert all(r["rel_err"] < 1e-14 for r in rows)
    with pytest.raises(ValueError, match="'AA', which needs square matrices, but g.txt is "
                       "90×70"):
        _rows(form="AA")


def test_past_the_check_limit_mgpu_is_not_checked(monkeypatch):
    monkeypatch.setattr(b, "CHECK_PRODUCTS", 10)
    _, rows = _rows()
    assert all(not r["checked"] and r["rel_err"] is None for r in rows)
    assert all(r["peers"]["scipy"]["status"] == "ok" for r in rows)  # still against mgpu's
    assert "| not checked |" in b.markdown(rows)


def test_a_failing_peer_and_a_wrong_one_do_not_stop_the_run(monkeypatch):
    real = b._scipy_product
    calls = {"n": 0}

    def peer(A, B):
        calls["n"] += 1
        if A.shape == (90, 70):  # g.txt
            raise MemoryError("out of memory allocating 12 bytes\nsecond line")
        C = real(A, B)
        if A.shape == (80, 80):  # sq.txt: cuSPARSE's all zeros
            C.data[:] = 0
        return C

    monkeypatch.setattr(b, "_scipy_product", peer)
    lines = []
    _, rows = _rows(progress=lines.append)
    ok, failed, wrong = (r["peers"]["scipy"] for r in rows)
    assert ok["status"] == "ok" and ok["ratio"] > 0
    assert failed == dict(failed, status="failed", ms=None, ratio=None, gflops=None,
                          error="MemoryError: out of memory allocating 12 bytes")
    assert wrong["status"] == "wrong result" and wrong["rel_err"] == 1.0
    assert wrong["ms"] > 0 and wrong["ratio"] is None  # timed, never a win
    assert all(r["mgpu_ms"] > 0 for r in rows)
    assert len(lines) == 3 and "scipy failed (MemoryError: out of memory" in lines[1]
    assert "scipy " in lines[2] and "wrong result (rel. error 1.0e+00)" in lines[2]
    s = b.summarize(rows)
    assert s["peers"]["scipy"]["inputs"] == 1 and s["peers"]["scipy"]["least_on"] == "m.mtx"
    assert [(t["name"], t["status"]) for t in s["trouble"]] == [("g.txt", "failed"),
                                                               ("sq.txt", "wrong result")]
    text = b.markdown(rows)
    assert "| g.txt | A·Aᵀ | 90×70 |" in text and "| failed | – | – |" in text
    assert "(wrong) | – | – |" in text
    assert ("Failed, wrong or not checked: scipy on g.txt (failed: MemoryError: out of memory "
            "allocating 12 bytes); scipy on sq.txt (wrong result: rel. error 1.0e+00).") in text


def test_a_memory_error_of_mgpu_is_a_row_not_the_end(monkeypatch):
    import mgpu

    real = mgpu.spgemm

    def spgemm(A, B, **kw):
        if A.shape == (90, 70):
            raise mgpu.DeviceMemoryError("C of 10 nonzeros does not fit")
        return real(A, B, **kw)

    monkeypatch.setattr(mgpu, "spgemm", spgemm)
    lines = []
    _, rows = _rows(progress=lines.append)
    r = rows[1]
    assert r["mgpu_error"] == "DeviceMemoryError: C of 10 nonzeros does not fit"
    assert r["peers"] == {} and r["mgpu_ms"] is None and r["nnz_c"] is None
    assert rows[0]["mgpu_ms"] > 0 and rows[2]["mgpu_ms"] > 0
    assert lines[1] == ("g.txt, A·Aᵀ: " + f"{r['products']:,}" + " products; mgpu failed: "
                        "DeviceMemoryError: C of 10 nonzeros does not fit")
    assert "mgpu on g.txt (failed: DeviceMemoryError" in b.markdown(rows)


def test_summary_gives_the_median_and_least_ratio():
    _, rows = _rows()
    ratios = [r["peers"]["scipy"]["ratio"] for r in rows]
    s = b.summarize(rows)["peers"]["scipy"]
    assert s["median_ratio"] == pytest.approx(np.median(ratios))
    assert s["least_ratio"] == min(ratios)
    assert s["least_on"] == rows[int(np.argmin(ratios))]["name"] and s["inputs"] == 3
    text = b.markdown(rows)
    lines = text.splitlines()
    assert lines[0].startswith("| input | form | A | nnz(A) | nnz(B) | products | nnz(C) | "
                               "mgpu ms | mgpu GFLOP/s | scipy ms | scipy GFLOP/s | scipy "
                               "ratio | rel. error |")
    assert len(lines) == 2 + 3 + 2 and lines[5] == ""
    assert f"scipy: median ratio {np.median(ratios):.2f} over 3 input(s), least " \
        f"{min(ratios):.2f} on {s['least_on']}." in lines[6]
    assert "No peer failed or returned a wrong result." in lines[6]
    assert "Peers: scipy is scipy A @ B." in lines[6]


def test_gpu_rows_in_the_table_and_the_plot(tmp_path):
    """The GPU's columns (peaks, two peers, a failure and a wrong result) from rows made by
    hand, as a GPU run makes them."""
    pytest.importorskip("matplotlib")
    from mgpu.cli import _plots

    def peer(key, **kw):
        return dict(b._peer(key), **kw)

    base = {"form": "AAt", "device": "gpu", "device_name": "GPU X", "dtype": "float32",
            "shape_a": [10, 8], "shape_b": [8, 10], "nnz_a": 20, "nnz_b": 20,
            "products": 1000, "nnz_c": 50, "threads": None, "checked": True, "rel_err": 1e-7,
            "mgpu_ms": 1.0, "mgpu_gflops": 2e-3, "mgpu_peak_bytes": 3 << 20,
            "mgpu_error": None}
    rows = [dict(base, name="a", peers={
                "cusparse": peer("cusparse", ms=2.0, gflops=1e-3, ratio=2.0, peak_bytes=5 << 20),
                "torch": peer("torch", status="failed", error="RuntimeError: CUDA error")}),
            dict(base, name="b", form="AA", peers={
                "cusparse": peer("cusparse", status="wrong result", ms=0.5, gflops=4e-3,
                                 rel_err=1.0, peak_bytes=1 << 20),
                "torch": peer("torch", ms=4.0, gflops=5e-4, ratio=4.0, peak_bytes=2 << 20)})]
    text = b.markdown(rows)
    head = text.splitlines()[0]
    assert head.endswith("| cuSPARSE ms | cuSPARSE GFLOP/s | cuSPARSE ratio | torch ms | "
                         "torch GFLOP/s | torch ratio | rel. error | mgpu peak | cuSPARSE peak "
                         "| torch peak |")
    assert "| failed | – | – | 1.0e-07 | 3.00 MiB | 5.00 MiB | – |" in text
    assert "| 0.500 (wrong) | – | – | 4.000 | 0.00 | 4.00 | 1.0e-07 | 3.00 MiB | 1.00 MiB | " \
        "2.00 MiB |" in text
    s = b.summarize(rows)["peers"]
    assert (s["cusparse"]["inputs"], s["cusparse"]["median_ratio"]) == (1, 2.0)
    assert (s["torch"]["inputs"], s["torch"]["least_on"]) == (1, "b")
    png = tmp_path / "spgemm.png"
    _plots.spgemm(rows, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# ------------------------------------------------------------------ refusals, imports

@pytest.mark.parametrize("kw, match", [
    ({"device": "tpu"}, "The 'device' parameter of bench_spgemm must be a str among"),
    ({"repeats": 0}, "The 'repeats' parameter of bench_spgemm must be a positive integer"),
    ({"repeats": True}, "The 'repeats' parameter"),
    ({"dtype": "int32"}, "The 'dtype' parameter of bench_spgemm must be a str among "
                         r"\{'float32', 'float64'\}. Got 'int32' instead"),
    ({"dtype": None}, "The 'dtype' parameter"),
    ({"form": "A"}, "The 'form' parameter"),
])
def test_bad_parameters_are_refused_before_any_run(kw, match, monkeypatch):
    monkeypatch.setattr(b, "_run_one", lambda *a: pytest.fail("ran"))
    with pytest.raises(ValueError, match=match):
        b.bench_spgemm([("m.mtx", sp.identity(3, format="csr"))], **{"repeats": 1, **kw})


def test_device_gpu_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(b, "_gpu_available", lambda: False)
    with pytest.raises(ValueError, match="is 'gpu', but no GPU is visible"):
        b.bench_spgemm([("m.mtx", sp.identity(3, format="csr"))], device="gpu")


def test_importing_the_bench_and_a_cpu_run_need_neither_cupy_nor_torch():
    code = ("import sys; sys.modules['cupy'] = sys.modules['torch'] = None\n"
            "import scipy.sparse as sp\n"
            "from mgpu.bench import spgemm as b\n"
            "rows = b.bench_spgemm([('m.mtx', sp.random(30, 30, density=0.1, format='csr',"
            " random_state=0))], 1, device='cpu')\n"
            "assert rows[0]['peers']['scipy']['status'] == 'ok'\n"
            "import mgpu.cli.bench_spgemm\n"
            "print('fine')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "fine", out.stderr


# ------------------------------------------------------------------ the command

def _files(tmp_path):
    M = sp.random(60, 60, density=0.08, format="coo", random_state=7)
    mtx = tmp_path / "m.mtx"
    scipy.io.mmwrite(str(mtx), M)
    edges = tmp_path / "edges.txt"
    edges.write_text("# a tiny directed graph\n0 1\n0 2\n1 2\n2 3\n3 0\n3 1\n4 2\n")
    return mtx, edges, M


def test_command_on_a_matrix_market_file_and_an_edge_list(tmp_path):
    from click.testing import CliRunner

    from mgpu.cli import main

    mtx, edges, M = _files(tmp_path)
    out = tmp_path / "spgemm.json"
    r = CliRunner().invoke(main, ["bench", "spgemm", str(mtx), str(edges), "--powerlaw",
                                  "300x200:2000", "--device", "cpu", "--repeats", "1",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert [(row["name"], row["form"]) for row in rows] == [
        ("m.mtx", "AA"), ("edges.txt", "AAt"), ("power-law 300x200", "AAt")]
    A = sp.csr_matrix(M)
    assert rows[0]["nnz_a"] == A.nnz and rows[0]["nnz_c"] == (A @ A).nnz
    G = sp.csr_matrix((np.ones(7), ([0, 0, 1, 2, 3, 3, 4], [1, 2, 2, 3, 0, 1, 2])), (5, 5))
    assert rows[1]["shape_a"] == [5, 5] and rows[1]["nnz_a"] == 7
    assert rows[1]["products"] == 15 and rows[1]["nnz_c"] == (G @ G.T).nnz  # Σ in-degree²
    assert rows[2]["shape_a"] == [300, 200]
    for row in rows:
        assert row["rel_err"] < 1e-6 and row["peers"]["scipy"]["status"] == "ok"
        assert row["peers"]["scipy"]["ratio"] > 0
    assert payload["summary"]["peers"]["scipy"]["inputs"] == 3
    assert payload["summary"]["trouble"] == []
    # one line per input as it is done, the form said on each, then the table
    assert "m.mtx, A·A: " in r.output and "edges.txt, A·Aᵀ: 15 products, nnz(C) " in r.output
    assert "| edges.txt | A·Aᵀ | 5×5 | 7 | 7 | 15 |" in r.output
    assert "scipy: median ratio" in r.output and f"measurements written to {out}" in r.output


def test_command_with_a_plot_and_forced_forms(tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from mgpu.cli import main

    mtx, edges, _ = _files(tmp_path)
    png = tmp_path / "spgemm.png"
    r = CliRunner().invoke(main, ["bench", "spgemm", str(mtx), str(edges), "--form", "AAt",
                                  "--dtype", "float64", "--device", "cpu", "--repeats", "1",
                                  "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert "m.mtx, A·Aᵀ: " in r.output and "| m.mtx | A·Aᵀ |" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_refusals(tmp_path):
    from click.testing import CliRunner

    from mgpu.cli import main

    runner = CliRunner()
    r = runner.invoke(main, ["bench", "spgemm", "--device", "cpu"])
    assert r.exit_code == 2 and "give matrix files (INPUTS) and/or --powerlaw" in r.output
    r = runner.invoke(main, ["bench", "spgemm", "--powerlaw", "300x200:2000", "--form", "AA",
                             "--device", "cpu"])
    assert r.exit_code == 2 and "needs square matrices, but power-law 300x200 is 300×200" \
        in r.output, r.output
    r = runner.invoke(main, ["bench", "spgemm", "--powerlaw", "300x200:2000", "--form", "BA"])
    assert r.exit_code == 2 and "'BA' is not one of 'auto', 'AA', 'AAt'" in r.output
    r = runner.invoke(main, ["bench", "spgemm", "--powerlaw", "300x200", "--device", "cpu"])
    assert r.exit_code == 2 and "--powerlaw" in r.output
    r = runner.invoke(main, ["bench", "spgemm", str(tmp_path / "missing.mtx")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_on_real_data(data_dir):
    """A square Matrix Market matrix (A·A) and a SNAP graph (A·Aᵀ) of the data folder."""
    from mgpu.cli._inputs import load_matrix

    paths = [data_dir / "matrices" / "bcsstk13.mtx.gz", data_dir / "graphs" /
             "facebook_combined.txt.gz"]
    if not all(p.exists() for p in paths):
        pytest.skip("bcsstk13.mtx.gz or facebook_combined.txt.gz is not in the data folder")
    mats = [(p.name, load_matrix(str(p))) for p in paths]
    rows = b.bench_spgemm(mats, 1, device="cpu", dtype="float64")
    assert [r["form"] for r in rows] == ["AA", "AAt"]
    for (_, M), r in zip(mats, rows):
        A = sp.csr_matrix(M, dtype=np.float64)
        A.sum_duplicates()
        B = A if r["form"] == "AA" else A.T.tocsr()
        assert r["products"] == int(np.diff(B.indptr)[A.indices].sum())
        # bcsstk13's square has sums that cancel: exactly 0 in one order of the additions
        # (left out) and a rounding residue in another, so nnz(C) may differ a little
        ref = (A @ B).nnz
        assert abs(r["nnz_c"] - ref) <= 0.02 * ref and r["rel_err"] < 1e-12
        assert r["peers"]["scipy"]["status"] == "ok"


# ------------------------------------------------------------------ across workers

def _scaling_operands():
    from mgpu.synthetic import powerlaw_csr

    return s.operands(powerlaw_csr(600, 400, 3000, seed=0), "auto", "power-law 600x400")


def test_operands_take_the_form_and_float32():
    M = sp.random(50, 50, density=0.1, format="coo", random_state=0)
    A, B, how = s.operands(M, "auto", "m.mtx.gz")
    assert how == "AA" and B is A and A.dtype == np.float32 and A.format == "csr"
    A, B, how = s.operands(M, "AAt", "m.mtx.gz")
    assert how == "AAt" and (B != A.T).nnz == 0 and B.format == "csr"


def test_scaling_rows_on_cpu_workers():
    from mgpu.partition import part_sums, spgemm_row_work, split_counts

    A, B, _ = _scaling_operands()
    lines = []
    rows = s.bench_scaling(A, B, (1, 2), repeats=1, gpus=False, progress=lines.append)
    assert [(r["workers"], r["call"], r["kind"], r["tiles"]) for r in rows] == [
        (s.ONE_DEVICE, "", "CPU", 1), (1, s.PARTS, "CPU", 1), (1, s.HELD, "CPU", 1),
        (1, s.RING, "CPU", 1), (2, s.PARTS, "CPU", 2), (2, s.HELD, "CPU", 2),
        (2, s.RING, "CPU", 2)]
    flops, nnz_c = b.products(A, B), (A @ B).nnz
    work = spgemm_row_work(A, B)
    tile_work = part_sums(work, split_counts(work, 2))
    for r in rows:
        assert (r["products"], r["nnz_c"], r["nnz_a"], r["dtype"]) == (flops, nnz_c, A.nnz,
                                                                      "float32")
        assert r["median_s"] > 0 and r["gflops"] == pytest.approx(2 * flops / r["median_s"] / 1e9)
        assert r["speedup_vs_one_device"] == pytest.approx(rows[0]["median_s"] / r["median_s"])
        assert r["imbalance"] >= 1.0
    assert [r["same_c"] for r in rows] == [None] + [True] * 6
    assert rows[0]["rows_checked"] == 0 and rows[1]["rows_checked"] >= 3
    assert rows[4]["rows_checked"] >= 6  # at least first, middle and last of each tile
    assert rows[0]["speedup_vs_one_device"] == 1.0 and rows[0]["speedup_vs_1_worker"] is None
    assert [r["speedup_vs_1_worker"] for r in rows[1:4]] == [1.0] * 3
    # against the 1-worker row of the same call
    for two, one in zip(rows[4:], rows[1:4]):
        assert two["speedup_vs_1_worker"] == pytest.approx(one["median_s"] / two["median_s"])
    # parts=N and the gathering SPMD job cut C's rows by work; the ring keeps A's tiles
    for two in rows[4:6]:
        assert two["imbalance"] == pytest.approx(tile_work.max() / tile_work.mean())
    nnz_work = part_sums(work, split_counts(np.diff(A.indptr), 2))  # A's tiles: equal nnz
    assert rows[6]["imbalance"] == pytest.approx(nnz_work.max() / nnz_work.mean())
    assert rows[1]["imbalance"] == 1.0
    assert len(lines) == 7 and lines[0].startswith("one device, no cluster CPU: ")
    assert "2 CPU worker(s), parts=N, 2 tile(s): " in lines[4] and ", C identical (" in lines[4]
    assert "2 CPU worker(s), held, SPMD, 2 tile(s): " in lines[5]
    assert "2 CPU worker(s), held, ring, 2 tile(s): " in lines[6]
    text = s.scaling_markdown(rows, "A·Aᵀ of power-law 600x400").splitlines()
    assert text[0].startswith("| product | workers | call | tiles | work imbalance (max/mean) | "
                              "products | nnz(C) | median ms | GFLOP/s | speedup vs one "
                              "device | speedup vs 1 worker | C equal to one device |")
    assert len(text) == 2 + 7
    assert text[2].startswith("| A·Aᵀ of power-law 600x400 | one device, no cluster CPU | – | "
                              f"1 | 1.0000 | {flops:,} | {nnz_c:,} |")
    assert text[2].endswith("| 1.00× | – | – |") and text[7].endswith("× | yes |")
    assert text[7].startswith(f"| A·Aᵀ of power-law 600x400 | 2 CPU | held, SPMD | 2 | "
                              f"{rows[5]['imbalance']:.4f} |")


def test_tile_rows_checked_prefer_rows_with_work():
    work = np.array([0, 0, 3, 0, 9, 1, 0, 2, 0])
    assert s.tile_rows_checked(work, 1, 8) == [1, 3, 6]  # rows 2, 4 (heaviest), 7
    assert s.tile_rows_checked(work, 0, 9) == [2, 4, 7]
    assert s.tile_rows_checked(work, 5, 6) == [0]
    assert s.tile_rows_checked(np.zeros(4, dtype=np.int64), 0, 4) == [0, 1, 3]
    assert s.tile_rows_checked(work, 3, 3) == []


def test_scaling_check_finds_a_c_that_differs(client):
    """The check against one device's C, on a C spread over a CPU cluster: it passes C
    itself and values one rounding apart, and fails a value off by 1e-4 in a row it
    compares, and an entry missing from a row it does not."""
    import mgpu
    from mgpu.partition import spgemm_row_work

    A, B, _ = _scaling_operands()
    C = mgpu.spgemm(A, B, parts=3, client=client)
    ref = mgpu.spgemm(A, B)
    work = spgemm_row_work(A, B)
    same, checked, nnz = s._same_c(C, ref, A, B, work, client)
    assert same and nnz == ref.nnz and checked >= 9
    first = int(s.tile_rows_checked(work, 0, C.chunks[0][0])[0])
    at = int(ref.indptr[first])
    assert ref.indptr[first + 1] > at

    def changed(value):
        R = ref.copy()
        R.data[at] = value
        return s._same_c(C, R, A, B, work, client)[0]

    v = ref.data[at]
    assert changed(np.nextafter(v, np.float32(np.inf)))
    assert not changed(v * np.float32(1 + 1e-4))
    # an entry left out of a row that is not compared: the tile's nnz tells
    picked = {int(C.chunks[0][0]) + r for r in
              s.tile_rows_checked(work, C.chunks[0][0], C.chunks[0][0] + C.chunks[0][1])}
    other = next(i for i in range(C.chunks[0][0], C.chunks[0][0] + C.chunks[0][1])
                 if i not in picked and ref.indptr[i + 1] > ref.indptr[i])
    R = ref.copy()
    R.data[R.indptr[other]] = 0
    R.eliminate_zeros()
    assert s._same_c(C, R, A, B, work, client)[:2] == (False, checked)


@pytest.mark.parametrize("kw, error, match", [
    ({"workers": ()}, ValueError, "The 'workers' parameter of bench_scaling must be a "
                                  r"non-empty sequence of positive integers such as \(1, 2, 4\)"),
    ({"workers": (1, 0)}, ValueError, "The 'workers' parameter"),
    ({"workers": (1.5,)}, ValueError, "The 'workers' parameter"),
    ({"workers": 2}, ValueError, "The 'workers' parameter"),
    ({"tiles_per_worker": 0}, ValueError, "The 'tiles_per_worker' parameter of bench_scaling "
                                          "must be a positive integer. Got 0 instead"),
    ({"repeats": True}, ValueError, "The 'repeats' parameter"),
    ({"workers": (4,), "tiles_per_worker": 200}, ValueError, r"asks for 4 × 200 row tiles, "
                                                             "more than A's 600 rows"),
    ({"A": np.ones((3, 3))}, TypeError, "The 'A' parameter of bench_scaling must be a scipy "
                                        "sparse matrix. Got ndarray instead"),
    ({"B": sp.identity(7, format="csr")}, ValueError, "The 'A' and 'B' parameters of "
                                                       r"bench_scaling must have A.shape\[1\]"),
])
def test_scaling_refuses_bad_parameters_before_any_run(kw, error, match, monkeypatch):
    import mgpu.distributed

    monkeypatch.setattr(s, "_one_device", lambda *a: pytest.fail("ran"))
    monkeypatch.setattr(mgpu.distributed, "connect", lambda **k: pytest.fail("started"))
    A, B, _ = _scaling_operands()
    args = {"A": A, "B": B, "workers": (1, 2), **kw}
    with pytest.raises(error, match=match):
        s.bench_scaling(args.pop("A"), args.pop("B"), args.pop("workers"), **args)


def test_scaling_command_on_cpu_workers(tmp_path):
    from click.testing import CliRunner

    from mgpu.cli import main

    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    r = CliRunner().invoke(main, ["bench", "spgemm-scaling", "--powerlaw", "600x400:3000",
                                  "--workers", "1,2", "--device", "cpu", "--repeats", "1",
                                  "--json", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())
    A, B, _ = _scaling_operands()
    assert [(row["workers"], row["call"], row["tiles"]) for row in rows] == [
        ("one device, no cluster", "", 1), (1, "parts=N", 1), (1, "held, SPMD", 1),
        (1, "held, ring", 1), (2, "parts=N", 2), (2, "held, SPMD", 2), (2, "held, ring", 2)]
    assert [row["same_c"] for row in rows] == [None] + [True] * 6
    for row in rows:
        assert (row["input"], row["form"], row["dtype"]) == ("power-law 600x400", "AAt",
                                                             "float32")
        assert (row["shape_a"], row["products"], row["nnz_c"]) == ([600, 400],
                                                                   b.products(A, B),
                                                                   (A @ B).nnz)
        assert row["gflops"] > 0 and row["imbalance"] >= 1.0
    assert rows[1]["speedup_vs_1_worker"] == 1.0
    assert rows[5]["speedup_vs_one_device"] == pytest.approx(rows[0]["median_s"]
                                                             / rows[5]["median_s"])
    assert r.output.startswith("A·Aᵀ of power-law 600x400: A 600×400 with ")
    assert "| A·Aᵀ of power-law 600x400 | 2 CPU | parts=N | 2 |" in r.output
    assert "| A·Aᵀ of power-law 600x400 | 2 CPU | held, SPMD | 2 |" in r.output
    assert f"measurements written to {out}" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, match", [
    ([], "give one matrix: INPUT or one --powerlaw ROWSxCOLS:NNZ"),
    (["--powerlaw", "60x40:300", "--powerlaw", "80x40:300"],
     r"give one matrix: INPUT or one --powerlaw ROWSxCOLS:NNZ \(got 2 --powerlaw\)"),
    (["{mtx}", "--powerlaw", "60x40:300"], r"\(got INPUT and 1 --powerlaw\)"),
    (["--powerlaw", "60x40"], "Invalid value for '--powerlaw'"),
    (["--powerlaw", "60x40:300", "--form", "AA"], "needs square matrices, but power-law "
                                                  "60x40 is 60×40"),
    (["--powerlaw", "60x40:300", "--workers", "0"], "every value must be >= 1"),
    (["--powerlaw", "60x40:300", "--workers", "64", "--device", "gpu"], r"GPU\(s\) are visible"),
    (["--powerlaw", "60x40:300", "--workers", "40", "--tiles-per-worker", "2"],
     "asks for 40 × 2 row tiles, more than A's 60 rows"),
])
def test_scaling_command_refusals(args, match, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from mgpu.cli import main

    monkeypatch.setattr(s, "_one_device", lambda *a: pytest.fail("ran"))
    mtx, _, _ = _files(tmp_path)
    args = [a.format(mtx=mtx) for a in args]
    # CPU workers unless the case asks for GPUs (click keeps an option's last value)
    r = CliRunner().invoke(main, ["bench", "spgemm-scaling", "--device", "cpu", *args])
    assert r.exit_code == 2, r.output
    assert re.search(match, r.output.replace("\n", " ")), r.output
