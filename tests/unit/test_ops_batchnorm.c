/* Batch norm (BATCHNORM, BATCHNORM_BWD): the CPU f32 kernels against the f64 reference over 2-d,
 * 3-d and 4-d shapes (C = 1, odd sizes, both the per-channel and the small-S block paths), in
 * training and evaluation, with gamma/beta present or absent; x = 1000 + noise, where a one-pass
 * E[x^2] - E[x]^2 in f32 would lose the variance; the f64 CPU path equals the reference; dx,
 * dgamma, dbeta against central differences of the forward (training: through the batch
 * statistics; evaluation: at fixed running statistics); optional outputs; independence of the
 * thread count; error paths. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

/* f32 forward args over x of shape s (values in [lo, hi)); affine 0 leaves gamma and beta out. */
static mr_op_args bn_fwd_args(mr_shape s, double lo, double hi, int training, int affine, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_BATCHNORM);
    mr_shape sc = mr_shape_1d(s.dim[1]);
    a.in[0] = th_rand_view(MR_F32, s, lo, hi, seed);
    if (affine) {
        a.in[1] = th_rand_view(MR_F32, sc, 0.5, 1.5, seed + 1);
        a.in[2] = th_rand_view(MR_F32, sc, -0.5, 0.5, seed + 2);
    }
    /* running statistics near the data's: mean in [lo, hi), var in [0.05, 0.5] */
    a.in[3] = th_rand_view(MR_F32, sc, lo, hi, seed + 3);
    a.in[4] = th_rand_view(MR_F32, sc, 0.05, 0.5, seed + 4);
    a.out[0] = th_view(MR_F32, s);
    a.out[1] = th_view(MR_F32, sc);
    a.out[2] = th_view(MR_F32, sc);
    a.p.batchnorm.eps = 1e-5;
    a.p.batchnorm.training = training;
    return a;
}

/* Backward args from a forward that has run (its x, gamma and statistics: the batch ones in
 * training, the running ones in evaluation) and a random dy; `want` bit i keeps output i. */
static mr_op_args bn_bwd_args(const mr_op_args *f, int want, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_BATCHNORM_BWD);
    a.p = f->p;
    mr_dtype dt = f->in[0].dtype;
    mr_shape s = f->in[0].shape, sc = mr_shape_1d(s.dim[1]);
    a.in[0] = th_rand_view(dt, s, -1, 1, seed);
    a.in[1] = f->in[0];
    a.in[2] = f->in[1];
    a.in[3] = f->p.batchnorm.training ? f->out[1] : f->in[3];
    a.in[4] = f->p.batchnorm.training ? f->out[2] : f->in[4];
    if (want & 1) a.out[0] = th_view(dt, s);
    if (want & 2) a.out[1] = th_view(dt, sc);
    if (want & 4) a.out[2] = th_view(dt, sc);
    return a;
}

static void test_batchnorm_fwd_bwd_vs_ref(void **state) {
    (void)state;
    const int64_t shapes[][5] = {
        /* ndim, dims: 2-d (the small-S path), 3-d, 4-d (S >= 64: one channel a block) */
        {2, 4, 3, 0, 0},  {2, 1, 1, 0, 0},  {2, 7, 1, 0, 0},  {2, 64, 100, 0, 0}, {2, 33, 130, 0, 0},
        {3, 5, 3, 7, 0},  {3, 2, 9, 64, 0}, {3, 3, 1, 65, 0}, {4, 2, 3, 5, 5},    {4, 8, 16, 28, 28},
        {4, 3, 1, 9, 11}, {4, 5, 7, 3, 3},  {4, 1, 4, 3, 1},
    };
    th_max_abs_err = th_max_rel_err = 0.0;
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        mr_shape s = th_shp((int)shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3], shapes[k][4]);
        for (int mode = 0; mode < 6; mode++) {
            /* mode: training (0-2) or evaluation (3-5); offset 1000 in modes 1 and 4; no gamma/beta in 2, 5 */
            int training = mode < 3, off = mode % 3 == 1, affine = mode % 3 != 2;
            mr_op_args f = bn_fwd_args(s, off ? 999.5 : -2.0, off ? 1000.5 : 2.0, training, affine, 10 + k);
            char what[128];
            snprintf(what, sizeof what, "batchnorm case %zu mode %d", k, mode);
            (void)th_check_cpu_vs_ref(what, &f, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            for (int want = 1; want < 8; want++) {
                mr_op_args b = bn_bwd_args(&f, want, 50 + k);
                snprintf(what, sizeof what, "batchnorm_bwd case %zu mode %d outputs %d", k, mode, want);
                (void)th_check_cpu_vs_ref(what, &b, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            }
        }
        th_free_all();
    }
    print_message("batchnorm f32 vs f64 reference: max abs err %.3g, max rel err %.3g\n", th_max_abs_err,
                  th_max_rel_err);
}

