// Sparse × sparse product C = A·B on the GPU, row by row (Gustavson), in two passes.
//
// The work of a row is its intermediate products: Σ over A's row of the lengths of the B rows
// it touches. `cum` holds their prefix sums over A's nonzeros (cum[j] = products before A's
// nonzero j, cum[nnz(A)] = all of them), so product p of the whole matrix belongs to the
// nonzero j with cum[j] <= p < cum[j+1], found by a binary search. Every kernel below hands
// out *products*, not rows or nonzeros, to its threads: the merge-path idea (Dalton, Olson
// and Bell) applied to the intermediate products, so a row of a few long B rows and one of
// many short ones keep the same number of threads busy.
//
//  * symbolic pass: each row's distinct columns, counted in a hash table of keys only (a row
//    of few products skips it: its products bound its count, and the numeric pass leaves
//    slack after its entries, which mgpu_spgemm_close_up closes);
//  * numeric pass: the same table with values, then sorted by column and written out.
//
// Rows are binned by size (the symbolic pass by min(products, columns of B), the numeric
// pass by the count of the symbolic one): a warp per row with a table in shared memory
// for small rows, a block per row for larger ones, and, for the longest, tables in global
// memory that many blocks fill together (mgpu_spgemm_global), in batches sized to the memory
// the device has. A masked product (C = (A·B) restricted to a pattern M) needs no table: a
// product is added to the slot of its column in M's sorted row, found by a binary search.
#include "common.cuh"

#define MGPU_SPGEMM_EMPTY 0x7fffffff  // column indices are < 2^31 - 1 (cupyx CSR is 32-bit)

namespace mgpu {

// Fibonacci hashing: the high bits of col × 2^32/φ, so that columns of a common stride (a
// banded or blocked B) still spread over the table; `bits` = log2(table size) >= 1.
__device__ __forceinline__ unsigned spgemm_hash(int col, int bits) {
    return (static_cast<unsigned>(col) * 2654435769u) >> (32 - bits);
}

// the largest j in [lo, hi] with cum[j] <= p (cum nondecreasing, cum[lo] <= p): A's nonzero
// whose products hold product p (a nonzero whose B row is empty has cum[j] == cum[j + 1] and
// is skipped, as the largest such j is taken)
__device__ __forceinline__ long long spgemm_owner(const long long* __restrict__ cum, long long lo,
                                                  long long hi, long long p) {
    while (lo < hi) {
        long long mid = (lo + hi + 1) >> 1;
        if (cum[mid] <= p) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// The slot of column `col` in a table of MASK + 1 slots of keys (linear probing from slot h),
// claimed where the column is new (then ++fresh). READ: a slot's key is read before it is
// claimed, where most products of a row add to a column already in the table and a read
// costs less than an atomic (a key never changes once set, so a read that finds the column
// is final): the tables in global memory, whose atomics go to L2.
template <unsigned long long MASK, bool READ, typename Index>
__device__ __forceinline__ Index spgemm_insert(int* keys, Index h, int col, int& fresh,
                                               Index mask = MASK) {
    while (true) {
        const int k = READ ? *static_cast<volatile int*>(keys + h) : MGPU_SPGEMM_EMPTY;
        if (k == col) return h;
        if (k == MGPU_SPGEMM_EMPTY) {
            const int prev = atomicCAS(keys + h, MGPU_SPGEMM_EMPTY, col);
            if (prev == MGPU_SPGEMM_EMPTY) {
                ++fresh;
                return h;
            }
            if (prev == col) return h;
        }
        h = (h + 1) & mask;
    }
}

// Adds the warp's `zero` (each lane's count of exact zeros written) to *zeros, one atomic a
// warp: every lane of the warp calls it. An atomic a lane would put every thread of the grid
// on one address where sums often cancel (half of a circuit matrix's square: a millisecond).
__device__ __forceinline__ void spgemm_count_zeros(unsigned long long* zeros, int zero) {
    zero = warp_sum(zero);
    if ((threadIdx.x & 31) == 0 && zero) atomicAdd(zeros, static_cast<unsigned long long>(zero));
}

__host__ __device__ constexpr int log2_of(int n) { return n > 1 ? 1 + log2_of(n >> 1) : 0; }

// The products p .. p1 - 1 (p1 - p <= RUN) of the nonzeros from j on (cum[j] <= p): their
// columns (-1 past p1) and, with VALUES, their values. Every load of the run is issued before
// any hash insert, so that a thread waits for memory once a run, not once a product; the B row
// start is looked up again only where the run crosses into the next nonzero.
template <typename T, int RUN, bool VALUES>
__device__ __forceinline__ void spgemm_fetch(const long long* __restrict__ cum,
                                             const int* __restrict__ a_idx,
                                             const T* __restrict__ a_val,
                                             const int* __restrict__ b_ptr,
                                             const int* __restrict__ b_idx,
                                             const T* __restrict__ b_val, long long j,
                                             long long p, long long p1, int (&cols)[RUN],
                                             T (&prods)[RUN]) {
    long long next = cum[j + 1];
    long long shift = b_ptr[a_idx[j]] - cum[j];  // B position of product q: q + shift
    T a = VALUES ? a_val[j] : T(0);
#pragma unroll
    for (int s = 0; s < RUN; ++s) {
        const long long q = p + s;
        cols[s] = -1;
        if (q < p1) {
            while (next <= q) {
                ++j;
                next = cum[j + 1];
                shift = b_ptr[a_idx[j]] - cum[j];
                if (VALUES) a = a_val[j];
            }
            cols[s] = b_idx[q + shift];
            if (VALUES) prods[s] = a * b_val[q + shift];
        }
    }
}

// Products q0 .. qend - 1 of a list of rows (`rows`, nrows of them, whose products are
// numbered rcum[r] .. rcum[r + 1] - 1 in list order; qend - q0 <= RUN), in one piece per
// listed row they fall in: piece(r, row, cols, prods) with each piece's columns (-1 past its
// end) and, with VALUES, values (spgemm_fetch). The global tables and the dense accumulators
// walk their lists so.
template <typename T, bool VALUES, int RUN, typename Piece>
__device__ __forceinline__ void spgemm_list_run(
    const int* __restrict__ a_ptr, const int* __restrict__ a_idx, const T* __restrict__ a_val,
    const int* __restrict__ b_ptr, const int* __restrict__ b_idx, const T* __restrict__ b_val,
    const long long* __restrict__ cum, const int* __restrict__ rows, int nrows,
    const long long* __restrict__ rcum, long long q0, long long qend, Piece piece) {
    long long q = q0;
    int r = static_cast<int>(spgemm_owner(rcum, 0, nrows - 1, q));
    while (q < qend) {
        const int row = rows[r];
        const long long a0 = a_ptr[row];
        const long long shift = cum[a0] - rcum[r];  // product q of the list: q + shift
        const long long stop = qend < rcum[r + 1] ? qend : rcum[r + 1];
        int cols[RUN];
        T prods[RUN];
        spgemm_fetch<T, RUN, VALUES>(cum, a_idx, a_val, b_ptr, b_idx, b_val,
                                     spgemm_owner(cum, a0, a_ptr[row + 1] - 1, q + shift),
                                     q + shift, stop + shift, cols, prods);
        piece(r, row, cols, prods);
        q = stop;
        while (q < qend && q >= rcum[r + 1]) ++r;
    }
}

template <int GROUP>
__device__ __forceinline__ void group_sync() {
    if (GROUP == 32) __syncwarp(); else __syncthreads();
}

// before[w] = the set bits of bitmap[0 .. w - 1], for `words` words, by a block of BLOCK
// threads (a multiple of 32): each thread counts a contiguous stretch, the stretches' counts
// are scanned across the block (shuffles in a warp, then the warps' totals), and each
// thread writes its stretch's prefixes. Ends with the block in step.
template <int BLOCK>
__device__ void block_scan_popc(const unsigned* __restrict__ bitmap, int* __restrict__ before,
                                int words, int* __restrict__ warp_sums) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int per = (words + BLOCK - 1) / BLOCK;
    const int w0 = t * per < words ? t * per : words;
    const int w1 = w0 + per < words ? w0 + per : words;
    int own = 0;
    for (int w = w0; w < w1; ++w) own += __popc(bitmap[w]);
    int incl = own;  // inclusive scan in the warp
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(MGPU_FULL_MASK, incl, off);
        if (lane >= off) incl += v;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int s = lane < BLOCK / 32 ? warp_sums[lane] : 0;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int v = __shfl_up_sync(MGPU_FULL_MASK, s, off);
            if (lane >= off) s += v;
        }
        if (lane < BLOCK / 32) warp_sums[lane] = s;  // inclusive over the warps
    }
    __syncthreads();
    int run = incl - own + (warp > 0 ? warp_sums[warp - 1] : 0);
    for (int w = w0; w < w1; ++w) {
        before[w] = run;
        run += __popc(bitmap[w]);
    }
    __syncthreads();
}

}  // namespace mgpu

