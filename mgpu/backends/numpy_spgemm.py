"""TEMPORARY scipy stand-in (device check only; replaced by the numba backend)."""
import scipy.sparse as sp

from mgpu.backends.dispatch import spadd_lookup, spgemm_lookup


@spgemm_lookup.register((sp.spmatrix, sp.sparray))
def _spgemm_host(A, B, mask, to_host=False):
    C = sp.csr_matrix(A @ B)
    if mask is not None:
        M = sp.csr_matrix(mask, copy=True)
        M.data[:] = 1
        C = sp.csr_matrix(C.multiply(M))
    C.sum_duplicates()
    C.eliminate_zeros()
    C.sort_indices()
    return C


@spadd_lookup.register((sp.spmatrix, sp.sparray))
def _spadd_host(A, B, alpha, beta):
    C = sp.csr_matrix(alpha * A + beta * B)
    C.sum_duplicates()
    C.eliminate_zeros()
    C.sort_indices()
    return C
