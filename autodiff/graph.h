/* Static computation graphs over the op set, reverse-mode gradients, planned memory, execution
 * (docs/DESIGN.md "Graph"; the ggml lesson: building computes nothing).
 *
 * A graph holds values (the symbolic tensors: a dtype and a shape each) and nodes (one op of the
 * op table, its input values, its params, its output values). Builder calls infer the output
 * shapes and validate them with the op's own check, so a mismatch fails at build time with the
 * op and the shapes named. Build errors are sticky: the first one is kept (mr_graph_status,
 * mr_graph_error), later builder calls return MR_VAL_NONE and do nothing, so a model can be
 * built straight through and checked once at the end.
 *
 * mr_graph_grad appends the backward nodes for d(loss)/d(params). mr_plan_new then compiles the
 * graph for a backend: it orders the nodes, assigns every intermediate value an offset in one
 * arena by liveness (values whose lifetimes do not overlap share bytes), pre-builds every
 * kernel's arguments, and reports the planned peak. mr_plan_run runs it as often as wanted with
 * no allocation. Inputs and parameters live in caller memory bound with mr_plan_bind.
 *
 * Thread safety: a graph or plan is used by one thread at a time; distinct ones are independent. */
#ifndef MR_GRAPH_H
#define MR_GRAPH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "core/device.h"
#include "core/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_graph mr_graph;
typedef struct mr_plan mr_plan;
struct mr_trace_track; /* core/trace.h */

/* A value of a graph: id 0 is "none". */
typedef struct mr_val {
    int32_t id;
} mr_val;
#define MR_VAL_NONE ((mr_val){0})

typedef enum mr_val_kind {
    MR_VAL_INPUT = 0, /* fed per run (bound with mr_plan_bind); not differentiated */
    MR_VAL_PARAM = 1, /* trainable: bound storage; mr_graph_grad differentiates with respect to it */
    MR_VAL_CONST = 2, /* data owned by the graph, copied in at build time */
    MR_VAL_NODE = 3,  /* an output of a node */
    MR_VAL_VIEW = 4,  /* a reshape or slice of another value: its bytes */
    MR_VAL_FUSED = 5  /* an intermediate a fusion removed (mr_graph_fuse_conv_pool): a shape, no bytes */
} mr_val_kind;

mr_status mr_graph_new(mr_graph **out) MR_WUR;
void mr_graph_free(mr_graph *g); /* NULL is a no-op */

/* MR_OK, or the first build error; mr_graph_error gives its message ("" when none). */
mr_status mr_graph_status(const mr_graph *g);
const char *mr_graph_error(const mr_graph *g);
/* Records a build error (for layer and model builders; the first error wins) and returns the
 * graph's status. */
mr_status mr_graph_fail(mr_graph *g, mr_status st, const char *fmt, ...) MR_PRINTF(3, 4);

/* ---- leaves ---- */
mr_val mr_graph_input(mr_graph *g, const char *name, mr_dtype dt, mr_shape shape);
mr_val mr_graph_param(mr_graph *g, const char *name, mr_dtype dt, mr_shape shape);
/* A constant of `shape` whose every element is v (stored in dtype dt). */
mr_val mr_graph_fill(mr_graph *g, mr_dtype dt, mr_shape shape, double v);
/* A constant holding a copy of `data` (numel * dtype size bytes). */
mr_val mr_graph_const(mr_graph *g, mr_dtype dt, mr_shape shape, const void *data);

/* ---- introspection ---- */
int32_t mr_graph_num_values(const mr_graph *g);
int32_t mr_graph_num_nodes(const mr_graph *g);
mr_dtype mr_graph_dtype(const mr_graph *g, mr_val v);
mr_shape mr_graph_shape(const mr_graph *g, mr_val v);
mr_val_kind mr_graph_kind(const mr_graph *g, mr_val v);
const char *mr_graph_name(const mr_graph *g, mr_val v); /* "" for unnamed values */
/* The value named `name` (an input or param), or MR_VAL_NONE. */
mr_val mr_graph_find(const mr_graph *g, const char *name);
/* Number of params, and the i-th one, in creation order. */
int32_t mr_graph_num_params(const mr_graph *g);
mr_val mr_graph_param_at(const mr_graph *g, int32_t i);

/* ---- the generic node builder ----
 * Appends one node running `op` on in[0..n_in) (MR_VAL_NONE for an optional input left out)
 * with params p (NULL: zeroed, with the defaults of mr_op_args_init), producing n_out values of
 * the given dtypes and shapes (an out_dtypes[i] < 0 leaves output i out). The op's check
 * validates everything. outs may be NULL when n_out is 0. Returns MR_OK or the sticky error. */
