/* CONV2D_MAXPOOL (core/ops.h): a convolution and its 2x2/stride-2 max pool as one op on the CPU
 * (core/cpu/conv_pool_cpu.c: the conv output pooled from a per-thread stage, never stored). The CPU
 * kernel in f32 against the f64 reference (core/ref/conv_ref.c), with and without the fused ReLU;
 * in mixed precision (p.conv.bf16; x f32 rounded in the kernel, or bf16) against the mixed
 * reference; y and argmax bit-identical to CONV2D then MAXPOOL2D run on the CPU, and with 1, 2 and
 * 4 threads; the backward ops with p.conv.pool (the pooled dy scattered at the argmax as read)
 * bit-identical to MAXPOOL2D_BWD then the plain backward ops, and against the reference; the
 * gradient against central differences; errors. Cases: the CNN's two layers (the direct forward and im2col + GEMM),
 * batch 1 (the threaded GEMM), odd conv outputs (the last row or column falls out of the pool),
 * strides, no bias, many images. The graph side (mr_graph_fuse_conv_pool): a small CNN's loss and
 * gradients equal the unfused graph's bit for bit in f32 and mixed bf16; what stops the fusion
 * (a second reader, a kept value), and the errors on a fused-away value. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autodiff/graph_impl.h" /* the node list: which ops the fusion left */
#include "core/math/half_math.h"
#include "harness.h"

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw;
    int sh, sw, ph, pw, bias;
} conv_case;

static const conv_case g_cases[] = {
    {4, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1},  /* CNN conv1: the direct forward */
    {4, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1}, /* CNN conv2: im2col + GEMM, batched */
    {1, 3, 9, 9, 4, 3, 3, 2, 2, 0, 0, 1},     /* stride 2, batch 1: one image, threaded GEMM */
    {3, 2, 8, 7, 5, 5, 5, 1, 1, 2, 2, 0},     /* conv output 8x7: odd width, no bias */
    {2, 3, 10, 11, 4, 3, 5, 2, 1, 0, 2, 1},   /* non-square kernel and stride: output 4x11 */
    {5, 2, 7, 9, 3, 1, 1, 1, 1, 0, 0, 1},     /* 1 tap (direct), output 7x9: odd both ways */
    {2, 2, 7, 20, 3, 2, 2, 1, 1, 1, 0, 1},    /* 4 taps, odd O, output 8x19 */
    {33, 3, 12, 12, 8, 3, 3, 1, 1, 1, 1, 1},  /* 33 images: batches over threads, a short last one */
};
#define NCASES (sizeof g_cases / sizeof *g_cases)

static int64_t out_size(int64_t in, int64_t k, int s, int p) { return (in + 2 * p - k) / s + 1; }

/* One case's ops on the same inputs: the fused op, and CONV2D + MAXPOOL2D (pool.in[0] is conv's y). */
typedef struct cp_args {
    mr_op_args fused, conv, pool;
} cp_args;

