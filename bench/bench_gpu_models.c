/* GPU training-step throughput: the three reference workloads (as bench_models.c sizes them) and
 * a GPT-2-124M-shaped model (vocab 50304, context 1024, 12 layers, 12 heads, width 768, batch 8),
 * each a forward + backward replayed from a CUDA graph plus an AdamW/SGD update, on cuda:0, on
 * a fixed synthetic batch (the input pipeline is not measured).
 *
 * Reports samples/s (tokens/s for the GPTs), ms a step, the training FLOP rate counted as
 * 6 * parameters * tokens + 12 * layers * context * width * tokens (the attention matmuls, as
 * nanoGPT's estimate_mfu does) over the dense peak of the precision (H200 / H100 SXM: 989 TFLOP/s
 * bf16, 494 TFLOP/s TF32; override with MIRROR_PEAK_TFLOPS), the planned activation arena and the
 * device's peak memory in use (mr_device_memory_stats).
 * Usage: bench_gpu_models [--models mlp,cnn,gpt,gpt2] [--steps N] [--bf16 | --f16] [--tf32] [--no-graphs]
 * Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autodiff/steps.h"
#include "core/vec.h"
#include "models/models.h"
#include "optim/optim.h"

static void die(const char *what) {
    fprintf(stderr, "bench_gpu_models: %s: %s\n", what, mr_last_error());
    exit(1);
}

#define CK(call) \
    do {         \
        if ((call) != MR_OK) die(#call); \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static mr_dtype g_compute = MR_F32;
static int g_tf32, g_graphs = 1;

/* Training FLOPs per sample (6N per token for the GPTs plus attention; 3x forward otherwise). */
static double train_flops(const mr_model_cfg *c, int64_t nparams) {
    switch (c->type) {
    case MR_MODEL_MLP: return 3.0 * 2.0 * (784 * 1024 + 1024 * 1024 + 1024 * 10);
    case MR_MODEL_CNN: return 3.0 * 2.0 * (28 * 28 * 32 * 9 * 1 + 14 * 14 * 64 * 9 * 32 + 3136 * 128 + 128 * 10);
    case MR_MODEL_GPT: {
        double T = (double)c->context;
        return T * (6.0 * (double)nparams + 12.0 * (double)c->layers * T * (double)c->embd);
    }
    case MR_MODEL_GRAPH: return 0; /* not counted (the runs here are the reference workloads) */
    }
    return 0;
}

static void run(const char *name, mr_model_cfg cfg, int64_t batch, int steps) {
    const mr_device dev = {MR_DEVICE_CUDA, 0};
    const mr_backend *be = NULL;
    mr_params *ps = NULL;
    mr_steps *cache = NULL;
    mr_step *st = NULL;
    mr_stream *stream = NULL;
    mr_optim *opt = NULL;
    CK(mr_backend_get(MR_DEVICE_CUDA, &be));
    CK(be->stream_new(0, &stream));
    CK(mr_params_new(&ps));
    CK(mr_steps_new(mr_model_step_build, &cfg, ps, MR_DEVICE_CUDA, &cache));
    mr_steps_set_compute(cache, g_compute);
    mr_steps_set_allow_tf32(cache, g_tf32);
    CK(mr_steps_register(cache, batch));
    CK(mr_params_init(ps, 1));
    int64_t n = mr_params_buffer_numel(ps);
    float *d_params = NULL, *d_grads = NULL, *d_scale = NULL, one = 1.0f;
    CK(be->alloc(0, (size_t)n * 4, (void **)&d_params));
    CK(be->alloc(0, (size_t)n * 4, (void **)&d_grads));
    CK(be->alloc(0, 4, (void **)&d_scale));
    CK(be->memset_zero(0, d_grads, (size_t)n * 4, stream));
    CK(be->copy(0, d_params, mr_params_buffer(ps), (size_t)n * 4, MR_COPY_H2D, stream));
    CK(be->copy(0, d_scale, &one, 4, MR_COPY_H2D, stream));
    CK(mr_steps_set_device(cache, dev, stream, d_params, d_grads, d_scale));
    CK(mr_steps_get(cache, batch, 1, &st));
    mr_optim_cfg oc = mr_optim_cfg_default(cfg.type == MR_MODEL_GPT ? MR_OPTIM_ADAMW : MR_OPTIM_SGD);
    if (cfg.type != MR_MODEL_GPT) {
        oc.lr = 0.01;
        oc.momentum = 0.9;
    } else {
        oc.lr = 3e-4;
        oc.weight_decay = 0.1;
    }
    CK(mr_optim_new_on(&oc, n, dev, stream, &opt));

    mr_shape sx = mr_graph_shape(st->g, st->io.x), sy = mr_graph_shape(st->g, st->io.y);
    int64_t nx = mr_shape_numel(&sx), ny = mr_shape_numel(&sy);
    int64_t classes = cfg.type == MR_MODEL_GPT ? cfg.vocab : 10;
    void *hx = malloc((size_t)nx * 4), *dx = NULL, *dy = NULL;
    int32_t *hy = malloc((size_t)ny * 4);
    for (int64_t i = 0; i < nx; i++) {
        if (cfg.type == MR_MODEL_GPT) ((int32_t *)hx)[i] = (int32_t)(i * 7919 % classes);
        else ((float *)hx)[i] = (float)((i * 2654435761u % 1000) / 500.0 - 1.0);
    }
    for (int64_t i = 0; i < ny; i++) hy[i] = (int32_t)(i * 104729 % classes);
    CK(be->alloc(0, (size_t)nx * 4, &dx));
    CK(be->alloc(0, (size_t)ny * 4, &dy));
    CK(be->copy(0, dx, hx, (size_t)nx * 4, MR_COPY_H2D, stream));
    CK(be->copy(0, dy, hy, (size_t)ny * 4, MR_COPY_H2D, stream));
    CK(mr_plan_bind(st->plan, st->io.x, dx));
    CK(mr_plan_bind(st->plan, st->io.y, dy));

    const int warmup = 3;
    mr_memory_stats m0, m1;
    double t0 = 0;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == 1 && g_graphs) CK(mr_plan_set_graphs(st->plan, 1)); /* captured at the second run */
        if (s == warmup) {
            CK(be->stream_sync(stream));
            CK(mr_device_memory_stats(dev, &m0));
            t0 = now_s();
        }
        CK(mr_plan_run(st->plan));
        CK(mr_optim_step(opt, d_params, d_grads, cfg.type == MR_MODEL_GPT ? 3e-4 : 0.01));
    }
    CK(be->stream_sync(stream));
    double dt = now_s() - t0;
    CK(mr_device_memory_stats(dev, &m1));
    float loss = 0;
    CK(be->copy(0, &loss, mr_plan_data(st->plan, st->io.loss), 4, MR_COPY_D2H, stream));
    CK(be->stream_sync(stream));
    double sps = (double)steps * (double)batch / dt;
    double tflops = train_flops(&cfg, mr_params_total(ps)) * sps / 1e12;
    double peak = g_compute == MR_F32 ? (g_tf32 ? 494.0 : 67.0) : 989.0;
    if (getenv("MIRROR_PEAK_TFLOPS")) peak = atof(getenv("MIRROR_PEAK_TFLOPS"));
    printf("| %-5s | %5lld | %12.0f %-8s | %8.2f | %7.1f | %5.1f%% | %8.1f | %8.1f | %lld | %6.3f |\n", name,
           (long long)batch, cfg.type == MR_MODEL_GPT ? sps * (double)cfg.context : sps,
           cfg.type == MR_MODEL_GPT ? "tokens/s" : "samples/s", 1e3 * dt / steps, tflops, 100.0 * tflops / peak,
           mr_plan_arena_bytes(st->plan) / 1048576.0, m1.peak_in_use / 1048576.0,
           (long long)(m1.raw_allocs - m0.raw_allocs), loss);
    fflush(stdout);
    mr_optim_free(opt);
    mr_steps_free(cache);
    be->free(0, dx);
    be->free(0, dy);
    be->free(0, d_params);
    be->free(0, d_grads);
    be->free(0, d_scale);
    be->stream_free(stream);
    mr_params_free(ps);
    free(hx);
    free(hy);
}

