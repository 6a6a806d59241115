/* Gradient checks on the GPU: small f64 graphs that use every differentiable op family (fused
 * linear with bias and GELU, conv2d, max-pool, embedding, layernorm, causal softmax attention
 * through permute, slices and concat, dropout, reductions, broadcasting binaries, softmax
 * cross-entropy with an ignored row) are differentiated with mr_graph_grad and planned on cuda:0.
 * Each gradient must equal the CPU's f64 gradient of the same graph (which test_autodiff_grad.c
 * checks by finite differences) to 1e-9 relative, and sampled coordinates are checked by central
 * finite differences computed with GPU forward runs. Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autodiff/graph.h"
#include "gpu_util.h"

#define MAXP 12

typedef struct check {
    const char *what;
    mr_graph *g;
    mr_val loss;
    mr_val params[MAXP], grads[MAXP];
    double *host[MAXP];
    mr_tensor *dev[MAXP];
    int n;
    mr_val inputs[4];
    void *in_host[4];
    mr_tensor *in_dev[4];
    int n_in;
} check;

static double *param(check *c, mr_val v, double lo, double hi, uint64_t seed) {
    assert_true(c->n < MAXP);
    mr_shape s = mr_graph_shape(c->g, v);
    c->params[c->n] = v;
    c->host[c->n] = gpu_rand(mr_shape_numel(&s), lo, hi, seed, MR_F64);
    return c->host[c->n++];
}

static void input(check *c, mr_val v, void *data) {
    c->inputs[c->n_in] = v;
    c->in_host[c->n_in++] = data;
}

static double run_loss(mr_plan *p, const check *c, int gpu) {
    MR_ASSERT_OK(mr_plan_run(p));
    double l = 0;
    if (!gpu) return *(const double *)mr_plan_data(p, c->loss);
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    MR_ASSERT_OK(be->copy(0, &l, mr_plan_data(p, c->loss), sizeof l, MR_COPY_D2H, NULL));
    MR_ASSERT_OK(be->stream_sync(NULL));
    return l;
}

static void run_check(check *c) {
    MR_ASSERT_OK(mr_graph_status(c->g));
    MR_ASSERT_OK(mr_graph_grad(c->g, c->loss, c->params, c->n, c->grads));
    mr_val keep[MAXP + 1];
    keep[0] = c->loss;
    for (int i = 0; i < c->n; i++) keep[i + 1] = c->grads[i];
    mr_plan *cpu = NULL, *gpu = NULL;
    mr_device d = {MR_DEVICE_CUDA, 0};
    MR_ASSERT_OK(mr_plan_new(c->g, MR_DEVICE_CPU, keep, c->n + 1, &cpu));
    MR_ASSERT_OK(mr_plan_new_on(c->g, d, NULL, keep, c->n + 1, &gpu));
    for (int i = 0; i < c->n; i++) {
        MR_ASSERT_OK(mr_plan_bind(cpu, c->params[i], c->host[i]));
        c->dev[i] = gpu_upload(c->host[i], MR_F64, mr_graph_shape(c->g, c->params[i]));
        MR_ASSERT_OK(mr_plan_bind(gpu, c->params[i], mr_tensor_data(c->dev[i])));
    }
    for (int i = 0; i < c->n_in; i++) {
        mr_shape s = mr_graph_shape(c->g, c->inputs[i]);
        mr_dtype dt = mr_graph_dtype(c->g, c->inputs[i]);
        MR_ASSERT_OK(mr_plan_bind(cpu, c->inputs[i], c->in_host[i]));
        c->in_dev[i] = gpu_alloc(dt, s);
        MR_ASSERT_OK(mr_tensor_copy_from_host(c->in_dev[i], c->in_host[i], (size_t)mr_shape_numel(&s) * mr_dtype_size(dt)));
        MR_ASSERT_OK(mr_plan_bind(gpu, c->inputs[i], mr_tensor_data(c->in_dev[i])));
    }
    double lc = run_loss(cpu, c, 0), lg = run_loss(gpu, c, 1);
    if (!(fabs(lc - lg) <= 1e-12 + 1e-10 * fabs(lc))) fail_msg("%s: loss GPU %.17g, CPU %.17g", c->what, lg, lc);
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    double worst_fd = 0;
    /* every analytic gradient first: the finite differences below rerun the plan */
    double *gg[MAXP];
    for (int i = 0; i < c->n; i++) {
        mr_shape s = mr_graph_shape(c->g, c->params[i]);
        int64_t n = mr_shape_numel(&s);
        gg[i] = th_alloc((size_t)n * sizeof(double));
        MR_ASSERT_OK(be->copy(0, gg[i], mr_plan_data(gpu, c->grads[i]), (size_t)n * sizeof(double), MR_COPY_D2H, NULL));
        MR_ASSERT_OK(be->stream_sync(NULL));
        char what[200];
        snprintf(what, sizeof what, "%s: d loss / d %s, GPU vs CPU", c->what, mr_graph_name(c->g, c->params[i]));
        assert_true(th_compare(what, gg[i], MR_F64, mr_plan_data(cpu, c->grads[i]), n, 1e-12, 1e-9, 1e-18));
    }
    for (int i = 0; i < c->n; i++) {
        mr_shape s = mr_graph_shape(c->g, c->params[i]);
        int64_t n = mr_shape_numel(&s);
        /* central differences on the GPU at up to 8 coordinates */
        for (int k = 0; k < 8 && k < n; k++) {
            int64_t j = (int64_t)k * n / 8;
            double x0 = c->host[i][j], v;
            double f[2];
            for (int side = 0; side < 2; side++) {
                v = x0 + (side ? -TOL_GRAD_H : TOL_GRAD_H);
                MR_ASSERT_OK(be->copy(0, (double *)mr_tensor_data(c->dev[i]) + j, &v, sizeof v, MR_COPY_H2D, NULL));
                f[side] = run_loss(gpu, c, 1);
            }
            MR_ASSERT_OK(be->copy(0, (double *)mr_tensor_data(c->dev[i]) + j, &x0, sizeof x0, MR_COPY_H2D, NULL));
            double num = (f[0] - f[1]) / (2 * TOL_GRAD_H), e = fabs(num - gg[i][j]);
            if (e > worst_fd) worst_fd = e;
            if (!(e <= TOL_GRAD_ATOL + TOL_GRAD_RTOL * fabs(num)))
                fail_msg("%s: %s[%lld]: analytic %.12g, numeric %.12g", c->what, mr_graph_name(c->g, c->params[i]),
                         (long long)j, gg[i][j], num);
        }
    }
    fprintf(stderr, "%s: %d params: GPU gradients equal the CPU's to 1e-9; worst |analytic - numeric| %.2e\n", c->what,
            c->n, worst_fd);
    mr_plan_free(cpu);
    mr_plan_free(gpu);
    mr_graph_free(c->g);
    gpu_free_all();
}

