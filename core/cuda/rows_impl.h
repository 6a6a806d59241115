/* Private to core/cuda/: the row-wise reduction pattern shared by the softmax, cross-entropy,
 * layernorm and reduction kernels. A "row group" is NX consecutive threads (threadIdx.x) that
 * own one row; a block holds RY row groups (threadIdx.y). Each thread walks its row with stride
 * NX in a fixed order, then the group combines the partial results with a warp butterfly and,
 * for NX > 32, one pass over the per-warp values in shared memory in warp order. Every step is
 * fixed by the launch shape, never by timing, so the results are bit-identical from run to run.
 * Included only by .cu files. */
#ifndef MR_CUDA_ROWS_IMPL_H
#define MR_CUDA_ROWS_IMPL_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

/* Threads per row: a warp for short rows (4 rows to a block), 256 or 1024 for long ones
 * (vocabulary-wide softmax rows of 50k columns get a whole block each). */
static inline int mr_row_threads(int64_t cols) {
    return cols <= 1024 ? 32 : cols <= 16384 ? 256 : 1024;
}

/* Blocks for `rows` rows at `ry` rows per block; kernels loop over rows with a block-uniform
 * stride, so capping the grid never skips a row. */
static inline unsigned mr_row_grid(int64_t rows, int ry) {
    int64_t g = (rows + ry - 1) / ry;
    if (g < 1) g = 1;
    return (unsigned)(g > (1 << 20) ? (1 << 20) : g);
}

template <typename A> struct mr_op_sum {
    __device__ A operator()(A a, A b) const { return a + b; }
};
/* Ignores NaN (a NaN is never greater), as the reference's running max does; a NaN input then
 * shows up through exp(x - max). */
template <typename A> struct mr_op_max {
    __device__ A operator()(A a, A b) const { return b > a ? b : a; }
};

/* Combines v over the NX threads of this thread's row group with `op`; every thread of the group
 * gets the same value (lane 0's, broadcast, so even +0/-0 ties agree). sh holds
 * blockDim.y * (NX / 32) values. Must be called by every thread of the block (it syncs when
 * NX > 32). */
template <int NX, typename A, typename Op>
__device__ __forceinline__ A mr_row_reduce(A v, A *sh, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    v = __shfl_sync(0xffffffffu, v, 0);
    if (NX == 32) return v;
    const int nw = NX / 32;
    A *s = sh + threadIdx.y * nw;
    __syncthreads(); /* the previous call's readers of sh are done */
    if ((threadIdx.x & 31) == 0) s[threadIdx.x / 32] = v;
    __syncthreads();
    A r = s[0];
    for (int i = 1; i < nw; i++) r = op(r, s[i]);
    return r;
}

/* The accumulation type: f32 data accumulates in f32, f64 in f64 (docs/DESIGN.md: reductions in f32). */
template <typename T> struct mr_acc_t { typedef float A; };
template <> struct mr_acc_t<double> { typedef double A; };

/* exp, log, sqrt by type (the float forms, not the fast intrinsics). */
__device__ __forceinline__ float mr_dexp(float x) { return expf(x); }
__device__ __forceinline__ double mr_dexp(double x) { return exp(x); }
__device__ __forceinline__ float mr_dlog(float x) { return logf(x); }
__device__ __forceinline__ double mr_dlog(double x) { return log(x); }
__device__ __forceinline__ float mr_dsqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double mr_dsqrt(double x) { return sqrt(x); }

/* Launches KERNEL<T, NX, RY> over `rows` rows on stream `s` with the row-group shape that
 * mr_row_threads(cols) picks (cols: the length each row group walks). */
#define MR_ROWS_LAUNCH(KERNEL, T, cols, rows, s, ...)                                           \
    do {                                                                                        \
        switch (mr_row_threads(cols)) {                                                         \
        case 32: KERNEL<T, 32, 4><<<mr_row_grid((rows), 4), dim3(32, 4), 0, (s)>>>(__VA_ARGS__); break; \
        case 256: KERNEL<T, 256, 1><<<mr_row_grid((rows), 1), dim3(256, 1), 0, (s)>>>(__VA_ARGS__); break; \
        default: KERNEL<T, 1024, 1><<<mr_row_grid((rows), 1), dim3(1024, 1), 0, (s)>>>(__VA_ARGS__); break; \
        }                                                                                       \
    } while (0)

#endif
