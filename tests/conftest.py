"""Shared fixtures and the GPU skip rules.

GPU tests are skipped by the number of visible CUDA devices, never by whether CuPy imports:
a machine with CuPy but no GPU skips them, a machine with a GPU but a broken CuPy fails them.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def sddmm_problem(dtype, K: int, *, m: int, n: int, density: float, seed: int,
                  sort: bool = False):
    """S (scipy CSR, values >= 0.5, empty rows 10..19 and empty columns 50..59) and its
    factors A (m × K) and B (n × K), all on the host; ``sort``: S's indices sorted."""
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    S = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=np.float64)
    keep_r, keep_c = np.ones(m), np.ones(n)
    keep_r[10:20], keep_c[50:60] = 0, 0
    S = (sp.diags(keep_r) @ S @ sp.diags(keep_c)).tocsr()
    S.eliminate_zeros()
    if sort:
        S.sort_indices()
    S.data += 0.5
    S = S.astype(dtype)
    A = rng.standard_normal((m, K)).astype(dtype)
    B = rng.standard_normal((n, K)).astype(dtype)
    return S, A, B


def sddmm_reference(S, A, B, hadamard: bool):
    """S's sampled A Bᵀ in float64 (times S's values with ``hadamard``), in S's order."""
    import numpy as np

    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    v = np.einsum("ik,ik->i", A[rows].astype(np.float64), B[S.indices].astype(np.float64))
    return v * S.data.astype(np.float64) if hadamard else v


def canonical(C):
    """A scipy CSR copy of C in canonical form (duplicates summed, no stored zeros, sorted):
    what scipy's own product and sum return, to compare a result's pattern with."""
    import scipy.sparse as sp

    C = sp.csr_matrix(C, copy=True)
    C.sum_duplicates()
    C.eliminate_zeros()
    C.sort_indices()
    return C


def skewed_product():
    """A and B of a SpGEMM whose rows of A hold 5 entries each but whose work differs 60-fold:
    rows 0..99 meet rows of B of 1 entry, rows 100..199 rows of 60 (equal nnz, work 5
    against 300 a row)."""
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(4)
    m, k, n = 200, 100, 500
    cols = np.concatenate([rng.choice(50, 5, replace=False) if i < 100
                           else 50 + rng.choice(50, 5, replace=False) for i in range(m)])
    A = sp.csr_matrix((rng.standard_normal(5 * m), cols, np.arange(0, 5 * m + 1, 5)),
                      shape=(m, k))
    lens = np.where(np.arange(k) < 50, 1, 60)
    bcols = np.concatenate([rng.choice(n, L, replace=False) for L in lens])
    B = sp.csr_matrix((rng.standard_normal(lens.sum()), bcols,
                       np.concatenate([[0], np.cumsum(lens)])), shape=(k, n))
    return A, B


def to_gpu(*xs):
    """Each of ``xs`` on the device: a scipy matrix as a cupyx CSR matrix, else a CuPy array."""
    import cupy
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    return tuple(csp.csr_matrix(x) if sp.issparse(x) else cupy.asarray(x) for x in xs)


def _cuda_device_count() -> int:
    # Ask the driver through CuPy only when a driver library is present at all, so that a
    # CPU-only machine never pays for (or trips over) a CuPy import.
    try:
        import ctypes.util

        if ctypes.util.find_library("cuda") is None and not Path("/dev/nvidiactl").exists():
            return 0
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except ImportError:
        return 0
    except Exception:  # a driver without devices raises cudaErrorNoDevice
        return 0


N_GPUS = _cuda_device_count()


def pytest_collection_modifyitems(config, items):
    for item in items:
        need = 0
        if item.get_closest_marker("gpu") is not None:
            need = 1
        mg = item.get_closest_marker("multi_gpu")
        if mg is not None:
            need = max(need, int(mg.args[0]) if mg.args else 2)
        if need > N_GPUS:
            item.add_marker(
                pytest.mark.skip(reason=f"needs {need} CUDA GPU(s), {N_GPUS} visible")
            )


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real datasets (``shared/data`` beside the checkout, or ``$MGPU_DATA``)."""
    env = os.environ.get("MGPU_DATA")
    path = Path(env) if env else REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"real datasets not found at {path} (set MGPU_DATA to their folder)")
    return path


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module a test body runs on: numpy always, cupy where a GPU is visible."""
    if request.param == "numpy":
        import numpy

        return numpy
    import cupy

    return cupy


@pytest.fixture(scope="module")
def client():
    """A CPU LocalCluster of two single-thread worker processes, one per test module."""
    from mgpu.distributed import connect

    with connect(gpus=False, n_workers=2) as c:
        yield c


@pytest.fixture
def tls_config(tmp_path) -> dict[str, object]:
    """Dask's config for TLS everywhere, with a fresh self-signed certificate in files, as a
    site would write it on every node (docs/deploying.md)."""
    pytest.importorskip("cryptography", reason="Security.temporary() makes its certificate "
                        "with cryptography (a test extra)")
    from distributed.security import Security

    tmp = Security.temporary()
    (tmp_path / "ca.pem").write_text(tmp.tls_ca_file)
    (tmp_path / "node.pem").write_text(tmp.tls_client_cert)
    (tmp_path / "node-key.pem").write_text(tmp.tls_client_key)
    cfg: dict[str, object] = {
        "distributed.comm.require-encryption": True,
        "distributed.comm.default-scheme": "tls",
        "distributed.comm.tls.ca-file": str(tmp_path / "ca.pem"),
    }
    for role in ("scheduler", "worker", "client"):
        cfg[f"distributed.comm.tls.{role}.cert"] = str(tmp_path / "node.pem")
        cfg[f"distributed.comm.tls.{role}.key"] = str(tmp_path / "node-key.pem")
    return cfg
