/* Text source: a file read into memory as int32 tokens (bytes, or ranks of UTF-8 code points in the
 * sorted set of the file's distinct code points), cut into windows exactly like the token-file
 * source, so char-level language models need no preprocessing step. The vocabulary stays with the
 * source so a sampler can map tokens back to text. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"

typedef struct text_impl {
    int64_t context, ntok, nvocab;
    int32_t *tok;   /* ntok */
    int32_t *vocab; /* nvocab code points (or bytes), ascending */
} text_impl;

static void text_free(void *p) {
    text_impl *t = p;
    if (!t) return;
    free(t->tok);
    free(t->vocab);
    free(t);
}

static mr_status text_read(void *p, int64_t idx, void *const out[]) {
    const text_impl *t = p;
    const int32_t *w = t->tok + idx * t->context;
    memcpy(out[0], w, sizeof(int32_t) * (size_t)t->context);
    memcpy(out[1], w + 1, sizeof(int32_t) * (size_t)t->context);
    return MR_OK;
}

/* Decodes one UTF-8 code point at b[*at] (n bytes in all); -1 if invalid (overlong, surrogate,
 * > U+10FFFF, truncated or a bad continuation byte). */
static int32_t utf8_next(const unsigned char *b, size_t n, size_t *at) {
    unsigned c = b[*at];
    int len;
    uint32_t cp, min;
    if (c < 0x80) { (*at)++; return (int32_t)c; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return -1;
    if (*at + (size_t)len > n) return -1;
    for (int k = 1; k < len; k++) {
        unsigned d = b[*at + (size_t)k];
        if ((d & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *at += (size_t)len;
    return (int32_t)cp;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

mr_status mr_data_from_text(const char *path, int64_t context, mr_data_text_mode mode, mr_dataset **out) {
    mr_status st = MR_OK;
    text_impl *t = NULL;
    unsigned char *raw = NULL;
    FILE *f = NULL;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_from_text: out is NULL");
    *out = NULL;
    MR_CHECK(path, MR_ERR_INVALID, "mr_data_from_text: path is NULL");
    MR_CHECK(context >= 1 && context <= ((int64_t)1 << 30), MR_ERR_INVALID, "%s: context must be in 1..2^30, got %lld",
             path, (long long)context);
    MR_CHECK(mode == MR_DATA_TEXT_BYTES || mode == MR_DATA_TEXT_CHARS, MR_ERR_INVALID, "%s: unknown text mode %d", path,
             (int)mode);
    f = fopen(path, "rb");
    MR_CHECK(f, errno == ENOENT ? MR_ERR_NOT_FOUND : MR_ERR_IO, "%s: cannot open text file: %s", path, strerror(errno));
    MR_CHECK(fseek(f, 0, SEEK_END) == 0, MR_ERR_IO, "%s: seek failed: %s", path, strerror(errno));
    long size = ftell(f);
    MR_CHECK(size >= 0, MR_ERR_IO, "%s: cannot tell the size: %s", path, strerror(errno));
    MR_CHECK(size > 0, MR_ERR_FORMAT, "%s: the text file is empty", path);
    rewind(f);
    raw = malloc((size_t)size);
    MR_CHECK(raw, MR_ERR_NOMEM, "%s: out of memory for %ld bytes", path, size);
    MR_CHECK(fread(raw, 1, (size_t)size, f) == (size_t)size, MR_ERR_IO, "%s: short read of %ld bytes", path, size);
    fclose(f);
    f = NULL;
    t = calloc(1, sizeof *t);
    MR_CHECK(t, MR_ERR_NOMEM, "%s: out of memory", path);
    t->context = context;
    t->tok = malloc(sizeof(int32_t) * (size_t)size);
    MR_CHECK(t->tok, MR_ERR_NOMEM, "%s: out of memory for %ld tokens", path, size);
    if (mode == MR_DATA_TEXT_BYTES) {
        for (long i = 0; i < size; i++) t->tok[i] = raw[i];
        t->ntok = size;
        t->nvocab = 256;
        t->vocab = malloc(sizeof(int32_t) * 256);
        MR_CHECK(t->vocab, MR_ERR_NOMEM, "%s: out of memory", path);
        for (int v = 0; v < 256; v++) t->vocab[v] = v;
    } else {
        size_t at = 0;
        while (at < (size_t)size) {
            size_t was = at;
            int32_t cp = utf8_next(raw, (size_t)size, &at);
            MR_CHECK(cp >= 0, MR_ERR_FORMAT, "%s: byte offset %zu: invalid UTF-8 (byte 0x%02x); HINT: use BYTES mode for "
                     "binary or non-UTF-8 text", path, was, raw[was]);
            t->tok[t->ntok++] = cp;
        }
        /* vocabulary: the sorted distinct code points; tokens become their ranks */
        int32_t *v = malloc(sizeof(int32_t) * (size_t)t->ntok);
        MR_CHECK(v, MR_ERR_NOMEM, "%s: out of memory", path);
        memcpy(v, t->tok, sizeof(int32_t) * (size_t)t->ntok);
        qsort(v, (size_t)t->ntok, sizeof(int32_t), cmp_i32);
        int64_t nv = 0;
        for (int64_t i = 0; i < t->ntok; i++)
            if (nv == 0 || v[nv - 1] != v[i]) v[nv++] = v[i];
        t->vocab = v;
        t->nvocab = nv;
        for (int64_t i = 0; i < t->ntok; i++) {
            const int32_t *p = bsearch(&t->tok[i], v, (size_t)nv, sizeof(int32_t), cmp_i32);
            t->tok[i] = (int32_t)(p - v);
        }
    }
    free(raw);
    raw = NULL;
    MR_CHECK(t->ntok >= context + 1, MR_ERR_FORMAT, "%s: %lld tokens, fewer than context + 1 = %lld", path,
             (long long)t->ntok, (long long)(context + 1));
    mr_data_spec spec = {0};
    mr_shape s = mr_shape_1d(context);
    MR_TRY(mr_data_spec_add(&spec, "x", MR_I32, &s));
    MR_TRY(mr_data_spec_add(&spec, "y", MR_I32, &s));
    return ds_new_source(&spec, (t->ntok - 1) / context, text_read, text_free, t,
                         mode == MR_DATA_TEXT_BYTES ? "text-bytes" : "text-chars", out);
fail:
    if (f) fclose(f);
    free(raw);
    text_free(t);
    return st;
}

mr_status mr_data_text_vocab(const mr_dataset *ds, const int32_t **codepoints, int64_t *n) {
    if (!codepoints || !n) return mr_set_error(MR_ERR_INVALID, "mr_data_text_vocab: NULL argument");
    while (ds && ds->in) ds = ds->in;
    if (!ds || ds->src_read != text_read)
        return mr_set_error(MR_ERR_INVALID, "mr_data_text_vocab: the dataset is not over a text source");
    const text_impl *t = ds->src_impl;
    *codepoints = t->vocab;
    *n = t->nvocab;
    return MR_OK;
}
