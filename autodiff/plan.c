/* Planning and execution (see graph.h).
 *
 * Memory: node outputs and constants live in one arena allocated once per plan. Each value's
 * lifetime runs from the node that defines it to the last node that reads it (or a view of it);
 * kept values and constants live for the whole run. Values are placed in definition order at the
 * lowest offset whose bytes are free for their whole lifetime (best fit among the gaps between
 * live blocks), so values that are never alive together share bytes. A value never shares with
 * an input of the node that defines it. One scratch region after the arena serves every node's
 * workspace (nodes run one at a time).
 *
 * Execution: every kernel's mr_op_args is built at plan time; a run patches the pointers of
 * bound inputs/params when a binding changed, then calls the kernels in order: no allocation, no
 * checks, no shape arithmetic per step.
 *
 * CUDA graphs (mr_plan_set_graphs): each kernel range a caller runs is captured the first time
 * and replayed after that, up to PLAN_CAPTURES (64) distinct ranges (a full run is one range; the
 * overlapped gradient buckets of distribute/ddp.c run the backward as a few fixed ranges, with
 * events recorded between them, outside any capture); further ranges run kernel by kernel. */
#include "autodiff/graph_impl.h"
#include "core/log.h"
#include "core/vec.h"
#include "core/backend_impl.h"
#include "core/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALIGN = 64, PLAN_CAPTURES = 64 };

/* A kernel range captured into a CUDA graph. */
typedef struct range_capture {
    int32_t first, last;
    mr_capture *c;
} range_capture;

typedef enum { SRC_ARENA = 0, SRC_EXTERNAL = 1 } src_kind;

typedef struct vinfo {
    int32_t root;    /* the value owning the bytes (itself unless a view) */
    size_t view_off; /* bytes from the root's start (views) */
    src_kind src;    /* where the root lives */
    size_t offset;   /* SRC_ARENA: offset in the arena */
    size_t bytes;
    int32_t def, last; /* lifetime in node indices (roots only) */
    int placed;
} vinfo;

/* Where one view of one kernel's args points: value's root plus off bytes. */
typedef struct patch {
    int32_t node, is_out, slot, value;
    size_t off;
} patch;

struct mr_plan {
    mr_device_kind kind;
    mr_device dev;          /* where the arena lives and the kernels run */
    mr_stream *stream;      /* borrowed; NULL: the device's default stream */
    const mr_backend *be;
    int graphs;             /* replay full runs from a captured CUDA graph (mr_plan_set_graphs) */
    range_capture caps[PLAN_CAPTURES]; /* the captured ranges; none until the first run after a rebinding */
    int32_t ncaps;
    int64_t captures;       /* how many times a range was captured */
    int32_t nvals, nnodes;
    vinfo *vi;
    void **bound;       /* per value: bound external pointer (inputs, params) */
    char *arena;        /* device memory */
    size_t arena_bytes, scratch_bytes, unshared_bytes;
    mr_op_args *args;   /* per node */
    mr_kernel_fn *fns;  /* per node */
    patch *patches;     /* views that point at bound (external) values */
    int32_t npatches;
    int dirty;
    char (*names)[MR_NAME_MAX];
    uint64_t *drop_base;    /* per node: the dropout offset it was built with (mr_plan_set_dropout_step) */
    int profile;            /* time every kernel (mr_plan_set_profile) */
    mr_trace_track *trace;  /* a span per kernel inside its window (mr_plan_set_trace) */
    double op_seconds[MR_OP_COUNT];
    int64_t op_calls[MR_OP_COUNT];
};

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* The value owning v's bytes, and v's byte offset from its start. */
static int32_t root_of(const mr_graph *g, int32_t v, size_t *off) {
    *off = 0;
    while (g->vals[v].kind == MR_VAL_VIEW) {
        *off += (size_t)g->vals[v].view_off * mr_dtype_size(g->vals[v].dtype);
        v = g->vals[v].base;
    }
    return v;
}

/* A live block in the arena, for placement. */
typedef struct block {
    size_t off, end;
    int32_t last;
} block;

