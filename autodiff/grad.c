/* Reverse-mode gradients: mr_graph_grad appends to a graph the backward nodes of a scalar loss
 * with respect to chosen values (graph.h). It computes nothing; the nodes it appends are ordinary
 * nodes (the *_BWD ops of the op table, GEMMs, reshapes, permutes, adds), so mr_plan_new plans
 * and runs them like the forward ones.
 *
 * How: values are created in a topological order (a node's outputs after its inputs, a view
 * after its base), so one pass over the value ids upward finds the values that depend on a
 * param ("needs"), and one pass downward finds the values the loss depends on ("reaches"). Only
 * float values in both sets get gradients. The backward then walks the value ids downward: when
 * it reaches an output of a node, every consumer of that node's outputs (all created later) has
 * already contributed, so the node's output gradients are complete and its rule runs once.
 * Gradients arriving at one value from several consumers are summed with mr_graph_add.
 *
 * One rule per forward op (rule_* below, dispatched by a switch). Each reads the forward node
 * (a copy: building appends to g->nodes, which may move), the gradient of its output 0, and adds
 * the gradients of its active inputs. Errors go through mr_graph_fail, so they are sticky like
 * every build error. */
#include "autodiff/graph_impl.h"

#include <stdlib.h>
#include <string.h>

/* The gradient of a partial view (a slice) of a base value, waiting for the base to be reached. */
typedef struct piece {
    int32_t base, val;
    int64_t off, numel;
} piece;

typedef struct grad_ctx {
    mr_graph *g;
    int32_t nv;      /* values that existed before the call: only these are differentiated */
    uint8_t *active; /* per value id: float, depends on a param, and the loss depends on it */
    int32_t *grad;   /* per value id: accumulated gradient value id, 0 for none yet */
    piece *pieces;
    int32_t npieces, cappieces;
    int32_t loss;   /* the loss's value id */
    int32_t nnodes; /* nodes that existed before the call (the forward's) */
    const mr_val *params; /* the values whose gradients the caller asked for */
    int nparams;
} grad_ctx;

static int is_active(const grad_ctx *c, int32_t v) { return v > 0 && v < c->nv && c->active[v]; }

static mr_dtype vdtype(const grad_ctx *c, int32_t v) { return c->g->vals[v].dtype; }
static mr_shape vshape(const grad_ctx *c, int32_t v) { return c->g->vals[v].shape; }
static mr_val V(int32_t id) { return (mr_val){id}; }

/* Adds gradient gv to value v's accumulated gradient (nothing when v is inactive or gv is none,
 * which only happens after a sticky build error). */
static void acc(grad_ctx *c, int32_t v, mr_val gv) {
    if (!is_active(c, v) || gv.id == 0) return;
    if (c->grad[v] == 0)
        c->grad[v] = gv.id;
    else
        c->grad[v] = mr_graph_add(c->g, V(c->grad[v]), gv).id;
}

/* gv reshaped to value v's shape when it has another shape of the same numel (batched GEMM
 * results whose leading dims are grouped differently from the operand's). */
static mr_val fit(grad_ctx *c, int32_t v, mr_val gv) {
    if (gv.id == 0) return gv;
    mr_shape want = vshape(c, v), have = mr_graph_shape(c->g, gv);
    return mr_shape_eq(&want, &have) ? gv : mr_graph_reshape(c->g, gv, want);
}

/* Appends one node of `op` with inputs in[0..n_in) and params p whose outputs have the dtypes and
 * shapes of the values like[0..n_out), leaving out output i when want[i] is 0; outs[i] receives
 * the values (none where left out). */
static void bwd_node_dt(grad_ctx *c, mr_op_id op, const mr_val *in, int n_in, const mr_op_params *p,
                        const int32_t *like, const int *want, int n_out, mr_val *outs, int dt) {
    int dts[MR_OP_MAX_IO];
    mr_shape shapes[MR_OP_MAX_IO];
    for (int i = 0; i < n_out; i++) {
        dts[i] = want[i] ? (dt >= 0 ? dt : (int)vdtype(c, like[i])) : -1;
        shapes[i] = vshape(c, like[i]);
        outs[i] = MR_VAL_NONE;
    }
    /* a failure is recorded in the graph (sticky) and reported at the end of mr_graph_grad */
    (void)mr_graph_node(c->g, op, in, n_in, p, dts, shapes, n_out, outs);
}

/* bwd_node_dt with the outputs in the dtypes of like[] (dt = -1). */
static void bwd_node(grad_ctx *c, mr_op_id op, const mr_val *in, int n_in, const mr_op_params *p,
                     const int32_t *like, const int *want, int n_out, mr_val *outs) {
    bwd_node_dt(c, op, in, n_in, p, like, want, n_out, outs, -1);
}

/* ---- rules: nd is the forward node, dy the gradient of its output 0 ---------------------------- */

/* Non-zero when something besides the rule about to read it uses gradient value dy: a node reads
 * it, a view of it exists, or it is the gradient the caller asked for of one of the params. */
