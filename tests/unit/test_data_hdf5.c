/* data/ HDF5: round trips arrays (f32, f64, f16, i32, i64, u8; scalar and shaped components) and
 * IDX files (test-made, and Fashion-MNIST t10k when installed) through mr_data_write_hdf5 and
 * mr_data_from_hdf5, element by element, in order and under shuffle (which crosses the read
 * blocks) and with map(parallel=4) reading from several threads; widened integer types; every
 * error path (missing file, not HDF5, truncated file, missing dataset, mismatched first dims,
 * unsupported type, bad arguments) names the file and dataset; a failing pipeline leaves neither
 * the target nor the temporary file. Prints the HDF5 source's Fashion-MNIST train throughput
 * through shuffle(10000) + batch(128). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <hdf5.h>

#include "harness.h"
#include "data/data.h"

#define FMNIST "/usr/share/datasets/fashion-mnist/"

#define tpath th_tmp_path

static void expect_err(mr_status got, mr_status want, const char *n1, const char *n2) {
    if (got != want) fail_msg("got %s (%s), expected %s", mr_status_name(got), mr_last_error(), mr_status_name(want));
    if (n1 && !strstr(mr_last_error(), n1)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n1);
    if (n2 && !strstr(mr_last_error(), n2)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n2);
}

/* Asserts that a and b deliver the same elements (same count, specs and bytes). */
static void assert_same(mr_dataset *a, mr_dataset *b) {
    mr_data_iter *ia = NULL, *ib = NULL;
    MR_ASSERT_OK(mr_data_iter_new(a, &ia));
    MR_ASSERT_OK(mr_data_iter_new(b, &ib));
    for (int64_t k = 0;; k++) {
        mr_data_elem ea, eb;
        int enda, endb;
        MR_ASSERT_OK(mr_data_iter_next(ia, &ea, &enda));
        MR_ASSERT_OK(mr_data_iter_next(ib, &eb, &endb));
        assert_int_equal(enda, endb);
        if (enda) break;
        assert_int_equal(ea.n, eb.n);
        for (int c = 0; c < ea.n; c++) {
            assert_int_equal(ea.dtype[c], eb.dtype[c]);
            assert_true(mr_shape_eq(&ea.shape[c], &eb.shape[c]));
            size_t bytes = (size_t)mr_shape_numel(&ea.shape[c]) * mr_dtype_size(ea.dtype[c]);
            if (memcmp(ea.data[c], eb.data[c], bytes) != 0) fail_msg("element %lld component %d differs", (long long)k, c);
        }
    }
    mr_data_iter_free(ia);
    mr_data_iter_free(ib);
}

/* Both through shuffle(buffer, seed 7) (+ batch when > 0). */
static void assert_same_shuffled(mr_dataset *a, mr_dataset *b, int64_t buffer, int64_t batch) {
    mr_dataset *sa = NULL, *sb = NULL, *ba = NULL, *bb = NULL;
    MR_ASSERT_OK(mr_data_shuffle(a, buffer, 7, 1, &sa));
    MR_ASSERT_OK(mr_data_shuffle(b, buffer, 7, 1, &sb));
    if (batch) {
        MR_ASSERT_OK(mr_data_batch(sa, batch, 0, &ba));
        MR_ASSERT_OK(mr_data_batch(sb, batch, 0, &bb));
        assert_same(ba, bb);
    } else {
        assert_same(sa, sb);
    }
    mr_data_free(sa); mr_data_free(sb); mr_data_free(ba); mr_data_free(bb);
}

