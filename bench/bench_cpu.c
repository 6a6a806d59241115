/* CPU benchmark: the machine's own peaks, measured here, next to what mirror achieves.
 *
 *   peak fp32   an FMA loop with independent accumulators on every thread (AVX-512, else AVX2),
 *               so "% of peak" is against this machine's measured ceiling, not a datasheet.
 *   bandwidth   the best of read, copy and triad STREAM-style loops over arrays far larger than
 *               the caches.
 *   GEMM        mr_op_run(MR_OP_GEMM) at square sizes and at the shapes the reference models use
 *               (MLP 784-1024-1024-10 at batch 256; the CNN's im2col GEMMs at batch 128), plus
 *               the built-in fallback kernel once, for scale; next to OpenBLAS tuned by hand
 *               (OPENBLAS_CORETYPE=SkylakeX), loaded directly as a peer.
 *   bf16 GEMM   the GEMM op with bf16 inputs and an f32 C (mixed precision) next to the f32 GEMM
 *               at 1024^3, 2048^3 and the MLP shapes, and against the measured vdpbf16ps peak;
 *               with AMX the op runs the tile kernel and the vdpbf16ps kernel is timed beside it.
 *   ops         elementwise, reduction and normalisation ops in GB/s of compulsory traffic.
 * Usage: bench_cpu [--quick]. Prints a markdown table. Timings are medians of repeated runs. */
#include <dlfcn.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>

#include "core/ops.h"
#include "core/cpu/cpu_impl.h"
#include "core/math/philox_math.h"
#include "core/math/half_math.h"
#include "bench_peak.h"
#include "bench_util.h"

/* Memory bandwidth: the best of a read-only sum, a copy and a triad a = b + s*c over arrays far
 * larger than the caches, counting compulsory bytes (reads + writes), best of 5 each. */
static double stream_bw(int64_t n, double *read_gbs, double *copy_gbs, double *triad_gbs) {
    float *a = aligned_alloc(64, (size_t)n * 4), *b = aligned_alloc(64, (size_t)n * 4), *c = aligned_alloc(64, (size_t)n * 4);
    if (!a || !b || !c) return 0;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        a[i] = 0;
        b[i] = 1;
        c[i] = 2;
    }
    double best[3] = {0, 0, 0};
    volatile float sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        float s = 0;
        double t0 = now_s();
#pragma omp parallel for simd schedule(static) reduction(+ : s)
        for (int64_t i = 0; i < n; i++) s += b[i];
        double t1 = now_s();
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) a[i] = b[i];
        double t2 = now_s();
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
        double t3 = now_s();
        sink += s;
        double g[3] = {4.0 * (double)n / (t1 - t0) / 1e9, 8.0 * (double)n / (t2 - t1) / 1e9,
                       12.0 * (double)n / (t3 - t2) / 1e9};
        for (int j = 0; j < 3; j++)
            if (g[j] > best[j]) best[j] = g[j];
    }
    (void)sink;
    free(a);
    free(b);
    free(c);
    *read_gbs = best[0];
    *copy_gbs = best[1];
    *triad_gbs = best[2];
    double m = best[0];
    for (int j = 1; j < 3; j++)
        if (best[j] > m) m = best[j];
    return m;
}

/* ---- GEMM --------------------------------------------------------------------------------------- */

static float *rand_buf(int64_t n, uint64_t seed) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    for (int64_t i = 0; i < n; i++) p[i] = mr_u32_to_unit_f32(mr_philox_u32(seed, 0, (uint64_t)i)) - 0.5f;
    return p;
}

/* The peer: OpenBLAS as a user would tune it by hand (OPENBLAS_CORETYPE=SkylakeX on AVX-512),
 * loaded here directly, whatever provider mirror chose. NULL when not installed. */
typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                               float *, int);
static cblas_sgemm_fn g_openblas;

