/* Private to the trainer (train.c, train_ckpt.c, train_device.c, train_dist.c): the state of one training run, which is
 * exactly what a checkpoint saves and a resume restores. */
#ifndef MR_TRAIN_IMPL_H
#define MR_TRAIN_IMPL_H

#include <stdio.h>
#include "autodiff/steps.h"
#include "core/trace.h"
#include "data/data.h"
#include "distribute/comm.h"
#include "distribute/ddp.h"
#include "distribute/sync_hook.h"
#include "train/tb.h"
#include "train/train.h"
#include "core/vec.h"
#include "core/math/ctl_math.h"

typedef struct tr_pipeline {
    mr_dataset *ds;
    mr_data_iter *it;
} tr_pipeline;

/* Where one replica's step works. The device path (mr_train_cfg.device_kind / device_path, on):
 * parameters, gradients, buffers and optimizer state live on `dev`; the registry's host buffers
 * and t->opt are a shadow copy, refreshed for checkpoints (tr_dev_pull) and copied back after a
 * load or a broadcast (tr_dev_push). The host path (on 0): dev is the CPU and d_params, d_grads
 * are the registry's own buffers (no copies: push and pull do nothing, batches are bound, not
 * copied), the optimizer is t->opt; the step code is the same. */
#define TR_DEV_MAX_STEPS 8
typedef struct tr_dev_inputs {
    const mr_step *s;     /* the compiled step these buffers feed */
    void *d_x, *d_y;      /* device copies of the batch */
    void *h_x, *h_y;      /* pinned host staging */
    size_t bx, by;
    mr_event *ev;         /* recorded after the staging was last copied from (NULL: never) */
    /* the next batch on the copy stream (tr_dev_prefetch), double-buffered: slot k's pinned
     * staging and device landing buffers, the event after its host-to-device copy (copy stream)
     * and the one after its device copy into d_x, d_y (compute stream) */
    void *h_xs[2], *h_ys[2], *d_xs[2], *d_ys[2];
    mr_event *copied[2], *consumed[2];
    int slot_used[2];     /* the slot's events were recorded */
    int next_slot;
    int pending;          /* slot + 1 of a batch copied but not fed yet; 0: none */
} tr_dev_inputs;

typedef struct tr_device {
    int on;
    mr_device dev;
    const mr_backend *be;
    mr_stream *stream;
    mr_stream *copy_stream; /* input batches on a GPU (tr_dev_prefetch); NULL elsewhere */
    mr_event *ev_ctl[2];    /* a control-block sum over GPUs (train_step.c ctl_allreduce): the
                             * compute stream's point NCCL waits for, and NCCL's the stream waits for */
    float *d_params, *d_grads, *d_acc;
    /* The step's decisions (core/math/ctl_math.h) on the device, its host copy as last read
     * (tr_step_sync), ctl_read: the device has run steps since (a read is due before the host
     * uses the scaler, the loss or the step count), ctl_push: the host's state must be written
     * to the device before the next step (tr_step_ctl_push). The backward reads the loss scale
     * from d_ctl->scale_f32. */
    mr_step_ctl *d_ctl, *h_ctl;
    int ctl_read, ctl_push;
    float *d_bufs;          /* the model's buffers (mr_params_bufs: batch norm's running statistics) */
    int64_t n_bufs;         /* their floats (mr_params_buffer_numel; 0: the model has none) */
    double *d_scratch;      /* MR_VEC_SCRATCH doubles (mr_vec_sumsq) */
    mr_optim *opt;          /* the optimizer whose state is on dev */
    mr_comm *gcomm;         /* gradient all-reduce: NCCL on a GPU; the host communicator on the CPU */
    int own_gcomm;          /* gcomm was created here (NCCL) */
    mr_event *ev_wait;      /* tr_dev_sync's point on the stream (NCCL only; made on first use) */
    tr_dev_inputs in[TR_DEV_MAX_STEPS];
    int n_in;
    void *h_read;           /* host buffer for values read back (logits) */
    size_t h_read_bytes;
} tr_device;

/* The trace window (trace.c): a recorder with the training, communication and data tracks while
 * the run traces; every field 0 (tracks NULL: spans cost a NULL test) when it does not. */
