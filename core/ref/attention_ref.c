/* Scaled dot-product attention (ATTENTION, ATTENTION_BWD, core/ops.h): argument checks and the
 * scalar f64 reference, one query row at a time (core/math/attention_math.h). The reference is
 * what the CPU f32 kernel, the CUDA kernels and cuDNN's fused attention are tested against
 * (tests/unit/test_ops_attention.c, tests/gpu/test_gpu_attention.c). */
#include "core/ops_impl.h"
#include "core/math/attention_math.h"

#include <math.h>
#include <stdlib.h>

static int is_half(mr_dtype t) { return t == MR_BF16 || t == MR_F16; }

/* The dtype lse has for inputs of dtype t. */
static mr_dtype lse_dtype(mr_dtype t) { return t == MR_F64 ? MR_F64 : MR_F32; }

/* q (..., T, D), k and v (..., S, D): the shared checks of both directions. */
static mr_status check_qkv(const mr_op_args *a, mr_dtype *dt) {
    const mr_view *q = &a->in[0], *k = &a->in[1], *v = &a->in[2];
    char b1[128], b2[128];
    if (!q->data || !k->data || !v->data) return mr_op_error(a, "q, k and v are required");
    mr_dtype t = q->dtype;
    if (t != MR_F32 && t != MR_F64 && !is_half(t))
        return mr_op_error(a, "q must be f32, f64, bf16 or f16, got %s", mr_dtype_name(t));
    if (k->dtype != t || v->dtype != t)
        return mr_op_error(a, "q, k and v must have one dtype, got %s, %s and %s", mr_dtype_name(t),
                           mr_dtype_name(k->dtype), mr_dtype_name(v->dtype));
    const mr_shape *qs = &q->shape, *ks = &k->shape;
    if (qs->ndim < 2 || ks->ndim != qs->ndim)
        return mr_op_error(a, "q %s and k %s must be (..., T, D) and (..., S, D)", mr_shape_str(qs, b1, 128),
                           mr_shape_str(ks, b2, 128));
    for (int i = 0; i < qs->ndim; i++)
        if (i != qs->ndim - 2 && ks->dim[i] != qs->dim[i])
            return mr_op_error(a, "q %s and k %s differ outside the sequence dim", mr_shape_str(qs, b1, 128),
                               mr_shape_str(ks, b2, 128));
    mr_status st = mr_op_check_shape(a, v, "v (in[2])", ks);
    if (st != MR_OK) return st;
    int64_t t_len = qs->dim[qs->ndim - 2], s_len = ks->dim[ks->ndim - 2], d = qs->dim[qs->ndim - 1];
    if (t_len < 1 || s_len < 1 || d < 1)
        return mr_op_error(a, "q %s and k %s need T, S and D of at least 1", mr_shape_str(qs, b1, 128),
                           mr_shape_str(ks, b2, 128));
    if (a->p.attention.causal && t_len > s_len)
        return mr_op_error(a, "causal attention needs T <= S, got q %s and k %s", mr_shape_str(qs, b1, 128),
                           mr_shape_str(ks, b2, 128));
    if (!(a->p.attention.scale > 0.0) || !isfinite(a->p.attention.scale))
        return mr_op_error(a, "the scale must be positive and finite, got %g", a->p.attention.scale);
    *dt = t;
    return MR_OK;
}

static mr_status check_view(const mr_op_args *a, const mr_view *v, const char *role, mr_dtype dt,
                            const mr_shape *s) {
    if (!v->data) return mr_op_error(a, "%s is required", role);
    if (v->dtype != dt)
        return mr_op_error(a, "%s must be %s, got %s", role, mr_dtype_name(dt), mr_dtype_name(v->dtype));
    return mr_op_check_shape(a, v, role, s);
}

static mr_shape lse_shape(const mr_shape *q) {
    mr_shape s = *q;
    s.ndim--;
    return s;
}

