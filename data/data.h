/* mirror's input pipeline: tf.data-like sources and transforms, and a resumable iterator.
 * (.npy/.npz, TFRecord and sharded file sets: data/sources.h.)
 *
 * A dataset is an immutable, reference-counted description: a source (in-memory arrays, IDX
 * files, flat token files, HDF5 datasets, text files, a user callback, or cache/interleave, which
 * turn source+map pipelines into a new random-access source) followed by a chain of transforms
 * (shard, shuffle, map, batch, prefetch, repeat, take, skip). Building computes nothing;
 * mr_data_iter_new runs it.
 *
 * Determinism and resume. Every source is random-access by element index, and every transform
 * except map and batch's stacking works on element INDICES: shard/take/skip/repeat are counters,
 * shuffle keeps a buffer of indices and draws from Philox (seed, iteration) at a draw counter.
 * Data is materialized last: element i is source(i) passed through the maps, which must be pure
 * functions of their input (and of the index/epoch they are given). So the element order depends
 * only on the seeds and the pipeline, never on thread counts or timing, and the iterator state is
 * a small blob (per-stage counters, the shuffle buffers' indices and draw counters) from which
 * restore recomputes exactly the next element.
 *
 * Threads. map(parallel=N) materializes the elements of a batch (or N unbatched elements) with N
 * OpenMP threads; prefetch(N) runs materialization on one background thread that keeps up to N
 * finished elements (batches) ahead in a bounded queue. Both deliver in order.
 *
 * Ownership: every mr_data_<transform>(in, ..., &out) retains `in`; the caller still frees its own
 * handle with mr_data_free. Datasets are immutable and may be shared; building them is not
 * thread-safe. On error *out is NULL and nothing is retained. */
#ifndef MR_DATA_DATA_H
#define MR_DATA_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_DATA_MAX_COMPONENTS 4
#define MR_DATA_NAME_MAX 32
/* For map(parallel) and prefetch(n): let mirror choose from measured timing (see "Autotune"
 * below, at mr_data_iter_stats). */
#define MR_DATA_AUTO 0

/* One component of an element: a name ("image"), a dtype and a per-element shape (batching adds
 * a leading dim). */
typedef struct mr_data_component {
    char name[MR_DATA_NAME_MAX];
    mr_dtype dtype;
    mr_shape shape;
} mr_data_component;

/* The fixed spec of every element: 1..MR_DATA_MAX_COMPONENTS components. */
typedef struct mr_data_spec {
    int n;
    mr_data_component comp[MR_DATA_MAX_COMPONENTS];
} mr_data_spec;

/* Appends a component to spec. MR_ERR_INVALID if the spec is full, the name is empty, too long or
 * repeated, the dtype is invalid or a size is negative. */
mr_status mr_data_spec_add(mr_data_spec *spec, const char *name, mr_dtype dtype, const mr_shape *shape) MR_WUR;
/* Bytes of component c of one element. */
size_t mr_data_spec_bytes(const mr_data_spec *spec, int c);

typedef struct mr_dataset mr_dataset;
typedef struct mr_data_iter mr_data_iter;
struct mr_trace_track; /* core/trace.h */

/* ---- sources -------------------------------------------------------------------------------- */

/* n elements from caller arrays, COPIED: data[c] holds n elements of component c, contiguous
 * ((n, spec.comp[c].shape) of spec.comp[c].dtype). MR_ERR_INVALID on a bad spec or n < 0. */
mr_status mr_data_from_arrays(const mr_data_spec *spec, int64_t n, const void *const data[], mr_dataset **out) MR_WUR;

/* IDX files (the MNIST format), gzipped or not (detected from the content). images_path: an IDX
 * of u8 with >= 2 dims (N, H, W, ...) -> component "image" u8 (H, W, ...). labels_path: an IDX of
 * u8 with 1 dim (N) -> component "label" i32 []. Either may be NULL (not both); with both the
 * dataset has ("image", "label") and the counts must match. The files are read into memory.
 * Errors name the file and the byte offset (of the decompressed stream): MR_ERR_NOT_FOUND
 * (missing), MR_ERR_IO (unreadable), MR_ERR_FORMAT (bad magic, dims, truncated or corrupt gzip,
 * trailing bytes, count mismatch), MR_ERR_UNSUPPORTED (an IDX type other than u8). */
