/* Checkpoint files: one HDF5 file per step, readable by h5py, written atomically.
 *
 * Layout (see docs/DESIGN.md "Checkpoint"): datasets at slash paths relative to the root
 * ("params/fc1.weight", "buffers/3.running_mean", "optimizer/fc1.weight/exp_avg",
 * "state/data_iter/0"; train/train_ckpt.c decides them), each with a uint32
 * attribute "crc32" (zlib crc32 of its raw little-endian bytes); root attributes for step, epoch,
 * loss scale, RNG states, world size, the experiment's YAML text, and the two the writer adds
 * itself: "format" = "mirror-checkpoint" and "format_version" = 1. Datasets are contiguous
 * little-endian f32/f64/i32/i64/u8; strings are variable-length UTF-8 scalars (h5py gives str).
 *
 * A writer collects borrowed arrays and copies of small things, then writes them all in one call:
 * to "<path>.tmp.<pid>", flushed, closed, fsync'ed, renamed onto path, directory fsync'ed. A reader
 * never sees a half-written file under a checkpoint name; a crash leaves at most a temp file, which
 * mr_ckpt_prune removes once its writer is dead.
 *
 * Thread safety: a writer or reader handle is used by one thread at a time (mr_ckpt_writer_write
 * only reads the writer, so several threads may write one writer to different paths). Different
 * handles may be used from different threads at once: every HDF5 call runs under mirror's one
 * process-wide HDF5 lock (core/h5_impl.h, shared with data/'s HDF5 source). Errors are
 * reported through mr_last_error() of the calling thread; HDF5's own error printing is silenced
 * on every thread that calls in here. */
#ifndef MR_CKPT_H
#define MR_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The value of the root attribute "format", and the newest "format_version" this build reads. */
#define MR_CKPT_FORMAT "mirror-checkpoint"
#define MR_CKPT_FORMAT_VERSION 1

/* ---- writing -------------------------------------------------------------------------------- */

typedef struct mr_ckpt_writer mr_ckpt_writer;

/* A new, empty writer in *out (NULL on error). MR_ERR_INVALID (out NULL), MR_ERR_NOMEM. */
mr_status mr_ckpt_writer_new(mr_ckpt_writer **out) MR_WUR;

/* Frees the writer, its blob copies and attribute copies (never the borrowed arrays). NULL: no-op. */
void mr_ckpt_writer_free(mr_ckpt_writer *w);

/* Adds a dataset at a slash path relative to the root ("params/fc1.weight"; a leading '/' is
 * ignored; intermediate groups are created; components may contain dots but may not be empty,
 * "." or ".."). dt: MR_F32, MR_F64, MR_I32, MR_I64 or MR_U8. data holds numel(shape) elements of
 * dt, row-major (NULL allowed only when numel is 0); it is BORROWED until mr_ckpt_writer_write
 * returns, and must not change until then. The path and shape are copied.
 * Errors (the writer is unchanged): MR_ERR_INVALID naming the path for a bad path, a duplicate
 * path, a path that is a group of another dataset ("a/b" and "a/b/c"), a bad shape or dtype;
 * MR_ERR_NOMEM. */
mr_status mr_ckpt_writer_add(mr_ckpt_writer *w, const char *path, mr_dtype dt, const mr_shape *shape,
                             const void *data) MR_WUR;

/* Opaque bytes (a data-iterator state blob; may be large) stored as a 1-D u8 dataset at path. The
 * bytes are COPIED now (bytes may be NULL when n is 0). Errors as mr_ckpt_writer_add. */
mr_status mr_ckpt_writer_add_blob(mr_ckpt_writer *w, const char *path, const void *bytes, size_t n) MR_WUR;

/* Root-group attributes (name and value copied). Strings are stored as variable-length UTF-8
 * scalars (value must be valid UTF-8; it is not checked); integers as int64, floats as double.
 * MR_ERR_INVALID for an empty or duplicate name or one of the reserved "format",
 * "format_version"; MR_ERR_NOMEM. On error the writer is unchanged. */
mr_status mr_ckpt_writer_attr_str(mr_ckpt_writer *w, const char *name, const char *value) MR_WUR;
mr_status mr_ckpt_writer_attr_i64(mr_ckpt_writer *w, const char *name, int64_t v) MR_WUR;
mr_status mr_ckpt_writer_attr_f64(mr_ckpt_writer *w, const char *name, double v) MR_WUR;

