/* The index chain: the pipeline with map and prefetch left out (a map is a pure 1:1 function, so
 * where it sits does not change which source indices come out in which order), run on element
 * indices only: source = a counter, shard/take/skip/repeat = counters, shuffle = tf.data's buffer
 * algorithm over indices with Philox draws at (seed ^ iteration, draw counter), batch = groups of
 * entries. Its whole state is a few counters per stage plus the shuffle buffers' indices, which
 * ds_chain_save/ds_chain_load turn into the records of a state blob. */
#include <stdlib.h>
#include <string.h>

#include "core/math/philox_math.h"
#include "data/chain_impl.h"

static void stage_reset_state(stage *s) {
    s->pos = s->epoch = s->draws = s->fill = 0;
    s->exhausted = s->started = s->got = 0;
}

static void ds_chain_reset(chain *c, int k) {
    stage *s = &c->st[k];
    switch (s->kind) {
    case DS_SOURCE: s->pos = 0; s->epoch++; return;
    case DS_SHUFFLE:
        s->fill = s->draws = 0;
        s->exhausted = s->started = 0;
        if (s->b) s->epoch++;
        break;
    default: s->pos = 0; s->got = 0; break;
    }
    ds_chain_reset(c, k - 1);
}

static int shuffle_reserve(stage *s, int64_t n) {
    if (n <= s->buf_cap) return 1;
    int64_t cap = s->buf_cap ? s->buf_cap * 2 : 64;
    if (cap < n) cap = n;
    if (cap > s->a) cap = s->a;
    entry *b = realloc(s->buf, sizeof(entry) * (size_t)(cap * s->cap_in));
    if (!b) return 0;
    s->buf = b;
    int64_t *bn = realloc(s->buf_n, sizeof(int64_t) * (size_t)cap);
    if (!bn) return 0;
    s->buf_n = bn;
    s->buf_cap = cap;
    return 1;
}

static void shuffle_put(stage *s, int64_t j, const item *x) {
    s->buf_n[j] = x->n;
    memcpy(s->buf + j * s->cap_in, x->e, sizeof(entry) * (size_t)x->n);
}

int ds_chain_next(chain *c, int k, item *out) {
    stage *s = &c->st[k];
    switch (s->kind) {
    case DS_SOURCE:
        if (s->pos >= s->src_n) return 0;
        out->n = 1;
        out->e[0].idx = s->pos++;
        out->e[0].epoch = s->epoch;
        return 1;
    case DS_SHARD:
        for (;;) {
            int r = ds_chain_next(c, k - 1, out);
            if (r <= 0) return r;
            if (s->pos++ % s->a == s->b) return 1;
        }
    case DS_SHUFFLE: {
        if (!s->started) {
            while (s->fill < s->a && !s->exhausted) {
                int r = ds_chain_next(c, k - 1, &s->tmp);
                if (r < 0) return r;
                if (r == 0) { s->exhausted = 1; break; }
                if (!shuffle_reserve(s, s->fill + 1)) return -1;
                shuffle_put(s, s->fill++, &s->tmp);
            }
            s->started = 1;
        }
        if (s->fill == 0) return 0;
        uint64_t key = s->seed ^ ((uint64_t)s->epoch * 0x9E3779B97F4A7C15ull);
        uint64_t u = ((uint64_t)mr_philox_u32(key, 0, (uint64_t)(2 * s->draws)) << 32) |
                     mr_philox_u32(key, 0, (uint64_t)(2 * s->draws + 1));
        s->draws++;
        int64_t j = (int64_t)(u % (uint64_t)s->fill);
        out->n = s->buf_n[j];
        memcpy(out->e, s->buf + j * s->cap_in, sizeof(entry) * (size_t)out->n);
        if (!s->exhausted) {
            int r = ds_chain_next(c, k - 1, &s->tmp);
            if (r < 0) return r;
            if (r == 1) { shuffle_put(s, j, &s->tmp); return 1; }
            s->exhausted = 1;
        }
        s->fill--;
        if (j != s->fill) {
            s->buf_n[j] = s->buf_n[s->fill];
            memcpy(s->buf + j * s->cap_in, s->buf + s->fill * s->cap_in, sizeof(entry) * (size_t)s->buf_n[j]);
        }
        return 1;
    }
    case DS_BATCH: {
        int64_t n = 0;
        while (n < s->a) {
            item one = {0, out->e + n};
            int r = ds_chain_next(c, k - 1, &one);
            if (r < 0) return r;
            if (r == 0) break;
            n++;
        }
        if (n == 0 || (n < s->a && s->b)) return 0;
        out->n = n;
        return 1;
    }
    case DS_REPEAT:
        if (s->a == 0) return 0;
        for (;;) {
            int r = ds_chain_next(c, k - 1, out);
            if (r != 0) { if (r > 0) s->got = 1; return r; }
            if (s->a >= 0 && s->pos + 1 >= s->a) { s->pos = s->a; return 0; }
            if (!s->got) return 0; /* an empty pass: repeating would loop forever */
            s->pos++;
            s->got = 0;
            ds_chain_reset(c, k - 1);
        }
    case DS_TAKE: {
        if (s->pos >= s->a) return 0;
        int r = ds_chain_next(c, k - 1, out);
        if (r > 0) s->pos++;
        return r;
    }
    case DS_SKIP:
        while (s->pos < s->a) {
            int r = ds_chain_next(c, k - 1, out);
            if (r <= 0) return r;
            s->pos++;
        }
        return ds_chain_next(c, k - 1, out);
    default: return 0;
    }
}

