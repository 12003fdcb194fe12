"""GPU side of the SGD block kernel of matrix factorisation (``kernels/sgd.cu``)."""
from __future__ import annotations

import cupy

from mgpu.backends.dispatch import sgd_lookup
from mgpu.backends.cupy import current_facts
from mgpu.backends.instances import INSTANCES, SGD_KPL
from mgpu.backends.loader import c_type, get_function

_SGD = "sgd.cu"
_THREADS = 256
_BLOCKS_PER_SM = 16


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


@sgd_lookup.register(cupy.ndarray)
def sgd_block_gpu(users: cupy.ndarray, items: cupy.ndarray, ratings: cupy.ndarray,
                  P: cupy.ndarray, Q: cupy.ndarray, lr: float, reg_p: float, reg_q: float,
                  order: cupy.ndarray | None = None, conflicts: float | None = None,
                  max_warps: int | None = None) -> None:
    """One pass over the ratings (in ``order``, default as given), P and Q updated in place
    on the GPU (one warp per rating, lock-free between warps as in cuMF_SGD); ``conflicts``
    bounds the warps in flight (:func:`warps_for`)."""
    if order is not None:
        users, items, ratings = users[order], items[order], ratings[order]
    n = int(ratings.shape[0])
    if n == 0:
        return
    if not sgd_is_usable_for(users, items, ratings, P, Q):
        raise ValueError(
            f"The SGD kernel takes float32 or float64 factors and ratings of one dtype, int32 "
            f"ids and 1 <= k <= {32 * SGD_KPL[-1]}. Got P {P.dtype} {P.shape}, Q {Q.dtype} "
            f"{Q.shape}, ratings {ratings.dtype}, ids {users.dtype}/{items.dtype}.")
    k = int(P.shape[1])
    kpl = next(w for w in SGD_KPL if k <= 32 * w)
    expr = f"mgpu_sgd_block<{c_type(P.dtype)}, {kpl}>"
    fn = get_function(_SGD, expr, INSTANCES[_SGD])
    warps = min(warps_for(users, items, P.shape[0], Q.shape[0], conflicts), n,
                max_warps if max_warps is not None and max_warps > 0 else n)
    per_block = min(warps, _THREADS // 32)
    t = P.dtype.type
    fn((-(-warps // per_block),), (32 * per_block,), (
        users, items, ratings, cupy.int64(n), P, Q, cupy.int32(k), t(lr), t(reg_p), t(reg_q)))
