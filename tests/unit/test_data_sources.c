/* data/ sources: in-memory arrays (copied), IDX files written by the test (plain and gzipped with
 * zlib; images, labels, both), real Fashion-MNIST when installed (60000/10000 images, first
 * label), flat token files (uint16/uint32, raw and llm.c header, window contents), the callback
 * source; every error path (missing file, wrong magic, truncated/corrupt gzip and IDX, trailing
 * bytes, count mismatch, odd token file size, bad transform params) returns MR_ERR_* with a message
 * naming the file and the offset/field. Also prints Fashion-MNIST train throughput through
 * map(u8 -> f32) + shuffle(10000) + batch(128) with 1 and 2 threads. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "harness.h"
#include "data/data.h"

#define FMNIST "/usr/share/datasets/fashion-mnist/"

#define tpath th_tmp_path

static void write_file(const char *path, const void *p, size_t n, int gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        if (n) assert_int_equal(gzwrite(f, p, (unsigned)n), (int)n);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (n) assert_int_equal(fwrite(p, 1, n, f), n);
        fclose(f);
    }
}

/* An IDX of u8: header (type byte, dims) + data; returns malloc'd bytes and their count. */
static unsigned char *idx_bytes(int type, int ndim, const int *dims, const unsigned char *data, size_t *n) {
    size_t count = 1;
    for (int d = 0; d < ndim; d++) count *= (size_t)dims[d];
    *n = 4 + 4 * (size_t)ndim + count;
    unsigned char *b = malloc(*n);
    b[0] = 0; b[1] = 0; b[2] = (unsigned char)type; b[3] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++)
        for (int k = 0; k < 4; k++) b[4 + 4 * d + k] = (unsigned char)((unsigned)dims[d] >> (24 - 8 * k));
    memcpy(b + 4 + 4 * ndim, data, count);
    return b;
}

static void write_idx(const char *path, int ndim, const int *dims, const unsigned char *data, int gz) {
    size_t n;
    unsigned char *b = idx_bytes(0x08, ndim, dims, data, &n);
    write_file(path, b, n, gz);
    free(b);
}

static void expect_err(mr_status got, mr_status want, const char *n1, const char *n2) {
    if (got != want) fail_msg("got %s (%s), expected %s", mr_status_name(got), mr_last_error(), mr_status_name(want));
    if (n1 && !strstr(mr_last_error(), n1)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n1);
    if (n2 && !strstr(mr_last_error(), n2)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n2);
}

/* ---- arrays and callback -------------------------------------------------------------------- */

static void test_arrays(void **state) {
    (void)state;
    mr_data_spec s = {0};
    mr_shape s23 = mr_shape_2d(2, 3), sc = mr_shape_make(0, NULL);
    MR_ASSERT_OK(mr_data_spec_add(&s, "image", MR_F32, &s23));
    MR_ASSERT_OK(mr_data_spec_add(&s, "label", MR_I32, &sc));
    float img[5][6];
    int32_t lab[5];
    for (int i = 0; i < 5; i++) {
        lab[i] = 10 * i;
        for (int k = 0; k < 6; k++) img[i][k] = (float)(i * 6 + k);
    }
    const void *data[2] = {img, lab};
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&s, 5, data, &d));
    img[0][0] = -1; /* copied: later changes do not show */
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    for (int i = 0; i < 5; i++) {
        mr_data_elem e;
        int end = 1;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        assert_int_equal(end, 0);
        assert_int_equal(e.n, 2);
        assert_int_equal(e.shape[0].ndim, 2);
        assert_int_equal(e.shape[1].ndim, 0);
        assert_int_equal(*(int32_t *)e.data[1], 10 * i);
        for (int k = 0; k < 6; k++) assert_true(((float *)e.data[0])[k] == (float)(i * 6 + k));
    }
    mr_data_elem e;
    int end = 0;
    MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
    assert_int_equal(end, 1);
    mr_data_iter_free(it);
    mr_data_free(d);
    /* spec errors */
    mr_data_spec bad = {0};
    expect_err(mr_data_from_arrays(&bad, 1, data, &d), MR_ERR_INVALID, "components", NULL);
    assert_null(d);
    expect_err(mr_data_spec_add(&s, "image", MR_F32, &sc), MR_ERR_INVALID, "repeated", NULL);
    expect_err(mr_data_spec_add(&s, "", MR_F32, &sc), MR_ERR_INVALID, "name", NULL);
    expect_err(mr_data_spec_add(&s, "q", (mr_dtype)99, &sc), MR_ERR_INVALID, "dtype", NULL);
    expect_err(mr_data_from_arrays(&s, -1, data, &d), MR_ERR_INVALID, "n = -1", NULL);
}

