/* Private to the CPU backend: CPU features, the GEMM provider, threading helpers. */
#ifndef MR_CPU_IMPL_H
#define MR_CPU_IMPL_H

#include <stdint.h>
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_cpu_caps {
    int sse42, avx, avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, avx512_fp16, amx_bf16;
} mr_cpu_caps;

/* Read once with CPUID (and XGETBV: the OS must save the AVX/AVX-512 state). Thread-safe. */
const mr_cpu_caps *mr_cpu_caps_get(void);

/* One plane of MAXPOOL2D's 2x2/stride-2 case without padding (core/cpu/pool_cpu.c): xp (.., w) ->
 * yp and ap (oh, ow), argmax the flat index into xp's plane, -1 where !(max > 0) when relu
 * (p.pool.relu). AVX-512 where the CPU has it; the reference's rules (ties, NaN) either way.
 * Also the pool of CONV2D_MAXPOOL (core/cpu/conv_pool_cpu.c). */
void mr_cpu_maxpool22_plane(const float *xp, float *yp, int32_t *ap, int64_t w, int64_t oh, int64_t ow, int relu);
/* MAXPOOL2D_BWD of one such plane when its size is exactly (2*oh, 2*ow): dxp (2*oh, 2*ow) := dyp
 * (oh, ow) at the argmax ap (bits copied), 0 elsewhere, by AVX-512. 0 when the CPU lacks it or an
 * argmax is neither -1 nor in its own window (dxp then holds nothing reliable). Also the scatter of
 * the conv backward's pooled dy (core/cpu/conv_pool_cpu.c, p.conv.pool). */
int mr_cpu_maxpool22_bwd_plane(const int32_t *ap, const float *dyp, float *dxp, int64_t oh, int64_t ow);

/* The GEMM op's epilogue on rows of C (ldc == n): C += bias (n; NULL: none), then, with gelu, pre =
 * C (pre NULL: not kept) and C = GELU(C). */
typedef struct mr_gemm_epi {
    const float *bias;
    float *pre;
    int gelu;
} mr_gemm_epi;

/* The epilogue on rows [r0, r1) of C (n columns, contiguous), in the vector body the CPU has; a
 * row's bits do not depend on which rows a call covers (gemm_cpu.c). */
void mr_cpu_gemm_epilogue_rows(float *C, float *pre, const float *bias, int gelu, int64_t r0, int64_t r1, int64_t n);

/* mr_cpu_gemm_bf16 with the op's epilogue folded in where the kernel can apply it to rows of C
 * while they are in cache (the AMX kernel, when each thread's share is whole rows of a C at most
 * 512 wide with ldc == n): then *done = 1; else *done = 0 and the caller runs the epilogue. Same
 * bits either way. epi NULL: none. */
mr_status mr_cpu_gemm_bf16_epi(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                               int64_t ldc, const mr_gemm_epi *epi, int *done);

/* Row-major single-precision GEMM through the provider chosen at first use:
 * C (m,n) = alpha * op(A) * op(B) + beta * C, with row strides lda/ldb/ldc in elements.
 * Called from inside an OpenMP parallel region (active or not) it runs on the calling thread only.
 * Never fails: the built-in kernel is the last resort. */
void mr_cpu_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* The built-in blocked kernel (used when no BLAS passes verification; exposed for tests). */
void mr_cpu_sgemm_builtin(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                          int64_t ldc);

/* mirror's AVX-512 kernel (sgemm_avx512.c); requires AVX-512F. Returns 0 without touching C
 * when it cannot run (out of memory for packing buffers), 1 when done. m, n, k > 0. */
