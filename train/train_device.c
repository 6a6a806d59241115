/* The trainer's device path (train_impl.h): one replica's parameters, gradients, buffers
 * (batch norm's running statistics), optimizer state and batches on a device, with the
 * registry's host buffers as the shadow copy that checkpoints read and write.
 *
 * The same code runs with the CPU as the device (mr_train_cfg.device_path): separate host
 * buffers, copies through the CPU backend, the optimizer through the op table, the vector kernels
 * of core/vec.h. Their arithmetic is the host path's, so a CPU run of the device path must give
 * the host path's bits; tests/unit/test_trainer_device.c checks that, which covers everything
 * here but the CUDA kernels and copies themselves.
 *
 * Input batches: on a GPU the training loop (train_step.c) fetches batch n+1 while step n
 * computes and copies it on a copy stream (tr_dev_prefetch): two pinned staging slots and two
 * device landing buffers, events ordering each copy before the step that reads it and each slot's
 * reuse after its reader; the step's bound input buffers get a device copy at its start, so the
 * plan's bindings (and its captured graphs) never change. Other batches (evaluation, the first
 * of a run) go through tr_dev_feed: a pinned staging buffer per input, then an asynchronous copy
 * on the replica's stream; an event says when that staging may be written again.
 * Nothing is read back during a steady step (the trainer's decisions, skip or clip, are taken on
 * the device: train_step.c). */
#include "train/train_impl.h"
#include "core/log.h"
#include "core/vec.h"

#include <stdlib.h>
#include <string.h>

static mr_copy_kind to_dev(const tr_device *dv) { return dv->dev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D; }
static mr_copy_kind to_host(const tr_device *dv) { return dv->dev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_D2H; }

/* The MPI launcher's local rank (one GPU per rank on a node), 0 when there is none. */
static int local_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

static mr_status dev_alloc(tr_device *dv, size_t bytes, void **out) {
    mr_status st = dv->be->alloc(dv->dev.index, bytes, out);
    if (st == MR_OK) st = dv->be->memset_zero(dv->dev.index, *out, bytes, dv->stream);
    return st;
}

/* Pinned on a GPU (asynchronous copies), plain memory otherwise. */
static mr_status host_alloc(tr_device *dv, size_t bytes, void **out) {
    *out = NULL;
    if (dv->be->host_alloc) return dv->be->host_alloc(bytes ? bytes : 1, out);
    *out = malloc(bytes ? bytes : 1);
    return *out ? MR_OK : mr_set_error(MR_ERR_NOMEM, "trainer: out of host memory for %zu bytes of staging", bytes);
}

static void host_free(tr_device *dv, void *p) {
    if (!p) return;
    if (dv->be->host_free) dv->be->host_free(p);
    else free(p);
}

/* The host path: the step's buffers are the registry's own (allocated by mr_steps_register), the
 * optimizer is the host one (t->opt), only the accumulation buffer is new. */
static mr_status alias_registry(trainer *t) {
    tr_device *dv = &t->dv;
    dv->dev = mr_device_cpu();
    mr_status st = mr_backend_get(MR_DEVICE_CPU, &dv->be);
    dv->d_params = mr_params_buffer(t->ps);
    dv->d_grads = mr_params_grad_buffer(t->ps);
    if (st == MR_OK && t->c.accumulate > 1)
        st = dev_alloc(dv, (size_t)(t->n ? t->n : 1) * sizeof(float), (void **)&dv->d_acc);
    return st;
}

