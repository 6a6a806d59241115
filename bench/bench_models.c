/* Training-step throughput of the three reference workloads: forward + backward + optimizer
 * update, on a fixed synthetic batch (the input pipeline is not measured), as in
 * bench/torch_bench.py, which bench/run_models.sh runs in the same session for ratios.
 *   mlp  784-1024-1024-10, batch 256, SGD(lr 0.01, momentum 0.9)
 *   cnn  1x28x28 -> conv32 -> pool -> conv64 -> pool -> fc128 -> fc10, batch 128, SGD(momentum 0.9)
 *   gpt  vocab 65, context 128, 4 layers, 4 heads, width 128, batch 32, AdamW(lr 3e-4, wd 0.1)
 * Reports the median samples/s (tokens/s for gpt) over runs, the analytic training GFLOP/s
 * (3x the forward matmul/conv FLOPs, as torch_bench.py counts them) as a fraction of the
 * measured peak, the planned activation arena, and the process's peak RSS.
 * Usage: bench_models [--models mlp,cnn,gpt] [--steps N] [--runs R] [--warmup W] [--bf16 | --f16]
 *        bench_models --config EXPERIMENT.yaml [...]: the experiment's model at its train.batch
 *        (any model.type; GFLOP/s only for the reference workloads)
 * MIRROR_PROFILE=1 adds a per-op time breakdown of the forward+backward graph. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/ops.h"
#include "core/rng.h"
#include "autodiff/steps.h"
#include "bench_peak.h"
#include "launch/config.h"
#include "models/models.h"

static double now_s(void) { return bench_now_s(); }

static double g_peak; /* measured fp32 GFLOP/s of this machine, this run */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what) {
    fprintf(stderr, "bench_models: %s: %s\n", what, mr_last_error());
    exit(1);
}

static double fwd_flops(const mr_model_cfg *c, int64_t batch) {
    switch (c->type) {
    case MR_MODEL_MLP: return 2.0 * (784 * 1024 + 1024 * 1024 + 1024 * 10) * batch;
    case MR_MODEL_CNN: return 2.0 * (28 * 28 * 32 * 9 * 1 + 14 * 14 * 64 * 9 * 32 + 3136 * 128 + 128 * 10) * batch;
    case MR_MODEL_GPT: {
        double d = (double)c->embd, T = (double)c->context, L = (double)c->layers, V = (double)c->vocab;
        double per_tok = L * 2 * (3 * d * d + d * d + 8 * d * d) + 2 * d * V + L * 2 * 2 * T * d;
        return per_tok * T * batch;
    }
    case MR_MODEL_GRAPH: return 0; /* not counted */
    }
    return 0;
}

static mr_dtype g_compute = MR_F32; /* --bf16: mixed_bfloat16 */

