/* Parameters and neural-network layers over the graph API.
 *
 * mr_params is a model's registry of named parameters. All values live in one contiguous f32
 * buffer and all gradients in another with the same layout (each parameter 64-byte aligned), so
 * a bucketed all-reduce is one call over a slice and an optimizer is one loop. Names and layouts
 * follow PyTorch (Linear weight [out, in], Conv2d weight [out, in, kh, kw]) so a state_dict maps
 * 1:1 by name.
 *
 * mr_nn is a builder context: a graph, a registry and a name prefix. Layers "get or create"
 * their parameters: the first graph built for a model registers them (in build order); later
 * graphs (another batch shape) find them by name and check the shape. Every parameter becomes a
 * graph param of the same name; using one twice (a tied output head) reuses the same value.
 * Building computes nothing; errors are the graph's sticky errors. */
#ifndef MR_NN_H
#define MR_NN_H

#include <stdint.h>
#include "autodiff/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_init_kind {
    MR_INIT_ZEROS = 0,
    MR_INIT_ONES = 1,
    MR_INIT_UNIFORM = 2, /* U(-arg, arg) */
    MR_INIT_NORMAL = 3,  /* N(0, arg^2) */
    MR_INIT_FAN_IN = 4   /* U(-1/sqrt(arg), 1/sqrt(arg)): PyTorch's Linear/Conv2d default, arg = fan_in */
} mr_init_kind;

typedef struct mr_params mr_params;

mr_status mr_params_new(mr_params **out) MR_WUR;
void mr_params_free(mr_params *ps); /* NULL is a no-op */
/* Registers a parameter (before mr_params_alloc). MR_ERR_INVALID on a duplicate name or after
 * allocation. *index (may be NULL) receives its index. */
mr_status mr_params_add(mr_params *ps, const char *name, mr_shape shape, mr_init_kind init, double arg,
                        int32_t *index) MR_WUR;
/* Allocates the value and gradient buffers (zeroed); registration ends. */
mr_status mr_params_alloc(mr_params *ps) MR_WUR;
int mr_params_allocated(const mr_params *ps);
/* Fills every parameter by its initializer. Parameter i draws from the Philox stream
 * (seed, i << 40), so adding a parameter never changes the others' values, for any thread count. */
mr_status mr_params_init(mr_params *ps, uint64_t seed) MR_WUR;

int32_t mr_params_count(const mr_params *ps);
int32_t mr_params_find(const mr_params *ps, const char *name); /* -1 if absent */
const char *mr_params_name(const mr_params *ps, int32_t i);
mr_shape mr_params_shape(const mr_params *ps, int32_t i);
int64_t mr_params_numel(const mr_params *ps, int32_t i);
/* Element offset of parameter i in the buffers. */
int64_t mr_params_offset(const mr_params *ps, int32_t i);
float *mr_params_data(const mr_params *ps, int32_t i); /* NULL before mr_params_alloc */
float *mr_params_grad(const mr_params *ps, int32_t i);
/* The whole buffers and their length in elements (padding included). */
float *mr_params_buffer(const mr_params *ps);
float *mr_params_grad_buffer(const mr_params *ps);
int64_t mr_params_buffer_numel(const mr_params *ps);
/* Sum of the parameters' element counts (no padding). */
int64_t mr_params_total(const mr_params *ps);
/* The model's buffers: state that is not trained (batch norm's running_mean, running_var and
 * num_batches_tracked, PyTorch's names), kept in a registry of their own inside ps so that the
 * optimizer, the gradient exchange and everything above that walks ps's parameters never sees
 * them. It is an mr_params like any other (names, shapes, offsets, one contiguous f32 value
 * buffer; its gradient buffer is unused), allocated and initialised with ps. Checkpoints hold it
 * under /buffers/ (checkpoint/ckpt.h). Never NULL for a registry made by mr_params_new. */
mr_params *mr_params_bufs(const mr_params *ps);

#define MR_NN_MAX_UPDATES 512

struct mr_hook;

typedef struct mr_nn {
    mr_graph *g;
    mr_params *ps;
    mr_dtype dtype;  /* dtype of parameters in the graph (f32; f64 for gradient checks) */
    mr_dtype compute; /* MR_BF16: linear layers multiply in bf16 (mixed_bfloat16); else as dtype */
    int training;    /* dropout active */
    mr_device_kind device; /* where the graph will run (MR_DEVICE_CPU when unset): picks the attention path */
    uint64_t dropout_seed, dropout_offset;
    char prefix[96]; /* "h.0." while building block 0 */
    /* Buffer updates recorded by mr_nn_buffer_update while building a training graph: after a
     * training run, buffer upd_buf[i] holds the value upd_val[i] (mr_steps binds both to the
     * buffer's memory; the update is the last thing that touches it in a run). */
    int n_updates;
    mr_val upd_buf[MR_NN_MAX_UPDATES], upd_val[MR_NN_MAX_UPDATES];
    /* When set, statistics of batch-normalisation layers are summed over the replicas through
     * this hook (autodiff/graph.h mr_graph_hook; NULL: each replica normalises its own batch). */
    const struct mr_hook *sync;
} mr_nn;

