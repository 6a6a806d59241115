/* GPU GEMM benchmark: mirror's GEMM op (mr_op_run on MR_DEVICE_CUDA) against cuBLAS called
 * directly, on square 4096^3 problems in f32 (cublasSgemm, default math: no TF32) and bf16
 * (cublasGemmEx with f32 accumulation). The gap between the two columns is mirror's dispatch
 * overhead (argument checks, handle lookup); it should be within noise at this size.
 *
 * Timing: CUDA events around `iters` back-to-back launches after `warmup` launches, median of
 * `reps` such windows. Usage: bench_gpu_gemm [N]. Prints a markdown table.
 * Exits 77 when mirror was built without CUDA or no GPU is visible (as the GPU tests do). */
#include <stdio.h>
#include <stdlib.h>

#include "core/ops.h"

#ifdef MIRROR_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/math/philox_math.h"

#define WARMUP 5
#define ITERS 20
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

typedef struct bench_ctx {
    int n;
    mr_dtype dt;
    void *d_a, *d_b, *d_c;
    cublasHandle_t h;
} bench_ctx;

static void run_mirror(const bench_ctx *c) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_GEMM);
    a.p.gemm.alpha = 1.0;
    a.p.gemm.beta = 0.0;
    mr_shape s = mr_shape_2d(c->n, c->n);
    a.in[0] = (mr_view){c->d_a, c->dt, s};
    a.in[1] = (mr_view){c->d_b, c->dt, s};
    a.out[0] = (mr_view){c->d_c, c->dt, s};
    CKM(mr_op_run(MR_DEVICE_CUDA, &a));
}

static void run_cublas(const bench_ctx *c) {
    float alpha = 1.0f, beta = 0.0f;
    int n = c->n;
    /* row-major C = A B is column-major C^T = B^T A^T: B first, as mirror does */
    if (c->dt == MR_F32) {
        CKB(cublasSgemm(c->h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, (const float *)c->d_b, n,
                        (const float *)c->d_a, n, &beta, (float *)c->d_c, n));
    } else {
        CKB(cublasGemmEx(c->h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, c->d_b, CUDA_R_16BF, n, c->d_a, CUDA_R_16BF,
                         n, &beta, c->d_c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

/* Median TFLOP/s of fn over REPS windows of ITERS launches on the legacy default stream. */
static double time_tflops(const bench_ctx *c, void (*fn)(const bench_ctx *)) {
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
    double sec = ms[REPS / 2] * 1e-3 / ITERS;
    return 2.0 * c->n * (double)c->n * c->n / sec * 1e-12;
}

/* Fills an n x n device matrix of dtype dt with values in [-1, 1). */
static void *device_matrix(int n, mr_dtype dt, uint64_t seed) {
    size_t count = (size_t)n * (size_t)n, bytes = count * mr_dtype_size(dt);
    void *h = malloc(bytes), *d = NULL;
    if (!h) {
        fprintf(stderr, "bench_gpu_gemm: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < count; i++)
        mr_dtype_set(h, dt, (int64_t)i, 2.0 * mr_u32_to_unit_f32(mr_philox_u32(seed, 0, i)) - 1.0);
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4096;
    if (mr_cuda_device_count() == 0) {
        printf("bench_gpu_gemm: no usable GPU; skipped\n");
        return 77;
    }
    if (n <= 0) {
        fprintf(stderr, "usage: bench_gpu_gemm [N]  (N > 0)\n");
        return 2;
    }
    struct cudaDeviceProp prop;
    CK(cudaSetDevice(0));
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d), %d SMs\n\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    printf("| GEMM %dx%dx%d | mirror op TFLOP/s | cuBLAS direct TFLOP/s | mirror / cuBLAS |\n", n, n, n);
    printf("|---|---|---|---|\n");
    const mr_dtype dts[2] = {MR_F32, MR_BF16};
    for (int i = 0; i < 2; i++) {
        bench_ctx c = {n, dts[i], NULL, NULL, NULL, NULL};
        c.d_a = device_matrix(n, c.dt, 1);
        c.d_b = device_matrix(n, c.dt, 2);
        CK(cudaMalloc(&c.d_c, (size_t)n * (size_t)n * mr_dtype_size(c.dt)));
        CKB(cublasCreate(&c.h));
        double tm = time_tflops(&c, run_mirror);
        double tc = time_tflops(&c, run_cublas);
        printf("| %s | %.1f | %.1f | %.3f |\n", mr_dtype_name(c.dt), tm, tc, tm / tc);
        CKB(cublasDestroy(c.h));
        CK(cudaFree(c.d_a));
        CK(cudaFree(c.d_b));
        CK(cudaFree(c.d_c));
    }
    return 0;
}

#else /* !MIRROR_HAVE_CUDA */

int main(void) {
    printf("bench_gpu_gemm: built without CUDA; skipped\n");
    return 77;
}

#endif
