/* What a training checkpoint holds and how a run comes back from it (the file layer, atomic
 * writes and checksums: checkpoint/ckpt.h; the layout is documented in the README):
 *   /params/<name>                 f32 master weights, PyTorch names and layouts
 *   /buffers/<name>                the model's buffers (mr_params_bufs: batch norm's running_mean,
 *                                  running_var, num_batches_tracked as a 0-d f32), replica 0's;
 *                                  only for models that have them
 *   /optimizer/<name>/<slot>       momentum_buffer | exp_avg, exp_avg_sq (f32)
 *   /state/data_iter/global        the data position, the same for any number of replicas (data.h,
 *                                  mr_data_iter_save_global); checkpoints before it hold
 *   /state/data_iter/<replica>     each replica's iterator state (mr_data_iter_save): still read
 *   attributes: step, epoch, optimizer.* (type, hyperparameters, steps), loss_scale.*, rng.*,
 *   metrics.* (the open log interval), early_stop.* (best, best_step, bad: evaluations without
 *   improvement; metric and mode: what they count), train.batch/accumulate, world_size, mirror_version,
 *   model, precision, config (the experiment's YAML). */
#include "train/train_impl.h"
#include "checkpoint/ckpt.h"
#include "core/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef MIRROR_VERSION
#define MIRROR_VERSION "unknown"
#endif

static const char *const OPTIM_NAMES[] = {"sgd", "adam", "adamw"};

static const char *compute_name(mr_dtype dt) {
    return dt == MR_BF16 ? "mixed_bfloat16" : dt == MR_F16 ? "mixed_float16" : "float32";
}

