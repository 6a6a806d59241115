/* Replays the fuzz corpora (tests/fuzz/corpus/<target>/, found relative to this file) through the
 * same target bodies the libFuzzer binaries run (tests/fuzz/fuzz_targets.h), so every CTest run,
 * and the ASan + UBSan one in tests/run.sh, checks that no seed or kept fuzzer input crashes,
 * leaks or breaks the error contract. A target body aborts on a contract violation; the input's
 * path is printed before it runs, so the last path printed names the culprit. Inputs known to
 * crash live in tests/fuzz/crashes/ and are not replayed. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tests/fuzz/fuzz_targets.h"

typedef int (*fuzz_fn)(const uint8_t *data, size_t size);

/* tests/fuzz/corpus/<target>, from this file's path (CMake compiles it by absolute path). */
static void corpus_dir(const char *target, char *out, size_t cap) {
    const char *file = __FILE__;
    const char *slash = strrchr(file, '/');
    int n = slash ? (int)(slash - file) : 1;
    snprintf(out, cap, "%.*s/../fuzz/corpus/%s", n, slash ? file : ".", target);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void replay(const char *target, fuzz_fn fn) {
    char dir[1024];
    corpus_dir(target, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open the corpus %s", dir);
    char *names[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096)
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    assert_true(n > 0);
    for (int k = 0; k < n; k++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        FILE *f = fopen(path, "rb");
        if (!f) fail_msg("cannot read %s", path);
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        rewind(f);
        uint8_t *buf = malloc((size_t)size + 1);
        assert_non_null(buf);
        assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
        fclose(f);
        fprintf(stderr, "replay %s: %s\n", target, names[k]);
        fn(buf, (size_t)size);
        free(buf);
        free(names[k]);
    }
    mr_clear_error();
}

static void test_idx(void **state) { (void)state; replay("idx", mr_fuzz_idx); }
static void test_tokens(void **state) { (void)state; replay("tokens", mr_fuzz_tokens); }
static void test_text(void **state) { (void)state; replay("text", mr_fuzz_text); }
static void test_config(void **state) { (void)state; replay("config", mr_fuzz_config); }
static void test_ckpt(void **state) { (void)state; replay("ckpt", mr_fuzz_ckpt); }
static void test_hdf5(void **state) { (void)state; replay("hdf5", mr_fuzz_hdf5); }
static void test_npy(void **state) { (void)state; replay("npy", mr_fuzz_npy); }
static void test_tfrecord(void **state) { (void)state; replay("tfrecord", mr_fuzz_tfrecord); }
static void test_iterstate(void **state) { (void)state; replay("iterstate", mr_fuzz_iterstate); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx), cmocka_unit_test(test_tokens), cmocka_unit_test(test_text),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_ckpt), cmocka_unit_test(test_hdf5), cmocka_unit_test(test_npy),
        cmocka_unit_test(test_tfrecord), cmocka_unit_test(test_iterstate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