static int grad_used(const grad_ctx *c, mr_val dy) {
    const mr_graph *g = c->g;
    for (int32_t n = g->vals[dy.id].node + 1; n < g->nnodes; n++)
        for (int i = 0; i < g->nodes[n].n_in; i++)
            if (g->nodes[n].in[i] == dy.id) return 1;
    for (int32_t v = dy.id + 1; v < g->nvals; v++)
        if (g->vals[v].kind == MR_VAL_VIEW && g->vals[v].base == dy.id) return 1;
    for (int i = 0; i < c->nparams; i++)
        if (c->params[i].id > 0 && c->params[i].id < c->nv && c->grad[c->params[i].id] == dy.id) return 1;
    return 0;
}

/* dy in the half type ht for the gradient GEMMs: a CAST, or, when dy comes straight from a
 * SOFTMAX_BWD that reads half probabilities (the CPU's mixed attention, autodiff/nn.c) and nothing
 * else uses dy (grad_used), that node writes ht itself (core/ops.h SOFTMAX_BWD: the same bits as
 * the cast). */
static mr_val half_dc(grad_ctx *c, mr_val dy, mr_dtype ht) {
    mr_graph *g = c->g;
    const mr_gval *v = &g->vals[dy.id];
    if (v->kind == MR_VAL_NODE && v->slot == 0 && v->dtype == MR_F32) {
        const mr_gnode *pn = &g->nodes[v->node];
        const mr_dtype yt = pn->op == MR_OP_SOFTMAX_BWD ? g->vals[pn->in[0]].dtype : MR_F32;
        if ((yt == MR_BF16 || yt == MR_F16) && !grad_used(c, dy)) {
            g->vals[dy.id].dtype = ht;
            return dy;
        }
    }
    return mr_graph_cast(g, dy, ht);
}

/* C = epi(alpha * op(A) op(B) + bias), A (...,M,K) or (...,K,M), B (K,N) / (N,K) or batched
 * like A, bias (N) optional, epi the identity or GELU. With GELU the gradient first goes through
 * it, dpre = GELU_BWD(pre, dC), pre being the node's saved output 1; the bias then gets dpre
 * summed over every leading row, and A and B get the GEMMs below with dC := dpre.
 * Per batch: dA = alpha * dC op(B)^T (transposed back when trans_a), dB = alpha * op(A)^T dC
 * (transposed back when trans_b). A 2-d B shared by a batched A gets the sum over the batch: with
 * A not transposed that is one 2-d GEMM over A and dC with the batch folded into the rows.
 * The gradient GEMMs inherit the forward node's allow_tf32. */
