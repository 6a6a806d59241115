/* mr_graph_grad: the gradients it builds, planned and run on the CPU in f64 (the reference
 * kernels), against central finite differences of the loss for whole models (an MLP, a small
 * CNN, a transformer-ish block, every GEMM transpose/batch layout, every other differentiable
 * op, batch norm in training and evaluation); the same MLP in f32 against f64; mr_nn_batchnorm's
 * fused node against its composed formulation; reuse, unreachable params, integer values,
 * gradients of intermediate values, and the errors (non-scalar loss, ops without a rule). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autodiff/graph_impl.h" /* the node list: which backward ops were made */
#include "harness.h"
#include "autodiff/graph.h"
#include "autodiff/nn.h"

#define GC_MAX 8

/* One gradient check: a graph, its loss, the params (f64 buffers owned by the test) and the
 * inputs bound to caller data. */
typedef struct gc {
    const char *what;
    mr_graph *g;
    mr_plan *plan;
    mr_val loss;
    int n, n_in;
    mr_val params[GC_MAX], grads[GC_MAX], inputs[GC_MAX];
    void *in_data[GC_MAX];
    double *data[GC_MAX];
} gc;

/* Largest |analytic - numeric| and relative error (over |numeric| > 1e-3) of the checks so far,
 * printed per test for the tolerance comments. */
static double g_max_abs, g_max_rel;

static int64_t numel_of(const mr_graph *g, mr_val v) {
    mr_shape s = mr_graph_shape(g, v);
    return mr_shape_numel(&s);
}

static uint32_t all_axes(const mr_graph *g, mr_val v) { return (1u << mr_graph_shape(g, v).ndim) - 1u; }

/* A param of the check with a fresh buffer of uniform values in [lo, hi). */
static double *gc_param(gc *c, mr_val v, double lo, double hi, uint64_t seed) {
    assert_true(c->n < GC_MAX && v.id != 0);
    int64_t n = numel_of(c->g, v);
    double *d = th_alloc(sizeof(double) * (size_t)(n ? n : 1));
    th_fill_uniform_f64(d, n, lo, hi, seed);
    c->params[c->n] = v;
    c->data[c->n++] = d;
    return d;
}

static void gc_input(gc *c, mr_val v, void *data) {
    assert_true(c->n_in < GC_MAX && v.id != 0);
    c->inputs[c->n_in] = v;
    c->in_data[c->n_in++] = data;
}

/* Appends the backward, plans (keeping the loss and the gradients) and binds everything. */
static void gc_build(gc *c) {
    MR_ASSERT_OK(mr_graph_grad(c->g, c->loss, c->params, c->n, c->grads));
    mr_val keep[GC_MAX + 1];
    keep[0] = c->loss;
    for (int i = 0; i < c->n; i++) {
        assert_int_not_equal(c->grads[i].id, 0);
        keep[i + 1] = c->grads[i];
    }
    MR_ASSERT_OK(mr_plan_new(c->g, MR_DEVICE_CPU, keep, c->n + 1, &c->plan));
    for (int i = 0; i < c->n; i++) MR_ASSERT_OK(mr_plan_bind(c->plan, c->params[i], c->data[i]));
    for (int i = 0; i < c->n_in; i++) MR_ASSERT_OK(mr_plan_bind(c->plan, c->inputs[i], c->in_data[i]));
}

static double gc_loss(void *ctx) {
    gc *c = ctx;
    MR_ASSERT_OK(mr_plan_run(c->plan));
    return *(const double *)mr_plan_data(c->plan, c->loss);
}

/* Runs once for the analytic gradients, then checks each against central differences. */
static void gc_check(gc *c) {
    double abs_err = 0.0, rel_err = 0.0;
    gc_loss(c);
    double *analytic[GC_MAX];
    for (int i = 0; i < c->n; i++) {
        int64_t n = numel_of(c->g, c->params[i]);
        analytic[i] = th_alloc(sizeof(double) * (size_t)(n ? n : 1));
        const double *d = mr_plan_data(c->plan, c->grads[i]);
        assert_non_null(d);
        memcpy(analytic[i], d, sizeof(double) * (size_t)n);
    }
    for (int i = 0; i < c->n; i++) {
        int64_t n = numel_of(c->g, c->params[i]);
        double *numeric = th_alloc(sizeof(double) * (size_t)(n ? n : 1));
        th_numeric_grad(c->data[i], n, TOL_GRAD_H, gc_loss, c, numeric);
        char what[160];
        snprintf(what, sizeof what, "%s: d loss / d %s", c->what, mr_graph_name(c->g, c->params[i]));
        assert_true(th_compare(what, analytic[i], MR_F64, numeric, n, TOL_GRAD_ATOL, TOL_GRAD_RTOL, TOL_GRAD_NMSE));
        for (int64_t k = 0; k < n; k++) {
            double e = fabs(analytic[i][k] - numeric[k]);
            if (e > abs_err) abs_err = e;
            if (fabs(numeric[k]) > 1e-3 && e / fabs(numeric[k]) > rel_err) rel_err = e / fabs(numeric[k]);
        }
    }
    printf("%s: %d params, max |analytic - numeric| %.2e, max rel %.2e\n", c->what, c->n, abs_err, rel_err);
    if (abs_err > g_max_abs) g_max_abs = abs_err;
    if (rel_err > g_max_rel) g_max_rel = rel_err;
}

static void gc_free(gc *c) {
    mr_plan_free(c->plan);
    mr_graph_free(c->g);
    th_free_all();
}

/* ---- models ------------------------------------------------------------------------------------ */

enum { MLP_N = 5, MLP_D = 4, MLP_H = 6, MLP_C = 3 };

typedef struct mlp {
    mr_val x, labels, w1, b1, w2, b2, loss;
} mlp;

/* loss = mean_i xent(relu(x W1^T + b1) W2^T + b2, labels[i]); x (N,D), W1 (H,D), W2 (C,H). */
static mlp build_mlp(mr_graph *g, mr_dtype dt) {
    mlp m;
    m.x = mr_graph_input(g, "x", dt, mr_shape_2d(MLP_N, MLP_D));
    m.labels = mr_graph_input(g, "labels", MR_I32, mr_shape_1d(MLP_N));
    m.w1 = mr_graph_param(g, "w1", dt, mr_shape_2d(MLP_H, MLP_D));
    m.b1 = mr_graph_param(g, "b1", dt, mr_shape_1d(MLP_H));
    m.w2 = mr_graph_param(g, "w2", dt, mr_shape_2d(MLP_C, MLP_H));
    m.b2 = mr_graph_param(g, "b2", dt, mr_shape_1d(MLP_C));
    mr_val h = mr_graph_unary(g, MR_OP_RELU, mr_graph_add(g, mr_graph_matmul(g, m.x, m.w1, 0, 1, 1.0), m.b1));
    mr_val logits = mr_graph_add(g, mr_graph_matmul(g, h, m.w2, 0, 1, 1.0), m.b2);
    m.loss = mr_graph_mean(g, mr_graph_softmax_xent(g, logits, m.labels, -100), 1u);
    MR_ASSERT_OK(mr_graph_status(g));
    return m;
}

