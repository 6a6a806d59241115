/* Mixed-precision GEMM on the CPU: bf16 (and f16) inputs, f32 C. The op (the AMX or AVX512_BF16
 * kernel where the CPU has it), each kernel called directly (skipped where unavailable) and the
 * portable widen-to-f32 path against the f64 reference on the same
 * bf16-rounded inputs: transposes, batching, shared B, alpha/beta, odd sizes (odd K pads a pair),
 * k = 0, the GPT's shapes; 1 vs 2 (kernels: vs 2 and 4) threads bit-identical; transposed operands
 * bit-identical to explicit copies; the dtype rule's errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"

typedef struct {
    int64_t batch, m, n, k;
    int ta, tb, shared_b;
    double alpha, beta;
} gemm_case;

static double g_max_abs, g_max_rel, g_max_abs_per_k;

static mr_shape mat(int64_t batch, int64_t r, int64_t c, int batched) {
    return batched ? mr_shape_3d(batch, r, c) : mr_shape_2d(r, c);
}

/* The absolute tolerance of a K-term f32 accumulation of exact products of values in [-1,1):
 * grows with K (see TOL_BF16_GEMM_ATOL_PER_K). */
static double atol_for(int64_t k) { return TOL_BF16_GEMM_ATOL + TOL_BF16_GEMM_ATOL_PER_K * (double)k; }

/* Random values in [-1,1) rounded to dt (bf16 or f16) into h, with their exact f64 copies in d. */
static void fill_half(mr_dtype dt, uint16_t *h, double *d, int64_t n, uint64_t seed) {
    th_fill_uniform_f64(d, n, -1.0, 1.0, seed);
    for (int64_t i = 0; i < n; i++) {
        h[i] = dt == MR_BF16 ? mr_f32_to_bf16((float)d[i]) : mr_f32_to_f16((float)d[i]);
        d[i] = dt == MR_BF16 ? mr_bf16_to_f32(h[i]) : mr_f16_to_f32(h[i]);
    }
}

/* Records the largest errors of x against ref (for the summary and tolerances.h). */
static void track(const float *x, const double *ref, int64_t n, int64_t k) {
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - ref[i]);
        if (e > g_max_abs) g_max_abs = e;
        if (k > 0 && e / (double)k > g_max_abs_per_k) g_max_abs_per_k = e / (double)k;
        if (fabs(ref[i]) > 1e-2 && e / fabs(ref[i]) > g_max_rel) g_max_rel = e / fabs(ref[i]);
    }
}

enum { VIA_OP, VIA_F32, VIA_AMX, VIA_VDPBF16PS };

/* Runs one case through the op in dt (bf16 or f16 inputs, f32 C) or straight through the portable
 * path (VIA_F32) or one kernel (bf16, k > 0), and compares with the reference on the same rounded
 * inputs. */
