/* Training on the GPU through the trainer's device path: short runs of the MLP and the CNN on
 * Fashion-MNIST, of a layer graph with batch norm (its running statistics in device memory too)
 * and of a tiny character GPT (with and without dropout; in mixed_bfloat16 through the fused
 * attention op) on cuda:0, each step's loss against the same run on the CPU host path (f32: close;
 * bf16 and f16 with loss scaling: looser, the GEMMs round differently); two GPU runs bit-identical
 * (deterministic kernels, NCCL aside); a stop and resume bit-identical to a straight GPU run; no
 * driver allocation in steady-state steps (the caching allocator and the planned arena); and, with
 * 2 GPUs, 2 replicas (a thread each, NCCL between them) against 1 GPU with the whole batch. Exits
 * 77 without a GPU. */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_util.h"
#include "checkpoint/ckpt.h"
#include "launch/config.h"
#include "train/train.h"
#ifdef MIRROR_EMU
#include "tests/emu/emu_api.h"
#endif

#define MAX_STEPS 64

/* On the CUDA emulator (tests/emu/) kernels run on the CPU thread by thread and the library fakes
 * compute in f64 loops: the same paths with shorter runs (S) and without the final evaluation
 * over the whole test set (LIGHT), except where a test checks the evaluation itself. */
#ifdef MIRROR_EMU
#define S(n) ((n) / 4 > 6 ? (n) / 4 : 6)
#define LIGHT(c) ((c).eval_images = (c).eval_labels = NULL)
#else
#define S(n) (n)
#define LIGHT(c) ((void)0)
#endif

typedef struct trace {
    double loss[MAX_STEPS + 1];
    int64_t stop_at;
    int64_t raw_allocs_at[MAX_STEPS + 1];
    float *params;
    int64_t n;
} trace;

static void on_step(void *ctx, const mr_train_state *ts) {
    trace *t = ctx;
    assert_true(ts->step <= MAX_STEPS);
    t->loss[ts->step] = ts->loss;
    mr_memory_stats m;
    mr_device d = {MR_DEVICE_CUDA, 0};
    if (mr_device_memory_stats(d, &m) == MR_OK) t->raw_allocs_at[ts->step] = m.raw_allocs;
    t->n = mr_params_buffer_numel(ts->params);
    if (!t->params) t->params = th_alloc((size_t)t->n * sizeof(float));
    memcpy(t->params, mr_params_buffer(ts->params), (size_t)t->n * sizeof(float));
    if (ts->step == t->stop_at) mr_train_request_stop(SIGTERM);
}

static void run(mr_train_cfg c, int gpu, trace *t, mr_train_result *r) {
    int64_t stop_at = t->stop_at;
    memset(t, 0, sizeof *t);
    t->stop_at = stop_at;
    c.device_kind = gpu ? MR_DEVICE_CUDA : MR_DEVICE_CPU;
    c.gpus[0] = 0;
    c.on_step = on_step;
    c.on_step_ctx = t;
    MR_ASSERT_OK(mr_train(&c, r));
}

/* Every step's loss on the GPU within tol of the CPU's. */
static void against_cpu(const char *what, mr_train_cfg c, double tol) {
    trace g = {0}, h = {0};
    mr_train_result rg, rh;
    run(c, 1, &g, &rg);
    run(c, 0, &h, &rh);
    double worst = 0;
    for (int64_t s = 1; s <= c.steps; s++) {
        double d = fabs(g.loss[s] - h.loss[s]);
        if (d > worst) worst = d;
        if (!(d <= tol)) fail_msg("%s: step %lld: GPU loss %.6f, CPU %.6f (|diff| %.3g > %.3g)", what, (long long)s,
                                  g.loss[s], h.loss[s], d, tol);
    }
    fprintf(stderr, "%s: %lld steps, GPU loss %.5f vs CPU %.5f (worst step |diff| %.2e); eval acc %.4f vs %.4f\n", what,
            (long long)c.steps, g.loss[c.steps], h.loss[c.steps], worst, rg.eval_accuracy, rh.eval_accuracy);
    if (!isnan(rh.eval_accuracy)) assert_true(fabs(rg.eval_accuracy - rh.eval_accuracy) < 0.02);
    th_free_all();
}

