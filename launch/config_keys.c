/* The experiment config's key table (launch/config_impl.h): every key's dotted path, kind, offset
 * in mr_experiment, range and flags, in to_yaml's order. One row drives parsing, validation, --set,
 * to_yaml (and so the hash) and sweeps (launch/config.c, config_out.c, config_apply.c), so a key
 * added here is parsed, checked, overridable, saved and sweepable at once. */
#include <stddef.h>

#include "launch/config_impl.h"

_Static_assert(sizeof(mr_model_type) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(mr_optim_kind) == sizeof(int), "enum fields are written as int");

/* ---- the key table ---------------------------------------------------------------------------- */

static const char *const MODEL_TYPES[] = {"mlp", "cnn", "gpt", "graph", NULL};
static const char *const SOURCES[] = {"none", "idx", "tokens", "text", "hdf5", "npy", "tfrecord", NULL};
static const char *const OPTIMS[] = {"sgd", "adam", "adamw", NULL};
static const char *const SCHEDS[] = {"constant", "step", "cosine", "linear", NULL};
static const char *const POLICIES[] = {"float32", "mixed_float16", "mixed_bfloat16", NULL};
static const char *const BACKENDS[] = {"auto", "nccl", "mpi", "local", NULL};
static const char *const METHODS[] = {"none", "grid", "random", NULL};
static const char *const GOALS[] = {"max", "min", NULL};
static const char *const SWEEP_SCHEDS[] = {"none", "asha", NULL};
static const char *const ES_METRICS[] = {"eval_loss", "eval_accuracy", "eval_perplexity", NULL};
static const char *const ES_MODES[] = {"auto", "min", "max", NULL};

