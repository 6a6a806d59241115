/* checkpoint/: round trips every dtype (nested paths, scalars, empty arrays, NaN/inf/-0 bit
 * patterns), string/i64/f64 attributes (UTF-8, a long YAML text) and a 300 KB blob bit-exactly;
 * conversions on read (f32 <-> f64, integer widening); errors name the dataset (shape mismatch,
 * missing dataset, wrong dtype, bad writer input); a flipped byte in raw data is caught by the
 * crc32; truncated, non-HDF5 and foreign files give MR_ERR_FORMAT without a crash or anything on
 * stderr; a write that fails (file size limit, at several points of the write) leaves the old
 * checkpoint intact and no temp file; writers killed with SIGKILL at random moments never leave
 * a state where the newest verifying checkpoint is missing or damaged, and prune cleans up after
 * them; scan/latest/prune on a directory with damaged and unrelated files. Prints the write, read
 * and verify throughput of a ~100 MB checkpoint (20 MB in sanitizer/quick builds). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>
#include <hdf5.h>

#include "harness.h"
#include "checkpoint/ckpt.h"
#include "core/log.h"

#define tpath th_tmp_path

/* A scratch path in caller storage (th_tmp_path's buffers rotate). */
typedef struct tbuf {
    char s[256];
} tbuf;
static tbuf tp(const char *name) {
    tbuf b;
    snprintf(b.s, sizeof b.s, "%s", th_tmp_path(name));
    return b;
}

