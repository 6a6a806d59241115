/* Tests of the caching allocator (core/alloc_cache.c) over a fake raw allocator that counts its
 * calls, hands out real host memory (so ASan sees any overlap or overrun) and can be given a
 * capacity to run out of; its "events" complete when the test says so. Checked: reuse after free,
 * no raw allocation in a steady loop, splitting and best fit, small and large pools kept apart,
 * the out-of-memory path (release the cache, retry once, then a message with the numbers and a
 * HINT), exact statistics, release_cached, pending blocks not reused before their event completes
 * (and waited for when nothing else fits), the pass-through mode, bad frees, and two threads
 * hammering one cache. Also the CPU backend's counters and pinned-host entries. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "core/alloc_cache_impl.h"
#include "core/device.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* ---- the fake raw allocator ------------------------------------------------------------------- */

typedef struct fake {
    pthread_mutex_t mu;
    size_t capacity; /* 0: unlimited */
    size_t used;     /* bytes handed out and not freed */
    size_t last_bytes;
    int64_t allocs, frees, failed;
    int64_t ev_new, ev_free, records, queries, waits;
    int auto_done; /* recorded events complete at once */
    void *events[4096];
    int nevents;
} fake;

typedef struct fake_event {
    int done;
} fake_event;

/* 512 bytes of header keep the returned pointer 512-byte aligned and remember the size. */
static mr_status fake_alloc(void *ctx, size_t bytes, void **out) {
    fake *f = ctx;
    mr_status st = MR_OK;
    pthread_mutex_lock(&f->mu);
    f->last_bytes = bytes;
    if (f->capacity && f->used + bytes > f->capacity) {
        f->failed++;
        st = mr_set_error(MR_ERR_NOMEM, "fake: out of memory (%zu of %zu used)", f->used, f->capacity);
    } else {
        char *p = aligned_alloc(512, 512 + (bytes + 511) / 512 * 512);
        assert_non_null(p);
        memcpy(p, &bytes, sizeof bytes);
        *out = p + 512;
        f->used += bytes;
        f->allocs++;
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

static void fake_free(void *ctx, void *p) {
    fake *f = ctx;
    size_t bytes;
    char *base = (char *)p - 512;
    memcpy(&bytes, base, sizeof bytes);
    pthread_mutex_lock(&f->mu);
    f->used -= bytes;
    f->frees++;
    pthread_mutex_unlock(&f->mu);
    free(base);
}

static mr_status fake_event_new(void *ctx, void **out) {
    fake *f = ctx;
    fake_event *e = calloc(1, sizeof *e);
    assert_non_null(e);
    pthread_mutex_lock(&f->mu);
    f->ev_new++;
    assert_true(f->nevents < 4096);
    f->events[f->nevents++] = e;
    pthread_mutex_unlock(&f->mu);
    *out = e;
    return MR_OK;
}

static void fake_event_free(void *ctx, void *ev) {
    fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->ev_free++;
    for (int i = 0; i < f->nevents; i++) {
        if (f->events[i] == ev) {
            f->events[i] = f->events[--f->nevents];
            break;
        }
    }
    pthread_mutex_unlock(&f->mu);
    free(ev);
}

static mr_status fake_event_record(void *ctx, void *ev) {
    fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    ((fake_event *)ev)->done = f->auto_done;
    f->records++;
    pthread_mutex_unlock(&f->mu);
    return MR_OK;
}

static mr_status fake_event_query(void *ctx, void *ev, int *done) {
    fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    *done = ((fake_event *)ev)->done;
    f->queries++;
    pthread_mutex_unlock(&f->mu);
    return MR_OK;
}

static mr_status fake_event_wait(void *ctx, void *ev) {
    fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    ((fake_event *)ev)->done = 1;
    f->waits++;
    pthread_mutex_unlock(&f->mu);
    return MR_OK;
}

/* The device catches up: every recorded event completes. */
static void fake_complete_all(fake *f) {
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->nevents; i++) ((fake_event *)f->events[i])->done = 1;
    pthread_mutex_unlock(&f->mu);
}

static mr_alloc_cache *make_cache(fake *f, int events, int caching) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    mr_alloc_raw r;
    memset(&r, 0, sizeof r);
    r.ctx = f;
    r.alloc = fake_alloc;
    r.free = fake_free;
    if (events) {
        r.event_new = fake_event_new;
        r.event_free = fake_event_free;
        r.event_record = fake_event_record;
        r.event_query = fake_event_query;
        r.event_wait = fake_event_wait;
    }
    mr_alloc_cache *c = NULL;
    MR_ASSERT_OK(mr_alloc_cache_new(&r, caching, "fake:0", &c));
    return c;
}

