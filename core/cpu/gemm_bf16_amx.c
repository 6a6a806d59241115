/* Mixed-precision GEMM with AMX-BF16 tiles (Sapphire Rapids and later): the first choice of
 * mr_cpu_gemm_bf16 where it passes a one-time probe. Same contract as the vdpbf16ps kernel:
 * C (m,n) f32 = alpha * op(A) op(B) + beta * C, A and B bf16, products exact, sums in f32.
 *  - probe (once): CPUID/XCR0 say AMX-BF16 (mr_cpu_caps), the kernel grants the tile data state
 *    (arch_prctl ARCH_REQ_XCOMP_PERM, process-wide), and a small GEMM run under a temporary
 *    SIGILL guard equals a scalar reference (exact small integers). Anything else (old kernels,
 *    valgrind, a hypervisor hiding the state) disables the path silently.
 *  - kernel: a 32 x 32 block of C in four 16x16 f32 tiles (tmm0-3); each 32-k step loads two A
 *    tiles (16 rows x 32 bf16, tmm4-5) and two B tiles (16 k pairs x 16 columns in the VNNI pair
 *    layout, tmm6-7) and issues four tdpbf16ps.
 *  - blocking: K in blocks of up to KC = 512 (equal sizes, padded with zeros to 32 in packing:
 *    padding adds exact zeros), B packed KC x NC = 512 columns, A in MC = 64-row blocks. A full
 *    64-row block of an untransposed A whose k block is whole 32-k chunks is not packed: its tiles
 *    load from A itself (row stride lda); transposed operands are transposed in registers while
 *    packing. With alpha 1 and beta 0, a whole 32x32 block's tiles are stored straight into C
 *    (same bits: 1 * x is x); otherwise through a buffer that applies alpha/beta with edge masks.
 *  - threads split C (32-column units; 32-row units when n is small), never K: each C element
 *    is summed by one thread in one fixed k order. The tile configuration is per thread and is
 *    loaded at the start of every thread's share and released at its end. */
#include "core/cpu/cpu_impl.h"

#include <immintrin.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

enum { TK = 32, KC = 512, NC = 512, MC = 64, BLK = 32 };

#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,amx-tile,amx-bf16")))

/* ---- packing buffers (process-wide pool, as in the vdpbf16ps kernel) -------------------------- */


/* ---- packing ---------------------------------------------------------------------------------- */


static inline __mmask16 low_mask(int n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u); }

/* r[0..15] (16 x 16 u32) transposed in place: unpacks within 128-bit lanes, then lane shuffles. */
AMX_TARGET static inline void transpose16(__m512i r[16]) {
    __m512i u[16];
    for (int b = 0; b < 4; b++) {
        __m512i lo01 = _mm512_unpacklo_epi32(r[4 * b], r[4 * b + 1]), hi01 = _mm512_unpackhi_epi32(r[4 * b], r[4 * b + 1]);
        __m512i lo23 = _mm512_unpacklo_epi32(r[4 * b + 2], r[4 * b + 3]);
        __m512i hi23 = _mm512_unpackhi_epi32(r[4 * b + 2], r[4 * b + 3]);
        u[4 * b] = _mm512_unpacklo_epi64(lo01, lo23);     /* per lane: rows 4b..4b+3, element 0 */
        u[4 * b + 1] = _mm512_unpackhi_epi64(lo01, lo23); /* element 1 */
        u[4 * b + 2] = _mm512_unpacklo_epi64(hi01, hi23);
        u[4 * b + 3] = _mm512_unpackhi_epi64(hi01, hi23);
    }
    for (int e = 0; e < 4; e++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88), v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xdd);
        __m512i w0 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88);
        __m512i w1 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xdd);
        r[e] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[8 + e] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
        r[4 + e] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + e] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
    }
}

