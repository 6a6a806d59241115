/* Layer norm (LAYERNORM, LAYERNORM_BWD): the CPU f32 kernels against the f64 reference on wide,
 * narrow, 3-d and offset rows; the f64 CPU path equals the reference; dx, dgamma, dbeta against
 * central differences of the forward; dgamma/dbeta optional and independent of the thread count;
 * error paths. */
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

/* f32 forward args over x of shape s (values in [lo, hi)). */
static mr_op_args ln_fwd_args(mr_shape s, double lo, double hi, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_LAYERNORM);
    int64_t d = s.dim[s.ndim - 1];
    mr_shape rs = s;
    rs.dim[--rs.ndim] = 0;
    a.in[0] = rnd_view(MR_F32, s, lo, hi, seed);
    a.in[1] = rnd_view(MR_F32, mr_shape_1d(d), 0.5, 1.5, seed + 1);
    a.in[2] = rnd_view(MR_F32, mr_shape_1d(d), -0.5, 0.5, seed + 2);
    a.out[0] = th_view(MR_F32, s);
    a.out[1] = th_view(MR_F32, rs);
    a.out[2] = th_view(MR_F32, rs);
    a.p.layernorm.eps = 1e-5;
    return a;
}

/* f32 backward args from a forward that has run (its x, gamma, mean, rstd) and a random dy. */
static mr_op_args ln_bwd_args(const mr_op_args *f, int with_dgamma, int with_dbeta, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_LAYERNORM_BWD);
    mr_shape s = f->in[0].shape;
    a.in[0] = f->in[0];
    a.in[1] = f->in[1];
    a.in[2] = f->out[1];
    a.in[3] = f->out[2];
    a.in[4] = rnd_view(f->in[0].dtype, s, -1, 1, seed);
    a.out[0] = th_view(f->in[0].dtype, s);
    if (with_dgamma) a.out[1] = th_view(f->in[0].dtype, f->in[1].shape);
    if (with_dbeta) a.out[2] = th_view(f->in[0].dtype, f->in[1].shape);
    return a;
}

static void test_layernorm_fwd_bwd_vs_ref(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{1, 1, 0}, {3, 5, 0}, {7, 1, 0}, {1, 768, 0}, {64, 768, 0}, {2, 3, 17},
                                 {33, 129, 0}, {1, 4096, 0}, {300, 64, 0}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        mr_shape s = shapes[k][2] ? mr_shape_3d(shapes[k][0], shapes[k][1], shapes[k][2])
                                  : mr_shape_2d(shapes[k][0], shapes[k][1]);
        for (int off = 0; off < 2; off++) {
            /* off: rows centred at 10 with spread 1, where a one-pass variance would cancel */
            mr_op_args f = ln_fwd_args(s, off ? 9.5 : -2.0, off ? 10.5 : 2.0, 10 + k);
            char what[96];
            snprintf(what, sizeof what, "layernorm case %zu off %d", k, off);
            (void)check_vs_ref(what, &f, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            for (int opt = 0; opt < 3; opt++) {
                mr_op_args b = ln_bwd_args(&f, opt != 1, opt != 2, 50 + k);
                snprintf(what, sizeof what, "layernorm_bwd case %zu off %d opt %d", k, off, opt);
                (void)check_vs_ref(what, &b, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            }
        }
        th_free_all();
    }
}

static void test_layernorm_grad(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{4, 7}, {1, 1}, {3, 2}, {2, 16}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        mr_shape s = mr_shape_2d(shapes[k][0], shapes[k][1]);
        mr_op_args f32 = ln_fwd_args(s, -1, 1, 70 + k), f;
        f = widen_args(&f32);
        MR_ASSERT_OK(mr_op_run_ref(&f));
        mr_op_args b = ln_bwd_args(&f, 1, 1, 80 + k);
        MR_ASSERT_OK(mr_op_run_ref(&b));
        const double *r = b.in[4].data; /* dy is the r of the loss sum(y * r) */
        check_grad("layernorm dx", &f, r, f.in[0].data, mr_shape_numel(&s), b.out[0].data);
        check_grad("layernorm dgamma", &f, r, f.in[1].data, s.dim[1], b.out[1].data);
        check_grad("layernorm dbeta", &f, r, f.in[2].data, s.dim[1], b.out[2].data);
        th_free_all();
    }
}

static void test_layernorm_threads(void **state) {
    (void)state;
    mr_op_args f = ln_fwd_args(mr_shape_2d(257, 200), -1, 1, 90);
    give_workspace(&f);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    check_thread_invariant(&f);
    mr_op_args b = ln_bwd_args(&f, 1, 1, 91);
    check_thread_invariant(&b);
    th_free_all();
}

static void test_layernorm_errors(void **state) {
    (void)state;
    mr_op_args f = ln_fwd_args(mr_shape_2d(4, 8), -1, 1, 1);
    mr_op_args e = f;
    e.in[1].shape = mr_shape_1d(7);
    expect_invalid(&e, "layernorm");
    e = f;
    e.out[1].shape = mr_shape_1d(3);
    expect_invalid(&e, "layernorm");
    e = f;
    e.in[0].dtype = MR_I32;
    expect_invalid(&e, "layernorm");
    e = f;
    e.p.layernorm.eps = -1.0;
    expect_invalid(&e, "layernorm");
    e = f;
    e.in[2].data = NULL;
    expect_invalid(&e, "layernorm");
    e = f;
    e.in[0].shape = mr_shape_2d(4, 0);
    e.out[0].shape = e.in[0].shape;
    expect_invalid(&e, "layernorm");
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    mr_op_args b = ln_bwd_args(&f, 1, 1, 2);
    e = b;
    e.out[0].data = NULL;
    expect_invalid(&e, "layernorm_bwd");
    e = b;
    e.in[4].shape = mr_shape_2d(8, 4);
    expect_invalid(&e, "layernorm_bwd");
    e = b;
    e.out[1].shape = mr_shape_1d(9);
    expect_invalid(&e, "layernorm_bwd");
    e = b;
    e.in[3].dtype = MR_F64;
    expect_invalid(&e, "layernorm_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm_fwd_bwd_vs_ref),
        cmocka_unit_test(test_layernorm_grad),
        cmocka_unit_test(test_layernorm_threads),
        cmocka_unit_test(test_layernorm_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