/* FNV-1a of a blob: the replicas compare their data positions by it before a checkpoint. */
static uint64_t ds_blob_hash(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

mr_status tr_ckpt_save(trainer *t, const char *path) {
    mr_status st = MR_OK;
    mr_ckpt_writer *w = NULL;
    void *blob = NULL;
    size_t bytes = 0;
    int64_t *sizes = NULL;
    float *full[2] = {NULL, NULL};
    char name[1024];
    const mr_train_cfg *c = &t->c;
    MR_TRY(mr_ckpt_writer_new(&w));
    /* the optimizer state in full: a sharded one (ZeRO-1) is gathered first, so the file is the
     * same whatever the sharding and any number of replicas can resume it */
    const int nslots = mr_optim_num_slots(t->opt);
    for (int k = 0; k < nslots && t->zero; k++) {
        full[k] = malloc(sizeof(float) * (size_t)t->n);
        MR_CHECK(full[k], MR_ERR_NOMEM, "checkpoint: out of memory for the optimizer state");
        MR_TRY(mr_ddp_gather_shards(t->ddp, mr_optim_slot(t->opt, k), full[k]));
    }
    const int32_t np = mr_params_count(t->ps);
    for (int32_t i = 0; i < np; i++) {
        mr_shape sh = mr_params_shape(t->ps, i);
        snprintf(name, sizeof name, "params/%s", mr_params_name(t->ps, i));
        MR_TRY(mr_ckpt_writer_add(w, name, MR_F32, &sh, mr_params_data(t->ps, i)));
        for (int k = 0; k < nslots; k++) {
            const float *slot = t->zero ? full[k] : mr_optim_slot(t->opt, k);
            snprintf(name, sizeof name, "optimizer/%s/%s", mr_params_name(t->ps, i), mr_optim_slot_name(t->opt, k));
            MR_TRY(mr_ckpt_writer_add(w, name, MR_F32, &sh, slot + mr_params_offset(t->ps, i)));
        }
    }
    const mr_params *bufs = mr_params_bufs(t->ps);
    for (int32_t i = 0; i < mr_params_count(bufs); i++) {
        mr_shape sh = mr_params_shape(bufs, i);
        snprintf(name, sizeof name, "buffers/%s", mr_params_name(bufs, i));
        MR_TRY(mr_ckpt_writer_add(w, name, MR_F32, &sh, mr_params_data(bufs, i)));
    }
    /* the data position, the same whatever the number of replicas (data.h, mr_data_iter_save_global):
     * every replica computes the same blob, which the replicas check before rank 0 writes it */
    if (t->pf_blob) { /* the next step's first batch is already fetched (train_step.c prefetch_next) */
        blob = malloc(t->pf_bytes ? t->pf_bytes : 1);
        MR_CHECK(blob, MR_ERR_NOMEM, "checkpoint: out of memory");
        memcpy(blob, t->pf_blob, t->pf_bytes);
        bytes = t->pf_bytes;
    } else {
        MR_TRY(mr_data_iter_save_global(t->train.it, &blob, &bytes));
    }
    if (t->comm) {
        int64_t mine[2] = {(int64_t)bytes, (int64_t)(ds_blob_hash(blob, bytes) >> 1)};
        sizes = calloc((size_t)(2 * t->world), sizeof *sizes);
        MR_CHECK(sizes, MR_ERR_NOMEM, "checkpoint: out of memory");
        MR_TRY(mr_comm_allgather(t->comm, mine, sizes, 2, MR_I64));
        for (int r = 1; r < t->world; r++)
            MR_CHECK(sizes[2 * r] == sizes[0] && sizes[2 * r + 1] == sizes[1], MR_ERR_INTERNAL,
                     "checkpoint %s: replica %d's data position differs from replica 0's (%lld vs %lld bytes, or their contents); HINT: "
                     "this is a bug in mirror, please report it with the config",
                     path, r, (long long)sizes[2 * r], (long long)sizes[0]);
    }
    MR_TRY(mr_ckpt_writer_add_blob(w, "state/data_iter/global", blob, bytes));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "step", t->step));
    MR_TRY(mr_ckpt_writer_attr_f64(w, "epoch", t->train_size > 0 ? (double)(t->step * c->batch) / (double)t->train_size : 0.0));
    MR_TRY(mr_ckpt_writer_attr_str(w, "mirror_version", MIRROR_VERSION));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "world_size", t->world));
    MR_TRY(mr_ckpt_writer_attr_str(w, "model", mr_model_type_name(c->model.type)));
    MR_TRY(mr_ckpt_writer_attr_str(w, "precision", compute_name(c->compute)));
    MR_TRY(mr_ckpt_writer_attr_str(w, "config", c->config_text ? c->config_text : ""));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "train.batch", c->batch));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "train.accumulate", c->accumulate));
    MR_TRY(mr_ckpt_writer_attr_str(w, "optimizer.type", OPTIM_NAMES[c->optim.kind]));
    MR_TRY(mr_ckpt_writer_attr_f64(w, "optimizer.lr", c->optim.lr));
    MR_TRY(mr_ckpt_writer_attr_f64(w, "optimizer.weight_decay", c->optim.weight_decay));
    if (c->optim.kind == MR_OPTIM_SGD) {
        MR_TRY(mr_ckpt_writer_attr_f64(w, "optimizer.momentum", c->optim.momentum));
        MR_TRY(mr_ckpt_writer_attr_f64(w, "optimizer.dampening", c->optim.dampening));
        MR_TRY(mr_ckpt_writer_attr_i64(w, "optimizer.nesterov", c->optim.nesterov));
    } else {
        MR_TRY(mr_ckpt_writer_attr_f64(w, "optimizer.beta1", c->optim.beta1));
        MR_TRY(mr_ckpt_writer_attr_f64(w, "optimizer.beta2", c->optim.beta2));
        MR_TRY(mr_ckpt_writer_attr_f64(w, "optimizer.eps", c->optim.eps));
    }
    MR_TRY(mr_ckpt_writer_attr_i64(w, "optimizer.steps", mr_optim_steps(t->opt)));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "loss_scale.enabled", t->scaling));
    MR_TRY(mr_ckpt_writer_attr_f64(w, "loss_scale", t->scaling ? t->scaler.scale : 1.0));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "loss_scale.good_steps", t->scaler.good_steps));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "loss_scale.skipped", t->scaler.skipped));
    /* every random stream is Philox keyed by the seed and positioned by a counter */
    MR_TRY(mr_ckpt_writer_attr_i64(w, "rng.seed", (int64_t)c->seed));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "rng.dropout_step", t->step * c->accumulate));
    MR_TRY(mr_ckpt_writer_attr_f64(w, "metrics.loss_sum", t->loss_sum));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "metrics.interval", t->interval));
    MR_TRY(mr_ckpt_writer_attr_f64(w, "early_stop.best", t->es_best));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "early_stop.best_step", t->es_best_step));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "early_stop.bad", t->es_bad));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "early_stop.metric", t->c.early_stop_metric));
    MR_TRY(mr_ckpt_writer_attr_i64(w, "early_stop.mode", t->c.early_stop_mode));
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    MR_TRY(mr_ckpt_writer_attr_f64(w, "metrics.time", (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - t->time_origin));
    if (t->rank == 0) st = mr_ckpt_writer_write(w, path);
    if (t->comm) {
        /* replica 0's outcome is everybody's: a failed save stops every replica alike */
        int64_t ok = st == MR_OK;
        char why[512];
        snprintf(why, sizeof why, "%s", st == MR_OK ? "" : mr_last_error());
        MR_TRY(mr_comm_broadcast(t->comm, &ok, 1, MR_I64, 0));
        MR_TRY(mr_comm_broadcast(t->comm, why, (int64_t)sizeof why, MR_U8, 0));
        why[sizeof why - 1] = '\0';
        if (!ok && t->rank != 0) st = mr_set_error(MR_ERR_IO, "replica 0 could not save %s: %s", path, why);
    }
fail:
    free(full[0]);
    free(full[1]);
    free(sizes);
    free(blob);
    mr_ckpt_writer_free(w);
    return st;
}

