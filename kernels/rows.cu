// Per-row reductions of a CSR matrix: the row norms that the semiring distances need
// (sum, L1, squared L2, L-infinity), one warp per row, accumulated in double.
//
// Instantiated as mgpu_row_norms_warp<T, I, OP> with T in {float, double},
// I in {int, long long} (type of indptr) and OP:
//   0 = sum, 1 = sum |x|, 2 = sum x^2, 3 = max |x|  (mgpu/backends/numpy.py mirrors these).
#include "common.cuh"

template <typename T, typename I, int OP>
__global__ void mgpu_row_norms_warp(const I* __restrict__ indptr,
                                    const T* __restrict__ data,
                                    long long n_rows,
                                    T* __restrict__ out) {
    const long long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    const long long stride = (long long)gridDim.x * warps_per_block;
    for (; row < n_rows; row += stride) {
        const I start = indptr[row];
        const I end = indptr[row + 1];
        double acc = 0.0;
        for (I p = start + lane; p < end; p += 32) {
            const double v = (double)data[p];
            if (OP == 0) acc += v;
            else if (OP == 1) acc += fabs(v);
            else if (OP == 2) acc += v * v;
            else acc = mgpu::nan_max(acc, fabs(v));
        }
        acc = (OP == 3) ? mgpu::warp_nan_max(acc) : mgpu::warp_sum(acc);
        if (lane == 0) out[row] = (T)acc;
    }
}
