/* HDF5 source and writer. A source reads one HDF5 dataset per component; the first dim of each is
 * the element count, the rest the per-element shape. Elements are read in blocks of consecutive
 * elements (about H5_BLOCK_BYTES per block, all components at once) kept in a small LRU of blocks
 * (at most H5_CACHE_BYTES), so sequential reads and shuffle(buffer) draws, which stay within a
 * window of the file, cost one hyperslab read per block instead of one per element.
 *
 * Every HDF5 call of this file runs under mirror's one process-wide HDF5 lock (core/h5_impl.h):
 * map(parallel) and the prefetch thread read from several threads, and an HDF5 build need not be
 * thread-safe.
 *
 * The writer iterates any dataset and appends each component to an extendible chunked HDF5
 * dataset, in a temporary file renamed over `path` only once everything is written. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hdf5.h>

#include "core/h5_impl.h"
#include "data/data_impl.h"

#define H5_BLOCK_BYTES ((size_t)1 << 20)
#define H5_CACHE_BYTES ((size_t)64 << 20)
#define H5_MAX_BLOCKS 64

/* IEEE half, little-endian (HDF5 1.10 has no predefined one); close with H5Tclose. */
static hid_t h5_half_type(void) {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0) return t;
    if (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_precision(t, 16) < 0 || H5Tset_size(t, 2) < 0 ||
        H5Tset_ebias(t, 15) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

/* The mirror dtype for a file type and the memory type to read it as (a new hid, closed by the
 * caller), or MR_ERR_UNSUPPORTED naming the type. Integers narrower than 32 bits (other than u8)
 * widen to i32 and u32 to i64, which HDF5 converts exactly. */
static mr_status h5_map_type(hid_t ft, const char *path, const char *name, mr_dtype *dt, hid_t *mt) {
    char h5e[256];
    H5T_class_t cls = H5Tget_class(ft);
    size_t size = H5Tget_size(ft);
    hid_t native = -1;
    *mt = -1;
    if (cls == H5T_FLOAT && size == 4) { *dt = MR_F32; native = H5T_NATIVE_FLOAT; }
    else if (cls == H5T_FLOAT && size == 8) { *dt = MR_F64; native = H5T_NATIVE_DOUBLE; }
    else if (cls == H5T_FLOAT && size == 2) {
        size_t spos, epos, esize, mpos, msize;
        if (H5Tget_fields(ft, &spos, &epos, &esize, &mpos, &msize) < 0 || esize != 5 || msize != 10)
            return mr_set_error(MR_ERR_UNSUPPORTED, "%s: dataset '%s': a 16-bit float that is not IEEE half (%zu exponent, "
                                "%zu mantissa bits)", path, name, esize, msize);
        *dt = MR_F16;
        *mt = h5_half_type();
        if (*mt < 0) return mr_set_error(MR_ERR_INTERNAL, "%s: cannot build the half type: %s", path, mr_h5_reason(h5e));
        return MR_OK;
    } else if (cls == H5T_INTEGER) {
        H5T_sign_t sg = H5Tget_sign(ft);
        if (size == 1 && sg == H5T_SGN_NONE) { *dt = MR_U8; native = H5T_NATIVE_UINT8; }
        else if (size <= 2 || (size == 4 && sg == H5T_SGN_2)) { *dt = MR_I32; native = H5T_NATIVE_INT32; }
        else if (size == 4 || (size == 8 && sg == H5T_SGN_2)) { *dt = MR_I64; native = H5T_NATIVE_INT64; }
        else
            return mr_set_error(MR_ERR_UNSUPPORTED, "%s: dataset '%s': unsigned 64-bit integers are not supported; HINT: "
                                "store i64, i32, u8, f16, f32 or f64", path, name);
    } else {
        static const char *names[] = {"integer", "float", "time", "string", "bitfield", "opaque",
                                      "compound", "reference", "enum", "variable-length", "array"};
        return mr_set_error(MR_ERR_UNSUPPORTED, "%s: dataset '%s': unsupported HDF5 type class %s (size %zu); HINT: store "
                            "i64, i32, u8, f16, f32 or f64", path, name,
                            cls >= 0 && cls < 11 ? names[cls] : "unknown", size);
    }
    *mt = H5Tcopy(native);
    if (*mt < 0) return mr_set_error(MR_ERR_INTERNAL, "%s: H5Tcopy failed: %s", path, mr_h5_reason(h5e));
    return MR_OK;
}

/* ---- source --------------------------------------------------------------------------------- */

typedef struct h5_block {
    int64_t first, n; /* elements [first, first + n); n == 0: empty slot */
    uint64_t used;    /* LRU tick */
    unsigned char *data[MR_DATA_MAX_COMPONENTS];
} h5_block;

typedef struct h5_impl {
    hid_t file;
    hid_t dset[MR_DATA_MAX_COMPONENTS], mtype[MR_DATA_MAX_COMPONENTS];
    int ncomp;
    int64_t n, block; /* elements, elements per block */
    size_t eb[MR_DATA_MAX_COMPONENTS];
    int nblocks;
    uint64_t tick;
    h5_block *blocks;
    char dnames[MR_DATA_MAX_COMPONENTS][256];
    char path[];
} h5_impl;

static void h5_impl_free(void *p) {
    h5_impl *h = p;
    if (!h) return;
    mr_h5_enter();
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) {
        if (h->dset[c] > 0) H5Dclose(h->dset[c]);
        if (h->mtype[c] > 0) H5Tclose(h->mtype[c]);
    }
    if (h->file > 0) H5Fclose(h->file);
    mr_h5_leave();
    if (h->blocks)
        for (int b = 0; b < h->nblocks; b++)
            for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) free(h->blocks[b].data[c]);
    free(h->blocks);
    free(h);
}

