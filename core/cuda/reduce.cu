/* Reductions on the GPU: SUM/MEAN/MAX over an axes mask and their backward, and the backward of
 * the broadcasting binary ops (ADD/SUB/MUL/DIV_BWD), whose gradient for a broadcast input is a
 * sum over the broadcast dims (see ops.h; oracles in core/ref/reduce_ref.c and
 * core/ref/elementwise_ref.c).
 *
 * Both are "reduce an iteration shape into a target": the shape's dims are kept (the target has
 * them) or reduced (summed over). The host merges adjacent dims of one kind that every operand
 * walks contiguously and drops size-1 dims (mr_rplan), so a bias gradient becomes (rows reduced,
 * cols kept) and a last-axis sum (rows kept, cols reduced). Three kernels, picked on the host:
 *   - nothing reduced: one thread per element, grid-stride;
 *   - the innermost run kept (sum over rows): a block owns a tile of adjacent target elements
 *     (threadIdx.x, coalesced) and splits the reduced index over row lanes (threadIdx.y); the
 *     lanes' partials are combined in lane order;
 *   - the innermost run reduced (sum over the last axis): one row group per target element
 *     (core/cuda/rows_impl.h), warp shuffles then shared memory.
 * No atomics: each target element is written by one thread after a combine whose order depends
 * only on the shape, so two runs give the same bits. Sums accumulate in f32 for f32 data, f64
 * for f64. A target element whose reduction is very long (a full-tensor sum) is one block's
 * work; a split over blocks would need a workspace.
 *
 * MAX propagates NaN, as the reference does. MAX_BWD routes each gradient to the first element
 * (row-major over the reduced dims) equal to the forward's max (or the first NaN when the max is
 * NaN): x is contiguous, so the first such element is the one at the smallest offset, found as a
 * min over the offsets of the matches. */
#include "core/cuda/cuda_impl.h"
#include "core/cuda/rows_impl.h"
#include "core/ops_impl.h"

#include <string.h>

/* ---- the plan ---------------------------------------------------------------------------------- */

#define MR_RED_NOP 3 /* operands: x (reductions); dy, a, b (binary backward) */

typedef struct mr_rplan {
    int nop;                                        /* operands in use */
    int nk, nr;                                     /* outer kept / reduced runs */
    int inner_kept;                                 /* the innermost run is kept */
    int64_t len;                                    /* the innermost run's size */
    int64_t in_st[MR_RED_NOP], in_t;                /* its stride in each operand / the target */
    int64_t kdim[MR_MAX_DIMS], kst[MR_RED_NOP][MR_MAX_DIMS], kt[MR_MAX_DIMS];
    int64_t rdim[MR_MAX_DIMS], rst[MR_RED_NOP][MR_MAX_DIMS];
    int64_t nq, ns;                                 /* products of the outer kept / reduced runs */
    /* the merged runs in the shape's order, with the target's strides (0: reduced) */
    int nm;
    int64_t mdim[MR_MAX_DIMS], mt[MR_MAX_DIMS];
} mr_rplan;

/* The plan over iteration shape o (nd dims): st[k] are operand k's element strides per dim,
 * tst the target's (0 on a reduced dim). A dim of o of size > 1 is reduced iff tst is 0. */
