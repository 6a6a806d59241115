/* The op set and the op table (docs/DESIGN.md "Backends", docs/STYLE.md rule 5).
 *
 * Every op is a kernel with one uniform signature, `mr_status fn(const mr_op_args *)`, over
 * contiguous buffers (mr_view) plus a params union. The op table holds, per op: its name, a
 * check that validates shapes and dtypes (the error names the op and the shapes), the scratch
 * workspace it needs, and its kernels: `ref` (the scalar oracle), `cpu`, `cuda` (NULL where
 * absent). Backward kernels are ops of their own (`*_BWD`) that name their forward op, so the
 * tests can find for every differentiable op its gradient and check it by finite differences.
 *
 * Dtypes: the reference computes in f64 (float views must be MR_F64; integer views keep their
 * type). The CPU kernels take f32 (fast path) or f64 (they run the reference). Integer inputs
 * (labels, token ids) are MR_I32. Row-major everywhere; "rows x cols" means the last dim is cols.
 *
 * In/out conventions are listed per op below as `in: ...; out: ...`. Outputs are fully written
 * (never accumulated into) unless the op says otherwise. Optional views have data == NULL.
 * Thread safety: kernels may run concurrently on distinct outputs. */
#ifndef MR_OPS_H
#define MR_OPS_H

#include <stdint.h>
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_OP_MAX_IO 6

