/* Flat concatenation on the CPU: one memcpy per input (any dtype). */
#include "core/ops_impl.h"

#include <string.h>

mr_status mr_concat_fwd_cpu(const mr_op_args *a) {
    char *dst = a->out[0].data;
    size_t es = mr_dtype_size(a->out[0].dtype);
    for (int i = 0; i < a->n_in; i++) {
        if (!a->in[i].data) continue;
        size_t bytes = (size_t)mr_shape_numel(&a->in[i].shape) * es;
        if (bytes) memcpy(dst, a->in[i].data, bytes);
        dst += bytes;
    }
    return MR_OK;
}
