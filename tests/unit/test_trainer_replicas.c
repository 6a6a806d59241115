/* Replicas in one process (the `local` backend, one thread per replica): with the same global batch,
 * 2 and 4 replicas train the parameters one replica trains, within float rounding (the measured
 * maximum difference is printed), also with gradient accumulation; a 2-replica run is
 * deterministic (whatever the bucket size of the overlapped all-reduce); stopped and resumed it is bit-identical to one that never stopped; and its
 * checkpoint resumes on another number of replicas. (mpirun: tests/mpi/train.sh.) */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "checkpoint/ckpt.h"
#include "launch/config.h"
#include "train/train.h"

#define STEPS 50
#define FM "/usr/share/datasets/fashion-mnist/"

static mr_train_cfg small_mlp(const char *dir, int replicas) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 64, STEPS, 64);
    c.optim = mr_optim_cfg_default(MR_OPTIM_SGD);
    c.optim.lr = 0.05;
    c.optim.momentum = 0.9;
    c.log_every = 10;
    c.run_dir = c.ckpt_dir = dir;
    c.resume = "auto";
    c.replicas = replicas;
    c.comm_timeout_s = 60;
    return c;
}

/* The largest |a - b| over group ("params", "buffers") of two checkpoints. */
static double max_group_diff(const char *a, const char *b, const char *group) {
    mr_ckpt_reader *ra = NULL, *rb = NULL;
    MR_ASSERT_OK(mr_ckpt_open(a, 0, &ra));
    MR_ASSERT_OK(mr_ckpt_open(b, 0, &rb));
    char **names = NULL;
    int n = 0;
    double worst = 0;
    MR_ASSERT_OK(mr_ckpt_list(ra, group, &names, &n));
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        char p[512];
        mr_dtype dt;
        mr_shape sh;
        snprintf(p, sizeof p, "%s/%s", group, names[i]);
        MR_ASSERT_OK(mr_ckpt_info(ra, p, &dt, &sh));
        int64_t k = mr_shape_numel(&sh);
        float *x = malloc((size_t)k * sizeof *x), *y = malloc((size_t)k * sizeof *y);
        MR_ASSERT_OK(mr_ckpt_read(ra, p, MR_F32, &sh, x));
        MR_ASSERT_OK(mr_ckpt_read(rb, p, MR_F32, &sh, y));
        for (int64_t j = 0; j < k; j++) {
            double d = fabs((double)x[j] - (double)y[j]);
            if (!(d <= worst)) worst = d;
        }
        free(x);
        free(y);
    }
    mr_ckpt_names_free(names, n);
    mr_ckpt_close(ra);
    mr_ckpt_close(rb);
    return worst;
}

static double max_param_diff(const char *a, const char *b) { return max_group_diff(a, b, "params"); }

static const char *final_ckpt(const char *dir) {
    static char path[3][4096];
    static int k;
    k = (k + 1) % 3;
    mr_ckpt_path(dir, STEPS, path[k], sizeof path[k]);
    return path[k];
}

