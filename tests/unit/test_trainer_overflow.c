/* Which layer overflowed (train/train_step.c tr_step_check, README.md "Overflow reports"): an inf
 * injected into named parameters' gradients under mixed_float16 skips the step with a log line
 * naming the parameter first in backward order and how many there were, and the scale's change;
 * a forward that is already non-finite says so; at the loss scale's floor the run stops with
 * MR_ERR_NUMERIC naming the step and the parameter, with a HINT, and saves nothing from that
 * step; without loss scaling a non-finite loss names the first non-finite gradient, and a finite
 * loss with non-finite gradients stops the run before the update. On the host
 * path, the device path on the CPU (device_path), 2 ZeRO-1 replicas (the parameters are flagged
 * in different shards, so only the shards' sum names the right one) and a GPT. Every check reads
 * the real log (stderr captured) or the error, and fails when the line is missing. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "checkpoint/ckpt.h"
#include "train/train.h"

static mr_train_cfg small_mlp(int64_t steps) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 64, steps, 64);
    c.eval_images = c.eval_labels = NULL;
    c.quiet = 0;     /* the skip lines are what is checked */
    c.no_progress = 1;
    c.compute = MR_F16;
    c.loss_scaler = mr_loss_scaler_default();
    c.loss_scaler.scale = 1024; /* no genuine overflow at this scale in these runs */
    return c;
}


/* Fails unless the log has a line containing want. */
static void expect_line(const char *log, const char *want) {
    if (!strstr(log, want)) fprintf(stderr, "missing from the log: \"%s\"\n", want);
    assert_non_null(strstr(log, want));
}

/* One injection (names, at step 3 of 5): the skip line, once, and one skipped step. */
static void expect_skip(mr_train_cfg c, const char *names, const char *line) {
    c.inject_nonfinite_at = 3;
    c.inject_nonfinite_param = names;
    mr_train_result r;
    char *log = NULL;
    MR_ASSERT_OK(th_train_logged(&c, &r, &log));
    expect_line(log, line);
    assert_int_equal(r.skipped_steps, 1);
    const char *first = strstr(log, " skipped: ");
    assert_non_null(first);
    assert_null(strstr(first + 1, " skipped: ")); /* only the injected step */
    th_free_all();
}

static void test_names_the_parameter(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    for (int device_path = 0; device_path < 2; device_path++) {
        mr_train_cfg c = small_mlp(5);
        c.device_path = device_path;
        expect_skip(c, "fc1.weight",
                    "mirror warn: step 3 skipped: non-finite gradients in fc1.weight (the only one), loss scale "
                    "1024 -> 512\n");
        /* two: the one the backward finishes first, whatever order they are named in */
        expect_skip(c, "fc1.bias,fc2.weight",
                    "step 3 skipped: non-finite gradients in fc2.weight (first of 2 in backward order), loss scale "
                    "1024 -> 512\n");
        expect_skip(c, "fc2.weight,fc1.bias", "non-finite gradients in fc2.weight (first of 2 in backward order)");
        expect_skip(c, "fc1.weight,fc1.bias,fc2.bias",
                    "non-finite gradients in fc2.bias (first of 3 in backward order)");
    }
}

/* ZeRO-1 over 2 replicas: fc1.weight's middle lies in replica 0's shard, fc2.weight in replica 1's;
 * replica 0, which logs, finds only fc1.weight in its own shard. */
static void test_names_across_shards(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp(5);
    c.replicas = 2;
    c.shard_optimizer = 1;
    expect_skip(c, "fc1.weight,fc2.weight", "step 3 skipped: non-finite gradients in fc2.weight (first of 2 in "
                                            "backward order), loss scale 1024 -> 512\n");
    expect_skip(c, "fc1.weight", "step 3 skipped: non-finite gradients in fc1.weight (the only one)");
    expect_skip(c, "fc2.bias", "step 3 skipped: non-finite gradients in fc2.bias (the only one)");
}