mr_status tr_dev_init(trainer *t, int with_optim) {
    mr_status st = MR_OK;
    const mr_train_cfg *c = &t->c;
    tr_device *dv = &t->dv;
    if (c->device_kind != MR_DEVICE_CUDA && !c->device_path) return alias_registry(t);
    dv->on = 1;
    dv->dev = mr_device_cpu();
    if (c->device_kind == MR_DEVICE_CUDA) {
        int count = mr_cuda_device_count();
        /* a configuration error (exit 2): the config asks for a device this machine lacks */
        MR_CHECK(count > 0, MR_ERR_INVALID,
                 "distribute.devices: a CUDA device was asked for, but %s; HINT: run `mirror doctor`, or train on cpu",
                 mr_cuda_compiled() ? "no GPU is usable" : "this mirror was built without CUDA");
        int g = c->gpus[0] >= 0 ? c->gpus[0] : local_rank() % count;
        MR_CHECK(g < count, MR_ERR_INVALID,
                 "distribute.devices: cuda:%d does not exist (%d visible); HINT: check CUDA_VISIBLE_DEVICES", g, count);
        dv->dev = (mr_device){MR_DEVICE_CUDA, g};
    }
    MR_TRY(mr_backend_get(dv->dev.kind, &dv->be));
    if (dv->dev.kind == MR_DEVICE_CUDA) MR_TRY(dv->be->stream_new(dv->dev.index, &dv->stream));
    if (dv->dev.kind == MR_DEVICE_CUDA) MR_TRY(dv->be->stream_new(dv->dev.index, &dv->copy_stream));
    const size_t pb = (size_t)(t->n ? t->n : 1) * sizeof(float);
    MR_TRY(dev_alloc(dv, pb, (void **)&dv->d_params));
    MR_TRY(dev_alloc(dv, pb, (void **)&dv->d_grads));
    if (c->accumulate > 1) MR_TRY(dev_alloc(dv, pb, (void **)&dv->d_acc));
    MR_TRY(dev_alloc(dv, sizeof *dv->d_ctl, (void **)&dv->d_ctl));
    /* pinned: a copy to or from pageable memory waits for the stream's earlier work inside the copy
     * call, outside tr_dev_sync's deadline (a peer that never joins a collective would hang it) */
    MR_TRY(host_alloc(dv, sizeof *dv->h_ctl, (void **)&dv->h_ctl));
    memset(dv->h_ctl, 0, sizeof *dv->h_ctl);
    MR_TRY(dev_alloc(dv, MR_VEC_SCRATCH * sizeof(double), (void **)&dv->d_scratch));
    /* the backward reads the loss scale the device's scaler keeps (tr_step_ctl_push sets it first) */
    MR_TRY(mr_steps_set_device(t->steps, dv->dev, dv->stream, dv->d_params, dv->d_grads, &dv->d_ctl->scale_f32));
    dv->n_bufs = mr_params_buffer_numel(mr_params_bufs(t->ps));
    if (dv->n_bufs > 0) {
        MR_TRY(dev_alloc(dv, (size_t)dv->n_bufs * sizeof(float), (void **)&dv->d_bufs));
        MR_TRY(mr_steps_set_device_bufs(t->steps, dv->d_bufs));
    }
    /* ZeRO-1: this replica's shard of the state (train_dist.c tr_zero_init) */
    if (with_optim) {
        MR_TRY(mr_optim_new_on(&c->optim, t->zero ? t->zsh.len : t->n, dv->dev, dv->stream, &dv->opt));
        /* Adam's bias corrections for every step the run can reach (the step count is the device's) */
        MR_TRY(mr_optim_reserve(dv->opt, c->steps));
    }
    if (!c->quiet) {
        char name[32];
        mr_log_info("training on %s (device path: parameters, gradients and optimizer state on the device)",
                    mr_device_str(dv->dev, name, sizeof name));
    }
    return MR_OK;
fail:
    return st;
}

void tr_dev_free(trainer *t) {
    tr_device *dv = &t->dv;
    if (!dv->be) return;
    if (dv->own_gcomm) mr_comm_free(dv->gcomm);
    mr_optim_free(dv->opt);
    if (dv->copy_stream) (void)dv->be->stream_sync(dv->copy_stream); /* nothing reads the staging after this */
    for (int i = 0; i < dv->n_in; i++) {
        tr_dev_inputs *in = &dv->in[i];
        dv->be->free(dv->dev.index, in->d_x);
        dv->be->free(dv->dev.index, in->d_y);
        host_free(dv, in->h_x);
        host_free(dv, in->h_y);
        if (in->ev) dv->be->event_free(in->ev);
        for (int k = 0; k < 2; k++) {
            dv->be->free(dv->dev.index, in->d_xs[k]);
            dv->be->free(dv->dev.index, in->d_ys[k]);
            host_free(dv, in->h_xs[k]);
            host_free(dv, in->h_ys[k]);
            if (in->copied[k]) dv->be->event_free(in->copied[k]);
            if (in->consumed[k]) dv->be->event_free(in->consumed[k]);
        }
    }
    free(dv->h_read);
    dv->be->free(dv->dev.index, dv->d_acc);
    if (!dv->on) { /* the host path: the rest is the registry's */
        memset(dv, 0, sizeof *dv);
        return;
    }
    dv->be->free(dv->dev.index, dv->d_params);
    dv->be->free(dv->dev.index, dv->d_grads);
    dv->be->free(dv->dev.index, dv->d_ctl);
    host_free(dv, dv->h_ctl);
    dv->be->free(dv->dev.index, dv->d_bufs);
    dv->be->free(dv->dev.index, dv->d_scratch);
    for (int k = 0; k < 2; k++)
        if (dv->ev_ctl[k]) dv->be->event_free(dv->ev_ctl[k]);
    if (dv->ev_wait) dv->be->event_free(dv->ev_wait);
    if (dv->copy_stream) dv->be->stream_free(dv->copy_stream);
    if (dv->stream) dv->be->stream_free(dv->stream);
    memset(dv, 0, sizeof *dv);
}

