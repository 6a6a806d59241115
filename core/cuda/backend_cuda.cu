/* The CUDA backend table (core/device.h): device memory, asynchronous copies on streams,
 * streams that carry their own cuBLAS handle, and timing-free events.
 *
 * Memory: alloc/free go through one caching allocator per device (core/alloc_cache.c, created at
 * the device's first allocation), with cudaMalloc/cudaFree as its raw allocator: cudaFree
 * synchronizes the device, so per-step temporaries must not reach it. A freed block is reused
 * only after an event recorded on the legacy default stream at free time has completed (see
 * alloc_cache.c for why that covers every stream of ours). MIRROR_CUDA_CACHE=0 turns caching off
 * (exact-size cudaMalloc per alloc, cudaFree per free) for compute-sanitizer runs.
 * CUDA graph capture: a free records on the legacy stream and a cache miss calls cudaMalloc, both
 * illegal while a stream is being captured, so allocate and free outside capture (the planner's
 * arena is allocated before it).
 * host_alloc/host_free give page-locked host memory (cudaHostAlloc, portable to every device)
 * for batches copied asynchronously.
 * Streams are created with default flags (not cudaStreamNonBlocking) so that they stay ordered
 * after work on the legacy default stream, which is where tensor allocation, zero-fill and
 * NULL-stream copies go; code that wants overlap orders its streams with events.
 * A NULL stream means the legacy default stream of the current device; stream_sync(NULL)
 * synchronizes the current device (the one the last call on this thread made current). */
#include "core/alloc_cache_impl.h"
#include "core/backend_impl.h"
#include "core/cuda/cuda_impl.h"
#include "core/log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Per-device default cuBLAS handles (for ops run with a NULL stream). */
#define MR_CUDA_MAX_DEVICES 64
static pthread_mutex_t g_blas_mu = PTHREAD_MUTEX_INITIALIZER;
static cublasHandle_t g_blas_default[MR_CUDA_MAX_DEVICES];

extern "C" void mr_cuda_probe(int *count, char *why, int why_cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    *count = 0;
    if (e != cudaSuccess) {
        /* no driver or no device: the runtime's message is the reason; clear the error so later
         * runtime calls on this thread do not see it */
        snprintf(why, (size_t)why_cap, "%s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return;
    }
    if (n <= 0) {
        snprintf(why, (size_t)why_cap, "the CUDA runtime sees no device (check CUDA_VISIBLE_DEVICES)");
        return;
    }
    /* a GPU this build has no code for fails at its first kernel launch ("no kernel image is
     * available"): refuse it here, saying which architectures the build has (core/cuda_arch.c) */
    for (int i = 0; i < n; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
            (void)cudaGetLastError();
            continue; /* the first call on the device says what is wrong */
        }
        if (mr_cuda_arch_refusal(why, why_cap, i, p.name, p.major * 10 + p.minor, mr_cuda_build_sass(),
                                 mr_cuda_build_ptx()))
            return;
    }
    *count = n;
}

static mr_status set_device(int device) {
    mr_status st = MR_OK;
    MR_TRY_CUDA(cudaSetDevice(device));
    return MR_OK;
fail:
    return st;
}

static mr_status cuda_count(int *out) {
    mr_status st = MR_OK;
    int n = 0;
    *out = 0;
    MR_TRY_CUDA(cudaGetDeviceCount(&n));
    *out = n;
    return MR_OK;
fail:
    return st;
}

/* ---- the caching allocator's raw hooks (ctx is the device index) ------------------------------ */

static int ctx_device(void *ctx) { return (int)(intptr_t)ctx; }

static mr_status raw_alloc(void *ctx, size_t bytes, void **out) {
    mr_status st = MR_OK;
    void *p = NULL;
    *out = NULL;
    MR_TRY(set_device(ctx_device(ctx)));
    {
        cudaError_t e = cudaMalloc(&p, bytes);
        if (e != cudaSuccess) {
            /* clear it: the cache retries, and a later launch check must not see a stale error */
            (void)cudaGetLastError();
            return mr_set_error(mr_cuda_status(e), "cudaMalloc(%zu bytes) on cuda:%d failed: %s (%s)", bytes,
                                ctx_device(ctx), cudaGetErrorString(e), cudaGetErrorName(e));
        }
    }
    *out = p;
    return MR_OK;
fail:
    return st;
}

static void raw_free(void *ctx, void *p) {
    /* a void function cannot report: a failure here means the context is already broken and the
     * next fallible call will say so */
    if (cudaSetDevice(ctx_device(ctx)) == cudaSuccess) (void)cudaFree(p);
    (void)cudaGetLastError();
}

