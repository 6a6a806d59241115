/* autodiff/steps: one compilation per (batch size, mode), counted; training steps write every
 * gradient into the registry's contiguous gradient buffer, and those gradients equal the ones of a
 * graph built and differentiated by hand; evaluation steps compute the same loss. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "autodiff/steps.h"
#include "models/models.h"

static void bind_batch(mr_step *st, float *x, int32_t *y) {
    MR_ASSERT_OK(mr_plan_bind(st->plan, st->io.x, x));
    MR_ASSERT_OK(mr_plan_bind(st->plan, st->io.y, y));
}

static void test_steps_cache(void **state) {
    (void)state;
    mr_model_cfg cfg = mr_model_cfg_default(MR_MODEL_MLP);
    cfg.sizes[0] = 12;
    cfg.sizes[1] = 16;
    cfg.sizes[2] = 5;
    cfg.n_sizes = 3;
    mr_params *ps = NULL;
    mr_steps *s = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    MR_ASSERT_OK(mr_steps_new(mr_model_step_build, &cfg, ps, MR_DEVICE_CPU, &s));
    assert_int_equal(mr_steps_compilations(s), 0);
    mr_step *t8 = NULL, *again = NULL, *t3 = NULL, *e8 = NULL;
    MR_ASSERT_OK(mr_steps_get(s, 8, 1, &t8));
    assert_int_equal(mr_steps_compilations(s), 1);
    assert_true(mr_params_allocated(ps));
    MR_ASSERT_OK(mr_params_init(ps, 11));
    MR_ASSERT_OK(mr_steps_get(s, 8, 1, &again));
    assert_ptr_equal(again, t8);
    assert_int_equal(mr_steps_compilations(s), 1); /* same shape: no retrace */
    MR_ASSERT_OK(mr_steps_get(s, 3, 1, &t3));
    assert_int_equal(mr_steps_compilations(s), 2); /* a new batch size is a new plan */
    MR_ASSERT_OK(mr_steps_get(s, 8, 0, &e8));
    assert_int_equal(mr_steps_compilations(s), 3); /* evaluation is another */

    float *x = th_alloc(8 * 12 * sizeof(float));
    int32_t *y = th_alloc(8 * sizeof(int32_t));
    th_fill_uniform_f32(x, 8 * 12, -1, 1, 3);
    th_fill_int32(y, 8, 0, 5, 4);
    bind_batch(t8, x, y);
    memset(mr_params_grad_buffer(ps), 0xff, (size_t)mr_params_buffer_numel(ps) * sizeof(float)); /* NaN garbage */
    MR_ASSERT_OK(mr_plan_run(t8->plan));
    float loss = *(const float *)mr_plan_data(t8->plan, t8->io.loss);
    bind_batch(e8, x, y);
    MR_ASSERT_OK(mr_plan_run(e8->plan));
    assert_float_equal(*(const float *)mr_plan_data(e8->plan, e8->io.loss), loss, 0.0f);

    /* the same gradients from a graph built and differentiated by hand */
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    nn.g = g;
    nn.ps = ps;
    nn.dtype = MR_F32;
    mr_model_io io;
    MR_ASSERT_OK(mr_model_build(&nn, &cfg, 8, &io));
    int32_t np = mr_graph_num_params(g);
    mr_val pv[8], gv[8], keep[9];
    for (int32_t i = 0; i < np; i++) pv[i] = mr_graph_param_at(g, i);
    MR_ASSERT_OK(mr_graph_grad(g, io.loss, pv, np, gv));
    keep[0] = io.loss;
    for (int32_t i = 0; i < np; i++) keep[i + 1] = gv[i];
    mr_plan *p = NULL;
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, keep, np + 1, &p));
    for (int32_t i = 0; i < np; i++)
        MR_ASSERT_OK(mr_plan_bind(p, pv[i], mr_params_data(ps, mr_params_find(ps, mr_graph_name(g, pv[i])))));
    MR_ASSERT_OK(mr_plan_bind(p, io.x, x));
    MR_ASSERT_OK(mr_plan_bind(p, io.y, y));
    MR_ASSERT_OK(mr_plan_run(p));
    assert_float_equal(*(const float *)mr_plan_data(p, io.loss), loss, 0.0f);
    for (int32_t i = 0; i < np; i++) {
        int32_t k = mr_params_find(ps, mr_graph_name(g, pv[i]));
        assert_memory_equal(mr_plan_data(p, gv[i]), mr_params_grad(ps, k), (size_t)mr_params_numel(ps, k) * sizeof(float));
    }
    fprintf(stderr, "steps: loss %.5f, %d compilations\n", loss, mr_steps_compilations(s));
    mr_plan_free(p);
    mr_graph_free(g);
    mr_steps_free(s);
    mr_params_free(ps);
    th_free_all();
}

