/* Tests of MR_OP_SGD_UPDATE and MR_OP_ADAMW_UPDATE: the CPU f32 update against the f64 reference
 * over several steps (params and optimizer state), the CPU f64 path against the reference, small
 * cases checked against numbers worked out from PyTorch's documented update rules, momentum 0
 * leaving the buffer alone, and the errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "core/ops.h"
#include "optim/optim.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static mr_view view_of(void *data, mr_dtype dt, int64_t n) {
    mr_view v;
    v.data = data;
    v.dtype = dt;
    v.shape = mr_shape_1d(n);
    return v;
}

static mr_op_args sgd_args(mr_dtype dt, int64_t n, void *param, void *grad, void *buf, mr_sgd_params p) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_SGD_UPDATE);
    a.in[0] = view_of(param, dt, n);
    a.in[1] = view_of(grad, dt, n);
    a.in[2] = view_of(buf, dt, n);
    a.p.sgd = p;
    return a;
}

static mr_op_args adamw_args(mr_dtype dt, int64_t n, void *param, void *grad, void *m, void *v, mr_adamw_params p) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_ADAMW_UPDATE);
    a.in[0] = view_of(param, dt, n);
    a.in[1] = view_of(grad, dt, n);
    a.in[2] = view_of(m, dt, n);
    a.in[3] = view_of(v, dt, n);
    a.p.adamw = p;
    return a;
}

static mr_sgd_params sgd_cfg(double lr, double momentum, double dampening, double wd, int nesterov) {
    mr_sgd_params p = {lr, momentum, dampening, wd, nesterov, 0, NULL, NULL};
    return p;
}

static mr_adamw_params adamw_cfg(double lr, double b1, double b2, double eps, double wd) {
    mr_adamw_params p = {lr, b1, b2, eps, wd, 1, NULL, NULL, NULL, 0};
    return p;
}

static const int64_t k_sizes[] = {1, 7, 33, 1000, 70001};
#define N_SIZES ((int)(sizeof k_sizes / sizeof *k_sizes))
#define N_STEPS 5

/* ---- SGD --------------------------------------------------------------------------------------- */

/* Runs N_STEPS updates on f64 (reference and CPU) and f32 (CPU) copies of the same state with
 * fresh gradients each step; compares after every step. */
static void sgd_vs_ref(mr_sgd_params cfg, int64_t n, uint64_t seed) {
    double *p64 = th_alloc(n * sizeof(double)), *b64 = th_alloc(n * sizeof(double)), *g64 = th_alloc(n * sizeof(double));
    double *q64 = th_alloc(n * sizeof(double)), *c64 = th_alloc(n * sizeof(double));
    float *p32 = th_alloc(n * sizeof(float)), *b32 = th_alloc(n * sizeof(float)), *g32 = th_alloc(n * sizeof(float));
    th_fill_uniform_f64(p64, n, -1.0, 1.0, seed);
    th_f64_to_f32(p64, p32, n);
    th_f32_to_f64(p32, p64, n); /* both start from the same f32-representable values */
    memcpy(q64, p64, n * sizeof(double));
    for (int t = 1; t <= N_STEPS; t++) {
        th_fill_uniform_f32(g32, n, -2.0f, 2.0f, seed + 10 * (uint64_t)t);
        th_f32_to_f64(g32, g64, n);
        cfg.first_step = t == 1;
        mr_op_args r = sgd_args(MR_F64, n, p64, g64, b64, cfg);
        mr_op_args c = sgd_args(MR_F32, n, p32, g32, b32, cfg);
        mr_op_args d = sgd_args(MR_F64, n, q64, g64, c64, cfg);
        MR_ASSERT_OK(mr_op_run_ref(&r));
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &c));
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &d));
        char what[160];
        snprintf(what, sizeof what, "sgd n=%lld mom=%g damp=%g wd=%g nest=%d step %d param", (long long)n, cfg.momentum,
                 cfg.dampening, cfg.weight_decay, cfg.nesterov, t);
        assert_true(th_compare(what, p32, MR_F32, p64, n, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE));
        if (cfg.momentum != 0.0) {
            snprintf(what, sizeof what, "sgd n=%lld step %d momentum_buf", (long long)n, t);
            assert_true(th_compare(what, b32, MR_F32, b64, n, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE));
        }
        /* the CPU f64 path is the reference */
        assert_memory_equal(q64, p64, n * sizeof(double));
        if (cfg.momentum != 0.0) assert_memory_equal(c64, b64, n * sizeof(double));
    }
}

