/* data/tfrecord.h and train/tb.h: CRC-32C against published check values, the SSE 4.2 path
 * against the table at every length and alignment; TFRecord framing round trips, and a damaged
 * length, damaged data and a cut-short record are reported with the record and byte; the event
 * writer's events decode with protobuf-c into what was written (file version, SessionLog START,
 * scalars, text, histograms whose buckets hold exactly the values of their ranges). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "harness.h"
#include "data/tfrecord.h"
#include "proto/tensorboard.pb-c.h"
#include "train/tb.h"

static void test_crc32c_vectors(void **state) {
    (void)state;
    /* RFC 3720 (iSCSI) B.4 and the common check value */
    assert_int_equal(mr_crc32c("123456789", 9), 0xe3069283u);
    uint8_t z[32] = {0}, ff[32], inc[32], dec[32];
    for (int i = 0; i < 32; i++) ff[i] = 0xff, inc[i] = (uint8_t)i, dec[i] = (uint8_t)(31 - i);
    assert_int_equal(mr_crc32c(z, 32), 0x8a9136aau);
    assert_int_equal(mr_crc32c(ff, 32), 0x62a8ab43u);
    assert_int_equal(mr_crc32c(inc, 32), 0x46dd794eu);
    assert_int_equal(mr_crc32c(dec, 32), 0x113fdb5cu);
    assert_int_equal(mr_crc32c(NULL, 0), 0u);
    /* extend = one pass; table = instruction, at every length and start alignment */
    uint8_t buf[300];
    for (int i = 0; i < 300; i++) buf[i] = (uint8_t)(i * 37 + 11);
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n + off <= 300; n += 7) {
            const uint32_t whole = mr_crc32c(buf + off, n);
            assert_int_equal(whole, mr_crc32c_extend_table(0, buf + off, n));
            assert_int_equal(whole, mr_crc32c_extend(mr_crc32c(buf + off, n / 3), buf + off + n / 3, n - n / 3));
        }
    print_message("  CRC-32C: %s\n", mr_crc32c_hardware() ? "SSE 4.2 instruction (checked against the table)" : "table");
    /* TensorFlow's mask: rotate right by 15, add 0xa282ead8 */
    assert_int_equal(mr_crc32c_mask(0), 0xa282ead8u);
    assert_int_equal(mr_crc32c_mask(0x12345678u), ((0x12345678u >> 15) | (0x12345678u << 17)) + 0xa282ead8u);
}

/* Three records written to a temporary file; returns it rewound. */
static FILE *three_records(long *sizes) {
    FILE *f = tmpfile();
    assert_non_null(f);
    const char *recs[3] = {"", "hello", "a longer record of some bytes"};
    for (int i = 0; i < 3; i++) {
        MR_ASSERT_OK(mr_tfrecord_write(f, "t.tfrecord", recs[i], strlen(recs[i])));
        sizes[i] = (long)strlen(recs[i]) + 16;
    }
    rewind(f);
    return f;
}

static void flip_byte(FILE *f, long at) {
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x40, f);
    rewind(f);
}

/* Reads every record; returns the status of the first failure (MR_OK at a clean end). */
static mr_status read_all(FILE *f, int *count) {
    mr_tfrecord_reader r;
    mr_tfrecord_reader_init(&r, f, "t.tfrecord");
    mr_status st = MR_OK;
    *count = 0;
    for (;;) {
        const uint8_t *d;
        size_t n;
        int end;
        if ((st = mr_tfrecord_next(&r, &d, &n, &end)) != MR_OK || end) break;
        (*count)++;
    }
    mr_tfrecord_reader_free(&r);
    return st;
}

