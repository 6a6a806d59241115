/* 2-d convolution, CPU fast path (f32; f64 runs the reference), by im2col + GEMM over batches of
 * images: CONV2D, CONV2D_BWD_DATA and CONV2D_BWD_FILTER, their workspace sizes, im2col/col2im and
 * the direct few-tap kernels. The max pool fused into them is core/cpu/conv_pool_cpu.c; the
 * geometry (mr_conv_dims) and the helpers both files use are declared in core/cpu/conv_impl.h.
 *
 * im2col lays the receptive fields of a batch of B images side by side as col (CKK, B*OHW), image
 * b in columns [b*OHW, (b+1)*OHW), so each op is one GEMM per batch:
 *   forward:     yb (O, B*OHW)         = w (O, CKK) * col, then scattered (+ bias) into y
 *   data grad:   dcol (CKK, B*OHW)     = w^T * dyb, dyb gathered from dy, then col2im into dx
 *   filter grad: dw^T (CKK, O)        += col * dyb^T
 * One GEMM per image (64 x 196 x 288 for the CNN's second layer) ran at a third of the GEMM's
 * speed: its 196 columns fill 7 panels of 32 to 88%, w was packed again for every image, and
 * im2col/col2im moved 14-float rows with memcpy calls. The batch size (mr_cpu_conv_batch) depends
 * on the geometry alone: a few hundred columns, with col small enough to stay in L2 (2 and 4
 * images of the CNN's second layer measured alike, 8 and 16 slower). yb and dyb live next to col in the
 * workspace (the GEMM needs one row stride; y and dy hold each image's (O, OHW) block apart).
 * On AVX-512 CPUs stride-1 im2col/col2im rows are masked vector loads and stores, and the forward
 * and the filter gradient with few taps (CKK <= CONV_DIRECT_TAPS, the first layer's 9) run
 * directly, without GEMM (fwd_direct_rows, filter_direct).
 * Threads: with at least two batches, batches are spread over threads and each GEMM runs
 * single-threaded inside the parallel region (mr_cpu_sgemm's rule); otherwise (batch 1 inference)
 * the batches run one by one and the GEMM itself is threaded. Every output element is one GEMM
 * element summed in an order fixed by K, so forward and data gradient do not depend on the thread
 * count (nor on the batch size).
 * Workspace: one slot (col, and yb or dyb) per thread (omp_get_max_threads() at sizing time). The
 * filter gradient also keeps CONV_FILTER_GROUPS partial dw^T and dbias: the images are cut into
 * that many fixed groups (never by thread), each group summed batch by batch (batches of
 * mr_cpu_conv_batch images from the group's start) into its own partial and the partials added in
 * group order, so dw and dbias do not depend on the thread count and need no atomics.
 * Mixed precision (p.conv.bf16, issue 19: w bf16; x and dy f32 or bf16; y, dx, dw, dbias f32):
 * the same steps with col and dyb in bf16 (half the bytes moved) and the GEMMs by
 * mr_cpu_gemm_bf16 (gemm_bf16_amx.c / gemm_bf16_avx512.c: AMX or vdpbf16ps where the CPU has
 * them, f32 widening elsewhere); dcol, yb and the partials stay f32. An f32 x or dy is rounded to
 * bf16 (nearest even, mr_f32_to_bf16's bits) by im2col and by the dy copy, which run anyway: the
 * graph needs no cast pass over the activations (on the CNN those casts cost more than the bf16
 * GEMMs saved). The direct forward rounds or widens x as it loads it (products exact, sums f32).
 * The 2x2 max pool (issue 19): CONV2D_MAXPOOL (core/cpu/conv_pool_cpu.c) pools this forward's
 * output from a per-thread stage; the backward ops here with p.conv.pool scatter the pooled dy at
 * the argmax (mr_cpu_conv_pool_scatter, conv_pool_cpu.c) where they copy dy anyway (batch_copy,
 * and a scratch for filter_direct), so neither the conv output nor its full-size gradient is
 * stored. Same bits as the unfused ops (core/ops.h). */
#include "core/cpu/conv_impl.h"
#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"
#include "core/ops_impl.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_max_threads(void) { return 1; }
static int omp_get_thread_num(void) { return 0; }
#endif

/* Fixed image groups of the filter gradient (bounds its parallelism and its partial buffers). */
#define CONV_FILTER_GROUPS 16
/* A batch aims at this many GEMM columns (B*OHW) ... */
#define CONV_BATCH_COLS 768
/* ... with its col (CKK, B*OHW) at most this many floats (1 MiB: half an L2). */
#define CONV_BATCH_FLOATS (1 << 18)

/* Geometry from x (N,C,H,W) and w (O,C,KH,KW); 0 when the views cannot describe a convolution
 * (the workspace query runs before the check, so it must not trust the args). */
int mr_cpu_conv_dims_get(const mr_op_args *a, const mr_view *x, const mr_view *w, mr_conv_dims *g) {
    const mr_conv_params *p = &a->p.conv;
    if (x->shape.ndim != 4 || w->shape.ndim != 4 || p->stride_h <= 0 || p->stride_w <= 0 || p->pad_h < 0 ||
        p->pad_w < 0)
        return 0;
    const int64_t *xd = x->shape.dim, *wd = w->shape.dim;
    *g = (mr_conv_dims){xd[0], xd[1], xd[2], xd[3], wd[0], wd[2], wd[3], 0, 0, 0, 0,
                     p->stride_h, p->stride_w, p->pad_h, p->pad_w, 0, 0, 4, 4, 4, 0, 0, 0, 0};
    g->bf16 = p->bf16 != 0;
    g->es = g->bf16 ? 2 : 4;
    g->xes = x->dtype == MR_BF16 ? 2 : 4;
    int fwd = a->op == MR_OP_CONV2D || a->op == MR_OP_CONV2D_MAXPOOL;
    g->dyes = !fwd && a->in[1].dtype == MR_BF16 ? 2 : 4;
    g->relu = fwd && p->relu;
    g->pool = !fwd && p->pool;
    g->filter = a->op == MR_OP_CONV2D_BWD_FILTER;
    if (g->kh < 1 || g->kw < 1 || g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw) return 0;
    g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
    g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    g->ckk = g->c * g->kh * g->kw;
    g->ohw = g->oh * g->ow;
    g->dyhw = g->pool ? (g->oh / 2) * (g->ow / 2) : g->ohw;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    const mr_cpu_caps *caps = mr_cpu_caps_get();
    g->avx512 = g->sw == 1 && caps->avx512f && caps->avx512bw && caps->avx512vl;
#endif
    return 1;
}

size_t mr_cpu_conv_threads(void) { return (size_t)omp_get_max_threads(); }

/* Images per GEMM, from the geometry alone (the filter gradient's sums depend on it): enough for
 * CONV_BATCH_COLS columns, fewer if col would pass CONV_BATCH_FLOATS, at least 1, at most N. */
int64_t mr_cpu_conv_batch(const mr_conv_dims *g) {
    int64_t b = g->ohw > 0 ? (CONV_BATCH_COLS + g->ohw - 1) / g->ohw : 1;
    int64_t per = g->ckk * g->ohw;
    if (per > 0 && b * per > CONV_BATCH_FLOATS) b = CONV_BATCH_FLOATS / per;
    if (b > g->n) b = g->n;
    return b < 1 ? 1 : b;
}

