/* Attention (MR_OP_ATTENTION, MR_OP_ATTENTION_BWD) through cuDNN's fused flash attention, the
 * path attention.cu takes for bf16/f16 when cuDNN has an engine for the shape; mirror's kernels
 * (attention.cu) are the fallback and the reference. docs/DESIGN.md "cuDNN attention".
 *
 * The graph: cuDNN 9's fused SDPA engines are reached through the backend graph API with the
 * expanded operation graph cudnn-frontend builds for its sdpa / sdpa_backward nodes (before the
 * unified SDPA operation of cuDNN 9.13+, which has no causal attribute in 9.19's header).
 * Tensors are 4-d (B, H, rows, D) with the batch and heads of mirror's leading dims; K (and V in
 * the backward) are described transposed, (B, H, D, S) with strides (.., .., 1, D), over the same
 * memory. Forward (uids: Q 1, K 2, V 3, O 4, Stats 5):
 *   s = matmul(Q, K^T); s = s * scale;
 *   causal: r = gen_index(s, axis 2) [+ (S - T) for T < S: add S, sub T, in int32];
 *           c = gen_index(s, axis 3); m = cmp_ge(r, c); s = binary_select(s, -FLT_MAX, m);
 *   mx = reduce_max(s over keys); e = exp(s - mx); z = reduce_add(e);
 *   Stats = mx + log(z)   (f32 (B, H, T, 1): exactly mirror's lse, so a forward on one path and
 *                          a backward on the other agree);
 *   P = e / z (in the I/O type); O = matmul(P, V).
 * Backward (uids: also dO 6, dQ 7, dK 8, dV 9):
 *   sum = reduce_add(dO * O) * 1; s and its mask as above; P = exp(s - Stats);
 *   dV = matmul(reshape(P)^T, dO); dP = matmul(dO, V^T) * 1; dS = (dP - sum) * P * scale;
 *   dK = matmul(reshape(dS)^T, Q); dQ = matmul(dS, reshape(K^T)).
 * The scale, -FLT_MAX, 1 and the causal shift are by-value scalars (host pointers in the variant
 * pack). The backward is the frontend's "workspace" variant (dQ written by the matmul, no dQ_accum
 * tensor), the one it picks for deterministic runs.
 *
 * Plans: built once per (pass, device, stream, dtype, B, H, T, S, D, causal), cached for the
 * process (SDPA_PLANS, never evicted). The engine is the first heuristics result (mode A) without
 * the NONDETERMINISTIC numerical note (mirror promises bit-identical reruns) whose execution plan
 * finalizes. Its workspace is the op's (a->workspace) when it fits, else a buffer
 * the plan allocates once when it is built (the first step, before any CUDA graph capture), so a
 * steady step allocates nothing. A shape cuDNN has no engine for (or any failure to build the
 * plan) is cached as such and named once on stderr; those calls run mirror's kernels.
 * MIRROR_CUDNN_SDPA=0 sends every call to mirror's kernels (read per call, to compare the two). */
#include "core/cuda/cuda_impl.h"
#include "core/log.h"
#include "core/ops_impl.h"

#include <stdlib.h>
#include <string.h>

#ifdef MIRROR_HAVE_CUDNN

#include "core/cuda/cudnn_impl.h"

#include <float.h>

namespace {

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV, UID_SCALE, UID_NEG, UID_ONE,
       UID_SHIFT_S, UID_SHIFT_T, UID_VIRTUAL = 100 };
enum { SDPA_FWD = 0, SDPA_BWD = 1, SDPA_PLANS = 64, SDPA_KEY = 10, SDPA_MAX_DESC = 128 };

struct sdpa_dims {
    int64_t b, h, t, s, d;
    int causal;
    cudnnDataType_t io;
};

struct sdpa_plan {
    int64_t key[SDPA_KEY];
    int ok;                      /* 0: no plan for this key (mirror's kernels run) */
    cudnnBackendDescriptor_t plan;
    cudnnBackendDescriptor_t descs[SDPA_MAX_DESC]; /* the graph's, kept while the plan lives */
    int ndescs;
    int64_t ws;                  /* workspace bytes the plan needs */
    void *own_ws;                /* a buffer of ws bytes when the op's workspace is too small */
};

