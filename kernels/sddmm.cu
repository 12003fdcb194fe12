// SDDMM, P = S ∘ (A Bᵀ) on the pattern of a sparse S (A: M×K, B: N×K, row-major), after
// cuSDDMM (Nisa et al.). Two kernels:
//
// mgpu_sddmm_csr<T, I, W, V>: straight on CSR, no preprocessing. Every warp takes a fixed
//   run of nonzeros (its first row found by a 32-ary search of the whole warp on indptr, so
//   a long row is shared by many warps; its virtual warps walk on from that row to their
//   nonzeros' rows, one load a row they pass). A *virtual warp* of V lanes computes one
//   nonzero, each lane loading W elements at a time (16-byte loads when W > 1) and the group
//   reducing with shuffles; 32 / V virtual warps × U nonzeros each are in flight per warp.
//   Used when the whole of B stays in L2, and for inputs the tiled kernel does not take.
//   The one launch of a small call does all of it: a few blocks past the product's copy
//   S's index arrays into P's and check the operands for the call's finiteness flag
//   (mgpu_sddmm_csr_extras). The product's own loop writes values only: a column index kept
//   live through the dot products costs registers, and occupancy, on every nonzero.
//
// mgpu_sddmm_tiled<T, W, V, STAGE_B>: the SM-L2 scheme (STAGE_B = false) and the SM-SM scheme
//   (STAGE_B = true) on a tiled COO copy of S made by mgpu/backends/cupy.py. S's columns are
//   cut into panels of width Tj; a panel's nonzeros are ordered by row and cut into tiles of at
//   most `ti` active rows (rows with a nonzero in the panel). One block per tile stages the
//   tile's active rows of A, a K-slice of Tk at a time, in shared memory; B's panel is read
//   through L2 (SM-L2), or staged in shared memory too (SM-SM, for dense S). Nonzeros carry
//   tile-local row and panel-local column indices; partial sums over K-slices go to
//   `partial` (tile order) and the last slice writes out[perm[p]] in S's CSR order.
#include "common.cuh"

#define MGPU_SDDMM_U 4  // nonzeros per virtual warp in flight

// the row of nonzero p (p < nnz): the largest i with indptr[i] <= p, found by the whole warp
// (every lane calls it with the same p) in a 32-ary search, each lane probing one point a
// round: ceil(log32(n_rows)) dependent loads (3 for 2,000 to 32,000 rows) where a search by
// one thread takes log2(n_rows)
template <typename I>
__device__ __forceinline__ long long mgpu_warp_row_of(const I* __restrict__ indptr,
                                                      long long n_rows, long long p, int lane) {
    long long lo = 0, hi = n_rows - 1;  // indptr[lo] <= p; the row is in [lo, hi]
    while (lo < hi) {  // uniform over the warp
        const long long step = (hi - lo + 32) / 32;  // ceil((hi − lo + 1) / 32)
        const long long probe = lo + step * (lane + 1);
        const unsigned m = __ballot_sync(MGPU_FULL_MASK,
                                         probe <= hi && (long long)indptr[probe] <= p);
        if (m) lo += step * (32 - __clz(m));  // the last probe at or before p (a prefix holds)
        hi = min(hi, lo + step - 1);
    }
    return lo;
}

// The blocks of an mgpu_sddmm_csr launch past its product_blocks (none, or a few): they copy
// indptr to out_indptr and indices to out_indices (each when not null: P's own index arrays,
// beside the product or, with product_blocks 0, beside a tiled scheme's product), and,
// with a flag (not null), look at every value of fa, fb and fc (na, nb, nc of them: the
// factors and S's values of a checked call) and raise *flag when any is NaN or infinite, as
// kernels/flags.cu does, in the product's own launch. The flag may be pinned host memory: a
// block writes it at most once, and only on a find.
// The extra blocks run with the product's registers, so few of them fit on an SM at once (3
// of 256 threads where the flag kernel fits 8): each thread keeps MGPU_SDDMM_XU loads in
// flight (a grid-stride loop unrolled, independent loads first), else they would leave the
// memory idle on a large check (hundreds of MB of factors at K = 512) at the launch's tail.
#define MGPU_SDDMM_XU 8

