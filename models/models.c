/* MLP, CNN and GPT-2 graphs (see models.h). */
#include "models/models.h"
#include "autodiff/steps.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mr_model_cfg mr_model_cfg_default(mr_model_type type) {
    mr_model_cfg c;
    memset(&c, 0, sizeof c);
    c.type = type;
    c.sizes[0] = 784;
    c.sizes[1] = 1024;
    c.sizes[2] = 1024;
    c.sizes[3] = 10;
    c.n_sizes = 4;
    c.in_channels = 1;
    c.height = c.width = 28;
    c.ch1 = 32;
    c.ch2 = 64;
    c.hidden = 128;
    c.classes = 10;
    c.vocab = 65;
    c.context = 128;
    c.layers = 4;
    c.heads = 4;
    c.embd = 128;
    c.dropout = 0.0;
    return c;
}

const char *mr_model_type_name(mr_model_type t) {
    static const char *const names[] = {"mlp", "cnn", "gpt", "graph"};
    return (int)t >= 0 && (int)t < 4 ? names[t] : "?";
}

mr_task mr_model_task(const mr_model_cfg *c) {
    if (c->type == MR_MODEL_GPT || (c->type == MR_MODEL_GRAPH && c->graph.tokens)) return MR_TASK_LM;
    return MR_TASK_CLASSIFY;
}

mr_shape mr_model_sample_shape(const mr_model_cfg *c) {
    switch (c->type) {
    case MR_MODEL_MLP: return mr_shape_1d(c->sizes[0]);
    case MR_MODEL_CNN: return mr_shape_3d(c->in_channels, c->height, c->width);
    case MR_MODEL_GPT: return mr_shape_1d(c->context);
    case MR_MODEL_GRAPH: break;
    }
    if (c->graph.tokens) return mr_shape_1d(c->context);
    return mr_shape_make(c->graph.n_input, c->graph.input);
}

mr_dtype mr_model_input_dtype(const mr_model_cfg *c) { return mr_model_task(c) == MR_TASK_LM ? MR_I32 : MR_F32; }

/* "[1, 28, 28]", as the config writes shapes. */
static const char *dims(const mr_shape *s, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "[");
    for (int i = 0; i < s->ndim && n < (int)cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%lld", i ? ", " : "", (long long)s->dim[i]);
    if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, "]");
    return buf;
}

mr_status mr_model_fit_data(mr_model_cfg *c, mr_shape sample, int64_t vocab) {
    if (mr_model_task(c) == MR_TASK_LM) {
        if (vocab > 0) c->vocab = vocab;
        return MR_OK;
    }
    const int64_t n = mr_shape_numel(&sample);
    char b1[128], b2[128];
    switch (c->type) {
    case MR_MODEL_MLP:
        if (c->sizes[0] != n)
            return mr_set_error(MR_ERR_INVALID, "model.sizes[0]: %lld inputs, but the data's samples have %lld values "
                                "(shape %s); HINT: model.sizes: [%lld, ...]", (long long)c->sizes[0], (long long)n,
                                dims(&sample, b1, sizeof b1), (long long)n);
        return MR_OK;
    case MR_MODEL_CNN:
        if (sample.ndim == 2) sample = mr_shape_3d(1, sample.dim[0], sample.dim[1]);
        if (sample.ndim != 3)
            return mr_set_error(MR_ERR_INVALID, "model.type cnn: needs images, the data gives samples of shape %s",
                                dims(&sample, b1, sizeof b1));
        if (c->in_channels != sample.dim[0] || c->height != sample.dim[1] || c->width != sample.dim[2]) {
            mr_shape want = mr_model_sample_shape(c);
            return mr_set_error(MR_ERR_INVALID, "model.input: %s, but the data's images are %s; HINT: model.input: %s",
                                dims(&want, b1, sizeof b1), dims(&sample, b2, sizeof b2), b2);
        }
        return MR_OK;
    default: {
        mr_shape want = mr_model_sample_shape(c);
        if (mr_shape_numel(&want) != n)
            return mr_set_error(MR_ERR_INVALID, "model.input: %s does not fit the data's samples of shape %s; HINT: "
                                "model.input: %s (or any shape of %lld elements)", dims(&want, b1, sizeof b1),
                                dims(&sample, b2, sizeof b2), b2, (long long)n);
        return MR_OK;
    }
    }
}

