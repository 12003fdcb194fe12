"""GradientMF's fit on a cluster as one SPMD task per worker (:func:`mgpu.distributed.spmd`).

Each worker builds its row tiles once (ratings, the map that transposes their pattern, test
ratings, its rows of U with their Adam moments) and holds V replicated; then every worker
runs all the steps itself. A step on a worker: per tile the residual at the training ratings
(SDDMM), U's gradient and Adam step and the tile's share of V's gradient (SpMM of the
residual's transpose); the shares summed in tile order, then summed across the workers with
one all-reduce of V's size (NCCL on GPU workers, the host channel on CPU workers), and every
worker takes the same Adam step of V from the same sum. The training and test squared errors
travel in a second, small all-reduce, from which every worker decides alike whether the fit
diverged, so that all of them stop at the same step. The client waits once per fit.

The test error of step ``r`` is that of the factors after step ``r``: it is summed in round
``r + 1``, beside step ``r + 1``'s training error (one small all-reduce a step), and the
last step's in a round of its own.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import mgpu
from mgpu.backends import array_module, synchronize, to_host
from mgpu.models._gradient_steps import _adam, _divergence_bound, _finite, _tile_task, _watch

__all__ = ["Spec", "fit_spmd"]

# a record as a row of the checkpoint's history array (NaN where a value is absent)
_FIELDS = ("iteration", "step_s", "train_rmse", "elapsed_s", "test_rmse")


@dataclass(frozen=True)
class Spec:
    """What every rank needs besides its tiles: the hyper-parameters, μ, the counts the
    RMSEs divide by, and the checkpoint interval (read on the client: 0 for none)."""

    iters: int
    lr: float
    reg: float
    mean: float
    n_train: int
    n_test: int
    has_test: bool
    checkpoint_every: int
    n_tiles: int


def fit_spmd(tiles: Any, tests: Any, starts: Any, V0: np.ndarray, cnt_v: np.ndarray,
             spec: Spec, progress: Callable[[dict[str, float]], None] | None
             ) -> tuple[np.ndarray, np.ndarray, list[dict[str, float]]]:
    """Run the fit on the workers holding ``tiles`` (a :class:`RowTiles`; ``tests`` and
    ``starts`` are RowTiles of the same rows: each tile's test ratings and starting U).
    Returns U (numpy, in user order), V and the history. A divergence raises rank 0's
    FloatingPointError here."""
    from mgpu.distributed.spmd import spmd

    seen = [0]

    def in_order(rec: dict[str, float]) -> None:
        # a fit resumed from a checkpoint repeats the steps after it: report each step once
        if rec["iteration"] > seen[0]:
            seen[0] = int(rec["iteration"])
            progress(rec)  # type: ignore[misc]

    out = spmd(_rank, tiles, tests, starts, args=(V0, cnt_v, spec), client=tiles.client,
               name="gradient-mf", progress=in_order if progress is not None else None)
    parts: dict[int, np.ndarray] = {}
    for res in out:
        parts.update(res["U"])
    U = np.vstack([parts[i] for i in range(len(tiles))])
    first = out[0]
    return U, first["V"], first["history"]


def _rank(comm: Any, R_parts: list[Any], test_parts: list[Any], U_parts: list[Any],
          V0: np.ndarray, cnt_v: np.ndarray, spec: Spec) -> dict[str, Any] | None:
    """One worker's fit (see the module's docstring). Returns its tiles' U on the host, and
    on rank 0 V and the history; None on the other ranks when the fit diverged (rank 0
    raises)."""
    # the starting U and V are Dask's (and V shared by the ranks of one process): the steps
    # change them in place, so on copies
    built = [(p.index, _tile_task(p.data, t.data, np.array(u.data, copy=True)))
             for p, t, u in zip(R_parts, test_parts, U_parts, strict=True)]
    index = [i for i, _ in built]
    tiles = [t for _, t in built]
    xp = array_module(tiles[0].R) if tiles else comm.xp
    V = xp.array(V0, copy=True)
    state_v = [xp.zeros_like(V), xp.zeros_like(V)]
    cnt = xp.asarray(cnt_v)
    history: list[dict[str, float]] = []
    pending: dict[str, float] | None = None  # the last step's record, until its test error
    bound = math.inf  # set by the first step
    first, offset = 1, 0.0
    if comm.resumed is not None:
        first, V, state_v, history, pending, bound, offset = _resume(
            comm, index, tiles, V, state_v, xp)
    t_start = time.perf_counter()
    last = spec.iters + (1 if spec.has_test else 0)
    # unchecked steps on CPU workers: overflow shows in the RMSE, which is watched
    with np.errstate(over="ignore", invalid="ignore"):
        for r in range(first, last + 1):
            update = r <= spec.iters
            t0 = time.perf_counter()
            errors, shares = _local_round(xp, tiles, V, r, update, pending is not None, spec)
            sums = _in_tile_order(to_host(comm.allreduce(_slots(xp, index, errors, spec))))
            try:
                if pending is not None and spec.has_test:
                    pending["test_rmse"] = float(np.sqrt(sums[1] / max(spec.n_test, 1)))
                    _finite(pending["test_rmse"], "test RMSE", r - 1, spec.lr)
                    _record(comm, history, pending)
                pending = None
                if not update:
                    break
                rec = {"iteration": r, "step_s": 0.0,
                       "train_rmse": float(np.sqrt(sums[0] / max(spec.n_train, 1)))}
                if r == 1:
                    bound = _divergence_bound(rec["train_rmse"], spec.mean)
                _watch(rec["train_rmse"], bound, r, spec.lr)
            except FloatingPointError:
                # every rank saw the same sums and takes this branch at the same step
                if comm.rank == 0:
                    raise
                return None
            g = _sum_shares(comm, xp, index, shares, V, spec.n_tiles)
            _adam(xp, V, g, cnt, state_v, r, spec.lr, spec.reg)
            synchronize(V)
            now = time.perf_counter()
            rec["step_s"] = now - t0
            rec["elapsed_s"] = offset + now - t_start
            if spec.has_test:
                pending = rec
            else:
                _record(comm, history, rec)
            every = spec.checkpoint_every
            if every and r % every == 0 and r < spec.iters:
                _checkpoint(comm, r, index, tiles, V, state_v, history, pending, bound)
    return {"U": {i: to_host(t.U) for i, t in zip(index, tiles)},
            "V": to_host(V) if comm.rank == 0 else None,
            "history": history if comm.rank == 0 else None}


def _local_round(xp: Any, tiles: list[Any], V: Any, it: int, update: bool, test_due: bool,
                 spec: Spec) -> tuple[list[Any], list[Any]]:
    """This rank's part of a round, per tile: the squared test error of the factors that
    start the round (when the last step's record waits for it), then, unless this is the
    round after the last step, the residual, U's Adam step (in place: the tile is this
    rank's) and the tile's share of V's gradient. Returns each tile's (training, test)
    squared errors as device scalars (nothing waits for the device here) and its share."""
    errors, shares = [], []
    zero = xp.zeros((), dtype=xp.float64)
    for tile in tiles:
        train = test_sse = zero
        if test_due and spec.has_test and tile.test.nnz:
            P = mgpu.sddmm(tile.test, tile.U, V, hadamard=False, check_finite=False)
            test_sse = (((P.data + spec.mean) - tile.test.data).astype(xp.float64) ** 2).sum()
        if update:
            E = mgpu.sddmm(tile.R, tile.U, V, hadamard=False, check_finite=False)
            E.data += spec.mean - tile.R.data
            gU = mgpu.spmm(E, V, check_finite=False)
            shares.append(mgpu.spmm(tile.transpose(E.data), tile.U, check_finite=False))
            train = (E.data.astype(xp.float64) ** 2).sum()
            _adam(xp, tile.U, gU, tile.cnt, tile.state, it, spec.lr, spec.reg)
        errors.append(xp.stack([train, test_sse]))
    return errors, shares


# Sums over the tiles are taken in tile order whatever the workers that hold them: each
# rank writes its tiles' values into their own slots of a buffer that is zero elsewhere,
# the all-reduce adds only zeros to each value (exact, in any order NCCL or the host
# chooses), and every rank sums the slots in tile order. The result is the same to the bit
# on any number of workers, after a restart that moved tiles, and on the per-round path.
# V's gradient takes that way while the slots are at most this many bytes; past it each
# rank sums its own tiles first (the same up to rounding).
_EXACT_BYTES = 64 << 20


def _slots(xp: Any, index: list[int], values: list[Any], spec: Spec) -> Any:
    out = xp.zeros((spec.n_tiles, *values[0].shape), dtype=values[0].dtype) if values \
        else xp.zeros((spec.n_tiles, 2), dtype=xp.float64)
    for i, v in zip(index, values):
        out[i] = v
    return out


def _in_tile_order(slots: Any) -> Any:
    total = slots[0].copy()
    for s in slots[1:]:
        total = total + s
    return total


def _sum_shares(comm: Any, xp: Any, index: list[int], shares: list[Any], V: Any,
                n_tiles: int) -> Any:
    """V's gradient: the tiles' shares summed over all the ranks (see :data:`_EXACT_BYTES`)."""
    if n_tiles * V.nbytes <= _EXACT_BYTES:
        slots = xp.zeros((n_tiles, *V.shape), dtype=V.dtype)
        for i, share in zip(index, shares):
            slots[i] = share
        return _in_tile_order(comm.allreduce(slots))
    local = xp.zeros_like(V)
    for share in shares:
        local += share
    return comm.allreduce(local)


def _record(comm: Any, history: list[dict[str, float]], rec: dict[str, float]) -> None:
    history.append(rec)
    comm.report(rec)


def _checkpoint(comm: Any, it: int, index: list[int], tiles: list[Any], V: Any,
                state_v: list[Any], history: list[dict[str, float]],
                pending: dict[str, float] | None, bound: float) -> None:
    """Each tile's U and moments; beside tile 0 (whichever rank holds it) V, its moments,
    the divergence bound and the records so far (the last one still without its test
    error, as ``pending``)."""
    state = {i: {"U": t.U, "mU": t.state[0], "sU": t.state[1]} for i, t in zip(index, tiles)}
    if 0 in state:
        state[0].update(V=V, mV=state_v[0], sV=state_v[1], bound=np.array([bound]),
                        history=_rows(history), pending=_rows([pending] if pending else []))
    comm.checkpoint(it, state)


def _resume(comm: Any, index: list[int], tiles: list[Any], V: Any, state_v: list[Any],
            xp: Any) -> tuple[Any, ...]:
    """This rank's tiles and V as the last checkpoint left them; V's state comes from the
    rank that holds tile 0's checkpoint, broadcast to the others."""
    it, saved = comm.resumed
    for i, tile in zip(index, tiles):
        tile.U = xp.asarray(saved[i]["U"])
        tile.state = [xp.asarray(saved[i]["mU"]), xp.asarray(saved[i]["sU"])]
    root = comm.allgather_obj(0 in saved).index(True)
    mine = saved.get(0, {})
    if comm.rank == root:
        V = xp.asarray(mine["V"])
        state_v = [xp.asarray(mine["mV"]), xp.asarray(mine["sV"])]
    V = comm.broadcast(V, root=root)
    state_v = [comm.broadcast(a, root=root) for a in state_v]
    small = comm.bcast_obj((float(mine["bound"][0]), mine["history"], mine["pending"])
                           if comm.rank == root else None, root=root)
    bound, hist, pend = small
    history = _records(hist)
    pending = (_records(pend) or [None])[0]
    offset = history[-1]["elapsed_s"] if history else 0.0
    if pending is not None:
        offset = pending["elapsed_s"]
    return it + 1, V, state_v, history, pending, bound, offset


def _rows(records: list[dict[str, float]]) -> np.ndarray:
    return np.array([[r.get(f, np.nan) for f in _FIELDS] for r in records],
                    dtype=np.float64).reshape(len(records), len(_FIELDS))


def _records(rows: np.ndarray) -> list[dict[str, float]]:
    out = []
    for row in np.asarray(rows):
        rec = {f: float(v) for f, v in zip(_FIELDS, row) if not np.isnan(v)}
        rec["iteration"] = int(rec["iteration"])
        out.append(rec)
    return out
