/* File sources: IDX (the MNIST format, gzipped or plain, loaded into memory) and flat token files
 * (uint16/uint32, nanoGPT raw or llm.c header, read on demand with pread so several threads can
 * read windows at once). Every malformed input is an MR_ERR_* naming the file and byte offset. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/data_impl.h"

/* ---- IDX ------------------------------------------------------------------------------------ */

typedef struct idx_file {
    int ndim;
    int64_t dims[MR_MAX_DIMS];
    unsigned char *data; /* prod(dims) bytes */
    int64_t count;       /* prod(dims) */
} idx_file;

/* Reads exactly n bytes at decompressed offset *off into dst. what names the field. */
static mr_status gz_read_exact(gzFile gz, void *dst, size_t n, int64_t *off, const char *path, const char *what) {
    size_t got = 0;
    while (got < n) {
        size_t want = n - got;
        if (want > (1u << 30)) want = 1u << 30;
        int r = gzread(gz, (char *)dst + got, (unsigned)want);
        if (r < 0) {
            int errnum = 0;
            const char *msg = gzerror(gz, &errnum);
            return mr_set_error(MR_ERR_FORMAT, "%s: corrupt gzip data while reading %s near offset %lld: %s", path, what,
                                (long long)(*off + (int64_t)got), msg);
        }
        if (r == 0) {
            int errnum = 0;
            const char *msg = gzerror(gz, &errnum);
            return mr_set_error(MR_ERR_FORMAT, "%s: truncated: %s needs %zu bytes at offset %lld, the data ends at offset %lld%s%s",
                                path, what, n, (long long)*off, (long long)(*off + (int64_t)got),
                                errnum != Z_OK ? ": " : "", errnum != Z_OK ? msg : "");
        }
        got += (size_t)r;
    }
    *off += (int64_t)n;
    return MR_OK;
}