static void rplan_make(const mr_shape *o, int nop, int64_t st[MR_RED_NOP][MR_MAX_DIMS], const int64_t *tst,
                       mr_rplan *p) {
    int64_t dim[MR_MAX_DIMS], m[MR_RED_NOP][MR_MAX_DIMS], mt[MR_MAX_DIMS];
    int kind[MR_MAX_DIMS], n = 0;
    memset(p, 0, sizeof *p);
    p->nop = nop;
    for (int d = 0; d < o->ndim; d++) {
        if (o->dim[d] == 1) continue; /* a size-1 dim carries no index */
        int red = tst[d] == 0;
        int merge = n > 0 && kind[n - 1] == red && mt[n - 1] == tst[d] * o->dim[d];
        for (int k = 0; k < nop && merge; k++) merge = m[k][n - 1] == st[k][d] * o->dim[d];
        if (merge) {
            dim[n - 1] *= o->dim[d];
        } else {
            dim[n] = o->dim[d];
            kind[n] = red;
            n++;
        }
        for (int k = 0; k < nop; k++) m[k][n - 1] = st[k][d];
        mt[n - 1] = tst[d];
    }
    if (n == 0) { /* one element */
        dim[0] = 1;
        kind[0] = 0;
        for (int k = 0; k < nop; k++) m[k][0] = 1;
        mt[0] = 1;
        n = 1;
    }
    p->nm = n;
    for (int d = 0; d < n; d++) {
        p->mdim[d] = dim[d];
        p->mt[d] = mt[d];
    }
    int last = n - 1;
    p->len = dim[last];
    p->inner_kept = !kind[last];
    for (int k = 0; k < nop; k++) p->in_st[k] = m[k][last];
    p->in_t = mt[last];
    p->nq = p->ns = 1;
    for (int d = 0; d < last; d++) {
        if (!kind[d]) {
            p->kdim[p->nk] = dim[d];
            for (int k = 0; k < nop; k++) p->kst[k][p->nk] = m[k][d];
            p->kt[p->nk] = mt[d];
            p->nk++;
            p->nq *= dim[d];
        } else {
            p->rdim[p->nr] = dim[d];
            for (int k = 0; k < nop; k++) p->rst[k][p->nr] = m[k][d];
            p->nr++;
            p->ns *= dim[d];
        }
    }
}

/* Offsets of outer kept index q (< nq) in each operand and in the target. The outermost run
 * takes what is left of q, so a single run costs no division. */
template <int NOP>
__device__ __forceinline__ void rplan_kept(const mr_rplan &p, int64_t q, int64_t *off, int64_t *to) {
    int64_t t = 0;
#pragma unroll
    for (int k = 0; k < NOP; k++) off[k] = 0;
    if (p.nk == 0) {
        *to = 0;
        return;
    }
    for (int d = p.nk - 1; d > 0; d--) {
        int64_t c = q % p.kdim[d];
        q /= p.kdim[d];
#pragma unroll
        for (int k = 0; k < NOP; k++) off[k] += c * p.kst[k][d];
        t += c * p.kt[d];
    }
#pragma unroll
    for (int k = 0; k < NOP; k++) off[k] += q * p.kst[k][0];
    *to = t + q * p.kt[0];
}

/* Offsets of outer reduced index s (< ns) in each operand. */
template <int NOP>
__device__ __forceinline__ void rplan_red(const mr_rplan &p, int64_t s, int64_t *off) {
#pragma unroll
    for (int k = 0; k < NOP; k++) off[k] = 0;
    if (p.nr == 0) return;
    for (int d = p.nr - 1; d > 0; d--) {
        int64_t c = s % p.rdim[d];
        s /= p.rdim[d];
#pragma unroll
        for (int k = 0; k < NOP; k++) off[k] += c * p.rst[k][d];
    }
#pragma unroll
    for (int k = 0; k < NOP; k++) off[k] += s * p.rst[k][0];
}

/* ---- the three kernels --------------------------------------------------------------------------
 * A functor F gives: the accumulator type A; init(); step(acc, off, to) folding in the element at
 * operand offsets off[] for target element `to`; operator()(a, b) combining two partials; and
 * store(to, acc). */

/* Nothing reduced (ns == 1 and the innermost run kept): one thread per element of the (nq, len)
 * iteration. */
template <int NOP, typename F>
__global__ void mr_red_flat_kernel(mr_rplan p, F f) {
    const int64_t n = p.nq * p.len;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t q = p.nk ? i / p.len : 0, c = p.nk ? i % p.len : i, off[NOP], to;
        rplan_kept<NOP>(p, q, off, &to);
#pragma unroll
        for (int k = 0; k < NOP; k++) off[k] += c * p.in_st[k];
        f.store(to + c * p.in_t, f.step(f.init(), off, to + c * p.in_t));
    }
}

/* Innermost run kept: a block owns COLS adjacent inner elements of one outer kept index and
 * splits the reduced index s over LANES row lanes (s = lane, lane + LANES, ...). */