typedef struct tr_trace_ident tr_trace_ident;
typedef struct tr_trace_clock tr_trace_clock;
typedef struct tr_trace {
    int want;               /* this run has a window ahead and replica 0 a run directory */
    int open, done;
    int force_measured;     /* MIRROR_TRACE_CLOCK=measured */
    int64_t first, last;    /* the window's steps in this run (1-based) */
    int32_t kernels;        /* of the training step (sizing the buffers) */
    double bound_mb;        /* MIRROR_TRACE_MB: the span buffers' bound per replica */
    mr_trace *rec;
    mr_trace_track *train, *comm, *data;
    tr_trace_ident *ids;    /* [world] each replica's host, kernel and process */
    tr_trace_clock *clocks; /* [nclocks] rank 0's measurements of the other processes' clocks */
    int nclocks;
} tr_trace;

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
    /* metrics.jsonl's "time" is seconds since the run's first start, across resumes: time_origin
     * is that start on this process's clock (CLOCK_MONOTONIC seconds), elapsed_before the
     * seconds a checkpoint carried (metrics.time; 0 for a fresh run or an older checkpoint) */
    double time_origin, elapsed_before;
    /* early stopping (c.early_stop_patience > 0; train_early.c): the metric's best value (NaN
     * before the first evaluation), its step, and the evaluations since without improvement;
     * carried in checkpoints, so a resumed run counts on */
    double es_best;
    int64_t es_best_step, es_bad;
    float *tb_grad;         /* TensorBoard's host copy of one gradient (device path; train_tb.c) */
    int64_t train_size;     /* elements of the training source (an epoch) */
    int64_t image_numel;    /* the image map's context: lives as long as the pipeline */
    /* ZeRO-1 (shard_optimizer): this replica owns params [zsh.off, zsh.off + zsh.len) of n; the
     * optimizer holds state for its shard only (distribute/ddp.h) */
    int zero;
    mr_ddp_shard zsh;
    mr_ddp *ddp;            /* the gradient exchange over comm (single mode without one) */
    mr_sync_hook sync;      /* sync batch norm's sum over comm (mr_model_uses_sync) */
    /* Where the step works (t->dv's): gdev is the CPU on the host path (the vector kernels of
     * core/vec.h give the host loops' bits there), stream and d_scratch NULL. acc: the
     * accumulation buffer (accumulate > 1). */
    mr_device gdev;
    const mr_backend *gbe;
    mr_stream *stream;
    float *params, *grads, *acc;
    double *d_scratch;
    mr_optim *wopt;
    tr_device dv;           /* where the step works: the device path (dv.on) or the registry */
    /* The finite check per parameter (tr_step_init): the part this replica checks (the whole
     * gradient, or its ZeRO-1 shard: [seg_off, seg_off + seg_n) of the buffer) cut at the
     * parameters' starts, d_seg (n_seg starts relative to the part) and d_bad (n_seg flags, zero
     * between steps) in gdev's memory (mr_vec_sumsq_seg); bwd_order: the registry indices in the
     * order the backward finishes their gradients; h_flag, h_count: host copies of the flags
     * (n_seg each), read only when a step was not finite. n_seg 0: no parameters. */
    int32_t n_seg;
    double check_sumsq;     /* this step's finite check's sum of squares when clipping may reuse it
                             * (no loss scaling: the same values); NaN: not reusable */
    int64_t seg_off, seg_n;
    int64_t *d_seg;
    int32_t *d_bad;
    int32_t *bwd_order, *h_flag;
    int64_t *h_count;
    int32_t *d_order;       /* bwd_order in gdev's memory (the device path's check, mr_vec_ctl_check) */
    double last_loss;       /* the device path: the last step's loss and whether it was applied, as */
    int last_apply;         /* of the last tr_step_sync (on_step reads them) */
    tr_trace trace;         /* the trace window (log.trace) */
    FILE *data_log;         /* MIRROR_DATA_LOG's per-replica sample log (train_data.c); NULL: off */
    /* the data position of the next step while its first batch is already fetched (tr_dev_prefetch:
     * the iterator is one batch ahead), which a checkpoint saves instead of the iterator's own
     * (mr_data_iter_save_global's blob); NULL when no batch is ahead */
    void *pf_blob;
    size_t pf_bytes;
} trainer;

