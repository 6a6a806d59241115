/* Dataset nodes: element specs, the in-memory and callback sources, the transforms (which only
 * validate and record their parameters; iterator.c runs them) and the structure hash that state
 * blobs carry so a blob cannot be restored into another pipeline. */
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"

uint64_t ds_hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t hash_i64(uint64_t h, int64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)v >> (8 * i));
    return ds_hash_bytes(h, b, 8);
}

static uint64_t hash_spec(uint64_t h, const mr_data_spec *s) {
    h = hash_i64(h, s->n);
    for (int c = 0; c < s->n; c++) {
        h = ds_hash_bytes(h, s->comp[c].name, strlen(s->comp[c].name));
        h = hash_i64(h, s->comp[c].dtype);
        h = hash_i64(h, s->comp[c].shape.ndim);
        for (int d = 0; d < s->comp[c].shape.ndim; d++) h = hash_i64(h, s->comp[c].shape.dim[d]);
    }
    return h;
}

size_t mr_data_spec_bytes(const mr_data_spec *spec, int c) {
    return (size_t)mr_shape_numel(&spec->comp[c].shape) * mr_dtype_size(spec->comp[c].dtype);
}

static mr_status check_component(const mr_data_spec *spec, int c, const char *what) {
    const mr_data_component *k = &spec->comp[c];
    size_t len = strnlen(k->name, MR_DATA_NAME_MAX);
    if (len == 0 || len >= MR_DATA_NAME_MAX)
        return mr_set_error(MR_ERR_INVALID, "%s: component %d: name empty or longer than %d characters", what, c,
                            MR_DATA_NAME_MAX - 1);
    if ((int)k->dtype < 0 || k->dtype >= MR_DTYPE_COUNT)
        return mr_set_error(MR_ERR_INVALID, "%s: component '%s': invalid dtype %d", what, k->name, (int)k->dtype);
    if (k->shape.ndim < 0 || k->shape.ndim > MR_MAX_DIMS - 1)
        return mr_set_error(MR_ERR_INVALID, "%s: component '%s': %d dims (at most %d, batching adds one)", what,
                            k->name, k->shape.ndim, MR_MAX_DIMS - 1);
    for (int d = 0; d < k->shape.ndim; d++)
        if (k->shape.dim[d] < 0 || k->shape.dim[d] > ((int64_t)1 << 40))
            return mr_set_error(MR_ERR_INVALID, "%s: component '%s': dim %d size %lld out of range", what, k->name, d,
                                (long long)k->shape.dim[d]);
    for (int j = 0; j < c; j++)
        if (strcmp(spec->comp[j].name, k->name) == 0)
            return mr_set_error(MR_ERR_INVALID, "%s: component name '%s' repeated", what, k->name);
    return MR_OK;
}

mr_status ds_check_spec(const mr_data_spec *spec, const char *what) {
    if (!spec) return mr_set_error(MR_ERR_INVALID, "%s: spec is NULL", what);
    if (spec->n < 1 || spec->n > MR_DATA_MAX_COMPONENTS)
        return mr_set_error(MR_ERR_INVALID, "%s: spec has %d components (1..%d)", what, spec->n,
                            MR_DATA_MAX_COMPONENTS);
    for (int c = 0; c < spec->n; c++) {
        mr_status st = check_component(spec, c, what);
        if (st != MR_OK) return st;
    }
    return MR_OK;
}

mr_status mr_data_spec_add(mr_data_spec *spec, const char *name, mr_dtype dtype, const mr_shape *shape) {
    if (!spec || !name || !shape) return mr_set_error(MR_ERR_INVALID, "mr_data_spec_add: NULL argument");
    if (spec->n < 0 || spec->n >= MR_DATA_MAX_COMPONENTS)
        return mr_set_error(MR_ERR_INVALID, "mr_data_spec_add: '%s': spec already has %d components (max %d)", name,
                            spec->n, MR_DATA_MAX_COMPONENTS);
    mr_data_component *k = &spec->comp[spec->n];
    memset(k, 0, sizeof *k);
    if (strlen(name) >= MR_DATA_NAME_MAX)
        return mr_set_error(MR_ERR_INVALID, "mr_data_spec_add: name '%s' longer than %d characters", name,
                            MR_DATA_NAME_MAX - 1);
    strcpy(k->name, name);
    k->dtype = dtype;
    k->shape = *shape;
    mr_status st = check_component(spec, spec->n, "mr_data_spec_add");
    if (st == MR_OK) spec->n++;
    return st;
}