/* (1) the MLP in f64 by finite differences, and the same graph in f32 against the f64 gradients
 * on the same (f32-rounded) values. One row's label is ignore_index. */
static void test_grad_mlp(void **state) {
    (void)state;
    gc c = {.what = "mlp"};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mlp m = build_mlp(c.g, MR_F64);
    c.loss = m.loss;
    double *x = th_alloc(sizeof(double) * MLP_N * MLP_D);
    int32_t labels[MLP_N] = {0, 2, 1, -100, 2};
    th_fill_uniform_f64(x, MLP_N * MLP_D, -1, 1, 11);
    gc_param(&c, m.w1, -0.8, 0.8, 12);
    gc_param(&c, m.b1, -0.3, 0.3, 13);
    gc_param(&c, m.w2, -0.8, 0.8, 14);
    gc_param(&c, m.b2, -0.3, 0.3, 15);
    /* everything f32-representable, so the f32 graph below sees the same values */
    float *x32 = th_alloc(sizeof(float) * MLP_N * MLP_D);
    th_f64_to_f32(x, x32, MLP_N * MLP_D);
    th_f32_to_f64(x32, x, MLP_N * MLP_D);
    float *p32[4];
    for (int i = 0; i < 4; i++) {
        int64_t n = numel_of(c.g, c.params[i]);
        p32[i] = th_alloc(sizeof(float) * (size_t)n);
        th_f64_to_f32(c.data[i], p32[i], n);
        th_f32_to_f64(p32[i], c.data[i], n);
    }
    gc_input(&c, m.x, x);
    gc_input(&c, m.labels, labels);
    gc_build(&c);
    gc_check(&c);

    /* f32: the same graph on the rounded values; gradients against the f64 ones */
    gc_loss(&c);
    mr_graph *g32 = NULL;
    mr_plan *p = NULL;
    MR_ASSERT_OK(mr_graph_new(&g32));
    mlp m32 = build_mlp(g32, MR_F32);
    mr_val params32[4] = {m32.w1, m32.b1, m32.w2, m32.b2}, grads32[4], keep[5];
    MR_ASSERT_OK(mr_graph_grad(g32, m32.loss, params32, 4, grads32));
    keep[0] = m32.loss;
    memcpy(keep + 1, grads32, sizeof grads32);
    MR_ASSERT_OK(mr_plan_new(g32, MR_DEVICE_CPU, keep, 5, &p));
    MR_ASSERT_OK(mr_plan_bind(p, m32.x, x32));
    MR_ASSERT_OK(mr_plan_bind(p, m32.labels, labels));
    for (int i = 0; i < 4; i++) MR_ASSERT_OK(mr_plan_bind(p, params32[i], p32[i]));
    MR_ASSERT_OK(mr_plan_run(p));
    double loss64 = *(const double *)mr_plan_data(c.plan, c.loss);
    assert_true(th_compare("mlp f32 loss", mr_plan_data(p, m32.loss), MR_F32, &loss64, 1, TOL_F32_REDUCE_ATOL,
                           TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
    double worst = 0.0;
    for (int i = 0; i < 4; i++) {
        int64_t n = numel_of(c.g, c.params[i]);
        const float *g32v = mr_plan_data(p, grads32[i]);
        const double *g64v = mr_plan_data(c.plan, c.grads[i]);
        char what[64];
        snprintf(what, sizeof what, "mlp f32 d loss / d %s", mr_graph_name(g32, params32[i]));
        assert_true(th_compare(what, g32v, MR_F32, g64v, n, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL,
                               TOL_F32_REDUCE_NMSE));
        for (int64_t k = 0; k < n; k++)
            if (fabs(g32v[k] - g64v[k]) > worst) worst = fabs(g32v[k] - g64v[k]);
    }
    printf("mlp f32 vs f64: max abs err %.2e\n", worst);
    mr_plan_free(p);
    mr_graph_free(g32);
    gc_free(&c);
}

/* (2) conv2d (pad 1, bias) -> relu -> maxpool 2 -> reshape -> matmul -> xent -> mean; the input
 * image is a param too, so CONV2D_BWD_DATA is checked. Three times: the ReLU as its own node;
 * fused into the conv2d (mr_graph_relu_after_conv: p.conv.relu), whose pool then carries the
 * ReLU's gradient in its argmax (p.pool.relu) so no RELU_BWD node is made; and fused with a
 * second reader of the conv's output (0.1 * sum(y) added to the loss), where RELU_BWD stays; and
 * fused with its pool into one CONV2D_MAXPOOL node (mr_graph_fuse_conv_pool). */
enum { CNN_PLAIN, CNN_FUSED, CNN_FUSED_SHARED, CNN_POOL_FUSED };

static int count_op(const mr_graph *g, mr_op_id op) {
    int n = 0;
    for (int32_t i = 0; i < g->nnodes; i++) n += g->nodes[i].op == op;
    return n;
}

static void grad_cnn(int mode) {
    enum { N = 2, C = 2, HW = 6, O = 3, K = 3, CLS = 4 };
    const char *names[] = {"cnn", "cnn (fused relu)", "cnn (fused relu, y read twice)",
                           "cnn (conv2d_maxpool: mr_graph_fuse_conv_pool)"};
    gc c = {.what = names[mode]};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mr_graph *g = c.g;
    mr_val x = mr_graph_param(g, "x", MR_F64, mr_shape_4d(N, C, HW, HW));
    mr_val w = mr_graph_param(g, "w", MR_F64, mr_shape_4d(O, C, K, K));
    mr_val b = mr_graph_param(g, "bias", MR_F64, mr_shape_1d(O));
    mr_val fc = mr_graph_param(g, "fc", MR_F64, mr_shape_2d(CLS, O * (HW / 2) * (HW / 2)));
    mr_val labels = mr_graph_input(g, "labels", MR_I32, mr_shape_1d(N));
    mr_val conv = mr_graph_conv2d(g, x, w, b, 1, 1);
    int fused = mode != CNN_PLAIN;
    mr_val y = fused ? mr_graph_relu_after_conv(g, conv) : mr_graph_unary(g, MR_OP_RELU, conv);
    assert_true(fused ? y.id == conv.id : y.id != conv.id); /* fused: no node of its own */
    mr_val h = mr_graph_maxpool2d(g, y, 2, 2, 0);
    assert_int_equal(g->nodes[g->nnodes - 1].p.pool.relu, fused);
    h = mr_graph_reshape(g, h, mr_shape_2d(N, O * (HW / 2) * (HW / 2)));
    mr_val logits = mr_graph_matmul(g, h, fc, 0, 1, 1.0);
    c.loss = mr_graph_mean(g, mr_graph_softmax_xent(g, logits, labels, -100), 1u);
    if (mode == CNN_FUSED_SHARED)
        c.loss = mr_graph_add(g, c.loss, mr_graph_scale(g, mr_graph_sum(g, y, 0xfu), 0.1));
    MR_ASSERT_OK(mr_graph_status(g));
    /* the conv and its pool as one CONV2D_MAXPOOL node; y read twice stays unfused */
    if (mode == CNN_POOL_FUSED || mode == CNN_FUSED_SHARED)
        assert_int_equal(mr_graph_fuse_conv_pool(g, &c.loss, 1), mode == CNN_POOL_FUSED);
    int32_t lab[N] = {3, 1};
    gc_param(&c, x, -1, 1, 21);
    gc_param(&c, w, -0.5, 0.5, 22);
    gc_param(&c, b, -0.2, 0.2, 23);
    gc_param(&c, fc, -0.5, 0.5, 24);
    gc_input(&c, labels, lab);
    gc_build(&c);
    assert_int_equal(count_op(g, MR_OP_RELU_BWD), mode == CNN_FUSED || mode == CNN_POOL_FUSED ? 0 : 1);
    assert_int_equal(count_op(g, MR_OP_CONV2D_MAXPOOL), mode == CNN_POOL_FUSED);
    gc_check(&c);
    gc_free(&c);
}

static void test_grad_cnn(void **state) {
    (void)state;
    grad_cnn(CNN_PLAIN);
    grad_cnn(CNN_FUSED);
    grad_cnn(CNN_FUSED_SHARED);
    grad_cnn(CNN_POOL_FUSED);
}

/* Average pooling: conv2d (pad 1) -> avgpool 3 stride 2 pad 1 (padding in the divisor) -> tanh
 * -> avgpool 2 stride 1 (overlapping) -> * constant -> sum, plus a second avgpool of the image
 * itself (kernel 2, stride 3: windows that skip elements) squared, so the image's gradient sums
 * an AVGPOOL2D_BWD and a CONV2D_BWD_DATA. */
static void test_grad_avgpool(void **state) {
    (void)state;
    enum { N = 2, C = 2, H = 7, W = 6, O = 3 };
    gc c = {.what = "avgpool"};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mr_graph *g = c.g;
    mr_val x = mr_graph_param(g, "x", MR_F64, mr_shape_4d(N, C, H, W));
    mr_val w = mr_graph_param(g, "w", MR_F64, mr_shape_4d(O, C, 3, 3));
    mr_val h = mr_graph_avgpool2d(g, mr_graph_conv2d(g, x, w, MR_VAL_NONE, 1, 1), 3, 2, 1); /* (N,O,4,3) */
    h = mr_graph_avgpool2d(g, mr_graph_unary(g, MR_OP_TANH, h), 2, 1, 0);                   /* (N,O,3,2) */
    double rv[N * O * 3 * 2];
    th_fill_uniform_f64(rv, N * O * 3 * 2, -1, 1, 95);
    mr_val r = mr_graph_const(g, MR_F64, mr_shape_4d(N, O, 3, 2), rv);
    mr_val s = mr_graph_avgpool2d(g, x, 2, 3, 0); /* (N,C,2,2) */
    mr_shape hs = mr_graph_shape(g, h), hs_want = mr_shape_4d(N, O, 3, 2);
    mr_shape ss = mr_graph_shape(g, s), ss_want = mr_shape_4d(N, C, 2, 2);
    assert_true(mr_shape_eq(&hs, &hs_want) && mr_shape_eq(&ss, &ss_want));
    c.loss = mr_graph_add(g, mr_graph_sum(g, mr_graph_mul(g, h, r), 15u), mr_graph_sum(g, mr_graph_mul(g, s, s), 15u));
    MR_ASSERT_OK(mr_graph_status(g));
    gc_param(&c, x, -1, 1, 96);
    gc_param(&c, w, -0.5, 0.5, 97);
    gc_build(&c);
    gc_check(&c);
    gc_free(&c);
}

/* Partial paths: a conv with no bias (stride 2) into a layernorm whose gamma and beta are inputs;
 * differentiated once w.r.t. the image only (CONV2D_BWD_DATA, no dgamma/dbeta) and once w.r.t.
 * the filter only (CONV2D_BWD_FILTER with dbias left out). */
static void test_grad_partial(void **state) {
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        gc c = {.what = variant ? "partial: filter only" : "partial: image only"};
        MR_ASSERT_OK(mr_graph_new(&c.g));
        mr_graph *g = c.g;
        mr_val x = mr_graph_param(g, "x", MR_F64, mr_shape_4d(2, 1, 5, 5));
        mr_val w = mr_graph_param(g, "w", MR_F64, mr_shape_4d(2, 1, 3, 3));
        mr_val gamma = mr_graph_input(g, "gamma", MR_F64, mr_shape_1d(8));
        mr_val beta = mr_graph_input(g, "beta", MR_F64, mr_shape_1d(8));
        mr_val y = mr_graph_reshape(g, mr_graph_conv2d(g, x, w, MR_VAL_NONE, 2, 0), mr_shape_2d(2, 8));
        y = mr_graph_unary(g, MR_OP_TANH, mr_graph_layernorm(g, y, gamma, beta, 1e-5));
        c.loss = mr_graph_sum(g, y, 3u);
        MR_ASSERT_OK(mr_graph_status(g));
        double *gv = th_alloc(sizeof(double) * 8), *bv = th_alloc(sizeof(double) * 8);
        double *other = th_alloc(sizeof(double) * 50);
        th_fill_uniform_f64(gv, 8, 0.5, 1.5, 90);
        th_fill_uniform_f64(bv, 8, -0.5, 0.5, 91);
        th_fill_uniform_f64(other, 50, -1, 1, 92);
        gc_param(&c, variant ? w : x, -1, 1, 93);
        gc_input(&c, variant ? x : w, other);
        gc_input(&c, gamma, gv);
        gc_input(&c, beta, bv);
        gc_build(&c);
        gc_check(&c);
        gc_free(&c);
    }
}

/* (3) embedding -> layernorm -> matmul -> gelu -> matmul (B^T) -> residual add (the embedding
 * output used twice) -> permute -> reshape -> softmax -> * constant -> sum. */
static void test_grad_transformer(void **state) {
    (void)state;
    enum { B = 2, T = 3, V = 7, D = 4, F = 8 };
    gc c = {.what = "transformer"};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mr_graph *g = c.g;
    mr_val ids = mr_graph_input(g, "ids", MR_I32, mr_shape_2d(B, T));
    mr_val table = mr_graph_param(g, "table", MR_F64, mr_shape_2d(V, D));
    mr_val gamma = mr_graph_param(g, "gamma", MR_F64, mr_shape_1d(D));
    mr_val beta = mr_graph_param(g, "beta", MR_F64, mr_shape_1d(D));
    mr_val w1 = mr_graph_param(g, "w1", MR_F64, mr_shape_2d(D, F));
    mr_val w2 = mr_graph_param(g, "w2", MR_F64, mr_shape_2d(D, F));
    mr_val e = mr_graph_embedding(g, table, ids);                   /* (B,T,D) */
    mr_val n = mr_graph_layernorm(g, e, gamma, beta, 1e-5);         /* (B,T,D) */
    mr_val f = mr_graph_unary(g, MR_OP_GELU, mr_graph_matmul(g, n, w1, 0, 0, 1.0)); /* (B,T,F) */
    mr_val r = mr_graph_add(g, e, mr_graph_matmul(g, f, w2, 0, 1, 0.5));             /* (B,T,D) */
    int perm[3] = {0, 2, 1};
    mr_val s = mr_graph_softmax(g, mr_graph_reshape(g, mr_graph_permute(g, r, perm), mr_shape_2d(B * D, T)));
    double cdata[B * D * T];
    th_fill_uniform_f64(cdata, B * D * T, -1, 1, 30);
    mr_val k = mr_graph_const(g, MR_F64, mr_shape_2d(B * D, T), cdata);
    c.loss = mr_graph_sum(g, mr_graph_mul(g, s, k), 3u);
    MR_ASSERT_OK(mr_graph_status(g));
    int32_t idv[B * T] = {1, 4, 1, 6, 0, 4}; /* repeated ids: the scatter-add accumulates */
    gc_param(&c, table, -1, 1, 31);
    gc_param(&c, gamma, 0.5, 1.5, 32);
    gc_param(&c, beta, -0.3, 0.3, 33);
    gc_param(&c, w1, -0.7, 0.7, 34);
    gc_param(&c, w2, -0.7, 0.7, 35);
    gc_input(&c, ids, idv);
    gc_build(&c);
    gc_check(&c);
    gc_free(&c);
}

/* Causal self-attention as the GPT blocks build it (one c_attn GEMM, a permute, then q, k and v
 * as slices of one buffer: their gradients are assembled into the buffer's by a concat), with a
 * concat and a partial slice (zeros where no slice reached) on the side. */
static void test_grad_attention_slices(void **state) {
    (void)state;
    enum { B = 2, T = 3, C = 4, H = 2 };
    gc c = {.what = "attention + slices"};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mr_params *ps = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    nn.g = c.g;
    nn.ps = ps;
    nn.dtype = MR_F64;
    mr_graph *g = c.g;
    mr_val x = mr_graph_param(g, "x", MR_F64, mr_shape_3d(B, T, C));
    mr_val y = mr_nn_causal_attention(&nn, "attn", x, H); /* (B,T,C) */
    /* concat [y ; first half of x] and a slice of the middle of it */
    mr_val xs = mr_graph_slice(g, x, 0, mr_shape_1d(B * T * C / 2));
    mr_val cat = mr_graph_concat(g, (mr_val[]){y, xs}, 2, mr_shape_1d(B * T * C * 3 / 2));
    mr_val mid = mr_graph_slice(g, cat, 5, mr_shape_1d(20));
    double rdata[20], r2[B * T * C];
    th_fill_uniform_f64(rdata, 20, -1, 1, 40);
    th_fill_uniform_f64(r2, B * T * C, -1, 1, 41);
    mr_val r = mr_graph_const(g, MR_F64, mr_shape_1d(20), rdata);
    mr_val rr = mr_graph_const(g, MR_F64, mr_shape_3d(B, T, C), r2);
    c.loss = mr_graph_add(g, mr_graph_sum(g, mr_graph_mul(g, mid, r), 1u),
                          mr_graph_sum(g, mr_graph_reshape(g, mr_graph_mul(g, y, rr), mr_shape_1d(B * T * C)), 1u));
    MR_ASSERT_OK(mr_graph_status(g));
    gc_param(&c, x, -1, 1, 42);
    for (int32_t i = 0; i < mr_graph_num_params(g); i++) {
        mr_val v = mr_graph_param_at(g, i);
        if (v.id != x.id) gc_param(&c, v, -0.6, 0.6, 43 + (uint64_t)i);
    }
    gc_build(&c);
    gc_check(&c);
    gc_free(&c);
    mr_params_free(ps);
}

/* Batch norm (one MR_OP_BATCHNORM node): (0) conv -> batch norm in training (through the batch
 * statistics) with gamma and beta; (1) the same in evaluation at fixed running statistics (graph
 * inputs); (2) a 2-d (N, C) batch norm without gamma and beta after a matmul, in training; each
 * -> tanh -> * constant -> sum. Variant 0 also uses the mean output in a second loss term, which
 * must be rejected ("only output 0 ... is differentiated"). */
static void test_grad_batchnorm(void **state) {
    (void)state;
    static const char *const names[3] = {"batchnorm: conv, training", "batchnorm: conv, evaluation",
                                         "batchnorm: (N,C), no affine"};
    for (int variant = 0; variant < 3; variant++) {
        enum { N = 3, CI = 2, HW = 4, C = 3, D = 5 };
        gc c = {.what = names[variant]};
        MR_ASSERT_OK(mr_graph_new(&c.g));
        mr_graph *g = c.g;
        const int training = variant != 1;
        mr_val x, w, h, gamma = MR_VAL_NONE, beta = MR_VAL_NONE, rm = MR_VAL_NONE, rvv = MR_VAL_NONE;
        if (variant < 2) {
            x = mr_graph_param(g, "x", MR_F64, mr_shape_4d(N, CI, HW, HW));
            w = mr_graph_param(g, "w", MR_F64, mr_shape_4d(C, CI, 3, 3));
            h = mr_graph_conv2d(g, x, w, MR_VAL_NONE, 1, 1); /* (N, C, HW, HW) */
            gamma = mr_graph_param(g, "gamma", MR_F64, mr_shape_1d(C));
            beta = mr_graph_param(g, "beta", MR_F64, mr_shape_1d(C));
        } else {
            x = mr_graph_param(g, "x", MR_F64, mr_shape_2d(N + 2, D));
            w = mr_graph_param(g, "w", MR_F64, mr_shape_2d(C, D));
            h = mr_graph_matmul(g, x, w, 0, 1, 1.0); /* (N + 2, C) */
        }
        if (!training) {
            rm = mr_graph_input(g, "running_mean", MR_F64, mr_shape_1d(C));
            rvv = mr_graph_input(g, "running_var", MR_F64, mr_shape_1d(C));
        }
        mr_val mean, var;
        mr_val y = mr_graph_batchnorm(g, h, gamma, beta, rm, rvv, 1e-5, training, &mean, &var);
        assert_true(training ? mean.id && var.id : !mean.id && !var.id);
        mr_shape sy = mr_graph_shape(g, y);
        int64_t ny = mr_shape_numel(&sy);
        double *rdat = th_alloc(sizeof(double) * (size_t)ny);
        th_fill_uniform_f64(rdat, ny, -1, 1, 300 + (uint64_t)variant);
        mr_val r = mr_graph_const(g, MR_F64, sy, rdat);
        c.loss = mr_graph_sum(g, mr_graph_reshape(g, mr_graph_mul(g, mr_graph_unary(g, MR_OP_TANH, y), r),
                                                  mr_shape_1d(ny)), 1u);
        MR_ASSERT_OK(mr_graph_status(g));
        gc_param(&c, x, -1, 1, 310 + (uint64_t)variant);
        gc_param(&c, w, -0.5, 0.5, 320 + (uint64_t)variant);
        if (variant < 2) {
            gc_param(&c, gamma, 0.5, 1.5, 330);
            gc_param(&c, beta, -0.5, 0.5, 331);
        }
        double rmd[C], rvd[C];
        th_fill_uniform_f64(rmd, C, -0.3, 0.3, 332);
        th_fill_uniform_f64(rvd, C, 0.5, 2.0, 333);
        if (!training) {
            gc_input(&c, rm, rmd);
            gc_input(&c, rvv, rvd);
        }
        gc_build(&c);
        gc_check(&c);
        if (variant == 0) {
            /* a loss through the mean output has no rule */
            mr_val l2 = mr_graph_add(g, c.loss, mr_graph_sum(g, mean, 1u));
            mr_val gr[GC_MAX];
            assert_int_equal(mr_graph_grad(g, l2, c.params, c.n, gr), MR_ERR_INVALID);
            if (!strstr(mr_last_error(), "only output 0")) fail_msg("unexpected error: %s", mr_last_error());
        }
        gc_free(&c);
    }
}

/* A hook that copies: with it as nn->sync (replicas 1) mr_nn_batchnorm builds its composed,
 * synchronised formulation, which must compute what the fused node computes. */
static mr_status copy_hook(void *ctx, const void *x, void *y, int64_t numel, mr_dtype dt, mr_stream *stream,
                           int device) {
    (void)ctx, (void)stream, (void)device;
    memcpy(y, x, (size_t)numel * mr_dtype_size(dt));
    return MR_OK;
}

/* mr_nn_batchnorm without nn->sync (one BATCHNORM node) against its composed formulation (an
 * identity hook as nn->sync), both in f64, training and evaluation, 2-d and 4-d: y, the gradients
 * of sum(y * r) to x, weight and bias, and the new running_mean, running_var and
 * num_batches_tracked. */
static void test_batchnorm_fused_vs_composed(void **state) {
    (void)state;
    const mr_hook ident = {copy_hook, NULL, 1};
    const mr_shape shapes[2] = {mr_shape_4d(3, 4, 5, 3), mr_shape_2d(7, 3)};
    for (int k = 0; k < 2; k++)
        for (int training = 0; training < 2; training++) {
            const mr_shape s = shapes[k];
            const int64_t n = mr_shape_numel(&s), C = s.dim[1];
            double *xd = th_alloc(sizeof(double) * (size_t)n), *rd = th_alloc(sizeof(double) * (size_t)n);
            double wd[8], bd[8], rmd[8], rvd[8], nbtd[1] = {4};
            th_fill_uniform_f64(xd, n, 2.0, 5.0, 400 + (uint64_t)k);
            th_fill_uniform_f64(rd, n, -1, 1, 410); /* not x's seed: r affine in x gives dx = 0 */
            th_fill_uniform_f64(wd, C, 0.5, 1.5, 402);
            th_fill_uniform_f64(bd, C, -0.5, 0.5, 403);
            th_fill_uniform_f64(rmd, C, 2.0, 5.0, 404);
            th_fill_uniform_f64(rvd, C, 0.5, 1.0, 405);
            const double *out[2][7];
            int nout = 0, nodes[2];
            mr_graph *gs[2];
            mr_plan *ps[2];
            mr_params *regs[2];
            for (int fused = 0; fused < 2; fused++) {
                MR_ASSERT_OK(mr_graph_new(&gs[fused]));
                MR_ASSERT_OK(mr_params_new(&regs[fused]));
                mr_graph *g = gs[fused];
                mr_nn nn;
                memset(&nn, 0, sizeof nn);
                nn.g = g;
                nn.ps = regs[fused];
                nn.dtype = MR_F64;
                nn.training = training;
                nn.sync = fused ? NULL : &ident;
                mr_val x = mr_graph_param(g, "x", MR_F64, s);
                mr_val y = mr_nn_batchnorm(&nn, "bn", x, 0.1, 1e-5, 1);
                mr_val r = mr_graph_const(g, MR_F64, s, rd);
                mr_val loss = mr_graph_sum(g, mr_graph_reshape(g, mr_graph_mul(g, y, r), mr_shape_1d(n)), 1u);
                mr_val params[3] = {x, mr_graph_find(g, "bn.weight"), mr_graph_find(g, "bn.bias")}, grads[3];
                MR_ASSERT_OK(mr_graph_grad(g, loss, params, 3, grads));
                MR_ASSERT_OK(mr_graph_status(g));
                assert_int_equal(nn.n_updates, training ? 3 : 0);
                mr_val keep[7] = {y, grads[0], grads[1], grads[2]};
                nout = 4;
                for (int i = 0; i < nn.n_updates; i++) keep[nout++] = nn.upd_val[i];
                MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, keep, nout, &ps[fused]));
                MR_ASSERT_OK(mr_plan_bind(ps[fused], x, xd));
                MR_ASSERT_OK(mr_plan_bind(ps[fused], params[1], wd));
                MR_ASSERT_OK(mr_plan_bind(ps[fused], params[2], bd));
                MR_ASSERT_OK(mr_plan_bind(ps[fused], mr_graph_find(g, "bn.running_mean"), rmd));
                MR_ASSERT_OK(mr_plan_bind(ps[fused], mr_graph_find(g, "bn.running_var"), rvd));
                MR_ASSERT_OK(mr_plan_bind(ps[fused], mr_graph_find(g, "bn.num_batches_tracked"), nbtd));
                MR_ASSERT_OK(mr_plan_run(ps[fused]));
                for (int i = 0; i < nout; i++) out[fused][i] = mr_plan_data(ps[fused], keep[i]);
                nodes[fused] = mr_graph_num_nodes(g);
            }
            /* the fused graph is smaller: one node where the composition has ten */
            assert_true(nodes[1] < nodes[0]);
            const int64_t len[6] = {n, n, C, C, C, C};
            static const char *const what[6] = {"y", "dx", "dweight", "dbias", "running_mean", "running_var"};
            for (int i = 0; i < nout && i < 6; i++) {
                char w[128];
                snprintf(w, sizeof w, "batchnorm fused vs composed, shape %d, training %d: %s", k, training, what[i]);
                /* the two differ only by rounding order: measured max abs 2.7e-15, NMSE 2.5e-30 */
                assert_true(th_compare(w, out[1][i], MR_F64, out[0][i], len[i], TOL_PARITY_F64_ATOL,
                                       TOL_PARITY_F64_RTOL, TOL_PARITY_F64_NMSE));
            }
            if (training) assert_true(out[0][6][0] == 5.0 && out[1][6][0] == 5.0); /* num_batches_tracked */
            for (int fused = 0; fused < 2; fused++) {
                mr_plan_free(ps[fused]);
                mr_graph_free(gs[fused]);
                mr_params_free(regs[fused]);
            }
            th_free_all();
        }
}

