/* Layer norm (LAYERNORM, LAYERNORM_BWD): the CPU f32 kernels against the f64 reference on wide,
 * narrow, 3-d and offset rows; the f64 CPU path equals the reference; dx, dgamma, dbeta against
 * central differences of the forward; dgamma/dbeta optional and independent of the thread count;
 * error paths. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

/* f32 forward args over x of shape s (values in [lo, hi)). */
static mr_op_args ln_fwd_args(mr_shape s, double lo, double hi, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_LAYERNORM);
    int64_t d = s.dim[s.ndim - 1];
    mr_shape rs = s;
    rs.dim[--rs.ndim] = 0;
    a.in[0] = th_rand_view(MR_F32, s, lo, hi, seed);
    a.in[1] = th_rand_view(MR_F32, mr_shape_1d(d), 0.5, 1.5, seed + 1);
    a.in[2] = th_rand_view(MR_F32, mr_shape_1d(d), -0.5, 0.5, seed + 2);
    a.out[0] = th_view(MR_F32, s);
    a.out[1] = th_view(MR_F32, rs);
    a.out[2] = th_view(MR_F32, rs);
    a.p.layernorm.eps = 1e-5;
    return a;
}

/* f32 backward args from a forward that has run (its x, gamma, mean, rstd) and a random dy. */
static mr_op_args ln_bwd_args(const mr_op_args *f, int with_dgamma, int with_dbeta, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_LAYERNORM_BWD);
    mr_shape s = f->in[0].shape;
    a.in[0] = f->in[0];
    a.in[1] = f->in[1];
    a.in[2] = f->out[1];
    a.in[3] = f->out[2];
    a.in[4] = th_rand_view(f->in[0].dtype, s, -1, 1, seed);
    a.out[0] = th_view(f->in[0].dtype, s);
    if (with_dgamma) a.out[1] = th_view(f->in[0].dtype, f->in[1].shape);
    if (with_dbeta) a.out[2] = th_view(f->in[0].dtype, f->in[1].shape);
    return a;
}

static void test_layernorm_fwd_bwd_vs_ref(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{1, 1, 0}, {3, 5, 0}, {7, 1, 0}, {1, 768, 0}, {64, 768, 0}, {2, 3, 17},
                                 {33, 129, 0}, {1, 4096, 0}, {300, 64, 0}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        mr_shape s = shapes[k][2] ? mr_shape_3d(shapes[k][0], shapes[k][1], shapes[k][2])
                                  : mr_shape_2d(shapes[k][0], shapes[k][1]);
        for (int off = 0; off < 2; off++) {
            /* off: rows centred at 10 with spread 1, where a one-pass variance would cancel */
            mr_op_args f = ln_fwd_args(s, off ? 9.5 : -2.0, off ? 10.5 : 2.0, 10 + k);
            char what[96];
            snprintf(what, sizeof what, "layernorm case %zu off %d", k, off);
            (void)th_check_cpu_vs_ref(what, &f, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            for (int opt = 0; opt < 3; opt++) {
                mr_op_args b = ln_bwd_args(&f, opt != 1, opt != 2, 50 + k);
                snprintf(what, sizeof what, "layernorm_bwd case %zu off %d opt %d", k, off, opt);
                (void)th_check_cpu_vs_ref(what, &b, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            }
        }
        th_free_all();
    }
}

static void test_layernorm_grad(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{4, 7}, {1, 1}, {3, 2}, {2, 16}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        mr_shape s = mr_shape_2d(shapes[k][0], shapes[k][1]);
        mr_op_args f32 = ln_fwd_args(s, -1, 1, 70 + k), f;
        f = th_widen_args(&f32);
        MR_ASSERT_OK(mr_op_run_ref(&f));
        mr_op_args b = ln_bwd_args(&f, 1, 1, 80 + k);
        MR_ASSERT_OK(mr_op_run_ref(&b));
        const double *r = b.in[4].data; /* dy is the r of the loss sum(y * r) */
        th_check_grad("layernorm dx", &f, 0, r, b.out[0].data, TOL_NN_GRAD_NMSE);
        th_check_grad("layernorm dgamma", &f, 1, r, b.out[1].data, TOL_NN_GRAD_NMSE);
        th_check_grad("layernorm dbeta", &f, 2, r, b.out[2].data, TOL_NN_GRAD_NMSE);
        th_free_all();
    }
}

static void test_layernorm_threads(void **state) {
    (void)state;
    mr_op_args f = ln_fwd_args(mr_shape_2d(257, 200), -1, 1, 90);
    th_give_workspace(&f);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    th_check_thread_invariant(&f);
    mr_op_args b = ln_bwd_args(&f, 1, 1, 91);
    th_check_thread_invariant(&b);
    th_free_all();
}

static void test_layernorm_errors(void **state) {
    (void)state;
    mr_op_args f = ln_fwd_args(mr_shape_2d(4, 8), -1, 1, 1);
    mr_op_args e = f;
    e.in[1].shape = mr_shape_1d(7);
    th_expect_invalid(&e, "layernorm");
    e = f;
    e.out[1].shape = mr_shape_1d(3);
    th_expect_invalid(&e, "layernorm");
    e = f;
    e.in[0].dtype = MR_I32;
    th_expect_invalid(&e, "layernorm");
    e = f;
    e.p.layernorm.eps = -1.0;
    th_expect_invalid(&e, "layernorm");
    e = f;
    e.in[2].data = NULL;
    th_expect_invalid(&e, "layernorm");
    e = f;
    e.in[0].shape = mr_shape_2d(4, 0);
    e.out[0].shape = e.in[0].shape;
    th_expect_invalid(&e, "layernorm");
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    mr_op_args b = ln_bwd_args(&f, 1, 1, 2);
    e = b;
    e.out[0].data = NULL;
    th_expect_invalid(&e, "layernorm_bwd");
    e = b;
    e.in[4].shape = mr_shape_2d(8, 4);
    th_expect_invalid(&e, "layernorm_bwd");
    e = b;
    e.out[1].shape = mr_shape_1d(9);
    th_expect_invalid(&e, "layernorm_bwd");
    e = b;
    e.in[3].dtype = MR_F64;
    th_expect_invalid(&e, "layernorm_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm_fwd_bwd_vs_ref),
        cmocka_unit_test(test_layernorm_grad),
        cmocka_unit_test(test_layernorm_threads),
        cmocka_unit_test(test_layernorm_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
