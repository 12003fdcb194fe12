"""SDDMM on one device: P = S ∘ (A Bᵀ) on the pattern of a sparse S."""
from __future__ import annotations

from typing import Any

import numpy as np

from mgpu.backends import is_gpu_array, sddmm_lookup, to_host
from mgpu.ops._validate import is_dask_array, is_sparse

__all__ = [
    "check_dense_factor",
    "check_sddmm_shapes",
    "check_sparse",
    "sddmm",
    "sddmm_dtype",
    "sddmm_local",
]


def sddmm_dtype(*dtypes: Any) -> np.dtype:
    """float32 when every operand is float32, float64 otherwise."""
    if all(np.dtype(d) == np.float32 for d in dtypes):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def check_sddmm_shapes(s_shape: tuple[int, ...], a_shape: tuple[int, ...],
                       b_shape: tuple[int, ...]) -> None:
    """Refuse operands whose shapes do not fit S (M×N), A (M×K), B (N×K)."""
    for name, shape in (("S", s_shape), ("A", a_shape), ("B", b_shape)):
        if len(shape) != 2:
            raise ValueError(
                f"The '{name}' parameter of sddmm must be 2-D. Got shape {tuple(shape)} instead."
            )
    m, n = s_shape
    if a_shape[0] != m:
        raise ValueError(
            f"The 'A' parameter of sddmm must have one row per row of S: S is {m}×{n}, so A "
            f"must be {m}×K. Got A of shape {tuple(a_shape)} instead."
        )
    if b_shape[0] != n:
        raise ValueError(
            f"The 'B' parameter of sddmm must have one row per column of S (P = S ∘ A Bᵀ): S "
            f"is {m}×{n}, so B must be {n}×K. Got B of shape {tuple(b_shape)} instead"
            + ("; pass B.T." if tuple(b_shape) == (a_shape[1], n) else ".")
        )
    if a_shape[1] != b_shape[1]:
        raise ValueError(
            f"The 'A' and 'B' parameters of sddmm must have the same number of columns K. Got "
            f"A with {a_shape[1]} and B with {b_shape[1]}."
        )


def check_dense_factor(X: Any, name: str) -> None:
    """Refuse a dense factor that is not a real numpy/cupy matrix or holds NaN/inf."""
    if is_sparse(X) or not (isinstance(X, np.ndarray) or is_gpu_array(X)):
        raise TypeError(
            f"The '{name}' parameter of sddmm must be a dense numpy or cupy array. Got "
            f"{type(X).__name__} instead."
        )
    if np.dtype(X.dtype).kind not in "biuf":
        raise TypeError(f"The '{name}' parameter of sddmm must hold real numbers. Got {X.dtype}.")
    if np.dtype(X.dtype).kind == "f" and X.size:
        bad = ~(np.isfinite(X) if isinstance(X, np.ndarray) else _cupy_isfinite(X))
        if bool(bad.any()):
            r, c = (int(v) for v in np.argwhere(to_host(bad))[0])
            raise ValueError(
                f"The '{name}' parameter of sddmm holds NaN or infinity (first at row {r}, "
                f"column {c}); SDDMM would spread it over S's pattern. Clean the factor first."
            )


def _cupy_isfinite(X: Any) -> Any:
    import cupy

    return cupy.isfinite(X)


def check_sparse(S: Any, hadamard: bool) -> Any:
    """S as CSR (scipy or cupyx) with a float dtype, refusing duplicates and NaN/inf values."""
    if not is_sparse(S):
        raise TypeError(
            f"The 'S' parameter of sddmm must be a scipy or cupyx sparse matrix or a dask array "
            f"of them. Got {type(S).__name__} instead."
        )
    if np.dtype(S.dtype).kind not in "biuf":
        raise TypeError(f"The 'S' parameter of sddmm must hold real numbers. Got {S.dtype}.")
    S = S.tocsr()
    if not S.has_canonical_format:
        dup = _first_duplicate(S)
        if dup is not None:
            i, j, times = dup
            raise ValueError(
                f"The 'S' parameter of sddmm has duplicate entries (row {i}, column {j} is "
                f"stored {times} times), so its pattern is ambiguous; merge them with "
                "S.sum_duplicates() first."
            )
    if hadamard and np.dtype(S.dtype).kind == "f" and S.nnz:
        xp_isfinite = np.isfinite if isinstance(S.data, np.ndarray) else _cupy_isfinite
        bad = ~xp_isfinite(S.data)
        if bool(bad.any()):
            p = int(np.flatnonzero(to_host(bad))[0])
            row = int(np.searchsorted(to_host(S.indptr), p, side="right") - 1)
            raise ValueError(
                f"The 'S' parameter of sddmm holds NaN or infinity (row {row}, column "
                f"{int(to_host(S.indices[p:p + 1])[0])}); clean it, or pass hadamard=False to "
                "use only its pattern."
            )
    return S