static void rule_gemm(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_graph *g = c->g;
    const mr_gemm_params *p = &nd->p.gemm;
    int32_t a = nd->in[0], b = nd->in[1], bias = nd->in[2];
    int ta = p->trans_a, tb = p->trans_b;
    double al = p->alpha;
    if (p->beta != 0.0) {
        mr_graph_fail(g, MR_ERR_INVALID, "mr_graph_grad: gemm with beta %g has no gradient rule", p->beta);
        return;
    }
    int32_t pre = 0;
    if (p->epilogue == MR_GEMM_EPI_GELU) {
        pre = nd->out[1];
        if (pre == 0) {
            mr_graph_fail(g, MR_ERR_INVALID,
                          "mr_graph_grad: a gemm with the GELU epilogue needs its pre-activation (output 1) for "
                          "the gradient; build it with mr_graph_linear, which keeps it");
            return;
        }
    }
    const int gemms = is_active(c, a) || is_active(c, b), want_bias = is_active(c, bias);
    /* half operands: the gradient GEMMs take dC in the same half type (f32 results) */
    const mr_dtype ht = vdtype(c, a);
    const int half = ht == MR_BF16 || ht == MR_F16;
    const mr_dtype dyt = mr_graph_dtype(g, dy);
    if ((dyt == MR_F32 || dyt == MR_F64) && (pre || (half && gemms && want_bias))) {
        /* one GEMM_DC pass over dy: the GELU gradient, the bias sum and the half cast together,
         * where GELU_BWD, SUM and CAST would each read dy (and GELU_BWD write dpre) */
        mr_shape sy = mr_graph_shape(g, dy);
        mr_val in[2] = {dy, pre ? V(pre) : MR_VAL_NONE}, outs[2];
        int dts[2] = {gemms ? (int)(half ? ht : dyt) : -1, want_bias ? (int)dyt : -1};
        mr_shape shapes[2] = {sy, mr_shape_1d(sy.dim[sy.ndim - 1])};
        (void)mr_graph_node(g, MR_OP_GEMM_DC, in, 2, NULL, dts, shapes, 2, outs);
        if (want_bias) acc(c, bias, fit(c, bias, outs[1]));
        if (!gemms) return;
        dy = outs[0];
    } else {
        if (pre) {
            mr_val in[3] = {V(pre), MR_VAL_NONE, dy}, dpre;
            int want = 1;
            bwd_node(c, MR_OP_GELU_BWD, in, 3, NULL, &pre, &want, 1, &dpre);
            dy = dpre;
        }
        if (want_bias) {
            /* dbias = dC summed over all leading dims, kept dims reshaped away by fit() */
            mr_shape sy = mr_graph_shape(g, dy);
            uint32_t axes = 0;
            for (int i = 0; i < sy.ndim - 1; i++) axes |= 1u << i;
            acc(c, bias, fit(c, bias, axes ? mr_graph_sum(g, dy, axes) : dy));
        }
        if (!gemms) return;
        if (half) dy = half_dc(c, dy, ht);
    }
    int saved_tf32 = g->allow_tf32;
    g->allow_tf32 = p->allow_tf32;
    mr_val A = V(a), B = V(b);
    mr_shape sa = vshape(c, a), sb = vshape(c, b);
    int shared = sb.ndim == 2 && sa.ndim > 2;
    if (is_active(c, a)) {
        mr_val da;
        if (!ta)
            da = mr_graph_matmul(g, dy, B, 0, !tb, al); /* dC op(B)^T */
        else if (!shared)
            da = tb ? mr_graph_matmul(g, B, dy, 1, 1, al) : mr_graph_matmul(g, B, dy, 0, 1, al);
        else {
            /* a 2-d B cannot be the batched operand: compute dA^T = dC op(B)^T, swap the last two */
            mr_val dat = mr_graph_matmul(g, dy, B, 0, !tb, al);
            int perm[MR_MAX_DIMS];
            for (int i = 0; i < sa.ndim; i++) perm[i] = i;
            perm[sa.ndim - 2] = sa.ndim - 1;
            perm[sa.ndim - 1] = sa.ndim - 2;
            da = mr_graph_permute(g, dat, perm);
        }
        acc(c, a, fit(c, a, da));
    }
    if (is_active(c, b)) {
        mr_val db;
        if (shared && !ta) {
            int64_t rows = 1;
            for (int i = 0; i < sa.ndim - 1; i++) rows *= sa.dim[i];
            mr_shape dys = mr_graph_shape(g, dy);
            mr_val a2 = mr_graph_reshape(g, A, mr_shape_2d(rows, sa.dim[sa.ndim - 1]));
            mr_val dy2 = mr_graph_reshape(g, dy, mr_shape_2d(rows, dys.dim[dys.ndim - 1]));
            db = tb ? mr_graph_matmul(g, dy2, a2, 1, 0, al) : mr_graph_matmul(g, a2, dy2, 1, 0, al);
        } else {
            /* per batch: dB = op(A)^T dC, or dB = dC^T op(A) when B is transposed */
            db = tb ? mr_graph_matmul(g, dy, A, 1, ta, al) : mr_graph_matmul(g, A, dy, !ta, 0, al);
            if (shared) {
                /* sum the per-batch products over the leading dims */
                uint32_t axes = 0;
                for (int i = 0; i < sa.ndim - 2; i++) axes |= 1u << i;
                db = mr_graph_sum(g, db, axes);
            }
        }
        acc(c, b, fit(c, b, db));
    }
    g->allow_tf32 = saved_tf32;
}

/* ADD SUB MUL DIV: one *_BWD node with only the needed input gradients (broadcast dims summed). */
static void rule_binary(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_op_id op = nd->op == MR_OP_ADD ? MR_OP_ADD_BWD
                : nd->op == MR_OP_SUB ? MR_OP_SUB_BWD
                : nd->op == MR_OP_MUL ? MR_OP_MUL_BWD : MR_OP_DIV_BWD;
    mr_val in[3] = {V(nd->in[0]), V(nd->in[1]), dy}, outs[2];
    int want[2] = {is_active(c, nd->in[0]), is_active(c, nd->in[1])};
    if (nd->op == MR_OP_ADD || nd->op == MR_OP_SUB) {
        /* an operand of the output's shape (a residual) gets dy itself (or -dy): no kernel and no
         * copy; only a broadcast operand (a bias) needs the reduction of the *_BWD kernel */
        mr_shape so = vshape(c, nd->out[0]);
        for (int k = 0; k < 2; k++) {
            mr_shape sk = vshape(c, nd->in[k]);
            if (!want[k] || !mr_shape_eq(&sk, &so)) continue;
            acc(c, nd->in[k], (k == 1 && nd->op == MR_OP_SUB) ? mr_graph_scale(c->g, dy, -1.0) : dy);
            want[k] = 0;
        }
        if (!want[0] && !want[1]) return;
    }
    bwd_node(c, op, in, 3, &nd->p, nd->in, want, 2, outs);
    acc(c, nd->in[0], outs[0]);
    acc(c, nd->in[1], outs[1]);
}

/* RELU .. SCALE: *_BWD (x, y, dy) -> dx; the kernel reads x or y as it needs. */
static void rule_unary(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_op_id op = (mr_op_id)(MR_OP_RELU_BWD + (nd->op - MR_OP_RELU));
    mr_val in[3] = {V(nd->in[0]), V(nd->out[0]), dy}, dx;
    int want = 1;
    bwd_node(c, op, in, 3, &nd->p, nd->in, &want, 1, &dx);
    acc(c, nd->in[0], dx);
}

