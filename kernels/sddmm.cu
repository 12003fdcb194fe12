// SDDMM, P = S ∘ (A Bᵀ) on the pattern of a CSR matrix S (A: M×K, B: N×K, row-major).
//
// mgpu_sddmm_warp<T, I>: the load-balanced baseline. Every warp takes a fixed run of
// nonzeros (merge-path style: its first row is found by binary search on indptr, so a long
// row is shared by many warps and empty rows cost nothing); per nonzero the 32 lanes split
// K and reduce with shuffles. Accumulates in T. The SM-L2 tiled scheme (column panels with
// active rows of A staged in shared memory) builds on this layout.
#include "common.cuh"

template <typename I>
__device__ __forceinline__ long long mgpu_row_of(const I* __restrict__ indptr, long long n_rows,
                                                 long long p) {
    // largest i with indptr[i] <= p (p < nnz, so indptr[i + 1] > p)
    long long lo = 0, hi = n_rows;
    while (lo < hi) {
        const long long mid = (lo + hi + 1) >> 1;
        if ((long long)indptr[mid] <= p) lo = mid; else hi = mid - 1;
    }
    return lo;
}

template <typename T, typename I>
__global__ void mgpu_sddmm_warp(const I* __restrict__ indptr,
                                const I* __restrict__ indices,
                                const T* __restrict__ values,
                                const T* __restrict__ A,
                                const T* __restrict__ B,
                                long long n_rows,
                                long long nnz,
                                int K,
                                int hadamard,
                                int nz_per_warp,
                                T* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long p0 = warp * (long long)nz_per_warp;
    if (p0 >= nnz) return;
    const long long p1 = min(nnz, p0 + (long long)nz_per_warp);
    long long i = mgpu_row_of(indptr, n_rows, p0);
    for (long long p = p0; p < p1; ++p) {
        while ((long long)indptr[i + 1] <= p) ++i;
        const T* __restrict__ a = A + i * (long long)K;
        const T* __restrict__ b = B + (long long)indices[p] * (long long)K;
        T acc = 0;
        for (int k = lane; k < K; k += 32) acc += a[k] * b[k];
        acc = mgpu::warp_sum(acc);
        if (lane == 0) out[p] = hadamard ? acc * values[p] : acc;
    }
}
