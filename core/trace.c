/* The span recorder (trace.h): per-track event buffers reserved before the window, published with
 * a release store of the count, so a reader on another thread copies a consistent prefix while
 * the writer goes on; the byte-string form one process sends another (pack/unpack); the Chrome
 * trace JSON writer.
 *
 * Recording is the hot path: a recorded span is one 64-byte store and two atomic stores to memory
 * only this thread writes; there is no lock, allocation or system call, and outside the window
 * the call returns after one relaxed load. Everything else here (pack, unpack, write) runs once a
 * window, outside it. */
#include "core/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One event. ph: 'X' a span [t0, t1]; 'i' an instant at t0; 's'/'f' a flow's start/end at t0
 * with its id in v1. */
typedef struct ev {
    const char *name, *k1, *k2;
    int64_t t0, t1, v1, v2;
    char ph;
} ev;
_Static_assert(sizeof(ev) == 64, "one event is one cache line");

struct mr_trace_track {
    atomic_int on;          /* the window: the only thing read outside it */
    int tid;
    mr_trace *owner;
    char name[64];
    ev *ev;
    int64_t cap;
    atomic_llong n;         /* published events (release by the writer, acquire by readers) */
    atomic_llong dropped;   /* events that found the buffer full (the writer's; read relaxed) */
};

struct mr_trace {
    int pid;
    char name[128], label[256];
    mr_trace_track *tracks[MR_TRACE_MAX_TRACKS];
    int ntracks;
    char *pool; /* unpacked: every string the events point at */
};

int64_t mr_trace_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const int64_t t = (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
    return t ? t : 1; /* 0 means "outside the window" to mr_trace_end */
}

mr_status mr_trace_new(int pid, const char *name, const char *label, mr_trace **out) {
    *out = NULL;
    if (pid < 0 || !name) return mr_set_error(MR_ERR_INVALID, "trace: a recorder needs a pid >= 0 and a name");
    mr_trace *t = calloc(1, sizeof *t);
    if (!t) return mr_set_error(MR_ERR_NOMEM, "trace: out of memory");
    t->pid = pid;
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->label, sizeof t->label, "%s", label ? label : "");
    *out = t;
    return MR_OK;
}

void mr_trace_free(mr_trace *t) {
    if (!t) return;
    for (int i = 0; i < t->ntracks; i++) {
        free(t->tracks[i]->ev);
        free(t->tracks[i]);
    }
    free(t->pool);
    free(t);
}

mr_status mr_trace_add_track(mr_trace *t, const char *name, int tid, mr_trace_track **out) {
    *out = NULL;
    if (t->ntracks == MR_TRACE_MAX_TRACKS)
        return mr_set_error(MR_ERR_INVALID, "trace: more than %d tracks in '%s'", MR_TRACE_MAX_TRACKS, t->name);
    if (tid <= 0) return mr_set_error(MR_ERR_INVALID, "trace: track '%s' needs a tid > 0", name);
    for (int i = 0; i < t->ntracks; i++)
        if (t->tracks[i]->tid == tid)
            return mr_set_error(MR_ERR_INVALID, "trace: tracks '%s' and '%s' of '%s' share tid %d",
                                t->tracks[i]->name, name, t->name, tid);
    mr_trace_track *k = calloc(1, sizeof *k);
    if (!k) return mr_set_error(MR_ERR_NOMEM, "trace: out of memory");
    k->tid = tid;
    k->owner = t;
    snprintf(k->name, sizeof k->name, "%s", name);
    t->tracks[t->ntracks++] = k;
    *out = k;
    return MR_OK;
}

