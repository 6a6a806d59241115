/* 2-d convolution, CPU fast path (f32; f64 runs the reference), by im2col + GEMM.
 *
 * Per image, im2col lays the receptive fields out as col (C*KH*KW, OH*OW), so
 *   forward:     y_n (O, OH*OW)        = w (O, CKK) * col
 *   data grad:   dcol (CKK, OH*OW)     = w^T * dy_n, then col2im adds dcol back into dx_n
 *   filter grad: dw (O, CKK)          += dy_n * col^T
 * Threads: with at least as many images as threads, images are spread over threads and each
 * GEMM runs single-threaded inside the parallel region (mr_cpu_sgemm's rule); with fewer images
 * (batch 1 inference, small tails) images run one by one and the GEMM itself is threaded.
 * Workspace: one col buffer per thread (omp_get_max_threads() at sizing time). The filter
 * gradient also keeps CONV_FILTER_GROUPS partial dw: the batch is cut into that many fixed groups
 * (never by thread), each summed into its own partial and the partials added in group order, so
 * dw does not depend on the thread count and needs no atomics. */
#include "core/cpu/cpu_impl.h"
#include "core/ops_impl.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_max_threads(void) { return 1; }
static int omp_get_thread_num(void) { return 0; }
#endif

/* Below this many multiply-adds the loops stay on one thread. */
#define CONV_PAR_MIN (1 << 18)
/* Fixed batch groups of the filter gradient (bounds its parallelism and its partial buffers). */
#define CONV_FILTER_GROUPS 16

typedef struct conv_dims {
    int64_t n, c, h, w, o, kh, kw, oh, ow, ckk, ohw;
    int sh, sw, ph, pw;
} conv_dims;

/* Geometry from x (N,C,H,W) and w (O,C,KH,KW); 0 when the views cannot describe a convolution
 * (the workspace query runs before the check, so it must not trust the args). */
static int conv_dims_get(const mr_op_args *a, const mr_view *x, const mr_view *w, conv_dims *g) {
    const mr_conv_params *p = &a->p.conv;
    if (x->shape.ndim != 4 || w->shape.ndim != 4 || p->stride_h <= 0 || p->stride_w <= 0 || p->pad_h < 0 ||
        p->pad_w < 0)
        return 0;
    const int64_t *xd = x->shape.dim, *wd = w->shape.dim;
    *g = (conv_dims){xd[0], xd[1], xd[2], xd[3], wd[0], wd[2], wd[3], 0, 0, 0, 0,
                     p->stride_h, p->stride_w, p->pad_h, p->pad_w};
    if (g->kh < 1 || g->kw < 1 || g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw) return 0;
    g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
    g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    g->ckk = g->c * g->kh * g->kw;
    g->ohw = g->oh * g->ow;
    return 1;
}

static size_t conv_threads(void) { return (size_t)omp_get_max_threads(); }

size_t mr_conv2d_fwd_workspace(const mr_op_args *a) {
    conv_dims g;
    if (mr_op_is_f64(a) || !conv_dims_get(a, &a->in[0], &a->in[1], &g)) return 0;
    return conv_threads() * (size_t)(g.ckk * g.ohw) * sizeof(float);
}

size_t mr_conv2d_bwd_data_workspace(const mr_op_args *a) {
    conv_dims g;
    if (mr_op_is_f64(a) || !conv_dims_get(a, &a->out[0], &a->in[0], &g)) return 0;
    return conv_threads() * (size_t)(g.ckk * g.ohw) * sizeof(float);
}

static int64_t conv_filter_groups(const conv_dims *g) { return g->n < CONV_FILTER_GROUPS ? g->n : CONV_FILTER_GROUPS; }

size_t mr_conv2d_bwd_filter_workspace(const mr_op_args *a) {
    conv_dims g;
    if (mr_op_is_f64(a) || !conv_dims_get(a, &a->in[0], &a->out[0], &g)) return 0;
    return ((size_t)(conv_filter_groups(&g) * g.o * g.ckk) + conv_threads() * (size_t)(g.ckk * g.ohw)) *
           sizeof(float);
}