static mr_status sq(void *ctx, int64_t i, void *const out[]) {
    int64_t fail_at = *(const int64_t *)ctx;
    if (i == fail_at) return mr_set_error(MR_ERR_IO, "sq: element %lld unavailable", (long long)i);
    *(int32_t *)out[0] = (int32_t)(i * i);
    return MR_OK;
}

static void test_fn_source(void **state) {
    (void)state;
    mr_data_spec s = {0};
    mr_shape sc = mr_shape_make(0, NULL);
    MR_ASSERT_OK(mr_data_spec_add(&s, "sq", MR_I32, &sc));
    int64_t fail_at = 6;
    mr_dataset *d = NULL, *t = NULL;
    MR_ASSERT_OK(mr_data_from_fn(&s, 9, sq, &fail_at, &d));
    MR_ASSERT_OK(mr_data_skip(d, 2, &t));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(t, &it));
    mr_data_elem e;
    int end;
    for (int i = 2; i < 6; i++) {
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        assert_int_equal(*(int32_t *)e.data[0], i * i);
    }
    expect_err(mr_data_iter_next(it, &e, &end), MR_ERR_IO, "element 6 unavailable", NULL);
    mr_data_iter_free(it);
    mr_data_free(t);
    mr_data_free(d);
    expect_err(mr_data_from_fn(&s, 9, NULL, NULL, &d), MR_ERR_INVALID, "fn is NULL", NULL);
}

/* ---- IDX ------------------------------------------------------------------------------------ */

static void check_idx(const char *ip, const char *lp, int n, int h, int w, const unsigned char *img,
                      const unsigned char *lab) {
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_idx(ip, lp, &d));
    const mr_data_spec *s = mr_data_element_spec(d);
    assert_int_equal(s->n, (ip != NULL) + (lp != NULL));
    if (ip) {
        assert_string_equal(s->comp[0].name, "image");
        assert_int_equal(s->comp[0].dtype, MR_U8);
        assert_int_equal(s->comp[0].shape.ndim, 2);
        assert_int_equal(s->comp[0].shape.dim[0], h);
        assert_int_equal(s->comp[0].shape.dim[1], w);
    }
    if (lp) {
        assert_string_equal(s->comp[s->n - 1].name, "label");
        assert_int_equal(s->comp[s->n - 1].dtype, MR_I32);
        assert_int_equal(s->comp[s->n - 1].shape.ndim, 0);
    }
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    for (int i = 0; i <= n; i++) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        assert_int_equal(end, i == n);
        if (end) break;
        if (ip) assert_memory_equal(e.data[0], img + (size_t)i * h * w, (size_t)h * w);
        if (lp) assert_int_equal(*(int32_t *)e.data[s->n - 1], lab[i]);
    }
    mr_data_iter_free(it);
    mr_data_free(d);
}

static void test_idx(void **state) {
    (void)state;
    enum { N = 7, H = 4, W = 3 };
    unsigned char img[N * H * W], lab[N];
    for (int i = 0; i < N * H * W; i++) img[i] = (unsigned char)(i * 37 + 5);
    for (int i = 0; i < N; i++) lab[i] = (unsigned char)(250 - i);
    const int idims[3] = {N, H, W}, ldims[1] = {N};
    for (int gz = 0; gz < 2; gz++) {
        const char *ip = tpath(gz ? "img.gz" : "img"), *lp = tpath(gz ? "lab.gz" : "lab");
        write_idx(ip, 3, idims, img, gz);
        write_idx(lp, 1, ldims, lab, gz);
        check_idx(ip, lp, N, H, W, img, lab);
        check_idx(ip, NULL, N, H, W, img, lab);
        check_idx(NULL, lp, N, H, W, img, lab);
    }
    /* an empty dataset is fine */
    const int zdims[3] = {0, H, W};
    write_idx(tpath("empty"), 3, zdims, img, 1);
    check_idx(tpath("empty"), NULL, 0, H, W, img, lab);
}