static void test_sgd_cpu_vs_ref(void **state) {
    (void)state;
    const mr_sgd_params cfgs[] = {
        sgd_cfg(0.1, 0.9, 0.0, 0.01, 0), /* momentum, weight decay */
        sgd_cfg(0.05, 0.9, 0.0, 0.0, 1), /* nesterov */
        sgd_cfg(0.1, 0.5, 0.3, 0.02, 0), /* dampening */
        sgd_cfg(0.2, 0.0, 0.0, 0.1, 0),  /* plain SGD with weight decay */
        sgd_cfg(0.2, 0.0, 0.0, 0.0, 0),  /* plain SGD */
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
        for (int s = 0; s < N_SIZES; s++) {
            sgd_vs_ref(cfgs[c], k_sizes[s], 1000 + 17 * c + (uint64_t)s);
            th_free_all();
        }
    }
}

/* torch.optim.SGD (docs, "Algorithm"): g <- g + wd*p; if momentum != 0: b <- g on the first step,
 * else b <- momentum*b + (1-dampening)*g; then g <- g + momentum*b if nesterov else g <- b;
 * p <- p - lr*g. lr 0.1, momentum 0.9, wd 0.01, p0 = (1, -2), grads (0.5, 0.25), (-1, 0.5),
 * (0.25, -0.75). Step 1 by hand, element 0: g = 0.5 + 0.01*1 = 0.51 = b;
 *   plain:    p = 1 - 0.1*0.51 = 0.949
 *   nesterov: g = 0.51 + 0.9*0.51 = 0.969, p = 1 - 0.0969 = 0.9031
 * Step 2, plain, element 0: g = -1 + 0.01*0.949 = -0.99051; b = 0.9*0.51 - 0.99051 = -0.53151;
 *   p = 0.949 + 0.053151 = 1.002151. Later steps follow the same formulas (computed in double). */
static void test_sgd_hand_computed(void **state) {
    (void)state;
    static const double grads[3][2] = {{0.5, 0.25}, {-1.0, 0.5}, {0.25, -0.75}};
    static const struct {
        int nesterov;
        double dampening;
        double p[3][2], b[3][2];
    } cases[] = {
        {0, 0.0,
         {{0.949, -2.023}, {1.002151, -2.091677}, {1.023984749, -2.076394623}},
         {{0.51, 0.23}, {-0.53151, 0.68677}, {-0.21833749, -0.15282377}}},
        {1, 0.0,
         {{0.9031, -2.0437}, {1.05007411, -2.15344697}, {1.0436684581910, -2.062467023757}},
         {{0.51, 0.23}, {-0.531969, 0.686563}, {-0.2182713589, -0.1536277697}}},
        /* dampening 0.5: b <- 0.9*b + 0.5*g after the first step */
        {0, 0.5,
         {{0.949, -2.023}, {0.9526255, -2.0676885}, {0.94291213725, -2.06937430575}},
         {{0.51, 0.23}, {-0.036255, 0.446885}, {0.0971336275, 0.0168580575}}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int f32 = 0; f32 < 2; f32++) {
            double p[2] = {1.0, -2.0}, b[2] = {0, 0}, g[2];
            float pf[2] = {1.0f, -2.0f}, bf[2] = {0, 0}, gf[2];
            for (int t = 0; t < 3; t++) {
                mr_sgd_params cfg = sgd_cfg(0.1, 0.9, cases[c].dampening, 0.01, cases[c].nesterov);
                cfg.first_step = t == 0;
                memcpy(g, grads[t], sizeof g);
                gf[0] = (float)g[0];
                gf[1] = (float)g[1];
                mr_op_args a = f32 ? sgd_args(MR_F32, 2, pf, gf, bf, cfg) : sgd_args(MR_F64, 2, p, g, b, cfg);
                MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
                for (int i = 0; i < 2; i++) {
                    double pv = f32 ? pf[i] : p[i], bv = f32 ? bf[i] : b[i];
                    double tol = f32 ? 2e-6 : 1e-12;
                    if (fabs(pv - cases[c].p[t][i]) > tol || fabs(bv - cases[c].b[t][i]) > tol)
                        fail_msg("sgd case %zu %s step %d elem %d: p %.12g (want %.12g), b %.12g (want %.12g)", c,
                                 f32 ? "f32" : "f64", t + 1, i, pv, cases[c].p[t][i], bv, cases[c].b[t][i]);
                }
            }
        }
    }
}