static int count_files(void) {
    DIR *d = opendir(th_tmp_dir());
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static mr_status copy_map(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch);
static mr_status failing_map(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch);

/* ---- round trips ---------------------------------------------------------------------------- */

static void test_roundtrip_arrays(void **state) {
    (void)state;
    const int64_t n = 3001; /* crosses several read blocks with a partial last one */
    float *f = malloc(sizeof(float) * (size_t)n * 6);
    double *d = malloc(sizeof(double) * (size_t)n);
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n * 2);
    int32_t *i = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t k = 0; k < n * 6; k++) f[k] = (float)k * 0.25f - 100.0f;
    for (int64_t k = 0; k < n; k++) d[k] = 1.0 / (double)(k + 1);
    for (int64_t k = 0; k < n * 2; k++) h[k] = (uint16_t)(0x3c00 + (k % 1000)); /* finite halves */
    for (int64_t k = 0; k < n; k++) i[k] = (int32_t)(k * 7919 - 1000000);
    mr_data_spec spec = {0};
    mr_shape s23 = mr_shape_2d(2, 3), sc = mr_shape_make(0, NULL), s2 = mr_shape_1d(2);
    MR_ASSERT_OK(mr_data_spec_add(&spec, "f", MR_F32, &s23));
    MR_ASSERT_OK(mr_data_spec_add(&spec, "d", MR_F64, &sc));
    MR_ASSERT_OK(mr_data_spec_add(&spec, "h", MR_F16, &s2));
    MR_ASSERT_OK(mr_data_spec_add(&spec, "i", MR_I32, &sc));
    const void *data[] = {f, d, h, i};
    mr_dataset *a = NULL, *b = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&spec, n, data, &a));
    MR_ASSERT_OK(mr_data_write_hdf5(a, tpath("a.h5"), NULL));
    const char *names[] = {"/f", "/d", "/h", "/i"};
    MR_ASSERT_OK(mr_data_from_hdf5(tpath("a.h5"), names, 4, &b));
    const mr_data_spec *bs = mr_data_element_spec(b);
    assert_int_equal(bs->n, 4);
    assert_string_equal(bs->comp[2].name, "h");
    assert_int_equal(bs->comp[2].dtype, MR_F16);
    assert_int_equal(bs->comp[0].shape.ndim, 2);
    assert_int_equal(bs->comp[0].shape.dim[1], 3);
    assert_int_equal(bs->comp[1].shape.ndim, 0);
    assert_same(a, b);
    assert_same_shuffled(a, b, 500, 0);
    assert_same_shuffled(a, b, 3001, 64);
    mr_data_free(b);
    /* i64 and u8, names in groups, written from a batched pipeline */
    int64_t *l = malloc(sizeof(int64_t) * (size_t)n);
    unsigned char *u = malloc((size_t)n * 5);
    for (int64_t k = 0; k < n; k++) l[k] = (int64_t)k << 40;
    for (int64_t k = 0; k < n * 5; k++) u[k] = (unsigned char)(k * 13);
    mr_data_spec s3 = {0};
    mr_shape s5 = mr_shape_1d(5);
    MR_ASSERT_OK(mr_data_spec_add(&s3, "l", MR_I64, &sc));
    MR_ASSERT_OK(mr_data_spec_add(&s3, "u", MR_U8, &s5));
    const void *d3[] = {l, u};
    mr_dataset *c = NULL, *cb = NULL, *c2 = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&s3, n, d3, &c));
    MR_ASSERT_OK(mr_data_batch(c, 100, 0, &cb));
    const char *n3[] = {"/g/long", "/g/h/bytes"};
    MR_ASSERT_OK(mr_data_write_hdf5(cb, tpath("c.h5"), n3));
    MR_ASSERT_OK(mr_data_from_hdf5(tpath("c.h5"), n3, 2, &c2));
    assert_string_equal(mr_data_element_spec(c2)->comp[1].name, "bytes");
    assert_same(c, c2);
    /* map(parallel=4) reads from several threads at once */
    mr_dataset *cs = NULL, *cs2 = NULL;
    MR_ASSERT_OK(mr_data_shuffle(c2, 1000, 3, 1, &cs));
    MR_ASSERT_OK(mr_data_shuffle(c, 1000, 3, 1, &cs2));
    mr_dataset *m1 = NULL, *m2 = NULL, *b1 = NULL, *b2 = NULL;
    mr_data_spec same = *mr_data_element_spec(c);
    MR_ASSERT_OK(mr_data_map(cs, copy_map, NULL, &same, 4, &m1));
    MR_ASSERT_OK(mr_data_map(cs2, copy_map, NULL, &same, 1, &m2));
    MR_ASSERT_OK(mr_data_batch(m1, 77, 0, &b1));
    MR_ASSERT_OK(mr_data_batch(m2, 77, 0, &b2));
    assert_same(b1, b2);
    mr_data_free(cs); mr_data_free(cs2); mr_data_free(m1); mr_data_free(m2); mr_data_free(b1); mr_data_free(b2);
    mr_data_free(c); mr_data_free(cb); mr_data_free(c2); mr_data_free(a);
    free(f); free(d); free(h); free(i); free(l); free(u);
    assert_int_equal(count_files(), 2); /* no temporaries left */
}

static mr_status copy_map(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)ctx; (void)index; (void)epoch;
    *(int64_t *)out[0] = *(const int64_t *)in[0];
    memcpy(out[1], in[1], 5);
    return MR_OK;
}

