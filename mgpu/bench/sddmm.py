"""``mgpu bench sddmm``: mgpu against its peers on the same matrices, in one run.

GPU peers: cuSPARSE's SDDMM through ``torch.sparse.sampled_addmm`` and a plain CuPy
gather-dot (the one in the peer-timing scripts). CPU peer: a numpy gather-dot. All compute
the plain sampled product (A Bᵀ on S's pattern, no scaling by S's values), which is what
cuSPARSE's SDDMM computes. GFLOP/s counts 2·K per nonzero.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends.timing import time_cpu, time_gpu, time_gpu_rounds, warm_device
from mgpu.bench.partition import PARTITION_SETS

logger = logging.getLogger(__name__)

_CHECK_SAMPLE = 200_000

# Real matrices the SDDMM benchmark runs on, relative to the data folder: every sparse
# matrix of the data folder, as the partition benchmark reads them.
SDDMM_SETS = PARTITION_SETS


def _factors(S: sp.csr_matrix, K: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((S.shape[0], K), dtype=np.float32)
    B = rng.standard_normal((S.shape[1], K), dtype=np.float32)
    return A, B


def _sample_error(S: sp.csr_matrix, A: np.ndarray, B: np.ndarray, values: np.ndarray,
                  seed: int, hadamard: bool = False) -> float:
    """Largest error on a sample of nonzeros, relative to the largest reference value
    (the sampled product, times S's values with ``hadamard``)."""
    rng = np.random.default_rng(seed)
    idx = rng.choice(S.nnz, size=min(S.nnz, _CHECK_SAMPLE), replace=False) if S.nnz else []
    idx = np.sort(np.asarray(idx, dtype=np.int64))
    rows = np.searchsorted(S.indptr, idx, side="right") - 1
    ref = np.einsum("ik,ik->i", A[rows].astype(np.float64), B[S.indices[idx]].astype(np.float64))
    if hadamard:
        ref *= S.data[idx]
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-300)
    return float(np.abs(values[idx].astype(np.float64) - ref).max(initial=0.0) / scale)