static void expect_err(mr_status got, mr_status want, const char *n1, const char *n2) {
    if (got != want) fail_msg("got %s (%s), expected %s", mr_status_name(got), mr_last_error(), mr_status_name(want));
    if (n1 && !strstr(mr_last_error(), n1)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n1);
    if (n2 && !strstr(mr_last_error(), n2)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n2);
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* Flips one byte in the middle of the first occurrence of pat in the file (asserts it is there). */
static void flip_pattern(const char *path, const void *pat, size_t plen) {
    size_t n;
    unsigned char *b = slurp(path, &n);
    unsigned char *hit = memmem(b, n, pat, plen);
    if (!hit) fail_msg("%s: pattern not found in the file", path);
    hit[plen / 2] ^= 0x40;
    spit(path, b, n);
    free(b);
}

/* stderr into a file between begin and end; end returns what was written (malloc'd). */
static int g_saved_stderr = -1;
static void stderr_begin(const char *file) {
    fflush(stderr);
    g_saved_stderr = dup(2);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    dup2(fd, 2);
    close(fd);
}
static char *stderr_end(const char *file) {
    fflush(stderr);
    dup2(g_saved_stderr, 2);
    close(g_saved_stderr);
    size_t n;
    char *s = (char *)slurp(file, &n);
    s[n] = '\0';
    return s;
}

/* Files in dir whose name contains `part`. */
static int count_named(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- round trip ------------------------------------------------------------------------------ */

static void test_roundtrip(void **state) {
    (void)state;
    float w1[10 * 784], b1[10], qkv[3 * 4 * 5], ea[6];
    double x64[7 * 3], sc = -1.0 / 3.0;
    int32_t i32[100];
    int64_t i64[6] = {INT64_MIN, -1, 0, 1, (int64_t)1 << 62, INT64_MAX};
    uint8_t u8[256];
    th_fill_uniform_f32(w1, 7840, -1, 1, 1);
    th_fill_uniform_f32(b1, 10, -1, 1, 2);
    th_fill_uniform_f32(qkv, 60, -3, 3, 3);
    th_fill_uniform_f64(x64, 21, -1e300, 1e300, 4);
    th_fill_int32(i32, 100, INT32_MIN / 2, INT32_MAX / 2, 5);
    for (int i = 0; i < 256; i++) u8[i] = (uint8_t)i;
    ea[0] = NAN; ea[1] = INFINITY; ea[2] = -INFINITY; ea[3] = -0.0f; ea[4] = 1e-45f; ea[5] = 3.4e38f;
    size_t nblob = 300 * 1024;
    unsigned char *blob = malloc(nblob);
    for (size_t i = 0; i < nblob; i++) blob[i] = (unsigned char)((i * 2654435761u) >> 13);
    char *yaml = malloc(64 * 1024);
    size_t yl = 0;
    for (int i = 0; yl < 60000; i++)
        yl += (size_t)snprintf(yaml + yl, 64 * 1024 - yl, "layer_%d:\n  width: %d\n  note: \"ünïcødé ✓ %d\"\n", i, i * 3, i);
    const char *utf8 = "résumé ✓ 日本語 🚀";

    mr_ckpt_writer *w = NULL;
    MR_ASSERT_OK(mr_ckpt_writer_new(&w));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "params/fc1.weight", MR_F32, &(mr_shape){2, {10, 784}}, w1));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "/params/fc1.bias", MR_F32, &(mr_shape){1, {10}}, b1));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "params/blocks/0/attn.qkv.weight", MR_F32, &(mr_shape){3, {3, 4, 5}}, qkv));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "params/f64/x", MR_F64, &(mr_shape){2, {7, 3}}, x64));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "params/empty", MR_F32, &(mr_shape){2, {0, 4}}, NULL));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "optimizer/fc1.weight/exp_avg", MR_F32, &(mr_shape){1, {6}}, ea));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "stats/scalar", MR_F64, &(mr_shape){0, {0}}, &sc));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "data/i32", MR_I32, &(mr_shape){1, {100}}, i32));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "data/i64", MR_I64, &(mr_shape){2, {2, 3}}, i64));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "data/u8", MR_U8, &(mr_shape){2, {16, 16}}, u8));
    MR_ASSERT_OK(mr_ckpt_writer_add_blob(w, "state/data_iter/0", blob, nblob));
    MR_ASSERT_OK(mr_ckpt_writer_add_blob(w, "state/data_iter/1", NULL, 0));
    MR_ASSERT_OK(mr_ckpt_writer_attr_str(w, "yaml", yaml));
    MR_ASSERT_OK(mr_ckpt_writer_attr_str(w, "name", utf8));
    MR_ASSERT_OK(mr_ckpt_writer_attr_str(w, "empty", ""));
    MR_ASSERT_OK(mr_ckpt_writer_attr_i64(w, "step", 500));
    MR_ASSERT_OK(mr_ckpt_writer_attr_i64(w, "min", INT64_MIN));
    MR_ASSERT_OK(mr_ckpt_writer_attr_f64(w, "loss_scale", 32768.0));
    MR_ASSERT_OK(mr_ckpt_writer_attr_f64(w, "lr", 3e-4));
    blob[0] ^= 1; /* copied at add time: a later change must not reach the file */
    MR_ASSERT_OK(mr_ckpt_writer_write(w, tpath("rt.h5")));
    MR_ASSERT_OK(mr_ckpt_writer_write(w, tpath("rt2.h5"))); /* the writer is reusable */
    blob[0] ^= 1;
    mr_ckpt_writer_free(w);
    assert_int_equal(count_named(th_tmp_dir(), ".tmp."), 0);

    mr_ckpt_reader *r = NULL;
    MR_ASSERT_OK(mr_ckpt_verify(tpath("rt.h5")));
    MR_ASSERT_OK(mr_ckpt_open(tpath("rt2.h5"), 0, &r));
    float gw[7840], gb[10], gq[60], gea[6];
    double g64[21], gsc;
    int32_t g32[100];
    int64_t gi64[6];
    uint8_t gu8[256];
    MR_ASSERT_OK(mr_ckpt_read(r, "params/fc1.weight", MR_F32, &(mr_shape){2, {10, 784}}, gw));
    MR_ASSERT_OK(mr_ckpt_read(r, "params/fc1.bias", MR_F32, &(mr_shape){1, {10}}, gb));
    MR_ASSERT_OK(mr_ckpt_read(r, "/params/blocks/0/attn.qkv.weight", MR_F32, &(mr_shape){3, {3, 4, 5}}, gq));
    MR_ASSERT_OK(mr_ckpt_read(r, "params/f64/x", MR_F64, &(mr_shape){2, {7, 3}}, g64));
    MR_ASSERT_OK(mr_ckpt_read(r, "params/empty", MR_F32, &(mr_shape){2, {0, 4}}, NULL));
    MR_ASSERT_OK(mr_ckpt_read(r, "optimizer/fc1.weight/exp_avg", MR_F32, &(mr_shape){1, {6}}, gea));
    MR_ASSERT_OK(mr_ckpt_read(r, "stats/scalar", MR_F64, &(mr_shape){0, {0}}, &gsc));
    MR_ASSERT_OK(mr_ckpt_read(r, "data/i32", MR_I32, &(mr_shape){1, {100}}, g32));
    MR_ASSERT_OK(mr_ckpt_read(r, "data/i64", MR_I64, &(mr_shape){2, {2, 3}}, gi64));
    MR_ASSERT_OK(mr_ckpt_read(r, "data/u8", MR_U8, &(mr_shape){2, {16, 16}}, gu8));
    assert_memory_equal(gw, w1, sizeof w1);
    assert_memory_equal(gb, b1, sizeof b1);
    assert_memory_equal(gq, qkv, sizeof qkv);
    assert_memory_equal(g64, x64, sizeof x64);
    assert_memory_equal(gea, ea, sizeof ea); /* NaN, inf, -0, denormal: bit-equal */
    assert_memory_equal(&gsc, &sc, sizeof sc);
    assert_memory_equal(g32, i32, sizeof i32);
    assert_memory_equal(gi64, i64, sizeof i64);
    assert_memory_equal(gu8, u8, sizeof u8);
    void *gblob = NULL;
    size_t gn = 1;
    MR_ASSERT_OK(mr_ckpt_read_blob(r, "state/data_iter/0", &gblob, &gn));
    assert_int_equal(gn, nblob);
    assert_memory_equal(gblob, blob, nblob);
    free(gblob);
    MR_ASSERT_OK(mr_ckpt_read_blob(r, "state/data_iter/1", &gblob, &gn));
    assert_int_equal(gn, 0);
    assert_non_null(gblob);
    free(gblob);

    /* conversions: f32 -> f64 (blockwise, crc checked), f64 -> f32 (C cast), integer widening */
    double *w64 = malloc(sizeof(double) * 7840);
    MR_ASSERT_OK(mr_ckpt_read(r, "params/fc1.weight", MR_F64, &(mr_shape){2, {10, 784}}, w64));
    for (int i = 0; i < 7840; i++) assert_true(w64[i] == (double)w1[i]);
    free(w64);
    float x32[21];
    MR_ASSERT_OK(mr_ckpt_read(r, "params/f64/x", MR_F32, &(mr_shape){2, {7, 3}}, x32));
    for (int i = 0; i < 21; i++) assert_memory_equal(&x32[i], &(float){(float)x64[i]}, sizeof(float));
    int64_t w32[100], wu[256];
    MR_ASSERT_OK(mr_ckpt_read(r, "data/i32", MR_I64, &(mr_shape){1, {100}}, w32));
    for (int i = 0; i < 100; i++) assert_int_equal(w32[i], i32[i]);
    MR_ASSERT_OK(mr_ckpt_read(r, "data/u8", MR_I64, &(mr_shape){2, {16, 16}}, wu));
    for (int i = 0; i < 256; i++) assert_int_equal(wu[i], i);

    /* info, has */
    mr_dtype dt;
    mr_shape s;
    MR_ASSERT_OK(mr_ckpt_info(r, "params/fc1.weight", &dt, &s));
    assert_int_equal(dt, MR_F32);
    assert_true(mr_shape_eq(&s, &(mr_shape){2, {10, 784}}));
    MR_ASSERT_OK(mr_ckpt_info(r, "data/i64", &dt, &s));
    assert_int_equal(dt, MR_I64);
    assert_true(mr_shape_eq(&s, &(mr_shape){2, {2, 3}}));
    MR_ASSERT_OK(mr_ckpt_info(r, "data/u8", &dt, &s));
    assert_int_equal(dt, MR_U8);
    MR_ASSERT_OK(mr_ckpt_info(r, "data/i32", &dt, &s));
    assert_int_equal(dt, MR_I32);
    MR_ASSERT_OK(mr_ckpt_info(r, "stats/scalar", &dt, &s));
    assert_int_equal(dt, MR_F64);
    assert_int_equal(s.ndim, 0);
    MR_ASSERT_OK(mr_ckpt_info(r, "state/data_iter/0", &dt, &s));
    assert_int_equal(dt, MR_U8);
    assert_true(mr_shape_eq(&s, &(mr_shape){1, {(int64_t)nblob}}));
    assert_true(mr_ckpt_has(r, "params/fc1.weight"));
    assert_true(mr_ckpt_has(r, "/optimizer/fc1.weight/exp_avg"));
    assert_false(mr_ckpt_has(r, "params"));
    assert_false(mr_ckpt_has(r, "params/fc2.weight"));
    assert_false(mr_ckpt_has(r, "nope/a/b"));
    assert_false(mr_ckpt_has(r, "params/fc1.weight/x"));

    /* lists, sorted */
    char **names = NULL;
    int n = 0;
    MR_ASSERT_OK(mr_ckpt_list(r, "params", &names, &n));
    const char *want[] = {"blocks/0/attn.qkv.weight", "empty", "f64/x", "fc1.bias", "fc1.weight"};
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++) assert_string_equal(names[i], want[i]);
    mr_ckpt_names_free(names, n);
    MR_ASSERT_OK(mr_ckpt_list(r, "optimizer/fc1.weight", &names, &n));
    assert_int_equal(n, 1);
    assert_string_equal(names[0], "exp_avg");
    mr_ckpt_names_free(names, n);
    MR_ASSERT_OK(mr_ckpt_list(r, "/", &names, &n));
    assert_int_equal(n, 12);
    for (int i = 1; i < n; i++) assert_true(strcmp(names[i - 1], names[i]) < 0);
    assert_string_equal(names[0], "data/i32");
    mr_ckpt_names_free(names, n);
    MR_ASSERT_OK(mr_ckpt_attr_names(r, &names, &n));
    const char *wa[] = {"empty", "format", "format_version", "loss_scale", "lr", "min", "name", "step", "yaml"};
    assert_int_equal(n, 9);
    for (int i = 0; i < n; i++) assert_string_equal(names[i], wa[i]);
    mr_ckpt_names_free(names, n);

    /* attributes */
    char *str = NULL;
    MR_ASSERT_OK(mr_ckpt_attr_str(r, "yaml", &str));
    assert_string_equal(str, yaml);
    free(str);
    MR_ASSERT_OK(mr_ckpt_attr_str(r, "name", &str));
    assert_string_equal(str, utf8);
    free(str);
    MR_ASSERT_OK(mr_ckpt_attr_str(r, "empty", &str));
    assert_string_equal(str, "");
    free(str);
    MR_ASSERT_OK(mr_ckpt_attr_str(r, "format", &str));
    assert_string_equal(str, MR_CKPT_FORMAT);
    free(str);
    int64_t iv = 0;
    double fv = 0;
    MR_ASSERT_OK(mr_ckpt_attr_i64(r, "step", &iv));
    assert_int_equal(iv, 500);
    MR_ASSERT_OK(mr_ckpt_attr_i64(r, "min", &iv));
    assert_true(iv == INT64_MIN);
    MR_ASSERT_OK(mr_ckpt_attr_i64(r, "format_version", &iv));
    assert_int_equal(iv, 1);
    MR_ASSERT_OK(mr_ckpt_attr_f64(r, "lr", &fv));
    assert_true(fv == 3e-4);
    MR_ASSERT_OK(mr_ckpt_attr_f64(r, "loss_scale", &fv));
    assert_true(fv == 32768.0);
    MR_ASSERT_OK(mr_ckpt_attr_f64(r, "step", &fv)); /* an integer reads as a float too */
    assert_true(fv == 500.0);
    expect_err(mr_ckpt_attr_i64(r, "yaml", &iv), MR_ERR_INVALID, "'yaml'", "integer");
    expect_err(mr_ckpt_attr_str(r, "step", &str), MR_ERR_INVALID, "'step'", "string");
    expect_err(mr_ckpt_attr_str(r, "epoch", &str), MR_ERR_NOT_FOUND, "'epoch'", "rt2.h5");
    mr_ckpt_close(r);
    mr_ckpt_close(NULL);
    mr_ckpt_writer_free(NULL);
    mr_ckpt_names_free(NULL, 0);
    free(blob);
    free(yaml);
}

