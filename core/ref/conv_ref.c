/* 2-d convolution (NCHW, cross-correlation as in PyTorch): argument checks and the scalar f64
 * reference for the forward, the data gradient and the filter gradient (f64; mixed precision,
 * p.conv.bf16, through f64 copies). The scratch sizes of the CPU kernels
 * (mr_conv2d_*_workspace) live with them in core/cpu/conv_cpu.c (CONV2D_MAXPOOL's in
 * core/cpu/conv_pool_cpu.c). */
#include "core/ops_impl.h"
#include "core/math/half_math.h"

#include <stdlib.h>
#include <string.h>

/* Geometry shared by the three ops; filled from x (or dx), w (or dw) and y (or dy). */
typedef struct conv_geom {
    int64_t n, c, h, w, o, kh, kw, oh, ow;
    int sh, sw, ph, pw;
} conv_geom;

/* Validates the params and the three 4-d shapes xs (N,C,H,W), ws (O,C,KH,KW), ys (N,O,OH,OW)
 * against each other (y NULL: the first two only); names the views by role. */
static mr_status conv_geom_get(const mr_op_args *a, const mr_view *x, const char *xrole, const mr_view *w,
                               const char *wrole, const mr_view *y, const char *yrole, conv_geom *g) {
    const mr_conv_params *p = &a->p.conv;
    char b1[128], b2[128], b3[128];
    if (p->stride_h <= 0 || p->stride_w <= 0 || p->pad_h < 0 || p->pad_w < 0)
        return mr_op_error(a, "stride (%d,%d) must be > 0 and padding (%d,%d) >= 0", p->stride_h, p->stride_w,
                           p->pad_h, p->pad_w);
    if (x->shape.ndim != 4 || w->shape.ndim != 4 || (y && y->shape.ndim != 4))
        return mr_op_error(a, "%s %s, %s %s and %s %s must all be 4-d (NCHW, OCKhKw)", xrole,
                           mr_shape_str(&x->shape, b1, 128), wrole, mr_shape_str(&w->shape, b2, 128), yrole,
                           y ? mr_shape_str(&y->shape, b3, 128) : "-");
    const int64_t *xd = x->shape.dim, *wd = w->shape.dim;
    *g = (conv_geom){xd[0], xd[1], xd[2], xd[3], wd[0], wd[2], wd[3], 0, 0, p->stride_h, p->stride_w, p->pad_h, p->pad_w};
    if (wd[1] != g->c || g->kh < 1 || g->kw < 1 || g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw)
        return mr_op_error(a, "%s %s and %s %s do not agree (channels, or kernel larger than the padded input "
                           "with padding (%d,%d))", xrole, mr_shape_str(&x->shape, b1, 128), wrole,
                           mr_shape_str(&w->shape, b2, 128), g->ph, g->pw);
    g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
    g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    mr_shape ys = mr_shape_4d(g->n, g->o, g->oh, g->ow);
    if (y && !mr_shape_eq(&y->shape, &ys))
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

/* The dtype rule: every float view f32, or every one f64; or with p.conv.bf16 (mixed precision,
 * core/cpu/conv_cpu.c) the weight (in[1] of the forward, in[0] of the data gradient) bf16, the
 * other tensor inputs (x, dy) f32 or bf16, the bias and the outputs f32. *mixed says which. */
static mr_status conv_dtypes(const mr_op_args *a, int *mixed) {
    *mixed = a->p.conv.bf16 != 0;
    if (!*mixed) {
        mr_dtype dt;
        mr_status st = mr_op_check_float(a, 0, &dt);
        if (st == MR_OK) st = mr_op_check_all_float(a, dt);
        if (st != MR_OK && (a->in[0].dtype == MR_BF16 || a->in[1].dtype == MR_BF16))
            return mr_op_error(a, "in[0] is %s and in[1] %s; HINT: bf16 inputs need p.conv.bf16 (mixed precision)",
                               mr_dtype_name(a->in[0].dtype), mr_dtype_name(a->in[1].dtype));
        return st;
    }
    int wslot = a->op == MR_OP_CONV2D || a->op == MR_OP_CONV2D_MAXPOOL ? 1 : a->op == MR_OP_CONV2D_BWD_DATA ? 0 : -1;
    for (int i = 0; i < 2; i++) {
        mr_dtype t = a->in[i].dtype;
        if (i == wslot ? t != MR_BF16 : (t != MR_F32 && t != MR_BF16))
            return mr_op_error(a, "in[%d] is %s; with p.conv.bf16 the weight is bf16 and x and dy f32 or bf16", i,
                               mr_dtype_name(t));
    }
    for (int k = 0; k < 2; k++) {
        const mr_view *v = k ? a->out : a->in;
        for (int i = k ? 0 : 2; i < (k ? a->n_out : a->n_in); i++)
            if (v[i].data && v[i].dtype != MR_F32)
                return mr_op_error(a, "%s[%d] is %s; with p.conv.bf16 the bias and the outputs are f32", k ? "out" : "in",
                                   i, mr_dtype_name(v[i].dtype));
    }
    return MR_OK;
}

mr_status mr_conv2d_fwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "x, w and y are required");
    int mixed;
    mr_status st = conv_dtypes(a, &mixed);
    if (st != MR_OK) return st;
    conv_geom g;
    if ((st = conv_geom_get(a, &a->in[0], "in[0] (x)", &a->in[1], "in[1] (w)", &a->out[0], "out[0] (y)", &g)) != MR_OK)
        return st;
    return conv_bias_check(a, &a->in[2], "in[2] (bias)", g.o);
}

