/* The emulated cuBLAS and cuBLASLt: exactly the functions mirror calls (core/cuda/gemm.cu,
 * backend_cuda.cu, doctor_cuda.cu), defined with the real headers' signatures. Each checks the
 * argument rules the libraries document and reports a violation (mr_emu::fatal: the process
 * aborts, so no test passes over it), then queues the product on the handle's stream, computed
 * in double from the stored inputs and rounded once to the output type.
 *
 * Checked: handles and descriptors live (created, not destroyed); layouts' ld >= rows; op(A),
 * op(B), C and D dimensions agree with the transposes; A and B of one type; C and D of one type,
 * f32 or A's type; the compute type (32F or 32F_FAST_TF32 for f32/f16/bf16 inputs, 64F for f64),
 * scale type f32 (f64 with 64F); batch counts and strides agree and batches fit; every matrix,
 * the bias and the aux buffer lie inside one device allocation of the handle's GPU; the bias has
 * D's rows and D's type; the GELU aux ld is a multiple of 8 and >= D's rows (cublasLt.h,
 * CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD); the workspace given is at least what the algorithm asked
 * for; in place D == C needs the same layout. Epilogues: DEFAULT, BIAS, GELU, GELU_BIAS, GELU_AUX,
 * GELU_AUX_BIAS (the tanh GELU, of alpha*op(A)op(B) + beta*C + bias); anything else is reported as
 * not emulated. FAST_TF32 rounds A and B to TF32 (10 mantissa bits) first. */
#define MR_EMU_RUNTIME 1
#include "tests/emu/emu_internal.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <vector>

namespace {

const uint32_t MAGIC_BLAS = 0xB1A5B1A5u, MAGIC_LT = 0x17171717u, MAGIC_DESC = 0xDE5CDE5Cu, MAGIC_LAYOUT = 0x1A1A1A1Au,
               MAGIC_PREF = 0x9F9F9F9Fu, DEAD = 0xDEADDEADu;

struct blas_handle {
    uint32_t magic;
    cudaStream_t stream;
    int device;
};
struct lt_handle {
    uint32_t magic;
    int device;
};
struct layout {
    uint32_t magic;
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};
struct desc {
    uint32_t magic;
    cublasComputeType_t compute;
    cudaDataType scale;
    cublasOperation_t ta, tb;
    cublasLtEpilogue_t epi;
    const void *bias;
    void *aux;
    int64_t aux_ld, aux_stride;
};
struct pref {
    uint32_t magic;
    uint64_t max_ws;
};

using mr_emu::keep_dead;

template <class T> T *live(void *p, uint32_t magic, const char *fn, const char *what) {
    T *o = (T *)p;
    if (!o) mr_emu::fatal("cublas", "%s: the %s is NULL", fn, what);
    if (o->magic == DEAD) mr_emu::fatal("cublas", "%s: the %s was used after it was destroyed", fn, what);
    if (o->magic != magic) mr_emu::fatal("cublas", "%s: the %s is not one (never created, or another kind)", fn, what);
    return o;
}

/* Marks a live object dead and keeps it (a later use is then reported). */
template <class T> void destroy(void *p, uint32_t magic, const char *fn, const char *what) {
    live<T>(p, magic, fn, what)->magic = DEAD;
    keep_dead(p);
}

size_t type_size(cudaDataType t) { return mr_emu::value_size(t); }
double load(const void *p, int64_t i, cudaDataType t) { return mr_emu::load_value(p, i, t); }
void store(void *p, int64_t i, cudaDataType t, double v) { mr_emu::store_value(p, i, t, v); }

double tf32(double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x0fffu + ((u >> 13) & 1u)) & ~0x1fffu; /* nearest, ties even */
    memcpy(&f, &u, 4);
    return f;
}

