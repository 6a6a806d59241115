/* The CUDA side of core/vec.h: axpby, scale and a deterministic sum of squares over f32 device
 * buffers, and CUDA graph capture on a stream.
 *
 * mr_vec_sumsq: a fixed grid of blocks (it depends only on n), each thread summing a strided
 * slice in double, each block reducing its threads in a fixed tree into one partial, then one
 * block summing the partials in a fixed tree: the same bits on every run, whatever the timing.
 * mr_vec_sumsq_seg is the same kernel, whose threads with a non-finite partial also flag the
 * segments of their non-finite elements (the steady, all-finite step pays one test per thread).
 * Graph capture uses cudaStreamCaptureModeThreadLocal, so another thread's unrelated CUDA calls
 * (a data loader's pinned copies, another replica's stream) do not invalidate the capture. */
#include "core/cuda/cuda_impl.h"
#include "core/vec_impl.h"
#include "core/math/seg_math.h"
#include "core/math/ctl_math.h"

#include <stdlib.h>

struct mr_capture {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int device;
};

static cudaStream_t raw(const mr_stream *s) { return s ? s->s : (cudaStream_t)0; }

static mr_status use(int device, const mr_stream *s) {
    mr_status st = MR_OK;
    MR_TRY_CUDA(cudaSetDevice(s ? s->device : device));
    return MR_OK;
fail:
    return st;
}

/* y, x are (n) */
__global__ void mr_axpby_kernel(float *__restrict__ y, float a, const float *__restrict__ x, float b, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = a == 0.0f ? b * x[i] : a * y[i] + b * x[i];
}

/* y is (n) */
__global__ void mr_vscale_kernel(float *__restrict__ y, float a, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] *= a;
}

#define SUMSQ_THREADS 256

/* Fixed-order tree over the block's SUMSQ_THREADS values in sh; thread 0 ends with the total. */
static __device__ void block_sum(double *sh) {
    for (int w = SUMSQ_THREADS / 2; w > 0; w >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    }
}

/* x is (n); part is (gridDim.x); seg and bad (nseg) are mr_vec_sumsq_seg's, or NULL. A thread's
 * sum of squares is not finite exactly when one of its elements is not, so only such a thread (none
 * in an all-finite pass) walks its elements again for their segments; threads that find the same
 * segment all store the same 1. */
__global__ void mr_sumsq_kernel(const float *__restrict__ x, int64_t n, double *__restrict__ part,
                                const int64_t *__restrict__ seg, int32_t nseg, int32_t *__restrict__ bad) {
    __shared__ double sh[SUMSQ_THREADS];
    double s = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double v = (double)x[i];
        s += v * v;
    }
    if (bad && !isfinite(s))
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            if (!isfinite(x[i])) bad[mr_seg_of(seg, nseg, i)] = 1;
    sh[threadIdx.x] = s;
    block_sum(sh);
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

/* part is (np <= MR_VEC_SCRATCH - 1); the total goes to part[MR_VEC_SCRATCH - 1] */
__global__ void mr_sumsq_final_kernel(double *part, int np) {
    __shared__ double sh[SUMSQ_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < np; i += SUMSQ_THREADS) s += part[i];
    sh[threadIdx.x] = s;
    block_sum(sh);
    if (threadIdx.x == 0) part[MR_VEC_SCRATCH - 1] = sh[0];
}

/* the total into *out as well (mr_vec_sumsq_to) */
__global__ void mr_sumsq_final_to_kernel(double *part, int np, double *out) {
    __shared__ double sh[SUMSQ_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < np; i += SUMSQ_THREADS) s += part[i];
    sh[threadIdx.x] = s;
    block_sum(sh);
    if (threadIdx.x == 0) *out = sh[0];
}

/* y is (n); the factor and the flag are read when the kernel runs */
__global__ void mr_vscale_if_kernel(float *__restrict__ y, const float *a, const int32_t *on, int64_t n) {
    if (!*on) return;
    const float f = *a;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] *= f;
}

