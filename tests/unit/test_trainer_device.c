/* The trainer's device path (train/train_device.c) run on the CPU (mr_train_cfg.device_path):
 * parameters, gradients, optimizer state and batches in separate buffers, copied through the
 * backend; accumulation, unscaling, clipping and the finite check through core/vec.h; the
 * optimizer through the op table. Its arithmetic is the host path's, so every step's loss, the
 * final parameters and optimizer state, and the evaluation must equal the host path's bit for
 * bit: for f32 AdamW, mixed_float16 with dynamic loss scaling and an injected inf, accumulation
 * with clipping, SGD with momentum, 2 local replicas, and a stop-and-resume through a checkpoint.
 * On a GPU the same code runs with the CUDA backend (tests/gpu/test_gpu_train.c). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "train/train.h"

#define MAX_STEPS 64

/* What a run leaves: every step's loss, and the final state. */
typedef struct record {
    double loss[MAX_STEPS + 1];
    int skipped[MAX_STEPS + 1];
    float *params, *slots[2];
    int64_t n, optim_steps;
    int nslots;
    int64_t stop_at; /* request a stop (SIGTERM's path) after this step; 0: never */
} record;

static void on_step(void *ctx, const mr_train_state *ts) {
    record *r = ctx;
    assert_true(ts->step <= MAX_STEPS);
    r->loss[ts->step] = ts->loss;
    r->skipped[ts->step] = ts->skipped;
    r->n = mr_params_buffer_numel(ts->params);
    if (!r->params) {
        r->params = th_alloc((size_t)r->n * sizeof(float));
        for (int k = 0; k < 2; k++) r->slots[k] = th_alloc((size_t)r->n * sizeof(float));
    }
    memcpy(r->params, mr_params_buffer(ts->params), (size_t)r->n * sizeof(float));
    r->nslots = mr_optim_num_slots(ts->optim);
    for (int k = 0; k < r->nslots; k++)
        memcpy(r->slots[k], mr_optim_slot(ts->optim, k), (size_t)r->n * sizeof(float));
    r->optim_steps = mr_optim_steps(ts->optim);
    if (ts->step == r->stop_at) mr_train_request_stop(SIGTERM);
}

/* The device path reading back at log steps only (no on_step): the state at the last one. */
static void on_log(void *ctx, const mr_train_state *ts, int done) {
    if (!done) return;
    record *r = ctx;
    const int64_t stop_at = r->stop_at;
    on_step(ctx, ts); /* the same copies; the per-step fields are not compared */
    r->stop_at = stop_at;
}

static mr_train_cfg small_mlp(int64_t steps) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 48, steps, 32);
    c.log_every = 0;
    c.eval_every = 0;
    return c;
}

static void run(mr_train_cfg c, int device_path, record *r, mr_train_result *res) {
    int64_t stop_at = r->stop_at;
    memset(r, 0, sizeof *r);
    r->stop_at = stop_at;
    c.device_path = device_path;
    c.on_step = on_step;
    c.on_step_ctx = r;
    MR_ASSERT_OK(mr_train(&c, res));
}

/* The host path and the device path on the CPU: the same bits everywhere. */
static void same(const char *what, mr_train_cfg c) {
    record h = {.stop_at = 0}, d = {.stop_at = 0};
    mr_train_result rh, rd;
    run(c, 0, &h, &rh);
    run(c, 1, &d, &rd);
    for (int64_t s = 1; s <= c.steps; s++) {
        if (memcmp(&h.loss[s], &d.loss[s], sizeof(double)) != 0)
            fail_msg("%s: step %lld: host loss %.9g, device path %.9g", what, (long long)s, h.loss[s], d.loss[s]);
        assert_int_equal(h.skipped[s], d.skipped[s]);
    }
    assert_int_equal(h.n, d.n);
    assert_memory_equal(h.params, d.params, (size_t)h.n * sizeof(float));
    assert_int_equal(h.nslots, d.nslots);
    for (int k = 0; k < h.nslots; k++) assert_memory_equal(h.slots[k], d.slots[k], (size_t)h.n * sizeof(float));
    assert_int_equal(h.optim_steps, d.optim_steps);
    assert_true(memcmp(&rh.eval_loss, &rd.eval_loss, sizeof(double)) == 0 || (isnan(rh.eval_loss) && isnan(rd.eval_loss)));
    assert_true(memcmp(&rh.eval_accuracy, &rd.eval_accuracy, sizeof(double)) == 0 ||
                (isnan(rh.eval_accuracy) && isnan(rd.eval_accuracy)));
    assert_true(memcmp(&rh.eval_perplexity, &rd.eval_perplexity, sizeof(double)) == 0 ||
                (isnan(rh.eval_perplexity) && isnan(rd.eval_perplexity)));
    assert_string_equal(rh.sample, rd.sample); /* generation read the logits back from the device */
    assert_int_equal(rh.skipped_steps, rd.skipped_steps);
    assert_true(rh.loss_scale == rd.loss_scale);
    /* the device path without on_step: its decisions read back only at the end (log_every 0:
     * the last step is the only log step, every skip and sum stays on the device until then) */
    record l = {.stop_at = 0};
    mr_train_result rl;
    mr_train_cfg cl = c;
    cl.device_path = 1;
    cl.on_log = on_log;
    cl.on_log_ctx = &l;
    MR_ASSERT_OK(mr_train(&cl, &rl));
    assert_memory_equal(h.params, l.params, (size_t)h.n * sizeof(float));
    for (int k = 0; k < h.nslots; k++) assert_memory_equal(h.slots[k], l.slots[k], (size_t)h.n * sizeof(float));
    assert_int_equal(h.optim_steps, l.optim_steps);
    assert_true(memcmp(&rh.last_loss, &rl.last_loss, sizeof(double)) == 0);
    assert_int_equal(rh.skipped_steps, rl.skipped_steps);
    assert_true(rh.loss_scale == rl.loss_scale);
    fprintf(stderr, "%s: %lld steps bit-identical (last loss %.6f, eval accuracy %.4f, %lld skipped)\n", what,
            (long long)c.steps, d.loss[c.steps], rd.eval_accuracy, (long long)rd.skipped_steps);
    th_free_all();
}

