/* Optimizers, schedules, clipping and loss scaling (see optim.h). The updates run the op table's
 * fused kernels (MR_OP_SGD_UPDATE, MR_OP_ADAMW_UPDATE) over the whole contiguous buffer. */
#include "optim/optim.h"
#include "core/ops.h"
#include "core/vec.h"
#include "core/math/unary_math.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct mr_optim {
    mr_optim_cfg cfg;
    int64_t n, steps;
    float *slot[2];
    mr_device dev;          /* where the slots live and the update runs */
    const mr_backend *be;   /* dev's backend (slots allocated through it) */
    mr_stream *stream;      /* borrowed; NULL: the device's default stream */
    double *bc;             /* mr_optim_reserve's table in dev's memory (2 doubles per step 0..bc_last) */
    int64_t bc_last;        /* its last entry */
    int64_t bc_steps;       /* the steps it serves: entry min(step, bc_last) */
};

mr_optim_cfg mr_optim_cfg_default(mr_optim_kind kind) {
    mr_optim_cfg c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.lr = 1e-3;
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.eps = 1e-8;
    c.weight_decay = kind == MR_OPTIM_ADAMW ? 0.01 : 0.0;
    return c;
}

static mr_status check_cfg(const mr_optim_cfg *c) {
    if (c->kind < MR_OPTIM_SGD || c->kind > MR_OPTIM_ADAMW)
        return mr_set_error(MR_ERR_INVALID, "optimizer.type: unknown optimizer %d", (int)c->kind);
    if (!(c->lr >= 0) || !isfinite(c->lr)) return mr_set_error(MR_ERR_INVALID, "optimizer.lr: must be >= 0, got %g", c->lr);
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        return mr_set_error(MR_ERR_INVALID, "optimizer.weight_decay: must be >= 0, got %g", c->weight_decay);
    if (c->kind == MR_OPTIM_SGD) {
        if (!(c->momentum >= 0) || !isfinite(c->momentum))
            return mr_set_error(MR_ERR_INVALID, "optimizer.momentum: must be >= 0, got %g", c->momentum);
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
            return mr_set_error(MR_ERR_INVALID, "optimizer.nesterov: needs momentum > 0 and dampening 0");
        return MR_OK;
    }
    if (!(c->beta1 >= 0 && c->beta1 < 1)) return mr_set_error(MR_ERR_INVALID, "optimizer.beta1: must be in [0, 1), got %g", c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1)) return mr_set_error(MR_ERR_INVALID, "optimizer.beta2: must be in [0, 1), got %g", c->beta2);
    if (!(c->eps >= 0) || !isfinite(c->eps)) return mr_set_error(MR_ERR_INVALID, "optimizer.eps: must be >= 0, got %g", c->eps);
    return MR_OK;
}

mr_status mr_optim_new(const mr_optim_cfg *cfg, int64_t n, mr_optim **out) {
    return mr_optim_new_on(cfg, n, mr_device_cpu(), NULL, out);
}

mr_status mr_optim_new_on(const mr_optim_cfg *cfg, int64_t n, mr_device dev, mr_stream *stream, mr_optim **out) {
    *out = NULL;
    mr_status st = check_cfg(cfg);
    if (st != MR_OK) return st;
    if (n < 0) return mr_set_error(MR_ERR_INVALID, "optimizer: %lld parameters", (long long)n);
    const mr_backend *be = NULL;
    st = mr_backend_get(dev.kind, &be);
    if (st != MR_OK) return st;
    mr_optim *o = calloc(1, sizeof *o);
    if (!o) return mr_set_error(MR_ERR_NOMEM, "optimizer: out of memory");
    o->cfg = *cfg;
    o->n = n;
    o->dev = dev;
    o->be = be;
    o->stream = stream;
    int slots = mr_optim_num_slots(o);
    size_t bytes = (size_t)(n ? n : 1) * sizeof(float);
    for (int i = 0; i < slots; i++) {
        st = be->alloc(dev.index, bytes, (void **)&o->slot[i]);
        if (st == MR_OK) st = be->memset_zero(dev.index, o->slot[i], bytes, stream);
        if (st != MR_OK) {
            mr_optim_free(o);
            return mr_set_error(st, "optimizer: cannot allocate %lld floats of state: %s", (long long)n, mr_last_error());
        }
    }
    *out = o;
    return MR_OK;
}

void mr_optim_free(mr_optim *o) {
    if (!o) return;
    o->be->free(o->dev.index, o->slot[0]);
    o->be->free(o->dev.index, o->slot[1]);
    o->be->free(o->dev.index, o->bc);
    free(o);
}

int64_t mr_optim_steps(const mr_optim *o) { return o->steps; }
void mr_optim_set_steps(mr_optim *o, int64_t steps) { o->steps = steps; }

