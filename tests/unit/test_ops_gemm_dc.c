/* GEMM_DC (a GEMM's output gradient made ready for its gradient GEMMs: the GELU gradient, the
 * bias sum and the half cast in one pass): the CPU f32 kernel against the f64 reference with and
 * without the GELU pre-activation, each output alone and both, shapes with row counts that are
 * not multiples of the 64-row blocks and more columns than one 512-column segment; the half dc
 * (bf16, f16) bit for bit the CAST of the f32 dc, with the same dbias bits; thread-count
 * independence (1, 2 and 4 threads); the error paths. The gradient through the graph (linear with
 * bias and GELU, finite differences) is tests/unit/test_autodiff_grad.c's. */
#include <stdio.h>
#include <string.h>

#include "harness.h"

typedef struct {
    mr_shape dy;
    int pre, dc, db;
} dc_case;

static const dc_case *dc_cases(size_t *n) {
    static dc_case c[16];
    size_t k = 0;
    c[k++] = (dc_case){th_shp(2, 7, 13, 0, 0), 1, 1, 1};
    c[k++] = (dc_case){th_shp(2, 7, 13, 0, 0), 0, 1, 1};
    c[k++] = (dc_case){th_shp(2, 7, 13, 0, 0), 1, 0, 1};
    c[k++] = (dc_case){th_shp(2, 7, 13, 0, 0), 1, 1, 0};
    c[k++] = (dc_case){th_shp(2, 1, 5, 0, 0), 1, 1, 1};      /* one row */
    c[k++] = (dc_case){th_shp(1, 9, 0, 0, 0), 1, 1, 1};      /* 1-d: one row of 9 */
    c[k++] = (dc_case){th_shp(3, 3, 50, 129, 0), 1, 1, 1};   /* 150 rows: blocks of 64, 64, 22 */
    c[k++] = (dc_case){th_shp(2, 130, 600, 0, 0), 1, 1, 1};  /* two column segments, threaded */
    c[k++] = (dc_case){th_shp(2, 130, 600, 0, 0), 0, 0, 1};
    c[k++] = (dc_case){th_shp(2, 0, 8, 0, 0), 1, 1, 1};      /* no rows: dbias 0 */
    *n = k;
    return c;
}

static mr_op_args dc_args(const dc_case *c, mr_dtype dt, mr_dtype dct, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM_DC);
    a.in[0] = th_rand_view(dt, c->dy, -2, 2, seed);
    if (c->pre) a.in[1] = th_rand_view(dt, c->dy, -4, 4, seed + 1);
    if (c->dc) a.out[0] = th_view(dct, c->dy);
    if (c->db) a.out[1] = th_view(dt, mr_shape_1d(c->dy.ndim ? c->dy.dim[c->dy.ndim - 1] : 1));
    return a;
}

/* The workspace the op asks for, full of NaN patterns: the planner's scratch holds whatever the
 * previous node left there, so the kernel must not read it before writing it. */
static void give_dirty_workspace(mr_op_args *a) {
    th_give_workspace(a);
    if (a->workspace) memset(a->workspace, 0xff, a->workspace_bytes);
}

