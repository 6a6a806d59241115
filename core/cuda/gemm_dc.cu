/* GEMM_DC on the GPU (core/ops.h; oracle core/ref/gemm_dc_ref.c): a GEMM's output gradient made
 * ready for its gradient GEMMs: g = dy or gelu_grad(pre, dy) (core/math/unary_math.h, the math
 * GELU_BWD runs), dc = g in dc's dtype (core/math/half_math.h's rounding, as CAST) and dbias = the
 * column sums of g.
 *
 * Two kernels: an elementwise one for dc, and a column sum for dbias in which a block of
 * DC_COLS x DC_LANES threads owns DC_COLS columns; lane t sums rows t, t + DC_LANES, ... in order
 * and lane 0 adds the lanes' sums in lane order, so dbias is deterministic (no atomics). g is
 * recomputed there from dy and pre rather than read back from a half dc, so dbias sums full
 * precision values, as the CPU kernel does. */
#include "core/cuda/cuda_impl.h"
#include "core/math/half_math.h"
#include "core/math/unary_math.h"
#include "core/ops_impl.h"

#define DC_COLS 32
#define DC_LANES 16

template <typename T> struct mr_dc_g;
template <> struct mr_dc_g<float> {
    static __device__ float g(const float *dy, const float *pre, int64_t i) {
        return pre ? mr_gelu_grad_f32(pre[i], dy[i]) : dy[i];
    }
};
template <> struct mr_dc_g<double> {
    static __device__ double g(const double *dy, const double *pre, int64_t i) {
        return pre ? mr_gelu_grad_f64(pre[i], dy[i]) : dy[i];
    }
};

/* dc's storage from g: O is the stored type, kind 0 plain, 1 bf16, 2 f16 */
template <typename T, typename O, int kind> struct mr_dc_store {
    static __device__ O put(T v) { return (O)v; }
};
template <> struct mr_dc_store<float, uint16_t, 1> {
    static __device__ uint16_t put(float v) { return mr_f32_to_bf16(v); }
};
template <> struct mr_dc_store<float, uint16_t, 2> {
    static __device__ uint16_t put(float v) { return mr_f32_to_f16(v); }
};

template <typename T, typename O, int kind>
__global__ void mr_gemm_dc_kernel(const T *__restrict__ dy, const T *__restrict__ pre, O *__restrict__ dc, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dc[i] = mr_dc_store<T, O, kind>::put(mr_dc_g<T>::g(dy, pre, i));
}

template <typename T>
__global__ void mr_gemm_dbias_kernel(const T *__restrict__ dy, const T *__restrict__ pre, T *__restrict__ db,
                                     int64_t rows, int64_t cols) {
    __shared__ T lane[DC_LANES][DC_COLS];
    const int64_t j = (int64_t)blockIdx.x * DC_COLS + threadIdx.x;
    T s = 0;
    if (j < cols)
        for (int64_t r = threadIdx.y; r < rows; r += DC_LANES) s += mr_dc_g<T>::g(dy, pre, r * cols + j);
    lane[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
        T t = lane[0][threadIdx.x];
        for (int k = 1; k < DC_LANES; k++) t += lane[k][threadIdx.x];
        db[j] = t;
    }
}

template <typename T>
static mr_status launch(const mr_op_args *a, cudaStream_t s, int64_t rows, int64_t cols) {
    const T *dy = (const T *)a->in[0].data, *pre = (const T *)a->in[1].data;
    const int64_t n = rows * cols;
    void *dc = a->out[0].data;
    if (dc && n > 0) {
        const unsigned g = mr_cuda_grid(n);
        switch (a->out[0].dtype) {
        case MR_BF16: mr_gemm_dc_kernel<T, uint16_t, 1><<<g, MR_CUDA_BLOCK, 0, s>>>(dy, pre, (uint16_t *)dc, n); break;
        case MR_F16: mr_gemm_dc_kernel<T, uint16_t, 2><<<g, MR_CUDA_BLOCK, 0, s>>>(dy, pre, (uint16_t *)dc, n); break;
        default: mr_gemm_dc_kernel<T, T, 0><<<g, MR_CUDA_BLOCK, 0, s>>>(dy, pre, (T *)dc, n); break;
        }
        mr_status st = mr_cuda_check_launch("gemm_dc");
        if (st != MR_OK) return st;
    }
    if (a->out[1].data && cols > 0) {
        const dim3 block(DC_COLS, DC_LANES), grid((unsigned)((cols + DC_COLS - 1) / DC_COLS));
        mr_gemm_dbias_kernel<T><<<grid, block, 0, s>>>(dy, pre, (T *)a->out[1].data, rows, cols);
        return mr_cuda_check_launch("gemm_dc");
    }
    return MR_OK;
}

extern "C" mr_status mr_gemm_dc_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    const mr_shape *sh = &a->in[0].shape;
    const int64_t cols = sh->dim[sh->ndim - 1], rows = cols > 0 ? mr_shape_numel(sh) / cols : 0;
    MR_TRY(mr_cuda_op_stream(a, &s));
    return a->in[0].dtype == MR_F32 ? launch<float>(a, s, rows, cols) : launch<double>(a, s, rows, cols);
fail:
    return st;
}