static mr_train_cfg mlp(int64_t steps) {
    mr_train_cfg c;
    th_fashion_mlp(&c, 128, steps, 64);
    c.eval_every = 0;
    LIGHT(c);
    return c;
}

static mr_train_cfg cnn(int64_t steps) {
    mr_train_cfg c = mlp(steps);
    c.model = mr_model_cfg_default(MR_MODEL_CNN);
    c.batch = 32;
    return c;
}

static mr_train_cfg tiny_gpt(int64_t steps, double dropout) {
    mr_train_cfg c = mlp(steps);
    th_tiny_gpt(&c, 32, 64, dropout);
    c.sample_chars = 32; /* generation runs on the GPU too */
    return c;
}

static void test_mlp_f32(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = mlp(S(60));
    th_fashion_mlp(&c, 128, S(60), 64); /* with the evaluation data: its accuracy is compared */
    c.eval_every = c.steps;
    against_cpu("mlp f32", c, 2e-3);
}

static void test_mlp_mixed(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = mlp(S(40));
    c.compute = MR_BF16;
    against_cpu("mlp mixed_bfloat16", c, 3e-2);
    c.compute = MR_F16;
    c.accumulate = 2;
    c.grad_clip = 1.0;
    against_cpu("mlp mixed_float16, accumulate 2, clip 1", c, 2e-2);
}

static void test_cnn(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    against_cpu("cnn f32", cnn(S(20)), 5e-3);
}

static void test_gpt(void **state) {
    (void)state;
    against_cpu("gpt f32", tiny_gpt(S(20), 0.0), 5e-3);
    against_cpu("gpt f32 with dropout (no CUDA graph)", tiny_gpt(S(20), 0.1), 5e-3);
    mr_train_cfg c = tiny_gpt(S(20), 0.0);
    c.compute = MR_BF16; /* head dim 32: the fused attention op, through cuDNN (core/cuda/attention_cudnn.cu) */
    against_cpu("gpt mixed_bfloat16 (fused attention)", c, 3e-2);
}

/* The tiny GPT in mixed_bfloat16 with its attention through cuDNN's flash attention
 * (core/cuda/attention_cudnn.cu) and through mirror's kernels (MIRROR_CUDNN_SDPA=0): every step's
 * loss close, the counters say the first run's backward went through cuDNN only and the
 * second run's through the kernels only, and no step after the third reaches the driver's
 * allocator with the cuDNN path. */
static void test_gpt_cudnn_attention(void **state) {
    (void)state;
    mr_train_cfg c = tiny_gpt(S(12), 0.0);
    c.compute = MR_BF16;
    trace on = {0}, off = {0};
    mr_train_result r1, r2;
    mr_attention_paths p0, p1, p2;
    mr_attention_paths_get(&p0);
    run(c, 1, &on, &r1);
    mr_attention_paths_get(&p1);
    setenv("MIRROR_CUDNN_SDPA", "0", 1);
    run(c, 1, &off, &r2);
    unsetenv("MIRROR_CUDNN_SDPA");
    mr_attention_paths_get(&p2);
    fprintf(stderr, "gpt bf16 attention calls: cuDNN run %lld fwd %lld bwd (kernels %lld bwd); kernel run %lld fwd %lld bwd\n",
            (long long)(p1.cudnn_fwd - p0.cudnn_fwd), (long long)(p1.cudnn_bwd - p0.cudnn_bwd),
            (long long)(p1.kernel_bwd - p0.kernel_bwd), (long long)(p2.kernel_fwd - p1.kernel_fwd),
            (long long)(p2.kernel_bwd - p1.kernel_bwd));
    assert_true(p1.cudnn_fwd > p0.cudnn_fwd && p1.cudnn_bwd > p0.cudnn_bwd && p1.kernel_bwd == p0.kernel_bwd);
    assert_true(p2.cudnn_fwd == p1.cudnn_fwd && p2.cudnn_bwd == p1.cudnn_bwd && p2.kernel_bwd > p1.kernel_bwd);
    double worst = 0;
    for (int64_t s = 1; s <= c.steps; s++) {
        double d = fabs(on.loss[s] - off.loss[s]);
        worst = d > worst ? d : worst;
        if (!(d <= 3e-2)) fail_msg("step %lld: loss %.6f with cuDNN attention, %.6f with the kernels", (long long)s,
                                   on.loss[s], off.loss[s]);
    }
    fprintf(stderr, "gpt bf16: %lld steps, loss %.5f (cuDNN attention) vs %.5f (kernels), worst step |diff| %.2e; "
                    "raw device allocations with cuDNN: %lld after step 3, %lld after step %lld\n",
            (long long)c.steps, on.loss[c.steps], off.loss[c.steps], worst, (long long)on.raw_allocs_at[3],
            (long long)on.raw_allocs_at[c.steps], (long long)c.steps);
    /* the plans (and any workspace of their own) are made in the first step: none after */
    assert_int_equal(on.raw_allocs_at[3], on.raw_allocs_at[c.steps]);
    th_free_all();
}

