/* Elementwise ops: argument checks and the scalar f64 reference (the oracle for every backend).
 *
 * Binary ops (ADD SUB MUL DIV) broadcast as numpy does; their backward sums the gradient over
 * the broadcast dims. Unary ops (RELU .. SCALE) use the per-element math of
 * core/math/unary_math.h, shared with the CPU and CUDA kernels. The reference walks every output
 * element by its multi-index, so it is obviously right and slow. */
#include "core/ops_impl.h"
#include "core/math/unary_math.h"

#include <math.h>
#include <string.h>

/* ---- binary ---------------------------------------------------------------------------------- */

/* Strides of `s` aligned to an `nd`-dim broadcast shape: 0 where s has no dim or a dim of 1. */
static void bcast_strides(const mr_shape *s, int nd, int64_t st[MR_MAX_DIMS]) {
    int64_t own[MR_MAX_DIMS];
    mr_shape_strides(s, own);
    int off = nd - s->ndim;
    for (int i = 0; i < nd; i++) {
        int j = i - off;
        st[i] = (j >= 0 && s->dim[j] != 1) ? own[j] : 0;
    }
}

/* Offsets into a and b of output element `i` of the broadcast shape `o`. */
static void bcast_offsets(const mr_shape *o, const int64_t *sa, const int64_t *sb, int64_t i, int64_t *ia,
                          int64_t *ib) {
    int64_t oa = 0, ob = 0;
    for (int d = o->ndim - 1; d >= 0; d--) {
        int64_t c = i % o->dim[d];
        i /= o->dim[d];
        oa += c * sa[d];
        ob += c * sb[d];
    }
    *ia = oa;
    *ib = ob;
}

/* Validates a, b against the broadcast shape `o` (the output of fwd, dy of bwd). */
static mr_status check_bcast(const mr_op_args *a, const mr_view *va, const mr_view *vb, const mr_view *vo,
                             const char *role) {
    mr_shape bs;
    char b1[128], b2[128], b3[128], b4[128];
    if (mr_shape_broadcast(&va->shape, &vb->shape, &bs) != MR_OK)
        return mr_op_error(a, "a %s and b %s do not broadcast", mr_shape_str(&va->shape, b1, sizeof b1),
                           mr_shape_str(&vb->shape, b2, sizeof b2));
    if (!mr_shape_eq(&bs, &vo->shape))
        return mr_op_error(a, "%s has shape %s but a %s and b %s broadcast to %s", role,
                           mr_shape_str(&vo->shape, b1, sizeof b1), mr_shape_str(&va->shape, b2, sizeof b2),
                           mr_shape_str(&vb->shape, b3, sizeof b3), mr_shape_str(&bs, b4, sizeof b4));
    return MR_OK;
}

mr_status mr_binary_fwd_check(const mr_op_args *a) {
    if (a->op < MR_OP_ADD || a->op > MR_OP_DIV) return mr_op_error(a, "not a binary forward op");
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "a, b and y are required");
    mr_status st = mr_op_check_float(a, 0, NULL);
    if (st != MR_OK) return st;
    return check_bcast(a, &a->in[0], &a->in[1], &a->out[0], "y");
}

mr_status mr_binary_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[0].dtype));
    const mr_shape *o = &a->out[0].shape;
    int64_t sa[MR_MAX_DIMS], sb[MR_MAX_DIMS], n = mr_shape_numel(o);
    bcast_strides(&a->in[0].shape, o->ndim, sa);
    bcast_strides(&a->in[1].shape, o->ndim, sb);
    const double *A = a->in[0].data, *B = a->in[1].data;
    double *Y = a->out[0].data;
    for (int64_t i = 0; i < n; i++) {
        int64_t ia, ib;
        bcast_offsets(o, sa, sb, i, &ia, &ib);
        double x = A[ia], y = B[ib];
        switch (a->op) {
        case MR_OP_ADD: Y[i] = x + y; break;
        case MR_OP_SUB: Y[i] = x - y; break;
        case MR_OP_MUL: Y[i] = x * y; break;
        default: Y[i] = x / y; break;
        }
    }
    return MR_OK;
}

