/* Synchronised batch norm (sync: true; distribute/sync_hook.h): N replicas, each with 1/N of the
 * batch, whose batch-norm statistics are summed over the replicas inside the forward and the
 * backward, equal one replica with the whole batch up to rounding: the mean of their losses is its
 * loss, the mean of their gradients its gradient, and every replica's running statistics are its
 * running statistics. Without sync each replica normalises its own micro-batch (torch's BatchNorm
 * under DDP), so the running statistics differ: the test shows that too. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "autodiff/steps.h"
#include "distribute/sync_hook.h"
#include "launch/config.h"
#include "models/models.h"

#define B 8
#define N_REP 2
#define SAMPLE (3 * 5 * 5)

static const char *MODEL =
    "model:\n  type: graph\n  input: [3, 5, 5]\n  layers:\n"
    "    - conv2d: {out: 4, kernel: 3, pad: 1}\n"
    "    - batchnorm2d: {sync: %s}\n"
    "    - relu\n"
    "    - global_avgpool\n"
    "    - flatten\n"
    "    - linear: {out: 6}\n"
    "    - batchnorm1d: {sync: %s, momentum: 0.3}\n"
    "    - linear: {out: 3}\n"
    "data: {train: {source: idx, images: /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz, labels: "
    "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz}}\n";

typedef struct replica {
    const mr_model_cfg *cfg;
    mr_comm *comm;        /* NULL: no sync hook */
    const float *x;       /* this replica's samples */
    const int32_t *y;
    int64_t batch;
    mr_params *ps;        /* out: the registry after one training step */
    float loss;
    mr_status st;
    char err[512];
} replica;

static void *run_replica(void *arg) {
    replica *r = arg;
    mr_steps *s = NULL;
    mr_step *step = NULL;
    mr_sync_hook hook;
    r->st = mr_params_new(&r->ps);
    if (!r->st) r->st = mr_steps_new(mr_model_step_build, r->cfg, r->ps, MR_DEVICE_CPU, &s);
    if (!r->st && r->comm) r->st = mr_sync_hook_init(&hook, r->comm);
    if (!r->st && r->comm) r->st = mr_steps_set_sync(s, &hook.hook);
    if (!r->st) r->st = mr_steps_get(s, r->batch, 1, &step);
    if (!r->st) r->st = mr_params_init(r->ps, 11);
    if (!r->st) r->st = mr_plan_bind(step->plan, step->io.x, (void *)r->x);
    if (!r->st) r->st = mr_plan_bind(step->plan, step->io.y, (void *)r->y);
    if (!r->st) r->st = mr_plan_run(step->plan);
    if (!r->st) r->loss = *(const float *)mr_plan_data(step->plan, step->io.loss);
    if (r->st) snprintf(r->err, sizeof r->err, "%s", mr_last_error());
    mr_steps_free(s);
    return NULL;
}

/* Runs one training step on N_REP replicas of B / N_REP samples each (sync over a local group when
 * `sync`), and on one replica with the whole batch; fills the replicas and the single one. */
static void run_both(const char *sync, replica *rep, replica *one, mr_experiment *e) {
    char text[2048];
    snprintf(text, sizeof text, MODEL, sync, sync);
    if (mr_experiment_parse(text, "sync.yaml", e) != MR_OK) fail_msg("%s", mr_last_error());
    static float x[B * SAMPLE];
    static int32_t y[B];
    th_fill_uniform_f32(x, B * SAMPLE, -1.0f, 2.0f, 5);
    th_fill_int32(y, B, 0, 2, 6);
    mr_comm *comms[N_REP];
    MR_ASSERT_OK(mr_comm_local_new(N_REP, 30.0, comms));
    pthread_t th[N_REP];
    for (int r = 0; r < N_REP; r++) {
        rep[r] = (replica){&e->model, !strcmp(sync, "true") ? comms[r] : NULL, x + r * (B / N_REP) * SAMPLE,
                           y + r * (B / N_REP), B / N_REP, NULL, 0, MR_OK, ""};
        assert_int_equal(pthread_create(&th[r], NULL, run_replica, &rep[r]), 0);
    }
    for (int r = 0; r < N_REP; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < N_REP; r++) {
        if (rep[r].st) fail_msg("replica %d: %s", r, rep[r].err);
        mr_comm_free(comms[r]);
    }
    *one = (replica){&e->model, NULL, x, y, B, NULL, 0, MR_OK, ""};
    run_replica(one);
    if (one->st) fail_msg("one replica: %s", one->err);
}

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-3 ? fabs(b) : 1e-3); }

