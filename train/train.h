/* The training loop: a model's compiled steps (autodiff/steps.h) fed by the input pipeline
 * (data/data.h), updated by optim/, evaluated periodically, reporting where the time goes.
 *
 * Every log step it prints one line (or a one-line progress display on a terminal) and appends a
 * JSON object to <run_dir>/metrics.jsonl: step, time (s since the start), loss, lr, loss_scale,
 * samples_per_s, and the step time split into data_wait_s, forward_s, backward_s,
 * communication_s and optimizer_s (averages over the log interval). Every evaluation appends
 * step, time, eval_loss and eval_accuracy (classifiers) or eval_perplexity (language models).
 * Library code: it reports through mr_status; the CLI maps that to an exit code. */
#ifndef MR_TRAIN_H
#define MR_TRAIN_H

#include <stdint.h>
#include "data/augment.h"
#include "models/models.h"
#include "optim/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_TEXT_HOLDOUT 64

/* mr_train_cfg.data_source (train/train_source_impl.h). */
enum { MR_TRAIN_SRC_IDX = 0, MR_TRAIN_SRC_HDF5 = 1, MR_TRAIN_SRC_NPY = 2, MR_TRAIN_SRC_TFRECORD = 3 };

struct mr_train_state;
struct mr_comm;

typedef struct mr_train_cfg {
    mr_model_cfg model;
    mr_optim_cfg optim;
    mr_schedule_cfg schedule;   /* schedule.total is set to steps when 0 */
    double grad_clip;           /* global-norm clipping; 0: off */
    int64_t steps, batch;       /* optimizer steps; global batch (per step, over all micro-batches) */
    int64_t accumulate;         /* micro-batches per step (batch must divide by it); >= 1 */
    int64_t eval_every, log_every; /* 0: only at the end / never */
    uint64_t seed;              /* parameter init, shuffling */
    /* data: IDX image/label files for mlp and cnn; a token file for gpt */
    const char *train_images, *train_labels, *eval_images, *eval_labels;
    const char *train_tokens, *eval_tokens;
    int token_bytes;            /* 2 or 4 */
    /* or a text file read as UTF-8 characters (gpt; model.vocab becomes the text's character
     * count). When eval_text names the same file, its first MR_TEXT_HOLDOUT windows are held out
     * for evaluation and training skips them. */
    const char *train_text, *eval_text;
    /* The classifier's source kind (train/train_source_impl.h): MR_TRAIN_SRC_IDX (0: train_images and
     * train_labels are IDX files), HDF5 (train_images is the file, train_x_dataset and
     * train_y_dataset the datasets), NPY (.npy files in train_images/train_labels, or with
     * train_x_dataset/train_y_dataset set, a .npz in train_images and its members) or TFRECORD (train_images; train_x_dataset and
     * train_y_dataset are the Example's image and label feature keys). Every
     * path may be a glob or a '\n'-separated list (a sharded set, read as one dataset); so may
     * train_tokens. */
    int data_source;
    const char *train_x_dataset, *train_y_dataset, *eval_x_dataset, *eval_y_dataset;
    int train_label_i32, eval_label_i32; /* TFRECORD: read the label as int32 (range-checked) */
    int64_t train_image_shape[9], eval_image_shape[9]; /* TFRECORD: [0] dims, then the sizes (0 dims: the
                                                        * model's sample shape) */
    int64_t sample_chars;       /* text gpt: characters generated after training (0: none) */
    int64_t shuffle;            /* shuffle buffer; 0: no shuffling */
    mr_augment_cfg augment;     /* data.train.augment: training image maps; evaluation takes its normalize ops */
    const char *run_dir;        /* metrics.jsonl goes there (created); NULL: no files */
    int quiet;                  /* no progress output */
    int no_progress;            /* no per-step progress lines (log.progress: false, --quiet); messages
                                 * and evaluations still print */
    mr_dtype compute;           /* MR_F32, MR_BF16 (mixed_bfloat16) or MR_F16 (mixed_float16); f32
                                 * master weights and optimizer state in every case */
    /* Dynamic loss scaling: on by default for MR_F16 (the scaler's settings come from here:
     * mr_loss_scaler_default()); loss_scaling = 1 forces it for the other compute types, -1 turns
     * it off. */
    int loss_scaling;
    mr_loss_scaler loss_scaler;
    /* Checkpoints (checkpoint/ckpt.h): ckpt-<step>.h5 files in ckpt_dir every ckpt_every steps
     * (0: only at the end, and when stopped by mr_train_request_stop) keeping the newest ckpt_keep
     * (0: all). resume: "auto" (the newest complete checkpoint in ckpt_dir, if any), "never"/NULL,
     * or a checkpoint path. init_from: an HDF5 file whose /params initialise a fresh run.
     * config_text: the experiment's YAML, saved in every checkpoint. */
    const char *ckpt_dir;
    int64_t ckpt_every, ckpt_keep;
    const char *resume, *init_from, *config_text;
    /* Replicas (MirroredStrategy): train.batch is global and split evenly over them; gradients
     * are averaged with an all-reduce, so N replicas update like one with the whole batch.
     * comm: an MPI communicator (distribute/comm.h, borrowed): one replica per rank, or with
     * replicas > 1 that many per rank (threads; the hierarchical backend). Without comm,
     * replicas > 1: that many CPU replicas in this process (threads, the `local` backend). Every
     * local collective has the deadline comm_timeout_s (300 s when 0). */
    struct mr_comm *comm;
    int replicas;
    double comm_timeout_s;
    double bucket_mb;           /* gradient bucket size for the overlapped all-reduce (16 when 0) */
    int rank_logs;              /* replicas other than 0 report progress too (into their own log;
                                 * the CLI redirects their output); else they stay quiet */
    int shard_optimizer;        /* ZeRO-1 over the replicas: reduce-scatter the gradients, update
                                 * this replica's shard of the parameters and optimizer state,
                                 * all-gather the parameters (no overlap with the backward) */
    /* Where each replica trains. device_kind MR_DEVICE_CPU (the default) keeps parameters,
     * gradients and the optimizer in host memory (the host path). MR_DEVICE_CUDA puts them on GPU
     * gpus[r] for local replica r (gpus[0] for a single replica; -1 picks the MPI rank's local
     * index modulo the visible GPUs): the device path, where gradients are all-reduced with NCCL
     * (bootstrapped over the replicas' host communicator) and batches are copied from pinned host
     * buffers. device_path 1 runs the device path on the CPU (separate buffers, copies, the device
     * optimizer), which is how tests check it against the host path without a GPU.
     * cuda_graphs: replay the training step from a captured CUDA graph after its first run (not
     * with dropout). allow_tf32: f32 GEMMs may use TF32 on the GPU. */
    int device_kind;
    int gpus[16];
    int device_path;
    int cuda_graphs;
    int allow_tf32;
    /* Early stopping (Keras EarlyStopping): with early_stop_patience > 0, the run ends after that
     * many evaluations in a row in which early_stop_metric (0 eval_loss, 1 eval_accuracy,
     * 2 eval_perplexity) did not improve on the best by more than early_stop_min_delta
     * (early_stop_mode 1: downwards, 2: upwards, 0 auto: upwards for accuracy); it saves a checkpoint (with ckpt_dir) and returns MR_OK with
     * res->early_stopped. The counter is in the checkpoint: a resumed run counts on, and a run
     * resumed from the checkpoint of its early stop trains nothing. */
    int64_t early_stop_patience;
    int early_stop_metric, early_stop_mode;
    double early_stop_min_delta;
    /* What a run shows (train/tb.h, train/trace.c), with run_dir: tensorboard writes TensorBoard
     * event files into <run_dir>/tb (the scalars of metrics.jsonl, the resolved config as text at
     * the first step, histograms of parameters and gradients every histogram_every steps when > 0);
     * steps trace_first..trace_last (1-based; 0 0: none) are traced into <run_dir>/trace.json
     * (Chrome trace format, every replica in one file), with per-op spans when trace_ops. */
    int tensorboard;
    int64_t histogram_every;
    int64_t trace_first, trace_last;
    int trace_ops;
    /* Tests: after every completed step (skipped ones too) on_step is called with the state; at
     * 1-based step inject_nonfinite_at (0: never) one gradient is set to +inf after the backward,
     * as an f16 overflow would: the buffer's middle element, or with inject_nonfinite_param
     * (registry names separated by commas, e.g. "fc1.bias,fc2.weight") the middle element of each
     * named parameter's gradient (an unknown name: MR_ERR_INVALID naming it). */
    void (*on_step)(void *ctx, const struct mr_train_state *state);
    void *on_step_ctx;
    int64_t inject_nonfinite_at;
    const char *inject_nonfinite_param;
    /* Tests: at each log step on replica 0, on_log(ctx, state, 0) before the host reads anything
     * back (state: step only, the rest NULL or 0), and on_log(ctx, state, 1) once the log step's
     * work (read-back, log line, evaluation, checkpoint) is done, with the whole state; unlike
     * on_step it leaves the steps between log steps alone (what the device path does there is
     * what a test of "no host synchronisation between log steps" counts). */
    void (*on_log)(void *ctx, const struct mr_train_state *state, int done);
    void *on_log_ctx;
    /* Tests: 1 all-reduces the whole gradient buffer after the backward, as with accumulation,
     * instead of in buckets behind it (the reference the overlapped exchange must equal). */
    int no_grad_overlap;
    /* Tests: replica stall_replica, at 1-based step stall_at (0: never), sleeps stall_s seconds
     * right after the step's host agreement, before it enqueues the rest of the step (the loss's
     * all-reduce on GPUs): a replica that hangs where its peers already wait on the device. */
    int64_t stall_at;
    int stall_replica;
    double stall_s;
} mr_train_cfg;