/* Two rows of 16 bf16 (k and k+1; NULL: zeros) as 16 (k, k+1) pairs; only the first nw columns read. */
AMX_TARGET static inline __m512i pair_rows(const uint16_t *lo, const uint16_t *hi, __mmask16 cm) {
    __m512i l = lo ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(cm, lo)) : _mm512_setzero_si512();
    __m512i h = hi ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(cm, hi)) : _mm512_setzero_si512();
    return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}

/* op(A)[i0:i0+mc, p0:p0+kc] -> ap, rows rounded up to 16 and k to 32 with zeros: a tile (16 rows
 * x 32 k) per 16-row group and 32-k chunk. A transposed (stored (K,M)) is read as 16 k pairs of
 * 16 rows and transposed in registers (32-bit elements: a k pair moves as one). */
AMX_TARGET static void pack_a(int trans_a, const uint16_t *a, int64_t lda, int64_t i0, int64_t p0, int mc, int kc,
                              uint16_t *ap) {
    int nch = (kc + TK - 1) / TK, mg = (mc + 15) / 16;
    for (int g = 0; g < mg; g++) {
        int mw = mc - g * 16 < 16 ? mc - g * 16 : 16;
        __mmask16 rm = low_mask(mw);
        for (int ch = 0; ch < nch; ch++) {
            uint16_t *dst = ap + ((int64_t)g * nch + ch) * 16 * TK;
            int kw = kc - ch * TK < TK ? kc - ch * TK : TK;
            if (trans_a) {
                __m512i r[16];
                for (int q = 0; q < 16; q++) {
                    int k0 = 2 * q;
                    const uint16_t *s = a + (p0 + ch * TK + k0) * lda + i0 + g * 16;
                    r[q] = pair_rows(k0 < kw ? s : NULL, k0 + 1 < kw ? s + lda : NULL, rm);
                }
                transpose16(r);
                for (int q = 0; q < 16; q++) _mm512_store_si512(dst + q * TK, r[q]);
                continue;
            }
            __mmask32 km = kw >= 32 ? 0xffffffffu : (__mmask32)((1u << kw) - 1u);
            for (int q = 0; q < 16; q++) {
                __m512i v = q < mw ? _mm512_maskz_loadu_epi16(km, a + (i0 + g * 16 + q) * lda + p0 + ch * TK)
                                   : _mm512_setzero_si512();
                _mm512_store_si512(dst + q * TK, v);
            }
        }
    }
}

/* op(B)[p0:p0+kc, j0:j0+nc] -> bp in the VNNI layout: tile row r holds (k 2r, k 2r+1) of each of
 * 16 columns; columns rounded up to 16 and k to 32 with zeros. B transposed (stored (N,K)) holds
 * each column's k pairs as consecutive 32-bit words: 16 columns loaded, transposed in registers. */
AMX_TARGET static void pack_b(int trans_b, const uint16_t *b, int64_t ldb, int64_t p0, int64_t j0, int kc, int nc,
                              uint16_t *bp) {
    int nch = (kc + TK - 1) / TK, ng = (nc + 15) / 16;
    for (int g = 0; g < ng; g++) {
        int nw = nc - g * 16 < 16 ? nc - g * 16 : 16;
        __mmask16 cm = low_mask(nw);
        for (int ch = 0; ch < nch; ch++) {
            uint16_t *dst = bp + ((int64_t)g * nch + ch) * 16 * TK;
            int kw = kc - ch * TK < TK ? kc - ch * TK : TK;
            if (trans_b) {
                __mmask32 km = kw >= 32 ? 0xffffffffu : (__mmask32)((1u << kw) - 1u);
                __m512i r[16];
                for (int c = 0; c < 16; c++)
                    r[c] = c < nw ? _mm512_maskz_loadu_epi16(km, b + (j0 + g * 16 + c) * ldb + p0 + ch * TK)
                                  : _mm512_setzero_si512();
                transpose16(r);
                for (int q = 0; q < 16; q++) _mm512_store_si512(dst + q * TK, r[q]);
                continue;
            }
            for (int q = 0; q < 16; q++) {
                int k0 = 2 * q;
                const uint16_t *s = b + (p0 + ch * TK + k0) * ldb + j0 + g * 16;
                _mm512_store_si512(dst + q * TK, pair_rows(k0 < kw ? s : NULL, k0 + 1 < kw ? s + ldb : NULL, cm));
            }
        }
    }
}

