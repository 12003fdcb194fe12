"""mgpu's settings live in ``dask.config`` under ``mgpu.`` (kebab-case keys).

They are read on the client and passed into tasks as arguments, never read inside a task,
so a worker started with other settings computes the same thing.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.config
import yaml

_FN = Path(__file__).with_name("mgpu.yaml")

with _FN.open() as _f:
    _defaults = yaml.safe_load(_f)

dask.config.update_defaults(_defaults)


def get(key: str, default: Any = None) -> Any:
    """Read ``mgpu.<key>`` from dask.config (``key`` without the ``mgpu.`` prefix)."""
    return dask.config.get(f"mgpu.{key}", default=default)


def get_bytes(key: str, value: Any = None) -> int:
    """``value`` (bytes, or a size such as "256 MiB"), or ``mgpu.<key>`` when it is None."""
    from dask.utils import parse_bytes

    v = get(key) if value is None else value
    return parse_bytes(v) if isinstance(v, str) else int(v)
