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
// Within a sub-block a warp keeps D ratings in flight: a ring of D slots, each with a
// rating's ids and the rows of P and Q fetched for it, the loop unrolled D times so that a
// slot is a fixed set of registers (a ring shifted through registers would wait for every
// load at the shift). Rating t is updated from slot t mod D, which is then refilled with
// rating t + D. The current user's and item's rows stay in registers while they repeat (a
// busy item's run reads its row once). A Q row is fetched only where the item changes: the
// sub-block's items come in runs, so a new item has had no update yet in this sub-block. A
// P row is fetched unless its user is among the D − 1 ratings before it (whose updates are
// not made yet): such a row is read again, after this warp's own store, when its turn comes.
// The P rows of the first D ratings are fetched before the step's wait (only this warp
// writes its row groups' users), the Q rows after it. The ids come 32 at a time, one rating
// per lane, and reach the warp by shuffles.

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

// the ids of ratings c .. c + 63, one per lane in two halves; id(t) for t − c in [0, 64)
template <typename T>
struct WaveIds {
    const int* __restrict__ users;
    const int* __restrict__ items;
    const T* __restrict__ ratings;
    long long c, end;
    int u0, i0, u1, i1;
    T r0, r1;

    __device__ __forceinline__ WaveIds(const int* us, const int* is, const T* rs, long long beg,
                                       long long end_, int lane)
        : users(us), items(is), ratings(rs), c(beg), end(end_) {
        wave_ids(users, items, ratings, c, end, lane, u0, i0, r0);
        wave_ids(users, items, ratings, c + 32, end, lane, u1, i1, r1);
    }
    // t warp-uniform, t − c in [0, 64)
    __device__ __forceinline__ void get(long long t, int& u, int& i, T& r) const {
        const int off = (int)(t - c);
        const bool first = off < 32;
        const int src = first ? off : off - 32;
        u = __shfl_sync(MGPU_FULL_MASK, first ? u0 : u1, src);
        i = __shfl_sync(MGPU_FULL_MASK, first ? i0 : i1, src);
        r = __shfl_sync(MGPU_FULL_MASK, first ? r0 : r1, src);
    }
    // make t − c < 64 (t grows by one between calls)
    __device__ __forceinline__ void reach(long long t, int lane) {
        if (t - c >= 64) {
            c += 32;
            u0 = u1; i0 = i1; r0 = r1;
            wave_ids(users, items, ratings, c + 32, end, lane, u1, i1, r1);
        }
    }
};

// the wait of a step: until *flag >= j (lane 0 polls, sleeping between reads), then a
// fence, so that the rows stored before the flag are seen
__device__ __forceinline__ void wave_wait(const int* flag, int j, int lane) {
    if (lane == 0) {
        while (*(volatile const int*)flag < j) {
            asm volatile("nanosleep.u32 32;");  // sm_70+; PTX, not a header's
        }
    }
    __syncwarp();
    __threadfence();
}

