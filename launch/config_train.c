/* The trainer's view of an experiment (launch/config.h, mr_experiment_train_cfg): every field of
 * mr_train_cfg is set here from the experiment or to a stated constant, so the CLI's defaults are
 * mr_experiment_default's alone (mr_train_cfg_default is never the starting point).
 *
 * Keys whose value is copied as it is go through one destination table keyed by the config key
 * (the source offset and kind come from the key table, config.c); the model section is the
 * model's own config; the data sources, the precision policy, log.progress and the device list
 * are translated by hand below. tests/unit/test_config_keys.c walks the key table and proves that
 * every key changes the result (or is rejected, or is consumed elsewhere, with the reason). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "launch/config_impl.h"
#include "train/train.h"

/* ---- keys copied as they are ------------------------------------------------------------------- */

typedef enum dest_kind {
    D_I64, /* int64_t from an integer key */
    D_U64, /* uint64_t from an integer key (>= 0 by its range) */
    D_INT, /* int from a bool or an enum key (the enums' values are the names' indices) */
    D_F64, /* double from a number key */
    D_STR  /* const char * into the experiment from a string key; "" is NULL (none) */
} dest_kind;

_Static_assert(MR_OPTIM_SGD == 0 && MR_OPTIM_ADAM == 1 && MR_OPTIM_ADAMW == 2, "optimizer.type names in enum order");
_Static_assert(MR_SCHEDULE_CONSTANT == 0 && MR_SCHEDULE_STEP == 1 && MR_SCHEDULE_COSINE == 2 && MR_SCHEDULE_LINEAR == 3,
               "schedule.type names in enum order");

#define TC(m) offsetof(mr_train_cfg, m)
static const struct dest {
    const char *key;
    size_t off;
    dest_kind k;
} DEST[] = {
    {"seed", TC(seed), D_U64},
    {"optimizer.type", TC(optim.kind), D_INT},
    {"optimizer.lr", TC(optim.lr), D_F64},
    {"optimizer.momentum", TC(optim.momentum), D_F64},
    {"optimizer.nesterov", TC(optim.nesterov), D_INT},
    {"optimizer.weight_decay", TC(optim.weight_decay), D_F64},
    {"optimizer.beta1", TC(optim.beta1), D_F64},
    {"optimizer.beta2", TC(optim.beta2), D_F64},
    {"optimizer.eps", TC(optim.eps), D_F64},
    {"optimizer.grad_clip", TC(grad_clip), D_F64},
    {"schedule.type", TC(schedule.kind), D_INT},
    {"schedule.warmup", TC(schedule.warmup), D_I64},
    {"schedule.step_size", TC(schedule.step_size), D_I64},
    {"schedule.gamma", TC(schedule.gamma), D_F64},
    {"schedule.min_lr", TC(schedule.min_lr), D_F64},
    {"precision.loss_scale.initial", TC(loss_scaler.scale), D_F64},
    {"precision.loss_scale.growth_interval", TC(loss_scaler.growth_interval), D_I64},
    {"precision.loss_scale.growth_factor", TC(loss_scaler.growth_factor), D_F64},
    {"precision.loss_scale.backoff_factor", TC(loss_scaler.backoff_factor), D_F64},
    {"precision.loss_scale.min", TC(loss_scaler.min_scale), D_F64},
    {"precision.allow_tf32", TC(allow_tf32), D_INT},
    {"train.steps", TC(steps), D_I64},
    {"train.steps", TC(schedule.total), D_I64}, /* cosine and linear reach min_lr at the last step */
    {"train.batch", TC(batch), D_I64},
    {"train.eval_every", TC(eval_every), D_I64},
    {"train.log_every", TC(log_every), D_I64},
    {"train.accumulate", TC(accumulate), D_I64},
    {"checkpoint.every", TC(ckpt_every), D_I64},
    {"checkpoint.keep", TC(ckpt_keep), D_I64},
    {"checkpoint.resume", TC(resume), D_STR},
    {"checkpoint.init_from", TC(init_from), D_STR},
    {"distribute.bucket_mb", TC(bucket_mb), D_F64},
    {"distribute.timeout_s", TC(comm_timeout_s), D_F64},
    {"distribute.shard_optimizer", TC(shard_optimizer), D_INT},
    {"distribute.rank_logs", TC(rank_logs), D_INT},
    {"distribute.cuda_graphs", TC(cuda_graphs), D_INT},
};
#undef TC

