/* Softmax, log-softmax and softmax cross-entropy on the CPU: f32 fast paths (f64 runs the
 * reference). Rows are independent, so the loops run in parallel over rows; within a row one
 * vectorised pass finds the maximum and one sums exp(x - max) (storing the exponentials where
 * the output needs them), then a last pass scales. Each row is summed by one thread in a fixed
 * order, so results do not depend on the thread count. */
#include "core/ops_impl.h"
#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"
#include "core/math/softmax_math.h"

#include <math.h>
#include <string.h>

/* Each row is one loop, so which elements take libmvec's vector body never depends on the
 * thread count. */
#include "core/cpu/vec_math_impl.h"

#define SM_PAR_MIN 16384

static mr_status f32_only(const mr_op_args *a, mr_dtype dt) {
    return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(dt));
}

/* The row loops are compiled twice, for the baseline ISA and for AVX-512 (libmvec's 16-wide
 * expf), and picked at run time from CPUID (softmax over attention rows: ~3x faster exp). */
#define DEFINE_SOFTMAX_ROWS(SUF, ATTR)                                                              \
    ATTR static float row_max_##SUF(const float *restrict x, int64_t c) {                           \
        float m = -INFINITY;                                                                        \
        _Pragma("omp simd reduction(max : m)") for (int64_t j = 0; j < c; j++) m = x[j] > m ? x[j] : m; \
        return m;                                                                                   \
    }                                                                                               \
    /* p[j] = exp(x[j] - m); returns their sum */                                                   \
    ATTR static float row_exp_##SUF(const float *restrict x, float *restrict p, int64_t c, float m) { \
        float s = 0.0f;                                                                             \
        _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < c; j++) {                      \
            float e = expf(x[j] - m);                                                               \
            p[j] = e;                                                                               \
            s += e;                                                                                 \
        }                                                                                           \
        return s;                                                                                   \
    }                                                                                               \
    ATTR static void softmax_row_##SUF(const float *restrict x, float *restrict y, int64_t c, int log_sm) { \
        float m = row_max_##SUF(x, c);                                                              \
        if (log_sm) {                                                                               \
            float s = 0.0f;                                                                         \
            _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < c; j++) s += expf(x[j] - m); \
            /* (x - m) first: it is exact near the max, where m + log(s) would round */             \
            const float ls = logf(s);                                                               \
            _Pragma("omp simd") for (int64_t j = 0; j < c; j++) y[j] = mr_log_softmax_f32(x[j], m, ls); \
        } else {                                                                                    \
            const float inv = 1.0f / row_exp_##SUF(x, y, c, m);                                     \
            _Pragma("omp simd") for (int64_t j = 0; j < c; j++) y[j] *= inv;                        \
        }                                                                                           \
    }                                                                                               \
    ATTR static void softmax_bwd_row_##SUF(const float *restrict y, const float *restrict g,        \
                                           float *restrict dx, int64_t c, int log_sm) {             \
        float s = 0.0f;                                                                             \
        if (log_sm) {                                                                               \
            _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < c; j++) s += g[j];         \
            _Pragma("omp simd") for (int64_t j = 0; j < c; j++) dx[j] = mr_log_softmax_grad_f32(y[j], g[j], s); \
        } else {                                                                                    \
            _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < c; j++) s += g[j] * y[j];  \
            _Pragma("omp simd") for (int64_t j = 0; j < c; j++) dx[j] = mr_softmax_grad_f32(y[j], g[j], s); \
        }                                                                                           \
    }                                                                                               \
    /* probabilities into p; returns the loss term logsumexp(x) - x[label] (0 when ignored) */    \
    ATTR static float xent_row_##SUF(const float *restrict x, float *restrict p, int64_t c, int32_t lab, \
                                     int ignored) {                                                 \
        float m = row_max_##SUF(x, c);                                                              \
        float s = row_exp_##SUF(x, p, c, m);                                                        \
        const float inv = 1.0f / s;                                                                 \
        _Pragma("omp simd") for (int64_t j = 0; j < c; j++) p[j] *= inv;                            \
        return ignored ? 0.0f : mr_xent_loss_f32(m, x[lab], s);                                      \
    }

DEFINE_SOFTMAX_ROWS(def, )
DEFINE_SOFTMAX_ROWS(512, __attribute__((target("avx512f"))))

/* Half views (mixed precision, core/ops.h SOFTMAX / SOFTMAX_BWD). Forward: the first n of c
 * columns as softmax_row's f32 values, each rounded to bf16 (f16 1) as CAST rounds, the rest 0. The
 * max and the sum are softmax_row's loops on the whole row; the exponentials are made by the same
 * row_exp in chunks of 256 (a multiple of every vector width, so each element takes the same
 * vector body or scalar tail as in the f32 row: libmvec's expf and the scalar one differ in the
 * last ulp) and scaled by the same 1/s, so the bits are the f32 softmax's then CAST's. Backward: y
 * widened exactly, the gradient in f32 (its dot product may sum in another order than
 * softmax_bwd_row's: equal within rounding, not bit for bit), dx f32 or rounded to bf16/f16 (dxh
 * 1/2) as CAST rounds the f32 dx. */
