// Exact sparse kNN and pairwise distances through one semiring table (mgpu/ops/distances.py).
//
// mgpu_knn_csr<T, I, OP, M, KMAX>: one warp per index row and group of up to 32*M queries
// held dense (features x queries of the launch, row-major, so that the queries of one
// feature are contiguous). The grid's y axis holds the launch's groups (q_group queries
// each, the last may hold fewer), so one launch answers many groups. The warp reads its
// row's nonzeros once, 32 at a time, and broadcasts each (feature, value) to the lanes;
// lane l accumulates its group's queries l, l+32, ... by reading their values of that
// feature, a coalesced load from the dense query block. Index nonzeros are thus read once
// per group (not once per query), and a group's part of the query block is sized to stay
// in L2. Rows are taken from a counter per group in the order given (longest first), which
// balances warps without a partition.
//
// The dot-product ("expanded") metrics accumulate q * x over the index row's nonzeros (the
// query's values read from the dense block), finished by an element-wise formula of the dot
// product and per-row statistics.
//
// The union metrics (NAMM sums: L1, Lp, Canberra, Hamming, Jensen-Shannon) and correlation
// walk the union of the two rows' nonzeros: each lane keeps, per query it owns, a position
// in that query's nonzeros (the batch's CSR, sorted by feature); as the warp walks the index
// row in feature order, the lane first adds the terms of its query's features below the
// current one, then the term of the current feature (the query's value or 0), and after the
// row the query's remaining features. Three partial sums per pair, each in increasing
// feature order, take t(q_f, x_f) over the features both rows hold, those only the query
// holds and those only the index row holds, added as both + (query-only + row-only), as the
// CPU kernels do: nothing cancels (a large shared entry cannot swallow a small unshared one),
// and as t is symmetric and the last addition commutes, d(x, y) == d(y, x) to the last bit. Correlation sums the centred
// product (q - mq)(x - mx) over the union and adds (n - |union|) mq mx for the features
// neither row holds: the two-pass form, whatever the rows' offsets. Hamming, and L1 of
// integer values whose row sums stay below 2^53 (counts: the caller checks), keep the dense
// block: their terms and sums are integers, so the sum of t(q, x) over the row's features
// plus (the query's total - its terms at the row's features) is exact, the same bits as the
// walk in any order, at the cost of the index row alone. L-infinity is a max of
// the index row's terms and of the query's largest features outside it.
//
// KMAX > 0: each lane keeps, per query it owns, the k best (key, row) pairs it has seen,
// ordered by key and then by row id (ties go to the lower row, as on the CPU; scikit-learn
// does not order ties by row), and writes them out at the end: k candidates per query leave
// each warp, never the distances.
// KMAX == 0: every key is written to a dense (query x index row) tile (pairwise distances,
// kNN with k beyond the fused lists, and kNN on indexes small enough that the lists would
// keep about every row anyway).
//
// mgpu_select_k<T, KMAX>: the k best of each row of a candidate matrix (keys, optional ids)
// with the same order: each thread keeps a sorted list of its share, then k rounds of a
// block-wide arg-min over the list heads.
//
// mgpu_knn_postings<T, KMAX> (below): the dot-product metrics from a tiled inverted copy of
// the index, for wide corpora; the same keys, ids and tie order as mgpu_knn_csr.
//
// The key is the distance, negated for similarities (inner product), so smaller is better.
#include "common.cuh"

#define MGPU_KNN_THREADS 256
#define MGPU_NO_ID 0x7fffffff

