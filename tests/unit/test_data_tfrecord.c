/* data/ TFRecord source (data/sources.h mr_data_from_tfrecord): files written by TensorFlow itself
 * (tests/gen_tfrecord.py, committed under tests/fixtures/tfrecord/) decode to the values the
 * script wrote (bytes, int64 and float lists; the GZIP copy too), in order, under shuffle (random
 * access through the record index) and from several threads; every error path names the file,
 * the record and its byte offset: a corrupt data CRC, a corrupt length CRC, a truncated record
 * (cut in its header and in its data), a truncated GZIP stream, a missing feature, a feature of
 * another list kind (wrong dtype), an int64 outside int32, a value count other than the shape's
 * or than record 0's, a bytes feature of several strings,
 * not a tf.train.Example, an empty file, a missing file, bad arguments. A sharded set of TFRecord
 * files read as one dataset (mr_data_expand_paths + mr_data_concat) equals the single file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "data/sources.h"
#include "data/tfrecord.h"
#include "proto/example.pb-c.h"

#define NREC 7

/* "<directory of this source file>/../fixtures/tfrecord/<name>" (as test_models_parity.c). */
static const char *fx(const char *name) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    const char *env = getenv("MIRROR_FIXTURES_DIR");
    if (env && *env) {
        snprintf(b, 1024, "%s/tfrecord/%s", env, name);
        return b;
    }
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(b, 1024, "%.*s/../fixtures/tfrecord/%s", slash ? (int)(slash - file) : 1, slash ? file : ".", name);
    return b;
}

/* The features gen_tfrecord.py wrote: image (u8 [12] or [3, 4]), label (i64 or i32), weights (f32 [3]). */
static void features(mr_tfrecord_feature f[3], mr_dtype label_dt) {
    f[0] = (mr_tfrecord_feature){"image/encoded_raw", "image", MR_U8, mr_shape_2d(3, 4)};
    f[1] = (mr_tfrecord_feature){"label", "label", label_dt, {.ndim = -1}};
    f[2] = (mr_tfrecord_feature){"weights", "weights", MR_F32, {.ndim = -1}};
}

/* Element e must be record r's values. */
static void check_record(const mr_data_elem *e, int64_t r, mr_dtype label_dt) {
    const uint8_t *img = e->data[0];
    for (int k = 0; k < 12; k++)
        if (img[k] != (uint8_t)((r * 31 + k * 7) % 256)) fail_msg("record %lld image byte %d: %u", (long long)r, k, img[k]);
    int64_t label = label_dt == MR_I32 ? *(const int32_t *)e->data[1] : *(const int64_t *)e->data[1];
    assert_int_equal(label, r * 3 - 5);
    const float *w = e->data[2];
    assert_true(w[0] == (float)(r + 0.25) && w[1] == (float)(-r / 2.0) && w[2] == (float)(1e-3 * r));
}

static void read_all(const char *path, mr_dtype label_dt) {
    mr_tfrecord_feature f[3];
    features(f, label_dt);
    mr_dataset *ds = NULL;
    MR_ASSERT_OK(mr_data_from_tfrecord(path, f, 3, &ds));
    assert_int_equal(mr_data_source_size(ds), NREC);
    const mr_data_spec *s = mr_data_element_spec(ds);
    assert_int_equal(s->comp[0].shape.ndim, 2);
    assert_int_equal(s->comp[1].shape.ndim, 0); /* one value: a scalar */
    assert_int_equal(s->comp[2].shape.dim[0], 3);
    assert_int_equal(s->comp[1].dtype, label_dt);
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(ds, &it));
    for (int64_t r = 0;; r++) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) {
            assert_int_equal(r, NREC);
            break;
        }
        check_record(&e, r, label_dt);
    }
    mr_data_iter_free(it);
    mr_data_free(ds);
}

