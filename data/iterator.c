/* The iterator: materialization, the prefetch thread and state blobs around the index chain
 * (chain.c: the pipeline on element indices, without map and prefetch). The iterator keeps two copies of the chain: the
 * producer's ("ahead"), which runs up to the queue's depth ahead and says what to materialize, and
 * the consumer's, advanced once per delivered item, which is what save serializes. Both are pure
 * index arithmetic, so the second copy costs nothing worth measuring and makes save exact without
 * stopping the producer.
 *
 * Materialization: source read + maps for every entry of an item, written into a queue slot, with
 * P OpenMP threads (P = the pipeline's map parallelism) over the entries of one batch, or over P
 * unbatched items at once. Slots are filled in sequence order and delivered in sequence order, so
 * thread count and timing change nothing but speed. With prefetch, one background pthread runs the
 * rounds; without it next() runs a round itself when the queue is empty.
 *
 * The queue is a ring of slot pointers (ring[seq % nslots]) over a pool of slots taken from a free
 * stack, so its depth can grow under autotune while batch buffers are allocated only for slots
 * actually used. Statistics and autotune (the policy is documented in data.h) cost a few clock
 * reads per round and per next(); they change P and the depth, never the order.
 *
 * The world-independent state (mr_data_iter_save_global, at the end of this file) serializes only
 * the stages below the shard, after advancing a scratch copy of them over the other replicas'
 * elements, so every replica of a lockstep job writes the same blob and any number restores it. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/chain_impl.h"
#include "core/trace.h"

typedef struct slot {
    item it;
    void *bufs[MR_DATA_MAX_COMPONENTS];
    mr_status status;
    int64_t err_entry;
    int nomem; /* its buffers could not be allocated */
    char msg[512];
} slot;

typedef struct map_step {
    mr_data_map_fn fn;
    void *ctx;
    mr_data_spec out;
} map_step;

struct mr_data_iter {
    mr_dataset *ds;
    const mr_dataset *src;
    chain ahead, cons;
    int64_t batch, item_cap;
    int nmaps;
    map_step *maps;
    int threads;     /* the most threads materializing (scratch is sized for it) */
    int p_cur;       /* P in use now (<= threads); guarded by mu */
    int p_auto, p_floor;
    int64_t prefetch; /* depth in use now (0: none); guarded by mu */
    int64_t depth_max;
    int depth_auto;
    int chunk;       /* items per round */
    /* per thread scratch: level l (0 = source, m = after map m-1), component c */
    void **scratch;  /* threads * (nmaps) * MR_DATA_MAX_COMPONENTS */
    item cons_item;
    /* queue: ring[seq % nslots] points into the pool `slots`; free slots on the stack `freel` */
    int nslots;
    slot *slots;
    slot **ring;
    int *freel;
    int nfree;
    int64_t head, tail;
    /* statistics (produced, produce_s, produce_ts under mu; the rest the consumer's) */
    int64_t produced, delivered;
    double produce_s, produce_ts; /* seconds materializing; the same times P (thread-seconds) */
    double wait_s, t_first, t_ret, win_cons_s;
    int win_n, win_waits;
    int held, eof, stop, thread_on, ended, failed;
    mr_status fail_status;
    char fail_msg[512];
    int64_t position;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mr_trace_track *trace; /* the prefetch thread's spans (mr_data_iter_set_trace); guarded by mu */
};

static double clock_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- materialization ------------------------------------------------------------------------ */

static void **scratch_of(mr_data_iter *it, int t, int level) {
    return it->scratch + ((size_t)t * (size_t)it->nmaps + (size_t)level) * MR_DATA_MAX_COMPONENTS;
}

/* Source read + maps of one entry into dst[c] (one element each), with thread t's scratch. */
static mr_status materialize(mr_data_iter *it, int t, const entry *e, void *const dst[]) {
    void *const *in = it->nmaps ? scratch_of(it, t, 0) : dst;
    mr_status st = it->src->src_read(it->src->src_impl, e->idx, in);
    for (int m = 0; m < it->nmaps && st == MR_OK; m++) {
        void *const *out = m == it->nmaps - 1 ? dst : scratch_of(it, t, m + 1);
        st = it->maps[m].fn(it->maps[m].ctx, (const void *const *)in, out, e->idx, e->epoch);
        if (st != MR_OK && mr_last_error()[0] == '\0') mr_set_error(st, "map %d failed on element %lld", m, (long long)e->idx);
        in = out;
    }
    return st;
}