/* A layer graph with batch norm (conv, batchnorm2d, a residual block, global average pooling) on
 * the device path: every step's loss against the CPU host path, and the running statistics the
 * GPU steps updated in device memory, copied out into the checkpoint, against the CPU's. The
 * convolutions before the batch norms have no bias: a batch norm cancels it, so its gradient is
 * rounding noise, which Adam turns into full-size steps that differ between the two paths (the
 * losses agree, the running means would not). */
static void test_batchnorm_graph(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_experiment e;
    const char *yaml =
        "model:\n  type: graph\n  input: [1, 28, 28]\n  layers:\n"
        "    - conv2d: {out: 8, kernel: 3, stride: 2, pad: 1, bias: false}\n    - batchnorm2d\n    - relu\n"
        "    - residual:\n        body: [{conv2d: {out: 8, kernel: 3, pad: 1, bias: false}}, batchnorm2d]\n    - relu\n"
        "    - global_avgpool\n    - flatten\n    - linear: {out: 10}\n"
        "data: {train: {source: idx, images: x, labels: y}}\n";
    mr_experiment_defer_file_checks(1);
    if (mr_experiment_parse(yaml, "bn.yaml", &e) != MR_OK) fail_msg("%s", mr_last_error());
    mr_experiment_defer_file_checks(0);
    mr_train_cfg c = mlp(S(24));
    c.model = e.model;
    c.batch = 16;
    char dir[2][512];
    trace g = {0}, h = {0};
    mr_train_result rg, rh;
    for (int k = 0; k < 2; k++) {
        snprintf(dir[k], sizeof dir[k], "%s", th_tmp_path(k ? "bn-cpu" : "bn-gpu"));
        c.ckpt_dir = dir[k];
        c.resume = "never";
        run(c, !k, k ? &h : &g, k ? &rh : &rg);
    }
    for (int64_t s = 1; s <= c.steps; s++)
        if (!(fabs(g.loss[s] - h.loss[s]) <= 5e-3))
            fail_msg("batch norm graph: step %lld: GPU loss %.6f, CPU %.6f", (long long)s, g.loss[s], h.loss[s]);
    char pa[4096], pb[4096];
    mr_ckpt_path(dir[0], c.steps, pa, sizeof pa);
    mr_ckpt_path(dir[1], c.steps, pb, sizeof pb);
    mr_ckpt_reader *ra = NULL, *rb = NULL;
    MR_ASSERT_OK(mr_ckpt_open(pa, 0, &ra));
    MR_ASSERT_OK(mr_ckpt_open(pb, 0, &rb));
    char **names = NULL;
    int n = 0;
    double worst = 0;
    MR_ASSERT_OK(mr_ckpt_list(ra, "buffers", &names, &n));
    assert_int_equal(n, 6); /* 2 batch norms x running_mean, running_var, num_batches_tracked */
    for (int i = 0; i < n; i++) {
        char p[512];
        mr_dtype dt;
        mr_shape sh;
        float x[64], y[64];
        snprintf(p, sizeof p, "buffers/%s", names[i]);
        MR_ASSERT_OK(mr_ckpt_info(ra, p, &dt, &sh));
        assert_true(mr_shape_numel(&sh) <= 64);
        MR_ASSERT_OK(mr_ckpt_read(ra, p, MR_F32, &sh, x));
        MR_ASSERT_OK(mr_ckpt_read(rb, p, MR_F32, &sh, y));
        for (int64_t j = 0; j < mr_shape_numel(&sh); j++) {
            const double d = fabs((double)x[j] - y[j]) / (fabs(y[j]) + 1e-2);
            if (d > 1e-3) fprintf(stderr, "  %s[%lld]: GPU %.7g, CPU %.7g\n", names[i], (long long)j, x[j], y[j]);
            worst = fmax(worst, d);
        }
        if (strstr(names[i], "num_batches_tracked")) assert_true(x[0] == (float)c.steps && y[0] == (float)c.steps);
    }
    mr_ckpt_names_free(names, n);
    mr_ckpt_close(ra);
    mr_ckpt_close(rb);
    fprintf(stderr, "batch norm graph: %lld steps, GPU loss %.5f vs CPU %.5f; running statistics max rel diff %.2e\n",
            (long long)c.steps, g.loss[c.steps], h.loss[c.steps], worst);
    assert_true(worst < 1e-3);
    mr_experiment_deinit(&e);
    th_free_all();
}

