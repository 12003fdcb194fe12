// Merge-path SpMV and SpMM on CSR (Merrill & Garland; Dalton, Baxter, Merrill, Olson & Garland,
// "Optimizing Sparse Matrix Operations on GPUs using Merge Path", IPDPS 2015).
//
// The work of y = A x is the merge of two sorted lists: the row ends indptr[1..m] and the
// nonzero indices 0..nnz-1. Consuming a nonzero index multiplies it in; consuming a row end
// writes the row. The merge (m + nnz items) is cut into pieces of a fixed number of items: a
// block's tile for SpMV, a warp row of a column block for SpMM. So a long row is spread over
// many threads and an empty row costs one item, with no row compaction pass (a plan made
// once for many products may compact them away: see mgpu_spmv_merge). Each piece finds
// where it starts by a binary search along its diagonal, writes the rows it ends, and leaves a
// carry (row, partial sum) for the row that its end cuts; the carry passes below add them
// (or, for a launch of few tiles, its own last block: spmv_last_block_carries).
// Sums are accumulated in double for both T (SpMV's products are rounded to T first). Index
// arrays are int32 (cupyx CSR); positions along the merge are 64-bit since m + nnz may pass
// 2^31. NaN or infinity in the operands sets *bad, which the caller reads once after the
// launches and turns into an error.
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

// SpMV runs in tiles of MGPU_SPMV_THREADS * ITEMS merge items, one block a tile, as Merrill &
// Garland's CsrMV does: where every tile starts on the merge path is found first (by a search
// launch, or by the tile's own block for a launch of few tiles), then the block reads its row
// ends and its nonzeros' products data[nz] * x[col] into shared memory with coalesced loads,
// and each thread walks its ITEMS items of the tile there (a second search, in shared
// memory); a tile whose rows are all short is summed a few lanes a row instead. Rows ended
// inside the tile are summed in shared memory and written once, coalesced; the row the
// tile's end cuts leaves one carry per tile for the carry passes below.
#define MGPU_SPMV_THREADS 128
// rows of at most this many nonzeros are summed a few lanes a row (see mgpu_spmv_merge)
#define MGPU_SPMV_ROW_CAP 32

namespace mgpu {
// merge_path_rows(d, ...) found by a whole warp, 32 probes a round (the same result): the
// rows are cut into 32 segments, each lane tests its segment's first row, and the ballot
// leaves one segment, 32 times shorter. A tile's start and end are known after about
// log32(m) dependent loads instead of log2(m).
__device__ __forceinline__ long long merge_path_rows_warp(long long d,
                                                          const int* __restrict__ indptr,
                                                          long long m, long long nnz) {
    const int lane = threadIdx.x & 31;
    long long lo = d - nnz > 0 ? d - nnz : 0;
    long long hi = d < m ? d : m;
    while (lo < hi) {
        const long long step = (hi - lo + 31) >> 5;
        const long long probe = lo + lane * step;
        // row end `probe` goes before nonzero d - probe - 1: the answer is past probe
        const bool past = probe < hi && static_cast<long long>(indptr[probe + 1]) <= d - probe - 1;
        const int c = __popc(__ballot_sync(MGPU_FULL_MASK, past));  // lanes 0..c-1 (monotone)
        if (c == 0) break;  // the answer is lo itself
        const long long end = lo + c * step;  // lane c's probe, where the test fails
        lo = lo + (c - 1) * step + 1;
        hi = end < hi ? end : hi;
    }
    return lo;
}

// Sums of runs of equal keys across a warp whose keys are non-decreasing along the lanes
// (each run's lanes consecutive): every lane gets the sum of v over itself and the lanes
// after it in its run, so the run's first lane (*first) holds the run's total. Every lane of
// the warp must call it.
__device__ __forceinline__ double warp_run_sum(double v, int key, bool* first) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const double ov = __shfl_down_sync(MGPU_FULL_MASK, v, off);
        const int okey = __shfl_down_sync(MGPU_FULL_MASK, key, off);
        if (lane + off < 32 && okey == key) v += ov;
    }
    const int prev = __shfl_up_sync(MGPU_FULL_MASK, key, 1);  // by every lane, lane 0 too
    *first = lane == 0 || prev != key;
    return v;
}
}  // namespace mgpu

// tile_row[t] = rows consumed before tile t's first item, for t in [0, n_tiles] (the last is
// m), for a launch of many tiles (SEARCH false below): one thread a tile, all at once.
__global__ void mgpu_spmv_tile_search(const int* __restrict__ indptr, long long m, long long nnz,
                                      long long tile, long long n_tiles,
                                      long long* __restrict__ tile_row) {
    const long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t <= n_tiles) {
        const long long total = m + nnz;
        const long long d = t * tile < total ? t * tile : total;
        tile_row[t] = mgpu::merge_path_rows(d, indptr, m, nnz);
    }
}

