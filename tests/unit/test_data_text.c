/* data/ text source, cache and interleave: byte and UTF-8 character windows against the file's
 * contents, the sorted vocabulary (also through a pipeline), errors (missing, empty, too short,
 * invalid UTF-8 naming the offset, bad arguments); cache returns the same elements, reads each
 * source element once across epochs, keeps map parallelism and rejects index transforms before
 * it; interleave follows tf.data's cycle/block order (input exhausted mid-block, cycle larger than
 * the inputs); save/restore at every cut point through cache/interleave + shuffle + batch. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "data/data.h"

#define tpath th_tmp_path

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void expect_err(mr_status got, mr_status want, const char *n1, const char *n2) {
    if (got != want) fail_msg("got %s (%s), expected %s", mr_status_name(got), mr_last_error(), mr_status_name(want));
    if (n1 && !strstr(mr_last_error(), n1)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n1);
    if (n2 && !strstr(mr_last_error(), n2)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n2);
}

/* All elements of ds flattened: component 0's int32 values, in order (up to cap). */
static int64_t collect(mr_dataset *ds, int32_t *out, int64_t cap) {
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(ds, &it));
    int64_t n = 0;
    for (;;) {
        mr_data_elem e;
        int end;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        int64_t k = mr_shape_numel(&e.shape[0]);
        assert_true(n + k <= cap);
        memcpy(out + n, e.data[0], sizeof(int32_t) * (size_t)k);
        n += k;
    }
    mr_data_iter_free(it);
    return n;
}

/* ---- text ----------------------------------------------------------------------------------- */

static void test_text_bytes(void **state) {
    (void)state;
    const char *txt = "hello, world! this is a small file.";
    size_t len = strlen(txt);
    write_file(tpath("a.txt"), txt, len);
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_text(tpath("a.txt"), 4, MR_DATA_TEXT_BYTES, &d));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    int64_t k = 0;
    for (;; k++) {
        mr_data_elem e;
        int end;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        const int32_t *x = e.data[0], *y = e.data[1];
        for (int j = 0; j < 4; j++) {
            assert_int_equal(x[j], (unsigned char)txt[k * 4 + j]);
            assert_int_equal(y[j], (unsigned char)txt[k * 4 + j + 1]);
        }
    }
    assert_int_equal(k, (int64_t)(len - 1) / 4);
    mr_data_iter_free(it);
    const int32_t *v;
    int64_t nv;
    MR_ASSERT_OK(mr_data_text_vocab(d, &v, &nv));
    assert_int_equal(nv, 256);
    assert_int_equal(v[200], 200);
    mr_data_free(d);
}

static void test_text_chars(void **state) {
    (void)state;
    /* h é l o ␠ w ö r d €: 1-, 2- and 3-byte sequences and a 4-byte emoji */
    const char *txt = "h\xc3\xa9llo w\xc3\xb6rld \xe2\x82\xac\xf0\x9f\x98\x80 h\xc3\xa9";
    const int32_t cps[] = {'h', 0xe9, 'l', 'l', 'o', ' ', 'w', 0xf6, 'r', 'l', 'd', ' ', 0x20ac, 0x1f600, ' ', 'h', 0xe9};
    const int ncp = 17;
    write_file(tpath("u.txt"), txt, strlen(txt));
    mr_dataset *d = NULL, *sh = NULL;
    MR_ASSERT_OK(mr_data_from_text(tpath("u.txt"), 3, MR_DATA_TEXT_CHARS, &d));
    MR_ASSERT_OK(mr_data_shuffle(d, 2, 1, 0, &sh));
    const int32_t *v;
    int64_t nv;
    MR_ASSERT_OK(mr_data_text_vocab(sh, &v, &nv)); /* through a pipeline */
    const int32_t want[] = {' ', 'd', 'h', 'l', 'o', 'r', 'w', 0xe9, 0xf6, 0x20ac, 0x1f600};
    assert_int_equal(nv, 11);
    for (int j = 0; j < 11; j++) assert_int_equal(v[j], want[j]);
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    int64_t k = 0;
    for (;; k++) {
        mr_data_elem e;
        int end;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        const int32_t *x = e.data[0], *y = e.data[1];
        for (int j = 0; j < 3; j++) {
            assert_int_equal(v[x[j]], cps[k * 3 + j]);
            assert_int_equal(v[y[j]], cps[k * 3 + j + 1]);
        }
    }
    assert_int_equal(k, (ncp - 1) / 3);
    mr_data_iter_free(it);
    /* context + 1 == token count exactly: one element */
    mr_dataset *one = NULL;
    MR_ASSERT_OK(mr_data_from_text(tpath("u.txt"), 16, MR_DATA_TEXT_CHARS, &one));
    int32_t buf[64];
    assert_int_equal(collect(one, buf, 64), 16);
    mr_data_free(one);
    mr_data_free(sh);
    mr_data_free(d);
}

