/* GPU reductions, softmax, cross-entropy and layer norm against the f64 reference: SUM/MEAN/MAX
 * over every axes mask of 3-d tensors and their backward (MAX_BWD with ties, so "first" is
 * tested), ADD/SUB/MUL/DIV_BWD over broadcasting patterns, SOFTMAX/LOG_SOFTMAX (causal with
 * T < S and T == S) and their backward, SOFTMAX_XENT (ignored rows, a non-default ignore_index;
 * an out-of-range label gives NaN on the GPU) and its backward, LAYERNORM and LAYERNORM_BWD,
 * BATCHNORM and BATCHNORM_BWD (training and evaluation, 2-d to 4-d, C = 1, x = 1000 + noise, gamma,
 * beta and outputs left out), in f32 and f64. Shapes include rows of length 1, lengths that are not multiples of 32, a
 * 50257-wide row, and 70000 rows (a grid beyond 65535 row groups).
 *
 * Each case goes through gpu_check_vs_ref: the reference and the kernel see the same rounded
 * inputs, the kernel runs twice and must give the same bits, and outputs start as NaN so an
 * element a kernel fails to write is caught. Without a usable GPU the program exits 77 and CTest
 * reports it SKIPPED. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_util.h"

/* On the CUDA emulator (tests/emu/) every GPU thread is a CPU fiber: the same kernels and paths
 * with fewer rows (still thousands of row groups and grid-stride loops) and a 1024-thread row just
 * past 16384 columns instead of GPT-2's 50257. A real GPU runs the full sizes. */
#ifdef MIRROR_EMU
#define NORM_ROWS 3000
#define NORM_WIDE 16500
#else
#define NORM_ROWS 70000
#define NORM_WIDE 50257
#endif

static const mr_dtype k_dts[2] = {MR_F32, MR_F64};

static void tol(mr_dtype dt, double *atol, double *rtol, double *nmse) {
    if (dt == MR_F64) {
        *atol = GPU_F64_NORM_ATOL;
        *rtol = GPU_F64_NORM_RTOL;
        *nmse = GPU_F64_NORM_NMSE;
    } else {
        *atol = GPU_F32_NORM_ATOL;
        *rtol = GPU_F32_NORM_RTOL;
        *nmse = GPU_F32_NORM_NMSE;
    }
}

/* A reference output view that starts as NaN (so an unwritten GPU element fails). */
static mr_view nan_view(mr_shape s) {
    mr_view v = th_view(MR_F64, s);
    int64_t n = mr_shape_numel(&s);
    for (int64_t i = 0; i < n; i++) ((double *)v.data)[i] = NAN;
    return v;
}

static mr_view rand_view(mr_shape s, double lo, double hi, uint64_t seed, mr_dtype dt) {
    return gpu_f64_view(gpu_rand(mr_shape_numel(&s), lo, hi, seed, dt), s);
}

static void check(const char *what, mr_op_args *r, mr_dtype dt) {
    double atol, rtol, nmse;
    tol(dt, &atol, &rtol, &nmse);
    gpu_check_vs_ref(what, r, dt, dt, atol, rtol, nmse);
}

static const char *shape_s(const mr_shape *s, char *b, size_t n) { return mr_shape_str(s, b, n); }

/* ---- reductions ------------------------------------------------------------------------------ */

/* SUM, MEAN, MAX and their backward over `axes` of xs in dt. x holds multiples of 1/4 in
 * [-2, 2), so MAX has ties and MAX_BWD must pick the first. */
