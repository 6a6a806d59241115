/* f16 and bf16 conversions, bit-exact and shared by host and device code.
 *
 * f32 -> f16 and f32 -> bf16 round to nearest, ties to even; overflow gives +-inf; NaN stays NaN
 * (quiet, sign kept); f16 subnormals are produced and read exactly. These are the conversions
 * PyTorch and CUDA's __float2half_rn / __float2bfloat16_rn perform. */
#ifndef MR_MATH_HALF_MATH_H
#define MR_MATH_HALF_MATH_H

#include <stdint.h>
#include <string.h>
#include "core/math/hd.h"

MR_HD static inline uint32_t mr_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

MR_HD static inline float mr_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

MR_HD static inline uint16_t mr_f32_to_bf16(float f) {
    uint32_t u = mr_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; carries into inf on overflow */
    return (uint16_t)(u >> 16);
}

MR_HD static inline float mr_bf16_to_f32(uint16_t h) { return mr_bits_f32((uint32_t)h << 16); }

MR_HD static inline uint16_t mr_f32_to_f16(float f) {
    uint32_t u = mr_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {
        /* f16 subnormal or zero: value = m * 2^-24, m = round(a_value * 2^24) */
        if (a < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to zero (ties-even) */
        uint32_t e = a >> 23;              /* biased f32 exponent, 102..112 */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;         /* bits to drop so the result is in units of 2^-24 */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits */
    uint32_t r = a - 0x38000000u; /* (e-112)<<23 | mant */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

MR_HD static inline float mr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1fu) return mr_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return mr_bits_f32(sign);
        /* subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return mr_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

#endif
