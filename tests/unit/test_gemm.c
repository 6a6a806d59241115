/* GEMM: the CPU kernel (whatever provider was chosen at run time) and the built-in fallback
 * against the f64 reference over transposes, batching, shared B, alpha/beta, edge sizes; the
 * gradient identities dA = dC B^T, dB = A^T dC checked by finite differences; error paths. */
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
    a32.p.gemm = (mr_gemm_params){c->ta, c->tb, c->alpha, c->beta};
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
    g.p.gemm = (mr_gemm_params){0, 1, 1.0, 0.0}; /* dA = R B^T */
    g.in[0] = R; g.in[1] = B; g.out[0] = dA;
    MR_ASSERT_OK(mr_op_run_ref(&g));
    g.p.gemm = (mr_gemm_params){1, 0, 1.0, 0.0}; /* dB = A^T R */
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
            a.p.gemm = (mr_gemm_params){0, tb, 1.0, 0.0};
            int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            a.in[0] = th_view(MR_F32, mr_shape_2d(m, k));
            a.in[1] = th_view(MR_F32, tb ? mr_shape_2d(n, k) : mr_shape_2d(k, n));
            a.out[0] = th_view(MR_F32, mr_shape_2d(m, n));
            th_fill_uniform_f32(a.in[0].data, m * k, -1, 1, 21);
            th_fill_uniform_f32(a.in[1].data, n * k, -1, 1, 22);
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
        cmocka_unit_test(test_gemm_thread_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