static mr_status idx_load(const char *path, idx_file *f) {
    mr_status st = MR_OK;
    gzFile gz = NULL;
    memset(f, 0, sizeof *f);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return mr_set_error(errno == ENOENT ? MR_ERR_NOT_FOUND : MR_ERR_IO, "%s: cannot open IDX file: %s", path,
                            strerror(errno));
    gz = gzopen(path, "rb");
    MR_CHECK(gz, MR_ERR_IO, "%s: cannot open IDX file: %s", path, strerror(errno ? errno : EIO));
    gzbuffer(gz, 1 << 17);
    int64_t off = 0;
    unsigned char magic[4];
    MR_TRY(gz_read_exact(gz, magic, 4, &off, path, "the magic number"));
    MR_CHECK(magic[0] == 0 && magic[1] == 0, MR_ERR_FORMAT,
             "%s: offset 0: bad IDX magic %02x %02x %02x %02x (expected 00 00 <type> <ndim>); HINT: is this an IDX file?",
             path, magic[0], magic[1], magic[2], magic[3]);
    MR_CHECK(magic[2] == 0x08 || magic[2] == 0x09 || (magic[2] >= 0x0B && magic[2] <= 0x0E), MR_ERR_FORMAT,
             "%s: offset 2: bad IDX type byte 0x%02x", path, magic[2]);
    MR_CHECK(magic[2] == 0x08, MR_ERR_UNSUPPORTED, "%s: offset 2: IDX type 0x%02x; only unsigned bytes (0x08) are supported",
             path, magic[2]);
    MR_CHECK(magic[3] >= 1 && magic[3] <= MR_MAX_DIMS - 1, MR_ERR_FORMAT, "%s: offset 3: IDX has %d dims (1..%d)", path,
             magic[3], MR_MAX_DIMS - 1);
    f->ndim = magic[3];
    int64_t count = 1;
    for (int d = 0; d < f->ndim; d++) {
        unsigned char b[4];
        int64_t at = off;
        MR_TRY(gz_read_exact(gz, b, 4, &off, path, "a dimension size"));
        f->dims[d] = ((int64_t)b[0] << 24) | ((int64_t)b[1] << 16) | ((int64_t)b[2] << 8) | b[3];
        MR_CHECK(f->dims[d] <= INT32_MAX, MR_ERR_FORMAT, "%s: offset %lld: dim %d size %lld too large", path,
                 (long long)at, d, (long long)f->dims[d]);
        /* an element of zero bytes (a zero dim past the first) would make a dataset of billions
         * of empty elements, and would hide the other dims from the size bound below */
        MR_CHECK(d == 0 || f->dims[d] > 0, MR_ERR_FORMAT, "%s: offset %lld: dim %d is 0 (only the count may be 0)", path,
                 (long long)at, d);
        /* checked before multiplying (fuzzing found the overflow): the whole file, and one
         * element (dims past the first, which the iterator allocates per batch), stay <= 2^40 */
        MR_CHECK(f->dims[d] == 0 || count <= ((int64_t)1 << 40) / f->dims[d], MR_ERR_FORMAT,
                 "%s: offset %lld: dims multiply to more than 2^40 bytes", path, (long long)at);
        count *= f->dims[d];
    }
    {
        /* with a count of 0 the bound above never saw the other dims: bound one element too */
        int64_t elem = 1;
        for (int d = 1; d < f->ndim; d++) {
            MR_CHECK(elem <= ((int64_t)1 << 30) / f->dims[d], MR_ERR_FORMAT,
                     "%s: IDX elements of more than 2^30 bytes (dims past the first multiply too large)", path);
            elem *= f->dims[d];
        }
    }
    f->count = count;
    /* Grow the buffer as data arrives so a corrupt header cannot make us allocate terabytes. */
    size_t cap = 0, have = 0, total = (size_t)count;
    while (have < total) {
        if (have == cap) {
            size_t ncap = cap ? cap * 2 : ((size_t)1 << 24);
            if (ncap > total) ncap = total;
            unsigned char *p = realloc(f->data, ncap);
            MR_CHECK(p, MR_ERR_NOMEM, "%s: out of memory for %zu bytes", path, ncap);
            f->data = p;
            cap = ncap;
        }
        MR_TRY(gz_read_exact(gz, f->data + have, cap - have, &off, path, "the data"));
        have = cap;
    }
    if (!f->data) f->data = malloc(1);
    MR_CHECK(f->data, MR_ERR_NOMEM, "%s: out of memory", path);
    unsigned char extra;
    int r = gzread(gz, &extra, 1);
    if (r < 0) {
        int errnum = 0;
        const char *msg = gzerror(gz, &errnum);
        MR_CHECK(0, MR_ERR_FORMAT, "%s: corrupt gzip data at the end of the stream (offset %lld): %s", path,
                 (long long)off, msg);
    }
    MR_CHECK(r == 0, MR_ERR_FORMAT, "%s: offset %lld: trailing bytes after the %lld data bytes the header declares", path,
             (long long)off, (long long)count);
    gzclose(gz);
    return MR_OK;
fail:
    if (gz) gzclose(gz);
    free(f->data);
    f->data = NULL;
    return st;
}

