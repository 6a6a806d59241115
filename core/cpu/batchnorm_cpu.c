/* Batch norm, CPU fast path (f32; f64 runs the reference). x (N, C, S...) is walked as (N, C, S):
 * channel c's elements are the N rows x[n, c, 0..S). The unit of work is a block of channels,
 * parallel over blocks (OpenMP), each block summed in row order by one thread, so the results do
 * not depend on the thread count and no workspace is needed:
 *   - S >= BN_COLS: a block is one channel; the inner loops run over a row's S contiguous values.
 *   - S < BN_COLS (BatchNorm1d on (N, C), small feature maps): a block is the BN_COLS / S
 *     adjacent channels whose rows are contiguous, with per-column accumulators and constants,
 *     so the inner loops still vectorise over up to BN_COLS values.
 *
 * Statistics accumulate in f64 over data shifted by the channel's first value K (mean = K +
 * sum(x - K)/M, var = sum((x - K)^2)/M - (mean - K)^2): one pass over x, and with K a sample of
 * the channel the cancellation in the variance costs about log10(1 + (mean - K)^2/var) of f64's
 * 16 digits, so |mean| >> std (x = 1000 + noise) keeps f32 accuracy for any M. The backward's
 * sums (dy, dy * xhat) accumulate in f64 too. The per-element steps are core/math/batchnorm_math.h
 * with the mean split into f32 hi + lo parts, shared with the CUDA kernels and the reference. */
#include "core/ops_impl.h"
#include "core/cpu/cpu_impl.h"
#include "core/math/batchnorm_math.h"

#include <math.h>

/* The block bodies are inlined into one copy per ISA: the baseline and AVX-512 (8-wide f64
 * accumulation, 16-wide f32), picked at run time from CPUID as core/cpu/elementwise_cpu.c does.
 * Each copy sums in a fixed order, so results do not depend on the thread count (they may differ
 * in the last bits between a machine with AVX-512 and one without). */
#define BN_INLINE static inline __attribute__((always_inline))

/* Below this many elements the loops run on one thread (team start-up would dominate). */
#define BN_PAR_MIN 32768
/* Columns of the small-S blocks. */
#define BN_COLS 64

static void bn_dims(const mr_view *x, int64_t *n, int64_t *c, int64_t *s) {
    *n = x->shape.dim[0];
    *c = x->shape.dim[1];
    *s = 1;
    for (int i = 2; i < x->shape.ndim; i++) *s *= x->shape.dim[i];
}

/* The mean as f32 hi + lo parts (batchnorm_math.h). */
BN_INLINE void split(double m, float *mh, float *ml) {
    *mh = (float)m;
    *ml = (float)(m - (double)*mh);
}

typedef struct bn_fwd {
    const float *x, *gamma, *beta, *rmean, *rvar;
    float *y, *mean, *var;
    int64_t N, C, S;
    double eps;
    int training;
} bn_fwd;

/* The statistics of channel c from its shifted sums s1 = sum(x - K), s2 = sum((x - K)^2) (training)
 * or the running ones; stores them and returns the constants of y. */
BN_INLINE void fwd_consts(const bn_fwd *p, int64_t c, double K, double s1, double s2, float *mh, float *ml, float *k,
                       float *b) {
    double m, v;
    if (p->training) {
        const double M = (double)(p->N * p->S), dm = s1 / M;
        m = K + dm;
        v = s2 / M - dm * dm;
        if (v < 0.0) v = 0.0;
    } else {
        m = p->rmean[c];
        v = p->rvar[c];
    }
    if (p->mean) p->mean[c] = (float)m;
    if (p->var) p->var[c] = (float)v;
    split(m, mh, ml);
    *k = (float)((p->gamma ? (double)p->gamma[c] : 1.0) / sqrt(v + p->eps));
    *b = p->beta ? p->beta[c] : 0.0f;
}

BN_INLINE void fwd_channel(const bn_fwd *p, int64_t c) {
    const int64_t N = p->N, C = p->C, S = p->S;
    const double K = p->training ? (double)p->x[c * S] : 0.0;
    double s1 = 0.0, s2 = 0.0;
    for (int64_t n = 0; p->training && n < N; n++) {
        const float *restrict xr = p->x + (n * C + c) * S;
#pragma omp simd reduction(+ : s1, s2)
        for (int64_t s = 0; s < S; s++) {
            double d = (double)xr[s] - K;
            s1 += d;
            s2 += d * d;
        }
    }
    float mh, ml, k, b;
    fwd_consts(p, c, K, s1, s2, &mh, &ml, &k, &b);
    for (int64_t n = 0; n < N; n++) {
        const float *restrict xr = p->x + (n * C + c) * S;
        float *restrict yr = p->y + (n * C + c) * S;
#pragma omp simd
        for (int64_t s = 0; s < S; s++) yr[s] = mr_batchnorm_y_f32(xr[s], mh, ml, k, b);
    }
}

