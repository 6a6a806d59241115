/* Reductions on the CPU: f32 fast paths (f64 runs the reference).
 *
 * x's dims are merged into runs of kept and reduced dims (size-1 dims dropped), so any axes mask
 * becomes one of two loops: the innermost run kept (e.g. a sum over rows: each tile of columns
 * accumulates whole rows, vectorised across columns) or reduced (e.g. a sum over the last dim:
 * a vectorised reduction per output element). Every output element is owned by one thread and
 * summed in a fixed order, so results do not depend on the thread count. */
#include "core/ops_impl.h"

#include <math.h>
#include <string.h>

#define RED_PAR_MIN 32768
#define RED_TILE 256

typedef struct red_plan {
    int64_t len;                   /* innermost merged dim */
    int inner_kept;
    int nk, nr;                    /* outer kept / reduced runs */
    int64_t kdim[MR_MAX_DIMS], kxs[MR_MAX_DIMS], kys[MR_MAX_DIMS];
    int64_t rdim[MR_MAX_DIMS], rxs[MR_MAX_DIMS];
    int64_t nq, ns;                /* products of the outer kept / reduced runs */
    int64_t count;                 /* elements per output (for MEAN) */
} red_plan;

/* x (xs) reduced over `axes`; xs has no zero-size dim. */
static void red_plan_make(const mr_shape *xs, uint32_t axes, red_plan *p) {
    int64_t dim[MR_MAX_DIMS], xst[MR_MAX_DIMS], yst[MR_MAX_DIMS];
    int kind[MR_MAX_DIMS], n = 0;
    memset(p, 0, sizeof *p);
    p->count = 1;
    for (int i = 0; i < xs->ndim; i++) {
        int red = (axes >> i) & 1u;
        if (red) p->count *= xs->dim[i];
        if (xs->dim[i] == 1) continue;
        if (n > 0 && kind[n - 1] == red) {
            dim[n - 1] *= xs->dim[i];
        } else {
            dim[n] = xs->dim[i];
            kind[n] = red;
            n++;
        }
    }
    if (n == 0) {
        dim[0] = 1;
        kind[0] = 0;
        n = 1;
    }
    /* x is contiguous; y is contiguous over the kept runs only */
    int64_t sx = 1, sy = 1;
    for (int d = n - 1; d >= 0; d--) {
        xst[d] = sx;
        sx *= dim[d];
        yst[d] = kind[d] ? 0 : sy;
        if (!kind[d]) sy *= dim[d];
    }
    int last = n - 1;
    p->len = dim[last];
    p->inner_kept = !kind[last];
    p->nq = p->ns = 1;
    for (int d = 0; d < last; d++) {
        if (!kind[d]) {
            p->kdim[p->nk] = dim[d];
            p->kxs[p->nk] = xst[d];
            p->kys[p->nk] = yst[d];
            p->nk++;
            p->nq *= dim[d];
        } else {
            p->rdim[p->nr] = dim[d];
            p->rxs[p->nr] = xst[d];
            p->nr++;
            p->ns *= dim[d];
        }
    }
}

static inline int64_t red_kbase(const red_plan *p, int64_t q, int64_t *yoff) {
    int64_t xo = 0, yo = 0;
    for (int d = p->nk - 1; d >= 0; d--) {
        int64_t c = q % p->kdim[d];
        q /= p->kdim[d];
        xo += c * p->kxs[d];
        yo += c * p->kys[d];
    }
    *yoff = yo;
    return xo;
}

static inline int64_t red_rel(const red_plan *p, int64_t s) {
    int64_t xo = 0;
    for (int d = p->nr - 1; d >= 0; d--) {
        xo += (s % p->rdim[d]) * p->rxs[d];
        s /= p->rdim[d];
    }
    return xo;
}

static mr_status f32_only(const mr_op_args *a, mr_dtype dt) {
    return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(dt));
}

/* x (any shape) -> y (x's shape with the reduced dims 1) */
mr_status mr_reduce_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_reduce_fwd_ref(a);
    if (a->in[0].dtype != MR_F32) return f32_only(a, a->in[0].dtype);
    const mr_shape *xs = &a->in[0].shape;
    const float *X = a->in[0].data;
    float *Y = a->out[0].data;
    int64_t ny = mr_shape_numel(&a->out[0].shape);
    if (mr_shape_numel(xs) == 0) { /* every output sums an empty set (MAX is refused by the check) */
        for (int64_t i = 0; i < ny; i++) Y[i] = a->op == MR_OP_MEAN ? NAN : 0.0f;
        return MR_OK;
    }
    red_plan p;
    red_plan_make(xs, a->p.reduce.axes, &p);
    const int is_max = a->op == MR_OP_MAX;
    const float inv = a->op == MR_OP_MEAN ? (float)(1.0 / (double)p.count) : 1.0f;
    const int64_t ntile = p.inner_kept ? (p.len + RED_TILE - 1) / RED_TILE : 1;
    const int64_t work = p.nq * p.ns * p.len;
