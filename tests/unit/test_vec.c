/* core/vec.h's finite check per segment on the CPU (mr_vec_sumsq_seg): its sum is mr_vec_sumsq's,
 * bit for bit, for any thread count; an all-finite pass writes no flag (a sentinel survives); an
 * inf or a NaN anywhere (a segment's first or last element, across the 8192-element blocks, after
 * empty segments, in the buffer's last element) flags exactly its segment; the argument errors.
 * The CUDA kernel is checked against this one in tests/gpu/test_gpu_vec.c (emu.test_gpu_vec). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "harness.h"
#include "core/vec.h"

enum { N = 100003, NSEG = 9 };

/* Segments like a model's: a small one, empties (repeated starts), one across block boundaries,
 * the tail; and where each starts. */
static const int64_t SEG[NSEG] = {0, 10, 10, 10, 8190, 8193, 40000, 99999, 99999};

static float *values(void) {
    float *x = th_alloc(sizeof *x * N);
    uint64_t r = 12345;
    for (int64_t i = 0; i < N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 8.0 - 4.0); /* [-4, 4) */
    }
    return x;
}

static void test_sum_is_sumsq(void **state) {
    (void)state;
    float *x = values();
    int32_t bad[NSEG];
    for (int k = 0; k < NSEG; k++) bad[k] = 5; /* not written by an all-finite pass */
    double plain = 0, seg = 0;
    MR_ASSERT_OK(mr_vec_sumsq(mr_device_cpu(), NULL, x, N, NULL, &plain));
    MR_ASSERT_OK(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, N, SEG, NSEG, bad, NULL, &seg));
    assert_memory_equal(&plain, &seg, sizeof plain);
    for (int k = 0; k < NSEG; k++) assert_int_equal(bad[k], 5);
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    double one = 0;
    MR_ASSERT_OK(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, N, SEG, NSEG, bad, NULL, &one));
    omp_set_num_threads(threads);
    assert_memory_equal(&plain, &one, sizeof plain);
#endif
    th_free_all();
}

/* x with v at each of at[] (nat), flags from zero: exactly want[] set, and the sum not finite. */
static void check_flags(const char *what, const int64_t *at, int nat, float v, const int32_t *want) {
    float *x = values();
    for (int j = 0; j < nat; j++) x[at[j]] = v;
    int32_t bad[NSEG] = {0};
    double sum = 0;
    MR_ASSERT_OK(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, N, SEG, NSEG, bad, NULL, &sum));
    assert_false(isfinite(sum));
    for (int k = 0; k < NSEG; k++) {
        if (bad[k] != want[k]) fprintf(stderr, "%s: segment %d flagged %d, want %d\n", what, k, bad[k], want[k]);
        assert_int_equal(bad[k], want[k]);
    }
    th_free_all();
}

static void test_flags(void **state) {
    (void)state;
    {
        const int64_t at[] = {0};
        const int32_t want[NSEG] = {1, 0, 0, 0, 0, 0, 0, 0, 0};
        check_flags("first element", at, 1, INFINITY, want);
    }
    {
        const int64_t at[] = {9, 10}; /* the last of segment 0, the first after the empties */
        const int32_t want[NSEG] = {1, 0, 0, 1, 0, 0, 0, 0, 0};
        check_flags("boundary after empty segments", at, 2, NAN, want);
    }
    {
        const int64_t at[] = {8191, 8192}; /* one segment, two blocks */
        const int32_t want[NSEG] = {0, 0, 0, 0, 1, 0, 0, 0, 0};
        check_flags("across a block boundary", at, 2, -INFINITY, want);
    }
    {
        const int64_t at[] = {8193, 39999, 40000, N - 1};
        const int32_t want[NSEG] = {0, 0, 0, 0, 0, 1, 1, 0, 1};
        check_flags("first, last and the buffer's last", at, 4, INFINITY, want);
    }
}

static void test_errors(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4};
    int32_t bad[2] = {0, 0};
    const int64_t seg[2] = {0, 2}, off[2] = {1, 2};
    double sum = 0;
    assert_int_equal(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, 4, seg, 0, bad, NULL, &sum), MR_ERR_INVALID);
    assert_int_equal(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, 4, NULL, 2, bad, NULL, &sum), MR_ERR_INVALID);
    assert_int_equal(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, 4, seg, 2, NULL, NULL, &sum), MR_ERR_INVALID);
    assert_int_equal(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, 4, off, 2, bad, NULL, &sum), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "starts at 1"));
    assert_int_equal(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, -1, seg, 2, bad, NULL, &sum), MR_ERR_INVALID);
    MR_ASSERT_OK(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, 0, seg, 2, bad, NULL, &sum)); /* empty part */
    assert_true(sum == 0.0 && bad[0] == 0 && bad[1] == 0);
    MR_ASSERT_OK(mr_vec_sumsq_seg(mr_device_cpu(), NULL, x, 4, seg, 2, bad, NULL, &sum));
    assert_true(sum == 30.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sum_is_sumsq), cmocka_unit_test(test_flags),
                                       cmocka_unit_test(test_errors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
