/* Layer graphs: checking, building and summarising a spec (see layers.h). One walk does all three:
 * it checks each layer's arguments and input shape before it calls the autodiff/nn builders, so
 * a mistake is reported as the user's layer ("layers[4] linear: ...") rather than as an op's
 * shape clash, and mr_layers_check is a build on a scratch graph (building computes nothing). */
#include "models/layers.h"
#include "autodiff/graph_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAMES[MR_LAYER_KIND_COUNT] = {
    "linear", "conv2d", "batchnorm1d", "batchnorm2d", "layernorm", "embedding", "pos_embedding", "dropout",
    "relu", "gelu", "silu", "tanh", "sigmoid", "maxpool2d", "avgpool2d", "global_avgpool", "flatten", "reshape",
    "residual", "repeat", "transformer"};

const char *mr_layer_kind_name(int kind) {
    return kind >= 0 && kind < MR_LAYER_KIND_COUNT ? KIND_NAMES[kind] : "?";
}

int mr_layer_kind_find(const char *name) {
    for (int k = 0; k < MR_LAYER_KIND_COUNT; k++)
        if (!strcmp(KIND_NAMES[k], name)) return k;
    return -1;
}

mr_layer mr_layer_default(int kind) {
    mr_layer l;
    memset(&l, 0, sizeof l);
    l.kind = kind;
    l.stride = 0; /* pools: the kernel; conv2d: 1 (resolved when built) */
    l.bias = 1;
    l.affine = 1;
    l.eps = 1e-5;
    l.momentum = 0.1;
    l.std = kind == MR_LAYER_POS_EMBEDDING ? 0.02 : 1.0;
    l.mlp = 4;
    l.times = 1;
    return l;
}

int32_t mr_layers_reserve(mr_layer_graph *g, int32_t n) {
    if (n < 0 || g->n + n > MR_LAYERS_MAX) return -1;
    int32_t first = g->n;
    for (int32_t i = 0; i < n; i++) g->l[first + i] = mr_layer_default(MR_LAYER_RELU);
    g->n += n;
    return first;
}

/* ---- the walk --------------------------------------------------------------------------------- */

typedef struct walk {
    mr_nn *nn;
    const mr_layer_graph *g;
    const mr_layers_ctx *ctx;
    int64_t batch;
    double proj_std; /* GPT-2's residual projections: 0.02 / sqrt(2 * transformer blocks) */
    FILE *summary;   /* a line per layer when set */
    int32_t bad;     /* the entry that failed */
} walk;

static int failed(const walk *w) { return w->nn->g->err != MR_OK; }

/* Fails the build at entry `i`: "<path> <kind>: <message>". */
static mr_val fail(walk *w, int32_t i, const char *path, const char *fmt, ...) MR_PRINTF(4, 5);
static mr_val fail(walk *w, int32_t i, const char *path, const char *fmt, ...) {
    if (failed(w)) return MR_VAL_NONE;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    w->bad = i;
    mr_graph_fail(w->nn->g, MR_ERR_INVALID, "%s %s: %s", path, mr_layer_kind_name(w->g->l[i].kind), msg);
    return MR_VAL_NONE;
}

/* One sample's shape of x (the batch dim dropped), as "[16, 7, 7]". */
static mr_shape sample_of(const walk *w, mr_val x) {
    mr_shape s = mr_graph_shape(w->nn->g, x);
    mr_shape r = mr_shape_make(0, NULL);
    for (int i = 1; i < s.ndim; i++) r.dim[r.ndim++] = s.dim[i];
    return r;
}

static const char *dims_str(const mr_shape *s, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "[");
    for (int i = 0; i < s->ndim && n < (int)cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%lld", i ? ", " : "", (long long)s->dim[i]);
    if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, "]");
    return buf;
}

