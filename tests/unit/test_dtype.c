/* Tests of core/dtype.h: sizes, names and parsing, and the f16/bf16 conversions
 * (core/math/half_math.h, exported as mr_float_to_f16 etc.):
 *  - every f16 and bf16 bit pattern widened to f32 and narrowed back is the identity (NaN stays
 *    NaN, quiet, same sign), and the widened value equals an independent decoding;
 *  - f32 -> f16 and f32 -> bf16 against an independent reference written here with frexp/ldexp
 *    arithmetic in long double (round to nearest, ties to even), over subnormals, exact ties,
 *    overflow, infinities, signed zeros, NaN, and 10 million random f32 bit patterns. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "core/dtype.h"
#include "core/math/philox_math.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A binary format with `mbits` stored mantissa bits and exponent bias `bias` (max exponent
 * bias, min normal exponent 1 - bias). */
typedef struct fmt {
    int mbits, ebits, bias;
} fmt;
static const fmt k_f16 = {10, 5, 15}, k_bf16 = {7, 8, 127};

/* Decodes a pattern of format f to its value (independent of half_math.h). */
static long double ref_decode(fmt f, uint16_t h) {
    int sign = (h >> (f.mbits + f.ebits)) & 1;
    int e = (h >> f.mbits) & ((1 << f.ebits) - 1);
    int m = h & ((1 << f.mbits) - 1);
    long double v;
    if (e == (1 << f.ebits) - 1) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexpl((long double)m, 1 - f.bias - f.mbits);
    else v = ldexpl((long double)((1 << f.mbits) + m), e - f.bias - f.mbits);
    return sign ? -v : v;
}

/* Rounds x to format f (nearest, ties to even) and encodes it: the value is split with frexpl,
 * scaled so one unit is the format's ulp at that exponent (the subnormal ulp below the normal
 * range), rounded to an integer by comparing the fraction with 1/2, and re-encoded. */
static uint16_t ref_encode(fmt f, float xf) {
    uint16_t sign = signbit(xf) ? (uint16_t)(1u << (f.mbits + f.ebits)) : 0;
    uint16_t inf = (uint16_t)(((1u << f.ebits) - 1) << f.mbits);
    if (isnan(xf)) return sign | inf | (uint16_t)(1u << (f.mbits - 1));
    long double x = fabsl((long double)xf);
    if (isinf(xf)) return sign | inf;
    if (x == 0) return sign;
    int e;
    frexpl(x, &e);                   /* x = m * 2^e, m in [0.5, 1): exponent of x is e-1 */
    int E = e - 1 < 1 - f.bias ? 1 - f.bias : e - 1;
    long double q = ldexpl(x, f.mbits - E); /* x in units of the ulp at exponent E (exact) */
    long double fl = floorl(q), frac = q - fl;
    if (frac > 0.5L || (frac == 0.5L && fmodl(fl, 2.0L) == 1.0L)) fl += 1.0L;
    long double v = ldexpl(fl, E - f.mbits);
    long double maxv = ldexpl((long double)((2 << f.mbits) - 1), f.bias - f.mbits);
    if (v > maxv) return sign | inf;
    if (v < ldexpl(1.0L, 1 - f.bias)) return sign | (uint16_t)fl; /* subnormal (or 0): fl ulps */
    frexpl(v, &e);
    int be = e - 1 + f.bias;
    long double mant = ldexpl(v, f.mbits - (e - 1)) - ldexpl(1.0L, f.mbits);
    return sign | (uint16_t)(be << f.mbits) | (uint16_t)mant;
}

static int is_nan_pattern(fmt f, uint16_t h) {
    uint16_t mag = h & (uint16_t)((1u << (f.mbits + f.ebits)) - 1);
    return mag > (((1u << f.ebits) - 1) << f.mbits);
}