/* SUM, MEAN: (dy) -> dx; MAX: (x, y, dy) -> dx (to the first maximal element). */
static void rule_reduce(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_val dx;
    int want = 1;
    if (nd->op == MR_OP_MAX) {
        mr_val in[3] = {V(nd->in[0]), V(nd->out[0]), dy};
        bwd_node(c, MR_OP_MAX_BWD, in, 3, &nd->p, nd->in, &want, 1, &dx);
    } else {
        bwd_node(c, nd->op == MR_OP_SUM ? MR_OP_SUM_BWD : MR_OP_MEAN_BWD, &dy, 1, &nd->p, nd->in, &want, 1, &dx);
    }
    acc(c, nd->in[0], dx);
}

/* SOFTMAX, LOG_SOFTMAX: (y, dy) -> dx. */
static void rule_softmax(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_val in[2] = {V(nd->out[0]), dy}, dx;
    int want = 1;
    bwd_node(c, nd->op == MR_OP_SOFTMAX ? MR_OP_SOFTMAX_BWD : MR_OP_LOG_SOFTMAX_BWD, in, 2, &nd->p, nd->in, &want, 1,
             &dx);
    acc(c, nd->in[0], dx);
}

/* SOFTMAX_XENT: (probs = forward output 1, labels, dloss) -> dlogits; labels get nothing. */
static void rule_xent(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_val in[3] = {V(nd->out[1]), V(nd->in[1]), dy}, dx;
    int want = 1;
    bwd_node(c, MR_OP_SOFTMAX_XENT_BWD, in, 3, &nd->p, nd->in, &want, 1, &dx);
    acc(c, nd->in[0], dx);
}

/* LAYERNORM: (x, gamma, mean, rstd = forward outputs 1 and 2, dy) -> dx (always produced: the op
 * requires it), dgamma, dbeta (only when needed). */
static void rule_layernorm(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_val in[5] = {V(nd->in[0]), V(nd->in[1]), V(nd->out[1]), V(nd->out[2]), dy}, outs[3];
    int want[3] = {1, is_active(c, nd->in[1]), is_active(c, nd->in[2])};
    bwd_node(c, MR_OP_LAYERNORM_BWD, in, 5, &nd->p, nd->in, want, 3, outs);
    for (int i = 0; i < 3; i++) acc(c, nd->in[i], outs[i]);
}

/* ATTENTION: (q, k, v, y, lse = forward outputs 0 and 1, dy) -> dq, dk, dv (the op writes all
 * three; the gradient of an inactive input is dropped). */
static void rule_attention(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_val in[6] = {V(nd->in[0]), V(nd->in[1]), V(nd->in[2]), V(nd->out[0]), V(nd->out[1]), dy}, outs[3];
    int want[3] = {1, 1, 1};
    bwd_node(c, MR_OP_ATTENTION_BWD, in, 6, &nd->p, nd->in, want, 3, outs);
    for (int i = 0; i < 3; i++) acc(c, nd->in[i], outs[i]);
}

/* BATCHNORM: (dy, x, gamma, mean, var) -> dx, dgamma, dbeta, each only when needed. mean and var
 * are the forward's outputs 1 and 2 in training (BATCHNORM_BWD then differentiates through the
 * batch statistics) and its running_mean and running_var inputs in evaluation (constants). */
static void rule_batchnorm(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    const int training = nd->p.batchnorm.training;
    int32_t x = nd->in[0], gamma = nd->in[1], beta = nd->in[2];
    if (!training && (is_active(c, nd->in[3]) || is_active(c, nd->in[4]))) {
        mr_graph_fail(c->g, MR_ERR_INVALID,
                      "mr_graph_grad: batchnorm in evaluation has no gradient for its running statistics");
        return;
    }
    mr_val in[5] = {dy, V(x), V(gamma), V(training ? nd->out[1] : nd->in[3]), V(training ? nd->out[2] : nd->in[4])};
    mr_val outs[3];
    /* dgamma/dbeta are shaped like gamma/beta; an absent one's slot is left out and `like` unused */
    int32_t like[3] = {x, gamma ? gamma : x, beta ? beta : x};
    int want[3] = {is_active(c, x), is_active(c, gamma), is_active(c, beta)};
    bwd_node(c, MR_OP_BATCHNORM_BWD, in, 5, &nd->p, like, want, 3, outs);
    for (int i = 0; i < 3; i++) acc(c, nd->in[i], outs[i]);
}

/* EMBEDDING: (ids, dy) -> dtable (scatter-add); ids get nothing. */
static void rule_embedding(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_val in[2] = {V(nd->in[1]), dy}, dt;
    int want = 1;
    bwd_node(c, MR_OP_EMBEDDING_BWD, in, 2, &nd->p, nd->in, &want, 1, &dt);
    acc(c, nd->in[0], dt);
}

/* CONV2D: dx from CONV2D_BWD_DATA (w, dy); dw and dbias from CONV2D_BWD_FILTER (x, dy), which
 * always produces dw (the op requires it) and dbias only when the bias needs it. Mixed precision
 * (p.conv.bf16: a bf16 w; autodiff/graph.c) carries over in the params: the kernels round dy to
 * bf16 as they read it, and the gradients come out in f32, the type of the f32 master weight
 * behind w's cast (as for the GEMM, rule_gemm). */
