/* autodiff graphs and plans: building validates shapes and keeps the first error; plans compute
 * what the ops compute, share arena bytes between values whose lifetimes do not overlap, keep
 * what the caller asked to read, and run with no heap allocation after the first run. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "autodiff/graph.h"

/* Heap calls counted for the steady-state test (glibc: the real allocator is __libc_*). */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
#ifndef __SANITIZE_ADDRESS__
static long g_heap_calls;
#endif
#ifndef __SANITIZE_ADDRESS__
void *malloc(size_t n) {
    g_heap_calls++;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    g_heap_calls++;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    g_heap_calls++;
    return __libc_realloc(p, n);
}
#endif

static void test_build_errors(void **state) {
    (void)state;
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val x = mr_graph_input(g, "x", MR_F32, mr_shape_2d(4, 3));
    mr_val w = mr_graph_param(g, "w", MR_F32, mr_shape_2d(5, 2));
    assert_int_equal(mr_graph_status(g), MR_OK);
    mr_val y = mr_graph_matmul(g, x, w, 0, 1, 1.0); /* (4,3) x (2,5): K mismatch */
    assert_int_equal(y.id, 0);
    assert_int_equal(mr_graph_status(g), MR_ERR_INVALID);
    assert_non_null(strstr(mr_graph_error(g), "gemm"));
    assert_non_null(strstr(mr_graph_error(g), "[4, 3]"));
    assert_non_null(strstr(mr_graph_error(g), "[5, 2]"));
    char first[512];
    snprintf(first, sizeof first, "%s", mr_graph_error(g));
    /* sticky: later calls do nothing and keep the first message */
    mr_val z = mr_graph_unary(g, MR_OP_RELU, x);
    assert_int_equal(z.id, 0);
    assert_string_equal(mr_graph_error(g), first);
    mr_plan *p = NULL;
    assert_int_equal(mr_plan_new(g, MR_DEVICE_CPU, NULL, 0, &p), MR_ERR_INVALID);
    assert_null(p);
    mr_graph_free(g);

    MR_ASSERT_OK(mr_graph_new(&g));
    x = mr_graph_input(g, "x", MR_F32, mr_shape_2d(4, 3));
    mr_graph_input(g, "x", MR_F32, mr_shape_1d(2));
    assert_non_null(strstr(mr_graph_error(g), "'x' is used twice"));
    mr_graph_free(g);

    MR_ASSERT_OK(mr_graph_new(&g));
    x = mr_graph_input(g, "x", MR_F32, mr_shape_2d(4, 3));
    mr_graph_reshape(g, x, mr_shape_1d(13));
    assert_non_null(strstr(mr_graph_error(g), "reshape"));
    mr_graph_free(g);

    MR_ASSERT_OK(mr_graph_new(&g));
    x = mr_graph_input(g, "x", MR_F32, mr_shape_2d(4, 3));
    mr_val b = mr_graph_input(g, "b", MR_F32, mr_shape_1d(4));
    mr_graph_add(g, x, b); /* (4,3) + (4): does not broadcast */
    assert_non_null(strstr(mr_graph_error(g), "add"));
    mr_graph_free(g);
    mr_graph_free(NULL);
}

