/* Which GPUs a CUDA build runs (core/cuda_arch.c): the CUDA runtime's rule that a cubin for sm_XY
 * loads on the same major with a minor >= Y, and PTX for compute_XY on any capability >= XY;
 * checked over the default list of cmake/mirror_cuda_archs.cmake and edge cases (no list, a
 * malformed list, a GPU older than the floor, a newer generation than any SASS). Also: the build's
 * own lists are both empty (CPU build) or both set. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "core/device.h"

static void expect(const char *sass, const char *ptx, int cc, mr_cuda_cover want, int want_arch) {
    int arch = -7;
    mr_cuda_cover got = mr_cuda_arch_cover(sass, ptx, cc, &arch);
    if (got != want || arch != want_arch)
        fail_msg("sass '%s' ptx '%s' cc %d: cover %d arch %d, expected %d arch %d", sass ? sass : "(null)",
                 ptx ? ptx : "(null)", cc, got, arch, want, want_arch);
}

static void test_default_list(void **state) {
    (void)state;
    const char *sass = "80,86,89,90,100", *ptx = "100";
    expect(sass, ptx, 80, MR_CUDA_COVER_SASS, 80);  /* A100 */
    expect(sass, ptx, 86, MR_CUDA_COVER_SASS, 86);  /* A10, RTX 3090 */
    expect(sass, ptx, 87, MR_CUDA_COVER_SASS, 86);  /* Jetson Orin: sm_86 code of the same major */
    expect(sass, ptx, 89, MR_CUDA_COVER_SASS, 89);  /* L40S, RTX 4090 */
    expect(sass, ptx, 90, MR_CUDA_COVER_SASS, 90);  /* H100, H200 */
    expect(sass, ptx, 100, MR_CUDA_COVER_SASS, 100); /* B200 */
    expect(sass, ptx, 103, MR_CUDA_COVER_SASS, 100); /* B300: a later minor of the same major */
    expect(sass, ptx, 120, MR_CUDA_COVER_PTX, 100); /* RTX 5090: another major, only the PTX */
    expect(sass, ptx, 75, MR_CUDA_COVER_NONE, -1);  /* T4: below the floor */
    expect(sass, ptx, 70, MR_CUDA_COVER_NONE, -1);  /* V100 */
}

static void test_narrow_lists(void **state) {
    (void)state;
    /* a native build for an H100: nothing else runs it, a later GPU only through PTX 90 */
    expect("90", "90", 90, MR_CUDA_COVER_SASS, 90);
    expect("90", "90", 80, MR_CUDA_COVER_NONE, -1); /* SASS never runs on an older GPU */
    expect("90", "90", 100, MR_CUDA_COVER_PTX, 90);
    expect("90", "", 100, MR_CUDA_COVER_NONE, -1); /* SASS of another major without PTX */
    expect("80", "", 89, MR_CUDA_COVER_SASS, 80);
    expect("80,89", "", 86, MR_CUDA_COVER_SASS, 80); /* the newest SASS the minor reaches */
    expect("", "", 90, MR_CUDA_COVER_NONE, -1);
    expect(NULL, NULL, 90, MR_CUDA_COVER_NONE, -1);
    expect("x,90", "", 90, MR_CUDA_COVER_NONE, -1); /* malformed: covers nothing rather than guess */
    expect(",,90,", "", 90, MR_CUDA_COVER_SASS, 90);
    assert_int_equal(mr_cuda_arch_cover("90", "90", 90, NULL), MR_CUDA_COVER_SASS);
}

/* the probe's reason (core/cuda/backend_cuda.cu): names the GPU, its capability, the lists and the
 * fix, which depends on whether the GPU is above the floor */
static void test_refusal(void **state) {
    (void)state;
    char why[512] = "untouched";
    assert_int_equal(mr_cuda_arch_refusal(why, sizeof why, 0, "H100", 90, "80,86,89,90,100", "100"), 0);
    assert_string_equal(why, "untouched");
    assert_int_equal(mr_cuda_arch_refusal(why, sizeof why, 1, "NVIDIA A100-SXM4-80GB", 80, "90", "90"), 1);
    assert_string_equal(why, "GPU 1 (NVIDIA A100-SXM4-80GB) has compute capability 8.0 but this build has code for "
                             "sm_90 (SASS) and compute_90 (PTX) only; rebuild with -DMIRROR_CUDA_ARCHS=native or add "
                             "80 to the list");
    assert_int_equal(mr_cuda_arch_refusal(why, sizeof why, 0, "Tesla T4", 75, "80,86,89,90,100", "100"), 1);
    assert_non_null(strstr(why, "compute capability 7.5"));
    assert_non_null(strstr(why, "GPUs before sm_80 are not supported"));
    assert_int_equal(mr_cuda_arch_refusal(why, sizeof why, 0, "B200", 100, "90", ""), 1);
    assert_non_null(strstr(why, "compute_- (PTX)"));
    char small[16];
    assert_int_equal(mr_cuda_arch_refusal(small, sizeof small, 0, "B200", 100, "90", ""), 1); /* truncates */
    assert_int_equal(strlen(small), sizeof small - 1);
}

static void test_build_lists(void **state) {
    (void)state;
    const char *sass = mr_cuda_build_sass(), *ptx = mr_cuda_build_ptx();
    assert_non_null(sass);
    assert_non_null(ptx);
    if (!mr_cuda_compiled()) {
        assert_string_equal(sass, "");
        assert_string_equal(ptx, "");
        return;
    }
    assert_true(strlen(sass) > 0 || strlen(ptx) > 0);
    /* every listed architecture is at least the floor */
    for (const char *s = sass; *s;) {
        int v = atoi(s);
        assert_true(v >= 80);
        s = strchr(s, ',');
        if (!s) break;
        s++;
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_list),
        cmocka_unit_test(test_narrow_lists),
        cmocka_unit_test(test_refusal),
        cmocka_unit_test(test_build_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
