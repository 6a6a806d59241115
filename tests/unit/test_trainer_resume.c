/* Checkpoints in the trainer: a run stopped (as by SIGTERM) and resumed is bit-identical to one
 * that never stopped — every step's loss, the metrics file, every parameter and optimizer slot —
 * in f32, mixed_bfloat16, mixed_float16 (loss scaler state), with gradient accumulation, and for a
 * GPT with dropout; a corrupt newest checkpoint is skipped for the one before; init_from loads
 * /params of any HDF5 file and names a missing, extra or mis-shaped parameter; evaluating a
 * checkpoint gives the run's own final evaluation; a different optimizer refuses to resume. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "checkpoint/ckpt.h"
#include "train/train.h"

#define STEPS 30
#define STOP_AT 13 /* not a multiple of the checkpoint interval nor of the log interval */

static mr_train_cfg small_mlp(const char *dir) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 48, STEPS, 32);
    c.schedule = (mr_schedule_cfg){MR_SCHEDULE_COSINE, 5, 0, 0, 0, 0};
    c.log_every = 7;
    c.eval_every = 15;
    c.run_dir = c.ckpt_dir = dir;
    c.ckpt_every = 10;
    c.resume = "auto";
    c.config_text = "seed: 1\nmodel: {type: mlp}\n";
    return c;
}

/* A tiny character GPT with dropout on a generated text (so the test needs no dataset). */
static mr_train_cfg tiny_gpt(const char *dir) {
    mr_train_cfg c = small_mlp(dir);
    th_tiny_gpt(&c, 16, 32, 0.1);
    return c;
}

typedef struct trace {
    double loss[STEPS + 1];
    int64_t stop_at;
} trace;

static void record(void *ctx, const mr_train_state *s) {
    trace *t = ctx;
    t->loss[s->step] = s->loss;
    if (s->step == t->stop_at) mr_train_request_stop(SIGTERM);
}

/* The deterministic fields of metrics.jsonl (time and speeds dropped), one string. */
static char *metrics_values(const char *dir) {
    static const char *const keys[] = {"step", "loss", "lr", "loss_scale", "skipped_steps", "eval_loss",
                                       "eval_accuracy", "eval_perplexity"};
    char path[4096], line[2048];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(cap, 1);
    while (fgets(line, sizeof line, f)) {
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            char pat[64];
            snprintf(pat, sizeof pat, "\"%s\": ", keys[k]);
            const char *p = strstr(line, pat);
            if (!p) continue;
            p += strlen(pat);
            size_t n = strcspn(p, ",}");
            assert_true(len + n + 40 < cap);
            len += (size_t)snprintf(out + len, cap - len, "%s=%.*s ", keys[k], (int)n, p);
        }
        out[len++] = '\n';
    }
    fclose(f);
    return out;
}

/* Every dataset under params/ and optimizer/ of two checkpoints, bit for bit. */
static void assert_same_checkpoint(const char *a, const char *b) {
    mr_ckpt_reader *ra = NULL, *rb = NULL;
    MR_ASSERT_OK(mr_ckpt_open(a, 0, &ra));
    MR_ASSERT_OK(mr_ckpt_open(b, 0, &rb));
    static const char *const groups[] = {"params", "optimizer"};
    int compared = 0;
    for (int g = 0; g < 2; g++) {
        char **na = NULL, **nb = NULL;
        int ca = 0, cb = 0;
        MR_ASSERT_OK(mr_ckpt_list(ra, groups[g], &na, &ca));
        MR_ASSERT_OK(mr_ckpt_list(rb, groups[g], &nb, &cb));
        assert_int_equal(ca, cb);
        for (int i = 0; i < ca; i++) {
            char p[1024];
            assert_string_equal(na[i], nb[i]);
            snprintf(p, sizeof p, "%s/%s", groups[g], na[i]);
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
            compared++;
        }
        mr_ckpt_names_free(na, ca);
        mr_ckpt_names_free(nb, cb);
    }
    assert_true(compared > 0);
    int64_t sa = 0, sb = 0;
    double la = 0, lb = 0;
    MR_ASSERT_OK(mr_ckpt_attr_i64(ra, "optimizer.steps", &sa));
    MR_ASSERT_OK(mr_ckpt_attr_i64(rb, "optimizer.steps", &sb));
    assert_int_equal(sa, sb);
    MR_ASSERT_OK(mr_ckpt_attr_f64(ra, "loss_scale", &la));
    MR_ASSERT_OK(mr_ckpt_attr_f64(rb, "loss_scale", &lb));
    assert_true(la == lb);
    mr_ckpt_close(ra);
    mr_ckpt_close(rb);
}

