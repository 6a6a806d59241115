/* GPU attention (ATTENTION, ATTENTION_BWD) against the f64 reference, in f32, f64, bf16 and f16:
 * causal and not, T < S, T = 1, D = 1, head dims that are not multiples of 8, rows longer than a
 * warp, many (batch, head) slices. The reference sees the same rounded inputs; the backward's y
 * and lse are the reference forward's (rounded to what the GPU stores), so each direction is
 * checked on its own. Every GPU run happens twice and must give the same bits; outputs start as
 * NaN, so an element a kernel fails to write is caught. A sequence whose row does not fit the
 * kernel's shared memory is refused with an error, not run. Without a usable GPU the program exits
 * 77 and CTest reports it SKIPPED. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"

/* On the emulator every GPU thread is a fiber: smaller sequences, the same kernels and paths. */
#ifdef MIRROR_EMU
#define ATTN_LONG 96
#else
#define ATTN_LONG 1024
#endif

static void tol(mr_dtype dt, double *atol, double *rtol, double *nmse) {
    if (dt == MR_F64) {
        *atol = GPU_F64_NORM_ATOL, *rtol = GPU_F64_NORM_RTOL, *nmse = GPU_F64_NORM_NMSE;
    } else if (dt == MR_F32) {
        *atol = GPU_F32_NORM_ATOL, *rtol = GPU_F32_NORM_RTOL, *nmse = GPU_F32_NORM_NMSE;
    } else {
        *atol = TOL_HALF_ATTN_ATOL, *rtol = TOL_HALF_ATTN_RTOL, *nmse = TOL_HALF_ATTN_NMSE;
    }
}


/* Runs args whose views are device tensors twice; returns the downloads of every output of the
 * second run after checking they equal the first's bit for bit. */
static void run_twice(const char *what, mr_op_args *g, mr_tensor **outs, int n_out, double **res) {
    double *first[3];
    for (int r = 0; r < 2; r++) {
        gpu_run_op(g);
        for (int i = 0; i < n_out; i++) {
            double *h = gpu_download(outs[i]);
            if (r == 0) first[i] = h;
            else {
                int64_t n = mr_shape_numel(&g->out[i].shape);
                if (memcmp(first[i], h, (size_t)n * sizeof *h))
                    fail_msg("%s: out[%d] differs between two runs (not deterministic)", what, i);
                res[i] = h;
            }
        }
    }
}

static mr_view dev_view(mr_tensor *t) { return mr_tensor_as_view(t); }

/* A device output that starts as NaN, so an element the kernel does not write fails the check. */
static mr_tensor *nan_out(mr_dtype dt, mr_shape s) {
    int64_t n = mr_shape_numel(&s);
    double *h = th_alloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    return gpu_upload(h, dt, s);
}

