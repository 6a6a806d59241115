/* TFRecord framing and CRC-32C (data/tfrecord.h). */
#include "data/tfrecord.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

/* ---- CRC-32C ----------------------------------------------------------------------------------- */

/* The reflected Castagnoli polynomial 0x1EDC6F41. */
#define CRC32C_POLY 0x82f63b78u

static uint32_t g_table[8][256];
static int g_hw = -1; /* -1: not decided yet */

static void init_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        g_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) g_table[t][i] = (g_table[t - 1][i] >> 8) ^ g_table[0][g_table[t - 1][i] & 0xff];
}

/* Slicing-by-8 over the tables. */
static uint32_t crc_table(uint32_t crc, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) crc = (crc >> 8) ^ g_table[0][(crc ^ *p++) & 0xff], n--;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = g_table[7][w & 0xff] ^ g_table[6][(w >> 8) & 0xff] ^ g_table[5][(w >> 16) & 0xff] ^
              g_table[4][(w >> 24) & 0xff] ^ g_table[3][(w >> 32) & 0xff] ^ g_table[2][(w >> 40) & 0xff] ^
              g_table[1][(w >> 48) & 0xff] ^ g_table[0][w >> 56];
    }
    while (n--) crc = (crc >> 8) ^ g_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) c = _mm_crc32_u8((uint32_t)c, *p++), n--;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

static void crc_init(void) {
    init_tables();
#if defined(__x86_64__)
    __builtin_cpu_init();
    g_hw = __builtin_cpu_supports("sse4.2");
#else
    g_hw = 0;
#endif
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

int mr_crc32c_hardware(void) {
    pthread_once(&g_once, crc_init);
    return g_hw;
}

uint32_t mr_crc32c_extend_table(uint32_t crc, const void *data, size_t n) {
    pthread_once(&g_once, crc_init);
    return ~crc_table(~crc, data, n);
}

uint32_t mr_crc32c_extend(uint32_t crc, const void *data, size_t n) {
    pthread_once(&g_once, crc_init);
    crc = ~crc;
#if defined(__x86_64__)
    if (g_hw) return ~crc_hw(crc, data, n);
#endif
    return ~crc_table(crc, data, n);
}

/* ---- framing ----------------------------------------------------------------------------------- */

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

size_t mr_tfrecord_frame(const void *data, size_t n, uint8_t *buf, size_t cap) {
    if (cap < n + 16) return 0;
    put_u64(buf, (uint64_t)n);
    put_u32(buf + 8, mr_crc32c_mask(mr_crc32c(buf, 8)));
    memcpy(buf + 12, data, n);
    put_u32(buf + 12 + n, mr_crc32c_mask(mr_crc32c(data, n)));
    return n + 16;
}

mr_status mr_tfrecord_write(FILE *f, const char *name, const void *data, size_t n) {
    uint8_t head[12], tail[4];
    put_u64(head, (uint64_t)n);
    put_u32(head + 8, mr_crc32c_mask(mr_crc32c(head, 8)));
    put_u32(tail, mr_crc32c_mask(mr_crc32c(data, n)));
    if (fwrite(head, 1, sizeof head, f) != sizeof head || (n && fwrite(data, 1, n, f) != n) ||
        fwrite(tail, 1, sizeof tail, f) != sizeof tail)
        return mr_set_error(MR_ERR_IO, "%s: cannot write a record: %s", name, strerror(errno ? errno : EIO));
    return MR_OK;
}

/* ---- reading ----------------------------------------------------------------------------------- */

void mr_tfrecord_reader_init(mr_tfrecord_reader *r, FILE *f, const char *name) {
    memset(r, 0, sizeof *r);
    r->f = f;
    r->name = name;
    long at = ftell(f);
    r->offset = at > 0 ? (uint64_t)at : 0;
}

void mr_tfrecord_reader_free(mr_tfrecord_reader *r) {
    free(r->buf);
    r->buf = NULL;
    r->cap = 0;
}

/* Bytes left in a regular file from the reader's offset; UINT64_MAX when unknown (a pipe). */
static uint64_t bytes_left(const mr_tfrecord_reader *r) {
    struct stat sb;
    if (fstat(fileno(r->f), &sb) || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < r->offset) return UINT64_MAX;
    return (uint64_t)sb.st_size - r->offset;
}

mr_status mr_tfrecord_next(mr_tfrecord_reader *r, const uint8_t **data, size_t *n, int *end) {
    uint8_t head[12], tail[4];
    *end = 0;
    *data = NULL;
    *n = 0;
    const long long k = (long long)r->index;
    const unsigned long long at = (unsigned long long)r->offset;
    size_t got = fread(head, 1, sizeof head, r->f);
    if (got == 0 && feof(r->f)) {
        *end = 1;
        return MR_OK;
    }
    if (ferror(r->f)) return mr_set_error(MR_ERR_IO, "%s: read error at byte %llu: %s", r->name, at, strerror(errno));
    if (got < sizeof head)
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu is cut short: %zu of its 12 header bytes; HINT: "
                            "the file was truncated (a writer killed mid-record?)", r->name, k, at, got);
    if (get_u32(head + 8) != mr_crc32c_mask(mr_crc32c(head, 8)))
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu: the length's CRC-32C does not match (a corrupt "
                            "file, or not a TFRecord file)", r->name, k, at);
    const uint64_t len = get_u64(head), left = bytes_left(r);
    if (left != UINT64_MAX && len + 16 > left)
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu is cut short: %llu of its %llu bytes are in the "
                            "file; HINT: the file was truncated (a writer killed mid-record?)", r->name, k, at,
                            (unsigned long long)left, (unsigned long long)(len + 16));
    if (len > SIZE_MAX - 1 || len > ((uint64_t)1 << 40))
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu: length %llu is not plausible", r->name, k, at,
                            (unsigned long long)len);
    if (len + 1 > r->cap) {
        size_t cap = (size_t)len + 1 > 2 * r->cap ? (size_t)len + 1 : 2 * r->cap;
        uint8_t *b = realloc(r->buf, cap);
        if (!b) return mr_set_error(MR_ERR_NOMEM, "%s: record %lld: out of memory for %llu bytes", r->name, k,
                                    (unsigned long long)len);
        r->buf = b, r->cap = cap;
    }
    got = fread(r->buf, 1, (size_t)len, r->f);
    size_t got_tail = got == len ? fread(tail, 1, sizeof tail, r->f) : 0;
    if (ferror(r->f)) return mr_set_error(MR_ERR_IO, "%s: read error in record %lld: %s", r->name, k, strerror(errno));
    if (got < len || got_tail < sizeof tail)
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu is cut short: %llu of its %llu bytes; HINT: the "
                            "file was truncated (a writer killed mid-record?)", r->name, k, at,
                            (unsigned long long)(12 + got + got_tail), (unsigned long long)(len + 16));
    if (get_u32(tail) != mr_crc32c_mask(mr_crc32c(r->buf, (size_t)len)))
        return mr_set_error(MR_ERR_FORMAT, "%s: record %lld at byte %llu: the data's CRC-32C does not match (%llu bytes "
                            "damaged somewhere)", r->name, k, at, (unsigned long long)len);
    r->offset += len + 16;
    r->index++;
    *data = r->buf;
    *n = (size_t)len;
    return MR_OK;
}