static void test_text_errors(void **state) {
    (void)state;
    mr_dataset *d = NULL;
    expect_err(mr_data_from_text(tpath("none.txt"), 4, MR_DATA_TEXT_BYTES, &d), MR_ERR_NOT_FOUND, "none.txt", NULL);
    assert_null(d);
    write_file(tpath("empty.txt"), "", 0);
    expect_err(mr_data_from_text(tpath("empty.txt"), 4, MR_DATA_TEXT_BYTES, &d), MR_ERR_FORMAT, "empty.txt", "empty");
    write_file(tpath("short.txt"), "abcd", 4);
    expect_err(mr_data_from_text(tpath("short.txt"), 4, MR_DATA_TEXT_BYTES, &d), MR_ERR_FORMAT, "short.txt", "fewer");
    expect_err(mr_data_from_text(tpath("short.txt"), 4, MR_DATA_TEXT_CHARS, &d), MR_ERR_FORMAT, "short.txt", "fewer");
    expect_err(mr_data_from_text(tpath("short.txt"), 0, MR_DATA_TEXT_BYTES, &d), MR_ERR_INVALID, "short.txt", "context");
    expect_err(mr_data_from_text(tpath("short.txt"), 2, (mr_data_text_mode)7, &d), MR_ERR_INVALID, "short.txt", "mode");
    const char *bad[] = {"ab\xff" "cdefgh", "abc\xc3", "ab\xc0\xaf" "cdefg", "a\xed\xa0\x80" "bcdefg", "a\xe2\x28\xa1xyzw"};
    const char *off[] = {"offset 2", "offset 3", "offset 2", "offset 1", "offset 1"};
    for (int k = 0; k < 5; k++) {
        write_file(tpath("bad.txt"), bad[k], strlen(bad[k]));
        expect_err(mr_data_from_text(tpath("bad.txt"), 1, MR_DATA_TEXT_CHARS, &d), MR_ERR_FORMAT, "bad.txt", off[k]);
        MR_ASSERT_OK(mr_data_from_text(tpath("bad.txt"), 1, MR_DATA_TEXT_BYTES, &d)); /* bytes accept anything */
        mr_data_free(d);
        d = NULL;
    }
    /* vocab of a non-text dataset */
    mr_data_spec spec = {0};
    mr_shape sc = mr_shape_make(0, NULL);
    MR_ASSERT_OK(mr_data_spec_add(&spec, "v", MR_I32, &sc));
    int32_t z[3] = {0};
    const void *data[] = {z};
    MR_ASSERT_OK(mr_data_from_arrays(&spec, 3, data, &d));
    const int32_t *v;
    int64_t nv;
    expect_err(mr_data_text_vocab(d, &v, &nv), MR_ERR_INVALID, "text", NULL);
    mr_data_free(d);
}

/* ---- cache ---------------------------------------------------------------------------------- */

typedef struct counted {
    atomic_long reads;
    int32_t base;
} counted;

/* element i = base + i, counting reads */
static mr_status counted_fn(void *ctx, int64_t index, void *const out[]) {
    counted *c = ctx;
    atomic_fetch_add(&c->reads, 1);
    *(int32_t *)out[0] = c->base + (int32_t)index;
    return MR_OK;
}

