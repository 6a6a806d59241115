/* Scaled dot-product attention (ATTENTION, ATTENTION_BWD): the CPU f32 kernels against the f64
 * reference (causal and not, T < S, T = 1, D = 1, head dims that are not multiples of 8, many
 * slices); the f64 CPU path equals the reference; bf16 and f16 inputs against the reference on the
 * same rounded values; dq, dk, dv against central differences; the backward independent of the
 * thread count; the fused node equal to the composed GEMM, causal softmax, GEMM graph (values and
 * gradients, f64); error paths. The GPT's attention: the fused node under mixed precision with a
 * head dim of a multiple of 8 up to 128, the composed path otherwise; a tiny GPT trained in
 * mixed_bfloat16 and mixed_float16 on the CPU (fused) against the same run in f32 (composed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff/graph.h"
#include "autodiff/graph_impl.h" /* the node list: which path the GPT's attention took */
#include "autodiff/nn.h"
#include "harness.h"
#include "train/train.h"

/* Forward args of dtype dt (f32 or f64) over q (bh, t, d), k and v (bh, s, d), as 4-d
 * (2, bh/2, ., .) when bh is even so leading dims are exercised. */
static mr_op_args fwd_args(mr_dtype dt, int64_t bh, int64_t t, int64_t s, int64_t d, int causal, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_ATTENTION);
    int even = bh % 2 == 0;
    mr_shape qs = even ? mr_shape_4d(2, bh / 2, t, d) : mr_shape_3d(bh, t, d);
    mr_shape ks = even ? mr_shape_4d(2, bh / 2, s, d) : mr_shape_3d(bh, s, d);
    mr_shape ls = qs;
    ls.ndim--;
    a.in[0] = th_rand_view(dt, qs, -2, 2, seed);
    a.in[1] = th_rand_view(dt, ks, -2, 2, seed + 1);
    a.in[2] = th_rand_view(dt, ks, -1, 1, seed + 2);
    a.out[0] = th_view(dt, qs);
    a.out[1] = th_view(dt, ls);
    a.p.attention.scale = 1.0 / sqrt((double)d);
    a.p.attention.causal = causal;
    return a;
}

/* Backward args from a forward that has run, with a random dy. */
static mr_op_args bwd_args(const mr_op_args *f, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_ATTENTION_BWD);
    for (int i = 0; i < 3; i++) a.in[i] = f->in[i];
    a.in[3] = f->out[0];
    a.in[4] = f->out[1];
    a.in[5] = th_rand_view(f->in[0].dtype, f->in[0].shape, -1, 1, seed);
    for (int i = 0; i < 3; i++) a.out[i] = th_view(f->in[i].dtype, f->in[i].shape);
    a.p = f->p;
    return a;
}

static const int64_t k_cases[][5] = {
    /* bh, t, s, d, causal */
    {1, 1, 1, 1, 1}, {1, 5, 5, 3, 1}, {2, 7, 7, 8, 0}, {3, 4, 9, 5, 1}, {3, 4, 9, 5, 0},
    {4, 33, 33, 16, 1}, {6, 64, 64, 24, 1}, {1, 1, 40, 7, 1}, {2, 17, 17, 64, 0},
};

