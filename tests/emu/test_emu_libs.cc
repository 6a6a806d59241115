/* emu.test_emu_libs: the emulated cuBLAS, cuBLASLt and cuDNN (tests/emu/emu_blas.cc, emu_dnn.cc)
 * called directly through their real headers' API, on device memory of the emulated runtime,
 * against naive double loops written here: every cuBLASLt epilogue mirror uses, the four transpose
 * combinations, strided batches, padded leading dimensions, f16/bf16 inputs with f16/bf16/f32
 * outputs, FAST_TF32's input rounding, alpha/beta scaling (beta == 0 over NaN output: not read),
 * cuBLAS's strided-batched GEMMs and their status codes, cuDNN's forward/backward-data/
 * backward-filter/backward-bias/add-tensor with alpha/beta accumulation; then misuse cases, each in
 * a forked child that must die with a "mirror-emu:" message naming the library.
 *
 * Inputs are multiples of 1/8 in [-2, 2], exact in bf16, so the double reference is exact and the
 * only rounding is the fake's one rounding to the output type: the tolerances are an ulp or two of
 * the output type. Plain checks, no framework: prints each failure, exits 1 on any. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
/* The fakes keep each destroyed handle and descriptor (marked dead, not freed) so that a later use
 * is reported rather than undefined; nothing points at them any more, so LeakSanitizer reports
 * them. Those objects only: anything else this test leaks is still a failure. */
extern "C" const char *__lsan_default_suppressions(void) {
    return "leak:cublasCreate_v2\nleak:cublasLtCreate\nleak:cublasLtMatmulDescCreate\n"
           "leak:cublasLtMatrixLayoutCreate\nleak:cublasLtMatmulPreferenceCreate\nleak:cudnnCreate\n";
}
#endif

namespace {

static int g_fail = 0, g_checks = 0, g_known = 0;

/* A rule the fakes are known to break today (a finding reported to the fakes' owner): printed as
 * KNOWN and not counted as a failure, so the suite stays green until the fake is fixed; once it
 * is, the check passes and "fixed" is printed: drop the known flag then. */
static void known(const char *what, bool ok) {
    if (ok)
        printf("fixed: %s now holds: remove its known flag in test_emu_libs.cc\n", what);
    else {
        g_known++;
        printf("KNOWN (a bug of the fake, not counted): %s\n", what);
    }
}

#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        g_checks++;                                                                                                \
        if (!(cond)) {                                                                                             \
            g_fail++;                                                                                              \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                        \
            fprintf(stderr, __VA_ARGS__);                                                                          \
            fprintf(stderr, "\n");                                                                                 \
        }                                                                                                          \
    } while (0)

/* A call that must succeed; aborts the test when not (nothing after it would mean anything). */
#define MUST(call)                                                                                                 \
    do {                                                                                                           \
        long mr_s_ = (long)(call);                                                                                 \
        if (mr_s_ != 0) {                                                                                          \
            fprintf(stderr, "FAIL %s:%d: %s returned %ld\n", __FILE__, __LINE__, #call, mr_s_);                    \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

/* ---- host-side values of the four types ------------------------------------------------------- */

static size_t tsize(cudaDataType t) { return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2; }

static double hget(const std::vector<uint8_t> &v, size_t i, cudaDataType t) {
    const void *p = v.data();
    switch (t) {
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    default: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    }
}

static void hset(std::vector<uint8_t> &v, size_t i, cudaDataType t, double x) {
    void *p = v.data();
    switch (t) {
    case CUDA_R_64F: ((double *)p)[i] = x; break;
    case CUDA_R_32F: ((float *)p)[i] = (float)x; break;
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn((float)x); break;
    default: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)x); break;
    }
}

/* one ulp-ish of the output type, relative to max(1, |ref|) */
static double tol_of(cudaDataType t) {
    switch (t) {
    case CUDA_R_64F: return 1e-12;
    case CUDA_R_32F: return 2.5e-7;
    case CUDA_R_16F: return 1.0e-3;
    default: return 8.0e-3;
    }
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double rnd8(void) { /* a multiple of 1/8 in [-2, 2] */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)((int)((g_rng >> 33) % 33) - 16) / 8.0;
}

static std::vector<uint8_t> hrand(size_t n, cudaDataType t) {
    std::vector<uint8_t> v(n * tsize(t));
    for (size_t i = 0; i < n; i++) hset(v, i, t, rnd8());
    return v;
}

static void *dput(const std::vector<uint8_t> &h) {
    void *d = NULL;
    MUST(cudaMalloc(&d, h.size() ? h.size() : 1));
    if (h.size()) MUST(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
    return d;
}

static void *dalloc(size_t bytes) {
    void *d = NULL;
    MUST(cudaMalloc(&d, bytes ? bytes : 1));
    return d;
}

/* a blocking copy: synchronizes, so the queued library work has run */
static std::vector<uint8_t> dget(const void *d, size_t bytes) {
    std::vector<uint8_t> h(bytes);
    MUST(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

static const char *tname(cudaDataType t) {
    return t == CUDA_R_64F ? "f64" : t == CUDA_R_32F ? "f32" : t == CUDA_R_16F ? "f16" : "bf16";
}

/* compares n elements of got (type t) with ref; reports the first few mismatches under `what` */
static void compare(const char *what, const std::vector<uint8_t> &got, const std::vector<double> &ref, cudaDataType t,
                    bool is_known = false) {
    int bad = 0;
    double tol = tol_of(t);
    for (size_t i = 0; i < ref.size(); i++) {
        double g = hget(got, i, t), r = ref[i];
        bool ok = fabs(g - r) <= tol * (fabs(r) > 1 ? fabs(r) : 1);
        g_checks++;
        if (!ok) {
            if (bad < 4) fprintf(is_known ? stdout : stderr, "%s %s: element %zu: got %.9g, want %.9g\n",
                                 is_known ? "KNOWN" : "FAIL", what, i, g, r);
            bad++;
        }
    }
    if (is_known) {
        known(what, bad == 0);
        return;
    }
    if (bad) {
        g_fail++;
        fprintf(stderr, "FAIL %s: %d of %zu elements differ\n", what, bad, ref.size());
    }
}

/* ---- cuBLASLt ---------------------------------------------------------------------------------- */

struct lt_case {
    cudaDataType tin, tout;
    bool ta, tb;
    int m, n, k, batch;
    cublasLtEpilogue_t epi;
    float alpha, beta;
    cublasComputeType_t compute;
    int pad; /* extra rows in A's and B's leading dimension */
};

static const char *epi_name(cublasLtEpilogue_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU: return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    default: return "?";
    }
}

/* Every object of one cuBLASLt problem (column-major, as the library sees it). */
struct lt_problem {
    lt_case c;
    int64_t ar, ac, lda, br, bc, ldb, ldc, auxld;
    int64_t sa, sb, sc, saux;
    std::vector<uint8_t> hA, hB, hC, hbias;
    void *A, *B, *D, *bias, *aux;
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res;
    void *ws;
    size_t ws_bytes;
};

static bool has_bias(cublasLtEpilogue_t e) { return (e & CUBLASLT_EPILOGUE_BIAS) != 0; }
static bool has_aux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }

static void lt_layout(cublasLtMatrixLayout_t *l, cudaDataType t, int64_t r, int64_t c, int64_t ld, int batch,
                      int64_t stride) {
    MUST(cublasLtMatrixLayoutCreate(l, t, (uint64_t)r, (uint64_t)c, ld));
    if (batch > 1) {
        int32_t b = batch;
        MUST(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
        MUST(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
}

/* Builds the problem: data, descriptor, layouts, preference (32 MiB workspace allowed) and the
 * heuristic's algorithm with a workspace of the size it asks for. */
static void lt_setup(lt_problem &p, const lt_case &c) {
    p.c = c;
    p.ar = c.ta ? c.k : c.m;
    p.ac = c.ta ? c.m : c.k;
    p.lda = p.ar + c.pad;
    p.br = c.tb ? c.n : c.k;
    p.bc = c.tb ? c.k : c.n;
    p.ldb = p.br + c.pad;
    p.ldc = c.m;
    p.auxld = (c.m + 7) / 8 * 8;
    p.sa = p.lda * p.ac;
    p.sb = p.ldb * p.bc;
    p.sc = p.ldc * c.n;
    p.saux = p.auxld * c.n;
    p.hA = hrand((size_t)(p.sa * c.batch), c.tin);
    p.hB = hrand((size_t)(p.sb * c.batch), c.tin);
    p.hC = hrand((size_t)(p.sc * c.batch), c.tout);
    p.hbias = hrand((size_t)c.m, c.tout);
    p.A = dput(p.hA);
    p.B = dput(p.hB);
    /* D is C (in place, as mirror calls it); with beta == 0 it keeps the runtime's NaN poison */
    p.D = c.beta != 0 ? dput(p.hC) : dalloc(p.hC.size());
    p.bias = has_bias(c.epi) ? dput(p.hbias) : NULL;
    p.aux = has_aux(c.epi) ? dalloc((size_t)(p.saux * c.batch) * tsize(c.tout)) : NULL;
    MUST(cublasLtCreate(&p.h));
    MUST(cublasLtMatmulDescCreate(&p.desc, c.compute, c.tin == CUDA_R_64F ? CUDA_R_64F : CUDA_R_32F));
    cublasOperation_t oa = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint32_t epi = c.epi;
    MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
    MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
    MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (p.bias) MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof p.bias));
    if (p.aux) {
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof p.aux));
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p.auxld, sizeof p.auxld));
        if (c.batch > 1)
            MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &p.saux,
                                                sizeof p.saux));
    }
    lt_layout(&p.la, c.tin, p.ar, p.ac, p.lda, c.batch, p.sa);
    lt_layout(&p.lb, c.tin, p.br, p.bc, p.ldb, c.batch, p.sb);
    lt_layout(&p.lc, c.tout, c.m, c.n, p.ldc, c.batch, p.sc);
    MUST(cublasLtMatmulPreferenceCreate(&p.pref));
    uint64_t max_ws = 32u << 20;
    MUST(cublasLtMatmulPreferenceSetAttribute(p.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws));
    int found = 0;
    memset(&p.res, 0, sizeof p.res);
    MUST(cublasLtMatmulAlgoGetHeuristic(p.h, p.desc, p.la, p.lb, p.lc, p.lc, p.pref, 1, &p.res, &found));
    CHECK(found == 1 && p.res.state == CUBLAS_STATUS_SUCCESS, "heuristic: found %d, state %d", found, (int)p.res.state);
    CHECK(p.res.workspaceSize <= max_ws, "heuristic wants %zu bytes of workspace, the preference allows %llu",
          p.res.workspaceSize, (unsigned long long)max_ws);
    p.ws_bytes = p.res.workspaceSize;
    p.ws = p.ws_bytes ? dalloc(p.ws_bytes) : NULL;
}