/* One round: waits for free slots, takes up to `chunk` items from the ahead chain and
 * materializes them into their slots. Returns 0 when stopped. traced: the prefetch thread, whose
 * rounds go on the iterator's trace track. */
static int produce_round(mr_data_iter *it, int traced) {
    pthread_mutex_lock(&it->mu);
    int64_t free_slots;
    for (;;) {
        int64_t limit = (it->prefetch > it->chunk ? it->prefetch : it->chunk) + 1;
        free_slots = limit - (it->tail - it->head);
        if (free_slots > 0 || it->stop) break;
        pthread_cond_wait(&it->cv, &it->mu);
    }
    int stop = it->stop, p = it->p_cur;
    mr_trace_track *trk = traced ? it->trace : NULL;
    int64_t tail = it->tail;
    int k = free_slots < it->chunk ? (int)free_slots : it->chunk, got = 0, eof = 0;
    if (!stop) /* claim k slots from the free stack for sequence numbers tail .. tail+k-1 */
        for (int j = 0; j < k; j++) it->ring[(tail + j) % it->nslots] = &it->slots[it->freel[--it->nfree]];
    pthread_mutex_unlock(&it->mu);
    if (stop) return 0;
    double t0 = clock_s();
    const int64_t s0 = mr_trace_begin(trk);
    int64_t offs[65];
    offs[0] = 0;
    for (; got < k; got++) {
        slot *s = it->ring[(tail + got) % it->nslots];
        if (s->bufs[0] == NULL) { /* first use of this slot: its batch buffers */
            for (int c = 0; c < it->ds->spec.n && !s->nomem; c++) {
                size_t b = mr_data_spec_bytes(&it->ds->spec, c) * (size_t)it->item_cap;
                s->bufs[c] = malloc(b ? b : 1);
                if (!s->bufs[c]) s->nomem = 1;
            }
        }
        if (s->nomem) {
            s->status = MR_ERR_NOMEM;
            s->it.n = 0;
            snprintf(s->msg, sizeof s->msg, "data iterator: out of memory for a batch buffer");
            offs[got + 1] = offs[got];
            got++;
            eof = 1;
            break;
        }
        s->status = MR_OK;
        s->err_entry = INT64_MAX;
        s->msg[0] = '\0';
        int r = ds_chain_next(&it->ahead, it->ahead.n - 1, &s->it);
        if (r == 0) { eof = 1; break; }
        if (r < 0) {
            s->status = MR_ERR_NOMEM;
            s->it.n = 0;
            snprintf(s->msg, sizeof s->msg, "data iterator: out of memory for the shuffle buffer");
            offs[got + 1] = offs[got];
            got++;
            eof = 1;
            break;
        }
        offs[got + 1] = offs[got] + s->it.n;
    }
    int64_t total = offs[got];
#pragma omp parallel for num_threads(p) schedule(static) if (p > 1 && total > 1)
    for (int64_t g = 0; g < total; g++) {
        int j = 0;
        while (offs[j + 1] <= g) j++;
        slot *s = it->ring[(tail + j) % it->nslots];
        int64_t e = g - offs[j];
        void *dst[MR_DATA_MAX_COMPONENTS];
        for (int c = 0; c < it->ds->spec.n; c++) dst[c] = (char *)s->bufs[c] + (size_t)e * mr_data_spec_bytes(&it->ds->spec, c);
        mr_clear_error();
        mr_status st = materialize(it, omp_get_thread_num(), &s->it.e[e], dst);
        if (st != MR_OK) {
#pragma omp critical(mr_data_err)
            if (e < s->err_entry) { /* the first failing entry wins, whatever the timing */
                s->err_entry = e;
                s->status = st;
                snprintf(s->msg, sizeof s->msg, "%s", mr_last_error());
            }
        }
    }
    for (int j = 0; j < got; j++)
        if (it->ring[(tail + j) % it->nslots]->status != MR_OK) eof = 1;
    double dt = clock_s() - t0;
    mr_trace_end1(trk, s0, "produce", "items", got);
    pthread_mutex_lock(&it->mu);
    /* slots claimed but not filled (the data ended) go back to the stack, last claimed first */
    for (int j = k - 1; j >= got; j--) it->freel[it->nfree++] = (int)(it->ring[(tail + j) % it->nslots] - it->slots);
    it->produced += got;
    it->produce_s += dt;
    it->produce_ts += dt * p;
    it->tail += got;
    if (eof) it->eof = 1;
    pthread_cond_broadcast(&it->cv);
    pthread_mutex_unlock(&it->mu);
    return 1;
}