mr_status mr_data_from_idx(const char *images_path, const char *labels_path, mr_dataset **out) {
    mr_status st = MR_OK;
    idx_file im = {0}, lb = {0};
    void *data[MR_DATA_MAX_COMPONENTS] = {0};
    mr_data_spec spec = {0};
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_from_idx: out is NULL");
    *out = NULL;
    MR_CHECK(images_path || labels_path, MR_ERR_INVALID, "mr_data_from_idx: both paths are NULL");
    int64_t n = -1;
    if (images_path) {
        MR_TRY(idx_load(images_path, &im));
        MR_CHECK(im.ndim >= 2, MR_ERR_FORMAT, "%s: offset 3: an images IDX needs >= 2 dims (N, H, ...), this has %d",
                 images_path, im.ndim);
        mr_shape s = mr_shape_make(im.ndim - 1, im.dims + 1);
        MR_TRY(mr_data_spec_add(&spec, "image", MR_U8, &s));
        n = im.dims[0];
        data[0] = im.data;
        im.data = NULL;
    }
    if (labels_path) {
        MR_TRY(idx_load(labels_path, &lb));
        MR_CHECK(lb.ndim == 1, MR_ERR_FORMAT, "%s: offset 3: a labels IDX has 1 dim (N), this has %d", labels_path,
                 lb.ndim);
        MR_CHECK(n < 0 || lb.dims[0] == n, MR_ERR_FORMAT,
                 "%s: offset 4: %lld labels but %s has %lld images", labels_path, (long long)lb.dims[0],
                 images_path, (long long)n);
        n = lb.dims[0];
        mr_shape s = mr_shape_make(0, NULL);
        MR_TRY(mr_data_spec_add(&spec, "label", MR_I32, &s));
        int32_t *l = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        MR_CHECK(l, MR_ERR_NOMEM, "%s: out of memory", labels_path);
        for (int64_t i = 0; i < n; i++) l[i] = lb.data[i];
        data[spec.n - 1] = l;
        free(lb.data);
        lb.data = NULL;
    }
    return ds_arrays_adopt(&spec, n, data, "idx", out);
fail:
    free(im.data);
    free(lb.data);
    for (int c = 0; c < MR_DATA_MAX_COMPONENTS; c++) free(data[c]);
    return st;
}

/* ---- flat token files ----------------------------------------------------------------------- */

typedef struct tokens_impl {
    int fd;
    int tb;            /* bytes per token: 2 or 4 */
    int64_t context;   /* T */
    int64_t header;    /* bytes before the first token */
    char path[];
} tokens_impl;

static void tokens_free(void *p) {
    tokens_impl *t = p;
    if (!t) return;
    if (t->fd >= 0) close(t->fd);
    free(t);
}

