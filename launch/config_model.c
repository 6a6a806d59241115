/* The structured (list-valued) keys (see config_impl.h): model.sizes, model.channels, model.input,
 * a layer graph's model.layers, and log.trace's step window, parsed from YAML nodes with a
 * position for every mistake. A layer
 * is a name (`relu`) or a mapping of one layer kind to its arguments, with an optional `name`:
 *   - conv2d: {out: 16, kernel: 3, pad: 1, bias: false}
 *     name: conv1
 * The kinds and their arguments are models/layers.h's; what the layers mean and how they are
 * named is docs/DESIGN.md "Models". */
#include "launch/config_impl.h"

#include <stdio.h>
#include <string.h>

pos mr_cfg_node_pos(const walker *w, const yaml_node_t *n) {
    if (w->is_set) return (pos){"--set", 0, 1};
    return (pos){w->name, (int)n->start_mark.line + 1, (int)n->start_mark.column + 1};
}

const char *mr_cfg_node_kind(const yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE ? "a mapping" : n->type == YAML_SEQUENCE_NODE ? "a list" : "a value";
}

static int n_items(const yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE ? (int)(n->data.mapping.pairs.top - n->data.mapping.pairs.start)
                                        : (int)(n->data.sequence.items.top - n->data.sequence.items.start);
}

static yaml_node_t *item(const walker *w, const yaml_node_t *seq, int i) {
    return yaml_document_get_node(w->doc, seq->data.sequence.items.start[i]);
}

/* Reads a list of integers >= 1 (count in [lo_n, hi_n]) from a sequence node; `what` names it. */
static mr_status int_list(const walker *w, const char *what, const yaml_node_t *n, int64_t *out, int *cnt, int lo_n,
                          int hi_n) {
    if (n->type != YAML_SEQUENCE_NODE)
        return perr(MR_ERR_INVALID, node_pos(w, n), "%s: expected a list of %s%d integers, got %s%s%s", what,
                    lo_n == hi_n ? "" : "up to ", hi_n, n->type == YAML_SCALAR_NODE ? "'" : "",
                    n->type == YAML_SCALAR_NODE ? SCALAR(n) : node_kind(n), n->type == YAML_SCALAR_NODE ? "'" : "");
    int c = n_items(n);
    if (c < lo_n || c > hi_n) {
        if (lo_n == hi_n) return perr(MR_ERR_INVALID, node_pos(w, n), "%s: expected %d integers, got %d", what, lo_n, c);
        return perr(MR_ERR_INVALID, node_pos(w, n), "%s: expected %d to %d integers, got %d", what, lo_n, hi_n, c);
    }
    for (int i = 0; i < c; i++) {
        yaml_node_t *it = item(w, n, i);
        int64_t v;
        if (it->type != YAML_SCALAR_NODE || !mr_cfg_parse_i64(SCALAR(it), &v))
            return perr(MR_ERR_INVALID, node_pos(w, it), "%s[%d]: expected an integer, got %s%s%s", what, i,
                        it->type == YAML_SCALAR_NODE ? "'" : "", it->type == YAML_SCALAR_NODE ? SCALAR(it) : node_kind(it),
                        it->type == YAML_SCALAR_NODE ? "'" : "");
        if (v < 1) return perr(MR_ERR_INVALID, node_pos(w, it), "%s[%d]: must be >= 1, got %lld", what, i, (long long)v);
        out[i] = v;
    }
    *cnt = c;
    return MR_OK;
}

/* ---- layers ----------------------------------------------------------------------------------- */

typedef enum { A_INT, A_VOCAB, A_NUM, A_BOOL, A_STR, A_SHAPE, A_LAYERS } arg_type;

typedef struct arg {
    const char *name;
    arg_type t;
    size_t off; /* in mr_layer */
    uint32_t kinds; /* bit per mr_layer_kind that takes it */
} arg;