static void attn_case(mr_dtype dt, int64_t bh, int64_t t, int64_t s, int64_t d, int causal, uint64_t seed) {
    mr_shape qs = mr_shape_3d(bh, t, d), ks = mr_shape_3d(bh, s, d), ls = mr_shape_2d(bh, t);
    double *hq = gpu_rand(bh * t * d, -2, 2, seed, dt), *hk = gpu_rand(bh * s * d, -2, 2, seed + 1, dt);
    double *hv = gpu_rand(bh * s * d, -1, 1, seed + 2, dt), *hdy = gpu_rand(bh * t * d, -1, 1, seed + 3, dt);
    double atol, rtol, nmse;
    tol(dt, &atol, &rtol, &nmse);
    char what[160];
    snprintf(what, sizeof what, "attention %s bh %lld t %lld s %lld d %lld causal %d", mr_dtype_name(dt),
             (long long)bh, (long long)t, (long long)s, (long long)d, causal);

    /* the reference forward */
    mr_op_args r;
    mr_op_args_init(&r, MR_OP_ATTENTION);
    r.p.attention.scale = 1.0 / sqrt((double)d);
    r.p.attention.causal = causal;
    r.in[0] = gpu_f64_view(hq, qs);
    r.in[1] = gpu_f64_view(hk, ks);
    r.in[2] = gpu_f64_view(hv, ks);
    r.out[0] = th_view(MR_F64, qs);
    r.out[1] = th_view(MR_F64, ls);
    MR_ASSERT_OK(mr_op_run_ref(&r));

    /* the GPU forward */
    mr_op_args g = r;
    mr_tensor *tq = gpu_upload(hq, dt, qs), *tk = gpu_upload(hk, dt, ks), *tv = gpu_upload(hv, dt, ks);
    mr_tensor *outs[3] = {nan_out(dt, qs), nan_out(gpu_lse_dtype(dt), ls)};
    g.in[0] = dev_view(tq), g.in[1] = dev_view(tk), g.in[2] = dev_view(tv);
    g.out[0] = dev_view(outs[0]), g.out[1] = dev_view(outs[1]);
    double *res[3];
    run_twice(what, &g, outs, 2, res);
    assert_true(th_compare(what, res[0], MR_F64, r.out[0].data, bh * t * d, atol, rtol, nmse));
    assert_true(th_compare(what, res[1], MR_F64, r.out[1].data, bh * t, dt == MR_F64 ? atol : GPU_F32_NORM_ATOL,
                           dt == MR_F64 ? rtol : GPU_F32_NORM_RTOL, dt == MR_F64 ? nmse : GPU_F32_NORM_NMSE));

    /* the backward on the reference's y and lse, rounded to what the GPU stores */
    mr_op_args rb = gpu_attention_bwd_ref(&r, hdy, dt);
    double *hy = r.out[0].data, *hl = r.out[1].data;
    mr_op_args gb = rb;
    for (int i = 0; i < 3; i++) gb.in[i] = g.in[i];
    gb.in[3] = dev_view(gpu_upload(hy, dt, qs));
    gb.in[4] = dev_view(gpu_upload(hl, gpu_lse_dtype(dt), ls));
    gb.in[5] = dev_view(gpu_upload(hdy, dt, qs));
    mr_tensor *bouts[3] = {nan_out(dt, qs), nan_out(dt, ks), nan_out(dt, ks)};
    for (int i = 0; i < 3; i++) gb.out[i] = dev_view(bouts[i]);
    snprintf(what + strlen(what), sizeof what - strlen(what), " bwd");
    run_twice(what, &gb, bouts, 3, res);
    for (int i = 0; i < 3; i++) {
        int64_t n = mr_shape_numel(&rb.out[i].shape);
        if (!th_compare(what, res[i], MR_F64, rb.out[i].data, n, atol, rtol, nmse)) fail_msg("%s: out[%d]", what, i);
    }
    gpu_free_all();
}

static void test_attention(void **state) {
    (void)state;
    const mr_dtype dts[4] = {MR_F32, MR_F64, MR_BF16, MR_F16};
    for (int i = 0; i < 4; i++) {
        mr_dtype dt = dts[i];
        attn_case(dt, 1, 1, 1, 1, 1, 10);
        attn_case(dt, 3, 5, 5, 3, 1, 20);
        attn_case(dt, 2, 7, 7, 8, 0, 30);
        attn_case(dt, 3, 4, 9, 5, 1, 40); /* T < S: the mask's diagonal is shifted */
        attn_case(dt, 2, 1, 40, 7, 1, 50);
        attn_case(dt, 4, 40, 40, 64, 1, 60); /* rows longer than a warp, GPT-2's head dim */
    }
    attn_case(MR_BF16, 2, ATTN_LONG, ATTN_LONG, 16, 1, 70);
    attn_case(MR_F32, 2, ATTN_LONG, ATTN_LONG, 130, 0, 80); /* head dim above 128 */
}

/* A row that does not fit shared memory is an error naming the op, not a failed launch. */
static void test_attention_too_long(void **state) {
    (void)state;
    const int64_t s = 13000; /* 52000 bytes of f32 scores > 48 KiB */
    mr_op_args g;
    mr_op_args_init(&g, MR_OP_ATTENTION);
    g.p.attention.scale = 1.0;
    g.in[0] = mr_tensor_as_view(gpu_alloc(MR_BF16, mr_shape_3d(1, 1, 8)));
    g.in[1] = mr_tensor_as_view(gpu_alloc(MR_BF16, mr_shape_3d(1, s, 8)));
    g.in[2] = mr_tensor_as_view(gpu_alloc(MR_BF16, mr_shape_3d(1, s, 8)));
    g.out[0] = mr_tensor_as_view(gpu_alloc(MR_BF16, mr_shape_3d(1, 1, 8)));
    g.out[1] = mr_tensor_as_view(gpu_alloc(MR_F32, mr_shape_2d(1, 1)));
    mr_status st = mr_op_run(MR_DEVICE_CUDA, &g);
    assert_int_equal(st, MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "attention"));
    assert_non_null(strstr(mr_last_error(), "HINT"));
    gpu_free_all();
}

int main(void) {
    if (gpu_none()) return 77;
    /* mirror's own kernels (bf16/f16 would go to cuDNN first: tests/gpu/test_gpu_sdpa.c tests that) */
    setenv("MIRROR_CUDNN_SDPA", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_too_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
