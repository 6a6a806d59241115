/* The GEMM op on the GPU (see MR_OP_GEMM in ops.h; the oracle is core/ref/gemm_ref.c): cuBLASLt
 * for f32, bf16 and f16 with the bias and GELU fused into its epilogue, cuBLAS for f64 and as the
 * fallback, and a small epilogue kernel wherever the fused epilogue is not available.
 *
 * Layout. cuBLAS(Lt) is column-major and mirror is row-major. A row-major (r x c) buffer is the
 * column-major (c x r) matrix, so C = op(A) op(B) in row-major is C^T = op(B)^T op(A)^T in
 * column-major: we call with the operands swapped (B first), m and n swapped, and each operand's
 * transpose flag unchanged. cuBLASLt's bias has the length of D's rows and is broadcast over its
 * columns (cublasLt.h, CUBLASLT_EPILOGUE_BIAS); our D is C^T, N rows by M columns, so a bias of
 * length N is added to every row of our C, as MR_OP_GEMM specifies. The GELU aux matrix (our pre)
 * has C^T's layout, ld N, which cuBLASLt requires to be a multiple of 8 (EPILOGUE_AUX_LD); for
 * other N the GEMM writes the product into pre and the epilogue kernel finishes.
 *
 * Precision. f32 runs CUBLAS_COMPUTE_32F, full f32, unless p.gemm.allow_tf32 asks for
 * CUBLAS_COMPUTE_32F_FAST_TF32 (10-bit mantissa inputs, f32 accumulation); f16/bf16 accumulate
 * in f32 and store C in f32 or their own type; the bias and pre have C's type (cuBLASLt's
 * defaults). cuBLASLt's GELU is the tanh form, the function of mr_gelu_f32. f64 runs
 * cublasDgemmStridedBatched and the epilogue kernel.
 *
 * Caching. A steady training step repeats the same few problems, so the matmul descriptor, the
 * layouts and the algorithm the heuristic picked are kept per problem (shapes, types, flags,
 * pointer alignments, device, workspace size) in a fixed cache of LT_CACHE entries, reused round
 * robin when full: no heuristic query after the first step. The bias and aux pointers live in the
 * shared descriptor, so one mutex is held from the lookup through setting them and enqueueing
 * cublasLtMatmul (microseconds; the GPU work itself is not inside the lock).
 *
 * Workspace. 32 MiB, NVIDIA's recommendation for cuBLASLt on Hopper, per (device, stream) pair,
 * allocated on first use through the CUDA backend's alloc (its caching allocator) and kept for
 * the life of the process. Per stream rather than per device: two streams of one device running
 * GEMMs at once must not share scratch (cuBLAS's "results reproducibility" notes recommend a
 * user-owned workspace per stream for exactly this). Past LT_MAX_WS pairs a GEMM runs without
 * workspace.
 *
 * Determinism. The cache fixes the algorithm per problem for the process; cuBLAS(Lt) routines
 * give the same bits on every run on one GPU model with one workspace per stream (split-K
 * reductions are sequenced, not atomic), and the epilogue kernel is one thread per element.
 * The check (mr_gemm_fwd_check) has validated dtypes, shapes and params before we get here. */
#include "core/cuda/cuda_impl.h"
#include "core/log.h"
#include "core/math/half_math.h"
#include "core/math/unary_math.h"
#include "core/ops_impl.h"

#include <cublasLt.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define LT_MAX_DEVICES 64
#define LT_CACHE 128
#define LT_MAX_WS 32
#define LT_WORKSPACE_BYTES ((size_t)32 << 20)

/* ---- the epilogue kernel ---------------------------------------------------------------------- */

