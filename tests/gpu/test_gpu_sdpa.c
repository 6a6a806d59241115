/* Attention through cuDNN's fused flash attention (core/cuda/attention_cudnn.cu): bf16 and f16,
 * causal and not, T == S and T < S, several shapes (GPT-2's head dim 64 and the tiny GPT's 32),
 * forward and backward against the f64 reference (core/ref/attention_ref.c) within the half
 * tolerances of tests/tolerances.h, and against mirror's own kernels (MIRROR_CUDNN_SDPA=0) on
 * the same inputs. mr_attention_paths_get says which path ran each call, so every case checks
 * that the path it means to test is the one that ran; every call runs twice and must give the
 * same bits (the engine chosen must be deterministic). Shapes cuDNN has no engine for (a head dim
 * that is not a multiple of 8; a causal T < S mask with T or S not a multiple of 64) run
 * mirror's kernels, named once on stderr; f32 always runs mirror's kernels. On the emulator the
 * cuDNN graph runs in the backend-graph interpreter of tests/emu/emu_dnn_graph.cc; on a real GPU
 * through cuDNN (tests/gpu/run.sh), where an engine cuDNN lacks shows up as a kernel-path count.
 * Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_util.h"
#include "tolerances.h"


static mr_tensor *nan_out(mr_dtype dt, mr_shape s) {
    int64_t n = mr_shape_numel(&s);
    double *h = th_alloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    return gpu_upload(h, dt, s);
}

/* stderr into a file while f runs (the fallback notices); returns what was written */
static char *stderr_of(void (*f)(void *), void *ctx) {
    char path[] = "/tmp/mirror-sdpa-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0 && dup2(fd, 2) == 2);
    f(ctx);
    fflush(stderr);
    assert_true(dup2(saved, 2) == 2);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    char *buf = th_alloc((size_t)n + 1);
    assert_true(pread(fd, buf, (size_t)n, 0) == n);
    close(fd);
    unlink(path);
    fputs(buf, stderr);
    return buf;
}

/* cuDNN against the kernels: element by element only (atol/rtol); no NMSE bound, which means
 * nothing where both round a true 0 differently (T = S = 1: dq is rounding noise on both paths) */
#define KERNEL_NMSE 1.0

/* the worst errors of the cuDNN path against the reference, by dtype (0 bf16, 1 f16) */
static double g_abs[2], g_rel[2];

/* th_compare with the cuDNN tolerances (the kernels' when the kernels ran), tracking the errors */
static int compare(const char *what, const double *x, const double *ref, int64_t n, mr_dtype dt, int cudnn) {
    for (int64_t i = 0; i < n && cudnn; i++) {
        double e = fabs(x[i] - ref[i]);
        int k = dt == MR_F16;
        if (e > g_abs[k]) g_abs[k] = e;
        if (fabs(ref[i]) > 1e-3 && e / fabs(ref[i]) > g_rel[k]) g_rel[k] = e / fabs(ref[i]);
    }
    return cudnn ? th_compare(what, x, MR_F64, ref, n, TOL_HALF_SDPA_ATOL, TOL_HALF_SDPA_RTOL, TOL_HALF_SDPA_NMSE)
                 : th_compare(what, x, MR_F64, ref, n, TOL_HALF_ATTN_ATOL, TOL_HALF_ATTN_RTOL, TOL_HALF_ATTN_NMSE);
}

typedef struct sdpa_case {
    mr_dtype dt;
    int64_t b, h, t, s, d;
    int causal;
    int want_cudnn; /* 1: cuDNN must run it; 0: mirror's kernels must */
    uint64_t seed;
} sdpa_case;

/* The device args of one call; the outputs start as NaN. */
typedef struct dev_call {
    mr_op_args a;
    mr_tensor *out[3];
    int n_out;
} dev_call;

/* Runs c twice (with MIRROR_CUDNN_SDPA=0 when off): every output the same bits both times (mirror
 * promises deterministic reruns: on the emulator a non-deterministic engine would change a bit),
 * the path that ran the cuDNN one when cudnn, else the kernels; returns output i. */
