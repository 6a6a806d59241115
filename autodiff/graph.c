/* Graph building: values, nodes, shape inference and validation (see graph.h). Building computes
 * nothing; every node is checked by its op's own check (core/op_table.c) with placeholder
 * pointers, so a shape or dtype mismatch fails here, at build time, naming the op and shapes. */
#include "autodiff/graph_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Placeholder data for validating a node: checks look at presence, dtype and shape only. */
static char g_placeholder[64];

mr_status mr_graph_fail(mr_graph *g, mr_status st, const char *fmt, ...) {
    if (g->err != MR_OK) return g->err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->errmsg, sizeof g->errmsg, fmt, ap);
    va_end(ap);
    g->err = st;
    mr_set_error(st, "%s", g->errmsg);
    return st;
}

mr_status mr_graph_new(mr_graph **out) {
    mr_graph *g = calloc(1, sizeof *g);
    if (!g) return mr_set_error(MR_ERR_NOMEM, "graph: out of memory");
    g->capvals = 64;
    g->vals = calloc((size_t)g->capvals, sizeof *g->vals);
    if (!g->vals) {
        free(g);
        return mr_set_error(MR_ERR_NOMEM, "graph: out of memory");
    }
    g->nvals = 1; /* vals[0]: none */
    *out = g;
    return MR_OK;
}

void mr_graph_free(mr_graph *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->nvals; i++) free(g->vals[i].cdata);
    free(g->vals);
    free(g->nodes);
    free(g->params);
    free(g);
}

mr_status mr_graph_status(const mr_graph *g) { return g->err; }
const char *mr_graph_error(const mr_graph *g) { return g->errmsg; }

int mr_graph_valid(const mr_graph *g, mr_val v) { return v.id > 0 && v.id < g->nvals; }

int32_t mr_graph_num_values(const mr_graph *g) { return g->nvals - 1; }
int32_t mr_graph_num_nodes(const mr_graph *g) { return g->nnodes; }
mr_dtype mr_graph_dtype(const mr_graph *g, mr_val v) { return mr_graph_valid(g, v) ? g->vals[v.id].dtype : MR_F32; }
mr_shape mr_graph_shape(const mr_graph *g, mr_val v) {
    mr_shape s;
    memset(&s, 0, sizeof s);
    return mr_graph_valid(g, v) ? g->vals[v.id].shape : s;
}
mr_val_kind mr_graph_kind(const mr_graph *g, mr_val v) { return mr_graph_valid(g, v) ? g->vals[v.id].kind : MR_VAL_NODE; }
const char *mr_graph_name(const mr_graph *g, mr_val v) { return mr_graph_valid(g, v) ? g->vals[v.id].name : ""; }
int32_t mr_graph_num_params(const mr_graph *g) { return g->nparams; }
mr_val mr_graph_param_at(const mr_graph *g, int32_t i) {
    mr_val v = {(i >= 0 && i < g->nparams) ? g->params[i] : 0};
    return v;
}

mr_val mr_graph_find(const mr_graph *g, const char *name) {
    for (int32_t i = 1; i < g->nvals; i++)
        if ((g->vals[i].kind == MR_VAL_INPUT || g->vals[i].kind == MR_VAL_PARAM) && !strcmp(g->vals[i].name, name))
            return (mr_val){i};
    return MR_VAL_NONE;
}

/* Appends a value record; 0 on out-of-memory (recorded). */
static int32_t push_val(mr_graph *g, mr_val_kind kind, mr_dtype dt, const mr_shape *s, const char *name) {
    if (g->nvals == g->capvals) {
        int32_t cap = g->capvals * 2;
        mr_gval *v = realloc(g->vals, (size_t)cap * sizeof *v);
        if (!v) {
            mr_graph_fail(g, MR_ERR_NOMEM, "graph: out of memory for %d values", cap);
            return 0;
        }
        g->vals = v;
        g->capvals = cap;
    }
    mr_gval *v = &g->vals[g->nvals];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->dtype = dt;
    v->shape = *s;
    v->node = -1;
    v->slot = -1;
    if (name) snprintf(v->name, sizeof v->name, "%s", name);
    return g->nvals++;
}

static mr_status check_leaf(mr_graph *g, const char *what, const char *name, mr_dtype dt, const mr_shape *s) {
    char b[128];
    if (mr_dtype_size(dt) == 0) return mr_graph_fail(g, MR_ERR_INVALID, "graph: %s '%s' has an invalid dtype", what, name);
    if (s->ndim < 0 || s->ndim > MR_MAX_DIMS)
        return mr_graph_fail(g, MR_ERR_INVALID, "graph: %s '%s' has %d dims (at most %d)", what, name, s->ndim, MR_MAX_DIMS);
    for (int i = 0; i < s->ndim; i++)
        if (s->dim[i] < 0)
            return mr_graph_fail(g, MR_ERR_INVALID, "graph: %s '%s' has a negative dim: %s", what, name,
                                 mr_shape_str(s, b, sizeof b));
    return MR_OK;
}

