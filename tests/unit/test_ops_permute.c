/* Permute (PERMUTE): the CPU f32 kernel against the f64 reference (exactly: it only moves
 * values) on the fast paths (identity, last-two swap, (B,T,H,D)->(B,H,T,D)) and general
 * permutations up to 8 dims with size-1 dims; permuting by the inverse restores x; the adjoint
 * identity sum(permute(x)*r) == sum(x*inverse_permute(r)) that makes the inverse permutation its
 * gradient; the f64 CPU path equals the reference; bad perm and shape errors. */
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

static mr_shape permuted(mr_shape s, const int *perm) {
    mr_shape y = s;
    for (int i = 0; i < s.ndim; i++) y.dim[i] = s.dim[perm[i]];
    return y;
}

static mr_op_args perm_args(mr_dtype dt, mr_shape s, const int *perm, uint64_t seed) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_PERMUTE);
    for (int i = 0; i < s.ndim; i++) a.p.permute.perm[i] = perm[i];
    a.in[0] = rnd_view(dt, s, -1, 1, seed);
    a.out[0] = th_view(dt, permuted(s, perm));
    return a;
}

typedef struct perm_case {
    int nd;
    int64_t dims[8];
    int perm[8];
} perm_case;

static const perm_case g_cases[] = {
    {2, {37, 53}, {1, 0}},                                /* 2-d transpose, odd sizes */
    {3, {4, 65, 33}, {0, 2, 1}},                          /* batched last-two swap */
    {4, {2, 5, 3, 8}, {0, 2, 1, 3}},                      /* (B,T,H,D)->(B,H,T,D) */
    {4, {4, 64, 12, 64}, {0, 2, 1, 3}},                   /* the same at attention size */
    {4, {2, 3, 5, 7}, {0, 1, 2, 3}},                      /* identity */
    {4, {2, 3, 5, 7}, {3, 1, 0, 2}},                      /* general */
    {5, {2, 1, 3, 1, 4}, {4, 3, 2, 1, 0}},                /* size-1 dims */
    {3, {1, 1, 1}, {2, 0, 1}},                            /* all size 1 */
    {4, {3, 1, 4, 5}, {0, 3, 2, 1}},                      /* a last-two swap once size-1 dims go */
    {8, {2, 3, 2, 1, 3, 2, 2, 3}, {7, 0, 5, 2, 1, 6, 3, 4}}, /* 8 dims */
    {6, {3, 2, 4, 2, 3, 2}, {0, 1, 4, 5, 2, 3}},          /* merged groups swapped */
    {1, {9}, {0}},
};

static void test_permute_vs_ref(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++) {
        const perm_case *c = &g_cases[k];
        mr_op_args a = perm_args(MR_F32, mr_shape_make(c->nd, c->dims), c->perm, 10 + k);
        char what[64];
        snprintf(what, sizeof what, "permute case %zu", k);
        (void)check_vs_ref(what, &a, 0.0, 0.0, 0.0);
        check_thread_invariant(&a);
        /* the inverse permutation restores x */
        int inv[8];
        for (int i = 0; i < c->nd; i++) inv[c->perm[i]] = i;
        mr_op_args b;
        mr_op_args_init(&b, MR_OP_PERMUTE);
        for (int i = 0; i < c->nd; i++) b.p.permute.perm[i] = inv[i];
        b.in[0] = a.out[0];
        b.out[0] = th_view(MR_F32, a.in[0].shape);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        assert_memory_equal(b.out[0].data, a.in[0].data, view_bytes(&a.in[0]));
        th_free_all();
    }
}

/* The "gradient check" of permute: its adjoint is the inverse permutation. */
static void test_permute_adjoint(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++) {
        const perm_case *c = &g_cases[k];
        mr_shape s = mr_shape_make(c->nd, c->dims);
        mr_op_args f = perm_args(MR_F64, s, c->perm, 30 + k);
        int inv[8];
        for (int i = 0; i < c->nd; i++) inv[c->perm[i]] = i;
        mr_op_args g = perm_args(MR_F64, f.out[0].shape, inv, 40 + k); /* in: r, out: inverse_permute(r) */
        MR_ASSERT_OK(mr_op_run_ref(&f));
        MR_ASSERT_OK(mr_op_run_ref(&g));
        const double *x = f.in[0].data, *y = f.out[0].data, *r = g.in[0].data, *rt = g.out[0].data;
        double lhs = 0.0, rhs = 0.0;
        int64_t n = mr_shape_numel(&s);
        for (int64_t i = 0; i < n; i++) {
            lhs += y[i] * r[i];
            rhs += x[i] * rt[i];
        }
        assert_true(fabs(lhs - rhs) <= 1e-12 * (1.0 + fabs(lhs)));
        /* and through finite differences, as for the other ops (small cases: each entry costs a
         * full forward) */
        if (n <= 2000) check_grad("permute dx", &f, r, f.in[0].data, n, rt);
        th_free_all();
    }
}

static void test_permute_errors(void **state) {
    (void)state;
    const int perm[3] = {2, 0, 1};
    mr_op_args a = perm_args(MR_F32, mr_shape_3d(2, 3, 4), perm, 1), e;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    e = a;
    e.p.permute.perm[1] = 2; /* duplicate */
    expect_invalid(&e, "permute");
    e = a;
    e.p.permute.perm[0] = 3;
    expect_invalid(&e, "permute");
    e = a;
    e.p.permute.perm[2] = -1;
    expect_invalid(&e, "permute");
    e = a;
    e.out[0].shape = mr_shape_3d(2, 3, 4);
    expect_invalid(&e, "permute");
    e = a;
    e.out[0].dtype = MR_I32;
    expect_invalid(&e, "permute");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_permute_vs_ref),
        cmocka_unit_test(test_permute_adjoint),
        cmocka_unit_test(test_permute_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
