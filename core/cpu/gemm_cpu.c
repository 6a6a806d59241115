/* The CPU GEMM provider, chosen at run time, and the GEMM op's CPU kernel.
 *
 * Providers, in order of preference:
 *  1. mirror's own AVX-512 kernel (sgemm_avx512.c) on CPUs with AVX-512F. Measured on the 2-core
 *     AVX-512 machine this was written on, it runs at the speed of OpenBLAS with its best kernels
 *     (~300 GFLOP/s at 1024^3 on 2 threads, ~70% of the FMA peak measured there), and unlike
 *     OpenBLAS its results do not depend on the thread count: it splits C, never K, across
 *     threads. OpenBLAS 0.3.21 gives different low bits with 1 and 2 threads (our conv tests
 *     caught it), which breaks bit-exact resume on a different thread count.
 *  2. OpenBLAS, loaded with dlopen rather than linked, elsewhere (AVX2 and older CPUs), or when
 *     MIRROR_GEMM=openblas:
 *     - its own CPU detection predates newer Xeons (family 6 model 207 falls back to SSE3
 *       "Prescott" kernels: 19% of peak), and OPENBLAS_CORETYPE, read once when the library is
 *       loaded, overrides it. So mirror reads the CPU features itself (CPUID), sets
 *       OPENBLAS_CORETYPE for the best kernel family the CPU supports (SkylakeX for AVX-512,
 *       Haswell for AVX2), loads the library, then restores the environment. A user's own
 *       OPENBLAS_CORETYPE is respected.
 *     - we load the OpenMP build (one thread pool with mirror's loops) but run it
 *       single-threaded, on fixed blocks of C that mirror's OpenMP loop shares out: the blocks
 *       depend only on the shape, so the result does not depend on the thread count.
 *  3. the built-in blocked kernel (portable C, vectorised by the compiler) when nothing else
 *     loads or passes verification.
 * Every provider is checked at start-up against a double-precision reference on awkward shapes
 * and all transposes; one that disagrees is rejected (logged) and the next is tried.
 * MIRROR_GEMM=avx512|openblas|builtin forces a provider; MIRROR_BLAS_LIB=/path/libopenblas.so
 * picks the library file. */
#include "core/cpu/cpu_impl.h"
#include "core/ops_impl.h"
#include "core/log.h"
#include "core/math/unary_math.h"

#include <cpuid.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/cpu/vec_math_impl.h"

/* ---- CPU features ---------------------------------------------------------------------------- */

static mr_cpu_caps g_caps;
static char g_features[256];
static pthread_once_t g_caps_once = PTHREAD_ONCE_INIT;

static unsigned long long xgetbv0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void read_caps(void) {
    unsigned int a, b, c, d;
    mr_cpu_caps k;
    memset(&k, 0, sizeof k);
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        k.sse42 = (c >> 20) & 1;
        k.fma = (c >> 12) & 1;
        k.f16c = (c >> 29) & 1;
        int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
        unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
        int ymm_ok = (xcr0 & 0x6) == 0x6, zmm_ok = (xcr0 & 0xe6) == 0xe6;
        int amx_ok = (xcr0 & 0x60000) == 0x60000;
        k.avx = avx && ymm_ok;
        if (!k.avx) k.fma = k.f16c = 0;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            k.avx2 = k.avx && ((b >> 5) & 1);
            k.avx512f = zmm_ok && ((b >> 16) & 1);
            k.avx512dq = k.avx512f && ((b >> 17) & 1);
            k.avx512bw = k.avx512f && ((b >> 30) & 1);
            k.avx512vl = k.avx512f && ((b >> 31) & 1);
            k.avx512_fp16 = k.avx512f && ((d >> 23) & 1);
            k.amx_bf16 = amx_ok && ((d >> 22) & 1);
            unsigned int a1, b1, c1, d1;
            if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) k.avx512_bf16 = k.avx512f && ((a1 >> 5) & 1);
        }
    }
    g_caps = k;
    snprintf(g_features, sizeof g_features, "%s%s%s%s%s%s%s%s%s%s", k.sse42 ? "sse4.2 " : "", k.avx ? "avx " : "",
             k.avx2 ? "avx2 " : "", k.fma ? "fma " : "", k.avx512f ? "avx512f " : "", k.avx512bw ? "avx512bw " : "",
             k.avx512vl ? "avx512vl " : "", k.avx512_bf16 ? "avx512_bf16 " : "", k.avx512_fp16 ? "avx512_fp16 " : "",
             k.amx_bf16 ? "amx_bf16" : "");
}