#define DEFINE_SOFTMAX_HALF_ROWS(SUF, ATTR)                                                         \
    ATTR static void softmax_row_h_##SUF(const float *restrict x, uint16_t *restrict y, int64_t c, int64_t n, \
                                         int f16) {                                                 \
        float m = row_max_##SUF(x, n), s = 0.0f;                                                    \
        _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < n; j++) s += expf(x[j] - m);   \
        const float inv = 1.0f / s;                                                                 \
        for (int64_t j0 = 0; j0 < n; j0 += 256) {                                                   \
            const int64_t k = n - j0 < 256 ? n - j0 : 256;                                          \
            float t[256];                                                                           \
            (void)row_exp_##SUF(x + j0, t, k, m);                                                   \
            if (!f16) {                                                                             \
                _Pragma("omp simd") for (int64_t j = 0; j < k; j++) y[j0 + j] = mr_f32_to_bf16(t[j] * inv); \
            } else {                                                                                \
                for (int64_t j = 0; j < k; j++) y[j0 + j] = mr_f32_to_f16(t[j] * inv);              \
            }                                                                                       \
        }                                                                                           \
        memset(y + n, 0, (size_t)(c - n) * sizeof(uint16_t));                                       \
    }                                                                                               \
    ATTR static void softmax_bwd_row_h_##SUF(const void *restrict yv, int yh, const float *restrict g, \
                                             void *restrict dxv, int dxh, int64_t c) {              \
        const float *restrict y32 = yv;                                                             \
        const uint16_t *restrict y16 = yv;                                                          \
        float s = 0.0f;                                                                             \
        if (yh == 0) {                                                                              \
            _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < c; j++) s += g[j] * y32[j]; \
        } else if (yh == 1) {                                                                       \
            _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < c; j++) s += g[j] * mr_bf16_to_f32(y16[j]); \
        } else {                                                                                    \
            for (int64_t j = 0; j < c; j++) s += g[j] * mr_f16_to_f32(y16[j]);                      \
        }                                                                                           \
        float *restrict d32 = dxv;                                                                  \
        uint16_t *restrict d16 = dxv;                                                               \
        for (int64_t j0 = 0; j0 < c; j0 += 256) {                                                   \
            const int64_t m = c - j0 < 256 ? c - j0 : 256;                                          \
            float t[256];                                                                           \
            if (yh == 0) {                                                                          \
                _Pragma("omp simd") for (int64_t j = 0; j < m; j++) t[j] = mr_softmax_grad_f32(y32[j0 + j], g[j0 + j], s); \
            } else if (yh == 1) {                                                                   \
                _Pragma("omp simd") for (int64_t j = 0; j < m; j++)                                 \
                    t[j] = mr_softmax_grad_f32(mr_bf16_to_f32(y16[j0 + j]), g[j0 + j], s);          \
            } else {                                                                                \
                for (int64_t j = 0; j < m; j++) t[j] = mr_softmax_grad_f32(mr_f16_to_f32(y16[j0 + j]), g[j0 + j], s); \
            }                                                                                       \
            if (dxh == 0) {                                                                         \
                memcpy(d32 + j0, t, (size_t)m * sizeof(float));                                     \
            } else if (dxh == 1) {                                                                  \
                _Pragma("omp simd") for (int64_t j = 0; j < m; j++) d16[j0 + j] = mr_f32_to_bf16(t[j]); \
            } else {                                                                                \
                for (int64_t j = 0; j < m; j++) d16[j0 + j] = mr_f32_to_f16(t[j]);                  \
            }                                                                                       \
        }                                                                                           \
    }

DEFINE_SOFTMAX_HALF_ROWS(def, )
DEFINE_SOFTMAX_HALF_ROWS(512, __attribute__((target("avx512f"))))

static int half_kind(mr_dtype t) { return t == MR_BF16 ? 1 : t == MR_F16 ? 2 : 0; }

typedef void (*softmax_row_fn)(const float *, float *, int64_t, int);
typedef void (*softmax_bwd_row_fn)(const float *, const float *, float *, int64_t, int);
typedef float (*xent_row_fn)(const float *, float *, int64_t, int32_t, int);

