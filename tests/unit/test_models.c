/* models/: the three built-in models build with PyTorch's parameter names and shapes, a forward
 * pass at initialisation gives a loss near log(classes), graphs for a second batch size reuse the
 * registry, and bad configs fail with a message naming the field. (Parity with PyTorch's numbers
 * is tests/unit/test_models_parity.c.) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "models/models.h"

typedef struct {
    const char *name;
    int64_t numel;
} expect_param;

/* Builds cfg at `batch` into a fresh graph over registry ps; returns the graph. */
static mr_graph *build(mr_params *ps, const mr_model_cfg *cfg, int64_t batch, mr_model_io *io) {
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    nn.g = g;
    nn.ps = ps;
    nn.dtype = MR_F32;
    MR_ASSERT_OK(mr_model_build(&nn, cfg, batch, io));
    return g;
}

/* Forward at init: loss close to log(classes) (the logits are small). */
static double forward_loss(mr_graph *g, mr_params *ps, const mr_model_io *io, const mr_model_cfg *cfg, int64_t batch) {
    mr_plan *p = NULL;
    mr_val keep[2] = {io->loss, io->logits};
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, keep, 2, &p));
    for (int32_t i = 0; i < mr_graph_num_params(g); i++) {
        mr_val v = mr_graph_param_at(g, i);
        int32_t k = mr_params_find(ps, mr_graph_name(g, v));
        assert_true(k >= 0);
        MR_ASSERT_OK(mr_plan_bind(p, v, mr_params_data(ps, k)));
    }
    mr_shape sx = mr_graph_shape(g, io->x), sy = mr_graph_shape(g, io->y);
    int64_t nx = mr_shape_numel(&sx), ny = mr_shape_numel(&sy);
    int64_t classes = cfg->type == MR_MODEL_GPT ? cfg->vocab : (cfg->type == MR_MODEL_CNN ? cfg->classes : cfg->sizes[cfg->n_sizes - 1]);
    void *x = th_alloc((size_t)nx * 4);
    int32_t *y = th_alloc((size_t)ny * 4);
    if (cfg->type == MR_MODEL_GPT) th_fill_int32(x, nx, 0, (int32_t)cfg->vocab, 5);
    else th_fill_uniform_f32(x, nx, 0, 1, 5);
    th_fill_int32(y, ny, 0, (int32_t)classes, 6);
    MR_ASSERT_OK(mr_plan_bind(p, io->x, x));
    MR_ASSERT_OK(mr_plan_bind(p, io->y, y));
    MR_ASSERT_OK(mr_plan_run(p));
    double loss = *(const float *)mr_plan_data(p, io->loss);
    fprintf(stderr, "model %d batch %lld: loss %.4f (log classes %.4f), %d kernels, arena %.1f MiB (unshared %.1f)\n",
            (int)cfg->type, (long long)batch, loss, log((double)classes), mr_plan_num_kernels(p),
            mr_plan_arena_bytes(p) / 1048576.0, mr_plan_unshared_bytes(p) / 1048576.0);
    assert_true(isfinite(loss));
    assert_true(fabs(loss - log((double)classes)) < 0.5);
    assert_true(mr_plan_arena_bytes(p) <= mr_plan_unshared_bytes(p));
    mr_plan_free(p);
    return loss;
}

static void check_params(const mr_params *ps, const expect_param *e, int n) {
    assert_int_equal(mr_params_count(ps), n);
    for (int i = 0; i < n; i++) {
        int32_t k = mr_params_find(ps, e[i].name);
        if (k < 0) fail_msg("parameter %s is missing", e[i].name);
        assert_int_equal(mr_params_numel(ps, k), e[i].numel);
        assert_int_equal(mr_params_offset(ps, k) % 16, 0); /* 64-byte aligned */
    }
}

static void test_mlp(void **state) {
    (void)state;
    mr_model_cfg cfg = mr_model_cfg_default(MR_MODEL_MLP);
    mr_params *ps = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    mr_model_io io;
    mr_graph *g = build(ps, &cfg, 32, &io);
    const expect_param e[] = {{"fc1.weight", 1024 * 784}, {"fc1.bias", 1024}, {"fc2.weight", 1024 * 1024},
                              {"fc2.bias", 1024},         {"fc3.weight", 10 * 1024}, {"fc3.bias", 10}};
    check_params(ps, e, 6);
    assert_int_equal(mr_params_total(ps), 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 10240 + 10);
    MR_ASSERT_OK(mr_params_alloc(ps));
    MR_ASSERT_OK(mr_params_init(ps, 1));
    forward_loss(g, ps, &io, &cfg, 32);
    mr_graph_free(g);
    /* another batch size: a new graph over the same registry */
    g = build(ps, &cfg, 7, &io);
    assert_int_equal(mr_params_count(ps), 6);
    forward_loss(g, ps, &io, &cfg, 7);
    mr_graph_free(g);
    mr_params_free(ps);
    th_free_all();
}

