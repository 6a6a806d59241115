/* Embedding (EMBEDDING, EMBEDDING_BWD): the CPU f32 gather and scatter-add against the f64
 * reference, with repeated ids, 3-d ids, D = 1 and wide D; the f64 CPU path equals the
 * reference; dtable against central differences of the gather; the scatter-add independent of
 * the thread count; out-of-range ids rejected naming the position; shape and dtype errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static mr_view ids_view(mr_shape s, int32_t vocab, uint64_t seed) {
    mr_view v = th_view(MR_I32, s);
    th_fill_int32(v.data, mr_shape_numel(&s), 0, vocab, seed);
    return v;
}

static mr_shape with_d(mr_shape s, int64_t d) {
    s.dim[s.ndim++] = d;
    return s;
}

static mr_op_args emb_fwd_args(mr_dtype dt, int64_t vocab, int64_t d, mr_shape ids_s, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_EMBEDDING);
    a.in[0] = th_rand_view(dt, mr_shape_2d(vocab, d), -1, 1, seed);
    a.in[1] = ids_view(ids_s, (int32_t)vocab, seed + 1);
    a.out[0] = th_view(dt, with_d(ids_s, d));
    return a;
}

static mr_op_args emb_bwd_args(mr_dtype dt, const mr_view *ids, int64_t vocab, int64_t d, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_EMBEDDING_BWD);
    a.in[0] = *ids;
    a.in[1] = th_rand_view(dt, with_d(ids->shape, d), -1, 1, seed);
    a.out[0] = th_view(dt, mr_shape_2d(vocab, d));
    return a;
}

static void test_embedding_vs_ref(void **state) {
    (void)state;
    struct { int64_t v, d; mr_shape ids; } cases[] = {
        {1, 1, mr_shape_1d(1)},       {5, 3, mr_shape_1d(17)},         {50, 1, mr_shape_2d(4, 9)},
        {7, 33, mr_shape_3d(2, 3, 5)}, {65, 768, mr_shape_2d(4, 64)},  {1000, 48, mr_shape_1d(3)},
        {3, 100, mr_shape_1d(2000)},  {10, 4, mr_shape_1d(0)},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char what[64];
        mr_op_args f = emb_fwd_args(MR_F32, cases[k].v, cases[k].d, cases[k].ids, 10 + k);
        snprintf(what, sizeof what, "embedding case %zu", k);
        (void)th_check_cpu_vs_ref(what, &f, 0.0, 0.0, 0.0);
        /* few rows and many ids: every row is hit many times */
        mr_op_args b = emb_bwd_args(MR_F32, &f.in[1], cases[k].v, cases[k].d, 20 + k);
        snprintf(what, sizeof what, "embedding_bwd case %zu", k);
        (void)th_check_cpu_vs_ref(what, &b, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        th_check_thread_invariant(&b);
        th_free_all();
    }
}

static void test_embedding_grad(void **state) {
    (void)state;
    mr_op_args f = emb_fwd_args(MR_F64, 6, 5, mr_shape_2d(3, 4), 30);
    mr_op_args b = emb_bwd_args(MR_F64, &f.in[1], 6, 5, 31);
    MR_ASSERT_OK(mr_op_run_ref(&b));
    th_check_grad("embedding dtable", &f, 0, b.in[1].data, b.out[0].data, TOL_NN_GRAD_NMSE);
    th_free_all();
}

static void test_embedding_errors(void **state) {
    (void)state;
    mr_op_args f = emb_fwd_args(MR_F32, 10, 4, mr_shape_1d(6), 1);
    int32_t *ids = f.in[1].data;
    ids[4] = 10;
    th_expect_invalid(&f, "embedding");
    assert_non_null(strstr(mr_last_error(), "ids[4]"));
    mr_op_args w = th_widen_args(&f);
    assert_int_equal(mr_op_run_ref(&w), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "ids[4]"));
    ids[4] = -1;
    mr_op_args b = emb_bwd_args(MR_F32, &f.in[1], 10, 4, 2);
    th_give_workspace(&b); /* else the missing workspace is reported before the ids are seen */
    th_expect_invalid(&b, "embedding_bwd");
    assert_non_null(strstr(mr_last_error(), "ids[4]"));
    ids[4] = 0;
    mr_op_args e = f;
    e.in[1].dtype = MR_I64;
    th_expect_invalid(&e, "embedding");
    e = f;
    e.out[0].shape = mr_shape_2d(6, 5);
    th_expect_invalid(&e, "embedding");
    e = f;
    e.in[0].shape = mr_shape_1d(40);
    th_expect_invalid(&e, "embedding");
    e = b;
    e.in[1].shape = mr_shape_2d(5, 4);
    th_expect_invalid(&e, "embedding_bwd");
    e = b;
    e.out[0].dtype = MR_F64;
    th_expect_invalid(&e, "embedding_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_vs_ref),
        cmocka_unit_test(test_embedding_grad),
        cmocka_unit_test(test_embedding_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