#define K(k) (1u << MR_LAYER_##k)
#define L(m) offsetof(mr_layer, m)
static const arg ARGS[] = {
    {"out", A_VOCAB, L(out), K(LINEAR) | K(CONV2D)},
    {"bias", A_BOOL, L(bias), K(LINEAR) | K(CONV2D)},
    {"tied", A_STR, L(tied), K(LINEAR)},
    {"kernel", A_INT, L(kernel), K(CONV2D) | K(MAXPOOL2D) | K(AVGPOOL2D)},
    {"stride", A_INT, L(stride), K(CONV2D) | K(MAXPOOL2D) | K(AVGPOOL2D)},
    {"pad", A_INT, L(pad), K(CONV2D) | K(MAXPOOL2D) | K(AVGPOOL2D)},
    {"momentum", A_NUM, L(momentum), K(BATCHNORM1D) | K(BATCHNORM2D)},
    {"eps", A_NUM, L(eps), K(BATCHNORM1D) | K(BATCHNORM2D) | K(LAYERNORM)},
    {"affine", A_BOOL, L(affine), K(BATCHNORM1D) | K(BATCHNORM2D)},
    {"sync", A_BOOL, L(sync), K(BATCHNORM1D) | K(BATCHNORM2D)},
    {"vocab", A_VOCAB, L(vocab), K(EMBEDDING)},
    {"dim", A_INT, L(dim), K(EMBEDDING) | K(POS_EMBEDDING)},
    {"context", A_INT, L(context), K(POS_EMBEDDING)},
    {"std", A_NUM, L(std), K(EMBEDDING) | K(POS_EMBEDDING)},
    {"p", A_NUM, L(p), K(DROPOUT)},
    {"dropout", A_NUM, L(p), K(TRANSFORMER)},
    {"heads", A_INT, L(heads), K(TRANSFORMER)},
    {"mlp", A_INT, L(mlp), K(TRANSFORMER)},
    {"times", A_INT, L(times), K(REPEAT)},
    {"shape", A_SHAPE, 0, K(RESHAPE)},
    {"body", A_LAYERS, L(body), K(RESIDUAL) | K(REPEAT)},
    {"shortcut", A_LAYERS, L(shortcut), K(RESIDUAL)},
};
#undef K
#undef L
#define N_ARGS ((int)(sizeof ARGS / sizeof ARGS[0]))

/* "conv2d's arguments: out, kernel, ..." into buf. */
static const char *args_of(int kind, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_ARGS; i++)
        if (ARGS[i].kinds & (1u << kind)) n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", ARGS[i].name);
    if (!n) snprintf(buf, cap, "none");
    return buf;
}

static const char *closest(const char *s, const char *const *cands, int n) {
    const char *best = NULL;
    int bd = 99;
    for (int i = 0; i < n; i++) {
        int d = mr_cfg_edit_distance(s, cands[i]);
        if (d < bd) bd = d, best = cands[i];
    }
    return bd <= 2 || (bd <= 3 && strlen(s) > 6) ? best : NULL;
}

static mr_status parse_seq(const walker *w, const yaml_node_t *seq, const char *path, mr_layer_graph *g, int32_t *first,
                           int32_t *n, int depth);