/* Destroys the cache and checks that every raw allocation and event came back. */
static void done_cache(mr_alloc_cache *c, fake *f) {
    mr_alloc_cache_free(c);
    assert_int_equal(f->allocs, f->frees);
    assert_int_equal(f->used, 0);
    assert_int_equal(f->ev_new, f->ev_free);
    assert_int_equal(f->nevents, 0);
    pthread_mutex_destroy(&f->mu);
}

static mr_memory_stats stats(mr_alloc_cache *c) {
    mr_memory_stats s;
    mr_alloc_cache_stats(c, &s);
    return s;
}

static void *get(mr_alloc_cache *c, size_t bytes) {
    void *p = NULL;
    MR_ASSERT_OK(mr_alloc_cache_alloc(c, bytes, &p));
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 512, 0);
    memset(p, 0xab, bytes); /* ASan: the whole request is usable */
    return p;
}

static void put(mr_alloc_cache *c, void *p) { MR_ASSERT_OK(mr_alloc_cache_dealloc(c, p)); }

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_reuse_after_free(void **state) {
    (void)state;
    fake f;
    mr_alloc_cache *c = make_cache(&f, 0, 1);
    void *a = get(c, 1000);
    assert_int_equal(f.allocs, 1);
    assert_int_equal(f.last_bytes, 2 * MIB); /* a small block comes from a 2 MiB segment */
    put(c, a);
    assert_int_equal(f.frees, 0); /* cached, not returned */
    void *b = get(c, 1000);
    assert_ptr_equal(a, b);
    assert_int_equal(f.allocs, 1);
    assert_int_equal(stats(c).cache_hits, 1);
    void *z = get(c, 0); /* 0 bytes: a unique pointer */
    assert_ptr_not_equal(z, b);
    put(c, b);
    put(c, z);
    done_cache(c, &f);
}

/* The training-step pattern: the same sizes every round allocate nothing after the first. */
static void test_steady_loop(void **state) {
    (void)state;
    static const size_t sizes[] = {1000, 70000, 3 * MIB, 512, 5 * MIB + 3, 1 * MIB, 1 * MIB + 1, 300 * KIB};
    enum { NS = sizeof sizes / sizeof *sizes };
    for (int events = 0; events < 2; events++) {
        fake f;
        mr_alloc_cache *c = make_cache(&f, events, 1);
        f.auto_done = 1;
        void *p[NS];
        int64_t raw_after_first = 0;
        for (int round = 0; round < 100; round++) {
            for (int i = 0; i < NS; i++) p[i] = get(c, sizes[i]);
            /* free in a different order from the allocation */
            for (int i = NS - 1; i >= 0; i -= 2) put(c, p[i]);
            for (int i = NS - 2; i >= 0; i -= 2) put(c, p[i]);
            assert_int_equal(stats(c).in_use, 0);
            if (round == 0) raw_after_first = f.allocs;
            else assert_int_equal(f.allocs, raw_after_first);
        }
        mr_memory_stats s = stats(c);
        assert_int_equal(s.allocs, 100 * NS);
        assert_int_equal(s.raw_allocs, raw_after_first);
        assert_int_equal(s.cache_hits, 100 * NS - raw_after_first);
        assert_int_equal(f.frees, 0);
        /* the event pool: one event per block pending at once, not one per free */
        if (events) assert_true(f.ev_new <= NS);
        done_cache(c, &f);
    }
}

