/* Max pooling (MAXPOOL2D, MAXPOOL2D_BWD): the CPU f32 kernels against the f64 reference (values
 * and argmax exactly) over kernel/stride/padding combinations, overlapping windows, size-1 dims;
 * ties go to the first maximal element; NaN propagates; the f64 CPU path equals the reference;
 * dx against central differences; bad argmax, shape, param and dtype errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

/* ---- helpers shared in shape by the nn op tests (each test file is self-contained) ---------- */

static mr_view rnd_view(mr_dtype dt, mr_shape s, double lo, double hi, uint64_t seed) {
    mr_view v = th_view(dt, s);
    int64_t n = mr_shape_numel(&s);
    if (dt == MR_F64) th_fill_uniform_f64(v.data, n, lo, hi, seed);
    else th_fill_uniform_f32(v.data, n, (float)lo, (float)hi, seed);
    return v;
}

/* The f64 twin of f32 args: float inputs widened (so both see the same rounded values), fresh
 * outputs; integer inputs shared, integer outputs fresh. */
static mr_op_args widen_args(const mr_op_args *a) {
    mr_op_args b = *a;
    b.workspace = NULL;
    b.workspace_bytes = 0;
    for (int k = 0; k < 2; k++) {
        const mr_view *src = k ? a->out : a->in;
        mr_view *dst = k ? b.out : b.in;
        int n = k ? a->n_out : a->n_in;
        for (int i = 0; i < n; i++) {
            int fl = src[i].dtype == MR_F32;
            if (!src[i].data || (!fl && !k)) continue;
            dst[i] = th_view(fl ? MR_F64 : src[i].dtype, src[i].shape);
            if (!k) th_f32_to_f64(src[i].data, dst[i].data, mr_shape_numel(&src[i].shape));
        }
    }
    return b;
}

/* Gives args the workspace their op asks for (owned by the test). */
static void give_workspace(mr_op_args *a) {
    size_t ws = mr_op_workspace_bytes(a);
    a->workspace = ws ? th_alloc(ws) : NULL;
    a->workspace_bytes = ws;
}

/* Fresh outputs of the same shapes and dtypes (to run args again and compare). */
static mr_op_args fresh_outputs(const mr_op_args *a) {
    mr_op_args b = *a;
    for (int i = 0; i < a->n_out; i++)
        if (a->out[i].data) b.out[i] = th_view(a->out[i].dtype, a->out[i].shape);
    return b;
}

static size_t view_bytes(const mr_view *v) { return (size_t)mr_shape_numel(&v->shape) * mr_dtype_size(v->dtype); }

/* Runs f32 args on the CPU and their f64 twin on the reference, compares every output (integer
 * outputs exactly), then checks that the f64 CPU path gives the reference bit for bit. Returns
 * the f64 reference args (outputs filled) for further checks. */
static mr_op_args check_vs_ref(const char *what, mr_op_args *a, double atol, double rtol, double nmse) {
    give_workspace(a);
    mr_op_args b = widen_args(a);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, a));
    MR_ASSERT_OK(mr_op_run_ref(&b));
    char name[200];
    for (int i = 0; i < a->n_out; i++) {
        if (!a->out[i].data) continue;
        snprintf(name, sizeof name, "%s out[%d]", what, i);
        if (a->out[i].dtype == MR_F32)
            assert_true(th_compare(name, a->out[i].data, MR_F32, b.out[i].data, mr_shape_numel(&a->out[i].shape),
                                   atol, rtol, nmse));
        else
            assert_memory_equal(a->out[i].data, b.out[i].data, view_bytes(&a->out[i]));
    }
    mr_op_args c = fresh_outputs(&b);
    give_workspace(&c);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &c));
    for (int i = 0; i < b.n_out; i++)
        if (b.out[i].data) assert_memory_equal(c.out[i].data, b.out[i].data, view_bytes(&b.out[i]));
    return b;
}