typedef enum mr_op_id {
    MR_OP_NONE = 0,
    /* in: A (batch?,M,K) or (batch?,K,M) if trans_a, B (batch?,K,N) or (batch?,N,K) if trans_b,
     * bias (N) optional; out: C (batch?,M,N), pre (batch?,M,N) optional.
     * pre := alpha*op(A)*op(B) + beta*C + bias (C is read when beta != 0; the bias, when present,
     * is broadcast over every row of every batch), then C := pre, or with p.gemm.epilogue ==
     * MR_GEMM_EPI_GELU C := gelu(pre) (the tanh form of MR_OP_GELU) and pre, when given, receives
     * the pre-activation (what the backward needs: cuBLASLt's GELU_AUX_BIAS epilogue).
     * The bias and pre have C's dtype (so f32 in mixed precision: half A and B, f32 C); pre is
     * only allowed with GELU, and GELU only with beta == 0 (a fused linear never accumulates).
     * A and B may have a leading batch dim (batch = product of leading dims); a 2-d B is shared
     * by every batch of A. p.gemm.allow_tf32 lets the CUDA kernel run f32 on TF32 tensor cores
     * (like torch.backends.cuda.matmul.allow_tf32; ~1e-3 relative error); the CPU ignores it.
     * Gradients are GEMMs, GELU_BWD and a SUM, so there is no GEMM_BWD. */
    MR_OP_GEMM,
    /* Binary elementwise with numpy broadcasting. in: a, b; out: y (the broadcast shape). */
    MR_OP_ADD, MR_OP_SUB, MR_OP_MUL, MR_OP_DIV,
    /* in: a, b, dy; out: da (a's shape), db (b's shape); broadcast dims are summed. Either
     * output may be omitted (data NULL). */
    MR_OP_ADD_BWD, MR_OP_SUB_BWD, MR_OP_MUL_BWD, MR_OP_DIV_BWD,
    /* Unary elementwise. in: x; out: y. SCALE: y = alpha*x. GELU is the tanh form. */
    MR_OP_RELU, MR_OP_GELU, MR_OP_TANH, MR_OP_SIGMOID, MR_OP_EXP, MR_OP_LOG, MR_OP_SQRT, MR_OP_SCALE,
    /* in: x, y (the forward output), dy; out: dx. A kernel reads what it needs. */
    MR_OP_RELU_BWD, MR_OP_GELU_BWD, MR_OP_TANH_BWD, MR_OP_SIGMOID_BWD, MR_OP_EXP_BWD,
    MR_OP_LOG_BWD, MR_OP_SQRT_BWD, MR_OP_SCALE_BWD,
    /* Reductions over the axes in p.reduce.axes (bit i = dim i). in: x; out: y with the reduced
     * dims of size 1 (keepdim; reshape to drop them). MAX propagates NaN. */
    MR_OP_SUM, MR_OP_MEAN, MR_OP_MAX,
    /* SUM/MEAN: in: dy (reduced shape); out: dx. MAX: in: x, y, dy; out: dx (the gradient goes
     * to the first maximal element along the reduced axes, as torch.max(dim) does). */
    MR_OP_SUM_BWD, MR_OP_MEAN_BWD, MR_OP_MAX_BWD,
    /* Over the last axis. in: x; out: y. SOFTMAX with p.softmax.causal: x is (..., T, S) and
     * row i sees columns j <= i + S - T only; the others get probability 0 (as an additive
     * -inf causal mask would give, without the mask's pass over memory).
     * SOFTMAX of an f32 x may write a bf16/f16 y (CPU only): computed in f32, each probability
     * rounded as CAST rounds it (mixed precision's probabilities for a half GEMM, no cast pass). */
    MR_OP_SOFTMAX, MR_OP_LOG_SOFTMAX,
    /* in: y (the forward output), dy; out: dx. SOFTMAX_BWD (CPU only) takes a half y (the
     * forward's half output, widened exactly) with an f32 dy, and may write a half dx (computed in
     * f32, rounded as CAST): the cast a half GEMM reading dx needs, folded in (autodiff/grad.c). */
    MR_OP_SOFTMAX_BWD, MR_OP_LOG_SOFTMAX_BWD,
    /* Fused softmax cross-entropy. in: logits (N,C), labels (N) i32; out: loss (N), probs (N,C).
     * loss[i] = logsumexp(logits[i]) - logits[i, label]; rows whose label equals
     * p.xent.ignore_index get loss 0. Labels outside [0,C) otherwise are an error (checked). */
    MR_OP_SOFTMAX_XENT,
    /* in: probs (N,C), labels (N) i32, dloss (N); out: dlogits (N,C) = dloss*(probs - onehot). */
    MR_OP_SOFTMAX_XENT_BWD,
    /* Layer norm over the last axis (D). in: x (N,D), gamma (D), beta (D); out: y (N,D),
     * mean (N), rstd (N) (saved for the backward; same float type as x). */
    MR_OP_LAYERNORM,
    /* in: x, gamma, mean, rstd, dy; out: dx, dgamma, dbeta (dgamma/dbeta optional). */
    MR_OP_LAYERNORM_BWD,
    /* Batch norm, statistics per channel (dim 1) over every other dim: x (N,C,S...) of rank >= 2,
     * M = numel(x)/C elements per channel. in: x, gamma (C) optional, beta (C) optional,
     * running_mean (C), running_var (C); out: y (x's shape), mean (C), var (C).
     * p.batchnorm.training: mean and var receive the batch mean and the BIASED batch variance
     * (computed stably, M >= 1) and y = (x - mean) / sqrt(var + eps) * gamma + beta; the running
     * statistics are not read (may be absent). Evaluation: y uses running_mean and running_var
     * (required); mean and var are optional and, when given, receive copies of them. An absent
     * gamma counts as 1, an absent beta as 0. Updating the running statistics is the caller's
     * (autodiff/nn.c mr_nn_batchnorm). */
    MR_OP_BATCHNORM,
    /* in: dy, x, gamma (optional: 1), mean, var (the forward's outputs in training, the running
     * statistics in evaluation); out: dx, dgamma, dbeta (each optional). Same p.batchnorm as the
     * forward. With xhat = (x - mean) * rstd, rstd = 1/sqrt(var + eps): training
     * dx = gamma*rstd/M * (M*dy - sum(dy) - xhat*sum(dy*xhat)) (the statistics depend on x);
     * evaluation dx = dy*gamma*rstd; dgamma = sum(dy*xhat), dbeta = sum(dy), sums per channel. */
    MR_OP_BATCHNORM_BWD,
    /* Embedding gather. in: table (V,D), ids (...) i32; out: y (..., D). Ids outside [0,V) are
     * an error. */
    MR_OP_EMBEDDING,
    /* Scatter-add. in: ids (...) i32, dy (..., D); out: dtable (V,D), zeroed then accumulated. */
    MR_OP_EMBEDDING_BWD,
    /* 2-d convolution, NCHW. in: x (N,C,H,W), w (O,C,KH,KW), bias (O) optional;
     * out: y (N,O,OH,OW), OH = (H + 2*pad_h - KH)/stride_h + 1.
     * Dtypes (all three conv ops): every float view f32 or every one f64; or, with p.conv.bf16
     * (mixed precision, CPU only), w bf16, x and dy f32 or bf16, the bias and outputs f32: x and
     * dy are rounded to bf16 (nearest even) as they are read, products are exact and sums f32
     * (rounding in the kernel saves the cast's pass over the activations).
     * p.conv.relu (CPU only): y = max(x*w + bias, 0), NaN and -0 giving 0 as MR_OP_RELU; the
     * gradient is RELU_BWD with y in place of the pre-activation (y > 0 exactly where it is). */
    MR_OP_CONV2D,
    /* in: w, dy, argmax (optional); out: dx (N,C,H,W) (shape taken from out[0].shape). */
    MR_OP_CONV2D_BWD_DATA,
    /* in: x, dy, argmax (optional); out: dw (O,C,KH,KW), dbias (O) optional.
     * Both backward ops with p.conv.pool (CPU only): dy is the gradient of a CONV2D_MAXPOOL's
     * pooled y, (N,O,OH/2,OW/2), and argmax its output 1; the kernels scatter dy at the argmax
     * into the conv output's gradient as they read it (MAXPOOL2D_BWD's values, dy's bits copied,
     * 0 elsewhere), so that full-size gradient is never stored. Without p.conv.pool argmax is
     * absent. */
    MR_OP_CONV2D_BWD_FILTER,
    /* A CONV2D followed by a 2x2/stride-2 MAXPOOL2D without padding, as one op (CPU only: the
     * conv's output is pooled while it is in cache and never stored). in: x, w, bias (as
     * CONV2D); out: y (N,O,OH/2,OW/2) (OH, OW the conv's), argmax (N,O,OH/2,OW/2) i32, the flat
     * index into the conv output's OH*OW plane. Same p.conv as CONV2D (bf16, relu); with
     * p.conv.relu the argmax follows MAXPOOL2D's p.pool.relu (-1 where the window's max is not
     * > 0). y and argmax equal CONV2D then MAXPOOL2D {2,2,2,2,0,0,relu} bit for bit; the
     * gradient is the conv's backward ops with p.conv.pool on the pooled dy and the argmax (they
     * scatter it as MAXPOOL2D_BWD would, autodiff/grad.c); the graph makes the op from such a
     * pair (mr_graph_fuse_conv_pool). */
    MR_OP_CONV2D_MAXPOOL,
    /* Max pooling, NCHW; padding counts as -inf. in: x; out: y (N,C,OH,OW), argmax (N,C,OH,OW)
     * i32 (flat index into the H*W plane, -1 when a window saw only padding).
     * p.pool.relu (CPU only): argmax is also -1 where the window's max is not > 0 (0, NaN), so
     * MAXPOOL2D_BWD's dx is the gradient through a ReLU before the pool as well: for x a ReLU's
     * output y (>= 0), dx = relu_bwd(y, maxpool_bwd(dy)) bit for bit, since the mask y > 0 at a
     * window's argmax is the window's max > 0 (the graph sets it after a CONV2D with p.conv.relu,
     * autodiff/graph.c mr_graph_maxpool2d, and the conv's rule then skips RELU_BWD, grad.c). */
    MR_OP_MAXPOOL2D,
    /* in: argmax, dy; out: dx (shape from out[0].shape). */
    MR_OP_MAXPOOL2D_BWD,
    /* Average pooling, NCHW, as torch.nn.AvgPool2d with count_include_pad=True, ceil_mode=False:
     * padding counts as zeros and every window divides by kernel_h*kernel_w. in: x; out: y
     * (N,C,OH,OW), OH = (H + 2*pad_h - kernel_h)/stride_h + 1. */
    MR_OP_AVGPOOL2D,
    /* in: dy; out: dx (shape from out[0].shape): each dy/(kernel_h*kernel_w) added to the
     * elements of its window (padding dropped). */
    MR_OP_AVGPOOL2D_BWD,
    /* Inverted dropout with a counter-based mask: element i is kept iff
     * philox_uniform(p.dropout.seed, p.dropout.offset, i) >= p.dropout.p; kept values are scaled
     * by 1/(1-p). in: x; out: y. The mask depends only on seed, offset and i. */
    MR_OP_DROPOUT,
    /* in: dy; out: dx (recomputes the same mask). */
    MR_OP_DROPOUT_BWD,
    /* Transpose as an op: y = x permuted by p.permute.perm (y.dim[i] = x.dim[perm[i]]).
     * in: x; out: y. Its gradient is the inverse permutation. y has x's dtype, or (CPU only) an
     * f32 x goes into a bf16/f16 y rounded as CAST rounds: a permute and a cast in one pass. */
    MR_OP_PERMUTE,
    /* Flat concatenation: in: up to MR_OP_MAX_IO contiguous buffers of one dtype (absent ones,
     * data NULL, are skipped); out: y whose numel is the sum of theirs, in order. Its gradient is
     * slices of dy (views, no kernel). */
    MR_OP_CONCAT,
    /* Cast among f32, f64, f16, bf16 (round to nearest even). in: x; out: y. */
    MR_OP_CAST,
    /* Fused optimizer updates, in place, PyTorch semantics (torch.optim.SGD / AdamW).
     * SGD: in: param (n), grad (n), momentum_buf (n) (updated in place; ignored when
     * momentum == 0); out: none (param is written). */
    MR_OP_SGD_UPDATE,
    /* in: param (n), grad (n), exp_avg (n), exp_avg_sq (n), all updated in place but grad.
     * p.adamw.step is the 1-based step used for bias correction. */
    MR_OP_ADAMW_UPDATE,
    /* A caller function as a node: in x; out y of x's dtype and shape; p.hook.h says what computes
     * y from x (how a collective enters a graph: sync batch norm sums its statistics over the
     * replicas). The same function runs on every backend, with the args' stream and device; a hook
     * must be linear and self-adjoint (a sum over replicas is), so the gradient of y = h(x) is
     * h(dy), another node of this op. */
    MR_OP_HOOK,
    /* Scaled dot-product attention (flash attention's contract): in: q (..., T, D), k (..., S, D),
     * v (..., S, D) of one float dtype (f32, f64, or bf16/f16 for mixed precision), same leading
     * dims; out: y (..., T, D) of q's dtype, lse (..., T) (f64 for f64, else f32).
     * y_i = sum_j softmax_j(p.attention.scale * q_i.k_j) v_j over the keys row i sees: all S, or
     * with p.attention.causal (T <= S) j <= i + S - T. lse_i is the log-sum-exp of row i's scaled
     * scores, saved for the backward, which recomputes the probabilities from it rather than
     * storing the (T, S) matrix. Half inputs compute in f32 and round y once. */
    MR_OP_ATTENTION,
    /* in: q, k, v, y, lse (the forward's outputs), dy (y's shape and dtype); out: dq, dk, dv
     * (the shapes and dtype of q, k, v). Same p.attention as the forward. */
    MR_OP_ATTENTION_BWD,
    /* A GEMM's backward, before its gradient GEMMs (autodiff/grad.c rule_gemm), in one pass over
     * dy instead of GELU_BWD, SUM and CAST passes. in: dy (..., N), pre (dy's shape, optional:
     * the GELU epilogue's pre-activation); out: dc (dy's shape, optional), dbias (N, optional).
     * g = dy, or gelu_grad(pre, dy) (GELU_BWD's math) when pre is given, in dy's type;
     * dc = g in dc's dtype (rounded to nearest even for bf16/f16, as CAST); dbias[j] = the sum of
     * g[.., j] over every row. dy, pre and dbias: one float dtype (f32, or f64 with dc f64 too);
     * dc: f32, bf16 or f16 with an f32 dy. At least one output. No params.
     * Sum order (CPU): rows in fixed blocks of 64 summed in row order, then the blocks in order,
     * so dbias does not depend on the thread count. */
    MR_OP_GEMM_DC,
    MR_OP_COUNT
} mr_op_id;