/* one thread each: core/math/ctl_math.h */
__global__ void mr_ctl_loss_kernel(mr_step_ctl *c, const float *loss, int64_t m, int64_t accumulate) {
    mr_ctl_loss(c, *loss, m, accumulate);
}
__global__ void mr_ctl_check_kernel(mr_step_ctl *c, mr_ctl_cfg k, int32_t *bad, const int32_t *order) {
    mr_ctl_check(c, k, bad, order);
}
__global__ void mr_ctl_clip_kernel(mr_step_ctl *c, double max_norm, int use_clip_sumsq) {
    mr_ctl_clip(c, max_norm, use_clip_sumsq);
}

extern "C" mr_status mr_cuda_vec_axpby(int device, mr_stream *s, float *y, float a, const float *x, float b,
                                       int64_t n) {
    if (n == 0) return MR_OK;
    mr_status st = use(device, s);
    if (st != MR_OK) return st;
    mr_axpby_kernel<<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, raw(s)>>>(y, a, x, b, n);
    return mr_cuda_check_launch("vec_axpby");
}

extern "C" mr_status mr_cuda_vec_scale(int device, mr_stream *s, float *y, float a, int64_t n) {
    if (n == 0) return MR_OK;
    mr_status st = use(device, s);
    if (st != MR_OK) return st;
    mr_vscale_kernel<<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, raw(s)>>>(y, a, n);
    return mr_cuda_check_launch("vec_scale");
}

extern "C" mr_status mr_cuda_vec_sumsq(int device, mr_stream *s, const float *x, int64_t n, const int64_t *seg,
                                       int32_t nseg, int32_t *bad, double *d_scratch, double *out) {
    mr_status st = MR_OK;
    double h = 0.0;
    *out = 0.0;
    if (!d_scratch) return mr_set_error(MR_ERR_INVALID, "vec_sumsq: the CUDA path needs MR_VEC_SCRATCH doubles of scratch");
    if (n == 0) return MR_OK;
    MR_TRY(use(device, s));
    {
        /* the grid depends on n only: at most MR_VEC_SCRATCH - 1 partials */
        int64_t want = (n + SUMSQ_THREADS - 1) / SUMSQ_THREADS;
        int np = (int)(want < MR_VEC_SCRATCH - 1 ? want : MR_VEC_SCRATCH - 1);
        mr_sumsq_kernel<<<np, SUMSQ_THREADS, 0, raw(s)>>>(x, n, d_scratch, seg, nseg, bad);
        MR_TRY(mr_cuda_check_launch("vec_sumsq"));
        mr_sumsq_final_kernel<<<1, SUMSQ_THREADS, 0, raw(s)>>>(d_scratch, np);
        MR_TRY(mr_cuda_check_launch("vec_sumsq"));
        MR_TRY_CUDA(cudaMemcpyAsync(&h, d_scratch + MR_VEC_SCRATCH - 1, sizeof h, cudaMemcpyDeviceToHost, raw(s)));
        MR_TRY_CUDA(cudaStreamSynchronize(raw(s)));
    }
    *out = h;
    return MR_OK;
fail:
    return st;
}

extern "C" mr_status mr_cuda_vec_sumsq_to(int device, mr_stream *s, const float *x, int64_t n, const int64_t *seg,
                                          int32_t nseg, int32_t *bad, double *d_scratch, double *d_out) {
    mr_status st = MR_OK;
    if (!d_scratch) return mr_set_error(MR_ERR_INVALID, "vec_sumsq_to: the CUDA path needs MR_VEC_SCRATCH doubles of scratch");
    MR_TRY(use(device, s));
    if (n == 0) {
        MR_TRY_CUDA(cudaMemsetAsync(d_out, 0, sizeof *d_out, raw(s)));
        return MR_OK;
    }
    {
        int64_t want = (n + SUMSQ_THREADS - 1) / SUMSQ_THREADS; /* mr_cuda_vec_sumsq's grid */
        int np = (int)(want < MR_VEC_SCRATCH - 1 ? want : MR_VEC_SCRATCH - 1);
        mr_sumsq_kernel<<<np, SUMSQ_THREADS, 0, raw(s)>>>(x, n, d_scratch, seg, nseg, bad);
        MR_TRY(mr_cuda_check_launch("vec_sumsq_to"));
        mr_sumsq_final_to_kernel<<<1, SUMSQ_THREADS, 0, raw(s)>>>(d_scratch, np, d_out);
        MR_TRY(mr_cuda_check_launch("vec_sumsq_to"));
    }
    return MR_OK;
fail:
    return st;
}