static void run_case(mr_dtype dt, const gemm_case *c, uint64_t seed, int path) {
    int via_f32 = path == VIA_F32;
    int batched = c->batch > 1;
    mr_shape sa = c->ta ? mat(c->batch, c->k, c->m, batched) : mat(c->batch, c->m, c->k, batched);
    mr_shape sb = c->tb ? mat(c->batch, c->n, c->k, batched && !c->shared_b)
                        : mat(c->batch, c->k, c->n, batched && !c->shared_b);
    mr_shape sc = mat(c->batch, c->m, c->n, batched);
    int64_t na = mr_shape_numel(&sa), nb = mr_shape_numel(&sb), nc = mr_shape_numel(&sc);
    mr_op_args g, r;
    mr_op_args_init(&g, MR_OP_GEMM);
    g.p.gemm = (mr_gemm_params){c->ta, c->tb, c->alpha, c->beta, 0, 0};
    r = g;
    g.in[0] = th_view(dt, sa);
    g.in[1] = th_view(dt, sb);
    g.out[0] = th_view(MR_F32, sc);
    r.in[0] = th_view(MR_F64, sa);
    r.in[1] = th_view(MR_F64, sb);
    r.out[0] = th_view(MR_F64, sc);
    fill_half(dt, g.in[0].data, r.in[0].data, na, seed);
    fill_half(dt, g.in[1].data, r.in[1].data, nb, seed + 1);
    float *cf = g.out[0].data;
    double *cd = r.out[0].data;
    th_fill_uniform_f32(cf, nc, -1.0f, 1.0f, seed + 2);
    if (c->beta == 0.0)
        for (int64_t i = 0; i < nc; i++) cf[i] = NAN; /* beta 0 must not read C */
    th_f32_to_f64(cf, cd, nc);
    if (via_f32) {
        assert_false(batched);
        MR_ASSERT_OK(mr_cpu_gemm_half_via_f32(dt == MR_F16, c->ta, c->tb, c->m, c->n, c->k, (float)c->alpha,
                                              g.in[0].data, c->ta ? c->m : c->k, g.in[1].data, c->tb ? c->k : c->n,
                                              (float)c->beta, cf, c->n));
    } else if (path != VIA_OP) {
        assert_false(batched);
        assert_true(dt == MR_BF16 && c->k > 0);
        int (*kern)(int, int, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t, const uint16_t *, int64_t,
                    float, float *, int64_t) = path == VIA_AMX ? mr_cpu_gemm_bf16_amx : mr_cpu_gemm_bf16_vdpbf16ps;
        assert_int_equal(kern(c->ta, c->tb, c->m, c->n, c->k, (float)c->alpha, g.in[0].data, c->ta ? c->m : c->k,
                              g.in[1].data, c->tb ? c->k : c->n, (float)c->beta, cf, c->n),
                         1);
    } else {
        /* f16 inputs are widened into the op's workspace (the planned, allocation-free path) */
        g.workspace_bytes = mr_op_workspace_bytes(&g);
        g.workspace = g.workspace_bytes ? th_alloc(g.workspace_bytes) : NULL;
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &g));
    }
    MR_ASSERT_OK(mr_op_run_ref(&r));
    char what[200];
    static const char *const path_name[] = {"", " via f32", " amx", " vdpbf16ps"};
    snprintf(what, sizeof what, "%s gemm%s b%lld m%lld n%lld k%lld ta%d tb%d shared%d a%g b%g", mr_dtype_name(dt),
             path_name[path], (long long)c->batch, (long long)c->m, (long long)c->n, (long long)c->k, c->ta,
             c->tb, c->shared_b, c->alpha, c->beta);
    track(cf, cd, nc, c->k);
    assert_true(th_compare(what, cf, MR_F32, cd, nc, atol_for(c->k), TOL_BF16_GEMM_RTOL, TOL_BF16_GEMM_NMSE));
}

static const gemm_case g_cases[] = {
    {1, 1, 1, 1, 0, 0, 0, 1.0, 0.0},        {1, 7, 5, 3, 0, 0, 0, 1.0, 0.0},
    {1, 33, 17, 65, 1, 0, 0, 0.5, 0.0},     {1, 33, 17, 65, 0, 1, 0, 1.0, 1.0},
    {1, 33, 17, 65, 1, 1, 0, -2.0, 0.5},    {1, 15, 47, 2, 0, 0, 0, 1.0, 0.0},
    {1, 29, 33, 31, 0, 0, 0, 1.0, 0.0},     {1, 256, 128, 784, 0, 1, 0, 1.0, 0.0},
    {1, 45, 70, 513, 1, 0, 0, 1.0, 0.0},    {1, 40, 90, 1025, 0, 0, 0, 0.25, -1.0},
    {3, 9, 11, 13, 0, 0, 0, 1.0, 0.0},      {3, 9, 11, 13, 1, 1, 0, 1.0, 0.25},
    {4, 16, 8, 32, 0, 1, 1, 1.0, 0.0},      {4, 16, 8, 33, 1, 0, 1, 1.0, 1.0},
    {2, 19, 23, 31, 0, 0, 1, -1.5, 2.0},    {2, 64, 64, 4096, 0, 0, 0, 1.0, 0.0},
    {1, 300, 200, 100, 1, 1, 0, 1.0, 0.0},  {1, 129, 257, 0, 0, 0, 0, 1.0, 0.5},
    /* the GPT's (bench/bench_models.c) with fewer rows: x W^T, dy W, dW = dy^T x with K over the
     * kernels' k block, the attention's per-head products */
    {1, 200, 384, 128, 0, 1, 0, 1.0, 0.0},  {1, 200, 128, 512, 0, 0, 0, 1.0, 0.0},
    {1, 384, 128, 1100, 1, 0, 0, 1.0, 0.0}, {1, 128, 32, 128, 1, 0, 0, 1.0, 0.0},
    {1, 128, 128, 32, 0, 1, 0, 0.125, 0.0}, {1, 77, 50, 129, 1, 1, 0, 1.0, 0.0},
};