/* Floats of one thread's slot: col (CKK, B*OHW) and yb or dyb (O, B*OHW); a batch of one image
 * needs no yb or dyb (the GEMM reads dy and writes y in place) unless dy is rounded to bf16 into
 * dyb (mixed precision; bf16 col and dyb fill half their share) or scattered there (p.conv.pool). */
size_t mr_cpu_conv_slot_floats(const mr_conv_dims *g) {
    int64_t b = mr_cpu_conv_batch(g);
    return (size_t)(b * g->ohw * (g->ckk + (b > 1 || g->bf16 || g->pool ? g->o : 0)));
}

/* Few taps: the forward (fwd_direct_rows, without workspace) and the filter gradient
 * (filter_direct) run directly. */
int mr_cpu_conv_fwd_direct(const mr_conv_dims *g) { return g->avx512 && g->ckk <= CONV_DIRECT_TAPS; }

size_t mr_conv2d_fwd_workspace(const mr_op_args *a) {
    mr_conv_dims g;
    if (mr_op_is_f64(a) || !mr_cpu_conv_dims_get(a, &a->in[0], &a->in[1], &g)) return 0;
    /* the direct forward of bf16 inputs reads w widened to f32 (O, CKK) */
    if (mr_cpu_conv_fwd_direct(&g)) return g.bf16 ? (size_t)(g.o * g.ckk) * sizeof(float) : 0;
    return mr_cpu_conv_threads() * mr_cpu_conv_slot_floats(&g) * sizeof(float);
}

size_t mr_conv2d_bwd_data_workspace(const mr_op_args *a) {
    mr_conv_dims g;
    if (mr_op_is_f64(a) || !mr_cpu_conv_dims_get(a, &a->out[0], &a->in[0], &g)) return 0;
    return mr_cpu_conv_threads() * mr_cpu_conv_slot_floats(&g) * sizeof(float);
}

static int64_t conv_filter_groups(const mr_conv_dims *g) {
    return g->n < CONV_FILTER_GROUPS ? g->n : CONV_FILTER_GROUPS;
}

/* The direct filter gradient of pooled dy (p.conv.pool) reads dy scattered to full size: room for
 * the largest filter group's images (in dy's dtype, counted in floats) after the slot. */
static int64_t conv_pool_dy_floats(const mr_conv_dims *g) {
    if (!g->pool || !g->filter || !mr_cpu_conv_fwd_direct(g) || g->n < 1) return 0;
    int64_t groups = conv_filter_groups(g);
    return (g->n + groups - 1) / groups * g->o * g->ohw;
}

/* One thread's floats: the slot and, for that gradient, the scattered dy. */
static size_t conv_slot_total(const mr_conv_dims *g) {
    return mr_cpu_conv_slot_floats(g) + (size_t)conv_pool_dy_floats(g);
}

size_t mr_conv2d_bwd_filter_workspace(const mr_op_args *a) {
    mr_conv_dims g;
    if (mr_op_is_f64(a) || !mr_cpu_conv_dims_get(a, &a->in[0], &a->out[0], &g)) return 0;
    return ((size_t)(conv_filter_groups(&g) * g.o * (g.ckk + 1)) + mr_cpu_conv_threads() * conv_slot_total(&g)) *
           sizeof(float);
}

/* Slots that fit in the workspace after `fixed` floats, at most the thread count; 0 if not even
 * one fits. */
static int conv_slots(const mr_op_args *a, const mr_conv_dims *g, size_t fixed) {
    size_t per = conv_slot_total(g), have = a->workspace ? a->workspace_bytes / sizeof(float) : 0;
    if (per == 0) return (int)mr_cpu_conv_threads();
    if (have < fixed + per) return 0;
    size_t s = (have - fixed) / per, t = mr_cpu_conv_threads();
    return (int)(s < t ? s : t);
}

/* For stride 1: the output columns [lo, hi) whose input column ow - pw + j lies in the image. */
static void valid_cols(const mr_conv_dims *g, int64_t j, int64_t *lo, int64_t *hi) {
    int64_t l = g->pw - j, h = g->w + g->pw - j;
    *lo = l < 0 ? 0 : (l > g->ow ? g->ow : l);
    *hi = h > g->ow ? g->ow : (h < *lo ? *lo : h);
}

#ifdef CONV_AVX512