static void test_idx_errors(void **state) {
    (void)state;
    enum { N = 5, H = 6, W = 6 };
    unsigned char img[N * H * W], lab[N + 1];
    memset(img, 7, sizeof img);
    memset(lab, 1, sizeof lab);
    const int idims[3] = {N, H, W}, ldims[1] = {N}, ldims2[1] = {N + 1}, l2d[2] = {N, 1};
    mr_dataset *d = (mr_dataset *)1;
    char ip[160], lp[160]; /* tpath's buffers rotate */
    snprintf(ip, sizeof ip, "%s", tpath("i"));
    snprintf(lp, sizeof lp, "%s", tpath("l"));
    write_idx(ip, 3, idims, img, 1);
    write_idx(lp, 1, ldims, lab, 1);

    expect_err(mr_data_from_idx(tpath("nope"), NULL, &d), MR_ERR_NOT_FOUND, "nope", NULL);
    assert_null(d);
    expect_err(mr_data_from_idx(ip, tpath("nope"), &d), MR_ERR_NOT_FOUND, "nope", NULL);
    expect_err(mr_data_from_idx(NULL, NULL, &d), MR_ERR_INVALID, "NULL", NULL);
    /* count mismatch */
    write_idx(tpath("l6"), 1, ldims2, lab, 0);
    expect_err(mr_data_from_idx(ip, tpath("l6"), &d), MR_ERR_FORMAT, "l6", "6 labels");
    /* labels with 2 dims, images with 1 */
    write_idx(tpath("l2d"), 2, l2d, lab, 0);
    expect_err(mr_data_from_idx(NULL, tpath("l2d"), &d), MR_ERR_FORMAT, "l2d", "1 dim");
    expect_err(mr_data_from_idx(lp, NULL, &d), MR_ERR_FORMAT, "offset 3", ">= 2 dims");

    size_t n;
    unsigned char *b = idx_bytes(0x08, 3, idims, img, &n);
    /* wrong magic, plain and gzipped */
    b[0] = 0x1f;
    write_file(tpath("magic"), b, n, 0);
    expect_err(mr_data_from_idx(tpath("magic"), NULL, &d), MR_ERR_FORMAT, "magic", "offset 0");
    write_file(tpath("magic.gz"), b, n, 1);
    expect_err(mr_data_from_idx(tpath("magic.gz"), NULL, &d), MR_ERR_FORMAT, "magic.gz", "offset 0");
    b[0] = 0;
    b[2] = 0x0D; /* float IDX */
    write_file(tpath("f32"), b, n, 0);
    expect_err(mr_data_from_idx(tpath("f32"), NULL, &d), MR_ERR_UNSUPPORTED, "0x0d", "offset 2");
    b[2] = 0x42;
    write_file(tpath("type"), b, n, 0);
    expect_err(mr_data_from_idx(tpath("type"), NULL, &d), MR_ERR_FORMAT, "type", "offset 2");
    b[2] = 0x08;
    b[3] = 0;
    write_file(tpath("ndim"), b, n, 0);
    expect_err(mr_data_from_idx(tpath("ndim"), NULL, &d), MR_ERR_FORMAT, "dims", "offset 3");
    b[3] = 3;
    /* truncated: in the header, in the dims, in the data; plain and gzipped */
    const size_t cuts[] = {2, 9, n - 1, 40};
    for (int gz = 0; gz < 2; gz++)
        for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
            write_file(tpath("trunc"), b, cuts[k], gz);
            expect_err(mr_data_from_idx(tpath("trunc"), NULL, &d), MR_ERR_FORMAT, "trunc", "truncated");
            assert_null(d);
        }
    /* trailing bytes */
    unsigned char *b2 = malloc(n + 3);
    memcpy(b2, b, n);
    memset(b2 + n, 0, 3);
    write_file(tpath("trail"), b2, n + 3, 1);
    expect_err(mr_data_from_idx(tpath("trail"), NULL, &d), MR_ERR_FORMAT, "trailing", "offset 196");
    free(b2);
    /* huge declared dims: an error before any big allocation */
    const unsigned char bh[16] = {0, 0, 8, 3, 0x77, 0x35, 0x94, 0, 0x77, 0x35, 0x94, 0, 0, 0, 0, 2};
    write_file(tpath("huge"), bh, sizeof bh, 0);
    expect_err(mr_data_from_idx(tpath("huge"), NULL, &d), MR_ERR_FORMAT, "huge", "2^40");
    /* a gzip stream cut in the middle, and one with a flipped byte (caught by the CRC at least) */
    size_t nz = n;
    free(b);
    b = idx_bytes(0x08, 3, idims, img, &n);
    write_file(tpath("z.gz"), b, n, 1);
    FILE *f = fopen(tpath("z.gz"), "rb");
    unsigned char zb[4096];
    nz = fread(zb, 1, sizeof zb, f);
    fclose(f);
    assert_true(nz > 24);
    write_file(tpath("zcut.gz"), zb, nz - 10, 0);
    expect_err(mr_data_from_idx(tpath("zcut.gz"), NULL, &d), MR_ERR_FORMAT, "zcut.gz", "offset");
    zb[nz / 2] ^= 0x5a;
    zb[nz / 2 + 1] ^= 0xa5;
    write_file(tpath("zbad.gz"), zb, nz, 0);
    expect_err(mr_data_from_idx(tpath("zbad.gz"), NULL, &d), MR_ERR_FORMAT, "zbad.gz", NULL);
    /* corrupt only the CRC trailer: the data decompresses, the check fails */
    memcpy(zb, zb, 0);
    f = fopen(tpath("z.gz"), "rb");
    nz = fread(zb, 1, sizeof zb, f);
    fclose(f);
    zb[nz - 6] ^= 0xff;
    write_file(tpath("zcrc.gz"), zb, nz, 0);
    expect_err(mr_data_from_idx(tpath("zcrc.gz"), NULL, &d), MR_ERR_FORMAT, "zcrc.gz", "corrupt");
    free(b);
}

