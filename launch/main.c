/* The `mirror` command line: train, eval, inspect, summary, sweep, doctor, version, help. Library code reports through mr_status;
 * this file alone decides exit codes (0 success, 1 a run-time failure, 2 a usage or configuration
 * error) and prints "mirror: error: ..." with a HINT line. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint/ckpt.h"
#include "core/log.h"
#include "distribute/comm.h"
#include "launch/config.h"
#include "train/train.h"

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

static const char *g_usage =
    "usage: mirror <command> [options]\n"
    "\n"
    "commands:\n"
    "  train CONFIG [--set key=value ...] [--quiet]\n"
    "                                       train the experiment described by the YAML file CONFIG\n"
    "  eval CONFIG [--checkpoint PATH]      evaluate a checkpoint (default: the newest in checkpoint.dir)\n"
    "  inspect PATH                         print what a checkpoint holds\n"
    "  summary CONFIG [--set key=value ...] the model's layers, output shapes, parameter counts and the\n"
    "                                       memory of one training step (parameters, gradients, optimizer,\n"
    "                                       activations) for the configured batch and precision\n"
    "  sweep CONFIG [--set key=value ...]   run every trial of CONFIG's sweep: section, one after another,\n"
    "                                       each in <checkpoint.dir>/trial-NNN; writes results.csv sorted by\n"
    "                                       the sweep metric; finished trials are skipped when run again\n"
    "  doctor                               check this machine and build: versions of mirror, MPI, HDF5,\n"
    "                                       CUDA, cuBLAS, cuDNN, NCCL; the CPU and GPUs; a GEMM on each\n"
    "                                       device against the f64 reference (exit 1 if one fails)\n"
    "  version                              print mirror's version\n"
    "  help [COMMAND]                       this text, or a command's\n"
    "\n"
    "Configuration keys are described in README.md (\"Experiments\"). --set overrides any key,\n"
    "e.g. --set optimizer.lr=3e-4 --set train.steps=100.\n";

static const char *g_train_help =
    "usage: mirror train CONFIG [--set key=value ...] [--quiet]\n"
    "\n"
    "Trains the model of CONFIG on its data, printing progress (step, loss, learning rate, samples/s,\n"
    "where the step time goes, ETA), evaluating every train.eval_every steps and at the end. Writes\n"
    "<checkpoint.dir>/config.yaml (the resolved configuration), <checkpoint.dir>/metrics.jsonl and\n"
    "checkpoints <checkpoint.dir>/ckpt-NNNNNNNN.h5 every checkpoint.every steps and at the end.\n"
    "With checkpoint.resume: auto (the default) a run starts from the newest complete checkpoint in\n"
    "checkpoint.dir and continues bit for bit as if it had never stopped; with checkpoint.resume: never\n"
    "a checkpoint.dir that holds checkpoints is refused (a run directory belongs to one run).\n"
    "SIGTERM, SIGUSR1 (preemption) or Ctrl-C (SIGINT) saves a checkpoint after the current step and\n"
    "exits with 128 + the signal (130 for Ctrl-C); a second Ctrl-C stops at once, without one.\n"
    "Progress: on a terminal one line rewritten in place; otherwise (a file, a pipe, mpirun, srun)\n"
    "one line per log step. --quiet (or log.progress: false) prints no progress lines.\n"
    "Exit status: 0 on success (also when the run is already at train.steps), 2 for a bad\n"
    "configuration, 1 when training fails (bad data, a non-finite loss).\n";

static const char *g_eval_help =
    "usage: mirror eval CONFIG [--checkpoint PATH] [--set key=value ...]\n"
    "\n"
    "Loads the parameters of PATH (a mirror checkpoint, or any HDF5 file with /params/<name>\n"
    "datasets, e.g. written from a PyTorch state_dict with h5py; default: the newest checkpoint in\n"
    "checkpoint.dir) into CONFIG's model and prints the loss and accuracy (or perplexity) on\n"
    "CONFIG's evaluation data. Exit status: 0, 2 for a bad configuration or checkpoint, 1 otherwise.\n";

static const char *g_inspect_help =
    "usage: mirror inspect PATH\n"
    "\n"
    "Prints what the checkpoint PATH holds: step, epoch, loss scale, the optimizer and its\n"
    "hyperparameters, every parameter with its shape, and the experiment's configuration.\n";

static const char *g_summary_help =
    "usage: mirror summary CONFIG [--set key=value ...]\n"
    "\n"
    "Prints the experiment's model: each layer's name (its parameters' prefix), kind, output shape per\n"
    "sample and parameter count; the totals; and, from the planner, the activation memory of one\n"
    "training step for a replica's micro-batch (train.batch over train.accumulate and the devices)\n"
    "in the configured precision, with the parameter, gradient, optimizer-state and buffer bytes.\n"
    "mirror train prints the same block when it starts (not with --quiet).\n";

static const char *g_sweep_help =
    "usage: mirror sweep CONFIG [--set key=value ...]\n"
    "\n"
    "Expands CONFIG's sweep: section (grid: every combination; random: sweep.trials draws seeded by\n"
    "sweep.seed) and trains each trial in <checkpoint.dir>/trial-NNN. A trial whose result.txt records\n"
    "the hash of the configuration it would run now is not run again, so an interrupted sweep\n"
    "continues where it stopped; a trial run with another configuration (train.steps or the search\n"
    "space changed) is moved aside to trial-NNN.old-K, named with what changed, and run again.\n"
    "Writes <checkpoint.dir>/results.csv, a column per swept key, sorted by sweep.metric\n"
    "(eval_accuracy, eval_loss, eval_perplexity or loss) in the direction of sweep.goal.\n";

static const char *g_doctor_help =
    "usage: mirror doctor\n"
    "\n"
    "Prints mirror's version and build, the CPU (model, cores, AVX-512/AMX features) and the CPU GEMM\n"
    "provider, the Open MPI and HDF5 libraries loaded, and in a CUDA build the driver, runtime,\n"
    "cuBLAS, cuDNN and NCCL versions and every GPU (name, compute capability, memory); without a\n"
    "usable GPU one line says why. Then runs a 256x256x256 f32 GEMM on the CPU and on each GPU and\n"
    "compares it with the f64 reference (max abs/rel error, PASS or FAIL).\n"
    "Exit status: 0 when every check passes, 1 otherwise.\n";

/* `mirror doctor` (launch/doctor.c). */
int mirror_doctor(int argc, char **argv);