/* The graph param for registry parameter `name` (prefix added), creating the registry entry on
 * first use. MR_VAL_NONE with a graph error on a shape clash. */
mr_val mr_nn_param(mr_nn *nn, const char *name, mr_shape shape, mr_init_kind init, double arg);

/* A graph input for registry buffer `name` (prefix added), registering it in mr_params_bufs on
 * first use (initialised by `init`, MR_INIT_ZEROS or MR_INIT_ONES). mr_steps binds it to the
 * buffer's memory. */
mr_val mr_nn_buffer(mr_nn *nn, const char *name, mr_shape shape, mr_init_kind init);
/* Records that after a training run buffer value `buf` (from mr_nn_buffer) is to hold `value` (a
 * node output of buf's dtype and shape computed from it). Graph error beyond MR_NN_MAX_UPDATES. */
void mr_nn_buffer_update(mr_nn *nn, mr_val buf, mr_val value);

/* y = x W^T + b; x (..., in) -> (..., out); W "name.weight" [out, in], b "name.bias" [out]. */
mr_val mr_nn_linear(mr_nn *nn, const char *name, mr_val x, int64_t out, int bias);
/* The same with explicit initializers for the weight and the bias (GPT-2 uses N(0, 0.02^2) and
 * zeros). */
mr_val mr_nn_linear_init(mr_nn *nn, const char *name, mr_val x, int64_t out, int bias, mr_init_kind winit,
                         double warg, mr_init_kind binit, double barg);
/* gelu(x W^T + b), with bias and GELU fused into the GEMM's epilogue (GPT-2's mlp.c_fc). */
mr_val mr_nn_linear_gelu_init(mr_nn *nn, const char *name, mr_val x, int64_t out, mr_init_kind winit, double warg,
                              mr_init_kind binit, double barg);
/* NCHW conv, weight [out, in, k, k], bias [out] when `bias`. */
mr_val mr_nn_conv2d(mr_nn *nn, const char *name, mr_val x, int64_t out, int k, int stride, int pad, int bias);
/* relu(x): on the CPU fused into a convolution just made (mr_graph_relu_after_conv), elsewhere
 * an MR_OP_RELU node. */
mr_val mr_nn_relu(mr_nn *nn, mr_val x);
/* Batch normalisation over every dim but dim 1 (x (N, C), (N, C, L) or (N, C, H, W)), PyTorch's
 * BatchNorm1d/2d: "name.weight" (ones) and "name.bias" (zeros) [C] when `affine`, buffers
 * "name.running_mean" (zeros), "name.running_var" (ones) [C] and "name.num_batches_tracked" (a
 * scalar, 0). Training (nn->training): normalises by the batch's mean and biased variance and
 * updates the running estimates, r = (1 - momentum) r + momentum s with the unbiased variance;
 * with nn->sync set the statistics are those of the global batch over every replica. Evaluation:
 * normalises by the running estimates. Without nn->sync one MR_OP_BATCHNORM node (its mean and var
 * outputs feed the running estimates); with it, composed from the reduce and elementwise ops with
 * the hook summing each statistic over the replicas. */
mr_val mr_nn_batchnorm(mr_nn *nn, const char *name, mr_val x, double momentum, double eps, int affine);
/* LayerNorm over the last dim: weight (ones) and bias (zeros) [D], eps 1e-5. */
mr_val mr_nn_layernorm(mr_nn *nn, const char *name, mr_val x);
/* Embedding "name.weight" [vocab, dim] ~ N(0, std^2); ids i32 (...) -> (..., dim). */
mr_val mr_nn_embedding(mr_nn *nn, const char *name, mr_val ids, int64_t vocab, int64_t dim, double std);
/* Dropout with probability p when nn->training (each call takes its own mask stream). */
mr_val mr_nn_dropout(mr_nn *nn, mr_val x, double p);
/* Causal multi-head self-attention, GPT-2 layout: x (B,T,C) -> (B,T,C); "name.c_attn" Linear(C, 3C)
 * and "name.c_proj" Linear(C, C). Under mixed precision with a head dim cuDNN's fused attention
 * takes (mr_nn_attention_fused) the attention is one MR_OP_ATTENTION node on half casts of q, k, v;
 * otherwise (f32, f64, other head dims) the composed f32 path: a batched GEMM, the causal softmax
 * and a second GEMM, which keeps the (B,H,T,T) probabilities for the backward. */
mr_val mr_nn_causal_attention(mr_nn *nn, const char *name, mr_val x, int heads);
/* Non-zero when mr_nn_causal_attention uses the fused op: nn computes in bf16 or f16 over f32 values
 * and head_dim is a multiple of 8 up to 128 (the shapes cuDNN 9's fused attention takes on sm_80+,
 * docs/DESIGN.md "Attention"). The environment variable MIRROR_ATTENTION=fused (always, in the
 * model's dtype when it is not mixed) or =composed (never) overrides this; other values warn. */
int mr_nn_attention_fused(const mr_nn *nn, int64_t head_dim);
/* Mean softmax cross-entropy of logits (N,C) against labels (N) i32: a scalar (1). */
mr_val mr_nn_xent_mean(mr_nn *nn, mr_val logits, mr_val labels);

#ifdef __cplusplus
}
#endif
#endif
