/* 2-d convolution (CONV2D, CONV2D_BWD_DATA, CONV2D_BWD_FILTER): the CPU im2col+GEMM kernels in
 * f32 against the f64 reference on the CNN workload layers (1->32 at 28x28, 32->64 at 14x14),
 * stride 2, padding 0 and 2, non-square kernels and strides, size-1 dims, batch 1 (threaded GEMM
 * path) and batches that split unevenly over the filter-gradient groups; the f64 CPU path equals
 * the reference; dx, dw, dbias against central differences; results independent of the thread
 * count; shape, param, dtype and workspace errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw;
    int sh, sw, ph, pw, bias;
} conv_case;

static int64_t out_size(int64_t in, int64_t k, int s, int p) { return (in + 2 * p - k) / s + 1; }

/* The three ops' args for one case, inputs random, in dtype dt. */
static void conv_args(const conv_case *c, mr_dtype dt, uint64_t seed, mr_op_args *f, mr_op_args *bd, mr_op_args *bf) {
    mr_conv_params p = {c->sh, c->sw, c->ph, c->pw, 0, 0, 0};
    mr_shape xs = mr_shape_4d(c->n, c->c, c->h, c->w), ws = mr_shape_4d(c->o, c->c, c->kh, c->kw);
    mr_shape ys = mr_shape_4d(c->n, c->o, out_size(c->h, c->kh, c->sh, c->ph), out_size(c->w, c->kw, c->sw, c->pw));
    mr_view x = th_rand_view(dt, xs, -1, 1, seed), w = th_rand_view(dt, ws, -0.5, 0.5, seed + 1);
    mr_view dy = th_rand_view(dt, ys, -1, 1, seed + 2);
    mr_op_args_init(f, MR_OP_CONV2D);
    f->p.conv = p;
    f->in[0] = x;
    f->in[1] = w;
    if (c->bias) f->in[2] = th_rand_view(dt, mr_shape_1d(c->o), -1, 1, seed + 3);
    f->out[0] = th_view(dt, ys);
    mr_op_args_init(bd, MR_OP_CONV2D_BWD_DATA);
    bd->p.conv = p;
    bd->in[0] = w;
    bd->in[1] = dy;
    bd->out[0] = th_view(dt, xs);
    mr_op_args_init(bf, MR_OP_CONV2D_BWD_FILTER);
    bf->p.conv = p;
    bf->in[0] = x;
    bf->in[1] = dy;
    bf->out[0] = th_view(dt, ws);
    if (c->bias) bf->out[1] = th_view(dt, mr_shape_1d(c->o));
}

static const conv_case g_cases[] = {
    {4, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1},  /* CNN conv1 (4 images of the batch) */
    {4, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1}, /* CNN conv2 */
    {1, 3, 9, 9, 4, 3, 3, 2, 2, 0, 0, 1},     /* stride 2, padding 0, batch 1 */
    {3, 2, 8, 7, 5, 5, 5, 1, 1, 2, 2, 0},     /* padding 2, no bias */
    {2, 3, 10, 11, 4, 3, 5, 2, 1, 0, 2, 1},   /* non-square kernel, stride and padding */
    {5, 2, 6, 9, 3, 1, 4, 3, 2, 1, 0, 1},     /* 1x4 kernel, stride (3,2) */
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1},     /* everything 1 */
    {17, 2, 5, 5, 3, 2, 2, 2, 2, 1, 1, 1},    /* 17 images: uneven filter-gradient groups */
    {2, 4, 4, 4, 6, 4, 4, 1, 1, 0, 0, 0},     /* kernel covers the whole input: 1x1 output */
    {2, 2, 7, 20, 3, 2, 2, 1, 1, 1, 0, 1},    /* 8 taps (direct), odd O, 19 columns: two chunks */
};

static void test_conv_vs_ref(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++) {
        mr_op_args f, bd, bf;
        conv_args(&g_cases[k], MR_F32, 10 + 10 * k, &f, &bd, &bf);
        char what[64];
        snprintf(what, sizeof what, "conv2d case %zu", k);
        (void)th_check_cpu_vs_ref(what, &f, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        snprintf(what, sizeof what, "conv2d_bwd_data case %zu", k);
        (void)th_check_cpu_vs_ref(what, &bd, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        snprintf(what, sizeof what, "conv2d_bwd_filter case %zu", k);
        (void)th_check_cpu_vs_ref(what, &bf, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        th_free_all();
    }
}

/* The fused ReLU (p.conv.relu) on every case, f32 against the reference (the direct forward,
 * the batched GEMM and the one-image GEMM paths), its outputs equal to max(y, 0) of the plain
 * convolution bit for bit, and independent of the thread count. */
static void test_conv_relu(void **state) {
    (void)state;
    int64_t negatives = 0;
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++) {
        mr_op_args f, bd, bf;
        conv_args(&g_cases[k], MR_F32, 500 + 10 * k, &f, &bd, &bf);
        f.p.conv.relu = 1;
        char what[64];
        snprintf(what, sizeof what, "conv2d relu case %zu", k);
        (void)th_check_cpu_vs_ref(what, &f, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        mr_op_args plain = th_fresh_outputs(&f);
        plain.p.conv.relu = 0;
        th_give_workspace(&plain);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &plain));
        const float *yr = f.out[0].data, *yp = plain.out[0].data;
        for (int64_t i = 0; i < mr_shape_numel(&f.out[0].shape); i++) {
            float want = yp[i] > 0.0f ? yp[i] : 0.0f;
            if (memcmp(&yr[i], &want, sizeof want) != 0)
                fail_msg("%s [%lld]: %.9g, want max(%.9g, 0)", what, (long long)i, yr[i], yp[i]);
            negatives += yp[i] < 0.0f;
        }
        th_check_thread_invariant(&f);
        th_free_all();
    }
    assert_true(negatives > 0); /* the ReLU had something to clamp */
}