namespace mgpu {

// +inf without math.h (NVRTC has no INFINITY)
template <typename T> __device__ __forceinline__ T pos_inf();
template <> __device__ __forceinline__ float pos_inf<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double pos_inf<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

// The codes of both enums are defined once in mgpu/backends/knn_codes.py;
// tests/test_knn_codes.py checks that these match them.

// Accumulated operation, the template parameter OP of mgpu_knn_csr
enum KnnOp { OP_DOT = 0, OP_KL = 1, OP_L1 = 2, OP_LP = 3, OP_CANBERRA = 4, OP_HAMMING = 5,
             OP_JS = 6, OP_LINF = 7, OP_CORRELATION = 8, OP_L1_COUNTS = 9 };

// Element-wise finish, the runtime argument fin
enum KnnFinish { FIN_EUCLIDEAN = 0, FIN_SQEUCLIDEAN = 1, FIN_COSINE = 2, FIN_CORRELATION = 3,
                 FIN_INNER = 4, FIN_DICE = 5, FIN_JACCARD = 6, FIN_RUSSELLRAO = 7,
                 FIN_HELLINGER = 8, FIN_KL = 9, FIN_L1 = 10, FIN_LP = 11, FIN_CANBERRA = 12,
                 FIN_HAMMING = 13, FIN_JS = 14, FIN_LINF = 15 };

// the union term of the NAMM metrics, as mgpu/backends/numpy.py's _namm_term. Symmetric in
// (q, x) to the bit: the Jensen-Shannon products and their sum are rounded one by one
// (__dmul_rn, __dadd_rn are never contracted into an fma, which would round the two halves
// differently with the arguments swapped).
template <int OP>
__device__ __forceinline__ double namm_term(double q, double x, double p) {
    const double d = fabs(q - x);
    if (OP == OP_L1 || OP == OP_LINF || OP == OP_L1_COUNTS) return d;
    if (OP == OP_LP) return pow(d, p);
    if (OP == OP_CANBERRA) {
        const double s = fabs(q) + fabs(x);
        return s > 0.0 ? d / s : 0.0;
    }
    if (OP == OP_HAMMING) return q != x ? 1.0 : 0.0;
    // Jensen-Shannon on rows normalised to sum 1
    const double m = q + x;
    const double tq = q > 0.0 ? __dmul_rn(q, log(2.0 * q / m)) : 0.0;
    const double tx = x > 0.0 ? __dmul_rn(x, log(2.0 * x / m)) : 0.0;
    return __dadd_rn(tq, tx);
}

// the operations that walk the union of the two rows (the query's CSR beside the index row)
template <int OP>
__device__ __forceinline__ constexpr bool walks_union() {
    return OP == OP_L1 || OP == OP_LP || OP == OP_CANBERRA || OP == OP_JS ||
           OP == OP_CORRELATION;
}

// the union sums whose terms and sums are integers (Hamming; L1 of integer values bounded by
// the caller): every sum is exact, so the query's own terms at the row's features are taken
// out of its total (qs1) with no rounding, whatever the order
template <int OP>
__device__ __forceinline__ constexpr bool exact_sums() {
    return OP == OP_HAMMING || OP == OP_L1_COUNTS;
}

// a: dot product / max (OP_DOT, OP_KL, OP_LINF over the index row's nonzeros); b: the number
// of query nonzeros the row covers (KL)
template <int OP>
__device__ __forceinline__ void accumulate(double& a, double& b, double q, double x, double p) {
    if (OP == OP_DOT) {
        a = fma(q, x, a);
    } else if (OP == OP_KL) {  // x holds log(x) here
        a = fma(q, x, a);
        b += (q != 0.0) ? 1.0 : 0.0;
    } else if (OP == OP_LINF) {
        a = fmax(a, fabs(q - x));
    } else if (exact_sums<OP>()) {  // a: t(q, x) at the row's features; b: t(q, 0) there
        a += namm_term<OP>(q, x, p);
        b += namm_term<OP>(q, 0.0, p);
    }
}

// one feature of the union walk: a the sum of the terms; b the features walked (correlation)
template <int OP>
__device__ __forceinline__ void union_add(double& a, double& b, double q, double x, double mq,
                                          double mx, double p) {
    if (OP == OP_CORRELATION) {
        a = fma(q - mq, x - mx, a);
        b += 1.0;
    } else {
        a = __dadd_rn(a, namm_term<OP>(q, x, p));
    }
}

// the three partial sums of the union walk as one
__device__ __forceinline__ double union_total(double both, double q_only, double x_only) {
    return __dadd_rn(both, __dadd_rn(q_only, x_only));
}

__device__ __forceinline__ double finish(int fin, double a, double b, double x1, double x2,
                                         double q1, double q2, double n, double p) {
    switch (fin) {
        case FIN_EUCLIDEAN: return sqrt(fmax(x1 + q1 - 2.0 * a, 0.0));
        case FIN_SQEUCLIDEAN: return fmax(x1 + q1 - 2.0 * a, 0.0);
        case FIN_COSINE:
        case FIN_CORRELATION: {
            double dot = a, den;
            if (fin == FIN_CORRELATION) {
                // a: the centred product over the union of b features; x1, q1: row means
                // (a constant row's value exactly); x2, q2: centred norms (0: constant)
                dot = a + ((n - b) * x1) * q1;
                den = x2 * q2;
            } else {
                den = x1 * q1;  // norms
            }
            const double d = den > 0.0 ? 1.0 - dot / den : 1.0;
            return fmin(fmax(d, 0.0), 2.0);
        }
        case FIN_INNER: return -a;
        case FIN_DICE:
        case FIN_JACCARD: {  // x1, q1: nonzeros per row; a: shared nonzeros
            const double num = x1 + q1 - 2.0 * a;
            const double den = fin == FIN_DICE ? x1 + q1 : x1 + q1 - a;
            return den > 0.0 ? num / den : 0.0;
        }
        case FIN_RUSSELLRAO: return n > 0.0 ? (n - a) / n : 0.0;
        case FIN_HELLINGER: return sqrt(fmax(1.0 - a, 0.0));
        case FIN_KL:  // q1: sum q log q; q2: the query's nonzeros; b: those the row covers
            return b < q2 ? pos_inf<double>() : q1 - a;
        default: break;
    }
    // NAMM sums: a is the sum of the terms over the union
    const double s = fmax(a, 0.0);
    switch (fin) {
        case FIN_LP: return pow(s, 1.0 / p);
        case FIN_HAMMING: return n > 0.0 ? s / n : 0.0;
        case FIN_JS: return sqrt(s / 2.0);
        default: return s;  // L1, Canberra
    }
}

// (ka, ia) before (kb, ib): smaller key, then lower id
template <typename T>
__device__ __forceinline__ bool before(T ka, int ia, T kb, int ib) {
    return ka < kb || (ka == kb && ia < ib);
}

// insert into a sorted list of at most k entries (count n)
template <typename T, int KMAX>
__device__ __forceinline__ void list_insert(T* keys, int* ids, int& n, int k, T key, int id) {
    if (n == k && !before(key, id, keys[k - 1], ids[k - 1])) return;
    int pos = n < k ? n : k - 1;
    while (pos > 0 && before(key, id, keys[pos - 1], ids[pos - 1])) {
        keys[pos] = keys[pos - 1];
        ids[pos] = ids[pos - 1];
        --pos;
    }
    keys[pos] = key;
    ids[pos] = id;
    if (n < k) ++n;
}

}  // namespace mgpu

