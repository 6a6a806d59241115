/* Checkpoint writer: collects datasets (borrowed arrays, copied blobs) and root attributes, then
 * writes them in one call to a temporary file that is flushed, fsync'ed and renamed over the
 * target, so a checkpoint name only ever holds a complete file (docs/DESIGN.md "Checkpoint").
 *
 * The writer keeps only small things of its own (paths, shapes, attribute values, blob copies);
 * the arrays go from the caller's memory to the file in one contiguous H5Dwrite each, with no
 * conversion (native little-endian types = file types), so a large checkpoint writes at disk speed.
 * Every dataset gets a "crc32" attribute (zlib crc32 of its bytes) that the reader checks.
 *
 * Also home of the HDF5 helpers of ckpt_impl.h (error silencing, reasons, crc). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "checkpoint/ckpt_impl.h"

/* ---- HDF5 helpers (ckpt_impl.h) --------------------------------------------------------------- */

hid_t ckpt_h5_fapl(void) {
    hid_t p = H5Pcreate(H5P_FILE_ACCESS);
    if (p < 0) return p;
    int bad = H5Pset_fclose_degree(p, H5F_CLOSE_STRONG) < 0;
#if H5_VERSION_GE(1, 10, 7)
    bad |= H5Pset_file_locking(p, 0, 1) < 0;
#endif
    if (bad) {
        H5Pclose(p);
        return -1;
    }
    return p;
}

uint32_t ckpt_crc32(uint32_t crc, const void *p, size_t n) {
    const unsigned char *b = p;
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, b, k);
        b += k;
        n -= k;
    }
    return crc;
}

/* ---- the writer ------------------------------------------------------------------------------ */

typedef struct ck_entry {
    char *path; /* normalised: no leading '/' */
    mr_dtype dt;
    mr_shape shape;
    const void *data; /* borrowed, or == owned for a blob */
    void *owned;
} ck_entry;

enum { CK_STR, CK_I64, CK_F64 };

typedef struct ck_attr {
    char *name;
    int kind;
    char *s;
    int64_t i;
    double f;
} ck_attr;

struct mr_ckpt_writer {
    ck_entry *e;
    int n, cap;
    ck_attr *a;
    int na, acap;
};

mr_status mr_ckpt_writer_new(mr_ckpt_writer **out) {
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_writer_new: out is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out) return mr_set_error(MR_ERR_NOMEM, "mr_ckpt_writer_new: out of memory");
    return MR_OK;
}

void mr_ckpt_writer_free(mr_ckpt_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->e[i].path);
        free(w->e[i].owned);
    }
    for (int i = 0; i < w->na; i++) {
        free(w->a[i].name);
        free(w->a[i].s);
    }
    free(w->e);
    free(w->a);
    free(w);
}

/* Checks a dataset path and returns it without its leading '/' (in the caller's string). */
static mr_status check_path(const char *path, const char **norm) {
    if (!path) return mr_set_error(MR_ERR_INVALID, "checkpoint: dataset path is NULL");
    const char *p = path[0] == '/' ? path + 1 : path;
    if (!p[0]) return mr_set_error(MR_ERR_INVALID, "checkpoint: dataset path '%s' is empty", path);
    for (const char *c = p; *c;) {
        const char *end = strchr(c, '/');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return mr_set_error(MR_ERR_INVALID, "checkpoint: dataset path '%s' has an empty, '.' or '..' component",
                                path);
        c += len;
        if (*c == '/') {
            c++;
            if (!*c) return mr_set_error(MR_ERR_INVALID, "checkpoint: dataset path '%s' ends with '/'", path);
        }
    }
    *norm = p;
    return MR_OK;
}

/* Non-zero when a is a group prefix of b ("a/b" of "a/b/c"). */
static int is_group_of(const char *a, const char *b) {
    size_t la = strlen(a);
    return strncmp(a, b, la) == 0 && b[la] == '/';
}

