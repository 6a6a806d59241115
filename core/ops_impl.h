/* Private: the kernel entry points behind the op table (core/op_table.c), grouped by family.
 * Each family file provides check (+ workspace), ref and cpu; core/cuda/ provides the cuda ones.
 * A family function serves every op id of its family (it switches on a->op outside its loops). */
#ifndef MR_OPS_IMPL_H
#define MR_OPS_IMPL_H

#include "core/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_DECLARE_KERNELS(fam)                                                                 \
    mr_status mr_##fam##_check(const mr_op_args *a);                                           \
    mr_status mr_##fam##_ref(const mr_op_args *a);                                             \
    mr_status mr_##fam##_cpu(const mr_op_args *a);                                             \
    mr_status mr_##fam##_cuda(const mr_op_args *a);

MR_DECLARE_KERNELS(gemm_fwd)           /* core/ref/gemm_ref.c, core/cpu/gemm_cpu.c, cuda/gemm.cu */
MR_DECLARE_KERNELS(binary_fwd)         /* ADD SUB MUL DIV: elementwise_{ref,cpu}.c */
MR_DECLARE_KERNELS(binary_bwd)
MR_DECLARE_KERNELS(unary_fwd)          /* RELU..SCALE */
MR_DECLARE_KERNELS(unary_bwd)
MR_DECLARE_KERNELS(reduce_fwd)         /* SUM MEAN MAX: reduce_{ref,cpu}.c */
MR_DECLARE_KERNELS(reduce_bwd)
MR_DECLARE_KERNELS(softmax_fwd)        /* SOFTMAX LOG_SOFTMAX: softmax_{ref,cpu}.c */
MR_DECLARE_KERNELS(softmax_bwd)
MR_DECLARE_KERNELS(xent_fwd)           /* SOFTMAX_XENT: softmax_{ref,cpu}.c */
MR_DECLARE_KERNELS(xent_bwd)
MR_DECLARE_KERNELS(layernorm_fwd)      /* layernorm_{ref,cpu}.c */
MR_DECLARE_KERNELS(layernorm_bwd)
MR_DECLARE_KERNELS(batchnorm_fwd)      /* batchnorm_{ref,cpu}.c */
MR_DECLARE_KERNELS(batchnorm_bwd)
MR_DECLARE_KERNELS(embedding_fwd)      /* embedding_{ref,cpu}.c */
MR_DECLARE_KERNELS(embedding_bwd)
MR_DECLARE_KERNELS(conv2d_fwd)         /* conv_{ref,cpu}.c */
MR_DECLARE_KERNELS(conv2d_bwd_data)
MR_DECLARE_KERNELS(conv2d_bwd_filter)
MR_DECLARE_KERNELS(conv2d_maxpool_fwd) /* conv_ref.c, conv_pool_cpu.c (CPU only) */
MR_DECLARE_KERNELS(maxpool2d_fwd)      /* pool_{ref,cpu}.c */
MR_DECLARE_KERNELS(maxpool2d_bwd)
MR_DECLARE_KERNELS(avgpool2d_fwd)      /* pool_{ref,cpu}.c */
MR_DECLARE_KERNELS(avgpool2d_bwd)
MR_DECLARE_KERNELS(dropout_fwd)        /* DROPOUT and DROPOUT_BWD: dropout_{ref,cpu}.c */
MR_DECLARE_KERNELS(permute_fwd)        /* permute_{ref,cpu}.c */
MR_DECLARE_KERNELS(concat_fwd)         /* concat_{ref,cpu}.c */
MR_DECLARE_KERNELS(cast_fwd)           /* cast_{ref,cpu}.c */
MR_DECLARE_KERNELS(sgd_update)         /* optim_{ref,cpu}.c */
MR_DECLARE_KERNELS(adamw_update)
MR_DECLARE_KERNELS(hook)               /* hook_ref.c: one function for every backend */
MR_DECLARE_KERNELS(attention_fwd)      /* attention_{ref,cpu}.c, cuda/attention.cu */
MR_DECLARE_KERNELS(attention_bwd)
MR_DECLARE_KERNELS(gemm_dc)            /* gemm_dc_{ref,cpu}.c, cuda/gemm_dc.cu */

