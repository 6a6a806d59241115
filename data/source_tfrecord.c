/* TFRecord source (data/sources.h): files of tf.train.Example records, decoded with protobuf-c
 * from proto/example.proto (TensorFlow's field numbers). The record framing and its masked
 * CRC-32C are data/tfrecord.h's (shared with the TensorBoard event writer).
 *
 * Random access: opening the file reads it once (memory-mapped, or inflated into memory when it
 * starts with the gzip magic and not with a valid record header:
 * TFRecordOptions(compression_type="GZIP")) and builds an index of
 * record offsets, verifying every length CRC and that no record is cut short. Element i is then
 * record i: its data CRC is checked, the Example unpacked and each configured feature copied out
 * by key. So shuffle, shard and resume work as for every other source. Errors name the file, the
 * record number and its byte offset. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/data_impl.h"
#include "data/sources.h"
#include "data/tfrecord.h"
#include "proto/example.pb-c.h"

typedef struct tfr_impl {
    const uint8_t *buf; /* the file's (decompressed) bytes */
    size_t len;
    void *map;          /* mmap'd file, or NULL */
    uint8_t *heap;      /* inflated gzip file, or NULL */
    int64_t n;
    uint64_t *off;      /* record k starts at off[k] (its 12-byte header) */
    int nf;
    mr_tfrecord_feature f[MR_DATA_MAX_COMPONENTS];
    char key[MR_DATA_MAX_COMPONENTS][128];
    int64_t numel[MR_DATA_MAX_COMPONENTS];
    int gz;
    char path[];
} tfr_impl;

static void tfr_free(void *p) {
    tfr_impl *t = p;
    if (!t) return;
    if (t->map) munmap(t->map, t->len);
    free(t->heap);
    free(t->off);
    free(t);
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24); }

static const char *kind_name(int kc) {
    return kc == TENSORFLOW__FEATURE__KIND_BYTES_LIST   ? "a bytes_list"
           : kc == TENSORFLOW__FEATURE__KIND_FLOAT_LIST ? "a float_list"
           : kc == TENSORFLOW__FEATURE__KIND_INT64_LIST ? "an int64_list"
                                                        : "empty (no list)";
}

/* The list kind that carries dtype dt. */
static int kind_of(mr_dtype dt) {
    return dt == MR_U8 ? TENSORFLOW__FEATURE__KIND_BYTES_LIST
           : dt == MR_F32 ? TENSORFLOW__FEATURE__KIND_FLOAT_LIST : TENSORFLOW__FEATURE__KIND_INT64_LIST;
}

static const Tensorflow__Feature *find(const Tensorflow__Example *ex, const char *key) {
    if (!ex->features) return NULL;
    for (size_t i = 0; i < ex->features->n_feature; i++)
        if (ex->features->feature[i]->key && !strcmp(ex->features->feature[i]->key, key)) return ex->features->feature[i]->value;
    return NULL;
}

/* Values of feature f in this record: *count, and the bytes of a bytes_list's single value. */
static mr_status feature_count(const tfr_impl *t, int64_t rec, int c, const Tensorflow__Feature *f, int64_t *count) {
    const mr_tfrecord_feature *w = &t->f[c];
    const char *dt = mr_dtype_name(w->dtype);
    if (!f)
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld (byte %llu): feature '%s' is missing; HINT: check "
                                           "features.%s.key against the file's feature names", t->path, (long long)rec,
                            (unsigned long long)t->off[rec], w->key, w->name);
    if ((int)f->kind_case != kind_of(w->dtype))
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld (byte %llu): feature '%s' is %s, but features.%s.dtype is %s "
                                           "(read from %s); HINT: uint8 reads bytes, int64/int32 int64_list, float32 "
                                           "float_list", t->path, (long long)rec, (unsigned long long)t->off[rec], w->key,
                            kind_name((int)f->kind_case), w->name, dt, kind_name(kind_of(w->dtype)));
    if (f->kind_case == TENSORFLOW__FEATURE__KIND_BYTES_LIST) {
        if (f->bytes_list->n_value != 1)
            return mr_set_error(MR_ERR_FORMAT, "%s: record %lld (byte %llu): feature '%s' holds %zu byte strings (one raw "
                                               "array is read)", t->path, (long long)rec, (unsigned long long)t->off[rec],
                                w->key, f->bytes_list->n_value);
        *count = (int64_t)f->bytes_list->value[0].len;
    } else {
        *count = f->kind_case == TENSORFLOW__FEATURE__KIND_FLOAT_LIST ? (int64_t)f->float_list->n_value
                                                                       : (int64_t)f->int64_list->n_value;
    }
    return MR_OK;
}