static mr_val named_leaf(mr_graph *g, mr_val_kind kind, const char *name, mr_dtype dt, mr_shape shape) {
    const char *what = kind == MR_VAL_INPUT ? "input" : "param";
    if (g->err != MR_OK) return MR_VAL_NONE;
    if (!name || !*name || strlen(name) >= MR_NAME_MAX) {
        mr_graph_fail(g, MR_ERR_INVALID, "graph: an %s needs a name of 1 to %d characters", what, MR_NAME_MAX - 1);
        return MR_VAL_NONE;
    }
    if (check_leaf(g, what, name, dt, &shape) != MR_OK) return MR_VAL_NONE;
    if (mr_graph_find(g, name).id) {
        mr_graph_fail(g, MR_ERR_INVALID, "graph: the name '%s' is used twice", name);
        return MR_VAL_NONE;
    }
    int32_t id = push_val(g, kind, dt, &shape, name);
    if (id && kind == MR_VAL_PARAM) {
        if (g->nparams == g->capparams) {
            int32_t cap = g->capparams ? g->capparams * 2 : 16;
            int32_t *p = realloc(g->params, (size_t)cap * sizeof *p);
            if (!p) {
                mr_graph_fail(g, MR_ERR_NOMEM, "graph: out of memory");
                return MR_VAL_NONE;
            }
            g->params = p;
            g->capparams = cap;
        }
        g->params[g->nparams++] = id;
    }
    return (mr_val){id};
}

mr_val mr_graph_input(mr_graph *g, const char *name, mr_dtype dt, mr_shape shape) {
    return named_leaf(g, MR_VAL_INPUT, name, dt, shape);
}

mr_val mr_graph_param(mr_graph *g, const char *name, mr_dtype dt, mr_shape shape) {
    return named_leaf(g, MR_VAL_PARAM, name, dt, shape);
}

static mr_val const_leaf(mr_graph *g, mr_dtype dt, mr_shape shape, const void *data, int fill, double v) {
    if (g->err != MR_OK) return MR_VAL_NONE;
    if (check_leaf(g, "constant", "", dt, &shape) != MR_OK) return MR_VAL_NONE;
    int64_t n = mr_shape_numel(&shape);
    size_t bytes = (size_t)n * mr_dtype_size(dt);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        mr_graph_fail(g, MR_ERR_NOMEM, "graph: out of memory for a %zu-byte constant", bytes);
        return MR_VAL_NONE;
    }
    if (fill)
        for (int64_t i = 0; i < n; i++) mr_dtype_set(buf, dt, i, v);
    else if (bytes)
        memcpy(buf, data, bytes);
    int32_t id = push_val(g, MR_VAL_CONST, dt, &shape, NULL);
    if (!id) {
        free(buf);
        return MR_VAL_NONE;
    }
    g->vals[id].cdata = buf;
    return (mr_val){id};
}

mr_val mr_graph_fill(mr_graph *g, mr_dtype dt, mr_shape shape, double v) { return const_leaf(g, dt, shape, NULL, 1, v); }

mr_val mr_graph_const(mr_graph *g, mr_dtype dt, mr_shape shape, const void *data) {
    return const_leaf(g, dt, shape, data, 0, 0.0);
}

