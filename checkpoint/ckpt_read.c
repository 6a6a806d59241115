/* Checkpoint reader, the dataset half (ckpt_meta.c opens files and reads attributes and lists):
 * answers what a dataset is and reads it into the caller's memory, checking its shape and the
 * "crc32" attribute that ckpt_file.c writes; verifies whole files.
 *
 * Robustness: a truncated or damaged file must give MR_ERR_FORMAT naming the file, never a crash
 * or an HDF5 error dump. H5Fopen already refuses a file shorter than its recorded end; the crc32
 * catches damaged raw data; every HDF5 failure on metadata becomes an error message. Reads that
 * convert or only check (mr_ckpt_verify) go through blocks of CK_BLOCK_BYTES, so memory stays
 * small whatever the dataset size. */
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt_impl.h"

#define CK_BLOCK_BYTES ((size_t)4 << 20)
/* Elements of one dataset at most (2^56: 512 PiB of f64, beyond any real checkpoint). */
#define CKPT_MAX_NUMEL ((int64_t)1 << 56)

int mr_ckpt_has(const mr_ckpt_reader *r, const char *path) {
    if (!r || !path) return 0;
    mr_h5_enter();
    int yes = ckpt_obj_type(r->file, ckpt_rel(path)) == H5O_TYPE_DATASET;
    mr_h5_leave();
    return yes;
}

/* The mirror dtype of an HDF5 file type, or MR_ERR_UNSUPPORTED naming the dataset. */
static mr_status map_type(hid_t ft, const char *file, const char *name, mr_dtype *dt) {
    H5T_class_t cls = H5Tget_class(ft);
    size_t size = H5Tget_size(ft);
    if (cls == H5T_FLOAT && size == 4) *dt = MR_F32;
    else if (cls == H5T_FLOAT && size == 8) *dt = MR_F64;
    else if (cls == H5T_INTEGER) {
        H5T_sign_t sg = H5Tget_sign(ft);
        if (size == 1 && sg == H5T_SGN_NONE) *dt = MR_U8;
        else if (size <= 2 || (size == 4 && sg == H5T_SGN_2)) *dt = MR_I32;
        else if (size == 4 || (size == 8 && sg == H5T_SGN_2)) *dt = MR_I64;
        else return mr_set_error(MR_ERR_UNSUPPORTED, "%s: '%s': unsigned 64-bit integers are not supported", file, name);
    } else {
        return mr_set_error(MR_ERR_UNSUPPORTED, "%s: '%s': HDF5 type class %d of %zu bytes is not supported (f32, f64, "
                            "integers)", file, name, (int)cls, size);
    }
    return MR_OK;
}

static hid_t native_of(mr_dtype dt) {
    switch (dt) {
    case MR_F32: return H5T_NATIVE_FLOAT;
    case MR_F64: return H5T_NATIVE_DOUBLE;
    case MR_I32: return H5T_NATIVE_INT32;
    case MR_I64: return H5T_NATIVE_INT64;
    default: return H5T_NATIVE_UINT8;
    }
}

/* "(10,784)", "(5,)", "()" as Python prints shapes. */
static const char *shape_str(const mr_shape *s, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < s->ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, d ? ",%lld" : "%lld", (long long)s->dim[d]);
    if (n < cap) snprintf(buf + n, cap - n, s->ndim == 1 ? ",)" : ")");
    return buf;
}

/* An open dataset (lock held) with its file type, mirror dtype, shape and dims. */
typedef struct ck_dset {
    hid_t d, ft, sp;
    mr_dtype dt;
    mr_shape shape;
    hsize_t dims[MR_MAX_DIMS];
} ck_dset;

static void dset_close(ck_dset *k) {
    if (k->sp >= 0) H5Sclose(k->sp);
    if (k->ft >= 0) H5Tclose(k->ft);
    if (k->d >= 0) H5Dclose(k->d);
    k->d = k->ft = k->sp = -1;
}