/* How MR_OP_ATTENTION / MR_OP_ATTENTION_BWD ran on CUDA devices in this process: calls through
 * cuDNN's fused flash attention (bf16/f16 shapes cuDNN has an engine for; MIRROR_CUDNN_SDPA=0
 * turns it off) and calls through mirror's own kernels (docs/DESIGN.md "cuDNN attention"). */
typedef struct mr_attention_paths {
    int64_t cudnn_fwd, cudnn_bwd, kernel_fwd, kernel_bwd;
} mr_attention_paths;
void mr_attention_paths_get(mr_attention_paths *out);

/* GEMM epilogues (p.gemm.epilogue): what is applied to alpha*op(A)op(B) + beta*C + bias. */
enum { MR_GEMM_EPI_NONE = 0, MR_GEMM_EPI_GELU = 1 };

typedef struct mr_gemm_params {
    int trans_a, trans_b;
    double alpha, beta;
    int epilogue;   /* MR_GEMM_EPI_NONE or MR_GEMM_EPI_GELU */
    int allow_tf32; /* CUDA, f32 only: TF32 tensor cores allowed (default 0: full f32) */
} mr_gemm_params;

typedef struct mr_reduce_params {
    uint32_t axes; /* bit i set: reduce dim i */
} mr_reduce_params;

