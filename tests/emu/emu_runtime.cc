/* The emulated CUDA runtime: the functions of cuda_runtime_api.h that mirror calls, defined with
 * the real header's signatures (so the compiler checks them) over host memory and deferred
 * streams. See emu_internal.h for the memory and stream model; in short:
 *
 *  - MR_EMU_DEVICES (default 2) devices of an H100-like description (sm_90, 132 SMs, 80 GiB;
 *    MR_EMU_MEM_BYTES caps each device's memory, to test out-of-memory paths). 0 devices makes
 *    cudaGetDeviceCount fail with cudaErrorNoDevice, as on a machine without a GPU. MR_EMU_CC
 *    (default 90) is the compute capability they report, major*10 + minor.
 *  - cudaMalloc gives exactly the bytes asked for, filled with 0xFF, followed by a 1 KiB canary
 *    that is checked after every piece of device work and at cudaFree (an out-of-bounds write is
 *    reported with the work that did it). Under ASan every access out of the allocation is caught
 *    at the faulting line.
 *  - Work is queued per stream and runs when the host synchronizes with it. The legacy default
 *    stream is ordered with every blocking stream of its device, both ways. Events mark a point of
 *    a stream; cudaStreamWaitEvent waits for the point recorded last before the call. A copy to or
 *    from pageable host memory completes before cudaMemcpyAsync returns (as on a GPU); a copy
 *    to or from pinned memory (cudaHostAlloc) is deferred like a kernel.
 *  - Stream capture records the work into a graph; cudaGraphLaunch enqueues a replay. A
 *    synchronizing call from the capturing thread, or work on the legacy stream of a device with
 *    a capturing stream, invalidates the capture as the real runtime does.
 *  - Counters (raw allocations and frees, host synchronizations, launches) for tests: emu_api.h. */
#define MR_EMU_RUNTIME 1
#include "tests/emu/emu_api.h"
#include "tests/emu/emu_cuda.h"
#include "tests/emu/emu_exec_impl.h"
#include "tests/emu/emu_internal.h"
#include "tests/emu/emu_runtime_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#define MR_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#endif

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <stdarg.h>
#include <string.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <vector>

struct CUstream_st {
    uint64_t id; /* unique for the process: events and waits name a stream by pointer and id */
    int device;
    bool blocking;
    bool legacy;
    std::deque<mr_emu::item> q;
    uint64_t enq = 0, done = 0;
    pthread_t runner;
    bool running = false;
    bool destroyed = false;
    /* capture */
    CUgraph_st *cap = nullptr;
    pthread_t cap_thread;
    bool cap_invalid = false;
};

struct CUevent_st {
    int device;
    bool timing;
    CUstream_st *s = nullptr; /* the stream of the last record (NULL: never recorded) */
    uint64_t seq = 0;         /* complete when s->done >= seq */
    uint64_t sid = 0;         /* s's id: a destroyed stream's address may come back */
    /* the host time at which the last record point ran, shared with its TIME item, so that an
     * event destroyed while records are pending leaves nothing dangling */
    std::shared_ptr<double> t;
};

struct CUgraph_st {
    std::vector<mr_emu::item> items;
    int device;
};

struct CUgraphExec_st {
    std::vector<mr_emu::item> items;
    int device;
};

