/* The op table: for every op its name, arity, check, workspace and kernels per backend. Tests
 * iterate over it, so an op that is added here is tested against its reference and (if it has a
 * backward) checked by finite differences, or the suite fails. */
#include "core/ops_impl.h"
#include "core/log.h"

#include <string.h>

#ifdef MIRROR_HAVE_CUDA
#define CUDA_FN(fn) fn
#else
#define CUDA_FN(fn) NULL
#endif

/* CU is CUDA_FN(mr_<family>_cuda) for families with CUDA kernels, NULL otherwise. */
#define OP(ID, NAME, NIN, NOUT, FWD, FAM, WS, CU)                                               \
    [ID] = {ID, NAME, NIN, NOUT, FWD, mr_##FAM##_check, WS, mr_##FAM##_ref, {mr_##FAM##_cpu, CU}}

static const mr_op_info g_ops[MR_OP_COUNT] = {
    [MR_OP_NONE] = {MR_OP_NONE, "none", 0, 0, MR_OP_NONE, NULL, NULL, NULL, {NULL, NULL}},
    OP(MR_OP_GEMM, "gemm", 3, 2, MR_OP_NONE, gemm_fwd, mr_gemm_fwd_workspace, CUDA_FN(mr_gemm_fwd_cuda)),
    OP(MR_OP_ADD, "add", 2, 1, MR_OP_NONE, binary_fwd, NULL, CUDA_FN(mr_binary_fwd_cuda)),
    OP(MR_OP_SUB, "sub", 2, 1, MR_OP_NONE, binary_fwd, NULL, CUDA_FN(mr_binary_fwd_cuda)),
    OP(MR_OP_MUL, "mul", 2, 1, MR_OP_NONE, binary_fwd, NULL, CUDA_FN(mr_binary_fwd_cuda)),
    OP(MR_OP_DIV, "div", 2, 1, MR_OP_NONE, binary_fwd, NULL, CUDA_FN(mr_binary_fwd_cuda)),
    OP(MR_OP_ADD_BWD, "add_bwd", 3, 2, MR_OP_ADD, binary_bwd, NULL, CUDA_FN(mr_binary_bwd_cuda)),
    OP(MR_OP_SUB_BWD, "sub_bwd", 3, 2, MR_OP_SUB, binary_bwd, NULL, CUDA_FN(mr_binary_bwd_cuda)),
    OP(MR_OP_MUL_BWD, "mul_bwd", 3, 2, MR_OP_MUL, binary_bwd, NULL, CUDA_FN(mr_binary_bwd_cuda)),
    OP(MR_OP_DIV_BWD, "div_bwd", 3, 2, MR_OP_DIV, binary_bwd, NULL, CUDA_FN(mr_binary_bwd_cuda)),
    OP(MR_OP_RELU, "relu", 1, 1, MR_OP_NONE, unary_fwd, NULL, CUDA_FN(mr_unary_fwd_cuda)),
    OP(MR_OP_GELU, "gelu", 1, 1, MR_OP_NONE, unary_fwd, NULL, CUDA_FN(mr_unary_fwd_cuda)),
    OP(MR_OP_TANH, "tanh", 1, 1, MR_OP_NONE, unary_fwd, NULL, CUDA_FN(mr_unary_fwd_cuda)),
    OP(MR_OP_SIGMOID, "sigmoid", 1, 1, MR_OP_NONE, unary_fwd, NULL, CUDA_FN(mr_unary_fwd_cuda)),
    OP(MR_OP_EXP, "exp", 1, 1, MR_OP_NONE, unary_fwd, NULL, CUDA_FN(mr_unary_fwd_cuda)),
    OP(MR_OP_LOG, "log", 1, 1, MR_OP_NONE, unary_fwd, NULL, CUDA_FN(mr_unary_fwd_cuda)),
    OP(MR_OP_SQRT, "sqrt", 1, 1, MR_OP_NONE, unary_fwd, NULL, CUDA_FN(mr_unary_fwd_cuda)),
    OP(MR_OP_SCALE, "scale", 1, 1, MR_OP_NONE, unary_fwd, NULL, CUDA_FN(mr_unary_fwd_cuda)),
    OP(MR_OP_RELU_BWD, "relu_bwd", 3, 1, MR_OP_RELU, unary_bwd, NULL, CUDA_FN(mr_unary_bwd_cuda)),
    OP(MR_OP_GELU_BWD, "gelu_bwd", 3, 1, MR_OP_GELU, unary_bwd, NULL, CUDA_FN(mr_unary_bwd_cuda)),
    OP(MR_OP_TANH_BWD, "tanh_bwd", 3, 1, MR_OP_TANH, unary_bwd, NULL, CUDA_FN(mr_unary_bwd_cuda)),
    OP(MR_OP_SIGMOID_BWD, "sigmoid_bwd", 3, 1, MR_OP_SIGMOID, unary_bwd, NULL, CUDA_FN(mr_unary_bwd_cuda)),
    OP(MR_OP_EXP_BWD, "exp_bwd", 3, 1, MR_OP_EXP, unary_bwd, NULL, CUDA_FN(mr_unary_bwd_cuda)),
    OP(MR_OP_LOG_BWD, "log_bwd", 3, 1, MR_OP_LOG, unary_bwd, NULL, CUDA_FN(mr_unary_bwd_cuda)),
    OP(MR_OP_SQRT_BWD, "sqrt_bwd", 3, 1, MR_OP_SQRT, unary_bwd, NULL, CUDA_FN(mr_unary_bwd_cuda)),
    OP(MR_OP_SCALE_BWD, "scale_bwd", 3, 1, MR_OP_SCALE, unary_bwd, NULL, CUDA_FN(mr_unary_bwd_cuda)),
    OP(MR_OP_SUM, "sum", 1, 1, MR_OP_NONE, reduce_fwd, NULL, CUDA_FN(mr_reduce_fwd_cuda)),
    OP(MR_OP_MEAN, "mean", 1, 1, MR_OP_NONE, reduce_fwd, NULL, CUDA_FN(mr_reduce_fwd_cuda)),
    OP(MR_OP_MAX, "max", 1, 1, MR_OP_NONE, reduce_fwd, NULL, CUDA_FN(mr_reduce_fwd_cuda)),
    OP(MR_OP_SUM_BWD, "sum_bwd", 1, 1, MR_OP_SUM, reduce_bwd, NULL, CUDA_FN(mr_reduce_bwd_cuda)),
    OP(MR_OP_MEAN_BWD, "mean_bwd", 1, 1, MR_OP_MEAN, reduce_bwd, NULL, CUDA_FN(mr_reduce_bwd_cuda)),
    OP(MR_OP_MAX_BWD, "max_bwd", 3, 1, MR_OP_MAX, reduce_bwd, NULL, CUDA_FN(mr_reduce_bwd_cuda)),
    OP(MR_OP_SOFTMAX, "softmax", 1, 1, MR_OP_NONE, softmax_fwd, NULL, CUDA_FN(mr_softmax_fwd_cuda)),
    OP(MR_OP_LOG_SOFTMAX, "log_softmax", 1, 1, MR_OP_NONE, softmax_fwd, NULL, CUDA_FN(mr_softmax_fwd_cuda)),
    OP(MR_OP_SOFTMAX_BWD, "softmax_bwd", 2, 1, MR_OP_SOFTMAX, softmax_bwd, NULL, CUDA_FN(mr_softmax_bwd_cuda)),
    OP(MR_OP_LOG_SOFTMAX_BWD, "log_softmax_bwd", 2, 1, MR_OP_LOG_SOFTMAX, softmax_bwd, NULL, CUDA_FN(mr_softmax_bwd_cuda)),
    OP(MR_OP_SOFTMAX_XENT, "softmax_xent", 2, 2, MR_OP_NONE, xent_fwd, NULL, CUDA_FN(mr_xent_fwd_cuda)),
    OP(MR_OP_SOFTMAX_XENT_BWD, "softmax_xent_bwd", 3, 1, MR_OP_SOFTMAX_XENT, xent_bwd, NULL, CUDA_FN(mr_xent_bwd_cuda)),
    OP(MR_OP_LAYERNORM, "layernorm", 3, 3, MR_OP_NONE, layernorm_fwd, NULL, CUDA_FN(mr_layernorm_fwd_cuda)),
    OP(MR_OP_LAYERNORM_BWD, "layernorm_bwd", 5, 3, MR_OP_LAYERNORM, layernorm_bwd, NULL, CUDA_FN(mr_layernorm_bwd_cuda)),
    OP(MR_OP_BATCHNORM, "batchnorm", 5, 3, MR_OP_NONE, batchnorm_fwd, NULL, CUDA_FN(mr_batchnorm_fwd_cuda)),
    OP(MR_OP_BATCHNORM_BWD, "batchnorm_bwd", 5, 3, MR_OP_BATCHNORM, batchnorm_bwd, NULL, CUDA_FN(mr_batchnorm_bwd_cuda)),
    OP(MR_OP_EMBEDDING, "embedding", 2, 1, MR_OP_NONE, embedding_fwd, NULL, CUDA_FN(mr_embedding_fwd_cuda)),
    OP(MR_OP_EMBEDDING_BWD, "embedding_bwd", 2, 1, MR_OP_EMBEDDING, embedding_bwd, mr_embedding_bwd_workspace,
       CUDA_FN(mr_embedding_bwd_cuda)),
    OP(MR_OP_CONV2D, "conv2d", 3, 1, MR_OP_NONE, conv2d_fwd, mr_conv2d_fwd_workspace, CUDA_FN(mr_conv2d_fwd_cuda)),
    OP(MR_OP_CONV2D_BWD_DATA, "conv2d_bwd_data", 3, 1, MR_OP_CONV2D, conv2d_bwd_data,
       mr_conv2d_bwd_data_workspace, CUDA_FN(mr_conv2d_bwd_data_cuda)),
    OP(MR_OP_CONV2D_BWD_FILTER, "conv2d_bwd_filter", 3, 2, MR_OP_CONV2D, conv2d_bwd_filter,
       mr_conv2d_bwd_filter_workspace, CUDA_FN(mr_conv2d_bwd_filter_cuda)),
    /* CPU only (no CUDA kernel: GPU graphs never fuse, autodiff/graph.c mr_graph_fuse_conv_pool) */
    OP(MR_OP_CONV2D_MAXPOOL, "conv2d_maxpool", 3, 2, MR_OP_NONE, conv2d_maxpool_fwd, mr_conv2d_maxpool_fwd_workspace,
       NULL),
    OP(MR_OP_MAXPOOL2D, "maxpool2d", 1, 2, MR_OP_NONE, maxpool2d_fwd, NULL, CUDA_FN(mr_maxpool2d_fwd_cuda)),
    OP(MR_OP_MAXPOOL2D_BWD, "maxpool2d_bwd", 2, 1, MR_OP_MAXPOOL2D, maxpool2d_bwd, NULL, CUDA_FN(mr_maxpool2d_bwd_cuda)),
    OP(MR_OP_AVGPOOL2D, "avgpool2d", 1, 1, MR_OP_NONE, avgpool2d_fwd, NULL, CUDA_FN(mr_avgpool2d_fwd_cuda)),
    OP(MR_OP_AVGPOOL2D_BWD, "avgpool2d_bwd", 1, 1, MR_OP_AVGPOOL2D, avgpool2d_bwd, NULL, CUDA_FN(mr_avgpool2d_bwd_cuda)),
    OP(MR_OP_DROPOUT, "dropout", 1, 1, MR_OP_NONE, dropout_fwd, NULL, CUDA_FN(mr_dropout_fwd_cuda)),
    OP(MR_OP_DROPOUT_BWD, "dropout_bwd", 1, 1, MR_OP_DROPOUT, dropout_fwd, NULL, CUDA_FN(mr_dropout_fwd_cuda)),
    OP(MR_OP_PERMUTE, "permute", 1, 1, MR_OP_NONE, permute_fwd, NULL, CUDA_FN(mr_permute_fwd_cuda)),
    OP(MR_OP_CONCAT, "concat", MR_OP_MAX_IO, 1, MR_OP_NONE, concat_fwd, NULL, CUDA_FN(mr_concat_fwd_cuda)),
    OP(MR_OP_CAST, "cast", 1, 1, MR_OP_NONE, cast_fwd, NULL, CUDA_FN(mr_cast_fwd_cuda)),
    OP(MR_OP_SGD_UPDATE, "sgd_update", 3, 0, MR_OP_NONE, sgd_update, NULL, CUDA_FN(mr_sgd_update_cuda)),
    OP(MR_OP_ADAMW_UPDATE, "adamw_update", 4, 0, MR_OP_NONE, adamw_update, NULL, CUDA_FN(mr_adamw_update_cuda)),
    /* one host function for every backend: it enqueues GPU work on the args' stream itself */
    OP(MR_OP_HOOK, "hook", 1, 1, MR_OP_NONE, hook, NULL, CUDA_FN(mr_hook_cpu)),
    OP(MR_OP_ATTENTION, "attention", 3, 2, MR_OP_NONE, attention_fwd, mr_attention_fwd_workspace,
       CUDA_FN(mr_attention_fwd_cuda)),
    OP(MR_OP_ATTENTION_BWD, "attention_bwd", 6, 3, MR_OP_ATTENTION, attention_bwd, mr_attention_bwd_workspace,
       CUDA_FN(mr_attention_bwd_cuda)),
    OP(MR_OP_GEMM_DC, "gemm_dc", 2, 2, MR_OP_GEMM, gemm_dc, mr_gemm_dc_workspace, CUDA_FN(mr_gemm_dc_cuda)),
};

const mr_op_info *mr_op_get(mr_op_id op) {
    if ((int)op <= 0 || op >= MR_OP_COUNT) return NULL;
    return &g_ops[op];
}

const mr_op_info *mr_op_find(const char *name) {
    for (int i = 1; i < MR_OP_COUNT; i++)
        if (g_ops[i].name && !strcmp(g_ops[i].name, name)) return &g_ops[i];
    return NULL;
}

void mr_op_args_init(mr_op_args *a, mr_op_id op) {
    memset(a, 0, sizeof *a);
    a->op = op;
    const mr_op_info *info = mr_op_get(op);
    if (info) {
        a->n_in = info->n_in;
        a->n_out = info->n_out;
    }
    /* PyTorch's default: a zeroed params union would silently ignore every row labelled 0 */
    if (op == MR_OP_SOFTMAX_XENT || op == MR_OP_SOFTMAX_XENT_BWD) a->p.xent.ignore_index = -100;
}

size_t mr_op_workspace_bytes(const mr_op_args *a) {
    const mr_op_info *info = mr_op_get(a->op);
    return (info && info->workspace) ? info->workspace(a) : 0;
}

/* `cpu_ws`: the workspace the op table sizes is the CPU kernel's (mr_op_info.workspace); the
 * reference and the CUDA kernels do not need it (cuBLAS widens f16 itself; cuDNN takes whatever
 * workspace it is given, none included), so only a CPU run requires it. */
static mr_status check_common(const mr_op_args *a, int cpu_ws, const mr_op_info **out) {
    const mr_op_info *info = mr_op_get(a->op);
    if (!info || !info->name) return mr_set_error(MR_ERR_INVALID, "op: invalid op id %d", (int)a->op);
    if (a->n_in != info->n_in || a->n_out != info->n_out)
        return mr_set_error(MR_ERR_INVALID, "%s: expects %d inputs and %d outputs, got %d and %d",
                            info->name, info->n_in, info->n_out, a->n_in, a->n_out);
    mr_status st = info->check(a);
    if (st != MR_OK) return st;
    /* only after the check: workspace functions may assume valid arguments */
    size_t ws = cpu_ws && info->workspace ? info->workspace(a) : 0;
    if (ws > 0 && (a->workspace == NULL || a->workspace_bytes < ws))
        return mr_set_error(MR_ERR_INVALID, "%s: needs a workspace of %zu bytes, got %zu", info->name,
                            ws, a->workspace ? a->workspace_bytes : (size_t)0);
    *out = info;
    return MR_OK;
}

mr_status mr_op_run(mr_device_kind kind, const mr_op_args *a) {
    const mr_op_info *info = NULL;
    mr_status st = check_common(a, kind == MR_DEVICE_CPU, &info);
    if (st != MR_OK) return st;
    if ((int)kind < 0 || kind >= MR_DEVICE_KIND_COUNT || !info->kernel[kind])
        return mr_set_error(MR_ERR_UNSUPPORTED, "%s: no kernel on backend %d", info->name, (int)kind);
    return info->kernel[kind](a);
}

mr_status mr_op_run_ref(const mr_op_args *a) {
    const mr_op_info *info = NULL;
    mr_status st = check_common(a, 0, &info);
    if (st != MR_OK) return st;
    return info->ref(a);
}
