/* Tests of core/rng.h: Philox4x32-10 against the Random123 known-answer vectors, the element
 * mapping shared with mr_philox_u32, identical output on 1 and 2 threads, the moments of the
 * uniform, normal and truncated normal fills within statistical bounds, the initializers'
 * bounds and standard deviations, the offset advance, and the argument errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "harness.h"
#include "core/math/philox_math.h"
#include "core/rng.h"

/* Random123's kat_vectors for philox4x32_10. */
static void test_philox_known_answers(void **state) {
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (size_t k = 0; k < sizeof kat / sizeof *kat; k++) {
        uint32_t out[4];
        mr_philox4x32_10(kat[k].ctr, kat[k].key, out);
        for (int i = 0; i < 4; i++)
            if (out[i] != kat[k].out[i]) fail_msg("vector %zu word %d: 0x%08x, want 0x%08x", k, i, out[i], kat[k].out[i]);
    }
}

/* Element i of a uniform draw is lo + (hi-lo) * unit(mr_philox_u32(seed, offset, i)): the same
 * mapping as the dropout mask and the harness, so a GPU kernel can reproduce it. */
static void test_rng_element_mapping(void **state) {
    (void)state;
    enum { N = 1003 };
    static float x[N];
    mr_rng r = mr_rng_init(0x123456789abcdefull);
    r.offset = 77;
    MR_ASSERT_OK(mr_rng_uniform(&r, x, N, -2.0f, 3.0f));
    for (int64_t i = 0; i < N; i++) {
        float want = -2.0f + 5.0f * mr_u32_to_unit_f32(mr_philox_u32(0x123456789abcdefull, 77, (uint64_t)i));
        if (x[i] != want) fail_msg("element %lld: %.9g, want %.9g", (long long)i, x[i], want);
    }
    assert_int_equal(r.offset, 77 + (N + 3) / 4);
}

typedef mr_status (*fill_fn)(mr_rng *rng, float *out, int64_t n, int which);

static mr_status fill_which(mr_rng *rng, float *out, int64_t n, int which) {
    switch (which) {
    case 0: return mr_rng_uniform(rng, out, n, -1.0f, 1.0f);
    case 1: return mr_rng_normal(rng, out, n, 0.5f, 2.0f);
    case 2: return mr_rng_trunc_normal(rng, out, n, 0.0f, 1.0f, -2.0f, 2.0f);
    case 3: return mr_init_glorot_uniform(rng, out, n, 300, 500);
    case 4: return mr_init_he_normal(rng, out, n, 256);
    default: return mr_init_lecun_normal(rng, out, n, 100);
    }
}

/* Large fills (the threaded path) give the same bits on 1 and 2 threads. */
static void test_rng_thread_invariance(void **state) {
    (void)state;
    const int64_t n = 400003;
    float *a = th_alloc((size_t)n * sizeof(float)), *b = th_alloc((size_t)n * sizeof(float));
#ifdef _OPENMP
    int saved = omp_get_max_threads();
#endif
    for (int which = 0; which < 6; which++) {
        mr_rng r1 = mr_rng_init(42), r2 = mr_rng_init(42);
#ifdef _OPENMP
        omp_set_num_threads(1);
#endif
        MR_ASSERT_OK(fill_which(&r1, a, n, which));
#ifdef _OPENMP
        omp_set_num_threads(2);
#endif
        MR_ASSERT_OK(fill_which(&r2, b, n, which));
        if (memcmp(a, b, (size_t)n * sizeof(float))) fail_msg("fill %d differs between 1 and 2 threads", which);
        assert_true(r1.offset == r2.offset);
    }
#ifdef _OPENMP
    omp_set_num_threads(saved);
#endif
    th_free_all();
}

/* Sample mean and variance. */
static void moments(const float *x, int64_t n, double *mean, double *var) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    double m = s / (double)n;
    for (int64_t i = 0; i < n; i++) s2 += (x[i] - m) * (x[i] - m);
    *mean = m;
    *var = s2 / (double)(n - 1);
}

/* |sample mean - mu| within 5 standard errors, |sample var - var| within 5 standard errors of
 * the variance (sqrt((mu4 - var^2)/n)): a false alarm has probability ~6e-7 per check. */
static void check_moments(const char *what, const float *x, int64_t n, double mu, double var, double mu4) {
    double m, v;
    moments(x, n, &m, &v);
    double se_m = sqrt(var / (double)n), se_v = sqrt((mu4 - var * var) / (double)n);
    if (fabs(m - mu) > 5 * se_m || fabs(v - var) > 5 * se_v)
        fail_msg("%s: mean %.6g (want %.6g +- %.2g), var %.6g (want %.6g +- %.2g)", what, m, mu, 5 * se_m, v, var,
                 5 * se_v);
}