/* Lanes [lo, hi) of 16 (clamped). */
static inline __mmask16 lane_mask(int64_t lo, int64_t hi) {
    lo = lo < 0 ? 0 : (lo > 16 ? 16 : lo);
    hi = hi < lo ? lo : (hi > 16 ? 16 : hi);
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* im2col for stride 1: each output row is r[0, OW) := xs[ow] on [lo, hi), 0 elsewhere, as one
 * masked load and store per 16 columns, masks hoisted out of the row loop (the 14-float rows of
 * the CNN made memcpy calls and loop tails cost more than the copy; building 16-column chunks of
 * the batch row in registers from several rows measured slower still); xs is only read on
 * [lo, hi). */
CONV_AVX512 static void im2col_s1_avx512(const mr_conv_dims *g, const float *restrict xc, float *restrict col,
                                         int64_t ld, int64_t c) {
    const int64_t kh = g->kh, kw = g->kw, oh_n = g->oh, ow_n = g->ow, h = g->h, w = g->w, sh = g->sh, ph = g->ph;
    for (int64_t i = 0; i < kh; i++)
        for (int64_t j = 0; j < kw; j++) {
            float *restrict row = col + ((c * kh + i) * kw + j) * ld;
            int64_t lo, hi;
            valid_cols(g, j, &lo, &hi);
            const float *xj = xc - g->pw + j;
            for (int64_t k = 0; k < ow_n; k += 16) {
                __mmask16 lm = lane_mask(lo - k, hi - k), sm = lane_mask(0, ow_n - k);
                for (int64_t oh = 0; oh < oh_n; oh++) {
                    int64_t ih = oh * sh - ph + i;
                    __m512 v = ih >= 0 && ih < h ? _mm512_maskz_loadu_ps(lm, xj + ih * w + k) : _mm512_setzero_ps();
                    _mm512_mask_storeu_ps(row + oh * ow_n + k, sm, v);
                }
            }
        }
}

/* 16 f32 rounded to bf16 (nearest even, NaN quieted: mr_f32_to_bf16's bits), in the low halves
 * of 32-bit lanes. */
CONV_AVX512 static inline __m512i round_bf16_epi32(__m512 v) {
    __m512i u = _mm512_castps_si512(v), one = _mm512_set1_epi32(1);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

/* 16 bf16 (lanes of m; 0 elsewhere) from f32 (rounded, xf32) or bf16 (as is). */
CONV_AVX512 static inline __m256i load_as_bf16(__mmask16 m, const void *p, int xf32) {
    if (xf32) return _mm512_cvtepi32_epi16(round_bf16_epi32(_mm512_maskz_loadu_ps(m, p)));
    return _mm256_maskz_loadu_epi16(m, p);
}

/* im2col_s1_avx512 into a bf16 col from bf16 x or (xf32) f32 x rounded: the same masks on 16
 * halves (256-bit stores). */
CONV_AVX512 static void im2col_s1_bf16_avx512(const mr_conv_dims *g, const void *restrict xc, uint16_t *restrict col,
                                              int64_t ld, int64_t c, int xf32) {
    const int64_t kh = g->kh, kw = g->kw, oh_n = g->oh, ow_n = g->ow, h = g->h, w = g->w, sh = g->sh, ph = g->ph;
    for (int64_t i = 0; i < kh; i++)
        for (int64_t j = 0; j < kw; j++) {
            uint16_t *restrict row = col + ((c * kh + i) * kw + j) * ld;
            int64_t lo, hi;
            valid_cols(g, j, &lo, &hi);
            const char *xj = (const char *)xc + (j - g->pw) * (xf32 ? 4 : 2);
            for (int64_t k = 0; k < ow_n; k += 16) {
                __mmask16 lm = lane_mask(lo - k, hi - k), sm = lane_mask(0, ow_n - k);
                for (int64_t oh = 0; oh < oh_n; oh++) {
                    int64_t ih = oh * sh - ph + i;
                    __m256i v = ih >= 0 && ih < h ? load_as_bf16(lm, xj + (ih * w + k) * (xf32 ? 4 : 2), xf32)
                                                  : _mm256_setzero_si256();
                    _mm256_mask_storeu_epi16(row + oh * ow_n + k, sm, v);
                }
            }
        }
}

/* 16 bf16 (lanes of m; 0 elsewhere) widened exactly to f32. */
CONV_AVX512 static inline __m512 load_bf16_ps(__mmask16 m, const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* col2im for stride 1 (columns; any row stride): each row of dc (H, W) is summed in registers from
 * the KH*KW col rows that read it, 16 columns at a time, and stored once (adding into dc row by
 * row made each masked load wait on the masked store just before it: no store forwarding). */
CONV_AVX512 static void col2im_s1_avx512(const mr_conv_dims *g, const float *restrict col, int64_t ld,
                                         float *restrict dc, int64_t c) {
    const int64_t kh = g->kh, kw = g->kw, oh_n = g->oh, ow_n = g->ow, h = g->h, w = g->w, sh = g->sh, ph = g->ph,
                  pw = g->pw;
    const float *cc = col + c * kh * kw * ld;
    for (int64_t ih = 0; ih < h; ih++)
        for (int64_t k = 0; k < w; k += 16) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = 0; i < kh; i++) {
                int64_t t = ih + ph - i, oh = t; /* t = oh * sh */
                if (t < 0) continue;
                if (sh != 1) {
                    if (t % sh != 0) continue;
                    oh = t / sh;
                }
                if (oh >= oh_n) continue;
                const float *ri = cc + i * kw * ld + oh * ow_n;
                for (int64_t j = 0; j < kw; j++) {
                    /* dc column iw = k + lane takes output column iw + pw - j */
                    int64_t off = k + pw - j;
                    __mmask16 m = lane_mask(-off, ow_n - off) & lane_mask(0, w - k);
                    acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, ri + j * ld + off));
                }
            }
            _mm512_mask_storeu_ps(dc + ih * w + k, lane_mask(0, w - k), acc);
        }
}

/* Few taps (CKK <= CONV_DIRECT_TAPS, stride 1 along w): the forward without im2col or GEMM. For
 * one output row and 16 columns the CKK shifted input vectors stay in registers and each output
 * channel is CKK FMAs on them in tap order, bias after (as the GEMM path sums), one thread per
 * element. A GEMM with K = 9 (the CNN's first layer) spent its time packing and storing C. */
void mr_cpu_conv_taps_get(const mr_conv_dims *g, mr_conv_taps *tp) {
    for (int64_t t = 0; t < g->ckk; t++) {
        int64_t c = t / (g->kh * g->kw), i = t / g->kw % g->kh, j = t % g->kw;
        tp->off[t] = c * g->h * g->w - g->pw + j;
        tp->i[t] = i;
        valid_cols(g, j, &tp->lo[t], &tp->hi[t]);
    }
}

/* y rows [oh0, oh1) of one image: xn (C,H,W) f32 (xmode 0), bf16 widened exactly as loaded
 * (xmode 1) or f32 rounded to bf16 as loaded (xmode 2: mixed precision; the products stay exact,
 * as vdpbf16ps's), w (O,T) f32, bias (O) or NULL, yn (O,OHW). T == CKK and xmode are constants
 * where the caller inlines them. */
CONV_AVX512 static inline void fwd_direct_rows(const mr_conv_dims *g, const mr_conv_taps *tp, const void *xn,
                                               const float *w, const float *bias, float *yn, int64_t oh0, int64_t oh1,
                                               const int64_t T, const int xmode) {
    const int64_t h = g->h, wd = g->w, ow_n = g->ow, ohw = g->ohw, O = g->o;
    for (int64_t k = 0; k < ow_n; k += 16) {
        __mmask16 m[CONV_DIRECT_TAPS], sm = lane_mask(0, ow_n - k);
        for (int64_t t = 0; t < T; t++) m[t] = lane_mask(tp->lo[t] - k, tp->hi[t] - k);
        for (int64_t oh = oh0; oh < oh1; oh++) {
            __m512 xv[CONV_DIRECT_TAPS];
            for (int64_t t = 0; t < T; t++) {
                int64_t ih = oh * g->sh - g->ph + tp->i[t];
                int64_t at = tp->off[t] + ih * wd + k;
                if (!(ih >= 0 && ih < h))
                    xv[t] = _mm512_setzero_ps();
                else if (xmode == 1)
                    xv[t] = load_bf16_ps(m[t], (const uint16_t *)xn + at);
                else if (xmode == 2)
                    xv[t] = _mm512_castsi512_ps(
                        _mm512_slli_epi32(round_bf16_epi32(_mm512_maskz_loadu_ps(m[t], (const float *)xn + at)), 16));
                else
                    xv[t] = _mm512_maskz_loadu_ps(m[t], (const float *)xn + at);
            }
            float *yk = yn + oh * ow_n + k;
            for (int64_t o = 0; o < O; o++) {
                const float *wo = w + o * T;
                __m512 acc = _mm512_mul_ps(_mm512_set1_ps(wo[0]), xv[0]);
                for (int64_t t = 1; t < T; t++) acc = _mm512_fmadd_ps(_mm512_set1_ps(wo[t]), xv[t], acc);
                if (bias) acc = _mm512_add_ps(acc, _mm512_set1_ps(bias[o]));
                if (g->relu) acc = _mm512_max_ps(acc, _mm512_setzero_ps()); /* NaN, -0 -> 0: mr_relu_f32 */
                _mm512_mask_storeu_ps(yk + o * ohw, sm, acc);
            }
        }
    }
}

