/* models/layers: layer graphs from YAML. Parameter names follow nn.Sequential (unnamed, named,
 * residual body/shortcut, repeat of one block and of several layers); the to_yaml round trip gives
 * the same spec; the shorthands keep their names; the summary lists every layer with its shape
 * and parameter count; batch norm's buffers are registered under torch's names, updated by a
 * training step as torch does (checked against the formula) and used by an evaluation step.
 * The errors with positions are in tests/configs/bad/layers_*.yaml (test_config). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "autodiff/steps.h"
#include "launch/config.h"
#include "models/models.h"

static const char *DATA =
    "data: {train: {source: idx, images: /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz, labels: "
    "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz}}\n";

/* Parses a model section (plus DATA) into e; fails the test on an error. */
static void parse_model(const char *model, mr_experiment *e) {
    char text[8192];
    snprintf(text, sizeof text, "%s%s", model, DATA);
    if (mr_experiment_parse(text, "t.yaml", e) != MR_OK) fail_msg("parse: %s", mr_last_error());
}

/* The registry a training build of e's model registers (batch 2). */
static mr_params *registry_of(const mr_model_cfg *c) {
    mr_params *ps = NULL;
    mr_steps *s = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    MR_ASSERT_OK(mr_steps_new(mr_model_step_build, c, ps, MR_DEVICE_CPU, &s));
    MR_ASSERT_OK(mr_steps_register(s, 2));
    mr_steps_free(s);
    return ps;
}

static void assert_names(const mr_params *ps, const char *const *want, int n) {
    if (mr_params_count(ps) != n) {
        for (int i = 0; i < mr_params_count(ps); i++) print_message("  have %s\n", mr_params_name(ps, i));
        fail_msg("%d parameters, expected %d", mr_params_count(ps), n);
    }
    for (int i = 0; i < n; i++)
        if (strcmp(mr_params_name(ps, i), want[i])) fail_msg("parameter %d is '%s', expected '%s'", i, mr_params_name(ps, i), want[i]);
}

static const char *RESNETISH =
    "model:\n"
    "  type: graph\n"
    "  input: [1, 8, 8]\n"
    "  layers:\n"
    "    - conv2d: {out: 4, kernel: 3, pad: 1, bias: false}\n"
    "    - batchnorm2d: {}\n"
    "    - relu\n"
    "    - residual:\n"
    "        body: [{conv2d: {out: 6, kernel: 3, stride: 2, pad: 1}}, batchnorm2d]\n"
    "        shortcut: [{conv2d: {out: 6, kernel: 1, stride: 2, bias: false}}]\n"
    "    - repeat: {times: 2, body: [{conv2d: {out: 6, kernel: 3, pad: 1}}, relu]}\n"
    "      name: blocks\n"
    "    - global_avgpool\n"
    "    - flatten\n"
    "    - linear: {out: 3}\n"
    "      name: head\n";

static void test_sequential_names(void **state) {
    (void)state;
    mr_experiment e;
    parse_model(RESNETISH, &e);
    assert_int_equal(e.model.type, MR_MODEL_GRAPH);
    mr_params *ps = registry_of(&e.model);
    static const char *const want[] = {"0.weight", "1.weight", "1.bias", "3.body.0.weight", "3.body.0.bias",
                                       "3.body.1.weight", "3.body.1.bias", "3.shortcut.0.weight",
                                       "blocks.0.0.weight", "blocks.0.0.bias", "blocks.1.0.weight", "blocks.1.0.bias",
                                       "head.weight", "head.bias"};
    assert_names(ps, want, (int)(sizeof want / sizeof *want));
    const mr_params *b = mr_params_bufs(ps);
    static const char *const bufs[] = {"1.running_mean", "1.running_var", "1.num_batches_tracked",
                                       "3.body.1.running_mean", "3.body.1.running_var", "3.body.1.num_batches_tracked"};
    assert_names(b, bufs, 6);
    mr_shape s = mr_params_shape(b, 2);
    assert_int_equal(s.ndim, 0); /* num_batches_tracked is a scalar, as in torch */
    s = mr_params_shape(ps, mr_params_find(ps, "3.body.0.weight"));
    assert_int_equal(s.dim[0], 6), assert_int_equal(s.dim[1], 4), assert_int_equal(s.dim[2], 3);
    assert_int_equal(mr_params_total(ps), 4 * 9 + 8 + 6 * 4 * 9 + 6 + 12 + 6 * 4 + 2 * (6 * 6 * 9 + 6) + 3 * 6 + 3);
    mr_params_free(ps);
    mr_experiment_deinit(&e);
}

