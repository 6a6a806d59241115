/* Softmax, log-softmax (last axis) and fused softmax cross-entropy, forward and backward: the CPU
 * f32 kernels against the f64 reference (odd, size-1, size-0, wide and threaded shapes, huge
 * logits); the CPU f64 path equal to the reference; ignore_index rows; gradients by central
 * finite differences; the half views of mixed precision (bf16/f16 probabilities and gradients)
 * bit for bit the f32 kernels followed or preceded by CAST; label, shape and dtype errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static const mr_shape *sm_shapes(size_t *n) {
    static mr_shape s[9];
    size_t k = 0;
    s[k++] = th_shp(2, 1, 1, 0, 0);
    s[k++] = th_shp(2, 7, 13, 0, 0);
    s[k++] = th_shp(3, 3, 4, 5, 0);
    s[k++] = th_shp(1, 9, 0, 0, 0);
    s[k++] = th_shp(0, 0, 0, 0, 0);
    s[k++] = th_shp(2, 0, 5, 0, 0);
    s[k++] = th_shp(2, 5, 0, 0, 0);
    s[k++] = th_shp(2, 64, 1000, 0, 0); /* threaded */
    s[k++] = th_shp(2, 3, 4096, 0, 0);  /* wide rows */
    *n = k;
    return s;
}

static void test_softmax_fwd(void **state) {
    (void)state;
    size_t ns;
    const mr_shape *s = sm_shapes(&ns);
    for (mr_op_id op = MR_OP_SOFTMAX; op <= MR_OP_LOG_SOFTMAX; op++) {
        for (size_t i = 0; i < ns; i++) {
            mr_op_args a;
            mr_op_args_init(&a, op);
            a.in[0] = th_rand_view(MR_F64, s[i], -8, 8, 10 + i);
            a.out[0] = th_view(MR_F64, s[i]);
            char what[64];
            snprintf(what, sizeof what, "%s shape %zu", mr_op_get(op)->name, i);
            th_check_cpu_vs_ref(what, &a, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            th_free_all();
        }
        /* huge logits: subtracting the row max keeps everything finite */
        mr_op_args a;
        mr_op_args_init(&a, op);
        const double x[8] = {1000, 999, -1000, 0, -1e4, 3e4, 3e4 - 1, 2e4};
        a.in[0] = th_view(MR_F64, mr_shape_2d(2, 4));
        memcpy(a.in[0].data, x, sizeof x);
        a.out[0] = th_view(MR_F64, mr_shape_2d(2, 4));
        th_check_cpu_vs_ref("huge logits", &a, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        MR_ASSERT_OK(mr_op_run_ref(&a));
        const double *y = a.out[0].data;
        if (op == MR_OP_SOFTMAX) {
            assert_true(fabs(y[0] + y[1] + y[2] + y[3] - 1.0) < 1e-12);
            assert_true(y[2] == 0.0);
        } else {
            assert_true(isfinite(y[2]) && y[2] < -1999.0);
        }
        th_free_all();
    }
    print_message("softmax fwd: max f32 abs err %.3g, rel err %.3g\n", th_max_abs_err, th_max_rel_err);
}

/* Causal softmax equals the softmax of x plus a -inf mask above the (shifted) diagonal, on the
 * reference and on the CPU; T < S shifts the diagonal; LOG_SOFTMAX refuses the flag. */
static void test_softmax_causal(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{3, 5, 5}, {2, 4, 7}, {1, 1, 1}, {4, 33, 33}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        int64_t B = shapes[k][0], T = shapes[k][1], S = shapes[k][2], n = B * T * S;
        mr_shape sh = mr_shape_3d(B, T, S);
        mr_op_args c;
        mr_op_args_init(&c, MR_OP_SOFTMAX);
        c.p.softmax.causal = 1;
        c.in[0] = th_rand_view(MR_F64, sh, -3, 3, 70 + k);
        c.out[0] = th_view(MR_F64, sh);
        mr_op_args m = c;
        m.p.softmax.causal = 0;
        m.in[0] = th_view(MR_F64, sh);
        m.out[0] = th_view(MR_F64, sh);
        const double *x = c.in[0].data;
        double *xm = m.in[0].data;
        for (int64_t i = 0; i < n; i++) {
            int64_t row = (i / S) % T, col = i % S;
            xm[i] = col > row + (S - T) ? -INFINITY : x[i];
        }
        MR_ASSERT_OK(mr_op_run_ref(&c));
        MR_ASSERT_OK(mr_op_run_ref(&m));
        char what[64];
        snprintf(what, sizeof what, "causal softmax %zu (ref vs masked)", k);
        assert_true(th_compare(what, c.out[0].data, MR_F64, m.out[0].data, n, 1e-15, 1e-14, 1e-28));
        snprintf(what, sizeof what, "causal softmax %zu", k);
        (void)th_check_cpu_vs_ref(what, &c, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
        th_free_all();
    }
    mr_op_args l;
    mr_op_args_init(&l, MR_OP_LOG_SOFTMAX);
    l.p.softmax.causal = 1;
    l.in[0] = th_view(MR_F32, mr_shape_2d(3, 3));
    l.out[0] = th_view(MR_F32, mr_shape_2d(3, 3));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &l), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "causal"));
    mr_op_args_init(&l, MR_OP_SOFTMAX);
    l.p.softmax.causal = 1;
    l.in[0] = th_view(MR_F32, mr_shape_2d(4, 3)); /* T > S */
    l.out[0] = th_view(MR_F32, mr_shape_2d(4, 3));
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, &l), MR_ERR_INVALID);
    th_free_all();
}