static void test_reads_tensorflow_files(void **state) {
    (void)state;
    read_all(fx("examples.tfrecord"), MR_I64);
    read_all(fx("examples.tfrecord"), MR_I32);
    read_all(fx("examples.tfrecord.gz"), MR_I64); /* GZIP, detected from the content */
}

/* Shuffled and parallel reads go through the index: each delivered element is the record its
 * label names, and every record comes once per pass. */
static void test_random_access(void **state) {
    (void)state;
    mr_tfrecord_feature f[3];
    features(f, MR_I64);
    mr_dataset *ds = NULL, *sh = NULL, *mp = NULL;
    MR_ASSERT_OK(mr_data_from_tfrecord(fx("examples.tfrecord"), f, 3, &ds));
    MR_ASSERT_OK(mr_data_shuffle(ds, 5, 42, 1, &sh));
    MR_ASSERT_OK(mr_data_batch(sh, 3, 0, &mp));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(mp, &it));
    int seen[NREC] = {0}, in_order = 1, k = 0;
    for (;;) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        for (int64_t b = 0; b < e.shape[0].dim[0]; b++, k++) {
            int64_t r = (((const int64_t *)e.data[1])[b] + 5) / 3;
            assert_true(r >= 0 && r < NREC);
            seen[r]++;
            in_order &= r == k;
            assert_int_equal(((const uint8_t *)e.data[0])[b * 12 + 1], (uint8_t)((r * 31 + 7) % 256));
        }
    }
    for (int r = 0; r < NREC; r++) assert_int_equal(seen[r], 1);
    assert_false(in_order); /* the shuffle did reorder */
    mr_data_iter_free(it);
    mr_data_free(mp);
    mr_data_free(sh);
    mr_data_free(ds);
}

/* Three shards of the same records (each written by mr_tfrecord_write with the fixture's record
 * bytes) read through a glob equal the one file. */
static void test_sharded_set(void **state) {
    (void)state;
    size_t n = 0;
    unsigned char *b = th_read_file(fx("examples.tfrecord"), &n);
    /* split at record boundaries: records are 12 + len + 4 bytes */
    size_t at = 0, cut[NREC + 1];
    for (int r = 0; r < NREC; r++) {
        cut[r] = at;
        uint64_t len = 0;
        for (int i = 7; i >= 0; i--) len = (len << 8) | b[at + (size_t)i];
        at += 12 + (size_t)len + 4;
    }
    cut[NREC] = at;
    assert_int_equal(at, n);
    const int bounds[4] = {0, 2, 3, NREC}; /* shards of 2, 1 and 4 records */
    char path[256];
    for (int s = 0; s < 3; s++) {
        snprintf(path, sizeof path, "%s/set-%d.tfrecord", th_tmp_dir(), s);
        th_write_file(path, b + cut[bounds[s]], cut[bounds[s + 1]] - cut[bounds[s]]);
    }
    char pattern[256], **paths = NULL;
    int np = 0;
    snprintf(pattern, sizeof pattern, "%s/set-*.tfrecord", th_tmp_dir());
    MR_ASSERT_OK(mr_data_expand_paths(pattern, &paths, &np));
    assert_int_equal(np, 3);
    assert_non_null(strstr(paths[0], "set-0") ? paths[0] : NULL);
    assert_non_null(strstr(paths[2], "set-2") ? paths[2] : NULL);
    mr_tfrecord_feature f[3];
    features(f, MR_I64);
    mr_dataset *parts[3] = {0}, *all = NULL;
    for (int s = 0; s < 3; s++) MR_ASSERT_OK(mr_data_from_tfrecord(paths[s], f, 3, &parts[s]));
    MR_ASSERT_OK(mr_data_concat(parts, 3, &all));
    assert_int_equal(mr_data_source_size(all), NREC);
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(all, &it));
    for (int64_t r = 0; r < NREC; r++) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        assert_false(end);
        check_record(&e, r, MR_I64);
    }
    mr_data_iter_free(it);
    mr_data_free(all);
    for (int s = 0; s < 3; s++) mr_data_free(parts[s]);
    mr_data_paths_free(paths, np);
    free(b);
}

