/* TFRecord files: the record framing TensorFlow writes (tf.io.TFRecordWriter, TensorBoard event
 * files), and CRC-32C (Castagnoli), with the SSE 4.2 instruction where the CPU has it.
 *
 * A record is
 *     uint64 length (little-endian)
 *     uint32 masked_crc32c(the 8 length bytes)
 *     length bytes of data
 *     uint32 masked_crc32c(data)
 * where masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 with c = crc32c(x), as in
 * TensorFlow's tensorflow/core/lib/hash/crc32c.h. The reader checks both CRCs and says which
 * record of which file, at which byte, is damaged or cut short. */
#ifndef MR_DATA_TFRECORD_H
#define MR_DATA_TFRECORD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CRC-32C of n bytes continuing from crc (0 to start); the hardware instruction when present,
 * else a table, with the same result. */
uint32_t mr_crc32c_extend(uint32_t crc, const void *data, size_t n);
static inline uint32_t mr_crc32c(const void *data, size_t n) { return mr_crc32c_extend(0, data, n); }
/* TFRecord's masked form of a CRC (stored CRCs are masked). */
static inline uint32_t mr_crc32c_mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }
/* 1 when mr_crc32c_extend uses the SSE 4.2 instruction. */
int mr_crc32c_hardware(void);
/* The table implementation alone (tests compare it with the instruction's). */
uint32_t mr_crc32c_extend_table(uint32_t crc, const void *data, size_t n);

/* Frames data[0..n) as one record into buf (cap >= n + 16 bytes); returns the framed size. */
size_t mr_tfrecord_frame(const void *data, size_t n, uint8_t *buf, size_t cap);

/* Appends one record to f. MR_ERR_IO (naming `name`, the file) on a short write. */
mr_status mr_tfrecord_write(FILE *f, const char *name, const void *data, size_t n) MR_WUR;

/* A reader over one open file (borrowed; read sequentially from its current position). */
typedef struct mr_tfrecord_reader {
    FILE *f;
    const char *name;  /* the file, for messages */
    uint64_t offset;   /* byte offset of the next record */
    int64_t index;     /* 0-based number of the next record */
    uint8_t *buf;      /* the last record's data (owned; valid until the next read) */
    size_t cap;
} mr_tfrecord_reader;

void mr_tfrecord_reader_init(mr_tfrecord_reader *r, FILE *f, const char *name);
void mr_tfrecord_reader_free(mr_tfrecord_reader *r);

/* The next record: *data and *n (owned by r), or *end = 1 at a clean end of file. MR_ERR_FORMAT
 * "FILE: record K at byte OFF: ..." for a bad length CRC, a bad data CRC or a record cut short
 * (the message says how many bytes were there); MR_ERR_NOMEM; MR_ERR_IO for a read error. */
mr_status mr_tfrecord_next(mr_tfrecord_reader *r, const uint8_t **data, size_t *n, int *end) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
