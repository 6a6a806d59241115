/* launch/config: the bad-config corpus (tests/configs/bad/NAME.yaml, each naming its expected message
 * in a first-line "# expect: ..." comment), the good configs and configs/NAME.yaml, --set overrides
 * and their errors, the to_yaml round trip, the hash, and sweep expansion. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "launch/config.h"

/* "<directory of this source file>/../<rel>": __FILE__ is absolute in the CMake build. */
static void src_path(const char *rel, char *buf, size_t cap) {
    const char *file = __FILE__;
    const char *slash = strrchr(file, '/');
    int dir_len = slash ? (int)(slash - file) : 1;
    snprintf(buf, cap, "%.*s/../%s", dir_len, slash ? file : ".", rel);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted *.yaml names in dir; returns the count (names malloc'd into out[]). */
static int list_yaml(const char *dir, char **out, int cap) {
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s", dir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 5 && !strcmp(de->d_name + l - 5, ".yaml") && n < cap) out[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(out, (size_t)n, sizeof out[0], cmp_str);
    return n;
}

/* Runs the test body with the working directory at tests/configs (the corpora use relative paths). */
static char g_old_cwd[1024];
static void enter_configs_dir(void) {
    char dir[1024];
    src_path("configs", dir, sizeof dir);
    assert_non_null(getcwd(g_old_cwd, sizeof g_old_cwd));
    assert_int_equal(chdir(dir), 0);
}
static void leave_configs_dir(void) { assert_int_equal(chdir(g_old_cwd), 0); }

/* The message starts with "<file>:<line>:<col>: " (or "--set:<col>: "); a required key that the
 * file does not have at all (nor its section) has no position: "<file>: ". */
static void assert_positioned(const char *msg, const char *file) {
    size_t l = strlen(file);
    if (strncmp(msg, file, l) || msg[l] != ':') fail_msg("message does not start with '%s:': %s", file, msg);
    if (msg[l + 1] == ' ' && strstr(msg, "missing required value")) return;
    int line = 0, col = 0, used = 0;
    if (sscanf(msg + l, ":%d:%d: %n", &line, &col, &used) != 2 || used == 0 || line < 1 || col < 1)
        fail_msg("message has no line:column: %s", msg);
}

static void test_bad_corpus(void **state) {
    (void)state;
    enter_configs_dir();
    char *names[256];
    int n = list_yaml("bad", names, 256);
    assert_true(n >= 20);
    for (int i = 0; i < n; i++) {
        char path[512], first[512] = "";
        snprintf(path, sizeof path, "bad/%s", names[i]);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        if (!fgets(first, sizeof first, f)) first[0] = '\0';
        fclose(f);
        first[strcspn(first, "\n")] = '\0';
        if (strncmp(first, "# expect: ", 10)) fail_msg("%s: first line must be '# expect: MESSAGE'", path);
        const char *want = first + 10;
        mr_experiment e;
        mr_clear_error();
        mr_status st = mr_experiment_load(path, &e);
        if (st == MR_OK) fail_msg("%s: parsed, expected an error containing \"%s\"", path, want);
        assert_true(st == MR_ERR_INVALID || st == MR_ERR_NOT_FOUND || st == MR_ERR_FORMAT);
        assert_null(e.yaml_text);
        const char *msg = mr_last_error();
        if (!strstr(msg, want)) fail_msg("%s: expected \"%s\" in \"%s\"", path, want, msg);
        assert_positioned(msg, names[i]);
        if (strstr(want, "no such file")) assert_int_equal(st, MR_ERR_NOT_FOUND);
        if (strstr(want, "YAML syntax")) assert_int_equal(st, MR_ERR_FORMAT);
        print_message("  %-24s %s\n", names[i], msg);
        free(names[i]);
    }
    leave_configs_dir();
}

/* A few positions checked exactly. */
static void test_positions(void **state) {
    (void)state;
    mr_experiment e;
    assert_int_equal(mr_experiment_parse("seed: 1\noptimizer:\n  type: sgd\n  lerning_rate: 0.1\n", "x.yaml", &e), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "x.yaml:4:3: unknown key 'lerning_rate' in optimizer (did you mean 'lr'?)"));
    assert_int_equal(mr_experiment_parse("train: {steps: 10, batch: 0}\n", "y.yaml", &e), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "y.yaml:1:27: train.batch: must be >= 1, got 0"));
    assert_int_equal(mr_experiment_parse("optimizer: {lr: fast}\n", "/some/dir/z.yaml", &e), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "z.yaml:1:17: optimizer.lr: expected a number, got 'fast'"));
    assert_int_equal(mr_experiment_parse("a: [1, 2\n", "s.yaml", &e), MR_ERR_FORMAT);
    assert_non_null(strstr(mr_last_error(), "s.yaml:2:1: YAML syntax error"));
}