pthread_mutex_t g_sdpa_mu = PTHREAD_MUTEX_INITIALIZER; /* guards g_plans */
sdpa_plan *g_plans[SDPA_PLANS];
int g_nplans;

/* Builds one operation graph: every descriptor made is kept in `all`, destroyed when no plan came
 * of them, else kept with the plan for the process (as cudnn-frontend keeps its graph's). The
 * first failure is kept in `st`. */
struct builder {
    cudnnBackendDescriptor_t all[SDPA_MAX_DESC];
    int nall;
    cudnnBackendDescriptor_t ops[32];
    int nops;
    int64_t next_uid;
    mr_status st;
};

cudnnBackendDescriptor_t make(builder *g, cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = NULL;
    if (g->st != MR_OK) return NULL;
    if (g->nall == SDPA_MAX_DESC) {
        g->st = mr_set_error(MR_ERR_INVALID, "attention: cuDNN graph: too many descriptors");
        return NULL;
    }
    cudnnStatus_t e = cudnnBackendCreateDescriptor(t, &d);
    if (e != CUDNN_STATUS_SUCCESS) {
        g->st = mr_cudnn_error(e, "cudnnBackendCreateDescriptor", __FILE__, __LINE__);
        return NULL;
    }
    g->all[g->nall++] = d;
    return d;
}

void set(builder *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t,
         int64_t count, const void *v) {
    if (g->st != MR_OK) return;
    cudnnStatus_t e = cudnnBackendSetAttribute(d, n, t, count, v);
    if (e != CUDNN_STATUS_SUCCESS) g->st = mr_cudnn_error(e, "cudnnBackendSetAttribute", __FILE__, __LINE__);
}

void fin(builder *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->st != MR_OK) return;
    cudnnStatus_t e = cudnnBackendFinalize(d);
    if (e != CUDNN_STATUS_SUCCESS) g->st = mr_cudnn_error(e, what, __FILE__, __LINE__);
}

/* A 4-d tensor: uid 0 makes a virtual one with the next free uid; by_value: a host scalar. */
cudnnBackendDescriptor_t tensor(builder *g, cudnnDataType_t dt, const int64_t dim[4], const int64_t stride[4],
                                int64_t uid, bool by_value = false) {
    cudnnBackendDescriptor_t d = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    bool virt = uid == 0;
    int64_t align = 16;
    if (virt) uid = g->next_uid++;
    set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride);
    set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    fin(g, d, "cudnnBackendFinalize(tensor)");
    return d;
}

/* A dense virtual tensor (B, H, r, c), f32 unless dt says otherwise. */
cudnnBackendDescriptor_t vt(builder *g, const sdpa_dims &x, int64_t r, int64_t c,
                            cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    const int64_t dim[4] = {x.b, x.h, r, c}, stride[4] = {x.h * r * c, r * c, c, 1};
    return tensor(g, dt, dim, stride, 0);
}

cudnnBackendDescriptor_t scalar(builder *g, cudnnDataType_t dt, int64_t uid) {
    const int64_t one[4] = {1, 1, 1, 1};
    return tensor(g, dt, one, one, uid, true);
}

void add_op(builder *g, cudnnBackendDescriptor_t op) {
    if (g->st != MR_OK) return;
    g->ops[g->nops++] = op;
}