namespace {
/* Storage type S and working type W of each dtype; W is f32 for the half types (as cuBLASLt's
 * epilogue computes) and the type itself for f32 and f64. */
struct gemm_io_f32 {
    typedef float S;
    typedef float W;
    static __device__ W get(S v) { return v; }
    static __device__ S put(W v) { return v; }
    static __device__ W gelu(W v) { return mr_gelu_f32(v); }
};
struct gemm_io_f64 {
    typedef double S;
    typedef double W;
    static __device__ W get(S v) { return v; }
    static __device__ S put(W v) { return v; }
    static __device__ W gelu(W v) { return mr_gelu_f64(v); }
};
struct gemm_io_bf16 {
    typedef uint16_t S;
    typedef float W;
    static __device__ W get(S v) { return mr_bf16_to_f32(v); }
    static __device__ S put(W v) { return mr_f32_to_bf16(v); }
    static __device__ W gelu(W v) { return mr_gelu_f32(v); }
};
struct gemm_io_f16 {
    typedef uint16_t S;
    typedef float W;
    static __device__ W get(S v) { return mr_f16_to_f32(v); }
    static __device__ S put(W v) { return mr_f32_to_f16(v); }
    static __device__ W gelu(W v) { return mr_gelu_f32(v); }
};
} // namespace

/* src, out and pre are (total / n, n) of IO::S, bias (n) or NULL, pre NULL when not wanted:
 * v = src + bias; pre = v; out = gelu ? gelu(v) : v. src may be out or pre (each element is read
 * and written by one thread, read first), so none of the three is __restrict__. Memory-bound:
 * one coalesced grid-stride pass; the bias (n elements) stays in L1/L2. */
template <typename IO>
__global__ void mr_gemm_epilogue_kernel(const typename IO::S *src, typename IO::S *out, typename IO::S *pre,
                                        const typename IO::S *__restrict__ bias, int64_t total, int64_t n,
                                        int gelu) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        typename IO::W v = IO::get(src[i]);
        if (bias) v += IO::get(bias[i % n]);
        if (pre) pre[i] = IO::put(v);
        out[i] = IO::put(gelu ? IO::gelu(v) : v);
    }
}

template <typename IO>
static mr_status launch_epilogue(const void *src, void *out, void *pre, const void *bias, int64_t total, int64_t n,
                                 int gelu, cudaStream_t s) {
    typedef typename IO::S S;
    mr_gemm_epilogue_kernel<IO><<<mr_cuda_grid(total), MR_CUDA_BLOCK, 0, s>>>(
        (const S *)src, (S *)out, (S *)pre, (const S *)bias, total, n, gelu);
    return mr_cuda_check_launch("gemm epilogue");
}

/* The epilogue on `total` elements of C's dtype dt: C := [gelu](src + bias), pre := src + bias. */
static mr_status run_epilogue(mr_dtype dt, const void *src, void *out, void *pre, const void *bias, int64_t total,
                              int64_t n, int gelu, cudaStream_t s) {
    switch (dt) {
    case MR_F32: return launch_epilogue<gemm_io_f32>(src, out, pre, bias, total, n, gelu, s);
    case MR_F64: return launch_epilogue<gemm_io_f64>(src, out, pre, bias, total, n, gelu, s);
    case MR_BF16: return launch_epilogue<gemm_io_bf16>(src, out, pre, bias, total, n, gelu, s);
    case MR_F16: return launch_epilogue<gemm_io_f16>(src, out, pre, bias, total, n, gelu, s);
    default: return mr_set_error(MR_ERR_UNSUPPORTED, "gemm: no epilogue kernel for %s", mr_dtype_name(dt));
    }
}

/* ---- the problem -------------------------------------------------------------------------------- */

/* One GEMM in row-major terms after folding a shared B into the rows: C (batch, m, n) =
 * alpha * op(A) op(B) + beta * C, the batch strides in elements (stride_b 0: B shared). */
typedef struct gemm_problem {
    int device;
    cudaStream_t stream;
    mr_dtype tab, tc; /* A and B's dtype, C's dtype */
    int ta, tb, tf32;
    int64_t m, n, k, batch;
    int64_t stride_a, stride_b, stride_c;
    const void *A, *B;
    double alpha, beta;
} gemm_problem;

