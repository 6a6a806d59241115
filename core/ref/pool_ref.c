/* 2-d pooling (NCHW): argument checks and the scalar f64 references.
 *
 * Max pooling: padding counts as -inf; the first maximal element of a window (row-major within
 * the window) wins ties, a NaN wins over numbers (the first NaN, so NaN propagates as in PyTorch),
 * and argmax is its flat index in the H*W plane (-1 if the window held no element). The backward
 * adds dy at argmax.
 *
 * Average pooling (torch.nn.AvgPool2d, count_include_pad=True, ceil_mode=False): a window's sum
 * over the elements inside the plane (row-major, from 0; padding adds zeros, so it is skipped)
 * divided by kernel_h*kernel_w. The backward adds dy/(kernel_h*kernel_w) to every element of the
 * window, windows in increasing output index (PyTorch's CPU order). The CPU and CUDA kernels keep
 * these orders (core/cpu/pool_cpu.c, core/cuda/pool.cu), so their f32 results agree bit for bit
 * and the CUDA f64 results equal these. */
#include "core/ops_impl.h"
#include "core/math/pool_math.h"

#include <math.h>

typedef struct pool_geom {
    int64_t n, c, h, w, oh, ow;
} pool_geom;

/* Validates the params and x (N,C,H,W) against y (N,C,OH,OW) and, unless idx is NULL, a second
 * (N,C,OH,OW) i32 view. */
static mr_status pool_geom_get(const mr_op_args *a, const mr_view *x, const char *xrole, const mr_view *y,
                               const char *yrole, const mr_view *idx, const char *irole, pool_geom *g) {
    const mr_pool_params *p = &a->p.pool;
    char b1[128], b2[128];
    if (p->kernel_h < 1 || p->kernel_w < 1 || p->stride_h < 1 || p->stride_w < 1 || p->pad_h < 0 || p->pad_w < 0 ||
        2 * p->pad_h > p->kernel_h || 2 * p->pad_w > p->kernel_w)
        return mr_op_error(a, "kernel (%d,%d) and stride (%d,%d) must be >= 1 and padding (%d,%d) in [0, kernel/2]",
                           p->kernel_h, p->kernel_w, p->stride_h, p->stride_w, p->pad_h, p->pad_w);
    if (!mr_dtype_is_float(x->dtype) || !mr_dtype_is_float(y->dtype))
        return mr_op_error(a, "%s (%s) and %s (%s) must be f32 or f64", xrole, mr_dtype_name(x->dtype), yrole,
                           mr_dtype_name(y->dtype));
    if (x->shape.ndim != 4)
        return mr_op_error(a, "%s %s must be 4-d (N,C,H,W)", xrole, mr_shape_str(&x->shape, b1, sizeof b1));
    const int64_t *d = x->shape.dim;
    *g = (pool_geom){d[0], d[1], d[2], d[3], 0, 0};
    if (g->h + 2 * p->pad_h < p->kernel_h || g->w + 2 * p->pad_w < p->kernel_w)
        return mr_op_error(a, "kernel (%d,%d) is larger than %s %s padded by (%d,%d)", p->kernel_h, p->kernel_w,
                           xrole, mr_shape_str(&x->shape, b1, sizeof b1), p->pad_h, p->pad_w);
    if (idx && g->h * g->w > INT32_MAX)
        return mr_op_error(a, "%s %s: the H*W plane does not fit an i32 argmax", xrole,
                           mr_shape_str(&x->shape, b1, sizeof b1));
    g->oh = (g->h + 2 * p->pad_h - p->kernel_h) / p->stride_h + 1;
    g->ow = (g->w + 2 * p->pad_w - p->kernel_w) / p->stride_w + 1;
    mr_shape ys = mr_shape_4d(g->n, g->c, g->oh, g->ow);
    mr_status st = mr_op_check_shape(a, y, yrole, &ys);
    if (st != MR_OK || !idx) return st;
    if ((st = mr_op_check_shape(a, idx, irole, &ys)) != MR_OK) return st;
    if (idx->dtype != MR_I32)
        return mr_op_error(a, "%s has dtype %s; expected i32 (shape %s)", irole, mr_dtype_name(idx->dtype),
                           mr_shape_str(&idx->shape, b2, sizeof b2));
    return MR_OK;
}

mr_status mr_maxpool2d_fwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->out[0].data || !a->out[1].data) return mr_op_error(a, "x, y and argmax are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK) return st;
    pool_geom g;
    return pool_geom_get(a, &a->in[0], "in[0] (x)", &a->out[0], "out[0] (y)", &a->out[1], "out[1] (argmax)", &g);
}

mr_status mr_maxpool2d_bwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "argmax, dy and dx are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK) return st;
    pool_geom g;
    return pool_geom_get(a, &a->out[0], "out[0] (dx)", &a->in[1], "in[1] (dy)", &a->in[0], "in[0] (argmax)", &g);
}

