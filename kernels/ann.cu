// Graph-based approximate nearest neighbours on the GPU: GANNS's search and the batched
// construction of GGraphCon (Yu, PhD thesis ch. 4), the GPU side of
// mgpu/backends/numpy_ann.py (whose docstring states the algorithms; the two are kept
// equal, step for step).
//
// mgpu_ann_search: one thread block per query. The block holds in shared memory the two
// fixed-length arrays of GANNS: N, the best vertices met so far (id, distance, explored
// flag), sorted by (distance, id), and T, the neighbours of the vertex being explored. A
// step picks the first unexplored vertex among N's first e entries, loads its neighbours
// into T, scores each (a group of lanes a neighbour) without asking whether it was met
// before (the lazy check), drops the ones N already holds (a binary search of the sorted N
// for the same (distance, id): a vertex scored again scores the same to the last bit, since
// a group's lanes always take the same elements), and merges T into N, keeping N's first
// l_n: by rank (merge_by_rank, the default) or as GANNS does, T sorted by a bitonic network
// and T's i-th entry put against N's (L-1-i)-th, the smaller kept, which leaves N bitonic
// for one bitonic merge. The two give the same N. The search ends when N's first e entries
// are explored. A table of the vertices met (H slots, optional) skips scoring them again.
//
// The same kernel serves the construction: the queries are then the rows of a batch
// (query i is row q0 + i), the graph searched is that of the rows before the batch (ids
// below `limit`), and after the search each row scores the rows of its batch before it
// (pred_lo .. q0 + i - 1), in pieces of T's length merged into N as above; its d_min
// nearest are its links (with `diverse`, HNSW's heuristic picks them).
//
// mgpu_ann_link: the links made back. One thread per vertex linked to in a batch: the
// vertex's list is its own links (first own[v]) then the links made to it, nearest first;
// the new ones (sorted by the host by (target, distance, source)) are merged into the
// old ones in place from the back, the nearest width - own[v] kept.
//
// Rows are dense (X, n x dim, row-major) or CSR (indptr, indices, values X; squared norms
// sq): a sparse pair's dot product is taken over the row's nonzeros, each looked up by a
// binary search in the query's sorted columns (in shared memory where they fit), then
// expanded with the norms, as mgpu's sparse kNN expands it.
#include "common.cuh"

