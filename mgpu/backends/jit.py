"""numba's ``njit`` with its on-disk cache, wherever numba can keep one.

A kernel compiled with ``cache=True`` is compiled once per machine and numba version, not in
every process: without it the first call of every run (the first epoch of a factorisation,
the first SpMV of a benchmark) pays the compilation, about half a second a kernel, and
whoever times it counts that as work.

numba writes the cache beside the source (``__pycache__``), or, where the package is
installed read-only, under the user's cache folder (``NUMBA_CACHE_DIR`` chooses another).
Where it can write nowhere it refuses ``cache=True`` at import; :func:`njit` then compiles
in memory as before, and says so at INFO.

A kernel that reads module-level constants of *another* module must not be cached: numba
checks only the defining file for changes, so a cache would keep the old values.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numba

__all__ = ["njit"]

logger = logging.getLogger(__name__)


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)``, or without the cache where numba has nowhere
    to keep it.

    >>> @njit(nogil=True)
    ... def twice(x):
    ...     return 2 * x
    >>> twice(21)
    42
    """
    def wrap(f: Callable[..., Any]) -> Any:
        try:
            return numba.njit(cache=True, **options)(f)
        except RuntimeError as exc:  # "cannot cache function ...: no locator available"
            logger.info("numba cannot cache %s (%s); it is compiled in each process",
                        f.__qualname__, exc)
            return numba.njit(**options)(f)

    return wrap