static void reduce_case(mr_dtype dt, mr_shape xs, uint32_t axes, uint64_t seed) {
    int64_t nx = mr_shape_numel(&xs);
    mr_shape ys = xs;
    for (int d = 0; d < xs.ndim; d++)
        if (axes & (1u << d)) ys.dim[d] = 1;
    double *hx = gpu_rand(nx, -2, 2, seed, dt);
    for (int64_t i = 0; i < nx; i++) hx[i] = floor(hx[i] * 4.0) / 4.0;
    char what[200], sb[64];
    const mr_op_id fwd[3] = {MR_OP_SUM, MR_OP_MEAN, MR_OP_MAX};
    const mr_op_id bwd[3] = {MR_OP_SUM_BWD, MR_OP_MEAN_BWD, MR_OP_MAX_BWD};
    for (int o = 0; o < 3; o++) {
        mr_op_args r;
        mr_op_args_init(&r, fwd[o]);
        r.p.reduce.axes = axes;
        r.in[0] = gpu_f64_view(hx, xs);
        r.out[0] = nan_view(ys);
        snprintf(what, sizeof what, "%s %s x%s axes 0x%x", mr_op_get(fwd[o])->name, mr_dtype_name(dt),
                 shape_s(&xs, sb, sizeof sb), (unsigned)axes);
        check(what, &r, dt);
        const double *hy = r.out[0].data; /* the reference forward output */

        mr_op_args b;
        mr_op_args_init(&b, bwd[o]);
        b.p.reduce.axes = axes;
        mr_view dy = rand_view(ys, -1, 1, seed + 10 + (uint64_t)o, dt);
        if (bwd[o] == MR_OP_MAX_BWD) {
            b.in[0] = gpu_f64_view(hx, xs);
            b.in[1] = gpu_f64_view(hy, ys);
            b.in[2] = dy;
        } else {
            b.in[0] = dy;
        }
        b.out[0] = nan_view(xs);
        snprintf(what, sizeof what, "%s %s x%s axes 0x%x", mr_op_get(bwd[o])->name, mr_dtype_name(dt),
                 shape_s(&xs, sb, sizeof sb), (unsigned)axes);
        check(what, &b, dt);
    }
    gpu_free_all();
}

/* SUM and MEAN of an empty tensor (a dim of 0): every output element reduces an empty set, so
 * SUM is 0 and MEAN NaN (the fill kernel; MAX of nothing is refused by the check). Found by the
 * emulator's kernel census: no test reached that kernel. */
static void test_reduce_empty(void **state) {
    (void)state;
    const mr_op_id ops[2] = {MR_OP_SUM, MR_OP_MEAN};
    for (int d = 0; d < 2; d++)
        for (int o = 0; o < 2; o++) {
            mr_op_args r;
            mr_op_args_init(&r, ops[o]);
            r.p.reduce.axes = 0x2;
            mr_view x = th_view(MR_F64, mr_shape_1d(1)); /* a real pointer for the 0 elements */
            x.shape = mr_shape_2d(3, 0);
            r.in[0] = x;
            r.out[0] = nan_view(mr_shape_2d(3, 1));
            char what[96];
            snprintf(what, sizeof what, "%s %s of a (3,0) tensor", mr_op_get(ops[o])->name, mr_dtype_name(k_dts[d]));
            check(what, &r, k_dts[d]);
            const double *y = r.out[0].data;
            for (int i = 0; i < 3; i++) assert_true(ops[o] == MR_OP_SUM ? y[i] == 0.0 : isnan(y[i]));
            gpu_free_all();
        }
}

static void test_reduce(void **state) {
    (void)state;
    uint64_t seed = 100;
    for (int d = 0; d < 2; d++) {
        /* every axes combination of 3-d tensors: short rows, rows of 300 (the 64-lane column
         * kernel), a dim of 1 */
        const mr_shape s3[3] = {mr_shape_3d(5, 7, 33), mr_shape_3d(3, 300, 41), mr_shape_3d(4, 1, 37)};
        for (int si = 0; si < 3; si++)
            for (uint32_t axes = 0; axes < 8; axes++) reduce_case(k_dts[d], s3[si], axes, seed++);
        reduce_case(k_dts[d], mr_shape_2d(NORM_ROWS, 3), 0x2, seed++);  /* NORM_ROWS row groups */
        reduce_case(k_dts[d], mr_shape_2d(NORM_ROWS, 3), 0x1, seed++);  /* long column sums */
        reduce_case(k_dts[d], mr_shape_2d(3, 20000), 0x2, seed++);  /* 1024-thread rows */
        reduce_case(k_dts[d], mr_shape_1d(1), 0x1, seed++);
        reduce_case(k_dts[d], mr_shape_4d(2, 3, 4, 5), 0x5, seed++); /* alternating runs */
        reduce_case(k_dts[d], mr_shape_4d(2, 3, 4, 5), 0xa, seed++);
    }
    gpu_free_all();
}

