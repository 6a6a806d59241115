/* The emulated cuDNN backend graph API (cudnn_graph_v9.h): the descriptors mirror's fused
 * attention builds (core/cuda/attention_cudnn.cu) with the real header's signatures, and an
 * interpreter that runs any finalized operation graph of matmul, pointwise (add, sub, mul, div,
 * max, min, exp, log, neg, identity, the comparisons, gen_index, binary_select), reduction (add,
 * max) and reshape nodes element by element: values in double, rounded to each tensor's data type
 * where the tensor is written (a virtual f32 tensor rounds to float, a virtual bf16 one to bf16),
 * so what it computes is what the graph says, not a stand-in for attention.
 *
 * Checked (a violation aborts with "mirror-emu: cudnn: ..."): each attribute is one the
 * descriptor type has, with its attribute type and element count; nothing is set after
 * finalize; descriptors referenced are live and finalized; a destroyed descriptor is not used or
 * destroyed again; tensors: dims and strides of one count (1..8), positive, a unique id per
 * tensor descriptor within a graph, by-value tensors of one element; operation shapes (matmul
 * M/K/N and batch broadcast, pointwise broadcast, reduction dims, reshape sizes); in a graph
 * every tensor has at most one producer, a virtual tensor has one and is used, no cycle; at
 * execute: the plan's handle, every non-virtual tensor's uid in the variant pack once and no
 * virtual one, device pointers inside one allocation of the handle's GPU covering the tensor's
 * extent, by-value pointers in host memory (read when the call is made, as cuDNN does), the
 * workspace at least what the plan said, in device memory (filled with garbage while the graph
 * runs, so state kept there between runs shows).
 *
 * The engine: heuristics return two engine configs (the first noted NONDETERMINISTIC, whose
 * outputs' last bit changes every other run; the second deterministic) for a graph of the shape cuDNN 9's fused
 * flash-attention engines take, the node sequences cudnn-frontend 1.x builds for sdpa and
 * sdpa_backward (attention_cudnn.cu's header): half I/O of one type (bf16 or f16), f32 stats,
 * f32 compute, head dim a multiple of 8 and at most 128, a bottom-right causal mask only with
 * T and S multiples of 64 (cudnn-frontend's sdpa_backward support checks). Any other graph gets
 * no engine (cudnnGetLastErrorString says why), as cuDNN would answer, so mirror's fallback
 * runs. What this cannot tell: whether a real cuDNN on a given GPU has an engine for the graph,
 * and how fast it is. */
#define MR_EMU_RUNTIME 1
#include "tests/emu/emu_internal.h"

#include <cudnn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mr_emu {
cudaStream_t dnn_handle_stream(cudnnHandle_t h, const char *fn); /* emu_dnn.cc */
void dnn_set_last_error(const char *msg);
[[noreturn]] void dnn_bad(const char *fn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
} // namespace mr_emu

namespace {

const uint32_t LIVE = 0xB4C4E9D0u, DEAD = 0xDEADDEADu;

using mr_emu::dnn_bad;

/* A finalized tensor, copied into what uses it (descriptors may be destroyed after finalize). */
struct tinfo {
    bool set = false;
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    int nd = 0;
    int64_t dim[8] = {0}, stride[8] = {0};
    int64_t uid = 0;
    bool virt = false, by_value = false;
    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < nd; i++) n *= dim[i];
        return n;
    }
    int64_t extent() const { /* elements from the first to one past the last */
        int64_t e = 1;
        for (int i = 0; i < nd; i++) e += (dim[i] - 1) * stride[i];
        return e;
    }
};

enum okind { OP_MATMUL, OP_PW, OP_RED, OP_RESHAPE };
struct gop {
    okind kind;
    int mode = 0; /* pointwise mode or reduction operator */
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    int64_t axis = -1;
    tinfo x, b, t, y; /* matmul: a = x, b, c = y */
};

struct graph {
    std::vector<gop> ops;                 /* topological order */
    std::vector<std::string> signature;   /* op tokens, in the order given */
    std::map<int64_t, tinfo> tensors;
    gop first_mm;                         /* the first matmul given (Q K^T in both SDPA graphs) */
    cudnnHandle_t handle = nullptr;
};

struct engine {
    std::shared_ptr<graph> g;
    int64_t ws = 0;
    bool nondet = false; /* noted NONDETERMINISTIC: its outputs' last bit changes from run to run */
};

struct attr {
    cudnnBackendAttributeType_t type;
    std::vector<int64_t> v; /* integers, enums, booleans, handles and pointers (as intptr) */
    std::vector<double> f;
};

struct bdesc {
    uint32_t magic;
    cudnnBackendDescriptorType_t type;
    bool fin = false;
    std::map<int, attr> attrs;
    tinfo t;                      /* tensor */
    gop op;                       /* operation */
    int mode = 0;                 /* pointwise / reduction descriptor */
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    int64_t axis = -1;
    std::shared_ptr<graph> g;     /* operation graph, heuristics */
    std::vector<engine> results;  /* heuristics */
    engine eng;                   /* engine config, execution plan */
    cudnnHandle_t handle = nullptr;
};