static mr_status raw_event_new(void *ctx, void **out) {
    mr_status st = MR_OK;
    cudaEvent_t e = NULL;
    *out = NULL;
    MR_TRY(set_device(ctx_device(ctx)));
    MR_TRY_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *out = (void *)e;
    return MR_OK;
fail:
    return st;
}

static void raw_event_free(void *ctx, void *ev) {
    if (cudaSetDevice(ctx_device(ctx)) == cudaSuccess) (void)cudaEventDestroy((cudaEvent_t)ev);
    (void)cudaGetLastError();
}

/* On the legacy default stream (explicitly, whatever --default-stream says): it runs after all
 * earlier work of every blocking stream of the device, which all of ours are. */
static mr_status raw_event_record(void *ctx, void *ev) {
    mr_status st = MR_OK;
    MR_TRY(set_device(ctx_device(ctx)));
    MR_TRY_CUDA(cudaEventRecord((cudaEvent_t)ev, cudaStreamLegacy));
    return MR_OK;
fail:
    return st;
}

static mr_status raw_event_query(void *ctx, void *ev, int *done) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    *done = e == cudaSuccess;
    if (e == cudaSuccess) return MR_OK;
    /* "not ready" is not an error; clear it as PyTorch's allocator does */
    (void)cudaGetLastError();
    if (e == cudaErrorNotReady) return MR_OK;
    return mr_set_error(MR_ERR_DEVICE, "cudaEventQuery on cuda:%d failed: %s (%s)", ctx_device(ctx),
                        cudaGetErrorString(e), cudaGetErrorName(e));
}

static mr_status raw_event_wait(void *ctx, void *ev) {
    mr_status st = MR_OK;
    (void)ctx;
    MR_TRY_CUDA(cudaEventSynchronize((cudaEvent_t)ev));
    return MR_OK;
fail:
    return st;
}

static pthread_mutex_t g_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static mr_alloc_cache *g_cache[MR_CUDA_MAX_DEVICES];

/* MIRROR_CUDA_CACHE=0 (or "off"/"false") disables caching. */
static int cache_enabled(void) {
    const char *v = getenv("MIRROR_CUDA_CACHE");
    return !(v && (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "false")));
}

/* The device's cache; created on first use when `create`, else *out may be NULL. */
static mr_status get_cache(int device, int create, mr_alloc_cache **out) {
    mr_status st = MR_OK;
    *out = NULL;
    if (device < 0 || device >= MR_CUDA_MAX_DEVICES)
        return mr_set_error(MR_ERR_INVALID, "cuda: device index %d out of range [0, %d)", device, MR_CUDA_MAX_DEVICES);
    pthread_mutex_lock(&g_cache_mu);
    if (!g_cache[device] && create) {
        mr_alloc_raw r;
        memset(&r, 0, sizeof r);
        r.ctx = (void *)(intptr_t)device;
        r.alloc = raw_alloc;
        r.free = raw_free;
        r.event_new = raw_event_new;
        r.event_free = raw_event_free;
        r.event_record = raw_event_record;
        r.event_query = raw_event_query;
        r.event_wait = raw_event_wait;
        char name[32];
        snprintf(name, sizeof name, "cuda:%d", device);
        int on = cache_enabled();
        st = mr_alloc_cache_new(&r, on, name, &g_cache[device]);
        if (st == MR_OK && !on) mr_log_info("%s: MIRROR_CUDA_CACHE=0: caching allocator off", name);
    }
    *out = g_cache[device];
    pthread_mutex_unlock(&g_cache_mu);
    return st;
}

static mr_status cuda_alloc(int device, size_t bytes, void **out) {
    mr_status st = MR_OK;
    mr_alloc_cache *c = NULL;
    *out = NULL;
    MR_TRY(get_cache(device, 1, &c));
    /* callers expect the device current after an alloc, as with a plain cudaMalloc */
    MR_TRY(set_device(device));
    /* a 0-byte request still gets a unique pointer, as on the CPU (the cache rounds 0 up) */
    MR_TRY(mr_alloc_cache_alloc(c, bytes, out));
    return MR_OK;
fail:
    return st;
}

static void cuda_free(int device, void *p) {
    mr_alloc_cache *c = NULL;
    if (!p) return;
    /* a void function cannot report: say it once per failure, the next fallible call fails too */
    mr_status st = get_cache(device, 0, &c);
    if (st == MR_OK && !c) st = mr_set_error(MR_ERR_INVALID, "cuda:%d: free of %p before any allocation", device, p);
    if (st == MR_OK) st = mr_alloc_cache_dealloc(c, p);
    if (st != MR_OK) mr_log_warn("cuda free: %s", mr_last_error());
}

