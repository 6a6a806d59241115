/* Elementwise ops (ADD SUB MUL DIV with broadcasting, RELU .. SCALE) and their backward: the CPU
 * f32 kernels against the f64 reference on same-shape, bias, scalar, column and general
 * broadcasts (odd sizes, size-1 and size-0 dims, sizes large enough to run threaded); the CPU f64
 * path equal to the reference; gradients of the reference by central finite differences;
 * omitted outputs; error paths. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

/* ---- binary -------------------------------------------------------------------------------- */

typedef struct {
    mr_shape a, b;
} bin_case;

static const bin_case *bin_cases(size_t *n) {
    static bin_case c[14];
    size_t k = 0;
    c[k++] = (bin_case){th_shp(2, 7, 13, 0, 0), th_shp(2, 7, 13, 0, 0)};     /* same shape */
    c[k++] = (bin_case){th_shp(2, 5, 33, 0, 0), th_shp(1, 33, 0, 0, 0)};     /* bias (row vector) */
    c[k++] = (bin_case){th_shp(1, 33, 0, 0, 0), th_shp(2, 5, 33, 0, 0)};     /* row vector first */
    c[k++] = (bin_case){th_shp(2, 4, 9, 0, 0), th_shp(0, 0, 0, 0, 0)};       /* scalar b */
    c[k++] = (bin_case){th_shp(0, 0, 0, 0, 0), th_shp(2, 3, 5, 0, 0)};       /* scalar a */
    c[k++] = (bin_case){th_shp(2, 6, 1, 0, 0), th_shp(2, 6, 7, 0, 0)};       /* column */
    c[k++] = (bin_case){th_shp(3, 2, 1, 5, 0), th_shp(2, 3, 1, 0, 0)};       /* both broadcast */
    c[k++] = (bin_case){th_shp(4, 2, 3, 1, 4), th_shp(4, 1, 3, 5, 1)};       /* 4-d, inner reduced */
    c[k++] = (bin_case){th_shp(2, 1, 1, 0, 0), th_shp(1, 1, 0, 0, 0)};       /* all size 1 */
    c[k++] = (bin_case){th_shp(3, 3, 1, 1, 0), th_shp(3, 3, 1, 1, 0)};       /* trailing 1s */
    c[k++] = (bin_case){th_shp(2, 0, 3, 0, 0), th_shp(1, 3, 0, 0, 0)};       /* empty */
    c[k++] = (bin_case){th_shp(2, 96, 1000, 0, 0), th_shp(1, 1000, 0, 0, 0)}; /* threaded bias */
    c[k++] = (bin_case){th_shp(2, 300, 301, 0, 0), th_shp(2, 300, 301, 0, 0)}; /* threaded flat */
    c[k++] = (bin_case){th_shp(3, 40, 50, 30, 0), th_shp(3, 40, 1, 30, 0)};   /* threaded middle */
    *n = k;
    return c;
}

