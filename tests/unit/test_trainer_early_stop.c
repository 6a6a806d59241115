/* Early stopping (train/train.h early_stop_*; train/train_early.c): the rule on its own (min and
 * max, auto, min_delta, a NaN that never improves, the count reset by an improvement); a run
 * whose evaluation loss stalls stops at the evaluation that exhausts the patience, saves there and
 * says so; resuming that checkpoint trains nothing; a run stopped (as by SIGTERM) between
 * evaluations and resumed stops at the same step with the same best as one that never stopped
 * (the counter is in the checkpoint); a run that keeps improving trains to the end. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "train/train_impl.h"

/* The rule: values in, the stop decision and the counter out. */
static void test_rule(void **state) {
    (void)state;
    trainer t;
    memset(&t, 0, sizeof t);
    t.es_best = NAN;
    t.c.early_stop_patience = 2;
    t.c.early_stop_metric = 0; /* eval_loss, mode auto: lower is better */
    t.c.early_stop_min_delta = 0.01;
    mr_train_result r;
    memset(&r, 0, sizeof r);
    const double loss[] = {1.0, 0.995 /* not by more than 0.01 */, 0.98 /* improves: the count resets */, NAN,
                           0.975, 0.9};
    const int want_stop[] = {0, 0, 0, 0, 1, 0};
    const int64_t want_bad[] = {0, 1, 0, 1, 2, 0};
    for (int i = 0; i < 6; i++) {
        t.step = 10 * (i + 1);
        r.eval_loss = loss[i];
        if (i == 5) t.es_bad = 0, t.c.early_stop_patience = 1; /* an improvement after a stop decision: not a stop */
        const int stop = tr_early_stop_update(&t, &r);
        assert_int_equal(stop, want_stop[i]);
        assert_int_equal(t.es_bad, want_bad[i]);
    }
    assert_true(t.es_best == 0.9 && t.es_best_step == 60);
    /* accuracy, auto: higher is better; mode min turns it round */
    memset(&t, 0, sizeof t);
    t.es_best = NAN;
    t.c.early_stop_patience = 1;
    t.c.early_stop_metric = 1;
    r.eval_accuracy = 0.5;
    assert_int_equal(tr_early_stop_update(&t, &r), 0);
    r.eval_accuracy = 0.6;
    assert_int_equal(tr_early_stop_update(&t, &r), 0);
    r.eval_accuracy = 0.55;
    assert_int_equal(tr_early_stop_update(&t, &r), 1);
    t.c.early_stop_mode = 1; /* min */
    t.es_bad = 0, t.es_best = 0.6;
    r.eval_accuracy = 0.55;
    assert_int_equal(tr_early_stop_update(&t, &r), 0);
    assert_true(t.es_best == 0.55);
    /* off: never stops, never counts */
    t.c.early_stop_patience = 0;
    t.es_bad = 5;
    assert_int_equal(tr_early_stop_update(&t, &r), 0);
    assert_int_equal(tr_early_stopped(&t), 0);
}

/* An MLP whose learning rate is too small to move the evaluation loss by min_delta: evaluations
 * at 5 (the first is the best), 10 (one without improvement), 15 (two: stop). */
static mr_train_cfg stalling(const char *dir) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 32, 200, 32);
    c.optim.lr = 1e-9;
    c.eval_every = 5;
    c.log_every = 5;
    c.early_stop_patience = 2;
    c.early_stop_min_delta = 1e-3;
    c.run_dir = c.ckpt_dir = dir;
    c.ckpt_every = 100;
    c.resume = "auto";
    return c;
}

static int64_t g_stop_at;
static void stop_at(void *ctx, const mr_train_state *s) {
    (void)ctx;
    if (s->step == g_stop_at) mr_train_request_stop(SIGTERM);
}

static void test_stalled_run_stops(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    char dir[] = "/tmp/mirror_es_XXXXXX", dir2[] = "/tmp/mirror_es2_XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_non_null(mkdtemp(dir2));
    mr_train_cfg c = stalling(dir);
    mr_train_result r;
    MR_ASSERT_OK(mr_train(&c, &r));
    assert_int_equal(r.early_stopped, 15);
    assert_int_equal(r.steps, 15);
    assert_int_equal(r.stopped_by, 0);
    assert_int_equal(r.early_stop_best_step, 5);
    assert_true(isfinite(r.eval_loss) && isfinite(r.early_stop_best));
    char path[4200];
    snprintf(path, sizeof path, "%s/ckpt-00000015.h5", dir);
    assert_int_equal(access(path, F_OK), 0); /* saved where it stopped */
    /* resumed from its early stop: nothing trained, the evaluation reported */
    mr_train_result r2;
    MR_ASSERT_OK(mr_train(&c, &r2));
    assert_int_equal(r2.resumed_from, 15);
    assert_int_equal(r2.steps, 15);
    assert_int_equal(r2.early_stopped, 15);
    assert_true(r2.eval_loss == r.eval_loss);
    /* more patience: it trains on from there */
    c.early_stop_patience = 3;
    MR_ASSERT_OK(mr_train(&c, &r2));
    assert_int_equal(r2.resumed_from, 15);
    assert_int_equal(r2.early_stopped, 20);

    /* the patience runs out at the last step: the run ends there anyway, not "stopped early", and
     * its resume is a run at train.steps (raising train.steps trains on) */
    mr_train_cfg c3 = stalling(dir2);
    c3.steps = 15;
    MR_ASSERT_OK(mr_train(&c3, &r2));
    assert_int_equal(r2.steps, 15);
    assert_int_equal(r2.early_stopped, 0);
    MR_ASSERT_OK(mr_train(&c3, &r2));
    assert_int_equal(r2.resumed_from, 15);
    assert_int_equal(r2.early_stopped, 0);
    char cmd0[4200];
    snprintf(cmd0, sizeof cmd0, "rm -rf '%s'/*", dir2);
    assert_int_equal(system(cmd0), 0);

    /* stopped at step 12 (after one evaluation without improvement) and resumed: the same stop */
    mr_train_cfg c2 = stalling(dir2);
    c2.on_step = stop_at;
    g_stop_at = 12;
    MR_ASSERT_OK(mr_train(&c2, &r2));
    assert_int_equal(r2.stopped_by, SIGTERM);
    assert_int_equal(r2.steps, 12);
    assert_int_equal(r2.early_stopped, 0);
    g_stop_at = 0;
    MR_ASSERT_OK(mr_train(&c2, &r2));
    assert_int_equal(r2.resumed_from, 12);
    assert_int_equal(r2.early_stopped, 15); /* the count carried over: 2 at step 15, as before */
    assert_int_equal(r2.early_stop_best_step, 5);
    assert_true(r2.early_stop_best == r.early_stop_best);
    assert_true(r2.eval_loss == r.eval_loss);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, dir2);
    assert_int_equal(system(cmd), 0);
}

static void test_improving_run_trains_on(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c;
    th_fashion_mlp(&c, 32, 30, 32);
    c.eval_every = 10;
    c.early_stop_patience = 1;
    c.early_stop_metric = 1; /* eval_accuracy, upwards */
    mr_train_result r;
    MR_ASSERT_OK(mr_train(&c, &r));
    assert_int_equal(r.steps, 30);
    assert_int_equal(r.early_stopped, 0);
    assert_int_equal(r.early_stop_best_step, 30);
    assert_true(r.early_stop_best == r.eval_accuracy);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_stalled_run_stops),
        cmocka_unit_test(test_improving_run_trains_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
