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
    }
    return mr_set_error(MR_ERR_INVALID, "model: unknown type %d", (int)c->type);
}

static void build_mlp(mr_nn *nn, const mr_model_cfg *c, int64_t B, mr_model_io *io) {
    io->x = mr_graph_input(nn->g, "x", nn->dtype, mr_shape_2d(B, c->sizes[0]));
    mr_val h = io->x;
    for (int i = 1; i < c->n_sizes; i++) {
        char name[32];
        snprintf(name, sizeof name, "fc%d", i);
        h = mr_nn_linear(nn, name, h, c->sizes[i], 1);
        if (i < c->n_sizes - 1) h = mr_graph_unary(nn->g, MR_OP_RELU, h);
    }
    io->logits = h;
    io->y = mr_graph_input(nn->g, "y", MR_I32, mr_shape_1d(B));
}

static void build_cnn(mr_nn *nn, const mr_model_cfg *c, int64_t B, mr_model_io *io) {
    mr_graph *g = nn->g;
    io->x = mr_graph_input(g, "x", nn->dtype, mr_shape_4d(B, c->in_channels, c->height, c->width));
    mr_val h = mr_graph_unary(g, MR_OP_RELU, mr_nn_conv2d(nn, "conv1", io->x, c->ch1, 3, 1, 1));
    h = mr_graph_maxpool2d(g, h, 2, 2, 0);
    h = mr_graph_unary(g, MR_OP_RELU, mr_nn_conv2d(nn, "conv2", h, c->ch2, 3, 1, 1));
    h = mr_graph_maxpool2d(g, h, 2, 2, 0);
    mr_shape s = mr_graph_shape(g, h);
    h = mr_graph_reshape(g, h, mr_shape_2d(B, mr_shape_numel(&s) / B)); /* flatten as torch.flatten(x, 1) */
    h = mr_graph_unary(g, MR_OP_RELU, mr_nn_linear(nn, "fc1", h, c->hidden, 1));
    io->logits = mr_nn_linear(nn, "fc2", h, c->classes, 1);
    io->y = mr_graph_input(g, "y", MR_I32, mr_shape_1d(B));
}

/* nanoGPT's initialisation: N(0, 0.02^2) weights and embeddings, zero biases, and the residual
 * projections scaled by 1/sqrt(2 * layers). */
static void build_gpt(mr_nn *nn, const mr_model_cfg *c, int64_t B, mr_model_io *io) {
    mr_graph *g = nn->g;
    const int64_t T = c->context, C = c->embd;
    const double std = 0.02, proj_std = 0.02 / sqrt(2.0 * (double)c->layers);
    io->x = mr_graph_input(g, "x", MR_I32, mr_shape_2d(B, T));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    if (!pos) {
        mr_graph_fail(g, MR_ERR_NOMEM, "gpt: out of memory");
        return;
    }
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t;
    mr_val posv = mr_graph_const(g, MR_I32, mr_shape_1d(T), pos);
    free(pos);
    mr_val tok = mr_nn_embedding(nn, "wte", io->x, c->vocab, C, std); /* (B,T,C) */
    mr_val pe = mr_nn_embedding(nn, "wpe", posv, T, C, std);           /* (T,C) */
    mr_val h = mr_nn_dropout(nn, mr_graph_add(g, tok, pe), c->dropout);
    char saved[sizeof nn->prefix];
    memcpy(saved, nn->prefix, sizeof saved);
    for (int64_t l = 0; l < c->layers; l++) {
        char pre[sizeof saved + 32];
        snprintf(pre, sizeof pre, "%sh.%lld.", saved, (long long)l);
        if (strlen(pre) >= sizeof nn->prefix) {
            mr_graph_fail(g, MR_ERR_INVALID, "gpt: name prefix '%s' is too long", pre);
            break;
        }
        memcpy(nn->prefix, pre, strlen(pre) + 1);
        mr_val a = mr_nn_causal_attention(nn, "attn", mr_nn_layernorm(nn, "ln_1", h), (int)c->heads);
        h = mr_graph_add(g, h, mr_nn_dropout(nn, a, c->dropout));
        mr_val m = mr_nn_linear_gelu_init(nn, "mlp.c_fc", mr_nn_layernorm(nn, "ln_2", h), 4 * C, MR_INIT_NORMAL, std,
                                          MR_INIT_ZEROS, 0);
        m = mr_nn_linear_init(nn, "mlp.c_proj", m, C, 1, MR_INIT_NORMAL, proj_std, MR_INIT_ZEROS, 0);
        h = mr_graph_add(g, h, mr_nn_dropout(nn, m, c->dropout));
    }
    memcpy(nn->prefix, saved, sizeof saved);
    h = mr_nn_layernorm(nn, "ln_f", h);
    h = mr_graph_reshape(g, h, mr_shape_2d(B * T, C));
    mr_val wte = mr_nn_param(nn, "wte.weight", mr_shape_2d(c->vocab, C), MR_INIT_NORMAL, std);
    io->logits = mr_graph_matmul(g, h, wte, 0, 1, 1.0); /* tied head: (B*T, vocab) */
    io->y = mr_graph_input(g, "y", MR_I32, mr_shape_2d(B, T));
}

mr_status mr_model_build(mr_nn *nn, const mr_model_cfg *cfg, int64_t batch, mr_model_io *io) {
    memset(io, 0, sizeof *io);
    mr_status st = check_cfg(cfg, batch);
    if (st != MR_OK) return st;
    switch (cfg->type) {
    case MR_MODEL_MLP: build_mlp(nn, cfg, batch, io); break;
    case MR_MODEL_CNN: build_cnn(nn, cfg, batch, io); break;
    case MR_MODEL_GPT: build_gpt(nn, cfg, batch, io); break;
    }
    mr_val labels = io->y;
    if (cfg->type == MR_MODEL_GPT) labels = mr_graph_reshape(nn->g, io->y, mr_shape_1d(batch * cfg->context));
    io->loss = mr_nn_xent_mean(nn, io->logits, labels);
    st = mr_graph_status(nn->g);
    if (st != MR_OK) mr_set_error(st, "%s", mr_graph_error(nn->g));
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
