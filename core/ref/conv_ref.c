/* 2-d convolution (NCHW, cross-correlation as in PyTorch): argument checks and the scalar f64
 * reference for the forward, the data gradient and the filter gradient. The scratch sizes of the
 * CPU kernels (mr_conv2d_*_workspace) live with them in core/cpu/conv_cpu.c. */
#include "core/ops_impl.h"

/* Geometry shared by the three ops; filled from x (or dx), w (or dw) and y (or dy). */
typedef struct conv_geom {
    int64_t n, c, h, w, o, kh, kw, oh, ow;
    int sh, sw, ph, pw;
} conv_geom;

/* Validates the params and the three 4-d shapes xs (N,C,H,W), ws (O,C,KH,KW), ys (N,O,OH,OW)
 * against each other; names the views by role. */
static mr_status conv_geom_get(const mr_op_args *a, const mr_view *x, const char *xrole, const mr_view *w,
                               const char *wrole, const mr_view *y, const char *yrole, conv_geom *g) {
    const mr_conv_params *p = &a->p.conv;
    char b1[128], b2[128], b3[128];
    if (p->stride_h <= 0 || p->stride_w <= 0 || p->pad_h < 0 || p->pad_w < 0)
        return mr_op_error(a, "stride (%d,%d) must be > 0 and padding (%d,%d) >= 0", p->stride_h, p->stride_w,
                           p->pad_h, p->pad_w);
    if (x->shape.ndim != 4 || w->shape.ndim != 4 || y->shape.ndim != 4)
        return mr_op_error(a, "%s %s, %s %s and %s %s must all be 4-d (NCHW, OCKhKw)", xrole,
                           mr_shape_str(&x->shape, b1, 128), wrole, mr_shape_str(&w->shape, b2, 128), yrole,
                           mr_shape_str(&y->shape, b3, 128));
    const int64_t *xd = x->shape.dim, *wd = w->shape.dim;
    *g = (conv_geom){xd[0], xd[1], xd[2], xd[3], wd[0], wd[2], wd[3], 0, 0, p->stride_h, p->stride_w, p->pad_h, p->pad_w};
    if (wd[1] != g->c || g->kh < 1 || g->kw < 1 || g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw)
        return mr_op_error(a, "%s %s and %s %s do not agree (channels, or kernel larger than the padded input "
                           "with padding (%d,%d))", xrole, mr_shape_str(&x->shape, b1, 128), wrole,
                           mr_shape_str(&w->shape, b2, 128), g->ph, g->pw);
    g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
    g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    mr_shape ys = mr_shape_4d(g->n, g->o, g->oh, g->ow);
    if (!mr_shape_eq(&y->shape, &ys))
        return mr_op_error(a, "%s %s must be %s for %s %s, %s kernel %lldx%lld, stride (%d,%d), padding (%d,%d)",
                           yrole, mr_shape_str(&y->shape, b1, 128), mr_shape_str(&ys, b2, 128), xrole,
                           mr_shape_str(&x->shape, b3, 128), wrole, (long long)g->kh, (long long)g->kw, g->sh,
                           g->sw, g->ph, g->pw);
    return MR_OK;
}

static mr_status conv_bias_check(const mr_op_args *a, const mr_view *b, const char *role, int64_t o) {
    if (!b->data) return MR_OK;
    mr_shape s = mr_shape_1d(o);
    return mr_op_check_shape(a, b, role, &s);
}

mr_status mr_conv2d_fwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "x, w and y are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK || (st = mr_op_check_all_float(a, dt)) != MR_OK) return st;
    conv_geom g;
    if ((st = conv_geom_get(a, &a->in[0], "in[0] (x)", &a->in[1], "in[1] (w)", &a->out[0], "out[0] (y)", &g)) != MR_OK)
        return st;
    return conv_bias_check(a, &a->in[2], "in[2] (bias)", g.o);
}

mr_status mr_conv2d_bwd_data_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "w, dy and dx are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK || (st = mr_op_check_all_float(a, dt)) != MR_OK) return st;
    conv_geom g;
    return conv_geom_get(a, &a->out[0], "out[0] (dx)", &a->in[0], "in[0] (w)", &a->in[1], "in[1] (dy)", &g);
}