/* col buffers that fit in the workspace after `fixed` floats, at most the thread count; 0 if
 * not even one fits. */
static int conv_slots(const mr_op_args *a, const conv_dims *g, size_t fixed) {
    size_t per = (size_t)(g->ckk * g->ohw), have = a->workspace ? a->workspace_bytes / sizeof(float) : 0;
    if (per == 0) return (int)conv_threads();
    if (have < fixed + per) return 0;
    size_t s = (have - fixed) / per, t = conv_threads();
    return (int)(s < t ? s : t);
}

/* For stride 1: the output columns [lo, hi) whose input column ow - pw + j lies in the image. */
static void valid_cols(const conv_dims *g, int64_t j, int64_t *lo, int64_t *hi) {
    int64_t l = g->pw - j, h = g->w + g->pw - j;
    *lo = l < 0 ? 0 : (l > g->ow ? g->ow : l);
    *hi = h > g->ow ? g->ow : (h < *lo ? *lo : h);
}

/* col (CKK, OHW) rows of channels [c0, c1) from one image xn (C,H,W); padding reads as 0. */
static void im2col(const conv_dims *g, const float *restrict xn, float *restrict col, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; c++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
                float *restrict row = col + ((c * g->kh + i) * g->kw + j) * g->ohw;
                const float *restrict xc = xn + c * g->h * g->w;
                for (int64_t oh = 0; oh < g->oh; oh++) {
                    int64_t ih = oh * g->sh - g->ph + i;
                    float *restrict r = row + oh * g->ow;
                    if (ih < 0 || ih >= g->h) {
                        memset(r, 0, (size_t)g->ow * sizeof(float));
                        continue;
                    }
                    const float *restrict xr = xc + ih * g->w;
                    if (g->sw == 1) {
                        /* stride 1: a shifted copy of the row with zeros where it leaves the image
                         * (the per-element bounds test made im2col a fifth of a CNN step) */
                        int64_t lo, hi;
                        valid_cols(g, j, &lo, &hi);
                        if (lo > 0) memset(r, 0, (size_t)lo * sizeof(float));
                        if (hi > lo) memcpy(r + lo, xr + lo - g->pw + j, (size_t)(hi - lo) * sizeof(float));
                        if (hi < g->ow) memset(r + hi, 0, (size_t)(g->ow - hi) * sizeof(float));
                        continue;
                    }
                    for (int64_t ow = 0; ow < g->ow; ow++) {
                        int64_t iw = ow * g->sw - g->pw + j;
                        r[ow] = (iw >= 0 && iw < g->w) ? xr[iw] : 0.0f;
                    }
                }
            }
}

/* dxn (C,H,W) channels [c0, c1) := the sum of col's entries that im2col read from them. Each
 * channel only receives from its own col rows, so channel ranges never race. */
static void col2im(const conv_dims *g, const float *restrict col, float *restrict dxn, int64_t c0, int64_t c1) {
    memset(dxn + c0 * g->h * g->w, 0, (size_t)((c1 - c0) * g->h * g->w) * sizeof(float));
    for (int64_t c = c0; c < c1; c++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
                const float *restrict row = col + ((c * g->kh + i) * g->kw + j) * g->ohw;
                float *restrict dc = dxn + c * g->h * g->w;
                for (int64_t oh = 0; oh < g->oh; oh++) {
                    int64_t ih = oh * g->sh - g->ph + i;
                    if (ih < 0 || ih >= g->h) continue;
                    if (g->sw == 1) {
                        int64_t lo, hi;
                        valid_cols(g, j, &lo, &hi);
                        float *restrict d = dc + ih * g->w - g->pw + j;
                        const float *restrict s = row + oh * g->ow;
#pragma omp simd
                        for (int64_t ow = lo; ow < hi; ow++) d[ow] += s[ow];
                        continue;
                    }
                    for (int64_t ow = 0; ow < g->ow; ow++) {
                        int64_t iw = ow * g->sw - g->pw + j;
                        if (iw >= 0 && iw < g->w) dc[ih * g->w + iw] += row[oh * g->ow + ow];
                    }
                }
            }
}

static mr_status conv_f32_only(const mr_op_args *a, mr_dtype dt) {
    return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(dt));
}

