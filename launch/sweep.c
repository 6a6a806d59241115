/* `mirror sweep CONFIG` and `mirror sweep --status DIR`.
 *
 * Trial groups. Under mpirun -np N with sweep.ranks_per_trial K, the job's communicator is split
 * into N / K groups of consecutive ranks (mr_comm_split); each group trains one trial at a time
 * over its own communicator (its own handshake and deadlines) and then takes the next. Rank 0 of a
 * group leads it: it picks the trial and tells its other ranks through the group's communicator,
 * and while it waits for other groups it tells them to wait every WAIT_S seconds, so that no rank
 * sits in a collective longer than its deadline and a dead rank still ends the job with the usual
 * deadline message.
 *
 * Coordination between groups goes through the sweep directory, which every rank sees (the run
 * directories are there already): a leader takes trial T's rung K by creating .claims/rK-tT with
 * O_EXCL (a claim is never removed while the sweep runs, so a trial is trained once), and a rung
 * is finished when every trial of it has a result file. The results are the sweep's state:
 * which trials a rung holds is a function of the previous rung's results alone
 * (sw_rung_members), so a rerun of an interrupted sweep recomputes the same decisions, skips
 * what has a result and resumes an unfinished trial from its newest checkpoint (bit-exact).
 *
 * ASHA. Synchronous successive halving: every trial trains to rung 0's step; when all of rung k
 * have results, the best 1/reduction go on and resume from their checkpoints to rung k+1's step
 * (each trial's schedule spans the last rung, so a promoted trial continues exactly as if it
 * had never paused). Asynchronous promotion (ASHA proper) would promote as soon as a rung holds
 * enough results: faster, but its decisions would depend on which trial finished first; the
 * synchronous form keeps them a function of the results. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "launch/cli.h"
#include "launch/sweep_impl.h"

const char *const mr_cli_sweep_help =
    "usage: mirror sweep CONFIG [--set key=value ...]\n"
    "       mirror sweep --status DIR\n"
    "\n"
    "Expands CONFIG's sweep: section (grid: every combination; random: sweep.trials draws seeded by\n"
    "sweep.seed) and trains each trial in <checkpoint.dir>/trial-NNN. Under mpirun -np N,\n"
    "sweep.ranks_per_trial: K trains N/K trials at a time, each over K ranks. sweep.scheduler.type:\n"
    "asha stops the worse trials early (synchronous successive halving: rungs at\n"
    "sweep.scheduler.min_steps * reduction^k up to max_steps; the best 1/reduction of each rung go on\n"
    "from their checkpoints).\n"
    "A trial (or rung) whose result records the hash of the configuration it would run now is not\n"
    "run again, and an unfinished one resumes from its newest checkpoint, so an interrupted sweep\n"
    "continues where it stopped and makes the same decisions; a trial run with another configuration\n"
    "is moved aside to trial-NNN.old-K, named with what changed, and run again. A trial that fails\n"
    "is recorded and the sweep goes on (exit status 1 at the end; running it again retries it).\n"
    "Writes <checkpoint.dir>/results.csv, a column per swept key, sorted by sweep.metric\n"
    "(eval_accuracy, eval_loss, eval_perplexity or loss) in the direction of sweep.goal, with the rung\n"
    "reached, the steps trained, the wall time and why each trial stopped.\n"
    "--status DIR prints that table for a running or finished sweep.\n";

#define WAIT_S 0.2 /* a waiting leader's heartbeat to its group */

enum { ACT_RUN = 1, ACT_WAIT = 2, ACT_DONE = 3, ACT_STOP = 4 };

typedef struct sweep {
    sw_trials t;
    mr_comm *job, *group; /* the job (NULL: one process) and this rank's group (== job for one group) */
    int wrank, world, k, groups, my_group, leader;
    uint64_t run_id;      /* this invocation (result files name it: "done before" is another's) */
    int stop;             /* the signal that stopped a trial (0: none) */
} sweep;