static void test_split_best_fit(void **state) {
    (void)state;
    fake f;
    mr_alloc_cache *c = make_cache(&f, 0, 1);
    /* small blocks are carved from one segment in address order */
    char *a = get(c, 4096), *b = get(c, 8192), *d = get(c, 4096);
    assert_ptr_equal(b, a + 4096);
    assert_ptr_equal(d, b + 8192);
    assert_int_equal(f.allocs, 1);
    put(c, b);
    /* free: b (8 KiB) and the segment's tail (2 MiB - 16 KiB): best fit takes b, split */
    char *e = get(c, 4000);
    assert_ptr_equal(e, b);
    char *g = get(c, 4096);
    assert_ptr_equal(g, b + 4096);
    assert_int_equal(f.allocs, 1);
    /* everything back: neighbours merge into one free segment, which release returns */
    put(c, a);
    put(c, d);
    put(c, e);
    put(c, g);
    MR_ASSERT_OK(mr_alloc_cache_release_cached(c));
    assert_int_equal(f.frees, 1);
    assert_int_equal(stats(c).reserved, 0);

    /* large: 5 MiB takes a 6 MiB segment; the 1 MiB rest is too small to split off */
    char *l = get(c, 5 * MIB);
    assert_int_equal(f.last_bytes, 6 * MIB);
    assert_int_equal(stats(c).in_use, 6 * MIB);
    assert_int_equal(stats(c).requested, 5 * MIB);
    put(c, l);
    /* a 10 MiB segment split into 3 + 7 */
    char *big = get(c, 10 * MIB);
    assert_int_equal(f.last_bytes, 10 * MIB);
    put(c, big);
    int64_t raw = f.allocs;
    char *l3 = get(c, 3 * MIB);
    char *l7 = get(c, 7 * MIB);
    assert_int_equal(f.allocs, raw);
    /* best fit: the 6 MiB segment is the smallest that holds 3 MiB (split: 3 + 3 free), then 7 MiB
     * takes the 10 MiB segment */
    assert_ptr_equal(l3, l);
    assert_ptr_equal(l7, big);
    /* a small request never takes a large free block: a new 2 MiB segment */
    char *s = get(c, 1000);
    assert_int_equal(f.allocs, raw + 1);
    assert_int_equal(f.last_bytes, 2 * MIB);
    put(c, l3);
    put(c, l7);
    put(c, s);
    done_cache(c, &f);
}

static void test_oom_releases_and_retries(void **state) {
    (void)state;
    fake f;
    mr_alloc_cache *c = make_cache(&f, 0, 1);
    f.capacity = 8 * MIB;
    void *a = get(c, 1000);    /* 2 MiB segment */
    void *b = get(c, 4 * MIB); /* 4 MiB segment */
    put(c, a);
    put(c, b);
    assert_int_equal(stats(c).reserved, 6 * MIB);
    /* 6 MiB does not fit next to the 6 cached: the cache is released and the alloc retried */
    void *d = get(c, 6 * MIB);
    assert_int_equal(f.failed, 1);
    assert_int_equal(f.frees, 2);
    assert_int_equal(stats(c).reserved, 6 * MIB);
    /* now really out of memory: an error with the numbers and a HINT, stats unchanged */
    void *e = (void *)1;
    mr_status st = mr_alloc_cache_alloc(c, 4 * MIB, &e);
    assert_int_equal(st, MR_ERR_NOMEM);
    assert_null(e);
    const char *msg = mr_last_error();
    assert_non_null(strstr(msg, "fake:0: out of memory allocating 4194304 bytes"));
    assert_non_null(strstr(msg, "6291456 bytes in use"));
    assert_non_null(strstr(msg, "peak in use 6291456"));
    assert_non_null(strstr(msg, "HINT: "));
    mr_memory_stats s = stats(c);
    assert_int_equal(s.in_use, 6 * MIB);
    assert_int_equal(s.allocs, 3);
    put(c, d);
    done_cache(c, &f);
}

