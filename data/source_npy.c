/* NumPy sources (data/sources.h): .npy files and .npz members, one array per component. The .npy
 * header (format versions 1-3: "\x93NUMPY", version, header length, a Python dict literal with
 * 'descr', 'fortran_order' and 'shape') is parsed here; the data is memory-mapped (a stored .npz
 * member too, at its offset in the archive) or, for a deflated .npz member, inflated with zlib
 * into memory once. Element i of a component is the bytes at data + i * element_bytes, widened
 * on read where mirror has no such dtype. Also the sharded-set helpers: glob expansion and concat. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/data_impl.h"
#include "data/sources.h"

/* How a stored element converts to mirror's dtype. */
typedef enum npy_conv { CV_COPY, CV_I8, CV_I16, CV_U16, CV_U32, CV_B1 } npy_conv;

typedef struct npy_arr {
    const unsigned char *data; /* first element */
    int64_t n;                 /* first dim */
    mr_shape shape;            /* per element */
    mr_dtype dt;
    npy_conv conv;
    size_t src_size;           /* bytes of one stored item */
    int64_t numel;             /* items per element */
    void *map;                 /* mmap'd region (or NULL) */
    size_t map_len;
    unsigned char *heap;       /* inflated member (or NULL) */
} npy_arr;

typedef struct npy_impl {
    int n;
    npy_arr a[MR_DATA_MAX_COMPONENTS];
} npy_impl;

static void npy_free(void *p) {
    npy_impl *v = p;
    if (!v) return;
    for (int c = 0; c < v->n; c++) {
        if (v->a[c].map) munmap(v->a[c].map, v->a[c].map_len);
        free(v->a[c].heap);
    }
    free(v);
}

static mr_status npy_read(void *p, int64_t idx, void *const out[]) {
    const npy_impl *v = p;
    for (int c = 0; c < v->n; c++) {
        const npy_arr *a = &v->a[c];
        const unsigned char *s = a->data + (size_t)idx * (size_t)a->numel * a->src_size;
        int64_t k = a->numel;
        int32_t *o32 = out[c];
        int64_t *o64 = out[c];
        switch (a->conv) {
        case CV_COPY: memcpy(out[c], s, (size_t)k * a->src_size); break;
        case CV_I8: for (int64_t i = 0; i < k; i++) o32[i] = (int8_t)s[i]; break;
        case CV_B1: for (int64_t i = 0; i < k; i++) o32[i] = s[i] != 0; break;
        case CV_I16: for (int64_t i = 0; i < k; i++) o32[i] = (int16_t)(s[2 * i] | (s[2 * i + 1] << 8)); break;
        case CV_U16: for (int64_t i = 0; i < k; i++) o32[i] = s[2 * i] | (s[2 * i + 1] << 8); break;
        case CV_U32:
            for (int64_t i = 0; i < k; i++)
                o64[i] = (int64_t)((uint32_t)s[4 * i] | ((uint32_t)s[4 * i + 1] << 8) | ((uint32_t)s[4 * i + 2] << 16) |
                                   ((uint32_t)s[4 * i + 3] << 24));
            break;
        }
    }
    return MR_OK;
}

/* ---- the .npy header ---------------------------------------------------------------------------- */

/* The value text after 'key': in the header dict (NULL if absent). */
static const char *dict_value(const char *h, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *k = strstr(h, pat);
    if (!k) return NULL;
    k += strlen(pat);
    while (*k == ' ') k++;
    if (*k != ':') return NULL;
    k++;
    while (*k == ' ') k++;
    return k;
}

/* Parses the header text of `what` (the file, or "file member") whose data starts at byte
 * `data_off` of a buffer of `avail` bytes after the header. */
