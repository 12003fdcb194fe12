"""``mgpu bench spmv``: mgpu's merge-path SpMV against its peer on the same matrices, in one run.

GPU peer: cupyx ``A @ x`` (cuSPARSE's SpMV). CPU peer: scipy ``A @ x``. Both sides get the
same CSR matrix and vector in float32; every row also records the largest error of mgpu's
result relative to the largest value of a float64 scipy reference. GFLOP/s counts 2 per
nonzero.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends.timing import time_cpu, time_gpu, time_gpu_rounds, warm_device

logger = logging.getLogger(__name__)

__all__ = ["bench_spmv", "correlations", "markdown", "nnz_time_correlation", "report",
           "synthetic_matrices"]

_GRAPH_CALLS = 20  # calls per CUDA graph in the launch-free timings


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, or a driver without devices
        return False


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-300)
    return float(np.abs(got.astype(np.float64) - ref).max(initial=0.0) / scale)


def _graph_ms(fn: Any, repeats: int) -> float:
    """Milliseconds per call of ``fn`` replayed in a CUDA graph of ``_GRAPH_CALLS`` calls:
    the device's time for the work alone, with no launch from Python in between (what a
    solver looping on the device sees). NaN when ``fn`` cannot be captured."""
    import cupy

    from mgpu.backends.graph import Replay

    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()  # the operands were made on the default stream
    with stream:
        fn()
        stream.synchronize()
        try:
            replay = Replay(lambda: [fn() for _ in range(_GRAPH_CALLS)], stream)
        except Exception as exc:  # e.g. a peer whose call waits on the device
            logger.info("not captured as a CUDA graph: %s", exc)
            return math.nan
        return 1e3 * time_gpu(replay, repeats=repeats) / _GRAPH_CALLS


def _row_stats(A: sp.csr_matrix) -> dict[str, Any]:
    lengths = np.diff(A.indptr)
    return {
        "rows": int(A.shape[0]),
        "cols": int(A.shape[1]),
        "nnz": int(A.nnz),
        "empty_rows": int((lengths == 0).sum()),
        "max_row": int(lengths.max(initial=0)),
    }


def bench_spmv(matrices: Sequence[tuple[str, sp.spmatrix]], repeats: int = 10, *,
               device: str = "auto", seed: int = 0) -> list[dict[str, Any]]:
    """Time ``mgpu.spmv`` against the peer on each matrix, medians over ``repeats``.

    Parameters
    ----------
    matrices : sequence of (name, sparse matrix)
        Any scipy format; each is used as float32 CSR.
    repeats : int, default=10
        Timed calls per method (after warm-up calls); the median is reported. On the GPU
        the methods are timed in rounds, one call of each a round.
    device : {'auto', 'gpu', 'cpu'}, default='auto'
        'auto' runs on the GPU when one is visible, else on the CPU.
    seed : int, default=0
        Of the random vector x.

    Returns
    -------
    rows : list of dict
        One per matrix: ``name, device, rows, cols, nnz, empty_rows, max_row, mgpu_ms``
        (the public call: checks, kernels, the check flag read back), ``unchecked_ms`` (the
        public call with ``check_finite=False``, which checks what the peer checks: shapes
        and kinds, not values), ``kernels_ms`` (the merge-path kernels alone), ``peer,
        peer_ms, speedup`` (peer time / mgpu time, ``unchecked_speedup`` likewise),
        ``planned_ms`` (the public call with ``plan=mgpu.spmv_plan(A)``, made beforehand;
        ``compacted`` says whether the plan left the empty rows out of the merge), on the
        GPU ``graph_ms``, ``planned_graph_ms`` and ``peer_graph_ms`` (the unchecked call
        without and with the plan, and the peer, each per call of a CUDA graph of 20 calls:
        no launch cost; NaN on the CPU), ``mgpu_gflops, peer_gflops`` and ``rel_err`` (the
        largest error of the checked, unchecked and planned calls' results against a
        float64 reference).
    """
    if device not in ("auto", "gpu", "cpu"):
        raise ValueError("The 'device' parameter of bench_spmv must be a str among {'auto', "
                         f"'cpu', 'gpu'}}. Got {device!r} instead.")
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ValueError(f"The 'repeats' parameter of bench_spmv must be a positive integer. "
                         f"Got {repeats!r} instead.")
    on_gpu = _gpu_available() if device == "auto" else device == "gpu"
    import mgpu

    out = []
    for name, M in matrices:
        A = sp.csr_matrix(M, dtype=np.float32)
        A.sum_duplicates()
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(A.shape[1]).astype(np.float32)
        ref = A.astype(np.float64) @ x.astype(np.float64)
        row = {"name": name, **_row_stats(A)}
        if on_gpu:
            import cupy
            import cupyx.scipy.sparse as csp

            from mgpu.backends.cupy_spmv import spmv_merge as gpu_kernels

            Ag, xg = csp.csr_matrix(A), cupy.asarray(x)
            plan = mgpu.spmv_plan(Ag)
            got = mgpu.spmv(Ag, xg).get()
            same = mgpu.spmv(Ag, xg, check_finite=False).get()
            planned = mgpu.spmv(Ag, xg, plan=plan).get()
            warm_device()  # working clocks, not an idle GPU's, for every matrix
            # timed in rounds (one call of each a round): a stretch of the machine's state
            # (clocks, host load) falls on all of them alike, the peer included
            t = time_gpu_rounds({
                "mgpu": lambda: mgpu.spmv(Ag, xg),
                "unchecked": lambda: mgpu.spmv(Ag, xg, check_finite=False),
                "planned": lambda: mgpu.spmv(Ag, xg, plan=plan),
                "kernels": lambda: gpu_kernels(Ag, xg),
                "peer": lambda: Ag @ xg}, repeats=repeats)
            t_mgpu, t_unchecked, t_planned, t_kernels, t_peer = (
                t[k] for k in ("mgpu", "unchecked", "planned", "kernels", "peer"))
            row.update(device="gpu", peer="cuSPARSE (cupyx A @ x)",
                       graph_ms=_graph_ms(lambda: mgpu.spmv(Ag, xg, check_finite=False),
                                          repeats),
                       planned_graph_ms=_graph_ms(
                           lambda: mgpu.spmv(Ag, xg, check_finite=False, plan=plan), repeats),
                       peer_graph_ms=_graph_ms(lambda: Ag @ xg, repeats))
        else:
            from mgpu.backends.numpy_spmv import spmv_merge as cpu_kernels

            plan = mgpu.spmv_plan(A)
            got = mgpu.spmv(A, x)
            same = mgpu.spmv(A, x, check_finite=False)
            planned = mgpu.spmv(A, x, plan=plan)
            t_mgpu = time_cpu(lambda: mgpu.spmv(A, x), repeats=repeats)
            t_unchecked = time_cpu(lambda: mgpu.spmv(A, x, check_finite=False), repeats=repeats)
            t_planned = time_cpu(lambda: mgpu.spmv(A, x, plan=plan), repeats=repeats)
            t_kernels = time_cpu(lambda: cpu_kernels(A, x), repeats=repeats)
            t_peer = time_cpu(lambda: A @ x, repeats=repeats)
            row.update(device="cpu", peer="scipy A @ x", graph_ms=math.nan,
                       planned_graph_ms=math.nan, peer_graph_ms=math.nan)
        row.update(planned_ms=1e3 * t_planned, compacted=plan.compacted)
        flops = 2.0 * A.nnz
        row.update(
            mgpu_ms=1e3 * t_mgpu,
            unchecked_ms=1e3 * t_unchecked,
            kernels_ms=1e3 * t_kernels,
            peer_ms=1e3 * t_peer,
            speedup=t_peer / t_mgpu if t_mgpu > 0 else math.nan,
            unchecked_speedup=t_peer / t_unchecked if t_unchecked > 0 else math.nan,
            mgpu_gflops=flops / t_mgpu / 1e9 if t_mgpu > 0 else math.nan,
            peer_gflops=flops / t_peer / 1e9 if t_peer > 0 else math.nan,
            # every call's result
            rel_err=max(_rel_err(got, ref), _rel_err(same, ref), _rel_err(planned, ref)),
        )
        logger.info("spmv %s: mgpu %.3f ms, %s %.3f ms", name, row["mgpu_ms"], row["peer"],
                    row["peer_ms"])
        out.append(row)
    return out


def nnz_time_correlation(rows: Sequence[dict[str, Any]], key: str = "mgpu_ms", *,
                         merge_items: bool = False) -> float:
    """Pearson correlation coefficient between ``nnz`` (with ``merge_items``, nnz plus the
    rows: the merge path's items, which is what a merge-path SpMV's work is made of) and
    the time ``key`` over the rows.

    Near 1 says the time follows the nonzeros, as a load-balanced SpMV's should, whatever
    the row lengths; NaN with fewer than two rows or no spread.

    Examples
    --------
    >>> rows = [{"nnz": 10, "mgpu_ms": 1.0}, {"nnz": 20, "mgpu_ms": 2.0},
    ...         {"nnz": 40, "mgpu_ms": 4.1}]
    >>> round(nnz_time_correlation(rows), 4)
    0.9999
    """
    nnz = np.array([r["nnz"] + (r["rows"] if merge_items else 0) for r in rows],
                   dtype=np.float64)
    t = np.array([r[key] for r in rows], dtype=np.float64)
    if nnz.size < 2 or nnz.std() == 0 or t.std() == 0:
        return math.nan
    return float(np.corrcoef(nnz, t)[0, 1])


def markdown(rows: Sequence[dict[str, Any]], label: str = "") -> str:
    """The rows of :func:`bench_spmv` as a Markdown table, with the nnz-time correlations.

    Examples
    --------
    >>> print(markdown([{"name": "m", "device": "cpu", "rows": 2, "cols": 2, "nnz": 3,
    ...                  "empty_rows": 0, "max_row": 2, "mgpu_ms": 1.0, "unchecked_ms": 0.95,
    ...                  "kernels_ms": 0.9, "peer": "scipy A @ x", "peer_ms": 2.0,
    ...                  "speedup": 2.0, "unchecked_speedup": 2.1, "planned_ms": 0.8,
    ...                  "graph_ms": float("nan"), "planned_graph_ms": float("nan"),
    ...                  "peer_graph_ms": float("nan"), "rel_err": 0.0}]).splitlines()[2])
    | m | cpu | 2×2 | 3 | 0 | 2 | 1.000 | 0.950 | 0.900 | 0.800 | 2.000 | 2.00 | 2.10 | nan | nan | nan | 0.0e+00 |
    """
    head = ("| matrix | device | shape | nnz | empty rows | longest row | mgpu ms | unchecked ms "
            "| kernels ms | planned ms | peer ms | speedup | unchecked speedup | graph ms "
            "| planned graph ms | peer graph ms | rel. error |")
    lines = ([f"**{label}**", ""] if label else []) + [head, "|" + "---|" * 17]
    nan = math.nan
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['device']} | {r['rows']}×{r['cols']} | {r['nnz']} | "
            f"{r['empty_rows']} | {r['max_row']} | {r['mgpu_ms']:.3f} | "
            f"{r.get('unchecked_ms', nan):.3f} | {r.get('kernels_ms', nan):.3f} | "
            f"{r.get('planned_ms', nan):.3f} | "
            f"{r['peer_ms']:.3f} | {r['speedup']:.2f} | {r.get('unchecked_speedup', nan):.2f} | "
            f"{r.get('graph_ms', nan):.4f} | {r.get('planned_graph_ms', nan):.4f} | "
            f"{r.get('peer_graph_ms', nan):.4f} | {r['rel_err']:.1e} |"
        )
    if rows:
        lines += ["", f"Peer: {rows[0]['peer']}. " + correlations(rows)]
    return "\n".join(lines)


def correlations(rows: Sequence[dict[str, Any]]) -> str:
    """Two sentences: the correlation of each timing with nnz over ``rows``, and of the
    launch-free one with the merge's items (nnz + rows)."""
    def r(key: str) -> str:
        return f"{nnz_time_correlation(rows, key):.3f}"

    return (f"Correlation of time with nnz over {len(rows)} matrices: mgpu {r('mgpu_ms')} "
            f"(unchecked {r('unchecked_ms')}, kernels alone {r('kernels_ms')}, with a plan "
            f"{r('planned_ms')}, in a CUDA graph {r('graph_ms')}, with a plan in a CUDA graph "
            f"{r('planned_graph_ms')}), peer {r('peer_ms')} (in a CUDA graph "
            f"{r('peer_graph_ms')}). "
            "With nnz + rows (the merge's items): in a CUDA graph "
            f"{nnz_time_correlation(rows, 'graph_ms', merge_items=True):.3f}, peer "
            f"{nnz_time_correlation(rows, 'peer_ms', merge_items=True):.3f}.")