/* x with the per-sample shape s. */
static mr_val per_sample(walk *w, mr_val x, const mr_shape *s) {
    int64_t dims[MR_MAX_DIMS];
    dims[0] = w->batch;
    for (int i = 0; i < s->ndim; i++) dims[i + 1] = s->dim[i];
    return mr_graph_reshape(w->nn->g, x, mr_shape_make(s->ndim + 1, dims));
}

static mr_val run_seq(walk *w, int32_t first, int32_t n, mr_val x, const char *prefix, const char *path, int depth);
static mr_val run_layer(walk *w, int32_t i, mr_val x, const char *prefix, const char *comp, const char *path,
                        int depth);

/* Sets nn's prefix for the parameters of a layer under `prefix`. */
static int set_prefix(walk *w, int32_t i, const char *path, const char *prefix) {
    if (strlen(prefix) >= sizeof w->nn->prefix) {
        fail(w, i, path, "the parameter prefix '%s' is too long", prefix);
        return 0;
    }
    snprintf(w->nn->prefix, sizeof w->nn->prefix, "%s", prefix);
    return 1;
}

static int need_rank(walk *w, int32_t i, const char *path, mr_val x, int lo, int hi, const char *what,
                     const char *hint) {
    mr_shape s = sample_of(w, x);
    if (s.ndim >= lo && s.ndim <= hi) return 1;
    char b[128];
    fail(w, i, path, "expects %s per sample, got %s%s%s", what, dims_str(&s, b, sizeof b), hint ? "; HINT: " : "",
         hint ? hint : "");
    return 0;
}

static int need_pos(walk *w, int32_t i, const char *path, const char *arg, int64_t v) {
    if (v > 0) return 1;
    fail(w, i, path, "%s must be a positive integer, got %lld", arg, (long long)v);
    return 0;
}

/* Output size of a window op along one dim, or a failure when it does not fit. */
static int window_ok(walk *w, int32_t i, const char *path, int64_t in, int64_t k, int64_t stride, int64_t pad) {
    if (pad < 0 || stride <= 0) {
        fail(w, i, path, "stride must be >= 1 and pad >= 0, got stride %lld, pad %lld", (long long)stride,
             (long long)pad);
        return 0;
    }
    if (in + 2 * pad < k) {
        fail(w, i, path, "a %lldx%lld window does not fit an input of %lld (pad %lld); HINT: a smaller kernel or more "
                         "padding", (long long)k, (long long)k, (long long)in, (long long)pad);
        return 0;
    }
    return 1;
}

static mr_val layer_linear(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *comp, const char *path) {
    mr_graph *g = w->nn->g;
    const int tokens = w->g->tokens;
    if (!need_rank(w, i, path, x, 1, tokens ? 2 : 1, tokens ? "1-d or (T, C) input" : "1-d input", "add flatten"))
        return MR_VAL_NONE;
    mr_shape s = sample_of(w, x);
    const int64_t in = s.dim[s.ndim - 1];
    if (l->tied[0]) {
        int32_t k = mr_params_find(w->nn->ps, l->tied);
        if (k < 0) return fail(w, i, path, "tied: no earlier layer has a parameter '%s'", l->tied);
        mr_shape ws = mr_params_shape(w->nn->ps, k);
        const int64_t out = l->out ? l->out : ws.dim[0];
        if (ws.ndim != 2 || ws.dim[1] != in || ws.dim[0] != out) {
            char b[128];
            return fail(w, i, path, "tied: '%s' is %s but this layer maps %lld to %lld", l->tied,
                        dims_str(&ws, b, sizeof b), (long long)in, (long long)out);
        }
        if (l->bias) return fail(w, i, path, "a tied layer has no bias; HINT: bias: false");
        char saved[sizeof w->nn->prefix];
        memcpy(saved, w->nn->prefix, sizeof saved);
        w->nn->prefix[0] = '\0'; /* tied names are absolute */
        mr_val wt = mr_nn_param(w->nn, l->tied, ws, MR_INIT_NORMAL, 0.02);
        memcpy(w->nn->prefix, saved, sizeof saved);
        /* as rows: one GEMM over every token, then the sample shape back */
        mr_shape xs = mr_graph_shape(g, x);
        const int64_t rows = mr_shape_numel(&xs) / in;
        mr_val y = mr_graph_matmul(g, mr_graph_reshape(g, x, mr_shape_2d(rows, in)), wt, 0, 1, 1.0);
        s.dim[s.ndim - 1] = out;
        return per_sample(w, y, &s);
    }
    const int64_t out = l->out ? l->out : w->ctx->vocab;
    if (!need_pos(w, i, path, "out", out)) return MR_VAL_NONE;
    return mr_nn_linear(w->nn, comp, x, out, l->bias);
}

