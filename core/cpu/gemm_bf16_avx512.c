/* Mixed-precision GEMM on the CPU: bf16 (or f16) inputs, f32 accumulation, f32 C.
 *
 * C (m,n) f32 = alpha * op(A) (m,k) * op(B) (k,n) + beta * C, A and B bf16 (uint16_t bits),
 * row-major with row strides in elements.
 *  - kernel (CPUs with AVX512_BF16): vdpbf16ps (_mm512_dpbf16_ps) multiplies 16 pairs of bf16
 *    and adds both exact products to 16 f32 lanes: twice the flops of an f32 FMA per
 *    instruction. Operands are packed in the pair-interleaved layout it reads: one 32-bit word
 *    holds (k even, k odd) of one row of op(A) or one column of op(B); an odd k is padded with 0.
 *  - micro-kernel: a 14 x 32 tile of C in 28 zmm accumulators, as in sgemm_avx512.c; each k pair
 *    loads two vectors of a packed B panel (32 columns x 2 k) and broadcasts 14 A words.
 *  - blocking: KCP = 256 k pairs (512 k; a 32-column B micro-panel is still 32 KiB), MC = 168
 *    rows, NC = 512 columns: the same bytes as the f32 kernel, half as many C updates.
 *  - packing handles the transposes: untransposed A and transposed B have the pairs contiguous
 *    (32-bit words, a 16x16 word transpose in registers); transposed A and untransposed B
 *    interleave two k rows (zero-extend to 32 bits, shift, or).
 *  - threads split C (columns in 32-column units; rows when n is small), never K: each element
 *    of C is summed by one thread in one fixed k order, so results do not depend on the thread
 *    count. Inside an OpenMP parallel region it runs on the calling thread.
 *  - packing buffers come from a process-wide pool: no allocation in steady state.
 * Where AMX-BF16 passes its probe (gemm_bf16_amx.c) mr_cpu_gemm_bf16 uses that kernel first;
 * MIRROR_GEMM_BF16=avx512 keeps this one.
 * Elsewhere (no AVX512_BF16, MIRROR_GEMM_BF16=fallback, and f16 inputs always) the inputs are
 * widened exactly to f32 and mr_cpu_sgemm runs: correct, not fast. The two paths round the f32
 * accumulation differently (vdpbf16ps adds the pair's products in its own order and flushes
 * bf16 denormals to zero), so they agree to f32 accuracy, not bit for bit. */
#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { MR = 14, NR = 32, KCP = 256, MC = 168, NC = 512 };

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* ---- packing buffer pool (as in sgemm_avx512.c; words are bf16 pairs) ------------------------ */


/* ---- packing ---------------------------------------------------------------------------------- */

/* Transposes the 16x16 block of 32-bit words r[0..16) in registers (r[i] lane j -> r[j] lane i). */
BF16_TARGET static inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(u[h + i], u[h + 4 + i], 0x88);
            t[h + 4 + i] = _mm512_shuffle_f32x4(u[h + i], u[h + 4 + i], 0xDD);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    }
}

static inline __mmask16 low_mask(int n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u); }

/* Words: rows [0, rows) of a (stride ld, in bf16) hold pairs contiguously from column 2*w0; writes
 * the pair-interleaved panel dst[kp][width] (kp in [0, (kc+1)/2), width MR or NR, lanes col0..)
 * for `rows` source rows and zero for the rest, `width` being the panel width. kc is the number
 * of k in the block; an odd last k is padded with 0. */
BF16_TARGET static void pack_pairs_contiguous(const uint16_t *src, int64_t ld, int rows, int kc, uint32_t *dst,
                                              int width, int col0) {
    int full = kc / 2;
    for (int w = 0; w < full; w += 16) {
        int nw = full - w < 16 ? full - w : 16;
        __mmask16 km = low_mask(nw);
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < rows ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(km, src + i * ld + 2 * w))
                            : _mm512_setzero_ps();
        transpose16(r);
        __mmask16 sm = low_mask(width - col0 < 16 ? width - col0 : 16);
        for (int j = 0; j < nw; j++) _mm512_mask_storeu_ps((float *)(dst + (w + j) * width + col0), sm, r[j]);
    }
    if (kc & 1) {
        int lim = width - col0 < 16 ? width - col0 : 16;
        for (int i = 0; i < lim; i++) dst[full * width + col0 + i] = i < rows ? src[i * ld + 2 * full] : 0u;
    }
}

