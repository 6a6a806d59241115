/* GEMM_DC (core/ops.h): the check, the CPU workspace and the f64 reference.
 *
 * The reference is the definition: g = dy or gelu_grad(pre, dy) per element, dc = g, dbias =
 * the plain row-order sum of g per column, everything in f64. */
#include "core/math/unary_math.h"
#include "core/ops_impl.h"

static int64_t dc_cols(const mr_shape *s) { return s->ndim > 0 ? s->dim[s->ndim - 1] : 1; }

mr_status mr_gemm_dc_check(const mr_op_args *a) {
    const mr_view *dy = &a->in[0], *pre = &a->in[1], *dc = &a->out[0], *db = &a->out[1];
    if (!dy->data) return mr_op_error(a, "dy (in[0]) is required");
    if (!dc->data && !db->data) return mr_op_error(a, "needs dc (out[0]) or dbias (out[1]) or both");
    if (dy->dtype != MR_F32 && dy->dtype != MR_F64)
        return mr_op_error(a, "dy (in[0]) must be f32 or f64, got %s", mr_dtype_name(dy->dtype));
    if (dy->shape.ndim < 1) return mr_op_error(a, "dy (in[0]) needs at least one dim (the columns)");
    mr_status st;
    if (pre->data) {
        if (pre->dtype != dy->dtype)
            return mr_op_error(a, "pre (in[1]) is %s, dy (in[0]) %s: they must match", mr_dtype_name(pre->dtype),
                               mr_dtype_name(dy->dtype));
        if ((st = mr_op_check_shape(a, pre, "pre (in[1])", &dy->shape)) != MR_OK) return st;
    }
    if (dc->data) {
        int ok = dy->dtype == MR_F64 ? dc->dtype == MR_F64
                                     : (dc->dtype == MR_F32 || dc->dtype == MR_BF16 || dc->dtype == MR_F16);
        if (!ok)
            return mr_op_error(a, "dc (out[0]) is %s: with a %s dy it must be %s", mr_dtype_name(dc->dtype),
                               mr_dtype_name(dy->dtype), dy->dtype == MR_F64 ? "f64" : "f32, bf16 or f16");
        if ((st = mr_op_check_shape(a, dc, "dc (out[0])", &dy->shape)) != MR_OK) return st;
    }
    if (db->data) {
        if (db->dtype != dy->dtype)
            return mr_op_error(a, "dbias (out[1]) is %s, dy (in[0]) %s: they must match", mr_dtype_name(db->dtype),
                               mr_dtype_name(dy->dtype));
        mr_shape want = mr_shape_1d(dc_cols(&dy->shape));
        if ((st = mr_op_check_shape(a, db, "dbias (out[1])", &want)) != MR_OK) return st;
    }
    return MR_OK;
}

/* Sized whether or not dbias is wanted: the planner asks before any view has data. */
size_t mr_gemm_dc_workspace(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F32 || a->in[0].shape.ndim < 1) return 0;
    const int64_t n = dc_cols(&a->in[0].shape), rows = n > 0 ? mr_shape_numel(&a->in[0].shape) / n : 0;
    const int64_t blocks = (rows + MR_GEMM_DC_ROWS - 1) / MR_GEMM_DC_ROWS;
    return (size_t)(blocks * n) * sizeof(float);
}

mr_status mr_gemm_dc_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64 || (a->out[0].data && a->out[0].dtype != MR_F64))
        return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[0].dtype));
    const double *dy = a->in[0].data, *pre = a->in[1].data;
    double *dc = a->out[0].data, *db = a->out[1].data;
    const int64_t n = dc_cols(&a->in[0].shape), rows = n > 0 ? mr_shape_numel(&a->in[0].shape) / n : 0;
    if (db)
        for (int64_t j = 0; j < n; j++) db[j] = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            const int64_t i = r * n + j;
            const double g = pre ? mr_gelu_grad_f64(pre[i], dy[i]) : dy[i];
            if (dc) dc[i] = g;
            if (db) db[j] += g;
        }
    return MR_OK;
}