/* What on_step sees on replica 0 (borrowed for the call): the registry (parameters by name), the optimizer
 * (state slots), the scaler and the step just completed (1-based). */
typedef struct mr_train_state {
    int64_t step;
    const mr_params *params;
    const mr_optim *optim;
    const mr_loss_scaler *scaler; /* NULL without loss scaling */
    int skipped;                  /* this step's update was skipped (non-finite gradients) */
    double loss;                  /* this step's mean loss */
} mr_train_state;

typedef struct mr_train_result {
    int64_t steps;
    double seconds;
    double last_loss;          /* mean training loss of the last log interval */
    double eval_loss, eval_accuracy, eval_perplexity; /* the final evaluation (NaN when none) */
    int64_t eval_samples;      /* the samples (windows) it covered, over every replica: all of the data */
    int compilations;
    int64_t skipped_steps;     /* updates skipped by the loss scaler */
    double loss_scale;         /* the scale at the end (1 without loss scaling) */
    int64_t resumed_from;      /* the checkpoint step the run resumed from (0: a fresh start) */
    int stopped_by;            /* the signal number when mr_train_request_stop ended the run early */
    int64_t early_stopped;     /* the step early stopping ended the run at (0: it did not) */
    double early_stop_best;    /* the best value of the early-stopping metric, and its step */
    int64_t early_stop_best_step;
    char checkpoint[4096];     /* the last checkpoint written ("" when none) */
    char sample[2048];         /* the generated text (UTF-8), when sample_chars > 0 */
} mr_train_result;