static cublasStatus_t lt_run(lt_problem &p) {
    double a64 = p.c.alpha, b64 = p.c.beta;
    const void *alpha = &p.c.alpha, *beta = &p.c.beta;
    if (p.c.tin == CUDA_R_64F) {
        alpha = &a64;
        beta = &b64;
    }
    return cublasLtMatmul(p.h, p.desc, alpha, p.A, p.la, p.B, p.lb, beta, p.D, p.lc, p.D, p.lc, &p.res.algo, p.ws,
                          p.ws_bytes, (cudaStream_t)0);
}

static void lt_free(lt_problem &p) {
    MUST(cublasLtMatmulPreferenceDestroy(p.pref));
    MUST(cublasLtMatrixLayoutDestroy(p.la));
    MUST(cublasLtMatrixLayoutDestroy(p.lb));
    MUST(cublasLtMatrixLayoutDestroy(p.lc));
    MUST(cublasLtMatmulDescDestroy(p.desc));
    MUST(cublasLtDestroy(p.h));
    void *bufs[] = {p.A, p.B, p.D, p.bias, p.aux, p.ws};
    for (void *b : bufs)
        if (b) MUST(cudaFree(b));
}

static double tf32_round(double v) { /* nearest, ties to even, to 10 mantissa bits */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x0fffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&f, &u, 4);
    return f;
}

/* the reference of D (and the aux matrix): D = epi(alpha op(A) op(B) + beta C + bias) */
static void lt_reference(const lt_problem &p, std::vector<double> &D, std::vector<double> &aux) {
    const lt_case &c = p.c;
    bool tf = c.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    D.assign((size_t)(p.sc * c.batch), 0.0);
    aux.assign(p.aux ? (size_t)(p.saux * c.batch) : 0, 0.0);
    for (int q = 0; q < c.batch; q++)
        for (int j = 0; j < c.n; j++)
            for (int i = 0; i < c.m; i++) {
                double acc = 0;
                for (int l = 0; l < c.k; l++) {
                    double a = hget(p.hA, (size_t)(q * p.sa + (c.ta ? l + i * p.lda : i + l * p.lda)), c.tin);
                    double b = hget(p.hB, (size_t)(q * p.sb + (c.tb ? j + l * p.ldb : l + j * p.ldb)), c.tin);
                    if (tf) {
                        a = tf32_round(a);
                        b = tf32_round(b);
                    }
                    acc += a * b;
                }
                double v = c.alpha * acc;
                if (c.beta != 0) v += c.beta * hget(p.hC, (size_t)(q * p.sc + i + j * p.ldc), c.tout);
                if (has_bias(c.epi)) v += hget(p.hbias, (size_t)i, c.tout);
                if (c.epi & CUBLASLT_EPILOGUE_GELU) {
                    if (p.aux) aux[(size_t)(q * p.saux + i + j * p.auxld)] = v;
                    v = gelu_ref(v);
                }
                D[(size_t)(q * p.sc + i + j * p.ldc)] = v;
            }
}

static void lt_check(const lt_case &c) {
    char what[200];
    snprintf(what, sizeof what, "cublasLtMatmul %s->%s %c%c m%d n%d k%d batch %d %s alpha %g beta %g%s pad %d",
             tname(c.tin), tname(c.tout), c.ta ? 'T' : 'N', c.tb ? 'T' : 'N', c.m, c.n, c.k, c.batch, epi_name(c.epi),
             c.alpha, c.beta, c.compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? " tf32" : "", c.pad);
    lt_problem p;
    lt_setup(p, c);
    cublasStatus_t s = lt_run(p);
    CHECK(s == CUBLAS_STATUS_SUCCESS, "%s: status %d", what, (int)s);
    std::vector<double> D, aux;
    lt_reference(p, D, aux);
    compare(what, dget(p.D, D.size() * tsize(c.tout)), D, c.tout);
    if (p.aux) {
        /* only the aux elements inside the m rows of each column are defined */
        std::vector<uint8_t> got = dget(p.aux, aux.size() * tsize(c.tout));
        std::vector<double> ref;
        std::vector<uint8_t> sel;
        for (int q = 0; q < c.batch; q++)
            for (int j = 0; j < c.n; j++)
                for (int i = 0; i < c.m; i++) {
                    size_t at = (size_t)(q * p.saux + i + j * p.auxld);
                    ref.push_back(aux[at]);
                    sel.insert(sel.end(), got.begin() + at * tsize(c.tout), got.begin() + (at + 1) * tsize(c.tout));
                }
        std::string w2 = std::string(what) + " (aux)";
        compare(w2.c_str(), sel, ref, c.tout);
    }
    lt_free(p);
}