static mr_status check_cfg(const mr_model_cfg *c, int64_t batch) {
    if (batch <= 0) return mr_set_error(MR_ERR_INVALID, "model: batch must be positive, got %lld", (long long)batch);
    switch (c->type) {
    case MR_MODEL_MLP:
        if (c->n_sizes < 2 || c->n_sizes > MR_MLP_MAX_LAYERS + 1)
            return mr_set_error(MR_ERR_INVALID, "model.sizes: an mlp needs 2 to %d sizes, got %d", MR_MLP_MAX_LAYERS + 1,
                                c->n_sizes);
        for (int i = 0; i < c->n_sizes; i++)
            if (c->sizes[i] <= 0) return mr_set_error(MR_ERR_INVALID, "model.sizes[%d] must be positive", i);
        return MR_OK;
    case MR_MODEL_CNN:
        if (c->in_channels <= 0 || c->height < 4 || c->width < 4 || c->ch1 <= 0 || c->ch2 <= 0 || c->hidden <= 0 ||
            c->classes <= 0)
            return mr_set_error(MR_ERR_INVALID, "model: a cnn needs positive channels, hidden and classes and an "
                                                "input of at least 4x4");
        return MR_OK;
    case MR_MODEL_GPT:
        if (c->vocab <= 0 || c->context <= 0 || c->layers <= 0 || c->heads <= 0 || c->embd <= 0)
            return mr_set_error(MR_ERR_INVALID, "model: a gpt needs positive vocab, context, layers, heads and embd");
        if (c->embd % c->heads)
            return mr_set_error(MR_ERR_INVALID, "model.embd %lld is not divisible by model.heads %lld",
                                (long long)c->embd, (long long)c->heads);
        if (c->dropout < 0 || c->dropout >= 1)
            return mr_set_error(MR_ERR_INVALID, "model.dropout %g is outside [0, 1)", c->dropout);
        return MR_OK;
    case MR_MODEL_GRAPH:
        if (c->graph.tokens && (c->context <= 0 || c->vocab <= 0))
            return mr_set_error(MR_ERR_INVALID, "model: a language model (model.input: tokens) needs positive "
                                                "model.context and model.vocab");
        return MR_OK;
    }
    return mr_set_error(MR_ERR_INVALID, "model: unknown type %d", (int)c->type);
}

/* ---- the shorthands, as layer graphs ---------------------------------------------------------- */

static mr_layer *put(mr_layer_graph *g, int32_t at, int kind, const char *name) {
    mr_layer *l = &g->l[at];
    *l = mr_layer_default(kind);
    if (name) snprintf(l->name, sizeof l->name, "%s", name);
    return l;
}

/* fc1, fc2, ... with ReLU between. */
static void expand_mlp(const mr_model_cfg *c, mr_layer_graph *g) {
    g->n_input = 1;
    g->input[0] = c->sizes[0];
    const int n = 2 * (c->n_sizes - 1) - 1;
    g->top = mr_layers_reserve(g, n);
    g->n_top = n;
    for (int i = 1, at = g->top; i < c->n_sizes; i++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", i);
        put(g, at++, MR_LAYER_LINEAR, name)->out = c->sizes[i];
        if (i < c->n_sizes - 1) put(g, at++, MR_LAYER_RELU, NULL);
    }
}

static void expand_cnn(const mr_model_cfg *c, mr_layer_graph *g) {
    g->n_input = 3;
    g->input[0] = c->in_channels;
    g->input[1] = c->height;
    g->input[2] = c->width;
    g->top = mr_layers_reserve(g, 10);
    g->n_top = 10;
    int at = g->top;
    mr_layer *l = put(g, at++, MR_LAYER_CONV2D, "conv1");
    l->out = c->ch1, l->kernel = 3, l->pad = 1;
    put(g, at++, MR_LAYER_RELU, NULL);
    put(g, at++, MR_LAYER_MAXPOOL2D, NULL)->kernel = 2;
    l = put(g, at++, MR_LAYER_CONV2D, "conv2");
    l->out = c->ch2, l->kernel = 3, l->pad = 1;
    put(g, at++, MR_LAYER_RELU, NULL);
    put(g, at++, MR_LAYER_MAXPOOL2D, NULL)->kernel = 2;
    put(g, at++, MR_LAYER_FLATTEN, NULL);
    put(g, at++, MR_LAYER_LINEAR, "fc1")->out = c->hidden;
    put(g, at++, MR_LAYER_RELU, NULL);
    put(g, at++, MR_LAYER_LINEAR, "fc2")->out = c->classes;
}