static mr_status add_entry(mr_ckpt_writer *w, const char *path, mr_dtype dt, const mr_shape *shape, const void *data,
                           void *owned) {
    const char *p = NULL;
    mr_status st = check_path(path, &p);
    if (st != MR_OK) return st;
    if (dt != MR_F32 && dt != MR_F64 && dt != MR_I32 && dt != MR_I64 && dt != MR_U8)
        return mr_set_error(MR_ERR_INVALID, "checkpoint: dataset '%s': dtype %s cannot be stored (f32, f64, i32, i64, u8)",
                            p, mr_dtype_name(dt));
    if (!shape || shape->ndim < 0 || shape->ndim > MR_MAX_DIMS)
        return mr_set_error(MR_ERR_INVALID, "checkpoint: dataset '%s': bad shape", p);
    for (int d = 0; d < shape->ndim; d++)
        if (shape->dim[d] < 0) return mr_set_error(MR_ERR_INVALID, "checkpoint: dataset '%s': negative size", p);
    if (!data && mr_shape_numel(shape) > 0)
        return mr_set_error(MR_ERR_INVALID, "checkpoint: dataset '%s': data is NULL", p);
    for (int i = 0; i < w->n; i++) {
        const char *q = w->e[i].path;
        if (!strcmp(p, q)) return mr_set_error(MR_ERR_INVALID, "checkpoint: duplicate dataset '%s'", p);
        if (is_group_of(p, q) || is_group_of(q, p))
            return mr_set_error(MR_ERR_INVALID, "checkpoint: dataset '%s' clashes with dataset '%s' (one would be a "
                                "group of the other)", p, q);
    }
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        ck_entry *e = realloc(w->e, sizeof *e * (size_t)cap);
        if (!e) return mr_set_error(MR_ERR_NOMEM, "checkpoint: out of memory adding '%s'", p);
        w->e = e;
        w->cap = cap;
    }
    ck_entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->path = strdup(p);
    if (!e->path) return mr_set_error(MR_ERR_NOMEM, "checkpoint: out of memory adding '%s'", p);
    e->dt = dt;
    e->shape = *shape;
    for (int d = shape->ndim; d < MR_MAX_DIMS; d++) e->shape.dim[d] = 0;
    e->data = data;
    e->owned = owned;
    w->n++;
    return MR_OK;
}

mr_status mr_ckpt_writer_add(mr_ckpt_writer *w, const char *path, mr_dtype dt, const mr_shape *shape,
                             const void *data) {
    if (!w) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_writer_add: writer is NULL");
    return add_entry(w, path, dt, shape, data, NULL);
}

mr_status mr_ckpt_writer_add_blob(mr_ckpt_writer *w, const char *path, const void *bytes, size_t n) {
    if (!w) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_writer_add_blob: writer is NULL");
    if (!bytes && n > 0) return mr_set_error(MR_ERR_INVALID, "checkpoint: blob '%s': bytes is NULL", path ? path : "?");
    void *copy = malloc(n ? n : 1);
    if (!copy) return mr_set_error(MR_ERR_NOMEM, "checkpoint: out of memory copying a %zu-byte blob", n);
    if (n) memcpy(copy, bytes, n);
    mr_shape s = mr_shape_1d((int64_t)n);
    mr_status st = add_entry(w, path, MR_U8, &s, copy, copy);
    if (st != MR_OK) free(copy);
    return st;
}

static mr_status add_attr(mr_ckpt_writer *w, const char *name, int kind, const char *s, int64_t i, double f) {
    if (!w || !name || !name[0]) return mr_set_error(MR_ERR_INVALID, "checkpoint: attribute: NULL writer or empty name");
    if (kind == CK_STR && !s) return mr_set_error(MR_ERR_INVALID, "checkpoint: attribute '%s': value is NULL", name);
    if (!strcmp(name, "format") || !strcmp(name, "format_version"))
        return mr_set_error(MR_ERR_INVALID, "checkpoint: attribute '%s' is reserved (the writer sets it)", name);
    for (int k = 0; k < w->na; k++)
        if (!strcmp(w->a[k].name, name)) return mr_set_error(MR_ERR_INVALID, "checkpoint: duplicate attribute '%s'", name);
    if (w->na == w->acap) {
        int cap = w->acap ? 2 * w->acap : 16;
        ck_attr *a = realloc(w->a, sizeof *a * (size_t)cap);
        if (!a) return mr_set_error(MR_ERR_NOMEM, "checkpoint: out of memory adding attribute '%s'", name);
        w->a = a;
        w->acap = cap;
    }
    ck_attr a = {strdup(name), kind, kind == CK_STR ? strdup(s) : NULL, i, f};
    if (!a.name || (kind == CK_STR && !a.s)) {
        free(a.name);
        free(a.s);
        return mr_set_error(MR_ERR_NOMEM, "checkpoint: out of memory adding attribute '%s'", name);
    }
    w->a[w->na++] = a;
    return MR_OK;
}

mr_status mr_ckpt_writer_attr_str(mr_ckpt_writer *w, const char *name, const char *value) {
    return add_attr(w, name, CK_STR, value, 0, 0);
}
mr_status mr_ckpt_writer_attr_i64(mr_ckpt_writer *w, const char *name, int64_t v) {
    return add_attr(w, name, CK_I64, NULL, v, 0);
}
mr_status mr_ckpt_writer_attr_f64(mr_ckpt_writer *w, const char *name, double v) {
    return add_attr(w, name, CK_F64, NULL, 0, v);
}