/* ---- tiles ------------------------------------------------------------------------------------ */

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Palette 1, tiles 0-7 all 16 rows x 64 bytes. A constant in memory: GCC 12 drops the stores to a
 * stack copy before ldtilecfg (it does not see the instruction read them), which then faults. */
static const tile_config g_tile_config __attribute__((aligned(64))) = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

AMX_TARGET static void tiles_configure(void) { _tile_loadconfig(&g_tile_config); }

AMX_TARGET static void tiles_release(void) { _tile_release(); }

/* One 32x32 block: acc = A panels (two 16-row groups, nch chunks) x B panels (two 16-column
 * groups); then C[0:mr, 0:nr] = alpha*acc + (accumulate ? C : beta*C). a1/b1 may equal a0/b0
 * when the block has only one group (the extra tile is computed and not stored). */
AMX_TARGET static void block_kernel(int nch, const uint16_t *a0, const uint16_t *a1, int64_t a_stride,
                                    int64_t a_chunk, const uint16_t *b0, const uint16_t *b1, float *c, int64_t ldc,
                                    int mr, int nr, float alpha, float beta, int accumulate) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int ch = 0; ch < nch; ch++) {
        int64_t off = (int64_t)ch * 16 * TK;
        _tile_loadd(4, a0 + ch * a_chunk, a_stride);
        _tile_loadd(5, a1 + ch * a_chunk, a_stride);
        _tile_loadd(6, b0 + off, 64);
        _tile_loadd(7, b1 + off, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (!accumulate && beta == 0.0f && alpha == 1.0f && mr == BLK && nr == BLK) {
        /* C = acc exactly (1 * x is x): the tiles go straight to C */
        _tile_stored(0, c, ldc * 4);
        _tile_stored(1, c + 16, ldc * 4);
        _tile_stored(2, c + 16 * ldc, ldc * 4);
        _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
        return;
    }
    float acc[BLK][BLK] __attribute__((aligned(64)));
    _tile_stored(0, &acc[0][0], BLK * 4);
    _tile_stored(1, &acc[0][16], BLK * 4);
    _tile_stored(2, &acc[16][0], BLK * 4);
    _tile_stored(3, &acc[16][16], BLK * 4);
    __mmask16 m0 = low_mask(nr), m1 = low_mask(nr - 16);
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int r = 0; r < mr; r++) {
        float *cr = c + r * ldc;
        __m512 y0 = _mm512_mul_ps(va, _mm512_load_ps(&acc[r][0])), y1 = _mm512_mul_ps(va, _mm512_load_ps(&acc[r][16]));
        if (accumulate) {
            y0 = _mm512_add_ps(y0, _mm512_maskz_loadu_ps(m0, cr));
            y1 = _mm512_add_ps(y1, _mm512_maskz_loadu_ps(m1, cr + 16));
        } else if (beta != 0.0f) {
            y0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), y0);
            y1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), y1);
        }
        _mm512_mask_storeu_ps(cr, m0, y0);
        _mm512_mask_storeu_ps(cr + 16, m1, y1);
    }
}

