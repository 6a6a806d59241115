/* Pooling. Max pooling (MAXPOOL2D, MAXPOOL2D_BWD): the CPU f32 kernels against the f64 reference
 * (values and argmax exactly) over kernel/stride/padding combinations, overlapping windows,
 * size-1 dims; ties go to the first maximal element; NaN propagates; the f64 CPU path equals the
 * reference; dx against central differences; bad argmax, shape, param and dtype errors; p.pool.relu
 * (the fused ReLU gradient) against the reference and against RELU_BWD's mask, bit for bit.
 * Average pooling (AVGPOOL2D, AVGPOOL2D_BWD): the reference against values worked by hand with
 * torch.nn.AvgPool2d's rules (count_include_pad, floor output size), the CPU f32 kernels against
 * the reference over the same kinds of cases plus rows wider than the CPU kernel's chunk and
 * windows that are all edge, thread invariance, dx against central differences, errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

typedef struct pool_case {
    int64_t n, c, h, w;
    int kh, kw, sh, sw, ph, pw;
} pool_case;

static void pool_args(const pool_case *c, mr_dtype dt, uint64_t seed, mr_op_args *f, mr_op_args *b) {
    mr_pool_params p = {c->kh, c->kw, c->sh, c->sw, c->ph, c->pw, 0};
    int64_t oh = (c->h + 2 * c->ph - c->kh) / c->sh + 1, ow = (c->w + 2 * c->pw - c->kw) / c->sw + 1;
    mr_shape xs = mr_shape_4d(c->n, c->c, c->h, c->w), ys = mr_shape_4d(c->n, c->c, oh, ow);
    mr_op_args_init(f, MR_OP_MAXPOOL2D);
    f->p.pool = p;
    f->in[0] = th_rand_view(dt, xs, -1, 1, seed);
    f->out[0] = th_view(dt, ys);
    f->out[1] = th_view(MR_I32, ys);
    mr_op_args_init(b, MR_OP_MAXPOOL2D_BWD);
    b->p.pool = p;
    b->in[0] = f->out[1];
    b->in[1] = th_rand_view(dt, ys, -1, 1, seed + 1);
    b->out[0] = th_view(dt, xs);
}

static void test_pool_vs_ref(void **state) {
    (void)state;
    const pool_case cases[] = {
        {4, 32, 28, 28, 2, 2, 2, 2, 0, 0}, /* CNN pool1 */
        {4, 64, 14, 14, 2, 2, 2, 2, 0, 0}, /* CNN pool2 */
        {2, 3, 7, 37, 2, 2, 2, 2, 0, 0},   /* 2x2 fast path: odd sizes, a 2-window tail of 16 */
        {1, 2, 4, 66, 2, 2, 2, 2, 0, 0},   /* 2x2 fast path: 33 windows a row */
        {2, 3, 7, 9, 3, 3, 2, 2, 1, 1},    /* overlapping, padded, odd sizes */
        {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},    /* everything 1 */
        {3, 2, 5, 8, 2, 4, 1, 3, 1, 2},    /* non-square kernel, stride, padding */
        {2, 2, 6, 6, 3, 3, 1, 1, 1, 1},    /* stride 1: each element in up to 9 windows */
        {1, 5, 4, 4, 4, 4, 4, 4, 0, 0},    /* global pooling */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        mr_op_args f, b;
        pool_args(&cases[k], MR_F32, 10 + 5 * k, &f, &b);
        char what[64];
        snprintf(what, sizeof what, "maxpool2d case %zu", k);
        mr_op_args f64 = th_check_cpu_vs_ref(what, &f, 0.0, 0.0, 0.0);
        /* the backward on the reference's own argmax, so both sides scatter to the same places */
        assert_memory_equal(f.out[1].data, f64.out[1].data, th_view_bytes(&f.out[1]));
        snprintf(what, sizeof what, "maxpool2d_bwd case %zu", k);
        (void)th_check_cpu_vs_ref(what, &b, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
        th_check_thread_invariant(&b);
        th_free_all();
    }
}