/* Channels [c0, c1) with (c1 - c0) * S <= BN_COLS: their rows are one contiguous run per n. */
BN_INLINE void fwd_block(const bn_fwd *p, int64_t c0, int64_t c1) {
    const int64_t N = p->N, C = p->C, S = p->S, w = (c1 - c0) * S;
    double K[BN_COLS], s1[BN_COLS], s2[BN_COLS];
    float mh[BN_COLS], ml[BN_COLS], k[BN_COLS], b[BN_COLS];
    for (int64_t j = 0; j < w; j++) {
        K[j] = p->training ? (double)p->x[(c0 + j / S) * S] : 0.0;
        s1[j] = s2[j] = 0.0;
    }
    for (int64_t n = 0; p->training && n < N; n++) {
        const float *restrict xr = p->x + (n * C + c0) * S;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) {
            double d = (double)xr[j] - K[j];
            s1[j] += d;
            s2[j] += d * d;
        }
    }
    for (int64_t c = c0; c < c1; c++) {
        double t1 = 0.0, t2 = 0.0;
        int64_t j0 = (c - c0) * S;
        for (int64_t s = 0; s < S; s++) {
            t1 += s1[j0 + s];
            t2 += s2[j0 + s];
        }
        fwd_consts(p, c, K[j0], t1, t2, &mh[j0], &ml[j0], &k[j0], &b[j0]);
        for (int64_t s = 1; s < S; s++) {
            mh[j0 + s] = mh[j0];
            ml[j0 + s] = ml[j0];
            k[j0 + s] = k[j0];
            b[j0 + s] = b[j0];
        }
    }
    for (int64_t n = 0; n < N; n++) {
        const float *restrict xr = p->x + (n * C + c0) * S;
        float *restrict yr = p->y + (n * C + c0) * S;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) yr[j] = mr_batchnorm_y_f32(xr[j], mh[j], ml[j], k[j], b[j]);
    }
}

/* Block i of cb channels (cb = 1 on the S path: channel i), one copy per ISA. */
#define BN_RUN_BODY(CHANNEL, BLOCK)                                                             \
    if (p->S >= BN_COLS)                                                                        \
        CHANNEL(p, i);                                                                          \
    else                                                                                        \
        BLOCK(p, i * cb, i * cb + cb < p->C ? i * cb + cb : p->C)
static void fwd_run_def(const bn_fwd *p, int64_t i, int64_t cb) { BN_RUN_BODY(fwd_channel, fwd_block); }
__attribute__((target("avx512f"))) static void fwd_run_512(const bn_fwd *p, int64_t i, int64_t cb) {
    BN_RUN_BODY(fwd_channel, fwd_block);
}

/* Channels per block of the small-S path (1 when S >= BN_COLS: one channel, the S path). */
static int64_t block_channels(int64_t S) { return S >= BN_COLS ? 1 : BN_COLS / S; }

mr_status mr_batchnorm_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_batchnorm_fwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    bn_fwd p = {a->in[0].data, a->in[1].data, a->in[2].data, a->in[3].data, a->in[4].data, a->out[0].data,
                a->out[1].data, a->out[2].data, 0, 0, 0, a->p.batchnorm.eps, a->p.batchnorm.training};
    bn_dims(&a->in[0], &p.N, &p.C, &p.S);
    const int64_t cb = block_channels(p.S), nblk = (p.C + cb - 1) / cb;
    void (*run)(const bn_fwd *, int64_t, int64_t) = mr_cpu_caps_get()->avx512f ? fwd_run_512 : fwd_run_def;
#pragma omp parallel for schedule(static) if (p.N * p.C * p.S > BN_PAR_MIN && nblk > 1)
    for (int64_t i = 0; i < nblk; i++) run(&p, i, cb);
    return MR_OK;
}

typedef struct bn_bwd {
    const float *dy, *x, *gamma, *mean, *var;
    float *dx, *dgamma, *dbeta;
    int64_t N, C, S;
    double eps;
    int training;
} bn_bwd;

/* rstd and k = gamma * rstd of channel c. */
BN_INLINE void bwd_rstd(const bn_bwd *p, int64_t c, float *r, float *k) {
    double rd = 1.0 / sqrt((double)p->var[c] + p->eps);
    *r = (float)rd;
    *k = (float)((p->gamma ? (double)p->gamma[c] : 1.0) * rd);
}

/* Stores dgamma/dbeta of channel c from its sums and returns the dx terms a = sum(dy)/M and
 * b = sum(dy * xhat)/M (0 in evaluation). */
BN_INLINE void bwd_terms(const bn_bwd *p, int64_t c, double sdy, double sdyx, float *ta, float *tb) {
    if (p->dgamma) p->dgamma[c] = (float)sdyx;
    if (p->dbeta) p->dbeta[c] = (float)sdy;
    const double M = (double)(p->N * p->S);
    *ta = p->training && M > 0 ? (float)(sdy / M) : 0.0f;
    *tb = p->training && M > 0 ? (float)(sdyx / M) : 0.0f;
}

