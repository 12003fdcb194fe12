// The finiteness flag of the checked GPU calls (mgpu/backends/flags.py): one launch looks at
// every value of up to three arrays (SDDMM's A, B and S's values; SpMM's A values and X;
// SpMV's x) and raises *flag when any is NaN or infinite.
//
// The flag lives in pinned host memory mapped into the device, so the caller reads it with
// the result, after the one wait of the call, with no copy back. Each write to it crosses
// the bus, so a block writes it at most once (the OR of its threads' findings), and only
// when something was found: a finite input costs no write at all.

template <typename T>
__global__ void __launch_bounds__(256)
mgpu_flag_nonfinite(const T* __restrict__ a, long long na, const T* __restrict__ b,
                    long long nb, const T* __restrict__ c, long long nc,
                    int* __restrict__ flag) {
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    bool bad = false;
    // no early exit after a find: finite inputs, the ones whose time counts, read all anyway
    for (long long i = first; i < na; i += step) bad |= !isfinite(a[i]);
    for (long long i = first; i < nb; i += step) bad |= !isfinite(b[i]);
    for (long long i = first; i < nc; i += step) bad |= !isfinite(c[i]);
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

// The check of a CSR operand (SpGEMM, SpAdd): raises *flag when its `rows` + 1 row pointers do
// not run from 0 to nnz without decreasing, a column index lies outside [0, cols), or a value
// is NaN or infinite; the kernels of the product index B's rows by A's columns and their
// tables by B's columns, so an index out of range would read or write outside the arrays.
template <typename T>
__global__ void __launch_bounds__(256)
mgpu_flag_csr(const int* __restrict__ ptr, long long rows, const int* __restrict__ idx,
              const T* __restrict__ val, long long nnz, long long cols, int* __restrict__ flag) {
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    bool bad = first == 0 && (ptr[0] != 0 || ptr[rows] != nnz);
    for (long long i = first; i < rows; i += step) bad |= ptr[i + 1] < ptr[i];
    for (long long i = first; i < nnz; i += step) {
        const int c = idx[i];
        bad |= c < 0 || c >= cols || !isfinite(val[i]);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}
