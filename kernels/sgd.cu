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
// they repeat (a busy item's run reads its row once: its updates are the pass's longest
// chain), has the ids of 32 ratings at a time in its lanes, and fetches the rows of the next
// 2–8 ratings while it updates this one; a fetched row is taken only where no update between
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

// ids of 32 consecutive ratings from c, one per lane (past end: -1, as no rating names it)
template <typename T>
__device__ __forceinline__ void wave_ids(const int* __restrict__ users,
                                         const int* __restrict__ items,
                                         const T* __restrict__ ratings, long long c,
                                         long long end, int lane, int& u, int& i, T& r) {
    const long long t = c + lane;
    u = t < end ? users[t] : -1;
    i = t < end ? items[t] : -1;
    r = t < end ? ratings[t] : T(0);
}

// one sub-block's ratings [beg, end), in order, by one warp. The ids come 32 at a time,
// one rating per lane, and reach the warp by shuffles (no load on the update's path); the
// rows of the next D ratings are in flight while this one is updated.
// (cu0, ci0, cr0) and (cu1, ci1, cr1): wave_ids of beg and beg + 32, loaded by the caller
// before it waits for the sub-block's items (ids are read-only)
template <typename T, int KPL, int D>
__device__ void wave_block(const int* __restrict__ users, const int* __restrict__ items,
                           const T* __restrict__ ratings, long long beg, long long end, int cu0,
                           int ci0, T cr0, int cu1, int ci1, T cr1, T* P, T* Q, int k, T lr,
                           T reg_p, T reg_q, int lane) {
    if (beg >= end) return;
    long long c = beg;  // ratings c .. c + 63 are in (cu0, ci0, cr0) and (cu1, ci1, cr1)
    auto id = [&](long long t, int& u, int& i, T& r) {  // t - c in [0, 64), warp-uniform
        const int off = (int)(t - c);
        const bool first = off < 32;
        const int src = first ? off : off - 32;
        u = __shfl_sync(MGPU_FULL_MASK, first ? cu0 : cu1, src);
        i = __shfl_sync(MGPU_FULL_MASK, first ? ci0 : ci1, src);
        r = __shfl_sync(MGPU_FULL_MASK, first ? cr0 : cr1, src);
    };
    int u, i;
    T r;
    id(beg, u, i, r);
    T p[KPL], q[KPL];
    wave_load(P, u, k, lane, p);
    wave_load(Q, i, k, lane, q);
    // the next D ratings: ids, and rows fetched where no rating before them updates them
    int us[D], is[D];
    T rs[D], pv[D][KPL], qv[D][KPL];
    bool pok[D], qok[D];
#pragma unroll
    for (int s = 0; s < D; ++s) {
        us[s] = is[s] = -1;
        rs[s] = T(0);
        pok[s] = qok[s] = false;
        if (beg + 1 + s < end) {
            id(beg + 1 + s, us[s], is[s], rs[s]);
            pok[s] = us[s] != u;
            qok[s] = is[s] != i;
#pragma unroll
            for (int x = 0; x < s; ++x) {
                pok[s] = pok[s] && us[s] != us[x];
                qok[s] = qok[s] && is[s] != is[x];
            }
            if (pok[s]) wave_load(P, us[s], k, lane, pv[s]);
            if (qok[s]) wave_load(Q, is[s], k, lane, qv[s]);
        }
    }
    for (long long t = beg;; ++t) {
        T acc = 0;
#pragma unroll
        for (int j = 0; j < KPL; ++j) acc += p[j] * q[j];
        const T e = r - mgpu::warp_sum(acc);
#pragma unroll
        for (int j = 0; j < KPL; ++j) {  // lanes past k hold zeros, which stay zeros
            const T pj = p[j], qj = q[j];
            p[j] = pj + lr * (e * qj - reg_p * pj);
            q[j] = qj + lr * (e * pj - reg_q * qj);
        }
        const bool last = t + 1 >= end;
        if (last || us[0] != u) wave_store(P, u, k, lane, p);
        if (last || is[0] != i) wave_store(Q, i, k, lane, q);
        if (last) break;
        if (t + 1 - c >= 32) {  // the next rating is in the second half: move on by 32
            c += 32;
            cu0 = cu1; ci0 = ci1; cr0 = cr1;
            wave_ids(users, items, ratings, c + 32, end, lane, cu1, ci1, cr1);
        }
        // the next rating becomes the current one; a row not fetched ahead was updated
        // after the fetch would have been made, and is read again after this warp's store
        if (us[0] != u) {
            if (pok[0]) wave_copy(p, pv[0]); else wave_load(P, us[0], k, lane, p);
        }
        if (is[0] != i) {
            if (qok[0]) wave_copy(q, qv[0]); else wave_load(Q, is[0], k, lane, q);
        }
        u = us[0]; i = is[0]; r = rs[0];
#pragma unroll
        for (int s = 0; s + 1 < D; ++s) {
            us[s] = us[s + 1]; is[s] = is[s + 1]; rs[s] = rs[s + 1];
            pok[s] = pok[s + 1]; qok[s] = qok[s + 1];
            wave_copy(pv[s], pv[s + 1]);
            wave_copy(qv[s], qv[s + 1]);
        }
        us[D - 1] = is[D - 1] = -1;
        rs[D - 1] = T(0);
        pok[D - 1] = qok[D - 1] = false;
        if (t + 1 + D < end) {
            id(t + 1 + D, us[D - 1], is[D - 1], rs[D - 1]);
            bool pk = us[D - 1] != u, qk = is[D - 1] != i;
#pragma unroll
            for (int x = 0; x + 1 < D; ++x) {
                pk = pk && us[D - 1] != us[x];
                qk = qk && is[D - 1] != is[x];
            }
            pok[D - 1] = pk;
            qok[D - 1] = qk;
            if (pk) wave_load(P, us[D - 1], k, lane, pv[D - 1]);
            if (qk) wave_load(Q, is[D - 1], k, lane, qv[D - 1]);
        }
    }
}

}  // namespace