static mr_status dset_open(const mr_ckpt_reader *r, const char *name, ck_dset *k) {
    mr_status st = MR_OK;
    char h5e[256];
    memset(k, 0, sizeof *k);
    k->d = k->ft = k->sp = -1;
    if (ckpt_obj_type(r->file, name) != H5O_TYPE_DATASET)
        return mr_set_error(MR_ERR_NOT_FOUND, "%s: no dataset '%s' in the checkpoint", r->path, name);
    k->d = H5Dopen2(r->file, name, H5P_DEFAULT);
    MR_TRY_H5(k->d, MR_ERR_FORMAT, "%s: '%s': cannot open the dataset", r->path, name);
    k->ft = H5Dget_type(k->d);
    MR_TRY_H5(k->ft, MR_ERR_FORMAT, "%s: '%s': cannot read its type", r->path, name);
    MR_TRY(map_type(k->ft, r->path, name, &k->dt));
    k->sp = H5Dget_space(k->d);
    MR_TRY_H5(k->sp, MR_ERR_FORMAT, "%s: '%s': cannot read its dataspace", r->path, name);
    int rank = H5Sget_simple_extent_ndims(k->sp);
    MR_TRY_H5(rank, MR_ERR_FORMAT, "%s: '%s': cannot read its rank", r->path, name);
    MR_CHECK(rank <= MR_MAX_DIMS && H5Sget_simple_extent_type(k->sp) != H5S_NULL, MR_ERR_FORMAT,
             "%s: '%s': %d dims (or an empty dataspace); at most %d are supported", r->path, name, rank, MR_MAX_DIMS);
    MR_TRY_H5(H5Sget_simple_extent_dims(k->sp, k->dims, NULL), MR_ERR_FORMAT, "%s: '%s': dims", r->path, name);
    k->shape.ndim = rank;
    /* A crafted header may declare dims whose product overflows int64 (found by tests/fuzz
     * fuzz_ckpt): bound the element count, checking before each multiplication. */
    int64_t numel = 1;
    for (int d = 0; d < rank; d++) {
        MR_CHECK(k->dims[d] <= (hsize_t)CKPT_MAX_NUMEL && (k->dims[d] == 0 || numel <= CKPT_MAX_NUMEL / (int64_t)k->dims[d]),
                 MR_ERR_FORMAT, "%s: '%s': dims of more than 2^56 elements (corrupt header)", r->path, name);
        k->shape.dim[d] = (int64_t)k->dims[d];
        numel *= k->shape.dim[d];
    }
    return MR_OK;
fail:
    dset_close(k);
    return st;
}

mr_status mr_ckpt_info(const mr_ckpt_reader *r, const char *path, mr_dtype *dt, mr_shape *shape) {
    if (!r || !path || !dt || !shape) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_info: NULL argument");
    ck_dset k;
    mr_h5_enter();
    mr_status st = dset_open(r, ckpt_rel(path), &k);
    if (st == MR_OK) {
        *dt = k.dt;
        *shape = k.shape;
        dset_close(&k);
    }
    mr_h5_leave();
    return st;
}

/* The dataset's stored crc32 in *crc, *has = 0 when it has none (lock held). */
static mr_status dset_crc(const mr_ckpt_reader *r, const char *name, const ck_dset *k, int *has, uint32_t *crc) {
    htri_t ex = H5Aexists(k->d, "crc32");
    *has = ex > 0;
    if (ex < 0) {
        char h5e[256];
        return mr_set_error(MR_ERR_FORMAT, "%s: '%s': cannot read its attributes: %s", r->path, name, mr_h5_reason(h5e));
    }
    if (!*has) return MR_OK;
    mr_status st = ckpt_attr_get_num(k->d, r->path, "crc32", H5T_NATIVE_UINT32, 0, crc);
    if (st != MR_OK && st != MR_ERR_NOMEM)
        st = mr_set_error(MR_ERR_FORMAT, "%s: '%s': unreadable crc32 attribute", r->path, name);
    return st;
}

