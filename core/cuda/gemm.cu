/* The GEMM op on the GPU through cuBLAS (see MR_OP_GEMM in ops.h; the oracle is
 * core/ref/gemm_ref.c).
 *
 * cuBLAS is column-major and mirror is row-major. A row-major (r x c) buffer is the column-major
 * (c x r) matrix, so C = op(A) op(B) in row-major is C^T = op(B)^T op(A)^T in column-major: we
 * call cuBLAS with the operands swapped (B first), m and n swapped, and each operand's transpose
 * flag unchanged. f32 uses the plain SGEMM (no TF32: the default math mode keeps f32 accuracy);
 * f16/bf16 accumulate in f32 (CUBLAS_COMPUTE_32F) and store in their own type; f64 uses DGEMM.
 * The check (mr_gemm_fwd_check) has validated dtypes and shapes before we get here. */
#include "core/cuda/cuda_impl.h"
#include "core/ops_impl.h"

#include <limits.h>

extern "C" mr_status mr_gemm_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    const mr_shape *sa = &a->in[0].shape, *sb = &a->in[1].shape, *sc = &a->out[0].shape;
    const mr_gemm_params *p = &a->p.gemm;
    /* A (batch?,M,K) or (batch?,K,M) if trans_a; B (batch?,K,N) or (batch?,N,K) if trans_b;
     * C (batch?,M,N) */
    int64_t m = sc->dim[sc->ndim - 2], n = sc->dim[sc->ndim - 1];
    int64_t k = p->trans_a ? sa->dim[sa->ndim - 2] : sa->dim[sa->ndim - 1];
    int64_t batch = 1;
    for (int i = 0; i < sc->ndim - 2; i++) batch *= sc->dim[i];
    int b_shared = sb->ndim == 2 && batch > 1;
    if (m == 0 || n == 0 || batch == 0) return MR_OK;
    /* cuBLAS rejects a leading dimension of 0 even when k == 0 (then C = beta*C) */
    int64_t lda = p->trans_a ? m : k, ldb = p->trans_b ? k : n, ldc = n;
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    long long stride_a = (long long)(m * k), stride_b = b_shared ? 0 : (long long)(k * n), stride_c = (long long)(m * n);
    if (b_shared && !p->trans_a) {
        /* a shared B with untransposed A: the batch folds into M, one GEMM instead of many */
        m *= batch;
        batch = 1;
    }
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX || lda > INT_MAX || ldb > INT_MAX) {
        char b1[96], b2[96];
        return mr_set_error(MR_ERR_UNSUPPORTED, "gemm: A %s, B %s: a dimension exceeds cuBLAS's int range",
                            mr_shape_str(sa, b1, 96), mr_shape_str(sb, b2, 96));
    }
    cublasHandle_t h = NULL;
    MR_TRY(mr_cuda_blas_handle(a->stream, a->device, &h));
    {
        cublasOperation_t op_a = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasOperation_t op_b = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        const void *A = a->in[0].data, *B = a->in[1].data;
        void *C = a->out[0].data;
        int im = (int)m, in = (int)n, ik = (int)k, ib = (int)batch;
        switch (a->in[0].dtype) {
        case MR_F32: {
            float alpha = (float)p->alpha, beta = (float)p->beta;
            MR_TRY_CUBLAS(cublasSgemmStridedBatched(h, op_b, op_a, in, im, ik, &alpha, (const float *)B, (int)ldb,
                                                    stride_b, (const float *)A, (int)lda, stride_a, &beta,
                                                    (float *)C, (int)ldc, stride_c, ib));
            break;
        }
        case MR_F64: {
            double alpha = p->alpha, beta = p->beta;
            MR_TRY_CUBLAS(cublasDgemmStridedBatched(h, op_b, op_a, in, im, ik, &alpha, (const double *)B, (int)ldb,
                                                    stride_b, (const double *)A, (int)lda, stride_a, &beta,
                                                    (double *)C, (int)ldc, stride_c, ib));
            break;
        }
        case MR_F16:
        case MR_BF16: {
            /* with CUBLAS_COMPUTE_32F the scalars are floats */
            float alpha = (float)p->alpha, beta = (float)p->beta;
            cudaDataType t = a->in[0].dtype == MR_F16 ? CUDA_R_16F : CUDA_R_16BF;
            /* C may be f32 (mixed precision: half inputs, f32 output) or of the inputs' type */
            cudaDataType tc = a->out[0].dtype == MR_F32 ? CUDA_R_32F : t;
            MR_TRY_CUBLAS(cublasGemmStridedBatchedEx(h, op_b, op_a, in, im, ik, &alpha, B, t, (int)ldb, stride_b, A,
                                                     t, (int)lda, stride_a, &beta, C, tc, (int)ldc, stride_c, ib,
                                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            break;
        }
        default:
            return mr_op_error(a, "the CUDA kernel takes f32, f64, f16 or bf16, got %s",
                               mr_dtype_name(a->in[0].dtype));
        }
    }
    return MR_OK;
fail:
    return st;
}
