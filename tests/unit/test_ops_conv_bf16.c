/* Mixed-precision 2-d convolution on the CPU (issue 19): CONV2D, CONV2D_BWD_DATA and
 * CONV2D_BWD_FILTER with bf16 tensor inputs (x and w, w and dy, x and dy) and f32 bias and outputs,
 * against the f64 reference on the same bf16-rounded values (the reference test_ops_conv.c checks
 * by central differences); the mixed reference (core/ref/conv_ref.c) equal to the f64 one rounded
 * once; results bit-identical with 1, 2 and 4 threads; dtype errors. The cases are test_ops_conv's:
 * the CNN's two layers (conv1 takes the direct forward, conv2 im2col + the bf16 GEMM), strides,
 * paddings, odd kernels, batch 1, uneven filter groups. Registered three times in CMakeLists.txt:
 * as is (the AMX or vdpbf16ps kernel, whichever mr_cpu_gemm_bf16 picks here), with
 * MIRROR_GEMM_BF16=avx512 (vdpbf16ps) and with MIRROR_GEMM_BF16=fallback (the bf16 GEMM widened
 * to f32: what a CPU without AVX512_BF16 runs). */
#include <stdio.h>
#include <string.h>

#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"
#include "harness.h"

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw;
    int sh, sw, ph, pw, bias;
} conv_case;

static const conv_case g_cases[] = {
    {4, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1},  /* CNN conv1 (4 images of the batch): direct forward */
    {4, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1}, /* CNN conv2 */
    {1, 3, 9, 9, 4, 3, 3, 2, 2, 0, 0, 1},     /* stride 2, padding 0, batch 1 */
    {3, 2, 8, 7, 5, 5, 5, 1, 1, 2, 2, 0},     /* padding 2, no bias */
    {2, 3, 10, 11, 4, 3, 5, 2, 1, 0, 2, 1},   /* non-square kernel, stride and padding */
    {5, 2, 6, 9, 3, 1, 4, 3, 2, 1, 0, 1},     /* 1x4 kernel, stride (3,2) */
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1},     /* everything 1 */
    {17, 2, 5, 5, 3, 2, 2, 2, 2, 1, 1, 1},    /* 17 images: uneven filter-gradient groups */
    {2, 4, 4, 4, 6, 4, 4, 1, 1, 0, 0, 0},     /* kernel covers the whole input: 1x1 output */
    {3, 5, 16, 20, 7, 3, 3, 1, 1, 1, 1, 1},   /* odd channel counts, K = 45 (an odd pair count) */
};

static int64_t out_size(int64_t in, int64_t k, int s, int p) { return (in + 2 * p - k) / s + 1; }

/* A bf16 view of shape s with values in [lo, hi) rounded to bf16, and its exact f64 twin. */
static void bf16_pair(mr_shape s, double lo, double hi, uint64_t seed, mr_view *h, mr_view *d) {
    mr_view f = th_rand_view(MR_F64, s, lo, hi, seed);
    *h = th_view(MR_BF16, s);
    *d = f;
    uint16_t *hb = h->data;
    double *db = d->data;
    for (int64_t i = 0; i < mr_shape_numel(&s); i++) {
        hb[i] = mr_f32_to_bf16((float)db[i]);
        db[i] = mr_bf16_to_f32(hb[i]);
    }
}

/* The three ops' args for one case: mixed (m*: bf16 inputs, f32 bias and outputs) and their f64
 * twins (d*: the same values). */
typedef struct conv_set {
    mr_op_args mf, mbd, mbf, df, dbd, dbf;
} conv_set;

static void conv_set_make(const conv_case *c, uint64_t seed, conv_set *s) {
    mr_conv_params p = {c->sh, c->sw, c->ph, c->pw};
    mr_shape xs = mr_shape_4d(c->n, c->c, c->h, c->w), ws = mr_shape_4d(c->o, c->c, c->kh, c->kw);
    mr_shape ys = mr_shape_4d(c->n, c->o, out_size(c->h, c->kh, c->sh, c->ph), out_size(c->w, c->kw, c->sw, c->pw));
    mr_view xh, xd, wh, wd, dyh, dyd;
    bf16_pair(xs, -1, 1, seed, &xh, &xd);
    bf16_pair(ws, -0.5, 0.5, seed + 1, &wh, &wd);
    bf16_pair(ys, -1, 1, seed + 2, &dyh, &dyd);
    mr_op_args *m[3] = {&s->mf, &s->mbd, &s->mbf}, *d[3] = {&s->df, &s->dbd, &s->dbf};
    const mr_op_id ops[3] = {MR_OP_CONV2D, MR_OP_CONV2D_BWD_DATA, MR_OP_CONV2D_BWD_FILTER};
    const mr_view in_h[3][2] = {{xh, wh}, {wh, dyh}, {xh, dyh}}, in_d[3][2] = {{xd, wd}, {wd, dyd}, {xd, dyd}};
    const mr_shape out0[3] = {ys, xs, ws};
    for (int k = 0; k < 3; k++) {
        mr_op_args_init(m[k], ops[k]);
        mr_op_args_init(d[k], ops[k]);
        m[k]->p.conv = d[k]->p.conv = p;
        for (int i = 0; i < 2; i++) {
            m[k]->in[i] = in_h[k][i];
            d[k]->in[i] = in_d[k][i];
        }
        m[k]->out[0] = th_view(MR_F32, out0[k]);
        d[k]->out[0] = th_view(MR_F64, out0[k]);
    }
    if (c->bias) {
        mr_view bd = th_rand_view(MR_F64, mr_shape_1d(c->o), -1, 1, seed + 3), bm = th_view(MR_F32, bd.shape);
        for (int64_t i = 0; i < c->o; i++) {
            ((float *)bm.data)[i] = (float)((double *)bd.data)[i];
            ((double *)bd.data)[i] = ((float *)bm.data)[i];
        }
        s->mf.in[2] = bm;
        s->df.in[2] = bd;
        s->mbf.out[1] = th_view(MR_F32, mr_shape_1d(c->o));
        s->dbf.out[1] = th_view(MR_F64, mr_shape_1d(c->o));
    }
    for (int k = 0; k < 3; k++) th_give_workspace(m[k]);
}

