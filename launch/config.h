/* The typed experiment config: one YAML file (configs/NAME.yaml) parsed with libyaml into
 * mr_experiment, --set overrides, the resolved config back as YAML, a stable hash for the
 * distributed handshake, and the expansion of a `sweep:` section into trials.
 *
 * Every key is validated against one table (launch/config.c): unknown keys (with a did-you-mean),
 * wrong types, out-of-range values, bad enum names, duplicate keys, missing required values and
 * missing data files are errors whose mr_last_error() is one line:
 *     "<file>:<line>:<column>: <dotted.key>: <what>"   (from a file; <file> is the basename)
 *     "--set:<column>: <dotted.key>: <what>"           (from mr_experiment_set)
 * The CLI adds the HINT line and exit code 2. Relative data paths are checked against the current
 * working directory. Nothing here is thread-unsafe except sharing one mr_experiment between a
 * writer and other threads. */
#ifndef MR_LAUNCH_CONFIG_H
#define MR_LAUNCH_CONFIG_H

#include <stdint.h>

#include "core/status.h"
#include "data/augment.h"
#include "models/models.h"
#include "optim/optim.h" /* mr_optim_kind, mr_schedule_kind */

#ifdef __cplusplus
extern "C" {
#endif

#define MR_CFG_PATH_MAX 512  /* bytes of a path value, NUL included */
#define MR_CFG_NAME_MAX 64   /* bytes of a name value (device, dataset, metric), NUL included */
#define MR_CFG_MAX_DEVICES 64
#define MR_SWEEP_MAX_PARAMS 16
#define MR_SWEEP_MAX_VALUES 32
#define MR_SWEEP_MAX_TRIALS 100000

typedef enum mr_data_source_kind {
    MR_SRC_NONE = 0, /* absent (allowed for data.eval only) */
    MR_SRC_IDX = 1,  /* images + labels IDX files (MNIST format) */
    MR_SRC_TOKENS = 2, /* a flat token file: path, token_bytes, context */
    MR_SRC_TEXT = 3, /* a text file tokenized by characters: path, context */
    MR_SRC_HDF5 = 4, /* an HDF5 file: path, x_dataset, y_dataset */
    MR_SRC_NPY = 5,  /* .npy files (images, labels) or a .npz (path, x_dataset, y_dataset members) */
    MR_SRC_TFRECORD = 6 /* TFRecord files of tf.train.Example: path, features */
} mr_data_source_kind;

#define MR_CFG_MAX_SHAPE 8
typedef struct mr_cfg_shape {
    int64_t n;
    int64_t dim[MR_CFG_MAX_SHAPE];
} mr_cfg_shape;

typedef struct mr_data_cfg {
    mr_data_source_kind source;
    char images[MR_CFG_PATH_MAX], labels[MR_CFG_PATH_MAX], path[MR_CFG_PATH_MAX];
    char x_dataset[MR_CFG_NAME_MAX], y_dataset[MR_CFG_NAME_MAX]; /* hdf5 datasets, npz members ("x", "y") */
    /* tfrecord: the tf.train.Example features (features.image.key, ...; launch/config_data.c) */
    char image_key[MR_CFG_NAME_MAX], label_key[MR_CFG_NAME_MAX];
    int image_dtype; /* 0: uint8 (a bytes_list of raw pixels), the one the trainer reads */
    mr_cfg_shape image_shape; /* the image's shape (n 0: model.input's) */
    int label_dtype; /* 0: int64, 1: int32 (an int64_list either way; int32 range-checked on read) */
    int64_t context;     /* tokens/text window; 0 = model.context */
    int64_t token_bytes; /* 2 or 4 */
    int64_t shuffle;     /* shuffle buffer in elements; 0 = no shuffle */
    int64_t seed;        /* shuffle seed; the experiment seed is mixed in by the trainer */
    mr_augment_cfg augment; /* data.train.augment (launch/config_augment.c); unused in data.eval */
} mr_data_cfg;

typedef enum mr_precision_policy { MR_PREC_F32 = 0, MR_PREC_MIXED_F16 = 1, MR_PREC_MIXED_BF16 = 2 } mr_precision_policy;
typedef enum mr_backend_kind { MR_BACKEND_AUTO = 0, MR_BACKEND_NCCL = 1, MR_BACKEND_MPI = 2, MR_BACKEND_LOCAL = 3 } mr_backend_kind;
typedef enum mr_sweep_method { MR_SWEEP_NONE = 0, MR_SWEEP_GRID = 1, MR_SWEEP_RANDOM = 2 } mr_sweep_method;
typedef enum mr_sweep_goal { MR_GOAL_MAX = 0, MR_GOAL_MIN = 1 } mr_sweep_goal;
typedef enum mr_sweep_sched { MR_SCHED_NONE = 0, MR_SCHED_ASHA = 1 } mr_sweep_sched;

/* One swept key: either a list of values (kept as the scalars' text, applied like --set) or a
 * range {min, max, log} (random sweeps only). */
typedef struct mr_sweep_param {
    char key[MR_CFG_NAME_MAX];
    int n_values; /* > 0: a list; 0: a range */
    char values[MR_SWEEP_MAX_VALUES][MR_CFG_NAME_MAX];
    double min, max;
    int log; /* draw log-uniformly */
} mr_sweep_param;

typedef struct mr_experiment {
    int64_t seed;
    mr_model_cfg model; /* model.{type, sizes, channels (ch1, ch2), input [c, h, w], hidden, ...} */
    struct { mr_data_cfg train, eval; } data;
    struct {
        mr_optim_kind type;
        double lr, momentum, weight_decay, beta1, beta2, eps, grad_clip; /* grad_clip 0 = off */
        int nesterov;
    } optimizer;
    struct {
        mr_schedule_kind type;
        int64_t warmup, step_size;
        double gamma, min_lr;
    } schedule;
    struct {
        mr_precision_policy policy;
        struct { double initial, growth_factor, backoff_factor, min; int64_t growth_interval; } loss_scale;
        int allow_tf32; /* f32 GEMMs on a GPU may use TF32 tensor cores */
    } precision;
    struct {
        int64_t steps, batch /* global */, eval_every /* 0 = never */, log_every, accumulate;
        struct {
            int64_t patience; /* evaluations without improvement before the run stops; 0: off */
            int metric;       /* 0 eval_loss, 1 eval_accuracy, 2 eval_perplexity */
            int mode;         /* 0 auto (max for accuracy, min otherwise), 1 min, 2 max */
            double min_delta; /* an improvement must exceed it */
        } early_stop;
    } train;
    struct {
        char dir[MR_CFG_PATH_MAX];
        int64_t every, keep; /* every 0 = only at the end; keep 0 = keep all */
        char resume[MR_CFG_PATH_MAX]; /* "auto", "never" or a checkpoint path */
        char init_from[MR_CFG_PATH_MAX]; /* "" = none */
    } checkpoint;
    struct {
        int n_devices; /* 0 = auto */
        char devices[MR_CFG_MAX_DEVICES][MR_CFG_NAME_MAX];
        mr_backend_kind backend;
        double bucket_mb, timeout_s;
        int shard_optimizer;
        int rank_logs; /* every rank but 0 writes its output to <checkpoint.dir>/rank-N.log */
        int cuda_graphs; /* GPU replicas replay their step from a captured CUDA graph */
    } distribute;
    struct {
        mr_sweep_method method; /* NONE: no sweep */
        int64_t trials, seed;
        char metric[MR_CFG_NAME_MAX];
        mr_sweep_goal goal;
        int n_params;
        mr_sweep_param params[MR_SWEEP_MAX_PARAMS];
        int64_t ranks_per_trial; /* MPI ranks that train one trial (0: all): N / ranks_per_trial trials at once */
        struct {
            mr_sweep_sched type;   /* NONE: every trial trains train.steps */
            int64_t min_steps;     /* the first rung */
            int64_t reduction;     /* rung k at min_steps * reduction^k; the top 1/reduction go on */
            int64_t max_steps;     /* the last rung (0: train.steps) */
        } scheduler;
    } sweep;
    struct {
        int progress;           /* a line per log step (false: only evaluations and messages) */
        int tensorboard;        /* <checkpoint.dir>/tb/events.out.tfevents.* (train/tb.h) */
        int64_t histogram_every; /* TensorBoard histograms of parameters and gradients (0: none) */
        int64_t trace[2];       /* [first, last] steps traced into <checkpoint.dir>/trace.json; 0 0: none */
        int trace_ops;          /* per-op spans in the trace */
    } log;
    char *yaml_text; /* the original YAML as read (owned; NULL for a default); saved in checkpoints */
    unsigned char overridden[16]; /* bit i: the key mr_cfg_fields[i] was given by mr_experiment_set (--set) */
} mr_experiment;

/* The defaults (the reference CNN, adamw lr 1e-3, cosine, f32, 1000 steps of batch 64, no data).
 * The struct is zeroed first, so two experiments with the same values compare equal with memcmp
 * once yaml_text is set aside. No allocation; mr_experiment_deinit is still fine to call. */
mr_experiment mr_experiment_default(void);

/* Frees yaml_text and resets to the defaults. NULL is a no-op. */
void mr_experiment_deinit(mr_experiment *e);

/* Deep copy (yaml_text duplicated) into *dst, which must not hold a yaml_text. MR_ERR_NOMEM. */
mr_status mr_experiment_copy(mr_experiment *dst, const mr_experiment *src) MR_WUR;

/* Parses YAML text onto the defaults. name_for_messages names the source in errors. Runs every
 * per-key check and the cross-key checks (mr_experiment_check). On success *out owns a copy of the
 * text; on error *out is the defaults (nothing to free) and mr_last_error() says file:line:col.
 * MR_ERR_FORMAT (YAML syntax), MR_ERR_INVALID, MR_ERR_NOT_FOUND (a data file), MR_ERR_NOMEM. */
mr_status mr_experiment_parse(const char *yaml_text, const char *name_for_messages, mr_experiment *out) MR_WUR;

/* Reads the file and parses it. MR_ERR_NOT_FOUND / MR_ERR_IO for the file itself. */
/* While on (this thread), loading and --set skip the "file exists" checks of data paths and
 * checkpoint.resume/init_from; mr_experiment_check (with it off) then checks the final values.
 * For a file whose paths --set replaces. */
void mr_experiment_defer_file_checks(int on);

mr_status mr_experiment_load(const char *path, mr_experiment *out) MR_WUR;

/* Applies one "dotted.key=value" override; value is YAML (a scalar, or a flow list such as
 * model.sizes=[784,256,10]); "sweep.params.KEY=[v1, v2]" or "={min: a, max: b, log: true}" set a
 * swept key. On error *e is unchanged. Cross-key rules are not checked here (overrides come in a
 * batch): call mr_experiment_check after the last one. */
mr_status mr_experiment_set(mr_experiment *e, const char *assignment) MR_WUR;

/* The cross-key rules (required data keys for the source, embd % heads, batch % accumulate,
 * a warning when warmup > steps, sweep consistency) and the keys that apply: a key given by --set that has no
 * effect for the values chosen (model.dropout with model.type cnn, optimizer.momentum with adam,
 * precision.loss_scale without mixed_float16, ...) is an error; a key of the file that a --set
 * override made pointless (--set model.type=mlp on a cnn file) is dropped with a warning. Errors
 * name where the key was given: "<file>:<line>:<col>: " (positions from e->yaml_text), "--set: ",
 * or "<origin>: " for a key given nowhere (a missing required value). Here only, not while parsing
 * (the document is valid; the trainer cannot run it yet): an hdf5 source (MR_ERR_UNSUPPORTED, its
 * x_dataset/y_dataset would go unread) and an evaluation source of another kind than the training
 * source (MR_ERR_INVALID, it would not be read). */
mr_status mr_experiment_check(const mr_experiment *e, const char *origin) MR_WUR;

/* The resolved config as YAML (caller frees *yaml_out with free()): only the keys that apply to
 * e's choices (an mlp's sizes, not a cnn's channels; sgd's momentum, not adam's betas), so the
 * text and the hash say what the run does. parse(to_yaml(e)) equals e in every field that applies
 * (the rest are the defaults). MR_ERR_NOMEM. */
mr_status mr_experiment_to_yaml(const mr_experiment *e, char **yaml_out) MR_WUR;

/* FNV-1a 64 of to_yaml's text: equal configs hash equal on every machine; yaml_text is ignored. */
mr_status mr_experiment_hash(const mr_experiment *e, uint64_t *out) MR_WUR;

struct mr_train_cfg; /* train/train.h */

/* The trainer's view of a checked experiment (launch/config_train.c): every field of *out is set
 * from e (mr_train_cfg_default plays no part: the CLI's defaults are mr_experiment_default's) or
 * to a stated constant. run_dir is the run directory (metrics, checkpoints; NULL: no files);
 * checkpoint.dir is the caller's to pass. Left for the caller: quiet, comm, config_text. *out
 * points into e (the data paths, checkpoint.resume, init_from): e must outlive it.
 * MR_ERR_INVALID for a device list the trainer cannot use (naming distribute.devices or
 * distribute.backend), MR_ERR_UNSUPPORTED for a data source it cannot read. */
mr_status mr_experiment_train_cfg(const mr_experiment *e, const char *run_dir, struct mr_train_cfg *out) MR_WUR;

/* Expands base's sweep into *n trials (caller frees with mr_sweep_free(*trials, *n)). Each trial
 * is base with the sweep section cleared and its params applied through the --set code.
 * grid: the cartesian product of the lists, params in file order, the LAST param varying fastest
 * (nested loops with the first param outermost); every param must be a list.
 * random: sweep.trials draws; param p of trial t uses Philox(sweep.seed, offset t) words 2p and
 * 2p+1 as a 53-bit uniform u: a list picks values[floor(u*n)], a range min + u*(max-min)
 * (exp of that in log space when log: true; integer keys take floor(min + u*(max-min+1))).
 * MR_ERR_INVALID (no sweep, too many trials, a value that fails validation), MR_ERR_NOMEM. */
mr_status mr_sweep_expand(const mr_experiment *base, mr_experiment **trials, int *n) MR_WUR;

/* Deinits and frees the n trials. NULL is a no-op. */
void mr_sweep_free(mr_experiment *trials, int n);

#ifdef __cplusplus
}
#endif
#endif
