/* GEMM: the CPU kernel (whatever provider was chosen at run time) and the built-in fallback
 * against the f64 reference over transposes, batching, shared B, alpha/beta, edge sizes; the
 * bias/GELU epilogue against the reference and against the separate ops; the gradient
 * identities dA = dC B^T, dB = A^T dC checked by finite differences (the fused op's gradients
 * are checked through the graph in test_autodiff_grad.c); error paths. */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "core/cpu/cpu_impl.h"

typedef struct {
    int64_t batch, m, n, k;
    int ta, tb, shared_b;
    double alpha, beta;
} gemm_case;

static mr_shape mat(int64_t batch, int64_t r, int64_t c, int batched) {
    return batched ? mr_shape_3d(batch, r, c) : mr_shape_2d(r, c);
}

/* Runs one case on the CPU in f32 and the reference in f64 and compares. */
static void run_case(const gemm_case *c, uint64_t seed) {
    int batched = c->batch > 1;
    mr_shape sa = c->ta ? mat(c->batch, c->k, c->m, batched) : mat(c->batch, c->m, c->k, batched);
    mr_shape sb = c->tb ? mat(c->batch, c->n, c->k, batched && !c->shared_b) : mat(c->batch, c->k, c->n, batched && !c->shared_b);
    mr_shape sc = mat(c->batch, c->m, c->n, batched);
    mr_op_args a32, a64;
    mr_op_args_init(&a32, MR_OP_GEMM);
    a32.p.gemm = (mr_gemm_params){c->ta, c->tb, c->alpha, c->beta, 0, 0};
    a64 = a32;
    mr_view views32[3] = {th_view(MR_F32, sa), th_view(MR_F32, sb), th_view(MR_F32, sc)};
    mr_view views64[3] = {th_view(MR_F64, sa), th_view(MR_F64, sb), th_view(MR_F64, sc)};
    for (int i = 0; i < 3; i++) {
        int64_t n = mr_shape_numel(&views64[i].shape);
        th_fill_uniform_f64(views64[i].data, n, -1.0, 1.0, seed + (uint64_t)i);
        th_f64_to_f32(views64[i].data, views32[i].data, n);
        th_f32_to_f64(views32[i].data, views64[i].data, n); /* both see the same rounded inputs */
    }
    a32.in[0] = views32[0]; a32.in[1] = views32[1]; a32.out[0] = views32[2];
    a64.in[0] = views64[0]; a64.in[1] = views64[1]; a64.out[0] = views64[2];
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a32));
    MR_ASSERT_OK(mr_op_run_ref(&a64));
    char what[160];
    snprintf(what, sizeof what, "gemm b%lld m%lld n%lld k%lld ta%d tb%d shared%d a%g b%g", (long long)c->batch,
             (long long)c->m, (long long)c->n, (long long)c->k, c->ta, c->tb, c->shared_b, c->alpha, c->beta);
    assert_true(th_compare(what, views32[2].data, MR_F32, views64[2].data, mr_shape_numel(&sc), TOL_F32_REDUCE_ATOL,
                           TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
    /* the f64 CPU path is the reference itself */
    mr_op_args c64 = a64;
    mr_view out64 = th_view(MR_F64, sc);
    c64.out[0] = out64;
    c64.p.gemm.beta = 0.0;
    a64.p.gemm.beta = 0.0;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &c64));
    MR_ASSERT_OK(mr_op_run_ref(&a64));
    assert_memory_equal(out64.data, views64[2].data, (size_t)mr_shape_numel(&sc) * sizeof(double));
    th_free_all();
}

