/* core/trace: the span recorder. Outside the window nothing is recorded; inside, spans come back
 * in the order they ended with their names, arguments and nesting (a child inside its parent);
 * a full buffer keeps the first events and counts the rest as dropped; recording in the window
 * allocates nothing (malloc, calloc and realloc of this binary are wrapped by the linker,
 * CMakeLists.txt, and counted per thread) on several threads at once, while another thread reads
 * published events; pack/unpack round-trips every field and rejects every truncation of a packed
 * trace with MR_ERR_FORMAT; the JSON writer applies each part's clock (constant and interpolated),
 * names processes and threads, writes atomically and names the path it cannot write. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "core/trace.h"

/* ---- allocation counting (-Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc) ------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
static _Thread_local long tl_allocs;
void *__wrap_malloc(size_t n) {
    tl_allocs++;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t m) {
    tl_allocs++;
    return __real_calloc(n, m);
}
void *__wrap_realloc(void *p, size_t n) {
    tl_allocs++;
    return __real_realloc(p, n);
}

static mr_trace *new_trace(int pid, int tracks, int64_t cap, mr_trace_track **k) {
    mr_trace *t = NULL;
    MR_ASSERT_OK(mr_trace_new(pid, "rank 0", "host test", &t));
    static const char *const names[] = {"training", "communication", "data prefetch", "four"};
    for (int i = 0; i < tracks; i++) {
        MR_ASSERT_OK(mr_trace_add_track(t, names[i], i + 1, &k[i]));
        MR_ASSERT_OK(mr_trace_reserve(k[i], cap));
    }
    return t;
}

static void test_outside_window(void **state) {
    (void)state;
    mr_trace_track *k[1];
    mr_trace *t = new_trace(0, 1, 16, k);
    assert_int_equal(mr_trace_begin(NULL), 0);
    assert_int_equal(mr_trace_begin(k[0]), 0);
    assert_false(mr_trace_on(k[0]));
    mr_trace_end(k[0], mr_trace_begin(k[0]), "before");
    mr_trace_instant(k[0], "before", NULL, 0);
    mr_trace_flow(k[0], 1, "before", 1, 0);
    mr_trace_start(t);
    assert_true(mr_trace_on(k[0]));
    const int64_t t0 = mr_trace_begin(k[0]);
    assert_true(t0 > 0);
    mr_trace_stop(t);
    mr_trace_end(k[0], t0, "begun inside"); /* a span that began in the window is kept */
    mr_trace_end(k[0], mr_trace_begin(k[0]), "after");
    mr_trace_instant(k[0], "after", NULL, 0);
    const mr_trace_stats s = mr_trace_stats_of(t, -1);
    assert_int_equal(s.events, 1);
    assert_int_equal(s.dropped, 0);
    assert_int_equal(s.capacity, 16);
    assert_int_equal(s.bytes, 16 * 64);
    mr_trace_event e;
    assert_true(mr_trace_event_get(t, 0, 0, &e));
    assert_string_equal(e.name, "begun inside");
    assert_false(mr_trace_event_get(t, 0, 1, &e));
    assert_false(mr_trace_event_get(t, 1, 0, &e));
    mr_trace_free(t);
    mr_trace_free(NULL);
}

static void test_order_and_nesting(void **state) {
    (void)state;
    mr_trace_track *k[1];
    mr_trace *t = new_trace(3, 1, 64, k);
    mr_trace_start(t);
    const int64_t a = mr_trace_begin(k[0]);
    const int64_t b = mr_trace_begin(k[0]);
    mr_trace_instant(k[0], "mark", "bucket", 7);
    mr_trace_end1(k[0], b, "inner", "bytes", 4096);
    const int64_t c = mr_trace_begin(k[0]);
    mr_trace_flow(k[0], 1, "queued", 42, 0);
    mr_trace_end2(k[0], c, "second", "micro", 1, "seq", 9);
    mr_trace_end(k[0], a, "outer");
    mr_trace_stop(t);
    mr_trace_event e[5];
    for (int i = 0; i < 5; i++) assert_true(mr_trace_event_get(t, 0, i, &e[i]));
    /* recorded as they ended */
    assert_string_equal(e[0].name, "mark");
    assert_int_equal(e[0].ph, 'i');
    assert_string_equal(e[0].k1, "bucket");
    assert_int_equal(e[0].v1, 7);
    assert_string_equal(e[1].name, "inner");
    assert_string_equal(e[1].k1, "bytes");
    assert_int_equal(e[1].v1, 4096);
    assert_null(e[1].k2);
    assert_int_equal(e[2].ph, 's');
    assert_int_equal(e[2].v1, 42);
    assert_string_equal(e[3].name, "second");
    assert_string_equal(e[3].k2, "seq");
    assert_int_equal(e[3].v2, 9);
    assert_string_equal(e[4].name, "outer");
    /* nested in time: the children inside the parent, one after the other */
    const mr_trace_event *outer = &e[4], *inner = &e[1], *second = &e[3];
    assert_true(outer->t0 <= inner->t0 && inner->t1 <= second->t0 && second->t1 <= outer->t1);
    assert_true(inner->t0 <= e[0].t0 && e[0].t0 <= inner->t1);
    assert_true(second->t0 <= e[2].t0 && e[2].t0 <= second->t1);
    assert_int_equal(mr_trace_pid(t), 3);
    assert_string_equal(mr_trace_name(t), "rank 0");
    assert_string_equal(mr_trace_track_name(t, 0), "training");
    assert_null(mr_trace_track_name(t, 1));
    mr_trace_free(t);
}