mr_status mr_maxpool2d_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    const mr_pool_params *p = &a->p.pool;
    const int64_t *d = a->in[0].shape.dim, *od = a->out[0].shape.dim;
    int64_t planes = d[0] * d[1], h = d[2], w = d[3], oh = od[2], ow = od[3];
    /* x (N*C, H, W); y and argmax (N*C, OH, OW) */
    const double *x = a->in[0].data;
    double *y = a->out[0].data;
    int32_t *am = a->out[1].data;
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                double best = -INFINITY;
                int64_t arg = -1;
                for (int64_t ki = 0; ki < p->kernel_h; ki++)
                    for (int64_t kj = 0; kj < p->kernel_w; kj++) {
                        int64_t ih = i * p->stride_h - p->pad_h + ki, iw = j * p->stride_w - p->pad_w + kj;
                        if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                        double v = x[(pl * h + ih) * w + iw];
                        if (mr_maxpool_takes_f64(best, v, arg)) {
                            best = v;
                            arg = ih * w + iw;
                        }
                    }
                y[(pl * oh + i) * ow + j] = best;
                /* p.pool.relu: the ReLU before the pool passes no gradient where its output is 0 */
                am[(pl * oh + i) * ow + j] = p->relu && !(best > 0) ? -1 : (int32_t)arg;
            }
    return MR_OK;
}

mr_status mr_maxpool2d_bwd_ref(const mr_op_args *a) {
    if (a->in[1].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    const int64_t *d = a->out[0].shape.dim, *od = a->in[1].shape.dim;
    int64_t planes = d[0] * d[1], hw = d[2] * d[3], ohw = od[2] * od[3];
    /* argmax, dy (N*C, OH*OW); dx (N*C, H*W) */
    const int32_t *am = a->in[0].data;
    const double *dy = a->in[1].data;
    double *dx = a->out[0].data;
    for (int64_t i = 0; i < planes * ohw; i++)
        if (am[i] < -1 || am[i] >= hw)
            return mr_op_error(a, "argmax[%lld] = %d is outside [-1, %lld)", (long long)i, (int)am[i], (long long)hw);
    for (int64_t i = 0; i < planes * hw; i++) dx[i] = 0.0;
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t i = 0; i < ohw; i++)
            if (am[pl * ohw + i] >= 0) dx[pl * hw + am[pl * ohw + i]] += dy[pl * ohw + i];
    return MR_OK;
}

mr_status mr_avgpool2d_fwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->out[0].data) return mr_op_error(a, "x and y are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK) return st;
    pool_geom g;
    return pool_geom_get(a, &a->in[0], "in[0] (x)", &a->out[0], "out[0] (y)", NULL, NULL, &g);
}

mr_status mr_avgpool2d_bwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->out[0].data) return mr_op_error(a, "dy and dx are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK) return st;
    pool_geom g;
    return pool_geom_get(a, &a->out[0], "out[0] (dx)", &a->in[0], "in[0] (dy)", NULL, NULL, &g);
}

mr_status mr_avgpool2d_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    const mr_pool_params *p = &a->p.pool;
    const int64_t *d = a->in[0].shape.dim, *od = a->out[0].shape.dim;
    int64_t planes = d[0] * d[1], h = d[2], w = d[3], oh = od[2], ow = od[3];
    const double div = (double)p->kernel_h * p->kernel_w;
    /* x (N*C, H, W); y (N*C, OH, OW) */
    const double *x = a->in[0].data;
    double *y = a->out[0].data;
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                double sum = 0.0;
                for (int64_t ki = 0; ki < p->kernel_h; ki++)
                    for (int64_t kj = 0; kj < p->kernel_w; kj++) {
                        int64_t ih = i * p->stride_h - p->pad_h + ki, iw = j * p->stride_w - p->pad_w + kj;
                        if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                        sum += x[(pl * h + ih) * w + iw];
                    }
                y[(pl * oh + i) * ow + j] = sum / div;
            }
    return MR_OK;
}

mr_status mr_avgpool2d_bwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    const mr_pool_params *p = &a->p.pool;
    const int64_t *d = a->out[0].shape.dim, *od = a->in[0].shape.dim;
    int64_t planes = d[0] * d[1], h = d[2], w = d[3], oh = od[2], ow = od[3];
    const double div = (double)p->kernel_h * p->kernel_w;
    /* dy (N*C, OH, OW); dx (N*C, H, W) */
    const double *dy = a->in[0].data;
    double *dx = a->out[0].data;
    for (int64_t i = 0; i < planes * h * w; i++) dx[i] = 0.0;
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                double g = dy[(pl * oh + i) * ow + j] / div;
                for (int64_t ki = 0; ki < p->kernel_h; ki++)
                    for (int64_t kj = 0; kj < p->kernel_w; kj++) {
                        int64_t ih = i * p->stride_h - p->pad_h + ki, iw = j * p->stride_w - p->pad_w + kj;
                        if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                        dx[(pl * h + ih) * w + iw] += g;
                    }
            }
    return MR_OK;
}