/* The statistics of x = 1000 + U(-0.5, 0.5) over 1e6 values a channel (var ~ 1/12): the f32
 * kernel's mean and biased variance within ~1e-6 relative of the f64 two-pass reference. */
static void test_batchnorm_stable_variance(void **state) {
    (void)state;
    mr_shape s = mr_shape_4d(250, 2, 40, 100); /* M = 1e6 per channel */
    mr_op_args f = bn_fwd_args(s, 999.5, 1000.5, 1, 1, 7);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    mr_op_args r = th_widen_args(&f);
    MR_ASSERT_OK(mr_op_run_ref(&r));
    const float *mean = f.out[1].data, *var = f.out[2].data;
    const double *rmean = r.out[1].data, *rvar = r.out[2].data;
    for (int c = 0; c < 2; c++) {
        double em = fabs(mean[c] - rmean[c]) / fabs(rmean[c]), ev = fabs(var[c] - rvar[c]) / rvar[c];
        print_message("channel %d: mean %.9g (ref %.9g, rel err %.2g), var %.9g (ref %.9g, rel err %.2g)\n", c,
                      mean[c], rmean[c], em, var[c], rvar[c], ev);
        assert_true(em < 1e-7);
        assert_true(ev < 2e-6);
    }
    assert_true(th_compare("batchnorm y at offset 1000, M = 1e6", f.out[0].data, MR_F32, r.out[0].data,
                           mr_shape_numel(&s), TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
    th_free_all();
}

static void test_batchnorm_grad(void **state) {
    (void)state;
    const int64_t shapes[][5] = {{2, 5, 3, 0, 0}, {3, 3, 2, 4, 0}, {4, 2, 3, 2, 3}, {2, 1, 1, 0, 0}, {4, 1, 2, 9, 8}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        mr_shape s = th_shp((int)shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3], shapes[k][4]);
        for (int training = 0; training < 2; training++) {
            if (training && mr_shape_numel(&s) / s.dim[1] < 2) continue; /* M = 1: y = beta, dx = 0 */
            mr_op_args f32 = bn_fwd_args(s, -1, 1, training, 1, 70 + k), f;
            f = th_widen_args(&f32);
            MR_ASSERT_OK(mr_op_run_ref(&f));
            mr_op_args b = bn_bwd_args(&f, 7, 80 + k);
            MR_ASSERT_OK(mr_op_run_ref(&b));
            const double *r = b.in[0].data; /* dy is the r of the loss sum(y * r) */
            char what[96];
            snprintf(what, sizeof what, "batchnorm dx case %zu training %d", k, training);
            th_check_grad(what, &f, 0, r, b.out[0].data, TOL_NN_GRAD_NMSE);
            snprintf(what, sizeof what, "batchnorm dgamma case %zu training %d", k, training);
            th_check_grad(what, &f, 1, r, b.out[1].data, TOL_NN_GRAD_NMSE);
            snprintf(what, sizeof what, "batchnorm dbeta case %zu training %d", k, training);
            th_check_grad(what, &f, 2, r, b.out[2].data, TOL_NN_GRAD_NMSE);
        }
        th_free_all();
    }
}

static void test_batchnorm_threads(void **state) {
    (void)state;
    const mr_shape shapes[2] = {mr_shape_4d(9, 5, 17, 19), mr_shape_2d(700, 130)};
    for (int k = 0; k < 2; k++)
        for (int training = 0; training < 2; training++) {
            mr_op_args f = bn_fwd_args(shapes[k], -1, 1, training, 1, 90 + k);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
            th_check_thread_invariant(&f);
            mr_op_args b = bn_bwd_args(&f, 7, 91 + k);
            th_check_thread_invariant(&b);
        }
    th_free_all();
}

/* Evaluation: mean and var may be left out (and are copies of the running statistics when given);
 * training does not read the running statistics. */
static void test_batchnorm_optional(void **state) {
    (void)state;
    mr_op_args f = bn_fwd_args(mr_shape_3d(4, 3, 5), -1, 1, 0, 1, 3);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    assert_memory_equal(f.out[1].data, f.in[3].data, 3 * sizeof(float));
    assert_memory_equal(f.out[2].data, f.in[4].data, 3 * sizeof(float));
    mr_op_args e = th_fresh_outputs(&f);
    e.out[1].data = e.out[2].data = NULL;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &e));
    assert_memory_equal(e.out[0].data, f.out[0].data, th_view_bytes(&f.out[0]));
    mr_op_args t = bn_fwd_args(mr_shape_3d(4, 3, 5), -1, 1, 1, 1, 4);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &t));
    mr_op_args u = th_fresh_outputs(&t);
    u.in[3].data = u.in[4].data = NULL;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &u));
    assert_memory_equal(u.out[0].data, t.out[0].data, th_view_bytes(&t.out[0]));
    th_free_all();
}

