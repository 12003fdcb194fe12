"""The wavefront schedule of a GPU block's SGD: updates that never race, by construction.

Lock-free SGD with every warp of a GPU in flight (cuMF_SGD's Hogwild) loses the updates that
collide on a busy user or item; bounding the warps in flight to avoid that (the old
``mgpu.mf.gpu-conflicts``) leaves most of the GPU idle. The wavefront scheme of cuMF_SGD
(Xie et al., HPDC 2017) avoids the collisions instead:

- a block's users are cut into G row groups and its items into G column groups, each group
  about n/G ratings (prefix sums of the degrees, users and items shuffled first), so the
  ratings fall into a G × G grid of sub-blocks;
- a pass runs G steps; at step j, row group a takes the sub-block (a, (a + d_j) mod G), with
  the diagonals d a permutation of 0..G-1 drawn per pass from the seed. No two sub-blocks of
  a step share a row group or a column group, so no two warps ever update one user or item;
- a warp owns its row groups for the whole pass and waits, before a step, only for the one
  row group that held its column group the step before (a flag per row group): a wavefront,
  not a barrier, so a long sub-block delays only those that need its items;
- within a sub-block a warp visits the ratings by item, then user (the busiest items' runs
  keep their factor row in registers).

The order of every update is fixed by the schedule and the seed, so the result is
deterministic and equals one sequential pass in :func:`pass_order`; how many warps run it
changes nothing but the time. The schedule is built once per block (:func:`build_schedule`,
on the host or the device, numpy or CuPy alike) and reused by every pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mgpu.backends import array_module, to_host

__all__ = ["AUTO_GROUPS", "MIN_PER_BLOCK", "MAX_GROUPS", "SCHEMES", "WaveSchedule",
           "build_schedule", "check_scheme", "pass_order", "wave_groups"]

SCHEMES = {
    "wavefront": "no two warps ever update one user or item: the block's G × G grid run "
                 "in shuffled diagonals, a warp per row group (deterministic)",
    "hogwild": "lock-free, one warp per rating, the warps in flight bounded by "
               "mgpu.mf.gpu-conflicts (cuMF_SGD's Hogwild; the old default)",
}
"""How a GPU runs a block's SGD pass (``mgpu.mf.gpu-scheme``)."""

MIN_PER_BLOCK = 16
"""Mean ratings per sub-block the grid aims at. A step costs a warp a fixed few microseconds
(the flag's wait and fence, the ring of the next ratings' rows filled once: about one memory
round trip; about 2.5 µs on an H100, from the pass times of G = 1024 and 2048) and each
rating of a chain a fraction of one (kernels/sgd.cu), so a pass of N ratings over G groups
(G warps) takes about G·o + (N/G)·t, least where a sub-block holds N/G² = o/t ratings."""

AUTO_GROUPS = 2048
"""At most this many groups where the shape chooses. A pass cannot be shorter than its
heaviest column group's ratings one after another (their updates may not overlap), and each
step adds a fixed cost to that chain; with busy ids alone in their groups, the busiest one
bounds G further (:func:`wave_groups`). Every warp of a pass must be resident at once: the
kernel at k <= 128 in float32 with 8 ratings in flight (the default) takes about 118
registers a thread and 18 KB of shared memory a block of two warps, so an SM holds 16 of its
warps (2,112 on a 132-SM H100), and 2048 fits any GPU of 128 or more SMs; more groups than
resident warps give some warps two row groups a step, which cost little (G = 4096 on 2,112
warps). The
shape alone chooses G (not the device), so that a CPU and a GPU run one schedule."""

MAX_GROUPS = 4096
"""At most this many groups asked for: the offsets of G² sub-blocks stay within 128 MiB."""