static mr_status cuda_host_alloc(size_t bytes, void **out) {
    mr_status st = MR_OK;
    void *p = NULL;
    *out = NULL;
    MR_TRY_CUDA(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable));
    *out = p;
    return MR_OK;
fail:
    (void)cudaGetLastError();
    return st;
}

static void cuda_host_free(void *p) {
    if (!p) return;
    (void)cudaFreeHost(p);
    (void)cudaGetLastError();
}

extern "C" mr_status mr_cuda_memory_stats(int device, mr_memory_stats *out) {
    mr_alloc_cache *c = NULL;
    memset(out, 0, sizeof *out);
    mr_status st = get_cache(device, 0, &c);
    if (st == MR_OK && c) mr_alloc_cache_stats(c, out);
    return st;
}

extern "C" mr_status mr_cuda_memory_reset_peak(int device) {
    mr_alloc_cache *c = NULL;
    mr_status st = get_cache(device, 0, &c);
    if (st == MR_OK && c) mr_alloc_cache_reset_peak(c);
    return st;
}

extern "C" mr_status mr_cuda_memory_release_cached(int device) {
    mr_alloc_cache *c = NULL;
    mr_status st = get_cache(device, 0, &c);
    if (st == MR_OK && c) st = mr_alloc_cache_release_cached(c);
    return st;
}

static cudaStream_t raw(const mr_stream *s) { return s ? s->s : (cudaStream_t)0; }

static mr_status cuda_copy(int device, void *dst, const void *src, size_t bytes, mr_copy_kind kind, mr_stream *s) {
    mr_status st = MR_OK;
    cudaMemcpyKind k;
    switch (kind) {
    case MR_COPY_H2H: k = cudaMemcpyHostToHost; break;
    case MR_COPY_H2D: k = cudaMemcpyHostToDevice; break;
    case MR_COPY_D2H: k = cudaMemcpyDeviceToHost; break;
    case MR_COPY_D2D: k = cudaMemcpyDeviceToDevice; break;
    default: return mr_set_error(MR_ERR_INVALID, "cuda: invalid copy kind %d", (int)kind);
    }
    if (bytes == 0) return MR_OK;
    MR_TRY(set_device(s ? s->device : device));
    MR_TRY_CUDA(cudaMemcpyAsync(dst, src, bytes, k, raw(s)));
    return MR_OK;
fail:
    return st;
}

static mr_status cuda_memset_zero(int device, void *dst, size_t bytes, mr_stream *s) {
    mr_status st = MR_OK;
    if (bytes == 0) return MR_OK;
    MR_TRY(set_device(s ? s->device : device));
    MR_TRY_CUDA(cudaMemsetAsync(dst, 0, bytes, raw(s)));
    return MR_OK;
fail:
    return st;
}

static mr_status cuda_stream_new(int device, mr_stream **out) {
    mr_status st = MR_OK;
    mr_stream *s = (mr_stream *)calloc(1, sizeof *s);
    *out = NULL;
    if (!s) return mr_set_error(MR_ERR_NOMEM, "cuda: out of host memory for a stream");
    s->device = device;
    pthread_mutex_init(&s->mu, NULL);
    MR_TRY(set_device(device));
    MR_TRY_CUDA(cudaStreamCreateWithFlags(&s->s, cudaStreamDefault));
    *out = s;
    return MR_OK;
fail:
    pthread_mutex_destroy(&s->mu);
    free(s);
    return st;
}

/* gemm.cu: the cuBLASLt workspace of a stream about to be destroyed (NULL if none), to free. */
extern "C" void *mr_cuda_gemm_stream_release(int device, cudaStream_t s);

static void cuda_stream_free(mr_stream *s) {
    if (!s) return;
    /* before the destroy: the free's event on the legacy stream then follows the stream's queued
     * GEMMs, which may still be using the workspace */
    cuda_free(s->device, mr_cuda_gemm_stream_release(s->device, s->s));
    if (cudaSetDevice(s->device) == cudaSuccess) {
        if (s->blas) (void)cublasDestroy(s->blas);
        (void)cudaStreamDestroy(s->s);
    }
    (void)cudaGetLastError();
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static mr_status cuda_stream_sync(mr_stream *s) {
    mr_status st = MR_OK;
    if (s) {
        MR_TRY_CUDA(cudaStreamSynchronize(s->s));
    } else {
        MR_TRY_CUDA(cudaDeviceSynchronize());
    }
    return MR_OK;
fail:
    return st;
}

static mr_status cuda_event_new(int device, mr_event **out) {
    mr_status st = MR_OK;
    mr_event *e = (mr_event *)calloc(1, sizeof *e);
    *out = NULL;
    if (!e) return mr_set_error(MR_ERR_NOMEM, "cuda: out of host memory for an event");
    e->device = device;
    MR_TRY(set_device(device));
    MR_TRY_CUDA(cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming));
    *out = e;
    return MR_OK;
fail:
    free(e);
    return st;
}

