/* mirror's own single-precision GEMM for AVX-512 CPUs (Goto/BLIS blocking).
 *
 * C (m,n) = alpha * op(A) (m,k) * op(B) (k,n) + beta * C, row-major with row strides.
 *  - micro-kernel: a 14 x 32 tile of C held in 28 zmm registers; each k step loads two vectors
 *    of a packed B panel and broadcasts 14 values of a packed A panel (28 FMAs per 2 loads + 14
 *    broadcasts, which the two FMA ports sustain).
 *  - blocking: KC = 256 (a 32-column B micro-panel, 32 KiB, stays in L1 across the row loop),
 *    MC = 168 rows of packed A (168 KiB, in L2), NC = 512 columns of packed B (512 KiB, in L2;
 *    2048 thrashed the 2 MiB L2 at 4096^3: 262 -> 297 GFLOP/s on 2 threads).
 *  - threads split the columns of C (in 32-column units; rows when n is small), so every element
 *    of C is computed by one thread in one fixed k order: results do not depend on the thread
 *    count. Inside an enclosing OpenMP parallel region it runs on the calling thread alone.
 *  - packing buffers come from a process-wide pool (one set per concurrent caller thread), so
 *    steady-state calls do not allocate.
 * Used only where mr_cpu_caps_get() reports AVX-512F (gemm_cpu.c selects it). */
#include "core/cpu/cpu_impl.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { MR = 14, NR = 32, KC = 256, MC = 168, NC = 512 };

/* Packing buffers come from a process-wide pool: a call takes one set per thread and gives it
 * back, so concurrent callers (OpenMP teams, replica threads, loader threads) never share one,
 * and after the first calls the pool holds enough sets that nothing is allocated. */

/* Transposes the 16x16 block r[0..16) in registers (r[i] lane j -> r[j] lane i). */
__attribute__((target("avx512f"))) static inline void transpose16(__m512 r[16]) {
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

/* Packs op(A)[i0:i0+mc, p0:p0+kc] into micro-panels of MR rows: ap[panel][k][r], zero padded.
 * Untransposed A: 16 k at a time, 14 rows loaded contiguously and transposed in registers (a
 * strided gather per k cost ~12% of a GPT training step); the k tail with a masked gather.
 * Transposed A is a contiguous masked load per k. */
__attribute__((target("avx512f"))) static void pack_a(int trans_a, const float *a, int64_t lda, int64_t i0,
                                                       int64_t p0, int mc, int kc, float *ap) {
    for (int ir = 0; ir < mc; ir += MR) {
        int mr = mc - ir < MR ? mc - ir : MR;
        float *dst = ap + (int64_t)ir * kc;
        __mmask16 m = (__mmask16)((1u << mr) - 1u);
        if (!trans_a) {
            const float *base = a + (i0 + ir) * lda + p0;
            int k = 0;
            for (; k + 16 <= kc; k += 16) {
                __m512 r[16];
                for (int i = 0; i < 16; i++) r[i] = i < mr ? _mm512_loadu_ps(base + i * lda + k) : _mm512_setzero_ps();
                transpose16(r);
                for (int j = 0; j < 16; j++) _mm512_mask_storeu_ps(dst + (k + j) * MR, (__mmask16)0x3fff, r[j]);
            }
            if (k < kc) {
                if (lda <= INT32_MAX / MR) {
                    __m512i idx = _mm512_mullo_epi32(
                        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32((int)lda));
                    for (; k < kc; k++) {
                        __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, base + k, 4);
                        _mm512_mask_storeu_ps(dst + k * MR, (__mmask16)0x3fff, v);
                    }
                } else {
                    for (; k < kc; k++)
                        for (int r = 0; r < MR; r++) dst[k * MR + r] = r < mr ? base[r * lda + k] : 0.0f;
                }
            }
        } else {
            for (int k = 0; k < kc; k++) {
                __m512 v = _mm512_maskz_loadu_ps(m, a + (p0 + k) * lda + i0 + ir);
                _mm512_mask_storeu_ps(dst + k * MR, (__mmask16)0x3fff, v);
            }
        }
    }
}

/* Packs op(B)[p0:p0+kc, j0:j0+nc] into micro-panels of NR columns: bp[panel][k][c], zero padded.
 * Untransposed B is a masked copy of 32 contiguous floats per k; transposed B gathers 16 columns
 * at a time with stride ldb. */
