/* Reductions (SUM MEAN MAX over an axes mask, keepdim) and their backward: the CPU f32 kernels
 * against the f64 reference over many axis patterns (inner, outer, alternating, all, none,
 * size-1 and size-0 dims, sizes that run threaded); the CPU f64 path equal to the reference;
 * NaN propagation and first-max routing on ties; gradients by central finite differences;
 * thread-count independence; error paths. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

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
    c[k++] = (red_case){th_shp(2, 7, 13, 0, 0), 2};      /* last dim */
    c[k++] = (red_case){th_shp(2, 7, 13, 0, 0), 1};      /* over rows */
    c[k++] = (red_case){th_shp(2, 7, 13, 0, 0), 3};      /* everything */
    c[k++] = (red_case){th_shp(2, 4, 3, 0, 0), 0};       /* nothing: a copy */
    c[k++] = (red_case){th_shp(3, 3, 4, 5, 0), 5};       /* alternating */
    c[k++] = (red_case){th_shp(3, 3, 4, 5, 0), 2};       /* middle */
    c[k++] = (red_case){th_shp(4, 2, 3, 4, 5), 10};
    c[k++] = (red_case){th_shp(4, 2, 3, 4, 5), 5};
    c[k++] = (red_case){th_shp(3, 33, 1, 17, 0), 6};     /* a reduced size-1 dim */
    c[k++] = (red_case){th_shp(3, 1, 9, 1, 0), 5};       /* only size-1 dims reduced */
    c[k++] = (red_case){th_shp(2, 1, 1, 0, 0), 1};
    c[k++] = (red_case){th_shp(0, 0, 0, 0, 0), 0};       /* scalar */
    c[k++] = (red_case){th_shp(2, 256, 300, 0, 0), 2};   /* threaded */
    c[k++] = (red_case){th_shp(2, 256, 300, 0, 0), 1};
    c[k++] = (red_case){th_shp(3, 64, 50, 40, 0), 2};
    c[k++] = (red_case){th_shp(3, 64, 50, 40, 0), 5};
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
            a.in[0] = th_rand_view(MR_F64, c[i].x, -2, 2, 10 + i);
            a.out[0] = th_view(MR_F64, reduced(c[i].x, c[i].axes));
            char what[64];
            snprintf(what, sizeof what, "%s case %zu", mr_op_get(op)->name, i);
            th_check_cpu_vs_ref(what, &a, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            th_free_all();
        }
    }
    print_message("reduce fwd: max f32 abs err %.3g, rel err %.3g\n", th_max_abs_err, th_max_rel_err);
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
        f.in[0] = th_rand_view(MR_F64, xs, -2, 2, 5);
        round_f32(&f.in[0]);
        double *x = f.in[0].data;
        x[3] = NAN;          /* row 0, col 3 */
        x[40 + 7] = NAN;     /* row 1 */
        x[40 + 20] = NAN;    /* row 1 again: the first NaN gets the gradient */
        for (int j = 0; j < 40; j++) x[2 * 40 + j] = 1.5; /* row 2: all tied */
        for (int r = 0; r < 6; r++) x[r * 40 + 39] = 1.5;  /* column 39: tied with row 2 */
        f.out[0] = th_view(MR_F64, reduced(xs, axes));
        th_check_cpu_vs_ref("max nan/ties", &f, 0, 0, 0);
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
        b.in[2] = th_rand_view(MR_F64, f.out[0].shape, 1, 2, 6);
        b.out[0] = th_view(MR_F64, xs);
        th_check_cpu_vs_ref("max_bwd nan/ties", &b, 0, 0, 0);
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
    th_max_abs_err = th_max_rel_err = 0;
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
                f.in[0] = th_rand_view(MR_F64, c[i].x, -2, 2, 20 + i);
                round_f32(&f.in[0]); /* so y is exactly an element of x in f32 too */
                f.out[0] = th_view(MR_F64, ys);
                MR_ASSERT_OK(mr_op_run_ref(&f));
                a.in[0] = f.in[0];
                a.in[1] = f.out[0];
                a.in[2] = th_rand_view(MR_F64, ys, -1, 1, 30 + i);
            } else {
                a.in[0] = th_rand_view(MR_F64, ys, -1, 1, 30 + i);
            }
            a.out[0] = th_view(MR_F64, c[i].x);
            char what[64];
            snprintf(what, sizeof what, "%s case %zu", mr_op_get(op)->name, i);
            th_check_cpu_vs_ref(what, &a, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
            th_free_all();
        }
    }
    print_message("reduce bwd: max f32 abs err %.3g, rel err %.3g\n", th_max_abs_err, th_max_rel_err);
}