/* 1 when every gradient of value y comes masked by a ReLU already: y is not the loss, no view
 * reads it, and every forward node that reads it is a MAXPOOL2D with p.pool.relu (its argmax
 * drops the windows whose max is not > 0, core/ops.h MR_OP_MAXPOOL2D). */
static int relu_done_by_pools(const grad_ctx *c, int32_t y) {
    const mr_graph *g = c->g;
    if (y == c->loss) return 0;
    for (int32_t v = 1; v < c->nv; v++)
        if (g->vals[v].kind == MR_VAL_VIEW && g->vals[v].base == y) return 0;
    int pools = 0;
    for (int32_t i = 0; i < c->nnodes; i++) {
        const mr_gnode *nd = &g->nodes[i];
        for (int k = 0; k < nd->n_in; k++) {
            if (nd->in[k] != y) continue;
            if (nd->op != MR_OP_MAXPOOL2D || !nd->p.pool.relu) return 0;
            pools++;
        }
    }
    return pools > 0;
}

static void conv_grads(grad_ctx *c, const mr_gnode *nd, mr_val dy, int32_t argmax);

static void rule_conv2d(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    int32_t x = nd->in[0], w = nd->in[1], bias = nd->in[2];
    if (nd->p.conv.relu && (is_active(c, x) || is_active(c, w) || is_active(c, bias)) &&
        !relu_done_by_pools(c, nd->out[0])) {
        /* fused ReLU: dy through RELU_BWD with y as its x (y > 0 exactly where the pre-activation is) */
        mr_val y = V(nd->out[0]), in[3] = {y, y, dy};
        mr_op_params rp;
        memset(&rp, 0, sizeof rp);
        int want = 1;
        bwd_node(c, MR_OP_RELU_BWD, in, 3, &rp, &nd->out[0], &want, 1, &dy);
    }
    conv_grads(c, nd, dy, 0);
}

/* The conv's data and filter gradients from dy of its output (after any ReLU), or (argmax != 0)
 * from the pooled dy of a CONV2D_MAXPOOL and its argmax: p.conv.pool, core/ops.h. */
static void conv_grads(grad_ctx *c, const mr_gnode *nd, mr_val dy, int32_t argmax) {
    int32_t x = nd->in[0], w = nd->in[1], bias = nd->in[2];
    int dt = nd->p.conv.bf16 ? (int)MR_F32 : -1;
    mr_op_params p = nd->p;
    p.conv.pool = argmax != 0;
    if (is_active(c, x)) {
        mr_val in[3] = {V(w), dy, V(argmax)}, dx;
        int want = 1;
        bwd_node_dt(c, MR_OP_CONV2D_BWD_DATA, in, 3, &p, &x, &want, 1, &dx, dt);
        acc(c, x, dx);
    }
    if (is_active(c, w) || is_active(c, bias)) {
        mr_val in[3] = {V(x), dy, V(argmax)}, outs[2];
        /* dbias is shaped like the bias; with no bias its slot is left out and `like` unused */
        int32_t like[2] = {w, bias ? bias : w};
        int want[2] = {1, is_active(c, bias)};
        bwd_node_dt(c, MR_OP_CONV2D_BWD_FILTER, in, 3, &p, like, want, 2, outs, dt);
        acc(c, w, outs[0]);
        acc(c, bias, outs[1]);
    }
}

/* CONV2D_MAXPOOL (autodiff/graph.c mr_graph_fuse_conv_pool): the conv's backward ops on the pooled
 * dy and the argmax (output 1) with p.conv.pool, which scatter dy as MAXPOOL2D_BWD would as they read
 * it (its full-size result is never stored), without RELU_BWD: with p.conv.relu the argmax is -1
 * where the window's max is not > 0 (p.pool.relu's rule, relu_done_by_pools). */
static void rule_conv2d_maxpool(grad_ctx *c, const mr_gnode *nd, mr_val dy) { conv_grads(c, nd, dy, nd->out[1]); }

/* MAXPOOL2D: (argmax = forward output 1, dy) -> dx. */
static void rule_maxpool(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_val in[2] = {V(nd->out[1]), dy}, dx;
    int want = 1;
    bwd_node(c, MR_OP_MAXPOOL2D_BWD, in, 2, &nd->p, nd->in, &want, 1, &dx);
    acc(c, nd->in[0], dx);
}

/* AVGPOOL2D: (dy) -> dx; the forward's values are not needed. */
static void rule_avgpool(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_val dx;
    int want = 1;
    bwd_node(c, MR_OP_AVGPOOL2D_BWD, &dy, 1, &nd->p, nd->in, &want, 1, &dx);
    acc(c, nd->in[0], dx);
}

/* DROPOUT: DROPOUT_BWD with the same params recomputes the mask: (dy) -> dx. */
static void rule_dropout(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_val dx;
    int want = 1;
    bwd_node(c, MR_OP_DROPOUT_BWD, &dy, 1, &nd->p, nd->in, &want, 1, &dx);
    acc(c, nd->in[0], dx);
}