const mr_cpu_caps *mr_cpu_caps_get(void) {
    pthread_once(&g_caps_once, read_caps);
    return &g_caps;
}

const char *mr_cpu_features(void) {
    pthread_once(&g_caps_once, read_caps);
    return g_features;
}

/* ---- providers ------------------------------------------------------------------------------- */

typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                               int lda, const float *b, int ldb, float beta, float *c, int ldc);
typedef char *(*get_str_fn)(void);

enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

static struct {
    int avx512;           /* mirror's AVX-512 kernel */
    cblas_sgemm_fn sgemm; /* else OpenBLAS; both NULL/0: the built-in kernel */
    char name[160];
} g_gemm;
static pthread_once_t g_gemm_once = PTHREAD_ONCE_INIT;

/* The OpenBLAS kernel family for this CPU, from its features (not its model number, which
 * OpenBLAS 0.3.21 does not know for newer parts). NULL: let OpenBLAS decide. */
static const char *openblas_coretype(const mr_cpu_caps *k) {
    if (k->avx512f && k->avx512bw && k->avx512vl && k->avx512dq) return "SkylakeX";
    if (k->avx2 && k->fma) return "Haswell";
    if (k->avx) return "Sandybridge";
    return NULL;
}

/* Compares a provider with a double reference on shapes that exercise edge tiles and every
 * transpose combination. Returns 1 when it agrees. */
static int verify_sgemm(cblas_sgemm_fn f) {
    enum { M = 37, N = 53, K = 71 };
    static float A[M * K], B[K * N], C[M * N];
    int ok = 1;
    for (int i = 0; i < M * K; i++) A[i] = (float)((i * 37 % 101) - 50) / 64.0f;
    for (int i = 0; i < K * N; i++) B[i] = (float)((i * 53 % 97) - 48) / 32.0f;
    for (int ta = 0; ta < 2 && ok; ta++) {
        for (int tb = 0; tb < 2 && ok; tb++) {
            for (int i = 0; i < M * N; i++) C[i] = 1.0f;
            /* A is read as (M,K) or, transposed, as (K,M); same for B. */
            f(CBLAS_ROW_MAJOR, ta ? CBLAS_TRANS : CBLAS_NO_TRANS, tb ? CBLAS_TRANS : CBLAS_NO_TRANS, M, N, K, 0.5f, A,
              ta ? M : K, B, tb ? K : N, 2.0f, C, N);
            for (int i = 0; i < M && ok; i++) {
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int l = 0; l < K; l++)
                        s += (double)(ta ? A[l * M + i] : A[i * K + l]) * (double)(tb ? B[j * K + l] : B[l * N + j]);
                    double ref = 0.5 * s + 2.0;
                    if (!(fabs(C[i * N + j] - ref) <= 1e-4 * (1.0 + fabs(ref)))) {
                        ok = 0;
                        break;
                    }
                }
            }
        }
    }
    return ok;
}

static int try_openblas(const char *path) {
    const mr_cpu_caps *k = mr_cpu_caps_get();
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *core = user ? NULL : openblas_coretype(k);
    if (core) setenv("OPENBLAS_CORETYPE", core, 1);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (core) unsetenv("OPENBLAS_CORETYPE");
    if (!h) {
        mr_log_debug("gemm: cannot load %s: %s", path, dlerror());
        return 0;
    }
    cblas_sgemm_fn f = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
    get_str_fn corename = (get_str_fn)dlsym(h, "openblas_get_corename");
    get_str_fn config = (get_str_fn)dlsym(h, "openblas_get_config");
    if (!f) {
        mr_log_debug("gemm: %s has no cblas_sgemm", path);
        dlclose(h);
        return 0;
    }
    if (!verify_sgemm(f)) {
        mr_log_warn("gemm: %s gives wrong sgemm results on this CPU; not using it", path);
        dlclose(h);
        return 0;
    }
    g_gemm.sgemm = f;
    /* Not openblas_set_num_threads: in the OpenMP build it calls omp_set_num_threads and would
     * change the calling thread's OpenMP team size for all of mirror. */
    const char *cfg = config ? config() : "";
    snprintf(g_gemm.name, sizeof g_gemm.name, "openblas %s kernels (%s%s)", corename ? corename() : "?",
             strstr(cfg, "USE_OPENMP") ? "openmp" : "pthreads", user ? ", OPENBLAS_CORETYPE from the user" : "");
    return 1;
}