/* Checks record rec's data CRC and unpacks it. */
static mr_status unpack(const tfr_impl *t, int64_t rec, Tensorflow__Example **ex) {
    const uint8_t *h = t->buf + t->off[rec];
    uint64_t n = le64(h);
    const uint8_t *d = h + 12;
    uint32_t want = le32(d + n), got = mr_crc32c_mask(mr_crc32c(d, (size_t)n));
    *ex = NULL;
    if (want != got)
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu: data CRC mismatch (stored %08x, computed %08x): "
                                           "the file is corrupt; HINT: copy or write it again", t->path, (long long)rec,
                            (unsigned long long)t->off[rec], want, got);
    *ex = tensorflow__example__unpack(NULL, (size_t)n, d);
    if (!*ex)
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu: not a tf.train.Example (protobuf decoding "
                                           "failed); HINT: is this a TFRecord of Examples (not SequenceExamples or "
                                           "event files)?", t->path, (long long)rec, (unsigned long long)t->off[rec]);
    return MR_OK;
}

static mr_status tfr_read(void *p, int64_t idx, void *const out[]) {
    const tfr_impl *t = p;
    Tensorflow__Example *ex = NULL;
    mr_status st = unpack(t, idx, &ex);
    if (st) return st;
    for (int c = 0; c < t->nf && st == MR_OK; c++) {
        const Tensorflow__Feature *f = find(ex, t->f[c].key);
        int64_t cnt = 0;
        st = feature_count(t, idx, c, f, &cnt);
        if (st) break;
        if (cnt != t->numel[c]) {
            st = mr_set_error(MR_ERR_FORMAT, "%s: record %lld (byte %llu): feature '%s' has %lld values, record 0 has "
                                             "%lld (every element is one shape)", t->path, (long long)idx,
                              (unsigned long long)t->off[idx], t->f[c].key, (long long)cnt, (long long)t->numel[c]);
            break;
        }
        switch (t->f[c].dtype) {
        case MR_U8: memcpy(out[c], f->bytes_list->value[0].data, (size_t)cnt); break;
        case MR_F32: memcpy(out[c], f->float_list->value, sizeof(float) * (size_t)cnt); break;
        case MR_I64: memcpy(out[c], f->int64_list->value, sizeof(int64_t) * (size_t)cnt); break;
        default: /* MR_I32 */
            for (int64_t k = 0; k < cnt; k++) {
                int64_t v = f->int64_list->value[k];
                if (v < INT32_MIN || v > INT32_MAX) {
                    st = mr_set_error(MR_ERR_FORMAT, "%s: record %lld (byte %llu): feature '%s' value %lld does not fit "
                                                     "int32; HINT: dtype int64", t->path, (long long)idx,
                                      (unsigned long long)t->off[idx], t->f[c].key, (long long)v);
                    break;
                }
                ((int32_t *)out[c])[k] = (int32_t)v;
            }
        }
    }
    tensorflow__example__free_unpacked(ex, NULL);
    return st;
}