static void *producer_main(void *arg) {
    mr_data_iter *it = arg;
    for (;;) {
        pthread_mutex_lock(&it->mu);
        int done = it->stop || it->eof;
        pthread_mutex_unlock(&it->mu);
        if (done || !produce_round(it, 1)) break;
    }
    return NULL;
}

static void stop_producer(mr_data_iter *it) {
    if (!it->thread_on) return;
    pthread_mutex_lock(&it->mu);
    it->stop = 1;
    pthread_cond_broadcast(&it->cv);
    pthread_mutex_unlock(&it->mu);
    pthread_join(it->thread, NULL);
    it->thread_on = 0;
    it->stop = 0;
}

/* Every slot back on the free stack, slot 0 on top (so a shallow queue touches few slots). */
static void reset_slots(mr_data_iter *it) {
    it->nfree = it->nslots;
    for (int i = 0; i < it->nslots; i++) it->freel[i] = it->nslots - 1 - i;
}

/* Statistics back to zero (the tuned P and depth are kept). */
static void reset_stats(mr_data_iter *it) {
    it->produced = it->delivered = 0;
    it->produce_s = it->produce_ts = it->wait_s = it->t_first = it->t_ret = it->win_cons_s = 0;
    it->win_n = it->win_waits = 0;
}

/* Drops everything queued; both chains must be set by the caller. */
static void reset_queue(mr_data_iter *it) {
    stop_producer(it);
    reset_slots(it);
    reset_stats(it);
    it->head = it->tail = 0;
    it->cons_item.n = 0;
    it->held = it->eof = it->ended = it->failed = 0;
    it->fail_status = MR_OK;
    it->fail_msg[0] = '\0';
}

/* After each delivery: every 8 deliveries, re-choose P and the prefetch depth (policy in data.h). */
static void autotune(mr_data_iter *it, int waited) {
    it->win_n++;
    it->win_waits += waited;
    if (it->win_n < 8) return;
    pthread_mutex_lock(&it->mu);
    if (it->depth_auto && it->prefetch < it->depth_max && it->win_waits >= 2 && it->delivered > it->prefetch) {
        it->prefetch = it->prefetch * 2 < it->depth_max ? it->prefetch * 2 : it->depth_max;
        pthread_cond_broadcast(&it->cv); /* room for the producer */
    }
    if (it->p_auto && it->produced > 0) {
        double cost = it->produce_ts / (double)it->produced, cons = it->win_cons_s / it->win_n;
        double want = cons > 0 ? ceil(1.5 * cost / cons) : (double)it->threads;
        int p = want >= it->threads ? it->threads : (int)want;
        it->p_cur = p < it->p_floor ? it->p_floor : p;
    }
    pthread_mutex_unlock(&it->mu);
    it->win_n = it->win_waits = 0;
    it->win_cons_s = 0;
}

/* ---- public API ----------------------------------------------------------------------------- */

void mr_data_iter_set_trace(mr_data_iter *it, mr_trace_track *k) {
    if (!it) return;
    pthread_mutex_lock(&it->mu);
    it->trace = k;
    pthread_mutex_unlock(&it->mu);
}

void mr_data_iter_free(mr_data_iter *it) {
    if (!it) return;
    stop_producer(it);
    ds_chain_free(&it->ahead);
    ds_chain_free(&it->cons);
    if (it->slots) {
        for (int i = 0; i < it->nslots; i++) {
            free(it->slots[i].it.e);
            for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) free(it->slots[i].bufs[c]);
        }
    }
    free(it->slots);
    free(it->ring);
    free(it->freel);
    if (it->scratch) {
        size_t n = (size_t)it->threads * (size_t)it->nmaps * MR_DATA_MAX_COMPONENTS;
        for (size_t i = 0; i < n; i++) free(it->scratch[i]);
    }
    free(it->scratch);
    free(it->maps);
    free(it->cons_item.e);
    pthread_mutex_destroy(&it->mu);
    pthread_cond_destroy(&it->cv);
    mr_data_free(it->ds);
    free(it);
}