static void test_tfrecord(void **state) {
    (void)state;
    long sz[3];
    FILE *f = three_records(sz);
    mr_tfrecord_reader r;
    mr_tfrecord_reader_init(&r, f, "t.tfrecord");
    const char *want[3] = {"", "hello", "a longer record of some bytes"};
    for (int i = 0; i < 3; i++) {
        const uint8_t *d;
        size_t n;
        int end = 1;
        MR_ASSERT_OK(mr_tfrecord_next(&r, &d, &n, &end));
        assert_int_equal(end, 0);
        assert_int_equal(n, strlen(want[i]));
        assert_memory_equal(d, want[i], n);
    }
    const uint8_t *d;
    size_t n;
    int end = 0;
    MR_ASSERT_OK(mr_tfrecord_next(&r, &d, &n, &end));
    assert_int_equal(end, 1);
    mr_tfrecord_reader_free(&r);
    /* the frame helper writes the same bytes */
    uint8_t frame[64], filebytes[64];
    assert_int_equal(mr_tfrecord_frame("hello", 5, frame, sizeof frame), 21);
    assert_int_equal(mr_tfrecord_frame("hello", 5, frame, 20), 0); /* too small */
    fseek(f, sz[0], SEEK_SET);
    assert_int_equal(fread(filebytes, 1, 21, f), 21);
    assert_memory_equal(frame, filebytes, 21);
    fclose(f);

    int count;
    f = three_records(sz);
    flip_byte(f, sz[0] + 3); /* record 1's length */
    assert_int_equal(read_all(f, &count), MR_ERR_FORMAT);
    assert_int_equal(count, 1);
    assert_non_null(strstr(mr_last_error(), "t.tfrecord: record 1 at byte 16: the length's CRC-32C does not match"));
    fclose(f);

    f = three_records(sz);
    flip_byte(f, sz[0] + sz[1] + 14); /* record 2's data */
    assert_int_equal(read_all(f, &count), MR_ERR_FORMAT);
    assert_int_equal(count, 2);
    assert_non_null(strstr(mr_last_error(), "record 2 at byte 37: the data's CRC-32C does not match"));
    fclose(f);

    for (long cut = 1; cut < sz[2]; cut += 5) { /* record 2 cut short anywhere */
        f = three_records(sz);
        FILE *g = tmpfile();
        char all[256];
        size_t total = fread(all, 1, sizeof all, f);
        fwrite(all, 1, total - (size_t)cut, g);
        rewind(g);
        assert_int_equal(read_all(g, &count), MR_ERR_FORMAT);
        assert_int_equal(count, 2);
        assert_non_null(strstr(mr_last_error(), "record 2 at byte 37 is cut short"));
        fclose(g);
        fclose(f);
    }
}

/* The one event file in dir, decoded: its events (caller frees each with free_unpacked). */
static int read_events(const char *dir, Tensorboard__Event **evs, int cap) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    char path[8192] = "";
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, "events.out.tfevents.")) snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    closedir(d);
    assert_true(path[0] != '\0');
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    mr_tfrecord_reader r;
    mr_tfrecord_reader_init(&r, f, path);
    int n = 0;
    for (;;) {
        const uint8_t *data;
        size_t len;
        int end;
        MR_ASSERT_OK(mr_tfrecord_next(&r, &data, &len, &end));
        if (end) break;
        assert_true(n < cap);
        evs[n] = tensorboard__event__unpack(NULL, len, data);
        assert_non_null(evs[n]);
        n++;
    }
    mr_tfrecord_reader_free(&r);
    fclose(f);
    return n;
}