/* nanoGPT: wte + wpe, dropout, blocks h.N, ln_f, the head tied to wte. Its initialisation:
 * N(0, 0.02^2) weights and embeddings, zero biases, residual projections scaled by
 * 1/sqrt(2 * layers) (models/layers.c layer_transformer). */
static void expand_gpt(const mr_model_cfg *c, mr_layer_graph *g) {
    g->tokens = 1;
    g->top = mr_layers_reserve(g, 6);
    g->n_top = 6;
    const int32_t block = mr_layers_reserve(g, 1);
    int at = g->top;
    mr_layer *l = put(g, at++, MR_LAYER_EMBEDDING, "wte");
    l->vocab = c->vocab, l->dim = c->embd, l->std = 0.02;
    l = put(g, at++, MR_LAYER_POS_EMBEDDING, "wpe");
    l->context = c->context, l->dim = c->embd, l->std = 0.02;
    put(g, at++, MR_LAYER_DROPOUT, NULL)->p = c->dropout;
    l = put(g, at++, MR_LAYER_REPEAT, "h");
    l->times = c->layers, l->body = block, l->n_body = 1;
    l = put(g, block, MR_LAYER_TRANSFORMER, NULL);
    l->heads = c->heads, l->p = c->dropout;
    put(g, at++, MR_LAYER_LAYERNORM, "ln_f");
    l = put(g, at++, MR_LAYER_LINEAR, "lm_head");
    l->bias = 0;
    snprintf(l->tied, sizeof l->tied, "wte.weight");
}

mr_status mr_model_layers(const mr_model_cfg *c, mr_layer_graph *out) {
    mr_status st = check_cfg(c, 1);
    if (st != MR_OK) return st;
    if (c->type == MR_MODEL_GRAPH) {
        *out = c->graph;
        return MR_OK;
    }
    memset(out, 0, sizeof *out);
    switch (c->type) {
    case MR_MODEL_MLP: expand_mlp(c, out); break;
    case MR_MODEL_CNN: expand_cnn(c, out); break;
    default: expand_gpt(c, out); break;
    }
    return MR_OK;
}

int mr_model_uses_sync(const mr_model_cfg *c) {
    if (c->type != MR_MODEL_GRAPH) return 0;
    for (int32_t i = 0; i < c->graph.n; i++)
        if ((c->graph.l[i].kind == MR_LAYER_BATCHNORM1D || c->graph.l[i].kind == MR_LAYER_BATCHNORM2D) && c->graph.l[i].sync)
            return 1;
    return 0;
}