static void test_bf16_gemm_vs_ref(void **state) {
    (void)state;
    g_max_abs = g_max_rel = g_max_abs_per_k = 0;
    for (size_t i = 0; i < sizeof g_cases / sizeof *g_cases; i++) {
        run_case(MR_BF16, &g_cases[i], 200 + 10 * i, 0);
        th_free_all();
    }
    /* every transpose on a shape with edge tiles in m, n and an odd k */
    for (int t = 0; t < 4; t++) {
        gemm_case c = {1, 47, 61, 99, t & 1, t >> 1, 0, 0.7, 0.3};
        run_case(MR_BF16, &c, 900 + (uint64_t)t, 0);
        th_free_all();
    }
    fprintf(stderr, "bf16 gemm (%s): max abs err %.3g, max rel err %.3g (|ref| > 1e-2), max abs err / K %.3g\n",
            mr_cpu_gemm_bf16_provider(), g_max_abs, g_max_rel, g_max_abs_per_k);
}

static int have_vdpbf16ps(void) {
    const mr_cpu_caps *k = mr_cpu_caps_get();
    return k->avx512_bf16 && k->avx512bw && k->avx512vl;
}

/* Each kernel called directly (whatever the op chose) on every unbatched case with k > 0. */
static void run_kernel_cases(int path, const char *name) {
    g_max_abs = g_max_rel = g_max_abs_per_k = 0;
    for (size_t i = 0; i < sizeof g_cases / sizeof *g_cases; i++) {
        if (g_cases[i].batch > 1 || g_cases[i].k == 0) continue;
        run_case(MR_BF16, &g_cases[i], 600 + 10 * i, path);
        th_free_all();
    }
    for (int t = 0; t < 4; t++) {
        gemm_case c = {1, 47, 61, 99, t & 1, t >> 1, 0, 0.7, 0.3};
        run_case(MR_BF16, &c, 950 + (uint64_t)t, path);
        th_free_all();
    }
    fprintf(stderr, "bf16 gemm (%s, direct): max abs err %.3g, max rel err %.3g, max abs err / K %.3g\n", name,
            g_max_abs, g_max_rel, g_max_abs_per_k);
}

static void test_bf16_gemm_amx(void **state) {
    (void)state;
    if (!mr_cpu_amx_bf16_usable()) {
        const char *why = mr_cpu_amx_bf16_why();
        /* a CPU and OS that offer AMX whose kernel then fails its own start-up self-test is a bug in
         * the kernel, not a machine without AMX: it must fail here, not quietly fall back */
        if (strstr(why, "self-test")) fail_msg("bf16 gemm: the AMX kernel failed its start-up self-test: %s", why);
        fprintf(stderr, "bf16 gemm: AMX not usable here (amx_bf16: %d): %s: skipped for AMX\n",
                mr_cpu_caps_get()->amx_bf16, why);
        return;
    }
    assert_string_equal(mr_cpu_amx_bf16_why(), "");
    run_kernel_cases(VIA_AMX, "amx");
}

static void test_bf16_gemm_vdpbf16ps(void **state) {
    (void)state;
    if (!have_vdpbf16ps()) {
        fprintf(stderr, "bf16 gemm: no AVX512_BF16: skipped for vdpbf16ps\n");
        return;
    }
    run_kernel_cases(VIA_VDPBF16PS, "vdpbf16ps");
}

/* The kernels transpose an operand while packing it (gemm_bf16_amx.c: in registers): a transposed
 * operand must give the same bits as the untransposed product on an explicit copy (the k order of
 * every element is the same), on edge shapes in m, n and k. */