/* The backward ops' dy (in[1]) against the conv geometry g: (N,O,OH,OW), or with p.conv.pool the
 * pooled (N,O,OH/2,OW/2) with in[2] the i32 argmax of that shape; in[2] is absent otherwise. */
static mr_status conv_bwd_dy_check(const mr_op_args *a, const conv_geom *g) {
    char b1[128];
    if (!a->p.conv.pool) {
        if (a->in[2].data) return mr_op_error(a, "in[2] (argmax) is only taken with p.conv.pool");
        mr_shape ys = mr_shape_4d(g->n, g->o, g->oh, g->ow);
        return mr_op_check_shape(a, &a->in[1], "in[1] (dy)", &ys);
    }
    if (!a->in[2].data || a->in[2].dtype != MR_I32)
        return mr_op_error(a, "p.conv.pool needs in[2] (argmax), i32; got %s",
                           a->in[2].data ? mr_dtype_name(a->in[2].dtype) : "none");
    mr_shape cs = mr_shape_4d(g->n, g->o, g->oh, g->ow), ps = mr_shape_4d(g->n, g->o, g->oh / 2, g->ow / 2);
    if (g->oh < 2 || g->ow < 2 || g->oh * g->ow > INT32_MAX)
        return mr_op_error(a, "p.conv.pool: the conv's output %s must be at least 2x2, its plane within i32",
                           mr_shape_str(&cs, b1, sizeof b1));
    mr_status st = mr_op_check_shape(a, &a->in[1], "in[1] (dy, pooled)", &ps);
    return st != MR_OK ? st : mr_op_check_shape(a, &a->in[2], "in[2] (argmax)", &ps);
}

/* The dtype rule over every view but the argmax (in[2], checked by conv_bwd_dy_check). */
static mr_status conv_bwd_dtypes(const mr_op_args *a) {
    mr_op_args c = *a;
    memset(&c.in[2], 0, sizeof c.in[2]);
    int mixed;
    return conv_dtypes(&c, &mixed);
}

mr_status mr_conv2d_bwd_data_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "w, dy and dx are required");
    mr_status st = conv_bwd_dtypes(a);
    if (st != MR_OK) return st;
    conv_geom g;
    if ((st = conv_geom_get(a, &a->out[0], "out[0] (dx)", &a->in[0], "in[0] (w)", NULL, "in[1] (dy)", &g)) != MR_OK)
        return st;
    return conv_bwd_dy_check(a, &g);
}