mr_status mr_data_iter_new(mr_dataset *ds, mr_data_iter **out) {
    mr_status st = MR_OK;
    mr_data_iter *it = NULL;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_new: out is NULL");
    *out = NULL;
    if (!ds) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_new: dataset is NULL");
    it = calloc(1, sizeof *it);
    if (!it) return mr_set_error(MR_ERR_NOMEM, "mr_data_iter_new: out of memory");
    pthread_mutex_init(&it->mu, NULL);
    pthread_cond_init(&it->cv, NULL);
    it->ds = ds;
    atomic_fetch_add(&ds->refs, 1);
    it->batch = ds->batch;
    it->item_cap = ds->batch ? ds->batch : 1;
    it->threads = 1;
    it->p_floor = 1;
    /* maps (collected last to first), threads, prefetch depth, the source */
    for (const mr_dataset *d = ds; d; d = d->in) {
        if (d->kind == DS_MAP) {
            it->nmaps++;
            int p = d->parallel == MR_DATA_AUTO ? omp_get_max_threads() : d->parallel;
            if (d->parallel == MR_DATA_AUTO) it->p_auto = 1;
            else if (d->parallel > it->p_floor) it->p_floor = d->parallel;
            if (p > it->threads) it->threads = p;
        }
        if (d->kind == DS_SOURCE && d->parallel > it->threads) it->threads = d->parallel; /* maps inside cache/interleave */
        if (d->kind == DS_SOURCE && d->parallel > it->p_floor) it->p_floor = d->parallel;
        if (d->kind == DS_PREFETCH && d->a > it->prefetch) it->prefetch = d->a;
        if (d->kind == DS_PREFETCH && d->parallel) it->depth_auto = 1;
        if (d->kind == DS_SOURCE) it->src = d;
    }
    if (it->threads > 256) it->threads = 256;
    if (it->p_floor > it->threads) it->p_floor = it->threads;
    it->p_cur = it->threads;
    it->maps = calloc((size_t)(it->nmaps ? it->nmaps : 1), sizeof(map_step));
    MR_CHECK(it->maps, MR_ERR_NOMEM, "mr_data_iter_new: out of memory");
    int m = it->nmaps;
    for (const mr_dataset *d = ds; d; d = d->in)
        if (d->kind == DS_MAP) it->maps[--m] = (map_step){d->map_fn, d->map_ctx, d->spec};
    /* scratch: level 0 holds the source's element, level m the output of map m-1 */
    if (it->nmaps) {
        size_t n = (size_t)it->threads * (size_t)it->nmaps * MR_DATA_MAX_COMPONENTS;
        it->scratch = calloc(n, sizeof(void *));
        MR_CHECK(it->scratch, MR_ERR_NOMEM, "mr_data_iter_new: out of memory");
        for (int t = 0; t < it->threads; t++)
            for (int l = 0; l < it->nmaps; l++) {
                const mr_data_spec *sp = l == 0 ? &it->src->spec : &it->maps[l - 1].out;
                for (int c = 0; c < sp->n; c++) {
                    size_t b = mr_data_spec_bytes(sp, c);
                    scratch_of(it, t, l)[c] = malloc(b ? b : 1);
                    MR_CHECK(scratch_of(it, t, l)[c], MR_ERR_NOMEM, "mr_data_iter_new: out of memory");
                }
            }
    }
    MR_TRY(ds_chain_build(ds, &it->ahead));
    MR_TRY(ds_chain_build(ds, &it->cons));
    it->cons_item.e = malloc(sizeof(entry) * (size_t)it->item_cap);
    MR_CHECK(it->cons_item.e, MR_ERR_NOMEM, "mr_data_iter_new: out of memory");
    it->chunk = it->batch ? 1 : (it->threads < 64 ? it->threads : 64);
    it->depth_max = it->prefetch;
    if (it->depth_auto) { /* up to 16 items, queue buffers under 64 MiB, never below 2 or a fixed depth */
        size_t item_bytes = 0;
        for (int c = 0; c < ds->spec.n; c++) item_bytes += mr_data_spec_bytes(&ds->spec, c) * (size_t)it->item_cap;
        int64_t bound = item_bytes ? (int64_t)(((size_t)64 << 20) / item_bytes) - 1 : 16;
        if (bound > 16) bound = 16;
        if (bound < 2) bound = 2;
        if (bound > it->depth_max) it->depth_max = bound;
    }
    it->nslots = (int)((it->depth_max > it->chunk ? it->depth_max : it->chunk) + 1);
    it->slots = calloc((size_t)it->nslots, sizeof(slot));
    it->ring = calloc((size_t)it->nslots, sizeof(slot *));
    it->freel = calloc((size_t)it->nslots, sizeof(int));
    MR_CHECK(it->slots && it->ring && it->freel, MR_ERR_NOMEM, "mr_data_iter_new: out of memory");
    for (int i = 0; i < it->nslots; i++) {
        slot *s = &it->slots[i];
        s->it.e = malloc(sizeof(entry) * (size_t)it->item_cap);
        MR_CHECK(s->it.e, MR_ERR_NOMEM, "mr_data_iter_new: out of memory");
    }
    reset_slots(it);
    *out = it;
    return MR_OK;
fail:
    mr_data_iter_free(it);
    return st;
}

