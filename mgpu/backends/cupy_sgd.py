"""GPU side of the SGD block kernel of matrix factorisation (``kernels/sgd.cu``): the
lock-free warp-per-rating scheme (``mgpu_sgd_block``) and the wavefront scheme
(``mgpu_sgd_wave``, :mod:`mgpu.mf.schedule`)."""
from __future__ import annotations

import functools
from typing import Any

import cupy
import numpy as np

from mgpu.backends.dispatch import sgd_lookup
from mgpu.backends.cupy import current_facts
from mgpu.backends.instances import INSTANCES, SGD_KPL, wave_kernel
from mgpu.backends.loader import c_type, get_function

_SGD = "sgd.cu"
_THREADS = 256
_BLOCKS_PER_SM = 16
_WAVE_THREADS = 64  # two warps a thread block: the SM's registers leave no warp unused


def sgd_is_usable_for(users: cupy.ndarray, items: cupy.ndarray, ratings: cupy.ndarray,
                      P: cupy.ndarray, Q: cupy.ndarray) -> bool:
    """Whether the kernel takes these operands: one float dtype, C order, 32-bit ids,
    k <= 32 * the widest instantiation."""
    return (P.dtype.name in ("float32", "float64") and P.dtype == Q.dtype == ratings.dtype
            and P.flags.c_contiguous and Q.flags.c_contiguous and P.shape[1] == Q.shape[1]
            and 0 < P.shape[1] <= 32 * SGD_KPL[-1]
            and users.dtype == items.dtype == cupy.int32)