/* The job's MPI communicator when mpirun/srun started several ranks (or backend: mpi); NULL for a
 * single process. Lives until exit; on a failure the CLI aborts it so that no rank hangs. */
static mr_comm *g_job;

/* Prints the last error and a HINT; returns `code`. A message that carries its own
 * "; HINT: ..." (the library knew what to advise) prints that one instead of `hint`. The C source
 * position that raised the error is for developers: MIRROR_LOG=debug prints it. */
static int fail(int code, const char *hint) {
    const char *msg = mr_last_error(), *own = strstr(msg, "; HINT: ");
    int len = own ? (int)(own - msg) : (int)strlen(msg);
    if (g_job) fprintf(stderr, "mirror: error: rank %d: %.*s\n", mr_comm_rank(g_job), len, msg);
    else fprintf(stderr, "mirror: error: %.*s\n", len, msg);
    if (own) fprintf(stderr, "HINT: %s\n", own + 8);
    else if (hint) fprintf(stderr, "HINT: %s\n", hint);
    mr_log_debug("the error above was raised at %s", mr_last_error_where());
    return code;
}

/* Loads CONFIG and applies the --set overrides in argv[first..argc). */
static mr_status load(int argc, char **argv, int first, mr_experiment *e) {
    /* a path in the file that a --set replaces need not exist: check files after the overrides */
    mr_experiment_defer_file_checks(argc > first);
    mr_status st = mr_experiment_load(argv[first - 1], e);
    if (st != MR_OK) {
        mr_experiment_defer_file_checks(0);
        if ((st == MR_ERR_NOT_FOUND || st == MR_ERR_IO) && access(argv[first - 1], R_OK) != 0)
            mr_set_error(st, "%s; HINT: check the path of the config file (the examples are in configs/)", mr_last_error());
        return st;
    }
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set") && i + 1 < argc) {
            a = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            a += 6;
        } else if (!strcmp(a, "--quiet")) {
            a = "log.progress=false";
        } else {
            mr_experiment_defer_file_checks(0);
            return mr_set_error(MR_ERR_INVALID, "unknown argument '%s'; HINT: the options are --set key=value and --quiet "
                                                "(mirror help %s)", argv[i], argv[1]);
        }
        if ((st = mr_experiment_set(e, a)) != MR_OK) {
            mr_experiment_defer_file_checks(0);
            return st;
        }
    }
    mr_experiment_defer_file_checks(0);
    return mr_experiment_check(e, argv[first - 1]);
}

/* The model summary of an experiment for one replica's micro-batch (train.batch over train.accumulate
 * and the devices listed; an MPI job divides it further by its ranks). */