/* Runs f32 args on the CPU with 1 and with 2 threads and demands bit-identical outputs. */
static void check_thread_invariant(const mr_op_args *a) {
    mr_op_args r[2];
    int saved = mr_cpu_threads();
    for (int t = 0; t < 2; t++) {
        mr_cpu_set_threads(t + 1);
        r[t] = fresh_outputs(a);
        give_workspace(&r[t]);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &r[t]));
    }
    mr_cpu_set_threads(saved);
    for (int i = 0; i < a->n_out; i++)
        if (a->out[i].data) assert_memory_equal(r[0].out[i].data, r[1].out[i].data, view_bytes(&a->out[i]));
}

/* Loss sum(out[0] * r) of f64 forward args, run on the reference. */
typedef struct grad_ctx {
    mr_op_args *fwd;
    const double *r;
} grad_ctx;

static double grad_loss(void *p) {
    grad_ctx *c = p;
    MR_ASSERT_OK(mr_op_run_ref(c->fwd));
    const double *y = c->fwd->out[0].data;
    double s = 0.0;
    for (int64_t i = 0; i < mr_shape_numel(&c->fwd->out[0].shape); i++) s += y[i] * c->r[i];
    return s;
}

/* Central differences of sum(fwd.out[0] * r) w.r.t. the f64 buffer x (n) against `analytic`. */
static void check_grad(const char *what, mr_op_args *fwd, const double *r, double *x, int64_t n,
                       const double *analytic) {
    grad_ctx c = {fwd, r};
    double *num = th_alloc((size_t)n * sizeof(double));
    th_numeric_grad(x, n, TOL_GRAD_H, grad_loss, &c, num);
    assert_true(th_compare(what, analytic, MR_F64, num, n, TOL_GRAD_ATOL, TOL_GRAD_RTOL, TOL_NN_GRAD_NMSE));
}

/* Asserts args are rejected with MR_ERR_INVALID and a message naming the op. */
#define expect_invalid(a, opname) expect_invalid_at((a), (opname), __LINE__)
static void expect_invalid_at(const mr_op_args *a, const char *opname, int line) {
    mr_status st = mr_op_run(MR_DEVICE_CPU, a);
    if (st != MR_ERR_INVALID) fail_msg("line %d: expected MR_ERR_INVALID, got %s", line, mr_status_name(st));
    if (!strstr(mr_last_error(), opname))
        fail_msg("line %d: error \"%s\" does not name %s", line, mr_last_error(), opname);
}

typedef struct pool_case {
    int64_t n, c, h, w;
    int kh, kw, sh, sw, ph, pw;
} pool_case;

static void pool_args(const pool_case *c, mr_dtype dt, uint64_t seed, mr_op_args *f, mr_op_args *b) {
    mr_pool_params p = {c->kh, c->kw, c->sh, c->sw, c->ph, c->pw};
    int64_t oh = (c->h + 2 * c->ph - c->kh) / c->sh + 1, ow = (c->w + 2 * c->pw - c->kw) / c->sw + 1;
    mr_shape xs = mr_shape_4d(c->n, c->c, c->h, c->w), ys = mr_shape_4d(c->n, c->c, oh, ow);
    mr_op_args_init(f, MR_OP_MAXPOOL2D);
    f->p.pool = p;
    f->in[0] = rnd_view(dt, xs, -1, 1, seed);
    f->out[0] = th_view(dt, ys);
    f->out[1] = th_view(MR_I32, ys);
    mr_op_args_init(b, MR_OP_MAXPOOL2D_BWD);
    b->p.pool = p;
    b->in[0] = f->out[1];
    b->in[1] = rnd_view(dt, ys, -1, 1, seed + 1);
    b->out[0] = th_view(dt, xs);
}