static void avx512_as_cblas(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                            const float *b, int ldb, float beta, float *c, int ldc) {
    (void)order;
    mr_cpu_sgemm_avx512(ta == CBLAS_TRANS, tb == CBLAS_TRANS, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static void choose_provider(void) {
    const char *force = getenv("MIRROR_GEMM");
    int want_builtin = force && !strcmp(force, "builtin");
    int want_openblas = force && !strcmp(force, "openblas");
    if (force && !want_builtin && !want_openblas && strcmp(force, "avx512"))
        mr_log_warn("gemm: MIRROR_GEMM=%s is not avx512, openblas or builtin; choosing automatically", force);
    if (!want_builtin && !want_openblas && mr_cpu_caps_get()->avx512f) {
        if (verify_sgemm(avx512_as_cblas)) {
            g_gemm.avx512 = 1;
            snprintf(g_gemm.name, sizeof g_gemm.name, "mirror avx512 14x32 kernel");
            return;
        }
        mr_log_warn("gemm: mirror's AVX-512 kernel failed verification on this CPU; not using it");
    }
    if (!want_builtin) {
        const char *user_lib = getenv("MIRROR_BLAS_LIB");
        /* Debian's OpenMP build first (one thread pool), then whatever libopenblas the loader finds. */
        const char *candidates[] = {user_lib, "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                                    "/usr/lib/aarch64-linux-gnu/openblas-openmp/libopenblas.so.0",
                                    "libopenblaso.so.0", "libopenblas.so.0"};
        for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++)
            if (candidates[i] && try_openblas(candidates[i])) return;
        mr_log_warn("gemm: no usable OpenBLAS found; using mirror's built-in kernel (slower). "
                    "HINT: apt-get install libopenblas0-openmp");
    }
    g_gemm.sgemm = NULL;
    snprintf(g_gemm.name, sizeof g_gemm.name, "builtin");
}

const char *mr_cpu_gemm_provider(void) {
    pthread_once(&g_gemm_once, choose_provider);
    return g_gemm.name;
}

void mr_cpu_gemm_set_threads(int n) {
    /* Every provider takes its threads from OpenMP (omp_set_num_threads, set by the caller);
     * OpenBLAS itself stays single-threaded. */
    (void)n;
    pthread_once(&g_gemm_once, choose_provider);
}

/* OpenBLAS on fixed blocks of C: 512 columns when n >= 1024, else 256 rows when m >= 512, else
 * all of C. Blocks depend on the shape only, each is computed by one single-threaded call, and
 * OpenMP shares them out, so the bits never depend on the thread count. */
static void sgemm_openblas_blocks(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                                  int64_t ldc) {
    int64_t bc = n >= 1024 ? 512 : n;
    int64_t br = (bc == n && m >= 512) ? 256 : m;
    int64_t ncb = (n + bc - 1) / bc, nrb = (m + br - 1) / br, total = ncb * nrb;
    int par = total > 1;
#ifdef _OPENMP
    par = par && omp_get_level() == 0;
#endif
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t u = 0; u < total; u++) {
        int64_t r0 = (u / ncb) * br, c0 = (u % ncb) * bc;
        int64_t mr = m - r0 < br ? m - r0 : br, nc = n - c0 < bc ? n - c0 : bc;
        const float *ab = trans_a ? a + r0 : a + r0 * lda;
        const float *bb = trans_b ? b + c0 * ldb : b + c0;
        /* OpenBLAS's OpenMP build sizes its team from omp_get_max_threads(): make it 1 for this
         * call (the setting is this thread's own, restored right after). */
        int saved = 1;
#ifdef _OPENMP
        saved = omp_get_max_threads();
        omp_set_num_threads(1);
#endif
        g_gemm.sgemm(CBLAS_ROW_MAJOR, trans_a ? CBLAS_TRANS : CBLAS_NO_TRANS, trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS,
                     (int)mr, (int)nc, (int)k, alpha, ab, (int)(lda ? lda : 1), bb, (int)(ldb ? ldb : 1), beta,
                     c + r0 * ldc + c0, (int)ldc);
#ifdef _OPENMP
        omp_set_num_threads(saved);
#endif
        (void)saved;
    }
}