/* CAST of v (f32 -> dt or dt -> f32) into a fresh view. */
static mr_view cast_to(mr_view v, mr_dtype dt) {
    mr_op_args c;
    mr_op_args_init(&c, MR_OP_CAST);
    c.in[0] = v;
    c.out[0] = th_view(dt, v.shape);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &c));
    return c.out[0];
}

/* Half probabilities (SOFTMAX of an f32 x into bf16/f16, causal or not) are the f32 softmax then
 * CAST, bit for bit; SOFTMAX_BWD with a half y is within tolerance of the reference on y widened,
 * and a half dx is the same kernel's f32 dx then CAST, bit for bit; each thread-count invariant. */
static void test_softmax_half(void **state) {
    (void)state;
    const mr_dtype halves[2] = {MR_BF16, MR_F16};
    const mr_shape shapes[4] = {mr_shape_3d(2, 7, 7), mr_shape_3d(3, 33, 40), mr_shape_2d(64, 1000),
                                mr_shape_4d(2, 4, 128, 128)};
    for (int h = 0; h < 2; h++)
        for (int si = 0; si < 4; si++)
            for (int causal = 0; causal < 2; causal++) {
                const mr_shape sh = shapes[si];
                mr_op_args f;
                mr_op_args_init(&f, MR_OP_SOFTMAX);
                f.p.softmax.causal = causal;
                f.in[0] = th_rand_view(MR_F32, sh, -6, 6, 90 + si);
                f.out[0] = th_view(MR_F32, sh);
                MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
                mr_op_args fh = f;
                fh.out[0] = th_view(halves[h], sh);
                MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &fh));
                const mr_view want = cast_to(f.out[0], halves[h]);
                if (memcmp(want.data, fh.out[0].data, th_view_bytes(&want)))
                    fail_msg("%s softmax shape %d causal %d: not the f32 softmax then CAST", mr_dtype_name(halves[h]),
                             si, causal);
                th_check_thread_invariant(&fh);
                /* backward on a half or an f32 y: an f32 dx within tolerance of the reference on the
                 * same (widened) values, and a half dx that dx then CAST, bit for bit */
                const mr_view dy = th_rand_view(MR_F32, sh, -1, 1, 95 + si);
                for (int yh = 0; yh < 2; yh++) {
                    mr_op_args b;
                    mr_op_args_init(&b, MR_OP_SOFTMAX_BWD);
                    b.in[0] = yh ? fh.out[0] : f.out[0];
                    b.in[1] = dy;
                    b.out[0] = th_view(MR_F32, sh);
                    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
                    mr_op_args r = b;
                    r.in[0] = yh ? cast_to(fh.out[0], MR_F32) : f.out[0];
                    r = th_widen_args(&r);
                    MR_ASSERT_OK(mr_op_run_ref(&r));
                    char what[96];
                    snprintf(what, sizeof what, "softmax_bwd %s y, shape %d causal %d", yh ? "half" : "f32", si, causal);
                    assert_true(th_compare(what, b.out[0].data, MR_F32, r.out[0].data, mr_shape_numel(&sh),
                                           TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
                    mr_op_args bh = b;
                    bh.out[0] = th_view(halves[h], sh);
                    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &bh));
                    const mr_view w = cast_to(b.out[0], halves[h]);
                    if (memcmp(w.data, bh.out[0].data, th_view_bytes(&w)))
                        fail_msg("%s, dx %s: not the f32 dx then CAST", what, mr_dtype_name(halves[h]));
                    th_check_thread_invariant(&b);
                    th_check_thread_invariant(&bh);
                }
                th_free_all();
            }
    /* every row length up to 40 over many rows: each length splits the row differently between
     * libmvec's vector expf and the scalar one (they differ in the last ulp), and the half rows must
     * split it as the f32 row does; and a row where they differ (a review's reproducer) */
    for (int h = 0; h < 2; h++)
        for (int64_t len = 1; len <= 40; len++) {
            const mr_shape sh = mr_shape_2d(1500, len);
            mr_op_args f;
            mr_op_args_init(&f, MR_OP_SOFTMAX);
            f.in[0] = th_rand_view(MR_F32, sh, -6, 6, 1000 + (uint64_t)len);
            if (len == 8) {
                const float rep[8] = {-0.00295114517f, 4.28066158f, -2.65260315f, -0.0314044952f,
                                      -3.08555102f,    -1.00612831f, 4.85548496f, 5.63380432f};
                memcpy(f.in[0].data, rep, sizeof rep);
            }
            f.out[0] = th_view(MR_F32, sh);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
            mr_op_args fh = f;
            fh.out[0] = th_view(halves[h], sh);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &fh));
            const mr_view want = cast_to(f.out[0], halves[h]);
            if (memcmp(want.data, fh.out[0].data, th_view_bytes(&want)))
                fail_msg("%s softmax of rows of %lld: not the f32 softmax then CAST", mr_dtype_name(halves[h]),
                         (long long)len);
            th_free_all();
        }
    th_free_all();
}