mr_status mr_graph_node(mr_graph *g, mr_op_id op, const mr_val *in, int n_in, const mr_op_params *p,
                        const int *out_dtypes, const mr_shape *out_shapes, int n_out, mr_val *outs) {
    for (int i = 0; outs && i < n_out; i++) outs[i] = MR_VAL_NONE;
    if (g->err != MR_OK) return g->err;
    const mr_op_info *info = mr_op_get(op);
    if (!info) return mr_graph_fail(g, MR_ERR_INVALID, "graph: invalid op id %d", (int)op);
    if (n_in != info->n_in || n_out != info->n_out)
        return mr_graph_fail(g, MR_ERR_INVALID, "graph: %s takes %d inputs and %d outputs, got %d and %d", info->name,
                             info->n_in, info->n_out, n_in, n_out);
    mr_op_args a;
    mr_op_args_init(&a, op);
    if (p) a.p = *p;
    for (int i = 0; i < n_in; i++) {
        if (in[i].id == 0) continue;
        if (!mr_graph_valid(g, in[i]))
            return mr_graph_fail(g, MR_ERR_INVALID, "graph: %s: in[%d] is not a value of this graph", info->name, i);
        a.in[i] = (mr_view){g_placeholder, g->vals[in[i].id].dtype, g->vals[in[i].id].shape};
    }
    for (int i = 0; i < n_out; i++) {
        if (out_dtypes[i] < 0) continue;
        a.out[i] = (mr_view){g_placeholder, (mr_dtype)out_dtypes[i], out_shapes[i]};
    }
    mr_status st = info->check(&a);
    if (st != MR_OK) return mr_graph_fail(g, st, "graph: %s", mr_last_error());
    if (g->nnodes == g->capnodes) {
        int32_t cap = g->capnodes ? g->capnodes * 2 : 64;
        mr_gnode *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return mr_graph_fail(g, MR_ERR_NOMEM, "graph: out of memory for %d nodes", cap);
        g->nodes = nn;
        g->capnodes = cap;
    }
    mr_gnode *nd = &g->nodes[g->nnodes];
    memset(nd, 0, sizeof *nd);
    nd->op = op;
    nd->n_in = n_in;
    nd->n_out = n_out;
    nd->p = a.p;
    for (int i = 0; i < n_in; i++) nd->in[i] = in[i].id;
    for (int i = 0; i < n_out; i++) {
        if (out_dtypes[i] < 0) continue;
        int32_t id = push_val(g, MR_VAL_NODE, (mr_dtype)out_dtypes[i], &out_shapes[i], NULL);
        if (!id) return g->err;
        g->vals[id].node = g->nnodes;
        g->vals[id].slot = i;
        g->nodes[g->nnodes].out[i] = id; /* g->nodes may not move here: push_val touches vals only */
        if (outs) outs[i] = (mr_val){id};
    }
    g->nnodes++;
    return MR_OK;
}

/* ---- typed builders --------------------------------------------------------------------------- */

static int ok_val(mr_graph *g, mr_val v, const char *op, const char *role) {
    if (g->err != MR_OK) return 0;
    if (!mr_graph_valid(g, v)) {
        mr_graph_fail(g, MR_ERR_INVALID, "graph: %s: %s is not a value of this graph", op, role);
        return 0;
    }
    if (g->vals[v.id].kind == MR_VAL_FUSED) {
        mr_graph_fail(g, MR_ERR_INVALID,
                      "graph: %s: %s (value %d) is a conv output that mr_graph_fuse_conv_pool fused into its max "
                      "pool; HINT: build every reader of it before fusing",
                      op, role, (int)v.id);
        return 0;
    }
    return 1;
}

/* One node with one float output of x's dtype. */
static mr_val node1(mr_graph *g, mr_op_id op, const mr_val *in, int n_in, const mr_op_params *p, mr_dtype dt,
                    mr_shape s) {
    int d = (int)dt;
    mr_val out = MR_VAL_NONE;
    mr_graph_node(g, op, in, n_in, p, &d, &s, 1, &out);
    return out;
}

void mr_graph_set_allow_tf32(mr_graph *g, int on) { g->allow_tf32 = on != 0; }

/* One GEMM node: in[0..3) = {A, B, bias or none}; out 0 of dtype dt and shape sc, and with
 * GELU the pre-activation (same dtype and shape) as out 1, which the backward reads. Returns
 * out 0. */
static mr_val gemm_node(mr_graph *g, const mr_val *in, int trans_a, int trans_b, double alpha, int epilogue,
                        mr_dtype dt, mr_shape sc) {
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.gemm = (mr_gemm_params){trans_a, trans_b, alpha, 0.0, epilogue, g->allow_tf32};
    int d[2] = {(int)dt, epilogue == MR_GEMM_EPI_GELU ? (int)dt : -1};
    mr_shape os[2] = {sc, sc};
    mr_val out[2] = {MR_VAL_NONE, MR_VAL_NONE};
    mr_graph_node(g, MR_OP_GEMM, in, 3, &p, d, os, 2, out);
    return out[0];
}

mr_val mr_graph_matmul(mr_graph *g, mr_val a, mr_val b, int trans_a, int trans_b, double alpha) {
    if (!ok_val(g, a, "matmul", "A") || !ok_val(g, b, "matmul", "B")) return MR_VAL_NONE;
    mr_shape sa = g->vals[a.id].shape, sb = g->vals[b.id].shape, sc;
    char b1[128], b2[128];
    if (sa.ndim < 2 || sb.ndim < 2) {
        mr_graph_fail(g, MR_ERR_INVALID, "graph: gemm: A %s and B %s need at least 2 dims", mr_shape_str(&sa, b1, 128),
                      mr_shape_str(&sb, b2, 128));
        return MR_VAL_NONE;
    }
    sc = sa;
    sc.dim[sa.ndim - 2] = trans_a ? sa.dim[sa.ndim - 1] : sa.dim[sa.ndim - 2];
    sc.dim[sa.ndim - 1] = trans_b ? sb.dim[sb.ndim - 2] : sb.dim[sb.ndim - 1];
    mr_val in[3] = {a, b, MR_VAL_NONE};
    /* half inputs accumulate and write f32 (mixed precision) */
    mr_dtype dt = g->vals[a.id].dtype;
    if (dt == MR_BF16 || dt == MR_F16) dt = MR_F32;
    return gemm_node(g, in, trans_a, trans_b, alpha, MR_GEMM_EPI_NONE, dt, sc);
}