static void parse_ok(const char *path) {
    mr_experiment e;
    mr_clear_error();
    if (mr_experiment_load(path, &e) != MR_OK) fail_msg("%s: %s", path, mr_last_error());
    assert_non_null(e.yaml_text);
    /* round trip: to_yaml -> parse gives the same resolved config */
    char *y1 = NULL, *y2 = NULL;
    MR_ASSERT_OK(mr_experiment_to_yaml(&e, &y1));
    mr_experiment e2;
    if (mr_experiment_parse(y1, "resolved.yaml", &e2) != MR_OK) fail_msg("%s resolved: %s\n%s", path, mr_last_error(), y1);
    MR_ASSERT_OK(mr_experiment_to_yaml(&e2, &y2));
    assert_string_equal(y1, y2);
    uint64_t h1, h2;
    MR_ASSERT_OK(mr_experiment_hash(&e, &h1));
    MR_ASSERT_OK(mr_experiment_hash(&e2, &h2));
    assert_true(h1 == h2);
    /* field-level spot checks of the round trip */
    assert_true(e.optimizer.lr == e2.optimizer.lr);
    assert_true(e.model.n_sizes == e2.model.n_sizes && e.model.type == e2.model.type);
    assert_int_equal(memcmp(&e.optimizer, &e2.optimizer, sizeof e.optimizer), 0);
    assert_int_equal(memcmp(e.model.sizes, e2.model.sizes, sizeof e.model.sizes), 0);
    assert_int_equal(memcmp(&e.data, &e2.data, sizeof e.data), 0);
    assert_int_equal(memcmp(&e.train, &e2.train, sizeof e.train), 0);
    assert_int_equal(memcmp(&e.checkpoint, &e2.checkpoint, sizeof e.checkpoint), 0);
    assert_int_equal(memcmp(e.sweep.params, e2.sweep.params, sizeof e.sweep.params), 0);
    free(y1);
    free(y2);
    mr_experiment_deinit(&e);
    mr_experiment_deinit(&e2);
}

static void test_good_configs(void **state) {
    (void)state;
    enter_configs_dir();
    char *names[64];
    int n = list_yaml("good", names, 64);
    assert_true(n >= 4);
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "good/%s", names[i]);
        parse_ok(path);
        free(names[i]);
    }
    mr_experiment e;
    MR_ASSERT_OK(mr_experiment_load("good/gpt_text.yaml", &e));
    assert_int_equal(e.model.type, MR_MODEL_GPT);
    assert_int_equal(e.model.embd, 64);
    assert_true(e.model.dropout == 0.1);
    assert_int_equal(e.data.train.source, MR_SRC_TEXT);
    assert_int_equal(e.data.eval.source, MR_SRC_NONE);
    assert_int_equal(e.optimizer.type, MR_OPTIM_ADAM);
    assert_true(e.optimizer.beta2 == 0.95);
    assert_int_equal(e.schedule.type, MR_SCHEDULE_LINEAR);
    assert_int_equal(e.precision.policy, MR_PREC_MIXED_F16);
    assert_true(e.precision.loss_scale.initial == 1024);
    assert_int_equal(e.train.accumulate, 4);
    assert_int_equal(e.distribute.n_devices, 2);
    assert_string_equal(e.distribute.devices[1], "cuda:1");
    assert_int_equal(e.distribute.backend, MR_BACKEND_NCCL);
    assert_true(e.distribute.shard_optimizer);
    mr_experiment_deinit(&e);
    MR_ASSERT_OK(mr_experiment_load("good/hdf5_dotted.yaml", &e));
    assert_int_equal(e.data.eval.source, MR_SRC_HDF5);
    assert_string_equal(e.data.eval.x_dataset, "images");
    mr_experiment_deinit(&e);
    leave_configs_dir();
}