/* PERMUTE: dx = dy permuted by the inverse permutation, in x's dtype (a permute that cast an f32
 * x to a half y may get an f32 dy from the GEMMs that read y, or a half one). */
static void rule_permute(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    int inv[MR_MAX_DIMS] = {0};
    int nd_x = vshape(c, nd->in[0]).ndim;
    for (int i = 0; i < nd_x; i++) inv[nd->p.permute.perm[i]] = i;
    mr_val dx = mr_graph_permute(c->g, dy, inv);
    const mr_dtype want = vdtype(c, nd->in[0]);
    acc(c, nd->in[0], mr_graph_dtype(c->g, dx) == want ? dx : mr_graph_cast(c->g, dx, want));
}

/* CAST: dx = dy cast back to x's dtype. */
/* y = cast(x): dy cast back to x's type; no copy when dy already has it (a mixed-precision GEMM
 * writes its input gradients in f32, the type of the f32 master copy behind the cast). */
static void rule_cast(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    mr_dtype want = vdtype(c, nd->in[0]);
    acc(c, nd->in[0], mr_graph_dtype(c->g, dy) == want ? dy : mr_graph_cast(c->g, dy, want));
}

/* Runs the rule of node ni, whose output gradients are complete. */
/* y = concat(in...): each input's gradient is its slice of dy (a view, no kernel). */
static void rule_concat(grad_ctx *c, const mr_gnode *nd, mr_val dy) {
    int64_t off = 0;
    for (int k = 0; k < nd->n_in; k++) {
        int32_t v = nd->in[k];
        if (!v) continue;
        mr_shape s = vshape(c, v);
        if (is_active(c, v)) acc(c, v, mr_graph_slice(c->g, dy, off, s));
        off += mr_shape_numel(&s);
    }
}

