/* 2-d convolution (CONV2D, CONV2D_BWD_DATA, CONV2D_BWD_FILTER): the CPU im2col+GEMM kernels in
 * f32 against the f64 reference on the CNN workload layers (1->32 at 28x28, 32->64 at 14x14),
 * stride 2, padding 0 and 2, non-square kernels and strides, size-1 dims, batch 1 (threaded GEMM
 * path) and batches that split unevenly over the filter-gradient groups; the f64 CPU path equals
 * the reference; dx, dw, dbias against central differences; results independent of the thread
 * count; shape, param, dtype and workspace errors. */
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

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw;
    int sh, sw, ph, pw, bias;
} conv_case;

static int64_t out_size(int64_t in, int64_t k, int s, int p) { return (in + 2 * p - k) / s + 1; }

/* The three ops' args for one case, inputs random, in dtype dt. */
static void conv_args(const conv_case *c, mr_dtype dt, uint64_t seed, mr_op_args *f, mr_op_args *bd, mr_op_args *bf) {
    mr_conv_params p = {c->sh, c->sw, c->ph, c->pw};
    mr_shape xs = mr_shape_4d(c->n, c->c, c->h, c->w), ws = mr_shape_4d(c->o, c->c, c->kh, c->kw);
    mr_shape ys = mr_shape_4d(c->n, c->o, out_size(c->h, c->kh, c->sh, c->ph), out_size(c->w, c->kw, c->sw, c->pw));
    mr_view x = rnd_view(dt, xs, -1, 1, seed), w = rnd_view(dt, ws, -0.5, 0.5, seed + 1);
    mr_view dy = rnd_view(dt, ys, -1, 1, seed + 2);
    mr_op_args_init(f, MR_OP_CONV2D);
    f->p.conv = p;
    f->in[0] = x;
    f->in[1] = w;
    if (c->bias) f->in[2] = rnd_view(dt, mr_shape_1d(c->o), -1, 1, seed + 3);
    f->out[0] = th_view(dt, ys);
    mr_op_args_init(bd, MR_OP_CONV2D_BWD_DATA);
    bd->p.conv = p;
    bd->in[0] = w;
    bd->in[1] = dy;
    bd->out[0] = th_view(dt, xs);
    mr_op_args_init(bf, MR_OP_CONV2D_BWD_FILTER);
    bf->p.conv = p;
    bf->in[0] = x;
    bf->in[1] = dy;
    bf->out[0] = th_view(dt, ws);
    if (c->bias) bf->out[1] = th_view(dt, mr_shape_1d(c->o));
}

static const conv_case g_cases[] = {
    {4, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1},  /* CNN conv1 (4 images of the batch) */
    {4, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1}, /* CNN conv2 */
    {1, 3, 9, 9, 4, 3, 3, 2, 2, 0, 0, 1},     /* stride 2, padding 0, batch 1 */
    {3, 2, 8, 7, 5, 5, 5, 1, 1, 2, 2, 0},     /* padding 2, no bias */
    {2, 3, 10, 11, 4, 3, 5, 2, 1, 0, 2, 1},   /* non-square kernel, stride and padding */
    {5, 2, 6, 9, 3, 1, 4, 3, 2, 1, 0, 1},     /* 1x4 kernel, stride (3,2) */
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1},     /* everything 1 */
    {17, 2, 5, 5, 3, 2, 2, 2, 2, 1, 1, 1},    /* 17 images: uneven filter-gradient groups */
    {2, 4, 4, 4, 6, 4, 4, 1, 1, 0, 0, 0},     /* kernel covers the whole input: 1x1 output */
};

