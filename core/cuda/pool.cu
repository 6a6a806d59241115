/* 2-d pooling (NCHW) and its backward on the GPU: max pooling (MR_OP_MAXPOOL2D, MR_OP_MAXPOOL2D_BWD
 * in ops.h) and average pooling (MR_OP_AVGPOOL2D, MR_OP_AVGPOOL2D_BWD); oracles in
 * core/ref/pool_ref.c. f32 and f64, as the checks accept.
 *
 * Max forward: one thread per output element walks its window, clipped to the plane, in row-major
 * order with the rule of core/math/pool_math.h (the reference's and the CPU's): the first maximal
 * element wins ties, padding never wins, the first NaN wins and stays; argmax is the flat index in
 * the H*W plane, -1 for a window that saw no element.
 *
 * Max backward is a gather, not a scatter: one thread per dx element visits the windows that
 * contain it, in increasing output index, and adds the dy of those whose argmax is this element,
 * from 0. No atomics, and the additions happen in the order of the reference's (and the CPU's)
 * scatter, so f64 results equal the reference's and f32 results the CPU's, bit for bit. The
 * difference: an argmax that does not lie in its own window (it did not come from MAXPOOL2D with
 * these params; the reference adds it wherever it points, and rejects one outside [-1, H*W)) is
 * ignored here, since checking would cost a device-to-host sync.
 *
 * Average pooling the same way: the forward sums its window clipped to the plane in row-major
 * order from 0 and divides by kh*kw (padding counts as zeros: count_include_pad); the backward
 * gathers, per dx element, dy/(kh*kw) of every window that contains it in increasing output
 * index. Those are the reference's and the CPU's orders, so again f64 equals the reference and
 * f32 the CPU, bit for bit. */
#include <stdint.h>

#include "core/cuda/cuda_impl.h"
#include "core/math/pool_math.h"
#include "core/ops_impl.h"

/* The geometry: planes = N*C planes of (h, w) in, (oh, ow) out; kernel, stride, padding. */
typedef struct mr_pool_dims {
    int64_t planes, h, w, oh, ow;
    int kh, kw, sh, sw, ph, pw;
} mr_pool_dims;

static __device__ int mr_pool_takes(float best, float v, int64_t arg) { return mr_maxpool_takes_f32(best, v, arg); }
static __device__ int mr_pool_takes(double best, double v, int64_t arg) { return mr_maxpool_takes_f64(best, v, arg); }

/* x (planes, h, w); y, argmax (planes, oh, ow). Thread per output element. */
template <typename T>
__global__ void mr_maxpool_fwd_kernel(const T *__restrict__ x, T *__restrict__ y, int32_t *__restrict__ am,
                                      mr_pool_dims g) {
    const int64_t n = g.planes * g.oh * g.ow;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = o % g.ow, t = o / g.ow, i = t % g.oh, pl = t / g.oh;
        /* the window clipped to the plane once, instead of testing every tap */
        int64_t h0 = i * g.sh - g.ph, h1 = h0 + g.kh, w0 = j * g.sw - g.pw, w1 = w0 + g.kw;
        h0 = h0 < 0 ? 0 : h0;
        h1 = h1 > g.h ? g.h : h1;
        w0 = w0 < 0 ? 0 : w0;
        w1 = w1 > g.w ? g.w : w1;
        const T *xp = x + pl * g.h * g.w;
        T best = (T)-INFINITY;
        int64_t arg = -1;
        for (int64_t ih = h0; ih < h1; ih++)
            for (int64_t iw = w0; iw < w1; iw++) {
                T v = xp[ih * g.w + iw];
                if (mr_pool_takes(best, v, arg)) {
                    best = v;
                    arg = ih * g.w + iw;
                }
            }
        y[o] = best;
        am[o] = (int32_t)arg;
    }
}

/* The output indices [*lo, *hi] (empty when lo > hi) of the windows along one axis that contain
 * input index `in`: window o covers o*stride - pad .. o*stride - pad + k - 1. */
