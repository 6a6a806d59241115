/* One optimizer step of the training loop (train.c), in the order it runs:
 *   1. next batch; forward and backward, the gradient exchange overlapped with the backward where
 *      the mode allows (tr_step_forward_backward);
 *   2. the replicas agree: gradients averaged, the loss and any stop request agreed
 *      (tr_step_exchange; distribute/ddp.h);
 *   3. the finite check and the loss scaler (tr_step_check): one pass over the gradient flags each
 *      parameter whose gradient is not finite (mr_vec_sumsq_seg), so a skipped step or a divergence
 *      names the first such parameter in backward order, which is where the overflow started;
 *   4. unscale (3.), clip, update, and ZeRO-1's all-gather (tr_step_update).
 * On a GPU, step n+1's first batch is fetched and copied on a copy stream while step n computes
 * (prefetch_next). The host path and the device path run the same code: t->gdev is the CPU on the host path,
 * where the vector kernels of core/vec.h give the host loops' bits (optim/optim.c), and the
 * step's buffers (t->params, t->grads, t->acc, t->wopt) are the registry's or the device's.
 * Except for 3. and 4.'s decisions: on the device path (t->dv.on) the loss, the verdict, the
 * scaler, the skip and the clip factor are computed on the device into t->dv.d_ctl
 * (core/math/ctl_math.h, the same arithmetic as the host code below) and read by the kernels by
 * pointer (check_dev, update_dev), so a steady step never waits for the device; tr_step_sync
 * reads them back where the host needs them and reports what tr_step_check would have. */
#include "train/train_impl.h"
#include "core/log.h"
#include "core/vec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double tr_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static mr_status run_range(void *plan, int32_t first, int32_t last) { return mr_plan_run_range(plan, first, last); }

/* ---- the finite check per parameter --------------------------------------------------------- */

typedef struct bwd_key {
    int32_t ready, index;
} bwd_key;

/* Backward order: earlier final write first; parameters no kernel writes (ready 0) last; ties (one
 * kernel finishing several) in registry order. */
