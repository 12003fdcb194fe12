// Shared helpers for mgpu's kernels. Included with #include "common.cuh"; the loader
// (mgpu/backends/loader.py) inlines local headers itself, because CuPy's kernel cache is
// keyed by the source text only and would not notice a changed header.
#pragma once

#define MGPU_FULL_MASK 0xffffffffu

namespace mgpu {

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(MGPU_FULL_MASK, v, off);
    return v;
}

// max that lets a NaN through, as numpy's reductions do
__device__ __forceinline__ double nan_max(double a, double b) {
    return (a != a || b != b) ? (a + b) : (a > b ? a : b);
}

__device__ __forceinline__ double warp_nan_max(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = nan_max(v, __shfl_xor_sync(MGPU_FULL_MASK, v, off));
    return v;
}

}  // namespace mgpu