/* p.pool.relu over x a ReLU's output (many windows all 0): y as without it, argmax the
 * reference's (-1 where the max is not > 0), and the backward on it equal bit for bit to the
 * unfused gradient, RELU_BWD's mask x > 0 applied to MAXPOOL2D_BWD on the plain argmax; thread
 * invariant. The 2x2 cases take the AVX-512 kernels' -1 lanes. */
static void test_pool_relu(void **state) {
    (void)state;
    const pool_case cases[] = {
        {4, 32, 28, 28, 2, 2, 2, 2, 0, 0}, /* CNN pool1 */
        {4, 64, 14, 14, 2, 2, 2, 2, 0, 0}, /* CNN pool2 */
        {2, 3, 7, 37, 2, 2, 2, 2, 0, 0},   /* 2x2: odd sizes, the backward's general path */
        {2, 3, 7, 9, 3, 3, 2, 2, 1, 1},    /* overlapping, padded */
        {2, 2, 6, 6, 3, 3, 1, 1, 1, 1},    /* stride 1: each element in up to 9 windows */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        mr_op_args f, b;
        pool_args(&cases[k], MR_F32, 70 + 3 * k, &f, &b);
        float *x = f.in[0].data;
        int64_t nx = mr_shape_numel(&f.in[0].shape), ny = mr_shape_numel(&f.out[0].shape), zero_windows = 0;
        for (int64_t i = 0; i < nx; i++) x[i] = x[i] > 0.4f ? x[i] - 0.4f : 0.0f; /* relu(x - 0.4) */
        /* unfused: the plain argmax, MAXPOOL2D_BWD, then RELU_BWD's mask */
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
        mr_op_args b0 = b;
        b0.in[0] = th_view(MR_I32, f.out[1].shape);
        memcpy(b0.in[0].data, f.out[1].data, th_view_bytes(&f.out[1]));
        b0.out[0] = th_view(MR_F32, b.out[0].shape);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b0));
        float *dx0 = b0.out[0].data;
        for (int64_t i = 0; i < nx; i++) dx0[i] = x[i] > 0 ? dx0[i] : 0.0f;
        mr_view y0 = th_view(MR_F32, f.out[0].shape);
        memcpy(y0.data, f.out[0].data, th_view_bytes(&y0));
        /* fused */
        f.p.pool.relu = b.p.pool.relu = 1;
        char what[64];
        snprintf(what, sizeof what, "maxpool2d relu case %zu", k);
        mr_op_args f64 = th_check_cpu_vs_ref(what, &f, 0.0, 0.0, 0.0);
        assert_memory_equal(f.out[1].data, f64.out[1].data, th_view_bytes(&f.out[1]));
        assert_memory_equal(f.out[0].data, y0.data, th_view_bytes(&y0));
        th_check_thread_invariant(&f);
        const int32_t *am = f.out[1].data;
        for (int64_t i = 0; i < ny; i++) zero_windows += am[i] == -1;
        assert_true(zero_windows > 0 && zero_windows < ny); /* both kinds of window occur */
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        assert_memory_equal(b.out[0].data, dx0, th_view_bytes(&b.out[0]));
        snprintf(what, sizeof what, "maxpool2d_bwd relu case %zu", k); /* overlapping windows: f32 sums */
        (void)th_check_cpu_vs_ref(what, &b, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
        th_check_thread_invariant(&b);
        th_free_all();
    }
    /* NaN and 0 maxima give -1 (NaN cannot come from a ReLU; the rule is !(max > 0)) */
    const pool_case c = {1, 1, 2, 6, 2, 2, 2, 2, 0, 0};
    mr_op_args f, b;
    pool_args(&c, MR_F32, 1, &f, &b);
    f.p.pool.relu = 1;
    double vals[12] = {0, 0, 1, NAN, 0, 2, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 12; i++) mr_dtype_set(f.in[0].data, f.in[0].dtype, i, vals[i]);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    const int32_t *am = f.out[1].data;
    assert_int_equal(am[0], -1);
    assert_int_equal(am[1], -1);
    assert_int_equal(am[2], 5);
    th_free_all();
}

