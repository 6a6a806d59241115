/* data/ NumPy sources and sharded sets (data/sources.h): files written by numpy itself
 * (tests/gen_npy.py, committed under tests/fixtures/npy/) decode to the values the script wrote,
 * with the widened dtypes (i2 -> i32, u4 -> i64, bool -> i32), format version 2, and .npz members
 * stored (np.savez) and deflated (np.savez_compressed); every error path names the file (and
 * member) and the offset: Fortran order, object, big-endian and structured dtypes, bad magic, a
 * truncated array, a header past the end, a 0-d array, first dims that differ, a missing file or
 * member, a zip without its directory, an unsupported zip compression, a damaged local header,
 * corrupt deflate data. mr_data_as_classes converts labels (u8, i64, shape [1]) and
 * refuses float labels; mr_data_expand_paths expands globs in sorted order and lists in their
 * order; mr_data_concat reads files one after the other, shuffles across the boundaries, and a
 * state saved mid-set restores to the same next elements. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "data/sources.h"

static const char *fx(const char *name) {
    static char buf[8][1024];
    static int k;
    char *b = buf[k++ % 8];
    const char *env = getenv("MIRROR_FIXTURES_DIR");
    if (env && *env) {
        snprintf(b, 1024, "%s/npy/%s", env, name);
        return b;
    }
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(b, 1024, "%.*s/../fixtures/npy/%s", slash ? (int)(slash - file) : 1, slash ? file : ".", name);
    return b;
}

/* Element i of a single-array source into buf. */
static void element(mr_dataset *ds, int64_t i, void *buf) {
    mr_dataset *sk = NULL, *tk = NULL;
    MR_ASSERT_OK(mr_data_skip(ds, i, &sk));
    MR_ASSERT_OK(mr_data_take(sk, 1, &tk));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(tk, &it));
    mr_data_elem e;
    int end = 0;
    void *bufs[1] = {buf};
    MR_ASSERT_OK(mr_data_iter_next_into(it, bufs, &e, &end));
    assert_false(end);
    mr_data_iter_free(it);
    mr_data_free(tk);
    mr_data_free(sk);
}

static mr_dataset *open1(const char *file) {
    const char *paths[1] = {fx(file)}, *names[1] = {"a"};
    mr_dataset *ds = NULL;
    MR_ASSERT_OK(mr_data_from_npy(paths, NULL, names, 1, &ds));
    assert_int_equal(mr_data_source_size(ds), 5);
    return ds;
}

static void test_dtypes(void **state) {
    (void)state;
    mr_dataset *ds = open1("i2.npy");
    const mr_data_spec *s = mr_data_element_spec(ds);
    assert_int_equal(s->comp[0].dtype, MR_I32);
    assert_int_equal(s->comp[0].shape.ndim, 1);
    assert_int_equal(s->comp[0].shape.dim[0], 3);
    for (int64_t i = 0; i < 5; i++) {
        int32_t v[3];
        element(ds, i, v);
        for (int k = 0; k < 3; k++) assert_int_equal(v[k], (i * 3 + k) * 1000 - 7000);
    }
    mr_data_free(ds);
    ds = open1("u4.npy");
    assert_int_equal(mr_data_element_spec(ds)->comp[0].dtype, MR_I64);
    assert_int_equal(mr_data_element_spec(ds)->comp[0].shape.ndim, 0);
    for (int64_t i = 0; i < 5; i++) {
        int64_t v;
        element(ds, i, &v);
        assert_int_equal(v, 4000000000ll + i);
    }
    mr_data_free(ds);
    ds = open1("f4.npy");
    assert_int_equal(mr_data_element_spec(ds)->comp[0].dtype, MR_F32);
    assert_int_equal(mr_data_element_spec(ds)->comp[0].shape.ndim, 2);
    for (int64_t i = 0; i < 5; i++) {
        float v[4];
        element(ds, i, v);
        for (int k = 0; k < 4; k++) assert_true(v[k] == (float)i + (float)k / 8.0f);
    }
    mr_data_free(ds);
    ds = open1("b1.npy");
    assert_int_equal(mr_data_element_spec(ds)->comp[0].dtype, MR_I32);
    for (int64_t i = 0; i < 5; i++) {
        int32_t v;
        element(ds, i, &v);
        assert_int_equal(v, i % 2);
    }
    mr_data_free(ds);
    ds = open1("v2.npy"); /* format version 2.0 */
    assert_int_equal(mr_data_element_spec(ds)->comp[0].dtype, MR_U8);
    for (int64_t i = 0; i < 5; i++) {
        uint8_t v[3];
        element(ds, i, v);
        for (int k = 0; k < 3; k++) assert_int_equal(v[k], i * 3 + k);
    }
    mr_data_free(ds);
}

