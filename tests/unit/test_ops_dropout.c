/* Dropout (DROPOUT, DROPOUT_BWD): the CPU f32 kernel against the f64 reference (same mask, so
 * values agree to rounding) for several p, seeds, offsets and odd sizes; p == 0 copies, p == 1
 * zeros; the mask is identical with 1 and 2 threads and keeps a fraction close to 1-p; the f64
 * CPU path equals the reference; the gradient (the backward) against central differences;
 * p outside [0, 1] and shape errors. */
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

static mr_op_args drop_args(mr_op_id op, mr_dtype dt, mr_shape s, double p, uint64_t seed, uint64_t offset) {
    mr_op_args a;
    mr_op_args_init(&a, op);
    a.in[0] = rnd_view(dt, s, 0.5, 1.5, seed); /* nonzero, so zeros in y are dropped elements */
    a.out[0] = th_view(dt, s);
    a.p.dropout = (mr_dropout_params){p, seed, offset};
    return a;
}

static void test_dropout_vs_ref(void **state) {
    (void)state;
    const double ps[] = {0.0, 0.1, 0.5, 0.9, 1.0};
    const int64_t sizes[] = {1, 3, 7, 1000, 100003};
    for (int op = 0; op < 2; op++)
        for (size_t i = 0; i < 5; i++)
            for (size_t j = 0; j < 5; j++) {
                mr_op_args a = drop_args(op ? MR_OP_DROPOUT_BWD : MR_OP_DROPOUT, MR_F32, mr_shape_1d(sizes[j]), ps[i],
                                         1234 + j, 7 * i);
                char what[64];
                snprintf(what, sizeof what, "dropout op %d p %g n %lld", op, ps[i], (long long)sizes[j]);
                (void)check_vs_ref(what, &a, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
                const float *x = a.in[0].data, *y = a.out[0].data;
                if (ps[i] == 0.0) assert_memory_equal(x, y, view_bytes(&a.in[0]));
                for (int64_t k = 0; ps[i] == 1.0 && k < sizes[j]; k++) assert_true(y[k] == 0.0f);
                th_free_all();
            }
}

static void test_dropout_mask(void **state) {
    (void)state;
    const double ps[] = {0.1, 0.5, 0.8};
    const int64_t n = 1 << 20;
    for (size_t i = 0; i < 3; i++) {
        mr_op_args a = drop_args(MR_OP_DROPOUT, MR_F32, mr_shape_2d(1024, n / 1024), ps[i], 99 + i, 3);
        check_thread_invariant(&a);
        give_workspace(&a);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        const float *y = a.out[0].data;
        int64_t kept = 0;
        for (int64_t k = 0; k < n; k++) kept += y[k] != 0.0f;
        double frac = (double)kept / (double)n, sd = sqrt(ps[i] * (1 - ps[i]) / (double)n);
        if (fabs(frac - (1 - ps[i])) > 5 * sd) fail_msg("p %g: kept %g, expected %g +- %g", ps[i], frac, 1 - ps[i], 5 * sd);
        /* the backward recomputes the same mask; another offset gives another one */
        mr_op_args b = drop_args(MR_OP_DROPOUT_BWD, MR_F32, a.in[0].shape, ps[i], 99 + i, 3);
        b.in[0] = a.in[0];
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        assert_memory_equal(a.out[0].data, b.out[0].data, view_bytes(&a.out[0]));
        b.p.dropout.offset = 4;
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        assert_true(memcmp(a.out[0].data, b.out[0].data, view_bytes(&a.out[0])) != 0);
        th_free_all();
    }
}

static void test_dropout_grad(void **state) {
    (void)state;
    for (int op = 0; op < 2; op++) {
        mr_op_args f = drop_args(op ? MR_OP_DROPOUT_BWD : MR_OP_DROPOUT, MR_F64, mr_shape_2d(3, 11), 0.3, 5, 1);
        /* the gradient of either op is the op applied to r (the same mask and scale) */
        mr_op_args b = drop_args(MR_OP_DROPOUT_BWD, MR_F64, mr_shape_2d(3, 11), 0.3, 5, 1);
        th_fill_uniform_f64(b.in[0].data, 33, -1, 1, 77);
        MR_ASSERT_OK(mr_op_run_ref(&b));
        check_grad(op ? "dropout_bwd d(dy)" : "dropout dx", &f, b.in[0].data, f.in[0].data, 33, b.out[0].data);
        th_free_all();
    }
}

static void test_dropout_errors(void **state) {
    (void)state;
    mr_op_args a = drop_args(MR_OP_DROPOUT, MR_F32, mr_shape_1d(10), 0.5, 1, 0), e;
    const double bad[] = {-0.1, 1.5, NAN};
    for (int i = 0; i < 3; i++) {
        e = a;
        e.p.dropout.p = bad[i];
        expect_invalid(&e, "dropout");
    }
    e = a;
    e.out[0].shape = mr_shape_1d(11);
    expect_invalid(&e, "dropout");
    e = a;
    e.out[0].dtype = MR_F64;
    expect_invalid(&e, "dropout");
    e = a;
    e.op = MR_OP_DROPOUT_BWD;
    e.in[0].dtype = MR_I32;
    e.out[0].dtype = MR_I32;
    expect_invalid(&e, "dropout_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_vs_ref),
        cmocka_unit_test(test_dropout_mask),
        cmocka_unit_test(test_dropout_grad),
        cmocka_unit_test(test_dropout_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