mr_status mr_model_build(mr_nn *nn, const mr_model_cfg *cfg, int64_t batch, mr_model_io *io) {
    memset(io, 0, sizeof *io);
    mr_status st = check_cfg(cfg, batch);
    if (st != MR_OK) return st;
    mr_layer_graph *lg = malloc(sizeof *lg);
    if (!lg) return mr_set_error(MR_ERR_NOMEM, "model: out of memory");
    st = mr_model_layers(cfg, lg);
    if (st != MR_OK) {
        free(lg);
        return st;
    }
    const mr_layers_ctx ctx = {cfg->vocab, cfg->context};
    mr_graph *g = nn->g;
    mr_shape xs = mr_model_sample_shape(cfg);
    int64_t dims[MR_MAX_DIMS] = {batch};
    for (int i = 0; i < xs.ndim; i++) dims[i + 1] = xs.dim[i];
    const int lm = mr_model_task(cfg) == MR_TASK_LM;
    io->x = mr_graph_input(g, "x", lm ? MR_I32 : nn->dtype, mr_shape_make(xs.ndim + 1, dims));
    mr_val logits = mr_layers_build(nn, lg, &ctx, io->x);
    free(lg);
    if (lm) {
        mr_shape ls = mr_graph_shape(g, logits);
        const int64_t v = ls.ndim ? ls.dim[ls.ndim - 1] : 1;
        io->logits = mr_graph_reshape(g, logits, mr_shape_2d(mr_shape_numel(&ls) / v, v));
        io->y = mr_graph_input(g, "y", MR_I32, mr_shape_2d(batch, cfg->context));
        io->loss = mr_nn_xent_mean(nn, io->logits, mr_graph_reshape(g, io->y, mr_shape_1d(batch * cfg->context)));
    } else {
        io->logits = logits;
        io->y = mr_graph_input(g, "y", MR_I32, mr_shape_1d(batch));
        io->loss = mr_nn_xent_mean(nn, io->logits, io->y);
    }
    st = mr_graph_status(g);
    if (st != MR_OK) mr_set_error(st, "%s", mr_graph_error(g));
    return st;
}

mr_status mr_model_step_build(const void *cfg, mr_nn *nn, int64_t batch, mr_step_io *io) {
    mr_model_io m;
    mr_status st = mr_model_build(nn, cfg, batch, &m);
    if (st != MR_OK) return st;
    io->x = m.x;
    io->y = m.y;
    io->out = m.logits;
    io->loss = m.loss;
    return MR_OK;
}

/* ---- summary ------------------------------------------------------------------------------------ */

static void bytes_str(double b, char *buf, size_t cap) {
    if (b >= 1073741824.0) snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
    else if (b >= 1048576.0) snprintf(buf, cap, "%.2f MiB", b / 1048576.0);
    else snprintf(buf, cap, "%.1f KiB", b / 1024.0);
}

mr_status mr_model_summary(const mr_model_cfg *c, int64_t batch, mr_dtype compute, int optimizer_slots, FILE *out) {
    mr_status st = MR_OK;
    mr_layer_graph *lg = malloc(sizeof *lg);
    mr_params *ps = NULL;
    mr_steps *steps = NULL;
    MR_CHECK(lg != NULL, MR_ERR_NOMEM, "summary: out of memory");
    MR_TRY(mr_model_layers(c, lg));
    fprintf(out, "model: %s, %s\n", mr_model_type_name(c->type),
            mr_model_task(c) == MR_TASK_LM ? "language model" : "classifier");
    const mr_layers_ctx ctx = {c->vocab, c->context};
    const int64_t total = mr_layers_summary(lg, &ctx, out);
    MR_CHECK(total >= 0, MR_ERR_INVALID, "%s", mr_last_error());
    /* one training step as the trainer compiles it, on the CPU planner */
    MR_TRY(mr_params_new(&ps));
    MR_TRY(mr_steps_new(mr_model_step_build, c, ps, MR_DEVICE_CPU, &steps));
    mr_steps_set_compute(steps, compute);
    mr_step *step = NULL;
    MR_TRY(mr_steps_get(steps, batch, 1, &step));
    const int64_t nbuf = mr_params_total(mr_params_bufs(ps));
    char act[32], par[32], opt[32], buf[32];
    bytes_str((double)mr_plan_arena_bytes(step->plan), act, sizeof act);
    bytes_str(4.0 * (double)total, par, sizeof par);
    bytes_str(4.0 * (double)total * optimizer_slots, opt, sizeof opt);
    bytes_str(4.0 * (double)nbuf, buf, sizeof buf);
    fprintf(out, "  parameters %lld (%s f32, gradients the same, optimizer state %s), buffers %lld (%s)\n",
            (long long)total, par, opt, (long long)nbuf, buf);
    fprintf(out, "  one training step of batch %lld in %s: %s of activations (planned, shared by liveness), "
            "%d kernels\n", (long long)batch, mr_dtype_name(compute == MR_F32 ? MR_F32 : compute), act,
            mr_plan_num_kernels(step->plan));
fail:
    mr_steps_free(steps);
    mr_params_free(ps);
    free(lg);
    return st;
}