/* ---- the built-in kernel ----------------------------------------------------------------------
 * Blocked for cache (MC x KC panels of A against KC x NC panels of B packed contiguously) with an
 * inner loop the compiler vectorises. Correct for every shape and stride; used when no BLAS is
 * installed or none passes verification. */
enum { BI_MC = 64, BI_KC = 256, BI_NC = 512 };

void mr_cpu_sgemm_builtin(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                          int64_t ldc) {
    /* C := beta*C first (beta == 0 overwrites, so NaN garbage in C does not survive). */
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    if (k == 0 || alpha == 0.0f) return;
    int par = 1;
#ifdef _OPENMP
    par = omp_get_level() == 0;
#endif
    for (int64_t j0 = 0; j0 < n; j0 += BI_NC) {
        int64_t nb = n - j0 < BI_NC ? n - j0 : BI_NC;
        for (int64_t l0 = 0; l0 < k; l0 += BI_KC) {
            int64_t kb = k - l0 < BI_KC ? k - l0 : BI_KC;
#pragma omp parallel for schedule(static) if (par)
            for (int64_t i0 = 0; i0 < m; i0 += BI_MC) {
                int64_t mb = m - i0 < BI_MC ? m - i0 : BI_MC;
                float bp[BI_KC * 16];
                for (int64_t jj = 0; jj < nb; jj += 16) {
                    int64_t w = nb - jj < 16 ? nb - jj : 16;
                    /* pack a kb x 16 slice of op(B) */
                    for (int64_t l = 0; l < kb; l++)
                        for (int64_t q = 0; q < 16; q++) {
                            int64_t col = j0 + jj + q, row = l0 + l;
                            bp[l * 16 + q] = q < w ? (trans_b ? b[col * ldb + row] : b[row * ldb + col]) : 0.0f;
                        }
                    for (int64_t i = 0; i < mb; i++) {
                        float acc[16] = {0};
                        int64_t r = i0 + i;
                        for (int64_t l = 0; l < kb; l++) {
                            float av = trans_a ? a[(l0 + l) * lda + r] : a[r * lda + l0 + l];
                            for (int q = 0; q < 16; q++) acc[q] += av * bp[l * 16 + q];
                        }
                        float *cr = c + r * ldc + j0 + jj;
                        for (int64_t q = 0; q < w; q++) cr[q] += alpha * acc[q];
                    }
                }
            }
        }
    }
}