typedef struct mr_conv_params {
    int stride_h, stride_w, pad_h, pad_w;
    int bf16; /* mixed precision (CPU): tensor inputs rounded to bf16, f32 accumulation (see MR_OP_CONV2D) */
    int relu; /* CONV2D on the CPU: y = max(conv + bias, 0) (a fused ReLU; the backward ops ignore it) */
    int pool; /* CONV2D_BWD_* on the CPU: dy pooled 2x2, scattered at in[2] (argmax) as read (see them) */
} mr_conv_params;

typedef struct mr_pool_params {
    int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
    int relu; /* MAXPOOL2D on the CPU: argmax -1 where the max is not > 0 (a fused ReLU gradient) */
} mr_pool_params;

typedef struct mr_dropout_params {
    double p;
    uint64_t seed, offset;
} mr_dropout_params;

typedef struct mr_sgd_params {
    double lr, momentum, dampening, weight_decay;
    int nesterov;
    int first_step; /* 1 on the first update: the buffer is set to the gradient (as PyTorch) */
    /* By pointer (the trainer's device-side step decisions, core/vec.h mr_step_ctl), in the
     * kernel's memory, NULL when unused: *apply 0 leaves everything unchanged; *step (1-based)
     * replaces first_step (first_step = *step == 1). */
    const int32_t *apply;
    const int64_t *step;
} mr_sgd_params;

