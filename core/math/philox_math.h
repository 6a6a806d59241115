/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
 * generator of cuRAND and PyTorch. Counter based: block `ctr` under `key` gives four 32-bit
 * words, so element i of any draw is computed independently of thread count and device. */
#ifndef MR_MATH_PHILOX_MATH_H
#define MR_MATH_PHILOX_MATH_H

#include <stdint.h>
#include "core/math/hd.h"

MR_HD static inline void mr_philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2],
                                          uint32_t out[4]) {
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = key_in[0], k1 = key_in[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* The 32-bit word for element `i` of the stream (seed, offset): block (i/4) at counter
 * (block + offset), lane i%4. */
MR_HD static inline uint32_t mr_philox_u32(uint64_t seed, uint64_t offset, uint64_t i) {
    uint64_t block = (i >> 2) + offset;
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0u, 0u};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    mr_philox4x32_10(ctr, key, out);
    return out[i & 3u];
}

/* Uniform in [0, 1) with 24 random bits (exactly representable in f32). */
MR_HD static inline float mr_u32_to_unit_f32(uint32_t u) { return (float)(u >> 8) * (1.0f / 16777216.0f); }

#endif