static uint16_t narrow(fmt f, float x) { return f.mbits == 10 ? mr_float_to_f16(x) : mr_float_to_bf16(x); }
static float widen(fmt f, uint16_t h) { return f.mbits == 10 ? mr_f16_to_float(h) : mr_bf16_to_float(h); }

/* Checks x against the reference; NaN results must be NaN with x's sign and the quiet bit. */
static void check_one(fmt f, float x) {
    uint16_t got = narrow(f, x), want = ref_encode(f, x);
    const char *name = f.mbits == 10 ? "f16" : "bf16";
    if (isnan(x)) {
        uint16_t sign = (uint16_t)(1u << (f.mbits + f.ebits)), qbit = (uint16_t)(1u << (f.mbits - 1));
        if (!is_nan_pattern(f, got) || !(got & qbit) || ((got & sign) != 0) != (signbit(x) != 0))
            fail_msg("%s(NaN 0x%08x) = 0x%04x: not a quiet NaN of the same sign", name, f32_bits(x), got);
        return;
    }
    if (got != want)
        fail_msg("%s(%.10g = 0x%08x) = 0x%04x, reference 0x%04x", name, (double)x, f32_bits(x), got, want);
}

/* ---- exhaustive over 16-bit patterns ----------------------------------------------------------- */

static void test_half_exhaustive_round_trip(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++) {
        fmt f = k ? k_bf16 : k_f16;
        for (uint32_t p = 0; p < 65536; p++) {
            uint16_t h = (uint16_t)p;
            float x = widen(f, h);
            long double want = ref_decode(f, h);
            uint16_t back = narrow(f, x);
            if (is_nan_pattern(f, h)) {
                if (!isnan(x) || (signbit(x) != 0) != ((h >> 15) != 0)) fail_msg("NaN 0x%04x widens to %g", h, (double)x);
                if (!is_nan_pattern(f, back) || (back >> 15) != (h >> 15))
                    fail_msg("NaN 0x%04x comes back as 0x%04x", h, back);
                continue;
            }
            if ((long double)x != want || (signbit(x) != 0) != ((h >> 15) != 0))
                fail_msg("0x%04x widens to %.10g, want %.10Lg", h, (double)x, want);
            if (back != h) fail_msg("0x%04x -> %.10g -> 0x%04x (%s)", h, (double)x, back, k ? "bf16" : "f16");
            check_one(f, x);
        }
    }
}

/* ---- narrowing: chosen cases -------------------------------------------------------------------- */

