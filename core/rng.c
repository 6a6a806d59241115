/* Philox-based random fills of host f32 buffers and the torch.nn.init initializers (see rng.h).
 *
 * Each filler loops over 128-bit Philox blocks; block j of a draw is Philox(ctr = offset + j,
 * key = seed) and gives elements 4j..4j+3, exactly as mr_philox_u32 maps them. Blocks are
 * independent, so an OpenMP loop over them gives the same bits on any thread count. */
#include "core/rng.h"
#include "core/math/philox_math.h"

#include <math.h>

/* Below this many blocks (4 elements each) a fill runs on the calling thread. */
#define RNG_PAR_MIN_BLOCKS 8192

static const double k_sqrt2 = 1.41421356237309504880;

mr_rng mr_rng_init(uint64_t seed) {
    mr_rng r = {seed, 0};
    return r;
}

static inline void philox_block(uint64_t seed, uint64_t block, uint32_t w[4]) {
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0u, 0u};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    mr_philox4x32_10(ctr, key, w);
}

static mr_status check_fill(const char *fn, const mr_rng *rng, const float *out, int64_t n) {
    if (!rng) return mr_set_error(MR_ERR_INVALID, "%s: rng is NULL", fn);
    if (n < 0) return mr_set_error(MR_ERR_INVALID, "%s: n = %lld must be >= 0", fn, (long long)n);
    if (n > 0 && !out) return mr_set_error(MR_ERR_INVALID, "%s: out is NULL for n = %lld", fn, (long long)n);
    return MR_OK;
}

static int64_t n_blocks(int64_t n) { return (n + 3) / 4; }

/* ---- the three distributions ------------------------------------------------------------------ */

static void fill_uniform(uint64_t seed, uint64_t offset, float *out, int64_t n, float lo, float span) {
    int64_t nb = n_blocks(n);
#pragma omp parallel for schedule(static) if (nb > RNG_PAR_MIN_BLOCKS)
    for (int64_t j = 0; j < nb; j++) {
        uint32_t w[4];
        philox_block(seed, offset + (uint64_t)j, w);
        int64_t base = 4 * j, cnt = n - base < 4 ? n - base : 4;
        for (int64_t l = 0; l < cnt; l++) out[base + l] = lo + span * mr_u32_to_unit_f32(w[l]);
    }
}

static void fill_normal(uint64_t seed, uint64_t offset, float *out, int64_t n, float mean, float std) {
    int64_t nb = n_blocks(n);
    const float two_pi = 6.28318530717958647692f;
#pragma omp parallel for schedule(static) if (nb > RNG_PAR_MIN_BLOCKS)
    for (int64_t j = 0; j < nb; j++) {
        uint32_t w[4];
        philox_block(seed, offset + (uint64_t)j, w);
        int64_t base = 4 * j, cnt = n - base < 4 ? n - base : 4;
        for (int64_t l = 0; l < cnt; l += 2) {
            /* u1 in (0,1] keeps the log finite; u2 in [0,1) */
            float u1 = (float)((w[l] >> 8) + 1u) * (1.0f / 16777216.0f);
            float u2 = mr_u32_to_unit_f32(w[l + 1]);
            float r = sqrtf(-2.0f * logf(u1)), t = two_pi * u2;
            out[base + l] = mean + std * (r * cosf(t));
            if (l + 1 < cnt) out[base + l + 1] = mean + std * (r * sinf(t));
        }
    }
}

/* erfinv for y in (-1, 1): Giles' approximation ("Approximating the erfinv function", GPU
 * Computing Gems, 2011; ~1e-7 relative) polished by two Newton steps on erf in double. */
static double erfinv(double y) {
    double w = -log((1.0 - y) * (1.0 + y)), p;
    if (w < 5.0) {
        w -= 2.5;
        p = 2.81022636e-08;
        p = 3.43273939e-07 + p * w;
        p = -3.5233877e-06 + p * w;
        p = -4.39150654e-06 + p * w;
        p = 0.00021858087 + p * w;
        p = -0.00125372503 + p * w;
        p = -0.00417768164 + p * w;
        p = 0.246640727 + p * w;
        p = 1.50140941 + p * w;
    } else {
        w = sqrt(w) - 3.0;
        p = -0.000200214257;
        p = 0.000100950558 + p * w;
        p = 0.00134934322 + p * w;
        p = -0.00367342844 + p * w;
        p = 0.00573950773 + p * w;
        p = -0.0076224613 + p * w;
        p = 0.00943887047 + p * w;
        p = 1.00167406 + p * w;
        p = 2.83297682 + p * w;
    }
    double x = p * y;
    for (int it = 0; it < 2; it++) x -= (erf(x) - y) / (1.12837916709551257390 * exp(-x * x));
    return x;
}

static double std_normal_cdf(double x) { return 0.5 * erfc(-x / k_sqrt2); }