static void test_names_in_a_gpt(void **state) {
    (void)state;
    mr_train_cfg c = mr_train_cfg_default();
    th_tiny_gpt(&c, 16, 32, 0.0);
    c.steps = 4;
    c.log_every = 0;
    c.no_progress = 1;
    c.compute = MR_F16;
    c.loss_scaler = mr_loss_scaler_default();
    c.loss_scaler.scale = 65536;
    expect_skip(c, "wte.weight,h.0.mlp.c_fc.weight,h.1.mlp.c_fc.weight,h.0.ln_1.bias",
                "step 3 skipped: non-finite gradients in h.1.mlp.c_fc.weight (first of 4 in backward order), loss "
                "scale 65536 -> 32768\n");
    /* one kernel finishes both (layernorm's backward): the registry's order between them */
    expect_skip(c, "h.1.ln_2.bias,h.1.ln_2.weight,h.0.ln_2.bias",
                "step 3 skipped: non-finite gradients in h.1.ln_2.weight (first of 3 in backward order)");
}

/* A NaN written into fc2.bias (the host path's registry is the step's own buffer) after step 2:
 * the next forward is NaN, and so is every gradient. */
static void poison(void *ctx, const mr_train_state *ts) {
    (void)ctx;
    if (ts->step != 2) return;
    const mr_params *ps = ts->params;
    const int32_t i = mr_params_find(ps, "fc2.bias");
    assert_true(i >= 0);
    mr_params_buffer(ps)[mr_params_offset(ps, i)] = NAN;
}

static void test_forward_already_nonfinite(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    /* with scaling: skipped, saying the loss was non-finite, until the floor */
    mr_train_cfg c = small_mlp(20);
    c.loss_scaler.scale = 8; /* 8 -> 4 -> 2 -> 1 (the floor): three skips, then the stop */
    c.on_step = poison;
    mr_train_result r;
    char *log = NULL;
    assert_int_equal(th_train_logged(&c, &r, &log), MR_ERR_NUMERIC);
    expect_line(log, "step 3 skipped: non-finite gradients in fc2.");
    expect_line(log, "(first of 4 in backward order); the loss was already non-finite (nan: the forward overflowed), "
                     "loss scale 8 -> 4\n");
    expect_line(log, "step 5 skipped: ");
    const char *e = mr_last_error();
    fprintf(stderr, "error: %s\n", e);
    assert_non_null(strstr(e, "step 6: non-finite gradients in fc2."));
    assert_non_null(strstr(e, "(first of 4 in backward order); the loss was already non-finite (nan: the forward "
                              "overflowed), with the loss scale already at its floor (precision.loss_scale.min 1)"));
    assert_non_null(strstr(e, "; HINT: use precision.policy: mixed_bfloat16 (float32's range, no loss scaling), lower "
                              "optimizer.lr (0.002), or set optimizer.grad_clip"));
    assert_null(strstr(e, "loss_scale.min (")); /* the floor is 1: lowering it is no advice */
    /* without scaling (float32): the divergence error names the first gradient too */
    c = small_mlp(20);
    c.compute = MR_F32;
    c.on_step = poison;
    assert_int_equal(th_train_logged(&c, &r, &log), MR_ERR_NUMERIC);
    e = mr_last_error();
    fprintf(stderr, "error: %s\n", e);
    assert_non_null(strstr(e, "non-finite loss (nan) at step 3: non-finite gradients in fc2."));
    assert_non_null(strstr(e, "(first of 4 in backward order); HINT: lower optimizer.lr or set optimizer.grad_clip"));
    assert_null(strstr(log, " skipped: "));
    th_free_all();
}

/* The state after each completed step, for the floor test. */
typedef struct seen {
    int64_t last_step;
    float *params;
    int64_t n;
} seen;

static void remember(void *ctx, const mr_train_state *ts) {
    seen *s = ctx;
    s->last_step = ts->step;
    s->n = mr_params_buffer_numel(ts->params);
    if (!s->params) s->params = th_alloc(sizeof(float) * (size_t)s->n);
    memcpy(s->params, mr_params_buffer(ts->params), sizeof(float) * (size_t)s->n);
}

/* A run with an inf injected at step 3 into `names`, checkpointing every step into a directory of
 * its own, that must fail with MR_ERR_NUMERIC: its error and log; s saw the last step applied. */