/* x -> 3x; with a ctx, fails unless epoch is 0 (maps inside cache/interleave run with epoch 0) */
static mr_status times3(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)index;
    if (ctx && epoch != 0) return mr_set_error(MR_ERR_INTERNAL, "maps before cache run with epoch 0");
    *(int32_t *)out[0] = *(const int32_t *)in[0] * 3;
    return MR_OK;
}

static mr_data_spec i32_spec(void) {
    mr_data_spec spec = {0};
    mr_shape sc = mr_shape_make(0, NULL);
    if (mr_data_spec_add(&spec, "v", MR_I32, &sc) != MR_OK) fail();
    return spec;
}

static mr_dataset *counted_source(counted *c, int32_t base, int64_t n) {
    atomic_init(&c->reads, 0);
    c->base = base;
    mr_data_spec spec = i32_spec();
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_fn(&spec, n, counted_fn, c, &d));
    return d;
}

static void test_cache(void **state) {
    (void)state;
    counted cnt;
    const int64_t n = 2500; /* crosses cache blocks */
    mr_dataset *src = counted_source(&cnt, 10, n), *m = NULL, *ca = NULL, *sh = NULL, *rep = NULL, *bat = NULL;
    mr_data_spec spec = i32_spec();
    mr_dataset *m0 = NULL;
    MR_ASSERT_OK(mr_data_map(src, times3, &cnt, &spec, 2, &m0));
    MR_ASSERT_OK(mr_data_map(src, times3, NULL, &spec, 2, &m));
    MR_ASSERT_OK(mr_data_cache(m0, &ca));
    MR_ASSERT_OK(mr_data_shuffle(ca, 300, 5, 1, &sh));
    MR_ASSERT_OK(mr_data_repeat(sh, 3, &rep));
    MR_ASSERT_OK(mr_data_batch(rep, 64, 0, &bat));
    int32_t *got = malloc(sizeof(int32_t) * (size_t)n * 3);
    assert_int_equal(collect(bat, got, n * 3), n * 3);
    /* epochs 2 and 3 come from memory; a batch spanning an epoch boundary may hold one index twice,
     * which two threads can both miss at once (harmless: the element is pure), hence the slack */
    long reads = atomic_load(&cnt.reads);
    assert_true(reads >= n && reads <= n + 2 * 64);
    /* each epoch is a permutation of 3 * (10 + i) */
    for (int e = 0; e < 3; e++) {
        char *seen = calloc((size_t)n, 1);
        for (int64_t k = 0; k < n; k++) {
            int32_t v = got[e * n + k];
            assert_true(v % 3 == 0 && v / 3 - 10 >= 0 && v / 3 - 10 < n);
            assert_false(seen[v / 3 - 10]);
            seen[v / 3 - 10] = 1;
        }
        free(seen);
    }
    /* the same pipeline without cache gives the same sequence */
    mr_dataset *sh2 = NULL, *rep2 = NULL, *bat2 = NULL;
    MR_ASSERT_OK(mr_data_shuffle(m, 300, 5, 1, &sh2));
    MR_ASSERT_OK(mr_data_repeat(sh2, 3, &rep2));
    MR_ASSERT_OK(mr_data_batch(rep2, 64, 0, &bat2));
    int32_t *ref = malloc(sizeof(int32_t) * (size_t)n * 3);
    assert_int_equal(collect(bat2, ref, n * 3), n * 3);
    assert_memory_equal(got, ref, sizeof(int32_t) * (size_t)n * 3);
    /* index transforms before cache are rejected */
    mr_dataset *bad = NULL;
    expect_err(mr_data_cache(sh2, &bad), MR_ERR_UNSUPPORTED, "cache", "HINT");
    assert_null(bad);
    expect_err(mr_data_cache(NULL, &bad), MR_ERR_INVALID, "cache", NULL);
    free(got); free(ref);
    mr_data_free(sh2); mr_data_free(rep2); mr_data_free(bat2);
    mr_data_free(m0);
    mr_data_free(src); mr_data_free(m); mr_data_free(ca); mr_data_free(sh); mr_data_free(rep); mr_data_free(bat);
}