static void test_lt(void) {
    const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_DEFAULT,  CUBLASLT_EPILOGUE_BIAS,
                                       CUBLASLT_EPILOGUE_GELU,     CUBLASLT_EPILOGUE_GELU_BIAS,
                                       CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
    /* every transpose combination, with and without padded leading dimensions, batched */
    for (int t = 0; t < 4; t++)
        for (int pad = 0; pad < 2; pad++)
            lt_check({CUDA_R_32F, CUDA_R_32F, (t & 1) != 0, (t & 2) != 0, 5, 7, 3, 1 + pad, CUBLASLT_EPILOGUE_DEFAULT,
                      1.0f, 0.0f, CUBLAS_COMPUTE_32F, pad * 2});
    /* every epilogue, f32 and with the half types (same-type and f32 output), batched */
    for (cublasLtEpilogue_t e : epis) {
        lt_check({CUDA_R_32F, CUDA_R_32F, false, true, 6, 5, 4, 1, e, 1.0f, 0.0f, CUBLAS_COMPUTE_32F, 0});
        lt_check({CUDA_R_32F, CUDA_R_32F, true, false, 9, 3, 5, 3, e, 0.5f, 0.0f, CUBLAS_COMPUTE_32F, 1});
        lt_check({CUDA_R_16F, CUDA_R_16F, false, false, 8, 4, 6, 2, e, 1.0f, 0.0f, CUBLAS_COMPUTE_32F, 0});
        lt_check({CUDA_R_16BF, CUDA_R_16BF, true, true, 7, 6, 5, 1, e, 1.0f, 0.0f, CUBLAS_COMPUTE_32F, 0});
        lt_check({CUDA_R_16BF, CUDA_R_32F, false, true, 4, 5, 9, 2, e, 1.0f, 0.0f, CUBLAS_COMPUTE_32F, 0});
        lt_check({CUDA_R_16F, CUDA_R_32F, true, false, 3, 2, 7, 1, e, 1.0f, 0.0f, CUBLAS_COMPUTE_32F, 0});
    }
    /* alpha and beta: D = alpha AB + beta C (C read), with and without an epilogue */
    lt_check({CUDA_R_32F, CUDA_R_32F, false, false, 5, 4, 3, 2, CUBLASLT_EPILOGUE_DEFAULT, 0.75f, 0.5f,
              CUBLAS_COMPUTE_32F, 0});
    lt_check({CUDA_R_32F, CUDA_R_32F, true, true, 5, 4, 3, 1, CUBLASLT_EPILOGUE_BIAS, 2.0f, 1.0f, CUBLAS_COMPUTE_32F, 0});
    lt_check({CUDA_R_16BF, CUDA_R_16BF, false, true, 8, 3, 3, 1, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 1.0f, -1.0f,
              CUBLAS_COMPUTE_32F, 0});
    /* FAST_TF32 on exact inputs is the f32 result */
    lt_check({CUDA_R_32F, CUDA_R_32F, false, true, 6, 5, 4, 2, CUBLASLT_EPILOGUE_GELU_BIAS, 1.0f, 0.0f,
              CUBLAS_COMPUTE_32F_FAST_TF32, 0});

    /* FAST_TF32 rounds the inputs to 10 mantissa bits; COMPUTE_32F does not: A = 1 + 2^-12, B = 1 */
    for (int tf = 0; tf < 2; tf++) {
        lt_problem p;
        lt_setup(p, {CUDA_R_32F, CUDA_R_32F, false, false, 1, 1, 1, 1, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.0f,
                     tf ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, 0});
        float a = 1.0f + ldexpf(1.0f, -12), b = 1.0f, d = 0;
        MUST(cudaMemcpy(p.A, &a, 4, cudaMemcpyHostToDevice));
        MUST(cudaMemcpy(p.B, &b, 4, cudaMemcpyHostToDevice));
        MUST(lt_run(p));
        MUST(cudaMemcpy(&d, p.D, 4, cudaMemcpyDeviceToHost));
        CHECK(d == (tf ? 1.0f : a), "%s: (1 + 2^-12) * 1 = %.9g", tf ? "FAST_TF32" : "COMPUTE_32F", d);
        lt_free(p);
    }

    /* the work runs in stream order, not at the call: the host reads D only after synchronizing */
    {
        lt_problem p;
        lt_setup(p, {CUDA_R_32F, CUDA_R_32F, false, false, 2, 2, 2, 1, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.0f,
                     CUBLAS_COMPUTE_32F, 0});
        MUST(lt_run(p));
        MUST(cudaDeviceSynchronize());
        std::vector<double> D, aux;
        lt_reference(p, D, aux);
        compare("cublasLtMatmul after cudaDeviceSynchronize", dget(p.D, 16), D, CUDA_R_32F);
        lt_free(p);
    }

    /* statuses: a leading dimension below the rows is rejected with a status, not an abort */
    {
        cublasLtMatrixLayout_t l = NULL;
        CHECK(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 3, 3) == CUBLAS_STATUS_INVALID_VALUE,
              "cublasLtMatrixLayoutCreate with ld 3 < rows 4");
        cublasLtHandle_t h;
        cublasLtMatmulDesc_t d;
        cublasLtMatrixLayout_t a, b, c;
        cublasLtMatmulPreference_t pr;
        MUST(cublasLtCreate(&h));
        MUST(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        MUST(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 2, 2, 2));
        MUST(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 2, 2, 2));
        MUST(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, 2, 2, 2));
        MUST(cublasLtMatmulPreferenceCreate(&pr));
        cublasLtMatmulHeuristicResult_t r;
        int found = 0;
        CHECK(cublasLtMatmulAlgoGetHeuristic(h, d, a, b, c, c, pr, 0, &r, &found) == CUBLAS_STATUS_INVALID_VALUE,
              "cublasLtMatmulAlgoGetHeuristic with requestedAlgoCount 0");
        /* the default preference allows no workspace: the algorithm returned needs none */
        CHECK(cublasLtMatmulAlgoGetHeuristic(h, d, a, b, c, c, pr, 1, &r, &found) == CUBLAS_STATUS_SUCCESS &&
                  found == 1 && r.workspaceSize == 0,
              "heuristic with the default preference (no workspace): found %d, workspace %zu", found, r.workspaceSize);
        MUST(cublasLtMatmulPreferenceDestroy(pr));
        MUST(cublasLtMatrixLayoutDestroy(a));
        MUST(cublasLtMatrixLayoutDestroy(b));
        MUST(cublasLtMatrixLayoutDestroy(c));
        MUST(cublasLtMatmulDescDestroy(d));
        MUST(cublasLtDestroy(h));
        const char *s = cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED);
        CHECK(s && strstr(s, "NOT_SUPPORTED"), "cublasLtGetStatusString(NOT_SUPPORTED) = %s", s ? s : "(null)");
    }
}

/* ---- cuBLAS ------------------------------------------------------------------------------------ */

/* C (m x n, ldc m, batch strides) = alpha op(A) op(B) + beta C through cublasGemmStridedBatchedEx
 * (f32/f16/bf16 inputs) or cublasDgemmStridedBatched (f64) */
