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
// Within a sub-block a warp keeps D ratings in flight: a ring of D slots in shared memory,
// each with the rows of P and Q fetched for one rating by cp.async (16 bytes a copy, L2
// only, as __ldcg), one commit group a rating. Rating t is updated from slot t mod D after
// cp.async.wait_group(D − 1): a counted wait, which waits for rating t's rows only. (Rows
// loaded into registers cannot do this: every load of the ring shares one of the warp's six
// scoreboards, and the wait for slot t's row also waited for the row of rating t + D − 1,
// fetched one rating before: a whole memory round trip per rating, whatever D.) The slot
// takes rating t + D while t's warp sum waits on its shuffles (after t's store where it is
// t's own user's row). The current user's and item's rows stay in registers while
// they repeat: a busy item's run reads its row once and stores it once, at its end. A Q row
// is fetched only where the item changes: the sub-block's items come in runs, so a new item
// has had no update yet in this sub-block. A P row is fetched unless its user is among the
// D − 1 ratings before it (whose updates are not made yet): such a row is read again, after
// this warp's own store, when its turn comes. The P rows of the first D ratings are fetched
// before the step's wait (only this warp writes its row groups' users), the Q rows after it.
// The ids come 32 at a time, one rating per lane, loaded 32 ratings before their use, and
// reach the warp by shuffles.
//
// A lane holds KPL consecutive factors (f = lane · KPL + x), so that a row moves in 16-byte
// pieces, each copied and read by the lane that stores it (no lane reads another's copy).
// Where a lane's factors are not whole 16-byte pieces (KPL · sizeof(T) < 16), k · sizeof(T)
// is not a multiple of 16 or P or Q is not 16-byte aligned, a slot is filled by plain loads
// and shared-memory stores instead (correct, a memory round trip per rating).
//
// The chain of one busy item's run, rating after rating, is what bounds a pass (its updates
// cannot overlap): the dot product (KPL fused multiply-adds), the warp's sum (5 butterfly
// shuffles, every lane gets it), the error and the item row's update, written as
// p(1 − lr reg_p) + (lr e) q (two operations a factor; the same update as above). The user's
// row comes from the ring, its store goes out without a wait. One warp issues that chain's
// instructions in order, so what a rating costs is mostly how many there are: the copies
// and stores that depend on a rating's ids are predicated, not branched around (a branch
// the compiler cannot prove uniform costs the warp a convergence barrier and its resolution
// each time), and the ids' ring is tested for its refill once every D ratings.

namespace {

template <typename T, int KPL>
struct WaveVec {  // a lane's factors as 16-byte pieces, where they are whole ones
    static constexpr int W = 16 / (int)sizeof(T);  // elements of a piece
    static constexpr bool ok = (KPL * (int)sizeof(T)) % 16 == 0;
    static constexpr int N = ok ? KPL / W : 0;  // pieces of a lane
};

template <typename T>
struct Piece;
template <> struct Piece<float> { using type = float4; };
template <> struct Piece<double> { using type = double2; };

// a shared-memory pointer as the 32-bit address cp.async takes (PTX, not a header's)
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned s;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(s) : "l"(p));
    return s;
}

// a 16-byte copy into shared memory (L2 only, as __ldcg) where `on`: one predicated copy, no
// branch around it
__device__ __forceinline__ void cp_async16_if(bool on, void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = smem_addr(smem);
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n"
                 " @q cp.async.cg.shared.global [%0], [%1], 16;\n}\n"
                 ::"r"(s), "l"(gmem), "r"((int)on) : "memory");
#else
    if (on) *(int4*)smem = __ldcg((const int4*)gmem);
#endif
}

__device__ __forceinline__ void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// until at most N of this thread's commit groups are pending
template <int N>
__device__ __forceinline__ void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// row `row` of M (k columns) into the slot s (32 · KPL elements): a lane copies its own
// factors, 16 bytes at a time where vec (else plain loads and stores)
template <typename T, int KPL, bool FAST>
__device__ __forceinline__ void wave_fetch(T* s, const T* M, int row, int k, int lane,
                                           bool vec, bool on = true) {
    const T* m = M + (long long)row * k;
    const int f0 = lane * KPL;
    if (WaveVec<T, KPL>::ok && (FAST || vec)) {
        constexpr int W = WaveVec<T, KPL>::ok ? WaveVec<T, KPL>::W : 1;
#pragma unroll
        for (int x = 0; x < WaveVec<T, KPL>::N; ++x) {
            const int f = f0 + W * x;  // k is a multiple of W: a piece is whole or out
            cp_async16_if(on && (FAST || f < k), s + f, m + f);
        }
    } else {
#pragma unroll
        for (int x = 0; x < KPL; ++x) {
            const int f = f0 + x;
            if (on && f < k) s[f] = __ldcg(m + f);
        }
    }
}