/* ---- interleave ----------------------------------------------------------------------------- */

static mr_dataset *range_source(int32_t base, int64_t n) {
    int32_t *v = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    for (int64_t k = 0; k < n; k++) v[k] = base + (int32_t)k;
    mr_data_spec spec = i32_spec();
    const void *data[] = {v};
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&spec, n, data, &d));
    free(v);
    return d;
}

static void test_interleave_order(void **state) {
    (void)state;
    mr_dataset *in[4] = {range_source(100, 5), range_source(200, 3), range_source(300, 7), range_source(400, 0)};
    mr_dataset *il = NULL;
    MR_ASSERT_OK(mr_data_interleave(in, 3, 2, 2, &il));
    /* tf.data: A0 A1 | B0 B1 | A2 A3 | B2 (B ends) | A4 (A ends) | C opens in slot 1 ... */
    const int32_t want[] = {100, 101, 200, 201, 102, 103, 202, 104, 300, 301, 302, 303, 304, 305, 306};
    int32_t got[64];
    assert_int_equal(collect(il, got, 64), 15);
    assert_memory_equal(got, want, sizeof want);
    mr_data_free(il);
    /* cycle 1: concatenation; cycle larger than the inputs; an empty input */
    MR_ASSERT_OK(mr_data_interleave(in, 4, 1, 3, &il));
    assert_int_equal(collect(il, got, 64), 15);
    const int32_t cat[] = {100, 101, 102, 103, 104, 200, 201, 202, 300, 301, 302, 303, 304, 305, 306};
    assert_memory_equal(got, cat, sizeof cat);
    mr_data_free(il);
    MR_ASSERT_OK(mr_data_interleave(in, 4, 8, 1, &il));
    assert_int_equal(collect(il, got, 64), 15);
    const int32_t rr[] = {100, 200, 300, 101, 201, 301, 102, 202, 302, 103, 303, 104, 304, 305, 306};
    assert_memory_equal(got, rr, sizeof rr);
    mr_data_free(il);
    /* inputs with maps (epoch 0) */
    counted cnt;
    mr_dataset *src = counted_source(&cnt, 1, 4), *m = NULL;
    mr_data_spec spec = i32_spec();
    MR_ASSERT_OK(mr_data_map(src, times3, &cnt, &spec, 1, &m));
    mr_dataset *mix[2] = {m, in[1]};
    MR_ASSERT_OK(mr_data_interleave(mix, 2, 2, 3, &il));
    const int32_t mw[] = {3, 6, 9, 200, 201, 202, 12};
    assert_int_equal(collect(il, got, 64), 7);
    assert_memory_equal(got, mw, sizeof mw);
    mr_data_free(il);
    /* errors */
    expect_err(mr_data_interleave(in, 0, 2, 2, &il), MR_ERR_INVALID, "interleave", NULL);
    expect_err(mr_data_interleave(in, 2, 0, 2, &il), MR_ERR_INVALID, "cycle", NULL);
    expect_err(mr_data_interleave(in, 2, 2, 0, &il), MR_ERR_INVALID, "block", NULL);
    mr_dataset *sh = NULL;
    MR_ASSERT_OK(mr_data_shuffle(in[0], 2, 1, 0, &sh));
    mr_dataset *withsh[2] = {in[1], sh};
    expect_err(mr_data_interleave(withsh, 2, 2, 2, &il), MR_ERR_UNSUPPORTED, "interleave", "HINT");
    mr_data_free(sh);
    mr_data_spec other = {0};
    mr_shape s2 = mr_shape_1d(2);
    MR_ASSERT_OK(mr_data_spec_add(&other, "v", MR_I32, &s2));
    int32_t z[4] = {0};
    const void *zd[] = {z};
    mr_dataset *o = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&other, 2, zd, &o));
    mr_dataset *diff[2] = {in[0], o};
    expect_err(mr_data_interleave(diff, 2, 2, 2, &il), MR_ERR_INVALID, "input 1", "spec");
    assert_null(il);
    mr_data_free(o);
    mr_data_free(src); mr_data_free(m);
    for (int k = 0; k < 4; k++) mr_data_free(in[k]);
}

