/* Reductions (SUM MEAN MAX over the dims in p.reduce.axes, keepdim): argument checks and the
 * scalar f64 reference. For every output element the reference walks the reduced dims in
 * row-major order, which also defines "first" for MAX_BWD (the gradient goes to the first
 * maximal element, as torch.max(dim) does). MAX propagates NaN: a NaN anywhere in a reduced
 * set makes the result NaN, and MAX_BWD then routes the gradient to the first NaN. */
#include "core/ops_impl.h"

#include <math.h>
#include <string.h>

/* x's shape with the dims in `axes` set to 1. */
static mr_shape reduced_shape(const mr_shape *x, uint32_t axes) {
    mr_shape s = *x;
    for (int i = 0; i < s.ndim; i++)
        if (axes & (1u << i)) s.dim[i] = 1;
    return s;
}

/* Validates the axes against x's rank, and that MAX has something to reduce. */
static mr_status check_axes(const mr_op_args *a, const mr_shape *x, int is_max) {
    uint32_t axes = a->p.reduce.axes;
    char b1[128];
    if (x->ndim < 32 && (axes >> x->ndim) != 0)
        return mr_op_error(a, "axes mask 0x%x names dims beyond x %s (ndim %d)", (unsigned)axes,
                           mr_shape_str(x, b1, sizeof b1), x->ndim);
    if (is_max)
        for (int i = 0; i < x->ndim; i++)
            if ((axes & (1u << i)) && x->dim[i] == 0)
                return mr_op_error(a, "max over dim %d of size 0 in x %s has no value", i,
                                   mr_shape_str(x, b1, sizeof b1));
    return MR_OK;
}

mr_status mr_reduce_fwd_check(const mr_op_args *a) {
    if (a->op < MR_OP_SUM || a->op > MR_OP_MAX) return mr_op_error(a, "not a reduction op");
    if (!a->in[0].data || !a->out[0].data) return mr_op_error(a, "x and y are required");
    mr_status st = mr_op_check_float(a, 0, NULL);
    if (st != MR_OK) return st;
    if ((st = check_axes(a, &a->in[0].shape, a->op == MR_OP_MAX)) != MR_OK) return st;
    mr_shape ys = reduced_shape(&a->in[0].shape, a->p.reduce.axes);
    return mr_op_check_shape(a, &a->out[0], "y (out[0])", &ys);
}

mr_status mr_reduce_bwd_check(const mr_op_args *a) {
    if (a->op < MR_OP_SUM_BWD || a->op > MR_OP_MAX_BWD) return mr_op_error(a, "not a reduction backward op");
    int is_max = a->op == MR_OP_MAX_BWD;
    const mr_view *dy = &a->in[is_max ? 2 : 0];
    if (!dy->data || !a->out[0].data) return mr_op_error(a, "dy and dx are required");
    if (is_max && (!a->in[0].data || !a->in[1].data)) return mr_op_error(a, "x (in[0]) and y (in[1]) are required");
    mr_status st = mr_op_check_float(a, 0, NULL);
    if (st != MR_OK) return st;
    const mr_shape *xs = &a->out[0].shape;
    if ((st = check_axes(a, xs, is_max)) != MR_OK) return st;
    mr_shape ys = reduced_shape(xs, a->p.reduce.axes);
    if ((st = mr_op_check_shape(a, dy, "dy", &ys)) != MR_OK) return st;
    if (is_max) {
        if ((st = mr_op_check_shape(a, &a->in[0], "x (in[0])", xs)) != MR_OK) return st;
        if ((st = mr_op_check_shape(a, &a->in[1], "y (in[1])", &ys)) != MR_OK) return st;
    }
    return MR_OK;
}

/* Offset in x of output element o (an index over the kept dims) and reduced position r (an index
 * over the reduced dims), both row-major. */
static int64_t x_offset(const mr_shape *x, uint32_t axes, int64_t o, int64_t r) {
    int64_t st[MR_MAX_DIMS], off = 0;
    mr_shape_strides(x, st);
    for (int d = x->ndim - 1; d >= 0; d--) {
        int64_t *idx = (axes & (1u << d)) ? &r : &o;
        int64_t c = *idx % x->dim[d];
        *idx /= x->dim[d];
        off += c * st[d];
    }
    return off;
}

static int64_t reduced_count(const mr_shape *x, uint32_t axes) {
    int64_t n = 1;
    for (int d = 0; d < x->ndim; d++)
        if (axes & (1u << d)) n *= x->dim[d];
    return n;
}

mr_status mr_reduce_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[0].dtype));
    const mr_shape *xs = &a->in[0].shape;
    uint32_t axes = a->p.reduce.axes;
    int64_t ny = mr_shape_numel(&a->out[0].shape), nr = reduced_count(xs, axes);
    const double *X = a->in[0].data;
    double *Y = a->out[0].data;
    for (int64_t o = 0; o < ny; o++) {
        double acc = a->op == MR_OP_MAX ? -INFINITY : 0.0;
        for (int64_t r = 0; r < nr; r++) {
            double v = X[x_offset(xs, axes, o, r)];
            if (a->op == MR_OP_MAX) {
                if (isnan(v) || v > acc) acc = v;
                if (isnan(acc)) break;
            } else {
                acc += v;
            }
        }
        /* MEAN of an empty set is 0/0 = NaN, as torch.mean gives */
        Y[o] = a->op == MR_OP_MEAN ? acc / (double)nr : acc;
    }
    return MR_OK;
}

mr_status mr_reduce_bwd_ref(const mr_op_args *a) {
    int is_max = a->op == MR_OP_MAX_BWD;
    const mr_view *dy = &a->in[is_max ? 2 : 0];
    if (dy->dtype != MR_F64) return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(dy->dtype));
    const mr_shape *xs = &a->out[0].shape;
    uint32_t axes = a->p.reduce.axes;
    int64_t ny = mr_shape_numel(&dy->shape), nr = reduced_count(xs, axes);
    const double *G = dy->data;
    double *DX = a->out[0].data;
    if (is_max) {
        const double *X = a->in[0].data, *Y = a->in[1].data;
        memset(DX, 0, sizeof(double) * (size_t)mr_shape_numel(xs));
        for (int64_t o = 0; o < ny; o++) {
            for (int64_t r = 0; r < nr; r++) {
                int64_t i = x_offset(xs, axes, o, r);
                if (X[i] == Y[o] || (isnan(Y[o]) && isnan(X[i]))) {
                    DX[i] = G[o];
                    break;
                }
            }
        }
        return MR_OK;
    }
    double scale = a->op == MR_OP_MEAN_BWD ? 1.0 / (double)nr : 1.0;
    for (int64_t o = 0; o < ny; o++)
        for (int64_t r = 0; r < nr; r++) DX[x_offset(xs, axes, o, r)] = G[o] * scale;
    return MR_OK;
}