mr_status mr_conv2d_bwd_filter_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "x, dy and dw are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK || (st = mr_op_check_all_float(a, dt)) != MR_OK) return st;
    conv_geom g;
    if ((st = conv_geom_get(a, &a->in[0], "in[0] (x)", &a->out[0], "out[0] (dw)", &a->in[1], "in[1] (dy)", &g)) != MR_OK)
        return st;
    return conv_bias_check(a, &a->out[1], "out[1] (dbias)", g.o);
}

/* Visits every (input, weight, output) triple of the convolution: the one loop nest all three
 * references share, so they differentiate exactly the same function. MODE 0: y += x*w;
 * 1: dx += w*dy; 2: dw += x*dy. */
static void conv_ref_loop(const conv_geom *g, int mode, double *x, double *w, double *y) {
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t o = 0; o < g->o; o++)
            for (int64_t oh = 0; oh < g->oh; oh++)
                for (int64_t ow = 0; ow < g->ow; ow++) {
                    double *yv = &y[((n * g->o + o) * g->oh + oh) * g->ow + ow];
                    for (int64_t c = 0; c < g->c; c++)
                        for (int64_t i = 0; i < g->kh; i++) {
                            int64_t ih = oh * g->sh - g->ph + i;
                            if (ih < 0 || ih >= g->h) continue;
                            for (int64_t j = 0; j < g->kw; j++) {
                                int64_t iw = ow * g->sw - g->pw + j;
                                if (iw < 0 || iw >= g->w) continue;
                                double *xv = &x[((n * g->c + c) * g->h + ih) * g->w + iw];
                                double *wv = &w[((o * g->c + c) * g->kh + i) * g->kw + j];
                                if (mode == 0) *yv += *xv * *wv;
                                else if (mode == 1) *xv += *wv * *yv;
                                else *wv += *xv * *yv;
                            }
                        }
                }
}

mr_status mr_conv2d_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    conv_geom g;
    mr_status st = conv_geom_get(a, &a->in[0], "in[0] (x)", &a->in[1], "in[1] (w)", &a->out[0], "out[0] (y)", &g);
    if (st != MR_OK) return st;
    /* y (N,O,OH,OW) starts at the bias (O) or 0 */
    double *y = a->out[0].data;
    const double *bias = a->in[2].data;
    int64_t plane = g.oh * g.ow;
    for (int64_t i = 0; i < g.n * g.o * plane; i++) y[i] = bias ? bias[(i / plane) % g.o] : 0.0;
    conv_ref_loop(&g, 0, a->in[0].data, a->in[1].data, y);
    return MR_OK;
}

mr_status mr_conv2d_bwd_data_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    conv_geom g;
    mr_status st = conv_geom_get(a, &a->out[0], "out[0] (dx)", &a->in[0], "in[0] (w)", &a->in[1], "in[1] (dy)", &g);
    if (st != MR_OK) return st;
    double *dx = a->out[0].data; /* (N,C,H,W) */
    for (int64_t i = 0; i < g.n * g.c * g.h * g.w; i++) dx[i] = 0.0;
    conv_ref_loop(&g, 1, dx, a->in[0].data, a->in[1].data);
    return MR_OK;
}

mr_status mr_conv2d_bwd_filter_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    conv_geom g;
    mr_status st = conv_geom_get(a, &a->in[0], "in[0] (x)", &a->out[0], "out[0] (dw)", &a->in[1], "in[1] (dy)", &g);
    if (st != MR_OK) return st;
    double *dw = a->out[0].data, *dbias = a->out[1].data; /* dw (O,C,KH,KW), dbias (O) */
    const double *dy = a->in[1].data;                     /* (N,O,OH,OW) */
    for (int64_t i = 0; i < g.o * g.c * g.kh * g.kw; i++) dw[i] = 0.0;
    conv_ref_loop(&g, 2, a->in[0].data, dw, a->in[1].data);
    if (dbias) {
        for (int64_t o = 0; o < g.o; o++) {
            double s = 0.0;
            for (int64_t n = 0; n < g.n; n++)
                for (int64_t i = 0; i < g.oh * g.ow; i++) s += dy[(n * g.o + o) * g.oh * g.ow + i];
            dbias[o] = s;
        }
    }
    return MR_OK;
}