mr_status mr_conv2d_bwd_filter_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "x, dy and dw are required");
    mr_status st = conv_bwd_dtypes(a);
    if (st != MR_OK) return st;
    conv_geom g;
    if ((st = conv_geom_get(a, &a->in[0], "in[0] (x)", &a->out[0], "out[0] (dw)", NULL, "in[1] (dy)", &g)) != MR_OK)
        return st;
    if ((st = conv_bwd_dy_check(a, &g)) != MR_OK) return st;
    return conv_bias_check(a, &a->out[1], "out[1] (dbias)", g.o);
}

/* p.conv.pool: the pooled dy (in[1]) scattered at the argmax (in[2]) into a full-size dy of its
 * dtype (bits copied, 0 elsewhere: MAXPOOL2D_BWD of the 2x2 windows), then `ref` on that. */
static mr_status conv_ref_pooled(const mr_op_args *a, mr_status (*ref)(const mr_op_args *)) {
    const mr_view *xv = a->op == MR_OP_CONV2D_BWD_DATA ? &a->out[0] : &a->in[0];
    const mr_view *wv = a->op == MR_OP_CONV2D_BWD_DATA ? &a->in[0] : &a->out[0];
    conv_geom g;
    mr_status st = conv_geom_get(a, xv, "x", wv, "w", NULL, "dy", &g);
    if (st != MR_OK) return st;
    int64_t ohw = g.oh * g.ow, phw = (g.oh / 2) * (g.ow / 2), planes = g.n * g.o;
    size_t es = mr_dtype_size(a->in[1].dtype);
    char *full = calloc((size_t)(planes * ohw > 0 ? planes * ohw : 1), es);
    if (!full) return mr_set_error(MR_ERR_NOMEM, "conv2d reference: out of memory for %lld values", (long long)(planes * ohw));
    const char *dy = a->in[1].data;
    const int32_t *am = a->in[2].data;
    for (int64_t i = 0; i < planes * phw; i++) {
        if (am[i] < -1 || am[i] >= ohw) {
            free(full);
            return mr_op_error(a, "argmax[%lld] = %d is outside [-1, %lld)", (long long)i, (int)am[i], (long long)ohw);
        }
        if (am[i] >= 0) memcpy(full + ((i / phw) * ohw + am[i]) * (int64_t)es, dy + i * (int64_t)es, es);
    }
    mr_op_args c = *a;
    c.p.conv.pool = 0;
    c.in[1].data = full;
    c.in[1].shape = mr_shape_4d(g.n, g.o, g.oh, g.ow);
    memset(&c.in[2], 0, sizeof c.in[2]);
    st = ref(&c);
    free(full);
    return st;
}

/* Mixed precision (p.conv.bf16) through the f64 reference `ref`: every float view copied to f64,
 * the tensor inputs (in[0], in[1]) rounded to bf16 first (bf16 widens exactly; the bias is kept),
 * the reference run, the outputs rounded once to f32. */
static mr_status conv_ref_mixed(const mr_op_args *a, mr_status (*ref)(const mr_op_args *)) {
    mr_op_args d = *a;
    d.p.conv.bf16 = 0; /* the f64 reference on the rounded copies */
    double *buf[2][MR_OP_MAX_IO] = {{0}};
    mr_status st = MR_OK;
    for (int k = 0; k < 2 && st == MR_OK; k++) {
        const mr_view *v = k ? a->out : a->in;
        mr_view *dv = k ? d.out : d.in;
        for (int i = 0; i < (k ? a->n_out : a->n_in) && st == MR_OK; i++) {
            if (!v[i].data) continue;
            int64_t n = mr_shape_numel(&v[i].shape);
            if (!(buf[k][i] = malloc((size_t)(n > 0 ? n : 1) * sizeof(double)))) {
                st = mr_set_error(MR_ERR_NOMEM, "conv2d reference: out of memory for %lld doubles", (long long)n);
                break;
            }
            for (int64_t j = 0; j < n && !k; j++)
                buf[k][i][j] = v[i].dtype == MR_BF16 ? mr_bf16_to_f32(((const uint16_t *)v[i].data)[j])
                               : i < 2               ? mr_bf16_to_f32(mr_f32_to_bf16(((const float *)v[i].data)[j]))
                                                     : ((const float *)v[i].data)[j];
            dv[i].data = buf[k][i];
            dv[i].dtype = MR_F64;
        }
    }
    if (st == MR_OK) st = ref(&d);
    for (int i = 0; i < a->n_out && st == MR_OK; i++)
        for (int64_t j = 0; a->out[i].data && j < mr_shape_numel(&a->out[i].shape); j++)
            ((float *)a->out[i].data)[j] = (float)buf[1][i][j];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < MR_OP_MAX_IO; i++) free(buf[k][i]);
    return st;
}

