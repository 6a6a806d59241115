/* Tests of MR_OP_CAST: every dtype pair on the CPU against the reference (bit for bit), the
 * vectorised f16/bf16 paths against the scalar conversions of core/math/half_math.h over every
 * f16 and bf16 bit pattern and every f32 bit pattern, the f64 -> f32 rounding, and the errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "harness.h"
#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"
#include "core/ops.h"

static const mr_dtype k_float_types[4] = {MR_F32, MR_F64, MR_F16, MR_BF16};

static mr_op_args cast_args(mr_view x, mr_view y) {
    mr_op_args a;
    mr_op_args_init(&a, MR_OP_CAST);
    a.in[0] = x;
    a.out[0] = y;
    return a;
}

/* Fills x (n, of dtype dt) with random values of mixed magnitude plus specials: +-0, +-inf, NaN,
 * f16 overflow and subnormal values, f16 ties. */
static void fill_mixed(mr_view *x, int64_t n, uint64_t seed) {
    double *u = th_alloc((size_t)n * sizeof *u);
    double *e = th_alloc((size_t)n * sizeof *e);
    th_fill_uniform_f64(u, n, -1.0, 1.0, seed);
    th_fill_uniform_f64(e, n, -30.0, 20.0, seed + 1);
    static const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 65504.0, 65519.0, 65520.0, 1e6,
                                      5.9604644775390625e-08, 2.98023223876953125e-08, 1.00048828125,
                                      -1.00146484375, 1e-40, 3.0e38};
    for (int64_t i = 0; i < n; i++) {
        double v = u[i] * exp2(floor(e[i]));
        if (i % 7 == 3) v = specials[(i / 7) % (int64_t)(sizeof specials / sizeof *specials)];
        mr_dtype_set(x->data, x->dtype, i, v);
    }
}

/* Bitwise equality of two buffers of dtype dt, NaN equal to any NaN. Returns the mismatches. */
static int64_t count_mismatch(const void *p, const void *q, mr_dtype dt, int64_t n) {
    int64_t bad = 0;
    size_t es = mr_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        double a = mr_dtype_get(p, dt, i), b = mr_dtype_get(q, dt, i);
        if (isnan(a) && isnan(b)) continue;
        if (memcmp((const char *)p + i * (int64_t)es, (const char *)q + i * (int64_t)es, es)) {
            if (bad < 5) print_error("  %s element %lld: %.9g vs ref %.9g\n", mr_dtype_name(dt), (long long)i, a, b);
            bad++;
        }
    }
    return bad;
}

/* Every dtype pair, several shapes (size 1, odd sizes around the 8-lane vectors, one large
 * enough for the threaded path): CPU output == reference output, bit for bit. */
static void test_cast_all_pairs(void **state) {
    (void)state;
    const mr_shape shapes[] = {mr_shape_1d(1), mr_shape_2d(1, 7), mr_shape_1d(8), mr_shape_3d(3, 1, 9),
                               mr_shape_2d(33, 31), mr_shape_1d(200003)};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t n = mr_shape_numel(&shapes[s]);
        for (int i = 0; i < 4; i++) {
            for (int j = 0; j < 4; j++) {
                mr_view x = th_view(k_float_types[i], shapes[s]);
                mr_view y = th_view(k_float_types[j], shapes[s]), yr = th_view(k_float_types[j], shapes[s]);
                fill_mixed(&x, n, 100 + s);
                mr_op_args a = cast_args(x, y), r = cast_args(x, yr);
                MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
                MR_ASSERT_OK(mr_op_run_ref(&r));
                int64_t bad = count_mismatch(y.data, yr.data, y.dtype, n);
                if (bad) fail_msg("cast %s -> %s, n=%lld: %lld mismatches", mr_dtype_name(x.dtype),
                                  mr_dtype_name(y.dtype), (long long)n, (long long)bad);
            }
        }
        th_free_all();
    }
}

/* f64 -> f32 on the CPU against the f64 values: within half an f32 ulp (round to nearest). */
static void test_cast_f64_to_f32_tolerance(void **state) {
    (void)state;
    int64_t n = 4099;
    mr_view x = th_view(MR_F64, mr_shape_1d(n)), y = th_view(MR_F32, mr_shape_1d(n));
    th_fill_uniform_f64(x.data, n, -3.0, 3.0, 7);
    mr_op_args a = cast_args(x, y);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    assert_true(th_compare("cast f64->f32", y.data, MR_F32, x.data, n, 0.0, 0x1p-24, 1e-14));
    /* and back: f32 -> f64 is exact */
    mr_view z = th_view(MR_F64, mr_shape_1d(n)), yd = th_view(MR_F64, mr_shape_1d(n));
    th_f32_to_f64(y.data, yd.data, n);
    a = cast_args(y, z);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
    assert_true(th_compare("cast f32->f64", z.data, MR_F64, yd.data, n, 0.0, 0.0, 0.0));
    th_free_all();
}

/* Every f16 and bf16 bit pattern, widened by the CPU op (F16C or the plain loop), equals the
 * scalar conversion bit for bit (NaN payloads included); narrowing the result back gives the
 * pattern again (NaN: a quiet NaN of the same sign). */