static void test_f16_cases(void **state) {
    (void)state;
    static const struct {
        float x;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3c00}, {-2.0f, 0xc000},
        {65504.0f, 0x7bff},               /* largest finite */
        {65519.99f, 0x7bff},              /* just below the overflow tie */
        {65520.0f, 0x7c00},               /* the tie between 65504 and 2^16 rounds to even: inf */
        {-65520.0f, 0xfc00}, {1e9f, 0x7c00}, {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
        {0x1p-14f, 0x0400},               /* smallest normal */
        {0x1p-24f, 0x0001},               /* smallest subnormal */
        {0x1p-25f, 0x0000},               /* half of it: tie to even (0) */
        {0x1.8p-24f, 0x0002},             /* 1.5 ulp: tie to even (2) */
        {0x1.4p-24f, 0x0001},             /* 1.25 ulp */
        {0x1.000002p-25f, 0x0001},        /* just above half the smallest subnormal */
        {-0x1p-26f, 0x8000},
        {1.00048828125f, 0x3c00},         /* 1 + 2^-11: tie, even is 1.0 */
        {1.00146484375f, 0x3c02},         /* 1 + 3*2^-11: tie, even is 1 + 2^-9 */
        {1.0009765625f, 0x3c01},          /* 1 + 2^-10: exact */
        {0x1.ffcp-15f, 0x0400},           /* tie between the largest subnormal and 2^-14: even (up) */
        {0x1.ff8p-15f, 0x03ff},           /* largest subnormal, exact */
        {0x1.ffap-15f, 0x03ff},           /* a quarter ulp above it */
        {2049.0f, 0x6800},                /* tie at ulp 2: even is 2048 */
        {2051.0f, 0x6802},                /* tie: even is 2052 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = mr_float_to_f16(cases[i].x);
        if (got != cases[i].h) fail_msg("f16(%a) = 0x%04x, want 0x%04x", (double)cases[i].x, got, cases[i].h);
        check_one(k_f16, cases[i].x);
    }
    check_one(k_f16, NAN);
    check_one(k_f16, -NAN);
    check_one(k_f16, bits_f32(0x7f800001u)); /* signalling NaN with a payload only in low bits */
    check_one(k_f16, bits_f32(0xffbfffffu));
}

static void test_bf16_cases(void **state) {
    (void)state;
    static const struct {
        float x;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3f80}, {-2.0f, 0xc000},
        {1.00390625f, 0x3f80},            /* 1 + 2^-8: tie, even is 1.0 */
        {1.01171875f, 0x3f82},            /* 1 + 3*2^-8: tie, even is 1 + 2^-6 */
        {1.0078125f, 0x3f81},             /* 1 + 2^-7: exact */
        {FLT_MAX, 0x7f80},                /* rounds past the largest bf16 (0x1.fep127): inf */
        {0x1.fep127f, 0x7f7f},            /* largest finite */
        {0x1.fdp127f, 0x7f7e},            /* tie between 0x7f7e and 0x7f7f: even */
        {0x1.ffp127f, 0x7f80},            /* tie between the largest and 2^128: even is inf */
        {INFINITY, 0x7f80}, {-INFINITY, 0xff80},
        {0x1p-126f, 0x0080},              /* smallest normal */
        {0x1p-133f, 0x0001},              /* smallest bf16 subnormal */
        {0x1p-134f, 0x0000},              /* tie to even */
        {0x1.8p-133f, 0x0002},            /* tie to even */
        {0x1p-149f, 0x0000},              /* smallest f32 subnormal */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = mr_float_to_bf16(cases[i].x);
        if (got != cases[i].h) fail_msg("bf16(%a) = 0x%04x, want 0x%04x", (double)cases[i].x, got, cases[i].h);
        check_one(k_bf16, cases[i].x);
    }
    check_one(k_bf16, NAN);
    check_one(k_bf16, -NAN);
    check_one(k_bf16, bits_f32(0x7f800001u));
    check_one(k_bf16, bits_f32(0xff80ffffu));
}

/* Every f32 whose low bits make it an exact tie (or one ulp either side of a tie) for f16 and for
 * bf16, across every exponent and both signs, and every f32 in the f16 subnormal range. */
static void test_narrow_ties_and_subnormals(void **state) {
    (void)state;
    for (uint32_t sign = 0; sign < 2; sign++) {
        for (uint32_t e = 0; e < 255; e++) {
            for (uint32_t hi = 0; hi < 64; hi++) {
                for (int d = -1; d <= 1; d++) {
                    /* f16 drops 13 bits (more below 2^-14), bf16 drops 16: tie = the dropped part is 100..0 */
                    uint32_t m16 = ((hi * 0x1357u) << 13 | 0x1000u) & 0x7fffffu;
                    uint32_t mbf = ((hi * 0x35u) << 16 | 0x8000u) & 0x7fffffu;
                    uint32_t u16 = (sign << 31) | (e << 23) | (uint32_t)((int32_t)m16 + d);
                    uint32_t ubf = (sign << 31) | (e << 23) | (uint32_t)((int32_t)mbf + d);
                    check_one(k_f16, bits_f32(u16 & 0xffffffffu));
                    check_one(k_bf16, bits_f32(ubf));
                }
            }
        }
    }
    /* f32 in [2^-26, 2^-14), the f16 subnormal range and a bit below, every 37th pattern */
    for (uint32_t u = 0x32800000u; u < 0x38800000u; u += 37) {
        check_one(k_f16, bits_f32(u));
        check_one(k_f16, bits_f32(u | 0x80000000u));
    }
}