CONV_AVX512 void mr_cpu_conv_fwd_direct_rows(const mr_conv_dims *g, const mr_conv_taps *tp, const void *xn,
                                             const float *w, const float *bias, float *yn, int64_t oh0, int64_t oh1) {
    if (g->xes == 2) {
        fwd_direct_rows(g, tp, xn, w, bias, yn, oh0, oh1, g->ckk, 1);
    } else if (g->bf16) {
        if (g->ckk == 9)
            fwd_direct_rows(g, tp, xn, w, bias, yn, oh0, oh1, 9, 2);
        else
            fwd_direct_rows(g, tp, xn, w, bias, yn, oh0, oh1, g->ckk, 2);
    } else if (g->ckk == 9) {
        fwd_direct_rows(g, tp, xn, w, bias, yn, oh0, oh1, 9, 0);
    } else {
        fwd_direct_rows(g, tp, xn, w, bias, yn, oh0, oh1, g->ckk, 0);
    }
}

/* 16 values of a tensor input (lanes of m; 0 elsewhere) at element i of p as f32: f32 (mode 0),
 * bf16 widened (1) or f32 rounded to bf16 (2: mixed precision). */
CONV_AVX512 static inline __m512 load_mode(__mmask16 m, const void *p, int64_t i, int mode) {
    if (mode == 1) return load_bf16_ps(m, (const uint16_t *)p + i);
    __m512 v = _mm512_maskz_loadu_ps(m, (const float *)p + i);
    return mode == 2 ? _mm512_castsi512_ps(_mm512_slli_epi32(round_bf16_epi32(v), 16)) : v;
}

/* Few taps (as the direct forward): the filter gradient of images [n0, n1) without im2col or
 * GEMM. part (CKK, O) := dw^T and pbias (O), if not NULL, := the sums of dy. Two output channels
 * at a time keep 2*T accumulators of 16 lanes over every (image, row, 16 columns) of the range,
 * each adding dy times the T shifted input vectors (rows outside the image skipped, columns by
 * the masks), then each accumulator's lanes are added in _mm512_reduce_add_ps's fixed order: the
 * sums depend on the range alone, never on threads. The im2col GEMM with M = CKK = 9 (the CNN's
 * first layer) spent its time writing col and copying dy, and in bf16 on 9-row tiles. */
/* x and dy point at image n0 (elements of xes and dy's bytes). */
CONV_AVX512 static inline void filter_direct(const mr_conv_dims *g, const mr_conv_taps *tp, const void *x, int64_t xes,
                                             const void *dy, int64_t n0, int64_t n1, float *part, float *pbias,
                                             const int64_t T, const int xmode, const int dymode) {
    const int64_t O = g->o, ow_n = g->ow, oh_n = g->oh, ohw = g->ohw, h = g->h, wd = g->w, chw = g->c * g->h * g->w;
    for (int64_t o0 = 0; o0 < O; o0 += 2) {
        const int two = o0 + 1 < O;
        __m512 a0[CONV_DIRECT_TAPS], a1[CONV_DIRECT_TAPS], b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
        for (int64_t t = 0; t < T; t++) a0[t] = a1[t] = _mm512_setzero_ps();
        for (int64_t n = n0; n < n1; n++) {
            const char *xn = (const char *)x + (n - n0) * chw * xes;
            const int64_t d0i = ((n - n0) * O + o0) * ohw;
            for (int64_t k = 0; k < ow_n; k += 16) {
                __mmask16 m[CONV_DIRECT_TAPS], sm = lane_mask(0, ow_n - k);
                for (int64_t t = 0; t < T; t++) m[t] = lane_mask(tp->lo[t] - k, tp->hi[t] - k);
                for (int64_t oh = 0; oh < oh_n; oh++) {
                    int64_t at = d0i + oh * ow_n + k;
                    __m512 d0 = load_mode(sm, dy, at, dymode);
                    __m512 d1 = two ? load_mode(sm, dy, at + ohw, dymode) : _mm512_setzero_ps();
                    b0 = _mm512_add_ps(b0, d0);
                    b1 = _mm512_add_ps(b1, d1);
                    for (int64_t t = 0; t < T; t++) {
                        int64_t ih = oh * g->sh - g->ph + tp->i[t];
                        if (ih < 0 || ih >= h) continue;
                        __m512 xv = load_mode(m[t], xn, tp->off[t] + ih * wd + k, xmode);
                        a0[t] = _mm512_fmadd_ps(d0, xv, a0[t]);
                        a1[t] = _mm512_fmadd_ps(d1, xv, a1[t]);
                    }
                }
            }
        }
        for (int64_t t = 0; t < T; t++) {
            part[t * O + o0] = _mm512_reduce_add_ps(a0[t]);
            if (two) part[t * O + o0 + 1] = _mm512_reduce_add_ps(a1[t]);
        }
        if (pbias) {
            pbias[o0] = _mm512_reduce_add_ps(b0);
            if (two) pbias[o0 + 1] = _mm512_reduce_add_ps(b1);
        }
    }
}

/* filter_direct for images [n0, n1) of x (N,C,H,W) and dy (at image n0). An f32 x of mixed precision is
 * rounded to bf16 once into the thread's scratch (`scratch_floats` floats; each x vector is
 * otherwise rounded again for every pair of output channels, which made the bf16 gradient twice
 * as slow as the f32 one) when it fits, else as loaded. */
CONV_AVX512 static void filter_direct_any(const mr_conv_dims *g, const void *x, const void *dy, int64_t n0, int64_t n1,
                                          float *part, float *pbias, float *scratch, int64_t scratch_floats) {
    mr_conv_taps tp;
    mr_cpu_conv_taps_get(g, &tp);
    int64_t chw = g->c * g->h * g->w, xes = g->xes, len = (n1 - n0) * chw;
    const char *xs = (const char *)x + n0 * chw * xes;
    int xmode = xes == 2 ? 1 : g->bf16 ? 2 : 0, dymode = g->dyes == 2 ? 1 : g->bf16 ? 2 : 0;
    if (xmode == 2 && len <= scratch_floats) {
        const float *xf = (const float *)xs;
        for (int64_t i = 0; i < len; i += 16) {
            __mmask16 m = lane_mask(0, len - i);
            __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(round_bf16_epi32(_mm512_maskz_loadu_ps(m, xf + i)), 16));
            _mm512_mask_storeu_ps(scratch + i, m, v);
        }
        xs = (const char *)scratch;
        xmode = 0;
    }
    if (g->ckk == 9 && xmode == 0 && dymode == 0)
        filter_direct(g, &tp, xs, xes, dy, n0, n1, part, pbias, 9, 0, 0);
    else if (g->ckk == 9 && xmode == 0 && dymode == 2)
        filter_direct(g, &tp, xs, xes, dy, n0, n1, part, pbias, 9, 0, 2);
    else
        filter_direct(g, &tp, xs, xes, dy, n0, n1, part, pbias, g->ckk, xmode, dymode);
}

#endif

/* d[0, n) (dst_es bytes each) := s[0, n) (src_es bytes each): a copy, or f32 rounded to bf16. */
static void copy_elems(void *restrict d, int64_t dst_es, const void *restrict s, int64_t src_es, int64_t n) {
    if (dst_es == src_es) {
        memcpy(d, s, (size_t)(n * dst_es));
        return;
    }
    const float *restrict f = s;
    uint16_t *restrict h = d;
    for (int64_t i = 0; i < n; i++) h[i] = mr_f32_to_bf16(f[i]);
}