static void test_example_configs(void **state) {
    (void)state;
    char dir[1024];
    src_path("../configs", dir, sizeof dir);
    char *names[64];
    int n = list_yaml(dir, names, 64);
    assert_true(n >= 3);
    for (int i = 0; i < n; i++) {
        char path[1536];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        parse_ok(path);
        free(names[i]);
    }
    char path[1536];
    snprintf(path, sizeof path, "%s/default.yaml", dir);
    mr_experiment e;
    MR_ASSERT_OK(mr_experiment_load(path, &e));
    assert_int_equal(e.model.type, MR_MODEL_CNN);
    assert_int_equal(e.model.ch1, 32);
    assert_int_equal(e.model.ch2, 64);
    assert_int_equal(e.optimizer.type, MR_OPTIM_ADAMW);
    assert_true(e.optimizer.lr == 2e-3);
    assert_int_equal(e.schedule.type, MR_SCHEDULE_COSINE);
    assert_int_equal(e.schedule.warmup, 100);
    assert_int_equal(e.train.batch, 128);
    assert_int_equal(e.train.steps, 2000);
    assert_int_equal(e.train.eval_every, 500);
    assert_int_equal(e.train.log_every, 50);
    assert_string_equal(e.checkpoint.dir, "runs/default");
    assert_string_equal(e.checkpoint.resume, "auto");
    assert_int_equal(e.data.train.shuffle, 10000);
    assert_true(e.precision.loss_scale.initial == 32768 && e.precision.loss_scale.growth_interval == 2000);
    mr_experiment_deinit(&e);
}

static void test_defaults(void **state) {
    (void)state;
    mr_experiment e = mr_experiment_default();
    assert_true(e.precision.loss_scale.initial == 32768);
    assert_int_equal(e.precision.loss_scale.growth_interval, 2000);
    assert_true(e.precision.loss_scale.growth_factor == 2 && e.precision.loss_scale.backoff_factor == 0.5);
    assert_true(e.precision.loss_scale.min == 1);
    assert_int_equal(e.sweep.method, MR_SWEEP_NONE);
    assert_null(e.yaml_text);
    mr_experiment_deinit(&e);
    mr_experiment_deinit(NULL);
}

static void test_set(void **state) {
    (void)state;
    mr_experiment e = mr_experiment_default();
    MR_ASSERT_OK(mr_experiment_set(&e, "optimizer.lr=3e-4"));
    assert_true(e.optimizer.lr == 3e-4);
    MR_ASSERT_OK(mr_experiment_set(&e, "model.type=mlp"));
    MR_ASSERT_OK(mr_experiment_set(&e, "model.sizes=[784, 64, 10]"));
    assert_int_equal(e.model.n_sizes, 3);
    assert_int_equal(e.model.sizes[1], 64);
    MR_ASSERT_OK(mr_experiment_set(&e, "checkpoint.dir=runs/it's here"));
    assert_string_equal(e.checkpoint.dir, "runs/it's here");
    MR_ASSERT_OK(mr_experiment_set(&e, "distribute.devices=[0, 1]"));
    assert_int_equal(e.distribute.n_devices, 2);
    MR_ASSERT_OK(mr_experiment_set(&e, "distribute.devices=auto"));
    assert_int_equal(e.distribute.n_devices, 0);
    MR_ASSERT_OK(mr_experiment_set(&e, "optimizer.type=sgd")); /* nesterov applies to sgd only */
    MR_ASSERT_OK(mr_experiment_set(&e, "optimizer.nesterov=true"));
    assert_true(e.optimizer.nesterov);
    MR_ASSERT_OK(mr_experiment_set(&e, "sweep.params.optimizer.lr={min: 1e-4, max: 1e-2, log: true}"));
    MR_ASSERT_OK(mr_experiment_set(&e, "sweep.method=random"));
    assert_int_equal(e.sweep.n_params, 1);
    assert_true(e.sweep.params[0].log);

    /* errors leave e unchanged */
    mr_experiment before = e;
    struct { const char *set, *want; mr_status st; } bad[] = {
        {"optimizer.lr=fast", "--set:1: optimizer.lr: expected a number, got 'fast'", MR_ERR_INVALID},
        {"optimizer.lerning_rate=0.1", "--set:1: unknown key 'optimizer.lerning_rate' (did you mean 'optimizer.lr'?)", MR_ERR_INVALID},
        {"optimizr.lr=0.1", "unknown key 'optimizr.lr' (did you mean 'optimizer.lr'?)", MR_ERR_INVALID},
        {"train.batch=0", "--set:1: train.batch: must be >= 1, got 0", MR_ERR_INVALID},
        {"optimizer.type=adamz", "optimizer.type: expected one of sgd, adam, adamw, got 'adamz'", MR_ERR_INVALID},
        {"optimizer", "expected key=value, got 'optimizer'", MR_ERR_INVALID},
        {"optimizer=sgd", "'optimizer' is a section", MR_ERR_INVALID},
        {"optimizer.lr=", "optimizer.lr: expected a number, got ''", MR_ERR_INVALID},
        {"model.sizes=[784, 10", "model.sizes: YAML syntax error in the value", MR_ERR_FORMAT},
        {"model.channels=[1, 2, 3]", "model.channels: expected 2 integers, got 3", MR_ERR_INVALID},
        {"data.train.images=/x/y", "data.train.images: no such file '/x/y'", MR_ERR_NOT_FOUND},
        {"sweep.params.train.btch=[1, 2]", "did you mean 'train.batch'", MR_ERR_INVALID},
        {"sweep.params.train.batch=[1, 0]", "train.batch: must be >= 1, got 0", MR_ERR_INVALID},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mr_status st = mr_experiment_set(&e, bad[i].set);
        if (st != bad[i].st) fail_msg("--set %s: status %d, want %d (%s)", bad[i].set, st, bad[i].st, mr_last_error());
        if (!strstr(mr_last_error(), bad[i].want)) fail_msg("--set %s: want \"%s\" in \"%s\"", bad[i].set, bad[i].want, mr_last_error());
        assert_int_equal(strncmp(mr_last_error(), "--set:", 6), 0);
        assert_int_equal(memcmp(&before, &e, sizeof e), 0);
    }
    /* cross-key rules are checked once the overrides are in */
    MR_ASSERT_OK(mr_experiment_set(&e, "train.accumulate=3"));
    mr_clear_error();
    assert_int_equal(mr_experiment_check(&e, "--set"), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "data.train.source: missing required value"));
    mr_experiment_deinit(&e);
}

