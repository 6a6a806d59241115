/* Exact data order across numbers of replicas (docs/DESIGN.md, "Data pipeline determinism"):
 * - data/: replicas of ORDER -> shard(W, r) -> batch in lockstep read the one global sequence
 *   whatever W; mr_data_iter_save_global writes the same bytes on every replica, and the blob
 *   resumes on any other W so that the rest of the sequence is exactly the uninterrupted one;
 *   bad blobs and unsupported pipelines fail with their status;
 * - the trainer (local replicas, MIRROR_DATA_LOG's sample logs, train/train_data.c): 2 replicas
 *   for 30 steps, checkpointed at 15 and resumed on 1 and on 4 (and with train.accumulate 4 on 1,
 *   2 on 4), consume exactly the samples of the uninterrupted 2-replica run, none repeated or
 *   skipped; resumed with twice the batch, the samples that follow the checkpoint's last; a
 *   checkpoint of the older format
 *   (per-replica states, tests/fixtures/ckpt_v1_world2.h5) still resumes exactly on 2;
 * - evaluation over 1, 2, 3 and 4 replicas evaluates each of the 10000 test images exactly once,
 *   the last partial batches included;
 * - with data.train.augment (data/augment.h) 1 and 2 replicas, and 2 resumed on 1, train the same
 *   parameters up to float rounding.
 * (mpirun: tests/mpi/data_order.sh.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "checkpoint/ckpt.h"
#include "data/data.h"
#include "train/train.h"

/* ---- data/: the global sequence and its state ------------------------------------------------ */

#define N_SRC 103
#define G 24 /* the global batch: W * micro for W in 1, 2, 3, 4, 6 */

static mr_dataset *global_pipeline(uint64_t seed) {
    mr_data_spec spec = {0};
    mr_shape s0 = mr_shape_make(0, NULL);
    MR_ASSERT_OK(mr_data_spec_add(&spec, "v", MR_I32, &s0));
    int32_t v[N_SRC];
    for (int i = 0; i < N_SRC; i++) v[i] = i;
    const void *data[1] = {v};
    mr_dataset *a = NULL, *b = NULL, *c = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&spec, N_SRC, data, &a));
    MR_ASSERT_OK(mr_data_shuffle(a, 17, seed, 1, &b));
    MR_ASSERT_OK(mr_data_repeat(b, -1, &c));
    mr_data_free(a);
    mr_data_free(b);
    return c;
}

/* replica r of w: the global pipeline, shard (w > 1), batch of G / w, prefetch */
static mr_data_iter *replica(int w, int r, uint64_t seed) {
    mr_dataset *ds = global_pipeline(seed), *sh = NULL, *b = NULL, *p = NULL;
    if (w > 1) {
        MR_ASSERT_OK(mr_data_shard(ds, w, r, &sh));
        mr_data_free(ds);
        ds = sh;
    }
    MR_ASSERT_OK(mr_data_batch(ds, G / w, 1, &b));
    MR_ASSERT_OK(mr_data_prefetch(b, 2, &p));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(p, &it));
    mr_data_free(ds);
    mr_data_free(b);
    mr_data_free(p);
    return it;
}

/* Steps [s0, s1) of w replicas in lockstep into seq[step * G + position in the global batch]. */
static void run_steps(mr_data_iter **its, int w, int s0, int s1, int32_t *seq) {
    for (int s = s0; s < s1; s++)
        for (int r = 0; r < w; r++) {
            mr_data_elem e;
            int end = 1;
            MR_ASSERT_OK(mr_data_iter_next(its[r], &e, &end));
            assert_int_equal(end, 0);
            assert_int_equal(e.shape[0].dim[0], G / w);
            const int32_t *x = e.data[0];
            for (int j = 0; j < G / w; j++) seq[s * G + j * w + r] = x[j];
        }
}