/* ---- the device path (train_device.c) ---- */
/* Sets up t->dv for c->device_kind / c->device_path: picks the GPU, makes the stream, allocates
 * the parameter, gradient and scale buffers, points the steps at them (before any compilation;
 * the registry must be registered and allocated) and makes the device optimizer (with_optim).
 * On the host path: t->dv points at the registry's buffers (and an accumulation buffer). */
mr_status tr_dev_init(trainer *t, int with_optim) MR_WUR;
void tr_dev_free(trainer *t);
/* With several replicas: the gradient communicator (NCCL over t->comm on a GPU). */
mr_status tr_dev_comm(trainer *t) MR_WUR;
/* Host shadow -> device (parameters, buffers, optimizer state and step count), and back. */
mr_status tr_dev_push(trainer *t) MR_WUR;
mr_status tr_dev_pull(trainer *t) MR_WUR;
/* The buffers alone: host shadow -> device (push) or back. */
mr_status tr_dev_bufs(trainer *t, int push) MR_WUR;
/* The host waits for everything enqueued on dv->stream. With GPU replicas (NCCL) the stream may
 * wait for a collective a peer never joins (one that died or hangs after the step's host
 * agreement): the wait then has the communicator's deadline (mr_comm_nccl_host_wait, which aborts
 * the communicators on expiry), so the run fails naming `what` instead of hanging. */
mr_status tr_dev_sync(tr_device *dv, const char *what) MR_WUR;
/* Binds a batch to step s: the host pointers on the host path; copies into s's device buffers
 * (pinned staging, asynchronous on the stream) on the device path. */
mr_status tr_dev_feed(tr_device *dv, mr_step *s, const void *x, const void *y) MR_WUR;
/* The next batch of step s while the current one computes (a GPU: tr_dev_can_prefetch): x and y
 * are copied into one of two pinned staging slots (waiting, if need be, for the slot's previous
 * copy, which completed a step ago) and copied to the device on the copy stream, after the step
 * that read the slot's device buffers last. tr_dev_feed_prefetched feeds it: the compute stream
 * waits for the copy and copies it into the step's bound buffers (the plan's bindings, and so its
 * captured graphs, stay). One batch ahead at most: MR_ERR_INTERNAL for a second before a feed. */
int tr_dev_can_prefetch(const tr_device *dv);
mr_status tr_dev_prefetch(tr_device *dv, mr_step *s, const void *x, const void *y) MR_WUR;
/* Non-zero when step s has a batch from tr_dev_prefetch not fed yet. */
int tr_dev_prefetched(const tr_device *dv, const mr_step *s);
mr_status tr_dev_feed_prefetched(tr_device *dv, mr_step *s) MR_WUR;
/* The bytes of kept value v of step s after a run, as a host pointer valid until the next call
 * (the plan's own memory on the host path; a copy, after waiting for the stream, on a device). */
mr_status tr_dev_read(tr_device *dv, mr_step *s, mr_val v, size_t bytes, const void **out) MR_WUR;
/* Sets the loss scale the training steps read (the host path; on the device path the device's
 * loss scaler sets it, d_ctl->scale_f32). */
mr_status tr_dev_set_loss_scale(trainer *t, mr_step *s, float scale) MR_WUR;

/* Writes the run's state to path (atomically; checkpoint/ckpt.h). Collective over t->comm: the
 * replicas check that they agree on the data position (world-independent,
 * mr_data_iter_save_global), which goes into the file replica 0 writes; every replica gets its
 * status. */
mr_status tr_ckpt_save(trainer *t, const char *path) MR_WUR;
/* Restores the run's state from a checkpoint written by tr_ckpt_save (a compatible model: every
 * parameter by name and shape). The optimizer kind must match. Each replica reads the file and
 * the data position, exact on any number of replicas (a checkpoint of the older per-replica format:
 * with the same number; with another the data order starts over, logged). */
mr_status tr_ckpt_load(trainer *t, const char *path) MR_WUR;
/* Loads /params of an HDF5 file into the registry: every registry parameter must be there with
 * its shape and the file may hold no other (errors name the parameter). foreign: any HDF5 file
 * (init_from), else a mirror checkpoint. *step gets the checkpoint's step (0 if none). */