static void test_pool_ties_nan(void **state) {
    (void)state;
    const pool_case c = {1, 1, 2, 4, 2, 2, 2, 2, 0, 0};
    for (int dt = 0; dt < 2; dt++) {
        mr_op_args f, b;
        pool_args(&c, dt ? MR_F64 : MR_F32, 1, &f, &b);
        /* window 0 all equal: the first wins; window 1 has a NaN after the max: NaN wins */
        double vals[8] = {3, 3, 1, 5, 3, 3, NAN, 2};
        for (int i = 0; i < 8; i++) mr_dtype_set(f.in[0].data, f.in[0].dtype, i, vals[i]);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
        const int32_t *am = f.out[1].data;
        assert_int_equal(am[0], 0);
        assert_int_equal(am[1], 6);
        assert_true(isnan(mr_dtype_get(f.out[0].data, f.out[0].dtype, 1)));
        assert_true(mr_dtype_get(f.out[0].data, f.out[0].dtype, 0) == 3.0);
    }
    th_free_all();
}

static void test_pool_grad(void **state) {
    (void)state;
    const pool_case cases[] = {{2, 2, 5, 6, 3, 2, 2, 2, 1, 1}, {1, 3, 4, 4, 2, 2, 1, 1, 0, 0}};
    for (size_t k = 0; k < 2; k++) {
        mr_op_args f, b;
        pool_args(&cases[k], MR_F64, 40 + k, &f, &b);
        MR_ASSERT_OK(mr_op_run_ref(&f));
        MR_ASSERT_OK(mr_op_run_ref(&b));
        th_check_grad("maxpool2d dx", &f, 0, b.in[1].data, b.out[0].data, TOL_NN_GRAD_NMSE);
        th_free_all();
    }
}

static void test_pool_errors(void **state) {
    (void)state;
    const pool_case c = {2, 3, 6, 6, 2, 2, 2, 2, 0, 0};
    mr_op_args f, b, e;
    pool_args(&c, MR_F32, 1, &f, &b);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    e = f;
    e.p.pool.stride_w = 0;
    th_expect_invalid(&e, "maxpool2d");
    e = f;
    e.p.pool.pad_h = 2; /* more than kernel/2 */
    th_expect_invalid(&e, "maxpool2d");
    e = f;
    e.out[0].shape = mr_shape_4d(2, 3, 3, 2);
    th_expect_invalid(&e, "maxpool2d");
    e = f;
    e.out[1].dtype = MR_F32;
    th_expect_invalid(&e, "maxpool2d");
    e = f;
    e.in[0].dtype = MR_I32;
    th_expect_invalid(&e, "maxpool2d");
    e = f;
    e.in[0].shape = mr_shape_3d(6, 6, 6);
    th_expect_invalid(&e, "maxpool2d");
    e = b;
    e.out[0].shape = mr_shape_4d(2, 3, 8, 6);
    th_expect_invalid(&e, "maxpool2d_bwd");
    e = b;
    ((int32_t *)b.in[0].data)[5] = 36;
    th_expect_invalid(&e, "maxpool2d_bwd");
    assert_non_null(strstr(mr_last_error(), "argmax[5]"));
    th_free_all();
}

/* ---- average pooling -------------------------------------------------------------------------- */