/* ---- writing the file ----------------------------------------------------------------------- */

/* The file (little-endian) and memory (native) types of a dtype; predefined, never closed. */
static void h5_types(mr_dtype dt, hid_t *ft, hid_t *mt) {
    switch (dt) {
    case MR_F64: *ft = H5T_IEEE_F64LE; *mt = H5T_NATIVE_DOUBLE; break;
    case MR_I32: *ft = H5T_STD_I32LE; *mt = H5T_NATIVE_INT32; break;
    case MR_I64: *ft = H5T_STD_I64LE; *mt = H5T_NATIVE_INT64; break;
    case MR_U8: *ft = H5T_STD_U8LE; *mt = H5T_NATIVE_UINT8; break;
    default: *ft = H5T_IEEE_F32LE; *mt = H5T_NATIVE_FLOAT; break;
    }
}

/* A scalar attribute `name` of file type ft on obj, written from *v of memory type mt. */
static herr_t put_attr(hid_t obj, const char *name, hid_t ft, hid_t mt, const void *v) {
    hid_t sp = H5Screate(H5S_SCALAR);
    if (sp < 0) return -1;
    hid_t a = H5Acreate2(obj, name, ft, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t r = a < 0 ? -1 : H5Awrite(a, mt, v);
    if (a >= 0 && H5Aclose(a) < 0) r = -1;
    H5Sclose(sp);
    return r;
}

/* A variable-length UTF-8 string scalar, as h5py writes a str attribute. */
static herr_t put_attr_str(hid_t obj, const char *name, const char *s) {
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return -1;
    herr_t r = -1;
    if (H5Tset_size(t, H5T_VARIABLE) >= 0 && H5Tset_cset(t, H5T_CSET_UTF8) >= 0) r = put_attr(obj, name, t, t, &s);
    H5Tclose(t);
    return r;
}

/* One dataset: contiguous, written from the caller's memory in one H5Dwrite, plus its crc32. */
static mr_status write_entry(hid_t file, hid_t lcpl, hid_t dcpl, const ck_entry *e, const char *path) {
    mr_status st = MR_OK;
    char h5e[256];
    hid_t sp = -1, d = -1, ft, mt;
    h5_types(e->dt, &ft, &mt);
    hsize_t dims[MR_MAX_DIMS];
    for (int k = 0; k < e->shape.ndim; k++) dims[k] = (hsize_t)e->shape.dim[k];
    sp = e->shape.ndim == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(e->shape.ndim, dims, NULL);
    MR_TRY_H5(sp, MR_ERR_IO, "%s: dataset '%s': dataspace", path, e->path);
    d = H5Dcreate2(file, e->path, ft, sp, lcpl, dcpl, H5P_DEFAULT);
    MR_TRY_H5(d, MR_ERR_IO, "%s: cannot create dataset '%s'", path, e->path);
    int64_t numel = mr_shape_numel(&e->shape);
    size_t bytes = (size_t)numel * mr_dtype_size(e->dt);
    if (numel > 0)
        MR_TRY_H5(H5Dwrite(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, e->data), MR_ERR_IO,
                    "%s: writing dataset '%s' (%zu bytes) failed", path, e->path, bytes);
#ifdef SYNC_FILE_RANGE_WRITE
    /* start the disk writeback of what is written so far, so that it overlaps the crc and the
     * copies of the next datasets instead of all waiting for the final fsync */
    void *vfd = NULL;
    if (bytes >= ((size_t)1 << 20) && H5Fget_vfd_handle(file, H5P_DEFAULT, &vfd) >= 0 && vfd)
        (void)sync_file_range(*(int *)vfd, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
    uint32_t crc = ckpt_crc32(0, e->data, bytes);
    MR_TRY_H5(put_attr(d, "crc32", H5T_STD_U32LE, H5T_NATIVE_UINT32, &crc), MR_ERR_IO,
                "%s: dataset '%s': writing its crc32 attribute", path, e->path);
    herr_t r = H5Dclose(d);
    d = -1;
    MR_TRY_H5(r, MR_ERR_IO, "%s: closing dataset '%s' failed", path, e->path);
fail:
    if (d >= 0) H5Dclose(d);
    if (sp >= 0) H5Sclose(sp);
    return st;
}

/* HDF5 part of a write: everything into tmp, flushed and closed. Runs between enter/leave. */
static mr_status write_h5(const mr_ckpt_writer *w, const char *tmp, const char *path) {
    mr_status st = MR_OK;
    char h5e[256];
    hid_t fapl = -1, file = -1, lcpl = -1, dcpl = -1;
    fapl = ckpt_h5_fapl();
    MR_TRY_H5(fapl, MR_ERR_IO, "%s: file access properties", path);
    file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    MR_TRY_H5(file, MR_ERR_IO, "%s: cannot create the temporary file %s", path, tmp);
    lcpl = H5Pcreate(H5P_LINK_CREATE);
    MR_TRY_H5(lcpl, MR_ERR_IO, "%s: link properties", path);
    MR_TRY_H5(H5Pset_create_intermediate_group(lcpl, 1), MR_ERR_IO, "%s: link properties", path);
    MR_TRY_H5(H5Pset_char_encoding(lcpl, H5T_CSET_UTF8), MR_ERR_IO, "%s: link properties", path);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    MR_TRY_H5(dcpl, MR_ERR_IO, "%s: dataset properties", path);
    /* every dataset is written whole right after it is created: no fill pass over the disk */
    MR_TRY_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), MR_ERR_IO, "%s: dataset properties", path);
    for (int i = 0; i < w->n; i++) MR_TRY(write_entry(file, lcpl, dcpl, &w->e[i], path));
    int64_t version = MR_CKPT_FORMAT_VERSION;
    MR_TRY_H5(put_attr_str(file, "format", MR_CKPT_FORMAT), MR_ERR_IO, "%s: writing attribute 'format'", path);
    MR_TRY_H5(put_attr(file, "format_version", H5T_STD_I64LE, H5T_NATIVE_INT64, &version), MR_ERR_IO,
                "%s: writing attribute 'format_version'", path);
    for (int k = 0; k < w->na; k++) {
        const ck_attr *a = &w->a[k];
        herr_t r = a->kind == CK_STR   ? put_attr_str(file, a->name, a->s)
                   : a->kind == CK_I64 ? put_attr(file, a->name, H5T_STD_I64LE, H5T_NATIVE_INT64, &a->i)
                                       : put_attr(file, a->name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &a->f);
        MR_TRY_H5(r, MR_ERR_IO, "%s: writing attribute '%s'", path, a->name);
    }
    MR_TRY_H5(H5Fflush(file, H5F_SCOPE_GLOBAL), MR_ERR_IO, "%s: flushing the file failed", path);
    herr_t r = H5Fclose(file);
    file = -1;
    MR_TRY_H5(r, MR_ERR_IO, "%s: closing the file failed", path);
fail:
    if (file >= 0) H5Fclose(file); /* H5F_CLOSE_STRONG: also closes whatever is still open in it */
    if (dcpl >= 0) H5Pclose(dcpl);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (fapl >= 0) H5Pclose(fapl);
    return st;
}

