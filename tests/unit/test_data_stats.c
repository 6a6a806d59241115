/* data/ iterator statistics and autotune: the counters add up (elements delivered = what was
 * consumed, produced >= delivered), a slow consumer waits ~0 inside next() while a slow producer
 * (a map that sleeps) makes it wait; prefetch(AUTO) grows its depth under a starved consumer and
 * map(parallel AUTO) drops to one thread under a slow consumer; and an autotuned pipeline (with
 * depth and P changing mid-stream) yields byte for byte the sequence of the same pipeline with
 * fixed values, also across save/restore. */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "data/data.h"

static void sleep_us(long us) {
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

/* element i: "id" i32 [] = i, "v" f32 [16] = i + k/16 */
static mr_status gen(void *ctx, int64_t i, void *const out[]) {
    (void)ctx;
    *(int32_t *)out[0] = (int32_t)i;
    float *v = out[1];
    for (int k = 0; k < 16; k++) v[k] = (float)i + (float)k / 16.0f;
    return MR_OK;
}

/* "id" passes through, "w" = 2v + epoch; ctx: microseconds to sleep per element (long *) */
static mr_status fmap(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)index;
    if (ctx && *(const long *)ctx > 0) sleep_us(*(const long *)ctx);
    *(int32_t *)out[0] = *(const int32_t *)in[0];
    const float *v = in[1];
    float *w = out[1];
    for (int k = 0; k < 16; k++) w[k] = 2.0f * v[k] + (float)epoch;
    return MR_OK;
}

static mr_data_spec spec(void) {
    mr_data_spec s = {0};
    mr_shape sc = mr_shape_make(0, NULL), s16 = mr_shape_1d(16);
    MR_ASSERT_OK(mr_data_spec_add(&s, "id", MR_I32, &sc));
    MR_ASSERT_OK(mr_data_spec_add(&s, "v", MR_F32, &s16));
    return s;
}

#define STEP TH_DATA_STEP

/* source(n) -> [shuffle] -> map(sleep_us per element, parallel) -> batch(b) -> [prefetch] -> [repeat] */
static mr_dataset *pipeline(int64_t n, int shuffle, long *sleep, int parallel, int64_t b, int64_t prefetch,
                            int64_t repeat) {
    mr_data_spec s = spec();
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_fn(&s, n, gen, NULL, &d));
    if (shuffle) STEP(d, mr_data_shuffle(d, 37, 11, 1, &nd_));
    STEP(d, mr_data_map(d, fmap, sleep, &s, parallel, &nd_));
    STEP(d, mr_data_batch(d, b, 0, &nd_));
    if (prefetch >= 0) STEP(d, mr_data_prefetch(d, prefetch, &nd_));
    if (repeat) STEP(d, mr_data_repeat(d, repeat, &nd_));
    return d;
}

/* Pulls up to max batches (all when < 0), appending their bytes to *buf, sleeping consume_us
 * after each one (every 3rd when jitter is set, to make the consumer's rate vary). */
static int64_t drain(mr_data_iter *it, int64_t max, long consume_us, int jitter, unsigned char **buf, size_t *nb) {
    int64_t n = 0;
    while (max < 0 || n < max) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        for (int c = 0; buf && c < e.n; c++) {
            size_t b = (size_t)mr_shape_numel(&e.shape[c]) * mr_dtype_size(e.dtype[c]);
            *buf = realloc(*buf, *nb + b);
            memcpy(*buf + *nb, e.data[c], b);
            *nb += b;
        }
        n++;
        if (consume_us > 0 && (!jitter || n % 3 == 0)) sleep_us(consume_us);
    }
    return n;
}

static mr_data_stats stats_of(const mr_data_iter *it) {
    mr_data_stats st;
    MR_ASSERT_OK(mr_data_iter_stats(it, &st));
    return st;
}