/* Reads the whole dataset in blocks of about CK_BLOCK_BYTES as memory type mt (element size es),
 * in row-major order: fn(ctx, block, first element, count) for each (lock held). The blocks are
 * boxes: one index at a time in the dims before `s`, a run along dim s, everything after it. */
typedef mr_status (*block_fn)(void *ctx, const void *buf, int64_t first, int64_t n);
static mr_status read_blocks(const mr_ckpt_reader *r, const char *name, const ck_dset *k, hid_t mt, size_t es,
                             block_fn fn, void *ctx) {
    mr_status st = MR_OK;
    char h5e[256];
    hid_t ms = -1;
    void *buf = NULL;
    int rank = k->shape.ndim;
    int64_t numel = mr_shape_numel(&k->shape);
    if (numel == 0) return MR_OK;
    if (rank == 0) {
        buf = malloc(es);
        MR_CHECK(buf, MR_ERR_NOMEM, "%s: out of memory", r->path);
        MR_TRY_H5(H5Dread(k->d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), MR_ERR_FORMAT,
                    "%s: '%s': read failed (truncated or corrupt file?)", r->path, name);
        MR_TRY(fn(ctx, buf, 0, 1));
        free(buf);
        return MR_OK;
    }
    int s = rank - 1;
    int64_t inner = 1; /* elements after dim s */
    while (s > 0 && (size_t)(inner * k->shape.dim[s]) * es <= CK_BLOCK_BYTES) inner *= k->shape.dim[s--];
    int64_t run = (int64_t)(CK_BLOCK_BYTES / es / (size_t)inner);
    if (run < 1) run = 1;
    if (run > k->shape.dim[s]) run = k->shape.dim[s];
    buf = malloc((size_t)(run * inner) * es);
    MR_CHECK(buf, MR_ERR_NOMEM, "%s: out of memory for a read block", r->path);
    hsize_t start[MR_MAX_DIMS] = {0}, count[MR_MAX_DIMS];
    for (int d = 0; d < rank; d++) count[d] = d < s ? 1 : k->dims[d];
    int64_t first = 0;
    for (;;) {
        count[s] = (hsize_t)(k->shape.dim[s] - (int64_t)start[s] < run ? k->shape.dim[s] - (int64_t)start[s] : run);
        hsize_t n = count[s] * (hsize_t)inner;
        MR_TRY_H5(H5Sselect_hyperslab(k->sp, H5S_SELECT_SET, start, NULL, count, NULL), MR_ERR_FORMAT,
                    "%s: '%s': selecting a block", r->path, name);
        ms = H5Screate_simple(1, &n, NULL);
        MR_TRY_H5(ms, MR_ERR_INTERNAL, "%s: memory dataspace", r->path);
        MR_TRY_H5(H5Dread(k->d, mt, ms, k->sp, H5P_DEFAULT, buf), MR_ERR_FORMAT,
                    "%s: '%s': read failed (truncated or corrupt file?)", r->path, name);
        H5Sclose(ms);
        ms = -1;
        MR_TRY(fn(ctx, buf, first, (int64_t)n));
        first += (int64_t)n;
        /* next box: advance dim s, carrying into the dims before it */
        start[s] += count[s];
        int d = s;
        while (d > 0 && start[d] >= k->dims[d]) {
            start[d] = 0;
            start[--d]++;
        }
        if (start[0] >= k->dims[0]) break;
    }
    H5Sselect_all(k->sp);
fail:
    if (ms >= 0) H5Sclose(ms);
    free(buf);
    return st;
}

/* Block consumer: crc32 of the stored bytes, and the conversion into dst when dst is set. */
typedef struct conv_ctx {
    uint32_t crc;
    mr_dtype from, to;
    hid_t from_mt, to_mt;
    size_t es;
    void *dst;
} conv_ctx;