static void check_xy(mr_dataset *ds) {
    assert_int_equal(mr_data_source_size(ds), 5);
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(ds, &it));
    for (int64_t i = 0; i < 5; i++) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        assert_false(end);
        for (int k = 0; k < 3; k++) assert_int_equal(((const uint8_t *)e.data[0])[k], i * 3 + k);
        assert_int_equal(*(const int64_t *)e.data[1], i - 2);
    }
    mr_data_iter_free(it);
}

static void test_npz(void **state) {
    (void)state;
    const char *members[2] = {"x", "y.npy"}, *names[2] = {"image", "label"};
    for (int c = 0; c < 2; c++) {
        const char *p = fx(c ? "arrays_c.npz" : "arrays.npz"), *paths[2] = {p, p};
        mr_dataset *ds = NULL;
        MR_ASSERT_OK(mr_data_from_npy(paths, members, names, 2, &ds));
        check_xy(ds);
        /* as a classifier's source: labels i64 -> i32 */
        mr_dataset *cl = NULL;
        MR_ASSERT_OK(mr_data_as_classes(ds, p, &cl));
        assert_int_equal(mr_data_element_spec(cl)->comp[1].dtype, MR_I32);
        mr_data_iter *it = NULL;
        MR_ASSERT_OK(mr_data_iter_new(cl, &it));
        for (int64_t i = 0; i < 5; i++) {
            mr_data_elem e;
            int end = 0;
            MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
            assert_int_equal(*(const int32_t *)e.data[1], i - 2);
            assert_int_equal(((const uint8_t *)e.data[0])[2], i * 3 + 2);
        }
        mr_data_iter_free(it);
        mr_data_free(cl);
        mr_data_free(ds);
    }
}

static void bad1(const char *path, const char *member, mr_status want, const char *n1, const char *n2) {
    const char *paths[1] = {path}, *members[1] = {member}, *names[1] = {"a"};
    mr_dataset *ds = NULL;
    th_expect_error(mr_data_from_npy(paths, member ? members : NULL, names, 1, &ds), want, n1, n2);
    assert_null(ds);
}