mr_val mr_graph_linear(mr_graph *g, mr_val x, mr_val w, mr_val bias, int gelu) {
    if (!ok_val(g, x, "linear", "x") || !ok_val(g, w, "linear", "w")) return MR_VAL_NONE;
    if (bias.id != 0 && !ok_val(g, bias, "linear", "bias")) return MR_VAL_NONE;
    mr_shape sx = g->vals[x.id].shape, sw = g->vals[w.id].shape;
    if (sx.ndim < 1 || sw.ndim != 2) {
        char b1[128], b2[128];
        mr_graph_fail(g, MR_ERR_INVALID, "graph: linear: x %s must be (...,K) and w %s (N,K)",
                      mr_shape_str(&sx, b1, 128), mr_shape_str(&sw, b2, 128));
        return MR_VAL_NONE;
    }
    /* x (...,K) as rows (R,K) (a view): one 2-d GEMM, its result viewed back as (...,N) */
    int64_t k = sx.dim[sx.ndim - 1], rows = 1;
    for (int i = 0; i < sx.ndim - 1; i++) rows *= sx.dim[i];
    mr_val x2 = sx.ndim == 2 ? x : mr_graph_reshape(g, x, mr_shape_2d(rows, k));
    mr_shape sy = sx;
    sy.dim[sy.ndim - 1] = sw.dim[0];
    mr_val in[3] = {x2, w, bias};
    mr_dtype dt = g->vals[x.id].dtype;
    if (dt == MR_BF16 || dt == MR_F16) dt = MR_F32;
    mr_val y = gemm_node(g, in, 0, 1, 1.0, gelu ? MR_GEMM_EPI_GELU : MR_GEMM_EPI_NONE, dt,
                         mr_shape_2d(rows, sw.dim[0]));
    return sx.ndim == 2 ? y : mr_graph_reshape(g, y, sy);
}

static mr_val binary(mr_graph *g, mr_op_id op, const char *name, mr_val a, mr_val b) {
    if (!ok_val(g, a, name, "a") || !ok_val(g, b, name, "b")) return MR_VAL_NONE;
    mr_shape s;
    if (mr_shape_broadcast(&g->vals[a.id].shape, &g->vals[b.id].shape, &s) != MR_OK) {
        mr_graph_fail(g, MR_ERR_INVALID, "graph: %s: %s", name, mr_last_error());
        return MR_VAL_NONE;
    }
    mr_val in[2] = {a, b};
    return node1(g, op, in, 2, NULL, g->vals[a.id].dtype, s);
}

mr_val mr_graph_add(mr_graph *g, mr_val a, mr_val b) { return binary(g, MR_OP_ADD, "add", a, b); }
mr_val mr_graph_sub(mr_graph *g, mr_val a, mr_val b) { return binary(g, MR_OP_SUB, "sub", a, b); }
mr_val mr_graph_mul(mr_graph *g, mr_val a, mr_val b) { return binary(g, MR_OP_MUL, "mul", a, b); }
mr_val mr_graph_div(mr_graph *g, mr_val a, mr_val b) { return binary(g, MR_OP_DIV, "div", a, b); }

mr_val mr_graph_unary(mr_graph *g, mr_op_id op, mr_val x) {
    if (!ok_val(g, x, "unary", "x")) return MR_VAL_NONE;
    if (op < MR_OP_RELU || op > MR_OP_SCALE) {
        mr_graph_fail(g, MR_ERR_INVALID, "graph: op %d is not a unary op", (int)op);
        return MR_VAL_NONE;
    }
    return node1(g, op, &x, 1, NULL, g->vals[x.id].dtype, g->vals[x.id].shape);
}

mr_val mr_graph_scale(mr_graph *g, mr_val x, double alpha) {
    if (!ok_val(g, x, "scale", "x")) return MR_VAL_NONE;
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.scale = alpha;
    return node1(g, MR_OP_SCALE, &x, 1, &p, g->vals[x.id].dtype, g->vals[x.id].shape);
}

static mr_val reduce(mr_graph *g, mr_op_id op, const char *name, mr_val x, uint32_t axes) {
    if (!ok_val(g, x, name, "x")) return MR_VAL_NONE;
    mr_shape s = g->vals[x.id].shape;
    for (int i = 0; i < s.ndim; i++)
        if (axes & (1u << i)) s.dim[i] = 1;
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.reduce.axes = axes;
    return node1(g, op, &x, 1, &p, g->vals[x.id].dtype, s);
}

