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

// ---------------------------------------------------------------------------------------
// The wavefront scheme (mgpu/mf/schedule.py): no two warps ever update one row, by
// construction. The ratings come sorted by sub-block of a G × G grid (row group a, column
// group c: offsets[a * G + c]), then item, then user. At step j, row group a runs sub-block
// (a, (a + diagonals[j]) mod G); a warp owns row groups warp, warp + n_warps, ... and before
// a step waits until the row group that held its column group at step j − 1 has published
// done[prev] = j (after a fence that makes its rows' stores visible first). Any number of
// warps gives the same result (each row and column sees its sub-blocks in step order), as
// long as every launched warp is resident: the caller launches no more than the device
// holds (mgpu/backends/cupy_sgd.py), else a waiting warp could hold the slot of the one it
// waits for.
//
// Within a sub-block the warp keeps the current user's and item's rows in registers while
// they repeat (a busy item's run reads its row once) and fetches the rows of the next two
// ratings while it updates this one; a prefetched row is taken only where no update between
// the fetch and its use touches it (else it is read again, after this warp's own store).

namespace {

template <typename T, int KPL>
__device__ __forceinline__ void wave_load(const T* M, int row, int k, int lane, T (&v)[KPL]) {
    const T* m = M + (long long)row * k;
#pragma unroll
    for (int j = 0; j < KPL; ++j) {
        const int f = lane + 32 * j;
        v[j] = f < k ? __ldcg(m + f) : T(0);
    }
}

template <typename T, int KPL>
__device__ __forceinline__ void wave_store(T* M, int row, int k, int lane, const T (&v)[KPL]) {
    T* m = M + (long long)row * k;
#pragma unroll
    for (int j = 0; j < KPL; ++j) {
        const int f = lane + 32 * j;
        if (f < k) __stcg(m + f, v[j]);
    }
}

template <typename T, int KPL>
__device__ __forceinline__ void wave_copy(T (&dst)[KPL], const T (&src)[KPL]) {
#pragma unroll
    for (int j = 0; j < KPL; ++j) dst[j] = src[j];
}

// one sub-block's ratings [beg, end), in order, by one warp
template <typename T, int KPL>
__device__ void wave_block(const int* __restrict__ users, const int* __restrict__ items,
                           const T* __restrict__ ratings, long long beg, long long end, T* P,
                           T* Q, int k, T lr, T reg_p, T reg_q, int lane) {
    if (beg >= end) return;
    int u = users[beg], i = items[beg];
    T r = ratings[beg];
    T p[KPL], q[KPL], p1[KPL], q1[KPL], p2[KPL], q2[KPL];
    wave_load(P, u, k, lane, p);
    wave_load(Q, i, k, lane, q);
    // the next rating: its ids, and its rows where they are not the current ones
    int u1 = -1, i1 = -1;
    T r1 = T(0);
    bool p1ok = false, q1ok = false;
    if (beg + 1 < end) {
        u1 = users[beg + 1];
        i1 = items[beg + 1];
        r1 = ratings[beg + 1];
        p1ok = u1 != u;
        q1ok = i1 != i;
        if (p1ok) wave_load(P, u1, k, lane, p1);
        if (q1ok) wave_load(Q, i1, k, lane, q1);
    }
    for (long long t = beg;; ++t) {
        // the one after: its rows are final unless the current or the next rating updates them
        int u2 = -1, i2 = -1;
        T r2 = T(0);
        bool p2ok = false, q2ok = false;
        if (t + 2 < end) {
            u2 = users[t + 2];
            i2 = items[t + 2];
            r2 = ratings[t + 2];
            p2ok = u2 != u && u2 != u1;
            q2ok = i2 != i && i2 != i1;
            if (p2ok) wave_load(P, u2, k, lane, p2);
            if (q2ok) wave_load(Q, i2, k, lane, q2);
        }
        T acc = 0;
#pragma unroll
        for (int j = 0; j < KPL; ++j) acc += p[j] * q[j];
        const T e = r - mgpu::warp_sum(acc);
#pragma unroll
        for (int j = 0; j < KPL; ++j) {  // lanes past k hold zeros, which stay zeros
            const T pv = p[j], qv = q[j];
            p[j] = pv + lr * (e * qv - reg_p * pv);
            q[j] = qv + lr * (e * pv - reg_q * qv);
        }
        const bool last = t + 1 >= end;
        if (last || u1 != u) wave_store(P, u, k, lane, p);
        if (last || i1 != i) wave_store(Q, i, k, lane, q);
        if (last) break;
        if (u1 != u) {  // a row not prefetched was updated after its fetch: read it again
            if (p1ok) wave_copy(p, p1); else wave_load(P, u1, k, lane, p);
        }
        if (i1 != i) {
            if (q1ok) wave_copy(q, q1); else wave_load(Q, i1, k, lane, q);
        }
        u = u1; i = i1; r = r1;
        u1 = u2; i1 = i2; r1 = r2;
        p1ok = p2ok; q1ok = q2ok;
        if (p2ok) wave_copy(p1, p2);
        if (q2ok) wave_copy(q1, q2);
    }
}

}  // namespace

template <typename T, int KPL>
__global__ void mgpu_sgd_wave(const int* __restrict__ users, const int* __restrict__ items,
                              const T* __restrict__ ratings, const long long* __restrict__ offsets,
                              const int* __restrict__ diagonals, int groups, int n_warps,
                              int* done, T* P, T* Q, int k, T lr, T reg_p, T reg_q) {
    const int lane = threadIdx.x & 31;
    const int warp = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (warp >= n_warps || warp >= groups) return;  // the whole warp: a launch's padding
    for (int j = 0; j < groups; ++j) {
        const int d = diagonals[j];
        const int back = j > 0 ? diagonals[j - 1] : 0;
        for (int a = warp; a < groups; a += n_warps) {
            int c = a + d;
            if (c >= groups) c -= groups;
            if (j > 0) {
                int prev = c - back;  // the row group that held column group c at step j − 1
                if (prev < 0) prev += groups;
                if (lane == 0) {
                    while (*(volatile const int*)(done + prev) < j) __nanosleep(32);
                }
                __syncwarp();
                __threadfence();  // its rows' stores, made before its flag, seen after it
            }
            const long long b = (long long)a * groups + c;
            wave_block<T, KPL>(users, items, ratings, offsets[b], offsets[b + 1], P, Q, k, lr,
                               reg_p, reg_q, lane);
            __threadfence();  // every lane's stores visible before the flag
            __syncwarp();
            if (lane == 0) *(volatile int*)(done + a) = j + 1;
        }
    }
}
