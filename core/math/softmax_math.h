/* Per-element math of softmax, log-softmax and softmax cross-entropy, once for f32 (CPU fast
 * path, CUDA kernels) and f64 (the reference, CUDA f64 kernels); MR_HD makes it callable from
 * CUDA kernels too (docs/STYLE.md rule 5). The row statistics (max m, sum s = sum exp(x - m)) are
 * reductions that each backend does its own way; these are the steps applied per element once
 * they are known. */
#ifndef MR_MATH_SOFTMAX_MATH_H
#define MR_MATH_SOFTMAX_MATH_H

#include <math.h>
#include "core/math/hd.h"

#define MR_DEFINE_SOFTMAX_MATH(T, S, EXP, LOG)                                                  \
    /* softmax: exp(x - m) times the row's 1/s (one division per row, not per element) */       \
    MR_HD static inline T mr_softmax_prob_##S(T x, T m, T inv_s) { return EXP(x - m) * inv_s; } \
    /* log-softmax with ls = log(s): (x - m) first, which is exact near the max where          \
     * m + ls would round */                                                                    \
    MR_HD static inline T mr_log_softmax_##S(T x, T m, T ls) { return (x - m) - ls; }          \
    /* softmax backward: dx = y * (dy - <dy, y>) */                                             \
    MR_HD static inline T mr_softmax_grad_##S(T y, T dy, T dot) { return y * (dy - dot); }    \
    /* log-softmax backward (y = log p): dx = dy - p * sum(dy) */                               \
    MR_HD static inline T mr_log_softmax_grad_##S(T y, T dy, T sum) { return dy - EXP(y) * sum; } \
    /* cross-entropy of one row, logsumexp(x) - x[label] = (m - x[label]) + log(s): the        \
     * difference first, exact when the label's logit is the max */                            \
    MR_HD static inline T mr_xent_loss_##S(T m, T x_label, T s) { return (m - x_label) + LOG(s); } \
    /* cross-entropy backward: dloss * (p - onehot) */                                          \
    MR_HD static inline T mr_xent_grad_##S(T dloss, T p, int is_label) {                        \
        return dloss * (p - (is_label ? (T)1 : (T)0));                                          \
    }

MR_DEFINE_SOFTMAX_MATH(float, f32, expf, logf)
MR_DEFINE_SOFTMAX_MATH(double, f64, exp, log)

#endif
