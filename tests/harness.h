/* Shared test helpers: deterministic random buffers, f32/f64 conversion, comparison with
 * atol/rtol and NMSE (printing index, value, reference, abs and rel error on failure), and
 * central finite differences for gradient checks. Include after cmocka's prerequisites. */
#ifndef MR_TEST_HARNESS_H
#define MR_TEST_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/ops.h"
#include "core/tensor.h"
#include "tolerances.h"

/* Asserts an mr_status is MR_OK, printing mr_last_error() otherwise. */
#define MR_ASSERT_OK(expr)                                                                       \
    do {                                                                                         \
        mr_status st_ = (expr);                                                                  \
        if (st_ != MR_OK) fail_msg("%s -> %s: %s", #expr, mr_status_name(st_), mr_last_error()); \
    } while (0)

/* Deterministic uniform values in [lo, hi) from Philox (seed, stream position). */
void th_fill_uniform_f64(double *x, int64_t n, double lo, double hi, uint64_t seed);
void th_fill_uniform_f32(float *x, int64_t n, float lo, float hi, uint64_t seed);
/* Integers in [lo, hi). */
void th_fill_int32(int32_t *x, int64_t n, int32_t lo, int32_t hi, uint64_t seed);

void th_f64_to_f32(const double *x, float *y, int64_t n);
void th_f32_to_f64(const float *x, double *y, int64_t n);

/* Test-owned buffers (freed with th_free_all at the end of a test; calloc'd, so zeroed). */
void *th_alloc(size_t bytes);
void th_free_all(void);
/* A view with fresh zeroed storage. */
mr_view th_view(mr_dtype dt, mr_shape s);

/* Compares x (f32 or f64, as dt) with the f64 reference; returns 1 when within
 * |x-ref| <= atol + rtol*|ref| everywhere and NMSE <= nmse_max, else prints up to 10 failing
 * elements (index, value, ref, abs err, rel err) and the NMSE, and returns 0. NaN in both at
 * the same index counts as equal. */
int th_compare(const char *what, const void *x, mr_dtype dt, const double *ref, int64_t n, double atol,
               double rtol, double nmse_max);

/* Central finite differences: for each of the n entries of x (perturbed in place and restored),
 * numeric[i] = (loss(x+h) - loss(x-h)) / 2h. loss is called with ctx. */
void th_numeric_grad(double *x, int64_t n, double h, double (*loss)(void *ctx), void *ctx, double *numeric);

#endif
