/* CAST on the CPU: the f32 <-> f16 and f32 <-> bf16 paths are vectorised; the rest run simple
 * loops (f16 <-> bf16 goes through f32, which is exact) or the reference (anything with f64).
 *
 * Every path gives the same bits as the scalar conversions of core/math/half_math.h
 * (tests/unit/test_ops_cast.c checks this over every f16/bf16 pattern and every f32 pattern):
 *  - bf16: the scalar functions are branch-light integer code that gcc vectorises as they are;
 *    an AVX-512BW build of the same loop is picked at run time for wider vectors.
 *  - f16: the scalar f32 -> f16 has data-dependent branches and f16 -> f32 a float multiply that
 *    gcc will not if-convert (it may trap), so neither loop vectorises. With F16C (and AVX2), the
 *    hardware conversions VCVTPS2PH (round to nearest even, subnormals kept, NaN quieted with
 *    its top payload bits kept, exactly as mr_f32_to_f16) and VCVTPH2PS are used; VCVTPH2PS
 *    quiets signalling NaNs where mr_f16_to_f32 keeps the payload as is, so NaN lanes are
 *    rebuilt with integer ops.
 * Large casts split into contiguous chunks across OpenMP threads; the result does not depend
 * on the split since each element is converted on its own. */
#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"
#include "core/ops_impl.h"

#include <immintrin.h>
#include <string.h>

/* Below this many elements a cast runs on the calling thread. */
#define CAST_PAR_MIN 65536
#define CAST_CHUNK 16384

/* ---- bf16: the plain loops, built for the baseline and for AVX-512BW ------------------------- */

#define DEFINE_BF16_LOOPS(suffix, attr)                                                          \
    attr static void f32_to_bf16_##suffix(const float *restrict x, uint16_t *restrict y, int64_t n) { \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = mr_f32_to_bf16(x[i]);          \
    }                                                                                             \
    attr static void bf16_to_f32_##suffix(const uint16_t *restrict x, float *restrict y, int64_t n) { \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = mr_bf16_to_f32(x[i]);          \
    }

DEFINE_BF16_LOOPS(base, )
DEFINE_BF16_LOOPS(avx512, __attribute__((target("avx512f,avx512bw"))))

/* ---- f16: F16C with a scalar tail, or the scalar loop --------------------------------------- */

__attribute__((target("avx2,f16c"))) static void f32_to_f16_f16c(const float *restrict x, uint16_t *restrict y,
                                                                  int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(y + i), h);
    }
    for (; i < n; i++) y[i] = mr_f32_to_f16(x[i]);
}

__attribute__((target("avx2,f16c"))) static void f16_to_f32_f16c(const uint16_t *restrict x, float *restrict y,
                                                                  int64_t n) {
    int64_t i = 0;
    const __m256i sign_bit = _mm256_set1_epi32(0x8000), mag = _mm256_set1_epi32(0x7fff);
    const __m256i mant = _mm256_set1_epi32(0x3ff), inf32 = _mm256_set1_epi32(0x7f800000);
    const __m256i last_finite = _mm256_set1_epi32(0x7bff);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(x + i));
        __m256 f = _mm256_cvtph_ps(h);
        __m256i w = _mm256_cvtepu16_epi32(h);
        /* exponent all ones (inf, NaN): sign | 0x7f800000 | m << 13, payload kept as is */
        __m256i special = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, sign_bit), 16), inf32),
                                          _mm256_slli_epi32(_mm256_and_si256(w, mant), 13));
        __m256i is_special = _mm256_cmpgt_epi32(_mm256_and_si256(w, mag), last_finite);
        __m256i r = _mm256_blendv_epi8(_mm256_castps_si256(f), special, is_special);
        _mm256_storeu_si256((__m256i *)(y + i), r);
    }
    for (; i < n; i++) y[i] = mr_f16_to_f32(x[i]);
}

static void f32_to_f16_base(const float *restrict x, uint16_t *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = mr_f32_to_f16(x[i]);
}

static void f16_to_f32_base(const uint16_t *restrict x, float *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = mr_f16_to_f32(x[i]);
}

/* ---- the kernel ------------------------------------------------------------------------------- */

typedef enum cast_path { P_COPY, P_F32_BF16, P_BF16_F32, P_F32_F16, P_F16_F32, P_HALF_HALF } cast_path;

/* Converts elements [lo, hi) of x into y along `path`; wide selects the AVX-512/F16C loops. */
static void cast_range(cast_path path, int wide_bf16, int f16c, const void *x, void *y, mr_dtype xt, mr_dtype yt,
                       int64_t lo, int64_t hi) {
    int64_t n = hi - lo;
    switch (path) {
    case P_COPY:
        memcpy((char *)y + lo * (int64_t)mr_dtype_size(yt), (const char *)x + lo * (int64_t)mr_dtype_size(xt),
               (size_t)n * mr_dtype_size(xt));
        break;
    case P_F32_BF16:
        (wide_bf16 ? f32_to_bf16_avx512 : f32_to_bf16_base)((const float *)x + lo, (uint16_t *)y + lo, n);
        break;
    case P_BF16_F32:
        (wide_bf16 ? bf16_to_f32_avx512 : bf16_to_f32_base)((const uint16_t *)x + lo, (float *)y + lo, n);
        break;
    case P_F32_F16:
        (f16c ? f32_to_f16_f16c : f32_to_f16_base)((const float *)x + lo, (uint16_t *)y + lo, n);
        break;
    case P_F16_F32:
        (f16c ? f16_to_f32_f16c : f16_to_f32_base)((const uint16_t *)x + lo, (float *)y + lo, n);
        break;
    case P_HALF_HALF: {
        /* f16 <-> bf16: widening to f32 is exact, so this rounds once, as the reference does */
        const uint16_t *hx = (const uint16_t *)x + lo;
        uint16_t *hy = (uint16_t *)y + lo;
        if (xt == MR_F16)
            for (int64_t i = 0; i < n; i++) hy[i] = mr_f32_to_bf16(mr_f16_to_f32(hx[i]));
        else
            for (int64_t i = 0; i < n; i++) hy[i] = mr_f32_to_f16(mr_bf16_to_f32(hx[i]));
        break;
    }
    }
}

/* x (any shape) -> y (same shape); dtypes from the views. */
mr_status mr_cast_fwd_cpu(const mr_op_args *a) {
    const mr_view *x = &a->in[0], *y = &a->out[0];
    mr_dtype xt = x->dtype, yt = y->dtype;
    if (xt == MR_F64 || yt == MR_F64) return mr_cast_fwd_ref(a);
    cast_path path;
    if (xt == yt)
        path = P_COPY;
    else if (xt == MR_F32)
        path = yt == MR_BF16 ? P_F32_BF16 : P_F32_F16;
    else if (yt == MR_F32)
        path = xt == MR_BF16 ? P_BF16_F32 : P_F16_F32;
    else
        path = P_HALF_HALF;
    const mr_cpu_caps *caps = mr_cpu_caps_get();
    int wide_bf16 = caps->avx512f && caps->avx512bw;
    int f16c = caps->f16c && caps->avx2;
    int64_t n = mr_shape_numel(&x->shape);
    int64_t chunks = (n + CAST_CHUNK - 1) / CAST_CHUNK;
#pragma omp parallel for schedule(static) if (n > CAST_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t lo = c * CAST_CHUNK, hi = lo + CAST_CHUNK < n ? lo + CAST_CHUNK : n;
        cast_range(path, wide_bf16, f16c, x->data, y->data, xt, yt, lo, hi);
    }
    return MR_OK;
}
