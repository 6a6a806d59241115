/* 2-d pooling, CPU fast paths (f32; f64 runs the reference).
 *
 * Max pooling: both directions are parallel over the N*C planes: a plane's windows only read
 * (forward) or write (backward) that plane, so the backward scatter never races and adds in window
 * order whatever the thread count. Window rules (ties, NaN, padding) are those of
 * core/ref/pool_ref.c.
 *
 * Average pooling: parallel over planes too, and vectorised along an output row: for the windows
 * that lie inside the plane horizontally, each tap of the window is one pass over the row (y[j] +=
 * x[j*stride + tap]), so every window still sums its taps in the reference's row-major order; the
 * few windows at the left and right edges are summed one by one. The backward scatters dy/(kh*kw)
 * in passes over the taps taken right to left, which adds into every dx element in increasing
 * output index, the reference's order. So the results equal the CUDA kernels' bit for bit (and
 * do not depend on the thread count). */
#include "core/ops_impl.h"
#include "core/cpu/cpu_impl.h"
#include "core/math/pool_math.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define POOL_PAR_MIN 32768

/* The CNNs' common case, 2x2 windows at stride 2 without padding (the general loop below ran
 * at ~2 ns per input element). Same rules as the reference: the first maximal element wins, a
 * NaN wins over numbers and the first NaN stays. One output row at a time; the AVX-512 copy
 * takes 16 windows per step (even/odd columns split with permutes, the rule as mask selects). */
static void pool22_plane_def(const float *restrict xp, float *restrict yp, int32_t *restrict ap, int64_t w,
                             int64_t oh, int64_t ow, int relu) {
    for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
            const int64_t base = 2 * i * w + 2 * j, ids[4] = {base, base + 1, base + w, base + w + 1};
            float best = xp[ids[0]];
            int64_t arg = ids[0];
            for (int t = 1; t < 4; t++) {
                float v = xp[ids[t]];
                if (best == best && (v > best || v != v)) {
                    best = v;
                    arg = ids[t];
                }
            }
            yp[i * ow + j] = best;
            ap[i * ow + j] = relu && !(best > 0) ? -1 : (int32_t)arg;
        }
}

__attribute__((target("avx512f"))) static void pool22_plane_512(const float *restrict xp, float *restrict yp,
                                                                 int32_t *restrict ap, int64_t w, int64_t oh,
                                                                 int64_t ow, int relu) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i lane2 = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int64_t i = 0; i < oh; i++) {
        const float *r0 = xp + 2 * i * w, *r1 = r0 + w;
        for (int64_t j = 0; j < ow; j += 16) {
            int64_t n = ow - j < 16 ? ow - j : 16;
            __mmask16 m = (__mmask16)((1u << n) - 1u);
            /* 2n input columns: two masked loads of 16 */
            __mmask16 mlo = n >= 8 ? (__mmask16)0xffff : (__mmask16)((1u << (2 * n)) - 1u);
            __mmask16 mhi = n > 8 ? (__mmask16)((1u << (2 * n - 16)) - 1u) : 0;
            if (n == 16) mhi = 0xffff;
            __m512 a0 = _mm512_maskz_loadu_ps(mlo, r0 + 2 * j), a1 = _mm512_maskz_loadu_ps(mhi, r0 + 2 * j + 16);
            __m512 b0 = _mm512_maskz_loadu_ps(mlo, r1 + 2 * j), b1 = _mm512_maskz_loadu_ps(mhi, r1 + 2 * j + 16);
            __m512 v[4] = {_mm512_permutex2var_ps(a0, even, a1), _mm512_permutex2var_ps(a0, odd, a1),
                           _mm512_permutex2var_ps(b0, even, b1), _mm512_permutex2var_ps(b0, odd, b1)};
            __m512i base = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(2 * i * w + 2 * j)), lane2);
            __m512i id[4] = {base, _mm512_add_epi32(base, _mm512_set1_epi32(1)),
                             _mm512_add_epi32(base, _mm512_set1_epi32((int32_t)w)),
                             _mm512_add_epi32(base, _mm512_set1_epi32((int32_t)w + 1))};
            __m512 best = v[0];
            __m512i arg = id[0];
            for (int t = 1; t < 4; t++) {
                __mmask16 ord = _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q);
                __mmask16 gt = _mm512_cmp_ps_mask(v[t], best, _CMP_GT_OQ);
                __mmask16 nan = _mm512_cmp_ps_mask(v[t], v[t], _CMP_UNORD_Q);
                __mmask16 upd = ord & (gt | nan);
                best = _mm512_mask_mov_ps(best, upd, v[t]);
                arg = _mm512_mask_mov_epi32(arg, upd, id[t]);
            }
            if (relu) /* -1 where !(best > 0), NaN included */
                arg = _mm512_mask_mov_epi32(_mm512_set1_epi32(-1),
                                            _mm512_cmp_ps_mask(best, _mm512_setzero_ps(), _CMP_GT_OQ), arg);
            _mm512_mask_storeu_ps(yp + i * ow + j, m, best);
            _mm512_mask_storeu_epi32(ap + i * ow + j, m, arg);
        }
    }
}