static int cmp_block(const void *a, const void *b) {
    const block *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static void drop_captures(mr_plan *p) {
    for (int32_t i = 0; i < p->ncaps; i++) mr_capture_free(p->caps[i].c);
    p->ncaps = 0;
}

/* The capture of [first, last), made now when there is room for it (NULL: run kernel by kernel;
 * nothing of the range ran). */
static mr_capture *capture_of(mr_plan *p, int32_t first, int32_t last) {
    for (int32_t i = 0; i < p->ncaps; i++)
        if (p->caps[i].first == first && p->caps[i].last == last) return p->caps[i].c;
    if (p->ncaps == PLAN_CAPTURES) return NULL;
    mr_status s = mr_capture_begin(p->dev, p->stream);
    const int began = s == MR_OK;
    for (int32_t n = first; n < last && s == MR_OK; n++) s = p->fns[n](&p->args[n]);
    mr_capture *c = NULL;
    if (began) { /* always ended, even when a kernel failed inside it */
        mr_status s2 = mr_capture_end(p->dev, p->stream, &c);
        if (s == MR_OK) s = s2;
    }
    if (s != MR_OK) {
        /* a kernel that cannot be captured (a library allocating or synchronising on first use):
         * nothing ran, so run uncaptured from now on */
        mr_capture_free(c);
        mr_log_warn("plan: CUDA graph capture failed, running kernel by kernel: %s", mr_last_error());
        p->graphs = 0;
        drop_captures(p);
        return NULL;
    }
    p->caps[p->ncaps++] = (range_capture){first, last, c};
    p->captures++;
    return c;
}

void mr_plan_free(mr_plan *p) {
    if (!p) return;
    drop_captures(p);
    if (p->be && p->arena) p->be->free(p->dev.index, p->arena);
    free(p->vi);
    free(p->bound);
    free(p->args);
    free(p->fns);
    free(p->patches);
    free(p->names);
    free(p->drop_base);
    free(p);
}

mr_status mr_plan_new(const mr_graph *g, mr_device_kind kind, const mr_val *keep, int n_keep, mr_plan **out) {
    mr_device d = {kind, 0};
    return mr_plan_new_on(g, d, NULL, keep, n_keep, out);
}

mr_status mr_plan_new_on(const mr_graph *g, mr_device dev, mr_stream *stream, const mr_val *keep, int n_keep,
                         mr_plan **out) {
    mr_status st = MR_OK;
    const mr_device_kind kind = dev.kind;
    mr_plan *p = NULL;
    block *live = NULL;
    *out = NULL;
    if (g->err != MR_OK)
        return mr_set_error(MR_ERR_INVALID, "plan: the graph has a build error: %s", g->errmsg);
    p = calloc(1, sizeof *p);
    MR_CHECK(p, MR_ERR_NOMEM, "plan: out of memory");
    p->kind = kind;
    p->dev = dev;
    p->stream = stream;
    MR_TRY(mr_backend_get(kind, &p->be));
    p->nvals = g->nvals;
    p->nnodes = g->nnodes;
    p->vi = calloc((size_t)g->nvals, sizeof *p->vi);
    p->bound = calloc((size_t)g->nvals, sizeof *p->bound);
    p->args = calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof *p->args);
    p->fns = calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof *p->fns);
    p->names = calloc((size_t)g->nvals, sizeof *p->names);
    p->drop_base = calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof *p->drop_base);
    live = calloc((size_t)g->nvals, sizeof *live);
    MR_CHECK(p->vi && p->bound && p->args && p->fns && p->names && p->drop_base && live, MR_ERR_NOMEM,
             "plan: out of memory");

    /* lifetimes */
    const int32_t end = g->nnodes; /* "alive until the end of the run" */
    for (int32_t v = 1; v < g->nvals; v++) {
        vinfo *x = &p->vi[v];
        const mr_gval *gv = &g->vals[v];
        memcpy(p->names[v], gv->name, MR_NAME_MAX);
        x->root = root_of(g, v, &x->view_off);
        x->bytes = (size_t)mr_shape_numel(&gv->shape) * mr_dtype_size(gv->dtype);
        x->def = gv->kind == MR_VAL_NODE ? gv->node : -1;
        x->last = gv->kind == MR_VAL_CONST ? end : x->def;
        x->src = (gv->kind == MR_VAL_INPUT || gv->kind == MR_VAL_PARAM) ? SRC_EXTERNAL : SRC_ARENA;
        x->placed = gv->kind == MR_VAL_FUSED; /* no node writes or reads it: no bytes */
    }
    for (int32_t v = 1; v < g->nvals; v++) p->vi[v].src = p->vi[p->vi[v].root].src;
    for (int32_t n = 0; n < g->nnodes; n++)
        for (int i = 0; i < g->nodes[n].n_in; i++) {
            int32_t v = g->nodes[n].in[i];
            if (v && p->vi[p->vi[v].root].last < n) p->vi[p->vi[v].root].last = n;
        }
    for (int k = 0; k < n_keep; k++) {
        MR_CHECK(mr_graph_valid(g, keep[k]), MR_ERR_INVALID, "plan: keep[%d] is not a value of this graph", k);
        MR_CHECK(g->vals[p->vi[keep[k].id].root].kind != MR_VAL_FUSED, MR_ERR_INVALID,
                 "plan: keep[%d] (value %d) is a conv output fused into its max pool (mr_graph_fuse_conv_pool); "
                 "HINT: pass it to the fusion's keep list", k, (int)keep[k].id);
        p->vi[p->vi[keep[k].id].root].last = end;
    }

    /* placement: roots in definition order (constants first, at def -1) */
    int32_t nlive = 0;
    size_t top = 0;
    for (int32_t t = -1; t < g->nnodes; t++) {
        /* retire blocks whose last reader ran before t */
        int32_t w = 0;
        for (int32_t i = 0; i < nlive; i++)
            if (live[i].last >= t) live[w++] = live[i];
        nlive = w;
        for (int32_t v = 1; v < g->nvals; v++) {
            vinfo *x = &p->vi[v];
            if (x->root != v || x->src != SRC_ARENA || x->def != t || x->placed) continue;
            size_t need = align_up(x->bytes ? x->bytes : 1);
            p->unshared_bytes += need;
            qsort(live, (size_t)nlive, sizeof *live, cmp_block);
            /* best fit among the gaps; the space above the last block is the gap of last resort */
            size_t best = 0, best_gap = 0, cur = 0;
            int found = 0;
            for (int32_t i = 0; i <= nlive; i++) {
                size_t next = i < nlive ? live[i].off : (size_t)-1;
                if (next >= cur + need && (!found || next - cur < best_gap)) {
                    best = cur;
                    best_gap = next - cur;
                    found = 1;
                }
                if (i < nlive && live[i].end > cur) cur = live[i].end;
            }
            x->offset = best;
            x->placed = 1;
            live[nlive++] = (block){best, best + need, x->last};
            if (best + need > top) top = best + need;
        }
    }
    p->arena_bytes = top;

    /* kernels and their arguments */
    for (int32_t n = 0; n < g->nnodes; n++) {
        const mr_gnode *nd = &g->nodes[n];
        const mr_op_info *info = mr_op_get(nd->op);
        MR_CHECK(info->kernel[kind], MR_ERR_UNSUPPORTED, "plan: op %s has no kernel on the %s backend", info->name,
                 p->be->name);
        p->fns[n] = info->kernel[kind];
        mr_op_args *a = &p->args[n];
        mr_op_args_init(a, nd->op);
        a->p = nd->p;
        if (nd->op == MR_OP_DROPOUT || nd->op == MR_OP_DROPOUT_BWD) p->drop_base[n] = nd->p.dropout.offset;
        for (int k = 0; k < 2; k++) {
            const int32_t *ids = k ? nd->out : nd->in;
            mr_view *views = k ? a->out : a->in;
            for (int i = 0; i < (k ? nd->n_out : nd->n_in); i++) {
                if (!ids[i]) continue;
                views[i].dtype = g->vals[ids[i]].dtype;
                views[i].shape = g->vals[ids[i]].shape;
            }
        }
        size_t ws = mr_op_workspace_bytes(a);
        if (align_up(ws) > p->scratch_bytes) p->scratch_bytes = align_up(ws);
    }
    MR_TRY(p->be->alloc(dev.index, p->arena_bytes + p->scratch_bytes, (void **)&p->arena));
    /* constants are copied in once */
    for (int32_t v = 1; v < g->nvals; v++)
        if (g->vals[v].kind == MR_VAL_CONST && p->vi[v].bytes)
            MR_TRY(p->be->copy(dev.index, p->arena + p->vi[v].offset, g->vals[v].cdata, p->vi[v].bytes,
                               kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D, stream));
    /* the graph's constant data is host memory the caller may free: wait for the copies */
    if (kind != MR_DEVICE_CPU) MR_TRY(p->be->stream_sync(stream));
    /* arena pointers now; external ones at each rebinding */
    int32_t npatch = 0;
    for (int32_t n = 0; n < g->nnodes; n++)
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < (k ? g->nodes[n].n_out : g->nodes[n].n_in); i++) {
                int32_t v = k ? g->nodes[n].out[i] : g->nodes[n].in[i];
                if (v && (p->vi[v].src == SRC_EXTERNAL || p->vi[p->vi[v].root].last == end)) npatch++;
            }
    p->patches = calloc((size_t)(npatch ? npatch : 1), sizeof *p->patches);
    MR_CHECK(p->patches, MR_ERR_NOMEM, "plan: out of memory");
    for (int32_t n = 0; n < g->nnodes; n++) {
        mr_op_args *a = &p->args[n];
        a->device = dev.index;
        a->stream = stream;
        if (p->scratch_bytes) {
            a->workspace = p->arena + p->arena_bytes;
            a->workspace_bytes = p->scratch_bytes;
        }
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < (k ? g->nodes[n].n_out : g->nodes[n].n_in); i++) {
                int32_t v = k ? g->nodes[n].out[i] : g->nodes[n].in[i];
                if (!v) continue;
                int32_t r = p->vi[v].root;
                if (p->vi[v].src == SRC_EXTERNAL || p->vi[r].last == end)
                    p->patches[p->npatches++] = (patch){n, k, i, r, p->vi[v].view_off};
                if (p->vi[v].src != SRC_EXTERNAL)
                    (k ? a->out : a->in)[i].data = p->arena + p->vi[r].offset + p->vi[v].view_off;
            }
    }
    p->dirty = 1;
    free(live);
    *out = p;
    return MR_OK;
