/* core/: status and error messages, shapes and broadcasting, tensors (views, reshape, refcounts,
 * copies), devices and backend lookup, and the op table's completeness. */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "core/log.h"

static void test_status(void **state) {
    (void)state;
    mr_clear_error();
    assert_string_equal(mr_last_error(), "");
    mr_status st = mr_set_error(MR_ERR_IO, "reading %s: %s", "x.h5", "no such file");
    assert_int_equal(st, MR_ERR_IO);
    /* the message is what users see; the C position is kept apart (debug logs) */
    assert_string_equal(mr_last_error(), "reading x.h5: no such file");
    assert_int_equal(strncmp(mr_last_error_where(), "test_core.c:", 12), 0);
    /* wrapping the previous message (the argument aliases the stored text) */
    st = mr_set_error(MR_ERR_IO, "loading: %s", mr_last_error());
    assert_string_equal(mr_last_error(), "loading: reading x.h5: no such file");
    mr_clear_error();
    assert_string_equal(mr_last_error_where(), "");
    assert_string_equal(mr_status_name(MR_ERR_NOMEM), "MR_ERR_NOMEM");
    assert_string_equal(mr_status_name((mr_status)-99), "MR_ERR_UNKNOWN");
}

static void test_shape(void **state) {
    (void)state;
    mr_shape a = mr_shape_3d(2, 1, 4), b = mr_shape_2d(3, 1), out;
    MR_ASSERT_OK(mr_shape_broadcast(&a, &b, &out));
    mr_shape want = mr_shape_3d(2, 3, 4);
    assert_true(mr_shape_eq(&out, &want));
    assert_int_equal(mr_shape_numel(&out), 24);
    mr_shape c = mr_shape_2d(3, 5);
    assert_int_equal(mr_shape_broadcast(&a, &c, &out), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "[2, 1, 4]"));
    assert_non_null(strstr(mr_last_error(), "[3, 5]"));
    int64_t st[MR_MAX_DIMS];
    mr_shape_strides(&want, st);
    assert_int_equal(st[0], 12);
    assert_int_equal(st[1], 4);
    assert_int_equal(st[2], 1);
    mr_shape s0 = mr_shape_make(0, NULL);
    assert_int_equal(mr_shape_numel(&s0), 1);
    char buf[64];
    assert_string_equal(mr_shape_str(&s0, buf, sizeof buf), "[]");
    int64_t big[8] = {2, 2, 2, 2, 2, 2, 2, 1LL << 40};
    mr_shape s8 = mr_shape_make(8, big);
    assert_true(mr_shape_numel(&s8) == (1LL << 47)); /* int64 sizes: no 32-bit overflow */
}

static void test_tensor(void **state) {
    (void)state;
    mr_device cpu = mr_device_cpu();
    mr_shape s = mr_shape_2d(4, 6);
    mr_tensor *t = NULL, *r = NULL, *v = NULL, *z = NULL, *c = NULL;
    int64_t before = mr_tensor_alloc_count();
    MR_ASSERT_OK(mr_tensor_new(cpu, MR_F32, &s, &t));
    assert_int_equal(mr_tensor_alloc_count() - before, 1);
    assert_int_equal(mr_tensor_numel(t), 24);
    assert_int_equal(mr_tensor_nbytes(t), 96);
    assert_true(((uintptr_t)mr_tensor_data(t) & 63) == 0);
    float h[24];
    for (int i = 0; i < 24; i++) h[i] = (float)i;
    MR_ASSERT_OK(mr_tensor_copy_from_host(t, h, sizeof h));
    mr_shape s2 = mr_shape_3d(2, 3, 4);
    MR_ASSERT_OK(mr_tensor_reshape(t, &s2, &r));
    assert_ptr_equal(mr_tensor_data(r), mr_tensor_data(t)); /* a view, not a copy */
    assert_int_equal(mr_tensor_storage_refs(t), 2);
    mr_shape s3 = mr_shape_1d(5);
    MR_ASSERT_OK(mr_tensor_view(t, 10, &s3, &v));
    assert_float_equal(((float *)mr_tensor_data(v))[0], 10.0f, 0.0f);
    assert_int_equal(mr_tensor_alloc_count() - before, 1); /* views allocate no storage */
    mr_shape bad = mr_shape_1d(25);
    assert_int_equal(mr_tensor_reshape(t, &bad, &z), MR_ERR_INVALID);
    assert_null(z);
    assert_non_null(strstr(mr_last_error(), "[4, 6]"));
    assert_int_equal(mr_tensor_view(t, 20, &s3, &z), MR_ERR_INVALID);
    mr_tensor_free(t); /* storage lives on through r and v */
    assert_int_equal(mr_tensor_storage_refs(r), 2);
    float back[5];
    MR_ASSERT_OK(mr_tensor_copy_to_host(v, back, sizeof back));
    assert_float_equal(back[4], 14.0f, 0.0f);
    assert_int_equal(mr_tensor_copy_to_host(v, back, 4), MR_ERR_INVALID);
    MR_ASSERT_OK(mr_tensor_to(r, cpu, &c));
    assert_ptr_not_equal(mr_tensor_data(c), mr_tensor_data(r));
    assert_memory_equal(mr_tensor_data(c), h, sizeof h);
    MR_ASSERT_OK(mr_tensor_zeros(cpu, MR_BF16, &s2, &z));
    assert_int_equal(mr_tensor_nbytes(z), 48);
    for (int i = 0; i < 24; i++) assert_int_equal(((uint16_t *)mr_tensor_data(z))[i], 0);
    mr_tensor_free(r);
    mr_tensor_free(v);
    mr_tensor_free(c);
    mr_tensor_free(z);
    mr_tensor_free(NULL);
    mr_shape neg = mr_shape_1d(-1);
    assert_int_equal(mr_tensor_new(cpu, MR_F32, &neg, &t), MR_ERR_INVALID);
    assert_int_equal(mr_tensor_new(cpu, (mr_dtype)42, &s, &t), MR_ERR_INVALID);
}

