/* The emulated runtime's semantics, which the emu tests of mirror rely on (tests/emu/emu_runtime.cc):
 * deferred streams (a result read before a synchronization is stale), the legacy stream ordered
 * with blocking streams, events and cross-stream waits, pageable copies complete on return and
 * pinned ones do not, the enqueue/execution log, graph capture and replay, a synchronizing call invalidating a capture, the
 * counters, device memory poisoned with 0xFF, out-of-memory at MR_EMU_MEM_BYTES, and a kernel's
 * warp operations (ballot, any/all, shuffles with widths) against what CUDA documents.
 * Built only for the emulator. Prints "N passed, M failed"; exits 1 on any failure. */
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/emu/emu_api.h"

static int g_pass, g_fail;
#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (cond) {                                                                               \
            g_pass++;                                                                             \
        } else {                                                                                  \
            g_fail++;                                                                             \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                \
            printf(__VA_ARGS__);                                                                  \
            printf("\n");                                                                         \
        }                                                                                         \
    } while (0)
#define OK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t ok_e_ = (call);                                                               \
        CHECK(ok_e_ == cudaSuccess, "%s", cudaGetErrorString(ok_e_));                             \
    } while (0)

__global__ void fill(float *y, int n, float v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = v;
}

__global__ void add_one(float *y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] += 1.0f;
}

/* out[lane] for one warp: ballot of odd lanes, any/all, shfl with width 8, up and down */
__global__ void warp_ops(int *out) {
    int l = threadIdx.x;
    unsigned b = __ballot_sync(0xffffffffu, l & 1);
    int any = __any_sync(0xffffffffu, l == 5);
    int all = __all_sync(0xffffffffu, l < 32);
    int w8 = __shfl_sync(0xffffffffu, l * 10, 3, 8);    /* lane 3 of each group of 8 */
    int up = __shfl_up_sync(0xffffffffu, l, 2);         /* l-2, own value for l < 2 */
    int dn = __shfl_down_sync(0xffffffffu, l, 4, 16);   /* l+4 within 16 */
    int xr = __shfl_xor_sync(0xffffffffu, l, 1);
    int x8 = __shfl_xor_sync(0xffffffffu, l, 8, 8); /* width 8: a later group gives the own value */
    out[l * 8 + 0] = (int)b;
    out[l * 8 + 1] = any;
    out[l * 8 + 2] = all;
    out[l * 8 + 3] = w8;
    out[l * 8 + 4] = up;
    out[l * 8 + 5] = dn;
    out[l * 8 + 6] = xr;
    __syncwarp();
    out[l * 8 + 7] = x8;
}

