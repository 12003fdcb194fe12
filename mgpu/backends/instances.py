"""The explicit list of kernel instantiations, per source file in ``kernels/``.

Kept apart from the CuPy backend so that it can be read (and every entry compiled by nvcc
as a check) on a machine without CuPy.
"""
from __future__ import annotations

from mgpu.backends.numpy import ROW_ABS_MAX, ROW_ABS_SUM, ROW_SQ_SUM, ROW_SUM

_FLOATS = ("float", "double")
_INDICES = ("int", "long long")

INSTANCES: dict[str, tuple[str, ...]] = {
    "rows.cu": tuple(
        f"mgpu_row_norms_warp<{t}, {i}, {op}>"
        for t in _FLOATS
        for i in _INDICES
        for op in (ROW_SUM, ROW_ABS_SUM, ROW_SQ_SUM, ROW_ABS_MAX)
    ),
    "sddmm.cu": tuple(f"mgpu_sddmm_warp<{t}, {i}>" for t in _FLOATS for i in _INDICES),
}
