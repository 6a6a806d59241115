/* Scaled dot-product attention, CPU fast path (f32, and bf16/f16 computed in f32; f64 runs the
 * reference). The rows of core/math/attention_math.h, parallel over the (batch, head) slices: a
 * slice's backward accumulates dk and dv over its query rows in row order on one thread, so the
 * results do not depend on the thread count and need no atomics.
 *
 * Workspace: one slot per thread (omp_get_max_threads() at sizing time; the kernel runs on as many
 * threads as the workspace has slots): a probability row (S floats) and, for half inputs, f32
 * copies of the slice's operands (forward q, k, v, y; backward q, k, v, y, dy and the f32 dq, dk,
 * dv), rounded to the half type once at the end. The (T, S) score matrix is never stored. */
#include "core/ops_impl.h"
#include "core/math/attention_math.h"
#include "core/math/half_math.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_max_threads(void) { return 1; }
static int omp_get_thread_num(void) { return 0; }
#endif

/* Below this many multiply-adds the loop stays on one thread. */
#define ATTN_PAR_MIN (1 << 16)

typedef struct attn_dims {
    int64_t bh, t, s, d;
    int half; /* 0 f32, 1 bf16, 2 f16 */
} attn_dims;

static void attn_dims_get(const mr_op_args *a, attn_dims *g) {
    const mr_shape *q = &a->in[0].shape;
    g->t = q->dim[q->ndim - 2];
    g->d = q->dim[q->ndim - 1];
    g->s = a->in[1].shape.dim[q->ndim - 2];
    g->bh = mr_shape_numel(q) / (g->t * g->d);
    g->half = a->in[0].dtype == MR_BF16 ? 1 : a->in[0].dtype == MR_F16 ? 2 : 0;
}

/* Floats of one thread's slot. */
static int64_t slot_floats(const attn_dims *g, int bwd) {
    int64_t n = (g->s + 15) / 16 * 16;
    if (g->half) n += bwd ? 4 * (g->t + g->s) * g->d : 2 * (g->t + g->s) * g->d;
    return n;
}

static size_t workspace(const mr_op_args *a, int bwd) {
    if (mr_op_is_f64(a) || a->in[0].shape.ndim < 2 || a->in[1].shape.ndim != a->in[0].shape.ndim) return 0;
    attn_dims g;
    attn_dims_get(a, &g);
    return (size_t)omp_get_max_threads() * (size_t)slot_floats(&g, bwd) * sizeof(float);
}

size_t mr_attention_fwd_workspace(const mr_op_args *a) { return workspace(a, 0); }
size_t mr_attention_bwd_workspace(const mr_op_args *a) { return workspace(a, 1); }

/* n half values from src (element offset off) into f32 dst. */
static void widen(float *dst, const void *src, int64_t off, int64_t n, int half) {
    const uint16_t *h = (const uint16_t *)src + off;
    for (int64_t i = 0; i < n; i++) dst[i] = half == 1 ? mr_bf16_to_f32(h[i]) : mr_f16_to_f32(h[i]);
}

static void narrow(void *dst, int64_t off, const float *src, int64_t n, int half) {
    uint16_t *h = (uint16_t *)dst + off;
    for (int64_t i = 0; i < n; i++) h[i] = half == 1 ? mr_f32_to_bf16(src[i]) : mr_f32_to_f16(src[i]);
}

/* The thread count: the workspace's slots (at least 1), or 1 for a small op. */
static int attn_threads(const mr_op_args *a, const attn_dims *g, int bwd) {
    int64_t slots = (int64_t)(a->workspace_bytes / ((size_t)slot_floats(g, bwd) * sizeof(float)));
    int64_t work = g->bh * g->t * g->s * g->d;
    if (slots > g->bh) slots = g->bh;
    return work < ATTN_PAR_MIN || slots < 1 ? 1 : (int)slots;
}

static mr_status need_workspace(const mr_op_args *a, const attn_dims *g, int bwd) {
    if (!a->workspace || a->workspace_bytes < (size_t)slot_floats(g, bwd) * sizeof(float))
        return mr_op_error(a, "needs a workspace of at least %lld bytes", (long long)slot_floats(g, bwd) * 4);
    return MR_OK;
}

