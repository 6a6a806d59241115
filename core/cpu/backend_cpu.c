/* The CPU backend table: aligned host memory, synchronous copies, no-op streams and events, and
 * the process-wide thread count shared by OpenMP loops and the GEMM provider (one pool: both run
 * on libgomp's team, so they never oversubscribe the cores). */
#include "core/backend_impl.h"
#include "core/cpu/cpu_impl.h"
#include "core/log.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static mr_status cpu_count(int *out) {
    *out = 1;
    return MR_OK;
}

static mr_status cpu_alloc(int device, size_t bytes, void **out) {
    (void)device;
    size_t n = (bytes + 63) / 64 * 64;
    if (n == 0) n = 64;
    void *p = aligned_alloc(64, n);
    if (!p) {
        *out = NULL;
        return mr_set_error(MR_ERR_NOMEM, "cpu: failed to allocate %zu bytes", bytes);
    }
    *out = p;
    return MR_OK;
}

static void cpu_free(int device, void *p) {
    (void)device;
    free(p);
}

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