bdesc *use(cudnnBackendDescriptor_t d, const char *fn, bool need_final = false) {
    bdesc *b = (bdesc *)d;
    if (!b) dnn_bad(fn, "the descriptor is NULL");
    if (b->magic == DEAD) dnn_bad(fn, "descriptor (type %d) used after it was destroyed", (int)b->type);
    if (b->magic != LIVE) dnn_bad(fn, "%p is not a descriptor cudnnBackendCreateDescriptor made", d);
    if (need_final && !b->fin) dnn_bad(fn, "descriptor (type %d) used before cudnnBackendFinalize", (int)b->type);
    return b;
}

/* ---- the attributes each descriptor type has ---------------------------------------------- */

struct attr_rule {
    cudnnBackendDescriptorType_t d;
    cudnnBackendAttributeName_t n;
    cudnnBackendAttributeType_t t;
    int64_t min, max;
};
const attr_rule RULES[] = {
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 1, 8},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 1, 8},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, 1},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 256},
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, 1},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, 1},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, 1},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 0, 64},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 0, 64},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, 1},
};

/* the bytes of one element of an attribute type (enums are ints) */
size_t attr_size(cudnnBackendAttributeType_t t) {
    switch (t) {
    case CUDNN_TYPE_INT64: return sizeof(int64_t);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_FLOAT: return sizeof(float);
    case CUDNN_TYPE_DOUBLE: return sizeof(double);
    case CUDNN_TYPE_VOID_PTR: case CUDNN_TYPE_BACKEND_DESCRIPTOR: case CUDNN_TYPE_HANDLE: return sizeof(void *);
    default: return sizeof(int); /* data type, modes */
    }
}

const attr *get(const bdesc *d, cudnnBackendAttributeName_t n) {
    auto it = d->attrs.find((int)n);
    return it == d->attrs.end() ? nullptr : &it->second;
}
const attr &need(const bdesc *d, cudnnBackendAttributeName_t n, const char *fn, const char *what) {
    const attr *a = get(d, n);
    if (!a) dnn_bad(fn, "%s was not set", what);
    return *a;
}
/* the finalized tensor an operation attribute names (its copy) */
tinfo tensor_of(const bdesc *op, cudnnBackendAttributeName_t n, const char *fn, const char *what, bool required = true) {
    const attr *a = get(op, n);
    if (!a) {
        if (required) dnn_bad(fn, "the operation's %s was not set", what);
        return tinfo();
    }
    bdesc *t = use((cudnnBackendDescriptor_t)a->v[0], fn, true);
    if (t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR) dnn_bad(fn, "the operation's %s is not a tensor descriptor", what);
    return t->t;
}
bdesc *desc_of(const bdesc *d, cudnnBackendAttributeName_t n, cudnnBackendDescriptorType_t type, const char *fn,
               const char *what) {
    bdesc *x = use((cudnnBackendDescriptor_t)need(d, n, fn, what).v[0], fn, true);
    if (x->type != type) dnn_bad(fn, "%s is a descriptor of type %d, not %d", what, (int)x->type, (int)type);
    return x;
}

/* ---- finalize: shape rules ------------------------------------------------------------------ */

bool bcast(const tinfo &in, const tinfo &out) { /* in's dims are out's or 1 */
    if (in.nd != out.nd) return false;
    for (int i = 0; i < in.nd; i++)
        if (in.dim[i] != out.dim[i] && in.dim[i] != 1) return false;
    return true;
}

int pw_arity(int mode) {
    switch (mode) {
    case CUDNN_POINTWISE_EXP: case CUDNN_POINTWISE_LOG: case CUDNN_POINTWISE_NEG: case CUDNN_POINTWISE_IDENTITY:
    case CUDNN_POINTWISE_GEN_INDEX: return 1;
    case CUDNN_POINTWISE_ADD: case CUDNN_POINTWISE_SUB: case CUDNN_POINTWISE_MUL: case CUDNN_POINTWISE_DIV:
    case CUDNN_POINTWISE_MAX: case CUDNN_POINTWISE_MIN: case CUDNN_POINTWISE_CMP_EQ: case CUDNN_POINTWISE_CMP_NEQ:
    case CUDNN_POINTWISE_CMP_GT: case CUDNN_POINTWISE_CMP_GE: case CUDNN_POINTWISE_CMP_LT: case CUDNN_POINTWISE_CMP_LE:
        return 2;
    case CUDNN_POINTWISE_BINARY_SELECT: return 3;
    default: return 0; /* not emulated */
    }
}