mr_val mr_graph_sum(mr_graph *g, mr_val x, uint32_t axes) { return reduce(g, MR_OP_SUM, "sum", x, axes); }
mr_val mr_graph_mean(mr_graph *g, mr_val x, uint32_t axes) { return reduce(g, MR_OP_MEAN, "mean", x, axes); }
mr_val mr_graph_max(mr_graph *g, mr_val x, uint32_t axes) { return reduce(g, MR_OP_MAX, "max", x, axes); }

mr_val mr_graph_softmax(mr_graph *g, mr_val x) {
    if (!ok_val(g, x, "softmax", "x")) return MR_VAL_NONE;
    return node1(g, MR_OP_SOFTMAX, &x, 1, NULL, g->vals[x.id].dtype, g->vals[x.id].shape);
}

mr_val mr_graph_causal_softmax(mr_graph *g, mr_val x) {
    if (!ok_val(g, x, "softmax", "x")) return MR_VAL_NONE;
    return mr_graph_causal_softmax_to(g, x, g->vals[x.id].dtype);
}

mr_val mr_graph_causal_softmax_to(mr_graph *g, mr_val x, mr_dtype dt) {
    if (!ok_val(g, x, "softmax", "x")) return MR_VAL_NONE;
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.softmax.causal = 1;
    return node1(g, MR_OP_SOFTMAX, &x, 1, &p, dt, g->vals[x.id].shape);
}

mr_val mr_graph_log_softmax(mr_graph *g, mr_val x) {
    if (!ok_val(g, x, "log_softmax", "x")) return MR_VAL_NONE;
    return node1(g, MR_OP_LOG_SOFTMAX, &x, 1, NULL, g->vals[x.id].dtype, g->vals[x.id].shape);
}

mr_val mr_graph_softmax_xent(mr_graph *g, mr_val logits, mr_val labels, int64_t ignore_index) {
    if (!ok_val(g, logits, "softmax_xent", "logits") || !ok_val(g, labels, "softmax_xent", "labels")) return MR_VAL_NONE;
    mr_shape s = g->vals[logits.id].shape;
    mr_shape sl = mr_shape_1d(s.ndim > 0 ? s.dim[0] : 0);
    int d[2] = {(int)g->vals[logits.id].dtype, (int)g->vals[logits.id].dtype};
    mr_shape os[2] = {sl, s};
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.xent.ignore_index = ignore_index;
    mr_val in[2] = {logits, labels}, out[2];
    mr_graph_node(g, MR_OP_SOFTMAX_XENT, in, 2, &p, d, os, 2, out);
    return out[0];
}

mr_val mr_graph_attention(mr_graph *g, mr_val q, mr_val k, mr_val v, double scale, int causal) {
    if (!ok_val(g, q, "attention", "q") || !ok_val(g, k, "attention", "k") || !ok_val(g, v, "attention", "v"))
        return MR_VAL_NONE;
    mr_shape s = g->vals[q.id].shape, sr = s;
    if (sr.ndim > 0) sr.dim[--sr.ndim] = 0;
    mr_dtype dt = g->vals[q.id].dtype;
    int d[2] = {(int)dt, (int)(dt == MR_F64 ? MR_F64 : MR_F32)};
    mr_shape os[2] = {s, sr};
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.attention.scale = scale;
    p.attention.causal = causal;
    mr_val in[3] = {q, k, v}, out[2];
    mr_graph_node(g, MR_OP_ATTENTION, in, 3, &p, d, os, 2, out);
    return out[0];
}

mr_val mr_graph_layernorm(mr_graph *g, mr_val x, mr_val gamma, mr_val beta, double eps) {
    if (!ok_val(g, x, "layernorm", "x")) return MR_VAL_NONE;
    mr_shape s = g->vals[x.id].shape, sr = s;
    if (sr.ndim > 0) sr.dim[--sr.ndim] = 0;
    int dt = (int)g->vals[x.id].dtype;
    int d[3] = {dt, dt, dt};
    mr_shape os[3] = {s, sr, sr};
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.layernorm.eps = eps;
    mr_val in[3] = {x, gamma, beta}, out[3];
    mr_graph_node(g, MR_OP_LAYERNORM, in, 3, &p, d, os, 3, out);
    return out[0];
}