namespace mr_emu {
namespace {

const size_t CANARY = 1024; /* bytes checked past each allocation */
const unsigned char CANARY_BYTE = 0xA5;

struct alloc_rec {
    size_t bytes;
    int device;
    bool pinned;
};

struct state {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int ndev = -1;
    size_t mem_cap = 0;
    std::vector<size_t> used;
    std::vector<CUstream_st *> legacy;
    std::set<CUstream_st *> streams; /* every live stream, legacy ones included */
    std::map<uintptr_t, alloc_rec> allocs;
    schedule sched = SCHED_RANDOM;
    uint64_t seed = 1;
    mr_emu_stats stats = {};
    std::set<std::string> census;
    const char *census_path = nullptr;
    std::string last_work = "(none)";
    /* the enqueue/execution log (emu_api.h): ids are log_base + index + 1, so an item queued
     * before a restart finds no entry */
    bool log_on = false;
    std::vector<mr_emu_log_entry> log;
    uint64_t log_base = 0, log_clock = 0; /* one clock ticks at every enqueue and execution */
};
state *g;
pthread_once_t g_once = PTHREAD_ONCE_INIT;
uint64_t g_next_stream_id = 1; /* guarded by the lock */
thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;
thread_local bool t_locked = false;

void write_census(void);

void init_state(void) {
    g = new state();
    const char *d = getenv("MR_EMU_DEVICES");
    g->ndev = d && *d ? atoi(d) : 2;
    if (g->ndev < 0 || g->ndev > 16) g->ndev = 2;
    const char *m = getenv("MR_EMU_MEM_BYTES");
    g->mem_cap = m && *m ? (size_t)strtoull(m, NULL, 10) : ((size_t)80 << 30);
    g->used.assign((size_t)g->ndev, 0);
    for (int i = 0; i < g->ndev; i++) {
        CUstream_st *s = new CUstream_st();
        s->device = i;
        s->blocking = true;
        s->legacy = true;
        s->id = g_next_stream_id++;
        g->legacy.push_back(s);
        g->streams.insert(s);
    }
    g->sched = schedule_from_env();
    const char *sd = getenv("MR_EMU_SEED");
    g->seed = sd && *sd ? strtoull(sd, NULL, 10) : 1;
    g->census_path = getenv("MR_EMU_CENSUS");
    atexit(write_census);
}

state &st(void) {
    pthread_once(&g_once, init_state);
    return *g;
}

struct locker {
    bool mine;
    locker() : mine(!t_locked) {
        if (mine) {
            pthread_mutex_lock(&st().mu);
            t_locked = true;
        }
    }
    ~locker() {
        if (mine) {
            t_locked = false;
            pthread_mutex_unlock(&g->mu);
        }
    }
};

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

cudaError_t err(cudaError_t e) {
    if (e != cudaSuccess) t_last = e;
    return e;
}

void write_census(void) {
    if (!g || !g->census_path) return;
    /* the directory first (ctest's emu.census_reset removed it) */
    std::string dir(g->census_path);
    size_t slash = dir.rfind('/');
    if (slash != std::string::npos && slash > 0) (void)mkdir(dir.substr(0, slash).c_str(), 0777);
    FILE *f = fopen(g->census_path, "a");
    if (!f) {
        fprintf(stderr, "mirror-emu: cannot write the kernel census to %s\n", g->census_path);
        return;
    }
    (void)flock(fileno(f), LOCK_EX);
    for (const std::string &s : g->census) fprintf(f, "%s\n", s.c_str());
    fclose(f);
}

/* ---- allocations -------------------------------------------------------------------------------- */

const alloc_rec *find_alloc(const void *p, uintptr_t *base) {
    uintptr_t a = (uintptr_t)p;
    auto it = g->allocs.upper_bound(a);
    if (it == g->allocs.begin()) return nullptr;
    --it;
    size_t span = it->second.bytes > 0 ? it->second.bytes : 1;
    if (a < it->first || a >= it->first + span) return nullptr;
    if (base) *base = it->first;
    return &it->second;
}

void check_canaries(int device) {
#ifdef MR_EMU_ASAN
    (void)device; /* AddressSanitizer guards the canaries (poisoned): it reports the faulting line itself */
    return;
#endif
    for (const auto &kv : g->allocs) {
        if (kv.second.pinned || (device >= 0 && kv.second.device != device)) continue;
        const unsigned char *c = (const unsigned char *)kv.first + kv.second.bytes;
        for (size_t i = 0; i < CANARY; i++)
            if (c[i] != CANARY_BYTE)
                fatal("memory",
                      "out-of-bounds write: byte %zu past the end of a %zu-byte allocation on cuda:%d (at %p) was "
                      "overwritten; the last device work was %s",
                      i, kv.second.bytes, kv.second.device, (void *)kv.first, g->last_work.c_str());
    }
}

/* ---- streams ----------------------------------------------------------------------------------- */

bool stream_valid(CUstream_st *s) { return g->streams.count(s) != 0 && !s->destroyed; }

/* The stream of e's last record, or NULL when never recorded or that stream is gone. */
CUstream_st *event_stream(const CUevent_st *e) {
    if (!e->s || !stream_valid(e->s) || e->s->id != e->sid) return nullptr;
    return e->s;
}

CUstream_st *resolve(cudaStream_t s) {
    if (s == (cudaStream_t)0 || s == cudaStreamLegacy) {
        if (t_device < 0 || t_device >= g->ndev) return nullptr;
        return g->legacy[(size_t)t_device];
    }
    if (s == cudaStreamPerThread) fatal("runtime", "cudaStreamPerThread is not emulated (mirror does not use it)");
    return stream_valid(s) ? s : nullptr;
}

bool capturing_thread(void) {
    for (CUstream_st *s : g->streams)
        if (s->cap && pthread_equal(s->cap_thread, pthread_self())) return true;
    return false;
}

/* A synchronizing call on the capturing thread: invalidates its captures (as the runtime does in
 * the global and thread-local capture modes) and returns the error to report. */
cudaError_t unsafe_during_capture(void) {
    for (CUstream_st *s : g->streams)
        if (s->cap && pthread_equal(s->cap_thread, pthread_self())) s->cap_invalid = true;
    return err(cudaErrorStreamCaptureUnsupported);
}

void log_enqueue(CUstream_st *s, item &it) {
    mr_emu_log_entry e = {};
    e.stream = s->id;
    e.device = s->device;
    if (it.file) {
        const char *base = strrchr(it.file, '/');
        snprintf(e.what, sizeof e.what, "%s:%d", base ? base + 1 : it.file, it.line);
    } else {
        snprintf(e.what, sizeof e.what, "%s", it.what ? it.what : "");
    }
    if (it.kind == item::WAIT && it.ws) e.waits_for = it.ws->id;
    e.enq = ++g->log_clock;
    g->log.push_back(e);
    it.log_id = g->log_base + g->log.size();
}

void log_execute(const item &it) {
    if (it.log_id <= g->log_base || it.log_id - g->log_base > g->log.size()) return;
    g->log[(size_t)(it.log_id - g->log_base - 1)].exec = ++g->log_clock;
}

void push(CUstream_st *s, item it) {
    it.seq = ++s->enq;
    it.log_id = 0;
    if (g->log_on) log_enqueue(s, it);
    s->q.push_back(std::move(it));
    pthread_cond_broadcast(&g->cv);
}

void add_wait(CUstream_st *s, CUstream_st *on, uint64_t seq) {
    if (on == s || on->done >= seq) return;
    item w;
    w.kind = item::WAIT;
    w.what = "wait";
    w.ws = on;
    w.wseq = seq;
    push(s, std::move(w));
}

/* Queues `it` on s (lock held), with the legacy stream's implicit ordering. */
cudaError_t enqueue_locked(CUstream_st *s, item it, uint64_t *seq_out) {
    if (s->cap) {
        if (!pthread_equal(s->cap_thread, pthread_self()))
            fatal("runtime", "work (%s) was queued from another host thread on a stream being captured in "
                             "cudaStreamCaptureModeThreadLocal; mirror does not do that", it.what);
        if (s->cap_invalid) return err(cudaErrorStreamCaptureInvalidated);
        g->stats.captured_items++;
        s->cap->items.push_back(std::move(it));
        if (seq_out) *seq_out = 0;
        return cudaSuccess;
    }
    if (s->legacy) {
        for (CUstream_st *o : g->streams) {
            if (o->device != s->device || o->legacy || !o->blocking) continue;
            if (o->cap) {
                /* the legacy stream would join the capture: the runtime refuses and invalidates it */
                o->cap_invalid = true;
                return err(cudaErrorStreamCaptureImplicit);
            }
            add_wait(s, o, o->enq);
        }
    } else if (s->blocking) {
        CUstream_st *l = g->legacy[(size_t)s->device];
        add_wait(s, l, l->enq);
    }
    push(s, std::move(it));
    if (seq_out) *seq_out = s->enq;
    return cudaSuccess;
}

void execute(item &it) {
    switch (it.kind) {
    case item::WAIT: run_until(it.ws, it.wseq, false); break; /* already satisfied (run_until) */
    case item::WORK:
        g->last_work = it.what;
        it.fn();
        break;
    case item::TIME: *it.t_slot = now_s(); break;
    }
}

} // namespace

/* ---- what emu_internal.h and emu_runtime_impl.h promise ------------------------------------------- */

/* Every wait inside re-examines the stream from scratch afterwards: the lock was released, so
 * another thread may have run (or be running) it meanwhile. Only the thread that popped an item
 * runs it ("running"); no claim is held while waiting for an item to become ready, so threads
 * driving each other's streams (collectives) cannot deadlock: a stream whose item at point k is
 * being run is already done up to k - 1. */
bool run_until(CUstream_st *s, uint64_t seq, bool nonblocking) {
    pthread_t me = pthread_self();
    double deadline = 0;
    while (s->done < seq) {
        if (s->running && !pthread_equal(s->runner, me)) {
            if (nonblocking) return false;
            pthread_cond_wait(&g->cv, &g->mu);
            continue;
        }
        if (s->q.empty()) fatal("runtime", "internal: stream has no work to reach its point %llu", (unsigned long long)seq);
        item &front = s->q.front();
        uint64_t at = s->done;
        if (front.kind == item::WAIT && front.ws->done < front.wseq) {
            /* bring the other stream to the point first; then look again */
            if (!run_until(front.ws, front.wseq, nonblocking)) return false;
            continue;
        }
        if (front.ready && !front.ready()) {
            if (nonblocking) return false;
            if (deadline == 0) deadline = now_s() + 120.0;
            if (now_s() > deadline)
                fatal("runtime", "%s waited 120 s for work that no host thread queued (a collective that some rank "
                                 "never called, or calls for several GPUs from one thread outside ncclGroupStart/End)",
                      front.what);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&g->cv, &g->mu, &ts);
            continue;
        }
        if (front.pre) {
            /* a collective: the other ranks' streams up to their parts, without holding s */
            std::function<bool(bool)> pre = front.pre;
            if (!pre(nonblocking)) return false;
            if (s->done != at || (s->running && !pthread_equal(s->runner, me))) continue;
        }
        bool outer = !s->running;
        s->running = true;
        s->runner = me;
        item it = std::move(s->q.front());
        s->q.pop_front();
        execute(it);
        log_execute(it);
        check_canaries(s->device);
        s->done = it.seq;
        if (outer) s->running = false;
        pthread_cond_broadcast(&g->cv);
    }
    return true;
}

