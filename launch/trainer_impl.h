/* Private to the trainer (trainer.c, trainer_ckpt.c): the state of one training run, which is
 * exactly what a checkpoint saves and a resume restores. */
#ifndef MR_TRAINER_IMPL_H
#define MR_TRAINER_IMPL_H

#include <stdio.h>
#include "autodiff/steps.h"
#include "data/data.h"
#include "distribute/comm.h"
#include "launch/trainer.h"

typedef struct tr_pipeline {
    mr_dataset *ds;
    mr_data_iter *it;
} tr_pipeline;

typedef struct trainer {
    mr_train_cfg c;         /* resolved: model sizes from the data, schedule.total set; quiet and
                             * without run_dir on ranks other than 0 */
    mr_comm *comm;          /* the replicas' communicator (NULL: one replica) */
    int rank, world;
    mr_params *ps;
    mr_steps *steps;
    mr_optim *opt;
    tr_pipeline train;
    int64_t n;              /* parameter elements */
    int scaling;            /* dynamic loss scaling on */
    mr_loss_scaler scaler;
    int64_t step;           /* optimizer steps completed (skipped ones included) */
    /* the metrics of the current log interval, carried through a checkpoint so a resumed run
     * logs the same numbers */
    double loss_sum;
    int64_t interval;
    int64_t train_size;     /* elements of the training source (an epoch) */
    int64_t image_numel;    /* the image map's context: lives as long as the pipeline */
    /* ZeRO-1 (shard_optimizer): this replica owns params [zoff, zoff + zlen) of n, in shards of
     * zshard_n = ceil(n / world); the optimizer holds state for its shard only */
    int zero;
    int64_t zoff, zlen, zshard_n;
    float *zbuf;            /* world * zshard_n: the padded gradient / parameter exchange buffer */
    float *zshard;          /* zshard_n: this replica's averaged gradient shard */
} trainer;

/* Writes the run's state to path (atomically; checkpoint/ckpt.h). Collective over t->comm: every
 * replica's data-iterator state goes into the file, which replica 0 writes; every replica gets
 * its status. */
mr_status tr_ckpt_save(trainer *t, const char *path) MR_WUR;
/* Restores the run's state from a checkpoint written by tr_ckpt_save (a compatible model: every
 * parameter by name and shape). The optimizer kind must match. Each replica reads the file and
 * its own data-iterator state; with another world size the data order starts over (logged). */
mr_status tr_ckpt_load(trainer *t, const char *path) MR_WUR;
/* Loads /params of an HDF5 file into the registry: every registry parameter must be there with
 * its shape and the file may hold no other (errors name the parameter). foreign: any HDF5 file
 * (init_from), else a mirror checkpoint. *step gets the checkpoint's step (0 if none). */
mr_status tr_load_params(mr_params *ps, const char *path, int foreign, int64_t *step) MR_WUR;

/* With several replicas, at the start: replica 0's parameters and optimizer state to every
 * replica, then a handshake comparing mirror's version, the experiment and the parameters' names
 * and shapes; a difference fails on every replica naming it and the replicas that differ. */
mr_status tr_replicas_start(trainer *t) MR_WUR;

/* ZeRO-1: set up the shard (before the optimizer is made over zlen elements). */
mr_status tr_zero_init(trainer *t) MR_WUR;
/* The gradient g (n) averaged over the replicas, this replica's shard into zshard (reduce-scatter). */
mr_status tr_zero_reduce(trainer *t, const float *g) MR_WUR;
/* *finite becomes 1 only when it is 1 on every replica. */
mr_status tr_zero_all(trainer *t, int *finite) MR_WUR;
/* Global-norm clipping of the sharded gradient (the norm over every shard). */
mr_status tr_zero_clip(trainer *t, double max_norm) MR_WUR;
/* Every replica's updated parameter shard to every replica (all-gather). */
mr_status tr_zero_gather(trainer *t) MR_WUR;
/* Optimizer slot k as a full-length (n) buffer: a sharded one is gathered into out (n floats). */
mr_status tr_zero_full_slot(trainer *t, int k, float *out) MR_WUR;

#endif
