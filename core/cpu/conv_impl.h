/* Private to the CPU convolution kernels: the geometry and the helpers shared by
 * core/cpu/conv_cpu.c (CONV2D and its two gradients: im2col + GEMM, the direct few-tap kernels,
 * workspace sizing) and core/cpu/conv_pool_cpu.c (CONV2D_MAXPOOL and the pooled-dy scatter of the
 * gradients with p.conv.pool). Each function's contract is at its definition. */
#ifndef MR_CPU_CONV_IMPL_H
#define MR_CPU_CONV_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include "core/ops_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Below this many multiply-adds the loops stay on one thread. */
#define CONV_PAR_MIN (1 << 18)
/* Few taps (CKK at most this): the forward and the filter gradient run directly (conv_cpu.c). */
#define CONV_DIRECT_TAPS 16

typedef struct mr_conv_dims {
    int64_t n, c, h, w, o, kh, kw, oh, ow, ckk, ohw;
    int sh, sw, ph, pw;
    int avx512; /* stride-1 rows of im2col/col2im by masked AVX-512 loads and stores */
    int bf16;     /* p.conv.bf16: w, col and dyb bf16; x and dy rounded to bf16 as read */
    int64_t es;   /* bytes per element of w, col, dyb: 2 (bf16) or 4 */
    int64_t xes;  /* bytes per element of x (im2col's and the direct forward's source) */
    int64_t dyes; /* bytes per element of dy (the backward ops' in[1]) */
    int relu;     /* the forward's p.conv.relu: y = max(conv + bias, 0) */
    int pool;     /* the backward's p.conv.pool: dy (N,O,OH/2,OW/2) scattered at in[2]'s argmax as read */
    int filter;   /* CONV2D_BWD_FILTER */
    int64_t dyhw; /* elements of one (image, channel) plane of dy: OHW, or (OH/2)*(OW/2) pooled */
} mr_conv_dims;

/* conv_cpu.c: geometry, batching, workspace slots, dtype and error messages. */
int mr_cpu_conv_dims_get(const mr_op_args *a, const mr_view *x, const mr_view *w, mr_conv_dims *g);
size_t mr_cpu_conv_threads(void);
int64_t mr_cpu_conv_batch(const mr_conv_dims *g);
size_t mr_cpu_conv_slot_floats(const mr_conv_dims *g);
int mr_cpu_conv_fwd_direct(const mr_conv_dims *g);
int mr_cpu_conv_dtype_ok(const mr_op_args *a);
mr_status mr_cpu_conv_f32_only(const mr_op_args *a, mr_dtype dt);
mr_status mr_cpu_conv_no_workspace(const mr_op_args *a);
mr_status mr_cpu_conv_gemm_failed(const mr_op_args *a);
void mr_cpu_conv_share(const mr_conv_dims *g, int slots, int64_t *bsz, int64_t *batches, int *nt);
/* conv_cpu.c: the im2col + GEMM forward of one batch of images. */
int mr_cpu_conv_fwd_batch(const mr_conv_dims *g, const void *x, const void *w, const float *bias, float *y,
                          int64_t nb, void *col, float *yb, int par);

/* conv_pool_cpu.c: one (image, channel) plane of pooled dy scattered to the conv output's size. */
int mr_cpu_conv_pool_scatter(const mr_conv_dims *g, void *d, int64_t des, const void *s, int64_t ses,
                             const int32_t *am);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CONV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* The taps of the direct kernels: input offset, kernel row and valid output columns of each. */
typedef struct mr_conv_taps {
    int64_t off[CONV_DIRECT_TAPS], i[CONV_DIRECT_TAPS], lo[CONV_DIRECT_TAPS], hi[CONV_DIRECT_TAPS];
} mr_conv_taps;

/* conv_cpu.c: the direct forward's taps and output rows, and f32 rows rounded to bf16. */
void mr_cpu_conv_taps_get(const mr_conv_dims *g, mr_conv_taps *tp);
CONV_AVX512 void mr_cpu_conv_fwd_direct_rows(const mr_conv_dims *g, const mr_conv_taps *tp, const void *xn,
                                             const float *w, const float *bias, float *yn, int64_t oh0, int64_t oh1);
CONV_AVX512 void mr_cpu_conv_row_round_avx512(uint16_t *d, const float *s, int64_t n);
#endif

#ifdef __cplusplus
}
#endif

#endif
