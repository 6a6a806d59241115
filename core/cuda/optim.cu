/* Fused optimizer updates on the GPU: SGD (momentum, dampening, nesterov, weight decay) and
 * AdamW, in place, PyTorch semantics (see MR_OP_SGD_UPDATE / MR_OP_ADAMW_UPDATE in ops.h).
 *
 * One thread per element runs the per-element update of core/math/unary_math.h, the code the CPU
 * kernel and the reference share. Step-dependent scalars (AdamW's bias corrections) are computed
 * once on the host in f64 and passed in, or, by pointer (the trainer's device-side step count), read
 * from a table the host formed the same way. f32 only: parameters kept in f32 are what is updated;
 * mixed precision keeps f32 master weights. */
#include "core/cuda/cuda_impl.h"
#include "core/math/unary_math.h"
#include "core/ops_impl.h"

#include <math.h>

/* param, grad, buf are (n); buf is NULL when momentum == 0 */
__global__ void mr_sgd_kernel(float *__restrict__ param, const float *__restrict__ grad, float *__restrict__ buf,
                              int64_t n, float lr, float momentum, float dampening, float wd, int nesterov,
                              int first_step, const int32_t *apply, const int64_t *step) {
    if (apply && !*apply) return; /* by pointer: a skipped step */
    if (step) first_step = *step == 1;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float b = buf ? buf[i] : 0.0f;
        param[i] = mr_sgd_f32(param[i], grad[i], &b, lr, momentum, dampening, wd, nesterov, first_step);
        if (buf) buf[i] = b;
    }
}

/* param, grad, m, v are (n) */
__global__ void mr_adamw_kernel(float *__restrict__ param, const float *__restrict__ grad, float *__restrict__ m,
                                float *__restrict__ v, int64_t n, mr_adamw_consts_f32 c, mr_adamw_params p) {
    if (p.apply && !*p.apply) return; /* by pointer: a skipped step */
    if (p.dstep) { /* the step lives on the device: its bias corrections from the host's table */
        const int64_t k = *p.dstep < p.bc_last ? *p.dstep : p.bc_last;
        c = mr_adamw_prepare_bc_f32(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.bc[2 * k], p.bc[2 * k + 1]);
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float mm = m[i], vv = v[i];
        param[i] = mr_adamw_f32(param[i], grad[i], &mm, &vv, c);
        m[i] = mm;
        v[i] = vv;
    }
}

static mr_status f32_only(const mr_op_args *a) {
    for (int i = 0; i < a->n_in; i++)
        if (a->in[i].data && a->in[i].dtype != MR_F32)
            return mr_op_error(a, "the CUDA kernel takes f32, got %s for in[%d]", mr_dtype_name(a->in[i].dtype), i);
    return MR_OK;
}

extern "C" mr_status mr_sgd_update_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    const mr_sgd_params *p = &a->p.sgd;
    /* param (n), grad (n), momentum_buf (n) (unused when momentum == 0) */
    int64_t n = mr_shape_numel(&a->in[0].shape);
    MR_TRY(f32_only(a));
    if (p->momentum != 0.0 && !a->in[2].data) return mr_op_error(a, "momentum %g needs momentum_buf (in[2])", p->momentum);
    if (n == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    mr_sgd_kernel<<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(
        (float *)a->in[0].data, (const float *)a->in[1].data, p->momentum != 0.0 ? (float *)a->in[2].data : NULL, n,
        (float)p->lr, (float)p->momentum, (float)p->dampening, (float)p->weight_decay, p->nesterov, p->first_step,
        p->apply, p->step);
    return mr_cuda_check_launch("sgd_update");
fail:
    return st;
}

extern "C" mr_status mr_adamw_update_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    const mr_adamw_params *p = &a->p.adamw;
    /* param (n), grad (n), exp_avg (n), exp_avg_sq (n) */
    int64_t n = mr_shape_numel(&a->in[0].shape);
    MR_TRY(f32_only(a));
    if (p->step < 1) return mr_op_error(a, "step %lld must be >= 1", (long long)p->step);
    if (n == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    {
        /* the per-step constants are formed in double on the host, as on the CPU */
        mr_adamw_consts_f32 c = mr_adamw_prepare_f32(p->lr, p->beta1, p->beta2, p->eps, p->weight_decay, p->step);
        mr_adamw_kernel<<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>((float *)a->in[0].data, (const float *)a->in[1].data,
                                                                 (float *)a->in[2].data, (float *)a->in[3].data, n, c,
                                                                 *p);
    }
    return mr_cuda_check_launch("adamw_update");
fail:
    return st;
}
