/* A permutation's plan, shared by the CPU and CUDA permute kernels: size-1 dims dropped and runs
 * of dims that stay adjacent and in order merged, so (B,T,H,D)->(B,H,T,D) becomes a copy of
 * contiguous D-rows and any "swap the last two dims" a batched 2-d transpose. Host code (plain
 * C, also compiled by nvcc for the CUDA launchers); it moves no element, so it is not MR_HD. */
#ifndef MR_MATH_PERMUTE_MATH_H
#define MR_MATH_PERMUTE_MATH_H

#include <stdint.h>
#include "core/shape.h"

/* The permutation reduced to its essential dims: y dim i is x dim perm[i]; xdim are x's sizes. */
typedef struct mr_perm_plan {
    int nd;
    int64_t xdim[MR_MAX_DIMS];
    int perm[MR_MAX_DIMS];
} mr_perm_plan;

static inline void mr_perm_simplify(const mr_shape *xs, const int *perm_in, mr_perm_plan *pl) {
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

#endif