double gelu(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

/* One matrix as the GEMM reads it: a column-major (rows x cols) of `type` at p with ld and a batch
 * stride (elements). */
struct mat {
    const void *p;
    cudaDataType type;
    int64_t rows, cols, ld, stride;
};

void check_fits(const char *fn, const char *what, const void *p, cudaDataType t, int64_t rows, int64_t cols, int64_t ld,
                int64_t batch, int64_t stride, int device) {
    if (rows == 0 || cols == 0 || batch == 0) return;
    if (!p) mr_emu::fatal("cublas", "%s: %s is NULL", fn, what);
    if (ld < rows) mr_emu::fatal("cublas", "%s: %s has ld %lld < rows %lld", fn, what, (long long)ld, (long long)rows);
    int64_t span = ld * (cols - 1) + rows + (batch - 1) * stride;
    int d = -1;
    if (!mr_emu::device_range(p, (size_t)span * type_size(t), &d))
        mr_emu::fatal("cublas", "%s: %s (%lld x %lld, ld %lld, %lld batches of stride %lld) is not inside one device "
                                "allocation", fn, what, (long long)rows, (long long)cols, (long long)ld,
                      (long long)batch, (long long)stride);
    if (d != device) mr_emu::fatal("cublas", "%s: %s is memory of cuda:%d, the handle's GPU is cuda:%d", fn, what, d, device);
}

/* The product, in stream order: D = epi(alpha op(A) op(B) + beta C + bias), column-major. */
struct gemm_job {
    bool ta, tb;
    int64_t m, n, k, batch;
    double alpha, beta;
    mat A, B, C;
    void *D;
    cudaDataType dt;
    int64_t ldd, stride_d;
    bool tf32_in;
    cublasLtEpilogue_t epi;
    const void *bias;
    void *aux;
    int64_t aux_ld, aux_stride;
};

void run_gemm(const gemm_job &j) {
    std::vector<double> a((size_t)(j.m * j.k)), b((size_t)(j.k * j.n)), acc((size_t)j.m);
    for (int64_t q = 0; q < j.batch; q++) {
        /* op(A) as a dense m x k column-major double matrix, op(B) as k x n */
        for (int64_t p = 0; p < j.k; p++)
            for (int64_t i = 0; i < j.m; i++) {
                int64_t idx = q * j.A.stride + (j.ta ? p + i * j.A.ld : i + p * j.A.ld);
                double v = load(j.A.p, idx, j.A.type);
                a[(size_t)(i + p * j.m)] = j.tf32_in ? tf32(v) : v;
            }
        for (int64_t c = 0; c < j.n; c++)
            for (int64_t p = 0; p < j.k; p++) {
                int64_t idx = q * j.B.stride + (j.tb ? c + p * j.B.ld : p + c * j.B.ld);
                double v = load(j.B.p, idx, j.B.type);
                b[(size_t)(p + c * j.k)] = j.tf32_in ? tf32(v) : v;
            }
        for (int64_t c = 0; c < j.n; c++) {
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t p = 0; p < j.k; p++) {
                double bv = b[(size_t)(p + c * j.k)];
                const double *ac = &a[(size_t)(p * j.m)];
                for (int64_t i = 0; i < j.m; i++) acc[(size_t)i] += ac[i] * bv;
            }
            for (int64_t i = 0; i < j.m; i++) {
                double v = j.alpha * acc[(size_t)i];
                if (j.beta != 0.0) v += j.beta * load(j.C.p, q * j.C.stride + i + c * j.C.ld, j.C.type);
                if (j.epi & CUBLASLT_EPILOGUE_BIAS) v += load(j.bias, i, j.dt);
                if (j.epi & CUBLASLT_EPILOGUE_GELU) {
                    if (j.aux) store(j.aux, q * j.aux_stride + i + c * j.aux_ld, j.dt, v);
                    v = gelu(v);
                }
                store(j.D, q * j.stride_d + i + c * j.ldd, j.dt, v);
            }
        }
    }
}