static void test_deferred_and_sync(void) {
    const int n = 1000;
    float *d = NULL, *h = NULL;
    OK(cudaMalloc((void **)&d, n * sizeof(float)));
    OK(cudaHostAlloc((void **)&h, n * sizeof(float), cudaHostAllocPortable));
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
    for (int i = 0; i < n; i++) h[i] = -7.0f;
    fill<<<4, 128, 0, s>>>(d, n, 3.0f);
    OK(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(h[0] == -7.0f, "a pinned copy completed before any synchronization (h[0] = %g)", h[0]);
    OK(cudaStreamSynchronize(s));
    CHECK(h[0] == 3.0f && h[n - 1] == 3.0f, "after the sync: %g %g", h[0], h[n - 1]);
    /* pageable memory: the copy has completed when cudaMemcpyAsync returns */
    float *p = (float *)malloc(n * sizeof(float));
    add_one<<<2, 64, 0, s>>>(d, n);
    OK(cudaMemcpyAsync(p, d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(p[0] == 4.0f && p[n - 1] == 4.0f, "pageable copy: %g %g", p[0], p[n - 1]);
    /* the legacy stream waits for the blocking stream's work, and the stream for the legacy's */
    add_one<<<2, 64, 0, s>>>(d, n);
    fill<<<1, 32>>>(d, 1, 100.0f); /* legacy: after the add on s */
    add_one<<<1, 32, 0, s>>>(d, 1);  /* s: after the legacy fill */
    OK(cudaMemcpy(p, d, 2 * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(p[0] == 101.0f && p[1] == 5.0f, "legacy ordering: %g %g (want 101 5)", p[0], p[1]);
    /* fresh device memory reads as 0xFF bytes (NaN) */
    float *d2 = NULL;
    OK(cudaMalloc((void **)&d2, 16));
    OK(cudaMemcpy(p, d2, 16, cudaMemcpyDeviceToHost));
    CHECK(isnan(p[0]) && isnan(p[3]), "fresh device memory is not poisoned: %g", p[0]);
    OK(cudaFree(d2));
    OK(cudaStreamDestroy(s));
    OK(cudaFreeHost(h));
    OK(cudaFree(d));
    free(p);
}

static void test_events_and_streams(void) {
    const int n = 256;
    float *d = NULL, h[2];
    OK(cudaMalloc((void **)&d, n * sizeof(float)));
    cudaStream_t a, b;
    OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    cudaEvent_t e;
    OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    fill<<<1, 64, 0, a>>>(d, n, 1.0f);
    OK(cudaEventRecord(e, a));
    fill<<<1, 64, 0, a>>>(d, n, 9.0f); /* after the record: b must not wait for it */
    OK(cudaStreamWaitEvent(b, e, 0));
    add_one<<<1, 64, 0, b>>>(d, n);
    OK(cudaStreamSynchronize(b));
    mr_emu_stats st;
    mr_emu_get_stats(&st);
    OK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, b));
    CHECK(h[0] == 2.0f, "b waited for exactly the recorded point: %g (want 2)", h[0]);
    OK(cudaEventQuery(e));
    OK(cudaStreamSynchronize(a));
    OK(cudaEventDestroy(e));
    OK(cudaStreamDestroy(a));
    OK(cudaStreamDestroy(b));
    OK(cudaFree(d));
}

/* The enqueue/execution log: entries in queuing order with their stream, name and clock ticks;
 * deferred work has no execution tick until a sync; after a stop nothing new is logged. */
static void test_log(void) {
    const int n = 64;
    float *d = NULL, h[1];
    OK(cudaMalloc((void **)&d, n * sizeof(float)));
    cudaStream_t a, b;
    OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    cudaEvent_t e;
    OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    mr_emu_log_start();
    fill<<<1, 64, 0, a>>>(d, n, 1.0f); /* 0 */
    OK(cudaEventRecord(e, a));          /* (non-blocking stream: no item) */
    OK(cudaStreamWaitEvent(b, e, 0));   /* 1: b waits */
    add_one<<<1, 64, 0, b>>>(d, n);     /* 2 */
    mr_emu_log_entry L[8];
    int64_t k = mr_emu_log_read(L, 8);
    CHECK(k == 3, "3 entries before a sync: %lld", (long long)k);
    CHECK(k >= 3 && L[0].exec == 0 && L[2].exec == 0, "nothing ran before a sync");
    OK(cudaStreamSynchronize(b));
    k = mr_emu_log_read(L, 8);
    CHECK(k == 3, "3 entries: %lld", (long long)k);
    if (k == 3) {
        CHECK(strstr(L[0].what, "test_emu_runtime") != NULL && strchr(L[0].what, ':') != NULL, "a kernel by its launch site: %s",
              L[0].what);
        CHECK(!strcmp(L[1].what, "wait"), "the cross-stream wait: %s", L[1].what);
        CHECK(L[0].stream != L[2].stream && L[1].stream == L[2].stream, "streams %llu %llu %llu",
              (unsigned long long)L[0].stream, (unsigned long long)L[1].stream, (unsigned long long)L[2].stream);
        CHECK(L[0].enq == 1 && L[1].enq == 2 && L[2].enq == 3, "queued at 1, 2, 3: %llu %llu %llu",
              (unsigned long long)L[0].enq, (unsigned long long)L[1].enq, (unsigned long long)L[2].enq);
        CHECK(L[0].exec > 3 && L[0].exec < L[2].exec && L[1].exec < L[2].exec, "ran after queuing, fill before add: %llu %llu %llu",
              (unsigned long long)L[0].exec, (unsigned long long)L[1].exec, (unsigned long long)L[2].exec);
    }
    mr_emu_log_stop();
    OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h[0] == 2.0f, "the work ran: %g", h[0]);
    CHECK(mr_emu_log_read(NULL, 0) == 3, "nothing logged after the stop");
    mr_emu_log_start();
    CHECK(mr_emu_log_read(NULL, 0) == 0, "a start clears the log");
    mr_emu_log_stop();
    OK(cudaEventDestroy(e));
    OK(cudaStreamDestroy(a));
    OK(cudaStreamDestroy(b));
    OK(cudaFree(d));
}

static void test_capture(void) {
    const int n = 64;
    float *d = NULL, h = 0;
    OK(cudaMalloc((void **)&d, n * sizeof(float)));
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
    fill<<<1, 64, 0, s>>>(d, n, 0.0f);
    OK(cudaStreamSynchronize(s));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    add_one<<<1, 64, 0, s>>>(d, n);
    add_one<<<1, 64, 0, s>>>(d, n);
    cudaGraph_t g = NULL;
    OK(cudaStreamEndCapture(s, &g));
    OK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h == 0.0f, "captured work ran at capture: %g", h);
    cudaGraphExec_t x = NULL;
    OK(cudaGraphInstantiate(&x, g, 0));
    mr_emu_stats before, after;
    mr_emu_get_stats(&before);
    for (int i = 0; i < 3; i++) OK(cudaGraphLaunch(x, s));
    OK(cudaStreamSynchronize(s));
    mr_emu_get_stats(&after);
    OK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h == 6.0f, "3 replays of 2 adds: %g", h);
    CHECK(after.graph_launches - before.graph_launches == 3, "graph launches counted: %llu",
          (unsigned long long)(after.graph_launches - before.graph_launches));
    CHECK(after.launches == before.launches, "replays are not new launches");
    /* a synchronizing call while capturing invalidates the capture */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    add_one<<<1, 64, 0, s>>>(d, n);
    CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported, "sync during capture was allowed");
    void *m = NULL;
    CHECK(cudaMalloc(&m, 16) == cudaErrorStreamCaptureUnsupported, "cudaMalloc during capture was allowed");
    cudaGraph_t g2 = NULL;
    CHECK(cudaStreamEndCapture(s, &g2) == cudaErrorStreamCaptureInvalidated && g2 == NULL, "capture not invalidated");
    /* work on the legacy stream while a blocking stream captures: refused, capture invalidated */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    fill<<<1, 32>>>(d, 1, 5.0f);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureImplicit, "legacy work during a capture was accepted");
    CHECK(cudaStreamEndCapture(s, &g2) == cudaErrorStreamCaptureInvalidated, "capture not invalidated by legacy work");
    (void)cudaGetLastError();
    OK(cudaGraphExecDestroy(x));
    OK(cudaGraphDestroy(g));
    OK(cudaStreamDestroy(s));
    OK(cudaFree(d));
}