static double *run_and_get(dev_call *c, int cudnn, int off, int i) {
    mr_attention_paths before, after;
    mr_attention_paths_get(&before);
    if (off) setenv("MIRROR_CUDNN_SDPA", "0", 1);
    double *first[3];
    for (int r = 0; r < 2; r++) {
        gpu_run_op(&c->a);
        for (int o = 0; o < c->n_out; o++) {
            double *h = gpu_download(c->out[o]);
            if (r == 0) first[o] = h;
            else if (memcmp(first[o], h, (size_t)mr_shape_numel(&c->a.out[o].shape) * sizeof *h))
                fail_msg("attention: out[%d] differs between two runs (%s path)", o, cudnn ? "cuDNN" : "kernel");
        }
    }
    unsetenv("MIRROR_CUDNN_SDPA");
    mr_attention_paths_get(&after);
    int bwd = c->a.op == MR_OP_ATTENTION_BWD;
    int64_t dc = bwd ? after.cudnn_bwd - before.cudnn_bwd : after.cudnn_fwd - before.cudnn_fwd;
    int64_t dk = bwd ? after.kernel_bwd - before.kernel_bwd : after.kernel_fwd - before.kernel_fwd;
    if (dc != (cudnn ? 2 : 0) || dk != (cudnn ? 0 : 2))
        fail_msg("attention %s: expected the %s path, got %lld cuDNN and %lld kernel calls", bwd ? "backward" : "forward",
                 cudnn ? "cuDNN" : "kernel", (long long)dc, (long long)dk);
    return gpu_download(c->out[i]);
}

static void sdpa_case_run(const sdpa_case *k) {
    const mr_dtype dt = k->dt;
    const int64_t bh = k->b * k->h, t = k->t, s = k->s, d = k->d;
    mr_shape qs = mr_shape_4d(k->b, k->h, t, d), ks = mr_shape_4d(k->b, k->h, s, d), ls = mr_shape_3d(k->b, k->h, t);
    double *hq = gpu_rand(bh * t * d, -2, 2, k->seed, dt), *hk = gpu_rand(bh * s * d, -2, 2, k->seed + 1, dt);
    double *hv = gpu_rand(bh * s * d, -1, 1, k->seed + 2, dt), *hdy = gpu_rand(bh * t * d, -1, 1, k->seed + 3, dt);
    char what[160];
    snprintf(what, sizeof what, "sdpa %s b %lld h %lld t %lld s %lld d %lld causal %d", mr_dtype_name(dt),
             (long long)k->b, (long long)k->h, (long long)t, (long long)s, (long long)d, k->causal);

    mr_op_args r;
    mr_op_args_init(&r, MR_OP_ATTENTION);
    r.p.attention.scale = 1.0 / sqrt((double)d);
    r.p.attention.causal = k->causal;
    r.in[0] = gpu_f64_view(hq, qs);
    r.in[1] = gpu_f64_view(hk, ks);
    r.in[2] = gpu_f64_view(hv, ks);
    r.out[0] = th_view(MR_F64, qs);
    r.out[1] = th_view(MR_F64, ls);
    MR_ASSERT_OK(mr_op_run_ref(&r));

    dev_call f = {.a = r, .n_out = 2};
    f.a.in[0] = mr_tensor_as_view(gpu_upload(hq, dt, qs));
    f.a.in[1] = mr_tensor_as_view(gpu_upload(hk, dt, ks));
    f.a.in[2] = mr_tensor_as_view(gpu_upload(hv, dt, ks));
    f.out[0] = nan_out(dt, qs), f.out[1] = nan_out(gpu_lse_dtype(dt), ls);
    f.a.out[0] = mr_tensor_as_view(f.out[0]), f.a.out[1] = mr_tensor_as_view(f.out[1]);
    double *y = run_and_get(&f, k->want_cudnn, 0, 0), *lse = gpu_download(f.out[1]);
    assert_true(compare(what, y, r.out[0].data, bh * t * d, dt, k->want_cudnn));
    /* the stats are mirror's lse (f32), whichever path wrote them */
    assert_true(th_compare(what, lse, MR_F64, r.out[1].data, bh * t, GPU_F32_NORM_ATOL, GPU_F32_NORM_RTOL,
                           GPU_F32_NORM_NMSE));
    if (k->want_cudnn) { /* the kernels on the same inputs */
        double *yk = run_and_get(&f, 0, 1, 0);
        assert_true(th_compare(what, y, MR_F64, yk, bh * t * d, TOL_HALF_SDPA_ATOL, TOL_HALF_SDPA_RTOL, KERNEL_NMSE));
    }

    /* the backward on the reference's y and lse, rounded as stored */
    mr_op_args rb = gpu_attention_bwd_ref(&r, hdy, dt);
    double *hy = r.out[0].data, *hl = r.out[1].data;
    dev_call b = {.a = rb, .n_out = 3};
    for (int i = 0; i < 3; i++) b.a.in[i] = f.a.in[i];
    b.a.in[3] = mr_tensor_as_view(gpu_upload(hy, dt, qs));
    b.a.in[4] = mr_tensor_as_view(gpu_upload(hl, gpu_lse_dtype(dt), ls));
    b.a.in[5] = mr_tensor_as_view(gpu_upload(hdy, dt, qs));
    b.out[0] = nan_out(dt, qs), b.out[1] = nan_out(dt, ks), b.out[2] = nan_out(dt, ks);
    for (int i = 0; i < 3; i++) b.a.out[i] = mr_tensor_as_view(b.out[i]);
    snprintf(what + strlen(what), sizeof what - strlen(what), " bwd");
    double *g[3];
    g[0] = run_and_get(&b, k->want_cudnn, 0, 0);
    g[1] = gpu_download(b.out[1]);
    g[2] = gpu_download(b.out[2]);
    for (int i = 0; i < 3; i++)
        if (!compare(what, g[i], rb.out[i].data, mr_shape_numel(&rb.out[i].shape), dt, k->want_cudnn))
            fail_msg("%s: out[%d] (dq, dk, dv) against the reference", what, i);
    if (k->want_cudnn) {
        (void)run_and_get(&b, 0, 1, 0);
        for (int i = 0; i < 3; i++) {
            double *gk = gpu_download(b.out[i]);
            if (!th_compare(what, g[i], MR_F64, gk, mr_shape_numel(&rb.out[i].shape), TOL_HALF_SDPA_ATOL,
                            TOL_HALF_SDPA_RTOL, KERNEL_NMSE))
                fail_msg("%s: out[%d]: cuDNN against mirror's kernels", what, i);
        }
    }
    gpu_free_all();
}