static __device__ void mr_pool_cover(int64_t in, int k, int stride, int pad, int64_t out_len, int64_t *lo,
                                     int64_t *hi) {
    int64_t first = in + pad - k + 1; /* smallest o*stride that still reaches `in` */
    *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
    int64_t last = (in + pad) / stride; /* in + pad >= 0 */
    *hi = last < out_len - 1 ? last : out_len - 1;
}

/* argmax, dy (planes, oh, ow); dx (planes, h, w), every element written. Thread per dx element. */
template <typename T>
__global__ void mr_maxpool_bwd_kernel(const int32_t *__restrict__ am, const T *__restrict__ dy, T *__restrict__ dx,
                                      mr_pool_dims g) {
    const int64_t n = g.planes * g.h * g.w, ohw = g.oh * g.ow;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t iw = idx % g.w, t = idx / g.w, ih = t % g.h, pl = t / g.h;
        int64_t i0, i1, j0, j1;
        mr_pool_cover(ih, g.kh, g.sh, g.ph, g.oh, &i0, &i1);
        mr_pool_cover(iw, g.kw, g.sw, g.pw, g.ow, &j0, &j1);
        const int32_t me = (int32_t)(ih * g.w + iw); /* h*w <= INT32_MAX (checked) */
        const int32_t *ap = am + pl * ohw;
        const T *dp = dy + pl * ohw;
        T acc = 0;
        for (int64_t i = i0; i <= i1; i++)
            for (int64_t j = j0; j <= j1; j++)
                if (ap[i * g.ow + j] == me) acc += dp[i * g.ow + j];
        dx[idx] = acc;
    }
}

/* x (planes, h, w); y (planes, oh, ow). Thread per output element. */
template <typename T>
__global__ void mr_avgpool_fwd_kernel(const T *__restrict__ x, T *__restrict__ y, mr_pool_dims g) {
    const int64_t n = g.planes * g.oh * g.ow;
    const T div = (T)g.kh * (T)g.kw;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = o % g.ow, t = o / g.ow, i = t % g.oh, pl = t / g.oh;
        int64_t h0 = i * g.sh - g.ph, h1 = h0 + g.kh, w0 = j * g.sw - g.pw, w1 = w0 + g.kw;
        h0 = h0 < 0 ? 0 : h0;
        h1 = h1 > g.h ? g.h : h1;
        w0 = w0 < 0 ? 0 : w0;
        w1 = w1 > g.w ? g.w : w1;
        const T *xp = x + pl * g.h * g.w;
        T sum = 0;
        for (int64_t ih = h0; ih < h1; ih++)
            for (int64_t iw = w0; iw < w1; iw++) sum += xp[ih * g.w + iw];
        y[o] = sum / div;
    }
}

/* dy (planes, oh, ow); dx (planes, h, w), every element written. Thread per dx element. */
template <typename T>
__global__ void mr_avgpool_bwd_kernel(const T *__restrict__ dy, T *__restrict__ dx, mr_pool_dims g) {
    const int64_t n = g.planes * g.h * g.w, ohw = g.oh * g.ow;
    const T div = (T)g.kh * (T)g.kw;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t iw = idx % g.w, t = idx / g.w, ih = t % g.h, pl = t / g.h;
        int64_t i0, i1, j0, j1;
        mr_pool_cover(ih, g.kh, g.sh, g.ph, g.oh, &i0, &i1);
        mr_pool_cover(iw, g.kw, g.sw, g.pw, g.ow, &j0, &j1);
        const T *dp = dy + pl * ohw;
        T acc = 0;
        for (int64_t i = i0; i <= i1; i++)
            for (int64_t j = j0; j <= j1; j++) acc += dp[i * g.ow + j] / div;
        dx[idx] = acc;
    }
}

/* The geometry of x (or dx) (N,C,H,W) and y (or dy) (N,C,OH,OW). */
static mr_pool_dims pool_dims(const mr_op_args *a, const mr_shape *xs, const mr_shape *ys) {
    const mr_pool_params *p = &a->p.pool;
    mr_pool_dims g;
    g.planes = xs->dim[0] * xs->dim[1];
    g.h = xs->dim[2];
    g.w = xs->dim[3];
    g.oh = ys->dim[2];
    g.ow = ys->dim[3];
    g.kh = p->kernel_h;
    g.kw = p->kernel_w;
    g.sh = p->stride_h;
    g.sw = p->stride_w;
    g.ph = p->pad_h;
    g.pw = p->pad_w;
    return g;
}

