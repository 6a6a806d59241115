/* mixed_float16 and the dynamic loss scaler in the trainer: an f16 run learns like f32; an
 * injected inf skips exactly one update, leaving the weights and the optimizer state bit for bit
 * untouched, halves the scale and counts one skip; the scale grows after growth_interval finite
 * steps; and scaling by a power of two is exact, so an f32 run with loss scaling matches one
 * without bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "train/train.h"


static mr_train_cfg small_mlp(void) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 64, 150, 64);
    return c;
}

static void test_mixed_f16_learns(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp();
    mr_train_result f, h;
    MR_ASSERT_OK(mr_train(&c, &f));
    c.compute = MR_F16;
    MR_ASSERT_OK(mr_train(&c, &h));
    fprintf(stderr, "mlp 150 steps: f32 loss %.4f acc %.4f; mixed_float16 loss %.4f acc %.4f, scale %g, %lld skipped\n",
            f.last_loss, f.eval_accuracy, h.last_loss, h.eval_accuracy, h.loss_scale, (long long)h.skipped_steps);
    assert_true(h.eval_accuracy > 0.70);
    assert_true(fabs(h.last_loss - f.last_loss) < 0.1);
    assert_true(h.loss_scale >= 1.0);
    assert_true(h.skipped_steps < 10); /* an occasional overflow at 2^15 is the scaler's job; many is a bug */
}

/* The state before and after each step, for the injection test. */
typedef struct snap {
    int64_t inject;
    float *params, *slots[2];
    int64_t n, optim_steps, checked;
    double scale;
    int64_t skipped;
} snap;

static void take(snap *s, const mr_train_state *ts) {
    s->n = mr_params_buffer_numel(ts->params);
    if (!s->params) {
        s->params = malloc((size_t)s->n * sizeof(float));
        for (int k = 0; k < 2; k++) s->slots[k] = malloc((size_t)s->n * sizeof(float));
    }
    memcpy(s->params, mr_params_buffer(ts->params), (size_t)s->n * sizeof(float));
    for (int k = 0; k < mr_optim_num_slots(ts->optim); k++)
        memcpy(s->slots[k], mr_optim_slot(ts->optim, k), (size_t)s->n * sizeof(float));
    s->optim_steps = mr_optim_steps(ts->optim);
    s->scale = ts->scaler->scale;
    s->skipped = ts->scaler->skipped;
}

static void on_step(void *ctx, const mr_train_state *ts) {
    snap *s = ctx;
    if (ts->step == s->inject) {
        /* the update was skipped: everything as it was after the step before */
        assert_true(ts->skipped);
        assert_memory_equal(mr_params_buffer(ts->params), s->params, (size_t)s->n * sizeof(float));
        for (int k = 0; k < mr_optim_num_slots(ts->optim); k++)
            assert_memory_equal(mr_optim_slot(ts->optim, k), s->slots[k], (size_t)s->n * sizeof(float));
        assert_int_equal(mr_optim_steps(ts->optim), s->optim_steps);
        assert_true(ts->scaler->scale == s->scale * 0.5);
        assert_int_equal(ts->scaler->skipped, s->skipped + 1);
        assert_int_equal(ts->scaler->good_steps, 0);
        s->checked++;
    } else if (ts->step == s->inject + 1) {
        /* and the next step updates again */
        assert_false(ts->skipped);
        assert_int_equal(mr_optim_steps(ts->optim), s->optim_steps + 1);
        assert_true(memcmp(mr_params_buffer(ts->params), s->params, (size_t)s->n * sizeof(float)) != 0);
        assert_int_equal(ts->scaler->skipped, 1);
        s->checked++;
    } else {
        assert_false(ts->skipped);
    }
    take(s, ts);
}

static void test_injected_inf_skips_one_update(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    for (int prec = 0; prec < 2; prec++) {
        mr_train_cfg c = small_mlp();
        c.compute = prec ? MR_F16 : MR_F32;
        c.loss_scaling = 1;
        c.steps = 12;
        c.eval_images = NULL;
        c.loss_scaler = mr_loss_scaler_default();
        c.loss_scaler.scale = 1024; /* no genuine overflow in 12 steps at this scale */
        snap s = {.inject = 7};
        c.inject_nonfinite_at = s.inject;
        c.on_step = on_step;
        c.on_step_ctx = &s;
        mr_train_result r;
        MR_ASSERT_OK(mr_train(&c, &r));
        assert_int_equal(s.checked, 2);
        assert_int_equal(r.skipped_steps, 1);
        assert_true(r.loss_scale == 512);
        free(s.params);
        free(s.slots[0]);
        free(s.slots[1]);
    }
}

/* Powers of two scale every float exactly: f32 with loss scaling equals f32 without, bit for bit;
 * and the scale doubles every growth_interval finite steps. */
static void test_scaling_is_exact_and_grows(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp();
    c.steps = 20;
    c.eval_images = NULL;
    mr_train_result plain, scaled;
    MR_ASSERT_OK(mr_train(&c, &plain));
    c.loss_scaling = 1;
    c.loss_scaler = mr_loss_scaler_default();
    c.loss_scaler.scale = 4;
    c.loss_scaler.growth_interval = 5;
    MR_ASSERT_OK(mr_train(&c, &scaled));
    fprintf(stderr, "loss after 20 steps: unscaled %.9g, scaled %.9g, final scale %g\n", plain.last_loss,
            scaled.last_loss, scaled.loss_scale);
    assert_true(plain.last_loss == scaled.last_loss);
    assert_true(scaled.loss_scale == 4.0 * 16.0); /* 20 finite steps / 5 = 4 doublings */
    assert_int_equal(scaled.skipped_steps, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_mixed_f16_learns),
                                       cmocka_unit_test(test_injected_inf_skips_one_update),
                                       cmocka_unit_test(test_scaling_is_exact_and_grows)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
