/* core/vec.h's finite check per segment on CUDA (mr_vec_sumsq_seg, core/cuda/vec.cu) against the
 * CPU's (tests/unit/test_vec.c checks that one): on buffers of a few sizes (fewer elements than one
 * block's threads; more than the grid's threads, so each thread strides over several) cut into
 * segments like a model's (empties, a segment across many threads), the same sum as the CPU's to
 * rounding and as mr_vec_sumsq's bit for bit, two runs bit-identical, no flag written when every
 * element is finite (a sentinel survives), and, with infs and NaNs planted at segment boundaries
 * and at the buffer's ends, exactly the CPU's flags. Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "core/vec.h"
#include "tests/ctl_scenario.h"

static const mr_device g_dev = {MR_DEVICE_CUDA, 0};

typedef struct dbuf {
    float *x;
    int64_t *seg;
    int32_t *bad;
    double *scratch;
} dbuf;

static const mr_backend *be(void) {
    const mr_backend *b = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &b));
    return b;
}

static void up(void *d, const void *h, size_t bytes) {
    MR_ASSERT_OK(be()->copy(0, d, h, bytes, MR_COPY_H2D, NULL));
    MR_ASSERT_OK(be()->stream_sync(NULL));
}

static void down(void *h, const void *d, size_t bytes) {
    MR_ASSERT_OK(be()->copy(0, h, d, bytes, MR_COPY_D2H, NULL));
    MR_ASSERT_OK(be()->stream_sync(NULL));
}

/* One size: n elements in nseg segments starting at seg[]; plant[] (np positions) set to inf, -inf
 * or NaN in turn after the all-finite checks. */
static void check(int64_t n, const int64_t *seg, int32_t nseg, const int64_t *plant, int np) {
    float *h = th_alloc(sizeof *h * (size_t)n);
    uint64_t r = 99 + (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 6.0 - 3.0);
    }
    dbuf d;
    MR_ASSERT_OK(be()->alloc(0, sizeof(float) * (size_t)n, (void **)&d.x));
    MR_ASSERT_OK(be()->alloc(0, sizeof(int64_t) * (size_t)nseg, (void **)&d.seg));
    MR_ASSERT_OK(be()->alloc(0, sizeof(int32_t) * (size_t)nseg, (void **)&d.bad));
    MR_ASSERT_OK(be()->alloc(0, sizeof(double) * MR_VEC_SCRATCH, (void **)&d.scratch));
    up(d.x, h, sizeof(float) * (size_t)n);
    up(d.seg, seg, sizeof(int64_t) * (size_t)nseg);
    int32_t *hbad = th_alloc(sizeof *hbad * (size_t)nseg), *cbad = th_alloc(sizeof *cbad * (size_t)nseg);
    for (int32_t k = 0; k < nseg; k++) hbad[k] = 7;
    up(d.bad, hbad, sizeof(int32_t) * (size_t)nseg);

    /* all finite: the sums, and no flag written */
    double gpu = 0, gpu2 = 0, plain = 0, cpu = 0;
    MR_ASSERT_OK(mr_vec_sumsq_seg(g_dev, NULL, d.x, n, d.seg, nseg, d.bad, d.scratch, &gpu));
    MR_ASSERT_OK(mr_vec_sumsq_seg(g_dev, NULL, d.x, n, d.seg, nseg, d.bad, d.scratch, &gpu2));
    MR_ASSERT_OK(mr_vec_sumsq(g_dev, NULL, d.x, n, d.scratch, &plain));
    MR_ASSERT_OK(mr_vec_sumsq_seg(mr_device_cpu(), NULL, h, n, seg, nseg, cbad, NULL, &cpu));
    assert_memory_equal(&gpu, &gpu2, sizeof gpu);
    assert_memory_equal(&gpu, &plain, sizeof gpu);
    if (fabs(gpu - cpu) > 1e-12 * cpu)
        fprintf(stderr, "n %lld: sum %.17g on the GPU, %.17g on the CPU\n", (long long)n, gpu, cpu);
    assert_true(fabs(gpu - cpu) <= 1e-12 * cpu);
    down(hbad, d.bad, sizeof(int32_t) * (size_t)nseg);
    for (int32_t k = 0; k < nseg; k++) assert_int_equal(hbad[k], 7);

    /* planted non-finite values: the CPU's flags exactly */
    static const float kinds[3] = {INFINITY, -INFINITY, NAN};
    for (int j = 0; j < np; j++) h[plant[j]] = kinds[j % 3];
    up(d.x, h, sizeof(float) * (size_t)n);
    memset(hbad, 0, sizeof *hbad * (size_t)nseg);
    memset(cbad, 0, sizeof *cbad * (size_t)nseg);
    up(d.bad, hbad, sizeof(int32_t) * (size_t)nseg);
    MR_ASSERT_OK(mr_vec_sumsq_seg(g_dev, NULL, d.x, n, d.seg, nseg, d.bad, d.scratch, &gpu));
    MR_ASSERT_OK(mr_vec_sumsq_seg(mr_device_cpu(), NULL, h, n, seg, nseg, cbad, NULL, &cpu));
    assert_false(isfinite(gpu));
    assert_false(isfinite(cpu));
    down(hbad, d.bad, sizeof(int32_t) * (size_t)nseg);
    int flagged = 0;
    for (int32_t k = 0; k < nseg; k++) {
        if (hbad[k] != cbad[k])
            fprintf(stderr, "n %lld: segment %d flagged %d on the GPU, %d on the CPU\n", (long long)n, (int)k, hbad[k],
                    cbad[k]);
        assert_int_equal(hbad[k], cbad[k]);
        flagged += cbad[k];
    }
    assert_true(flagged > 0);
    printf("n %lld, %d segments: sum %.6g; %d planted, %d segments flagged alike\n", (long long)n, (int)nseg, plain, np,
           flagged);
    be()->free(0, d.x);
    be()->free(0, d.seg);
    be()->free(0, d.bad);
    be()->free(0, d.scratch);
    th_free_all();
}