static int have_fmnist(void) { return access(FMNIST "train-images-idx3-ubyte.gz", R_OK) == 0; }

static void test_fashion_mnist(void **state) {
    (void)state;
    if (!have_fmnist()) {
        print_message("Fashion-MNIST not installed at " FMNIST "; skipped\n");
        skip();
    }
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_idx(FMNIST "train-images-idx3-ubyte.gz", FMNIST "train-labels-idx1-ubyte.gz", &d));
    const mr_data_spec *s = mr_data_element_spec(d);
    assert_int_equal(s->comp[0].shape.dim[0], 28);
    assert_int_equal(s->comp[0].shape.dim[1], 28);
    mr_dataset *b = NULL;
    MR_ASSERT_OK(mr_data_batch(d, 1000, 0, &b));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(b, &it));
    int64_t n = 0, hist[10] = {0};
    int first = -1;
    for (;;) {
        mr_data_elem e;
        int end;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        const int32_t *l = e.data[1];
        if (first < 0) first = l[0];
        for (int64_t i = 0; i < e.shape[1].dim[0]; i++) {
            assert_true(l[i] >= 0 && l[i] < 10);
            hist[l[i]]++;
        }
        n += e.shape[0].dim[0];
    }
    assert_int_equal(n, 60000);
    assert_int_equal(first, 9); /* the first training image is an ankle boot */
    for (int c = 0; c < 10; c++) assert_int_equal(hist[c], 6000);
    mr_data_iter_free(it);
    mr_data_free(b);
    mr_data_free(d);
    MR_ASSERT_OK(mr_data_from_idx(FMNIST "t10k-images-idx3-ubyte.gz", FMNIST "t10k-labels-idx1-ubyte.gz", &d));
    mr_dataset *t = NULL;
    MR_ASSERT_OK(mr_data_skip(d, 9999, &t));
    MR_ASSERT_OK(mr_data_iter_new(t, &it));
    mr_data_elem e;
    int end;
    MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
    assert_int_equal(end, 0);
    MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
    assert_int_equal(end, 1);
    mr_data_iter_free(it);
    mr_data_free(t);
    mr_data_free(d);
}