/* mode 0: f32; 1: mixed with f32 x (rounded by the kernel); 2: mixed with bf16 x; 3: f64. */
static void cp_make(const conv_case *c, int mode, int relu, uint64_t seed, cp_args *a) {
    mr_conv_params p = {c->sh, c->sw, c->ph, c->pw, mode == 1 || mode == 2, relu, 0};
    mr_dtype ft = mode == 3 ? MR_F64 : MR_F32;
    int64_t oh = out_size(c->h, c->kh, c->sh, c->ph), ow = out_size(c->w, c->kw, c->sw, c->pw);
    mr_shape xs = mr_shape_4d(c->n, c->c, c->h, c->w), ws = mr_shape_4d(c->o, c->c, c->kh, c->kw);
    mr_shape ys = mr_shape_4d(c->n, c->o, oh, ow), ps = mr_shape_4d(c->n, c->o, oh / 2, ow / 2);
    mr_view x = th_rand_view(ft, xs, -1, 1, seed), w = th_rand_view(ft, ws, -0.5, 0.5, seed + 1);
    if (mode == 1 || mode == 2) {
        mr_view wb = th_view(MR_BF16, ws);
        for (int64_t i = 0; i < mr_shape_numel(&ws); i++)
            ((uint16_t *)wb.data)[i] = mr_f32_to_bf16(((const float *)w.data)[i]);
        w = wb;
    }
    if (mode == 2) {
        mr_view xb = th_view(MR_BF16, xs);
        for (int64_t i = 0; i < mr_shape_numel(&xs); i++)
            ((uint16_t *)xb.data)[i] = mr_f32_to_bf16(((const float *)x.data)[i]);
        x = xb;
    }
    mr_op_args_init(&a->fused, MR_OP_CONV2D_MAXPOOL);
    mr_op_args_init(&a->conv, MR_OP_CONV2D);
    a->fused.p.conv = a->conv.p.conv = p;
    a->fused.in[0] = a->conv.in[0] = x;
    a->fused.in[1] = a->conv.in[1] = w;
    if (c->bias) a->fused.in[2] = a->conv.in[2] = th_rand_view(ft, mr_shape_1d(c->o), -1, 1, seed + 2);
    a->fused.out[0] = th_view(ft, ps);
    a->fused.out[1] = th_view(MR_I32, ps);
    a->conv.out[0] = th_view(ft, ys);
    mr_op_args_init(&a->pool, MR_OP_MAXPOOL2D);
    a->pool.p.pool = (mr_pool_params){2, 2, 2, 2, 0, 0, relu};
    a->pool.in[0] = a->conv.out[0];
    a->pool.out[0] = th_view(ft, ps);
    a->pool.out[1] = th_view(MR_I32, ps);
    th_give_workspace(&a->fused);
    th_give_workspace(&a->conv);
}

/* y and argmax of the fused op with 1, 2 and 4 threads, each bit-equal to CONV2D then MAXPOOL2D
 * run on the CPU with the same thread count. Returns the windows with argmax -1. */
static int64_t check_vs_unfused(const char *what, const cp_args *a) {
    static const int threads[3] = {1, 2, 4};
    int saved = mr_cpu_threads();
    int64_t n = mr_shape_numel(&a->fused.out[0].shape), none = 0;
    size_t yb = th_view_bytes(&a->fused.out[0]), ab = th_view_bytes(&a->fused.out[1]);
    void *first_y = NULL, *first_a = NULL;
    for (int t = 0; t < 3; t++) {
        mr_cpu_set_threads(threads[t]);
        mr_op_args f = th_fresh_outputs(&a->fused), c = th_fresh_outputs(&a->conv), p = a->pool;
        th_give_workspace(&f);
        th_give_workspace(&c);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f));
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &c));
        p.in[0] = c.out[0];
        p = th_fresh_outputs(&p);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &p));
        for (int k = 0; k < 2; k++)
            if (memcmp(f.out[k].data, p.out[k].data, k ? ab : yb) != 0) {
                int64_t i = 0;
                if (k == 0)
                    while (i < n && !memcmp((const char *)f.out[0].data + i * (yb / n), (const char *)p.out[0].data + i * (yb / n), yb / n)) i++;
                else
                    while (i < n && ((const int32_t *)f.out[1].data)[i] == ((const int32_t *)p.out[1].data)[i]) i++;
                fail_msg("%s, %d threads: %s differs from conv2d + maxpool2d first at [%lld]", what, threads[t],
                         k ? "argmax" : "y", (long long)i);
            }
        if (t == 0) {
            first_y = f.out[0].data;
            first_a = f.out[1].data;
            for (int64_t i = 0; i < n; i++) none += ((const int32_t *)first_a)[i] == -1;
        } else {
            assert_memory_equal(first_y, f.out[0].data, yb);
            assert_memory_equal(first_a, f.out[1].data, ab);
        }
    }
    mr_cpu_set_threads(saved);
    return none;
}