/* The rows of channel c of col (CKK, ld), columns [0, OHW), from one image xn (C,H,W); padding
 * reads as 0. col's elements have g->es bytes (f32, or bf16 whose zero is also all-zero bits),
 * x's g->xes (an f32 x into a bf16 col is rounded). */
static void im2col(const mr_conv_dims *g, const void *restrict xn, void *restrict col, int64_t ld, int64_t c) {
    const int64_t es = g->es, xes = g->xes;
    const char *restrict xc = (const char *)xn + c * g->h * g->w * xes;
#ifdef CONV_AVX512
    if (g->avx512) {
        if (g->bf16)
            im2col_s1_bf16_avx512(g, xc, col, ld, c, xes == 4);
        else
            im2col_s1_avx512(g, (const float *)xc, col, ld, c);
        return;
    }
#endif
    for (int64_t i = 0; i < g->kh; i++)
        for (int64_t j = 0; j < g->kw; j++) {
            char *restrict row = (char *)col + ((c * g->kh + i) * g->kw + j) * ld * es;
            int64_t lo = 0, hi = 0;
            if (g->sw == 1) valid_cols(g, j, &lo, &hi);
            for (int64_t oh = 0; oh < g->oh; oh++) {
                int64_t ih = oh * g->sh - g->ph + i;
                char *restrict r = row + oh * g->ow * es;
                if (ih < 0 || ih >= g->h) {
                    memset(r, 0, (size_t)(g->ow * es));
                    continue;
                }
                const char *restrict xr = xc + ih * g->w * xes;
                if (g->sw == 1) {
                    /* stride 1: a shifted copy of the row with zeros where it leaves the image
                     * (the per-element bounds test made im2col a fifth of a CNN step) */
                    if (lo > 0) memset(r, 0, (size_t)(lo * es));
                    if (hi > lo) copy_elems(r + lo * es, es, xr + (lo - g->pw + j) * xes, xes, hi - lo);
                    if (hi < g->ow) memset(r + hi * es, 0, (size_t)((g->ow - hi) * es));
                    continue;
                }
                for (int64_t ow = 0; ow < g->ow; ow++) {
                    int64_t iw = ow * g->sw - g->pw + j;
                    if (iw >= 0 && iw < g->w)
                        copy_elems(r + ow * es, es, xr + iw * xes, xes, 1);
                    else
                        memset(r + ow * es, 0, (size_t)es);
                }
            }
        }
}

/* dxn (C,H,W) channel c := the sum of the entries of col (CKK, ld), columns [0, OHW), that im2col
 * read from it. Each channel only receives from its own col rows, so channels never race. */
static void col2im(const mr_conv_dims *g, const float *restrict col, int64_t ld, float *restrict dxn, int64_t c) {
    float *restrict dc = dxn + c * g->h * g->w;
#ifdef CONV_AVX512
    if (g->avx512) {
        col2im_s1_avx512(g, col, ld, dc, c);
        return;
    }
#endif
    memset(dc, 0, (size_t)(g->h * g->w) * sizeof(float));
    for (int64_t i = 0; i < g->kh; i++)
        for (int64_t j = 0; j < g->kw; j++) {
            const float *restrict row = col + ((c * g->kh + i) * g->kw + j) * ld;
            int64_t lo = 0, hi = 0;
            if (g->sw == 1) valid_cols(g, j, &lo, &hi);
            for (int64_t oh = 0; oh < g->oh; oh++) {
                int64_t ih = oh * g->sh - g->ph + i;
                if (ih < 0 || ih >= g->h) continue;
                if (g->sw == 1) {
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

/* col (CKK, nb*OHW) := im2col of images xb (nb,C,H,W); `par`: spread (image, channel) pairs over
 * threads (called outside any parallel region). */
static void im2col_batch(const mr_conv_dims *g, const void *xb, int64_t nb, void *col, int par) {
    int64_t ld = nb * g->ohw, units = nb * g->c;
#pragma omp parallel for schedule(static) if (par && units > 1)
    for (int64_t u = 0; u < units; u++) {
        int64_t b = u / g->c, c = u % g->c;
        im2col(g, (const char *)xb + b * g->c * g->h * g->w * g->xes, (char *)col + b * g->ohw * g->es, ld, c);
    }
}

/* d[0, n) := s[0, n), plus *add if not NULL, then max(., 0) when relu (16 at a time: the
 * compiler's SSE loop took ~8% of the CNN's second-layer forward). */
#ifdef CONV_AVX512
/* d may equal s (in place); no restrict. */
CONV_AVX512 static void row_copy_avx512(float *d, const float *s, int64_t n, const float *add, int relu) {
    __m512 va = _mm512_set1_ps(add ? *add : 0.0f), z = _mm512_setzero_ps();
    int64_t i = 0;
    if (relu) {
        /* max_ps(v, 0) gives 0 for NaN and -0, as v > 0 ? v : 0 (core/math: mr_relu_f32) */
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, _mm512_max_ps(_mm512_add_ps(_mm512_loadu_ps(s + i), va), z));
    } else if (add) {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(s + i), va));
    } else {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, _mm512_loadu_ps(s + i));
    }
    if (i < n) {
        __mmask16 m = lane_mask(0, n - i);
        __m512 v = _mm512_maskz_loadu_ps(m, s + i);
        v = add ? _mm512_add_ps(v, va) : v;
        _mm512_mask_storeu_ps(d + i, m, relu ? _mm512_max_ps(v, z) : v);
    }
}
#endif

static void row_copy(const mr_conv_dims *g, float *d, const float *s, int64_t n, const float *add, int relu) {
#ifdef CONV_AVX512
    if (g->avx512) {
        row_copy_avx512(d, s, n, add, relu);
        return;
    }
#endif
    (void)g;
    if (relu) {
        float b = add ? *add : 0.0f;
        for (int64_t i = 0; i < n; i++) {
            float v = add ? s[i] + b : s[i];
            d[i] = v > 0.0f ? v : 0.0f;
        }
    } else if (add)
        for (int64_t i = 0; i < n; i++) d[i] = s[i] + *add;
    else
        memcpy(d, s, (size_t)n * sizeof(float));
}

#ifdef CONV_AVX512
/* d[0, n) := s[0, n) rounded to bf16, 16 at a time. */
CONV_AVX512 void mr_cpu_conv_row_round_avx512(uint16_t *restrict d, const float *restrict s, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = lane_mask(0, n - i);
        _mm256_mask_storeu_epi16(d + i, m, load_as_bf16(m, s + i, 1));
    }
}
#endif

/* dst (nb,O,OHW) := src (O, nb*OHW) image by image, plus bias (O) if not NULL (f32: the GEMM's
 * output); or the reverse (to_batch: dy src (nb,O,OHW), g->dyes bytes an element, into dyb dst
 * (O, nb*OHW), g->es bytes an element: an f32 dy is rounded to a bf16 dyb in mixed precision; with
 * p.conv.pool src is pooled (nb,O,dyhw) and scattered at am (nb,O,dyhw)). Returns 0 on a bad argmax. */