/* Reads elements [first, first + n) of every component into blk (lock held). */
static mr_status h5_read_block(h5_impl *h, h5_block *blk, int64_t first, int64_t n) {
    mr_status st = MR_OK;
    char h5e[256];
    hid_t fs = -1, ms = -1;
    blk->n = 0;
    for (int c = 0; c < h->ncomp; c++) {
        fs = H5Dget_space(h->dset[c]);
        MR_TRY_H5(fs, MR_ERR_IO, "%s: dataset '%s': H5Dget_space", h->path, h->dnames[c]);
        int rank = H5Sget_simple_extent_ndims(fs);
        MR_TRY_H5(rank, MR_ERR_IO, "%s: dataset '%s': rank", h->path, h->dnames[c]);
        hsize_t start[H5S_MAX_RANK] = {0}, count[H5S_MAX_RANK];
        MR_TRY_H5(H5Sget_simple_extent_dims(fs, count, NULL), MR_ERR_IO, "%s: dataset '%s': dims", h->path, h->dnames[c]);
        start[0] = (hsize_t)first;
        count[0] = (hsize_t)n;
        MR_TRY_H5(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL), MR_ERR_IO,
                  "%s: dataset '%s': selecting elements %lld..%lld", h->path, h->dnames[c], (long long)first,
                  (long long)(first + n - 1));
        ms = H5Screate_simple(rank, count, NULL);
        MR_TRY_H5(ms, MR_ERR_IO, "%s: dataset '%s': memory dataspace", h->path, h->dnames[c]);
        if (n > 0 && h->eb[c] > 0)
            MR_TRY_H5(H5Dread(h->dset[c], h->mtype[c], ms, fs, H5P_DEFAULT, blk->data[c]), MR_ERR_IO,
                      "%s: dataset '%s': reading elements %lld..%lld failed (truncated or corrupt file?)", h->path,
                      h->dnames[c], (long long)first, (long long)(first + n - 1));
        H5Sclose(ms);
        H5Sclose(fs);
        ms = fs = -1;
    }
    blk->first = first;
    blk->n = n;
    return MR_OK;
fail:
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return st;
}

