"""SDDMM on one device: P = S ∘ (A Bᵀ) on the pattern of a sparse S."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mgpu.backends import (
    array_module,
    csr_astype,
    is_gpu_array,
    sddmm_flagged_lookup,
    sddmm_lookup,
    sddmm_plan_lookup,
    sddmm_remember_lookup,
    sddmm_repeat_lookup,
    to_host,
    to_host_all,
)
from mgpu.backends.arrays import require_gpu_device
from mgpu.backends.sddmm_plan import SCHEMES, SDDMMPlan, pattern_key
from mgpu.ops.validation import (
    Boolean,
    Bytes,
    IsCallable,
    StrOptions,
    all_finite,
    check_array,
    check_param,
    first_nonfinite,
    is_dask_array,
    same_kind,
)

logger = logging.getLogger(__name__)

__all__ = [
    "check_dense_factor",
    "check_dense_factors",
    "check_sddmm_options",
    "check_sddmm_shapes",
    "check_sparse",
    "sddmm",
    "sddmm_dtype",
    "sddmm_local",
    "sddmm_plan",
]


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def sddmm_dtype(*dtypes: Any) -> np.dtype:
    """float32 when every operand is float32, float64 otherwise."""
    for d in dtypes:
        if d != _F32:
            return _F64
    return _F32


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


def check_sddmm_options(hadamard: Any, check_finite: Any, working_memory: Any,
                        progress: Any, device: Any = None) -> None:
    """Refuse a bad value of sddmm's flags, device and streaming options, whatever the data
    (before any look at the data's values)."""
    if (hadamard is True or hadamard is False) and (check_finite is True or check_finite is False) \
            and device is None and working_memory is None and progress is None:
        return  # the options of nearly every call, taken at once
    check_param(device, "device", "sddmm", [StrOptions({"cpu", "gpu"}), None])
    check_param(hadamard, "hadamard", "sddmm", Boolean())
    check_param(check_finite, "check_finite", "sddmm", Boolean())
    check_param(working_memory, "working_memory", "sddmm", [Bytes(), None])
    check_param(progress, "progress", "sddmm", [IsCallable(), None])


def check_dense_factor(X: Any, name: str, finite: bool = True) -> None:
    """Refuse a dense factor that is not a real numpy/cupy matrix or (with ``finite``) holds
    NaN/inf."""
    check_dense_factors({name: X}, finite)


def check_dense_factors(factors: dict[str, Any], finite: bool = True) -> None:
    """:func:`check_dense_factor` for several factors, with one device round trip for all
    (none without ``finite``: kinds only, values not looked at)."""
    for name, X in factors.items():
        # the shapes are checked before (check_sddmm_shapes), the values below in one trip
        check_array(X, name, "sddmm", accept_sparse=False, ndim=None,
                    kinds="a dense numpy or cupy array")
    if not finite:
        return
    checked = {n: X for n, X in factors.items()
               if finite and np.dtype(X.dtype).kind == "f" and X.size}
    flags = to_host_all([all_finite(X) for X in checked.values()])
    for (name, X), ok in zip(checked.items(), flags):
        if not bool(ok):
            r, c = first_nonfinite(X)
            raise ValueError(
                f"The '{name}' parameter of sddmm holds NaN or infinity (first at row {r}, "
                f"column {c}); SDDMM would spread it over S's pattern. Clean the factor first."
            )


def check_sparse(S: Any, hadamard: bool, func: str = "sddmm") -> Any:
    """S as CSR (scipy or cupyx) with a float dtype, refusing duplicates and (when its values
    are used, ``hadamard``) NaN/inf values; ``func`` is the function the refusals name."""
    check_array(S, "S", func, accept_dense=False, ndim=None,
                kinds="a scipy or cupyx sparse matrix"
                      + (" or a dask array of them" if func == "sddmm" else ""))
    S = S.tocsr()
    if not S.has_canonical_format:
        dup = _first_duplicate(S)
        if dup is not None:
            i, j, times = dup
            raise ValueError(
                f"The 'S' parameter of {func} has duplicate entries (row {i}, column {j} is "
                f"stored {times} times), so its pattern is ambiguous; merge them with "
                "S.sum_duplicates() first."
            )
    at = first_nonfinite(S) if hadamard else None
    if at is not None:
        raise ValueError(
            f"The 'S' parameter of sddmm holds NaN or infinity (row {at[0]}, column {at[1]}); "
            "clean it, or pass hadamard=False to use only its pattern."
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


def sddmm_operands(S: Any, A: Any, B: Any, hadamard: bool) -> tuple[Any, Any, Any]:
    """Validated CSR S and dense A, B of one family in the product's dtype
    (:func:`sddmm_dtype`), A and B C-ordered: as they are when they already are."""
    dt = sddmm_dtype(S.dtype if hadamard else A.dtype, A.dtype, B.dtype)
    if A.dtype != dt or B.dtype != dt or not (A.flags.c_contiguous and B.flags.c_contiguous):
        xp = array_module(S)
        A = xp.ascontiguousarray(xp.asarray(A, dtype=dt))
        B = xp.ascontiguousarray(xp.asarray(B, dtype=dt))
    if S.dtype != dt:
        S = csr_astype(S, dt)  # P keeps S's own order of indices
    return S, A, B


def sddmm_local(S: Any, A: Any, B: Any, hadamard: bool, plan: SDDMMPlan | None = None) -> Any:
    """The kernel call on already-validated CSR S and dense A, B of one family."""
    return sddmm_lookup(*sddmm_operands(S, A, B, hadamard), bool(hadamard), plan)


def sddmm_checked_on_device(S: Any, A: Any, B: Any, hadamard: bool,
                            plan: SDDMMPlan | None = None) -> Any:
    """:func:`sddmm_local` on the GPU for operands whose values are not yet checked: the
    kernels' flag (:mod:`mgpu.backends.flags`) says after the call's one wait whether A,
    B (or S's values with ``hadamard``) hold NaN or infinity; only then do the host checks
    run, and refuse with the first place (the product is dropped)."""
    P, flagged = sddmm_flagged_lookup(*sddmm_operands(S, A, B, hadamard), bool(hadamard), plan)
    if flagged is not False:  # raised, or a fallback that looked at nothing
        _host_checks(S, A, B, hadamard, flagged)
    return P


def _host_checks(S: Any, A: Any, B: Any, hadamard: bool, flagged: bool | None) -> None:
    """The host's checks of the values after the device's flag was raised (or where nothing
    was checked on the device, ``flagged`` None): they refuse with the first bad place; a
    raised flag they cannot explain is refused too, never returned."""
    check_dense_factors({"A": A, "B": B})
    check_sparse(S, hadamard)
    if flagged:  # the flag and the scan disagree
        raise RuntimeError("sddmm: the GPU flagged NaN or infinity among the operands "
                           "that the host checks did not find.")


def sddmm(S: Any, A: Any, B: Any, *, hadamard: bool = True,
          plan: SDDMMPlan | None = None, check_finite: bool = True,
          device: str | None = None, working_memory: Any = None,
          progress: Callable[[int], None] | None = None) -> Any:
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
    plan : SDDMMPlan, optional
        From :func:`sddmm_plan` on this S: reuses its tuned scheme and its tiled copy of S,
        so repeated calls with new factors skip the preprocessing. Without one, the tuned
        scheme of S's shape class is used (tuned on first sight) and any tiling is redone.
        On the GPU the plan also holds the kernel's launch with its arguments packed, and
        S's checks: a call with cupy factors of the plan's dtype and shapes (C-ordered) and
        that very S checks only their attributes before its one launch (other operands
        take the general path, with every check). Results of such calls share one copy of
        S's index arrays (when S's indices are sorted without duplicates), held by the
        plan, as scipy's ``astype(copy=False)`` shares: write to ``P.data`` freely, but to
        ``P.indices`` or ``P.indptr`` only in a copy (``P.copy()``). Without a plan, calls
        on the GPU after the first on that very S (cupyx CSR, known sorted without
        duplicates; factors of its dtype and the same K) reuse what depends on S alone, as
        a plan's do, while S lives and keeps its index arrays; their results have index
        arrays of their own.
    check_finite : bool, default=True
        Refuse NaN or infinity in A and B (and in S's stored values with ``hadamard``), as
        scipy.linalg's ``check_finite``: every value of A and B is checked, also those of
        rows that no nonzero of S touches (they could not spread, but a factor holding them
        is refused all the same). On the CPU the values are checked before the product. On
        the GPU one launch checks them beside the product's kernel and raises a flag in
        pinned host memory; the call waits once, for its stream, and reads the flag with
        the result (no copy back); only a raised flag makes the host look for the first
        bad place and refuse (the product is dropped), so a refusal comes after the
        kernels ran, never before a refusal of the shapes, kinds or devices. ``False``
        skips the check and the wait, for factors known to be finite (an iterative method
        that watches its own loss): NaN or infinity then spread into the entries of P that
        touch them.
    device : {'cpu', 'gpu'}, optional
        Where to compute; by default where the operands are. ``'gpu'`` with host operands
        (scipy S, numpy A and B) streams them through the current GPU in tiles
        (:mod:`mgpu.ops.sddmm_stream`): B in column panels, S and A in row blocks, within
        ``working_memory`` of the device, so that S, A and B may be larger than the GPU.
        P comes back as a scipy matrix.
    working_memory : int or str, optional
        Streaming only: device bytes the tiles may take ("8 GiB"); by default
        ``mgpu.sddmm.gpu-stream-memory``, or 80% of what the device has available. Tiles
        that would need more than the device has available are refused before any copy.
    progress : callable, optional
        Streaming only: called with the number of S's nonzeros done after each tile.

    Returns
    -------
    P : CSR matrix of shape (n_rows, n_cols)
        S's pattern (in CSR order); float32 when every operand is float32, float64
        otherwise; scipy for CPU input (streamed or not), cupyx for GPU input.

    Raises
    ------
    TypeError
        If an operand is of the wrong kind (dense S, sparse A, complex values).
    ValueError
        On shape mismatches, operands on different devices, NaN or infinity in A or B (or in
        S's values when ``hadamard``; both with ``check_finite``), or duplicate entries in S.
    mgpu.backends.memory.DeviceMemoryError
        (a MemoryError) Before anything is allocated, when the GPU cannot hold a result of
        more than 64 MiB (or of more than 1/256 of the device's memory), or when one row of
        a streamed S does not fit in ``working_memory``; it gives the bytes needed and
        available. A smaller result is allocated without asking the device first: on a
        device all but full it fails with CuPy's ``OutOfMemoryError`` (also a MemoryError).
    ImportError, RuntimeError
        With ``device='gpu'``, before anything else: CuPy is not installed (the message says
        ``pip install 'mgpu[gpu]'``), or it finds no GPU.

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
    check_sddmm_options(hadamard, check_finite, working_memory, progress, device)
    plain = device is None and working_memory is None and progress is None
    # a prepared call (GPU): the plan's, or that of calls without a plan on this very S run
    # before; None for operands it was not made for, and then the general path below checks
    # (and converts or refuses) as ever
    prepared = None
    if isinstance(plan, SDDMMPlan) and plan.call is not None and plain:
        prepared = plan.call(S, A, B, hadamard, check_finite)
    elif plan is None and plain and is_gpu_array(S):  # only the GPU prepares calls
        prepared = sddmm_repeat_lookup(S, A, B, hadamard, check_finite)
    if prepared is not None:
        P, flagged = prepared
        if flagged:
            _host_checks(S, A, B, hadamard, flagged)
        return P
    given = S
    if is_dask_array(S):
        raise TypeError(
            "mgpu.ops.sddmm runs on one device; for a dask array S use mgpu.sddmm, which "
            "runs the distributed version."
        )
    check_sddmm_shapes(S.shape, getattr(A, "shape", ()), getattr(B, "shape", ()))
    on_gpu = [is_gpu_array(x) for x in (S, A, B)]  # the refusals name each one's device
    # on the GPU the values are checked by the kernels' flag, after everything else
    flagged = bool(check_finite) and on_gpu[0]
    check_dense_factors({"A": A, "B": B}, finite=check_finite and not flagged)
    if len(set(on_gpu)) != 1:
        where = ", ".join(
            f"{n} on the {'GPU' if g else 'CPU'} ({type(x).__name__})"
            for n, x, g in zip("SAB", (S, A, B), on_gpu)
        )
        raise ValueError(
            f"The operands of sddmm must be on one device. Got {where}. Move them with "
            "cupy.asarray / cupyx.scipy.sparse.csr_matrix or cupy.asnumpy / .get()."
        )
    if device == "cpu" and on_gpu[0]:
        raise ValueError("The operands of sddmm are on the GPU, so device='cpu' does not "
                         "apply; move them with cupy.asnumpy / .get() first.")
    streamed = device == "gpu" and not on_gpu[0]
    if not streamed and (working_memory is not None or progress is not None):
        raise ValueError("The 'working_memory' and 'progress' parameters of sddmm are for "
                         "host operands streamed through the GPU (device='gpu').")
    S = check_sparse(S, hadamard and check_finite and not flagged)
    if plan is not None:
        if streamed:
            raise ValueError("The 'plan' parameter of sddmm does not apply to operands "
                             "streamed through the GPU (device='gpu'); leave it out.")
        check_plan(plan, S, A.shape[1])
    if streamed:
        return same_kind(_streamed(S, A, B, hadamard, working_memory, progress), S)
    if flagged:
        P = sddmm_checked_on_device(S, A, B, hadamard, plan)  # cupyx: no sparse arrays
    else:
        P = same_kind(sddmm_local(S, A, B, hadamard, plan), S)
    if plan is None and plain and S is given and on_gpu[0]:  # the next call: prepared
        sddmm_remember_lookup(S, A, B)
    return P


def stream_budget(working_memory: Any = None) -> int:
    """Device bytes for the tiles of a streamed SDDMM: ``working_memory``, else
    ``mgpu.sddmm.gpu-stream-memory``, else 80% of what the current GPU has available."""
    from mgpu import config

    if working_memory is None and config.get("sddmm.gpu-stream-memory") is None:
        from mgpu.backends.memory import gpu_available

        require_gpu_device("sddmm")  # CuPy and a GPU, or a refusal saying how to get them

        return int(0.8 * gpu_available()[0])
    return config.get_bytes("sddmm.gpu-stream-memory", working_memory)


def _streamed(S: Any, A: Any, B: Any, hadamard: bool, working_memory: Any,
              progress: Callable[[int], None] | None) -> Any:
    """Checked host operands through the current GPU (:mod:`mgpu.ops.sddmm_stream`)."""
    from mgpu.backends.stream import GpuDevice
    from mgpu.ops.sddmm_stream import plan_stream, sddmm_streamed

    dt = sddmm_dtype(S.dtype if hadamard else A.dtype, A.dtype, B.dtype)
    budget = stream_budget(working_memory)
    what = (f"SDDMM of a {S.shape[0]:,}×{S.shape[1]:,} S with {int(S.nnz):,} nonzeros and "
            f"K={A.shape[1]}, streamed through the GPU")
    # refusals by the sizes alone come first (they need no device), then CuPy and a GPU
    plan = plan_stream(S.indptr, S.shape[1], A.shape[1], dt.itemsize, budget, what)
    require_gpu_device("sddmm")
    from mgpu.backends.memory import require_gpu

    # a working_memory asked for beyond what the device has: refused, not run out of
    require_gpu(plan.panel_bytes + plan.block_bytes, what + f" within {budget:,} bytes",
                "Lower working_memory, or leave it to the default (80% of what is available).")
    logger.info("sddmm streamed: %d panel(s) of B × %d block(s) of S within %s of the GPU",
                len(plan.panels), len(plan.blocks), budget)
    device = GpuDevice()
    t0 = time.perf_counter()
    P = sddmm_streamed(S, A, B, hadamard, dt, plan, device, progress)
    seconds = dict(device.seconds, total=time.perf_counter() - t0)
    logger.info("sddmm streamed in %.2f s: %.2f s copying to the device, %.2f s in the kernel "
                "and back, the rest cutting tiles on the host", seconds["total"],
                seconds["to device"], seconds["kernel and back"],
                extra={"seconds": seconds, "plan": plan})
    return P


def check_plan(plan: Any, S: Any, K: int) -> None:
    """Refuse a plan made for another matrix, another K or another device."""
    if not isinstance(plan, SDDMMPlan):
        raise TypeError(f"The 'plan' parameter of sddmm must come from mgpu.sddmm_plan. Got "
                        f"{type(plan).__name__} instead.")
    if (plan.scheme == "cpu") == is_gpu_array(S):  # the plan's device against S's
        raise ValueError(f"The 'plan' parameter of sddmm was made for the "
                         f"{'CPU' if plan.scheme == 'cpu' else 'GPU'}, but S is on the "
                         f"{'GPU' if is_gpu_array(S) else 'CPU'}.")  # the words only
    if plan.pattern != pattern_key(S) or plan.K != K:
        raise ValueError(
            f"The 'plan' parameter of sddmm was made for another problem (S {plan.shape} with "
            f"{plan.nnz} nonzeros, K={plan.K}); got S {tuple(S.shape)} with {int(S.nnz)} "
            f"nonzeros and K={K}. Make the plan with mgpu.sddmm_plan(S, K) on this very S "
            "(in CSR form: a plan holds a tiled copy of its pattern)."
        )


def sddmm_plan(S: Any, K: int, *, dtype: Any = None, scheme: str | None = None) -> SDDMMPlan:
    """How :func:`sddmm` will run S with K-column factors: scheme, tile sizes, measurements.

    On the GPU this tunes (once per device and shape class, then cached) among the
    virtual-warp CSR kernel and the tiled SM-L2 / SM-SM kernels of cuSDDMM, over slices
    ``Tk`` in multiples of 32, with the panel width ``Tj`` from the L2 model
    (:mod:`mgpu.backends.sddmm_plan`), and builds the tiled copy of S the choice needs.

    Parameters
    ----------
    S : sparse matrix of shape (n_rows, n_cols)
        scipy or cupyx CSR matrix, the one later passed to :func:`sddmm`.
    K : int
        Columns of the factors A and B.
    dtype : float32 or float64, optional
        Of the factors; S's float dtype (float32 for integer S) by default.
    scheme : {'csr', 'sm-l2', 'sm-sm'}, optional
        Take this scheme without tuning (GPU only); an error if it does not apply.

    Returns
    -------
    plan : SDDMMPlan
        ``plan.describe()`` prints it; pass it as ``sddmm(S, A, B, plan=plan)``.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> plan = sddmm_plan(sp.random(100, 80, density=0.05, format="csr", random_state=0), 16)
    >>> plan.scheme, plan.K
    ('cpu', 16)
    """
    if is_dask_array(S):
        raise TypeError("The 'S' parameter of sddmm_plan must be one scipy or cupyx matrix; a "
                        "distributed S is planned per tile on its worker.")
    S = check_sparse(S, False, "sddmm_plan")
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"The 'K' parameter of sddmm_plan must be a positive integer. Got {K!r}.")
    if dtype is None:
        dtype = S.dtype if np.dtype(S.dtype).kind == "f" else np.float32
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"The 'dtype' parameter of sddmm_plan must be float32 or float64. Got "
                         f"{dtype}.")
    if scheme is not None and scheme not in SCHEMES or scheme == "cpu":
        raise ValueError(f"The 'scheme' parameter of sddmm_plan must be one of "
                         f"{sorted(set(SCHEMES) - {'cpu'})}. Got {scheme!r} instead.")
    return sddmm_plan_lookup(S, int(K), dtype, scheme)