// q_ptr, q_idx, q_val: the launch's queries as CSR (q_ptr[c] for query c of the launch, an
// offset into q_idx and q_val, which may hold other queries' nonzeros around them), for the
// union walk in feature order, or for L-infinity ordered by decreasing |value| (q_val holds
// |value|); unused by the other operations. qd: the dense block (features x n_q), read by the
// dot-product operations and L-infinity only. counter: one zeroed int per group.
template <typename T, typename I, int OP, int M, int KMAX>
__global__ void __launch_bounds__(MGPU_KNN_THREADS)
mgpu_knn_csr(const I* __restrict__ indptr, const int* __restrict__ indices,
             const T* __restrict__ data, const int* __restrict__ order, int n_rows,
             const T* __restrict__ qd, int n_q, int q_group,
             const double* __restrict__ xs1, const double* __restrict__ xs2,
             const double* __restrict__ qs1, const double* __restrict__ qs2,
             const int* __restrict__ q_ptr, const int* __restrict__ q_idx,
             const T* __restrict__ q_val,
             int fin, double n_features, double p, int k, int* __restrict__ counter,
             T* __restrict__ out_key, int* __restrict__ out_id, long long ld_out) {
    constexpr bool UNION = mgpu::walks_union<OP>();
    constexpr int END = 0x7fffffff;  // past every feature
    const int lane = threadIdx.x & 31;
    const long long warp = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const long long n_warps = (long long)gridDim.x * (blockDim.x >> 5);
    // this block's group of queries (grid y): q0 .. q0 + nq - 1, each with its own row counter
    const int q0 = blockIdx.y * q_group;
    const int nq = min(q_group, n_q - q0);
    counter += blockIdx.y;

    // per owned query: sorted (key, row) lists; sized by KMAX, filled to k
    T keys[M][KMAX > 0 ? KMAX : 1];
    int ids[M][KMAX > 0 ? KMAX : 1];
    int filled[M];
    // the union walk: per owned query its mean (correlation) and the end of its nonzeros
    double mq[M];
    int q_end[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
        filled[m] = 0;
        const int c = q0 + lane + 32 * m;
        mq[m] = (OP == mgpu::OP_CORRELATION && lane + 32 * m < nq) ? qs1[c] : 0.0;
        q_end[m] = (UNION && lane + 32 * m < nq) ? q_ptr[c + 1] : 0;
    }

    for (;;) {
        int r = 0;
        if (lane == 0) r = atomicAdd(counter, 1);
        r = __shfl_sync(MGPU_FULL_MASK, r, 0);
        if (r >= n_rows) break;
        const int row = order[r];
        const I start = indptr[row];
        const I end = indptr[row + 1];
        const double mx = OP == mgpu::OP_CORRELATION ? xs1[row] : 0.0;

        // a: the dot product, the cross term, the max; for the union walk the sum over the
        // features both rows hold, beside q_only and x_only (those only one row holds)
        double a[M], b[M], q_only[M], x_only[M];
        int q_pos[M], q_next[M];  // the union walk: the next query nonzero and its feature
#pragma unroll
        for (int m = 0; m < M; ++m) {
            a[m] = 0.0;
            b[m] = 0.0;
            q_only[m] = 0.0;
            x_only[m] = 0.0;
            if (UNION) {
                const int c = q0 + lane + 32 * m;
                q_pos[m] = lane + 32 * m < nq ? q_ptr[c] : 0;
                q_next[m] = q_pos[m] < q_end[m] ? q_idx[q_pos[m]] : END;
            }
        }

        for (I base = start; base < end; base += 32) {
            const I mine = base + lane;
            int j = 0;
            T x = T(0);
            if (mine < end) {
                j = indices[mine];
                x = data[mine];
            }
            const int n = (int)((end - base) < 32 ? (end - base) : 32);
#pragma unroll 4
            for (int t = 0; t < n; ++t) {
                const int jt = __shfl_sync(MGPU_FULL_MASK, j, t);
                const double xt = (double)__shfl_sync(MGPU_FULL_MASK, x, t);
                if (UNION) {
#pragma unroll
                    for (int m = 0; m < M; ++m) {
                        // the query's features before this one, then this one
                        while (q_next[m] < jt) {
                            mgpu::union_add<OP>(q_only[m], b[m], (double)q_val[q_pos[m]], 0.0,
                                                mq[m], mx, p);
                            ++q_pos[m];
                            q_next[m] = q_pos[m] < q_end[m] ? q_idx[q_pos[m]] : END;
                        }
                        if (q_next[m] == jt) {
                            mgpu::union_add<OP>(a[m], b[m], (double)q_val[q_pos[m]], xt,
                                                mq[m], mx, p);
                            ++q_pos[m];
                            q_next[m] = q_pos[m] < q_end[m] ? q_idx[q_pos[m]] : END;
                        } else {
                            mgpu::union_add<OP>(x_only[m], b[m], 0.0, xt, mq[m], mx, p);
                        }
                    }
                } else {
                    const T* qrow = qd + (long long)jt * n_q;
#pragma unroll
                    for (int m = 0; m < M; ++m) {
                        const int c = q0 + lane + 32 * m;
                        const double q = lane + 32 * m < nq ? (double)qrow[c] : 0.0;
                        mgpu::accumulate<OP>(a[m], b[m], q, xt, p);
                    }
                }
            }
        }

#pragma unroll
        for (int m = 0; m < M; ++m) {
            const int c = q0 + lane + 32 * m;
            if (lane + 32 * m >= nq) continue;
            if (UNION) {  // the query's features after the row's last
                for (; q_pos[m] < q_end[m]; ++q_pos[m]) {
                    mgpu::union_add<OP>(q_only[m], b[m], (double)q_val[q_pos[m]], 0.0, mq[m],
                                        mx, p);
                }
                // both + (query-only + row-only): the CPU kernels' order, and the last sum
                // commutes, so the rows swapped give the same bits
                a[m] = mgpu::union_total(a[m], q_only[m], x_only[m]);
            } else if (mgpu::exact_sums<OP>()) {  // + the query's terms outside the row
                a[m] += qs1[c] - b[m];
            }
            double d;
            if (OP == mgpu::OP_LINF) {
                // the query's features outside the row: walk them by decreasing |q| until
                // one is absent from the row, or they can no longer beat the max so far
                d = a[m];
                for (int s = q_ptr[c]; s < q_ptr[c + 1]; ++s) {
                    const double v = (double)q_val[s];
                    if (v <= d) break;
                    const int f = q_idx[s];
                    I lo = start, hi = end;
                    while (lo < hi) {
                        const I mid = lo + (hi - lo) / 2;
                        if (indices[mid] < f) lo = mid + 1; else hi = mid;
                    }
                    if (lo == end || indices[lo] != f) { d = v; break; }
                }
            } else {
                d = mgpu::finish(fin, a[m], b[m], xs1 ? xs1[row] : 0.0, xs2 ? xs2[row] : 0.0,
                                 qs1 ? qs1[c] : 0.0, qs2 ? qs2[c] : 0.0, n_features, p);
            }
            if (KMAX == 0) {
                out_key[(long long)c * ld_out + row] = (T)d;
            } else {
                mgpu::list_insert<T, KMAX>(keys[m], ids[m], filled[m], k, (T)d, row);
            }
        }
    }

    if (KMAX > 0) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const int c = q0 + lane + 32 * m;
            if (lane + 32 * m >= nq) continue;
            const long long base = ((long long)c * n_warps + warp) * k;
            for (int t = 0; t < k; ++t) {
                out_key[base + t] = t < filled[m] ? keys[m][t] : mgpu::pos_inf<T>();
                out_id[base + t] = t < filled[m] ? ids[m][t] : MGPU_NO_ID;
            }
        }
    }
}