static void load_openblas_peer(void) {
    const char *old = getenv("OPENBLAS_CORETYPE");
    if (!old && mr_cpu_caps_get()->avx512f) setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    void *h = dlopen("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!old) unsetenv("OPENBLAS_CORETYPE");
    if (h) g_openblas = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
}

/* Median GFLOP/s of C(M,N) = A(M,K) op(B): provider 0 the GEMM op, 1 the built-in kernel,
 * 2 the OpenBLAS peer. */
static double bench_gemm(int64_t m, int64_t n, int64_t k, int tb, int builtin, int reps) {
    float *A = rand_buf(m * k, 1), *B = rand_buf(k * n, 2), *C = rand_buf(m * n, 3);
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM);
    a.p.gemm = (mr_gemm_params){0, tb, 1.0, 0.0, 0, 0};
    a.in[0] = (mr_view){A, MR_F32, mr_shape_2d(m, k)};
    a.in[1] = (mr_view){B, MR_F32, tb ? mr_shape_2d(n, k) : mr_shape_2d(k, n)};
    a.out[0] = (mr_view){C, MR_F32, mr_shape_2d(m, n)};
    double t[64];
    if (reps > 64) reps = 64;
    for (int r = -1; r < reps; r++) {
        double t0 = now_s();
        if (builtin == 1) {
            mr_cpu_sgemm_builtin(0, tb, m, n, k, 1.0f, A, k, B, tb ? k : n, 0.0f, C, n);
        } else if (builtin == 2) {
            g_openblas(101, 111, tb ? 112 : 111, (int)m, (int)n, (int)k, 1.0f, A, (int)k, B, (int)(tb ? k : n), 0.0f, C,
                       (int)n);
        } else if (mr_op_run(MR_DEVICE_CPU, &a) != MR_OK) {
            fprintf(stderr, "gemm failed: %s\n", mr_last_error());
            exit(1);
        }
        if (r >= 0) t[r] = now_s() - t0;
    }
    free(A);
    free(B);
    free(C);
    return 2.0 * (double)m * (double)n * (double)k / median(t, reps) / 1e9;
}

/* Median GFLOP/s of the GEMM op with bf16 A(M,K), op(B) and an f32 C (mixed precision); with
 * vdp, of the vdpbf16ps kernel called directly (0 where the CPU lacks it). */
static double bench_gemm_bf16(int64_t m, int64_t n, int64_t k, int tb, int reps, int vdp) {
    uint16_t *A = aligned_alloc(64, (size_t)((m * k * 2 + 63) / 64 * 64));
    uint16_t *B = aligned_alloc(64, (size_t)((k * n * 2 + 63) / 64 * 64));
    float *C = rand_buf(m * n, 3);
    for (int64_t i = 0; i < m * k; i++) A[i] = mr_f32_to_bf16(mr_u32_to_unit_f32(mr_philox_u32(1, 0, (uint64_t)i)) - 0.5f);
    for (int64_t i = 0; i < k * n; i++) B[i] = mr_f32_to_bf16(mr_u32_to_unit_f32(mr_philox_u32(2, 0, (uint64_t)i)) - 0.5f);
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM);
    a.p.gemm = (mr_gemm_params){0, tb, 1.0, 0.0, 0, 0};
    a.in[0] = (mr_view){A, MR_BF16, mr_shape_2d(m, k)};
    a.in[1] = (mr_view){B, MR_BF16, tb ? mr_shape_2d(n, k) : mr_shape_2d(k, n)};
    a.out[0] = (mr_view){C, MR_F32, mr_shape_2d(m, n)};
    double t[64];
    if (reps > 64) reps = 64;
    for (int r = -1; r < reps; r++) {
        double t0 = now_s();
        if (vdp) {
            if (!mr_cpu_gemm_bf16_vdpbf16ps(0, tb, m, n, k, 1.0f, A, k, B, tb ? k : n, 0.0f, C, n)) {
                free(A);
                free(B);
                free(C);
                return 0.0;
            }
        } else if (mr_op_run(MR_DEVICE_CPU, &a) != MR_OK) {
            fprintf(stderr, "bf16 gemm failed: %s\n", mr_last_error());
            exit(1);
        }
        if (r >= 0) t[r] = now_s() - t0;
    }
    free(A);
    free(B);
    free(C);
    return 2.0 * (double)m * (double)n * (double)k / median(t, reps) / 1e9;
}

/* ---- ops ------------------------------------------------------------------------------------------ */

