/* Private to data/: the dataset node and the source interface shared by dataset.c (nodes,
 * transforms, in-memory and callback sources), source_files.c (IDX and token files) and
 * iterator.c (the index chain, materialization, prefetch thread, state blobs). */
#ifndef MR_DATA_DATA_IMPL_H
#define MR_DATA_DATA_IMPL_H

#include <stdatomic.h>

#include "data/data.h"

typedef enum ds_kind {
    DS_SOURCE = 1,
    DS_SHARD,
    DS_SHUFFLE,
    DS_MAP,
    DS_BATCH,
    DS_PREFETCH,
    DS_REPEAT,
    DS_TAKE,
    DS_SKIP
} ds_kind;

/* Reads element idx of a source into out[c] (one element of component c each). Thread-safe. */
typedef mr_status (*ds_read_fn)(void *impl, int64_t idx, void *const out[]);

struct mr_dataset {
    atomic_int refs;
    ds_kind kind;
    mr_dataset *in;     /* retained; NULL for a source */
    mr_data_spec spec;  /* per-element output spec (without the batch dim) */
    int64_t batch;      /* batch size of the output, 0 when unbatched */
    uint64_t hash;      /* structure hash up to and including this node */
    /* transform parameters */
    int64_t a, b;       /* shard n,i; shuffle buffer; batch size,drop; prefetch n; repeat/take/skip n */
    uint64_t seed;
    mr_data_map_fn map_fn;
    void *map_ctx;
    void (*map_free)(void *ctx); /* frees map_ctx with the node (ds_map_owned); NULL: borrowed */
    int parallel;       /* map: threads (MR_DATA_AUTO: autotuned); prefetch: 1 when the depth is autotuned */
    /* source */
    int64_t src_n;
    ds_read_fn src_read;
    void (*src_free)(void *impl);
    void *src_impl;
};

/* FNV-1a over bytes, continuing from h. */
uint64_t ds_hash_bytes(uint64_t h, const void *p, size_t n);
/* Validates a spec (names, dtypes, shapes): MR_ERR_INVALID naming `what` and the component. */
mr_status ds_check_spec(const mr_data_spec *spec, const char *what) MR_WUR;
/* A new source node that takes ownership of impl (src_free(impl) is called on error too). kind_tag
 * names the source kind in the structure hash. */
mr_status ds_new_source(const mr_data_spec *spec, int64_t n, ds_read_fn read, void (*src_free)(void *), void *impl,
                        const char *kind_tag, mr_dataset **out) MR_WUR;

/* mr_data_map whose node owns ctx: ctx_free(ctx) runs when the node is freed, or at once on error. */
mr_status ds_map_owned(mr_dataset *in, mr_data_map_fn fn, void *ctx, void (*ctx_free)(void *), const mr_data_spec *out_spec,
                       int parallel, mr_dataset **out) MR_WUR;

/* An in-memory source that takes ownership of the malloc'd arrays data[c] (n elements each),
 * freeing them on error too. tag names the source kind in messages and the structure hash. */
mr_status ds_arrays_adopt(const mr_data_spec *spec, int64_t n, void *data[], const char *tag, mr_dataset **out) MR_WUR;

#endif
