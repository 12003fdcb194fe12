"""Input checks of the public operations, in scikit-learn's words: the options
(``utils/_param_validation.py``: ``StrOptions``, ``Interval``, :func:`check_param`) and the
data (``utils/validation.py``: :func:`check_array`).

One constraint object per kind of option words its own requirement, so every op refuses a
bad value in the same sentence: "The 'norm' parameter of row_norms must be a str among
{'l1', 'l2'}. Got 'l3' instead." The same checks run for CPU and GPU data: options do not
depend on the device; a data argument is refused by the device or family it comes from.

This is the ops layer's API for the layers above (distributed ops, models, matrix
factorisation): they check their inputs with these names.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp

# The NaN/infinity scan and the sparse test live in the backends layer (one per device);
# the ops take them from here.
from mgpu.backends import all_finite, first_nonfinite, is_gpu_array, is_sparse, place_of

__all__ = ["Boolean", "Bytes", "ComplexDataError", "InstanceOf", "Interval", "IsCallable",
           "StrOptions", "all_finite", "as_array", "canonical_csr", "check_array",
           "check_option", "check_param", "first_nonfinite", "float_dtype",
           "is_dask_array", "is_sparse", "place_of", "same_kind"]


class ComplexDataError(TypeError, ValueError):
    """Complex values where real numbers are needed.

    A TypeError, as mgpu refuses every dtype it does not take, and a ValueError, as
    scikit-learn's ``check_array`` refuses complex data (its estimator checks expect one):
    either ``except`` clause catches it. scikit-learn's ``NotFittedError`` is both a
    ValueError and an AttributeError for the same reason.
    """


class StrOptions:
    """One of a set of strings.

    >>> str(StrOptions({"l2", "l1"}))
    "a str among {'l1', 'l2'}"
    >>> StrOptions({"l2"}).is_satisfied_by("l3")
    False
    """

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
    or 'neither' side. bool is not a number here.

    >>> from numbers import Integral, Real
    >>> str(Interval(Integral, 1, None)), str(Interval(Real, 0, 1, closed="neither"))
    ('an int >= 1', 'a number in (0, 1)')
    >>> Interval(Integral, 1, None).is_satisfied_by(True)
    False
    """

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


class Boolean:
    """A bool (Python's or numpy's), not a truthy stand-in such as "no" or 0.

    >>> Boolean().is_satisfied_by(np.True_), Boolean().is_satisfied_by("no")
    (True, False)
    """

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, (bool, np.bool_))

    def __str__(self) -> str:
        return "a bool"


class IsCallable:
    """A callable (a progress or callback hook)."""

    def is_satisfied_by(self, value: Any) -> bool:
        return callable(value)

    def __str__(self) -> str:
        return "a callable"


class InstanceOf:
    """An instance of one of ``types``, named in the refusal as ``words``.

    >>> str(InstanceOf((str,), "a str"))
    'a str'
    """

    def __init__(self, types: tuple[type, ...], words: str) -> None:
        self.types, self.words = types, words

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, self.types) and not (
            isinstance(value, bool) and bool not in self.types)

    def __str__(self) -> str:
        return self.words


class MatchesPattern:
    """A str that matches ``pattern`` whole, named in the refusal as ``words``.

    >>> MatchesPattern(r"[a-z]+", "a word").is_satisfied_by("gap-1")
    False
    """

    def __init__(self, pattern: str, words: str) -> None:
        import re

        self.pattern, self.words = re.compile(pattern), words

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, str) and self.pattern.fullmatch(value) is not None

    def __str__(self) -> str:
        return self.words


class Bytes:
    """A memory size: a finite number of bytes >= 1 (floats are truncated, as int() does), or
    a str Dask reads as one ('2GB', '512 MiB').

    >>> Bytes().is_satisfied_by("2GB"), Bytes().is_satisfied_by("lots")
    (True, False)
    """

    def is_satisfied_by(self, value: Any) -> bool:
        if isinstance(value, str):
            from dask.utils import parse_bytes

            try:
                return parse_bytes(value) >= 1
            except (ValueError, TypeError):
                return False
        return Interval(Real, 1, None).is_satisfied_by(value) and math.isfinite(value)

    def __str__(self) -> str:
        return "a number of bytes >= 1 or a size such as '2GB'"