def warps_for(users: cupy.ndarray, items: cupy.ndarray, n_users: int, n_items: int,
              conflicts: float | None) -> int:
    """Warps to run: all the device holds, or, with ``conflicts``, so few that the busiest
    user or item is expected in at most that many updates at once.

    Lock-free SGD loses the updates that collide, and a row with a share d/n of the ratings
    sits in about W·d/n of W updates in flight: harmless on Netflix-sized data, ruinous on a
    block of a few hundred users where one user has a tenth of the ratings.
    """
    sms = current_facts().sms
    full = sms * _BLOCKS_PER_SM * (_THREADS // 32)
    n = int(users.shape[0])
    if conflicts is None or n == 0:
        return full
    busiest = max(int(cupy.bincount(users, minlength=n_users).max()),
                  int(cupy.bincount(items, minlength=n_items).max()))
    return int(max(1, min(full, conflicts * n // busiest)))


@functools.lru_cache(maxsize=None)
def _resident_blocks(device: int, expr: str, threads: int) -> int:
    """Thread blocks of ``threads`` of a kernel that one SM holds at once (the occupancy
    calculator's answer; one, which any kernel that launches gets, where CuPy lacks it)."""
    fn = get_function(_SGD, expr, INSTANCES[_SGD])
    try:
        return max(1, int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            fn.ptr, threads, 0)))
    except (AttributeError, cupy.cuda.driver.CUDADriverError):
        return 1


def wave_warps(expr: str, groups: int, max_warps: int | None = None) -> tuple[int, int]:
    """(warps, warps per thread block) of a wavefront launch: one per row group, no more
    than the device holds at once (every warp of the wavefront must be resident, or one
    waiting could hold the slot of the one it waits for) nor ``max_warps``."""
    per_block = _WAVE_THREADS // 32
    resident = current_facts().sms * _resident_blocks(cupy.cuda.runtime.getDevice(), expr,
                                                      _WAVE_THREADS) * per_block
    warps = max(1, min(groups, resident, max_warps if max_warps and max_warps > 0 else groups))
    return warps, min(per_block, warps)


def _check_operands(users: cupy.ndarray, items: cupy.ndarray, ratings: cupy.ndarray,
                    P: cupy.ndarray, Q: cupy.ndarray) -> tuple[str, int]:
    """The kernel's (C type, KPL) for these operands, or ValueError."""
    if not sgd_is_usable_for(users, items, ratings, P, Q):
        raise ValueError(
            f"The SGD kernel takes float32 or float64 factors and ratings of one dtype, int32 "
            f"ids and 1 <= k <= {32 * SGD_KPL[-1]}. Got P {P.dtype} {P.shape}, Q {Q.dtype} "
            f"{Q.shape}, ratings {ratings.dtype}, ids {users.dtype}/{items.dtype}.")
    return c_type(P.dtype), next(w for w in SGD_KPL if int(P.shape[1]) <= 32 * w)


def sgd_wave_gpu(users: cupy.ndarray, items: cupy.ndarray, ratings: cupy.ndarray,
                 P: cupy.ndarray, Q: cupy.ndarray, lr: float, reg_p: float, reg_q: float,
                 schedule: Any, max_warps: int | None = None, depth: int | None = None) -> None:
    """One pass of the wavefront scheme (``mgpu_sgd_wave``): the ratings in ``schedule``'s
    order (:func:`mgpu.mf.schedule.build_schedule`), the pass's diagonals drawn from its
    seed and ``schedule.passes``, which this advances; ``depth`` ratings in flight per warp
    (:func:`wave_kernel`). The result does not depend on ``max_warps`` or ``depth``."""
    groups = int(schedule.groups)
    if schedule.offsets.shape != (groups * groups + 1,) \
            or int(ratings.shape[0]) != int(schedule.size):
        raise ValueError(f"The schedule of {groups} groups ({schedule.offsets.shape[0]} "
                         f"offsets) covers {schedule.size} ratings; this pass was given "
                         f"{ratings.shape[0]}. Build it (mgpu.mf.schedule.build_schedule) from "
                         "these ratings.")
    expr = wave_kernel(*_check_operands(users, items, ratings, P, Q), depth)
    offsets = cupy.asarray(schedule.offsets, dtype=cupy.int64)
    schedule.offsets = offsets  # moved to the device once, for every pass
    epoch = schedule.passes
    schedule.passes += 1
    if ratings.shape[0] == 0:
        return
    fn = get_function(_SGD, expr, INSTANCES[_SGD])
    warps, per_block = wave_warps(expr, groups, max_warps)
    diagonals = cupy.asarray(schedule.diagonals(epoch))
    done = cupy.zeros(groups, dtype=cupy.int32)
    t = P.dtype.type
    fn((-(-warps // per_block),), (32 * per_block,), (
        users, items, ratings, offsets, diagonals, np.int32(groups), np.int32(warps), done, P,
        Q, np.int32(P.shape[1]), t(lr), t(reg_p), t(reg_q)))


@sgd_lookup.register(cupy.ndarray)
def sgd_block_gpu(users: cupy.ndarray, items: cupy.ndarray, ratings: cupy.ndarray,
                  P: cupy.ndarray, Q: cupy.ndarray, lr: float, reg_p: float, reg_q: float,
                  order: cupy.ndarray | None = None, conflicts: float | None = None,
                  max_warps: int | None = None, schedule: Any = None) -> None:
    """One pass over the ratings, P and Q updated in place on the GPU: with ``schedule``
    the wavefront scheme (:func:`sgd_wave_gpu`), else in ``order`` (default as given), one
    warp per rating, lock-free between warps as in cuMF_SGD, ``conflicts`` bounding the
    warps in flight (:func:`warps_for`)."""
    if schedule is not None:
        sgd_wave_gpu(users, items, ratings, P, Q, lr, reg_p, reg_q, schedule, max_warps)
        return
    if order is not None:
        users, items, ratings = users[order], items[order], ratings[order]
    n = int(ratings.shape[0])
    if n == 0:
        return
    k = int(P.shape[1])
    expr = "mgpu_sgd_block<{}, {}>".format(*_check_operands(users, items, ratings, P, Q))
    fn = get_function(_SGD, expr, INSTANCES[_SGD])
    warps = min(warps_for(users, items, P.shape[0], Q.shape[0], conflicts), n,
                max_warps if max_warps is not None and max_warps > 0 else n)
    per_block = min(warps, _THREADS // 32)
    t = P.dtype.type
    fn((-(-warps // per_block),), (32 * per_block,), (
        users, items, ratings, cupy.int64(n), P, Q, cupy.int32(k), t(lr), t(reg_p), t(reg_q)))