static cudaDataType cuda_type(mr_dtype dt) {
    switch (dt) {
    case MR_F64: return CUDA_R_64F;
    case MR_BF16: return CUDA_R_16BF;
    case MR_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
    }
}

/* ---- cuBLASLt: handles, workspaces, the problem cache -------------------------------------------- */

#define MR_TRY_LT(call)                                                                         \
    do {                                                                                        \
        cublasStatus_t mr_l_ = (call);                                                          \
        if (mr_l_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            st = mr_set_error(mr_l_ == CUBLAS_STATUS_ALLOC_FAILED ? MR_ERR_NOMEM : MR_ERR_DEVICE, \
                              "%s failed: %s (%d)", #call, cublasLtGetStatusString(mr_l_),      \
                              (int)mr_l_);                                                      \
            goto fail;                                                                          \
        }                                                                                       \
    } while (0)

/* The cache key: every input of the heuristic's choice. Built memset to 0 and compared with
 * memcmp, padding included. Alignments are those of the pointers and batch strides, capped at
 * 256 bytes (the preference default). */
typedef struct lt_key {
    int device;
    int tab, tc, compute;
    int ta, tb;
    uint32_t epilogue; /* cublasLtEpilogue_t */
    int64_t m, n, k, batch, stride_a, stride_b, stride_c;
    uint32_t align[6]; /* A, B, C, D, bias, aux */
    uint64_t ws_bytes;
} lt_key;

typedef struct lt_entry {
    int used;
    int has_algo; /* 0: cuBLASLt has no algorithm for it (use the fallback) */
    lt_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc; /* column-major: la is our B, lb our A, lc our C (and D) */
    cublasLtMatmulAlgo_t algo;
} lt_entry;

typedef struct lt_ws {
    int used, device;
    cudaStream_t stream;
    void *ptr; /* NULL: the allocation failed; this stream runs without workspace */
} lt_ws;

/* Process-wide state of this file, guarded by g_lt_mu: the handles, workspaces and cache are
 * created on demand and kept for the life of the process (CUDA tears them down with the context). */
static pthread_mutex_t g_lt_mu = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t g_lt_handle[LT_MAX_DEVICES];
static lt_ws g_lt_ws[LT_MAX_WS];
static lt_entry g_lt_cache[LT_CACHE];
static int g_lt_next; /* the entry the next miss replaces when the cache is full */

static uint32_t align_of(const void *p, int64_t stride_bytes) {
    uintptr_t x = (uintptr_t)p | (uintptr_t)stride_bytes | (uintptr_t)256;
    return (uint32_t)(x & (~x + 1)); /* lowest set bit */
}

static void lt_entry_clear(lt_entry *e) {
    if (e->desc) (void)cublasLtMatmulDescDestroy(e->desc);
    if (e->la) (void)cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) (void)cublasLtMatrixLayoutDestroy(e->lb);
    if (e->lc) (void)cublasLtMatrixLayoutDestroy(e->lc);
    memset(e, 0, sizeof *e);
}

/* The workspace of (device, stream), allocated on first use. Called with g_lt_mu held. */
static void lt_workspace(int device, cudaStream_t s, void **ws, size_t *bytes) {
    *ws = NULL;
    *bytes = 0;
    lt_ws *free_slot = NULL;
    for (int i = 0; i < LT_MAX_WS; i++) {
        lt_ws *w = &g_lt_ws[i];
        if (w->used && w->device == device && w->stream == s) {
            *ws = w->ptr;
            *bytes = w->ptr ? LT_WORKSPACE_BYTES : 0;
            return;
        }
        if (!w->used && !free_slot) free_slot = w;
    }
    if (!free_slot) return; /* more streams than slots: no workspace (documented above) */
    const mr_backend *be = NULL;
    void *p = NULL;
    if (mr_backend_get(MR_DEVICE_CUDA, &be) != MR_OK || be->alloc(device, LT_WORKSPACE_BYTES, &p) != MR_OK) {
        mr_log_warn("gemm: cannot allocate the %zu MiB cuBLASLt workspace on cuda:%d (%s); GEMMs on this stream run "
                    "without one (slower)",
                    LT_WORKSPACE_BYTES >> 20, device, mr_last_error());
        p = NULL;
    }
    free_slot->used = 1;
    free_slot->device = device;
    free_slot->stream = s;
    free_slot->ptr = p;
    *ws = p;
    *bytes = p ? LT_WORKSPACE_BYTES : 0;
}