mr_status mr_trace_reserve(mr_trace_track *k, int64_t events) {
    if (events < 0 || (uint64_t)events > SIZE_MAX / sizeof(ev))
        return mr_set_error(MR_ERR_INVALID, "trace: cannot reserve %lld events", (long long)events);
    ev *e = NULL;
    if (events > 0) {
        e = malloc((size_t)events * sizeof *e);
        if (!e)
            return mr_set_error(MR_ERR_NOMEM, "trace: out of memory for %lld events (%.1f MiB) of track '%s'",
                                (long long)events, (double)events * sizeof *e / 1048576.0, k->name);
        memset(e, 0, (size_t)events * sizeof *e); /* touched now: no page faults inside the window */
    }
    free(k->ev);
    k->ev = e;
    k->cap = events;
    atomic_store_explicit(&k->n, 0, memory_order_relaxed);
    atomic_store_explicit(&k->dropped, 0, memory_order_relaxed);
    return MR_OK;
}

static void set_on(mr_trace *t, int on) {
    for (int i = 0; i < t->ntracks; i++) atomic_store_explicit(&t->tracks[i]->on, on, memory_order_release);
}

void mr_trace_start(mr_trace *t) {
    if (t) set_on(t, 1);
}

void mr_trace_stop(mr_trace *t) {
    if (t) set_on(t, 0);
}

int mr_trace_on(const mr_trace_track *k) { return k && atomic_load_explicit(&k->on, memory_order_relaxed); }

int64_t mr_trace_begin(const mr_trace_track *k) {
    if (!k || !atomic_load_explicit(&k->on, memory_order_relaxed)) return 0;
    return mr_trace_now_ns();
}

