/* Reductions (SUM MEAN MAX over an axes mask, keepdim) and their backward: the CPU f32 kernels
 * against the f64 reference over many axis patterns (inner, outer, alternating, all, none,
 * size-1 and size-0 dims, sizes that run threaded); the CPU f64 path equal to the reference;
 * NaN propagation and first-max routing on ties; gradients by central finite differences;
 * thread-count independence; error paths. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static double g_max_abs, g_max_rel;

/* Tracks the largest error seen, for the summary the tests print. */
static void track(const void *x, mr_dtype dt, const double *ref, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double v = dt == MR_F64 ? ((const double *)x)[i] : ((const float *)x)[i], e = fabs(v - ref[i]);
        if (!isfinite(e)) continue;
        if (e > g_max_abs) g_max_abs = e;
        if (fabs(ref[i]) > 1e-3 && e / fabs(ref[i]) > g_max_rel) g_max_rel = e / fabs(ref[i]);
    }
}

/* Runs `a64` (f64 inputs filled, f64 outputs allocated) three ways: the reference, the CPU in f32
 * on the same inputs rounded to f32, and the CPU in f64; compares f32 within the tolerances and
 * f64 exactly. */
static void check_cpu_vs_ref(const mr_op_args *src, double atol, double rtol, double nmse, const char *what) {
    mr_op_args a64 = *src, a32 = *src, c64 = *src;
    for (int i = 0; i < src->n_in; i++) {
        const mr_view *v = &src->in[i];
        if (!v->data || v->dtype != MR_F64) continue;
        int64_t n = mr_shape_numel(&v->shape);
        a32.in[i] = th_view(MR_F32, v->shape);
        th_f64_to_f32(v->data, a32.in[i].data, n);
        th_f32_to_f64(a32.in[i].data, v->data, n); /* both see the same rounded inputs */
    }
    for (int i = 0; i < src->n_out; i++) {
        if (!src->out[i].data) continue;
        a32.out[i] = th_view(MR_F32, src->out[i].shape);
        c64.out[i] = th_view(MR_F64, src->out[i].shape);
    }
    MR_ASSERT_OK(mr_op_run_ref(&a64));
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a32));
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &c64));
    for (int i = 0; i < src->n_out; i++) {
        if (!src->out[i].data) continue;
        int64_t n = mr_shape_numel(&src->out[i].shape);
        char buf[200];
        snprintf(buf, sizeof buf, "%s out[%d] f32", what, i);
        track(a32.out[i].data, MR_F32, a64.out[i].data, n);
        assert_true(th_compare(buf, a32.out[i].data, MR_F32, a64.out[i].data, n, atol, rtol, nmse));
        snprintf(buf, sizeof buf, "%s out[%d] f64", what, i);
        assert_true(th_compare(buf, c64.out[i].data, MR_F64, a64.out[i].data, n, 0, 0, 0));
    }
}

static mr_view filled(mr_shape s, double lo, double hi, uint64_t seed) {
    mr_view v = th_view(MR_F64, s);
    th_fill_uniform_f64(v.data, mr_shape_numel(&s), lo, hi, seed);
    return v;
}

/* loss = sum(out[0] * r) of the reference forward, for finite differences. */
typedef struct {
    mr_op_args fwd;
    const double *r;
} loss_ctx;

static double loss_fn(void *ctx) {
    loss_ctx *c = ctx;
    MR_ASSERT_OK(mr_op_run_ref(&c->fwd));
    const double *y = c->fwd.out[0].data;
    double s = 0.0;
    for (int64_t i = 0; i < mr_shape_numel(&c->fwd.out[0].shape); i++) s += y[i] * c->r[i];
    return s;
}

/* Compares the analytic gradient `g` of fwd.in[k] with central differences. */
static void grad_vs_numeric(loss_ctx *c, int k, const double *g, const char *what) {
    int64_t n = mr_shape_numel(&c->fwd.in[k].shape);
    double *num = th_alloc(sizeof(double) * (size_t)(n ? n : 1));
    th_numeric_grad(c->fwd.in[k].data, n, TOL_GRAD_H, loss_fn, c, num);
    assert_true(th_compare(what, g, MR_F64, num, n, TOL_GRAD_ATOL, TOL_GRAD_RTOL, 1e-8));
}

static mr_shape shp(int nd, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    int64_t d[4] = {d0, d1, d2, d3};
    return mr_shape_make(nd, d);
}