int mr_optim_num_slots(const mr_optim *o) {
    if (o->cfg.kind == MR_OPTIM_SGD) return o->cfg.momentum != 0.0 ? 1 : 0;
    return 2;
}

const char *mr_optim_slot_name(const mr_optim *o, int slot) {
    if (o->cfg.kind == MR_OPTIM_SGD) return slot == 0 ? "momentum_buffer" : "";
    return slot == 0 ? "exp_avg" : slot == 1 ? "exp_avg_sq" : "";
}

float *mr_optim_slot(const mr_optim *o, int slot) { return slot >= 0 && slot < 2 ? o->slot[slot] : NULL; }

mr_status mr_optim_reserve(mr_optim *o, int64_t max_steps) {
    if (o->cfg.kind == MR_OPTIM_SGD || max_steps <= o->bc_steps) return MR_OK;
    if (max_steps < 0) return mr_set_error(MR_ERR_INVALID, "optimizer: reserving %lld steps", (long long)max_steps);
    /* 1 - beta^k is exactly 1 once beta^k is below half an ulp of 1, and stays so: the table ends
     * at the first entry that is (1, 1) for both betas, and later steps read it (a few thousand
     * entries for the default betas, whatever the run's length) */
    int64_t last = 1;
    double bc[2];
    for (; last < max_steps; last++) {
        mr_adamw_bias_corrections(o->cfg.beta1, o->cfg.beta2, last, bc);
        if (bc[0] == 1.0 && bc[1] == 1.0) break;
    }
    const size_t bytes = sizeof(double) * 2 * (size_t)(last + 1);
    double *h = malloc(bytes), *d = NULL;
    if (!h) return mr_set_error(MR_ERR_NOMEM, "optimizer: out of host memory for %lld steps' bias corrections",
                                (long long)last);
    h[0] = h[1] = NAN; /* step 0 is never an update */
    for (int64_t k = 1; k <= last; k++) mr_adamw_bias_corrections(o->cfg.beta1, o->cfg.beta2, k, h + 2 * k);
    const int saturated = h[2 * last] == 1.0 && h[2 * last + 1] == 1.0;
    mr_status st = o->be->alloc(o->dev.index, bytes, (void **)&d);
    if (st == MR_OK)
        st = o->be->copy(o->dev.index, d, h, bytes, o->dev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D, o->stream);
    if (st == MR_OK && o->stream) st = o->be->stream_sync(o->stream); /* h is freed below */
    free(h);
    if (st != MR_OK) {
        o->be->free(o->dev.index, d);
        return st;
    }
    o->be->free(o->dev.index, o->bc);
    o->bc = d;
    o->bc_last = last;
    o->bc_steps = saturated ? INT64_MAX : max_steps;
    return MR_OK;
}

static mr_status step_args(mr_optim *o, float *params, float *grads, double lr, const int32_t *apply,
                           const int64_t *step);

mr_status mr_optim_step(mr_optim *o, float *params, float *grads, double lr) {
    mr_status st = step_args(o, params, grads, lr, NULL, NULL);
    if (st == MR_OK) o->steps++;
    return st;
}

mr_status mr_optim_step_ctl(mr_optim *o, float *params, float *grads, double lr, const int32_t *apply,
                            const int64_t *step, int64_t bound) {
    if (!apply || !step) return mr_set_error(MR_ERR_INVALID, "optimizer: the by-pointer update needs apply and step");
    if (o->cfg.kind != MR_OPTIM_SGD && bound > o->bc_steps)
        return mr_set_error(MR_ERR_INVALID, "optimizer: step up to %lld, bias corrections reserved for %lld",
                            (long long)bound, (long long)o->bc_steps);
    return step_args(o, params, grads, lr, apply, step);
}