/* Appends one event, or counts it dropped. Only k's writer calls it. */
static void put(mr_trace_track *k, char ph, const char *name, int64_t t0, int64_t t1, const char *k1, int64_t v1,
                const char *k2, int64_t v2) {
    /* synchronises with the release in mr_trace_start / mr_trace_stop: the buffer reserved before
     * the window is visible to this thread (a plain load on x86-64) */
    (void)atomic_load_explicit(&k->on, memory_order_acquire);
    const int64_t i = atomic_load_explicit(&k->n, memory_order_relaxed);
    if (i >= k->cap) {
        atomic_store_explicit(&k->dropped, atomic_load_explicit(&k->dropped, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        return;
    }
    ev *e = &k->ev[i];
    e->name = name;
    e->k1 = k1;
    e->k2 = k2;
    e->t0 = t0;
    e->t1 = t1;
    e->v1 = v1;
    e->v2 = v2;
    e->ph = ph;
    atomic_store_explicit(&k->n, i + 1, memory_order_release);
}

void mr_trace_span(mr_trace_track *k, const char *name, int64_t t0, int64_t t1, const char *k1, int64_t v1,
                   const char *k2, int64_t v2) {
    if (!k || !t0) return;
    put(k, 'X', name, t0, t1 < t0 ? t0 : t1, k1, v1, k2, v2);
}

void mr_trace_instant(mr_trace_track *k, const char *name, const char *k1, int64_t v1) {
    if (!mr_trace_on(k)) return;
    const int64_t t = mr_trace_now_ns();
    put(k, 'i', name, t, t, k1, v1, NULL, 0);
}

void mr_trace_flow(mr_trace_track *k, int start, const char *name, int64_t id, int64_t ts) {
    if (!mr_trace_on(k)) return;
    if (!ts) ts = mr_trace_now_ns();
    put(k, start ? 's' : 'f', name, ts, ts, NULL, id, NULL, 0);
}

mr_trace_stats mr_trace_stats_of(const mr_trace *t, int track) {
    mr_trace_stats s = {0, 0, 0, 0};
    for (int i = 0; t && i < t->ntracks; i++) {
        if (track >= 0 && i != track) continue;
        const mr_trace_track *k = t->tracks[i];
        s.events += atomic_load_explicit(&k->n, memory_order_acquire);
        s.dropped += atomic_load_explicit(&k->dropped, memory_order_relaxed);
        s.capacity += k->cap;
        s.bytes += (size_t)k->cap * sizeof(ev);
    }
    return s;
}

int mr_trace_num_tracks(const mr_trace *t) { return t ? t->ntracks : 0; }
const char *mr_trace_track_name(const mr_trace *t, int track) {
    return t && track >= 0 && track < t->ntracks ? t->tracks[track]->name : NULL;
}
int mr_trace_pid(const mr_trace *t) { return t ? t->pid : -1; }
const char *mr_trace_name(const mr_trace *t) { return t ? t->name : NULL; }

int mr_trace_event_get(const mr_trace *t, int track, int64_t i, mr_trace_event *out) {
    if (!t || track < 0 || track >= t->ntracks || i < 0) return 0;
    const mr_trace_track *k = t->tracks[track];
    if (i >= atomic_load_explicit(&k->n, memory_order_acquire)) return 0;
    const ev *e = &k->ev[i];
    *out = (mr_trace_event){e->ph, e->name, e->k1, e->k2, e->t0, e->t1, e->v1, e->v2};
    return 1;
}

/* ---- pack / unpack ------------------------------------------------------------------------------ */

/* The packed form (native byte order: the replicas of one job run one build on one architecture):
 *   "MRTRACE1", u32 version, i32 pid, u32 strings, u32 tracks
 *   strings: u32 length + bytes each (the recorder's name and label are strings 0 and 1)
 *   tracks: u32 name, i32 tid, i64 events, i64 dropped, then its events:
 *           u32 name, k1, k2 (NO_STR: none), u32 ph, i64 t0, t1, v1, v2 */
#define PACK_MAGIC "MRTRACE1"
#define PACK_VERSION 1u
#define NO_STR 0xffffffffu

/* Distinct string pointers -> their number, by open addressing on the pointer. */
typedef struct strtab {
    const char **key;
    uint32_t *id;
    size_t cap, n;
    const char **list; /* in number order */
    size_t list_cap;
} strtab;

static void strtab_free(strtab *s) {
    free(s->key);
    free(s->id);
    free(s->list);
}

static size_t ptr_hash(const char *p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static int strtab_grow(strtab *s) {
    const size_t cap = s->cap ? s->cap * 2 : 256;
    const char **key = calloc(cap, sizeof *key);
    uint32_t *id = calloc(cap, sizeof *id);
    if (!key || !id) {
        free(key);
        free(id);
        return 0;
    }
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->key[i]) continue;
        size_t h = ptr_hash(s->key[i], cap);
        while (key[h]) h = (h + 1) & (cap - 1);
        key[h] = s->key[i];
        id[h] = s->id[i];
    }
    free(s->key);
    free(s->id);
    s->key = key;
    s->id = id;
    s->cap = cap;
    return 1;
}

/* The number of string p (added when new); NO_STR for NULL; *ok = 0 when out of memory. */
static uint32_t strtab_get(strtab *s, const char *p, int *ok) {
    if (!p) return NO_STR;
    if ((s->n + 1) * 2 > s->cap && !strtab_grow(s)) {
        *ok = 0;
        return NO_STR;
    }
    size_t h = ptr_hash(p, s->cap);
    while (s->key[h]) {
        if (s->key[h] == p) return s->id[h];
        h = (h + 1) & (s->cap - 1);
    }
    if (s->n == s->list_cap) {
        const size_t c = s->list_cap ? s->list_cap * 2 : 64;
        const char **l = realloc(s->list, c * sizeof *l);
        if (!l) {
            *ok = 0;
            return NO_STR;
        }
        s->list = l;
        s->list_cap = c;
    }
    s->key[h] = p;
    s->id[h] = (uint32_t)s->n;
    s->list[s->n] = p;
    return (uint32_t)s->n++;
}

typedef struct wbuf {
    unsigned char *p;
    size_t n;
} wbuf;

static void put_bytes(wbuf *w, const void *src, size_t n) {
    if (w->p) memcpy(w->p + w->n, src, n);
    w->n += n;
}
static void put_u32(wbuf *w, uint32_t v) { put_bytes(w, &v, sizeof v); }
static void put_i64(wbuf *w, int64_t v) { put_bytes(w, &v, sizeof v); }

/* One pass over t's first counts[i] events of each track; with w->p NULL it only measures. */
static void pack_pass(const mr_trace *t, const int64_t *counts, const strtab *s, const uint32_t *const *ids, wbuf *w) {
    put_bytes(w, PACK_MAGIC, 8);
    put_u32(w, PACK_VERSION);
    put_u32(w, (uint32_t)t->pid);
    put_u32(w, (uint32_t)s->n);
    put_u32(w, (uint32_t)t->ntracks);
    for (size_t i = 0; i < s->n; i++) {
        const uint32_t len = (uint32_t)strlen(s->list[i]);
        put_u32(w, len);
        put_bytes(w, s->list[i], len);
    }
    for (int i = 0; i < t->ntracks; i++) {
        const mr_trace_track *k = t->tracks[i];
        put_u32(w, ids[i][0]);
        put_u32(w, (uint32_t)k->tid);
        put_i64(w, counts[i]);
        put_i64(w, atomic_load_explicit(&k->dropped, memory_order_relaxed));
        for (int64_t j = 0; j < counts[i]; j++) {
            const ev *e = &k->ev[j];
            const uint32_t *x = &ids[i][1 + 3 * j];
            put_u32(w, x[0]);
            put_u32(w, x[1]);
            put_u32(w, x[2]);
            put_u32(w, (uint32_t)e->ph);
            put_i64(w, e->t0);
            put_i64(w, e->t1);
            put_i64(w, e->v1);
            put_i64(w, e->v2);
        }
    }
}

mr_status mr_trace_pack(const mr_trace *t, void **blob, size_t *bytes) {
    mr_status st = MR_OK;
    strtab s;
    int64_t counts[MR_TRACE_MAX_TRACKS];
    uint32_t *ids[MR_TRACE_MAX_TRACKS] = {0};
    int ok = 1;
    memset(&s, 0, sizeof s);
    *blob = NULL;
    *bytes = 0;
    /* the names of the recorder first, so unpack finds them at 0 and 1 */
    strtab_get(&s, t->name, &ok);
    strtab_get(&s, t->label, &ok);
    for (int i = 0; i < t->ntracks && ok; i++) {
        const mr_trace_track *k = t->tracks[i];
        counts[i] = atomic_load_explicit(&k->n, memory_order_acquire); /* one snapshot for both passes */
        ids[i] = malloc(sizeof **ids * (size_t)(1 + 3 * counts[i]));
        MR_CHECK(ids[i], MR_ERR_NOMEM, "trace: out of memory packing %lld events", (long long)counts[i]);
        ids[i][0] = strtab_get(&s, k->name, &ok);
        for (int64_t j = 0; j < counts[i] && ok; j++) {
            ids[i][1 + 3 * j] = strtab_get(&s, k->ev[j].name, &ok);
            ids[i][2 + 3 * j] = strtab_get(&s, k->ev[j].k1, &ok);
            ids[i][3 + 3 * j] = strtab_get(&s, k->ev[j].k2, &ok);
        }
    }
    MR_CHECK(ok, MR_ERR_NOMEM, "trace: out of memory packing the events' names");
    wbuf w = {NULL, 0};
    pack_pass(t, counts, &s, (const uint32_t *const *)ids, &w);
    w.p = malloc(w.n ? w.n : 1);
    MR_CHECK(w.p, MR_ERR_NOMEM, "trace: out of memory packing %zu bytes", w.n);
    w.n = 0;
    pack_pass(t, counts, &s, (const uint32_t *const *)ids, &w);
    *blob = w.p;
    *bytes = w.n;
fail:
    for (int i = 0; i < MR_TRACE_MAX_TRACKS; i++) free(ids[i]);
    strtab_free(&s);
    return st;
}

typedef struct rbuf {
    const unsigned char *p;
    size_t n, at;
    int bad;
} rbuf;

static void get_bytes(rbuf *r, void *dst, size_t n) {
    if (r->bad || n > r->n - r->at) {
        r->bad = 1;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, r->p + r->at, n);
    r->at += n;
}
static uint32_t get_u32(rbuf *r) {
    uint32_t v;
    get_bytes(r, &v, sizeof v);
    return v;
}
static int64_t get_i64(rbuf *r) {
    int64_t v;
    get_bytes(r, &v, sizeof v);
    return v;
}

mr_status mr_trace_unpack(const void *blob, size_t bytes, mr_trace **out) {
    mr_status st = MR_OK;
    mr_trace *t = NULL;
    const char **strs = NULL;
    rbuf r = {blob, bytes, 0, 0};
    *out = NULL;
    char magic[8];
    get_bytes(&r, magic, 8);
    MR_CHECK(!r.bad && !memcmp(magic, PACK_MAGIC, 8), MR_ERR_FORMAT, "trace: a replica's events are not a packed trace");
    const uint32_t version = get_u32(&r);
    MR_CHECK(version == PACK_VERSION, MR_ERR_FORMAT, "trace: packed trace version %u, this build reads %u", version,
             PACK_VERSION);
    const int32_t pid = (int32_t)get_u32(&r);
    const uint32_t nstr = get_u32(&r), ntracks = get_u32(&r);
    MR_CHECK(!r.bad && pid >= 0 && nstr >= 2 && nstr <= bytes / 4 && ntracks <= MR_TRACE_MAX_TRACKS, MR_ERR_FORMAT,
             "trace: a packed trace's header is corrupt (pid %d, %u strings, %u tracks)", pid, nstr, ntracks);
    /* the strings, each NUL-terminated in one pool */
    const size_t str_at = r.at;
    size_t pool_bytes = 0;
    for (uint32_t i = 0; i < nstr && !r.bad; i++) {
        const uint32_t len = get_u32(&r);
        MR_CHECK(!r.bad && len <= r.n - r.at, MR_ERR_FORMAT, "trace: a packed trace is truncated at byte %zu", r.at);
        r.at += len;
        pool_bytes += (size_t)len + 1;
    }
    MR_CHECK(!r.bad, MR_ERR_FORMAT, "trace: a packed trace is truncated at byte %zu", r.at);
    MR_TRY(mr_trace_new(pid, "", "", &t));
    t->pool = malloc(pool_bytes);
    strs = malloc(sizeof *strs * nstr);
    MR_CHECK(t->pool && strs, MR_ERR_NOMEM, "trace: out of memory unpacking %zu bytes of names", pool_bytes);
    r.at = str_at;
    char *q = t->pool;
    for (uint32_t i = 0; i < nstr; i++) {
        const uint32_t len = get_u32(&r);
        get_bytes(&r, q, len);
        q[len] = '\0';
        strs[i] = q;
        q += len + 1;
    }
    snprintf(t->name, sizeof t->name, "%s", strs[0]);
    snprintf(t->label, sizeof t->label, "%s", strs[1]);
    for (uint32_t i = 0; i < ntracks; i++) {
        const uint32_t name = get_u32(&r);
        const int32_t tid = (int32_t)get_u32(&r);
        const int64_t n = get_i64(&r), dropped = get_i64(&r);
        MR_CHECK(!r.bad && name < nstr && n >= 0 && (uint64_t)n <= (r.n - r.at) / 48 && dropped >= 0, MR_ERR_FORMAT,
                 "trace: a packed trace's track %u is corrupt at byte %zu", i, r.at);
        mr_trace_track *k = NULL;
        MR_TRY(mr_trace_add_track(t, strs[name], tid, &k));
        MR_TRY(mr_trace_reserve(k, n));
        for (int64_t j = 0; j < n; j++) {
            const uint32_t nm = get_u32(&r), k1 = get_u32(&r), k2 = get_u32(&r), ph = get_u32(&r);
            ev *e = &k->ev[j];
            e->t0 = get_i64(&r);
            e->t1 = get_i64(&r);
            e->v1 = get_i64(&r);
            e->v2 = get_i64(&r);
            MR_CHECK(!r.bad && nm < nstr && (k1 < nstr || k1 == NO_STR) && (k2 < nstr || k2 == NO_STR) &&
                         (ph == 'X' || ph == 'i' || ph == 's' || ph == 'f'),
                     MR_ERR_FORMAT, "trace: a packed trace's event %lld of track '%s' is corrupt", (long long)j, k->name);
            e->name = strs[nm];
            e->k1 = k1 == NO_STR ? NULL : strs[k1];
            e->k2 = k2 == NO_STR ? NULL : strs[k2];
            e->ph = (char)ph;
        }
        atomic_store_explicit(&k->n, n, memory_order_release);
        atomic_store_explicit(&k->dropped, dropped, memory_order_relaxed);
    }
    MR_CHECK(r.at == r.n, MR_ERR_FORMAT, "trace: %zu bytes after the end of a packed trace", r.n - r.at);
    free(strs);
    *out = t;
    return MR_OK;
fail:
    free(strs);
    mr_trace_free(t);
    return st;
}

/* ---- the Chrome trace JSON ------------------------------------------------------------------------ */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* t on the trace's clock (c: NULL, no shift). Monotone in t for any drift slower than the clock. */
static int64_t aligned(const mr_trace_clock *c, int64_t t) {
    if (!c) return t;
    if (c->at1 == c->at0) return t + c->shift0;
    const double slope = (double)(c->shift1 - c->shift0) / (double)(c->at1 - c->at0);
    return t + c->shift0 + (int64_t)llround(slope * (double)(t - c->at0));
}

/* Microseconds with three decimals, exactly (ns >= 0). */
static void json_us(FILE *f, int64_t ns) { fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000)); }