static void test_errors(void **state) {
    (void)state;
    bad1(fx("fortran.npy"), NULL, MR_ERR_UNSUPPORTED, "fortran.npy: offset 10", "Fortran order; HINT");
    bad1(fx("object.npy"), NULL, MR_ERR_UNSUPPORTED, "dtype '|O'", "object array; HINT");
    bad1(fx("big.npy"), NULL, MR_ERR_UNSUPPORTED, "dtype '>f4'", "big-endian; HINT");
    bad1(fx("record.npy"), NULL, MR_ERR_UNSUPPORTED, "structured", "HINT");
    bad1(th_tmp_path("none.npy"), NULL, MR_ERR_NOT_FOUND, "none.npy", "cannot open");
    bad1(fx("arrays.npz"), "z", MR_ERR_NOT_FOUND, "no member 'z'", "HINT");
    /* bad magic, truncated data, a 0-d array, a version 4 header */
    size_t n = 0;
    unsigned char *b = th_read_file(fx("i2.npy"), &n);
    const char *p = th_tmp_path("bad.npy");
    unsigned char *c = malloc(n);
    memcpy(c, b, n);
    c[1] = 'X';
    th_write_file(p, c, n);
    bad1(p, NULL, MR_ERR_FORMAT, "offset 0: bad .npy magic", "HINT");
    th_write_file(p, b, n - 3);
    bad1(p, NULL, MR_ERR_FORMAT, "truncated: the shape needs 30 data bytes from offset 128", "ends at offset 155");
    memcpy(c, b, n);
    c[6] = 4;
    th_write_file(p, c, n);
    bad1(p, NULL, MR_ERR_UNSUPPORTED, "offset 6: .npy format version 4", NULL);
    memcpy(c, b, n);
    char *sh = strstr((char *)c + 10, "(5, 3)");
    assert_non_null(sh);
    memcpy(sh, "()    ", 6);
    th_write_file(p, c, n);
    bad1(p, NULL, MR_ERR_FORMAT, "a 0-d array", "HINT");
    free(c);
    free(b);
    /* a zip without its end record; a deflated member with corrupt data */
    b = th_read_file(fx("arrays_c.npz"), &n);
    th_write_file(p, b, n - 30);
    bad1(p, "x", MR_ERR_FORMAT, "no zip end-of-directory record", "HINT");
    c = malloc(n);
    memcpy(c, b, n);
    for (size_t k = 40; k < 90; k++) c[k] ^= 0x5a; /* inside member x's deflate stream */
    th_write_file(p, c, n);
    const char *paths[1] = {p}, *members[1] = {"x"}, *names[1] = {"a"};
    mr_dataset *ds = NULL;
    mr_status st = mr_data_from_npy(paths, members, names, 1, &ds);
    if (st == MR_OK) fail_msg("a corrupt deflate stream was accepted");
    assert_non_null(strstr(mr_last_error(), "bad.npy"));
    free(c);
    free(b);
    /* a header longer than the file; a member in an unsupported compression (bzip2: method 12);
     * a damaged local header */
    b = th_read_file(fx("i2.npy"), &n);
    th_write_file(p, b, 60);
    bad1(p, NULL, MR_ERR_FORMAT, "offset 8: .npy header of 118 bytes", "runs past the end of the file");
    free(b);
    b = th_read_file(fx("arrays.npz"), &n);
    c = malloc(n);
    memcpy(c, b, n);
    unsigned char *cd = NULL;
    for (size_t k = 0; k + 4 <= n && !cd; k++)
        if (!memcmp(c + k, "PK\x01\x02", 4)) cd = c + k; /* the first central directory entry: member x */
    assert_non_null(cd);
    cd[10] = 12;
    th_write_file(p, c, n);
    bad1(p, "x", MR_ERR_UNSUPPORTED, "compression method 12", "HINT");
    memcpy(c, b, n);
    c[0] = 'Q'; /* member x's local header is the first thing in the archive */
    th_write_file(p, c, n);
    bad1(p, "x", MR_ERR_FORMAT, "offset 0: bad zip local header of member x", NULL);
    free(c);
    free(b);
    /* first dims that differ: i2 has 5 elements, a 4-element copy of v2 */
    b = th_read_file(fx("f4.npy"), &n);
    char *s4 = strstr((char *)b + 10, "(5, 2, 2)");
    assert_non_null(s4);
    s4[1] = '4';
    const char *p4 = th_tmp_path("four.npy");
    th_write_file(p4, b, n);
    free(b);
    const char *pp[2] = {fx("i2.npy"), p4}, *nn[2] = {"a", "b"};
    th_expect_error(mr_data_from_npy(pp, NULL, nn, 2, &ds), MR_ERR_FORMAT, "four.npy: 4 elements (first dim) but", "has 5");
    /* bad arguments */
    th_expect_error(mr_data_from_npy(pp, NULL, nn, 0, &ds), MR_ERR_INVALID, "1 to 4 arrays", NULL);
}

/* ---- hostile headers: sizes and offsets chosen to overflow 64-bit sums or products ---------- */

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A zip of one stored member "x.npy" (the npy bytes) into z (cap >= n + 200); its central
 * directory entry's csize/loff are 0xFFFFFFFF with the values in a zip64 extra when csize64 or
 * loff64 is non-zero. Returns the archive's size. */