static void test_counters_and_memory(void) {
    mr_emu_stats a, b;
    mr_emu_get_stats(&a);
    void *p = NULL;
    OK(cudaMalloc(&p, 1000));
    float h = 0;
    OK(cudaMemcpy(&h, p, sizeof h, cudaMemcpyDeviceToHost));
    OK(cudaFree(p));
    mr_emu_get_stats(&b);
    CHECK(b.raw_allocs - a.raw_allocs == 1 && b.raw_frees - a.raw_frees == 1, "alloc/free counts %llu %llu",
          (unsigned long long)(b.raw_allocs - a.raw_allocs), (unsigned long long)(b.raw_frees - a.raw_frees));
    CHECK(b.host_syncs - a.host_syncs >= 2, "host syncs counted: %llu", (unsigned long long)(b.host_syncs - a.host_syncs));
    size_t fr = 0, tot = 0;
    OK(cudaMemGetInfo(&fr, &tot));
    CHECK(tot > 0 && fr <= tot, "memory info %zu/%zu", fr, tot);
    CHECK(cudaMalloc(&p, tot + 1) == cudaErrorMemoryAllocation, "an allocation past the device's memory succeeded");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "the failed allocation left no last error");
    CHECK(cudaGetLastError() == cudaSuccess, "the last error was not cleared");
    int count = 0;
    OK(cudaGetDeviceCount(&count));
    CHECK(count >= 1, "%d devices", count);
    struct cudaDeviceProp prop;
    OK(cudaGetDeviceProperties(&prop, 0));
    CHECK(prop.major == 9 && prop.warpSize == 32 && prop.maxThreadsPerBlock == 1024, "properties");
    CHECK(cudaSetDevice(count) == cudaErrorInvalidDevice, "a device past the count was accepted");
    (void)cudaGetLastError();
}

static void test_warp_ops(void) {
    int *d = NULL, h[32 * 8];
    OK(cudaMalloc((void **)&d, sizeof h));
    warp_ops<<<1, 32>>>(d);
    OK(cudaGetLastError());
    OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int l = 0; l < 32; l++) {
        const int *o = h + l * 8;
        CHECK((unsigned)o[0] == 0xaaaaaaaau, "ballot lane %d: %08x", l, (unsigned)o[0]);
        CHECK(o[1] == 1 && o[2] == 1, "any/all lane %d: %d %d", l, o[1], o[2]);
        CHECK(o[3] == ((l & ~7) + 3) * 10, "shfl width 8 lane %d: %d", l, o[3]);
        CHECK(o[4] == (l < 2 ? l : l - 2), "shfl_up lane %d: %d", l, o[4]);
        CHECK(o[5] == ((l & 15) + 4 < 16 ? l + 4 : l), "shfl_down width 16 lane %d: %d", l, o[5]);
        CHECK(o[6] == (l ^ 1), "shfl_xor lane %d: %d", l, o[6]);
        int want8 = (l ^ 8) <= ((l & ~7) | 7) ? (l ^ 8) : l; /* earlier groups readable, later ones not */
        CHECK(o[7] == want8, "shfl_xor width 8 lane %d: %d (want %d)", l, o[7], want8);
    }
    OK(cudaFree(d));
}

int main(void) {
    OK(cudaSetDevice(0));
    test_deferred_and_sync();
    test_events_and_streams();
    test_log();
    test_capture();
    test_counters_and_memory();
    test_warp_ops();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 && g_pass > 0 ? 0 : 1;
}