fail:
    free(live);
    mr_plan_free(p);
    return st;
}

mr_status mr_plan_bind(mr_plan *p, mr_val v, void *data) {
    /* a view covering all of its root's bytes binds the root */
    if (v.id > 0 && v.id < p->nvals && p->vi[v.id].root != v.id && p->vi[v.id].view_off == 0 &&
        p->vi[v.id].bytes == p->vi[p->vi[v.id].root].bytes)
        v.id = p->vi[v.id].root;
    if (v.id <= 0 || v.id >= p->nvals || p->vi[v.id].root != v.id ||
        (p->vi[v.id].src != SRC_EXTERNAL && p->vi[v.id].last != p->nnodes))
        return mr_set_error(MR_ERR_INVALID, "plan: value %d is not an input, param or kept output of this plan",
                            (int)v.id);
    if (!data && p->vi[v.id].bytes && p->vi[v.id].src == SRC_EXTERNAL)
        return mr_set_error(MR_ERR_INVALID, "plan: binding '%s' to NULL", p->names[v.id]);
    p->bound[v.id] = data;
    p->dirty = 1;
    return MR_OK;
}

mr_status mr_plan_run(mr_plan *p) { return mr_plan_run_range(p, 0, p->nnodes); }

mr_status mr_plan_run_range(mr_plan *p, int32_t first, int32_t last) {
    if (first < 0 || last > p->nnodes || first > last)
        return mr_set_error(MR_ERR_INVALID, "plan: kernel range [%d, %d) outside [0, %d)", (int)first, (int)last,
                            (int)p->nnodes);
    if (p->dirty) {
        for (int32_t i = 0; i < p->npatches; i++) {
            const patch *q = &p->patches[i];
            void *d = p->bound[q->value];
            if (!d && p->vi[q->value].src == SRC_ARENA) d = p->arena + p->vi[q->value].offset; /* kept, unbound */
            if (!d && p->vi[q->value].bytes)
                return mr_set_error(MR_ERR_INVALID, "plan: '%s' is not bound (HINT: mr_plan_bind it before running)",
                                    p->names[q->value]);
            (q->is_out ? p->args[q->node].out : p->args[q->node].in)[q->slot].data = d ? (char *)d + q->off : NULL;
        }
        p->dirty = 0;
        /* the captured ranges hold the old pointers */
        drop_captures(p);
    }
    const int traced = p->trace && mr_trace_on(p->trace);
    if (p->graphs && !p->profile && !traced && first < last) {
        mr_capture *c = capture_of(p, first, last);
        if (c) return mr_capture_launch(c, p->stream);
    }
    if (!p->profile && !traced) {
        for (int32_t n = first; n < last; n++) {
            mr_status st = p->fns[n](&p->args[n]);
            if (st != MR_OK) return st;
        }
        return MR_OK;
    }
    for (int32_t n = first; n < last; n++) {
        const int64_t t0 = mr_trace_now_ns();
        mr_status st = p->fns[n](&p->args[n]);
        if (st != MR_OK) return st;
        if (p->kind != MR_DEVICE_CPU) (void)p->be->stream_sync(p->stream); /* time the kernel, not its launch */
        const int64_t t1 = mr_trace_now_ns();
        mr_op_id op = p->args[n].op;
        if (p->profile) {
            p->op_seconds[op] += 1e-9 * (double)(t1 - t0);
            p->op_calls[op]++;
        }
        if (traced) mr_trace_span(p->trace, mr_op_get(op)->name, t0, t1, "node", n, NULL, 0);
    }
    return MR_OK;
}