static int batch_copy(const mr_conv_dims *g, int64_t nb, const void *src, void *dst, const float *bias, int to_batch,
                      const int32_t *am, int par) {
    int64_t ld = nb * g->ohw, units = nb * g->o, ses = to_batch ? g->dyes : 4, des = to_batch ? g->es : 4;
    int ok = 1;
#pragma omp parallel for schedule(static) reduction(&& : ok) if (par && units * g->ohw > CONV_PAR_MIN / 4)
    for (int64_t u = 0; u < units; u++) {
        int64_t b = u / g->o, o = u % g->o;
        const char *s = (const char *)src + (to_batch ? u * g->dyhw : o * ld + b * g->ohw) * ses;
        char *d = (char *)dst + (to_batch ? o * ld + b * g->ohw : u * g->ohw) * des;
        if (to_batch && g->pool) {
            ok = mr_cpu_conv_pool_scatter(g, d, des, s, ses, am + u * g->dyhw) && ok;
            continue;
        }
        if (des == 4) {
            row_copy(g, (float *)d, (const float *)s, g->ohw, bias ? bias + o : NULL, !to_batch && g->relu);
            continue;
        }
#ifdef CONV_AVX512
        if (g->avx512 && ses == 4) {
            mr_cpu_conv_row_round_avx512((uint16_t *)d, (const float *)s, g->ohw);
            continue;
        }
#endif
        copy_elems(d, des, s, ses, g->ohw);
    }
    return ok;
}

/* One GEMM in the conv's input type: f32, or bf16 operands with f32 C (mr_cpu_gemm_bf16:
 * vdpbf16ps where the CPU has AVX512_BF16, widened to f32 elsewhere). Returns 0 when done, 1 when
 * the bf16 GEMM ran out of memory (C untouched). */
static int conv_gemm(const mr_conv_dims *g, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
                     const void *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (!g->bf16) {
        mr_cpu_sgemm(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc);
        return 0;
    }
    return mr_cpu_gemm_bf16(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc) != MR_OK;
}

/* The bf16 GEMM's failure, restated on the calling thread (a worker's message is thread-local). */
mr_status mr_cpu_conv_gemm_failed(const mr_op_args *a) {
    return mr_set_error(MR_ERR_NOMEM, "%s: out of memory for bf16 GEMM packing buffers",
                        mr_op_get(a->op) ? mr_op_get(a->op)->name : "conv2d");
}

/* mr_cpu_conv_pool_scatter's refusal (p.conv.pool, conv_pool_cpu.c), on the calling thread. */
static mr_status conv_bad_argmax(const mr_op_args *a) {
    return mr_op_error(a, "in[2] (argmax) holds an index outside [-1, OH*OW) of the conv output's plane");
}

mr_status mr_cpu_conv_f32_only(const mr_op_args *a, mr_dtype dt) {
    return mr_op_error(a, "the CPU kernel takes f32 or f64, or bf16 inputs with f32 outputs; got %s",
                       mr_dtype_name(dt));
}

mr_status mr_cpu_conv_no_workspace(const mr_op_args *a) {
    return mr_op_error(a, "workspace of %zu bytes is too small; HINT: allocate mr_op_workspace_bytes(args)",
                       a->workspace ? a->workspace_bytes : (size_t)0);
}

/* How forward and backward-data share out the images: *nt threads over *batches batches of *bsz
 * images (fewer images per batch when that gives every thread a batch; the results do not depend
 * on it), or *nt = 1: batches of the largest size one by one, each GEMM threaded. */
void mr_cpu_conv_share(const mr_conv_dims *g, int slots, int64_t *bsz, int64_t *batches, int *nt) {
    int64_t bmax = mr_cpu_conv_batch(g), per_thread = (g->n + slots - 1) / slots;
    *bsz = bmax < per_thread ? bmax : per_thread;
    *batches = (g->n + *bsz - 1) / *bsz;
    if (slots < 2 || *batches < 2 || *batches * (*bsz * g->o * g->ckk * g->ohw) <= CONV_PAR_MIN) {
        *nt = 1;
        *bsz = bmax;
        *batches = (g->n + bmax - 1) / bmax;
    } else {
        *nt = *batches < slots ? (int)*batches : slots;
    }
}

/* y (nb,O,OHW) of images x (nb,C,H,W), with slot col (CKK, nb*OHW) and yb (O, nb*OHW). Returns
 * conv_gemm's status. */
int mr_cpu_conv_fwd_batch(const mr_conv_dims *g, const void *x, const void *w, const float *bias, float *y, int64_t nb,
                          void *col, float *yb, int par) {
    im2col_batch(g, x, nb, col, par);
    int64_t cols = nb * g->ohw;
    if (nb == 1) {
        /* one image: the GEMM writes y itself */
        if (conv_gemm(g, 0, 0, g->o, cols, g->ckk, w, g->ckk, col, cols, 0.0f, y, cols)) return 1;
        if (!bias && !g->relu) return 0;
#pragma omp parallel for schedule(static) if (par && g->o * g->ohw > CONV_PAR_MIN / 4)
        for (int64_t o = 0; o < g->o; o++) row_copy(g, y + o * g->ohw, y + o * g->ohw, g->ohw, bias ? bias + o : NULL, g->relu);
        return 0;
    }
    if (conv_gemm(g, 0, 0, g->o, cols, g->ckk, w, g->ckk, col, cols, 0.0f, yb, cols)) return 1;
    (void)batch_copy(g, nb, yb, y, bias, 0, NULL, par);
    return 0;
}

/* f32, or mixed precision (core/ref/conv_ref.c's rule, checked). */
int mr_cpu_conv_dtype_ok(const mr_op_args *a) {
    return (a->in[0].dtype == MR_F32 && a->in[1].dtype == MR_F32) || (a->p.conv.bf16 && a->out[0].dtype == MR_F32);
}

mr_status mr_conv2d_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_conv2d_fwd_ref(a);
    if (!mr_cpu_conv_dtype_ok(a)) return mr_cpu_conv_f32_only(a, a->in[0].dtype);
    mr_conv_dims g;
    if (!mr_cpu_conv_dims_get(a, &a->in[0], &a->in[1], &g)) return mr_op_error(a, "invalid geometry");
    /* x (N,C,H,W); w (O,CKK); bias (O) or NULL; y (N,O,OHW); slots x [col (CKK,B*OHW), yb (O,B*OHW)]
     * (x, w, col bf16 in mixed precision; col then fills half its slot) */
    const char *x = a->in[0].data;
    const void *w = a->in[1].data;
    const float *bias = a->in[2].data;
    float *y = a->out[0].data, *ws = a->workspace;
    int64_t es = g.xes;