static void test_overflow(void **state) {
    (void)state;
    mr_trace_track *k[2];
    mr_trace *t = new_trace(0, 2, 10, k);
    MR_ASSERT_OK(mr_trace_reserve(k[1], 0)); /* a track with no room at all */
    mr_trace_start(t);
    for (int i = 0; i < 25; i++) {
        mr_trace_span(k[0], "s", 1000 + i, 1001 + i, "i", i, NULL, 0);
        mr_trace_span(k[1], "s", 1000 + i, 1001 + i, NULL, 0, NULL, 0);
    }
    mr_trace_stop(t);
    mr_trace_stats s0 = mr_trace_stats_of(t, 0), s1 = mr_trace_stats_of(t, 1), all = mr_trace_stats_of(t, -1);
    assert_int_equal(s0.events, 10);
    assert_int_equal(s0.dropped, 15);
    assert_int_equal(s1.events, 0);
    assert_int_equal(s1.dropped, 25);
    assert_int_equal(all.dropped, 40);
    mr_trace_event e;
    for (int i = 0; i < 10; i++) {
        assert_true(mr_trace_event_get(t, 0, i, &e));
        assert_int_equal(e.v1, i); /* the first ones are kept */
    }
    /* a new reservation starts the track over */
    MR_ASSERT_OK(mr_trace_reserve(k[0], 4));
    s0 = mr_trace_stats_of(t, 0);
    assert_int_equal(s0.events, 0);
    assert_int_equal(s0.dropped, 0);
    assert_int_equal(mr_trace_reserve(k[0], -1), MR_ERR_INVALID);
    mr_trace_free(t);
}

static void test_bad_tracks(void **state) {
    (void)state;
    mr_trace *t = NULL;
    mr_trace_track *k = NULL;
    assert_int_equal(mr_trace_new(-1, "x", NULL, &t), MR_ERR_INVALID);
    MR_ASSERT_OK(mr_trace_new(0, "x", NULL, &t));
    MR_ASSERT_OK(mr_trace_add_track(t, "a", 1, &k));
    assert_int_equal(mr_trace_add_track(t, "b", 1, &k), MR_ERR_INVALID); /* the tid is taken */
    assert_int_equal(mr_trace_add_track(t, "b", 0, &k), MR_ERR_INVALID);
    for (int i = 2; i <= MR_TRACE_MAX_TRACKS; i++) MR_ASSERT_OK(mr_trace_add_track(t, "more", i, &k));
    assert_int_equal(mr_trace_add_track(t, "one too many", 99, &k), MR_ERR_INVALID);
    mr_trace_free(t);
}

/* ---- no allocation in the window, several writers, a concurrent reader ---------------------- */

enum { WRITER_SPANS = 20000 };

typedef struct writer {
    mr_trace_track *k;
    long allocs; /* made while recording */
    long self_check; /* a malloc of the thread's own, counted: the wrap works */
} writer;

static void *writer_main(void *arg) {
    writer *w = arg;
    void *volatile p = malloc(16); /* volatile: the pair is not optimised away */
    w->self_check = tl_allocs;
    free(p);
    const long a0 = tl_allocs;
    for (int i = 0; i < WRITER_SPANS; i++) {
        const int64_t t0 = mr_trace_begin(w->k);
        const int64_t t1 = mr_trace_begin(w->k);
        mr_trace_instant(w->k, "mark", "i", i);
        mr_trace_end2(w->k, t1, "inner", "bytes", i, "seq", i);
        mr_trace_flow(w->k, i & 1, "queued", i, 0);
        mr_trace_end(w->k, t0, "outer");
    }
    w->allocs = tl_allocs - a0;
    return NULL;
}