void mr_plan_set_dropout_step(mr_plan *p, uint64_t step) {
    for (int32_t n = 0; n < p->nnodes; n++)
        if (p->args[n].op == MR_OP_DROPOUT || p->args[n].op == MR_OP_DROPOUT_BWD)
            p->args[n].p.dropout.offset = p->drop_base[n] + (step << 32);
}

int mr_plan_has_dropout(const mr_plan *p) {
    for (int32_t n = 0; n < p->nnodes; n++)
        if (p->args[n].op == MR_OP_DROPOUT || p->args[n].op == MR_OP_DROPOUT_BWD) return 1;
    return 0;
}

mr_status mr_plan_set_graphs(mr_plan *p, int on) {
    if (on && p->kind != MR_DEVICE_CUDA)
        return mr_set_error(MR_ERR_UNSUPPORTED, "plan: CUDA graphs need a plan on a CUDA device");
    if (on && mr_plan_has_dropout(p))
        return mr_set_error(MR_ERR_UNSUPPORTED, "plan: a plan with dropout cannot be replayed from a CUDA graph "
                                                "(its masks change every step)");
    p->graphs = on;
    drop_captures(p);
    return MR_OK;
}

int64_t mr_plan_captures(const mr_plan *p) { return p->captures; }

void mr_plan_set_trace(mr_plan *p, mr_trace_track *k) { p->trace = k; }