template <typename T, int KPL>
__global__ void mgpu_sgd_wave(const int* __restrict__ users, const int* __restrict__ items,
                              const T* __restrict__ ratings, const long long* __restrict__ offsets,
                              const int* __restrict__ diagonals, int groups, int n_warps,
                              int* done, T* P, T* Q, int k, T lr, T reg_p, T reg_q) {
    // ratings whose rows are in flight during an update: as many as 255 registers hold
    // without spilling (8 for k <= 128 in float32, 2 for k > 128 in float64)
    constexpr int WAVE_AHEAD = sizeof(T) * KPL <= 16 ? 8 : (sizeof(T) * KPL <= 32 ? 4 : 2);
    const int lane = threadIdx.x & 31;
    const int warp = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (warp >= n_warps || warp >= groups) return;  // the whole warp: a launch's padding
    for (int j = 0; j < groups; ++j) {
        const int d = diagonals[j];
        const int back = j > 0 ? diagonals[j - 1] : 0;
        for (int a = warp; a < groups; a += n_warps) {
            int c = a + d;
            if (c >= groups) c -= groups;
            // what no other warp writes is loaded before the wait: the cell's bounds and ids
            const long long b = (long long)a * groups + c;
            const long long beg = offsets[b], end = offsets[b + 1];
            int cu0, ci0, cu1, ci1;
            T cr0, cr1;
            wave_ids(users, items, ratings, beg, end, lane, cu0, ci0, cr0);
            wave_ids(users, items, ratings, beg + 32, end, lane, cu1, ci1, cr1);
            if (j > 0) {
                int prev = c - back;  // the row group that held column group c at step j − 1
                if (prev < 0) prev += groups;
                if (lane == 0) {
                    while (*(volatile const int*)(done + prev) < j) {
                        asm volatile("nanosleep.u32 32;");  // sm_70+; PTX, not a header's
                    }
                }
                __syncwarp();
                __threadfence();  // its rows' stores, made before its flag, seen after it
            }
            wave_block<T, KPL, WAVE_AHEAD>(users, items, ratings, beg, end, cu0, ci0, cr0, cu1,
                                           ci1, cr1, P, Q, k, lr, reg_p, reg_q, lane);
            __threadfence();  // every lane's stores visible before the flag
            __syncwarp();
            if (lane == 0) *(volatile int*)(done + a) = j + 1;
        }
    }
}
