/* Test helpers (see harness.h). */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/math/philox_math.h"

void th_fill_uniform_f64(double *x, int64_t n, double lo, double hi, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (double)mr_u32_to_unit_f32(mr_philox_u32(seed, 0, (uint64_t)i));
}

void th_fill_uniform_f32(float *x, int64_t n, float lo, float hi, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * mr_u32_to_unit_f32(mr_philox_u32(seed, 0, (uint64_t)i));
}

void th_fill_int32(int32_t *x, int64_t n, int32_t lo, int32_t hi, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = lo + (int32_t)(mr_philox_u32(seed, 1, (uint64_t)i) % (uint32_t)(hi - lo));
}

void th_f64_to_f32(const double *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
}

void th_f32_to_f64(const float *x, double *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i];
}

static void **g_bufs;
static size_t g_nbufs, g_cap;

void *th_alloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    assert_non_null(p);
    if (g_nbufs == g_cap) {
        g_cap = g_cap ? g_cap * 2 : 64;
        g_bufs = realloc(g_bufs, g_cap * sizeof *g_bufs);
        assert_non_null(g_bufs);
    }
    g_bufs[g_nbufs++] = p;
    return p;
}

void th_free_all(void) {
    for (size_t i = 0; i < g_nbufs; i++) free(g_bufs[i]);
    free(g_bufs);
    g_bufs = NULL;
    g_nbufs = g_cap = 0;
}

mr_view th_view(mr_dtype dt, mr_shape s) {
    mr_view v;
    v.dtype = dt;
    v.shape = s;
    v.data = th_alloc((size_t)mr_shape_numel(&s) * mr_dtype_size(dt));
    return v;
}

int th_compare(const char *what, const void *x, mr_dtype dt, const double *ref, int64_t n, double atol,
               double rtol, double nmse_max) {
    double se = 0.0, sr = 0.0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = dt == MR_F64 ? ((const double *)x)[i] : (double)((const float *)x)[i];
        double r = ref[i];
        if (isnan(v) && isnan(r)) continue;
        if (isinf(r) && v == r) continue;
        double e = fabs(v - r);
        if (!(e <= atol + rtol * fabs(r))) {
            if (bad < 10)
                fprintf(stderr, "%s: mismatch at [%lld]: value %.9g ref %.9g abs err %.3g rel err %.3g\n", what,
                        (long long)i, v, r, e, e / (fabs(r) > 0 ? fabs(r) : 1.0));
            bad++;
        }
        if (isfinite(e)) {
            se += e * e;
            sr += r * r;
        }
    }
    double nmse = sr > 0 ? se / sr : se;
    if (nmse > nmse_max) {
        fprintf(stderr, "%s: NMSE %.3g exceeds %.3g\n", what, nmse, nmse_max);
        bad++;
    }
    if (bad) fprintf(stderr, "%s: %d of %lld elements out of tolerance (atol %g rtol %g)\n", what, bad,
                     (long long)n, atol, rtol);
    return bad == 0;
}

void th_numeric_grad(double *x, int64_t n, double h, double (*loss)(void *ctx), void *ctx, double *numeric) {
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = loss(ctx);
        x[i] = x0 - h;
        double lm = loss(ctx);
        x[i] = x0;
        numeric[i] = (lp - lm) / (2.0 * h);
    }
}