typedef struct mr_adamw_params {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step; /* >= 1 */
    /* By pointer, NULL when unused (mr_sgd_params'): *apply 0 leaves everything unchanged; *step
     * (1-based) replaces step, and the bias corrections are read from bc (2 doubles per step,
     * [2k] = 1 - beta1^k, [2k + 1] = sqrt(1 - beta2^k), formed on the host as
     * mr_adamw_prepare_* forms them, so the bits are the by-value kernel's; steps past bc_last
     * read entry bc_last, which is then (1, 1) exactly, as every later step's is). */
    const int32_t *apply;
    const int64_t *dstep;
    const double *bc;
    int64_t bc_last;
} mr_adamw_params;

/* What an MR_OP_HOOK node runs (borrowed: it must outlive every plan that runs it). */
typedef struct mr_hook {
    /* y := h(x) for numel elements of dtype dt, on the backend's stream of device `device`
     * (NULL: default; a GPU hook enqueues its work there); x and y do not overlap. */
    mr_status (*fn)(void *ctx, const void *x, void *y, int64_t numel, mr_dtype dt, mr_stream *stream, int device);
    void *ctx;
    int replicas; /* for batch norm: how many replicas the sum runs over (global count = local x replicas) */
} mr_hook;

typedef union mr_op_params {
    mr_gemm_params gemm;
    mr_reduce_params reduce;
    double scale;                     /* SCALE, SCALE_BWD: alpha */
    struct { int64_t ignore_index; } xent;
    struct { double eps; } layernorm;
    struct { double eps; int training; } batchnorm;
    struct { int causal; } softmax;
    mr_conv_params conv;
    mr_pool_params pool;
    mr_dropout_params dropout;
    struct { int perm[MR_MAX_DIMS]; } permute;
    mr_sgd_params sgd;
    mr_adamw_params adamw;
    struct { const mr_hook *h; } hook;
    struct { double scale; int causal; } attention;
} mr_op_params;