static void blas_check(cudaDataType tin, cudaDataType tout, bool ta, bool tb, int m, int n, int k, int batch,
                       double alpha, double beta, int pad) {
    char what[160];
    snprintf(what, sizeof what, "cuBLAS %s %s->%s %c%c m%d n%d k%d batch %d alpha %g beta %g pad %d",
             tin == CUDA_R_64F ? "cublasDgemmStridedBatched" : "cublasGemmStridedBatchedEx", tname(tin), tname(tout),
             ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, batch, alpha, beta, pad);
    int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int lda = ar + pad, ldb = br + pad, ldc = m + pad;
    long long sa = (long long)lda * ac, sb = (long long)ldb * bc, sc = (long long)ldc * n;
    std::vector<uint8_t> hA = hrand((size_t)(sa * batch), tin), hB = hrand((size_t)(sb * batch), tin),
                         hC = hrand((size_t)(sc * batch), tout);
    void *A = dput(hA), *B = dput(hB), *C = beta != 0 ? dput(hC) : dalloc(hC.size());
    cublasHandle_t h;
    MUST(cublasCreate(&h));
    MUST(cublasSetStream(h, (cudaStream_t)0));
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (tin == CUDA_R_64F) {
        s = cublasDgemmStridedBatched(h, oa, ob, m, n, k, &alpha, (const double *)A, lda, sa, (const double *)B, ldb, sb,
                                      &beta, (double *)C, ldc, sc, batch);
    } else {
        float fa = (float)alpha, fb = (float)beta;
        s = cublasGemmStridedBatchedEx(h, oa, ob, m, n, k, &fa, A, tin, lda, sa, B, tin, ldb, sb, &fb, C, tout, ldc, sc,
                                       batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    CHECK(s == CUBLAS_STATUS_SUCCESS, "%s: status %d", what, (int)s);
    std::vector<uint8_t> got = dget(C, hC.size());
    /* compare the m x n part of each column; the padding rows of C are not written */
    std::vector<double> ref;
    std::vector<uint8_t> sel;
    for (int q = 0; q < batch; q++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double acc = 0;
                for (int l = 0; l < k; l++)
                    acc += hget(hA, (size_t)(q * sa + (ta ? l + i * lda : i + l * lda)), tin) *
                           hget(hB, (size_t)(q * sb + (tb ? j + l * ldb : l + j * ldb)), tin);
                size_t at = (size_t)(q * sc + i + j * ldc);
                double v = alpha * acc + (beta != 0 ? beta * hget(hC, at, tout) : 0.0);
                ref.push_back(v);
                sel.insert(sel.end(), got.begin() + at * tsize(tout), got.begin() + (at + 1) * tsize(tout));
            }
    compare(what, sel, ref, tout);
    MUST(cublasDestroy(h));
    MUST(cudaFree(A));
    MUST(cudaFree(B));
    MUST(cudaFree(C));
}

static void test_blas(void) {
    for (int t = 0; t < 4; t++) {
        blas_check(CUDA_R_32F, CUDA_R_32F, t & 1, t & 2, 5, 4, 3, 2, 1.0, 0.0, t == 3 ? 2 : 0);
        blas_check(CUDA_R_64F, CUDA_R_64F, t & 1, t & 2, 4, 6, 5, 3, 1.0, 0.0, t == 1 ? 1 : 0);
    }
    blas_check(CUDA_R_32F, CUDA_R_32F, false, true, 6, 3, 4, 1, 0.5, 0.25, 1);
    blas_check(CUDA_R_64F, CUDA_R_64F, true, false, 3, 3, 7, 2, -1.5, 2.0, 0);
    blas_check(CUDA_R_16F, CUDA_R_32F, true, false, 4, 5, 6, 2, 1.0, 0.0, 0);
    blas_check(CUDA_R_16F, CUDA_R_16F, false, false, 4, 5, 6, 1, 1.0, 0.0, 0);
    blas_check(CUDA_R_16BF, CUDA_R_16BF, false, true, 3, 5, 8, 2, 1.0, 1.0, 0);
    blas_check(CUDA_R_16BF, CUDA_R_32F, true, true, 7, 2, 3, 1, 1.0, 0.0, 0);

    /* statuses the real library returns for bad values */
    cublasHandle_t h;
    MUST(cublasCreate(&h));
    void *d = dalloc(64 * 8);
    double one = 1, zero = 0;
    float f1 = 1, f0 = 0;
    CHECK(cublasDgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, (double *)d, 3, 16, (double *)d, 4, 16,
                                    &zero, (double *)d, 4, 16, 1) == CUBLAS_STATUS_INVALID_VALUE,
          "cublasDgemmStridedBatched with lda 3 < m 4");
    CHECK(cublasDgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, 4, 4, 4, &one, (double *)d, 4, 16, (double *)d, 3, 16,
                                    &zero, (double *)d, 4, 16, 1) == CUBLAS_STATUS_INVALID_VALUE,
          "cublasDgemmStridedBatched with ldb 3 < n 4 (B transposed)");
    CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 4, 4, &f1, d, CUDA_R_32F, 4, 16, d, CUDA_R_32F, 4,
                                     16, &f0, d, CUDA_R_32F, 4, 16, 1, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
          "cublasGemmStridedBatchedEx with m < 0");
    CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 4, 4, &f1, d, CUDA_R_32F, 4, 16, d, CUDA_R_32F, 4,
                                     16, &f0, d, CUDA_R_32F, 3, 16, 1, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
          "cublasGemmStridedBatchedEx with ldc 3 < m 4");
    MUST(cublasDestroy(h));
    MUST(cudaFree(d));
    int major = -1, minor = -1, patch = -1;
    CHECK(cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS && major == CUBLAS_VER_MAJOR,
          "cublasGetProperty(MAJOR_VERSION) = %d", major);
    CHECK(cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS && minor == CUBLAS_VER_MINOR,
          "cublasGetProperty(MINOR_VERSION) = %d", minor);
    CHECK(cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS && patch == CUBLAS_VER_PATCH,
          "cublasGetProperty(PATCH_LEVEL) = %d", patch);
    const char *s = cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE);
    CHECK(s && strstr(s, "INVALID_VALUE"), "cublasGetStatusString(INVALID_VALUE) = %s", s ? s : "(null)");
}

/* ---- cuDNN ------------------------------------------------------------------------------------- */

struct conv_case {
    cudnnDataType_t t;
    int n, c, h, w, o, kh, kw, sh, sw, ph, pw;
};

static cudaDataType dnn2cuda(cudnnDataType_t t) { return t == CUDNN_DATA_DOUBLE ? CUDA_R_64F : CUDA_R_32F; }

struct conv_problem {
    conv_case g;
    int oh, ow;
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x, y, b;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
};

static size_t xi(const conv_problem &p, int n, int c, int y, int x) {
    return (((size_t)n * p.g.c + c) * p.g.h + y) * p.g.w + x;
}
static size_t wi(const conv_problem &p, int o, int c, int y, int x) {
    return (((size_t)o * p.g.c + c) * p.g.kh + y) * p.g.kw + x;
}
static size_t yi(const conv_problem &p, int n, int o, int y, int x) {
    return (((size_t)n * p.g.o + o) * p.oh + y) * p.ow + x;
}

/* calls f(x index, w index, y index) for each in-bounds tap */
static void conv_taps(const conv_problem &p, const std::function<void(size_t, size_t, size_t)> &f) {
    const conv_case &g = p.g;
    for (int n = 0; n < g.n; n++)
        for (int o = 0; o < g.o; o++)
            for (int oy = 0; oy < p.oh; oy++)
                for (int ox = 0; ox < p.ow; ox++)
                    for (int c = 0; c < g.c; c++)
                        for (int ky = 0; ky < g.kh; ky++)
                            for (int kx = 0; kx < g.kw; kx++) {
                                int iy = oy * g.sh - g.ph + ky, ix = ox * g.sw - g.pw + kx;
                                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                                f(xi(p, n, c, iy, ix), wi(p, o, c, ky, kx), yi(p, n, o, oy, ox));
                            }
}