static void test_binary_fwd(void **state) {
    (void)state;
    size_t nc;
    const bin_case *c = bin_cases(&nc);
    for (mr_op_id op = MR_OP_ADD; op <= MR_OP_DIV; op++) {
        for (size_t i = 0; i < nc; i++) {
            mr_shape ys;
            MR_ASSERT_OK(mr_shape_broadcast(&c[i].a, &c[i].b, &ys));
            mr_op_args a;
            mr_op_args_init(&a, op);
            a.in[0] = th_rand_view(MR_F64, c[i].a, -2, 2, 10 + i);
            /* divisors kept away from 0 */
            a.in[1] = op == MR_OP_DIV ? th_rand_view(MR_F64, c[i].b, 0.5, 2, 20 + i) : th_rand_view(MR_F64, c[i].b, -2, 2, 20 + i);
            a.out[0] = th_view(MR_F64, ys);
            char what[64];
            snprintf(what, sizeof what, "%s case %zu", mr_op_get(op)->name, i);
            th_check_cpu_vs_ref(what, &a, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
            th_free_all();
        }
    }
}

static void test_binary_bwd(void **state) {
    (void)state;
    size_t nc;
    const bin_case *c = bin_cases(&nc);
    for (mr_op_id op = MR_OP_ADD_BWD; op <= MR_OP_DIV_BWD; op++) {
        for (size_t i = 0; i < nc; i++) {
            mr_shape ys;
            MR_ASSERT_OK(mr_shape_broadcast(&c[i].a, &c[i].b, &ys));
            for (int omit = 0; omit < 3; omit++) { /* 0: both outputs, 1: no da, 2: no db */
                mr_op_args a;
                mr_op_args_init(&a, op);
                a.in[0] = th_rand_view(MR_F64, c[i].a, -2, 2, 30 + i);
                a.in[1] = op == MR_OP_DIV_BWD ? th_rand_view(MR_F64, c[i].b, 0.5, 2, 40 + i) : th_rand_view(MR_F64, c[i].b, -2, 2, 40 + i);
                a.in[2] = th_rand_view(MR_F64, ys, -1, 1, 50 + i);
                if (omit != 1) a.out[0] = th_view(MR_F64, c[i].a);
                if (omit != 2) a.out[1] = th_view(MR_F64, c[i].b);
                if (op <= MR_OP_SUB_BWD && omit == 0) { /* ADD/SUB need only the shapes of a, b */
                    a.in[0].data = NULL;
                    a.in[1].data = NULL;
                }
                char what[64];
                snprintf(what, sizeof what, "%s case %zu omit %d", mr_op_get(op)->name, i, omit);
                th_check_cpu_vs_ref(what, &a, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
                th_free_all();
            }
        }
    }
    print_message("binary: max f32 abs err %.3g, rel err %.3g\n", th_max_abs_err, th_max_rel_err);
}

static void test_binary_grad(void **state) {
    (void)state;
    const bin_case c[] = {
        {th_shp(2, 3, 4, 0, 0), th_shp(2, 3, 4, 0, 0)}, {th_shp(2, 3, 4, 0, 0), th_shp(1, 4, 0, 0, 0)},
        {th_shp(0, 0, 0, 0, 0), th_shp(2, 2, 3, 0, 0)}, {th_shp(3, 2, 1, 3, 0), th_shp(2, 4, 1, 0, 0)},
    };
    for (mr_op_id op = MR_OP_ADD; op <= MR_OP_DIV; op++) {
        for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
            mr_shape ys;
            MR_ASSERT_OK(mr_shape_broadcast(&c[i].a, &c[i].b, &ys));
            mr_op_args fwd;
            mr_op_args_init(&fwd, op);
            fwd.in[0] = th_rand_view(MR_F64, c[i].a, -2, 2, 60 + i);
            fwd.in[1] = op == MR_OP_DIV ? th_rand_view(MR_F64, c[i].b, 0.5, 2, 70 + i) : th_rand_view(MR_F64, c[i].b, -2, 2, 70 + i);
            fwd.out[0] = th_view(MR_F64, ys);
            mr_view r = th_rand_view(MR_F64, ys, -1, 1, 80 + i);
            mr_op_args b;
            mr_op_args_init(&b, op + (MR_OP_ADD_BWD - MR_OP_ADD));
            b.in[0] = fwd.in[0];
            b.in[1] = fwd.in[1];
            b.in[2] = r;
            b.out[0] = th_view(MR_F64, c[i].a);
            b.out[1] = th_view(MR_F64, c[i].b);
            MR_ASSERT_OK(mr_op_run_ref(&b));
            char what[64];
            snprintf(what, sizeof what, "%s grad a case %zu", mr_op_get(op)->name, i);
            th_check_grad(what, &fwd, 0, r.data, b.out[0].data, TOL_GRAD_NMSE);
            snprintf(what, sizeof what, "%s grad b case %zu", mr_op_get(op)->name, i);
            th_check_grad(what, &fwd, 1, r.data, b.out[1].data, TOL_GRAD_NMSE);
            th_free_all();
        }
    }
}

/* The backward's sums over broadcast dims do not depend on the thread count. */
static void test_binary_bwd_threads(void **state) {
    (void)state;
    const bin_case c[] = {{th_shp(2, 300, 257, 0, 0), th_shp(1, 257, 0, 0, 0)}, {th_shp(2, 300, 257, 0, 0), th_shp(2, 300, 1, 0, 0)},
                          {th_shp(3, 40, 50, 30, 0), th_shp(3, 1, 50, 1, 0)}};
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        mr_op_args a;
        mr_op_args_init(&a, MR_OP_MUL_BWD);
        a.in[0] = th_view(MR_F32, c[i].a);
        a.in[1] = th_view(MR_F32, c[i].b);
        a.in[2] = th_view(MR_F32, c[i].a);
        th_fill_uniform_f32(a.in[0].data, mr_shape_numel(&c[i].a), -1, 1, 1);
        th_fill_uniform_f32(a.in[1].data, mr_shape_numel(&c[i].b), -1, 1, 2);
        th_fill_uniform_f32(a.in[2].data, mr_shape_numel(&c[i].a), -1, 1, 3);
        a.out[0] = th_view(MR_F32, c[i].a);
        a.out[1] = th_view(MR_F32, c[i].b);
        mr_op_args b = a;
        b.out[0] = th_view(MR_F32, c[i].a);
        b.out[1] = th_view(MR_F32, c[i].b);
        int nt = mr_cpu_threads();
        mr_cpu_set_threads(1);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        mr_cpu_set_threads(nt > 1 ? nt : 2);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        mr_cpu_set_threads(nt);
        assert_memory_equal(a.out[1].data, b.out[1].data, sizeof(float) * (size_t)mr_shape_numel(&c[i].b));
        th_free_all();
    }
}