/* ---- errors ---------------------------------------------------------------------------------- */

static void test_errors(void **state) {
    (void)state;
    float a[10 * 784] = {0};
    int32_t k[4] = {1, 2, 3, 4};
    mr_ckpt_writer *w = NULL;
    MR_ASSERT_OK(mr_ckpt_writer_new(&w));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "params/fc1.weight", MR_F32, &(mr_shape){2, {10, 784}}, a));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "params/k", MR_I32, &(mr_shape){1, {4}}, k));
    MR_ASSERT_OK(mr_ckpt_writer_attr_i64(w, "step", 1));
    /* writer input errors leave the writer as it was */
    expect_err(mr_ckpt_writer_add(w, "params/fc1.weight", MR_F32, &(mr_shape){1, {4}}, a), MR_ERR_INVALID,
               "duplicate", "params/fc1.weight");
    expect_err(mr_ckpt_writer_add(w, "/params/k", MR_I32, &(mr_shape){1, {4}}, k), MR_ERR_INVALID, "duplicate",
               "params/k");
    expect_err(mr_ckpt_writer_add(w, "params/k/sub", MR_I32, &(mr_shape){1, {4}}, k), MR_ERR_INVALID, "params/k/sub",
               "group");
    expect_err(mr_ckpt_writer_add(w, "params", MR_I32, &(mr_shape){1, {4}}, k), MR_ERR_INVALID, "'params'", "group");
    const char *bad[] = {"", "/", "a//b", "a/", "./a", "a/../b", "a/."};
    for (int i = 0; i < 7; i++)
        expect_err(mr_ckpt_writer_add(w, bad[i], MR_I32, &(mr_shape){1, {4}}, k), MR_ERR_INVALID, "path", NULL);
    expect_err(mr_ckpt_writer_add(w, "h", MR_F16, &(mr_shape){1, {4}}, k), MR_ERR_INVALID, "'h'", "f16");
    expect_err(mr_ckpt_writer_add(w, "nul", MR_F32, &(mr_shape){1, {4}}, NULL), MR_ERR_INVALID, "'nul'", "NULL");
    expect_err(mr_ckpt_writer_attr_str(w, "format", "x"), MR_ERR_INVALID, "'format'", "reserved");
    expect_err(mr_ckpt_writer_attr_i64(w, "format_version", 2), MR_ERR_INVALID, "'format_version'", "reserved");
    expect_err(mr_ckpt_writer_attr_f64(w, "step", 1.0), MR_ERR_INVALID, "duplicate", "'step'");
    expect_err(mr_ckpt_writer_new(NULL), MR_ERR_INVALID, NULL, NULL);
    /* a write into a missing directory fails with the path and the reason, and leaves nothing */
    expect_err(mr_ckpt_writer_write(w, tpath("nodir/x.h5")), MR_ERR_IO, "nodir/x.h5", "No such file or directory");
    if (geteuid() != 0) { /* root ignores permissions */
        mkdir(tpath("ro"), 0500);
        expect_err(mr_ckpt_writer_write(w, tpath("ro/x.h5")), MR_ERR_IO, "ro/x.h5", "Permission denied");
    }
    MR_ASSERT_OK(mr_ckpt_writer_write(w, tpath("err.h5")));
    mr_ckpt_writer_free(w);

    mr_ckpt_reader *r = NULL;
    expect_err(mr_ckpt_open(tpath("missing.h5"), 0, &r), MR_ERR_NOT_FOUND, "missing.h5", NULL);
    assert_null(r);
    expect_err(mr_ckpt_open(tpath("err.h5"), 7, &r), MR_ERR_INVALID, "flags", NULL);
    MR_ASSERT_OK(mr_ckpt_open(tpath("err.h5"), 0, &r));
    float dst[10 * 785];
    expect_err(mr_ckpt_read(r, "params/fc1.weight", MR_F32, &(mr_shape){2, {10, 785}}, dst), MR_ERR_INVALID,
               "'params/fc1.weight': shape (10,784) in the file, (10,785) expected", "err.h5");
    expect_err(mr_ckpt_read(r, "params/fc1.weight", MR_F32, &(mr_shape){1, {7840}}, dst), MR_ERR_INVALID,
               "(7840,) expected", NULL);
    expect_err(mr_ckpt_read(r, "params/fc2.weight", MR_F32, &(mr_shape){2, {10, 784}}, dst), MR_ERR_NOT_FOUND,
               "'params/fc2.weight'", "err.h5");
    expect_err(mr_ckpt_read(r, "optimizer/fc1.weight/exp_avg", MR_F32, &(mr_shape){2, {10, 784}}, dst),
               MR_ERR_NOT_FOUND, "'optimizer/fc1.weight/exp_avg'", NULL);
    expect_err(mr_ckpt_read(r, "params", MR_F32, &(mr_shape){2, {10, 784}}, dst), MR_ERR_NOT_FOUND, "'params'", NULL);
    mr_dtype dt;
    mr_shape s;
    expect_err(mr_ckpt_info(r, "params/nope", &dt, &s), MR_ERR_NOT_FOUND, "'params/nope'", NULL);
    expect_err(mr_ckpt_read(r, "params/k", MR_F32, &(mr_shape){1, {4}}, dst), MR_ERR_INVALID, "'params/k'", "i32");
    expect_err(mr_ckpt_read(r, "params/fc1.weight", MR_I32, &(mr_shape){2, {10, 784}}, dst), MR_ERR_INVALID, "f32",
               "i32");
    void *b = NULL;
    size_t bn = 0;
    expect_err(mr_ckpt_read_blob(r, "params/k", &b, &bn), MR_ERR_INVALID, "'params/k'", "blob");
    char **names = NULL;
    int n = 0;
    expect_err(mr_ckpt_list(r, "optimizer", &names, &n), MR_ERR_NOT_FOUND, "'optimizer'", NULL);
    expect_err(mr_ckpt_list(r, "params/k", &names, &n), MR_ERR_INVALID, "'params/k'", "not a group");
    assert_null(names);
    mr_ckpt_close(r);
}

