/* The built-in models, built from autodiff/nn layers with PyTorch's parameter names and layouts
 * (a state_dict maps 1:1 by name; see the README's parameter table):
 *   mlp  fc1, fc2, ... (Linear; ReLU between)
 *   cnn  conv1, conv2 (3x3, pad 1, ReLU, 2x2 max-pool each), fc1 (ReLU), fc2
 *   gpt  GPT-2 (nanoGPT names without "transformer."): wte, wpe, h.N.ln_1, h.N.attn.c_attn,
 *        h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc, h.N.mlp.c_proj, ln_f; the output head is tied
 *        to wte. Pre-LayerNorm, causal attention, GELU (tanh) MLP of width 4C. */
#ifndef MR_MODELS_H
#define MR_MODELS_H

#include "autodiff/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_model_type { MR_MODEL_MLP = 0, MR_MODEL_CNN = 1, MR_MODEL_GPT = 2 } mr_model_type;

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
} mr_model_cfg;

/* The reference workloads' shapes: MLP 784-1024-1024-10; CNN 1x28x28, channels 32 and 64, fc 128,
 * 10 classes; GPT vocab 65, context 128, 4 layers, 4 heads, width 128, no dropout. */
mr_model_cfg mr_model_cfg_default(mr_model_type type);

typedef struct mr_model_io {
    mr_val x;      /* mlp (B, in) f32 / cnn (B, C, H, W) f32 / gpt (B, T) i32 token ids: input "x" */
    mr_val y;      /* labels "y": (B) i32; gpt (B, T) i32 next tokens */
    mr_val logits; /* (B, classes); gpt (B*T, vocab) */
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