mr_status tr_load_params(mr_params *ps, const char *path, int foreign, int64_t *step) MR_WUR;

/* With several replicas, at the start: replica 0's parameters and optimizer state to every
 * replica, then a handshake comparing mirror's version, the experiment and the parameters' names
 * and shapes; a difference fails on every replica naming it and the replicas that differ. */
mr_status tr_replicas_start(trainer *t) MR_WUR;

/* Replica 0's buffers (batch norm's running statistics) to every replica, host and device: each
 * replica normalises its own micro-batch, so their statistics drift apart; replica 0's are the
 * model's (PyTorch DDP's broadcast_buffers). Collective over t->comm; a no-op without one or
 * without buffers. */
mr_status tr_bufs_broadcast(trainer *t) MR_WUR;

/* ZeRO-1: this replica's shard (before the optimizer is made over zsh.len elements). */
mr_status tr_zero_init(trainer *t) MR_WUR;

/* The gradient exchange (t->ddp) for step s: every parameter's gradient range and when s's
 * backward finishes it, the bucket size, the modes the run allows (train_dist.c). Collective
 * over t->comm. */
mr_status tr_ddp_new(trainer *t, const mr_step *s) MR_WUR;

/* ---- the input pipeline's augmentation and sample log (train_data.c) ---- */
/* Appends c->augment's maps to *ds (the image pipeline after the u8 -> f32 map, component "x"):
 * all of them for training, the normalize ops for evaluation (train 0); replaces *ds. Errors
 * name data.train.augment (a language model, an op that does not fit the images). */
mr_status tr_data_augment(const mr_train_cfg *c, int train, mr_dataset **ds) MR_WUR;
/* This replica's sample log "<$MIRROR_DATA_LOG>.<rank>" opened for appending; NULL when the
 * variable is unset (or the file cannot be opened: warned). */
FILE *tr_data_log_open(int rank);
/* One line "<tag> <pos0 + j*stride> <source index> <source epoch>" per element j of the batch it
 * delivered last. f NULL: a no-op. */
void tr_data_log_batch(FILE *f, const char *tag, const mr_data_iter *it, int64_t pos0, int64_t stride);

/* ---- one training step, top to bottom (train_step.c) ---- */
/* The finite check per parameter for the steps of s's layout (after tr_ddp_new: the shard is
 * known): the parameters' backward order from s's plan (mr_plan_ready_after: the order their
 * gradients become final; parameters no kernel writes go last), the segments and flags on gdev. */
mr_status tr_step_init(trainer *t, const mr_step *s) MR_WUR;
void tr_step_free(trainer *t); /* a trainer without tr_step_init: a no-op */
typedef struct tr_times {
    double data, fwd, bwd, comm, opt; /* seconds summed over the log interval */
} tr_times;
/* The next micro-batch(es) through the forward and the backward, the gradient exchange
 * overlapped with the backward where the mode allows; *loss: the mean over the micro-batches,
 * *g: the step's gradient (the gradient buffer, or the accumulation of the micro-batches'). */
mr_status tr_step_forward_backward(trainer *t, mr_step *s, tr_times *tm, double *loss, float **g) MR_WUR;
/* The replicas agree: the gradient averaged (*part: what this replica updates), the loss and a
 * stop request agreed (*loss, *stop in and out). */
mr_status tr_step_exchange(trainer *t, float *g, double *loss, int *stop, mr_ddp_part *part, tr_times *tm) MR_WUR;
/* The loss scaler's verdict (GradScaler: a non-finite gradient or loss on any replica skips the
 * update on all and halves the scale; the gradient is unscaled when applied); one pass over the
 * part checks every parameter (mr_vec_sumsq_seg). A skipped step is logged naming the first
 * parameter in backward order whose gradient was not finite, their count, whether the loss was
 * already not finite, and the scale's change; with the scale already at its floor the step is
 * MR_ERR_NUMERIC with that report and a HINT instead. Without scaling a non-finite loss is
 * MR_ERR_NUMERIC naming the first non-finite gradient too. Collective over the replicas (the
 * flags of ZeRO-1 shards are summed when a step was not finite). */