mr_status mr_graph_node(mr_graph *g, mr_op_id op, const mr_val *in, int n_in, const mr_op_params *p,
                        const int *out_dtypes, const mr_shape *out_shapes, int n_out, mr_val *outs);

/* ---- typed builders: shapes are inferred ---- */
/* C = alpha * op(A) op(B); A (...,M,K) or transposed, B (K,N) or (...,K,N). C is f32 when A and B
 * are bf16 or f16 (mixed precision: half inputs, f32 accumulation and output). */
mr_val mr_graph_matmul(mr_graph *g, mr_val a, mr_val b, int trans_a, int trans_b, double alpha);
/* A fused linear layer, y = x w^T + bias, or gelu(x w^T + bias) (tanh form) when `gelu`, as ONE
 * GEMM node with the bias and GELU in its epilogue (cuBLASLt's BIAS / GELU_AUX_BIAS on a GPU):
 * x (...,K) is flattened to rows, w is (N,K), bias (N) or MR_VAL_NONE; y is (...,N). With GELU
 * the pre-activation is the node's second output, saved for the backward. Dtypes as for
 * mr_graph_matmul: half x and w give an f32 y, and the bias has y's dtype (f32 then). */
mr_val mr_graph_linear(mr_graph *g, mr_val x, mr_val w, mr_val bias, int gelu);
/* Lets the GEMM nodes built after this call (matmul, linear, and the gradient GEMMs
 * mr_graph_grad appends for them) run f32 on TF32 tensor cores on a GPU (~1e-3 relative error,
 * like torch.backends.cuda.matmul.allow_tf32). Default off; nodes built earlier keep theirs. */
void mr_graph_set_allow_tf32(mr_graph *g, int on);
mr_val mr_graph_add(mr_graph *g, mr_val a, mr_val b); /* numpy broadcasting */
mr_val mr_graph_sub(mr_graph *g, mr_val a, mr_val b);
mr_val mr_graph_mul(mr_graph *g, mr_val a, mr_val b);
mr_val mr_graph_div(mr_graph *g, mr_val a, mr_val b);
/* op is one of MR_OP_RELU .. MR_OP_SQRT */
mr_val mr_graph_unary(mr_graph *g, mr_op_id op, mr_val x);
mr_val mr_graph_scale(mr_graph *g, mr_val x, double alpha);
/* Reductions keep the reduced dims as size 1; axes is a bitmask of dims. */
mr_val mr_graph_sum(mr_graph *g, mr_val x, uint32_t axes);
mr_val mr_graph_mean(mr_graph *g, mr_val x, uint32_t axes);
mr_val mr_graph_max(mr_graph *g, mr_val x, uint32_t axes);
mr_val mr_graph_softmax(mr_graph *g, mr_val x);     /* over the last axis */
/* Softmax of x (..., T, S) where row i sees columns j <= i + S - T only (causal attention). */
mr_val mr_graph_causal_softmax(mr_graph *g, mr_val x);
/* The causal softmax with y in dtype dt: x's, or bf16/f16 for an f32 x (probabilities computed in
 * f32 and rounded once; CPU only, core/ops.h MR_OP_SOFTMAX). The backward reads that y. */
mr_val mr_graph_causal_softmax_to(mr_graph *g, mr_val x, mr_dtype dt);
mr_val mr_graph_log_softmax(mr_graph *g, mr_val x);
/* Per-row loss (N) of softmax cross-entropy; logits (N,C) float, labels (N) i32. */
mr_val mr_graph_softmax_xent(mr_graph *g, mr_val logits, mr_val labels, int64_t ignore_index);
/* y = layernorm(x) * gamma + beta over the last axis. */
mr_val mr_graph_layernorm(mr_graph *g, mr_val x, mr_val gamma, mr_val beta, double eps);
/* Fused scaled dot-product attention (MR_OP_ATTENTION): q (..., T, D), k and v (..., S, D) of one
 * float dtype -> y (..., T, D) of that dtype, softmax(scale q k^T) v, with the causal mask when
 * `causal` (T <= S). The node's second output (the rows' log-sum-exp) is kept for the backward. */
mr_val mr_graph_attention(mr_graph *g, mr_val q, mr_val k, mr_val v, double scale, int causal);
/* Batch norm over every dim but dim 1 as one node (core/ops.h MR_OP_BATCHNORM): x (N, C, ...)
 * of rank >= 2, gamma and beta (C) or MR_VAL_NONE (1 and 0). training: y uses the batch mean and
 * biased variance, which *mean and *var receive (C values each; either pointer may be NULL);
 * running_mean and running_var are not used (pass MR_VAL_NONE). Evaluation: y uses running_mean
 * and running_var (C), and *mean, *var are set to MR_VAL_NONE. The gradient reaches x, gamma and
 * beta; mean and var are not differentiated (saved state for the backward and for updating the
 * running statistics: autodiff/nn.c mr_nn_batchnorm). Returns y. */
