"""How an SDDMM runs on a device: the scheme, its tile sizes, and the tiled copy of S.

The GPU schemes follow cuSDDMM (Nisa et al.):

``csr``
    The virtual-warp kernel straight on CSR: no preprocessing, all of B read through L2.
``sm-l2``
    S's columns cut into panels of width ``Tj``; within a panel, the *active* rows of A (rows
    with a nonzero in the panel) are staged in shared memory a K-slice of ``Tk`` at a time,
    and the panel's rows of B are read through L2, which holds them while the panel lasts.
``sm-sm``
    For dense S (density above :data:`SM_SM_DENSITY`): B's panel is staged in shared memory
    too, so both operands of every dot product come from shared memory.

The model gives the panel width from L2's size and S's density ρ:
``Tj = sqrt(L2 / (c·ρ))`` with ``c = Tk·itemsize`` bytes of B per nonzero and slice, capped
so that the panel's slice of B fills at most half of L2. The slice ``Tk`` is chosen by
measurement over multiples of 32 (see :func:`mgpu.sddmm_plan`), the ``csr`` kernel being
timed beside the tiled ones, and the choice is cached per device and shape class.

This module holds the device-independent part (the model and the tiled layout, written once
for numpy and cupy); the kernels and the tuner live in :mod:`mgpu.backends.cupy`, the public
:func:`mgpu.sddmm_plan` in :mod:`mgpu.ops.sddmm`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "SCHEMES",
    "SM_SM_DENSITY",
    "SDDMMPlan",
    "TileLayout",
    "candidates",
    "panel_width",
    "pattern_key",
    "tile_layout",
]

SCHEMES: dict[str, str] = {
    "csr": "virtual-warp kernel straight on CSR; all of B read through L2",
    "sm-l2": "column panels of width Tj; active rows of A in shared memory, B through L2",
    "sm-sm": "column panels of width Tj; active rows of A and the panel of B in shared memory",
    "cpu": "numba kernel over chunks of nonzeros, float64 accumulation",
}

SM_SM_DENSITY = 0.05
TILE_NNZ = 2048  # nonzeros per tile at most: bounds one block's work on long rows


@dataclass(frozen=True)
class Candidate:
    """One way to run: a scheme and its sizes (``Tj`` columns per panel, ``Tk`` per slice)."""

    scheme: str
    Tj: int
    Tk: int
    ti: int  # active rows per tile (staged in shared memory)

    @property
    def label(self) -> str:
        if self.scheme == "csr":
            return "csr"
        return f"{self.scheme} Tj={self.Tj} Tk={self.Tk} ti={self.ti}"


def panel_width(n_cols: int, density: float, Tk: int, itemsize: int, l2_bytes: int) -> int:
    """The model's panel width ``Tj = sqrt(L2 / (c·ρ))``, ``c = Tk·itemsize``, in [32, n_cols].

    Capped so that the panel's ``Tj × Tk`` slice of B takes at most half of L2.

    >>> panel_width(100_000, 0.0018, 32, 4, 50 * 2**20)
    15084
    >>> panel_width(100_000, 0.0018, 512, 4, 50 * 2**20)
    3771
    >>> panel_width(1_000, 0.0018, 32, 4, 50 * 2**20)
    1000
    """
    if n_cols <= 0:
        return 1
    c = Tk * itemsize
    rho = max(density, 1e-12)
    tj = math.sqrt(l2_bytes / (c * rho))
    tj = min(tj, l2_bytes / 2 / c)
    return int(min(n_cols, max(32, math.floor(tj))))


def candidates(shape: tuple[int, int], nnz: int, K: int, itemsize: int, l2_bytes: int,
               smem_bytes: int) -> list[Candidate]:
    """The ways the tuner times for this problem: ``csr`` and the model's tiled scheme per Tk.

    The tiled scheme is ``sm-sm`` when the density is above :data:`SM_SM_DENSITY`, otherwise
    ``sm-l2``; ``Tk`` runs over the multiples of 32 that are powers of two, up to K rounded up
    to 32, each with the panel width of the model and as many active rows per tile as fit in
    ``smem_bytes`` of shared memory.

    >>> [c.label for c in candidates((300_000, 100_000), 54_000_000, 64, 4, 50 * 2**20, 49152)]
    ['csr', 'sm-l2 Tj=15084 Tk=32 ti=256', 'sm-l2 Tj=10666 Tk=64 ti=192']
    """
    m, n = shape
    out = [Candidate("csr", n, K, 0)]
    if m == 0 or n == 0 or nnz == 0:
        return out
    density = nnz / (m * n)
    k_top = -(-K // 32) * 32
    tk = 32
    while tk <= k_top:
        row_bytes = min(tk, K) * itemsize
        if density > SM_SM_DENSITY:
            # A's active rows and the panel of B share shared memory half and half
            tj = max(1, min(n, smem_bytes // (2 * row_bytes)))
            ti = max(1, min(256, smem_bytes // (2 * row_bytes)))
            out.append(Candidate("sm-sm", tj, tk, ti))
        else:
            tj = panel_width(n, density, tk, itemsize, l2_bytes)
            ti = max(1, min(256, smem_bytes // row_bytes))
            out.append(Candidate("sm-l2", tj, tk, ti))
        tk *= 2
    return out


@dataclass
class TileLayout:
    """S's nonzeros as tiled COO: panel by panel, by row within a panel, cut into tiles.

    Tile ``t`` holds nonzeros ``tile_start[t]:tile_start[t+1]`` (in tile order), all in panel
    ``tile_panel[t]``, on the active rows ``active_rows[tile_row0[t] + local_row]``; their
    columns are ``tile_panel[t]·Tj + local_col``, and ``perm`` maps tile order back to S's
    CSR order (None when the orders agree, as with one panel).
    """

    Tj: int
    ti: int
    n_panels: int
    tile_start: Any
    tile_row0: Any
    tile_panel: Any
    active_rows: Any
    local_row: Any
    local_col: Any
    perm: Any

    @property
    def n_tiles(self) -> int:
        return int(self.tile_start.shape[0]) - 1


def _changes(*keys: Any, xp: Any) -> Any:
    """True where any key differs from the previous element (and at the first)."""
    n = keys[0].shape[0]
    out = xp.zeros(n, dtype=bool)
    if n:
        out[0] = True
        for k in keys:
            out[1:] |= k[1:] != k[:-1]
    return out


def tile_layout(indptr: Any, indices: Any, shape: tuple[int, int], Tj: int, ti: int,
                tile_nnz: int = TILE_NNZ) -> TileLayout:
    """Cut a CSR pattern (numpy or cupy arrays) into the tiles the tiled kernels read.

    Every tile has at most ``ti`` active rows and ``tile_nnz`` nonzeros, and lies within one
    panel of ``Tj`` columns. Indices are int32, so S must have fewer than 2**31 nonzeros and
    rows and columns.
    """
    xp = _namespace(indptr)
    m, n = shape
    nnz = int(indices.shape[0])
    if max(nnz, m, n) >= 2**31:
        raise ValueError("the tiled layout takes fewer than 2**31 nonzeros, rows and columns")
    i32 = xp.int32
    rows = (xp.searchsorted(indptr, xp.arange(nnz, dtype=indptr.dtype), side="right") - 1)
    rows = rows.astype(i32)
    cols = indices.astype(i32)
    n_panels = max(1, -(-n // Tj))
    if n_panels > 1:
        panel = cols // i32(Tj)
        order = xp.argsort(panel.astype(xp.int64) * max(m, 1) + rows)
        perm = order.astype(i32)
        rows, cols, panel = rows[order], cols[order], panel[order]
    else:
        perm = None
        panel = xp.zeros(nnz, dtype=i32)
    new_row = _changes(rows, panel, xp=xp)
    rank = xp.cumsum(new_row, dtype=xp.int64) - 1
    active_rows = rows[new_row]
    first = xp.searchsorted(panel, xp.arange(n_panels, dtype=i32))[panel]
    pos_in_panel = xp.arange(nnz, dtype=xp.int64) - first
    rank_in_panel = rank - rank[first] if nnz else rank
    new_tile = _changes(panel, pos_in_panel // tile_nnz, rank_in_panel // ti, xp=xp)
    starts = xp.flatnonzero(new_tile)
    tile_id = xp.cumsum(new_tile, dtype=xp.int64) - 1
    tile_row0 = rank[starts]
    local_row = (rank - tile_row0[tile_id]).astype(i32)
    tile_panel = panel[starts]
    local_col = cols - tile_panel[tile_id] * i32(Tj)
    tile_start = xp.concatenate([starts, xp.asarray([nnz], dtype=starts.dtype)]).astype(i32)
    return TileLayout(Tj=Tj, ti=ti, n_panels=n_panels, tile_start=tile_start,
                      tile_row0=tile_row0.astype(i32), tile_panel=tile_panel.astype(i32),
                      active_rows=active_rows.astype(i32), local_row=local_row,
                      local_col=local_col.astype(i32), perm=perm)


def pattern_key(S: Any) -> tuple[int, ...]:
    """What ties a plan to S's pattern: shape, nnz and the addresses of its index arrays
    (scipy or cupyx CSR)."""
    def address(a: Any) -> int:
        return a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data

    return (*S.shape, int(S.nnz), address(S.indptr), address(S.indices))


def _namespace(x: Any) -> Any:
    if type(x).__module__.split(".", 1)[0] == "cupy":
        import cupy

        return cupy
    return np


@dataclass(frozen=True)
class SDDMMPlan:
    """How :func:`mgpu.sddmm` runs S on its device: what :func:`mgpu.sddmm_plan` returns.

    Pass it back as ``mgpu.sddmm(S, A, B, plan=plan)`` to reuse the tiled copy of S across
    calls (the factors change, S does not: ALS, LDA). ``timings_ms`` holds what the tuner
    measured per candidate (median milliseconds), empty when the choice came from the cache.
    ``call`` (GPU) is the plan's call with everything but the factors prepared: the launch
    and its packed arguments, the result's index arrays
    (:class:`mgpu.backends.cupy_sddmm_plan.PlannedCall`).
    """

    scheme: str
    device: str
    shape: tuple[int, int]
    nnz: int
    K: int
    dtype: str
    Tj: int
    Tk: int
    ti: int
    lanes: int
    vector: int
    n_panels: int
    l2_bytes: int
    smem_bytes: int
    timings_ms: dict[str, float] = field(default_factory=dict, compare=False)
    layout: TileLayout | None = field(default=None, repr=False, compare=False)
    pattern: tuple[int, ...] = field(default=(), repr=False, compare=False)
    call: Any = field(default=None, repr=False, compare=False)

    @property
    def density(self) -> float:
        m, n = self.shape
        return self.nnz / (m * n) if m and n else 0.0

    def describe(self) -> str:
        """A few lines for people: scheme, sizes and what was measured."""
        m, n = self.shape
        lines = [
            f"SDDMM plan on {self.device}: scheme {self.scheme} ({SCHEMES[self.scheme]})",
            f"  S {m:,}×{n:,}, {self.nnz:,} nonzeros (density {self.density:.3g}), K={self.K},"
            f" {self.dtype}",
        ]
        if self.scheme != "cpu":
            lines.append(
                f"  Tj={self.Tj} ({self.n_panels} panel(s)), Tk={self.Tk}, {self.ti} active rows"
                f" per tile, {self.lanes} lanes per nonzero, {self.vector}-element loads;"
                f" L2 {self.l2_bytes / 2**20:.0f} MiB, {self.smem_bytes // 1024} KiB shared"
                " memory per block"
            )
        for label, ms in self.timings_ms.items():
            lines.append(f"  measured {label}: {ms:.3f} ms")
        return "\n".join(lines)