static mr_status parse_header(const char *h, const char *what, int64_t hoff, npy_arr *a, int *ndim, int64_t dims[]) {
    const char *d = dict_value(h, "descr");
    if (d && *d == '[')
        return mr_set_error(MR_ERR_UNSUPPORTED, "%s: offset %lld: a structured dtype (%.40s...); HINT: save each field as "
                                                "its own plain numeric array", what, (long long)hoff, d);
    if (!d || (*d != '\'' && *d != '"'))
        return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: the .npy header has no 'descr' string; HINT: is this a "
                                           "file written by numpy.save?", what, (long long)hoff);
    char q = *d++;
    char descr[16] = {0};
    size_t L = 0;
    while (d[L] && d[L] != q && L < sizeof descr - 1) { descr[L] = d[L]; L++; }
    if (d[L] != q)
        return mr_set_error(MR_ERR_UNSUPPORTED, "%s: offset %lld: dtype is a structured or record dtype; HINT: save a "
                                                "plain numeric array", what, (long long)hoff);
    static const struct { const char *d; mr_dtype dt; npy_conv cv; size_t sz; } T[] = {
        {"|u1", MR_U8, CV_COPY, 1}, {"<u1", MR_U8, CV_COPY, 1}, {"|i1", MR_I32, CV_I8, 1}, {"<i1", MR_I32, CV_I8, 1},
        {"|b1", MR_I32, CV_B1, 1},  {"<i2", MR_I32, CV_I16, 2}, {"<u2", MR_I32, CV_U16, 2}, {"<i4", MR_I32, CV_COPY, 4},
        {"<u4", MR_I64, CV_U32, 4}, {"<i8", MR_I64, CV_COPY, 8}, {"<f2", MR_F16, CV_COPY, 2}, {"<f4", MR_F32, CV_COPY, 4},
        {"<f8", MR_F64, CV_COPY, 8},
    };
    int found = -1;
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(descr, T[i].d)) found = (int)i;
    if (found < 0) {
        const char *why = descr[0] == '>' ? " (big-endian; HINT: save arr.astype(arr.dtype.newbyteorder('<')))"
                          : descr[1] == 'O' ? " (an object array; HINT: save a numeric array, not Python objects)"
                          : "; HINT: use uint8, int8/16/32/64, uint16/32, bool, float16/32/64";
        return mr_set_error(MR_ERR_UNSUPPORTED, "%s: offset %lld: dtype '%s' is not supported%s", what, (long long)hoff,
                            descr, why);
    }
    a->dt = T[found].dt;
    a->conv = T[found].cv;
    a->src_size = T[found].sz;
    const char *fo = dict_value(h, "fortran_order");
    if (!fo || (strncmp(fo, "False", 5) && strncmp(fo, "True", 4)))
        return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: the .npy header has no fortran_order True/False", what,
                            (long long)hoff);
    if (!strncmp(fo, "True", 4))
        return mr_set_error(MR_ERR_UNSUPPORTED, "%s: offset %lld: the array is in Fortran order; HINT: save "
                                                "numpy.ascontiguousarray(arr) (C order)", what, (long long)hoff);
    const char *s = dict_value(h, "shape");
    if (!s || *s != '(') return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: the .npy header has no shape tuple", what, (long long)hoff);
    s++;
    *ndim = 0;
    for (;;) {
        while (*s == ' ' || *s == ',') s++;
        if (*s == ')') break;
        char *end = NULL;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || v < 0 || v > ((int64_t)1 << 40) || *ndim == MR_MAX_DIMS)
            return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: bad shape in the .npy header", what, (long long)hoff);
        dims[(*ndim)++] = v;
        s = end;
    }
    if (*ndim == 0)
        return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: a 0-d array (shape ()); HINT: the first dim is the "
                                           "element count", what, (long long)hoff);
    return MR_OK;
}

