/* Private to core/cuda/: what the cuDNN users (conv.cu, attention_cudnn.cu) share: the error
 * conversion and the handles, one cudnnHandle_t per (device, stream) (conv.cu, "Handles").
 * Included only by .cu files built with cuDNN (MIRROR_HAVE_CUDNN). */
#ifndef MR_CUDNN_IMPL_H
#define MR_CUDNN_IMPL_H

#include <cudnn.h>
#include <pthread.h>

#include "core/cuda/cuda_impl.h"

/* The status a cuDNN error maps to, and the message: the call, cuDNN's name for the status and
 * its detailed last-error text for this thread (conv.cu). */
mr_status mr_cudnn_error(cudnnStatus_t e, const char *call, const char *file, int line);

/* Runs a cuDNN call; on failure stores an mr_status in `st` and jumps to `fail`. */
#define MR_TRY_CUDNN(call)                                                                      \
    do {                                                                                        \
        cudnnStatus_t mr_d_ = (call);                                                           \
        if (mr_d_ != CUDNN_STATUS_SUCCESS) {                                                    \
            st = mr_cudnn_error(mr_d_, #call, __FILE__, __LINE__);                              \
            goto fail;                                                                          \
        }                                                                                       \
    } while (0)

/* The handle of (device, stream s), created and bound to s on first use; `device` must be
 * current. The caller holds *mu while it uses *h (a cuDNN handle is not for two threads at once).
 * Thread-safe; the handle lives to the end of the process. */
mr_status mr_cudnn_handle(int device, cudaStream_t s, cudnnHandle_t *h, pthread_mutex_t **mu);

#endif
