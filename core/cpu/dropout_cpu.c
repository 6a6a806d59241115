/* Inverted dropout, CPU fast path (f32; f64 runs the reference). One Philox block gives the
 * words of four consecutive elements, so the loop runs over blocks (4x fewer Philox rounds than
 * calling mr_philox_u32 per element) in parallel; the mask is the reference's by construction. */
#include "core/ops_impl.h"
#include "core/math/dropout_math.h"

#include <string.h>

#define DROPOUT_PAR_MIN 16384

mr_status mr_dropout_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_dropout_fwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const mr_dropout_params *p = &a->p.dropout;
    const float *x = a->in[0].data; /* x or dy, flat (n) */
    float *y = a->out[0].data;      /* y or dx (n) */
    int64_t n = mr_shape_numel(&a->in[0].shape);
    if (p->p == 0.0) {
        if (y != x) memmove(y, x, (size_t)n * sizeof(float));
        return MR_OK;
    }
    if (p->p >= 1.0) {
        memset(y, 0, (size_t)n * sizeof(float));
        return MR_OK;
    }
    float scale = (float)(1.0 / (1.0 - p->p));
    double thr = p->p;
    uint32_t key[2] = {(uint32_t)p->seed, (uint32_t)(p->seed >> 32)};
    int64_t nblk = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > DROPOUT_PAR_MIN)
    for (int64_t b = 0; b < nblk; b++) {
        uint64_t ctr64 = (uint64_t)b + p->offset; /* the block counter of mr_philox_u32 */
        uint32_t ctr[4] = {(uint32_t)ctr64, (uint32_t)(ctr64 >> 32), 0u, 0u}, r[4];
        mr_philox4x32_10(ctr, key, r);
        int64_t i0 = b * 4, m = n - i0 < 4 ? n - i0 : 4;
        for (int64_t l = 0; l < m; l++)
            y[i0 + l] = mr_dropout_keep(r[l], thr) ? x[i0 + l] * scale : 0.0f;
    }
    return MR_OK;
}