/* Parses the .npy at p (len bytes, from byte `base` of the file, for messages) into a. */
static mr_status parse_npy(const unsigned char *p, size_t len, int64_t base, const char *what, npy_arr *a) {
    char hdr[4097];
    if (len < 10 || memcmp(p, "\x93NUMPY", 6))
        return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: bad .npy magic (expected \\x93NUMPY); HINT: is this a "
                                           "file written by numpy.save?", what, (long long)base);
    int major = p[6];
    size_t hl, ho;
    if (major == 1) hl = (size_t)p[8] | ((size_t)p[9] << 8), ho = 10;
    else if (major == 2 || major == 3) {
        if (len < 12) return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: truncated .npy header", what, (long long)base);
        hl = (size_t)p[8] | ((size_t)p[9] << 8) | ((size_t)p[10] << 16) | ((size_t)p[11] << 24), ho = 12;
    } else
        return mr_set_error(MR_ERR_UNSUPPORTED, "%s: offset %lld: .npy format version %d (1 to 3 are read)", what,
                            (long long)(base + 6), major);
    if (hl >= sizeof hdr || ho + hl > len)
        return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: .npy header of %zu bytes %s", what, (long long)(base + 8), hl,
                            hl >= sizeof hdr ? "is too long" : "runs past the end of the file");
    memcpy(hdr, p + ho, hl);
    hdr[hl] = '\0';
    int ndim = 0;
    int64_t dims[MR_MAX_DIMS];
    mr_status st = parse_header(hdr, what, base + (int64_t)ho, a, &ndim, dims);
    if (st) return st;
    a->n = dims[0];
    a->shape = mr_shape_make(ndim - 1, dims + 1);
    /* the product of the element's non-zero dims, capped before it can wrap (dims up to 2^40
     * each): a shape like (1, 2^32, 2^32) or (1, 2^32, 2^32, 0) is too large, not 2^64 = 0 */
    int64_t numel = 1;
    for (int d = 1; d < ndim; d++)
        if (dims[d]) numel = numel > ((int64_t)1 << 30) / dims[d] ? INT64_MAX : numel * dims[d];
    a->numel = numel > ((int64_t)1 << 30) ? numel : mr_shape_numel(&a->shape);
    if (numel > ((int64_t)1 << 30) || (a->numel && (uint64_t)a->n > ((uint64_t)1 << 42) / (uint64_t)a->numel))
        return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: shape too large", what, (long long)(base + (int64_t)ho));
    size_t need = (size_t)a->n * (size_t)a->numel * a->src_size;
    if (ho + hl + need > len)
        return mr_set_error(MR_ERR_FORMAT, "%s: truncated: the shape needs %zu data bytes from offset %lld, the data ends "
                                           "at offset %lld", what, need, (long long)(base + (int64_t)(ho + hl)),
                            (long long)(base + (int64_t)len));
    a->data = p + ho + hl;
    return MR_OK;
}

/* ---- .npz (zip) members -------------------------------------------------------------------------- */

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Finds member `want` (or want + ".npy") in the zip at m (len bytes): its stored bytes *p and *plen,
 * inflated into *heap when deflated. */
