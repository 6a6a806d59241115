/* The trainer with a model that has buffers (batch norm's running statistics; autodiff/nn.h
 * mr_params_bufs): a layer graph flatten -> linear 32 -> batchnorm1d -> relu -> linear 10 on
 * Fashion-MNIST. Checkpoints hold /buffers/<name> (num_batches_tracked counts the steps); a run
 * stopped and resumed is bit-identical to one that never stopped, buffers included, on one
 * replica and on two (replica 0's statistics are broadcast); the device path on the CPU gives the
 * host path's bits; evaluating a checkpoint uses its buffers (the run's own final evaluation),
 * and a file without /buffers keeps the initial statistics (a different evaluation). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "checkpoint/ckpt.h"
#include "train/train.h"

#define STEPS 30
#define STOP_AT 13

static mr_layer *put(mr_layer_graph *g, int32_t at, int kind) {
    g->l[at] = mr_layer_default(kind);
    return &g->l[at];
}

static mr_train_cfg bn_model(const char *dir, int replicas) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 32, STEPS, 32);
    c.model.type = MR_MODEL_GRAPH;
    mr_layer_graph *g = &c.model.graph;
    memset(g, 0, sizeof *g);
    g->n_input = 3;
    g->input[0] = 1;
    g->input[1] = 28;
    g->input[2] = 28;
    g->top = mr_layers_reserve(g, 5);
    g->n_top = 5;
    put(g, g->top + 0, MR_LAYER_FLATTEN);
    put(g, g->top + 1, MR_LAYER_LINEAR)->out = 32;
    put(g, g->top + 2, MR_LAYER_BATCHNORM1D);
    put(g, g->top + 3, MR_LAYER_RELU);
    put(g, g->top + 4, MR_LAYER_LINEAR)->out = 10;
    c.log_every = 7;
    c.eval_every = 15;
    c.run_dir = c.ckpt_dir = dir;
    c.ckpt_every = 10;
    c.resume = "auto";
    c.replicas = replicas;
    c.comm_timeout_s = 60;
    return c;
}

static const char *dir_of(const char *tag) {
    static char d[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(d[k], sizeof d[k], "%s/%s", th_tmp_dir(), tag);
    return d[k];
}

static const char *final_ckpt(const char *dir) {
    static char path[4][4096];
    static int k;
    k = (k + 1) % 4;
    mr_ckpt_path(dir, STEPS, path[k], sizeof path[k]);
    return path[k];
}

/* Every dataset of group in two checkpoints, bit for bit; returns how many. */
static int assert_same_group(const char *a, const char *b, const char *group) {
    mr_ckpt_reader *ra = NULL, *rb = NULL;
    MR_ASSERT_OK(mr_ckpt_open(a, 0, &ra));
    MR_ASSERT_OK(mr_ckpt_open(b, 0, &rb));
    char **na = NULL, **nb = NULL;
    int ca = 0, cb = 0;
    MR_ASSERT_OK(mr_ckpt_list(ra, group, &na, &ca));
    MR_ASSERT_OK(mr_ckpt_list(rb, group, &nb, &cb));
    assert_int_equal(ca, cb);
    for (int i = 0; i < ca; i++) {
        char p[1024];
        assert_string_equal(na[i], nb[i]);
        snprintf(p, sizeof p, "%s/%s", group, na[i]);
        mr_dtype dt;
        mr_shape sh;
        MR_ASSERT_OK(mr_ckpt_info(ra, p, &dt, &sh));
        size_t bytes = (size_t)mr_shape_numel(&sh) * sizeof(float);
        float *x = malloc(bytes), *y = malloc(bytes);
        MR_ASSERT_OK(mr_ckpt_read(ra, p, MR_F32, &sh, x));
        MR_ASSERT_OK(mr_ckpt_read(rb, p, MR_F32, &sh, y));
        if (memcmp(x, y, bytes) != 0) fail_msg("%s differs between %s and %s", p, a, b);
        free(x);
        free(y);
    }
    mr_ckpt_names_free(na, ca);
    mr_ckpt_names_free(nb, cb);
    mr_ckpt_close(ra);
    mr_ckpt_close(rb);
    return ca;
}

static void assert_same_run(const char *a, const char *b) {
    assert_true(assert_same_group(a, b, "params") == 6); /* two linear layers and the batch norm's affine */
    assert_true(assert_same_group(a, b, "buffers") == 3);
    assert_true(assert_same_group(a, b, "optimizer") > 0);
}

static void stop_at(void *ctx, const mr_train_state *s) {
    if (s->step == *(int64_t *)ctx) mr_train_request_stop(SIGTERM);
}

/* Straight against stopped at STOP_AT and resumed, on `replicas` replicas. */
static void check_resume(int replicas, int device_path) {
    char tag[64];
    snprintf(tag, sizeof tag, "bn-r%d-d%d", replicas, device_path);
    char straight[512], stopped[512];
    snprintf(straight, sizeof straight, "%s-straight", dir_of(tag));
    snprintf(stopped, sizeof stopped, "%s-stopped", dir_of(tag));
    mr_train_result ra, rb;
    mr_train_cfg c = bn_model(straight, replicas);
    c.device_path = device_path;
    MR_ASSERT_OK(mr_train(&c, &ra));
    assert_int_equal(ra.steps, STEPS);
    c.run_dir = c.ckpt_dir = stopped;
    int64_t at = STOP_AT;
    c.on_step = stop_at;
    c.on_step_ctx = &at;
    MR_ASSERT_OK(mr_train(&c, &rb));
    assert_true(rb.stopped_by != 0 && rb.steps < STEPS);
    c.on_step = NULL;
    MR_ASSERT_OK(mr_train(&c, &rb));
    assert_int_equal(rb.resumed_from > 0, 1);
    assert_int_equal(rb.steps, STEPS);
    assert_same_run(final_ckpt(straight), final_ckpt(stopped));
    assert_true(ra.eval_loss == rb.eval_loss);
    assert_true(ra.eval_accuracy == rb.eval_accuracy);
    fprintf(stderr, "%d replica(s)%s: resumed at %lld, bit-identical (params, buffers, optimizer); eval loss %.6f\n",
            replicas, device_path ? ", device path" : "", (long long)rb.resumed_from, rb.eval_loss);
}

