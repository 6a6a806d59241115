/* Optimizers, learning-rate schedules, global-norm clipping and the dynamic loss scaler
 * (docs/DESIGN.md "Precision"). They work on a model's contiguous f32 parameter and gradient buffers
 * (autodiff/nn.h mr_params), so one call updates every parameter and the optimizer state is one
 * buffer per slot in the same layout (what a checkpoint saves as /optimizer/<name>/<slot>).
 * Semantics follow torch.optim (SGD with momentum/dampening/nesterov/weight_decay, Adam with L2
 * weight decay, AdamW with decoupled weight decay) and torch.cuda.amp.GradScaler. */
#ifndef MR_OPTIM_H
#define MR_OPTIM_H

#include <stdint.h>
#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_optim_kind { MR_OPTIM_SGD = 0, MR_OPTIM_ADAM = 1, MR_OPTIM_ADAMW = 2 } mr_optim_kind;

typedef struct mr_optim_cfg {
    mr_optim_kind kind;
    double lr;                        /* the base rate; schedules scale it per step */
    double momentum, dampening;       /* SGD */
    int nesterov;                     /* SGD */
    double weight_decay;              /* SGD and Adam: L2 added to the gradient; AdamW: decoupled */
    double beta1, beta2, eps;         /* Adam, AdamW */
} mr_optim_cfg;

/* PyTorch's defaults for the kind (lr 1e-3; AdamW weight decay 0.01). */
mr_optim_cfg mr_optim_cfg_default(mr_optim_kind kind);

typedef struct mr_optim mr_optim;

/* An optimizer over n parameters (state zeroed). MR_ERR_INVALID for a bad config (the message
 * names the field, e.g. "optimizer.beta2"). */
mr_status mr_optim_new(const mr_optim_cfg *cfg, int64_t n, mr_optim **out) MR_WUR;
/* The same with the state on device dev and the update run there, on `stream` (borrowed; NULL: the
 * device's default stream): params and grads passed to mr_optim_step are then dev's memory, and
 * mr_optim_slot returns dev's memory. mr_optim_new is mr_optim_new_on(the CPU). */
mr_status mr_optim_new_on(const mr_optim_cfg *cfg, int64_t n, mr_device dev, mr_stream *stream, mr_optim **out) MR_WUR;
void mr_optim_free(mr_optim *o); /* NULL is a no-op */
/* One update of params (n) from grads (n) at learning rate lr (the schedule's value); grads may
 * be modified (Adam's L2 term is added in place). */
mr_status mr_optim_step(mr_optim *o, float *params, float *grads, double lr) MR_WUR;
/* The update with its decisions on the device (the trainer's step without host synchronisation,
 * train/train_step.c): apply and step point into dev's memory and are read by the kernel when it
 * runs: *apply 0 leaves the parameters and the state unchanged; *step is the 1-based update count
 * this update is (skipped steps not counted), which Adam's bias correction and SGD's first
 * momentum step use. bound: the largest *step can be when the kernel runs (the caller's count of
 * steps so far, skipped ones included); Adam needs mr_optim_reserve(o, >= bound) first
 * (MR_ERR_INVALID otherwise). The host's count (mr_optim_steps) is not advanced: the caller reads
 * *step back and sets it. The same bits as mr_optim_step at that step. */
mr_status mr_optim_step_ctl(mr_optim *o, float *params, float *grads, double lr, const int32_t *apply,
                            const int64_t *step, int64_t bound) MR_WUR;
/* For mr_optim_step_ctl: Adam's bias corrections for steps 1..max_steps in dev's memory (formed on
 * the host as the by-value update forms them; 16 bytes a step, up to the step from which both are
 * exactly 1, which then serves every later step: ~36k steps for beta2 0.999). Waits for the
 * stream. A no-op for SGD or when max_steps is already covered. */
mr_status mr_optim_reserve(mr_optim *o, int64_t max_steps) MR_WUR;
/* Updates done so far (Adam's bias correction uses it); settable for resume. */
int64_t mr_optim_steps(const mr_optim *o);
void mr_optim_set_steps(mr_optim *o, int64_t steps);
/* The state slots ("momentum_buffer"; "exp_avg", "exp_avg_sq"), each n floats: for checkpoints. */
int mr_optim_num_slots(const mr_optim *o);
const char *mr_optim_slot_name(const mr_optim *o, int slot);
float *mr_optim_slot(const mr_optim *o, int slot);

typedef enum mr_schedule_kind {
    MR_SCHEDULE_CONSTANT = 0,
    MR_SCHEDULE_STEP = 1,   /* lr * gamma^(floor((t - warmup) / step_size)) */
    MR_SCHEDULE_COSINE = 2, /* min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2 */
    MR_SCHEDULE_LINEAR = 3  /* lr -> min_lr linearly */
} mr_schedule_kind;

typedef struct mr_schedule_cfg {
    mr_schedule_kind kind;
    int64_t warmup;      /* linear warmup from lr/warmup... to lr over the first `warmup` steps */
    int64_t total;       /* steps of the run (cosine and linear reach min_lr there) */
    int64_t step_size;   /* STEP */
    double gamma;        /* STEP */
    double min_lr;       /* COSINE, LINEAR */
} mr_schedule_cfg;

/* The learning rate for 0-based step t: warmup rises linearly as lr * (t + 1) / warmup, then the
 * schedule runs over the remaining steps. */
double mr_schedule_lr(const mr_schedule_cfg *s, double lr, int64_t t);
/* MR_ERR_INVALID naming the field ("schedule.step_size") for a bad schedule. */
mr_status mr_schedule_check(const mr_schedule_cfg *s) MR_WUR;

/* The global L2 norm of grads (n) computed in double in fixed blocks (the same bits for any
 * thread count); when max_norm > 0 and the norm exceeds it, grads are scaled by
 * max_norm / (norm + 1e-6) as torch.nn.utils.clip_grad_norm_ does. *norm gets the norm before
 * clipping (inf/NaN when a gradient is not finite; then nothing is scaled). */
void mr_clip_grad_norm(float *grads, int64_t n, double max_norm, double *norm);

/* Dynamic loss scaling for f16 (GradScaler): the loss is multiplied by `scale` before the
 * backward; the step is skipped and the scale halved when any gradient is inf/NaN; after
 * `growth_interval` consecutive finite steps the scale doubles. */
typedef struct mr_loss_scaler {
    double scale, growth_factor, backoff_factor, min_scale;
    int64_t growth_interval;
    int64_t good_steps; /* consecutive finite steps */
    int64_t skipped;    /* steps skipped so far */
} mr_loss_scaler;

/* initial 2^15, x2 after 2000 finite steps, x0.5 on overflow, floor 1. */
mr_loss_scaler mr_loss_scaler_default(void);
/* Non-zero when every one of grads (n) is finite (a parallel scan). */
int mr_grads_finite(const float *grads, int64_t n);
/* Records a step's outcome; returns 1 when the optimizer should apply it (finite), 0 to skip. */
int mr_loss_scaler_update(mr_loss_scaler *s, int finite);
/* grads (n) *= 1/scale, the unscale before clipping and the update. */
void mr_grads_unscale(float *grads, int64_t n, double scale);

#ifdef __cplusplus
}
#endif
#endif