static mr_status print_summary(const mr_experiment *e, FILE *out) {
    int64_t replicas = e->distribute.n_devices > 1 ? e->distribute.n_devices : 1;
    if (g_job) replicas *= mr_comm_size(g_job);
    const int64_t micro = e->train.batch / (e->train.accumulate * replicas);
    const mr_dtype compute = e->precision.policy == MR_PREC_MIXED_BF16  ? MR_BF16
                             : e->precision.policy == MR_PREC_MIXED_F16 ? MR_F16
                                                                         : MR_F32;
    const int slots = e->optimizer.type == MR_OPTIM_SGD ? (e->optimizer.momentum > 0) : 2;
    return mr_model_summary(&e->model, micro > 0 ? micro : 1, compute, slots, out);
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
    char *yaml = NULL;
    const int leader = !g_job || mr_comm_rank(g_job) == 0;
    /* the configuration, and whether the directory may take this run, before anything is written */
    mr_status st = mr_experiment_train_cfg(e, dir, &c);
    if (st == MR_OK && leader) st = mr_train_check_run_dir(&c);
    if (st == MR_OK && leader) st = mr_mkdirs(dir);
    if (st == MR_OK && leader) st = save_config(e, dir);
    c.comm = g_job;
    if (st == MR_OK && g_job && !leader && e->distribute.rank_logs) {
        /* this rank's own log: <dir>/rank-N.log gets its stdout and stderr */
        char log[4200];
        snprintf(log, sizeof log, "%s/rank-%d.log", dir, mr_comm_rank(g_job));
        st = mr_mkdirs(dir);
        if (st == MR_OK && (!freopen(log, "w", stdout) || dup2(fileno(stdout), fileno(stderr)) < 0))
            st = mr_set_error(MR_ERR_IO, "distribute.rank_logs: cannot write '%s': %s", log, strerror(errno));
        setvbuf(stdout, NULL, _IOLBF, 0);
    }

    if (st == MR_OK) st = mr_experiment_to_yaml(e, &yaml);
    c.config_text = yaml;
    if (st == MR_OK && leader && e->log.progress) st = print_summary(e, stdout);
    if (st == MR_OK) st = mr_train(&c, r);
    free(yaml);
    return st;
}

/* MPI when this process is one of several ranks (mpirun, srun) or the config asks for it. */
static mr_status start_job(const mr_experiment *e) {
    if (g_job) return MR_OK;
    if (e->distribute.backend == MR_BACKEND_LOCAL) return MR_OK;
    if (!mr_comm_launched_multi() && e->distribute.backend != MR_BACKEND_MPI) return MR_OK;
    mr_status st = mr_comm_mpi_new(e->distribute.timeout_s, &g_job);
    if (st == MR_OK && e->distribute.bucket_mb > 0)
        st = mr_comm_set_max_piece_bytes(g_job, (size_t)(e->distribute.bucket_mb * 1048576.0));
    return st;
}

/* Ends the job with exit code `code`: a failed rank takes the others down (they would otherwise
 * wait for it until their deadline); a clean end finalizes MPI. */
static int end_job(int code) {
    if (g_job && code != 0 && code < 128) mr_comm_abort(g_job, code, "this rank failed (its error is above)");
    mr_comm_free(g_job);
    g_job = NULL;
    return code;
}

static void on_preempt(int signo) { mr_train_request_stop(signo); }

/* Ctrl-C: the first asks for a checkpoint after the current step (exit 130, as SIGTERM); the
 * second stops at once, by the default action, so the shell sees a process killed by SIGINT.
 * Only async-signal-safe calls here. */
static volatile sig_atomic_t g_interrupts;
static void on_interrupt(int signo) {
    static const char first[] = "\nmirror: interrupted: saving a checkpoint after this step (Ctrl-C again to stop at "
                                "once, without one)\n";
    static const char second[] = "\nmirror: interrupted again: stopping now, without a checkpoint\n";
    if (g_interrupts++ == 0) {
        mr_train_request_stop(signo);
        if (write(STDERR_FILENO, first, sizeof first - 1) < 0) return;
        return;
    }
    if (write(STDERR_FILENO, second, sizeof second - 1) < 0) { /* nothing more to do about it */ }
    signal(signo, SIG_DFL);
    raise(signo);
}

/* SIGTERM (Slurm, Kubernetes, mpirun's teardown) and SIGUSR1 (Slurm's --signal=USR1@N warning)
 * make the trainer checkpoint and stop after the current step; so does a first SIGINT (Ctrl-C). */