mr_status mr_attention_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_attention_fwd_ref(a);
    attn_dims g;
    attn_dims_get(a, &g);
    mr_status st = need_workspace(a, &g, 0);
    if (st != MR_OK) return st;
    const int64_t t = g.t, s = g.s, d = g.d, slot = slot_floats(&g, 0);
    const float scale = (float)a->p.attention.scale;
    const int causal = a->p.attention.causal, nth = attn_threads(a, &g, 0);
    float *lse = a->out[1].data;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int64_t b = 0; b < g.bh; b++) {
        float *p = (float *)a->workspace + (int64_t)omp_get_thread_num() * slot;
        const float *q, *k, *v;
        float *y;
        if (g.half) {
            float *w = p + (s + 15) / 16 * 16;
            widen(w, a->in[0].data, b * t * d, t * d, g.half);
            widen(w + t * d, a->in[1].data, b * s * d, s * d, g.half);
            widen(w + (t + s) * d, a->in[2].data, b * s * d, s * d, g.half);
            q = w, k = w + t * d, v = w + (t + s) * d, y = w + (t + 2 * s) * d;
        } else {
            q = (const float *)a->in[0].data + b * t * d;
            k = (const float *)a->in[1].data + b * s * d;
            v = (const float *)a->in[2].data + b * s * d;
            y = (float *)a->out[0].data + b * t * d;
        }
        for (int64_t i = 0; i < t; i++)
            lse[b * t + i] =
                mr_attn_row_fwd_f32(q + i * d, k, v, mr_attn_keys(i, t, s, causal), d, scale, p, y + i * d);
        if (g.half) narrow(a->out[0].data, b * t * d, y, t * d, g.half);
    }
    return MR_OK;
}

mr_status mr_attention_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_attention_bwd_ref(a);
    attn_dims g;
    attn_dims_get(a, &g);
    mr_status st = need_workspace(a, &g, 1);
    if (st != MR_OK) return st;
    const int64_t t = g.t, s = g.s, d = g.d, slot = slot_floats(&g, 1);
    const float scale = (float)a->p.attention.scale;
    const int causal = a->p.attention.causal, nth = attn_threads(a, &g, 1);
    const float *lse = a->in[4].data;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int64_t b = 0; b < g.bh; b++) {
        float *p = (float *)a->workspace + (int64_t)omp_get_thread_num() * slot;
        const float *q, *k, *v, *y, *dy;
        float *dq, *dk, *dv;
        if (g.half) {
            float *w = p + (s + 15) / 16 * 16;
            const int64_t td = t * d, sd = s * d;
            widen(w, a->in[0].data, b * td, td, g.half);
            widen(w + td, a->in[3].data, b * td, td, g.half);
            widen(w + 2 * td, a->in[5].data, b * td, td, g.half);
            widen(w + 4 * td, a->in[1].data, b * sd, sd, g.half);
            widen(w + 4 * td + sd, a->in[2].data, b * sd, sd, g.half);
            q = w, y = w + td, dy = w + 2 * td, dq = w + 3 * td;
            k = w + 4 * td, v = w + 4 * td + sd, dk = w + 4 * td + 2 * sd, dv = w + 4 * td + 3 * sd;
        } else {
            q = (const float *)a->in[0].data + b * t * d;
            k = (const float *)a->in[1].data + b * s * d;
            v = (const float *)a->in[2].data + b * s * d;
            y = (const float *)a->in[3].data + b * t * d;
            dy = (const float *)a->in[5].data + b * t * d;
            dq = (float *)a->out[0].data + b * t * d;
            dk = (float *)a->out[1].data + b * s * d;
            dv = (float *)a->out[2].data + b * s * d;
        }
        memset(dk, 0, (size_t)(s * d) * sizeof *dk);
        memset(dv, 0, (size_t)(s * d) * sizeof *dv);
        for (int64_t i = 0; i < t; i++)
            mr_attn_row_bwd_f32(q + i * d, k, v, y + i * d, dy + i * d, lse[b * t + i], mr_attn_keys(i, t, s, causal),
                                d, scale, p, dq + i * d, dk, dv);
        if (g.half) {
            narrow(a->out[0].data, b * t * d, dq, t * d, g.half);
            narrow(a->out[1].data, b * s * d, dk, s * d, g.half);
            narrow(a->out[2].data, b * s * d, dv, s * d, g.half);
        }
    }
    return MR_OK;
}