static void test_conv_pool_f32(void **state) {
    (void)state;
    int64_t masked = 0;
    for (size_t k = 0; k < NCASES; k++)
        for (int relu = 0; relu < 2; relu++) {
            cp_args a;
            cp_make(&g_cases[k], 0, relu, 10 + 10 * k, &a);
            char what[96];
            snprintf(what, sizeof what, "conv2d_maxpool f32%s case %zu", relu ? " relu" : "", k);
            /* y within the f32 tolerance of the reference, argmax equal to it, the f64 CPU path bit-equal */
            (void)th_check_cpu_vs_ref(what, &a.fused, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            int64_t none = check_vs_unfused(what, &a);
            if (!relu) assert_int_equal(none, 0); /* no padding: every window has a position */
            masked += none;
            th_free_all();
        }
    assert_true(masked > 0); /* the ReLU's -1 convention was exercised */
}

/* Mixed precision: the kernel against the mixed reference (f32 sums of exact bf16 products), y and
 * argmax bit-equal to the unfused CPU ops, and f32 x rounded in the kernel giving the bits of the
 * same x cast to bf16. */
static void test_conv_pool_bf16(void **state) {
    (void)state;
    for (size_t k = 0; k < NCASES; k++) {
        cp_args a[2];
        for (int m = 0; m < 2; m++) {
            cp_make(&g_cases[k], 1 + m, 1, 700 + 10 * k, &a[m]);
            char what[96];
            snprintf(what, sizeof what, "conv2d_maxpool mixed (%s x) case %zu", m ? "bf16" : "f32", k);
            (void)check_vs_unfused(what, &a[m]);
            mr_op_args r = th_fresh_outputs(&a[m].fused);
            MR_ASSERT_OK(mr_op_run_ref(&r));
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a[m].fused));
            int64_t n = mr_shape_numel(&r.out[0].shape);
            double *ref = th_alloc((size_t)n * sizeof(double));
            for (int64_t i = 0; i < n; i++) ref[i] = ((const float *)r.out[0].data)[i];
            assert_true(th_compare(what, a[m].fused.out[0].data, MR_F32, ref, n, TOL_F32_REDUCE_ATOL,
                                   TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
        }
        assert_memory_equal(a[0].fused.out[0].data, a[1].fused.out[0].data, th_view_bytes(&a[0].fused.out[0]));
        assert_memory_equal(a[0].fused.out[1].data, a[1].fused.out[1].data, th_view_bytes(&a[0].fused.out[1]));
        th_free_all();
    }
}

/* Runs args on the CPU with 1, 2 and 4 threads (fresh outputs, workspace each) and asserts every
 * output bit-equal to `want` (args of the same outputs, already run). */
static void outputs_equal_124(const char *what, const mr_op_args *a, const mr_op_args *want) {
    static const int threads[3] = {1, 2, 4};
    int saved = mr_cpu_threads(), checked = 0;
    for (int t = 0; t < 3; t++) {
        mr_cpu_set_threads(threads[t]);
        mr_op_args r = th_fresh_outputs(a);
        th_give_workspace(&r);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &r));
        for (int i = 0; i < a->n_out; i++) {
            if (!a->out[i].data) continue;
            if (memcmp(r.out[i].data, want->out[i].data, th_view_bytes(&a->out[i])) != 0)
                fail_msg("%s, %d threads: out[%d] differs from the unfused ops", what, threads[t], i);
            checked++;
        }
    }
    mr_cpu_set_threads(saved);
    assert_true(checked > 0);
}

/* The backward ops with p.conv.pool (pooled dy scattered at the argmax as read) against
 * MAXPOOL2D_BWD then the plain backward ops on the CPU, bit for bit with 1, 2 and 4 threads, and
 * against the reference: f32 (th_check_cpu_vs_ref), mixed with f32 dy and with bf16 dy. The
 * argmax is the fused forward's (with the ReLU: -1 windows included). */
