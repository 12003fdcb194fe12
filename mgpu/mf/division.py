"""How matrix factorisation cuts the ratings into blocks for the block scheduler.

Pure functions (no Dask): users and items are shuffled (so that strata are alike, as FPSGD
does), then cut into row and column strata by prefix sums of their rating counts
(:func:`mgpu.partition.split_counts`), and every (row stratum, column stratum) pair with
ratings is a block. Two divisions:

``uniform``
    A g×g grid with g = slots + 1 (FPSGD's rule: a slot that finishes always finds a free
    block), blocks owned round-robin along the diagonals. The ``cpu``, ``gpu`` and ``hsgd``
    modes use it.
``hsgd_star``
    HSGD*'s non-uniform division (Yu, thesis ch. 3). With n_g GPU slots, n_c CPU slots and
    the GPUs' share α of the ratings: the first users of the shuffled order holding α of the
    ratings form R_g, cut into n_g row groups (one per GPU, whose blocks it owns: the static
    phase keeps each GPU on its own users) and each group into ⌈(n_g + n_c)/n_g⌉ sub-rows; the
    other users form R_c, cut into n_c + n_g rows owned round-robin by the CPU slots; the items
    are cut into n_c + 2·n_g + 1 columns. That is at least (n_c + n_g + 1) × (n_c + n_g) blocks
    (Rule 1), so a slot that runs dry can still find a block sharing no stratum with the
    n_c + n_g − 1 others running.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mgpu.partition import split_counts
from mgpu.sched import Block

__all__ = ["Division", "columns", "hsgd_star", "move_rows", "uniform"]


@dataclass(frozen=True)
class Division:
    """Strata of users and items, and the blocks they make.

    ``user_stratum[u]`` and ``item_stratum[i]`` give each user's row stratum and each item's
    column stratum; ``blocks`` lists the non-empty (row, column) pairs with their number of
    ratings (``size``) and owning slot; ``row_kind[r]`` is "gpu" for a row of R_g and "cpu"
    otherwise (all "cpu" for the uniform grid); ``alpha`` is the share of the ratings in R_g
    (nan for the uniform grid, which splits nothing by kind).
    """

    user_stratum: np.ndarray
    item_stratum: np.ndarray
    n_rows: int
    n_cols: int
    blocks: tuple[Block, ...]
    row_kind: tuple[str, ...]
    alpha: float

    def block_of(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """The block id (row · n_cols + column) of each rating."""
        return (self.user_stratum[users].astype(np.int64) * self.n_cols
                + self.item_stratum[items])


def _strata(counts: np.ndarray, perm: np.ndarray, cuts: list[int]) -> np.ndarray:
    """Stratum of every element: ``perm`` is the shuffled order, ``cuts`` the part bounds in it."""
    out = np.empty(counts.shape[0], dtype=np.int32)
    for s in range(len(cuts) - 1):
        out[perm[cuts[s]:cuts[s + 1]]] = s
    return out


def _sizes(user_stratum: np.ndarray, item_stratum: np.ndarray, users: np.ndarray,
           items: np.ndarray, n_rows: int, n_cols: int) -> np.ndarray:
    ids = user_stratum[users].astype(np.int64) * n_cols + item_stratum[items]
    return np.bincount(ids, minlength=n_rows * n_cols)


def _check(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int) -> None:
    if users.shape != items.shape or users.ndim != 1:
        raise ValueError("users and items must be one-dimensional and of one length.")
    for name, idx, n in (("users", users, n_users), ("items", items, n_items)):
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{name} must lie in [0, {n}); got values from {idx.min()} to "
                             f"{idx.max()}.")


def uniform(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int, n_slots: int,
            rng: np.random.Generator) -> Division:
    """FPSGD's grid: (n_slots + 1) strata of shuffled users and of shuffled items, cut at
    equal rating counts; block (a, b) owned by slot (a + b) mod n_slots.

    >>> rng = np.random.default_rng(0)
    >>> d = uniform(np.arange(6) % 3, np.arange(6) % 2, 3, 2, 1, rng)
    >>> d.n_rows, d.n_cols, sum(b.size for b in d.blocks)
    (2, 2, 6.0)
    """
    if n_slots < 1:
        raise ValueError(f"n_slots must be >= 1. Got {n_slots}.")
    _check(users, items, n_users, n_items)
    g = n_slots + 1
    uc = np.bincount(users, minlength=n_users)
    ic = np.bincount(items, minlength=n_items)
    pu, pi = rng.permutation(n_users), rng.permutation(n_items)
    us = _strata(uc, pu, list(split_counts(uc[pu], g)))
    it = _strata(ic, pi, list(split_counts(ic[pi], g)))
    sizes = _sizes(us, it, users, items, g, g)
    blocks = tuple(Block(a * g + b, a, b, size=float(sizes[a * g + b]), owner=(a + b) % n_slots)
                   for a in range(g) for b in range(g) if sizes[a * g + b])
    return Division(us, it, g, g, blocks, ("cpu",) * g, float("nan"))


def columns(n_gpus: int, n_cpus: int) -> int:
    """The column strata of HSGD*'s division on these slots: n_c + 2·n_g + 1 (n_c + 1 with
    CPU slots alone).

    >>> columns(1, 12), columns(1, 0), columns(0, 4)
    (15, 3, 5)
    """
    return n_cpus + 2 * n_gpus + 1


def hsgd_star(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int, alpha: float,
              n_gpus: int, n_cpus: int, rng: np.random.Generator) -> Division:
    """HSGD*'s non-uniform division (module docstring); slots 0 … n_gpus − 1 are the GPUs,
    n_gpus … n_gpus + n_cpus − 1 the CPU slots.

    >>> rng = np.random.default_rng(0)
    >>> u, i = rng.integers(0, 200, 5000), rng.integers(0, 100, 5000)
    >>> d = hsgd_star(u, i, 200, 100, 0.6, n_gpus=1, n_cpus=2, rng=rng)
    >>> d.n_rows, d.n_cols  # 1 GPU row × 3 sub-rows + 3 CPU rows; 2 + 2 + 1 columns
    (6, 5)
    >>> round(sum(b.size for b in d.blocks if d.row_kind[b.row] == "gpu") / 5000, 1)
    0.6
    """
    if n_gpus < 0 or n_cpus < 0 or n_gpus + n_cpus < 1:
        raise ValueError(f"hsgd_star needs at least one slot; got {n_gpus} GPU and {n_cpus} "
                         "CPU slot(s).")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1]. Got {alpha}.")
    _check(users, items, n_users, n_items)
    alpha = 0.0 if n_gpus == 0 else (1.0 if n_cpus == 0 else float(alpha))
    uc = np.bincount(users, minlength=n_users)
    ic = np.bincount(items, minlength=n_items)
    pu, pi = rng.permutation(n_users), rng.permutation(n_items)
    cum = np.cumsum(uc[pu])
    # R_g: the shortest prefix of shuffled users holding at least α of the ratings
    cut = 0
    if alpha > 0.0 and cum.size:
        cut = min(int(np.searchsorted(cum, alpha * cum[-1])) + 1, n_users)
    cuts = [0]
    sub = math.ceil((n_gpus + n_cpus) / n_gpus) if n_gpus else 0
    if n_gpus:
        groups = split_counts(uc[pu[:cut]], n_gpus)
        for j in range(n_gpus):
            lo, hi = int(groups[j]), int(groups[j + 1])
            cuts.extend(lo + int(x) for x in split_counts(uc[pu[lo:hi]], sub)[1:])
    n_cpu_rows = n_cpus + n_gpus if n_cpus else 0
    if n_cpu_rows:
        cuts.extend(cut + int(x) for x in split_counts(uc[pu[cut:]], n_cpu_rows)[1:])
    n_rows = len(cuts) - 1
    n_cols = columns(n_gpus, n_cpus)
    us = _strata(uc, pu, cuts)
    it = _strata(ic, pi, list(split_counts(ic[pi], n_cols)))
    n_gpu_rows = n_gpus * sub
    kinds = ("gpu",) * n_gpu_rows + ("cpu",) * n_cpu_rows

    def owner(r: int) -> int:
        return r // sub if r < n_gpu_rows else n_gpus + (r - n_gpu_rows) % n_cpus

    sizes = _sizes(us, it, users, items, n_rows, n_cols)
    blocks = tuple(Block(a * n_cols + b, a, b, size=float(sizes[a * n_cols + b]), owner=owner(a))
                   for a in range(n_rows) for b in range(n_cols) if sizes[a * n_cols + b])
    got = float(sum(b.size for b in blocks if kinds[b.row] == "gpu")) / max(users.size, 1)
    return Division(us, it, n_rows, n_cols, blocks, kinds, got)


def move_rows(blocks: Sequence[Block], slot_kinds: Sequence[str], alpha: float
              ) -> tuple[Block, ...]:
    """The blocks with whole rows handed between GPU and CPU slots, so that the GPUs' share
    of the ratings comes as close to ``alpha`` as whole rows allow (no ratings move between
    strata: only who runs a row's blocks).

    Each GPU slot aims at ``alpha / n_gpus`` of the ratings. One over it hands its last rows,
    one at a time while that brings it closer, each block of the row to the CPU slot with the
    least ratings then (a GPU runs a row's blocks of a column in one task; CPU slots take
    blocks one at a time, so a row spread over them keeps them even). One under it takes,
    the same way, the CPU row that brings it closest, every block of it. A GPU keeps at
    least one row and the CPU slots together one. ``slot_kinds[s]`` is "gpu" or "cpu" for
    slot s; without both kinds the blocks come back as they were.

    >>> from mgpu.sched import Block
    >>> b = [Block(0, 0, 0, 30.0, 0), Block(1, 1, 0, 30.0, 0), Block(2, 2, 0, 20.0, 1),
    ...      Block(3, 2, 1, 20.0, 2)]
    >>> [x.owner for x in move_rows(b, ["gpu", "cpu", "cpu"], 0.3)]  # 0.6 -> 0.3
    [0, 1, 1, 2]
    >>> [x.owner for x in move_rows(b, ["gpu", "cpu", "cpu"], 1.0)]  # the last CPU row stays
    [0, 0, 1, 2]
    """
    gpus = [s for s, k in enumerate(slot_kinds) if k == "gpu"]
    cpus = [s for s, k in enumerate(slot_kinds) if k == "cpu"]
    total = float(sum(b.size for b in blocks))
    if not gpus or not cpus or total <= 0.0:
        return tuple(blocks)
    owner = {b.id: b.owner for b in blocks}
    by_row: dict[int, list[Block]] = {}
    for b in blocks:
        by_row.setdefault(b.row, []).append(b)
    gpu_of: dict[int, int | None] = {}  # row -> its GPU, or None for a CPU row
    for r, row in by_row.items():
        got = {b.owner for b in row}
        kinds = {slot_kinds[o] for o in got}
        if len(kinds) > 1 or (kinds == {"gpu"} and len(got) > 1):
            raise ValueError(f"Row {r} has blocks of more than one GPU or of both kinds; "
                             "move_rows hands whole rows.")
        gpu_of[r] = next(iter(got)) if kinds == {"gpu"} else None
    size = {r: float(sum(b.size for b in row)) for r, row in by_row.items()}
    load = dict.fromkeys(range(len(slot_kinds)), 0.0)
    for b in blocks:
        load[b.owner] += b.size

    def rows_of(g: int | None) -> list[int]:
        return sorted(r for r, x in gpu_of.items() if x == g)

    target = float(alpha) * total / len(gpus)
    for g in gpus:
        while load[g] > target and len(rows_of(g)) > 1:
            r = rows_of(g)[-1]  # its last sub-row
            if abs(load[g] - size[r] - target) >= abs(load[g] - target):
                break
            for b in sorted(by_row[r], key=lambda b: (-b.size, b.id)):
                to = min(cpus, key=lambda s: (load[s], s))
                load[g] -= b.size
                load[to] += b.size
                owner[b.id] = to
            gpu_of[r] = None
        while load[g] < target and len(rows_of(None)) > 1:
            r = min(rows_of(None), key=lambda x: (abs(load[g] + size[x] - target), x))
            if abs(load[g] + size[r] - target) >= abs(load[g] - target):
                break
            for b in by_row[r]:
                load[owner[b.id]] -= b.size
                load[g] += b.size
                owner[b.id] = g
            gpu_of[r] = g
    return tuple(b if b.owner == owner[b.id] else replace(b, owner=owner[b.id])
                 for b in blocks)