/* Every counter after a known sequence. */
static void test_stats_exact(void **state) {
    (void)state;
    fake f;
    mr_alloc_cache *c = make_cache(&f, 0, 1);
    mr_memory_stats s = stats(c);
    assert_int_equal(s.in_use + s.reserved + s.peak_in_use + (size_t)s.allocs, 0);
    void *a = get(c, 1000);      /* 1024 in use */
    void *b = get(c, 3 * MIB);   /* 4 MiB segment, 3 MiB block + 1 MiB rest (not split) */
    s = stats(c);
    assert_int_equal(s.in_use, 1024 + 4 * MIB);
    assert_int_equal(s.requested, 1000 + 3 * MIB);
    assert_int_equal(s.reserved, 2 * MIB + 4 * MIB);
    assert_int_equal(s.peak_in_use, 1024 + 4 * MIB);
    assert_int_equal(s.peak_reserved, 6 * MIB);
    assert_int_equal(s.allocs, 2);
    assert_int_equal(s.raw_allocs, 2);
    assert_int_equal(s.cache_hits, 0);
    put(c, b);
    void *d = get(c, 512);
    s = stats(c);
    assert_int_equal(s.in_use, 1024 + 512);
    assert_int_equal(s.requested, 1000 + 512);
    assert_int_equal(s.peak_in_use, 1024 + 4 * MIB);
    assert_int_equal(s.allocs, 3);
    assert_int_equal(s.cache_hits, 1);
    mr_alloc_cache_reset_peak(c);
    s = stats(c);
    assert_int_equal(s.peak_in_use, 1024 + 512);
    assert_int_equal(s.peak_reserved, 6 * MIB);
    MR_ASSERT_OK(mr_alloc_cache_release_cached(c));
    s = stats(c);
    assert_int_equal(s.reserved, 2 * MIB); /* the 4 MiB segment went back */
    assert_int_equal(s.peak_reserved, 6 * MIB);
    assert_int_equal(s.raw_frees, 1);
    put(c, a);
    put(c, d);
    s = stats(c);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.requested, 0);
    done_cache(c, &f);
}

static void test_release_cached(void **state) {
    (void)state;
    fake f;
    mr_alloc_cache *c = make_cache(&f, 1, 1);
    void *p[6];
    p[0] = get(c, 1000);
    p[1] = get(c, 3 * MIB);
    p[2] = get(c, 20 * MIB);
    p[3] = get(c, 100 * KIB);
    p[4] = get(c, 2 * MIB);
    p[5] = get(c, 600);
    int64_t raw = f.allocs;
    for (int i = 1; i < 6; i++) put(c, p[i]);
    /* p[0] keeps its 2 MiB segment (shared with p[3] and p[5]); the large ones go back even though
     * their events were still pending: release waits for them */
    MR_ASSERT_OK(mr_alloc_cache_release_cached(c));
    assert_int_equal(f.frees, raw - 1);
    assert_int_equal(stats(c).reserved, 2 * MIB);
    assert_true(f.waits >= 3);
    put(c, p[0]);
    MR_ASSERT_OK(mr_alloc_cache_release_cached(c));
    mr_memory_stats s = stats(c);
    assert_int_equal(s.reserved, 0);
    assert_int_equal(s.raw_allocs, s.raw_frees);
    assert_int_equal(f.used, 0);
    done_cache(c, &f);
}

