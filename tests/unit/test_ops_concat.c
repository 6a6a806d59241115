/* MR_OP_CONCAT: the CPU kernel against the reference for float and integer dtypes, with absent
 * inputs skipped; error paths. */
#include <string.h>

#include "harness.h"

static void test_concat(void **state) {
    (void)state;
    const mr_dtype dts[] = {MR_F32, MR_F64, MR_I32, MR_BF16};
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
        mr_op_args a, r;
        mr_op_args_init(&a, MR_OP_CONCAT);
        a.in[0] = th_view(dts[d], mr_shape_2d(3, 4));
        a.in[2] = th_view(dts[d], mr_shape_1d(5)); /* in[1] absent */
        a.in[5] = th_view(dts[d], mr_shape_3d(1, 1, 1));
        for (int i = 0; i < MR_OP_MAX_IO; i++) {
            if (!a.in[i].data) continue;
            int64_t n = mr_shape_numel(&a.in[i].shape);
            for (int64_t j = 0; j < n; j++) mr_dtype_set(a.in[i].data, dts[d], j, (double)(i * 100 + j));
        }
        a.out[0] = th_view(dts[d], mr_shape_2d(2, 9));
        r = a;
        r.out[0] = th_view(dts[d], mr_shape_2d(2, 9));
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        MR_ASSERT_OK(mr_op_run_ref(&r));
        assert_memory_equal(a.out[0].data, r.out[0].data, 18 * mr_dtype_size(dts[d]));
        assert_int_equal((int)mr_dtype_get(a.out[0].data, dts[d], 12), 200);
        assert_int_equal((int)mr_dtype_get(a.out[0].data, dts[d], 17), 500);
    }
    th_free_all();
}

static void test_concat_errors(void **state) {
    (void)state;
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_CONCAT);
    a.in[0] = th_view(MR_F32, mr_shape_1d(3));
    a.out[0] = th_view(MR_F32, mr_shape_1d(4));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "concat"));
    a.out[0] = th_view(MR_F64, mr_shape_1d(3));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    a.in[0].data = NULL;
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_concat), cmocka_unit_test(test_concat_errors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
