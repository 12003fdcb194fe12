// Probes for the benchmarks: the cost of one part of a kernel, alone.
//
// mgpu_gather_rows<T, I, W, V>: reads, for every nonzero p of a CSR matrix, row indices[p] of
//   B (K elements) and writes its squared norm to out[p]; no A, no row tracking. Same
//   virtual-warp layout as mgpu_sddmm_csr, so its time is the gather of B that any SDDMM on
//   this pattern pays: the L2-gather bound the SDDMM benchmark reports against.
#include "common.cuh"

template <typename T, typename I, int W, int V>
__global__ void mgpu_gather_rows(const I* __restrict__ indices,
                                 const T* __restrict__ B,
                                 long long nnz,
                                 int K,
                                 int nz_per_warp,
                                 T* __restrict__ out) {
    using VT = typename mgpu::vec<T, W>::type;
    constexpr int G = 32 / V;
    constexpr int U = 4;
    const int lane = threadIdx.x & 31;
    const int g = lane / V, sub = lane % V;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long p0 = warp * (long long)nz_per_warp;
    if (p0 >= nnz) return;
    const long long p1 = min(nnz, p0 + (long long)nz_per_warp);
    const int KV = K / W;
    const VT* __restrict__ Bv = reinterpret_cast<const VT*>(B);
    for (long long q = p0; q < p1; q += G * U) {
        long long bcol[U];
#pragma unroll
        for (int u = 0; u < U; ++u) bcol[u] = (long long)indices[min(q + g + u * G, p1 - 1)] * KV;
        T acc[U];
#pragma unroll
        for (int u = 0; u < U; ++u) acc[u] = T(0);
        for (int k = sub; k < KV; k += V) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const VT b = Bv[bcol[u] + k];
                acc[u] += mgpu::dot(b, b);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const T v = mgpu::group_sum<V>(acc[u]);
            const long long p = q + g + u * G;
            if (sub == 0 && p < p1) out[p] = v;
        }
    }
}