/* momentum 0: the buffer is neither read nor written (it may hold anything, or be absent). */
static void test_sgd_momentum_zero(void **state) {
    (void)state;
    float p[3] = {1.0f, 2.0f, -3.0f}, g[3] = {0.5f, -1.0f, 2.0f};
    float buf[3] = {NAN, 123.0f, -7.0f};
    mr_sgd_params cfg = sgd_cfg(0.5, 0.0, 0.0, 0.0, 0);
    cfg.first_step = 0;
    mr_op_args a = sgd_args(MR_F32, 3, p, g, buf, cfg);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    /* p - lr*g */
    assert_true(p[0] == 0.75f && p[1] == 2.5f && p[2] == -4.0f);
    assert_true(isnan(buf[0]) && buf[1] == 123.0f && buf[2] == -7.0f);
    a.in[2].data = NULL;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    assert_true(p[0] == 0.5f && p[1] == 3.0f && p[2] == -5.0f);
    double pd[3] = {1, 2, -3}, gd[3] = {0.5, -1, 2};
    mr_op_args r = sgd_args(MR_F64, 3, pd, gd, NULL, cfg);
    MR_ASSERT_OK(mr_op_run_ref(&r));
    assert_true(pd[0] == 0.75 && pd[1] == 2.5 && pd[2] == -4.0);
}

/* ---- AdamW ------------------------------------------------------------------------------------ */

static void adamw_vs_ref(mr_adamw_params cfg, int64_t n, uint64_t seed) {
    size_t bd = (size_t)n * sizeof(double), bf = (size_t)n * sizeof(float);
    double *p64 = th_alloc(bd), *m64 = th_alloc(bd), *v64 = th_alloc(bd), *g64 = th_alloc(bd);
    double *q64 = th_alloc(bd), *mm64 = th_alloc(bd), *vv64 = th_alloc(bd);
    float *p32 = th_alloc(bf), *m32 = th_alloc(bf), *v32 = th_alloc(bf), *g32 = th_alloc(bf);
    th_fill_uniform_f32(p32, n, -1.0f, 1.0f, seed);
    th_f32_to_f64(p32, p64, n);
    memcpy(q64, p64, bd);
    for (int t = 1; t <= N_STEPS; t++) {
        th_fill_uniform_f32(g32, n, -1.0f, 1.0f, seed + 10 * (uint64_t)t);
        th_f32_to_f64(g32, g64, n);
        cfg.step = t;
        mr_op_args r = adamw_args(MR_F64, n, p64, g64, m64, v64, cfg);
        mr_op_args c = adamw_args(MR_F32, n, p32, g32, m32, v32, cfg);
        mr_op_args d = adamw_args(MR_F64, n, q64, g64, mm64, vv64, cfg);
        MR_ASSERT_OK(mr_op_run_ref(&r));
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &c));
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &d));
        char what[160];
        snprintf(what, sizeof what, "adamw n=%lld lr=%g wd=%g step %d", (long long)n, cfg.lr, cfg.weight_decay, t);
        assert_true(th_compare(what, p32, MR_F32, p64, n, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE));
        assert_true(th_compare("adamw exp_avg", m32, MR_F32, m64, n, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE));
        assert_true(th_compare("adamw exp_avg_sq", v32, MR_F32, v64, n, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE));
        assert_memory_equal(q64, p64, bd);
        assert_memory_equal(mm64, m64, bd);
        assert_memory_equal(vv64, v64, bd);
    }
}

static void test_adamw_cpu_vs_ref(void **state) {
    (void)state;
    const mr_adamw_params cfgs[] = {
        adamw_cfg(1e-3, 0.9, 0.999, 1e-8, 0.01),
        adamw_cfg(0.1, 0.8, 0.95, 1e-6, 0.1),
        adamw_cfg(3e-4, 0.0, 0.5, 1e-8, 0.0), /* beta1 0: no first moment */
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
        for (int s = 0; s < N_SIZES; s++) {
            adamw_vs_ref(cfgs[c], k_sizes[s], 5000 + 13 * c + (uint64_t)s);
            th_free_all();
        }
    }
}