static mr_status npz_member(const unsigned char *m, size_t len, const char *path, const char *want,
                            const unsigned char **p, size_t *plen, unsigned char **heap, int64_t *base) {
    *heap = NULL;
    int64_t eocd = -1;
    for (int64_t i = (int64_t)len - 22; i >= 0 && i >= (int64_t)len - 22 - 65535; i--)
        if (le(m + i, 4) == 0x06054b50u) { eocd = i; break; }
    if (eocd < 0)
        return mr_set_error(MR_ERR_FORMAT, "%s: no zip end-of-directory record; HINT: is this a .npz written by "
                                           "numpy.savez (or a truncated copy)?", path);
    uint64_t entries = le(m + eocd + 10, 2), cd = le(m + eocd + 16, 4);
    if (cd == 0xFFFFFFFFu || entries == 0xFFFF) { /* zip64 */
        if (eocd < 20 || le(m + eocd - 20, 4) != 0x07064b50u)
            return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: zip64 locator missing", path, (long long)(eocd - 20));
        uint64_t z = le(m + eocd - 20 + 8, 8);
        if (z > len || len - z < 56 || le(m + z, 4) != 0x06064b50u)
            return mr_set_error(MR_ERR_FORMAT, "%s: offset %llu: bad zip64 end-of-directory record", path,
                                (unsigned long long)z);
        entries = le(m + z + 32, 8), cd = le(m + z + 48, 8);
    }
    size_t wl = strlen(want);
    uint64_t at = cd;
    for (uint64_t e = 0; e < entries; e++) {
        if (at > len || len - at < 46 || le(m + at, 4) != 0x02014b50u)
            return mr_set_error(MR_ERR_FORMAT, "%s: offset %llu: bad zip central directory entry %llu", path,
                                (unsigned long long)at, (unsigned long long)e);
        uint64_t method = le(m + at + 10, 2), csize = le(m + at + 20, 4), usize = le(m + at + 24, 4);
        uint64_t nl = le(m + at + 28, 2), xl = le(m + at + 30, 2), cl = le(m + at + 32, 2), loff = le(m + at + 42, 4);
        if (at + 46 + nl + xl > len)
            return mr_set_error(MR_ERR_FORMAT, "%s: offset %llu: zip entry runs past the end", path, (unsigned long long)at);
        const char *name = (const char *)m + at + 46;
        int match = (nl == wl && !memcmp(name, want, wl)) || (nl == wl + 4 && !memcmp(name, want, wl) && !memcmp(name + wl, ".npy", 4));
        if (match) {
            const uint64_t xend = at + 46 + nl + xl; /* <= len, checked above */
            for (uint64_t x = at + 46 + nl; x + 4 <= xend;) { /* zip64 extra: sizes/offset in order */
                uint64_t id = le(m + x, 2), sz = le(m + x + 2, 2), q = x + 4;
                uint64_t end = x + 4 + sz < xend ? x + 4 + sz : xend; /* a field may not claim past the extras */
                if (id == 1) {
                    if (usize == 0xFFFFFFFFu && q + 8 <= end) usize = le(m + q, 8), q += 8;
                    if (csize == 0xFFFFFFFFu && q + 8 <= end) csize = le(m + q, 8), q += 8;
                    if (loff == 0xFFFFFFFFu && q + 8 <= end) loff = le(m + q, 8), q += 8;
                }
                x += 4 + sz;
            }
            if (loff > len || len - loff < 30 || le(m + loff, 4) != 0x04034b50u)
                return mr_set_error(MR_ERR_FORMAT, "%s: offset %llu: bad zip local header of member %s", path,
                                    (unsigned long long)loff, want);
            uint64_t data = loff + 30 + le(m + loff + 26, 2) + le(m + loff + 28, 2);
            if (data > len || csize > len - data)
                return mr_set_error(MR_ERR_FORMAT, "%s: truncated: member %s needs %llu bytes at offset %llu", path, want,
                                    (unsigned long long)csize, (unsigned long long)data);
            *base = (int64_t)data;
            if (method == 0) {
                *p = m + data;
                *plen = (size_t)csize;
                return MR_OK;
            }
            if (method != 8)
                return mr_set_error(MR_ERR_UNSUPPORTED, "%s: member %s uses zip compression method %llu (stored and "
                                                        "deflate are read); HINT: numpy.savez or numpy.savez_compressed",
                                    path, want, (unsigned long long)method);
            if (usize > ((uint64_t)1 << 40))
                return mr_set_error(MR_ERR_FORMAT, "%s: member %s claims %llu bytes", path, want, (unsigned long long)usize);
            if (usize / 1032 > csize + 1) /* deflate expands at most 1032:1 (zlib FAQ: 2 bits per 258-byte match) */
                return mr_set_error(MR_ERR_FORMAT, "%s: member %s claims %llu inflated bytes from %llu compressed, more than "
                                                   "deflate's 1032:1; HINT: the archive's directory is corrupt", path, want,
                                    (unsigned long long)usize, (unsigned long long)csize);
            *heap = malloc(usize ? (size_t)usize : 1);
            if (!*heap) return mr_set_error(MR_ERR_NOMEM, "%s: out of memory inflating member %s", path, want);
            z_stream zs;
            memset(&zs, 0, sizeof zs);
            if (inflateInit2(&zs, -15) != Z_OK) return mr_set_error(MR_ERR_NOMEM, "%s: zlib init failed", path);
            zs.next_in = (unsigned char *)(m + data);
            zs.next_out = *heap;
            int r = Z_OK;
            uint64_t in_left = csize, out_left = usize;
            while (r == Z_OK) { /* avail_* are 32-bit: feed in slices */
                if (!zs.avail_in && in_left) { zs.avail_in = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left; in_left -= zs.avail_in; }
                if (!zs.avail_out && out_left) { zs.avail_out = out_left > (1u << 30) ? (1u << 30) : (uInt)out_left; out_left -= zs.avail_out; }
                r = inflate(&zs, Z_NO_FLUSH);
                if (r == Z_BUF_ERROR && (zs.avail_in || in_left) && (zs.avail_out || out_left)) r = Z_OK;
            }
            uint64_t got = zs.total_out, used = zs.total_in;
            inflateEnd(&zs);
            if (r != Z_STREAM_END || got != usize)
                return mr_set_error(MR_ERR_FORMAT, "%s: member %s: corrupt deflate data near offset %llu (%llu of %llu bytes "
                                                   "inflated)", path, want, (unsigned long long)(data + used),
                                    (unsigned long long)got, (unsigned long long)usize);
            *p = *heap;
            *plen = (size_t)usize;
            *base = 0; /* offsets in messages are then within the inflated member */
            return MR_OK;
        }
        at += 46 + nl + xl + cl;
    }
    return mr_set_error(MR_ERR_NOT_FOUND, "%s: no member '%s' in the archive; HINT: numpy.load('%s').files lists them",
                        path, want, path);
}