static mr_status h5_read(void *p, int64_t idx, void *const out[]) {
    h5_impl *h = p;
    mr_status st = MR_OK;
    mr_h5_enter();
    h5_block *hit = NULL, *victim = &h->blocks[0];
    for (int b = 0; b < h->nblocks; b++) {
        h5_block *k = &h->blocks[b];
        if (k->n && idx >= k->first && idx < k->first + k->n) { hit = k; break; }
        if (k->used < victim->used) victim = k;
    }
    if (!hit) {
        int64_t first = idx / h->block * h->block;
        int64_t n = h->n - first < h->block ? h->n - first : h->block;
        st = h5_read_block(h, victim, first, n);
        if (st == MR_OK) hit = victim;
    }
    if (hit) {
        hit->used = ++h->tick;
        for (int c = 0; c < h->ncomp; c++)
            memcpy(out[c], hit->data[c] + (size_t)(idx - hit->first) * h->eb[c], h->eb[c]);
    }
    mr_h5_leave();
    return st;
}

mr_status mr_data_from_hdf5(const char *path, const char *const names[], int n, mr_dataset **out) {
    mr_status st = MR_OK;
    char h5e[256];
    h5_impl *h = NULL;
    hid_t fs = -1, ft = -1;
    int locked = 0;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_from_hdf5: out is NULL");
    *out = NULL;
    MR_CHECK(path, MR_ERR_INVALID, "mr_data_from_hdf5: path is NULL");
    MR_CHECK(names && n >= 1 && n <= MR_DATA_MAX_COMPONENTS, MR_ERR_INVALID,
             "%s: need 1..%d dataset names, got %d", path, MR_DATA_MAX_COMPONENTS, names ? n : 0);
    for (int c = 0; c < n; c++) MR_CHECK(names[c] && names[c][0], MR_ERR_INVALID, "%s: dataset name %d is empty", path, c);
    MR_CHECK(access(path, R_OK) == 0, errno == ENOENT ? MR_ERR_NOT_FOUND : MR_ERR_IO, "%s: cannot open HDF5 file: %s",
             path, strerror(errno));
    h = calloc(1, sizeof *h + strlen(path) + 1);
    MR_CHECK(h, MR_ERR_NOMEM, "%s: out of memory", path);
    strcpy(h->path, path);
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) h->dset[c] = h->mtype[c] = -1;
    h->file = -1;
    h->ncomp = n;
    mr_h5_enter();
    locked = 1;
    MR_CHECK(H5Fis_hdf5(path) > 0, MR_ERR_FORMAT, "%s: not an HDF5 file (no HDF5 signature)", path);
    h->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    MR_TRY_H5(h->file, MR_ERR_FORMAT, "%s: cannot open as HDF5 (truncated or corrupt?)", path);
    mr_data_spec spec = {0};
    for (int c = 0; c < n; c++) {
        snprintf(h->dnames[c], sizeof h->dnames[c], "%s", names[c]);
        htri_t ex = H5Lexists(h->file, names[c], H5P_DEFAULT);
        MR_CHECK(ex > 0, MR_ERR_NOT_FOUND, "%s: no dataset '%s'", path, names[c]);
        h->dset[c] = H5Dopen2(h->file, names[c], H5P_DEFAULT);
        MR_TRY_H5(h->dset[c], MR_ERR_NOT_FOUND, "%s: cannot open dataset '%s'", path, names[c]);
        ft = H5Dget_type(h->dset[c]);
        MR_TRY_H5(ft, MR_ERR_FORMAT, "%s: dataset '%s': type", path, names[c]);
        mr_dtype dt = MR_F32;
        MR_TRY(h5_map_type(ft, path, names[c], &dt, &h->mtype[c]));
        H5Tclose(ft);
        ft = -1;
        fs = H5Dget_space(h->dset[c]);
        MR_TRY_H5(fs, MR_ERR_FORMAT, "%s: dataset '%s': dataspace", path, names[c]);
        int rank = H5Sget_simple_extent_ndims(fs);
        MR_TRY_H5(rank, MR_ERR_FORMAT, "%s: dataset '%s': rank", path, names[c]);
        MR_CHECK(rank >= 1 && rank <= MR_MAX_DIMS, MR_ERR_FORMAT,
                 "%s: dataset '%s' has %d dims; need 1..%d (the first is the element count)", path, names[c], rank,
                 MR_MAX_DIMS);
        hsize_t dims[H5S_MAX_RANK];
        MR_TRY_H5(H5Sget_simple_extent_dims(fs, dims, NULL), MR_ERR_FORMAT, "%s: dataset '%s': dims", path, names[c]);
        H5Sclose(fs);
        fs = -1;
        if (c == 0) h->n = (int64_t)dims[0];
        MR_CHECK((int64_t)dims[0] == h->n, MR_ERR_FORMAT,
                 "%s: dataset '%s' has %lld elements (first dim), but '%s' has %lld", path, names[c],
                 (long long)dims[0], names[0], (long long)h->n);
        mr_shape s = {0};
        s.ndim = rank - 1;
        for (int d = 1; d < rank; d++) s.dim[d - 1] = (int64_t)dims[d];
        const char *base = strrchr(names[c], '/');
        base = base ? base + 1 : names[c];
        char cname[MR_DATA_NAME_MAX];
        snprintf(cname, sizeof cname, "%s", base[0] ? base : names[c]);
        MR_TRY(mr_data_spec_add(&spec, cname, dt, &s));
        h->eb[c] = mr_data_spec_bytes(&spec, c);
    }
    mr_h5_leave();
    locked = 0;
    size_t row = 0;
    for (int c = 0; c < n; c++) row += h->eb[c];
    h->block = row ? (int64_t)(H5_BLOCK_BYTES / row) : 4096;
    if (h->block < 1) h->block = 1;
    size_t bb = row * (size_t)h->block;
    h->nblocks = bb ? (int)(H5_CACHE_BYTES / bb) : 1;
    if (h->nblocks < 2) h->nblocks = 2;
    if (h->nblocks > H5_MAX_BLOCKS) h->nblocks = H5_MAX_BLOCKS;
    h->blocks = calloc((size_t)h->nblocks, sizeof(h5_block));
    MR_CHECK(h->blocks, MR_ERR_NOMEM, "%s: out of memory", path);
    for (int b = 0; b < h->nblocks; b++)
        for (int c = 0; c < n; c++) {
            size_t bytes = h->eb[c] * (size_t)h->block;
            h->blocks[b].data[c] = malloc(bytes ? bytes : 1);
            MR_CHECK(h->blocks[b].data[c], MR_ERR_NOMEM, "%s: out of memory for a %zu-byte read block", path, bytes);
        }
    return ds_new_source(&spec, h->n, h5_read, h5_impl_free, h, "hdf5", out);