/* Copies one key's value; MR_ERR_INTERNAL when the table pairs a key with a kind it is not. */
static mr_status copy_key(const mr_experiment *e, const struct dest *d, mr_train_cfg *c) {
    const field *f = mr_cfg_find_field(d->key);
    const char *src = (const char *)e + (f ? f->off : 0);
    char *dst = (char *)c + d->off;
    int64_t i64;
    int i;
    double x;
    if (f && f->k == K_INT && (d->k == D_I64 || d->k == D_U64)) {
        memcpy(&i64, src, sizeof i64);
        if (d->k == D_I64) memcpy(dst, &i64, sizeof i64);
        else memcpy(dst, &(uint64_t){(uint64_t)i64}, sizeof(uint64_t));
    } else if (f && (f->k == K_BOOL || f->k == K_ENUM) && d->k == D_INT) {
        memcpy(&i, src, sizeof i);
        memcpy(dst, &i, sizeof i);
    } else if (f && f->k == K_NUM && d->k == D_F64) {
        memcpy(&x, src, sizeof x);
        memcpy(dst, &x, sizeof x);
    } else if (f && f->k == K_STR && d->k == D_STR) {
        const char *s = src[0] ? src : NULL;
        memcpy(dst, &s, sizeof s);
    } else {
        return mr_set_error(MR_ERR_INTERNAL, "config: the trainer mapping of %s does not fit the key's kind", d->key);
    }
    return MR_OK;
}

/* ---- translated keys --------------------------------------------------------------------------- */

/* data.<train|eval>: the source's files into the trainer's fields for that kind. The config check
 * (mr_experiment_check) has already refused what the trainer cannot read (an evaluation source of
 * another kind than the training one); this is the last line. */
static mr_status map_source(const mr_data_cfg *d, int train, mr_train_cfg *c) {
    const char **images = train ? &c->train_images : &c->eval_images;
    const char **labels = train ? &c->train_labels : &c->eval_labels;
    const char **tokens = train ? &c->train_tokens : &c->eval_tokens;
    const char **text = train ? &c->train_text : &c->eval_text;
    const char **xds = train ? &c->train_x_dataset : &c->eval_x_dataset;
    const char **yds = train ? &c->train_y_dataset : &c->eval_y_dataset;
    switch (d->source) {
    case MR_SRC_IDX: *images = d->images, *labels = d->labels; return MR_OK;
    case MR_SRC_HDF5: /* the file (or set) and its datasets: train/train_source.c */
        *images = d->path, *labels = NULL, *xds = d->x_dataset, *yds = d->y_dataset;
        return MR_OK;
    case MR_SRC_TFRECORD: /* the file (or set) and the Example's feature names */
        *images = d->path, *labels = NULL, *xds = d->image_key, *yds = d->label_key;
        *(train ? &c->train_label_i32 : &c->eval_label_i32) = d->label_dtype == 1;
        int64_t *shape = train ? c->train_image_shape : c->eval_image_shape;
        shape[0] = d->image_shape.n;
        for (int64_t i = 0; i < d->image_shape.n; i++) shape[1 + i] = d->image_shape.dim[i];
        return MR_OK;
    case MR_SRC_NPY: /* .npy files, or a .npz and its members */
        if (d->path[0]) *images = d->path, *labels = NULL, *xds = d->x_dataset, *yds = d->y_dataset;
        else *images = d->images, *labels = d->labels, *xds = *yds = NULL;
        return MR_OK;
    case MR_SRC_TOKENS: *tokens = d->path; return MR_OK;
    case MR_SRC_TEXT: *text = d->path; return MR_OK;
    case MR_SRC_NONE:
        if (!train) return MR_OK;
        return mr_set_error(MR_ERR_INVALID, "data.train.source: missing required value (idx, tokens, text, hdf5, npy "
                                            "or tfrecord)");
    default:
        return mr_set_error(MR_ERR_UNSUPPORTED, "data.%s.source: kind %d is not read by the trainer",
                            train ? "train" : "eval", (int)d->source);
    }
}