static void test_attention_vs_ref(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof k_cases / sizeof *k_cases; c++) {
        const int64_t *k = k_cases[c];
        mr_op_args f = fwd_args(MR_F32, k[0], k[1], k[2], k[3], (int)k[4], 10 + c);
        char what[96];
        snprintf(what, sizeof what, "attention case %zu (bh %lld t %lld s %lld d %lld causal %lld)", c,
                 (long long)k[0], (long long)k[1], (long long)k[2], (long long)k[3], (long long)k[4]);
        (void)th_check_cpu_vs_ref(what, &f, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        mr_op_args b = bwd_args(&f, 40 + c);
        snprintf(what, sizeof what, "attention_bwd case %zu", c);
        (void)th_check_cpu_vs_ref(what, &b, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        th_free_all();
    }
}

/* A causal row sees exactly its prefix: changing k and v at keys past the row changes nothing. */
static void test_attention_causal_prefix(void **state) {
    (void)state;
    mr_op_args f = fwd_args(MR_F64, 1, 6, 6, 4, 1, 5);
    MR_ASSERT_OK(mr_op_run_ref(&f));
    double y0[24];
    memcpy(y0, f.out[0].data, sizeof y0);
    double *kk = f.in[1].data, *vv = f.in[2].data;
    for (int c = 0; c < 4; c++) kk[5 * 4 + c] = vv[5 * 4 + c] = 100.0; /* key 5: seen by row 5 only */
    MR_ASSERT_OK(mr_op_run_ref(&f));
    const double *y1 = f.out[0].data;
    for (int i = 0; i < 20; i++) assert_true(y1[i] == y0[i]);
    for (int i = 20; i < 24; i++) assert_true(y1[i] != y0[i]);
    th_free_all();
}

/* Largest abs error, and largest rel error where |ref| > 1e-3, seen by the half cases (printed by
 * test_attention_half: the measured values tests/tolerances.h's TOL_HALF_ATTN cites). */
static double g_half_abs[2], g_half_rel[2];

static void track_err(int slot, const double *x, const double *ref, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(x[i] - ref[i]);
        if (e > g_half_abs[slot]) g_half_abs[slot] = e;
        if (fabs(ref[i]) > 1e-3 && e / fabs(ref[i]) > g_half_rel[slot]) g_half_rel[slot] = e / fabs(ref[i]);
    }
}

/* bf16 and f16 inputs: the CPU (f32 compute, outputs rounded once) against the reference run on
 * the same rounded inputs; y, dq, dk, dv within the half type's rounding (2^-8 relative for
 * bf16), lse within f32's. */
static void half_case(mr_dtype h, int64_t bh, int64_t t, int64_t d, int causal, uint64_t seed) {
    mr_op_args r = fwd_args(MR_F64, bh, t, t, d, causal, seed); /* reference args */
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_ATTENTION);
    a.p = r.p;
    for (int i = 0; i < 3; i++) {
        int64_t n = mr_shape_numel(&r.in[i].shape);
        a.in[i] = th_view(h, r.in[i].shape);
        for (int64_t j = 0; j < n; j++) {
            mr_dtype_set(a.in[i].data, h, j, ((double *)r.in[i].data)[j]);
            ((double *)r.in[i].data)[j] = mr_dtype_get(a.in[i].data, h, j);
        }
    }
    a.out[0] = th_view(h, r.out[0].shape);
    a.out[1] = th_view(MR_F32, r.out[1].shape);
    th_give_workspace(&a);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    MR_ASSERT_OK(mr_op_run_ref(&r));
    int64_t ny = mr_shape_numel(&r.out[0].shape), nl = mr_shape_numel(&r.out[1].shape);
    double *y = th_alloc((size_t)ny * sizeof *y);
    for (int64_t j = 0; j < ny; j++) y[j] = mr_dtype_get(a.out[0].data, h, j);
    char what[64];
    const int slot = h == MR_F16;
    track_err(slot, y, r.out[0].data, ny);
    snprintf(what, sizeof what, "attention %s y", mr_dtype_name(h));
    assert_true(
        th_compare(what, y, MR_F64, r.out[0].data, ny, TOL_HALF_ATTN_ATOL, TOL_HALF_ATTN_RTOL, TOL_HALF_ATTN_NMSE));
    snprintf(what, sizeof what, "attention %s lse", mr_dtype_name(h));
    assert_true(th_compare(what, a.out[1].data, MR_F32, r.out[1].data, nl, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL,
                           TOL_F32_REDUCE_NMSE));
    /* backward: the reference on the half run's own y and lse and a rounded dy */
    mr_op_args rb = bwd_args(&r, seed + 9), b;
    mr_op_args_init(&b, MR_OP_ATTENTION_BWD);
    b.p = r.p;
    for (int i = 0; i < 3; i++) b.in[i] = a.in[i];
    b.in[3] = a.out[0];
    b.in[4] = a.out[1];
    b.in[5] = th_view(h, r.out[0].shape);
    double *ry = rb.in[3].data, *rl = rb.in[4].data, *rdy = rb.in[5].data;
    for (int64_t j = 0; j < ny; j++) {
        mr_dtype_set(b.in[5].data, h, j, rdy[j]);
        rdy[j] = mr_dtype_get(b.in[5].data, h, j);
        ry[j] = y[j];
    }
    for (int64_t j = 0; j < nl; j++) rl[j] = ((const float *)a.out[1].data)[j];
    for (int i = 0; i < 3; i++) b.out[i] = th_view(h, r.in[i].shape);
    th_give_workspace(&b);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
    MR_ASSERT_OK(mr_op_run_ref(&rb));
    for (int i = 0; i < 3; i++) {
        int64_t n = mr_shape_numel(&r.in[i].shape);
        double *g = th_alloc((size_t)n * sizeof *g);
        for (int64_t j = 0; j < n; j++) g[j] = mr_dtype_get(b.out[i].data, h, j);
        track_err(slot, g, rb.out[i].data, n);
        snprintf(what, sizeof what, "attention_bwd %s out[%d]", mr_dtype_name(h), i);
        assert_true(th_compare(what, g, MR_F64, rb.out[i].data, n, TOL_HALF_ATTN_ATOL, TOL_HALF_ATTN_RTOL,
                               TOL_HALF_ATTN_NMSE));
    }
    th_free_all();
}