void wait_until(const std::function<bool()> &pred, const char *what) {
    double deadline = now_s() + 120.0;
    while (!pred()) {
        if (now_s() > deadline)
            fatal("runtime", "%s waited 120 s for work that no host thread queued (a collective that some rank never "
                             "called, or calls for several GPUs from one thread outside ncclGroupStart/End)", what);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
}

void lock(void) {
    pthread_mutex_lock(&st().mu);
    t_locked = true;
}
void unlock(void) {
    t_locked = false;
    pthread_mutex_unlock(&g->mu);
}

cudaError_t enqueue_item(cudaStream_t s, item it, CUstream_st **s_out, uint64_t *seq_out) {
    locker l;
    CUstream_st *r = resolve(s);
    if (!r) return err(cudaErrorInvalidResourceHandle);
    if (r->device != t_device) return err(cudaErrorInvalidResourceHandle); /* a stream of another device */
    if (s_out) *s_out = r;
    return enqueue_locked(r, std::move(it), seq_out);
}

cudaError_t enqueue(cudaStream_t s, const char *what, std::function<void()> fn) {
    item it;
    it.kind = item::WORK;
    it.what = what;
    it.fn = std::move(fn);
    return enqueue_item(s, std::move(it), nullptr, nullptr);
}

bool device_range(const void *p, size_t bytes, int *device) {
    locker l;
    uintptr_t base;
    const alloc_rec *a = find_alloc(p, &base);
    if (!a || a->pinned) return false;
    if ((uintptr_t)p + bytes > base + a->bytes) return false;
    if (device) *device = a->device;
    return true;
}

bool pinned_range(const void *p, size_t bytes) {
    uintptr_t base;
    const alloc_rec *a = find_alloc(p, &base);
    return a && a->pinned && (uintptr_t)p + bytes <= base + a->bytes;
}

int current_device(void) { return t_device; }

int stream_device(cudaStream_t s) {
    locker l;
    CUstream_st *r = resolve(s);
    return r ? r->device : -1;
}

void fatal(const char *lib, const char *fmt, ...) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "mirror-emu: %s: %s\n", lib, msg);
    fflush(stderr);
    abort();
}

