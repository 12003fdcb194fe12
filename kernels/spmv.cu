// Merge-path SpMV and SpMM on CSR (Merrill & Garland; Dalton, Baxter, Merrill, Olson & Garland,
// "Optimizing Sparse Matrix Operations on GPUs using Merge Path", IPDPS 2015).
//
// The work of y = A x is the merge of two sorted lists: the row ends indptr[1..m] and the
// nonzero indices 0..nnz-1. Consuming a nonzero index multiplies it in; consuming a row end
// writes the row. The merge (m + nnz items) is cut into pieces of ITEMS items, one per thread
// (SpMV) or per warp row of a column block (SpMM), so a long row is spread over many threads
// and an empty row costs one item, with no row compaction pass. Each piece finds where it
// starts by a binary search along its diagonal, writes the rows it ends, and leaves a carry
// (row, partial sum) for the row that its end cuts; the carry passes below add them. Sums are accumulated in double for both T. Index arrays are int32 (cupyx CSR);
// positions along the merge are 64-bit since m + nnz may pass 2^31.
#include "common.cuh"

namespace mgpu {

// Rows consumed before diagonal d of the merge path: the largest r in [max(0, d - nnz),
// min(d, m)] such that the first r row ends all come before the first d - r nonzeros, i.e.
// indptr[r] <= d - r (row end r-1 is consumed before nonzero d - r).
__device__ __forceinline__ long long merge_path_rows(long long d, const int* __restrict__ indptr,
                                                     long long m, long long nnz) {
    long long lo = d - nnz > 0 ? d - nnz : 0;
    long long hi = d < m ? d : m;
    while (lo < hi) {
        const long long pivot = (lo + hi) >> 1;
        // row end `pivot` (= indptr[pivot + 1]) goes before nonzero d - pivot - 1?
        if (static_cast<long long>(indptr[pivot + 1]) <= d - pivot - 1) {
            lo = pivot + 1;
        } else {
            hi = pivot;
        }
    }
    return lo;
}

}  // namespace mgpu

// One thread per piece of ITEMS merge items; blockDim.x a multiple of 32 (the end of a piece
// is the start of the next lane's, so a warp does 33 searches for 32 pieces, not 64).
// carry_row[p] is the row cut at the end of piece p (m when none), carry_val[p] its partial sum.
template <typename T, int ITEMS>
__global__ void mgpu_spmv_merge(const int* __restrict__ indptr, const int* __restrict__ indices,
                                const T* __restrict__ data, const T* __restrict__ x,
                                long long m, long long nnz, long long n_pieces, T* __restrict__ y,
                                int* __restrict__ carry_row, double* __restrict__ carry_val) {
    const long long p = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31;
    const long long total = m + nnz;
    const long long d0 = p * ITEMS < total ? p * ITEMS : total;
    const long long d1 = d0 + ITEMS < total ? d0 + ITEMS : total;
    long long row = mgpu::merge_path_rows(d0, indptr, m, nnz);
    long long row_end = __shfl_down_sync(MGPU_FULL_MASK, row, 1);
    if (lane == 31) row_end = mgpu::merge_path_rows(d1, indptr, m, nnz);
    if (p >= n_pieces) return;
    long long nz = d0 - row;
    const long long nz_end = d1 - row_end;

    double acc = 0.0;
    for (; row < row_end; ++row) {
        const long long stop = indptr[row + 1];
        for (; nz < stop; ++nz) {
            acc += static_cast<double>(data[nz]) * static_cast<double>(x[indices[nz]]);
        }
        y[row] = static_cast<T>(acc);
        acc = 0.0;
    }
    for (; nz < nz_end; ++nz) {
        acc += static_cast<double>(data[nz]) * static_cast<double>(x[indices[nz]]);
    }
    carry_row[p] = static_cast<int>(row_end);
    carry_val[p] = acc;
}

// The carries are added in two passes, in double, so that a row cut by thousands of pieces is
// not summed by thousands of float atomics. Carries are sorted by row, so the pieces that cut
// one row are consecutive; the first of them (the head, found by a lower bound on carry_row)
// gathers the others' partial sums into its own carry_val slot (pass 1, mgpu_*_carries), then
// adds that total to the row once (pass 2, mgpu_carry_apply). Only heads receive atomics and
// only non-heads' own slots are read in pass 1, so the passes do not race.

namespace mgpu {

// first piece whose carry row is `row` (carry_row is sorted)
__device__ __forceinline__ long long carry_head(const int* __restrict__ carry_row,
                                                long long p, int row) {
    long long lo = 0, hi = p;
    while (lo < hi) {
        const long long mid = (lo + hi) >> 1;
        if (carry_row[mid] < row) lo = mid + 1; else hi = mid;
    }
    return lo;
}
}  // namespace mgpu