static mr_val layer_conv(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *comp, const char *path) {
    if (!need_rank(w, i, path, x, 3, 3, "(C, H, W) input", NULL)) return MR_VAL_NONE;
    if (!need_pos(w, i, path, "out", l->out) || !need_pos(w, i, path, "kernel", l->kernel)) return MR_VAL_NONE;
    mr_shape s = sample_of(w, x);
    const int64_t stride = l->stride ? l->stride : 1;
    if (!window_ok(w, i, path, s.dim[1], l->kernel, stride, l->pad) ||
        !window_ok(w, i, path, s.dim[2], l->kernel, stride, l->pad))
        return MR_VAL_NONE;
    return mr_nn_conv2d(w->nn, comp, x, l->out, (int)l->kernel, (int)stride, (int)l->pad, l->bias);
}

static mr_val layer_pool(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *path) {
    if (!need_rank(w, i, path, x, 3, 3, "(C, H, W) input", NULL)) return MR_VAL_NONE;
    if (!need_pos(w, i, path, "kernel", l->kernel)) return MR_VAL_NONE;
    mr_shape s = sample_of(w, x);
    const int64_t stride = l->stride ? l->stride : l->kernel;
    if (!window_ok(w, i, path, s.dim[1], l->kernel, stride, l->pad) ||
        !window_ok(w, i, path, s.dim[2], l->kernel, stride, l->pad))
        return MR_VAL_NONE;
    if (2 * l->pad > l->kernel) return fail(w, i, path, "pad must be at most half the kernel, got %lld", (long long)l->pad);
    if (l->kind == MR_LAYER_MAXPOOL2D) return mr_graph_maxpool2d(w->nn->g, x, (int)l->kernel, (int)stride, (int)l->pad);
    return mr_graph_avgpool2d(w->nn->g, x, (int)l->kernel, (int)stride, (int)l->pad);
}

static mr_val layer_norm(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *comp, const char *path) {
    mr_graph *g = w->nn->g;
    if (!(l->eps > 0) || !isfinite(l->eps)) return fail(w, i, path, "eps must be a positive number, got %g", l->eps);
    if (l->kind == MR_LAYER_LAYERNORM) {
        if (!need_rank(w, i, path, x, 1, 3, "1-d to 3-d input", NULL)) return MR_VAL_NONE;
        mr_shape s = sample_of(w, x);
        const int64_t d = s.dim[s.ndim - 1];
        char pn[MR_NAME_MAX];
        snprintf(pn, sizeof pn, "%s.weight", comp);
        mr_val gw = mr_nn_param(w->nn, pn, mr_shape_1d(d), MR_INIT_ONES, 0);
        snprintf(pn, sizeof pn, "%s.bias", comp);
        mr_val gb = mr_nn_param(w->nn, pn, mr_shape_1d(d), MR_INIT_ZEROS, 0);
        return mr_graph_layernorm(g, x, gw, gb, l->eps);
    }
    if (l->kind == MR_LAYER_BATCHNORM2D && !need_rank(w, i, path, x, 3, 3, "(C, H, W) input", "batchnorm1d for vectors"))
        return MR_VAL_NONE;
    if (l->kind == MR_LAYER_BATCHNORM1D &&
        !need_rank(w, i, path, x, 1, 2, "(C) or (C, L) input", "batchnorm2d for images"))
        return MR_VAL_NONE;
    if (!(l->momentum >= 0 && l->momentum <= 1)) return fail(w, i, path, "momentum must be in [0, 1], got %g", l->momentum);
    const mr_hook *sync = w->nn->sync;
    if (!l->sync) w->nn->sync = NULL; /* this layer normalises each replica's own micro-batch */
    mr_val y = mr_nn_batchnorm(w->nn, comp, x, l->momentum, l->eps, l->affine);
    w->nn->sync = sync;
    return y;
}

