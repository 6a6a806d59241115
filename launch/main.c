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
#include "launch/cli.h"
#include "launch/config.h"
#include "train/train.h"


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

mr_comm *mr_cli_job(void) { return g_job; }

/* Prints the last error and a HINT; returns `code`. A message that carries its own
 * "; HINT: ..." (the library knew what to advise) prints that one instead of `hint`. The C source
 * position that raised the error is for developers: MIRROR_LOG=debug prints it. */
int mr_cli_fail(int code, const char *hint) {
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
mr_status mr_cli_load(int argc, char **argv, int first, mr_experiment *e) {
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
static mr_status print_summary(const mr_experiment *e, const mr_comm *comm, FILE *out) {
    int64_t replicas = e->distribute.n_devices > 1 ? e->distribute.n_devices : 1;
    if (comm) replicas *= mr_comm_size(comm);
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

mr_status mr_cli_run(const mr_experiment *e, const char *dir, const mr_cli_run_opts *o, mr_train_result *r) {
    mr_train_cfg c;
    char *yaml = NULL;
    mr_comm *comm = o ? o->comm : g_job;
    const int leader = !comm || mr_comm_rank(comm) == 0;
    /* the configuration, and whether the directory may take this run, before anything is written */
    mr_status st = mr_experiment_train_cfg(e, dir, &c);
    if (st == MR_OK && o && o->steps > 0) {
        if (o->horizon > 0 && c.schedule.total == 0) c.schedule.total = o->horizon;
        c.steps = o->steps;
    }
    if (st == MR_OK && o && o->force_resume) c.resume = "auto";
    if (st == MR_OK && leader) st = mr_train_check_run_dir(&c);
    if (st == MR_OK && leader) st = mr_mkdirs(dir);
    if (st == MR_OK && leader) st = save_config(e, dir);
    c.comm = comm;
    if (st == MR_OK && comm && !leader && e->distribute.rank_logs) {
        /* this rank's own log: <dir>/rank-N.log gets its stdout and stderr */
        char log[4200];
        snprintf(log, sizeof log, "%s/rank-%d.log", dir, mr_comm_rank(comm));
        st = mr_mkdirs(dir);
        if (st == MR_OK && (!freopen(log, "w", stdout) || dup2(fileno(stdout), fileno(stderr)) < 0))
            st = mr_set_error(MR_ERR_IO, "distribute.rank_logs: cannot write '%s': %s", log, strerror(errno));
        setvbuf(stdout, NULL, _IOLBF, 0);
    }

    if (st == MR_OK) st = mr_experiment_to_yaml(e, &yaml);
    c.config_text = yaml;
    if (st == MR_OK && leader && e->log.progress && !(o && o->quiet_summary)) st = print_summary(e, comm, stdout);
    if (st == MR_OK) st = mr_train(&c, r);
    free(yaml);
    return st;
}

/* MPI when this process is one of several ranks (mpirun, srun) or the config asks for it. */
mr_status mr_cli_start_job(const mr_experiment *e) {
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
int mr_cli_end_job(int code) {
    if (g_job && code != 0 && code < 128) mr_comm_abort(g_job, code, "this rank failed (its error is above)");
    mr_comm_free(g_job);
    g_job = NULL;
    return code;
}

static volatile sig_atomic_t g_stop_signal; /* the first stop signal (mr_cli_stop_signal) */

int mr_cli_stop_signal(void) { return (int)g_stop_signal; }

static void on_preempt(int signo) {
    if (!g_stop_signal) g_stop_signal = signo;
    mr_train_request_stop(signo);
}

/* Ctrl-C: the first asks for a checkpoint after the current step (exit 130, as SIGTERM); the
 * second stops at once, by the default action, so the shell sees a process killed by SIGINT.
 * Only async-signal-safe calls here. */
static volatile sig_atomic_t g_interrupts;
static void on_interrupt(int signo) {
    static const char first[] = "\nmirror: interrupted: saving a checkpoint after this step (Ctrl-C again to stop at "
                                "once, without one)\n";
    static const char second[] = "\nmirror: interrupted again: stopping now, without a checkpoint\n";
    if (g_interrupts++ == 0) {
        if (!g_stop_signal) g_stop_signal = signo;
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
void mr_cli_install_preemption_handlers(void) {
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
    mr_status st = mr_cli_load(argc, argv, 3, &e);
    if (st != MR_OK) {
        mr_experiment_deinit(&e);
        return mr_cli_fail(EXIT_USAGE, "fix the key named above in the config file or the --set argument "
                                "(see README.md, \"Experiments\")");
    }
    char dir[MR_CFG_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", e.checkpoint.dir[0] ? e.checkpoint.dir : "runs/default");
    mr_train_result r;
    mr_cli_install_preemption_handlers();
    st = mr_cli_start_job(&e);
    if (st == MR_OK) st = mr_cli_run(&e, dir, NULL, &r);
    mr_experiment_deinit(&e);
    if (st == MR_ERR_UNSUPPORTED || st == MR_ERR_INVALID) return mr_cli_end_job(mr_cli_fail(EXIT_USAGE, "change the setting named above"));
    if (st == MR_ERR_FORMAT || st == MR_ERR_NOT_FOUND)
        return mr_cli_end_job(mr_cli_fail(EXIT_RUNTIME, "the file named above is damaged or not in the format expected: replace it, "
                                          "or point the config at another (data.*, checkpoint.resume)"));
    if (st != MR_OK)
        return mr_cli_end_job(mr_cli_fail(EXIT_RUNTIME, "see the message above; metrics so far and the last checkpoint are in the run "
                                          "directory (running the same command resumes from it)"));
    if (g_job && mr_comm_rank(g_job) != 0) return mr_cli_end_job(r.stopped_by ? 128 + r.stopped_by : 0);
    if (r.stopped_by) {
        printf("stopped by signal %d after step %lld; checkpoint %s; run the same command to resume\n", r.stopped_by,
               (long long)r.steps, r.checkpoint[0] ? r.checkpoint : "(none: checkpoint.dir is not set)");
        return mr_cli_end_job(128 + r.stopped_by);
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
        return mr_cli_end_job(0);
    }
    printf("trained %lld steps in %.1f s: loss %.4f", (long long)r.steps, r.seconds, r.last_loss);
    if (r.early_stopped)
        printf(" (stopped early: the best evaluation was at step %lld)", (long long)r.early_stop_best_step);
    if (r.skipped_steps) printf(" (%lld steps skipped by the loss scaler, scale %g)", (long long)r.skipped_steps, r.loss_scale);
    if (!isnan(r.eval_accuracy)) printf(", eval accuracy %.4f", r.eval_accuracy);
    if (!isnan(r.eval_perplexity)) printf(", eval perplexity %.3f", r.eval_perplexity);
    printf("; run directory %s\n", dir);
    if (r.sample[0]) printf("\nsample:\n%s\n", r.sample);
    return mr_cli_end_job(0);
}

static int cmd_summary(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(g_summary_help, argc < 3 ? stderr : stdout);
        return argc < 3 ? EXIT_USAGE : 0;
    }
    mr_experiment e = mr_experiment_default();
    mr_status st = mr_cli_load(argc, argv, 3, &e);
    if (st == MR_OK) st = print_summary(&e, g_job, stdout);
    mr_experiment_deinit(&e);
    return st == MR_OK ? 0 : mr_cli_fail(EXIT_USAGE, "fix the key named above in the config file or the --set argument "
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
    if (!rest) return mr_cli_fail(EXIT_RUNTIME, NULL);
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (i >= 3 && !strcmp(argv[i], "--checkpoint") && i + 1 < argc) ckpt = argv[++i];
        else if (i >= 3 && !strncmp(argv[i], "--checkpoint=", 13)) ckpt = argv[i] + 13;
        else rest[n++] = argv[i];
    }
    mr_experiment e = mr_experiment_default();
    mr_status st = mr_cli_load(n, rest, 3, &e);
    free(rest);
    int code = 0;
    char latest[4096], dir[MR_CFG_PATH_MAX];
    mr_train_cfg c;
    mr_train_result r;
    if (st != MR_OK) {
        code = mr_cli_fail(EXIT_USAGE, "fix the key named above in the config file or the --set argument");
        goto done;
    }
    snprintf(dir, sizeof dir, "%s", e.checkpoint.dir[0] ? e.checkpoint.dir : "runs/default");
    if (!ckpt) {
        int64_t step = 0;
        int found = 0;
        if (mr_ckpt_latest(dir, latest, sizeof latest, &step, &found) != MR_OK) {
            code = mr_cli_fail(EXIT_RUNTIME, NULL);
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
        code = mr_cli_fail(st == MR_ERR_NOMEM || st == MR_ERR_INTERNAL ? EXIT_RUNTIME : EXIT_USAGE, hint);
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
        code = mr_cli_fail(EXIT_USAGE, ost == MR_ERR_FORMAT ? "the file is truncated, corrupt or not HDF5; resume: auto skips such a "
                                                       "file and takes the newest checkpoint that verifies"
                                                     : "check the path");
        goto done;
    }
    /* a file another tool wrote (no "format" attribute): what it holds, then an error saying so */
    char *format = NULL;
    const int foreign = mr_ckpt_attr_str(rd, "format", &format) != MR_OK || strcmp(format, MR_CKPT_FORMAT) != 0;
    free(format);
    if (mr_ckpt_attr_names(rd, &attrs, &na) != MR_OK || mr_ckpt_list(rd, "params", &names, &nn) != MR_OK) {
        code = mr_cli_fail(EXIT_USAGE, foreign ? "mirror reads its own checkpoints and HDF5 files with /params/<name> datasets "
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
        code = mr_cli_fail(EXIT_RUNTIME, "the file is damaged: resume falls back to the checkpoint before it");
        goto done;
    }
    printf("  total %lld values\n", (long long)total);
    int64_t btotal = 0;
    printf("buffers (batch norm's running statistics):\n");
    if (print_group(rd, "buffers", &btotal) != MR_OK) {
        code = mr_cli_fail(EXIT_RUNTIME, "the file is damaged: resume falls back to the checkpoint before it");
        goto done;
    }
    int64_t ototal = 0;
    printf("optimizer state:\n");
    if (print_group(rd, "optimizer", &ototal) != MR_OK) {
        code = mr_cli_fail(EXIT_RUNTIME, "the file is damaged: resume falls back to the checkpoint before it");
        goto done;
    }
    if (mr_ckpt_attr_str(rd, "config", &config) == MR_OK && config[0]) printf("config:\n%s", config);
    free(config);
    if (foreign) {
        mr_set_error(MR_ERR_FORMAT, "%s is not a mirror checkpoint (no 'format' attribute: another tool wrote it); its "
                                    "parameters are listed above", path);
        code = mr_cli_fail(EXIT_USAGE, "such a file can start a run (checkpoint.init_from) or be evaluated (mirror eval CONFIG "
                                "--checkpoint PATH), not resumed");
    } else if (mr_ckpt_verify(path) != MR_OK) {
        code = mr_cli_fail(EXIT_RUNTIME, "the file is damaged: resume falls back to the checkpoint before it");
    }
done:
    mr_ckpt_names_free(names, nn);
    mr_ckpt_names_free(attrs, na);
    mr_ckpt_close(rd);
    return code;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (argc >= 3 && !strcmp(argv[2], "train")) fputs(g_train_help, stdout);
        else if (argc >= 3 && !strcmp(argv[2], "sweep")) fputs(mr_cli_sweep_help, stdout);
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
    if (!strcmp(argv[1], "sweep")) return mr_cli_sweep(argc, argv);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc, argv);
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(argc, argv);
    if (!strcmp(argv[1], "summary")) return cmd_summary(argc, argv);
    if (!strcmp(argv[1], "doctor")) return mirror_doctor(argc, argv);
    fprintf(stderr, "mirror: error: unknown command '%s'\nHINT: mirror --help lists the commands\n", argv[1]);
    return EXIT_USAGE;
}