static void test_softmax_bwd(void **state) {
    (void)state;
    size_t ns;
    const mr_shape *s = sm_shapes(&ns);
    th_max_abs_err = th_max_rel_err = 0;
    for (mr_op_id op = MR_OP_SOFTMAX_BWD; op <= MR_OP_LOG_SOFTMAX_BWD; op++) {
        for (size_t i = 0; i < ns; i++) {
            mr_op_args f, a;
            mr_op_args_init(&f, mr_op_get(op)->fwd);
            f.in[0] = th_rand_view(MR_F64, s[i], -4, 4, 20 + i);
            f.out[0] = th_view(MR_F64, s[i]);
            MR_ASSERT_OK(mr_op_run_ref(&f));
            mr_op_args_init(&a, op);
            a.in[0] = f.out[0];
            a.in[1] = th_rand_view(MR_F64, s[i], -1, 1, 30 + i);
            a.out[0] = th_view(MR_F64, s[i]);
            char what[64];
            snprintf(what, sizeof what, "%s shape %zu", mr_op_get(op)->name, i);
            th_check_cpu_vs_ref(what, &a, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            th_free_all();
        }
    }
    print_message("softmax bwd: max f32 abs err %.3g, rel err %.3g\n", th_max_abs_err, th_max_rel_err);
}

static void test_softmax_grad(void **state) {
    (void)state;
    const mr_shape s[] = {th_shp(2, 3, 7, 0, 0), th_shp(1, 5, 0, 0, 0), th_shp(2, 2, 1, 0, 0)};
    for (mr_op_id op = MR_OP_SOFTMAX; op <= MR_OP_LOG_SOFTMAX; op++) {
        for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
            mr_op_args fwd;
            mr_op_args_init(&fwd, op);
            fwd.in[0] = th_rand_view(MR_F64, s[i], -3, 3, 40 + i);
            fwd.out[0] = th_view(MR_F64, s[i]);
            mr_view r = th_rand_view(MR_F64, s[i], -1, 1, 50 + i);
            MR_ASSERT_OK(mr_op_run_ref(&fwd));
            mr_op_args b;
            mr_op_args_init(&b, op + (MR_OP_SOFTMAX_BWD - MR_OP_SOFTMAX));
            b.in[0] = th_view(MR_F64, s[i]); /* a copy: finite differences rewrite the output */
            memcpy(b.in[0].data, fwd.out[0].data, sizeof(double) * (size_t)mr_shape_numel(&s[i]));
            b.in[1] = r;
            b.out[0] = th_view(MR_F64, s[i]);
            MR_ASSERT_OK(mr_op_run_ref(&b));
            char what[64];
            snprintf(what, sizeof what, "%s grad shape %zu", mr_op_get(op)->name, i);
            th_check_grad(what, &fwd, 0, r.data, b.out[0].data, TOL_GRAD_NMSE);
            th_free_all();
        }
    }
}