/* A freed block may still be read by queued device work: it is reused only after its event. */
static void test_pending_not_reused(void **state) {
    (void)state;
    fake f;
    mr_alloc_cache *c = make_cache(&f, 1, 1);
    f.auto_done = 0;
    char *a = get(c, 4096);
    put(c, a);
    assert_int_equal(f.records, 1);
    /* a's event has not completed: the rest of the segment serves the request, no wait */
    char *b = get(c, 4096);
    assert_ptr_not_equal(b, a);
    assert_int_equal(f.waits, 0);
    fake_complete_all(&f);
    char *d = get(c, 4096); /* now a is ready and the best fit */
    assert_ptr_equal(d, a);
    /* only a pending block fits: wait for it rather than allocate */
    char *l = get(c, 3 * MIB);
    int64_t raw = f.allocs;
    put(c, l);
    char *l2 = get(c, 3 * MIB);
    assert_ptr_equal(l2, l);
    assert_int_equal(f.waits, 1);
    assert_int_equal(f.allocs, raw);
    /* several pending: none is handed out early while others are still running */
    char *x = get(c, 100 * KIB), *y = get(c, 100 * KIB);
    put(c, x);
    put(c, y);
    char *z = get(c, 100 * KIB);
    assert_ptr_not_equal(z, x);
    assert_ptr_not_equal(z, y);
    /* no pending block fits alone, two neighbours merged do: wait for both, no new segment */
    char *big = get(c, 20 * MIB);
    put(c, big);
    fake_complete_all(&f);
    char *p8 = get(c, 8 * MIB), *p12 = get(c, 12 * MIB);
    assert_ptr_equal(p8, big);
    assert_ptr_equal(p12, big + 8 * MIB);
    put(c, p8);
    put(c, p12);
    raw = f.allocs;
    int64_t waits = f.waits;
    char *p16 = get(c, 16 * MIB);
    assert_ptr_equal(p16, big);
    assert_int_equal(f.allocs, raw);
    assert_int_equal(f.waits, waits + 2);
    put(c, p16);
    put(c, b);
    put(c, d);
    put(c, l2);
    put(c, z);
    done_cache(c, &f); /* waits for the still pending ones */
}

/* MIRROR_CUDA_CACHE=0: every alloc and free reaches the raw allocator with the exact size. */
static void test_pass_through(void **state) {
    (void)state;
    fake f;
    mr_alloc_cache *c = make_cache(&f, 1, 0);
    void *a = get(c, 1000);
    assert_int_equal(f.last_bytes, 1000);
    put(c, a);
    assert_int_equal(f.frees, 1);
    void *z = get(c, 0);
    assert_int_equal(f.last_bytes, 1);
    mr_memory_stats s = stats(c);
    assert_int_equal(s.in_use, 1);
    assert_int_equal(s.peak_in_use, 1000);
    assert_int_equal(s.raw_allocs, 2);
    assert_int_equal(s.cache_hits, 0);
    put(c, z);
    assert_int_equal(f.records, 0);
    assert_int_equal(stats(c).reserved, 0);
    done_cache(c, &f);
}

static void test_bad_free(void **state) {
    (void)state;
    fake f;
    mr_alloc_cache *c = make_cache(&f, 0, 1);
    char *a = get(c, 1000);
    MR_ASSERT_OK(mr_alloc_cache_dealloc(c, NULL));
    assert_int_equal(mr_alloc_cache_dealloc(c, a + 512), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "did not hand out"));
    put(c, a);
    assert_int_equal(mr_alloc_cache_dealloc(c, a), MR_ERR_INVALID); /* twice */
    assert_int_equal(stats(c).in_use, 0);
    void *p = (void *)1;
    assert_int_equal(mr_alloc_cache_alloc(c, SIZE_MAX - 10, &p), MR_ERR_NOMEM);
    assert_null(p);
    done_cache(c, &f);
}

/* ---- two threads ------------------------------------------------------------------------------ */

typedef struct worker {
    mr_alloc_cache *c;
    fake *f;
    uint64_t seed;
    int iters;
    int bad;
} worker;

static void *hammer(void *arg) {
    worker *w = arg;
    static const size_t sizes[] = {1, 512, 1000, 4096, 70000, 1 * MIB, 1 * MIB + 512, 3 * MIB};
    enum { LIVE = 8 };
    struct { unsigned char *p; size_t n; unsigned char tag; } live[LIVE];
    memset(live, 0, sizeof live);
    uint64_t x = w->seed;
    for (int it = 0; it < w->iters; it++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int slot = (int)((x >> 33) % LIVE);
        if (live[slot].p) {
            /* nobody else wrote into our block */
            if (live[slot].p[0] != live[slot].tag || live[slot].p[live[slot].n - 1] != live[slot].tag) w->bad++;
            if (mr_alloc_cache_dealloc(w->c, live[slot].p) != MR_OK) w->bad++;
            live[slot].p = NULL;
        } else {
            size_t n = sizes[(x >> 40) % (sizeof sizes / sizeof *sizes)];
            void *p = NULL;
            if (mr_alloc_cache_alloc(w->c, n, &p) != MR_OK) {
                w->bad++;
                continue;
            }
            live[slot].p = p;
            live[slot].n = n;
            live[slot].tag = (unsigned char)(x >> 56);
            live[slot].p[0] = live[slot].tag;
            live[slot].p[n - 1] = live[slot].tag;
        }
        /* the "device" catches up now and then */
        if (it % 16 == 0) fake_complete_all(w->f);
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i].p && mr_alloc_cache_dealloc(w->c, live[i].p) != MR_OK) w->bad++;
    return NULL;
}

