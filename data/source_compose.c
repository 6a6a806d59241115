/* Sources built from other pipelines: cache (elements kept in memory after their first read) and
 * interleave (tf.data's deterministic cycle/block order over several inputs). Both take inputs made
 * of a source and maps only, so each element is a pure function of its index, and both present
 * themselves as ordinary random-access sources: the index chain, shuffle and the state blobs work
 * on them unchanged, and a restore recomputes the same elements. The maps inside run with epoch 0,
 * which is why they must not depend on the epoch (documented in data.h). */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"

#define CACHE_BLOCK 1024 /* elements per lazily allocated cache block */

/* An input pipeline (source + maps) materialized by index. */
typedef struct inner {
    mr_dataset *ds; /* retained */
    const mr_dataset *src;
    int nmaps;
    const mr_dataset *maps[64]; /* in application order */
    int parallel;               /* the largest map parallelism (AUTO resolved), 0 if no maps */
} inner;

static mr_status inner_init(inner *p, mr_dataset *ds, const char *what) {
    memset(p, 0, sizeof *p);
    if (!ds) return mr_set_error(MR_ERR_INVALID, "%s: input dataset is NULL", what);
    int n = 0;
    for (const mr_dataset *d = ds; d; d = d->in) {
        if (d->kind == DS_SOURCE) { p->src = d; break; }
        if (d->kind == DS_PREFETCH) continue;
        if (d->kind != DS_MAP || n == 64)
            return mr_set_error(MR_ERR_UNSUPPORTED,
                                "%s: the input must be a source followed only by maps; HINT: apply %s before shard, "
                                "shuffle, batch, repeat, take and skip", what, what);
        int par = d->parallel == MR_DATA_AUTO ? omp_get_max_threads() : d->parallel;
        if (par > p->parallel) p->parallel = par;
        n++;
    }
    p->nmaps = n;
    for (const mr_dataset *d = ds; d; d = d->in)
        if (d->kind == DS_MAP) p->maps[--n] = d;
    p->ds = ds;
    atomic_fetch_add(&ds->refs, 1);
    return MR_OK;
}

/* Element idx of the input into out[c] (one element of the input's output spec each). */
static mr_status inner_read(const inner *p, int64_t idx, void *const out[]) {
    if (!p->nmaps) return p->src->src_read(p->src->src_impl, idx, out);
    mr_status st = MR_OK;
    void *a[MR_DATA_MAX_COMPONENTS] = {0}, *b[MR_DATA_MAX_COMPONENTS] = {0};
    const mr_data_spec *sp = &p->src->spec;
    for (int c = 0; c < sp->n; c++) {
        size_t n = mr_data_spec_bytes(sp, c);
        a[c] = malloc(n ? n : 1);
        MR_CHECK(a[c], MR_ERR_NOMEM, "data: out of memory for an element");
    }
    MR_TRY(p->src->src_read(p->src->src_impl, idx, a));
    for (int m = 0; m < p->nmaps; m++) {
        const mr_dataset *d = p->maps[m];
        int last = m == p->nmaps - 1;
        if (!last)
            for (int c = 0; c < d->spec.n; c++) {
                size_t n = mr_data_spec_bytes(&d->spec, c);
                b[c] = malloc(n ? n : 1);
                MR_CHECK(b[c], MR_ERR_NOMEM, "data: out of memory for an element");
            }
        st = d->map_fn(d->map_ctx, (const void *const *)a, last ? out : b, idx, 0);
        if (st != MR_OK) {
            if (mr_last_error()[0] == '\0') mr_set_error(st, "map %d failed on element %lld", m, (long long)idx);
            goto fail;
        }
        for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) {
            free(a[c]);
            a[c] = b[c];
            b[c] = NULL;
        }
    }
fail:
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) {
        free(a[c]);
        free(b[c]);
    }
    return st;
}

/* ---- cache ---------------------------------------------------------------------------------- */

typedef struct cache_impl {
    inner in;
    int64_t n;
    pthread_mutex_t mu;
    unsigned char *filled;                       /* n flags */
    unsigned char **blocks[MR_DATA_MAX_COMPONENTS]; /* ceil(n / CACHE_BLOCK) lazily allocated blocks */
    size_t eb[MR_DATA_MAX_COMPONENTS];
    int ncomp;
} cache_impl;

static void cache_free(void *p) {
    cache_impl *k = p;
    if (!k) return;
    int64_t nb = (k->n + CACHE_BLOCK - 1) / CACHE_BLOCK;
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) {
        if (!k->blocks[c]) continue;
        for (int64_t b = 0; b < nb; b++) free(k->blocks[c][b]);
        free(k->blocks[c]);
    }
    free(k->filled);
    pthread_mutex_destroy(&k->mu);
    mr_data_free(k->in.ds);
    free(k);
}