static void round_f32(mr_view *v) {
    int64_t n = mr_shape_numel(&v->shape);
    float *t = th_alloc(sizeof(float) * (size_t)(n ? n : 1));
    th_f64_to_f32(v->data, t, n);
    th_f32_to_f64(t, v->data, n);
}

static mr_shape reduced(mr_shape s, uint32_t axes) {
    for (int i = 0; i < s.ndim; i++)
        if (axes & (1u << i)) s.dim[i] = 1;
    return s;
}

typedef struct {
    mr_shape x;
    uint32_t axes;
} red_case;

static const red_case *red_cases(size_t *n) {
    static red_case c[20];
    size_t k = 0;
    c[k++] = (red_case){shp(2, 7, 13, 0, 0), 2};      /* last dim */
    c[k++] = (red_case){shp(2, 7, 13, 0, 0), 1};      /* over rows */
    c[k++] = (red_case){shp(2, 7, 13, 0, 0), 3};      /* everything */
    c[k++] = (red_case){shp(2, 4, 3, 0, 0), 0};       /* nothing: a copy */
    c[k++] = (red_case){shp(3, 3, 4, 5, 0), 5};       /* alternating */
    c[k++] = (red_case){shp(3, 3, 4, 5, 0), 2};       /* middle */
    c[k++] = (red_case){shp(4, 2, 3, 4, 5), 10};
    c[k++] = (red_case){shp(4, 2, 3, 4, 5), 5};
    c[k++] = (red_case){shp(3, 33, 1, 17, 0), 6};     /* a reduced size-1 dim */
    c[k++] = (red_case){shp(3, 1, 9, 1, 0), 5};       /* only size-1 dims reduced */
    c[k++] = (red_case){shp(2, 1, 1, 0, 0), 1};
    c[k++] = (red_case){shp(0, 0, 0, 0, 0), 0};       /* scalar */
    c[k++] = (red_case){shp(2, 256, 300, 0, 0), 2};   /* threaded */
    c[k++] = (red_case){shp(2, 256, 300, 0, 0), 1};
    c[k++] = (red_case){shp(3, 64, 50, 40, 0), 2};
    c[k++] = (red_case){shp(3, 64, 50, 40, 0), 5};
    *n = k;
    return c;
}

static void test_reduce_fwd(void **state) {
    (void)state;
    size_t nc;
    const red_case *c = red_cases(&nc);
    for (mr_op_id op = MR_OP_SUM; op <= MR_OP_MAX; op++) {
        for (size_t i = 0; i < nc; i++) {
            mr_op_args a;
            mr_op_args_init(&a, op);
            a.p.reduce.axes = c[i].axes;
            a.in[0] = filled(c[i].x, -2, 2, 10 + i);
            a.out[0] = th_view(MR_F64, reduced(c[i].x, c[i].axes));
            char what[64];
            snprintf(what, sizeof what, "%s case %zu", mr_op_get(op)->name, i);
            check_cpu_vs_ref(&a, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE, what);
            th_free_all();
        }
    }
    print_message("reduce fwd: max f32 abs err %.3g, rel err %.3g\n", g_max_abs, g_max_rel);
}

/* Empty reductions: SUM gives 0, MEAN NaN (as torch); MAX refuses (see test_errors). */
static void test_reduce_empty(void **state) {
    (void)state;
    for (mr_op_id op = MR_OP_SUM; op <= MR_OP_MEAN; op++) {
        mr_op_args a;
        mr_op_args_init(&a, op);
        a.p.reduce.axes = 2;
        a.in[0] = th_view(MR_F32, mr_shape_2d(3, 0));
        a.out[0] = th_view(MR_F32, mr_shape_2d(3, 1));
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        const float *y = a.out[0].data;
        for (int i = 0; i < 3; i++) assert_true(op == MR_OP_SUM ? y[i] == 0.0f : isnan(y[i]));
        mr_op_args r = a;
        r.in[0] = th_view(MR_F64, mr_shape_2d(3, 0));
        r.out[0] = th_view(MR_F64, mr_shape_2d(3, 1));
        MR_ASSERT_OK(mr_op_run_ref(&r));
        const double *yr = r.out[0].data;
        for (int i = 0; i < 3; i++) assert_true(op == MR_OP_SUM ? yr[i] == 0.0 : isnan(yr[i]));
        /* an empty kept dim: nothing to write */
        a.p.reduce.axes = 2;
        a.in[0] = th_view(MR_F32, mr_shape_2d(0, 4));
        a.out[0] = th_view(MR_F32, mr_shape_2d(0, 1));
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    }
    th_free_all();
}