/* Deterministic: two GPU runs give the same bits, and a run stopped at step 9 and resumed gives
 * the straight run's bits. */
static void test_deterministic_and_resume(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = mlp(S(24) < 12 ? 12 : S(24));
    c.compute = MR_F16;
    trace a = {0}, b = {0}, s1 = {.stop_at = 9}, s2 = {0};
    mr_train_result ra, rb, r1, r2;
    run(c, 1, &a, &ra);
    run(c, 1, &b, &rb);
    for (int64_t s = 1; s <= c.steps; s++)
        if (a.loss[s] != b.loss[s]) fail_msg("two GPU runs differ at step %lld: %.9g vs %.9g", (long long)s, a.loss[s], b.loss[s]);
    assert_memory_equal(a.params, b.params, (size_t)a.n * sizeof(float));
    c.ckpt_dir = th_tmp_path("gpu-resume");
    c.resume = "auto";
    run(c, 1, &s1, &r1);
    assert_int_equal(r1.steps, 9);
    run(c, 1, &s2, &r2);
    assert_int_equal(r2.resumed_from, 9);
    for (int64_t s = 10; s <= c.steps; s++)
        if (a.loss[s] != s2.loss[s]) fail_msg("resumed GPU run differs at step %lld: %.9g vs %.9g", (long long)s, a.loss[s], s2.loss[s]);
    assert_memory_equal(a.params, s2.params, (size_t)a.n * sizeof(float));
    th_free_all();
}

/* After the first steps (compilation, lazy library state, the graph capture) no step reaches the
 * driver's allocator. */
static void test_steady_state_no_alloc(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = mlp(S(30) < 12 ? 12 : S(30));
    trace t = {0};
    mr_train_result r;
    run(c, 1, &t, &r);
    int64_t last = c.steps;
    fprintf(stderr, "raw device allocations: %lld after step 5, %lld after step %lld\n", (long long)t.raw_allocs_at[5],
            (long long)t.raw_allocs_at[last], (long long)last);
    assert_int_equal(t.raw_allocs_at[5], t.raw_allocs_at[last]);
#ifdef MIRROR_EMU
    /* the emulator counts every cudaMalloc, the caching allocator's included, and every host wait */
    mr_emu_stats a, b;
    mr_train_cfg d = c;
    trace u = {0};
    u.stop_at = -1;
    mr_emu_get_stats(&a);
    run(d, 1, &u, &r);
    mr_emu_get_stats(&b);
    fprintf(stderr, "emulator: a %lld-step run: %llu cudaMalloc, %llu host syncs, %llu launches, %llu graph launches\n",
            (long long)d.steps, (unsigned long long)(b.raw_allocs - a.raw_allocs),
            (unsigned long long)(b.host_syncs - a.host_syncs), (unsigned long long)(b.launches - a.launches),
            (unsigned long long)(b.graph_launches - a.graph_launches));
    assert_true(b.graph_launches - a.graph_launches > 0); /* the steady steps replay a CUDA graph */
#endif
    th_free_all();
}

/* ---- a step without host synchronisation (train/train_step.c, the device path's decisions) ---- */

#define MAX_LOGS 8

/* What on_log saw: the counters before each log step's read-back and after its work; at the end
 * the final state. */
typedef struct logs {
    int n;
    int64_t step[MAX_LOGS];
#ifdef MIRROR_EMU
    mr_emu_stats before[MAX_LOGS], after[MAX_LOGS];
#endif
    float *params, *slot;
    int64_t n_params, opt_steps, skipped;
    double scale, loss;
} logs;