static void avg_args(const pool_case *c, mr_dtype dt, uint64_t seed, mr_op_args *f, mr_op_args *b) {
    mr_pool_params p = {c->kh, c->kw, c->sh, c->sw, c->ph, c->pw, 0};
    int64_t oh = (c->h + 2 * c->ph - c->kh) / c->sh + 1, ow = (c->w + 2 * c->pw - c->kw) / c->sw + 1;
    mr_shape xs = mr_shape_4d(c->n, c->c, c->h, c->w), ys = mr_shape_4d(c->n, c->c, oh, ow);
    mr_op_args_init(f, MR_OP_AVGPOOL2D);
    f->p.pool = p;
    f->in[0] = th_rand_view(dt, xs, -1, 1, seed);
    f->out[0] = th_view(dt, ys);
    mr_op_args_init(b, MR_OP_AVGPOOL2D_BWD);
    b->p.pool = p;
    b->in[0] = th_rand_view(dt, ys, -1, 1, seed + 1);
    b->out[0] = th_view(dt, xs);
}

/* x = 1..16 in a 4x4 plane, kernel 3, stride 2, padding 1: what F.avg_pool2d(x, 3, 2, 1) gives
 * (padding counted in the divisor 9), and for dy = 1 every dx element is (windows over it)/9. */
static void test_avgpool_by_hand(void **state) {
    (void)state;
    const pool_case c = {1, 1, 4, 4, 3, 3, 2, 2, 1, 1};
    for (int dt = 0; dt < 2; dt++) {
        mr_op_args f, b;
        avg_args(&c, dt ? MR_F64 : MR_F32, 1, &f, &b);
        for (int i = 0; i < 16; i++) mr_dtype_set(f.in[0].data, f.in[0].dtype, i, i + 1);
        for (int i = 0; i < 4; i++) mr_dtype_set(b.in[0].data, b.in[0].dtype, i, 1.0);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        const double want_y[4] = {14.0 / 9, 30.0 / 9, 57.0 / 9, 99.0 / 9};
        /* windows cover rows/cols {0,1} (window 0) and {1,2,3} (window 1): counts 1,2,1,1 per axis */
        const int cover[4] = {1, 2, 1, 1};
        for (int i = 0; i < 4; i++)
            assert_true(fabs(mr_dtype_get(f.out[0].data, f.out[0].dtype, i) - want_y[i]) <= 1e-6 * want_y[i]);
        for (int i = 0; i < 16; i++) {
            double want = cover[i / 4] * cover[i % 4] / 9.0;
            assert_true(fabs(mr_dtype_get(b.out[0].data, b.out[0].dtype, i) - want) <= 1e-6);
        }
    }
    /* ceil_mode=False: a 5-wide row with kernel 2 stride 2 has 2 windows; column 4 gets no gradient */
    const pool_case d = {1, 1, 1, 5, 1, 2, 1, 2, 0, 0};
    mr_op_args f, b;
    avg_args(&d, MR_F64, 2, &f, &b);
    assert_int_equal(f.out[0].shape.dim[3], 2);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
    assert_true(((double *)b.out[0].data)[4] == 0.0);
    assert_true(((double *)b.out[0].data)[3] == ((double *)b.in[0].data)[1] / 2.0);
    th_free_all();
}

