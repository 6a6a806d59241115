/* HOOK: a caller function as a node (core/ops.h MR_OP_HOOK). The reference and every backend run
 * the same function; what it computes is the caller's (a sum over replicas for sync batch norm,
 * tested against one replica with the whole batch in tests/unit/test_trainer_replicas.c). */
#include "core/ops_impl.h"

mr_status mr_hook_check(const mr_op_args *a) {
    if (a->n_in != 1 || a->n_out != 1) return mr_op_error(a, "takes 1 input and 1 output, got %d and %d", a->n_in, a->n_out);
    const mr_view *x = &a->in[0], *y = &a->out[0];
    if (!x->data || !y->data) return mr_op_error(a, "x (in[0]) and y (out[0]) are required");
    if (!a->p.hook.h || !a->p.hook.h->fn) return mr_op_error(a, "p.hook.h names no function");
    if (x->dtype != y->dtype)
        return mr_op_error(a, "x is %s but y is %s", mr_dtype_name(x->dtype), mr_dtype_name(y->dtype));
    return mr_op_check_shape(a, y, "y (out[0])", &x->shape);
}

mr_status mr_hook_ref(const mr_op_args *a) {
    const mr_hook *h = a->p.hook.h;
    return h->fn(h->ctx, a->in[0].data, a->out[0].data, mr_shape_numel(&a->in[0].shape), a->in[0].dtype, a->stream,
                 a->device);
}

mr_status mr_hook_cpu(const mr_op_args *a) { return mr_hook_ref(a); }