__attribute__((target("avx512f"))) static void pack_b(int trans_b, const float *b, int64_t ldb, int64_t p0,
                                                       int64_t j0, int kc, int nc, float *bp) {
    if (!trans_b) {
        /* row by row: each source row is read once, contiguously (reading a 32-column panel at a
         * time would stride rows ldb apart and cost ~10% of a 1024^3 GEMM) */
        for (int k = 0; k < kc; k++) {
            const float *src = b + (p0 + k) * ldb + j0;
            for (int jr = 0; jr < nc; jr += NR) {
                int nr = nc - jr < NR ? nc - jr : NR;
                __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1u);
                __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : (nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1u));
                float *dst = bp + (int64_t)jr * kc + k * NR;
                _mm512_store_ps(dst, _mm512_maskz_loadu_ps(m0, src + jr));
                _mm512_store_ps(dst + 16, _mm512_maskz_loadu_ps(m1, src + jr + 16));
            }
        }
        return;
    }
    for (int jr = 0; jr < nc; jr += NR) {
        int nr = nc - jr < NR ? nc - jr : NR;
        float *dst = bp + (int64_t)jr * kc;
        __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1u);
        __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : (nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1u));
        if (ldb <= INT32_MAX / NR) {
            const float *base = b + (j0 + jr) * ldb + p0;
            __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32((int)ldb));
            const float *base1 = base + 16 * ldb;
            int k = 0;
            /* 16 k at a time: each half of the panel is 16 rows of B read contiguously and
             * transposed in registers (as pack_a; the gathers below cost ~4x more) */
            for (; k + 16 <= kc; k += 16)
                for (int half = 0; half < 2; half++) {
                    int rows = nr - 16 * half;
                    __m512 r[16];
                    for (int i = 0; i < 16; i++)
                        r[i] = i < rows ? _mm512_loadu_ps(base + (16 * half + i) * ldb + k) : _mm512_setzero_ps();
                    transpose16(r);
                    for (int j = 0; j < 16; j++) _mm512_store_ps(dst + (k + j) * NR + 16 * half, r[j]);
                }
            for (; k < kc; k++) {
                _mm512_store_ps(dst + k * NR, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m0, idx, base + k, 4));
                _mm512_store_ps(dst + k * NR + 16,
                                m1 ? _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m1, idx, base1 + k, 4)
                                   : _mm512_setzero_ps());
            }
        } else {
            for (int k = 0; k < kc; k++)
                for (int c = 0; c < NR; c++) dst[k * NR + c] = c < nr ? b[(j0 + jr + c) * ldb + p0 + k] : 0.0f;
        }
    }
}

/* acc = ap (kc x MR) ^T * bp (kc x NR); then C[0:mr, 0:nr] = alpha*acc + (accumulate ? C : beta*C)
 * (beta == 0 and !accumulate: C is not read). */
__attribute__((target("avx512f"))) static void micro_kernel(int kc, const float *ap, const float *bp, float *c,
                                                             int64_t ldc, int mr, int nr, float alpha, float beta,
                                                             int accumulate) {
    __m512 acc[MR][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(bp + k * NR), b1 = _mm512_load_ps(bp + k * NR + 16);
        const float *a = ap + k * MR;
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) {
            __m512 av = _mm512_set1_ps(a[r]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
        }
    }
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1u);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : (nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1u));
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
                       int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc, float *ap, float *bp) {
    for (int64_t j0 = j_begin; j0 < j_end; j0 += NC) {
        int nc = (int)(j_end - j0 < NC ? j_end - j0 : NC);
        /* k blocks of equal size (784 = 4 x 196, not 3 x 256 + a 16 whose C updates cost more
         * than its FMAs) */
        const int64_t kblocks = (k + KC - 1) / KC, kstep = (k + kblocks - 1) / kblocks;
        for (int64_t p0 = 0; p0 < k; p0 += kstep) {
            int kc = (int)(k - p0 < kstep ? k - p0 : kstep);
            pack_b(trans_b, b, ldb, p0, j0, kc, nc, bp);
            for (int64_t i0 = i_begin; i0 < i_end; i0 += MC) {
                int mc = (int)(i_end - i0 < MC ? i_end - i0 : MC);
                pack_a(trans_a, a, lda, i0, p0, mc, kc, ap);
                for (int jr = 0; jr < nc; jr += NR) {
                    int nr = nc - jr < NR ? nc - jr : NR;
                    for (int ir = 0; ir < mc; ir += MR) {
                        int mr = mc - ir < MR ? mc - ir : MR;
                        micro_kernel(kc, ap + (int64_t)ir * kc, bp + (int64_t)jr * kc,
                                     c + (i0 + ir) * ldc + j0 + jr, ldc, mr, nr, alpha, beta, p0 > 0);
                    }
                }
            }
        }
    }
}

static mr_pack_pool g_pool = MR_PACK_POOL(sizeof(float) * MC * KC, sizeof(float) * KC * NC);

static void run_block(const mr_gemm_args *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1, void *ap, void *bp) {
    gemm_block(g->trans_a, g->trans_b, i0, i1, j0, j1, g->k, g->alpha, g->a, g->lda, g->b, g->ldb, g->beta, g->c,
               g->ldc, ap, bp);
}

int mr_cpu_sgemm_avx512(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                        int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0 || k <= 0) return 0; /* the caller handles the degenerate cases */
    mr_gemm_args g = {trans_a, trans_b, m, n, k, alpha, beta, a, b, lda, ldb, ldc, c, NULL, NULL};
    return mr_gemm_split(&g, MR, NR, &g_pool, run_block);
}