namespace mgpu {

// A thread's first U postings of one feature in a tile (lo..hi): rows (-1 past the end) and
// values. Consecutive threads read consecutive postings (coalesced).
template <typename T, int U>
__device__ __forceinline__ void load_postings(const unsigned short* __restrict__ p_row,
                                              const T* __restrict__ p_val, int lo, int hi,
                                              int* pr, T* pv) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int i = lo + (int)threadIdx.x + u * MGPU_KNN_THREADS;
        pr[u] = i < hi ? (int)p_row[i] : -1;
        pv[u] = i < hi ? p_val[i] : T(0);
    }
}

// The k best of a block's sorted per-thread lists (lk, li: n entries each), best first, into
// out_key[0..k), out_id[0..k) (written by thread 0): k rounds of a block-wide arg-min over the
// lists' heads. Every thread of the block calls it; ids are distinct within the block (fillers
// only lose), so one thread owns each winner.
template <typename T, int KMAX>
__device__ __forceinline__ void block_best_k(const T* lk, const int* li, int n, int k,
                                             T* s_key, int* s_id, T* __restrict__ out_key,
                                             int* __restrict__ out_id) {
    const int lane = threadIdx.x & 31;
    const int wid = threadIdx.x >> 5;
    int head = 0;
    for (int t = 0; t < k; ++t) {
        T bk = head < n ? lk[head] : pos_inf<T>();
        int bi = head < n ? li[head] : MGPU_NO_ID;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const T ok = __shfl_xor_sync(MGPU_FULL_MASK, bk, off);
            const int oi = __shfl_xor_sync(MGPU_FULL_MASK, bi, off);
            if (before(ok, oi, bk, bi)) { bk = ok; bi = oi; }
        }
        if (lane == 0) { s_key[wid] = bk; s_id[wid] = bi; }
        __syncthreads();
        bk = s_key[0];
        bi = s_id[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            if (before(s_key[w], s_id[w], bk, bi)) { bk = s_key[w]; bi = s_id[w]; }
        }
        __syncthreads();
        if (head < n && li[head] == bi && lk[head] == bk) ++head;
        if (threadIdx.x == 0) {
            out_key[t] = bk;
            out_id[t] = bi;
        }
    }
}

}  // namespace mgpu