static void test_pool_vs_ref(void **state) {
    (void)state;
    const pool_case cases[] = {
        {4, 32, 28, 28, 2, 2, 2, 2, 0, 0}, /* CNN pool1 */
        {4, 64, 14, 14, 2, 2, 2, 2, 0, 0}, /* CNN pool2 */
        {2, 3, 7, 9, 3, 3, 2, 2, 1, 1},    /* overlapping, padded, odd sizes */
        {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},    /* everything 1 */
        {3, 2, 5, 8, 2, 4, 1, 3, 1, 2},    /* non-square kernel, stride, padding */
        {2, 2, 6, 6, 3, 3, 1, 1, 1, 1},    /* stride 1: each element in up to 9 windows */
        {1, 5, 4, 4, 4, 4, 4, 4, 0, 0},    /* global pooling */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        mr_op_args f, b;
        pool_args(&cases[k], MR_F32, 10 + 5 * k, &f, &b);
        char what[64];
        snprintf(what, sizeof what, "maxpool2d case %zu", k);
        mr_op_args f64 = check_vs_ref(what, &f, 0.0, 0.0, 0.0);
        /* the backward on the reference's own argmax, so both sides scatter to the same places */
        assert_memory_equal(f.out[1].data, f64.out[1].data, view_bytes(&f.out[1]));
        snprintf(what, sizeof what, "maxpool2d_bwd case %zu", k);
        (void)check_vs_ref(what, &b, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
        check_thread_invariant(&b);
        th_free_all();
    }
}

static void test_pool_ties_nan(void **state) {
    (void)state;
    const pool_case c = {1, 1, 2, 4, 2, 2, 2, 2, 0, 0};
    for (int dt = 0; dt < 2; dt++) {
        mr_op_args f, b;
        pool_args(&c, dt ? MR_F64 : MR_F32, 1, &f, &b);
        /* window 0 all equal: the first wins; window 1 has a NaN after the max: NaN wins */
        double vals[8] = {3, 3, 1, 5, 3, 3, NAN, 2};
        for (int i = 0; i < 8; i++) mr_dtype_set(f.in[0].data, f.in[0].dtype, i, vals[i]);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
        const int32_t *am = f.out[1].data;
        assert_int_equal(am[0], 0);
        assert_int_equal(am[1], 6);
        assert_true(isnan(mr_dtype_get(f.out[0].data, f.out[0].dtype, 1)));
        assert_true(mr_dtype_get(f.out[0].data, f.out[0].dtype, 0) == 3.0);
    }
    th_free_all();
}

static void test_pool_grad(void **state) {
    (void)state;
    const pool_case cases[] = {{2, 2, 5, 6, 3, 2, 2, 2, 1, 1}, {1, 3, 4, 4, 2, 2, 1, 1, 0, 0}};
    for (size_t k = 0; k < 2; k++) {
        mr_op_args f, b;
        pool_args(&cases[k], MR_F64, 40 + k, &f, &b);
        MR_ASSERT_OK(mr_op_run_ref(&f));
        MR_ASSERT_OK(mr_op_run_ref(&b));
        check_grad("maxpool2d dx", &f, b.in[1].data, f.in[0].data, mr_shape_numel(&f.in[0].shape), b.out[0].data);
        th_free_all();
    }
}

static void test_pool_errors(void **state) {
    (void)state;
    const pool_case c = {2, 3, 6, 6, 2, 2, 2, 2, 0, 0};
    mr_op_args f, b, e;
    pool_args(&c, MR_F32, 1, &f, &b);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    e = f;
    e.p.pool.stride_w = 0;
    expect_invalid(&e, "maxpool2d");
    e = f;
    e.p.pool.pad_h = 2; /* more than kernel/2 */
    expect_invalid(&e, "maxpool2d");
    e = f;
    e.out[0].shape = mr_shape_4d(2, 3, 3, 2);
    expect_invalid(&e, "maxpool2d");
    e = f;
    e.out[1].dtype = MR_F32;
    expect_invalid(&e, "maxpool2d");
    e = f;
    e.in[0].dtype = MR_I32;
    expect_invalid(&e, "maxpool2d");
    e = f;
    e.in[0].shape = mr_shape_3d(6, 6, 6);
    expect_invalid(&e, "maxpool2d");
    e = b;
    e.out[0].shape = mr_shape_4d(2, 3, 8, 6);
    expect_invalid(&e, "maxpool2d_bwd");
    e = b;
    ((int32_t *)b.in[0].data)[5] = 36;
    expect_invalid(&e, "maxpool2d_bwd");
    assert_non_null(strstr(mr_last_error(), "argmax[5]"));
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_vs_ref),
        cmocka_unit_test(test_pool_ties_nan),
        cmocka_unit_test(test_pool_grad),
        cmocka_unit_test(test_pool_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