/* Every entry of registry ps from /<group>/<name> with its shape into the registry's buffer;
 * names in the file that the model lacks are an error too (a wrong architecture must not
 * half-load). what: "parameter" or "buffer", for the messages. */
static mr_status load_group(const mr_ckpt_reader *r, const char *path, const mr_params *ps, const char *group,
                            const char *what) {
    float *base = mr_params_buffer(ps);
    mr_status st = MR_OK;
    char name[1024];
    char **names = NULL;
    int nn = 0;
    const int32_t np = mr_params_count(ps);
    for (int32_t i = 0; i < np; i++) {
        snprintf(name, sizeof name, "%s/%s", group, mr_params_name(ps, i));
        MR_CHECK(mr_ckpt_has(r, name), MR_ERR_INVALID,
                 "%s: the model's %s '%s' is missing (no /%s); HINT: the file is of another model or config",
                 path, what, mr_params_name(ps, i), name);
        mr_shape sh = mr_params_shape(ps, i);
        MR_TRY(mr_ckpt_read(r, name, MR_F32, &sh, base + mr_params_offset(ps, i)));
    }
    MR_TRY(mr_ckpt_list(r, group, &names, &nn));
    for (int k = 0; k < nn; k++) {
        MR_CHECK(mr_params_find(ps, names[k]) >= 0, MR_ERR_INVALID,
                 "%s: /%s/%s is not a %s of this model; HINT: the file is of another model or config", path, group,
                 names[k], what);
    }
fail:
    mr_ckpt_names_free(names, nn);
    return st;
}

static mr_status load_params(const mr_ckpt_reader *r, const char *path, const mr_params *ps) {
    return load_group(r, path, ps, "params", "parameter");
}

/* The model's buffers from /buffers/<name> (batch norm's running statistics). A file without
 * /buffers (an older checkpoint, a PyTorch parameter file) keeps the initial values, with a
 * warning naming the file; one that has them must have every one. */
static mr_status load_bufs(const mr_ckpt_reader *r, const char *path, const mr_params *ps) {
    const mr_params *bufs = mr_params_bufs(ps);
    char **names = NULL;
    int nn = 0;
    if (mr_ckpt_list(r, "buffers", &names, &nn) != MR_OK) nn = 0; /* no such group */
    mr_ckpt_names_free(names, nn);
    if (nn == 0) {
        if (mr_params_count(bufs) > 0)
            mr_log_warn("%s: no /buffers (the model has %d, e.g. '%s'): they keep their initial values", path,
                        (int)mr_params_count(bufs), mr_params_name(bufs, 0));
        return MR_OK;
    }
    return load_group(r, path, bufs, "buffers", "buffer");
}