/* Reads the whole file into t->buf (mmap, or inflate when gzip). */
static mr_status load(tfr_impl *t) {
    int fd = open(t->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mr_set_error(errno == ENOENT ? MR_ERR_NOT_FOUND : MR_ERR_IO, "%s: cannot open TFRecord file: %s", t->path,
                            strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return mr_set_error(MR_ERR_IO, "%s: stat failed: %s", t->path, strerror(e));
    }
    size_t len = (size_t)sb.st_size;
    uint8_t magic[12] = {0};
    if (len >= 2 && pread(fd, magic, len < 12 ? 2 : 12, 0) != (ssize_t)(len < 12 ? 2 : 12)) magic[0] = 0;
    /* gzip's magic, unless the bytes are a TFRecord header with a valid length CRC (a plain file
     * whose first record is 0x8b1f bytes long, mod 2^16, starts with 1f 8b too) */
    const int plain = len >= 12 && le32(magic + 8) == mr_crc32c_mask(mr_crc32c(magic, 8));
    if (magic[0] == 0x1f && magic[1] == 0x8b && !plain) { /* GZIP TFRecord: the whole stream inflates to records */
        close(fd);
        t->gz = 1;
        gzFile g = gzopen(t->path, "rb");
        if (!g) return mr_set_error(MR_ERR_IO, "%s: cannot open gzip TFRecord file", t->path);
        size_t cap = len * 4 + 4096, have = 0;
        for (;;) {
            if (have == cap) cap *= 2;
            uint8_t *q = realloc(t->heap, cap);
            if (!q) { gzclose(g); return mr_set_error(MR_ERR_NOMEM, "%s: out of memory inflating", t->path); }
            t->heap = q;
            size_t want = cap - have > (1u << 30) ? (1u << 30) : cap - have;
            int r = gzread(g, t->heap + have, (unsigned)want);
            if (r < 0) {
                int en = 0;
                const char *msg = gzerror(g, &en);
                mr_status s = mr_set_error(MR_ERR_FORMAT, "%s: corrupt gzip data near decompressed byte %zu: %s; HINT: "
                                                          "is the file complete?", t->path, have, msg);
                gzclose(g);
                return s;
            }
            if (r == 0) break;
            have += (size_t)r;
        }
        int en = 0;
        const char *msg = gzerror(g, &en);
        if (en != Z_OK && en != Z_STREAM_END) {
            mr_status s = mr_set_error(MR_ERR_FORMAT, "%s: truncated or corrupt gzip stream after %zu bytes: %s", t->path,
                                       have, msg);
            gzclose(g);
            return s;
        }
        gzclose(g);
        t->buf = t->heap;
        t->len = have;
        return MR_OK;
    }
    if (len) {
        void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return mr_set_error(MR_ERR_IO, "%s: mmap failed: %s", t->path, strerror(e));
        }
        t->map = m;
        t->buf = m;
    }
    t->len = len;
    close(fd);
    return MR_OK;
}

/* One pass over the framing: the index of record offsets, length CRCs verified. */
static mr_status index_records(tfr_impl *t) {
    size_t cap = 0;
    for (uint64_t at = 0; at < t->len;) {
        if (t->len - at < 12)
            return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu is cut short: %llu bytes of its 12-byte header; "
                                               "HINT: the file was truncated (an interrupted copy or write)", t->path,
                                (long long)t->n, (unsigned long long)at, (unsigned long long)(t->len - at));
        const uint8_t *h = t->buf + at;
        uint32_t want = le32(h + 8), got = mr_crc32c_mask(mr_crc32c(h, 8));
        if (want != got)
            return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu: length CRC mismatch (stored %08x, computed "
                                               "%08x); HINT: is this a TFRecord file%s?", t->path, (long long)t->n,
                                (unsigned long long)at, want, got, t->gz ? "" : " (a GZIP one starts with 1f 8b)");
        uint64_t n = le64(h);
        if (n > t->len - at - 12 || t->len - at - 12 - n < 4)
            return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu is cut short: it declares %llu data bytes, the "
                                               "file has %llu after its header; HINT: the file was truncated", t->path,
                                (long long)t->n, (unsigned long long)at, (unsigned long long)n,
                                (unsigned long long)(t->len - at - 12));
        if ((size_t)t->n == cap) {
            cap = cap ? cap * 2 : 1024;
            uint64_t *o = realloc(t->off, sizeof(uint64_t) * cap);
            if (!o) return mr_set_error(MR_ERR_NOMEM, "%s: out of memory for the record index", t->path);
            t->off = o;
        }
        t->off[t->n++] = at;
        at += 12 + n + 4;
    }
    return MR_OK;
}

