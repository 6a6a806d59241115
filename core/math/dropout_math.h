/* Inverted dropout's keep rule, shared by the reference, the CPU kernel and the CUDA kernel
 * (docs/STYLE.md rule 5), so every backend drops the same elements for the same (seed, offset, i). */
#ifndef MR_MATH_DROPOUT_MATH_H
#define MR_MATH_DROPOUT_MATH_H

#include <stdint.h>
#include "core/math/hd.h"
#include "core/math/philox_math.h"

/* Whether the element whose Philox word is `word` is kept at drop probability p: its 24-bit
 * uniform is >= p. The comparison is in f64 so p is never rounded to f32 first. */
MR_HD static inline int mr_dropout_keep(uint32_t word, double p) { return (double)mr_u32_to_unit_f32(word) >= p; }

#endif