fail:
    if (ft >= 0) H5Tclose(ft);
    if (fs >= 0) H5Sclose(fs);
    if (locked) mr_h5_leave();
    h5_impl_free(h);
    return st;
}

/* ---- writer --------------------------------------------------------------------------------- */

typedef struct h5_writer {
    hid_t file;
    hid_t dset[MR_DATA_MAX_COMPONENTS], ftype[MR_DATA_MAX_COMPONENTS];
    int ncomp;
    int rank[MR_DATA_MAX_COMPONENTS];
    hsize_t dims[MR_DATA_MAX_COMPONENTS][MR_MAX_DIMS]; /* current extent */
    const char *path;
    char dnames[MR_DATA_MAX_COMPONENTS][256];
} h5_writer;

/* Appends n elements (bufs[c]: n elements of component c) to every dataset (takes the lock). */
static mr_status h5_append(h5_writer *w, int64_t n, void *const bufs[]) {
    mr_status st = MR_OK;
    char h5e[256];
    hid_t fs = -1, ms = -1;
    if (n == 0) return MR_OK;
    mr_h5_enter();
    for (int c = 0; c < w->ncomp; c++) {
        hsize_t start[MR_MAX_DIMS] = {0}, count[MR_MAX_DIMS];
        memcpy(count, w->dims[c], sizeof count);
        start[0] = w->dims[c][0];
        count[0] = (hsize_t)n;
        w->dims[c][0] += (hsize_t)n;
        MR_TRY_H5(H5Dset_extent(w->dset[c], w->dims[c]), MR_ERR_IO, "%s: dataset '%s': extending", w->path, w->dnames[c]);
        fs = H5Dget_space(w->dset[c]);
        MR_TRY_H5(fs, MR_ERR_IO, "%s: dataset '%s': dataspace", w->path, w->dnames[c]);
        MR_TRY_H5(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL), MR_ERR_IO, "%s: dataset '%s': select",
                  w->path, w->dnames[c]);
        ms = H5Screate_simple(w->rank[c], count, NULL);
        MR_TRY_H5(ms, MR_ERR_IO, "%s: dataset '%s': memory dataspace", w->path, w->dnames[c]);
        MR_TRY_H5(H5Dwrite(w->dset[c], w->ftype[c], ms, fs, H5P_DEFAULT, bufs[c]), MR_ERR_IO,
                  "%s: dataset '%s': writing %lld elements", w->path, w->dnames[c], (long long)n);
        H5Sclose(ms);
        H5Sclose(fs);
        ms = fs = -1;
    }