mr_val mr_graph_batchnorm(mr_graph *g, mr_val x, mr_val gamma, mr_val beta, mr_val running_mean,
                          mr_val running_var, double eps, int training, mr_val *mean, mr_val *var) {
    if (mean) *mean = MR_VAL_NONE;
    if (var) *var = MR_VAL_NONE;
    if (!ok_val(g, x, "batchnorm", "x")) return MR_VAL_NONE;
    mr_shape s = g->vals[x.id].shape;
    mr_shape sc = mr_shape_1d(s.ndim >= 2 ? s.dim[1] : 0);
    int dt = (int)g->vals[x.id].dtype;
    /* evaluation leaves the mean and var outputs out: they would only copy the running ones */
    int d[3] = {dt, training ? dt : -1, training ? dt : -1};
    mr_shape os[3] = {s, sc, sc};
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.batchnorm.eps = eps;
    p.batchnorm.training = training ? 1 : 0;
    mr_val in[5] = {x, gamma, beta, training ? MR_VAL_NONE : running_mean, training ? MR_VAL_NONE : running_var};
    mr_val out[3];
    if (mr_graph_node(g, MR_OP_BATCHNORM, in, 5, &p, d, os, 3, out) != MR_OK) return MR_VAL_NONE;
    if (mean) *mean = out[1];
    if (var) *var = out[2];
    return out[0];
}

mr_val mr_graph_embedding(mr_graph *g, mr_val table, mr_val ids) {
    if (!ok_val(g, table, "embedding", "table") || !ok_val(g, ids, "embedding", "ids")) return MR_VAL_NONE;
    mr_shape s = g->vals[ids.id].shape, st = g->vals[table.id].shape;
    if (s.ndim >= MR_MAX_DIMS || st.ndim != 2) {
        mr_graph_fail(g, MR_ERR_INVALID, "graph: embedding: table must be (V,D) and ids have fewer than %d dims",
                      MR_MAX_DIMS);
        return MR_VAL_NONE;
    }
    s.dim[s.ndim++] = st.dim[1];
    mr_val in[2] = {table, ids};
    return node1(g, MR_OP_EMBEDDING, in, 2, NULL, g->vals[table.id].dtype, s);
}

mr_val mr_graph_conv2d(mr_graph *g, mr_val x, mr_val w, mr_val bias, int stride, int pad) {
    if (!ok_val(g, x, "conv2d", "x") || !ok_val(g, w, "conv2d", "w")) return MR_VAL_NONE;
    mr_shape sx = g->vals[x.id].shape, sw = g->vals[w.id].shape;
    if (sx.ndim != 4 || sw.ndim != 4 || stride <= 0) {
        char b1[128], b2[128];
        mr_graph_fail(g, MR_ERR_INVALID, "graph: conv2d: x %s must be (N,C,H,W), w %s (O,C,KH,KW), stride %d > 0",
                      mr_shape_str(&sx, b1, 128), mr_shape_str(&sw, b2, 128), stride);
        return MR_VAL_NONE;
    }
    mr_shape sy = mr_shape_4d(sx.dim[0], sw.dim[0], (sx.dim[2] + 2 * pad - sw.dim[2]) / stride + 1,
                              (sx.dim[3] + 2 * pad - sw.dim[3]) / stride + 1);
    mr_op_params p;
    memset(&p, 0, sizeof p);
    /* a bf16 weight makes it mixed precision (CPU, core/ops.h MR_OP_CONV2D): x (f32 or bf16) is
     * rounded to bf16 in the kernel, sums and y are f32 */
    int mixed = g->vals[w.id].dtype == MR_BF16;
    p.conv = (mr_conv_params){stride, stride, pad, pad, mixed, 0, 0};
    mr_val in[3] = {x, w, bias};
    mr_dtype dt = mixed ? MR_F32 : g->vals[x.id].dtype;
    return node1(g, MR_OP_CONV2D, in, 3, &p, dt, sy);
}

mr_val mr_graph_relu_after_conv(mr_graph *g, mr_val x) {
    if (g->err == MR_OK && g->nnodes > 0 && x.id != 0) {
        mr_gnode *nd = &g->nodes[g->nnodes - 1];
        if (nd->op == MR_OP_CONV2D && nd->out[0] == x.id && !nd->p.conv.relu) {
            nd->p.conv.relu = 1;
            return x;
        }
    }
    return mr_graph_unary(g, MR_OP_RELU, x);
}

/* A pool's output shape and params (one window geometry for both dims); 0 with the graph's error
 * set when x is not (N,C,H,W) or the stride is not positive. */
static int pool_geometry(mr_graph *g, mr_val x, const char *op, int kernel, int stride, int pad, mr_shape *sy,
                         mr_op_params *p) {
    if (!ok_val(g, x, op, "x")) return 0;
    mr_shape sx = g->vals[x.id].shape;
    if (sx.ndim != 4 || stride <= 0) {
        char b1[128];
        mr_graph_fail(g, MR_ERR_INVALID, "graph: %s: x %s must be (N,C,H,W) and stride %d > 0", op,
                      mr_shape_str(&sx, b1, 128), stride);
        return 0;
    }
    *sy = mr_shape_4d(sx.dim[0], sx.dim[1], (sx.dim[2] + 2 * pad - kernel) / stride + 1,
                      (sx.dim[3] + 2 * pad - kernel) / stride + 1);
    memset(p, 0, sizeof *p);
    p->pool = (mr_pool_params){kernel, kernel, stride, stride, pad, pad, 0};
    return 1;
}