static void test_rng_moments(void **state) {
    (void)state;
    const int64_t n = 1000000;
    float *x = th_alloc((size_t)n * sizeof(float));
    mr_rng r = mr_rng_init(2024);

    /* U(-1, 3): mean 1, var 16/12, fourth central moment 16^2/80 */
    MR_ASSERT_OK(mr_rng_uniform(&r, x, n, -1.0f, 3.0f));
    for (int64_t i = 0; i < n; i++)
        if (!(x[i] >= -1.0f && x[i] < 3.0f)) fail_msg("uniform element %lld = %.9g outside [-1, 3)", (long long)i, x[i]);
    check_moments("uniform(-1,3)", x, n, 1.0, 16.0 / 12.0, 256.0 / 80.0);

    /* N(0.5, 2^2): fourth central moment 3 sigma^4 */
    MR_ASSERT_OK(mr_rng_normal(&r, x, n, 0.5f, 2.0f));
    check_moments("normal(0.5,2)", x, n, 0.5, 4.0, 3.0 * 16.0);
    /* tail: P(|z| > 3) = 0.0026998 */
    int64_t tail = 0;
    for (int64_t i = 0; i < n; i++) tail += fabsf(x[i] - 0.5f) > 6.0f;
    double pt = 0.0026997960632601866, se = sqrt(pt * (1 - pt) / (double)n);
    if (fabs((double)tail / (double)n - pt) > 5 * se) fail_msg("normal tail fraction %.6g, want %.6g", (double)tail / n, pt);

    /* N(0,1) truncated to [-1, 2]: with phi/Phi the standard pdf/cdf, Z = Phi(2) - Phi(-1),
     * mean = (phi(-1) - phi(2))/Z, var = 1 + (-1*phi(-1) - 2*phi(2))/Z - mean^2. */
    MR_ASSERT_OK(mr_rng_trunc_normal(&r, x, n, 0.0f, 1.0f, -1.0f, 2.0f));
    for (int64_t i = 0; i < n; i++)
        if (!(x[i] >= -1.0f && x[i] <= 2.0f)) fail_msg("trunc_normal element %lld = %.9g outside [-1, 2]", (long long)i, x[i]);
    double phi_a = exp(-0.5) / sqrt(2 * M_PI), phi_b = exp(-2.0) / sqrt(2 * M_PI);
    double z = 0.5 * erfc(-2.0 / sqrt(2.0)) - 0.5 * erfc(1.0 / sqrt(2.0));
    double tm = (phi_a - phi_b) / z, tv = 1 + (-1.0 * phi_a - 2.0 * phi_b) / z - tm * tm;
    /* fourth moment bounded by that of the range: use 3 var^2 (the normal's), generous here */
    check_moments("trunc_normal(0,1,[-1,2])", x, n, tm, tv, 3 * tv * tv);
    th_free_all();
}

static void test_rng_initializers(void **state) {
    (void)state;
    const int64_t n = 300001;
    float *x = th_alloc((size_t)n * sizeof(float));
    mr_rng r = mr_rng_init(7);
    double m, v;

    /* xavier_uniform_: bound sqrt(6/(fan_in+fan_out)), variance bound^2/3 = 2/(fan_in+fan_out) */
    double s = sqrt(6.0 / (300 + 500));
    MR_ASSERT_OK(mr_init_glorot_uniform(&r, x, n, 300, 500));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(x[i]) <= s)) fail_msg("glorot_uniform element %lld = %g outside +-%g", (long long)i, x[i], s);
    check_moments("glorot_uniform", x, n, 0.0, s * s / 3.0, s * s * s * s / 5.0);
    moments(x, n, &m, &v);
    print_message("glorot_uniform(300,500): std %.6f, want %.6f\n", sqrt(v), sqrt(2.0 / 800));

    /* kaiming_uniform_ (relu, fan_in): bound sqrt(6/fan_in) */
    s = sqrt(6.0 / 64);
    MR_ASSERT_OK(mr_init_he_uniform(&r, x, n, 64));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(x[i]) <= s)) fail_msg("he_uniform element %lld = %g outside +-%g", (long long)i, x[i], s);
    check_moments("he_uniform", x, n, 0.0, s * s / 3.0, s * s * s * s / 5.0);

    /* normals: std sqrt(2/(fi+fo)), sqrt(2/fan_in), 1/sqrt(fan_in) */
    double sd = sqrt(2.0 / (300 + 500));
    MR_ASSERT_OK(mr_init_glorot_normal(&r, x, n, 300, 500));
    check_moments("glorot_normal", x, n, 0.0, sd * sd, 3 * sd * sd * sd * sd);
    sd = sqrt(2.0 / 256);
    MR_ASSERT_OK(mr_init_he_normal(&r, x, n, 256));
    check_moments("he_normal", x, n, 0.0, sd * sd, 3 * sd * sd * sd * sd);
    sd = 1.0 / sqrt(100);
    MR_ASSERT_OK(mr_init_lecun_normal(&r, x, n, 100));
    check_moments("lecun_normal", x, n, 0.0, sd * sd, 3 * sd * sd * sd * sd);
    th_free_all();
}