/* u8 image -> f32 in [0, 1], label through. */
static mr_status normalize(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)ctx; (void)index; (void)epoch;
    const unsigned char *p = in[0];
    float *q = out[0];
    for (int i = 0; i < 784; i++) q[i] = (float)p[i] * (1.0f / 255.0f);
    *(int32_t *)out[1] = *(const int32_t *)in[1];
    return MR_OK;
}

static void test_fashion_mnist_throughput(void **state) {
    (void)state;
    if (!have_fmnist()) skip();
    mr_dataset *src = NULL;
    MR_ASSERT_OK(mr_data_from_idx(FMNIST "train-images-idx3-ubyte.gz", FMNIST "train-labels-idx1-ubyte.gz", &src));
    mr_data_spec ms = {0};
    mr_shape s28 = mr_shape_2d(28, 28), sc = mr_shape_make(0, NULL);
    MR_ASSERT_OK(mr_data_spec_add(&ms, "image", MR_F32, &s28));
    MR_ASSERT_OK(mr_data_spec_add(&ms, "label", MR_I32, &sc));
    for (int threads = 1; threads <= 2; threads++) {
        mr_dataset *a = NULL, *b = NULL, *c = NULL, *d = NULL;
        MR_ASSERT_OK(mr_data_shuffle(src, 10000, 1, 1, &a));
        MR_ASSERT_OK(mr_data_map(a, normalize, NULL, &ms, threads, &b));
        MR_ASSERT_OK(mr_data_batch(b, 128, 0, &c));
        MR_ASSERT_OK(mr_data_prefetch(c, 2, &d));
        mr_data_iter *it = NULL;
        MR_ASSERT_OK(mr_data_iter_new(d, &it));
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int64_t n = 0, limit = th_quick() ? 5000 : 60000;
        double sum = 0;
        while (n < limit) {
            mr_data_elem e;
            int end;
            MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
            if (end) break;
            sum += ((const float *)e.data[0])[100];
            n += e.shape[0].dim[0];
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        print_message("fashion-mnist train, map(normalize, parallel=%d) + shuffle(10000) + batch(128) + prefetch(2): "
                      "%lld elements in %.3f s = %.0f elements/s (checksum %.1f)\n",
                      threads, (long long)n, s, (double)n / s, sum);
        assert_true(n >= limit);
        mr_data_iter_free(it);
        mr_data_free(a); mr_data_free(b); mr_data_free(c); mr_data_free(d);
    }
    mr_data_free(src);
}

/* ---- token files ---------------------------------------------------------------------------- */

static void write_tokens(const char *path, int tb, int64_t ntok, int llmc, int version, uint32_t base, int extra) {
    size_t hdr = llmc ? 1024 : 0, n = hdr + (size_t)ntok * (size_t)tb + (size_t)extra;
    unsigned char *b = calloc(n, 1);
    if (llmc) {
        int32_t h[3] = {20240520, version, (int32_t)ntok};
        memcpy(b, h, sizeof h);
    }
    for (int64_t i = 0; i < ntok; i++) {
        uint32_t v = base + (uint32_t)(i * 7 % 1000);
        for (int k = 0; k < tb; k++) b[hdr + (size_t)i * tb + (size_t)k] = (unsigned char)(v >> (8 * k));
    }
    write_file(path, b, n, 0);
    free(b);
}

static void check_tokens(const char *path, int tb, int64_t ntok, int64_t T, mr_data_token_header h, uint32_t base) {
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_tokens(path, tb, T, h, &d));
    const mr_data_spec *s = mr_data_element_spec(d);
    assert_string_equal(s->comp[0].name, "x");
    assert_string_equal(s->comp[1].name, "y");
    assert_int_equal(s->comp[0].shape.dim[0], T);
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    int64_t want = (ntok - 1) / T, got = 0;
    for (;;) {
        mr_data_elem e;
        int end;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        const int32_t *x = e.data[0], *y = e.data[1];
        for (int64_t k = 0; k < T; k++) {
            int64_t t = got * T + k; /* element i starts at token i*T */
            assert_int_equal(x[k], base + (uint32_t)(t * 7 % 1000));
            assert_int_equal(y[k], base + (uint32_t)((t + 1) * 7 % 1000));
        }
        got++;
    }
    assert_int_equal(got, want);
    mr_data_iter_free(it);
    mr_data_free(d);
}