/* Fused linear layers (bias, bias + GELU) and cross-entropy with an ignored row. */
static void test_grad_mlp(void **state) {
    (void)state;
    enum { N = 6, D = 5, H = 16, C = 4 };
    check c = {.what = "mlp"};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mr_graph *g = c.g;
    mr_val x = mr_graph_param(g, "x", MR_F64, mr_shape_2d(N, D));
    mr_val w1 = mr_graph_param(g, "w1", MR_F64, mr_shape_2d(H, D)), b1 = mr_graph_param(g, "b1", MR_F64, mr_shape_1d(H));
    mr_val w2 = mr_graph_param(g, "w2", MR_F64, mr_shape_2d(C, H)), b2 = mr_graph_param(g, "b2", MR_F64, mr_shape_1d(C));
    mr_val labels = mr_graph_input(g, "labels", MR_I32, mr_shape_1d(N));
    mr_val h = mr_graph_linear(g, x, w1, b1, 1);
    mr_val logits = mr_graph_add(g, mr_graph_linear(g, h, w2, MR_VAL_NONE, 0), b2);
    c.loss = mr_graph_mean(g, mr_graph_softmax_xent(g, logits, labels, -100), 1u);
    static int32_t lab[N] = {0, 3, -100, 2, 1, 3};
    param(&c, x, -1, 1, 1);
    param(&c, w1, -0.6, 0.6, 2);
    param(&c, b1, -0.2, 0.2, 3);
    param(&c, w2, -0.6, 0.6, 4);
    param(&c, b2, -0.2, 0.2, 5);
    input(&c, labels, lab);
    run_check(&c);
}

/* conv2d (stride 1 pad 1, then stride 2), max-pool, tanh, a linear head, softmax, a weighted sum. */
static void test_grad_cnn(void **state) {
    (void)state;
    enum { N = 2, C = 2, HW = 6, O = 3, K = 3 };
    check c = {.what = "cnn"};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mr_graph *g = c.g;
    mr_val x = mr_graph_param(g, "x", MR_F64, mr_shape_4d(N, C, HW, HW));
    mr_val w = mr_graph_param(g, "w", MR_F64, mr_shape_4d(O, C, K, K)), b = mr_graph_param(g, "b", MR_F64, mr_shape_1d(O));
    mr_val w2 = mr_graph_param(g, "w2", MR_F64, mr_shape_4d(O, O, K, K));
    mr_val y = mr_graph_unary(g, MR_OP_TANH, mr_graph_conv2d(g, x, w, b, 1, 1));  /* (N,O,6,6) */
    y = mr_graph_maxpool2d(g, y, 2, 2, 0);                                         /* (N,O,3,3) */
    y = mr_graph_conv2d(g, y, w2, MR_VAL_NONE, 2, 1);                              /* (N,O,2,2) */
    mr_val s = mr_graph_softmax(g, mr_graph_reshape(g, y, mr_shape_2d(N, O * 4)));
    double k[N * O * 4];
    th_fill_uniform_f64(k, N * O * 4, -1, 1, 9);
    c.loss = mr_graph_sum(g, mr_graph_mul(g, s, mr_graph_const(g, MR_F64, mr_shape_2d(N, O * 4), k)), 3u);
    param(&c, x, -1, 1, 11);
    param(&c, w, -0.5, 0.5, 12);
    param(&c, b, -0.1, 0.1, 13);
    param(&c, w2, -0.5, 0.5, 14);
    run_check(&c);
}