static mr_val layer_embedding(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *comp, const char *path) {
    mr_graph *g = w->nn->g;
    if (mr_graph_dtype(g, x) != MR_I32)
        return fail(w, i, path, "expects token ids; HINT: model.input: tokens, with the embedding first");
    const int64_t vocab = l->vocab ? l->vocab : w->ctx->vocab;
    if (!need_pos(w, i, path, "vocab", vocab) || !need_pos(w, i, path, "dim", l->dim)) return MR_VAL_NONE;
    if (!(l->std > 0) || !isfinite(l->std)) return fail(w, i, path, "std must be a positive number, got %g", l->std);
    return mr_nn_embedding(w->nn, comp, x, vocab, l->dim, l->std);
}

/* x (B, T, C) + a learned position table [context, C] (nanoGPT's wpe). */
static mr_val layer_pos(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *comp, const char *path) {
    mr_graph *g = w->nn->g;
    if (!need_rank(w, i, path, x, 2, 2, "(T, C) input", "an embedding first")) return MR_VAL_NONE;
    mr_shape s = sample_of(w, x);
    const int64_t T = s.dim[0], C = s.dim[1], ctxlen = l->context ? l->context : T;
    if (l->dim && l->dim != C) return fail(w, i, path, "dim %lld does not match the input's %lld", (long long)l->dim, (long long)C);
    if (ctxlen < T) return fail(w, i, path, "context %lld is shorter than the %lld tokens", (long long)ctxlen, (long long)T);
    if (!(l->std > 0) || !isfinite(l->std)) return fail(w, i, path, "std must be a positive number, got %g", l->std);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    if (!pos) {
        mr_graph_fail(g, MR_ERR_NOMEM, "%s pos_embedding: out of memory", path);
        return MR_VAL_NONE;
    }
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t;
    mr_val posv = mr_graph_const(g, MR_I32, mr_shape_1d(T), pos);
    free(pos);
    return mr_graph_add(g, x, mr_nn_embedding(w->nn, comp, posv, ctxlen, C, l->std));
}

/* GPT-2's pre-LN block under prefix (nanoGPT names): x + attn(ln_1(x)), then + mlp(ln_2(x)). */
static mr_val layer_transformer(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *prefix,
                                const char *path) {
    mr_nn *nn = w->nn;
    mr_graph *g = nn->g;
    if (!need_rank(w, i, path, x, 2, 2, "(T, C) input", "an embedding first")) return MR_VAL_NONE;
    mr_shape s = sample_of(w, x);
    const int64_t C = s.dim[1];
    if (!need_pos(w, i, path, "heads", l->heads) || !need_pos(w, i, path, "mlp", l->mlp)) return MR_VAL_NONE;
    if (C % l->heads) return fail(w, i, path, "width %lld is not divisible by %lld heads", (long long)C, (long long)l->heads);
    if (!(l->p >= 0 && l->p < 1)) return fail(w, i, path, "dropout must be in [0, 1), got %g", l->p);
    if (!set_prefix(w, i, path, prefix)) return MR_VAL_NONE;
    mr_val a = mr_nn_causal_attention(nn, "attn", mr_nn_layernorm(nn, "ln_1", x), (int)l->heads);
    mr_val h = mr_graph_add(g, x, mr_nn_dropout(nn, a, l->p));
    mr_val m = mr_nn_linear_gelu_init(nn, "mlp.c_fc", mr_nn_layernorm(nn, "ln_2", h), l->mlp * C, MR_INIT_NORMAL, 0.02,
                                      MR_INIT_ZEROS, 0);
    m = mr_nn_linear_init(nn, "mlp.c_proj", m, C, 1, MR_INIT_NORMAL, w->proj_std, MR_INIT_ZEROS, 0);
    return mr_graph_add(g, h, mr_nn_dropout(nn, m, l->p));
}