int main(int argc, char **argv) {
    const char *models = "mlp,cnn,gpt,gpt2";
    int steps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--models") && i + 1 < argc) models = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bf16")) g_compute = MR_BF16;
        else if (!strcmp(argv[i], "--f16")) g_compute = MR_F16;
        else if (!strcmp(argv[i], "--tf32")) g_tf32 = 1;
        else if (!strcmp(argv[i], "--no-graphs")) g_graphs = 0;
        else {
            fprintf(stderr, "usage: bench_gpu_models [--models mlp,cnn,gpt,gpt2] [--steps N] [--bf16|--f16] [--tf32] "
                            "[--no-graphs]\n");
            return 2;
        }
    }
    if (mr_cuda_device_count() == 0) {
        printf("SKIPPED: no usable GPU\n");
        return 77;
    }
    printf("precision %s%s, CUDA graphs %s, %d timed steps after 3 warm-up steps\n\n",
           g_compute == MR_F32 ? "float32" : g_compute == MR_BF16 ? "mixed_bfloat16" : "mixed_float16",
           g_tf32 ? " (TF32 GEMMs)" : "", g_graphs ? "on" : "off", steps);
    printf("| model | batch | throughput             | ms/step  | TFLOP/s | MFU    | arena MiB | peak MiB | raw allocs in steady steps | loss |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    char list[256];
    snprintf(list, sizeof list, "%s", models);
    for (char *save = NULL, *m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
        if (!strcmp(m, "mlp")) {
            run("mlp", mr_model_cfg_default(MR_MODEL_MLP), 256, steps);
        } else if (!strcmp(m, "cnn")) {
            run("cnn", mr_model_cfg_default(MR_MODEL_CNN), 128, steps);
        } else if (!strcmp(m, "gpt")) {
            run("gpt", mr_model_cfg_default(MR_MODEL_GPT), 32, steps);
        } else if (!strcmp(m, "gpt2")) {
            mr_model_cfg g = mr_model_cfg_default(MR_MODEL_GPT);
            g.vocab = 50304; /* GPT-2's 50257 padded to a multiple of 128, as llm.c does */
            g.context = 1024;
            g.layers = 12;
            g.heads = 12;
            g.embd = 768;
            g.dropout = 0.0;
            run("gpt2", g, 8, steps);
        } else {
            fprintf(stderr, "bench_gpu_models: unknown model '%s' (mlp, cnn, gpt, gpt2)\n", m);
            return 2;
        }
    }
    return 0;
}
