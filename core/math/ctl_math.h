/* The trainer's per-step decisions as data in device memory (core/vec.h mr_vec_ctl_*; used by
 * train/train_step.c): the loss, the finite check's verdict, the dynamic loss scaler, the skip,
 * the clip factor and the optimizer's update count. Written once for the CPU (core/vec.c) and the
 * CUDA kernels (core/cuda/vec.cu), each function run by one thread, so a GPU and the CPU device
 * path take the same decisions with the same bits as the host path's code (train_step.c
 * tr_step_check, optim/optim.c mr_loss_scaler_update, tr_step_update's clipping). */
#ifndef MR_MATH_CTL_MATH_H
#define MR_MATH_CTL_MATH_H

#include <math.h>
#include <stdint.h>
#include "core/math/hd.h"

/* Skipped steps a control block records between two reads by the host (more are counted in
 * n_events, not kept). */
#define MR_CTL_EVENTS 32

/* One step that was not finite: what the host's warning or error says about it. */
typedef struct mr_ctl_event {
    int64_t step;                        /* 1-based */
    double loss;                         /* the agreed loss */
    double scale_before, scale_after;    /* the loss scale (loss scaling) */
    int32_t first, bad;                  /* the first parameter (registry index) in backward order whose
                                          * gradient was not finite, and how many were; -1, 0: none */
    /* 40 bytes, no padding: an event is copied by assignment, and padding bytes would carry stack
     * garbage into the block (tests compare it byte for byte) */
} mr_ctl_event;

typedef struct mr_step_ctl {
    /* this step */
    double loss;          /* the micro-batches' mean loss; summed over replicas, then their mean */
    double sumsq;         /* the finite check's sum of squares (inf or NaN: a gradient is not finite) */
    double clip_sumsq;    /* clipping's of the unscaled gradient (loss scaling; else sumsq is used) */
    int32_t apply;        /* the update is applied */
    int32_t clip_on;      /* and the gradient multiplied by clip first */
    float unscale;        /* (float)(1 / scale) the gradient is multiplied by (loss scaling) */
    float clip;           /* (float)(max_norm / (norm + 1e-6)) */
    /* carried from step to step */
    float scale_f32;      /* (float)scale: what the next backward multiplies the loss by (1: none) */
    int32_t n_events;     /* skipped steps since the host last read (events holds the first
                           * MR_CTL_EVENTS) */
    double scale;         /* mr_loss_scaler's scale, good_steps, skipped */
    int64_t good_steps, skipped;
    int64_t updates;      /* updates applied (this step's included): the optimizer's step count */
    double loss_sum;      /* the log interval's finite losses (trainer.loss_sum, interval) */
    int64_t interval;
    /* the first step at which training must stop (stop.step 0: none): after it every step is
     * skipped without a record, so the parameters stay the last good ones */
    int32_t stop_floor;   /* 1: loss scaling's scale was at its floor; 0: not finite without scaling */
    int32_t pad;
    mr_ctl_event stop;
    mr_ctl_event events[MR_CTL_EVENTS];
} mr_step_ctl;

/* What the check needs besides the block (by value). */
typedef struct mr_ctl_cfg {
    int64_t step;                 /* 1-based */
    double world;                 /* replicas whose losses ctl->loss sums */
    int32_t scaling;              /* dynamic loss scaling */
    int32_t nparam;               /* flags and order (0: none) */
    double growth_factor, backoff_factor, min_scale;
    int64_t growth_interval;
} mr_ctl_cfg;

/* Micro-batch m of accumulate: ctl->loss = the mean of the losses (the host's sum in double, then
 * the division). */
MR_HD static inline void mr_ctl_loss(mr_step_ctl *c, float loss, int64_t m, int64_t accumulate) {
    c->loss = (m == 0 ? 0.0 : c->loss) + (double)loss;
    if (m == accumulate - 1) c->loss /= (double)accumulate;
}

/* The finite check's verdict and the loss scaler (tr_step_check's arithmetic, GradScaler's
 * _amp_update_scale_): after the exchange, with ctl->loss summed over the replicas and
 * ctl->sumsq the check's. bad (nparam flags, registry order) are read in order (backward order)
 * and zeroed when the step was not finite. */
MR_HD static inline void mr_ctl_check(mr_step_ctl *c, mr_ctl_cfg k, int32_t *bad, const int32_t *order) {
    const double loss = c->loss / k.world;
    c->loss = loss;
    c->apply = 0;
    c->clip_on = 0;
    c->unscale = 1.0f;
    if (c->stop.step != 0) return; /* training stops at the host's next read */
    if (isfinite(c->sumsq) && isfinite(loss)) {
        c->apply = 1;
        c->updates++;
        if (k.scaling) {
            c->unscale = (float)(1.0 / c->scale);
            if (++c->good_steps >= k.growth_interval) {
                c->scale *= k.growth_factor;
                c->good_steps = 0;
            }
            c->scale_f32 = (float)c->scale;
        }
        c->loss_sum += loss;
        c->interval++;
        return;
    }
    mr_ctl_event e;
    e.step = k.step;
    e.loss = loss;
    e.first = -1;
    e.bad = 0;
    for (int32_t i = 0; i < k.nparam; i++)
        if (bad[order[i]]) {
            if (e.first < 0) e.first = order[i];
            e.bad++;
        }
    for (int32_t i = 0; i < k.nparam; i++) bad[i] = 0;
    e.scale_before = e.scale_after = c->scale;
    if (!k.scaling) {
        c->stop = e;
        c->stop_floor = 0;
        return;
    }
    c->scale *= k.backoff_factor;
    if (c->scale < k.min_scale) c->scale = k.min_scale;
    c->good_steps = 0;
    c->skipped++;
    e.scale_after = c->scale;
    c->scale_f32 = (float)c->scale;
    if (e.scale_before <= k.min_scale) {
        c->stop = e;
        c->stop_floor = 1;
        return;
    }
    if (c->n_events < MR_CTL_EVENTS) c->events[c->n_events] = e;
    c->n_events++;
    if (isfinite(loss)) { /* a skipped overflow step does not poison the interval's mean */
        c->loss_sum += loss;
        c->interval++;
    }
}

/* The global-norm clip factor of an applied step (tr_step_update's, torch.nn.utils.clip_grad_norm_):
 * from clip_sumsq (use_clip_sumsq) or the check's sumsq. */
MR_HD static inline void mr_ctl_clip(mr_step_ctl *c, double max_norm, int use_clip_sumsq) {
    c->clip_on = 0;
    if (!c->apply) return;
    const double norm = sqrt(use_clip_sumsq ? c->clip_sumsq : c->sumsq);
    if (isfinite(norm) && norm > max_norm) {
        c->clip = (float)(max_norm / (norm + 1e-6));
        c->clip_on = 1;
    }
}

#endif