// a lane's factors from slot s; zeros past k (the slot holds stale values there)
template <typename T, int KPL, bool FAST>
__device__ __forceinline__ void wave_read(const T* s, int k, int lane, T (&v)[KPL]) {
    const int f0 = lane * KPL;
    if constexpr (WaveVec<T, KPL>::ok) {
        using P = typename Piece<T>::type;
        constexpr int W = WaveVec<T, KPL>::W;
#pragma unroll
        for (int x = 0; x < WaveVec<T, KPL>::N; ++x) {
            const P w = *(const P*)(s + f0 + W * x);
            const T* e = (const T*)&w;
#pragma unroll
            for (int y = 0; y < W; ++y) v[W * x + y] = e[y];
        }
    } else {
#pragma unroll
        for (int x = 0; x < KPL; ++x) v[x] = s[f0 + x];
    }
    if (!FAST) {
#pragma unroll
        for (int x = 0; x < KPL; ++x) v[x] = f0 + x < k ? v[x] : T(0);
    }
}

template <typename T, int KPL, bool FAST>
__device__ __forceinline__ void wave_store(T* M, int row, int k, int lane, const T (&v)[KPL],
                                           bool vec, bool on = true) {
    T* m = M + (long long)row * k;
    const int f0 = lane * KPL;
    if (WaveVec<T, KPL>::ok && (FAST || vec)) {
        using P = typename Piece<T>::type;
        constexpr int W = WaveVec<T, KPL>::ok ? WaveVec<T, KPL>::W : 1;
#pragma unroll
        for (int x = 0; x < WaveVec<T, KPL>::N; ++x) {
            const int f = f0 + W * x;
            if (on && (FAST || f < k)) __stcg((P*)(m + f), *(const P*)(v + W * x));
        }
    } else {
#pragma unroll
        for (int x = 0; x < KPL; ++x) {
            const int f = f0 + x;
            if (on && f < k) __stcg(m + f, v[x]);
        }
    }
}

// a 4- or 8-byte copy into shared memory, cached in L1 (read-only ids and ratings only)
template <typename V>
__device__ __forceinline__ void cp_async_small(V* smem, const V* gmem) {
    static_assert(sizeof(V) == 4 || sizeof(V) == 8, "cp.async.ca copies 4 or 8 bytes here");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = smem_addr(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(gmem),
                 "n"((int)sizeof(V)) : "memory");
#else
    *smem = *gmem;
#endif
}

// the ids and ratings of a cell's ratings c .. c + 63 (positions relative to the cell's
// first), in a ring of 64 in shared memory: rating t at t mod 64, for t − c in [0, 32). The
// next 32 are copied (cp.async, in the commit group of the rating then in flight) when t
// reaches c + 32, 32 ratings before their first use, so no rating waits for them; read
// after the rating's wait and a __syncwarp (each lane copies one).
template <typename T>
struct WaveIds {
    const int* __restrict__ users;
    const int* __restrict__ items;
    const T* __restrict__ ratings;
    int* su;
    int* si;
    T* sr;
    int c, end;

