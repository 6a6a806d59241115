/* A caching device allocator (PyTorch's CUDACachingAllocator lesson: steady-state steps must not
 * allocate), in plain C over a raw allocator given as function pointers (core/alloc_cache_impl.h).
 * The CUDA backend puts it in front of cudaMalloc/cudaFree, one cache per device; the unit tests
 * drive it with a fake raw allocator.
 *
 * Sizes. Every request is rounded up to 512 bytes (cudaMalloc's own alignment is 256; 512 keeps
 * blocks of slightly different sizes interchangeable). Blocks of at most 1 MiB are "small" and
 * are carved out of 2 MiB segments; larger ones get a segment of their size rounded up to 2 MiB.
 * The two kinds live in separate pools, so that a pile of small temporaries never fragments the
 * segments that large activations need. A cached block bigger than the request is split when the
 * rest is still useful: >= 512 bytes in the small pool, > 1 MiB in the large pool (a large
 * segment's rest under 1 MiB stays with the block and counts as in use: at most 1 MiB of waste,
 * and no sliver that no large request could use). Free neighbours within a segment merge again,
 * so after a step everything returns to whole segments. Best fit: free blocks of a pool are kept
 * sorted by (size, address) and a request takes the smallest that fits, the lowest address first.
 *
 * Stream safety (with the event hooks, i.e. on CUDA). Frees come from the host while kernels that
 * read or write the block may still be queued. Our CUDA streams are created blocking with respect
 * to the legacy default stream, so an event recorded on the legacy default stream at free time
 * completes only after all work issued earlier on every blocking stream of the device. A freed
 * block is therefore "pending" until its event has completed (checked with the event_query hook,
 * cudaEventQuery, at each alloc), and only then joins the free pools. When no ready block fits
 * but a pending one would, the cache waits for that one (event_wait, cudaEventSynchronize) instead
 * of allocating more memory; when none fits alone, it waits for all pending blocks of the pool
 * (merged with their neighbours they may fit) before asking the driver. Events are pooled: a steady state creates none. The price: the record
 * on the legacy stream orders later work on other blocking streams after earlier work, i.e. a free
 * is a device-wide join point; per-step frees are rare because the graph executor plans one arena.
 *
 * Out of memory: when the raw allocator reports MR_ERR_NOMEM, the cache waits for every pending
 * block, returns every entirely free segment and retries once; if that fails too, the error names
 * the request and the in-use, cached and peak bytes, with a HINT.
 *
 * Thread safety: one mutex per cache guards everything, including the raw calls and event waits
 * (like PyTorch's allocator; cudaMalloc and cudaEventSynchronize are slow anyway and rare in a
 * steady state). */
#include "core/alloc_cache_impl.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { POOL_SMALL = 0, POOL_LARGE = 1, POOL_COUNT = 2 };
enum { B_LIVE = 0, B_FREE = 1, B_PENDING = 2 };

/* One block: a piece of a segment. Blocks of a segment are linked in address order (prev/next);
 * the first one (prev == NULL) starts at the pointer the raw allocator returned. */
typedef struct block {
    char *ptr;
    size_t size;      /* rounded; the whole block */
    size_t requested; /* B_LIVE: bytes the caller asked for */
    int state, pool;
    struct block *prev, *next; /* neighbours in the segment */
    struct block *hnext;       /* B_LIVE: hash chain */
    struct block *pprev, *pnext; /* B_PENDING: the pending list, oldest first */
    void *event;               /* B_PENDING: recorded at free time */
} block;

/* Free blocks of one pool, sorted by (size, ptr). */
typedef struct pool {
    block **v;
    int64_t n, cap;
    int64_t nblocks; /* records of this pool in any state (<= cap) */
} pool;

struct mr_alloc_cache {
    pthread_mutex_t mu;
    mr_alloc_raw raw;
    int caching, events;
    char name[32];
    pool pools[POOL_COUNT];
    block **buckets; /* live blocks by pointer */
    size_t nbuckets;
    int64_t nlive;
    block *pend_head, *pend_tail;
    void **evpool; /* recorded-and-completed or never-used events */
    int64_t nev, evcap;
    mr_memory_stats s;
};

/* ---- helpers --------------------------------------------------------------------------------- */

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static int block_less(const block *a, size_t size, const char *ptr) {
    return a->size < size || (a->size == size && a->ptr < ptr);
}

