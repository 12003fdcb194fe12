"""``mgpu bench spgemm``: mgpu's SpGEMM against its peers on the same operands, in one run.

Each input A is multiplied by itself (A·A) or by its transpose (A·Aᵀ), see
:func:`choose_form`. GPU peers: cupyx ``A @ B`` (cuSPARSE's SpGEMM) and, where torch is
installed with CUDA, ``A @ B`` of torch CSR tensors. CPU peer: scipy ``A @ B``. Every
method gets the same CSR operands in one dtype.

A peer is called once before any timing: one that raises (out of memory, cuSPARSE's
``CUSPARSE_STATUS_INSUFFICIENT_RESOURCES``, ...) is recorded as failed with the first line
of its error and left out of the timing, and one whose result differs from mgpu's (cuSPARSE
has been seen to return all zeros, CuPy issue #10033) is recorded as a wrong result, its
time shown but never counted as a win. mgpu's own result is checked against a float64
scipy product where that is affordable. GFLOP/s counts 2 per intermediate product (a
nonzero of A times a nonzero of the row of B it picks).
"""
from __future__ import annotations

import contextlib
import logging
import math
import statistics
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends.arrays import array_module
from mgpu.backends.timing import time_cpu, time_gpu_rounds, warm_device
from mgpu.bench.spmv import _gpu_available

logger = logging.getLogger(__name__)

__all__ = ["FORMS", "PEERS", "bench_spgemm", "choose_form", "csr_difference", "markdown",
           "products", "progress_line", "summarize"]

FORMS = {"AA": "A·A", "AAt": "A·Aᵀ"}
"""The products a run takes of each input, by the name ``--form`` gives them."""

PEERS = {"cusparse": ("cuSPARSE", "cupyx A @ B (cuSPARSE's SpGEMM)"),
         "torch": ("torch", "A @ B of torch CSR tensors"),
         "scipy": ("scipy", "scipy A @ B")}
"""Every peer, by its key in a row's ``peers``: its name in tables and what it calls."""

# The float64 scipy reference is computed up to this many intermediate products (seconds
# on one core, C at most 2.4 GB); past it mgpu's result is not checked against it.
CHECK_PRODUCTS = 2e8

# A peer's result differs from mgpu's past this error relative to C's largest value: far
# above the rounding of sums in another order, far below what a wrong result gives (1 for
# all zeros).
_WRONG = {np.dtype(np.float32): 1e-3, np.dtype(np.float64): 1e-9}

_CHUNK = 1 << 25  # entries compared at a time where two results store one pattern alike


def choose_form(form: str, shape: tuple[int, int], name: str) -> str:
    """The product taken of the input ``name`` of ``shape``: ``'AA'`` or ``'AAt'``.

    ``'auto'`` gives A·A where A is square and ``name`` is a Matrix Market file (ends in
    ``.mtx`` or ``.mtx.gz``): a matrix, whose square is what solvers (multigrid's Galerkin
    product, matrix powers) take. Otherwise A·Aᵀ: graphs, corpora and power-law matrices,
    whose A·Aᵀ counts shared neighbours or terms (co-occurrence, similarity joins), and
    any matrix that is not square.

    Examples
    --------
    >>> choose_form("auto", (5, 5), "bcsstk13.mtx.gz"), choose_form("auto", (5, 5), "g.txt")
    ('AA', 'AAt')
    >>> choose_form("auto", (5, 3), "m.mtx")
    'AAt'
    """
    if form not in ("auto", *FORMS):
        raise ValueError("The 'form' parameter of bench_spgemm must be a str among {'AA', "
                         f"'AAt', 'auto'}}. Got {form!r} instead.")
    square = shape[0] == shape[1]
    if form == "AA" and not square:
        raise ValueError(f"The 'form' parameter of bench_spgemm is 'AA', which needs square "
                         f"matrices, but {name} is {shape[0]}×{shape[1]}. Pass 'AAt' or "
                         "'auto' (A·A of square Matrix Market files, A·Aᵀ of the rest).")
    if form != "auto":
        return form
    return "AA" if square and name.lower().endswith((".mtx", ".mtx.gz")) else "AAt"