// The dense block of a launch's queries (features x n_q, zeroed by the caller) from their CSR
// (q_ptr as mgpu_knn_csr takes it): one warp a query writes its nonzeros.
template <typename T>
__global__ void __launch_bounds__(MGPU_KNN_THREADS)
mgpu_query_block(const int* __restrict__ q_ptr, const int* __restrict__ q_idx,
                 const T* __restrict__ q_val, int n_q, T* __restrict__ qd) {
    const long long c = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (c >= n_q) return;
    const int end = q_ptr[c + 1];
    for (int s = q_ptr[c] + (threadIdx.x & 31); s < end; s += 32) {
        qd[(long long)q_idx[s] * n_q + c] = q_val[s];
    }
}

// The k best of each of n_rows rows of m candidates (keys[r*m + j], ids[r*m + j] or j when
// ids is null), best first; one block per row.
template <typename T, int KMAX>
__global__ void __launch_bounds__(MGPU_KNN_THREADS)
mgpu_select_k(const T* __restrict__ keys, const int* __restrict__ ids, long long m, int k,
              T* __restrict__ out_key, int* __restrict__ out_id) {
    __shared__ T s_key[MGPU_KNN_THREADS / 32];
    __shared__ int s_id[MGPU_KNN_THREADS / 32];
    const long long r = blockIdx.x;
    const T* rk = keys + r * m;
    const int* ri = ids ? ids + r * m : nullptr;

    T lk[KMAX];
    int li[KMAX];
    int n = 0;
    for (long long j = threadIdx.x; j < m; j += blockDim.x) {
        mgpu::list_insert<T, KMAX>(lk, li, n, k, rk[j], ri ? ri[j] : (int)j);
    }
    mgpu::block_best_k<T, KMAX>(lk, li, n, k, s_key, s_id, out_key + r * k, out_id + r * k);
}