static void test_gemm_shapes(void **state) {
    (void)state;
    const gemm_case cases[] = {
        {1, 1, 1, 1, 0, 0, 0, 1.0, 0.0},      {1, 7, 5, 3, 0, 0, 0, 1.0, 0.0},
        {1, 33, 17, 65, 1, 0, 0, 0.5, 0.0},   {1, 33, 17, 65, 0, 1, 0, 1.0, 1.0},
        {1, 33, 17, 65, 1, 1, 0, -2.0, 0.5},  {1, 256, 128, 784, 0, 1, 0, 1.0, 0.0},
        {3, 9, 11, 13, 0, 0, 0, 1.0, 0.0},    {3, 9, 11, 13, 1, 1, 0, 1.0, 0.25},
        {4, 16, 8, 32, 0, 1, 1, 1.0, 0.0},    {4, 16, 8, 32, 1, 0, 1, 1.0, 1.0},
        {2, 64, 64, 4096, 0, 0, 0, 1.0, 0.0}, {1, 129, 257, 0, 0, 0, 0, 1.0, 0.5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i], 100 + i);
}

/* The epilogue (bias, GELU, the saved pre-activation) on the CPU in f32 against the reference in
 * f64, over the kernel's three batch paths (2-d, shared B folded into rows, per-batch GEMMs
 * threaded whole or inside), and the f64 CPU path against the reference bit for bit. */
