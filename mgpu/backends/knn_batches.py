"""How a kNN call on one GPU cuts its queries into kernel launches (pure: no CuPy).

The fused kernel of ``kernels/knn.cu`` runs a 2-D grid: along x, blocks of warps that take
index rows from a counter; along y, groups of queries (``width`` each, at most 32 per lane
slot of a warp). A launch holds as many groups as the working memory allows, so that a
small index answers its whole query set in one launch instead of one launch per 128
queries, whose fixed cost (the launch, the query block, the selection, the copies out) was
most of the time.

A group's dense query block (features × width) is what the warps read for every index
nonzero, so it is kept in half the L2 together with the other groups resident beside it
(the blocks are dispatched in order, so about ``resident blocks / blocks along x`` groups
run at once).

Each query either keeps per-warp lists of its k best (k candidates per warp leave the
kernel) or has every key written (a query × index-row tile): the tile when the lists would
hold about as many entries as the index has rows, as they do on small indexes.
"""
from __future__ import annotations

from dataclasses import dataclass

THREADS = 256  # threads of a fused-kernel block
WARPS_PER_BLOCK = THREADS // 32
BLOCKS_PER_SM = 4  # blocks along x per SM at most (the rows run out before more help)
FUSED_KMAX = (16, 128)  # list lengths the fused kernel is built with
MAX_GROUPS = 65535  # CUDA's limit on gridDim.y


def fused_kmax(k: int) -> int:
    """The list length of the fused kernel for k, or 0 for the key-tile form."""
    return next((m for m in FUSED_KMAX if k <= m), 0)


def lane_slots(kmax: int) -> int:
    """Queries a lane owns in the fused kernel (its template M): one with the long lists."""
    return 1 if kmax == 128 else 4


def row_blocks(n_rows: int, sms: int) -> int:
    """Blocks along the index rows: enough to fill the GPU, no more than one warp a row."""
    return max(1, min(sms * BLOCKS_PER_SM, -(-n_rows // WARPS_PER_BLOCK)))


@dataclass(frozen=True)
class KnnBatches:
    """The launches of one kNN call (or of pairwise distances)."""

    per_launch: int  # queries a launch takes (the last takes the rest)
    width: int  # queries of one group (a row of the grid's y axis)
    blocks: int  # blocks along the index rows (grid x); 0 on the cuBLAS path
    kmax: int  # list length of the fused kernel; 0 for the key tile
    tile: bool  # every key written, then selected (else k candidates a warp)
    query_bytes: int  # device bytes one query of a launch takes
    launches: int

    @property
    def groups(self) -> int:
        """Groups of a full launch (grid y)."""
        return -(-self.per_launch // self.width) if self.width else 0

    def describe(self) -> str:
        if not self.blocks:
            how = "cuBLAS keys"
        else:
            form = "key tile" if self.tile else f"lists of {self.kmax}"
            how = f"{form}, {self.width} a group, grid {self.blocks}×{self.groups}"
        return f"{self.launches} launch(es) of up to {self.per_launch:,} queries ({how})"


def _launches(n_queries: int, per_launch: int) -> int:
    return -(-n_queries // per_launch) if n_queries else 0


def _whole_warps(nb: int) -> int:
    return nb - nb % 32 if nb > 32 else nb


def plan_fused(n_rows: int, n_features: int, n_queries: int, k: int, itemsize: int, *,
               sms: int, l2_bytes: int, budget: int, keys_out: bool = False) -> KnnBatches:
    """Launches of the fused kernel for ``n_queries`` against an index of ``n_rows`` ×
    ``n_features``: a group's query block within half the L2 (shared with the groups
    resident beside it), a launch's query blocks and candidates (or keys) within ``budget``
    bytes, one query a launch at least. ``keys_out``: the keys go to the caller's array
    (pairwise distances), so only the query block counts; ``k`` is then unused."""
    blocks = row_blocks(n_rows, sms)
    n_warps = blocks * WARPS_PER_BLOCK
    kmax = 0 if keys_out else fused_kmax(k)
    # the lists keep k a warp whatever the rows it saw: where that is the index's size or
    # more, every key written is less to write and to select from
    tile = keys_out or kmax == 0 or n_rows <= n_warps * k
    if tile:
        kmax = 0
    per_query = n_features * itemsize
    if not keys_out:
        per_query += (n_rows * (itemsize + (8 if k > FUSED_KMAX[-1] else 0)) if tile
                      else n_warps * k * (itemsize + 4))
    resident = max(1, -(-sms * BLOCKS_PER_SM // blocks))
    fit_l2 = (l2_bytes // 2) // resident // max(1, n_features * itemsize)
    fit_budget = budget // max(1, per_query)
    group = 32 * lane_slots(kmax)
    width = _whole_warps(int(max(1, min(group, n_queries, fit_l2, fit_budget))))
    groups = max(1, min(MAX_GROUPS, fit_budget // width, -(-n_queries // width)))
    per_launch = max(1, min(n_queries, width * groups))
    return KnnBatches(per_launch, width, blocks, kmax, tile, per_query,
                      _launches(n_queries, per_launch))


def plan_dense(n_rows: int, n_queries: int, k: int, itemsize: int, *,
               budget: int) -> KnnBatches:
    """Launches of the cuBLAS path: each a (queries × index rows) tile of keys within
    ``budget`` (and the sort's int64 order beside it where k exceeds the selection's
    lists), one query a launch at least."""
    per_query = n_rows * (itemsize + (8 if k > FUSED_KMAX[-1] else 0))
    per_launch = int(max(1, min(n_queries, budget // max(1, per_query))))
    return KnnBatches(per_launch, per_launch, 0, fused_kmax(k), True, per_query,
                      _launches(n_queries, per_launch))