// mgpu_knn_postings<T, KMAX>: the dot-product metrics from the index's postings (an
// inverted view: the index rows cut into tiles of tile_rows rows; within a tile, per feature,
// the (row in tile, value) pairs of that feature's nonzeros; tile_ptr[tile * n_feat + f] ..
// tile_ptr[tile * n_feat + f + 1] are those of feature f in the tile). One block per (query,
// tile), the query's blocks of one tile launched together so that the tile's postings stay
// in L2. The block holds the tile's dot products in shared memory (float64) and walks the
// query's features in increasing order; for each, its threads add q * x over that feature's
// postings in the tile (distinct rows: no two threads meet), then wait for each other before
// the next feature. Each row's dot product is thus the fused kernel's sum, term by term in
// feature order: the same bits, so the same keys and ids.
//
// A step (one feature) is short, a few postings a thread and a barrier, so its loads would
// stall it: the features of a chunk of the query (MGPU_KNN_THREADS at a time) are first
// compacted to those with postings in the tile (a block-wide count, in feature order), and
// each thread keeps the first U postings of the next D features in registers, loaded D steps
// before they are added, so the loads of several steps are in flight across the barriers.
// Postings of a feature past the first U per thread (a long posting list) are read in the
// step itself, each thread a strided share.
//
// Every row of the tile is then finished (rows the query shares no feature with hold 0, as in
// the fused kernel) and the block's k best (key, row) pairs, ties to the lower row, go to
// out_key/out_id[(query * n_tiles + tile) * k + t] for the selection over the tiles.
// q_ptr, q_idx, q_val: the launch's queries as CSR (q_ptr as mgpu_knn_csr takes it), each
// query's features increasing. Dynamic shared memory: tile_rows doubles (the caller opts in
// to more than 48 KiB where the tile needs it).
template <typename T, int KMAX>
__global__ void __launch_bounds__(MGPU_KNN_THREADS)
mgpu_knn_postings(const int* __restrict__ tile_ptr, const unsigned short* __restrict__ p_row,
                  const T* __restrict__ p_val, int n_rows, int n_feat, int tile_rows,
                  const int* __restrict__ q_ptr, const int* __restrict__ q_idx,
                  const T* __restrict__ q_val,
                  const double* __restrict__ xs1, const double* __restrict__ xs2,
                  const double* __restrict__ qs1, const double* __restrict__ qs2,
                  int fin, double n_features, double p, int k,
                  T* __restrict__ out_key, int* __restrict__ out_id) {
    constexpr int WARPS = MGPU_KNN_THREADS / 32;
    constexpr int U = 2;  // postings a thread holds per feature
    constexpr int D = 4;  // features loaded ahead
    extern __shared__ double acc[];
    __shared__ int s_lo[MGPU_KNN_THREADS];
    __shared__ int s_hi[MGPU_KNN_THREADS];
    __shared__ double s_q[MGPU_KNN_THREADS];
    __shared__ int s_count[WARPS];
    __shared__ T s_key[WARPS];
    __shared__ int s_id[WARPS];
    const int c = blockIdx.x;
    const int tile = blockIdx.y;
    const int row0 = tile * tile_rows;
    const int rows = min(tile_rows, n_rows - row0);
    const int tid = threadIdx.x;
    const int lane = tid & 31, wid = tid >> 5;
    for (int r = tid; r < rows; r += MGPU_KNN_THREADS) acc[r] = 0.0;

    int pr[D][U];
    T pv[D][U];
    const int* tp = tile_ptr + (long long)tile * n_feat;
    const int qa = q_ptr[c], qb = q_ptr[c + 1];
    for (int base = qa; base < qb; base += MGPU_KNN_THREADS) {
        const int j = base + tid;
        int lo = 0, hi = 0;
        double qv = 0.0;
        if (j < qb) {  // the chunk's features: their postings in the tile and the query's value
            const int f = q_idx[j];
            lo = tp[f];
            hi = tp[f + 1];
            qv = (double)q_val[j];
        }
        // compaction: the features with postings in the tile, in feature order
        const unsigned keep = __ballot_sync(MGPU_FULL_MASK, hi > lo);
        if (lane == 0) s_count[wid] = __popc(keep);
        __syncthreads();  // the counts; the tile zeroed, or the last chunk's features all added
        int at = 0, n = 0;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const int cw = s_count[w];
            at += w < wid ? cw : 0;
            n += cw;
        }
        if (hi > lo) {
            at += __popc(keep & ((1u << lane) - 1u));
            s_lo[at] = lo;
            s_hi[at] = hi;
            s_q[at] = qv;
        }
        __syncthreads();
#pragma unroll
        for (int d = 0; d < D; ++d) {
            if (d < n) mgpu::load_postings<T, U>(p_row, p_val, s_lo[d], s_hi[d], pr[d], pv[d]);
        }
        for (int t = 0; t < n; ++t) {
            const double q = s_q[t];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (pr[0][u] >= 0) acc[pr[0][u]] = fma(q, (double)pv[0][u], acc[pr[0][u]]);
            }
            // a long feature: its postings past the first U per thread
            const int hi_t = s_hi[t];
#pragma unroll 4
            for (int i = s_lo[t] + U * MGPU_KNN_THREADS + tid; i < hi_t; i += MGPU_KNN_THREADS) {
                const int r = p_row[i];
                acc[r] = fma(q, (double)p_val[i], acc[r]);
            }
            // the ring of loaded features moves one step; the free slot takes feature t + D
#pragma unroll
            for (int d = 0; d + 1 < D; ++d) {
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    pr[d][u] = pr[d + 1][u];
                    pv[d][u] = pv[d + 1][u];
                }
            }
            if (t + D < n) {
                mgpu::load_postings<T, U>(p_row, p_val, s_lo[t + D], s_hi[t + D], pr[D - 1],
                                          pv[D - 1]);
            }
            __syncthreads();  // the next feature may hold the same rows
        }
    }
    __syncthreads();

    T lk[KMAX];
    int li[KMAX];
    int filled = 0;
    const double q1 = qs1 ? qs1[c] : 0.0, q2 = qs2 ? qs2[c] : 0.0;
    for (int r = tid; r < rows; r += MGPU_KNN_THREADS) {
        const int row = row0 + r;
        const double d = mgpu::finish(fin, acc[r], 0.0, xs1 ? xs1[row] : 0.0,
                                      xs2 ? xs2[row] : 0.0, q1, q2, n_features, p);
        mgpu::list_insert<T, KMAX>(lk, li, filled, k, (T)d, row);
    }
    const long long at = ((long long)c * gridDim.y + tile) * k;
    mgpu::block_best_k<T, KMAX>(lk, li, filled, k, s_key, s_id, out_key + at, out_id + at);
}