/* Embedding with repeated ids, layernorm, a qkv projection split by slices, causal attention
 * through permutes and batched GEMMs, dropout, a residual, a concat, max/mean reductions and
 * broadcast binaries. */
static void test_grad_transformer(void **state) {
    (void)state;
    enum { B = 2, T = 4, V = 7, D = 6 };
    check c = {.what = "transformer"};
    MR_ASSERT_OK(mr_graph_new(&c.g));
    mr_graph *g = c.g;
    mr_val ids = mr_graph_input(g, "ids", MR_I32, mr_shape_2d(B, T));
    mr_val table = mr_graph_param(g, "table", MR_F64, mr_shape_2d(V, D));
    mr_val gamma = mr_graph_param(g, "gamma", MR_F64, mr_shape_1d(D)), beta = mr_graph_param(g, "beta", MR_F64, mr_shape_1d(D));
    mr_val wqkv = mr_graph_param(g, "wqkv", MR_F64, mr_shape_2d(3 * D, D)), bqkv = mr_graph_param(g, "bqkv", MR_F64, mr_shape_1d(3 * D));
    mr_val scale = mr_graph_param(g, "scale", MR_F64, mr_shape_1d(D));
    mr_val e = mr_graph_embedding(g, table, ids);                               /* (B,T,D) */
    mr_val n = mr_graph_layernorm(g, e, gamma, beta, 1e-5);
    mr_val qkv = mr_graph_linear(g, n, wqkv, bqkv, 0);                          /* (B,T,3D) */
    int p3[3] = {0, 2, 1};
    mr_val t = mr_graph_permute(g, qkv, p3);                                    /* (B,3D,T) */
    /* q, k, v: for each batch, rows [0,D), [D,2D), [2D,3D) of (3D,T): slices of the flat buffer */
    mr_val q[B], k[B], v[B];
    for (int b = 0; b < B; b++) {
        q[b] = mr_graph_slice(g, t, (int64_t)b * 3 * D * T, mr_shape_3d(1, D, T));
        k[b] = mr_graph_slice(g, t, (int64_t)b * 3 * D * T + D * T, mr_shape_3d(1, D, T));
        v[b] = mr_graph_slice(g, t, (int64_t)b * 3 * D * T + 2 * D * T, mr_shape_3d(1, D, T));
    }
    mr_val Q = mr_graph_concat(g, q, B, mr_shape_3d(B, D, T)), K = mr_graph_concat(g, k, B, mr_shape_3d(B, D, T));
    mr_val Vv = mr_graph_concat(g, v, B, mr_shape_3d(B, D, T));
    mr_val att = mr_graph_causal_softmax(g, mr_graph_matmul(g, Q, K, 1, 0, 1.0 / sqrt((double)D))); /* (B,T,T) */
    att = mr_graph_dropout(g, att, 0.25, 77, 0);
    mr_val y = mr_graph_matmul(g, att, Vv, 0, 1, 1.0);                          /* (B,T,D) */
    y = mr_graph_add(g, mr_graph_mul(g, y, scale), e);                          /* broadcast (D) */
    mr_val mx = mr_graph_max(g, y, 4u), mean = mr_graph_mean(g, y, 2u);         /* (B,T,1), (B,1,D) */
    mr_val z = mr_graph_sub(g, mr_graph_add(g, y, mean), mx);
    mr_val labels = mr_graph_input(g, "labels", MR_I32, mr_shape_1d(B * T));
    c.loss = mr_graph_mean(g, mr_graph_softmax_xent(g, mr_graph_reshape(g, z, mr_shape_2d(B * T, D)), labels, -100), 1u);
    static int32_t idv[B * T] = {1, 4, 1, 6, 0, 4, 4, 2}, lab[B * T] = {0, 5, 2, -100, 1, 1, 3, 4};
    param(&c, table, -1, 1, 21);
    param(&c, gamma, 0.5, 1.5, 22);
    param(&c, beta, -0.3, 0.3, 23);
    param(&c, wqkv, -0.6, 0.6, 24);
    param(&c, bqkv, -0.2, 0.2, 25);
    param(&c, scale, 0.5, 1.5, 26);
    input(&c, ids, idv);
    input(&c, labels, lab);
    run_check(&c);
}

int main(void) {
    if (gpu_none()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_mlp),
        cmocka_unit_test(test_grad_cnn),
        cmocka_unit_test(test_grad_transformer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