/* Writes everything added so far to path, atomically: to "<path>.tmp.<pid>" in the same directory
 * (contiguous datasets, each with its "crc32" attribute; "format" and "format_version" added),
 * H5Fflush + H5Fclose, fsync of the file, rename(2) onto path, fsync of the directory. The writer
 * is unchanged and may be written again. Two writes of the same path must not run at once.
 * Errors: MR_ERR_INVALID (NULL argument); MR_ERR_IO for any failure to create, write, flush, sync
 * or rename (full disk, file size limit, permission, HDF5 error), with a message naming the path
 * and the reason (strerror of the underlying errno where there is one: "No space left on
 * device"); MR_ERR_NOMEM. On every error the temp file is removed and an existing file at path is
 * left untouched (the one exception: when only the final directory fsync fails, the new file is
 * already in place; the message says so). */
mr_status mr_ckpt_writer_write(const mr_ckpt_writer *w, const char *path) MR_WUR;

/* ---- reading -------------------------------------------------------------------------------- */

typedef struct mr_ckpt_reader mr_ckpt_reader;

/* Flag for mr_ckpt_open: accept any HDF5 file. No "format" attribute is required and datasets
 * without a "crc32" attribute are read unchecked (init_from files written by h5py from a PyTorch
 * state_dict). Datasets that do carry "crc32" are still checked. */
#define MR_CKPT_FOREIGN 1

/* Opens a checkpoint for reading into *out (NULL on error). flags: 0 or MR_CKPT_FOREIGN.
 * Errors (each message names the file): MR_ERR_NOT_FOUND (no such file), MR_ERR_IO (cannot read
 * it: permission), MR_ERR_FORMAT (not HDF5, truncated or corrupt, no "format" attribute equal to
 * MR_CKPT_FORMAT, or a "format_version" other than 1..MR_CKPT_FORMAT_VERSION), MR_ERR_INVALID
 * (NULL argument, unknown flag), MR_ERR_NOMEM. */
mr_status mr_ckpt_open(const char *path, int flags, mr_ckpt_reader **out) MR_WUR;

/* Closes the file. NULL: no-op. */
void mr_ckpt_close(mr_ckpt_reader *r);

/* 1 when a dataset exists at path (a leading '/' is ignored), 0 otherwise (a group, nothing, or
 * an error reading the file). Never changes mr_last_error(). */
int mr_ckpt_has(const mr_ckpt_reader *r, const char *path);

/* The mirror dtype and the shape of the dataset at path. HDF5 floats of 4/8 bytes map to
 * MR_F32/MR_F64; u8 to MR_U8; i8, i16, u16, i32 to MR_I32; u32, i64 to MR_I64 (the types they
 * read as exactly). Scalars give ndim 0.
 * Errors naming the dataset: MR_ERR_NOT_FOUND (no dataset there), MR_ERR_UNSUPPORTED (f16, u64,
 * strings, compounds...), MR_ERR_FORMAT (more than MR_MAX_DIMS dims, unreadable header). */
mr_status mr_ckpt_info(const mr_ckpt_reader *r, const char *path, mr_dtype *dt, mr_shape *shape) MR_WUR;

/* Reads the dataset at path into dst (numel(*shape) elements of dt, caller's storage). The shape
 * in the file must equal *shape. dt must be the dataset's dtype (mr_ckpt_info), or, converting:
 * MR_F32 <-> MR_F64 (a C cast: rounds to nearest, overflows to inf), or a wider integer type
 * (u8 -> i32/i64, i32 -> i64). When the dataset has a "crc32" attribute the stored bytes are
 * checked against it (a conversion then needs a temporary buffer of the stored size).
 * Errors naming the dataset: MR_ERR_NOT_FOUND; MR_ERR_INVALID for a shape mismatch
 * ("'params/fc1.weight': shape (10,784) in the file, (10,785) expected") or a dtype that cannot
 * be read; MR_ERR_FORMAT for "checksum mismatch (stored 0x.., computed 0x..)" or a read error
 * (truncated/corrupt file); MR_ERR_UNSUPPORTED; MR_ERR_NOMEM. dst may be partly written on error. */
mr_status mr_ckpt_read(const mr_ckpt_reader *r, const char *path, mr_dtype dt, const mr_shape *shape,
                       void *dst) MR_WUR;