static const char *run_dir(const char *tag) {
    static char d[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(d[k], sizeof d[k], "%s/%s", th_tmp_dir(), tag);
    return d[k];
}

static void test_replicas_match_one(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    for (int accumulate = 1; accumulate <= 2; accumulate++) {
        char one[512];
        snprintf(one, sizeof one, "%s", run_dir(accumulate == 1 ? "one" : "one-acc"));
        mr_train_cfg c = small_mlp(one, 1);
        c.accumulate = accumulate;
        mr_train_result r1, rn;
        MR_ASSERT_OK(mr_train(&c, &r1));
        for (int n = 2; n <= 4; n += 2) {
            char tag[64];
            snprintf(tag, sizeof tag, "rep%d-acc%d", n, accumulate);
            const char *dn = run_dir(tag);
            mr_train_cfg cn = small_mlp(dn, n);
            cn.accumulate = accumulate;
            MR_ASSERT_OK(mr_train(&cn, &rn));
            double d = max_param_diff(final_ckpt(one), final_ckpt(dn));
            fprintf(stderr, "1 vs %d replicas (accumulate %d): max |param diff| %.3g after %d steps; loss %.6f vs %.6f, "
                            "eval accuracy %.4f vs %.4f\n",
                    n, accumulate, d, STEPS, r1.last_loss, rn.last_loss, r1.eval_accuracy, rn.eval_accuracy);
            assert_true(d < 1e-5);
            assert_true(fabs(r1.last_loss - rn.last_loss) < 1e-4);
            assert_true(fabs(r1.eval_accuracy - rn.eval_accuracy) < 2e-3);
        }
    }
}

/* Sync batch norm (sync: true) through the trainer: 2 replicas with half the batch each train the
 * parameters and running statistics one replica with the whole batch trains, within rounding;
 * without sync, each replica normalises its own micro-batch and they do not. */
static void test_replicas_sync_batchnorm(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    double diff[2][2];
    for (int sync = 0; sync <= 1; sync++) {
        char yaml[1024];
        snprintf(yaml, sizeof yaml,
                 "model:\n  type: graph\n  input: [784]\n  layers:\n    - linear: {out: 64}\n"
                 "    - batchnorm1d: {sync: %s}\n    - relu\n    - linear: {out: 10}\n"
                 "data: {train: {source: idx, images: %s, labels: %s}}\n",
                 sync ? "true" : "false", FM "train-images-idx3-ubyte.gz", FM "train-labels-idx1-ubyte.gz");
        mr_experiment e;
        if (mr_experiment_parse(yaml, "sync.yaml", &e) != MR_OK) fail_msg("%s", mr_last_error());
        char one[512];
        snprintf(one, sizeof one, "%s", run_dir(sync ? "bn-one-sync" : "bn-one"));
        const char *two = run_dir(sync ? "bn-two-sync" : "bn-two");
        mr_train_cfg c1 = small_mlp(one, 1), c2 = small_mlp(two, 2);
        c1.model = c2.model = e.model;
        mr_train_result r1, r2;
        MR_ASSERT_OK(mr_train(&c1, &r1));
        MR_ASSERT_OK(mr_train(&c2, &r2));
        diff[sync][0] = max_param_diff(final_ckpt(one), final_ckpt(two));
        diff[sync][1] = max_group_diff(final_ckpt(one), final_ckpt(two), "buffers");
        fprintf(stderr, "batch norm %s: 1 vs 2 replicas: max |param diff| %.3g, max |buffer diff| %.3g after %d steps; "
                        "eval accuracy %.4f vs %.4f\n", sync ? "sync" : "per replica", diff[sync][0], diff[sync][1],
                STEPS, r1.eval_accuracy, r2.eval_accuracy);
        mr_experiment_deinit(&e);
    }
    assert_true(diff[1][0] < 1e-4 && diff[1][1] < 1e-3); /* rounding only (the sums run in another order) */
    assert_true(diff[0][0] > 100 * diff[1][0]);          /* per-replica statistics are another model */
}

static void stop_at(void *ctx, const mr_train_state *s) {
    if (s->step == *(int64_t *)ctx) mr_train_request_stop(SIGUSR1);
}

/* 2 replicas: deterministic, stop + resume bit-exact, and the checkpoint resumes on 1 replica. */
static void test_replicas_resume(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    char a[512], b[512], straight2[512];
    snprintf(a, sizeof a, "%s", run_dir("two-a"));
    snprintf(b, sizeof b, "%s", run_dir("two-b"));
    snprintf(straight2, sizeof straight2, "%s", run_dir("two-again"));
    mr_train_result r;
    mr_train_cfg c = small_mlp(a, 2);
    MR_ASSERT_OK(mr_train(&c, &r));
    c = small_mlp(straight2, 2);
    c.bucket_mb = 0.01; /* 10 KB buckets: many all-reduces in flight during the backward */
    MR_ASSERT_OK(mr_train(&c, &r));
    assert_true(max_param_diff(final_ckpt(a), final_ckpt(straight2)) == 0.0);
    c = small_mlp(b, 2);
    int64_t at = 17;
    c.on_step = stop_at;
    c.on_step_ctx = &at;
    MR_ASSERT_OK(mr_train(&c, &r));
    assert_int_equal(r.stopped_by, SIGUSR1);
    assert_true(r.steps > 17 && r.steps < STEPS); /* the replicas agree on a step at or after the signal */
    int64_t stopped = r.steps;
    c.on_step = NULL;
    MR_ASSERT_OK(mr_train(&c, &r));
    assert_int_equal(r.resumed_from, stopped);
    double d = max_param_diff(final_ckpt(a), final_ckpt(b));
    fprintf(stderr, "2 replicas stopped at %lld and resumed: max |param diff| to the straight run %.3g\n",
            (long long)stopped, d);
    assert_true(d == 0.0);
    /* another world size: the model and optimizer resume; the run finishes */
    char one[512];
    snprintf(one, sizeof one, "%s", run_dir("resume-on-one"));
    c = small_mlp(one, 1);
    c.steps = STEPS + 10;
    c.resume = final_ckpt(a);
    MR_ASSERT_OK(mr_train(&c, &r));
    assert_int_equal(r.resumed_from, STEPS);
    assert_int_equal(r.steps, STEPS + 10);
}

/* ZeRO-1 (shard_optimizer): each of 2 replicas updates its half of the parameters with its half
 * of the optimizer state; the result is bit-identical to unsharded replicas (the same sums, the
 * same element-wise updates), with AdamW (two state slots) and with clipping's global norm; the
 * checkpoint holds the full optimizer state, and a sharded run resumes bit-exactly. */
static void test_replicas_shard_optimizer(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    char plain[512], zero[512], zstop[512];
    snprintf(plain, sizeof plain, "%s", run_dir("adamw-plain"));
    snprintf(zero, sizeof zero, "%s", run_dir("adamw-zero"));
    snprintf(zstop, sizeof zstop, "%s", run_dir("adamw-zero-stopped"));
    mr_train_result r;
    mr_train_cfg c = small_mlp(plain, 2);
    c.optim = mr_optim_cfg_default(MR_OPTIM_ADAMW);
    c.optim.lr = 2e-3;
    MR_ASSERT_OK(mr_train(&c, &r));
    mr_train_cfg z = c;
    z.run_dir = z.ckpt_dir = zero;
    z.shard_optimizer = 1;
    MR_ASSERT_OK(mr_train(&z, &r));
    double d = max_param_diff(final_ckpt(plain), final_ckpt(zero));
    fprintf(stderr, "2 replicas, AdamW, sharded optimizer vs not: max |param diff| %.3g\n", d);
    assert_true(d == 0.0);
    /* stopped and resumed, sharded */
    mr_train_cfg zs = z;
    zs.run_dir = zs.ckpt_dir = zstop;
    int64_t at = 23;
    zs.on_step = stop_at;
    zs.on_step_ctx = &at;
    MR_ASSERT_OK(mr_train(&zs, &r));
    assert_int_equal(r.stopped_by, SIGUSR1);
    zs.on_step = NULL;
    MR_ASSERT_OK(mr_train(&zs, &r));
    assert_true(r.resumed_from > 23);
    assert_true(max_param_diff(final_ckpt(zero), final_ckpt(zstop)) == 0.0);
    /* with clipping: the global norm over the shards */
    c.grad_clip = 0.5;
    z.grad_clip = 0.5;
    c.run_dir = c.ckpt_dir = run_dir("clip-plain");
    MR_ASSERT_OK(mr_train(&c, &r));
    z.run_dir = z.ckpt_dir = run_dir("clip-zero");
    MR_ASSERT_OK(mr_train(&z, &r));
    d = max_param_diff(final_ckpt(c.ckpt_dir), final_ckpt(z.ckpt_dir));
    fprintf(stderr, "with clipping at 0.5: max |param diff| %.3g (the norm summed per shard)\n", d);
    assert_true(d < 1e-5);
}

/* Evaluation over 1, 2 and 3 replicas covers each of the 10000 test images exactly once: each
 * replica takes every world-th image and its own last, partial batch (3334, 3333 and 3333 images
 * in batches of 16 for 3 replicas), and the sums are added up. One step at a negligible learning
 * rate, so every replica count evaluates the same parameters up to float rounding. */
static void test_replicas_eval_every_sample(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    double acc1 = 0, loss1 = 0;
    for (int n = 1; n <= 3; n++) {
        mr_train_cfg c = small_mlp(NULL, n);
        c.run_dir = c.ckpt_dir = NULL;
        c.steps = 1;
        c.batch = 48;
        c.optim.lr = 1e-12;
        mr_train_result r;
        MR_ASSERT_OK(mr_train(&c, &r));
        print_message("  %d replica(s): %lld samples evaluated, accuracy %.4f, loss %.9f\n", n,
                      (long long)r.eval_samples, r.eval_accuracy, r.eval_loss);
        assert_int_equal(r.eval_samples, 10000);
        if (n == 1) acc1 = r.eval_accuracy, loss1 = r.eval_loss;
        assert_true(fabs(r.eval_accuracy - acc1) <= 1e-4 + 1e-12); /* one image at most */
        assert_true(fabs(r.eval_loss - loss1) < 1e-6);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_replicas_match_one), cmocka_unit_test(test_replicas_resume),
                                       cmocka_unit_test(test_replicas_shard_optimizer), cmocka_unit_test(test_replicas_sync_batchnorm),
                                       cmocka_unit_test(test_replicas_eval_every_sample)};
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