static void run(const char *name, mr_model_cfg cfg, int64_t batch, int steps, int runs, int warmup) {
    mr_params *ps = NULL;
    mr_steps *cache = NULL;
    mr_step *st = NULL;
    if (mr_params_new(&ps) || mr_steps_new(mr_model_step_build, &cfg, ps, MR_DEVICE_CPU, &cache)) die("setup");
    mr_steps_set_compute(cache, g_compute);
    if (mr_steps_get(cache, batch, 1, &st) != MR_OK) die("compile");
    if (mr_params_init(ps, 1) != MR_OK) die("params");
    mr_plan *p = st->plan;
    mr_graph *g = st->g;
    mr_step_io io = st->io;
    mr_shape sx = mr_graph_shape(g, io.x), sy = mr_graph_shape(g, io.y);
    int64_t nx = mr_shape_numel(&sx), ny = mr_shape_numel(&sy);
    void *x = malloc((size_t)nx * 4);
    int32_t *y = malloc((size_t)ny * 4);
    mr_rng rng = mr_rng_init(7);
    const int lm = mr_model_task(&cfg) == MR_TASK_LM;
    int64_t classes = lm ? cfg.vocab : 10;
    if (lm) {
        for (int64_t i = 0; i < nx; i++) ((int32_t *)x)[i] = (int32_t)(i * 7919 % classes);
    } else if (mr_rng_normal(&rng, x, nx, 0, 1) != MR_OK) {
        die("input");
    }
    for (int64_t i = 0; i < ny; i++) y[i] = (int32_t)(i * 104729 % classes);
    if (mr_plan_bind(p, io.x, x) || mr_plan_bind(p, io.y, y)) die("bind io");

    int64_t n = mr_params_buffer_numel(ps);
    float *m1 = calloc((size_t)n, 4), *m2 = calloc((size_t)n, 4);
    mr_op_args opt;
    int adamw = lm;
    mr_op_args_init(&opt, adamw ? MR_OP_ADAMW_UPDATE : MR_OP_SGD_UPDATE);
    opt.in[0] = (mr_view){mr_params_buffer(ps), MR_F32, mr_shape_1d(n)};
    opt.in[1] = (mr_view){mr_params_grad_buffer(ps), MR_F32, mr_shape_1d(n)};
    opt.in[2] = (mr_view){m1, MR_F32, mr_shape_1d(n)};
    if (adamw) {
        opt.in[3] = (mr_view){m2, MR_F32, mr_shape_1d(n)};
        opt.p.adamw = (mr_adamw_params){3e-4, 0.9, 0.999, 1e-8, 0.1, 0, NULL, NULL, NULL, 0};
    } else {
        opt.p.sgd = (mr_sgd_params){0.01, 0.9, 0.0, 0.0, 0, 1, NULL, NULL};
    }
    double *rates = calloc((size_t)runs, sizeof *rates), opt_s = 0;
    int64_t opt_calls = 0;
    float loss = 0;
    int64_t step = 0;
    for (int r = -1; r < runs; r++) {
        int todo = r < 0 ? warmup : steps;
        double t0 = now_s();
        for (int s = 0; s < todo; s++) {
            if (mr_plan_run(p) != MR_OK) die("run");
            step++;
            if (adamw) opt.p.adamw.step = step;
            else opt.p.sgd.first_step = step == 1;
            double to = now_s();
            if (mr_op_run(MR_DEVICE_CPU, &opt) != MR_OK) die("optimizer");
            opt_s += now_s() - to;
            opt_calls++;
        }
        loss = *(const float *)mr_plan_data(p, io.loss);
        if (r >= 0) rates[r] = (double)todo * (double)batch / (now_s() - t0);
    }
    if (getenv("MIRROR_PROFILE")) {
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        mr_plan_set_profile(p, 1);
        for (int s = 0; s < steps; s++)
            if (mr_plan_run(p) != MR_OK) die("run");
        getrusage(RUSAGE_SELF, &r1);
        mr_plan_profile_report(p, stdout);
        printf("page faults during the profiled steps: %ld minor, %ld major\n", r1.ru_minflt - r0.ru_minflt,
               r1.ru_majflt - r0.ru_majflt);
    }
    qsort(rates, (size_t)runs, sizeof *rates, cmp_double);
    double sps = rates[runs / 2];
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double gflops = 3.0 * fwd_flops(&cfg, 1) * sps / 1e9;
    printf("%-4s batch %4lld  %10.1f samples/s  %8.2f ms/step  ~%6.1f GFLOP/s (%.0f%% of peak)  loss %.4f  "
           "arena %.1f MiB (%.1f unshared)  params %lld  peak RSS %.0f MiB\n",
           name, (long long)batch, sps, 1e3 * batch / sps, gflops, 100.0 * gflops / g_peak, loss,
           mr_plan_arena_bytes(p) / 1048576.0, mr_plan_unshared_bytes(p) / 1048576.0, (long long)mr_params_total(ps),
           ru.ru_maxrss / 1024.0);
    if (lm) printf("%-4s = %.0f tokens/s\n", "", sps * (double)cfg.context);
    printf("%-4s   optimizer (%s over %lld floats): %.2f ms a step\n", "", adamw ? "AdamW" : "SGD momentum",
           (long long)n, 1e3 * opt_s / (double)(opt_calls ? opt_calls : 1));
    fflush(stdout);
    free(rates);
    free(m1);
    free(m2);
    free(x);
    free(y);
    mr_steps_free(cache);
    mr_params_free(ps);
}

int main(int argc, char **argv) {
    const char *models = "mlp,cnn,gpt", *config = NULL;
    int steps = 30, runs = 3, warmup = 5;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--bf16") || !strcmp(argv[i], "--f16")) {
            g_compute = !strcmp(argv[i], "--bf16") ? MR_BF16 : MR_F16;
            i--; /* a flag without a value */
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_models: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--models")) models = argv[i + 1];
        else if (!strcmp(argv[i], "--config")) config = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_models: unknown flag %s\nHINT: --models mlp,cnn,gpt --steps N --runs R --warmup W\n",
                    argv[i]);
            return 2;
        }
    }
    if (steps < 1 || runs < 1 || warmup < 0) {
        fprintf(stderr, "bench_models: --steps and --runs must be >= 1\n");
        return 2;
    }
    g_peak = peak_fp32(mr_cpu_threads());
    printf("# mirror training-step throughput, %d threads, GEMM: %s, measured fp32 peak %.0f GFLOP/s, %s\n",
           mr_cpu_threads(), mr_cpu_gemm_provider(), g_peak,
           g_compute == MR_BF16  ? "mixed_bfloat16 (linear layers and CPU convolutions in bf16)"
           : g_compute == MR_F16 ? "mixed_float16 (linear layers in f16, widened to f32 for the GEMM on this CPU)"
                                 : "float32");
    if (config) {
        mr_experiment e = mr_experiment_default();
        if (mr_experiment_load(config, &e) != MR_OK) die(config);
        run(mr_model_type_name(e.model.type), e.model, e.train.batch, steps, runs, warmup);
        mr_experiment_deinit(&e);
        return 0;
    }
    if (strstr(models, "mlp")) run("mlp", mr_model_cfg_default(MR_MODEL_MLP), 256, steps, runs, warmup);
    if (strstr(models, "cnn")) run("cnn", mr_model_cfg_default(MR_MODEL_CNN), 128, steps, runs, warmup);
    if (strstr(models, "gpt")) run("gpt", mr_model_cfg_default(MR_MODEL_GPT), 32, steps, runs, warmup);
    return 0;
}