static void on_log(void *ctx, const mr_train_state *ts, int done) {
    logs *L = ctx;
    if (!done) {
        assert_true(L->n < MAX_LOGS);
        L->step[L->n++] = ts->step;
    }
    const int i = L->n - 1;
    assert_true(i >= 0 && L->step[i] == ts->step);
#ifdef MIRROR_EMU
    mr_emu_get_stats(done ? &L->after[i] : &L->before[i]);
#endif
    if (!done) return;
    L->n_params = mr_params_buffer_numel(ts->params);
    if (!L->params) L->params = th_alloc((size_t)L->n_params * sizeof(float));
    memcpy(L->params, mr_params_buffer(ts->params), (size_t)L->n_params * sizeof(float));
    if (mr_optim_num_slots(ts->optim) > 0) {
        if (!L->slot) L->slot = th_alloc((size_t)L->n_params * sizeof(float));
        memcpy(L->slot, mr_optim_slot(ts->optim, mr_optim_num_slots(ts->optim) - 1), (size_t)L->n_params * sizeof(float));
    }
    L->opt_steps = mr_optim_steps(ts->optim);
    L->skipped = ts->scaler ? ts->scaler->skipped : 0;
    L->scale = ts->scaler ? ts->scaler->scale : 1.0;
    L->loss = ts->loss;
}

/* Between two log steps after the first (warm-up, graph capture), no host wait (but the
 * exchange's: at most syncs_per_step, counted over every replica, with several replicas) and no
 * driver allocation, while work was queued (the emulator's counters; on a GPU: nothing to count). */
static void expect_no_sync(const char *what, const logs *L, uint64_t syncs_per_step) {
#ifdef MIRROR_EMU
    assert_true(L->n >= 3);
    for (int i = 1; i + 1 < L->n; i++) {
        const mr_emu_stats *a = &L->after[i], *b = &L->before[i + 1];
        fprintf(stderr,
                "%s: steps %lld..%lld: %llu host syncs (the log step before: %llu), %llu cudaMalloc, %llu launches, "
                "%llu graph launches\n",
                what, (long long)L->step[i] + 1, (long long)L->step[i + 1],
                (unsigned long long)(b->host_syncs - a->host_syncs),
                (unsigned long long)(a->host_syncs - L->before[i].host_syncs), (unsigned long long)(b->raw_allocs - a->raw_allocs),
                (unsigned long long)(b->launches - a->launches),
                (unsigned long long)(b->graph_launches - a->graph_launches));
        /* one replica: exactly none; several: at most the exchange's waits, and the other
         * replicas' threads may still be doing their own log step's reads (no more than replica
         * 0's log step took, which its pull for on_log makes larger) when replica 0 counts */
        const uint64_t bound = syncs_per_step * (uint64_t)(L->step[i + 1] - L->step[i]);
        if (syncs_per_step == 0) assert_int_equal(b->host_syncs - a->host_syncs, 0);
        else assert_true(b->host_syncs - a->host_syncs <= bound + (a->host_syncs - L->before[i].host_syncs));
        assert_int_equal(b->raw_allocs - a->raw_allocs, 0);
        assert_true(b->launches - a->launches > 0);
    }
#else
    (void)what, (void)L, (void)syncs_per_step;
#endif
}

/* One GPU run reporting at log steps only (lg), and the same run reading its state back every
 * step (on_step, each step synchronised): the same bits, so deferring the reads changes nothing. */
static void steady_and_stepwise(const char *what, mr_train_cfg c, logs *lg, uint64_t syncs_per_step) {
    logs ls = {0};
    trace t = {0};
    mr_train_result r1, r2;
    c.device_kind = MR_DEVICE_CUDA;
    c.gpus[0] = 0, c.gpus[1] = 1;
    c.on_log = on_log;
    c.on_log_ctx = lg;
    MR_ASSERT_OK(mr_train(&c, &r1));
    expect_no_sync(what, lg, syncs_per_step);
    c.on_log_ctx = &ls;
    c.on_step = on_step;
    c.on_step_ctx = &t;
    MR_ASSERT_OK(mr_train(&c, &r2));
    assert_int_equal(lg->n, ls.n);
    assert_memory_equal(lg->params, ls.params, (size_t)lg->n_params * sizeof(float));
    if (lg->slot) assert_memory_equal(lg->slot, ls.slot, (size_t)lg->n_params * sizeof(float));
    assert_int_equal(lg->opt_steps, ls.opt_steps);
    assert_int_equal(lg->skipped, ls.skipped);
    assert_true(lg->scale == ls.scale && lg->loss == ls.loss && lg->loss == t.loss[c.steps]);
    assert_true(r1.last_loss == r2.last_loss && r1.skipped_steps == r2.skipped_steps && r1.loss_scale == r2.loss_scale);
    fprintf(stderr, "%s: %lld steps, %lld updates, %lld skipped, scale %g, last interval's loss %.6f\n", what,
            (long long)c.steps, (long long)lg->opt_steps, (long long)lg->skipped, lg->scale, r1.last_loss);
}