void mr_plan_set_profile(mr_plan *p, int on) {
    p->profile = on;
    memset(p->op_seconds, 0, sizeof p->op_seconds);
    memset(p->op_calls, 0, sizeof p->op_calls);
}

void mr_plan_profile_report(const mr_plan *p, FILE *out) {
    double total = 0;
    for (int i = 0; i < MR_OP_COUNT; i++) total += p->op_seconds[i];
    fprintf(out, "%-20s %10s %8s %7s\n", "op", "ms", "calls", "share");
    for (;;) { /* descending by time, without sorting a copy */
        int best = -1;
        for (int i = 0; i < MR_OP_COUNT; i++)
            if (p->op_calls[i] > 0 && (best < 0 || p->op_seconds[i] > p->op_seconds[best])) best = i;
        if (best < 0) break;
        fprintf(out, "%-20s %10.2f %8lld %6.1f%%\n", mr_op_get((mr_op_id)best)->name, 1e3 * p->op_seconds[best],
                (long long)p->op_calls[best], total > 0 ? 100.0 * p->op_seconds[best] / total : 0.0);
        ((mr_plan *)p)->op_calls[best] = -p->op_calls[best]; /* mark printed */
    }
    for (int i = 0; i < MR_OP_COUNT; i++)
        if (p->op_calls[i] < 0) ((mr_plan *)p)->op_calls[i] = -p->op_calls[i];
}

void *mr_plan_data(const mr_plan *p, mr_val v) {
    if (v.id <= 0 || v.id >= p->nvals) return NULL;
    int32_t r = p->vi[v.id].root;
    size_t off = p->vi[v.id].view_off;
    if (p->vi[r].src == SRC_EXTERNAL || p->bound[r]) return p->bound[r] ? (char *)p->bound[r] + off : NULL;
    if (p->vi[r].last < p->nnodes) return NULL; /* not kept: its bytes may have been reused */
    return p->arena + p->vi[r].offset + off;
}

size_t mr_plan_arena_bytes(const mr_plan *p) { return p->arena_bytes; }
size_t mr_plan_unshared_bytes(const mr_plan *p) { return p->unshared_bytes; }
int32_t mr_plan_num_kernels(const mr_plan *p) { return p->nnodes; }

int32_t mr_plan_ready_after(const mr_plan *p, const void *data, size_t bytes) {
    const char *lo = data, *hi = lo + bytes;
    int32_t ready = 0;
    for (int32_t i = 0; i < p->npatches; i++) {
        const patch *q = &p->patches[i];
        const char *b = p->bound[q->value];
        if (!q->is_out || !b) continue;
        const mr_view *out = &p->args[q->node].out[q->slot];
        const char *w = b + q->off, *we = w + mr_shape_numel(&out->shape) * (int64_t)mr_dtype_size(out->dtype);
        if (w < hi && we > lo && q->node + 1 > ready) ready = q->node + 1;
    }
    return ready;
}