static void test_global_sequence_any_world(void **state) {
    (void)state;
    enum { STEPS = 20, AT = 7 };
    static const int worlds[] = {1, 2, 3, 4, 6};
    int32_t ref[STEPS * G], seq[STEPS * G];
    mr_data_iter *one = replica(1, 0, 9);
    run_steps(&one, 1, 0, STEPS, ref);
    mr_data_iter_free(one);
    for (size_t a = 0; a < sizeof worlds / sizeof *worlds; a++) {
        const int n = worlds[a];
        mr_data_iter *its[6] = {0};
        for (int r = 0; r < n; r++) its[r] = replica(n, r, 9);
        memset(seq, 0xff, sizeof seq);
        run_steps(its, n, 0, AT, seq);
        /* every replica writes the same world-independent state */
        void *blob = NULL;
        size_t bytes = 0;
        MR_ASSERT_OK(mr_data_iter_save_global(its[0], &blob, &bytes));
        for (int r = 1; r < n; r++) {
            void *b = NULL;
            size_t nb = 0;
            MR_ASSERT_OK(mr_data_iter_save_global(its[r], &b, &nb));
            assert_true(nb == bytes && memcmp(b, blob, bytes) == 0);
            free(b);
        }
        /* ... which every other replica count resumes: the rest of the global sequence */
        for (size_t bw = 0; bw < sizeof worlds / sizeof *worlds; bw++) {
            const int m = worlds[bw];
            mr_data_iter *res[6] = {0};
            for (int r = 0; r < m; r++) {
                res[r] = replica(m, r, 9);
                if (r == 0) { /* restore also drops what was read and prefetched */
                    mr_data_elem e;
                    int end = 1;
                    MR_ASSERT_OK(mr_data_iter_next(res[r], &e, &end));
                }
                MR_ASSERT_OK(mr_data_iter_restore_global(res[r], blob, bytes));
            }
            run_steps(res, m, AT, STEPS, seq);
            for (int k = 0; k < STEPS * G; k++)
                if (seq[k] != ref[k]) fail_msg("%d replicas, resumed on %d: global position %d has element %d, the "
                                               "uninterrupted sequence %d", n, m, k, seq[k], ref[k]);
            for (int r = 0; r < m; r++) mr_data_iter_free(res[r]);
        }
        print_message("  %d replica(s): the global sequence of %d steps, resumed at step %d on 1, 2, 3, 4 and 6 "
                      "replicas: identical (state %zu bytes)\n", n, STEPS, AT, bytes);
        free(blob);
        for (int r = 0; r < n; r++) mr_data_iter_free(its[r]);
    }
}

