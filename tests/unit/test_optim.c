/* optim/: SGD, Adam and AdamW against PyTorch's update formulas computed here in double over
 * several steps; schedules (warmup, step, cosine, linear) at their defining points; global-norm
 * clipping (value, thread invariance, non-finite); the dynamic loss scaler (an injected inf skips
 * exactly one update and leaves weights and state untouched; growth and floor). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "optim/optim.h"

enum { N = 37, STEPS = 4 };

/* torch.optim.* for one parameter vector, in double: the reference the kernels must match. */
static void reference(const mr_optim_cfg *c, double *p, const double *g0, int steps, const double *lrs) {
    double m[N] = {0}, v[N] = {0}, buf[N] = {0};
    for (int t = 1; t <= steps; t++) {
        for (int i = 0; i < N; i++) {
            double g = g0[i] * (1.0 + 0.1 * t); /* a different gradient each step */
            double lr = lrs[t - 1];
            if (c->kind == MR_OPTIM_SGD) {
                g += c->weight_decay * p[i];
                if (c->momentum != 0) {
                    buf[i] = t == 1 ? g : c->momentum * buf[i] + (1 - c->dampening) * g;
                    g = c->nesterov ? g + c->momentum * buf[i] : buf[i];
                }
                p[i] -= lr * g;
            } else {
                if (c->kind == MR_OPTIM_ADAM) g += c->weight_decay * p[i];
                else p[i] *= 1 - lr * c->weight_decay;
                m[i] = c->beta1 * m[i] + (1 - c->beta1) * g;
                v[i] = c->beta2 * v[i] + (1 - c->beta2) * g * g;
                double mh = m[i] / (1 - pow(c->beta1, t)), vh = v[i] / (1 - pow(c->beta2, t));
                p[i] -= lr * mh / (sqrt(vh) + c->eps);
            }
        }
    }
}

static void run_case(mr_optim_cfg c, const char *what) {
    double p0[N], g0[N], ref[N], lrs[STEPS] = {0.1, 0.05, 0.02, 0.01};
    th_fill_uniform_f64(p0, N, -1, 1, 1);
    th_fill_uniform_f64(g0, N, -1, 1, 2);
    float p[N], g[N];
    for (int i = 0; i < N; i++) {
        p[i] = (float)p0[i];
        p0[i] = p[i];
        g0[i] = (float)g0[i];
    }
    memcpy(ref, p0, sizeof ref);
    reference(&c, ref, g0, STEPS, lrs);
    mr_optim *o = NULL;
    MR_ASSERT_OK(mr_optim_new(&c, N, &o));
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++) g[i] = (float)(g0[i] * (1.0 + 0.1 * t));
        MR_ASSERT_OK(mr_optim_step(o, p, g, lrs[t - 1]));
    }
    assert_int_equal(mr_optim_steps(o), STEPS);
    assert_true(th_compare(what, p, MR_F32, ref, N, 1e-6, 1e-5, 1e-11));
    mr_optim_free(o);
}

static void test_optimizers(void **state) {
    (void)state;
    mr_optim_cfg c = mr_optim_cfg_default(MR_OPTIM_SGD);
    run_case(c, "sgd");
    c.momentum = 0.9;
    c.weight_decay = 0.01;
    run_case(c, "sgd momentum wd");
    c.nesterov = 1;
    run_case(c, "sgd nesterov");
    c.nesterov = 0;
    c.dampening = 0.5;
    run_case(c, "sgd dampening");
    c = mr_optim_cfg_default(MR_OPTIM_ADAM);
    run_case(c, "adam");
    c.weight_decay = 0.1;
    run_case(c, "adam l2");
    c = mr_optim_cfg_default(MR_OPTIM_ADAMW);
    c.weight_decay = 0.1;
    run_case(c, "adamw");
    mr_optim *o = NULL;
    MR_ASSERT_OK(mr_optim_new(&c, N, &o));
    assert_int_equal(mr_optim_num_slots(o), 2);
    assert_string_equal(mr_optim_slot_name(o, 1), "exp_avg_sq");
    mr_optim_free(o);
    mr_optim_free(NULL);
    c.beta2 = 1.0;
    assert_int_equal(mr_optim_new(&c, N, &o), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "optimizer.beta2"));
    c = mr_optim_cfg_default(MR_OPTIM_SGD);
    c.nesterov = 1;
    assert_int_equal(mr_optim_new(&c, N, &o), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "optimizer.nesterov"));
}