/* Median GB/s of one op over n f32 elements; `bytes` is its compulsory traffic. */
static double bench_op(mr_op_args *a, double bytes, int reps) {
    double t[64];
    for (int r = -1; r < reps; r++) {
        double t0 = now_s();
        if (mr_op_run(MR_DEVICE_CPU, a) != MR_OK) {
            fprintf(stderr, "%s failed: %s\n", mr_op_get(a->op)->name, mr_last_error());
            return 0;
        }
        if (r >= 0) t[r] = now_s() - t0;
    }
    return bytes / median(t, reps) / 1e9;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    int threads = mr_cpu_threads();
    printf("# mirror CPU benchmark\n\n");
    printf("- threads: %d; CPU features: %s\n", threads, mr_cpu_features());
    printf("- GEMM provider: %s\n", mr_cpu_gemm_provider());
    load_openblas_peer();
    double peak1 = peak_fp32(1), peak = peak_fp32(threads);
    double rd = 0, cp = 0, tr = 0;
    double bw = stream_bw(quick ? (int64_t)1 << 25 : (int64_t)1 << 27, &rd, &cp, &tr);
    printf("- measured fp32 peak: %.1f GFLOP/s on %d threads (%.1f on 1): AVX-512 FMA loop, 16 chains\n", peak,
           threads, peak1);
    printf("- measured memory bandwidth: %.1f GB/s (read %.1f, copy %.1f, triad %.1f)\n\n", bw, rd, cp, tr);

    printf("| GEMM (M x N x K, B^T?) | mirror GFLOP/s | %% of peak | OpenBLAS (SkylakeX, hand-tuned) | mirror / OpenBLAS |\n"
           "|---|---:|---:|---:|---:|\n");
    struct { int64_t m, n, k; int tb; const char *what; } g[] = {
        {1024, 1024, 1024, 0, "square"},
        {2048, 2048, 2048, 0, "square"},
        {4096, 4096, 4096, 0, "square"},
        {256, 1024, 784, 1, "MLP fc1 fwd (x W^T)"},
        {256, 1024, 1024, 1, "MLP fc2 fwd"},
        {256, 784, 1024, 0, "MLP fc1 bwd data (dy W)"},
        {32, 100352, 9, 0, "CNN conv1 im2col, b128"},
        {64, 25088, 288, 0, "CNN conv2 im2col, b128"},
        {64, 288, 25088, 1, "CNN conv2 dW (dy col^T)"},
    };
    int ng = (int)(sizeof g / sizeof *g);
    for (int i = 0; i < ng; i++) {
        if (quick && g[i].m == 4096) continue;
        int reps = g[i].m >= 2048 ? 5 : 15;
        double gf = bench_gemm(g[i].m, g[i].n, g[i].k, g[i].tb, 0, reps);
        double go = g_openblas ? bench_gemm(g[i].m, g[i].n, g[i].k, g[i].tb, 2, reps) : 0.0;
        printf("| %lld x %lld x %lld%s (%s) | %.1f | %.0f%% | %.1f | %.2f |\n", (long long)g[i].m, (long long)g[i].n,
               (long long)g[i].k, g[i].tb ? " B^T" : "", g[i].what, gf, 100.0 * gf / peak, go,
               go > 0 ? gf / go : 0.0);
    }
    double gb = bench_gemm(1024, 1024, 1024, 0, 1, 3);
    printf("| 1024^3 built-in fallback kernel | %.1f | %.0f%% | | |\n\n", gb, 100.0 * gb / peak);

    /* Mixed precision: bf16 inputs, f32 accumulation and C, next to the f32 kernel. */
    double pbf = peak_bf16(threads);
    printf("- bf16 GEMM path: %s; measured vdpbf16ps peak: %.1f GFLOP/s on %d threads (%.2fx the fp32 FMA peak)\n\n",
           mr_cpu_gemm_bf16_provider(), pbf, threads, peak > 0 ? pbf / peak : 0.0);
    printf("| GEMM (M x N x K, B^T?) | f32 GFLOP/s | bf16 GFLOP/s | bf16 / f32 | bf16 %% of vdpbf16ps peak | "
           "vdpbf16ps kernel GFLOP/s |\n"
           "|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < ng; i++) {
        if (g[i].m == 4096 || g[i].k < 64) continue; /* 1024^3, 2048^3, the MLP shapes and the CNN's deep ones */
        int reps = g[i].m >= 2048 ? 5 : 15;
        double gf = bench_gemm(g[i].m, g[i].n, g[i].k, g[i].tb, 0, reps);
        double gh = bench_gemm_bf16(g[i].m, g[i].n, g[i].k, g[i].tb, reps, 0);
        double gv = bench_gemm_bf16(g[i].m, g[i].n, g[i].k, g[i].tb, reps, 1);
        printf("| %lld x %lld x %lld%s (%s) | %.1f | %.1f | %.2f | %.0f%% | %.1f |\n", (long long)g[i].m,
               (long long)g[i].n, (long long)g[i].k, g[i].tb ? " B^T" : "", g[i].what, gf, gh, gh / gf,
               pbf > 0 ? 100.0 * gh / pbf : 0.0, gv);
    }
    printf("\n");

    /* Elementwise and row-wise ops on 64M f32 elements (256 MiB per operand: more than the last
     * level cache, like the bandwidth loops; rows of 1024 for the row ops). */
    int64_t n = quick ? (int64_t)1 << 22 : (int64_t)1 << 26, cols = 1024, rows = n / cols;
    float *x = rand_buf(n, 4), *y = rand_buf(n, 5), *z = rand_buf(n, 6), *w = rand_buf(n, 7);
    float *gm = rand_buf(cols, 8), *bt = rand_buf(cols, 9), *mu = rand_buf(rows, 10), *rs = rand_buf(rows, 11);
    mr_shape s1 = mr_shape_1d(n), s2 = mr_shape_2d(rows, cols);
    printf("| op (%lld f32) | GB/s | %% of measured bandwidth |\n|---|---:|---:|\n", (long long)n);
    struct { mr_op_id op; int nin, nout; double streams; } ops[] = {
        {MR_OP_ADD, 2, 1, 3}, {MR_OP_MUL, 2, 1, 3}, {MR_OP_RELU, 1, 1, 2}, {MR_OP_GELU, 1, 1, 2},
        {MR_OP_EXP, 1, 1, 2}, {MR_OP_GELU_BWD, 3, 1, 3}, {MR_OP_SUM, 1, 1, 1}, {MR_OP_SOFTMAX, 1, 1, 2},
        {MR_OP_LAYERNORM, 3, 3, 2}, {MR_OP_ADAMW_UPDATE, 4, 0, 7}, {MR_OP_CAST, 1, 1, 1.5},
    };
    uint16_t *h = aligned_alloc(64, (size_t)n * 2);
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        mr_op_args a;
        mr_op_args_init(&a, ops[i].op);
        float *bufs[4] = {x, y, z, w};
        int rowop = ops[i].op == MR_OP_SOFTMAX || ops[i].op == MR_OP_LAYERNORM;
        for (int j = 0; j < a.n_in; j++) a.in[j] = (mr_view){bufs[j], MR_F32, rowop ? s2 : s1};
        for (int j = 0; j < a.n_out; j++) a.out[j] = (mr_view){w, MR_F32, rowop ? s2 : s1};
        switch (ops[i].op) {
        case MR_OP_SUM:
            a.p.reduce.axes = 1;
            a.out[0] = (mr_view){w, MR_F32, mr_shape_1d(1)};
            break;
        case MR_OP_LAYERNORM:
            a.p.layernorm.eps = 1e-5;
            a.in[1] = (mr_view){gm, MR_F32, mr_shape_1d(cols)};
            a.in[2] = (mr_view){bt, MR_F32, mr_shape_1d(cols)};
            a.out[1] = (mr_view){mu, MR_F32, mr_shape_1d(rows)};
            a.out[2] = (mr_view){rs, MR_F32, mr_shape_1d(rows)};
            break;
        case MR_OP_ADAMW_UPDATE:
            a.p.adamw = (mr_adamw_params){1e-3, 0.9, 0.999, 1e-8, 0.01, 1, NULL, NULL, NULL, 0};
            for (int j = 0; j < 4; j++) a.in[j] = (mr_view){bufs[j], MR_F32, s1};
            break;
        case MR_OP_CAST:
            a.out[0] = (mr_view){h, MR_BF16, s1};
            break;
        default:
            break;
        }
        double gbs = bench_op(&a, ops[i].streams * 4.0 * (double)n, quick ? 5 : 11);
        printf("| %s | %.1f | %.0f%% |\n", mr_op_get(ops[i].op)->name, gbs, 100.0 * gbs / bw);
    }
    free(h);
    free(x);
    free(y);
    free(z);
    free(w);
    free(gm);
    free(bt);
    free(mu);
    free(rs);
    return 0;
}