/* SOFTMAX_XENT(_BWD): rejects a label outside [0, C) that is not ignore_index, before any output
 * is written (softmax_ref.c; the CPU kernels use it too). The CUDA kernels cannot (the labels are
 * in device memory; reading them on the host would sync): there such a row gets a NaN loss and a
 * NaN gradient row, which the trainer's finite check catches (core/cuda/softmax.cu). */
mr_status mr_xent_check_labels(const mr_op_args *a, const int32_t *labels, int64_t n, int64_t c);

/* Columns row `row` of a softmax sees: all of them, or with p.softmax.causal (x (..., T, S))
 * row % T + 1 + S - T. */
int64_t mr_softmax_causal_cols(const mr_op_args *a, int64_t row, int64_t cols);

/* Scratch bytes for the CPU conv kernels (im2col buffers, one per thread). */
size_t mr_gemm_fwd_workspace(const mr_op_args *a); /* f16 inputs widened on the CPU */
size_t mr_conv2d_fwd_workspace(const mr_op_args *a);
size_t mr_conv2d_bwd_data_workspace(const mr_op_args *a);
size_t mr_conv2d_bwd_filter_workspace(const mr_op_args *a);
size_t mr_conv2d_maxpool_fwd_workspace(const mr_op_args *a);
/* Scratch bytes for EMBEDDING_BWD in f32: the CUDA kernel's per-row buckets of token positions
 * (i32 row starts, fill cursors and positions); 0 for f64; the CPU kernel leaves it unused. */
size_t mr_embedding_bwd_workspace(const mr_op_args *a);
/* Scratch bytes for the CPU attention kernels: per thread a probability row and, for half inputs,
 * f32 copies of one (T, D)/(S, D) slice of each operand (core/cpu/attention_cpu.c). */
size_t mr_attention_fwd_workspace(const mr_op_args *a);
size_t mr_attention_bwd_workspace(const mr_op_args *a);
/* Scratch bytes for GEMM_DC's CPU kernel: the dbias partial sums of every 64-row block. */
size_t mr_gemm_dc_workspace(const mr_op_args *a);
#define MR_GEMM_DC_ROWS 64

/* How attention ran on CUDA devices (mr_attention_paths_get, core/ops.h): attention.cu notes
 * each call, cudnn 1 for cuDNN's flash attention (core/cuda/attention_cudnn.cu), 0 for mirror's
 * kernels. Thread-safe. */
void mr_attention_path_note(int cudnn, int bwd);
/* Runs the args through cuDNN's flash attention when it applies (core/cuda/attention_cudnn.cu):
 * returns 1 when it ran (or failed: *st says), 0 when mirror's kernels must run them. */
int mr_attention_cudnn(const mr_op_args *a, int bwd, mr_status *st);

/* ---- helpers shared by the kernels (core/op_util.c) ---- */

/* MR_ERR_INVALID "<op>: <what> ..." with the op name prefixed. */
#define mr_op_error(a, ...) mr_op_error_at((a), __FILE__, __LINE__, __VA_ARGS__)
mr_status mr_op_error_at(const mr_op_args *a, const char *file, int line, const char *fmt, ...)
    MR_PRINTF(4, 5);
/* Checks that every view with data is float and of one dtype (f32 or f64, plus f16/bf16 if
 * allow_half), except the op's integer views (labels, ids, argmax), which must be i32. Views
 * with data == NULL are skipped. Returns the float dtype via *dt. */
mr_status mr_op_check_float(const mr_op_args *a, int allow_half, mr_dtype *dt);
/* Checks that every view with data, integer views included, has dtype dt (for ops with no
 * integer views, after mr_op_check_float, which skips those). */
mr_status mr_op_check_all_float(const mr_op_args *a, mr_dtype dt);
/* Checks a view's shape equals `s`, naming the view ("in[1]", role) in the error. */
mr_status mr_op_check_shape(const mr_op_args *a, const mr_view *v, const char *role, const mr_shape *s);
/* True when every float view (non-NULL data) is f64: CPU kernels then run the reference. */
int mr_op_is_f64(const mr_op_args *a);

#ifdef __cplusplus
}
#endif
#endif
