/* Permute, CPU fast path (f32; f64 runs the reference). Size-1 dims are dropped and runs of dims
 * that stay adjacent and in order are merged first, so (B,T,H,D)->(B,H,T,D) becomes a copy of
 * contiguous D-rows and any "swap the last two dims" becomes a batched 2-d transpose. Then:
 * identity: one memcpy; last dim kept: row copies; last two swapped: cache-blocked transposes;
 * anything else: a strided gather per output row. All are parallel over disjoint outputs. The
 * simplification (core/math/permute_math.h) is shared with the CUDA kernels.
 * A bf16/f16 y takes the same paths, each element rounded as CAST rounds it (core/math/half_math.h):
 * the permute and the cast after it in one pass (autodiff/nn.c's mixed attention). */
#include "core/ops_impl.h"
#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"
#include "core/math/permute_math.h"

#include <string.h>

#define PERMUTE_PAR_MIN 32768
/* Tile edge of the blocked transpose: two 32x32 f32 tiles fit in L1. */
#define PERMUTE_TILE 32

/* dst[j] = src[j * inner] for j < n, rounded to y's dtype: f32 (h 0), bf16 (h 1) or f16 (h 2);
 * built for the baseline ISA and for AVX-512BW (the bf16 rounding's integer code 16 lanes wide). */
#define DEFINE_COPY_ROW(suffix, attr)                                                                     \
    attr static void copy_row_##suffix(void *restrict dst, const float *restrict src, int64_t n, int64_t inner, \
                                       int h) {                                                                \
        if (h == 0 && inner == 1) {                                                                            \
            memcpy(dst, src, (size_t)n * sizeof(float));                                                       \
        } else if (h == 0) {                                                                                   \
            float *restrict d = dst;                                                                           \
            _Pragma("omp simd") for (int64_t j = 0; j < n; j++) d[j] = src[j * inner];                         \
        } else if (h == 1 && inner == 1) {                                                                     \
            uint16_t *restrict d = dst;                                                                        \
            _Pragma("omp simd") for (int64_t j = 0; j < n; j++) d[j] = mr_f32_to_bf16(src[j]);                 \
        } else if (h == 1) {                                                                                   \
            uint16_t *restrict d = dst;                                                                        \
            _Pragma("omp simd") for (int64_t j = 0; j < n; j++) d[j] = mr_f32_to_bf16(src[j * inner]);         \
        } else {                                                                                               \
            uint16_t *restrict d = dst;                                                                        \
            for (int64_t j = 0; j < n; j++) d[j] = mr_f32_to_f16(src[j * inner]);                              \
        }                                                                                                      \
    }
DEFINE_COPY_ROW(def, )
DEFINE_COPY_ROW(avx512, __attribute__((target("avx512f,avx512bw"))))

typedef void (*copy_row_fn)(void *restrict, const float *restrict, int64_t, int64_t, int);

mr_status mr_permute_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_permute_fwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const float *x = a->in[0].data; /* x (any shape) */
    char *y = a->out[0].data;       /* y (x's dims permuted), f32, bf16 or f16 */
    const int h = a->out[0].dtype == MR_BF16 ? 1 : a->out[0].dtype == MR_F16 ? 2 : 0;
    const size_t ys = h ? sizeof(uint16_t) : sizeof(float);
    const copy_row_fn copy_row = mr_cpu_caps_get()->avx512bw ? copy_row_avx512 : copy_row_def;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    if (n == 0) return MR_OK;
    mr_perm_plan pl;
    mr_perm_simplify(&a->in[0].shape, a->p.permute.perm, &pl);
    int nd = pl.nd, par = n > PERMUTE_PAR_MIN;
    if (nd <= 1) {
#pragma omp parallel for schedule(static) if (par && h)
        for (int64_t i = 0; i < n; i += PERMUTE_PAR_MIN)
            copy_row(y + (size_t)i * ys, x + i, n - i < PERMUTE_PAR_MIN ? n - i : PERMUTE_PAR_MIN, 1, h);
        return MR_OK;
    }
    int64_t xstr[MR_MAX_DIMS], ydim[MR_MAX_DIMS];
    xstr[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--) xstr[d] = xstr[d + 1] * pl.xdim[d + 1];
    for (int i = 0; i < nd; i++) ydim[i] = pl.xdim[pl.perm[i]];
    int64_t cols = ydim[nd - 1], rows = n / cols;
    int swap2 = pl.perm[nd - 1] == nd - 2 && pl.perm[nd - 2] == nd - 1;
    for (int i = 0; i < nd - 2; i++) swap2 = swap2 && pl.perm[i] == i;
    if (swap2) {
        /* batches of x (r, c) -> y (c, r), tiled so both sides stream through cache lines */
        int64_t r = pl.xdim[nd - 2], c = pl.xdim[nd - 1], batch = n / (r * c);
        int64_t tr = (r + PERMUTE_TILE - 1) / PERMUTE_TILE, tc = (c + PERMUTE_TILE - 1) / PERMUTE_TILE;
#pragma omp parallel for collapse(2) schedule(static) if (par)
        for (int64_t b = 0; b < batch; b++)
            for (int64_t t = 0; t < tr * tc; t++) {
                int64_t i0 = (t / tc) * PERMUTE_TILE, j0 = (t % tc) * PERMUTE_TILE;
                int64_t i1 = i0 + PERMUTE_TILE < r ? i0 + PERMUTE_TILE : r;
                int64_t j1 = j0 + PERMUTE_TILE < c ? j0 + PERMUTE_TILE : c;
                const float *xb = x + b * r * c;
                char *yb = y + (size_t)(b * r * c) * ys;
                for (int64_t j = j0; j < j1; j++)
                    copy_row(yb + (size_t)(j * r + i0) * ys, xb + i0 * c + j, i1 - i0, c, h);
            }
        return MR_OK;
    }
    int64_t inner = xstr[pl.perm[nd - 1]];
#pragma omp parallel for schedule(static) if (par)
    for (int64_t row = 0; row < rows; row++) {
        int64_t rem = row, off = 0;
        for (int d = nd - 2; d >= 0; d--) {
            off += (rem % ydim[d]) * xstr[pl.perm[d]];
            rem /= ydim[d];
        }
        copy_row(y + (size_t)(row * cols) * ys, x + off, cols, inner, h);
    }
    return MR_OK;
}