/* Sets argument `a` of layer l from node v. */
static mr_status set_arg(const walker *w, const arg *a, const yaml_node_t *v, const char *path, mr_layer_graph *g,
                         int32_t li, int depth) {
    mr_layer *l = &g->l[li];
    char *base = (char *)l + a->off;
    const char *kn = mr_layer_kind_name(l->kind);
    if (a->t == A_LAYERS) {
        char p[512];
        snprintf(p, sizeof p, "%.480s.%s", path, a->name);
        int32_t first = 0, n = 0;
        mr_status st = parse_seq(w, v, p, g, &first, &n, depth + 1);
        if (st) return st;
        l = &g->l[li];
        int32_t *fp = (int32_t *)((char *)l + a->off);
        fp[0] = first, fp[1] = n; /* body, n_body / shortcut, n_shortcut are adjacent */
        return MR_OK;
    }
    if (a->t == A_SHAPE) {
        int c = 0;
        char what[600];
        snprintf(what, sizeof what, "%s %s.shape", path, kn);
        mr_status st = int_list(w, what, v, l->shape, &c, 1, 4);
        l->n_shape = c;
        return st;
    }
    if (v->type != YAML_SCALAR_NODE)
        return perr(MR_ERR_INVALID, node_pos(w, v), "%s %s: %s expects a value, got %s", path, kn, a->name, node_kind(v));
    const char *s = SCALAR(v);
    int64_t iv;
    double dv;
    int bv;
    switch (a->t) {
    case A_VOCAB:
        if (!strcmp(s, "vocab")) {
            memset(base, 0, sizeof(int64_t));
            return MR_OK;
        }
        /* fall through */
    case A_INT:
        if (!mr_cfg_parse_i64(s, &iv) || iv < (a->t == A_INT && !strcmp(a->name, "pad") ? 0 : 1))
            return perr(MR_ERR_INVALID, node_pos(w, v), "%s %s: %s expects a%s integer%s, got '%s'", path, kn, a->name,
                        strcmp(a->name, "pad") ? " positive" : " non-negative", a->t == A_VOCAB ? " or vocab" : "", s);
        {
            /* geometry in the thousands, widths to 2^31: larger is a typo, and would overflow the
             * int arguments of the ops and the element counts */
            const int geometry = !strcmp(a->name, "kernel") || !strcmp(a->name, "stride") || !strcmp(a->name, "pad") ||
                                 !strcmp(a->name, "heads") || !strcmp(a->name, "mlp") || !strcmp(a->name, "times");
            const int64_t cap = geometry ? 4096 : 2147483647;
            if (iv > cap)
                return perr(MR_ERR_INVALID, node_pos(w, v), "%s %s: %s must be at most %lld, got %lld", path, kn, a->name,
                            (long long)cap, (long long)iv);
        }
        memcpy(base, &iv, sizeof iv);
        return MR_OK;
    case A_NUM:
        if (!mr_cfg_parse_f64(s, &dv))
            return perr(MR_ERR_INVALID, node_pos(w, v), "%s %s: %s expects a number, got '%s'", path, kn, a->name, s);
        memcpy(base, &dv, sizeof dv);
        return MR_OK;
    case A_BOOL:
        if (!mr_cfg_parse_bool(s, &bv))
            return perr(MR_ERR_INVALID, node_pos(w, v), "%s %s: %s expects true or false, got '%s'", path, kn, a->name, s);
        memcpy(base, &bv, sizeof bv);
        return MR_OK;
    default:
        if (!*s || strlen(s) >= sizeof l->tied)
            return perr(MR_ERR_INVALID, node_pos(w, v), "%s %s: %s expects a parameter name, got '%s'", path, kn, a->name, s);
        snprintf(base, sizeof l->tied, "%s", s);
        return MR_OK;
    }
}

/* The layer kind a key names, or a did-you-mean error. */
static mr_status kind_of(const walker *w, const yaml_node_t *k, const char *path, int *kind) {
    *kind = mr_layer_kind_find(SCALAR(k));
    if (*kind >= 0) return MR_OK;
    const char *names[MR_LAYER_KIND_COUNT];
    for (int i = 0; i < MR_LAYER_KIND_COUNT; i++) names[i] = mr_layer_kind_name(i);
    const char *best = closest(SCALAR(k), names, MR_LAYER_KIND_COUNT);
    if (best)
        return perr(MR_ERR_INVALID, node_pos(w, k), "%s: unknown layer '%s' (did you mean '%s'?)", path, SCALAR(k), best);
    return perr(MR_ERR_INVALID, node_pos(w, k), "%s: unknown layer '%s'; HINT: one of linear, conv2d, batchnorm2d, "
                "relu, maxpool2d, global_avgpool, flatten, residual, repeat, transformer, ... (docs/DESIGN.md \"Models\")",
                path, SCALAR(k));
}