#pragma omp parallel for schedule(static) if (work > RED_PAR_MIN)
    for (int64_t t = 0; t < p.nq * ntile; t++) {
        int64_t q = t / ntile, c0 = (t % ntile) * RED_TILE, yo;
        int64_t xb = red_kbase(&p, q, &yo);
        if (p.inner_kept) {
            const int64_t cnt = p.len - c0 < RED_TILE ? p.len - c0 : RED_TILE;
            float *restrict py = Y + yo + c0;
            for (int64_t s = 0; s < p.ns; s++) {
                const float *restrict px = X + xb + red_rel(&p, s) + c0;
                if (s == 0) {
#pragma omp simd
                    for (int64_t j = 0; j < cnt; j++) py[j] = px[j];
                } else if (is_max) {
                    /* once py is NaN neither test holds and it stays NaN */
#pragma omp simd
                    for (int64_t j = 0; j < cnt; j++) py[j] = (px[j] > py[j] || px[j] != px[j]) ? px[j] : py[j];
                } else {
#pragma omp simd
                    for (int64_t j = 0; j < cnt; j++) py[j] += px[j];
                }
            }
            if (inv != 1.0f) {
#pragma omp simd
                for (int64_t j = 0; j < cnt; j++) py[j] *= inv;
            }
        } else if (is_max) {
            float m = -INFINITY;
            int nan = 0;
            for (int64_t s = 0; s < p.ns; s++) {
                const float *restrict px = X + xb + red_rel(&p, s);
#pragma omp simd reduction(max : m) reduction(| : nan)
                for (int64_t j = 0; j < p.len; j++) {
                    m = px[j] > m ? px[j] : m;
                    nan |= px[j] != px[j];
                }
            }
            Y[yo] = nan ? NAN : m;
        } else {
            float acc = 0.0f;
            for (int64_t s = 0; s < p.ns; s++) {
                const float *restrict px = X + xb + red_rel(&p, s);
                float part = 0.0f;
#pragma omp simd reduction(+ : part)
                for (int64_t j = 0; j < p.len; j++) part += px[j];
                acc += part;
            }
            Y[yo] = acc * inv;
        }
    }
    return MR_OK;
}

static inline int is_max_at(float x, float y) { return x == y || (y != y && x != x); }

/* MAX_BWD: x (xs), y, dy (reduced) -> dx (xs); the gradient goes to the first maximal element. */
static void max_bwd_f32(const red_plan *p, const float *X, const float *Y, const float *G, float *DX) {
    const int64_t ntile = p->inner_kept ? (p->len + RED_TILE - 1) / RED_TILE : 1;
    const int64_t work = p->nq * p->ns * p->len;
#pragma omp parallel for schedule(static) if (work > RED_PAR_MIN)
    for (int64_t t = 0; t < p->nq * ntile; t++) {
        int64_t q = t / ntile, c0 = (t % ntile) * RED_TILE, yo;
        int64_t xb = red_kbase(p, q, &yo);
        if (p->inner_kept) {
            const int64_t cnt = p->len - c0 < RED_TILE ? p->len - c0 : RED_TILE;
            unsigned char found[RED_TILE];
            memset(found, 0, sizeof found);
            for (int64_t s = 0; s < p->ns; s++) {
                int64_t xo = xb + red_rel(p, s) + c0;
                for (int64_t j = 0; j < cnt; j++) {
                    if (!found[j] && is_max_at(X[xo + j], Y[yo + c0 + j])) {
                        DX[xo + j] = G[yo + c0 + j];
                        found[j] = 1;
                    }
                }
            }
        } else {
            for (int64_t s = 0; s < p->ns; s++) {
                int64_t xo = xb + red_rel(p, s), j = 0;
                while (j < p->len && !is_max_at(X[xo + j], Y[yo])) j++;
                if (j < p->len) {
                    DX[xo + j] = G[yo];
                    break;
                }
            }
        }
    }
}

/* SUM/MEAN: dy (reduced) -> dx (xs); MAX: x (xs), y, dy (reduced) -> dx (xs) */
mr_status mr_reduce_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_reduce_bwd_ref(a);
    const int is_max = a->op == MR_OP_MAX_BWD;
    const mr_view *dy = &a->in[is_max ? 2 : 0];
    if (dy->dtype != MR_F32) return f32_only(a, dy->dtype);
    const mr_shape *xs = &a->out[0].shape;
    const float *G = dy->data;
    float *DX = a->out[0].data;
    int64_t nx = mr_shape_numel(xs);
    if (nx == 0) return MR_OK;
    red_plan p;
    red_plan_make(xs, a->p.reduce.axes, &p);
    if (is_max) {
#pragma omp parallel for simd schedule(static) if (nx > RED_PAR_MIN)
        for (int64_t i = 0; i < nx; i++) DX[i] = 0.0f;
        max_bwd_f32(&p, a->in[0].data, a->in[1].data, G, DX);
        return MR_OK;
    }
    /* dx is contiguous: row u (over every outer run, in order) starts at u*len; its dy offset
     * comes from the kept runs only */
    const float sc = a->op == MR_OP_MEAN_BWD ? (float)(1.0 / (double)p.count) : 1.0f;
    const int64_t rows = nx / p.len;
#pragma omp parallel for schedule(static) if (nx > RED_PAR_MIN)
    for (int64_t u = 0; u < rows; u++) {
        /* the outer runs alternate in x order; walk them back to front by their x strides,
         * picking up dy's offset from the kept ones */
        int64_t rem = u, yo = 0;
        for (int ik = p.nk - 1, ir = p.nr - 1; ik >= 0 || ir >= 0;) {
            if (ik >= 0 && (ir < 0 || p.kxs[ik] < p.rxs[ir])) {
                yo += (rem % p.kdim[ik]) * p.kys[ik];
                rem /= p.kdim[ik];
                ik--;
            } else {
                rem /= p.rdim[ir];
                ir--;
            }
        }
        float *restrict px = DX + u * p.len;
        if (p.inner_kept) {
            const float *restrict pg = G + yo;
#pragma omp simd
            for (int64_t j = 0; j < p.len; j++) px[j] = pg[j] * sc;
        } else {
            const float v = G[yo] * sc;
#pragma omp simd
            for (int64_t j = 0; j < p.len; j++) px[j] = v;
        }
    }
    return MR_OK;
}