mr_status mr_data_iter_next(mr_data_iter *it, mr_data_elem *out, int *end) {
    if (!it || !out || !end) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_next: NULL argument");
    *end = 0;
    if (it->failed) return mr_set_error(it->fail_status, "%s", it->fail_msg);
    if (it->ended) { *end = 1; return MR_OK; }
    double t_in = clock_s();
    if (it->t_first == 0) it->t_first = t_in;
    if (it->t_ret > 0) it->win_cons_s += t_in - it->t_ret;
    pthread_mutex_lock(&it->mu);
    if (it->held) {
        it->freel[it->nfree++] = (int)(it->ring[it->head % it->nslots] - it->slots);
        it->head++;
        it->held = 0;
        pthread_cond_broadcast(&it->cv);
    }
    int waited = it->head == it->tail && !it->eof;
    pthread_mutex_unlock(&it->mu);
    if (it->prefetch > 0) {
        if (!it->thread_on) {
            if (pthread_create(&it->thread, NULL, producer_main, it) != 0)
                return mr_set_error(MR_ERR_INTERNAL, "data iterator: cannot start the prefetch thread");
            it->thread_on = 1;
        }
        pthread_mutex_lock(&it->mu);
        while (it->head == it->tail && !it->eof) pthread_cond_wait(&it->cv, &it->mu);
        pthread_mutex_unlock(&it->mu);
    } else if (it->head == it->tail && !it->eof) {
        produce_round(it, 0);
    }
    pthread_mutex_lock(&it->mu);
    int empty = it->head == it->tail;
    pthread_mutex_unlock(&it->mu);
    double t_got = clock_s();
    if (waited) it->wait_s += t_got - t_in;
    if (empty) {
        it->ended = 1;
        *end = 1;
        return MR_OK;
    }
    slot *s = it->ring[it->head % it->nslots];
    if (s->status != MR_OK) {
        it->failed = 1;
        it->fail_status = s->status;
        snprintf(it->fail_msg, sizeof it->fail_msg, "%s", s->msg);
        return mr_set_error(it->fail_status, "%s", it->fail_msg);
    }
    /* advance the consumer's chain in lockstep: it is what save serializes */
    int r = ds_chain_next(&it->cons, it->cons.n - 1, &it->cons_item);
    if (r < 0) {
        it->failed = 1;
        it->fail_status = MR_ERR_NOMEM;
        snprintf(it->fail_msg, sizeof it->fail_msg, "data iterator: out of memory for the shuffle buffer");
        return mr_set_error(it->fail_status, "%s", it->fail_msg);
    }
    MR_ASSERT(r == 1 && it->cons_item.n == s->it.n &&
              memcmp(it->cons_item.e, s->it.e, sizeof(entry) * (size_t)s->it.n) == 0);
    it->held = 1;
    it->position++;
    it->delivered++;
    autotune(it, waited);
    it->t_ret = clock_s();
    const mr_data_spec *sp = &it->ds->spec;
    out->n = sp->n;
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) {
        out->data[c] = c < sp->n ? s->bufs[c] : NULL;
        out->dtype[c] = c < sp->n ? sp->comp[c].dtype : MR_F32;
        memset(&out->shape[c], 0, sizeof(mr_shape));
        if (c >= sp->n) continue;
        const mr_shape *es = &sp->comp[c].shape;
        if (it->batch) {
            out->shape[c].ndim = es->ndim + 1;
            out->shape[c].dim[0] = s->it.n;
            for (int d = 0; d < es->ndim; d++) out->shape[c].dim[d + 1] = es->dim[d];
        } else {
            out->shape[c] = *es;
        }
    }
    return MR_OK;
}