static mr_dataset *node_new(ds_kind kind) {
    mr_dataset *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    atomic_init(&d->refs, 1);
    d->kind = kind;
    return d;
}

void mr_data_free(mr_dataset *ds) {
    while (ds) {
        if (atomic_fetch_sub(&ds->refs, 1) != 1) return;
        mr_dataset *in = ds->in;
        if (ds->src_free) ds->src_free(ds->src_impl);
        if (ds->map_free) ds->map_free(ds->map_ctx);
        free(ds);
        ds = in;
    }
}

mr_status ds_new_source(const mr_data_spec *spec, int64_t n, ds_read_fn read, void (*src_free)(void *), void *impl,
                        const char *kind_tag, mr_dataset **out) {
    mr_dataset *d = node_new(DS_SOURCE);
    if (!d) {
        if (src_free) src_free(impl);
        return mr_set_error(MR_ERR_NOMEM, "data source '%s': out of memory", kind_tag);
    }
    d->spec = *spec;
    d->src_n = n;
    d->src_read = read;
    d->src_free = src_free;
    d->src_impl = impl;
    uint64_t h = ds_hash_bytes(14695981039346656037ull, kind_tag, strlen(kind_tag));
    d->hash = hash_i64(hash_spec(h, spec), n);
    *out = d;
    return MR_OK;
}

/* ---- in-memory arrays ----------------------------------------------------------------------- */

typedef struct arrays_impl {
    mr_data_spec spec;
    void *data[MR_DATA_MAX_COMPONENTS];
} arrays_impl;

static void arrays_free(void *p) {
    arrays_impl *a = p;
    if (!a) return;
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) free(a->data[c]);
    free(a);
}

static mr_status arrays_read(void *p, int64_t idx, void *const out[]) {
    const arrays_impl *a = p;
    for (int c = 0; c < a->spec.n; c++) {
        size_t eb = mr_data_spec_bytes(&a->spec, c);
        memcpy(out[c], (const char *)a->data[c] + (size_t)idx * eb, eb);
    }
    return MR_OK;
}

mr_status mr_data_from_arrays(const mr_data_spec *spec, int64_t n, const void *const data[], mr_dataset **out) {
    mr_status st = MR_OK;
    arrays_impl *a = NULL;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_from_arrays: out is NULL");
    *out = NULL;
    MR_TRY(ds_check_spec(spec, "mr_data_from_arrays"));
    MR_CHECK(n >= 0, MR_ERR_INVALID, "mr_data_from_arrays: n = %lld < 0", (long long)n);
    MR_CHECK(data != NULL, MR_ERR_INVALID, "mr_data_from_arrays: data is NULL");
    a = calloc(1, sizeof *a);
    MR_CHECK(a, MR_ERR_NOMEM, "mr_data_from_arrays: out of memory");
    a->spec = *spec;
    for (int c = 0; c < spec->n; c++) {
        size_t bytes = mr_data_spec_bytes(spec, c) * (size_t)n;
        MR_CHECK(bytes == 0 || data[c] != NULL, MR_ERR_INVALID, "mr_data_from_arrays: data[%d] ('%s') is NULL", c,
                 spec->comp[c].name);
        a->data[c] = malloc(bytes ? bytes : 1);
        MR_CHECK(a->data[c], MR_ERR_NOMEM, "mr_data_from_arrays: out of memory for %zu bytes", bytes);
        if (bytes) memcpy(a->data[c], data[c], bytes);
    }
    return ds_new_source(spec, n, arrays_read, arrays_free, a, "arrays", out);
fail:
    arrays_free(a);
    return st;
}