/* ---- softmax cross-entropy ----------------------------------------------------------------- */

#define IGNORE -100

/* Labels in [0, c), every fifth row ignore_index. */
static mr_view labels(int64_t n, int64_t c, uint64_t seed) {
    mr_view v = th_view(MR_I32, mr_shape_1d(n));
    int32_t *l = v.data;
    th_fill_int32(l, n, 0, (int32_t)c, seed);
    for (int64_t i = 3; i < n; i += 5) l[i] = IGNORE;
    return v;
}

static void test_xent(void **state) {
    (void)state;
    const int64_t nc[][2] = {{1, 1}, {7, 13}, {5, 2}, {0, 4}, {64, 1000}, {4, 5000}};
    th_max_abs_err = th_max_rel_err = 0;
    for (size_t i = 0; i < sizeof nc / sizeof *nc; i++) {
        int64_t n = nc[i][0], c = nc[i][1];
        mr_op_args f;
        mr_op_args_init(&f, MR_OP_SOFTMAX_XENT);
        f.p.xent.ignore_index = IGNORE;
        f.in[0] = th_rand_view(MR_F64, mr_shape_2d(n, c), -6, 6, 60 + i);
        f.in[1] = labels(n, c, 70 + i);
        f.out[0] = th_view(MR_F64, mr_shape_1d(n));
        f.out[1] = th_view(MR_F64, mr_shape_2d(n, c));
        char what[64];
        snprintf(what, sizeof what, "softmax_xent %lldx%lld", (long long)n, (long long)c);
        th_check_cpu_vs_ref(what, &f, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        MR_ASSERT_OK(mr_op_run_ref(&f));
        const int32_t *l = f.in[1].data;
        for (int64_t r = 0; r < n; r++) {
            double loss = ((double *)f.out[0].data)[r];
            assert_true(l[r] == IGNORE ? loss == 0.0 : loss >= 0.0);
        }
        mr_op_args b;
        mr_op_args_init(&b, MR_OP_SOFTMAX_XENT_BWD);
        b.p.xent.ignore_index = IGNORE;
        b.in[0] = f.out[1];
        b.in[1] = f.in[1];
        b.in[2] = th_rand_view(MR_F64, mr_shape_1d(n), -1, 1, 80 + i);
        b.out[0] = th_view(MR_F64, mr_shape_2d(n, c));
        snprintf(what, sizeof what, "softmax_xent_bwd %lldx%lld", (long long)n, (long long)c);
        th_check_cpu_vs_ref(what, &b, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
        MR_ASSERT_OK(mr_op_run_ref(&b));
        for (int64_t r = 0; r < n; r++)
            if (l[r] == IGNORE)
                for (int64_t j = 0; j < c; j++) assert_true(((double *)b.out[0].data)[r * c + j] == 0.0);
        th_free_all();
    }
    /* huge logits stay finite */
    mr_op_args f;
    mr_op_args_init(&f, MR_OP_SOFTMAX_XENT);
    f.p.xent.ignore_index = IGNORE;
    const double x[6] = {1e4, -1e4, 0, 88, 89, -3e4};
    f.in[0] = th_view(MR_F64, mr_shape_2d(2, 3));
    memcpy(f.in[0].data, x, sizeof x);
    f.in[1] = th_view(MR_I32, mr_shape_1d(2));
    ((int32_t *)f.in[1].data)[0] = 1;
    ((int32_t *)f.in[1].data)[1] = 2;
    f.out[0] = th_view(MR_F64, mr_shape_1d(2));
    f.out[1] = th_view(MR_F64, mr_shape_2d(2, 3));
    th_check_cpu_vs_ref("xent huge logits", &f, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
    th_free_all();
    print_message("softmax_xent: max f32 abs err %.3g, rel err %.3g\n", th_max_abs_err, th_max_rel_err);
}

static void test_xent_grad(void **state) {
    (void)state;
    const int64_t n = 6, c = 5;
    mr_op_args fwd;
    mr_op_args_init(&fwd, MR_OP_SOFTMAX_XENT);
    fwd.p.xent.ignore_index = IGNORE;
    fwd.in[0] = th_rand_view(MR_F64, mr_shape_2d(n, c), -3, 3, 90);
    fwd.in[1] = labels(n, c, 91);
    fwd.out[0] = th_view(MR_F64, mr_shape_1d(n));
    fwd.out[1] = th_view(MR_F64, mr_shape_2d(n, c));
    mr_view r = th_rand_view(MR_F64, mr_shape_1d(n), -1, 1, 92);
    MR_ASSERT_OK(mr_op_run_ref(&fwd));
    mr_op_args b;
    mr_op_args_init(&b, MR_OP_SOFTMAX_XENT_BWD);
    b.p.xent.ignore_index = IGNORE;
    b.in[0] = th_view(MR_F64, mr_shape_2d(n, c)); /* a copy: finite differences rewrite probs */
    memcpy(b.in[0].data, fwd.out[1].data, sizeof(double) * (size_t)(n * c));
    b.in[1] = fwd.in[1];
    b.in[2] = r;
    b.out[0] = th_view(MR_F64, mr_shape_2d(n, c));
    MR_ASSERT_OK(mr_op_run_ref(&b));
    th_check_grad("softmax_xent grad", &fwd, 0, r.data, b.out[0].data, TOL_GRAD_NMSE);
    th_free_all();
}

static void expect_invalid(const mr_op_args *a, const char *name) {
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, a), MR_ERR_INVALID);
    if (!strstr(mr_last_error(), name)) fail_msg("error '%s' does not name %s", mr_last_error(), name);
    assert_int_equal(mr_op_run_ref(a), MR_ERR_INVALID);
    if (!strstr(mr_last_error(), name)) fail_msg("error '%s' does not name %s", mr_last_error(), name);
}

/* The reference takes only f64, so f32 errors found by the kernels are checked on the CPU only. */
static void expect_invalid_cpu(const mr_op_args *a, const char *name) {
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, a), MR_ERR_INVALID);
    if (!strstr(mr_last_error(), name)) fail_msg("error '%s' does not name %s", mr_last_error(), name);
}

