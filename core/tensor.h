/* Tensors: a dtype, a shape and a refcounted storage on one device.
 *
 * Storage is contiguous; a tensor is a window [offset, offset + numel) of its storage with a
 * row-major shape. Reshape and view share the storage (the refcount keeps it alive until the last
 * tensor over it is freed); transposes are ops. Tensors are not thread-safe objects, but distinct
 * tensors over one storage may be freed from different threads. */
#ifndef MR_TENSOR_H
#define MR_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_tensor mr_tensor;

/* A borrowed, non-owning description of a contiguous buffer: what kernels receive. */
typedef struct mr_view {
    void *data;
    mr_dtype dtype;
    mr_shape shape;
} mr_view;

/* New tensor with uninitialised storage on `dev`. MR_ERR_NOMEM / MR_ERR_NOT_FOUND (device) /
 * MR_ERR_INVALID (shape). On error *out is NULL. */
mr_status mr_tensor_new(mr_device dev, mr_dtype dtype, const mr_shape *shape, mr_tensor **out) MR_WUR;
/* Same, zero-filled. */
mr_status mr_tensor_zeros(mr_device dev, mr_dtype dtype, const mr_shape *shape, mr_tensor **out) MR_WUR;
/* A view of the same storage with another shape of the same numel (retains the storage). */
mr_status mr_tensor_reshape(const mr_tensor *t, const mr_shape *shape, mr_tensor **out) MR_WUR;
/* A view of `shape` starting `offset` elements into t (retains the storage); how parameters are
 * carved out of one contiguous buffer. MR_ERR_INVALID if it does not fit inside t. */
mr_status mr_tensor_view(const mr_tensor *t, int64_t offset, const mr_shape *shape, mr_tensor **out) MR_WUR;
/* Drops this tensor; the storage is freed with its last tensor. NULL is a no-op. */
void mr_tensor_free(mr_tensor *t);

const mr_shape *mr_tensor_shape(const mr_tensor *t);
mr_dtype mr_tensor_dtype(const mr_tensor *t);
mr_device mr_tensor_device(const mr_tensor *t);
int64_t mr_tensor_numel(const mr_tensor *t);
size_t mr_tensor_nbytes(const mr_tensor *t);
void *mr_tensor_data(const mr_tensor *t);
/* Number of tensors sharing this tensor's storage (for tests). */
int mr_tensor_storage_refs(const mr_tensor *t);
mr_view mr_tensor_as_view(const mr_tensor *t);

/* Copies between host memory and the tensor (synchronous). `bytes` must equal nbytes. */
mr_status mr_tensor_copy_from_host(mr_tensor *t, const void *h_src, size_t bytes) MR_WUR;
mr_status mr_tensor_copy_to_host(const mr_tensor *t, void *h_dst, size_t bytes) MR_WUR;
/* A new tensor on `dev` holding t's values (any device pair). */
mr_status mr_tensor_to(const mr_tensor *t, mr_device dev, mr_tensor **out) MR_WUR;

/* Count of device/host storage allocations made through tensors since start (for the
 * no-allocation-per-step tests). Thread-safe. */
int64_t mr_tensor_alloc_count(void);

#ifdef __cplusplus
}
#endif
#endif