Constraint = Any  # StrOptions | Interval | Boolean | IsCallable | InstanceOf | None


def check_param(value: Any, name: str, func: str, constraint: Constraint | list[Constraint],
                hint: str = "") -> None:
    """Refuse ``value`` for parameter ``name`` of ``func`` unless it satisfies
    ``constraint`` (or one of a list of them; None in the list takes None); ``hint``
    (" (the index has 6 rows)") follows the requirement.

    >>> check_param(0, "k", "knn", Interval(Integral, 1, 6))
    Traceback (most recent call last):
    ...
    ValueError: The 'k' parameter of knn must be an int in [1, 6]. Got 0 instead.
    >>> check_param(3, "progress", "knn", [IsCallable(), None])
    Traceback (most recent call last):
    ...
    ValueError: The 'progress' parameter of knn must be a callable or None. Got 3 instead.
    """
    constraints = constraint if isinstance(constraint, list) else [constraint]
    if any(value is None if c is None else c.is_satisfied_by(value) for c in constraints):
        return
    words = ["None" if c is None else str(c) for c in constraints]
    need = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    raise ValueError(f"The '{name}' parameter of {func} must be {need}{hint}. Got {value!r} "
                     "instead.")


def check_option(name: str, func: str, value: Any, options: Iterable[str]) -> None:
    """Refuse a string option that is not one of ``options``.

    >>> check_option("norm", "row_norms", "l3", ["l1", "l2"])
    Traceback (most recent call last):
    ...
    ValueError: The 'norm' parameter of row_norms must be a str among {'l1', 'l2'}.
    Got 'l3' instead.
    """
    check_param(value, name, func, StrOptions(options))


def is_dask_array(x: Any) -> bool:
    """Whether x is a dask array (decided without importing dask.array).

    >>> is_dask_array(np.zeros(2))
    False
    """
    return type(x).__module__.startswith("dask.array") and hasattr(x, "dask")


# the families a data argument may come from, as a refusal names them
_FAMILIES = {"numpy": "numpy array", "cupy": "cupy array", "scipy": "scipy sparse matrix",
             "cupyx": "cupyx sparse matrix", "dask": "dask array"}


def _family(x: Any) -> str | None:
    family = _FAMILY_OF_TYPE.get(type(x), False)
    if family is not False:
        return family  # type: ignore[return-value]
    if is_dask_array(x):
        return "dask"
    if sp.issparse(x):
        family = "scipy"
    elif isinstance(x, np.ndarray):
        family = "numpy"
    elif is_gpu_array(x):  # CuPy data is one of the kinds taken (not a choice of device)
        family = "cupyx" if is_sparse(x) else "cupy"
    else:
        family = None
    if len(_FAMILY_OF_TYPE) < 256:  # the tests above look at the type alone
        _FAMILY_OF_TYPE[type(x)] = family
    return family


# the family of the types seen so far (not dask arrays, whose test looks at the instance)
_FAMILY_OF_TYPE: dict[type, str | None] = {}