static void test_no_allocation(void **state) {
    (void)state;
    enum { W = 3 };
    mr_trace_track *k[W];
    mr_trace *t = new_trace(0, W, 4L * WRITER_SPANS - 100, k); /* the last events of each are dropped */
    writer w[W];
    pthread_t th[W];
    mr_trace_start(t);
    for (int i = 0; i < W; i++) {
        w[i] = (writer){k[i], -1, 0};
        assert_int_equal(pthread_create(&th[i], NULL, writer_main, &w[i]), 0);
    }
    /* meanwhile: read what is published (the counts only grow; every event read is complete) */
    int64_t last = 0;
    for (int r = 0; r < 20; r++) {
        void *blob = NULL;
        size_t bytes = 0;
        MR_ASSERT_OK(mr_trace_pack(t, &blob, &bytes));
        mr_trace *u = NULL;
        MR_ASSERT_OK(mr_trace_unpack(blob, bytes, &u));
        const int64_t n = mr_trace_stats_of(u, -1).events;
        assert_true(n >= last);
        last = n;
        mr_trace_event e;
        for (int i = 0; i < W; i++)
            for (int64_t j = 0; mr_trace_event_get(u, i, j, &e); j++) assert_non_null(e.name);
        mr_trace_free(u);
        free(blob);
    }
    for (int i = 0; i < W; i++) pthread_join(th[i], NULL);
    mr_trace_stop(t);
    for (int i = 0; i < W; i++) {
        assert_int_equal(w[i].self_check, 1); /* the counter counts this thread's mallocs */
        assert_int_equal(w[i].allocs, 0);
        const mr_trace_stats s = mr_trace_stats_of(t, i);
        assert_int_equal(s.events, 4L * WRITER_SPANS - 100);
        assert_int_equal(s.dropped, 100);
    }
    mr_trace_free(t);
}

/* ---- pack / unpack ---------------------------------------------------------------------------- */

static void test_pack_roundtrip(void **state) {
    (void)state;
    mr_trace_track *k[2];
    mr_trace *t = new_trace(5, 2, 8, k);
    char dyn[32];
    snprintf(dyn, sizeof dyn, "gemm"); /* equal text at another address: still "gemm" after */
    mr_trace_start(t);
    mr_trace_span(k[0], "gemm", 100, 200, "node", 3, NULL, 0);
    mr_trace_span(k[0], dyn, 150, 160, NULL, 0, NULL, 0);
    mr_trace_span(k[1], "allreduce", 120, 400, "bytes", 1 << 20, "seq", 17);
    mr_trace_flow(k[1], 0, "queued", 2, 130);
    for (int i = 0; i < 10; i++) mr_trace_span(k[1], "drop", 1, 2, NULL, 0, NULL, 0);
    mr_trace_stop(t);
    void *blob = NULL;
    size_t bytes = 0;
    MR_ASSERT_OK(mr_trace_pack(t, &blob, &bytes));
    mr_trace *u = NULL;
    MR_ASSERT_OK(mr_trace_unpack(blob, bytes, &u));
    assert_int_equal(mr_trace_pid(u), 5);
    assert_string_equal(mr_trace_name(u), "rank 0");
    assert_int_equal(mr_trace_num_tracks(u), 2);
    assert_string_equal(mr_trace_track_name(u, 1), "communication");
    for (int i = 0; i < 2; i++) {
        const mr_trace_stats a = mr_trace_stats_of(t, i), b = mr_trace_stats_of(u, i);
        assert_int_equal(a.events, b.events);
        assert_int_equal(a.dropped, b.dropped);
        mr_trace_event x, y;
        for (int64_t j = 0; mr_trace_event_get(t, i, j, &x); j++) {
            assert_true(mr_trace_event_get(u, i, j, &y));
            assert_int_equal(x.ph, y.ph);
            assert_string_equal(x.name, y.name);
            assert_true((x.k1 == NULL) == (y.k1 == NULL) && (x.k2 == NULL) == (y.k2 == NULL));
            if (x.k1) assert_string_equal(x.k1, y.k1);
            if (x.k2) assert_string_equal(x.k2, y.k2);
            assert_true(x.t0 == y.t0 && x.t1 == y.t1 && x.v1 == y.v1 && x.v2 == y.v2);
        }
    }
    assert_int_equal(mr_trace_stats_of(u, 1).dropped, 4); /* 2 + 10 events into 8 */
    /* every truncation, and a byte too many, is a format error (ASan: no read past the end) */
    unsigned char *cut = malloc(bytes + 1);
    assert_non_null(cut);
    memcpy(cut, blob, bytes);
    for (size_t n = 0; n < bytes; n++) {
        mr_trace *v = NULL;
        assert_int_equal(mr_trace_unpack(cut, n, &v), MR_ERR_FORMAT);
        assert_null(v);
    }
    cut[bytes] = 0;
    mr_trace *v = NULL;
    assert_int_equal(mr_trace_unpack(cut, bytes + 1, &v), MR_ERR_FORMAT);
    cut[0] = 'X';
    assert_int_equal(mr_trace_unpack(cut, bytes, &v), MR_ERR_FORMAT);
    free(cut);
    mr_trace_free(u);
    free(blob);
    mr_trace_free(t);
}

