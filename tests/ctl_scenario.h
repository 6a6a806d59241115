/* A scripted run of the trainer's device-side step decisions (core/math/ctl_math.h through core/vec.h
 * mr_vec_ctl_*), shared by tests/unit/test_vec.c (the CPU against the host path's arithmetic) and
 * tests/gpu/test_gpu_vec.c (CUDA against the CPU): 4 parameters of 250 gradients each, backward
 * order 3, 2, 1, 0; 2 micro-batch losses a step; infs planted in some steps' gradients, a NaN loss
 * in one; loss scaling (growth every 2 finite steps, the floor reached at step 14) and clipping. */
#ifndef MR_TESTS_CTL_SCENARIO_H
#define MR_TESTS_CTL_SCENARIO_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/vec.h"
#include "core/math/ctl_math.h"

#define CTL_N 1000
#define CTL_P 4
#define CTL_STEPS 14
#define CTL_MAX_NORM 0.5

static const int64_t ctl_seg[CTL_P] = {0, 250, 500, 750};
static const int32_t ctl_order[CTL_P] = {3, 2, 1, 0};

/* Step k's (1-based) gradient before scaling, its two micro-batch losses; where infs go. */
static void ctl_inputs(int k, float *g, float *l) {
    uint64_t r = 12345u + (uint64_t)k * 977u;
    for (int i = 0; i < CTL_N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        g[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 0.2 - 0.1);
    }
    l[0] = 2.0f + 0.01f * (float)k;
    l[1] = 1.5f - 0.01f * (float)k;
    if (k == 3) g[600] = INFINITY;                    /* parameter 2 */
    if (k == 5) l[1] = NAN;                           /* a non-finite loss, finite gradients */
    if (k == 8) g[10] = g[900] = -INFINITY;           /* parameters 0 and 3: 3 first */
    if (k >= 11) g[300] = NAN;                        /* parameter 1, from here to the floor */
}

/* The scaler every scenario starts from. */
static mr_ctl_cfg ctl_cfg(int k) {
    mr_ctl_cfg c;
    memset(&c, 0, sizeof c);
    c.step = k;
    c.world = 1.0;
    c.scaling = 1;
    c.nparam = CTL_P;
    c.growth_factor = 2.0;
    c.backoff_factor = 0.5;
    c.min_scale = 32.0;
    c.growth_interval = 2;
    return c;
}

static void ctl_start(mr_step_ctl *h) {
    memset(h, 0, sizeof *h);
    h->scale = 256.0;
    h->scale_f32 = 256.0f;
    h->unscale = h->clip = 1.0f;
}

/* One step on device d: the losses and the scaled gradient are already in l (2 floats) and g
 * (CTL_N) of d's memory; seg, order, bad in d's memory, scratch MR_VEC_SCRATCH doubles (NULL on
 * the CPU). */
static mr_status ctl_step(mr_device d, int k, mr_step_ctl *ctl, float *g, const float *l, const int64_t *seg,
                          const int32_t *order, int32_t *bad, double *scratch) {
    mr_status st = MR_OK;
    for (int m = 0; m < 2; m++) MR_TRY(mr_vec_ctl_loss(d, NULL, ctl, l + m, m, 2));
    MR_TRY(mr_vec_sumsq_to(d, NULL, g, CTL_N, seg, CTL_P, bad, scratch, &ctl->sumsq));
    const mr_ctl_cfg cfg = ctl_cfg(k);
    MR_TRY(mr_vec_ctl_check(d, NULL, ctl, &cfg, bad, order));
    MR_TRY(mr_vec_scale_if(d, NULL, g, &ctl->unscale, &ctl->apply, CTL_N));
    MR_TRY(mr_vec_sumsq_to(d, NULL, g, CTL_N, NULL, 0, NULL, scratch, &ctl->clip_sumsq));
    MR_TRY(mr_vec_ctl_clip(d, NULL, ctl, CTL_MAX_NORM, 1));
    MR_TRY(mr_vec_scale_if(d, NULL, g, &ctl->clip, &ctl->clip_on, CTL_N));
fail:
    return st;
}

#endif