void count_library_call(void) {
    locker l;
    g->stats.library_calls++;
}

void count_host_sync(void) { g->stats.host_syncs++; }

int device_count(void) { return st().ndev; }

} // namespace mr_emu

/* ---- the census (emu_cuda.h) ---------------------------------------------------------------------- */
mr_emu_k::census_site::census_site(const char *file, int line, const char *name) {
    (void)name;
    mr_emu::locker l;
    char b[1024];
    const char *base = strstr(file, "core/cuda/");
    snprintf(b, sizeof b, "%s:%d", base ? base : file, line);
    mr_emu::g->census.insert(b);
}

void mr_emu_k::launch(const cfg &c, std::function<void()> body) {
    using namespace mr_emu;
    locker l;
    state &S = st();
    /* sm_90 limits, reported through cudaGetLastError as the runtime does */
    uint64_t threads = (uint64_t)c.block.x * c.block.y * c.block.z;
    if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0 || threads > 1024 || c.block.x > 1024 ||
        c.block.y > 1024 || c.block.z > 64 || c.grid.y > 65535 || c.grid.z > 65535 || c.grid.x > 0x7fffffffu) {
        fprintf(stderr, "mirror-emu: note: launch at %s:%d has an invalid configuration: grid (%u,%u,%u), block (%u,%u,%u)\n",
                c.file, c.line, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z);
        err(cudaErrorInvalidConfiguration);
        return;
    }
    if (c.smem > (48u << 10)) {
        err(cudaErrorInvalidValue); /* more than 48 KiB of dynamic shared memory needs an opt-in */
        return;
    }
    CUstream_st *s = resolve(c.stream);
    if (!s || s->device != t_device) {
        err(cudaErrorInvalidResourceHandle);
        return;
    }
    grid_job j;
    j.grid = c.grid;
    j.block = c.block;
    j.smem = c.smem;
    j.body = std::move(body);
    j.file = c.file;
    j.line = c.line;
    j.sched = S.sched;
    j.seed = S.seed * 0x9E3779B97F4A7C15ull + S.stats.launches;
    S.stats.launches++;
    item it;
    it.kind = item::WORK;
    char *what = nullptr;
    if (asprintf(&what, "the kernel launched at %s:%d", c.file, c.line) < 0) what = nullptr;
    it.what = "kernel";
    it.file = c.file;
    it.line = c.line;
    std::string w = what ? what : "a kernel";
    free(what);
    it.fn = [j, w]() {
        g->last_work = w;
        run_grid(j);
    };
    (void)enqueue_locked(s, std::move(it), nullptr);
}