/* Every branch of the GEMM rule: both transposes, 2-d, batched A and B, and a batched (4-d) A
 * sharing a 2-d B, whose gradient sums over the batch; loss = sum(C * r), alpha 0.7. */
static void test_grad_gemm_layouts(void **state) {
    (void)state;
    enum { M = 3, K = 4, N = 2 };
    for (int layout = 0; layout < 3; layout++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                char what[64];
                snprintf(what, sizeof what, "gemm %s ta%d tb%d",
                         layout == 0 ? "2-d" : layout == 1 ? "batched" : "shared-B", ta, tb);
                gc c = {.what = what};
                MR_ASSERT_OK(mr_graph_new(&c.g));
                int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                mr_shape sa = layout == 0 ? mr_shape_2d(ar, ac)
                            : layout == 1 ? mr_shape_3d(2, ar, ac) : mr_shape_4d(2, 2, ar, ac);
                mr_shape sb = layout == 1 ? mr_shape_3d(2, br, bc) : mr_shape_2d(br, bc);
                mr_val a = mr_graph_param(c.g, "a", MR_F64, sa);
                mr_val b = mr_graph_param(c.g, "b", MR_F64, sb);
                mr_val y = mr_graph_matmul(c.g, a, b, ta, tb, 0.7);
                mr_shape sy = mr_graph_shape(c.g, y);
                double *r = th_alloc(sizeof(double) * (size_t)mr_shape_numel(&sy));
                th_fill_uniform_f64(r, mr_shape_numel(&sy), -1, 1, 40);
                mr_val rv = mr_graph_const(c.g, MR_F64, sy, r);
                c.loss = mr_graph_sum(c.g, mr_graph_mul(c.g, y, rv), all_axes(c.g, y));
                MR_ASSERT_OK(mr_graph_status(c.g));
                gc_param(&c, a, -1, 1, 41);
                gc_param(&c, b, -1, 1, 42);
                gc_build(&c);
                gc_check(&c);
                gc_free(&c);
            }
}

