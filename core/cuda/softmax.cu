/* Softmax, log-softmax (over the last axis, with the causal variant) and fused softmax
 * cross-entropy on the GPU, forward and backward (see ops.h; the oracle is
 * core/ref/softmax_ref.c).
 *
 * One row group per row (core/cuda/rows_impl.h): a warp for rows up to 1024 columns (4 rows to a
 * block), 256 threads up to 16384, a 1024-thread block beyond (a 50257-wide vocabulary row).
 * Each pass walks the row with the group's stride, coalesced; the forward makes three passes
 * (max, sum of exp(x - max), write), the second and third hitting L1/L2. Row statistics
 * accumulate in f32 for f32 data and f64 for f64, and are combined in a fixed order, so two runs
 * give the same bits. The per-element steps are core/math/softmax_math.h, shared with the CPU
 * kernels and the reference.
 *
 * Labels: the CPU kernels reject a label outside [0, C) that is not ignore_index before writing
 * anything (mr_xent_check_labels). Here the labels live on the device and checking them on the
 * host would cost a copy and a sync per step, so the kernels do not fail: such a row gets a NaN
 * loss and a NaN gradient row (its probabilities are still written), which the trainer's finite
 * check catches: a skipped step under loss scaling, otherwise a "non-finite loss" error. */
#include "core/cuda/cuda_impl.h"
#include "core/cuda/rows_impl.h"
#include "core/math/softmax_math.h"
#include "core/ops_impl.h"