mr_val mr_graph_batchnorm(mr_graph *g, mr_val x, mr_val gamma, mr_val beta, mr_val running_mean,
                          mr_val running_var, double eps, int training, mr_val *mean, mr_val *var);
mr_val mr_graph_embedding(mr_graph *g, mr_val table, mr_val ids);
/* bias may be MR_VAL_NONE. */
mr_val mr_graph_conv2d(mr_graph *g, mr_val x, mr_val w, mr_val bias, int stride, int pad);
/* relu(x), fused into x's CONV2D node (p.conv.relu; the CPU kernels alone honour it) when that
 * node is the graph's last, so nothing has read x yet; else an MR_OP_RELU node. Same bits. */
mr_val mr_graph_relu_after_conv(mr_graph *g, mr_val x);
mr_val mr_graph_maxpool2d(mr_graph *g, mr_val x, int kernel, int stride, int pad);
/* Fuses each CONV2D with a fused ReLU (p.conv.relu, so a CPU graph) whose output only a 2x2,
 * stride-2, unpadded MAXPOOL2D reads into one CONV2D_MAXPOOL node (core/ops.h; the conv output is
 * then never stored). Skipped where the conv output is read by anything else, viewed, or is one
 * of keep[0..n_keep) (the values the caller will plan to keep). The pool's outputs keep their
 * values; the conv's output becomes MR_VAL_FUSED (no bytes: reading it later is a build error,
 * keeping it a plan error); the pool's node is removed, so node counts taken before change. Call
 * it after building the forward, before mr_graph_grad (which differentiates the fused node with the
 * conv's backward ops reading the pooled gradient and the argmax, p.conv.pool: the unfused
 * graph's gradients bit for bit). Returns the number of fusions, or -1 on a graph error. */
int mr_graph_fuse_conv_pool(mr_graph *g, const mr_val *keep, int n_keep);
/* torch.nn.AvgPool2d(kernel, stride, pad) (count_include_pad=True, ceil_mode=False): padding
 * counts as zeros in every window's mean over kernel*kernel. */
mr_val mr_graph_avgpool2d(mr_graph *g, mr_val x, int kernel, int stride, int pad);
/* Inverted dropout; seed and offset pick the mask (the trainer advances offset each step). */
mr_val mr_graph_dropout(mr_graph *g, mr_val x, double p, uint64_t seed, uint64_t offset);
mr_val mr_graph_permute(mr_graph *g, mr_val x, const int *perm);
/* The permute with y in dtype dt: x's, or bf16/f16 for an f32 x (a permute and a cast in one pass;
 * CPU only, core/ops.h MR_OP_PERMUTE). Its gradient comes back in x's dtype. */
mr_val mr_graph_permute_to(mr_graph *g, mr_val x, const int *perm, mr_dtype dt);
mr_val mr_graph_cast(mr_graph *g, mr_val x, mr_dtype dt);
/* y = hook(x) (core/ops.h MR_OP_HOOK; hook is borrowed for the graph's and its plans' lives): a
 * collective inside a graph. Its gradient is the same hook applied to dy. */
mr_val mr_graph_hook(mr_graph *g, mr_val x, const mr_hook *hook);
/* Same bytes, another shape of the same numel. */
mr_val mr_graph_reshape(mr_graph *g, mr_val x, mr_shape shape);
/* A view of x's elements [offset, offset + numel(shape)) with `shape` (x is contiguous, so a
 * slice along the first dim is a contiguous range): no copy. */
mr_val mr_graph_slice(mr_graph *g, mr_val x, int64_t offset, mr_shape shape);
/* The flat concatenation of xs[0..n) (n <= MR_OP_MAX_IO, one dtype) reshaped to `shape`. */
mr_val mr_graph_concat(mr_graph *g, const mr_val *xs, int n, mr_shape shape);

/* ---- gradients ----
 * Appends the backward of the scalar (numel 1) float value `loss` with respect to each of
 * params[0..n) (params or any float values), writing the gradient values to grads[0..n). A
 * value used several times gets the sum of its gradients; integer values and values that do not
 * reach the loss get no gradient (a param the loss does not depend on gets a zero constant).
 * Errors: MR_ERR_INVALID (loss not a scalar float, an op without a gradient rule). */
mr_status mr_graph_grad(mr_graph *g, mr_val loss, const mr_val *params, int n, mr_val *grads) MR_WUR;

/* ---- plans ----
 * Compiles the graph for a backend. `keep[0..n_keep)` are the values the caller will read after
 * a run (the loss, the gradients): their bytes are never reused within a run. MR_ERR_INVALID if
 * the graph has a build error. */