/* logits = (x + p1) + p2: both parameters' gradients are the same value (dy, aliased through the
 * residual adds), which must still land in both registry slots. */
static mr_status build_shared(const void *ctx, mr_nn *nn, int64_t batch, mr_step_io *io) {
    (void)ctx;
    io->x = mr_graph_input(nn->g, "x", MR_F32, mr_shape_2d(batch, 4));
    io->y = mr_graph_input(nn->g, "y", MR_I32, mr_shape_1d(batch));
    mr_val p1 = mr_nn_param(nn, "p1", mr_shape_2d(batch, 4), MR_INIT_UNIFORM, 1.0);
    mr_val p2 = mr_nn_param(nn, "p2", mr_shape_2d(batch, 4), MR_INIT_UNIFORM, 1.0);
    io->out = mr_graph_add(nn->g, mr_graph_add(nn->g, io->x, p1), p2);
    io->loss = mr_nn_xent_mean(nn, io->out, io->y);
    return mr_graph_status(nn->g);
}

static void test_steps_shared_gradient(void **state) {
    (void)state;
    mr_params *ps = NULL;
    mr_steps *s = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    MR_ASSERT_OK(mr_steps_new(build_shared, NULL, ps, MR_DEVICE_CPU, &s));
    mr_step *st = NULL;
    MR_ASSERT_OK(mr_steps_get(s, 3, 1, &st));
    MR_ASSERT_OK(mr_params_init(ps, 5));
    float x[12];
    int32_t y[3] = {0, 3, 1};
    th_fill_uniform_f32(x, 12, -1, 1, 6);
    bind_batch(st, x, y);
    MR_ASSERT_OK(mr_plan_run(st->plan));
    const float *g1 = mr_params_grad(ps, mr_params_find(ps, "p1")), *g2 = mr_params_grad(ps, mr_params_find(ps, "p2"));
    assert_memory_equal(g1, g2, 12 * sizeof(float));
    float norm = 0;
    for (int i = 0; i < 12; i++) norm += g1[i] * g1[i];
    assert_true(norm > 0);
    mr_steps_free(s);
    mr_params_free(ps);
}

static void test_steps_errors(void **state) {
    (void)state;
    mr_model_cfg cfg = mr_model_cfg_default(MR_MODEL_GPT);
    cfg.heads = 3; /* 128 is not divisible by 3 */
    mr_params *ps = NULL;
    mr_steps *s = NULL;
    MR_ASSERT_OK(mr_params_new(&ps));
    assert_int_equal(mr_steps_new(NULL, &cfg, ps, MR_DEVICE_CPU, &s), MR_ERR_INVALID);
    MR_ASSERT_OK(mr_steps_new(mr_model_step_build, &cfg, ps, MR_DEVICE_CPU, &s));
    mr_step *st = NULL;
    assert_int_equal(mr_steps_get(s, 4, 1, &st), MR_ERR_INVALID);
    assert_null(st);
    assert_non_null(strstr(mr_last_error(), "model.heads"));
    assert_int_equal(mr_steps_compilations(s), 0);
    mr_steps_free(s);
    mr_steps_free(NULL);
    mr_params_free(ps);
}