static void test_cnn(void **state) {
    (void)state;
    mr_model_cfg cfg = mr_model_cfg_default(MR_MODEL_CNN);
    mr_params *ps = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    mr_model_io io;
    mr_graph *g = build(ps, &cfg, 8, &io);
    const expect_param e[] = {{"conv1.weight", 32 * 9}, {"conv1.bias", 32}, {"conv2.weight", 64 * 32 * 9},
                              {"conv2.bias", 64},       {"fc1.weight", 128 * 64 * 49}, {"fc1.bias", 128},
                              {"fc2.weight", 10 * 128}, {"fc2.bias", 10}};
    check_params(ps, e, 8);
    MR_ASSERT_OK(mr_params_alloc(ps));
    MR_ASSERT_OK(mr_params_init(ps, 2));
    forward_loss(g, ps, &io, &cfg, 8);
    mr_graph_free(g);
    mr_params_free(ps);
    th_free_all();
}

static void test_gpt(void **state) {
    (void)state;
    mr_model_cfg cfg = mr_model_cfg_default(MR_MODEL_GPT);
    cfg.context = 32;
    cfg.layers = 2;
    mr_params *ps = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    mr_model_io io;
    mr_graph *g = build(ps, &cfg, 3, &io);
    const int64_t C = 128;
    const expect_param e[] = {
        {"wte.weight", 65 * C},          {"wpe.weight", 32 * C},           {"h.0.ln_1.weight", C},
        {"h.0.ln_1.bias", C},            {"h.0.attn.c_attn.weight", 3 * C * C}, {"h.0.attn.c_attn.bias", 3 * C},
        {"h.0.attn.c_proj.weight", C * C}, {"h.0.attn.c_proj.bias", C},     {"h.0.ln_2.weight", C},
        {"h.0.ln_2.bias", C},            {"h.0.mlp.c_fc.weight", 4 * C * C}, {"h.0.mlp.c_fc.bias", 4 * C},
        {"h.0.mlp.c_proj.weight", 4 * C * C}, {"h.0.mlp.c_proj.bias", C},   {"h.1.ln_1.weight", C},
        {"h.1.ln_1.bias", C},            {"h.1.attn.c_attn.weight", 3 * C * C}, {"h.1.attn.c_attn.bias", 3 * C},
        {"h.1.attn.c_proj.weight", C * C}, {"h.1.attn.c_proj.bias", C},     {"h.1.ln_2.weight", C},
        {"h.1.ln_2.bias", C},            {"h.1.mlp.c_fc.weight", 4 * C * C}, {"h.1.mlp.c_fc.bias", 4 * C},
        {"h.1.mlp.c_proj.weight", 4 * C * C}, {"h.1.mlp.c_proj.bias", C},   {"ln_f.weight", C},
        {"ln_f.bias", C}};
    check_params(ps, e, (int)(sizeof e / sizeof *e)); /* the head is tied: no lm_head.weight */
    MR_ASSERT_OK(mr_params_alloc(ps));
    MR_ASSERT_OK(mr_params_init(ps, 3));
    forward_loss(g, ps, &io, &cfg, 3);
    mr_graph_free(g);
    mr_params_free(ps);
    th_free_all();
}

static void test_bad_configs(void **state) {
    (void)state;
    mr_params *ps = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    nn.g = g;
    nn.ps = ps;
    nn.dtype = MR_F32;
    mr_model_io io;
    mr_model_cfg c = mr_model_cfg_default(MR_MODEL_GPT);
    c.heads = 3;
    assert_int_equal(mr_model_build(&nn, &c, 2, &io), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "model.heads"));
    c = mr_model_cfg_default(MR_MODEL_MLP);
    c.sizes[1] = 0;
    assert_int_equal(mr_model_build(&nn, &c, 2, &io), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "model.sizes[1]"));
    assert_int_equal(mr_model_build(&nn, &c, 0, &io), MR_ERR_INVALID);
    /* a registry allocated for one shape refuses a clashing parameter */
    c = mr_model_cfg_default(MR_MODEL_MLP);
    MR_ASSERT_OK(mr_model_build(&nn, &c, 2, &io));
    MR_ASSERT_OK(mr_params_alloc(ps));
    mr_graph_free(g);
    MR_ASSERT_OK(mr_graph_new(&g));
    nn.g = g;
    c.sizes[1] = 512;
    assert_int_equal(mr_model_build(&nn, &c, 2, &io), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "fc1.weight"));
    mr_graph_free(g);
    mr_params_free(ps);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_mlp), cmocka_unit_test(test_cnn), cmocka_unit_test(test_gpt),
                                       cmocka_unit_test(test_bad_configs)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