static void test_global_state_errors(void **state) {
    (void)state;
    mr_data_iter *it = replica(2, 1, 9);
    int32_t seq[2 * G];
    mr_data_iter *pair[2] = {replica(2, 0, 9), it};
    run_steps(pair, 2, 0, 1, seq);
    void *blob = NULL;
    size_t bytes = 0;
    MR_ASSERT_OK(mr_data_iter_save_global(it, &blob, &bytes));
    unsigned char *bad = malloc(bytes);
    memcpy(bad, blob, bytes);
    /* another shuffle seed: another ORDER */
    mr_data_iter *other = replica(2, 0, 10);
    assert_int_equal(mr_data_iter_restore_global(other, blob, bytes), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "structure hash"));
    /* bad magic, truncated, trailing bytes, an out-of-range field: MR_ERR_FORMAT naming the offset */
    bad[0] ^= 1;
    assert_int_equal(mr_data_iter_restore_global(pair[0], bad, bytes), MR_ERR_FORMAT);
    assert_non_null(strstr(mr_last_error(), "offset 0"));
    bad[0] ^= 1;
    assert_int_equal(mr_data_iter_restore_global(pair[0], bad, bytes - 3), MR_ERR_FORMAT);
    assert_non_null(strstr(mr_last_error(), "truncated"));
    unsigned char *longer = calloc(1, bytes + 1);
    memcpy(longer, blob, bytes);
    assert_int_equal(mr_data_iter_restore_global(pair[0], longer, bytes + 1), MR_ERR_FORMAT);
    assert_non_null(strstr(mr_last_error(), "trailing"));
    free(longer);
    /* the per-replica format is not the global one, and back */
    void *old = NULL;
    size_t nold = 0;
    MR_ASSERT_OK(mr_data_iter_save(it, &old, &nold));
    assert_int_equal(mr_data_iter_restore_global(pair[0], old, nold), MR_ERR_FORMAT);
    assert_int_equal(mr_data_iter_restore(pair[0], blob, bytes), MR_ERR_FORMAT);
    /* after a failed restore the iterator is at the start */
    mr_data_elem e;
    int end = 1;
    MR_ASSERT_OK(mr_data_iter_next(other, &e, &end));
    int32_t first[G / 2];
    memcpy(first, e.data[0], sizeof first);
    mr_data_iter *fresh = replica(2, 0, 10);
    MR_ASSERT_OK(mr_data_iter_next(fresh, &e, &end));
    assert_memory_equal(first, e.data[0], sizeof first);
    mr_data_iter_free(fresh);
    /* every truncation and every corrupted byte: an error or a valid state (each field is range
     * checked against the pipeline), never a crash; a restored iterator then runs */
    int accepted = 0;
    for (size_t k = 0; k < bytes; k++) {
        assert_int_not_equal(mr_data_iter_restore_global(pair[0], blob, k), MR_OK);
        memcpy(bad, blob, bytes);
        bad[k] ^= 0xA5;
        if (mr_data_iter_restore_global(pair[0], bad, bytes) == MR_OK) {
            accepted++;
            for (int s = 0; s < 3; s++) MR_ASSERT_OK(mr_data_iter_next(pair[0], &e, &end));
        }
    }
    print_message("  %zu truncations rejected; %d of %zu corrupted bytes gave another valid state (indices, counters)\n",
                  bytes, accepted, bytes);
    /* a shard before the shuffle: the replicas' states differ, there is no global one */
    mr_data_spec spec = {0};
    mr_shape s0 = mr_shape_make(0, NULL);
    MR_ASSERT_OK(mr_data_spec_add(&spec, "v", MR_I32, &s0));
    int32_t v[10] = {0};
    const void *data[1] = {v};
    mr_dataset *a = NULL, *b = NULL, *c = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&spec, 10, data, &a));
    MR_ASSERT_OK(mr_data_shard(a, 2, 0, &b));
    MR_ASSERT_OK(mr_data_shuffle(b, 4, 1, 1, &c));
    mr_data_iter *sh = NULL;
    MR_ASSERT_OK(mr_data_iter_new(c, &sh));
    void *x = NULL;
    size_t nx = 0;
    assert_int_equal(mr_data_iter_save_global(sh, &x, &nx), MR_ERR_UNSUPPORTED);
    assert_null(x);
    mr_data_iter_free(sh);
    mr_data_free(a);
    mr_data_free(b);
    mr_data_free(c);
    free(old);
    free(bad);
    free(blob);
    mr_data_iter_free(other);
    mr_data_iter_free(pair[0]);
    mr_data_iter_free(it);
}

/* ---- the trainer: sample logs across replica counts and resumes ------------------------------ */

#define T_STEPS 30
#define T_BATCH 16

typedef struct sample {
    long long pos, idx, epoch;
} sample;

static mr_train_cfg small(const char *dir, int replicas, int64_t steps) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 8, steps, T_BATCH);
    c.optim = mr_optim_cfg_default(MR_OPTIM_SGD);
    c.optim.lr = 0.05;
    c.optim.momentum = 0.9;
    c.shuffle = 500;
    c.seed = 11;
    c.eval_images = c.eval_labels = NULL;
    c.run_dir = c.ckpt_dir = dir;
    c.resume = "auto";
    c.replicas = replicas;
    c.comm_timeout_s = 60;
    c.tensorboard = 0;
    return c;
}