@dataclass
class WaveSchedule:
    """A block's wavefront schedule: its ratings sorted by sub-block (row group, column
    group), then item, then user; ``offsets[a * groups + c]`` is where sub-block (a, c)
    starts and ``size`` the ratings it covers. ``passes`` counts the passes run (each
    draws its diagonals from ``seed`` and its number)."""

    groups: int
    offsets: Any  # int64 array of groups² + 1, on the host (numpy) or the device (CuPy)
    seed: int
    size: int = field(default=0)
    passes: int = field(default=0)

    def diagonals(self, epoch: int) -> np.ndarray:
        """The diagonals of pass ``epoch``: step j runs sub-blocks (a, (a + d[j]) mod G).

        >>> WaveSchedule(4, np.zeros(17, dtype=np.int64), 0).diagonals(0).tolist()
        [2, 0, 1, 3]
        """
        rng = np.random.default_rng([self.seed, epoch])
        return rng.permutation(self.groups).astype(np.int32)


def check_scheme(scheme: Any) -> str:
    """``scheme`` if it names one of :data:`SCHEMES`, else ValueError saying which do.

    >>> check_scheme("wavefront")
    'wavefront'
    """
    if scheme not in SCHEMES:
        names = ", ".join(map(repr, sorted(SCHEMES)))
        raise ValueError(f"The 'mgpu.mf.gpu-scheme' setting must be one of {{{names}}}. Got "
                         f"{scheme!r} instead.")
    return str(scheme)