namespace mgpu_ann {

constexpr int EMPTY = 0x7fffffff;  // an empty slot: after every vertex, also at distance inf

template <typename T> __device__ __forceinline__ T infinity();
template <> __device__ __forceinline__ float infinity<float>() {
    return __int_as_float(0x7f800000);
}
template <> __device__ __forceinline__ double infinity<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

// (d1, i1) orders before (d2, i2): by distance, ties by the lower id
template <typename T>
__device__ __forceinline__ bool before(T d1, int i1, T d2, int i2) {
    return d1 < d2 || (d1 == d2 && i1 < i2);
}

// the metric's value from a squared distance's parts or a dot product (numpy_ann.METRICS)
template <typename T>
__device__ __forceinline__ T finish(T acc, T sq_u, T sq_q, int metric, bool sparse) {
    if (metric == 0) {
        if (!sparse) return acc;  // dense: acc is the squared distance itself
        T d = sq_u + sq_q - T(2) * acc;
        return d > T(0) ? d : T(0);
    }
    return metric == 1 ? T(1) - acc : -acc;
}

// The query as the block reads it: dense values, or sorted columns with their values.
template <typename T>
struct Query {
    const T* val;
    const int* idx;
    int nnz;
    T sq;
};

__device__ __forceinline__ float sq_diff(float4 a, float4 b) {
    const float x = a.x - b.x, y = a.y - b.y, z = a.z - b.z, w = a.w - b.w;
    return fmaf(x, x, fmaf(y, y, fmaf(z, z, w * w)));
}
__device__ __forceinline__ double sq_diff(double2 a, double2 b) {
    const double x = a.x - b.x, y = a.y - b.y;
    return fma(x, x, y * y);
}

// Rows kept in half precision (mgpu.models.GraphIndex's half=True): R is unsigned short,
// each value the bits of an IEEE binary16 number, widened to float where it is read (no
// header needed); the query and every sum stay float.
template <typename A, typename B> struct same_type { static constexpr bool value = false; };
template <typename A> struct same_type<A, A> { static constexpr bool value = true; };

__device__ __forceinline__ float widen(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// the two halves of a 32-bit word, low first
__device__ __forceinline__ float4 widen4(unsigned int a, unsigned int b) {
    return make_float4(widen((unsigned short)(a & 0xffffu)), widen((unsigned short)(a >> 16)),
                       widen((unsigned short)(b & 0xffffu)), widen((unsigned short)(b >> 16)));
}

// partial's dense form for half rows: a lane reads 16 bytes (8 values) at a time where the
// rows are made of whole such vectors, else single values.
__device__ __forceinline__ float partial_half(const unsigned short* __restrict__ X, int dim,
                                              int u, const float* qval, int metric,
                                              int lane, int G) {
    float acc = 0.f;
    const unsigned short* x = X + (size_t)u * dim;
    if (dim % 8 == 0) {
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        const float4* qv = reinterpret_cast<const float4*>(qval);
        for (int c = lane; c < dim / 8; c += G) {
            const uint4 raw = xv[c];
            const float4 lo = widen4(raw.x, raw.y), hi = widen4(raw.z, raw.w);
            if (metric == 0) {
                acc += sq_diff(lo, qv[2 * c]) + sq_diff(hi, qv[2 * c + 1]);
            } else {
                acc += mgpu::dot(lo, qv[2 * c]) + mgpu::dot(hi, qv[2 * c + 1]);
            }
        }
        return acc;
    }
    for (int c = lane; c < dim; c += G) {
        const float v = widen(x[c]);
        acc += metric == 0 ? (v - qval[c]) * (v - qval[c]) : v * qval[c];
    }
    return acc;
}

// This lane's part of the dot product (or, dense and metric 0, of the squared distance)
// of row u and the query: the lanes of a group of G take every G-th element (dense: a
// 16-byte vector of them where the rows are made of whole vectors) or nonzero.
template <typename T, bool SPARSE>
__device__ __forceinline__ T partial(const T* __restrict__ X, const int* __restrict__ indptr,
                                     const int* __restrict__ indices, int dim, int u,
                                     const Query<T>& q, int metric, int lane, int G) {
    T acc = T(0);
    if (SPARSE) {
        const int a = indptr[u], b = indptr[u + 1];
        for (int k = a + lane; k < b; k += G) {
            const int col = indices[k];
            int lo = 0, hi = q.nnz;  // the first query column >= col
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (q.idx[mid] < col) lo = mid + 1; else hi = mid;
            }
            if (lo < q.nnz && q.idx[lo] == col) acc += X[k] * q.val[lo];
        }
        return acc;
    }
    constexpr int VW = 16 / sizeof(T);
    using V = typename mgpu::vec<T, VW>::type;
    const T* x = X + (size_t)u * dim;
    if (dim % VW == 0) {  // rows of whole vectors: each one 16-byte aligned
        const V* xv = reinterpret_cast<const V*>(x);
        const V* qv = reinterpret_cast<const V*>(q.val);
        const int n = dim / VW;
        if (metric == 0) {
            for (int c = lane; c < n; c += G) acc += sq_diff(xv[c], qv[c]);
        } else {
            for (int c = lane; c < n; c += G) acc += mgpu::dot(xv[c], qv[c]);
        }
        return acc;
    }
    if (metric == 0) {
        for (int c = lane; c < dim; c += G) {
            const T d = x[c] - q.val[c];
            acc += d * d;
        }
    } else {
        for (int c = lane; c < dim; c += G) acc += x[c] * q.val[c];
    }
    return acc;
}

// Sort the W (a power of two) entries of (dist, id) by (distance, id): a bitonic sort.
template <typename T>
__device__ void sort_run(T* dist, int* id, int W) {
    for (int k = 2; k <= W; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < W; i += blockDim.x) {
                const int p = i ^ j;
                if (p > i) {
                    const bool up = (i & k) == 0;
                    if (before(dist[p], id[p], dist[i], id[i]) == up) {
                        const T d = dist[i]; dist[i] = dist[p]; dist[p] = d;
                        const int v = id[i]; id[i] = id[p]; id[p] = v;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// Merge the sorted T (W entries) into the sorted N (L entries, W <= L, both powers of two),
// keeping the best `keep` in N (the others emptied). T's entries come in unexplored.
template <typename T>
__device__ void merge_run(T* n_dist, int* n_id, unsigned char* n_done, const T* t_dist,
                          const int* t_id, int L, int W, int keep) {
    for (int i = threadIdx.x; i < W; i += blockDim.x) {
        const int pos = L - 1 - i;
        if (before(t_dist[i], t_id[i], n_dist[pos], n_id[pos])) {
            n_dist[pos] = t_dist[i];
            n_id[pos] = t_id[i];
            n_done[pos] = 0;
        }
    }
    __syncthreads();
    for (int j = L >> 1; j > 0; j >>= 1) {  // N is bitonic: one merge sorts it
        for (int i = threadIdx.x; i < L; i += blockDim.x) {
            const int p = i ^ j;
            if (p > i && before(n_dist[p], n_id[p], n_dist[i], n_id[i])) {
                const T d = n_dist[i]; n_dist[i] = n_dist[p]; n_dist[p] = d;
                const int v = n_id[i]; n_id[i] = n_id[p]; n_id[p] = v;
                const unsigned char f = n_done[i]; n_done[i] = n_done[p]; n_done[p] = f;
            }
        }
        __syncthreads();
    }
    for (int i = keep + threadIdx.x; i < L; i += blockDim.x) {
        n_dist[i] = infinity<T>();
        n_id[i] = EMPTY;
        n_done[i] = 0;
    }
    __syncthreads();
}

// Whether vertex u is met for the first time, by the table of the H (a power of two, or 0:
// none) vertices met first (open addressing, ids hashed); *filled counts them. Without a
// table, or once it is half full, every vertex counts as new (the lazy check: scored, then
// dropped where N holds it). A vertex met before and no longer in N is left out: it was
// pushed out of a full N, whose last entry has only come nearer since, so it would not
// enter again: the search finds what it finds without the table.
__device__ __forceinline__ bool first_time(int* table, int H, int* filled, int u) {
    if (H == 0 || *filled >= (H >> 1)) return true;
    unsigned h = ((unsigned)u * 2654435761u) & (unsigned)(H - 1);
    for (;;) {
        const int old = atomicCAS(&table[h], EMPTY, u);
        if (old == EMPTY) {
            atomicAdd(filled, 1);
            return true;
        }
        if (old == u) return false;
        h = (h + 1) & (unsigned)(H - 1);
    }
}

// Whether the sorted N (L entries) holds (d, u): a binary search.
template <typename T>
__device__ __forceinline__ bool holds(const T* n_dist, const int* n_id, int L, T d, int u) {
    int lo = 0, hi = L;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (before(n_dist[mid], n_id[mid], d, u)) lo = mid + 1; else hi = mid;
    }
    return lo < L && n_id[lo] == u && n_dist[lo] == d;
}

// Score the T entries (EMPTY ones left at inf), a group of G lanes (a power of two, at
// most 32) an entry, its parts summed within the group; every warp runs the same rounds, so
// that the shuffles have all their lanes.
template <typename T, bool SPARSE, typename R>
__device__ void score_run(T* t_dist, const int* t_id, int W, const R* X, const int* indptr,
                          const int* indices, const T* sq, int dim, const Query<T>& q,
                          int metric, int G) {
    const int groups = blockDim.x / G, lane = threadIdx.x % G;
    for (int base = 0; base < W; base += groups) {
        const int j = base + threadIdx.x / G;
        const int u = j < W ? t_id[j] : EMPTY;
        T acc = T(0);
        if (u != EMPTY) {
            if constexpr (same_type<R, T>::value) {
                acc = partial<T, SPARSE>(X, indptr, indices, dim, u, q, metric, lane, G);
            } else {  // half rows: dense, T float
                acc = partial_half(X, dim, u, q.val, metric, lane, G);
            }
        }
        for (int off = G >> 1; off > 0; off >>= 1)
            acc += __shfl_xor_sync(MGPU_FULL_MASK, acc, off);
        if (lane == 0 && u != EMPTY)
            t_dist[j] = finish(acc, SPARSE ? sq[u] : T(0), q.sq, metric, SPARSE);
    }
    __syncthreads();
}

// N, as the block holds it: two such buffers, one current, swapped by merge_by_rank.
template <typename T>
struct Run {
    T* dist;
    int* id;
    unsigned char* done;
};

// Merge T's entries (W, unsorted; EMPTY ones and those N holds already dropped) into N by
// rank, into the other buffer `o`, which then becomes N: the entries nearer than N's last
// kept one are counted into order among themselves (s_*, W long), then each kept entry of
// N moves past those of them before it, and each of them past the entries of N before it.
// The same N as sort_run and merge_run make, in a few steps of independent work instead
// of a bitonic network's log-squared ones. *count must be 0 on entry (a sync before).
// Returns whether N changed.
template <typename T>
__device__ bool merge_by_rank(Run<T>& n, Run<T>& o, const T* t_dist, const int* t_id,
                              T* s_dist, int* s_id, int W, int keep, int* count) {
    const T tail_d = n.dist[keep - 1];
    const int tail_i = n.id[keep - 1];
    int mine = 0;
    for (int j = threadIdx.x; j < W; j += blockDim.x) {
        const T d = t_dist[j];
        const int u = t_id[j];
        if (u != EMPTY && before(d, u, tail_d, tail_i)) {
            int r = 0;  // entries before it come before N's last one too
            for (int k = 0; k < W; ++k) r += before(t_dist[k], t_id[k], d, u);
            s_dist[r] = d;
            s_id[r] = u;
            ++mine;
        }
    }
    if (mine) atomicAdd(count, mine);
    __syncthreads();
    const int m = *count;
    if (m == 0) return false;
    for (int i = threadIdx.x; i < keep; i += blockDim.x) {
        const T d = n.dist[i];
        const int u = n.id[i];
        int lo = 0, hi = m;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (before(s_dist[mid], s_id[mid], d, u)) lo = mid + 1; else hi = mid;
        }
        if (i + lo < keep) {
            o.dist[i + lo] = d;
            o.id[i + lo] = u;
            o.done[i + lo] = n.done[i];
        }
    }
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
        const T d = s_dist[j];
        const int u = s_id[j];
        int lo = 0, hi = keep;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (before(n.dist[mid], n.id[mid], d, u)) lo = mid + 1; else hi = mid;
        }
        if (lo + j < keep) {
            o.dist[lo + j] = d;
            o.id[lo + j] = u;
            o.done[lo + j] = 0;
        }
    }
    __syncthreads();
    const Run<T> t = n;
    n = o;
    o = t;
    return true;
}

}  // namespace mgpu_ann

