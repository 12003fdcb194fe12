"""Constraints on the options of the public operations, with scikit-learn's refusal
(``utils/_param_validation.py``: ``StrOptions``, ``Interval``).

One constraint object per kind of option words its own requirement, so every op refuses a
bad value in the same sentence: "The 'norm' parameter of row_norms must be a str among
{'l1', 'l2'}. Got 'l3' instead." The same checks run for CPU and GPU data: options do not
depend on the device.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np

__all__ = ["Interval", "StrOptions", "check_param"]


class StrOptions:
    """One of a set of strings."""

    def __init__(self, options: Iterable[str]) -> None:
        self.options = frozenset(options)

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.options

    def __str__(self) -> str:
        return f"a str among {{{', '.join(repr(o) for o in sorted(self.options))}}}"


@dataclass(frozen=True)
class Interval:
    """An int (``kind=Integral``) or a real number (``kind=Real``: ints and floats, not NaN)
    between ``left`` and ``right`` (None: unbounded), ``closed`` on 'left', 'right', 'both'
    or 'neither' side. bool is not a number here."""

    kind: type
    left: float | None
    right: float | None
    closed: str = "both"

    def is_satisfied_by(self, value: Any) -> bool:
        types = (int, np.integer) if self.kind is Integral else (int, float, np.integer,
                                                                  np.floating)
        if isinstance(value, bool) or not isinstance(value, types):
            return False
        if self.kind is Real and math.isnan(value):
            return False
        if self.left is not None:
            if value < self.left or value == self.left and self.closed in ("right", "neither"):
                return False
        if self.right is not None:
            if value > self.right or value == self.right and self.closed in ("left", "neither"):
                return False
        return True

    def __str__(self) -> str:
        what = "an int" if self.kind is Integral else "a number"
        lo = ">=" if self.closed in ("left", "both") else ">"
        hi = "<=" if self.closed in ("right", "both") else "<"
        if self.left is not None and self.right is not None:
            return (f"{what} in {'[' if lo == '>=' else '('}{_num(self.left)}, "
                    f"{_num(self.right)}{']' if hi == '<=' else ')'}")
        if self.left is not None:
            return f"{what} {lo} {_num(self.left)}"
        if self.right is not None:
            return f"{what} {hi} {_num(self.right)}"
        return what


def _num(v: float) -> str:
    """A bound as people write it: 1, 50, 1000000, 0.5."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def check_param(value: Any, name: str, func: str, constraint: StrOptions | Interval,
                hint: str = "") -> None:
    """Refuse ``value`` for parameter ``name`` of ``func`` unless it satisfies
    ``constraint``; ``hint`` (" (the index has 6 rows)") follows the requirement.

    >>> check_param(0, "k", "knn", Interval(Integral, 1, 6))
    Traceback (most recent call last):
    ...
    ValueError: The 'k' parameter of knn must be an int in [1, 6]. Got 0 instead.
    """
    if not constraint.is_satisfied_by(value):
        raise ValueError(f"The '{name}' parameter of {func} must be {constraint}{hint}. Got "
                         f"{value!r} instead.")