static void test_f32_adamw(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp(30);
    c.eval_every = 30; /* the evaluation runs on the device buffers too */
    same("f32 adamw + eval", c);
}

static void test_f16_scaler_inject(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp(24);
    c.compute = MR_F16;
    c.inject_nonfinite_at = 7;
    same("mixed_float16, inf injected at step 7", c);
}

static void test_accumulate_clip(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp(20);
    c.accumulate = 2;
    c.grad_clip = 0.05; /* small enough to clip most steps */
    c.compute = MR_BF16;
    same("bf16, accumulate 2, clip 0.05", c);
}

static void test_sgd_adam(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp(16);
    c.optim = mr_optim_cfg_default(MR_OPTIM_SGD);
    c.optim.lr = 0.05;
    c.optim.momentum = 0.9;
    c.optim.weight_decay = 1e-4;
    same("sgd momentum", c);
    c.optim = mr_optim_cfg_default(MR_OPTIM_ADAM);
    c.optim.weight_decay = 1e-3; /* Adam's L2 term goes through mr_vec_axpby on the device path */
    same("adam with L2", c);
}

static void test_two_replicas(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp(16);
    c.replicas = 2;
    same("2 local replicas", c);
}

/* The CNN (conv, pooling) and a character GPT with dropout (masks drawn per step on the device
 * buffers) and text generation, which reads the logits back from the device. */
static void test_cnn_gpt(void **state) {
    (void)state;
    if (th_have_fashion_mnist()) {
        mr_train_cfg c = small_mlp(8);
        c.model = mr_model_cfg_default(MR_MODEL_CNN);
        c.model.ch1 = 4;
        c.model.ch2 = 8;
        c.model.hidden = 16;
        c.batch = 16;
        same("cnn", c);
    }
    mr_train_cfg g = small_mlp(12);
    th_tiny_gpt(&g, 16, 32, 0.1);
    g.sample_chars = 24;
    g.eval_every = 12;
    same("gpt with dropout, eval and a sample", g);
}

/* Stopped at step 9 (a checkpoint pulled from the device), resumed to 20 on the device path:
 * equal to a straight host run. */
static void test_resume(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp(20);
    c.compute = MR_F16;
    record h = {.stop_at = 0}, d1 = {.stop_at = 9}, d2 = {.stop_at = 0};
    mr_train_result rh, r1, r2;
    run(c, 0, &h, &rh);
    c.ckpt_dir = th_tmp_path("resume");
    c.resume = "auto";
    run(c, 1, &d1, &r1);
    assert_int_equal(r1.stopped_by, SIGTERM);
    assert_int_equal(r1.steps, 9);
    run(c, 1, &d2, &r2);
    assert_int_equal(r2.resumed_from, 9);
    for (int64_t s = 10; s <= c.steps; s++)
        if (memcmp(&h.loss[s], &d2.loss[s], sizeof(double)) != 0)
            fail_msg("resume: step %lld: straight host loss %.9g, resumed device path %.9g", (long long)s, h.loss[s],
                     d2.loss[s]);
    assert_memory_equal(h.params, d2.params, (size_t)h.n * sizeof(float));
    for (int k2 = 0; k2 < h.nslots; k2++) assert_memory_equal(h.slots[k2], d2.slots[k2], (size_t)h.n * sizeof(float));
    th_free_all();
}

/* A CUDA replica on a machine without a GPU (or a CPU-only build) is refused with a HINT. */
static void test_no_gpu_refused(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    if (mr_cuda_device_count() > 0) skip();
    mr_train_cfg c = small_mlp(2);
    c.device_kind = MR_DEVICE_CUDA;
    mr_train_result r;
    assert_int_not_equal(mr_train(&c, &r), MR_OK);
    assert_non_null(strstr(mr_last_error(), "HINT"));
    assert_non_null(strstr(mr_last_error(), "distribute.devices"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_adamw),     cmocka_unit_test(test_f16_scaler_inject),
        cmocka_unit_test(test_accumulate_clip), cmocka_unit_test(test_sgd_adam),
        cmocka_unit_test(test_two_replicas),  cmocka_unit_test(test_cnn_gpt),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_no_gpu_refused),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
