// SGD for matrix factorisation R ≈ P Qᵀ (no biases), the GPU block kernel of HSGD*: as in
// cuMF_SGD, one warp per rating at a time, the k factors of p_u and q_i spread over the
// lanes (KPL per lane), the dot product by a warp reduction, and no locks: two warps that
// meet on the same user or item in one launch both write, which SGD tolerates (Hogwild).
// The factor rows are read and written through L2 only (ld/st .cg): L1 is not coherent
// between SMs, so a row of a busy user cached in one SM's L1 would feed that SM's later
// updates a value many updates old, and a lost update is then not one but many.
// mgpu/mf/sgd.py's numba _sgd is the CPU twin (the same update, from the old values):
//     e = r − p_u·q_i;  p_u += lr (e q_i − reg_p p_u);  q_i += lr (e p_u − reg_q q_i)
//
// Instantiated as mgpu_sgd_block<T, KPL> with T in {float, double} (factors and ratings)
// and KPL in {1, 2, 4, 8}: k ≤ 32·KPL. Ratings are visited in the order given (the caller
// shuffles); users and items index rows of P and Q (32-bit, row-major, k columns).
#include "common.cuh"

template <typename T, int KPL>
__global__ void mgpu_sgd_block(const int* __restrict__ users, const int* __restrict__ items,
                               const T* __restrict__ ratings, long long n, T* P, T* Q, int k,
                               T lr, T reg_p, T reg_q) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long t = warp; t < n; t += n_warps) {
        T* p = P + (long long)users[t] * k;
        T* q = Q + (long long)items[t] * k;
        T pv[KPL], qv[KPL];
        T acc = 0;
#pragma unroll
        for (int j = 0; j < KPL; ++j) {
            const int f = lane + 32 * j;
            pv[j] = f < k ? __ldcg(p + f) : T(0);
            qv[j] = f < k ? __ldcg(q + f) : T(0);
            acc += pv[j] * qv[j];
        }
        const T e = ratings[t] - mgpu::warp_sum(acc);
#pragma unroll
        for (int j = 0; j < KPL; ++j) {
            const int f = lane + 32 * j;
            if (f < k) {
                __stcg(p + f, pv[j] + lr * (e * qv[j] - reg_p * pv[j]));
                __stcg(q + f, qv[j] + lr * (e * pv[j] - reg_q * qv[j]));
            }
        }
    }
}
