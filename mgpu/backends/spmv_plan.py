"""What :func:`mgpu.spmv_plan` returns: A's merge path cut once, for many products.

A merge-path SpMV cuts the merge of A's row ends and nonzeros into equal pieces and finds
where each piece starts by a binary search (on the GPU, the launch's blocks or a search
launch; on the CPU, every piece). An iterative method multiplies the same A thousands of
times, so the plan does that once and keeps it. On the GPU it also leaves out A's empty
rows when there are enough of them to pay (a graph whose vertex ids are sparse, the sinks
of a directed graph): the merge then runs over the non-empty rows alone and the empty rows
are zeroed, a read and a write each instead of a merge item. Imports neither numba nor
CuPy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SpMVPlan"]


@dataclass(frozen=True)
class SpMVPlan:
    """How :func:`mgpu.spmv` runs one A on its device: what :func:`mgpu.spmv_plan` returns.

    Pass it back as ``mgpu.spmv(A, x, plan=plan)`` with that very A (the same CSR matrix
    object's index arrays) and any x.

    Attributes
    ----------
    device : {'cpu', 'gpu'}
    shape, nnz : A's.
    empty_rows : int
        A's rows without a stored entry.
    compacted : bool
        Whether the merge runs over the non-empty rows only (GPU, enough empty rows).
    items : int
        Merge items (rows + nonzeros) per piece (per GPU tile: per thread of 128).
    pieces : int
        Pieces (GPU: tiles) of the merge.
    """

    device: str
    shape: tuple[int, int]
    nnz: int
    empty_rows: int
    compacted: bool
    items: int
    pieces: int
    # rows of the merge consumed before each piece's first item (pieces + 1 of them)
    starts: Any = field(repr=False, compare=False)
    # the compacted A's indptr, its rows' numbers in A and A's empty rows (compacted only)
    indptr: Any = field(default=None, repr=False, compare=False)
    rows: Any = field(default=None, repr=False, compare=False)
    empty: Any = field(default=None, repr=False, compare=False)
    pattern: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def merge_rows(self) -> int:
        """Rows in the merge: A's, or its non-empty ones when compacted."""
        return self.shape[0] - self.empty_rows if self.compacted else self.shape[0]

    def describe(self) -> str:
        """A line for people."""
        m, n = self.shape
        how = (f"its {self.empty_rows:,} empty rows left out of the merge and zeroed"
               if self.compacted else f"{self.empty_rows:,} empty rows in the merge")
        return (f"SpMV plan on the {self.device.upper()}: A {m:,}×{n:,} with {self.nnz:,} "
                f"nonzeros, {self.pieces:,} pieces of {self.items} items"
                f"{' per thread' if self.device == 'gpu' else ''}, {how}")
