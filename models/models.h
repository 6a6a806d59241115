/* The models: a layer graph (models/layers.h, model.type graph) or one of the built-in
 * shorthands, which expand to layer graphs, built from autodiff/nn layers with PyTorch's parameter names and layouts
 * (a state_dict maps 1:1 by name; see the README's parameter table):
 *   mlp  fc1, fc2, ... (Linear; ReLU between)
 *   cnn  conv1, conv2 (3x3, pad 1, ReLU, 2x2 max-pool each), fc1 (ReLU), fc2
 *   gpt  GPT-2 (nanoGPT names without "transformer."): wte, wpe, h.N.ln_1, h.N.attn.c_attn,
 *        h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc, h.N.mlp.c_proj, ln_f; the output head is tied
 *        to wte. Pre-LayerNorm, causal attention, GELU (tanh) MLP of width 4C. */
#ifndef MR_MODELS_H
#define MR_MODELS_H

#include "autodiff/nn.h"
#include "models/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_model_type { MR_MODEL_MLP = 0, MR_MODEL_CNN = 1, MR_MODEL_GPT = 2, MR_MODEL_GRAPH = 3 } mr_model_type;

/* What a model is trained for, which says what the data feeds and how it is scored. */
typedef enum mr_task {
    MR_TASK_CLASSIFY = 0, /* x: f32 samples (features or images), y: i32 class labels; loss, accuracy */
    MR_TASK_LM = 1        /* x: i32 windows of `context` tokens, y: the next tokens; loss, perplexity, samples */
} mr_task;

#define MR_MLP_MAX_LAYERS 8

typedef struct mr_model_cfg {
    mr_model_type type;
    /* mlp: sizes[0] inputs, sizes[1..n-2] hidden, sizes[n-1] classes */
    int64_t sizes[MR_MLP_MAX_LAYERS + 1];
    int n_sizes;
    /* cnn: input (in_channels, height, width), conv channels, fc width, classes */
    int64_t in_channels, height, width, ch1, ch2, hidden, classes;
    /* gpt */
    int64_t vocab, context, layers, heads, embd;
    double dropout;
    /* graph: the layers (model.layers) and the sample shape (model.input: a list, or tokens) */
    mr_layer_graph graph;
} mr_model_cfg;

const char *mr_model_type_name(mr_model_type t); /* "mlp", "cnn", "gpt", "graph" */
mr_task mr_model_task(const mr_model_cfg *c);
/* The shape of one sample of input "x" (the batch dim is added) and its dtype: f32 (D) for an
 * mlp, (C, H, W) for a cnn, the graph's input; i32 (context) for a language model. */
mr_shape mr_model_sample_shape(const mr_model_cfg *c);
mr_dtype mr_model_input_dtype(const mr_model_cfg *c);
/* Fits the model to its data: a classifier's samples of shape `sample` must be what the model
 * takes (an mlp's model.sizes[0] values; a cnn's model.input (C, H, W), an (H, W) image being
 * (1, H, W); a graph's model.input, any shape of as many elements), else MR_ERR_INVALID naming
 * the key with a HINT giving the data's shape; a language model's vocabulary (vocab > 0 replaces
 * model.vocab: a text's characters). */
mr_status mr_model_fit_data(mr_model_cfg *c, mr_shape sample, int64_t vocab) MR_WUR;
/* Non-zero when the model has a batch norm with sync: true (its statistics summed over the replicas:
 * the trainer gives its steps the replicas' hook, autodiff/steps.h mr_steps_set_sync). */
int mr_model_uses_sync(const mr_model_cfg *c);
/* The layer graph a model is: the graph itself, or the shorthand's expansion (same parameter
 * names as ever, so older checkpoints load). MR_ERR_INVALID for a bad shorthand config. */
mr_status mr_model_layers(const mr_model_cfg *c, mr_layer_graph *out) MR_WUR;
/* `mirror summary` (and the start of `mirror train`): each layer's name, kind, output shape and
 * parameter count; the totals; and from the planner the activation memory of one training step
 * for `batch` samples (a replica's micro-batch) in `compute`, with the parameter, gradient and
 * optimizer-state bytes (optimizer_slots f32 values per parameter: 2 for Adam). MR_ERR_INVALID as
 * mr_model_build. */
mr_status mr_model_summary(const mr_model_cfg *c, int64_t batch, mr_dtype compute, int optimizer_slots,
                           FILE *out) MR_WUR;

/* The reference workloads' shapes: MLP 784-1024-1024-10; CNN 1x28x28, channels 32 and 64, fc 128,
 * 10 classes; GPT vocab 65, context 128, 4 layers, 4 heads, width 128, no dropout. */
mr_model_cfg mr_model_cfg_default(mr_model_type type);

typedef struct mr_model_io {
    mr_val x;      /* "x": classify (B, sample...) f32; language model (B, T) i32 token ids */
    mr_val y;      /* labels "y": (B) i32; language model (B, T) i32 next tokens */
    mr_val logits; /* (B, classes); language model (B*T, vocab) */
    mr_val loss;   /* mean cross-entropy, shape (1) */
} mr_model_io;

/* Builds the model's forward and loss for `batch` samples (gpt: batch sequences of cfg->context
 * tokens) into nn's graph, registering parameters on first use. MR_ERR_INVALID for a bad config
 * (the message names the field) or the graph's build error. */
mr_status mr_model_build(mr_nn *nn, const mr_model_cfg *cfg, int64_t batch, mr_model_io *io) MR_WUR;

/* An mr_step_build_fn (autodiff/steps.h) for a model: ctx is the mr_model_cfg. */
struct mr_step_io;
mr_status mr_model_step_build(const void *cfg, mr_nn *nn, int64_t batch, struct mr_step_io *io) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