mr_status mr_data_from_idx(const char *images_path, const char *labels_path, mr_dataset **out) MR_WUR;

/* Header of a flat token file. */
typedef enum mr_data_token_header {
    MR_DATA_TOKENS_RAW = 0, /* no header: tokens from byte 0 (nanoGPT's np.memmap .bin files) */
    MR_DATA_TOKENS_LLMC = 1 /* llm.c: 256 int32 (magic 20240520, version 1 = u16 / 2 = u32, count) */
} mr_data_token_header;

/* A flat file of little-endian uint16 (token_bytes 2) or uint32 (4) tokens, read as
 * non-overlapping windows of context+1 tokens: element i starts at token i*context and gives
 * "x" i32 (context) = tokens [i*T, i*T+T) and "y" i32 (context) = tokens [i*T+1, i*T+T+1).
 * There are floor((ntok - 1) / T) elements. The file is read on demand (pread), not loaded.
 * Errors: MR_ERR_NOT_FOUND, MR_ERR_FORMAT (size not a multiple of the token size, naming the byte
 * offset of the partial token; fewer than context+1 tokens; llm.c header magic/version/count),
 * MR_ERR_INVALID (token_bytes, context). Reading a u32 token above INT32_MAX fails next(). */
mr_status mr_data_from_tokens(const char *path, int token_bytes, int64_t context, mr_data_token_header header,
                              mr_dataset **out) MR_WUR;

/* HDF5 datasets, one per component: names[c] is a dataset path ("/images", "/labels"); its first
 * dim is the element count (all must agree) and the rest the per-element shape. The component is
 * named after the last path segment ("labels"). Types: f32, f64, IEEE f16 -> MR_F16, i32, i64,
 * u8; other integers widen exactly (i8/i16/u16 -> i32, u32 -> i64); anything else (u64, strings,
 * compounds, ...) is MR_ERR_UNSUPPORTED. Elements are read in blocks of consecutive elements
 * (~1 MiB) kept in an LRU of up to 64 MiB, so sequential reads and shuffle draws are cheap.
 * Thread-safe: all HDF5 calls of mirror share one mutex (Debian's HDF5 is the serial build).
 * Errors name the file and dataset: MR_ERR_NOT_FOUND (missing file or dataset), MR_ERR_FORMAT (not
 * HDF5, truncated or corrupt, first dims differ, rank 0 or > 8), MR_ERR_UNSUPPORTED (type),
 * MR_ERR_INVALID (n outside 1..4, empty name). A read failing later fails next() (MR_ERR_IO). */
mr_status mr_data_from_hdf5(const char *path, const char *const names[], int n, mr_dataset **out) MR_WUR;

/* Runs ds to its end and writes each component c to HDF5 dataset names[c] (NULL: "/<component
 * name>"; intermediate groups are created) with the element count as the first dim, chunked in
 * ~1 MiB chunks of whole elements, uncompressed. A batched ds is unbatched. The file is written as
 * "<path>.tmp.<pid>" and renamed onto path only when complete, so path never holds a partial
 * file; on error the temporary is removed. ds must be finite. Errors: MR_ERR_IO (create, write,
 * rename), MR_ERR_UNSUPPORTED (a dtype HDF5 cannot hold here: bf16), any error of the pipeline. */
mr_status mr_data_write_hdf5(mr_dataset *ds, const char *path, const char *const names[]) MR_WUR;

/* How a text file becomes tokens. */
typedef enum mr_data_text_mode {
    MR_DATA_TEXT_BYTES = 0, /* token = byte value 0..255 */
    MR_DATA_TEXT_CHARS = 1  /* token = rank of the UTF-8 code point in the sorted set of distinct ones */
} mr_data_text_mode;