/* y = mode(x[, b[, t]]); axis for gen_index; compute type f32 unless given. */
void pw(builder *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
        cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
        int64_t axis = -1) {
    cudnnBackendDescriptor_t p = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(g, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(g, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) set(g, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    fin(g, p, "cudnnBackendFinalize(pointwise)");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    fin(g, op, "cudnnBackendFinalize(pointwise operation)");
    add_op(g, op);
}

/* c = a b (batched over the first two dims), f32 accumulation */
void matmul(builder *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    fin(g, m, "cudnnBackendFinalize(matmul)");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    fin(g, op, "cudnnBackendFinalize(matmul operation)");
    add_op(g, op);
}

/* y = reduce(x) over the dims where y has 1 */
void reduce(builder *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    fin(g, r, "cudnnBackendFinalize(reduction)");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    fin(g, op, "cudnnBackendFinalize(reduction operation)");
    add_op(g, op);
}

/* y: the same memory as x seen with y's dims and strides (a transpose, here) */
void reshape(builder *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    fin(g, op, "cudnnBackendFinalize(reshape operation)");
    add_op(g, op);
}

/* The scaled, masked scores: s = Q K^T * scale, then the causal mask (bottom-right aligned:
 * key j is seen by row i when i + S - T >= j, mirror's rule, core/ops.h MR_OP_ATTENTION). */
cudnnBackendDescriptor_t scores(builder *g, const sdpa_dims &x, cudnnBackendDescriptor_t q,
                                cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t scale) {
    cudnnBackendDescriptor_t s0 = vt(g, x, x.t, x.s), s1 = vt(g, x, x.t, x.s);
    matmul(g, q, kt, s0);
    pw(g, CUDNN_POINTWISE_MUL, s0, scale, NULL, s1);
    if (!x.causal) return s1;
    cudnnBackendDescriptor_t row = vt(g, x, x.t, x.s, CUDNN_DATA_INT32);
    pw(g, CUDNN_POINTWISE_GEN_INDEX, s1, NULL, NULL, row, CUDNN_DATA_INT32, 2);
    if (x.t != x.s) { /* cudnn-frontend's causal_mask_bottom_right: row + S - T */
        cudnnBackendDescriptor_t r1 = vt(g, x, x.t, x.s, CUDNN_DATA_INT32), r2 = vt(g, x, x.t, x.s, CUDNN_DATA_INT32);
        pw(g, CUDNN_POINTWISE_ADD, row, scalar(g, CUDNN_DATA_INT32, UID_SHIFT_S), NULL, r1, CUDNN_DATA_INT32);
        pw(g, CUDNN_POINTWISE_SUB, r1, scalar(g, CUDNN_DATA_INT32, UID_SHIFT_T), NULL, r2, CUDNN_DATA_INT32);
        row = r2;
    }
    cudnnBackendDescriptor_t col = vt(g, x, x.t, x.s, CUDNN_DATA_INT32);
    cudnnBackendDescriptor_t mask = vt(g, x, x.t, x.s, CUDNN_DATA_BOOLEAN), s2 = vt(g, x, x.t, x.s);
    pw(g, CUDNN_POINTWISE_GEN_INDEX, s1, NULL, NULL, col, CUDNN_DATA_INT32, 3);
    pw(g, CUDNN_POINTWISE_CMP_GE, row, col, NULL, mask, CUDNN_DATA_BOOLEAN);
    pw(g, CUDNN_POINTWISE_BINARY_SELECT, s1, scalar(g, CUDNN_DATA_FLOAT, UID_NEG), mask, s2);
    return s2;
}

void graph_fwd(builder *g, const sdpa_dims &x) {
    const int64_t qd[4] = {x.b, x.h, x.t, x.d}, qs[4] = {x.h * x.t * x.d, x.t * x.d, x.d, 1};
    const int64_t ktd[4] = {x.b, x.h, x.d, x.s}, kts[4] = {x.h * x.s * x.d, x.s * x.d, 1, x.d};
    const int64_t vd[4] = {x.b, x.h, x.s, x.d}, vs[4] = {x.h * x.s * x.d, x.s * x.d, x.d, 1};
    const int64_t ld[4] = {x.b, x.h, x.t, 1}, ls[4] = {x.h * x.t, x.t, 1, 1};
    cudnnBackendDescriptor_t q = tensor(g, x.io, qd, qs, UID_Q), kt = tensor(g, x.io, ktd, kts, UID_K);
    cudnnBackendDescriptor_t v = tensor(g, x.io, vd, vs, UID_V), o = tensor(g, x.io, qd, qs, UID_O);
    cudnnBackendDescriptor_t stats = tensor(g, CUDNN_DATA_FLOAT, ld, ls, UID_STATS);
    cudnnBackendDescriptor_t s = scores(g, x, q, kt, scalar(g, CUDNN_DATA_FLOAT, UID_SCALE));
    cudnnBackendDescriptor_t mx = vt(g, x, x.t, 1), sub = vt(g, x, x.t, x.s), e = vt(g, x, x.t, x.s);
    cudnnBackendDescriptor_t z = vt(g, x, x.t, 1), lz = vt(g, x, x.t, 1), p = vt(g, x, x.t, x.s, x.io);
    reduce(g, CUDNN_REDUCE_TENSOR_MAX, s, mx);
    pw(g, CUDNN_POINTWISE_SUB, s, mx, NULL, sub);
    pw(g, CUDNN_POINTWISE_EXP, sub, NULL, NULL, e);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    pw(g, CUDNN_POINTWISE_LOG, z, NULL, NULL, lz);
    pw(g, CUDNN_POINTWISE_ADD, mx, lz, NULL, stats);
    pw(g, CUDNN_POINTWISE_DIV, e, z, NULL, p);
    matmul(g, p, v, o);
}

void graph_bwd(builder *g, const sdpa_dims &x) {
    const int64_t qd[4] = {x.b, x.h, x.t, x.d}, qs[4] = {x.h * x.t * x.d, x.t * x.d, x.d, 1};
    const int64_t ktd[4] = {x.b, x.h, x.d, x.s}, kts[4] = {x.h * x.s * x.d, x.s * x.d, 1, x.d};
    const int64_t kd[4] = {x.b, x.h, x.s, x.d}, ks[4] = {x.h * x.s * x.d, x.s * x.d, x.d, 1};
    const int64_t ld[4] = {x.b, x.h, x.t, 1}, ls[4] = {x.h * x.t, x.t, 1, 1};
    const int64_t td[4] = {x.b, x.h, x.s, x.t}, ts[4] = {x.h * x.t * x.s, x.t * x.s, 1, x.s}; /* P^T over P */
    cudnnBackendDescriptor_t q = tensor(g, x.io, qd, qs, UID_Q), kt = tensor(g, x.io, ktd, kts, UID_K);
    cudnnBackendDescriptor_t vt_ = tensor(g, x.io, ktd, kts, UID_V), o = tensor(g, x.io, qd, qs, UID_O);
    cudnnBackendDescriptor_t stats = tensor(g, CUDNN_DATA_FLOAT, ld, ls, UID_STATS);
    cudnnBackendDescriptor_t dout = tensor(g, x.io, qd, qs, UID_DO), dq = tensor(g, x.io, qd, qs, UID_DQ);
    cudnnBackendDescriptor_t dk = tensor(g, x.io, kd, ks, UID_DK), dv = tensor(g, x.io, kd, ks, UID_DV);
    cudnnBackendDescriptor_t scale = scalar(g, CUDNN_DATA_FLOAT, UID_SCALE), one = scalar(g, CUDNN_DATA_FLOAT, UID_ONE);
    /* sum_i = (dO_i . O_i) * 1 */
    cudnnBackendDescriptor_t doo = vt(g, x, x.t, x.d), r = vt(g, x, x.t, 1), sum = vt(g, x, x.t, 1);
    pw(g, CUDNN_POINTWISE_MUL, dout, o, NULL, doo);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, doo, r);
    pw(g, CUDNN_POINTWISE_MUL, r, one, NULL, sum);
    /* P = exp(s - Stats); dV = P^T dO */
    cudnnBackendDescriptor_t s = scores(g, x, q, kt, scale);
    cudnnBackendDescriptor_t sm = vt(g, x, x.t, x.s), p = vt(g, x, x.t, x.s), pt = tensor(g, x.io, td, ts, 0);
    pw(g, CUDNN_POINTWISE_SUB, s, stats, NULL, sm);
    pw(g, CUDNN_POINTWISE_EXP, sm, NULL, NULL, p);
    reshape(g, p, pt);
    matmul(g, pt, dout, dv);
    /* dS = (dO V^T * 1 - sum) * P * scale; dK = dS^T Q; dQ = dS K */
    cudnnBackendDescriptor_t dp = vt(g, x, x.t, x.s), dp1 = vt(g, x, x.t, x.s), dp2 = vt(g, x, x.t, x.s);
    cudnnBackendDescriptor_t dp3 = vt(g, x, x.t, x.s), ds = vt(g, x, x.t, x.s), dst = tensor(g, x.io, td, ts, 0);
    matmul(g, dout, vt_, dp);
    pw(g, CUDNN_POINTWISE_MUL, dp, one, NULL, dp1);
    pw(g, CUDNN_POINTWISE_SUB, dp1, sum, NULL, dp2);
    pw(g, CUDNN_POINTWISE_MUL, dp2, p, NULL, dp3);
    pw(g, CUDNN_POINTWISE_MUL, dp3, scale, NULL, ds);
    reshape(g, ds, dst);
    matmul(g, dst, q, dk);
    cudnnBackendDescriptor_t k = tensor(g, x.io, kd, ks, 0);
    reshape(g, kt, k);
    matmul(g, ds, k, dq);
}

/* The execution plan of the graph for pass `pass`, or the reason there is none (g->st). */
mr_status plan_build(cudnnHandle_t h, int pass, const sdpa_dims &x, sdpa_plan *out) {
    builder g;
    memset(&g, 0, sizeof g);
    g.next_uid = UID_VIRTUAL;
    g.st = MR_OK;
    cudnnBackendDescriptor_t plan = NULL, heur = NULL, graph = NULL;
    cudnnBackendDescriptor_t cfgs[8] = {NULL};
    int64_t ncfg = 0;
    int64_t *ws = &out->ws;
    out->plan = NULL;
    if (pass == SDPA_FWD) graph_fwd(&g, x);
    else graph_bwd(&g, x);
    graph = make(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops);
    set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    fin(&g, graph, "cudnnBackendFinalize(operation graph)");
    heur = make(&g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(&g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    set(&g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    fin(&g, heur, "cudnnBackendFinalize(engine heuristics)");
    for (int i = 0; i < 8; i++) cfgs[i] = make(&g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (g.st == MR_OK) {
        cudnnStatus_t e = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                   8, &ncfg, cfgs);
        if (e != CUDNN_STATUS_SUCCESS) g.st = mr_cudnn_error(e, "cudnnBackendGetAttribute(heuristics results)",
                                                             __FILE__, __LINE__);
        else if (ncfg == 0) {
            char why[256];
            why[0] = '\0';
            cudnnGetLastErrorString(why, sizeof why);
            g.st = mr_set_error(MR_ERR_UNSUPPORTED, "cuDNN's heuristics found no engine%s%s", why[0] ? ": " : "", why);
        }
    }
    for (int64_t i = 0; i < ncfg && g.st == MR_OK && !plan; i++) {
        /* mirror promises bit-identical reruns: an engine noted non-deterministic is skipped */
        cudnnBackendDescriptor_t eng = make(&g, CUDNN_BACKEND_ENGINE_DESCRIPTOR), p = NULL;
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        int64_t neng = 0, nnotes = 0;
        if (g.st != MR_OK) break;
        cudnnStatus_t e = cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                   1, &neng, &eng);
        if (e == CUDNN_STATUS_SUCCESS)
            e = cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                         CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nnotes, notes);
        if (e != CUDNN_STATUS_SUCCESS) {
            g.st = mr_cudnn_error(e, "cudnnBackendGetAttribute(engine numerical notes)", __FILE__, __LINE__);
            break;
        }
        int nondet = 0;
        for (int64_t j = 0; j < nnotes; j++) nondet |= notes[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
        if (nondet) {
            if (i == ncfg - 1) g.st = mr_set_error(MR_ERR_UNSUPPORTED, "every engine cuDNN offers is non-deterministic");
            continue;
        }
        e = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
        if (e != CUDNN_STATUS_SUCCESS) {
            g.st = mr_cudnn_error(e, "cudnnBackendCreateDescriptor(execution plan)", __FILE__, __LINE__);
            break;
        }
        e = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        if (e == CUDNN_STATUS_SUCCESS)
            e = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                         &cfgs[i]);
        if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendFinalize(p);
        int64_t n = 0;
        if (e == CUDNN_STATUS_SUCCESS)
            e = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, ws);
        if (e == CUDNN_STATUS_SUCCESS) plan = p;
        else {
            (void)cudnnBackendDestroyDescriptor(p);
            if (i == ncfg - 1) g.st = mr_cudnn_error(e, "cudnnBackendFinalize(execution plan)", __FILE__, __LINE__);
        }
    }
    if (plan && g.st == MR_OK) {
        memcpy(out->descs, g.all, sizeof g.all);
        out->ndescs = g.nall;
    } else {
        for (int i = g.nall - 1; i >= 0; i--) (void)cudnnBackendDestroyDescriptor(g.all[i]);
        if (plan) (void)cudnnBackendDestroyDescriptor(plan);
        plan = NULL;
    }
    out->plan = plan;
    return g.st;
}

void key_of(int pass, int device, cudaStream_t s, const sdpa_dims &x, int64_t key[SDPA_KEY]) {
    key[0] = pass, key[1] = device, key[2] = (int64_t)(intptr_t)s, key[3] = x.io, key[4] = x.b, key[5] = x.h;
    key[6] = x.t, key[7] = x.s, key[8] = x.d, key[9] = x.causal;
}

/* The cached plan for the key, built with handle h on first use (a failed build is cached too:
 * named once, then mirror's kernels). NULL with the cache full and the key new. */
sdpa_plan *plan_get(cudnnHandle_t h, int pass, int device, cudaStream_t s, const sdpa_dims &x) {
    int64_t key[SDPA_KEY];
    key_of(pass, device, s, x, key);
    sdpa_plan *p = NULL;
    pthread_mutex_lock(&g_sdpa_mu);
    for (int i = 0; i < g_nplans && !p; i++)
        if (memcmp(g_plans[i]->key, key, sizeof key) == 0) p = g_plans[i];
    if (!p && g_nplans < SDPA_PLANS && (p = (sdpa_plan *)calloc(1, sizeof *p))) {
        memcpy(p->key, key, sizeof key);
        mr_status st = plan_build(h, pass, x, p);
        p->ok = st == MR_OK;
        if (!p->ok)
            mr_log_warn("attention: cuDNN flash attention (%s, %s, B %lld H %lld T %lld S %lld D %lld%s) is not "
                        "available, mirror's kernels run it: %s",
                        pass == SDPA_FWD ? "forward" : "backward", x.io == CUDNN_DATA_BFLOAT16 ? "bf16" : "f16",
                        (long long)x.b, (long long)x.h, (long long)x.t, (long long)x.s, (long long)x.d,
                        x.causal ? ", causal" : "", mr_last_error());
        g_plans[g_nplans++] = p;
    }
    pthread_mutex_unlock(&g_sdpa_mu);
    return p;
}

/* The workspace for plan p: the op's when it is large enough, else the plan's own buffer, made
 * once (under the plan lock: two ops with the same key share the plan and its stream). */
mr_status workspace_of(sdpa_plan *p, const mr_op_args *a, void **out) {
    mr_status st = MR_OK;
    *out = NULL;
    if (p->ws == 0) return MR_OK;
    if (a->workspace && a->workspace_bytes >= (size_t)p->ws) {
        *out = a->workspace;
        return MR_OK;
    }
    pthread_mutex_lock(&g_sdpa_mu);
    if (!p->own_ws) {
        cudaError_t e = cudaMalloc(&p->own_ws, (size_t)p->ws);
        if (e != cudaSuccess) {
            p->own_ws = NULL;
            st = mr_set_error(mr_cuda_status(e), "attention: cudaMalloc of cuDNN's %lld-byte workspace failed: %s",
                              (long long)p->ws, cudaGetErrorString(e));
        }
    }
    *out = p->own_ws;
    pthread_mutex_unlock(&g_sdpa_mu);
    return st;
}

/* The dims of the args in cuDNN's terms, or 0 when the cuDNN path does not apply: a half dtype
 * and at least 2 dims; everything else about the shape is cuDNN's to accept or refuse. */
int dims_of(const mr_op_args *a, sdpa_dims *x) {
    const mr_shape *q = &a->in[0].shape;
    mr_dtype dt = a->in[0].dtype;
    if ((dt != MR_BF16 && dt != MR_F16) || q->ndim < 2) return 0;
    x->io = dt == MR_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    x->t = q->dim[q->ndim - 2];
    x->d = q->dim[q->ndim - 1];
    x->s = a->in[1].shape.dim[q->ndim - 2];
    x->h = q->ndim >= 3 ? q->dim[q->ndim - 3] : 1;
    x->b = x->t * x->d * x->h ? mr_shape_numel(q) / (x->t * x->d * x->h) : 0;
    x->causal = a->p.attention.causal;
    return x->b > 0 && x->t > 0 && x->s > 0 && x->d > 0;
}

} // namespace