mr_status mr_binary_bwd_check(const mr_op_args *a) {
    if (a->op < MR_OP_ADD_BWD || a->op > MR_OP_DIV_BWD) return mr_op_error(a, "not a binary backward op");
    /* ADD/SUB read only the shapes of a and b, so their data may be omitted */
    int need_ab = a->op == MR_OP_MUL_BWD || a->op == MR_OP_DIV_BWD;
    if (!a->in[2].data) return mr_op_error(a, "dy (in[2]) is required");
    if (need_ab && (!a->in[0].data || !a->in[1].data)) return mr_op_error(a, "a and b (in[0], in[1]) are required");
    mr_status st = mr_op_check_float(a, 0, NULL);
    if (st != MR_OK) return st;
    st = check_bcast(a, &a->in[0], &a->in[1], &a->in[2], "dy");
    if (st != MR_OK) return st;
    if (a->out[0].data && (st = mr_op_check_shape(a, &a->out[0], "da (out[0])", &a->in[0].shape)) != MR_OK) return st;
    if (a->out[1].data && (st = mr_op_check_shape(a, &a->out[1], "db (out[1])", &a->in[1].shape)) != MR_OK) return st;
    return MR_OK;
}

mr_status mr_binary_bwd_ref(const mr_op_args *a) {
    if (a->in[2].dtype != MR_F64) return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[2].dtype));
    const mr_shape *o = &a->in[2].shape;
    int64_t sa[MR_MAX_DIMS], sb[MR_MAX_DIMS], n = mr_shape_numel(o);
    bcast_strides(&a->in[0].shape, o->ndim, sa);
    bcast_strides(&a->in[1].shape, o->ndim, sb);
    const double *A = a->in[0].data, *B = a->in[1].data, *G = a->in[2].data;
    double *DA = a->out[0].data, *DB = a->out[1].data;
    if (DA) memset(DA, 0, sizeof(double) * (size_t)mr_shape_numel(&a->in[0].shape));
    if (DB) memset(DB, 0, sizeof(double) * (size_t)mr_shape_numel(&a->in[1].shape));
    for (int64_t i = 0; i < n; i++) {
        int64_t ia, ib;
        bcast_offsets(o, sa, sb, i, &ia, &ib);
        double g = G[i], ga, gb;
        switch (a->op) {
        case MR_OP_ADD_BWD: ga = g; gb = g; break;
        case MR_OP_SUB_BWD: ga = g; gb = -g; break;
        case MR_OP_MUL_BWD: ga = g * B[ib]; gb = g * A[ia]; break;
        default: ga = g / B[ib]; gb = -g * A[ia] / (B[ib] * B[ib]); break;
        }
        if (DA) DA[ia] += ga;
        if (DB) DB[ib] += gb;
    }
    return MR_OK;
}

/* ---- unary ----------------------------------------------------------------------------------- */

mr_status mr_unary_fwd_check(const mr_op_args *a) {
    if (a->op < MR_OP_RELU || a->op > MR_OP_SCALE) return mr_op_error(a, "not a unary forward op");
    if (!a->in[0].data || !a->out[0].data) return mr_op_error(a, "x and y are required");
    mr_status st = mr_op_check_float(a, 0, NULL);
    if (st != MR_OK) return st;
    if (a->op == MR_OP_SCALE && !isfinite(a->p.scale)) return mr_op_error(a, "scale %g is not finite", a->p.scale);
    return mr_op_check_shape(a, &a->out[0], "y (out[0])", &a->in[0].shape);
}

