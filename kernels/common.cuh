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

// sum over aligned groups of V lanes (V a power of two ≤ 32); every lane of a group gets it
template <int V, typename T>
__device__ __forceinline__ T group_sum(T v) {
#pragma unroll
    for (int off = V / 2; off > 0; off >>= 1) v += __shfl_xor_sync(MGPU_FULL_MASK, v, off);
    return v;
}

// W consecutive elements of T moved as one load: 16 bytes for float4 and double2
template <typename T, int W> struct vec;
template <> struct vec<float, 1> { using type = float; };
template <> struct vec<double, 1> { using type = double; };
template <> struct vec<float, 4> { using type = float4; };
template <> struct vec<double, 2> { using type = double2; };

__device__ __forceinline__ float dot(float a, float b) { return a * b; }
__device__ __forceinline__ double dot(double a, double b) { return a * b; }
__device__ __forceinline__ float dot(float4 a, float4 b) {
    return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, a.w * b.w)));
}
__device__ __forceinline__ double dot(double2 a, double2 b) { return fma(a.x, b.x, a.y * b.y); }

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
