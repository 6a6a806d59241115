/* The C test helpers themselves (tests/harness.c): th_compare of a negative count or a missing
 * buffer fails instead of passing vacuously; an empty tensor (n = 0) and NaN against NaN pass by
 * design (the op tests compare empty tensors and means of them); a real mismatch, a NaN against
 * a number and an NMSE over its bound all fail. */
#include <math.h>
#include <stddef.h>

#include "harness.h"

static void test_compare_fails_closed(void **state) {
    (void)state;
    const double ref[4] = {1.0, 2.0, 3.0, 4.0};
    const float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    assert_true(th_compare("equal", x, MR_F32, ref, 4, 0, 0, 0));
    assert_true(th_compare("n = 0: an empty tensor", x, MR_F32, ref, 0, 0, 0, 0));
    assert_false(th_compare("n < 0", x, MR_F32, ref, -1, 1, 1, 1));
    assert_false(th_compare("no values", NULL, MR_F32, ref, 4, 1, 1, 1));
    assert_false(th_compare("no reference", x, MR_F32, NULL, 4, 1, 1, 1));
    const double nan_ref[3] = {NAN, NAN, NAN};
    const float nan_x[3] = {NAN, NAN, NAN};
    assert_true(th_compare("NaN against NaN (a mean of nothing)", nan_x, MR_F32, nan_ref, 3, 0, 0, 0));
    const float num_x[3] = {0.0f, 0.0f, 0.0f};
    assert_false(th_compare("numbers against a NaN reference", num_x, MR_F32, nan_ref, 3, 1, 1, 1));
    const float ninf_x[2] = {INFINITY, INFINITY};
    const double inf_ref[2] = {INFINITY, -INFINITY};
    assert_false(th_compare("+inf against -inf", ninf_x, MR_F32, inf_ref, 2, 1, 1, 1e300));
    /* a NaN where it belongs, among finite values, still passes */
    const double some_nan[3] = {1.0, NAN, 2.0};
    const float some_nan_x[3] = {1.0f, NAN, 2.0f};
    assert_true(th_compare("NaN at the same index", some_nan_x, MR_F32, some_nan, 3, 0, 0, 0));
}

static void test_compare_catches_errors(void **state) {
    (void)state;
    const double ref[3] = {1.0, 2.0, 3.0};
    const float off[3] = {1.0f, 2.5f, 3.0f};
    assert_false(th_compare("mismatch", off, MR_F32, ref, 3, 1e-6, 1e-6, 1));
    const float nan_x[3] = {1.0f, NAN, 3.0f};
    assert_false(th_compare("NaN against a number", nan_x, MR_F32, ref, 3, 1, 1, 1));
    const double x64[3] = {1.0, 2.0, 3.1};
    assert_false(th_compare("NMSE over its bound", x64, MR_F64, ref, 3, 1, 1, 1e-6));
    assert_true(th_compare("within atol", x64, MR_F64, ref, 3, 0.2, 0, 1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compare_fails_closed),
        cmocka_unit_test(test_compare_catches_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