void mr_cpu_maxpool22_plane(const float *xp, float *yp, int32_t *ap, int64_t w, int64_t oh, int64_t ow, int relu) {
    if (mr_cpu_caps_get()->avx512f && w <= INT32_MAX / 4)
        pool22_plane_512(xp, yp, ap, w, oh, ow, relu);
    else
        pool22_plane_def(xp, yp, ap, w, oh, ow, relu);
}

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
    if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0) {
#pragma omp parallel for schedule(static) if (planes * oh * ow * 4 > POOL_PAR_MIN)
        for (int64_t pl = 0; pl < planes; pl++)
            mr_cpu_maxpool22_plane(x + pl * h * w, y + pl * oh * ow, am + pl * oh * ow, w, oh, ow, p->relu);
        return MR_OK;
    }
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
                        if (mr_maxpool_takes_f32(best, v, arg)) {
                            best = v;
                            arg = ih * w + iw;
                        }
                    }
                y[(pl * oh + i) * ow + j] = best;
                am[(pl * oh + i) * ow + j] = p->relu && !(best > 0) ? -1 : (int32_t)arg;
            }
        }
    }
    return MR_OK;
}

/* The backward of the 2x2/stride 2 case on even-sized planes: every dx element lies in exactly
 * one window, so dx is written in one pass (no zeroing, no scatter): each window's 4 positions
 * get dy where the argmax points and 0 elsewhere (all 0 for -1). Returns 0, having written nothing
 * reliable, when some argmax is neither -1 nor a position of its own window (then the general
 * path handles it). */