static void test_conv_pool_bwd(void **state) {
    (void)state;
    for (size_t k = 0; k < NCASES; k++)
        for (int mode = 0; mode < 3; mode++) {
            const conv_case *c = &g_cases[k];
            cp_args a;
            cp_make(c, mode, 1, 40 + 10 * k, &a);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a.fused));
            mr_shape ps = a.fused.out[0].shape, ys = a.conv.out[0].shape;
            /* dy pooled (f32, or bf16 for mode 2) and its MAXPOOL2D_BWD scatter in f32 */
            mr_view dyf = th_rand_view(MR_F32, ps, -1, 1, 60 + k), dy = dyf;
            if (mode == 2) {
                dy = th_view(MR_BF16, ps);
                for (int64_t i = 0; i < mr_shape_numel(&ps); i++) {
                    ((uint16_t *)dy.data)[i] = mr_f32_to_bf16(((float *)dyf.data)[i]);
                    ((float *)dyf.data)[i] = mr_bf16_to_f32(((uint16_t *)dy.data)[i]);
                }
            }
            mr_op_args pb;
            mr_op_args_init(&pb, MR_OP_MAXPOOL2D_BWD);
            pb.p.pool = a.pool.p.pool;
            pb.in[0] = a.fused.out[1];
            pb.in[1] = dyf;
            pb.out[0] = th_view(MR_F32, ys);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &pb));
            mr_view full = pb.out[0];
            if (mode == 2) {
                full = th_view(MR_BF16, ys);
                for (int64_t i = 0; i < mr_shape_numel(&ys); i++)
                    ((uint16_t *)full.data)[i] = mr_f32_to_bf16(((float *)pb.out[0].data)[i]);
            }
            const mr_op_id ops[2] = {MR_OP_CONV2D_BWD_DATA, MR_OP_CONV2D_BWD_FILTER};
            for (int o = 0; o < 2; o++) {
                mr_op_args pooled, plain;
                mr_op_args_init(&pooled, ops[o]);
                pooled.p.conv = a.fused.p.conv;
                pooled.p.conv.pool = 1;
                pooled.in[0] = o ? a.fused.in[0] : a.fused.in[1];
                pooled.in[1] = dy;
                pooled.in[2] = a.fused.out[1];
                pooled.out[0] = th_view(MR_F32, o ? a.fused.in[1].shape : a.fused.in[0].shape);
                if (o && c->bias) pooled.out[1] = th_view(MR_F32, mr_shape_1d(c->o));
                plain = th_fresh_outputs(&pooled);
                plain.p.conv.pool = 0;
                plain.in[1] = full;
                memset(&plain.in[2], 0, sizeof plain.in[2]);
                th_give_workspace(&plain);
                MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &plain));
                char what[96];
                snprintf(what, sizeof what, "%s pooled (%s) case %zu", o ? "conv2d_bwd_filter" : "conv2d_bwd_data",
                         mode == 0 ? "f32" : mode == 1 ? "mixed, f32 dy" : "mixed, bf16 dy", k);
                outputs_equal_124(what, &pooled, &plain);
                if (mode == 0) {
                    (void)th_check_cpu_vs_ref(what, &pooled, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL,
                                              TOL_F32_REDUCE_NMSE);
                    continue;
                }
                mr_op_args r = th_fresh_outputs(&pooled), m = th_fresh_outputs(&pooled);
                MR_ASSERT_OK(mr_op_run_ref(&r));
                th_give_workspace(&m);
                MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &m));
                for (int i = 0; i < 2; i++) {
                    if (!m.out[i].data) continue;
                    int64_t n = mr_shape_numel(&m.out[i].shape);
                    double *ref = th_alloc((size_t)n * sizeof(double));
                    for (int64_t j = 0; j < n; j++) ref[j] = ((const float *)r.out[i].data)[j];
                    assert_true(th_compare(what, m.out[i].data, MR_F32, ref, n, TOL_F32_REDUCE_ATOL,
                                           TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
                }
            }
            th_free_all();
        }
}

/* The gradient the graph gives the fused node (MAXPOOL2D_BWD of r into the conv output, then
 * CONV2D_BWD_DATA and CONV2D_BWD_FILTER, all references) against central differences of
 * sum(y * r), with the ReLU and without. */