/* ---- damaged files --------------------------------------------------------------------------- */

/* A small checkpoint with a recognisable i32 marker dataset (0x1BAD0000 + i) at `name`. */
static void write_marked(const char *path, int64_t step, const char *name) {
    static int32_t marker[4096];
    static float f[50000];
    for (int i = 0; i < 4096; i++) marker[i] = 0x1BAD0000 + i;
    for (int i = 0; i < 50000; i++) f[i] = (float)i * 0.5f + (float)step;
    mr_ckpt_writer *w = NULL;
    MR_ASSERT_OK(mr_ckpt_writer_new(&w));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, name, MR_I32, &(mr_shape){1, {4096}}, marker));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "params/f", MR_F32, &(mr_shape){2, {500, 100}}, f));
    MR_ASSERT_OK(mr_ckpt_writer_attr_i64(w, "step", step));
    MR_ASSERT_OK(mr_ckpt_writer_write(w, path));
    mr_ckpt_writer_free(w);
}

static void flip_marker(const char *path) {
    int32_t pat[4];
    for (int i = 0; i < 4; i++) pat[i] = 0x1BAD0000 + 2000 + i;
    flip_pattern(path, pat, sizeof pat);
}

static void test_corrupt_checksum(void **state) {
    (void)state;
    const char *p = tpath("corrupt.h5");
    write_marked(p, 7, "params/marker");
    MR_ASSERT_OK(mr_ckpt_verify(p));
    flip_marker(p);
    expect_err(mr_ckpt_verify(p), MR_ERR_FORMAT, "checksum mismatch", "params/marker");
    mr_ckpt_reader *r = NULL;
    MR_ASSERT_OK(mr_ckpt_open(p, 0, &r)); /* the metadata is intact */
    static int32_t got[4096];
    static float f[50000];
    MR_ASSERT_OK(mr_ckpt_read(r, "params/f", MR_F32, &(mr_shape){2, {500, 100}}, f));
    expect_err(mr_ckpt_read(r, "params/marker", MR_I32, &(mr_shape){1, {4096}}, got), MR_ERR_FORMAT,
               "'params/marker': checksum mismatch (stored 0x", "corrupt.h5");
    static int64_t wide[4096]; /* the converting path checks the stored bytes too */
    expect_err(mr_ckpt_read(r, "params/marker", MR_I64, &(mr_shape){1, {4096}}, wide), MR_ERR_FORMAT,
               "checksum mismatch", NULL);
    mr_ckpt_close(r);
}