static void test_buffers_resume_bit_exact(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    check_resume(1, 0);
    check_resume(2, 0);
}

/* The checkpoint's /buffers, and mr_evaluate_checkpoint with and without them. */
static void test_buffers_checkpoint(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    const char *dir = dir_of("bn-contents");
    mr_train_cfg c = bn_model(dir, 1);
    mr_train_result r, e;
    MR_ASSERT_OK(mr_train(&c, &r));
    const char *path = final_ckpt(dir);
    mr_ckpt_reader *rd = NULL;
    MR_ASSERT_OK(mr_ckpt_open(path, 0, &rd));
    mr_dtype dt;
    mr_shape sh;
    float mean[32], var[32], nbt = 0;
    MR_ASSERT_OK(mr_ckpt_info(rd, "buffers/2.running_mean", &dt, &sh));
    assert_int_equal(sh.ndim, 1);
    assert_int_equal(sh.dim[0], 32);
    MR_ASSERT_OK(mr_ckpt_read(rd, "buffers/2.running_mean", MR_F32, &sh, mean));
    MR_ASSERT_OK(mr_ckpt_read(rd, "buffers/2.running_var", MR_F32, &sh, var));
    MR_ASSERT_OK(mr_ckpt_info(rd, "buffers/2.num_batches_tracked", &dt, &sh));
    assert_int_equal(sh.ndim, 0);
    MR_ASSERT_OK(mr_ckpt_read(rd, "buffers/2.num_batches_tracked", MR_F32, &sh, &nbt));
    assert_true(nbt == (float)STEPS); /* one training batch per step */
    int moved = 0;
    for (int i = 0; i < 32; i++) moved += mean[i] != 0.0f && var[i] != 1.0f && isfinite(var[i]);
    assert_true(moved > 16);
    /* a copy with /params only: an older checkpoint's layout */
    char bare[4096];
    snprintf(bare, sizeof bare, "%s/no-buffers.h5", dir);
    mr_ckpt_writer *w = NULL;
    MR_ASSERT_OK(mr_ckpt_writer_new(&w));
    char **names = NULL;
    int n = 0;
    MR_ASSERT_OK(mr_ckpt_list(rd, "params", &names, &n));
    float *vals[8] = {NULL};
    assert_true(n == 6);
    for (int i = 0; i < n; i++) {
        char p[1024];
        snprintf(p, sizeof p, "params/%s", names[i]);
        MR_ASSERT_OK(mr_ckpt_info(rd, p, &dt, &sh));
        vals[i] = malloc((size_t)mr_shape_numel(&sh) * sizeof(float));
        MR_ASSERT_OK(mr_ckpt_read(rd, p, MR_F32, &sh, vals[i]));
        MR_ASSERT_OK(mr_ckpt_writer_add(w, p, MR_F32, &sh, vals[i]));
    }
    MR_ASSERT_OK(mr_ckpt_writer_write(w, bare));
    mr_ckpt_writer_free(w);
    for (int i = 0; i < n; i++) free(vals[i]);
    mr_ckpt_names_free(names, n);
    mr_ckpt_close(rd);
    /* with its buffers: the run's own final evaluation, exactly */
    MR_ASSERT_OK(mr_evaluate_checkpoint(&c, path, &e));
    fprintf(stderr, "eval of %s: loss %.6f (the run: %.6f)\n", path, e.eval_loss, r.eval_loss);
    assert_true(e.eval_loss == r.eval_loss);
    assert_true(e.eval_accuracy == r.eval_accuracy);
    /* without: the initial statistics (mean 0, variance 1), another evaluation */
    MR_ASSERT_OK(mr_evaluate_checkpoint(&c, bare, &e));
    fprintf(stderr, "eval of %s (no /buffers): loss %.6f\n", bare, e.eval_loss);
    assert_true(isfinite(e.eval_loss) && e.eval_loss != r.eval_loss);
}

/* The device path on the CPU (separate buffers, copies in and out) gives the host path's bits. */
static void test_buffers_device_path(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    const char *host = dir_of("bn-host"), *dev = dir_of("bn-device");
    mr_train_result rh, rd;
    mr_train_cfg c = bn_model(host, 1);
    MR_ASSERT_OK(mr_train(&c, &rh));
    c = bn_model(dev, 1);
    c.device_path = 1;
    MR_ASSERT_OK(mr_train(&c, &rd));
    assert_same_run(final_ckpt(host), final_ckpt(dev));
    assert_true(rh.eval_loss == rd.eval_loss);
    check_resume(1, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_buffers_resume_bit_exact),
                                       cmocka_unit_test(test_buffers_checkpoint),
                                       cmocka_unit_test(test_buffers_device_path)};
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