static void test_conv_pool_grad(void **state) {
    (void)state;
    const conv_case cases[] = {{2, 2, 5, 6, 3, 3, 3, 1, 1, 1, 1, 1}, {1, 3, 7, 6, 2, 2, 3, 1, 2, 0, 1, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (int relu = 0; relu < 2; relu++) {
            const conv_case *c = &cases[k];
            cp_args a;
            cp_make(c, 3, relu, 300 + 10 * k + relu, &a);
            mr_op_args *f = &a.fused;
            MR_ASSERT_OK(mr_op_run_ref(f));
            const int64_t *yd = a.conv.out[0].shape.dim;
            mr_view r = th_rand_view(MR_F64, f->out[0].shape, -1, 1, 900 + k);
            mr_op_args pb, bd, bf;
            mr_op_args_init(&pb, MR_OP_MAXPOOL2D_BWD);
            pb.p.pool = a.pool.p.pool;
            pb.in[0] = f->out[1];
            pb.in[1] = r;
            pb.out[0] = th_view(MR_F64, mr_shape_4d(yd[0], yd[1], yd[2], yd[3]));
            MR_ASSERT_OK(mr_op_run_ref(&pb));
            mr_op_args_init(&bd, MR_OP_CONV2D_BWD_DATA);
            mr_op_args_init(&bf, MR_OP_CONV2D_BWD_FILTER);
            bd.p.conv = bf.p.conv = f->p.conv;
            bd.in[0] = f->in[1];
            bd.in[1] = bf.in[1] = pb.out[0];
            bd.out[0] = th_view(MR_F64, f->in[0].shape);
            bf.in[0] = f->in[0];
            bf.out[0] = th_view(MR_F64, f->in[1].shape);
            bf.out[1] = th_view(MR_F64, f->in[2].shape);
            MR_ASSERT_OK(mr_op_run_ref(&bd));
            MR_ASSERT_OK(mr_op_run_ref(&bf));
            th_check_grad(relu ? "conv2d_maxpool relu dx" : "conv2d_maxpool dx", f, 0, r.data, bd.out[0].data,
                          TOL_NN_GRAD_NMSE);
            th_check_grad(relu ? "conv2d_maxpool relu dw" : "conv2d_maxpool dw", f, 1, r.data, bf.out[0].data,
                          TOL_NN_GRAD_NMSE);
            th_check_grad(relu ? "conv2d_maxpool relu dbias" : "conv2d_maxpool dbias", f, 2, r.data,
                          bf.out[1].data, TOL_NN_GRAD_NMSE);
            th_free_all();
        }
}

static void test_conv_pool_errors(void **state) {
    (void)state;
    cp_args a;
    cp_make(&g_cases[3], 0, 1, 1, &a);
    mr_op_args e = a.fused;
    e.workspace = NULL;
    e.workspace_bytes = 0;
    th_expect_invalid(&e, "conv2d_maxpool");
    assert_non_null(strstr(mr_last_error(), "workspace"));
    e = a.fused;
    e.out[0].shape = mr_shape_4d(3, 5, 4, 4); /* the conv's 8x7 pools to 4x3 */
    th_expect_invalid(&e, "conv2d_maxpool");
    e = a.fused;
    e.out[1].dtype = MR_F32;
    th_expect_invalid(&e, "conv2d_maxpool");
    e = a.fused;
    e.out[1].data = NULL;
    th_expect_invalid(&e, "conv2d_maxpool");
    e = a.fused;
    e.in[1].dtype = MR_BF16; /* bf16 w without p.conv.bf16 */
    th_expect_invalid(&e, "conv2d_maxpool");
    e = a.fused;
    e.in[2] = th_rand_view(MR_F32, mr_shape_1d(4), -1, 1, 5); /* O is 5 */
    th_expect_invalid(&e, "conv2d_maxpool");
    e = a.fused;
    e.p.conv.stride_h = 0;
    th_expect_invalid(&e, "conv2d_maxpool");
    e = a.fused;
    e.in[1].shape = mr_shape_4d(5, 2, 12, 11); /* conv output 1x1: nothing to pool */
    e.out[0].shape = e.out[1].shape = mr_shape_4d(3, 5, 0, 0);
    th_expect_invalid(&e, "conv2d_maxpool");
    assert_non_null(strstr(mr_last_error(), "2x2"));
    /* the backward ops' p.conv.pool: argmax required with it, refused without, checked as read */
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a.fused));
    const mr_op_id bops[2] = {MR_OP_CONV2D_BWD_DATA, MR_OP_CONV2D_BWD_FILTER};
    for (int o = 0; o < 2; o++) {
        const char *name = o ? "conv2d_bwd_filter" : "conv2d_bwd_data";
        mr_op_args b;
        mr_op_args_init(&b, bops[o]);
        b.p.conv = a.fused.p.conv;
        b.p.conv.pool = 1;
        b.in[0] = o ? a.fused.in[0] : a.fused.in[1];
        b.in[1] = th_rand_view(MR_F32, a.fused.out[0].shape, -1, 1, 7);
        b.in[2] = a.fused.out[1];
        b.out[0] = th_view(MR_F32, o ? a.fused.in[1].shape : a.fused.in[0].shape);
        th_give_workspace(&b);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &b));
        e = b;
        memset(&e.in[2], 0, sizeof e.in[2]);
        th_expect_invalid(&e, name);
        e = b;
        e.p.conv.pool = 0; /* argmax without p.conv.pool */
        th_expect_invalid(&e, name);
        e = b;
        e.in[1].shape = a.conv.out[0].shape; /* a full-size dy with p.conv.pool */
        th_expect_invalid(&e, name);
        e = th_fresh_outputs(&b);
        th_give_workspace(&e);
        mr_view bad = th_view(MR_I32, b.in[2].shape);
        memcpy(bad.data, b.in[2].data, th_view_bytes(&bad));
        ((int32_t *)bad.data)[th_view_bytes(&bad) / sizeof(int32_t) - 1] = 1 << 20;
        e.in[2] = bad;
        th_expect_invalid_cpu_ref(&e, "argmax");
    }
    /* CPU only: a GPU backend has no kernel for it, and says so by name */
    assert_int_equal(mr_op_run(MR_DEVICE_CUDA, &a.fused), MR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mr_last_error(), "conv2d_maxpool"));
    th_free_all();
}

