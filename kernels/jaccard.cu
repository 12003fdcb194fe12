// Jaccard edge weights on the pattern of an undirected graph (Anzt & Dongarra): one thread
// per nonzero (i, j) of rows r0..r1, no symbolic phase, the intersection of the two sorted
// neighbour lists by a merge (or, when one list is GALLOP times longer, by binary searches
// of the short list's ids in the long one). mgpu/backends/numpy.py's _edge_jaccard is the
// CPU twin; the weighted form sums min(w_ik, w_jk) over the union and divides by the sum of
// max(w_ik, w_jk).
//
// Instantiated as mgpu_jaccard<T, WEIGHTED> with T in {float, double} (the graph's values and
// the output); the graph is checked CSR (sorted, no duplicates, no self-loops), 32-bit.
#include "common.cuh"

#define MGPU_JACCARD_GALLOP 16

__device__ __forceinline__ int mgpu_lower_bound(const int* __restrict__ v, int lo, int hi, int x) {
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (v[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

template <typename T, bool WEIGHTED>
__global__ void mgpu_jaccard(const int* __restrict__ indptr, const int* __restrict__ indices,
                             const T* __restrict__ data, int r0, int r1,
                             T* __restrict__ out) {
    const int base = indptr[r0];
    const long long n = (long long)indptr[r1] - base;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n;
         t += (long long)gridDim.x * blockDim.x) {
        const int p = base + (int)t;
        // the row of nonzero p: the last row whose start is <= p
        int lo = r0, hi = r1;
        while (hi - lo > 1) {
            const int mid = (lo + hi) >> 1;
            if (indptr[mid] <= p) lo = mid; else hi = mid;
        }
        const int i = lo;
        const int j = indices[p];
        int a = indptr[i], a1 = indptr[i + 1], b = indptr[j], b1 = indptr[j + 1];
        double value;
        if (!WEIGHTED) {
            const int la = a1 - a, lb = b1 - b;
            int both = 0;
            if (la > MGPU_JACCARD_GALLOP * lb || lb > MGPU_JACCARD_GALLOP * la) {
                if (la < lb) {  // a: the long row
                    int s = a; a = b; b = s;
                    s = a1; a1 = b1; b1 = s;
                }
                int at = a;
                for (int q = b; q < b1; ++q) {
                    at = mgpu_lower_bound(indices, at, a1, indices[q]);
                    if (at < a1 && indices[at] == indices[q]) ++both;
                }
            } else {
                while (a < a1 && b < b1) {
                    const int x = indices[a], y = indices[b];
                    both += (x == y);
                    a += (x <= y);
                    b += (y <= x);
                }
            }
            value = (double)both / (double)(la + lb - both);
        } else {
            double small = 0.0, large = 0.0;
            while (a < a1 || b < b1) {
                if (b >= b1 || (a < a1 && indices[a] < indices[b])) {
                    large += (double)data[a++];
                } else if (a >= a1 || indices[b] < indices[a]) {
                    large += (double)data[b++];
                } else {
                    const double x = (double)data[a++], y = (double)data[b++];
                    small += x < y ? x : y;
                    large += x < y ? y : x;
                }
            }
            value = large > 0.0 ? small / large : 0.0;
        }
        out[t] = (T)value;
    }
}