/* A text file read into memory as tokens, in windows exactly like mr_data_from_tokens: element i
 * has "x" i32 (context) = tokens [i*T, i*T+T) and "y" i32 (context) = tokens [i*T+1, i*T+T+1),
 * floor((ntok - 1) / T) elements. Errors name the file: MR_ERR_NOT_FOUND, MR_ERR_IO, MR_ERR_FORMAT
 * (empty, fewer than context + 1 tokens, invalid UTF-8 in CHARS mode naming the byte offset),
 * MR_ERR_INVALID (context outside 1..2^30, mode). */
mr_status mr_data_from_text(const char *path, int64_t context, mr_data_text_mode mode, mr_dataset **out) MR_WUR;

/* The vocabulary of the text source under ds (ds may be the source or any pipeline over it):
 * *codepoints[t] is the code point (CHARS) or byte (BYTES) of token t, *n the vocabulary size.
 * The array is owned by the source and lives as long as ds. MR_ERR_INVALID if ds is not over a
 * text source. */
mr_status mr_data_text_vocab(const mr_dataset *ds, const int32_t **codepoints, int64_t *n) MR_WUR;

/* Fills element `index` (0 <= index < n): out[c] has room for one element of component c. Must
 * be thread-safe and a pure function of index (it is called out of order, in parallel, and again
 * after a restore). A non-OK status fails next() (record a message with mr_set_error). */
typedef mr_status (*mr_data_source_fn)(void *ctx, int64_t index, void *const out[]);

/* The from_generator case, random access: n elements computed by fn(ctx, i, bufs). ctx is
 * borrowed and must outlive every iterator. MR_ERR_INVALID on a bad spec, n < 0 or fn NULL. */
mr_status mr_data_from_fn(const mr_data_spec *spec, int64_t n, mr_data_source_fn fn, void *ctx,
                          mr_dataset **out) MR_WUR;

/* ---- transforms (tf.data names) ------------------------------------------------------------- */

/* Every n-th element starting at i (element k goes to shard k % n): shards are disjoint and cover
 * the input. With N elements, shards i < N % n get ceil(N/n) elements, the others floor(N/n)
 * (tf.data's rule; drop the uneven tail with take(floor(N/n)) if replicas must agree). Put it
 * right after the source (before shuffle) so every shard sees a fixed subset.
 * MR_ERR_INVALID unless n >= 1 and 0 <= i < n. */
mr_status mr_data_shard(mr_dataset *in, int64_t n, int64_t i, mr_dataset **out) MR_WUR;

/* tf.data's buffered shuffle: a buffer of `buffer` elements (indices), each output a uniform draw
 * from it replaced by the next input. Draws come from Philox(seed, iteration), where iteration
 * counts the times the input was restarted by an outer repeat when reshuffle_each_iteration is
 * non-zero (else 0: every pass has the same order). MR_ERR_INVALID if buffer < 1. */
mr_status mr_data_shuffle(mr_dataset *in, int64_t buffer, uint64_t seed, int reshuffle_each_iteration,
                          mr_dataset **out) MR_WUR;

/* Element-wise map: fn(ctx, in, out, index, epoch) fills out[c] (one element of out_spec
 * component c) from in[c] (one element of the input spec). index is the source element index and
 * epoch the number of times the source was restarted (so augmentations can draw from Philox
 * deterministically). fn must be thread-safe and pure. parallel: threads materializing elements
 * (MR_DATA_AUTO: autotuned up to OpenMP's max, see mr_data_iter_stats); the largest parallel of a pipeline's maps applies to the whole
 * materialization (source read + maps). Maps must come before batch (MR_ERR_UNSUPPORTED after).
 * MR_ERR_INVALID if fn is NULL, out_spec is bad or parallel < 0. */
typedef mr_status (*mr_data_map_fn)(void *ctx, const void *const in[], void *const out[], int64_t index,
                                    int64_t epoch);