/* ---- the graph: mr_graph_fuse_conv_pool ---------------------------------------------------------- */

enum { GN = 3, GC = 1, GH = 10, GW = 9, GO1 = 4, GO2 = 6, GCLS = 5 };

typedef struct cnn {
    mr_graph *g;
    mr_val x, labels, w1, b1, w2, b2, fc, y1, loss, params[5], grads[5];
    mr_plan *plan;
} cnn;

/* x (3,2,10,9) -> conv 3x3 pad 1 + ReLU -> pool -> (5x4) conv 3x3 pad 1 + ReLU -> pool (2x2) ->
 * linear -> xent -> mean; mixed: the conv weights through bf16 casts (mixed_bfloat16's rule);
 * extra: 0.01 * sum(y1) added to the loss (a second reader of the first conv's output). */
static void cnn_build(cnn *m, int mixed, int extra) {
    memset(m, 0, sizeof *m);
    MR_ASSERT_OK(mr_graph_new(&m->g));
    mr_graph *g = m->g;
    m->x = mr_graph_input(g, "x", MR_F32, mr_shape_4d(GN, GC, GH, GW));
    m->labels = mr_graph_input(g, "labels", MR_I32, mr_shape_1d(GN));
    m->w1 = mr_graph_param(g, "w1", MR_F32, mr_shape_4d(GO1, GC, 3, 3));
    m->b1 = mr_graph_param(g, "b1", MR_F32, mr_shape_1d(GO1));
    m->w2 = mr_graph_param(g, "w2", MR_F32, mr_shape_4d(GO2, GO1, 3, 3));
    m->b2 = mr_graph_param(g, "b2", MR_F32, mr_shape_1d(GO2));
    m->fc = mr_graph_param(g, "fc", MR_F32, mr_shape_2d(GCLS, GO2 * 2 * 2));
    mr_val w1 = mixed ? mr_graph_cast(g, m->w1, MR_BF16) : m->w1, w2 = mixed ? mr_graph_cast(g, m->w2, MR_BF16) : m->w2;
    m->y1 = mr_graph_relu_after_conv(g, mr_graph_conv2d(g, m->x, w1, m->b1, 1, 1));
    mr_val h = mr_graph_maxpool2d(g, m->y1, 2, 2, 0);
    h = mr_graph_relu_after_conv(g, mr_graph_conv2d(g, h, w2, m->b2, 1, 1));
    h = mr_graph_maxpool2d(g, h, 2, 2, 0);
    h = mr_graph_reshape(g, h, mr_shape_2d(GN, GO2 * 2 * 2));
    mr_val logits = mr_graph_matmul(g, h, m->fc, 0, 1, 1.0);
    m->loss = mr_graph_mean(g, mr_graph_softmax_xent(g, logits, m->labels, -100), 1u);
    if (extra) m->loss = mr_graph_add(g, m->loss, mr_graph_scale(g, mr_graph_sum(g, m->y1, 0xfu), 0.01));
    MR_ASSERT_OK(mr_graph_status(g));
    mr_val p[5] = {m->w1, m->b1, m->w2, m->b2, m->fc};
    memcpy(m->params, p, sizeof p);
}

