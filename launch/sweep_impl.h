/* Private to `mirror sweep`: the schedule of rungs, the result files of trials and the table of
 * results (launch/sweep_store.c), shared with the command itself (launch/sweep.c).
 *
 * On disk, in the sweep directory (checkpoint.dir of the sweep's config):
 *   sweep.yaml            the resolved configuration with its sweep: section (for --status)
 *   trial-NNN/            trial NNN's run directory (config.yaml, metrics.jsonl, checkpoints)
 *   trial-NNN/result.txt  its result, without a scheduler; with ASHA one trial-NNN/rung-K.txt per
 *                         rung it finished (written atomically: "key value" lines)
 *   schedule.txt          ASHA: the trials of every rung decided so far (written atomically)
 *   .claims/rK-tNNN       which group took trial NNN's rung K in the running sweep
 *   .lock                 held (flock) by the running sweep's rank 0
 *   results.csv           the table, at the end */
#ifndef MR_LAUNCH_SWEEP_IMPL_H
#define MR_LAUNCH_SWEEP_IMPL_H

#include <stdint.h>
#include <stdio.h>

#include "launch/config.h"

#define SW_MAX_RUNGS 32

/* Returns expr's status when it fails (for functions without a fail: label). */
#define MR_TRY_RET(expr)                                                                        \
    do {                                                                                        \
        mr_status st_ = (expr);                                                                 \
        if (st_ != MR_OK) return st_;                                                           \
    } while (0)

/* The rungs: steps[k] is where rung k ends. Without a scheduler one rung at train.steps. */
typedef struct sw_sched {
    int asha;
    int n;
    int64_t steps[SW_MAX_RUNGS];
    int64_t reduction;
} sw_sched;

typedef enum sw_status { SW_NONE = 0, SW_DONE, SW_EARLY, SW_DIVERGED, SW_FAILED } sw_status;

/* One rung's result of one trial (a result file). */
typedef struct sw_result {
    int have;             /* a result file was read */
    sw_status status;
    double metric, loss, seconds; /* seconds: wall time of every rung so far */
    int64_t steps;        /* the step the trial reached */
    int64_t target;       /* the rung's step (0 in files written before rungs existed) */
    uint64_t hash;        /* the trial's configuration hash */
    uint64_t run_id;      /* the sweep invocation that wrote it */
    char checkpoint[4096];
    char error[512];
} sw_result;

/* Everything a sweep knows about its trials. */
typedef struct sw_trials {
    const mr_experiment *base;
    mr_experiment *trials;
    int n;
    char **yamls;        /* each trial's resolved configuration (to_yaml) */
    uint64_t *hash;      /* and its hash */
    sw_sched sc;
    char dir[4096];      /* the sweep directory */
} sw_trials;

/* Expands base's sweep into t (trials, their YAML and hash, rungs). With ASHA every trial's
 * train.steps is the last rung's. */
mr_status sw_trials_init(const mr_experiment *base, sw_trials *t) MR_WUR;
void sw_trials_deinit(sw_trials *t);

/* The trial directory "<dir>/trial-NNN" and the result file of its rung. */
void sw_trial_dir(const sw_trials *t, int trial, char *out, size_t cap);
void sw_result_path(const sw_trials *t, int trial, int rung, char *out, size_t cap);

/* Reads trial's result of rung; r->have = 0 when there is none. It counts (returns 1) only when it
 * is the result of the trial's current configuration at the rung's step. */
int sw_result_get(const sw_trials *t, int trial, int rung, sw_result *r);
/* Writes it atomically (a temporary file, then rename). */
mr_status sw_result_put(const sw_trials *t, int trial, int rung, const sw_result *r) MR_WUR;

/* The trials of rung `rung` (ascending): every trial for rung 0; for a later rung the best
 * floor(count / reduction) (at least 1) of the previous rung's trials that finished it (SW_DONE),
 * by sweep.metric in sweep.goal's direction, ties to the lower trial number. Returns the count,
 * or -1 when the previous rung is not finished (a trial there has no result yet). */
int sw_rung_members(const sw_trials *t, int rung, int *members);

/* Writes <dir>/schedule.txt: the members of every decided rung (ASHA). */
mr_status sw_write_schedule(const sw_trials *t) MR_WUR;

/* The table of results: a row per trial from its latest result. running[i] (may be NULL): trial
 * i's rung being trained now, or -1. Prints aligned columns to out when csv is 0, else writes
 * results.csv's rows; *best gets the best trial's index (-1: none), *failed the trials that failed. */
mr_status sw_table(const sw_trials *t, const int *running, FILE *out, int csv, int *best, int *failed) MR_WUR;

/* Helpers for trial directories (a trial of another configuration is moved aside). */
char *sw_read_text(const char *path);
void sw_config_change(const char *old, const char *now, char *why, size_t cap);
mr_status sw_move_aside(const char *dir, char *moved, size_t cap) MR_WUR;
const char *sw_status_name(sw_status s);

#endif