/* ---- unary --------------------------------------------------------------------------------- */

/* An input range where op and its derivative are smooth and well conditioned. */
static void unary_range(mr_op_id op, double *lo, double *hi) {
    *lo = -4;
    *hi = 4;
    if (op == MR_OP_LOG || op == MR_OP_SQRT || op == MR_OP_LOG_BWD || op == MR_OP_SQRT_BWD) *lo = 0.2;
}

static mr_view unary_input(mr_op_id op, mr_shape s, uint64_t seed) {
    double lo, hi;
    unary_range(op, &lo, &hi);
    mr_view v = th_rand_view(MR_F64, s, lo, hi, seed);
    /* keep relu's inputs off its kink, where finite differences are meaningless */
    double *x = v.data;
    for (int64_t i = 0; i < mr_shape_numel(&s); i++)
        if (fabs(x[i]) < 0.05) x[i] = x[i] < 0 ? -0.05 : 0.05;
    return v;
}

static void test_unary_fwd(void **state) {
    (void)state;
    th_max_abs_err = th_max_rel_err = 0;
    const mr_shape shapes[] = {th_shp(0, 0, 0, 0, 0), th_shp(1, 1, 0, 0, 0), th_shp(2, 7, 13, 0, 0), th_shp(2, 0, 5, 0, 0),
                               th_shp(1, 100003, 0, 0, 0)};
    for (mr_op_id op = MR_OP_RELU; op <= MR_OP_SCALE; op++) {
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
            mr_op_args a;
            mr_op_args_init(&a, op);
            a.p.scale = -1.75;
            a.in[0] = unary_input(op, shapes[i], 90 + i);
            a.out[0] = th_view(MR_F64, shapes[i]);
            char what[64];
            snprintf(what, sizeof what, "%s shape %zu", mr_op_get(op)->name, i);
            th_check_cpu_vs_ref(what, &a, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
            th_free_all();
        }
    }
    print_message("unary fwd: max f32 abs err %.3g, rel err %.3g\n", th_max_abs_err, th_max_rel_err);
    /* vectorised math takes the same path for an element whatever the thread count */
    for (mr_op_id op = MR_OP_GELU; op <= MR_OP_EXP; op++) {
        mr_op_args a;
        mr_op_args_init(&a, op);
        mr_shape s = mr_shape_1d(100003);
        a.in[0] = th_view(MR_F32, s);
        th_fill_uniform_f32(a.in[0].data, 100003, -4, 4, 9);
        a.out[0] = th_view(MR_F32, s);
        mr_op_args b = a;
        b.out[0] = th_view(MR_F32, s);
        int nt = mr_cpu_threads();
        mr_cpu_set_threads(1);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        mr_cpu_set_threads(nt > 1 ? nt : 2);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        mr_cpu_set_threads(nt);
        assert_memory_equal(a.out[0].data, b.out[0].data, sizeof(float) * 100003);
        th_free_all();
    }
    /* the edges: sigmoid and tanh saturate without overflow, relu(0) = 0, exp of large inputs */
    const double edge[] = {-1000, -88, -20, -0.0, 0.0, 20, 88, 1000};
    for (mr_op_id op = MR_OP_RELU; op <= MR_OP_SIGMOID; op++) {
        mr_op_args a;
        mr_op_args_init(&a, op);
        a.in[0] = th_view(MR_F64, mr_shape_1d(8));
        memcpy(a.in[0].data, edge, sizeof edge);
        a.out[0] = th_view(MR_F64, mr_shape_1d(8));
        th_check_cpu_vs_ref(mr_op_get(op)->name, &a, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
        const double *y = a.out[0].data;
        for (int i = 0; i < 8; i++) assert_true(isfinite(y[i]));
        th_free_all();
    }
}

static void test_unary_bwd(void **state) {
    (void)state;
    const mr_shape shapes[] = {th_shp(0, 0, 0, 0, 0), th_shp(2, 7, 13, 0, 0), th_shp(2, 0, 5, 0, 0), th_shp(1, 100003, 0, 0, 0)};
    th_max_abs_err = th_max_rel_err = 0;
    for (mr_op_id op = MR_OP_RELU_BWD; op <= MR_OP_SCALE_BWD; op++) {
        mr_op_id fop = mr_op_get(op)->fwd;
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
            mr_op_args f, a;
            mr_op_args_init(&f, fop);
            f.p.scale = 0.5;
            f.in[0] = unary_input(fop, shapes[i], 100 + i);
            f.out[0] = th_view(MR_F64, shapes[i]);
            MR_ASSERT_OK(mr_op_run_ref(&f));
            mr_op_args_init(&a, op);
            a.p.scale = 0.5;
            a.in[0] = f.in[0];
            a.in[1] = f.out[0];
            a.in[2] = th_rand_view(MR_F64, shapes[i], -1, 1, 110 + i);
            a.out[0] = th_view(MR_F64, shapes[i]);
            char what[64];
            snprintf(what, sizeof what, "%s shape %zu", mr_op_get(op)->name, i);
            th_check_cpu_vs_ref(what, &a, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
            th_free_all();
        }
    }
    print_message("unary bwd: max f32 abs err %.3g, rel err %.3g\n", th_max_abs_err, th_max_rel_err);
}

static void test_unary_grad(void **state) {
    (void)state;
    for (mr_op_id op = MR_OP_RELU; op <= MR_OP_SCALE; op++) {
        mr_op_args fwd;
        mr_shape s = mr_shape_2d(5, 9);
        mr_op_args_init(&fwd, op);
        fwd.p.scale = -1.75;
        fwd.in[0] = unary_input(op, s, 120);
        fwd.out[0] = th_view(MR_F64, s);
        mr_view r = th_rand_view(MR_F64, s, -1, 1, 121);
        MR_ASSERT_OK(mr_op_run_ref(&fwd));
        mr_op_args b;
        mr_op_args_init(&b, op + (MR_OP_RELU_BWD - MR_OP_RELU));
        b.p.scale = -1.75;
        b.in[0] = fwd.in[0];
        /* y is a copy: the finite differences overwrite the forward output */
        b.in[1] = th_view(MR_F64, s);
        memcpy(b.in[1].data, fwd.out[0].data, sizeof(double) * 45);
        b.in[2] = r;
        b.out[0] = th_view(MR_F64, s);
        MR_ASSERT_OK(mr_op_run_ref(&b));
        th_check_grad(mr_op_get(op)->name, &fwd, 0, r.data, b.out[0].data, TOL_GRAD_NMSE);
        th_free_all();
    }
}

/* ---- errors -------------------------------------------------------------------------------- */

static void test_errors(void **state) {
    (void)state;
    mr_op_args a;
    /* shapes that do not broadcast */
    mr_op_args_init(&a, MR_OP_ADD);
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.in[1] = th_view(MR_F32, mr_shape_1d(5));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    th_expect_invalid_cpu_ref(&a, "add");
    /* y not the broadcast shape */
    a.in[1] = th_view(MR_F32, mr_shape_1d(4));
    a.out[0] = th_view(MR_F32, mr_shape_2d(4, 3));
    th_expect_invalid_cpu_ref(&a, "add");
    /* mixed dtypes, integer dtype */
    a.op = MR_OP_MUL;
    a.out[0] = th_view(MR_F64, mr_shape_2d(3, 4));
    th_expect_invalid_cpu_ref(&a, "mul");
    a.in[0] = th_view(MR_I32, mr_shape_2d(3, 4));
    a.in[1] = th_view(MR_I32, mr_shape_1d(4));
    a.out[0] = th_view(MR_I32, mr_shape_2d(3, 4));
    th_expect_invalid_cpu_ref(&a, "mul");
    /* backward: da of the wrong shape; MUL without a */
    mr_op_args_init(&a, MR_OP_MUL_BWD);
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.in[1] = th_view(MR_F32, mr_shape_1d(4));
    a.in[2] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.out[0] = th_view(MR_F32, mr_shape_1d(12));
    th_expect_invalid_cpu_ref(&a, "mul_bwd");
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.in[0].data = NULL;
    th_expect_invalid_cpu_ref(&a, "mul_bwd");
    /* unary: shape mismatch, non-finite scale, relu_bwd without x, f16 */
    mr_op_args_init(&a, MR_OP_GELU);
    a.in[0] = th_view(MR_F32, mr_shape_1d(5));
    a.out[0] = th_view(MR_F32, mr_shape_1d(6));
    th_expect_invalid_cpu_ref(&a, "gelu");
    mr_op_args_init(&a, MR_OP_SCALE);
    a.p.scale = NAN;
    a.in[0] = th_view(MR_F32, mr_shape_1d(5));
    a.out[0] = th_view(MR_F32, mr_shape_1d(5));
    th_expect_invalid_cpu_ref(&a, "scale");
    mr_op_args_init(&a, MR_OP_RELU_BWD);
    a.in[1] = th_view(MR_F32, mr_shape_1d(5));
    a.in[2] = th_view(MR_F32, mr_shape_1d(5));
    a.out[0] = th_view(MR_F32, mr_shape_1d(5));
    th_expect_invalid_cpu_ref(&a, "relu_bwd");
    mr_op_args_init(&a, MR_OP_EXP);
    a.in[0] = th_view(MR_F16, mr_shape_1d(5));
    a.out[0] = th_view(MR_F16, mr_shape_1d(5));
    th_expect_invalid_cpu_ref(&a, "exp");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binary_fwd), cmocka_unit_test(test_binary_bwd), cmocka_unit_test(test_binary_grad),
        cmocka_unit_test(test_binary_bwd_threads),
        cmocka_unit_test(test_unary_fwd),  cmocka_unit_test(test_unary_bwd),  cmocka_unit_test(test_unary_grad),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
