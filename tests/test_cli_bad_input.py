"""Every ``mgpu run`` job fed each bad input that applies to it: a clear message (click's
usage error or a one-line error, never a traceback), a non-zero exit, and no work done
first (no cluster started, nothing written).

The table's rows are (job, arguments, a fragment of the expected message); ``{name}`` in an
argument is a file of the ``files`` fixture. A job added to ``mgpu run`` without rows here
fails :func:`test_every_run_job_is_in_the_table`.
"""
from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from click.testing import CliRunner

from mgpu.cli import main
from mgpu.cli.run import run

MISSING = "no-such-folder"

# (job, arguments, what the message must say)
BAD_INPUTS: list[tuple[str, list[str], str]] = [
    # --- partition
    ("partition", ["--powerlaw", "100x100", "--parts", "0"],
     "'--parts': 0 is not in the range x>=1"),
    ("partition", ["--powerlaw", "0x0"], "'--powerlaw': rows and columns must be >= 1, got '0x0'"),
    ("partition", ["--powerlaw", "100by100"], "expected ROWSxCOLS"),
    ("partition", ["--powerlaw", "100x100", "--nnz", "-5"],
     "'--nnz': must be a number >= 1, got -5"),
    ("partition", ["--powerlaw", "100x100", "--nnz", "nan"],
     "'--nnz': must be a number >= 1, got nan"),
    ("partition", ["--powerlaw", "100x100", "--plot", f"{MISSING}/p.png"],
     f"--plot: folder {MISSING} does not exist"),
    ("partition", ["--powerlaw", "100x100", "--axis", "2"], "'--axis': '2' is not one of"),
    ("partition", [], "give either an input file (INPUT) or --powerlaw"),
    # --- knn-graph
    ("knn-graph", ["--powerlaw", "50x40", "--out", "{out_npz}", "--parts", "0"],
     "'--parts': 0 is not in the range x>=1"),
    ("knn-graph", ["--powerlaw", "50x40", "--out", "{out_npz}", "-k", "0"],
     "'-k' / '--k': 0 is not in the range x>=1"),
    ("knn-graph", ["--powerlaw", "0x40", "--out", "{out_npz}"], "rows and columns must be >= 1"),
    ("knn-graph", ["--powerlaw", "50x40", "--nnz", "-5", "--out", "{out_npz}"],
     "must be a number >= 1"),
    ("knn-graph", ["--powerlaw", "50x40", "--out", f"{MISSING}/g.npz"],
     f"--out: folder {MISSING} does not exist"),
    ("knn-graph", ["--powerlaw", "50x40", "--out", "{tmp}/g.txt"], "give a path ending in .npz"),
    ("knn-graph", ["--powerlaw", "50x40", "--out", "{out_npz}", "--plot", f"{MISSING}/h.png"],
     f"--plot: folder {MISSING} does not exist"),
    ("knn-graph", ["{empty_mtx}", "--out", "{out_npz}"],
     "INPUT of knn-graph has 0 row(s) (an empty file?)"),
    ("knn-graph", ["--powerlaw", "50x40", "--out", "{out_npz}", "--metric", "nope"],
     "'metric' parameter of knn-graph"),
    # --- ann-graph
    ("ann-graph", ["{corpus}", "--out", f"{MISSING}/g.npz"],
     f"--out: folder {MISSING} does not exist"),
    ("ann-graph", ["{corpus}", "--out", "{tmp}/g.txt"], "give a path ending in .npz"),
    ("ann-graph", ["{corpus}", "--out", "{out_npz}", "--degree", "1"],
     "'--degree': 1 is not in the range x>=2"),
    ("ann-graph", ["{corpus}", "--out", "{out_npz}", "--metric", "manhattan"],
     "'--metric': 'manhattan' is not one of"),
    ("ann-graph", ["{nan_mtx}", "--out", "{out_npz}"],
     "The 'X' parameter of GraphIndex.fit holds NaN or infinity"),
    ("ann-graph", ["{empty_mtx}", "--out", "{out_npz}"],
     "The 'X' parameter of GraphIndex.fit must have at least 1 row(s)"),
    # --- jaccard
    ("jaccard", ["{graph}", "--out", "{out_npz}", "--parts", "0"],
     "'--parts': 0 is not in the range x>=1"),
    ("jaccard", ["{graph}", "--out", "{out_npz}", "--top", "-1"],
     "'--top': -1 is not in the range"),
    ("jaccard", ["{graph}", "--out", f"{MISSING}/j.npz"],
     f"--out: folder {MISSING} does not exist"),
    ("jaccard", ["{graph}", "--out", "{out_npz}", "--plot", f"{MISSING}/j.png"],
     f"--plot: folder {MISSING} does not exist"),
    # --- triangles
    ("triangles", ["{graph}", "--symmetrize", "--top", "-1"], "'--top': -1 is not in the range"),
    ("triangles", ["{graph}", "--symmetrize", "--out", f"{MISSING}/t.csv"],
     f"--out: folder {MISSING} does not exist"),
    ("triangles", ["{graph}", "--symmetrize", "--out", "{out_npz}"],
     "give a path ending in .csv or .npy"),
    ("triangles", ["{graph}", "--symmetrize", "--device", "tpu"], "'--device': 'tpu' is not one"),
    ("triangles", ["{graph}", "--out", "{tmp}/t.csv"],
     "its pattern is not symmetric (first: an edge 1 -> 2 without its reverse). Pass "
     "--symmetrize"),
    ("triangles", ["{nan_mtx}"], "The 'G' parameter of triangles holds NaN or infinity"),
    ("triangles", ["{empty_mtx}"], "must be a square adjacency matrix. Got shape (0, 5)"),
    # --- mf
    ("mf", ["{ratings}", "--out", "{out_dir}", "-k", "0"], "'-k' / '--k': 0 is not in the range"),
    ("mf", ["{ratings}", "--out", "{out_dir}", "--epochs", "0"],
     "'--epochs': 0 is not in the range"),
    ("mf", ["{ratings}", "--out", "{out_dir}", "--lr", "0"], "'--lr': 0.0 is not in the range x>0"),
    ("mf", ["{ratings}", "--out", "{out_dir}", "--reg", "-1"], "'--reg': -1.0 is not in the range"),
    ("mf", ["{ratings}", "--out", f"{MISSING}/mf"], f"--out: folder {MISSING} does not exist"),
    ("mf", ["{ratings}", "--out", "{ratings}"], "is a file"),
    ("mf", ["{ratings}", "--out", "{out_dir}", "--plot", f"{MISSING}/mf.png"],
     f"--plot: folder {MISSING} does not exist"),
    ("mf", ["{ratings}", "--out", "{out_dir}", "--modes", "warp"],
     "modes must be among sequential"),
    ("mf", ["{tmp}/none.csv", "--out", "{out_dir}"], "does not exist"),
    # --- gradient-mf (and its old name, als)
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "-k", "0"], "'-k' / '--k': 0 is not in"),
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--iters", "0"],
     "'--iters': 0 is not in the range x>=1"),
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--lr", "-1"], "'--lr': -1.0 is not in"),
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--reg", "-0.5"], "'--reg': -0.5 is not"),
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--parts", "0"], "'--parts': 0 is not"),
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--workers", "0"], "'--workers': 0 is not"),
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--test-fraction", "1.5"],
     "'test_fraction' parameter of split_ratings must be in (0, 1)"),
    ("gradient-mf", ["{ratings}", "--out", f"{MISSING}/g"], f"--out: folder {MISSING} does not"),
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--plot", f"{MISSING}/g.png"],
     f"--plot: folder {MISSING} does not exist"),
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--device", "cpu", "--parts", "2"],
     "go with --device cluster"),
    # a learning rate that diverges: stopped, named, nothing written
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--device", "cpu", "--lr", "100",
                     "-k", "3", "--iters", "20"],
     "cpu: GradientMF diverged at step 2: the training RMSE rose to"),
    ("gradient-mf", ["{ratings}", "--out", "{out_dir}", "--device", "cpu", "--lr", "1e6",
                     "-k", "3", "--iters", "20"], "Lower the learning rate (lr=1000000.0)"),
    # --- gap
    ("gap", ["{corpus}", "--out", "{out_dir}", "--topics", "0"], "'--topics': 0 is not in"),
    ("gap", ["{corpus}", "--out", "{out_dir}", "--iters", "0"], "'--iters': 0 is not in"),
    ("gap", ["{corpus}", "--out", "{out_dir}", "--alpha", "0.5"], "'--alpha': 0.5 is not in"),
    ("gap", ["{corpus}", "--out", "{out_dir}", "--beta", "0"], "'--beta': 0.0 is not in"),
    ("gap", ["{corpus}", "--out", "{out_dir}", "--parts", "0"], "'--parts': 0 is not in"),
    ("gap", ["{negative_mtx}", "--out", "{out_dir}"],
     "The 'CORPUS' parameter of run gap must hold non-negative counts"),
    ("gap", ["{nan_mtx}", "--out", "{out_dir}"],
     "The 'CORPUS' parameter of run gap holds NaN or infinity"),
    ("gap", ["{huge_mtx}", "--out", "{out_dir}", "--device", "cpu"],
     "holds counts whose total (inf) overflows float64"),
    ("gap", ["{corpus}", "--vocab", "{short_vocab}", "--out", "{out_dir}"],
     "--vocab: short_vocab.txt holds 9 word(s) (non-empty lines) but docword.toy.txt has 10"),
    ("gap", ["{corpus}", "--out", f"{MISSING}/gap"], f"--out: folder {MISSING} does not exist"),
    ("gap", ["{corpus}", "--out", "{out_dir}", "--plot", f"{MISSING}/gap.png"],
     f"--plot: folder {MISSING} does not exist"),
]