def products(A: Any, B: Any) -> int:
    """The intermediate products of A @ B: over A's nonzeros, the length of the row of B
    each picks (half the flops of the product). CSR operands, numpy or cupy arrays.

    Examples
    --------
    >>> A = sp.csr_matrix(np.array([[1.0, 1.0], [0.0, 1.0]]))
    >>> products(A, A)  # row 0 picks rows 0 and 1 of A (2 + 1), row 1 picks row 1 (1)
    4
    """
    lengths = B.indptr[1:] - B.indptr[:-1]
    return int(lengths[A.indices[:A.nnz]].sum(dtype=np.int64))


# ------------------------------------------------------------------ checking results

def _entries(parts: tuple[Any, Any, Any], n_cols: int, xp: Any) -> tuple[Any, Any]:
    """The nonzero entries of a CSR given as (indptr, indices, data): their keys (row ·
    n_cols + column, int64, increasing) and float64 values, duplicates added up."""
    indptr, indices, data = parts
    nnz = int(indptr[-1])
    rows = xp.searchsorted(indptr[1:], xp.arange(nnz, dtype=indptr.dtype), side="right")
    keys = rows.astype(xp.int64) * n_cols + indices[:nnz].astype(xp.int64)
    values = data[:nnz].astype(xp.float64)
    if keys.size > 1 and not bool((keys[1:] > keys[:-1]).all()):  # unsorted or duplicates
        keys, inverse = xp.unique(keys, return_inverse=True)
        values = xp.bincount(inverse.ravel(), weights=values, minlength=keys.size)
    keep = values != 0
    return keys[keep], values[keep]


def _amax(x: Any) -> float:
    return float(x.max()) if x.size else 0.0


def _worst(values: list[float]) -> float:
    """The largest of ``values``, NaN where one is NaN (Python's max keeps or drops a NaN
    by its place)."""
    return float(np.max(np.asarray(values, dtype=np.float64))) if values else 0.0


def csr_difference(ref: tuple[Any, Any, Any], got: tuple[Any, Any, Any], n_cols: int
                   ) -> tuple[float, bool]:
    """How far the CSR ``got`` is from ``ref``, both given as (indptr, indices, data) with
    ``n_cols`` columns, numpy or cupy arrays (either's indices in any order, duplicates
    added up, stored zeros ignored).

    Where both store one pattern alike (the common case) the values are compared in
    chunks, at little memory beyond the two results; otherwise both are sorted by (row,
    column), which takes about 25 bytes an entry of each.

    Returns
    -------
    rel_err : float
        The largest difference over the union of their nonzero patterns (an entry present
        in one only counts whole), relative to ref's largest value; NaN where ``got``
        holds NaN, 1 for an all-zero ``got`` of a nonzero ``ref``.
    same_pattern : bool
        Whether their nonzero entries sit at the same positions.

    Examples
    --------
    >>> ref = sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 4.0]]))
    >>> parts = lambda M: (M.indptr, M.indices, M.data)
    >>> csr_difference(parts(ref), parts(ref * 1.5), 2)
    (0.5, True)
    >>> csr_difference(parts(ref), parts(sp.csr_matrix((2, 2))), 2)
    (1.0, False)
    """
    xp = array_module(ref[0])
    nr, ng = int(ref[0][-1]), int(got[0][-1])
    rdata, gdata = ref[2][:nr], got[2][:ng]
    scale = max(_worst([_amax(xp.abs(rdata[s:s + _CHUNK])) for s in range(0, nr, _CHUNK)]),
                1e-300)
    if not bool((gdata != 0).any()):  # nothing (cuSPARSE's all zeros): no need to line up
        return (1.0, False) if bool((rdata != 0).any()) else (0.0, True)
    if (ref[0].shape == got[0].shape and bool(xp.array_equal(ref[0], got[0]))
            and bool(xp.array_equal(ref[1][:nr], got[1][:ng]))):
        errs, same = [], True
        for s in range(0, nr, _CHUNK):
            rv = rdata[s:s + _CHUNK].astype(xp.float64)
            gv = gdata[s:s + _CHUNK].astype(xp.float64)
            errs.append(_amax(xp.abs(gv - rv)))
            same = same and bool(xp.array_equal(gv != 0, rv != 0))
        return _worst(errs) / scale, same
    rk, rv = _entries(ref, n_cols, xp)
    gk, gv = _entries(got, n_cols, xp)
    if rk.size == 0:
        return _amax(xp.abs(gv)) / scale, gk.size == 0
    at = xp.minimum(xp.searchsorted(rk, gk), rk.size - 1)
    found = rk[at] == gk
    hit = xp.zeros(rk.size, dtype=bool)
    hit[at[found]] = True
    err = _worst([_amax(xp.abs(gv[found] - rv[at[found]])), _amax(xp.abs(gv[~found])),
                  _amax(xp.abs(rv[~hit]))])
    return err / scale, bool(found.all()) and bool(hit.all())