static size_t make_zip(unsigned char *z, const unsigned char *npy, size_t n, uint64_t csize64, uint64_t loff64) {
    size_t at = 0;
    put_le(z + at, 0x04034b50u, 4), put_le(z + at + 4, 20, 2), put_le(z + at + 6, 0, 2), put_le(z + at + 8, 0, 2);
    put_le(z + at + 10, 0, 4), put_le(z + at + 14, 0, 4), put_le(z + at + 18, n, 4), put_le(z + at + 22, n, 4);
    put_le(z + at + 26, 5, 2), put_le(z + at + 28, 0, 2);
    memcpy(z + at + 30, "x.npy", 5);
    memcpy(z + at + 35, npy, n);
    at += 35 + n;
    const size_t cd = at;
    int xl = (csize64 ? 8 : 0) + (loff64 ? 8 : 0);
    memset(z + at, 0, 46);
    put_le(z + at, 0x02014b50u, 4), put_le(z + at + 4, 20, 2), put_le(z + at + 6, 20, 2);
    put_le(z + at + 20, csize64 ? 0xFFFFFFFFu : n, 4), put_le(z + at + 24, n, 4);
    put_le(z + at + 28, 5, 2), put_le(z + at + 30, xl ? 4 + xl : 0, 2), put_le(z + at + 42, loff64 ? 0xFFFFFFFFu : 0, 4);
    memcpy(z + at + 46, "x.npy", 5);
    at += 51;
    if (xl) {
        put_le(z + at, 1, 2), put_le(z + at + 2, (uint64_t)xl, 2);
        at += 4;
        if (csize64) put_le(z + at, csize64, 8), at += 8;
        if (loff64) put_le(z + at, loff64, 8), at += 8;
    }
    memset(z + at, 0, 22);
    put_le(z + at, 0x06054b50u, 4), put_le(z + at + 8, 1, 2), put_le(z + at + 10, 1, 2);
    put_le(z + at + 12, at - cd, 4), put_le(z + at + 16, cd, 4);
    return at + 22;
}

static void bad_member(const char *p, const unsigned char *z, size_t n, const char *n1) {
    th_write_file(p, z, n);
    const char *paths[1] = {p}, *members[1] = {"x"}, *names[1] = {"a"};
    mr_dataset *ds = NULL;
    th_expect_error(mr_data_from_npy(paths, members, names, 1, &ds), MR_ERR_FORMAT, "hostile.npz", n1);
    assert_null(ds);
}

/* A shape whose product wraps int64 (2^32 * 2^32 = 2^64) is too large, not an empty array; zip
 * offsets and sizes near 2^64 (a zip64 locator, a zip64 end record's directory offset, a zip64
 * extra's compressed size and local header offset) are errors, not reads outside the file; an
 * inflated size no deflate stream of that length can reach is an error, not an allocation. */
static void test_hostile_headers(void **state) {
    (void)state;
    const char *p = th_tmp_path("hostile.npy");
    unsigned char npy[128];
    const char *h = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4294967296, 4294967296), }";
    memcpy(npy, "\x93NUMPY\x01\x00", 8);
    memset(npy + 10, ' ', 118);
    memcpy(npy + 10, h, strlen(h));
    npy[127] = '\n';
    put_le(npy + 8, 118, 2);
    th_write_file(p, npy, sizeof npy);
    bad1(p, NULL, MR_ERR_FORMAT, "hostile.npy: offset 10: shape too large", NULL);
    /* a good member (i2.npy) in a hand-made zip reads; then the same zip with hostile numbers */
    size_t n = 0;
    unsigned char *good = th_read_file(fx("i2.npy"), &n);
    unsigned char *z = malloc(n + 400);
    assert_non_null(z);
    const char *pz = th_tmp_path("hostile.npz");
    size_t zn = make_zip(z, good, n, 0, 0);
    th_write_file(pz, z, zn);
    const char *paths[1] = {pz}, *members[1] = {"x"}, *names[1] = {"a"};
    mr_dataset *ds = NULL;
    MR_ASSERT_OK(mr_data_from_npy(paths, members, names, 1, &ds));
    assert_int_equal(mr_data_source_size(ds), 5);
    mr_data_free(ds);
    zn = make_zip(z, good, n, (uint64_t)0 - 16, 0); /* data + csize wraps below the file's size */
    bad_member(pz, z, zn, "truncated: member x needs");
    zn = make_zip(z, good, n, 0, (uint64_t)0 - 16); /* loff + 30 wraps */
    bad_member(pz, z, zn, "bad zip local header of member x");
    /* a zip64 locator whose end record sits at 2^64 - 16 (z + 56 wraps) */
    unsigned char t[20 + 22 + 56 + 20 + 22];
    memset(t, 0, sizeof t);
    put_le(t, 0x07064b50u, 4), put_le(t + 8, (uint64_t)0 - 16, 8);
    put_le(t + 20, 0x06054b50u, 4), put_le(t + 30, 0xFFFF, 2), put_le(t + 36, 0xFFFFFFFFu, 4);
    bad_member(pz, t, 42, "bad zip64 end-of-directory record");
    /* a valid zip64 end record whose directory offset is 2^64 - 16 (at + 46 wraps) */
    memset(t, 0, sizeof t);
    put_le(t, 0x06064b50u, 4), put_le(t + 32, 1, 8), put_le(t + 48, (uint64_t)0 - 16, 8);
    put_le(t + 56, 0x07064b50u, 4), put_le(t + 64, 0, 8);
    put_le(t + 76, 0x06054b50u, 4), put_le(t + 86, 0xFFFF, 2), put_le(t + 92, 0xFFFFFFFFu, 4);
    bad_member(pz, t, 98, "bad zip central directory entry 0");
    free(z);
    free(good);
    /* a deflated member whose directory entry claims 2^31 - 1 inflated bytes from ~80 compressed
     * ones: more than deflate's 1032:1 can give, refused before any allocation (was: a 2 GiB
     * malloc, then "corrupt deflate data"; libFuzzer's out-of-memory) */
    good = th_read_file(fx("arrays_c.npz"), &n);
    unsigned char *cd = NULL;
    for (size_t k = 0; k + 4 <= n && !cd; k++)
        if (!memcmp(good + k, "PK\x01\x02", 4)) cd = good + k; /* member x's directory entry */
    assert_non_null(cd);
    put_le(cd + 24, 0x7FFFFFFFu, 4);
    bad_member(pz, good, n, "more than deflate's 1032:1");
    free(good);
}

