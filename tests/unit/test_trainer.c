/* train/ (mr_train): a short run on Fashion-MNIST (Debian's dataset-fashion-mnist, installed by
 * tests/run.sh) learns (loss falls, accuracy well above chance), writes metrics.jsonl with the
 * time split, is deterministic (same seed: same losses bit for bit), gradient accumulation over
 * micro-batches matches one large batch, and bad configs fail with the field named. */
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

static void test_train_mlp(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    char dir[] = "/tmp/mirror_trainer_XXXXXX";
    assert_non_null(mkdtemp(dir));
    mr_train_cfg c = small_mlp();
    c.run_dir = dir;
    c.schedule = (mr_schedule_cfg){MR_SCHEDULE_COSINE, 10, 0, 0, 0, 0};
    mr_train_result r;
    MR_ASSERT_OK(mr_train(&c, &r));
    fprintf(stderr, "mlp: %lld steps in %.2f s, last loss %.4f, eval loss %.4f, accuracy %.4f, %d compilations\n",
            (long long)r.steps, r.seconds, r.last_loss, r.eval_loss, r.eval_accuracy, r.compilations);
    assert_true(r.last_loss < 1.0);        /* from log(10) = 2.30 */
    assert_true(r.eval_accuracy > 0.70);   /* chance is 0.10 */
    assert_int_equal(r.compilations, 3);   /* train 64, eval 64, eval remainder 10000 % 64 = 16 */
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    int logs = 0, evals = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "\"samples_per_s\"")) {
            logs++;
            assert_non_null(strstr(line, "\"data_wait_s\""));
            assert_non_null(strstr(line, "\"forward_s\""));
            assert_non_null(strstr(line, "\"backward_s\""));
            assert_non_null(strstr(line, "\"optimizer_s\""));
        }
        if (strstr(line, "\"eval_accuracy\"")) evals++;
    }
    fclose(f);
    assert_int_equal(logs, 3);
    assert_int_equal(evals, 1);
    unlink(path);
    rmdir(dir);
}

/* Same seed, same config: the same losses bit for bit; and 2 micro-batches of 32 give the step of
 * one batch of 64 (the same 64 elements in the same order) up to float rounding. */
static void test_train_deterministic_and_accumulation(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp();
    c.steps = 30;
    c.log_every = 30;
    c.eval_images = NULL;
    mr_train_result a, b, m;
    MR_ASSERT_OK(mr_train(&c, &a));
    MR_ASSERT_OK(mr_train(&c, &b));
    assert_true(a.last_loss == b.last_loss);
    c.accumulate = 2;
    MR_ASSERT_OK(mr_train(&c, &m));
    fprintf(stderr, "loss over 30 steps: batch 64 %.7f, 2 x 32 accumulated %.7f\n", a.last_loss, m.last_loss);
    assert_float_equal(m.last_loss, a.last_loss, 1e-4 * a.last_loss);
}

/* mixed_bfloat16: linear layers multiply in bf16 (AMX where available) from f32 master weights;
 * the run learns like f32 does. */
static void test_train_mixed_bf16(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = small_mlp();
    mr_train_result f, b;
    MR_ASSERT_OK(mr_train(&c, &f));
    c.compute = MR_BF16;
    MR_ASSERT_OK(mr_train(&c, &b));
    fprintf(stderr, "mlp 150 steps: f32 loss %.4f acc %.4f; mixed_bfloat16 loss %.4f acc %.4f\n", f.last_loss,
            f.eval_accuracy, b.last_loss, b.eval_accuracy);
    assert_true(b.eval_accuracy > 0.70);
    assert_true(fabs(b.last_loss - f.last_loss) < 0.1);
    c.compute = MR_I32;
    assert_int_equal(mr_train(&c, &b), MR_ERR_UNSUPPORTED);
}

static void test_train_errors(void **state) {
    (void)state;
    mr_train_cfg c = small_mlp();
    mr_train_result r;
    c.batch = 0;
    assert_int_equal(mr_train(&c, &r), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "train.batch"));
    c = small_mlp();
    c.accumulate = 3;
    assert_int_equal(mr_train(&c, &r), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "train.accumulate"));
    c = small_mlp();
    c.train_images = "/nonexistent/train-images.gz";
    assert_true(mr_train(&c, &r) != MR_OK);
    assert_non_null(strstr(mr_last_error(), "/nonexistent/train-images.gz"));
    c = small_mlp();
    c.optim.lr = 1e30; /* diverges */
    c.steps = 20;
    c.eval_images = NULL;
    if (th_have_fashion_mnist()) {
        mr_status st = mr_train(&c, &r);
        if (st != MR_OK) assert_non_null(strstr(mr_last_error(), "non-finite loss"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_train_mlp),
                                       cmocka_unit_test(test_train_deterministic_and_accumulation),
                                       cmocka_unit_test(test_train_mixed_bf16), cmocka_unit_test(test_train_errors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