/* Keys that have no effect for the chosen model, source, optimizer, schedule or precision: an
 * error with the key's position in a file, an error from --set, a warning (and dropped) when a
 * --set override made a file's key pointless; the resolved YAML lists only what applies; the
 * cross-key checks after --set point at the key's real origin (not "<file>:1:1"). */
static void test_unused_keys(void **state) {
    (void)state;
    const char *data = "data: {train: {source: idx, images: /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz, "
                       "labels: /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz}}\n";
    char text[1024];
    mr_experiment e;
    snprintf(text, sizeof text, "%smodel: {type: cnn, dropout: 0.5}\n", data);
    assert_int_equal(mr_experiment_parse(text, "x.yaml", &e), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "x.yaml:2:20: model.dropout: has no effect with model.type cnn (only gpt uses it)"));
    /* the same key is fine where it applies */
    snprintf(text, sizeof text, "%smodel: {type: gpt, dropout: 0.5}\noptimizer: {type: sgd, momentum: 0.5}\n", data);
    MR_ASSERT_OK(mr_experiment_parse(text, "x.yaml", &e));
    /* the resolved YAML of a gpt with sgd lists neither a cnn's nor an mlp's keys, nor adam's */
    char *y = NULL;
    MR_ASSERT_OK(mr_experiment_to_yaml(&e, &y));
    const char *absent[] = {"sizes:", "channels:", "hidden:", "classes:", "input:", "beta1:", "  eps: ", "loss_scale",
                            "step_size:", "gamma:", "x_dataset:", "path:", "trials:", "token_bytes:"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        if (strstr(y, absent[i])) fail_msg("resolved YAML lists '%s', which has no effect:\n%s", absent[i], y);
    const char *present[] = {"vocab: ", "dropout: 0.5", "momentum: 0.5", "images: ", "progress: true"};
    for (size_t i = 0; i < sizeof present / sizeof present[0]; i++)
        if (!strstr(y, present[i])) fail_msg("resolved YAML lacks '%s':\n%s", present[i], y);
    free(y);
    /* --set of a key that does not apply: an error naming --set */
    MR_ASSERT_OK(mr_experiment_set(&e, "optimizer.beta2=0.95"));
    assert_int_equal(mr_experiment_check(&e, "x.yaml"), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "--set: optimizer.beta2: has no effect with optimizer.type sgd"));
    mr_experiment_deinit(&e);
    /* --set model.type=mlp on a cnn file: the file's channels are dropped (a warning), not an error */
    snprintf(text, sizeof text, "%smodel: {type: cnn, channels: [8, 16]}\ntrain: {batch: 100}\n", data);
    MR_ASSERT_OK(mr_experiment_parse(text, "c.yaml", &e));
    MR_ASSERT_OK(mr_experiment_set(&e, "model.type=mlp"));
    MR_ASSERT_OK(mr_experiment_check(&e, "c.yaml"));
    MR_ASSERT_OK(mr_experiment_to_yaml(&e, &y));
    if (strstr(y, "channels:") || !strstr(y, "sizes:")) fail_msg("after --set model.type=mlp:\n%s", y);
    free(y);
    /* a cross-key error after --set names the file's line of the key, or --set */
    MR_ASSERT_OK(mr_experiment_set(&e, "train.accumulate=3"));
    assert_int_equal(mr_experiment_check(&e, "c.yaml"), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "c.yaml:3:9: train.batch: must be a multiple of train.accumulate (3), got 100"));
    MR_ASSERT_OK(mr_experiment_set(&e, "train.batch=10"));
    assert_int_equal(mr_experiment_check(&e, "c.yaml"), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "--set: train.batch: must be a multiple"));
    mr_experiment_deinit(&e);
    /* a sweep over optimizer.type: momentum applies to the sgd trials, so it is accepted */
    snprintf(text, sizeof text, "%soptimizer: {type: adamw, momentum: 0.8}\nsweep: {method: grid, params: {optimizer.type: [sgd, adamw]}}\n",
             data);
    MR_ASSERT_OK(mr_experiment_parse(text, "s.yaml", &e));
    mr_experiment *t;
    int n;
    MR_ASSERT_OK(mr_sweep_expand(&e, &t, &n));
    assert_int_equal(n, 2);
    MR_ASSERT_OK(mr_experiment_to_yaml(&t[0], &y));
    assert_non_null(strstr(y, "momentum: 0.8"));
    free(y);
    MR_ASSERT_OK(mr_experiment_to_yaml(&t[1], &y));
    assert_null(strstr(y, "momentum:"));
    free(y);
    mr_sweep_free(t, n);
    mr_experiment_deinit(&e);
}