void ds_chain_free(chain *c) {
    for (int k = 0; k < c->n; k++) {
        free(c->st[k].buf);
        free(c->st[k].buf_n);
        free(c->st[k].tmp.e);
    }
    free(c->st);
    c->st = NULL;
    c->n = 0;
}

void ds_chain_restart(chain *c) {
    for (int k = 0; k < c->n; k++) stage_reset_state(&c->st[k]);
}

mr_status ds_chain_build(const mr_dataset *ds, chain *c) {
    int n = 0;
    for (const mr_dataset *d = ds; d; d = d->in)
        if (d->kind != DS_MAP && d->kind != DS_PREFETCH) n++;
    c->st = calloc((size_t)n, sizeof(stage));
    if (!c->st) return mr_set_error(MR_ERR_NOMEM, "data iterator: out of memory");
    c->n = n;
    int k = n;
    int64_t src_n = 0;
    for (const mr_dataset *d = ds; d; d = d->in) {
        if (d->kind == DS_MAP || d->kind == DS_PREFETCH) continue;
        stage *s = &c->st[--k];
        s->kind = d->kind;
        s->a = d->a;
        s->b = d->b;
        s->seed = d->seed;
        s->cap_in = (d->in && d->in->batch) ? d->in->batch : 1;
        if (d->kind == DS_SOURCE) src_n = d->src_n;
        s->tmp.e = malloc(sizeof(entry) * (size_t)s->cap_in);
        if (!s->tmp.e) { ds_chain_free(c); return mr_set_error(MR_ERR_NOMEM, "data iterator: out of memory"); }
    }
    for (k = 0; k < n; k++) c->st[k].src_n = src_n;
    return MR_OK;
}

/* ---- state blobs ---------------------------------------------------------------------------- */

void ds_put(wbuf *w, uint64_t v, int bytes) {
    if (w->n + (size_t)bytes > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        while (cap < w->n + (size_t)bytes) cap *= 2;
        unsigned char *p = w->oom ? NULL : realloc(w->p, cap);
        if (!p) { w->oom = 1; return; }
        w->p = p;
        w->cap = cap;
    }
    for (int i = 0; i < bytes; i++) w->p[w->n++] = (unsigned char)(v >> (8 * i));
}