static void test_cast_half_exhaustive(void **state) {
    (void)state;
    const int64_t n = 65536;
    for (int k = 0; k < 2; k++) {
        mr_dtype ht = k ? MR_BF16 : MR_F16;
        mr_view h = th_view(ht, mr_shape_1d(n)), f = th_view(MR_F32, mr_shape_1d(n)), h2 = th_view(ht, mr_shape_1d(n));
        uint16_t *hb = h.data, *h2b = h2.data;
        uint32_t *fb = f.data;
        for (int64_t i = 0; i < n; i++) hb[i] = (uint16_t)i;
        mr_op_args a = cast_args(h, f);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        a = cast_args(f, h2);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        for (int64_t i = 0; i < n; i++) {
            uint16_t p = (uint16_t)i;
            uint32_t want = mr_f32_bits(k ? mr_bf16_to_f32(p) : mr_f16_to_f32(p));
            if (fb[i] != want) fail_msg("%s 0x%04x -> f32 0x%08x, scalar 0x%08x", mr_dtype_name(ht), p, fb[i], want);
            int nan = k ? (p & 0x7fffu) > 0x7f80u : (p & 0x7fffu) > 0x7c00u;
            uint16_t qbit = k ? 0x0040u : 0x0200u;
            if (!nan && h2b[i] != p) fail_msg("%s 0x%04x round trip gives 0x%04x", mr_dtype_name(ht), p, h2b[i]);
            if (nan && (h2b[i] != (p | qbit))) fail_msg("%s NaN 0x%04x comes back as 0x%04x", mr_dtype_name(ht), p, h2b[i]);
        }
        th_free_all();
    }
}

/* Every one of the 2^31 non-negative f32 bit patterns through the CPU op to f16 and to bf16
 * equals the scalar conversion, and every 7th negative one (both paths treat the sign as a bit
 * copied through; checking all 2^32 takes 10 s of CPU). Under the sanitizers or valgrind (th_quick) every
 * 61st pattern is checked instead, which still covers every exponent and the low mantissa bits. */
static void test_cast_f32_exhaustive(void **state) {
    (void)state;
    const int64_t chunk = (int64_t)1 << 22;
    const int64_t step_pos = th_quick() ? 61 : 1, step_neg = th_quick() ? 61 : 7;
    mr_view x = th_view(MR_F32, mr_shape_1d(chunk));
    mr_view yh = th_view(MR_F16, mr_shape_1d(chunk)), yb = th_view(MR_BF16, mr_shape_1d(chunk));
    uint32_t *xb = x.data;
    const uint16_t *hb = yh.data, *bb = yb.data;
    int64_t bad = 0;
    const mr_cpu_caps *caps = mr_cpu_caps_get();
    print_message("f16 path: %s; bf16 path: %s\n", caps->f16c && caps->avx2 ? "F16C" : "scalar loop",
                  caps->avx512f && caps->avx512bw ? "AVX-512BW loop" : "baseline loop");
    /* one thread: idle OpenMP workers spin between the op calls and the serial checks, which on
     * a loaded machine costs more than the second thread gains (the threaded path is covered by
     * test_cast_all_pairs) */
#ifdef _OPENMP
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    const int64_t half = (int64_t)1 << 31;
    for (int64_t base = 0; base < ((int64_t)1 << 32);) {
        int64_t step = base < half ? step_pos : step_neg;
        for (int64_t i = 0; i < chunk; i++) xb[i] = (uint32_t)(base + i * step);
        base += chunk * step;
        mr_op_args a = cast_args(x, yh);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        a = cast_args(x, yb);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &a));
        for (int64_t i = 0; i < chunk; i++) {
            float f = mr_bits_f32(xb[i]);
            bad += (hb[i] != mr_f32_to_f16(f)) + (bb[i] != mr_f32_to_bf16(f));
        }
        if (bad) {
            for (int64_t i = 0; i < chunk; i++) {
                float f = mr_bits_f32(xb[i]);
                if (hb[i] != mr_f32_to_f16(f) || bb[i] != mr_f32_to_bf16(f))
                    fail_msg("f32 0x%08x: op f16 0x%04x bf16 0x%04x, scalar f16 0x%04x bf16 0x%04x", xb[i], hb[i],
                             bb[i], mr_f32_to_f16(f), mr_f32_to_bf16(f));
            }
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(saved_threads);
#endif
    th_free_all();
}

static void expect_invalid(mr_op_args *a, const char *what) {
    mr_status st = mr_op_run(MR_DEVICE_CPU, a);
    if (st != MR_ERR_INVALID) fail_msg("%s: expected MR_ERR_INVALID, got %s", what, mr_status_name(st));
    if (!strstr(mr_last_error(), "cast")) fail_msg("%s: error does not name the op: %s", what, mr_last_error());
    assert_int_equal(mr_op_run_ref(a), MR_ERR_INVALID);
}

static void test_cast_errors(void **state) {
    (void)state;
    mr_view x = th_view(MR_F32, mr_shape_2d(3, 4));
    mr_op_args a = cast_args(x, th_view(MR_F16, mr_shape_2d(4, 3)));
    expect_invalid(&a, "shape mismatch");
    a = cast_args(th_view(MR_I32, mr_shape_2d(3, 4)), th_view(MR_F32, mr_shape_2d(3, 4)));
    expect_invalid(&a, "i32 input");
    a = cast_args(x, th_view(MR_U8, mr_shape_2d(3, 4)));
    expect_invalid(&a, "u8 output");
    a = cast_args(x, th_view(MR_F16, mr_shape_2d(3, 4)));
    a.out[0].data = NULL;
    expect_invalid(&a, "missing output");
    th_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cast_all_pairs),
        cmocka_unit_test(test_cast_f64_to_f32_tolerance),
        cmocka_unit_test(test_cast_half_exhaustive),
        cmocka_unit_test(test_cast_f32_exhaustive),
        cmocka_unit_test(test_cast_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
