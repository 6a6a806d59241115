/* Per-element math of the unary activations, their derivatives and the optimizer updates:
 * written once, instantiated for f32 (CPU fast path, CUDA kernels) and f64 (the reference).
 * MR_HD makes every function callable from CUDA kernels too (docs/STYLE.md rule 5). */
#ifndef MR_MATH_UNARY_MATH_H
#define MR_MATH_UNARY_MATH_H

#include <math.h>
#include <stdint.h>
#include "core/math/hd.h"

/* AdamW's bias corrections for 1-based step t, in double: bc[0] = 1 - beta1^t, bc[1] =
 * sqrt(1 - beta2^t) (the by-pointer update reads them from a table of these, optim/optim.c). */
MR_HD static inline void mr_adamw_bias_corrections(double beta1, double beta2, int64_t step, double *bc) {
    bc[0] = 1.0 - pow(beta1, (double)step);
    bc[1] = sqrt(1.0 - pow(beta2, (double)step));
}

#define MR_DEFINE_UNARY_MATH(T, S, EXP, LOG, TANH, SQRT)                                        \
    MR_HD static inline T mr_relu_##S(T x) { return x > (T)0 ? x : (T)0; }                     \
    /* d/dx relu at 0 is taken as 0, as PyTorch does */                                         \
    MR_HD static inline T mr_relu_grad_##S(T x, T dy) { return x > (T)0 ? dy : (T)0; }          \
    MR_HD static inline T mr_gelu_##S(T x) {                                                    \
        const T c = (T)0.79788456080286535588; /* sqrt(2/pi) */                                 \
        T u = c * (x + (T)0.044715 * x * x * x);                                                \
        return (T)0.5 * x * ((T)1 + TANH(u));                                                   \
    }                                                                                           \
    MR_HD static inline T mr_gelu_grad_##S(T x, T dy) {                                         \
        const T c = (T)0.79788456080286535588;                                                  \
        T x2 = x * x;                                                                           \
        T t = TANH(c * (x + (T)0.044715 * x2 * x));                                             \
        T du = c * ((T)1 + (T)(3.0 * 0.044715) * x2);                                           \
        return dy * ((T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * du);                   \
    }                                                                                           \
    MR_HD static inline T mr_tanh_##S(T x) { return TANH(x); }                                  \
    MR_HD static inline T mr_tanh_grad_##S(T y, T dy) { return dy * ((T)1 - y * y); }           \
    MR_HD static inline T mr_sigmoid_##S(T x) {                                                 \
        /* two branches so exp never overflows */                                               \
        if (x >= (T)0) return (T)1 / ((T)1 + EXP(-x));                                          \
        T e = EXP(x);                                                                           \
        return e / ((T)1 + e);                                                                  \
    }                                                                                           \
    MR_HD static inline T mr_sigmoid_grad_##S(T y, T dy) { return dy * y * ((T)1 - y); }        \
    MR_HD static inline T mr_exp_##S(T x) { return EXP(x); }                                    \
    MR_HD static inline T mr_exp_grad_##S(T y, T dy) { return dy * y; }                         \
    MR_HD static inline T mr_log_##S(T x) { return LOG(x); }                                    \
    MR_HD static inline T mr_log_grad_##S(T x, T dy) { return dy / x; }                         \
    MR_HD static inline T mr_sqrt_##S(T x) { return SQRT(x); }                                  \
    MR_HD static inline T mr_sqrt_grad_##S(T y, T dy) { return dy / ((T)2 * y); }              \
    /* torch.optim.SGD for one element; returns the new parameter, updates *buf */              \
    MR_HD static inline T mr_sgd_##S(T p, T g, T *buf, T lr, T momentum, T dampening, T wd,     \
                                      int nesterov, int first_step) {                          \
        if (wd != (T)0) g = g + wd * p;                                                         \
        if (momentum != (T)0) {                                                                 \
            T b = first_step ? g : momentum * *buf + ((T)1 - dampening) * g;                    \
            *buf = b;                                                                           \
            g = nesterov ? g + momentum * b : b;                                                \
        }                                                                                       \
        return p - lr * g;                                                                      \
    }                                                                                           \
    /* torch.optim.AdamW: the per-step constants, formed in double and rounded once to T (as      \
     * PyTorch does; forming 1 - beta2 in f32 would be 1.3e-5 relative off for beta2 = 0.999) */ \
    typedef struct mr_adamw_consts_##S {                                                        \
        T beta1, one_m_beta1, beta2, one_m_beta2, eps, decay, step_size, bc2_sqrt;              \
    } mr_adamw_consts_##S;                                                                      \
    /* bc1 = 1 - beta1^t, bc2_sqrt = sqrt(1 - beta2^t): mr_adamw_bias_corrections */           \
    MR_HD static inline mr_adamw_consts_##S mr_adamw_prepare_bc_##S(double lr, double beta1, double beta2, \
                                                                    double eps, double wd, double bc1, \
                                                                    double bc2_sqrt) {          \
        mr_adamw_consts_##S c;                                                                  \
        c.beta1 = (T)beta1;                                                                     \
        c.one_m_beta1 = (T)(1.0 - beta1);                                                       \
        c.beta2 = (T)beta2;                                                                     \
        c.one_m_beta2 = (T)(1.0 - beta2);                                                       \
        c.eps = (T)eps;                                                                         \
        c.decay = (T)(1.0 - lr * wd);                                                           \
        c.step_size = (T)(lr / bc1);                                                            \
        c.bc2_sqrt = (T)bc2_sqrt;                                                               \
        return c;                                                                               \
    }                                                                                           \
    MR_HD static inline mr_adamw_consts_##S mr_adamw_prepare_##S(double lr, double beta1, double beta2, \
                                                                 double eps, double wd, int64_t step) { \
        double bc[2];                                                                           \
        mr_adamw_bias_corrections(beta1, beta2, step, bc);                                      \
        return mr_adamw_prepare_bc_##S(lr, beta1, beta2, eps, wd, bc[0], bc[1]);                \
    }                                                                                           \
    /* one element: returns the new parameter, updates *m and *v */                            \
    MR_HD static inline T mr_adamw_##S(T p, T g, T *m, T *v, mr_adamw_consts_##S c) {          \
        p = p * c.decay;                                                                        \
        T mm = c.beta1 * *m + c.one_m_beta1 * g;                                                \
        T vv = c.beta2 * *v + c.one_m_beta2 * g * g;                                            \
        *m = mm;                                                                                \
        *v = vv;                                                                                \
        T denom = SQRT(vv) / c.bc2_sqrt + c.eps;                                                \
        return p - c.step_size * mm / denom;                                                    \
    }

MR_DEFINE_UNARY_MATH(float, f32, expf, logf, tanhf, sqrtf)
MR_DEFINE_UNARY_MATH(double, f64, exp, log, tanh, sqrt)

#endif