/* ---- binary backward --------------------------------------------------------------------------- */

/* dy has the broadcast shape of a and b; DIV's b stays away from 0. omit: 1 drops da, 2 drops db;
 * ADD/SUB also run without a's and b's data (they read only the shapes). */
static void binary_bwd_case(mr_dtype dt, mr_op_id op, mr_shape sa, mr_shape sb, int omit, uint64_t seed) {
    mr_shape so;
    MR_ASSERT_OK(mr_shape_broadcast(&sa, &sb, &so));
    mr_op_args r;
    mr_op_args_init(&r, op);
    int reads_ab = op == MR_OP_MUL_BWD || op == MR_OP_DIV_BWD;
    r.in[0] = rand_view(sa, -2, 2, seed, dt);
    r.in[1] = op == MR_OP_DIV_BWD ? rand_view(sb, 0.5, 2, seed + 1, dt) : rand_view(sb, -2, 2, seed + 1, dt);
    if (!reads_ab && omit == 0) r.in[0].data = r.in[1].data = NULL;
    r.in[2] = rand_view(so, -1, 1, seed + 2, dt);
    r.out[0] = nan_view(sa);
    r.out[1] = nan_view(sb);
    if (omit == 1) r.out[0].data = NULL;
    if (omit == 2) r.out[1].data = NULL;
    char what[200], b1[64], b2[64];
    snprintf(what, sizeof what, "%s %s a%s b%s omit %d", mr_op_get(op)->name, mr_dtype_name(dt),
             shape_s(&sa, b1, sizeof b1), shape_s(&sb, b2, sizeof b2), omit);
    check(what, &r, dt);
    gpu_free_all();
}

static void test_binary_bwd(void **state) {
    (void)state;
    const mr_op_id ops[4] = {MR_OP_ADD_BWD, MR_OP_SUB_BWD, MR_OP_MUL_BWD, MR_OP_DIV_BWD};
    const struct { mr_shape a, b; } pats[] = {
        {mr_shape_2d(4, 33), mr_shape_2d(4, 33)},          /* same shape: nothing summed */
        {mr_shape_2d(300, 40), mr_shape_1d(40)},           /* bias: summed over 300 rows */
        {mr_shape_2d(37, 1), mr_shape_2d(37, 53)},         /* column broadcast: summed over rows' length */
        {mr_shape_1d(1), mr_shape_2d(6, 7)},               /* scalar */
        {mr_shape_3d(5, 1, 7), mr_shape_3d(1, 3, 7)},      /* both broadcast */
        {mr_shape_3d(2, 3, 45), mr_shape_2d(3, 1)},        /* inner and outer dims summed */
        {mr_shape_2d(NORM_ROWS, 3), mr_shape_1d(3)},           /* long sums, large grid for a */
        {mr_shape_2d(2, 5000), mr_shape_2d(2, 1)},         /* 256-thread row sums */
    };
    uint64_t seed = 2000;
    for (int d = 0; d < 2; d++)
        for (int o = 0; o < 4; o++)
            for (size_t p = 0; p < sizeof pats / sizeof *pats; p++) {
                binary_bwd_case(k_dts[d], ops[o], pats[p].a, pats[p].b, 0, seed);
                binary_bwd_case(k_dts[d], ops[o], pats[p].b, pats[p].a, 0, seed + 3);
                seed += 6;
            }
    binary_bwd_case(MR_F32, MR_OP_MUL_BWD, mr_shape_2d(30, 40), mr_shape_1d(40), 1, seed++);
    binary_bwd_case(MR_F32, MR_OP_DIV_BWD, mr_shape_2d(30, 40), mr_shape_1d(40), 2, seed++);
    binary_bwd_case(MR_F32, MR_OP_SUB_BWD, mr_shape_2d(30, 40), mr_shape_1d(40), 1, seed++);
    gpu_free_all();
}

/* ---- softmax ----------------------------------------------------------------------------------- */