static void test_gemm_epilogue(void **state) {
    (void)state;
    /* batch, m, n, k, trans_a, trans_b, shared B */
    const int64_t cases[][7] = {
        {1, 33, 17, 65, 0, 1, 0}, {1, 7, 5, 3, 1, 0, 0}, {4, 16, 24, 32, 0, 1, 1},
        {3, 9, 11, 13, 1, 1, 0},  {2, 5, 300, 7, 0, 0, 0}, {1, 200, 300, 40, 0, 1, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int variant = 0; variant < 4; variant++) {
            /* 0: bias only, 1: GELU only, 2: bias + GELU, 3: bias + GELU + pre */
            int64_t batch = cases[ci][0], m = cases[ci][1], n = cases[ci][2], k = cases[ci][3];
            int ta = (int)cases[ci][4], tb = (int)cases[ci][5], shared = (int)cases[ci][6], batched = batch > 1;
            int bias = variant != 1, gelu = variant != 0, pre = variant == 3;
            mr_shape sa = ta ? mat(batch, k, m, batched) : mat(batch, m, k, batched);
            mr_shape sb = tb ? mat(batch, n, k, batched && !shared) : mat(batch, k, n, batched && !shared);
            mr_shape sc = mat(batch, m, n, batched);
            mr_shape sv[4] = {sa, sb, mr_shape_1d(n), sc};
            mr_view v32[5], v64[5];
            for (int i = 0; i < 4; i++) {
                v32[i] = th_view(MR_F32, sv[i]);
                v64[i] = th_view(MR_F64, sv[i]);
                int64_t cnt = mr_shape_numel(&sv[i]);
                /* C starts as NaN: beta 0 must not read it */
                th_fill_uniform_f64(v64[i].data, cnt, -1.5, 1.5, 300 + 10 * ci + (uint64_t)i);
                if (i == 3)
                    for (int64_t e = 0; e < cnt; e++) ((double *)v64[i].data)[e] = 0.0 / 0.0;
                th_f64_to_f32(v64[i].data, v32[i].data, cnt);
                th_f32_to_f64(v32[i].data, v64[i].data, cnt);
            }
            v32[4] = th_view(MR_F32, sc);
            v64[4] = th_view(MR_F64, sc);
            mr_op_args a32, a64;
            mr_op_args_init(&a32, MR_OP_GEMM);
            a32.p.gemm = (mr_gemm_params){ta, tb, 0.75, 0.0, gelu ? MR_GEMM_EPI_GELU : MR_GEMM_EPI_NONE, 0};
            a64 = a32;
            a32.in[0] = v32[0]; a32.in[1] = v32[1]; a32.out[0] = v32[3];
            a64.in[0] = v64[0]; a64.in[1] = v64[1]; a64.out[0] = v64[3];
            if (bias) a32.in[2] = v32[2], a64.in[2] = v64[2];
            if (pre) a32.out[1] = v32[4], a64.out[1] = v64[4];
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a32));
            MR_ASSERT_OK(mr_op_run_ref(&a64));
            char what[160];
            snprintf(what, sizeof what, "gemm epilogue b%lld m%lld n%lld k%lld ta%d tb%d shared%d bias%d gelu%d",
                     (long long)batch, (long long)m, (long long)n, (long long)k, ta, tb, shared, bias, gelu);
            int64_t nc = mr_shape_numel(&sc);
            assert_true(th_compare(what, v32[3].data, MR_F32, v64[3].data, nc, TOL_F32_REDUCE_ATOL,
                                   TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
            if (pre)
                assert_true(th_compare("gemm epilogue pre", v32[4].data, MR_F32, v64[4].data, nc, TOL_F32_REDUCE_ATOL,
                                       TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
            /* the f64 CPU path is the reference itself */
            mr_op_args c64 = a64;
            c64.out[0] = th_view(MR_F64, sc);
            if (pre) c64.out[1] = th_view(MR_F64, sc);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &c64));
            assert_memory_equal(c64.out[0].data, v64[3].data, (size_t)nc * sizeof(double));
            if (pre) assert_memory_equal(c64.out[1].data, v64[4].data, (size_t)nc * sizeof(double));
            th_free_all();
        }
}

/* The fused op gives what the separate ops give: GEMM, then ADD of the bias, then GELU; and the
 * saved pre-activation is the GEMM + bias. Checked in f64 on the CPU (the reference), where
 * both must agree to rounding. */
static void test_gemm_epilogue_matches_ops(void **state) {
    (void)state;
    const int64_t M = 6, N = 5, K = 7;
    mr_view A = th_view(MR_F64, mr_shape_2d(M, K)), B = th_view(MR_F64, mr_shape_2d(N, K));
    mr_view bias = th_view(MR_F64, mr_shape_1d(N)), C = th_view(MR_F64, mr_shape_2d(M, N));
    mr_view P = th_view(MR_F64, mr_shape_2d(M, N)), T = th_view(MR_F64, mr_shape_2d(M, N));
    mr_view U = th_view(MR_F64, mr_shape_2d(M, N)), Y = th_view(MR_F64, mr_shape_2d(M, N));
    th_fill_uniform_f64(A.data, M * K, -1, 1, 71);
    th_fill_uniform_f64(B.data, N * K, -1, 1, 72);
    th_fill_uniform_f64(bias.data, N, -1, 1, 73);
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM);
    a.p.gemm = (mr_gemm_params){0, 1, 1.0, 0.0, MR_GEMM_EPI_GELU, 0};
    a.in[0] = A; a.in[1] = B; a.in[2] = bias; a.out[0] = C; a.out[1] = P;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    mr_op_args g;
    mr_op_args_init(&g, MR_OP_GEMM);
    g.p.gemm = (mr_gemm_params){0, 1, 1.0, 0.0, 0, 0};
    g.in[0] = A; g.in[1] = B; g.out[0] = T;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &g));
    mr_op_args ad;
    mr_op_args_init(&ad, MR_OP_ADD);
    ad.in[0] = T; ad.in[1] = bias; ad.out[0] = U;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &ad));
    mr_op_args ge;
    mr_op_args_init(&ge, MR_OP_GELU);
    ge.in[0] = U; ge.out[0] = Y;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &ge));
    assert_true(th_compare("fused pre vs gemm+add", P.data, MR_F64, U.data, M * N, 1e-15, 1e-14, 1e-28));
    assert_true(th_compare("fused vs gemm+add+gelu", C.data, MR_F64, Y.data, M * N, 1e-15, 1e-14, 1e-28));
    th_free_all();
}

/* The built-in kernel, which serves machines without a usable BLAS, checked directly. */
static void test_gemm_builtin(void **state) {
    (void)state;
    const int64_t M = 67, N = 45, K = 300;
    float *A = th_alloc(sizeof(float) * M * K), *B = th_alloc(sizeof(float) * K * N), *C = th_alloc(sizeof(float) * M * N);
    double *ref = th_alloc(sizeof(double) * M * N);
    th_fill_uniform_f32(A, M * K, -1, 1, 1);
    th_fill_uniform_f32(B, K * N, -1, 1, 2);
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            for (int64_t i = 0; i < M * N; i++) C[i] = 0.0f / 0.0f; /* NaN must not survive beta 0 */
            mr_cpu_sgemm_builtin(ta, tb, M, N, K, 1.5f, A, ta ? M : K, B, tb ? K : N, 0.0f, C, N);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double s = 0;
                    for (int64_t l = 0; l < K; l++)
                        s += (double)(ta ? A[l * M + i] : A[i * K + l]) * (tb ? B[j * K + l] : B[l * N + j]);
                    ref[i * N + j] = 1.5 * s;
                }
            assert_true(th_compare("builtin sgemm", C, MR_F32, ref, M * N, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL,
                                   TOL_F32_REDUCE_NMSE));
        }
    }
    th_free_all();
}