static void test_as_classes(void **state) {
    (void)state;
    mr_dataset *ds = NULL, *cl = NULL;
    const char *pf[2] = {fx("v2.npy"), fx("f4.npy")}, *names[2] = {"image", "label"};
    MR_ASSERT_OK(mr_data_from_npy(pf, NULL, names, 2, &ds));
    th_expect_error(mr_data_as_classes(ds, "f.npy", &cl), MR_ERR_UNSUPPORTED, "f.npy: labels of f32", "HINT");
    mr_data_free(ds);
    const char *pi[2] = {fx("v2.npy"), fx("i2.npy")};
    MR_ASSERT_OK(mr_data_from_npy(pi, NULL, names, 2, &ds));
    th_expect_error(mr_data_as_classes(ds, "i.npy", &cl), MR_ERR_FORMAT, "i.npy: labels of 3 values per element", "HINT");
    mr_data_free(ds);
    /* a label beyond int32 fails when read, naming the element */
    const char *pu[2] = {fx("v2.npy"), fx("u4.npy")};
    MR_ASSERT_OK(mr_data_from_npy(pu, NULL, names, 2, &ds));
    MR_ASSERT_OK(mr_data_as_classes(ds, "u.npy", &cl));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(cl, &it));
    mr_data_elem e;
    int end = 0;
    th_expect_error(mr_data_iter_next(it, &e, &end), MR_ERR_FORMAT, "u.npy: element 0: label 4000000000", "int32");
    mr_data_iter_free(it);
    mr_data_free(cl);
    mr_data_free(ds);
    /* a pipeline is not a source */
    mr_dataset *sk = NULL;
    MR_ASSERT_OK(mr_data_from_npy(pi, NULL, names, 2, &ds));
    MR_ASSERT_OK(mr_data_skip(ds, 1, &sk));
    th_expect_error(mr_data_as_classes(sk, "s", &cl), MR_ERR_UNSUPPORTED, "takes a source", NULL);
    mr_data_free(sk);
    mr_data_free(ds);
}

/* Three .npy shards (2, 1 and 2 rows of v2.npy's values) through a glob, a list, and under
 * shuffle with a state saved and restored across a file boundary. */