static void test_bf16_gemm_kernels_transpose_exact(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{47, 61, 99}, {384, 128, 1100}, {128, 32, 128}, {17, 33, 31}, {1, 1, 1}};
    for (int path = VIA_AMX; path <= VIA_VDPBF16PS; path++) {
        if (path == VIA_AMX ? !mr_cpu_amx_bf16_usable() : !have_vdpbf16ps()) continue;
        int (*kern)(int, int, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t, const uint16_t *, int64_t,
                    float, float *, int64_t) = path == VIA_AMX ? mr_cpu_gemm_bf16_amx : mr_cpu_gemm_bf16_vdpbf16ps;
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            uint16_t *a = th_alloc(sizeof(uint16_t) * (size_t)(m * k)), *at = th_alloc(sizeof(uint16_t) * (size_t)(m * k));
            uint16_t *b = th_alloc(sizeof(uint16_t) * (size_t)(n * k)), *bt = th_alloc(sizeof(uint16_t) * (size_t)(n * k));
            double *tmp = th_alloc(sizeof(double) * (size_t)((m > n ? m : n) * k));
            fill_half(MR_BF16, a, tmp, m * k, 31 + (uint64_t)s);
            fill_half(MR_BF16, b, tmp, n * k, 41 + (uint64_t)s);
            for (int64_t i = 0; i < m; i++)
                for (int64_t p = 0; p < k; p++) at[p * m + i] = a[i * k + p]; /* A^T (k,m) */
            for (int64_t p = 0; p < k; p++)
                for (int64_t j = 0; j < n; j++) bt[j * k + p] = b[p * n + j]; /* B^T (n,k) */
            float *c0 = th_alloc(sizeof(float) * (size_t)(m * n)), *c1 = th_alloc(sizeof(float) * (size_t)(m * n));
            assert_int_equal(kern(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c0, n), 1);
            for (int t = 1; t < 4; t++) {
                int ta = t & 1, tb = t >> 1;
                assert_int_equal(kern(ta, tb, m, n, k, 1.0f, ta ? at : a, ta ? m : k, tb ? bt : b, tb ? k : n, 0.0f,
                                      c1, n),
                                 1);
                if (memcmp(c0, c1, sizeof(float) * (size_t)(m * n)))
                    fail_msg("%s m%lld n%lld k%lld ta%d tb%d: transposed operands change the bits",
                             path == VIA_AMX ? "amx" : "vdpbf16ps", (long long)m, (long long)n, (long long)k, ta, tb);
            }
            th_free_all();
        }
    }
}

/* 1, 2 and 4 threads give the same bits for each kernel called directly. */
static void test_bf16_gemm_kernels_thread_invariant(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{256, 1024, 784}, {1000, 30, 501}, {37, 2000, 65}, {300, 300, 1100},
                                 {4096, 128, 384}, {384, 128, 4096}, {128, 128, 32}};
    for (int path = VIA_AMX; path <= VIA_VDPBF16PS; path++) {
        if (path == VIA_AMX ? !mr_cpu_amx_bf16_usable() : !have_vdpbf16ps()) continue;
        int (*kern)(int, int, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t, const uint16_t *, int64_t,
                    float, float *, int64_t) = path == VIA_AMX ? mr_cpu_gemm_bf16_amx : mr_cpu_gemm_bf16_vdpbf16ps;
        for (int s = 0; s < (int)(sizeof shapes / sizeof *shapes); s++)
            for (int t = 0; t < 4; t++) {
                int ta = t & 1, tb = t >> 1;
                int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                uint16_t *a = th_alloc(sizeof(uint16_t) * (size_t)(m * k));
                uint16_t *b = th_alloc(sizeof(uint16_t) * (size_t)(n * k));
                float *c[3];
                double *tmp = th_alloc(sizeof(double) * (size_t)((m > n ? m : n) * k));
                fill_half(MR_BF16, a, tmp, m * k, 71 + (uint64_t)s);
                fill_half(MR_BF16, b, tmp, n * k, 81 + (uint64_t)s);
                int saved = mr_cpu_threads();
                for (int nt = 0; nt < 3; nt++) {
                    c[nt] = th_alloc(sizeof(float) * (size_t)(m * n));
                    th_fill_uniform_f32(c[nt], m * n, -1.0f, 1.0f, 5);
                    mr_cpu_set_threads(1 << nt);
                    assert_int_equal(kern(ta, tb, m, n, k, 0.5f, a, ta ? m : k, b, tb ? k : n, 0.25f, c[nt], n), 1);
                }
                mr_cpu_set_threads(saved);
                assert_memory_equal(c[0], c[1], sizeof(float) * (size_t)(m * n));
                assert_memory_equal(c[0], c[2], sizeof(float) * (size_t)(m * n));
                th_free_all();
            }
    }
}