// one sub-block's ratings [beg, end), in order, by one warp, D of them in flight; waits
// for flag >= j first (flag null: no wait)
template <typename T, int KPL, int D>
__device__ __forceinline__ void wave_cell(const int* __restrict__ users,
                                          const int* __restrict__ items,
                                          const T* __restrict__ ratings, long long beg,
                                          long long end, const int* flag, int j, T* P, T* Q,
                                          int k, T lr, T reg_p, T reg_q, int lane) {
    static_assert(D >= 2 && D <= 32, "the ring holds 2 to 32 ratings");
    WaveIds<T> ids(users, items, ratings, beg, end, lane);
    int us[D], is[D];
    T rs[D], pv[D][KPL], qv[D][KPL];
    bool pok[D];
#pragma unroll
    for (int s = 0; s < D; ++s) {  // ratings beg .. beg + D − 1; past end the ids are −1
        ids.get(beg + s, us[s], is[s], rs[s]);
        bool ok = us[s] >= 0;
#pragma unroll
        for (int x = 0; x < s; ++x) ok = ok && us[s] != us[x];
        pok[s] = ok;
        if (ok) wave_load(P, us[s], k, lane, pv[s]);
    }
    if (flag != nullptr) wave_wait(flag, j, lane);
#pragma unroll
    for (int s = 0; s < D; ++s) {
        if (is[s] >= 0 && (s == 0 || is[s] != is[s - 1])) wave_load(Q, is[s], k, lane, qv[s]);
    }
    int u = -1, i = -1;
    T p[KPL], q[KPL];
    for (long long base = beg; base < end; base += D) {
#pragma unroll
        for (int s = 0; s < D; ++s) {
            const long long t = base + s;
            if (t >= end) break;
            // rating t, from slot s
            if (us[s] != u) {
                if (pok[s]) wave_copy(p, pv[s]); else wave_load(P, us[s], k, lane, p);
            }
            if (is[s] != i) wave_copy(q, qv[s]);
            u = us[s];
            i = is[s];
            T acc = 0;
#pragma unroll
            for (int x = 0; x < KPL; ++x) acc += p[x] * q[x];
            const T e = rs[s] - mgpu::warp_sum(acc);
#pragma unroll
            for (int x = 0; x < KPL; ++x) {  // lanes past k hold zeros, which stay zeros
                const T px = p[x], qx = q[x];
                p[x] = px + lr * (e * qx - reg_p * px);
                q[x] = qx + lr * (e * px - reg_q * qx);
            }
            const int next = (s + 1) % D, prev = (s + D - 1) % D;  // constants once unrolled
            const bool last = t + 1 >= end;
            if (last || us[next] != u) wave_store(P, u, k, lane, p);
            if (last || is[next] != i) wave_store(Q, i, k, lane, q);
            // slot s takes rating t + D: its P row unless its user is among t + 1 ..
            // t + D − 1 (the other slots), its Q row where its item is new
            ids.reach(t + D, lane);
            int nu, ni;
            T nr;
            ids.get(t + D, nu, ni, nr);
            bool ok = nu >= 0;
#pragma unroll
            for (int x = 0; x < D; ++x) {
                if (x != s) ok = ok && nu != us[x];
            }
            const bool qnew = ni >= 0 && ni != is[prev];
            us[s] = nu;
            is[s] = ni;
            rs[s] = nr;
            pok[s] = ok;
            if (ok) wave_load(P, nu, k, lane, pv[s]);
            if (qnew) wave_load(Q, ni, k, lane, qv[s]);
        }
    }
}

}  // namespace

// D: ratings in flight per warp (mgpu/backends/cupy_sgd.py picks it; WAVE_DEPTHS there)
template <typename T, int KPL, int D>
__global__ void __launch_bounds__(64) mgpu_sgd_wave(
        const int* __restrict__ users, const int* __restrict__ items,
        const T* __restrict__ ratings, const long long* __restrict__ offsets,
        const int* __restrict__ diagonals, int groups, int n_warps, int* done, T* P, T* Q,
        int k, T lr, T reg_p, T reg_q) {
    const int lane = threadIdx.x & 31;
    const int warp = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (warp >= n_warps || warp >= groups) return;  // the whole warp: a launch's padding
    for (int j = 0; j < groups; ++j) {
        const int d = diagonals[j];
        const int back = j > 0 ? diagonals[j - 1] : 0;
        for (int a = warp; a < groups; a += n_warps) {
            int c = a + d;
            if (c >= groups) c -= groups;
            const long long b = (long long)a * groups + c;
            int prev = c - back;  // the row group that held column group c at step j − 1
            if (prev < 0) prev += groups;
            // an empty sub-block waits too: the next holder of c trusts this flag for all
            // of c's earlier holders
            wave_cell<T, KPL, D>(users, items, ratings, offsets[b], offsets[b + 1],
                                 j > 0 ? done + prev : nullptr, j, P, Q, k, lr, reg_p, reg_q,
                                 lane);
            __threadfence();  // every lane's stores visible before the flag
            __syncwarp();
            if (lane == 0) *(volatile int*)(done + a) = j + 1;
        }
    }
}