/* ---- test counters (emu_api.h) -------------------------------------------------------------------- */
extern "C" void mr_emu_get_stats(mr_emu_stats *out) {
    mr_emu::locker l;
    *out = mr_emu::g->stats;
    out->bytes_in_use = 0;
    for (size_t u : mr_emu::g->used) out->bytes_in_use += u;
}
extern "C" int mr_emu_active(void) { return 1; }

extern "C" void mr_emu_log_start(void) {
    mr_emu::locker l;
    mr_emu::g->log_base += mr_emu::g->log.size();
    mr_emu::g->log.clear();
    mr_emu::g->log_clock = 0;
    mr_emu::g->log_on = true;
}

extern "C" void mr_emu_log_stop(void) {
    mr_emu::locker l;
    mr_emu::g->log_on = false;
}

extern "C" int64_t mr_emu_log_read(mr_emu_log_entry *out, int64_t cap) {
    mr_emu::locker l;
    const std::vector<mr_emu_log_entry> &v = mr_emu::g->log;
    for (size_t i = 0; out && i < v.size() && (int64_t)i < cap; i++) out[i] = v[i];
    return (int64_t)v.size();
}

/* ==== cuda_runtime_api.h ================================================================ */
using namespace mr_emu;

namespace {

cudaError_t check_device(int d) { return d >= 0 && d < st().ndev ? cudaSuccess : cudaErrorInvalidDevice; }

/* Runs s to its current end on this thread: a host synchronization. */
void drain(CUstream_st *s) {
    count_host_sync();
    run_until(s, s->enq, false);
}

void drain_device(int d) {
    count_host_sync();
    std::vector<CUstream_st *> v;
    for (CUstream_st *s : g->streams)
        if (s->device == d) v.push_back(s);
    for (CUstream_st *s : v) run_until(s, s->enq, false);
}

enum mem_side { SIDE_DEVICE, SIDE_PINNED, SIDE_PAGEABLE };

mem_side side_of(const void *p, size_t bytes, int *device) {
    uintptr_t base;
    const alloc_rec *a = find_alloc(p, &base);
    if (!a) return SIDE_PAGEABLE;
    if (a->pinned) return SIDE_PINNED;
    if ((uintptr_t)p + bytes > base + a->bytes)
        fatal("runtime", "a copy of %zu bytes at %p runs past the end of its %zu-byte device allocation (%zu bytes in)", bytes,
              p, a->bytes, (size_t)((uintptr_t)p - base));
    if (device) *device = a->device;
    return SIDE_DEVICE;
}

const char *kind_name(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
    }
    return "an unknown cudaMemcpyKind";
}

/* Checks a copy's kind against where its pointers live (the runtime gives wrong results or faults
 * on a mismatch; the emulator reports it) and queues it; `sync` completes it before returning. */