static void conv_setup(conv_problem &p, const conv_case &g) {
    p.g = g;
    MUST(cudnnCreate(&p.h));
    MUST(cudnnSetStream(p.h, (cudaStream_t)0));
    MUST(cudnnCreateTensorDescriptor(&p.x));
    MUST(cudnnCreateTensorDescriptor(&p.y));
    MUST(cudnnCreateTensorDescriptor(&p.b));
    MUST(cudnnCreateFilterDescriptor(&p.w));
    MUST(cudnnCreateConvolutionDescriptor(&p.conv));
    MUST(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NCHW, g.t, g.n, g.c, g.h, g.w));
    MUST(cudnnSetFilter4dDescriptor(p.w, g.t, CUDNN_TENSOR_NCHW, g.o, g.c, g.kh, g.kw));
    MUST(cudnnSetConvolution2dDescriptor(p.conv, g.ph, g.pw, g.sh, g.sw, 1, 1, CUDNN_CROSS_CORRELATION, g.t));
    MUST(cudnnSetConvolutionMathType(p.conv, g.t == CUDNN_DATA_DOUBLE ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
    int dn = 0, dc = 0, dh = 0, dw = 0;
    MUST(cudnnGetConvolution2dForwardOutputDim(p.conv, p.x, p.w, &dn, &dc, &dh, &dw));
    p.oh = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
    p.ow = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
    CHECK(dn == g.n && dc == g.o && dh == p.oh && dw == p.ow, "output dim (%d,%d,%d,%d), want (%d,%d,%d,%d)", dn, dc, dh,
          dw, g.n, g.o, p.oh, p.ow);
    MUST(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, g.t, g.n, g.o, p.oh, p.ow));
    MUST(cudnnSetTensor4dDescriptor(p.b, CUDNN_TENSOR_NCHW, g.t, 1, g.o, 1, 1));
}

static void conv_free(conv_problem &p) {
    MUST(cudnnDestroyTensorDescriptor(p.x));
    MUST(cudnnDestroyTensorDescriptor(p.y));
    MUST(cudnnDestroyTensorDescriptor(p.b));
    MUST(cudnnDestroyFilterDescriptor(p.w));
    MUST(cudnnDestroyConvolutionDescriptor(p.conv));
    MUST(cudnnDestroy(p.h));
}

/* the algorithm field as an int, read without an enum load (a fake's id outside the enum's values
 * is UB to load as the enum: -fsanitize=enum reports it) */
template <class Perf> static int algo_of(const Perf &r) {
    int a;
    memcpy(&a, &r.algo, sizeof a);
    return a;
}

/* every algorithm the _v7 query returns that reports success, each with the workspace its size
 * query asks for (pass 0 forward, 1 backward data, 2 backward filter) */
static std::vector<std::pair<int, size_t>> conv_algos(conv_problem &p, int pass) {
    std::vector<std::pair<int, size_t>> out;
    int n = 0;
    if (pass == 0) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        MUST(cudnnGetConvolutionForwardAlgorithm_v7(p.h, p.x, p.w, p.conv, p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, r));
        for (int i = 0; i < n; i++) {
            size_t ws = 0;
            if (r[i].status != CUDNN_STATUS_SUCCESS) continue;
            int a = algo_of(r[i]);
            MUST(cudnnGetConvolutionForwardWorkspaceSize(p.h, p.x, p.w, p.conv, p.y, (cudnnConvolutionFwdAlgo_t)a, &ws));
            CHECK(ws == r[i].memory, "fwd algo %d: workspace size %zu, the perf result said %zu", a, ws, r[i].memory);
            out.push_back({a, ws});
        }
    } else if (pass == 1) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        MUST(cudnnGetConvolutionBackwardDataAlgorithm_v7(p.h, p.w, p.y, p.conv, p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                         &n, r));
        for (int i = 0; i < n; i++) {
            size_t ws = 0;
            if (r[i].status != CUDNN_STATUS_SUCCESS) continue;
            int a = algo_of(r[i]);
            MUST(cudnnGetConvolutionBackwardDataWorkspaceSize(p.h, p.w, p.y, p.conv, p.x, (cudnnConvolutionBwdDataAlgo_t)a,
                                                              &ws));
            out.push_back({a, ws});
        }
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        MUST(cudnnGetConvolutionBackwardFilterAlgorithm_v7(p.h, p.x, p.y, p.conv, p.w,
                                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, r));
        for (int i = 0; i < n; i++) {
            size_t ws = 0;
            if (r[i].status != CUDNN_STATUS_SUCCESS) continue;
            int a = algo_of(r[i]);
            MUST(cudnnGetConvolutionBackwardFilterWorkspaceSize(p.h, p.x, p.y, p.conv, p.w,
                                                                (cudnnConvolutionBwdFilterAlgo_t)a, &ws));
            out.push_back({a, ws});
        }
    }
    CHECK(!out.empty(), "pass %d: no algorithm", pass);
    return out;
}

/* alpha/beta of cuDNN: double for double data, float otherwise */
struct scal {
    float f;
    double d;
    const void *of(cudnnDataType_t t) const { return t == CUDNN_DATA_DOUBLE ? (const void *)&d : (const void *)&f; }
};
static scal S(double v) { return scal{(float)v, v}; }