    __device__ __forceinline__ WaveIds(const int* us, const int* is, const T* rs, int n,
                                       int* su_, int* si_, T* sr_, int lane)
        : users(us), items(is), ratings(rs), su(su_), si(si_), sr(sr_), c(0), end(n) {
#pragma unroll
        for (int h = 0; h < 64; h += 32) {  // the first 64 at once (the cell's one wait)
            const int t = h + lane;
            su[t] = t < end ? users[t] : -1;
            si[t] = t < end ? items[t] : -1;
            sr[t] = t < end ? ratings[t] : T(0);
        }
        __syncwarp();
    }
    // t warp-uniform, t − c in [0, 32); past end: -1, as no rating names it
    __device__ __forceinline__ void get(int t, int& u, int& i, T& r) const {
        u = su[t & 63];
        i = si[t & 63];
        r = sr[t & 63];
    }
    // make t − c < 32 (t grows by one between calls): at t = c + 32 the ratings c + 64 ..
    // c + 95 take the places of c .. c + 31, which are no longer read
    __device__ __forceinline__ void reach(int t, int lane) {
        if (t - c >= 32) {
            c += 32;
            const int x = c + 32 + lane, at = x & 63;
            if (x < end) {
                cp_async_small(su + at, users + x);
                cp_async_small(si + at, items + x);
                cp_async_small(sr + at, ratings + x);
            } else {
                su[at] = -1;
                si[at] = -1;
                sr[at] = T(0);
            }
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

// one sub-block's ratings [beg, end), in order, by one warp, D of them in flight through
// the ring sp/sq (D slots of 32 · KPL); waits for flag >= j first (flag null: no wait).
// FAST: k = 32 · KPL, rows in whole 16-byte pieces (vec): no bounds, no branch on vec.
template <typename T, int KPL, int D, bool FAST>
__device__ __forceinline__ void wave_cell(const int* __restrict__ users,
                                          const int* __restrict__ items,
                                          const T* __restrict__ ratings, long long beg,
                                          long long end, const int* flag, int j, T* P, T* Q,
                                          int k, T lr, T reg_p, T reg_q, int lane, bool vec,
                                          T* sp, T* sq, int* su, int* si, T* sr) {
    static_assert(D >= 2 && D <= 8 && 32 % D == 0, "the ring holds 2, 4 or 8 ratings");
    constexpr int S = 32 * KPL;  // a slot's elements
    const int n = (int)(end - beg);  // a cell's ratings fit 32 bits (the schedule's G >= 1)
    WaveIds<T> ids(users + beg, items + beg, ratings + beg, n, su, si, sr, lane);
    int us[D], is[D];
    T rs[D];
    bool pok[D];
#pragma unroll
    for (int s = 0; s < D; ++s) {  // ratings 0 .. D − 1; past end the ids are −1
        ids.get(s, us[s], is[s], rs[s]);
        bool ok = us[s] >= 0;
#pragma unroll
        for (int x = 0; x < s; ++x) ok = ok && us[s] != us[x];
        pok[s] = ok;
        if (ok) wave_fetch<T, KPL, FAST>(sp + s * S, P, us[s], k, lane, vec);
    }
    if (flag != nullptr) wave_wait(flag, j, lane);
    // commit group s: rating s's rows (the first also holds every P row fetched above)
#pragma unroll
    for (int s = 0; s < D; ++s) {
        if (is[s] >= 0 && (s == 0 || is[s] != is[s - 1]))
            wave_fetch<T, KPL, FAST>(sq + s * S, Q, is[s], k, lane, vec);
        cp_commit();
    }
    int u = -1, i = -1;
    T p[KPL], q[KPL];
    const T keep_p = T(1) - lr * reg_p, keep_q = T(1) - lr * reg_q;
    for (int base = 0; base < n; base += D) {
#pragma unroll
        for (int s = 0; s < D; ++s) {
            const int t = base + s;
            if (t >= n) break;
            // rating t, from slot s: its group is the oldest of the D pending
            cp_wait<D - 1>();
            __syncwarp();  // and the ids copied by the other lanes
            int nu, ni;  // rating t + D's ids, read here: the read's latency hides in t's
            T nr;
            ids.get(t + D, nu, ni, nr);
            const bool newu = us[s] != u;
            if (newu && !pok[s]) {  // its user among the D − 1 before it: read after their
                // stores, through the ring too (a load into registers would share a
                // scoreboard with the ids' loads, and every rating would wait for those)
                wave_fetch<T, KPL, FAST>(sp + s * S, P, us[s], k, lane, vec);
                cp_commit();
                cp_wait<0>();
            }
            if (newu) wave_read<T, KPL, FAST>(sp + s * S, k, lane, p);
            if (is[s] != i) wave_read<T, KPL, FAST>(sq + s * S, k, lane, q);
            u = us[s];
            i = is[s];
            const int next = (s + 1) % D, prev = (s + D - 1) % D;  // constants once unrolled
            // slot s takes rating t + D: its P row unless its user is among t + 1 .. t + D − 1
            // (the other slots), its Q row where its item is new; one commit group. These
            // do not wait for t's update, so they are issued in the shuffles' latency, but
            // for a P row of t's own user, fetched after t's store.
            bool ok = nu >= 0;
#pragma unroll
            for (int x = 0; x < D; ++x) {
                if (x != s) ok = ok && nu != us[x];
            }
            const bool qnew = ni >= 0 && ni != is[prev];
            const bool late = ok && nu == u;
            T acc = 0;
#pragma unroll
            for (int x = 0; x < KPL; ++x) acc += p[x] * q[x];
            // the warp's sum (mgpu::warp_sum's butterfly, every lane gets it), written out so
            // that the refill goes between its shuffles; slot s's rows are in registers by
            // the first shuffle (the dot product has read them)
            acc += __shfl_xor_sync(MGPU_FULL_MASK, acc, 16);
            wave_fetch<T, KPL, FAST>(sp + s * S, P, nu, k, lane, vec, ok && !late);
            wave_fetch<T, KPL, FAST>(sq + s * S, Q, ni, k, lane, vec, qnew);
#pragma unroll
            for (int off = 8; off > 0; off >>= 1)
                acc += __shfl_xor_sync(MGPU_FULL_MASK, acc, off);
            const T le = lr * (rs[s] - acc);
#pragma unroll
            for (int x = 0; x < KPL; ++x) {  // lanes past k hold zeros, which stay zeros
                const T px = p[x], qx = q[x];
                p[x] = le * qx + keep_p * px;
                q[x] = le * px + keep_q * qx;
            }
            const bool last = t + 1 >= n;
            wave_store<T, KPL, FAST>(P, u, k, lane, p, vec, last || us[next] != u);
            wave_store<T, KPL, FAST>(Q, i, k, lane, q, vec, last || is[next] != i);
            wave_fetch<T, KPL, FAST>(sp + s * S, P, nu, k, lane, vec, late);
            // the ids' ring moves on every 32 ratings, when t + D + 1 is a multiple of 32:
            // with D a divisor of 32, only at a group's last slot (the test stays out of
            // the others). It may rewrite t + D's place: read above, and used
            if (s == D - 1) ids.reach(t + D + 1, lane);
            us[s] = nu;
            is[s] = ni;
            rs[s] = nr;
            pok[s] = ok;
            cp_commit();
        }
    }
    cp_wait<0>();  // nothing of this cell lands in the ring after it
}

}  // namespace

// D: ratings in flight per warp (mgpu/backends/cupy_sgd.py picks it; WAVE_DEPTHS there)
template <typename T, int KPL, int D>
__global__ void __launch_bounds__(64) mgpu_sgd_wave(
        const int* __restrict__ users, const int* __restrict__ items,
        const T* __restrict__ ratings, const long long* __restrict__ offsets,
        const int* __restrict__ diagonals, int groups, int n_warps, int* done, T* P, T* Q,
        int k, T lr, T reg_p, T reg_q) {
    constexpr int S = 32 * KPL;
    __shared__ __align__(16) T ring[2][2][D][S];  // per warp of the block: P and Q slots
    __shared__ __align__(16) T ring_r[2][64];      // and its ids' ring (WaveIds)
    __shared__ __align__(16) int ring_ui[2][2][64];
    const int lane = threadIdx.x & 31;
    const int warp = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (warp >= n_warps || warp >= groups) return;  // the whole warp: a launch's padding
    T* sp = &ring[(threadIdx.x >> 5) & 1][0][0][0];
    T* sq = &ring[(threadIdx.x >> 5) & 1][1][0][0];
    int* su = &ring_ui[(threadIdx.x >> 5) & 1][0][0];
    int* si = &ring_ui[(threadIdx.x >> 5) & 1][1][0];
    T* sr = &ring_r[(threadIdx.x >> 5) & 1][0];
    const bool vec = (k * (int)sizeof(T)) % 16 == 0 && ((unsigned long long)P & 15) == 0
                     && ((unsigned long long)Q & 15) == 0;
    const bool fast = WaveVec<T, KPL>::ok && vec && k == S;
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
            const int* flag = j > 0 ? done + prev : nullptr;
            if (fast)
                wave_cell<T, KPL, D, true>(users, items, ratings, offsets[b], offsets[b + 1],
                                           flag, j, P, Q, S, lr, reg_p, reg_q, lane, vec,
                                           sp, sq, su, si, sr);
            else
                wave_cell<T, KPL, D, false>(users, items, ratings, offsets[b], offsets[b + 1],
                                            flag, j, P, Q, k, lr, reg_p, reg_q, lane, vec,
                                            sp, sq, su, si, sr);
            __threadfence();  // every lane's stores visible before the flag
            __syncwarp();
            if (lane == 0) *(volatile int*)(done + a) = j + 1;
        }
    }
}