#ifdef CONV_AVX512
    if (mr_cpu_conv_fwd_direct(&g)) {
        const float *wf = w;
        if (g.bf16) {
            /* the few weights widened once (workspace (O, CKK) f32) */
            if (!ws || a->workspace_bytes < (size_t)(g.o * g.ckk) * sizeof(float)) return mr_cpu_conv_no_workspace(a);
            for (int64_t i = 0; i < g.o * g.ckk; i++) ws[i] = mr_bf16_to_f32(((const uint16_t *)w)[i]);
            wf = ws;
        }
        mr_conv_taps tp;
        mr_cpu_conv_taps_get(&g, &tp);
        /* units of (image, 4 output rows) */
        int64_t rows = 4, per_img = (g.oh + rows - 1) / rows, units = g.n * per_img;
#pragma omp parallel for schedule(static) if (g.n * g.o * g.ckk * g.ohw > CONV_PAR_MIN)
        for (int64_t u = 0; u < units; u++) {
            int64_t n = u / per_img, oh0 = u % per_img * rows, oh1 = oh0 + rows < g.oh ? oh0 + rows : g.oh;
            mr_cpu_conv_fwd_direct_rows(&g, &tp, x + n * g.c * g.h * g.w * es, wf, bias, y + n * g.o * g.ohw, oh0, oh1);
        }
        return MR_OK;
    }
#endif
    int slots = conv_slots(a, &g, 0);
    if (slots < 1) return mr_cpu_conv_no_workspace(a);
    int64_t slot = (int64_t)mr_cpu_conv_slot_floats(&g), bsz, batches;
    int nt;
    mr_cpu_conv_share(&g, slots, &bsz, &batches, &nt);
    if (nt < 2) {
        for (int64_t n0 = 0; n0 < g.n; n0 += bsz) {
            int64_t nb = g.n - n0 < bsz ? g.n - n0 : bsz;
            if (mr_cpu_conv_fwd_batch(&g, x + n0 * g.c * g.h * g.w * es, w, bias, y + n0 * g.o * g.ohw, nb, ws,
                               ws + nb * g.ohw * g.ckk, 1))
                return mr_cpu_conv_gemm_failed(a);
        }
        return MR_OK;
    }
    int failed = 0;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t bi = 0; bi < batches; bi++) {
        float *col = ws + (int64_t)omp_get_thread_num() * slot;
        int64_t n0 = bi * bsz, nb = g.n - n0 < bsz ? g.n - n0 : bsz;
        if (mr_cpu_conv_fwd_batch(&g, x + n0 * g.c * g.h * g.w * es, w, bias, y + n0 * g.o * g.ohw, nb, col,
                           col + nb * g.ohw * g.ckk, 0)) {
#pragma omp atomic write
            failed = 1;
        }
    }
    return failed ? mr_cpu_conv_gemm_failed(a) : MR_OK;
}

/* dx (nb,C,H,W) from dy (nb,O,OHW), or pooled dy and am (nb,O,dyhw) (p.conv.pool), with slot dcol
 * (CKK, nb*OHW) f32 and dyb (O, nb*OHW) (of dy's type). Returns conv_gemm's status, or 2 on a bad
 * argmax. */
static int conv_bwd_data_batch(const mr_conv_dims *g, const void *w, const void *dy, const int32_t *am, float *dx,
                               int64_t nb, float *dcol, void *dyb, int par) {
    int64_t cols = nb * g->ohw, units = nb * g->c;
    /* one image's dy is the GEMM's operand unless rounded or scattered */
    int copy = nb > 1 || g->dyes != g->es || g->pool;
    if (copy && !batch_copy(g, nb, dy, dyb, NULL, 1, am, par)) return 2;
    if (conv_gemm(g, 1, 0, g->ckk, cols, g->o, w, g->ckk, copy ? dyb : dy, cols, 0.0f, dcol, cols)) return 1;
#pragma omp parallel for schedule(static) if (par && units > 1)
    for (int64_t u = 0; u < units; u++) {
        int64_t b = u / g->c, c = u % g->c;
        col2im(g, dcol + b * g->ohw, cols, dx + b * g->c * g->h * g->w, c);
    }
    return 0;
}

mr_status mr_conv2d_bwd_data_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_conv2d_bwd_data_ref(a);
    if (!mr_cpu_conv_dtype_ok(a)) return mr_cpu_conv_f32_only(a, a->in[0].dtype);
    mr_conv_dims g;
    if (!mr_cpu_conv_dims_get(a, &a->out[0], &a->in[0], &g)) return mr_op_error(a, "invalid geometry");
    int slots = conv_slots(a, &g, 0);
    if (slots < 1) return mr_cpu_conv_no_workspace(a);
    /* w (O,CKK); dy (N,O,OHW); dx (N,C,H,W) f32; slots x [dcol (CKK,B*OHW) f32, dyb (O,B*OHW)]
     * (w, dy, dyb bf16 in mixed precision) */
    const void *w = a->in[0].data;
    const char *dy = a->in[1].data;
    const int32_t *am = g.pool ? a->in[2].data : NULL; /* p.conv.pool: dy and am (N,O,OH/2,OW/2) */
    float *dx = a->out[0].data, *ws = a->workspace;
    int64_t slot = (int64_t)conv_slot_total(&g), bsz, batches, es = g.dyes;
    int nt;
    mr_cpu_conv_share(&g, slots, &bsz, &batches, &nt);
    if (nt < 2) {
        for (int64_t n0 = 0; n0 < g.n; n0 += bsz) {
            int64_t nb = g.n - n0 < bsz ? g.n - n0 : bsz;
            int r = conv_bwd_data_batch(&g, w, dy + n0 * g.o * g.dyhw * es, am ? am + n0 * g.o * g.dyhw : NULL,
                                        dx + n0 * g.c * g.h * g.w, nb, ws, ws + nb * g.ohw * g.ckk, 1);
            if (r) return r == 2 ? conv_bad_argmax(a) : mr_cpu_conv_gemm_failed(a);
        }
        return MR_OK;
    }
    int failed = 0;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t bi = 0; bi < batches; bi++) {
        float *dcol = ws + (int64_t)omp_get_thread_num() * slot;
        int64_t n0 = bi * bsz, nb = g.n - n0 < bsz ? g.n - n0 : bsz;
        int r = conv_bwd_data_batch(&g, w, dy + n0 * g.o * g.dyhw * es, am ? am + n0 * g.o * g.dyhw : NULL,
                                    dx + n0 * g.c * g.h * g.w, nb, dcol, dcol + nb * g.ohw * g.ckk, 0);
        if (r) {
#pragma omp atomic write
            failed = r;
        }
    }
    return failed == 2 ? conv_bad_argmax(a) : failed ? mr_cpu_conv_gemm_failed(a) : MR_OK;
}

/* part (CKK, O) := dw^T over images [n0, n1): col * dyb^T summed batch by batch (batches of
 * mr_cpu_conv_batch(g) from n0), with slot col (CKK, B*OHW) and dyb (O, B*OHW). dw^T rather than dw:
 * its O columns fill the GEMM's 32-column panels (dw's CKK = 9 columns of the CNN's first layer
 * filled one to 28%). pbias (O), if not NULL, := the sums of dy over those images, image by image
 * while the batch's dy is in cache (a pass of its own re-read dy from memory). */
/* The sum of n elements of f32 (bf == 0) or bf16 (widened exactly) dy. */
static float dy_sum(const void *d, int64_t n, int bf) {
    float s = 0.0f;
    if (bf) {
        const uint16_t *restrict h = d;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; i++) s += mr_bf16_to_f32(h[i]);
    } else {
        const float *restrict f = d;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; i++) s += f[i];
    }
    return s;
}