static void test_steady_no_sync(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = mlp(12);
    c.log_every = 4;
    c.quiet = 1;
    logs a = {0}, b = {0}, d = {0}, e = {0};
    steady_and_stepwise("f32 adamw", c, &a, 0);
    assert_int_equal(a.opt_steps, 12);
    c.compute = MR_BF16;
    c.grad_clip = 0.05; /* clips most steps */
    steady_and_stepwise("mixed_bfloat16, clip 0.05", c, &b, 0);
    c.compute = MR_F16;
    c.accumulate = 2;
    c.loss_scaler = mr_loss_scaler_default();
    c.loss_scaler.growth_interval = 3; /* grows inside the steady intervals */
    steady_and_stepwise("mixed_float16 scaling, accumulate 2, clip 0.05", c, &d, 0);
    /* 12 finite steps: 4 growths (on the emulator; a real GPU's f16 may overflow at 2^19 and skip) */
    assert_true(d.scale == 32768.0 * 16 || (d.skipped > 0 && d.opt_steps + d.skipped == 12));
    c.grad_clip = 0;
    c.optim = mr_optim_cfg_default(MR_OPTIM_SGD);
    c.optim.momentum = 0.9;
    c.optim.lr = 0.05;
    steady_and_stepwise("mixed_float16 scaling, SGD momentum", c, &e, 0);
    th_free_all();
}

/* Two replicas (a thread and an emulated GPU each, NCCL between them): the decisions on the
 * device agree (the losses summed by NCCL; the averaged gradients are the same on both), the
 * results as above. The gradient buckets and the loss's all-reduce go on NCCL's stream behind
 * events (distribute/ddp.c, train_step.c ctl_allreduce): no host wait of their own. The emulator's
 * counters are process-wide, so the other replica's own log-step reads (its thread may still be
 * at them while replica 0 counts) and its copy-stream guard land in the window: the bound stays
 * 2 a replica and step (measured 3 in all over 4 steps of 2 replicas, 15-20 before the exchange
 * moved onto the stream). */
static void test_steady_two_gpus(void **state) {
    (void)state;
    if (!th_have_fashion_mnist() || mr_cuda_device_count() < 2) skip();
    mr_train_cfg c = mlp(12);
    c.log_every = 4;
    c.quiet = 1;
    c.replicas = 2;
    c.compute = MR_F16;
    c.grad_clip = 0.05;
    c.loss_scaler = mr_loss_scaler_default();
    c.loss_scaler.growth_interval = 3;
    logs a = {0};
    steady_and_stepwise("2 GPUs, mixed_float16 scaling, clip 0.05", c, &a, 2 * 2);
    assert_true((a.scale == 32768.0 * 16 && a.opt_steps == 12) || (a.skipped > 0 && a.opt_steps + a.skipped == 12));
    th_free_all();
}


/* The log's lines containing " skipped: ", from "step" on, one after another. */
static void skip_lines(const char *log, char *out, size_t cap) {
    out[0] = '\0';
    for (const char *p = strstr(log, " skipped: "); p; p = strstr(p + 1, " skipped: ")) {
        const char *a = p;
        while (a > log && a[-1] != '\n') a--;
        const char *b = strchr(p, '\n');
        const char *s = strstr(a, "step ");
        if (!s || s > p) continue;
        snprintf(out + strlen(out), cap - strlen(out), "%.*s\n", (int)((b ? b : p + strlen(p)) - s), s);
    }
}

/* An overflow injected on the GPU at a step between two log steps: the same skip lines (step
 * numbers, parameter names, the scale's change), skipped count and scale as the CPU host path,
 * written when the host next reads (the log step); at the loss scale's floor, and without loss
 * scaling, the host path's errors naming the step, with no checkpoint of a later step. */
