/* 2-d max pooling, CPU fast path (f32; f64 runs the reference). Both directions are parallel
 * over the N*C planes: a plane's windows only read (forward) or write (backward) that plane, so
 * the backward scatter never races and adds in window order whatever the thread count. Window
 * rules (ties, NaN, padding) are those of core/ref/pool_ref.c. */
#include "core/ops_impl.h"

#include <math.h>
#include <string.h>

#define POOL_PAR_MIN 32768

mr_status mr_maxpool2d_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_maxpool2d_fwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const mr_pool_params *p = &a->p.pool;
    const int64_t *d = a->in[0].shape.dim, *od = a->out[0].shape.dim;
    int64_t planes = d[0] * d[1], h = d[2], w = d[3], oh = od[2], ow = od[3];
    int kh = p->kernel_h, kw = p->kernel_w, sh = p->stride_h, sw = p->stride_w, ph = p->pad_h, pw = p->pad_w;
    /* x (N*C, H, W); y and argmax (N*C, OH, OW) */
    const float *x = a->in[0].data;
    float *y = a->out[0].data;
    int32_t *am = a->out[1].data;
#pragma omp parallel for schedule(static) if (planes * oh * ow * kh * kw > POOL_PAR_MIN)
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * h * w;
        for (int64_t i = 0; i < oh; i++) {
            /* clip the window to the plane once per row instead of testing every tap */
            int64_t h0 = i * sh - ph, h1 = h0 + kh;
            h0 = h0 < 0 ? 0 : h0;
            h1 = h1 > h ? h : h1;
            for (int64_t j = 0; j < ow; j++) {
                int64_t w0 = j * sw - pw, w1 = w0 + kw;
                w0 = w0 < 0 ? 0 : w0;
                w1 = w1 > w ? w : w1;
                float best = -INFINITY;
                int64_t arg = -1;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) {
                        float v = xp[ih * w + iw];
                        if (arg < 0 || (!isnan(best) && (v > best || isnan(v)))) {
                            best = v;
                            arg = ih * w + iw;
                        }
                    }
                y[(pl * oh + i) * ow + j] = best;
                am[(pl * oh + i) * ow + j] = (int32_t)arg;
            }
        }
    }
    return MR_OK;
}

mr_status mr_maxpool2d_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_maxpool2d_bwd_ref(a);
    if (a->in[1].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[1].dtype));
    const int64_t *d = a->out[0].shape.dim, *od = a->in[1].shape.dim;
    int64_t planes = d[0] * d[1], hw = d[2] * d[3], ohw = od[2] * od[3];
    /* argmax, dy (N*C, OH*OW); dx (N*C, H*W) */
    const int32_t *am = a->in[0].data;
    const float *dy = a->in[1].data;
    float *dx = a->out[0].data;
    /* a bad argmax would write out of bounds: scan first so the error names its position */
    for (int64_t i = 0; i < planes * ohw; i++)
        if (am[i] < -1 || am[i] >= hw)
            return mr_op_error(a, "argmax[%lld] = %d is outside [-1, %lld)", (long long)i, (int)am[i], (long long)hw);
#pragma omp parallel for schedule(static) if (planes * (hw + ohw) > POOL_PAR_MIN)
    for (int64_t pl = 0; pl < planes; pl++) {
        float *dxp = dx + pl * hw;
        const int32_t *ap = am + pl * ohw;
        const float *dyp = dy + pl * ohw;
        memset(dxp, 0, (size_t)hw * sizeof(float));
        for (int64_t i = 0; i < ohw; i++)
            if (ap[i] >= 0) dxp[ap[i]] += dyp[i];
    }
    return MR_OK;
}