static void test_attention_half(void **state) {
    (void)state;
    const mr_dtype hs[2] = {MR_BF16, MR_F16};
    for (int i = 0; i < 2; i++) {
        half_case(hs[i], 4, 32, 16, 1, 100);
        half_case(hs[i], 3, 9, 8, 0, 110);
        half_case(hs[i], 2, 1, 64, 1, 120);
        fprintf(stderr, "attention %s (y, dq, dk, dv): max abs err %.3g, max rel err %.3g (|ref| > 1e-3)\n",
                mr_dtype_name(hs[i]), g_half_abs[i], g_half_rel[i]);
    }
}

static void test_attention_grad(void **state) {
    (void)state;
    for (size_t c = 0; c < 5; c++) {
        const int64_t *k = k_cases[c];
        mr_op_args f = fwd_args(MR_F64, k[0], k[1], k[2], k[3], (int)k[4], 70 + c);
        MR_ASSERT_OK(mr_op_run_ref(&f));
        mr_op_args b = bwd_args(&f, 80 + c);
        MR_ASSERT_OK(mr_op_run_ref(&b));
        const double *r = b.in[5].data; /* dy is the r of the loss sum(y * r) */
        char what[64];
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "attention case %zu d%s", c, i == 0 ? "q" : i == 1 ? "k" : "v");
            th_check_grad(what, &f, i, r, b.out[i].data, TOL_NN_GRAD_NMSE);
        }
        th_free_all();
    }
}

static void test_attention_threads(void **state) {
    (void)state;
    mr_op_args f = fwd_args(MR_F32, 8, 40, 40, 16, 1, 90);
    th_give_workspace(&f);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    th_check_thread_invariant(&f);
    mr_op_args b = bwd_args(&f, 91);
    th_check_thread_invariant(&b);
    th_free_all();
}

/* loss = sum(attention(q, k, v) * r) through the fused node or the composed path (GPT's before the
 * fused op: a batched GEMM, the causal softmax, a GEMM), f64: the values and the gradients of q, k
 * and v must agree to rounding. */
static void composed_vs_fused(int fused, const double *hq, const double *hk, const double *hv, const double *hr,
                              double out[4][2 * 3 * 6 * 4]) {
    mr_shape s = mr_shape_4d(2, 3, 6, 4);
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val q = mr_graph_param(g, "q", MR_F64, s), k = mr_graph_param(g, "k", MR_F64, s);
    mr_val v = mr_graph_param(g, "v", MR_F64, s), r = mr_graph_input(g, "r", MR_F64, s);
    mr_val y;
    if (fused) {
        y = mr_graph_attention(g, q, k, v, 0.5, 1);
    } else {
        mr_val att = mr_graph_causal_softmax(g, mr_graph_matmul(g, q, k, 0, 1, 0.5));
        y = mr_graph_matmul(g, att, v, 0, 0, 1.0);
    }
    mr_val loss = mr_graph_sum(g, mr_graph_mul(g, y, r), 0xF);
    mr_val params[3] = {q, k, v}, grads[3];
    MR_ASSERT_OK(mr_graph_grad(g, loss, params, 3, grads));
    mr_val want[4] = {y, grads[0], grads[1], grads[2]};
    mr_plan *p = NULL;
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, want, 4, &p));
    double in[4][2 * 3 * 6 * 4];
    const double *src[4] = {hq, hk, hv, hr};
    mr_val bind[4] = {q, k, v, r};
    for (int i = 0; i < 4; i++) {
        memcpy(in[i], src[i], sizeof in[i]);
        MR_ASSERT_OK(mr_plan_bind(p, bind[i], in[i]));
    }
    for (int i = 0; i < 4; i++) MR_ASSERT_OK(mr_plan_bind(p, want[i], out[i]));
    MR_ASSERT_OK(mr_plan_run(p));
    mr_plan_free(p);
    mr_graph_free(g);
}