/* distribute.devices (and the nccl backend, which needs GPUs) into device_kind, gpus, replicas. */
static mr_status map_devices(const mr_experiment *e, mr_train_cfg *c) {
    int ncpu = 0, ngpu = 0;
    c->gpus[0] = -1; /* auto: the MPI rank's local index */
    for (int i = 0; i < e->distribute.n_devices; i++) {
        const char *d = e->distribute.devices[i];
        if (!strcmp(d, "cuda")) { /* one GPU per rank, picked by the rank's local index */
            if (e->distribute.n_devices != 1)
                return mr_set_error(MR_ERR_INVALID, "distribute.devices: 'cuda' (a GPU per MPI rank) cannot be listed with "
                                                    "other devices; HINT: [cuda] or [cuda:0, cuda:1, ...]");
            ngpu = 1;
            continue;
        }
        mr_device dev;
        /* cpu:N names the N-th CPU replica of this process (threads on the one CPU device), which
         * mr_device_parse does not accept: the core knows a single CPU device, cpu:0 */
        char *end = NULL;
        if (!strncmp(d, "cpu:", 4) && d[4] >= '0' && d[4] <= '9' && strtol(d + 4, &end, 10) <= 1023 && *end == '\0') {
            for (int j = 0; j < i; j++)
                if (!strcmp(e->distribute.devices[j], d))
                    return mr_set_error(MR_ERR_INVALID, "distribute.devices: %s is listed twice; HINT: cpu:0, cpu:1, ... "
                                                        "name one replica each", d);
            ncpu++;
            continue;
        }
        if (mr_device_parse(d, &dev) != MR_OK)
            return mr_set_error(MR_ERR_INVALID, "distribute.devices: '%s' is not a device; HINT: cpu:N, cuda:N, or cuda "
                                                "(a GPU per MPI rank)", d);
        if (dev.kind != MR_DEVICE_CUDA) {
            ncpu++;
            continue;
        }
        for (int j = 0; j < ngpu; j++)
            if (c->gpus[j] == dev.index)
                return mr_set_error(MR_ERR_INVALID, "distribute.devices: cuda:%d is listed twice; HINT: one replica per GPU",
                                    dev.index);
        if (ngpu >= (int)(sizeof c->gpus / sizeof *c->gpus))
            return mr_set_error(MR_ERR_INVALID, "distribute.devices: at most %d GPUs per process",
                                (int)(sizeof c->gpus / sizeof *c->gpus));
        c->gpus[ngpu++] = dev.index;
    }
    if (ncpu && ngpu)
        return mr_set_error(MR_ERR_INVALID, "distribute.devices: CPU and GPU replicas cannot be mixed; HINT: list only "
                                            "cpu:N or only cuda:N devices");
    c->device_kind = ngpu ? MR_DEVICE_CUDA : MR_DEVICE_CPU;
    if (e->distribute.backend == MR_BACKEND_NCCL && !ngpu)
        return mr_set_error(MR_ERR_INVALID, "distribute.backend: nccl needs GPU replicas; HINT: devices: [cuda] (one "
                                            "GPU per MPI rank) or [cuda:0, cuda:1, ...], or backend: auto");
    c->replicas = 1;
    if (ncpu > 1) c->replicas = ncpu; /* several CPU replicas in this process: the local backend */
    if (ngpu > 1) c->replicas = ngpu; /* several GPUs in this process: a thread each, NCCL between them */
    return MR_OK;
}

mr_status mr_experiment_train_cfg(const mr_experiment *e, const char *run_dir, mr_train_cfg *c) {
    memset(c, 0, sizeof *c); /* pointers NULL, flags off: what no key sets is stated below */
    for (size_t i = 0; i < sizeof DEST / sizeof DEST[0]; i++) {
        mr_status st = copy_key(e, &DEST[i], c);
        if (st) return st;
    }
    c->model = e->model; /* model.*: the model section is the model's own config */
    c->optim.dampening = 0; /* no key: PyTorch's default */

    /* data.*: the files for the sources; shuffle (training only: evaluation reads in order); one
     * token width, the training source's (data.eval.token_bytes has no effect: config_apply.c) */
    const mr_data_cfg *tr = &e->data.train, *ev = &e->data.eval;
    mr_status st = map_source(tr, 1, c);
    if (st == MR_OK) st = map_source(ev, 0, c);
    if (st) return st;
    c->shuffle = tr->shuffle;
    c->augment = tr->augment; /* evaluation applies its normalize ops (train/train_data.c) */
    c->data_source = tr->source == MR_SRC_HDF5 ? MR_TRAIN_SRC_HDF5 : tr->source == MR_SRC_NPY ? MR_TRAIN_SRC_NPY
                     : tr->source == MR_SRC_TFRECORD ? MR_TRAIN_SRC_TFRECORD : MR_TRAIN_SRC_IDX;
    c->token_bytes = (int)tr->token_bytes;
    c->sample_chars = tr->source == MR_SRC_TEXT ? 400 : 0; /* a character model prints what it learned */

    /* precision.policy: the compute type; loss scaling follows it (0: on for float16 only) */
    c->compute = e->precision.policy == MR_PREC_MIXED_BF16 ? MR_BF16 : e->precision.policy == MR_PREC_MIXED_F16 ? MR_F16 : MR_F32;
    c->loss_scaling = 0;
    c->no_progress = !e->log.progress;
    c->tensorboard = e->log.tensorboard;
    c->histogram_every = e->log.histogram_every;
    c->trace_first = e->log.trace[0], c->trace_last = e->log.trace[1];
    c->trace_ops = e->log.trace_ops;
    c->early_stop_patience = e->train.early_stop.patience;
    c->early_stop_metric = e->train.early_stop.metric;
    c->early_stop_mode = e->train.early_stop.mode;
    c->early_stop_min_delta = e->train.early_stop.min_delta;

    /* the run directory is the caller's (checkpoint.dir, or a sweep's trial-NNN; NULL: no files) */
    c->run_dir = run_dir;
    c->ckpt_dir = run_dir;
    /* the caller's: quiet (eval), comm (an MPI job), config_text (the resolved YAML); tests only:
     * device_path, on_step, on_step_ctx, inject_nonfinite_at; all 0 from the memset */
    return map_devices(e, c);
}