/* The datasets below group ("" or "/" for the whole file), recursively, as paths relative to
 * group, sorted by strcmp ("fc1.bias", "fc1.weight", "layer/a/b"). *names is a malloc'd array of
 * *n malloc'd strings (NULL with n = 0 when empty); free with mr_ckpt_names_free.
 * Errors: MR_ERR_NOT_FOUND (no such group), MR_ERR_INVALID (group is a dataset),
 * MR_ERR_FORMAT (corrupt file), MR_ERR_NOMEM; *names = NULL, *n = 0 then. */
mr_status mr_ckpt_list(const mr_ckpt_reader *r, const char *group, char ***names, int *n) MR_WUR;

/* Frees a list from mr_ckpt_list or mr_ckpt_attr_names. names NULL: no-op. */
void mr_ckpt_names_free(char **names, int n);

/* Root attributes. _str: a malloc'd copy of a string attribute (variable or fixed length) in *out.
 * _i64: an integer attribute. _f64: a float or integer attribute. Scalars or one-element arrays.
 * Errors naming the attribute: MR_ERR_NOT_FOUND (no such attribute), MR_ERR_INVALID (another
 * type), MR_ERR_FORMAT (unreadable), MR_ERR_NOMEM. */
mr_status mr_ckpt_attr_str(const mr_ckpt_reader *r, const char *name, char **out) MR_WUR;
mr_status mr_ckpt_attr_i64(const mr_ckpt_reader *r, const char *name, int64_t *out) MR_WUR;
mr_status mr_ckpt_attr_f64(const mr_ckpt_reader *r, const char *name, double *out) MR_WUR;

/* Attribute names of the root group, sorted (for `mirror inspect`); free with mr_ckpt_names_free.
 * Errors: MR_ERR_FORMAT, MR_ERR_NOMEM. */
mr_status mr_ckpt_attr_names(const mr_ckpt_reader *r, char ***names, int *n) MR_WUR;

/* A blob from mr_ckpt_writer_add_blob (any 1-D u8 dataset): *bytes malloc'd (free()), never NULL
 * on success, even for n = 0. Errors as mr_ckpt_read, MR_ERR_INVALID if it is not 1-D u8. */
mr_status mr_ckpt_read_blob(const mr_ckpt_reader *r, const char *path, void **bytes, size_t *n) MR_WUR;

/* Opens path as a mirror checkpoint and reads every dataset (in blocks of a few MB, so memory
 * stays small), checking that each has a "crc32" attribute and that it matches. MR_OK when the
 * file is a complete, intact checkpoint; otherwise the error of mr_ckpt_open, or MR_ERR_FORMAT
 * naming the file and the first bad dataset. */
mr_status mr_ckpt_verify(const char *path) MR_WUR;

/* ---- directories of checkpoints: files named ckpt-%08lld.h5 ------------------------------- */

/* Writes "<dir>/ckpt-<step as %08lld>.h5" into buf (NUL-terminated, truncated to cap). */
void mr_ckpt_path(const char *dir, int64_t step, char *buf, size_t cap);

/* Steps of the checkpoint files in dir, ascending: names exactly as mr_ckpt_path writes them
 * (ckpt-<8 or more digits>.h5, step >= 0); temp files and other names are ignored. A missing dir
 * gives *steps = NULL, *n = 0 and MR_OK. *steps is malloc'd (free()). MR_ERR_IO naming dir
 * (cannot list it), MR_ERR_NOMEM. */
mr_status mr_ckpt_scan(const char *dir, int64_t **steps, int *n) MR_WUR;

/* The newest checkpoint in dir that passes mr_ckpt_verify: its path in path (cap bytes), its step
 * in *step, *found = 1. Each newer file that fails is skipped with an mr_log_warn naming the file
 * and the reason. *found = 0 (MR_OK) when there is none. Errors as mr_ckpt_scan, MR_ERR_INVALID
 * when cap is too small for the path. Reads every dataset of the files it checks. */
mr_status mr_ckpt_latest(const char *dir, char *path, size_t cap, int64_t *step, int *found) MR_WUR;

/* Deletes all but the newest `keep` checkpoint files (keep >= 1; files are counted by name, not
 * verified) and the temp files "ckpt-<digits>.h5.tmp.<pid>" whose pid is not a live process on
 * this machine (kill(pid, 0) fails with ESRCH). Call it from the one process that writes into dir.
 * A missing dir is MR_OK. Errors: MR_ERR_INVALID (keep < 1), MR_ERR_IO naming the file that could
 * not be deleted (the others are still tried). */
mr_status mr_ckpt_prune(const char *dir, int keep) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