__attribute__((target("avx512f"))) static int pool22_bwd_plane_512(const int32_t *restrict ap, const float *restrict dyp,
                                                                   float *restrict dxp, int64_t w, int64_t oh,
                                                                   int64_t ow) {
    const __m512i lane2 = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int64_t i = 0; i < oh; i++) {
        float *r0 = dxp + 2 * i * w, *r1 = r0 + w;
        for (int64_t j = 0; j < ow; j += 16) {
            int64_t n = ow - j < 16 ? ow - j : 16;
            __mmask16 m = (__mmask16)((1u << n) - 1u);
            __m512 g = _mm512_maskz_loadu_ps(m, dyp + i * ow + j);
            __m512i am = _mm512_maskz_loadu_epi32(m, ap + i * ow + j);
            __m512i base = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(2 * i * w + 2 * j)), lane2);
            __mmask16 k0 = _mm512_cmpeq_epi32_mask(am, base);
            __mmask16 k1 = _mm512_cmpeq_epi32_mask(am, _mm512_add_epi32(base, _mm512_set1_epi32(1)));
            __mmask16 k2 = _mm512_cmpeq_epi32_mask(am, _mm512_add_epi32(base, _mm512_set1_epi32((int32_t)w)));
            __mmask16 k3 = _mm512_cmpeq_epi32_mask(am, _mm512_add_epi32(base, _mm512_set1_epi32((int32_t)w + 1)));
            /* -1 (padding-only, or p.pool.relu's max <= 0): the window's 4 positions get 0 */
            __mmask16 none = _mm512_cmpeq_epi32_mask(am, _mm512_set1_epi32(-1));
            if ((__mmask16)(k0 | k1 | k2 | k3 | none) != m) return 0; /* a foreign position */
            __m512 v0 = _mm512_maskz_mov_ps(k0, g), v1 = _mm512_maskz_mov_ps(k1, g);
            __m512 v2 = _mm512_maskz_mov_ps(k2, g), v3 = _mm512_maskz_mov_ps(k3, g);
            __mmask16 mlo = n >= 8 ? (__mmask16)0xffff : (__mmask16)((1u << (2 * n)) - 1u);
            __mmask16 mhi = n == 16 ? (__mmask16)0xffff : (n > 8 ? (__mmask16)((1u << (2 * n - 16)) - 1u) : 0);
            _mm512_mask_storeu_ps(r0 + 2 * j, mlo, _mm512_permutex2var_ps(v0, lo, v1));
            _mm512_mask_storeu_ps(r0 + 2 * j + 16, mhi, _mm512_permutex2var_ps(v0, hi, v1));
            _mm512_mask_storeu_ps(r1 + 2 * j, mlo, _mm512_permutex2var_ps(v2, lo, v3));
            _mm512_mask_storeu_ps(r1 + 2 * j + 16, mhi, _mm512_permutex2var_ps(v2, hi, v3));
        }
    }
    return 1;
}