mr_status tr_dev_comm(trainer *t) {
    tr_device *dv = &t->dv;
    if (!dv->on || !t->comm) return MR_OK;
    if (dv->dev.kind != MR_DEVICE_CUDA) {
        dv->gcomm = t->comm; /* host memory: the host communicator moves it */
        return MR_OK;
    }
    /* one NCCL rank per replica, each driven by its own host thread (n_local 1 per call), joined
     * over the replicas' host communicator (mpi, local threads, or both) */
    double timeout = t->c.comm_timeout_s > 0 ? t->c.comm_timeout_s : 300.0;
    mr_status st = mr_comm_nccl_new(&dv->dev.index, 1, t->comm, timeout, &dv->gcomm);
    if (st == MR_OK) dv->own_gcomm = 1;
    return st;
}

/* Copies the optimizer state between the host shadow t->opt and dv->opt. */
static mr_status copy_optim(trainer *t, int push) {
    tr_device *dv = &t->dv;
    if (!dv->opt || !t->opt) return MR_OK;
    const size_t bytes = (size_t)(t->zero ? t->zsh.len : t->n) * sizeof(float); /* ZeRO-1: the shard */
    for (int k = 0; k < mr_optim_num_slots(t->opt); k++) {
        float *h = mr_optim_slot(t->opt, k), *d = mr_optim_slot(dv->opt, k);
        mr_status st = push ? dv->be->copy(dv->dev.index, d, h, bytes, to_dev(dv), dv->stream)
                            : dv->be->copy(dv->dev.index, h, d, bytes, to_host(dv), dv->stream);
        if (st != MR_OK) return st;
    }
    if (push) mr_optim_set_steps(dv->opt, mr_optim_steps(t->opt));
    else mr_optim_set_steps(t->opt, mr_optim_steps(dv->opt));
    return MR_OK;
}

mr_status tr_dev_sync(tr_device *dv, const char *what) {
    return mr_comm_stream_wait(dv->own_gcomm ? dv->gcomm : NULL, dv->be, dv->dev.index, dv->stream, &dv->ev_wait, what);
}

mr_status tr_dev_bufs(trainer *t, int push) {
    tr_device *dv = &t->dv;
    if (!dv->on || dv->n_bufs == 0) return MR_OK;
    float *h = mr_params_buffer(mr_params_bufs(t->ps));
    const size_t bytes = (size_t)dv->n_bufs * sizeof(float);
    mr_status st = push ? dv->be->copy(dv->dev.index, dv->d_bufs, h, bytes, to_dev(dv), dv->stream)
                        : dv->be->copy(dv->dev.index, h, dv->d_bufs, bytes, to_host(dv), dv->stream);
    if (st == MR_OK) st = tr_dev_sync(dv, "the model's buffers"); /* the host side is free or complete on return */
    return st;
}

mr_status tr_dev_push(trainer *t) {
    mr_status st = MR_OK;
    tr_device *dv = &t->dv;
    if (!dv->on) return MR_OK;
    MR_TRY(dv->be->copy(dv->dev.index, dv->d_params, mr_params_buffer(t->ps), (size_t)t->n * sizeof(float), to_dev(dv),
                        dv->stream));
    MR_TRY(copy_optim(t, 1));
    MR_TRY(tr_dev_bufs(t, 1));
    MR_TRY(tr_step_ctl_push(t)); /* the scaler and the step count loaded */
    /* the host buffers may change as soon as we return */
    MR_TRY(tr_dev_sync(dv, "the parameters' upload"));
fail:
    return st;
}

mr_status tr_dev_pull(trainer *t) {
    mr_status st = MR_OK;
    tr_device *dv = &t->dv;
    if (!dv->on) return MR_OK;
    /* the decisions first: a step that had to stop training fails here, before a checkpoint */
    MR_TRY(tr_step_sync(t));
    MR_TRY(dv->be->copy(dv->dev.index, mr_params_buffer(t->ps), dv->d_params, (size_t)t->n * sizeof(float),
                        to_host(dv), dv->stream));
    MR_TRY(copy_optim(t, 0));
    MR_TRY(tr_dev_bufs(t, 0));
    MR_TRY(tr_dev_sync(dv, "the parameters' download"));
fail:
    return st;
}

