/* Permute, CPU fast path (f32; f64 runs the reference). Size-1 dims are dropped and runs of dims
 * that stay adjacent and in order are merged first, so (B,T,H,D)->(B,H,T,D) becomes a copy of
 * contiguous D-rows and any "swap the last two dims" becomes a batched 2-d transpose. Then:
 * identity: one memcpy; last dim kept: row copies; last two swapped: cache-blocked transposes;
 * anything else: a strided gather per output row. All are parallel over disjoint outputs. */
#include "core/ops_impl.h"

#include <string.h>

#define PERMUTE_PAR_MIN 32768
/* Tile edge of the blocked transpose: two 32x32 f32 tiles fit in L1. */
#define PERMUTE_TILE 32

/* The permutation reduced to its essential dims: y dim i is x dim perm[i]; xdim are x's sizes. */
typedef struct perm_plan {
    int nd;
    int64_t xdim[MR_MAX_DIMS];
    int perm[MR_MAX_DIMS];
} perm_plan;

static void perm_simplify(const mr_shape *xs, const int *perm_in, perm_plan *pl) {
    /* drop size-1 dims, renumbering the rest */
    int keep[MR_MAX_DIMS], newid[MR_MAX_DIMS], nd = 0;
    for (int d = 0; d < xs->ndim; d++) {
        keep[d] = xs->dim[d] != 1;
        newid[d] = keep[d] ? nd++ : -1;
    }
    int64_t dims[MR_MAX_DIMS];
    int perm[MR_MAX_DIMS], np = 0;
    for (int d = 0; d < xs->ndim; d++)
        if (keep[d]) dims[newid[d]] = xs->dim[d];
    for (int i = 0; i < xs->ndim; i++)
        if (keep[perm_in[i]]) perm[np++] = newid[perm_in[i]];
    /* merge y-adjacent dims that are also x-adjacent in order: perm[i+1] == perm[i]+1 */
    int group_of[MR_MAX_DIMS]; /* x dim -> merged group; groups are numbered in x order */
    int start[MR_MAX_DIMS], ng = 0;
    for (int i = 0; i < np; i++)
        if (i == 0 || perm[i] != perm[i - 1] + 1) start[ng++] = i;
    /* group k covers y positions start[k] .. start[k+1]-1, i.e. x dims perm[start[k]] .. */
    int order[MR_MAX_DIMS];
    for (int k = 0; k < ng; k++) order[k] = k;
    for (int k = 1; k < ng; k++) /* sort groups by their first x dim (insertion sort, ng <= 8) */
        for (int j = k; j > 0 && perm[start[order[j]]] < perm[start[order[j - 1]]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int r = 0; r < ng; r++) group_of[order[r]] = r;
    pl->nd = ng;
    for (int k = 0; k < ng; k++) {
        int end = k + 1 < ng ? start[k + 1] : np;
        int64_t sz = 1;
        for (int i = start[k]; i < end; i++) sz *= dims[perm[i]];
        pl->xdim[group_of[k]] = sz;
        pl->perm[k] = group_of[k];
    }
}

mr_status mr_permute_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_permute_fwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    const float *x = a->in[0].data; /* x (any shape) */
    float *y = a->out[0].data;      /* y (x's dims permuted) */
    int64_t n = mr_shape_numel(&a->in[0].shape);
    if (n == 0) return MR_OK;
    perm_plan pl;
    perm_simplify(&a->in[0].shape, a->p.permute.perm, &pl);
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