template <int COLS, int LANES, int NOP, typename F>
__global__ void __launch_bounds__(COLS *LANES) mr_red_cols_kernel(mr_rplan p, F f) {
    typedef typename F::A A;
    __shared__ A sh[LANES][COLS];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t ntile = (p.len + COLS - 1) / COLS, tiles = p.nq * ntile;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) { /* block-uniform: the syncs below */
        const int64_t q = t / ntile, c = (t % ntile) * COLS + tx;
        const bool ok = c < p.len;
        int64_t base[NOP], rel[NOP], off[NOP], to;
        rplan_kept<NOP>(p, q, base, &to);
        to += c * p.in_t;
        A acc = f.init();
        if (ok) {
            for (int64_t s = ty; s < p.ns; s += LANES) {
                rplan_red<NOP>(p, s, rel);
#pragma unroll
                for (int k = 0; k < NOP; k++) off[k] = base[k] + rel[k] + c * p.in_st[k];
                acc = f.step(acc, off, to);
            }
        }
        sh[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && ok) {
            A r = sh[0][tx];
            for (int l = 1; l < LANES; l++) r = f(r, sh[l][tx]);
            f.store(to, r);
        }
        __syncthreads(); /* sh is rewritten by the next tile */
    }
}

/* Innermost run reduced: one row group of NX threads per outer kept index q; the group walks
 * the ns * len reduced elements k = lane, lane + NX, ... (k = s * len + j). */
template <int NX, int RY, int NOP, typename F>
__global__ void __launch_bounds__(NX *RY) mr_red_rows_kernel(mr_rplan p, F f) {
    typedef typename F::A A;
    __shared__ A sh[32];
    const int64_t total = p.ns * p.len, ds = NX / p.len, dj = NX % p.len;
    for (int64_t b = (int64_t)blockIdx.x * RY; b < p.nq; b += (int64_t)gridDim.x * RY) {
        const int64_t q = b + threadIdx.y;
        const bool ok = q < p.nq; /* the block stays together through the reduction */
        int64_t base[NOP], rel[NOP], off[NOP], to = 0;
        A acc = f.init();
        if (ok) {
            rplan_kept<NOP>(p, q, base, &to);
            int64_t s = threadIdx.x / p.len, j = threadIdx.x % p.len, rs = -1;
            for (int64_t k = threadIdx.x; k < total; k += NX) {
                if (s != rs) {
                    rplan_red<NOP>(p, s, rel);
                    rs = s;
                }
#pragma unroll
                for (int i = 0; i < NOP; i++) off[i] = base[i] + rel[i] + j * p.in_st[i];
                acc = f.step(acc, off, to);
                j += dj;
                s += ds;
                if (j >= p.len) {
                    j -= p.len;
                    s++;
                }
            }
        }
        acc = mr_row_reduce<NX>(acc, sh, f);
        if (ok && threadIdx.x == 0) f.store(to, acc);
    }
}

/* Launches the kernel the plan calls for. */
template <int NOP, typename F>
static void rplan_launch(const mr_rplan *p, const F &f, cudaStream_t s) {
    if (p->ns == 1 && p->inner_kept) { /* ns counts only the outer reduced runs */
        mr_red_flat_kernel<NOP><<<mr_cuda_grid(p->nq * p->len), MR_CUDA_BLOCK, 0, s>>>(*p, f);
    } else if (p->inner_kept) {
        int64_t ntile;
        /* many reduced rows: 64 lanes over 8 columns (one 32-byte sector of f32); few: 8 lanes
         * over 64 columns, so the lanes are not idle */
        if (p->ns >= 256) {
            ntile = p->nq * ((p->len + 7) / 8);
            mr_red_cols_kernel<8, 64, NOP><<<mr_row_grid(ntile, 1), dim3(8, 64), 0, s>>>(*p, f);
        } else {
            ntile = p->nq * ((p->len + 63) / 64);
            mr_red_cols_kernel<64, 8, NOP><<<mr_row_grid(ntile, 1), dim3(64, 8), 0, s>>>(*p, f);
        }
    } else {
        switch (mr_row_threads(p->ns * p->len)) {
        case 32: mr_red_rows_kernel<32, 4, NOP><<<mr_row_grid(p->nq, 4), dim3(32, 4), 0, s>>>(*p, f); break;
        case 256: mr_red_rows_kernel<256, 1, NOP><<<mr_row_grid(p->nq, 1), dim3(256, 1), 0, s>>>(*p, f); break;
        default: mr_red_rows_kernel<1024, 1, NOP><<<mr_row_grid(p->nq, 1), dim3(1024, 1), 0, s>>>(*p, f); break;
        }
    }
}

