/* Devices and the backend table (DESIGN.md "Backends").
 *
 * A backend is a table of function pointers for one device kind: memory, copies, streams and
 * events. Ops are dispatched through the op table (core/ops.h), which holds one kernel slot per
 * backend. The CPU backend is always present. The CUDA backend is present when mirror was built
 * with CUDA *and* a GPU is visible at run time; otherwise mr_backend_get(MR_DEVICE_CUDA) returns
 * MR_ERR_NOT_FOUND and mr_device_default() picks the CPU, saying so once on stderr. */
#ifndef MR_DEVICE_H
#define MR_DEVICE_H

#include <stddef.h>
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_device_kind { MR_DEVICE_CPU = 0, MR_DEVICE_CUDA = 1, MR_DEVICE_KIND_COUNT = 2 } mr_device_kind;

typedef struct mr_device {
    mr_device_kind kind;
    int index; /* 0 for the CPU; the CUDA ordinal otherwise */
} mr_device;

typedef struct mr_stream mr_stream; /* opaque; NULL means the device's default (CPU: synchronous) */
typedef struct mr_event mr_event;

typedef enum mr_copy_kind { MR_COPY_H2H = 0, MR_COPY_H2D = 1, MR_COPY_D2H = 2, MR_COPY_D2D = 3 } mr_copy_kind;

typedef struct mr_backend {
    const char *name; /* "cpu", "cuda" */
    mr_device_kind kind;
    /* Number of devices of this kind (CPU: 1). */
    mr_status (*device_count)(int *out);
    /* Allocates `bytes` (64-byte aligned on the CPU; 0 bytes gives a valid unique pointer). */
    mr_status (*alloc)(int device, size_t bytes, void **out);
    void (*free)(int device, void *p); /* free(NULL) is a no-op */
    /* Copies bytes; asynchronous on `s` where the backend has streams. */
    mr_status (*copy)(int device, void *dst, const void *src, size_t bytes, mr_copy_kind kind, mr_stream *s);
    mr_status (*memset_zero)(int device, void *dst, size_t bytes, mr_stream *s);
    mr_status (*stream_new)(int device, mr_stream **out);
    void (*stream_free)(mr_stream *s);
    mr_status (*stream_sync)(mr_stream *s);
    mr_status (*event_new)(int device, mr_event **out);
    void (*event_free)(mr_event *e);
    mr_status (*event_record)(mr_event *e, mr_stream *s);
    mr_status (*stream_wait_event)(mr_stream *s, mr_event *e);
    mr_status (*event_sync)(mr_event *e);
} mr_backend;

/* The backend for a device kind. MR_ERR_NOT_FOUND (with the reason in mr_last_error) when the
 * kind was not built or has no device at run time. Thread-safe; the table is immutable. */
mr_status mr_backend_get(mr_device_kind kind, const mr_backend **out) MR_WUR;

/* cuda:0 when a GPU is usable, else the CPU; the first CPU fallback of a CUDA build logs one
 * line saying why. Thread-safe. */
mr_device mr_device_default(void);
mr_device mr_device_cpu(void);

/* Non-zero when mirror was compiled with the CUDA backend (a GPU may still be absent). */
int mr_cuda_compiled(void);
/* Number of usable GPUs (0 without CUDA or without a device). Thread-safe, cached. */
int mr_cuda_device_count(void);

/* "cpu" or "cuda:1" into buf; returns buf. */
char *mr_device_str(mr_device d, char *buf, int cap);
/* Parses "cpu", "cpu:0", "cuda", "cuda:N". MR_ERR_INVALID naming the string if malformed. */
mr_status mr_device_parse(const char *s, mr_device *out) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