/* A repeat of one block is a ModuleList ("h.0.ln_1"); the gpt shorthand keeps nanoGPT's names. */
static void test_gpt_names(void **state) {
    (void)state;
    mr_model_cfg c = mr_model_cfg_default(MR_MODEL_GPT);
    c.layers = 2;
    c.context = 8;
    c.embd = 16;
    c.heads = 2;
    mr_params *ps = registry_of(&c);
    static const char *const want[] = {
        "wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
        "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "h.0.ln_2.weight", "h.0.ln_2.bias", "h.0.mlp.c_fc.weight",
        "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias", "h.1.ln_1.weight", "h.1.ln_1.bias",
        "h.1.attn.c_attn.weight", "h.1.attn.c_attn.bias", "h.1.attn.c_proj.weight", "h.1.attn.c_proj.bias",
        "h.1.ln_2.weight", "h.1.ln_2.bias", "h.1.mlp.c_fc.weight", "h.1.mlp.c_fc.bias", "h.1.mlp.c_proj.weight",
        "h.1.mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"};
    assert_names(ps, want, (int)(sizeof want / sizeof *want));
    assert_int_equal(mr_params_count(mr_params_bufs(ps)), 0);
    mr_params_free(ps);
    c = mr_model_cfg_default(MR_MODEL_CNN);
    ps = registry_of(&c);
    static const char *const cnn[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                      "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias"};
    assert_names(ps, cnn, 8);
    mr_params_free(ps);
}

/* to_yaml gives a config that parses back to the same layers. */
static void test_round_trip(void **state) {
    (void)state;
    mr_experiment e, e2;
    parse_model(RESNETISH, &e);
    char *y = NULL;
    MR_ASSERT_OK(mr_experiment_to_yaml(&e, &y));
    if (mr_experiment_parse(y, "again.yaml", &e2) != MR_OK) fail_msg("%s\nin:\n%s", mr_last_error(), y);
    const mr_layer_graph *a = &e.model.graph, *b = &e2.model.graph;
    assert_int_equal(a->n, b->n);
    assert_int_equal(a->n_top, b->n_top);
    assert_int_equal(a->n_input, b->n_input);
    for (int32_t i = 0; i < a->n; i++) {
        mr_layer la = a->l[i], lb = b->l[i];
        la.line = la.col = lb.line = lb.col = 0;
        if (memcmp(&la, &lb, sizeof la)) fail_msg("layer %d (%s) differs after the round trip:\n%s", i,
                                                  mr_layer_kind_name(la.kind), y);
    }
    char *y2 = NULL;
    MR_ASSERT_OK(mr_experiment_to_yaml(&e2, &y2));
    assert_string_equal(y, y2);
    free(y);
    free(y2);
    mr_experiment_deinit(&e);
    mr_experiment_deinit(&e2);
}

static void test_summary(void **state) {
    (void)state;
    mr_experiment e;
    parse_model(RESNETISH, &e);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    MR_ASSERT_OK(mr_model_summary(&e.model, 16, MR_F32, 2, f));
    fclose(f);
    print_message("%s", buf);
    /* every layer with its output shape and parameter count, and the totals */
    const char *want[] = {"0 ", "conv2d", "[4, 8, 8]", "36", "3.body.0", "[6, 4, 4]", "3.shortcut.0", "blocks.1.0",
                          "global_avgpool", "[6, 1, 1]", "head", "[3]", "parameters 983", "buffers 22",
                          "one training step of batch 16"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(buf, want[i])) fail_msg("summary lacks '%s'", want[i]);
    free(buf);
    mr_experiment_deinit(&e);
}

/* A training step updates running_mean/var (unbiased) and num_batches_tracked as torch does; an
 * evaluation step normalises with them and leaves them alone. */