static int count_op(const mr_graph *g, mr_op_id op) {
    int n = 0;
    for (int32_t i = 0; i < g->nnodes; i++) n += g->nodes[i].op == op;
    return n;
}

/* Differentiates, plans, binds the shared data (x, labels, then the params' buffers) and runs. */
static void cnn_run(cnn *m, void *const *data) {
    MR_ASSERT_OK(mr_graph_grad(m->g, m->loss, m->params, 5, m->grads));
    mr_val keep[6] = {m->loss};
    memcpy(keep + 1, m->grads, sizeof m->grads);
    MR_ASSERT_OK(mr_plan_new(m->g, MR_DEVICE_CPU, keep, 6, &m->plan));
    MR_ASSERT_OK(mr_plan_bind(m->plan, m->x, data[0]));
    MR_ASSERT_OK(mr_plan_bind(m->plan, m->labels, data[1]));
    for (int i = 0; i < 5; i++) MR_ASSERT_OK(mr_plan_bind(m->plan, m->params[i], data[2 + i]));
    MR_ASSERT_OK(mr_plan_run(m->plan));
}

static void cnn_free(cnn *m) {
    mr_plan_free(m->plan);
    mr_graph_free(m->g);
}

static void test_graph_fused_vs_unfused(void **state) {
    (void)state;
    void *data[7];
    data[0] = th_rand_view(MR_F32, mr_shape_4d(GN, GC, GH, GW), -1, 1, 41).data;
    int32_t labels[GN] = {4, 0, 2};
    data[1] = labels;
    const mr_shape ps[5] = {mr_shape_4d(GO1, GC, 3, 3), mr_shape_1d(GO1), mr_shape_4d(GO2, GO1, 3, 3),
                            mr_shape_1d(GO2), mr_shape_2d(GCLS, GO2 * 2 * 2)};
    for (int i = 0; i < 5; i++) data[2 + i] = th_rand_view(MR_F32, ps[i], -0.5, 0.5, 42 + i).data;
    for (int mixed = 0; mixed < 2; mixed++) {
        cnn plain, fused;
        cnn_build(&plain, mixed, 0);
        cnn_build(&fused, mixed, 0);
        int32_t nodes = mr_graph_num_nodes(fused.g);
        assert_int_equal(mr_graph_fuse_conv_pool(fused.g, &fused.loss, 1), 2);
        assert_int_equal(mr_graph_num_nodes(fused.g), nodes - 2);
        assert_int_equal(count_op(fused.g, MR_OP_CONV2D_MAXPOOL), 2);
        assert_int_equal(count_op(fused.g, MR_OP_MAXPOOL2D) + count_op(fused.g, MR_OP_CONV2D), 0);
        assert_int_equal(mr_graph_kind(fused.g, fused.y1), MR_VAL_FUSED);
        assert_int_equal(mr_graph_fuse_conv_pool(fused.g, &fused.loss, 1), 0); /* nothing left to fuse */
        cnn_run(&plain, data);
        cnn_run(&fused, data);
        assert_int_equal(count_op(fused.g, MR_OP_RELU_BWD), 0);
        assert_true(mr_plan_arena_bytes(fused.plan) < mr_plan_arena_bytes(plain.plan));
        const float *lp = mr_plan_data(plain.plan, plain.loss), *lf = mr_plan_data(fused.plan, fused.loss);
        assert_non_null(lp);
        assert_non_null(lf);
        assert_memory_equal(lp, lf, sizeof(float));
        for (int i = 0; i < 5; i++) {
            const void *gp = mr_plan_data(plain.plan, plain.grads[i]), *gf = mr_plan_data(fused.plan, fused.grads[i]);
            assert_non_null(gp);
            assert_non_null(gf);
            assert_memory_equal(gp, gf, (size_t)mr_shape_numel(&ps[i]) * sizeof(float));
        }
        printf("cnn %s: loss %.9g, fused and unfused bit-identical (arena %zu -> %zu bytes)\n",
               mixed ? "mixed bf16" : "f32", (double)*lf, mr_plan_arena_bytes(plain.plan),
               mr_plan_arena_bytes(fused.plan));
        cnn_free(&plain);
        cnn_free(&fused);
    }
    th_free_all();
}

