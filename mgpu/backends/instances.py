"""The explicit list of kernel instantiations, per source file in ``kernels/``.

Kept apart from the CuPy backend so that it can be read (and every entry compiled by nvcc
as a check) on a machine without CuPy.
"""
from __future__ import annotations

from mgpu.backends.numpy import ROW_ABS_MAX, ROW_ABS_SUM, ROW_SQ_SUM, ROW_SUM

_FLOATS = ("float", "double")
_INDICES = ("int", "long long")
_VECTOR = {"float": 4, "double": 2}
_LANES = (4, 8, 16, 32)

INSTANCES: dict[str, tuple[str, ...]] = {
    "rows.cu": tuple(
        f"mgpu_row_norms_warp<{t}, {i}, {op}>"
        for t in _FLOATS
        for i in _INDICES
        for op in (ROW_SUM, ROW_ABS_SUM, ROW_SQ_SUM, ROW_ABS_MAX)
    ),
    # W: 1, or the elements of a 16-byte load; V: lanes per nonzero
    "sddmm.cu": tuple(
        f"mgpu_sddmm_csr<{t}, {i}, {w}, {v}>"
        for t in _FLOATS
        for i in _INDICES
        for w in (1, _VECTOR[t])
        for v in _LANES
    ) + tuple(
        f"mgpu_sddmm_tiled<{t}, {w}, {v}, {b}>"
        for t in _FLOATS
        for w in (1, _VECTOR[t])
        for v in _LANES
        for b in ("false", "true")
    ),
    # benchmark probe (float32 factors, as the SDDMM benchmark uses)
    "probe.cu": tuple(
        f"mgpu_gather_rows<float, {i}, {w}, {v}>" for i in _INDICES for w in (1, 4) for v in _LANES
    ),
}