static void test_vs_ref(void **state) {
    (void)state;
    size_t nc;
    const dc_case *c = dc_cases(&nc);
    for (size_t i = 0; i < nc; i++) {
        mr_op_args a = dc_args(&c[i], MR_F64, MR_F64, 100 + 7 * i);
        char what[64];
        snprintf(what, sizeof what, "gemm_dc case %zu", i);
        mr_op_args r = th_check_cpu_vs_ref(what, &a, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        /* the reference is the definition: GELU_BWD's math, then a plain sum */
        if (c[i].dc && c[i].pre) {
            mr_op_args gb;
            mr_op_args_init(&gb, MR_OP_GELU_BWD);
            gb.in[0] = r.in[1];
            gb.in[2] = r.in[0];
            gb.out[0] = th_view(MR_F64, c[i].dy);
            MR_ASSERT_OK(mr_op_run_ref(&gb));
            assert_memory_equal(gb.out[0].data, r.out[0].data, th_view_bytes(&gb.out[0]));
        }
        th_free_all();
    }
    print_message("gemm_dc: max f32 abs err %.3g, rel err %.3g\n", th_max_abs_err, th_max_rel_err);
}

/* A half dc is the f32 dc rounded by CAST, bit for bit; dbias does not depend on dc's dtype. */
static void test_half(void **state) {
    (void)state;
    size_t nc;
    const dc_case *c = dc_cases(&nc);
    const mr_dtype halves[2] = {MR_BF16, MR_F16};
    for (size_t i = 0; i < nc; i++) {
        if (!c[i].dc) continue;
        for (int h = 0; h < 2; h++) {
            mr_op_args f = dc_args(&c[i], MR_F32, MR_F32, 300 + i);
            mr_op_args b = f;
            b.out[0] = th_view(halves[h], c[i].dy);
            if (c[i].db) b.out[1] = th_view(MR_F32, f.out[1].shape);
            give_dirty_workspace(&f);
            give_dirty_workspace(&b);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
            mr_op_args cast;
            mr_op_args_init(&cast, MR_OP_CAST);
            cast.in[0] = f.out[0];
            cast.out[0] = th_view(halves[h], c[i].dy);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &cast));
            if (memcmp(cast.out[0].data, b.out[0].data, th_view_bytes(&b.out[0])))
                fail_msg("case %zu: the %s dc differs from CAST of the f32 dc", i, mr_dtype_name(halves[h]));
            if (c[i].db && memcmp(f.out[1].data, b.out[1].data, th_view_bytes(&b.out[1])))
                fail_msg("case %zu: dbias differs between an f32 and a %s dc", i, mr_dtype_name(halves[h]));
            if (c[i].db) {
                /* against the reference on the same (f32) inputs */
                mr_op_args w = th_widen_args(&f);
                MR_ASSERT_OK(mr_op_run_ref(&w));
                if (!th_compare("dbias", b.out[1].data, MR_F32, w.out[1].data, mr_shape_numel(&b.out[1].shape),
                                TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE))
                    fail_msg("case %zu: dbias with a %s dc", i, mr_dtype_name(halves[h]));
            }
            th_free_all();
        }
    }
}

static void test_threads(void **state) {
    (void)state;
    const dc_case big[3] = {{mr_shape_2d(1000, 300), 1, 1, 1}, {mr_shape_2d(515, 700), 0, 1, 1},
                            {mr_shape_3d(4, 100, 96), 1, 0, 1}};
    const mr_dtype dcts[3] = {MR_F32, MR_BF16, MR_F16};
    for (int i = 0; i < 3; i++)
        for (int d = 0; d < 3; d++) {
            mr_op_args a = dc_args(&big[i], MR_F32, dcts[d], 500 + i);
            give_dirty_workspace(&a);
            th_check_thread_invariant(&a);
            /* and 4 threads against 1 */
            mr_op_args one = th_fresh_outputs(&a), four = th_fresh_outputs(&a);
            const int nt = mr_cpu_threads();
            mr_cpu_set_threads(1);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &one));
            mr_cpu_set_threads(4);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &four));
            mr_cpu_set_threads(nt);
            for (int k = 0; k < 2; k++)
                if (one.out[k].data) assert_memory_equal(one.out[k].data, four.out[k].data, th_view_bytes(&one.out[k]));
            th_free_all();
        }
}

static void test_errors(void **state) {
    (void)state;
    const dc_case c = {mr_shape_2d(3, 4), 1, 1, 1};
    mr_op_args a = dc_args(&c, MR_F32, MR_F32, 1);
    a.out[0].data = a.out[1].data = NULL;
    th_expect_invalid(&a, "gemm_dc"); /* no output */
    a = dc_args(&c, MR_F32, MR_F32, 1);
    a.in[1] = th_view(MR_F32, mr_shape_2d(4, 3));
    th_expect_invalid_cpu_ref(&a, "pre"); /* pre's shape */
    a = dc_args(&c, MR_F32, MR_F32, 1);
    a.out[1] = th_view(MR_F32, mr_shape_1d(3));
    th_expect_invalid_cpu_ref(&a, "dbias"); /* (N) is 4 */
    a = dc_args(&c, MR_F64, MR_BF16, 1);
    th_expect_invalid_cpu_ref(&a, "dc"); /* a half dc needs an f32 dy */
    a = dc_args(&c, MR_F32, MR_F32, 1);
    a.in[0] = th_view(MR_I32, c.dy);
    th_expect_invalid_cpu_ref(&a, "dy");
    a = dc_args(&c, MR_F32, MR_F32, 1);
    a.in[1] = th_view(MR_F64, c.dy);
    th_expect_invalid_cpu_ref(&a, "pre"); /* mixed float types */
    a = dc_args(&c, MR_F32, MR_F32, 1);
    a.out[0] = th_view(MR_I32, c.dy);
    th_expect_invalid_cpu_ref(&a, "dc");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_ref),
        cmocka_unit_test(test_half),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