/* y = relu(x W^T + b) * 0.5 + x W^T, checked against the ops run by hand. */
static void test_plan_computes(void **state) {
    (void)state;
    const int64_t N = 7, K = 5, M = 3;
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val x = mr_graph_input(g, "x", MR_F64, mr_shape_2d(N, K));
    mr_val w = mr_graph_param(g, "w", MR_F64, mr_shape_2d(M, K));
    mr_val b = mr_graph_param(g, "b", MR_F64, mr_shape_1d(M));
    mr_val h = mr_graph_matmul(g, x, w, 0, 1, 1.0);
    mr_val a = mr_graph_add(g, h, b);
    mr_val r = mr_graph_scale(g, mr_graph_unary(g, MR_OP_RELU, a), 0.5);
    mr_val y = mr_graph_add(g, r, h);
    mr_val s = mr_graph_sum(g, mr_graph_reshape(g, y, mr_shape_1d(N * M)), 1);
    MR_ASSERT_OK(mr_graph_status(g));
    assert_int_equal(mr_graph_num_params(g), 2);
    assert_int_equal(mr_graph_param_at(g, 1).id, b.id);
    assert_int_equal(mr_graph_find(g, "w").id, w.id);
    mr_plan *p = NULL;
    mr_val keep[2] = {y, s};
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, keep, 2, &p));
    double *X = th_alloc(sizeof(double) * N * K), *W = th_alloc(sizeof(double) * M * K), *B = th_alloc(sizeof(double) * M);
    th_fill_uniform_f64(X, N * K, -1, 1, 1);
    th_fill_uniform_f64(W, M * K, -1, 1, 2);
    th_fill_uniform_f64(B, M, -1, 1, 3);
    assert_int_equal(mr_plan_run(p), MR_ERR_INVALID); /* nothing bound yet */
    assert_non_null(strstr(mr_last_error(), "not bound"));
    MR_ASSERT_OK(mr_plan_bind(p, x, X));
    MR_ASSERT_OK(mr_plan_bind(p, w, W));
    MR_ASSERT_OK(mr_plan_bind(p, b, B));
    assert_int_equal(mr_plan_bind(p, h, X), MR_ERR_INVALID); /* not an input */
    MR_ASSERT_OK(mr_plan_run(p));
    const double *Y = mr_plan_data(p, y), *S = mr_plan_data(p, s);
    assert_non_null(Y);
    assert_non_null(S);
    assert_null(mr_plan_data(p, r)); /* not kept */
    double *ref = th_alloc(sizeof(double) * N * M), sum = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < M; j++) {
            double d = 0;
            for (int64_t k = 0; k < K; k++) d += X[i * K + k] * W[j * K + k];
            double v = d + B[j];
            ref[i * M + j] = (v > 0 ? v : 0) * 0.5 + d;
            sum += ref[i * M + j];
        }
    assert_true(th_compare("plan y", Y, MR_F64, ref, N * M, 1e-12, 1e-12, 1e-20));
    assert_true(th_compare("plan sum", S, MR_F64, &sum, 1, 1e-12, 1e-12, 1e-20));
    /* rebinding to other memory is seen by the next run */
    double *X2 = th_alloc(sizeof(double) * N * K);
    MR_ASSERT_OK(mr_plan_bind(p, x, X2));
    MR_ASSERT_OK(mr_plan_run(p));
    /* x = 0: y = relu(b) * 0.5 in every row */
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < M; j++) ref[i * M + j] = (B[j] > 0 ? B[j] : 0) * 0.5;
    assert_true(th_compare("plan y, x = 0", mr_plan_data(p, y), MR_F64, ref, N * M, 1e-15, 1e-15, 1e-25));
    /* a kept output bound to caller memory is written there (how gradients reach a model's buffer) */
    double *Yout = th_alloc(sizeof(double) * N * M);
    MR_ASSERT_OK(mr_plan_bind(p, y, Yout));
    MR_ASSERT_OK(mr_plan_run(p));
    assert_ptr_equal(mr_plan_data(p, y), Yout);
    assert_true(th_compare("plan y bound", Yout, MR_F64, ref, N * M, 1e-15, 1e-15, 1e-25));
    assert_int_equal(mr_plan_bind(p, r, Yout), MR_ERR_INVALID); /* r is not kept */
    mr_plan_free(p);
    mr_graph_free(g);
    th_free_all();
}

/* A chain of 32 elementwise ops needs two live buffers at a time, not 32. */
static void test_plan_shares_memory(void **state) {
    (void)state;
    const int64_t n = 1 << 16;
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val x = mr_graph_input(g, "x", MR_F32, mr_shape_1d(n));
    mr_val v = x;
    for (int i = 0; i < 32; i++) v = mr_graph_unary(g, i % 2 ? MR_OP_TANH : MR_OP_RELU, v);
    MR_ASSERT_OK(mr_graph_status(g));
    mr_plan *p = NULL;
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, &v, 1, &p));
    size_t one = (size_t)n * 4;
    fprintf(stderr, "chain of 32: arena %zu bytes, unshared %zu\n", mr_plan_arena_bytes(p), mr_plan_unshared_bytes(p));
    assert_int_equal(mr_plan_unshared_bytes(p), 32 * one);
    assert_true(mr_plan_arena_bytes(p) <= 2 * one);
    float *X = th_alloc(one);
    th_fill_uniform_f32(X, n, -2, 2, 7);
    MR_ASSERT_OK(mr_plan_bind(p, x, X));
    MR_ASSERT_OK(mr_plan_run(p));
    const float *Y = mr_plan_data(p, v);
    for (int64_t i = 0; i < n; i += 997) {
        float e = X[i];
        for (int k = 0; k < 32; k++) e = k % 2 ? tanhf(e) : (e > 0 ? e : 0);
        assert_float_equal(Y[i], e, 1e-6);
    }
    mr_plan_free(p);
    mr_graph_free(g);
    th_free_all();
}