/* SOFTMAX or LOG_SOFTMAX (causal only for SOFTMAX) of x (s) and the backward at its output. */
static void softmax_case(mr_dtype dt, mr_op_id op, mr_shape s, int causal, uint64_t seed) {
    mr_op_args r;
    mr_op_args_init(&r, op);
    r.p.softmax.causal = causal;
    r.in[0] = rand_view(s, -5, 5, seed, dt);
    r.out[0] = nan_view(s);
    char what[200], sb[64];
    snprintf(what, sizeof what, "%s %s x%s causal %d", mr_op_get(op)->name, mr_dtype_name(dt), shape_s(&s, sb, sizeof sb),
             causal);
    check(what, &r, dt);

    mr_op_id bop = op == MR_OP_SOFTMAX ? MR_OP_SOFTMAX_BWD : MR_OP_LOG_SOFTMAX_BWD;
    mr_op_args b;
    mr_op_args_init(&b, bop);
    b.in[0] = r.out[0]; /* the reference forward output (rounded to dt by the check) */
    b.in[1] = rand_view(s, -1, 1, seed + 1, dt);
    b.out[0] = nan_view(s);
    snprintf(what, sizeof what, "%s %s y%s causal %d", mr_op_get(bop)->name, mr_dtype_name(dt), shape_s(&s, sb, sizeof sb),
             causal);
    check(what, &b, dt);
    gpu_free_all();
}

static void test_softmax(void **state) {
    (void)state;
    const mr_shape shapes[] = {mr_shape_2d(1, 1),     mr_shape_2d(3, 1),    mr_shape_2d(5, 33),
                               mr_shape_3d(2, 7, 1000), mr_shape_2d(3, 1500), mr_shape_2d(2, NORM_WIDE),
                               mr_shape_2d(NORM_ROWS, 5), mr_shape_2d(4, 20000)};
    uint64_t seed = 3000;
    for (int d = 0; d < 2; d++) {
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
            softmax_case(k_dts[d], MR_OP_SOFTMAX, shapes[i], 0, seed++);
            softmax_case(k_dts[d], MR_OP_LOG_SOFTMAX, shapes[i], 0, seed++);
        }
        /* causal: (..., T, S) with T < S and T == S, short and long rows */
        softmax_case(k_dts[d], MR_OP_SOFTMAX, mr_shape_4d(2, 3, 5, 7), 1, seed++);
        softmax_case(k_dts[d], MR_OP_SOFTMAX, mr_shape_3d(2, 4, 4), 1, seed++);
        softmax_case(k_dts[d], MR_OP_SOFTMAX, mr_shape_3d(3, 40, 300), 1, seed++);
        softmax_case(k_dts[d], MR_OP_SOFTMAX, mr_shape_3d(1, 30, 2000), 1, seed++);
        softmax_case(k_dts[d], MR_OP_SOFTMAX, mr_shape_2d(1, 1), 1, seed++);
    }
    gpu_free_all();
}

/* ---- cross-entropy ----------------------------------------------------------------------------- */

/* SOFTMAX_XENT of (n, c) logits with labels in [0, c), every 5th row ignored, and its backward
 * at the reference probabilities. */
static void xent_case(mr_dtype dt, int64_t n, int64_t c, int64_t ignore, uint64_t seed) {
    mr_shape s = mr_shape_2d(n, c), sn = mr_shape_1d(n);
    mr_view lab = th_view(MR_I32, sn);
    int32_t *pl = lab.data;
    th_fill_int32(pl, n, 0, (int32_t)c, seed);
    for (int64_t i = 0; i < n; i += 5) pl[i] = (int32_t)ignore;
    mr_op_args r;
    mr_op_args_init(&r, MR_OP_SOFTMAX_XENT);
    r.p.xent.ignore_index = ignore;
    r.in[0] = rand_view(s, -6, 6, seed + 1, dt);
    r.in[1] = lab;
    r.out[0] = nan_view(sn);
    r.out[1] = nan_view(s);
    char what[200];
    snprintf(what, sizeof what, "softmax_xent %s (%lld,%lld) ignore %lld", mr_dtype_name(dt), (long long)n,
             (long long)c, (long long)ignore);
    check(what, &r, dt);

    mr_op_args b;
    mr_op_args_init(&b, MR_OP_SOFTMAX_XENT_BWD);
    b.p.xent.ignore_index = ignore;
    b.in[0] = r.out[1];
    b.in[1] = lab;
    b.in[2] = rand_view(sn, -1, 1, seed + 2, dt);
    b.out[0] = nan_view(s);
    snprintf(what, sizeof what, "softmax_xent_bwd %s (%lld,%lld) ignore %lld", mr_dtype_name(dt), (long long)n,
             (long long)c, (long long)ignore);
    check(what, &b, dt);
    gpu_free_all();
}