void finalize_tensor(bdesc *d, const char *fn) {
    const attr &dt = need(d, CUDNN_ATTR_TENSOR_DATA_TYPE, fn, "CUDNN_ATTR_TENSOR_DATA_TYPE");
    const attr &dim = need(d, CUDNN_ATTR_TENSOR_DIMENSIONS, fn, "CUDNN_ATTR_TENSOR_DIMENSIONS");
    const attr &st = need(d, CUDNN_ATTR_TENSOR_STRIDES, fn, "CUDNN_ATTR_TENSOR_STRIDES");
    const attr &uid = need(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, fn, "CUDNN_ATTR_TENSOR_UNIQUE_ID");
    need(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, fn, "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT");
    if (dim.v.size() != st.v.size()) dnn_bad(fn, "%zu dims but %zu strides", dim.v.size(), st.v.size());
    tinfo t;
    t.set = true;
    t.dt = (cudnnDataType_t)dt.v[0];
    if (t.dt != CUDNN_DATA_FLOAT && t.dt != CUDNN_DATA_DOUBLE && t.dt != CUDNN_DATA_HALF &&
        t.dt != CUDNN_DATA_BFLOAT16 && t.dt != CUDNN_DATA_INT32 && t.dt != CUDNN_DATA_BOOLEAN)
        dnn_bad(fn, "data type %d is not emulated", (int)t.dt);
    t.nd = (int)dim.v.size();
    for (int i = 0; i < t.nd; i++) {
        t.dim[i] = dim.v[(size_t)i], t.stride[i] = st.v[(size_t)i];
        if (t.dim[i] <= 0 || t.stride[i] <= 0) dnn_bad(fn, "dim %d is %lld with stride %lld (both must be positive)", i,
                                                  (long long)t.dim[i], (long long)t.stride[i]);
    }
    t.uid = uid.v[0];
    const attr *v = get(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL), *bv = get(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
    t.virt = v && v->v[0];
    t.by_value = bv && bv->v[0];
    if (t.by_value && (t.virt || t.numel() != 1)) dnn_bad(fn, "a by-value tensor must be one element and not virtual");
    if (t.dt == CUDNN_DATA_BOOLEAN && !t.virt) dnn_bad(fn, "non-virtual boolean tensors are not emulated");
    d->t = t;
}

void finalize_op(bdesc *d, const char *fn) {
    gop &o = d->op;
    switch (d->type) {
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
        o.kind = OP_MATMUL;
        o.x = tensor_of(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC, fn, "A");
        o.b = tensor_of(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC, fn, "B");
        o.y = tensor_of(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC, fn, "C");
        bdesc *m = desc_of(d, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_BACKEND_MATMUL_DESCRIPTOR, fn, "the matmul descriptor");
        o.prec = m->prec;
        const tinfo &a = o.x, &b = o.b, &c = o.y;
        int n = c.nd;
        if (a.nd != n || b.nd != n || n < 2 || a.dim[n - 2] != c.dim[n - 2] || b.dim[n - 1] != c.dim[n - 1] ||
            a.dim[n - 1] != b.dim[n - 2])
            dnn_bad(fn, "matmul A (.., %lld, %lld) x B (.., %lld, %lld) -> C (.., %lld, %lld) does not fit", (long long)a.dim[n - 2],
                (long long)a.dim[n - 1], (long long)b.dim[n - 2], (long long)b.dim[n - 1], (long long)c.dim[n - 2],
                (long long)c.dim[n - 1]);
        for (int i = 0; i < n - 2; i++)
            if ((a.dim[i] != c.dim[i] && a.dim[i] != 1) || (b.dim[i] != c.dim[i] && b.dim[i] != 1))
                dnn_bad(fn, "matmul batch dim %d: A %lld, B %lld, C %lld", i, (long long)a.dim[i], (long long)b.dim[i], (long long)c.dim[i]);
        break;
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        o.kind = OP_PW;
        bdesc *p = desc_of(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, fn,
                           "the pointwise descriptor");
        o.mode = p->mode, o.prec = p->prec, o.axis = p->axis;
        o.x = tensor_of(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, fn, "x");
        o.b = tensor_of(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, fn, "b", false);
        o.t = tensor_of(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, fn, "t", false);
        o.y = tensor_of(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, fn, "y");
        int ar = pw_arity(o.mode), have = 1 + o.b.set + o.t.set;
        if (ar != have) dnn_bad(fn, "pointwise mode %d takes %d inputs, %d were set", o.mode, ar, have);
        if (o.mode == CUDNN_POINTWISE_GEN_INDEX && (o.axis < 0 || o.axis >= o.y.nd))
            dnn_bad(fn, "gen_index axis %lld for a %d-d output", (long long)o.axis, o.y.nd);
        if (o.mode != CUDNN_POINTWISE_GEN_INDEX && !bcast(o.x, o.y)) dnn_bad(fn, "pointwise x does not broadcast to y");
        if (o.b.set && !bcast(o.b, o.y)) dnn_bad(fn, "pointwise b does not broadcast to y");
        if (o.t.set && !bcast(o.t, o.y)) dnn_bad(fn, "pointwise t does not broadcast to y");
        break;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        o.kind = OP_RED;
        bdesc *r = desc_of(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, fn,
                           "the reduction descriptor");
        o.mode = r->mode, o.prec = r->prec;
        o.x = tensor_of(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, fn, "x");
        o.y = tensor_of(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, fn, "y");
        if (!bcast(o.y, o.x)) dnn_bad(fn, "reduction y dims must be x's or 1");
        break;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        o.kind = OP_RESHAPE;
        o.x = tensor_of(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, fn, "x");
        o.y = tensor_of(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, fn, "y");
        if (o.x.numel() != o.y.numel() || o.x.extent() != o.y.extent())
            dnn_bad(fn, "reshape of %lld elements (extent %lld) into %lld (extent %lld)", (long long)o.x.numel(),
                (long long)o.x.extent(), (long long)o.y.numel(), (long long)o.y.extent());
        break;
    default: dnn_bad(fn, "descriptor type %d is not emulated", (int)d->type);
    }
}

std::string token(const gop &o) {
    switch (o.kind) {
    case OP_MATMUL: return "matmul";
    case OP_RESHAPE: return "reshape";
    case OP_RED: return o.mode == CUDNN_REDUCE_TENSOR_MAX ? "reduce_max" : o.mode == CUDNN_REDUCE_TENSOR_ADD ? "reduce_add" : "reduce_other";
    default: break;
    }
    switch (o.mode) {
    case CUDNN_POINTWISE_ADD: return "add";
    case CUDNN_POINTWISE_SUB: return "sub";
    case CUDNN_POINTWISE_MUL: return "mul";
    case CUDNN_POINTWISE_DIV: return "div";
    case CUDNN_POINTWISE_EXP: return "exp";
    case CUDNN_POINTWISE_LOG: return "log";
    case CUDNN_POINTWISE_GEN_INDEX: return "gen_index";
    case CUDNN_POINTWISE_BINARY_SELECT: return "binary_select";
    case CUDNN_POINTWISE_CMP_EQ: case CUDNN_POINTWISE_CMP_NEQ: case CUDNN_POINTWISE_CMP_GT: case CUDNN_POINTWISE_CMP_GE:
    case CUDNN_POINTWISE_CMP_LT: case CUDNN_POINTWISE_CMP_LE: return "cmp";
    default: return "pointwise_other";
    }
}

bool same(const tinfo &a, const tinfo &b) {
    if (a.dt != b.dt || a.nd != b.nd || a.uid != b.uid || a.virt != b.virt || a.by_value != b.by_value) return false;
    for (int i = 0; i < a.nd; i++)
        if (a.dim[i] != b.dim[i] || a.stride[i] != b.stride[i]) return false;
    return true;
}

void finalize_graph(bdesc *d, const char *fn) {
    const attr &ops = need(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, fn, "CUDNN_ATTR_OPERATIONGRAPH_OPS");
    auto g = std::make_shared<graph>();
    if (const attr *h = get(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE)) {
        g->handle = (cudnnHandle_t)h->v[0];
        mr_emu::dnn_handle_stream(g->handle, fn);
    }
    std::vector<gop> in;
    for (int64_t p : ops.v) {
        bdesc *o = use((cudnnBackendDescriptor_t)p, fn, true);
        if (o->type != CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR && o->type != CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR &&
            o->type != CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR && o->type != CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)
            dnn_bad(fn, "descriptor type %d in CUDNN_ATTR_OPERATIONGRAPH_OPS is not an emulated operation", (int)o->type);
        in.push_back(o->op);
        g->signature.push_back(token(o->op));
        if (o->op.kind == OP_MATMUL && !g->first_mm.y.set) g->first_mm = o->op;
    }
    /* one tensor per uid, one producer per tensor */
    std::map<int64_t, int> producer, uses;
    auto add = [&](const tinfo &t) {
        if (!t.set) return;
        auto it = g->tensors.find(t.uid);
        if (it == g->tensors.end()) g->tensors[t.uid] = t;
        else if (!same(it->second, t))
            dnn_bad(fn, "uid %lld names two different tensors (uids must be unique)", (long long)t.uid);
    };
    for (size_t i = 0; i < in.size(); i++) {
        const gop &o = in[i];
        for (const tinfo *t : {&o.x, &o.b, &o.t}) {
            add(*t);
            if (t->set) uses[t->uid]++;
        }
        add(o.y);
        if (producer.count(o.y.uid)) dnn_bad(fn, "tensor uid %lld is written by two operations", (long long)o.y.uid);
        if (o.y.by_value) dnn_bad(fn, "tensor uid %lld is by value but an operation writes it", (long long)o.y.uid);
        producer[o.y.uid] = (int)i;
    }
    for (auto &kv : g->tensors) {
        const tinfo &t = kv.second;
        if (t.virt && !producer.count(t.uid)) dnn_bad(fn, "virtual tensor uid %lld is read but never written", (long long)t.uid);
        if (t.virt && !uses.count(t.uid)) dnn_bad(fn, "virtual tensor uid %lld is written but never read", (long long)t.uid);
    }
    /* topological order (Kahn) */
    std::vector<bool> done(in.size(), false);
    std::map<int64_t, bool> ready;
    for (auto &kv : g->tensors) ready[kv.first] = !producer.count(kv.first);
    for (size_t round = 0; round < in.size(); round++) {
        bool moved = false;
        for (size_t i = 0; i < in.size(); i++) {
            const gop &o = in[i];
            if (done[i]) continue;
            if ((o.x.set && !ready[o.x.uid]) || (o.b.set && !ready[o.b.uid]) || (o.t.set && !ready[o.t.uid])) continue;
            done[i] = true;
            ready[o.y.uid] = true;
            g->ops.push_back(o);
            moved = true;
        }
        if (!moved) break;
    }
    if (g->ops.size() != in.size()) dnn_bad(fn, "the operation graph has a cycle");
    d->g = g;
}

/* ---- the engine: the graphs cuDNN's fused flash-attention engines take ---------------------- */

std::vector<std::string> words(const char *s) {
    std::vector<std::string> w;
    std::string cur;
    for (const char *p = s;; p++) {
        if (*p == ' ' || !*p) {
            if (!cur.empty()) w.push_back(cur);
            cur.clear();
            if (!*p) break;
        } else cur += *p;
    }
    return w;
}

/* "" when an engine takes the graph, else why not */
std::string engine_check(const graph &g) {
    const char *mask[3] = {"", "gen_index gen_index cmp binary_select", "gen_index add sub gen_index cmp binary_select"};
    int kind = -1, masked = 0;
    for (int m = 0; m < 3 && kind < 0; m++) {
        std::string f = std::string("matmul mul ") + mask[m] + " reduce_max sub exp reduce_add log add div matmul";
        std::string b = std::string("mul reduce_add mul matmul mul ") + mask[m] +
                        " sub exp reshape matmul matmul mul sub mul mul reshape matmul reshape matmul";
        if (g.signature == words(f.c_str())) kind = 0, masked = m;
        else if (g.signature == words(b.c_str())) kind = 1, masked = m;
    }
    if (kind < 0) return "the node sequence is not one of the fused SDPA patterns (cudnn-frontend sdpa / sdpa_backward)";
    cudnnDataType_t io = CUDNN_DATA_FLOAT;
    int stats = 0;
    for (auto &kv : g.tensors) {
        const tinfo &t = kv.second;
        if (t.virt || t.by_value) continue;
        if (t.dt == CUDNN_DATA_FLOAT && t.nd == 4 && t.dim[3] == 1) {
            stats++;
            continue;
        }
        if (t.dt != CUDNN_DATA_HALF && t.dt != CUDNN_DATA_BFLOAT16) return "the I/O tensors must be f16 or bf16";
        if (io != CUDNN_DATA_FLOAT && t.dt != io) return "the I/O tensors mix f16 and bf16";
        io = t.dt;
        if (t.nd != 4 || (t.stride[3] != 1 && t.stride[2] != 1)) return "the I/O tensors must be 4-d with a unit stride";
    }
    if (stats != 1) return "the softmax stats must be one f32 (B, H, T, 1) tensor";
    for (const gop &o : g.ops)
        if ((o.kind == OP_MATMUL || o.kind == OP_RED) && o.prec != CUDNN_DATA_FLOAT) return "the compute type must be f32";
    const gop &first = g.first_mm;
    if (first.x.nd != 4) return "the tensors must be 4-d";
    const int64_t t = first.x.dim[2], d = first.x.dim[3], s = first.y.dim[3];
    if (d % 8 != 0 || d > 128) return "the head dim must be a multiple of 8 and at most 128 (got " + std::to_string(d) + ")";
    if (masked == 2 && (t % 64 != 0 || s % 64 != 0)) return "a bottom-right causal mask needs T and S multiples of 64";
    return "";
}

/* the workspace this engine asks for: f32 row statistics (forward) and a dQ accumulator (backward) */
int64_t engine_ws(const graph &g) {
    const gop &first = g.first_mm;
    int64_t rows = first.x.dim[0] * first.x.dim[1] * first.x.dim[2], d = first.x.dim[3];
    bool bwd = g.signature[0] != "matmul";
    return bwd ? rows * (d + 1) * 4 : rows * 2 * 4;
}

/* ---- the interpreter -------------------------------------------------------------------------- */

double round_to(double v, cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_FLOAT: return (double)(float)v;
    case CUDNN_DATA_DOUBLE: return v;
    case CUDNN_DATA_INT32: return (double)(int32_t)v;
    case CUDNN_DATA_BOOLEAN: return v != 0.0 ? 1.0 : 0.0;
    default: {
        uint16_t h;
        cudaDataType c = t == CUDNN_DATA_HALF ? CUDA_R_16F : CUDA_R_16BF;
        mr_emu::store_value(&h, 0, c, v);
        return mr_emu::load_value(&h, 0, c);
    }
    }
}
cudaDataType cuda_of(cudnnDataType_t t) {
    return t == CUDNN_DATA_FLOAT ? CUDA_R_32F : t == CUDNN_DATA_DOUBLE ? CUDA_R_64F : t == CUDNN_DATA_HALF ? CUDA_R_16F : CUDA_R_16BF;
}
size_t esize(cudnnDataType_t t) { return t == CUDNN_DATA_INT32 ? 4 : mr_emu::value_size(cuda_of(t)); }
double load(const void *p, int64_t i, cudnnDataType_t t) {
    return t == CUDNN_DATA_INT32 ? (double)((const int32_t *)p)[i] : mr_emu::load_value(p, i, cuda_of(t));
}