mr_val mr_graph_maxpool2d(mr_graph *g, mr_val x, int kernel, int stride, int pad) {
    mr_shape sy;
    mr_op_params p;
    if (!pool_geometry(g, x, "maxpool2d", kernel, stride, pad, &sy, &p)) return MR_VAL_NONE;
    /* x the output of a convolution with a fused ReLU: the pool's argmax carries the ReLU's
     * gradient too (p.pool.relu, core/ops.h MR_OP_MAXPOOL2D), and the conv's rule leaves RELU_BWD
     * out when such pools are all that read x (autodiff/grad.c rule_conv2d) */
    const mr_gval *xv = &g->vals[x.id];
    if (xv->kind == MR_VAL_NODE && xv->slot == 0 && g->nodes[xv->node].op == MR_OP_CONV2D &&
        g->nodes[xv->node].p.conv.relu)
        p.pool.relu = 1;
    int d[2] = {(int)g->vals[x.id].dtype, (int)MR_I32}; /* y and the argmax */
    mr_shape os[2] = {sy, sy};
    mr_val out[2];
    mr_graph_node(g, MR_OP_MAXPOOL2D, &x, 1, &p, d, os, 2, out);
    return out[0];
}

/* Whether the MAXPOOL2D node j and the CONV2D producing its input fuse (mr_graph_fuse_conv_pool);
 * *conv receives the conv's node index. */
static int conv_pool_fusable(const mr_graph *g, int32_t j, const mr_val *keep, int n_keep, int32_t *conv) {
    const mr_gnode *pn = &g->nodes[j];
    const mr_pool_params *pp = &pn->p.pool;
    if (pn->op != MR_OP_MAXPOOL2D || pp->kernel_h != 2 || pp->kernel_w != 2 || pp->stride_h != 2 ||
        pp->stride_w != 2 || pp->pad_h != 0 || pp->pad_w != 0 || !pn->out[0] || !pn->out[1])
        return 0;
    int32_t y = pn->in[0];
    const mr_gval *yv = &g->vals[y];
    if (yv->kind != MR_VAL_NODE || yv->slot != 0) return 0;
    const mr_gnode *cn = &g->nodes[yv->node];
    /* p.conv.relu: a CPU graph (autodiff/nn.c mr_nn_relu); the pool's argmax carries its gradient */
    if (cn->op != MR_OP_CONV2D || !cn->p.conv.relu || !pp->relu || yv->shape.dim[2] < 2 || yv->shape.dim[3] < 2)
        return 0;
    for (int k = 0; k < n_keep; k++)
        if (keep[k].id == y) return 0;
    for (int32_t v = 1; v < g->nvals; v++)
        if (g->vals[v].kind == MR_VAL_VIEW && g->vals[v].base == y) return 0;
    for (int32_t i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] == y && i != j) return 0;
    *conv = yv->node;
    return 1;
}

int mr_graph_fuse_conv_pool(mr_graph *g, const mr_val *keep, int n_keep) {
    if (!g || g->err != MR_OK) return -1;
    int fused = 0;
    for (int32_t j = 0; j < g->nnodes; j++) {
        int32_t i;
        if (!conv_pool_fusable(g, j, keep, n_keep, &i)) continue;
        mr_gnode pool = g->nodes[j];
        mr_gnode *cn = &g->nodes[i];
        /* the conv's node (i < j: it ran before the pool) computes the pool's outputs */
        g->vals[cn->out[0]].kind = MR_VAL_FUSED;
        g->vals[cn->out[0]].node = -1;
        cn->op = MR_OP_CONV2D_MAXPOOL;
        cn->n_out = 2;
        for (int k = 0; k < 2; k++) {
            cn->out[k] = pool.out[k];
            g->vals[pool.out[k]].node = i;
            g->vals[pool.out[k]].slot = k;
        }
        memmove(&g->nodes[j], &g->nodes[j + 1], (size_t)(g->nnodes - j - 1) * sizeof *g->nodes);
        g->nnodes--;
        for (int32_t v = 1; v < g->nvals; v++)
            if (g->vals[v].kind == MR_VAL_NODE && g->vals[v].node > j) g->vals[v].node--;
        fused++;
        j--;
    }
    return fused;
}

mr_val mr_graph_avgpool2d(mr_graph *g, mr_val x, int kernel, int stride, int pad) {
    mr_shape sy;
    mr_op_params p;
    if (!pool_geometry(g, x, "avgpool2d", kernel, stride, pad, &sy, &p)) return MR_VAL_NONE;
    return node1(g, MR_OP_AVGPOOL2D, &x, 1, &p, g->vals[x.id].dtype, sy);
}