template <typename T>
__device__ __forceinline__ bool mgpu_any_nonfinite(const T* __restrict__ a, long long n,
                                                   long long first, long long step) {
    bool bad = false;
    long long i = first;
    for (; i + (MGPU_SDDMM_XU - 1) * step < n; i += MGPU_SDDMM_XU * step) {
        T v[MGPU_SDDMM_XU];
#pragma unroll
        for (int u = 0; u < MGPU_SDDMM_XU; ++u) v[u] = a[i + u * step];
#pragma unroll
        for (int u = 0; u < MGPU_SDDMM_XU; ++u) bad |= !isfinite(v[u]);
    }
    for (; i < n; i += step) bad |= !isfinite(a[i]);
    return bad;
}

template <typename I>
__device__ __forceinline__ void mgpu_copy_strided(const I* __restrict__ from, I* __restrict__ to,
                                                  long long n, long long first, long long step) {
    long long i = first;
    for (; i + (MGPU_SDDMM_XU - 1) * step < n; i += MGPU_SDDMM_XU * step) {
        I v[MGPU_SDDMM_XU];
#pragma unroll
        for (int u = 0; u < MGPU_SDDMM_XU; ++u) v[u] = from[i + u * step];
#pragma unroll
        for (int u = 0; u < MGPU_SDDMM_XU; ++u) to[i + u * step] = v[u];
    }
    for (; i < n; i += step) to[i] = from[i];
}