static void test_events(void **state) {
    (void)state;
    char dir[] = "/tmp/mirror_test_tb_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/tb", dir);
    mr_tb *tb = NULL;
    MR_ASSERT_OK(mr_tb_open(sub, 40, &tb));
    const char *tags[2] = {"train/loss", "train/lr"};
    const double v[2] = {0.625, 1e-3};
    MR_ASSERT_OK(mr_tb_scalars(tb, 45, 2, tags, v));
    MR_ASSERT_OK(mr_tb_text(tb, 41, "config", "a: 1\nb: [2, 3]"));
    /* a histogram: values on both sides, at 0, on a limit, and non-finite ones left out */
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)((i - 500) * 0.013);
    x[3] = NAN, x[4] = INFINITY, x[5] = 0.0f, x[6] = 1e-12f;
    MR_ASSERT_OK(mr_tb_histogram(tb, 50, "params/w", x, 1000));
    MR_ASSERT_OK(mr_tb_histogram(tb, 50, "params/nothing", x + 3, 2)); /* nothing finite: no event */
    MR_ASSERT_OK(mr_tb_flush(tb));
    char path[4096];
    snprintf(path, sizeof path, "%s", mr_tb_path(tb));
    assert_non_null(strstr(path, "/tb/events.out.tfevents."));
    mr_tb_close(tb);

    Tensorboard__Event *ev[16];
    int n = read_events(sub, ev, 16);
    assert_int_equal(n, 5);
    assert_int_equal(ev[0]->what_case, TENSORBOARD__EVENT__WHAT_FILE_VERSION);
    assert_string_equal(ev[0]->file_version, "brain.Event:2");
    assert_true(ev[0]->wall_time > 1.7e9);
    assert_int_equal(ev[1]->what_case, TENSORBOARD__EVENT__WHAT_SESSION_LOG);
    assert_int_equal(ev[1]->session_log->status, TENSORBOARD__SESSION_LOG__SESSION_STATUS__START);
    assert_int_equal(ev[1]->step, 41); /* the run starts at 40: readers drop steps >= 41 before it */
    /* scalars: one event, both values, float32 */
    assert_int_equal(ev[2]->step, 45);
    assert_int_equal(ev[2]->summary->n_value, 2);
    assert_string_equal(ev[2]->summary->value[0]->tag, "train/loss");
    assert_int_equal(ev[2]->summary->value[0]->value_case, TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
    assert_true(ev[2]->summary->value[0]->simple_value == 0.625f);
    assert_true(ev[2]->summary->value[1]->simple_value == 1e-3f);
    /* text: a scalar string tensor for the text plugin */
    const Tensorboard__Summary__Value *t = ev[3]->summary->value[0];
    assert_string_equal(t->tag, "config");
    assert_string_equal(t->metadata->plugin_data->plugin_name, "text");
    assert_int_equal(t->tensor->dtype, TENSORBOARD__DATA_TYPE__DT_STRING);
    assert_int_equal(t->tensor->n_string_val, 1);
    assert_int_equal(t->tensor->string_val[0].len, strlen("a: 1\nb: [2, 3]"));
    assert_memory_equal(t->tensor->string_val[0].data, "a: 1\nb: [2, 3]", t->tensor->string_val[0].len);
    /* the histogram: every bucket holds exactly the finite values in [previous limit, limit) */
    const Tensorboard__HistogramProto *h = ev[4]->summary->value[0]->histo;
    assert_string_equal(ev[4]->summary->value[0]->tag, "params/w");
    assert_true(h->num == 998);
    double mn = INFINITY, mx = -INFINITY, sum = 0, sumsq = 0;
    for (int i = 0; i < 1000; i++)
        if (isfinite(x[i])) mn = fmin(mn, x[i]), mx = fmax(mx, x[i]), sum += x[i], sumsq += (double)x[i] * x[i];
    assert_true(h->min == mn && h->max == mx);
    assert_true(fabs(h->sum - sum) < 1e-9 && fabs(h->sum_squares - sumsq) < 1e-9);
    assert_int_equal(h->n_bucket, h->n_bucket_limit);
    double total = 0, prev = -INFINITY;
    for (size_t b = 0; b < h->n_bucket; b++) {
        double in = 0;
        for (int i = 0; i < 1000; i++)
            if (isfinite(x[i]) && x[i] >= prev && x[i] < h->bucket_limit[b]) in++;
        assert_true(h->bucket[b] == in);
        if (b) assert_true(h->bucket_limit[b] > h->bucket_limit[b - 1]);
        if (b) assert_false(h->bucket[b] == 0 && h->bucket[b - 1] == 0); /* empty runs merged */
        total += h->bucket[b];
        prev = h->bucket_limit[b];
    }
    assert_true(total == 998);
    assert_true(h->n_bucket > 100 && h->n_bucket < 1000); /* fine buckets, not all 1550 limits */
    for (int i = 0; i < n; i++) tensorboard__event__free_unpacked(ev[i], NULL);

    /* a second file within the same second sorts after the first (readers go by name), and
     * neither is overwritten */
    MR_ASSERT_OK(mr_tb_open(sub, 0, &tb));
    char path2[4096];
    snprintf(path2, sizeof path2, "%s", mr_tb_path(tb));
    mr_tb_close(tb);
    assert_true(strcmp(path2, path) > 0);
    assert_int_equal(access(path, F_OK), 0);
    remove(path2);

    /* an unwritable place: MR_ERR_IO naming it */
    char blocked[4300];
    snprintf(blocked, sizeof blocked, "%s/file", dir);
    FILE *f = fopen(blocked, "w");
    assert_non_null(f);
    fclose(f);
    char inside[4400];
    snprintf(inside, sizeof inside, "%s/tb", blocked);
    assert_int_equal(mr_tb_open(inside, 0, &tb), MR_ERR_IO);
    assert_null(tb);
    assert_non_null(strstr(mr_last_error(), blocked));
    remove(path);
    remove(blocked);
    rmdir(sub);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_tfrecord),
        cmocka_unit_test(test_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
