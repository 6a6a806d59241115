/* Private to checkpoint/: the HDF5 plumbing shared by the writer (ckpt_file.c) and the two halves
 * of the reader (ckpt_meta.c: open, objects, attributes, listing; ckpt_read.c: datasets, verify).
 * Includes hdf5.h, so it stays out of the public header. */
#ifndef MR_CKPT_IMPL_H
#define MR_CKPT_IMPL_H

#include <stdint.h>
#include <stdio.h>

#include <hdf5.h>

#include "checkpoint/ckpt.h"
#include "core/h5_impl.h" /* mr_h5_enter/leave/reason, MR_TRY_H5 */

/* zlib's crc32 over the raw bytes of a dataset assumes the host stores them little-endian, as the
 * file does (datasets are written as *LE types from native memory without conversion). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint/: the crc32 of datasets is defined on little-endian bytes; add byte swapping for this host"
#endif

/* A file-access property list (close with H5Pclose): closing the file closes every object still
 * open in it; no POSIX file locks (checkpoints are never written in place, and locks fail on some
 * parallel file systems). Negative on failure. */
hid_t ckpt_h5_fapl(void);

/* zlib crc32 continued over n bytes (any n; zlib takes 32-bit lengths). Start with crc = 0. */
uint32_t ckpt_crc32(uint32_t crc, const void *p, size_t n);

struct mr_ckpt_reader {
    hid_t file;
    int flags; /* MR_CKPT_FOREIGN or 0 */
    char path[]; /* for messages */
};

/* A dataset or group path relative to the root: without its leading '/'. */
static inline const char *ckpt_rel(const char *p) { return p[0] == '/' ? p + 1 : p; }

/* The object type at path (HDF5 calls in progress): H5O_TYPE_UNKNOWN when nothing is there. */
H5O_type_t ckpt_obj_type(hid_t file, const char *path);

/* The string attribute `name` of obj into a malloc'd *out (HDF5 calls in progress). Errors
 * naming file and attribute: MR_ERR_NOT_FOUND, MR_ERR_INVALID (not a string or not one value),
 * MR_ERR_FORMAT (unreadable), MR_ERR_NOMEM. */
mr_status ckpt_attr_get_str(hid_t obj, const char *file, const char *name, char **out);
/* An integer (or, when allow_float, float) attribute read as memory type mt into *out. Errors as
 * ckpt_attr_get_str. */
mr_status ckpt_attr_get_num(hid_t obj, const char *file, const char *name, hid_t mt, int allow_float, void *out);

#endif