/* One thread's share: rows [i_begin, i_end) x columns [j_begin, j_end) of C. */
static void gemm_block(int trans_a, int trans_b, int64_t i_begin, int64_t i_end, int64_t j_begin, int64_t j_end,
                       int64_t k, float alpha, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                       float beta, float *c, int64_t ldc, uint16_t *ap, uint16_t *bp, const mr_gemm_args *g) {
    /* the op's epilogue on each 64-row block as soon as its last k block is in, while it is in
     * cache: when this share is whole rows of C (one NC block) */
    const mr_gemm_epi *epi = g->epi;
    int fuse = epi && j_begin == 0 && j_end == g->n && g->n <= NC && ldc == g->n;
    /* k blocks of equal size, independent of the share (the k order of each element is fixed) */
    const int64_t kblocks = (k + KC - 1) / KC;
    int64_t kstep = (k + kblocks - 1) / kblocks;
    kstep = (kstep + TK - 1) / TK * TK;
    tiles_configure();
    for (int64_t j0 = j_begin; j0 < j_end; j0 += NC) {
        int nc = (int)(j_end - j0 < NC ? j_end - j0 : NC);
        for (int64_t p0 = 0; p0 < k; p0 += kstep) {
            int kc = (int)(k - p0 < kstep ? k - p0 : kstep), nch = (kc + TK - 1) / TK;
            int64_t tile_elems = (int64_t)nch * 16 * TK; /* one 16-row or 16-column group */
            pack_b(trans_b, b, ldb, p0, j0, kc, nc, bp);
            for (int64_t i0 = i_begin; i0 < i_end; i0 += MC) {
                int mc = (int)(i_end - i0 < MC ? i_end - i0 : MC);
                /* A untransposed, whole rows and k chunks: the tiles load straight from A (its rows
                 * are the tile rows), no packing; else packed with zero padding */
                int direct = !trans_a && mc == MC && kc % TK == 0;
                if (!direct) pack_a(trans_a, a, lda, i0, p0, mc, kc, ap);
                for (int jr = 0; jr < nc; jr += BLK) {
                    int nr = nc - jr < BLK ? nc - jr : BLK;
                    const uint16_t *b0 = bp + (int64_t)(jr / 16) * tile_elems;
                    const uint16_t *b1 = nr > 16 ? b0 + tile_elems : b0;
                    for (int ir = 0; ir < mc; ir += BLK) {
                        int mr = mc - ir < BLK ? mc - ir : BLK;
                        const uint16_t *a0, *a1;
                        int64_t a_stride = 64, a_chunk = 16 * TK;
                        if (direct) {
                            a0 = a + (i0 + ir) * lda + p0;
                            a1 = a0 + 16 * lda;
                            a_stride = lda * (int64_t)sizeof(uint16_t);
                            a_chunk = TK;
                        } else {
                            a0 = ap + (int64_t)(ir / 16) * tile_elems;
                            a1 = mr > 16 ? a0 + tile_elems : a0;
                        }
                        block_kernel(nch, a0, a1, a_stride, a_chunk, b0, b1, c + (i0 + ir) * ldc + j0 + jr, ldc, mr,
                                     nr, alpha, beta, p0 > 0);
                    }
                }
                if (fuse && p0 + kc >= k) mr_cpu_gemm_epilogue_rows(c, epi->pre, epi->bias, epi->gelu, i0, i0 + mc, g->n);
            }
        }
    }
    tiles_release();
    if (fuse) __atomic_store_n(g->epi_done, 1, __ATOMIC_RELAXED);
}

static mr_pack_pool g_pool = MR_PACK_POOL(sizeof(uint16_t) * MC * KC, sizeof(uint16_t) * KC * NC);

static void run_block(const mr_gemm_args *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1, void *ap, void *bp) {
    gemm_block(g->trans_a, g->trans_b, i0, i1, j0, j1, g->k, g->alpha, g->a, g->lda, g->b, g->ldb, g->beta, g->c,
               g->ldc, ap, bp, g);
}

static int gemm_amx(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                    int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc,
                    const mr_gemm_epi *epi, int *done) {
    mr_gemm_args g = {trans_a, trans_b, m, n, k, alpha, beta, a, b, lda, ldb, ldc, c, epi, done};
    return mr_gemm_split_pref(&g, BLK, BLK, 1, &g_pool, run_block);
}

/* ---- the probe -------------------------------------------------------------------------------- */