static void conv_check(const conv_case &g) {
    conv_problem p;
    conv_setup(p, g);
    cudaDataType ct = dnn2cuda(g.t);
    size_t nx = (size_t)g.n * g.c * g.h * g.w, nw = (size_t)g.o * g.c * g.kh * g.kw, ny = (size_t)g.n * g.o * p.oh * p.ow;
    std::vector<uint8_t> hx = hrand(nx, ct), hw = hrand(nw, ct), hdy = hrand(ny, ct), hb = hrand((size_t)g.o, ct),
                         hprev = hrand(ny, ct), hprevx = hrand(nx, ct), hprevw = hrand(nw, ct), hprevb = hrand((size_t)g.o, ct);
    void *x = dput(hx), *w = dput(hw), *dy = dput(hdy), *b = dput(hb);
    char what[200];
    snprintf(what, sizeof what, "%s x (%d,%d,%d,%d) w (%d,%d,%d,%d) stride (%d,%d) pad (%d,%d)",
             g.t == CUDNN_DATA_DOUBLE ? "f64" : "f32", g.n, g.c, g.h, g.w, g.o, g.c, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw);
    std::vector<double> conv(ny, 0.0), dx(nx, 0.0), dw(nw, 0.0), db((size_t)g.o, 0.0);
    conv_taps(p, [&](size_t ix, size_t iw, size_t iy) {
        conv[iy] += hget(hx, ix, ct) * hget(hw, iw, ct);
        dx[ix] += hget(hdy, iy, ct) * hget(hw, iw, ct);
        dw[iw] += hget(hx, ix, ct) * hget(hdy, iy, ct);
    });
    for (int n = 0; n < g.n; n++)
        for (int o = 0; o < g.o; o++)
            for (int i = 0; i < p.oh * p.ow; i++) db[(size_t)o] += hget(hdy, ((size_t)n * g.o + o) * p.oh * p.ow + i, ct);
    scal one = S(1), zero = S(0), half = S(0.5), two = S(2);

    for (auto a : conv_algos(p, 0)) {
        char w2[400];
        void *ws = a.second ? dalloc(a.second) : NULL;
        /* beta 0 over the NaN poison: y = conv (y not read) */
        void *y = dalloc(ny * tsize(ct));
        MUST(cudnnConvolutionForward(p.h, one.of(g.t), p.x, x, p.w, w, p.conv, (cudnnConvolutionFwdAlgo_t)a.first, ws,
                                     a.second, zero.of(g.t), p.y, y));
        snprintf(w2, sizeof w2, "cudnnConvolutionForward algo %d, %s", a.first, what);
        compare(w2, dget(y, ny * tsize(ct)), conv, ct);
        /* y += bias (cudnnAddTensor, alpha 1, beta 1), then y = 0.5 conv + 2 y */
        MUST(cudnnAddTensor(p.h, one.of(g.t), p.b, b, one.of(g.t), p.y, y));
        std::vector<double> ref(ny);
        for (size_t i = 0; i < ny; i++) ref[i] = conv[i] + hget(hb, i / ((size_t)p.oh * p.ow) % (size_t)g.o, ct);
        snprintf(w2, sizeof w2, "cudnnAddTensor (bias, beta 1) after forward, %s", what);
        compare(w2, dget(y, ny * tsize(ct)), ref, ct);
        MUST(cudaFree(y));
        y = dput(hprev);
        MUST(cudnnConvolutionForward(p.h, half.of(g.t), p.x, x, p.w, w, p.conv, (cudnnConvolutionFwdAlgo_t)a.first, ws,
                                     a.second, two.of(g.t), p.y, y));
        for (size_t i = 0; i < ny; i++) ref[i] = 0.5 * conv[i] + 2 * hget(hprev, i, ct);
        snprintf(w2, sizeof w2, "cudnnConvolutionForward alpha 0.5 beta 2, algo %d, %s", a.first, what);
        compare(w2, dget(y, ny * tsize(ct)), ref, ct);
        MUST(cudaFree(y));
        if (ws) MUST(cudaFree(ws));
    }
    for (auto a : conv_algos(p, 1)) {
        char w2[400];
        void *ws = a.second ? dalloc(a.second) : NULL;
        void *gx = dalloc(nx * tsize(ct));
        MUST(cudnnConvolutionBackwardData(p.h, one.of(g.t), p.w, w, p.y, dy, p.conv, (cudnnConvolutionBwdDataAlgo_t)a.first,
                                          ws, a.second, zero.of(g.t), p.x, gx));
        snprintf(w2, sizeof w2, "cudnnConvolutionBackwardData algo %d, %s", a.first, what);
        compare(w2, dget(gx, nx * tsize(ct)), dx, ct);
        MUST(cudaFree(gx));
        gx = dput(hprevx);
        MUST(cudnnConvolutionBackwardData(p.h, two.of(g.t), p.w, w, p.y, dy, p.conv, (cudnnConvolutionBwdDataAlgo_t)a.first,
                                          ws, a.second, one.of(g.t), p.x, gx));
        std::vector<double> ref(nx);
        for (size_t i = 0; i < nx; i++) ref[i] = 2 * dx[i] + hget(hprevx, i, ct);
        snprintf(w2, sizeof w2, "cudnnConvolutionBackwardData alpha 2 beta 1 (accumulate), algo %d, %s", a.first, what);
        compare(w2, dget(gx, nx * tsize(ct)), ref, ct);
        MUST(cudaFree(gx));
        if (ws) MUST(cudaFree(ws));
    }
    for (auto a : conv_algos(p, 2)) {
        char w2[400];
        void *ws = a.second ? dalloc(a.second) : NULL;
        void *gw = dalloc(nw * tsize(ct));
        MUST(cudnnConvolutionBackwardFilter(p.h, one.of(g.t), p.x, x, p.y, dy, p.conv,
                                            (cudnnConvolutionBwdFilterAlgo_t)a.first, ws, a.second, zero.of(g.t), p.w, gw));
        snprintf(w2, sizeof w2, "cudnnConvolutionBackwardFilter algo %d, %s", a.first, what);
        compare(w2, dget(gw, nw * tsize(ct)), dw, ct);
        MUST(cudaFree(gw));
        gw = dput(hprevw);
        MUST(cudnnConvolutionBackwardFilter(p.h, one.of(g.t), p.x, x, p.y, dy, p.conv,
                                            (cudnnConvolutionBwdFilterAlgo_t)a.first, ws, a.second, half.of(g.t), p.w, gw));
        std::vector<double> ref(nw);
        for (size_t i = 0; i < nw; i++) ref[i] = dw[i] + 0.5 * hget(hprevw, i, ct);
        snprintf(w2, sizeof w2, "cudnnConvolutionBackwardFilter beta 0.5, algo %d, %s", a.first, what);
        compare(w2, dget(gw, nw * tsize(ct)), ref, ct);
        MUST(cudaFree(gw));
        if (ws) MUST(cudaFree(ws));
    }
    {
        char w2[400];
        void *gb = dalloc((size_t)g.o * tsize(ct));
        MUST(cudnnConvolutionBackwardBias(p.h, one.of(g.t), p.y, dy, zero.of(g.t), p.b, gb));
        snprintf(w2, sizeof w2, "cudnnConvolutionBackwardBias, %s", what);
        compare(w2, dget(gb, (size_t)g.o * tsize(ct)), db, ct);
        MUST(cudaFree(gb));
        gb = dput(hprevb);
        MUST(cudnnConvolutionBackwardBias(p.h, two.of(g.t), p.y, dy, one.of(g.t), p.b, gb));
        std::vector<double> ref((size_t)g.o);
        for (int o = 0; o < g.o; o++) ref[(size_t)o] = 2 * db[(size_t)o] + hget(hprevb, (size_t)o, ct);
        snprintf(w2, sizeof w2, "cudnnConvolutionBackwardBias alpha 2 beta 1, %s", what);
        compare(w2, dget(gb, (size_t)g.o * tsize(ct)), ref, ct);
        MUST(cudaFree(gb));
    }
    void *bufs[] = {x, w, dy, b};
    for (void *q : bufs) MUST(cudaFree(q));
    conv_free(p);
}

static void test_dnn(void) {
    conv_check({CUDNN_DATA_FLOAT, 2, 3, 5, 6, 4, 3, 2, 2, 1, 1, 1});
    conv_check({CUDNN_DATA_FLOAT, 1, 2, 4, 4, 3, 1, 1, 1, 1, 0, 0});
    conv_check({CUDNN_DATA_FLOAT, 3, 1, 7, 5, 2, 3, 3, 2, 2, 0, 1});
    conv_check({CUDNN_DATA_DOUBLE, 2, 2, 5, 5, 3, 3, 3, 1, 1, 1, 1});
    conv_check({CUDNN_DATA_DOUBLE, 1, 3, 6, 4, 2, 2, 3, 3, 2, 2, 0});

    /* statuses: bad sizes are CUDNN_STATUS_BAD_PARAM */
    cudnnTensorDescriptor_t t;
    cudnnConvolutionDescriptor_t c;
    MUST(cudnnCreateTensorDescriptor(&t));
    MUST(cudnnCreateConvolutionDescriptor(&c));
    CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 0, 2, 2) == CUDNN_STATUS_BAD_PARAM,
          "cudnnSetTensor4dDescriptor with 0 channels");
    CHECK(cudnnSetConvolution2dDescriptor(c, 0, 0, 0, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) ==
              CUDNN_STATUS_BAD_PARAM,
          "cudnnSetConvolution2dDescriptor with stride 0");
    CHECK(cudnnSetConvolution2dDescriptor(c, -1, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) ==
              CUDNN_STATUS_BAD_PARAM,
          "cudnnSetConvolution2dDescriptor with padding -1");
    MUST(cudnnDestroyTensorDescriptor(t));
    MUST(cudnnDestroyConvolutionDescriptor(c));
    CHECK(cudnnGetVersion() == CUDNN_VERSION, "cudnnGetVersion() = %zu", cudnnGetVersion());
    const char *s = cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM);
    CHECK(s && strstr(s, "BAD_PARAM"), "cudnnGetErrorString(BAD_PARAM) = %s", s ? s : "(null)");
    char msg[64] = "x";
    cudnnGetLastErrorString(msg, sizeof msg);
    CHECK(memchr(msg, 0, sizeof msg) != NULL, "cudnnGetLastErrorString: not NUL-terminated");

    /* cuDNN's scaling rule: with beta == 0 the output is not read, so a NaN there does not show.
     * (cudnnAddTensor is what mirror calls with beta 1; beta 0 is checked here for the rule.) */
    {
        conv_problem p;
        conv_setup(p, {CUDNN_DATA_FLOAT, 1, 2, 3, 3, 2, 1, 1, 1, 1, 0, 0});
        std::vector<uint8_t> hb = hrand(2, CUDA_R_32F);
        void *b = dput(hb), *y = dalloc(2 * 9 * 4); /* y: the runtime's NaN poison */
        scal one = S(1), zero = S(0);
        MUST(cudnnAddTensor(p.h, one.of(CUDNN_DATA_FLOAT), p.b, b, zero.of(CUDNN_DATA_FLOAT), p.y, y));
        std::vector<double> ref(18);
        for (size_t i = 0; i < 18; i++) ref[i] = hget(hb, i / 9, CUDA_R_32F);
        /* emu_dnn.cc's cudnnAddTensor reads C whatever beta is (0 * NaN = NaN) */
        compare("cudnnAddTensor with beta 0 over an unwritten (NaN) output", dget(y, 72), ref, CUDA_R_32F, true);
        MUST(cudaFree(b));
        MUST(cudaFree(y));
        conv_free(p);
    }
}