mr_status mr_data_iter_next_into(mr_data_iter *it, void *const bufs[], mr_data_elem *out, int *end) {
    mr_data_elem tmp;
    if (!bufs) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_next_into: bufs is NULL");
    mr_status st = mr_data_iter_next(it, &tmp, end);
    if (st != MR_OK || *end) return st;
    for (int c = 0; c < tmp.n; c++) {
        size_t b = (size_t)mr_shape_numel(&tmp.shape[c]) * mr_dtype_size(tmp.dtype[c]);
        memcpy(bufs[c], tmp.data[c], b);
        tmp.data[c] = bufs[c];
    }
    if (out) *out = tmp;
    return MR_OK;
}

int64_t mr_data_iter_position(const mr_data_iter *it) { return it ? it->position : 0; }

mr_status mr_data_iter_stats(const mr_data_iter *it, mr_data_stats *out) {
    if (!it || !out) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_stats: NULL argument");
    mr_data_iter *w = (mr_data_iter *)it; /* the lock is internal state, not the iterator's value */
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&w->mu);
    out->produced = it->produced;
    out->produce_s = it->produce_s;
    out->map_parallel = it->p_cur;
    out->prefetch = it->prefetch;
    pthread_mutex_unlock(&w->mu);
    out->elements = it->delivered;
    out->producer_rate = out->produce_s > 0 ? (double)out->produced / out->produce_s : 0;
    out->wait_s = it->wait_s;
    out->elapsed_s = it->t_first > 0 ? clock_s() - it->t_first : 0;
    out->map_parallel_auto = it->p_auto;
    out->prefetch_auto = it->depth_auto;
    return MR_OK;
}

mr_status mr_data_iter_save(const mr_data_iter *it, void **blob, size_t *bytes) {
    if (!it || !blob || !bytes) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_save: NULL argument");
    *blob = NULL;
    *bytes = 0;
    if (it->failed) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_save: the iterator failed: %s", it->fail_msg);
    wbuf w = {0};
    ds_put(&w, STATE_MAGIC, 4);
    ds_put(&w, STATE_VERSION, 4);
    ds_put(&w, it->ds->hash, 8);
    ds_put(&w, (uint64_t)it->cons.n, 4);
    ds_put(&w, (uint64_t)it->ended, 4);
    ds_put(&w, (uint64_t)it->position, 8);
    ds_chain_save(&it->cons, &w);
    if (w.oom) {
        free(w.p);
        return mr_set_error(MR_ERR_NOMEM, "mr_data_iter_save: out of memory");
    }
    *blob = w.p;
    *bytes = w.n;
    return MR_OK;
}

mr_status mr_data_iter_restore(mr_data_iter *it, const void *blob, size_t bytes) {
    if (!it || (!blob && bytes)) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_restore: NULL argument");
    reset_queue(it);
    ds_chain_restart(&it->cons);
    ds_chain_restart(&it->ahead);
    it->position = 0;
    rbuf r = {blob, bytes, 0, MR_OK};
    uint32_t magic = (uint32_t)ds_get(&r, 4, "magic");
    if (r.st == MR_OK && magic != STATE_MAGIC)
        r.st = mr_set_error(MR_ERR_FORMAT, "data state blob: offset 0: bad magic 0x%08x (expected 0x%08x \"MRDI\")", magic,
                            STATE_MAGIC);
    uint32_t version = (uint32_t)ds_get(&r, 4, "version");
    if (r.st == MR_OK && version != STATE_VERSION)
        r.st = mr_set_error(MR_ERR_FORMAT, "data state blob: offset 4: version %u, this build reads %u", version,
                            STATE_VERSION);
    uint64_t hash = ds_get(&r, 8, "structure hash");
    if (r.st == MR_OK && hash != it->ds->hash)
        r.st = mr_set_error(MR_ERR_INVALID,
                            "data state blob: offset 8: structure hash %016llx differs from this pipeline's %016llx; "
                            "HINT: the state was saved from another pipeline (transforms, parameters or source)",
                            (unsigned long long)hash, (unsigned long long)it->ds->hash);
    uint32_t nst = (uint32_t)ds_get(&r, 4, "stage count");
    if (r.st == MR_OK && nst != (uint32_t)it->cons.n)
        r.st = mr_set_error(MR_ERR_FORMAT, "data state blob: offset 16: %u stages, the pipeline has %d", nst, it->cons.n);
    uint32_t ended = (uint32_t)ds_get(&r, 4, "end flag");
    int64_t position = (int64_t)ds_get(&r, 8, "position");
    if (r.st == MR_OK && (ended > 1 || position < 0))
        r.st = mr_set_error(MR_ERR_FORMAT, "data state blob: offset 20: bad end flag %u or position %lld", ended,
                            (long long)position);
    size_t body = r.at;
    if (r.st == MR_OK) ds_chain_load(&it->cons, &r);
    if (r.st == MR_OK) {
        rbuf r2 = {blob, bytes, body, MR_OK};
        ds_chain_load(&it->ahead, &r2);
        r.st = r2.st;
    }
    if (r.st == MR_OK && r.at != bytes)
        r.st = mr_set_error(MR_ERR_FORMAT, "data state blob: offset %zu: %zu trailing bytes", r.at, bytes - r.at);
    if (r.st != MR_OK) {
        mr_status st = r.st;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", mr_last_error());
        ds_chain_restart(&it->cons);
        ds_chain_restart(&it->ahead);
        return mr_set_error(st, "%s", msg);
    }
    it->position = position;
    it->ended = (int)ended;
    it->eof = (int)ended;
    return MR_OK;
}