// Prefix sums over the device in three launches: scan_reduce sums each tile of SCAN_TILE
// values, scan_partials turns the tiles' sums into their exclusive prefixes (one block), and
// scan_apply scans each tile from its prefix: out[0] = 0, out[i + 1] = v[0] + ... + v[i]. The
// values: with LENGTHS, v[j] = the length of the B row that A's nonzero j picks (the
// intermediate products' prefix sums, cum); else v[j] = in[j] (C's row offsets from each
// row's count). out32, where not null, takes the same sums as int (the caller uses it only
// when the total fits); *total, where not null, the sum of all n (for a copy to the host
// beside other numbers).
#define MGPU_SCAN_ITEMS 8
#define MGPU_SCAN_TILE (256 * MGPU_SCAN_ITEMS)

template <bool LENGTHS>
__device__ __forceinline__ long long spgemm_scan_value(const int* __restrict__ in,
                                                       const int* __restrict__ b_ptr,
                                                       long long j) {
    if (LENGTHS) {
        const int k = in[j];
        return b_ptr[k + 1] - b_ptr[k];
    }
    return in[j];
}

// the inclusive sum over the block of `v` (256 threads); `warp_sums` holds 8 values
__device__ __forceinline__ long long spgemm_block_scan(long long v, long long* warp_sums) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const long long u = __shfl_up_sync(MGPU_FULL_MASK, v, off);
        if (lane >= off) v += u;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    long long before = 0;
    for (int w = 0; w < warp; ++w) before += warp_sums[w];
    return v + before;
}

// rcum[i + 1] = the products of the listed rows rows[0 .. i] (rcum[0] = 0): one block, each
// thread a stretch of the list (the rows past the shared tables are a few thousand at most)
__global__ void __launch_bounds__(256)
mgpu_spgemm_row_cum(const int* __restrict__ rows, int nrows, const int* __restrict__ a_ptr,
                    const long long* __restrict__ cum, long long* __restrict__ rcum) {
    __shared__ long long warp_sums[8];
    const int per = (nrows + 255) / 256;
    const int i0 = threadIdx.x * per < nrows ? threadIdx.x * per : nrows;
    const int i1 = i0 + per < nrows ? i0 + per : nrows;
    long long own = 0;
    for (int i = i0; i < i1; ++i) own += cum[a_ptr[rows[i] + 1]] - cum[a_ptr[rows[i]]];
    long long run = spgemm_block_scan(own, warp_sums) - own;
    for (int i = i0; i < i1; ++i) {
        run += cum[a_ptr[rows[i] + 1]] - cum[a_ptr[rows[i]]];
        rcum[i + 1] = run;
    }
    if (threadIdx.x == 0) rcum[0] = 0;
}

template <bool LENGTHS>
__global__ void __launch_bounds__(256)
mgpu_spgemm_scan_reduce(const int* __restrict__ in, const int* __restrict__ b_ptr, long long n,
                        long long* __restrict__ partial) {
    __shared__ long long warp_sums[8];
    const long long base = static_cast<long long>(blockIdx.x) * MGPU_SCAN_TILE;
    long long own = 0;
#pragma unroll
    for (int s = 0; s < MGPU_SCAN_ITEMS; ++s) {
        const long long j = base + s * 256 + threadIdx.x;  // coalesced
        if (j < n) own += spgemm_scan_value<LENGTHS>(in, b_ptr, j);
    }
    own = mgpu::warp_sum(own);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = own;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long t = 0;
        for (int w = 0; w < 8; ++w) t += warp_sums[w];
        partial[blockIdx.x] = t;
    }
}

// one block: each thread takes a stretch of consecutive tiles
__global__ void __launch_bounds__(256)
mgpu_spgemm_scan_partials(long long* __restrict__ partial, long long tiles) {
    __shared__ long long warp_sums[8];
    const long long per = (tiles + 255) / 256;
    const long long i0 = threadIdx.x * per < tiles ? threadIdx.x * per : tiles;
    const long long i1 = i0 + per < tiles ? i0 + per : tiles;
    long long own = 0;
    for (long long i = i0; i < i1; ++i) own += partial[i];
    long long run = spgemm_block_scan(own, warp_sums) - own;
    for (long long i = i0; i < i1; ++i) {
        const long long v = partial[i];
        partial[i] = run;
        run += v;
    }
}