/* 10 million random f32 bit patterns (Philox), both conversions. */
static void test_narrow_random(void **state) {
    (void)state;
    const int64_t n = th_quick() ? 2000000 : 10000000;
    for (int64_t i = 0; i < n; i++) {
        float x = bits_f32(mr_philox_u32(0xd7e5, 0, (uint64_t)i));
        check_one(k_f16, x);
        check_one(k_bf16, x);
    }
}

/* ---- sizes, names, parsing --------------------------------------------------------------------- */

static void test_dtype_size_name_parse(void **state) {
    (void)state;
    static const struct {
        mr_dtype t;
        size_t size;
        const char *name;
        int is_float;
    } k[] = {{MR_F32, 4, "f32", 1}, {MR_F64, 8, "f64", 1}, {MR_F16, 2, "f16", 1}, {MR_BF16, 2, "bf16", 1},
             {MR_I32, 4, "i32", 0}, {MR_I64, 8, "i64", 0}, {MR_U8, 1, "u8", 0}};
    assert_int_equal(sizeof k / sizeof *k, MR_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        assert_int_equal(mr_dtype_size(k[i].t), k[i].size);
        assert_string_equal(mr_dtype_name(k[i].t), k[i].name);
        assert_int_equal(mr_dtype_is_float(k[i].t) != 0, k[i].is_float);
        mr_dtype t = MR_DTYPE_COUNT;
        MR_ASSERT_OK(mr_dtype_parse(k[i].name, &t));
        assert_int_equal(t, k[i].t);
    }
    static const struct {
        const char *alias;
        mr_dtype t;
    } aliases[] = {{"float32", MR_F32}, {"float64", MR_F64}, {"float16", MR_F16}, {"bfloat16", MR_BF16}};
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++) {
        mr_dtype t = MR_DTYPE_COUNT;
        MR_ASSERT_OK(mr_dtype_parse(aliases[i].alias, &t));
        assert_int_equal(t, aliases[i].t);
    }
    assert_int_equal(mr_dtype_size(MR_DTYPE_COUNT), 0);
    assert_int_equal(mr_dtype_size((mr_dtype)-1), 0);
    assert_string_equal(mr_dtype_name(MR_DTYPE_COUNT), "?");
    mr_dtype t = MR_U8;
    assert_int_equal(mr_dtype_parse("f8", &t), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "f8"));
    assert_int_equal(t, MR_U8);
    assert_int_equal(mr_dtype_parse("", &t), MR_ERR_INVALID);
    assert_int_equal(mr_dtype_parse("F32", &t), MR_ERR_INVALID);
}

/* mr_dtype_get/set: float types round as the cast op does, integers truncate toward zero. */
static void test_dtype_get_set(void **state) {
    (void)state;
    uint16_t h[1];
    mr_dtype_set(h, MR_F16, 0, 1.00146484375);
    assert_int_equal(h[0], 0x3c02);
    assert_true(mr_dtype_get(h, MR_F16, 0) == 1.001953125);
    mr_dtype_set(h, MR_BF16, 0, -1.00390625);
    assert_int_equal(h[0], 0xbf80);
    int32_t i32[1];
    mr_dtype_set(i32, MR_I32, 0, -2.7);
    assert_int_equal(i32[0], -2);
    float f[1];
    mr_dtype_set(f, MR_F32, 0, 0.1);
    assert_true(f[0] == 0.1f);
    assert_true(mr_dtype_get(f, MR_F32, 0) == (double)0.1f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_exhaustive_round_trip),
        cmocka_unit_test(test_f16_cases),
        cmocka_unit_test(test_bf16_cases),
        cmocka_unit_test(test_narrow_ties_and_subnormals),
        cmocka_unit_test(test_narrow_random),
        cmocka_unit_test(test_dtype_size_name_parse),
        cmocka_unit_test(test_dtype_get_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
