/* A program that uses mirror as a library: it defines its own model with autodiff/nn.h (a residual
 * MLP: Linear, ReLU, two residual blocks, Linear), trains it with AdamW on synthetic data (four
 * classes, each a Gaussian blob in 16 dimensions) for 60 steps and exits 0 only when the loss went
 * down by at least half. It includes mirror's installed headers (<mirror/...>) and is built by
 * examples/CMakeLists.txt (find_package(mirror)) or by pkg-config (README "Use mirror as a
 * library"); tests/install/install.sh builds it both ways against an installed mirror. */
#include <stdio.h>
#include <stdlib.h>

#include <mirror/autodiff/nn.h>
#include <mirror/core/rng.h>
#include <mirror/optim/optim.h>

enum { B = 64, IN = 16, HIDDEN = 32, CLASSES = 4, STEPS = 60 };

#define CHECK(call)                                                                   \
    do {                                                                              \
        if ((call) != MR_OK) {                                                        \
            fprintf(stderr, "residual_mlp: %s failed: %s\n", #call, mr_last_error()); \
            goto fail;                                                                \
        }                                                                             \
    } while (0)

/* x + fc2(relu(fc1(x))): (B, HIDDEN) -> (B, HIDDEN) */
static mr_val residual_block(mr_nn *nn, const char *name, mr_val x) {
    char n1[64], n2[64];
    snprintf(n1, sizeof n1, "%s.fc1", name);
    snprintf(n2, sizeof n2, "%s.fc2", name);
    mr_val h = mr_graph_unary(nn->g, MR_OP_RELU, mr_nn_linear(nn, n1, x, HIDDEN, 1));
    return mr_graph_add(nn->g, x, mr_nn_linear(nn, n2, h, HIDDEN, 1));
}

/* A batch: label k's points are N(center_k, 0.5^2) in each dimension, center_k = +-1 patterns. */
static void make_batch(uint64_t step, float *x, int32_t *y) {
    for (int i = 0; i < B; i++) {
        int k = (int)((step * B + (uint64_t)i) % CLASSES);
        y[i] = k;
        for (int d = 0; d < IN; d++) {
            double u = (double)rand() / RAND_MAX + (double)rand() / RAND_MAX - 1.0; /* triangular, sd 0.41 */
            x[i * IN + d] = (float)((((d + k) % CLASSES) < 2 ? 1.0 : -1.0) + u);
        }
    }
}

int main(void) {
    int rc = 1;
    mr_graph *g = NULL;
    mr_params *ps = NULL;
    mr_plan *plan = NULL;
    mr_optim *opt = NULL;
    mr_val *params = NULL, *keep = NULL;
    float x[B * IN];
    int32_t y[B];
    srand(1);

    CHECK(mr_graph_new(&g));
    CHECK(mr_params_new(&ps));
    mr_nn nn = {.g = g, .ps = ps, .dtype = MR_F32, .compute = MR_F32};
    mr_val vx = mr_graph_input(g, "x", MR_F32, mr_shape_2d(B, IN));
    mr_val vy = mr_graph_input(g, "y", MR_I32, mr_shape_1d(B));
    mr_val h = mr_graph_unary(g, MR_OP_RELU, mr_nn_linear(&nn, "stem", vx, HIDDEN, 1));
    h = residual_block(&nn, "block1", h);
    h = residual_block(&nn, "block2", h);
    mr_val loss = mr_nn_xent_mean(&nn, mr_nn_linear(&nn, "head", h, CLASSES, 1), vy);
    CHECK(mr_graph_status(g));

    /* parameters: one buffer, initialised like PyTorch's Linear; gradients of each, kept */
    CHECK(mr_params_alloc(ps));
    CHECK(mr_params_init(ps, 42));
    int np = mr_params_count(ps);
    params = calloc((size_t)np, sizeof *params);
    keep = calloc((size_t)np + 1, sizeof *keep);
    if (!params || !keep) goto fail;
    for (int i = 0; i < np; i++) params[i] = mr_graph_find(g, mr_params_name(ps, i));
    keep[0] = loss;
    CHECK(mr_graph_grad(g, loss, params, np, keep + 1));
    CHECK(mr_plan_new(g, MR_DEVICE_CPU, keep, np + 1, &plan));
    CHECK(mr_plan_bind(plan, vx, x));
    CHECK(mr_plan_bind(plan, vy, y));
    for (int i = 0; i < np; i++) {
        CHECK(mr_plan_bind(plan, params[i], mr_params_data(ps, i)));
        CHECK(mr_plan_bind(plan, keep[1 + i], mr_params_grad(ps, i)));
    }
    mr_optim_cfg cfg = mr_optim_cfg_default(MR_OPTIM_ADAMW);
    cfg.lr = 3e-3;
    CHECK(mr_optim_new(&cfg, mr_params_buffer_numel(ps), &opt));

    double first = 0, last = 0;
    for (int step = 0; step < STEPS; step++) {
        make_batch((uint64_t)step, x, y);
        CHECK(mr_plan_run(plan));
        double l = *(const float *)mr_plan_data(plan, loss);
        if (step == 0) first = l;
        last = l;
        if (step % 10 == 0 || step == STEPS - 1) printf("step %2d  loss %.4f\n", step, l);
        CHECK(mr_optim_step(opt, mr_params_buffer(ps), mr_params_grad_buffer(ps), cfg.lr));
    }
    printf("%lld parameters, loss %.4f -> %.4f\n", (long long)mr_params_total(ps), first, last);
    if (!(last < 0.5 * first)) {
        fprintf(stderr, "residual_mlp: the loss did not halve (%.4f -> %.4f)\n", first, last);
        goto fail;
    }
    rc = 0;
fail:
    mr_optim_free(opt);
    mr_plan_free(plan);
    free(params);
    free(keep);
    mr_params_free(ps);
    mr_graph_free(g);
    return rc;
}