static void test_small(void **state) {
    (void)state;
    const int64_t seg[] = {0, 3, 3, 50, 199};
    const int64_t plant[] = {2, 3, 199};
    check(200, seg, 5, plant, 3);
}

/* more elements than the grid's 1023 x 256 threads: a thread's slice holds elements of several
 * segments, and segments hold several threads' elements */
static void test_strided(void **state) {
    (void)state;
    const int64_t n = 1023 * 256 + 4097;
    const int64_t seg[] = {0, 100, 100, 100, 261888, 261889, 262000, n - 1};
    const int64_t plant[] = {99, 100, 261888, 262000, 262001, n - 1};
    check(n, seg, 8, plant, 6);
}

/* The device-side step decisions (mr_vec_ctl_*, mr_vec_sumsq_to, mr_vec_scale_if) on CUDA against
 * the CPU's (which tests/unit/test_vec.c checks against the host path's arithmetic), step by step
 * through tests/ctl_scenario.h: the control block bit for bit but the sums of squares and the clip
 * factor (the CUDA sum adds in another fixed order: to rounding), the gradient to the clip factor's
 * rounding, the flags zeroed; mr_vec_sumsq_to's sum is mr_vec_sumsq's bit for bit. */
static void test_ctl(void **state) {
    (void)state;
    mr_step_ctl hc, *dc = NULL, got;
    ctl_start(&hc);
    float g[CTL_N], l[2], *dg = NULL, *dl = NULL;
    int64_t *dseg = NULL;
    int32_t *dorder = NULL, *dbad = NULL, hbad[CTL_P] = {0};
    double *scratch = NULL;
    MR_ASSERT_OK(be()->alloc(0, sizeof *dc, (void **)&dc));
    MR_ASSERT_OK(be()->alloc(0, sizeof g, (void **)&dg));
    MR_ASSERT_OK(be()->alloc(0, sizeof l, (void **)&dl));
    MR_ASSERT_OK(be()->alloc(0, sizeof ctl_seg, (void **)&dseg));
    MR_ASSERT_OK(be()->alloc(0, sizeof ctl_order, (void **)&dorder));
    MR_ASSERT_OK(be()->alloc(0, sizeof hbad, (void **)&dbad));
    MR_ASSERT_OK(be()->alloc(0, sizeof(double) * MR_VEC_SCRATCH, (void **)&scratch));
    up(dc, &hc, sizeof hc);
    up(dseg, ctl_seg, sizeof ctl_seg);
    up(dorder, ctl_order, sizeof ctl_order);
    up(dbad, hbad, sizeof hbad);
    int applied = 0, skipped = 0;
    for (int k = 1; k <= CTL_STEPS; k++) {
        ctl_inputs(k, g, l);
        for (int i = 0; i < CTL_N; i++) g[i] *= (float)hc.scale;
        up(dg, g, sizeof g);
        up(dl, l, sizeof l);
        MR_ASSERT_OK(ctl_step(g_dev, k, dc, dg, dl, dseg, dorder, dbad, scratch));
        MR_ASSERT_OK(ctl_step(mr_device_cpu(), k, &hc, g, l, ctl_seg, ctl_order, hbad, NULL));
        down(&got, dc, sizeof got);
        /* the sums of squares are the CPU's to rounding (another order), so is the clip factor;
         * every other field bit for bit */
        assert_true(fabs(got.sumsq - hc.sumsq) <= 1e-12 * fabs(hc.sumsq) || (isnan(got.sumsq) && isnan(hc.sumsq)) ||
                    got.sumsq == hc.sumsq);
        assert_true(fabs(got.clip_sumsq - hc.clip_sumsq) <= 1e-12 * fabs(hc.clip_sumsq) || got.clip_sumsq == hc.clip_sumsq ||
                    (isnan(got.clip_sumsq) && isnan(hc.clip_sumsq)));
        assert_true(fabsf(got.clip - hc.clip) <= 2e-7f * fabsf(hc.clip));
        got.sumsq = hc.sumsq, got.clip_sumsq = hc.clip_sumsq, got.clip = hc.clip;
        if (memcmp(&got, &hc, sizeof hc) != 0) {
            const unsigned char *x = (const unsigned char *)&got, *y = (const unsigned char *)&hc;
            for (size_t b = 0; b < sizeof hc; b++)
                if (x[b] != y[b]) fprintf(stderr, "byte %zu of the block: GPU %02x, CPU %02x\n", b, x[b], y[b]);
            fail_msg("step %d: the control block differs (GPU scale %g apply %d, CPU scale %g apply %d)", k, got.scale,
                     got.apply, hc.scale, hc.apply);
        }
        float dgh[CTL_N];
        int32_t bh[CTL_P];
        down(dgh, dg, sizeof dgh);
        down(bh, dbad, sizeof bh);
        for (int i = 0; i < CTL_N; i++)
            assert_true(fabsf(dgh[i] - g[i]) <= 4e-7f * fabsf(g[i]) || dgh[i] == g[i] || (isnan(dgh[i]) && isnan(g[i])));
        for (int i = 0; i < CTL_P; i++) assert_int_equal(bh[i], 0);
        applied += hc.apply;
        skipped += !hc.apply;
    }
    assert_true(applied > 5 && skipped > 4 && hc.stop.step == CTL_STEPS);
    double plain = 0, to = 0;
    ctl_inputs(1, g, l);
    up(dg, g, sizeof g);
    MR_ASSERT_OK(mr_vec_sumsq(g_dev, NULL, dg, CTL_N, scratch, &plain));
    MR_ASSERT_OK(mr_vec_sumsq_to(g_dev, NULL, dg, CTL_N, NULL, 0, NULL, scratch, &dc->sumsq));
    down(&got, dc, sizeof got);
    to = got.sumsq;
    assert_memory_equal(&plain, &to, sizeof to);
    /* mr_vec_scale (the by-value scale the by-pointer one replaced in the trainer) */
    MR_ASSERT_OK(mr_vec_scale(g_dev, NULL, dg, 0.37f, CTL_N));
    MR_ASSERT_OK(mr_vec_scale(mr_device_cpu(), NULL, g, 0.37f, CTL_N));
    float scaled[CTL_N];
    down(scaled, dg, sizeof scaled);
    assert_memory_equal(scaled, g, sizeof g);
    printf("ctl: %d steps alike on the GPU and the CPU (%d applied, %d skipped, stopped at %lld)\n", CTL_STEPS, applied,
           skipped, (long long)hc.stop.step);
    be()->free(0, dc);
    be()->free(0, dg);
    be()->free(0, dl);
    be()->free(0, dseg);
    be()->free(0, dorder);
    be()->free(0, dbad);
    be()->free(0, scratch);
}

int main(void) {
    if (gpu_none()) return 77;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_small), cmocka_unit_test(test_strided),
                                       cmocka_unit_test(test_ctl)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