static void test_truncated_foreign(void **state) {
    (void)state;
    tbuf pb = tp("whole.h5"), cb = tp("cut.h5"), eb = tp("stderr.txt"), jb = tp("junk.h5");
    const char *p = pb.s, *cut = cb.s, *err = eb.s, *jp = jb.s;
    write_marked(p, 1, "params/marker");
    size_t len;
    unsigned char *b = slurp(p, &len);
    size_t cuts[] = {0, 8, 100, 1000, 4096, len / 4, len / 2, len - 4096, len - 8, len - 1};
    stderr_begin(err);
    for (int i = 0; i < 10; i++) {
        spit(cut, b, cuts[i]);
        mr_ckpt_reader *r = NULL;
        mr_status st = mr_ckpt_open(cut, 0, &r);
        if (st != MR_ERR_FORMAT || !strstr(mr_last_error(), "cut.h5")) {
            char *e = stderr_end(err);
            fail_msg("cut at %zu of %zu: %s (%s)", cuts[i], len, mr_status_name(st), mr_last_error());
            free(e);
        }
        assert_null(r);
        assert_int_equal(mr_ckpt_verify(cut), MR_ERR_FORMAT);
        assert_int_equal(mr_ckpt_open(cut, MR_CKPT_FOREIGN, &r), MR_ERR_FORMAT);
    }
    spit(cut, "this is not an HDF5 file\n", 25);
    mr_ckpt_reader *r = NULL;
    mr_status st = mr_ckpt_open(cut, 0, &r);
    char msg1[1024];
    snprintf(msg1, sizeof msg1, "%s", mr_last_error());
    /* random bytes after a valid HDF5 signature */
    unsigned char junk[8192];
    memcpy(junk, b, 8);
    for (int i = 8; i < 8192; i++) junk[i] = (unsigned char)(i * 7919 >> 3);
    spit(jp, junk, sizeof junk);
    mr_status st2 = mr_ckpt_open(jp, MR_CKPT_FOREIGN, &r);
    char *e = stderr_end(err);
    assert_string_equal(e, ""); /* no HDF5 error stack dumped */
    free(e);
    expect_err(st2, MR_ERR_FORMAT, "junk.h5", NULL);
    assert_int_equal(st, MR_ERR_FORMAT);
    if (!strstr(msg1, "cut.h5") || !strstr(msg1, "not an HDF5 file")) fail_msg("message '%s'", msg1);
    free(b);

    /* h5py-like files: no format attribute; f64 saved by a user; a newer format_version */
    tbuf fb = tp("foreign.h5"), vb = tp("v2.h5");
    const char *fp = fb.s, *vp = vb.s;
    double wv[12];
    float bv[4] = {1, 2, 3, 4};
    for (int i = 0; i < 12; i++) wv[i] = 0.1 * i - 0.35;
    hid_t f = H5Fcreate(fp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t g = H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t d2[2] = {3, 4}, d1[1] = {4};
    hid_t s2 = H5Screate_simple(2, d2, NULL), s1 = H5Screate_simple(1, d1, NULL);
    hid_t dw = H5Dcreate2(g, "w", H5T_IEEE_F64LE, s2, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t db = H5Dcreate2(g, "b", H5T_IEEE_F32BE, s1, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Dwrite(dw, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, wv) >= 0);
    assert_true(H5Dwrite(db, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, bv) >= 0);
    H5Dclose(dw); H5Dclose(db); H5Sclose(s2); H5Sclose(s1); H5Gclose(g); H5Fclose(f);
    expect_err(mr_ckpt_open(fp, 0, &r), MR_ERR_FORMAT, "foreign.h5", "not a mirror checkpoint");
    expect_err(mr_ckpt_verify(fp), MR_ERR_FORMAT, "not a mirror checkpoint", NULL);
    MR_ASSERT_OK(mr_ckpt_open(fp, MR_CKPT_FOREIGN, &r));
    char **names = NULL;
    int n = 0;
    MR_ASSERT_OK(mr_ckpt_list(r, "params", &names, &n));
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "b");
    assert_string_equal(names[1], "w");
    mr_ckpt_names_free(names, n);
    float w32[12], b32[4];
    MR_ASSERT_OK(mr_ckpt_read(r, "params/w", MR_F32, &(mr_shape){2, {3, 4}}, w32));
    for (int i = 0; i < 12; i++) assert_true(w32[i] == (float)wv[i]);
    MR_ASSERT_OK(mr_ckpt_read(r, "params/b", MR_F32, &(mr_shape){1, {4}}, b32)); /* big-endian in the file */
    assert_memory_equal(b32, bv, sizeof bv);
    mr_ckpt_close(r);

    hid_t v = H5Fcreate(vp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t st_t = H5Tcopy(H5T_C_S1), sc = H5Screate(H5S_SCALAR);
    H5Tset_size(st_t, H5T_VARIABLE);
    const char *fmt = MR_CKPT_FORMAT;
    int64_t ver = 2;
    hid_t a1 = H5Acreate2(v, "format", st_t, sc, H5P_DEFAULT, H5P_DEFAULT);
    hid_t a2 = H5Acreate2(v, "format_version", H5T_STD_I64LE, sc, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Awrite(a1, st_t, &fmt) >= 0 && H5Awrite(a2, H5T_NATIVE_INT64, &ver) >= 0);
    H5Aclose(a1); H5Aclose(a2); H5Sclose(sc); H5Tclose(st_t); H5Fclose(v);
    expect_err(mr_ckpt_open(vp, 0, &r), MR_ERR_FORMAT, "v2.h5", "format_version 2");
}

/* ---- failing writes -------------------------------------------------------------------------- */

/* In a child limited to `limit` bytes per file (EFBIG, as a full disk gives ENOSPC), overwrites
 * path with a ~4 MB checkpoint. Exit 0: failed with MR_ERR_IO naming path and "File too large". */
static int write_limited(const char *path, rlim_t limit) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {limit, limit};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(9);
        static float big[1 << 20];
        for (int i = 0; i < (1 << 20); i++) big[i] = (float)i;
        mr_ckpt_writer *w = NULL;
        if (mr_ckpt_writer_new(&w) != MR_OK) _exit(8);
        if (mr_ckpt_writer_add(w, "params/big", MR_F32, &(mr_shape){1, {1 << 20}}, big) != MR_OK) _exit(8);
        if (mr_ckpt_writer_attr_i64(w, "step", 2) != MR_OK) _exit(8);
        mr_status st = mr_ckpt_writer_write(w, path);
        if (st == MR_OK) _exit(2);
        fprintf(stderr, "  limit %llu: %s\n", (unsigned long long)limit, mr_last_error());
        if (st != MR_ERR_IO) _exit(3);
        if (!strstr(mr_last_error(), path) || !strstr(mr_last_error(), "File too large")) _exit(4);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

static void test_full_disk(void **state) {
    (void)state;
    tbuf db = tp("full"), pb = tp("full/ckpt.h5"), qb = tp("full/probe.h5");
    const char *dir = db.s, *p = pb.s, *probe = qb.s;
    mkdir(dir, 0700);
    write_marked(p, 1, "params/marker");
    size_t len0;
    unsigned char *before = slurp(p, &len0);
    /* the size of the new file, so that one limit cuts its very last write */
    static float big[1 << 20];
    mr_ckpt_writer *w = NULL;
    MR_ASSERT_OK(mr_ckpt_writer_new(&w));
    MR_ASSERT_OK(mr_ckpt_writer_add(w, "params/big", MR_F32, &(mr_shape){1, {1 << 20}}, big));
    MR_ASSERT_OK(mr_ckpt_writer_attr_i64(w, "step", 2));
    MR_ASSERT_OK(mr_ckpt_writer_write(w, probe));
    mr_ckpt_writer_free(w);
    size_t full;
    free(slurp(probe, &full));
    unlink(probe);
    rlim_t limits[] = {1024, 64 * 1024, (rlim_t)full / 2, (rlim_t)full - 1};
    for (int i = 0; i < 4; i++) {
        int code = write_limited(p, limits[i]);
        if (code != 0)
            fail_msg("limit %llu of %zu: child exit %d (2: write succeeded, 3: wrong status, 4: message lacks path "
                     "or reason, >100: signal)", (unsigned long long)limits[i], full, code);
        MR_ASSERT_OK(mr_ckpt_verify(p));
        size_t len1;
        unsigned char *after = slurp(p, &len1);
        assert_int_equal(len1, len0);
        assert_memory_equal(after, before, len0);
        free(after);
        assert_int_equal(count_named(dir, ".tmp."), 0);
    }
    mr_ckpt_reader *r = NULL;
    int64_t step = 0;
    MR_ASSERT_OK(mr_ckpt_open(p, 0, &r));
    MR_ASSERT_OK(mr_ckpt_attr_i64(r, "step", &step));
    assert_int_equal(step, 1);
    mr_ckpt_close(r);
    free(before);
}

/* ---- kill -9 during writes ------------------------------------------------------------------- */

enum { K_W = 512 * 1024, K_IDS = 128 * 1024, K_BLOB = 100 * 1024 };

static void kill_child(const char *dir, int64_t first, int fd) {
    float *wv = malloc(sizeof(float) * K_W);
    int64_t *ids = malloc(sizeof(int64_t) * K_IDS);
    unsigned char *blob = malloc(K_BLOB);
    for (int64_t step = first;; step++) {
        for (int i = 0; i < K_W; i++) wv[i] = (float)((step * 131 + i) % 100003);
        for (int i = 0; i < K_IDS; i++) ids[i] = step * 1000000 + i;
        memset(blob, (int)(step & 0xff), K_BLOB);
        mr_ckpt_writer *w = NULL;
        char p[512];
        mr_ckpt_path(dir, step, p, sizeof p);
        if (mr_ckpt_writer_new(&w) != MR_OK) _exit(11);
        if (mr_ckpt_writer_add(w, "params/w", MR_F32, &(mr_shape){1, {K_W}}, wv) != MR_OK ||
            mr_ckpt_writer_add(w, "params/ids", MR_I64, &(mr_shape){2, {K_IDS / 64, 64}}, ids) != MR_OK ||
            mr_ckpt_writer_add_blob(w, "state/data_iter/0", blob, K_BLOB) != MR_OK ||
            mr_ckpt_writer_attr_i64(w, "step", step) != MR_OK)
            _exit(12);
        if (mr_ckpt_writer_write(w, p) != MR_OK) {
            fprintf(stderr, "child: %s\n", mr_last_error());
            _exit(13);
        }
        mr_ckpt_writer_free(w);
        if (write(fd, &step, sizeof step) != sizeof step) _exit(14);
        if (mr_ckpt_prune(dir, 2) != MR_OK) _exit(15);
    }
}

/* Asserts the checkpoint at path holds what kill_child wrote for `step`. */
static void check_kill_ckpt(const char *path, int64_t step) {
    mr_ckpt_reader *r = NULL;
    MR_ASSERT_OK(mr_ckpt_open(path, 0, &r));
    int64_t s = -1;
    MR_ASSERT_OK(mr_ckpt_attr_i64(r, "step", &s));
    assert_int_equal(s, step);
    float *wv = malloc(sizeof(float) * K_W);
    MR_ASSERT_OK(mr_ckpt_read(r, "params/w", MR_F32, &(mr_shape){1, {K_W}}, wv));
    for (int i = 0; i < K_W; i += 997) assert_true(wv[i] == (float)((step * 131 + i) % 100003));
    free(wv);
    mr_ckpt_close(r);
}

static void test_kill9(void **state) {
    (void)state;
    const char *dir = tpath("kill");
    char dbuf[256];
    snprintf(dbuf, sizeof dbuf, "%s", dir);
    dir = dbuf;
    assert_int_equal(mkdir(dir, 0700), 0);
    uint64_t rng = 0x9E3779B97F4A7C15ull; /* xorshift64, fixed seed: the same delays every run */
    int64_t last_done = -1;
    int rounds = 15, tmp_left = 0, completed = 0;
    double t0 = now_s();
    for (int round = 0; round < rounds; round++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        int delay_ms = 3 + (int)(rng % 150);
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            kill_child(dir, (int64_t)round * 1000 + 1, fds[1]);
            _exit(16);
        }
        close(fds[1]);
        usleep((useconds_t)delay_ms * 1000);
        kill(pid, SIGKILL);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
            fail_msg("round %d: the writer was not killed but exited (status 0x%x)", round, status);
        int64_t s;
        while (read(fds[0], &s, sizeof s) == (ssize_t)sizeof s) {
            last_done = s;
            completed++;
        }
        close(fds[0]);
        char path[512];
        int64_t step = -1;
        int found = 0;
        MR_ASSERT_OK(mr_ckpt_latest(dir, path, sizeof path, &step, &found));
        if (last_done >= 0) {
            if (!found) fail_msg("round %d: no checkpoint verifies, but step %lld was completed", round, (long long)last_done);
            assert_true(step >= last_done);
            check_kill_ckpt(path, step);
        }
        tmp_left += count_named(dir, ".tmp.");
        MR_ASSERT_OK(mr_ckpt_prune(dir, 2));
        assert_int_equal(count_named(dir, ".tmp."), 0);
        int64_t *steps = NULL;
        int n = 0;
        MR_ASSERT_OK(mr_ckpt_scan(dir, &steps, &n));
        assert_true(n <= 2);
        if (found) assert_int_equal(steps[n - 1], step);
        free(steps);
    }
    print_message("kill -9: %d writers killed after 3..152 ms, %d checkpoints completed, %d temp files left by "
                  "killed writers and pruned; %.1f s\n", rounds, completed, tmp_left, now_s() - t0);
    assert_true(completed > 0);
}

/* ---- directories ----------------------------------------------------------------------------- */

static void touch(const char *path) { spit(path, "x", 1); }

static void test_dir(void **state) {
    (void)state;
    char dir[256], p[512], q[512];
    snprintf(dir, sizeof dir, "%s", tpath("d"));
    assert_int_equal(mkdir(dir, 0700), 0);
    mr_ckpt_path("a/b", 500, p, sizeof p);
    assert_string_equal(p, "a/b/ckpt-00000500.h5");
    mr_ckpt_path("a/b/", 123456789, p, sizeof p);
    assert_string_equal(p, "a/b/ckpt-123456789.h5");
    /* missing directory */
    int64_t *steps = NULL, step = -1;
    int n = -1, found = -1;
    MR_ASSERT_OK(mr_ckpt_scan(tpath("none"), &steps, &n));
    assert_int_equal(n, 0);
    assert_null(steps);
    MR_ASSERT_OK(mr_ckpt_latest(tpath("none"), p, sizeof p, &step, &found));
    assert_int_equal(found, 0);
    MR_ASSERT_OK(mr_ckpt_prune(tpath("none"), 2));
    MR_ASSERT_OK(mr_ckpt_latest(dir, p, sizeof p, &step, &found));
    assert_int_equal(found, 0);

    for (int64_t s = 100; s <= 300; s += 100) {
        mr_ckpt_path(dir, s, p, sizeof p);
        write_marked(p, s, "params/marker");
    }
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    const char *junk[] = {"ckpt-123.h5", "notes.txt", "ckpt-0000040x.h5", "ckpt-00000500.h5.bak", "ckpt-000000600.h5",
                          "ckpt--0000001.h5", "ckpt-00000700.h5.tmp.0", "xckpt-00000800.h5"};
    for (int i = 0; i < 8; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, junk[i]);
        touch(p);
    }
    snprintf(p, sizeof p, "%s/ckpt-00000400.h5.tmp.%ld", dir, (long)dead);
    touch(p);
    snprintf(q, sizeof q, "%s/ckpt-00000400.h5.tmp.%ld", dir, (long)getpid());
    touch(q);
    MR_ASSERT_OK(mr_ckpt_scan(dir, &steps, &n));
    assert_int_equal(n, 3);
    assert_true(steps[0] == 100 && steps[1] == 200 && steps[2] == 300);
    free(steps);

    /* a damaged newest checkpoint is skipped with a warning naming it */
    mr_ckpt_path(dir, 300, p, sizeof p);
    flip_marker(p);
    mr_log_level lvl = mr_log_get_level();
    mr_log_set_level(MR_LOG_INFO);
    stderr_begin(tpath("warn.txt"));
    mr_status st = mr_ckpt_latest(dir, q, sizeof q, &step, &found);
    char *warn = stderr_end(tpath("warn.txt"));
    MR_ASSERT_OK(st);
    assert_int_equal(found, 1);
    assert_int_equal(step, 200);
    mr_ckpt_path(dir, 200, p, sizeof p);
    assert_string_equal(q, p);
    if (!strstr(warn, "ckpt-00000300.h5") || !strstr(warn, "checksum mismatch")) fail_msg("warning: '%s'", warn);
    free(warn);
    /* and a truncated one after it */
    size_t len;
    unsigned char *b = slurp(p, &len);
    spit(p, b, len / 2);
    free(b);
    stderr_begin(tpath("warn.txt"));
    st = mr_ckpt_latest(dir, q, sizeof q, &step, &found);
    warn = stderr_end(tpath("warn.txt"));
    mr_log_set_level(lvl);
    MR_ASSERT_OK(st);
    assert_int_equal(step, 100);
    if (!strstr(warn, "ckpt-00000300.h5") || !strstr(warn, "ckpt-00000200.h5")) fail_msg("warnings: '%s'", warn);
    free(warn);
    expect_err(mr_ckpt_latest(dir, q, 8, &step, &found), MR_ERR_INVALID, "ckpt-00000300.h5", NULL);

    /* prune: exactly N newest by name; dead writers' temp files go, live ones and others stay */
    expect_err(mr_ckpt_prune(dir, 0), MR_ERR_INVALID, "keep", NULL);
    MR_ASSERT_OK(mr_ckpt_prune(dir, 2));
    MR_ASSERT_OK(mr_ckpt_scan(dir, &steps, &n));
    assert_int_equal(n, 2);
    assert_true(steps[0] == 200 && steps[1] == 300);
    free(steps);
    assert_int_equal(count_named(dir, ".tmp."), 2); /* ours (alive) and the one with pid 0 (not a temp name) */
    snprintf(p, sizeof p, "%s/ckpt-00000400.h5.tmp.%ld", dir, (long)getpid());
    assert_int_equal(access(p, F_OK), 0);
    for (int i = 0; i < 8; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, junk[i]);
        assert_int_equal(access(p, F_OK), 0);
    }
    MR_ASSERT_OK(mr_ckpt_prune(dir, 1));
    MR_ASSERT_OK(mr_ckpt_scan(dir, &steps, &n));
    assert_int_equal(n, 1);
    assert_int_equal(steps[0], 300);
    free(steps);
    MR_ASSERT_OK(mr_ckpt_prune(dir, 5));
    assert_int_equal(count_named(dir, "ckpt-00000300.h5"), 1);
}