/* The portable path (what a CPU without AVX512_BF16 runs), called directly, and f16 through the op
 * (always the portable path). */
static void test_bf16_gemm_fallback(void **state) {
    (void)state;
    g_max_abs = g_max_rel = g_max_abs_per_k = 0;
    for (size_t i = 0; i < sizeof g_cases / sizeof *g_cases; i++) {
        if (g_cases[i].batch > 1) continue;
        run_case(MR_BF16, &g_cases[i], 300 + 10 * i, 1);
        run_case(MR_F16, &g_cases[i], 400 + 10 * i, 1);
        th_free_all();
    }
    for (size_t i = 0; i < sizeof g_cases / sizeof *g_cases; i++) {
        run_case(MR_F16, &g_cases[i], 500 + 10 * i, 0);
        th_free_all();
    }
    fprintf(stderr, "bf16/f16 gemm via f32: max abs err %.3g, max rel err %.3g, max abs err / K %.3g\n", g_max_abs,
            g_max_rel, g_max_abs_per_k);
}

/* The reference reads bf16 inputs itself (exactly) and rounds an f32 C once: it must equal the f64
 * reference on the widened copies, rounded to f32. */
static void test_bf16_gemm_ref_reads_bf16(void **state) {
    (void)state;
    const int64_t M = 9, N = 12, K = 17;
    mr_op_args g, r;
    mr_op_args_init(&g, MR_OP_GEMM);
    g.p.gemm = (mr_gemm_params){0, 1, 1.0, 0.0, 0, 0};
    r = g;
    g.in[0] = th_view(MR_BF16, mr_shape_2d(M, K));
    g.in[1] = th_view(MR_BF16, mr_shape_2d(N, K));
    g.out[0] = th_view(MR_F32, mr_shape_2d(M, N));
    r.in[0] = th_view(MR_F64, mr_shape_2d(M, K));
    r.in[1] = th_view(MR_F64, mr_shape_2d(N, K));
    r.out[0] = th_view(MR_F64, mr_shape_2d(M, N));
    fill_half(MR_BF16, g.in[0].data, r.in[0].data, M * K, 1);
    fill_half(MR_BF16, g.in[1].data, r.in[1].data, N * K, 2);
    MR_ASSERT_OK(mr_op_run_ref(&g));
    MR_ASSERT_OK(mr_op_run_ref(&r));
    const float *x = g.out[0].data;
    const double *y = r.out[0].data;
    for (int64_t i = 0; i < M * N; i++) assert_true(x[i] == (float)y[i]);
    th_free_all();
}

/* 1 and 2 threads give the same bits (the kernel splits C by columns, or rows when n is small;
 * batched small GEMMs are shared out whole). */
static void test_bf16_gemm_thread_invariant(void **state) {
    (void)state;
    const int64_t shapes[][4] = {{1, 256, 1024, 784}, {1, 1000, 30, 501}, {1, 37, 2000, 65}, {8, 64, 64, 64}};
    for (int s = 0; s < 4; s++) {
        for (int t = 0; t < 4; t++) {
            int ta = t & 1, tb = t >> 1;
            int64_t bt = shapes[s][0], m = shapes[s][1], n = shapes[s][2], k = shapes[s][3];
            mr_op_args a;
            mr_op_args_init(&a, MR_OP_GEMM);
            a.p.gemm = (mr_gemm_params){ta, tb, 1.0, 0.0, 0, 0};
            a.in[0] = th_view(MR_BF16, ta ? mat(bt, k, m, bt > 1) : mat(bt, m, k, bt > 1));
            a.in[1] = th_view(MR_BF16, tb ? mat(bt, n, k, bt > 1) : mat(bt, k, n, bt > 1));
            a.out[0] = th_view(MR_F32, mat(bt, m, n, bt > 1));
            double *tmp = th_alloc(sizeof(double) * (size_t)(bt * (m > n ? m : n) * k));
            fill_half(MR_BF16, a.in[0].data, tmp, bt * m * k, 31 + (uint64_t)s);
            fill_half(MR_BF16, a.in[1].data, tmp, bt * n * k, 41 + (uint64_t)s);
            th_check_thread_invariant(&a);
            th_free_all();
        }
    }
}