static void test_device(void **state) {
    (void)state;
    mr_device d;
    MR_ASSERT_OK(mr_device_parse("cpu", &d));
    assert_int_equal(d.kind, MR_DEVICE_CPU);
    MR_ASSERT_OK(mr_device_parse("cuda:3", &d));
    assert_int_equal(d.kind, MR_DEVICE_CUDA);
    assert_int_equal(d.index, 3);
    assert_int_equal(mr_device_parse("gpu", &d), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "'gpu'"));
    assert_int_equal(mr_device_parse("cuda:x", &d), MR_ERR_INVALID);
    assert_int_equal(mr_device_parse("cpu:1", &d), MR_ERR_INVALID);
    char buf[32];
    assert_string_equal(mr_device_str(d = (mr_device){MR_DEVICE_CUDA, 1}, buf, sizeof buf), "cuda:1");
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CPU, &be));
    assert_string_equal(be->name, "cpu");
    /* Without a GPU (this machine, CI) a CUDA build must fall back to the CPU, not fail. */
    if (mr_cuda_device_count() == 0) {
        assert_int_equal(mr_backend_get(MR_DEVICE_CUDA, &be), MR_ERR_NOT_FOUND);
        assert_null(be);
        assert_non_null(strstr(mr_last_error(), "no usable CUDA device"));
        assert_int_equal(mr_device_default().kind, MR_DEVICE_CPU);
        mr_shape s = mr_shape_1d(4);
        mr_tensor *t = NULL;
        assert_int_equal(mr_tensor_new((mr_device){MR_DEVICE_CUDA, 0}, MR_F32, &s, &t), MR_ERR_NOT_FOUND);
    }
    fprintf(stderr, "cuda compiled: %d, devices: %d\n", mr_cuda_compiled(), mr_cuda_device_count());
}

/* Ops whose gradient is expressed with other ops rather than a *_BWD kernel. */
static int grad_by_other_ops(mr_op_id op) {
    return op == MR_OP_GEMM      /* dA = dC B^T, dB = A^T dC: GEMMs (test_gemm.c) */
           || op == MR_OP_PERMUTE /* the inverse permutation (test_ops_permute.c) */
           || op == MR_OP_CAST    /* a cast back to the input type */
           || op == MR_OP_CONCAT  /* slices (views) of the output gradient */
           || op == MR_OP_HOOK    /* the same hook on dy (self-adjoint) */
           || op == MR_OP_CONV2D_MAXPOOL; /* the conv's backward ops with p.conv.pool (test_ops_conv_pool.c) */
}

static void test_op_table(void **state) {
    (void)state;
    int fwd_has_bwd[MR_OP_COUNT] = {0};
    for (int i = 1; i < MR_OP_COUNT; i++) {
        const mr_op_info *op = mr_op_get((mr_op_id)i);
        assert_non_null(op);
        assert_int_equal(op->id, i);
        assert_non_null(op->name);
        assert_non_null(op->check);
        assert_non_null(op->ref);
        if (!op->kernel[MR_DEVICE_CPU]) fail_msg("op %s has no CPU kernel", op->name);
        assert_ptr_equal(mr_op_find(op->name), op);
        if (op->fwd != MR_OP_NONE) fwd_has_bwd[op->fwd] = 1;
    }
    for (int i = 1; i < MR_OP_COUNT; i++) {
        const mr_op_info *op = mr_op_get((mr_op_id)i);
        int is_fwd = op->fwd == MR_OP_NONE && i != MR_OP_SGD_UPDATE && i != MR_OP_ADAMW_UPDATE;
        if (is_fwd && !fwd_has_bwd[i] && !grad_by_other_ops((mr_op_id)i))
            fail_msg("differentiable op %s has no backward kernel", op->name);
    }
    assert_null(mr_op_get(MR_OP_NONE));
    assert_null(mr_op_get(MR_OP_COUNT));
    assert_null(mr_op_find("no_such_op"));
    mr_op_args a;
    mr_op_args_init(&a, (mr_op_id)1000);
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
}

static void test_threads(void **state) {
    (void)state;
    int n = mr_cpu_threads();
    assert_true(n >= 1);
    mr_cpu_set_threads(1);
    assert_int_equal(mr_cpu_threads(), 1);
    mr_cpu_set_threads(n);
    assert_int_equal(mr_cpu_threads(), n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status), cmocka_unit_test(test_shape),    cmocka_unit_test(test_tensor),
        cmocka_unit_test(test_device), cmocka_unit_test(test_op_table), cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