/* A label outside [0, C) that is not ignore_index: the GPU cannot refuse it without a sync, so
 * that row's loss and gradient are NaN and the other rows are unaffected. */
/* The CPU's half probabilities and gradients (core/ops.h SOFTMAX, SOFTMAX_BWD) are refused by the
 * CUDA kernels by name, never written as f32 into half tensors. */
static void test_softmax_half_refused(void **state) {
    (void)state;
    const mr_shape s = mr_shape_2d(4, 8);
    mr_tensor *x = gpu_upload(gpu_rand(32, -1, 1, 2100, MR_F32), MR_F32, s), *yh = gpu_alloc(MR_BF16, s);
    mr_tensor *dy = gpu_upload(gpu_rand(32, -1, 1, 2101, MR_F32), MR_F32, s), *dx = gpu_alloc(MR_F32, s);
    mr_op_args f;
    mr_op_args_init(&f, MR_OP_SOFTMAX);
    f.in[0] = mr_tensor_as_view(x);
    f.out[0] = mr_tensor_as_view(yh);
    mr_status st = mr_op_run(MR_DEVICE_CUDA, &f);
    printf("softmax f32 -> bf16 on cuda:0: %s: %s\n", mr_status_name(st), mr_last_error());
    assert_int_equal(st, MR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mr_last_error(), "y (out[0]) is bf16"));
    mr_op_args b;
    mr_op_args_init(&b, MR_OP_SOFTMAX_BWD);
    b.in[0] = mr_tensor_as_view(yh);
    b.in[1] = mr_tensor_as_view(dy);
    b.out[0] = mr_tensor_as_view(dx);
    st = mr_op_run(MR_DEVICE_CUDA, &b);
    assert_int_equal(st, MR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mr_last_error(), "softmax_bwd: y (in[0]) is bf16"));
    gpu_free_all();
}

static void test_xent_bad_label(void **state) {
    (void)state;
    const int64_t n = 3, c = 10;
    mr_shape s = mr_shape_2d(n, c), sn = mr_shape_1d(n);
    double *hx = gpu_rand(n * c, -3, 3, 4100, MR_F32);
    double hl[3] = {2, 10, -1};
    mr_tensor *x = gpu_upload(hx, MR_F32, s), *lab = gpu_upload(hl, MR_I32, sn);
    mr_tensor *loss = gpu_alloc(MR_F32, sn), *probs = gpu_alloc(MR_F32, s), *dx = gpu_alloc(MR_F32, s);
    double ones[3] = {1, 1, 1};
    mr_tensor *dl = gpu_upload(ones, MR_F32, sn);
    mr_op_args g;
    mr_op_args_init(&g, MR_OP_SOFTMAX_XENT);
    g.in[0] = mr_tensor_as_view(x);
    g.in[1] = mr_tensor_as_view(lab);
    g.out[0] = mr_tensor_as_view(loss);
    g.out[1] = mr_tensor_as_view(probs);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CUDA, &g));
    double *hloss = gpu_download(loss);
    assert_true(isfinite(hloss[0]));
    assert_true(isnan(hloss[1]));
    assert_true(isnan(hloss[2]));
    mr_op_args b;
    mr_op_args_init(&b, MR_OP_SOFTMAX_XENT_BWD);
    b.in[0] = mr_tensor_as_view(probs);
    b.in[1] = mr_tensor_as_view(lab);
    b.in[2] = mr_tensor_as_view(dl);
    b.out[0] = mr_tensor_as_view(dx);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CUDA, &b));
    double *hdx = gpu_download(dx);
    for (int64_t j = 0; j < c; j++) {
        assert_true(isfinite(hdx[j]));
        assert_true(isnan(hdx[c + j]));
        assert_true(isnan(hdx[2 * c + j]));
    }
    gpu_free_all();
}

