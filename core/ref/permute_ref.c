/* Permute (a transpose as an op): y.dim[i] = x.dim[perm[i]], y[idx] = x[idx permuted back].
 * Argument checks and the scalar f64 reference. Its gradient is the permute by the inverse
 * permutation, so there is no PERMUTE_BWD. An f32 x may be permuted into a bf16/f16 y (rounded to
 * nearest even, as CAST): the CPU kernel's fusion of a permute and the cast after it. */
#include "core/ops_impl.h"

mr_status mr_permute_fwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->out[0].data) return mr_op_error(a, "x and y are required");
    const mr_dtype xt = a->in[0].dtype, yt = a->out[0].dtype;
    if (xt != MR_F32 && xt != MR_F64) return mr_op_error(a, "x (in[0]) must be f32 or f64, got %s", mr_dtype_name(xt));
    /* y in x's dtype, or an f32 x rounded to bf16/f16 on the way (the CPU kernel's cast fusion) */
    if (yt != xt && !(xt == MR_F32 && (yt == MR_BF16 || yt == MR_F16)))
        return mr_op_error(a, "y (out[0]) is %s for an %s x: it must be x's dtype (or bf16/f16 for an f32 x)",
                           mr_dtype_name(yt), mr_dtype_name(xt));
    const mr_shape *xs = &a->in[0].shape;
    const int *perm = a->p.permute.perm;
    char b1[128];
    int seen[MR_MAX_DIMS] = {0};
    mr_shape ys = *xs;
    for (int i = 0; i < xs->ndim; i++) {
        if (perm[i] < 0 || perm[i] >= xs->ndim || seen[perm[i]]++)
            return mr_op_error(a, "perm[%d] = %d: perm must be a permutation of 0..%d for x %s", i, perm[i],
                               xs->ndim - 1, mr_shape_str(xs, b1, sizeof b1));
        ys.dim[i] = xs->dim[perm[i]];
    }
    return mr_op_check_shape(a, &a->out[0], "out[0] (y)", &ys);
}

mr_status mr_permute_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    const mr_shape *xs = &a->in[0].shape, *ys = &a->out[0].shape;
    const int *perm = a->p.permute.perm;
    const double *x = a->in[0].data; /* x (xs) */
    double *y = a->out[0].data;      /* y (ys) */
    int64_t xstr[MR_MAX_DIMS], n = mr_shape_numel(ys);
    mr_shape_strides(xs, xstr);
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, off = 0;
        for (int d = ys->ndim - 1; d >= 0; d--) {
            int64_t idx = rem % ys->dim[d];
            rem /= ys->dim[d];
            off += idx * xstr[perm[d]];
        }
        y[i] = x[off];
    }
    return MR_OK;
}