static int g_amx_ok;
static const char *g_amx_why = "not probed"; /* why AMX is not used (a constant string) */
static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static sigjmp_buf g_probe_jmp;

static void on_sigill(int sig) {
    (void)sig;
    siglongjmp(g_probe_jmp, 1);
}

static int request_permission(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

/* A 37 x 45 x 70 GEMM of small integers (exact in f32 whatever the order), all transposes,
 * against a scalar loop; runs on the calling thread. */
static int self_test(void) {
    enum { M = 37, N = 45, K = 70 };
    static uint16_t a[M * K], b[K * N];
    static float c[M * N], ref[M * N];
    for (int i = 0; i < M * K; i++) {
        float v = (float)((i * 7 + 3) % 5 - 2);
        uint32_t u;
        memcpy(&u, &v, 4);
        a[i] = (uint16_t)(u >> 16);
    }
    for (int i = 0; i < K * N; i++) {
        float v = (float)((i * 11 + 1) % 7 - 3);
        uint32_t u;
        memcpy(&u, &v, 4);
        b[i] = (uint16_t)(u >> 16);
    }
    for (int t = 0; t < 4; t++) {
        int ta = t & 1, tb = t >> 1;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float s = 0;
                for (int p = 0; p < K; p++) {
                    uint16_t x = ta ? a[p * M + i] : a[i * K + p], y = tb ? b[j * K + p] : b[p * N + j];
                    uint32_t ux = (uint32_t)x << 16, uy = (uint32_t)y << 16;
                    float fx, fy;
                    memcpy(&fx, &ux, 4);
                    memcpy(&fy, &uy, 4);
                    s += fx * fy;
                }
                ref[i * N + j] = 2.0f * s + 1.0f;
                c[i * N + j] = 1.0f;
            }
        mr_gemm_args g = {ta, tb, M, N, K, 2.0f, 1.0f, a, b, ta ? M : K, tb ? K : N, N, c, NULL, NULL};
        if (!mr_gemm_split(&g, BLK, BLK, &g_pool, run_block)) return 0;
        if (memcmp(c, ref, sizeof c)) return 0;
    }
    return 1;
}

static void probe(void) {
    const mr_cpu_caps *caps = mr_cpu_caps_get();
    g_amx_why = "the CPU (or the OS, XCR0) offers no AMX-BF16 with AVX-512";
    if (!caps->amx_bf16 || !caps->avx512f || !caps->avx512bw || !caps->avx512vl) return;
    g_amx_why = "the kernel refused the AMX tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM)";
    if (!request_permission()) return;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigill;
    sigemptyset(&sa.sa_mask);
    g_amx_why = "no SIGILL guard could be installed for the self-test";
    if (sigaction(SIGILL, &sa, &old) != 0) return;
    volatile int ok = 0, trapped = 1;
    if (sigsetjmp(g_probe_jmp, 1) == 0) {
        ok = self_test();
        trapped = 0;
    }
    sigaction(SIGILL, &old, NULL);
    g_amx_ok = ok;
    g_amx_why = ok ? "" : trapped ? "the self-test raised SIGILL" : "the self-test's results differ from the scalar reference";
}

const char *mr_cpu_amx_bf16_why(void) {
    pthread_once(&g_probe_once, probe);
    return g_amx_why;
}

int mr_cpu_amx_bf16_usable(void) {
    pthread_once(&g_probe_once, probe);
    return g_amx_ok;
}

int mr_cpu_gemm_bf16_amx_epi(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                             int64_t ldc, const mr_gemm_epi *epi, int *done) {
    int dummy = 0;
    *(done ? done : &dummy) = 0;
    if (!mr_cpu_amx_bf16_usable()) return 0;
    return gemm_amx(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, done ? epi : NULL, done);
}

int mr_cpu_gemm_bf16_amx(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                         int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    return mr_cpu_gemm_bf16_amx_epi(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL, NULL);
}