/* After the first run (thread pools and GEMM packing buffers warm up), runs make no heap calls. */
static void test_plan_steady_state_no_alloc(void **state) {
    (void)state;
#ifdef __SANITIZE_ADDRESS__
    skip(); /* ASan owns malloc */
#else
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val x = mr_graph_input(g, "x", MR_F32, mr_shape_2d(64, 128));
    mr_val w = mr_graph_param(g, "w", MR_F32, mr_shape_2d(256, 128));
    mr_val h = mr_graph_unary(g, MR_OP_GELU, mr_graph_matmul(g, x, w, 0, 1, 1.0));
    mr_val s = mr_graph_mean(g, mr_graph_softmax(g, h), 3);
    MR_ASSERT_OK(mr_graph_status(g));
    mr_plan *p = NULL;
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, &s, 1, &p));
    float *X = th_alloc(64 * 128 * 4), *W = th_alloc(256 * 128 * 4);
    th_fill_uniform_f32(X, 64 * 128, -1, 1, 1);
    th_fill_uniform_f32(W, 256 * 128, -1, 1, 2);
    MR_ASSERT_OK(mr_plan_bind(p, x, X));
    MR_ASSERT_OK(mr_plan_bind(p, w, W));
    MR_ASSERT_OK(mr_plan_run(p));
    long before = g_heap_calls;
    for (int i = 0; i < 20; i++) MR_ASSERT_OK(mr_plan_run(p));
    long calls = g_heap_calls - before;
    fprintf(stderr, "heap calls in 20 steady-state runs: %ld\n", calls);
    assert_int_equal(calls, 0);
    mr_plan_free(p);
    mr_graph_free(g);
    th_free_all();
#endif
}

/* Dropout masks change with mr_plan_set_dropout_step and come back with the same step; the
 * backward recomputes the forward's mask (dx is 0 exactly where y is 0). */
static void test_plan_dropout_step(void **state) {
    (void)state;
    const int64_t n = 4096;
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val x = mr_graph_param(g, "x", MR_F32, mr_shape_1d(n));
    mr_val y = mr_graph_dropout(g, x, 0.5, 7, 0);
    mr_val loss = mr_graph_sum(g, y, 1);
    mr_val dx;
    MR_ASSERT_OK(mr_graph_grad(g, loss, &x, 1, &dx));
    mr_plan *p = NULL;
    mr_val keep[3] = {y, loss, dx};
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, keep, 3, &p));
    float *X = th_alloc(sizeof(float) * n), *y0 = th_alloc(sizeof(float) * n), *y1 = th_alloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) X[i] = 1.0f;
    MR_ASSERT_OK(mr_plan_bind(p, x, X));
    MR_ASSERT_OK(mr_plan_run(p));
    memcpy(y0, mr_plan_data(p, y), sizeof(float) * n);
    mr_plan_set_dropout_step(p, 1);
    MR_ASSERT_OK(mr_plan_run(p));
    memcpy(y1, mr_plan_data(p, y), sizeof(float) * n);
    assert_true(memcmp(y0, y1, sizeof(float) * n) != 0);
    const float *Y = mr_plan_data(p, y), *DX = mr_plan_data(p, dx);
    for (int64_t i = 0; i < n; i++) assert_true((Y[i] == 0.0f) == (DX[i] == 0.0f));
    mr_plan_set_dropout_step(p, 0);
    MR_ASSERT_OK(mr_plan_run(p));
    assert_memory_equal(mr_plan_data(p, y), y0, sizeof(float) * n);
    mr_plan_free(p);
    mr_graph_free(g);
    th_free_all();
}

/* The CPU's mixed attention writes bf16 probabilities, and the gradient of the scores then comes
 * from its SOFTMAX_BWD in bf16 for the QK^T GEMM (autodiff/grad.c half_dc). A caller who asks for
 * the gradient of the (f32) scores themselves still gets f32 back. */
static void test_half_softmax_grad_dtype(void **state) {
    (void)state;
    for (int ask = 0; ask < 2; ask++) {
        mr_graph *g = NULL;
        MR_ASSERT_OK(mr_graph_new(&g));
        const mr_shape s = mr_shape_3d(2, 8, 4);
        mr_val q = mr_graph_param(g, "q", MR_F32, s), k = mr_graph_param(g, "k", MR_F32, s);
        mr_val v = mr_graph_param(g, "v", MR_F32, s);
        mr_val qh = mr_graph_cast(g, q, MR_BF16), kh = mr_graph_cast(g, k, MR_BF16), vh = mr_graph_cast(g, v, MR_BF16);
        mr_val att = mr_graph_matmul(g, qh, kh, 0, 1, 0.5);
        mr_val p = mr_graph_causal_softmax_to(g, att, MR_BF16);
        mr_val y = mr_graph_matmul(g, p, vh, 0, 0, 1.0);
        mr_val loss = mr_graph_sum(g, y, 7);
        mr_val params[4] = {q, k, v, att}, grads[4];
        MR_ASSERT_OK(mr_graph_grad(g, loss, params, 3 + ask, grads));
        for (int i = 0; i < 3 + ask; i++) assert_int_equal(mr_graph_dtype(g, grads[i]), MR_F32);
        mr_graph_free(g);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build_errors),
        cmocka_unit_test(test_plan_computes),
        cmocka_unit_test(test_plan_shares_memory),
        cmocka_unit_test(test_plan_steady_state_no_alloc),
        cmocka_unit_test(test_plan_dropout_step),
        cmocka_unit_test(test_half_softmax_grad_dtype),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