static void test_conv_grad(void **state) {
    (void)state;
    const conv_case cases[] = {
        {2, 2, 5, 4, 3, 3, 2, 2, 1, 1, 0, 1},
        {1, 3, 4, 5, 2, 3, 3, 1, 1, 2, 2, 1},
        {3, 1, 6, 6, 2, 2, 3, 2, 3, 0, 1, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const conv_case *c = &cases[k];
        mr_op_args f, bd, bf;
        conv_args(c, MR_F64, 200 + k, &f, &bd, &bf);
        MR_ASSERT_OK(mr_op_run_ref(&bd));
        MR_ASSERT_OK(mr_op_run_ref(&bf));
        const double *r = bd.in[1].data; /* dy is the r of sum(y * r) */
        th_check_grad("conv2d dx", &f, 0, r, bd.out[0].data, TOL_NN_GRAD_NMSE);
        th_check_grad("conv2d dw", &f, 1, r, bf.out[0].data, TOL_NN_GRAD_NMSE);
        th_check_grad("conv2d dbias", &f, 2, r, bf.out[1].data, TOL_NN_GRAD_NMSE);
        th_free_all();
    }
}

static void test_conv_threads(void **state) {
    (void)state;
    const conv_case cases[] = {{5, 3, 12, 12, 8, 3, 3, 1, 1, 1, 1, 1},
                               {1, 8, 30, 30, 16, 3, 3, 1, 1, 1, 1, 1},
                               {32, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1}}; /* conv1: the direct kernels */
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        mr_op_args f, bd, bf;
        conv_args(&cases[k], MR_F32, 300 + k, &f, &bd, &bf);
        th_check_thread_invariant(&f);
        th_check_thread_invariant(&bd);
        th_check_thread_invariant(&bf);
        th_free_all();
    }
}

static void test_conv_errors(void **state) {
    (void)state;
    const conv_case c = {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1};
    mr_op_args f, bd, bf, e;
    conv_args(&c, MR_F32, 1, &f, &bd, &bf);
    th_expect_invalid(&f, "conv2d"); /* no workspace */
    assert_non_null(strstr(mr_last_error(), "workspace"));
    th_give_workspace(&f);
    th_give_workspace(&bd);
    th_give_workspace(&bf);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    e = f;
    e.in[1].shape = mr_shape_4d(4, 2, 3, 3);
    th_expect_invalid(&e, "conv2d");
    e = f;
    e.p.conv.stride_h = 0;
    th_expect_invalid(&e, "conv2d");
    e = f;
    e.p.conv.pad_w = -1;
    th_expect_invalid(&e, "conv2d");
    e = f;
    e.out[0].shape = mr_shape_4d(2, 4, 7, 8);
    th_expect_invalid(&e, "conv2d");
    e = f;
    e.in[2].shape = mr_shape_1d(3);
    th_expect_invalid(&e, "conv2d");
    e = f;
    e.in[0].shape = mr_shape_3d(3, 8, 8);
    th_expect_invalid(&e, "conv2d");
    e = f;
    e.in[1].dtype = MR_I32;
    th_expect_invalid(&e, "conv2d");
    e = f;
    e.in[1].shape = mr_shape_4d(4, 3, 11, 3); /* kernel taller than the padded input */
    th_expect_invalid(&e, "conv2d");
    e = bd;
    e.out[0].shape = mr_shape_4d(2, 3, 9, 8);
    th_expect_invalid(&e, "conv2d_bwd_data");
    e = bd;
    e.in[1].data = NULL;
    th_expect_invalid(&e, "conv2d_bwd_data");
    e = bf;
    e.out[1].shape = mr_shape_1d(5);
    th_expect_invalid(&e, "conv2d_bwd_filter");
    e = bf;
    e.in[1].dtype = MR_F64;
    th_expect_invalid(&e, "conv2d_bwd_filter");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_vs_ref),
        cmocka_unit_test(test_conv_relu),
        cmocka_unit_test(test_conv_grad),
        cmocka_unit_test(test_conv_threads),
        cmocka_unit_test(test_conv_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