static void test_sync_equals_one_replica(void **state) {
    (void)state;
    replica rep[N_REP], one;
    mr_experiment e;
    run_both("true", rep, &one, &e);
    double mean_loss = 0, worst = 0;
    for (int r = 0; r < N_REP; r++) mean_loss += rep[r].loss / N_REP;
    print_message("loss: replicas %.9g, one %.9g\n", mean_loss, (double)one.loss);
    assert_true(rel(mean_loss, one.loss) < 1e-5);
    for (int32_t i = 0; i < mr_params_count(one.ps); i++) {
        const float *g1 = mr_params_grad(one.ps, i);
        for (int64_t j = 0; j < mr_params_numel(one.ps, i); j++) {
            double avg = 0;
            for (int r = 0; r < N_REP; r++) avg += mr_params_grad(rep[r].ps, i)[j] / N_REP;
            /* relative, but absolute near zero: a bias before a batch norm has a zero gradient in
             * exact arithmetic and rounding noise here */
            double d = fabs(avg - g1[j]) / (fabs(g1[j]) + 0.1);
            if (d > worst) worst = d;
            if (d > 1e-5) fail_msg("%s[%lld]: replicas' mean gradient %g, one replica %g", mr_params_name(one.ps, i),
                                   (long long)j, avg, (double)g1[j]);
        }
    }
    print_message("gradients: max relative difference %.2e\n", worst);
    const mr_params *b1 = mr_params_bufs(one.ps);
    worst = 0;
    for (int32_t i = 0; i < mr_params_count(b1); i++)
        for (int r = 0; r < N_REP; r++)
            for (int64_t j = 0; j < mr_params_numel(b1, i); j++) {
                double a = mr_params_data(mr_params_bufs(rep[r].ps), i)[j], o = mr_params_data(b1, i)[j];
                double d = rel(a, o);
                if (d > worst) worst = d;
                if (d > 1e-5) fail_msg("%s[%lld] of replica %d: %g, one replica %g", mr_params_name(b1, i), (long long)j, r, a, o);
            }
    print_message("running statistics: max relative difference %.2e\n", worst);
    assert_int_equal(mr_params_count(b1), 6);
    for (int r = 0; r < N_REP; r++) mr_params_free(rep[r].ps);
    mr_params_free(one.ps);
    mr_experiment_deinit(&e);
}

/* Without sync: each replica's running mean is its own micro-batch's, not the global one. */
static void test_unsynced_differs(void **state) {
    (void)state;
    replica rep[N_REP], one;
    mr_experiment e;
    run_both("false", rep, &one, &e);
    const mr_params *b1 = mr_params_bufs(one.ps);
    int32_t k = mr_params_find(b1, "1.running_mean");
    assert_true(k >= 0);
    double d = 0;
    for (int64_t j = 0; j < mr_params_numel(b1, k); j++)
        d = fmax(d, rel(mr_params_data(mr_params_bufs(rep[0].ps), k)[j], mr_params_data(b1, k)[j]));
    print_message("unsynced running_mean differs from the global batch's by %.2e (relative)\n", d);
    assert_true(d > 1e-3);
    for (int r = 0; r < N_REP; r++) mr_params_free(rep[r].ps);
    mr_params_free(one.ps);
    mr_experiment_deinit(&e);
}

/* The hook is part of what a step compiles: setting it afterwards would leave the cached steps
 * unsynchronised, so it is refused. */
static void test_sync_after_compile_refused(void **state) {
    (void)state;
    mr_experiment e;
    char text[2048];
    snprintf(text, sizeof text, MODEL, "true", "true");
    if (mr_experiment_parse(text, "sync.yaml", &e) != MR_OK) fail_msg("%s", mr_last_error());
    mr_params *ps = NULL;
    mr_steps *s = NULL;
    mr_step *step = NULL;
    mr_comm *comm[1];
    mr_sync_hook hook;
    MR_ASSERT_OK(mr_comm_local_new(1, 10.0, comm));
    MR_ASSERT_OK(mr_sync_hook_init(&hook, comm[0]));
    MR_ASSERT_OK(mr_params_new(&ps));
    MR_ASSERT_OK(mr_steps_new(mr_model_step_build, &e.model, ps, MR_DEVICE_CPU, &s));
    MR_ASSERT_OK(mr_steps_get(s, 2, 1, &step));
    assert_int_equal(mr_steps_set_sync(s, &hook.hook), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "before the first compilation"));
    mr_steps_free(s);
    mr_params_free(ps);
    mr_comm_free(comm[0]);
    mr_experiment_deinit(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sync_equals_one_replica), cmocka_unit_test(test_unsynced_differs),
                                       cmocka_unit_test(test_sync_after_compile_refused)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