static void test_sets(void **state) {
    (void)state;
    size_t n = 0;
    unsigned char *b = th_read_file(fx("v2.npy"), &n); /* header then 15 bytes: rows of 3 */
    const size_t data = n - 15;
    const int rows[4] = {0, 2, 3, 5};
    for (int s = 0; s < 3; s++) {
        unsigned char *c = malloc(n);
        memcpy(c, b, data);
        char *sh = strstr((char *)c + 12, "(5, 3)");
        assert_non_null(sh);
        sh[1] = (char)('0' + rows[s + 1] - rows[s]);
        memcpy(c + data, b + data + rows[s] * 3, (size_t)(rows[s + 1] - rows[s]) * 3);
        char name[32];
        snprintf(name, sizeof name, "part-%d.npy", 2 - s); /* names sort in reverse of s: part-2 holds rows 0-1 */
        th_write_file(th_tmp_path(name), c, data + (size_t)(rows[s + 1] - rows[s]) * 3);
        free(c);
    }
    free(b);
    char pattern[256], **paths = NULL;
    int np = 0;
    snprintf(pattern, sizeof pattern, "%s/part-*.npy", th_tmp_dir());
    MR_ASSERT_OK(mr_data_expand_paths(pattern, &paths, &np));
    assert_int_equal(np, 3);
    assert_non_null(strstr(paths[0], "part-0.npy"));
    assert_non_null(strstr(paths[2], "part-2.npy"));
    mr_data_paths_free(paths, np);
    /* a list keeps its order (and may mix globs) */
    char list[1024];
    snprintf(list, sizeof list, "%s/part-2.npy\n%s/part-1.npy\n%s/part-0*.npy", th_tmp_dir(), th_tmp_dir(), th_tmp_dir());
    MR_ASSERT_OK(mr_data_expand_paths(list, &paths, &np));
    assert_int_equal(np, 3);
    mr_dataset *parts[3] = {0}, *all = NULL, *whole = NULL;
    for (int s = 0; s < 3; s++) {
        const char *ps[1] = {paths[s]}, *nm[1] = {"a"};
        MR_ASSERT_OK(mr_data_from_npy(ps, NULL, nm, 1, &parts[s]));
    }
    mr_data_paths_free(paths, np);
    MR_ASSERT_OK(mr_data_concat(parts, 3, &all));
    assert_int_equal(mr_data_source_size(all), 5);
    whole = open1("v2.npy");
    /* in order: the same rows as the whole file */
    for (int64_t i = 0; i < 5; i++) {
        uint8_t a[3], w[3];
        element(all, i, a);
        element(whole, i, w);
        assert_memory_equal(a, w, 3);
    }
    /* shuffled: a state saved after 2 elements restores to the same last 3 */
    mr_dataset *sh = NULL;
    MR_ASSERT_OK(mr_data_shuffle(all, 5, 7, 1, &sh));
    mr_data_iter *it = NULL, *it2 = NULL;
    MR_ASSERT_OK(mr_data_iter_new(sh, &it));
    uint8_t got[5][3];
    void *blob = NULL;
    size_t bytes = 0;
    for (int i = 0; i < 5; i++) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        memcpy(got[i], e.data[0], 3);
        if (i == 1) MR_ASSERT_OK(mr_data_iter_save(it, &blob, &bytes));
    }
    MR_ASSERT_OK(mr_data_iter_new(sh, &it2));
    MR_ASSERT_OK(mr_data_iter_restore(it2, blob, bytes));
    for (int i = 2; i < 5; i++) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it2, &e, &end));
        assert_memory_equal(e.data[0], got[i], 3);
    }
    int sum = 0;
    for (int i = 0; i < 5; i++) sum += got[i][0];
    assert_int_equal(sum, 0 + 3 + 6 + 9 + 12); /* every row once */
    free(blob);
    mr_data_iter_free(it);
    mr_data_iter_free(it2);
    mr_data_free(sh);
    mr_data_free(whole);
    mr_data_free(all);
    for (int s = 0; s < 3; s++) mr_data_free(parts[s]);
    /* a glob that matches nothing */
    snprintf(pattern, sizeof pattern, "%s/nothing-*.npy", th_tmp_dir());
    th_expect_error(mr_data_expand_paths(pattern, &paths, &np), MR_ERR_NOT_FOUND, "nothing-*.npy: no file matches", "HINT");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_npz),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_hostile_headers),
        cmocka_unit_test(test_as_classes),
        cmocka_unit_test(test_sets),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
