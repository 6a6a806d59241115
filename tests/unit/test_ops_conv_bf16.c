/* Mixed-precision 2-d convolution on the CPU (issue 19): CONV2D, CONV2D_BWD_DATA and
 * CONV2D_BWD_FILTER with p.conv.bf16 (w bf16; x and dy bf16, or f32 that the kernels round to bf16
 * as they read them; f32 bias and outputs), against the f64 reference on the same bf16-rounded
 * values (the reference test_ops_conv.c checks by central differences); the mixed reference
 * (core/ref/conv_ref.c) equal to the f64 one rounded once; results bit-identical with 1, 2 and 4
 * threads; dtype errors. The cases are test_ops_conv's:
 * the CNN's two layers (conv1 takes the direct forward, conv2 im2col + the bf16 GEMM), strides,
 * paddings, odd kernels, batch 1, uneven filter groups. Registered three times in CMakeLists.txt:
 * as is (the AMX or vdpbf16ps kernel, whichever mr_cpu_gemm_bf16 picks here), with
 * MIRROR_GEMM_BF16=avx512 (vdpbf16ps) and with MIRROR_GEMM_BF16=fallback (the bf16 GEMM widened
 * to f32: what a CPU without AVX512_BF16 runs). */
#include <math.h>
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
    {2, 2, 7, 20, 3, 2, 2, 1, 1, 1, 0, 1},    /* 8 taps (direct), odd O, 19 columns: two chunks */
    {3, 5, 16, 20, 7, 3, 3, 1, 1, 1, 1, 1},   /* odd channel counts, K = 45 (an odd pair count) */
    {48, 1, 28, 28, 1, 1, 1, 1, 1, 0, 0, 1},  /* 1 tap, 1 channel: x of a filter group outgrows the
                                                 scratch, rounded as loaded */
};

static int64_t out_size(int64_t in, int64_t k, int s, int p) { return (in + 2 * p - k) / s + 1; }

/* A view of shape s with values in [lo, hi): bf16 (as_f32 0) or f32 (as_f32 1: values the kernel
 * must round), and the f64 twin of its values rounded to bf16 (what the mixed op computes on). */
static void bf16_pair(mr_shape s, double lo, double hi, uint64_t seed, int as_f32, mr_view *h, mr_view *d) {
    mr_view f = th_rand_view(MR_F64, s, lo, hi, seed);
    *h = th_view(as_f32 ? MR_F32 : MR_BF16, s);
    *d = f;
    double *db = d->data;
    for (int64_t i = 0; i < mr_shape_numel(&s); i++) {
        uint16_t b = mr_f32_to_bf16((float)db[i]);
        if (as_f32)
            ((float *)h->data)[i] = (float)db[i];
        else
            ((uint16_t *)h->data)[i] = b;
        db[i] = mr_bf16_to_f32(b);
    }
}

/* The three ops' args for one case: mixed (m*: w bf16, x and dy f32 when act_f32 else bf16, f32
 * bias and outputs) and their f64 twins (d*: the values rounded to bf16). */
typedef struct conv_set {
    mr_op_args mf, mbd, mbf, df, dbd, dbf;
} conv_set;