/* Opens path with the standard features; the error must come at open (at_open) or at the first
 * read of record `rec`. */
static void expect_bad(const char *path, const mr_tfrecord_feature *f, int nf, int at_open, mr_status want, const char *n1,
                       const char *n2) {
    mr_dataset *ds = NULL;
    mr_status st = mr_data_from_tfrecord(path, f, nf, &ds);
    if (at_open) {
        th_expect_error(st, want, n1, n2);
        assert_null(ds);
        return;
    }
    MR_ASSERT_OK(st);
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(ds, &it));
    mr_status got = MR_OK;
    for (int i = 0; i < NREC + 1 && got == MR_OK; i++) {
        mr_data_elem e;
        int end = 0;
        got = mr_data_iter_next(it, &e, &end);
        if (end) break;
    }
    th_expect_error(got, want, n1, n2);
    mr_data_iter_free(it);
    mr_data_free(ds);
}

static void test_errors(void **state) {
    (void)state;
    size_t n = 0;
    unsigned char *b = th_read_file(fx("examples.tfrecord"), &n);
    mr_tfrecord_feature f[3];
    features(f, MR_I64);
    const char *p = th_tmp_path("bad.tfrecord");
    uint64_t len0 = 0;
    for (int i = 7; i >= 0; i--) len0 = (len0 << 8) | b[i];
    const size_t rec1 = 12 + (size_t)len0 + 4; /* byte offset of record 1 */
    char at1[64];
    snprintf(at1, sizeof at1, "record 1 at byte %zu", rec1);

    /* a flipped data byte in record 1: its data CRC fails on read, naming record and byte */
    unsigned char *c = malloc(n);
    memcpy(c, b, n);
    c[rec1 + 12 + 3] ^= 0x40;
    th_write_file(p, c, n);
    expect_bad(p, f, 3, 0, MR_ERR_FORMAT, at1, "data CRC mismatch");
    /* a flipped length byte: the length CRC fails while indexing */
    memcpy(c, b, n);
    c[rec1] ^= 0x01;
    th_write_file(p, c, n);
    expect_bad(p, f, 3, 1, MR_ERR_FORMAT, at1, "length CRC mismatch");
    /* truncated in record 1's data, and in its header */
    th_write_file(p, b, rec1 + 20);
    expect_bad(p, f, 3, 1, MR_ERR_FORMAT, "record 1 at byte", "cut short");
    th_write_file(p, b, rec1 + 5);
    expect_bad(p, f, 3, 1, MR_ERR_FORMAT, "record 1 at byte", "12-byte header");
    /* a truncated GZIP stream */
    size_t gn = 0;
    unsigned char *g = th_read_file(fx("examples.tfrecord.gz"), &gn);
    th_write_file(p, g, gn / 2);
    expect_bad(p, f, 3, 1, MR_ERR_FORMAT, p, "gzip");
    free(g);
    /* an empty file */
    th_write_file(p, b, 0);
    expect_bad(p, f, 3, 1, MR_ERR_FORMAT, p, "no records");
    free(c);

    /* a missing feature, named with its config key */
    mr_tfrecord_feature m[2] = {f[0], {"lable", "label", MR_I64, {.ndim = -1}}};
    expect_bad(fx("examples.tfrecord"), m, 2, 1, MR_ERR_FORMAT, "record 0", "feature 'lable' is missing");
    /* wrong dtypes: the label read as float32 (an int64_list), the weights as int64 (a float_list),
     * the image as int64 (a bytes_list) */
    mr_tfrecord_feature w1[1] = {{"label", "label", MR_F32, {.ndim = -1}}};
    expect_bad(fx("examples.tfrecord"), w1, 1, 1, MR_ERR_FORMAT, "feature 'label' is an int64_list", "float32");
    mr_tfrecord_feature w2[1] = {{"weights", "w", MR_I64, {.ndim = -1}}};
    expect_bad(fx("examples.tfrecord"), w2, 1, 1, MR_ERR_FORMAT, "feature 'weights' is a float_list", "int64");
    mr_tfrecord_feature w3[1] = {{"image/encoded_raw", "image", MR_I64, {.ndim = -1}}};
    expect_bad(fx("examples.tfrecord"), w3, 1, 1, MR_ERR_FORMAT, "is a bytes_list", "HINT");
    mr_tfrecord_feature w4[1] = {{"label", "label", MR_F64, {.ndim = -1}}};
    expect_bad(fx("examples.tfrecord"), w4, 1, 1, MR_ERR_INVALID, "f64", "HINT");
    /* an int64 beyond int32, read as int32: fails on read naming the record (record 1: 2^40) */
    mr_tfrecord_feature big[1] = {{"big", "big", MR_I32, {.ndim = -1}}};
    expect_bad(fx("examples.tfrecord"), big, 1, 0, MR_ERR_FORMAT, "record 1", "does not fit int32");
    /* a shape of another size than the feature's values */
    mr_tfrecord_feature sh[1] = {{"image/encoded_raw", "image", MR_U8, mr_shape_2d(4, 4)}};
    expect_bad(fx("examples.tfrecord"), sh, 1, 1, MR_ERR_FORMAT, "has 12 values", "needs 16");
    /* a SequenceExample: no features */
    expect_bad(fx("sequence.tfrecord"), f, 3, 1, MR_ERR_FORMAT, "sequence.tfrecord: record 0", "is missing");
    /* not protobuf at all: framing fine, content garbage */
    {
        uint8_t rec[64], data[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        size_t fn = mr_tfrecord_frame(data, sizeof data, rec, sizeof rec);
        th_write_file(p, rec, fn);
        expect_bad(p, f, 3, 1, MR_ERR_FORMAT, "record 0 at byte 0", "not a tf.train.Example");
    }
    /* a missing file, bad arguments */
    expect_bad(th_tmp_path("none.tfrecord"), f, 3, 1, MR_ERR_NOT_FOUND, "none.tfrecord", "cannot open");
    expect_bad(fx("examples.tfrecord"), f, 0, 1, MR_ERR_INVALID, "1 to 4 features", NULL);
    mr_tfrecord_feature nokey[1] = {{"", "x", MR_U8, {.ndim = -1}}};
    expect_bad(fx("examples.tfrecord"), nokey, 1, 1, MR_ERR_INVALID, "needs a key", NULL);
    free(b);
}

/* Writes records whose single feature "image" is a bytes_list of nvals[r] values of lens[r] bytes. */
static void write_bytes_records(const char *path, int n, const int *nvals, const int *lens) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    static uint8_t raw[64];
    for (int r = 0; r < n; r++) {
        ProtobufCBinaryData bd[4];
        for (int v = 0; v < nvals[r]; v++) bd[v] = (ProtobufCBinaryData){(size_t)lens[r], raw};
        Tensorflow__BytesList bl = TENSORFLOW__BYTES_LIST__INIT;
        bl.n_value = (size_t)nvals[r], bl.value = bd;
        Tensorflow__Feature ft = TENSORFLOW__FEATURE__INIT;
        ft.kind_case = TENSORFLOW__FEATURE__KIND_BYTES_LIST, ft.bytes_list = &bl;
        Tensorflow__Features__FeatureEntry en = TENSORFLOW__FEATURES__FEATURE_ENTRY__INIT, *ents[1] = {&en};
        en.key = "image", en.value = &ft;
        Tensorflow__Features fs = TENSORFLOW__FEATURES__INIT;
        fs.n_feature = 1, fs.feature = ents;
        Tensorflow__Example ex = TENSORFLOW__EXAMPLE__INIT;
        ex.features = &fs;
        uint8_t buf[512];
        size_t len = tensorflow__example__get_packed_size(&ex);
        assert_true(len <= sizeof buf);
        tensorflow__example__pack(&ex, buf);
        MR_ASSERT_OK(mr_tfrecord_write(f, path, buf, len));
    }
    fclose(f);
}