/* fsync of a file or directory opened read-only (enough for fsync on Linux). */
static int sync_path(const char *p, int dir) {
    int fd = open(p, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
    if (fd < 0) return -1;
    int r = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    /* some file systems cannot sync a directory; the rename is then as durable as they make it */
    if (r < 0 && dir && (errno == EINVAL || errno == ENOTSUP)) r = 0;
    return r;
}

mr_status mr_ckpt_writer_write(const mr_ckpt_writer *w, const char *path) {
    mr_status st = MR_OK;
    char *tmp = NULL, *dir = NULL;
    if (!w || !path || !path[0]) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_writer_write: NULL writer or empty path");
    size_t len = strlen(path);
    tmp = malloc(len + 32);
    dir = malloc(len + 2);
    MR_CHECK(tmp && dir, MR_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, len + 32, "%s.tmp.%ld", path, (long)getpid());
    const char *slash = strrchr(path, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == path) strcpy(dir, "/");
    else {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
    }
    mr_h5_enter();
    st = write_h5(w, tmp, path);
    mr_h5_leave();
    if (st != MR_OK) goto fail;
    MR_CHECK(sync_path(tmp, 0) == 0, MR_ERR_IO, "%s: fsync of the temporary file %s failed: %s", path, tmp,
             strerror(errno));
    MR_CHECK(rename(tmp, path) == 0, MR_ERR_IO, "%s: renaming %s into place failed: %s", path, tmp, strerror(errno));
    if (sync_path(dir, 1) != 0) {
        st = mr_set_error(MR_ERR_IO, "%s: written and renamed into place, but the fsync of directory %s failed: %s "
                          "(the file may not survive a power loss)", path, dir, strerror(errno));
        free(tmp);
        free(dir);
        return st;
    }
    free(tmp);
    free(dir);
    return MR_OK;
fail:
    if (tmp) unlink(tmp);
    free(tmp);
    free(dir);
    return st;
}