/* Packs op(A)[i0:i0+mc, p0:p0+kc] into micro-panels of MR rows: ap[panel][kp][r] words. */
BF16_TARGET static void pack_a(int trans_a, const uint16_t *a, int64_t lda, int64_t i0, int64_t p0, int mc, int kc,
                               uint32_t *ap) {
    int kpn = (kc + 1) / 2;
    for (int ir = 0; ir < mc; ir += MR) {
        int mr = mc - ir < MR ? mc - ir : MR;
        uint32_t *dst = ap + (int64_t)ir * kpn;
        if (!trans_a) {
            pack_pairs_contiguous(a + (i0 + ir) * lda + p0, lda, mr, kc, dst, MR, 0);
        } else {
            /* A is (k, m): rows 2kp and 2kp+1 give the pair, 14 contiguous rows of op(A) each */
            __mmask16 rm = low_mask(mr);
            for (int kp = 0; kp < kpn; kp++) {
                const uint16_t *s0 = a + (p0 + 2 * kp) * lda + i0 + ir;
                __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(rm, s0));
                __m512i hi = 2 * kp + 1 < kc ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(rm, s0 + lda))
                                             : _mm512_setzero_si512();
                _mm512_mask_storeu_epi32(dst + kp * MR, (__mmask16)0x3fff, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
    }
}

/* Packs op(B)[p0:p0+kc, j0:j0+nc] into micro-panels of NR columns: bp[panel][kp][c] words. */
BF16_TARGET static void pack_b(int trans_b, const uint16_t *b, int64_t ldb, int64_t p0, int64_t j0, int kc, int nc,
                               uint32_t *bp) {
    int kpn = (kc + 1) / 2;
    if (!trans_b) {
        /* B is (k, n): two k rows interleaved, each read once contiguously */
        for (int kp = 0; kp < kpn; kp++) {
            const uint16_t *s0 = b + (p0 + 2 * kp) * ldb + j0;
            int has1 = 2 * kp + 1 < kc;
            for (int jr = 0; jr < nc; jr += NR) {
                int nr = nc - jr < NR ? nc - jr : NR;
                uint32_t *dst = bp + (int64_t)jr * kpn + kp * NR;
                for (int h = 0; h < 2; h++) {
                    __mmask16 m = low_mask(nr - 16 * h);
                    __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s0 + jr + 16 * h));
                    __m512i hi = has1 ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s0 + ldb + jr + 16 * h))
                                      : _mm512_setzero_si512();
                    _mm512_store_si512(dst + 16 * h, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
                }
            }
        }
        return;
    }
    /* B is (n, k): each column of op(B) holds its pairs contiguously */
    for (int jr = 0; jr < nc; jr += NR) {
        int nr = nc - jr < NR ? nc - jr : NR;
        uint32_t *dst = bp + (int64_t)jr * kpn;
        for (int h = 0; h < 2; h++)
            pack_pairs_contiguous(b + (j0 + jr + 16 * h) * ldb + p0, ldb, nr - 16 * h, kc, dst, NR, 16 * h);
    }
}

/* ---- micro-kernel and blocking ---------------------------------------------------------------- */

/* acc = ap (kpn x MR pairs)^T * bp (kpn x NR pairs); then C[0:mr, 0:nr] = alpha*acc +
 * (accumulate ? C : beta*C) (beta == 0 and !accumulate: C is not read). */
BF16_TARGET static void micro_kernel(int kpn, const uint32_t *ap, const uint32_t *bp, float *c, int64_t ldc, int mr,
                                     int nr, float alpha, float beta, int accumulate) {
    __m512 acc[MR][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int kp = 0; kp < kpn; kp++) {
        __m512bh b0 = (__m512bh)_mm512_load_si512(bp + kp * NR), b1 = (__m512bh)_mm512_load_si512(bp + kp * NR + 16);
        const uint32_t *a = ap + kp * MR;
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
    __mmask16 m0 = low_mask(nr), m1 = low_mask(nr - 16);
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int r = 0; r < mr; r++) {
        float *cr = c + r * ldc;
        __m512 y0 = _mm512_mul_ps(va, acc[r][0]), y1 = _mm512_mul_ps(va, acc[r][1]);
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
                       float beta, float *c, int64_t ldc, uint32_t *ap, uint32_t *bp) {
    /* k blocks of equal, even size (so every block but the last starts and ends on a pair) */
    const int64_t kblocks = (k + 2 * KCP - 1) / (2 * KCP);
    int64_t kstep = (k + kblocks - 1) / kblocks;
    kstep += kstep & 1;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += NC) {
        int nc = (int)(j_end - j0 < NC ? j_end - j0 : NC);
        for (int64_t p0 = 0; p0 < k; p0 += kstep) {
            int kc = (int)(k - p0 < kstep ? k - p0 : kstep), kpn = (kc + 1) / 2;
            pack_b(trans_b, b, ldb, p0, j0, kc, nc, bp);
            for (int64_t i0 = i_begin; i0 < i_end; i0 += MC) {
                int mc = (int)(i_end - i0 < MC ? i_end - i0 : MC);
                pack_a(trans_a, a, lda, i0, p0, mc, kc, ap);
                for (int jr = 0; jr < nc; jr += NR) {
                    int nr = nc - jr < NR ? nc - jr : NR;
                    for (int ir = 0; ir < mc; ir += MR) {
                        int mr = mc - ir < MR ? mc - ir : MR;
                        micro_kernel(kpn, ap + (int64_t)ir * kpn, bp + (int64_t)jr * kpn,
                                     c + (i0 + ir) * ldc + j0 + jr, ldc, mr, nr, alpha, beta, p0 > 0);
                    }
                }
            }
        }
    }
}