cublasStatus_t queue(cudaStream_t s, const char *fn, const gemm_job &j) {
    mr_emu::count_library_call();
    if (j.m == 0 || j.n == 0 || j.batch == 0) return CUBLAS_STATUS_SUCCESS;
    cudaError_t e = mr_emu::enqueue(s, fn, [j]() { run_gemm(j); });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

bool is_in_type(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

} // namespace

extern "C" {

/* ---- cuBLAS ------------------------------------------------------------------------------------ */

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    blas_handle *h = new blas_handle{MAGIC_BLAS, (cudaStream_t)0, mr_emu::current_device()};
    *handle = (cublasHandle_t)h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    destroy<blas_handle>(handle, MAGIC_BLAS, "cublasDestroy", "handle");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    blas_handle *h = live<blas_handle>(handle, MAGIC_BLAS, "cublasSetStream", "handle");
    int d = mr_emu::stream_device(stream);
    if (d != h->device)
        mr_emu::fatal("cublas", "cublasSetStream: a stream of cuda:%d for a handle created on cuda:%d", d, h->device);
    h->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value) {
    switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; break;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; break;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t strided(const char *fn, cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                              int m, int n, int k, double alpha, const void *A, cudaDataType at, int lda, long long sa,
                              const void *B, cudaDataType bt, int ldb, long long sb, double beta, void *C,
                              cudaDataType ct, int ldc, long long sc, int batch, bool tf) {
    blas_handle *h = live<blas_handle>(handle, MAGIC_BLAS, fn, "handle");
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) || (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE;
    bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    check_fits(fn, "A", A, at, ar, ac, lda, batch, sa, h->device);
    check_fits(fn, "B", B, bt, br, bc, ldb, batch, sb, h->device);
    check_fits(fn, "C", C, ct, m, n, ldc, batch, sc, h->device);
    gemm_job j{};
    j.ta = ta;
    j.tb = tb;
    j.m = m;
    j.n = n;
    j.k = k;
    j.batch = batch;
    j.alpha = alpha;
    j.beta = beta;
    j.A = mat{A, at, ar, ac, lda, sa};
    j.B = mat{B, bt, br, bc, ldb, sb};
    j.C = mat{C, ct, m, n, ldc, sc};
    j.D = C;
    j.dt = ct;
    j.ldd = ldc;
    j.stride_d = sc;
    j.tf32_in = tf;
    j.epi = CUBLASLT_EPILOGUE_DEFAULT;
    return queue(h->stream, fn, j);
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const double *alpha, const double *A, int lda,
                                         long long int strideA, const double *B, int ldb, long long int strideB,
                                         const double *beta, double *C, int ldc, long long int strideC,
                                         int batchCount) {
    return strided("cublasDgemmStridedBatched", handle, transa, transb, m, n, k, *alpha, A, CUDA_R_64F, lda, strideA,
                   B, CUDA_R_64F, ldb, strideB, *beta, C, CUDA_R_64F, ldc, strideC, batchCount, false);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    const char *fn = "cublasGemmStridedBatchedEx";
    (void)algo;
    if (Atype != Btype || !is_in_type(Atype))
        mr_emu::fatal("cublas", "%s: A and B types %d and %d (the emulator does f32, f16 and bf16 inputs of one type)", fn,
                      (int)Atype, (int)Btype);
    if (Ctype != CUDA_R_32F && Ctype != Atype)
        mr_emu::fatal("cublas", "%s: C type %d with inputs of type %d is not a combination cuBLAS supports", fn, (int)Ctype,
                      (int)Atype);
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32)
        mr_emu::fatal("cublas", "%s: compute type %d is not emulated (32F, 32F_FAST_TF32)", fn, (int)computeType);
    if (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 && Atype != CUDA_R_32F)
        mr_emu::fatal("cublas", "%s: 32F_FAST_TF32 with non-f32 inputs", fn);
    /* compute 32F: alpha and beta are host floats (the default pointer mode) */
    return strided(fn, handle, transa, transb, m, n, k, *(const float *)alpha, A, Atype, lda, strideA, B, Btype, ldb,
                   strideB, *(const float *)beta, C, Ctype, ldc, strideC, batchCount,
                   computeType == CUBLAS_COMPUTE_32F_FAST_TF32);
}

/* ---- cuBLASLt --------------------------------------------------------------------------------- */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t) new lt_handle{MAGIC_LT, mr_emu::current_device()};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    destroy<lt_handle>(h, MAGIC_LT, "cublasLtDestroy", "handle");
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *out, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (type_size(type) == 0) mr_emu::fatal("cublasLt", "cublasLtMatrixLayoutCreate: data type %d is not emulated", (int)type);
    if (ld < (int64_t)(rows > 0 ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE; /* column-major: ld >= rows */
    layout *l = new layout{MAGIC_LAYOUT, type, rows, cols, ld, 1, 0};
    *out = (cublasLtMatrixLayout_t)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    destroy<layout>(l, MAGIC_LAYOUT, "cublasLtMatrixLayoutDestroy", "layout");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t ld, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
    layout *l = live<layout>(ld, MAGIC_LAYOUT, "cublasLtMatrixLayoutSetAttribute", "layout");
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->batch, buf, size);
        break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        if (size != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->stride, buf, size);
        break;
    default: mr_emu::fatal("cublasLt", "cublasLtMatrixLayoutSetAttribute: attribute %d is not emulated", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *out, cublasComputeType_t compute, cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32 && compute != CUBLAS_COMPUTE_64F)
        mr_emu::fatal("cublasLt", "cublasLtMatmulDescCreate: compute type %d is not emulated", (int)compute);
    if ((compute == CUBLAS_COMPUTE_64F) != (scale == CUDA_R_64F) || (scale != CUDA_R_32F && scale != CUDA_R_64F))
        return CUBLAS_STATUS_INVALID_VALUE;
    desc *d = new desc{MAGIC_DESC, compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, 0};
    *out = (cublasLtMatmulDesc_t)d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    destroy<desc>(d, MAGIC_DESC, "cublasLtMatmulDescDestroy", "matmul descriptor");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t dd, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    desc *d = live<desc>(dd, MAGIC_DESC, "cublasLtMatmulDescSetAttribute", "matmul descriptor");
    auto need = [&](size_t s) {
        if (size != s)
            mr_emu::fatal("cublasLt", "cublasLtMatmulDescSetAttribute: attribute %d takes %zu bytes, got %zu", (int)attr, s,
                          size);
    };
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: need(sizeof(int32_t)); memcpy(&d->ta, buf, size); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: need(sizeof(int32_t)); memcpy(&d->tb, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: need(sizeof(uint32_t)); memcpy(&d->epi, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: need(sizeof(void *)); memcpy(&d->bias, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: need(sizeof(void *)); memcpy(&d->aux, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: need(sizeof(int64_t)); memcpy(&d->aux_ld, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: need(sizeof(int64_t)); memcpy(&d->aux_stride, buf, size); break;
    default: mr_emu::fatal("cublasLt", "cublasLtMatmulDescSetAttribute: attribute %d is not emulated", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *out) {
    *out = (cublasLtMatmulPreference_t) new pref{MAGIC_PREF, 0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    destroy<pref>(p, MAGIC_PREF, "cublasLtMatmulPreferenceDestroy", "preference");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pp, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    pref *p = live<pref>(pp, MAGIC_PREF, "cublasLtMatmulPreferenceSetAttribute", "preference");
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->max_ws, buf, size);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        break;
    default: mr_emu::fatal("cublasLt", "cublasLtMatmulPreferenceSetAttribute: attribute %d is not emulated", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* The one algorithm the emulator has; it asks for 4 MiB of workspace when the preference allows
 * that much (so a workspace given to cublasLtMatmul is checked), none otherwise. */
static const uint64_t EMU_ALGO_ID = 0x656d75616c676f31ull; /* "emualgo1" */

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lh, cublasLtMatmulDesc_t dd, cublasLtMatrixLayout_t Ad,
                                              cublasLtMatrixLayout_t Bd, cublasLtMatrixLayout_t Cd,
                                              cublasLtMatrixLayout_t Dd, cublasLtMatmulPreference_t pp,
                                              int requested, cublasLtMatmulHeuristicResult_t *results, int *found) {
    const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    live<lt_handle>(lh, MAGIC_LT, fn, "handle");
    live<desc>(dd, MAGIC_DESC, fn, "matmul descriptor");
    live<layout>(Ad, MAGIC_LAYOUT, fn, "A layout");
    live<layout>(Bd, MAGIC_LAYOUT, fn, "B layout");
    live<layout>(Cd, MAGIC_LAYOUT, fn, "C layout");
    live<layout>(Dd, MAGIC_LAYOUT, fn, "D layout");
    pref *p = live<pref>(pp, MAGIC_PREF, fn, "preference");
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    memset(results, 0, sizeof *results);
    results->algo.data[0] = EMU_ALGO_ID;
    results->workspaceSize = p->max_ws >= (4u << 20) ? (4u << 20) : 0;
    results->algo.data[1] = results->workspaceSize;
    results->state = CUBLAS_STATUS_SUCCESS;
    results->wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lh, cublasLtMatmulDesc_t dd, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Ad, const void *B, cublasLtMatrixLayout_t Bd, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t ws_bytes, cudaStream_t stream) {
    const char *fn = "cublasLtMatmul";
    lt_handle *h = live<lt_handle>(lh, MAGIC_LT, fn, "handle");
    (void)h;
    desc *d = live<desc>(dd, MAGIC_DESC, fn, "matmul descriptor");
    layout *la = live<layout>(Ad, MAGIC_LAYOUT, fn, "A layout"), *lb = live<layout>(Bd, MAGIC_LAYOUT, fn, "B layout");
    layout *lc = live<layout>(Cd, MAGIC_LAYOUT, fn, "C layout"), *ld = live<layout>(Dd, MAGIC_LAYOUT, fn, "D layout");
    /* the GPU that runs it is the stream's; buffers must live there */
    int dev = mr_emu::stream_device(stream);
    if (dev < 0) mr_emu::fatal("cublasLt", "%s: an unknown stream", fn);
    if (alpha && mr_emu::device_range(alpha, 1, nullptr))
        mr_emu::fatal("cublasLt", "%s: alpha is a device pointer, but the pointer mode is host (the default)", fn);
    if (beta && mr_emu::device_range(beta, 1, nullptr))
        mr_emu::fatal("cublasLt", "%s: beta is a device pointer, but the pointer mode is host (the default)", fn);
    bool ta = d->ta == CUBLAS_OP_T, tb = d->tb == CUBLAS_OP_T;
    if ((d->ta != CUBLAS_OP_N && !ta) || (d->tb != CUBLAS_OP_N && !tb)) return CUBLAS_STATUS_INVALID_VALUE;
    int64_t m = (int64_t)ld->rows, n = (int64_t)ld->cols;
    int64_t k = ta ? (int64_t)la->rows : (int64_t)la->cols;
    int64_t am = ta ? (int64_t)la->cols : (int64_t)la->rows;
    int64_t bk = tb ? (int64_t)lb->cols : (int64_t)lb->rows, bn = tb ? (int64_t)lb->rows : (int64_t)lb->cols;
    if (am != m || bk != k || bn != n || (int64_t)lc->rows != m || (int64_t)lc->cols != n)
        mr_emu::fatal("cublasLt", "%s: op(A) %lldx%lld, op(B) %lldx%lld, C %llux%llu, D %lldx%lld do not agree", fn,
                      (long long)am, (long long)k, (long long)bk, (long long)bn, (unsigned long long)lc->rows,
                      (unsigned long long)lc->cols, (long long)m, (long long)n);
    if (la->type != lb->type) mr_emu::fatal("cublasLt", "%s: A and B of different types (%d, %d)", fn, (int)la->type, (int)lb->type);
    if (lc->type != ld->type) mr_emu::fatal("cublasLt", "%s: C and D of different types (%d, %d)", fn, (int)lc->type, (int)ld->type);
    bool f64 = la->type == CUDA_R_64F;
    if (f64 != (d->compute == CUBLAS_COMPUTE_64F) || (f64 && ld->type != CUDA_R_64F) ||
        (!f64 && ld->type != CUDA_R_32F && ld->type != la->type))
        mr_emu::fatal("cublasLt", "%s: types A %d, D %d with compute %d are not a supported combination", fn, (int)la->type,
                      (int)ld->type, (int)d->compute);
    if (d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && la->type != CUDA_R_32F)
        mr_emu::fatal("cublasLt", "%s: 32F_FAST_TF32 needs f32 inputs", fn);
    int32_t batch = ld->batch;
    if (la->batch != batch || lb->batch != batch || lc->batch != batch)
        mr_emu::fatal("cublasLt", "%s: batch counts A %d, B %d, C %d, D %d differ", fn, la->batch, lb->batch, lc->batch, batch);
    if (D == C && (lc->ld != ld->ld || lc->stride != ld->stride))
        mr_emu::fatal("cublasLt", "%s: in place (C == D) with different layouts", fn);
    if (!algo) mr_emu::fatal("cublasLt", "%s: no algorithm (the emulator requires one from the heuristic)", fn);
    if (algo->data[0] != EMU_ALGO_ID) mr_emu::fatal("cublasLt", "%s: the algorithm did not come from cublasLtMatmulAlgoGetHeuristic", fn);
    if (ws_bytes < algo->data[1])
        mr_emu::fatal("cublasLt", "%s: workspace of %zu bytes, the algorithm needs %llu", fn, ws_bytes,
                      (unsigned long long)algo->data[1]);
    if (ws_bytes > 0 && !mr_emu::device_range(workspace, ws_bytes, nullptr))
        mr_emu::fatal("cublasLt", "%s: the workspace (%zu bytes at %p) is not device memory", fn, ws_bytes, workspace);
    switch (d->epi) {
    case CUBLASLT_EPILOGUE_DEFAULT: case CUBLASLT_EPILOGUE_BIAS: case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_BIAS: case CUBLASLT_EPILOGUE_GELU_AUX: case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: break;
    default: mr_emu::fatal("cublasLt", "%s: epilogue %d is not emulated", fn, (int)d->epi);
    }
    if (f64 && d->epi != CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_NOT_SUPPORTED;
    check_fits(fn, "A", A, la->type, (int64_t)la->rows, (int64_t)la->cols, la->ld, batch, la->stride, dev);
    check_fits(fn, "B", B, lb->type, (int64_t)lb->rows, (int64_t)lb->cols, lb->ld, batch, lb->stride, dev);
    check_fits(fn, "D", D, ld->type, m, n, ld->ld, batch, ld->stride, dev);
    double al = f64 ? *(const double *)alpha : *(const float *)alpha;
    double be = f64 ? *(const double *)beta : *(const float *)beta;
    if (be != 0.0) check_fits(fn, "C", C, lc->type, m, n, lc->ld, batch, lc->stride, dev);
    if (d->epi & CUBLASLT_EPILOGUE_BIAS) {
        int bd = -1;
        if (!d->bias || !mr_emu::device_range(d->bias, (size_t)m * type_size(ld->type), &bd) || bd != dev)
            mr_emu::fatal("cublasLt", "%s: the bias (%p) is not %lld elements of D's type in device memory of cuda:%d", fn,
                          d->bias, (long long)m, dev);
    }
    bool aux = d->epi == CUBLASLT_EPILOGUE_GELU_AUX || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (aux) {
        if (d->aux_ld < m || d->aux_ld % 8 != 0)
            mr_emu::fatal("cublasLt", "%s: EPILOGUE_AUX_LD %lld must be >= rows (%lld) and a multiple of 8", fn,
                          (long long)d->aux_ld, (long long)m);
        if (batch > 1 && (d->aux_stride < d->aux_ld * n || d->aux_stride % 8 != 0))
            mr_emu::fatal("cublasLt", "%s: EPILOGUE_AUX_BATCH_STRIDE %lld overlaps batches or is not a multiple of 8", fn, (long long)d->aux_stride);
        check_fits(fn, "the GELU aux buffer", d->aux, ld->type, m, n, d->aux_ld, batch, d->aux_stride, dev);
    }
    gemm_job j{};
    j.ta = ta;
    j.tb = tb;
    j.m = m;
    j.n = n;
    j.k = k;
    j.batch = batch;
    j.alpha = al;
    j.beta = be;
    j.A = mat{A, la->type, (int64_t)la->rows, (int64_t)la->cols, la->ld, la->stride};
    j.B = mat{B, lb->type, (int64_t)lb->rows, (int64_t)lb->cols, lb->ld, lb->stride};
    j.C = mat{C, lc->type, m, n, lc->ld, lc->stride};
    j.D = D;
    j.dt = ld->type;
    j.ldd = ld->ld;
    j.stride_d = ld->stride;
    j.tf32_in = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    j.epi = d->epi;
    j.bias = d->bias;
    j.aux = aux ? d->aux : nullptr;
    j.aux_ld = d->aux_ld;
    j.aux_stride = d->aux_stride;
    return queue(stream, fn, j);
}

} // extern "C"