extern "C" mr_status mr_cuda_vec_scale_if(int device, mr_stream *s, float *y, const float *a, const int32_t *on,
                                          int64_t n) {
    if (n == 0) return MR_OK;
    mr_status st = use(device, s);
    if (st != MR_OK) return st;
    mr_vscale_if_kernel<<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, raw(s)>>>(y, a, on, n);
    return mr_cuda_check_launch("vec_scale_if");
}

extern "C" mr_status mr_cuda_vec_ctl_loss(int device, mr_stream *s, mr_step_ctl *ctl, const float *loss, int64_t m,
                                          int64_t accumulate) {
    mr_status st = use(device, s);
    if (st != MR_OK) return st;
    mr_ctl_loss_kernel<<<1, 1, 0, raw(s)>>>(ctl, loss, m, accumulate);
    return mr_cuda_check_launch("vec_ctl_loss");
}

extern "C" mr_status mr_cuda_vec_ctl_check(int device, mr_stream *s, mr_step_ctl *ctl, mr_ctl_cfg k, int32_t *bad,
                                           const int32_t *order) {
    mr_status st = use(device, s);
    if (st != MR_OK) return st;
    mr_ctl_check_kernel<<<1, 1, 0, raw(s)>>>(ctl, k, bad, order);
    return mr_cuda_check_launch("vec_ctl_check");
}

extern "C" mr_status mr_cuda_vec_ctl_clip(int device, mr_stream *s, mr_step_ctl *ctl, double max_norm,
                                          int use_clip_sumsq) {
    mr_status st = use(device, s);
    if (st != MR_OK) return st;
    mr_ctl_clip_kernel<<<1, 1, 0, raw(s)>>>(ctl, max_norm, use_clip_sumsq);
    return mr_cuda_check_launch("vec_ctl_clip");
}

extern "C" mr_status mr_cuda_capture_begin(int device, mr_stream *s) {
    mr_status st = MR_OK;
    if (!s) return mr_set_error(MR_ERR_INVALID, "capture: the legacy default stream cannot be captured; use a stream");
    MR_TRY(use(device, s));
    MR_TRY_CUDA(cudaStreamBeginCapture(s->s, cudaStreamCaptureModeThreadLocal));
    return MR_OK;
fail:
    return st;
}

extern "C" mr_status mr_cuda_capture_end(int device, mr_stream *s, mr_capture **out) {
    mr_status st = MR_OK;
    mr_capture *c = NULL;
    cudaGraph_t g = NULL;
    *out = NULL;
    if (!s) return mr_set_error(MR_ERR_INVALID, "capture: no stream");
    MR_TRY(use(device, s));
    {
        /* always end the capture, even when the work recorded in it failed */
        cudaError_t e = cudaStreamEndCapture(s->s, &g);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            if (g) (void)cudaGraphDestroy(g);
            return mr_set_error(MR_ERR_DEVICE, "capture: cudaStreamEndCapture failed: %s (%s)", cudaGetErrorString(e),
                                cudaGetErrorName(e));
        }
    }
    c = (mr_capture *)calloc(1, sizeof *c);
    MR_CHECK(c, MR_ERR_NOMEM, "capture: out of host memory");
    c->graph = g;
    c->device = s->device;
    g = NULL;
    MR_TRY_CUDA(cudaGraphInstantiate(&c->exec, c->graph, 0));
    *out = c;
    return MR_OK;
fail:
    if (g) (void)cudaGraphDestroy(g);
    mr_cuda_capture_free(c);
    return st;
}

extern "C" mr_status mr_cuda_capture_launch(mr_capture *c, mr_stream *s) {
    mr_status st = MR_OK;
    MR_TRY(use(c->device, s));
    MR_TRY_CUDA(cudaGraphLaunch(c->exec, raw(s)));
    return MR_OK;
fail:
    return st;
}

extern "C" void mr_cuda_capture_free(mr_capture *c) {
    if (!c) return;
    if (cudaSetDevice(c->device) == cudaSuccess) {
        if (c->exec) (void)cudaGraphExecDestroy(c->exec);
        if (c->graph) (void)cudaGraphDestroy(c->graph);
    }
    (void)cudaGetLastError();
    free(c);
}