static void conv_set_make(const conv_case *c, uint64_t seed, int act_f32, conv_set *s) {
    mr_conv_params p = {c->sh, c->sw, c->ph, c->pw, 1, 0, 0};
    mr_shape xs = mr_shape_4d(c->n, c->c, c->h, c->w), ws = mr_shape_4d(c->o, c->c, c->kh, c->kw);
    mr_shape ys = mr_shape_4d(c->n, c->o, out_size(c->h, c->kh, c->sh, c->ph), out_size(c->w, c->kw, c->sw, c->pw));
    mr_view xh, xd, wh, wd, dyh, dyd;
    bf16_pair(xs, -1, 1, seed, act_f32, &xh, &xd);
    bf16_pair(ws, -0.5, 0.5, seed + 1, 0, &wh, &wd);
    bf16_pair(ys, -1, 1, seed + 2, act_f32, &dyh, &dyd);
    mr_op_args *m[3] = {&s->mf, &s->mbd, &s->mbf}, *d[3] = {&s->df, &s->dbd, &s->dbf};
    const mr_op_id ops[3] = {MR_OP_CONV2D, MR_OP_CONV2D_BWD_DATA, MR_OP_CONV2D_BWD_FILTER};
    const mr_view in_h[3][2] = {{xh, wh}, {wh, dyh}, {xh, dyh}}, in_d[3][2] = {{xd, wd}, {wd, dyd}, {xd, dyd}};
    const mr_shape out0[3] = {ys, xs, ws};
    for (int k = 0; k < 3; k++) {
        mr_op_args_init(m[k], ops[k]);
        mr_op_args_init(d[k], ops[k]);
        m[k]->p.conv = d[k]->p.conv = p;
        d[k]->p.conv.bf16 = 0;
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

static void test_conv_bf16_vs_ref(void **state) {
    (void)state;
    fprintf(stderr, "conv2d bf16: GEMM provider %s\n", mr_cpu_gemm_bf16_provider());
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++) {
        conv_set s[2];
        for (int act_f32 = 0; act_f32 < 2; act_f32++) {
            conv_set *t = &s[act_f32];
            conv_set_make(&g_cases[k], 10 + 10 * k, act_f32, t);
            const char *act = act_f32 ? "f32 x/dy" : "bf16 x/dy";
            char what[96];
            snprintf(what, sizeof what, "conv2d mixed (%s) case %zu", act, k);
            check_one(what, &t->mf, &t->df);
            snprintf(what, sizeof what, "conv2d_bwd_data mixed (%s) case %zu", act, k);
            check_one(what, &t->mbd, &t->dbd);
            snprintf(what, sizeof what, "conv2d_bwd_filter mixed (%s) case %zu", act, k);
            check_one(what, &t->mbf, &t->dbf);
        }
        /* the fused ReLU in mixed precision: against the reference, and max(y, 0) bit for bit */
        mr_op_args fr = th_fresh_outputs(&s[1].mf), rr;
        fr.p.conv.relu = 1;
        th_give_workspace(&fr);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &fr));
        rr = th_fresh_outputs(&fr);
        MR_ASSERT_OK(mr_op_run_ref(&rr));
        thread_invariant_124(&fr);
        for (int64_t i = 0; i < mr_shape_numel(&fr.out[0].shape); i++) {
            float y = ((const float *)s[1].mf.out[0].data)[i], want = y > 0.0f ? y : 0.0f;
            float got = ((const float *)fr.out[0].data)[i], ref = ((const float *)rr.out[0].data)[i];
            if (memcmp(&got, &want, sizeof want) != 0) fail_msg("mixed relu case %zu [%lld]: %.9g, want %.9g", k, (long long)i, got, want);
            if (!(fabsf(got - ref) <= TOL_F32_REDUCE_ATOL + TOL_F32_REDUCE_RTOL * fabsf(ref)))
                fail_msg("mixed relu case %zu [%lld]: %.9g, reference %.9g", k, (long long)i, got, ref);
        }
        /* f32 x and dy rounded in the kernel give the bits of the same values cast to bf16 */
        const mr_op_args *pairs[3][2] = {{&s[0].mf, &s[1].mf}, {&s[0].mbd, &s[1].mbd}, {&s[0].mbf, &s[1].mbf}};
        for (int op = 0; op < 3; op++)
            for (int i = 0; i < pairs[op][0]->n_out; i++)
                if (pairs[op][0]->out[i].data)
                    assert_memory_equal(pairs[op][0]->out[i].data, pairs[op][1]->out[i].data,
                                        th_view_bytes(&pairs[op][0]->out[i]));
        th_free_all();
    }
}

static void test_conv_bf16_threads(void **state) {
    (void)state;
    const conv_case cases[] = {
        {5, 3, 12, 12, 8, 3, 3, 1, 1, 1, 1, 1},
        {1, 8, 30, 30, 16, 3, 3, 1, 1, 1, 1, 1},
        {32, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1},  /* conv1's direct forward, threaded */
        {32, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1}, /* conv2: batches over threads, 16 filter groups */
    };
    for (int act_f32 = 0; act_f32 < 2; act_f32++)
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            conv_set s;
            conv_set_make(&cases[k], 300 + k, act_f32, &s);
            thread_invariant_124(&s.mf);
            thread_invariant_124(&s.mbd);
            thread_invariant_124(&s.mbf);
            th_free_all();
        }
}