// One block a query (blockDim.x a multiple of 32), a group of G lanes scoring a neighbour.
// rank: merge T into N by rank (merge_by_rank), else by GANNS's bitonic sort and merge.
// diverse (the construction): of N's first max(l_n, k_out) entries in order, only those
// nearer to the row than to every entry taken before them are taken (k_out at most), as
// numpy_ann's _candidates.
// Dynamic shared memory, in this order: the distances of N, N's other buffer (L each), T
// and T's entries in order (W each), the staged query's values (qcap); the ids of the same
// four, the staged query's columns (qcap, sparse), the table of vertices met (H; 0:
// GANNS's lazy check alone); N's flags, the other buffer's (L each). A query whose values
// (dense: dim; sparse: its nonzeros) exceed qcap is read from global memory.
// out_ids / out_dist: k_out a query, nearest first; -1 and inf past what was found.
template <typename T, bool SPARSE, typename R = T>
__global__ void mgpu_ann_search(
    const R* __restrict__ X, const int* __restrict__ indptr, const int* __restrict__ indices,
    const T* __restrict__ sq, int dim,
    const T* __restrict__ QX, const int* __restrict__ q_indptr,
    const int* __restrict__ q_indices, const T* __restrict__ q_sq, int q0, int nq,
    const int* __restrict__ graph, const int* __restrict__ degree, int width,
    int entry, int limit, int pred_lo, int metric, int l_n, int e, int L, int W, int qcap,
    int G, int H, int rank, int diverse, int k_out, int* __restrict__ out_ids,
    T* __restrict__ out_dist) {
    using namespace mgpu_ann;
    extern __shared__ __align__(16) unsigned char smem[];
    T* n_dist = reinterpret_cast<T*>(smem);
    T* o_dist = n_dist + L;
    T* t_dist = o_dist + L;
    T* s_dist = t_dist + W;
    T* q_val = s_dist + W;
    int* n_id = reinterpret_cast<int*>(q_val + qcap);
    int* o_id = n_id + L;
    int* t_id = o_id + L;
    int* s_id = t_id + W;
    int* q_idx = s_id + W;
    int* seen = q_idx + (SPARSE ? qcap : 0);
    unsigned char* n_done = reinterpret_cast<unsigned char*>(seen + H);
    Run<T> n{n_dist, n_id, n_done}, o{o_dist, o_id, n_done + L};
    __shared__ int s_pick, s_seen, s_count;

    const int i = blockIdx.x;
    if (i >= nq) return;
    const int row = q0 + i;
    Query<T> q;
    if (SPARSE) {
        const int a = q_indptr[row], b = q_indptr[row + 1];
        q.nnz = b - a;
        q.sq = q_sq[row];
        if (q.nnz <= qcap) {
            for (int j = threadIdx.x; j < q.nnz; j += blockDim.x) {
                q_idx[j] = q_indices[a + j];
                q_val[j] = QX[a + j];
            }
            q.idx = q_idx;
            q.val = q_val;
        } else {
            q.idx = q_indices + a;
            q.val = QX + a;
        }
    } else {
        q.nnz = dim;
        q.sq = T(0);
        q.idx = nullptr;
        if (dim <= qcap) {
            for (int j = threadIdx.x; j < dim; j += blockDim.x)
                q_val[j] = QX[(size_t)row * dim + j];
            q.val = q_val;
        } else {
            q.val = QX + (size_t)row * dim;
        }
    }
    for (int j = threadIdx.x; j < 2 * L; j += blockDim.x) {  // both buffers
        n_dist[j] = infinity<T>();
        n_id[j] = EMPTY;
        n_done[j] = 0;
    }
    for (int j = threadIdx.x; j < H; j += blockDim.x) seen[j] = EMPTY;
    if (threadIdx.x == 0) s_seen = 0;
    __syncthreads();
    if (threadIdx.x == 0 && entry >= 0 && entry < limit) first_time(seen, H, &s_seen, entry);
    if (entry >= 0 && entry < limit) {  // scored as T's only entry, then N's first
        for (int j = threadIdx.x; j < W; j += blockDim.x) {
            t_id[j] = j == 0 ? entry : EMPTY;
            t_dist[j] = infinity<T>();
        }
        __syncthreads();
        score_run<T, SPARSE, R>(t_dist, t_id, W, X, indptr, indices, sq, dim, q, metric, G);
        if (threadIdx.x == 0) {
            n.dist[0] = t_dist[0];
            n.id[0] = entry;
        }
    }
    const int first = e < l_n ? e : l_n;
    for (;;) {
        if (threadIdx.x == 0) {
            s_pick = EMPTY;
            s_count = 0;
        }
        __syncthreads();
        for (int j = threadIdx.x; j < first; j += blockDim.x)
            if (n.id[j] != EMPTY && !n.done[j]) atomicMin(&s_pick, j);
        __syncthreads();
        const int pick = s_pick;
        if (pick == EMPTY) break;
        const int v = n.id[pick];
        const int deg = degree[v];
        for (int j = threadIdx.x; j < W; j += blockDim.x) {
            const int u = j < deg ? graph[(size_t)v * width + j] : -1;
            t_id[j] = (u >= 0 && u < limit && first_time(seen, H, &s_seen, u)) ? u : EMPTY;
            t_dist[j] = infinity<T>();
        }
        __syncthreads();  // every thread has read pick's entry: it may change now
        if (threadIdx.x == 0) n.done[pick] = 1;
        score_run<T, SPARSE, R>(t_dist, t_id, W, X, indptr, indices, sq, dim, q, metric, G);
        for (int j = threadIdx.x; j < W; j += blockDim.x) {  // met before: N's copy stays
            if (t_id[j] != EMPTY && holds(n.dist, n.id, L, t_dist[j], t_id[j])) {
                t_id[j] = EMPTY;
                t_dist[j] = infinity<T>();
            }
        }
        __syncthreads();
        if (rank) {
            merge_by_rank(n, o, t_dist, t_id, s_dist, s_id, W, l_n, &s_count);
        } else {
            sort_run(t_dist, t_id, W);
            merge_run(n.dist, n.id, n.done, t_dist, t_id, L, W, l_n);
        }
    }
    // the construction: the batch's rows before this one, scored directly
    for (int base = pred_lo; pred_lo >= 0 && base < row; base += W) {
        for (int j = threadIdx.x; j < W; j += blockDim.x) {
            t_id[j] = base + j < row ? base + j : EMPTY;
            t_dist[j] = infinity<T>();
        }
        if (threadIdx.x == 0) s_count = 0;
        __syncthreads();
        score_run<T, SPARSE, R>(t_dist, t_id, W, X, indptr, indices, sq, dim, q, metric, G);
        if (rank) {
            merge_by_rank(n, o, t_dist, t_id, s_dist, s_id, W, L, &s_count);
        } else {
            sort_run(t_dist, t_id, W);
            merge_run(n.dist, n.id, n.done, t_dist, t_id, L, W, L);
        }
    }
    // HNSW's heuristic: the candidates nearer to the row than to those taken (the
    // construction's, whose rows are never half)
    if constexpr (same_type<R, T>::value) {
        if (diverse) {
            int kept = 0;
            const int groups = blockDim.x / G, lane = threadIdx.x % G;
            const int most = l_n > k_out ? l_n : k_out;  // of the nearest max(l_n, k_out)
            for (int c = 0; c < most && c < L && kept < k_out; ++c) {
                const int u = n.id[c];
                if (u == EMPTY) break;
                const T du = n.dist[c];
                Query<T> cq;  // the candidate's row, read from global memory
                if (SPARSE) {
                    cq.idx = indices + indptr[u];
                    cq.val = X + indptr[u];
                    cq.nnz = indptr[u + 1] - indptr[u];
                    cq.sq = sq[u];
                } else {
                    cq.idx = nullptr;
                    cq.val = X + (size_t)u * dim;
                    cq.nnz = dim;
                    cq.sq = T(0);
                }
                if (threadIdx.x == 0) s_pick = 0;
                __syncthreads();
                for (int base = 0; base < kept; base += groups) {
                    const int j = base + threadIdx.x / G;
                    const int w = j < kept ? t_id[j] : EMPTY;
                    T acc = w != EMPTY ? partial<T, SPARSE>(X, indptr, indices, dim, w, cq, metric,
                                                            lane, G) : T(0);
                    for (int off = G >> 1; off > 0; off >>= 1)
                        acc += __shfl_xor_sync(MGPU_FULL_MASK, acc, off);
                    if (lane == 0 && w != EMPTY &&
                        finish(acc, SPARSE ? sq[w] : T(0), cq.sq, metric, SPARSE) < du)
                        s_pick = 1;  // a link taken lies nearer to it than the row does
                }
                __syncthreads();
                if (!s_pick) {
                    if (threadIdx.x == 0) {
                        t_id[kept] = u;
                        t_dist[kept] = du;
                    }
                    ++kept;
                }
                __syncthreads();
            }
            for (int j = threadIdx.x; j < k_out; j += blockDim.x) {
                out_ids[(size_t)i * k_out + j] = j < kept ? t_id[j] : -1;
                out_dist[(size_t)i * k_out + j] = j < kept ? t_dist[j] : infinity<T>();
            }
            return;
        }
    }
    for (int j = threadIdx.x; j < k_out; j += blockDim.x) {
        const int u = n.id[j];
        out_ids[(size_t)i * k_out + j] = u == EMPTY ? -1 : u;
        out_dist[(size_t)i * k_out + j] = n.dist[j];
    }
}

