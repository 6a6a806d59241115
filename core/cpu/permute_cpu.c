/* Permute, CPU fast path (f32; f64 runs the reference). Size-1 dims are dropped and runs of dims
 * that stay adjacent and in order are merged first, so (B,T,H,D)->(B,H,T,D) becomes a copy of
 * contiguous D-rows and any "swap the last two dims" becomes a batched 2-d transpose. Then:
 * identity: one memcpy; last dim kept: row copies; last two swapped: cache-blocked transposes;
 * anything else: a strided gather per output row. All are parallel over disjoint outputs. The
 * simplification (core/math/permute_math.h) is shared with the CUDA kernels. */
#include "core/ops_impl.h"
#include "core/math/permute_math.h"

#include <string.h>

#define PERMUTE_PAR_MIN 32768
/* Tile edge of the blocked transpose: two 32x32 f32 tiles fit in L1. */
#define PERMUTE_TILE 32

mr_status mr_permute_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_permute_fwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const float *x = a->in[0].data; /* x (any shape) */
    float *y = a->out[0].data;      /* y (x's dims permuted) */
    int64_t n = mr_shape_numel(&a->in[0].shape);
    if (n == 0) return MR_OK;
    mr_perm_plan pl;
    mr_perm_simplify(&a->in[0].shape, a->p.permute.perm, &pl);
    if (pl.nd <= 1) {
        memcpy(y, x, (size_t)n * sizeof(float));
        return MR_OK;
    }
    int nd = pl.nd, par = n > PERMUTE_PAR_MIN;
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
                float *yb = y + b * r * c;
                for (int64_t j = j0; j < j1; j++)
                    for (int64_t i = i0; i < i1; i++) yb[j * r + i] = xb[i * c + j];
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
        const float *restrict src = x + off;
        float *restrict dst = y + row * cols;
        if (inner == 1) {
            memcpy(dst, src, (size_t)cols * sizeof(float));
        } else {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) dst[j] = src[j * inner];
        }
    }
    return MR_OK;
}