template <typename T, typename I>
__device__ __forceinline__ void mgpu_sddmm_csr_extras(
        const I* __restrict__ indptr, const I* __restrict__ indices, long long n_rows,
        long long nnz, I* __restrict__ out_indices, I* __restrict__ out_indptr,
        long long product_blocks, const T* __restrict__ fa, long long na,
        const T* __restrict__ fb, long long nb, const T* __restrict__ fc, long long nc,
        int* __restrict__ flag) {
    const long long step = (long long)(gridDim.x - product_blocks) * blockDim.x;
    const long long first = (long long)(blockIdx.x - product_blocks) * blockDim.x + threadIdx.x;
    if (out_indptr != nullptr) mgpu_copy_strided(indptr, out_indptr, n_rows + 1, first, step);
    if (out_indices != nullptr) mgpu_copy_strided(indices, out_indices, nnz, first, step);
    if (flag == nullptr) return;  // the same for the whole launch
    // no early exit after a find: finite inputs, the ones whose time counts, read all anyway
    const bool bad = mgpu_any_nonfinite(fa, na, first, step)
                     | mgpu_any_nonfinite(fb, nb, first, step)
                     | mgpu_any_nonfinite(fc, nc, first, step);
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

template <typename T, typename I, int W, int V>
__global__ void mgpu_sddmm_csr(const I* __restrict__ indptr,
                               const I* __restrict__ indices,
                               const T* __restrict__ values,
                               const T* __restrict__ A,
                               const T* __restrict__ B,
                               long long n_rows,
                               long long nnz,
                               int K,
                               int hadamard,
                               int nz_per_warp,
                               T* __restrict__ out,
                               I* __restrict__ out_indices,
                               I* __restrict__ out_indptr,
                               long long product_blocks,
                               const T* __restrict__ fa, long long na,
                               const T* __restrict__ fb, long long nb,
                               const T* __restrict__ fc, long long nc,
                               int* __restrict__ flag) {
    using VT = typename mgpu::vec<T, W>::type;
    constexpr int G = 32 / V;
    constexpr int U = MGPU_SDDMM_U;
    if (blockIdx.x >= product_blocks) {  // the blocks past the product's (uniform per block)
        mgpu_sddmm_csr_extras(indptr, indices, n_rows, nnz, out_indices, out_indptr,
                              product_blocks, fa, na, fb, nb, fc, nc, flag);
        return;
    }
    const int lane = threadIdx.x & 31;
    const int g = lane / V, sub = lane % V;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long p0 = warp * (long long)nz_per_warp;
    if (p0 >= nnz) return;  // uniform over the warp
    const long long p1 = min(nnz, p0 + (long long)nz_per_warp);
    const int KV = K / W;
    const VT* __restrict__ Av = reinterpret_cast<const VT*>(A);
    const VT* __restrict__ Bv = reinterpret_cast<const VT*>(B);
    // the warp's first row, then each virtual warp walks to its own first nonzero's (below)
    long long i = mgpu_warp_row_of(indptr, n_rows, p0, lane);
    long long end = indptr[i + 1];
    for (long long q = p0; q < p1; q += G * U) {
        long long arow[U], bcol[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long p = min(q + g + u * G, p1 - 1);  // nondecreasing per virtual warp
            while (end <= p) end = indptr[++i + 1];
            arow[u] = i * KV;
            bcol[u] = (long long)indices[p] * KV;
        }
        T acc[U];
#pragma unroll
        for (int u = 0; u < U; ++u) acc[u] = T(0);
        for (int k = sub; k < KV; k += V) {
#pragma unroll
            for (int u = 0; u < U; ++u) acc[u] += mgpu::dot(Av[arow[u] + k], Bv[bcol[u] + k]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const T v = mgpu::group_sum<V>(acc[u]);
            const long long p = q + g + u * G;
            if (sub == 0 && p < p1) out[p] = hadamard ? v * values[p] : v;
        }
    }
}

template <typename T, int W, int V, bool STAGE_B>
__global__ void mgpu_sddmm_tiled(const int* __restrict__ tile_start,   // n_tiles + 1
                                 const int* __restrict__ tile_row0,    // into active_rows
                                 const int* __restrict__ tile_panel,
                                 const int* __restrict__ active_rows,
                                 const int* __restrict__ local_row,    // per nonzero, tile order
                                 const int* __restrict__ local_col,    // per nonzero, tile order
                                 const int* __restrict__ perm,         // tile order -> CSR order, or null
                                 const T* __restrict__ values,         // CSR order
                                 const T* __restrict__ A,
                                 const T* __restrict__ B,
                                 long long n_cols,
                                 int K,
                                 int Tj,
                                 int Tk,
                                 int hadamard,
                                 T* __restrict__ partial,              // tile order; used when Tk < K
                                 T* __restrict__ out) {
    using VT = typename mgpu::vec<T, W>::type;
    constexpr int U = MGPU_SDDMM_U;
    extern __shared__ __align__(16) unsigned char mgpu_smem[];
    const int KV = K / W, TKV = Tk / W;
    const int t0 = tile_start[blockIdx.x], t1 = tile_start[blockIdx.x + 1];
    if (t0 >= t1) return;  // uniform over the block
    const int r0 = tile_row0[blockIdx.x];
    const int n_active = local_row[t1 - 1] + 1;  // rows ascend within a tile
    const long long c0 = (long long)tile_panel[blockIdx.x] * Tj;
    const int n_panel_cols = (int)min((long long)Tj, n_cols - c0);
    VT* sA = reinterpret_cast<VT*>(mgpu_smem);
    VT* sB = sA + n_active * TKV;
    const VT* __restrict__ Av = reinterpret_cast<const VT*>(A);
    const VT* __restrict__ Bv = reinterpret_cast<const VT*>(B);
    const int lane = threadIdx.x & 31;
    const int sub = lane % V;
    const int g = threadIdx.x / V, G = blockDim.x / V;
    for (int k0 = 0; k0 < KV; k0 += TKV) {
        const int kw = min(TKV, KV - k0);
        for (int e = threadIdx.x; e < n_active * kw; e += blockDim.x) {
            const int r = e / kw, kk = e - r * kw;
            sA[r * TKV + kk] = Av[(long long)active_rows[r0 + r] * KV + k0 + kk];
        }
        if (STAGE_B) {
            for (int e = threadIdx.x; e < n_panel_cols * kw; e += blockDim.x) {
                const int c = e / kw, kk = e - c * kw;
                sB[c * TKV + kk] = Bv[(c0 + c) * KV + k0 + kk];
            }
        }
        __syncthreads();
        const bool first = k0 == 0, last = k0 + TKV >= KV;
        for (int q = t0; q < t1; q += G * U) {
            int ar[U];
            long long bc[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int p = min(q + g + u * G, t1 - 1);
                ar[u] = local_row[p] * TKV;
                bc[u] = STAGE_B ? (long long)local_col[p] * TKV
                                : (c0 + local_col[p]) * KV + k0;
            }
            T acc[U];
#pragma unroll
            for (int u = 0; u < U; ++u) acc[u] = T(0);
            for (int kk = sub; kk < kw; kk += V) {
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const VT b = STAGE_B ? sB[bc[u] + kk] : Bv[bc[u] + kk];
                    acc[u] += mgpu::dot(sA[ar[u] + kk], b);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                T v = mgpu::group_sum<V>(acc[u]);
                const int p = q + g + u * G;
                if (sub == 0 && p < t1) {
                    if (!first) v += partial[p];
                    if (last) {
                        const long long o = perm ? (long long)perm[p] : (long long)p;
                        out[o] = hadamard ? v * values[o] : v;
                    } else {
                        partial[p] = v;
                    }
                }
            }
        }
        __syncthreads();
    }
}