// The merge walk of one tile: thread t takes items [t * ITEMS, (t + 1) * ITEMS) of the tile's
// R row ends and N nonzeros, finds how many rows come before its first item (a search in
// shared memory), and sums its items into s_acc (zeroed): rows it ends whole are stored,
// the first row it ends and the row its end cuts (R: the tile's) may be shared with other
// threads and are added atomically.
namespace mgpu {
template <typename T, int ITEMS>
__device__ __forceinline__ void spmv_walk(const int* s_end, const T* s_val, double* s_acc, int R,
                                          int N) {
    const int items = R + N;
    const int k0 = threadIdx.x * ITEMS < items ? threadIdx.x * ITEMS : items;
    const int k1 = k0 + ITEMS < items ? k0 + ITEMS : items;
    int lo = k0 - N > 0 ? k0 - N : 0;
    int hi = k0 < R ? k0 : R;
    while (lo < hi) {
        const int pivot = (lo + hi) >> 1;
        if (s_end[pivot] <= k0 - pivot - 1) lo = pivot + 1; else hi = pivot;
    }
    int r = lo;
    int j = k0 - r;
    double acc = 0.0;
    bool first = true;  // the first row this thread ends may have begun in earlier threads
    for (int k = k0; k < k1; ++k) {
        if (j < s_end[r]) {
            acc += s_val[j];
            ++j;
        } else {
            if (first) atomicAdd(&s_acc[r], acc); else s_acc[r] = acc;
            first = false;
            acc = 0.0;
            ++r;
        }
    }
    // The row this thread's end cuts (R: the tile's). A long row is cut by every thread of
    // the tiles inside it: the warp first sums the parts of each row it shares (rows are
    // non-decreasing along the lanes, so each row's lanes are consecutive), leaving one
    // atomic per row and warp instead of one per thread on the same address.
    bool run_head;
    const double v = mgpu::warp_run_sum(k0 < k1 ? acc : 0.0,
                                        k0 < k1 ? r : -1 - static_cast<int>(threadIdx.x & 31),
                                        &run_head);  // threads past the items share no row
    if (k0 < k1 && run_head) atomicAdd(&s_acc[r], v);
}
}  // namespace mgpu

// The carries of a launch of few tiles, added in the launch itself (done not null): every
// block counts itself done in *done (after a fence, so that its y and carries are seen), and
// the last one adds each cut row's carries to the row once, reading what the other blocks
// wrote from L2, and sets *done back to 0 for the next launch on its stream. Its threads
// share the work: thread t takes a run of consecutive carries (at most 32 for the launches
// the host fuses, mgpu/backends/cupy_spmv.py), loads them 4 at a time (independent loads in
// flight together, not one dependent search a carry; the next 4 load while the last 4's
// rows are added), and sums each row's carries in its run; the rows whose carries start
// and end in the run are added as each 4 are done, with their loads of y in flight
// together (spmv_add_carries), and the rows cut
// between runs are joined by a segmented scan over the threads (log2 of the block's
// threads steps in shared memory): the sum of a row's carries up to the end of each run.
// Carries are sorted by row, so a row's carries are consecutive and each row is added by
// exactly one thread: the one whose run holds the row's last carry, with the scan's sum of
// the runs before (no atomics). s_sum and s_flag: blockDim.x doubles and ints of the
// block's shared memory, free by now (the block's own work is done). Not inlined: its
// registers would crowd the merge's own (the launch bounds leave 32 a thread).
namespace mgpu {
// Adds v[i] to row row[i] of y (through rows when A is compacted) for the i < K whose row is
// one (>= 0 and < m: the last tile's "row" is m, no row), K distinct rows: every load is
// issued before the first store, so that the K round trips to L2 overlap instead of each
// waiting for the store before it (the compiler may not move a load of y past a store to y).
template <typename T, int K>
__device__ __forceinline__ void spmv_add_carries(T* y, const int* rows, long long m,
                                                 const int (&row)[K], const double (&v)[K]) {
    int at[K];  // y's row (A has fewer than 2^31 - 1 rows), -1 for none
#pragma unroll
    for (int i = 0; i < K; ++i) {
        const bool ok = row[i] >= 0 && row[i] < m;
        at[i] = !ok ? -1 : rows == nullptr ? row[i] : rows[row[i]];
    }
    T old[K];
#pragma unroll
    for (int i = 0; i < K; ++i) old[i] = at[i] >= 0 ? __ldcg(y + at[i]) : T(0);
#pragma unroll
    for (int i = 0; i < K; ++i) {
        if (at[i] >= 0) y[at[i]] = static_cast<T>(static_cast<double>(old[i]) + v[i]);
    }
}

// The carries [base, base + 4) that lie before p1 (row -1 for the others), issued together.
__device__ __forceinline__ void spmv_load_carries(const int* carry_row, const double* carry_val,
                                                  long long base, long long p1, int (&r)[4],
                                                  double (&v)[4]) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const long long p = base + u;
        r[u] = p < p1 ? __ldcg(carry_row + p) : -1;
        v[u] = p < p1 ? __ldcg(carry_val + p) : 0.0;
    }
}

