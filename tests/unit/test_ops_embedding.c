/* Embedding (EMBEDDING, EMBEDDING_BWD): the CPU f32 gather and scatter-add against the f64
 * reference, with repeated ids, 3-d ids, D = 1 and wide D; the f64 CPU path equals the
 * reference; dtable against central differences of the gather; the scatter-add independent of
 * the thread count; out-of-range ids rejected naming the position; shape and dtype errors. */
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

static mr_view ids_view(mr_shape s, int32_t vocab, uint64_t seed) {
    mr_view v = th_view(MR_I32, s);
    th_fill_int32(v.data, mr_shape_numel(&s), 0, vocab, seed);
    return v;
}

static mr_shape with_d(mr_shape s, int64_t d) {
    s.dim[s.ndim++] = d;
    return s;
}

static mr_op_args emb_fwd_args(mr_dtype dt, int64_t vocab, int64_t d, mr_shape ids_s, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_EMBEDDING);
    a.in[0] = rnd_view(dt, mr_shape_2d(vocab, d), -1, 1, seed);
    a.in[1] = ids_view(ids_s, (int32_t)vocab, seed + 1);
    a.out[0] = th_view(dt, with_d(ids_s, d));
    return a;
}

static mr_op_args emb_bwd_args(mr_dtype dt, const mr_view *ids, int64_t vocab, int64_t d, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_EMBEDDING_BWD);
    a.in[0] = *ids;
    a.in[1] = rnd_view(dt, with_d(ids->shape, d), -1, 1, seed);
    a.out[0] = th_view(dt, mr_shape_2d(vocab, d));
    return a;
}

static void test_embedding_vs_ref(void **state) {
    (void)state;
    struct { int64_t v, d; mr_shape ids; } cases[] = {
        {1, 1, mr_shape_1d(1)},       {5, 3, mr_shape_1d(17)},         {50, 1, mr_shape_2d(4, 9)},
        {7, 33, mr_shape_3d(2, 3, 5)}, {65, 768, mr_shape_2d(4, 64)},  {1000, 48, mr_shape_1d(3)},
        {3, 100, mr_shape_1d(2000)},  {10, 4, mr_shape_1d(0)},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char what[64];
        mr_op_args f = emb_fwd_args(MR_F32, cases[k].v, cases[k].d, cases[k].ids, 10 + k);
        snprintf(what, sizeof what, "embedding case %zu", k);
        (void)check_vs_ref(what, &f, 0.0, 0.0, 0.0);
        /* few rows and many ids: every row is hit many times */
        mr_op_args b = emb_bwd_args(MR_F32, &f.in[1], cases[k].v, cases[k].d, 20 + k);
        snprintf(what, sizeof what, "embedding_bwd case %zu", k);
        (void)check_vs_ref(what, &b, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        check_thread_invariant(&b);
        th_free_all();
    }
}

static void test_embedding_grad(void **state) {
    (void)state;
    mr_op_args f = emb_fwd_args(MR_F64, 6, 5, mr_shape_2d(3, 4), 30);
    mr_op_args b = emb_bwd_args(MR_F64, &f.in[1], 6, 5, 31);
    MR_ASSERT_OK(mr_op_run_ref(&b));
    check_grad("embedding dtable", &f, b.in[1].data, f.in[0].data, 30, b.out[0].data);
    th_free_all();
}

static void test_embedding_errors(void **state) {
    (void)state;
    mr_op_args f = emb_fwd_args(MR_F32, 10, 4, mr_shape_1d(6), 1);
    int32_t *ids = f.in[1].data;
    ids[4] = 10;
    expect_invalid(&f, "embedding");
    assert_non_null(strstr(mr_last_error(), "ids[4]"));
    mr_op_args w = widen_args(&f);
    assert_int_equal(mr_op_run_ref(&w), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "ids[4]"));
    ids[4] = -1;
    mr_op_args b = emb_bwd_args(MR_F32, &f.in[1], 10, 4, 2);
    expect_invalid(&b, "embedding_bwd");
    assert_non_null(strstr(mr_last_error(), "ids[4]"));
    ids[4] = 0;
    mr_op_args e = f;
    e.in[1].dtype = MR_I64;
    expect_invalid(&e, "embedding");
    e = f;
    e.out[0].shape = mr_shape_2d(6, 5);
    expect_invalid(&e, "embedding");
    e = f;
    e.in[0].shape = mr_shape_1d(40);
    expect_invalid(&e, "embedding");
    e = b;
    e.in[1].shape = mr_shape_2d(5, 4);
    expect_invalid(&e, "embedding_bwd");
    e = b;
    e.out[0].dtype = MR_F64;
    expect_invalid(&e, "embedding_bwd");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_vs_ref),
        cmocka_unit_test(test_embedding_grad),
        cmocka_unit_test(test_embedding_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
