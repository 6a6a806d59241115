/* Private to core/cuda/: the CUDA backend's stream and event objects, the error-conversion macros
 * (one per foreign API, docs/STYLE.md rule 4) and the helpers kernels use to find their device, stream
 * and cuBLAS handle. Included only by .cu files (it pulls in the CUDA headers). */
#ifndef MR_CUDA_IMPL_H
#define MR_CUDA_IMPL_H

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <pthread.h>

#include "core/device.h"
#include "core/ops.h"
#include "core/status.h"

/* A stream: the CUDA stream, its device, and a cuBLAS handle bound to the stream, created on
 * first use (most streams never run a GEMM). `mu` guards the lazy creation. */
struct mr_stream {
    cudaStream_t s;
    int device;
    cublasHandle_t blas;
    pthread_mutex_t mu;
};

/* An event without timing (cheaper to record and wait on), and the device it belongs to. */
struct mr_event {
    cudaEvent_t e;
    int device;
};

/* The status a CUDA runtime error maps to: out of memory is MR_ERR_NOMEM, anything else is a
 * device failure. */
static inline mr_status mr_cuda_status(cudaError_t e) {
    return e == cudaErrorMemoryAllocation ? MR_ERR_NOMEM : MR_ERR_DEVICE;
}

/* Runs a CUDA runtime call; on failure stores an mr_status in `st` (the message names the call
 * and the runtime's reason) and jumps to `fail`. */
#define MR_TRY_CUDA(call)                                                                       \
    do {                                                                                        \
        cudaError_t mr_e_ = (call);                                                             \
        if (mr_e_ != cudaSuccess) {                                                             \
            st = mr_set_error(mr_cuda_status(mr_e_), "%s failed: %s (%s)", #call,                \
                              cudaGetErrorString(mr_e_), cudaGetErrorName(mr_e_));              \
            goto fail;                                                                          \
        }                                                                                       \
    } while (0)

/* Same for cuBLAS calls. */
#define MR_TRY_CUBLAS(call)                                                                     \
    do {                                                                                        \
        cublasStatus_t mr_b_ = (call);                                                          \
        if (mr_b_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            st = mr_set_error(mr_b_ == CUBLAS_STATUS_ALLOC_FAILED ? MR_ERR_NOMEM : MR_ERR_DEVICE, \
                              "%s failed: %s (%d)", #call, cublasGetStatusString(mr_b_),        \
                              (int)mr_b_);                                                      \
            goto fail;                                                                          \
        }                                                                                       \
    } while (0)

/* Makes the op's device current and returns the CUDA stream to launch on: a->stream's stream,
 * or the legacy default stream of a->device when a->stream is NULL. */
mr_status mr_cuda_op_stream(const mr_op_args *a, cudaStream_t *out);

/* The cuBLAS handle for `s` (created on first use and bound to s), or for s == NULL the
 * per-device default handle on the legacy default stream of `device`, created once. Makes the
 * device current. Thread-safe. */
mr_status mr_cuda_blas_handle(mr_stream *s, int device, cublasHandle_t *out);

/* Threads per block and a grid for n elements walked with a grid-stride loop (n > 0). */
#define MR_CUDA_BLOCK 256
static inline unsigned mr_cuda_grid(int64_t n) {
    int64_t g = (n + MR_CUDA_BLOCK - 1) / MR_CUDA_BLOCK;
    return (unsigned)(g > 65536 ? 65536 : g);
}

/* Checks the launch that was just made (bad configuration, no kernel image for this GPU).
 * `what` names the op or kernel. */
static inline mr_status mr_cuda_check_launch(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return MR_OK;
    return mr_set_error(mr_cuda_status(e), "%s: kernel launch failed: %s (%s)", what, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}

#endif
