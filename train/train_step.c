/* One optimizer step of the training loop (train.c), in the order it runs:
 *   1. next batch; forward and backward, the gradient exchange overlapped with the backward where
 *      the mode allows (tr_step_forward_backward);
 *   2. the replicas agree: gradients averaged, the loss and any stop request agreed
 *      (tr_step_exchange; distribute/ddp.h);
 *   3. the finite check and the loss scaler (tr_step_check);
 *   4. unscale (3.), clip, update, and ZeRO-1's all-gather (tr_step_update).
 * The host path and the device path run the same code: t->gdev is the CPU on the host path,
 * where the vector kernels of core/vec.h give the host loops' bits (optim/optim.c), and the
 * step's buffers (t->params, t->grads, t->acc, t->wopt) are the registry's or the device's. */
#include "train/train_impl.h"
#include "core/vec.h"

#include <math.h>
#include <string.h>
#include <time.h>

double tr_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static mr_status run_range(void *plan, int32_t first, int32_t last) { return mr_plan_run_range(plan, first, last); }

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
        MR_TRY(mr_data_iter_next(t->train.it, &e, &end));
        MR_CHECK(!end, MR_ERR_INVALID, "data.train: the training data is empty");
        mr_trace_end1(k, s0, "data_wait", "micro", m);
        const double t1 = tr_now_s();
        const int64_t s1 = mr_trace_begin(k);
        MR_TRY(tr_dev_feed(&t->dv, s, e.data[0], e.data[1]));
        mr_plan_set_dropout_step(s->plan, (uint64_t)(t->step * c->accumulate + m)); /* fresh masks each micro-step */
        if (nf > 0) MR_TRY(mr_plan_run_range(s->plan, 0, nf));
        if (nf > 0) mr_trace_end1(k, s1, "forward", "micro", m);
        const double t2 = tr_now_s();
        const int64_t s2 = nf > 0 ? mr_trace_begin(k) : s1; /* on a GPU one run does both */
        MR_TRY(mr_ddp_backward(t->ddp, run_range, s->plan, nf, mr_plan_num_kernels(s->plan)));
        const void *hl = NULL;
        MR_TRY(tr_dev_read(&t->dv, s, s->io.loss, sizeof(float), &hl)); /* waits for the device */
        mr_trace_end1(k, s2, nf > 0 ? "backward" : "forward_backward", "micro", m);
        const double t3 = tr_now_s();
        tm->data += t1 - t0;
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
    if (c->inject_nonfinite_at == t->step + 1) { /* on every replica, before the exchange */
        static const float inf = INFINITY;
        MR_TRY(t->gbe->copy(t->gdev.index, *g + t->n / 2, &inf, sizeof inf,
                            t->gdev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D, t->stream));
    }
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
    const long long step = (long long)t->step;
    *apply = 1;
    if (!t->scaling) {
        MR_CHECK(isfinite(loss), MR_ERR_NUMERIC,
                 "non-finite loss (%g) at step %lld; HINT: lower optimizer.lr or set optimizer.grad_clip%s", loss, step,
                 t->gdev.kind == MR_DEVICE_CUDA
                     ? " (on a GPU a label or token id outside [0, classes or vocab) also gives a NaN loss)"
                     : "");
        if (c->inject_nonfinite_at == t->step + 1) *apply = 0; /* an injected inf without a scaler: drop it */
        return MR_OK;
    }
    /* one pass: the sum of squares is inf or NaN exactly when a gradient is */
    double sumsq = 0;
    MR_TRY(mr_vec_sumsq(t->gdev, t->stream, part->g, part->n, t->d_scratch, &sumsq));
    int finite = isfinite(loss) && isfinite(sumsq);
    MR_TRY(mr_ddp_all(t->ddp, &finite)); /* the shards' verdicts (ZeRO-1) */
    const double scale = t->scaler.scale;
    *apply = mr_loss_scaler_update(&t->scaler, finite);
    MR_CHECK(*apply || scale > t->scaler.min_scale || isfinite(loss), MR_ERR_NUMERIC,
             "non-finite loss (%g) at step %lld with the loss scale at its floor (%g); HINT: lower optimizer.lr, set "
             "optimizer.grad_clip, or use mixed_bfloat16",
             loss, step, t->scaler.min_scale);
    if (*apply) MR_TRY(mr_vec_scale(t->gdev, t->stream, part->g, (float)(1.0 / scale), part->n)); /* unscale */
fail:
    return st;
}

mr_status tr_step_update(trainer *t, const mr_ddp_part *part, double lr) {
    mr_status st = MR_OK;
    const double max_norm = t->c.grad_clip;
    if (max_norm > 0) { /* torch.nn.utils.clip_grad_norm_ over every replica's part */
        double sumsq = 0;
        MR_TRY(mr_vec_sumsq(t->gdev, t->stream, part->g, part->n, t->d_scratch, &sumsq));
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
