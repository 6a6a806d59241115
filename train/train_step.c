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
 * step's buffers (t->params, t->grads, t->acc, t->wopt) are the registry's or the device's. */
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
    }
    free(t->bwd_order);
    free(t->h_flag);
    free(t->h_count);
    t->d_seg = NULL, t->d_bad = NULL, t->bwd_order = NULL, t->h_flag = NULL, t->h_count = NULL;
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
    MR_TRY(t->gbe->stream_sync(t->stream));
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
        MR_TRY(tr_dev_read(&t->dv, s, s->io.loss, sizeof(float), &hl)); /* waits for the device */
        mr_trace_end1(k, s2, nf > 0 ? "backward" : "forward_backward", "micro", m);
        const double t3 = tr_now_s() - ahead_s; /* the next batch's fetch is data time */
        tm->data += t1 - t0 + ahead_s;
        tm->fwd += (nf > 0 ? t2 : t3) - t1;
        tm->bwd += nf > 0 ? t3 - t2 : 0.0;
        *loss += *(const float *)hl;
        if (t->acc) {
            /* the gradients of micro-batch means, averaged: the gradient of the batch mean */
            const float w = 1.0f / (float)c->accumulate;
            const int64_t s3 = mr_trace_begin(k);
            MR_TRY(mr_vec_axpby(t->gdev, t->stream, t->acc, m == 0 ? 0.0f : 1.0f, t->grads, w, t->n));
            mr_trace_end1(k, s3, "accumulate", "micro", m);
        }
    }
    *loss /= (double)c->accumulate;
    *g = t->acc ? t->acc : t->grads;
    if (c->inject_nonfinite_at == t->step + 1) /* on every replica, before the exchange */
        MR_TRY(inject_nonfinite(t, *g));
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
    if (t->comm) {
        *loss = agree[0] / (double)t->world;
        *stop = agree[1] > 0;
        tm->comm += tr_now_s() - t0;
    }
fail:
    return st;
}

mr_status tr_step_check(trainer *t, double loss, const mr_ddp_part *part, int *apply) {
    mr_status st = MR_OK;
    const mr_train_cfg *c = &t->c;
    const long long step = (long long)t->step + 1; /* 1-based, as the log and the checkpoints count */
    char grads[512], what[768];
    *apply = 1;
    t->check_sumsq = NAN;
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
    if (scale <= t->scaler.min_scale) {
        /* skipping for ever would train nothing; the update was never applied, so the parameters
         * and the last checkpoint are the last good ones */
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
    if (!c->quiet) mr_log_warn("step %lld skipped: %s, loss scale %g -> %g", step, what, scale, t->scaler.scale);
fail:
    return st;
}

mr_status tr_step_update(trainer *t, const mr_ddp_part *part, double lr) {
    mr_status st = MR_OK;
    const double max_norm = t->c.grad_clip;
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
