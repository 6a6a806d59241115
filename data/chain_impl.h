/* Private to data/: the index chain (chain.c) that iterator.c drives. An item is a list of
 * (source index, epoch) entries: one before batch, up to the batch size after. */
#ifndef MR_DATA_CHAIN_IMPL_H
#define MR_DATA_CHAIN_IMPL_H

#include "data/data_impl.h"

#define STATE_MAGIC 0x4944524Du /* "MRDI" little-endian */
#define STATE_VERSION 1u

typedef struct entry {
    int64_t idx, epoch;
} entry;

typedef struct item {
    int64_t n;
    entry *e;
} item;

typedef struct stage {
    ds_kind kind;
    int64_t a, b;
    uint64_t seed;
    int64_t cap_in; /* entries per input item */
    int64_t src_n;  /* source elements (for validation) */
    /* state */
    int64_t pos;    /* source: next index; shard: input counter; repeat: passes done; take/skip: count */
    int64_t epoch;  /* source: restarts; shuffle: iteration */
    int64_t draws;  /* shuffle: draws made this iteration */
    int64_t fill;   /* shuffle: items in the buffer */
    int exhausted, started, got; /* shuffle: input ended, buffer filled once; repeat: pass non-empty */
    /* shuffle storage */
    int64_t buf_cap;
    entry *buf;     /* buf_cap items of cap_in entries */
    int64_t *buf_n; /* entries per buffered item */
    item tmp;       /* scratch input item (cap_in entries) */
} stage;

typedef struct chain {
    int n;
    stage *st;
} chain;

typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} wbuf;

typedef struct rbuf {
    const unsigned char *p;
    size_t n, at;
    mr_status st;
} rbuf;

/* Next item of stage k (k = c->n - 1: the whole pipeline) into out (room for the stage's
 * output entries): 1, 0 at the end, -1 out of memory (shuffle buffer). */
int ds_chain_next(chain *c, int k, item *out);
/* Builds the chain of ds (source first), leaving out map and prefetch. MR_ERR_NOMEM. */
mr_status ds_chain_build(const mr_dataset *ds, chain *c) MR_WUR;
void ds_chain_free(chain *c);
/* Back to the start of the data (every stage's state zeroed; buffers kept). */
void ds_chain_restart(chain *c);
/* Little-endian writer (w->oom set on allocation failure) and bounds-checked reader (r->st set,
 * with a message naming the offset, on the first failure; later reads return 0). */
void ds_put(wbuf *w, uint64_t v, int bytes);
uint64_t ds_get(rbuf *r, int bytes, const char *field);
/* Appends / reads the per-stage records; ds_chain_load validates every field against the
 * pipeline (kind, counters in range, buffered indices < the source's size). */
void ds_chain_save(const chain *c, wbuf *w);
mr_status ds_chain_load(chain *c, rbuf *r);

#endif