static void write_idx(const char *path, int ndim, const int *dims, const unsigned char *data) {
    size_t count = 1;
    for (int k = 0; k < ndim; k++) count *= (size_t)dims[k];
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    unsigned char hdr[4 + 4 * 4] = {0, 0, 0x08, (unsigned char)ndim};
    for (int k = 0; k < ndim; k++)
        for (int j = 0; j < 4; j++) hdr[4 + 4 * k + j] = (unsigned char)((unsigned)dims[k] >> (24 - 8 * j));
    assert_int_equal(gzwrite(f, hdr, (unsigned)(4 + 4 * ndim)), 4 + 4 * ndim);
    assert_int_equal(gzwrite(f, data, (unsigned)count), (int)count);
    assert_int_equal(gzclose(f), Z_OK);
}

static void idx_roundtrip(const char *img, const char *lab, const char *h5) {
    mr_dataset *a = NULL, *b = NULL;
    MR_ASSERT_OK(mr_data_from_idx(img, lab, &a));
    MR_ASSERT_OK(mr_data_write_hdf5(a, h5, NULL));
    const char *names[] = {"/image", "/label"};
    MR_ASSERT_OK(mr_data_from_hdf5(h5, names, 2, &b));
    assert_int_equal(mr_data_element_spec(b)->comp[0].dtype, MR_U8);
    assert_int_equal(mr_data_element_spec(b)->comp[1].dtype, MR_I32);
    assert_same(a, b);
    assert_same_shuffled(a, b, 1000, 128);
    mr_data_free(a);
    mr_data_free(b);
}

static void test_roundtrip_idx(void **state) {
    (void)state;
    int dims[3] = {257, 5, 4}, ldims[1] = {257};
    unsigned char *img = malloc(257 * 20), lab[257];
    for (int k = 0; k < 257 * 20; k++) img[k] = (unsigned char)(k * 31 + 7);
    for (int k = 0; k < 257; k++) lab[k] = (unsigned char)(k % 10);
    write_idx(tpath("img.gz"), 3, dims, img);
    write_idx(tpath("lab.gz"), 1, ldims, lab);
    idx_roundtrip(tpath("img.gz"), tpath("lab.gz"), tpath("idx.h5"));
    free(img);
    if (access(FMNIST "t10k-images-idx3-ubyte.gz", R_OK) != 0) {
        print_message("Fashion-MNIST not installed at " FMNIST "; the real-data round trip is skipped\n");
        return;
    }
    idx_roundtrip(FMNIST "t10k-images-idx3-ubyte.gz", FMNIST "t10k-labels-idx1-ubyte.gz", tpath("t10k.h5"));
}

/* ---- files written with the HDF5 API directly (types the writer does not produce) ------------ */

static void h5_put(hid_t f, const char *name, hid_t type, int rank, const hsize_t *dims, const void *data) {
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t d = H5Dcreate2(f, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(d >= 0);
    if (data) assert_true(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(d);
    H5Sclose(sp);
}

static void make_typed_file(const char *path) {
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(f >= 0);
    hsize_t d10[1] = {10}, d9[1] = {9}, d10x2[2] = {10, 2};
    uint16_t u16[10];
    int8_t i8[10];
    uint32_t u32[10];
    uint64_t u64[10];
    int32_t be[20];
    for (int k = 0; k < 10; k++) {
        u16[k] = (uint16_t)(60000 + k);
        i8[k] = (int8_t)(-k);
        u32[k] = 4000000000u + (uint32_t)k;
        u64[k] = (uint64_t)k;
    }
    for (int k = 0; k < 20; k++) be[k] = k - 5;
    h5_put(f, "/u16", H5T_NATIVE_UINT16, 1, d10, u16);
    h5_put(f, "/i8", H5T_NATIVE_INT8, 1, d10, i8);
    h5_put(f, "/u32", H5T_NATIVE_UINT32, 1, d10, u32);
    h5_put(f, "/u64", H5T_NATIVE_UINT64, 1, d10, u64);
    h5_put(f, "/short", H5T_NATIVE_UINT8, 1, d9, u16);
    /* big-endian storage: HDF5 converts to native on read */
    hid_t sp = H5Screate_simple(2, d10x2, NULL);
    hid_t d = H5Dcreate2(f, "/be", H5T_STD_I32BE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, be) >= 0);
    H5Dclose(d);
    H5Sclose(sp);
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, 8);
    char s[10][8] = {{0}};
    h5_put(f, "/str", str, 1, d10, s);
    H5Tclose(str);
    H5Fclose(f);
}