/* The CPU's mixed run against the f64 reference (f32 accumulation of exact products: the f32
 * tolerances), and the mixed reference bit-equal to the f64 reference rounded to f32. */
static void check_one(const char *what, mr_op_args *m, mr_op_args *d) {
    MR_ASSERT_OK(mr_op_run_ref(d));
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, m));
    mr_op_args r = th_fresh_outputs(m);
    MR_ASSERT_OK(mr_op_run_ref(&r));
    int compared = 0;
    for (int i = 0; i < m->n_out; i++) {
        if (!m->out[i].data) continue;
        int64_t n = mr_shape_numel(&m->out[i].shape);
        char w[96];
        snprintf(w, sizeof w, "%s out[%d]", what, i);
        assert_true(th_compare(w, m->out[i].data, MR_F32, d->out[i].data, n, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL,
                               TOL_F32_REDUCE_NMSE));
        const float *rf = r.out[i].data;
        const double *rd = d->out[i].data;
        for (int64_t j = 0; j < n; j++)
            if (rf[j] != (float)rd[j]) fail_msg("%s: mixed reference [%lld] %.9g != f64 reference %.9g", w, (long long)j, rf[j], rd[j]);
        compared++;
    }
    assert_true(compared > 0);
}

static void test_conv_bf16_vs_ref(void **state) {
    (void)state;
    fprintf(stderr, "conv2d bf16: GEMM provider %s\n", mr_cpu_gemm_bf16_provider());
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++) {
        conv_set s;
        conv_set_make(&g_cases[k], 10 + 10 * k, &s);
        char what[64];
        snprintf(what, sizeof what, "conv2d bf16 case %zu", k);
        check_one(what, &s.mf, &s.df);
        snprintf(what, sizeof what, "conv2d_bwd_data bf16 case %zu", k);
        check_one(what, &s.mbd, &s.dbd);
        snprintf(what, sizeof what, "conv2d_bwd_filter bf16 case %zu", k);
        check_one(what, &s.mbf, &s.dbf);
        th_free_all();
    }
}

/* Outputs with 1, 2 and 4 threads bit-identical (the project's rule; th_check_thread_invariant
 * covers 1 and 2). */
static void thread_invariant_124(const mr_op_args *a) {
    static const int threads[3] = {1, 2, 4};
    mr_op_args r[3];
    int saved = mr_cpu_threads();
    for (int t = 0; t < 3; t++) {
        mr_cpu_set_threads(threads[t]);
        r[t] = th_fresh_outputs(a);
        th_give_workspace(&r[t]);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &r[t]));
    }
    mr_cpu_set_threads(saved);
    int checked = 0;
    for (int i = 0; i < a->n_out; i++) {
        if (!a->out[i].data) continue;
        for (int t = 1; t < 3; t++) assert_memory_equal(r[0].out[i].data, r[t].out[i].data, th_view_bytes(&a->out[i]));
        checked++;
    }
    assert_true(checked > 0);
}

static void test_conv_bf16_threads(void **state) {
    (void)state;
    const conv_case cases[] = {
        {5, 3, 12, 12, 8, 3, 3, 1, 1, 1, 1, 1},
        {1, 8, 30, 30, 16, 3, 3, 1, 1, 1, 1, 1},
        {32, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1},  /* conv1's direct forward, threaded */
        {32, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1}, /* conv2: batches over threads, 16 filter groups */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        conv_set s;
        conv_set_make(&cases[k], 300 + k, &s);
        thread_invariant_124(&s.mf);
        thread_invariant_124(&s.mbd);
        thread_invariant_124(&s.mbf);
        th_free_all();
    }
}

static void test_conv_bf16_errors(void **state) {
    (void)state;
    const conv_case c = {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1};
    conv_set s;
    conv_set_make(&c, 1, &s);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &s.mf));
    mr_op_args e = s.mf;
    e.in[1] = th_view(MR_F32, e.in[1].shape); /* x bf16, w f32 */
    th_expect_invalid(&e, "conv2d");
    assert_non_null(strstr(mr_last_error(), "both bf16"));
    e = s.mf;
    e.out[0] = th_view(MR_BF16, e.out[0].shape); /* a bf16 y: outputs are f32 */
    th_expect_invalid(&e, "conv2d");
    e = s.mf;
    e.in[2] = th_view(MR_BF16, e.in[2].shape); /* the bias is the f32 master bias */
    th_expect_invalid(&e, "conv2d");
    e = s.mbd;
    e.out[0] = th_view(MR_F64, e.out[0].shape);
    th_expect_invalid(&e, "conv2d_bwd_data");
    e = s.mbf;
    e.in[1] = th_view(MR_F16, e.in[1].shape); /* f16 is not the mixed type here */
    th_expect_invalid(&e, "conv2d_bwd_filter");
    e = s.mbf;
    e.out[1] = th_view(MR_BF16, e.out[1].shape);
    th_expect_invalid(&e, "conv2d_bwd_filter");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_bf16_vs_ref),
        cmocka_unit_test(test_conv_bf16_threads),
        cmocka_unit_test(test_conv_bf16_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
