"""A loop of SDDMM calls on a resident S with its factors updated between calls: one device
against one :func:`mgpu.spmd` job on 1, 2, 4, … workers, in one run.

The loop fits the margins of a positive rank-K model to S's: each step computes the sampled
product ``P = (A Bᵀ)`` on S's pattern (one SDDMM), scales A's rows so that P's row sums equal
S's, and B's rows so that the scaled P's column sums equal S's (iterative proportional
fitting; the row-margin error before each scaling is its convergence record). On the
workers S stays in row tiles with A's rows beside them; B is replicated, and its update
needs every tile's column sums: one all-reduce of ``n_cols + 1`` numbers a step
(``comm.allreduce``: NCCL on GPU workers). One device runs the same code with an all-reduce
that does nothing.

The factors are made where they are used, row by row from a seeded table (row ``u`` of A is
the same whatever the tiling), so that nothing of size ``n_rows × K`` crosses the cluster,
and every worker count starts from the same A and B as one device. Times are the loop's
(after a warm-up call, with per-tile plans made first), the slowest rank's; the result check
is the final B and the error record against one device's.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends import to_host

_TABLE_ROWS = 4099  # prime: consecutive rows of a tile draw far-apart table rows


def factor_rows(start: int, stop: int, K: int, seed: int, xp: Any = np) -> Any:
    """Rows ``start:stop`` of a positive float32 factor (values in [0.5, 1.5)), each row a
    function of its index only."""
    table = np.random.default_rng(seed).uniform(0.5, 1.5, (_TABLE_ROWS, K)).astype(np.float32)
    idx = (np.arange(start, stop, dtype=np.int64) * 7919) % _TABLE_ROWS
    return xp.asarray(table[idx])


@dataclass
class _Tile:
    S: Any
    A: Any
    r: Any  # S's row sums: the target of P's
    plan: Any


def _row_sums(X: Any, xp: Any) -> Any:
    return xp.asarray(X.sum(axis=1)).ravel()


def fit_margins(tiles: list[_Tile], B: Any, steps: int, xp: Any,
                allreduce: Callable[[Any], Any]) -> tuple[Any, list[float]]:
    """The loop: ``steps`` SDDMM calls, the factors scaled between them (in place); B and
    the relative row-margin error before each step's scaling."""
    import mgpu

    n = B.shape[0]
    c = allreduce(sum(xp.asarray(t.S.sum(axis=0)).ravel() for t in tiles))  # S's col sums
    r2 = float(allreduce(sum((t.r * t.r).sum() for t in tiles).reshape(1))[0])
    errors = []
    for _ in range(steps):
        stats = xp.zeros(n + 1, dtype=B.dtype)
        for t in tiles:
            P = mgpu.sddmm(t.S, t.A, B, hadamard=False, plan=t.plan, check_finite=False)
            rs = _row_sums(P, xp)
            scale = xp.where(rs > 0, t.r / xp.where(rs > 0, rs, 1), 1).astype(B.dtype)
            t.A *= scale[:, None]
            stats[:n] += P.T @ scale  # column sums of the row-scaled P
            stats[n] += ((rs - t.r) ** 2).sum()
        stats = allreduce(stats)
        col = stats[:n]
        B *= xp.where(col > 0, c / xp.where(col > 0, col, 1), 1).astype(B.dtype)[:, None]
        errors.append(stats[n])
    return B, [float(e) ** 0.5 / max(r2, 1e-300) ** 0.5 for e in errors]


def _tiles(parts: list[Any], K: int, seed: int, xp: Any) -> list[_Tile]:
    import mgpu

    out = []
    for p in parts:
        S = p.data
        out.append(_Tile(S, factor_rows(p.rows.start, p.rows.stop, K, seed, xp),
                         _row_sums(S, xp).astype(np.float32),
                         mgpu.sddmm_plan(S, K, dtype=np.float32)))
    return out


def _warm(tiles: list[_Tile], B: Any) -> None:
    """One call of each kernel the loop runs (compilation), its results dropped."""
    import mgpu

    for t in tiles:
        P = mgpu.sddmm(t.S, t.A, B, hadamard=False, plan=t.plan, check_finite=False)
        P.T @ t.r


def _sync(xp: Any) -> None:
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def _rank(comm: Any, parts: list[Any], K: int, steps: int, seeds: tuple[int, int]
          ) -> dict[str, Any]:
    """One rank of the SPMD loop: its tiles' A, B whole, the loop timed between barriers."""
    xp = comm.xp
    tiles = _tiles(parts, K, seeds[0], xp)
    B = factor_rows(0, parts[0].data.shape[1], K, seeds[1], xp)
    _warm(tiles, B)
    _sync(xp)
    comm.barrier()
    t0 = time.perf_counter()
    B, errors = fit_margins(tiles, B, steps, xp, comm.allreduce)
    _sync(xp)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "errors": errors, "B": to_host(B) if comm.rank == 0 else None}