static void test_tokens(void **state) {
    (void)state;
    write_tokens(tpath("t16.bin"), 2, 100, 0, 0, 60000, 0);
    check_tokens(tpath("t16.bin"), 2, 100, 8, MR_DATA_TOKENS_RAW, 60000);
    check_tokens(tpath("t16.bin"), 2, 100, 99, MR_DATA_TOKENS_RAW, 60000);
    check_tokens(tpath("t16.bin"), 2, 100, 11, MR_DATA_TOKENS_RAW, 60000);
    write_tokens(tpath("t32.bin"), 4, 81, 0, 0, 100000, 0);
    check_tokens(tpath("t32.bin"), 4, 81, 16, MR_DATA_TOKENS_RAW, 100000);
    write_tokens(tpath("llmc16.bin"), 2, 50, 1, 1, 3, 0);
    check_tokens(tpath("llmc16.bin"), 2, 50, 7, MR_DATA_TOKENS_LLMC, 3);
    write_tokens(tpath("llmc32.bin"), 4, 50, 1, 2, 70000, 0);
    check_tokens(tpath("llmc32.bin"), 4, 50, 5, MR_DATA_TOKENS_LLMC, 70000);
}

static void test_token_errors(void **state) {
    (void)state;
    mr_dataset *d = (mr_dataset *)1;
    write_tokens(tpath("odd.bin"), 2, 100, 0, 0, 1, 1);
    expect_err(mr_data_from_tokens(tpath("odd.bin"), 2, 8, MR_DATA_TOKENS_RAW, &d), MR_ERR_FORMAT, "odd.bin",
               "byte offset 200");
    assert_null(d);
    write_tokens(tpath("odd32.bin"), 4, 10, 0, 0, 1, 3);
    expect_err(mr_data_from_tokens(tpath("odd32.bin"), 4, 2, MR_DATA_TOKENS_RAW, &d), MR_ERR_FORMAT, "odd32.bin",
               "byte offset 40");
    expect_err(mr_data_from_tokens(tpath("none.bin"), 2, 8, MR_DATA_TOKENS_RAW, &d), MR_ERR_NOT_FOUND, "none.bin", NULL);
    write_tokens(tpath("short.bin"), 2, 8, 0, 0, 1, 0);
    expect_err(mr_data_from_tokens(tpath("short.bin"), 2, 8, MR_DATA_TOKENS_RAW, &d), MR_ERR_FORMAT, "short.bin",
               "fewer than context");
    write_tokens(tpath("empty.bin"), 2, 0, 0, 0, 1, 0);
    expect_err(mr_data_from_tokens(tpath("empty.bin"), 2, 8, MR_DATA_TOKENS_RAW, &d), MR_ERR_FORMAT, "empty.bin", NULL);
    expect_err(mr_data_from_tokens(tpath("short.bin"), 3, 2, MR_DATA_TOKENS_RAW, &d), MR_ERR_INVALID, "token size", NULL);
    expect_err(mr_data_from_tokens(tpath("short.bin"), 2, 0, MR_DATA_TOKENS_RAW, &d), MR_ERR_INVALID, "context", NULL);
    /* llm.c header: magic, version vs token size, count, too short for a header */
    write_tokens(tpath("l.bin"), 2, 50, 1, 1, 3, 0);
    expect_err(mr_data_from_tokens(tpath("l.bin"), 4, 4, MR_DATA_TOKENS_LLMC, &d), MR_ERR_FORMAT, "l.bin", "version");
    expect_err(mr_data_from_tokens(tpath("short.bin"), 2, 4, MR_DATA_TOKENS_LLMC, &d), MR_ERR_FORMAT, "short.bin",
               "header");
    write_tokens(tpath("raw.bin"), 2, 600, 0, 0, 3, 0);
    expect_err(mr_data_from_tokens(tpath("raw.bin"), 2, 4, MR_DATA_TOKENS_LLMC, &d), MR_ERR_FORMAT, "raw.bin", "magic");
    write_tokens(tpath("cnt.bin"), 2, 50, 1, 1, 3, 2);
    expect_err(mr_data_from_tokens(tpath("cnt.bin"), 2, 4, MR_DATA_TOKENS_LLMC, &d), MR_ERR_FORMAT, "cnt.bin", "offset 8");
    /* a u32 token above INT32_MAX fails next(), naming the offset */
    write_tokens(tpath("big.bin"), 4, 20, 0, 0, 0x80000000u, 0);
    MR_ASSERT_OK(mr_data_from_tokens(tpath("big.bin"), 4, 4, MR_DATA_TOKENS_RAW, &d));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    mr_data_elem e;
    int end;
    expect_err(mr_data_iter_next(it, &e, &end), MR_ERR_FORMAT, "big.bin", "offset 0");
    mr_data_iter_free(it);
    mr_data_free(d);
}