/* ---- save / restore ------------------------------------------------------------------------- */

/* Runs ds to the end (max 4096 values), then for each cut point saves after `cut` items, restores
 * into a fresh iterator and checks that the rest matches. */
static void check_resume(mr_dataset *ds) {
    int32_t ref[4096];
    int64_t total = collect(ds, ref, 4096);
    int64_t items = 0;
    {
        mr_data_iter *it = NULL;
        MR_ASSERT_OK(mr_data_iter_new(ds, &it));
        for (;;) {
            mr_data_elem e;
            int end;
            MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
            if (end) break;
            items++;
        }
        mr_data_iter_free(it);
    }
    int64_t step = th_quick() ? 7 : 1;
    for (int64_t cut = 0; cut <= items; cut += step) {
        mr_data_iter *a = NULL, *b = NULL;
        MR_ASSERT_OK(mr_data_iter_new(ds, &a));
        int64_t at = 0;
        for (int64_t k = 0; k < cut; k++) {
            mr_data_elem e;
            int end;
            MR_ASSERT_OK(mr_data_iter_next(a, &e, &end));
            at += mr_shape_numel(&e.shape[0]);
        }
        void *blob;
        size_t bytes;
        MR_ASSERT_OK(mr_data_iter_save(a, &blob, &bytes));
        mr_data_iter_free(a);
        MR_ASSERT_OK(mr_data_iter_new(ds, &b));
        MR_ASSERT_OK(mr_data_iter_restore(b, blob, bytes));
        free(blob);
        for (;;) {
            mr_data_elem e;
            int end;
            MR_ASSERT_OK(mr_data_iter_next(b, &e, &end));
            if (end) break;
            int64_t k = mr_shape_numel(&e.shape[0]);
            assert_true(at + k <= total);
            if (memcmp(e.data[0], ref + at, sizeof(int32_t) * (size_t)k) != 0)
                fail_msg("cut %lld: values at %lld differ", (long long)cut, (long long)at);
            at += k;
        }
        assert_int_equal(at, total);
        mr_data_iter_free(b);
    }
}

static void test_resume(void **state) {
    (void)state;
    mr_dataset *in[3] = {range_source(1000, 37), range_source(2000, 11), range_source(3000, 52)};
    mr_dataset *il = NULL, *ca = NULL, *sh = NULL, *rep = NULL, *bat = NULL, *pf = NULL;
    MR_ASSERT_OK(mr_data_interleave(in, 3, 2, 4, &il));
    MR_ASSERT_OK(mr_data_cache(il, &ca));
    MR_ASSERT_OK(mr_data_shuffle(ca, 16, 9, 1, &sh));
    MR_ASSERT_OK(mr_data_repeat(sh, 2, &rep));
    MR_ASSERT_OK(mr_data_batch(rep, 5, 0, &bat));
    MR_ASSERT_OK(mr_data_prefetch(bat, 3, &pf));
    check_resume(bat);
    check_resume(pf);
    check_resume(il);
    mr_dataset *tx = NULL, *txs = NULL;
    const char *txt = "the quick brown fox jumps over the lazy dog, again and again and again.";
    write_file(tpath("r.txt"), txt, strlen(txt));
    MR_ASSERT_OK(mr_data_from_text(tpath("r.txt"), 3, MR_DATA_TEXT_CHARS, &tx));
    MR_ASSERT_OK(mr_data_shuffle(tx, 5, 2, 1, &txs));
    check_resume(txs);
    mr_data_free(tx); mr_data_free(txs);
    mr_data_free(il); mr_data_free(ca); mr_data_free(sh); mr_data_free(rep); mr_data_free(bat); mr_data_free(pf);
    for (int k = 0; k < 3; k++) mr_data_free(in[k]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_bytes), cmocka_unit_test(test_text_chars),
        cmocka_unit_test(test_text_errors), cmocka_unit_test(test_cache),
        cmocka_unit_test(test_interleave_order), cmocka_unit_test(test_resume),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