static const char *stopped_run(mr_train_cfg c, const char *tag, const char *names, seen *s, char **log, char *dir) {
    snprintf(dir, 160, "%s", th_tmp_path(tag));
    c.inject_nonfinite_at = 3;
    c.inject_nonfinite_param = names;
    c.ckpt_dir = c.run_dir = dir;
    c.ckpt_every = 1;
    c.ckpt_keep = 0;
    c.on_step = remember;
    c.on_step_ctx = s;
    mr_train_result r;
    assert_int_equal(th_train_logged(&c, &r, log), MR_ERR_NUMERIC);
    fprintf(stderr, "error: %s\n", mr_last_error());
    return mr_last_error();
}

/* The newest checkpoint in dir is step 2's (nothing of step 3 was saved). */
static void newest_is_step_2(const char *dir) {
    int64_t *steps = NULL;
    int n = 0;
    MR_ASSERT_OK(mr_ckpt_scan(dir, &steps, &n));
    assert_true(n >= 1);
    assert_int_equal(steps[n - 1], 2);
    free(steps);
}

static void test_floor_stops(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    for (int device_path = 0; device_path < 2; device_path++) {
        char dir[160];
        mr_train_cfg c = small_mlp(6);
        c.device_path = device_path;
        c.loss_scaler.min_scale = 1024; /* the scale starts at its floor */
        c.grad_clip = 5;
        seen s = {0};
        char *log = NULL;
        const char *e = stopped_run(c, device_path ? "floor-device" : "floor-host", "fc1.weight,fc2.weight", &s, &log, dir);
        assert_non_null(strstr(e, "step 3: non-finite gradients in fc2.weight (first of 2 in backward order), with "
                                  "the loss scale already at its floor (precision.loss_scale.min 1024), so training "
                                  "stops"));
        assert_non_null(strstr(e, "; HINT: use precision.policy: mixed_bfloat16"));
        assert_non_null(strstr(e, "lower optimizer.lr (0.002)"));
        assert_non_null(strstr(e, "lower optimizer.grad_clip (5)"));
        assert_non_null(strstr(e, "lower precision.loss_scale.min (1024)"));
        assert_null(strstr(log, " skipped: ")); /* stopped, not skipped */
        /* nothing of step 3 was applied or saved: the newest checkpoint is step 2's, with the
         * parameters step 2 left */
        assert_int_equal(s.last_step, 2);
        int64_t *steps = NULL;
        int n = 0;
        MR_ASSERT_OK(mr_ckpt_scan(dir, &steps, &n));
        assert_int_equal(n, 2);
        assert_int_equal(steps[n - 1], 2);
        free(steps);
        th_free_all();
    }
}

/* Without loss scaling a finite loss with non-finite gradients (the backward overflowed) stops the
 * run before the update: applied, it would turn every parameter NaN and a checkpoint of that step
 * would keep them. The host and the device path, with clipping (which reuses the check's sum). */
static void test_no_scaling_gradients_stop(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    for (int device_path = 0; device_path < 2; device_path++) {
        char dir[160];
        mr_train_cfg c = small_mlp(6);
        c.compute = MR_F32;
        c.device_path = device_path;
        c.grad_clip = 1;
        seen s = {0};
        char *log = NULL;
        const char *e = stopped_run(c, device_path ? "f32-device" : "f32-host", "fc1.bias", &s, &log, dir);
        assert_non_null(strstr(e, "step 3: non-finite gradients in fc1.bias (the only one), with a finite loss ("));
        assert_non_null(strstr(e, "the backward overflowed (this step was not applied); HINT: lower optimizer.lr"));
        assert_int_equal(s.last_step, 2); /* step 3 never completed: no update, no checkpoint */
        newest_is_step_2(dir);
        th_free_all();
    }
}

static void test_bad_name(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp(4);
    c.quiet = 1;
    c.inject_nonfinite_at = 2;
    c.inject_nonfinite_param = "fc1.weight,fc9.weight";
    mr_train_result r;
    assert_int_equal(mr_train(&c, &r), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "no parameter 'fc9.weight'"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_the_parameter), cmocka_unit_test(test_names_across_shards),
        cmocka_unit_test(test_names_in_a_gpt),      cmocka_unit_test(test_forward_already_nonfinite),
        cmocka_unit_test(test_floor_stops),         cmocka_unit_test(test_bad_name),
        cmocka_unit_test(test_no_scaling_gradients_stop)};
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