mr_status mr_plan_new(const mr_graph *g, mr_device_kind kind, const mr_val *keep, int n_keep, mr_plan **out) MR_WUR;
/* The same on a given device and stream: the arena is device dev's memory, every kernel runs on
 * dev's backend with args.device = dev.index and args.stream = stream (borrowed; NULL: the device's
 * default stream), and bound pointers must be dev's memory. Runs are asynchronous on the stream for
 * a GPU (mr_plan_data's values are ready after a stream_sync). mr_plan_new(kind) is
 * mr_plan_new_on({kind, 0}, NULL). */
mr_status mr_plan_new_on(const mr_graph *g, mr_device dev, mr_stream *stream, const mr_val *keep, int n_keep,
                         mr_plan **out) MR_WUR;
void mr_plan_free(mr_plan *p); /* NULL is a no-op */
/* Points an input or param at caller memory of its dtype and shape (borrowed until rebound or the
 * plan is freed). A kept node output may be bound too: its kernels then write straight into the
 * caller's memory (how gradients land in a model's contiguous gradient buffer); NULL unbinds it
 * back to the arena. */
mr_status mr_plan_bind(mr_plan *p, mr_val v, void *data) MR_WUR;
/* Runs every node in order. MR_ERR_INVALID naming the value if an input or param is unbound. */
mr_status mr_plan_run(mr_plan *p) MR_WUR;
/* Where a kept value (or any input, param or const) lives after a run; NULL for others. */
void *mr_plan_data(const mr_plan *p, mr_val v);
/* Bytes of the arena (the planned peak of intermediate values) and what the same values would
 * take without sharing. */
size_t mr_plan_arena_bytes(const mr_plan *p);
size_t mr_plan_unshared_bytes(const mr_plan *p);
/* Runs kernels [first, last) only (first <= last <= mr_plan_num_kernels): how a trainer times
 * the forward (the kernels before the first backward node) apart from the backward. */
mr_status mr_plan_run_range(mr_plan *p, int32_t first, int32_t last) MR_WUR;
/* Number of kernels one run launches. */
int32_t mr_plan_num_kernels(const mr_plan *p);
/* The number of kernels after which bound memory [data, data + bytes) holds its final values for
 * a run: one past the last kernel that writes into it (0: none does). For overlapping work with
 * the rest of a run, e.g. all-reducing a gradient bucket while the backward goes on. */
int32_t mr_plan_ready_after(const mr_plan *p, const void *data, size_t bytes);
/* New dropout masks for a new step without recompiling: every dropout node (and its backward,
 * which recomputes the same mask) draws from Philox blocks offset by step * 2^32 from those it
 * was built with. Step 0 gives the built masks. */
void mr_plan_set_dropout_step(mr_plan *p, uint64_t step);
/* Non-zero when the plan has dropout nodes (their arguments change every step). */
int mr_plan_has_dropout(const mr_plan *p);
/* CUDA plans on a stream: with on, each kernel range run (mr_plan_run: every kernel, or
 * mr_plan_run_range) is captured into a CUDA graph the first time and replayed after that, up to
 * 64 distinct ranges per plan (the later ones run kernel by kernel); rebinding anything
 * recaptures. Profiling and tracing run kernel by kernel; a capture that fails (a library call
 * that may not be captured) is logged and the plan goes on kernel by kernel. Errors:
 * MR_ERR_UNSUPPORTED for a CPU plan or a plan with dropout (its per-step masks would be frozen). */
mr_status mr_plan_set_graphs(mr_plan *p, int on) MR_WUR;
/* How many ranges were captured (in a steady training loop: 1, or the number of gradient-bucket
 * ranges; more means rebinding). */
int64_t mr_plan_captures(const mr_plan *p);
/* Times every kernel of later runs, summed per op (on a GPU each kernel is synchronised, which
 * slows the run: for finding where time goes, not for production). Turning it on clears the
 * counts. mr_plan_profile_report prints ms, calls and share per op, slowest first. */
void mr_plan_set_profile(mr_plan *p, int on);
void mr_plan_profile_report(const mr_plan *p, FILE *out);
/* Records a span per kernel of later runs on trace track k (core/trace.h; NULL: none) while its
 * window is open: the op's name, arg node (the kernel's index in the plan). Outside the window a
 * run costs one check more; inside, two clock reads per kernel, and on a GPU each kernel is
 * synchronised (as profiling does) and full runs are not replayed from a CUDA graph, so the span
 * times the kernel, not its launch. Runs must be on the thread that writes k. */
void mr_plan_set_trace(mr_plan *p, struct mr_trace_track *k);

#ifdef __cplusplus
}
#endif
#endif
