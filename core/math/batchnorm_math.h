/* Per-element math of batch norm, once for f32 (CPU fast path, CUDA kernels) and f64 (the
 * reference, CUDA f64 kernels); MR_HD makes it callable from CUDA kernels too (docs/STYLE.md rule 5).
 * The per-channel statistics are reductions each backend does its own way; these are the steps
 * applied per element once they are known.
 *
 * The mean comes as a pair mh + ml: f32 kernels pass mh = (float)mean and ml = (float)(mean - mh)
 * of the mean they accumulated in f64, so x - mean keeps its precision when |mean| >> std
 * (x = 1000 + noise: x - mh is exact there, and ml restores the bits of the mean that f32 drops);
 * f64 passes ml = 0. k = gamma * rstd. */
#ifndef MR_MATH_BATCHNORM_MATH_H
#define MR_MATH_BATCHNORM_MATH_H

#include "core/math/hd.h"

#define MR_DEFINE_BATCHNORM_MATH(T, S)                                                          \
    /* xhat = (x - mean) * rstd */                                                              \
    MR_HD static inline T mr_batchnorm_xhat_##S(T x, T mh, T ml, T rstd) { return ((x - mh) - ml) * rstd; } \
    /* y = (x - mean) * k + beta, k = gamma * rstd */                                           \
    MR_HD static inline T mr_batchnorm_y_##S(T x, T mh, T ml, T k, T beta) { return ((x - mh) - ml) * k + beta; } \
    /* dx = k * (dy - a - xhat * b) with a = sum(dy)/M and b = sum(dy*xhat)/M in training and    \
     * a = b = 0 in evaluation */                                                              \
    MR_HD static inline T mr_batchnorm_dx_##S(T x, T mh, T ml, T rstd, T k, T dy, T a, T b) {    \
        return k * (dy - a - mr_batchnorm_xhat_##S(x, mh, ml, rstd) * b);                        \
    }

MR_DEFINE_BATCHNORM_MATH(float, f32)
MR_DEFINE_BATCHNORM_MATH(double, f64)

#endif