/* torch.optim.AdamW (docs, "Algorithm"), at step t: p <- p*(1 - lr*wd); m <- b1*m + (1-b1)*g;
 * v <- b2*v + (1-b2)*g^2; p <- p - (lr/(1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
 * lr 0.01, betas (0.9, 0.999), eps 1e-8, wd 0.1, p0 = (1, -0.5), grads (0.2, -0.4), (0.1, 0.3),
 * (-0.3, 0.05). Step 1 by hand, element 0: p = 1*(1 - 0.001) = 0.999; m = 0.02; v = 0.001*0.04 =
 * 4e-5; m/(1-0.9) = 0.2, sqrt(v)/sqrt(0.001) = 0.2, so p = 0.999 - 0.01*0.2/(0.2 + 1e-8)
 * = 0.999 - 0.01*(1 - 5e-8) = 0.9890000005. Later steps follow the same formulas (in double). */
static void test_adamw_hand_computed(void **state) {
    (void)state;
    static const double grads[3][2] = {{0.2, -0.4}, {0.1, 0.3}, {-0.3, 0.05}};
    static const double want_p[3][2] = {{0.98900000050, -0.48950000025},
                                        {0.9786892047010366, -0.48811725020096358},
                                        {0.97853028343690251, -0.48757824016985435}};
    static const double want_m[3][2] = {{0.02, -0.04}, {0.028, -0.006}, {-0.0048, -0.0004}};
    static const double want_v[3][2] = {{4e-5, 1.6e-4}, {4.996e-5, 2.4984e-4}, {1.3991004e-4, 2.5209016e-4}};
    for (int f32 = 0; f32 < 2; f32++) {
        double p[2] = {1.0, -0.5}, m[2] = {0, 0}, v[2] = {0, 0}, g[2];
        float pf[2] = {1.0f, -0.5f}, mf[2] = {0, 0}, vf[2] = {0, 0}, gf[2];
        for (int t = 0; t < 3; t++) {
            mr_adamw_params cfg = adamw_cfg(0.01, 0.9, 0.999, 1e-8, 0.1);
            cfg.step = t + 1;
            memcpy(g, grads[t], sizeof g);
            gf[0] = (float)g[0];
            gf[1] = (float)g[1];
            mr_op_args a = f32 ? adamw_args(MR_F32, 2, pf, gf, mf, vf, cfg) : adamw_args(MR_F64, 2, p, g, m, v, cfg);
            MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
            for (int i = 0; i < 2; i++) {
                double pv = f32 ? pf[i] : p[i], mv = f32 ? mf[i] : m[i], vv = f32 ? vf[i] : v[i];
                double tol = f32 ? 2e-6 : 1e-12;
                if (fabs(pv - want_p[t][i]) > tol || fabs(mv - want_m[t][i]) > tol ||
                    fabs(vv - want_v[t][i]) > tol * 1e-2)
                    fail_msg("adamw %s step %d elem %d: p %.12g (want %.12g) m %.12g (want %.12g) v %.12g (want %.12g)",
                             f32 ? "f32" : "f64", t + 1, i, pv, want_p[t][i], mv, want_m[t][i], vv, want_v[t][i]);
            }
        }
    }
}

/* ---- errors --------------------------------------------------------------------------------- */

static void expect_invalid(const mr_op_args *a, const char *name, const char *what) {
    mr_status st = mr_op_run(MR_DEVICE_CPU, a);
    if (st != MR_ERR_INVALID) fail_msg("%s: expected MR_ERR_INVALID, got %s", what, mr_status_name(st));
    if (!strstr(mr_last_error(), name)) fail_msg("%s: error does not name %s: %s", what, name, mr_last_error());
    assert_int_equal(mr_op_run_ref(a), MR_ERR_INVALID);
}