/* Defaults: 1000 steps, batch 128, AdamW 1e-3, constant schedule, log every 50, eval at the end. */
mr_train_cfg mr_train_cfg_default(void);

/* mkdir -p: creates dir and its missing parents. MR_ERR_IO naming the path that failed. */
mr_status mr_mkdirs(const char *dir) MR_WUR;

/* Trains: from scratch, from init_from's parameters, or resuming a checkpoint (then bit-identical
 * to a run that never stopped: parameters, optimizer state, loss scaler, data order, dropout
 * masks and the metrics all continue exactly). MR_ERR_INVALID (a bad config, naming the field),
 * MR_ERR_NOT_FOUND / IO / FORMAT (data, checkpoints: naming the file and the parameter),
 * MR_ERR_NUMERIC when training diverges: "non-finite loss (nan) at step N" without loss scaling,
 * "step N: non-finite gradients in NAME (first of K in backward order) ... with the loss scale at its
 * floor" when the loss scaler can back off no further (README.md "Overflow reports"); a step that
 * overflows above the floor is skipped and logged. MR_ERR_INVALID when resume is
 * "never" and ckpt_dir already holds checkpoints (a run directory belongs to one run). */
mr_status mr_train(const mr_train_cfg *cfg, mr_train_result *res) MR_WUR;

/* MR_OK unless c->resume is "never" and c->ckpt_dir already holds checkpoints: then MR_ERR_INVALID
 * naming the directory, with a HINT (a new directory, or resume: auto). A run directory belongs to
 * one run: a fresh run there would overwrite its metrics, leave the old checkpoints to a later
 * resume: auto, and prune its own. mr_train checks it too; the CLI calls it before it writes the
 * directory's config.yaml. MR_ERR_IO when the directory cannot be listed. */
mr_status mr_train_check_run_dir(const mr_train_cfg *c) MR_WUR;

/* Asks a running mr_train to stop after its current step, saving a checkpoint first when
 * ckpt_dir is set (preemption: SIGTERM, SIGUSR1). Async-signal-safe: call it from a handler. */
void mr_train_request_stop(int signo);

/* Evaluates the model of cfg with the parameters of checkpoint (a mirror checkpoint or any HDF5
 * file with /params) on cfg's evaluation data: res gets eval_loss and eval_accuracy or
 * eval_perplexity, and steps = the checkpoint's step (0 for a foreign file). */
mr_status mr_evaluate_checkpoint(const mr_train_cfg *cfg, const char *checkpoint, mr_train_result *res) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