class _Whole:
    """S as the single tile of one device."""

    def __init__(self, S: Any):
        self.data, self.rows = S, slice(0, S.shape[0])


def one_device(S: sp.csr_matrix, K: int, steps: int, *, gpu: bool,
               seeds: tuple[int, int] = (1, 2)) -> dict[str, Any]:
    """The loop on one device (the GPU with ``gpu``), no cluster."""
    if gpu:
        import cupy as xp
        import cupyx.scipy.sparse as csp

        Sd = csp.csr_matrix(S)
    else:
        xp, Sd = np, S
    tiles = _tiles([_Whole(Sd)], K, seeds[0], xp)
    B = factor_rows(0, S.shape[1], K, seeds[1], xp)
    _warm(tiles, B)
    _sync(xp)
    t0 = time.perf_counter()
    B, errors = fit_margins(tiles, B, steps, xp, lambda x: x)
    _sync(xp)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "errors": errors, "B": to_host(B)}


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-300)
    return float(np.abs(got.astype(np.float64) - ref).max(initial=0.0) / scale)


def bench_loop(S: sp.csr_matrix, K: int, workers: tuple[int, ...], *, steps: int = 50,
               tiles_per_worker: int = 1, gpus: bool | None = None,
               progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The rows of ``mgpu bench sddmm-loop``: one device, then one SPMD job per worker count
    (an embedded cluster each, S cut into row tiles at nnz prefix sums), each with its time
    a step, its speedup over one device and its result against one device's."""
    import mgpu
    from mgpu.distributed import connect, from_scipy, visible_gpus

    use_gpus = visible_gpus() > 0 if gpus is None else gpus
    S = sp.csr_matrix(S, dtype=np.float32)
    ref = one_device(S, K, steps, gpu=use_gpus)
    rows = [_row("one device", "GPU" if use_gpus else "CPU", ref, ref, S, K, steps)]
    if progress is not None:
        progress(markdown(rows).splitlines()[-1])
    for n in workers:
        with connect(n_workers=n, gpus=gpus) as client:
            Sd = from_scipy(S, n * tiles_per_worker, axis=0, client=client)
            t0 = time.perf_counter()
            out = mgpu.spmd(_rank, Sd, args=(K, steps, (1, 2)), client=client,
                            name="bench-sddmm-loop")
            wall = time.perf_counter() - t0
            kind = "GPU" if all(client.run(_on_gpu).values()) else "CPU"
        got = {"seconds": max(o["seconds"] for o in out), "errors": out[0]["errors"],
               "B": out[0]["B"]}
        rows.append(_row(n, kind, got, ref, S, K, steps, job_s=wall))
        if progress is not None:
            progress(markdown(rows).splitlines()[-1])
    return rows


def _on_gpu(dask_worker: Any = None) -> bool:
    from mgpu.distributed import worker_info

    return worker_info(dask_worker)["gpu"] is not None


def _row(workers: Any, kind: str, got: dict[str, Any], ref: dict[str, Any], S: Any, K: int,
         steps: int, job_s: float | None = None) -> dict[str, Any]:
    err = max(_rel_err(got["B"], ref["B"]),
              _rel_err(np.asarray(got["errors"]), np.asarray(ref["errors"])))
    return {"workers": workers, "kind": kind, "nnz": int(S.nnz), "shape": list(S.shape),
            "K": K, "steps": steps, "loop_s": got["seconds"],
            "step_ms": got["seconds"] / steps * 1e3, "speedup": ref["seconds"] / got["seconds"],
            "job_s": job_s, "max_rel_err": err, "correct": err < 1e-3,
            "margin_error": [got["errors"][0], got["errors"][-1]]}


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| matrix | K | workers | ms a step | speedup vs one device | loop s | job s | "
             "row-margin error, first → last | max rel err vs one device |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, n = r["shape"]
        job = f"{r['job_s']:.2f}" if r["job_s"] is not None else "–"
        lines.append(f"| {m:,}×{n:,}, {r['nnz']:,} nnz | {r['K']} | {r['workers']} "
                     f"{r['kind']} | {r['step_ms']:.2f} | {r['speedup']:.2f}× | "
                     f"{r['loop_s']:.2f} | {job} | {r['margin_error'][0]:.3g} → "
                     f"{r['margin_error'][1]:.3g} | {r['max_rel_err']:.1e} |")
    return "\n".join(lines)
