/* GPU ops against the f64 reference: GEMM (transposes, batching, shared B, alpha/beta; f32,
 * bf16, f16; the bias/GELU epilogue with and without the saved pre-activation; TF32), every unary forward and backward op, binary ops with broadcasting, every cast pair,
 * SGD and AdamW; plus the CUDA backend table itself (alloc/copy round trip, zero-fill, ordering
 * of two streams through an event, ops on an explicit stream).
 *
 * Inputs are drawn in f64, rounded to the GPU dtype, and the reference runs on those rounded
 * values, so only the kernel's own error is measured. Without a usable GPU the program exits 77
 * and CTest reports it SKIPPED. Built in every configuration: it uses only mirror's public API. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_util.h"
#include "optim/optim.h"

/* n NaNs: outputs start as NaN so an element a kernel fails to write shows up. */
static double *nan_vals(int64_t n) {
    double *x = th_alloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* ---- GEMM ------------------------------------------------------------------------------------- */

static void gemm_tol(mr_dtype dt, double *atol, double *rtol, double *nmse) {
    switch (dt) {
    case MR_BF16: *atol = GPU_BF16_GEMM_ATOL; *rtol = GPU_BF16_GEMM_RTOL; *nmse = GPU_BF16_GEMM_NMSE; break;
    case MR_F16: *atol = GPU_F16_GEMM_ATOL; *rtol = GPU_F16_GEMM_RTOL; *nmse = GPU_F16_GEMM_NMSE; break;
    default: *atol = TOL_F32_REDUCE_ATOL; *rtol = TOL_F32_REDUCE_RTOL; *nmse = TOL_F32_REDUCE_NMSE; break;
    }
}

/* One GEMM on the GPU in dt against the reference. batch > 1 adds a leading batch dim; shared_b
 * keeps B 2-d. c_nan fills C with NaN first (with beta == 0 it must not be read). */
static void gemm_case(mr_dtype dt, int64_t batch, int64_t m, int64_t n, int64_t k, int ta, int tb, int shared_b,
                      double alpha, double beta, int c_nan, uint64_t seed) {
    int bat = batch > 1, bb = bat && !shared_b;
    mr_shape sa = ta ? (bat ? mr_shape_3d(batch, k, m) : mr_shape_2d(k, m)) : (bat ? mr_shape_3d(batch, m, k) : mr_shape_2d(m, k));
    mr_shape sb = tb ? (bb ? mr_shape_3d(batch, n, k) : mr_shape_2d(n, k)) : (bb ? mr_shape_3d(batch, k, n) : mr_shape_2d(k, n));
    mr_shape sc = bat ? mr_shape_3d(batch, m, n) : mr_shape_2d(m, n);
    int64_t na = mr_shape_numel(&sa), nb = mr_shape_numel(&sb), nc = mr_shape_numel(&sc);
    double *ha = gpu_rand(na, -1, 1, seed, dt), *hb = gpu_rand(nb, -1, 1, seed + 1, dt);
    double *hc = gpu_rand(nc, -1, 1, seed + 2, dt);
    if (c_nan)
        for (int64_t i = 0; i < nc; i++) hc[i] = NAN;
    mr_tensor *ta_ = gpu_upload(ha, dt, sa), *tb_ = gpu_upload(hb, dt, sb), *tc = gpu_upload(hc, dt, sc);
    mr_op_args g, r;
    mr_op_args_init(&g, MR_OP_GEMM);
    g.p.gemm = (mr_gemm_params){ta, tb, alpha, beta, 0, 0};
    r = g;
    g.in[0] = mr_tensor_as_view(ta_);
    g.in[1] = mr_tensor_as_view(tb_);
    g.out[0] = mr_tensor_as_view(tc);
    r.in[0] = gpu_f64_view(ha, sa);
    r.in[1] = gpu_f64_view(hb, sb);
    r.out[0] = gpu_f64_view(hc, sc);
    gpu_run_op(&g);
    MR_ASSERT_OK(mr_op_run_ref(&r));
    double atol, rtol, nmse;
    gemm_tol(dt, &atol, &rtol, &nmse);
    char what[200];
    snprintf(what, sizeof what, "gpu gemm %s b%lld m%lld n%lld k%lld ta%d tb%d shared%d alpha%g beta%g nan%d",
             mr_dtype_name(dt), (long long)batch, (long long)m, (long long)n, (long long)k, ta, tb, shared_b, alpha,
             beta, c_nan);
    assert_true(th_compare(what, gpu_download(tc), MR_F64, r.out[0].data, nc, atol, rtol, nmse));
    gpu_free_all();
}

static void test_gemm(void **state) {
    (void)state;
    const mr_dtype dts[3] = {MR_F32, MR_BF16, MR_F16};
    uint64_t seed = 100;
    for (int d = 0; d < 3; d++) {
        for (int t = 0; t < 4; t++) {
            int ta = t & 1, tb = t >> 1;
            gemm_case(dts[d], 1, 37, 53, 29, ta, tb, 0, 1.0, 0.0, 0, seed++);
            gemm_case(dts[d], 1, 1, 1, 1, ta, tb, 0, 1.0, 0.0, 0, seed++);
            gemm_case(dts[d], 1, 64, 128, 256, ta, tb, 0, 1.0, 0.0, 0, seed++);
            gemm_case(dts[d], 3, 17, 9, 33, ta, tb, 0, 0.5, 0.0, 0, seed++);      /* batched */
            gemm_case(dts[d], 4, 13, 21, 8, ta, tb, 1, 1.0, 0.0, 0, seed++);      /* shared B */
            gemm_case(dts[d], 2, 19, 23, 31, ta, tb, 0, 0.7, 0.3, 0, seed++);     /* alpha, beta */
            gemm_case(dts[d], 2, 19, 23, 31, ta, tb, 1, -1.5, 2.0, 0, seed++);    /* shared B, beta */
            gemm_case(dts[d], 1, 16, 16, 16, ta, tb, 0, 1.0, 0.0, 1, seed++);     /* beta 0 ignores C */
        }
        gemm_case(dts[d], 1, 8, 8, 0, 0, 0, 0, 1.0, 0.5, 0, seed++);              /* k = 0: C = beta C */
    }
    /* f64 runs through DGEMM */
    gemm_case(MR_F64, 2, 33, 17, 65, 1, 0, 0, 1.0, 0.5, 0, seed++);
}

/* The fused epilogue: bias, GELU, the saved pre-activation, TF32. A and B in dt, C, bias and pre
 * in out_dt; C and pre start as NaN. Runs twice (bits must match: determinism) and compares C
 * and pre with the reference. n % 8 != 0 with pre takes the fallback (GEMM into pre, then the
 * epilogue kernel); n % 8 == 0 the fused cuBLASLt epilogue. */
typedef struct epi_case {
    mr_dtype dt, out_dt;
    int64_t batch, m, n, k;
    int ta, tb, shared_b, bias, gelu, pre, tf32;
    double alpha, beta;
} epi_case;

static void gemm_epi_case(const epi_case *c, uint64_t seed) {
    int bat = c->batch > 1, bb = bat && !c->shared_b;
    int64_t batch = c->batch, m = c->m, n = c->n, k = c->k;
    mr_shape sa = c->ta ? (bat ? mr_shape_3d(batch, k, m) : mr_shape_2d(k, m)) : (bat ? mr_shape_3d(batch, m, k) : mr_shape_2d(m, k));
    mr_shape sb = c->tb ? (bb ? mr_shape_3d(batch, n, k) : mr_shape_2d(n, k)) : (bb ? mr_shape_3d(batch, k, n) : mr_shape_2d(k, n));
    mr_shape sc = bat ? mr_shape_3d(batch, m, n) : mr_shape_2d(m, n), sn = mr_shape_1d(n);
    int64_t na = mr_shape_numel(&sa), nb = mr_shape_numel(&sb), nc = mr_shape_numel(&sc);
    double *ha = gpu_rand(na, -1, 1, seed, c->dt), *hb = gpu_rand(nb, -1, 1, seed + 1, c->dt);
    double *hbias = gpu_rand(n, -1, 1, seed + 2, c->out_dt);
    double *hc = c->beta != 0.0 ? gpu_rand(nc, -1, 1, seed + 3, c->out_dt) : nan_vals(nc);
    mr_tensor *ta_ = gpu_upload(ha, c->dt, sa), *tb_ = gpu_upload(hb, c->dt, sb);
    mr_tensor *tbias = gpu_upload(hbias, c->out_dt, sn);
    mr_op_args g, r;
    mr_op_args_init(&g, MR_OP_GEMM);
    g.p.gemm = (mr_gemm_params){c->ta, c->tb, c->alpha, c->beta, c->gelu ? MR_GEMM_EPI_GELU : MR_GEMM_EPI_NONE, c->tf32};
    r = g;
    g.in[0] = mr_tensor_as_view(ta_);
    g.in[1] = mr_tensor_as_view(tb_);
    r.in[0] = gpu_f64_view(ha, sa);
    r.in[1] = gpu_f64_view(hb, sb);
    r.out[0] = gpu_f64_view(hc, sc);
    if (c->bias) {
        g.in[2] = mr_tensor_as_view(tbias);
        r.in[2] = gpu_f64_view(hbias, sn);
    }
    if (c->pre) r.out[1] = gpu_f64_view(nan_vals(nc), sc);
    double *outs[2][2] = {{NULL, NULL}, {NULL, NULL}};
    for (int run = 0; run < 2; run++) {
        mr_tensor *tc = gpu_upload(hc, c->out_dt, sc), *tp = gpu_upload(nan_vals(nc), c->out_dt, sc);
        g.out[0] = mr_tensor_as_view(tc);
        if (c->pre) g.out[1] = mr_tensor_as_view(tp);
        gpu_run_op(&g);
        outs[run][0] = gpu_download(tc);
        if (c->pre) outs[run][1] = gpu_download(tp);
    }
    MR_ASSERT_OK(mr_op_run_ref(&r));
    double atol, rtol, nmse;
    gemm_tol(c->dt, &atol, &rtol, &nmse);
    if (c->dt == MR_F32 && c->tf32) {
        atol = GPU_TF32_GEMM_ATOL; rtol = GPU_TF32_GEMM_RTOL; nmse = GPU_TF32_GEMM_NMSE;
    } else if (c->dt == MR_F32 && c->gelu) {
        atol = GPU_F32_GEMM_GELU_ATOL; rtol = GPU_F32_GEMM_GELU_RTOL; nmse = GPU_F32_GEMM_GELU_NMSE;
    } else if (c->dt == MR_F64) {
        atol = 1e-12; rtol = 1e-10; nmse = 1e-20;
    }
    char what[240];
    snprintf(what, sizeof what, "gpu gemm epilogue %s->%s b%lld m%lld n%lld k%lld ta%d tb%d shared%d bias%d gelu%d "
             "pre%d tf32%d alpha%g beta%g", mr_dtype_name(c->dt), mr_dtype_name(c->out_dt), (long long)batch,
             (long long)m, (long long)n, (long long)k, c->ta, c->tb, c->shared_b, c->bias, c->gelu, c->pre, c->tf32,
             c->alpha, c->beta);
    for (int o = 0; o < (c->pre ? 2 : 1); o++) {
        for (int64_t i = 0; i < nc; i++)
            if (memcmp(&outs[0][o][i], &outs[1][o][i], sizeof(double)) != 0)
                fail_msg("%s: out[%d]: two GPU runs differ at %lld: %.9g vs %.9g (not deterministic)", what, o,
                         (long long)i, outs[0][o][i], outs[1][o][i]);
        assert_true(th_compare(what, outs[0][o], MR_F64, r.out[o].data, nc, atol, rtol, nmse));
    }
    gpu_free_all();
}

static void test_gemm_epilogue(void **state) {
    (void)state;
    uint64_t seed = 700;
    const int64_t ns[2] = {48, 53}; /* fused GELU_AUX (ld % 8 == 0) and the fallback kernel */
    for (int ni = 0; ni < 2; ni++)
        for (int v = 0; v < 5; v++) {
            /* bias; GELU; GELU + pre; bias + GELU; bias + GELU + pre */
            int bias = v == 0 || v >= 3, gelu = v >= 1, pre = v == 2 || v == 4;
            for (int t = 0; t < 4; t++) {
                epi_case c = {MR_F32, MR_F32, 1, 37, ns[ni], 29, t & 1, t >> 1, 0, bias, gelu, pre, 0, 1.0, 0.0};
                gemm_epi_case(&c, seed++);
            }
            epi_case batched = {MR_F32, MR_F32, 3, 17, ns[ni], 33, 0, 1, 0, bias, gelu, pre, 0, 0.5, 0.0};
            gemm_epi_case(&batched, seed++);
            epi_case shared = {MR_F32, MR_F32, 4, 13, ns[ni], 8, 0, 1, 1, bias, gelu, pre, 0, 1.0, 0.0};
            gemm_epi_case(&shared, seed++);
            epi_case shared_t = {MR_F32, MR_F32, 4, 13, ns[ni], 8, 1, 0, 1, bias, gelu, pre, 0, 1.0, 0.0};
            gemm_epi_case(&shared_t, seed++); /* a shared B with A transposed: stride-0 batches */
            /* mixed precision: half A and B, f32 C, bias and pre (what mr_graph_linear builds) */
            epi_case bf = {MR_BF16, MR_F32, 1, 64, ns[ni], 96, 0, 1, 0, bias, gelu, pre, 0, 1.0, 0.0};
            gemm_epi_case(&bf, seed++);
            epi_case hf = {MR_F16, MR_F32, 2, 24, ns[ni], 40, 0, 1, 0, bias, gelu, pre, 0, 1.0, 0.0};
            gemm_epi_case(&hf, seed++);
            /* all in bf16 (C, bias and pre too) */
            epi_case bb = {MR_BF16, MR_BF16, 1, 32, ns[ni], 64, 0, 1, 0, bias, gelu, pre, 0, 1.0, 0.0};
            gemm_epi_case(&bb, seed++);
            /* f64: DGEMM, then the epilogue kernel */
            epi_case d = {MR_F64, MR_F64, 2, 9, ns[ni], 17, 1, 0, 0, bias, gelu, pre, 0, 1.0, 0.0};
            gemm_epi_case(&d, seed++);
        }
    /* bias with beta (addmm): C = alpha AB + beta C + bias */
    epi_case addmm = {MR_F32, MR_F32, 2, 19, 24, 31, 0, 0, 0, 1, 0, 0, 0, 0.7, 0.3};
    gemm_epi_case(&addmm, seed++);
    epi_case addmm_bf = {MR_BF16, MR_F32, 1, 19, 24, 31, 1, 1, 0, 1, 0, 0, 0, -1.5, 2.0};
    gemm_epi_case(&addmm_bf, seed++);
    /* k = 0: C = bias, then GELU (cuBLAS path) */
    epi_case k0 = {MR_F32, MR_F32, 1, 8, 16, 0, 0, 0, 0, 1, 1, 1, 0, 1.0, 0.0};
    gemm_epi_case(&k0, seed++);
}

/* TF32 (allow_tf32): looser tolerance, plain and with the epilogue, 2-d and batched. */
static void test_gemm_tf32(void **state) {
    (void)state;
    uint64_t seed = 900;
    for (int t = 0; t < 4; t++) {
        epi_case plain = {MR_F32, MR_F32, 1, 64, 96, 64, t & 1, t >> 1, 0, 0, 0, 0, 1, 1.0, 0.0};
        gemm_epi_case(&plain, seed++);
        epi_case fused = {MR_F32, MR_F32, 1, 64, 96, 64, t & 1, t >> 1, 0, 1, 1, 1, 1, 1.0, 0.0};
        gemm_epi_case(&fused, seed++);
        epi_case batched = {MR_F32, MR_F32, 3, 33, 40, 48, t & 1, t >> 1, 0, 1, 0, 0, 1, 0.5, 0.0};
        gemm_epi_case(&batched, seed++);
    }
}

/* ---- unary ------------------------------------------------------------------------------------ */

static const mr_op_id k_unary[] = {MR_OP_RELU, MR_OP_GELU, MR_OP_TANH, MR_OP_SIGMOID,
                                   MR_OP_EXP,  MR_OP_LOG,  MR_OP_SQRT, MR_OP_SCALE};
static const mr_op_id k_unary_bwd[] = {MR_OP_RELU_BWD, MR_OP_GELU_BWD, MR_OP_TANH_BWD, MR_OP_SIGMOID_BWD,
                                       MR_OP_EXP_BWD,  MR_OP_LOG_BWD,  MR_OP_SQRT_BWD, MR_OP_SCALE_BWD};

/* log and sqrt take positive inputs. */
static void unary_range(mr_op_id fwd, double *lo, double *hi) {
    int pos = fwd == MR_OP_LOG || fwd == MR_OP_SQRT;
    *lo = pos ? 0.05 : -4.0;
    *hi = pos ? 4.0 : 4.0;
}

static void test_unary_fwd(void **state) {
    (void)state;
    const mr_shape shapes[3] = {mr_shape_2d(3, 1001), mr_shape_1d(1), mr_shape_3d(2, 5, 7)};
    for (size_t o = 0; o < sizeof k_unary / sizeof *k_unary; o++) {
        for (int si = 0; si < 3; si++) {
            mr_shape s = shapes[si];
            int64_t n = mr_shape_numel(&s);
            double lo, hi;
            unary_range(k_unary[o], &lo, &hi);
            double *hx = gpu_rand(n, lo, hi, 300 + o * 7 + (uint64_t)si, MR_F32);
            mr_tensor *x = gpu_upload(hx, MR_F32, s), *y = gpu_upload(nan_vals(n), MR_F32, s);
            mr_op_args g, r;
            mr_op_args_init(&g, k_unary[o]);
            g.p.scale = -1.75;
            r = g;
            g.in[0] = mr_tensor_as_view(x);
            g.out[0] = mr_tensor_as_view(y);
            r.in[0] = gpu_f64_view(hx, s);
            r.out[0] = th_view(MR_F64, s);
            gpu_run_op(&g);
            MR_ASSERT_OK(mr_op_run_ref(&r));
            assert_true(th_compare(mr_op_get(k_unary[o])->name, gpu_download(y), MR_F64, r.out[0].data, n, TOL_F32_ATOL,
                                   TOL_F32_RTOL, TOL_F32_NMSE));
            gpu_free_all();
        }
    }
}

static void test_unary_bwd(void **state) {
    (void)state;
    const mr_shape s = mr_shape_2d(7, 513);
    int64_t n = mr_shape_numel(&s);
    for (size_t o = 0; o < sizeof k_unary_bwd / sizeof *k_unary_bwd; o++) {
        mr_op_id fwd = k_unary[o];
        double lo, hi;
        unary_range(fwd, &lo, &hi);
        double *hx = gpu_rand(n, lo, hi, 500 + o, MR_F32);
        double *hdy = gpu_rand(n, -1, 1, 600 + o, MR_F32);
        /* y = f(x) from the reference, rounded to f32 as the GPU's forward would store it */
        mr_op_args f;
        mr_op_args_init(&f, fwd);
        f.p.scale = 0.625;
        f.in[0] = gpu_f64_view(hx, s);
        f.out[0] = th_view(MR_F64, s);
        MR_ASSERT_OK(mr_op_run_ref(&f));
        double *hy = f.out[0].data;
        gpu_round_to(hy, n, MR_F32);
        mr_tensor *x = gpu_upload(hx, MR_F32, s), *y = gpu_upload(hy, MR_F32, s), *dy = gpu_upload(hdy, MR_F32, s);
        mr_tensor *dx = gpu_upload(nan_vals(n), MR_F32, s);
        mr_op_args g, r;
        mr_op_args_init(&g, k_unary_bwd[o]);
        g.p.scale = 0.625;
        r = g;
        g.in[0] = mr_tensor_as_view(x);
        g.in[1] = mr_tensor_as_view(y);
        g.in[2] = mr_tensor_as_view(dy);
        g.out[0] = mr_tensor_as_view(dx);
        r.in[0] = gpu_f64_view(hx, s);
        r.in[1] = gpu_f64_view(hy, s);
        r.in[2] = gpu_f64_view(hdy, s);
        r.out[0] = th_view(MR_F64, s);
        gpu_run_op(&g);
        MR_ASSERT_OK(mr_op_run_ref(&r));
        assert_true(th_compare(mr_op_get(k_unary_bwd[o])->name, gpu_download(dx), MR_F64, r.out[0].data, n, TOL_F32_ATOL,
                               TOL_F32_RTOL, TOL_F32_NMSE));
        gpu_free_all();
    }
}

/* ---- GEMM_DC: a GEMM's dC (GELU gradient, half cast, bias sum) ------------------------------- */

/* Against the f64 reference: f32 and f64, with and without the GELU pre-activation, each output
 * alone and both, row counts that are not multiples of the kernel's lanes; twice, bit-identical
 * (gpu_check_vs_ref). A half dc against the reference rounded once more. */
static void test_gemm_dc(void **state) {
    (void)state;
    const mr_shape shapes[3] = {mr_shape_2d(7, 13), mr_shape_3d(3, 50, 129), mr_shape_2d(1000, 40)};
    uint64_t seed = 1400;
    for (int si = 0; si < 3; si++)
        for (int pre = 0; pre < 2; pre++)
            for (int outs = 1; outs < 4; outs++)
                for (int di = 0; di < 2; di++) {
                    const mr_dtype dt = di ? MR_F64 : MR_F32;
                    const mr_shape s = shapes[si];
                    const int64_t n = mr_shape_numel(&s), cols = s.dim[s.ndim - 1];
                    mr_op_args r;
                    mr_op_args_init(&r, MR_OP_GEMM_DC);
                    r.in[0] = gpu_f64_view(gpu_rand(n, -2, 2, seed++, dt), s);
                    if (pre) r.in[1] = gpu_f64_view(gpu_rand(n, -4, 4, seed++, dt), s);
                    if (outs & 1) r.out[0] = th_view(MR_F64, s);
                    if (outs & 2) r.out[1] = th_view(MR_F64, mr_shape_1d(cols));
                    char what[80];
                    snprintf(what, sizeof what, "gemm_dc shape %d pre %d outs %d %s", si, pre, outs, mr_dtype_name(dt));
                    gpu_check_vs_ref(what, &r, dt, dt, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
                    gpu_free_all();
                }
    /* half dc: within one rounding of the reference */
    const mr_dtype halves[2] = {MR_BF16, MR_F16};
    for (int h = 0; h < 2; h++)
        for (int pre = 0; pre < 2; pre++) {
            const mr_shape s = mr_shape_2d(300, 70);
            const int64_t n = mr_shape_numel(&s);
            double *hdy = gpu_rand(n, -2, 2, seed++, MR_F32), *hpre = gpu_rand(n, -4, 4, seed++, MR_F32);
            mr_tensor *dy = gpu_upload(hdy, MR_F32, s), *pt = gpu_upload(hpre, MR_F32, s);
            mr_tensor *dc = gpu_upload(nan_vals(n), halves[h], s), *db = gpu_upload(nan_vals(70), MR_F32, mr_shape_1d(70));
            mr_op_args g, r;
            mr_op_args_init(&g, MR_OP_GEMM_DC);
            r = g;
            g.in[0] = mr_tensor_as_view(dy);
            if (pre) g.in[1] = mr_tensor_as_view(pt);
            g.out[0] = mr_tensor_as_view(dc);
            g.out[1] = mr_tensor_as_view(db);
            r.in[0] = gpu_f64_view(hdy, s);
            if (pre) r.in[1] = gpu_f64_view(hpre, s);
            r.out[0] = th_view(MR_F64, s);
            r.out[1] = th_view(MR_F64, mr_shape_1d(70));
            gpu_run_op(&g);
            MR_ASSERT_OK(mr_op_run_ref(&r));
            const double half_rtol = halves[h] == MR_BF16 ? 1.0 / 128 : 1.0 / 1024;
            assert_true(th_compare("gemm_dc half dc", gpu_download(dc), MR_F64, r.out[0].data, n, 1e-6, half_rtol, 1e-4));
            assert_true(th_compare("gemm_dc dbias (half dc)", gpu_download(db), MR_F64, r.out[1].data, 70,
                                   TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
            gpu_free_all();
        }
}

/* ---- binary with broadcasting ----------------------------------------------------------------- */

static void test_binary(void **state) {
    (void)state;
    static const int64_t da[][4] = {{5, 7}, {4, 1, 6}, {3, 4}, {1}, {2, 3, 4}, {2, 1, 3, 1}, {1000, 33}};
    static const int na_[] = {2, 3, 2, 1, 3, 4, 2};
    static const int64_t db[][4] = {{5, 7}, {5, 1}, {0}, {2, 3, 4}, {4}, {1, 4, 1, 5}, {1, 33}};
    static const int nb_[] = {2, 2, 0, 3, 1, 4, 2};
    const mr_op_id ops[4] = {MR_OP_ADD, MR_OP_SUB, MR_OP_MUL, MR_OP_DIV};
    for (int o = 0; o < 4; o++) {
        for (size_t c = 0; c < sizeof na_ / sizeof *na_; c++) {
            mr_shape sa = mr_shape_make(na_[c], da[c]), sb = mr_shape_make(nb_[c], db[c]), sy;
            MR_ASSERT_OK(mr_shape_broadcast(&sa, &sb, &sy));
            int64_t na = mr_shape_numel(&sa), nb = mr_shape_numel(&sb), ny = mr_shape_numel(&sy);
            double *ha = gpu_rand(na, -2, 2, 700 + (uint64_t)(o * 16) + c, MR_F32);
            /* divisors kept away from zero */
            double *hb = ops[o] == MR_OP_DIV ? gpu_rand(nb, 0.5, 2, 800 + c, MR_F32) : gpu_rand(nb, -2, 2, 800 + c, MR_F32);
            mr_tensor *a = gpu_upload(ha, MR_F32, sa), *b = gpu_upload(hb, MR_F32, sb);
            mr_tensor *y = gpu_upload(nan_vals(ny), MR_F32, sy);
            mr_op_args g, r;
            mr_op_args_init(&g, ops[o]);
            r = g;
            g.in[0] = mr_tensor_as_view(a);
            g.in[1] = mr_tensor_as_view(b);
            g.out[0] = mr_tensor_as_view(y);
            r.in[0] = gpu_f64_view(ha, sa);
            r.in[1] = gpu_f64_view(hb, sb);
            r.out[0] = th_view(MR_F64, sy);
            gpu_run_op(&g);
            MR_ASSERT_OK(mr_op_run_ref(&r));
            char what[64];
            snprintf(what, sizeof what, "%s case %zu", mr_op_get(ops[o])->name, c);
            assert_true(th_compare(what, gpu_download(y), MR_F64, r.out[0].data, ny, TOL_F32_ATOL, TOL_F32_RTOL,
                                   TOL_F32_NMSE));
            gpu_free_all();
        }
    }
}

/* ---- cast ------------------------------------------------------------------------------------- */

/* Every pair among f32, f64, f16, bf16, on values that exercise rounding: random magnitudes over
 * f16's range and beyond, ties, subnormals, overflow, infinities and NaN. The expected bits come
 * from mr_dtype_set, which rounds as the cast op is documented to. */
static void test_cast(void **state) {
    (void)state;
    const mr_dtype dts[4] = {MR_F32, MR_F64, MR_F16, MR_BF16};
    const int64_t n = 4096 + 16;
    /* not th_alloc: gpu_free_all() below frees the test-owned buffers after every pair, and h is
     * read by all 16 (the emulator's ASan run caught the use after free) */
    double *h = malloc((size_t)n * sizeof(double));
    assert_non_null(h);
    th_fill_uniform_f64(h, 4096, -1, 1, 900);
    for (int64_t i = 0; i < 4096; i++) h[i] = ldexp(h[i], (int)(i % 48) - 28); /* 2^-28 .. 2^19 */
    const double special[16] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 65504.0, 65519.0, 65520.0,
                                1.0 + 1.0 / 2048, 1.0 + 3.0 / 2048, 5.96046447753906e-08, 2.98e-08,
                                1.0 + 1.0 / 256, 3.4e38, 1e-40, 1.00048828125};
    memcpy(h + 4096, special, sizeof special);
    mr_shape s = mr_shape_1d(n);
    for (int i = 0; i < 4; i++) {
        for (int o = 0; o < 4; o++) {
            double *hx = th_alloc((size_t)n * sizeof(double));
            memcpy(hx, h, (size_t)n * sizeof(double));
            gpu_round_to(hx, n, dts[i]);
            /* y starts at a value no input has, so an element the kernel skips is caught */
            double *fill = th_alloc((size_t)n * sizeof(double));
            for (int64_t k = 0; k < n; k++) fill[k] = -7.0;
            mr_tensor *x = gpu_upload(hx, dts[i], s), *y = gpu_upload(fill, dts[o], s);
            mr_op_args g;
            mr_op_args_init(&g, MR_OP_CAST);
            g.in[0] = mr_tensor_as_view(x);
            g.out[0] = mr_tensor_as_view(y);
            gpu_run_op(&g);
            double *got = gpu_download(y);
            void *want = th_alloc((size_t)n * mr_dtype_size(dts[o]));
            for (int64_t k = 0; k < n; k++) mr_dtype_set(want, dts[o], k, hx[k]);
            int bad = 0;
            for (int64_t k = 0; k < n && bad < 10; k++) {
                double w = mr_dtype_get(want, dts[o], k);
                int same = (isnan(w) && isnan(got[k])) || (w == got[k] && signbit(w) == signbit(got[k]));
                if (!same) {
                    print_error("cast %s->%s [%lld]: x=%.17g got %.17g want %.17g\n", mr_dtype_name(dts[i]),
                                mr_dtype_name(dts[o]), (long long)k, hx[k], got[k], w);
                    bad++;
                }
            }
            assert_int_equal(bad, 0);
            gpu_free_all();
        }
    }
    free(h);
}

/* ---- optimizers ------------------------------------------------------------------------------- */

static void sgd_case(double momentum, double dampening, double wd, int nesterov, int first_step, uint64_t seed) {
    const int64_t n = 1003;
    mr_shape s = mr_shape_1d(n);
    double *hp = gpu_rand(n, -1, 1, seed, MR_F32), *hg = gpu_rand(n, -1, 1, seed + 1, MR_F32);
    double *hb = gpu_rand(n, -1, 1, seed + 2, MR_F32);
    mr_tensor *p = gpu_upload(hp, MR_F32, s), *gr = gpu_upload(hg, MR_F32, s), *b = gpu_upload(hb, MR_F32, s);
    mr_op_args g, r;
    mr_op_args_init(&g, MR_OP_SGD_UPDATE);
    g.p.sgd = (mr_sgd_params){0.05, momentum, dampening, wd, nesterov, first_step, NULL, NULL};
    r = g;
    g.in[0] = mr_tensor_as_view(p);
    g.in[1] = mr_tensor_as_view(gr);
    g.in[2] = mr_tensor_as_view(b); /* ignored when momentum == 0 */
    r.in[0] = gpu_f64_view(hp, s);
    r.in[1] = gpu_f64_view(hg, s);
    r.in[2] = gpu_f64_view(hb, s);
    gpu_run_op(&g);
    MR_ASSERT_OK(mr_op_run_ref(&r));
    char what[128];
    snprintf(what, sizeof what, "sgd param m%g d%g wd%g nest%d first%d", momentum, dampening, wd, nesterov, first_step);
    assert_true(th_compare(what, gpu_download(p), MR_F64, r.in[0].data, n, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE));
    if (momentum != 0.0)
        assert_true(th_compare("sgd momentum_buf", gpu_download(b), MR_F64, r.in[2].data, n, TOL_F32_ATOL, TOL_F32_RTOL,
                               TOL_F32_NMSE));
    gpu_free_all();
}

static void test_sgd(void **state) {
    (void)state;
    sgd_case(0.0, 0.0, 0.0, 0, 0, 1000);
    sgd_case(0.0, 0.0, 0.01, 0, 0, 1010);
    sgd_case(0.9, 0.0, 0.0, 0, 1, 1020);
    sgd_case(0.9, 0.1, 0.01, 0, 0, 1030);
    sgd_case(0.9, 0.0, 0.01, 1, 0, 1040);
    sgd_case(0.9, 0.0, 0.0, 1, 1, 1050);
}

static void adamw_case(int64_t step, double wd, uint64_t seed) {
    const int64_t n = 2049;
    mr_shape s = mr_shape_1d(n);
    double *hp = gpu_rand(n, -1, 1, seed, MR_F32), *hg = gpu_rand(n, -1, 1, seed + 1, MR_F32);
    double *hm = gpu_rand(n, -0.1, 0.1, seed + 2, MR_F32), *hv = gpu_rand(n, 0, 0.01, seed + 3, MR_F32);
    if (step == 1)
        for (int64_t i = 0; i < n; i++) hm[i] = hv[i] = 0.0;
    mr_tensor *p = gpu_upload(hp, MR_F32, s), *gr = gpu_upload(hg, MR_F32, s), *m = gpu_upload(hm, MR_F32, s);
    mr_tensor *v = gpu_upload(hv, MR_F32, s);
    mr_op_args g, r;
    mr_op_args_init(&g, MR_OP_ADAMW_UPDATE);
    g.p.adamw = (mr_adamw_params){1e-3, 0.9, 0.999, 1e-8, wd, step, NULL, NULL, NULL, 0};
    r = g;
    g.in[0] = mr_tensor_as_view(p);
    g.in[1] = mr_tensor_as_view(gr);
    g.in[2] = mr_tensor_as_view(m);
    g.in[3] = mr_tensor_as_view(v);
    r.in[0] = gpu_f64_view(hp, s);
    r.in[1] = gpu_f64_view(hg, s);
    r.in[2] = gpu_f64_view(hm, s);
    r.in[3] = gpu_f64_view(hv, s);
    gpu_run_op(&g);
    MR_ASSERT_OK(mr_op_run_ref(&r));
    assert_true(th_compare("adamw param", gpu_download(p), MR_F64, r.in[0].data, n, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE));
    assert_true(th_compare("adamw exp_avg", gpu_download(m), MR_F64, r.in[2].data, n, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE));
    assert_true(th_compare("adamw exp_avg_sq", gpu_download(v), MR_F64, r.in[3].data, n, TOL_F32_ATOL, TOL_F32_RTOL,
                           TOL_F32_NMSE));
    gpu_free_all();
}

static void test_adamw(void **state) {
    (void)state;
    adamw_case(1, 0.0, 1100);
    adamw_case(1, 0.01, 1110);
    adamw_case(10, 0.1, 1120);
    adamw_case(1000, 0.01, 1130);
}

/* The by-pointer updates on the GPU (mr_optim_step_ctl: apply and the step in device memory, read
 * when the kernel runs) against the by-value ones, bit for bit, over steps some of which are
 * skipped (nothing changes) for SGD with momentum, Adam with L2 and AdamW. */
static void test_update_by_pointer(void **state) {
    (void)state;
    enum { N = 3000 };
    const mr_device dev = {MR_DEVICE_CUDA, 0};
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    const mr_optim_kind kinds[3] = {MR_OPTIM_SGD, MR_OPTIM_ADAM, MR_OPTIM_ADAMW};
    const int32_t pattern[6] = {1, 0, 1, 1, 0, 1};
    static float h[N], ha[N], hb[N];
    for (int q = 0; q < 3; q++) {
        mr_optim_cfg cfg = mr_optim_cfg_default(kinds[q]);
        cfg.momentum = kinds[q] == MR_OPTIM_SGD ? 0.9 : 0.0;
        cfg.weight_decay = 0.01;
        mr_optim *a = NULL, *b = NULL;
        MR_ASSERT_OK(mr_optim_new_on(&cfg, N, dev, NULL, &a));
        MR_ASSERT_OK(mr_optim_new_on(&cfg, N, dev, NULL, &b));
        MR_ASSERT_OK(mr_optim_reserve(b, 6));
        float *pa, *pb, *ga, *gb;
        int32_t *apply;
        int64_t *step;
        MR_ASSERT_OK(be->alloc(0, sizeof h, (void **)&pa));
        MR_ASSERT_OK(be->alloc(0, sizeof h, (void **)&pb));
        MR_ASSERT_OK(be->alloc(0, sizeof h, (void **)&ga));
        MR_ASSERT_OK(be->alloc(0, sizeof h, (void **)&gb));
        MR_ASSERT_OK(be->alloc(0, sizeof *apply, (void **)&apply));
        MR_ASSERT_OK(be->alloc(0, sizeof *step, (void **)&step));
        th_fill_uniform_f32(h, N, -1.0f, 1.0f, 70 + (uint64_t)q);
        MR_ASSERT_OK(be->copy(0, pa, h, sizeof h, MR_COPY_H2D, NULL));
        MR_ASSERT_OK(be->copy(0, pb, h, sizeof h, MR_COPY_H2D, NULL));
        int64_t count = 0;
        for (int k = 0; k < 6; k++) {
            th_fill_uniform_f32(h, N, -1.0f, 1.0f, 700 + (uint64_t)k);
            MR_ASSERT_OK(be->copy(0, ga, h, sizeof h, MR_COPY_H2D, NULL));
            MR_ASSERT_OK(be->copy(0, gb, h, sizeof h, MR_COPY_H2D, NULL));
            const int32_t on = pattern[k];
            count += on;
            MR_ASSERT_OK(be->copy(0, apply, &on, sizeof on, MR_COPY_H2D, NULL));
            MR_ASSERT_OK(be->copy(0, step, &count, sizeof count, MR_COPY_H2D, NULL));
            const double lr = 1e-2 * (1.0 + 0.1 * k);
            if (on) MR_ASSERT_OK(mr_optim_step(a, pa, ga, lr));
            MR_ASSERT_OK(mr_optim_step_ctl(b, pb, gb, lr, apply, step, k + 1));
            MR_ASSERT_OK(be->copy(0, ha, pa, sizeof h, MR_COPY_D2H, NULL));
            MR_ASSERT_OK(be->copy(0, hb, pb, sizeof h, MR_COPY_D2H, NULL));
            MR_ASSERT_OK(be->stream_sync(NULL));
            assert_memory_equal(ha, hb, sizeof h);
            for (int j = 0; j < mr_optim_num_slots(a); j++) {
                MR_ASSERT_OK(be->copy(0, ha, mr_optim_slot(a, j), sizeof h, MR_COPY_D2H, NULL));
                MR_ASSERT_OK(be->copy(0, hb, mr_optim_slot(b, j), sizeof h, MR_COPY_D2H, NULL));
                MR_ASSERT_OK(be->stream_sync(NULL));
                assert_memory_equal(ha, hb, sizeof h);
            }
        }
        be->free(0, pa), be->free(0, pb), be->free(0, ga), be->free(0, gb), be->free(0, apply), be->free(0, step);
        mr_optim_free(a);
        mr_optim_free(b);
    }
}

/* ---- the backend table ------------------------------------------------------------------------ */

/* alloc, H2D, D2D, D2H, H2H and memset_zero on the default stream round-trip the bytes. */
static void test_backend_copy(void **state) {
    (void)state;
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    int count = 0;
    MR_ASSERT_OK(be->device_count(&count));
    assert_true(count >= 1);
    const size_t bytes = 1 << 20;
    unsigned char *h_src = th_alloc(bytes), *h_dst = th_alloc(bytes), *h_h2h = th_alloc(bytes);
    for (size_t i = 0; i < bytes; i++) h_src[i] = (unsigned char)(i * 131u + 7u);
    void *d_a = NULL, *d_b = NULL, *d_zero = NULL;
    MR_ASSERT_OK(be->alloc(0, bytes, &d_a));
    MR_ASSERT_OK(be->alloc(0, bytes, &d_b));
    MR_ASSERT_OK(be->alloc(0, 0, &d_zero));
    assert_non_null(d_a);
    assert_non_null(d_zero); /* 0 bytes still gives a unique pointer */
    MR_ASSERT_OK(be->copy(0, d_a, h_src, bytes, MR_COPY_H2D, NULL));
    MR_ASSERT_OK(be->copy(0, d_b, d_a, bytes, MR_COPY_D2D, NULL));
    MR_ASSERT_OK(be->copy(0, h_dst, d_b, bytes, MR_COPY_D2H, NULL));
    MR_ASSERT_OK(be->copy(0, h_h2h, h_src, bytes, MR_COPY_H2H, NULL));
    MR_ASSERT_OK(be->stream_sync(NULL));
    assert_memory_equal(h_src, h_dst, bytes);
    assert_memory_equal(h_src, h_h2h, bytes);
    MR_ASSERT_OK(be->memset_zero(0, d_b, bytes / 2, NULL));
    MR_ASSERT_OK(be->copy(0, h_dst, d_b, bytes, MR_COPY_D2H, NULL));
    MR_ASSERT_OK(be->stream_sync(NULL));
    for (size_t i = 0; i < bytes / 2; i++) assert_int_equal(h_dst[i], 0);
    assert_memory_equal(h_src + bytes / 2, h_dst + bytes / 2, bytes / 2);
    be->free(0, d_a);
    be->free(0, d_b);
    be->free(0, d_zero);
    be->free(0, NULL); /* a no-op */
    th_free_all();
}

/* Two streams ordered by an event: s2's copy out of d_a must see s1's writes into it, over
 * several rounds with new contents each time so a missing wait shows as stale bytes. */
static void test_backend_streams(void **state) {
    (void)state;
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    const size_t n = (size_t)16 << 20;
    unsigned char *h_src = th_alloc(n), *h_dst = th_alloc(n);
    void *d_a = NULL, *d_b = NULL;
    mr_stream *s1 = NULL, *s2 = NULL;
    mr_event *e = NULL;
    MR_ASSERT_OK(be->alloc(0, n, &d_a));
    MR_ASSERT_OK(be->alloc(0, n, &d_b));
    MR_ASSERT_OK(be->stream_new(0, &s1));
    MR_ASSERT_OK(be->stream_new(0, &s2));
    MR_ASSERT_OK(be->event_new(0, &e));
    for (int round = 0; round < 4; round++) {
        memset(h_src, 0x11 * (round + 1), n);
        MR_ASSERT_OK(be->memset_zero(0, d_a, n, s1));
        MR_ASSERT_OK(be->copy(0, d_a, h_src, n, MR_COPY_H2D, s1));
        MR_ASSERT_OK(be->event_record(e, s1));
        MR_ASSERT_OK(be->stream_wait_event(s2, e));
        MR_ASSERT_OK(be->copy(0, d_b, d_a, n, MR_COPY_D2D, s2));
        MR_ASSERT_OK(be->copy(0, h_dst, d_b, n, MR_COPY_D2H, s2));
        MR_ASSERT_OK(be->event_record(e, s2));
        MR_ASSERT_OK(be->event_sync(e));
        MR_ASSERT_OK(be->stream_sync(s2));
        assert_memory_equal(h_src, h_dst, n);
    }
    be->event_free(e);
    be->stream_free(s1);
    be->stream_free(s2);
    be->stream_free(NULL);
    be->event_free(NULL);
    be->free(0, d_a);
    be->free(0, d_b);
    th_free_all();
}

/* Ops on an explicit stream (GEMM takes the stream's own cuBLAS handle), then a relu on the same
 * stream that consumes the GEMM's output. */
static void test_ops_on_stream(void **state) {
    (void)state;
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    mr_stream *s = NULL;
    MR_ASSERT_OK(be->stream_new(0, &s));
    const int64_t m = 65, n = 47, k = 129;
    mr_shape sa = mr_shape_2d(m, k), sb = mr_shape_2d(k, n), sc = mr_shape_2d(m, n);
    double *ha = gpu_rand(m * k, -1, 1, 1200, MR_F32), *hb = gpu_rand(k * n, -1, 1, 1201, MR_F32);
    mr_tensor *ta = gpu_upload(ha, MR_F32, sa), *tb = gpu_upload(hb, MR_F32, sb), *tc = gpu_upload(nan_vals(m * n), MR_F32, sc);
    mr_tensor *ty = gpu_upload(nan_vals(m * n), MR_F32, sc);
    mr_op_args g, r;
    mr_op_args_init(&g, MR_OP_GEMM);
    g.p.gemm = (mr_gemm_params){0, 0, 1.0, 0.0, 0, 0};
    r = g;
    g.stream = s;
    g.in[0] = mr_tensor_as_view(ta);
    g.in[1] = mr_tensor_as_view(tb);
    g.out[0] = mr_tensor_as_view(tc);
    gpu_run_op(&g);
    mr_op_args u;
    mr_op_args_init(&u, MR_OP_RELU);
    u.stream = s;
    u.in[0] = mr_tensor_as_view(tc);
    u.out[0] = mr_tensor_as_view(ty);
    gpu_run_op(&u);
    MR_ASSERT_OK(be->stream_sync(s));
    r.in[0] = gpu_f64_view(ha, sa);
    r.in[1] = gpu_f64_view(hb, sb);
    r.out[0] = th_view(MR_F64, sc);
    MR_ASSERT_OK(mr_op_run_ref(&r));
    double *ref = r.out[0].data;
    for (int64_t i = 0; i < m * n; i++) ref[i] = ref[i] > 0 ? ref[i] : 0.0;
    assert_true(th_compare("gemm+relu on a stream", gpu_download(ty), MR_F64, ref, m * n, TOL_F32_REDUCE_ATOL,
                           TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE));
    gpu_free_all();
    be->stream_free(s);
}

/* A dtype the kernel does not take is an error naming the op, not a crash. */
static void test_errors(void **state) {
    (void)state;
    mr_shape s = mr_shape_1d(16);
    double *h = gpu_rand(16, -1, 1, 1300, MR_F32);
    mr_tensor *x = gpu_upload(h, MR_F32, s), *y = gpu_upload(h, MR_I32, s);
    mr_op_args g;
    mr_op_args_init(&g, MR_OP_CAST);
    g.in[0] = mr_tensor_as_view(x);
    g.out[0] = mr_tensor_as_view(y);
    assert_int_not_equal(mr_op_run(MR_DEVICE_CUDA, &g), MR_OK);
    assert_non_null(strstr(mr_last_error(), "cast"));
    gpu_free_all();
}

int main(void) {
    if (gpu_none()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_copy),  cmocka_unit_test(test_backend_streams),
        cmocka_unit_test(test_ops_on_stream), cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_epilogue), cmocka_unit_test(test_gemm_tf32),
        cmocka_unit_test(test_unary_fwd),     cmocka_unit_test(test_unary_bwd),
        cmocka_unit_test(test_gemm_dc),
        cmocka_unit_test(test_binary),        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_sgd),           cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_update_by_pointer),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