/* MAX propagates NaN, and its backward routes the gradient to the first maximal element (the
 * first NaN when the max is NaN), on ties too. */
static void test_max_nan_ties(void **state) {
    (void)state;
    for (uint32_t axes = 1; axes <= 2; axes++) {
        mr_shape xs = mr_shape_2d(6, 40);
        mr_op_args f;
        mr_op_args_init(&f, MR_OP_MAX);
        f.p.reduce.axes = axes;
        f.in[0] = filled(xs, -2, 2, 5);
        round_f32(&f.in[0]);
        double *x = f.in[0].data;
        x[3] = NAN;          /* row 0, col 3 */
        x[40 + 7] = NAN;     /* row 1 */
        x[40 + 20] = NAN;    /* row 1 again: the first NaN gets the gradient */
        for (int j = 0; j < 40; j++) x[2 * 40 + j] = 1.5; /* row 2: all tied */
        for (int r = 0; r < 6; r++) x[r * 40 + 39] = 1.5;  /* column 39: tied with row 2 */
        f.out[0] = th_view(MR_F64, reduced(xs, axes));
        check_cpu_vs_ref(&f, 0, 0, 0, "max nan/ties");
        MR_ASSERT_OK(mr_op_run_ref(&f));
        const double *y = f.out[0].data;
        if (axes == 2) {
            assert_true(isnan(y[0]) && isnan(y[1]));
            assert_true(y[2] == 1.5);
        } else {
            assert_true(isnan(y[3]) && isnan(y[7]) && isnan(y[20]));
        }
        mr_op_args b;
        mr_op_args_init(&b, MR_OP_MAX_BWD);
        b.p.reduce.axes = axes;
        b.in[0] = f.in[0];
        b.in[1] = f.out[0];
        b.in[2] = filled(f.out[0].shape, 1, 2, 6);
        b.out[0] = th_view(MR_F64, xs);
        check_cpu_vs_ref(&b, 0, 0, 0, "max_bwd nan/ties");
        MR_ASSERT_OK(mr_op_run_ref(&b));
        const double *dx = b.out[0].data;
        if (axes == 2) {
            assert_true(dx[3] != 0.0 && dx[40 + 7] != 0.0 && dx[40 + 20] == 0.0);
            assert_true(dx[2 * 40] != 0.0 && dx[2 * 40 + 1] == 0.0 && dx[2 * 40 + 39] == 0.0);
        } else {
            /* column 39 ties across every row: row 0 gets it */
            assert_true(dx[39] != 0.0);
            for (int r = 1; r < 6; r++) assert_true(dx[r * 40 + 39] == 0.0);
        }
        th_free_all();
    }
}

static void test_reduce_bwd(void **state) {
    (void)state;
    size_t nc;
    const red_case *c = red_cases(&nc);
    g_max_abs = g_max_rel = 0;
    for (mr_op_id op = MR_OP_SUM_BWD; op <= MR_OP_MAX_BWD; op++) {
        for (size_t i = 0; i < nc; i++) {
            mr_shape ys = reduced(c[i].x, c[i].axes);
            mr_op_args a;
            mr_op_args_init(&a, op);
            a.p.reduce.axes = c[i].axes;
            if (op == MR_OP_MAX_BWD) {
                mr_op_args f;
                mr_op_args_init(&f, MR_OP_MAX);
                f.p.reduce.axes = c[i].axes;
                f.in[0] = filled(c[i].x, -2, 2, 20 + i);
                round_f32(&f.in[0]); /* so y is exactly an element of x in f32 too */
                f.out[0] = th_view(MR_F64, ys);
                MR_ASSERT_OK(mr_op_run_ref(&f));
                a.in[0] = f.in[0];
                a.in[1] = f.out[0];
                a.in[2] = filled(ys, -1, 1, 30 + i);
            } else {
                a.in[0] = filled(ys, -1, 1, 30 + i);
            }
            a.out[0] = th_view(MR_F64, c[i].x);
            char what[64];
            snprintf(what, sizeof what, "%s case %zu", mr_op_get(op)->name, i);
            check_cpu_vs_ref(&a, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE, what);
            th_free_all();
        }
    }
    print_message("reduce bwd: max f32 abs err %.3g, rel err %.3g\n", g_max_abs, g_max_rel);
}

