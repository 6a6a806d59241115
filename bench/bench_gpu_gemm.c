/* GPU GEMM benchmark: mirror's GEMM op (mr_op_run on MR_DEVICE_CUDA: cuBLASLt with a cached
 * algorithm) against cuBLAS called directly (cublasGemmEx), in f32 (full f32: CUBLAS_COMPUTE_32F),
 * f32 with TF32 (p.gemm.allow_tf32 / CUBLAS_COMPUTE_32F_FAST_TF32), and bf16 and f16 inputs with
 * f32 accumulation and an f32 C (mixed precision, what mirror's graph builds). Shapes: 4096^3 and
 * the GPT-2 124M linear layers at B*T = 8192 tokens, C = x W^T with W (N,K) as mr_graph_linear
 * runs them: qkv (K 768, N 2304), MLP fc (768 -> 3072), MLP proj (3072 -> 768), LM head
 * (768 -> 50304). The gap between the two columns is mirror's dispatch overhead (checks, cache
 * lookup) and any difference between cuBLASLt's and cuBLAS's choice of kernel.
 *
 * Then the fused epilogue: the MLP fc layer with bias + GELU + the saved pre-activation in ONE
 * GEMM (cuBLASLt GELU_AUX_BIAS) against the unfused sequence mirror ran before (GEMM, ADD of the
 * bias, GELU: three kernels and two extra passes over the 8192x3072 output).
 *
 * Timing: CUDA events around ITERS back-to-back launches after WARMUP launches, median of REPS
 * such windows. About 10 s on an H200. Usage: bench_gpu_gemm. Prints markdown tables.
 * Exits 77 when mirror was built without CUDA or no GPU is visible (as the GPU tests do). */
#include <stdio.h>
#include <stdlib.h>

#include "core/ops.h"

#ifdef MIRROR_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/math/philox_math.h"

