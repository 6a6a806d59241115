/* The cast op on the GPU among f32, f64, f16 and bf16 (see MR_OP_CAST in ops.h).
 *
 * Conversions are core/math/half_math.h, the bit-exact round-to-nearest-even code the CPU uses,
 * so a cast gives the same bits on every backend. f64 to f16/bf16 rounds through f32, as
 * mr_dtype_set does (the documented behaviour of the cast op). */
#include "core/cuda/cuda_impl.h"
#include "core/math/half_math.h"
#include "core/ops_impl.h"

/* Storage type and conversion to/from the wide types for each dtype. */
struct mr_c_f32 {
    typedef float S;
    static __device__ double get(S v) { return v; }
    static __device__ S from_f64(double v) { return (float)v; }
    static __device__ S from_f32(float v) { return v; }
};
struct mr_c_f64 {
    typedef double S;
    static __device__ double get(S v) { return v; }
    static __device__ S from_f64(double v) { return v; }
    static __device__ S from_f32(float v) { return v; }
};
struct mr_c_f16 {
    typedef uint16_t S;
    static __device__ double get(S v) { return mr_f16_to_f32(v); }
    static __device__ S from_f64(double v) { return mr_f32_to_f16((float)v); }
    static __device__ S from_f32(float v) { return mr_f32_to_f16(v); }
};
struct mr_c_bf16 {
    typedef uint16_t S;
    static __device__ double get(S v) { return mr_bf16_to_f32(v); }
    static __device__ S from_f64(double v) { return mr_f32_to_bf16((float)v); }
    static __device__ S from_f32(float v) { return mr_f32_to_bf16(v); }
};

/* x, y are (n). Going through f64 is exact for every source type except f64 itself, whose
 * narrowing to f16/bf16 rounds through f32 inside from_f64. */
template <typename I, typename O>
__global__ void mr_cast_kernel(const typename I::S *__restrict__ x, typename O::S *__restrict__ y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = O::from_f64(I::get(x[i]));
}

/* f32 sources stay in f32 (no f64 arithmetic on GPUs with slow f64). */
template <typename O>
__global__ void mr_cast_f32_kernel(const float *__restrict__ x, typename O::S *__restrict__ y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = O::from_f32(x[i]);
}

template <typename I>
static mr_status launch_from(const mr_op_args *a, cudaStream_t s, int64_t n) {
    const typename I::S *x = (const typename I::S *)a->in[0].data;
    void *y = a->out[0].data;
    unsigned g = mr_cuda_grid(n);
    switch (a->out[0].dtype) {
    case MR_F32: mr_cast_kernel<I, mr_c_f32><<<g, MR_CUDA_BLOCK, 0, s>>>(x, (float *)y, n); break;
    case MR_F64: mr_cast_kernel<I, mr_c_f64><<<g, MR_CUDA_BLOCK, 0, s>>>(x, (double *)y, n); break;
    case MR_F16: mr_cast_kernel<I, mr_c_f16><<<g, MR_CUDA_BLOCK, 0, s>>>(x, (uint16_t *)y, n); break;
    case MR_BF16: mr_cast_kernel<I, mr_c_bf16><<<g, MR_CUDA_BLOCK, 0, s>>>(x, (uint16_t *)y, n); break;
    default:
        return mr_op_error(a, "the CUDA kernel casts among f32, f64, f16 and bf16, not to %s",
                           mr_dtype_name(a->out[0].dtype));
    }
    return mr_cuda_check_launch("cast");
}

static mr_status launch_from_f32(const mr_op_args *a, cudaStream_t s, int64_t n) {
    const float *x = (const float *)a->in[0].data;
    void *y = a->out[0].data;
    unsigned g = mr_cuda_grid(n);
    switch (a->out[0].dtype) {
    case MR_F32: mr_cast_f32_kernel<mr_c_f32><<<g, MR_CUDA_BLOCK, 0, s>>>(x, (float *)y, n); break;
    case MR_F64: mr_cast_f32_kernel<mr_c_f64><<<g, MR_CUDA_BLOCK, 0, s>>>(x, (double *)y, n); break;
    case MR_F16: mr_cast_f32_kernel<mr_c_f16><<<g, MR_CUDA_BLOCK, 0, s>>>(x, (uint16_t *)y, n); break;
    case MR_BF16: mr_cast_f32_kernel<mr_c_bf16><<<g, MR_CUDA_BLOCK, 0, s>>>(x, (uint16_t *)y, n); break;
    default:
        return mr_op_error(a, "the CUDA kernel casts among f32, f64, f16 and bf16, not to %s",
                           mr_dtype_name(a->out[0].dtype));
    }
    return mr_cuda_check_launch("cast");
}

extern "C" mr_status mr_cast_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    /* x (any shape), y (x's shape, another float dtype) */
    int64_t n = mr_shape_numel(&a->in[0].shape);
    if (n == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    switch (a->in[0].dtype) {
    case MR_F32: return launch_from_f32(a, s, n);
    case MR_F64: return launch_from<mr_c_f64>(a, s, n);
    case MR_F16: return launch_from<mr_c_f16>(a, s, n);
    case MR_BF16: return launch_from<mr_c_bf16>(a, s, n);
    default:
        return mr_op_error(a, "the CUDA kernel casts among f32, f64, f16 and bf16, not from %s",
                           mr_dtype_name(a->in[0].dtype));
    }
fail:
    return st;
}