int mr_cpu_sgemm_avx512(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                        int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* Mixed-precision GEMM (gemm_bf16_avx512.c): C (m,n) f32 = alpha * op(A) * op(B) + beta * C with
 * A and B bf16 (bits as uint16_t), products exact, sums in f32; row strides in elements.
 * Where AMX-BF16 passes its probe an AMX tile kernel; else on CPUs with AVX512_BF16 a vdpbf16ps
 * kernel (both thread-count invariant, like the f32 one); elsewhere, or with MIRROR_GEMM_BF16=fallback
 * in the environment at first use, the inputs are widened to f32 and mr_cpu_sgemm runs
 * (MIRROR_GEMM_BF16=avx512 skips AMX). beta == 0 does not read C. Called from inside an OpenMP parallel region it
 * runs on the calling thread only. Returns MR_OK, or MR_ERR_NOMEM (C untouched). Thread-safe. */
mr_status mr_cpu_gemm_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                           int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* The portable path: bf16 (is_f16 == 0) or f16 inputs widened exactly to f32 (a fresh copy per
 * call), then mr_cpu_sgemm. Serves f16 always and bf16 without AVX512_BF16; exposed for tests.
 * Returns MR_OK or MR_ERR_NOMEM (C untouched). */
/* dst (n) f32 = src (n) f16 bits (exact widening; vectorised where the CPU allows). */
void mr_cpu_widen_f16(const uint16_t *src, float *dst, int64_t n);
mr_status mr_cpu_gemm_half_via_f32(int is_f16, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                   float alpha, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                                   float beta, float *c, int64_t ldc);

/* The AMX-BF16 kernel (gemm_bf16_amx.c). mr_cpu_amx_bf16_usable probes once (CPUID/XCR0, the
 * kernel's permission for the tile data, a small self-test under a SIGILL guard) and says whether
 * AMX may be used. mr_cpu_gemm_bf16_amx has mr_cpu_gemm_bf16's contract with m, n, k > 0 and is
 * thread-count invariant; it returns 0 without touching C when AMX is unusable or on
 * out-of-memory, 1 when done. */
int mr_cpu_amx_bf16_usable(void);
/* Why mr_cpu_amx_bf16_usable says no, in words ("" when it says yes). */
const char *mr_cpu_amx_bf16_why(void);
int mr_cpu_gemm_bf16_amx(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                         int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* ... with the op's epilogue where it applies (see mr_cpu_gemm_bf16_epi). */
int mr_cpu_gemm_bf16_amx_epi(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                             int64_t ldc, const mr_gemm_epi *epi, int *done);

/* The vdpbf16ps kernel alone (exposed for tests): returns 0 without touching C when the CPU lacks
 * AVX512_BF16/BW/VL or on out-of-memory, 1 when done. m, n, k > 0. */
int mr_cpu_gemm_bf16_vdpbf16ps(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                               int64_t ldc);

/* Which bf16 path mr_cpu_gemm_bf16 takes on this machine, in words. Never NULL. */
const char *mr_cpu_gemm_bf16_provider(void);

/* Propagates the process thread count to the provider. */
void mr_cpu_gemm_set_threads(int n);


/* ---- shared by mirror's GEMM kernels (gemm_split.c) ---- */

/* Packing buffers: a process-wide pool per kernel of (A, B) pairs of fixed byte sizes. A call
 * takes one pair per thread and gives it back, so concurrent callers never share one and steady
 * state allocates nothing. Declare a pool as `static mr_pack_pool p = MR_PACK_POOL(a, b);`. */
typedef struct mr_pack_bufs {
    void *ap, *bp;
    struct mr_pack_bufs *next_free, *next_all;
} mr_pack_bufs;

typedef struct mr_pack_pool {
    size_t a_bytes, b_bytes;
    mr_pack_bufs *free_list, *all;
    struct mr_pack_pool *next_pool;
    int registered;
} mr_pack_pool;

#define MR_PACK_POOL(a_bytes, b_bytes) {(a_bytes), (b_bytes), NULL, NULL, NULL, 0}

/* C (m,n) = alpha * op(A) (m,k) * op(B) (k,n) + beta * C; a and b point at f32 or bf16 data; epi
 * (optional, AMX kernel only): the op's epilogue, epi_done set when it was applied. */
typedef struct mr_gemm_args {
    int trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
    const void *a, *b;
    int64_t lda, ldb, ldc;
    float *c;
    const mr_gemm_epi *epi;
    int *epi_done;
} mr_gemm_args;

/* A kernel's share: rows [i0, i1) x columns [j0, j1) of C, with one thread's packing buffers. */
typedef void (*mr_gemm_block_fn)(const mr_gemm_args *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1, void *ap,
                                 void *bp);

/* Runs `block` over C split across OpenMP threads in units of col_unit columns (row_unit rows when
 * C is narrow), never splitting K, so every element of C is summed by one thread in one order:
 * results do not depend on the thread count. Inside any OpenMP region it runs on the calling
 * thread. Returns 0 without touching C when buffers cannot be had, 1 when done. m, n, k > 0. */
int mr_gemm_split(const mr_gemm_args *g, int64_t row_unit, int64_t col_unit, mr_pack_pool *pool, mr_gemm_block_fn block);
/* mr_gemm_split, but with prefer_rows a C at least as tall as wide with rows enough for two units a
 * thread is split by rows (each thread then reads only its rows of A and all of the small B; the
 * AMX kernel loads A's tiles straight from A). Results are the same whatever the split. */
int mr_gemm_split_pref(const mr_gemm_args *g, int64_t row_unit, int64_t col_unit, int prefer_rows, mr_pack_pool *pool,
                       mr_gemm_block_fn block);

#ifdef __cplusplus
}
#endif
#endif