static mr_status conv_no_workspace(const mr_op_args *a) {
    return mr_op_error(a, "workspace of %zu bytes is too small; HINT: allocate mr_op_workspace_bytes(args)",
                       a->workspace ? a->workspace_bytes : (size_t)0);
}

mr_status mr_conv2d_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_conv2d_fwd_ref(a);
    if (a->in[0].dtype != MR_F32) return conv_f32_only(a, a->in[0].dtype);
    conv_dims g;
    if (!conv_dims_get(a, &a->in[0], &a->in[1], &g)) return mr_op_error(a, "invalid geometry");
    int slots = conv_slots(a, &g, 0);
    if (slots < 1) return conv_no_workspace(a);
    /* x (N,C,H,W); w (O,CKK); bias (O) or NULL; y (N,O,OHW); cols: slots x (CKK,OHW) */
    const float *x = a->in[0].data, *w = a->in[1].data, *bias = a->in[2].data;
    float *y = a->out[0].data, *cols = a->workspace;
    int64_t per = g.ckk * g.ohw, work = g.o * per;
    if (g.n >= slots && slots > 1) {
#pragma omp parallel for num_threads(slots) schedule(static) if (g.n * work > CONV_PAR_MIN)
        for (int64_t n = 0; n < g.n; n++) {
            float *col = cols + (int64_t)omp_get_thread_num() * per;
            float *yn = y + n * g.o * g.ohw;
            im2col(&g, x + n * g.c * g.h * g.w, col, 0, g.c);
            mr_cpu_sgemm(0, 0, g.o, g.ohw, g.ckk, 1.0f, w, g.ckk, col, g.ohw, 0.0f, yn, g.ohw);
            for (int64_t o = 0; bias && o < g.o; o++)
                for (int64_t i = 0; i < g.ohw; i++) yn[o * g.ohw + i] += bias[o];
        }
        return MR_OK;
    }
    for (int64_t n = 0; n < g.n; n++) {
        float *yn = y + n * g.o * g.ohw;
        const float *xn = x + n * g.c * g.h * g.w;
#pragma omp parallel for schedule(static) if (per > CONV_PAR_MIN / 16)
        for (int64_t c = 0; c < g.c; c++) im2col(&g, xn, cols, c, c + 1);
        mr_cpu_sgemm(0, 0, g.o, g.ohw, g.ckk, 1.0f, w, g.ckk, cols, g.ohw, 0.0f, yn, g.ohw);
        if (!bias) continue;
#pragma omp parallel for schedule(static) if (g.o * g.ohw > CONV_PAR_MIN / 4)
        for (int64_t o = 0; o < g.o; o++)
            for (int64_t i = 0; i < g.ohw; i++) yn[o * g.ohw + i] += bias[o];
    }
    return MR_OK;
}

mr_status mr_conv2d_bwd_data_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_conv2d_bwd_data_ref(a);
    if (a->in[0].dtype != MR_F32) return conv_f32_only(a, a->in[0].dtype);
    conv_dims g;
    if (!conv_dims_get(a, &a->out[0], &a->in[0], &g)) return mr_op_error(a, "invalid geometry");
    int slots = conv_slots(a, &g, 0);
    if (slots < 1) return conv_no_workspace(a);
    /* w (O,CKK); dy (N,O,OHW); dx (N,C,H,W); cols: slots x (CKK,OHW) */
    const float *w = a->in[0].data, *dy = a->in[1].data;
    float *dx = a->out[0].data, *cols = a->workspace;
    int64_t per = g.ckk * g.ohw, work = g.o * per;
    if (g.n >= slots && slots > 1) {
#pragma omp parallel for num_threads(slots) schedule(static) if (g.n * work > CONV_PAR_MIN)
        for (int64_t n = 0; n < g.n; n++) {
            float *col = cols + (int64_t)omp_get_thread_num() * per;
            mr_cpu_sgemm(1, 0, g.ckk, g.ohw, g.o, 1.0f, w, g.ckk, dy + n * g.o * g.ohw, g.ohw, 0.0f, col, g.ohw);
            col2im(&g, col, dx + n * g.c * g.h * g.w, 0, g.c);
        }
        return MR_OK;
    }
    for (int64_t n = 0; n < g.n; n++) {
        mr_cpu_sgemm(1, 0, g.ckk, g.ohw, g.o, 1.0f, w, g.ckk, dy + n * g.o * g.ohw, g.ohw, 0.0f, cols, g.ohw);
        float *dxn = dx + n * g.c * g.h * g.w;
#pragma omp parallel for schedule(static) if (per > CONV_PAR_MIN / 16)
        for (int64_t c = 0; c < g.c; c++) col2im(&g, cols, dxn, c, c + 1);
    }
    return MR_OK;
}