static void test_hash(void **state) {
    (void)state;
    mr_experiment a = mr_experiment_default(), b = mr_experiment_default();
    uint64_t ha, hb;
    MR_ASSERT_OK(mr_experiment_hash(&a, &ha));
    MR_ASSERT_OK(mr_experiment_hash(&b, &hb));
    assert_true(ha == hb);
    b.yaml_text = strdup("seed: 1\n"); /* the original text does not matter, only resolved values */
    MR_ASSERT_OK(mr_experiment_hash(&b, &hb));
    assert_true(ha == hb);
    const char *sets[] = {"optimizer.lr=0.0010000000000000002", "seed=2", "model.hidden=64", "checkpoint.dir=runs/x",
                          "distribute.devices=[a]", "sweep.params.seed=[1, 2]", "precision.policy=mixed_float16"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        mr_experiment c;
        MR_ASSERT_OK(mr_experiment_copy(&c, &a));
        MR_ASSERT_OK(mr_experiment_set(&c, sets[i]));
        uint64_t hc;
        MR_ASSERT_OK(mr_experiment_hash(&c, &hc));
        if (hc == ha) fail_msg("hash unchanged by --set %s", sets[i]);
        mr_experiment_deinit(&c);
    }
    /* keys that have no effect for the choices (an mlp's sizes on the default cnn, the loss scale in
     * float32) are not in the resolved text, so they do not change the hash */
    const char *unused[] = {"model.sizes=[784, 10]", "precision.loss_scale.min=2", "optimizer.momentum=0.5"};
    for (size_t i = 0; i < sizeof unused / sizeof unused[0]; i++) {
        mr_experiment c;
        MR_ASSERT_OK(mr_experiment_copy(&c, &a));
        MR_ASSERT_OK(mr_experiment_set(&c, unused[i]));
        uint64_t hc;
        MR_ASSERT_OK(mr_experiment_hash(&c, &hc));
        if (hc != ha) fail_msg("hash changed by --set %s, which has no effect", unused[i]);
        mr_experiment_deinit(&c);
    }
    /* not pinned: it changes with any key or default; ranks compare it within one build */
    print_message("  default hash %016llx\n", (unsigned long long)ha);
    mr_experiment_deinit(&b);
}