static void test_schedules(void **state) {
    (void)state;
    mr_schedule_cfg s = {MR_SCHEDULE_COSINE, 10, 110, 0, 0, 0.1};
    MR_ASSERT_OK(mr_schedule_check(&s));
    assert_float_equal(mr_schedule_lr(&s, 1.0, 0), 0.1, 1e-12);  /* warmup 1/10 */
    assert_float_equal(mr_schedule_lr(&s, 1.0, 9), 1.0, 1e-12);  /* end of warmup */
    assert_float_equal(mr_schedule_lr(&s, 1.0, 10), 1.0, 1e-12); /* cosine starts at lr */
    assert_float_equal(mr_schedule_lr(&s, 1.0, 60), 0.55, 1e-12); /* halfway: (lr + min) / 2 */
    assert_float_equal(mr_schedule_lr(&s, 1.0, 110), 0.1, 1e-12); /* reaches min_lr and stays */
    assert_float_equal(mr_schedule_lr(&s, 1.0, 500), 0.1, 1e-12);
    s = (mr_schedule_cfg){MR_SCHEDULE_LINEAR, 0, 100, 0, 0, 0.0};
    assert_float_equal(mr_schedule_lr(&s, 2.0, 25), 1.5, 1e-12);
    s = (mr_schedule_cfg){MR_SCHEDULE_STEP, 5, 100, 10, 0.5, 0};
    assert_float_equal(mr_schedule_lr(&s, 1.0, 14), 1.0, 1e-12);
    assert_float_equal(mr_schedule_lr(&s, 1.0, 15), 0.5, 1e-12);
    assert_float_equal(mr_schedule_lr(&s, 1.0, 35), 0.125, 1e-12);
    s = (mr_schedule_cfg){MR_SCHEDULE_CONSTANT, 0, 100, 0, 0, 0};
    assert_float_equal(mr_schedule_lr(&s, 0.3, 77), 0.3, 0);
    s = (mr_schedule_cfg){MR_SCHEDULE_STEP, 0, 100, 0, 0.5, 0};
    assert_int_equal(mr_schedule_check(&s), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "schedule.step_size"));
}

static void test_clip(void **state) {
    (void)state;
    const int64_t n = 100003;
    float *g = th_alloc(sizeof(float) * n), *h = th_alloc(sizeof(float) * n);
    th_fill_uniform_f32(g, n, -1, 1, 3);
    double ref = 0;
    for (int64_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
    ref = sqrt(ref);
    memcpy(h, g, sizeof(float) * n);
    double norm = 0, norm1 = 0;
    mr_cpu_set_threads(1);
    mr_clip_grad_norm(h, n, 0, &norm1);
    mr_cpu_set_threads(2);
    mr_clip_grad_norm(g, n, 1.0, &norm);
    assert_true(norm == norm1); /* fixed blocks: the same bits for 1 and 2 threads */
    assert_float_equal(norm, ref, 1e-9 * ref);
    double after = 0;
    mr_clip_grad_norm(g, n, 0, &after);
    assert_float_equal(after, 1.0, 1e-5);
    g[17] = INFINITY;
    mr_clip_grad_norm(g, n, 1.0, &norm);
    assert_true(isinf(norm));
    assert_float_equal(g[18], h[18] * (float)(1.0 / (ref + 1e-6)), 1e-6); /* not scaled again */
    th_free_all();
}

/* An injected inf: exactly one skipped update, weights and optimizer state untouched, scale
 * halved; finite steps then grow the scale after growth_interval; the floor holds. */
static void test_loss_scaler(void **state) {
    (void)state;
    mr_loss_scaler s = mr_loss_scaler_default();
    assert_float_equal(s.scale, 32768.0, 0);
    s.growth_interval = 3;
    mr_optim_cfg c = mr_optim_cfg_default(MR_OPTIM_ADAMW);
    mr_optim *o = NULL;
    MR_ASSERT_OK(mr_optim_new(&c, N, &o));
    float p[N], g[N], p_before[N], m_before[N], v_before[N];
    th_fill_uniform_f32(p, N, -1, 1, 4);
    for (int step = 0; step < 6; step++) {
        th_fill_uniform_f32(g, N, -1, 1, 10 + (uint64_t)step);
        for (int i = 0; i < N; i++) g[i] *= (float)s.scale; /* as if the loss had been scaled */
        if (step == 2) g[5] = INFINITY;
        memcpy(p_before, p, sizeof p);
        memcpy(m_before, mr_optim_slot(o, 0), sizeof m_before);
        memcpy(v_before, mr_optim_slot(o, 1), sizeof v_before);
        double scale = s.scale;
        int finite = mr_grads_finite(g, N);
        if (mr_loss_scaler_update(&s, finite)) {
            mr_grads_unscale(g, N, scale);
            MR_ASSERT_OK(mr_optim_step(o, p, g, 1e-2));
        }
        if (step == 2) {
            assert_false(finite);
            assert_memory_equal(p, p_before, sizeof p);
            assert_memory_equal(mr_optim_slot(o, 0), m_before, sizeof m_before);
            assert_memory_equal(mr_optim_slot(o, 1), v_before, sizeof v_before);
            assert_float_equal(s.scale, 16384.0, 0);
        }
    }
    assert_int_equal(s.skipped, 1);
    assert_int_equal(mr_optim_steps(o), 5);
    assert_float_equal(s.scale, 32768.0, 0); /* three finite steps after the skip: x2 */
    mr_loss_scaler f = mr_loss_scaler_default();
    for (int i = 0; i < 40; i++) mr_loss_scaler_update(&f, 0);
    assert_float_equal(f.scale, 1.0, 0);
    mr_optim_free(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_optimizers), cmocka_unit_test(test_schedules),
                                       cmocka_unit_test(test_clip), cmocka_unit_test(test_loss_scaler)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