static void test_reduce_grad(void **state) {
    (void)state;
    const red_case c[] = {{th_shp(2, 3, 5, 0, 0), 2}, {th_shp(2, 3, 5, 0, 0), 1}, {th_shp(3, 2, 3, 4, 0), 5}, {th_shp(1, 6, 0, 0, 0), 1}};
    for (mr_op_id op = MR_OP_SUM; op <= MR_OP_MAX; op++) {
        for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
            mr_shape ys = reduced(c[i].x, c[i].axes);
            mr_op_args fwd;
            mr_op_args_init(&fwd, op);
            fwd.p.reduce.axes = c[i].axes;
            fwd.in[0] = th_rand_view(MR_F64, c[i].x, -2, 2, 40 + i);
            fwd.out[0] = th_view(MR_F64, ys);
            mr_view r = th_rand_view(MR_F64, ys, -1, 1, 50 + i);
            MR_ASSERT_OK(mr_op_run_ref(&fwd));
            mr_op_args b;
            mr_op_args_init(&b, op + (MR_OP_SUM_BWD - MR_OP_SUM));
            b.p.reduce.axes = c[i].axes;
            if (op == MR_OP_MAX) {
                b.in[0] = fwd.in[0];
                b.in[1] = th_view(MR_F64, ys); /* a copy: finite differences rewrite the output */
                memcpy(b.in[1].data, fwd.out[0].data, sizeof(double) * (size_t)mr_shape_numel(&ys));
                b.in[2] = r;
            } else {
                b.in[0] = r;
            }
            b.out[0] = th_view(MR_F64, c[i].x);
            MR_ASSERT_OK(mr_op_run_ref(&b));
            char what[64];
            snprintf(what, sizeof what, "%s grad case %zu", mr_op_get(op)->name, i);
            th_check_grad(what, &fwd, 0, r.data, b.out[0].data, TOL_GRAD_NMSE);
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

static void test_errors(void **state) {
    (void)state;
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_SUM);
    a.p.reduce.axes = 4; /* dim 2 of a 2-d x */
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    th_expect_invalid_cpu_ref(&a, "sum");
    a.p.reduce.axes = 1;
    th_expect_invalid_cpu_ref(&a, "sum"); /* y should be (1, 4) */
    a.op = MR_OP_MAX;
    a.p.reduce.axes = 2;
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 0));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 1));
    th_expect_invalid_cpu_ref(&a, "max");
    a.op = MR_OP_MEAN;
    a.in[0] = th_view(MR_I32, mr_shape_2d(3, 4));
    a.out[0] = th_view(MR_I32, mr_shape_2d(3, 1));
    th_expect_invalid_cpu_ref(&a, "mean");
    mr_op_args_init(&a, MR_OP_MEAN_BWD);
    a.p.reduce.axes = 2;
    a.in[0] = th_view(MR_F32, mr_shape_2d(1, 4));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    th_expect_invalid_cpu_ref(&a, "mean_bwd");
    mr_op_args_init(&a, MR_OP_MAX_BWD);
    a.p.reduce.axes = 2;
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.in[1] = th_view(MR_F32, mr_shape_2d(3, 1));
    a.in[2] = th_view(MR_F32, mr_shape_2d(3, 1));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 5));
    th_expect_invalid_cpu_ref(&a, "max_bwd");
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