uint64_t ds_get(rbuf *r, int bytes, const char *field) {
    if (r->st != MR_OK) return 0;
    if (r->at + (size_t)bytes > r->n) {
        r->st = mr_set_error(MR_ERR_FORMAT, "data state blob: offset %zu: truncated reading %s (%zu bytes)", r->at, field,
                             r->n);
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->at + (size_t)i] << (8 * i);
    r->at += (size_t)bytes;
    return v;
}

/* Reads an int64 field that must lie in [lo, hi]. */
static int64_t get_range(rbuf *r, const char *field, int k, int64_t lo, int64_t hi) {
    size_t at = r->at;
    int64_t v = (int64_t)ds_get(r, 8, field);
    if (r->st == MR_OK && (v < lo || v > hi))
        r->st = mr_set_error(MR_ERR_FORMAT, "data state blob: offset %zu: stage %d: %s = %lld out of range [%lld, %lld]",
                             at, k, field, (long long)v, (long long)lo, (long long)hi);
    return v;
}

void ds_chain_save(const chain *c, wbuf *w) {
    for (int k = 0; k < c->n; k++) {
        const stage *s = &c->st[k];
        ds_put(w, (uint64_t)s->kind, 4);
        ds_put(w, (uint64_t)(s->exhausted | (s->started << 1) | (s->got << 2)), 4);
        ds_put(w, (uint64_t)s->pos, 8);
        ds_put(w, (uint64_t)s->epoch, 8);
        ds_put(w, (uint64_t)s->draws, 8);
        ds_put(w, (uint64_t)s->fill, 8);
        for (int64_t j = 0; j < s->fill; j++) {
            ds_put(w, (uint64_t)s->buf_n[j], 8);
            for (int64_t e = 0; e < s->buf_n[j]; e++) {
                ds_put(w, (uint64_t)s->buf[j * s->cap_in + e].idx, 8);
                ds_put(w, (uint64_t)s->buf[j * s->cap_in + e].epoch, 8);
            }
        }
    }
}

mr_status ds_chain_load(chain *c, rbuf *r) {
    const int64_t big = INT64_MAX / 4;
    for (int k = 0; k < c->n && r->st == MR_OK; k++) {
        stage *s = &c->st[k];
        size_t at = r->at;
        uint32_t kind = (uint32_t)ds_get(r, 4, "stage kind");
        if (r->st == MR_OK && kind != (uint32_t)s->kind)
            return r->st = mr_set_error(MR_ERR_FORMAT, "data state blob: offset %zu: stage %d has kind %u, pipeline has %d",
                                        at, k, kind, (int)s->kind);
        uint32_t flags = (uint32_t)ds_get(r, 4, "stage flags");
        s->exhausted = flags & 1;
        s->started = (flags >> 1) & 1;
        s->got = (flags >> 2) & 1;
        int64_t pos_hi = s->kind == DS_SOURCE ? s->src_n : (s->kind == DS_TAKE || s->kind == DS_SKIP) ? s->a
                       : (s->kind == DS_REPEAT && s->a >= 0) ? s->a : big;
        s->pos = get_range(r, "position", k, 0, pos_hi);
        s->epoch = get_range(r, "epoch", k, 0, big);
        s->draws = get_range(r, "draws", k, 0, big);
        s->fill = get_range(r, "buffer fill", k, 0, s->kind == DS_SHUFFLE ? s->a : 0);
        if (r->st != MR_OK) return r->st;
        if (s->fill && !shuffle_reserve(s, s->fill))
            return r->st = mr_set_error(MR_ERR_NOMEM, "data state blob: out of memory for the shuffle buffer");
        for (int64_t j = 0; j < s->fill && r->st == MR_OK; j++) {
            s->buf_n[j] = get_range(r, "buffered item size", k, 1, s->cap_in);
            for (int64_t e = 0; e < s->buf_n[j] && r->st == MR_OK; e++) {
                s->buf[j * s->cap_in + e].idx = get_range(r, "buffered index", k, 0, s->src_n - 1);
                s->buf[j * s->cap_in + e].epoch = get_range(r, "buffered epoch", k, 0, big);
            }
        }
    }
    return r->st;
}