/* The math of softmax_math.h by type, so one template serves f32 and f64. */
template <typename T> struct mr_sm;
#define MR_SM_TRAITS(T, S)                                                                      \
    template <> struct mr_sm<T> {                                                               \
        static __device__ T prob(T x, T m, T inv) { return mr_softmax_prob_##S(x, m, inv); }    \
        static __device__ T log_prob(T x, T m, T ls) { return mr_log_softmax_##S(x, m, ls); }   \
        static __device__ T grad(T y, T dy, T dot) { return mr_softmax_grad_##S(y, dy, dot); }  \
        static __device__ T log_grad(T y, T dy, T sum) { return mr_log_softmax_grad_##S(y, dy, sum); } \
        static __device__ T loss(T m, T xl, T s) { return mr_xent_loss_##S(m, xl, s); }         \
        static __device__ T xent_grad(T g, T p, int is_label) { return mr_xent_grad_##S(g, p, is_label); } \
    };
MR_SM_TRAITS(float, f32)
MR_SM_TRAITS(double, f64)

/* The row maximum of xr[0, n) and the sum of exp(xr[j] - max) over the row group. */
template <typename T, int NX>
__device__ __forceinline__ void mr_row_max_sum(const T *__restrict__ xr, int64_t n, T *sh, T *m_out, T *s_out) {
    T m = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += NX) {
        T v = xr[j];
        m = v > m ? v : m;
    }
    m = mr_row_reduce<NX>(m, sh, mr_op_max<T>());
    T s = 0;
    for (int64_t j = threadIdx.x; j < n; j += NX) s += mr_dexp(xr[j] - m);
    *s_out = mr_row_reduce<NX>(s, sh, mr_op_sum<T>());
    *m_out = m;
}

/* ---- softmax, log-softmax ---------------------------------------------------------------------- */

/* x, y are (rows, cols). t_causal: T of x (..., T, S) when causal (row r sees its first
 * r % T + 1 + S - T columns, the rest get 0), 0 otherwise. */
template <typename T, int NX, int RY>
__global__ void __launch_bounds__(NX *RY)
    mr_softmax_fwd_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t rows, int64_t cols, int64_t t_causal,
                          int log_sm) {
    __shared__ T sh[32];
    for (int64_t base = (int64_t)blockIdx.x * RY; base < rows; base += (int64_t)gridDim.x * RY) {
        const int64_t row = base + threadIdx.y;
        const bool ok = row < rows; /* the block stays together through the reductions */
        const T *xr = x + (ok ? row : 0) * cols;
        const int64_t n = !ok ? 0 : t_causal ? row % t_causal + 1 + cols - t_causal : cols;
        T m, s;
        mr_row_max_sum<T, NX>(xr, n, sh, &m, &s);
        if (!ok) continue;
        T *yr = y + row * cols;
        if (log_sm) {
            const T ls = mr_dlog(s);
            for (int64_t j = threadIdx.x; j < cols; j += NX) yr[j] = mr_sm<T>::log_prob(xr[j], m, ls);
        } else {
            const T inv = (T)1 / s;
            for (int64_t j = threadIdx.x; j < cols; j += NX) yr[j] = j < n ? mr_sm<T>::prob(xr[j], m, inv) : (T)0;
        }
    }
}

/* y, dy, dx are (rows, cols) */
template <typename T, int NX, int RY>
__global__ void __launch_bounds__(NX *RY)
    mr_softmax_bwd_kernel(const T *__restrict__ y, const T *__restrict__ dy, T *__restrict__ dx, int64_t rows,
                          int64_t cols, int log_sm) {
    __shared__ T sh[32];
    for (int64_t base = (int64_t)blockIdx.x * RY; base < rows; base += (int64_t)gridDim.x * RY) {
        const int64_t row = base + threadIdx.y;
        const bool ok = row < rows;
        const int64_t n = ok ? cols : 0;
        const T *yr = y + (ok ? row : 0) * cols, *gr = dy + (ok ? row : 0) * cols;
        T s = 0;
        if (log_sm)
            for (int64_t j = threadIdx.x; j < n; j += NX) s += gr[j];
        else
            for (int64_t j = threadIdx.x; j < n; j += NX) s += gr[j] * yr[j];
        s = mr_row_reduce<NX>(s, sh, mr_op_sum<T>());
        if (!ok) continue;
        T *dr = dx + row * cols;
        if (log_sm)
            for (int64_t j = threadIdx.x; j < cols; j += NX) dr[j] = mr_sm<T>::log_grad(yr[j], gr[j], s);
        else
            for (int64_t j = threadIdx.x; j < cols; j += NX) dr[j] = mr_sm<T>::grad(yr[j], gr[j], s);
    }
}

/* Element types the kernels take: f32 and f64 (the checks accept no others). */
static mr_status float_dtype(const mr_op_args *a, mr_dtype dt) {
    if (dt == MR_F32 || dt == MR_F64) return MR_OK;
    return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
}

/* What every entry point of this file does around its launch: the dtype check, in[0] as (rows,
 * cols), nothing to do for no rows (or, with empty_cols_ok == 0, no columns), the op's stream, and
 * the launch for f32 or f64. */
typedef void (*rows_launch_fn)(const mr_op_args *a, cudaStream_t s, int64_t rows, int64_t cols);
static mr_status run_rows(const mr_op_args *a, rows_launch_fn f32, rows_launch_fn f64, int empty_cols_ok) {
    mr_status st = MR_OK;
    cudaStream_t s;
    int64_t rows, cols;
    MR_TRY(float_dtype(a, a->in[0].dtype));
    mr_shape_rows_cols(&a->in[0].shape, &rows, &cols);
    if (rows == 0 || (cols == 0 && !empty_cols_ok)) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    (a->in[0].dtype == MR_F32 ? f32 : f64)(a, s, rows, cols);
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
fail:
    return st;
}

template <typename T>
static void softmax_fwd_launch(const mr_op_args *a, cudaStream_t s, int64_t rows, int64_t cols) {
    const mr_shape *xs = &a->in[0].shape;
    int64_t t_causal = a->p.softmax.causal ? xs->dim[xs->ndim - 2] : 0;
    int log_sm = a->op == MR_OP_LOG_SOFTMAX;
    MR_ROWS_LAUNCH(mr_softmax_fwd_kernel, T, cols, rows, s, (const T *)a->in[0].data, (T *)a->out[0].data, rows, cols,
                   t_causal, log_sm);
}

/* The CPU's half probabilities and gradients (core/ops.h SOFTMAX, SOFTMAX_BWD) are refused by
 * name rather than written as f32 into half tensors. */
static mr_status no_half_views(const mr_op_args *a) {
    const int bwd = a->op == MR_OP_SOFTMAX_BWD || a->op == MR_OP_LOG_SOFTMAX_BWD;
    const mr_view *vs[2] = {bwd ? &a->in[0] : &a->out[0], &a->out[0]};
    const char *names[2] = {bwd ? "y (in[0])" : "y (out[0])", "dx (out[0])"};
    for (int i = 0; i < 1 + bwd; i++)
        if (vs[i]->dtype == MR_BF16 || vs[i]->dtype == MR_F16)
            return mr_set_error(MR_ERR_UNSUPPORTED,
                                "%s: %s is %s: half probabilities and gradients are a CPU fusion; the CUDA kernel "
                                "takes f32 or f64 (on a GPU, cast after the op)",
                                mr_op_get(a->op)->name, names[i], mr_dtype_name(vs[i]->dtype));
    return MR_OK;
}

/* x (rows, cols) -> y (rows, cols) */
extern "C" mr_status mr_softmax_fwd_cuda(const mr_op_args *a) {
    mr_status st = no_half_views(a);
    if (st != MR_OK) return st;
    return run_rows(a, softmax_fwd_launch<float>, softmax_fwd_launch<double>, 0);
}

template <typename T>
static void softmax_bwd_launch(const mr_op_args *a, cudaStream_t s, int64_t rows, int64_t cols) {
    int log_sm = a->op == MR_OP_LOG_SOFTMAX_BWD;
    MR_ROWS_LAUNCH(mr_softmax_bwd_kernel, T, cols, rows, s, (const T *)a->in[0].data, (const T *)a->in[1].data,
                   (T *)a->out[0].data, rows, cols, log_sm);
}

/* y, dy (rows, cols) -> dx (rows, cols) */
extern "C" mr_status mr_softmax_bwd_cuda(const mr_op_args *a) {
    mr_status st = no_half_views(a);
    if (st != MR_OK) return st;
    return run_rows(a, softmax_bwd_launch<float>, softmax_bwd_launch<double>, 0);
}

/* ---- softmax cross-entropy --------------------------------------------------------------------- */

/* logits, probs are (n, c); labels, loss are (n). A label outside [0, c) that is not `ignore`
 * gives a NaN loss (see the file comment). */
template <typename T, int NX, int RY>
__global__ void __launch_bounds__(NX *RY)
    mr_xent_fwd_kernel(const T *__restrict__ x, const int32_t *__restrict__ labels, T *__restrict__ loss,
                       T *__restrict__ probs, int64_t n, int64_t c, int64_t ignore) {
    __shared__ T sh[32];
    for (int64_t base = (int64_t)blockIdx.x * RY; base < n; base += (int64_t)gridDim.x * RY) {
        const int64_t row = base + threadIdx.y;
        const bool ok = row < n;
        const T *xr = x + (ok ? row : 0) * c;
        T m, s;
        mr_row_max_sum<T, NX>(xr, ok ? c : 0, sh, &m, &s);
        if (!ok) continue;
        T *pr = probs + row * c;
        const T inv = (T)1 / s;
        for (int64_t j = threadIdx.x; j < c; j += NX) pr[j] = mr_sm<T>::prob(xr[j], m, inv);
        if (threadIdx.x == 0) {
            const int64_t lab = labels[row];
            T l;
            if (lab == ignore)
                l = (T)0;
            else if (lab < 0 || lab >= c)
                l = (T)NAN;
            else
                l = mr_sm<T>::loss(m, xr[lab], s);
            loss[row] = l;
        }
    }
}

/* probs, dlogits are (n, c); labels, dloss are (n). No reduction: the row groups only keep each
 * row's label and dloss in registers while the row is written. */
template <typename T, int NX, int RY>
__global__ void __launch_bounds__(NX *RY)
    mr_xent_bwd_kernel(const T *__restrict__ probs, const int32_t *__restrict__ labels, const T *__restrict__ dloss,
                       T *__restrict__ dx, int64_t n, int64_t c, int64_t ignore) {
    for (int64_t base = (int64_t)blockIdx.x * RY; base < n; base += (int64_t)gridDim.x * RY) {
        const int64_t row = base + threadIdx.y;
        if (row >= n) continue;
        const int64_t lab = labels[row];
        const T *pr = probs + row * c;
        T *dr = dx + row * c;
        if (lab == ignore) {
            for (int64_t j = threadIdx.x; j < c; j += NX) dr[j] = (T)0;
        } else if (lab < 0 || lab >= c) {
            for (int64_t j = threadIdx.x; j < c; j += NX) dr[j] = (T)NAN;
        } else {
            const T g = dloss[row];
            for (int64_t j = threadIdx.x; j < c; j += NX) dr[j] = mr_sm<T>::xent_grad(g, pr[j], j == lab);
        }
    }
}

template <typename T>
static void xent_fwd_launch(const mr_op_args *a, cudaStream_t s, int64_t n, int64_t c) {
    MR_ROWS_LAUNCH(mr_xent_fwd_kernel, T, c, n, s, (const T *)a->in[0].data, (const int32_t *)a->in[1].data,
                   (T *)a->out[0].data, (T *)a->out[1].data, n, c, a->p.xent.ignore_index);
}

/* logits (N,C), labels (N) i32 -> loss (N), probs (N,C) */
extern "C" mr_status mr_xent_fwd_cuda(const mr_op_args *a) {
    return run_rows(a, xent_fwd_launch<float>, xent_fwd_launch<double>, 1);
}

template <typename T>
static void xent_bwd_launch(const mr_op_args *a, cudaStream_t s, int64_t n, int64_t c) {
    MR_ROWS_LAUNCH(mr_xent_bwd_kernel, T, c, n, s, (const T *)a->in[0].data, (const int32_t *)a->in[1].data,
                   (const T *)a->in[2].data, (T *)a->out[0].data, n, c, a->p.xent.ignore_index);
}

/* probs (N,C), labels (N) i32, dloss (N) -> dlogits (N,C) */
extern "C" mr_status mr_xent_bwd_cuda(const mr_op_args *a) {
    return run_rows(a, xent_bwd_launch<float>, xent_bwd_launch<double>, 1);
}