mr_status ds_arrays_adopt(const mr_data_spec *spec, int64_t n, void *data[], const char *tag, mr_dataset **out) {
    arrays_impl *a = calloc(1, sizeof *a);
    if (!a) {
        for (int c = 0; c < spec->n; c++) free(data[c]);
        return mr_set_error(MR_ERR_NOMEM, "%s: out of memory", tag);
    }
    a->spec = *spec;
    for (int c = 0; c < spec->n; c++) a->data[c] = data[c];
    return ds_new_source(spec, n, arrays_read, arrays_free, a, tag, out);
}

/* ---- callback source ------------------------------------------------------------------------ */

typedef struct fn_impl {
    mr_data_source_fn fn;
    void *ctx;
} fn_impl;

static mr_status fn_read(void *p, int64_t idx, void *const out[]) {
    const fn_impl *f = p;
    return f->fn(f->ctx, idx, out);
}

mr_status mr_data_from_fn(const mr_data_spec *spec, int64_t n, mr_data_source_fn fn, void *ctx, mr_dataset **out) {
    mr_status st = MR_OK;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_from_fn: out is NULL");
    *out = NULL;
    MR_TRY(ds_check_spec(spec, "mr_data_from_fn"));
    MR_CHECK(n >= 0, MR_ERR_INVALID, "mr_data_from_fn: n = %lld < 0", (long long)n);
    MR_CHECK(fn != NULL, MR_ERR_INVALID, "mr_data_from_fn: fn is NULL");
    fn_impl *f = malloc(sizeof *f);
    MR_CHECK(f, MR_ERR_NOMEM, "mr_data_from_fn: out of memory");
    f->fn = fn;
    f->ctx = ctx;
    return ds_new_source(spec, n, fn_read, free, f, "fn", out);
fail:
    return st;
}

/* ---- transforms ----------------------------------------------------------------------------- */

/* A node of `kind` over `in` with the input's spec and batch; hash extended by kind and params. */
static mr_status transform_new(mr_dataset *in, ds_kind kind, const char *what, int64_t a, int64_t b, uint64_t seed,
                               mr_dataset **out) {
    if (!out) return mr_set_error(MR_ERR_INVALID, "%s: out is NULL", what);
    *out = NULL;
    if (!in) return mr_set_error(MR_ERR_INVALID, "%s: input dataset is NULL", what);
    mr_dataset *d = node_new(kind);
    if (!d) return mr_set_error(MR_ERR_NOMEM, "%s: out of memory", what);
    d->in = in;
    atomic_fetch_add(&in->refs, 1);
    d->spec = in->spec;
    d->batch = in->batch;
    d->a = a;
    d->b = b;
    d->seed = seed;
    /* prefetch changes timing only, so it leaves the hash alone: a state saved with prefetch
     * restores into the same pipeline without it */
    d->hash = kind == DS_PREFETCH ? in->hash
                                  : hash_i64(hash_i64(hash_i64(hash_i64(in->hash, kind), a), b), (int64_t)seed);
    *out = d;
    return MR_OK;
}

mr_status mr_data_shard(mr_dataset *in, int64_t n, int64_t i, mr_dataset **out) {
    if (n < 1 || i < 0 || i >= n) {
        if (out) *out = NULL;
        return mr_set_error(MR_ERR_INVALID, "shard: need n >= 1 and 0 <= index < n, got n = %lld, index = %lld",
                            (long long)n, (long long)i);
    }
    return transform_new(in, DS_SHARD, "shard", n, i, 0, out);
}

mr_status mr_data_shuffle(mr_dataset *in, int64_t buffer, uint64_t seed, int reshuffle, mr_dataset **out) {
    if (buffer < 1 || buffer > ((int64_t)1 << 32)) {
        if (out) *out = NULL;
        return mr_set_error(MR_ERR_INVALID, "shuffle: buffer_size must be in 1..2^32, got %lld", (long long)buffer);
    }
    return transform_new(in, DS_SHUFFLE, "shuffle", buffer, reshuffle != 0, seed, out);
}