@functools.lru_cache(maxsize=256)
def _families(accept_sparse: bool, accept_dense: bool, accept_dask: bool,
              devices: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(
        f for f, ok in (("numpy", accept_dense and "cpu" in devices),
                        ("cupy", accept_dense and "gpu" in devices),
                        ("scipy", accept_sparse and "cpu" in devices),
                        ("cupyx", accept_sparse and "gpu" in devices),
                        ("dask", accept_dask)) if ok)


def _kinds_taken(families: tuple[str, ...], ndim: int) -> str:
    """'a 2-D numpy or cupy array, a scipy or cupyx sparse matrix, or a dask array'."""
    dense = [f for f in ("numpy", "cupy") if f in families]
    sparse = [f for f in ("scipy", "cupyx") if f in families]
    parts = []
    if dense:
        parts.append(f"a {ndim}-D {' or '.join(dense)} array")
    if sparse:
        parts.append(f"a {' or '.join(sparse)} sparse matrix")
    if "dask" in families:
        parts.append("a dask array")
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + (", or " if len(parts) > 2 else " or ") + parts[-1]


def check_array(X: Any, name: str, func: str, *, accept_sparse: bool = True,
                accept_dense: bool = True, accept_dask: bool = False,
                devices: Iterable[str] = ("cpu", "gpu"), ndim: int | None = 2,
                dtype_kinds: str = "biuf", ensure_all_finite: bool = False,
                ensure_non_empty: bool = False, order: str | None = None,
                kinds: str | None = None, kinds_hint: str = "", ndim_hint: str = "",
                finite_hint: str = "") -> Any:
    """Refuse a data argument that is not what ``func`` takes; return it (C-ordered when
    ``order='C'``), scikit-learn's ``check_array`` for the families mgpu takes.

    Parameters
    ----------
    X : object
        The argument.
    name, func : str
        The parameter and the function, as the refusal names them.
    accept_sparse, accept_dense, accept_dask : bool
        Whether scipy/cupyx sparse matrices, numpy/cupy arrays and dask arrays are taken.
    devices : iterable of {'cpu', 'gpu'}, default=('cpu', 'gpu')
        The devices whose data is taken: 'cpu' for numpy/scipy, 'gpu' for cupy/cupyx.
        Data of another device is refused by its device.
    ndim : int or None, default=2
        The number of dimensions (None: any).
    dtype_kinds : str, default='biuf'
        numpy dtype kinds taken ('biuf': bool, int, unsigned, float: real numbers).
    ensure_all_finite : bool, default=False
        Refuse NaN and infinity among the values (a sparse matrix's stored ones).
    ensure_non_empty : bool, default=False
        Refuse an argument without rows or columns.
    order : {'C'} or None, default=None
        'C': a dense argument is returned C-contiguous (copied if need be).
    kinds : str, optional
        The words for the kinds taken, in place of the ones made from the families.
    kinds_hint, ndim_hint, finite_hint : str
        What follows the refusal of the kind, of the dimensions, of NaN ("; use mgpu.spmm
        ...").

    Returns
    -------
    X : object
        The argument, unchanged unless ``order`` asked for a copy.

    Raises
    ------
    TypeError
        X is of a family or device not taken, or its dtype is not (complex values: a
        :class:`ComplexDataError`, a ValueError too, as scikit-learn raises).
    ValueError
        X has the wrong number of dimensions, is empty, or holds NaN or infinity.

    Examples
    --------
    >>> check_array(np.ones((2, 3)), "X", "row_norms").shape
    (2, 3)
    >>> check_array([[1.0]], "X", "knn")
    Traceback (most recent call last):
    ...
    TypeError: The 'X' parameter of knn must be a 2-D numpy or cupy array or a scipy or
    cupyx sparse matrix. Got list instead.
    >>> check_array(np.ones(3), "X", "knn")
    Traceback (most recent call last):
    ...
    ValueError: The 'X' parameter of knn must be 2-D. Got shape (3,) instead.
    >>> check_array(np.array([[1.0, np.nan]]), "X", "knn", ensure_all_finite=True)
    Traceback (most recent call last):
    ...
    ValueError: The 'X' parameter of knn holds NaN or infinity (first at row 0, column 1).
    >>> check_array(np.ones((2, 2), dtype=complex), "X", "knn")
    Traceback (most recent call last):
    ...
    mgpu.ops.validation.ComplexDataError: The 'X' parameter of knn must hold real numbers
    (bool, int or float). Got dtype complex128 instead. Complex data not supported: pass
    X.real or abs(X), whichever is meant.
    """
    devices = tuple(devices)
    families = _families(bool(accept_sparse), bool(accept_dense), bool(accept_dask), devices)
    family = _family(X)
    if family not in families:
        if family in ("cupy", "cupyx") and "gpu" not in devices and (
                accept_dense if family == "cupy" else accept_sparse):
            raise TypeError(f"The '{name}' parameter of {func} is on the GPU, and {func} takes "
                            "host data here: pass numpy/scipy.")
        if family in ("numpy", "scipy") and "cpu" not in devices and (
                accept_dense if family == "numpy" else accept_sparse):
            raise TypeError(f"The '{name}' parameter of {func} is on the host, and {func} takes "
                            "GPU data here: pass cupy/cupyx.")
        what = kinds or _kinds_taken(families, ndim or 2)
        raise TypeError(f"The '{name}' parameter of {func} must be {what}. Got "
                        f"{type(X).__name__} instead{kinds_hint}.")
    if ndim is not None and len(X.shape) != ndim:
        raise ValueError(f"The '{name}' parameter of {func} must be {ndim}-D. Got shape "
                         f"{tuple(X.shape)} instead{ndim_hint}.")
    if np.dtype(X.dtype).kind not in dtype_kinds:
        what = "real numbers (bool, int or float)" if dtype_kinds == "biuf" else \
            f"values of dtype kinds {dtype_kinds!r}"
        words = (f"The '{name}' parameter of {func} must hold {what}. Got dtype "
                 f"{np.dtype(X.dtype)} instead.")
        if np.dtype(X.dtype).kind == "c":
            raise ComplexDataError(f"{words} Complex data not supported: pass {name}.real or "
                                   f"abs({name}), whichever is meant.")
        raise TypeError(words)
    if ensure_non_empty and 0 in tuple(X.shape):
        raise ValueError(f"The '{name}' parameter of {func} must not be empty. Got shape "
                         f"{tuple(X.shape)} instead.")
    if ensure_all_finite and family != "dask":
        at = first_nonfinite(X)
        if at is not None:
            where = ", ".join(f"{w} {i}" for w, i in zip(("row", "column"), at)) \
                if len(at) <= 2 else f"index {tuple(at)}"
            raise ValueError(f"The '{name}' parameter of {func} holds NaN or infinity (first at "
                             f"{where}){finite_hint}.")
    if order == "C" and family in ("numpy", "cupy") and not X.flags.c_contiguous:
        X = X.copy(order="C")
    return X


def same_kind(out: Any, like: Any) -> Any:
    """A scipy sparse result as the kind of its input: a sparse *array* (``csr_array``) for
    a scipy sparse array, a sparse matrix otherwise (cupyx has matrices only). No copy.

    >>> S = sp.csr_array(np.eye(2))
    >>> type(same_kind(sp.csr_matrix(S), S)).__name__
    'csr_array'
    """
    if isinstance(like, sp.sparray) and isinstance(out, sp.spmatrix):
        return sp.csr_array(out)
    return out


def float_dtype(dtype: Any) -> np.dtype:
    """float32 stays float32, float64 stays float64, everything else computes in float64.

    >>> float_dtype(np.float32), float_dtype(np.int64)
    (dtype('float32'), dtype('float64'))
    """
    dt = np.dtype(dtype)
    return dt if dt in (np.dtype(np.float32), np.dtype(np.float64)) else np.dtype(np.float64)


def canonical_csr(x: Any) -> Any:
    """CSR in float32/float64 with sorted indices and no duplicates (scipy or cupyx).

    Duplicates are summed, as scipy's own arithmetic treats them; the input is never
    modified in place.
    """
    dt = float_dtype(x.dtype)
    out = x.tocsr()
    if out.dtype != dt:
        out = out.astype(dt)  # a new matrix (cupyx's astype takes no copy flag)
    if not out.has_canonical_format:
        if out is x:
            out = out.copy()
        out.sum_duplicates()
    return out


def as_array(X: Any, name: str, func: str) -> Any:
    """X as the kinds mgpu's checks take: numpy, scipy sparse, CuPy, cupyx and dask data as
    given, any other array-like (a list of rows, a DataFrame) through ``np.asarray``, as
    scikit-learn's estimators take it."""
    # mgpu's own kinds (CuPy's included) are checked as they are; only the others convert
    if (isinstance(X, np.ndarray) or sp.issparse(X) or is_gpu_array(X)
            or is_dask_array(X) or X is None):
        return X
    try:
        return np.asarray(X)
    except (TypeError, ValueError) as e:
        raise ValueError(f"The '{name}' parameter of {func} must be a 2-D array of numbers "
                         f"(a list of rows of equal length, say). Got {type(X).__name__} that "
                         f"numpy does not read as one: {e}.") from None