static void test_sweep_grid(void **state) {
    (void)state;
    enter_configs_dir();
    mr_experiment base;
    MR_ASSERT_OK(mr_experiment_load("good/grid.yaml", &base));
    mr_experiment *t;
    int n;
    MR_ASSERT_OK(mr_sweep_expand(&base, &t, &n));
    assert_int_equal(n, 3 * 2 * 2);
    /* first param outermost, last fastest */
    const double lrs[3] = {0.1, 0.01, 0.001};
    for (int i = 0; i < n; i++) {
        assert_true(t[i].optimizer.lr == lrs[i / 4]);
        assert_int_equal(t[i].optimizer.type, (i / 2) % 2 ? MR_OPTIM_ADAMW : MR_OPTIM_SGD);
        assert_int_equal(t[i].train.batch, i % 2 ? 64 : 32);
        assert_int_equal(t[i].sweep.method, MR_SWEEP_NONE);
        assert_int_equal(t[i].sweep.n_params, 0);
        MR_ASSERT_OK(mr_experiment_check(&t[i], "trial"));
    }
    uint64_t h0, h1;
    MR_ASSERT_OK(mr_experiment_hash(&t[0], &h0));
    MR_ASSERT_OK(mr_experiment_hash(&t[1], &h1));
    assert_true(h0 != h1);
    mr_sweep_free(t, n);
    mr_sweep_free(NULL, 0);
    /* no sweep: an error */
    mr_experiment d = mr_experiment_default();
    assert_int_equal(mr_sweep_expand(&d, &t, &n), MR_ERR_INVALID);
    mr_experiment_deinit(&base);
    leave_configs_dir();
}

static void test_sweep_random(void **state) {
    (void)state;
    char path[1024];
    src_path("../configs/sweep.yaml", path, sizeof path);
    mr_experiment base;
    MR_ASSERT_OK(mr_experiment_load(path, &base));
    MR_ASSERT_OK(mr_experiment_set(&base, "sweep.trials=400"));
    MR_ASSERT_OK(mr_experiment_set(&base, "sweep.params.train.steps={min: 10, max: 20}"));
    mr_experiment *t, *u;
    int n, m;
    MR_ASSERT_OK(mr_sweep_expand(&base, &t, &n));
    MR_ASSERT_OK(mr_sweep_expand(&base, &u, &m));
    assert_int_equal(n, 400);
    assert_int_equal(m, 400);
    int below_1e3 = 0, seen_steps[11] = {0}, wd_seen[3] = {0};
    for (int i = 0; i < n; i++) {
        /* deterministic: the same seed gives the same trials */
        assert_true(t[i].optimizer.lr == u[i].optimizer.lr);
        assert_true(t[i].optimizer.lr >= 1e-4 && t[i].optimizer.lr <= 1e-2);
        below_1e3 += t[i].optimizer.lr < 1e-3;
        assert_true(t[i].train.steps >= 10 && t[i].train.steps <= 20);
        seen_steps[t[i].train.steps - 10]++;
        double wd = t[i].optimizer.weight_decay;
        assert_true(wd == 0.0 || wd == 0.01 || wd == 0.1);
        wd_seen[wd == 0.0 ? 0 : wd == 0.01 ? 1 : 2]++;
        assert_true(t[i].train.batch == 64 || t[i].train.batch == 128);
    }
    /* log-uniform on [1e-4, 1e-2]: half the mass below 1e-3 (uniform would put 9%) */
    print_message("  random sweep: %d/400 lr below 1e-3\n", below_1e3);
    assert_true(below_1e3 > 160 && below_1e3 < 240);
    for (int k = 0; k < 11; k++) assert_true(seen_steps[k] > 0);
    for (int k = 0; k < 3; k++) assert_true(wd_seen[k] > 80);
    /* another seed, other trials */
    MR_ASSERT_OK(mr_experiment_set(&base, "sweep.seed=8"));
    mr_experiment *v;
    MR_ASSERT_OK(mr_sweep_expand(&base, &v, &m));
    int same = 0;
    for (int i = 0; i < n; i++) same += v[i].optimizer.lr == t[i].optimizer.lr;
    assert_true(same < 5);
    mr_sweep_free(t, n);
    mr_sweep_free(u, n);
    mr_sweep_free(v, m);
    mr_experiment_deinit(&base);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),     cmocka_unit_test(test_bad_corpus),     cmocka_unit_test(test_positions),
        cmocka_unit_test(test_good_configs), cmocka_unit_test(test_example_configs), cmocka_unit_test(test_set),
        cmocka_unit_test(test_unused_keys), cmocka_unit_test(test_hash),         cmocka_unit_test(test_sweep_grid),     cmocka_unit_test(test_sweep_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