/* The fused linear node (mr_graph_linear: one GEMM with the bias and GELU in its epilogue) with
 * and without bias and GELU, on a 2-d and a 3-d x: the gradients of x, w and bias (dbias sums
 * over every leading row; with GELU everything goes through GELU_BWD of the saved pre). A second
 * linear on top makes the loss depend on the first one's GELU output nonlinearly. */
static void test_grad_linear(void **state) {
    (void)state;
    enum { K = 4, N = 3 };
    for (int nd = 2; nd <= 3; nd++)
        for (int with_bias = 0; with_bias < 2; with_bias++)
            for (int gelu = 0; gelu < 2; gelu++) {
                char what[64];
                snprintf(what, sizeof what, "linear %d-d%s%s", nd, with_bias ? " bias" : "", gelu ? " gelu" : "");
                gc c = {.what = what};
                MR_ASSERT_OK(mr_graph_new(&c.g));
                mr_graph *g = c.g;
                mr_shape sx = nd == 2 ? mr_shape_2d(5, K) : mr_shape_3d(2, 3, K);
                mr_val x = mr_graph_param(g, "x", MR_F64, sx);
                mr_val w = mr_graph_param(g, "w", MR_F64, mr_shape_2d(N, K));
                mr_val b = with_bias ? mr_graph_param(g, "bias", MR_F64, mr_shape_1d(N)) : MR_VAL_NONE;
                mr_val w2 = mr_graph_param(g, "w2", MR_F64, mr_shape_2d(2, N));
                mr_val h = mr_graph_linear(g, x, w, b, gelu);
                mr_val y = mr_graph_linear(g, h, w2, MR_VAL_NONE, 0);
                MR_ASSERT_OK(mr_graph_status(g));
                mr_shape sh = mr_graph_shape(g, h), sy = mr_graph_shape(g, y);
                assert_int_equal(sh.ndim, nd);
                assert_int_equal(sh.dim[nd - 1], N);
                double *r = th_alloc(sizeof(double) * (size_t)mr_shape_numel(&sy));
                th_fill_uniform_f64(r, mr_shape_numel(&sy), -1, 1, 60);
                mr_val rv = mr_graph_const(g, MR_F64, sy, r);
                /* plus sum(h^2): the loss also sees h directly */
                c.loss = mr_graph_add(g, mr_graph_sum(g, mr_graph_mul(g, y, rv), all_axes(g, y)),
                                      mr_graph_reshape(g, mr_graph_sum(g, mr_graph_mul(g, h, h), all_axes(g, h)),
                                                       mr_shape_1d(1)));
                c.loss = mr_graph_reshape(g, c.loss, mr_shape_1d(1));
                MR_ASSERT_OK(mr_graph_status(g));
                gc_param(&c, x, -1.5, 1.5, 61);
                gc_param(&c, w, -1, 1, 62);
                if (with_bias) gc_param(&c, b, -1, 1, 63);
                gc_param(&c, w2, -1, 1, 64);
                gc_build(&c);
                gc_check(&c);
                gc_free(&c);
            }
}