/* ---- throughput ------------------------------------------------------------------------------ */

static void test_throughput(void **state) {
    (void)state;
    const int nd = 10;
    const int64_t per = th_quick() ? 512 * 1024 : 2560 * 1024; /* floats per dataset: 10 x 10 MB = 100 MB */
    float *src = malloc(sizeof(float) * (size_t)(per * nd)), *dst = malloc(sizeof(float) * (size_t)(per * nd));
    assert_non_null(src);
    assert_non_null(dst);
    th_fill_uniform_f32(src, per * nd, -1, 1, 42);
    memset(dst, 0, sizeof(float) * (size_t)(per * nd)); /* read into touched memory, as into parameters */
    mr_ckpt_writer *w = NULL;
    MR_ASSERT_OK(mr_ckpt_writer_new(&w));
    for (int i = 0; i < nd; i++) {
        char name[64];
        snprintf(name, sizeof name, "params/layer%d.weight", i);
        MR_ASSERT_OK(mr_ckpt_writer_add(w, name, MR_F32, &(mr_shape){2, {per / 1024, 1024}}, src + per * i));
    }
    MR_ASSERT_OK(mr_ckpt_writer_attr_i64(w, "step", 1));
    const char *p = tpath("big.h5");
    double t0 = now_s();
    MR_ASSERT_OK(mr_ckpt_writer_write(w, p));
    double t1 = now_s();
    mr_ckpt_reader *r = NULL;
    MR_ASSERT_OK(mr_ckpt_open(p, 0, &r));
    for (int i = 0; i < nd; i++) {
        char name[64];
        snprintf(name, sizeof name, "params/layer%d.weight", i);
        MR_ASSERT_OK(mr_ckpt_read(r, name, MR_F32, &(mr_shape){2, {per / 1024, 1024}}, dst + per * i));
    }
    mr_ckpt_close(r);
    double t2 = now_s();
    MR_ASSERT_OK(mr_ckpt_verify(p));
    double t3 = now_s();
    assert_memory_equal(src, dst, sizeof(float) * (size_t)(per * nd));
    double mb = (double)(per * nd) * 4 / 1e6;
    print_message("checkpoint of %.0f MB (10 f32 datasets): write %.3f s = %.0f MB/s (crc32 + HDF5 + fsync + rename); "
                  "read %.3f s = %.0f MB/s; verify %.3f s = %.0f MB/s (reads from the page cache)\n",
                  mb, t1 - t0, mb / (t1 - t0), t2 - t1, mb / (t2 - t1), t3 - t2, mb / (t3 - t2));
    mr_ckpt_writer_free(w);
    free(src);
    free(dst);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_corrupt_checksum), cmocka_unit_test(test_truncated_foreign),
        cmocka_unit_test(test_full_disk),        cmocka_unit_test(test_kill9),
        cmocka_unit_test(test_dir),              cmocka_unit_test(test_throughput),
    };
    return cmocka_run_group_tests(tests, th_tmpdir_setup, th_tmpdir_teardown);
}