static const char *tdir(const char *tag) {
    static char d[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(d[k], sizeof d[k], "%s/%s", th_tmp_dir(), tag);
    return d[k];
}

/* Runs c with MIRROR_DATA_LOG=<tmp>/<log> (appending: a resumed run adds to its log). */
static void train_logged(const mr_train_cfg *c, const char *log, mr_train_result *r) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", th_tmp_dir(), log);
    assert_int_equal(setenv("MIRROR_DATA_LOG", path, 1), 0);
    MR_ASSERT_OK(mr_train(c, r));
    assert_int_equal(unsetenv("MIRROR_DATA_LOG"), 0);
}

/* The "<tag>" lines of every replica's log <tmp>/<log>.<r> (r < replicas; each must exist), sorted
 * by position: *n samples, malloc'd. */
static sample *read_log(const char *log, int replicas, const char *tag, int64_t *n) {
    int64_t cap = 1024, k = 0;
    sample *s = malloc(sizeof *s * (size_t)cap);
    for (int r = 0; r < replicas; r++) {
        char path[600], t[16];
        snprintf(path, sizeof path, "%s/%s.%d", th_tmp_dir(), log, r);
        FILE *f = fopen(path, "r");
        if (!f) fail_msg("%s: no sample log of replica %d", path, r);
        sample x;
        while (fscanf(f, "%15s %lld %lld %lld", t, &x.pos, &x.idx, &x.epoch) == 4) {
            if (strcmp(t, tag)) continue;
            if (k == cap) s = realloc(s, sizeof *s * (size_t)(cap *= 2));
            s[k++] = x;
        }
        assert_true(feof(f));
        fclose(f);
    }
    /* insertion into position order (positions are unique when nothing repeats; checked by the callers) */
    for (int64_t i = 1; i < k; i++) {
        sample x = s[i];
        int64_t j = i;
        for (; j > 0 && s[j - 1].pos > x.pos; j--) s[j] = s[j - 1];
        s[j] = x;
    }
    *n = k;
    return s;
}

/* The samples at positions [from, to) of two logs are the same, each position exactly once. */
static void same_samples(const sample *a, int64_t na, const sample *b, int64_t nb, int64_t from, int64_t to,
                         const char *what) {
    int64_t ia = 0, ib = 0;
    while (ia < na && a[ia].pos < from) ia++;
    while (ib < nb && b[ib].pos < from) ib++;
    for (int64_t p = from; p < to; p++, ia++, ib++) {
        if (ia >= na || a[ia].pos != p) fail_msg("%s: the reference consumed nothing or twice at position %lld", what, (long long)p);
        if (ib >= nb || b[ib].pos != p)
            fail_msg("%s: position %lld was %s", what, (long long)p, ib < nb && b[ib].pos < p ? "consumed twice" : "skipped");
        if (a[ia].idx != b[ib].idx || a[ia].epoch != b[ib].epoch)
            fail_msg("%s: position %lld is sample %lld (epoch %lld), the uninterrupted run's %lld (epoch %lld)", what,
                     (long long)p, b[ib].idx, b[ib].epoch, a[ia].idx, a[ia].epoch);
    }
    if (ib != nb) fail_msg("%s: %lld samples beyond position %lld", what, (long long)(nb - ib), (long long)to);
}