/* The AVX512_BF16 kernel; m, n, k > 0. Returns 0 without touching C on out-of-memory. */
static mr_pack_pool g_pool = MR_PACK_POOL(sizeof(uint32_t) * MC * KCP, sizeof(uint32_t) * KCP * NC);

static void run_block(const mr_gemm_args *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1, void *ap, void *bp) {
    gemm_block(g->trans_a, g->trans_b, i0, i1, j0, j1, g->k, g->alpha, g->a, g->lda, g->b, g->ldb, g->beta, g->c,
               g->ldc, ap, bp);
}

static int gemm_bf16_avx512(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                            const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                            int64_t ldc) {
    mr_gemm_args g = {trans_a, trans_b, m, n, k, alpha, beta, a, b, lda, ldb, ldc, c, NULL, NULL};
    return mr_gemm_split(&g, MR, NR, &g_pool, run_block);
}

int mr_cpu_gemm_bf16_vdpbf16ps(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                               int64_t ldc) {
    const mr_cpu_caps *caps = mr_cpu_caps_get();
    if (!caps->avx512_bf16 || !caps->avx512bw || !caps->avx512vl) return 0;
    return gemm_bf16_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* ---- the portable path and the dispatcher ----------------------------------------------------- */

/* Widens rows x cols of src (stride ld) to a fresh f32 copy with the same stride (NULL on OOM). */
static float *widen(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, int is_f16) {
    int64_t n = rows > 0 ? (rows - 1) * ld + cols : 0;
    float *dst = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!dst) return NULL;
    for (int64_t i = 0; i < n; i++) dst[i] = is_f16 ? mr_f16_to_f32(src[i]) : mr_bf16_to_f32(src[i]);
    return dst;
}

/* dst (n) f32 = src (n) f16 bits, exactly; AVX-512 vcvtph2ps where the CPU has it. */
__attribute__((target("avx512f"))) static void widen_f16_avx512(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++) dst[i] = mr_f16_to_f32(src[i]);
}

void mr_cpu_widen_f16(const uint16_t *src, float *dst, int64_t n) {
    if (mr_cpu_caps_get()->avx512f) {
        widen_f16_avx512(src, dst, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = mr_f16_to_f32(src[i]);
}

mr_status mr_cpu_gemm_half_via_f32(int is_f16, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                   float alpha, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                                   float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return MR_OK;
    float *af = widen(a, trans_a ? k : m, trans_a ? m : k, lda, is_f16);
    float *bf = widen(b, trans_b ? n : k, trans_b ? k : n, ldb, is_f16);
    if (!af || !bf) {
        free(af);
        free(bf);
        return mr_set_error(MR_ERR_NOMEM, "gemm: out of memory widening %s inputs (%lld x %lld x %lld) to f32",
                            is_f16 ? "f16" : "bf16", (long long)m, (long long)n, (long long)k);
    }
    mr_cpu_sgemm(trans_a, trans_b, m, n, k, alpha, af, lda, bf, ldb, beta, c, ldc);
    free(af);
    free(bf);
    return MR_OK;
}

static int g_use_kernel, g_use_amx;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* MIRROR_GEMM_BF16=fallback forces the widen-to-f32 path, =avx512 the vdpbf16ps kernel (no AMX). */
static void choose(void) {
    const mr_cpu_caps *k = mr_cpu_caps_get();
    const char *force = getenv("MIRROR_GEMM_BF16");
    int fallback = force && !strcmp(force, "fallback"), avx512 = force && !strcmp(force, "avx512");
    g_use_kernel = k->avx512_bf16 && k->avx512bw && k->avx512vl && !fallback;
    g_use_amx = !fallback && !avx512 && mr_cpu_amx_bf16_usable();
}

const char *mr_cpu_gemm_bf16_provider(void) {
    pthread_once(&g_once, choose);
    return g_use_amx      ? "mirror amx 32x32 tdpbf16ps kernel"
           : g_use_kernel ? "mirror avx512_bf16 14x32 vdpbf16ps kernel"
                          : "bf16 widened to f32, then the f32 GEMM";
}

mr_status mr_cpu_gemm_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                           int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    return mr_cpu_gemm_bf16_epi(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL, NULL);
}

mr_status mr_cpu_gemm_bf16_epi(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                               int64_t ldc, const mr_gemm_epi *epi, int *done) {
    pthread_once(&g_once, choose);
    if (done) *done = 0;
    if (m <= 0 || n <= 0) return MR_OK;
    if (k <= 0) {
        /* C = beta*C; beta == 0 overwrites (NaN garbage in C does not survive) */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return MR_OK;
    }
    if (g_use_amx && mr_cpu_gemm_bf16_amx_epi(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, epi, done))
        return MR_OK;
    if (g_use_kernel && gemm_bf16_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return MR_OK;
    return mr_cpu_gemm_half_via_f32(0, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