/* The kernels' rounding of f32 x and dy (vector and scalar) against mr_f32_to_bf16 on values that
 * are ties (bf16 + half an ulp: even and odd last bits), just above and below ties, and +-0: the
 * outputs equal those of the same values cast to bf16 first, bit for bit. Geometries: conv1 (the
 * direct forward), conv2 (im2col), stride 2 (the scalar im2col). */
static void test_conv_bf16_rounding(void **state) {
    (void)state;
    const conv_case cases[] = {
        {3, 1, 28, 28, 8, 3, 3, 1, 1, 1, 1, 1},
        {3, 8, 14, 14, 16, 3, 3, 1, 1, 1, 1, 1},
        {3, 4, 9, 9, 5, 3, 3, 2, 2, 1, 1, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        conv_set s[2];
        conv_set_make(&cases[k], 700 + k, 1, &s[1]);
        conv_set_make(&cases[k], 700 + k, 0, &s[0]);
        /* f32 x and dy of s[1] := tie patterns; s[0]'s bf16 x and dy := their mr_f32_to_bf16 */
        mr_view *f32v[2] = {&s[1].mf.in[0], &s[1].mbd.in[1]}, *bfv[2] = {&s[0].mf.in[0], &s[0].mbd.in[1]};
        for (int v = 0; v < 2; v++) {
            float *f = f32v[v]->data;
            uint16_t *h = bfv[v]->data;
            for (int64_t i = 0; i < mr_shape_numel(&f32v[v]->shape); i++) {
                uint32_t bits = mr_f32_bits(f[i]) & 0xffff0000u;
                static const uint32_t low[6] = {0x8000u, 0x8000u, 0x7fffu, 0x8001u, 0x0000u, 0x4000u};
                bits = (i % 6 == 1 ? bits ^ 0x10000u : bits) | low[i % 6]; /* ties on both parities */
                f[i] = i % 97 == 0 ? (i % 2 ? -0.0f : 0.0f) : mr_bits_f32(bits);
                h[i] = mr_f32_to_bf16(f[i]);
            }
        }
        const mr_op_args *pairs[3][2] = {{&s[0].mf, &s[1].mf}, {&s[0].mbd, &s[1].mbd}, {&s[0].mbf, &s[1].mbf}};
        for (int op = 0; op < 3; op++) {
            mr_op_args r0 = th_fresh_outputs(pairs[op][0]), r1 = th_fresh_outputs(pairs[op][1]);
            th_give_workspace(&r0);
            th_give_workspace(&r1);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &r0));
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &r1));
            int compared = 0;
            for (int i = 0; i < r0.n_out; i++)
                if (r0.out[i].data) {
                    assert_memory_equal(r0.out[i].data, r1.out[i].data, th_view_bytes(&r0.out[i]));
                    compared++;
                }
            assert_true(compared > 0);
        }
        th_free_all();
    }
}

static void test_conv_bf16_errors(void **state) {
    (void)state;
    const conv_case c = {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1};
    conv_set s;
    conv_set_make(&c, 1, 1, &s);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &s.mf));
    mr_op_args e = s.mf;
    e.in[1] = th_view(MR_F32, e.in[1].shape); /* the mixed weight is bf16 */
    th_expect_invalid(&e, "conv2d");
    assert_non_null(strstr(mr_last_error(), "weight is bf16"));
    e = s.mf;
    e.p.conv.bf16 = 0; /* a bf16 weight without the flag */
    th_expect_invalid(&e, "conv2d");
    assert_non_null(strstr(mr_last_error(), "HINT"));
    e = s.mf;
    e.out[0] = th_view(MR_BF16, e.out[0].shape); /* outputs are f32 */
    th_expect_invalid(&e, "conv2d");
    e = s.mf;
    e.in[2] = th_view(MR_BF16, e.in[2].shape); /* the bias is the f32 master bias */
    th_expect_invalid(&e, "conv2d");
    e = s.mbd;
    e.out[0] = th_view(MR_F64, e.out[0].shape);
    th_expect_invalid(&e, "conv2d_bwd_data");
    e = s.mbd;
    e.in[1] = th_view(MR_F16, e.in[1].shape); /* dy f32 or bf16 */
    th_expect_invalid(&e, "conv2d_bwd_data");
    e = s.mbf;
    e.in[0] = th_view(MR_F64, e.in[0].shape);
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
        cmocka_unit_test(test_conv_bf16_rounding),
        cmocka_unit_test(test_conv_bf16_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