void mr_cpu_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    pthread_once(&g_gemm_once, choose_provider);
    if (m == 0 || n == 0) return;
    if (g_gemm.avx512 && k > 0 && mr_cpu_sgemm_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
        return;
    if (g_gemm.sgemm && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && lda <= INT32_MAX &&
        ldb <= INT32_MAX && ldc <= INT32_MAX) {
        if (k == 0) {
            /* BLAS with k == 0 only scales C; keep the beta == 0 rule explicit. */
            mr_cpu_sgemm_builtin(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
            return;
        }
        sgemm_openblas_blocks(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    mr_cpu_sgemm_builtin(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* ---- the GEMM op ------------------------------------------------------------------------------ */

/* One GEMM in the op's dtypes: f32, or bf16/f16 inputs with an f32 C (void pointers: A and B
 * are float or uint16_t by dt). */
static mr_status gemm_one(mr_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const void *A,
                          int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc,
                          const mr_gemm_epi *epi, int *epi_done) {
    *epi_done = 0;
    switch (dt) {
    case MR_F32: mr_cpu_sgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc); return MR_OK;
    case MR_BF16: return mr_cpu_gemm_bf16_epi(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, epi, epi_done);
    default: return mr_cpu_gemm_half_via_f32(1, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}

/* ---- the epilogue: bias and GELU ----------------------------------------------------------------
 * Applied row by row right after the GEMM that wrote those rows (per batch, while its C is still
 * in cache), never when the op has no bias and no GELU, so a plain GEMM pays nothing for it.
 * Compiled twice, like the unary ops (elementwise_cpu.c): for the baseline ISA and for AVX-512,
 * where libmvec's 16-wide tanhf runs. Whole rows take the vector body, so the bits do not depend
 * on the thread count. pre (P) may be NULL; it must not overlap C. */
#define DEFINE_EPILOGUE_ROWS(SUFFIX, ATTR)                                                          \
    ATTR static void epilogue_rows_##SUFFIX(float *restrict C, float *restrict P, const float *restrict bias, \
                                            int gelu, int64_t r0, int64_t r1, int64_t n) {          \
        for (int64_t i = r0; i < r1; i++) {                                                         \
            float *restrict c = C + i * n;                                                          \
            if (bias) {                                                                             \
                _Pragma("omp simd") for (int64_t j = 0; j < n; j++) c[j] += bias[j];                \
            }                                                                                       \
            if (!gelu) continue;                                                                    \
            if (P) {                                                                                \
                float *restrict pr = P + i * n;                                                     \
                _Pragma("omp simd") for (int64_t j = 0; j < n; j++) {                               \
                    pr[j] = c[j];                                                                   \
                    c[j] = mr_gelu_f32(c[j]);                                                       \
                }                                                                                   \
            } else {                                                                                \
                _Pragma("omp simd") for (int64_t j = 0; j < n; j++) c[j] = mr_gelu_f32(c[j]);       \
            }                                                                                       \
        }                                                                                           \
    }

DEFINE_EPILOGUE_ROWS(def, )
DEFINE_EPILOGUE_ROWS(512, __attribute__((target("avx512f"))))

void mr_cpu_gemm_epilogue_rows(float *C, float *pre, const float *bias, int gelu, int64_t r0, int64_t r1, int64_t n) {
    (mr_cpu_caps_get()->avx512f ? epilogue_rows_512 : epilogue_rows_def)(C, pre, bias, gelu, r0, r1, n);
}

/* Rows of work below which the epilogue stays on the calling thread (thread start-up costs more). */
#define EPI_PAR_MIN 32768

/* The epilogue on `rows` rows of n columns of C (f32) and of pre (NULL when absent); threaded
 * over rows when `par` and the pass is big enough. */
static void gemm_epilogue(const mr_op_args *a, float *C, float *P, int64_t rows, int64_t n, int par) {
    const float *bias = a->in[2].data;
    int gelu = a->p.gemm.epilogue == MR_GEMM_EPI_GELU;
    void (*fn)(float *restrict, float *restrict, const float *restrict, int, int64_t, int64_t, int64_t) =
        mr_cpu_caps_get()->avx512f ? epilogue_rows_512 : epilogue_rows_def;
#ifdef _OPENMP
    par = par && omp_get_level() == 0 && rows > 1 && rows * n > EPI_PAR_MIN;
#else
    par = 0;
#endif
    if (!par) {
        fn(C, P, bias, gelu, 0, rows, n);
        return;
    }
    /* 16-row chunks: few enough to share out evenly, long enough to amortise the loop */
#pragma omp parallel for schedule(static)
    for (int64_t r0 = 0; r0 < rows; r0 += 16) fn(C, P, bias, gelu, r0, rows - r0 < 16 ? rows : r0 + 16, n);
}

/* f16 inputs: this CPU has no f16 dot-product instruction, so A and B are widened to f32 once
 * per call into the workspace (a planned step then allocates nothing) and the f32 GEMM runs. The
 * query runs before the check: it must not trust the args. */
size_t mr_gemm_fwd_workspace(const mr_op_args *a) {
    if (a->n_in < 2 || a->in[0].dtype != MR_F16 || a->in[1].dtype != MR_F16) return 0;
    int64_t na = mr_shape_numel(&a->in[0].shape), nb = mr_shape_numel(&a->in[1].shape);
    if (na < 0 || nb < 0) return 0;
    return (size_t)(na + nb) * sizeof(float);
}

mr_status mr_gemm_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_gemm_fwd_ref(a);
    if (a->in[0].dtype == MR_F16 && a->workspace && a->workspace_bytes >= mr_gemm_fwd_workspace(a)) {
        int64_t na = mr_shape_numel(&a->in[0].shape), nb = mr_shape_numel(&a->in[1].shape);
        mr_op_args w = *a;
        float *wa = a->workspace, *wb = wa + na;
        mr_cpu_widen_f16(a->in[0].data, wa, na);
        mr_cpu_widen_f16(a->in[1].data, wb, nb);
        w.in[0].data = wa;
        w.in[0].dtype = MR_F32;
        w.in[1].data = wb;
        w.in[1].dtype = MR_F32;
        w.workspace = NULL;
        w.workspace_bytes = 0;
        return mr_gemm_fwd_cpu(&w);
    }
    mr_dtype dt = a->in[0].dtype;
    if (!(dt == MR_F32 || dt == MR_BF16 || dt == MR_F16) || a->out[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, or bf16/f16 inputs with an f32 C; got A %s, C %s",
                           mr_dtype_name(dt), mr_dtype_name(a->out[0].dtype));
    const mr_shape *sa = &a->in[0].shape, *sb = &a->in[1].shape, *sc = &a->out[0].shape;
    const mr_gemm_params *p = &a->p.gemm;
    int64_t m = sc->dim[sc->ndim - 2], n = sc->dim[sc->ndim - 1];
    int64_t k = p->trans_a ? sa->dim[sa->ndim - 2] : sa->dim[sa->ndim - 1];
    int64_t batch = mr_shape_numel(sc) / (m * n > 0 ? m * n : 1);
    int b_shared = sb->ndim == 2 && batch > 1;
    size_t es = mr_dtype_size(dt);
    const char *A = a->in[0].data, *B = a->in[1].data;
    float *C = a->out[0].data;
    int64_t lda = p->trans_a ? m : k, ldb = p->trans_b ? k : n;
    float alpha = (float)p->alpha, beta = (float)p->beta;
    /* pre (out[1]) has C's dtype, f32 here; NULL when absent */
    float *P = a->out[1].data;
    int epi = a->in[2].data || p->epilogue != MR_GEMM_EPI_NONE, done = 0;
    /* the epilogue for a kernel that folds it in (bf16 on AMX; same bits as the separate pass) */
    mr_gemm_epi fold = {a->in[2].data, P, p->epilogue == MR_GEMM_EPI_GELU};
    const mr_gemm_epi *ep = epi ? &fold : NULL;
    if (m * n == 0) return MR_OK;
    if (b_shared && !p->trans_a) {
        /* A shared B: fold the batch into M (one large GEMM instead of many small ones). */
        mr_status st = gemm_one(dt, 0, p->trans_b, batch * m, n, k, alpha, A, lda, B, ldb, beta, C, n, ep, &done);
        if (st == MR_OK && epi && !done) gemm_epilogue(a, C, P, batch * m, n, 1);
        return st;
    }
    /* Many small GEMMs (attention: batch*heads of TxD by DxT) are shared out whole, one per
     * thread (each then runs single-threaded inside the region); one big one threads inside. */
    int par = batch > 1 && (double)m * (double)n * (double)k < 4e6;
#ifdef _OPENMP
    par = par && omp_get_level() == 0;
#endif
    /* Not `parallel for if (par)`: an inactive region would make each GEMM's own threading a
     * nested team, which libgomp builds anew on every call (MLP training ran 2.5x slower). */
    if (par) {
        int failed = 0;
#pragma omp parallel for schedule(static)
        for (int64_t bi = 0; bi < batch; bi++) {
            int fused = 0;
            mr_gemm_epi fb = {fold.bias, P ? P + bi * m * n : NULL, fold.gelu};
            if (gemm_one(dt, p->trans_a, p->trans_b, m, n, k, alpha, A + (size_t)(bi * m * k) * es, lda,
                         B + (size_t)(b_shared ? 0 : bi * k * n) * es, ldb, beta, C + bi * m * n, n,
                         epi ? &fb : NULL, &fused) != MR_OK) {
#pragma omp atomic write
                failed = 1;
            } else if (epi && !fused) {
                gemm_epilogue(a, C + bi * m * n, P ? P + bi * m * n : NULL, m, n, 0);
            }
        }
        /* the worker's message is thread-local: restate it here */
        if (failed) return mr_set_error(MR_ERR_NOMEM, "gemm: out of memory for %s packing buffers", mr_dtype_name(dt));
    } else {
        for (int64_t bi = 0; bi < batch; bi++) {
            mr_gemm_epi fb = {fold.bias, P ? P + bi * m * n : NULL, fold.gelu};
            mr_status st = gemm_one(dt, p->trans_a, p->trans_b, m, n, k, alpha, A + (size_t)(bi * m * k) * es, lda,
                                    B + (size_t)(b_shared ? 0 : bi * k * n) * es, ldb, beta, C + bi * m * n, n,
                                    epi ? &fb : NULL, &done);
            if (st != MR_OK) return st;
            if (epi && !done) gemm_epilogue(a, C + bi * m * n, P ? P + bi * m * n : NULL, m, n, 1);
        }
    }
    return MR_OK;
}