/* One update: by value (apply and step NULL: the host's count o->steps) or by pointer. */
static mr_status step_args(mr_optim *o, float *params, float *grads, double lr, const int32_t *apply,
                           const int64_t *step) {
    if (!(lr >= 0) || !isfinite(lr)) return mr_set_error(MR_ERR_INVALID, "optimizer: learning rate %g", lr);
    mr_shape s = mr_shape_1d(o->n);
    mr_op_args a;
    if (o->cfg.kind == MR_OPTIM_SGD) {
        mr_op_args_init(&a, MR_OP_SGD_UPDATE);
        a.p.sgd = (mr_sgd_params){lr, o->cfg.momentum, o->cfg.dampening, o->cfg.weight_decay, o->cfg.nesterov,
                                  o->steps == 0, apply, step};
        a.in[2] = (mr_view){o->slot[0], MR_F32, s};
    } else {
        double wd = o->cfg.weight_decay;
        if (o->cfg.kind == MR_OPTIM_ADAM && wd != 0.0) {
            /* Adam's L2 term joins the gradient (torch.optim.Adam); AdamW's is decoupled (on a
             * skipped by-pointer step it changes only the gradient, which is not used again) */
            mr_status st = mr_vec_axpby(o->dev, o->stream, grads, 1.0f, params, (float)wd, o->n);
            if (st != MR_OK) return st;
            wd = 0.0;
        }
        mr_op_args_init(&a, MR_OP_ADAMW_UPDATE);
        a.p.adamw = (mr_adamw_params){lr,   o->cfg.beta1, o->cfg.beta2,       o->cfg.eps, wd, o->steps + 1,
                                      apply, step,         step ? o->bc : NULL, o->bc_last};
        a.in[2] = (mr_view){o->slot[0], MR_F32, s};
        a.in[3] = (mr_view){o->slot[1], MR_F32, s};
    }
    a.in[0] = (mr_view){params, MR_F32, s};
    a.in[1] = (mr_view){grads, MR_F32, s};
    a.device = o->dev.index;
    a.stream = o->stream;
    return mr_op_run(o->dev.kind, &a);
}

/* ---- schedules -------------------------------------------------------------------------------- */

mr_status mr_schedule_check(const mr_schedule_cfg *s) {
    if (s->kind < MR_SCHEDULE_CONSTANT || s->kind > MR_SCHEDULE_LINEAR)
        return mr_set_error(MR_ERR_INVALID, "schedule.type: unknown schedule %d", (int)s->kind);
    if (s->warmup < 0) return mr_set_error(MR_ERR_INVALID, "schedule.warmup: must be >= 0, got %lld", (long long)s->warmup);
    if (s->kind == MR_SCHEDULE_STEP && s->step_size <= 0)
        return mr_set_error(MR_ERR_INVALID, "schedule.step_size: must be >= 1, got %lld", (long long)s->step_size);
    if (s->kind == MR_SCHEDULE_STEP && !(s->gamma > 0))
        return mr_set_error(MR_ERR_INVALID, "schedule.gamma: must be > 0, got %g", s->gamma);
    if (!(s->min_lr >= 0)) return mr_set_error(MR_ERR_INVALID, "schedule.min_lr: must be >= 0, got %g", s->min_lr);
    return MR_OK;
}

double mr_schedule_lr(const mr_schedule_cfg *s, double lr, int64_t t) {
    if (t < s->warmup) return lr * (double)(t + 1) / (double)s->warmup;
    int64_t u = t - s->warmup, span = s->total - s->warmup;
    double progress = span > 0 ? (double)u / (double)span : 1.0;
    if (progress > 1.0) progress = 1.0;
    switch (s->kind) {
    case MR_SCHEDULE_STEP: return lr * pow(s->gamma, (double)(u / s->step_size));
    case MR_SCHEDULE_COSINE: return s->min_lr + (lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * progress));
    case MR_SCHEDULE_LINEAR: return lr + (s->min_lr - lr) * progress;
    default: return lr;
    }
}

/* ---- clipping and loss scaling ---------------------------------------------------------------- */

void mr_clip_grad_norm(float *grads, int64_t n, double max_norm, double *norm) {
    /* core/vec.h's fixed-order sum (the device path's, on a GPU too) */
    double total = 0.0;
    if (mr_vec_sumsq(mr_device_cpu(), NULL, grads, n, NULL, &total) != MR_OK) total = NAN; /* only n < 0 */
    double nrm = sqrt(total);
    if (norm) *norm = nrm;
    if (max_norm > 0 && isfinite(nrm) && nrm > max_norm) {
        mr_status st = mr_vec_scale(mr_device_cpu(), NULL, grads, (float)(max_norm / (nrm + 1e-6)), n);
        (void)st; /* cannot fail: the sum above checked grads and n */
    }
}

mr_loss_scaler mr_loss_scaler_default(void) {
    mr_loss_scaler s = {32768.0, 2.0, 0.5, 1.0, 2000, 0, 0};
    return s;
}

int mr_grads_finite(const float *grads, int64_t n) {
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > 65536)
    for (int64_t i = 0; i < n; i++) bad |= !isfinite(grads[i]);
    return !bad;
}

int mr_loss_scaler_update(mr_loss_scaler *s, int finite) {
    if (!finite) {
        s->scale *= s->backoff_factor;
        if (s->scale < s->min_scale) s->scale = s->min_scale;
        s->good_steps = 0;
        s->skipped++;
        return 0;
    }
    if (++s->good_steps >= s->growth_interval) {
        s->scale *= s->growth_factor;
        s->good_steps = 0;
    }
    return 1;
}

void mr_grads_unscale(float *grads, int64_t n, double scale) {
    const float inv = (float)(1.0 / scale);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) grads[i] *= inv;
}
