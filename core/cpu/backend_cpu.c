/* The CPU backend table: aligned host memory, synchronous copies, no-op streams and events, and
 * the process-wide thread count shared by OpenMP loops and the GEMM provider (one pool: both run
 * on libgomp's team, so they never oversubscribe the cores).
 *
 * Memory is not cached here (malloc already is a caching allocator); the backend only counts it
 * for mr_device_memory_stats. A free gets no size, so the counters use malloc_usable_size, which
 * gives the same value at alloc and at free for one block. */
#include "core/backend_impl.h"
#include "core/cpu/cpu_impl.h"
#include "core/log.h"

#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static mr_status cpu_count(int *out) {
    *out = 1;
    return MR_OK;
}

/* Counters of memory allocated through the table's alloc (lock-free: alloc is on hot paths of
 * the CPU trainer). */
static atomic_size_t g_in_use, g_peak;
static atomic_llong g_allocs, g_frees;

/* 64-byte aligned, a multiple of 64 bytes, at least 64; NULL when out of memory. */
static void *alloc64(size_t bytes) {
    if (bytes > SIZE_MAX - 64) return NULL;
    size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

static mr_status cpu_alloc(int device, size_t bytes, void **out) {
    (void)device;
    void *p = alloc64(bytes);
    if (!p) {
        *out = NULL;
        return mr_set_error(MR_ERR_NOMEM, "cpu: failed to allocate %zu bytes", bytes);
    }
    size_t n = malloc_usable_size(p);
    size_t now = atomic_fetch_add(&g_in_use, n) + n;
    size_t peak = atomic_load(&g_peak);
    /* raise the peak unless another thread already raised it past `now` */
    while (now > peak && !atomic_compare_exchange_weak(&g_peak, &peak, now)) {
    }
    atomic_fetch_add(&g_allocs, 1);
    *out = p;
    return MR_OK;
}

static void cpu_free(int device, void *p) {
    (void)device;
    if (!p) return;
    atomic_fetch_sub(&g_in_use, malloc_usable_size(p));
    atomic_fetch_add(&g_frees, 1);
    free(p);
}

void mr_cpu_memory_stats(mr_memory_stats *out) {
    memset(out, 0, sizeof *out);
    out->in_use = out->reserved = out->requested = atomic_load(&g_in_use);
    out->peak_in_use = out->peak_reserved = atomic_load(&g_peak);
    out->allocs = out->raw_allocs = (int64_t)atomic_load(&g_allocs);
    out->raw_frees = (int64_t)atomic_load(&g_frees);
}

void mr_cpu_memory_reset_peak(void) { atomic_store(&g_peak, atomic_load(&g_in_use)); }

static mr_status cpu_host_alloc(size_t bytes, void **out) {
    void *p = alloc64(bytes);
    *out = p;
    if (!p) return mr_set_error(MR_ERR_NOMEM, "cpu: failed to allocate a %zu-byte host buffer", bytes);
    return MR_OK;
}

static void cpu_host_free(void *p) { free(p); }

static mr_status cpu_copy(int device, void *dst, const void *src, size_t bytes, mr_copy_kind kind, mr_stream *s) {
    (void)device;
    (void)s;
    if (kind != MR_COPY_H2H) return mr_set_error(MR_ERR_INVALID, "cpu: copy kind %d is not host to host", (int)kind);
    if (bytes) memmove(dst, src, bytes);
    return MR_OK;
}

static mr_status cpu_memset_zero(int device, void *dst, size_t bytes, mr_stream *s) {
    (void)device;
    (void)s;
    if (bytes) memset(dst, 0, bytes);
    return MR_OK;
}

/* CPU work is synchronous: a stream or event is a non-NULL token that does nothing. */
static char g_token;

static mr_status cpu_stream_new(int device, mr_stream **out) {
    (void)device;
    *out = (mr_stream *)&g_token;
    return MR_OK;
}
static void cpu_stream_free(mr_stream *s) { (void)s; }
static mr_status cpu_stream_sync(mr_stream *s) {
    (void)s;
    return MR_OK;
}
static mr_status cpu_event_new(int device, mr_event **out) {
    (void)device;
    *out = (mr_event *)&g_token;
    return MR_OK;
}
static void cpu_event_free(mr_event *e) { (void)e; }
static mr_status cpu_event_record(mr_event *e, mr_stream *s) {
    (void)e;
    (void)s;
    return MR_OK;
}
static mr_status cpu_stream_wait_event(mr_stream *s, mr_event *e) {
    (void)e;
    (void)s;
    return MR_OK;
}
static mr_status cpu_event_sync(mr_event *e) {
    (void)e;
    return MR_OK;
}

static mr_status cpu_event_query(mr_event *e, int *done) {
    (void)e;
    *done = 1;
    return MR_OK;
}

static const mr_backend g_cpu = {
    .name = "cpu",
    .kind = MR_DEVICE_CPU,
    .device_count = cpu_count,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset_zero = cpu_memset_zero,
    .stream_new = cpu_stream_new,
    .stream_free = cpu_stream_free,
    .stream_sync = cpu_stream_sync,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_sync,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .event_query = cpu_event_query,
};

const mr_backend *mr_cpu_backend(void) { return &g_cpu; }

int mr_cpu_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

void mr_cpu_set_threads(int n) {
    if (n < 1) n = 1;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    mr_cpu_gemm_set_threads(n);
}
