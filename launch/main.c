/* The `mirror` command line: train, sweep, version, help. Library code reports through mr_status;
 * this file alone decides exit codes (0 success, 1 a run-time failure, 2 a usage or configuration
 * error) and prints "mirror: error: ..." with a HINT line. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "launch/config.h"
#include "launch/trainer.h"

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

static const char *g_usage =
    "usage: mirror <command> [options]\n"
    "\n"
    "commands:\n"
    "  train CONFIG [--set key=value ...]   train the experiment described by the YAML file CONFIG\n"
    "  sweep CONFIG [--set key=value ...]   run every trial of CONFIG's sweep: section, one after another,\n"
    "                                       each in <checkpoint.dir>/trial-NNN; writes results.csv sorted by\n"
    "                                       the sweep metric; finished trials are skipped when run again\n"
    "  version                              print mirror's version\n"
    "  help [COMMAND]                       this text, or a command's\n"
    "\n"
    "Configuration keys are described in README.md (\"Experiments\"). --set overrides any key,\n"
    "e.g. --set optimizer.lr=3e-4 --set train.steps=100.\n";

static const char *g_train_help =
    "usage: mirror train CONFIG [--set key=value ...]\n"
    "\n"
    "Trains the model of CONFIG on its data, printing progress (step, loss, learning rate, samples/s,\n"
    "where the step time goes, ETA), evaluating every train.eval_every steps and at the end. Writes\n"
    "<checkpoint.dir>/config.yaml (the resolved configuration) and <checkpoint.dir>/metrics.jsonl.\n"
    "Exit status: 0 on success, 2 for a bad configuration, 1 when training fails.\n";

static const char *g_sweep_help =
    "usage: mirror sweep CONFIG [--set key=value ...]\n"
    "\n"
    "Expands CONFIG's sweep: section (grid: every combination; random: sweep.trials draws seeded by\n"
    "sweep.seed) and trains each trial in <checkpoint.dir>/trial-NNN. A trial whose result.txt exists\n"
    "is not run again, so an interrupted sweep continues where it stopped. Writes\n"
    "<checkpoint.dir>/results.csv sorted by sweep.metric (eval_accuracy, eval_loss, eval_perplexity\n"
    "or loss) in the direction of sweep.goal.\n";

static int fail(int code, const char *hint) {
    fprintf(stderr, "mirror: error: %s\n", mr_last_error());
    if (hint) fprintf(stderr, "HINT: %s\n", hint);
    return code;
}

/* Loads CONFIG and applies the --set overrides in argv[first..argc). */
static mr_status load(int argc, char **argv, int first, mr_experiment *e) {
    mr_status st = mr_experiment_load(argv[first - 1], e);
    if (st != MR_OK) return st;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set") && i + 1 < argc) {
            a = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            a += 6;
        } else {
            return mr_set_error(MR_ERR_INVALID, "unknown argument '%s'", argv[i]);
        }
        if ((st = mr_experiment_set(e, a)) != MR_OK) return st;
    }
    return mr_experiment_check(e, argv[first - 1]);
}