static mr_status cache_read(void *p, int64_t idx, void *const out[]) {
    cache_impl *k = p;
    int64_t b = idx / CACHE_BLOCK, o = idx % CACHE_BLOCK;
    pthread_mutex_lock(&k->mu);
    int hit = k->filled[idx];
    if (hit)
        for (int c = 0; c < k->ncomp; c++) memcpy(out[c], k->blocks[c][b] + (size_t)o * k->eb[c], k->eb[c]);
    pthread_mutex_unlock(&k->mu);
    if (hit) return MR_OK;
    /* computed outside the lock (several threads may compute the same pure element; harmless) */
    mr_status st = inner_read(&k->in, idx, out);
    if (st != MR_OK) return st;
    pthread_mutex_lock(&k->mu);
    for (int c = 0; c < k->ncomp && st == MR_OK; c++) {
        if (!k->blocks[c][b]) {
            k->blocks[c][b] = malloc(k->eb[c] * CACHE_BLOCK + 1);
            if (!k->blocks[c][b]) st = mr_set_error(MR_ERR_NOMEM, "cache: out of memory for a block of elements");
        }
        if (st == MR_OK) memcpy(k->blocks[c][b] + (size_t)o * k->eb[c], out[c], k->eb[c]);
    }
    if (st == MR_OK) k->filled[idx] = 1;
    pthread_mutex_unlock(&k->mu);
    return st;
}

mr_status mr_data_cache(mr_dataset *in, mr_dataset **out) {
    mr_status st = MR_OK;
    cache_impl *k = NULL;
    if (!out) return mr_set_error(MR_ERR_INVALID, "cache: out is NULL");
    *out = NULL;
    k = calloc(1, sizeof *k);
    if (!k) return mr_set_error(MR_ERR_NOMEM, "cache: out of memory");
    pthread_mutex_init(&k->mu, NULL);
    MR_TRY(inner_init(&k->in, in, "cache"));
    k->n = k->in.src->src_n;
    k->ncomp = in->spec.n;
    k->filled = calloc((size_t)k->n + 1, 1);
    MR_CHECK(k->filled, MR_ERR_NOMEM, "cache: out of memory for %lld flags", (long long)k->n);
    int64_t nb = (k->n + CACHE_BLOCK - 1) / CACHE_BLOCK;
    for (int c = 0; c < k->ncomp; c++) {
        k->eb[c] = mr_data_spec_bytes(&in->spec, c);
        k->blocks[c] = calloc((size_t)nb + 1, sizeof(unsigned char *));
        MR_CHECK(k->blocks[c], MR_ERR_NOMEM, "cache: out of memory");
    }
    int par = k->in.parallel;
    uint64_t h = ds_hash_bytes(in->hash, "cache", 5);
    st = ds_new_source(&in->spec, k->n, cache_read, cache_free, k, "cache", out); /* frees k on error */
    if (st != MR_OK) return st;
    (*out)->hash = h;
    (*out)->parallel = par;
    return MR_OK;
fail:
    cache_free(k);
    return st;
}

/* ---- interleave ----------------------------------------------------------------------------- */

typedef struct run {
    int64_t out0, src, in0, n; /* output elements [out0, out0 + n) are input src's [in0, in0 + n) */
} run;

typedef struct interleave_impl {
    int n;
    inner *in;
    int64_t nruns;
    run *runs;
} interleave_impl;

static void interleave_free(void *p) {
    interleave_impl *v = p;
    if (!v) return;
    for (int i = 0; i < v->n; i++) mr_data_free(v->in[i].ds);
    free(v->in);
    free(v->runs);
    free(v);
}

static mr_status interleave_read(void *p, int64_t idx, void *const out[]) {
    const interleave_impl *v = p;
    int64_t lo = 0, hi = v->nruns - 1;
    while (lo < hi) { /* the last run starting at or before idx */
        int64_t mid = (lo + hi + 1) / 2;
        if (v->runs[mid].out0 <= idx) lo = mid; else hi = mid - 1;
    }
    const run *r = &v->runs[lo];
    return inner_read(&v->in[r->src], r->in0 + (idx - r->out0), out);
}

static int specs_equal(const mr_data_spec *a, const mr_data_spec *b) {
    if (a->n != b->n) return 0;
    for (int c = 0; c < a->n; c++) {
        const mr_data_component *x = &a->comp[c], *y = &b->comp[c];
        if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->shape.ndim != y->shape.ndim) return 0;
        for (int d = 0; d < x->shape.ndim; d++)
            if (x->shape.dim[d] != y->shape.dim[d]) return 0;
    }
    return 1;
}