/* (4) tanh, sigmoid, exp, scale, log, sqrt, div, sub, add with broadcasting, max, log_softmax,
 * dropout (fixed seed), relu, mul, mean, in one graph over a positive x (3,4) and a row b (4). */
static void test_grad_ops(void **state) {
    (void)state;
    gc c = {.what = "ops"};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mr_graph *g = c.g;
    mr_val x = mr_graph_param(g, "x", MR_F64, mr_shape_2d(3, 4));
    mr_val b = mr_graph_param(g, "b", MR_F64, mr_shape_1d(4));
    mr_val t = mr_graph_unary(g, MR_OP_TANH, x);
    mr_val s = mr_graph_unary(g, MR_OP_SIGMOID, x);
    mr_val e = mr_graph_unary(g, MR_OP_EXP, mr_graph_scale(g, x, 0.5));
    mr_val l = mr_graph_unary(g, MR_OP_LOG, x);
    mr_val q = mr_graph_unary(g, MR_OP_SQRT, x);
    mr_val d = mr_graph_div(g, t, q);
    mr_val u = mr_graph_sub(g, mr_graph_add(g, s, b), e);
    mr_val m = mr_graph_max(g, l, 2u); /* (3,1), broadcast back below */
    mr_val ls = mr_graph_log_softmax(g, u);
    mr_val dr = mr_graph_dropout(g, d, 0.3, 1234, 7);
    double rv[12];
    th_fill_uniform_f64(rv, 12, -1, 1, 50);
    mr_val r = mr_graph_const(g, MR_F64, mr_shape_2d(3, 4), rv);
    mr_val y = mr_graph_add(g, mr_graph_add(g, mr_graph_mul(g, ls, r), dr), m);
    mr_val one = mr_graph_fill(g, MR_F64, mr_shape_1d(1), 1.0);
    y = mr_graph_add(g, y, mr_graph_unary(g, MR_OP_RELU, mr_graph_sub(g, x, one)));
    c.loss = mr_graph_mean(g, y, 3u);
    MR_ASSERT_OK(mr_graph_status(g));
    gc_param(&c, x, 0.5, 1.5, 51);
    gc_param(&c, b, -1, 1, 52);
    gc_build(&c);
    gc_check(&c);
    gc_free(&c);
}