/* Called by the backend's stream_free (backend_cuda.cu) before it destroys stream s of `device`:
 * forgets the stream's workspace slot and returns the buffer for the caller to free (NULL if it
 * had none). Without this a slot outlives its stream: a later stream created at the same address
 * would share the scratch with GEMMs still queued on the dead one, and a process that creates
 * more than LT_MAX_WS streams over its life would run every later GEMM without workspace while
 * keeping the dead streams' 32 MiB each. The caller's free is ordered after the stream's queued
 * work (a blocking stream; see alloc_cache.c). */
extern "C" void *mr_cuda_gemm_stream_release(int device, cudaStream_t s) {
    void *p = NULL;
    pthread_mutex_lock(&g_lt_mu);
    for (int i = 0; i < LT_MAX_WS; i++) {
        lt_ws *w = &g_lt_ws[i];
        if (w->used && w->device == device && w->stream == s) {
            p = w->ptr;
            memset(w, 0, sizeof *w);
            break;
        }
    }
    pthread_mutex_unlock(&g_lt_mu);
    return p;
}

/* A new column-major layout (rows x cols, ld) of type t with `batch` matrices `stride` apart. */
static mr_status lt_layout(cublasLtMatrixLayout_t *out, cudaDataType t, int64_t rows, int64_t cols, int64_t ld,
                           int64_t batch, int64_t stride) {
    mr_status st = MR_OK;
    int32_t count = (int32_t)batch;
    MR_TRY_LT(cublasLtMatrixLayoutCreate(out, t, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        MR_TRY_LT(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        MR_TRY_LT(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                   sizeof stride));
    }
    return MR_OK;
fail:
    return st;
}

/* Fills a cache entry for key k: descriptor, layouts, and the heuristic's best algorithm (none:
 * has_algo 0, not an error). The bias and aux pointers are set before the query because the
 * heuristic reads their alignment from them. Called with g_lt_mu held. */
static mr_status lt_entry_build(lt_entry *e, const lt_key *k, const gemm_problem *g, cublasLtHandle_t h,
                                const void *bias, void *aux) {
    mr_status st = MR_OK;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasOperation_t op_a = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* column-major A is our B */
    cublasOperation_t op_b = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* column-major B is our A */
    cudaDataType tab = cuda_type(g->tab), tc = cuda_type(g->tc);
    uint32_t epi = k->epilogue;
    uint64_t ws = k->ws_bytes;
    int64_t aux_ld = g->n, aux_stride = g->m * g->n;
    memset(e, 0, sizeof *e);
    memset(&res, 0, sizeof res);
    e->key = *k;
    MR_TRY_LT(cublasLtMatmulDescCreate(&e->desc, (cublasComputeType_t)k->compute, CUDA_R_32F));
    MR_TRY_LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    MR_TRY_LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    MR_TRY_LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (epi & CUBLASLT_EPILOGUE_BIAS)
        MR_TRY_LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        MR_TRY_LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        MR_TRY_LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                 sizeof aux_ld));
        if (g->batch > 1)
            MR_TRY_LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                                                     &aux_stride, sizeof aux_stride));
    }
    /* the bias is shared by every batch: BIAS_BATCH_STRIDE stays at its default 0 */
    /* column-major A = our B: op N is (n x k) with ld n, op T is (k x n) with ld k */
    MR_TRY(lt_layout(&e->la, tab, g->tb ? g->k : g->n, g->tb ? g->n : g->k, g->tb ? g->k : g->n, g->batch,
                     g->stride_b));
    /* column-major B = our A: op N is (k x m) with ld k, op T is (m x k) with ld m */
    MR_TRY(lt_layout(&e->lb, tab, g->ta ? g->m : g->k, g->ta ? g->k : g->m, g->ta ? g->m : g->k, g->batch,
                     g->stride_a));
    /* C and D = our C^T: (n x m) with ld n */
    MR_TRY(lt_layout(&e->lc, tc, g->n, g->m, g->n, g->batch, g->stride_c));
    MR_TRY_LT(cublasLtMatmulPreferenceCreate(&pref));
    MR_TRY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    MR_TRY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->align[1],
                                                   sizeof k->align[1]));
    MR_TRY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->align[0],
                                                   sizeof k->align[0]));
    MR_TRY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->align[2],
                                                   sizeof k->align[2]));
    MR_TRY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->align[3],
                                                   sizeof k->align[3]));
    {
        /* NOT_SUPPORTED (or no result) means no algorithm for this configuration: the caller
         * falls back; any other failure is an error */
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, e->desc, e->la, e->lb, e->lc, e->lc, pref, 1, &res,
                                                           &found);
        if (hs == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
            e->algo = res.algo;
            e->has_algo = 1;
        } else if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED && hs != CUBLAS_STATUS_INVALID_VALUE) {
            MR_TRY_LT(hs);
        }
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    e->used = 1;
    return MR_OK;