/* Appends a run, merging it into the previous one when contiguous in the same input. */
static int push_run(interleave_impl *v, int64_t *cap, int64_t out0, int64_t src, int64_t in0, int64_t n) {
    if (v->nruns) {
        run *l = &v->runs[v->nruns - 1];
        if (l->src == src && l->in0 + l->n == in0) { l->n += n; return 1; }
    }
    if (v->nruns == *cap) {
        int64_t c = *cap ? *cap * 2 : 64;
        run *r = realloc(v->runs, sizeof(run) * (size_t)c);
        if (!r) return 0;
        v->runs = r;
        *cap = c;
    }
    v->runs[v->nruns++] = (run){out0, src, in0, n};
    return 1;
}

mr_status mr_data_interleave(mr_dataset *const *sources, int n, int64_t cycle, int64_t block, mr_dataset **out) {
    mr_status st = MR_OK;
    interleave_impl *v = NULL;
    int64_t *slot_src = NULL, *slot_pos = NULL;
    if (!out) return mr_set_error(MR_ERR_INVALID, "interleave: out is NULL");
    *out = NULL;
    MR_CHECK(sources && n >= 1, MR_ERR_INVALID, "interleave: need at least one input, got %d", sources ? n : 0);
    MR_CHECK(cycle >= 1 && cycle <= (1 << 20), MR_ERR_INVALID, "interleave: cycle_length must be in 1..2^20, got %lld",
             (long long)cycle);
    MR_CHECK(block >= 1, MR_ERR_INVALID, "interleave: block_length must be >= 1, got %lld", (long long)block);
    v = calloc(1, sizeof *v);
    MR_CHECK(v, MR_ERR_NOMEM, "interleave: out of memory");
    v->in = calloc((size_t)n, sizeof(inner));
    MR_CHECK(v->in, MR_ERR_NOMEM, "interleave: out of memory");
    int par = 0;
    uint64_t h = ds_hash_bytes(14695981039346656037ull, "interleave", 10);
    h = ds_hash_bytes(ds_hash_bytes(h, &cycle, sizeof cycle), &block, sizeof block);
    for (int i = 0; i < n; i++) {
        MR_TRY(inner_init(&v->in[i], sources[i], "interleave"));
        v->n = i + 1;
        MR_CHECK(specs_equal(&sources[i]->spec, &sources[0]->spec), MR_ERR_INVALID,
                 "interleave: input %d's element spec differs from input 0's (components, dtypes or shapes)", i);
        if (v->in[i].parallel > par) par = v->in[i].parallel;
        h = ds_hash_bytes(h, &sources[i]->hash, sizeof sources[i]->hash);
    }
    /* simulate tf.data's InterleaveDataset on counts only; each visit is O(1) */
    slot_src = malloc(sizeof(int64_t) * (size_t)cycle);
    slot_pos = calloc((size_t)cycle, sizeof(int64_t));
    MR_CHECK(slot_src && slot_pos, MR_ERR_NOMEM, "interleave: out of memory");
    for (int64_t c = 0; c < cycle; c++) slot_src[c] = -1;
    int64_t next = 0, open = 0, ci = 0, bi = 0, total = 0, cap = 0;
    while (next < n || open > 0) {
        if (slot_src[ci] >= 0) {
            int64_t s = slot_src[ci], rem = v->in[s].src->src_n - slot_pos[ci];
            if (rem > 0) {
                int64_t t = block - bi < rem ? block - bi : rem;
                MR_CHECK(push_run(v, &cap, total, s, slot_pos[ci], t), MR_ERR_NOMEM, "interleave: out of memory");
                total += t;
                slot_pos[ci] += t;
                bi += t;
                if (bi == block) { bi = 0; ci = (ci + 1) % cycle; }
            } else { /* end of this input: close it, move on; the slot refills on its next turn */
                slot_src[ci] = -1;
                open--;
                bi = 0;
                ci = (ci + 1) % cycle;
            }
        } else if (next < n) {
            slot_src[ci] = next++;
            slot_pos[ci] = 0;
            open++;
        } else {
            bi = 0;
            ci = (ci + 1) % cycle;
        }
    }
    free(slot_src);
    free(slot_pos);
    slot_src = slot_pos = NULL;
    mr_data_spec spec = sources[0]->spec;
    st = ds_new_source(&spec, total, interleave_read, interleave_free, v, "interleave", out); /* frees v on error */
    if (st != MR_OK) return st;
    (*out)->hash = h;
    (*out)->parallel = par;
    return MR_OK;
fail:
    free(slot_src);
    free(slot_pos);
    interleave_free(v);
    return st;
}