def _parts(M: Any) -> tuple[Any, Any, Any]:
    return M.indptr, M.indices, M.data


def _first_line(exc: BaseException) -> str:
    """The error's kind and the first line of its message, for a table cell."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _peer(key: str) -> dict[str, Any]:
    return {"label": PEERS[key][0], "status": "ok", "error": None, "ms": None, "gflops": None,
            "ratio": None, "rel_err": None, "same_pattern": None, "peak_bytes": None}


def _check(entry: dict[str, Any], C: tuple[Any, Any, Any], got: tuple[Any, Any, Any],
           n_cols: int, dtype: np.dtype) -> None:
    """A peer's result against mgpu's C: its entry's status, error and pattern."""
    try:
        err, same = csr_difference(C, got, n_cols)
    except MemoryError as exc:  # the check's own arrays (sorted keys) did not fit
        entry.update(status="not checked", error=_first_line(exc))
        return
    entry.update(rel_err=err, same_pattern=same)
    if not err <= _WRONG[dtype]:  # NaN included
        entry["status"] = "wrong result"


# ------------------------------------------------------------------ the two devices

def _numba_threads() -> int | None:
    try:
        import numba
    except ImportError:
        return None
    return int(numba.get_num_threads())


def _scipy_product(A: sp.csr_matrix, B: sp.csr_matrix) -> sp.csr_matrix:
    """The CPU peer's call."""
    return A @ B


def _cpu_run(A: sp.csr_matrix, B: sp.csr_matrix, repeats: int, row: dict[str, Any],
             check: Callable[[Any], None]) -> dict[str, float]:
    """mgpu and scipy on the host: their times in seconds; the row's checks filled in."""
    import mgpu

    row["threads"] = _numba_threads()
    try:
        C = mgpu.spgemm(A, B)
    except MemoryError as exc:
        row["mgpu_error"] = _first_line(exc)
        return {}
    row["nnz_c"] = int(C.nnz)
    check(C)
    fns = {"mgpu": lambda: mgpu.spgemm(A, B)}
    entry = row["peers"]["scipy"] = _peer("scipy")
    try:
        out = _scipy_product(A, B)
    except Exception as exc:  # a peer's failure is a result, not the end of the run
        entry.update(status="failed", error=_first_line(exc))
    else:
        _check(entry, _parts(C), _parts(out), B.shape[1], A.dtype)
        del out
        fns["scipy"] = lambda: _scipy_product(A, B)
    return {key: time_cpu(fn, repeats=repeats) for key, fn in fns.items()}


class _PeakAllocator:
    """CuPy's allocations through a fresh memory pool, with the most bytes they held at
    once (CuPy pools count what they hold now, not what they held at most)."""

    def __init__(self) -> None:
        import cupy

        self.pool = cupy.cuda.MemoryPool()
        self.peak = 0

    def malloc(self, size: int) -> Any:
        mem = self.pool.malloc(size)
        self.peak = max(self.peak, self.pool.used_bytes())
        return mem


def _cupy_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """fn()'s result and the peak of the device memory its CuPy allocations held: cupyx's
    cuSPARSE buffers and mgpu's scratch alike, the operands (made before) not included."""
    import cupy

    # mgpu sizes its scratch to the device's free memory plus the default pool's cached
    # blocks, which the fresh pool cannot use: give those back first
    cupy.get_default_memory_pool().free_all_blocks()
    alloc = _PeakAllocator()
    with cupy.cuda.using_allocator(alloc.malloc):
        out = fn()
        cupy.cuda.get_current_stream().synchronize()
    alloc.pool.free_all_blocks()  # the scratch; the result's blocks stay with it
    return out, alloc.peak


def _torch_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """fn()'s result and the peak of torch's device memory above what it held before."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, int(torch.cuda.max_memory_allocated() - before)


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """torch warns that its sparse CSR support is in beta (and about invariant checks);
    those are no news to a benchmark, and a warning is an error under pytest."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*sparse (csr|bsr).*beta",
                                category=UserWarning)
        warnings.filterwarnings("ignore", message=r".*invariant", category=UserWarning)
        yield


