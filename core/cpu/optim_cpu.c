/* SGD_UPDATE and ADAMW_UPDATE on the CPU: in-place f32 updates over the per-element math of
 * core/math/unary_math.h, one pass over memory, split across OpenMP threads by element (each
 * element is independent, so the result does not depend on the thread count). The scalars the
 * update needs once (AdamW's bias corrections 1 - beta^t) are computed in double and rounded once,
 * so f32 agrees with the f64 reference to a few ulp. f64 views run the reference. */
#include "core/math/unary_math.h"
#include "core/ops_impl.h"

#include <math.h>

#include "core/cpu/cpu_impl.h"

/* Below this many elements an update runs on the calling thread. */
#define OPTIM_PAR_MIN 32768
/* Elements per block shared out by OpenMP. */
#define OPTIM_BLOCK 4096

/* The update loops are compiled for the baseline ISA and for AVX-512 and picked at run time:
 * AdamW's sqrt and divide ran 4 wide (SSE) in the baseline build, 1.9 ns per parameter. Both give
 * the same bits (IEEE sqrt, divide and FMA-free arithmetic are exact operations either way). */
#define DEFINE_OPTIM_BLOCKS(SUF, ATTR)                                                              \
    ATTR static void sgd_block_##SUF(float *restrict param, const float *restrict grad, float *restrict buf, \
                                     int64_t b0, int64_t b1, const mr_sgd_params *p) {             \
        const float lr = (float)p->lr, mom = (float)p->momentum, damp = (float)p->dampening;        \
        const float wd = (float)p->weight_decay;                                                    \
        const int nesterov = p->nesterov, first = p->first_step;                                    \
        if (!buf) {                                                                                 \
            /* momentum 0: each lane hands the math a private dummy it never touches */            \
            _Pragma("omp simd") for (int64_t i = b0; i < b1; i++) {                                 \
                float unused = 0.0f;                                                                \
                param[i] = mr_sgd_f32(param[i], grad[i], &unused, lr, 0.0f, damp, wd, 0, first);    \
            }                                                                                       \
            return;                                                                                 \
        }                                                                                           \
        _Pragma("omp simd") for (int64_t i = b0; i < b1; i++)                                       \
            param[i] = mr_sgd_f32(param[i], grad[i], &buf[i], lr, mom, damp, wd, nesterov, first);  \
    }                                                                                               \
    ATTR static void adamw_block_##SUF(float *restrict param, const float *restrict grad, float *restrict m, \
                                       float *restrict v, int64_t b0, int64_t b1, mr_adamw_consts_f32 c) { \
        _Pragma("omp simd") for (int64_t i = b0; i < b1; i++)                                       \
            param[i] = mr_adamw_f32(param[i], grad[i], &m[i], &v[i], c);                            \
    }

DEFINE_OPTIM_BLOCKS(def, )
DEFINE_OPTIM_BLOCKS(512, __attribute__((target("avx512f"))))

/* param (n), grad (n), momentum_buf (n; absent when momentum == 0), f32. */
mr_status mr_sgd_update_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_sgd_update_ref(a);
    if (a->in[0].dtype != MR_F32) return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    float *param = a->in[0].data, *buf = a->p.sgd.momentum == 0.0 ? NULL : a->in[2].data;
    const float *grad = a->in[1].data;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    mr_sgd_params p = a->p.sgd;
    if (p.apply && !*p.apply) return MR_OK; /* by pointer: a skipped step */
    if (p.step) p.first_step = *p.step == 1;
    void (*fn)(float *, const float *, float *, int64_t, int64_t, const mr_sgd_params *) =
        mr_cpu_caps_get()->avx512f ? sgd_block_512 : sgd_block_def;
#pragma omp parallel for schedule(static) if (n > OPTIM_PAR_MIN)
    for (int64_t b0 = 0; b0 < n; b0 += OPTIM_BLOCK) fn(param, grad, buf, b0, n - b0 < OPTIM_BLOCK ? n : b0 + OPTIM_BLOCK, &p);
    return MR_OK;
}

/* The bias-correction entry of the by-pointer step (ops.h mr_adamw_params). */
static int64_t bc_at(const mr_adamw_params *p) { return *p->dstep < p->bc_last ? *p->dstep : p->bc_last; }

/* param (n), grad (n), exp_avg (n), exp_avg_sq (n), f32. */
mr_status mr_adamw_update_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_adamw_update_ref(a);
    if (a->in[0].dtype != MR_F32) return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const mr_adamw_params *p = &a->p.adamw;
    float *param = a->in[0].data, *m = a->in[2].data, *v = a->in[3].data;
    const float *grad = a->in[1].data;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    if (p->apply && !*p->apply) return MR_OK; /* by pointer: a skipped step */
    const mr_adamw_consts_f32 c =
        p->dstep ? mr_adamw_prepare_bc_f32(p->lr, p->beta1, p->beta2, p->eps, p->weight_decay, p->bc[2 * bc_at(p)],
                                           p->bc[2 * bc_at(p) + 1])
                 : mr_adamw_prepare_f32(p->lr, p->beta1, p->beta2, p->eps, p->weight_decay, p->step);
    void (*fn)(float *, const float *, float *, float *, int64_t, int64_t, mr_adamw_consts_f32) =
        mr_cpu_caps_get()->avx512f ? adamw_block_512 : adamw_block_def;
#pragma omp parallel for schedule(static) if (n > OPTIM_PAR_MIN)
    for (int64_t b0 = 0; b0 < n; b0 += OPTIM_BLOCK) fn(param, grad, m, v, b0, n - b0 < OPTIM_BLOCK ? n : b0 + OPTIM_BLOCK, c);
    return MR_OK;
}