def wave_groups(n_ratings: int, users_rated: int, items_rated: int,
                busiest: int = 0) -> int:
    """G, from the block's shape: about :data:`MIN_PER_BLOCK` ratings per sub-block, no
    more groups than users or items that have ratings (an empty group would only wait), at
    most :data:`AUTO_GROUPS`, at least 1 (one warp: the sequential pass); and, where the
    busiest user or item has ``busiest`` ratings, no more than ``2 · n_ratings / busiest``:
    that id's group is its chain whatever G (it has one of its own, see build_schedule), and
    with n / G at most half of it no other group is longer (the others' ids each have fewer
    than n / G ratings, so a group holds under 2n / G), so more groups would only add steps
    to the chain (`mgpu bench sgd --groups`, Netflix's shape, H100: 1.78 G updates/s at the
    shape's G = 789, 1.61 at 2048; with the kernel before, 1.44 at 768, 1.43 at 1024 and
    1.19 at 512, where a group of lesser items outgrew the busiest item).

    >>> wave_groups(100_000_000, 480_189, 17_770), wave_groups(22_000, 335, 4_500)
    (2048, 37)
    >>> wave_groups(100_000_000, 480_189, 17_770, busiest=253_793)
    789
    >>> wave_groups(5, 1, 5)
    1
    """
    want = math.isqrt(max(int(n_ratings), 0) // MIN_PER_BLOCK)
    if busiest > 0:
        want = min(want, -(-2 * int(n_ratings) // int(busiest)))
    return int(max(1, min(want, int(users_rated), int(items_rated), AUTO_GROUPS)))


_ONE_KEY = 2 ** 62  # sort keys (cell, item, user) packed in one int64 below this


def _groups_of(ids: Any, n: int, groups: int, n_ratings: int, perm: Any, xp: Any) -> Any:
    """Each id's group: ids in the order ``perm``, but those of at least n_ratings / groups
    ratings first, cut where the prefix sum of their degrees crosses a multiple of
    n_ratings / groups. So such a busy id has a group of its own: its ratings, one after
    another, are the least its group's chain can be, and no other id's lengthen it (with
    ``perm`` alone, the ids before it in its group did: 15,000 ratings, 6%, on the busiest
    item's group of Netflix's shape at G = 2048: 268,892 ratings against its 253,793)."""
    degree = xp.bincount(ids, minlength=n)[perm]
    busy = degree * groups >= max(n_ratings, 1)
    first = xp.concatenate([xp.flatnonzero(busy), xp.flatnonzero(~busy)])
    perm, degree = perm[first], degree[first]
    before = xp.cumsum(degree) - degree
    group = xp.empty(n, dtype=xp.int64)
    group[perm] = xp.minimum(before * groups // max(n_ratings, 1), groups - 1)
    return group


def build_schedule(users: Any, items: Any, n_users: int, n_items: int, *, seed: int,
                   groups: int | None = None) -> tuple[Any, WaveSchedule]:
    """A block's wavefront schedule and the order that sorts its ratings into it.

    Parameters
    ----------
    users, items : array of shape (n_ratings,)
        The ratings' user and item ids (numpy, or CuPy to build it on the device), in
        [0, n_users) and [0, n_items).
    n_users, n_items : int
        Rows of the block's user and item factors.
    seed : int
        Shuffles users and items before they are cut into groups, and draws each pass's
        diagonals.
    groups : int, optional
        G; default :func:`wave_groups` of the block's shape.

    Returns
    -------
    order : array of int64, shape (n_ratings,)
        The ratings in the schedule's order: ``users[order]`` etc. are what a pass takes.
    schedule : WaveSchedule
        Its ``offsets`` live where ``users`` does.

    Examples
    --------
    >>> u, i = np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])
    >>> order, s = build_schedule(u, i, 2, 2, seed=0, groups=2)
    >>> s.groups, s.offsets.tolist(), sorted(order.tolist())
    (2, [0, 1, 2, 3, 4], [0, 1, 2, 3])
    """
    xp = array_module(users)
    n = int(users.shape[0])
    if groups is None:
        deg_u, deg_i = (xp.bincount(ids, minlength=m) if n else xp.zeros(1, dtype=xp.int64)
                        for ids, m in ((users, n_users), (items, n_items)))
        groups = wave_groups(n, int((deg_u > 0).sum()), int((deg_i > 0).sum()),
                             busiest=max(int(deg_u.max()), int(deg_i.max())))
    if not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"The 'groups' parameter of build_schedule must be in [1, "
                         f"{MAX_GROUPS}]. Got {groups!r} instead.")
    rng = np.random.default_rng(seed)
    perm_u, perm_i = (xp.asarray(rng.permutation(m)) for m in (n_users, n_items))
    users = users.astype(xp.int64, copy=False)
    items = items.astype(xp.int64, copy=False)
    row = _groups_of(users, n_users, groups, n, perm_u, xp)
    col = _groups_of(items, n_items, groups, n, perm_i, xp)
    block = row[users] * groups + col[items]
    if groups * groups * max(n_items, 1) * max(n_users, 1) < _ONE_KEY:
        order = xp.argsort((block * n_items + items) * n_users + users)
    else:  # the one key would overflow: sorted on the host, by user within item in block
        host = [to_host(a) for a in (users, items, block)]
        order = xp.asarray(np.lexsort(tuple(host)))
    counts = xp.bincount(block, minlength=groups * groups)
    offsets = xp.zeros(groups * groups + 1, dtype=xp.int64)
    offsets[1:] = xp.cumsum(counts)
    return order.astype(xp.int64, copy=False), WaveSchedule(int(groups), offsets, int(seed), n)


def pass_order(schedule: WaveSchedule, epoch: int) -> np.ndarray:
    """Pass ``epoch`` as one sequential order of the scheduled ratings (positions in the
    schedule's order): steps in turn, the sub-blocks of a step by row group. The GPU's pass
    updates P and Q exactly as this one does, whatever its warps' timing; the CPU runs a
    scheduled block in it.

    >>> s = WaveSchedule(2, np.array([0, 1, 2, 3, 4]), seed=0, size=4)
    >>> s.diagonals(0).tolist(), pass_order(s, 0).tolist()
    ([0, 1], [0, 3, 1, 2])
    """
    G = schedule.groups
    offsets = np.asarray(to_host(schedule.offsets))
    d = schedule.diagonals(epoch).astype(np.int64)
    rows = np.arange(G, dtype=np.int64)
    blocks = (rows[None, :] * G + (rows[None, :] + d[:, None]) % G).ravel()  # step-major
    start, stop = offsets[blocks], offsets[blocks + 1]
    sizes = stop - start
    total = int(sizes.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    # ranges start[b]..stop[b] concatenated: one arange, shifted per range
    shift = np.repeat(start - (np.cumsum(sizes) - sizes), sizes)
    return np.arange(total, dtype=np.int64) + shift