/* CAST is not checked by differences (an f32 round trip is not differentiable at f64
 * precision); its rule casts the gradient back: d sum(cast64(cast32(x)) * r) / dx is r rounded
 * to f32. */
static void test_grad_cast(void **state) {
    (void)state;
    mr_graph *g = NULL;
    mr_plan *p = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val x = mr_graph_param(g, "x", MR_F64, mr_shape_2d(2, 3));
    double r[6], xv[6], want[6];
    th_fill_uniform_f64(r, 6, -1, 1, 60);
    th_fill_uniform_f64(xv, 6, -1, 1, 61);
    mr_val y = mr_graph_cast(g, mr_graph_cast(g, x, MR_F32), MR_F64);
    mr_val loss = mr_graph_sum(g, mr_graph_mul(g, y, mr_graph_const(g, MR_F64, mr_shape_2d(2, 3), r)), 3u);
    mr_val dx;
    int32_t nodes0 = mr_graph_num_nodes(g);
    MR_ASSERT_OK(mr_graph_grad(g, loss, &x, 1, &dx));
    assert_true(mr_graph_num_nodes(g) > nodes0);
    assert_int_equal(mr_graph_dtype(g, dx), MR_F64);
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, &dx, 1, &p));
    MR_ASSERT_OK(mr_plan_bind(p, x, xv));
    MR_ASSERT_OK(mr_plan_run(p));
    for (int i = 0; i < 6; i++) want[i] = (double)(float)r[i];
    assert_memory_equal(mr_plan_data(p, dx), want, sizeof want);
    mr_plan_free(p);
    mr_graph_free(g);
}

