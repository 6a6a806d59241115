/* Flat concatenation (MR_OP_CONCAT): the check and the scalar reference. Any dtype, as long as
 * every present input and the output share it. */
#include "core/ops_impl.h"

mr_status mr_concat_fwd_check(const mr_op_args *a) {
    if (!a->out[0].data) return mr_op_error(a, "the output is required");
    int64_t total = 0;
    int present = 0;
    for (int i = 0; i < a->n_in; i++) {
        if (!a->in[i].data) continue;
        if (a->in[i].dtype != a->out[0].dtype)
            return mr_op_error(a, "in[%d] has dtype %s but the output is %s", i, mr_dtype_name(a->in[i].dtype),
                               mr_dtype_name(a->out[0].dtype));
        total += mr_shape_numel(&a->in[i].shape);
        present++;
    }
    if (!present) return mr_op_error(a, "no input");
    if (total != mr_shape_numel(&a->out[0].shape)) {
        char b[128];
        return mr_op_error(a, "the inputs hold %lld elements but the output %s holds %lld", (long long)total,
                           mr_shape_str(&a->out[0].shape, b, sizeof b), (long long)mr_shape_numel(&a->out[0].shape));
    }
    return MR_OK;
}

mr_status mr_concat_fwd_ref(const mr_op_args *a) {
    int64_t at = 0;
    for (int i = 0; i < a->n_in; i++) {
        if (!a->in[i].data) continue;
        int64_t n = mr_shape_numel(&a->in[i].shape);
        for (int64_t j = 0; j < n; j++)
            mr_dtype_set(a->out[0].data, a->out[0].dtype, at + j, mr_dtype_get(a->in[i].data, a->in[i].dtype, j));
        at += n;
    }
    return MR_OK;
}