/* Maps path read-only: *m, *len (a 0-byte file maps nothing: *m is NULL). */
static mr_status map_file(const char *path, const char *kind, void **m, size_t *len) {
    *m = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mr_set_error(errno == ENOENT ? MR_ERR_NOT_FOUND : MR_ERR_IO, "%s: cannot open %s: %s", path, kind,
                            strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return mr_set_error(MR_ERR_IO, "%s: stat failed: %s", path, strerror(e));
    }
    *len = (size_t)sb.st_size;
    if (*len) {
        void *p = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return mr_set_error(MR_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
        }
        *m = p;
    }
    close(fd);
    return MR_OK;
}

mr_status mr_data_from_npy(const char *const paths[], const char *const members[], const char *const names[], int n,
                           mr_dataset **out) {
    mr_status st = MR_OK;
    npy_impl *v = NULL;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_from_npy: out is NULL");
    *out = NULL;
    MR_CHECK(paths && names && n >= 1 && n <= MR_DATA_MAX_COMPONENTS, MR_ERR_INVALID,
             "mr_data_from_npy: need 1 to %d arrays, got %d", MR_DATA_MAX_COMPONENTS, n);
    v = calloc(1, sizeof *v);
    MR_CHECK(v, MR_ERR_NOMEM, "npy: out of memory");
    mr_data_spec spec = {0};
    for (int c = 0; c < n; c++) {
        MR_CHECK(paths[c] && names[c], MR_ERR_INVALID, "mr_data_from_npy: path or name %d is NULL", c);
        const char *member = members ? members[c] : NULL;
        npy_arr *a = &v->a[c];
        v->n = c + 1;
        MR_TRY(map_file(paths[c], member ? ".npz archive" : ".npy file", &a->map, &a->map_len));
        char what[1200];
        const unsigned char *p = a->map;
        size_t plen = a->map_len;
        int64_t base = 0;
        if (member) {
            snprintf(what, sizeof what, "%s member %s", paths[c], member);
            MR_TRY(npz_member(a->map, a->map_len, paths[c], member, &p, &plen, &a->heap, &base));
        } else {
            snprintf(what, sizeof what, "%s", paths[c]);
        }
        MR_TRY(parse_npy(p, plen, base, what, a));
        MR_CHECK(c == 0 || a->n == v->a[0].n, MR_ERR_FORMAT, "%s: %lld elements (first dim) but %s%s%s has %lld", what,
                 (long long)a->n, paths[0], members && members[0] ? " member " : "", members && members[0] ? members[0] : "",
                 (long long)v->a[0].n);
        MR_TRY(mr_data_spec_add(&spec, names[c], a->dt, &a->shape));
    }
    return ds_new_source(&spec, v->a[0].n, npy_read, npy_free, v, "npy", out); /* frees v on error */
fail:
    npy_free(v);
    return st;
}