static void test_errors(void **state) {
    (void)state;
    mr_op_args a;
    /* the half views are for softmax of f32 only */
    mr_op_args e;
    mr_op_args_init(&e, MR_OP_LOG_SOFTMAX);
    e.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    e.out[0] = th_view(MR_BF16, mr_shape_2d(3, 4));
    th_expect_invalid(&e, "log_softmax");
    mr_op_args_init(&e, MR_OP_SOFTMAX);
    e.in[0] = th_view(MR_F64, mr_shape_2d(3, 4));
    e.out[0] = th_view(MR_BF16, mr_shape_2d(3, 4));
    th_expect_invalid_cpu_ref(&e, "softmax");
    mr_op_args_init(&e, MR_OP_SOFTMAX_BWD);
    e.in[0] = th_view(MR_BF16, mr_shape_2d(3, 4));
    e.in[1] = th_view(MR_BF16, mr_shape_2d(3, 4)); /* dy must be f32 */
    e.out[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    th_expect_invalid_cpu_ref(&e, "dy");
    mr_op_args_init(&e, MR_OP_LOG_SOFTMAX_BWD);
    e.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    e.in[1] = th_view(MR_F32, mr_shape_2d(3, 4));
    e.out[0] = th_view(MR_BF16, mr_shape_2d(3, 4));
    th_expect_invalid(&e, "log_softmax_bwd");
    mr_op_args_init(&a, MR_OP_SOFTMAX);
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.out[0] = th_view(MR_F32, mr_shape_2d(4, 3));
    expect_invalid(&a, "softmax");
    mr_op_args_init(&a, MR_OP_LOG_SOFTMAX_BWD);
    a.in[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    a.in[1] = th_view(MR_F64, mr_shape_2d(3, 4));
    a.out[0] = th_view(MR_F32, mr_shape_2d(3, 4));
    expect_invalid(&a, "log_softmax_bwd");
    /* labels out of range: found by the kernels, naming the row and the label */
    for (int dt = 0; dt < 2; dt++) {
        mr_dtype t = dt ? MR_F64 : MR_F32;
        void (*expect)(const mr_op_args *, const char *) = dt ? expect_invalid : expect_invalid_cpu;
        mr_op_args_init(&a, MR_OP_SOFTMAX_XENT);
        a.p.xent.ignore_index = IGNORE;
        a.in[0] = th_view(t, mr_shape_2d(4, 5));
        a.in[1] = th_view(MR_I32, mr_shape_1d(4));
        ((int32_t *)a.in[1].data)[2] = 7;
        a.out[0] = th_view(t, mr_shape_1d(4));
        a.out[1] = th_view(t, mr_shape_2d(4, 5));
        expect(&a, "softmax_xent: label 7 in row 2");
        ((int32_t *)a.in[1].data)[2] = -1;
        expect(&a, "label -1 in row 2");
        mr_op_args_init(&a, MR_OP_SOFTMAX_XENT_BWD);
        a.p.xent.ignore_index = IGNORE;
        a.in[0] = th_view(t, mr_shape_2d(4, 5));
        a.in[1] = th_view(MR_I32, mr_shape_1d(4));
        ((int32_t *)a.in[1].data)[1] = 5;
        a.in[2] = th_view(t, mr_shape_1d(4));
        a.out[0] = th_view(t, mr_shape_2d(4, 5));
        expect(&a, "softmax_xent_bwd: label 5 in row 1");
    }
    /* labels not i32, logits not 2-d, probs of the wrong shape */
    mr_op_args_init(&a, MR_OP_SOFTMAX_XENT);
    a.in[0] = th_view(MR_F32, mr_shape_2d(4, 5));
    a.in[1] = th_view(MR_I64, mr_shape_1d(4));
    a.out[0] = th_view(MR_F32, mr_shape_1d(4));
    a.out[1] = th_view(MR_F32, mr_shape_2d(4, 5));
    expect_invalid(&a, "softmax_xent");
    a.in[1] = th_view(MR_I32, mr_shape_1d(4));
    a.out[1] = th_view(MR_F32, mr_shape_2d(4, 6));
    expect_invalid(&a, "softmax_xent");
    a.in[0] = th_view(MR_F32, mr_shape_3d(2, 2, 5));
    expect_invalid(&a, "softmax_xent");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_fwd), cmocka_unit_test(test_softmax_bwd), cmocka_unit_test(test_softmax_grad),
        cmocka_unit_test(test_xent),        cmocka_unit_test(test_xent_grad),   cmocka_unit_test(test_errors),
        cmocka_unit_test(test_softmax_causal), cmocka_unit_test(test_softmax_half),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