static void cuda_event_free(mr_event *e) {
    if (!e) return;
    if (cudaSetDevice(e->device) == cudaSuccess) (void)cudaEventDestroy(e->e);
    (void)cudaGetLastError();
    free(e);
}

static mr_status cuda_event_record(mr_event *e, mr_stream *s) {
    mr_status st = MR_OK;
    if (s && s->device != e->device)
        return mr_set_error(MR_ERR_INVALID, "cuda: event of device %d recorded on a stream of device %d", e->device,
                            s->device);
    /* an event is recorded on a stream of its own device: make that device current so a NULL
     * stream means that device's default stream */
    MR_TRY(set_device(e->device));
    MR_TRY_CUDA(cudaEventRecord(e->e, raw(s)));
    return MR_OK;
fail:
    return st;
}

static mr_status cuda_stream_wait_event(mr_stream *s, mr_event *e) {
    mr_status st = MR_OK;
    /* waiting may cross devices: the stream's device is the one that waits */
    MR_TRY(set_device(s ? s->device : e->device));
    MR_TRY_CUDA(cudaStreamWaitEvent(raw(s), e->e, 0));
    return MR_OK;
fail:
    return st;
}

static mr_status cuda_event_sync(mr_event *e) {
    mr_status st = MR_OK;
    MR_TRY_CUDA(cudaEventSynchronize(e->e));
    return MR_OK;
fail:
    return st;
}

static mr_status cuda_event_query(mr_event *e, int *done) {
    mr_status st = MR_OK;
    *done = 0;
    {
        cudaError_t r = cudaEventQuery(e->e);
        if (r == cudaErrorNotReady) {
            (void)cudaGetLastError(); /* not an error: clear it */
            return MR_OK;
        }
        MR_TRY_CUDA(r);
    }
    *done = 1;
    return MR_OK;
fail:
    return st;
}

static const mr_backend g_cuda = {
    "cuda",
    MR_DEVICE_CUDA,
    cuda_count,
    cuda_alloc,
    cuda_free,
    cuda_copy,
    cuda_memset_zero,
    cuda_stream_new,
    cuda_stream_free,
    cuda_stream_sync,
    cuda_event_new,
    cuda_event_free,
    cuda_event_record,
    cuda_stream_wait_event,
    cuda_event_sync,
    cuda_host_alloc,
    cuda_host_free,
    cuda_event_query,
};

extern "C" const mr_backend *mr_cuda_backend(void) { return &g_cuda; }

/* ---- helpers for the kernels (cuda_impl.h) ---------------------------------------------------- */

mr_status mr_cuda_op_stream(const mr_op_args *a, cudaStream_t *out) {
    mr_status st = MR_OK;
    *out = raw(a->stream);
    MR_TRY(set_device(a->stream ? a->stream->device : a->device));
    return MR_OK;
fail:
    return st;
}

/* A new cuBLAS handle bound to stream `s` of the current device. */
static mr_status blas_create(cudaStream_t s, cublasHandle_t *out) {
    mr_status st = MR_OK;
    cublasHandle_t h = NULL;
    MR_TRY_CUBLAS(cublasCreate(&h));
    /* bound for life: a handle shared between threads must not have its stream changed */
    MR_TRY_CUBLAS(cublasSetStream(h, s));
    *out = h;
    return MR_OK;
fail:
    if (h) (void)cublasDestroy(h);
    return st;
}

mr_status mr_cuda_blas_handle(mr_stream *s, int device, cublasHandle_t *out) {
    mr_status st = MR_OK;
    *out = NULL;
    if (s) device = s->device;
    if (device < 0 || device >= MR_CUDA_MAX_DEVICES)
        return mr_set_error(MR_ERR_INVALID, "cuda: device index %d out of range [0, %d)", device, MR_CUDA_MAX_DEVICES);
    st = set_device(device);
    if (st != MR_OK) return st;
    pthread_mutex_t *mu = s ? &s->mu : &g_blas_mu;
    cublasHandle_t *slot = s ? &s->blas : &g_blas_default[device];
    pthread_mutex_lock(mu);
    if (!*slot) st = blas_create(raw(s), slot);
    *out = *slot;
    pthread_mutex_unlock(mu);
    return st;
}