static mr_val layer_residual(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *prefix, const char *path,
                             int depth) {
    if (!l->n_body) return fail(w, i, path, "needs body: [...] (the layers whose output the input is added to)");
    char pre[MR_NAME_MAX * 2], pth[512];
    snprintf(pre, sizeof pre, "%.150sbody.", prefix); /* >= 96: refused by set_prefix */
    snprintf(pth, sizeof pth, "%.480s.body", path);
    mr_val y = run_seq(w, l->body, l->n_body, x, pre, pth, depth + 1);
    mr_val sc = x;
    if (l->n_shortcut) {
        snprintf(pre, sizeof pre, "%.150sshortcut.", prefix);
        snprintf(pth, sizeof pth, "%.480s.shortcut", path);
        sc = run_seq(w, l->shortcut, l->n_shortcut, x, pre, pth, depth + 1);
    }
    if (failed(w)) return MR_VAL_NONE;
    mr_shape sy = sample_of(w, y), ss = sample_of(w, sc);
    if (!mr_shape_eq(&sy, &ss)) {
        char b1[128], b2[128];
        if (!l->n_shortcut)
            return fail(w, i, path, "the body maps %s to %s but there is no shortcut; HINT: add shortcut: [...] (a 1x1 "
                                    "conv2d with the body's stride and channels)",
                        dims_str(&ss, b1, sizeof b1), dims_str(&sy, b2, sizeof b2));
        return fail(w, i, path, "the body gives %s but the shortcut %s", dims_str(&sy, b1, sizeof b1),
                    dims_str(&ss, b2, sizeof b2));
    }
    return mr_graph_add(w->nn->g, y, sc);
}

static mr_val layer_repeat(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *prefix, const char *path,
                           int depth) {
    if (!need_pos(w, i, path, "times", l->times)) return MR_VAL_NONE;
    if (!l->n_body) return fail(w, i, path, "needs body: [...] (the layers to repeat)");
    for (int64_t r = 0; r < l->times && !failed(w); r++) {
        char comp[32], pre[MR_NAME_MAX * 2], pth[512];
        snprintf(comp, sizeof comp, "%lld", (long long)r);
        snprintf(pth, sizeof pth, "%.480s[%lld]", path, (long long)r);
        if (l->n_body == 1) { /* a ModuleList of blocks: h.0.ln_1 */
            x = run_layer(w, l->body, x, prefix, comp, pth, depth + 1);
        } else { /* a Sequential per repetition: 0.1.weight */
            snprintf(pre, sizeof pre, "%.150s%.32s.", prefix, comp);
            x = run_seq(w, l->body, l->n_body, x, pre, pth, depth + 1);
        }
    }
    return x;
}