mr_val mr_graph_dropout(mr_graph *g, mr_val x, double prob, uint64_t seed, uint64_t offset) {
    if (!ok_val(g, x, "dropout", "x")) return MR_VAL_NONE;
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.dropout = (mr_dropout_params){prob, seed, offset};
    return node1(g, MR_OP_DROPOUT, &x, 1, &p, g->vals[x.id].dtype, g->vals[x.id].shape);
}

mr_val mr_graph_permute(mr_graph *g, mr_val x, const int *perm) {
    if (!ok_val(g, x, "permute", "x")) return MR_VAL_NONE;
    return mr_graph_permute_to(g, x, perm, g->vals[x.id].dtype);
}

mr_val mr_graph_permute_to(mr_graph *g, mr_val x, const int *perm, mr_dtype dt) {
    if (!ok_val(g, x, "permute", "x")) return MR_VAL_NONE;
    mr_shape sx = g->vals[x.id].shape, sy = sx;
    mr_op_params p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < sx.ndim; i++) {
        if (perm[i] < 0 || perm[i] >= sx.ndim) {
            mr_graph_fail(g, MR_ERR_INVALID, "graph: permute: perm[%d] = %d is outside [0, %d)", i, perm[i], sx.ndim);
            return MR_VAL_NONE;
        }
        p.permute.perm[i] = perm[i];
        sy.dim[i] = sx.dim[perm[i]];
    }
    return node1(g, MR_OP_PERMUTE, &x, 1, &p, dt, sy);
}

mr_val mr_graph_cast(mr_graph *g, mr_val x, mr_dtype dt) {
    if (!ok_val(g, x, "cast", "x")) return MR_VAL_NONE;
    return node1(g, MR_OP_CAST, &x, 1, NULL, dt, g->vals[x.id].shape);
}

mr_val mr_graph_hook(mr_graph *g, mr_val x, const mr_hook *hook) {
    if (!ok_val(g, x, "hook", "x")) return MR_VAL_NONE;
    mr_op_params p;
    memset(&p, 0, sizeof p);
    p.hook.h = hook;
    return node1(g, MR_OP_HOOK, &x, 1, &p, g->vals[x.id].dtype, g->vals[x.id].shape);
}

mr_val mr_graph_slice(mr_graph *g, mr_val x, int64_t offset, mr_shape shape) {
    if (!ok_val(g, x, "slice", "x")) return MR_VAL_NONE;
    mr_shape sx = g->vals[x.id].shape;
    if (check_leaf(g, "view", "", g->vals[x.id].dtype, &shape) != MR_OK) return MR_VAL_NONE;
    int64_t n = mr_shape_numel(&shape), have = mr_shape_numel(&sx);
    if (offset < 0 || offset > have || n > have - offset) {
        char b1[128], b2[128];
        mr_graph_fail(g, MR_ERR_INVALID, "graph: a view %s at element %lld does not fit in %s",
                      mr_shape_str(&shape, b1, 128), (long long)offset, mr_shape_str(&sx, b2, 128));
        return MR_VAL_NONE;
    }
    int32_t id = push_val(g, MR_VAL_VIEW, g->vals[x.id].dtype, &shape, NULL);
    if (!id) return MR_VAL_NONE;
    g->vals[id].base = x.id;
    g->vals[id].view_off = offset;
    return (mr_val){id};
}

mr_val mr_graph_reshape(mr_graph *g, mr_val x, mr_shape shape) {
    if (!ok_val(g, x, "reshape", "x")) return MR_VAL_NONE;
    mr_shape sx = g->vals[x.id].shape;
    if (mr_shape_numel(&sx) != mr_shape_numel(&shape)) {
        char b1[128], b2[128];
        mr_graph_fail(g, MR_ERR_INVALID, "graph: reshape: cannot reshape %s into %s (element counts differ)",
                      mr_shape_str(&sx, b1, 128), mr_shape_str(&shape, b2, 128));
        return MR_VAL_NONE;
    }
    return mr_graph_slice(g, x, 0, shape);
}

mr_val mr_graph_concat(mr_graph *g, const mr_val *xs, int n, mr_shape shape) {
    if (g->err != MR_OK) return MR_VAL_NONE;
    if (n < 1 || n > MR_OP_MAX_IO) {
        mr_graph_fail(g, MR_ERR_INVALID, "graph: concat takes 1 to %d values, got %d", MR_OP_MAX_IO, n);
        return MR_VAL_NONE;
    }
    mr_val in[MR_OP_MAX_IO] = {{0}};
    for (int i = 0; i < n; i++) {
        if (!ok_val(g, xs[i], "concat", "an input")) return MR_VAL_NONE;
        in[i] = xs[i];
    }
    return node1(g, MR_OP_CONCAT, in, MR_OP_MAX_IO, NULL, g->vals[xs[0].id].dtype, shape);
}