int mr_cpu_maxpool22_bwd_plane(const int32_t *ap, const float *dyp, float *dxp, int64_t oh, int64_t ow) {
    if (!mr_cpu_caps_get()->avx512f || 2 * ow > INT32_MAX / 4) return 0;
    return pool22_bwd_plane_512(ap, dyp, dxp, 2 * ow, oh, ow);
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
    const mr_pool_params *p = &a->p.pool;
    if (p->kernel_h == 2 && p->kernel_w == 2 && p->stride_h == 2 && p->stride_w == 2 && p->pad_h == 0 && p->pad_w == 0 &&
        d[2] % 2 == 0 && d[3] % 2 == 0 && od[2] * 2 == d[2] && od[3] * 2 == d[3] && mr_cpu_caps_get()->avx512f &&
        d[3] <= INT32_MAX / 4) {
        int ok = 1;
#pragma omp parallel for schedule(static) reduction(&& : ok) if (planes * (hw + ohw) > POOL_PAR_MIN)
        for (int64_t pl = 0; pl < planes; pl++)
            ok = pool22_bwd_plane_512(am + pl * ohw, dy + pl * ohw, dx + pl * hw, d[3], od[2], od[3]) && ok;
        if (ok) return MR_OK;
        /* some argmax did not come from this pooling: the general path below checks and scatters */
    }
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

/* ---- average pooling -------------------------------------------------------------------------- */

/* The output columns [*jl, *jr) whose windows lie inside [0, w) horizontally. */
static void avg_inner_cols(int64_t w, int64_t ow, int kw, int sw, int pw, int64_t *jl, int64_t *jr) {
    int64_t lo = (pw + sw - 1) / sw, hi = w + pw - kw < 0 ? 0 : (w + pw - kw) / sw + 1;
    lo = lo < ow ? lo : ow;
    hi = hi < ow ? hi : ow;
    *jl = lo;
    *jr = hi > lo ? hi : lo;
}

/* y[j] += x[j*sw + off] for j in [j0, j1). Inlined with sw a constant where the caller has one,
 * so the common strides vectorise. */
static inline __attribute__((always_inline)) void avg_row_add(float *restrict y, const float *restrict x, int64_t off,
                                                              int64_t j0, int64_t j1, int sw) {
    for (int64_t j = j0; j < j1; j++) y[j] += x[j * sw + off];
}

/* x[j*sw + off] += g[j - j0] for j in [j0, j1) (distinct x elements for distinct j). */
static inline __attribute__((always_inline)) void avg_row_scatter(float *restrict x, const float *restrict g,
                                                                  int64_t off, int64_t j0, int64_t j1, int sw) {
    for (int64_t j = j0; j < j1; j++) x[j * sw + off] += g[j - j0];
}

/* The sum of window (i, j), clipped to the plane, row-major from 0 (the edge columns). */
static float avg_window_sum(const float *xp, int64_t h0, int64_t h1, int64_t j, int64_t w, int kw, int sw, int pw) {
    int64_t w0 = j * sw - pw, w1 = w0 + kw;
    w0 = w0 < 0 ? 0 : w0;
    w1 = w1 > w ? w : w1;
    float sum = 0.0f;
    for (int64_t ih = h0; ih < h1; ih++)
        for (int64_t iw = w0; iw < w1; iw++) sum += xp[ih * w + iw];
    return sum;
}

/* One plane: x (h, w) -> y (oh, ow). (An AVX-512 build of this code was slower on the 14..56-wide
 * rows of CNNs than the SSE2 one: its remainders are longer.) */
static void avg_fwd_plane(const float *restrict xp, float *restrict yp, int64_t h, int64_t w, int64_t oh, int64_t ow,
                          const mr_pool_params *p) {
    const int kh = p->kernel_h, kw = p->kernel_w, sh = p->stride_h, sw = p->stride_w, ph = p->pad_h, pw = p->pad_w;
    const float div = (float)kh * (float)kw;
    int64_t jl, jr;
    avg_inner_cols(w, ow, kw, sw, pw, &jl, &jr);
    for (int64_t i = 0; i < oh; i++) {
        int64_t h0 = i * sh - ph, h1 = h0 + kh;
        h0 = h0 < 0 ? 0 : h0;
        h1 = h1 > h ? h : h1;
        float *yr = yp + i * ow;
        for (int64_t j = 0; j < jl; j++) yr[j] = avg_window_sum(xp, h0, h1, j, w, kw, sw, pw) / div;
        for (int64_t j = jr; j < ow; j++) yr[j] = avg_window_sum(xp, h0, h1, j, w, kw, sw, pw) / div;
        if (jr == jl) continue;
        for (int64_t j = jl; j < jr; j++) yr[j] = 0.0f;
        for (int64_t ih = h0; ih < h1; ih++)
            for (int kj = 0; kj < kw; kj++) {
                const float *xr = xp + ih * w; /* xr[j*sw + kj - pw] is tap (ih, kj) of window j */
                if (sw == 1)
                    avg_row_add(yr, xr, kj - pw, jl, jr, 1);
                else if (sw == 2)
                    avg_row_add(yr, xr, kj - pw, jl, jr, 2);
                else
                    avg_row_add(yr, xr, kj - pw, jl, jr, sw);
            }
        for (int64_t j = jl; j < jr; j++) yr[j] /= div;
    }
}

/* dy/(kh*kw) of window (i, j) added to its elements inside the plane (the edge columns). */
static void avg_window_scatter(float *dxp, int64_t h0, int64_t h1, int64_t j, int64_t w, int kw, int sw, int pw,
                               float g) {
    int64_t w0 = j * sw - pw, w1 = w0 + kw;
    w0 = w0 < 0 ? 0 : w0;
    w1 = w1 > w ? w : w1;
    for (int64_t ih = h0; ih < h1; ih++)
        for (int64_t iw = w0; iw < w1; iw++) dxp[ih * w + iw] += g;
}

#define AVG_CHUNK 256

/* One plane: dy (oh, ow) -> dx (h, w), every element written. Each output row is taken in chunks
 * of AVG_CHUNK columns (their dy/(kh*kw) in a stack buffer), left to right, so a dx element still
 * receives its windows in increasing output index. */
static void avg_bwd_plane(const float *restrict dyp, float *restrict dxp, int64_t h, int64_t w, int64_t oh, int64_t ow,
                          const mr_pool_params *p) {
    const int kh = p->kernel_h, kw = p->kernel_w, sh = p->stride_h, sw = p->stride_w, ph = p->pad_h, pw = p->pad_w;
    const float div = (float)kh * (float)kw;
    float g[AVG_CHUNK];
    int64_t jl, jr;
    avg_inner_cols(w, ow, kw, sw, pw, &jl, &jr);
    memset(dxp, 0, (size_t)(h * w) * sizeof(float));
    for (int64_t i = 0; i < oh; i++) {
        int64_t h0 = i * sh - ph, h1 = h0 + kh;
        h0 = h0 < 0 ? 0 : h0;
        h1 = h1 > h ? h : h1;
        const float *dyr = dyp + i * ow;
        for (int64_t c0 = 0; c0 < ow; c0 += AVG_CHUNK) {
            int64_t c1 = ow - c0 < AVG_CHUNK ? ow : c0 + AVG_CHUNK;
            for (int64_t j = c0; j < c1; j++) g[j - c0] = dyr[j] / div;
            /* the chunk's columns in three runs, left to right: left edge, inside, right edge */
            int64_t a0 = c0, a1 = c1 < jl ? c1 : jl;
            for (int64_t j = a0; j < a1; j++) avg_window_scatter(dxp, h0, h1, j, w, kw, sw, pw, g[j - c0]);
            int64_t b0 = c0 > jl ? c0 : jl, b1 = c1 < jr ? c1 : jr;
            if (b0 < b1)
                for (int64_t ih = h0; ih < h1; ih++)
                    /* taps right to left: a dx element gets its windows left to right */
                    for (int kj = kw - 1; kj >= 0; kj--) {
                        float *xr = dxp + ih * w;
                        const float *gs = g + (b0 - c0);
                        if (sw == 1)
                            avg_row_scatter(xr, gs, kj - pw, b0, b1, 1);
                        else if (sw == 2)
                            avg_row_scatter(xr, gs, kj - pw, b0, b1, 2);
                        else
                            avg_row_scatter(xr, gs, kj - pw, b0, b1, sw);
                    }
            int64_t e0 = c0 > jr ? c0 : jr;
            for (int64_t j = e0; j < c1; j++) avg_window_scatter(dxp, h0, h1, j, w, kw, sw, pw, g[j - c0]);
        }
    }
}

mr_status mr_avgpool2d_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_avgpool2d_fwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const mr_pool_params *p = &a->p.pool;
    const int64_t *d = a->in[0].shape.dim, *od = a->out[0].shape.dim;
    int64_t planes = d[0] * d[1], h = d[2], w = d[3], oh = od[2], ow = od[3];
    /* x (N*C, H, W); y (N*C, OH, OW) */
    const float *x = a->in[0].data;
    float *y = a->out[0].data;
#pragma omp parallel for schedule(static) if (planes * oh * ow * p->kernel_h * p->kernel_w > POOL_PAR_MIN)
    for (int64_t pl = 0; pl < planes; pl++) avg_fwd_plane(x + pl * h * w, y + pl * oh * ow, h, w, oh, ow, p);
    return MR_OK;
}

mr_status mr_avgpool2d_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_avgpool2d_bwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const mr_pool_params *p = &a->p.pool;
    const int64_t *d = a->out[0].shape.dim, *od = a->in[0].shape.dim;
    int64_t planes = d[0] * d[1], h = d[2], w = d[3], oh = od[2], ow = od[3];
    /* dy (N*C, OH, OW); dx (N*C, H, W) */
    const float *dy = a->in[0].data;
    float *dx = a->out[0].data;
#pragma omp parallel for schedule(static) if (planes * (h * w + oh * ow * p->kernel_h * p->kernel_w) > POOL_PAR_MIN)
    for (int64_t pl = 0; pl < planes; pl++) avg_bwd_plane(dy + pl * oh * ow, dx + pl * h * w, h, w, oh, ow, p);
    return MR_OK;
}