/* ---- world-independent state (data.h, mr_data_iter_save_global) ------------------------------- */

#define GLOBAL_MAGIC 0x4744524Du /* "MRDG" little-endian */
#define GLOBAL_VERSION 1u

/* Splits the pipeline into ORDER (its top node *order, its top chain stage *kg) and the stages above
 * it: the shard (*ks, -1: none; *n, *i) and batches; maps and prefetch are not chain stages. */
static mr_status global_split(const mr_data_iter *it, const mr_dataset **order, int *kg, int *ks, int64_t *n,
                              int64_t *i) {
    int k = it->cons.n - 1;
    const mr_dataset *d = it->ds;
    *ks = -1;
    *n = 1;
    *i = 0;
    for (; d; d = d->in) {
        if (d->kind == DS_MAP || d->kind == DS_PREFETCH) continue;
        if (d->kind == DS_BATCH && *ks < 0) { k--; continue; }
        if (d->kind == DS_SHARD && *ks < 0) {
            *ks = k--;
            *n = d->a;
            *i = d->b;
            continue;
        }
        break;
    }
    for (const mr_dataset *e = d; e; e = e->in)
        if (e->kind == DS_SHARD || e->kind == DS_BATCH)
            return mr_set_error(MR_ERR_UNSUPPORTED, "data iterator: a world-independent state needs the pipeline's one "
                                "shard after every other transform but map, batch and prefetch, and batch after the "
                                "shard; HINT: shard right before the maps and batch");
    *order = d;
    *kg = k;
    return MR_OK;
}

mr_status mr_data_iter_save_global(const mr_data_iter *it, void **blob, size_t *bytes) {
    mr_status st = MR_OK;
    wbuf all = {0}, w = {0};
    chain sc = {0, NULL};
    const mr_dataset *order = NULL;
    int kg = 0, ks = -1;
    int64_t n = 1, i = 0;
    if (!it || !blob || !bytes) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_save_global: NULL argument");
    *blob = NULL;
    *bytes = 0;
    MR_CHECK(!it->failed, MR_ERR_INVALID, "mr_data_iter_save_global: the iterator failed: %s", it->fail_msg);
    MR_TRY(global_split(it, &order, &kg, &ks, &n, &i));
    /* a scratch copy of the consumer's chain, advanced over the other replicas' elements */
    ds_chain_save(&it->cons, &all);
    MR_CHECK(!all.oom, MR_ERR_NOMEM, "mr_data_iter_save_global: out of memory");
    MR_TRY(ds_chain_build(it->ds, &sc));
    rbuf r = {all.p, all.n, 0, MR_OK};
    MR_TRY(ds_chain_load(&sc, &r));
    if (ks >= 0) {
        /* the shard delivered k elements: its last at input position (k-1)n + i; the next global
         * element after the world's k*n is where every replica's state meets */
        const int64_t p = sc.st[ks].pos, k = p > i ? (p - i - 1) / n + 1 : 0;
        item x = {0, sc.st[ks].tmp.e};
        for (int64_t q = p; q < k * n; q++) {
            int got = ds_chain_next(&sc, kg, &x);
            MR_CHECK(got >= 0, MR_ERR_NOMEM, "mr_data_iter_save_global: out of memory for the shuffle buffer");
            if (got == 0) break; /* ORDER ended: its state says so */
        }
    }
    ds_put(&w, GLOBAL_MAGIC, 4);
    ds_put(&w, GLOBAL_VERSION, 4);
    ds_put(&w, order->hash, 8);
    ds_put(&w, (uint64_t)(kg + 1), 4);
    const chain view = {kg + 1, sc.st};
    ds_chain_save(&view, &w);
    MR_CHECK(!w.oom, MR_ERR_NOMEM, "mr_data_iter_save_global: out of memory");
    *blob = w.p;
    *bytes = w.n;
    w.p = NULL;
fail:
    free(all.p);
    free(w.p);
    ds_chain_free(&sc);
    return st;
}

