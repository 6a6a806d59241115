/* Scaled dot-product attention, one query row at a time (MR_OP_ATTENTION, core/ops.h), written
 * once for f32 and f64 (docs/STYLE.md rule 5): core/ref/attention_ref.c runs the f64 rows (the
 * oracle), core/cpu/attention_cpu.c the f32 rows. The CUDA kernels (core/cuda/attention.cu) split a
 * row over a block's threads and share mr_attn_causal_keys_* only.
 *
 * A row sees keys j < n (n = S, or with the causal mask i + 1 + S - T for query row i). The
 * forward keeps the row's log-sum-exp of the scaled scores (lse), from which the backward
 * recomputes the probabilities p_j = exp(s_j - lse) instead of storing the (T, S) matrix. */
#ifndef MR_MATH_ATTENTION_MATH_H
#define MR_MATH_ATTENTION_MATH_H

#include <math.h>
#include <stdint.h>
#include "core/math/hd.h"

/* Keys query row i of (T queries, S keys) sees. */
MR_HD static inline int64_t mr_attn_keys(int64_t i, int64_t t, int64_t s, int causal) {
    return causal ? i + 1 + s - t : s;
}

#define MR_ATTN_DEFINE(S, T_, EXP, LOG)                                                         \
    /* q (d), k, v (n, d) -> y (d), p (n) scratch: the row's probabilities; returns lse. */      \
    MR_HD static inline T_ mr_attn_row_fwd_##S(const T_ *q, const T_ *k, const T_ *v, int64_t n, \
                                               int64_t d, T_ scale, T_ *p, T_ *y) {             \
        T_ m = -INFINITY, sum = 0;                                                              \
        for (int64_t j = 0; j < n; j++) {                                                       \
            T_ s = 0;                                                                           \
            for (int64_t c = 0; c < d; c++) s += q[c] * k[j * d + c];                           \
            p[j] = s * scale;                                                                   \
            m = p[j] > m ? p[j] : m;                                                            \
        }                                                                                       \
        for (int64_t j = 0; j < n; j++) sum += EXP(p[j] - m);                                   \
        T_ lse = m + LOG(sum);                                                                  \
        for (int64_t c = 0; c < d; c++) y[c] = 0;                                               \
        for (int64_t j = 0; j < n; j++) {                                                       \
            p[j] = EXP(p[j] - lse);                                                             \
            for (int64_t c = 0; c < d; c++) y[c] += p[j] * v[j * d + c];                        \
        }                                                                                       \
        return lse;                                                                             \
    }                                                                                           \
    /* The backward of one row: dq (d) := scale * sum_j ds_j k_j; dk_j += scale * ds_j q and    \
     * dv_j += p_j dy for j < n, with ds_j = p_j (dy.v_j - dy.y). p (n) is scratch. */           \
    MR_HD static inline void mr_attn_row_bwd_##S(const T_ *q, const T_ *k, const T_ *v,        \
                                                 const T_ *y, const T_ *dy, T_ lse, int64_t n,  \
                                                 int64_t d, T_ scale, T_ *p, T_ *dq, T_ *dk,    \
                                                 T_ *dv) {                                      \
        T_ dyy = 0;                                                                             \
        for (int64_t c = 0; c < d; c++) dyy += dy[c] * y[c];                                    \
        for (int64_t c = 0; c < d; c++) dq[c] = 0;                                              \
        for (int64_t j = 0; j < n; j++) {                                                       \
            T_ s = 0, dp = 0;                                                                   \
            for (int64_t c = 0; c < d; c++) {                                                   \
                s += q[c] * k[j * d + c];                                                       \
                dp += dy[c] * v[j * d + c];                                                     \
            }                                                                                   \
            p[j] = EXP(s * scale - lse);                                                        \
            T_ ds = p[j] * (dp - dyy) * scale;                                                  \
            for (int64_t c = 0; c < d; c++) {                                                   \
                dq[c] += ds * k[j * d + c];                                                     \
                dk[j * d + c] += ds * q[c];                                                     \
                dv[j * d + c] += p[j] * dy[c];                                                  \
            }                                                                                   \
        }                                                                                       \
    }

MR_ATTN_DEFINE(f64, double, exp, log)
MR_ATTN_DEFINE(f32, float, expf, logf)

#endif