static void test_attention_equals_composed(void **state) {
    (void)state;
    enum { N = 2 * 3 * 6 * 4 };
    double h[4][N], a[4][N], b[4][N];
    for (int i = 0; i < 4; i++) th_fill_uniform_f64(h[i], N, -2, 2, 200 + (uint64_t)i);
    composed_vs_fused(0, h[0], h[1], h[2], h[3], a);
    composed_vs_fused(1, h[0], h[1], h[2], h[3], b);
    const char *names[4] = {"y", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        char what[48];
        snprintf(what, sizeof what, "fused vs composed %s", names[i]);
        assert_true(th_compare(what, b[i], MR_F64, a[i], N, 1e-12, 1e-10, 1e-24));
    }
}

/* ATTENTION nodes in the graph of one attention layer over x (2, 8, C) with `heads` heads. */
static int attention_nodes_on(mr_device_kind device, mr_dtype compute, int64_t c, int heads) {
    mr_graph *g = NULL;
    mr_params *ps = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    MR_ASSERT_OK(mr_params_new(&ps));
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    nn.g = g;
    nn.ps = ps;
    nn.dtype = MR_F32;
    nn.compute = compute;
    nn.device = device;
    mr_val x = mr_graph_input(g, "x", MR_F32, mr_shape_3d(2, 8, c));
    mr_val y = mr_nn_causal_attention(&nn, "attn", x, heads);
    MR_ASSERT_OK(mr_graph_status(g));
    assert_true(y.id != 0);
    int n = 0;
    for (int32_t i = 0; i < g->nnodes; i++) n += g->nodes[i].op == MR_OP_ATTENTION;
    mr_graph_free(g);
    mr_params_free(ps);
    return n;
}

/* the rule for a graph that runs on a GPU */
static int attention_nodes(mr_dtype compute, int64_t c, int heads) {
    return attention_nodes_on(MR_DEVICE_CUDA, compute, c, heads);
}

static void test_gpt_attention_path(void **state) {
    (void)state;
    assert_int_equal(attention_nodes_on(MR_DEVICE_CPU, MR_BF16, 32, 2), 0); /* the CPU: composed */
    assert_int_equal(attention_nodes(MR_BF16, 32, 2), 1);  /* D = 16 */
    assert_int_equal(attention_nodes(MR_F16, 256, 2), 1);  /* D = 128 */
    assert_int_equal(attention_nodes(MR_BF16, 24, 4), 0);  /* D = 6: not a multiple of 8 */
    assert_int_equal(attention_nodes(MR_BF16, 272, 1), 0); /* D = 136 > 128 */
    assert_int_equal(attention_nodes(MR_F32, 32, 2), 0);   /* f32: the composed path */
    /* MIRROR_ATTENTION overrides the rule either way; another value warns and keeps it */
    setenv("MIRROR_ATTENTION", "fused", 1);
    assert_int_equal(attention_nodes(MR_F32, 24, 4), 1);
    setenv("MIRROR_ATTENTION", "composed", 1);
    assert_int_equal(attention_nodes(MR_BF16, 32, 2), 0);
    setenv("MIRROR_ATTENTION", "flash", 1);
    assert_int_equal(attention_nodes(MR_BF16, 32, 2), 1);
    assert_int_equal(attention_nodes(MR_F32, 32, 2), 0);
    unsetenv("MIRROR_ATTENTION");
}

static void first_loss(void *ctx, const mr_train_state *ts) {
    if (ts->step == 1) *(double *)ctx = ts->loss;
}