static void install_preemption_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_preempt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
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
    install_preemption_handlers();
    st = start_job(&e);
    if (st == MR_OK) st = run_one(&e, dir, &r);
    mr_experiment_deinit(&e);
    if (st == MR_ERR_UNSUPPORTED || st == MR_ERR_INVALID) return end_job(fail(EXIT_USAGE, "change the setting named above"));
    if (st == MR_ERR_FORMAT || st == MR_ERR_NOT_FOUND)
        return end_job(fail(EXIT_RUNTIME, "the file named above is damaged or not in the format expected: replace it, "
                                          "or point the config at another (data.*, checkpoint.resume)"));
    if (st != MR_OK)
        return end_job(fail(EXIT_RUNTIME, "see the message above; metrics so far and the last checkpoint are in the run "
                                          "directory (running the same command resumes from it)"));
    if (g_job && mr_comm_rank(g_job) != 0) return end_job(r.stopped_by ? 128 + r.stopped_by : 0);
    if (r.stopped_by) {
        printf("stopped by signal %d after step %lld; checkpoint %s; run the same command to resume\n", r.stopped_by,
               (long long)r.steps, r.checkpoint[0] ? r.checkpoint : "(none: checkpoint.dir is not set)");
        return end_job(128 + r.stopped_by);
    }
    if (r.resumed_from > 0 && r.resumed_from == r.steps) {
        /* nothing was trained: no loss to report; the evaluation of the checkpoint is real */
        if (r.early_stopped)
            printf("the run in %s stopped early at step %lld (train.early_stop); nothing to train", dir, (long long)r.steps);
        else
            printf("the run in %s is already at its last step (%lld, train.steps); nothing to train", dir, (long long)r.steps);
        if (!isnan(r.eval_accuracy)) printf("; eval accuracy %.4f", r.eval_accuracy);
        if (!isnan(r.eval_perplexity)) printf("; eval perplexity %.3f", r.eval_perplexity);
        printf("\nHINT: raise %s to train on, or set checkpoint.dir to a new directory to start over\n",
               r.early_stopped ? "train.early_stop.patience" : "train.steps");
        return end_job(0);
    }
    printf("trained %lld steps in %.1f s: loss %.4f", (long long)r.steps, r.seconds, r.last_loss);
    if (r.early_stopped)
        printf(" (stopped early: the best evaluation was at step %lld)", (long long)r.early_stop_best_step);
    if (r.skipped_steps) printf(" (%lld steps skipped by the loss scaler, scale %g)", (long long)r.skipped_steps, r.loss_scale);
    if (!isnan(r.eval_accuracy)) printf(", eval accuracy %.4f", r.eval_accuracy);
    if (!isnan(r.eval_perplexity)) printf(", eval perplexity %.3f", r.eval_perplexity);
    printf("; run directory %s\n", dir);
    if (r.sample[0]) printf("\nsample:\n%s\n", r.sample);
    return end_job(0);
}

static int cmd_summary(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(g_summary_help, argc < 3 ? stderr : stdout);
        return argc < 3 ? EXIT_USAGE : 0;
    }
    mr_experiment e = mr_experiment_default();
    mr_status st = load(argc, argv, 3, &e);
    if (st == MR_OK) st = print_summary(&e, stdout);
    mr_experiment_deinit(&e);
    return st == MR_OK ? 0 : fail(EXIT_USAGE, "fix the key named above in the config file or the --set argument "
                                                            "(see README.md, \"Experiments\" and \"Models\")");
}

static int cmd_eval(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(g_eval_help, argc < 3 ? stderr : stdout);
        return argc < 3 ? EXIT_USAGE : 0;
    }
    /* --checkpoint PATH is taken out; the rest are --set overrides */
    const char *ckpt = NULL;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return fail(EXIT_RUNTIME, NULL);
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (i >= 3 && !strcmp(argv[i], "--checkpoint") && i + 1 < argc) ckpt = argv[++i];
        else if (i >= 3 && !strncmp(argv[i], "--checkpoint=", 13)) ckpt = argv[i] + 13;
        else rest[n++] = argv[i];
    }
    mr_experiment e = mr_experiment_default();
    mr_status st = load(n, rest, 3, &e);
    free(rest);
    int code = 0;
    char latest[4096], dir[MR_CFG_PATH_MAX];
    mr_train_cfg c;
    mr_train_result r;
    if (st != MR_OK) {
        code = fail(EXIT_USAGE, "fix the key named above in the config file or the --set argument");
        goto done;
    }
    snprintf(dir, sizeof dir, "%s", e.checkpoint.dir[0] ? e.checkpoint.dir : "runs/default");
    if (!ckpt) {
        int64_t step = 0;
        int found = 0;
        if (mr_ckpt_latest(dir, latest, sizeof latest, &step, &found) != MR_OK) {
            code = fail(EXIT_RUNTIME, NULL);
            goto done;
        }
        if (!found) {
            fprintf(stderr, "mirror: error: no checkpoint in '%s'\nHINT: train first, or name one with --checkpoint PATH\n", dir);
            code = EXIT_USAGE;
            goto done;
        }
        ckpt = latest;
    }
    st = mr_experiment_train_cfg(&e, NULL, &c);
    if (st == MR_OK) {
        c.quiet = 1;
        st = mr_evaluate_checkpoint(&c, ckpt, &r);
    }
    if (st != MR_OK) {
        const char *hint = "check that the checkpoint belongs to this config's model (mirror inspect PATH shows it)";
        if (st == MR_ERR_FORMAT)
            hint = "the file is truncated, corrupt or not a checkpoint: evaluate another one (--checkpoint PATH; the "
                   "previous checkpoints are next to it)";
        else if (st == MR_ERR_NOT_FOUND || st == MR_ERR_IO)
            hint = "check the path given to --checkpoint";
        code = fail(st == MR_ERR_NOMEM || st == MR_ERR_INTERNAL ? EXIT_RUNTIME : EXIT_USAGE, hint);
        goto done;
    }
    printf("%s (step %lld): eval loss %.6f", ckpt, (long long)r.steps, r.eval_loss);
    if (!isnan(r.eval_accuracy)) printf(", accuracy %.4f", r.eval_accuracy);
    if (!isnan(r.eval_perplexity)) printf(", perplexity %.3f", r.eval_perplexity);
    printf(" (%.1f s)\n", r.seconds);