fail:
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    mr_h5_leave();
    return st;
}

mr_status mr_data_write_hdf5(mr_dataset *ds, const char *path, const char *const names[]) {
    mr_status st = MR_OK;
    char h5e[256];
    h5_writer w;
    mr_data_iter *it = NULL;
    void *bufs[MR_DATA_MAX_COMPONENTS] = {0};
    char *tmp = NULL;
    hid_t sp = -1, dcpl = -1;
    int locked = 0;
    memset(&w, 0, sizeof w);
    w.file = -1;
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) w.dset[c] = w.ftype[c] = -1;
    if (!ds || !path) return mr_set_error(MR_ERR_INVALID, "mr_data_write_hdf5: NULL argument");
    w.path = path;
    const mr_data_spec *spec = mr_data_element_spec(ds);
    w.ncomp = spec->n;
    size_t row = 0;
    for (int c = 0; c < spec->n; c++) {
        if (names) MR_CHECK(names[c] && names[c][0], MR_ERR_INVALID, "%s: dataset name %d is empty", path, c);
        snprintf(w.dnames[c], sizeof w.dnames[c], names ? "%s" : "/%s", names ? names[c] : spec->comp[c].name);
        row += mr_data_spec_bytes(spec, c);
    }
    /* elements per write / chunk: about 1 MiB, so reads in H5_BLOCK_BYTES blocks touch few chunks */
    int64_t per = row ? (int64_t)(H5_BLOCK_BYTES / row) : 4096;
    if (per < 1) per = 1;
    for (int c = 0; c < spec->n; c++) {
        size_t b = mr_data_spec_bytes(spec, c) * (size_t)per;
        bufs[c] = malloc(b ? b : 1);
        MR_CHECK(bufs[c], MR_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t tl = strlen(path) + 32;
    tmp = malloc(tl);
    MR_CHECK(tmp, MR_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    mr_h5_enter();
    locked = 1;
    w.file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    MR_TRY_H5(w.file, MR_ERR_IO, "%s: cannot create HDF5 file", tmp);
    for (int c = 0; c < spec->n; c++) {
        const mr_data_component *k = &spec->comp[c];
        switch (k->dtype) {
        case MR_F32: w.ftype[c] = H5Tcopy(H5T_NATIVE_FLOAT); break;
        case MR_F64: w.ftype[c] = H5Tcopy(H5T_NATIVE_DOUBLE); break;
        case MR_F16: w.ftype[c] = h5_half_type(); break;
        case MR_I32: w.ftype[c] = H5Tcopy(H5T_NATIVE_INT32); break;
        case MR_I64: w.ftype[c] = H5Tcopy(H5T_NATIVE_INT64); break;
        case MR_U8: w.ftype[c] = H5Tcopy(H5T_NATIVE_UINT8); break;
        default:
            MR_CHECK(0, MR_ERR_UNSUPPORTED, "%s: component '%s': dtype %s cannot be written to HDF5", path, k->name,
                     mr_dtype_name(k->dtype));
        }
        MR_TRY_H5(w.ftype[c], MR_ERR_INTERNAL, "%s: type for '%s'", path, k->name);
        w.rank[c] = k->shape.ndim + 1;
        hsize_t maxd[MR_MAX_DIMS], chunk[MR_MAX_DIMS];
        w.dims[c][0] = 0;
        maxd[0] = H5S_UNLIMITED;
        chunk[0] = (hsize_t)per;
        for (int d = 0; d < k->shape.ndim; d++) {
            w.dims[c][d + 1] = maxd[d + 1] = (hsize_t)k->shape.dim[d];
            chunk[d + 1] = k->shape.dim[d] ? (hsize_t)k->shape.dim[d] : 1;
        }
        sp = H5Screate_simple(w.rank[c], w.dims[c], maxd);
        MR_TRY_H5(sp, MR_ERR_INTERNAL, "%s: dataspace for '%s'", path, k->name);
        dcpl = H5Pcreate(H5P_DATASET_CREATE);
        MR_TRY_H5(dcpl, MR_ERR_INTERNAL, "%s: property list", path);
        MR_TRY_H5(H5Pset_chunk(dcpl, w.rank[c], chunk), MR_ERR_INVALID, "%s: chunking '%s'", path, k->name);
        hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
        MR_TRY_H5(lcpl, MR_ERR_INTERNAL, "%s: property list", path);
        H5Pset_create_intermediate_group(lcpl, 1);
        w.dset[c] = H5Dcreate2(w.file, w.dnames[c], w.ftype[c], sp, lcpl, dcpl, H5P_DEFAULT);
        H5Pclose(lcpl);
        MR_TRY_H5(w.dset[c], MR_ERR_INVALID, "%s: cannot create dataset '%s'", path, w.dnames[c]);
        H5Pclose(dcpl);
        H5Sclose(sp);
        dcpl = sp = -1;
    }
    mr_h5_leave();
    locked = 0;
    MR_TRY(mr_data_iter_new(ds, &it));
    int64_t have = 0;
    for (;;) {
        mr_data_elem e;
        int end;
        MR_TRY(mr_data_iter_next(it, &e, &end));
        if (end) break;
        int64_t k = mr_data_batch_size(ds) ? e.shape[0].dim[0] : 1;
        for (int64_t j = 0; j < k; j++) {
            for (int c = 0; c < spec->n; c++) {
                size_t eb = mr_data_spec_bytes(spec, c);
                memcpy((char *)bufs[c] + (size_t)have * eb, (const char *)e.data[c] + (size_t)j * eb, eb);
            }
            if (++have == per) {
                MR_TRY(h5_append(&w, have, bufs));
                have = 0;
            }
        }
    }
    MR_TRY(h5_append(&w, have, bufs));
    mr_h5_enter();
    locked = 1;
    for (int c = 0; c < w.ncomp; c++) {
        herr_t r = H5Dclose(w.dset[c]);
        w.dset[c] = -1;
        MR_TRY_H5(r, MR_ERR_IO, "%s: closing dataset '%s'", tmp, w.dnames[c]);
    }
    herr_t r = H5Fclose(w.file);
    w.file = -1;
    MR_TRY_H5(r, MR_ERR_IO, "%s: closing (flushing) the file", tmp);
    for (int c = 0; c < w.ncomp; c++) H5Tclose(w.ftype[c]);
    mr_h5_leave();
    locked = 0;
    MR_CHECK(rename(tmp, path) == 0, MR_ERR_IO, "%s: renaming %s into place failed: %s", path, tmp, strerror(errno));
    mr_data_iter_free(it);
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) free(bufs[c]);
    free(tmp);
    return MR_OK;
fail:
    if (!locked) mr_h5_enter();
    if (sp >= 0) H5Sclose(sp);
    if (dcpl >= 0) H5Pclose(dcpl);
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) {
        if (w.dset[c] >= 0) H5Dclose(w.dset[c]);
        if (w.ftype[c] >= 0) H5Tclose(w.ftype[c]);
    }
    if (w.file >= 0) H5Fclose(w.file);
    mr_h5_leave();
    if (tmp) unlink(tmp);
    mr_data_iter_free(it);
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) free(bufs[c]);
    free(tmp);
    return st;
}
