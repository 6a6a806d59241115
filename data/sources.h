/* More file sources for mirror's input pipeline (data/data.h): NumPy .npy/.npz arrays, TFRecord
 * files of tf.train.Example, and sharded file sets (a glob or a list read as one dataset).
 *
 * Every source here is random-access by element index like those of data/data.h, so shuffle,
 * shard, the state blobs and exact resume work unchanged. Errors name the user's file and the byte
 * offset or record number, and carry a "; HINT: ..." where the remedy is known.
 *
 * Ownership and threads as in data/data.h: on error *out is NULL and nothing is retained; element
 * reads are thread-safe. C11 and C++ clean; includes no HDF5 or protobuf header. */
#ifndef MR_DATA_SOURCES_H
#define MR_DATA_SOURCES_H

#include "data/data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NumPy arrays, one per component: paths[c] is a .npy file, or a .npz archive when members[c] is
 * not NULL (the member "x" or "x.npy"; stored or deflated, as np.savez / np.savez_compressed
 * write them). The first dim is the element count (all must agree), the rest the per-element
 * shape; component c is named names[c]. dtype, shape and order come from the header: u1 -> MR_U8,
 * i4, i8, f2, f4, f8 as they are; i1, i2, u2, b1 widen exactly to i32 and u4 to i64 (as
 * mr_data_from_hdf5). Little-endian (or byte-sized) only. A .npy (and a stored .npz member) is
 * memory-mapped; a deflated member is inflated into memory once. Errors name the file (and member)
 * and the byte offset: MR_ERR_NOT_FOUND (missing file or member), MR_ERR_IO, MR_ERR_FORMAT (bad
 * magic, header, truncated data, first dims differ, rank 0, a corrupt zip), MR_ERR_UNSUPPORTED
 * (Fortran order, object or other dtypes, big-endian, zip64 beyond 4 GiB members),
 * MR_ERR_INVALID (n outside 1..4, NULL paths or names). */
mr_status mr_data_from_npy(const char *const paths[], const char *const members[], const char *const names[], int n,
                           mr_dataset **out) MR_WUR;

/* One feature of a tf.train.Example read as a component. */
typedef struct mr_tfrecord_feature {
    const char *key;  /* the feature's name in the Example ("image/encoded_raw") */
    const char *name; /* the component's name ("image") */
    mr_dtype dtype;   /* MR_U8: a bytes_list of one raw value; MR_I64 or MR_I32 (range-checked): an int64_list;
                         MR_F32: a float_list */
    mr_shape shape;   /* per element; ndim -1: from record 0 ([] for one value, else [count]) */
} mr_tfrecord_feature;

/* A TFRecord file of tf.train.Example records (plain, or GZIP-compressed: detected from the
 * content), one element per record, component c from features[c]. Opening reads the file
 * (memory-mapped; a GZIP file is inflated into memory) and indexes every record, verifying the
 * length CRCs; each read verifies the record's data CRC and decodes it with protobuf-c. Errors
 * name the file, the record and its byte offset: MR_ERR_NOT_FOUND, MR_ERR_IO, MR_ERR_FORMAT (a
 * CRC mismatch, a truncated record or gzip stream, not an Example, a missing feature, a feature of
 * another list kind than the dtype reads, a value count that differs from record 0's or the
 * shape's, an int64 outside int32 for MR_I32, no records), MR_ERR_INVALID (n outside 1..4, a
 * missing key or name, a dtype not listed). A record that fails later fails next(). */
mr_status mr_data_from_tfrecord(const char *path, const mr_tfrecord_feature *features, int n, mr_dataset **out) MR_WUR;

/* The files a pattern names, in a fixed order: a pattern with *, ? or [ is a glob (glob(3),
 * sorted by name; no match is MR_ERR_NOT_FOUND naming the pattern); otherwise the one path (which
 * need not exist: the source reports it). The list is '\n'-separated, or the literal path; *paths
 * is a malloc'd array of n malloc'd strings (free with mr_data_paths_free). MR_ERR_NOMEM. */
mr_status mr_data_expand_paths(const char *pattern, char ***paths, int *n) MR_WUR;
void mr_data_paths_free(char **paths, int n); /* NULL is a no-op */

/* One dataset that reads the n inputs one after the other (input 0's elements, then input 1's,
 * ...): a random-access source of the summed size whose file boundaries are invisible to shuffle,
 * shard and resume (mr_data_interleave with cycle 1). n == 1 returns inputs[0] retained. Retains
 * every input. Errors as mr_data_interleave (specs must agree). */
mr_status mr_data_concat(mr_dataset *const *inputs, int n, mr_dataset **out) MR_WUR;

/* A classifier's view of a 2-component source: ("image" unchanged, "label" i32 []) from `in`
 * whose component 1 is an integer (u8, i32, i64) of one value per element (shape [] or [1]).
 * `in` must be a source (no transforms; MR_ERR_UNSUPPORTED otherwise); the result is a new source
 * reading it (retains in). When in is already ("image", "label" i32 []), *out is in, retained.
 * what names the data in messages: MR_ERR_FORMAT (not 2 components, a label of several values),
 * MR_ERR_UNSUPPORTED (a float label); a label outside int32 fails next() naming the element. */
mr_status mr_data_as_classes(mr_dataset *in, const char *what, mr_dataset **out) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