static void test_batchnorm_errors(void **state) {
    (void)state;
    mr_op_args f = bn_fwd_args(mr_shape_3d(4, 3, 5), -1, 1, 1, 1, 1);
    mr_op_args e = f;
    e.in[1].shape = mr_shape_1d(4);
    th_expect_invalid(&e, "batchnorm");
    e = f;
    e.out[2].shape = mr_shape_1d(2);
    th_expect_invalid(&e, "batchnorm");
    e = f;
    e.in[0].dtype = MR_I32;
    th_expect_invalid(&e, "batchnorm");
    e = f;
    e.p.batchnorm.eps = -1.0;
    th_expect_invalid(&e, "batchnorm");
    e = f;
    e.p.batchnorm.training = 2;
    th_expect_invalid(&e, "batchnorm");
    e = f;
    e.out[1].data = NULL; /* training needs mean */
    th_expect_invalid(&e, "batchnorm");
    e = f;
    e.p.batchnorm.training = 0;
    e.in[4].data = NULL; /* evaluation needs running_var */
    th_expect_invalid(&e, "batchnorm");
    e = f;
    e.in[0].shape = mr_shape_1d(60);
    e.out[0].shape = e.in[0].shape;
    th_expect_invalid(&e, "batchnorm");
    e = f;
    e.in[0].shape = mr_shape_3d(0, 3, 5); /* training with no values */
    e.out[0].shape = e.in[0].shape;
    th_expect_invalid(&e, "batchnorm");
    e = f;
    e.in[2].dtype = MR_F64;
    th_expect_invalid(&e, "batchnorm");
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    mr_op_args b = bn_bwd_args(&f, 7, 2);
    e = b;
    e.in[0].shape = mr_shape_3d(4, 5, 3);
    th_expect_invalid(&e, "batchnorm_bwd");
    e = b;
    e.in[3].data = NULL;
    th_expect_invalid(&e, "batchnorm_bwd");
    e = b;
    e.out[1].shape = mr_shape_1d(5);
    th_expect_invalid(&e, "batchnorm_bwd");
    e = b;
    e.in[4].dtype = MR_F64;
    th_expect_invalid(&e, "batchnorm_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batchnorm_fwd_bwd_vs_ref), cmocka_unit_test(test_batchnorm_stable_variance),
        cmocka_unit_test(test_batchnorm_grad),           cmocka_unit_test(test_batchnorm_threads),
        cmocka_unit_test(test_batchnorm_optional),       cmocka_unit_test(test_batchnorm_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