static int conv_is_mixed(const mr_op_args *a) { return a->p.conv.bf16 != 0; }

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
    if (conv_is_mixed(a)) return conv_ref_mixed(a, mr_conv2d_fwd_ref);
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64 (or p.conv.bf16: mixed precision)");
    conv_geom g;
    mr_status st = conv_geom_get(a, &a->in[0], "in[0] (x)", &a->in[1], "in[1] (w)", &a->out[0], "out[0] (y)", &g);
    if (st != MR_OK) return st;
    /* y (N,O,OH,OW) starts at the bias (O) or 0 */
    double *y = a->out[0].data;
    const double *bias = a->in[2].data;
    int64_t plane = g.oh * g.ow;
    for (int64_t i = 0; i < g.n * g.o * plane; i++) y[i] = bias ? bias[(i / plane) % g.o] : 0.0;
    conv_ref_loop(&g, 0, a->in[0].data, a->in[1].data, y);
    if (a->p.conv.relu)
        for (int64_t i = 0; i < g.n * g.o * plane; i++) y[i] = y[i] > 0.0 ? y[i] : 0.0;
    return MR_OK;
}

mr_status mr_conv2d_bwd_data_ref(const mr_op_args *a) {
    if (a->p.conv.pool) return conv_ref_pooled(a, mr_conv2d_bwd_data_ref);
    if (conv_is_mixed(a)) return conv_ref_mixed(a, mr_conv2d_bwd_data_ref);
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64 (or p.conv.bf16: mixed precision)");
    conv_geom g;
    mr_status st = conv_geom_get(a, &a->out[0], "out[0] (dx)", &a->in[0], "in[0] (w)", &a->in[1], "in[1] (dy)", &g);
    if (st != MR_OK) return st;
    double *dx = a->out[0].data; /* (N,C,H,W) */
    for (int64_t i = 0; i < g.n * g.c * g.h * g.w; i++) dx[i] = 0.0;
    conv_ref_loop(&g, 1, dx, a->in[0].data, a->in[1].data);
    return MR_OK;
}

mr_status mr_conv2d_bwd_filter_ref(const mr_op_args *a) {
    if (a->p.conv.pool) return conv_ref_pooled(a, mr_conv2d_bwd_filter_ref);
    if (conv_is_mixed(a)) return conv_ref_mixed(a, mr_conv2d_bwd_filter_ref);
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64 (or p.conv.bf16: mixed precision)");
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

/* ---- CONV2D_MAXPOOL: the conv, then the 2x2/stride-2 max pool (core/ops.h) ---- */

/* The conv's geometry and the pooled shape (N,O,OH/2,OW/2) of y and the i32 argmax. */
mr_status mr_conv2d_maxpool_fwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data || !a->out[1].data)
        return mr_op_error(a, "x, w, y and argmax are required");
    if (a->out[1].dtype != MR_I32)
        return mr_op_error(a, "out[1] (argmax) has dtype %s; expected i32", mr_dtype_name(a->out[1].dtype));
    /* the conv's dtype rule over x, w, bias and y */
    mr_op_args c = *a;
    c.n_out = 1;
    memset(&c.out[1], 0, sizeof c.out[1]);
    int mixed;
    mr_status st = conv_dtypes(&c, &mixed);
    if (st != MR_OK) return st;
    conv_geom g;
    if ((st = conv_geom_get(a, &a->in[0], "in[0] (x)", &a->in[1], "in[1] (w)", NULL, "y", &g)) != MR_OK) return st;
    if ((st = conv_bias_check(a, &a->in[2], "in[2] (bias)", g.o)) != MR_OK) return st;
    char b1[128];
    if (g.oh < 2 || g.ow < 2 || g.oh * g.ow > INT32_MAX) {
        mr_shape cs = mr_shape_4d(g.n, g.o, g.oh, g.ow);
        return mr_op_error(a, "the conv's output %s must be at least 2x2 for the 2x2 pool, its plane within i32",
                           mr_shape_str(&cs, b1, sizeof b1));
    }
    mr_shape ps = mr_shape_4d(g.n, g.o, g.oh / 2, g.ow / 2);
    if ((st = mr_op_check_shape(a, &a->out[0], "out[0] (y)", &ps)) != MR_OK) return st;
    return mr_op_check_shape(a, &a->out[1], "out[1] (argmax)", &ps);
}