mr_status mr_data_map(mr_dataset *in, mr_data_map_fn fn, void *ctx, const mr_data_spec *out_spec, int parallel,
                      mr_dataset **out) {
    mr_status st = MR_OK;
    if (out) *out = NULL;
    MR_CHECK(fn != NULL, MR_ERR_INVALID, "map: fn is NULL");
    MR_CHECK(parallel >= 0, MR_ERR_INVALID, "map: num_parallel_calls = %d < 0 (0 means auto)", parallel);
    MR_TRY(ds_check_spec(out_spec, "map: output spec"));
    MR_CHECK(!in || in->batch == 0, MR_ERR_UNSUPPORTED,
             "map: after batch is not supported; HINT: map before batch (elements are mapped in parallel)");
    MR_TRY(transform_new(in, DS_MAP, "map", parallel, 0, 0, out));
    (*out)->spec = *out_spec;
    (*out)->map_fn = fn;
    (*out)->map_ctx = ctx;
    (*out)->parallel = parallel;
    (*out)->hash = hash_spec(hash_i64(in->hash, DS_MAP), out_spec);
    return MR_OK;
fail:
    return st;
}

mr_status ds_map_owned(mr_dataset *in, mr_data_map_fn fn, void *ctx, void (*ctx_free)(void *), const mr_data_spec *out_spec,
                       int parallel, mr_dataset **out) {
    mr_status st = mr_data_map(in, fn, ctx, out_spec, parallel, out);
    if (st != MR_OK) {
        if (ctx_free) ctx_free(ctx);
        return st;
    }
    (*out)->map_free = ctx_free;
    return MR_OK;
}

mr_status mr_data_batch(mr_dataset *in, int64_t size, int drop_remainder, mr_dataset **out) {
    mr_status st = MR_OK;
    if (out) *out = NULL;
    MR_CHECK(size >= 1 && size <= ((int64_t)1 << 31), MR_ERR_INVALID, "batch: batch_size must be in 1..2^31, got %lld",
             (long long)size);
    MR_CHECK(!in || in->batch == 0, MR_ERR_UNSUPPORTED, "batch: a pipeline may batch only once (input is batched by %lld)",
             (long long)in->batch);
    MR_TRY(transform_new(in, DS_BATCH, "batch", size, drop_remainder != 0, 0, out));
    (*out)->batch = size;
    return MR_OK;
fail:
    return st;
}

mr_status mr_data_prefetch(mr_dataset *in, int64_t n, mr_dataset **out) {
    if (n < 0 || n > (1 << 20)) {
        if (out) *out = NULL;
        return mr_set_error(MR_ERR_INVALID, "prefetch: buffer_size must be in 0..2^20 (0 = auto), got %lld", (long long)n);
    }
    mr_status st = transform_new(in, DS_PREFETCH, "prefetch", n == MR_DATA_AUTO ? 2 : n, 0, 0, out);
    if (st == MR_OK) (*out)->parallel = n == MR_DATA_AUTO; /* prefetch: 1 = autotuned depth (iterator.c) */
    return st;
}

mr_status mr_data_repeat(mr_dataset *in, int64_t count, mr_dataset **out) {
    if (count < -1) {
        if (out) *out = NULL;
        return mr_set_error(MR_ERR_INVALID, "repeat: count must be >= -1 (-1 = forever), got %lld", (long long)count);
    }
    return transform_new(in, DS_REPEAT, "repeat", count, 0, 0, out);
}

mr_status mr_data_take(mr_dataset *in, int64_t n, mr_dataset **out) {
    if (n < 0) {
        if (out) *out = NULL;
        return mr_set_error(MR_ERR_INVALID, "take: count must be >= 0, got %lld", (long long)n);
    }
    return transform_new(in, DS_TAKE, "take", n, 0, 0, out);
}

mr_status mr_data_skip(mr_dataset *in, int64_t n, mr_dataset **out) {
    if (n < 0) {
        if (out) *out = NULL;
        return mr_set_error(MR_ERR_INVALID, "skip: count must be >= 0, got %lld", (long long)n);
    }
    return transform_new(in, DS_SKIP, "skip", n, 0, 0, out);
}

int64_t mr_data_source_size(const mr_dataset *ds) {
    while (ds->in) ds = ds->in;
    return ds->src_n;
}

const mr_data_spec *mr_data_element_spec(const mr_dataset *ds) { return &ds->spec; }
int64_t mr_data_batch_size(const mr_dataset *ds) { return ds->batch; }
uint64_t mr_data_structure_hash(const mr_dataset *ds) { return ds->hash; }