typedef struct mr_op_args {
    mr_op_id op;
    int n_in, n_out;
    mr_view in[MR_OP_MAX_IO];
    mr_view out[MR_OP_MAX_IO];
    mr_op_params p;
    mr_stream *stream;      /* backend stream (NULL: default) */
    int device;             /* device index for the backend */
    void *workspace;        /* scratch of at least mr_op_workspace_bytes(args), or NULL if 0 */
    size_t workspace_bytes;
} mr_op_args;

typedef mr_status (*mr_kernel_fn)(const mr_op_args *a);

typedef struct mr_op_info {
    mr_op_id id;
    const char *name;       /* "gemm", "relu_bwd", ... */
    int n_in, n_out;        /* exact counts the args must carry (optional ones included) */
    mr_op_id fwd;           /* for a backward kernel, the op it differentiates; else NONE */
    /* Validates the args (counts, dtypes, shapes, params). MR_ERR_INVALID naming the op. */
    mr_status (*check)(const mr_op_args *a);
    /* Scratch bytes the CPU kernel needs (NULL: none). mr_op_run requires them for the CPU only; a
     * CUDA kernel that uses the same workspace (embedding_bwd's buckets) checks it itself, and
     * the planner always passes it, so a planned step runs on any backend. */
    size_t (*workspace)(const mr_op_args *a);
    mr_kernel_fn ref;
    mr_kernel_fn kernel[MR_DEVICE_KIND_COUNT]; /* indexed by mr_device_kind; NULL: unsupported */
} mr_op_info;

/* The table entry for an op (NULL for an invalid id). */
const mr_op_info *mr_op_get(mr_op_id op);
/* Looks an op up by name (NULL if none). */
const mr_op_info *mr_op_find(const char *name);

/* Scratch bytes `a` needs on its backend. */
size_t mr_op_workspace_bytes(const mr_op_args *a);

/* Validates `a` and runs it on the backend of `kind` (CPU kernels run synchronously).
 * MR_ERR_INVALID from the check, MR_ERR_UNSUPPORTED if the backend has no kernel for it,
 * or the kernel's own error. */
mr_status mr_op_run(mr_device_kind kind, const mr_op_args *a) MR_WUR;
/* Validates and runs the scalar reference. */
mr_status mr_op_run_ref(const mr_op_args *a) MR_WUR;

/* Initialises args for `op` with counts from the table and zeroed params (but
 * p.xent.ignore_index = -100, PyTorch's default, for the cross-entropy ops). */
void mr_op_args_init(mr_op_args *a, mr_op_id op);

/* CPU backend facts: the GEMM provider chosen at run time and why, the thread count. */
const char *mr_cpu_gemm_provider(void);
int mr_cpu_threads(void);
/* Sets the number of threads for OpenMP loops and GEMM together (one pool for the process). */
void mr_cpu_set_threads(int n);
/* CPU feature summary ("avx512f avx512bw avx512_bf16 amx ..."). */
const char *mr_cpu_features(void);

#ifdef __cplusplus
}
#endif
#endif