mr_status mr_conv2d_bwd_filter_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_conv2d_bwd_filter_ref(a);
    if (a->in[0].dtype != MR_F32) return conv_f32_only(a, a->in[0].dtype);
    conv_dims g;
    if (!conv_dims_get(a, &a->in[0], &a->out[0], &g)) return mr_op_error(a, "invalid geometry");
    int64_t groups = conv_filter_groups(&g), wsz = g.o * g.ckk;
    int slots = conv_slots(a, &g, (size_t)(groups * wsz));
    if (slots < 1) return conv_no_workspace(a);
    /* x (N,C,H,W); dy (N,O,OHW); dw (O,CKK); dbias (O) or NULL;
     * workspace: parts (groups,O,CKK) then cols: slots x (CKK,OHW) */
    const float *x = a->in[0].data, *dy = a->in[1].data;
    float *dw = a->out[0].data, *dbias = a->out[1].data;
    float *parts = a->workspace, *cols = parts + groups * wsz;
    int64_t per = g.ckk * g.ohw, work = g.o * per;
    if (dbias) {
#pragma omp parallel for schedule(static) if (g.n * g.o * g.ohw > CONV_PAR_MIN)
        for (int64_t o = 0; o < g.o; o++) {
            float s = 0.0f;
            for (int64_t n = 0; n < g.n; n++) {
                const float *restrict d = dy + (n * g.o + o) * g.ohw;
                float sn = 0.0f;
#pragma omp simd reduction(+ : sn)
                for (int64_t i = 0; i < g.ohw; i++) sn += d[i];
                s += sn;
            }
            dbias[o] = s;
        }
    }
    if (groups == 0) {
        memset(dw, 0, (size_t)wsz * sizeof(float));
        return MR_OK;
    }
    if (groups == 1) {
        /* one image: a parallel im2col and one threaded GEMM straight into dw */
#pragma omp parallel for schedule(static) if (per > CONV_PAR_MIN / 16)
        for (int64_t c = 0; c < g.c; c++) im2col(&g, x, cols, c, c + 1);
        mr_cpu_sgemm(0, 1, g.o, g.ckk, g.ohw, 1.0f, dy, g.ohw, cols, g.ohw, 0.0f, dw, g.ckk);
        return MR_OK;
    }
    int nt = slots < groups ? slots : (int)groups;
#pragma omp parallel for num_threads(nt) schedule(static) if (g.n * work > CONV_PAR_MIN)
    for (int64_t gi = 0; gi < groups; gi++) {
        float *col = cols + (int64_t)omp_get_thread_num() * per, *part = parts + gi * wsz;
        int64_t n0 = gi * g.n / groups, n1 = (gi + 1) * g.n / groups;
        for (int64_t n = n0; n < n1; n++) {
            im2col(&g, x + n * g.c * g.h * g.w, col, 0, g.c);
            mr_cpu_sgemm(0, 1, g.o, g.ckk, g.ohw, 1.0f, dy + n * g.o * g.ohw, g.ohw, col, g.ohw, n == n0 ? 0.0f : 1.0f,
                         part, g.ckk);
        }
    }
#pragma omp parallel for schedule(static) if (groups * wsz > CONV_PAR_MIN / 4)
    for (int64_t i = 0; i < wsz; i++) {
        float s = parts[i];
        for (int64_t gi = 1; gi < groups; gi++) s += parts[gi * wsz + i];
        dw[i] = s;
    }
    return MR_OK;
}
