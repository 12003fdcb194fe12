"""The pieces of a GradientMF step that the one-device fit, the per-round cluster fit and the
SPMD fit share: Adam's step, the divergence watch, and a row tile with its state."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mgpu.backends import array_module, is_gpu_array, to_device
from mgpu.mf.sgd import DIVERGENCE
from mgpu.models._transpose import Transposer


def _divergence_bound(first: float, mean: float) -> float:
    """The training RMSE past which a fit has diverged: :data:`DIVERGENCE` times the first
    step's (that of the starting factors), or times the ratings' mean where that is larger
    (ratings all alike start near an RMSE of 0)."""
    return DIVERGENCE * max(first, abs(mean))


def _watch(train_rmse: float, bound: float, it: int, lr: float) -> None:
    """Refuse a step whose training RMSE is not finite or past ``bound``."""
    _finite(train_rmse, "training RMSE", it, lr)
    if train_rmse > bound:
        raise FloatingPointError(
            f"GradientMF diverged at step {it}: the training RMSE rose to {train_rmse:.4g}, "
            f"past {DIVERGENCE:g} times its scale at the start ({bound / DIVERGENCE:.4g}). "
            f"Lower the learning rate (lr={lr}).")


def _finite(value: float, what: str, it: int, lr: float) -> None:
    """Refuse a NaN or infinite measure of the fit (the steps themselves check nothing)."""
    if not math.isfinite(value):
        raise FloatingPointError(f"GradientMF diverged at step {it}: the {what} is {value}. "
                                 f"Lower the learning rate (lr={lr}) or check the ratings' "
                                 "scale.")


_B1, _B2, _EPS = 0.9, 0.999, 1e-8


def _adam(xp: Any, A: Any, g: Any, cnt: Any, state: list[Any], it: int, lr: float,
          reg: float) -> None:
    """One Adam step of A in place from the summed gradient g (per-row means by ``cnt``, plus
    the L2 term); ``state`` holds the two moments, updated in place too."""
    g = g / cnt + reg * A
    mom, sq = state
    mom *= _B1
    mom += (1 - _B1) * g
    sq *= _B2
    sq += (1 - _B2) * g * g
    A -= (lr * (mom / (1 - _B1 ** it)) / (xp.sqrt(sq / (1 - _B2 ** it)) + _EPS)).astype(A.dtype)


@dataclass
class _Tile:
    """The training ratings of a block of users (rows), the map that transposes a matrix of
    their pattern by one gather, their test ratings, and the block's U with its Adam
    moments: all of it stays on the worker that holds the tile."""

    R: Any
    transpose: Transposer
    cnt: Any
    test: Any
    U: Any
    state: list[Any]


def _tile_task(R: Any, test: Any, U: Any) -> _Tile:
    """Build a tile on the worker holding R's rows (GPU arrays when R is a cupyx tile)."""
    xp = array_module(R)
    # the test ratings arrive from the client on the host; a GPU tile holds its on the GPU
    if is_gpu_array(R):
        test = to_device(test)
    R = R.tocsr()
    if not R.has_sorted_indices:  # the block is the dask array's: sort a copy
        R = R.copy()
        R.sort_indices()
    U = xp.asarray(U)
    cnt = xp.maximum(xp.diff(R.indptr), 1).astype(R.dtype)[:, None]
    return _Tile(R, Transposer.of(R), cnt, test, U,
                 [xp.zeros_like(U), xp.zeros_like(U)])