/* First index in p whose block is not less than (size, ptr). */
static int64_t pool_lower(const pool *p, size_t size, const char *ptr) {
    int64_t lo = 0, hi = p->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (block_less(p->v[mid], size, ptr)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The array always has room for every block of the pool (free, pending or live: pool_grow runs
 * before a block record is made), so inserting never fails. */
static void pool_insert(pool *p, block *b) {
    MR_ASSERT(p->n < p->cap);
    int64_t i = pool_lower(p, b->size, b->ptr);
    memmove(p->v + i + 1, p->v + i, (size_t)(p->n - i) * sizeof *p->v);
    p->v[i] = b;
    p->n++;
}

static void pool_remove(pool *p, block *b) {
    int64_t i = pool_lower(p, b->size, b->ptr);
    MR_ASSERT(i < p->n && p->v[i] == b);
    memmove(p->v + i, p->v + i + 1, (size_t)(p->n - i - 1) * sizeof *p->v);
    p->n--;
}

/* Makes room for one more block of the pool; call before creating its record. */
static mr_status pool_grow(mr_alloc_cache *c, pool *p) {
    if (p->nblocks < p->cap) return MR_OK;
    int64_t cap = p->cap ? 2 * p->cap : 64;
    block **v = realloc(p->v, (size_t)cap * sizeof *v);
    if (!v) return mr_set_error(MR_ERR_NOMEM, "%s: out of host memory for the allocator's free list", c->name);
    p->v = v;
    p->cap = cap;
    return MR_OK;
}

static size_t hash_ptr(const void *p, size_t nbuckets) {
    uint64_t x = (uint64_t)(uintptr_t)p >> 9; /* blocks are 512-byte aligned apart */
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 32) & (nbuckets - 1);
}

static mr_status hash_grow(mr_alloc_cache *c) {
    size_t nb = c->nbuckets ? 2 * c->nbuckets : 256;
    block **nbk = calloc(nb, sizeof *nbk);
    if (!nbk) return mr_set_error(MR_ERR_NOMEM, "%s: out of host memory for the allocator's table", c->name);
    for (size_t i = 0; i < c->nbuckets; i++) {
        block *b = c->buckets[i];
        while (b) {
            block *nx = b->hnext;
            size_t h = hash_ptr(b->ptr, nb);
            b->hnext = nbk[h];
            nbk[h] = b;
            b = nx;
        }
    }
    free(c->buckets);
    c->buckets = nbk;
    c->nbuckets = nb;
    return MR_OK;
}

/* Caller made room with hash_grow when needed (nlive < 2 * nbuckets). */
static void hash_insert(mr_alloc_cache *c, block *b) {
    size_t h = hash_ptr(b->ptr, c->nbuckets);
    b->hnext = c->buckets[h];
    c->buckets[h] = b;
    c->nlive++;
}

static block *hash_take(mr_alloc_cache *c, const void *p) {
    if (!c->nbuckets) return NULL;
    block **pp = &c->buckets[hash_ptr(p, c->nbuckets)];
    for (; *pp; pp = &(*pp)->hnext) {
        if ((*pp)->ptr == (const char *)p) {
            block *b = *pp;
            *pp = b->hnext;
            b->hnext = NULL;
            c->nlive--;
            return b;
        }
    }
    return NULL;
}

static void pend_push(mr_alloc_cache *c, block *b) {
    b->pnext = NULL;
    b->pprev = c->pend_tail;
    if (c->pend_tail) c->pend_tail->pnext = b;
    else c->pend_head = b;
    c->pend_tail = b;
}

static void pend_unlink(mr_alloc_cache *c, block *b) {
    if (b->pprev) b->pprev->pnext = b->pnext;
    else c->pend_head = b->pnext;
    if (b->pnext) b->pnext->pprev = b->pprev;
    else c->pend_tail = b->pprev;
    b->pprev = b->pnext = NULL;
}

static void ev_put(mr_alloc_cache *c, void *ev) {
    if (c->nev == c->evcap) {
        int64_t cap = c->evcap ? 2 * c->evcap : 32;
        void **v = realloc(c->evpool, (size_t)cap * sizeof *v);
        if (!v) {
            /* no room to pool it: destroy it, a later free creates another */
            c->raw.event_free(c->raw.ctx, ev);
            return;
        }
        c->evpool = v;
        c->evcap = cap;
    }
    c->evpool[c->nev++] = ev;
}

/* Puts a block that nobody uses (and no device work touches any more) into its free pool, merged
 * with free neighbours. Keeps the invariant: no two adjacent blocks of a segment are both free. */
static void make_free(mr_alloc_cache *c, block *b) {
    pool *p = &c->pools[b->pool];
    if (b->event) {
        ev_put(c, b->event);
        b->event = NULL;
    }
    if (b->prev && b->prev->state == B_FREE) {
        block *a = b->prev;
        pool_remove(p, a);
        a->size += b->size;
        a->next = b->next;
        if (b->next) b->next->prev = a;
        free(b);
        p->nblocks--;
        b = a;
    }
    if (b->next && b->next->state == B_FREE) {
        block *n = b->next;
        pool_remove(p, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        free(n);
        p->nblocks--;
    }
    b->state = B_FREE;
    pool_insert(p, b);
}

/* Moves the pending blocks whose events have completed to the free pools, oldest first. The
 * events were recorded in this order on one stream, so the first one not done ends the walk (a
 * later one cannot be done before it): one query per alloc in a steady state. */
static mr_status drain_pending(mr_alloc_cache *c) {
    while (c->pend_head) {
        block *b = c->pend_head;
        int done = 0;
        mr_status st = c->raw.event_query(c->raw.ctx, b->event, &done);
        if (st != MR_OK) return st;
        if (!done) break;
        pend_unlink(c, b);
        make_free(c, b);
    }
    return MR_OK;
}

/* Waits for one pending block's event and frees it. */
static mr_status wait_pending(mr_alloc_cache *c, block *b) {
    mr_status st = c->raw.event_wait(c->raw.ctx, b->event);
    if (st != MR_OK) return st;
    pend_unlink(c, b);
    make_free(c, b);
    return MR_OK;
}

/* Returns every entirely free segment (after waiting for all pending blocks) to the raw
 * allocator. The first wait error is returned after releasing the rest. */
static mr_status release_locked(mr_alloc_cache *c) {
    mr_status first = MR_OK;
    block *b = c->pend_head;
    while (b) {
        block *nx = b->pnext;
        mr_status st = wait_pending(c, b);
        if (st != MR_OK && first == MR_OK) first = st;
        b = nx;
    }
    for (int k = 0; k < POOL_COUNT; k++) {
        pool *p = &c->pools[k];
        int64_t w = 0;
        for (int64_t i = 0; i < p->n; i++) {
            block *f = p->v[i];
            if (!f->prev && !f->next) {
                c->raw.free(c->raw.ctx, f->ptr);
                c->s.reserved -= f->size;
                c->s.raw_frees++;
                free(f);
                p->nblocks--;
            } else {
                p->v[w++] = f;
            }
        }
        p->n = w;
    }
    return first;
}

/* Best fit in pool k: the smallest free block of at least `size` (NULL if none). */
static block *best_fit(mr_alloc_cache *c, int k, size_t size) {
    pool *p = &c->pools[k];
    int64_t i = pool_lower(p, size, NULL);
    return i < p->n ? p->v[i] : NULL;
}

/* The smallest pending block of pool k with at least `size` (NULL if none). */
static block *pending_fit(mr_alloc_cache *c, int k, size_t size) {
    block *best = NULL;
    for (block *b = c->pend_head; b; b = b->pnext)
        if (b->pool == k && b->size >= size && (!best || b->size < best->size)) best = b;
    return best;
}

static void add_in_use(mr_alloc_cache *c, block *b) {
    c->s.in_use += b->size;
    c->s.requested += b->requested;
    if (c->s.in_use > c->s.peak_in_use) c->s.peak_in_use = c->s.in_use;
    c->s.allocs++;
}

static void add_reserved(mr_alloc_cache *c, size_t bytes) {
    c->s.reserved += bytes;
    c->s.raw_allocs++;
    if (c->s.reserved > c->s.peak_reserved) c->s.peak_reserved = c->s.reserved;
}

static mr_status oom_error(mr_alloc_cache *c, size_t bytes, size_t seg, const char *why) {
    return mr_set_error(MR_ERR_NOMEM,
                        "%s: out of memory allocating %zu bytes (a %zu-byte segment): %zu bytes in use, %zu cached "
                        "free, %zu reserved, peak in use %zu (%s); "
                        "HINT: lower the batch size or the model size, or free other processes' memory on this "
                        "device (nvidia-smi)%s",
                        c->name, bytes, seg, c->s.in_use, c->s.reserved - c->s.in_use, c->s.reserved,
                        c->s.peak_in_use, why, c->caching ? "; the cache was emptied and the allocation retried" : "");
}

/* A new segment of `seg` bytes as one block of pool k; on MR_ERR_NOMEM the cache is emptied and
 * the raw alloc retried once. */
static mr_status new_segment(mr_alloc_cache *c, int k, size_t bytes, size_t seg, block **out) {
    mr_status st = MR_OK;
    void *p = NULL;
    block *b = NULL;
    *out = NULL;
    if (c->caching) {
        st = pool_grow(c, &c->pools[k]);
        if (st != MR_OK) return st;
    }
    b = calloc(1, sizeof *b);
    if (!b) return mr_set_error(MR_ERR_NOMEM, "%s: out of host memory for a block record", c->name);
    st = c->raw.alloc(c->raw.ctx, seg, &p);
    if (st == MR_ERR_NOMEM) {
        char why[256];
        snprintf(why, sizeof why, "%s", mr_last_error());
        if (c->caching) {
            (void)release_locked(c); /* a failed wait leaves its block cached; the retry says the rest */
            st = c->raw.alloc(c->raw.ctx, seg, &p);
        }
        if (st == MR_ERR_NOMEM) st = oom_error(c, bytes, seg, why);
    }
    if (st != MR_OK) {
        free(b);
        return st;
    }
    b->ptr = p;
    b->size = seg;
    b->pool = k;
    b->state = B_FREE;
    if (c->caching) c->pools[k].nblocks++;
    add_reserved(c, seg);
    *out = b;
    return MR_OK;
}

/* ---- public ---------------------------------------------------------------------------------- */

mr_status mr_alloc_cache_new(const mr_alloc_raw *raw, int caching, const char *name, mr_alloc_cache **out) {
    mr_alloc_cache *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c) return mr_set_error(MR_ERR_NOMEM, "out of host memory for an allocator");
    c->raw = *raw;
    c->caching = caching != 0;
    c->events = raw->event_new && raw->event_free && raw->event_record && raw->event_query && raw->event_wait;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "device");
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return mr_set_error(MR_ERR_INTERNAL, "%s: cannot create the allocator's mutex", c->name);
    }
    *out = c;
    return MR_OK;
}