template <typename T>
__device__ __noinline__ void spmv_last_block_carries(unsigned int* done, const int* carry_row,
                                                     const double* carry_val, long long n_tiles,
                                                     long long m, T* y, const int* rows,
                                                     double* s_sum, int* s_flag) {
    __shared__ bool s_last;
    // The block's writes of y and of the carries, ordered before the count by the barrier
    // and one fence of thread 0 (as a grid-wide sync does), not a fence by every thread:
    // each is a wait for the memory, and every block pays it before it retires.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const bool last = atomicAdd(done, 1u) == gridDim.x - 1;
        __threadfence();  // the other blocks' writes, seen by the reads after the barrier
        s_last = last;
    }
    __syncthreads();
    if (!s_last) return;  // the same for the whole block
    const int t = threadIdx.x;
    const long long per = (n_tiles + blockDim.x - 1) / blockDim.x;
    const long long p0 = min(n_tiles, t * per), p1 = min(n_tiles, p0 + per);
    // the rows just before and just after the run (-1: none; rows are >= 0)
    const int before = p0 > 0 && p0 < p1 ? __ldcg(carry_row + p0 - 1) : -1;
    const int after = p1 < n_tiles ? __ldcg(carry_row + p1) : -1;
    int cur = -1;       // the row of the carries being summed
    double run = 0.0;   // their sum so far
    bool ended = false; // a row's carries have ended inside the run
    int lead_row = -1;  // the run's first row, when its carries began before the run
    double lead = 0.0;  // and ended inside it: its part here
    int r[4];
    double v[4];
    spmv_load_carries(carry_row, carry_val, p0, p1, r, v);
    for (long long base = p0; base < p1; base += 4) {
        int add_row[4] = {-1, -1, -1, -1};  // rows whose carries all lie in this run and end
        double add[4] = {0.0, 0.0, 0.0, 0.0};  // in these four: added together, below
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (base + u >= p1) break;
            if (base + u == p0) {
                cur = r[u];
                run = v[u];
            } else if (r[u] == cur) {
                run += v[u];
            } else {  // cur's carries end here
                if (!ended && cur == before) {
                    lead_row = cur;  // begun in earlier runs: joined after the scan
                    lead = run;
                } else {
                    add_row[u] = cur;  // all of them in this run
                    add[u] = run;
                }
                ended = true;
                cur = r[u];
                run = v[u];
            }
        }
        int next_r[4];
        double next_v[4];
        // the next 4, in flight during the adds (they load before the stores to y)
        spmv_load_carries(carry_row, carry_val, base + 4, p1, next_r, next_v);
        spmv_add_carries<T, 4>(y, rows, m, add_row, add);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            r[u] = next_r[u];
            v[u] = next_v[u];
        }
    }
    // The last row of the run: its sum over this run and the earlier runs that end in it,
    // by an inclusive segmented scan (a segment starts at a run whose last row begins in it).
    bool head = p0 >= p1 || ended || cur != before;
    double x = run;
    for (int off = 1; off < static_cast<int>(blockDim.x); off <<= 1) {
        s_sum[t] = x;
        s_flag[t] = head;
        __syncthreads();
        if (t >= off) {
            if (!head) x += s_sum[t - off];
            head = head || s_flag[t - off];
        }
        __syncthreads();
    }
    s_sum[t] = x;
    __syncthreads();
    if (p0 < p1) {
        int add_row[2] = {lead_row, after != cur ? cur : -1};  // else a later run adds cur
        double add[2] = {lead_row >= 0 ? s_sum[t - 1] + lead : 0.0, x};
        spmv_add_carries<T, 2>(y, rows, m, add_row, add);
    }
    if (threadIdx.x == 0) *done = 0;
}
}  // namespace mgpu