/* calls f(offset in t, index) for every element of t, in row-major index order */
template <class F> void each(const tinfo &t, F f) {
    int64_t idx[8] = {0};
    for (int64_t n = t.numel(); n > 0; n--) {
        int64_t off = 0;
        for (int i = 0; i < t.nd; i++) off += idx[i] * t.stride[i];
        f(off, idx);
        for (int i = t.nd - 1; i >= 0; i--) {
            if (++idx[i] < t.dim[i]) break;
            idx[i] = 0;
        }
    }
}
/* the offset in `in` of output index idx, broadcast over in's dims of 1 */
int64_t at(const tinfo &in, const int64_t *idx) {
    int64_t off = 0;
    for (int i = 0; i < in.nd; i++) off += (in.dim[i] == 1 ? 0 : idx[i]) * in.stride[i];
    return off;
}

double pw_apply(int mode, double x, double b, double t) {
    switch (mode) {
    case CUDNN_POINTWISE_ADD: return x + b;
    case CUDNN_POINTWISE_SUB: return x - b;
    case CUDNN_POINTWISE_MUL: return x * b;
    case CUDNN_POINTWISE_DIV: return x / b;
    case CUDNN_POINTWISE_MAX: return x > b ? x : b;
    case CUDNN_POINTWISE_MIN: return x < b ? x : b;
    case CUDNN_POINTWISE_EXP: return exp(x);
    case CUDNN_POINTWISE_LOG: return log(x);
    case CUDNN_POINTWISE_NEG: return -x;
    case CUDNN_POINTWISE_IDENTITY: return x;
    case CUDNN_POINTWISE_CMP_EQ: return x == b;
    case CUDNN_POINTWISE_CMP_NEQ: return x != b;
    case CUDNN_POINTWISE_CMP_GT: return x > b;
    case CUDNN_POINTWISE_CMP_GE: return x >= b;
    case CUDNN_POINTWISE_CMP_LT: return x < b;
    case CUDNN_POINTWISE_CMP_LE: return x <= b;
    case CUDNN_POINTWISE_BINARY_SELECT: return t != 0.0 ? x : b;
    default: return NAN;
    }
}