static size_t val_bytes(const mr_step *s, mr_val v) {
    mr_shape sh = mr_graph_shape(s->g, v);
    return (size_t)mr_shape_numel(&sh) * mr_dtype_size(mr_graph_dtype(s->g, v));
}

/* Step s's input buffers, made and bound at its first batch (a captured graph keeps them). */
static mr_status inputs_of(tr_device *dv, mr_step *s, tr_dev_inputs **out) {
    mr_status st = MR_OK;
    tr_dev_inputs *in = NULL;
    *out = NULL;
    for (int i = 0; i < dv->n_in && !in; i++)
        if (dv->in[i].s == s) in = &dv->in[i];
    if (!in) {
        MR_CHECK(dv->n_in < TR_DEV_MAX_STEPS, MR_ERR_INTERNAL, "trainer: more than %d compiled steps on the device",
                 TR_DEV_MAX_STEPS);
        in = &dv->in[dv->n_in++];
        memset(in, 0, sizeof *in);
        in->s = s;
        in->bx = val_bytes(s, s->io.x);
        in->by = val_bytes(s, s->io.y);
        MR_TRY(dev_alloc(dv, in->bx, &in->d_x));
        MR_TRY(dev_alloc(dv, in->by, &in->d_y));
        if (dv->dev.kind != MR_DEVICE_CPU) {
            MR_TRY(host_alloc(dv, in->bx, &in->h_x));
            MR_TRY(host_alloc(dv, in->by, &in->h_y));
        }
        MR_TRY(mr_plan_bind(s->plan, s->io.x, in->d_x));
        MR_TRY(mr_plan_bind(s->plan, s->io.y, in->d_y));
    }
    *out = in;
fail:
    return st;
}

mr_status tr_dev_feed(tr_device *dv, mr_step *s, const void *x, const void *y) {
    mr_status st = MR_OK;
    if (!dv->on) {
        MR_TRY(mr_plan_bind(s->plan, s->io.x, (void *)x));
        MR_TRY(mr_plan_bind(s->plan, s->io.y, (void *)y));
        return MR_OK;
    }
    tr_dev_inputs *in = NULL;
    MR_TRY(inputs_of(dv, s, &in));
    MR_CHECK(!in->pending, MR_ERR_INTERNAL, "trainer: a batch was fed while the next one was already copied");
    if (dv->dev.kind == MR_DEVICE_CPU) {
        MR_TRY(dv->be->copy(0, in->d_x, x, in->bx, MR_COPY_H2H, NULL));
        MR_TRY(dv->be->copy(0, in->d_y, y, in->by, MR_COPY_H2H, NULL));
        return MR_OK;
    }
    /* the staging buffers were last read by the previous batch's copy: wait for it only when it
     * has not completed yet (nothing reads the step's results back, so the host may be ahead) */
    if (in->ev) {
        int done = 0;
        MR_TRY(dv->be->event_query(in->ev, &done));
        if (!done) MR_TRY(dv->be->event_sync(in->ev));
    } else {
        MR_TRY(dv->be->event_new(dv->dev.index, &in->ev));
    }
    memcpy(in->h_x, x, in->bx);
    memcpy(in->h_y, y, in->by);
    MR_TRY(dv->be->copy(dv->dev.index, in->d_x, in->h_x, in->bx, MR_COPY_H2D, dv->stream));
    MR_TRY(dv->be->copy(dv->dev.index, in->d_y, in->h_y, in->by, MR_COPY_H2D, dv->stream));
    MR_TRY(dv->be->event_record(in->ev, dv->stream));
fail:
    return st;
}

int tr_dev_can_prefetch(const tr_device *dv) { return dv->on && dv->copy_stream != NULL; }

int tr_dev_prefetched(const tr_device *dv, const mr_step *s) {
    for (int i = 0; i < dv->n_in; i++)
        if (dv->in[i].s == s) return dv->in[i].pending != 0;
    return 0;
}