mr_status mr_unary_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[0].dtype));
    const double *X = a->in[0].data;
    double *Y = a->out[0].data;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    for (int64_t i = 0; i < n; i++) {
        double x = X[i];
        switch (a->op) {
        case MR_OP_RELU: Y[i] = mr_relu_f64(x); break;
        case MR_OP_GELU: Y[i] = mr_gelu_f64(x); break;
        case MR_OP_TANH: Y[i] = mr_tanh_f64(x); break;
        case MR_OP_SIGMOID: Y[i] = mr_sigmoid_f64(x); break;
        case MR_OP_EXP: Y[i] = mr_exp_f64(x); break;
        case MR_OP_LOG: Y[i] = mr_log_f64(x); break;
        case MR_OP_SQRT: Y[i] = mr_sqrt_f64(x); break;
        default: Y[i] = a->p.scale * x; break;
        }
    }
    return MR_OK;
}

/* Which of x (in[0]) and y (in[1]) a unary backward reads: 1 = x, 2 = y, 0 = neither. */
static int unary_bwd_reads(mr_op_id op) {
    switch (op) {
    case MR_OP_RELU_BWD: case MR_OP_GELU_BWD: case MR_OP_LOG_BWD: return 1;
    case MR_OP_SCALE_BWD: return 0;
    default: return 2;
    }
}

mr_status mr_unary_bwd_check(const mr_op_args *a) {
    if (a->op < MR_OP_RELU_BWD || a->op > MR_OP_SCALE_BWD) return mr_op_error(a, "not a unary backward op");
    int r = unary_bwd_reads(a->op);
    if (!a->in[2].data || !a->out[0].data) return mr_op_error(a, "dy (in[2]) and dx (out[0]) are required");
    if (r == 1 && !a->in[0].data) return mr_op_error(a, "x (in[0]) is required");
    if (r == 2 && !a->in[1].data) return mr_op_error(a, "y (in[1]) is required");
    mr_status st = mr_op_check_float(a, 0, NULL);
    if (st != MR_OK) return st;
    if (a->op == MR_OP_SCALE_BWD && !isfinite(a->p.scale)) return mr_op_error(a, "scale %g is not finite", a->p.scale);
    const mr_shape *s = &a->in[2].shape;
    if ((st = mr_op_check_shape(a, &a->out[0], "dx (out[0])", s)) != MR_OK) return st;
    if (a->in[0].data && (st = mr_op_check_shape(a, &a->in[0], "x (in[0])", s)) != MR_OK) return st;
    if (a->in[1].data && (st = mr_op_check_shape(a, &a->in[1], "y (in[1])", s)) != MR_OK) return st;
    return MR_OK;
}

mr_status mr_unary_bwd_ref(const mr_op_args *a) {
    if (a->in[2].dtype != MR_F64) return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[2].dtype));
    const double *X = a->in[0].data, *Y = a->in[1].data, *G = a->in[2].data;
    double *DX = a->out[0].data;
    int64_t n = mr_shape_numel(&a->in[2].shape);
    for (int64_t i = 0; i < n; i++) {
        double g = G[i];
        switch (a->op) {
        case MR_OP_RELU_BWD: DX[i] = mr_relu_grad_f64(X[i], g); break;
        case MR_OP_GELU_BWD: DX[i] = mr_gelu_grad_f64(X[i], g); break;
        case MR_OP_TANH_BWD: DX[i] = mr_tanh_grad_f64(Y[i], g); break;
        case MR_OP_SIGMOID_BWD: DX[i] = mr_sigmoid_grad_f64(Y[i], g); break;
        case MR_OP_EXP_BWD: DX[i] = mr_exp_grad_f64(Y[i], g); break;
        case MR_OP_LOG_BWD: DX[i] = mr_log_grad_f64(X[i], g); break;
        case MR_OP_SQRT_BWD: DX[i] = mr_sqrt_grad_f64(Y[i], g); break;
        default: DX[i] = a->p.scale * g; break;
        }
    }
    return MR_OK;
}
