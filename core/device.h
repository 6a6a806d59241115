/* Devices and the backend table (docs/DESIGN.md "Backends").
 *
 * A backend is a table of function pointers for one device kind: memory, copies, streams and
 * events. Ops are dispatched through the op table (core/ops.h), which holds one kernel slot per
 * backend. The CPU backend is always present. The CUDA backend is present when mirror was built
 * with CUDA *and* a GPU is visible at run time; otherwise mr_backend_get(MR_DEVICE_CUDA) returns
 * MR_ERR_NOT_FOUND and mr_device_default() picks the CPU, saying so once on stderr.
 *
 * Device memory on CUDA goes through a caching allocator (core/alloc_cache.c): freed blocks are
 * kept and handed out again, so steady-state steps make no cudaMalloc/cudaFree calls (cudaFree
 * synchronizes the device). MIRROR_CUDA_CACHE=0 in the environment turns the cache off (every
 * alloc is a cudaMalloc of exactly the requested size, every free a cudaFree) so that
 * compute-sanitizer sees each buffer's true bounds. mr_device_memory_stats() reports it. */
#ifndef MR_DEVICE_H
#define MR_DEVICE_H

#include <stddef.h>
#include <stdint.h>
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
    /* Host memory for buffers copied asynchronously to or from devices of this kind (input
     * batches): page-locked on CUDA (portable: usable with every GPU), 64-byte aligned malloc on
     * the CPU. 0 bytes gives a valid unique pointer. MR_ERR_NOMEM, *out NULL, on failure.
     * Thread-safe. host_free(NULL) is a no-op; host_free synchronizes on CUDA (cudaFreeHost), so
     * keep these buffers for the whole run rather than per step. */
    mr_status (*host_alloc)(size_t bytes, void **out);
    void (*host_free)(void *p);
    /* *done = 1 when the work before e's record has completed (or e was never recorded), else 0;
     * does not wait. */
    mr_status (*event_query)(mr_event *e, int *done);
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
/* Why no GPU is usable, as the CUDA runtime (or the build) said; "" when one is. The string is
 * static. Thread-safe. */
const char *mr_cuda_unusable_reason(void);

/* How a GPU of compute capability `cc` (major*10 + minor: 90 for an H100) runs the kernels of a
 * build that made SASS for the comma-separated `sass` list ("80,86,89,90,100") and PTX for `ptx`
 * ("100"): from a cubin of the same major (MR_CUDA_COVER_SASS), from PTX the driver compiles at
 * load time (MR_CUDA_COVER_PTX), or not at all. *arch (may be NULL) gets the architecture used, or
 * -1. core/cuda_arch.c has the rule. */
typedef enum { MR_CUDA_COVER_NONE = 0, MR_CUDA_COVER_SASS, MR_CUDA_COVER_PTX } mr_cuda_cover;
mr_cuda_cover mr_cuda_arch_cover(const char *sass, const char *ptx, int cc, int *arch);
/* 1 and the reason in why[cap] (naming GPU `gpu` called `name`, its capability, the lists and the
 * fix) when the GPU cannot run the build's code; 0 when it can (why untouched). */
int mr_cuda_arch_refusal(char *why, int cap, int gpu, const char *name, int cc, const char *sass, const char *ptx);
/* This build's lists (MIRROR_CUDA_ARCHS at configure time); "" in a build without CUDA. */
const char *mr_cuda_build_sass(void);
const char *mr_cuda_build_ptx(void);

/* "cpu" or "cuda:1" into buf; returns buf. */
char *mr_device_str(mr_device d, char *buf, int cap);
/* Parses "cpu", "cpu:0", "cuda", "cuda:N". MR_ERR_INVALID naming the string if malformed. */
mr_status mr_device_parse(const char *s, mr_device *out) MR_WUR;

/* Memory counters of one device since the process started (torch.cuda.memory_stats).
 * Bytes "in use" are live allocations after rounding (CUDA: to the cache's 512-byte blocks, or
 * the whole block when the rest was too small to split); `requested` is what callers asked for.
 * `reserved` is what the allocator holds from the driver: in use + cached free blocks. */
typedef struct mr_memory_stats {
    size_t in_use, peak_in_use, reserved, peak_reserved;
    /* allocs: successful alloc calls; raw_allocs/raw_frees: driver calls (cudaMalloc/cudaFree);
     * cache_hits: allocs served from cached blocks without a driver call */
    int64_t allocs, raw_allocs, raw_frees, cache_hits;
    size_t requested;
} mr_memory_stats;

/* Fills *out for device d. CUDA: the caching allocator's counters (zeros before the device's
 * first allocation). CPU: there is no cache; allocs = raw_allocs counts allocations made through
 * the backend's alloc, raw_frees its frees, in_use/reserved (always equal) and requested are the
 * usable sizes of the live blocks as malloc reports them, cache_hits is 0. Host memory that does
 * not go through the backend (malloc in data/, the reference kernels) is not counted.
 * MR_ERR_NOT_FOUND when d is not a usable device (*out zeroed). Thread-safe. */
mr_status mr_device_memory_stats(mr_device d, mr_memory_stats *out) MR_WUR;
/* peak_in_use and peak_reserved restart from the current values. MR_ERR_NOT_FOUND as above.
 * Thread-safe. */
mr_status mr_device_memory_reset_peak(mr_device d) MR_WUR;
/* Returns every cached, entirely free segment of device d to the driver, after waiting for the
 * device work that may still use them (torch.cuda.empty_cache): for another process or library
 * sharing the GPU; mirror's own allocations already do this by themselves before reporting out of
 * memory. A no-op on the CPU. MR_ERR_NOT_FOUND as above, MR_ERR_DEVICE if a wait fails.
 * Thread-safe. */
mr_status mr_device_memory_release_cached(mr_device d) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
