/* Layer graphs: a model described as data (model.type: graph in an experiment's YAML; the mlp,
 * cnn and gpt shorthands expand to one, models/models.c), checked and built into an autodiff
 * graph (docs/DESIGN.md "Models").
 *
 * A spec is a tree of layers kept in one flat, fixed-size array so that it copies by value with
 * the config that holds it: a sequence of layers is a contiguous run of entries; a residual or
 * a repeat points at the runs of its body (and shortcut). Every layer remembers where the YAML
 * gave it (line, column), so a shape that does not fit is reported at the user's line.
 *
 * Names follow PyTorch's nn.Sequential, so a state_dict of the equivalent torch module maps 1:1:
 * layer i of a sequence is "i." (or "<name>." when it has a name); a residual's body is
 * "body.j." and its shortcut "shortcut.j."; repeat r of a body is "r." when the body is one
 * layer (a ModuleList of blocks: "h.0.ln_1.weight") and "r.j." otherwise (a Sequential each). */
#ifndef MR_LAYERS_H
#define MR_LAYERS_H

#include <stddef.h>
#include <stdint.h>
#include "autodiff/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_layer_kind {
    MR_LAYER_LINEAR = 0,    /* out, bias (1), tied ("wte.weight": the weight of an earlier layer, [out, in]) */
    MR_LAYER_CONV2D,        /* out, kernel, stride (1), pad (0), bias (1) */
    MR_LAYER_BATCHNORM1D,   /* momentum (0.1), eps (1e-5), affine (1), sync (0): (N, C) or (N, C, L) */
    MR_LAYER_BATCHNORM2D,   /* the same over (N, C, H, W) */
    MR_LAYER_LAYERNORM,     /* over the last dim; eps (1e-5) */
    MR_LAYER_EMBEDDING,     /* vocab (model.vocab when 0), dim, std (1: nn.Embedding's N(0, 1)) */
    MR_LAYER_POS_EMBEDDING, /* x (T, C) per sample plus a learned [context, dim] table (std 0.02) */
    MR_LAYER_DROPOUT,       /* p */
    MR_LAYER_RELU, MR_LAYER_GELU, MR_LAYER_SILU, MR_LAYER_TANH, MR_LAYER_SIGMOID,
    MR_LAYER_MAXPOOL2D,     /* kernel, stride (kernel), pad (0) */
    MR_LAYER_AVGPOOL2D,     /* kernel, stride (kernel), pad (0); padding counts (count_include_pad) */
    MR_LAYER_GLOBAL_AVGPOOL, /* (C, H, W) -> (C, 1, 1), nn.AdaptiveAvgPool2d(1) */
    MR_LAYER_FLATTEN,       /* (...) -> (numel) per sample, torch.flatten(x, 1) */
    MR_LAYER_RESHAPE,       /* shape (per sample) */
    MR_LAYER_RESIDUAL,      /* y = body(x) + shortcut(x); identity shortcut when it has none */
    MR_LAYER_REPEAT,        /* times, body */
    MR_LAYER_TRANSFORMER,   /* heads, mlp (4: width ratio), dropout p (0): GPT-2's pre-LN block */
    MR_LAYER_KIND_COUNT
} mr_layer_kind;

#define MR_LAYERS_MAX 256
#define MR_LAYER_NAME_MAX 48

typedef struct mr_layer {
    int kind;                         /* mr_layer_kind */
    char name[MR_LAYER_NAME_MAX];     /* "" : named by position */
    int64_t out, kernel, stride, pad; /* linear/conv2d out; conv/pool geometry */
    int64_t vocab, dim, context;      /* embedding, pos_embedding */
    int64_t heads, mlp, times;        /* transformer; repeat */
    int bias, affine, sync;           /* 1/0 flags */
    double p, eps, momentum, std;     /* dropout; norms; embedding init */
    int64_t shape[4];                 /* reshape: the per-sample shape */
    int n_shape;
    char tied[96];                    /* linear: a parameter to use as the weight */
    int32_t body, n_body;             /* residual, repeat: the body's run of entries */
    int32_t shortcut, n_shortcut;     /* residual: the shortcut's run (n_shortcut 0: identity) */
    int line, col;                    /* where the config gave it (0: not from a file) */
} mr_layer;

typedef struct mr_layer_graph {
    int32_t n;                   /* entries used */
    int32_t top, n_top;          /* the model's run of layers */
    int64_t input[4];            /* one sample's shape (the batch dim is added) */
    int n_input;                 /* 0 with tokens */
    int tokens;                  /* the input is model.context token ids (a language model) */
    mr_layer l[MR_LAYERS_MAX];
} mr_layer_graph;

/* The layer's YAML name ("conv2d", "global_avgpool") and the kind for a name (-1: unknown). */
const char *mr_layer_kind_name(int kind);
int mr_layer_kind_find(const char *name);
/* A layer of `kind` with every default set (bias 1, momentum 0.1, eps 1e-5, ...). */
mr_layer mr_layer_default(int kind);
/* Appends n default entries, returning the index of the first; -1 when the spec is full. */
int32_t mr_layers_reserve(mr_layer_graph *g, int32_t n);

/* Options of one build. */
typedef struct mr_layers_ctx {
    int64_t vocab;   /* model.vocab: embedding.vocab and linear.out 0 mean it */
    int64_t context; /* model.context: the token window of a language model */
} mr_layers_ctx;

/* Checks the spec: every layer's arguments and every shape, walking a sample through it, and for
 * a language model that the output is one vocab-sized row per token, for a classifier a vector
 * per sample. MR_ERR_INVALID with a message naming the layer by its path and kind
 * ("layers[4] linear: expects 1-d input per sample, got [16, 7, 7]; HINT: add flatten"); *bad gets
 * the failing entry's index (-1 when the fault is not one layer's) so the caller can add its
 * file:line:column. */
mr_status mr_layers_check(const mr_layer_graph *g, const mr_layers_ctx *ctx, int32_t *bad) MR_WUR;

/* Builds the layers on x (batch B) into nn: the output value (the logits), or MR_VAL_NONE with
 * the graph's error set (the same messages as mr_layers_check). */
mr_val mr_layers_build(mr_nn *nn, const mr_layer_graph *g, const mr_layers_ctx *ctx, mr_val x);

/* One line per layer (path, kind, output shape per sample, parameter count) walking a sample
 * through the spec: the body of `mirror summary`. Returns the total parameter count, -1 on an
 * error (the mr_layers_check message). */
int64_t mr_layers_summary(const mr_layer_graph *g, const mr_layers_ctx *ctx, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