static void test_overflow_deferred(void **state) {
    (void)state;
    if (!th_have_fashion_mnist()) skip();
    mr_train_cfg c = mlp(8);
    c.log_every = 4;
    c.quiet = 0;
    c.no_progress = 1;
    c.compute = MR_F16;
    c.loss_scaler = mr_loss_scaler_default();
    c.loss_scaler.scale = 1024; /* no genuine overflow */
    c.inject_nonfinite_at = 6;
    c.inject_nonfinite_param = "fc1.weight,fc2.weight";
    c.grad_clip = 0.5;
    char *log[2], lines[2][1024];
    mr_train_result r[2];
    for (int gpu = 0; gpu < 2; gpu++) {
        c.device_kind = gpu ? MR_DEVICE_CUDA : MR_DEVICE_CPU;
        MR_ASSERT_OK(th_train_logged(&c, &r[gpu], &log[gpu]));
        skip_lines(log[gpu], lines[gpu], sizeof lines[gpu]);
    }
    fprintf(stderr, "GPU skip lines:\n%s", lines[1]);
    assert_string_equal(lines[0], lines[1]);
    assert_non_null(strstr(lines[1], "step 6 skipped: non-finite gradients in fc2.weight (first of 2 in backward "
                                     "order), loss scale 1024 -> 512\n"));
    assert_true(r[1].skipped_steps == 1 && r[1].loss_scale == 512 && r[0].loss_scale == 512);
    assert_true(fabs(r[1].last_loss - r[0].last_loss) < 2e-2);
    /* at the floor: the run stops with the step's error; the checkpoint of step 4 is the last */
    c.loss_scaler.min_scale = 1024;
    c.ckpt_dir = th_tmp_path("gpu-floor");
    c.ckpt_every = 4;
    c.device_kind = MR_DEVICE_CUDA;
    char *flog = NULL;
    assert_int_equal(th_train_logged(&c, &r[1], &flog), MR_ERR_NUMERIC);
    fprintf(stderr, "error: %s\n", mr_last_error());
    assert_non_null(strstr(mr_last_error(), "step 6: non-finite gradients in fc2.weight (first of 2 in backward order), "
                                            "with the loss scale already at its floor (precision.loss_scale.min 1024)"));
    assert_null(strstr(flog, " skipped: "));
    int64_t *steps = NULL;
    int n = 0;
    MR_ASSERT_OK(mr_ckpt_scan(c.ckpt_dir, &steps, &n));
    assert_true(n == 1 && steps[0] == 4);
    free(steps);
    /* without loss scaling (float32): the divergence error names the step and the parameter */
    c.compute = MR_F32;
    c.ckpt_dir = NULL;
    assert_int_equal(th_train_logged(&c, &r[1], &flog), MR_ERR_NUMERIC);
    fprintf(stderr, "error: %s\n", mr_last_error());
    assert_non_null(strstr(mr_last_error(), "step 6: non-finite gradients in fc2.weight (first of 2 in backward order), "
                                            "with a finite loss"));
    th_free_all();
}

static void test_two_gpus(void **state) {
    (void)state;
    if (!th_have_fashion_mnist() || mr_cuda_device_count() < 2) skip();
    mr_train_cfg c = mlp(S(30));
    trace one = {0}, two = {0};
    mr_train_result r1, r2;
    run(c, 1, &one, &r1);
    c.replicas = 2;
    c.gpus[1] = 1;
    run(c, 1, &two, &r2);
    for (int64_t s = 1; s <= c.steps; s++) assert_true(fabs(one.loss[s] - two.loss[s]) < 2e-3);
    th_free_all();
}

int main(void) {
    if (gpu_none()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_f32),     cmocka_unit_test(test_mlp_mixed),
        cmocka_unit_test(test_cnn),         cmocka_unit_test(test_gpt),       cmocka_unit_test(test_gpt_cudnn_attention),
        cmocka_unit_test(test_batchnorm_graph),
        cmocka_unit_test(test_deterministic_and_resume), cmocka_unit_test(test_steady_state_no_alloc),
        cmocka_unit_test(test_two_gpus),   cmocka_unit_test(test_steady_no_sync),
        cmocka_unit_test(test_steady_two_gpus), cmocka_unit_test(test_overflow_deferred),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