/* The trainer's view of an experiment; MR_ERR_UNSUPPORTED for what the trainer cannot do yet. */
static mr_status to_train_cfg(const mr_experiment *e, const char *run_dir, mr_train_cfg *c) {
    *c = mr_train_cfg_default();
    c->model = e->model;
    c->optim = mr_optim_cfg_default((mr_optim_kind)e->optimizer.type);
    c->optim.lr = e->optimizer.lr;
    c->optim.momentum = e->optimizer.momentum;
    c->optim.nesterov = e->optimizer.nesterov;
    c->optim.weight_decay = e->optimizer.weight_decay;
    c->optim.beta1 = e->optimizer.beta1;
    c->optim.beta2 = e->optimizer.beta2;
    c->optim.eps = e->optimizer.eps;
    c->grad_clip = e->optimizer.grad_clip;
    c->schedule.kind = (mr_schedule_kind)e->schedule.type;
    c->schedule.warmup = e->schedule.warmup;
    c->schedule.step_size = e->schedule.step_size;
    c->schedule.gamma = e->schedule.gamma;
    c->schedule.min_lr = e->schedule.min_lr;
    c->steps = e->train.steps;
    c->batch = e->train.batch;
    c->accumulate = e->train.accumulate > 0 ? e->train.accumulate : 1;
    c->eval_every = e->train.eval_every;
    c->log_every = e->train.log_every;
    c->seed = (uint64_t)e->seed;
    c->run_dir = run_dir;
    if (e->precision.policy == MR_PREC_MIXED_BF16) c->compute = MR_BF16;
    else if (e->precision.policy != MR_PREC_F32)
        return mr_set_error(MR_ERR_UNSUPPORTED, "precision.policy: mixed_float16 is not implemented yet "
                                                "(mixed_bfloat16 and float32 are)");
    const mr_data_cfg *tr = &e->data.train, *ev = &e->data.eval;
    if (tr->source == MR_SRC_IDX) {
        c->train_images = tr->images;
        c->train_labels = tr->labels;
        c->shuffle = tr->shuffle;
    } else if (tr->source == MR_SRC_TOKENS) {
        c->train_tokens = tr->path;
        c->token_bytes = (int)tr->token_bytes;
        c->shuffle = tr->shuffle;
    } else if (tr->source == MR_SRC_TEXT) {
        c->train_text = tr->path;
        c->shuffle = tr->shuffle;
        c->sample_chars = 400; /* a character model prints what it learned */
    } else {
        return mr_set_error(MR_ERR_UNSUPPORTED, "data.train.source: the trainer reads idx, tokens and text sources so far");
    }
    if (ev->source == MR_SRC_IDX) {
        c->eval_images = ev->images;
        c->eval_labels = ev->labels;
    } else if (ev->source == MR_SRC_TOKENS) {
        c->eval_tokens = ev->path;
    } else if (ev->source == MR_SRC_TEXT) {
        c->eval_text = ev->path;
    } else if (ev->source != MR_SRC_NONE) {
        return mr_set_error(MR_ERR_UNSUPPORTED, "data.eval.source: the trainer reads idx, tokens and text sources so far");
    }
    return MR_OK;
}

