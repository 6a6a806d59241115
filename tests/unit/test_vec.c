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
#include "optim/optim.h"
#include "tests/ctl_scenario.h"

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

/* The device-side step decisions (mr_vec_ctl_*, core/math/ctl_math.h) on the CPU against the host
 * path's own arithmetic (train/train_step.c tr_step_check and tr_step_update: mr_loss_scaler_update,
 * the unscale by (float)(1 / scale), the clip factor), step by step through tests/ctl_scenario.h:
 * the same verdicts, scales, counts, gradient bits and loss; each skip recorded with the first
 * parameter in backward order and the count; the floor recorded as the stop, after which every
 * step is skipped without a record. */
static void test_ctl_against_host(void **state) {
    (void)state;
    const mr_device cpu = mr_device_cpu();
    mr_step_ctl ctl;
    ctl_start(&ctl);
    mr_loss_scaler sc = {256.0, 2.0, 0.5, 32.0, 2, 0, 0};
    int64_t updates = 0, interval = 0;
    double loss_sum = 0;
    int32_t bad[CTL_P] = {0}, events = 0, stopped = 0;
    float g[CTL_N], h[CTL_N], l[2];
    for (int k = 1; k <= CTL_STEPS; k++) {
        ctl_inputs(k, g, l);
        for (int i = 0; i < CTL_N; i++) g[i] *= (float)sc.scale, h[i] = g[i];
        MR_ASSERT_OK(ctl_step(cpu, k, &ctl, g, l, ctl_seg, ctl_order, bad, NULL));
        for (int i = 0; i < CTL_P; i++) assert_int_equal(bad[i], 0); /* read and zeroed */
        if (stopped) { /* training stops at the next read: nothing changes, nothing is recorded */
            assert_int_equal(ctl.apply, 0);
            assert_memory_equal(g, h, sizeof g);
            assert_int_equal(ctl.n_events, events);
            continue;
        }
        /* the host path */
        const double loss = ((0.0 + (double)l[0]) + (double)l[1]) / 2.0 / 1.0;
        double sumsq = 0;
        MR_ASSERT_OK(mr_vec_sumsq(cpu, NULL, h, CTL_N, NULL, &sumsq));
        const int finite = isfinite(sumsq) && isfinite(loss);
        const double before = sc.scale;
        const int apply = mr_loss_scaler_update(&sc, finite);
        if (apply) {
            mr_grads_unscale(h, CTL_N, before);
            double norm = 0;
            mr_clip_grad_norm(h, CTL_N, CTL_MAX_NORM, &norm);
            updates++;
        }
        assert_true(memcmp(&ctl.loss, &loss, sizeof loss) == 0 || (isnan(ctl.loss) && isnan(loss)));
        assert_int_equal(ctl.apply, apply);
        assert_true(ctl.scale == sc.scale && ctl.scale_f32 == (float)sc.scale);
        assert_int_equal(ctl.good_steps, sc.good_steps);
        assert_int_equal(ctl.skipped, sc.skipped);
        assert_int_equal(ctl.updates, updates);
        if (apply) assert_memory_equal(g, h, sizeof g);
        if (!finite && before <= sc.min_scale) { /* the floor: the stop */
            assert_int_equal(ctl.stop.step, k);
            assert_int_equal(ctl.stop_floor, 1);
            assert_int_equal(ctl.stop.first, 1);
            stopped = 1;
            continue;
        }
        if (isfinite(loss)) loss_sum += loss, interval++;
        assert_true(ctl.loss_sum == loss_sum && ctl.interval == interval);
        if (!finite) {
            const mr_ctl_event *e = &ctl.events[events++];
            assert_int_equal(ctl.n_events, events);
            assert_int_equal(e->step, k);
            assert_true(e->scale_before == before && e->scale_after == sc.scale);
            const int32_t first = k == 3 ? 2 : k == 5 ? -1 : k == 8 ? 3 : 1, nbad = k == 5 ? 0 : k == 8 ? 2 : 1;
            assert_int_equal(e->first, first);
            assert_int_equal(e->bad, nbad);
        }
    }
    assert_true(stopped && events >= 4 && updates > 5);
    fprintf(stderr, "ctl: %lld updates, %d skips recorded, stopped at step %lld (scale %g)\n", (long long)updates,
            (int)events, (long long)ctl.stop.step, ctl.scale);
    /* without scaling the first non-finite step is the stop */
    ctl_start(&ctl);
    mr_ctl_cfg k = ctl_cfg(4);
    k.scaling = 0;
    ctl.sumsq = INFINITY;
    ctl.loss = 1.0;
    bad[2] = 1;
    MR_ASSERT_OK(mr_vec_ctl_check(cpu, NULL, &ctl, &k, bad, ctl_order));
    assert_true(ctl.stop.step == 4 && ctl.stop_floor == 0 && ctl.stop.first == 2 && ctl.apply == 0 && bad[2] == 0);
    assert_true(ctl.skipped == 0 && ctl.n_events == 0 && ctl.scale == 256.0); /* the scaler is off */
    assert_int_equal(mr_vec_ctl_check(cpu, NULL, &ctl, &k, NULL, NULL), MR_ERR_INVALID); /* flags missing */
    assert_int_equal(mr_vec_ctl_clip(cpu, NULL, &ctl, 0.0, 0), MR_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sum_is_sumsq), cmocka_unit_test(test_flags),
                                       cmocka_unit_test(test_errors), cmocka_unit_test(test_ctl_against_host)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