/* ---- misuse: each must abort in a child with "mirror-emu: <lib>" ------------------------------ */

static void must_die(const char *name, const char *lib, const std::function<void()> &f, bool is_known = false) {
    int fd[2];
    fflush(stdout);
    fflush(stderr);
    if (pipe(fd) != 0) {
        perror("pipe");
        exit(1);
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        signal(SIGABRT, SIG_DFL);
        f();
        cudaDeviceSynchronize(); /* a rule checked when the work runs */
        fprintf(stderr, "(the child returned)\n");
        fflush(stderr);
        _exit(0);
    }
    close(fd[1]);
    std::string out;
    char buf[512];
    ssize_t r;
    while ((r = read(fd[0], buf, sizeof buf)) > 0) out.append(buf, (size_t)r);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    bool died = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    std::string want = std::string("mirror-emu: ") + lib;
    g_checks++;
    if (is_known) {
        known(name, died && out.find(want) != std::string::npos);
    } else if (!died || out.find(want) == std::string::npos) {
        g_fail++;
        fprintf(stderr, "FAIL misuse '%s': %s; its stderr:\n%s\n", name,
                died ? "died without the expected message" : "was not reported", out.c_str());
    } else {
        size_t at = out.find("mirror-emu:");
        size_t end = out.find('\n', at);
        printf("ok   misuse %-58s %s\n", name, out.substr(at, end == std::string::npos ? std::string::npos : end - at).c_str());
    }
}

static const lt_case k_small = {CUDA_R_32F, CUDA_R_32F, false, false, 4, 4, 4, 1, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.0f,
                                CUBLAS_COMPUTE_32F, 0};