/* 30 steps straight against 13 steps, a stop (SIGTERM's path), and a resume to 30. */
static void check_resume(mr_train_cfg (*make)(const char *), const char *tag, mr_dtype compute, int64_t accumulate) {
    char da[512], db[512];
    snprintf(da, sizeof da, "%s/%s-straight", th_tmp_dir(), tag);
    snprintf(db, sizeof db, "%s/%s-stopped", th_tmp_dir(), tag);
    trace ta = {.stop_at = -1}, tb = {.stop_at = STOP_AT};
    mr_train_cfg c = make(da);
    c.compute = compute;
    c.accumulate = accumulate;
    c.on_step = record;
    c.on_step_ctx = &ta;
    mr_train_result ra, rb;
    MR_ASSERT_OK(mr_train(&c, &ra));
    assert_int_equal(ra.steps, STEPS);
    c.run_dir = c.ckpt_dir = db;
    c.on_step_ctx = &tb;
    MR_ASSERT_OK(mr_train(&c, &rb));
    assert_int_equal(rb.stopped_by, SIGTERM);
    assert_int_equal(rb.steps, STOP_AT);
    tb.stop_at = -1;
    MR_ASSERT_OK(mr_train(&c, &rb));
    assert_int_equal(rb.resumed_from, STOP_AT);
    assert_int_equal(rb.steps, STEPS);
    for (int s = 1; s <= STEPS; s++)
        if (ta.loss[s] != tb.loss[s]) fail_msg("%s: step %d loss %.9g straight, %.9g resumed", tag, s, ta.loss[s], tb.loss[s]);
    char pa[4096], pb[4096];
    mr_ckpt_path(da, STEPS, pa, sizeof pa);
    mr_ckpt_path(db, STEPS, pb, sizeof pb);
    assert_same_checkpoint(pa, pb);
    char *ma = metrics_values(da), *mb = metrics_values(db);
    assert_string_equal(ma, mb);
    assert_true(ra.eval_loss == rb.eval_loss || (isnan(ra.eval_loss) && isnan(rb.eval_loss)));
    fprintf(stderr, "%s: resumed at step %d, identical through step %d (final loss %.6f, eval loss %.6f)\n", tag,
            STOP_AT, STEPS, ra.last_loss, ra.eval_loss);
    free(ma);
    free(mb);
}

static void test_resume_bit_exact_mlp(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    check_resume(small_mlp, "mlp-f32", MR_F32, 1);
    check_resume(small_mlp, "mlp-bf16", MR_BF16, 1);
    check_resume(small_mlp, "mlp-f16", MR_F16, 1);
    check_resume(small_mlp, "mlp-accumulate", MR_F32, 2);
}

static void test_resume_bit_exact_gpt_dropout(void **state) {
    (void)state;
    check_resume(tiny_gpt, "gpt-dropout", MR_F32, 1);
}

/* A damaged newest checkpoint: resume warns and takes the one before. */
static void test_resume_skips_corrupt(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    char d[512], p20[4096], p30[4096];
    snprintf(d, sizeof d, "%s/corrupt", th_tmp_dir());
    mr_train_cfg c = small_mlp(d);
    c.ckpt_keep = 0;
    mr_train_result r;
    MR_ASSERT_OK(mr_train(&c, &r));
    mr_ckpt_path(d, 20, p20, sizeof p20);
    mr_ckpt_path(d, 30, p30, sizeof p30);
    assert_int_equal(access(p20, R_OK), 0);
    assert_int_equal(truncate(p30, 4096), 0); /* as a disk that lost the tail */
    c.steps = 40;
    MR_ASSERT_OK(mr_train(&c, &r));
    assert_int_equal(r.resumed_from, 20);
    assert_int_equal(r.steps, 40);
}