static void test_two_threads(void **state) {
    (void)state;
    fake f;
    mr_alloc_cache *c = make_cache(&f, 1, 1);
    int iters = th_quick() ? 5000 : 40000;
    worker w[2] = {{c, &f, 1, iters, 0}, {c, &f, 2, iters, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, hammer, &w[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_int_equal(w[0].bad + w[1].bad, 0);
    mr_memory_stats s = stats(c);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.requested, 0);
    assert_true(s.cache_hits > s.allocs / 2);
    MR_ASSERT_OK(mr_alloc_cache_release_cached(c));
    assert_int_equal(stats(c).reserved, 0);
    assert_int_equal(f.used, 0);
    done_cache(c, &f);
}

/* ---- the CPU backend -------------------------------------------------------------------------- */

static void test_cpu_backend_memory(void **state) {
    (void)state;
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CPU, &be));
    mr_memory_stats s0, s1;
    MR_ASSERT_OK(mr_device_memory_stats(mr_device_cpu(), &s0));
    void *p = NULL;
    MR_ASSERT_OK(be->alloc(0, 100000, &p));
    MR_ASSERT_OK(mr_device_memory_stats(mr_device_cpu(), &s1));
    assert_int_equal(s1.allocs, s0.allocs + 1);
    assert_true(s1.in_use >= s0.in_use + 100000);
    assert_true(s1.peak_in_use >= s1.in_use);
    be->free(0, p);
    MR_ASSERT_OK(mr_device_memory_stats(mr_device_cpu(), &s1));
    assert_int_equal(s1.in_use, s0.in_use);
    assert_int_equal(s1.raw_frees, s0.raw_frees + 1);
    MR_ASSERT_OK(mr_device_memory_reset_peak(mr_device_cpu()));
    MR_ASSERT_OK(mr_device_memory_stats(mr_device_cpu(), &s1));
    assert_int_equal(s1.peak_in_use, s1.in_use);
    MR_ASSERT_OK(mr_device_memory_release_cached(mr_device_cpu()));
    /* pinned host buffers (plain aligned memory on the CPU) */
    unsigned char *h = NULL;
    MR_ASSERT_OK(be->host_alloc(1000, (void **)&h));
    assert_int_equal((uintptr_t)h % 64, 0);
    memset(h, 1, 1000);
    be->host_free(h);
    MR_ASSERT_OK(be->host_alloc(0, (void **)&h));
    assert_non_null(h);
    be->host_free(h);
    be->host_free(NULL);
    /* a GPU that is not there */
    mr_device g = {MR_DEVICE_CUDA, 0};
    if (mr_cuda_device_count() == 0) {
        assert_int_equal(mr_device_memory_stats(g, &s1), MR_ERR_NOT_FOUND);
        assert_int_equal(s1.allocs, 0);
        assert_true(mr_cuda_unusable_reason()[0] != '\0');
    }
    g.index = 1000;
    assert_int_equal(mr_device_memory_reset_peak(g), MR_ERR_NOT_FOUND);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_after_free),
        cmocka_unit_test(test_steady_loop),
        cmocka_unit_test(test_split_best_fit),
        cmocka_unit_test(test_oom_releases_and_retries),
        cmocka_unit_test(test_stats_exact),
        cmocka_unit_test(test_release_cached),
        cmocka_unit_test(test_pending_not_reused),
        cmocka_unit_test(test_pass_through),
        cmocka_unit_test(test_bad_free),
        cmocka_unit_test(test_two_threads),
        cmocka_unit_test(test_cpu_backend_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