typedef std::map<int64_t, std::vector<double>> values;

void run_op(const gop &o, values &v) {
    std::vector<double> &y = v[o.y.uid];
    y.assign((size_t)o.y.extent(), 0.0);
    switch (o.kind) {
    case OP_MATMUL: {
        const std::vector<double> &A = v[o.x.uid], &B = v[o.b.uid];
        const int n = o.y.nd;
        const int64_t K = o.x.dim[n - 1];
        each(o.y, [&](int64_t off, const int64_t *idx) {
            int64_t ia[8], ib[8];
            std::copy(idx, idx + n, ia);
            std::copy(idx, idx + n, ib);
            double acc = 0;
            for (int64_t k = 0; k < K; k++) {
                ia[n - 1] = k, ib[n - 2] = k;
                acc += A[(size_t)at(o.x, ia)] * B[(size_t)at(o.b, ib)];
            }
            y[(size_t)off] = round_to(acc, o.y.dt);
        });
        break;
    }
    case OP_PW: {
        const std::vector<double> *X = &v[o.x.uid], *Bv = o.b.set ? &v[o.b.uid] : nullptr, *T = o.t.set ? &v[o.t.uid] : nullptr;
        each(o.y, [&](int64_t off, const int64_t *idx) {
            double r = o.mode == CUDNN_POINTWISE_GEN_INDEX
                           ? (double)idx[o.axis]
                           : pw_apply(o.mode, (*X)[(size_t)at(o.x, idx)], Bv ? (*Bv)[(size_t)at(o.b, idx)] : 0.0,
                                      T ? (*T)[(size_t)at(o.t, idx)] : 0.0);
            y[(size_t)off] = round_to(r, o.y.dt);
        });
        break;
    }
    case OP_RED: {
        const std::vector<double> &X = v[o.x.uid];
        bool mx = o.mode == CUDNN_REDUCE_TENSOR_MAX;
        std::vector<double> acc((size_t)o.y.extent(), mx ? -INFINITY : 0.0);
        each(o.x, [&](int64_t off, const int64_t *idx) {
            double &a = acc[(size_t)at(o.y, idx)], x = X[(size_t)off];
            a = mx ? (x > a ? x : a) : a + x;
        });
        each(o.y, [&](int64_t off, const int64_t *) { y[(size_t)off] = round_to(acc[(size_t)off], o.y.dt); });
        break;
    }
    case OP_RESHAPE: { /* the same memory seen through y's dims and strides */
        const std::vector<double> &X = v[o.x.uid];
        for (size_t i = 0; i < y.size() && i < X.size(); i++) y[i] = round_to(X[i], o.y.dt);
        break;
    }
    }
}

} // namespace

