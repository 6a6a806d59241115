/* Permute (PERMUTE): the CPU f32 kernel against the f64 reference (exactly: it only moves
 * values) on the fast paths (identity, last-two swap, (B,T,H,D)->(B,H,T,D)) and general
 * permutations up to 8 dims with size-1 dims; permuting by the inverse restores x; the adjoint
 * identity sum(permute(x)*r) == sum(x*inverse_permute(r)) that makes the inverse permutation its
 * gradient; the f64 CPU path equals the reference; a permute into bf16/f16 (the CPU's fused cast)
 * bit for bit the f32 permute followed by CAST, on every case and thread count; bad perm, shape
 * and dtype errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static mr_shape permuted(mr_shape s, const int *perm) {
    mr_shape y = s;
    for (int i = 0; i < s.ndim; i++) y.dim[i] = s.dim[perm[i]];
    return y;
}

static mr_op_args perm_args(mr_dtype dt, mr_shape s, const int *perm, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_PERMUTE);
    for (int i = 0; i < s.ndim; i++) a.p.permute.perm[i] = perm[i];
    a.in[0] = th_rand_view(dt, s, -1, 1, seed);
    a.out[0] = th_view(dt, permuted(s, perm));
    return a;
}

typedef struct perm_case {
    int nd;
    int64_t dims[8];
    int perm[8];
} perm_case;

static const perm_case g_cases[] = {
    {2, {37, 53}, {1, 0}},                                /* 2-d transpose, odd sizes */
    {3, {4, 65, 33}, {0, 2, 1}},                          /* batched last-two swap */
    {4, {2, 5, 3, 8}, {0, 2, 1, 3}},                      /* (B,T,H,D)->(B,H,T,D) */
    {4, {4, 64, 12, 64}, {0, 2, 1, 3}},                   /* the same at attention size */
    {4, {2, 3, 5, 7}, {0, 1, 2, 3}},                      /* identity */
    {4, {2, 3, 5, 7}, {3, 1, 0, 2}},                      /* general */
    {5, {2, 1, 3, 1, 4}, {4, 3, 2, 1, 0}},                /* size-1 dims */
    {3, {1, 1, 1}, {2, 0, 1}},                            /* all size 1 */
    {4, {3, 1, 4, 5}, {0, 3, 2, 1}},                      /* a last-two swap once size-1 dims go */
    {8, {2, 3, 2, 1, 3, 2, 2, 3}, {7, 0, 5, 2, 1, 6, 3, 4}}, /* 8 dims */
    {6, {3, 2, 4, 2, 3, 2}, {0, 1, 4, 5, 2, 3}},          /* merged groups swapped */
    {1, {9}, {0}},
};

static void test_permute_vs_ref(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++) {
        const perm_case *c = &g_cases[k];
        mr_op_args a = perm_args(MR_F32, mr_shape_make(c->nd, c->dims), c->perm, 10 + k);
        char what[64];
        snprintf(what, sizeof what, "permute case %zu", k);
        (void)th_check_cpu_vs_ref(what, &a, 0.0, 0.0, 0.0);
        th_check_thread_invariant(&a);
        /* the inverse permutation restores x */
        int inv[8];
        for (int i = 0; i < c->nd; i++) inv[c->perm[i]] = i;
        mr_op_args b;
        mr_op_args_init(&b, MR_OP_PERMUTE);
        for (int i = 0; i < c->nd; i++) b.p.permute.perm[i] = inv[i];
        b.in[0] = a.out[0];
        b.out[0] = th_view(MR_F32, a.in[0].shape);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        assert_memory_equal(b.out[0].data, a.in[0].data, th_view_bytes(&a.in[0]));
        th_free_all();
    }
}