/* The op's bias/GELU epilogue with bf16 inputs: the AMX kernel folds it into its row blocks when
 * each thread's share is whole rows of a C at most 512 wide (gemm_bf16_amx.c), else the op runs it
 * as a pass after the GEMM. Either way the bits must be the plain kernel's followed by the epilogue
 * pass (mr_cpu_gemm_epilogue_rows), the same for 1, 2 and 4 threads, and the f64 reference's to
 * bf16 GEMM tolerances. Shapes: the GPT's linear layers with fewer rows (folded), a C wider than
 * 512 (not folded), a batched A over a shared B (the batch folded into rows). */
static void test_bf16_gemm_epilogue(void **state) {
    (void)state;
    const int64_t shapes[][4] = {{1, 300, 128, 128}, {1, 200, 384, 128}, {1, 130, 512, 512}, {1, 64, 600, 96},
                                 {3, 70, 96, 64}};
    for (int s = 0; s < 5; s++)
        for (int variant = 0; variant < 3; variant++) {
            /* 0: bias, 1: bias + GELU, 2: bias + GELU + pre */
            int64_t bt = shapes[s][0], m = shapes[s][1], n = shapes[s][2], k = shapes[s][3], rows = bt * m;
            int gelu = variant > 0, keep_pre = variant == 2;
            mr_op_args a, r;
            mr_op_args_init(&a, MR_OP_GEMM);
            a.p.gemm = (mr_gemm_params){0, 1, 1.0, 0.0, gelu ? MR_GEMM_EPI_GELU : MR_GEMM_EPI_NONE, 0};
            r = a;
            mr_shape sa = mat(bt, m, k, bt > 1), sb = mr_shape_2d(n, k), sc = mat(bt, m, n, bt > 1);
            a.in[0] = th_view(MR_BF16, sa);
            a.in[1] = th_view(MR_BF16, sb);
            a.in[2] = th_view(MR_F32, mr_shape_1d(n));
            a.out[0] = th_view(MR_F32, sc);
            r.in[0] = th_view(MR_F64, sa);
            r.in[1] = th_view(MR_F64, sb);
            r.in[2] = th_view(MR_F64, mr_shape_1d(n));
            r.out[0] = th_view(MR_F64, sc);
            if (keep_pre) {
                a.out[1] = th_view(MR_F32, sc);
                r.out[1] = th_view(MR_F64, sc);
            }
            fill_half(MR_BF16, a.in[0].data, r.in[0].data, rows * k, 510 + (uint64_t)s);
            fill_half(MR_BF16, a.in[1].data, r.in[1].data, n * k, 520 + (uint64_t)s);
            th_fill_uniform_f32(a.in[2].data, n, -1.0f, 1.0f, 530 + (uint64_t)s);
            th_f32_to_f64(a.in[2].data, r.in[2].data, n);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
            MR_ASSERT_OK(mr_op_run_ref(&r));
            /* the plain kernel, then the epilogue pass over all rows */
            float *c = th_alloc(sizeof(float) * (size_t)(rows * n)), *pre = th_alloc(sizeof(float) * (size_t)(rows * n));
            MR_ASSERT_OK(mr_cpu_gemm_bf16(0, 1, rows, n, k, 1.0f, a.in[0].data, k, a.in[1].data, k, 0.0f, c, n));
            mr_cpu_gemm_epilogue_rows(c, keep_pre ? pre : NULL, a.in[2].data, gelu, 0, rows, n);
            char what[160];
            snprintf(what, sizeof what, "bf16 gemm epilogue b%lld m%lld n%lld k%lld gelu%d pre%d", (long long)bt,
                     (long long)m, (long long)n, (long long)k, gelu, keep_pre);
            if (memcmp(c, a.out[0].data, sizeof(float) * (size_t)(rows * n)))
                fail_msg("%s: C differs from the plain kernel followed by the epilogue pass", what);
            if (keep_pre && memcmp(pre, a.out[1].data, sizeof(float) * (size_t)(rows * n)))
                fail_msg("%s: pre differs from the plain kernel followed by the epilogue pass", what);
            assert_true(th_compare(what, a.out[0].data, MR_F32, r.out[0].data, rows * n, atol_for(k),
                                   TOL_BF16_GEMM_RTOL, TOL_BF16_GEMM_NMSE));
            if (keep_pre)
                assert_true(th_compare(what, a.out[1].data, MR_F32, r.out[1].data, rows * n, atol_for(k),
                                       TOL_BF16_GEMM_RTOL, TOL_BF16_GEMM_NMSE));
            th_check_thread_invariant(&a);
            /* 4 threads too */
            float *c4 = th_alloc(sizeof(float) * (size_t)(rows * n));
            int saved = mr_cpu_threads();
            mr_cpu_set_threads(4);
            mr_op_args a4 = a;
            a4.out[0].data = c4;
            if (keep_pre) a4.out[1].data = pre;
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a4));
            mr_cpu_set_threads(saved);
            if (memcmp(c4, a.out[0].data, sizeof(float) * (size_t)(rows * n)))
                fail_msg("%s: 4 threads give other bits than %d", what, saved);
            th_free_all();
        }
}