static mr_val layer_simple(walk *w, int32_t i, const mr_layer *l, mr_val x, const char *path) {
    mr_graph *g = w->nn->g;
    switch (l->kind) {
    case MR_LAYER_RELU: return mr_nn_relu(w->nn, x); /* fused into a conv2d just before it, on the CPU */
    case MR_LAYER_GELU: return mr_graph_unary(g, MR_OP_GELU, x);
    case MR_LAYER_TANH: return mr_graph_unary(g, MR_OP_TANH, x);
    case MR_LAYER_SIGMOID: return mr_graph_unary(g, MR_OP_SIGMOID, x);
    case MR_LAYER_SILU: return mr_graph_mul(g, x, mr_graph_unary(g, MR_OP_SIGMOID, x));
    case MR_LAYER_DROPOUT:
        if (!(l->p >= 0 && l->p < 1)) return fail(w, i, path, "p must be in [0, 1), got %g", l->p);
        return mr_nn_dropout(w->nn, x, l->p);
    case MR_LAYER_GLOBAL_AVGPOOL:
        if (!need_rank(w, i, path, x, 3, 3, "(C, H, W) input", NULL)) return MR_VAL_NONE;
        return mr_graph_mean(g, x, (1u << 2) | (1u << 3));
    case MR_LAYER_FLATTEN: {
        mr_shape s = sample_of(w, x);
        return per_sample(w, x, &(mr_shape){.ndim = 1, .dim = {mr_shape_numel(&s)}});
    }
    case MR_LAYER_RESHAPE: {
        mr_shape s = sample_of(w, x), t = mr_shape_make(l->n_shape, l->shape);
        if (l->n_shape < 1 || mr_shape_numel(&t) != mr_shape_numel(&s)) {
            char b1[128], b2[128];
            return fail(w, i, path, "cannot reshape %s into %s (element counts differ)", dims_str(&s, b1, sizeof b1),
                        dims_str(&t, b2, sizeof b2));
        }
        return per_sample(w, x, &t);
    }
    default: return fail(w, i, path, "unknown layer kind %d", l->kind);
    }
}

/* Non-zero when a parameter of the graph being built starts with prefix (another layer of the
 * same name built before: its weights would be shared silently). */
static int prefix_in_use(const walk *w, const char *prefix) {
    const size_t n = strlen(prefix);
    for (int32_t k = 0; k < mr_graph_num_params(w->nn->g); k++)
        if (!strncmp(mr_graph_name(w->nn->g, mr_graph_param_at(w->nn->g, k)), prefix, n)) return 1;
    return 0;
}

/* Layer i under prefix; comp is its name component ("3" or its own name). */
static mr_val run_layer(walk *w, int32_t i, mr_val x, const char *prefix, const char *comp, const char *path,
                        int depth) {
    if (failed(w)) return MR_VAL_NONE;
    const mr_layer *l = &w->g->l[i];
    const int64_t before = mr_params_total(w->nn->ps);
    char own[MR_NAME_MAX * 2];
    snprintf(own, sizeof own, "%.130s%.56s.", prefix, comp); /* children and blocks; >= 96: refused */
    if (!set_prefix(w, i, path, prefix)) return MR_VAL_NONE;
    if (w->summary && (l->kind == MR_LAYER_RESIDUAL || l->kind == MR_LAYER_REPEAT))
        fprintf(w->summary, "  %*s%s%-*s %-14s\n", 2 * depth, "", prefix, 36 - 2 * depth - (int)strlen(prefix), comp,
                mr_layer_kind_name(l->kind));
    if (prefix_in_use(w, own))
        return fail(w, i, path, "its parameters (%s*) are another layer's: two layers of one name", own);
    mr_val y;
    switch (l->kind) {
    case MR_LAYER_LINEAR: y = layer_linear(w, i, l, x, comp, path); break;
    case MR_LAYER_CONV2D: y = layer_conv(w, i, l, x, comp, path); break;
    case MR_LAYER_MAXPOOL2D: case MR_LAYER_AVGPOOL2D: y = layer_pool(w, i, l, x, path); break;
    case MR_LAYER_BATCHNORM1D: case MR_LAYER_BATCHNORM2D: case MR_LAYER_LAYERNORM:
        y = layer_norm(w, i, l, x, comp, path);
        break;
    case MR_LAYER_EMBEDDING: y = layer_embedding(w, i, l, x, comp, path); break;
    case MR_LAYER_POS_EMBEDDING: y = layer_pos(w, i, l, x, comp, path); break;
    case MR_LAYER_TRANSFORMER: y = layer_transformer(w, i, l, x, own, path); break;
    case MR_LAYER_RESIDUAL: y = layer_residual(w, i, l, x, own, path, depth); break;
    case MR_LAYER_REPEAT: y = layer_repeat(w, i, l, x, own, path, depth); break;
    default: y = layer_simple(w, i, l, x, path); break;
    }
    if (failed(w)) return MR_VAL_NONE;
    {
        mr_shape so = sample_of(w, y);
        if ((double)mr_shape_numel(&so) > 1073741824.0 || (double)mr_params_total(w->nn->ps) > 4294967296.0)
            return fail(w, i, path, "the model is too large (a sample of %lld values, %lld parameters so far)",
                        (long long)mr_shape_numel(&so), (long long)mr_params_total(w->nn->ps));
    }
    if (w->summary && l->kind != MR_LAYER_RESIDUAL && l->kind != MR_LAYER_REPEAT) {
        char b[128], nm[MR_NAME_MAX * 2];
        mr_shape s = sample_of(w, y);
        snprintf(nm, sizeof nm, "%s%s", prefix, comp);
        fprintf(w->summary, "  %*s%-*s %-14s %-18s %12lld\n", 2 * depth, "", 36 - 2 * depth, nm,
                mr_layer_kind_name(l->kind), dims_str(&s, b, sizeof b),
                (long long)(mr_params_total(w->nn->ps) - before));
    }
    return y;
}