static mr_status tokens_read(void *p, int64_t idx, void *const out[]) {
    const tokens_impl *t = p;
    int64_t T = t->context;
    size_t bytes = (size_t)(T + 1) * (size_t)t->tb;
    unsigned char *raw = malloc(bytes);
    if (!raw) return mr_set_error(MR_ERR_NOMEM, "%s: out of memory", t->path);
    off_t at = (off_t)(t->header + idx * T * t->tb);
    size_t got = 0;
    while (got < bytes) {
        ssize_t r = pread(t->fd, raw + got, bytes - got, at + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(raw);
            return mr_set_error(MR_ERR_IO, "%s: read of %zu bytes at offset %lld failed: %s", t->path, bytes,
                                (long long)at, r < 0 ? strerror(errno) : "file shrank");
        }
        got += (size_t)r;
    }
    int32_t *x = out[0], *y = out[1];
    for (int64_t k = 0; k <= T; k++) {
        const unsigned char *b = raw + k * t->tb;
        uint32_t v = t->tb == 2 ? (uint32_t)(b[0] | (b[1] << 8))
                                : (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
        if (v > INT32_MAX) {
            free(raw);
            return mr_set_error(MR_ERR_FORMAT, "%s: offset %lld: token %u does not fit in int32", t->path,
                                (long long)(at + k * t->tb), v);
        }
        if (k < T) x[k] = (int32_t)v;
        if (k > 0) y[k - 1] = (int32_t)v;
    }
    free(raw);
    return MR_OK;
}

mr_status mr_data_from_tokens(const char *path, int token_bytes, int64_t context, mr_data_token_header header,
                              mr_dataset **out) {
    mr_status st = MR_OK;
    tokens_impl *t = NULL;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_from_tokens: out is NULL");
    *out = NULL;
    MR_CHECK(path, MR_ERR_INVALID, "mr_data_from_tokens: path is NULL");
    MR_CHECK(token_bytes == 2 || token_bytes == 4, MR_ERR_INVALID, "%s: token size must be 2 (uint16) or 4 (uint32), got %d",
             path, token_bytes);
    MR_CHECK(context >= 1 && context <= ((int64_t)1 << 30), MR_ERR_INVALID, "%s: context must be in 1..2^30, got %lld",
             path, (long long)context);
    MR_CHECK(header == MR_DATA_TOKENS_RAW || header == MR_DATA_TOKENS_LLMC, MR_ERR_INVALID, "%s: unknown header kind %d",
             path, (int)header);
    t = calloc(1, sizeof *t + strlen(path) + 1);
    MR_CHECK(t, MR_ERR_NOMEM, "%s: out of memory", path);
    strcpy(t->path, path);
    t->fd = open(path, O_RDONLY | O_CLOEXEC);
    MR_CHECK(t->fd >= 0, errno == ENOENT ? MR_ERR_NOT_FOUND : MR_ERR_IO, "%s: cannot open token file: %s", path,
             strerror(errno));
    struct stat sb;
    MR_CHECK(fstat(t->fd, &sb) == 0, MR_ERR_IO, "%s: stat failed: %s", path, strerror(errno));
    int64_t size = (int64_t)sb.st_size;
    t->tb = token_bytes;
    t->context = context;
    if (header == MR_DATA_TOKENS_LLMC) {
        t->header = 256 * 4;
        unsigned char h[12];
        MR_CHECK(size >= t->header && pread(t->fd, h, 12, 0) == 12, MR_ERR_FORMAT,
                 "%s: %lld bytes, shorter than the %lld-byte llm.c header", path, (long long)size, (long long)t->header);
        int32_t hv[3];
        for (int k = 0; k < 3; k++)
            hv[k] = (int32_t)((uint32_t)h[4 * k] | ((uint32_t)h[4 * k + 1] << 8) | ((uint32_t)h[4 * k + 2] << 16) |
                              ((uint32_t)h[4 * k + 3] << 24));
        MR_CHECK(hv[0] == 20240520, MR_ERR_FORMAT, "%s: offset 0: bad llm.c magic %d (expected 20240520)", path, hv[0]);
        MR_CHECK((hv[1] == 1 && token_bytes == 2) || (hv[1] == 2 && token_bytes == 4), MR_ERR_FORMAT,
                 "%s: offset 4: llm.c version %d does not match token size %d (version 1: uint16, 2: uint32)", path, hv[1],
                 token_bytes);
        MR_CHECK((size - t->header) % token_bytes != 0 || hv[2] == (size - t->header) / token_bytes, MR_ERR_FORMAT,
                 "%s: offset 8: header says %d tokens, the file holds %lld", path, hv[2],
                 (long long)((size - t->header) / token_bytes));
    }
    int64_t body = size - t->header;
    MR_CHECK(body % token_bytes == 0, MR_ERR_FORMAT,
             "%s: size %lld bytes is not a multiple of the token size %d: a partial token starts at byte offset %lld; "
             "HINT: check the token dtype (uint16 vs uint32)",
             path, (long long)size, token_bytes, (long long)(size - body % token_bytes));
    int64_t ntok = body / token_bytes;
    MR_CHECK(ntok >= context + 1, MR_ERR_FORMAT, "%s: %lld tokens, fewer than context + 1 = %lld", path,
             (long long)ntok, (long long)(context + 1));
    mr_data_spec spec = {0};
    mr_shape s = mr_shape_1d(context);
    MR_TRY(mr_data_spec_add(&spec, "x", MR_I32, &s));
    MR_TRY(mr_data_spec_add(&spec, "y", MR_I32, &s));
    return ds_new_source(&spec, (ntok - 1) / context, tokens_read, tokens_free, t, token_bytes == 2 ? "tokens16" : "tokens32",
                         out);
fail:
    tokens_free(t);
    return st;
}