static void test_xent(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{1, 1}, {4, 7}, {5, 33}, {3, 1000}, {4, NORM_WIDE}, {NORM_ROWS, 3}, {2, 20000}};
    uint64_t seed = 4000;
    for (int d = 0; d < 2; d++) {
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            xent_case(k_dts[d], shapes[i][0], shapes[i][1], -100, seed += 3);
        xent_case(k_dts[d], 9, 5, 2, seed += 3); /* an ignore_index inside [0, C) */
    }
    gpu_free_all();
}

/* ---- layer norm -------------------------------------------------------------------------------- */

/* LAYERNORM of x (s, last dim D) and LAYERNORM_BWD at the reference mean and rstd; with_dgb 0
 * omits dgamma and dbeta. x has an offset so the mean matters. */
static void layernorm_case(mr_dtype dt, mr_shape s, int with_dgb, uint64_t seed) {
    int64_t d = s.dim[s.ndim - 1];
    mr_shape sd = mr_shape_1d(d), sr = s;
    sr.ndim--;
    sr.dim[sr.ndim] = 0;
    mr_op_args r;
    mr_op_args_init(&r, MR_OP_LAYERNORM);
    r.p.layernorm.eps = 1e-5;
    r.in[0] = rand_view(s, 1, 4, seed, dt);
    r.in[1] = rand_view(sd, 0.5, 1.5, seed + 1, dt);
    r.in[2] = rand_view(sd, -1, 1, seed + 2, dt);
    r.out[0] = nan_view(s);
    r.out[1] = nan_view(sr);
    r.out[2] = nan_view(sr);
    char what[200], sb[64];
    snprintf(what, sizeof what, "layernorm %s x%s", mr_dtype_name(dt), shape_s(&s, sb, sizeof sb));
    check(what, &r, dt);

    mr_op_args b;
    mr_op_args_init(&b, MR_OP_LAYERNORM_BWD);
    b.in[0] = r.in[0];
    b.in[1] = r.in[1];
    b.in[2] = r.out[1];
    b.in[3] = r.out[2];
    b.in[4] = rand_view(s, -1, 1, seed + 3, dt);
    b.out[0] = nan_view(s);
    b.out[1] = nan_view(sd);
    b.out[2] = nan_view(sd);
    if (!with_dgb) b.out[1].data = b.out[2].data = NULL;
    snprintf(what, sizeof what, "layernorm_bwd %s x%s dgamma/dbeta %d", mr_dtype_name(dt), shape_s(&s, sb, sizeof sb),
             with_dgb);
    check(what, &b, dt);
    gpu_free_all();
}

static void test_layernorm(void **state) {
    (void)state;
    const mr_shape shapes[] = {mr_shape_2d(1, 1),     mr_shape_2d(3, 1),    mr_shape_2d(5, 33),
                               mr_shape_2d(4, 768),   mr_shape_2d(3, 1500), mr_shape_2d(2, 20000),
                               mr_shape_2d(NORM_ROWS, 3), mr_shape_3d(3, 4, 50), mr_shape_2d(1000, 72)};
    uint64_t seed = 5000;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) layernorm_case(k_dts[d], shapes[i], 1, seed += 4);
    layernorm_case(MR_F32, mr_shape_2d(6, 100), 0, seed += 4);
    gpu_free_all();
}

/* ---- batch norm ------------------------------------------------------------------------------- */

/* BATCHNORM of x (s, channels dim 1) in training or evaluation, with or without gamma/beta, and
 * BATCHNORM_BWD at the reference's statistics (training) or the running ones (evaluation) with the
 * outputs in `want` (bit i: output i). lo/hi: x's range (999.5..1000.5 shows the variance is
 * computed stably). */