static void test_avgpool_vs_ref(void **state) {
    (void)state;
    const pool_case cases[] = {
        {4, 32, 28, 28, 2, 2, 2, 2, 0, 0}, /* a CNN's pool1 */
        {2, 3, 7, 9, 3, 3, 2, 2, 1, 1},    /* overlapping, padded, odd sizes */
        {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},    /* everything 1 */
        {3, 2, 5, 8, 2, 4, 1, 3, 1, 2},    /* non-square kernel, stride, padding */
        {2, 2, 6, 6, 3, 3, 1, 1, 1, 1},    /* stride 1: each element in up to 9 windows */
        {1, 5, 4, 4, 4, 4, 4, 4, 0, 0},    /* global pooling */
        {1, 2, 10, 10, 2, 2, 3, 3, 0, 0},  /* stride > kernel: uncovered elements get 0 */
        {1, 1, 4, 4, 4, 4, 4, 4, 2, 2},    /* padding half the kernel */
        {2, 3, 9, 300, 3, 3, 1, 1, 1, 1},  /* rows wider than the CPU's 256-column chunk, stride 1 */
        {1, 2, 5, 900, 3, 5, 2, 3, 1, 2},  /* ... with stride 3 (the general stride) */
        {2, 1, 6, 601, 2, 3, 2, 2, 0, 1},  /* ... stride 2, a partial last chunk */
        {1, 1, 3, 3, 3, 3, 1, 1, 1, 1},    /* edge windows around one inner one */
        {1, 1, 2, 2, 2, 2, 1, 1, 1, 1},    /* output larger than the input */
        {1, 3, 1, 5, 1, 3, 1, 2, 0, 1},    /* a single row */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        mr_op_args f, b;
        avg_args(&cases[k], MR_F32, 70 + 5 * k, &f, &b);
        char what[64];
        snprintf(what, sizeof what, "avgpool2d case %zu", k);
        (void)th_check_cpu_vs_ref(what, &f, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
        th_check_thread_invariant(&f);
        snprintf(what, sizeof what, "avgpool2d_bwd case %zu", k);
        (void)th_check_cpu_vs_ref(what, &b, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
        th_check_thread_invariant(&b);
        th_free_all();
    }
}

static void test_avgpool_grad(void **state) {
    (void)state;
    const pool_case cases[] = {
        {2, 2, 5, 6, 3, 2, 2, 2, 1, 1}, {1, 3, 4, 4, 2, 2, 1, 1, 0, 0}, {1, 2, 7, 5, 3, 3, 2, 3, 1, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        mr_op_args f, b;
        avg_args(&cases[k], MR_F64, 80 + k, &f, &b);
        MR_ASSERT_OK(mr_op_run_ref(&f));
        MR_ASSERT_OK(mr_op_run_ref(&b));
        th_check_grad("avgpool2d dx", &f, 0, b.in[0].data, b.out[0].data, TOL_NN_GRAD_NMSE);
        th_free_all();
    }
}

static void test_avgpool_errors(void **state) {
    (void)state;
    const pool_case c = {2, 3, 6, 6, 2, 2, 2, 2, 0, 0};
    mr_op_args f, b, e;
    avg_args(&c, MR_F32, 1, &f, &b);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
    e = f;
    e.p.pool.kernel_h = 0;
    th_expect_invalid(&e, "avgpool2d");
    e = f;
    e.p.pool.pad_w = 2; /* more than kernel/2 */
    th_expect_invalid(&e, "avgpool2d");
    e = f;
    e.out[0].shape = mr_shape_4d(2, 3, 3, 2);
    th_expect_invalid(&e, "avgpool2d");
    e = f;
    e.in[0].dtype = MR_I32;
    th_expect_invalid(&e, "avgpool2d");
    e = f;
    e.out[0].dtype = MR_F64;
    th_expect_invalid(&e, "avgpool2d");
    e = f;
    e.in[0].shape = mr_shape_3d(6, 6, 6);
    th_expect_invalid(&e, "avgpool2d");
    e = f;
    e.p.pool.kernel_h = e.p.pool.kernel_w = 7; /* larger than the plane */
    th_expect_invalid(&e, "avgpool2d");
    e = b;
    e.out[0].shape = mr_shape_4d(2, 3, 8, 6);
    th_expect_invalid(&e, "avgpool2d_bwd");
    e = b;
    e.in[0].data = NULL;
    th_expect_invalid(&e, "avgpool2d_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_vs_ref),
        cmocka_unit_test(test_pool_relu),
        cmocka_unit_test(test_pool_ties_nan),
        cmocka_unit_test(test_pool_grad),
        cmocka_unit_test(test_pool_errors),
        cmocka_unit_test(test_avgpool_by_hand),
        cmocka_unit_test(test_avgpool_vs_ref),
        cmocka_unit_test(test_avgpool_grad),
        cmocka_unit_test(test_avgpool_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
