/* Per-element math of layer norm, once for f32 (CPU fast path, CUDA kernels) and f64 (the
 * reference, CUDA f64 kernels); MR_HD makes it callable from CUDA kernels too (docs/STYLE.md rule 5).
 * The row statistics (mean m, rstd r = 1/sqrt(var + eps); for the backward the row means
 * sg = mean(dy * gamma) and sgx = mean(dy * gamma * xhat)) are reductions each backend does its
 * own way; these are the steps applied per element once they are known. */
#ifndef MR_MATH_LAYERNORM_MATH_H
#define MR_MATH_LAYERNORM_MATH_H

#include "core/math/hd.h"

#define MR_DEFINE_LAYERNORM_MATH(T, S)                                                          \
    /* y = xhat * gamma + beta with xhat = (x - m) * r */                                       \
    MR_HD static inline T mr_layernorm_y_##S(T x, T m, T r, T gamma, T beta) {                  \
        return (x - m) * r * gamma + beta;                                                      \
    }                                                                                           \
    /* dx = r * (dy * gamma - sg - xhat * sgx) */                                               \
    MR_HD static inline T mr_layernorm_dx_##S(T x, T m, T r, T dy, T gamma, T sg, T sgx) {      \
        return r * (dy * gamma - sg - (x - m) * r * sgx);                                       \
    }

MR_DEFINE_LAYERNORM_MATH(float, f32)
MR_DEFINE_LAYERNORM_MATH(double, f64)

#endif
