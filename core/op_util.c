/* Helpers shared by the op checks and kernels (see ops_impl.h). */
#include "core/ops_impl.h"

#include <stdarg.h>
#include <stdatomic.h>

mr_status mr_op_error_at(const mr_op_args *a, const char *file, int line, const char *fmt, ...) {
    const mr_op_info *info = mr_op_get(a->op);
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mr_set_error_at(MR_ERR_INVALID, file, line, "%s: %s", info ? info->name : "op", msg);
}

static int float_ok(mr_dtype t, int allow_half) {
    return t == MR_F32 || t == MR_F64 || (allow_half && (t == MR_F16 || t == MR_BF16));
}

/* The views that hold integers (labels, token ids, argmax); every other view must be float. */
static int is_int_slot(mr_op_id op, int is_out, int i) {
    switch (op) {
    case MR_OP_SOFTMAX_XENT:
    case MR_OP_SOFTMAX_XENT_BWD:
    case MR_OP_EMBEDDING: return !is_out && i == 1;
    case MR_OP_EMBEDDING_BWD:
    case MR_OP_MAXPOOL2D_BWD: return !is_out && i == 0;
    case MR_OP_CONV2D_BWD_DATA:
    case MR_OP_CONV2D_BWD_FILTER: return !is_out && i == 2;
    case MR_OP_MAXPOOL2D:
    case MR_OP_CONV2D_MAXPOOL: return is_out && i == 1;
    default: return 0;
    }
}

mr_status mr_op_check_float(const mr_op_args *a, int allow_half, mr_dtype *dt) {
    int have = 0;
    mr_dtype first = MR_F32;
    for (int k = 0; k < 2; k++) {
        const mr_view *v = k == 0 ? a->in : a->out;
        int n = k == 0 ? a->n_in : a->n_out;
        for (int i = 0; i < n; i++) {
            if (!v[i].data) continue;
            if (is_int_slot(a->op, k, i)) {
                if (v[i].dtype != MR_I32)
                    return mr_op_error(a, "%s[%d] has dtype %s; expected i32", k ? "out" : "in", i,
                                       mr_dtype_name(v[i].dtype));
                continue;
            }
            if (!mr_dtype_is_float(v[i].dtype))
                return mr_op_error(a, "%s[%d] has dtype %s; expected a float type", k ? "out" : "in", i,
                                   mr_dtype_name(v[i].dtype));
            if (!float_ok(v[i].dtype, allow_half))
                return mr_op_error(a, "%s[%d] has dtype %s; expected f32 or f64", k ? "out" : "in",
                                   i, mr_dtype_name(v[i].dtype));
            if (!have) {
                first = v[i].dtype;
                have = 1;
            } else if (v[i].dtype != first) {
                return mr_op_error(a, "%s[%d] has dtype %s but an earlier operand is %s", k ? "out" : "in",
                                   i, mr_dtype_name(v[i].dtype), mr_dtype_name(first));
            }
        }
    }
    if (!have) return mr_op_error(a, "no float operand");
    if (dt) *dt = first;
    return MR_OK;
}

mr_status mr_op_check_shape(const mr_op_args *a, const mr_view *v, const char *role, const mr_shape *s) {
    if (mr_shape_eq(&v->shape, s)) return MR_OK;
    char b1[128], b2[128];
    return mr_op_error(a, "%s has shape %s, expected %s", role, mr_shape_str(&v->shape, b1, sizeof b1),
                       mr_shape_str(s, b2, sizeof b2));
}

int mr_op_is_f64(const mr_op_args *a) {
    for (int i = 0; i < a->n_in; i++)
        if (a->in[i].data && mr_dtype_is_float(a->in[i].dtype)) return a->in[i].dtype == MR_F64;
    for (int i = 0; i < a->n_out; i++)
        if (a->out[i].data && mr_dtype_is_float(a->out[i].dtype)) return a->out[i].dtype == MR_F64;
    return 0;
}

mr_status mr_op_check_all_float(const mr_op_args *a, mr_dtype dt) {
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < (k ? a->n_out : a->n_in); i++) {
            const mr_view *v = k ? &a->out[i] : &a->in[i];
            if (v->data && v->dtype != dt)
                return mr_op_error(a, "%s[%d] has dtype %s; expected %s like the other operands", k ? "out" : "in", i,
                                   mr_dtype_name(v->dtype), mr_dtype_name(dt));
        }
    return MR_OK;
}

/* ---- how attention ran on CUDA devices (core/ops.h mr_attention_paths) ---- */

static _Atomic int64_t g_attn_paths[4]; /* cudnn fwd, cudnn bwd, kernel fwd, kernel bwd */

void mr_attention_path_note(int cudnn, int bwd) { atomic_fetch_add(&g_attn_paths[(cudnn ? 0 : 2) + (bwd ? 1 : 0)], 1); }

void mr_attention_paths_get(mr_attention_paths *out) {
    out->cudnn_fwd = atomic_load(&g_attn_paths[0]);
    out->cudnn_bwd = atomic_load(&g_attn_paths[1]);
    out->kernel_fwd = atomic_load(&g_attn_paths[2]);
    out->kernel_bwd = atomic_load(&g_attn_paths[3]);
}