/* (5) a param used twice, a param the loss does not depend on (a zero constant), a loss that is
 * a view (reshape to a 0-d scalar). */
static void test_grad_reuse_unreachable(void **state) {
    (void)state;
    gc c = {.what = "reuse"};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mr_graph *g = c.g;
    mr_val p = mr_graph_param(g, "p", MR_F64, mr_shape_1d(3));
    mr_val q = mr_graph_param(g, "q", MR_F64, mr_shape_2d(2, 2));
    (void)mr_graph_unary(g, MR_OP_TANH, q); /* a branch that does not reach the loss */
    mr_val y = mr_graph_add(g, mr_graph_mul(g, p, p), mr_graph_unary(g, MR_OP_TANH, p));
    c.loss = mr_graph_reshape(g, mr_graph_sum(g, y, 1u), mr_shape_make(0, NULL));
    MR_ASSERT_OK(mr_graph_status(g));
    gc_param(&c, p, -1, 1, 70);
    gc_param(&c, q, -1, 1, 71);
    gc_build(&c);
    assert_int_equal(mr_graph_kind(g, c.grads[1]), MR_VAL_CONST);
    gc_check(&c);
    const double *dq = mr_plan_data(c.plan, c.grads[1]);
    for (int i = 0; i < 4; i++) assert_true(dq[i] == 0.0);
    gc_free(&c);
}