mr_status mr_data_iter_restore_global(mr_data_iter *it, const void *blob, size_t bytes) {
    const mr_dataset *order = NULL;
    int kg = 0, ks = -1;
    int64_t n = 1, i = 0;
    if (!it || (!blob && bytes)) return mr_set_error(MR_ERR_INVALID, "mr_data_iter_restore_global: NULL argument");
    reset_queue(it);
    ds_chain_restart(&it->cons);
    ds_chain_restart(&it->ahead);
    it->position = 0;
    rbuf r = {blob, bytes, 0, MR_OK};
    r.st = global_split(it, &order, &kg, &ks, &n, &i);
    uint32_t magic = (uint32_t)ds_get(&r, 4, "magic");
    if (r.st == MR_OK && magic != GLOBAL_MAGIC)
        r.st = mr_set_error(MR_ERR_FORMAT, "global data state blob: offset 0: bad magic 0x%08x (expected 0x%08x \"MRDG\")",
                            magic, GLOBAL_MAGIC);
    uint32_t version = (uint32_t)ds_get(&r, 4, "version");
    if (r.st == MR_OK && version != GLOBAL_VERSION)
        r.st = mr_set_error(MR_ERR_FORMAT, "global data state blob: offset 4: version %u, this build reads %u", version,
                            GLOBAL_VERSION);
    uint64_t hash = ds_get(&r, 8, "structure hash");
    if (r.st == MR_OK && hash != order->hash)
        r.st = mr_set_error(MR_ERR_INVALID,
                            "global data state blob: offset 8: structure hash %016llx differs from this pipeline's "
                            "%016llx; HINT: the state was saved from another pipeline (data, shuffle or its seed)",
                            (unsigned long long)hash, (unsigned long long)order->hash);
    uint32_t nst = (uint32_t)ds_get(&r, 4, "stage count");
    if (r.st == MR_OK && nst != (uint32_t)(kg + 1))
        r.st = mr_set_error(MR_ERR_FORMAT, "global data state blob: offset 16: %u stages, the pipeline has %d", nst, kg + 1);
    const size_t body = r.at;
    chain cv = {kg + 1, it->cons.st}, av = {kg + 1, it->ahead.st};
    if (r.st == MR_OK) ds_chain_load(&cv, &r);
    if (r.st == MR_OK) {
        rbuf r2 = {blob, bytes, body, MR_OK};
        ds_chain_load(&av, &r2);
        r.st = r2.st;
    }
    if (r.st == MR_OK && r.at != bytes)
        r.st = mr_set_error(MR_ERR_FORMAT, "global data state blob: offset %zu: %zu trailing bytes", r.at, bytes - r.at);
    if (r.st != MR_OK) {
        mr_status st = r.st;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", mr_last_error());
        ds_chain_restart(&it->cons);
        ds_chain_restart(&it->ahead);
        return mr_set_error(st, "%s", msg);
    }
    return MR_OK; /* the shard's counter is 0: the next global element is replica 0's */
}

int64_t mr_data_iter_last_indices(const mr_data_iter *it, int64_t *idx, int64_t *epoch, int64_t cap) {
    if (!it) return 0;
    const int64_t n = it->cons_item.n;
    for (int64_t j = 0; j < n && j < cap; j++) {
        if (idx) idx[j] = it->cons_item.e[j].idx;
        if (epoch) epoch[j] = it->cons_item.e[j].epoch;
    }
    return n;
}