static void test_trainer_resume_other_world(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_result r;
    mr_train_cfg c = small(tdir("straight"), 2, T_STEPS);
    train_logged(&c, "straight.log", &r);
    int64_t nref = 0;
    sample *ref = read_log("straight.log", 2, "train", &nref);
    assert_int_equal(nref, T_STEPS * T_BATCH);
    /* 2 replicas for 15 steps, resumed on 1 and on 4 */
    c = small(tdir("half"), 2, T_STEPS / 2);
    train_logged(&c, "half.log", &r);
    char half_ckpt[4096];
    mr_ckpt_path(tdir("half"), T_STEPS / 2, half_ckpt, sizeof half_ckpt);
    /* {replicas, micro-batches per step}: the data position is the global sample count whatever
     * train.accumulate splits each replica's share into */
    static const int worlds[][2] = {{1, 1}, {4, 1}, {2, 1}, {1, 4}, {4, 2}};
    for (size_t k = 0; k < sizeof worlds / sizeof *worlds; k++) {
        const int m = worlds[k][0], acc = worlds[k][1];
        char tag[64], log[64];
        snprintf(tag, sizeof tag, "on%d-acc%d", m, acc);
        snprintf(log, sizeof log, "on%d-acc%d.log", m, acc);
        c = small(tdir(tag), m, T_STEPS);
        c.accumulate = acc;
        c.resume = half_ckpt;
        train_logged(&c, log, &r);
        assert_int_equal(r.resumed_from, T_STEPS / 2);
        int64_t n1 = 0, n2 = 0;
        sample *first = read_log("half.log", 2, "train", &n1), *second = read_log(log, m, "train", &n2);
        char what[128];
        snprintf(what, sizeof what, "2 replicas for %d steps", T_STEPS / 2);
        same_samples(ref, nref, first, n1, 0, T_STEPS / 2 * T_BATCH, what);
        snprintf(what, sizeof what, "resumed on %d replica(s), accumulate %d", m, acc);
        same_samples(ref, nref, second, n2, T_STEPS / 2 * T_BATCH, T_STEPS * T_BATCH, what);
        print_message("  2 replicas for %d steps, resumed on %d (accumulate %d): the %d samples of the uninterrupted "
                      "run, in its order\n", T_STEPS / 2, m, acc, T_STEPS * T_BATCH);
        free(first);
        free(second);
    }
    free(ref);
}

/* A resume with another train.batch: the data position is a sample count, so the resumed run's
 * first sample is the one after the checkpoint's last, and the rest follows the uninterrupted
 * sequence (its sample log positions count the new batch: step 15 of batch 32 starts at 480). */
static void test_trainer_resume_other_batch(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_result r;
    mr_train_cfg c = small(tdir("b-straight"), 2, 45);
    train_logged(&c, "b-straight.log", &r);
    c = small(tdir("b-half"), 2, T_STEPS / 2);
    train_logged(&c, "b-half.log", &r);
    char half_ckpt[4096];
    mr_ckpt_path(tdir("b-half"), T_STEPS / 2, half_ckpt, sizeof half_ckpt);
    c = small(tdir("b-on2"), 2, T_STEPS);
    c.batch = 2 * T_BATCH;
    c.resume = half_ckpt;
    train_logged(&c, "b-on2.log", &r);
    assert_int_equal(r.resumed_from, T_STEPS / 2);
    int64_t nref = 0, n2 = 0;
    sample *ref = read_log("b-straight.log", 2, "train", &nref), *second = read_log("b-on2.log", 2, "train", &n2);
    assert_int_equal(nref, 45 * T_BATCH);
    assert_int_equal(n2, T_STEPS / 2 * 2 * T_BATCH);
    const int64_t done = T_STEPS / 2 * T_BATCH, logged0 = T_STEPS / 2 * 2 * T_BATCH;
    for (int64_t k = 0; k < n2; k++) {
        if (second[k].pos != logged0 + k) fail_msg("batch 32 after 16: position %lld logged twice or skipped", (long long)(logged0 + k));
        const sample *want = &ref[done + k];
        assert_int_equal(want->pos, done + k);
        if (second[k].idx != want->idx || second[k].epoch != want->epoch)
            fail_msg("batch 32 after 16: sample %lld after the checkpoint is %lld (epoch %lld), the uninterrupted run's %lld "
                     "(epoch %lld)", (long long)k, second[k].idx, second[k].epoch, want->idx, want->epoch);
    }
    print_message("  2 replicas, batch %d for %d steps, resumed with batch %d: the next %lld samples are the "
                  "uninterrupted run's\n", T_BATCH, T_STEPS / 2, 2 * T_BATCH, (long long)n2);
    free(ref);
    free(second);
}