#define OFF(m) offsetof(mr_experiment, m)
#define BIG 9.0e18
#define FI(p, m, lo) {p, K_INT, OFF(m), 0, lo, BIG, 0, NULL}
#define FN(p, m, lo, hi, fl) {p, K_NUM, OFF(m), 0, lo, hi, fl, NULL}
#define FB(p, m) {p, K_BOOL, OFF(m), 0, 0, 0, 0, NULL}
#define FS(p, m, fl) {p, K_STR, OFF(m), sizeof(((mr_experiment *)0)->m), 0, 0, fl, NULL}
#define FE(p, m, names) {p, K_ENUM, OFF(m), 0, 0, 0, 0, names}
#define DATA_FIELDS(s)                                                                              \
    FE("data." #s ".source", data.s.source, SOURCES), FS("data." #s ".images", data.s.images, F_FILE), \
    FS("data." #s ".labels", data.s.labels, F_FILE), FS("data." #s ".path", data.s.path, F_FILE),     \
    FS("data." #s ".x_dataset", data.s.x_dataset, F_NONEMPTY),                                        \
    FS("data." #s ".y_dataset", data.s.y_dataset, F_NONEMPTY), FI("data." #s ".context", data.s.context, 0), \
    FI("data." #s ".token_bytes", data.s.token_bytes, 2), FI("data." #s ".shuffle", data.s.shuffle, 0),      \
    FI("data." #s ".seed", data.s.seed, 0), FS("data." #s ".features.image.key", data.s.image_key, F_NONEMPTY),     \
    FE("data." #s ".features.image.dtype", data.s.image_dtype, MR_CFG_IMAGE_DTYPES),                             \
    {"data." #s ".features.image.shape", K_SHAPE, OFF(data.s.image_shape), 0, 0, 0, 0, NULL},                      \
    FS("data." #s ".features.label.key", data.s.label_key, F_NONEMPTY),                                          \
    FE("data." #s ".features.label.dtype", data.s.label_dtype, MR_CFG_LABEL_DTYPES)

const field mr_cfg_fields[] = {
    FI("seed", seed, 0),
    FE("model.type", model.type, MODEL_TYPES),
    {"model.sizes", K_SIZES, OFF(model), 0, 0, 0, 0, NULL},
    {"model.channels", K_CHANNELS, OFF(model), 0, 0, 0, 0, NULL},
    {"model.input", K_INPUT, OFF(model), 0, 0, 0, 0, NULL},
    FI("model.hidden", model.hidden, 1), FI("model.classes", model.classes, 2),
    FI("model.vocab", model.vocab, 2), FI("model.context", model.context, 1),
    FI("model.layers", model.layers, 1), FI("model.heads", model.heads, 1), FI("model.embd", model.embd, 1),
    FN("model.dropout", model.dropout, 0, 1, F_HI_EXCL),
    DATA_FIELDS(train),
    {"data.train.augment", K_AUGMENT, OFF(data.train.augment), 0, 0, 0, 0, NULL},
    DATA_FIELDS(eval),
    FE("optimizer.type", optimizer.type, OPTIMS),
    FN("optimizer.lr", optimizer.lr, 0, BIG, F_LO_EXCL),
    FN("optimizer.momentum", optimizer.momentum, 0, 1, F_HI_EXCL),
    FB("optimizer.nesterov", optimizer.nesterov),
    FN("optimizer.weight_decay", optimizer.weight_decay, 0, BIG, 0),
    FN("optimizer.beta1", optimizer.beta1, 0, 1, F_HI_EXCL),
    FN("optimizer.beta2", optimizer.beta2, 0, 1, F_HI_EXCL),
    FN("optimizer.eps", optimizer.eps, 0, BIG, F_LO_EXCL),
    FN("optimizer.grad_clip", optimizer.grad_clip, 0, BIG, 0),
    FE("schedule.type", schedule.type, SCHEDS),
    FI("schedule.warmup", schedule.warmup, 0), FI("schedule.step_size", schedule.step_size, 1),
    FN("schedule.gamma", schedule.gamma, 0, BIG, F_LO_EXCL),
    FN("schedule.min_lr", schedule.min_lr, 0, BIG, 0),
    FE("precision.policy", precision.policy, POLICIES),
    FN("precision.loss_scale.initial", precision.loss_scale.initial, 0, BIG, F_LO_EXCL),
    FI("precision.loss_scale.growth_interval", precision.loss_scale.growth_interval, 1),
    FN("precision.loss_scale.growth_factor", precision.loss_scale.growth_factor, 1, BIG, F_LO_EXCL),
    FN("precision.loss_scale.backoff_factor", precision.loss_scale.backoff_factor, 0, 1, F_LO_EXCL | F_HI_EXCL),
    FN("precision.loss_scale.min", precision.loss_scale.min, 0, BIG, F_LO_EXCL),
    FB("precision.allow_tf32", precision.allow_tf32),
    FI("train.steps", train.steps, 1), FI("train.batch", train.batch, 1), FI("train.eval_every", train.eval_every, 0),
    FI("train.log_every", train.log_every, 1), FI("train.accumulate", train.accumulate, 1),
    FI("train.early_stop.patience", train.early_stop.patience, 0),
    FE("train.early_stop.metric", train.early_stop.metric, ES_METRICS),
    FE("train.early_stop.mode", train.early_stop.mode, ES_MODES),
    FN("train.early_stop.min_delta", train.early_stop.min_delta, 0, BIG, 0),
    FS("checkpoint.dir", checkpoint.dir, F_NONEMPTY), FI("checkpoint.every", checkpoint.every, 0),
    FI("checkpoint.keep", checkpoint.keep, 0), FS("checkpoint.resume", checkpoint.resume, F_RESUME | F_NONEMPTY),
    FS("checkpoint.init_from", checkpoint.init_from, F_FILE),
    {"distribute.devices", K_DEVICES, OFF(distribute), 0, 0, 0, 0, NULL},
    FE("distribute.backend", distribute.backend, BACKENDS),
    FN("distribute.bucket_mb", distribute.bucket_mb, 0, BIG, F_LO_EXCL),
    FN("distribute.timeout_s", distribute.timeout_s, 0, BIG, F_LO_EXCL),
    FB("distribute.shard_optimizer", distribute.shard_optimizer),
    FB("distribute.rank_logs", distribute.rank_logs),
    FB("distribute.cuda_graphs", distribute.cuda_graphs),
    FB("log.progress", log.progress), FB("log.tensorboard", log.tensorboard),
    FI("log.histogram_every", log.histogram_every, 0),
    {"log.trace", K_WINDOW, OFF(log.trace), 0, 0, 0, 0, NULL},
    FB("log.trace_ops", log.trace_ops),
    FE("sweep.method", sweep.method, METHODS), FI("sweep.trials", sweep.trials, 1), FI("sweep.seed", sweep.seed, 0),
    FS("sweep.metric", sweep.metric, F_NONEMPTY), FE("sweep.goal", sweep.goal, GOALS),
    {"sweep.params", K_PARAMS, OFF(sweep), 0, 0, 0, 0, NULL},
    FI("sweep.ranks_per_trial", sweep.ranks_per_trial, 0), FE("sweep.scheduler.type", sweep.scheduler.type, SWEEP_SCHEDS),
    FI("sweep.scheduler.min_steps", sweep.scheduler.min_steps, 1),
    FI("sweep.scheduler.reduction", sweep.scheduler.reduction, 2),
    FI("sweep.scheduler.max_steps", sweep.scheduler.max_steps, 0),
};
const int mr_cfg_n_fields = (int)(sizeof mr_cfg_fields / sizeof mr_cfg_fields[0]);
_Static_assert(sizeof mr_cfg_fields / sizeof mr_cfg_fields[0] <= 8 * sizeof(((mr_experiment *)0)->overridden),
               "one overridden bit per key");
