"""Where the public ops send dask arrays.

The distributed versions live in :mod:`mgpu.distributed`, a layer above the ops, which
registers them here when it is imported (``import mgpu`` imports it). An op that receives a
dask array asks :func:`route` for its distributed version, so dask in gives dask out without
the ops importing the layer above them (``tests/test_layers.py``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register", "route"]

_ROUTES: dict[str, Callable[..., Any]] = {}


def register(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``func`` is the version of op ``name`` for dask arrays."""
    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        _ROUTES[name] = func
        return func
    return deco


def route(name: str) -> Callable[..., Any]:
    """The version of op ``name`` for dask arrays.

    >>> route("no such op")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: no such op got a dask array; its distributed version comes with mgpu.distri...
    """
    try:
        return _ROUTES[name]
    except KeyError:
        raise TypeError(f"{name} got a dask array; its distributed version comes with "
                        "mgpu.distributed: import mgpu (or mgpu.distributed) first.") from None