/* Gradient of L = sum(C * R), C = A B: dA = R B^T, dB = A^T R, computed with the GEMM op itself
 * (this is how autodiff differentiates GEMM) and checked against central differences in f64. */
typedef struct {
    mr_op_args fwd;
    const double *r;
    int64_t nc;
} gemm_loss_ctx;

static double gemm_loss(void *p) {
    gemm_loss_ctx *c = p;
    if (mr_op_run_ref(&c->fwd) != MR_OK) return 0.0 / 0.0;
    const double *y = c->fwd.out[0].data;
    double s = 0;
    for (int64_t i = 0; i < c->nc; i++) s += y[i] * c->r[i];
    return s;
}

static void test_gemm_grad(void **state) {
    (void)state;
    const int64_t M = 5, N = 4, K = 6;
    mr_view A = th_view(MR_F64, mr_shape_2d(M, K)), B = th_view(MR_F64, mr_shape_2d(K, N));
    mr_view C = th_view(MR_F64, mr_shape_2d(M, N)), R = th_view(MR_F64, mr_shape_2d(M, N));
    mr_view dA = th_view(MR_F64, mr_shape_2d(M, K)), dB = th_view(MR_F64, mr_shape_2d(K, N));
    th_fill_uniform_f64(A.data, M * K, -1, 1, 11);
    th_fill_uniform_f64(B.data, K * N, -1, 1, 12);
    th_fill_uniform_f64(R.data, M * N, -1, 1, 13);
    gemm_loss_ctx ctx;
    mr_op_args_init(&ctx.fwd, MR_OP_GEMM);
    ctx.fwd.p.gemm.alpha = 1.0;
    ctx.fwd.in[0] = A; ctx.fwd.in[1] = B; ctx.fwd.out[0] = C;
    ctx.r = R.data;
    ctx.nc = M * N;
    mr_op_args g;
    mr_op_args_init(&g, MR_OP_GEMM);
    g.p.gemm = (mr_gemm_params){0, 1, 1.0, 0.0, 0, 0}; /* dA = R B^T */
    g.in[0] = R; g.in[1] = B; g.out[0] = dA;
    MR_ASSERT_OK(mr_op_run_ref(&g));
    g.p.gemm = (mr_gemm_params){1, 0, 1.0, 0.0, 0, 0}; /* dB = A^T R */
    g.in[0] = A; g.in[1] = R; g.out[0] = dB;
    MR_ASSERT_OK(mr_op_run_ref(&g));
    double *num = th_alloc(sizeof(double) * M * K);
    th_numeric_grad(A.data, M * K, TOL_GRAD_H, gemm_loss, &ctx, num);
    assert_true(th_compare("gemm dA", num, MR_F64, dA.data, M * K, TOL_GRAD_ATOL, TOL_GRAD_RTOL, 1e-10));
    th_numeric_grad(B.data, K * N, TOL_GRAD_H, gemm_loss, &ctx, num);
    assert_true(th_compare("gemm dB", num, MR_F64, dB.data, K * N, TOL_GRAD_ATOL, TOL_GRAD_RTOL, 1e-10));
    th_free_all();
}