fail:
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    lt_entry_clear(e);
    return st;
}

/* Runs g through cuBLASLt with epilogue `epi` into D (C read from D when beta != 0). *ran is 1
 * when the matmul was enqueued, 0 when cuBLASLt has no algorithm for it (nothing was done: the
 * caller falls back). Errors otherwise. */
static mr_status lt_matmul(const gemm_problem *g, cublasLtEpilogue_t epi, const void *bias, void *aux, void *D,
                           int *ran) {
    mr_status st = MR_OK;
    lt_key k;
    lt_entry *e = NULL;
    void *ws = NULL;
    size_t ws_bytes = 0;
    float alpha = (float)g->alpha, beta = (float)g->beta;
    size_t eab = mr_dtype_size(g->tab), ec = mr_dtype_size(g->tc);
    cublasLtHandle_t h = NULL;
    *ran = 0;
    if (g->device < 0 || g->device >= LT_MAX_DEVICES)
        return mr_set_error(MR_ERR_INVALID, "gemm: device index %d out of range [0, %d)", g->device, LT_MAX_DEVICES);
    pthread_mutex_lock(&g_lt_mu);
    if (!g_lt_handle[g->device]) MR_TRY_LT(cublasLtCreate(&g_lt_handle[g->device]));
    h = g_lt_handle[g->device];
    lt_workspace(g->device, g->stream, &ws, &ws_bytes);
    memset(&k, 0, sizeof k);
    k.device = g->device;
    k.tab = (int)g->tab;
    k.tc = (int)g->tc;
    k.compute = (int)(g->tab == MR_F32 && g->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
    k.ta = g->ta;
    k.tb = g->tb;
    k.epilogue = (uint32_t)epi;
    k.m = g->m;
    k.n = g->n;
    k.k = g->k;
    k.batch = g->batch;
    k.stride_a = g->stride_a;
    k.stride_b = g->stride_b;
    k.stride_c = g->stride_c;
    {
        int b = g->batch > 1;
        k.align[0] = align_of(g->A, b ? g->stride_a * (int64_t)eab : 0);
        k.align[1] = align_of(g->B, b ? g->stride_b * (int64_t)eab : 0);
        k.align[2] = align_of(D, b ? g->stride_c * (int64_t)ec : 0);
        k.align[3] = k.align[2];
        k.align[4] = bias ? align_of(bias, 0) : 0;
        k.align[5] = aux ? align_of(aux, b ? g->stride_c * (int64_t)ec : 0) : 0;
    }
    k.ws_bytes = ws_bytes;
    for (int i = 0; i < LT_CACHE && !e; i++)
        if (g_lt_cache[i].used && !memcmp(&g_lt_cache[i].key, &k, sizeof k)) e = &g_lt_cache[i];
    if (!e) {
        for (int i = 0; i < LT_CACHE && !e; i++)
            if (!g_lt_cache[i].used) e = &g_lt_cache[i];
        if (!e) {
            e = &g_lt_cache[g_lt_next];
            g_lt_next = (g_lt_next + 1) % LT_CACHE;
            lt_entry_clear(e);
        }
        MR_TRY(lt_entry_build(e, &k, g, h, bias, aux));
    }
    if (!e->has_algo) goto done;
    if (epi & CUBLASLT_EPILOGUE_BIAS)
        MR_TRY_LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
        MR_TRY_LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    {
        cublasStatus_t ms = cublasLtMatmul(h, e->desc, &alpha, g->B, e->la, g->A, e->lb, &beta, D, e->lc, D, e->lc,
                                           &e->algo, ws, ws_bytes, g->stream);
        if (ms == CUBLAS_STATUS_NOT_SUPPORTED) {
            /* a configuration the heuristic accepted but the launch rejects: remember it */
            e->has_algo = 0;
            goto done;
        }
        MR_TRY_LT(ms);
    }
    *ran = 1;
done:
    pthread_mutex_unlock(&g_lt_mu);
    return MR_OK;
fail:
    pthread_mutex_unlock(&g_lt_mu);
    return st;
}

/* ---- cuBLAS: f64, and the fallback -------------------------------------------------------------- */

/* Runs g through cuBLAS into D (C read from D when beta != 0), no epilogue. */
static mr_status blas_matmul(const mr_op_args *a, const gemm_problem *g, void *D) {
    mr_status st = MR_OK;
    cublasHandle_t h = NULL;
    cublasOperation_t op_a = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    /* cuBLAS rejects a leading dimension of 0 even when k == 0 (then C = beta*C) */
    int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
    int im = (int)g->m, in = (int)g->n, ik = (int)g->k, ib = (int)g->batch;
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    MR_TRY(mr_cuda_blas_handle(a->stream, a->device, &h));
    if (g->tab == MR_F64) {
        double alpha = g->alpha, beta = g->beta;
        MR_TRY_CUBLAS(cublasDgemmStridedBatched(h, op_b, op_a, in, im, ik, &alpha, (const double *)g->B, (int)ldb,
                                                g->stride_b, (const double *)g->A, (int)lda, g->stride_a, &beta,
                                                (double *)D, in, g->stride_c, ib));
    } else {
        /* with a 32F compute type the scalars are floats */
        float alpha = (float)g->alpha, beta = (float)g->beta;
        cudaDataType t = cuda_type(g->tab), tc = cuda_type(g->tc);
        cublasComputeType_t ct = g->tab == MR_F32 && g->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        MR_TRY_CUBLAS(cublasGemmStridedBatchedEx(h, op_b, op_a, in, im, ik, &alpha, g->B, t, (int)ldb, g->stride_b,
                                                 g->A, t, (int)lda, g->stride_a, &beta, D, tc, in, g->stride_c, ib,
                                                 ct, CUBLAS_GEMM_DEFAULT));
    }
    return MR_OK;
fail:
    return st;
}

/* ---- the op ------------------------------------------------------------------------------------- */

extern "C" mr_status mr_gemm_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    const mr_shape *sa = &a->in[0].shape, *sb = &a->in[1].shape, *sc = &a->out[0].shape;
    const mr_gemm_params *p = &a->p.gemm;
    /* A (batch?,M,K) or (batch?,K,M) if trans_a; B (batch?,K,N) or (batch?,N,K) if trans_b;
     * bias (N) or NULL; C and pre (batch?,M,N), pre NULL when absent */
    const void *bias = a->in[2].data;
    void *C = a->out[0].data, *pre = a->out[1].data;
    int gelu = p->epilogue == MR_GEMM_EPI_GELU;
    int64_t m = sc->dim[sc->ndim - 2], n = sc->dim[sc->ndim - 1];
    int64_t k = p->trans_a ? sa->dim[sa->ndim - 2] : sa->dim[sa->ndim - 1];
    int64_t batch = 1, total;
    gemm_problem g;
    int ran = 0;
    for (int i = 0; i < sc->ndim - 2; i++) batch *= sc->dim[i];
    int b_shared = sb->ndim == 2 && batch > 1;
    if (m == 0 || n == 0 || batch == 0) return MR_OK;
    total = batch * m * n;
    memset(&g, 0, sizeof g);
    g.device = a->stream ? a->stream->device : a->device;
    g.tab = a->in[0].dtype;
    g.tc = a->out[0].dtype;
    g.ta = p->trans_a;
    g.tb = p->trans_b;
    g.tf32 = p->allow_tf32 != 0;
    g.A = a->in[0].data;
    g.B = a->in[1].data;
    g.alpha = p->alpha;
    g.beta = p->beta;
    g.stride_a = m * k;
    g.stride_b = b_shared ? 0 : k * n;
    g.stride_c = m * n;
    if (b_shared && !p->trans_a) {
        /* a shared B with untransposed A: the batch folds into M, one GEMM instead of many */
        m *= batch;
        batch = 1;
    }
    g.m = m;
    g.n = n;
    g.k = k;
    g.batch = batch;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX) {
        char b1[96], b2[96];
        return mr_set_error(MR_ERR_UNSUPPORTED, "gemm: A %s, B %s: a dimension exceeds cuBLAS's int range",
                            mr_shape_str(sa, b1, 96), mr_shape_str(sb, b2, 96));
    }
    if (!(g.tab == MR_F32 || g.tab == MR_F64 || g.tab == MR_F16 || g.tab == MR_BF16))
        return mr_op_error(a, "the CUDA kernel takes f32, f64, f16 or bf16, got %s", mr_dtype_name(g.tab));
    MR_TRY(mr_cuda_op_stream(a, &g.stream));
    if (g.tab != MR_F64 && k > 0) {
        /* the whole op in one cuBLASLt call when it has an algorithm for the fused epilogue; the
         * aux ld (n) must be a multiple of 8 */
        int fused = !(gelu && pre && n % 8 != 0);
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
        if (gelu)
            epi = pre ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                      : (bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
        else if (bias)
            epi = CUBLASLT_EPILOGUE_BIAS;
        if (fused) {
            MR_TRY(lt_matmul(&g, epi, bias, pre, C, &ran));
            if (ran) return MR_OK;
        }
    }
    {
        /* the product (alpha*op(A)op(B) + beta*C) first, then the epilogue kernel over it; with
         * GELU and pre the product lands in pre (beta is 0 with GELU: C is not read) */
        int epi_kernel = gelu || bias;
        void *D = gelu && pre ? pre : C;
        char why[320] = "";
        if (g.tab != MR_F64 && k > 0) {
            MR_TRY(lt_matmul(&g, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, D, &ran));
            if (!ran) snprintf(why, sizeof why, "cuBLASLt has no algorithm for it; ");
        }
        if (!ran) {
            st = blas_matmul(a, &g, D);
            if (st != MR_OK) {
                char b1[96], b2[96], b3[96];
                if (why[0]) {
                    snprintf(why + strlen(why), sizeof why - strlen(why), "%s", mr_last_error());
                    return mr_set_error(st, "gemm: A %s %s, B %s, C %s: %s", mr_shape_str(sa, b1, 96),
                                        mr_dtype_name(g.tab), mr_shape_str(sb, b2, 96), mr_shape_str(sc, b3, 96), why);
                }
                return st;
            }
        }
        if (epi_kernel) MR_TRY(run_epilogue(g.tc, D, C, gelu ? pre : NULL, bias, total, n, gelu, g.stream));
    }
    return MR_OK;
fail:
    return st;
}