/* ---- functors ------------------------------------------------------------------------------------ */

/* SUM and MEAN (scale 1/count; 1 for SUM, which is exact). x is operand 0; y the target. */
template <typename T> struct mr_rf_sum {
    typedef typename mr_acc_t<T>::A A;
    const T *x;
    T *y;
    A scale;
    __device__ A init() const { return (A)0; }
    __device__ A step(A acc, const int64_t *off, int64_t) const { return acc + (A)x[off[0]]; }
    __device__ A operator()(A a, A b) const { return a + b; }
    __device__ void store(int64_t to, A acc) const { y[to] = (T)(acc * scale); }
};

/* MAX with NaN propagation: a NaN replaces the running max and nothing replaces a NaN. */
template <typename T> struct mr_rf_max {
    typedef T A;
    const T *x;
    T *y;
    __device__ A init() const { return (A)-INFINITY; }
    __device__ A operator()(A a, A b) const { return (b > a || b != b) ? b : a; }
    __device__ A step(A acc, const int64_t *off, int64_t) const { return (*this)(acc, x[off[0]]); }
    __device__ void store(int64_t to, A acc) const { y[to] = acc; }
};

/* MAX_BWD: the smallest x offset whose value is the forward's max y[to] (both NaN counts as
 * equal); dx was zeroed before, and store routes dy[to] there. */
#define MR_RF_NONE INT64_MAX
template <typename T> struct mr_rf_argmax {
    typedef int64_t A;
    const T *x, *y, *g;
    T *dx;
    __device__ A init() const { return MR_RF_NONE; }
    __device__ A operator()(A a, A b) const { return b < a ? b : a; }
    __device__ A step(A acc, const int64_t *off, int64_t to) const {
        if (acc != MR_RF_NONE) return acc; /* each thread walks offsets upward: its first match stays */
        T v = x[off[0]], m = y[to];
        return (v == m || (v != v && m != m)) ? off[0] : acc;
    }
    __device__ void store(int64_t to, A acc) const {
        if (acc != MR_RF_NONE) dx[acc] = g[to];
    }
};

/* Binary backward: the gradient of one input summed over its broadcast dims. Operands 0, 1, 2
 * are dy, a, b; K picks the per-element gradient (a and b are read only by the kinds that need
 * them: ADD/SUB may pass NULL). */
enum { MR_BG_ID, MR_BG_NEG, MR_BG_MUL_A, MR_BG_MUL_B, MR_BG_DIV_A, MR_BG_DIV_B };
template <typename T, int K> struct mr_rf_bgrad {
    typedef typename mr_acc_t<T>::A A;
    const T *g, *a, *b;
    T *t;
    __device__ A init() const { return (A)0; }
    __device__ A operator()(A u, A v) const { return u + v; }
    __device__ A step(A acc, const int64_t *off, int64_t) const {
        const T gv = g[off[0]];
        T v;
        if (K == MR_BG_ID) v = gv;
        else if (K == MR_BG_NEG) v = -gv;
        else if (K == MR_BG_MUL_A) v = gv * b[off[2]];
        else if (K == MR_BG_MUL_B) v = gv * a[off[1]];
        else if (K == MR_BG_DIV_A) v = gv / b[off[2]];
        else v = -gv * a[off[1]] / (b[off[2]] * b[off[2]]);
        return acc + (A)v;
    }
    __device__ void store(int64_t to, A acc) const { t[to] = (T)acc; }
};

/* Fills y (n) with v (SUM/MEAN of empty sets). */
template <typename T>
__global__ void mr_red_fill_kernel(T *__restrict__ y, int64_t n, T v) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = v;
}

/* dx (nx, x's shape) = dy at the target offset of each x element * scale: the merged runs of the
 * plan in x order, with dy's strides (0 on reduced runs). */
template <typename T>
__global__ void mr_red_bcast_kernel(const T *__restrict__ g, T *__restrict__ dx, int64_t nx, mr_rplan p, T scale) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nx; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i, yo = 0;
        for (int d = p.nm - 1; d > 0; d--) {
            yo += (r % p.mdim[d]) * p.mt[d];
            r /= p.mdim[d];
        }
        yo += r * p.mt[0];
        dx[i] = g[yo] * scale;
    }
}