/* Reads the arguments of layer li from mapping m. */
static mr_status parse_args(const walker *w, const yaml_node_t *m, const char *path, mr_layer_graph *g, int32_t li,
                            int depth) {
    const int kind = g->l[li].kind;
    const char *kn = mr_layer_kind_name(kind);
    if (m->type == YAML_SCALAR_NODE && !*SCALAR(m)) return MR_OK; /* `relu:` */
    if (m->type != YAML_MAPPING_NODE)
        return perr(MR_ERR_INVALID, node_pos(w, m), "%s %s: expected a mapping of arguments, got %s", path, kn, node_kind(m));
    for (int i = 0; i < n_items(m); i++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, m->data.mapping.pairs.start[i].key);
        yaml_node_t *v = yaml_document_get_node(w->doc, m->data.mapping.pairs.start[i].value);
        if (k->type != YAML_SCALAR_NODE)
            return perr(MR_ERR_INVALID, node_pos(w, k), "%s %s: argument names must be names", path, kn);
        const arg *a = NULL;
        for (int j = 0; j < N_ARGS && !a; j++)
            if (!strcmp(ARGS[j].name, SCALAR(k)) && (ARGS[j].kinds & (1u << kind))) a = &ARGS[j];
        for (int j = 0; j < i && a; j++) {
            yaml_node_t *k2 = yaml_document_get_node(w->doc, m->data.mapping.pairs.start[j].key);
            if (k2->type == YAML_SCALAR_NODE && !strcmp(SCALAR(k2), SCALAR(k)))
                return perr(MR_ERR_INVALID, node_pos(w, k), "%s %s: duplicate argument '%s'", path, kn, SCALAR(k));
        }
        if (!a) {
            const char *cands[N_ARGS];
            int nc = 0;
            for (int j = 0; j < N_ARGS; j++)
                if (ARGS[j].kinds & (1u << kind)) cands[nc++] = ARGS[j].name;
            const char *best = closest(SCALAR(k), cands, nc);
            char all[256];
            if (best)
                return perr(MR_ERR_INVALID, node_pos(w, k), "%s %s: unknown argument '%s' (did you mean '%s'?)", path, kn,
                            SCALAR(k), best);
            return perr(MR_ERR_INVALID, node_pos(w, k), "%s %s: unknown argument '%s' (%s takes: %s)", path, kn, SCALAR(k),
                        kn, args_of(kind, all, sizeof all));
        }
        mr_status st = set_arg(w, a, v, path, g, li, depth);
        if (st) return st;
    }
    return MR_OK;
}

/* One layer (node n) into entry li. */
static mr_status parse_layer(const walker *w, const yaml_node_t *n, const char *path, mr_layer_graph *g, int32_t li,
                             int depth) {
    int kind;
    mr_status st;
    if (n->type == YAML_SCALAR_NODE) {
        if ((st = kind_of(w, n, path, &kind))) return st;
        g->l[li] = mr_layer_default(kind);
        g->l[li].line = (int)n->start_mark.line + 1, g->l[li].col = (int)n->start_mark.column + 1;
        return MR_OK;
    }
    if (n->type != YAML_MAPPING_NODE)
        return perr(MR_ERR_INVALID, node_pos(w, n), "%s: expected a layer (a name, or {kind: {arguments}}), got a list", path);
    const yaml_node_t *kk = NULL, *args = NULL, *name = NULL;
    for (int i = 0; i < n_items(n); i++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, n->data.mapping.pairs.start[i].key);
        yaml_node_t *v = yaml_document_get_node(w->doc, n->data.mapping.pairs.start[i].value);
        if (k->type != YAML_SCALAR_NODE) return perr(MR_ERR_INVALID, node_pos(w, k), "%s: keys must be names", path);
        if (!strcmp(SCALAR(k), "name")) {
            name = v;
            continue;
        }
        if (kk)
            return perr(MR_ERR_INVALID, node_pos(w, k), "%s: one layer per list item, got '%s' and '%s'; HINT: start "
                        "'%s' on its own line with '- '", path, SCALAR(kk), SCALAR(k), SCALAR(k));
        kk = k, args = v;
    }
    if (!kk) return perr(MR_ERR_INVALID, node_pos(w, n), "%s: a layer needs a kind (linear, conv2d, ...), not just a name", path);
    if ((st = kind_of(w, kk, path, &kind))) return st;
    g->l[li] = mr_layer_default(kind);
    g->l[li].line = (int)kk->start_mark.line + 1, g->l[li].col = (int)kk->start_mark.column + 1;
    if (name) {
        const char *s = name->type == YAML_SCALAR_NODE ? SCALAR(name) : "";
        int ok = *s && strlen(s) < MR_LAYER_NAME_MAX && !strchr(s, '.') && !strchr(s, '/');
        if (!ok)
            return perr(MR_ERR_INVALID, node_pos(w, name), "%s: name must be 1 to %d characters without '.' or '/'", path,
                        MR_LAYER_NAME_MAX - 1);
        snprintf(g->l[li].name, sizeof g->l[li].name, "%s", s);
        for (int i = 0; i < n_items(n); i++) { /* a second name: key would be taken silently */
            yaml_node_t *k = yaml_document_get_node(w->doc, n->data.mapping.pairs.start[i].key);
            if (k->type == YAML_SCALAR_NODE && !strcmp(SCALAR(k), "name") &&
                yaml_document_get_node(w->doc, n->data.mapping.pairs.start[i].value) != name)
                return perr(MR_ERR_INVALID, node_pos(w, k), "%s: two names", path);
        }
    }
    return parse_args(w, args, path, g, li, depth);
}