static void test_sdpa_cudnn(void **state) {
    (void)state;
    const mr_dtype dts[2] = {MR_BF16, MR_F16};
    for (int i = 0; i < 2; i++) {
        const sdpa_case cases[] = {
            {dts[i], 1, 1, 1, 1, 8, 1, 1, 10},
            {dts[i], 2, 2, 16, 16, 8, 1, 1, 20},
            {dts[i], 1, 3, 8, 8, 16, 0, 1, 30},
            {dts[i], 2, 1, 5, 9, 24, 0, 1, 40},   /* T < S without a mask */
            {dts[i], 2, 2, 32, 32, 32, 1, 1, 50}, /* the tiny GPT's heads (tests/gpu/test_gpu_train.c) */
            {dts[i], 1, 2, 40, 40, 64, 1, 1, 60}, /* GPT-2's head dim, rows longer than a warp */
            {dts[i], 1, 1, 64, 128, 8, 1, 1, 70}, /* causal T < S: bottom-right mask, multiples of 64 */
            {dts[i], 1, 1, 12, 12, 128, 1, 1, 80}, /* the largest head dim */
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) sdpa_case_run(&cases[c]);
    }
    fprintf(stderr, "cuDNN path against the reference: bf16 max abs %.2e, max rel %.2e (|ref| > 1e-3); f16 max abs "
                    "%.2e, max rel %.2e\n", g_abs[0], g_rel[0], g_abs[1], g_rel[1]);
}

static void run_case(void *k) { sdpa_case_run((const sdpa_case *)k); }

/* What cuDNN has no engine for runs mirror's kernels, and says so once per shape. */
static void test_sdpa_fallback(void **state) {
    (void)state;
    const sdpa_case head12 = {MR_BF16, 1, 2, 6, 6, 12, 1, 0, 90};
    char *log = stderr_of(run_case, (void *)&head12);
    assert_non_null(strstr(log, "cuDNN flash attention (forward, bf16, B 1 H 2 T 6 S 6 D 12, causal) is not available"));
    assert_non_null(strstr(log, "head dim must be a multiple of 8"));
    assert_non_null(strstr(log, "(backward, bf16"));
    log = stderr_of(run_case, (void *)&head12); /* once per shape: the second time says nothing */
    assert_null(strstr(log, "not available"));
    const sdpa_case shifted = {MR_F16, 1, 1, 4, 9, 8, 1, 0, 100}; /* causal T < S, not multiples of 64 */
    log = stderr_of(run_case, (void *)&shifted);
    assert_non_null(strstr(log, "bottom-right causal mask"));
    /* f32: mirror's kernels, by design (cuDNN's flash attention is for half types) */
    const sdpa_case f32 = {MR_F32, 1, 2, 8, 8, 16, 1, 0, 110};
    sdpa_case_run(&f32);
}

int main(void) {
    if (gpu_none()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sdpa_cudnn),
        cmocka_unit_test(test_sdpa_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