mr_status mr_attention_fwd_check(const mr_op_args *a) {
    mr_dtype dt = MR_F32;
    mr_status st = check_qkv(a, &dt);
    if (st != MR_OK) return st;
    mr_shape ls = lse_shape(&a->in[0].shape);
    if ((st = check_view(a, &a->out[0], "y (out[0])", dt, &a->in[0].shape)) != MR_OK) return st;
    return check_view(a, &a->out[1], "lse (out[1])", lse_dtype(dt), &ls);
}

mr_status mr_attention_bwd_check(const mr_op_args *a) {
    mr_dtype dt = MR_F32;
    mr_status st = check_qkv(a, &dt);
    if (st != MR_OK) return st;
    mr_shape ls = lse_shape(&a->in[0].shape);
    if ((st = check_view(a, &a->in[3], "y (in[3])", dt, &a->in[0].shape)) != MR_OK ||
        (st = check_view(a, &a->in[4], "lse (in[4])", lse_dtype(dt), &ls)) != MR_OK ||
        (st = check_view(a, &a->in[5], "dy (in[5])", dt, &a->in[0].shape)) != MR_OK ||
        (st = check_view(a, &a->out[0], "dq (out[0])", dt, &a->in[0].shape)) != MR_OK ||
        (st = check_view(a, &a->out[1], "dk (out[1])", dt, &a->in[1].shape)) != MR_OK)
        return st;
    return check_view(a, &a->out[2], "dv (out[2])", dt, &a->in[2].shape);
}

/* (slices, T, S, D) of checked args. */
static void dims(const mr_op_args *a, int64_t *bh, int64_t *t, int64_t *s, int64_t *d) {
    const mr_shape *q = &a->in[0].shape;
    *t = q->dim[q->ndim - 2];
    *d = q->dim[q->ndim - 1];
    *s = a->in[1].shape.dim[q->ndim - 2];
    *bh = mr_shape_numel(q) / (*t * *d);
}

mr_status mr_attention_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64)
        return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[0].dtype));
    int64_t bh, t, s, d;
    dims(a, &bh, &t, &s, &d);
    double *p = malloc((size_t)s * sizeof *p);
    if (!p) return mr_set_error(MR_ERR_NOMEM, "attention: out of host memory");
    const double *q = a->in[0].data, *k = a->in[1].data, *v = a->in[2].data;
    double *y = a->out[0].data, *lse = a->out[1].data;
    for (int64_t b = 0; b < bh; b++)
        for (int64_t i = 0; i < t; i++) {
            int64_t n = mr_attn_keys(i, t, s, a->p.attention.causal);
            lse[b * t + i] = mr_attn_row_fwd_f64(q + (b * t + i) * d, k + b * s * d, v + b * s * d, n, d,
                                                 a->p.attention.scale, p, y + (b * t + i) * d);
        }
    free(p);
    return MR_OK;
}

mr_status mr_attention_bwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64)
        return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[0].dtype));
    int64_t bh, t, s, d;
    dims(a, &bh, &t, &s, &d);
    double *p = malloc((size_t)s * sizeof *p);
    if (!p) return mr_set_error(MR_ERR_NOMEM, "attention_bwd: out of host memory");
    const double *q = a->in[0].data, *k = a->in[1].data, *v = a->in[2].data, *y = a->in[3].data;
    const double *lse = a->in[4].data, *dy = a->in[5].data;
    double *dq = a->out[0].data, *dk = a->out[1].data, *dv = a->out[2].data;
    for (int64_t i = 0; i < bh * s * d; i++) dk[i] = dv[i] = 0.0;
    for (int64_t b = 0; b < bh; b++)
        for (int64_t i = 0; i < t; i++) {
            int64_t n = mr_attn_keys(i, t, s, a->p.attention.causal), r = (b * t + i) * d;
            mr_attn_row_bwd_f64(q + r, k + b * s * d, v + b * s * d, y + r, dy + r, lse[b * t + i], n, d,
                                a->p.attention.scale, p, dq + r, dk + b * s * d, dv + b * s * d);
        }
    free(p);
    return MR_OK;
}