static void expect_invalid(mr_op_args *a, const char *needle) {
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, a), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "gemm"));
    if (needle) assert_non_null(strstr(mr_last_error(), needle));
}

static void test_bf16_gemm_errors(void **state) {
    (void)state;
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM);
    a.p.gemm.alpha = 1.0;
    a.in[0] = th_view(MR_BF16, mr_shape_2d(3, 4));
    a.in[1] = th_view(MR_F32, mr_shape_2d(4, 6)); /* mixed bf16/f32 inputs */
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 6));
    expect_invalid(&a, "bf16");
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.in[1] = th_view(MR_BF16, mr_shape_2d(4, 6));
    expect_invalid(&a, "bf16");
    a.in[0] = th_view(MR_BF16, mr_shape_2d(3, 4));
    a.out[0] = th_view(MR_F64, mr_shape_2d(3, 6)); /* C must be f32 */
    expect_invalid(&a, "f64");
    a.in[1] = th_view(MR_F16, mr_shape_2d(4, 6)); /* bf16 with f16 */
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 6));
    expect_invalid(&a, "f16");
    a.in[1] = th_view(MR_BF16, mr_shape_2d(4, 6));
    a.out[0] = th_view(MR_BF16, mr_shape_2d(3, 6)); /* a bf16 C is the CUDA kernel's, not the CPU's */
    expect_invalid(&a, "f32 C");
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 5)); /* shapes still checked */
    expect_invalid(&a, "[3, 5]");
    th_free_all();
}

static void test_bf16_gemm_provider(void **state) {
    (void)state;
    const mr_cpu_caps *k = mr_cpu_caps_get();
    const char *p = mr_cpu_gemm_bf16_provider();
    fprintf(stderr, "bf16 gemm: %s (avx512_bf16: %d, amx_bf16: %d, amx usable: %d)\n", p, k->avx512_bf16,
            k->amx_bf16, mr_cpu_amx_bf16_usable());
    /* a CPU with AMX (passing its probe) must use it, else one with vdpbf16ps that, unless the user
     * forced a path */
    const char *force = getenv("MIRROR_GEMM_BF16");
    int fallback = force && !strcmp(force, "fallback"), avx512 = force && !strcmp(force, "avx512");
    if (!fallback && !avx512 && mr_cpu_amx_bf16_usable())
        assert_non_null(strstr(p, "amx"));
    else if (have_vdpbf16ps() && !fallback)
        assert_non_null(strstr(p, "vdpbf16ps"));
    else
        assert_non_null(strstr(p, "widened"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_gemm_provider),        cmocka_unit_test(test_bf16_gemm_vs_ref),
        cmocka_unit_test(test_bf16_gemm_fallback),        cmocka_unit_test(test_bf16_gemm_ref_reads_bf16),
        cmocka_unit_test(test_bf16_gemm_thread_invariant), cmocka_unit_test(test_bf16_gemm_errors),
        cmocka_unit_test(test_bf16_gemm_amx),             cmocka_unit_test(test_bf16_gemm_vdpbf16ps),
        cmocka_unit_test(test_bf16_gemm_kernels_thread_invariant),
        cmocka_unit_test(test_bf16_gemm_kernels_transpose_exact), cmocka_unit_test(test_bf16_gemm_epilogue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