def _numpy_gather_dot(S: sp.csr_matrix, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    out = np.empty(S.nnz, dtype=A.dtype)
    step = max(1, (1 << 26) // (A.shape[1] * 4))
    for s in range(0, S.nnz, step):
        out[s:s + step] = np.einsum("ik,ik->i", A[rows[s:s + step]], B[S.indices[s:s + step]])
    return out


def bench_cpu(S: sp.csr_matrix, Ks: tuple[int, ...], repeats: int = 3) -> list[dict[str, Any]]:
    """mgpu's CPU kernel against a numpy gather-dot, per K."""
    import mgpu

    out = []
    for K in Ks:
        A, B = _factors(S, K, K)
        P = mgpu.sddmm(S, A, B, hadamard=False)
        err = _sample_error(S, A, B, P.data, K)
        t_mgpu = time_cpu(lambda: mgpu.sddmm(S, A, B, hadamard=False), repeats=repeats)
        t_np = time_cpu(lambda: _numpy_gather_dot(S, A, B), repeats=repeats)
        flop = 2.0 * K * S.nnz
        out.append({"K": K, "nnz": int(S.nnz), "device": "cpu", "max_rel_err": err,
                    "mgpu_s": t_mgpu, "numpy_gather_dot_s": t_np,
                    "mgpu_gflops": flop / t_mgpu / 1e9, "numpy_gather_dot_gflops": flop / t_np / 1e9,
                    "speedup_vs_numpy": t_np / t_mgpu})
    return out


def bench_gpu(S: sp.csr_matrix, Ks: tuple[int, ...], repeats: int = 10) -> list[dict[str, Any]]:
    """mgpu's GPU kernel against cuSPARSE (torch) and a CuPy gather-dot, per K."""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu

    Sg = csp.csr_matrix(S.astype(np.float32))
    rows = cupy.repeat(cupy.arange(S.shape[0], dtype=cupy.int32),
                       cupy.diff(Sg.indptr).astype(cupy.int32))
    torch_sddmm: Callable[..., Any] | None
    try:
        import torch

        crow = torch.from_dlpack(Sg.indptr.astype(cupy.int64))
        col = torch.from_dlpack(Sg.indices.astype(cupy.int64))
        vals = torch.from_dlpack(Sg.data)
        St = torch.sparse_csr_tensor(crow, col, vals, size=S.shape)

        def torch_sddmm(At: Any, Btt: Any) -> Any:
            return torch.sparse.sampled_addmm(St, At, Btt, beta=0.0, alpha=1.0)
    except ImportError:
        torch_sddmm = None
    from mgpu.backends.cupy import call_plan, gather_rows

    out = []
    for K in Ks:
        A, B = _factors(S, K, K)
        Ag, Bg = cupy.asarray(A), cupy.asarray(B)
        # Both paths compiled and tuned before either is timed (the first call of a shape
        # class tunes for seconds), and the errors checked on the host before any timing:
        # every timed series below starts from the device's working clocks (warm_device).
        P = mgpu.sddmm(Sg, Ag, Bg, hadamard=False)
        plan = mgpu.sddmm_plan(Sg, K)
        Pp = mgpu.sddmm(Sg, Ag, Bg, hadamard=False, plan=plan)
        err = _sample_error(S, A, B, P.data.get(), K)
        flop = 2.0 * K * S.nnz
        row: dict[str, Any] = {"K": K, "nnz": int(S.nnz), "device": cupy.cuda.runtime
                               .getDeviceProperties(0)["name"].decode(), "max_rel_err": err}
        row["mgpu_plan_max_rel_err"] = _sample_error(S, A, B, Pp.data.get(), K)
        if torch_sddmm is not None:
            At = torch.from_dlpack(Ag)
            Btt = torch.from_dlpack(Bg).t().contiguous()
            ref = torch_sddmm(At, Btt).values()
            row["cusparse_max_rel_err"] = _sample_error(S, A, B, cupy.from_dlpack(ref).get(), K)
        # mgpu's calls, with and without a plan, and cuSPARSE's, timed in rounds (one call
        # of each a round): the machine's state on a stretch of rounds falls on all alike
        rounds = {"mgpu": lambda: mgpu.sddmm(Sg, Ag, Bg, hadamard=False),
                  "mgpu_plan": lambda: mgpu.sddmm(Sg, Ag, Bg, hadamard=False, plan=plan)}
        if torch_sddmm is not None:
            rounds["cusparse"] = lambda: torch_sddmm(At, Btt)
        warm_device()
        row.update({f"{name}_s": t for name, t in
                    time_gpu_rounds(rounds, repeats=repeats).items()})
        per_call = call_plan(Sg, Ag, Bg)  # what the timed calls without a plan ran
        row["call_scheme"] = "csr" if per_call is None else _scheme(per_call)
        row["plan"] = plan.describe()
        row["scheme"] = _scheme(plan)
        row["tuning_ms"] = dict(plan.timings_ms)
        # The gather bound: every nonzero reads one row of B (K·4 bytes), mostly from L2; the
        # probe kernel does that gather alone, on the same pattern, and nothing else.
        g_out = cupy.empty(S.nnz, dtype=cupy.float32)
        row["gather_s"] = _timed(lambda: gather_rows(Sg, Bg, g_out), repeats)
        row["gather_gbs"] = S.nnz * K * 4 / row["gather_s"] / 1e9
        chunk = max(1, (1 << 28) // (K * 4))
        gd = cupy.empty(S.nnz, cupy.float32)

        def gather_dot() -> None:
            for s0 in range(0, S.nnz, chunk):
                r, c = rows[s0:s0 + chunk], Sg.indices[s0:s0 + chunk]
                gd[s0:s0 + chunk] = (Ag[r] * Bg[c]).sum(1)

        row["cupy_gather_dot_s"] = _timed(gather_dot, max(3, repeats // 2))
        for name in ("mgpu", "mgpu_plan", "gather", "cupy_gather_dot", "cusparse"):
            if f"{name}_s" in row:
                row[f"{name}_gflops"] = flop / row[f"{name}_s"] / 1e9
        if "cusparse_s" in row:
            row["speedup_vs_cusparse"] = row["cusparse_s"] / row["mgpu_s"]
            row["plan_speedup_vs_cusparse"] = row["cusparse_s"] / row["mgpu_plan_s"]
        row["fraction_of_gather_bound"] = row["gather_s"] / row["mgpu_plan_s"]
        row["speedup_vs_gather_dot"] = row["cupy_gather_dot_s"] / row["mgpu_s"]
        out.append(row)
        del Ag, Bg, P
        cupy.get_default_memory_pool().free_all_blocks()
    return out


def _timed(fn: Any, repeats: int) -> float:
    """:func:`time_gpu` of ``fn`` from the device's working clocks: calls of tens of
    microseconds that wait for the device after each do not raise an idle GPU's clocks, and
    each series here follows host work (the errors, the plan's tuning, another series)."""
    warm_device()
    return time_gpu(fn, repeats=repeats)


def _scheme(plan: Any) -> str:
    return plan.scheme if plan.scheme == "csr" else f"{plan.scheme} Tj={plan.Tj} Tk={plan.Tk}"


def call_breakdown(S: sp.csr_matrix, K: int, repeats: int = 200) -> dict[str, float]:
    """Where a checked call ``mgpu.sddmm(S, A, B, hadamard=False)`` on the GPU spends its
    time, in microseconds (medians over ``repeats`` calls, float32, after warm-up).

    The call's steps are run one by one, as :func:`mgpu.ops.sddmm.sddmm` runs them, each
    timed on the host: ``validation`` (the options, shapes, kinds, devices and S's format),
    ``planning`` (the memory rule and the per-call scheme), ``flag`` (the finiteness flag's
    slot), ``memory`` (the output's one allocation and its three views), ``launch`` (the
    launches, queued: for the CSR kernel one launch that also copies P's index arrays and
    checks the values; for a tiled scheme its product's, then one for the index arrays and
    the check), of which ``driver`` is the time inside ``cuLaunchKernel`` itself (the
    rest: Python), ``output`` (the result matrix, made while the device works), ``wait``
    (the one wait for the stream, and the flag's read). ``kernel`` is the device's time for
    the queued work (CUDA events around 20 calls' launches back to back: the host's time
    for them when that is longer), ``call`` the public call's own wall time,
    ``unaccounted`` what the steps miss of it (Python calls between them). The
    ``plan_*`` entries time the same call with a plan (:func:`_planned_breakdown`).
    """
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu
    from mgpu.backends import cupy as gpu
    from mgpu.backends.flags import device_flag
    from mgpu.ops.sddmm import (
        check_dense_factors,
        check_sddmm_options,
        check_sddmm_shapes,
        check_sparse,
        sddmm_operands,
    )

    S = S.tocsr().astype(np.float32)
    S.sum_duplicates()
    Sg = csp.csr_matrix(S)
    A, B = _factors(S, K, K)
    Ag, Bg = cupy.asarray(A), cupy.asarray(B)
    for _ in range(3):
        mgpu.sddmm(Sg, Ag, Bg, hadamard=False)  # compiled, tuned
    warm_device()
    stream = cupy.cuda.get_current_stream()
    names = ("validation", "planning", "flag", "memory", "launch", "output", "wait")
    steps: dict[str, list[float]] = {k: [] for k in names}
    clock = time.perf_counter
    driver: list[float] = []
    timed = _DriverTimer(gpu, driver, clock)
    try:
        for _ in range(repeats):
            stream.synchronize()
            t0 = clock()
            check_sddmm_options(False, True, None, None, None)
            check_sddmm_shapes(Sg.shape, Ag.shape, Bg.shape)
            check_dense_factors({"A": Ag, "B": Bg}, finite=False)
            S1, A1, B1 = sddmm_operands(check_sparse(Sg, False), Ag, Bg, False)
            t1 = clock()
            gpu._require_product(S1, A1, gpu.sddmm_is_usable_for(S1, A1, B1))
            plan = gpu.call_plan(S1, A1, B1)
            t2 = clock()
            with device_flag() as flag:
                t3 = clock()
                out = gpu.csr_output(S1, A1.dtype)
                t4 = clock()
                _queue(gpu, S1, A1, B1, plan, flag, out)
                t5 = clock()
                gpu.csr_of(S1, *out)
                t6 = clock()
                flag.raised()
                t7 = clock()
            times = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6)
            for k, v in zip(names, times):
                steps[k].append(v)
    finally:
        timed.restore()
    result = {k: 1e6 * float(np.median(v)) for k, v in steps.items()}
    result["driver"] = 1e6 * float(np.median(driver)) * len(driver) / repeats if driver \
        else float("nan")

    def queued() -> None:  # launched faster than they run: the events time the device
        with device_flag() as flag:
            for _ in range(20):
                _queue(gpu, S1, A1, B1, plan, flag, gpu.csr_output(S1, A1.dtype))
    result["kernel"] = 1e6 * time_gpu(queued, repeats=5) / 20

    def call() -> float:
        t0 = clock()
        mgpu.sddmm(Sg, Ag, Bg, hadamard=False)
        return clock() - t0
    result["call"] = 1e6 * float(np.median([call() for _ in range(repeats)]))
    result["unaccounted"] = result["call"] - sum(result[k] for k in steps)
    result.update(_planned_breakdown(Sg, Ag, Bg, repeats))
    return result


def _planned_breakdown(Sg: Any, Ag: Any, Bg: Any, repeats: int) -> dict[str, float]:
    """The same checked call with ``plan=mgpu.sddmm_plan(Sg, K)``, in microseconds (medians):
    ``plan_before_launch`` from the call to its launch (the checks of the factors, the flag,
    the output's memory), ``plan_launch`` the launch itself, ``plan_call`` the whole call.
    Empty where the plan has no prepared call (the CPU)."""
    import mgpu
    from mgpu.backends import launch

    plan = mgpu.sddmm_plan(Sg, Ag.shape[1])
    if getattr(plan, "call", None) is None:
        return {}
    for _ in range(3):
        mgpu.sddmm(Sg, Ag, Bg, hadamard=False, plan=plan)
    clock = time.perf_counter
    marks: list[float] = []
    inner = launch.PreparedLaunch.__call__

    def timed(self: Any, *addresses: int) -> None:
        marks.append(clock())
        inner(self, *addresses)
        marks.append(clock())

    before, during, total = [], [], []
    launch.PreparedLaunch.__call__ = timed  # type: ignore[method-assign]
    try:
        for _ in range(repeats):
            marks.clear()
            t0 = clock()
            mgpu.sddmm(Sg, Ag, Bg, hadamard=False, plan=plan)
            total.append(clock() - t0)
            if len(marks) == 2:  # one launch (the CSR scheme)
                before.append(marks[0] - t0)
                during.append(marks[1] - marks[0])
    finally:
        launch.PreparedLaunch.__call__ = inner  # type: ignore[method-assign]
    nan = float("nan")
    return {"plan_before_launch": 1e6 * float(np.median(before)) if before else nan,
            "plan_launch": 1e6 * float(np.median(during)) if during else nan,
            "plan_call": 1e6 * float(np.median(total))}


class _DriverTimer:
    """Every SDDMM launcher's ``cuLaunchKernel`` call timed into ``into`` (seconds) until
    :meth:`restore`."""

    def __init__(self, gpu: Any, into: list[float], clock: Callable[[], float]) -> None:
        self._saved = []
        for recipe in list(gpu._CSR_RECIPES.values()):
            L = recipe[0]
            if any(L is l for l, _ in self._saved):
                continue
            inner = L._launch

            def timed(*args: Any, _inner: Any = inner) -> None:
                t = clock()
                _inner(*args)
                into.append(clock() - t)
            self._saved.append((L, inner))
            L._launch = timed

    def restore(self) -> None:
        for L, inner in self._saved:
            L._launch = inner


def _queue(gpu: Any, S: Any, A: Any, B: Any, plan: Any, flag: Any, out: tuple) -> None:
    """The launches of a checked call without hadamard, as
    :func:`mgpu.backends.cupy.sddmm_kernel` queues them (the product, the check) into
    ``out`` (:func:`mgpu.backends.cupy.csr_output`'s arrays)."""
    values, indices, indptr = out
    csr = plan is None or plan.scheme == "csr"
    if not csr:
        gpu.launch_sddmm(S, A, B, False, plan, values)
    # the CSR kernel's one launch, or the copies and the check after a tiled one
    gpu.run_csr(S, A, B, False, values, indices, indptr, (A, B), flag, product=csr)


def breakdown_text(label: str, K: int, parts: dict[str, float]) -> str:
    """One line of :func:`call_breakdown`'s split."""
    steps = " + ".join(f"{k} {parts[k]:.1f}" for k in
                       ("validation", "planning", "flag", "memory", "launch", "output", "wait",
                        "unaccounted"))
    text = (f"{label}, K={K}: a checked call {parts['call']:.1f} us = {steps} "
            f"(of the launch, in cuLaunchKernel: {parts['driver']:.1f} us; the device's "
            f"work for it: {parts['kernel']:.1f} us)")
    if "plan_call" in parts:
        text += (f"\n{label}, K={K}: with a plan, a checked call {parts['plan_call']:.1f} us, "
                 f"{parts['plan_before_launch']:.1f} us of it before the launch (the factors' "
                 f"checks, the flag, the output's memory), the launch "
                 f"{parts['plan_launch']:.1f} us")
    return text


def markdown(rows: list[dict[str, Any]], label: str) -> str:
    """One Markdown table of a bench run's rows."""
    if not rows:
        return ""
    gpu = "cusparse_gflops" in rows[0] or "cupy_gather_dot_gflops" in rows[0]
    if gpu:
        head = ("| matrix | K | nnz | scheme | mgpu GFLOP/s (per call) | mgpu GFLOP/s (plan) | "
                "cuSPARSE GFLOP/s | CuPy gather-dot GFLOP/s | mgpu / cuSPARSE (per call) | "
                "mgpu / cuSPARSE (plan) | mgpu / gather-dot | gather bound GFLOP/s (GB/s of B) | "
                "plan at % of bound | max rel err |")
    else:
        head = ("| matrix | K | nnz | mgpu GFLOP/s | numpy gather-dot GFLOP/s | "
                "mgpu / numpy | max rel err |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if gpu:
            nan = float("nan")
            scheme = r["scheme"]  # the plan's; the per-call one beside it where it differs
            if r.get("call_scheme", scheme) != scheme:
                scheme += f" (per call: {r['call_scheme']})"
            lines.append(
                f"| {label} | {r['K']} | {r['nnz']:,} | {scheme} | {r['mgpu_gflops']:.0f} | "
                f"{r['mgpu_plan_gflops']:.0f} | {r.get('cusparse_gflops', nan):.0f} | "
                f"{r['cupy_gather_dot_gflops']:.0f} | {r.get('speedup_vs_cusparse', nan):.2f}× | "
                f"{r.get('plan_speedup_vs_cusparse', nan):.2f}× | "
                f"{r['speedup_vs_gather_dot']:.2f}× | {r['gather_gflops']:.0f} "
                f"({r['gather_gbs']:.0f}) | {r['fraction_of_gather_bound']:.0%} | "
                f"{max(r['max_rel_err'], r['mgpu_plan_max_rel_err']):.1e} |")
        else:
            lines.append(
                f"| {label} | {r['K']} | {r['nnz']:,} | {r['mgpu_gflops']:.2f} | "
                f"{r['numpy_gather_dot_gflops']:.2f} | {r['speedup_vs_numpy']:.2f}× | "
                f"{r['max_rel_err']:.1e} |")
    return "\n".join(lines)


def bench_matrix(S: sp.spmatrix, Ks: tuple[int, ...], *, on_gpu: bool,
                 repeats: int | None = None, label: str = "") -> list[dict[str, Any]]:
    """:func:`bench_gpu` or :func:`bench_cpu` (default repeats 10 and 3) on ``S`` as float32
    CSR without duplicates, each row labelled with the matrix."""
    S = S.tocsr().astype(np.float32)
    S.sum_duplicates()
    if on_gpu:
        rows = bench_gpu(S, Ks, repeats=repeats or 10)
    else:
        rows = bench_cpu(S, Ks, repeats=repeats or 3)
    for r in rows:
        r["matrix"] = label
    return rows


def bench_scaling(S: sp.csr_matrix, Ks: tuple[int, ...], workers: tuple[int, ...], *,
                  tiles_per_worker: int = 1, repeats: int = 5, gpus: bool | None = None,
                  progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The distributed SDDMM on 1, 2, 4, … workers, S and the factors resident on them.

    For each worker count an embedded cluster is started (GPU workers when ``gpus`` or when
    GPUs are visible), S is cut at nnz prefix sums into ``tiles_per_worker`` tiles per worker
    along :func:`mgpu.distributed.sddmm_axis`, and for each K the factors are placed once
    (:func:`mgpu.distributed.place_factors`) and each timed call runs ``mgpu.sddmm`` to a persisted
    (not gathered) result; a GPU task returns once its kernel has finished. The first call is a
    warm-up (kernel compilation, tuning) and is checked against a float64 reference on sampled
    nonzeros. The same product on one device without a cluster is the first row of each K.
    """
    from distributed import wait

    import mgpu
    from mgpu.distributed import (
        chunk_nnz,
        connect,
        from_scipy,
        gather,
        place_factors,
        sddmm_axis,
        visible_gpus,
    )

    use_gpus = visible_gpus() > 0 if gpus is None else gpus
    axis = sddmm_axis(S.shape)
    factors = {K: _factors(S, K, K) for K in Ks}
    out: list[dict[str, Any]] = []

    def record(n: Any, kind: str, K: int, times: list[float], tiles: int, imbalance: float,
               err: float) -> None:
        t = float(np.median(times))
        row = {"workers": n, "kind": kind, "tiles": tiles, "axis": axis, "K": K,
               "nnz": int(S.nnz), "median_s": t, "gflops": 2.0 * K * S.nnz / t / 1e9,
               "imbalance": imbalance, "max_rel_err": err}
        first = [r for r in out if r["K"] == K and isinstance(r["workers"], int)]
        if isinstance(n, int):
            row["speedup"] = first[0]["median_s"] / t if first else 1.0
        out.append(row)
        if progress is not None:
            progress(f"K={K}, {n} {kind} worker(s): {t * 1e3:.1f} ms, {row['gflops']:.0f} GFLOP/s"
                     + (f", speedup {row['speedup']:.2f}×" if "speedup" in row else "")
                     + f", nnz imbalance {imbalance:.4f}")

    for K in Ks:  # the one-device reference
        A, B = factors[K]
        if use_gpus:
            import cupy
            import cupyx.scipy.sparse as csp

            Sg, Ag, Bg = csp.csr_matrix(S), cupy.asarray(A), cupy.asarray(B)
            P = mgpu.sddmm(Sg, Ag, Bg, hadamard=False)
            err = _sample_error(S, A, B, P.data.get(), K)
            del P
            t = time_gpu(lambda: mgpu.sddmm(Sg, Ag, Bg, hadamard=False), repeats=repeats)
            del Sg, Ag, Bg
            cupy.get_default_memory_pool().free_all_blocks()
        else:
            err = _sample_error(S, A, B, mgpu.sddmm(S, A, B, hadamard=False).data, K)
            t = time_cpu(lambda: mgpu.sddmm(S, A, B, hadamard=False), repeats=repeats)
        record("one device, no cluster", "GPU" if use_gpus else "CPU", K, [t], 1, 1.0, err)
    for n in workers:
        with connect(n_workers=n, gpus=gpus) as client:
            kind = "GPU" if all(client.run(_has_gpu_worker).values()) else "CPU"
            Sd = from_scipy(S, n * tiles_per_worker, axis=axis, client=client)
            nnz = chunk_nnz(Sd).ravel()
            imbalance = float(nnz.max() / nnz.mean()) if nnz.size else 1.0
            for K in Ks:
                A, B = factors[K]
                A_d, B_d = place_factors(Sd, A, B, client=client)

                def call() -> Any:
                    P = mgpu.sddmm(Sd, A_d, B_d, hadamard=False).persist()
                    wait(P)
                    return P

                P = call()
                err = _sample_error(S, A, B, gather(P).tocsr().data, K)
                del P
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    P = call()
                    times.append(time.perf_counter() - t0)
                    del P
                record(n, kind, K, times, int(nnz.size), imbalance, err)
    return out


def _has_gpu_worker(dask_worker: Any = None) -> bool:
    from mgpu.distributed import worker_info

    return worker_info(dask_worker)["gpu"] is not None


def scaling_markdown(rows: list[dict[str, Any]], label: str) -> str:
    """The scaling table: time, GFLOP/s and speedup against one worker, with nnz imbalance."""
    head = ("| matrix | K | workers | tiles | nnz imbalance (max/mean) | median ms | GFLOP/s | "
            "speedup vs 1 | max rel err |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        speedup = f"{r['speedup']:.2f}×" if "speedup" in r else "–"
        lines.append(f"| {label} | {r['K']} | {r['workers']} {r['kind']} | {r['tiles']} | "
                     f"{r['imbalance']:.4f} | {r['median_s'] * 1e3:.1f} | {r['gflops']:.0f} | "
                     f"{speedup} | {r['max_rel_err']:.1e} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ streamed through the GPU


def stream_operands(m: int, n: int, row_nnz: int, K: int, seed: int = 0
                    ) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Host operands of any size, made at memory speed: S with ``row_nnz`` distinct columns
    a row (a random start, then a fixed stride), and factors whose rows are drawn
    from a table of 4099 random rows (float32)."""
    rng = np.random.default_rng(seed)
    stride = max(1, n // max(row_nnz, 1))
    start = rng.integers(0, n, size=m, dtype=np.int64)
    cols = (start[:, None] + stride * np.arange(row_nnz, dtype=np.int64)[None, :]) % n
    cols.sort(axis=1)  # canonical: no duplicate search over the whole matrix
    S = sp.csr_matrix((rng.random(m * row_nnz, dtype=np.float32) + 0.5,
                       cols.astype(np.int32).ravel(),
                       np.arange(0, m * row_nnz + 1, row_nnz, dtype=np.int64)), shape=(m, n))
    del cols, start
    table = rng.standard_normal((4099, K), dtype=np.float32)
    factors = []
    for rows in (m, n):
        X = np.empty((rows, K), dtype=np.float32)
        step = max(1, (1 << 28) // (K * 4))
        for s in range(0, rows, step):
            X[s:s + step] = table[np.arange(s, min(rows, s + step)) % 4099]
        factors.append(X)
    return S, factors[0], factors[1]


def bench_streamed(S: sp.csr_matrix, A: np.ndarray, B: np.ndarray, *,
                   working_memory: Any = None, cpu_peer: bool = True,
                   progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """One SDDMM of host operands streamed through the current GPU, against mgpu's CPU
    backend on the same operands: wall times of the public call (its checks of the operands
    and, on the GPU, the copies included), the bytes that crossed the bus, and the error on a
    sample of nonzeros against float64."""
    import mgpu
    from mgpu.backends.memory import gpu_available
    from mgpu.ops.sddmm import stream_budget

    inputs = A.nbytes + B.nbytes + S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
    available, capacity = gpu_available()
    budget = stream_budget(working_memory)
    parts: dict[str, float] = {}
    plans: list[Any] = []

    class _Parts(logging.Handler):  # the streamed call logs its plan and where its time went
        def emit(self, record: logging.LogRecord) -> None:
            if hasattr(record, "seconds"):
                parts.update(record.seconds)
                plans.append(record.plan)

    log = logging.getLogger("mgpu.ops.sddmm")
    handler, level = _Parts(logging.INFO), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        t0 = time.perf_counter()
        P = mgpu.sddmm(S, A, B, device="gpu", working_memory=budget, progress=progress)
        t_gpu = time.perf_counter() - t0
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    plan = plans[-1]
    n_panels = len(plan.panels)
    moved = B.nbytes + n_panels * A.nbytes + S.nnz * 12 + n_panels * (S.shape[0] + 1) * 4
    row = {"shape": list(S.shape), "nnz": int(S.nnz), "K": int(A.shape[1]),
           "input_bytes": int(inputs), "device_bytes": int(capacity),
           "device_available": int(available), "budget": budget, "panels": n_panels,
           "blocks": len(plan.blocks), "gpu_s": t_gpu, "bus_bytes": int(moved),
           "gpu_gflops": 2.0 * A.shape[1] * S.nnz / t_gpu / 1e9,
           "max_rel_err": _sample_error(S, A, B, P.data, 0, hadamard=True),
           "to_device_s": parts.get("to device"), "kernel_s": parts.get("kernel and back"),
           "streamed_s": parts.get("total")}
    del P
    if cpu_peer:
        row.update(run_cpu_peer(S, A, B, t_gpu))
    return row


def run_cpu_peer(S: sp.csr_matrix, A: np.ndarray, B: np.ndarray, gpu_s: float
                 ) -> dict[str, Any]:
    """mgpu's CPU backend on the operands of :func:`bench_streamed`, against its GPU time."""
    import mgpu

    t0 = time.perf_counter()
    P = mgpu.sddmm(S, A, B)
    cpu_s = time.perf_counter() - t0
    return {"cpu_s": cpu_s, "speedup_vs_cpu": cpu_s / gpu_s,
            "cpu_max_rel_err": _sample_error(S, A, B, P.data, 0, hadamard=True)}


def streamed_report(row: dict[str, Any]) -> str:
    """What a :func:`bench_streamed` row says, in words: the device, the plan, the time and
    where it went."""
    text = (
        f"GPU: {row['device_bytes'] / 2**30:.1f} GiB ({row['device_available'] / 2**30:.1f} "
        f"available); operands {row['input_bytes'] / 2**30:.1f} GiB; budget "
        f"{row['budget'] / 2**30:.1f} GiB: {row['panels']} panel(s) of B × {row['blocks']} "
        f"block(s) of S\n"
        f"streamed: {row['gpu_s']:.2f} s ({row['gpu_gflops']:.1f} GFLOP/s, "
        f"{row['bus_bytes'] / row['gpu_s'] / 1e9:.1f} GB/s of operands to the device), "
        f"max rel err {row['max_rel_err']:.1e} against float64")
    if row.get("streamed_s"):
        text += (f"\n  of which {row['to_device_s']:.2f} s copying to the device, "
                 f"{row['kernel_s']:.2f} s in the kernel and back, "
                 f"{row['streamed_s'] - row['to_device_s'] - row['kernel_s']:.2f} s cutting "
                 f"tiles on the host, {row['gpu_s'] - row['streamed_s']:.2f} s checking "
                 "the operands")
    return text