static void test_counters(void **state) {
    (void)state;
    for (int pf = -1; pf <= 3; pf += 4) { /* without and with prefetch */
        mr_dataset *d = pipeline(100, 1, NULL, 2, 8, pf, 0);
        mr_data_iter *it = NULL;
        MR_ASSERT_OK(mr_data_iter_new(d, &it));
        mr_data_stats st = stats_of(it);
        assert_int_equal(st.elements, 0);
        assert_true(st.wait_s == 0 && st.elapsed_s == 0);
        int64_t got = drain(it, 5, 0, 0, NULL, NULL);
        st = stats_of(it);
        assert_int_equal(st.elements, got);
        assert_true(st.produced >= st.elements);
        got += drain(it, -1, 0, 0, NULL, NULL);
        assert_int_equal(got, 13); /* ceil(100 / 8) */
        st = stats_of(it);
        assert_int_equal(st.elements, 13);
        assert_int_equal(st.produced, 13);
        assert_int_equal(st.map_parallel, 2);
        assert_int_equal(st.prefetch, pf < 0 ? 0 : pf);
        assert_false(st.map_parallel_auto);
        assert_false(st.prefetch_auto);
        assert_true(st.producer_rate > 0 && st.produce_s > 0);
        assert_true(st.wait_s >= 0 && st.wait_s <= st.elapsed_s);
        assert_int_equal(mr_data_iter_stats(NULL, &st), MR_ERR_INVALID);
        assert_int_equal(mr_data_iter_stats(it, NULL), MR_ERR_INVALID);
        mr_data_iter_free(it);
        mr_data_free(d);
    }
}

/* A consumer slower than the pipeline finds a batch ready every time: ~0 wait. */
static void test_slow_consumer_no_wait(void **state) {
    (void)state;
    mr_dataset *d = pipeline(160, 0, NULL, 1, 8, 4, 0);
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    long consume_us = 5000;
    int64_t n = drain(it, -1, consume_us, 0, NULL, NULL);
    assert_int_equal(n, 20);
    mr_data_stats st = stats_of(it);
    double slept = 1e-6 * (double)consume_us * (double)n;
    fprintf(stderr, "slow consumer: wait %.4f s of %.3f s elapsed (slept %.3f s)\n", st.wait_s, st.elapsed_s, slept);
    assert_true(st.wait_s < 0.5 * slept); /* ~0 when idle; generous for a loaded CI machine */
    assert_true(st.elapsed_s >= 0.9 * slept);
    mr_data_iter_free(it);
    mr_data_free(d);
}

/* A producer whose map sleeps 1 ms per element starves a consumer that does nothing. */
static void test_slow_producer_waits(void **state) {
    (void)state;
    long map_us = 1000;
    for (int pf = -1; pf <= 2; pf += 3) {
        mr_dataset *d = pipeline(64, 0, &map_us, 1, 4, pf, 0);
        mr_data_iter *it = NULL;
        MR_ASSERT_OK(mr_data_iter_new(d, &it));
        assert_int_equal(drain(it, -1, 0, 0, NULL, NULL), 16);
        mr_data_stats st = stats_of(it);
        fprintf(stderr, "slow producer (prefetch %d): wait %.4f s of %.3f s, producer %.0f batches/s\n", pf, st.wait_s,
                st.elapsed_s, st.producer_rate);
        assert_true(st.wait_s > 0.5 * 64 * 1e-3); /* >= half the map's sleep */
        assert_true(st.producer_rate < 1.0 / (4 * 1e-3)); /* 4 elements of >= 1 ms per batch */
        mr_data_iter_free(it);
        mr_data_free(d);
    }
}

/* prefetch(AUTO) grows from 2 while the consumer keeps waiting, within its bound. */
static void test_autotune_depth_grows(void **state) {
    (void)state;
    long map_us = 200;
    mr_dataset *d = pipeline(256, 0, &map_us, 1, 2, MR_DATA_AUTO, 0);
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    mr_data_stats st = stats_of(it);
    assert_int_equal(st.prefetch, 2);
    assert_true(st.prefetch_auto);
    drain(it, -1, 0, 0, NULL, NULL);
    st = stats_of(it);
    fprintf(stderr, "autotuned depth under a starved consumer: %lld\n", (long long)st.prefetch);
    assert_true(st.prefetch > 2 && st.prefetch <= 16);
    mr_data_iter_free(it);
    mr_data_free(d);
}