def _torch() -> Any:
    """torch where it is installed with CUDA, else None (no torch peer)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _torch_csr(torch: Any, M: Any) -> Any:
    """A torch CSR tensor of a cupyx CSR: int64 indices (copies), the values shared."""
    return torch.sparse_csr_tensor(torch.as_tensor(M.indptr, dtype=torch.int64, device="cuda"),
                                   torch.as_tensor(M.indices, dtype=torch.int64,
                                                   device="cuda"),
                                   torch.as_tensor(M.data, device="cuda"), size=M.shape)


def _gpu_peers(Ag: Any, Bg: Any, row: dict[str, Any]) -> dict[str, tuple]:
    """The GPU peers as key -> (call, peak measure, result as (indptr, indices, data))."""
    import cupy

    peers = {"cusparse": (lambda: Ag @ Bg, _cupy_peak, _parts)}
    torch = _torch()
    if torch is not None:
        try:
            At = _torch_csr(torch, Ag)
            Bt = At if Bg is Ag else _torch_csr(torch, Bg)
        except Exception as exc:  # e.g. no room for the int64 indices
            row["peers"]["torch"] = dict(_peer("torch"), status="failed",
                                         error=_first_line(exc))
        else:
            peers["torch"] = (lambda: At @ Bt, _torch_peak, lambda C: (
                cupy.from_dlpack(C.crow_indices()), cupy.from_dlpack(C.col_indices()),
                cupy.from_dlpack(C.values())))
    return peers


def _gpu_times(fns: dict[str, Callable[[], Any]], repeats: int, row: dict[str, Any]
               ) -> dict[str, float]:
    """time_gpu_rounds of ``fns``; where a call fails while timed (its trial call did not),
    each is timed alone and a peer that fails is recorded as failed."""
    warm_device()  # working clocks, not an idle GPU's, for every input
    try:
        return time_gpu_rounds(fns, repeats=repeats)
    except Exception:
        logger.info("a timed SpGEMM call failed; timing each method alone", exc_info=True)
    times = {}
    for key, fn in fns.items():
        try:
            times.update(time_gpu_rounds({key: fn}, repeats=repeats))
        except Exception as exc:
            if key == "mgpu":
                raise
            row["peers"][key].update(status="failed", error=_first_line(exc))
    return times


def _gpu_run(A: sp.csr_matrix, B: sp.csr_matrix, repeats: int, row: dict[str, Any],
             check: Callable[[Any], None]) -> dict[str, float]:
    """mgpu and the GPU peers, each tried once (peak memory, checked against mgpu's C),
    then timed in rounds: their times in seconds; the row's checks filled in."""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu

    row["device_name"] = cupy.cuda.runtime.getDeviceProperties(
        cupy.cuda.Device().id)["name"].decode()
    Ag = csp.csr_matrix(A)
    Bg = Ag if B is A else csp.csr_matrix(B)
    try:
        C, row["mgpu_peak_bytes"] = _cupy_peak(lambda: mgpu.spgemm(Ag, Bg))
    except MemoryError as exc:  # DeviceMemoryError (C does not fit), CuPy's out of memory
        row["mgpu_error"] = _first_line(exc)
        return {}
    row["nnz_c"] = int(C.nnz)
    check(C.get() if row["checked"] else None)
    fns = {"mgpu": lambda: mgpu.spgemm(Ag, Bg)}
    with _quiet_torch():
        for key, (call, peak, parts) in _gpu_peers(Ag, Bg, row).items():
            entry = row["peers"][key] = _peer(key)
            try:
                out, entry["peak_bytes"] = peak(call)
                got = parts(out)
            except Exception as exc:  # a peer's failure is a result, not the end of the run
                entry.update(status="failed", error=_first_line(exc))
                continue
            _check(entry, _parts(C), got, B.shape[1], A.dtype)
            del out, got
            fns[key] = call
        del C
        times = _gpu_times(fns, repeats, row)
    cupy.get_default_memory_pool().free_all_blocks()  # room for the next input's peers
    torch = _torch()
    if torch is not None:
        torch.cuda.empty_cache()
    return times


# ------------------------------------------------------------------ the run

def bench_spgemm(matrices: Sequence[tuple[str, sp.spmatrix]], repeats: int = 5, *,
                 form: str = "auto", device: str = "auto", dtype: Any = "float32",
                 progress: Callable[[str], Any] | None = None) -> list[dict[str, Any]]:
    """Time ``mgpu.spgemm`` against its peers on each input, medians over ``repeats``.

    Parameters
    ----------
    matrices : sequence of (name, sparse matrix)
        Any scipy format; each is used as CSR of ``dtype`` without duplicates. A name
        ending in ``.mtx`` or ``.mtx.gz`` is a Matrix Market file (see :func:`choose_form`).
    repeats : int, default=5
        Timed calls per method (after a warm-up call); the median is reported. On the GPU
        the methods are timed in rounds, one call of each a round.
    form : {'auto', 'AA', 'AAt'}, default='auto'
        The product taken of each input A: A·A, A·Aᵀ, or (auto) A·A of a square Matrix
        Market file and A·Aᵀ of the rest.
    device : {'auto', 'gpu', 'cpu'}, default='auto'
        'auto' runs on the GPU when one is visible, else on the CPU.
    dtype : {'float32', 'float64'}, default='float32'
        Of the operands' values.
    progress : callable, optional
        Called with a line (:func:`progress_line`) as each input is done.

    Returns
    -------
    rows : list of dict
        One per input: ``name, form ('AA' or 'AAt'), device ('cpu' or 'gpu'), device_name
        (the GPU's), dtype, shape_a, shape_b, nnz_a, nnz_b, products, nnz_c, threads``
        (numba's, on the CPU), ``checked`` (whether the float64 scipy reference was made:
        up to ``CHECK_PRODUCTS`` products), ``rel_err`` (the largest error of mgpu's C over
        the union of both patterns relative to the reference's largest value, None where
        not checked), ``mgpu_ms, mgpu_gflops, mgpu_peak_bytes`` (on the GPU, the most
        device memory the call held, its result included), ``mgpu_error`` (the first line
        of a memory error that stopped mgpu on this input, else None; no peer then runs),
        and ``peers``: per key of :data:`PEERS` that ran, ``label, status`` ('ok',
        'failed', 'wrong result', or 'not checked' where the comparison itself ran out of
        memory), ``error, ms, gflops, ratio`` (peer ms / mgpu ms; None for a wrong or
        failed peer), ``rel_err, same_pattern`` (its result against mgpu's, as
        :func:`csr_difference`) and ``peak_bytes`` (GPU).

    Raises
    ------
    ValueError
        A parameter out of its range, ``form='AA'`` with an input that is not square, or
        ``device='gpu'`` where no GPU is visible; before any input runs.
    """
    func = "bench_spgemm"
    if device not in ("auto", "gpu", "cpu"):
        raise ValueError(f"The 'device' parameter of {func} must be a str among {{'auto', "
                         f"'cpu', 'gpu'}}. Got {device!r} instead.")
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ValueError(f"The 'repeats' parameter of {func} must be a positive integer. "
                         f"Got {repeats!r} instead.")
    try:
        dt = None if dtype is None else np.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt not in _WRONG:
        raise ValueError(f"The 'dtype' parameter of {func} must be a str among {{'float32', "
                         f"'float64'}}. Got {dtype!r} instead.")
    forms = [choose_form(form, M.shape, name) for name, M in matrices]  # all before any run
    on_gpu = device == "gpu" or (device == "auto" and _gpu_available())
    if device == "gpu" and not _gpu_available():
        raise ValueError(f"The 'device' parameter of {func} is 'gpu', but no GPU is visible "
                         "(CuPy is missing or finds none). Pass 'cpu' or 'auto'.")
    out = []
    for (name, M), how in zip(matrices, forms):
        row = _run_one(name, M, how, dt, repeats, on_gpu)
        logger.info("%s", progress_line(row))
        if progress is not None:
            progress(progress_line(row))
        out.append(row)
    return out


def _run_one(name: str, M: sp.spmatrix, form: str, dt: np.dtype, repeats: int,
             on_gpu: bool) -> dict[str, Any]:
    A = sp.csr_matrix(M, dtype=dt)
    A.sum_duplicates()
    B = A if form == "AA" else A.T.tocsr()
    flops = products(A, B)
    row: dict[str, Any] = {
        "name": name, "form": form, "device": "gpu" if on_gpu else "cpu", "device_name": None,
        "dtype": dt.name, "shape_a": list(A.shape), "shape_b": list(B.shape),
        "nnz_a": int(A.nnz), "nnz_b": int(B.nnz), "products": flops, "nnz_c": None,
        "threads": None, "checked": flops <= CHECK_PRODUCTS, "rel_err": None,
        "mgpu_ms": None, "mgpu_gflops": None, "mgpu_peak_bytes": None, "mgpu_error": None,
        "peers": {}}
    # the float64 reference is made, and mgpu's result checked against it, before any timing
    ref = None
    if row["checked"]:
        A64 = A.astype(np.float64)
        ref = A64 @ (A64 if B is A else B.astype(np.float64))

    def check(C: Any) -> None:
        if ref is not None:
            row["rel_err"] = csr_difference(_parts(ref), _parts(C), B.shape[1])[0]

    times = (_gpu_run if on_gpu else _cpu_run)(A, B, repeats, row, check)
    if "mgpu" in times:
        t = times["mgpu"]
        row.update(mgpu_ms=1e3 * t, mgpu_gflops=_gflops(flops, t))
    for key, entry in row["peers"].items():
        if key in times and entry["status"] != "failed":
            t = times[key]
            entry.update(ms=1e3 * t, gflops=_gflops(flops, t))
            if entry["status"] != "wrong result" and times["mgpu"] > 0:
                entry["ratio"] = t / times["mgpu"]
    return row


def _gflops(flops: int, seconds: float) -> float | None:
    return 2.0 * flops / seconds / 1e9 if seconds > 0 else None


# ------------------------------------------------------------------ reports

def progress_line(row: dict[str, Any]) -> str:
    """One line on an input that is done: its form, mgpu's time and each peer's.

    Examples
    --------
    >>> print(progress_line({"name": "m.mtx", "form": "AA", "products": 10, "nnz_c": 4,
    ...     "mgpu_ms": 2.0, "mgpu_gflops": 1e-5, "mgpu_error": None, "peers": {
    ...     "scipy": {"label": "scipy", "status": "ok", "ms": 3.0, "ratio": 1.5,
    ...               "error": None}}}))
    m.mtx, A·A: 10 products, nnz(C) 4; mgpu 2.000 ms; scipy 3.000 ms (ratio 1.50)
    """
    head = f"{row['name']}, {FORMS[row['form']]}: {row['products']:,} products"
    if row["mgpu_error"]:
        return f"{head}; mgpu failed: {row['mgpu_error']}"
    parts = [f"{head}, nnz(C) {row['nnz_c']:,}", f"mgpu {row['mgpu_ms']:.3f} ms"]
    for entry in row["peers"].values():
        parts.append(f"{entry['label']} {_peer_state(entry)}")
    return "; ".join(parts)


def _peer_state(entry: dict[str, Any]) -> str:
    if entry["status"] == "failed":
        return f"failed ({entry['error']})"
    text = f"{entry['ms']:.3f} ms"
    if entry["status"] == "wrong result":
        return f"{text}, wrong result (rel. error {entry['rel_err']:.1e})"
    text += f" (ratio {entry['ratio']:.2f})" if entry["ratio"] is not None else ""
    return text + (", not checked" if entry["status"] == "not checked" else "")


def _peer_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    present = {key for r in rows for key in r["peers"]}
    return [key for key in PEERS if key in present]


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per peer, the median ratio (peer ms / mgpu ms; above 1: mgpu faster) over the inputs
    where it ran and its result was not found wrong, the least ratio and its input; and
    every input where mgpu or a peer failed, or a peer's result was wrong or not checked.

    Examples
    --------
    >>> ok = {"label": "scipy", "status": "ok", "ratio": 2.0, "error": None}
    >>> rows = [{"name": "a", "mgpu_error": None, "peers": {"scipy": ok}},
    ...         {"name": "b", "mgpu_error": None, "peers": {"scipy": dict(ok, ratio=0.5)}}]
    >>> summarize(rows)["peers"]["scipy"]
    {'label': 'scipy', 'inputs': 2, 'median_ratio': 1.25, 'least_ratio': 0.5, 'least_on': 'b'}
    """
    peers = {}
    for key in _peer_keys(rows):
        wins = [(r["peers"][key]["ratio"], r["name"]) for r in rows
                if key in r["peers"] and r["peers"][key]["ratio"] is not None]
        least = min(wins) if wins else (None, None)
        peers[key] = {"label": PEERS[key][0], "inputs": len(wins),
                      "median_ratio": statistics.median(w for w, _ in wins) if wins else None,
                      "least_ratio": least[0], "least_on": least[1]}
    trouble = [{"name": r["name"], "method": "mgpu", "status": "failed",
                "error": r["mgpu_error"]} for r in rows if r["mgpu_error"]]
    trouble += [{"name": r["name"], "method": key, "status": e["status"],
                 "error": e["error"], "rel_err": e["rel_err"]}
                for r in rows for key, e in r["peers"].items() if e["status"] != "ok"]
    return {"peers": peers, "trouble": trouble}


def _summary_text(rows: Sequence[dict[str, Any]]) -> str:
    s = summarize(rows)
    lines = []
    for p in s["peers"].values():
        if p["inputs"]:
            lines.append(f"{p['label']}: median ratio {p['median_ratio']:.2f} over "
                         f"{p['inputs']} input(s), least {p['least_ratio']:.2f} on "
                         f"{p['least_on']}.")
        else:
            lines.append(f"{p['label']}: no input where it ran and was not found wrong.")
    if s["trouble"]:
        def what(t: dict[str, Any]) -> str:
            label = "mgpu" if t["method"] == "mgpu" else PEERS[t["method"]][0]
            why = t["error"] if t["status"] != "wrong result" else \
                f"rel. error {t['rel_err']:.1e}"
            return f"{label} on {t['name']} ({t['status']}: {why})"

        lines.append("Failed, wrong or not checked: " + "; ".join(map(what, s["trouble"]))
                     + ".")
    else:
        lines.append("No peer failed or returned a wrong result.")
    threads = {r["threads"] for r in rows if r["threads"] is not None}
    if threads:
        lines.append(f"CPU run with {', '.join(map(str, sorted(threads)))} numba thread(s).")
    calls = "; ".join(f"{PEERS[k][0]} is {PEERS[k][1]}" for k in _peer_keys(rows))
    return (f"Peers: {calls}. Ratio: peer ms / mgpu ms, above 1 where mgpu is faster. "
            + " ".join(lines))


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, spec)


def _peer_cells(entry: dict[str, Any] | None) -> list[str]:
    if entry is None:
        return ["–", "–", "–"]
    if entry["status"] == "failed":
        return ["failed", "–", "–"]
    ms = _fmt(entry["ms"], ".3f")
    if entry["status"] != "ok":
        ms += " (wrong)" if entry["status"] == "wrong result" else " (not checked)"
    gflops = "–" if entry["status"] == "wrong result" else _fmt(entry["gflops"], ".2f")
    return [ms, gflops, _fmt(entry["ratio"], ".2f")]


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of :func:`bench_spgemm` as a Markdown table, then the summary
    (:func:`summarize`) in a paragraph."""
    from dask.utils import format_bytes

    peers = _peer_keys(rows)
    gpu = any(r["device"] == "gpu" for r in rows)
    head = ["input", "form", "A", "nnz(A)", "nnz(B)", "products", "nnz(C)", "mgpu ms",
            "mgpu GFLOP/s"]
    for key in peers:
        head += [f"{PEERS[key][0]} {what}" for what in ("ms", "GFLOP/s", "ratio")]
    head.append("rel. error")
    if gpu:
        head += ["mgpu peak"] + [f"{PEERS[key][0]} peak" for key in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], FORMS[r["form"]], f"{r['shape_a'][0]}×{r['shape_a'][1]}",
                 f"{r['nnz_a']:,}", f"{r['nnz_b']:,}", f"{r['products']:,}",
                 _fmt(r["nnz_c"], ","),
                 "failed" if r["mgpu_error"] else _fmt(r["mgpu_ms"], ".3f"),
                 _fmt(r["mgpu_gflops"], ".2f")]
        for key in peers:
            cells += _peer_cells(r["peers"].get(key))
        cells.append(_fmt(r["rel_err"], ".1e") if r["checked"] else "not checked")
        if gpu:
            peaks = [r["mgpu_peak_bytes"]] + [r["peers"].get(k, {}).get("peak_bytes")
                                              for k in peers]
            cells += ["–" if p is None else format_bytes(p) for p in peaks]
        lines.append("| " + " | ".join(cells) + " |")
    if rows:
        lines += ["", _summary_text(rows)]
    return "\n".join(lines)