static void test_gemm_errors(void **state) {
    (void)state;
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM);
    a.p.gemm.alpha = 1.0;
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.in[1] = th_view(MR_F32, mr_shape_2d(5, 6));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 6));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "gemm"));
    assert_non_null(strstr(mr_last_error(), "[5, 6]"));
    a.in[1] = th_view(MR_F64, mr_shape_2d(4, 6));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "f64"));
    a.in[1] = th_view(MR_F32, mr_shape_2d(4, 6));
    a.n_in = 1;
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    a.n_in = 3;
    /* the epilogue's views and params */
    a.in[2] = th_view(MR_F32, mr_shape_1d(5));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "bias"));
    a.in[2] = th_view(MR_F64, mr_shape_1d(6));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "bias is f64"));
    a.in[2] = th_view(MR_F32, mr_shape_1d(6));
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    a.out[1] = th_view(MR_F32, mr_shape_2d(3, 6));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "only written with the GELU"));
    a.p.gemm.epilogue = MR_GEMM_EPI_GELU;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    a.out[1] = th_view(MR_F32, mr_shape_2d(6, 3));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "pre (out[1])"));
    a.out[1] = th_view(MR_F32, mr_shape_2d(3, 6));
    a.p.gemm.beta = 1.0;
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "beta 0"));
    a.p.gemm.beta = 0.0;
    a.p.gemm.epilogue = 2;
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "epilogue 2"));
    th_free_all();
}

/* Every provider gives the same bits on 1 and 2 threads: mirror's kernel splits C, never K,
 * across threads; OpenBLAS (whose own threading does not keep the bits) runs single-threaded on
 * fixed blocks of C; the built-in kernel splits rows. Run with MIRROR_GEMM=openblas|builtin to
 * check the others. */
static void test_gemm_thread_invariant(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{256, 1024, 784}, {1000, 30, 500}, {37, 2000, 65}};
    for (int s = 0; s < 3; s++) {
        for (int tb = 0; tb < 2; tb++) {
            mr_op_args a;
            mr_op_args_init(&a, MR_OP_GEMM);
            a.p.gemm = (mr_gemm_params){0, tb, 1.0, 0.0, 0, 0};
            int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            a.in[0] = th_view(MR_F32, mr_shape_2d(m, k));
            a.in[1] = th_view(MR_F32, tb ? mr_shape_2d(n, k) : mr_shape_2d(k, n));
            a.out[0] = th_view(MR_F32, mr_shape_2d(m, n));
            th_fill_uniform_f32(a.in[0].data, m * k, -1, 1, 21);
            th_fill_uniform_f32(a.in[1].data, n * k, -1, 1, 22);
            th_check_thread_invariant(&a);
            /* the epilogue too: bias + GELU + pre */
            a.p.gemm.epilogue = MR_GEMM_EPI_GELU;
            a.in[2] = th_view(MR_F32, mr_shape_1d(n));
            a.out[1] = th_view(MR_F32, mr_shape_2d(m, n));
            th_fill_uniform_f32(a.in[2].data, n, -1, 1, 23);
            th_check_thread_invariant(&a);
        }
    }
    th_free_all();
}

static void test_gemm_provider(void **state) {
    (void)state;
    int threads = mr_cpu_threads();
    const char *p = mr_cpu_gemm_provider();
    /* loading a provider must not change the process's OpenMP team size */
    assert_int_equal(mr_cpu_threads(), threads);
    assert_non_null(p);
    fprintf(stderr, "gemm provider: %s; cpu features: %s\n", p, mr_cpu_features());
    const mr_cpu_caps *k = mr_cpu_caps_get();
    /* On an AVX-512 machine with OpenBLAS installed, mirror must have picked its AVX-512 kernels. */
    if (k->avx512f && k->avx512bw && k->avx512vl && k->avx512dq && strstr(p, "openblas") && !getenv("OPENBLAS_CORETYPE"))
        assert_non_null(strstr(p, "SkylakeX"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_provider), cmocka_unit_test(test_gemm_shapes), cmocka_unit_test(test_gemm_builtin),
        cmocka_unit_test(test_gemm_grad),     cmocka_unit_test(test_gemm_errors),
        cmocka_unit_test(test_gemm_epilogue), cmocka_unit_test(test_gemm_epilogue_matches_ops),
        cmocka_unit_test(test_gemm_thread_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