done:
    mr_experiment_deinit(&e);
    return code;
}

/* One line per dataset under group: name, dtype, shape and the CRC-32 of its f32 values (equal
 * CRCs across files: equal parameters; tests/e2e/checkpoint.sh compares runs with it). */
static mr_status print_group(const mr_ckpt_reader *rd, const char *group, int64_t *total) {
    char **names = NULL;
    int nn = 0;
    mr_status st = mr_ckpt_list(rd, group, &names, &nn);
    if (st == MR_ERR_NOT_FOUND) { /* e.g. a foreign file has no optimizer state */
        printf("  (none)\n");
        return MR_OK;
    }
    for (int i = 0; st == MR_OK && i < nn; i++) {
        char p[1024], dims[256] = "";
        mr_dtype dt;
        mr_shape sh;
        snprintf(p, sizeof p, "%s/%s", group, names[i]);
        if ((st = mr_ckpt_info(rd, p, &dt, &sh)) != MR_OK) break;
        for (int d = 0; d < sh.ndim; d++)
            snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? ", " : "", (long long)sh.dim[d]);
        int64_t n = mr_shape_numel(&sh);
        float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
        if (!v) {
            st = mr_set_error(MR_ERR_NOMEM, "inspect: out of memory");
            break;
        }
        if (dt == MR_F32 || dt == MR_F64) st = mr_ckpt_read(rd, p, MR_F32, &sh, v);
        if (st == MR_OK)
            printf("  %-40s %-4s (%s)  crc32 %08lx\n", names[i], mr_dtype_name(dt), dims,
                   dt == MR_F32 || dt == MR_F64 ? crc32(0L, (const Bytef *)v, (uInt)((size_t)n * sizeof *v)) : 0UL);
        free(v);
        *total += n;
    }
    mr_ckpt_names_free(names, nn);
    return st;
}

static int cmd_inspect(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(g_inspect_help, argc < 3 ? stderr : stdout);
        return argc < 3 ? EXIT_USAGE : 0;
    }
    if (argc > 3) {
        fprintf(stderr, "mirror: error: inspect takes one checkpoint path, got %d arguments\nHINT: mirror inspect PATH\n",
                argc - 2);
        return EXIT_USAGE;
    }
    const char *path = argv[2];
    mr_ckpt_reader *rd = NULL;
    char **names = NULL, **attrs = NULL;
    int nn = 0, na = 0, code = 0;
    mr_status ost = mr_ckpt_open(path, MR_CKPT_FOREIGN, &rd);
    if (ost != MR_OK) {
        code = fail(EXIT_USAGE, ost == MR_ERR_FORMAT ? "the file is truncated, corrupt or not HDF5; resume: auto skips such a "
                                                       "file and takes the newest checkpoint that verifies"
                                                     : "check the path");
        goto done;
    }
    /* a file another tool wrote (no "format" attribute): what it holds, then an error saying so */
    char *format = NULL;
    const int foreign = mr_ckpt_attr_str(rd, "format", &format) != MR_OK || strcmp(format, MR_CKPT_FORMAT) != 0;
    free(format);
    if (mr_ckpt_attr_names(rd, &attrs, &na) != MR_OK || mr_ckpt_list(rd, "params", &names, &nn) != MR_OK) {
        code = fail(EXIT_USAGE, foreign ? "mirror reads its own checkpoints and HDF5 files with /params/<name> datasets "
                                          "(a PyTorch state_dict saved with h5py)"
                                        : "the file is damaged; resume: auto skips it and takes the newest checkpoint "
                                          "that verifies");
        goto done;
    }
    printf("%s\n", path);
    char *config = NULL;
    for (int i = 0; i < na; i++) {
        char *sv = NULL;
        int64_t iv = 0;
        double dv = 0;
        if (!strcmp(attrs[i], "config")) continue; /* printed last */
        if (mr_ckpt_attr_str(rd, attrs[i], &sv) == MR_OK) {
            printf("  %-24s %s\n", attrs[i], sv);
            free(sv);
        } else if (mr_ckpt_attr_i64(rd, attrs[i], &iv) == MR_OK) {
            printf("  %-24s %lld\n", attrs[i], (long long)iv);
        } else if (mr_ckpt_attr_f64(rd, attrs[i], &dv) == MR_OK) {
            char num[64]; /* the shortest text that reads back as the same double */
            for (int prec = 6; prec <= 17; prec++) {
                snprintf(num, sizeof num, "%.*g", prec, dv);
                if (strtod(num, NULL) == dv) break;
            }
            printf("  %-24s %s\n", attrs[i], num);
        }
    }
    int64_t total = 0;
    printf("parameters (%d):\n", nn);
    if (print_group(rd, "params", &total) != MR_OK) {
        code = fail(EXIT_RUNTIME, "the file is damaged: resume falls back to the checkpoint before it");
        goto done;
    }
    printf("  total %lld values\n", (long long)total);
    int64_t btotal = 0;
    printf("buffers (batch norm's running statistics):\n");
    if (print_group(rd, "buffers", &btotal) != MR_OK) {
        code = fail(EXIT_RUNTIME, "the file is damaged: resume falls back to the checkpoint before it");
        goto done;
    }
    int64_t ototal = 0;
    printf("optimizer state:\n");
    if (print_group(rd, "optimizer", &ototal) != MR_OK) {
        code = fail(EXIT_RUNTIME, "the file is damaged: resume falls back to the checkpoint before it");
        goto done;
    }
    if (mr_ckpt_attr_str(rd, "config", &config) == MR_OK && config[0]) printf("config:\n%s", config);
    free(config);
    if (foreign) {
        mr_set_error(MR_ERR_FORMAT, "%s is not a mirror checkpoint (no 'format' attribute: another tool wrote it); its "
                                    "parameters are listed above", path);
        code = fail(EXIT_USAGE, "such a file can start a run (checkpoint.init_from) or be evaluated (mirror eval CONFIG "
                                "--checkpoint PATH), not resumed");
    } else if (mr_ckpt_verify(path) != MR_OK) {
        code = fail(EXIT_RUNTIME, "the file is damaged: resume falls back to the checkpoint before it");
    }