// The links made back in a batch. targets[t] (t < m) is a vertex linked to; its new links
// are sources/dists[seg[t] .. seg[t+1]), sorted by (distance, source).
template <typename T>
__global__ void mgpu_ann_link(int* __restrict__ graph, T* __restrict__ link_dist,
                              int* __restrict__ degree, const int* __restrict__ own, int width,
                              const int* __restrict__ targets, const int* __restrict__ seg,
                              const int* __restrict__ sources, const T* __restrict__ dists,
                              int m) {
    using mgpu_ann::before;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m) return;
    const int v = targets[t];
    const int first = own[v];
    const int cap = width - first;
    if (cap <= 0) return;
    int* g = graph + (size_t)v * width + first;
    T* gd = link_dist + (size_t)v * width + first;
    const int na = degree[v] - first, b0 = seg[t], nb = seg[t + 1] - b0;
    // how many of each list the nearest `cap` take: walk the merge without writing
    int ia = 0, ib = 0;
    while (ia + ib < cap && (ia < na || ib < nb)) {
        if (ib >= nb || (ia < na && !before(dists[b0 + ib], sources[b0 + ib], gd[ia], g[ia])))
            ++ia;
        else
            ++ib;
    }
    const int kept = ia + ib;  // cap at most: an old entry left out is the farthest
    // then write them from the back: an old entry only moves to a later place
    int out = kept - 1;
    --ia;
    --ib;
    while (ib >= 0) {
        if (ia >= 0 && before(dists[b0 + ib], sources[b0 + ib], gd[ia], g[ia])) {
            g[out] = g[ia];
            gd[out] = gd[ia];
            --ia;
        } else {
            g[out] = sources[b0 + ib];
            gd[out] = dists[b0 + ib];
            --ib;
        }
        --out;
    }
    degree[v] = first + kept;
}