cudaError_t copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t stream, bool sync) {
    locker l;
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return err(cudaErrorInvalidValue);
    int dd = -1, sd = -1;
    mem_side ds = side_of(dst, n, &dd), ss = side_of(src, n, &sd);
    bool dst_dev = ds == SIDE_DEVICE, src_dev = ss == SIDE_DEVICE;
    bool ok = true;
    switch (kind) {
    case cudaMemcpyHostToHost: ok = !dst_dev && !src_dev; break;
    case cudaMemcpyHostToDevice: ok = dst_dev && !src_dev; break;
    case cudaMemcpyDeviceToHost: ok = !dst_dev && src_dev; break;
    case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
    case cudaMemcpyDefault: break;
    default: return err(cudaErrorInvalidMemcpyDirection);
    }
    if (!ok)
        fatal("runtime", "%s of %zu bytes from %s memory to %s memory", kind_name(kind), n,
              src_dev ? "device" : "host", dst_dev ? "device" : "host");
    if (capturing_thread() && sync) return unsafe_during_capture();
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    if ((dst_dev && dd != s->device) || (src_dev && sd != s->device))
        fatal("runtime", "a copy on a stream of cuda:%d touches memory of cuda:%d (peer copies are not emulated)", s->device,
              dst_dev ? dd : sd);
    item it;
    it.kind = item::WORK;
    it.what = kind_name(kind);
    it.fn = [dst, src, n]() { memmove(dst, src, n); };
    uint64_t seq = 0;
    cudaError_t e = enqueue_locked(s, std::move(it), &seq);
    if (e != cudaSuccess) return e;
    /* a copy touching pageable host memory has completed when the call returns */
    bool pageable = (!dst_dev && ds == SIDE_PAGEABLE) || (!src_dev && ss == SIDE_PAGEABLE);
    if ((sync || pageable) && !s->cap) {
        count_host_sync();
        run_until(s, seq, false);
    }
    return cudaSuccess;
}

const char *error_name(cudaError_t e) {
    switch (e) {
#define N(x)                                                                                      \
    case x: return #x;
        N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInitializationError)
        N(cudaErrorInvalidConfiguration) N(cudaErrorInvalidDevice) N(cudaErrorInvalidMemcpyDirection)
        N(cudaErrorNoDevice) N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady) N(cudaErrorNotSupported)
        N(cudaErrorStreamCaptureUnsupported) N(cudaErrorStreamCaptureInvalidated) N(cudaErrorStreamCaptureImplicit)
        N(cudaErrorStreamCaptureUnmatched) N(cudaErrorIllegalState) N(cudaErrorInvalidDevicePointer)
#undef N
    default: return "cudaErrorUnknown";
    }
}

} // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 0;
    if (st().ndev == 0) return err(cudaErrorNoDevice);
    *count = st().ndev;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (check_device(device) != cudaSuccess) return err(cudaErrorInvalidDevice);
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (st().ndev == 0) return err(cudaErrorNoDevice);
    *device = t_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    if (check_device(device) != cudaSuccess) return err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "mirror-emu H100 (emulated on the CPU)");
    /* MR_EMU_CC (e.g. 75, 120) emulates another GPU generation for the build-coverage checks
     * (core/cuda_arch.c); read on every call so one test can try several */
    const char *cc = getenv("MR_EMU_CC");
    const int ccv = cc && *cc ? atoi(cc) : 90;
    p->major = ccv / 10;
    p->minor = ccv % 10;
    p->totalGlobalMem = st().mem_cap;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 << 20;
    p->totalConstMem = 64 << 10;
    p->pciBusID = device + 1;
    p->unifiedAddressing = 1;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 2;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last; }

const char *cudaGetErrorName(cudaError_t e) { return error_name(e); }

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory (emulated device)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (MR_EMU_DEVICES=0)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return error_name(e);
    }
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    locker l;
    *p = nullptr;
    if (capturing_thread()) return unsafe_during_capture();
    if (check_device(t_device) != cudaSuccess) return err(cudaErrorNoDevice);
    size_t &used = g->used[(size_t)t_device];
    if (used + bytes > g->mem_cap) return err(cudaErrorMemoryAllocation);
    unsigned char *m = (unsigned char *)malloc(bytes + CANARY);
    if (!m) return err(cudaErrorMemoryAllocation);
    memset(m, 0xFF, bytes);
    memset(m + bytes, CANARY_BYTE, CANARY);
#ifdef MR_EMU_ASAN
    __asan_poison_memory_region(m + bytes, CANARY);
#endif
    g->allocs[(uintptr_t)m] = alloc_rec{bytes, t_device, false};
    used += bytes;
    g->stats.raw_allocs++;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    locker l;
    if (!p) return cudaSuccess;
    if (capturing_thread()) return unsafe_during_capture();
    auto it = g->allocs.find((uintptr_t)p);
    if (it == g->allocs.end() || it->second.pinned)
        fatal("runtime", "cudaFree(%p): not a pointer cudaMalloc returned (or freed twice)", p);
    /* cudaFree synchronizes the device first */
    drain_device(it->second.device);
    check_canaries(it->second.device);
    size_t it_bytes = it->second.bytes;
    (void)it_bytes;
    g->used[(size_t)it->second.device] -= it->second.bytes;
    g->allocs.erase(it);
    g->stats.raw_frees++;