/* ---- reductions --------------------------------------------------------------------------------- */

static mr_status float_dtype(const mr_op_args *a, mr_dtype dt) {
    if (dt == MR_F32 || dt == MR_F64) return MR_OK;
    return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
}

/* The plan of reducing x (xs) over `axes`: operand 0 is x; the target y is contiguous over the
 * kept dims. Also the element count per output (for MEAN). */
static void reduce_plan(const mr_shape *xs, uint32_t axes, mr_rplan *p, int64_t *count) {
    int64_t st[MR_RED_NOP][MR_MAX_DIMS] = {{0}}, ys[MR_MAX_DIMS], tst[MR_MAX_DIMS];
    mr_shape y = *xs;
    *count = 1;
    for (int d = 0; d < xs->ndim; d++)
        if (axes & (1u << d)) {
            y.dim[d] = 1;
            *count *= xs->dim[d];
        }
    mr_shape_strides(xs, st[0]);
    mr_shape_strides(&y, ys);
    for (int d = 0; d < xs->ndim; d++) tst[d] = (axes & (1u << d)) ? 0 : ys[d];
    rplan_make(xs, 1, st, tst, p);
}

template <typename T>
static void reduce_fwd_launch(const mr_op_args *a, cudaStream_t s, const mr_rplan *p, int64_t count) {
    const T *x = (const T *)a->in[0].data;
    T *y = (T *)a->out[0].data;
    if (a->op == MR_OP_MAX) {
        mr_rf_max<T> f = {x, y};
        rplan_launch<1>(p, f, s);
    } else {
        typedef typename mr_acc_t<T>::A A;
        /* the CPU kernel's scale: 1/count formed in double, rounded once */
        mr_rf_sum<T> f = {x, y, a->op == MR_OP_MEAN ? (A)(1.0 / (double)count) : (A)1};
        rplan_launch<1>(p, f, s);
    }
}

/* x (any shape) -> y (x's shape with the reduced dims 1) */
extern "C" mr_status mr_reduce_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    const mr_shape *xs = &a->in[0].shape;
    const int64_t ny = mr_shape_numel(&a->out[0].shape);
    MR_TRY(float_dtype(a, a->in[0].dtype));
    if (ny == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (mr_shape_numel(xs) == 0) { /* every output reduces an empty set (MAX is refused by the check) */
        double v = a->op == MR_OP_MEAN ? NAN : 0.0;
        if (a->in[0].dtype == MR_F32)
            mr_red_fill_kernel<float><<<mr_cuda_grid(ny), MR_CUDA_BLOCK, 0, s>>>((float *)a->out[0].data, ny, (float)v);
        else
            mr_red_fill_kernel<double><<<mr_cuda_grid(ny), MR_CUDA_BLOCK, 0, s>>>((double *)a->out[0].data, ny, v);
        return mr_cuda_check_launch(mr_op_get(a->op)->name);
    }
    {
        mr_rplan p;
        int64_t count;
        reduce_plan(xs, a->p.reduce.axes, &p, &count);
        if (a->in[0].dtype == MR_F32)
            reduce_fwd_launch<float>(a, s, &p, count);
        else
            reduce_fwd_launch<double>(a, s, &p, count);
    }
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
fail:
    return st;
}

template <typename T>
static mr_status reduce_bwd_launch(const mr_op_args *a, cudaStream_t s, const mr_rplan *p, int64_t count,
                                   int64_t nx) {
    mr_status st = MR_OK;
    T *dx = (T *)a->out[0].data;
    if (a->op == MR_OP_MAX_BWD) {
        /* every element but the routed ones gets 0 */
        MR_TRY_CUDA(cudaMemsetAsync(dx, 0, (size_t)nx * sizeof(T), s));
        mr_rf_argmax<T> f = {(const T *)a->in[0].data, (const T *)a->in[1].data, (const T *)a->in[2].data, dx};
        rplan_launch<1>(p, f, s);
    } else {
        T scale = a->op == MR_OP_MEAN_BWD ? (T)(1.0 / (double)count) : (T)1;
        mr_red_bcast_kernel<T><<<mr_cuda_grid(nx), MR_CUDA_BLOCK, 0, s>>>((const T *)a->in[0].data, dx, nx, *p, scale);
    }
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
fail:
    return st;
}