// The tiled postings of mgpu_knn_postings from the index's CSR, one thread per index row:
// mgpu_postings_count adds each nonzero to the count of its (tile, feature) cell; after the
// caller's prefix sum (cursor: each cell's first slot), mgpu_postings_fill puts (row in
// tile, value) into the next free slot of the cell. The order within a cell is arbitrary:
// its rows are distinct, and the kernel adds one term to each.
__global__ void mgpu_postings_count(const int* __restrict__ indptr,
                                    const int* __restrict__ indices, int n_rows, int n_feat,
                                    int tile_rows, int* __restrict__ counts) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows) return;
    int* cell = counts + (long long)(r / tile_rows) * n_feat;
    for (int i = indptr[r]; i < indptr[r + 1]; ++i) atomicAdd(cell + indices[i], 1);
}

template <typename T>
__global__ void mgpu_postings_fill(const int* __restrict__ indptr,
                                   const int* __restrict__ indices, const T* __restrict__ data,
                                   int n_rows, int n_feat, int tile_rows,
                                   int* __restrict__ cursor, unsigned short* __restrict__ p_row,
                                   T* __restrict__ p_val) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows) return;
    int* cell = cursor + (long long)(r / tile_rows) * n_feat;
    const unsigned short local = (unsigned short)(r % tile_rows);
    for (int i = indptr[r]; i < indptr[r + 1]; ++i) {
        const int at = atomicAdd(cell + indices[i], 1);
        p_row[at] = local;
        p_val[at] = data[i];
    }
}