/* Returns conv_gemm's status. In mixed precision col and dyb are bf16 (x and dy rounded into
 * them when f32) and the bias sums read the rounded dy: dyb's row o, the batch's images in one
 * sum (part and pbias stay f32). */
static int conv_bwd_filter_range(const mr_conv_dims *g, const void *x, const void *dy, const int32_t *am, int64_t n0,
                                 int64_t n1, float *part, float *pbias, float *col, int par) {
    int64_t dyes = g->dyes;
#ifdef CONV_AVX512
    if (mr_cpu_conv_fwd_direct(g)) {
        const char *dyn = (const char *)dy + n0 * g->o * g->dyhw * dyes;
        if (g->pool) {
            /* pooled dy scattered to full size after the slot (conv_pool_dy_floats), in dy's dtype */
            char *full = (char *)(col + mr_cpu_conv_slot_floats(g));
            int ok = 1;
            for (int64_t u = 0; u < (n1 - n0) * g->o; u++)
                ok = mr_cpu_conv_pool_scatter(g, full + u * g->ohw * dyes, dyes, dyn + u * g->dyhw * dyes, dyes,
                                  am + (n0 * g->o + u) * g->dyhw) && ok;
            if (!ok) return 2;
            dyn = full;
        }
        filter_direct_any(g, x, dyn, n0, n1, part, pbias, col, (int64_t)mr_cpu_conv_slot_floats(g));
        return 0;
    }
#endif
    int64_t bsz = mr_cpu_conv_batch(g), xes = g->xes;
    for (int64_t b0 = n0; b0 < n1; b0 += bsz) {
        int64_t nb = n1 - b0 < bsz ? n1 - b0 : bsz, cols = nb * g->ohw;
        float *dyb = col + cols * g->ckk;
        const char *dyn = (const char *)dy + b0 * g->o * g->dyhw * dyes;
        /* one image's dy is the GEMM's operand unless rounded or scattered */
        int copy = nb > 1 || dyes != g->es || g->pool;
        im2col_batch(g, (const char *)x + b0 * g->c * g->h * g->w * xes, nb, col, par);
        if (copy && !batch_copy(g, nb, dyn, dyb, NULL, 1, am ? am + b0 * g->o * g->dyhw : NULL, par)) return 2;
        if (conv_gemm(g, 0, 1, g->ckk, g->o, cols, col, cols, copy ? (const void *)dyb : dyn, cols,
                      b0 == n0 ? 0.0f : 1.0f, part, g->o))
            return 1;
        if (!pbias) continue;
        int from_dyb = g->bf16 && copy;
#pragma omp parallel for schedule(static) if (par && g->o * cols > CONV_PAR_MIN)
        for (int64_t o = 0; o < g->o; o++) {
            float s = b0 == n0 ? 0.0f : pbias[o];
            if (from_dyb)
                s += dy_sum((const uint16_t *)dyb + o * cols, cols, 1);
            else if (g->pool) /* f32: image by image as from dy, from the scattered rows of dyb */
                for (int64_t b = 0; b < nb; b++) s += dy_sum(dyb + o * cols + b * g->ohw, g->ohw, 0);
            else
                for (int64_t b = 0; b < nb; b++) s += dy_sum(dyn + (b * g->o + o) * g->ohw * dyes, g->ohw, dyes == 2);
            pbias[o] = s;
        }
    }
    return 0;
}

mr_status mr_conv2d_bwd_filter_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_conv2d_bwd_filter_ref(a);
    if (!mr_cpu_conv_dtype_ok(a)) return mr_cpu_conv_f32_only(a, a->in[0].dtype);
    mr_conv_dims g;
    if (!mr_cpu_conv_dims_get(a, &a->in[0], &a->out[0], &g)) return mr_op_error(a, "invalid geometry");
    int64_t groups = conv_filter_groups(&g), wsz = g.o * g.ckk, psz = wsz + g.o;
    int slots = conv_slots(a, &g, (size_t)(groups * psz));
    if (slots < 1) return mr_cpu_conv_no_workspace(a);
    /* x (N,C,H,W); dy (N,O,OHW); dw (O,CKK); dbias (O) or NULL;
     * workspace: parts (groups, [dw^T (CKK,O), dbias (O)]) then slots x [col (CKK,B*OHW), dyb (O,B*OHW)] */
    const void *x = a->in[0].data, *dy = a->in[1].data; /* f32 or bf16 in mixed precision */
    const int32_t *am = g.pool ? a->in[2].data : NULL;  /* p.conv.pool: dy and am (N,O,OH/2,OW/2) */
    float *dw = a->out[0].data, *dbias = a->out[1].data;
    float *parts = a->workspace, *slots0 = parts + groups * psz;
    int64_t slot = (int64_t)conv_slot_total(&g), work = g.o * g.ckk * g.ohw;
    if (groups == 0) {
        memset(dw, 0, (size_t)wsz * sizeof(float));
        if (dbias) memset(dbias, 0, (size_t)g.o * sizeof(float));
        return MR_OK;
    }
    int nt = slots < groups ? slots : (int)groups;
    if (groups == 1 || nt < 2 || g.n * work <= CONV_PAR_MIN) {
        /* the groups one by one with threaded GEMMs (the same sums as below) */
        for (int64_t gi = 0; gi < groups; gi++) {
            float *part = parts + gi * psz;
            int r = conv_bwd_filter_range(&g, x, dy, am, gi * g.n / groups, (gi + 1) * g.n / groups, part,
                                          dbias ? part + wsz : NULL, slots0, 1);
            if (r) return r == 2 ? conv_bad_argmax(a) : mr_cpu_conv_gemm_failed(a);
        }
    } else {
        int failed = 0;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t gi = 0; gi < groups; gi++) {
            float *part = parts + gi * psz;
            int r = conv_bwd_filter_range(&g, x, dy, am, gi * g.n / groups, (gi + 1) * g.n / groups, part,
                                          dbias ? part + wsz : NULL, slots0 + (int64_t)omp_get_thread_num() * slot, 0);
            if (r) {
#pragma omp atomic write
                failed = r;
            }
        }
        if (failed) return failed == 2 ? conv_bad_argmax(a) : mr_cpu_conv_gemm_failed(a);
    }
    /* dw (O, CKK) := the sum of the parts (CKK, O) in group order, transposed; dbias likewise */
#pragma omp parallel for schedule(static) if (groups * wsz > CONV_PAR_MIN / 4)
    for (int64_t r = 0; r < g.ckk; r++)
        for (int64_t o = 0; o < g.o; o++) {
            float s = parts[r * g.o + o];
            for (int64_t gi = 1; gi < groups; gi++) s += parts[gi * psz + r * g.o + o];
            dw[o * g.ckk + r] = s;
        }
    for (int64_t o = 0; dbias && o < g.o; o++) {
        float s = parts[wsz + o];
        for (int64_t gi = 1; gi < groups; gi++) s += parts[gi * psz + wsz + o];
        dbias[o] = s;
    }
    return MR_OK;
}