static void test_optim_errors(void **state) {
    (void)state;
    float p[4] = {0}, g[4] = {0}, b[4] = {0}, v[4] = {0};
    double gd[4] = {0};
    int32_t gi[4] = {0};
    mr_op_args a = sgd_args(MR_F32, 4, p, g, b, sgd_cfg(-0.1, 0.9, 0, 0, 0));
    expect_invalid(&a, "sgd_update", "negative lr");
    a = sgd_args(MR_F32, 4, p, g, b, sgd_cfg(0.1, 0.9, 0.1, 0, 1));
    expect_invalid(&a, "sgd_update", "nesterov with dampening");
    a = sgd_args(MR_F32, 4, p, g, b, sgd_cfg(0.1, 0.0, 0.0, 0, 1));
    expect_invalid(&a, "sgd_update", "nesterov without momentum");
    a = sgd_args(MR_F32, 4, p, g, b, sgd_cfg(0.1, 0.9, 0, -1e-4, 0));
    expect_invalid(&a, "sgd_update", "negative weight decay");
    a = sgd_args(MR_F32, 4, p, g, NULL, sgd_cfg(0.1, 0.9, 0, 0, 0));
    expect_invalid(&a, "sgd_update", "momentum without a buffer");
    a = sgd_args(MR_F32, 4, p, g, b, sgd_cfg(0.1, 0.9, 0, 0, 0));
    a.in[1].shape = mr_shape_2d(2, 2);
    expect_invalid(&a, "sgd_update", "grad shape");
    a = sgd_args(MR_F32, 4, p, g, b, sgd_cfg(0.1, 0.9, 0, 0, 0));
    a.in[1] = view_of(gd, MR_F64, 4);
    expect_invalid(&a, "sgd_update", "mixed dtypes");
    a = sgd_args(MR_F32, 4, p, g, b, sgd_cfg(0.1, 0.9, 0, 0, 0));
    a.in[1] = view_of(gi, MR_I32, 4);
    expect_invalid(&a, "sgd_update", "i32 grad");

    mr_adamw_params cfg = adamw_cfg(1e-3, 0.9, 0.999, 1e-8, 0.01);
    cfg.step = 0;
    a = adamw_args(MR_F32, 4, p, g, b, v, cfg);
    expect_invalid(&a, "adamw_update", "step 0");
    a = adamw_args(MR_F32, 4, p, g, b, v, adamw_cfg(1e-3, 1.0, 0.999, 1e-8, 0.01));
    expect_invalid(&a, "adamw_update", "beta1 1");
    a = adamw_args(MR_F32, 4, p, g, b, v, adamw_cfg(1e-3, 0.9, -0.1, 1e-8, 0.01));
    expect_invalid(&a, "adamw_update", "negative beta2");
    a = adamw_args(MR_F32, 4, p, g, b, v, adamw_cfg(1e-3, 0.9, 0.999, -1e-8, 0.01));
    expect_invalid(&a, "adamw_update", "negative eps");
    a = adamw_args(MR_F32, 4, p, g, b, v, adamw_cfg(NAN, 0.9, 0.999, 1e-8, 0.01));
    expect_invalid(&a, "adamw_update", "NaN lr");
    a = adamw_args(MR_F32, 4, p, g, b, NULL, adamw_cfg(1e-3, 0.9, 0.999, 1e-8, 0.01));
    expect_invalid(&a, "adamw_update", "missing exp_avg_sq");
    a = adamw_args(MR_F32, 4, p, g, b, v, adamw_cfg(1e-3, 0.9, 0.999, 1e-8, 0.01));
    a.in[3].shape = mr_shape_1d(3);
    expect_invalid(&a, "adamw_update", "exp_avg_sq shape");
}

/* The by-pointer update (mr_optim_step_ctl: apply and the 1-based step read when the kernel runs,
 * the trainer's device-side decisions) against the by-value one, on the CPU kernels and the f64
 * reference: a step skipped by *apply 0 changes nothing (parameters, state); the applied ones give
 * the by-value update's bits at the same count (SGD's first momentum step, Adam's bias
 * corrections from mr_optim_reserve's table); Adam without a reserved table is refused. */
