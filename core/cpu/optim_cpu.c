/* SGD_UPDATE and ADAMW_UPDATE on the CPU: in-place f32 updates over the per-element math of
 * core/math/unary_math.h, one pass over memory, split across OpenMP threads by element (each
 * element is independent, so the result does not depend on the thread count). The scalars the
 * update needs once (AdamW's bias corrections 1 - beta^t) are computed in double and rounded once,
 * so f32 agrees with the f64 reference to a few ulp. f64 views run the reference. */
#include "core/math/unary_math.h"
#include "core/ops_impl.h"

#include <math.h>

/* Below this many elements an update runs on the calling thread. */
#define OPTIM_PAR_MIN 32768

/* param (n), grad (n), momentum_buf (n; absent when momentum == 0), f32. */
mr_status mr_sgd_update_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_sgd_update_ref(a);
    if (a->in[0].dtype != MR_F32) return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const mr_sgd_params *p = &a->p.sgd;
    float *restrict param = a->in[0].data;
    const float *restrict grad = a->in[1].data;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    const float lr = (float)p->lr, mom = (float)p->momentum, damp = (float)p->dampening, wd = (float)p->weight_decay;
    const int nesterov = p->nesterov, first = p->first_step;
    if (p->momentum == 0.0) {
        /* no buffer: each lane hands the math a private dummy it never touches */
#pragma omp parallel for simd schedule(static) if (n > OPTIM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            float unused = 0.0f;
            param[i] = mr_sgd_f32(param[i], grad[i], &unused, lr, 0.0f, damp, wd, 0, first);
        }
        return MR_OK;
    }
    float *restrict buf = a->in[2].data;
#pragma omp parallel for simd schedule(static) if (n > OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) param[i] = mr_sgd_f32(param[i], grad[i], &buf[i], lr, mom, damp, wd, nesterov, first);
    return MR_OK;
}

/* param (n), grad (n), exp_avg (n), exp_avg_sq (n), f32. */
mr_status mr_adamw_update_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_adamw_update_ref(a);
    if (a->in[0].dtype != MR_F32) return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const mr_adamw_params *p = &a->p.adamw;
    float *restrict param = a->in[0].data, *restrict m = a->in[2].data, *restrict v = a->in[3].data;
    const float *restrict grad = a->in[1].data;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    const mr_adamw_consts_f32 c = mr_adamw_prepare_f32(p->lr, p->beta1, p->beta2, p->eps, p->weight_decay, p->step);
#pragma omp parallel for simd schedule(static) if (n > OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) param[i] = mr_adamw_f32(param[i], grad[i], &m[i], &v[i], c);
    return MR_OK;
}
