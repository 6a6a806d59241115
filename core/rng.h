/* Random numbers for host buffers: a counter-based Philox4x32-10 stream and the weight
 * initializers of torch.nn.init built on it.
 *
 * A stream is a small value struct (seed, offset). Element i of a draw is computed from Philox
 * block (offset + i/4) under key `seed`, lane i%4 (core/math/philox_math.h, the same mapping the
 * dropout op uses), so it depends only on (seed, offset, i): the same on any thread count, and a
 * GPU kernel can reproduce it. Each filler then advances offset by ceil(n/4) blocks, so the next
 * draw continues the stream without overlap. Fillers run in parallel with OpenMP for large n.
 *
 * Every filler returns MR_ERR_INVALID (naming the function and the offending value) for n < 0,
 * out == NULL with n > 0, or a bad parameter, and then leaves the stream and out unchanged.
 * Thread safety: distinct mr_rng values may be used concurrently; one mr_rng is not shared. */
#ifndef MR_RNG_H
#define MR_RNG_H

#include <stdint.h>
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_rng {
    uint64_t seed;   /* Philox key */
    uint64_t offset; /* next unused 128-bit block of the stream */
} mr_rng;

/* A stream at the start (offset 0) for `seed`. */
mr_rng mr_rng_init(uint64_t seed);

/* out (n): uniform in [lo, hi): lo + (hi-lo)*u with u = k/2^24, k a 24-bit Philox word (f32 rounding
 * of the product can give hi itself when |hi-lo| is large against lo). Needs lo <= hi, finite. */
mr_status mr_rng_uniform(mr_rng *rng, float *out, int64_t n, float lo, float hi) MR_WUR;

/* out (n): normal N(mean, std^2) by Box-Muller: words 2j, 2j+1 of a block give u1 in (0,1] and
 * u2 in [0,1), and elements 2j, 2j+1 get r*cos(2*pi*u2), r*sin(2*pi*u2), r = sqrt(-2 ln u1).
 * |z| <= sqrt(48 ln 2) ~ 5.77 (24-bit uniforms). Needs std >= 0, finite. */
mr_status mr_rng_normal(mr_rng *rng, float *out, int64_t n, float mean, float std) MR_WUR;

/* out (n): normal N(mean, std^2) truncated to [a, b], by inverting the CDF as
 * torch.nn.init.trunc_normal_ does: with l = Phi((a-mean)/std), h = Phi((b-mean)/std), each
 * element is mean + std*sqrt(2)*erfinv(2*(l + (h-l)*u) - 1), clamped to [a, b] (u uniform in
 * (0,1)). Needs std > 0 and a < b. */
mr_status mr_rng_trunc_normal(mr_rng *rng, float *out, int64_t n, float mean, float std, float a, float b) MR_WUR;

/* torch.nn.init.xavier_uniform_ (gain 1): U(-s, s), s = sqrt(6 / (fan_in + fan_out)). */
mr_status mr_init_glorot_uniform(mr_rng *rng, float *out, int64_t n, int64_t fan_in, int64_t fan_out) MR_WUR;
/* torch.nn.init.xavier_normal_ (gain 1): N(0, s^2), s = sqrt(2 / (fan_in + fan_out)). */
mr_status mr_init_glorot_normal(mr_rng *rng, float *out, int64_t n, int64_t fan_in, int64_t fan_out) MR_WUR;
/* torch.nn.init.kaiming_normal_(mode='fan_in', nonlinearity='relu'): N(0, s^2), s = sqrt(2/fan_in). */
mr_status mr_init_he_normal(mr_rng *rng, float *out, int64_t n, int64_t fan_in) MR_WUR;
/* torch.nn.init.kaiming_uniform_(mode='fan_in', nonlinearity='relu'): U(-s, s), s = sqrt(6/fan_in). */
mr_status mr_init_he_uniform(mr_rng *rng, float *out, int64_t n, int64_t fan_in) MR_WUR;
/* LeCun normal, i.e. torch.nn.init.kaiming_normal_(mode='fan_in', nonlinearity='linear'):
 * N(0, s^2), s = 1/sqrt(fan_in). */
mr_status mr_init_lecun_normal(mr_rng *rng, float *out, int64_t n, int64_t fan_in) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