/* 1 when the call ran through cuDNN; 0 when mirror's kernels must run it (*st MR_OK), or an error. */
extern "C" int mr_attention_cudnn(const mr_op_args *a, int bwd, mr_status *out_st) {
    mr_status st = MR_OK;
    sdpa_dims x;
    cudaStream_t s;
    cudnnHandle_t h = NULL;
    pthread_mutex_t *mu = NULL;
    sdpa_plan *p = NULL;
    void *ws = NULL;
    int ran = 0;
    const char *env = getenv("MIRROR_CUDNN_SDPA");
    *out_st = MR_OK;
    if ((env && !strcmp(env, "0")) || !dims_of(a, &x)) {
        mr_attention_path_note(0, bwd);
        return 0;
    }
    const int device = a->stream ? a->stream->device : a->device;
    MR_TRY(mr_cuda_op_stream(a, &s));
    MR_TRY(mr_cudnn_handle(device, s, &h, &mu));
    pthread_mutex_lock(mu);
    p = plan_get(h, bwd ? SDPA_BWD : SDPA_FWD, device, s, x);
    if (p && p->ok) {
        const float scale = (float)a->p.attention.scale, neg = -FLT_MAX, one = 1.0f;
        const int32_t shift_s = (int32_t)x.s, shift_t = (int32_t)x.t;
        int64_t uids[14];
        void *ptrs[14];
        int64_t n = 0;
#define SDPA_PTR(u, ptr) (uids[n] = (u), ptrs[n++] = (void *)(ptr))
        SDPA_PTR(UID_Q, a->in[0].data);
        SDPA_PTR(UID_K, a->in[1].data);
        SDPA_PTR(UID_V, a->in[2].data);
        SDPA_PTR(UID_SCALE, &scale);
        if (x.causal) SDPA_PTR(UID_NEG, &neg);
        if (x.causal && x.t != x.s) {
            SDPA_PTR(UID_SHIFT_S, &shift_s);
            SDPA_PTR(UID_SHIFT_T, &shift_t);
        }
        if (!bwd) {
            SDPA_PTR(UID_O, a->out[0].data);
            SDPA_PTR(UID_STATS, a->out[1].data);
        } else {
            SDPA_PTR(UID_O, a->in[3].data);
            SDPA_PTR(UID_STATS, a->in[4].data);
            SDPA_PTR(UID_DO, a->in[5].data);
            SDPA_PTR(UID_DQ, a->out[0].data);
            SDPA_PTR(UID_DK, a->out[1].data);
            SDPA_PTR(UID_DV, a->out[2].data);
            SDPA_PTR(UID_ONE, &one);
        }
#undef SDPA_PTR
        cudnnBackendDescriptor_t pack = NULL;
        MR_TRY(workspace_of(p, a, &ws));
        MR_TRY_CUDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
        {
            cudnnStatus_t e =
                cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
            if (e == CUDNN_STATUS_SUCCESS)
                e = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
            if (e == CUDNN_STATUS_SUCCESS)
                e = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
            if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendFinalize(pack);
            if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendExecute(h, p->plan, pack);
            (void)cudnnBackendDestroyDescriptor(pack);
            if (e != CUDNN_STATUS_SUCCESS) {
                st = mr_cudnn_error(e, "cudnnBackendExecute(attention)", __FILE__, __LINE__);
                goto fail;
            }
        }
        ran = 1;
    }
fail:
    if (mu) pthread_mutex_unlock(mu);
    *out_st = st;
    if (st == MR_OK) mr_attention_path_note(ran, bwd);
    return st == MR_OK ? ran : 1;
}

#else /* no cuDNN: mirror's kernels always */

extern "C" int mr_attention_cudnn(const mr_op_args *a, int bwd, mr_status *out_st) {
    (void)a;
    *out_st = MR_OK;
    mr_attention_path_note(0, bwd);
    return 0;
}

#endif