static void batchnorm_case(mr_dtype dt, mr_shape s, int training, int affine, int want, double lo, double hi,
                           uint64_t seed) {
    mr_shape sc = mr_shape_1d(s.dim[1]);
    mr_op_args r;
    mr_op_args_init(&r, MR_OP_BATCHNORM);
    r.p.batchnorm.eps = 1e-5;
    r.p.batchnorm.training = training;
    r.in[0] = rand_view(s, lo, hi, seed, dt);
    if (affine) {
        r.in[1] = rand_view(sc, 0.5, 1.5, seed + 1, dt);
        r.in[2] = rand_view(sc, -1, 1, seed + 2, dt);
    }
    r.in[3] = rand_view(sc, lo, hi, seed + 3, dt);
    r.in[4] = rand_view(sc, 0.05, 0.5, seed + 4, dt);
    r.out[0] = nan_view(s);
    r.out[1] = nan_view(sc);
    r.out[2] = nan_view(sc);
    char what[200], sb[64];
    snprintf(what, sizeof what, "batchnorm %s x%s training %d affine %d x in [%g, %g)", mr_dtype_name(dt),
             shape_s(&s, sb, sizeof sb), training, affine, lo, hi);
    check(what, &r, dt);

    mr_op_args b;
    mr_op_args_init(&b, MR_OP_BATCHNORM_BWD);
    b.p = r.p;
    b.in[0] = rand_view(s, -1, 1, seed + 5, dt);
    b.in[1] = r.in[0];
    b.in[2] = r.in[1];
    b.in[3] = training ? r.out[1] : r.in[3];
    b.in[4] = training ? r.out[2] : r.in[4];
    if (want & 1) b.out[0] = nan_view(s);
    if (want & 2) b.out[1] = nan_view(sc);
    if (want & 4) b.out[2] = nan_view(sc);
    snprintf(what, sizeof what, "batchnorm_bwd %s x%s training %d affine %d outputs %d", mr_dtype_name(dt),
             shape_s(&s, sb, sizeof sb), training, affine, want);
    check(what, &b, dt);
    gpu_free_all();
}

static void test_batchnorm(void **state) {
    (void)state;
    const mr_shape shapes[] = {mr_shape_2d(4, 3),         mr_shape_2d(1, 1),         mr_shape_3d(5, 3, 7),
                               mr_shape_4d(3, 4, 5, 6),   mr_shape_4d(2, 1, 33, 33), mr_shape_2d(NORM_ROWS, 2),
                               mr_shape_4d(4, 70, 3, 3)};
    uint64_t seed = 7000;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            for (int training = 0; training < 2; training++) {
                if (training && mr_shape_numel(&shapes[i]) / shapes[i].dim[1] < 2) continue; /* M = 1: dx = 0 */
                batchnorm_case(k_dts[d], shapes[i], training, 1, 7, -2, 2, seed += 6);
            }
    /* |mean| >> std, no gamma/beta, and outputs left out */
    batchnorm_case(MR_F32, mr_shape_4d(6, 3, 10, 10), 1, 1, 7, 999.5, 1000.5, seed += 6);
    batchnorm_case(MR_F32, mr_shape_4d(6, 3, 10, 10), 0, 1, 7, 999.5, 1000.5, seed += 6);
    batchnorm_case(MR_F32, mr_shape_3d(5, 4, 9), 1, 0, 1, -2, 2, seed += 6);
    batchnorm_case(MR_F32, mr_shape_3d(5, 4, 9), 1, 1, 6, -2, 2, seed += 6);
    batchnorm_case(MR_F64, mr_shape_3d(5, 4, 9), 0, 0, 2, -2, 2, seed += 6);
    /* evaluation without the mean and var outputs */
    mr_op_args r;
    mr_op_args_init(&r, MR_OP_BATCHNORM);
    r.p.batchnorm.eps = 1e-3;
    mr_shape s = mr_shape_3d(3, 5, 4), sc = mr_shape_1d(5);
    r.in[0] = rand_view(s, -2, 2, seed + 1, MR_F32);
    r.in[3] = rand_view(sc, -1, 1, seed + 2, MR_F32);
    r.in[4] = rand_view(sc, 0.5, 2, seed + 3, MR_F32);
    r.out[0] = nan_view(s);
    check("batchnorm f32 evaluation without mean/var outputs", &r, MR_F32);
    gpu_free_all();
}

int main(void) {
    if (gpu_none()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce), cmocka_unit_test(test_reduce_empty),  cmocka_unit_test(test_binary_bwd),     cmocka_unit_test(test_softmax), cmocka_unit_test(test_softmax_half_refused),
        cmocka_unit_test(test_xent),    cmocka_unit_test(test_xent_bad_label), cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_batchnorm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