static void test_types(void **state) {
    (void)state;
    make_typed_file(tpath("t.h5"));
    const char *names[] = {"/u16", "/i8", "/u32", "/be"};
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_hdf5(tpath("t.h5"), names, 4, &d));
    const mr_data_spec *s = mr_data_element_spec(d);
    assert_int_equal(s->comp[0].dtype, MR_I32);
    assert_int_equal(s->comp[1].dtype, MR_I32);
    assert_int_equal(s->comp[2].dtype, MR_I64);
    assert_int_equal(s->comp[3].dtype, MR_I32);
    assert_int_equal(s->comp[3].shape.dim[0], 2);
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    for (int k = 0;; k++) {
        mr_data_elem e;
        int end;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) { assert_int_equal(k, 10); break; }
        assert_int_equal(*(int32_t *)e.data[0], 60000 + k);
        assert_int_equal(*(int32_t *)e.data[1], -k);
        assert_true(*(int64_t *)e.data[2] == 4000000000ll + k);
        assert_int_equal(((int32_t *)e.data[3])[1], 2 * k + 1 - 5);
    }
    mr_data_iter_free(it);
    mr_data_free(d);
}

/* ---- errors --------------------------------------------------------------------------------- */

static void test_errors(void **state) {
    (void)state;
    make_typed_file(tpath("e.h5"));
    mr_dataset *d = NULL;
    const char *one[] = {"/u16"};
    expect_err(mr_data_from_hdf5(tpath("missing.h5"), one, 1, &d), MR_ERR_NOT_FOUND, "missing.h5", NULL);
    assert_null(d);
    const char *miss[] = {"/u16", "/nope"};
    expect_err(mr_data_from_hdf5(tpath("e.h5"), miss, 2, &d), MR_ERR_NOT_FOUND, "e.h5", "/nope");
    const char *nested[] = {"/no/such/thing"};
    expect_err(mr_data_from_hdf5(tpath("e.h5"), nested, 1, &d), MR_ERR_NOT_FOUND, "e.h5", "/no/such/thing");
    const char *mism[] = {"/u16", "/short"};
    expect_err(mr_data_from_hdf5(tpath("e.h5"), mism, 2, &d), MR_ERR_FORMAT, "/short", "9 elements");
    const char *u64[] = {"/u64"};
    expect_err(mr_data_from_hdf5(tpath("e.h5"), u64, 1, &d), MR_ERR_UNSUPPORTED, "e.h5", "/u64");
    const char *str[] = {"/str"};
    expect_err(mr_data_from_hdf5(tpath("e.h5"), str, 1, &d), MR_ERR_UNSUPPORTED, "/str", "string");
    expect_err(mr_data_from_hdf5(tpath("e.h5"), one, 0, &d), MR_ERR_INVALID, "e.h5", NULL);
    const char *empty[] = {""};
    expect_err(mr_data_from_hdf5(tpath("e.h5"), empty, 1, &d), MR_ERR_INVALID, "e.h5", "empty");
    const char *grp[] = {"/"};
    mr_status st = mr_data_from_hdf5(tpath("e.h5"), grp, 1, &d);
    assert_true(st != MR_OK);
    assert_null(d);
    /* not HDF5 at all */
    FILE *f = fopen(tpath("junk.h5"), "wb");
    fputs("this is not an HDF5 file, just some text padding it out to a few hundred bytes.........", f);
    fclose(f);
    expect_err(mr_data_from_hdf5(tpath("junk.h5"), one, 1, &d), MR_ERR_FORMAT, "junk.h5", "HDF5");
    /* truncated: a real file cut in half */
    const int64_t n = 20000;
    float *x = calloc((size_t)n, sizeof(float));
    mr_data_spec spec = {0};
    mr_shape sc = mr_shape_make(0, NULL);
    MR_ASSERT_OK(mr_data_spec_add(&spec, "x", MR_F32, &sc));
    const void *data[] = {x};
    mr_dataset *a = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&spec, n, data, &a));
    MR_ASSERT_OK(mr_data_write_hdf5(a, tpath("full.h5"), NULL));
    f = fopen(tpath("full.h5"), "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *buf = malloc((size_t)size);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    f = fopen(tpath("cut.h5"), "wb");
    fwrite(buf, 1, (size_t)size / 2, f);
    fclose(f);
    const char *xs[] = {"/x"};
    st = mr_data_from_hdf5(tpath("cut.h5"), xs, 1, &d);
    print_message("truncated file: %s\n", st == MR_OK ? "opened, reads fail" : mr_last_error());
    if (st == MR_OK) { /* opened: then reading must fail, naming the file */
        mr_data_iter *it = NULL;
        MR_ASSERT_OK(mr_data_iter_new(d, &it));
        mr_data_elem e;
        int end = 0;
        for (int k = 0; k < n && st == MR_OK && !end; k++) st = mr_data_iter_next(it, &e, &end);
        expect_err(st, MR_ERR_IO, "cut.h5", "/x");
        mr_data_iter_free(it);
        mr_data_free(d);
        d = NULL;
    } else {
        expect_err(st, MR_ERR_FORMAT, "cut.h5", NULL);
    }
    /* corrupt header bytes */
    memset(buf + 8, 0xA5, 64);
    f = fopen(tpath("bad.h5"), "wb");
    fwrite(buf, 1, (size_t)size, f);
    fclose(f);
    st = mr_data_from_hdf5(tpath("bad.h5"), xs, 1, &d);
    assert_true(st == MR_ERR_FORMAT || st == MR_ERR_NOT_FOUND);
    assert_non_null(strstr(mr_last_error(), "bad.h5"));
    free(buf);
    /* writer: bad dtype, and a failing pipeline leaves nothing behind */
    mr_data_spec bs = {0};
    MR_ASSERT_OK(mr_data_spec_add(&bs, "b", MR_BF16, &sc));
    uint16_t z[4] = {0};
    const void *bd[] = {z};
    mr_dataset *bf = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&bs, 4, bd, &bf));
    int before = count_files();
    expect_err(mr_data_write_hdf5(bf, tpath("bf.h5"), NULL), MR_ERR_UNSUPPORTED, "bf.h5", "bf16");
    assert_int_equal(count_files(), before);
    mr_dataset *fm = NULL;
    MR_ASSERT_OK(mr_data_map(a, failing_map, NULL, &spec, 1, &fm));
    expect_err(mr_data_write_hdf5(fm, tpath("fail.h5"), NULL), MR_ERR_INVALID, "element 12345", NULL);
    assert_int_equal(count_files(), before);
    assert_int_equal(access(tpath("fail.h5"), F_OK), -1);
    const char *dup[] = {"/x", "/x"};
    expect_err(mr_data_from_hdf5(tpath("full.h5"), dup, 2, &d), MR_ERR_INVALID, "repeated", NULL);
    mr_data_free(fm);
    mr_data_free(bf);
    mr_data_free(a);
    free(x);
}