static void test_update_by_pointer(void **state) {
    (void)state;
    enum { N = 300 };
    const mr_optim_kind kinds[3] = {MR_OPTIM_SGD, MR_OPTIM_ADAM, MR_OPTIM_ADAMW};
    const int32_t pattern[8] = {0, 1, 0, 1, 1, 0, 1, 1};
    for (int q = 0; q < 3; q++) {
        mr_optim_cfg cfg = mr_optim_cfg_default(kinds[q]);
        cfg.momentum = kinds[q] == MR_OPTIM_SGD ? 0.9 : 0.0;
        cfg.weight_decay = 0.01;
        mr_optim *a = NULL, *b = NULL;
        MR_ASSERT_OK(mr_optim_new(&cfg, N, &a));
        MR_ASSERT_OK(mr_optim_new(&cfg, N, &b));
        float pa[N], pb[N], ga[N], gb[N];
        th_fill_uniform_f32(pa, N, -1.0f, 1.0f, 7);
        memcpy(pb, pa, sizeof pa);
        int32_t apply = 0;
        int64_t step = 0;
        if (kinds[q] != MR_OPTIM_SGD) {
            assert_int_equal(mr_optim_step_ctl(b, pb, gb, 1e-2, &apply, &step, 1), MR_ERR_INVALID); /* no table */
            MR_ASSERT_OK(mr_optim_reserve(b, 8));
            assert_int_equal(mr_optim_step_ctl(b, pb, gb, 1e-2, &apply, &step, 9), MR_ERR_INVALID);
        }
        for (int k = 0; k < 8; k++) {
            th_fill_uniform_f32(ga, N, -1.0f, 1.0f, 100 + (uint64_t)k);
            memcpy(gb, ga, sizeof ga);
            apply = pattern[k];
            step += apply;
            const double lr = 1e-2 * (1.0 + 0.1 * k);
            if (apply) MR_ASSERT_OK(mr_optim_step(a, pa, ga, lr));
            MR_ASSERT_OK(mr_optim_step_ctl(b, pb, gb, lr, &apply, &step, k + 1));
            assert_memory_equal(pa, pb, sizeof pa);
            for (int j = 0; j < mr_optim_num_slots(a); j++)
                assert_memory_equal(mr_optim_slot(a, j), mr_optim_slot(b, j), sizeof(float) * N);
        }
        assert_int_equal(mr_optim_steps(a), step);
        assert_int_equal(mr_optim_steps(b), 0); /* the count is the caller's */
        if (kinds[q] != MR_OPTIM_SGD) { /* far past the table's end, where both corrections are 1 */
            MR_ASSERT_OK(mr_optim_reserve(b, 1000000));
            mr_optim_set_steps(a, 49999);
            apply = 1;
            step = 50000;
            th_fill_uniform_f32(ga, N, -1.0f, 1.0f, 999);
            memcpy(gb, ga, sizeof ga);
            MR_ASSERT_OK(mr_optim_step(a, pa, ga, 1e-3));
            MR_ASSERT_OK(mr_optim_step_ctl(b, pb, gb, 1e-3, &apply, &step, 50000));
            assert_memory_equal(pa, pb, sizeof pa);
        }
        mr_optim_free(a);
        mr_optim_free(b);
    }
    /* the f64 reference reads the same pointers */
    double p1[4] = {1, -2, 3, -4}, p2[4], g[4] = {0.5, 0.25, -1, 2}, m1[4] = {0}, v1[4] = {0}, m2[4], v2[4];
    memcpy(p2, p1, sizeof p1);
    memcpy(m2, m1, sizeof m1);
    memcpy(v2, v1, sizeof v1);
    const int32_t on = 1, off = 0;
    const int64_t three = 3;
    mr_adamw_params byval = adamw_cfg(1e-2, 0.9, 0.999, 1e-8, 0.01);
    byval.step = 3;
    mr_adamw_params byptr = adamw_cfg(1e-2, 0.9, 0.999, 1e-8, 0.01);
    byptr.apply = &off;
    byptr.dstep = &three;
    mr_op_args a = adamw_args(MR_F64, 4, p2, g, m2, v2, byptr);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a)); /* skipped */
    assert_memory_equal(p1, p2, sizeof p1);
    byptr.apply = &on;
    a = adamw_args(MR_F64, 4, p2, g, m2, v2, byptr);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    a = adamw_args(MR_F64, 4, p1, g, m1, v1, byval);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    assert_memory_equal(p1, p2, sizeof p1);
    assert_memory_equal(v1, v2, sizeof v1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_cpu_vs_ref),
        cmocka_unit_test(test_sgd_hand_computed),
        cmocka_unit_test(test_sgd_momentum_zero),
        cmocka_unit_test(test_adamw_cpu_vs_ref),
        cmocka_unit_test(test_adamw_hand_computed),
        cmocka_unit_test(test_optim_errors),
        cmocka_unit_test(test_update_by_pointer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