mr_status mr_data_map(mr_dataset *in, mr_data_map_fn fn, void *ctx, const mr_data_spec *out_spec, int parallel,
                      mr_dataset **out) MR_WUR;

/* Groups `size` consecutive elements, adding a leading dim. The last batch of a pass holds the
 * remaining elements (leading dim < size) unless drop_remainder is non-zero, which drops it.
 * One batch per pipeline (MR_ERR_UNSUPPORTED for a second). MR_ERR_INVALID if size < 1. */
mr_status mr_data_batch(mr_dataset *in, int64_t size, int drop_remainder, mr_dataset **out) MR_WUR;

/* Materializes up to n elements (batches) ahead on a background thread (MR_DATA_AUTO: autotuned from 2, see mr_data_iter_stats). Order
 * and contents are unchanged; several prefetches act as one with the largest n.
 * MR_ERR_INVALID if n < 0. */
mr_status mr_data_prefetch(mr_dataset *in, int64_t n, mr_dataset **out) MR_WUR;

/* Repeats the input count times (-1: forever; 0: empty). An input that is empty in a pass ends
 * the repetition. MR_ERR_INVALID if count < -1. */
mr_status mr_data_repeat(mr_dataset *in, int64_t count, mr_dataset **out) MR_WUR;

/* The first n elements / all but the first n. MR_ERR_INVALID if n < 0. */
mr_status mr_data_take(mr_dataset *in, int64_t n, mr_dataset **out) MR_WUR;
mr_status mr_data_skip(mr_dataset *in, int64_t n, mr_dataset **out) MR_WUR;

/* Keeps every element of `in` in memory once materialized (keyed by source index), so later
 * passes skip the reads and maps before it. `in` must be a source followed only by maps (and
 * prefetch): cache before shard, shuffle, batch and the rest (MR_ERR_UNSUPPORTED otherwise). As in
 * tf.data the cached value is reused in every epoch, so the maps before cache must not depend on
 * the epoch: they are called with epoch 0; put random augmentation after cache. The cache is a new
 * random-access source (its index and state behave like any source); memory grows to all elements
 * touched. Thread-safe. MR_ERR_NOMEM. */
mr_status mr_data_cache(mr_dataset *in, mr_dataset **out) MR_WUR;

/* tf.data's deterministic interleave over n inputs (e.g. one token file each): `cycle` inputs are
 * open at a time (the first `cycle` in order), `block` consecutive elements are taken from each in
 * turn; an exhausted input is closed and the next unopened one takes its cycle slot on the slot's
 * next turn. The order is fixed by the inputs' sizes, so the result is a random-access source of
 * sum(sizes) elements (its state is a source counter; shuffle it like any source). Every input must
 * be a source followed only by maps (called with epoch 0), all with the same element spec.
 * Retains every input. MR_ERR_INVALID (n < 1, cycle < 1, block < 1, specs differ),
 * MR_ERR_UNSUPPORTED (an input with other transforms), MR_ERR_NOMEM. */
mr_status mr_data_interleave(mr_dataset *const *sources, int n, int64_t cycle, int64_t block, mr_dataset **out) MR_WUR;

/* Drops a reference. NULL is a no-op. */
void mr_data_free(mr_dataset *ds);

/* The spec of one output element (for a batched pipeline: per element, without the batch dim),
 * and the batch size (0 when unbatched). */
const mr_data_spec *mr_data_element_spec(const mr_dataset *ds);
int64_t mr_data_batch_size(const mr_dataset *ds);
/* Elements in the pipeline's underlying source (before any transform; for interleave, the sum of
 * its inputs): an epoch's length for progress and checkpoint metadata. */
int64_t mr_data_source_size(const mr_dataset *ds);
/* Hash of the pipeline's structure (sources' kind, size and spec; transforms and their parameters,
 * except thread counts and prefetch depth, which do not change the sequence). */
uint64_t mr_data_structure_hash(const mr_dataset *ds);

/* ---- iterator ------------------------------------------------------------------------------- */

