/* Embedding gather and its scatter-add gradient: argument checks and the scalar f64 reference.
 * Token ids are i32 and must lie in [0, V); the check cannot see them (they may live on a
 * device), so every kernel validates them and names the first offending position. */
#include "core/ops_impl.h"

/* Checks table/dtable (V,D), ids (...) i32 and the (..., D) view `rows` against each other. */
static mr_status emb_shapes(const mr_op_args *a, const mr_view *table, const char *table_role,
                            const mr_view *ids, const mr_view *rows, const char *rows_role) {
    char b1[128], b2[128];
    if (ids->dtype != MR_I32) return mr_op_error(a, "ids have dtype %s; expected i32", mr_dtype_name(ids->dtype));
    if (!mr_dtype_is_float(table->dtype) || !mr_dtype_is_float(rows->dtype))
        return mr_op_error(a, "%s (%s) and %s (%s) must be f32 or f64", table_role, mr_dtype_name(table->dtype),
                           rows_role, mr_dtype_name(rows->dtype));
    if (table->shape.ndim != 2)
        return mr_op_error(a, "%s %s must be (V,D)", table_role, mr_shape_str(&table->shape, b1, sizeof b1));
    if (ids->shape.ndim >= MR_MAX_DIMS)
        return mr_op_error(a, "ids %s have too many dims (at most %d)", mr_shape_str(&ids->shape, b1, sizeof b1),
                           MR_MAX_DIMS - 1);
    mr_shape s = ids->shape;
    s.dim[s.ndim++] = table->shape.dim[1];
    if (!mr_shape_eq(&rows->shape, &s))
        return mr_op_error(a, "%s %s must be ids' shape plus D: %s", rows_role,
                           mr_shape_str(&rows->shape, b1, sizeof b1), mr_shape_str(&s, b2, sizeof b2));
    return MR_OK;
}

mr_status mr_embedding_fwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "table, ids and y are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK) return st;
    return emb_shapes(a, &a->in[0], "in[0] (table)", &a->in[1], &a->out[0], "out[0] (y)");
}

mr_status mr_embedding_bwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "ids, dy and dtable are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK) return st;
    return emb_shapes(a, &a->out[0], "out[0] (dtable)", &a->in[0], &a->in[1], "in[1] (dy)");
}

size_t mr_embedding_bwd_workspace(const mr_op_args *a) {
    /* f32: core/cuda/embedding.cu buckets the n token positions by id: row starts (V+1), fill
     * cursors (V) and the positions (n), all i32. Asked of every backend because the op table has
     * one workspace rule per op; the CPU kernel ignores it. f64 (the reference, gradient checks)
     * needs none: the CUDA kernel then rescans the ids for each row instead. */
    if (a->in[1].dtype == MR_F64) return 0;
    int64_t vocab = a->out[0].shape.dim[0], n = mr_shape_numel(&a->in[0].shape);
    return (size_t)(2 * vocab + 1 + n) * sizeof(int32_t);
}

/* The first id outside [0, V) as an error, or MR_OK. */
static mr_status emb_check_ids(const mr_op_args *a, const int32_t *ids, int64_t n, int64_t vocab) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return mr_op_error(a, "ids[%lld] = %d is outside [0, %lld)", (long long)i, (int)ids[i], (long long)vocab);
    return MR_OK;
}

mr_status mr_embedding_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    /* table (V,D); ids (n) flattened; y (n,D) */
    const double *table = a->in[0].data;
    const int32_t *ids = a->in[1].data;
    double *y = a->out[0].data;
    int64_t vocab = a->in[0].shape.dim[0], d = a->in[0].shape.dim[1], n = mr_shape_numel(&a->in[1].shape);
    mr_status st = emb_check_ids(a, ids, n, vocab);
    if (st != MR_OK) return st;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < d; j++) y[i * d + j] = table[(int64_t)ids[i] * d + j];
    return MR_OK;
}

mr_status mr_embedding_bwd_ref(const mr_op_args *a) {
    if (a->in[1].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    /* ids (n) flattened; dy (n,D); dtable (V,D) */
    const int32_t *ids = a->in[0].data;
    const double *dy = a->in[1].data;
    double *dtable = a->out[0].data;
    int64_t vocab = a->out[0].shape.dim[0], d = a->out[0].shape.dim[1], n = mr_shape_numel(&a->in[0].shape);
    mr_status st = emb_check_ids(a, ids, n, vocab);
    if (st != MR_OK) return st;
    for (int64_t i = 0; i < vocab * d; i++) dtable[i] = 0.0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < d; j++) dtable[(int64_t)ids[i] * d + j] += dy[i * d + j];
    return MR_OK;
}