static mr_status failing_map(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)ctx; (void)epoch;
    if (index == 12345) return mr_set_error(MR_ERR_INVALID, "test map: element 12345 is bad");
    *(float *)out[0] = *(const float *)in[0];
    return MR_OK;
}

/* ---- throughput ----------------------------------------------------------------------------- */

static void test_fashion_mnist_throughput(void **state) {
    (void)state;
    if (access(FMNIST "train-images-idx3-ubyte.gz", R_OK) != 0) skip();
    mr_dataset *idx = NULL, *src = NULL;
    MR_ASSERT_OK(mr_data_from_idx(FMNIST "train-images-idx3-ubyte.gz", FMNIST "train-labels-idx1-ubyte.gz", &idx));
    MR_ASSERT_OK(mr_data_write_hdf5(idx, tpath("train.h5"), NULL));
    const char *names[] = {"/image", "/label"};
    MR_ASSERT_OK(mr_data_from_hdf5(tpath("train.h5"), names, 2, &src));
    mr_dataset *a = NULL, *c = NULL;
    MR_ASSERT_OK(mr_data_shuffle(src, 10000, 1, 1, &a));
    MR_ASSERT_OK(mr_data_batch(a, 128, 0, &c));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(c, &it));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int64_t n = 0, sum = 0;
    for (;;) {
        mr_data_elem e;
        int end;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        sum += ((const unsigned char *)e.data[0])[400];
        n += e.shape[0].dim[0];
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    print_message("fashion-mnist train from HDF5, shuffle(10000) + batch(128): %lld elements in %.3f s = %.0f "
                  "elements/s (checksum %lld)\n", (long long)n, s, (double)n / s, (long long)sum);
    assert_int_equal(n, 60000);
    mr_data_iter_free(it);
    mr_data_free(a); mr_data_free(c); mr_data_free(src); mr_data_free(idx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_arrays), cmocka_unit_test(test_roundtrip_idx),
        cmocka_unit_test(test_types),            cmocka_unit_test(test_errors),
        cmocka_unit_test(test_fashion_mnist_throughput),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