/* ---- sharded file sets ------------------------------------------------------------------------- */

void mr_data_paths_free(char **paths, int n) {
    if (!paths) return;
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

static int push_path(char ***v, int *n, int *cap, const char *s, size_t len) {
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 8;
        char **r = realloc(*v, sizeof(char *) * (size_t)c);
        if (!r) return 0;
        *v = r;
        *cap = c;
    }
    char *d = malloc(len + 1);
    if (!d) return 0;
    memcpy(d, s, len);
    d[len] = '\0';
    (*v)[(*n)++] = d;
    return 1;
}

mr_status mr_data_expand_paths(const char *pattern, char ***paths, int *n) {
    mr_status st = MR_OK;
    char **v = NULL;
    int cnt = 0, cap = 0;
    *paths = NULL;
    *n = 0;
    MR_CHECK(pattern && *pattern, MR_ERR_INVALID, "data: empty path");
    for (const char *s = pattern; *s;) {
        const char *e = strchr(s, '\n');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        char one[4096];
        MR_CHECK(len > 0 && len < sizeof one, MR_ERR_INVALID, "data: empty or too long path in the list '%s'", pattern);
        memcpy(one, s, len);
        one[len] = '\0';
        if (strpbrk(one, "*?[")) {
            glob_t g;
            int r = glob(one, 0, NULL, &g); /* sorted by name (LC_COLLATE) */
            if (r == GLOB_NOMATCH) {
                globfree(&g);
                MR_CHECK(0, MR_ERR_NOT_FOUND, "%s: no file matches the pattern; HINT: check the directory and the glob "
                                              "(*, ?, [...])", one);
            }
            MR_CHECK(r == 0, r == GLOB_NOSPACE ? MR_ERR_NOMEM : MR_ERR_IO, "%s: cannot expand the pattern", one);
            for (size_t i = 0; i < g.gl_pathc; i++)
                if (!push_path(&v, &cnt, &cap, g.gl_pathv[i], strlen(g.gl_pathv[i]))) {
                    globfree(&g);
                    MR_CHECK(0, MR_ERR_NOMEM, "data: out of memory");
                }
            globfree(&g);
        } else {
            MR_CHECK(push_path(&v, &cnt, &cap, one, len), MR_ERR_NOMEM, "data: out of memory");
        }
        s = e ? e + 1 : s + len;
    }
    *paths = v;
    *n = cnt;
    return MR_OK;
fail:
    mr_data_paths_free(v, cnt);
    return st;
}

mr_status mr_data_concat(mr_dataset *const *inputs, int n, mr_dataset **out) {
    if (!out) return mr_set_error(MR_ERR_INVALID, "concat: out is NULL");
    *out = NULL;
    if (inputs && n == 1 && inputs[0]) {
        atomic_fetch_add(&inputs[0]->refs, 1);
        *out = inputs[0];
        return MR_OK;
    }
    /* cycle 1 and a block longer than any input: every input whole, in order */
    return mr_data_interleave(inputs, n, 1, INT64_MAX / 2, out);
}