/* "<directory of this source file>/../fixtures/<name>" (as tests/unit/test_models_parity.c) */
static void fixture(const char *name, char *buf, size_t cap) {
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(buf, cap, "%.*s/../fixtures/%s", slash ? (int)(slash - file) : 1, slash ? file : ".", name);
}

/* tests/fixtures/ckpt_v1_world2.yaml's run, which wrote the fixture at step 10 */
static mr_train_cfg fixture_cfg(const char *dir, int64_t steps) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 2, steps, 8);
    c.optim = mr_optim_cfg_default(MR_OPTIM_SGD);
    c.optim.lr = 0.05;
    c.optim.momentum = 0.9;
    c.shuffle = 64;
    c.seed = 5;
    c.log_every = 5;
    c.eval_images = c.eval_labels = NULL;
    c.run_dir = c.ckpt_dir = dir;
    c.resume = "never";
    c.replicas = 2;
    c.comm_timeout_s = 60;
    c.tensorboard = 0;
    return c;
}

static void test_trainer_resume_old_checkpoint(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    char fx[4096];
    fixture("ckpt_v1_world2.h5", fx, sizeof fx);
    mr_ckpt_reader *rd = NULL;
    MR_ASSERT_OK(mr_ckpt_open(fx, 0, &rd));
    assert_true(mr_ckpt_has(rd, "state/data_iter/0") && mr_ckpt_has(rd, "state/data_iter/1"));
    assert_false(mr_ckpt_has(rd, "state/data_iter/global")); /* the older format */
    mr_ckpt_close(rd);
    mr_train_result r;
    mr_train_cfg c = fixture_cfg(tdir("fx-straight"), 20);
    train_logged(&c, "fx-straight.log", &r);
    c = fixture_cfg(tdir("fx-resumed"), 20);
    c.resume = fx;
    train_logged(&c, "fx-resumed.log", &r);
    assert_int_equal(r.resumed_from, 10);
    int64_t na = 0, nb = 0;
    sample *a = read_log("fx-straight.log", 2, "train", &na), *b = read_log("fx-resumed.log", 2, "train", &nb);
    same_samples(a, na, b, nb, 10 * 8, 20 * 8, "the older checkpoint resumed on 2 replicas");
    print_message("  %s (per-replica states) resumed on 2 replicas: steps 10..19 consume the uninterrupted run's "
                  "samples\n", fx);
    free(a);
    free(b);
}

/* Evaluation: each replica takes every world-th test image and its own last, partial batch; over
 * 1..4 replicas the logs hold each of the 10000 images exactly once (positions and images). */
static void test_eval_every_sample_once(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    for (int n = 1; n <= 4; n++) {
        mr_train_cfg c;
        th_fashion_mlp(&c, 8, 1, 48);
        c.replicas = n;
        c.comm_timeout_s = 60;
        c.eval_every = 0; /* evaluates once, at the end */
        char log[32];
        snprintf(log, sizeof log, "eval%d.log", n);
        mr_train_result r;
        train_logged(&c, log, &r);
        assert_int_equal(r.eval_samples, 10000);
        int64_t k = 0;
        sample *s = read_log(log, n, "eval", &k);
        assert_int_equal(k, 10000);
        for (int64_t p = 0; p < k; p++)
            if (s[p].pos != p || s[p].idx != p || s[p].epoch != 0)
                fail_msg("%d replicas: evaluation position %lld holds image %lld (position %lld)", n, (long long)p,
                         s[p].idx, s[p].pos);
        print_message("  %d replica(s): each of the 10000 test images evaluated exactly once\n", n);
        free(s);
    }
}