/* A tiny character GPT (head dim 16) trained 40 steps on the CPU: mixed_bfloat16 and
 * mixed_float16 (fused attention) end within 0.1 of f32 (composed) and below where they started. */
static void test_gpt_mixed_trains(void **state) {
    (void)state;
    mr_train_cfg c = mr_train_cfg_default();
    th_tiny_gpt(&c, 16, 32, 0.0);
    c.optim = mr_optim_cfg_default(MR_OPTIM_ADAMW);
    c.optim.lr = 3e-3;
    c.steps = 40;
    c.log_every = 10;
    c.quiet = 1;
    double first = NAN;
    c.on_step = first_loss;
    c.on_step_ctx = &first;
    mr_train_result f, h;
    MR_ASSERT_OK(mr_train(&c, &f));
    setenv("MIRROR_ATTENTION", "fused", 1); /* the CPU takes the composed path unless told */
    const mr_dtype hs[2] = {MR_BF16, MR_F16};
    for (int i = 0; i < 2; i++) {
        c.compute = hs[i];
        MR_ASSERT_OK(mr_train(&c, &h));
        fprintf(stderr, "tiny gpt 40 steps: step 1 loss %.4f; f32 loss %.4f, %s (fused attention) %.4f\n", first,
                f.last_loss, mr_dtype_name(hs[i]), h.last_loss);
        assert_true(isfinite(h.last_loss));
        assert_true(fabs(h.last_loss - f.last_loss) < 0.1);
        assert_true(h.last_loss < first - 0.5); /* it learns: below the first step's loss */
    }
    unsetenv("MIRROR_ATTENTION");
}

static void test_attention_errors(void **state) {
    (void)state;
    mr_op_args f = fwd_args(MR_F32, 2, 4, 4, 8, 1, 1);
    th_give_workspace(&f);
    mr_op_args e = f;
    e.in[1].dtype = MR_F64;
    th_expect_invalid(&e, "attention");
    e = f;
    e.in[2].shape = mr_shape_4d(2, 1, 4, 7);
    th_expect_invalid(&e, "attention");
    e = f;
    e.in[0].shape = mr_shape_4d(2, 1, 5, 8);
    e.out[0].shape = e.in[0].shape;
    e.out[1].shape = mr_shape_3d(2, 1, 5);
    th_expect_invalid(&e, "attention"); /* causal with T > S */
    e = f;
    e.p.attention.scale = 0.0;
    th_expect_invalid(&e, "attention");
    e = f;
    e.p.attention.scale = NAN;
    th_expect_invalid(&e, "attention");
    e = f;
    e.out[1].dtype = MR_BF16;
    th_expect_invalid(&e, "attention");
    e = f;
    e.out[1].shape = mr_shape_3d(2, 1, 3);
    th_expect_invalid(&e, "attention");
    e = f;
    e.out[0].data = NULL;
    th_expect_invalid(&e, "attention");
    e = f;
    e.in[0].dtype = MR_I32;
    e.in[1].dtype = e.in[2].dtype = e.out[0].dtype = MR_I32;
    th_expect_invalid(&e, "attention");
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    mr_op_args b = bwd_args(&f, 2);
    th_give_workspace(&b);
    e = b;
    e.in[5].shape = mr_shape_4d(2, 1, 8, 4);
    th_expect_invalid(&e, "attention_bwd");
    e = b;
    e.out[2].data = NULL;
    th_expect_invalid(&e, "attention_bwd");
    e = b;
    e.in[4].dtype = MR_F64;
    th_expect_invalid(&e, "attention_bwd");
    /* a CPU run without the workspace it asks for is refused, not a crash */
    e = b;
    e.workspace = NULL;
    e.workspace_bytes = 0;
    th_expect_invalid(&e, "attention_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_vs_ref),         cmocka_unit_test(test_attention_causal_prefix),
        cmocka_unit_test(test_attention_half),           cmocka_unit_test(test_attention_grad),
        cmocka_unit_test(test_attention_threads),        cmocka_unit_test(test_attention_equals_composed),
        cmocka_unit_test(test_attention_errors),         cmocka_unit_test(test_gpt_attention_path),
        cmocka_unit_test(test_gpt_mixed_trains),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