static void fill_trunc_normal(uint64_t seed, uint64_t offset, float *out, int64_t n, double mean, double std,
                              double a, double b) {
    int64_t nb = n_blocks(n);
    double l = std_normal_cdf((a - mean) / std), h = std_normal_cdf((b - mean) / std);
#pragma omp parallel for schedule(static) if (nb > RNG_PAR_MIN_BLOCKS / 4)
    for (int64_t j = 0; j < nb; j++) {
        uint32_t w[4];
        philox_block(seed, offset + (uint64_t)j, w);
        int64_t base = 4 * j, cnt = n - base < 4 ? n - base : 4;
        for (int64_t k = 0; k < cnt; k++) {
            double u = ((double)(w[k] >> 8) + 0.5) * (1.0 / 16777216.0); /* (0, 1): erfinv stays finite */
            double y = 2.0 * (l + (h - l) * u) - 1.0;
            double v = mean + std * k_sqrt2 * erfinv(y);
            out[base + k] = (float)(v < a ? a : v > b ? b : v);
        }
    }
}

/* ---- public fillers ------------------------------------------------------------------------- */

mr_status mr_rng_uniform(mr_rng *rng, float *out, int64_t n, float lo, float hi) {
    mr_status st = check_fill("mr_rng_uniform", rng, out, n);
    if (st != MR_OK) return st;
    if (!(isfinite(lo) && isfinite(hi) && lo <= hi && isfinite(hi - lo)))
        return mr_set_error(MR_ERR_INVALID, "mr_rng_uniform: bounds [%g, %g) must be finite with lo <= hi",
                            (double)lo, (double)hi);
    fill_uniform(rng->seed, rng->offset, out, n, lo, hi - lo);
    rng->offset += (uint64_t)n_blocks(n);
    return MR_OK;
}

mr_status mr_rng_normal(mr_rng *rng, float *out, int64_t n, float mean, float std) {
    mr_status st = check_fill("mr_rng_normal", rng, out, n);
    if (st != MR_OK) return st;
    if (!(isfinite(mean) && isfinite(std) && std >= 0.0f))
        return mr_set_error(MR_ERR_INVALID, "mr_rng_normal: mean %g and std %g must be finite, std >= 0",
                            (double)mean, (double)std);
    fill_normal(rng->seed, rng->offset, out, n, mean, std);
    rng->offset += (uint64_t)n_blocks(n);
    return MR_OK;
}

mr_status mr_rng_trunc_normal(mr_rng *rng, float *out, int64_t n, float mean, float std, float a, float b) {
    mr_status st = check_fill("mr_rng_trunc_normal", rng, out, n);
    if (st != MR_OK) return st;
    if (!(isfinite(mean) && isfinite(std) && std > 0.0f && isfinite(a) && isfinite(b) && a < b))
        return mr_set_error(MR_ERR_INVALID,
                            "mr_rng_trunc_normal: mean %g, std %g, [a, b] = [%g, %g]: need finite values, std > 0, a < b",
                            (double)mean, (double)std, (double)a, (double)b);
    fill_trunc_normal(rng->seed, rng->offset, out, n, mean, std, a, b);
    rng->offset += (uint64_t)n_blocks(n);
    return MR_OK;
}

/* ---- torch.nn.init --------------------------------------------------------------------------- */

static mr_status check_fan(const char *fn, int64_t fan, const char *what) {
    if (fan <= 0) return mr_set_error(MR_ERR_INVALID, "%s: %s = %lld must be > 0", fn, what, (long long)fan);
    return MR_OK;
}

mr_status mr_init_glorot_uniform(mr_rng *rng, float *out, int64_t n, int64_t fan_in, int64_t fan_out) {
    mr_status st = check_fan("mr_init_glorot_uniform", fan_in, "fan_in");
    if (st == MR_OK) st = check_fan("mr_init_glorot_uniform", fan_out, "fan_out");
    if (st != MR_OK) return st;
    float s = (float)sqrt(6.0 / ((double)fan_in + (double)fan_out));
    return mr_rng_uniform(rng, out, n, -s, s);
}

mr_status mr_init_glorot_normal(mr_rng *rng, float *out, int64_t n, int64_t fan_in, int64_t fan_out) {
    mr_status st = check_fan("mr_init_glorot_normal", fan_in, "fan_in");
    if (st == MR_OK) st = check_fan("mr_init_glorot_normal", fan_out, "fan_out");
    if (st != MR_OK) return st;
    return mr_rng_normal(rng, out, n, 0.0f, (float)sqrt(2.0 / ((double)fan_in + (double)fan_out)));
}

mr_status mr_init_he_normal(mr_rng *rng, float *out, int64_t n, int64_t fan_in) {
    mr_status st = check_fan("mr_init_he_normal", fan_in, "fan_in");
    if (st != MR_OK) return st;
    return mr_rng_normal(rng, out, n, 0.0f, (float)sqrt(2.0 / (double)fan_in));
}

mr_status mr_init_he_uniform(mr_rng *rng, float *out, int64_t n, int64_t fan_in) {
    mr_status st = check_fan("mr_init_he_uniform", fan_in, "fan_in");
    if (st != MR_OK) return st;
    float s = (float)sqrt(6.0 / (double)fan_in);
    return mr_rng_uniform(rng, out, n, -s, s);
}

mr_status mr_init_lecun_normal(mr_rng *rng, float *out, int64_t n, int64_t fan_in) {
    mr_status st = check_fan("mr_init_lecun_normal", fan_in, "fan_in");
    if (st != MR_OK) return st;
    return mr_rng_normal(rng, out, n, 0.0f, (float)(1.0 / sqrt((double)fan_in)));
}