// mgpu_ann_search_heap: the naive baseline, a CPU graph search ported as it is (HNSW's
// search of one layer, without GANNS's lazy strategies): one thread per query, dense rows;
// two binary heaps ordered by (distance, id), the candidates (nearest on top; cand_cap
// slots, as many as the vertices the table takes, so that it never fills) and the results
// (farthest on top, at most ef), and an open-addressing table of the vertices met (cap
// slots, a power of two), every neighbour looked up in it before it is scored; a neighbour
// enters both heaps where it beats the farthest result, and the search ends when the
// nearest candidate is farther than the farthest of ef results, or when the table is
// three quarters full. Heaps and table are in global memory, one slice
// a query (the table filled with -1 by the host).
namespace mgpu_ann {

template <typename T>
__device__ void heap_push(int* id, T* d, int& n, int v, T dv, bool far_on_top) {
    int c = n++;
    while (c > 0) {
        const int p = (c - 1) / 2;
        const bool up = far_on_top ? before(d[p], id[p], dv, v) : before(dv, v, d[p], id[p]);
        if (!up) break;
        id[c] = id[p];
        d[c] = d[p];
        c = p;
    }
    id[c] = v;
    d[c] = dv;
}

template <typename T>
__device__ void heap_pop(int* id, T* d, int& n, bool far_on_top) {
    const int v = id[--n];
    const T dv = d[n];
    int c = 0;
    while (true) {
        int l = 2 * c + 1;
        if (l >= n) break;
        const int r = l + 1;
        if (r < n && (far_on_top ? before(d[l], id[l], d[r], id[r])
                                 : before(d[r], id[r], d[l], id[l])))
            l = r;
        const bool down = far_on_top ? before(dv, v, d[l], id[l]) : before(d[l], id[l], dv, v);
        if (!down) break;
        id[c] = id[l];
        d[c] = d[l];
        c = l;
    }
    id[c] = v;
    d[c] = dv;
}

}  // namespace mgpu_ann