static double pick_metric(const char *m, const mr_train_result *r) {
    if (!strcmp(m, "eval_loss")) return r->eval_loss;
    if (!strcmp(m, "eval_perplexity")) return r->eval_perplexity;
    if (!strcmp(m, "loss")) return r->last_loss;
    return r->eval_accuracy;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- a group's ranks follow their leader ------------------------------------------------------- */

/* The leader's word to its group (a broadcast over the group; nothing with one rank). */
static mr_status tell(sweep *s, int64_t act, int64_t trial, int64_t rung, int64_t *msg) {
    msg[0] = act, msg[1] = trial, msg[2] = rung;
    if (!s->group || mr_comm_size(s->group) == 1) return MR_OK;
    return mr_comm_broadcast(s->group, msg, 3, MR_I64, 0);
}

/* Takes trial's rung for this group: 1 when this call created its claim. */
static int claim(const sweep *s, int trial, int rung) {
    char path[4300];
    snprintf(path, sizeof path, "%s/.claims/r%d-t%03d", s->t.dir, rung, trial);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return 0;
    char line[128];
    int n = snprintf(line, sizeof line, "group %d ranks %d-%d pid %ld\n", s->my_group, s->my_group * s->k,
                     s->my_group * s->k + s->k - 1, (long)getpid());
    if (write(fd, line, (size_t)n) < 0) { /* the claim is the file; its text is for people */ }
    close(fd);
    return 1;
}

/* Before a trial's first rung: a directory left by another configuration is moved aside, so that
 * its checkpoints are neither resumed nor reported (leader only). */
static mr_status prepare_dir(sweep *s, int trial, const char *dir) {
    char result[4300], cfgpath[4300], why[700] = "", moved[4300];
    sw_result_path(&s->t, trial, 0, result, sizeof result);
    snprintf(cfgpath, sizeof cfgpath, "%s/config.yaml", dir);
    char *old = sw_read_text(cfgpath);
    sw_result r;
    if (sw_result_get(&s->t, trial, 0, &r)) {
        free(old);
        return MR_OK;
    }
    struct stat sb;
    if (stat(result, &sb) == 0) { /* a result of another configuration (or another rung's steps) */
        if (old) sw_config_change(old, s->t.yamls[trial], why, sizeof why);
        if (!why[0]) snprintf(why, sizeof why, "%s", old ? "its result was for other steps" : "its config.yaml is missing");
    } else if (old && strcmp(old, s->t.yamls[trial])) {
        sw_config_change(old, s->t.yamls[trial], why, sizeof why);
        if (!why[0]) snprintf(why, sizeof why, "its config.yaml differs");
    }
    free(old);
    if (!why[0]) return MR_OK;
    MR_TRY_RET(sw_move_aside(dir, moved, sizeof moved));
    printf("trial-%03d: %s was run with another configuration (%s): moved to %s; running it again\n", trial, dir, why,
           moved);
    return MR_OK;
}

/* Sends this rank's output to path while a group trains (restore with the returned fds). */
static int redirect_output(const char *path, int saved[2]) {
    fflush(stdout), fflush(stderr);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return 0;
    saved[0] = dup(STDOUT_FILENO), saved[1] = dup(STDERR_FILENO);
    dup2(fd, STDOUT_FILENO), dup2(fd, STDERR_FILENO);
    close(fd);
    return 1;
}

static void restore_output(int saved[2]) {
    fflush(stdout), fflush(stderr);
    dup2(saved[0], STDOUT_FILENO), dup2(saved[1], STDERR_FILENO);
    close(saved[0]), close(saved[1]);
}

/* Every rank of the group: trains trial to the end of rung; the leader records the result. A
 * failed trial is recorded and MR_OK returned; MR_ERR_COMM (the group is broken) is returned. */
static mr_status run_trial(sweep *s, int trial, int rung) {
    const mr_experiment *e = s->t.base;
    const sw_sched *sc = &s->t.sc;
    char dir[4200], log[4300];
    sw_trial_dir(&s->t, trial, dir, sizeof dir);
    if (s->leader && rung == 0) MR_TRY_RET(prepare_dir(s, trial, dir));
    MR_TRY_RET(mr_mkdirs(dir));
    double before = 0;
    sw_result prev;
    if (rung > 0 && sw_result_get(&s->t, trial, rung - 1, &prev)) before = prev.seconds;
    if (s->leader) {
        printf("trial-%03d", trial);
        if (sc->asha) printf(", rung %d: to step %lld", rung, (long long)sc->steps[rung]);
        if (s->groups > 1) printf(" (group %d, ranks %d-%d; output in %s/train.log)", s->my_group, s->my_group * s->k,
                                  s->my_group * s->k + s->k - 1, dir);
        printf("\n");
        fflush(stdout);
    }
    int saved[2], redirected = 0;
    snprintf(log, sizeof log, "%s/train.log", dir);
    if (s->groups > 1) redirected = redirect_output(log, saved);
    mr_cli_run_opts o = {s->group, sc->asha ? sc->steps[rung] : 0, sc->steps[sc->n - 1], 1, s->groups > 1};
    mr_train_result res;
    memset(&res, 0, sizeof res);
    mr_status st = mr_cli_run(&s->t.trials[trial], dir, &o, &res);
    char err[512] = "";
    if (st != MR_OK) {
        const char *m = mr_last_error(), *h = strstr(m, "; HINT: ");
        snprintf(err, sizeof err, "%.*s", (int)(h ? h - m : (long)strlen(m)), m);
        for (char *c = err; *c; c++)
            if (*c == '\n') *c = ' ';
    }
    if (redirected) restore_output(saved);
    if (st == MR_ERR_COMM) return st;
    if (st == MR_OK && res.stopped_by) {
        s->stop = res.stopped_by;
        return MR_OK;
    }
    if (!s->leader) return MR_OK;
    sw_result r;
    memset(&r, 0, sizeof r);
    r.status = st == MR_OK ? (res.early_stopped ? SW_EARLY : SW_DONE) : st == MR_ERR_NUMERIC ? SW_DIVERGED : SW_FAILED;
    r.metric = st == MR_OK ? pick_metric(e->sweep.metric, &res) : NAN;
    r.loss = st == MR_OK ? res.last_loss : NAN;
    r.seconds = before + (st == MR_OK ? res.seconds : 0);
    r.steps = st == MR_OK ? res.steps : 0;
    r.hash = s->t.hash[trial];
    r.run_id = s->run_id;
    snprintf(r.checkpoint, sizeof r.checkpoint, "%s", st == MR_OK ? res.checkpoint : "");
    snprintf(r.error, sizeof r.error, "%s", err);
    MR_TRY_RET(sw_result_put(&s->t, trial, rung, &r));
    if (st == MR_OK)
        printf("trial-%03d%s: %s = %g after %lld steps%s\n", trial, sc->asha ? ", rung done" : "",
               e->sweep.metric, r.metric, (long long)r.steps, r.status == SW_EARLY ? " (stopped early)" : "");
    else
        printf("trial-%03d: %s: %s (recorded; the sweep goes on)\n", trial, sw_status_name(r.status), err);
    fflush(stdout);
    return MR_OK;
}

/* A group's leader: rung after rung, takes the trials nobody has taken, waits for the rung to
 * finish, and tells its ranks what to do. */
static mr_status lead(sweep *s) {
    mr_status st = MR_OK;
    int64_t msg[3];
    int *m = malloc((size_t)s->t.n * sizeof *m);
    MR_CHECK(m, MR_ERR_NOMEM, "sweep: out of memory");
    for (int k = 0; k < s->t.sc.n; k++) {
        int c = sw_rung_members(&s->t, k, m);
        MR_CHECK(c >= 0, MR_ERR_INTERNAL, "sweep: rung %d started before rung %d finished", k, k - 1);
        if (s->wrank == 0 && s->t.sc.asha) {
            MR_TRY(sw_write_schedule(&s->t));
            printf("rung %d: %d trial%s to step %lld:", k, c, c == 1 ? "" : "s", (long long)s->t.sc.steps[k]);
            for (int i = 0; i < c; i++) printf(" %d", m[i]);
            printf("\n");
        }
        for (int i = 0; i < c && s->wrank == 0; i++) {
            sw_result r;
            if (sw_result_get(&s->t, m[i], k, &r) && r.run_id != s->run_id)
                printf("trial-%03d: done before%s, %s = %g\n", m[i], s->t.sc.asha ? " (this rung)" : "",
                       s->t.base->sweep.metric, r.metric);
        }
        fflush(stdout);
        for (;;) {
            if (!s->stop) s->stop = mr_cli_stop_signal();
            if (s->stop) {
                st = tell(s, ACT_STOP, 0, 0, msg);
                goto fail;
            }
            int pick = -1, open = 0;
            for (int i = 0; i < c && pick < 0; i++) {
                sw_result r;
                if (sw_result_get(&s->t, m[i], k, &r)) continue;
                open++;
                if (claim(s, m[i], k)) pick = m[i];
            }
            if (pick >= 0) {
                MR_TRY(tell(s, ACT_RUN, pick, k, msg));
                MR_TRY(run_trial(s, pick, k));
                continue;
            }
            if (!open) break;
            MR_TRY(tell(s, ACT_WAIT, 0, 0, msg));
            sleep_s(WAIT_S);
        }
    }
    st = tell(s, ACT_DONE, 0, 0, msg);
fail:
    free(m);
    return st;
}

/* The group's other ranks. */
static mr_status follow(sweep *s) {
    for (;;) {
        int64_t msg[3] = {0, 0, 0};
        MR_TRY_RET(mr_comm_broadcast(s->group, msg, 3, MR_I64, 0));
        if (msg[0] == ACT_RUN) MR_TRY_RET(run_trial(s, (int)msg[1], (int)msg[2]));
        else if (msg[0] == ACT_STOP) {
            if (!s->stop) s->stop = mr_cli_stop_signal() ? mr_cli_stop_signal() : SIGTERM;
            return MR_OK;
        } else if (msg[0] == ACT_DONE) return MR_OK;
    }
}

/* ---- setting up -------------------------------------------------------------------------------- */

/* The group size, and that every trial's batch splits over it (MR_ERR_INVALID naming the key). */
static mr_status check_groups(sweep *s) {
    const mr_experiment *e = s->t.base;
    s->k = e->sweep.ranks_per_trial ? (int)e->sweep.ranks_per_trial : s->world;
    if (s->k > s->world || s->world % s->k)
        return mr_set_error(MR_ERR_INVALID, "sweep.ranks_per_trial: %d does not divide the job's %d rank%s into groups; "
                            "HINT: a divisor of %d (mpirun -np sets the ranks)", s->k, s->world, s->world == 1 ? "" : "s",
                            s->world);
    for (int i = 0; i < s->t.n; i++) {
        const mr_experiment *x = &s->t.trials[i];
        const int64_t per = (int64_t)s->k * (x->distribute.n_devices > 1 ? x->distribute.n_devices : 1) * x->train.accumulate;
        if (x->train.batch % per)
            return mr_set_error(MR_ERR_INVALID, "sweep.ranks_per_trial: trial %d's train.batch (%lld) does not split over "
                                "%d rank%s x %lld micro-batch%s; HINT: a train.batch divisible by %lld, or another "
                                "ranks_per_trial", i, (long long)x->train.batch, s->k, s->k == 1 ? "" : "s",
                                (long long)(per / s->k), per / s->k == 1 ? "" : "es", (long long)per);
    }
    s->groups = s->world / s->k;
    s->my_group = s->wrank / s->k;
    return MR_OK;
}

/* Rank 0: the directory, its lock (one sweep at a time), sweep.yaml and a fresh .claims. */
static mr_status prepare_sweep_dir(sweep *s, int *lock_fd) {
    char path[4300];
    MR_TRY_RET(mr_mkdirs(s->t.dir));
    snprintf(path, sizeof path, "%s/.lock", s->t.dir);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) return mr_set_error(MR_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return mr_set_error(MR_ERR_INVALID, "%s: another mirror sweep is running in this directory; HINT: wait for it "
                            "(mirror sweep --status %s), or give this sweep another checkpoint.dir", s->t.dir, s->t.dir);
    }
    *lock_fd = fd;
    char *yaml = NULL;
    MR_TRY_RET(mr_experiment_to_yaml(s->t.base, &yaml));
    snprintf(path, sizeof path, "%s/sweep.yaml", s->t.dir);
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int ok = f && fputs(yaml, f) >= 0;
    if (f) ok = fclose(f) == 0 && ok;
    free(yaml);
    if (!ok || rename(tmp, path) != 0) return mr_set_error(MR_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/.claims", s->t.dir);
    DIR *d = opendir(path);
    if (d) { /* the claims of an interrupted sweep: what they took is resumed now */
        for (struct dirent *de; (de = readdir(d));) {
            if (de->d_name[0] == '.') continue;
            char p[4600];
            snprintf(p, sizeof p, "%s/%s", path, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) return mr_set_error(MR_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    return MR_OK;
}

/* Rank 0 at the end: results.csv (atomically), the best trial. Returns the count of failures. */
static mr_status finish(sweep *s, int *failed) {
    char csv[4300], tmp[4400];
    int best = -1;
    if (s->t.sc.asha) MR_TRY_RET(sw_write_schedule(&s->t));
    snprintf(csv, sizeof csv, "%s/results.csv", s->t.dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", csv);
    FILE *f = fopen(tmp, "w");
    if (!f) return mr_set_error(MR_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    mr_status st = sw_table(&s->t, NULL, f, 1, &best, failed);
    if (fclose(f) != 0 && st == MR_OK) st = mr_set_error(MR_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    if (st == MR_OK && rename(tmp, csv) != 0) st = mr_set_error(MR_ERR_IO, "cannot write '%s': %s", csv, strerror(errno));
    MR_TRY_RET(st);
    int64_t steps = 0;
    for (int i = 0; i < s->t.n; i++)
        for (int k = s->t.sc.n - 1; k >= 0; k--) {
            sw_result r;
            if (sw_result_get(&s->t, i, k, &r)) {
                steps += r.steps;
                break;
            }
        }
    sw_result b;
    memset(&b, 0, sizeof b);
    if (best >= 0)
        for (int k = s->t.sc.n - 1; k >= 0 && !sw_result_get(&s->t, best, k, &b); k--) {}
    if (best >= 0)
        printf("%d trials, %lld steps in all; best %s = %g (trial %d, checkpoint %s); results in %s\n", s->t.n,
               (long long)steps, s->t.base->sweep.metric, b.metric, best, b.checkpoint[0] ? b.checkpoint : "(none)", csv);
    else
        printf("%d trials, %lld steps in all; no trial finished; results in %s\n", s->t.n, (long long)steps, csv);
    return MR_OK;
}

/* ---- mirror sweep --status DIR ----------------------------------------------------------------- */

static int sweep_status(const char *dir) {
    char path[4300];
    snprintf(path, sizeof path, "%s/sweep.yaml", dir);
    mr_experiment e = mr_experiment_default();
    sw_trials t;
    memset(&t, 0, sizeof t);
    mr_status st = mr_experiment_load(path, &e);
    if (st == MR_OK) st = mr_experiment_check(&e, path);
    if (st != MR_OK) {
        mr_experiment_deinit(&e);
        if (access(path, R_OK) != 0)
            mr_set_error(MR_ERR_NOT_FOUND, "sweep --status: '%s' is not a sweep directory (no sweep.yaml)", dir);
        return mr_cli_fail(EXIT_USAGE, "give the checkpoint.dir of a sweep that `mirror sweep` has started");
    }
    if ((st = sw_trials_init(&e, &t)) != MR_OK) {
        mr_experiment_deinit(&e);
        return mr_cli_fail(EXIT_RUNTIME, NULL);
    }
    snprintf(t.dir, sizeof t.dir, "%s", dir); /* wherever the directory is now */
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDONLY), running = 0;
    if (fd >= 0) {
        running = flock(fd, LOCK_SH | LOCK_NB) != 0;
        close(fd);
    }
    int *run = malloc((size_t)(t.n ? t.n : 1) * sizeof *run);
    if (!run) {
        sw_trials_deinit(&t);
        mr_experiment_deinit(&e);
        mr_set_error(MR_ERR_NOMEM, "sweep --status: out of memory");
        return mr_cli_fail(EXIT_RUNTIME, NULL);
    }
    for (int i = 0; i < t.n; i++) {
        run[i] = -1;
        sw_result r;
        for (int k = 0; k < t.sc.n && running; k++) {
            snprintf(path, sizeof path, "%s/.claims/r%d-t%03d", dir, k, i);
            if (access(path, F_OK) == 0 && !sw_result_get(&t, i, k, &r)) run[i] = k;
        }
    }
    printf("sweep %s: %d trials (%s", dir, t.n, e.sweep.method == MR_SWEEP_GRID ? "grid" : "random");
    if (t.sc.asha) {
        printf("; asha rungs at");
        for (int k = 0; k < t.sc.n; k++) printf(" %lld", (long long)t.sc.steps[k]);
    }
    printf("); %s\n", running ? "running" : "not running");
    int best = -1, failed = 0;
    st = sw_table(&t, run, stdout, 0, &best, &failed);
    free(run);
    sw_trials_deinit(&t);
    mr_experiment_deinit(&e);
    return st == MR_OK ? 0 : mr_cli_fail(EXIT_RUNTIME, NULL);
}

/* ---- mirror sweep CONFIG ------------------------------------------------------------------------- */

/* An error every rank found alike: rank 0 says it; MPI ends cleanly. */
static int fail_alike(const sweep *s, int code, const char *hint) {
    if (s->wrank == 0) mr_cli_fail(code, hint);
    mr_cli_end_job(0);
    return code;
}

int mr_cli_sweep(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(mr_cli_sweep_help, argc < 3 ? stderr : stdout);
        return argc < 3 ? EXIT_USAGE : 0;
    }
    if (!strcmp(argv[2], "--status")) {
        if (argc != 4) {
            fprintf(stderr, "mirror: error: sweep --status takes one directory\nHINT: mirror sweep --status DIR\n");
            return EXIT_USAGE;
        }
        return sweep_status(argv[3]);
    }
    mr_experiment e = mr_experiment_default();
    sweep s;
    memset(&s, 0, sizeof s);
    int code = 0, lock_fd = -1;
    mr_status st = mr_cli_load(argc, argv, 3, &e);
    if (st == MR_OK && e.sweep.method == MR_SWEEP_NONE)
        st = mr_set_error(MR_ERR_INVALID, "%s: has no sweep: section", argv[2]);
    if (st == MR_OK) st = sw_trials_init(&e, &s.t);
    if (st != MR_OK) {
        mr_experiment_deinit(&e);
        return mr_cli_fail(EXIT_USAGE, "fix the sweep section named above (see README.md, \"Sweeps\")");
    }
    mr_cli_install_preemption_handlers();
    if ((st = mr_cli_start_job(&e)) != MR_OK) {
        code = mr_cli_end_job(mr_cli_fail(EXIT_RUNTIME, NULL));
        goto done;
    }
    s.job = mr_cli_job();
    s.wrank = s.job ? mr_comm_rank(s.job) : 0;
    s.world = s.job ? mr_comm_size(s.job) : 1;
    if (check_groups(&s) != MR_OK) {
        code = fail_alike(&s, EXIT_USAGE, NULL);
        goto done;
    }
    /* rank 0 prepares the directory; everyone learns whether it could, and this run's id */
    int64_t hello[2] = {MR_OK, (int64_t)(((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid())};
    if (s.wrank == 0) hello[0] = prepare_sweep_dir(&s, &lock_fd);
    if (s.wrank == 0 && hello[0] != MR_OK) mr_cli_fail(EXIT_RUNTIME, NULL);
    if (s.job && (st = mr_comm_broadcast(s.job, hello, 2, MR_I64, 0)) != MR_OK) {
        code = mr_cli_end_job(mr_cli_fail(EXIT_RUNTIME, NULL));
        goto done;
    }
    if (hello[0] != MR_OK) {
        mr_cli_end_job(0);
        code = EXIT_RUNTIME;
        goto done;
    }
    s.run_id = (uint64_t)hello[1];
    s.group = s.job;
    if (s.groups > 1 && (st = mr_comm_split(s.job, s.my_group, &s.group)) != MR_OK) {
        s.group = NULL;
        code = mr_cli_end_job(mr_cli_fail(EXIT_RUNTIME, NULL));
        goto done;
    }
    s.leader = !s.group || mr_comm_rank(s.group) == 0;
    if (s.wrank == 0 && (s.groups > 1 || s.t.sc.asha)) {
        printf("sweep: %d trials in %s", s.t.n, s.t.dir);
        if (s.groups > 1) printf("; %d groups of %d ranks train %d trials at a time", s.groups, s.k, s.groups);
        if (s.t.sc.asha) printf("; asha, reduction %lld", (long long)s.t.sc.reduction);
        printf("\n");
    }
    st = s.leader ? lead(&s) : follow(&s);
    if (s.group != s.job) mr_comm_free(s.group);
    s.group = NULL;
    if (st != MR_OK) { /* a broken group or an unwritable directory: the job ends (no rank waits for it) */
        code = mr_cli_end_job(mr_cli_fail(EXIT_RUNTIME, "see the message above; finished trials are kept and an "
                                                        "unfinished one resumes when the sweep is run again"));
        goto done;
    }
    if (s.stop) {
        if (s.wrank == 0)
            printf("sweep stopped by signal %d: run the same command to go on (finished trials are kept; the "
                   "interrupted ones resume from their checkpoints)\n", s.stop);
        code = mr_cli_end_job(128 + s.stop);
        goto done;
    }
    int64_t failed = 0;
    if (s.job && (st = mr_comm_barrier(s.job)) != MR_OK) {
        code = mr_cli_end_job(mr_cli_fail(EXIT_RUNTIME, NULL));
        goto done;
    }
    if (s.wrank == 0) {
        int nf = 0;
        if ((st = finish(&s, &nf)) != MR_OK) mr_cli_fail(EXIT_RUNTIME, NULL);
        failed = st != MR_OK ? -1 : nf;
        if (nf > 0)
            fprintf(stderr, "mirror: error: %d trial%s failed (results.csv says why)\nHINT: fix the cause and run the "
                            "same command: finished trials are kept and failed ones run again\n", nf, nf == 1 ? "" : "s");
    }
    if (s.job && mr_comm_broadcast(s.job, &failed, 1, MR_I64, 0) != MR_OK) failed = -1;
    code = mr_cli_end_job(0);
    if (failed) code = EXIT_RUNTIME;
done:
    if (lock_fd >= 0) close(lock_fd);
    sw_trials_deinit(&s.t);
    mr_experiment_deinit(&e);
    return code;
}