BN_INLINE void bwd_channel(const bn_bwd *p, int64_t c) {
    const int64_t N = p->N, C = p->C, S = p->S;
    const float m = p->mean[c];
    float r, k, ta = 0.0f, tb = 0.0f;
    bwd_rstd(p, c, &r, &k);
    double sdy = 0.0, sdyx = 0.0;
    const int sums = p->training || p->dgamma || p->dbeta;
    for (int64_t n = 0; sums && n < N; n++) {
        const float *restrict xr = p->x + (n * C + c) * S, *restrict gr = p->dy + (n * C + c) * S;
#pragma omp simd reduction(+ : sdy, sdyx)
        for (int64_t s = 0; s < S; s++) {
            sdy += (double)gr[s];
            sdyx += (double)(gr[s] * mr_batchnorm_xhat_f32(xr[s], m, 0.0f, r));
        }
    }
    bwd_terms(p, c, sdy, sdyx, &ta, &tb);
    for (int64_t n = 0; p->dx && n < N; n++) {
        const float *restrict xr = p->x + (n * C + c) * S, *restrict gr = p->dy + (n * C + c) * S;
        float *restrict dr = p->dx + (n * C + c) * S;
#pragma omp simd
        for (int64_t s = 0; s < S; s++) dr[s] = mr_batchnorm_dx_f32(xr[s], m, 0.0f, r, k, gr[s], ta, tb);
    }
}

BN_INLINE void bwd_block(const bn_bwd *p, int64_t c0, int64_t c1) {
    const int64_t N = p->N, C = p->C, S = p->S, w = (c1 - c0) * S;
    double s1[BN_COLS], s2[BN_COLS];
    float m[BN_COLS], r[BN_COLS], k[BN_COLS], ta[BN_COLS], tb[BN_COLS];
    for (int64_t j = 0; j < w; j++) {
        int64_t c = c0 + j / S;
        m[j] = p->mean[c];
        bwd_rstd(p, c, &r[j], &k[j]);
        s1[j] = s2[j] = 0.0;
    }
    const int sums = p->training || p->dgamma || p->dbeta;
    for (int64_t n = 0; sums && n < N; n++) {
        const float *restrict xr = p->x + (n * C + c0) * S, *restrict gr = p->dy + (n * C + c0) * S;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) {
            s1[j] += (double)gr[j];
            s2[j] += (double)(gr[j] * mr_batchnorm_xhat_f32(xr[j], m[j], 0.0f, r[j]));
        }
    }
    for (int64_t c = c0; c < c1; c++) {
        double t1 = 0.0, t2 = 0.0;
        int64_t j0 = (c - c0) * S;
        for (int64_t s = 0; s < S; s++) {
            t1 += s1[j0 + s];
            t2 += s2[j0 + s];
        }
        bwd_terms(p, c, t1, t2, &ta[j0], &tb[j0]);
        for (int64_t s = 1; s < S; s++) {
            ta[j0 + s] = ta[j0];
            tb[j0 + s] = tb[j0];
        }
    }
    for (int64_t n = 0; p->dx && n < N; n++) {
        const float *restrict xr = p->x + (n * C + c0) * S, *restrict gr = p->dy + (n * C + c0) * S;
        float *restrict dr = p->dx + (n * C + c0) * S;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) dr[j] = mr_batchnorm_dx_f32(xr[j], m[j], 0.0f, r[j], k[j], gr[j], ta[j], tb[j]);
    }
}

static void bwd_run_def(const bn_bwd *p, int64_t i, int64_t cb) { BN_RUN_BODY(bwd_channel, bwd_block); }
__attribute__((target("avx512f"))) static void bwd_run_512(const bn_bwd *p, int64_t i, int64_t cb) {
    BN_RUN_BODY(bwd_channel, bwd_block);
}

mr_status mr_batchnorm_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_batchnorm_bwd_ref(a);
    if (a->in[1].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[1].dtype));
    bn_bwd p = {a->in[0].data, a->in[1].data, a->in[2].data, a->in[3].data, a->in[4].data, a->out[0].data,
                a->out[1].data, a->out[2].data, 0, 0, 0, a->p.batchnorm.eps, a->p.batchnorm.training};
    bn_dims(&a->in[1], &p.N, &p.C, &p.S);
    const int64_t cb = block_channels(p.S), nblk = (p.C + cb - 1) / cb;
    void (*run)(const bn_bwd *, int64_t, int64_t) = mr_cpu_caps_get()->avx512f ? bwd_run_512 : bwd_run_def;
#pragma omp parallel for schedule(static) if (p.N * p.C * p.S > BN_PAR_MIN && nblk > 1)
    for (int64_t i = 0; i < nblk; i++) run(&p, i, cb);
    return MR_OK;
}