/* One delivered element or batch: component c has data[c], of dtype[c] and shape[c] (with the
 * leading batch dim, which is < the batch size for a final partial batch). */
typedef struct mr_data_elem {
    int n;
    void *data[MR_DATA_MAX_COMPONENTS];
    mr_dtype dtype[MR_DATA_MAX_COMPONENTS];
    mr_shape shape[MR_DATA_MAX_COMPONENTS];
} mr_data_elem;

/* New iterator at the start of the dataset (retains ds). No thread starts before the first next.
 * MR_ERR_NOMEM. Iterators are not thread-safe: use each from one thread at a time. */
mr_status mr_data_iter_new(mr_dataset *ds, mr_data_iter **out) MR_WUR;

/* Next element (batch). On success *end is 0 and out describes iterator-owned buffers valid until
 * the next call on it (next, restore, free), or *end is 1 at the end of the data (every later call
 * says end again). Errors (a source or map failure) are sticky: this and every later next returns
 * the same status and message. */
mr_status mr_data_iter_next(mr_data_iter *it, mr_data_elem *out, int *end) MR_WUR;

/* Same, copying component c into bufs[c] (room for one full batch / element); out may be NULL. */
mr_status mr_data_iter_next_into(mr_data_iter *it, void *const bufs[], mr_data_elem *out, int *end) MR_WUR;

/* Number of elements (batches) delivered since the start (counting those before a restore). */
int64_t mr_data_iter_position(const mr_data_iter *it);

/* Serializes the state after the last delivered element into a malloc'd blob (*blob, *bytes;
 * the caller frees it with free()). Layout: u32 magic "MRDI", u32 version, u64 structure hash,
 * per-stage records; little-endian. MR_ERR_NOMEM; MR_ERR_INVALID on a failed iterator. */
mr_status mr_data_iter_save(const mr_data_iter *it, void **blob, size_t *bytes) MR_WUR;

/* Restores a blob from mr_data_iter_save of an iterator over a pipeline of the same structure:
 * the next element delivered is the one that followed the save. Stops and drains the prefetch
 * thread first. MR_ERR_FORMAT (bad magic, version, truncated, an out-of-range field, naming the
 * byte offset), MR_ERR_INVALID (structure hash differs: another pipeline). On error the iterator
 * is reset to the start of the data. */
mr_status mr_data_iter_restore(mr_data_iter *it, const void *blob, size_t bytes) MR_WUR;

/* World-independent state of a replicated pipeline: the same iterator state whatever the number of
 * replicas, so a run checkpointed by N replicas resumes on M and consumes exactly the elements the
 * uninterrupted run would have (docs/DESIGN.md, "Data pipeline determinism").
 *
 * The pipeline must be ORDER -> shard(n, i)? -> (map, batch, prefetch)*: ORDER is the "global"
 * pipeline (any sources and transforms, no shard), followed by at most one shard and then only
 * stateless stages. The global sequence is ORDER's output; replica i of n takes its elements
 * i, n + i, 2n + i, ... Saving assumes every replica has delivered the same number k of its
 * shard's elements (the replicas run in lockstep, as the trainer's do): the blob is ORDER's state
 * after global element k*n (the saver advances its copy of ORDER over the other replicas' elements,
 * index arithmetic only), so every replica writes the same bytes. Restoring into
 * ORDER -> shard(m, j) -> ... (any m, j; the same ORDER, checked by its structure hash) makes
 * global element k*n the next one of replica 0: replica j delivers k*n + j, k*n + m + j, ...
 * Layout: u32 magic "MRDG", u32 version, u64 ORDER's structure hash, u32 ORDER's stage count, the
 * per-stage records of mr_data_iter_save; little-endian. mr_data_iter_position restarts at 0.
 * Errors: MR_ERR_UNSUPPORTED (another pipeline shape: a shard below a stateful transform, two
 * shards, take/skip/repeat/shuffle after the shard), MR_ERR_NOMEM, MR_ERR_INVALID (a failed
 * iterator; on restore: another ORDER), MR_ERR_FORMAT (bad magic, version, truncated, an
 * out-of-range field, naming the byte offset). On a restore error the iterator is at the start. */