#ifdef MR_EMU_ASAN
    __asan_unpoison_memory_region((unsigned char *)p + it_bytes, CANARY);
#endif
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    locker l;
    (void)flags;
    *p = nullptr;
    unsigned char *m = (unsigned char *)malloc(bytes ? bytes : 1);
    if (!m) return err(cudaErrorMemoryAllocation);
    g->allocs[(uintptr_t)m] = alloc_rec{bytes ? bytes : 1, -1, true};
    g->stats.host_allocs++;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void *p) {
    locker l;
    if (!p) return cudaSuccess;
    auto it = g->allocs.find((uintptr_t)p);
    if (it == g->allocs.end() || !it->second.pinned)
        fatal("runtime", "cudaFreeHost(%p): not a pointer cudaHostAlloc returned (or freed twice)", p);
    /* pending copies from or to it must not outlive it: the runtime synchronizes too */
    for (int d = 0; d < g->ndev; d++) drain_device(d);
    g->allocs.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    locker l;
    if (check_device(t_device) != cudaSuccess) return err(cudaErrorNoDevice);
    *total = g->mem_cap;
    *free_b = g->mem_cap - g->used[(size_t)t_device];
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    locker l;
    memset(a, 0, sizeof *a);
    uintptr_t base;
    const alloc_rec *r = find_alloc(p, &base);
    if (!r) {
        a->type = cudaMemoryTypeUnregistered;
        a->device = -1;
        return cudaSuccess;
    }
    a->type = r->pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    a->device = r->pinned ? 0 : r->device;
    a->devicePointer = (void *)p;
    a->hostPointer = r->pinned ? (void *)p : nullptr;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    return copy(dst, src, n, kind, (cudaStream_t)0, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    return copy(dst, src, n, kind, s, false);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t stream) {
    locker l;
    if (n == 0) return cudaSuccess;
    int dd = -1;
    if (side_of(dst, n, &dd) != SIDE_DEVICE) fatal("runtime", "cudaMemsetAsync of %zu bytes on host memory %p", n, dst);
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    if (dd != s->device) fatal("runtime", "cudaMemsetAsync on a stream of cuda:%d of memory of cuda:%d", s->device, dd);
    item it;
    it.what = "cudaMemsetAsync";
    it.fn = [dst, value, n]() { memset(dst, value, n); };
    return enqueue_locked(s, std::move(it), nullptr);
}

cudaError_t cudaMemset(void *dst, int value, size_t n) {
    cudaError_t e = cudaMemsetAsync(dst, value, n, (cudaStream_t)0);
    if (e != cudaSuccess) return e;
    return cudaStreamSynchronize((cudaStream_t)0);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
    locker l;
    if (check_device(t_device) != cudaSuccess) return err(cudaErrorNoDevice);
    CUstream_st *s = new CUstream_st();
    s->device = t_device;
    s->blocking = !(flags & cudaStreamNonBlocking);
    s->legacy = false;
    s->id = g_next_stream_id++;
    g->streams.insert(s);
    *out = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    locker l;
    if (!stream || stream == cudaStreamLegacy || !stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
    if (stream->cap) fatal("runtime", "cudaStreamDestroy of a stream that is being captured");
    /* the runtime finishes the stream's work before releasing it */
    run_until(stream, stream->enq, false);
    /* it has drained: waits other streams queued on it are satisfied; drop them before the
     * stream goes, or they would point at freed memory */
    for (CUstream_st *o : g->streams)
        for (item &it : o->q)
            if (it.kind == item::WAIT && it.ws == stream) {
                it.kind = item::WORK;
                it.fn = [] {};
            }
    g->streams.erase(stream);
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    locker l;
    if (capturing_thread()) return unsafe_during_capture();
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    drain(s);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    locker l;
    if (capturing_thread()) return unsafe_during_capture();
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    /* the emulator makes the progress a GPU would have made meanwhile, short of waiting for a
     * collective that not every rank has queued */
    return run_until(s, s->enq, true) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
    locker l;
    if (capturing_thread()) return unsafe_during_capture();
    if (check_device(t_device) != cudaSuccess) return err(cudaErrorNoDevice);
    drain_device(t_device);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
    locker l;
    if (check_device(t_device) != cudaSuccess) return err(cudaErrorNoDevice);
    CUevent_st *e = new CUevent_st();
    e->device = t_device;
    e->timing = !(flags & cudaEventDisableTiming);
    *out = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    locker l;
    if (!e) return err(cudaErrorInvalidResourceHandle);
    delete e; /* returns at once, as the runtime does; pending records write their own slots */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
    locker l;
    if (!e) return err(cudaErrorInvalidResourceHandle);
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    if (s->device != e->device) return err(cudaErrorInvalidResourceHandle);
    if (s->cap)
        fatal("runtime", "cudaEventRecord on a stream being captured: events inside a graph (fork/join capture) are not "
                         "emulated, and mirror's captures use one stream");
    if (e->timing) {
        item it;
        it.kind = item::TIME;
        it.what = "cudaEventRecord";
        e->t = std::make_shared<double>(0.0);
        it.t_slot = e->t;
        cudaError_t r = enqueue_locked(s, std::move(it), nullptr);
        if (r != cudaSuccess) return r;
    } else if (s->legacy || s->blocking) {
        /* the record point must include the implicit legacy-stream ordering */
        item it;
        it.what = "cudaEventRecord";
        it.fn = [] {};
        cudaError_t r = enqueue_locked(s, std::move(it), nullptr);
        if (r != cudaSuccess) return r;
    }
    e->s = s;
    e->sid = s->id;
    e->seq = s->enq;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    locker l;
    if (!e) return err(cudaErrorInvalidResourceHandle);
    if (capturing_thread()) return unsafe_during_capture();
    CUstream_st *es = event_stream(e);
    if (!es) return cudaSuccess;
    return run_until(es, e->seq, true) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    locker l;
    if (!e) return err(cudaErrorInvalidResourceHandle);
    if (capturing_thread()) return unsafe_during_capture();
    CUstream_st *es = event_stream(e);
    if (!es) return cudaSuccess;
    count_host_sync();
    run_until(es, e->seq, false);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    locker l;
    if (!a || !b || !a->timing || !b->timing) return err(cudaErrorInvalidResourceHandle);
    if (!event_stream(a) || !event_stream(b) || !a->t || !b->t) return err(cudaErrorInvalidResourceHandle);
    if (a->s->done < a->seq || b->s->done < b->seq) return err(cudaErrorNotReady);
    *ms = (float)((*b->t - *a->t) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int flags) {
    locker l;
    (void)flags;
    if (!e) return err(cudaErrorInvalidResourceHandle);
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    CUstream_st *es = event_stream(e);
    if (!es) return cudaSuccess; /* never recorded (or its stream has drained and gone): nothing to wait for */
    if (s->cap) {
        if (es->done >= e->seq) return cudaSuccess;
        fatal("runtime", "cudaStreamWaitEvent inside a capture on work outside it is not emulated");
    }
    add_wait(s, es, e->seq);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    locker l;
    if (mode != cudaStreamCaptureModeThreadLocal)
        fatal("runtime", "only cudaStreamCaptureModeThreadLocal is emulated (mirror's mode)");
    if (!stream || stream == cudaStreamLegacy) return err(cudaErrorStreamCaptureUnsupported);
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    if (s->cap) return err(cudaErrorIllegalState);
    s->cap = new CUgraph_st();
    s->cap->device = s->device;
    s->cap_thread = pthread_self();
    s->cap_invalid = false;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
    locker l;
    if (!status) return err(cudaErrorInvalidValue);
    if (!stream || stream == cudaStreamLegacy) {
        *status = cudaStreamCaptureStatusNone; /* mirror never captures the legacy stream */
        return cudaSuccess;
    }
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    *status = !s->cap ? cudaStreamCaptureStatusNone
                      : s->cap_invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *out) {
    locker l;
    *out = nullptr;
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    if (!s->cap) return err(cudaErrorIllegalState);
    if (!pthread_equal(s->cap_thread, pthread_self())) return err(cudaErrorStreamCaptureWrongThread);
    CUgraph_st *gph = s->cap;
    s->cap = nullptr;
    if (s->cap_invalid) {
        delete gph;
        return err(cudaErrorStreamCaptureInvalidated);
    }
    *out = gph;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t graph, unsigned long long flags) {
    locker l;
    (void)flags;
    if (!graph) return err(cudaErrorInvalidValue);
    CUgraphExec_st *x = new CUgraphExec_st();
    x->items = graph->items;
    x->device = graph->device;
    *out = x;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t stream) {
    locker l;
    if (!x) return err(cudaErrorInvalidValue);
    CUstream_st *s = resolve(stream);
    if (!s) return err(cudaErrorInvalidResourceHandle);
    if (s->device != x->device) return err(cudaErrorInvalidValue);
    g->stats.graph_launches++;
    for (const item &it : x->items) {
        cudaError_t e = enqueue_locked(s, it, nullptr);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
    delete x;
    return cudaSuccess;
}

} // extern "C"