static int cmp_piece(const void *a, const void *b) {
    const piece *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Records the gradient gv of a partial view of `base` at element `off`. */
static void add_piece(grad_ctx *c, int32_t base, int64_t off, mr_val gv) {
    if (gv.id == 0) return;
    if (c->npieces == c->cappieces) {
        int32_t cap = c->cappieces ? c->cappieces * 2 : 16;
        piece *q = realloc(c->pieces, (size_t)cap * sizeof *q);
        if (!q) {
            mr_graph_fail(c->g, MR_ERR_NOMEM, "mr_graph_grad: out of memory");
            return;
        }
        c->pieces = q;
        c->cappieces = cap;
    }
    mr_shape s = mr_graph_shape(c->g, gv);
    c->pieces[c->npieces++] = (piece){base, gv.id, off, mr_shape_numel(&s)};
}

/* The base's gradient from its slices' gradients: the slices in order, zeros where no slice
 * reached, concatenated (in groups of at most MR_OP_MAX_IO) and shaped like the base. */
static void assemble_pieces(grad_ctx *c, int32_t base) {
    /* take this base's pieces out of the list (the others stay, in order) */
    int32_t n = 0, w = 0;
    for (int32_t i = 0; i < c->npieces; i++)
        if (c->pieces[i].base == base) n++;
    if (n == 0) return;
    piece *mine = calloc((size_t)n, sizeof *mine);
    mr_val *parts = calloc((size_t)(2 * n + 1), sizeof *parts);
    if (!mine || !parts) {
        free(mine);
        free(parts);
        mr_graph_fail(c->g, MR_ERR_NOMEM, "mr_graph_grad: out of memory");
        return;
    }
    n = 0;
    for (int32_t i = 0; i < c->npieces; i++) {
        if (c->pieces[i].base == base) mine[n++] = c->pieces[i];
        else c->pieces[w++] = c->pieces[i];
    }
    c->npieces = w;
    qsort(mine, (size_t)n, sizeof *mine, cmp_piece);
    mr_shape bs = vshape(c, base);
    int64_t total = mr_shape_numel(&bs), cur = 0;
    mr_dtype dt = vdtype(c, base);
    int np = 0;
    for (int32_t i = 0; i < n && c->g->err == MR_OK; i++) {
        const piece *q = &mine[i];
        if (q->off < cur) {
            mr_graph_fail(c->g, MR_ERR_INVALID, "mr_graph_grad: overlapping slices of value %d are not supported",
                          (int)base);
            break;
        }
        if (q->off > cur) parts[np++] = mr_graph_fill(c->g, dt, mr_shape_1d(q->off - cur), 0.0);
        parts[np++] = mr_graph_reshape(c->g, V(q->val), mr_shape_1d(q->numel));
        cur = q->off + q->numel;
    }
    if (cur < total && c->g->err == MR_OK) parts[np++] = mr_graph_fill(c->g, dt, mr_shape_1d(total - cur), 0.0);
    /* fold groups of MR_OP_MAX_IO into one until a single concat remains */
    while (np > MR_OP_MAX_IO && c->g->err == MR_OK) {
        int64_t len = 0;
        for (int i = 0; i < MR_OP_MAX_IO; i++) {
            mr_shape s = mr_graph_shape(c->g, parts[i]);
            len += mr_shape_numel(&s);
        }
        parts[0] = mr_graph_concat(c->g, parts, MR_OP_MAX_IO, mr_shape_1d(len));
        memmove(parts + 1, parts + MR_OP_MAX_IO, sizeof *parts * (size_t)(np - MR_OP_MAX_IO));
        np -= MR_OP_MAX_IO - 1;
    }
    if (c->g->err == MR_OK)
        acc(c, base, np == 1 ? mr_graph_reshape(c->g, parts[0], bs) : mr_graph_concat(c->g, parts, np, bs));
    free(parts);
    free(mine);
}

static void backward_node(grad_ctx *c, int32_t ni) {
    mr_gnode nd = c->g->nodes[ni]; /* a copy: building appends to g->nodes */
    const mr_op_info *info = mr_op_get(nd.op);
    const char *name = info ? info->name : "?";
    /* every rule differentiates output 0 only; the other outputs (probs, mean/rstd, mean/var, argmax) are
     * saved state, and a loss that depends on them has no rule here */
    for (int k = 1; k < nd.n_out; k++)
        if (is_active(c, nd.out[k])) {
            mr_graph_fail(c->g, MR_ERR_INVALID,
                          "mr_graph_grad: the loss depends on output %d of node %d (%s); only output 0 of an "
                          "op is differentiated",
                          k, ni, name);
            return;
        }
    if (nd.n_out < 1 || !is_active(c, nd.out[0]) || c->grad[nd.out[0]] == 0) return;
    /* an output that is a requested value itself but depends on no param needs no rule */
    int any_in = 0;
    for (int k = 0; k < nd.n_in; k++) any_in |= is_active(c, nd.in[k]);
    if (!any_in) return;
    mr_val dy = V(c->grad[nd.out[0]]);
    switch (nd.op) {
    case MR_OP_GEMM: rule_gemm(c, &nd, dy); break;
    case MR_OP_ADD: case MR_OP_SUB: case MR_OP_MUL: case MR_OP_DIV: rule_binary(c, &nd, dy); break;
    case MR_OP_RELU: case MR_OP_GELU: case MR_OP_TANH: case MR_OP_SIGMOID: case MR_OP_EXP:
    case MR_OP_LOG: case MR_OP_SQRT: case MR_OP_SCALE: rule_unary(c, &nd, dy); break;
    case MR_OP_SUM: case MR_OP_MEAN: case MR_OP_MAX: rule_reduce(c, &nd, dy); break;
    case MR_OP_SOFTMAX: case MR_OP_LOG_SOFTMAX: rule_softmax(c, &nd, dy); break;
    case MR_OP_SOFTMAX_XENT: rule_xent(c, &nd, dy); break;
    case MR_OP_LAYERNORM: rule_layernorm(c, &nd, dy); break;
    case MR_OP_ATTENTION: rule_attention(c, &nd, dy); break;
    case MR_OP_BATCHNORM: rule_batchnorm(c, &nd, dy); break;
    case MR_OP_EMBEDDING: rule_embedding(c, &nd, dy); break;
    case MR_OP_CONV2D: rule_conv2d(c, &nd, dy); break;
    case MR_OP_MAXPOOL2D: rule_maxpool(c, &nd, dy); break;
    case MR_OP_CONV2D_MAXPOOL: rule_conv2d_maxpool(c, &nd, dy); break;
    case MR_OP_AVGPOOL2D: rule_avgpool(c, &nd, dy); break;
    case MR_OP_DROPOUT: rule_dropout(c, &nd, dy); break;
    case MR_OP_PERMUTE: rule_permute(c, &nd, dy); break;
    case MR_OP_CAST: rule_cast(c, &nd, dy); break;
    case MR_OP_CONCAT: rule_concat(c, &nd, dy); break;
    case MR_OP_HOOK: acc(c, nd.in[0], mr_graph_hook(c->g, dy, nd.p.hook.h)); break; /* self-adjoint */
    default:
        mr_graph_fail(c->g, MR_ERR_INVALID,
                      "mr_graph_grad: op %s (node %d) lies on the path from the params to the loss but has no "
                      "gradient rule",
                      name, ni);
        break;
    }
}

/* Marks the active values: float, reachable forward from a param and backward from the loss. */
static void mark_active(grad_ctx *c, mr_val loss, const mr_val *params, int n, uint8_t *needs) {
    const mr_graph *g = c->g;
    for (int i = 0; i < n; i++) needs[params[i].id] = 1;
    /* upward: a node output needs a gradient when any input does, a view when its base does */
    for (int32_t v = 1; v < c->nv; v++) {
        const mr_gval *gv = &g->vals[v];
        if (gv->kind == MR_VAL_VIEW && needs[gv->base]) needs[v] = 1;
        if (gv->kind == MR_VAL_NODE) {
            const mr_gnode *nd = &g->nodes[gv->node];
            for (int k = 0; k < nd->n_in; k++)
                if (nd->in[k] && needs[nd->in[k]]) needs[v] = 1;
        }
        if (!mr_dtype_is_float(gv->dtype)) needs[v] = 0;
    }
    /* downward: the loss depends on a node's inputs when on any of its outputs, on a view's base */
    c->active[loss.id] = 1;
    for (int32_t v = c->nv - 1; v >= 1; v--) {
        if (!c->active[v]) continue;
        const mr_gval *gv = &g->vals[v];
        if (gv->kind == MR_VAL_VIEW) c->active[gv->base] = 1;
        if (gv->kind == MR_VAL_NODE) {
            const mr_gnode *nd = &g->nodes[gv->node];
            for (int k = 0; k < nd->n_in; k++)
                if (nd->in[k]) c->active[nd->in[k]] = 1;
        }
    }
    for (int32_t v = 1; v < c->nv; v++) c->active[v] = c->active[v] && needs[v];
}

mr_status mr_graph_grad(mr_graph *g, mr_val loss, const mr_val *params, int n, mr_val *grads) {
    if (!g) return mr_set_error(MR_ERR_INVALID, "mr_graph_grad: graph is NULL");
    for (int i = 0; i < n && grads; i++) grads[i] = MR_VAL_NONE;
    if (g->err != MR_OK) return g->err;
    if (n < 0 || (n > 0 && (!params || !grads)))
        return mr_graph_fail(g, MR_ERR_INVALID, "mr_graph_grad: %d params with params %p and grads %p", n,
                             (const void *)params, (void *)grads);
    if (!mr_graph_valid(g, loss))
        return mr_graph_fail(g, MR_ERR_INVALID, "mr_graph_grad: loss (value %d) is not a value of this graph",
                             (int)loss.id);
    const mr_gval *lv = mr_graph_val(g, loss);
    char b1[128];
    if (mr_shape_numel(&lv->shape) != 1 || !mr_dtype_is_float(lv->dtype))
        return mr_graph_fail(g, MR_ERR_INVALID,
                             "mr_graph_grad: the loss %s of dtype %s must be a float scalar (numel 1); reduce it "
                             "with mr_graph_sum or mr_graph_mean",
                             mr_shape_str(&lv->shape, b1, sizeof b1), mr_dtype_name(lv->dtype));
    for (int i = 0; i < n; i++)
        if (!mr_graph_valid(g, params[i]))
            return mr_graph_fail(g, MR_ERR_INVALID, "mr_graph_grad: params[%d] (value %d) is not a value of this graph",
                                 i, (int)params[i].id);

    grad_ctx c = {g, g->nvals, NULL, NULL, NULL, 0, 0, loss.id, g->nnodes, params, n};
    uint8_t *needs = calloc((size_t)c.nv, 1);
    c.active = calloc((size_t)c.nv, 1);
    c.grad = calloc((size_t)c.nv, sizeof *c.grad);
    if (!needs || !c.active || !c.grad) {
        free(needs);
        free(c.active);
        free(c.grad);
        return mr_graph_fail(g, MR_ERR_NOMEM, "mr_graph_grad: out of memory for %d values", (int)c.nv);
    }
    mark_active(&c, loss, params, n, needs);
    free(needs);

    if (c.active[loss.id]) c.grad[loss.id] = mr_graph_fill(g, lv->dtype, lv->shape, 1.0).id;
    /* downward over value ids: see the top of the file for why each node's output gradients are
     * complete when its highest output is reached */
    for (int32_t v = c.nv - 1; v >= 1 && g->err == MR_OK; v--) {
        if (c.active[v] && c.npieces) assemble_pieces(&c, v); /* every slice of v comes later: all in */
        if (!c.active[v] || c.grad[v] == 0) continue;
        mr_gval gv = g->vals[v]; /* a copy: building may move g->vals */
        if (gv.kind == MR_VAL_VIEW) {
            mr_shape bs = g->vals[gv.base].shape;
            if (gv.view_off == 0 && mr_shape_numel(&gv.shape) == mr_shape_numel(&bs))
                acc(&c, gv.base, mr_graph_reshape(g, V(c.grad[v]), bs)); /* a reshape */
            else if (is_active(&c, gv.base))
                add_piece(&c, gv.base, gv.view_off, V(c.grad[v])); /* a slice: assembled at the base */
        } else if (gv.kind == MR_VAL_NODE) {
            /* run the node's rule once, at its highest active output with a gradient */
            const mr_gnode *nd = &g->nodes[gv.node];
            int later = 0;
            for (int k = 0; k < nd->n_out; k++)
                if (nd->out[k] > v && c.active[nd->out[k]] && c.grad[nd->out[k]]) later = 1;
            if (!later) backward_node(&c, gv.node);
        }
    }

    if (g->err == MR_OK)
        for (int i = 0; i < n; i++) {
            int32_t p = params[i].id;
            const mr_gval *pv = &g->vals[p];
            if (!mr_dtype_is_float(pv->dtype)) continue; /* integer values get no gradient */
            grads[i] = c.grad[p] ? V(c.grad[p]) : mr_graph_fill(g, pv->dtype, pv->shape, 0.0);
        }
    free(c.active);
    free(c.grad);
    free(c.pieces);
    if (g->err != MR_OK) {
        for (int i = 0; i < n; i++) grads[i] = MR_VAL_NONE;
        return g->err;
    }
    return MR_OK;
}
