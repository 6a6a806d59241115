/* Which segment of a cut buffer an element is in, written once for the CPU and the CUDA kernels of
 * mr_vec_sumsq_seg (core/vec.h; core/vec.c, core/cuda/vec.cu): nseg >= 1 segment starts, ascending,
 * seg[0] = 0; element i is in the last segment k with seg[k] <= i, so an empty segment (a start
 * repeated by the next one) holds nothing. */
#ifndef MR_MATH_SEG_MATH_H
#define MR_MATH_SEG_MATH_H

#include <stdint.h>
#include "core/math/hd.h"

MR_HD static inline int32_t mr_seg_of(const int64_t *seg, int32_t nseg, int64_t i) {
    int32_t lo = 0, hi = nseg; /* seg[lo] <= i; hi == nseg or seg[hi] > i */
    while (hi - lo > 1) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (seg[mid] <= i) lo = mid;
        else hi = mid;
    }
    return lo;
}

#endif