def synthetic_matrices(powerlaw: Sequence[tuple[int, int, int, tuple[float, ...]]] = (),
                       banded: Sequence[tuple[int, int]] = ()
                       ) -> list[tuple[str, sp.csr_matrix]]:
    """The synthetic matrices of a run, labelled: power-law ones given as ``(rows, cols, nnz,
    exponents)`` (the row and column degree exponents; missing ones are 0.6 and 0.8) and
    bands given as ``(n, width)``.

    Examples
    --------
    >>> [(name, A.nnz) for name, A in synthetic_matrices(banded=[(5, 3)])]
    [('band 5x3', 13)]
    """
    from mgpu.synthetic import band_csr, powerlaw_csr

    mats = []
    for m, n, nnz, exps in powerlaw:
        if len(exps) > 2:
            raise ValueError(f"a power-law matrix takes at most two exponents (rows, columns). "
                             f"Got {len(exps)}.")
        rexp, cexp = [float(e) for e in exps] + [0.6, 0.8][len(exps):]
        label = f"power-law {m:,}x{n:,}" + (f" ({rexp:g}/{cexp:g})" if exps else "")
        mats.append((label, powerlaw_csr(m, n, nnz, row_exponent=rexp, col_exponent=cexp,
                                         seed=0)))
    for n, width in banded:
        mats.append((f"band {n:,}x{width}", band_csr(n, width)))
    return mats


def report(rows: Sequence[dict[str, Any]], n_files: int = 0) -> tuple[str, float]:
    """The table of a run (:func:`markdown`) with, where some matrices came from files
    (the first ``n_files`` rows) and some not, the correlations over the files alone; and the
    correlation of mgpu's time with nnz over every row."""
    text = markdown(rows)
    files = rows[:n_files]
    if 1 < len(files) < len(rows):
        text += f"\nThe {len(files)} matrices from files alone: {correlations(files)}"
    return text, nnz_time_correlation(rows)