#define WARMUP 3
#define ITERS 10
#define REPS 5

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "bench_gpu_gemm: %s: %s\n", #call, cudaGetErrorString(e_));           \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#define CKB(call)                                                                                 \
    do {                                                                                          \
        cublasStatus_t b_ = (call);                                                               \
        if (b_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            fprintf(stderr, "bench_gpu_gemm: %s: %s\n", #call, cublasGetStatusString(b_));       \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#define CKM(call)                                                                                 \
    do {                                                                                          \
        if ((call) != MR_OK) {                                                                    \
            fprintf(stderr, "bench_gpu_gemm: %s: %s\n", #call, mr_last_error());                  \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* One problem: C (m,n) = A (m,k) W^T, W (n,k); inputs of dtype dt, C f32; the epilogue views
 * (bias (n), pre (m,n), both f32) only for the fused runs. The buffers are sized for the largest
 * problem and reused. */
typedef struct bench_ctx {
    int64_t m, n, k;
    mr_dtype dt;
    int tf32;
    void *d_a, *d_w, *d_c, *d_bias, *d_pre, *d_tmp;
    cublasHandle_t h;
} bench_ctx;

static void run_mirror(const bench_ctx *c) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM);
    a.p.gemm = (mr_gemm_params){0, 1, 1.0, 0.0, MR_GEMM_EPI_NONE, c->tf32};
    a.in[0] = (mr_view){c->d_a, c->dt, mr_shape_2d(c->m, c->k)};
    a.in[1] = (mr_view){c->d_w, c->dt, mr_shape_2d(c->n, c->k)};
    a.out[0] = (mr_view){c->d_c, MR_F32, mr_shape_2d(c->m, c->n)};
    CKM(mr_op_run(MR_DEVICE_CUDA, &a));
}

static void run_cublas(const bench_ctx *c) {
    float alpha = 1.0f, beta = 0.0f;
    int m = (int)c->m, n = (int)c->n, k = (int)c->k;
    cudaDataType t = c->dt == MR_BF16 ? CUDA_R_16BF : c->dt == MR_F16 ? CUDA_R_16F : CUDA_R_32F;
    cublasComputeType_t ct = c->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    /* row-major C = A W^T is column-major C^T = W A^T: W first (transposed), as mirror does */
    CKB(cublasGemmEx(c->h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, c->d_w, t, k, c->d_a, t, k, &beta, c->d_c,
                     CUDA_R_32F, n, ct, CUBLAS_GEMM_DEFAULT));
}

/* The fused linear: C = gelu(A W^T + bias), pre = A W^T + bias, one op. */
static void run_fused(const bench_ctx *c) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM);
    a.p.gemm = (mr_gemm_params){0, 1, 1.0, 0.0, MR_GEMM_EPI_GELU, c->tf32};
    a.in[0] = (mr_view){c->d_a, c->dt, mr_shape_2d(c->m, c->k)};
    a.in[1] = (mr_view){c->d_w, c->dt, mr_shape_2d(c->n, c->k)};
    a.in[2] = (mr_view){c->d_bias, MR_F32, mr_shape_1d(c->n)};
    a.out[0] = (mr_view){c->d_c, MR_F32, mr_shape_2d(c->m, c->n)};
    a.out[1] = (mr_view){c->d_pre, MR_F32, mr_shape_2d(c->m, c->n)};
    CKM(mr_op_run(MR_DEVICE_CUDA, &a));
}

/* The same unfused: tmp = A W^T; pre = tmp + bias (ADD, broadcast); C = gelu(pre). Returns the
 * first failing status (the ADD and GELU CUDA kernels may be missing in this build). */
static mr_status try_unfused(const bench_ctx *c) {
    mr_status st;
    mr_shape sc = mr_shape_2d(c->m, c->n);
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM);
    a.p.gemm = (mr_gemm_params){0, 1, 1.0, 0.0, MR_GEMM_EPI_NONE, c->tf32};
    a.in[0] = (mr_view){c->d_a, c->dt, mr_shape_2d(c->m, c->k)};
    a.in[1] = (mr_view){c->d_w, c->dt, mr_shape_2d(c->n, c->k)};
    a.out[0] = (mr_view){c->d_tmp, MR_F32, sc};
    if ((st = mr_op_run(MR_DEVICE_CUDA, &a)) != MR_OK) return st;
    mr_op_args_init(&a, MR_OP_ADD);
    a.in[0] = (mr_view){c->d_tmp, MR_F32, sc};
    a.in[1] = (mr_view){c->d_bias, MR_F32, mr_shape_1d(c->n)};
    a.out[0] = (mr_view){c->d_pre, MR_F32, sc};
    if ((st = mr_op_run(MR_DEVICE_CUDA, &a)) != MR_OK) return st;
    mr_op_args_init(&a, MR_OP_GELU);
    a.in[0] = (mr_view){c->d_pre, MR_F32, sc};
    a.out[0] = (mr_view){c->d_c, MR_F32, sc};
    return mr_op_run(MR_DEVICE_CUDA, &a);
}

static void run_unfused(const bench_ctx *c) { CKM(try_unfused(c)); }

/* Median milliseconds per call of fn over REPS windows of ITERS launches on the legacy default
 * stream. */
static double time_ms(const bench_ctx *c, void (*fn)(const bench_ctx *)) {
    cudaEvent_t t0, t1;
    float ms[REPS];
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    for (int i = 0; i < WARMUP; i++) fn(c);
    for (int r = 0; r < REPS; r++) {
        CK(cudaEventRecord(t0, 0));
        for (int i = 0; i < ITERS; i++) fn(c);
        CK(cudaEventRecord(t1, 0));
        CK(cudaEventSynchronize(t1));
        CK(cudaEventElapsedTime(&ms[r], t0, t1));
    }
    CK(cudaEventDestroy(t0));
    CK(cudaEventDestroy(t1));
    qsort(ms, REPS, sizeof *ms, cmp_float);
    return ms[REPS / 2] / ITERS;
}

static double tflops(const bench_ctx *c, double ms) { return 2.0 * (double)c->m * c->n * c->k / (ms * 1e-3) * 1e-12; }

/* A device buffer of `count` elements of dtype dt with values in [-1, 1), filled in host chunks. */
static void *device_rand(int64_t count, mr_dtype dt, uint64_t seed) {
    const int64_t chunk = (int64_t)1 << 22;
    size_t es = mr_dtype_size(dt);
    void *h = malloc((size_t)chunk * es), *d = NULL;
    if (!h) {
        fprintf(stderr, "bench_gpu_gemm: out of host memory\n");
        exit(1);
    }
    CK(cudaMalloc(&d, (size_t)count * es));
    for (int64_t i0 = 0; i0 < count; i0 += chunk) {
        int64_t n = count - i0 < chunk ? count - i0 : chunk;
        for (int64_t i = 0; i < n; i++)
            mr_dtype_set(h, dt, i, 2.0 * mr_u32_to_unit_f32(mr_philox_u32(seed, 0, (uint64_t)(i0 + i))) - 1.0);
        CK(cudaMemcpy((char *)d + (size_t)i0 * es, h, (size_t)n * es, cudaMemcpyHostToDevice));
    }
    free(h);
    return d;
}

int main(void) {
    if (mr_cuda_device_count() == 0) {
        printf("bench_gpu_gemm: no usable GPU; skipped\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaSetDevice(0));
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d), %d SMs\n\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    /* M, K, N */
    static const int64_t shapes[][3] = {{4096, 4096, 4096}, {8192, 768, 2304},  {8192, 768, 3072},
                                        {8192, 3072, 768},  {8192, 768, 50304}};
    static const char *names[] = {"square 4096^3", "GPT-2 qkv", "GPT-2 MLP fc", "GPT-2 MLP proj", "GPT-2 LM head"};
    const int nshapes = (int)(sizeof shapes / sizeof *shapes);
    int64_t max_a = 0, max_w = 0, max_c = 0;
    for (int s = 0; s < nshapes; s++) {
        int64_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
        if (m * k > max_a) max_a = m * k;
        if (n * k > max_w) max_w = n * k;
        if (m * n > max_c) max_c = m * n;
    }
    /* f32, f32 + TF32, bf16 and f16 inputs (f32 C) */
    const mr_dtype dts[4] = {MR_F32, MR_F32, MR_BF16, MR_F16};
    const int tf32s[4] = {0, 1, 0, 0};
    const char *labels[4] = {"f32", "f32 tf32", "bf16 -> f32", "f16 -> f32"};
    bench_ctx c = {0};
    CKB(cublasCreate(&c.h));
    CK(cudaMalloc(&c.d_c, (size_t)max_c * sizeof(float)));
    printf("| GEMM C = x W^T (M x K x N) | inputs | mirror op TFLOP/s | cuBLAS direct TFLOP/s | mirror / cuBLAS |\n");
    printf("|---|---|---:|---:|---:|\n");
    for (int d = 0; d < 4; d++) {
        c.dt = dts[d];
        c.tf32 = tf32s[d];
        c.d_a = device_rand(max_a, c.dt, 1);
        c.d_w = device_rand(max_w, c.dt, 2);
        for (int s = 0; s < nshapes; s++) {
            c.m = shapes[s][0];
            c.k = shapes[s][1];
            c.n = shapes[s][2];
            double tm = tflops(&c, time_ms(&c, run_mirror)), tc = tflops(&c, time_ms(&c, run_cublas));
            printf("| %s %lld x %lld x %lld | %s | %.1f | %.1f | %.3f |\n", names[s], (long long)c.m, (long long)c.k,
                   (long long)c.n, labels[d], tm, tc, tm / tc);
        }
        CK(cudaFree(c.d_a));
        CK(cudaFree(c.d_w));
    }

    /* the fused epilogue at the MLP fc shape */
    printf("\n| MLP fc 8192 x 768 x 3072, bias + GELU + pre | inputs | fused (1 GEMM) ms | GEMM + add + gelu ms | "
           "speedup |\n");
    printf("|---|---|---:|---:|---:|\n");
    c.m = 8192;
    c.k = 768;
    c.n = 3072;
    c.d_bias = device_rand(c.n, MR_F32, 3);
    CK(cudaMalloc(&c.d_pre, (size_t)(c.m * c.n) * sizeof(float)));
    CK(cudaMalloc(&c.d_tmp, (size_t)(c.m * c.n) * sizeof(float)));
    for (int d = 0; d < 4; d++) {
        c.dt = dts[d];
        c.tf32 = tf32s[d];
        c.d_a = device_rand(c.m * c.k, c.dt, 1);
        c.d_w = device_rand(c.n * c.k, c.dt, 2);
        double tf = time_ms(&c, run_fused);
        mr_status st = try_unfused(&c);
        CK(cudaDeviceSynchronize());
        if (st == MR_OK) {
            double tu = time_ms(&c, run_unfused);
            printf("| fused linear | %s | %.3f | %.3f | %.2fx |\n", labels[d], tf, tu, tu / tf);
        } else {
            printf("| fused linear | %s | %.3f | n/a (%s) | |\n", labels[d], tf, mr_last_error());
        }
        CK(cudaFree(c.d_a));
        CK(cudaFree(c.d_w));
    }
    CK(cudaFree(c.d_bias));
    CK(cudaFree(c.d_pre));
    CK(cudaFree(c.d_tmp));
    CK(cudaFree(c.d_c));
    CKB(cublasDestroy(c.h));
    return 0;
}

#else /* !MIRROR_HAVE_CUDA */

int main(void) {
    printf("bench_gpu_gemm: built without CUDA; skipped\n");
    return 77;
}

#endif