static mr_status conv_block(void *p, const void *buf, int64_t first, int64_t n) {
    conv_ctx *c = p;
    c->crc = ckpt_crc32(c->crc, buf, (size_t)n * c->es);
    if (!c->dst) return MR_OK;
    if (c->from == MR_F64 && c->to == MR_F32) {
        const double *s = buf;
        float *d = (float *)c->dst + first;
        for (int64_t i = 0; i < n; i++) d[i] = (float)s[i];
    } else if (c->from == MR_F32 && c->to == MR_F64) {
        const float *s = buf;
        double *d = (double *)c->dst + first;
        for (int64_t i = 0; i < n; i++) d[i] = (double)s[i];
    } else { /* integer widening, exact: let HDF5 convert a copy in place */
        size_t ts = mr_dtype_size(c->to);
        void *tmp = malloc((size_t)n * (ts > c->es ? ts : c->es));
        if (!tmp) return mr_set_error(MR_ERR_NOMEM, "checkpoint: out of memory converting a block");
        memcpy(tmp, buf, (size_t)n * c->es);
        herr_t r = H5Tconvert(c->from_mt, c->to_mt, (size_t)n, tmp, NULL, H5P_DEFAULT);
        if (r >= 0) memcpy((char *)c->dst + (size_t)first * ts, tmp, (size_t)n * ts);
        free(tmp);
        if (r < 0) return mr_set_error(MR_ERR_INTERNAL, "checkpoint: integer conversion failed");
    }
    return MR_OK;
}

/* Whether a dataset of dtype `from` can be read as `to` (exactly, or f32 <-> f64). */
static int can_read_as(mr_dtype from, mr_dtype to) {
    if (from == to) return 1;
    if ((from == MR_F32 && to == MR_F64) || (from == MR_F64 && to == MR_F32)) return 1;
    return (from == MR_U8 && (to == MR_I32 || to == MR_I64)) || (from == MR_I32 && to == MR_I64);
}

mr_status mr_ckpt_read(const mr_ckpt_reader *r, const char *path, mr_dtype dt, const mr_shape *shape, void *dst) {
    mr_status st = MR_OK;
    char h5e[256];
    ck_dset k = {.d = -1, .ft = -1, .sp = -1};
    hid_t nt = -1;
    if (!r || !path || !shape) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_read: NULL argument");
    const char *name = ckpt_rel(path);
    mr_h5_enter();
    MR_TRY(dset_open(r, name, &k));
    if (!mr_shape_eq(&k.shape, shape)) {
        char a[160], b[160];
        MR_CHECK(0, MR_ERR_INVALID, "%s: '%s': shape %s in the file, %s expected", r->path, name,
                 shape_str(&k.shape, a, sizeof a), shape_str(shape, b, sizeof b));
    }
    MR_CHECK(can_read_as(k.dt, dt), MR_ERR_INVALID, "%s: '%s': dtype %s in the file cannot be read as %s", r->path,
             name, mr_dtype_name(k.dt), mr_dtype_name(dt));
    int64_t numel = mr_shape_numel(&k.shape);
    MR_CHECK(dst || numel == 0, MR_ERR_INVALID, "%s: '%s': dst is NULL", r->path, name);
    int has = 0;
    uint32_t stored = 0, computed = 0;
    MR_TRY(dset_crc(r, name, &k, &has, &stored));
    /* the stored bytes as they are in memory: what the crc32 is over */
    nt = H5Tget_native_type(k.ft, H5T_DIR_ASCEND);
    MR_TRY_H5(nt, MR_ERR_FORMAT, "%s: '%s': native type", r->path, name);
    htri_t same = H5Tequal(nt, native_of(dt));
    if (same > 0 && numel > 0) { /* the common case: straight into dst */
        MR_TRY_H5(H5Dread(k.d, nt, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst), MR_ERR_FORMAT,
                    "%s: '%s': read failed (truncated or corrupt file?)", r->path, name);
        computed = ckpt_crc32(0, dst, (size_t)numel * mr_dtype_size(dt));
    } else if (numel > 0) {
        conv_ctx c = {0, k.dt, dt, nt, native_of(dt), H5Tget_size(nt), dst};
        MR_TRY(read_blocks(r, name, &k, nt, c.es, conv_block, &c));
        computed = c.crc;
    }
    MR_CHECK(!has || stored == computed, MR_ERR_FORMAT, "%s: '%s': checksum mismatch (stored 0x%08x, computed 0x%08x); "
             "HINT: the file is damaged, use an older checkpoint", r->path, name, (unsigned)stored, (unsigned)computed);
fail:
    if (nt >= 0) H5Tclose(nt);
    dset_close(&k);
    mr_h5_leave();
    return st;
}