/* The "gradient check" of permute: its adjoint is the inverse permutation. */
static void test_permute_adjoint(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++) {
        const perm_case *c = &g_cases[k];
        mr_shape s = mr_shape_make(c->nd, c->dims);
        mr_op_args f = perm_args(MR_F64, s, c->perm, 30 + k);
        int inv[8];
        for (int i = 0; i < c->nd; i++) inv[c->perm[i]] = i;
        mr_op_args g = perm_args(MR_F64, f.out[0].shape, inv, 40 + k); /* in: r, out: inverse_permute(r) */
        MR_ASSERT_OK(mr_op_run_ref(&f));
        MR_ASSERT_OK(mr_op_run_ref(&g));
        const double *x = f.in[0].data, *y = f.out[0].data, *r = g.in[0].data, *rt = g.out[0].data;
        double lhs = 0.0, rhs = 0.0;
        int64_t n = mr_shape_numel(&s);
        for (int64_t i = 0; i < n; i++) {
            lhs += y[i] * r[i];
            rhs += x[i] * rt[i];
        }
        assert_true(fabs(lhs - rhs) <= 1e-12 * (1.0 + fabs(lhs)));
        /* and through finite differences, as for the other ops (small cases: each entry costs a
         * full forward) */
        if (n <= 2000) th_check_grad("permute dx", &f, 0, r, rt, TOL_NN_GRAD_NMSE);
        th_free_all();
    }
}

/* An f32 x permuted into a half y: the same bits as the f32 permute and then CAST. */
static void test_permute_cast(void **state) {
    (void)state;
    const mr_dtype halves[2] = {MR_BF16, MR_F16};
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++)
        for (int h = 0; h < 2; h++) {
            const perm_case *c = &g_cases[k];
            mr_op_args a = perm_args(MR_F32, mr_shape_make(c->nd, c->dims), c->perm, 50 + k);
            /* some values that round differently: halfway cases, NaN, infinities, subnormals */
            float *x = a.in[0].data;
            const int64_t n = mr_shape_numel(&a.in[0].shape);
            const float odd[6] = {1.00390625f, 1.01171875f, NAN, INFINITY, -1e-40f, 65520.0f};
            for (int64_t i = 0; i < n && i < 6; i++) x[(i * 7) % n] = odd[i];
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
            mr_op_args cast;
            mr_op_args_init(&cast, MR_OP_CAST);
            cast.in[0] = a.out[0];
            cast.out[0] = th_view(halves[h], a.out[0].shape);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &cast));
            mr_op_args b = a;
            b.out[0] = th_view(halves[h], a.out[0].shape);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
            if (memcmp(b.out[0].data, cast.out[0].data, th_view_bytes(&b.out[0])))
                fail_msg("case %zu: the permute into %s differs from permute then CAST", k, mr_dtype_name(halves[h]));
            th_check_thread_invariant(&b);
            th_free_all();
        }
}

static void test_permute_errors(void **state) {
    (void)state;
    const int perm[3] = {2, 0, 1};
    mr_op_args a = perm_args(MR_F32, mr_shape_3d(2, 3, 4), perm, 1), e;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    e = a;
    e.p.permute.perm[1] = 2; /* duplicate */
    th_expect_invalid(&e, "permute");
    e = a;
    e.p.permute.perm[0] = 3;
    th_expect_invalid(&e, "permute");
    e = a;
    e.p.permute.perm[2] = -1;
    th_expect_invalid(&e, "permute");
    e = a;
    e.out[0].shape = mr_shape_3d(2, 3, 4);
    th_expect_invalid(&e, "permute");
    e = a;
    e.out[0].dtype = MR_I32;
    th_expect_invalid(&e, "permute");
    e = a;
    e.out[0].dtype = MR_F64; /* only a narrowing to a half type may change the dtype */
    th_expect_invalid(&e, "permute");
    e = perm_args(MR_F64, mr_shape_3d(2, 3, 4), perm, 1);
    e.out[0].dtype = MR_BF16; /* from f32 only */
    th_expect_invalid_cpu_ref(&e, "f64");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_permute_vs_ref),
        cmocka_unit_test(test_permute_adjoint),
        cmocka_unit_test(test_permute_cast),
        cmocka_unit_test(test_permute_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