# the old name of gradient-mf (hidden, deprecated) refuses what the new one refuses
BAD_INPUTS += [("als", args, fragment) for job, args, fragment in BAD_INPUTS
               if job == "gradient-mf"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The inputs the table names: good ones for the rows whose fault is an option, and the
    bad files themselves."""
    tmp = tmp_path_factory.mktemp("bad-input")
    rng = np.random.default_rng(2)
    U, V = rng.normal(size=(60, 3)), rng.normal(size=(40, 3))
    pairs = sorted(set(zip(rng.integers(0, 60, 1500).tolist(), rng.integers(0, 40, 1500).tolist())))
    (tmp / "ratings.csv").write_text("userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},{3 + U[u] @ V[i]:.3f},0\n" for u, i in pairs))
    lines = [f"{d + 1} {w + 1} {1 + (d * w) % 4}" for d in range(30) for w in range(10)
             if (d + w) % 3 == 0]
    (tmp / "docword.toy.txt").write_text(f"30\n10\n{len(lines)}\n" + "\n".join(lines) + "\n")
    (tmp / "short_vocab.txt").write_text("\n".join(f"w{i}" for i in range(9)) + "\n")
    (tmp / "graph.txt").write_text("1 2\n2 3\n3 4\n1 3\n")
    counts = np.array([[1.0, 2, 0], [0, 3, 1], [2, 0, 1]])
    for name, value in (("negative", -2.0), ("nan", np.nan), ("huge", 1e308)):
        bad = counts.copy()
        bad[0, 1] = value
        if name == "huge":
            bad[1, 1] = value
        scipy.io.mmwrite(str(tmp / f"{name}.mtx"), sp.coo_matrix(bad))
    scipy.io.mmwrite(str(tmp / "empty.mtx"), sp.coo_matrix((0, 5)))
    return {"tmp": str(tmp), "ratings": str(tmp / "ratings.csv"),
            "corpus": str(tmp / "docword.toy.txt"), "short_vocab": str(tmp / "short_vocab.txt"),
            "graph": str(tmp / "graph.txt"), "negative_mtx": str(tmp / "negative.mtx"),
            "nan_mtx": str(tmp / "nan.mtx"), "huge_mtx": str(tmp / "huge.mtx"),
            "empty_mtx": str(tmp / "empty.mtx"), "out_npz": str(tmp / "out.npz"),
            "out_dir": str(tmp / "out")}


def _refused(args: list[str], fragment: str, **kw) -> str:
    r = CliRunner().invoke(main, args, **kw)
    out = r.output
    assert r.exit_code != 0, out
    # click's usage error (2) or a one-line ClickException (1); an exception that escaped
    # (a traceback) is what CliRunner keeps in r.exception, with exit code 1
    assert isinstance(r.exception, SystemExit), (out, r.exc_info)
    assert "Traceback" not in out, out
    assert fragment in " ".join(out.split()), out
    return out


@pytest.mark.parametrize("job, args, fragment", BAD_INPUTS,
                         ids=[f"{j}:{' '.join(a)[-40:]}" for j, a, _ in BAD_INPUTS])
def test_a_bad_input_is_refused_with_a_message_before_any_work(files, job, args, fragment):
    argv = ["run", job, *(a.format(**files) for a in args)]
    if not any(a.startswith(("--device", "--workers", "--address")) for a in args) and job in (
            "partition", "knn-graph", "jaccard"):
        argv.append("--no-gpus")
    out = _refused(argv, fragment)
    assert "cluster:" not in out and "written to" not in out, out
    # nothing of a refused or diverged run is written
    out_dir = Path(files["out_dir"])
    assert not (out_dir.exists() and any(out_dir.iterdir())), sorted(out_dir.iterdir())
    assert not Path(files["out_npz"]).exists()


def test_every_run_job_is_in_the_table():
    """Every job of ``mgpu run`` (hidden old names too) has rows, at least one of them an
    argument check, and every job writing files a check of its output folder."""
    jobs = set(run.commands)
    assert jobs == {job for job, _, _ in BAD_INPUTS}, jobs ^ {job for job, _, _ in BAD_INPUTS}
    for job in jobs:
        names = {p.name for p in run.commands[job].params}
        rows = [(args, frag) for j, args, frag in BAD_INPUTS if j == job]
        for option in ("plot", "parts", "k", "iters", "epochs", "topics", "nnz", "powerlaw"):
            if option in names:
                flag = {"k": "-k"}.get(option, f"--{option}")
                assert any(flag in args for args, _ in rows), (job, option)
        if "out" in names or "out_dir" in names:
            assert any(MISSING in " ".join(args) for args, _ in rows), job


def test_partition_self_check_fails_on_nan(monkeypatch):
    """The row-norm check used to pass on NaN (``err > 1e-5`` is false for NaN)."""
    import mgpu.bench.partition as part

    real = part.spread

    def nan_check(*args, **kw):
        placed = real(*args, **kw)
        placed["max_rel_err"] = float("nan")
        return placed

    monkeypatch.setattr(part, "spread", nan_check)
    out = _refused(["run", "partition", "--powerlaw", "300x200", "--nnz", "2000", "--no-gpus"],
                   "distributed row norms disagree with the local ones (nan)")
    assert "row-norm check on the workers: max relative error nan" in out


def test_partition_of_a_matrix_with_nan_checks_its_finite_rows(files):
    """A NaN in the matrix makes its row's norm NaN on both sides: compared by position, the
    other rows are still checked, and the check says so."""
    r = CliRunner().invoke(main, ["run", "partition", files["nan_mtx"], "--parts", "2",
                                  "--no-gpus"])
    assert r.exit_code == 0, r.output
    assert "max relative error 0.00e+00 (1 row(s) with NaN or infinity, compared by " \
           "position)" in r.output


def test_a_scheduler_where_nothing_listens_is_reported_at_once():
    """Used to retry for the whole connect timeout (60 s) and end in a traceback."""
    import dask.config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    address = f"tcp://127.0.0.1:{port}"
    with dask.config.set({"mgpu.connect.timeout": 30}):
        _refused(["run", "partition", "--powerlaw", "100x100", "--nnz", "500", "--address",
                  address], f"Nothing listens at {address} (the connection was refused)")


def test_connect_refuses_an_address_where_nothing_listens_without_waiting():
    import dask.config

    from mgpu.distributed import connect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with dask.config.set({"mgpu.connect.timeout": 30}), \
            pytest.raises(ConnectionRefusedError, match=f"Nothing listens at 127.0.0.1:{port}"):
        connect(f"127.0.0.1:{port}")
    with pytest.raises(ConnectionError, match="names a host that does not resolve"):
        connect("tcp://no-such-host.invalid:8786")


def test_sddmm_on_the_gpu_without_cupy_says_how_to_install_it(monkeypatch):
    """device='gpu' without CuPy used to raise ModuleNotFoundError from inside the
    operation."""
    import sys

    import mgpu

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    S = sp.random(20, 10, density=0.3, format="csr", random_state=0)
    with pytest.raises(ImportError, match=r"sddmm\(device='gpu'\) needs CuPy, which is not "
                                          r"installed here .* pip install 'mgpu\[gpu\]'"):
        mgpu.sddmm(S, np.ones((20, 3)), np.ones((10, 3)), device="gpu")