void mr_alloc_cache_free(mr_alloc_cache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    /* pending blocks: wait (an error leaves nothing better to do than free anyway) */
    for (block *b = c->pend_head; b; b = b->pnext) (void)c->raw.event_wait(c->raw.ctx, b->event);
    /* collect every block; free segments by their first block */
    int64_t n = c->nlive;
    for (int k = 0; k < POOL_COUNT; k++) n += c->pools[k].n;
    for (block *b = c->pend_head; b; b = b->pnext) n++;
    block **all = malloc((size_t)(n ? n : 1) * sizeof *all);
    int64_t m = 0;
    if (all) {
        for (size_t i = 0; i < c->nbuckets; i++)
            for (block *b = c->buckets[i]; b; b = b->hnext) all[m++] = b;
        for (int k = 0; k < POOL_COUNT; k++)
            for (int64_t i = 0; i < c->pools[k].n; i++) all[m++] = c->pools[k].v[i];
        for (block *b = c->pend_head; b; b = b->pnext) all[m++] = b;
        for (int64_t i = 0; i < m; i++) {
            if (all[i]->event) c->raw.event_free(c->raw.ctx, all[i]->event);
            if (!all[i]->prev) c->raw.free(c->raw.ctx, all[i]->ptr);
        }
        for (int64_t i = 0; i < m; i++) free(all[i]);
        free(all);
    }
    for (int64_t i = 0; i < c->nev; i++) c->raw.event_free(c->raw.ctx, c->evpool[i]);
    free(c->evpool);
    for (int k = 0; k < POOL_COUNT; k++) free(c->pools[k].v);
    free(c->buckets);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

mr_status mr_alloc_cache_alloc(mr_alloc_cache *c, size_t bytes, void **out) {
    mr_status st = MR_OK;
    block *b = NULL;
    int hit = 0;
    *out = NULL;
    if (bytes > SIZE_MAX / 2)
        return mr_set_error(MR_ERR_NOMEM, "%s: cannot allocate %zu bytes (more than any device has); "
                            "HINT: a shape or element count is probably wrong", c->name, bytes);
    pthread_mutex_lock(&c->mu);
    if (c->nlive >= 2 * (int64_t)c->nbuckets) MR_TRY(hash_grow(c));
    if (!c->caching) {
        /* pass-through: the exact size, so a memory checker sees the buffer's true end */
        MR_TRY(new_segment(c, POOL_LARGE, bytes, bytes ? bytes : 1, &b));
    } else {
        size_t size = round_up(bytes ? bytes : 1, MR_ALLOC_ROUND);
        int k = size <= MR_ALLOC_SMALL_MAX ? POOL_SMALL : POOL_LARGE;
        pool *p = &c->pools[k];
        if (c->events && c->pend_head) MR_TRY(drain_pending(c));
        b = best_fit(c, k, size);
        if (!b && c->events && c->pend_head) {
            /* Only blocks still used by queued work could serve it: wait rather than grow. For
             * the smallest pending block that fits, else for every pending block of the pool
             * (merged with their neighbours they may fit). Events complete in order on one
             * device, so the single wait usually frees more, which the drain collects. */
            block *w = pending_fit(c, k, size);
            if (w) {
                MR_TRY(wait_pending(c, w));
            } else {
                block *q = c->pend_head;
                while (q) {
                    block *nx = q->pnext;
                    if (q->pool == k) MR_TRY(wait_pending(c, q));
                    q = nx;
                }
            }
            MR_TRY(drain_pending(c));
            b = best_fit(c, k, size);
        }
        if (b) {
            hit = 1;
            pool_remove(p, b);
        } else {
            size_t seg = k == POOL_SMALL ? MR_ALLOC_SMALL_SEGMENT : round_up(size, MR_ALLOC_LARGE_GRANULE);
            MR_TRY(new_segment(c, k, bytes, seg, &b));
        }
        size_t rest = b->size - size;
        if (k == POOL_SMALL ? rest >= MR_ALLOC_ROUND : rest > MR_ALLOC_SMALL_MAX) {
            block *r = NULL;
            st = pool_grow(c, p);
            if (st == MR_OK && !(r = calloc(1, sizeof *r)))
                st = mr_set_error(MR_ERR_NOMEM, "%s: out of host memory for a block record", c->name);
            if (st != MR_OK) {
                /* put b back (a hit) or keep the new segment cached; nothing is lost */
                make_free(c, b);
                goto fail;
            }
            p->nblocks++;
            r->ptr = b->ptr + size;
            r->size = rest;
            r->pool = k;
            r->state = B_FREE;
            r->prev = b;
            r->next = b->next;
            if (b->next) b->next->prev = r;
            b->next = r;
            b->size = size;
            /* r's right neighbour is not free (free neighbours of b were merged into b), so no
             * merge is needed */
            pool_insert(p, r);
        }
    }
    b->state = B_LIVE;
    b->requested = bytes;
    hash_insert(c, b);
    add_in_use(c, b);
    if (hit) c->s.cache_hits++;
    *out = b->ptr;
    pthread_mutex_unlock(&c->mu);
    return MR_OK;
fail:
    pthread_mutex_unlock(&c->mu);
    return st;
}

mr_status mr_alloc_cache_dealloc(mr_alloc_cache *c, void *ptr) {
    mr_status st = MR_OK;
    if (!ptr) return MR_OK;
    pthread_mutex_lock(&c->mu);
    block *b = hash_take(c, ptr);
    if (!b) {
        pthread_mutex_unlock(&c->mu);
        return mr_set_error(MR_ERR_INVALID, "%s: free of %p, which this allocator did not hand out (or freed twice)",
                            c->name, ptr);
    }
    c->s.in_use -= b->size;
    c->s.requested -= b->requested;
    b->requested = 0;
    if (!c->caching) {
        c->raw.free(c->raw.ctx, b->ptr);
        c->s.reserved -= b->size;
        c->s.raw_frees++;
        free(b);
        pthread_mutex_unlock(&c->mu);
        return MR_OK;
    }
    if (!c->events) {
        make_free(c, b);
        pthread_mutex_unlock(&c->mu);
        return MR_OK;
    }
    void *ev = NULL;
    if (c->nev > 0) ev = c->evpool[--c->nev];
    else st = c->raw.event_new(c->raw.ctx, &ev);
    if (st == MR_OK) {
        st = c->raw.event_record(c->raw.ctx, ev);
        if (st != MR_OK) ev_put(c, ev);
    }
    if (st == MR_OK) {
        b->event = ev;
        b->state = B_PENDING;
        pend_push(c, b);
    } else {
        /* no event: the context is broken (see the header); cache the block as free */
        make_free(c, b);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

mr_status mr_alloc_cache_release_cached(mr_alloc_cache *c) {
    pthread_mutex_lock(&c->mu);
    mr_status st = release_locked(c);
    pthread_mutex_unlock(&c->mu);
    return st;
}

void mr_alloc_cache_stats(mr_alloc_cache *c, mr_memory_stats *out) {
    pthread_mutex_lock(&c->mu);
    *out = c->s;
    pthread_mutex_unlock(&c->mu);
}

void mr_alloc_cache_reset_peak(mr_alloc_cache *c) {
    pthread_mutex_lock(&c->mu);
    c->s.peak_in_use = c->s.in_use;
    c->s.peak_reserved = c->s.reserved;
    pthread_mutex_unlock(&c->mu);
}
