/* What the `mirror` commands share (launch/main.c) with `mirror sweep` (launch/sweep.c): the job's
 * MPI communicator, the error printer that decides exit codes, config loading with --set, and
 * running one training into a run directory. Internal to the command line. */
#ifndef MR_LAUNCH_CLI_H
#define MR_LAUNCH_CLI_H

#include <stdint.h>

#include "distribute/comm.h"
#include "launch/config.h"
#include "train/train.h"

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

/* The job's MPI communicator when mpirun/srun started several ranks (or backend: mpi); NULL for a
 * single process. Set by mr_cli_start_job; lives until mr_cli_end_job. */
mr_comm *mr_cli_job(void);

/* Prints the last error ("mirror: error: [rank N: ]...") and a HINT; returns `code`. A message
 * that carries its own "; HINT: ..." prints that one instead of `hint` (NULL: none). */
int mr_cli_fail(int code, const char *hint);

/* Loads CONFIG (argv[first - 1]) and applies the --set / --quiet arguments argv[first..argc). */
mr_status mr_cli_load(int argc, char **argv, int first, mr_experiment *e) MR_WUR;

/* Starts the MPI job when this process is one of several ranks or the config asks for MPI. */
mr_status mr_cli_start_job(const mr_experiment *e) MR_WUR;

/* Ends the job with exit code `code` (a failure aborts the other ranks); returns code. */
int mr_cli_end_job(int code);

/* SIGTERM, SIGUSR1 and a first Ctrl-C make the trainer checkpoint and stop after its step. */
void mr_cli_install_preemption_handlers(void);
/* The first of those signals received (0: none). */
int mr_cli_stop_signal(void);

/* How one run is trained (mr_cli_run). */
typedef struct mr_cli_run_opts {
    mr_comm *comm;    /* the replicas' communicator (NULL: a single process) */
    int64_t steps;    /* > 0: train to this step instead of train.steps (a sweep's rung) */
    int64_t horizon;  /* > 0: the schedule's length (schedule.total) when the run stops short of it */
    int force_resume; /* resume the directory's newest checkpoint whatever checkpoint.resume says */
    int quiet_summary; /* no model summary */
} mr_cli_run_opts;

/* Trains e into dir: checks the directory, writes dir/config.yaml (rank 0 of opts->comm), trains. */
mr_status mr_cli_run(const mr_experiment *e, const char *dir, const mr_cli_run_opts *opts, mr_train_result *r) MR_WUR;

/* `mirror sweep` (launch/sweep.c). */
int mr_cli_sweep(int argc, char **argv);
extern const char *const mr_cli_sweep_help;

#endif