extern "C" mr_status mr_maxpool2d_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    /* x (N,C,H,W); y (N,C,OH,OW); argmax (N,C,OH,OW) i32 */
    mr_dtype dt = a->in[0].dtype;
    mr_pool_dims g = pool_dims(a, &a->in[0].shape, &a->out[0].shape);
    int64_t n = g.planes * g.oh * g.ow;
    if (dt != MR_F32 && dt != MR_F64)
        return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
    /* the CPU's fused ReLU gradient (core/ops.h MR_OP_MAXPOOL2D): refused rather than ignored */
    MR_CHECK(!a->p.pool.relu, MR_ERR_UNSUPPORTED,
             "maxpool2d: p.pool.relu is a CPU kernel option, not supported by the CUDA kernel; HINT: build the graph "
             "for the GPU (autodiff/nn.h mr_nn.device) so it keeps the ReLU a node of its own");
    if (n == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (dt == MR_F32)
        mr_maxpool_fwd_kernel<float><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(
            (const float *)a->in[0].data, (float *)a->out[0].data, (int32_t *)a->out[1].data, g);
    else
        mr_maxpool_fwd_kernel<double><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(
            (const double *)a->in[0].data, (double *)a->out[0].data, (int32_t *)a->out[1].data, g);
    return mr_cuda_check_launch("maxpool2d");
fail:
    return st;
}

extern "C" mr_status mr_maxpool2d_bwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    /* argmax (N,C,OH,OW) i32; dy (N,C,OH,OW); dx (N,C,H,W) */
    mr_dtype dt = a->in[1].dtype;
    mr_pool_dims g = pool_dims(a, &a->out[0].shape, &a->in[1].shape);
    int64_t n = g.planes * g.h * g.w;
    if (dt != MR_F32 && dt != MR_F64)
        return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
    if (n == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (dt == MR_F32)
        mr_maxpool_bwd_kernel<float><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(
            (const int32_t *)a->in[0].data, (const float *)a->in[1].data, (float *)a->out[0].data, g);
    else
        mr_maxpool_bwd_kernel<double><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(
            (const int32_t *)a->in[0].data, (const double *)a->in[1].data, (double *)a->out[0].data, g);
    return mr_cuda_check_launch("maxpool2d_bwd");
fail:
    return st;
}

/* Forward: x (N,C,H,W) -> y (N,C,OH,OW), a thread per output; backward: dy (N,C,OH,OW) ->
 * dx (N,C,H,W), a thread per dx element. in[0] -> out[0] either way. */
template <bool FWD, typename T> static void avgpool_kernel(int64_t n, const void *in, void *out, mr_pool_dims g,
                                                           cudaStream_t s) {
    if (FWD) mr_avgpool_fwd_kernel<T><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>((const T *)in, (T *)out, g);
    else mr_avgpool_bwd_kernel<T><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>((const T *)in, (T *)out, g);
}

template <bool FWD> static mr_status avgpool_launch(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    mr_dtype dt = a->in[0].dtype;
    const mr_shape *xs = FWD ? &a->in[0].shape : &a->out[0].shape, *ys = FWD ? &a->out[0].shape : &a->in[0].shape;
    mr_pool_dims g = pool_dims(a, xs, ys);
    int64_t n = FWD ? g.planes * g.oh * g.ow : g.planes * g.h * g.w;
    if (dt != MR_F32 && dt != MR_F64)
        return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
    if (n == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (dt == MR_F32) avgpool_kernel<FWD, float>(n, a->in[0].data, a->out[0].data, g, s);
    else avgpool_kernel<FWD, double>(n, a->in[0].data, a->out[0].data, g, s);
    return mr_cuda_check_launch(FWD ? "avgpool2d" : "avgpool2d_bwd");
fail:
    return st;
}

extern "C" mr_status mr_avgpool2d_fwd_cuda(const mr_op_args *a) { return avgpool_launch<true>(a); }
extern "C" mr_status mr_avgpool2d_bwd_cuda(const mr_op_args *a) { return avgpool_launch<false>(a); }