// The peer of the benchmark's NAMM rows: one thread per (query, index row) pair walks the
// union of the two sorted rows, the plain form of the union semiring (and the fused walk's
// reference, to the bit, in the GPU tests).
template <typename T, int OP>
__global__ void mgpu_union_naive(const int* __restrict__ qp, const int* __restrict__ qi,
                                 const T* __restrict__ qv, int n_q,
                                 const int* __restrict__ xp, const int* __restrict__ xi,
                                 const T* __restrict__ xv, int n_rows, double p,
                                 T* __restrict__ out) {
    const long long pair = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (pair >= (long long)n_q * n_rows) return;
    const int c = (int)(pair / n_rows);
    const int row = (int)(pair % n_rows);
    int i = qp[c], i1 = qp[c + 1], j = xp[row], j1 = xp[row + 1];
    // the sums over the features both rows hold, the query's alone and the row's alone,
    // added as the fused walk and the CPU kernels add them (L-infinity: one max)
    double both = 0.0, q_only = 0.0, x_only = 0.0;
    while (i < i1 || j < j1) {
        double q = 0.0, x = 0.0;
        double* acc = &both;
        if (j >= j1 || (i < i1 && qi[i] < xi[j])) {
            q = qv[i++];
            acc = &q_only;
        } else if (i >= i1 || xi[j] < qi[i]) {
            x = xv[j++];
            acc = &x_only;
        } else {
            q = qv[i++];
            x = xv[j++];
        }
        const double t = mgpu::namm_term<OP>(q, x, p);
        if (OP == mgpu::OP_LINF) both = fmax(both, t); else *acc = __dadd_rn(*acc, t);
    }
    out[pair] = (T)(OP == mgpu::OP_LINF ? both : mgpu::union_total(both, q_only, x_only));
}

// The expanded metrics of dense input: the dot products come from cuBLAS (g, n_q x n_rows,
// row stride ld), finished in place into keys.
template <typename T>
__global__ void mgpu_finish_tile(T* __restrict__ g, int n_q, int n_rows, long long ld,
                                 const double* __restrict__ xs1, const double* __restrict__ xs2,
                                 const double* __restrict__ qs1, const double* __restrict__ qs2,
                                 int fin, double n_features, double p) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_q * n_rows) return;
    const int c = (int)(i / n_rows);
    const int row = (int)(i % n_rows);
    T* at = g + (long long)c * ld + row;
    *at = (T)mgpu::finish(fin, (double)*at, 0.0, xs1 ? xs1[row] : 0.0, xs2 ? xs2[row] : 0.0,
                          qs1 ? qs1[c] : 0.0, qs2 ? qs2[c] : 0.0, n_features, p);
}

// Correlation's row statistics: the mean (a constant row's value exactly, so that its centred
// values are exactly 0) and the centred norm over every feature, implicit zeros included
// (0 for a constant row). A row is constant iff every entry is equal: all its stored values
// are 0 where it stores fewer than n features, or all equal where it stores n (a canonical
// CSR without duplicates). One thread per row.
template <typename T>
__global__ void mgpu_centred_stats(const int* __restrict__ indptr, const T* __restrict__ data,
                                   int n_rows, double n, double* __restrict__ mean,
                                   double* __restrict__ norm) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows) return;
    const int i0 = indptr[r], i1 = indptr[r + 1];
    const double stored = (double)(i1 - i0);
    const double c = (i1 > i0 && stored == n) ? (double)data[i0] : 0.0;
    bool constant = true;
    double s = 0.0;
    for (int i = i0; i < i1; ++i) {
        const double v = (double)data[i];
        s += v;
        constant = constant && v == c;
    }
    const double m = constant ? c : s / n;
    double q = 0.0;
    for (int i = i0; i < i1; ++i) {
        const double d = (double)data[i] - m;
        q = fma(d, d, q);
    }
    q += ((n - stored) * m) * m;
    mean[r] = m;
    norm[r] = sqrt(q);
}