static void json_args(FILE *f, const ev *e) {
    if (!e->k1 && !e->k2) return;
    fputs(",\"args\":{", f);
    if (e->k1) {
        json_str(f, e->k1);
        fprintf(f, ":%lld", (long long)e->v1);
    }
    if (e->k2) {
        if (e->k1) fputc(',', f);
        json_str(f, e->k2);
        fprintf(f, ":%lld", (long long)e->v2);
    }
    fputc('}', f);
}

/* Starts the next element of traceEvents (the separator before every one but the first). */
static void json_next(FILE *f, int64_t *written) { fputs((*written)++ ? ",\n{" : "{", f); }

static void json_meta(FILE *f, int64_t *written, int pid, int tid, const char *what, const char *key, const char *sval,
                      int64_t ival) {
    json_next(f, written);
    fprintf(f, "\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{\"%s\":", pid, tid, what, key);
    if (sval) json_str(f, sval);
    else fprintf(f, "%lld", (long long)ival);
    fputs("}}", f);
}

static void json_events(FILE *f, int64_t *written, const mr_trace *t, int i, int64_t count, const mr_trace_clock *c,
                        int64_t origin) {
    const mr_trace_track *k = t->tracks[i];
    for (int64_t j = 0; j < count; j++) {
        const ev *e = &k->ev[j];
        const int64_t ts = aligned(c, e->t0) - origin;
        json_next(f, written);
        fprintf(f, "\"ph\":\"%c\",\"pid\":%d,\"tid\":%d,\"name\":", e->ph, t->pid, k->tid);
        json_str(f, e->name);
        fputs(",\"ts\":", f);
        json_us(f, ts);
        if (e->ph == 'X') {
            fputs(",\"dur\":", f);
            json_us(f, aligned(c, e->t1) - aligned(c, e->t0));
            json_args(f, e);
        } else if (e->ph == 'i') {
            fputs(",\"s\":\"t\"", f);
            json_args(f, e);
        } else { /* a flow: the id unique across parts; the end binds to the span enclosing it */
            fputs(",\"cat\":", f);
            json_str(f, e->name);
            fprintf(f, ",\"id\":%lld%s", (long long)((int64_t)t->pid * 1000000000 + e->v1),
                    e->ph == 'f' ? ",\"bp\":\"e\"" : "");
        }
        fputc('}', f);
    }
}