/* map(AUTO) starts at OpenMP's max and drops to 1 thread when the consumer is much slower than
 * one thread's materialization; a consumer that does nothing keeps the max. */
static void test_autotune_parallel(void **state) {
    (void)state;
    int max = omp_get_max_threads();
    for (int slow = 0; slow <= 1; slow++) {
        mr_dataset *d = pipeline(400, 0, NULL, MR_DATA_AUTO, 8, 2, 0);
        mr_data_iter *it = NULL;
        MR_ASSERT_OK(mr_data_iter_new(d, &it));
        mr_data_stats st = stats_of(it);
        assert_true(st.map_parallel_auto);
        assert_int_equal(st.map_parallel, max > 256 ? 256 : max);
        drain(it, 32, slow ? 3000 : 0, 0, NULL, NULL);
        st = stats_of(it);
        fprintf(stderr, "autotuned P (%s consumer): %d of max %d\n", slow ? "slow" : "idle", st.map_parallel, max);
        assert_true(st.map_parallel >= 1 && st.map_parallel <= max);
        if (slow) assert_int_equal(st.map_parallel, 1);
        mr_data_iter_free(it);
        mr_data_free(d);
    }
}

/* The autotuned pipeline (P and depth changing as the consumer's pace changes) delivers exactly the
 * bytes of the fixed one; and a state saved from it restores into a fixed pipeline and vice versa. */
static void test_autotune_determinism(void **state) {
    (void)state;
    long map_us = 50;
    unsigned char *ref = NULL, *got = NULL;
    size_t nref = 0, ngot = 0;
    mr_dataset *fixed = pipeline(300, 1, &map_us, 1, 7, 3, 2);
    mr_dataset *autod = pipeline(300, 1, &map_us, MR_DATA_AUTO, 7, MR_DATA_AUTO, 2);
    assert_true(mr_data_structure_hash(fixed) == mr_data_structure_hash(autod));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(fixed, &it));
    int64_t n = drain(it, -1, 0, 0, &ref, &nref);
    assert_int_equal(n, 2 * 43); /* ceil(300 / 7) per pass */
    mr_data_iter_free(it);
    for (int run = 0; run < 3; run++) { /* idle, slow and jittery consumers */
        ngot = 0;
        MR_ASSERT_OK(mr_data_iter_new(autod, &it));
        assert_int_equal(drain(it, -1, run == 0 ? 0 : 1500, run == 2, &got, &ngot), n);
        mr_data_stats st = stats_of(it);
        assert_int_equal(st.elements, n);
        mr_data_iter_free(it);
        assert_int_equal(ngot, nref);
        assert_memory_equal(got, ref, nref);
    }
    /* save mid-stream from the autotuned iterator, restore into fixed and autotuned ones */
    size_t cut_bytes = 0;
    MR_ASSERT_OK(mr_data_iter_new(autod, &it));
    ngot = 0;
    drain(it, 50, 0, 0, &got, &ngot);
    cut_bytes = ngot;
    void *blob = NULL;
    size_t bytes = 0;
    MR_ASSERT_OK(mr_data_iter_save(it, &blob, &bytes));
    mr_data_iter_free(it);
    for (int k = 0; k < 2; k++) {
        MR_ASSERT_OK(mr_data_iter_new(k ? fixed : autod, &it));
        MR_ASSERT_OK(mr_data_iter_restore(it, blob, bytes));
        ngot = cut_bytes;
        assert_int_equal(drain(it, -1, 0, 0, &got, &ngot), n - 50);
        assert_int_equal(mr_data_iter_position(it), n);
        assert_int_equal(ngot, nref);
        assert_memory_equal(got, ref, nref);
        mr_data_iter_free(it);
    }
    free(blob);
    free(ref);
    free(got);
    mr_data_free(fixed);
    mr_data_free(autod);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counters),
        cmocka_unit_test(test_slow_consumer_no_wait),
        cmocka_unit_test(test_slow_producer_waits),
        cmocka_unit_test(test_autotune_depth_grows),
        cmocka_unit_test(test_autotune_parallel),
        cmocka_unit_test(test_autotune_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