/* init_from takes /params of any HDF5 file; names what does not fit. */
static void test_init_from_and_eval(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    char d[512], ck[4096];
    snprintf(d, sizeof d, "%s/source", th_tmp_dir());
    mr_train_cfg c = small_mlp(d);
    mr_train_result r, e;
    MR_ASSERT_OK(mr_train(&c, &r));
    mr_ckpt_path(d, STEPS, ck, sizeof ck);
    /* evaluating the final checkpoint reproduces the run's final evaluation */
    MR_ASSERT_OK(mr_evaluate_checkpoint(&c, ck, &e));
    assert_int_equal(e.steps, STEPS);
    assert_true(e.eval_loss == r.eval_loss);
    assert_true(e.eval_accuracy == r.eval_accuracy);

    /* foreign files as h5py would write them from a state_dict: /params only */
    static const char *const names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    static const int64_t rows[] = {48, 48, 10, 10}, cols[] = {784, 0, 48, 0};
    mr_ckpt_reader *rd = NULL;
    MR_ASSERT_OK(mr_ckpt_open(ck, 0, &rd));
    float *vals[4];
    for (int i = 0; i < 4; i++) {
        mr_shape sh = cols[i] ? mr_shape_2d(rows[i], cols[i]) : mr_shape_1d(rows[i]);
        vals[i] = malloc((size_t)mr_shape_numel(&sh) * sizeof(float));
        char p[256];
        snprintf(p, sizeof p, "params/%s", names[i]);
        MR_ASSERT_OK(mr_ckpt_read(rd, p, MR_F32, &sh, vals[i]));
    }
    mr_ckpt_close(rd);
    for (int variant = 0; variant < 4; variant++) { /* 0 good, 1 missing, 2 extra, 3 mis-shaped */
        mr_ckpt_writer *w = NULL;
        MR_ASSERT_OK(mr_ckpt_writer_new(&w));
        for (int i = 0; i < 4; i++) {
            if (variant == 1 && i == 2) continue;
            mr_shape sh = cols[i] ? mr_shape_2d(rows[i], cols[i]) : mr_shape_1d(rows[i]);
            if (variant == 3 && i == 1) sh = mr_shape_1d(rows[i] - 1);
            char p[256];
            snprintf(p, sizeof p, "params/%s", names[i]);
            MR_ASSERT_OK(mr_ckpt_writer_add(w, p, MR_F32, &sh, vals[i]));
        }
        if (variant == 2) {
            mr_shape sh = mr_shape_1d(3);
            MR_ASSERT_OK(mr_ckpt_writer_add(w, "params/fc3.bias", MR_F32, &sh, vals[1]));
        }
        const char *f = th_tmp_path("state_dict.h5");
        MR_ASSERT_OK(mr_ckpt_writer_write(w, f));
        mr_ckpt_writer_free(w);
        char dn[512];
        snprintf(dn, sizeof dn, "%s/init-%d", th_tmp_dir(), variant);
        mr_train_cfg c2 = small_mlp(dn);
        c2.init_from = f;
        c2.steps = 1;
        c2.eval_images = NULL;
        mr_status st = mr_evaluate_checkpoint(&c, f, &e);
        mr_status st2 = mr_train(&c2, &r);
        static const char *const want[] = {NULL, "fc2.weight", "fc3.bias", "fc1.bias"};
        if (variant == 0) {
            MR_ASSERT_OK(st);
            MR_ASSERT_OK(st2);
            assert_true(e.eval_accuracy > 0.5);
        } else {
            assert_int_equal(st, MR_ERR_INVALID);
            assert_int_equal(st2, MR_ERR_INVALID);
            if (!strstr(mr_last_error(), want[variant]))
                fail_msg("variant %d: the message does not name %s: %s", variant, want[variant], mr_last_error());
        }
    }
    for (int i = 0; i < 4; i++) free(vals[i]);
    /* resuming with another optimizer is refused, naming both */
    mr_train_cfg c3 = small_mlp(d);
    c3.steps = STEPS + 5;
    c3.optim = mr_optim_cfg_default(MR_OPTIM_SGD);
    assert_int_equal(mr_train(&c3, &r), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "adamw"));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_resume_bit_exact_mlp),
                                       cmocka_unit_test(test_resume_bit_exact_gpt_dropout),
                                       cmocka_unit_test(test_resume_skips_corrupt),
                                       cmocka_unit_test(test_init_from_and_eval)};
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