static void test_batchnorm_buffers(void **state) {
    (void)state;
    mr_experiment e;
    parse_model("model:\n  type: graph\n  input: [2]\n  layers:\n    - batchnorm1d: {momentum: 0.25}\n"
                "    - linear: {out: 3}\n",
                &e);
    mr_params *ps = NULL;
    mr_steps *s = NULL;
    mr_step *tr = NULL, *ev = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    MR_ASSERT_OK(mr_steps_new(mr_model_step_build, &e.model, ps, MR_DEVICE_CPU, &s));
    MR_ASSERT_OK(mr_steps_get(s, 4, 1, &tr));
    MR_ASSERT_OK(mr_params_init(ps, 3));
    float x[8] = {1, 10, 2, 20, 3, 30, 6, 40}, *rm = mr_params_data(mr_params_bufs(ps), 0),
          *rv = mr_params_data(mr_params_bufs(ps), 1), *nbt = mr_params_data(mr_params_bufs(ps), 2);
    int32_t y[4] = {0, 1, 2, 0};
    assert_true(rm[0] == 0 && rv[0] == 1 && nbt[0] == 0);
    MR_ASSERT_OK(mr_plan_bind(tr->plan, tr->io.x, x));
    MR_ASSERT_OK(mr_plan_bind(tr->plan, tr->io.y, y));
    MR_ASSERT_OK(mr_plan_run(tr->plan));
    /* channel 0: mean 3, unbiased var ((4+1+0+9)/3); channel 1: mean 25, ((225+25+25+225)/3) */
    assert_float_equal(rm[0], 0.75 * 0 + 0.25 * 3.0, 1e-6);
    assert_float_equal(rm[1], 0.25 * 25.0, 1e-5);
    assert_float_equal(rv[0], 0.75 + 0.25 * (14.0 / 3.0), 1e-5);
    assert_float_equal(rv[1], 0.75 + 0.25 * (500.0 / 3.0), 1e-4);
    assert_float_equal(nbt[0], 1.0, 0);
    MR_ASSERT_OK(mr_plan_run(tr->plan));
    assert_float_equal(nbt[0], 2.0, 0);
    const float rm0 = rm[0], rv1 = rv[1];
    /* evaluation: y = (x - rm) / sqrt(rv + eps) * w + b before the linear; buffers unchanged */
    MR_ASSERT_OK(mr_steps_get(s, 4, 0, &ev));
    MR_ASSERT_OK(mr_plan_bind(ev->plan, ev->io.x, x));
    MR_ASSERT_OK(mr_plan_bind(ev->plan, ev->io.y, y));
    MR_ASSERT_OK(mr_plan_run(ev->plan));
    assert_float_equal(rm[0], rm0, 0);
    assert_float_equal(rv[1], rv1, 0);
    assert_float_equal(nbt[0], 2.0, 0);
    /* the logits of sample 0 by hand */
    const mr_params *p = ps;
    const float *W = mr_params_data(p, mr_params_find(p, "1.weight")), *B = mr_params_data(p, mr_params_find(p, "1.bias"));
    const float *g = mr_params_data(p, mr_params_find(p, "0.weight")), *be = mr_params_data(p, mr_params_find(p, "0.bias"));
    const float *logits = mr_plan_data(ev->plan, ev->io.out);
    for (int k = 0; k < 3; k++) {
        double h0 = (x[0] - rm[0]) / sqrt(rv[0] + 1e-5) * g[0] + be[0], h1 = (x[1] - rm[1]) / sqrt(rv[1] + 1e-5) * g[1] + be[1];
        assert_float_equal(logits[k], W[2 * k] * h0 + W[2 * k + 1] * h1 + B[k], 1e-5);
    }
    mr_steps_free(s);
    mr_params_free(ps);
    mr_experiment_deinit(&e);
}

/* The data must fit a graph's input; a classifier's logits are (B, classes). */
static void test_fit_data(void **state) {
    (void)state;
    mr_experiment e;
    parse_model(RESNETISH, &e);
    MR_ASSERT_OK(mr_model_fit_data(&e.model, mr_shape_2d(8, 8), 0)); /* an IDX image (H, W) */
    assert_int_equal(mr_model_fit_data(&e.model, mr_shape_2d(28, 28), 0), MR_ERR_INVALID);
    if (!strstr(mr_last_error(), "model.input: [1, 8, 8] does not fit")) fail_msg("%s", mr_last_error());
    assert_int_equal(mr_model_task(&e.model), MR_TASK_CLASSIFY);
    mr_shape s = mr_model_sample_shape(&e.model);
    assert_int_equal(s.ndim, 3);
    mr_experiment_deinit(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_names), cmocka_unit_test(test_gpt_names),  cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_summary),          cmocka_unit_test(test_batchnorm_buffers), cmocka_unit_test(test_fit_data),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