def _first_duplicate(S: Any) -> tuple[int, int, int] | None:
    """(row, column, count) of the first repeated coordinate of a CSR matrix, if any."""
    indptr = to_host(S.indptr)
    indices = to_host(S.indices)
    rows = np.repeat(np.arange(S.shape[0], dtype=np.int64), np.diff(indptr))
    key = rows * max(S.shape[1], 1) + indices
    order = np.argsort(key, kind="stable")
    k = key[order]
    same = np.flatnonzero(k[1:] == k[:-1])
    if same.size == 0:
        return None
    first = k[same[0]]
    return int(first // max(S.shape[1], 1)), int(first % max(S.shape[1], 1)), int((k == first).sum())


def sddmm_local(S: Any, A: Any, B: Any, hadamard: bool) -> Any:
    """The kernel call on already-validated CSR S and dense A, B of one family."""
    dt = sddmm_dtype(S.dtype if hadamard else A.dtype, A.dtype, B.dtype)
    if is_gpu_array(S):
        import cupy

        A = cupy.ascontiguousarray(cupy.asarray(A, dtype=dt))
        B = cupy.ascontiguousarray(cupy.asarray(B, dtype=dt))
    else:
        A = np.ascontiguousarray(A, dtype=dt)
        B = np.ascontiguousarray(B, dtype=dt)
    if S.dtype != dt:
        S = S.astype(dt)
    return sddmm_lookup(S, A, B, bool(hadamard))


def sddmm(S: Any, A: Any, B: Any, *, hadamard: bool = True) -> Any:
    """Sampled dense-dense product ``P = S ∘ (A Bᵀ)`` on one CPU or GPU.

    Parameters
    ----------
    S : sparse matrix of shape (n_rows, n_cols)
        scipy (CPU) or cupyx (GPU) sparse matrix, any format; unsorted indices are fine,
        duplicate entries are refused.
    A : ndarray of shape (n_rows, K)
    B : ndarray of shape (n_cols, K)
        Dense factors on the same device as S (numpy with scipy, cupy with cupyx).
    hadamard : bool, default=True
        Multiply by S's values (``P_ij = S_ij ⟨A_i, B_j⟩``); False gives the plain sampled
        product ``⟨A_i, B_j⟩`` on S's pattern, which the ALS and LDA reformulations need.

    Returns
    -------
    P : CSR matrix of shape (n_rows, n_cols)
        S's pattern (in CSR order); float32 when every operand is float32, float64
        otherwise; scipy for CPU input, cupyx for GPU input.

    Raises
    ------
    TypeError
        If an operand is of the wrong kind (dense S, sparse A, complex values).
    ValueError
        On shape mismatches, operands on different devices, NaN or infinity in A or B (or in
        S's values when ``hadamard``), or duplicate entries in S.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> S = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 2.0]]))
    >>> A = np.array([[1.0, 2.0], [3.0, 4.0]])
    >>> B = np.array([[1.0, 1.0], [0.5, 0.5]])
    >>> sddmm(S, A, B).toarray()
    array([[3., 0.],
           [0., 7.]])
    """
    if is_dask_array(S):
        raise TypeError(
            "mgpu.ops.sddmm runs on one device; for a dask array S use mgpu.sddmm, which "
            "runs the distributed version."
        )
    check_sddmm_shapes(S.shape, getattr(A, "shape", ()), getattr(B, "shape", ()))
    check_dense_factor(A, "A")
    check_dense_factor(B, "B")
    on_gpu = [is_gpu_array(x) for x in (S, A, B)]
    if len(set(on_gpu)) != 1:
        where = ", ".join(
            f"{n} on the {'GPU' if g else 'CPU'} ({type(x).__name__})"
            for n, x, g in zip("SAB", (S, A, B), on_gpu)
        )
        raise ValueError(
            f"The operands of sddmm must be on one device. Got {where}. Move them with "
            "cupy.asarray / cupyx.scipy.sparse.csr_matrix or cupy.asnumpy / .get()."
        )
    S = check_sparse(S, hadamard)
    return sddmm_local(S, A, B, hadamard)