static void test_misuse(void) {
    /* cuBLASLt */
    must_die("Lt: layout used after destroy", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        MUST(cublasLtMatrixLayoutDestroy(p.la));
        lt_run(p);
    });
    must_die("Lt: matmul descriptor used after destroy", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        MUST(cublasLtMatmulDescDestroy(p.desc));
        lt_run(p);
    });
    must_die("Lt: GELU_AUX with aux ld 12 (not a multiple of 8)", "cublas", [] {
        lt_case c = k_small;
        c.m = 12;
        c.epi = CUBLASLT_EPILOGUE_GELU_AUX;
        lt_problem p;
        lt_setup(p, c);
        int64_t ld = 12;
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
        lt_run(p);
    });
    must_die("Lt: GELU_AUX with aux ld < rows of D", "cublas", [] {
        lt_case c = k_small;
        c.m = 16;
        c.epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        lt_problem p;
        lt_setup(p, c);
        int64_t ld = 8;
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
        lt_run(p);
    });
    must_die("Lt: BIAS epilogue with a host (malloc) bias", "cublas", [] {
        lt_case c = k_small;
        c.epi = CUBLASLT_EPILOGUE_BIAS;
        lt_problem p;
        lt_setup(p, c);
        void *host = malloc(64);
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &host, sizeof host));
        lt_run(p);
    });
    must_die("Lt: BIAS epilogue without a bias pointer", "cublas", [] {
        lt_case c = k_small;
        c.epi = CUBLASLT_EPILOGUE_BIAS;
        lt_problem p;
        lt_setup(p, c);
        void *none = NULL;
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &none, sizeof none));
        lt_run(p);
    });
    must_die("Lt: bias shorter than the rows of D", "cublas", [] {
        lt_case c = k_small;
        c.epi = CUBLASLT_EPILOGUE_GELU_BIAS;
        lt_problem p;
        lt_setup(p, c);
        void *shortb = dalloc(2 * 4); /* 2 floats for 4 rows */
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &shortb, sizeof shortb));
        lt_run(p);
    });
    must_die("Lt: workspace smaller than the algorithm needs", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        if (p.ws_bytes == 0) return; /* reported as a failure: the check would not run */
        cublasLtMatmul(p.h, p.desc, &p.c.alpha, p.A, p.la, p.B, p.lb, &p.c.beta, p.D, p.lc, p.D, p.lc, &p.res.algo, p.ws,
                       p.ws_bytes / 2, (cudaStream_t)0);
    });
    must_die("Lt: A in host memory", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        p.A = malloc(256);
        lt_run(p);
    });
    must_die("Lt: A's layout larger than its allocation", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        p.A = (char *)p.A + 8; /* 4x4 floats from 2 floats in: past the end */
        lt_run(p);
    });
    must_die("Lt: op(A) and D dimensions disagree", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        cublasOperation_t t = CUBLAS_OP_T;
        MUST(cublasLtMatrixLayoutDestroy(p.la));
        MUST(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_32F, 4, 3, 4)); /* op(A) 4x3, B 4x4 */
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof t));
        lt_run(p);
    });
    must_die("Lt: A and B layouts of different types", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        MUST(cublasLtMatrixLayoutDestroy(p.lb));
        MUST(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16F, 4, 4, 4));
        lt_run(p);
    });
    must_die("Lt: batch counts differ between A and D", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        int32_t b = 2;
        int64_t s = 16;
        MUST(cublasLtMatrixLayoutSetAttribute(p.la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
        MUST(cublasLtMatrixLayoutSetAttribute(p.la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s));
        lt_run(p);
    });
    must_die("Lt: FAST_TF32 with bf16 inputs", "cublas", [] {
        lt_case c = k_small;
        c.tin = CUDA_R_16BF;
        c.tout = CUDA_R_16BF;
        c.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
        lt_problem p;
        lt_setup(p, c);
        lt_run(p);
    });
    must_die("Lt: in place (C == D) with C's ld different from D's", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        cublasLtMatrixLayout_t ld;
        void *big = dalloc(4 * 8 * 4);
        MUST(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 4, 4, 8));
        cublasLtMatmul(p.h, p.desc, &p.c.alpha, p.A, p.la, p.B, p.lb, &p.c.beta, big, p.lc, big, ld, &p.res.algo, p.ws,
                       p.ws_bytes, (cudaStream_t)0);
    });
    must_die("Lt: a stream of cuda:1, the buffers on cuda:0", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        cudaStream_t s;
        MUST(cudaSetDevice(1));
        MUST(cudaStreamCreate(&s));
        cublasLtMatmul(p.h, p.desc, &p.c.alpha, p.A, p.la, p.B, p.lb, &p.c.beta, p.D, p.lc, p.D, p.lc, &p.res.algo, p.ws,
                       p.ws_bytes, s);
    }, true); /* emu_blas.cc checks the buffers against the handle's GPU, not the stream's */
    /* cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: "Must be divisible by 8" (GELU) */
    must_die("Lt: GELU_AUX batch stride not a multiple of 8", "cublas", [] {
        lt_case c = k_small;
        c.m = 8;
        c.n = 2;
        c.batch = 2;
        c.epi = CUBLASLT_EPILOGUE_GELU_AUX;
        lt_problem p;
        lt_setup(p, c);
        void *aux = dalloc(64 * 4);
        int64_t stride = 8 * 2 + 4; /* no overlap, but not divisible by 8 */
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        MUST(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &stride,
                                            sizeof stride));
        lt_run(p);
    }, true);
    /* the default CUBLASLT_POINTER_MODE_HOST: alpha and beta are host pointers (a device pointer
     * faults on a GPU, and reads fine on the emulator unless checked) */
    must_die("Lt: alpha in device memory under the host pointer mode", "cublas", [] {
        lt_problem p;
        lt_setup(p, k_small);
        float one = 1;
        void *dalpha = dput(std::vector<uint8_t>((uint8_t *)&one, (uint8_t *)&one + 4));
        cublasLtMatmul(p.h, p.desc, dalpha, p.A, p.la, p.B, p.lb, &p.c.beta, p.D, p.lc, p.D, p.lc, &p.res.algo, p.ws,
                       p.ws_bytes, (cudaStream_t)0);
    }, true);
    /* cuBLAS */
    must_die("cuBLAS: cublasSetStream with a stream of another GPU", "cublas", [] {
        cublasHandle_t h;
        MUST(cublasCreate(&h)); /* on cuda:0 */
        cudaStream_t s;
        MUST(cudaSetDevice(1));
        MUST(cudaStreamCreate(&s));
        cublasSetStream(h, s);
    });
    must_die("cuBLAS: handle used after destroy", "cublas", [] {
        cublasHandle_t h;
        MUST(cublasCreate(&h));
        MUST(cublasDestroy(h));
        void *d = dalloc(64);
        double one = 1;
        cublasDgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, (double *)d, 2, 4, (double *)d, 2, 4, &one,
                                  (double *)d, 2, 4, 1);
    });
    must_die("cuBLAS: C in host memory", "cublas", [] {
        cublasHandle_t h;
        MUST(cublasCreate(&h));
        void *d = dalloc(64), *host = malloc(64);
        float one = 1;
        cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d, CUDA_R_32F, 2, 4, d, CUDA_R_32F, 2, 4,
                                   &one, host, CUDA_R_32F, 2, 4, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    must_die("cuBLAS: batches past the end of B", "cublas", [] {
        cublasHandle_t h;
        MUST(cublasCreate(&h));
        void *a = dalloc(4 * 4 * 2), *b = dalloc(4 * 4), *c = dalloc(4 * 4 * 2);
        float one = 1, zero = 0;
        cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a, CUDA_R_32F, 2, 4, b, CUDA_R_32F, 2, 4,
                                   &zero, c, CUDA_R_32F, 2, 4, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    /* cuDNN */
    const conv_case g = {CUDNN_DATA_FLOAT, 1, 2, 4, 4, 3, 3, 3, 1, 1, 1, 1};
    must_die("cuDNN: cudnnSetStream with a stream of another GPU", "cudnn", [] {
        cudnnHandle_t h;
        MUST(cudnnCreate(&h)); /* on cuda:0 */
        cudaStream_t s;
        MUST(cudaSetDevice(1));
        MUST(cudaStreamCreate(&s));
        cudnnSetStream(h, s);
    });
    must_die("cuDNN: tensor descriptor created but never set", "cudnn", [g] {
        conv_problem p;
        conv_setup(p, g);
        cudnnTensorDescriptor_t t;
        MUST(cudnnCreateTensorDescriptor(&t));
        int n, c, h, w;
        cudnnGetConvolution2dForwardOutputDim(p.conv, t, p.w, &n, &c, &h, &w);
    });
    must_die("cuDNN: filter descriptor used after destroy", "cudnn", [g] {
        conv_problem p;
        conv_setup(p, g);
        MUST(cudnnDestroyFilterDescriptor(p.w));
        int n, c, h, w;
        cudnnGetConvolution2dForwardOutputDim(p.conv, p.x, p.w, &n, &c, &h, &w);
    });
    must_die("cuDNN: forward with a y descriptor of the wrong size", "cudnn", [g] {
        conv_problem p;
        conv_setup(p, g);
        MUST(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 3, 3, 4));
        void *x = dalloc(1 << 12), *w = dalloc(1 << 12), *y = dalloc(1 << 12);
        float one = 1, zero = 0;
        cudnnConvolutionForward(p.h, &one, p.x, x, p.w, w, p.conv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0,
                                &zero, p.y, y);
    });
    must_die("cuDNN: workspace smaller than the algorithm needs", "cudnn", [g] {
        conv_problem p;
        conv_setup(p, g);
        std::vector<std::pair<int, size_t>> al = conv_algos(p, 0);
        void *x = dalloc(1 << 12), *w = dalloc(1 << 12), *y = dalloc(1 << 12);
        float one = 1, zero = 0;
        for (auto a : al)
            if (a.second > 0) {
                void *ws = dalloc(a.second);
                cudnnConvolutionForward(p.h, &one, p.x, x, p.w, w, p.conv, (cudnnConvolutionFwdAlgo_t)a.first, ws,
                                        a.second - 1, &zero, p.y, y);
            }
    });
    must_die("cuDNN: x in host memory", "cudnn", [g] {
        conv_problem p;
        conv_setup(p, g);
        void *x = malloc(1 << 12), *w = dalloc(1 << 12), *y = dalloc(1 << 12);
        float one = 1, zero = 0;
        cudnnConvolutionForward(p.h, &one, p.x, x, p.w, w, p.conv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0,
                                &zero, p.y, y);
    });
    must_die("cuDNN: dw allocation smaller than the filter", "cudnn", [g] {
        conv_problem p;
        conv_setup(p, g);
        void *x = dalloc(1 << 12), *dy = dalloc(1 << 12), *dw = dalloc(16);
        float one = 1, zero = 0;
        cudnnConvolutionBackwardFilter(p.h, &one, p.x, x, p.y, dy, p.conv, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, NULL, 0,
                                       &zero, p.w, dw);
    });
    must_die("cuDNN: filter channels differ from x's", "cudnn", [g] {
        conv_problem p;
        conv_setup(p, g);
        MUST(cudnnSetFilter4dDescriptor(p.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 3, 1, 3, 3));
        void *x = dalloc(1 << 12), *w = dalloc(1 << 12), *y = dalloc(1 << 12);
        float one = 1, zero = 0;
        cudnnConvolutionForward(p.h, &one, p.x, x, p.w, w, p.conv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0,
                                &zero, p.y, y);
    });
    must_die("cuDNN: f32 convolution with tensor-op math (TF32)", "cudnn", [g] {
        conv_problem p;
        conv_setup(p, g);
        MUST(cudnnSetConvolutionMathType(p.conv, CUDNN_TENSOR_OP_MATH));
        int n = 0;
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        cudnnGetConvolutionForwardAlgorithm_v7(p.h, p.x, p.w, p.conv, p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, r);
    });
    must_die("cuDNN: bias descriptor not (1,C,1,1) for backward bias", "cudnn", [g] {
        conv_problem p;
        conv_setup(p, g);
        MUST(cudnnSetTensor4dDescriptor(p.b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 2, 1, 1));
        void *dy = dalloc(1 << 12), *db = dalloc(64);
        float one = 1, zero = 0;
        cudnnConvolutionBackwardBias(p.h, &one, p.y, dy, &zero, p.b, db);
    });
}

} // namespace

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_lt();
    printf("cuBLASLt: %d checks, %d failures so far\n", g_checks, g_fail);
    test_blas();
    printf("cuBLAS: %d checks, %d failures so far\n", g_checks, g_fail);
    test_dnn();
    printf("cuDNN: %d checks, %d failures so far\n", g_checks, g_fail);
    test_misuse();
    printf("test_emu_libs: %d checks, %d failed, %d known bugs of the fakes (not counted)\n", g_checks, g_fail, g_known);
    return g_fail ? 1 : 0;
}