/* Records that disagree with record 0 on a value count, and a bytes feature of several strings. */
static void test_record_shapes(void **state) {
    (void)state;
    const char *p = th_tmp_path("shapes.tfrecord");
    mr_tfrecord_feature f[1] = {{"image", "image", MR_U8, {.ndim = -1}}};
    const int nv[3] = {1, 1, 1}, lens[3] = {12, 12, 10};
    write_bytes_records(p, 3, nv, lens);
    expect_bad(p, f, 1, 0, MR_ERR_FORMAT, "record 2", "has 10 values, record 0 has 12");
    const int nv2[2] = {1, 2}, lens2[2] = {12, 12};
    write_bytes_records(p, 2, nv2, lens2);
    expect_bad(p, f, 1, 0, MR_ERR_FORMAT, "record 1", "holds 2 byte strings");
}

/* A plain TFRecord file whose first record is 0x8b1f bytes long starts with 1f 8b, gzip's magic:
 * its valid length CRC says it is not gzip, and it reads (was: "corrupt gzip data"). */
static void test_gzip_lookalike(void **state) {
    (void)state;
    const char *p = th_tmp_path("lookalike.tfrecord");
    static uint8_t raw[0x8b1f], buf[0x8b1f + 64];
    for (size_t k = 0; k < sizeof raw; k++) raw[k] = (uint8_t)(k * 13 + 1);
    size_t len = 0, L = 0;
    Tensorflow__Example ex = TENSORFLOW__EXAMPLE__INIT;
    Tensorflow__Features fs = TENSORFLOW__FEATURES__INIT;
    Tensorflow__Features__FeatureEntry en = TENSORFLOW__FEATURES__FEATURE_ENTRY__INIT, *ents[1] = {&en};
    Tensorflow__Feature ft = TENSORFLOW__FEATURE__INIT;
    Tensorflow__BytesList bl = TENSORFLOW__BYTES_LIST__INIT;
    ProtobufCBinaryData bd;
    bl.n_value = 1, bl.value = &bd;
    ft.kind_case = TENSORFLOW__FEATURE__KIND_BYTES_LIST, ft.bytes_list = &bl;
    en.key = "image", en.value = &ft;
    fs.n_feature = 1, fs.feature = ents;
    ex.features = &fs;
    for (L = 0x8b1f - 40; L < 0x8b1f && len != 0x8b1f; L++) { /* the value length that packs to 0x8b1f bytes */
        bd = (ProtobufCBinaryData){L, raw};
        len = tensorflow__example__get_packed_size(&ex);
    }
    assert_int_equal(len, 0x8b1f);
    L--;
    tensorflow__example__pack(&ex, buf);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    MR_ASSERT_OK(mr_tfrecord_write(f, p, buf, len));
    MR_ASSERT_OK(mr_tfrecord_write(f, p, buf, len));
    fclose(f);
    size_t n = 0;
    unsigned char *b = th_read_file(p, &n);
    assert_true(b[0] == 0x1f && b[1] == 0x8b);
    free(b);
    mr_tfrecord_feature fe[1] = {{"image", "image", MR_U8, {.ndim = -1}}};
    mr_dataset *ds = NULL;
    MR_ASSERT_OK(mr_data_from_tfrecord(p, fe, 1, &ds));
    assert_int_equal(mr_data_source_size(ds), 2);
    assert_int_equal(mr_data_element_spec(ds)->comp[0].shape.dim[0], (int64_t)L);
    mr_data_free(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_tensorflow_files),
        cmocka_unit_test(test_random_access),
        cmocka_unit_test(test_sharded_set),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_record_shapes),
        cmocka_unit_test(test_gzip_lookalike),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