/* ---- the JSON --------------------------------------------------------------------------------- */

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static void test_write_json(void **state) {
    (void)state;
    mr_trace_track *ka[1], *kb[2];
    mr_trace *a = new_trace(0, 1, 8, ka), *b = new_trace(1, 2, 8, kb);
    mr_trace_start(a);
    mr_trace_start(b);
    mr_trace_span(ka[0], "step", 10000, 20000, "step", 3, NULL, 0);
    mr_trace_flow(ka[0], 1, "queued", 7, 12000);
    mr_trace_span(kb[0], "quo\"te", 11000, 11500, NULL, 0, NULL, 0);
    mr_trace_span(kb[1], "allreduce", 15000, 16000, "bytes", 64, "seq", 2);
    mr_trace_flow(kb[1], 0, "queued", 7, 15000);
    mr_trace_stop(a);
    mr_trace_stop(b);
    /* part b's clock runs 1000 ns ahead at its 10000 and 2000 ns ahead at its 20000 */
    const mr_trace_clock clk[2] = {{0, 0, 0, 0}, {10000, -1000, 20000, -2000}};
    mr_trace *parts[2] = {a, b};
    const char *path = th_tmp_path("trace.json");
    MR_ASSERT_OK(mr_trace_write_json(path, parts, clk, 2, "\"window\": [3, 5]"));
    char *s = slurp(path);
    /* b's t -> t - 1000 - (t - 10000) / 10: its first span 11000 -> 9900, the origin (0.1 us before a's step) */
    assert_non_null(strstr(s, "\"otherData\": {\"origin_ns\": 9900, \"window\": [3, 5]}"));
    assert_non_null(strstr(s, "\"name\":\"step\",\"ts\":0.100,\"dur\":10.000,\"args\":{\"step\":3}"));
    assert_non_null(strstr(s, "\"name\":\"quo\\\"te\",\"ts\":0.000,\"dur\":0.450")); /* 11500 -> 10350 */
    /* 15000 -> 13500, 16000 -> 14400 */
    assert_non_null(strstr(s, "\"name\":\"allreduce\",\"ts\":3.600,\"dur\":0.900,\"args\":{\"bytes\":64,\"seq\":2}"));
    assert_non_null(strstr(s, "\"ph\":\"s\",\"pid\":0,\"tid\":1,\"name\":\"queued\",\"ts\":2.100,\"cat\":\"queued\",\"id\":7}"));
    assert_non_null(strstr(s, "\"ph\":\"f\",\"pid\":1,\"tid\":2,\"name\":\"queued\",\"ts\":3.600,\"cat\":\"queued\","
                              "\"id\":1000000007,\"bp\":\"e\"}"));
    assert_non_null(strstr(s, "{\"ph\":\"M\",\"pid\":1,\"tid\":2,\"name\":\"thread_name\",\"args\":{\"name\":\"communication\"}}"));
    assert_non_null(strstr(s, "\"name\":\"process_labels\",\"args\":{\"labels\":\"host test\"}"));
    assert_null(strstr(s, ",\n]")); /* no comma before the list's end */
    free(s);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_int_not_equal(access(tmp, F_OK), 0); /* renamed away */
    /* an empty trace is still a trace */
    MR_ASSERT_OK(mr_trace_write_json(path, parts, NULL, 0, NULL));
    s = slurp(path);
    assert_non_null(strstr(s, "\"traceEvents\": [\n\n]"));
    free(s);
    /* a directory that is not there: the path in the message */
    assert_int_equal(mr_trace_write_json("/nonexistent/dir/trace.json", parts, clk, 2, NULL), MR_ERR_IO);
    assert_non_null(strstr(mr_last_error(), "/nonexistent/dir/trace.json"));
    mr_trace_free(a);
    mr_trace_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outside_window), cmocka_unit_test(test_order_and_nesting),
        cmocka_unit_test(test_overflow),       cmocka_unit_test(test_bad_tracks),
        cmocka_unit_test(test_no_allocation),  cmocka_unit_test(test_pack_roundtrip),
        cmocka_unit_test(test_write_json),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