/* Two consecutive draws of n and m equal one draw of n + m when n is a multiple of 4 (the
 * offset moves by whole blocks), and differ from each other; an odd n skips the rest of its
 * last block, so the next draw still starts fresh. */
static void test_rng_offset_advance(void **state) {
    (void)state;
    enum { N = 1000, M = 999 };
    static float one[N + M], a[N], b[M], c[7], d[5];
    mr_rng r = mr_rng_init(99), s = mr_rng_init(99);
    MR_ASSERT_OK(mr_rng_normal(&r, a, N, 0.0f, 1.0f));
    assert_int_equal(r.offset, N / 4);
    MR_ASSERT_OK(mr_rng_normal(&r, b, M, 0.0f, 1.0f));
    assert_int_equal(r.offset, N / 4 + (M + 3) / 4);
    MR_ASSERT_OK(mr_rng_normal(&s, one, N + M, 0.0f, 1.0f));
    assert_memory_equal(one, a, sizeof a);
    assert_memory_equal(one + N, b, sizeof b);
    int same = 0;
    for (int i = 0; i < M; i++) same += a[i] == b[i];
    assert_true(same < 5);

    /* n = 7 advances 2 blocks: the next draw is block 2, not the unused lane 7 */
    mr_rng t = mr_rng_init(5), u = mr_rng_init(5);
    MR_ASSERT_OK(mr_rng_uniform(&t, c, 7, 0.0f, 1.0f));
    assert_int_equal(t.offset, 2);
    MR_ASSERT_OK(mr_rng_uniform(&t, d, 5, 0.0f, 1.0f));
    for (int i = 0; i < 5; i++) assert_true(d[i] == mr_u32_to_unit_f32(mr_philox_u32(5, 2, (uint64_t)i)));
    /* a seed change gives another stream */
    mr_rng w = mr_rng_init(6);
    MR_ASSERT_OK(mr_rng_uniform(&w, c, 7, 0.0f, 1.0f));
    MR_ASSERT_OK(mr_rng_uniform(&u, d, 5, 0.0f, 1.0f));
    assert_true(c[0] != d[0] || c[1] != d[1]);
    /* n = 0 is allowed and does not move the stream */
    MR_ASSERT_OK(mr_rng_uniform(&u, NULL, 0, 0.0f, 1.0f));
    assert_int_equal(u.offset, 2);
}

static void expect_invalid(mr_status st, const char *fn, const mr_rng *r, uint64_t offset) {
    if (st != MR_ERR_INVALID) fail_msg("%s: expected MR_ERR_INVALID, got %s", fn, mr_status_name(st));
    if (!strstr(mr_last_error(), fn)) fail_msg("error does not name %s: %s", fn, mr_last_error());
    assert_true(r->offset == offset);
}

static void test_rng_errors(void **state) {
    (void)state;
    float x[8];
    mr_rng r = mr_rng_init(1);
    expect_invalid(mr_rng_uniform(&r, x, -1, 0.0f, 1.0f), "mr_rng_uniform", &r, 0);
    expect_invalid(mr_rng_uniform(&r, NULL, 8, 0.0f, 1.0f), "mr_rng_uniform", &r, 0);
    expect_invalid(mr_rng_uniform(&r, x, 8, 1.0f, 0.0f), "mr_rng_uniform", &r, 0);
    expect_invalid(mr_rng_uniform(&r, x, 8, 0.0f, INFINITY), "mr_rng_uniform", &r, 0);
    expect_invalid(mr_rng_normal(&r, x, 8, 0.0f, -1.0f), "mr_rng_normal", &r, 0);
    expect_invalid(mr_rng_normal(&r, x, 8, NAN, 1.0f), "mr_rng_normal", &r, 0);
    expect_invalid(mr_rng_trunc_normal(&r, x, 8, 0.0f, 1.0f, 2.0f, -2.0f), "mr_rng_trunc_normal", &r, 0);
    expect_invalid(mr_rng_trunc_normal(&r, x, 8, 0.0f, 0.0f, -2.0f, 2.0f), "mr_rng_trunc_normal", &r, 0);
    expect_invalid(mr_init_glorot_uniform(&r, x, 8, 0, 10), "mr_init_glorot_uniform", &r, 0);
    expect_invalid(mr_init_glorot_normal(&r, x, 8, 10, -1), "mr_init_glorot_normal", &r, 0);
    expect_invalid(mr_init_he_normal(&r, x, 8, 0), "mr_init_he_normal", &r, 0);
    expect_invalid(mr_init_he_uniform(&r, x, 8, -3), "mr_init_he_uniform", &r, 0);
    expect_invalid(mr_init_lecun_normal(&r, x, 8, 0), "mr_init_lecun_normal", &r, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_rng_element_mapping),
        cmocka_unit_test(test_rng_thread_invariance),
        cmocka_unit_test(test_rng_moments),
        cmocka_unit_test(test_rng_initializers),
        cmocka_unit_test(test_rng_offset_advance),
        cmocka_unit_test(test_rng_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