/* SUM/MEAN: dy (reduced) -> dx (xs); MAX: x (xs), y, dy (reduced) -> dx (xs) */
extern "C" mr_status mr_reduce_bwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    const mr_shape *xs = &a->out[0].shape;
    const int64_t nx = mr_shape_numel(xs);
    MR_TRY(float_dtype(a, a->out[0].dtype));
    if (nx == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    {
        mr_rplan p;
        int64_t count;
        reduce_plan(xs, a->p.reduce.axes, &p, &count);
        return a->out[0].dtype == MR_F32 ? reduce_bwd_launch<float>(a, s, &p, count, nx)
                                         : reduce_bwd_launch<double>(a, s, &p, count, nx);
    }
fail:
    return st;
}

/* ---- binary backward ---------------------------------------------------------------------------- */

/* Strides of `in` aligned to the nd-dim broadcast shape `o`: 0 where in has no dim or a dim of 1. */
static void bcast_strides(const mr_shape *in, int nd, int64_t *st) {
    int64_t own[MR_MAX_DIMS];
    mr_shape_strides(in, own);
    int off = nd - in->ndim;
    for (int d = 0; d < nd; d++) {
        int di = d - off;
        st[d] = (di >= 0 && in->dim[di] != 1) ? own[di] : 0;
    }
}

/* One gradient: target `which` (1: da, 2: db) of kind K. */
template <typename T, int K>
static void bgrad_launch(const mr_op_args *a, cudaStream_t s, int which) {
    const mr_shape *o = &a->in[2].shape;
    int64_t st[MR_RED_NOP][MR_MAX_DIMS];
    mr_shape_strides(o, st[0]);
    bcast_strides(&a->in[0].shape, o->ndim, st[1]);
    bcast_strides(&a->in[1].shape, o->ndim, st[2]);
    mr_rplan p;
    rplan_make(o, 3, st, st[which], &p);
    mr_rf_bgrad<T, K> f = {(const T *)a->in[2].data, (const T *)a->in[0].data, (const T *)a->in[1].data,
                           (T *)a->out[which - 1].data};
    rplan_launch<3>(&p, f, s);
}

template <typename T>
static void binary_bwd_launch(const mr_op_args *a, cudaStream_t s) {
    if (a->out[0].data) {
        switch (a->op) {
        case MR_OP_ADD_BWD: case MR_OP_SUB_BWD: bgrad_launch<T, MR_BG_ID>(a, s, 1); break;
        case MR_OP_MUL_BWD: bgrad_launch<T, MR_BG_MUL_A>(a, s, 1); break;
        default: bgrad_launch<T, MR_BG_DIV_A>(a, s, 1); break;
        }
    }
    if (a->out[1].data) {
        switch (a->op) {
        case MR_OP_ADD_BWD: bgrad_launch<T, MR_BG_ID>(a, s, 2); break;
        case MR_OP_SUB_BWD: bgrad_launch<T, MR_BG_NEG>(a, s, 2); break;
        case MR_OP_MUL_BWD: bgrad_launch<T, MR_BG_MUL_B>(a, s, 2); break;
        default: bgrad_launch<T, MR_BG_DIV_B>(a, s, 2); break;
        }
    }
}

/* a, b (optional for ADD/SUB), dy (broadcast shape) -> da (a's shape), db (b's shape), each
 * optional */
extern "C" mr_status mr_binary_bwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    const mr_dtype dt = a->in[2].dtype;
    const size_t es = mr_dtype_size(dt);
    MR_TRY(float_dtype(a, dt));
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (mr_shape_numel(&a->in[2].shape) == 0) { /* nothing is summed: the gradients are zero */
        if (a->out[0].data)
            MR_TRY_CUDA(cudaMemsetAsync(a->out[0].data, 0, (size_t)mr_shape_numel(&a->in[0].shape) * es, s));
        if (a->out[1].data)
            MR_TRY_CUDA(cudaMemsetAsync(a->out[1].data, 0, (size_t)mr_shape_numel(&a->in[1].shape) * es, s));
        return MR_OK;
    }
    if (dt == MR_F32)
        binary_bwd_launch<float>(a, s);
    else
        binary_bwd_launch<double>(a, s);
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
fail:
    return st;
}