/* Integer values get no gradient; the gradient of an intermediate value; the loss itself. */
static void test_grad_int_and_intermediate(void **state) {
    (void)state;
    mr_graph *g = NULL;
    mr_plan *pl = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val ids = mr_graph_input(g, "ids", MR_I32, mr_shape_1d(3));
    mr_val table = mr_graph_param(g, "table", MR_F64, mr_shape_2d(4, 2));
    mr_val h = mr_graph_scale(g, mr_graph_embedding(g, table, ids), 2.0); /* (3,2) */
    mr_val loss = mr_graph_sum(g, mr_graph_unary(g, MR_OP_TANH, h), 3u);
    mr_val wrt[4] = {ids, h, table, loss}, grads[4];
    MR_ASSERT_OK(mr_graph_grad(g, loss, wrt, 4, grads));
    assert_int_equal(grads[0].id, 0);
    mr_val keep[3] = {grads[1], grads[2], grads[3]};
    for (int i = 0; i < 3; i++) assert_int_not_equal(keep[i].id, 0);
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, keep, 3, &pl));
    int32_t idv[3] = {2, 0, 2};
    double tv[8];
    th_fill_uniform_f64(tv, 8, -1, 1, 80);
    MR_ASSERT_OK(mr_plan_bind(pl, ids, idv));
    MR_ASSERT_OK(mr_plan_bind(pl, table, tv));
    MR_ASSERT_OK(mr_plan_run(pl));
    const double *dh = mr_plan_data(pl, grads[1]), *dt = mr_plan_data(pl, grads[2]), *dl = mr_plan_data(pl, grads[3]);
    double want_dh[6], want_dt[8] = {0};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            double th = tanh(2.0 * tv[idv[i] * 2 + j]);
            want_dh[i * 2 + j] = 1.0 - th * th;
            want_dt[idv[i] * 2 + j] += 2.0 * (1.0 - th * th);
        }
    assert_true(th_compare("d loss / d h", dh, MR_F64, want_dh, 6, 1e-15, 1e-13, 1e-26));
    assert_true(th_compare("d loss / d table", dt, MR_F64, want_dt, 8, 1e-15, 1e-13, 1e-26));
    assert_true(dl[0] == 1.0);
    mr_plan_free(pl);
    mr_graph_free(g);
}

/* Errors: a non-scalar or integer loss, an op without a rule on the path (a *_BWD op), a loss
 * that depends on a saved output (softmax_xent's probs); all sticky, with the op named. A graph
 * that already failed returns its first error. */
static void test_grad_errors(void **state) {
    (void)state;
    mr_graph *g = NULL;
    mr_val gr;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val p = mr_graph_param(g, "p", MR_F64, mr_shape_2d(2, 3));
    mr_val t = mr_graph_unary(g, MR_OP_TANH, p);
    assert_int_equal(mr_graph_grad(g, t, &p, 1, &gr), MR_ERR_INVALID);
    assert_int_equal(gr.id, 0);
    assert_non_null(strstr(mr_graph_error(g), "scalar"));
    assert_non_null(strstr(mr_graph_error(g), "[2, 3]"));
    assert_int_equal(mr_graph_status(g), MR_ERR_INVALID);
    mr_graph_free(g);

    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val ids = mr_graph_input(g, "ids", MR_I32, mr_shape_1d(1));
    p = mr_graph_param(g, "p", MR_F64, mr_shape_1d(1));
    assert_int_equal(mr_graph_grad(g, ids, &p, 1, &gr), MR_ERR_INVALID);
    assert_non_null(strstr(mr_graph_error(g), "i32"));
    mr_graph_free(g);

    /* softmax_bwd on the path */
    MR_ASSERT_OK(mr_graph_new(&g));
    p = mr_graph_param(g, "p", MR_F64, mr_shape_2d(2, 3));
    mr_val y = mr_graph_softmax(g, p), dx;
    int dts[1] = {MR_F64};
    mr_shape shp[1] = {mr_shape_2d(2, 3)};
    mr_val in[2] = {y, y};
    MR_ASSERT_OK(mr_graph_node(g, MR_OP_SOFTMAX_BWD, in, 2, NULL, dts, shp, 1, &dx));
    mr_val loss = mr_graph_sum(g, dx, 3u);
    assert_int_equal(mr_graph_grad(g, loss, &p, 1, &gr), MR_ERR_INVALID);
    assert_non_null(strstr(mr_graph_error(g), "softmax_bwd"));
    assert_non_null(strstr(mr_graph_error(g), "no gradient rule"));
    /* sticky: the next call returns the same error and builds nothing */
    int32_t nn = mr_graph_num_nodes(g);
    assert_int_equal(mr_graph_grad(g, loss, &p, 1, &gr), MR_ERR_INVALID);
    assert_int_equal(mr_graph_num_nodes(g), nn);
    mr_graph_free(g);

    /* the loss depends on softmax_xent's probs (output 1) */
    MR_ASSERT_OK(mr_graph_new(&g));
    p = mr_graph_param(g, "p", MR_F64, mr_shape_2d(2, 3));
    mr_val lab = mr_graph_input(g, "labels", MR_I32, mr_shape_1d(2));
    int xd[2] = {MR_F64, MR_F64};
    mr_shape xs[2] = {mr_shape_1d(2), mr_shape_2d(2, 3)};
    mr_val xin[2] = {p, lab}, xo[2];
    MR_ASSERT_OK(mr_graph_node(g, MR_OP_SOFTMAX_XENT, xin, 2, NULL, xd, xs, 2, xo));
    loss = mr_graph_sum(g, mr_graph_add(g, xo[1], mr_graph_reshape(g, xo[0], mr_shape_2d(2, 1))), 3u);
    assert_int_equal(mr_graph_grad(g, loss, &p, 1, &gr), MR_ERR_INVALID);
    assert_non_null(strstr(mr_graph_error(g), "softmax_xent"));
    assert_non_null(strstr(mr_graph_error(g), "output 1"));
    mr_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_mlp),          cmocka_unit_test(test_grad_cnn),
        cmocka_unit_test(test_grad_avgpool),
        cmocka_unit_test(test_grad_transformer),  cmocka_unit_test(test_grad_gemm_layouts),
        cmocka_unit_test(test_grad_ops),          cmocka_unit_test(test_grad_cast),
        cmocka_unit_test(test_grad_reuse_unreachable), cmocka_unit_test(test_grad_int_and_intermediate),
        cmocka_unit_test(test_grad_errors),       cmocka_unit_test(test_grad_partial),
        cmocka_unit_test(test_grad_attention_slices), cmocka_unit_test(test_grad_linear),
        cmocka_unit_test(test_grad_batchnorm),    cmocka_unit_test(test_batchnorm_fused_vs_composed),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    printf("autodiff grad: max |analytic - numeric| over all checks %.2e, max rel %.2e\n", g_max_abs, g_max_rel);
    return rc;
}