static void test_conv_vs_ref(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof g_cases / sizeof *g_cases; k++) {
        mr_op_args f, bd, bf;
        conv_args(&g_cases[k], MR_F32, 10 + 10 * k, &f, &bd, &bf);
        char what[64];
        snprintf(what, sizeof what, "conv2d case %zu", k);
        (void)check_vs_ref(what, &f, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        snprintf(what, sizeof what, "conv2d_bwd_data case %zu", k);
        (void)check_vs_ref(what, &bd, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        snprintf(what, sizeof what, "conv2d_bwd_filter case %zu", k);
        (void)check_vs_ref(what, &bf, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
        th_free_all();
    }
}

static void test_conv_grad(void **state) {
    (void)state;
    const conv_case cases[] = {
        {2, 2, 5, 4, 3, 3, 2, 2, 1, 1, 0, 1},
        {1, 3, 4, 5, 2, 3, 3, 1, 1, 2, 2, 1},
        {3, 1, 6, 6, 2, 2, 3, 2, 3, 0, 1, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const conv_case *c = &cases[k];
        mr_op_args f, bd, bf;
        conv_args(c, MR_F64, 200 + k, &f, &bd, &bf);
        MR_ASSERT_OK(mr_op_run_ref(&bd));
        MR_ASSERT_OK(mr_op_run_ref(&bf));
        const double *r = bd.in[1].data; /* dy is the r of sum(y * r) */
        check_grad("conv2d dx", &f, r, f.in[0].data, mr_shape_numel(&f.in[0].shape), bd.out[0].data);
        check_grad("conv2d dw", &f, r, f.in[1].data, mr_shape_numel(&f.in[1].shape), bf.out[0].data);
        check_grad("conv2d dbias", &f, r, f.in[2].data, c->o, bf.out[1].data);
        th_free_all();
    }
}

static void test_conv_threads(void **state) {
    (void)state;
    const conv_case cases[] = {{5, 3, 12, 12, 8, 3, 3, 1, 1, 1, 1, 1}, {1, 8, 30, 30, 16, 3, 3, 1, 1, 1, 1, 1}};
    for (size_t k = 0; k < 2; k++) {
        mr_op_args f, bd, bf;
        conv_args(&cases[k], MR_F32, 300 + k, &f, &bd, &bf);
        check_thread_invariant(&f);
        check_thread_invariant(&bd);
        check_thread_invariant(&bf);
        th_free_all();
    }
}

static void test_conv_errors(void **state) {
    (void)state;
    const conv_case c = {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1};
    mr_op_args f, bd, bf, e;
    conv_args(&c, MR_F32, 1, &f, &bd, &bf);
    expect_invalid(&f, "conv2d"); /* no workspace */
    assert_non_null(strstr(mr_last_error(), "workspace"));
    give_workspace(&f);
    give_workspace(&bd);
    give_workspace(&bf);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
    e = f;
    e.in[1].shape = mr_shape_4d(4, 2, 3, 3);
    expect_invalid(&e, "conv2d");
    e = f;
    e.p.conv.stride_h = 0;
    expect_invalid(&e, "conv2d");
    e = f;
    e.p.conv.pad_w = -1;
    expect_invalid(&e, "conv2d");
    e = f;
    e.out[0].shape = mr_shape_4d(2, 4, 7, 8);
    expect_invalid(&e, "conv2d");
    e = f;
    e.in[2].shape = mr_shape_1d(3);
    expect_invalid(&e, "conv2d");
    e = f;
    e.in[0].shape = mr_shape_3d(3, 8, 8);
    expect_invalid(&e, "conv2d");
    e = f;
    e.in[1].dtype = MR_I32;
    expect_invalid(&e, "conv2d");
    e = f;
    e.in[1].shape = mr_shape_4d(4, 3, 11, 3); /* kernel taller than the padded input */
    expect_invalid(&e, "conv2d");
    e = bd;
    e.out[0].shape = mr_shape_4d(2, 3, 9, 8);
    expect_invalid(&e, "conv2d_bwd_data");
    e = bd;
    e.in[1].data = NULL;
    expect_invalid(&e, "conv2d_bwd_data");
    e = bf;
    e.out[1].shape = mr_shape_1d(5);
    expect_invalid(&e, "conv2d_bwd_filter");
    e = bf;
    e.in[1].dtype = MR_F64;
    expect_invalid(&e, "conv2d_bwd_filter");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_vs_ref),
        cmocka_unit_test(test_conv_grad),
        cmocka_unit_test(test_conv_threads),
        cmocka_unit_test(test_conv_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
