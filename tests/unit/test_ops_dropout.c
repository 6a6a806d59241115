/* Dropout (DROPOUT, DROPOUT_BWD): the CPU f32 kernel against the f64 reference (same mask, so
 * values agree to rounding) for several p, seeds, offsets and odd sizes; p == 0 copies, p == 1
 * zeros; the mask is identical with 1 and 2 threads and keeps a fraction close to 1-p; the f64
 * CPU path equals the reference; the gradient (the backward) against central differences;
 * p outside [0, 1] and shape errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static mr_op_args drop_args(mr_op_id op, mr_dtype dt, mr_shape s, double p, uint64_t seed, uint64_t offset) {
    mr_op_args a;
    mr_op_args_init(&a, op);
    a.in[0] = th_rand_view(dt, s, 0.5, 1.5, seed); /* nonzero, so zeros in y are dropped elements */
    a.out[0] = th_view(dt, s);
    a.p.dropout = (mr_dropout_params){p, seed, offset};
    return a;
}

static void test_dropout_vs_ref(void **state) {
    (void)state;
    const double ps[] = {0.0, 0.1, 0.5, 0.9, 1.0};
    const int64_t sizes[] = {1, 3, 7, 1000, 100003};
    for (int op = 0; op < 2; op++)
        for (size_t i = 0; i < 5; i++)
            for (size_t j = 0; j < 5; j++) {
                mr_op_args a = drop_args(op ? MR_OP_DROPOUT_BWD : MR_OP_DROPOUT, MR_F32, mr_shape_1d(sizes[j]), ps[i],
                                         1234 + j, 7 * i);
                char what[64];
                snprintf(what, sizeof what, "dropout op %d p %g n %lld", op, ps[i], (long long)sizes[j]);
                (void)th_check_cpu_vs_ref(what, &a, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
                const float *x = a.in[0].data, *y = a.out[0].data;
                if (ps[i] == 0.0) assert_memory_equal(x, y, th_view_bytes(&a.in[0]));
                for (int64_t k = 0; ps[i] == 1.0 && k < sizes[j]; k++) assert_true(y[k] == 0.0f);
                th_free_all();
            }
}

static void test_dropout_mask(void **state) {
    (void)state;
    const double ps[] = {0.1, 0.5, 0.8};
    const int64_t n = 1 << 20;
    for (size_t i = 0; i < 3; i++) {
        mr_op_args a = drop_args(MR_OP_DROPOUT, MR_F32, mr_shape_2d(1024, n / 1024), ps[i], 99 + i, 3);
        th_check_thread_invariant(&a);
        th_give_workspace(&a);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        const float *y = a.out[0].data;
        int64_t kept = 0;
        for (int64_t k = 0; k < n; k++) kept += y[k] != 0.0f;
        double frac = (double)kept / (double)n, sd = sqrt(ps[i] * (1 - ps[i]) / (double)n);
        if (fabs(frac - (1 - ps[i])) > 5 * sd) fail_msg("p %g: kept %g, expected %g +- %g", ps[i], frac, 1 - ps[i], 5 * sd);
        /* the backward recomputes the same mask; another offset gives another one */
        mr_op_args b = drop_args(MR_OP_DROPOUT_BWD, MR_F32, a.in[0].shape, ps[i], 99 + i, 3);
        b.in[0] = a.in[0];
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        assert_memory_equal(a.out[0].data, b.out[0].data, th_view_bytes(&a.out[0]));
        b.p.dropout.offset = 4;
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        assert_true(memcmp(a.out[0].data, b.out[0].data, th_view_bytes(&a.out[0])) != 0);
        th_free_all();
    }
}

static void test_dropout_grad(void **state) {
    (void)state;
    for (int op = 0; op < 2; op++) {
        mr_op_args f = drop_args(op ? MR_OP_DROPOUT_BWD : MR_OP_DROPOUT, MR_F64, mr_shape_2d(3, 11), 0.3, 5, 1);
        /* the gradient of either op is the op applied to r (the same mask and scale) */
        mr_op_args b = drop_args(MR_OP_DROPOUT_BWD, MR_F64, mr_shape_2d(3, 11), 0.3, 5, 1);
        th_fill_uniform_f64(b.in[0].data, 33, -1, 1, 77);
        MR_ASSERT_OK(mr_op_run_ref(&b));
        th_check_grad(op ? "dropout_bwd d(dy)" : "dropout dx", &f, 0, b.in[0].data, b.out[0].data, TOL_NN_GRAD_NMSE);
        th_free_all();
    }
}

static void test_dropout_errors(void **state) {
    (void)state;
    mr_op_args a = drop_args(MR_OP_DROPOUT, MR_F32, mr_shape_1d(10), 0.5, 1, 0), e;
    const double bad[] = {-0.1, 1.5, NAN};
    for (int i = 0; i < 3; i++) {
        e = a;
        e.p.dropout.p = bad[i];
        th_expect_invalid(&e, "dropout");
    }
    e = a;
    e.out[0].shape = mr_shape_1d(11);
    th_expect_invalid(&e, "dropout");
    e = a;
    e.out[0].dtype = MR_F64;
    th_expect_invalid(&e, "dropout");
    e = a;
    e.op = MR_OP_DROPOUT_BWD;
    e.in[0].dtype = MR_I32;
    e.out[0].dtype = MR_I32;
    th_expect_invalid(&e, "dropout_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_vs_ref),
        cmocka_unit_test(test_dropout_mask),
        cmocka_unit_test(test_dropout_grad),
        cmocka_unit_test(test_dropout_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
