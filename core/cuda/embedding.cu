/* PLACEHOLDER: being written (issue 8); returns MR_ERR_UNSUPPORTED until then. */
#include "core/cuda/cuda_impl.h"
#include "core/ops_impl.h"

extern "C" mr_status mr_embedding_fwd_cuda(const mr_op_args *a) {
    return mr_set_error(MR_ERR_UNSUPPORTED, "%s: no CUDA kernel yet", mr_op_get(a->op)->name);
}

extern "C" mr_status mr_embedding_bwd_cuda(const mr_op_args *a) {
    return mr_set_error(MR_ERR_UNSUPPORTED, "%s: no CUDA kernel yet", mr_op_get(a->op)->name);
}

extern "C" mr_status mr_dropout_fwd_cuda(const mr_op_args *a) {
    return mr_set_error(MR_ERR_UNSUPPORTED, "%s: no CUDA kernel yet", mr_op_get(a->op)->name);
}