// Pass 1 for SpMV: the non-head pieces of a row are summed across the warp first (shuffles),
// leaving one double atomic per row and warp.
__global__ void mgpu_spmv_carries(const int* __restrict__ carry_row,
                                             double* __restrict__ carry_val, long long n_pieces,
                                             long long m) {
    const long long p = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31;
    const bool valid = p < n_pieces;
    const int row = valid ? carry_row[p] : -1;  // -1 never equals a real row
    const long long head = valid ? mgpu::carry_head(carry_row, p, row) : p;
    double v = (valid && head != p) ? carry_val[p] : 0.0;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const double ov = __shfl_down_sync(MGPU_FULL_MASK, v, off);
        const int orow = __shfl_down_sync(MGPU_FULL_MASK, row, off);
        if (lane + off < 32 && orow == row) v += ov;
    }
    const int prev = __shfl_up_sync(MGPU_FULL_MASK, row, 1);
    const bool first_in_warp = lane == 0 || prev != row;
    if (valid && first_in_warp && row < m && v != 0.0) atomicAdd(&carry_val[head], v);
}

// Pass 1 for SpMM, one thread per (piece, column) of the (n_pieces, k) carries.
__global__ void mgpu_spmm_carries(const int* __restrict__ carry_row,
                                             double* __restrict__ carry_val, long long n_pieces,
                                             long long m, long long k) {
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_pieces * k) return;
    const long long p = idx / k;
    const int row = carry_row[p];
    if (row >= m) return;
    const long long head = mgpu::carry_head(carry_row, p, row);
    if (head == p) return;
    const double v = carry_val[idx];
    if (v != 0.0) atomicAdd(&carry_val[head * k + (idx - p * k)], v);
}

// Pass 2: each head adds its row's total once (no atomics: one head per row).
template <typename T>
__global__ void mgpu_carry_apply(const int* __restrict__ carry_row,
                                 const double* __restrict__ carry_val, long long n_pieces,
                                 long long m, long long k, T* __restrict__ Y) {
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_pieces * k) return;
    const long long p = idx / k;
    const int row = carry_row[p];
    if (row >= m || (p > 0 && carry_row[p - 1] == row)) return;
    const long long col = idx - p * k;
    T* out = Y + static_cast<long long>(row) * k + col;
    *out = static_cast<T>(static_cast<double>(*out) + carry_val[idx]);
}

// SpMM Y = A X, X of shape (n, k) and Y (m, k) row-major. Block (32, PIECES_PER_BLOCK):
// threadIdx.x is a column of a 32-column block of X (gridDim.y blocks), threadIdx.y a piece,
// so a warp walks one piece for 32 adjacent columns: A's entries are broadcast loads, X's
// rows and Y's rows coalesced. carry_val is (n_pieces, k).
template <typename T, int ITEMS>
__global__ void mgpu_spmm_merge(const int* __restrict__ indptr, const int* __restrict__ indices,
                                const T* __restrict__ data, const T* __restrict__ X,
                                long long m, long long nnz, long long k, long long n_pieces,
                                T* __restrict__ Y, int* __restrict__ carry_row,
                                double* __restrict__ carry_val) {
    const long long col = static_cast<long long>(blockIdx.y) * 32 + threadIdx.x;
    const long long p = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;
    if (p >= n_pieces || col >= k) return;
    const long long total = m + nnz;
    const long long d0 = p * ITEMS < total ? p * ITEMS : total;
    const long long d1 = d0 + ITEMS < total ? d0 + ITEMS : total;
    long long row = mgpu::merge_path_rows(d0, indptr, m, nnz);
    const long long row_end = mgpu::merge_path_rows(d1, indptr, m, nnz);
    long long nz = d0 - row;
    const long long nz_end = d1 - row_end;

    double acc = 0.0;
    for (; row < row_end; ++row) {
        const long long stop = indptr[row + 1];
        for (; nz < stop; ++nz) {
            acc += static_cast<double>(data[nz])
                   * static_cast<double>(X[static_cast<long long>(indices[nz]) * k + col]);
        }
        Y[row * k + col] = static_cast<T>(acc);
        acc = 0.0;
    }
    for (; nz < nz_end; ++nz) {
        acc += static_cast<double>(data[nz])
               * static_cast<double>(X[static_cast<long long>(indices[nz]) * k + col]);
    }
    if (col == 0) carry_row[p] = static_cast<int>(row_end);
    carry_val[p * k + col] = acc;
}