/* A list of layers into a contiguous run of entries (reserved first, so nested bodies follow). */
static mr_status parse_seq(const walker *w, const yaml_node_t *seq, const char *path, mr_layer_graph *g, int32_t *first,
                           int32_t *n, int depth) {
    if (depth > 16) return perr(MR_ERR_INVALID, node_pos(w, seq), "%s: layers nested more than 16 deep", path);
    if (seq->type != YAML_SEQUENCE_NODE)
        return perr(MR_ERR_INVALID, node_pos(w, seq), "%s: expected a list of layers, got %s", path, node_kind(seq));
    const int c = n_items(seq);
    if (c == 0) return perr(MR_ERR_INVALID, node_pos(w, seq), "%s: expected at least one layer", path);
    const int32_t at = mr_layers_reserve(g, c);
    if (at < 0) return perr(MR_ERR_INVALID, node_pos(w, seq), "%s: more than %d layers in all", path, MR_LAYERS_MAX);
    for (int i = 0; i < c; i++) {
        char p[512];
        snprintf(p, sizeof p, "%.490s[%d]", path, i);
        mr_status st = parse_layer(w, item(w, seq, i), p, g, at + i, depth);
        if (st) return st;
        /* a name is a parameter prefix: two siblings of one name would share their weights */
        const char *nm = g->l[at + i].name;
        if (nm[0] && strspn(nm, "0123456789") == strlen(nm))
            return perr(MR_ERR_INVALID, node_pos(w, item(w, seq, i)), "%s: name '%s' is a position (layers without a name "
                        "are named by their index); HINT: a name with a letter", p, nm);
        for (int j = 0; nm[0] && j < i; j++)
            if (!strcmp(g->l[at + j].name, nm))
                return perr(MR_ERR_INVALID, node_pos(w, item(w, seq, i)), "%s: name '%s' is already layer %d's (its "
                            "parameters would be shared); HINT: a name of its own, or repeat: for copies", p, nm, j);
    }
    *first = at, *n = c;
    return MR_OK;
}

static mr_status set_input(const walker *w, mr_experiment *e, const yaml_node_t *n) {
    mr_layer_graph *g = &e->model.graph;
    if (n->type == YAML_SCALAR_NODE && !strcmp(SCALAR(n), "tokens")) {
        g->tokens = 1, g->n_input = 0;
        return MR_OK;
    }
    int64_t v[4] = {0, 0, 0, 0}; /* the unused dims stay 0 (the config is compared and copied by value) */
    int c = 0;
    mr_status st = int_list(w, "model.input", n, v, &c, 1, 4);
    if (st) return st;
    double numel = 1;
    for (int i = 0; i < c; i++) numel *= (double)v[i];
    if (numel > 1073741824.0)
        return perr(MR_ERR_INVALID, node_pos(w, n), "model.input: a sample of %.3g values is too large (at most 2^30)", numel);
    g->tokens = 0, g->n_input = c;
    memcpy(g->input, v, sizeof v);
    if (c == 3) e->model.in_channels = v[0], e->model.height = v[1], e->model.width = v[2];
    return MR_OK;
}