static mr_val run_seq(walk *w, int32_t first, int32_t n, mr_val x, const char *prefix, const char *path, int depth) {
    for (int32_t j = 0; j < n && !failed(w); j++) {
        const mr_layer *l = &w->g->l[first + j];
        char comp[MR_LAYER_NAME_MAX + 8], pth[512];
        if (l->name[0]) snprintf(comp, sizeof comp, "%s", l->name);
        else snprintf(comp, sizeof comp, "%d", j);
        snprintf(pth, sizeof pth, "%.480s[%d]", path, j);
        x = run_layer(w, first + j, x, prefix, comp, pth, depth);
    }
    return x;
}

/* Transformer blocks in the run, repeats multiplied out. */
static int64_t count_blocks(const mr_layer_graph *g, int32_t first, int32_t n, int depth) {
    int64_t c = 0;
    for (int32_t j = 0; j < n && depth < 64; j++) {
        const mr_layer *l = &g->l[first + j];
        if (l->kind == MR_LAYER_TRANSFORMER) c++;
        if (l->kind == MR_LAYER_RESIDUAL)
            c += count_blocks(g, l->body, l->n_body, depth + 1) + count_blocks(g, l->shortcut, l->n_shortcut, depth + 1);
        if (l->kind == MR_LAYER_REPEAT) c += l->times * count_blocks(g, l->body, l->n_body, depth + 1);
    }
    return c;
}

/* Checks the model's output: a vector per sample for a classifier, (T, vocab) for a language model. */
static void check_output(walk *w, mr_val y) {
    if (failed(w)) return;
    const int32_t last = w->g->n_top ? w->g->top + w->g->n_top - 1 : 0;
    mr_shape s = sample_of(w, y);
    char b[128];
    if (w->g->n_top == 0) {
        mr_graph_fail(w->nn->g, MR_ERR_INVALID, "model.layers: no layers");
        return;
    }
    if (mr_graph_dtype(w->nn->g, y) == MR_I32) {
        w->bad = last;
        mr_graph_fail(w->nn->g, MR_ERR_INVALID, "model.layers: the model's output is token ids; HINT: an embedding first");
        return;
    }
    if (!w->g->tokens && s.ndim != 1) {
        w->bad = last;
        mr_graph_fail(w->nn->g, MR_ERR_INVALID, "model.layers: a classifier's output is one score per class, got %s per "
                      "sample; HINT: end with flatten and linear: {out: CLASSES}", dims_str(&s, b, sizeof b));
    }
    if (w->g->tokens && (s.ndim != 2 || s.dim[0] != w->ctx->context || (w->ctx->vocab > 0 && s.dim[1] != w->ctx->vocab))) {
        w->bad = last;
        mr_graph_fail(w->nn->g, MR_ERR_INVALID, "model.layers: a language model's output is (T %lld, vocab %lld) per "
                      "sample, got %s; HINT: end with linear: {out: vocab} or a tied linear",
                      (long long)w->ctx->context, (long long)w->ctx->vocab, dims_str(&s, b, sizeof b));
    }
}