/* ---- the trainer with data.train.augment -------------------------------------------------------- */

/* The largest |a - b| over the /params of two checkpoints. */
static double max_param_diff(const char *a, const char *b) {
    mr_ckpt_reader *ra = NULL, *rb = NULL;
    MR_ASSERT_OK(mr_ckpt_open(a, 0, &ra));
    MR_ASSERT_OK(mr_ckpt_open(b, 0, &rb));
    char **names = NULL;
    int n = 0;
    double worst = 0;
    MR_ASSERT_OK(mr_ckpt_list(ra, "params", &names, &n));
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        char p[512];
        mr_dtype dt;
        mr_shape sh;
        snprintf(p, sizeof p, "params/%s", names[i]);
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

static mr_train_cfg small_cnn(const char *dir, int replicas, int64_t steps, int augment) {
    mr_train_cfg c = small(dir, replicas, steps);
    c.model = mr_model_cfg_default(MR_MODEL_CNN);
    c.model.ch1 = 4, c.model.ch2 = 4, c.model.hidden = 16;
    c.optim.lr = 0.02;
    if (augment) {
        c.augment.n = 3;
        c.augment.op[0].kind = MR_AUG_RANDOM_CROP, c.augment.op[0].size = 28, c.augment.op[0].pad = 4;
        c.augment.op[1].kind = MR_AUG_HFLIP, c.augment.op[1].p = 0.5;
        c.augment.op[2].kind = MR_AUG_NORMALIZE, c.augment.op[2].n = 1;
        c.augment.op[2].mean[0] = 0.286, c.augment.op[2].std[0] = 0.353;
    }
    return c;
}

/* The trainer's augmented samples are those of the global sequence whatever the replica count
 * and across a resume: 1 and 2 replicas, and 2 resumed on 1, train the same parameters up to
 * float rounding, while the same run without augmentation lands elsewhere. */
static void test_trainer_augment(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    enum { S = 8 };
    mr_train_result r;
    char path[4][4096];
    const char *tags[4] = {"aug1", "aug2", "aug2to1", "plain"};
    for (int k = 0; k < 4; k++) {
        mr_train_cfg c = small_cnn(tdir(tags[k]), k == 0 ? 1 : 2, k == 2 ? S / 2 : S, k != 3);
        MR_ASSERT_OK(mr_train(&c, &r));
        if (k == 2) {
            char half[4096];
            mr_ckpt_path(tdir(tags[k]), S / 2, half, sizeof half);
            c = small_cnn(tdir("aug2to1-b"), 1, S, 1);
            c.resume = half;
            MR_ASSERT_OK(mr_train(&c, &r));
            assert_int_equal(r.resumed_from, S / 2);
            mr_ckpt_path(tdir("aug2to1-b"), S, path[k], sizeof path[k]);
        } else {
            mr_ckpt_path(tdir(tags[k]), S, path[k], sizeof path[k]);
        }
    }
    const double d12 = max_param_diff(path[0], path[1]), d1r = max_param_diff(path[0], path[2]);
    const double dplain = max_param_diff(path[0], path[3]);
    print_message("  augmented CNN, %d steps: 1 vs 2 replicas max |param diff| %.3g, vs 2 resumed on 1 %.3g; vs no "
                  "augmentation %.3g\n", S, d12, d1r, dplain);
    assert_true(d12 < 1e-4 && d1r < 1e-4);
    assert_true(dplain > 100 * (d12 > d1r ? d12 : d1r) && dplain > 1e-3);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_global_sequence_any_world),
                                       cmocka_unit_test(test_global_state_errors),
                                       cmocka_unit_test(test_trainer_resume_other_world),
                                       cmocka_unit_test(test_trainer_resume_other_batch),
                                       cmocka_unit_test(test_trainer_resume_old_checkpoint),
                                       cmocka_unit_test(test_eval_every_sample_once),
                                       cmocka_unit_test(test_trainer_augment)};
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