static void test_reduce_grad(void **state) {
    (void)state;
    const red_case c[] = {{shp(2, 3, 5, 0, 0), 2}, {shp(2, 3, 5, 0, 0), 1}, {shp(3, 2, 3, 4, 0), 5}, {shp(1, 6, 0, 0, 0), 1}};
    for (mr_op_id op = MR_OP_SUM; op <= MR_OP_MAX; op++) {
        for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
            mr_shape ys = reduced(c[i].x, c[i].axes);
            loss_ctx ctx;
            mr_op_args_init(&ctx.fwd, op);
            ctx.fwd.p.reduce.axes = c[i].axes;
            ctx.fwd.in[0] = filled(c[i].x, -2, 2, 40 + i);
            ctx.fwd.out[0] = th_view(MR_F64, ys);
            mr_view r = filled(ys, -1, 1, 50 + i);
            ctx.r = r.data;
            MR_ASSERT_OK(mr_op_run_ref(&ctx.fwd));
            mr_op_args b;
            mr_op_args_init(&b, op + (MR_OP_SUM_BWD - MR_OP_SUM));
            b.p.reduce.axes = c[i].axes;
            if (op == MR_OP_MAX) {
                b.in[0] = ctx.fwd.in[0];
                b.in[1] = th_view(MR_F64, ys); /* a copy: finite differences rewrite the output */
                memcpy(b.in[1].data, ctx.fwd.out[0].data, sizeof(double) * (size_t)mr_shape_numel(&ys));
                b.in[2] = r;
            } else {
                b.in[0] = r;
            }
            b.out[0] = th_view(MR_F64, c[i].x);
            MR_ASSERT_OK(mr_op_run_ref(&b));
            char what[64];
            snprintf(what, sizeof what, "%s grad case %zu", mr_op_get(op)->name, i);
            grad_vs_numeric(&ctx, 0, b.out[0].data, what);
            th_free_all();
        }
    }
}

/* The result does not depend on the thread count. */
static void test_reduce_threads(void **state) {
    (void)state;
    mr_shape xs = mr_shape_3d(64, 50, 40);
    for (uint32_t axes = 1; axes < 8; axes++) {
        mr_op_args a;
        mr_op_args_init(&a, MR_OP_SUM);
        a.p.reduce.axes = axes;
        a.in[0] = th_view(MR_F32, xs);
        th_fill_uniform_f32(a.in[0].data, mr_shape_numel(&xs), -1, 1, 7);
        a.out[0] = th_view(MR_F32, reduced(xs, axes));
        mr_op_args b = a;
        b.out[0] = th_view(MR_F32, reduced(xs, axes));
        int nt = mr_cpu_threads();
        mr_cpu_set_threads(1);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        mr_cpu_set_threads(nt > 1 ? nt : 2);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        mr_cpu_set_threads(nt);
        assert_memory_equal(a.out[0].data, b.out[0].data, sizeof(float) * (size_t)mr_shape_numel(&a.out[0].shape));
    }
    th_free_all();
}

static void expect_invalid(const mr_op_args *a, const char *name) {
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, a), MR_ERR_INVALID);
    if (!strstr(mr_last_error(), name)) fail_msg("error '%s' does not name %s", mr_last_error(), name);
    assert_int_equal(mr_op_run_ref(a), MR_ERR_INVALID);
}

static void test_errors(void **state) {
    (void)state;
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_SUM);
    a.p.reduce.axes = 4; /* dim 2 of a 2-d x */
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    expect_invalid(&a, "sum");
    a.p.reduce.axes = 1;
    expect_invalid(&a, "sum"); /* y should be (1, 4) */
    a.op = MR_OP_MAX;
    a.p.reduce.axes = 2;
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 0));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 1));
    expect_invalid(&a, "max");
    a.op = MR_OP_MEAN;
    a.in[0] = th_view(MR_I32, mr_shape_2d(3, 4));
    a.out[0] = th_view(MR_I32, mr_shape_2d(3, 1));
    expect_invalid(&a, "mean");
    mr_op_args_init(&a, MR_OP_MEAN_BWD);
    a.p.reduce.axes = 2;
    a.in[0] = th_view(MR_F32, mr_shape_2d(1, 4));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    expect_invalid(&a, "mean_bwd");
    mr_op_args_init(&a, MR_OP_MAX_BWD);
    a.p.reduce.axes = 2;
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.in[1] = th_view(MR_F32, mr_shape_2d(3, 1));
    a.in[2] = th_view(MR_F32, mr_shape_2d(3, 1));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 5));
    expect_invalid(&a, "max_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce_fwd),  cmocka_unit_test(test_reduce_empty), cmocka_unit_test(test_max_nan_ties),
        cmocka_unit_test(test_reduce_bwd),  cmocka_unit_test(test_reduce_grad),  cmocka_unit_test(test_reduce_threads),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