mr_val mr_layers_build(mr_nn *nn, const mr_layer_graph *g, const mr_layers_ctx *ctx, mr_val x) {
    walk w = {nn, g, ctx, mr_graph_shape(nn->g, x).dim[0], 0.02, NULL, -1};
    const int64_t blocks = count_blocks(g, g->top, g->n_top, 0);
    if (blocks) w.proj_std = 0.02 / sqrt(2.0 * (double)blocks);
    char saved[sizeof nn->prefix];
    memcpy(saved, nn->prefix, sizeof saved);
    mr_val y = run_seq(&w, g->top, g->n_top, x, saved, "model.layers", 0);
    memcpy(nn->prefix, saved, sizeof saved);
    check_output(&w, y);
    return failed(&w) ? MR_VAL_NONE : y;
}

/* A walk over a scratch graph and registry with batch 2 (training mode, so batch norm's batch
 * statistics are built too); *bad and the error as mr_layers_check. */
static int64_t scratch_walk(const mr_layer_graph *g, const mr_layers_ctx *ctx, FILE *summary, int32_t *bad) {
    mr_graph *gr = NULL;
    mr_params *ps = NULL;
    int64_t total = -1;
    *bad = -1;
    if (mr_graph_new(&gr) != MR_OK || mr_params_new(&ps) != MR_OK) goto done;
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    nn.g = gr;
    nn.ps = ps;
    nn.dtype = MR_F32;
    nn.compute = MR_F32;
    nn.training = 1;
    int64_t dims[MR_MAX_DIMS] = {2};
    int nd = 1;
    if (g->tokens) dims[nd++] = ctx->context;
    for (int i = 0; !g->tokens && i < g->n_input; i++) dims[nd++] = g->input[i];
    if (g->tokens && ctx->context <= 0) {
        mr_set_error(MR_ERR_INVALID, "model.context: a language model needs a positive context, got %lld",
                     (long long)ctx->context);
        goto done;
    }
    if (!g->tokens && g->n_input < 1) {
        mr_set_error(MR_ERR_INVALID, "model.input: a graph needs the shape of one sample ([C, H, W] or [D]) or tokens");
        goto done;
    }
    mr_val x = mr_graph_input(gr, "x", g->tokens ? MR_I32 : MR_F32, mr_shape_make(nd, dims));
    walk w = {&nn, g, ctx, 2, 0.02, summary, -1};
    const int64_t blocks = count_blocks(g, g->top, g->n_top, 0);
    if (blocks) w.proj_std = 0.02 / sqrt(2.0 * (double)blocks);
    mr_val y = run_seq(&w, g->top, g->n_top, x, "", "model.layers", 0);
    check_output(&w, y);
    *bad = w.bad;
    if (mr_graph_status(gr) != MR_OK) {
        mr_set_error(MR_ERR_INVALID, "%s", mr_graph_error(gr));
        goto done;
    }
    total = mr_params_total(ps);
done:
    mr_params_free(ps);
    mr_graph_free(gr);
    return total;
}

mr_status mr_layers_check(const mr_layer_graph *g, const mr_layers_ctx *ctx, int32_t *bad) {
    return scratch_walk(g, ctx, NULL, bad) < 0 ? MR_ERR_INVALID : MR_OK;
}

int64_t mr_layers_summary(const mr_layer_graph *g, const mr_layers_ctx *ctx, FILE *out) {
    int32_t bad;
    fprintf(out, "  %-36s %-14s %-18s %12s\n", "layer", "kind", "output", "params");
    return scratch_walk(g, ctx, out, &bad);
}