mr_status mr_data_iter_save_global(const mr_data_iter *it, void **blob, size_t *bytes) MR_WUR;
mr_status mr_data_iter_restore_global(mr_data_iter *it, const void *blob, size_t bytes) MR_WUR;

/* The source indices (idx[j]) and source epochs (epoch[j]: the times the source was restarted by a
 * repeat) of the elements of the last delivered element or batch, in order: returns their count
 * (at most cap are written; either array may be NULL), 0 before the first delivery. For logs and
 * tests that check which samples a run consumed. */
int64_t mr_data_iter_last_indices(const mr_data_iter *it, int64_t *idx, int64_t *epoch, int64_t cap);

/* What an iterator measured since it started (or since its last restore). */
typedef struct mr_data_stats {
    int64_t elements;      /* elements (batches) delivered by next() */
    int64_t produced;      /* elements (batches) materialized (delivered + queued ahead) */
    double produce_s;      /* seconds the producer spent materializing (not waiting for room) */
    double producer_rate;  /* produced / produce_s: elements (batches) per second the pipeline can
                              make; 0 before the first round */
    double wait_s;         /* seconds the consumer spent blocked inside next() waiting for data (with
                              no prefetch: materializing it itself): the starved-accelerator time */
    double elapsed_s;      /* seconds since the first next() */
    int map_parallel;      /* threads materializing now */
    int64_t prefetch;      /* prefetch depth in use now (0: no prefetch) */
    int map_parallel_auto; /* non-zero when map_parallel is autotuned (a map said MR_DATA_AUTO) */
    int prefetch_auto;     /* non-zero when the depth is autotuned (a prefetch said MR_DATA_AUTO) */
} mr_data_stats;

/* Fills *out with it's counters. Costs a few clock reads per batch to maintain; reading them
 * takes the iterator's lock briefly. Call it from the iterator's thread (like every call on an
 * iterator). MR_ERR_INVALID on NULL arguments.
 *
 * Autotune. Only speed is tuned, never the order: elements are always delivered in sequence order,
 * so an autotuned pipeline yields exactly the bytes of the same pipeline with fixed values, and
 * save/restore are unchanged.
 * - prefetch(MR_DATA_AUTO): the depth starts at 2. After each window of 8 deliveries (past the
 *   first fill) in which the consumer found the queue empty at least twice, the depth doubles, up
 *   to a bound of 16 batches, or less when the batches are large: the queue's buffers stay under
 *   64 MiB (never below 2). Buffers are allocated as the depth grows, so a consumer that never
 *   waits keeps a queue of 2 (+1 being read).
 * - map(parallel = MR_DATA_AUTO): P starts at OpenMP's max threads (omp_get_max_threads(), the
 *   bound it never exceeds; the largest fixed parallel of the pipeline's other maps is the floor).
 *   After every window of 8 deliveries it is re-chosen as
 *   P = ceil(1.5 * cost / consumer), where cost is the measured thread-seconds to materialize
 *   one element (batch) and consumer the measured seconds the consumer spends per element outside
 *   next(): enough threads to stay 1.5x ahead of the consumer, and no more (the rest of the cores
 *   stay with the training step). A consumer that spends ~0 outside next() gets the max. */
mr_status mr_data_iter_stats(const mr_data_iter *it, mr_data_stats *out) MR_WUR;

/* Traces the prefetch thread (core/trace.h; NULL: not): a span "produce" per round it
 * materializes (arg items: the elements or batches of the round) on track k, which only that
 * thread writes (an iterator without prefetch records nothing). Thread-safe against the producer;
 * k must outlive the iterator. */
void mr_data_iter_set_trace(mr_data_iter *it, struct mr_trace_track *k);

/* Stops the prefetch thread and frees the iterator (releases its dataset). NULL is a no-op. */
void mr_data_iter_free(mr_data_iter *it);

#ifdef __cplusplus
}
#endif
#endif
