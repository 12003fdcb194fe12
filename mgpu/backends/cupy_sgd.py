"""GPU side of the SGD block kernel of matrix factorisation (``kernels/sgd.cu``): the
lock-free warp-per-rating scheme (``mgpu_sgd_block``) and the wavefront scheme
(``mgpu_sgd_wave``, :mod:`mgpu.mf.schedule`)."""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from mgpu.backends.dispatch import sgd_lookup
from mgpu.backends.cupy import current_facts, device_facts
from mgpu.backends.instances import INSTANCES, SGD_KPL, wave_kernel
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.occupancy import blocks_by_registers, blocks_by_shared, resident_launch

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Occupancy:
    """What a wavefront launch's residency rests on, for one kernel on one device."""

    blocks_per_sm: int  # thread blocks of _WAVE_THREADS an SM holds: the driver's answer
    regs: int  # registers a thread (the compiled kernel's attribute)
    by_registers: int  # the same count from regs (occupancy.blocks_by_registers)
    shared: int  # static shared memory a block (its ring of rows, the compiled attribute)
    by_shared: int  # the count that allows (occupancy.blocks_by_shared)
    sms: int
    source: str  # "driver", or "resources" where CuPy lacks the occupancy call

    @property
    def by_resources(self) -> int:
        """Blocks an SM holds by the registers and the shared memory: the smaller."""
        return min(self.by_registers, self.by_shared)

    @property
    def warps(self) -> int:
        """Warps of the kernel the device holds at once."""
        return self.sms * self.blocks_per_sm * (_WAVE_THREADS // 32)


@functools.lru_cache(maxsize=None)
def _occupancy(device: int, expr: str) -> Occupancy:
    fn = get_function(_SGD, expr, INSTANCES[_SGD])
    attrs = cupy.cuda.Device(device).attributes
    regs = int(fn.num_regs)
    by_regs = blocks_by_registers(
        regs, _WAVE_THREADS, regs_per_sm=attrs.get("MaxRegistersPerMultiprocessor", 65536),
        regs_per_block=attrs.get("MaxRegistersPerBlock", 65536),
        max_warps_per_sm=attrs.get("MaxThreadsPerMultiProcessor", 2048) // 32,
        max_blocks_per_sm=attrs.get("MaxBlocksPerMultiprocessor", 32))
    shared = int(fn.shared_size_bytes)
    by_shared = blocks_by_shared(
        shared, shared_per_sm=attrs.get("MaxSharedMemoryPerMultiprocessor", 233472),
        reserved=attrs.get("ReservedSharedMemoryPerBlock", 1024),
        max_blocks_per_sm=attrs.get("MaxBlocksPerMultiprocessor", 32))
    by_res = min(by_regs, by_shared)
    try:
        query = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor
    except AttributeError:  # older CuPy: the calculator's arithmetic on the resources
        blocks, source = by_res, "resources"
    else:  # the RawKernel's CUfunction is fn.kernel.ptr (the RawKernel itself has no ptr)
        blocks, source = int(query(fn.kernel.ptr, _WAVE_THREADS, 0)), "driver"
    if blocks < 1:
        raise RuntimeError(f"{expr} ({regs} registers a thread, {shared} bytes of shared "
                           f"memory a block) fits no block of {_WAVE_THREADS} threads on an SM "
                           f"of device {device}.")
    if blocks != by_res:
        logger.warning("%s: the driver holds %d blocks of %d threads an SM, the registers "
                       "(%d a thread) allow %d and the shared memory (%d bytes a block) %d",
                       expr, blocks, _WAVE_THREADS, regs, by_regs, shared, by_shared)
    return Occupancy(blocks, regs, by_regs, shared, by_shared, device_facts(device).sms, source)


def wave_occupancy(expr: str) -> Occupancy:
    """The occupancy of the wavefront kernel ``expr`` on the current device (once per
    device and kernel; compiles the kernel if it is not yet)."""
    return _occupancy(cupy.cuda.runtime.getDevice(), expr)


def wave_warps(expr: str, groups: int, max_warps: int | None = None) -> tuple[int, int]:
    """(warps, warps per thread block) of a wavefront launch: one per row group, no more
    than the device holds at once (every warp of the wavefront must be resident, or one
    waiting could hold the slot of the one it waits for) nor ``max_warps``."""
    occ = wave_occupancy(expr)
    warps, per_block, _ = resident_launch(groups, occ.sms, occ.blocks_per_sm,
                                          _WAVE_THREADS // 32, max_warps)
    logger.debug("%s, %d groups: %d warps (%d blocks of %d threads an SM, %d registers, %d "
                 "bytes shared, %s)", expr, groups, warps, occ.blocks_per_sm, _WAVE_THREADS,
                 occ.regs, occ.shared, occ.source)
    return warps, per_block


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
    (:func:`wave_kernel`; default 8 where the rows allow it). The result does not depend on
    ``max_warps`` or ``depth``."""
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