template <bool LENGTHS>
__global__ void __launch_bounds__(256)
mgpu_spgemm_scan_apply(const int* __restrict__ in, const int* __restrict__ b_ptr, long long n,
                       const long long* __restrict__ partial, long long* __restrict__ out,
                       int* __restrict__ out32, long long* __restrict__ total) {
    __shared__ long long warp_sums[8];
    // each thread scans MGPU_SCAN_ITEMS consecutive values of the tile
    const long long base = static_cast<long long>(blockIdx.x) * MGPU_SCAN_TILE +
                           threadIdx.x * MGPU_SCAN_ITEMS;
    long long v[MGPU_SCAN_ITEMS];
    long long own = 0;
#pragma unroll
    for (int s = 0; s < MGPU_SCAN_ITEMS; ++s) {
        v[s] = base + s < n ? spgemm_scan_value<LENGTHS>(in, b_ptr, base + s) : 0;
        own += v[s];
    }
    long long run = partial[blockIdx.x] + spgemm_block_scan(own, warp_sums) - own;
#pragma unroll
    for (int s = 0; s < MGPU_SCAN_ITEMS; ++s) {
        if (base + s < n) {
            run += v[s];
            out[base + s + 1] = run;
            if (out32) out32[base + s + 1] = static_cast<int>(run);
            if (total && base + s + 1 == n) *total = run;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = 0;
        if (out32) out32[0] = 0;
        if (total && n == 0) *total = 0;
    }
}

// The size by which row `row` is binned: with PRODUCTS, min(its products, n), else
// sizes[row] (the symbolic pass's count), but at least its products / `ratio`: a row of many
// products goes to a table of more threads (past the last, to the tables in global memory,
// whose products the whole grid shares), so that no group is left with a row that takes
// longer than all the others together.
template <bool PRODUCTS>
__device__ __forceinline__ long long spgemm_row_size(int row, const int* __restrict__ a_ptr,
                                                     const long long* __restrict__ cum,
                                                     const int* __restrict__ sizes, long long n,
                                                     long long ratio) {
    const long long f = cum[a_ptr[row + 1]] - cum[a_ptr[row]];
    const long long s = PRODUCTS ? (f < n ? f : n) : sizes[row];
    const long long w = f / ratio;
    return s > w ? s : w;
}

// bin b >= 1 of a size s > 0: the first b with s <= edges[b - 1], nedges + 1 past the last;
// 0 for an empty row
__device__ __forceinline__ int spgemm_bin(long long s, const long long* __restrict__ edges,
                                          int nedges) {
    if (s <= 0) return 0;
    int b = 1;
    while (b <= nedges && s > edges[b - 1]) ++b;
    return b;
}

// The bins of rows r0 .. r1 - 1 in `status` (long long, zeroed beforehand): status[b] the
// rows of bin b (0 .. nedges + 1), and status[MGPU_SPGEMM_TOTAL] = *total where total is not
// null (C's size, or all the products, read on the host in the same copy as the counts).
// With PRODUCTS, a row of 1 to `few` products is *short*: it may skip the symbolic pass (its
// products, at most n, bound its count); the short rows are counted in
// status[MGPU_SPGEMM_SHORT], and by bin in status[MGPU_SPGEMM_SHORT_BINS + b] (they are in
// status[b] too), their products in status[MGPU_SPGEMM_SHORT_PRODUCTS]: the host decides
// from these whether the short rows skip the count (mgpu_spgemm_bin_fill then leaves them
// out of the bins) or are counted like the rest.
#define MGPU_SPGEMM_CURSOR 16  // status[16 + b]: bin b's rows listed so far (mgpu_spgemm_bin_fill)
#define MGPU_SPGEMM_TOTAL 32
#define MGPU_SPGEMM_SHORT 33
#define MGPU_SPGEMM_SHORT_PRODUCTS 34
#define MGPU_SPGEMM_SHORT_BINS 36
template <bool PRODUCTS>
__device__ __forceinline__ bool spgemm_short(int row, const int* __restrict__ a_ptr,
                                             const long long* __restrict__ cum, long long few) {
    if (!PRODUCTS) return false;
    const long long f = cum[a_ptr[row + 1]] - cum[a_ptr[row]];
    return f > 0 && f <= few;
}

template <bool PRODUCTS>
__global__ void __launch_bounds__(256)
mgpu_spgemm_bin_count(int r0, int r1, const int* __restrict__ a_ptr,
                      const long long* __restrict__ cum, const int* __restrict__ sizes,
                      long long n, long long ratio, long long few,
                      const long long* __restrict__ edges, int nedges,
                      unsigned long long* __restrict__ status,
                      const long long* __restrict__ total) {
    __shared__ int local[32];  // the rows of each bin, then the short rows of each bin
    __shared__ unsigned long long short_products;
    if (threadIdx.x < 32) local[threadIdx.x] = 0;
    if (threadIdx.x == 0) short_products = 0;
    __syncthreads();
    unsigned long long mine = 0;
    for (int row = r0 + blockIdx.x * blockDim.x + threadIdx.x; row < r1;
         row += gridDim.x * blockDim.x) {
        const int b = spgemm_bin(spgemm_row_size<PRODUCTS>(row, a_ptr, cum, sizes, n, ratio),
                                 edges, nedges);
        atomicAdd(local + b, 1);
        if (PRODUCTS) {
            const long long f = cum[a_ptr[row + 1]] - cum[a_ptr[row]];
            if (f > 0 && f <= few) {
                atomicAdd(local + 16 + b, 1);
                mine += static_cast<unsigned long long>(f);
            }
        }
    }
    if (PRODUCTS) {
        for (int d = 16; d > 0; d >>= 1) mine += __shfl_down_sync(MGPU_FULL_MASK, mine, d);
        if ((threadIdx.x & 31) == 0 && mine) atomicAdd(&short_products, mine);
    }
    __syncthreads();
    if (threadIdx.x < nedges + 2 && local[threadIdx.x])
        atomicAdd(status + threadIdx.x, static_cast<unsigned long long>(local[threadIdx.x]));
    if (PRODUCTS && threadIdx.x >= 16 && threadIdx.x < 16 + nedges + 2 &&
        local[threadIdx.x]) {
        const unsigned long long k = static_cast<unsigned long long>(local[threadIdx.x]);
        atomicAdd(status + MGPU_SPGEMM_SHORT_BINS + threadIdx.x - 16, k);
        atomicAdd(status + MGPU_SPGEMM_SHORT, k);
    }
    if (PRODUCTS && threadIdx.x == 0 && short_products)
        atomicAdd(status + MGPU_SPGEMM_SHORT_PRODUCTS, short_products);
    if (total && blockIdx.x == 0 && threadIdx.x == 0)
        status[MGPU_SPGEMM_TOTAL] = static_cast<unsigned long long>(*total);
}

// Rows r0 .. r1 - 1 of a non-empty bin listed in `rows`, bin by bin (bin 1 first; bin 0, the
// empty rows, not listed), from the counts of mgpu_spgemm_bin_count in `status` (the order
// within a bin is the warps' arrival order): one atomic per bin a warp. With `few` > 0, the
// short rows are not listed either: a short row's bound, min(products, n), goes to
// bounds[row] instead (`few` as mgpu_spgemm_bin_count had it, or 0: every row listed).
template <bool PRODUCTS>
__global__ void __launch_bounds__(256)
mgpu_spgemm_bin_fill(int r0, int r1, const int* __restrict__ a_ptr,
                     const long long* __restrict__ cum, const int* __restrict__ sizes,
                     long long n, long long ratio, long long few,
                     const long long* __restrict__ edges, int nedges,
                     unsigned long long* __restrict__ status, int* __restrict__ rows,
                     int* __restrict__ bounds) {
    const int lane = threadIdx.x & 31;
    for (int base = r0 + (blockIdx.x * blockDim.x + threadIdx.x) - lane; base < r1;
         base += gridDim.x * blockDim.x) {
        const int row = base + lane;
        int b = -1;
        if (row < r1) {
            if (spgemm_short<PRODUCTS>(row, a_ptr, cum, few)) {
                const long long f = cum[a_ptr[row + 1]] - cum[a_ptr[row]];
                bounds[row] = static_cast<int>(f < n ? f : n);
                b = 0;
            } else {
                b = spgemm_bin(spgemm_row_size<PRODUCTS>(row, a_ptr, cum, sizes, n, ratio),
                               edges, nedges);
            }
        }
        const unsigned same = __match_any_sync(MGPU_FULL_MASK, b);
        const int leader = __ffs(same) - 1;
        long long at = 0;
        if (b > 0 && lane == leader) {
            for (int c = 1; c < b; ++c) {
                at += static_cast<long long>(status[c]);
                if (PRODUCTS && few > 0)
                    at -= static_cast<long long>(status[MGPU_SPGEMM_SHORT_BINS + c]);
            }
            at += static_cast<long long>(atomicAdd(status + MGPU_SPGEMM_CURSOR + b,
                                                   static_cast<unsigned long long>(__popc(same))));
        }
        at = __shfl_sync(MGPU_FULL_MASK, at, leader);
        if (b > 0) rows[at + __popc(same & ((1u << lane) - 1))] = row;
    }
}

// One row per group of GROUP threads (a warp, or a whole block of 256 or more), with a table of
// TABLE slots in shared memory per group. NUMERIC false: count each listed row's distinct
// columns into row_nnz[row]. NUMERIC true: sum the products per column, sort the table by
// column (bitonic) and write the row's row_nnz entries at c_off[row] - c_base of c_idx/c_val,
// counting in `zeros` the sums that came out exactly 0 (the host leaves them out after).
// The host lists in `rows` only rows whose size is at most half of TABLE (so that probes
// stay short: the symbolic pass's sizes are bounds, often the count itself). DYNAMIC: the
// table lives in dynamic shared memory (up to the device's opt-in limit; the host sets the
// kernel's attribute and passes its size), for the largest tables, one group a block.
template <typename T, int GROUP, int TABLE, bool NUMERIC, bool DYNAMIC = false, int RUN = 4>
__global__ void __launch_bounds__(GROUP > 256 ? GROUP : 256)
mgpu_spgemm_shared(const int* __restrict__ a_ptr, const int* __restrict__ a_idx,
                   const T* __restrict__ a_val, const int* __restrict__ b_ptr,
                   const int* __restrict__ b_idx, const T* __restrict__ b_val,
                   const long long* __restrict__ cum, const int* __restrict__ rows, int nrows,
                   int* __restrict__ row_nnz, const long long* __restrict__ c_off,
                   long long c_base, int* __restrict__ c_idx, T* __restrict__ c_val,
                   unsigned long long* __restrict__ zeros, int words) {
    constexpr int GROUPS = (GROUP > 256 ? GROUP : 256) / GROUP;  // blocks: 256 threads or a group
    constexpr int BITS = mgpu::log2_of(TABLE);
    static_assert(TABLE == 1 << BITS && TABLE >= 2 * GROUP,
                  "TABLE: a power of two, at least two slots a thread");
    static_assert(!DYNAMIC || GROUPS == 1, "a dynamic table takes the whole block");
    constexpr int STATIC = DYNAMIC ? 1 : GROUPS * TABLE;
    __shared__ int static_keys[STATIC];
    __shared__ T static_vals[NUMERIC ? STATIC : 1];
    extern __shared__ __align__(16) unsigned char dynamic_smem[];
    __shared__ int counts[GROUPS];
    const int g = threadIdx.x / GROUP;
    const int lane = threadIdx.x % GROUP;
    // dynamic: the values (8-byte aligned) first, then the keys
    int* key = DYNAMIC ? reinterpret_cast<int*>(dynamic_smem + (NUMERIC ? TABLE * sizeof(T) : 0))
                       : static_keys + g * TABLE;
    T* val = DYNAMIC ? reinterpret_cast<T*>(dynamic_smem) : static_vals + (NUMERIC ? g * TABLE : 0);
    // numeric, a group a block, words > 0: a bitmap of C's columns (words of 32) in dynamic
    // shared memory (after the keys of a dynamic table), and each word's count of set bits
    // before it, which place every column of the row in order without a sort
    const bool ranked = NUMERIC && GROUPS == 1 && words > 0;
    unsigned* bitmap = DYNAMIC ? reinterpret_cast<unsigned*>(key + TABLE)
                               : reinterpret_cast<unsigned*>(dynamic_smem);
    int* before = reinterpret_cast<int*>(bitmap + words);
    __shared__ int warp_sums[32];
    for (int r = blockIdx.x * GROUPS + g; r < nrows; r += gridDim.x * GROUPS) {
        const int row = rows[r];
        for (int t = lane; t < TABLE; t += GROUP) {
            key[t] = MGPU_SPGEMM_EMPTY;
            if (NUMERIC) val[t] = T(0);
        }
        if (ranked)
            for (int w = lane; w < words; w += GROUP) bitmap[w] = 0u;
        if (lane == 0) counts[g] = 0;
        mgpu::group_sync<GROUP>();
        const long long a0 = a_ptr[row], a1 = a_ptr[row + 1];
        const long long p0 = cum[a0], f = cum[a1] - p0;
        // each lane takes RUN consecutive products at a time: one search, then a walk. The
        // loop runs alike for a whole warp and brings its lanes back into step after each
        // run: a lane that probes longer (or retries an addition to a column other lanes
        // add to) would otherwise leave the warp split in groups that each issue the rest
        // of the row's loads and searches on their own, a few lanes at a time.
        const int wl = threadIdx.x & 31;
        int fresh = 0;
        for (long long w0 = static_cast<long long>(lane - wl) * RUN; w0 < f;
             w0 += GROUP * RUN) {
            const long long q0 = w0 + wl * RUN;
            if (q0 < f) {
                const long long p = p0 + q0;
                int cols[RUN];
                T prods[RUN];
                mgpu::spgemm_fetch<T, RUN, NUMERIC>(
                    cum, a_idx, a_val, b_ptr, b_idx, b_val,
                    mgpu::spgemm_owner(cum, a0, a1 - 1, p), p,
                    p0 + (q0 + RUN < f ? q0 + RUN : f), cols, prods);
#pragma unroll
                for (int s = 0; s < RUN; ++s) {
                    if (cols[s] < 0) break;
                    const unsigned h = mgpu::spgemm_insert<TABLE - 1, false>(
                        key, mgpu::spgemm_hash(cols[s], BITS), cols[s], fresh);
                    if (NUMERIC) atomicAdd(val + h, prods[s]);
                }
            }
            __syncwarp();
        }
        if (!NUMERIC) {
            if (fresh) atomicAdd(counts + g, fresh);
            mgpu::group_sync<GROUP>();
            if (lane == 0) row_nnz[row] = counts[g];
        } else if (ranked) {
            mgpu::group_sync<GROUP>();  // every product is in
            for (int t = lane; t < TABLE; t += GROUP) {
                const int k = key[t];
                if (k != MGPU_SPGEMM_EMPTY) atomicOr(bitmap + (k >> 5), 1u << (k & 31));
            }
            mgpu::group_sync<GROUP>();
            mgpu::block_scan_popc<GROUP>(bitmap, before, words, warp_sums);
            // the row's count back to row_nnz: a short row's bound is replaced by it
            if (lane == 0) row_nnz[row] = before[words - 1] + __popc(bitmap[words - 1]);
            const long long out = c_off[row] - c_base;
            int zero = 0;
            for (int t = lane; t < TABLE; t += GROUP) {
                const int k = key[t];
                if (k == MGPU_SPGEMM_EMPTY) continue;
                const long long at = out + before[k >> 5] +
                                     __popc(bitmap[k >> 5] & ((1u << (k & 31)) - 1u));
                c_idx[at] = k;
                c_val[at] = val[t];
                zero += val[t] == T(0);
            }
            mgpu::spgemm_count_zeros(zeros, zero);
        } else {
            // Gather the n occupied slots at the front of the table (in any order), fill up to
            // the next power of two with empty keys and sort only those: a row of 5 columns
            // in a table of 256 sorts 8 entries. The gathering goes in chunks of CHUNK slots
            // a thread (read, wait, write the occupied ones): a write lands below the number
            // of slots read so far, so it never overwrites a slot not yet read.
            constexpr int SLOTS = TABLE / GROUP;
            constexpr int CHUNK = SLOTS < 4 ? SLOTS : 4;
#pragma unroll 1
            for (int c0 = 0; c0 < SLOTS; c0 += CHUNK) {
                int ks[CHUNK];
                T vs[CHUNK];
                mgpu::group_sync<GROUP>();  // every product is in / the last chunk written
#pragma unroll
                for (int s = 0; s < CHUNK; ++s) {
                    ks[s] = key[lane + (c0 + s) * GROUP];
                    vs[s] = val[lane + (c0 + s) * GROUP];
                }
                mgpu::group_sync<GROUP>();
#pragma unroll
                for (int s = 0; s < CHUNK; ++s) {
                    if (ks[s] != MGPU_SPGEMM_EMPTY) {
                        const int at = atomicAdd(counts + g, 1);
                        key[at] = ks[s];
                        val[at] = vs[s];
                    }
                }
            }
            mgpu::group_sync<GROUP>();
            // the row's count: the symbolic pass's, or a short row's own (row_nnz held its
            // bound: the count goes back there, for what is placed after)
            const int n = counts[g];
            if (lane == 0) row_nnz[row] = n;
            int sorted = 1;
            while (sorted < n) sorted <<= 1;
            for (int t = n + lane; t < sorted; t += GROUP) key[t] = MGPU_SPGEMM_EMPTY;
            mgpu::group_sync<GROUP>();
            for (int size = 2; size <= sorted; size <<= 1) {
                for (int stride = size >> 1; stride > 0; stride >>= 1) {
                    for (int t = lane; t < sorted / 2; t += GROUP) {
                        const int lo = 2 * t - (t & (stride - 1));
                        const int hi = lo + stride;
                        const int kl = key[lo], kh = key[hi];
                        if ((kl > kh) == ((lo & size) == 0)) {
                            key[lo] = kh;
                            key[hi] = kl;
                            const T v = val[lo];
                            val[lo] = val[hi];
                            val[hi] = v;
                        }
                    }
                    mgpu::group_sync<GROUP>();
                }
            }
            const long long out = c_off[row] - c_base;
            int zero = 0;
            for (int t = lane; t < n; t += GROUP) {
                c_idx[out + t] = key[t];
                c_val[out + t] = val[t];
                zero += val[t] == T(0);
            }
            mgpu::spgemm_count_zeros(zeros, zero);
        }
        mgpu::group_sync<GROUP>();
    }
}

// The longest rows: the `nrows` rows listed in `rows`, whose products are numbered
// rcum[r] .. rcum[r + 1] - 1 in list order, each with a hash table of its own in global
// memory (slots toff[r] .. toff[r + 1] - 1 of keys/vals, a power of two, keys set to EMPTY
// and values to 0 beforehand). Every thread takes products of the whole list in turn, so a
// row of millions of products is spread over the grid. NUMERIC false: row_nnz[row] counts
// each row's distinct columns; NUMERIC true: vals sums the products per column.
template <typename T, bool NUMERIC, int RUN = 4>
__global__ void __launch_bounds__(256)
mgpu_spgemm_global(const int* __restrict__ a_ptr, const int* __restrict__ a_idx,
                   const T* __restrict__ a_val, const int* __restrict__ b_ptr,
                   const int* __restrict__ b_idx, const T* __restrict__ b_val,
                   const long long* __restrict__ cum, const int* __restrict__ rows, int nrows,
                   const long long* __restrict__ rcum, const long long* __restrict__ toff,
                   int* __restrict__ keys, T* __restrict__ vals, int* __restrict__ row_nnz) {
    const long long total = rcum[nrows];
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x * RUN;
    // each thread takes RUN consecutive products of the list at a time
    for (long long q0 = rcum[0] +
                        (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * RUN;
         q0 < total; q0 += step) {
        mgpu::spgemm_list_run<T, NUMERIC, RUN>(
            a_ptr, a_idx, a_val, b_ptr, b_idx, b_val, cum, rows, nrows, rcum, q0,
            q0 + RUN < total ? q0 + RUN : total,
            [&](int r, int row, const int (&cols)[RUN], const T (&prods)[RUN]) {
                const long long base = toff[r];
                const unsigned long long size =
                    static_cast<unsigned long long>(toff[r + 1] - base);
                const int bits = 63 - __clzll(static_cast<long long>(size));
                int fresh = 0;
#pragma unroll
                for (int s = 0; s < RUN; ++s) {
                    const int col = cols[s];
                    if (col < 0) break;
                    const unsigned long long h = mgpu::spgemm_insert<0, true>(
                        keys + base,
                        static_cast<unsigned long long>(
                            bits > 0 ? mgpu::spgemm_hash(col, bits > 31 ? 31 : bits) : 0),
                        col, fresh, size - 1);
                    if (NUMERIC) atomicAdd(vals + base + h, prods[s]);
                }
                if (!NUMERIC && fresh) atomicAdd(row_nnz + row, fresh);
            });
    }
}

// Moves the occupied slots of the global tables of mgpu_spgemm_global (numeric) to the rows'
// places in C (c_off[row] - c_base onwards), in slot order; `fill` (one counter per listed
// row, zeroed beforehand) hands out the places. The host sorts each row's columns after.
template <typename T>
__global__ void __launch_bounds__(256)
mgpu_spgemm_global_gather(const int* __restrict__ rows, int nrows,
                          const long long* __restrict__ toff, const int* __restrict__ keys,
                          const T* __restrict__ vals, int* __restrict__ fill,
                          const long long* __restrict__ c_off, long long c_base,
                          int* __restrict__ c_idx, T* __restrict__ c_val,
                          unsigned long long* __restrict__ zeros) {
    const long long total = toff[nrows];
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    const int lane = threadIdx.x & 31;
    // warp-uniform loop: the lanes of a warp that fill one row take their places with one
    // atomic, not one each
    for (long long s0 = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x - lane;
         s0 < total; s0 += step) {
        const long long s = s0 + lane;
        const int k = s < total ? keys[s] : MGPU_SPGEMM_EMPTY;
        const bool occupied = k != MGPU_SPGEMM_EMPTY;
        const int r = occupied ? static_cast<int>(mgpu::spgemm_owner(toff, 0, nrows - 1, s)) : -1;
        const unsigned same = __match_any_sync(MGPU_FULL_MASK, r);
        const int leader = __ffs(same) - 1;
        int at = 0;
        if (occupied && lane == leader) at = atomicAdd(fill + r, __popc(same));
        at = __shfl_sync(MGPU_FULL_MASK, at, leader);
        int zero = 0;
        if (occupied) {
            const long long out = c_off[rows[r]] - c_base + at + __popc(same & ((1u << lane) - 1));
            c_idx[out] = k;
            c_val[out] = vals[s];
            zero = vals[s] == T(0);
        }
        mgpu::spgemm_count_zeros(zeros, zero);
    }
}

// The numeric tables of mgpu_spgemm_global to C in column order, a block a listed row: a
// bitmap of the row's columns (`words` words of 32, in dynamic shared memory, with each word's
// count of set bits before it) places every column without a sort. Counts exact zeros into
// `zeros`.
template <typename T, int RUN = 4>
__global__ void __launch_bounds__(256)
mgpu_spgemm_global_rank(const int* __restrict__ rows, int nrows,
                        const long long* __restrict__ toff, const int* __restrict__ keys,
                        const T* __restrict__ vals, const long long* __restrict__ c_off,
                        long long c_base, int* __restrict__ c_idx, T* __restrict__ c_val,
                        unsigned long long* __restrict__ zeros, int words) {
    extern __shared__ __align__(16) unsigned char dynamic_smem[];
    unsigned* bitmap = reinterpret_cast<unsigned*>(dynamic_smem);
    int* before = reinterpret_cast<int*>(bitmap + words);
    __shared__ int warp_sums[32];
    for (int r = blockIdx.x; r < nrows; r += gridDim.x) {
        for (int w = threadIdx.x; w < words; w += blockDim.x) bitmap[w] = 0u;
        __syncthreads();
        const long long base = toff[r], size = toff[r + 1] - base;
        // RUN slots a thread at a time, their loads issued together (the tables are read
        // from global memory: one load in flight a thread leaves the block waiting)
        for (long long s0 = threadIdx.x; s0 < size; s0 += RUN * blockDim.x) {
            int k[RUN];
#pragma unroll
            for (int u = 0; u < RUN; ++u) {
                const long long s = s0 + u * blockDim.x;
                k[u] = s < size ? keys[base + s] : MGPU_SPGEMM_EMPTY;
            }
#pragma unroll
            for (int u = 0; u < RUN; ++u)
                if (k[u] != MGPU_SPGEMM_EMPTY) atomicOr(bitmap + (k[u] >> 5), 1u << (k[u] & 31));
        }
        __syncthreads();
        mgpu::block_scan_popc<256>(bitmap, before, words, warp_sums);
        const long long out = c_off[rows[r]] - c_base;
        int zero = 0;
        for (long long s0 = threadIdx.x; s0 < size; s0 += RUN * blockDim.x) {
            int k[RUN];
            T v[RUN];
#pragma unroll
            for (int u = 0; u < RUN; ++u) {
                const long long s = s0 + u * blockDim.x;
                k[u] = s < size ? keys[base + s] : MGPU_SPGEMM_EMPTY;
                v[u] = s < size ? vals[base + s] : T(0);
            }
#pragma unroll
            for (int u = 0; u < RUN; ++u) {
                if (k[u] == MGPU_SPGEMM_EMPTY) continue;
                const long long at = out + before[k[u] >> 5] +
                                     __popc(bitmap[k[u] >> 5] & ((1u << (k[u] & 31)) - 1u));
                c_idx[at] = k[u];
                c_val[at] = v[u];
                zero += v[u] == T(0);
            }
        }
        mgpu::spgemm_count_zeros(zeros, zero);
        __syncthreads();
    }
}

// The longest rows again, with a dense accumulator each in global memory in place of a hash
// table, where B's columns are few enough (the host's choice, mgpu_spgemm_global's caller):
// listed row r has a bitmap of C's columns (`words` words of 32 from r * words) and, NUMERIC,
// a value for every column (n from r * n), zeroed beforehand. The products (numbered
// rcum[0] .. rcum[nrows] - 1: a batch of a longer list) are shared out in spans of SPAN
// consecutive ones a block, RUN a thread at a time; each adds to its column's value, with no
// probing and no atomic whose result is waited for. A span's bits go first to a bitmap in
// the block's shared memory (`words` words, dynamic) for the row the span starts in (the
// span's other rows, where it crosses into them, set theirs directly), which is then ORed
// into the row's bitmap a word at a time: a row of a few thousand columns takes hundreds of
// thousands of products, which would otherwise queue on the same few hundred words in L2.
template <typename T, bool NUMERIC, int RUN = 4>
__global__ void __launch_bounds__(256)
mgpu_spgemm_dense(const int* __restrict__ a_ptr, const int* __restrict__ a_idx,
                  const T* __restrict__ a_val, const int* __restrict__ b_ptr,
                  const int* __restrict__ b_idx, const T* __restrict__ b_val,
                  const long long* __restrict__ cum, const int* __restrict__ rows, int nrows,
                  const long long* __restrict__ rcum, long long n, long long words,
                  unsigned* __restrict__ bitmap, T* __restrict__ vals) {
    extern __shared__ __align__(16) unsigned char dynamic_smem[];
    unsigned* span_bits = reinterpret_cast<unsigned*>(dynamic_smem);
    constexpr long long SPAN = 256LL * RUN * 8;
    const long long total = rcum[nrows];
    for (long long s0 = rcum[0] + static_cast<long long>(blockIdx.x) * SPAN; s0 < total;
         s0 += static_cast<long long>(gridDim.x) * SPAN) {
        const long long s1 = s0 + SPAN < total ? s0 + SPAN : total;
        const int home = static_cast<int>(mgpu::spgemm_owner(rcum, 0, nrows - 1, s0));
        for (long long w = threadIdx.x; w < words; w += blockDim.x) span_bits[w] = 0u;
        __syncthreads();
        for (long long q0 = s0 + static_cast<long long>(threadIdx.x) * RUN; q0 < s1;
             q0 += static_cast<long long>(blockDim.x) * RUN) {
            mgpu::spgemm_list_run<T, NUMERIC, RUN>(
                a_ptr, a_idx, a_val, b_ptr, b_idx, b_val, cum, rows, nrows, rcum, q0,
                q0 + RUN < s1 ? q0 + RUN : s1,
                [&](int r, int, const int (&cols)[RUN], const T (&prods)[RUN]) {
                    unsigned* bits = bitmap + static_cast<long long>(r) * words;
#pragma unroll
                    for (int s = 0; s < RUN; ++s) {
                        const int col = cols[s];
                        if (col < 0) break;
                        if (r == home) atomicOr(span_bits + (col >> 5), 1u << (col & 31));
                        else atomicOr(bits + (col >> 5), 1u << (col & 31));
                        if (NUMERIC)
                            atomicAdd(vals + static_cast<long long>(r) * n + col, prods[s]);
                    }
                });
        }
        __syncthreads();
        unsigned* home_bits = bitmap + static_cast<long long>(home) * words;
        for (long long w = threadIdx.x; w < words; w += blockDim.x) {
            const unsigned b = span_bits[w];
            if (b) atomicOr(home_bits + w, b);
        }
        __syncthreads();
    }
}

// row_nnz[rows[r]] = the set bits of listed row r's bitmap (mgpu_spgemm_dense, symbolic): a
// block a row
__global__ void __launch_bounds__(256)
mgpu_spgemm_dense_count(const int* __restrict__ rows, int nrows,
                        const unsigned* __restrict__ bitmap, long long words,
                        int* __restrict__ row_nnz) {
    __shared__ int warp_sums[8];
    for (int r = blockIdx.x; r < nrows; r += gridDim.x) {
        const unsigned* bits = bitmap + static_cast<long long>(r) * words;
        int own = 0;
        for (long long w = threadIdx.x; w < words; w += blockDim.x) own += __popc(bits[w]);
        own = mgpu::warp_sum(own);
        if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = own;
        __syncthreads();
        if (threadIdx.x == 0) {
            int t = 0;
            for (int i = 0; i < 8; ++i) t += warp_sums[i];
            row_nnz[rows[r]] = t;
        }
        __syncthreads();
    }
}

// The dense accumulators of mgpu_spgemm_dense (numeric) to C, a block a listed row: the row's
// bitmap, copied to shared memory and scanned, places each column; a thread writes the columns
// of whole words, in order. Counts exact zeros into `zeros`.
template <typename T>
__global__ void __launch_bounds__(256)
mgpu_spgemm_dense_place(const int* __restrict__ rows, int nrows,
                        const unsigned* __restrict__ g_bitmap, long long n, int words,
                        const T* __restrict__ vals, const long long* __restrict__ c_off,
                        long long c_base, int* __restrict__ c_idx, T* __restrict__ c_val,
                        unsigned long long* __restrict__ zeros) {
    extern __shared__ __align__(16) unsigned char dynamic_smem[];
    unsigned* bitmap = reinterpret_cast<unsigned*>(dynamic_smem);
    int* before = reinterpret_cast<int*>(bitmap + words);
    __shared__ int warp_sums[32];
    for (int r = blockIdx.x; r < nrows; r += gridDim.x) {
        const unsigned* bits = g_bitmap + static_cast<long long>(r) * words;
        for (int w = threadIdx.x; w < words; w += blockDim.x) bitmap[w] = bits[w];
        __syncthreads();
        mgpu::block_scan_popc<256>(bitmap, before, words, warp_sums);
        const long long out = c_off[rows[r]] - c_base;
        const T* row_vals = vals + static_cast<long long>(r) * n;
        int zero = 0;
        for (int w = threadIdx.x; w < words; w += blockDim.x) {
            unsigned b = bitmap[w];
            long long at = out + before[w];
            while (b) {
                const int col = w * 32 + __ffs(b) - 1;
                b &= b - 1;
                const T v = row_vals[col];
                c_idx[at] = col;
                c_val[at] = v;
                zero += v == T(0);
                ++at;
            }
        }
        mgpu::spgemm_count_zeros(zeros, zero);
        __syncthreads();
    }
}

// Masked product: C = A·B only at the stored positions of M (sorted rows, no duplicates).
// Thread t takes RUN consecutive products of the whole matrix (one search for the first,
// then a walk), adds each to the slot of its column in M's row (a binary search), and marks
// the slot as reached. a_row[j] is the row of A's nonzero j.
template <typename T, int RUN>
__global__ void __launch_bounds__(256)
mgpu_spgemm_masked(const int* __restrict__ a_idx, const T* __restrict__ a_val,
                   const int* __restrict__ a_row, long long a_nnz,
                   const int* __restrict__ b_ptr, const int* __restrict__ b_idx,
                   const T* __restrict__ b_val, const long long* __restrict__ cum,
                   const int* __restrict__ m_ptr, const int* __restrict__ m_idx,
                   T* __restrict__ acc, unsigned char* __restrict__ hit) {
    const long long total = cum[a_nnz];
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x * RUN;
    for (long long q0 = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * RUN;
         q0 < total; q0 += step) {
        long long j = mgpu::spgemm_owner(cum, 0, a_nnz - 1, q0);
        const long long q1 = q0 + RUN < total ? q0 + RUN : total;
        for (long long p = q0; p < q1; ++p) {
            while (cum[j + 1] <= p) ++j;
            const int i = a_row[j];
            const long long bp = b_ptr[a_idx[j]] + (p - cum[j]);
            const int col = b_idx[bp];
            int lo = m_ptr[i], hi = m_ptr[i + 1];
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (m_idx[mid] < col) lo = mid + 1; else hi = mid;
            }
            if (lo < m_ptr[i + 1] && m_idx[lo] == col) {
                atomicAdd(acc + lo, a_val[j] * b_val[bp]);
                hit[lo] = 1;
            }
        }
    }
}

// Rows r0 .. r1 - 1 of C (lens[row] entries from c_off[row] - c_base on; the places after them
// up to the next row's are slack, where a short row's bound exceeded its count):
// counts[row - r0] = the row's values that are not exactly 0. A warp a row.
template <typename T>
__global__ void __launch_bounds__(256)
mgpu_spgemm_nonzeros(int r0, int r1, const long long* __restrict__ c_off, long long c_base,
                     const int* __restrict__ lens, const T* __restrict__ c_val,
                     int* __restrict__ counts) {
    const int lane = threadIdx.x & 31;
    for (int row = r0 + (blockIdx.x * blockDim.x + threadIdx.x) / 32; row < r1;
         row += gridDim.x * blockDim.x / 32) {
        int kept = 0;
        const long long end = c_off[row] - c_base + lens[row];
        for (long long t = c_off[row] - c_base + lane; t < end; t += 32)
            kept += c_val[t] != T(0);
        kept = mgpu::warp_sum(kept);
        if (lane == 0) counts[row - r0] = kept;
    }
}

// The same rows copied to out_idx/out_val at new_off[row - r0] without their exact zeros, in
// order (a warp a row: a ballot places each lane's kept entry).
template <typename T>
__global__ void __launch_bounds__(256)
mgpu_spgemm_compact(int r0, int r1, const long long* __restrict__ c_off, long long c_base,
                    const int* __restrict__ lens, const int* __restrict__ c_idx,
                    const T* __restrict__ c_val, const long long* __restrict__ new_off,
                    int* __restrict__ out_idx, T* __restrict__ out_val) {
    const int lane = threadIdx.x & 31;
    for (int row = r0 + (blockIdx.x * blockDim.x + threadIdx.x) / 32; row < r1;
         row += gridDim.x * blockDim.x / 32) {
        long long at = new_off[row - r0];
        const long long end = c_off[row] - c_base + lens[row];
        for (long long t0 = c_off[row] - c_base; t0 < end; t0 += 32) {
            const long long t = t0 + lane;
            const bool keep = t < end && c_val[t] != T(0);
            const unsigned votes = __ballot_sync(MGPU_FULL_MASK, keep);
            if (keep) {
                const long long o = at + __popc(votes & ((1u << lane) - 1));
                out_idx[o] = c_idx[t];
                out_val[o] = c_val[t];
            }
            at += __popc(votes);
        }
    }
}

// Rows r0 .. r1 - 1 of C closed up where none of their values is exactly 0: row `row`'s
// lens[row] entries from c_off[row] - c_base on move to new_off[row - r0] on (the slack after
// them, where a short row's bound exceeded its count, is left behind). The threads share out
// the *places* c_off[r0] .. c_off[r1] (minus c_base), RUN consecutive ones each: a binary
// search of the row offsets for the first, then a walk, so that rows of many entries and
// rows of few keep the threads equally busy.
template <typename T, int RUN>
__global__ void __launch_bounds__(256)
mgpu_spgemm_close_up(int r0, int r1, const long long* __restrict__ c_off, long long c_base,
                     const int* __restrict__ lens, const int* __restrict__ c_idx,
                     const T* __restrict__ c_val, const long long* __restrict__ new_off,
                     int* __restrict__ out_idx, T* __restrict__ out_val) {
    const long long p_lo = c_off[r0] - c_base, p_hi = c_off[r1] - c_base;
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x * RUN;
    for (long long q = p_lo + (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * RUN;
         q < p_hi; q += step) {
        int row = r0, hi = r1 - 1;  // the last row that starts at or before q
        while (row < hi) {
            const int mid = row + ((hi - row + 1) >> 1);
            if (c_off[mid] - c_base <= q) row = mid; else hi = mid - 1;
        }
        long long start = c_off[row] - c_base, next = c_off[row + 1] - c_base;
        long long to = new_off[row - r0];
        int len = lens[row];
        const long long end = q + RUN < p_hi ? q + RUN : p_hi;
        for (long long p = q; p < end; ++p) {
            while (p >= next) {
                ++row;
                start = next;
                next = c_off[row + 1] - c_base;
                to = new_off[row - r0];
                len = lens[row];
            }
            const long long k = p - start;
            if (k < len) {
                out_idx[to + k] = c_idx[p];
                out_val[to + k] = c_val[p];
            }
        }
    }
}