extern "C" {

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t t, cudnnBackendDescriptor_t *d) {
    if (!d) dnn_bad("cudnnBackendCreateDescriptor", "the output pointer is NULL");
    bdesc *b = new bdesc();
    b->magic = LIVE;
    b->type = t;
    *d = b;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
    use(d, "cudnnBackendDestroyDescriptor")->magic = DEAD;
    mr_emu::keep_dead(d); /* kept so a later use or second destroy is reported */
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t dd, cudnnBackendAttributeName_t n,
                                       cudnnBackendAttributeType_t t, int64_t count, const void *arr) {
    const char *fn = "cudnnBackendSetAttribute";
    bdesc *d = use(dd, fn);
    if (d->fin) dnn_bad(fn, "attribute %d set on a finalized descriptor (type %d)", (int)n, (int)d->type);
    const attr_rule *r = nullptr;
    for (const attr_rule &x : RULES)
        if (x.d == d->type && x.n == n) r = &x;
    if (!r) dnn_bad(fn, "attribute %d is not one of descriptor type %d's (or not emulated)", (int)n, (int)d->type);
    if (t != r->t) dnn_bad(fn, "attribute %d wants attribute type %d, got %d", (int)n, (int)r->t, (int)t);
    if (count < r->min || count > r->max) dnn_bad(fn, "attribute %d wants %lld..%lld elements, got %lld", (int)n,
                                              (long long)r->min, (long long)r->max, (long long)count);
    if (count > 0 && !arr) dnn_bad(fn, "attribute %d: the element array is NULL", (int)n);
    attr a;
    a.type = t;
    for (int64_t i = 0; i < count; i++) {
        const char *p = (const char *)arr + (size_t)i * attr_size(t);
        int64_t v = 0;
        switch (t) {
        case CUDNN_TYPE_INT64: memcpy(&v, p, 8); break;
        case CUDNN_TYPE_BOOLEAN: v = *(const bool *)p; break;
        case CUDNN_TYPE_VOID_PTR: case CUDNN_TYPE_HANDLE: v = (int64_t)(intptr_t)*(void *const *)p; break;
        case CUDNN_TYPE_BACKEND_DESCRIPTOR:
            v = (int64_t)(intptr_t)*(void *const *)p;
            use((cudnnBackendDescriptor_t)(intptr_t)v, fn); /* live (finalized is checked by the user's finalize) */
            break;
        default: v = *(const int *)p; break;
        }
        a.v.push_back(v);
    }
    d->attrs[(int)n] = a;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t dd) {
    const char *fn = "cudnnBackendFinalize";
    bdesc *d = use(dd, fn);
    if (d->fin) dnn_bad(fn, "descriptor (type %d) finalized twice", (int)d->type);
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: finalize_tensor(d, fn); break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
        d->mode = (int)need(d, CUDNN_ATTR_POINTWISE_MODE, fn, "CUDNN_ATTR_POINTWISE_MODE").v[0];
        d->prec = (cudnnDataType_t)need(d, CUDNN_ATTR_POINTWISE_MATH_PREC, fn, "CUDNN_ATTR_POINTWISE_MATH_PREC").v[0];
        if (pw_arity(d->mode) == 0) dnn_bad(fn, "pointwise mode %d is not emulated", d->mode);
        if (d->mode == CUDNN_POINTWISE_GEN_INDEX)
            d->axis = need(d, CUDNN_ATTR_POINTWISE_AXIS, fn, "CUDNN_ATTR_POINTWISE_AXIS (gen_index)").v[0];
        break;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
        d->prec = (cudnnDataType_t)need(d, CUDNN_ATTR_MATMUL_COMP_TYPE, fn, "CUDNN_ATTR_MATMUL_COMP_TYPE").v[0];
        break;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
        d->mode = (int)need(d, CUDNN_ATTR_REDUCTION_OPERATOR, fn, "CUDNN_ATTR_REDUCTION_OPERATOR").v[0];
        d->prec = (cudnnDataType_t)need(d, CUDNN_ATTR_REDUCTION_COMP_TYPE, fn, "CUDNN_ATTR_REDUCTION_COMP_TYPE").v[0];
        if (d->mode != CUDNN_REDUCE_TENSOR_ADD && d->mode != CUDNN_REDUCE_TENSOR_MAX)
            dnn_bad(fn, "reduction operator %d is not emulated (add, max)", d->mode);
        break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        finalize_op(d, fn);
        break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: finalize_graph(d, fn); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
        bdesc *g = desc_of(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, fn,
                           "the operation graph");
        need(d, CUDNN_ATTR_ENGINEHEUR_MODE, fn, "CUDNN_ATTR_ENGINEHEUR_MODE");
        d->g = g->g;
        std::string why = engine_check(*g->g);
        /* two engines, as cuDNN often offers: a non-deterministic one first (atomics, say), then a
         * deterministic one; mirror must read the notes and take the second */
        if (why.empty()) d->results = {engine{g->g, engine_ws(*g->g), true}, engine{g->g, engine_ws(*g->g), false}};
        else mr_emu::dnn_set_last_error(("no engine: " + why).c_str());
        break;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        bdesc *c = desc_of(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, fn,
                           "the engine config");
        d->handle = (cudnnHandle_t)need(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, fn, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE").v[0];
        mr_emu::dnn_handle_stream(d->handle, fn);
        d->eng = c->eng;
        break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
        const attr &u = need(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, fn, "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS");
        const attr &p = need(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, fn, "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS");
        need(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, fn, "CUDNN_ATTR_VARIANT_PACK_WORKSPACE");
        if (u.v.size() != p.v.size()) dnn_bad(fn, "%zu unique ids but %zu data pointers", u.v.size(), p.v.size());
        break;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        dnn_bad(fn, "an engine config comes finalized from the heuristics results; it is not built by hand here");
    default: dnn_bad(fn, "descriptor type %d is not emulated", (int)d->type);
    }
    d->fin = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const dd, cudnnBackendAttributeName_t n,
                                       cudnnBackendAttributeType_t t, int64_t req, int64_t *count, void *arr) {
    const char *fn = "cudnnBackendGetAttribute";
    bdesc *d = use(dd, fn, true);
    if (!count) dnn_bad(fn, "elementCount is NULL");
    if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && n == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        if (t != CUDNN_TYPE_BACKEND_DESCRIPTOR) dnn_bad(fn, "heuristics results are descriptors");
        *count = (int64_t)d->results.size();
        for (int64_t i = 0; i < req && i < *count; i++) {
            bdesc *c = use(((cudnnBackendDescriptor_t *)arr)[i], fn);
            if (c->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) dnn_bad(fn, "result %lld is not an engine config descriptor", (long long)i);
            c->eng = d->results[(size_t)i];
            c->fin = true;
        }
        return CUDNN_STATUS_SUCCESS; /* *count: how many there are (the real API), not how many were written */
    }
    if (d->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && n == CUDNN_ATTR_ENGINECFG_ENGINE) {
        if (t != CUDNN_TYPE_BACKEND_DESCRIPTOR || req < 1 || !arr) dnn_bad(fn, "the engine is one descriptor");
        bdesc *e = use(*(cudnnBackendDescriptor_t *)arr, fn);
        if (e->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR) dnn_bad(fn, "the engine must go into an engine descriptor");
        e->eng = d->eng;
        e->fin = true;
        *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    if (d->type == CUDNN_BACKEND_ENGINE_DESCRIPTOR && n == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) {
        if (t != CUDNN_TYPE_NUMERICAL_NOTE) dnn_bad(fn, "numerical notes are CUDNN_TYPE_NUMERICAL_NOTE");
        *count = d->eng.nondet ? 1 : 0;
        if (*count && req >= 1 && arr) ((cudnnBackendNumericalNote_t *)arr)[0] = CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
        if (req < *count) *count = req;
        return CUDNN_STATUS_SUCCESS;
    }
    if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && n == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
        if (t != CUDNN_TYPE_INT64 || req < 1 || !arr) dnn_bad(fn, "the workspace size is one INT64");
        *(int64_t *)arr = d->eng.ws;
        *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    dnn_bad(fn, "attribute %d of descriptor type %d is not emulated", (int)n, (int)d->type);
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t pd, cudnnBackendDescriptor_t vd) {
    const char *fn = "cudnnBackendExecute";
    cudaStream_t stream = mr_emu::dnn_handle_stream(h, fn);
    bdesc *plan = use(pd, fn, true), *pack = use(vd, fn, true);
    if (plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) dnn_bad(fn, "the plan is not an execution plan descriptor");
    if (pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) dnn_bad(fn, "the variant pack is not a variant pack descriptor");
    if (plan->handle != h) dnn_bad(fn, "the plan was built with another handle");
    std::shared_ptr<graph> g = plan->eng.g;
    const int dev = mr_emu::stream_device(stream);
    const attr &uids = *get(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), &ptrs = *get(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    void *ws = (void *)(intptr_t)get(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE)->v[0];
    std::map<int64_t, void *> dptr;
    auto in = std::make_shared<values>();
    for (size_t i = 0; i < uids.v.size(); i++) {
        int64_t u = uids.v[i];
        void *p = (void *)(intptr_t)ptrs.v[i];
        auto it = g->tensors.find(u);
        if (it == g->tensors.end()) dnn_bad(fn, "uid %lld in the variant pack is not a tensor of the graph", (long long)u);
        const tinfo &t = it->second;
        if (t.virt) dnn_bad(fn, "uid %lld is a virtual tensor: it has no place in the variant pack", (long long)u);
        if (dptr.count(u) || in->count(u)) dnn_bad(fn, "uid %lld is in the variant pack twice", (long long)u);
        if (!p) dnn_bad(fn, "uid %lld has a NULL pointer", (long long)u);
        if (t.by_value) { /* a host scalar, read now */
            if (mr_emu::device_range(p, 1, nullptr)) dnn_bad(fn, "by-value uid %lld points to device memory", (long long)u);
            (*in)[u] = std::vector<double>(1, load(p, 0, t.dt));
            continue;
        }
        size_t bytes = (size_t)t.extent() * esize(t.dt);
        int d = -1;
        if (!mr_emu::device_range(p, bytes, &d))
            dnn_bad(fn, "uid %lld (%zu bytes at %p) is not inside one device allocation", (long long)u, bytes, p);
        if (d != dev) dnn_bad(fn, "uid %lld is memory of cuda:%d, the handle's stream is on cuda:%d", (long long)u, d, dev);
        dptr[u] = p;
    }
    for (auto &kv : g->tensors)
        if (!kv.second.virt && !dptr.count(kv.first) && !in->count(kv.first))
            dnn_bad(fn, "tensor uid %lld of the graph is missing from the variant pack", (long long)kv.first);
    const int64_t wsb = plan->eng.ws;
    if (wsb > 0 && (!ws || !mr_emu::device_range(ws, (size_t)wsb, nullptr)))
        dnn_bad(fn, "the plan needs %lld bytes of workspace; %p is not that much device memory", (long long)wsb, ws);
    mr_emu::count_library_call();
    static std::atomic<uint64_t> runs_nondet;
    const bool flip = plan->eng.nondet && (runs_nondet++ % 2 == 1);
    cudaError_t e = mr_emu::enqueue(stream, fn, [g, in, dptr, ws, wsb, flip]() {
        values v = *in;
        if (wsb > 0) memset(ws, 0xA5, (size_t)wsb); /* the engine's scratch: nothing survives in it */
        for (auto &kv : dptr) { /* non-virtual inputs (outputs are written below) */
            const tinfo &t = g->tensors.at(kv.first);
            std::vector<double> &x = v[kv.first];
            x.assign((size_t)t.extent(), 0.0);
            each(t, [&](int64_t off, const int64_t *) { x[(size_t)off] = load(kv.second, off, t.dt); });
        }
        for (const gop &o : g->ops) run_op(o, v);
        for (const gop &o : g->ops) {
            if (o.y.virt) continue;
            const std::vector<double> &y = v[o.y.uid];
            void *p = dptr.at(o.y.uid);
            each(o.y, [&](int64_t off, const int64_t *) {
                if (o.y.dt == CUDNN_DATA_INT32) ((int32_t *)p)[off] = (int32_t)y[(size_t)off];
                else mr_emu::store_value(p, off, cuda_of(o.y.dt), y[(size_t)off]);
            });
            if (flip) { /* the non-deterministic engine: every other run, the last bit of element 0 */
                if (esize(o.y.dt) == 2) *(uint16_t *)p ^= 1u;
                else if (esize(o.y.dt) == 4) *(uint32_t *)p ^= 1u;
            }
        }
    });
    return e == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

} // extern "C"