/* The definition itself: CONV2D's reference into a full-size scratch of y's dtype (f64, or f32 in
 * mixed precision, as CONV2D writes it), then MAXPOOL2D's reference over it (f32 widens to f64
 * exactly and the max picks one of the values, so y narrows back exactly). */
mr_status mr_conv2d_maxpool_fwd_ref(const mr_op_args *a) {
    mr_status st = mr_conv2d_maxpool_fwd_check(a);
    if (st != MR_OK) return st;
    const int64_t *xd = a->in[0].shape.dim, *wd = a->in[1].shape.dim;
    int64_t oh = (xd[2] + 2 * a->p.conv.pad_h - wd[2]) / a->p.conv.stride_h + 1;
    int64_t ow = (xd[3] + 2 * a->p.conv.pad_w - wd[3]) / a->p.conv.stride_w + 1;
    int64_t full = xd[0] * wd[0] * oh * ow, pooled = mr_shape_numel(&a->out[0].shape);
    int f32 = a->out[0].dtype == MR_F32;
    double *cy = malloc((size_t)(full > 0 ? full : 1) * sizeof(double));
    double *py = f32 ? malloc((size_t)(pooled > 0 ? pooled : 1) * sizeof(double)) : NULL;
    float *cyf = f32 ? malloc((size_t)(full > 0 ? full : 1) * sizeof(float)) : NULL;
    if (!cy || (f32 && (!py || !cyf))) {
        st = mr_set_error(MR_ERR_NOMEM, "conv2d_maxpool reference: out of memory for %lld values", (long long)full);
        goto done;
    }
    mr_op_args c = *a;
    c.op = MR_OP_CONV2D;
    c.n_out = 1;
    memset(&c.out[1], 0, sizeof c.out[1]);
    c.out[0].shape = mr_shape_4d(xd[0], wd[0], oh, ow);
    c.out[0].data = f32 ? (void *)cyf : (void *)cy;
    if ((st = mr_conv2d_fwd_ref(&c)) != MR_OK) goto done;
    for (int64_t i = 0; f32 && i < full; i++) cy[i] = cyf[i];
    mr_op_args p;
    mr_op_args_init(&p, MR_OP_MAXPOOL2D);
    p.p.pool = (mr_pool_params){2, 2, 2, 2, 0, 0, a->p.conv.relu != 0};
    p.in[0] = (mr_view){cy, MR_F64, c.out[0].shape};
    p.out[0] = (mr_view){f32 ? py : a->out[0].data, MR_F64, a->out[0].shape};
    p.out[1] = a->out[1];
    if ((st = mr_maxpool2d_fwd_ref(&p)) != MR_OK) goto done;
    for (int64_t i = 0; f32 && i < pooled; i++) ((float *)a->out[0].data)[i] = (float)py[i];
done:
    free(cy);
    free(py);
    free(cyf);
    return st;
}
