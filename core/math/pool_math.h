/* Max pooling's window rule, shared by the reference, the CPU kernel and the CUDA kernels
 * (docs/STYLE.md rule 5): walking a window in row-major order, element v replaces the current best
 * when nothing was taken yet (arg < 0), or when the best is a number and v is larger or NaN. So
 * the first maximal element wins ties, padding (never visited) never wins, and the first NaN
 * wins and stays (NaN propagates as in PyTorch). */
#ifndef MR_MATH_POOL_MATH_H
#define MR_MATH_POOL_MATH_H

#include <stdint.h>
#include "core/math/hd.h"

/* `x != x` is the NaN test here: it is what isnan means without -ffast-math, and it needs no
 * <math.h> overload under nvcc. */
MR_HD static inline int mr_maxpool_takes_f64(double best, double v, int64_t arg) {
    return arg < 0 || (best == best && (v > best || v != v));
}

MR_HD static inline int mr_maxpool_takes_f32(float best, float v, int64_t arg) {
    return arg < 0 || (best == best && (v > best || v != v));
}

#endif