mr_status mr_trace_write_json(const char *path, mr_trace *const *parts, const mr_trace_clock *clocks, int n,
                              const char *meta) {
    mr_status st = MR_OK;
    char tmp[4200] = "";
    FILE *f = NULL;
    int64_t *counts = NULL;
    MR_CHECK(path && parts && n >= 0, MR_ERR_INVALID, "trace: nothing to write");
    counts = calloc((size_t)(n > 0 ? n : 1) * MR_TRACE_MAX_TRACKS, sizeof *counts);
    MR_CHECK(counts, MR_ERR_NOMEM, "trace: out of memory");
    /* one snapshot of every track (writers may go on), and the earliest moment, the origin */
    int64_t origin = INT64_MAX;
    for (int p = 0; p < n; p++) {
        const mr_trace *t = parts[p];
        for (int i = 0; i < t->ntracks; i++) {
            const mr_trace_track *k = t->tracks[i];
            const int64_t c = counts[p * MR_TRACE_MAX_TRACKS + i] = atomic_load_explicit(&k->n, memory_order_acquire);
            for (int64_t j = 0; j < c; j++) {
                const int64_t a = aligned(clocks ? &clocks[p] : NULL, k->ev[j].t0);
                if (a < origin) origin = a;
            }
        }
    }
    if (origin == INT64_MAX) origin = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    f = fopen(tmp, "w");
    MR_CHECK(f, MR_ERR_IO, "trace: cannot write '%s': %s", tmp, strerror(errno));
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    fputs("{\"traceEvents\": [\n", f);
    int64_t written = 0;
    for (int p = 0; p < n; p++) {
        const mr_trace *t = parts[p];
        json_meta(f, &written, t->pid, 0, "process_name", "name", t->name, 0);
        json_meta(f, &written, t->pid, 0, "process_sort_index", "sort_index", NULL, t->pid);
        if (t->label[0]) json_meta(f, &written, t->pid, 0, "process_labels", "labels", t->label, 0);
        for (int i = 0; i < t->ntracks; i++) {
            const mr_trace_track *k = t->tracks[i];
            json_meta(f, &written, t->pid, k->tid, "thread_name", "name", k->name, 0);
            json_meta(f, &written, t->pid, k->tid, "thread_sort_index", "sort_index", NULL, k->tid);
        }
        for (int i = 0; i < t->ntracks; i++)
            json_events(f, &written, t, i, counts[p * MR_TRACE_MAX_TRACKS + i], clocks ? &clocks[p] : NULL, origin);
    }
    fputs("\n],\n", f);
    fprintf(f, "\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"origin_ns\": %lld%s%s}\n}\n", (long long)origin,
            meta && *meta ? ", " : "", meta ? meta : "");
    int bad = ferror(f) != 0;
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    f = NULL;
    MR_CHECK(!bad, MR_ERR_IO, "trace: cannot write '%s': %s", tmp, strerror(errno));
    MR_CHECK(rename(tmp, path) == 0, MR_ERR_IO, "trace: cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    /* the rename itself on disk (as checkpoint/ckpt_file.c does) */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    int fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(counts);
    return MR_OK;
fail:
    if (f) fclose(f);
    if (tmp[0]) remove(tmp);
    free(counts);
    return st;
}