/* mr_plan_ready_after: after the kernels it names, each parameter's gradient already holds its
 * final value (what an overlapped bucket all-reduce relies on), for the three models; and the
 * gradients of the last layers are ready well before the backward ends. */
static void test_steps_gradient_ready(void **state) {
    (void)state;
    for (int m = 0; m < 3; m++) {
        mr_model_cfg cfg = mr_model_cfg_default((mr_model_type)m);
        int64_t batch = 4, nx = 0, ny = batch;
        if (m == MR_MODEL_MLP) {
            cfg.sizes[0] = 20;
            cfg.sizes[1] = 16;
            cfg.sizes[2] = 8;
            cfg.sizes[3] = 5;
            cfg.n_sizes = 4;
            nx = batch * 20;
        } else if (m == MR_MODEL_CNN) {
            cfg.in_channels = 1;
            cfg.height = cfg.width = 8;
            cfg.ch1 = 4;
            cfg.ch2 = 6;
            cfg.hidden = 10;
            nx = batch * 64;
        } else {
            cfg.vocab = 11;
            cfg.context = 6;
            cfg.layers = 2;
            cfg.heads = 2;
            cfg.embd = 8;
            nx = ny = batch * 6;
        }
        mr_params *ps = NULL;
        mr_steps *s = NULL;
        mr_step *st = NULL;
        MR_ASSERT_OK(mr_params_new(&ps));
        MR_ASSERT_OK(mr_steps_new(mr_model_step_build, &cfg, ps, MR_DEVICE_CPU, &s));
        MR_ASSERT_OK(mr_steps_get(s, batch, 1, &st));
        MR_ASSERT_OK(mr_params_init(ps, 5));
        float *x = th_alloc(sizeof(float) * (size_t)nx);
        int32_t *y = th_alloc(sizeof(int32_t) * (size_t)ny);
        if (m == MR_MODEL_GPT) {
            th_fill_int32((int32_t *)x, nx, 0, 11, 1);
        } else {
            th_fill_uniform_f32(x, nx, 0.0f, 1.0f, 1);
        }
        th_fill_int32(y, ny, 0, m == MR_MODEL_GPT ? 11 : (int32_t)(m == MR_MODEL_MLP ? 5 : cfg.classes), 2);
        bind_batch(st, x, y);
        MR_ASSERT_OK(mr_plan_run(st->plan));
        const int64_t n = mr_params_buffer_numel(ps);
        float *full = th_alloc(sizeof(float) * (size_t)n), *g = mr_params_grad_buffer(ps);
        memcpy(full, g, sizeof(float) * (size_t)n);
        const int32_t total = mr_plan_num_kernels(st->plan);
        int32_t earliest = total;
        for (int32_t i = 0; i < mr_params_count(ps); i++) {
            int64_t off = mr_params_offset(ps, i), k = mr_params_numel(ps, i);
            int32_t ready = mr_plan_ready_after(st->plan, g + off, sizeof(float) * (size_t)k);
            assert_true(ready > st->n_forward && ready <= total);
            for (int64_t j = 0; j < n; j++) g[j] = NAN;
            MR_ASSERT_OK(mr_plan_run_range(st->plan, 0, ready));
            if (memcmp(g + off, full + off, sizeof(float) * (size_t)k) != 0)
                fail_msg("model %d: %s's gradient is not final after kernel %d of %d", m, mr_params_name(ps, i), ready, total);
            if (ready < earliest) earliest = ready;
        }
        fprintf(stderr, "model %d: the first gradient is final after %d of %d kernels (forward %d)\n", m, earliest, total,
                st->n_forward);
        assert_true(earliest < total); /* something to overlap with */
        mr_steps_free(s);
        mr_params_free(ps);
        th_free_all();
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_steps_cache), cmocka_unit_test(test_steps_shared_gradient),
                                       cmocka_unit_test(test_steps_errors), cmocka_unit_test(test_steps_gradient_ready)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