mr_status tr_dev_prefetch(tr_device *dv, mr_step *s, const void *x, const void *y) {
    mr_status st = MR_OK;
    tr_dev_inputs *in = NULL;
    MR_CHECK(tr_dev_can_prefetch(dv), MR_ERR_INTERNAL, "trainer: no copy stream for the next batch");
    MR_TRY(inputs_of(dv, s, &in));
    MR_CHECK(!in->pending, MR_ERR_INTERNAL, "trainer: two batches ahead on the copy stream");
    const int k = in->next_slot;
    if (!in->h_xs[0]) /* the first batch ahead: both slots (a later allocation would wait for the device) */
        for (int j = 0; j < 2; j++) {
            MR_TRY(host_alloc(dv, in->bx, &in->h_xs[j]));
            MR_TRY(host_alloc(dv, in->by, &in->h_ys[j]));
            MR_TRY(dev_alloc(dv, in->bx, &in->d_xs[j]));
            MR_TRY(dev_alloc(dv, in->by, &in->d_ys[j]));
            MR_TRY(dv->be->event_new(dv->dev.index, &in->copied[j]));
            MR_TRY(dv->be->event_new(dv->dev.index, &in->consumed[j]));
            /* dev_alloc zeroes on the compute stream: the copy stream lands after it */
            MR_TRY(dv->be->event_record(in->consumed[j], dv->stream));
            MR_TRY(dv->be->stream_wait_event(dv->copy_stream, in->consumed[j]));
        }
    if (in->slot_used[k]) {
        /* the staging is read by the slot's previous copy (two batches ago, fed at the start of
         * the last step: done on a GPU, so this returns at once); the landing buffers by the last
         * step's device copy, which the copy stream waits for; a query, so that a finished copy
         * costs no host wait */
        int done = 0;
        MR_TRY(dv->be->event_query(in->copied[k], &done));
        if (!done) MR_TRY(dv->be->event_sync(in->copied[k]));
        MR_TRY(dv->be->stream_wait_event(dv->copy_stream, in->consumed[k]));
    }
    memcpy(in->h_xs[k], x, in->bx);
    memcpy(in->h_ys[k], y, in->by);
    MR_TRY(dv->be->copy(dv->dev.index, in->d_xs[k], in->h_xs[k], in->bx, MR_COPY_H2D, dv->copy_stream));
    MR_TRY(dv->be->copy(dv->dev.index, in->d_ys[k], in->h_ys[k], in->by, MR_COPY_H2D, dv->copy_stream));
    MR_TRY(dv->be->event_record(in->copied[k], dv->copy_stream));
    in->pending = k + 1;
    in->next_slot = 1 - k;
fail:
    return st;
}

mr_status tr_dev_feed_prefetched(tr_device *dv, mr_step *s) {
    mr_status st = MR_OK;
    tr_dev_inputs *in = NULL;
    MR_TRY(inputs_of(dv, s, &in));
    MR_CHECK(in->pending, MR_ERR_INTERNAL, "trainer: no batch ahead to feed");
    const int k = in->pending - 1;
    MR_TRY(dv->be->stream_wait_event(dv->stream, in->copied[k]));
    MR_TRY(dv->be->copy(dv->dev.index, in->d_x, in->d_xs[k], in->bx, MR_COPY_D2D, dv->stream));
    MR_TRY(dv->be->copy(dv->dev.index, in->d_y, in->d_ys[k], in->by, MR_COPY_D2D, dv->stream));
    MR_TRY(dv->be->event_record(in->consumed[k], dv->stream));
    in->slot_used[k] = 1;
    in->pending = 0;
fail:
    return st;
}

mr_status tr_dev_read(tr_device *dv, mr_step *s, mr_val v, size_t bytes, const void **out) {
    mr_status st = MR_OK;
    const void *src = mr_plan_data(s->plan, v);
    *out = NULL;
    MR_CHECK(src, MR_ERR_INTERNAL, "trainer: value %d of the step is not kept", (int)v.id);
    if (!dv->on) {
        *out = src;
        return MR_OK;
    }
    if (bytes > dv->h_read_bytes) {
        void *p = realloc(dv->h_read, bytes);
        MR_CHECK(p, MR_ERR_NOMEM, "trainer: out of host memory for %zu bytes of results", bytes);
        dv->h_read = p;
        dv->h_read_bytes = bytes;
    }
    MR_TRY(dv->be->copy(dv->dev.index, dv->h_read, src, bytes, to_host(dv), dv->stream));
    MR_TRY(tr_dev_sync(dv, "a result read back"));
    *out = dv->h_read;
fail:
    return st;
}

mr_status tr_dev_set_loss_scale(trainer *t, mr_step *s, float scale) {
    s->loss_scale = scale; /* the device path reads d_ctl->scale_f32 instead, which its scaler sets */
    (void)t;
    return MR_OK;
}