mr_status tr_load_params(mr_params *ps, const char *path, int foreign, int64_t *step) {
    mr_status st = MR_OK;
    mr_ckpt_reader *r = NULL;
    *step = 0;
    MR_TRY(mr_ckpt_open(path, foreign ? MR_CKPT_FOREIGN : 0, &r));
    MR_TRY(load_params(r, path, ps));
    MR_TRY(load_bufs(r, path, ps));
    if (mr_ckpt_attr_i64(r, "step", step) != MR_OK) *step = 0;
fail:
    mr_ckpt_close(r);
    return st;
}

/* A data position that does not fit this run's pipeline: the model and optimizer resume, the data
 * order starts over (logged by replica 0). */
static void data_order_lost(const trainer *t, const char *path, const mr_ckpt_reader *r) {
    int64_t old_batch = 0;
    if (mr_ckpt_attr_i64(r, "train.batch", &old_batch) != MR_OK) old_batch = -1;
    if (t->rank == 0)
        mr_log_warn("%s: the data pipeline differs from the checkpoint's (batch %lld -> %lld, or the data or shuffle "
                    "changed): the model and optimizer resume, the data order starts over (%s)",
                    path, (long long)old_batch, (long long)t->c.batch, mr_last_error());
}

mr_status tr_ckpt_load(trainer *t, const char *path) {
    mr_status st = MR_OK;
    mr_ckpt_reader *r = NULL;
    char *otype = NULL;
    void *blob = NULL;
    float *full = NULL;
    size_t bytes = 0;
    const mr_train_cfg *c = &t->c;
    MR_TRY(mr_ckpt_open(path, 0, &r));
    MR_TRY(mr_ckpt_attr_str(r, "optimizer.type", &otype));
    MR_CHECK(!strcmp(otype, OPTIM_NAMES[c->optim.kind]), MR_ERR_INVALID,
             "%s: the optimizer state is %s, the config asks for %s; HINT: resume with optimizer.type: %s, or start "
             "fresh from its parameters with checkpoint.init_from and resume: never",
             path, otype, OPTIM_NAMES[c->optim.kind], otype);
    MR_TRY(load_params(r, path, t->ps));
    MR_TRY(load_bufs(r, path, t->ps));
    if (t->zero) {
        /* zeroed: the file holds each parameter's state, not the padding between parameters'
         * 64-byte aligned starts (autodiff/nn.c), and this replica's shard copies the padding
         * too; uninitialised heap there became Adam's state of the padding, which the update
         * turned into garbage or NaN parameter padding (seen as test_zero1 failing) */
        full = calloc((size_t)t->n, sizeof(float));
        MR_CHECK(full, MR_ERR_NOMEM, "checkpoint: out of memory for the optimizer state");
    }
    for (int k = 0; k < mr_optim_num_slots(t->opt); k++) {
        /* each slot is a buffer laid out like the parameters: read it parameter by parameter (a
         * sharded optimizer reads the whole slot, then keeps its shard) */
        char name[1024];
        const int32_t np = mr_params_count(t->ps);
        float *slot = t->zero ? full : mr_optim_slot(t->opt, k);
        for (int32_t i = 0; i < np; i++) {
            mr_shape sh = mr_params_shape(t->ps, i);
            snprintf(name, sizeof name, "optimizer/%s/%s", mr_params_name(t->ps, i), mr_optim_slot_name(t->opt, k));
            MR_CHECK(mr_ckpt_has(r, name), MR_ERR_INVALID, "%s: no '%s'; HINT: the checkpoint is damaged or of another optimizer",
                     path, name);
            MR_TRY(mr_ckpt_read(r, name, MR_F32, &sh, slot + mr_params_offset(t->ps, i)));
        }
        if (t->zero) memcpy(mr_optim_slot(t->opt, k), full + t->zsh.off, sizeof(float) * (size_t)t->zsh.len);
    }
    int64_t v = 0;
    double d = 0;
    MR_TRY(mr_ckpt_attr_i64(r, "step", &t->step));
    MR_CHECK(t->step >= 0 && t->step <= c->steps, MR_ERR_INVALID,
             "%s: step %lld is beyond train.steps (%lld); HINT: raise train.steps to train further", path,
             (long long)t->step, (long long)c->steps);
    MR_TRY(mr_ckpt_attr_i64(r, "optimizer.steps", &v));
    mr_optim_set_steps(t->opt, v);
    MR_TRY(mr_ckpt_attr_f64(r, "loss_scale", &d));
    MR_TRY(mr_ckpt_attr_i64(r, "loss_scale.enabled", &v));
    if (v && t->scaling) {
        t->scaler.scale = d;
        MR_TRY(mr_ckpt_attr_i64(r, "loss_scale.good_steps", &t->scaler.good_steps));
        MR_TRY(mr_ckpt_attr_i64(r, "loss_scale.skipped", &t->scaler.skipped));
    }
    MR_TRY(mr_ckpt_attr_f64(r, "metrics.loss_sum", &t->loss_sum));
    MR_TRY(mr_ckpt_attr_i64(r, "metrics.interval", &t->interval));
    /* early stopping's state (checkpoints before it start the count over) */
    st = mr_ckpt_attr_f64(r, "early_stop.best", &t->es_best);
    if (st == MR_OK) st = mr_ckpt_attr_i64(r, "early_stop.best_step", &t->es_best_step);
    if (st == MR_OK) st = mr_ckpt_attr_i64(r, "early_stop.bad", &t->es_bad);
    int64_t metric = -1, mode = -1;
    if (st == MR_OK) st = mr_ckpt_attr_i64(r, "early_stop.metric", &metric);
    if (st == MR_OK) st = mr_ckpt_attr_i64(r, "early_stop.mode", &mode);
    if (st == MR_OK && (metric != c->early_stop_metric || mode != c->early_stop_mode) && !isnan(t->es_best)) {
        /* another metric or direction: the best so far means nothing for it */
        if (c->early_stop_patience > 0 && !c->quiet)
            mr_log_info("%s: train.early_stop's metric or mode changed since this checkpoint: early stopping counts "
                        "afresh", path);
        t->es_best = NAN, t->es_best_step = 0, t->es_bad = 0;
    }
    if (st == MR_ERR_NOT_FOUND) {
        t->es_best = NAN, t->es_best_step = 0, t->es_bad = 0;
        st = MR_OK;
    }
    if (st != MR_OK) goto fail;
    t->elapsed_before = 0; /* checkpoints before metrics.time restart the clock */
    st = mr_ckpt_attr_f64(r, "metrics.time", &t->elapsed_before);
    if (st == MR_ERR_NOT_FOUND) {
        t->elapsed_before = 0;
        st = MR_OK;
    }
    if (st != MR_OK) goto fail;
    MR_TRY(mr_ckpt_attr_i64(r, "rng.seed", &v));
    if ((uint64_t)v != c->seed)
        mr_log_warn("%s: saved with seed %lld, the config says %llu: data order and dropout follow the config from here",
                    path, (long long)v, (unsigned long long)c->seed);
    /* the data position: world-independent (any number of replicas resumes it exactly), or an older
     * checkpoint's per-replica states (exact with the same number of replicas) */
    int64_t saved_world = 1;
    if (mr_ckpt_attr_i64(r, "world_size", &saved_world) != MR_OK) saved_world = 1;
    char bname[64];
    snprintf(bname, sizeof bname, "state/data_iter/%d", t->rank);
    if (mr_ckpt_has(r, "state/data_iter/global")) {
        if (mr_ckpt_read_blob(r, "state/data_iter/global", &blob, &bytes) != MR_OK ||
            mr_data_iter_restore_global(t->train.it, blob, bytes) != MR_OK)
            data_order_lost(t, path, r);
    } else if (saved_world != t->world) {
        if (t->rank == 0)
            mr_log_warn("%s: an older checkpoint written by %lld replicas, resumed by %d: the parameters, optimizer "
                        "state and schedule resume; the data order starts over (its data position is per replica; "
                        "checkpoints written from now on resume on any number of replicas)",
                        path, (long long)saved_world, t->world);
    } else if (mr_ckpt_read_blob(r, bname, &blob, &bytes) != MR_OK || mr_data_iter_restore(t->train.it, blob, bytes) != MR_OK) {
        data_order_lost(t, path, r);
    }
fail:
    free(full);
    free(blob);
    free(otype);
    mr_ckpt_close(r);
    return st;
}