/* ---- transform parameters ------------------------------------------------------------------- */

static mr_status idmap(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)ctx; (void)in; (void)out; (void)index; (void)epoch;
    return MR_OK;
}

static void test_bad_params(void **state) {
    (void)state;
    mr_data_spec s = {0};
    mr_shape sc = mr_shape_make(0, NULL);
    MR_ASSERT_OK(mr_data_spec_add(&s, "a", MR_I32, &sc));
    int32_t v[3] = {1, 2, 3};
    const void *data[1] = {v};
    mr_dataset *d = NULL, *o = (mr_dataset *)1, *b = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&s, 3, data, &d));
    expect_err(mr_data_shard(d, 0, 0, &o), MR_ERR_INVALID, "shard", "n = 0");
    assert_null(o);
    expect_err(mr_data_shard(d, 2, 2, &o), MR_ERR_INVALID, "shard", "index = 2");
    expect_err(mr_data_shard(d, 2, -1, &o), MR_ERR_INVALID, "shard", NULL);
    expect_err(mr_data_shuffle(d, 0, 1, 1, &o), MR_ERR_INVALID, "shuffle", "buffer_size");
    expect_err(mr_data_batch(d, 0, 0, &o), MR_ERR_INVALID, "batch", "batch_size");
    expect_err(mr_data_repeat(d, -2, &o), MR_ERR_INVALID, "repeat", NULL);
    expect_err(mr_data_take(d, -1, &o), MR_ERR_INVALID, "take", NULL);
    expect_err(mr_data_skip(d, -5, &o), MR_ERR_INVALID, "skip", NULL);
    expect_err(mr_data_prefetch(d, -1, &o), MR_ERR_INVALID, "prefetch", NULL);
    expect_err(mr_data_map(d, NULL, NULL, &s, 1, &o), MR_ERR_INVALID, "map", "fn");
    expect_err(mr_data_map(d, idmap, NULL, &s, -3, &o), MR_ERR_INVALID, "map", "num_parallel_calls");
    mr_data_spec empty = {0};
    expect_err(mr_data_map(d, idmap, NULL, &empty, 1, &o), MR_ERR_INVALID, "map", "components");
    expect_err(mr_data_take(NULL, 1, &o), MR_ERR_INVALID, "NULL", NULL);
    MR_ASSERT_OK(mr_data_batch(d, 2, 0, &b));
    expect_err(mr_data_batch(b, 2, 0, &o), MR_ERR_UNSUPPORTED, "batch", NULL);
    expect_err(mr_data_map(b, idmap, NULL, &s, 1, &o), MR_ERR_UNSUPPORTED, "map", "HINT");
    expect_err(mr_data_iter_new(NULL, (mr_data_iter **)&o), MR_ERR_INVALID, NULL, NULL);
    mr_data_free(b);
    mr_data_free(d);
    mr_data_free(NULL);
    mr_data_iter_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arrays),         cmocka_unit_test(test_fn_source),
        cmocka_unit_test(test_idx),            cmocka_unit_test(test_idx_errors),
        cmocka_unit_test(test_fashion_mnist),  cmocka_unit_test(test_fashion_mnist_throughput),
        cmocka_unit_test(test_tokens),         cmocka_unit_test(test_token_errors),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