mr_status mr_data_from_tfrecord(const char *path, const mr_tfrecord_feature *features, int n, mr_dataset **out) {
    mr_status st = MR_OK;
    tfr_impl *t = NULL;
    Tensorflow__Example *ex = NULL;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_from_tfrecord: out is NULL");
    *out = NULL;
    MR_CHECK(path && features && n >= 1 && n <= MR_DATA_MAX_COMPONENTS, MR_ERR_INVALID,
             "mr_data_from_tfrecord: need a path and 1 to %d features, got %d", MR_DATA_MAX_COMPONENTS, n);
    t = calloc(1, sizeof *t + strlen(path) + 1);
    MR_CHECK(t, MR_ERR_NOMEM, "%s: out of memory", path);
    strcpy(t->path, path);
    t->nf = n;
    for (int c = 0; c < n; c++) {
        const mr_tfrecord_feature *f = &features[c];
        MR_CHECK(f->key && f->key[0] && strlen(f->key) < sizeof t->key[c] && f->name && f->name[0], MR_ERR_INVALID,
                 "%s: feature %d needs a key (under 128 bytes) and a name", path, c);
        MR_CHECK(f->dtype == MR_U8 || f->dtype == MR_I64 || f->dtype == MR_I32 || f->dtype == MR_F32, MR_ERR_INVALID,
                 "%s: features.%s.dtype %s is not read from a tf.train.Example; HINT: uint8 (bytes), int64 or int32 "
                 "(int64_list), float32 (float_list)", path, f->name, mr_dtype_name(f->dtype));
        t->f[c] = *f;
        strcpy(t->key[c], f->key);
        t->f[c].key = t->key[c];
    }
    MR_TRY(load(t));
    MR_TRY(index_records(t));
    MR_CHECK(t->n > 0, MR_ERR_FORMAT, "%s: no records (an empty file); HINT: a TFRecord set needs at least one record per "
                                      "file", path);
    /* the element spec: from the config's shape, else record 0's value counts */
    MR_TRY(unpack(t, 0, &ex));
    mr_data_spec spec = {0};
    for (int c = 0; c < n; c++) {
        int64_t cnt = 0;
        MR_TRY(feature_count(t, 0, c, find(ex, t->f[c].key), &cnt));
        mr_shape s = features[c].shape;
        if (s.ndim < 0) s = cnt == 1 && t->f[c].dtype != MR_U8 ? mr_shape_make(0, NULL) : mr_shape_1d(cnt);
        MR_CHECK(mr_shape_numel(&s) == cnt, MR_ERR_FORMAT,
                 "%s: record 0 (byte 0): feature '%s' has %lld values, features.%s.shape needs %lld", path, t->f[c].key,
                 (long long)cnt, features[c].name, (long long)mr_shape_numel(&s));
        t->numel[c] = cnt;
        MR_TRY(mr_data_spec_add(&spec, features[c].name, t->f[c].dtype, &s));
    }
    tensorflow__example__free_unpacked(ex, NULL);
    ex = NULL;
    return ds_new_source(&spec, t->n, tfr_read, tfr_free, t, "tfrecord", out); /* frees t on error */
fail:
    if (ex) tensorflow__example__free_unpacked(ex, NULL);
    tfr_free(t);
    return st;
}