// Launch bounds of 16 blocks per SM keep the registers within a full SM's occupancy. SEARCH:
// the block finds its tile's place itself (a launch of a few waves, where the latency of a
// separate search launch counts most); otherwise tile_row holds it (many waves, where the
// blocks' own searches would leave the memory idle while they wait). CHECK
// flags in bad a row sum (or a tile's carry) that is not finite, and any NaN or infinity among
// x's n_x values (each block scans its share of x, rows of A or not: a value that no stored
// value of A reads is refused too, with no launch of its own). A NaN or infinity among A's
// stored values always makes its row's sum so (a NaN or infinite product, inf * 0 included,
// keeps the double sum NaN or infinite), so R + 1 tests a tile stand for a test of each of
// its N values on the loads, which would show on regular matrices (docs/benchmarks.md has
// checked against unchecked calls). A sum that
// overflows raises the flag too; the caller's checks then find no culprit. Without CHECK
// (the caller's operands are not checked, bad is null) nothing is tested.
//
// rows, empty: null, or A compacted by a plan (mgpu.spmv_plan). Then indptr, m and the
// merge are those of A's non-empty rows only, rows[i] is the row of A that compacted row i
// is (where its sum is written), and empty lists A's n_empty empty rows, which are zeroed
// here: an empty row costs a read and a write instead of a merge item.
template <typename T, int ITEMS, bool CHECK, bool SEARCH>
__global__ void __launch_bounds__(MGPU_SPMV_THREADS, 16)
mgpu_spmv_merge(const int* __restrict__ indptr, const int* __restrict__ indices,
                const T* __restrict__ data, const T* __restrict__ x, long long m, long long nnz,
                const long long* __restrict__ tile_row, T* __restrict__ y,
                int* __restrict__ carry_row, double* __restrict__ carry_val,
                int* __restrict__ bad, const int* __restrict__ rows,
                const int* __restrict__ empty, long long n_empty, long long n_x,
                unsigned int* __restrict__ done) {
    constexpr int TILE = MGPU_SPMV_THREADS * ITEMS;
    __shared__ int s_end[TILE + 1];      // row ends of the tile's rows, relative to nz0
    __shared__ T s_val[TILE];            // products of the tile's nonzeros (rounded to T)
    __shared__ double s_acc[TILE + 1];   // sums of the tile's rows; [R] the cut row's
    __shared__ long long s_rows[2];      // rows consumed before the tile's start and its end
    const long long tile = blockIdx.x;
    const long long total = m + nnz;
    const long long d0 = tile * TILE;
    const long long d1 = d0 + TILE < total ? d0 + TILE : total;
    // A compacted A (rows not null): block b zeroes the empty rows [b * TILE, (b + 1) * TILE)
    // of the list, and the launch has enough blocks for them all; blocks past the tiles
    // do nothing else.
    const long long e0 = tile * TILE;
    const long long e1 = e0 + TILE < n_empty ? e0 + TILE : n_empty;
    for (long long i = e0 + threadIdx.x; i < e1; i += MGPU_SPMV_THREADS) y[empty[i]] = T(0);
    bool x_finite = true;
    if (CHECK) {  // this block's share of x
        const long long share = (n_x + gridDim.x - 1) / gridDim.x;
        const long long x0 = static_cast<long long>(blockIdx.x) * share;
        const long long x1 = x0 + share < n_x ? x0 + share : n_x;
        for (long long i = x0 + threadIdx.x; i < x1; i += MGPU_SPMV_THREADS) {
            x_finite = x_finite && isfinite(x[i]);
        }
    }
    if (d0 >= total) {  // the same for the whole block
        if (CHECK && __syncthreads_or(!x_finite) && threadIdx.x == 0) *bad = 1;
        if (done != nullptr) mgpu::spmv_last_block_carries(done, carry_row, carry_val,
                                                           total > 0 ? (total + TILE - 1) / TILE : 0,
                                                           m, y, rows, s_acc, s_end);
        return;
    }
    if (SEARCH) {  // warp 0 finds where the tile starts, warp 1 where it ends
        if (threadIdx.x < 64) {
            const long long r = mgpu::merge_path_rows_warp(threadIdx.x < 32 ? d0 : d1, indptr,
                                                           m, nnz);
            if ((threadIdx.x & 31) == 0) s_rows[threadIdx.x >> 5] = r;
        }
    } else if (threadIdx.x < 2) {
        s_rows[threadIdx.x] = tile_row[tile + threadIdx.x];
    }
    __syncthreads();
    const long long row0 = s_rows[0];
    const long long row1 = s_rows[1];
    const long long nz0 = d0 - row0;
    const int R = static_cast<int>(row1 - row0);
    const int N = static_cast<int>((d1 - row1) - nz0);

    // fixed trip counts (R, N <= TILE), unrolled so that each thread's loads are in flight
    // together
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
        const int i = threadIdx.x + u * MGPU_SPMV_THREADS;
        if (i < R) s_end[i] = static_cast<int>(indptr[row0 + 1 + i] - nz0);
        if (i <= R) s_acc[i] = 0.0;
    }
    if (threadIdx.x == 0) {
        s_end[R] = N;  // past the last row end: only nonzeros remain
        s_acc[R] = 0.0;
    }
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
        const int j = threadIdx.x + u * MGPU_SPMV_THREADS;
        if (j < N) s_val[j] = data[nz0 + j] * x[indices[nz0 + j]];
    }
    __syncthreads();

    // A tile whose rows are all short (at most MGPU_SPMV_ROW_CAP items, as the whole block
    // finds) is summed a few lanes a row, in a fixed order: no search, no atomics, few
    // instructions, which is what bounds the kernel on regular matrices. Otherwise each
    // thread walks its ITEMS items of the merge path, so a long row is shared among threads.
    bool long_row = false;
    for (int i = threadIdx.x; i <= R; i += MGPU_SPMV_THREADS) {
        long_row = long_row || s_end[i] - (i == 0 ? 0 : s_end[i - 1]) > MGPU_SPMV_ROW_CAP;
    }
    if (!__syncthreads_or(long_row)) {
        // L lanes a row, the most (a power of two, at most 32) that gives every row of the
        // tile its lanes at once: each lane sums every L-th product of its row, then the
        // lanes add theirs by shuffles. The rounds are the same for the whole block (R is),
        // so every lane of a warp takes part in each shuffle.
        int L = 1;
        while (L < 32 && (R + 1) * 2 * L <= MGPU_SPMV_THREADS) L *= 2;
        const int lane = threadIdx.x & (L - 1);
        for (int base = 0; base <= R; base += MGPU_SPMV_THREADS / L) {
            const int i = base + static_cast<int>(threadIdx.x) / L;
            double acc = 0.0;
            if (i <= R) {
                const int e = s_end[i];
                for (int j = (i == 0 ? 0 : s_end[i - 1]) + lane; j < e; j += L) acc += s_val[j];
            }
            for (int off = L >> 1; off > 0; off >>= 1) {
                acc += __shfl_down_sync(MGPU_FULL_MASK, acc, off, L);
            }
            if (i <= R && lane == 0) s_acc[i] = acc;  // [R]: the part of the cut row here
        }
    } else {
        mgpu::spmv_walk<T, ITEMS>(s_end, s_val, s_acc, R, N);
    }
    __syncthreads();
    bool finite = x_finite;
    for (int i = threadIdx.x; i < R; i += MGPU_SPMV_THREADS) {
        if (CHECK) finite = finite && isfinite(s_acc[i]);
        y[rows == nullptr ? row0 + i : rows[row0 + i]] = static_cast<T>(s_acc[i]);
    }
    if (threadIdx.x == 0) {
        if (CHECK) finite = finite && isfinite(s_acc[R]);
        carry_row[tile] = static_cast<int>(row1);
        carry_val[tile] = s_acc[R];
    }
    // bad may be pinned host memory (mgpu/backends/flags.py): one write a block at most
    if (CHECK && __syncthreads_or(!finite) && threadIdx.x == 0) *bad = 1;
    if (done != nullptr) mgpu::spmv_last_block_carries(done, carry_row, carry_val,
                                                       (total + TILE - 1) / TILE, m, y, rows,
                                                       s_acc, s_end);
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
    const bool valid = p < n_pieces;
    const int row = valid ? carry_row[p] : -1;  // -1 never equals a real row
    const long long head = valid ? mgpu::carry_head(carry_row, p, row) : p;
    bool first_in_warp;
    const double v = mgpu::warp_run_sum((valid && head != p) ? carry_val[p] : 0.0, row,
                                        &first_in_warp);
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
// rows: as in mgpu_spmv_merge (a compacted A's row numbers), null for A's own.
template <typename T>
__global__ void mgpu_carry_apply(const int* __restrict__ carry_row,
                                 const double* __restrict__ carry_val, long long n_pieces,
                                 long long m, long long k, T* __restrict__ Y,
                                 const int* __restrict__ rows) {
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_pieces * k) return;
    const long long p = idx / k;
    const int row = carry_row[p];
    if (row >= m || (p > 0 && carry_row[p - 1] == row)) return;
    const long long col = idx - p * k;
    const long long out_row = rows == nullptr ? row : rows[row];
    T* out = Y + out_row * k + col;
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