mr_status tr_step_check(trainer *t, double loss, const mr_ddp_part *part, int *apply) MR_WUR;
/* Clipping (the global norm over every replica's part) and the optimizer step at lr, then the
 * parameter shards to every replica (ZeRO-1). */
mr_status tr_step_update(trainer *t, const mr_ddp_part *part, double lr) MR_WUR;
/* The device path (t->dv.on) takes the decisions of tr_step_check and tr_step_update on the
 * device (t->dv.d_ctl): the loss, the finite check's verdict, the loss scaler, the skip and the
 * clip factor never come to the host during a step, so a steady step does not wait for the
 * device. tr_step_sync reads them back (one wait) where the host needs them: it logs the skip
 * warnings of the steps since the last read, fails as tr_step_check would have at the first step
 * that had to stop training (the device skipped every step after it, so the parameters are the
 * last good ones), and sets t->scaler, t->loss_sum, t->interval, the optimizer's step count,
 * t->last_loss and t->last_apply. A no-op on the host path or when no step ran since. */
mr_status tr_step_sync(trainer *t) MR_WUR;
/* The host's scaler, loss sums and optimizer step count to the device's control block (after a
 * load, and after tr_step_sync before the next step). A no-op on the host path. */
mr_status tr_step_ctl_push(trainer *t) MR_WUR;

double tr_now_s(void);

/* ---- early stopping (train_early.c) ---- */
/* After an evaluation (res holds it): updates the best value and the counter; 1 when the run must
 * stop now (patience evaluations without improvement). Every replica gets the same evaluation, so
 * every replica decides alike. */
int tr_early_stop_update(trainer *t, const mr_train_result *res);
/* The run already stopped early (a resume from its early stop's checkpoint). */
int tr_early_stopped(const trainer *t);
/* "step N: eval_loss has not improved ..." (replica 0's message). */
void tr_early_stop_message(const trainer *t, char *buf, size_t cap);

/* ---- what a log step reports (train.c) and TensorBoard (train_tb.c) ---- */
/* One log step's numbers: metrics.jsonl's line and TensorBoard's scalars are written from it. */
typedef struct tr_metrics {
    int64_t step, skipped;
    double time, loss, lr, loss_scale, samples_per_s, tokens_per_s /* 0: not a language model */;
    double data, fwd, bwd, comm, hidden, opt; /* per-step seconds over the interval; hidden: a share */
} tr_metrics;
/* Replica 0 with c.tensorboard and a run_dir: a new event file in <run_dir>/tb for a run that
 * starts at start_step (train/tb.h: resume), with the config as text; else *out = NULL. */
mr_status tr_tb_open(trainer *t, int64_t start_step, mr_tb **out) MR_WUR;
/* The log step's scalars, histograms when due (histogram_every), then a flush. */
mr_status tr_tb_step(trainer *t, mr_tb *tb, const tr_metrics *m) MR_WUR;
/* An evaluation's scalars, then a flush. */
mr_status tr_tb_eval(mr_tb *tb, int64_t step, int classify, const mr_train_result *r) MR_WUR;

/* ---- the trace window (trace.c) ---- */
/* After the run's start (the exchange made): the recorder and its tracks, wired into the
 * communicator, the exchange, the prefetch thread and (trace_ops) step s's plan, when the run
 * has a window ahead and job_has_run_dir (replica 0 writes <run_dir>/trace.json). No buffers yet.
 * Not collective. */
mr_status tr_trace_init(trainer *t, const mr_step *s, int job_has_run_dir) MR_WUR;
/* Before each step: opens the window before its first step (buffers, clocks). Collective. */
mr_status tr_trace_step_begin(trainer *t) MR_WUR;
/* After each step: closes the window after its last step, or when end (the run's last step, or
 * a stop), and replica 0 writes the trace. Collective. */
mr_status tr_trace_step_end(trainer *t, int end) MR_WUR;
/* The run failed inside the window: replica 0 writes its own spans (no collectives); the error
 * message stays the run's. */
void tr_trace_fail(trainer *t);
/* After the threads that write the tracks (queue, prefetch) are gone. */
void tr_trace_free(trainer *t);

#endif