done:
    mr_ckpt_names_free(names, nn);
    mr_ckpt_names_free(attrs, na);
    mr_ckpt_close(rd);
    return code;
}

typedef struct trial_row {
    int index;
    double metric, loss, seconds;
    char dir[4096];
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

/* Calls fn(ctx, dotted key, value) for every scalar line of YAML as mr_experiment_to_yaml writes it
 * (two spaces per level; "name:" alone opens a section). Stops when fn returns non-zero. */
static void yaml_scalars(const char *yaml, int (*fn)(void *, const char *, const char *), void *ctx) {
    char sect[8][64] = {{0}}, key[1600], line[1024];
    for (const char *p = yaml; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
        p = nl ? nl + 1 : NULL;
        int sp = 0;
        while (line[sp] == ' ') sp++;
        int depth = sp / 2;
        char *colon = strchr(line + sp, ':');
        if (line[sp] == '#' || !line[sp] || !colon || depth >= 8) continue;
        *colon = '\0';
        const char *val = colon[1] == ' ' ? colon + 2 : colon + 1;
        if (!*val) { /* a section */
            snprintf(sect[depth], sizeof sect[depth], "%.63s", line + sp);
            continue;
        }
        key[0] = '\0';
        for (int d = 0; d < depth; d++)
            snprintf(key + strlen(key), sizeof key - strlen(key), "%s.", sect[d]);
        snprintf(key + strlen(key), sizeof key - strlen(key), "%s", line + sp);
        if (fn(ctx, key, val)) return;
    }
}

typedef struct yaml_find {
    const char *key;
    char *out;
    size_t cap;
    int found;
} yaml_find;

static int find_one(void *ctx, const char *key, const char *val) {
    yaml_find *f = ctx;
    if (strcmp(key, f->key)) return 0;
    size_t n = strlen(val);
    if (n >= 2 && val[0] == '\'' && val[n - 1] == '\'') snprintf(f->out, f->cap, "%.*s", (int)(n - 2), val + 1);
    else snprintf(f->out, f->cap, "%s", val);
    f->found = 1;
    return 1;
}

/* The value of a dotted key in to_yaml's text (quotes removed) into out; 0 when absent. */
static int yaml_value(const char *yaml, const char *key, char *out, size_t cap) {
    yaml_find f = {key, out, cap, 0};
    out[0] = '\0';
    yaml_scalars(yaml, find_one, &f);
    return f.found;
}

typedef struct yaml_cmp {
    const char *other;
    char *why;
    size_t cap;
    int n;            /* keys that differ */
    int only_missing; /* count only keys that other lacks */
} yaml_cmp;

static int cmp_one(void *ctx, const char *key, const char *val) {
    yaml_cmp *c = ctx;
    char was[512];
    int had = yaml_value(c->other, key, was, sizeof was);
    if (had && c->only_missing) return 0;
    char now[512];
    size_t n = strlen(val);
    snprintf(now, sizeof now, "%.*s", (int)(n >= 2 && val[0] == '\'' && val[n - 1] == '\'' ? n - 2 : n),
             n >= 2 && val[0] == '\'' && val[n - 1] == '\'' ? val + 1 : val);
    if (had && !strcmp(was, now)) return 0;
    if (c->n++ == 0) snprintf(c->why, c->cap, "%s: %s -> %s", key, had ? was : "(not set)", now);
    return 0;
}

/* What differs between the configuration a trial ran (old) and the one it would run now (now),
 * e.g. "train.steps: 30 -> 40 (and 1 more key)"; "" when no key differs. */
static void config_change(const char *old, const char *now, char *why, size_t cap) {
    yaml_cmp c = {old, why, cap, 0, 0};
    why[0] = '\0';
    yaml_scalars(now, cmp_one, &c);
    char first[600];
    snprintf(first, sizeof first, "%s", why);
    char gone[600] = "";
    yaml_cmp back = {now, gone, sizeof gone, 0, 1}; /* keys the old run had and this one lacks */
    yaml_scalars(old, cmp_one, &back);
    int more = c.n + back.n - 1;
    if (!c.n && back.n) snprintf(first, sizeof first, "%s", gone);
    if (more > 0) snprintf(why, cap, "%s (and %d more key%s)", first, more, more > 1 ? "s" : "");
    else snprintf(why, cap, "%s", first);
}

/* Reads a whole (small) file into a malloc'd string; NULL when it cannot be read. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    char chunk[4096];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + got + 1 > cap) {
            cap = 2 * (len + got + 1);
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        memcpy(buf + len, chunk, got);
        len += got;
    }
    fclose(f);
    if (!buf && !(buf = malloc(1))) return NULL;
    buf[len] = '\0';
    return buf;
}

/* Moves a trial directory of another configuration aside, to <dir>.old-N (the first free N), so
 * that its checkpoints are neither resumed nor pruned by the new run. The new name in moved. */
static mr_status move_aside(const char *dir, char *moved, size_t cap) {
    struct stat sb;
    for (int k = 1; k < 10000; k++) {
        snprintf(moved, cap, "%s.old-%d", dir, k);
        if (stat(moved, &sb) == 0) continue;
        if (rename(dir, moved) != 0)
            return mr_set_error(MR_ERR_IO, "cannot move '%s' to '%s': %s", dir, moved, strerror(errno));
        return MR_OK;
    }
    return mr_set_error(MR_ERR_IO, "cannot move '%s' aside: %s.old-1 to -9999 all exist", dir, dir);
}

/* One CSV field: quoted when it holds a comma, a quote or a newline. */
static void csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static int cmd_sweep(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(g_sweep_help, argc < 3 ? stderr : stdout);
        return argc < 3 ? EXIT_USAGE : 0;
    }
    mr_experiment e = mr_experiment_default();
    mr_experiment *trials = NULL;
    int n = 0, code = 0;
    char **yamls = NULL;
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
    yamls = calloc((size_t)n, sizeof *yamls);
    if (!rows || !yamls || mr_mkdirs(base) != MR_OK) {
        if (!rows || !yamls) mr_set_error(MR_ERR_NOMEM, "sweep: out of memory for %d trials", n);
        code = fail(EXIT_RUNTIME, NULL);
        goto done;
    }
    for (int t = 0; t < n; t++) {
        char *dir = rows[t].dir, result[4200], cfgpath[4200], why[700] = "", moved[4200];
        uint64_t hash = 0;
        snprintf(dir, sizeof rows[t].dir, "%s/trial-%03d", base, t);
        snprintf(result, sizeof result, "%s/result.txt", dir);
        snprintf(cfgpath, sizeof cfgpath, "%s/config.yaml", dir);
        rows[t].index = t;
        /* what this trial runs now: its resolved configuration and that text's hash */
        if ((st = mr_experiment_to_yaml(&trials[t], &yamls[t])) != MR_OK ||
            (st = mr_experiment_hash(&trials[t], &hash)) != MR_OK) {
            code = fail(EXIT_RUNTIME, NULL);
            goto done;
        }
        char *old = read_text(cfgpath);
        FILE *f = fopen(result, "r");
        if (f) { /* finished in an earlier run: it counts only for the same configuration */
            unsigned long long was = 0;
            int ok = fscanf(f, "metric %lf loss %lf seconds %lf config_hash %llx", &rows[t].metric, &rows[t].loss,
                            &rows[t].seconds, &was) == 4;
            fclose(f);
            if (ok && was == hash) {
                printf("trial %d/%d: done before, %s = %g\n", t + 1, n, e.sweep.metric, rows[t].metric);
                free(old);
                continue;
            }
            if (old) config_change(old, yamls[t], why, sizeof why);
            if (!why[0]) snprintf(why, sizeof why, "%s", ok ? "its config.yaml is missing or unreadable"
                                                            : "its result.txt records no configuration hash");
        } else if (old && strcmp(old, yamls[t])) { /* an unfinished run of another configuration */
            config_change(old, yamls[t], why, sizeof why);
            if (!why[0]) snprintf(why, sizeof why, "its config.yaml differs");
        }
        free(old);
        if (why[0]) { /* never resume or report another configuration's run: move it aside */
            if ((st = move_aside(dir, moved, sizeof moved)) != MR_OK) {
                code = fail(EXIT_RUNTIME, "move or delete the trial directory named above, then run the sweep again");
                goto done;
            }
            printf("trial %d/%d: %s was run with another configuration (%s): moved to %s; running it again\n", t + 1, n,
                   dir, why, moved);
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
        rows[t].loss = r.last_loss;
        rows[t].seconds = r.seconds;
        f = fopen(result, "w");
        int written = f && fprintf(f, "metric %.17g\nloss %.17g\nseconds %.17g\nconfig_hash %016llx\n", rows[t].metric,
                                   rows[t].loss, rows[t].seconds, (unsigned long long)hash) >= 0;
        if (f && fclose(f) != 0) written = 0;
        if (!written) {
            mr_set_error(MR_ERR_IO, "cannot write '%s': %s", result, strerror(errno));
            code = fail(EXIT_RUNTIME, NULL);
            goto done;
        }
    }
    /* one column per swept key, its value as the trial's config.yaml has it */
    char (*vals)[MR_SWEEP_MAX_PARAMS][128] = calloc((size_t)n, sizeof *vals);
    if (!vals) {
        mr_set_error(MR_ERR_NOMEM, "sweep: out of memory for results.csv");
        code = fail(EXIT_RUNTIME, NULL);
        goto done;
    }
    for (int t = 0; t < n; t++)
        for (int p = 0; p < e.sweep.n_params; p++) yaml_value(yamls[t], e.sweep.params[p].key, vals[t][p], sizeof vals[t][p]);
    qsort(rows, (size_t)n, sizeof *rows, e.sweep.goal == MR_GOAL_MIN ? cmp_rows_min : cmp_rows_max);
    char csv[4096];
    snprintf(csv, sizeof csv, "%s/results.csv", base);
    FILE *f = fopen(csv, "w");
    if (!f) {
        free(vals);
        mr_set_error(MR_ERR_IO, "cannot write '%s': %s", csv, strerror(errno));
        code = fail(EXIT_RUNTIME, NULL);
        goto done;
    }
    fprintf(f, "trial,dir");
    for (int p = 0; p < e.sweep.n_params; p++) {
        fputc(',', f);
        csv_field(f, e.sweep.params[p].key);
    }
    fprintf(f, ",%s,loss,seconds\n", e.sweep.metric);
    for (int t = 0; t < n; t++) {
        fprintf(f, "%d,", rows[t].index);
        csv_field(f, rows[t].dir);
        for (int p = 0; p < e.sweep.n_params; p++) {
            fputc(',', f);
            csv_field(f, vals[rows[t].index][p]);
        }
        fprintf(f, ",%.6g,%.6g,%.6g\n", rows[t].metric, rows[t].loss, rows[t].seconds);
    }
    free(vals);
    if (fclose(f) != 0) {
        mr_set_error(MR_ERR_IO, "cannot write '%s': %s", csv, strerror(errno));
        code = fail(EXIT_RUNTIME, NULL);
        goto done;
    }
    printf("%d trials; best %s = %g (trial %d); results in %s\n", n, e.sweep.metric, rows[0].metric, rows[0].index, csv);
done:
    if (yamls)
        for (int t = 0; t < n; t++) free(yamls[t]);
    free(yamls);
    free(rows);
    mr_sweep_free(trials, n);
    mr_experiment_deinit(&e);
    return code;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (argc >= 3 && !strcmp(argv[2], "train")) fputs(g_train_help, stdout);
        else if (argc >= 3 && !strcmp(argv[2], "sweep")) fputs(g_sweep_help, stdout);
        else if (argc >= 3 && !strcmp(argv[2], "eval")) fputs(g_eval_help, stdout);
        else if (argc >= 3 && !strcmp(argv[2], "inspect")) fputs(g_inspect_help, stdout);
        else if (argc >= 3 && !strcmp(argv[2], "summary")) fputs(g_summary_help, stdout);
        else if (argc >= 3 && !strcmp(argv[2], "doctor")) fputs(g_doctor_help, stdout);
        else if (argc >= 3 && strcmp(argv[2], "version")) {
            fprintf(stderr, "mirror: error: help: no command '%s'\nHINT: mirror help lists the commands (train, eval, "
                            "inspect, summary, sweep, doctor, version)\n", argv[2]);
            return EXIT_USAGE;
        } else fputs(g_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("mirror %s\n", MIRROR_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "train")) return cmd_train(argc, argv);
    if (!strcmp(argv[1], "sweep")) return cmd_sweep(argc, argv);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc, argv);
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(argc, argv);
    if (!strcmp(argv[1], "summary")) return cmd_summary(argc, argv);
    if (!strcmp(argv[1], "doctor")) return mirror_doctor(argc, argv);
    fprintf(stderr, "mirror: error: unknown command '%s'\nHINT: mirror --help lists the commands\n", argv[1]);
    return EXIT_USAGE;
}