/* Writes the resolved config to <dir>/config.yaml (temporary name, then rename). */
static mr_status save_config(const mr_experiment *e, const char *dir) {
    char *yaml = NULL, path[4096], tmp[4200];
    mr_status st = mr_experiment_to_yaml(e, &yaml);
    if (st != MR_OK) return st;
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(yaml);
        return mr_set_error(MR_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    }
    int ok = fputs(yaml, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    free(yaml);
    if (!ok || rename(tmp, path) != 0) return mr_set_error(MR_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    return MR_OK;
}

static mr_status run_one(const mr_experiment *e, const char *dir, mr_train_result *r) {
    mr_train_cfg c;
    mr_status st = mr_mkdirs(dir);
    if (st == MR_OK) st = save_config(e, dir);
    if (st == MR_OK) st = to_train_cfg(e, dir, &c);
    if (st == MR_OK) st = mr_train(&c, r);
    return st;
}

static int cmd_train(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(g_train_help, argc < 3 ? stderr : stdout);
        return argc < 3 ? EXIT_USAGE : 0;
    }
    mr_experiment e = mr_experiment_default();
    mr_status st = load(argc, argv, 3, &e);
    if (st != MR_OK) {
        mr_experiment_deinit(&e);
        return fail(EXIT_USAGE, "fix the key named above in the config file or the --set argument "
                                "(see README.md, \"Experiments\")");
    }
    char dir[MR_CFG_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", e.checkpoint.dir[0] ? e.checkpoint.dir : "runs/default");
    mr_train_result r;
    st = run_one(&e, dir, &r);
    mr_experiment_deinit(&e);
    if (st == MR_ERR_UNSUPPORTED || st == MR_ERR_INVALID) return fail(EXIT_USAGE, "change the setting named above");
    if (st != MR_OK) return fail(EXIT_RUNTIME, "see the message above; metrics so far are in the run directory");
    printf("trained %lld steps in %.1f s: loss %.4f", (long long)r.steps, r.seconds, r.last_loss);
    if (!isnan(r.eval_accuracy)) printf(", eval accuracy %.4f", r.eval_accuracy);
    if (!isnan(r.eval_perplexity)) printf(", eval perplexity %.3f", r.eval_perplexity);
    printf("; run directory %s\n", dir);
    if (r.sample[0]) printf("\nsample:\n%s\n", r.sample);
    return 0;
}

typedef struct trial_row {
    int index;
    double metric;
    char line[4400]; /* a CSV row: index, directory (up to 4 KiB), numbers */
} trial_row;

static int cmp_rows_max(const void *a, const void *b) {
    const trial_row *x = a, *y = b;
    return (x->metric < y->metric) - (x->metric > y->metric);
}

static int cmp_rows_min(const void *a, const void *b) { return -cmp_rows_max(a, b); }

static double pick_metric(const char *m, const mr_train_result *r) {
    if (!strcmp(m, "eval_loss")) return r->eval_loss;
    if (!strcmp(m, "eval_perplexity")) return r->eval_perplexity;
    if (!strcmp(m, "loss")) return r->last_loss;
    return r->eval_accuracy;
}

static int cmd_sweep(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(g_sweep_help, argc < 3 ? stderr : stdout);
        return argc < 3 ? EXIT_USAGE : 0;
    }
    mr_experiment e = mr_experiment_default();
    mr_experiment *trials = NULL;
    int n = 0, code = 0;
    mr_status st = load(argc, argv, 3, &e);
    if (st == MR_OK && e.sweep.method == MR_SWEEP_NONE)
        st = mr_set_error(MR_ERR_INVALID, "%s: has no sweep: section", argv[2]);
    if (st == MR_OK) st = mr_sweep_expand(&e, &trials, &n);
    if (st != MR_OK) {
        mr_experiment_deinit(&e);
        return fail(EXIT_USAGE, "fix the sweep section named above (see README.md, \"Sweeps\")");
    }
    const char *base = e.checkpoint.dir[0] ? e.checkpoint.dir : "runs/sweep";
    trial_row *rows = calloc((size_t)n, sizeof *rows);
    if (!rows || mr_mkdirs(base) != MR_OK) {
        code = fail(EXIT_RUNTIME, NULL);
        goto done;
    }
    for (int t = 0; t < n; t++) {
        char dir[4096], result[4200];
        snprintf(dir, sizeof dir, "%s/trial-%03d", base, t);
        snprintf(result, sizeof result, "%s/result.txt", dir);
        rows[t].index = t;
        FILE *f = fopen(result, "r");
        if (f) { /* finished in an earlier run */
            int ok = fscanf(f, "%lf\n", &rows[t].metric) == 1 && fgets(rows[t].line, sizeof rows[t].line, f) != NULL;
            fclose(f);
            if (ok) {
                printf("trial %d/%d: done before, %s = %g\n", t + 1, n, e.sweep.metric, rows[t].metric);
                continue;
            }
        }
        printf("trial %d/%d\n", t + 1, n);
        mr_train_result r;
        st = run_one(&trials[t], dir, &r);
        if (st != MR_OK) {
            code = fail(st == MR_ERR_INVALID || st == MR_ERR_UNSUPPORTED ? EXIT_USAGE : EXIT_RUNTIME,
                        "fix the trial's setting or data; finished trials will be skipped when run again");
            goto done;
        }
        rows[t].metric = pick_metric(e.sweep.metric, &r);
        /* the trial's own values are in <dir>/config.yaml */
        snprintf(rows[t].line, sizeof rows[t].line, "%d,%s,%.6g,%.6g,%.6g\n", t, dir, rows[t].metric, r.last_loss,
                 r.seconds);
        f = fopen(result, "w");
        int written = f && fprintf(f, "%.17g\n%s", rows[t].metric, rows[t].line) >= 0;
        if (f && fclose(f) != 0) written = 0;
        if (!written) {
            mr_set_error(MR_ERR_IO, "cannot write '%s': %s", result, strerror(errno));
            code = fail(EXIT_RUNTIME, NULL);
            goto done;
        }
    }
    qsort(rows, (size_t)n, sizeof *rows, e.sweep.goal == MR_GOAL_MIN ? cmp_rows_min : cmp_rows_max);
    char csv[4096];
    snprintf(csv, sizeof csv, "%s/results.csv", base);
    FILE *f = fopen(csv, "w");
    if (!f) {
        code = fail(EXIT_RUNTIME, NULL);
        goto done;
    }
    fprintf(f, "trial,dir,%s,loss,seconds\n", e.sweep.metric);
    for (int t = 0; t < n; t++) fprintf(f, "%s", rows[t].line[0] ? rows[t].line : "\n");
    fclose(f);
    printf("%d trials; best %s = %g (trial %d); results in %s\n", n, e.sweep.metric, rows[0].metric, rows[0].index, csv);
done:
    free(rows);
    mr_sweep_free(trials, n);
    mr_experiment_deinit(&e);
    return code;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (argc >= 3 && !strcmp(argv[2], "train")) fputs(g_train_help, stdout);
        else if (argc >= 3 && !strcmp(argv[2], "sweep")) fputs(g_sweep_help, stdout);
        else fputs(g_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("mirror %s\n", MIRROR_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "train")) return cmd_train(argc, argv);
    if (!strcmp(argv[1], "sweep")) return cmd_sweep(argc, argv);
    fprintf(stderr, "mirror: error: unknown command '%s'\nHINT: mirror --help lists the commands\n", argv[1]);
    return EXIT_USAGE;
}