mr_status mr_cfg_set_model_node(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n) {
    int64_t v[MR_MLP_MAX_LAYERS + 1];
    int c;
    mr_status st;
    switch (f->k) {
    case K_SIZES:
        if ((st = int_list(w, f->path, n, v, &c, 2, MR_MLP_MAX_LAYERS + 1))) return st;
        memset(e->model.sizes, 0, sizeof e->model.sizes);
        memcpy(e->model.sizes, v, (size_t)c * sizeof v[0]);
        e->model.n_sizes = c;
        return MR_OK;
    case K_CHANNELS:
        if ((st = int_list(w, f->path, n, v, &c, 2, 2))) return st;
        e->model.ch1 = v[0], e->model.ch2 = v[1];
        return MR_OK;
    case K_INPUT:
        return set_input(w, e, n);
    default: { /* model.layers as a list: the graph's layers replace any given before */
        mr_layer_graph *g = &e->model.graph;
        g->n = 0, g->top = 0, g->n_top = 0;
        return parse_seq(w, n, "model.layers", g, &g->top, &g->n_top, 0);
    }
    }
}

/* A step window [first, last] (log.trace): 1 <= first <= last; [] or none: off (0 0). */
mr_status mr_cfg_set_window(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n) {
    pos p = node_pos(w, n);
    int64_t v[2] = {0, 0};
    if (n->type == YAML_SCALAR_NODE) {
        int b = 1;
        if (!strcmp(SCALAR(n), "none") || (mr_cfg_parse_bool(SCALAR(n), &b) && !b)) {
            memcpy((char *)e + f->off, v, sizeof v);
            return MR_OK;
        }
        return perr(MR_ERR_INVALID, p, "%s: expected [first, last] (steps) or none, got '%s'; HINT: %s=[100, 110]",
                    f->path, SCALAR(n), f->path);
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return perr(MR_ERR_INVALID, p, "%s: expected [first, last] (steps) or none, got %s", f->path, node_kind(n));
    int c = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (c != 0 && c != 2)
        return perr(MR_ERR_INVALID, p, "%s: expected two steps [first, last], got %d value%s", f->path, c, c == 1 ? "" : "s");
    for (int i = 0; i < c; i++) {
        yaml_node_t *it = yaml_document_get_node(w->doc, n->data.sequence.items.start[i]);
        if (it->type != YAML_SCALAR_NODE || !mr_cfg_parse_i64(SCALAR(it), &v[i]) || v[i] < 1)
            return perr(MR_ERR_INVALID, node_pos(w, it), "%s[%d]: expected a step (an integer >= 1)", f->path, i);
    }
    if (v[0] > v[1])
        return perr(MR_ERR_INVALID, p, "%s: the first step (%lld) is after the last (%lld)", f->path, (long long)v[0],
                    (long long)v[1]);
    memcpy((char *)e + f->off, v, sizeof v);
    return MR_OK;
}

mr_status mr_cfg_check_layers(const mr_experiment *e, pos where) {
    const mr_layer_graph *g = &e->model.graph;
    if (e->model.type != MR_MODEL_GRAPH) return MR_OK;
    if (g->n_top == 0)
        return perr(MR_ERR_INVALID, where, "model.layers: model.type graph needs a list of layers; HINT: see "
                    "configs/resnet.yaml");
    if (!g->tokens && g->n_input == 0)
        return perr(MR_ERR_INVALID, where, "model.input: model.type graph needs the shape of one sample ([C, H, W] or "
                    "[D]) or tokens");
    const mr_layers_ctx ctx = {e->model.vocab, e->model.context};
    int32_t bad = -1;
    if (mr_layers_check(g, &ctx, &bad) == MR_OK) return MR_OK;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", mr_last_error());
    if (bad >= 0 && g->l[bad].line > 0 && where.line > 0) where.line = g->l[bad].line, where.col = g->l[bad].col;
    return perr(MR_ERR_INVALID, where, "%s", msg);
}