/* A second reader of the conv output or a kept one stays unfused; reading or keeping a value the
 * fusion removed is an error naming it. */
static void test_graph_fuse_limits(void **state) {
    (void)state;
    cnn m;
    cnn_build(&m, 0, 1);
    assert_int_equal(mr_graph_fuse_conv_pool(m.g, &m.loss, 1), 1); /* the second layer only */
    assert_int_equal(mr_graph_kind(m.g, m.y1), MR_VAL_NODE);
    cnn_free(&m);
    cnn_build(&m, 0, 0);
    mr_val keep[2] = {m.loss, m.y1};
    assert_int_equal(mr_graph_fuse_conv_pool(m.g, keep, 2), 1);
    assert_int_equal(mr_graph_kind(m.g, m.y1), MR_VAL_NODE);
    cnn_free(&m);
    cnn_build(&m, 0, 0);
    assert_int_equal(mr_graph_fuse_conv_pool(m.g, &m.loss, 1), 2);
    mr_plan *p = NULL;
    mr_val kept[2] = {m.loss, m.y1};
    assert_int_equal(mr_plan_new(m.g, MR_DEVICE_CPU, kept, 2, &p), MR_ERR_INVALID);
    assert_null(p);
    assert_non_null(strstr(mr_last_error(), "fused"));
    (void)mr_graph_scale(m.g, m.y1, 2.0);
    assert_int_equal(mr_graph_status(m.g), MR_ERR_INVALID);
    assert_non_null(strstr(mr_graph_error(m.g), "mr_graph_fuse_conv_pool"));
    assert_int_equal(mr_graph_fuse_conv_pool(m.g, &m.loss, 1), -1); /* a graph with an error */
    cnn_free(&m);
    /* without the fused ReLU (a GPU graph builds none) nothing fuses */
    mr_graph *g = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    mr_val x = mr_graph_input(g, "x", MR_F32, mr_shape_4d(1, 1, 4, 4));
    mr_val w = mr_graph_param(g, "w", MR_F32, mr_shape_4d(2, 1, 3, 3));
    mr_val y = mr_graph_maxpool2d(g, mr_graph_conv2d(g, x, w, MR_VAL_NONE, 1, 1), 2, 2, 0);
    assert_int_equal(mr_graph_fuse_conv_pool(g, &y, 1), 0);
    mr_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_pool_f32),
        cmocka_unit_test(test_conv_pool_bf16),
        cmocka_unit_test(test_conv_pool_bwd),
        cmocka_unit_test(test_conv_pool_grad),
        cmocka_unit_test(test_conv_pool_errors),
        cmocka_unit_test(test_graph_fused_vs_unfused),
        cmocka_unit_test(test_graph_fuse_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
