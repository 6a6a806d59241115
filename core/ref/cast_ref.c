/* CAST: the argument check and the scalar reference.
 *
 * Unlike the other families, a cast has operands of two float dtypes by design, so it cannot use
 * mr_op_check_float (which insists on one dtype); it checks each side on its own. The reference
 * accepts any pair of float dtypes, f64 included, and converts element by element through the
 * scalar conversions of core/dtype.h (the ones mr_dtype_get/set use): every value goes through
 * double, and a narrowing to f16/bf16 rounds once from f32 (f64 -> f32 -> f16, as PyTorch's
 * c10::Half(double) does). */
#include "core/ops_impl.h"

static int cast_dtype_ok(mr_dtype t) { return t == MR_F32 || t == MR_F64 || t == MR_F16 || t == MR_BF16; }

mr_status mr_cast_fwd_check(const mr_op_args *a) {
    if (a->n_in != 1 || a->n_out != 1) return mr_op_error(a, "takes 1 input and 1 output, got %d and %d", a->n_in, a->n_out);
    const mr_view *x = &a->in[0], *y = &a->out[0];
    if (!x->data || !y->data) return mr_op_error(a, "x (in[0]) and y (out[0]) are required");
    if (!cast_dtype_ok(x->dtype) || !cast_dtype_ok(y->dtype))
        return mr_op_error(a, "casts among f32, f64, f16 and bf16; got %s -> %s", mr_dtype_name(x->dtype),
                           mr_dtype_name(y->dtype));
    return mr_op_check_shape(a, y, "y (out[0])", &x->shape);
}

/* x (any shape) of any float dtype -> y (same shape) of any float dtype. */
mr_status mr_cast_fwd_ref(const mr_op_args *a) {
    const mr_view *x = &a->in[0], *y = &a->out[0];
    int64_t n = mr_shape_numel(&x->shape);
    for (int64_t i = 0; i < n; i++) mr_dtype_set(y->data, y->dtype, i, mr_dtype_get(x->data, x->dtype, i));
    return MR_OK;
}