static int cmp_bwd(const void *a, const void *b) {
    const bwd_key *x = a, *y = b;
    if ((x->ready == 0) != (y->ready == 0)) return x->ready == 0 ? 1 : -1;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

mr_status tr_step_init(trainer *t, const mr_step *s) {
    mr_status st = MR_OK;
    const int32_t np = mr_params_count(t->ps);
    bwd_key *keys = NULL;
    int64_t *h_seg = NULL;
    if (np == 0) return MR_OK;
    keys = malloc(sizeof *keys * (size_t)np);
    h_seg = malloc(sizeof *h_seg * (size_t)np);
    t->bwd_order = malloc(sizeof *t->bwd_order * (size_t)np);
    t->h_flag = malloc(sizeof *t->h_flag * (size_t)np);
    t->h_count = malloc(sizeof *t->h_count * (size_t)np);
    MR_CHECK(keys && h_seg && t->bwd_order && t->h_flag && t->h_count, MR_ERR_NOMEM,
             "trainer: out of host memory for the finite check of %d parameters", (int)np);
    for (int32_t i = 0; i < np; i++) {
        const int64_t off = mr_params_offset(t->ps, i);
        keys[i].ready = mr_plan_ready_after(s->plan, t->grads + off, sizeof(float) * (size_t)mr_params_numel(t->ps, i));
        keys[i].index = i;
    }
    qsort(keys, (size_t)np, sizeof *keys, cmp_bwd);
    for (int32_t i = 0; i < np; i++) t->bwd_order[i] = keys[i].index;
    /* the part checked: ZeRO-1's shard or the whole buffer; parameter i's segment starts where it
     * does, clamped into the part (those wholly before or after it get empty segments), the
     * padding after a parameter is its own */
    t->seg_off = t->zero ? t->zsh.off : 0;
    t->seg_n = t->zero ? t->zsh.len : t->n;
    for (int32_t i = 0; i < np; i++) {
        int64_t a = i == 0 ? 0 : mr_params_offset(t->ps, i) - t->seg_off;
        h_seg[i] = a < 0 ? 0 : a > t->seg_n ? t->seg_n : a;
    }
    const mr_copy_kind h2d = t->gdev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D;
    MR_TRY(t->gbe->alloc(t->gdev.index, sizeof *t->d_seg * (size_t)np, (void **)&t->d_seg));
    MR_TRY(t->gbe->alloc(t->gdev.index, sizeof *t->d_bad * (size_t)np, (void **)&t->d_bad));
    MR_TRY(t->gbe->copy(t->gdev.index, t->d_seg, h_seg, sizeof *h_seg * (size_t)np, h2d, t->stream));
    MR_TRY(t->gbe->memset_zero(t->gdev.index, t->d_bad, sizeof *t->d_bad * (size_t)np, t->stream));
    if (t->dv.on) { /* the device's check walks the flags in backward order */
        MR_TRY(t->gbe->alloc(t->gdev.index, sizeof *t->d_order * (size_t)np, (void **)&t->d_order));
        MR_TRY(t->gbe->copy(t->gdev.index, t->d_order, t->bwd_order, sizeof *t->d_order * (size_t)np, h2d, t->stream));
    }
    MR_TRY(t->gbe->stream_sync(t->stream)); /* h_seg is freed below */
    t->n_seg = np;
fail:
    free(keys);
    free(h_seg);
    return st;
}

void tr_step_free(trainer *t) {
    if (t->gbe) {
        t->gbe->free(t->gdev.index, t->d_seg);
        t->gbe->free(t->gdev.index, t->d_bad);
        t->gbe->free(t->gdev.index, t->d_order);
    }
    free(t->bwd_order);
    free(t->h_flag);
    free(t->h_count);
    t->d_seg = NULL, t->d_bad = NULL, t->d_order = NULL, t->bwd_order = NULL, t->h_flag = NULL, t->h_count = NULL;
    t->n_seg = 0;
}

/* The finite check of this replica's part in one pass: *finite is 1 when every gradient element is
 * finite (this replica's verdict; the flags of the parameters that are not stay in d_bad). */
static mr_status grads_check(trainer *t, const mr_ddp_part *part, int *finite, double *sumsq_out) {
    mr_status st = MR_OK;
    double sumsq = 0;
    *finite = 0;
    *sumsq_out = NAN;
    if (t->n_seg == 0) {
        MR_TRY(mr_vec_sumsq(t->gdev, t->stream, part->g, part->n, t->d_scratch, &sumsq));
    } else {
        MR_ASSERT(part->off == t->seg_off && part->n == t->seg_n); /* the layout tr_step_init cut */
        MR_TRY(mr_vec_sumsq_seg(t->gdev, t->stream, part->g, part->n, t->d_seg, t->n_seg, t->d_bad, t->d_scratch,
                                &sumsq));
    }
    *finite = isfinite(sumsq) != 0; /* inf or NaN exactly when a gradient is */
    *sumsq_out = sumsq;
fail:
    return st;
}

/* After a check that was not finite on some replica: "non-finite gradients in NAME (first of K in
 * backward order)" into buf, or "" when every gradient was finite (the loss alone was not). Reads
 * the flags and zeroes them for the next check; with ZeRO-1 the shards' flags are summed (one
 * all-reduce), so every replica calls it at the same step and gets the same words. */
static mr_status grads_report(trainer *t, char *buf, size_t cap) {
    mr_status st = MR_OK;
    const int32_t np = t->n_seg;
    buf[0] = '\0';
    if (np == 0) return MR_OK;
    const mr_copy_kind d2h = t->gdev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_D2H;
    MR_TRY(t->gbe->copy(t->gdev.index, t->h_flag, t->d_bad, sizeof *t->h_flag * (size_t)np, d2h, t->stream));
    MR_TRY(tr_dev_sync(&t->dv, "the gradients' finite flags"));
    MR_TRY(t->gbe->memset_zero(t->gdev.index, t->d_bad, sizeof *t->d_bad * (size_t)np, t->stream));
    for (int32_t i = 0; i < np; i++) t->h_count[i] = t->h_flag[i] != 0;
    MR_TRY(mr_ddp_sum_counts(t->ddp, t->h_count, np)); /* the shards' flags (ZeRO-1) */
    int32_t first = -1, bad = 0;
    for (int32_t k = 0; k < np; k++)
        if (t->h_count[t->bwd_order[k]] > 0) {
            if (first < 0) first = t->bwd_order[k];
            bad++;
        }
    if (first >= 0) {
        char more[48];
        if (bad > 1) snprintf(more, sizeof more, "first of %d in backward order", (int)bad);
        else snprintf(more, sizeof more, "the only one");
        snprintf(buf, cap, "non-finite gradients in %s (%s)", mr_params_name(t->ps, first), more);
    }
fail:
    return st;
}

/* A non-finite value in words: "nan" whatever its sign bit (printf writes "-nan" for x86's default
 * NaN), "inf" or "-inf". */
static const char *nonfinite(double v) { return isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

/* What went wrong at a step that was not finite, for the log and the errors. */
static void describe(const char *grads, double loss, char *buf, size_t cap) {
    if (grads[0] && isfinite(loss)) snprintf(buf, cap, "%s", grads);
    else if (grads[0])
        snprintf(buf, cap, "%s; the loss was already non-finite (%s: the forward overflowed)", grads, nonfinite(loss));
    else
        snprintf(buf, cap, "the loss was non-finite (%s: the forward overflowed) but every gradient was finite",
                 nonfinite(loss));
}

/* Without loss scaling, a step that was not finite: the run stops (grads: grads_report's words). */
static mr_status nonfinite_error(const trainer *t, long long step, const char *grads, double loss) {
    if (isfinite(loss)) /* a finite loss whose backward overflowed: applied, it would make every
                         * parameter NaN, and a checkpoint of this step would keep them */
        return mr_set_error(MR_ERR_NUMERIC,
                            "step %lld: %s, with a finite loss (%g): the backward overflowed (this step was not "
                            "applied); HINT: lower optimizer.lr or set optimizer.grad_clip (a non-finite gradient "
                            "cannot be clipped)",
                            step, grads[0] ? grads : "non-finite gradients", loss);
    return mr_set_error(MR_ERR_NUMERIC,
                        "non-finite loss (%s) at step %lld%s%s; HINT: lower optimizer.lr or set optimizer.grad_clip%s",
                        nonfinite(loss), step, grads[0] ? ": " : "", grads,
                        t->gdev.kind == MR_DEVICE_CUDA
                            ? " (on a GPU a label or token id outside [0, classes or vocab) also gives a NaN loss)"
                            : "");
}

/* With loss scaling, a step that was not finite at the scale's floor (what: describe's words):
 * skipping for ever would train nothing; the update was never applied, so the parameters and the
 * last checkpoint are the last good ones. */
static mr_status floor_error(const trainer *t, long long step, const char *what) {
    const mr_train_cfg *c = &t->c;
    char clip[64], last[160];
    if (c->grad_clip > 0) snprintf(clip, sizeof clip, "lower optimizer.grad_clip (%g)", c->grad_clip);
    else snprintf(clip, sizeof clip, "set optimizer.grad_clip");
    if (t->scaler.min_scale > 1)
        snprintf(last, sizeof last, "%s, or lower precision.loss_scale.min (%g)", clip, t->scaler.min_scale);
    else snprintf(last, sizeof last, "or %s", clip);
    return mr_set_error(MR_ERR_NUMERIC,
                        "step %lld: %s, with the loss scale already at its floor (precision.loss_scale.min %g), "
                        "so training stops instead of skipping every step (this step was not applied); HINT: "
                        "use precision.policy: mixed_bfloat16 (float32's range, no loss scaling), lower "
                        "optimizer.lr (%g), %s",
                        step, what, t->scaler.min_scale, c->optim.lr, last);
}

/* The test hook (mr_train_cfg.inject_nonfinite_at): +inf into g (n floats on gdev), at the middle
 * of the buffer or of each parameter named by inject_nonfinite_param. */
static mr_status inject_nonfinite(trainer *t, float *g) {
    mr_status st = MR_OK;
    static const float inf = INFINITY;
    const mr_copy_kind h2d = t->gdev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D;
    const char *p = t->c.inject_nonfinite_param;
    if (!p || !*p) return t->gbe->copy(t->gdev.index, g + t->n / 2, &inf, sizeof inf, h2d, t->stream);
    while (*p) {
        const size_t len = strcspn(p, ",");
        char name[256];
        MR_CHECK(len > 0 && len < sizeof name, MR_ERR_INVALID, "inject_nonfinite_param: bad name list '%s'",
                 t->c.inject_nonfinite_param);
        memcpy(name, p, len);
        name[len] = '\0';
        const int32_t i = mr_params_find(t->ps, name);
        MR_CHECK(i >= 0, MR_ERR_INVALID, "inject_nonfinite_param: the model has no parameter '%s'", name);
        const int64_t at = mr_params_offset(t->ps, i) + mr_params_numel(t->ps, i) / 2;
        MR_TRY(t->gbe->copy(t->gdev.index, g + at, &inf, sizeof inf, h2d, t->stream));
        p += len + (p[len] == ',');
    }
fail:
    return st;
}

/* While micro-batch m of this step computes, the next one (the next step's first after the last)
 * is fetched and copied to the device on the copy stream (a GPU; train_device.c tr_dev_prefetch).
 * Not after the run's last batch. Across a step boundary the iterator is then one batch ahead of
 * the data position a checkpoint of this step must save, so that position is kept first
 * (t->pf_blob, train_ckpt.c). */
static mr_status prefetch_next(trainer *t, mr_step *s, int64_t m) {
    mr_status st = MR_OK;
    const mr_train_cfg *c = &t->c;
    const int boundary = m + 1 == c->accumulate;
    if (!tr_dev_can_prefetch(&t->dv) || (boundary && t->step + 1 >= c->steps)) return MR_OK;
    if (boundary && c->ckpt_dir) {
        free(t->pf_blob);
        t->pf_blob = NULL;
        MR_TRY(mr_data_iter_save_global(t->train.it, &t->pf_blob, &t->pf_bytes));
    }
    mr_data_elem e;
    int end = 0;
    const int64_t s0 = mr_trace_begin(t->trace.train);
    MR_TRY(mr_data_iter_next(t->train.it, &e, &end));
    MR_CHECK(!end, MR_ERR_INVALID, "data.train: the training data is empty");
    mr_trace_end1(t->trace.train, s0, "data_ahead", "micro", boundary ? 0 : m + 1);
    MR_TRY(tr_dev_prefetch(&t->dv, s, e.data[0], e.data[1]));
fail:
    return st;
}

mr_status tr_step_forward_backward(trainer *t, mr_step *s, tr_times *tm, double *loss, float **g) {
    mr_status st = MR_OK;
    const mr_train_cfg *c = &t->c;
    if (t->dv.ctl_push) MR_TRY(tr_step_ctl_push(t)); /* what the host changed since its last read */
    t->dv.ctl_read = t->dv.on;
    /* kernels on the CPU are synchronous, so the forward is timed apart; on a GPU the whole step
     * is one run (a captured graph) and forward_s times both, once the loss is back */
    const int32_t nf = t->gdev.kind == MR_DEVICE_CPU ? s->n_forward : 0;
    mr_trace_track *k = t->trace.train; /* spans while the trace window is open (train/trace.c) */
    *loss = 0;
    for (int64_t m = 0; m < c->accumulate; m++) {
        mr_data_elem e;
        int end = 0;
        const double t0 = tr_now_s();
        const int64_t s0 = mr_trace_begin(k);
        /* fetched and copied while the last micro-batch computed (prefetch_next), or now */
        const int ahead = tr_dev_prefetched(&t->dv, s);
        if (!ahead) {
            MR_TRY(mr_data_iter_next(t->train.it, &e, &end));
            MR_CHECK(!end, MR_ERR_INVALID, "data.train: the training data is empty");
        }
        mr_trace_end1(k, s0, "data_wait", "micro", m);
        if (t->data_log) { /* global position of element 0 (train_data.c); the iterator's last batch is this one */
            const int64_t micro = c->batch / (c->accumulate * t->world);
            tr_data_log_batch(t->data_log, "train", t->train.it, ((t->step * c->accumulate + m) * micro) * t->world + t->rank,
                              t->world);
        }
        const double t1 = tr_now_s();
        const int64_t s1 = mr_trace_begin(k);
        if (ahead) {
            MR_TRY(tr_dev_feed_prefetched(&t->dv, s));
            if (m == 0) { /* the iterator's position is this step's again */
                free(t->pf_blob);
                t->pf_blob = NULL;
            }
        } else {
            MR_TRY(tr_dev_feed(&t->dv, s, e.data[0], e.data[1]));
        }
        mr_plan_set_dropout_step(s->plan, (uint64_t)(t->step * c->accumulate + m)); /* fresh masks each micro-step */
        if (nf > 0) MR_TRY(mr_plan_run_range(s->plan, 0, nf));
        if (nf > 0) mr_trace_end1(k, s1, "forward", "micro", m);
        const double t2 = tr_now_s();
        const int64_t s2 = nf > 0 ? mr_trace_begin(k) : s1; /* on a GPU one run does both */
        MR_TRY(mr_ddp_backward(t->ddp, run_range, s->plan, nf, mr_plan_num_kernels(s->plan)));
        const double ta = tr_now_s();
        MR_TRY(prefetch_next(t, s, m)); /* while the device computes */
        const double ahead_s = tr_now_s() - ta;
        const void *hl = NULL;
        if (t->dv.on) { /* the loss stays on the device (mr_step_ctl), nothing waits */
            const float *dl = mr_plan_data(s->plan, s->io.loss);
            MR_CHECK(dl, MR_ERR_INTERNAL, "trainer: the step's loss is not kept");
            MR_TRY(mr_vec_ctl_loss(t->gdev, t->stream, t->dv.d_ctl, dl, m, c->accumulate));
        } else {
            MR_TRY(tr_dev_read(&t->dv, s, s->io.loss, sizeof(float), &hl));
        }
        mr_trace_end1(k, s2, nf > 0 ? "backward" : "forward_backward", "micro", m);
        const double t3 = tr_now_s() - ahead_s; /* the next batch's fetch is data time */
        tm->data += t1 - t0 + ahead_s;
        tm->fwd += (nf > 0 ? t2 : t3) - t1;
        tm->bwd += nf > 0 ? t3 - t2 : 0.0;
        if (hl) *loss += *(const float *)hl;
        if (t->acc) {
            /* the gradients of micro-batch means, averaged: the gradient of the batch mean */
            const float w = 1.0f / (float)c->accumulate;
            const int64_t s3 = mr_trace_begin(k);
            MR_TRY(mr_vec_axpby(t->gdev, t->stream, t->acc, m == 0 ? 0.0f : 1.0f, t->grads, w, t->n));
            mr_trace_end1(k, s3, "accumulate", "micro", m);
        }
    }
    *loss = t->dv.on ? NAN : *loss / (double)c->accumulate; /* the device path: on the device */
    *g = t->acc ? t->acc : t->grads;
    if (c->inject_nonfinite_at == t->step + 1) /* on every replica, before the exchange */
        MR_TRY(inject_nonfinite(t, *g));
fail:
    return st;
}

/* n values of the device path's memory (the control block, the check's flags) summed over the
 * replicas where they live: on GPUs NCCL's stream waits for everything enqueued so far on the
 * step's stream, sums them there, and the step's stream waits for the sum (no host wait); on the
 * CPU device path the host communicator sums them at once. */
static mr_status ctl_allreduce(trainer *t, void *d, int64_t n, mr_dtype dt) {
    mr_status st = MR_OK;
    tr_device *dv = &t->dv;
    if (dv->dev.kind != MR_DEVICE_CUDA) return mr_comm_allreduce(dv->gcomm, d, n, dt, MR_REDUCE_SUM);
    for (int k = 0; k < 2; k++)
        if (!dv->ev_ctl[k]) MR_TRY(dv->be->event_new(dv->dev.index, &dv->ev_ctl[k]));
    MR_TRY(dv->be->event_record(dv->ev_ctl[0], dv->stream));
    MR_TRY(mr_comm_nccl_wait_event(dv->gcomm, dv->ev_ctl[0]));
    MR_TRY(mr_comm_nccl_allreduce_async(dv->gcomm, d, n, dt, MR_REDUCE_SUM));
    MR_TRY(mr_comm_nccl_record_event(dv->gcomm, dv->ev_ctl[1]));
    MR_TRY(dv->be->stream_wait_event(dv->stream, dv->ev_ctl[1]));
fail:
    return st;
}

mr_status tr_step_exchange(trainer *t, float *g, double *loss, int *stop, mr_ddp_part *part, tr_times *tm) {
    mr_status st = MR_OK;
    const double t0 = tr_now_s();
    /* the replicas' gradients averaged (the gradient of the global batch's mean loss), and the
     * loss and any stop request agreed, so every replica takes the same decisions */
    double agree[2] = {*loss, *stop};
    const int64_t s0 = mr_trace_begin(t->trace.train);
    MR_TRY(mr_ddp_finish(t->ddp, g, agree, t->comm ? 2 : 0, part));
    mr_trace_end(t->trace.train, s0, "exchange");
    if (t->c.stall_at == t->step + 1 && t->rank == t->c.stall_replica && t->c.stall_s > 0) { /* the test hook */
        const struct timespec ts = {(time_t)t->c.stall_s, (long)((t->c.stall_s - (double)(time_t)t->c.stall_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    if (t->comm) {
        *loss = agree[0] / (double)t->world;
        *stop = agree[1] > 0;
        if (t->dv.on) /* the device's losses summed on the device (mr_ctl_check divides) */
            MR_TRY(ctl_allreduce(t, &t->dv.d_ctl->loss, 1, MR_F64));
        tm->comm += tr_now_s() - t0;
    }
fail:
    return st;
}

/* ---- the device path: the decisions on the device ------------------------------------------- */

/* tr_step_check's work enqueued: the sum of squares with the flags, the verdict and the scaler,
 * the unscale when applied (the update itself reads apply, tr_step_update). */
static mr_status check_dev(trainer *t, const mr_ddp_part *part) {
    mr_status st = MR_OK;
    mr_step_ctl *ctl = t->dv.d_ctl;
    MR_ASSERT(part->off == t->seg_off && part->n == t->seg_n); /* the whole buffer, or ZeRO-1's shard */
    MR_TRY(mr_vec_sumsq_to(t->gdev, t->stream, part->g, part->n, t->n_seg ? t->d_seg : NULL, t->n_seg, t->d_bad,
                           t->d_scratch, &ctl->sumsq));
    if (t->zero) { /* the shards' sums and flags: every replica the same verdict, scale and words */
        MR_TRY(ctl_allreduce(t, &ctl->sumsq, 1, MR_F64));
        if (t->n_seg) MR_TRY(ctl_allreduce(t, t->d_bad, t->n_seg, MR_I32));
    }
    const mr_ctl_cfg k = {.step = t->step + 1,
                          .world = t->comm ? (double)t->world : 1.0,
                          .scaling = t->scaling,
                          .nparam = t->n_seg,
                          .growth_factor = t->scaler.growth_factor,
                          .backoff_factor = t->scaler.backoff_factor,
                          .min_scale = t->scaler.min_scale,
                          .growth_interval = t->scaler.growth_interval};
    MR_TRY(mr_vec_ctl_check(t->gdev, t->stream, ctl, &k, t->d_bad, t->d_order));
    if (t->scaling) MR_TRY(mr_vec_scale_if(t->gdev, t->stream, part->g, &ctl->unscale, &ctl->apply, part->n));
fail:
    return st;
}

/* tr_step_update's work enqueued: the clip factor from the device's sums, the update by pointer. */
static mr_status update_dev(trainer *t, const mr_ddp_part *part, double lr) {
    mr_status st = MR_OK;
    mr_step_ctl *ctl = t->dv.d_ctl;
    const double max_norm = t->c.grad_clip;
    if (max_norm > 0) { /* the check's sum when the values are the same (no loss scaling) */
        if (t->scaling) {
            MR_TRY(mr_vec_sumsq_to(t->gdev, t->stream, part->g, part->n, NULL, 0, NULL, t->d_scratch, &ctl->clip_sumsq));
            if (t->zero) MR_TRY(ctl_allreduce(t, &ctl->clip_sumsq, 1, MR_F64));
        }
        MR_TRY(mr_vec_ctl_clip(t->gdev, t->stream, ctl, max_norm, t->scaling));
        MR_TRY(mr_vec_scale_if(t->gdev, t->stream, part->g, &ctl->clip, &ctl->clip_on, part->n));
    }
    MR_TRY(mr_optim_step_ctl(t->wopt, t->params + part->off, part->g, lr, &ctl->apply, &ctl->updates, t->step + 1));
    MR_TRY(mr_ddp_gather(t->ddp, t->params)); /* every replica's shard to every replica (ZeRO-1) */
fail:
    return st;
}

/* The text of a step that was not finite (grads_report's words from the device's record). */
static void event_grads(const trainer *t, const mr_ctl_event *e, char *buf, size_t cap) {
    buf[0] = '\0';
    if (e->first < 0 || e->first >= t->n_seg) return;
    char more[48];
    if (e->bad > 1) snprintf(more, sizeof more, "first of %d in backward order", (int)e->bad);
    else snprintf(more, sizeof more, "the only one");
    snprintf(buf, cap, "non-finite gradients in %s (%s)", mr_params_name(t->ps, e->first), more);
}

static mr_status fail_nonfinite(const trainer *t, const mr_ctl_event *e, int floor);

mr_status tr_step_ctl_push(trainer *t) {
    mr_status st = MR_OK;
    tr_device *dv = &t->dv;
    if (!dv->on) return MR_OK;
    MR_TRY(tr_step_sync(t)); /* nothing the device decided since its last read is lost */
    mr_step_ctl *h = dv->h_ctl;
    memset(h, 0, sizeof *h);
    h->scale = t->scaling ? t->scaler.scale : 1.0;
    h->scale_f32 = t->scaling ? (float)t->scaler.scale : 1.0f;
    h->good_steps = t->scaler.good_steps;
    h->skipped = t->scaler.skipped;
    h->updates = t->wopt ? mr_optim_steps(t->wopt) : 0;
    h->loss_sum = t->loss_sum;
    h->interval = t->interval;
    h->unscale = h->clip = 1.0f;
    const mr_copy_kind h2d = dv->dev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D;
    MR_TRY(dv->be->copy(dv->dev.index, dv->d_ctl, h, sizeof *h, h2d, dv->stream));
    MR_TRY(tr_dev_sync(dv, "the step control's upload")); /* h is read again by the next tr_step_sync */
    dv->ctl_push = 0;
fail:
    return st;
}

mr_status tr_step_sync(trainer *t) {
    mr_status st = MR_OK;
    tr_device *dv = &t->dv;
    if (!dv->on || !dv->ctl_read) return MR_OK;
    mr_step_ctl *h = dv->h_ctl;
    const mr_copy_kind d2h = dv->dev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_D2H;
    MR_TRY(dv->be->copy(dv->dev.index, h, dv->d_ctl, sizeof *h, d2h, dv->stream));
    char what[64];
    snprintf(what, sizeof what, "step %lld's results", (long long)t->step);
    MR_TRY(tr_dev_sync(dv, what));
    dv->ctl_read = 0;
    dv->ctl_push = 1; /* the events read are cleared, and the host may change the sums */
    const int kept = h->n_events < MR_CTL_EVENTS ? h->n_events : MR_CTL_EVENTS;
    for (int i = 0; i < kept && !t->c.quiet; i++) {
        const mr_ctl_event *e = &h->events[i];
        char grads[512], what[768];
        event_grads(t, e, grads, sizeof grads);
        describe(grads, e->loss, what, sizeof what);
        mr_log_warn("step %lld skipped: %s, loss scale %g -> %g", (long long)e->step, what, e->scale_before,
                    e->scale_after);
    }
    if (h->n_events > kept && !t->c.quiet)
        mr_log_warn("%d more steps skipped before step %lld (non-finite gradients; the device records the first %d "
                    "between two log steps)", (int)(h->n_events - kept), (long long)t->step, MR_CTL_EVENTS);
    t->scaler.scale = h->scale;
    t->scaler.good_steps = h->good_steps;
    t->scaler.skipped = h->skipped;
    t->loss_sum = h->loss_sum;
    t->interval = h->interval;
    if (t->wopt) mr_optim_set_steps(t->wopt, h->updates);
    t->last_loss = h->loss;
    t->last_apply = h->apply;
    if (h->stop.step != 0) return fail_nonfinite(t, &h->stop, h->stop_floor);
fail:
    return st;
}

/* tr_step_check's errors. */
static mr_status fail_nonfinite(const trainer *t, const mr_ctl_event *e, int floor) {
    const long long step = (long long)e->step;
    char grads[512], what[768];
    event_grads(t, e, grads, sizeof grads);
    if (!floor) return nonfinite_error(t, step, grads, e->loss);
    describe(grads, e->loss, what, sizeof what);
    return floor_error(t, step, what);
}

mr_status tr_step_check(trainer *t, double loss, const mr_ddp_part *part, int *apply) {
    mr_status st = MR_OK;
    const mr_train_cfg *c = &t->c;
    const long long step = (long long)t->step + 1; /* 1-based, as the log and the checkpoints count */
    char grads[512], what[768];
    *apply = 1;
    t->check_sumsq = NAN;
    if (t->dv.on) return check_dev(t, part);
    if (!t->scaling) {
        double sumsq = 0;
        int finite = 0;
        MR_TRY(grads_check(t, part, &finite, &sumsq));
        MR_TRY(mr_ddp_all(t->ddp, &finite)); /* the shards' verdicts (ZeRO-1) */
        if (finite && isfinite(loss)) {
            t->check_sumsq = sumsq; /* clipping's sum of squares (tr_step_update): the same pass */
            return MR_OK;
        }
        MR_TRY(grads_report(t, grads, sizeof grads));
        return nonfinite_error(t, step, grads, loss);
    }
    /* one pass: the sum of squares is inf or NaN exactly when a gradient is, and the parameters
     * whose gradients are not finite are flagged on the way (no extra pass, nothing stored when
     * all are finite) */
    int finite = 0;
    double sumsq = 0;
    MR_TRY(grads_check(t, part, &finite, &sumsq));
    finite = finite && isfinite(loss);
    MR_TRY(mr_ddp_all(t->ddp, &finite)); /* the shards' verdicts (ZeRO-1) */
    const double scale = t->scaler.scale;
    if (finite) {
        *apply = mr_loss_scaler_update(&t->scaler, 1);
        MR_TRY(mr_vec_scale(t->gdev, t->stream, part->g, (float)(1.0 / scale), part->n)); /* unscale */
        return MR_OK;
    }
    /* rare from here: which parameters, and whether the scaler can back off further */
    MR_TRY(grads_report(t, grads, sizeof grads));
    describe(grads, loss, what, sizeof what);
    *apply = mr_loss_scaler_update(&t->scaler, 0);
    if (scale <= t->scaler.min_scale) return floor_error(t, step, what);
    if (!c->quiet) mr_log_warn("step %lld skipped: %s, loss scale %g -> %g", step, what, scale, t->scaler.scale);
fail:
    return st;
}

mr_status tr_step_update(trainer *t, const mr_ddp_part *part, double lr) {
    mr_status st = MR_OK;
    const double max_norm = t->c.grad_clip;
    if (t->dv.on) return update_dev(t, part, lr);
    if (max_norm > 0) { /* torch.nn.utils.clip_grad_norm_ over every replica's part */
        double sumsq = t->check_sumsq; /* the finite check's, of these very values (no loss scaling) */
        if (isnan(sumsq)) MR_TRY(mr_vec_sumsq(t->gdev, t->stream, part->g, part->n, t->d_scratch, &sumsq));
        MR_TRY(mr_ddp_sumsq(t->ddp, &sumsq));
        const double norm = sqrt(sumsq);
        if (isfinite(norm) && norm > max_norm)
            MR_TRY(mr_vec_scale(t->gdev, t->stream, part->g, (float)(max_norm / (norm + 1e-6)), part->n));
    }
    MR_TRY(mr_optim_step(t->wopt, t->params + part->off, part->g, lr));
    MR_TRY(mr_ddp_gather(t->ddp, t->params)); /* every replica's shard to every replica (ZeRO-1) */
fail:
    return st;
}