mr_status mr_ckpt_read_blob(const mr_ckpt_reader *r, const char *path, void **bytes, size_t *n) {
    mr_dtype dt;
    mr_shape s;
    if (!bytes || !n) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_read_blob: NULL argument");
    *bytes = NULL;
    *n = 0;
    mr_status st = mr_ckpt_info(r, path, &dt, &s);
    if (st != MR_OK) return st;
    if (dt != MR_U8 || s.ndim != 1)
        return mr_set_error(MR_ERR_INVALID, "%s: '%s' is not a blob (a 1-D u8 dataset)", r->path, ckpt_rel(path));
    void *b = malloc(s.dim[0] ? (size_t)s.dim[0] : 1);
    if (!b) return mr_set_error(MR_ERR_NOMEM, "%s: out of memory for a %lld-byte blob", r->path, (long long)s.dim[0]);
    st = mr_ckpt_read(r, path, MR_U8, &s, b);
    if (st != MR_OK) {
        free(b);
        return st;
    }
    *bytes = b;
    *n = (size_t)s.dim[0];
    return MR_OK;
}

/* ---- verify ---------------------------------------------------------------------------------- */

mr_status mr_ckpt_verify(const char *path) {
    mr_ckpt_reader *r = NULL;
    char **names = NULL;
    int n = 0;
    mr_status st = mr_ckpt_open(path, 0, &r);
    if (st != MR_OK) return st;
    MR_TRY(mr_ckpt_list(r, "", &names, &n));
    mr_h5_enter();
    for (int i = 0; i < n && st == MR_OK; i++) {
        ck_dset k;
        st = dset_open(r, names[i], &k);
        if (st != MR_OK) break;
        int has = 0;
        uint32_t stored = 0;
        hid_t nt = -1;
        st = dset_crc(r, names[i], &k, &has, &stored);
        if (st == MR_OK && !has)
            st = mr_set_error(MR_ERR_FORMAT, "%s: '%s' has no crc32 attribute (not written by mirror?)", path, names[i]);
        if (st == MR_OK && (nt = H5Tget_native_type(k.ft, H5T_DIR_ASCEND)) < 0)
            st = mr_set_error(MR_ERR_FORMAT, "%s: '%s': native type", path, names[i]);
        conv_ctx c = {0, k.dt, k.dt, nt, nt, nt >= 0 ? H5Tget_size(nt) : 1, NULL};
        if (st == MR_OK) st = read_blocks(r, names[i], &k, nt, c.es, conv_block, &c);
        if (st == MR_OK && c.crc != stored)
            st = mr_set_error(MR_ERR_FORMAT, "%s: '%s': checksum mismatch (stored 0x%08x, computed 0x%08x)", path,
                              names[i], (unsigned)stored, (unsigned)c.crc);
        if (nt >= 0) H5Tclose(nt);
        dset_close(&k);
    }
    mr_h5_leave();
fail:
    mr_ckpt_names_free(names, n);
    mr_ckpt_close(r);
    return st;
}