template <typename T>
__global__ void mgpu_ann_search_heap(
    const T* __restrict__ X, int dim, const T* __restrict__ QX, int nq,
    const int* __restrict__ graph, const int* __restrict__ degree, int width, int metric,
    int ef, int cand_cap, int cap, int* __restrict__ heap_id, T* __restrict__ heap_dist,
    int* __restrict__ table, int k_out, int* __restrict__ out_ids, T* __restrict__ out_dist) {
    using namespace mgpu_ann;
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= nq) return;
    const T* qv = QX + (size_t)q * dim;
    int* c_id = heap_id + (size_t)q * (cand_cap + ef);
    T* c_d = heap_dist + (size_t)q * (cand_cap + ef);
    int* r_id = c_id + cand_cap;
    T* r_d = c_d + cand_cap;
    int* tab = table + (size_t)q * cap;
    int nc = 0, nr = 0, met = 0;
    const int full = cap - cap / 4;
    auto score = [&](int u) -> T {
        const T* x = X + (size_t)u * dim;
        T acc = T(0);
        for (int j = 0; j < dim; ++j) {
            const T a = x[j], b = qv[j];
            acc += metric == 0 ? (a - b) * (a - b) : a * b;
        }
        return finish(acc, T(0), T(0), metric, false);
    };
    auto first_time = [&](int v) -> bool {  // true where v was not met before (and is now)
        unsigned h = (unsigned)v * 2654435761u;
        for (int s = 0; s < cap; ++s) {
            const int at = (int)((h + (unsigned)s) & (unsigned)(cap - 1));
            if (tab[at] == v) return false;
            if (tab[at] < 0) {
                tab[at] = v;
                ++met;
                return true;
            }
        }
        return false;
    };
    first_time(0);
    const T d0 = score(0);
    heap_push(c_id, c_d, nc, 0, d0, false);
    heap_push(r_id, r_d, nr, 0, d0, true);
    while (nc > 0 && met < full) {
        const int u = c_id[0];
        const T du = c_d[0];
        heap_pop(c_id, c_d, nc, false);
        if (nr == ef && before(r_d[0], r_id[0], du, u)) break;
        const int* nbr = graph + (size_t)u * width;
        for (int j = 0; j < degree[u] && met < full; ++j) {
            const int v = nbr[j];
            if (v < 0 || !first_time(v)) continue;
            const T dv = score(v);
            if (nr < ef || before(dv, v, r_d[0], r_id[0])) {
                if (nc < cand_cap) heap_push(c_id, c_d, nc, v, dv, false);
                // the farthest result makes room first: the heap's slice holds ef
                if (nr == ef) heap_pop(r_id, r_d, nr, true);
                heap_push(r_id, r_d, nr, v, dv, true);
            }
        }
    }
    // the results nearest first: the farthest popped to the back
    for (int j = nr; j < k_out; ++j) {
        out_ids[(size_t)q * k_out + j] = -1;
        out_dist[(size_t)q * k_out + j] = infinity<T>();
    }
    while (nr > 0) {
        const int at = nr - 1;
        if (at < k_out) {
            out_ids[(size_t)q * k_out + at] = r_id[0];
            out_dist[(size_t)q * k_out + at] = r_d[0];
        }
        heap_pop(r_id, r_d, nr, true);
    }
}