/* x (rows, cols) -> y (rows, cols) */
mr_status mr_softmax_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_softmax_fwd_ref(a);
    if (a->in[0].dtype != MR_F32) return f32_only(a, a->in[0].dtype);
    int64_t rows, cols;
    mr_shape_rows_cols(&a->in[0].shape, &rows, &cols);
    const float *X = a->in[0].data;
    float *Y = a->out[0].data;
    const int log_sm = a->op == MR_OP_LOG_SOFTMAX;
    if (cols == 0) return MR_OK;
    const int yh = half_kind(a->out[0].dtype);
    if (yh) {
        uint16_t *Y16 = a->out[0].data;
        /* the same ISA choice as the f32 rows, whose bits these must reproduce */
        void (*hrow)(const float *, uint16_t *, int64_t, int64_t, int) =
            mr_cpu_caps_get()->avx512f ? softmax_row_h_512 : softmax_row_h_def;
#pragma omp parallel for schedule(static) if (rows * cols > SM_PAR_MIN)
        for (int64_t r = 0; r < rows; r++)
            hrow(X + r * cols, Y16 + r * cols, cols, mr_softmax_causal_cols(a, r, cols), yh == 2);
        return MR_OK;
    }
    softmax_row_fn row = mr_cpu_caps_get()->avx512f ? softmax_row_512 : softmax_row_def;
    if (a->p.softmax.causal) {
        /* a row sees its first n columns; the rest are 0 (half the work of a masked softmax) */
#pragma omp parallel for schedule(static) if (rows * cols > SM_PAR_MIN)
        for (int64_t r = 0; r < rows; r++) {
            int64_t n = mr_softmax_causal_cols(a, r, cols);
            row(X + r * cols, Y + r * cols, n, 0);
            memset(Y + r * cols + n, 0, (size_t)(cols - n) * sizeof(float));
        }
        return MR_OK;
    }
#pragma omp parallel for schedule(static) if (rows * cols > SM_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) row(X + r * cols, Y + r * cols, cols, log_sm);
    return MR_OK;
}

/* y, dy (rows, cols) -> dx (rows, cols) */
mr_status mr_softmax_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_softmax_bwd_ref(a);
    if (a->in[1].dtype != MR_F32) return f32_only(a, a->in[1].dtype);
    int64_t rows, cols;
    mr_shape_rows_cols(&a->in[0].shape, &rows, &cols);
    const float *Y = a->in[0].data, *G = a->in[1].data;
    float *DX = a->out[0].data;
    const int log_sm = a->op == MR_OP_LOG_SOFTMAX_BWD;
    const int yh = half_kind(a->in[0].dtype), dxh = half_kind(a->out[0].dtype);
    if (yh || dxh) {
        void (*hrow)(const void *, int, const float *, void *, int, int64_t) =
            mr_cpu_caps_get()->avx512f ? softmax_bwd_row_h_512 : softmax_bwd_row_h_def;
        const size_t ys = yh ? sizeof(uint16_t) : sizeof(float), ds = dxh ? sizeof(uint16_t) : sizeof(float);
#pragma omp parallel for schedule(static) if (rows * cols > SM_PAR_MIN)
        for (int64_t r = 0; r < rows; r++)
            hrow((const char *)a->in[0].data + (size_t)(r * cols) * ys, yh, G + r * cols,
                 (char *)a->out[0].data + (size_t)(r * cols) * ds, dxh, cols);
        return MR_OK;
    }
    softmax_bwd_row_fn row = mr_cpu_caps_get()->avx512f ? softmax_bwd_row_512 : softmax_bwd_row_def;
#pragma omp parallel for schedule(static) if (rows * cols > SM_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) row(Y + r * cols, G + r * cols, DX + r * cols, cols, log_sm);
    return MR_OK;
}

/* logits (N,C), labels (N) i32 -> loss (N), probs (N,C) */
mr_status mr_xent_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_xent_fwd_ref(a);
    if (a->in[0].dtype != MR_F32) return f32_only(a, a->in[0].dtype);
    const int64_t n = a->in[0].shape.dim[0], c = a->in[0].shape.dim[1];
    const int32_t *lab = a->in[1].data;
    mr_status st = mr_xent_check_labels(a, lab, n, c);
    if (st != MR_OK) return st;
    const float *X = a->in[0].data;
    float *L = a->out[0].data, *P = a->out[1].data;
    const int64_t ign = a->p.xent.ignore_index;
    xent_row_fn row = mr_cpu_caps_get()->avx512f ? xent_row_512 : xent_row_def;
#pragma omp parallel for schedule(static) if (n * c > SM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) L[i] = row(X + i * c, P + i * c, c, lab[i], lab[i] == ign);
    return MR_OK;
}

/* probs (N,C), labels (N) i32, dloss (N) -> dlogits (N,C) */
mr_status mr_xent_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_xent_bwd_ref(a);
    if (a->in[0].dtype != MR_F32) return f32_only(a, a->in[0].dtype);
    const int64_t n = a->in[0].shape.dim[0], c = a->in[0].shape.dim[1];
    const int32_t *lab = a->in[1].data;
    mr_status st = mr_xent_check_labels(a, lab, n, c);
    if (st != MR_OK) return st;
    const float *P = a->in[0].data, *G = a->in[2].data;
    float *DX = a->out[0].data;
    const int64_t ign = a->p.xent.ignore_index;
#pragma omp parallel for schedule(static) if (n * c > SM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float *restrict p = P + i * c;
        float *restrict dx = DX + i * c;
        const float g = lab[i] == ign ? 0.0f : G[i];
#pragma omp simd
        for (int64_t j = 0; j < c; j++) dx[j] = g * p[j];
        if (lab[i] != ign) dx[lab[i]] -= g;
    }
    return MR_OK;
}
