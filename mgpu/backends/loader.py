"""The one loader of CUDA kernels: ``kernels/*.cu`` compiled at run time by CuPy (NVRTC).

Finds the kernel sources in the installed wheel (``mgpu/_kernels``) or in a source checkout
(``kernels/`` beside the package), inlines local headers (CuPy's cache key hashes only the
source string, so headers passed with ``-I`` would go stale), compiles each file once per
device with ``cupy.RawModule(..., name_expressions=[...])`` and memoises the module.

Importing this module does not import CuPy; only :func:`get_function` does.
"""
from __future__ import annotations

import functools
import re
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["C_TYPES", "c_type", "get_function", "kernel_dir", "read_source"]

# The one dtype -> C name table of every kernel instantiation.
C_TYPES: dict[np.dtype, str] = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
}

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.MULTILINE)
_NVRTC_OPTIONS = ("-std=c++17",)
_lock = threading.Lock()
_modules: dict[tuple, Any] = {}
_functions: dict[tuple, Any] = {}  # (file, expression, device) -> kernel


def c_type(dtype: Any) -> str:
    """C++ name of a dtype in kernel instantiations (float, double, int, long long)."""
    dt = np.dtype(dtype)
    try:
        return C_TYPES[dt]
    except KeyError:
        raise TypeError(
            f"No kernel instantiation for dtype {dt}; supported: "
            f"{sorted(str(k) for k in C_TYPES)}."
        ) from None


def kernel_dir() -> Path:
    """Folder of the kernel sources: the wheel's copy first, then the source checkout's."""
    here = Path(__file__).resolve().parent.parent  # .../mgpu
    candidates = (here / "_kernels", here.parent / "kernels")
    for c in candidates:
        if c.is_dir() and any(c.glob("*.cu")):
            return c
    raise FileNotFoundError(
        "mgpu's CUDA kernel sources were not found; looked in "
        + " and ".join(str(c) for c in candidates)
        + ". Reinstall mgpu (the wheel carries them in mgpu/_kernels)."
    )


@functools.lru_cache(maxsize=None)
def read_source(name: str, directory: str | None = None) -> str:
    """Source text of ``kernels/<name>`` with local ``#include "x.cuh"`` lines inlined.

    Each header is inlined once (later includes of it are dropped, as ``#pragma once``
    would), and ``#pragma once`` itself is removed since NVRTC sees one translation unit.
    """
    root = Path(directory) if directory is not None else kernel_dir()
    seen: set[str] = set()

    def expand(fname: str, chain: tuple[str, ...]) -> str:
        path = root / fname
        if not path.is_file():
            where = f" (included from {chain[-1]})" if chain else ""
            raise FileNotFoundError(f"kernel source {path} not found{where}")
        text = path.read_text()
        text = re.sub(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", "", text, flags=re.MULTILINE)

        def sub(m: re.Match[str]) -> str:
            inc = m.group(1)
            if inc in seen:
                return f"// {inc} already inlined"
            seen.add(inc)
            return f"// begin {inc}\n{expand(inc, chain + (fname,))}\n// end {inc}"

        return _INCLUDE.sub(sub, text)

    return expand(name, ())


def get_function(name: str, expression: str, name_expressions: tuple[str, ...]) -> Any:
    """A compiled kernel of ``kernels/<name>`` for the current device.

    Parameters
    ----------
    name : str
        Source file in ``kernels/``, e.g. ``"rows.cu"``.
    expression : str
        The instantiation to return, e.g. ``"mgpu_row_norms_warp<float, int, 2>"``; it must
        be one of ``name_expressions``.
    name_expressions : tuple of str
        Every instantiation the file is compiled with (the file's explicit list); the module
        is compiled once per (file, list, device) and memoised.
    """
    loaded = sys.modules.get("cupy")
    if loaded is not None:  # only declared instantiations are cached: no scan of the list
        fn = _functions.get((name, expression, loaded.cuda.runtime.getDevice()))
        if fn is not None:  # launches of small problems are host-bound: no lookups past this
            return fn
    if expression not in name_expressions:
        raise ValueError(f"{expression!r} is not among the instantiations of {name}")
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    key = (name, name_expressions, dev)
    mod = _modules.get(key)
    if mod is None:
        with _lock:
            mod = _modules.get(key)
            if mod is None:
                mod = cupy.RawModule(
                    code=read_source(name),
                    options=_NVRTC_OPTIONS,
                    name_expressions=list(name_expressions),
                )
                mod.compile()
                _modules[key] = mod
    fn = mod.get_function(expression)
    _functions[(name, expression, dev)] = fn
    return fn
