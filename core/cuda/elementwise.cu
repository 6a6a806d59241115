/* Elementwise ops on the GPU: the unary activations and their backward kernels, and the binary
 * ADD/SUB/MUL/DIV with numpy broadcasting (see ops.h; oracles in core/ref/elementwise_ref.c).
 *
 * The per-element math is core/math/unary_math.h, the same code the CPU kernels and the
 * reference instantiate (docs/STYLE.md rule 5). Each op is a functor; one grid-stride kernel template
 * per pattern (x -> y, (x, y, dy) -> dx, (a, b) -> y), so the op switch happens once on the host
 * and the loops hold no branches on the op. f32 is the fast path; f64 runs too (gradient checks
 * on the GPU, optimizer master weights). */
#include "core/cuda/cuda_impl.h"
#include "core/math/unary_math.h"
#include "core/ops_impl.h"

/* The math of unary_math.h by type, so one template serves f32 and f64. */
template <typename T> struct mr_um;
#define MR_UM_TRAITS(T, S)                                                                      \
    template <> struct mr_um<T> {                                                               \
        static __device__ T relu(T x) { return mr_relu_##S(x); }                                \
        static __device__ T relu_grad(T x, T dy) { return mr_relu_grad_##S(x, dy); }            \
        static __device__ T gelu(T x) { return mr_gelu_##S(x); }                                \
        static __device__ T gelu_grad(T x, T dy) { return mr_gelu_grad_##S(x, dy); }            \
        static __device__ T tanh_(T x) { return mr_tanh_##S(x); }                               \
        static __device__ T tanh_grad(T y, T dy) { return mr_tanh_grad_##S(y, dy); }            \
        static __device__ T sigmoid(T x) { return mr_sigmoid_##S(x); }                          \
        static __device__ T sigmoid_grad(T y, T dy) { return mr_sigmoid_grad_##S(y, dy); }      \
        static __device__ T exp_(T x) { return mr_exp_##S(x); }                                 \
        static __device__ T exp_grad(T y, T dy) { return mr_exp_grad_##S(y, dy); }              \
        static __device__ T log_(T x) { return mr_log_##S(x); }                                 \
        static __device__ T log_grad(T x, T dy) { return mr_log_grad_##S(x, dy); }              \
        static __device__ T sqrt_(T x) { return mr_sqrt_##S(x); }                               \
        static __device__ T sqrt_grad(T y, T dy) { return mr_sqrt_grad_##S(y, dy); }            \
    };
MR_UM_TRAITS(float, f32)
MR_UM_TRAITS(double, f64)

/* ---- unary forward: y = f(x) ------------------------------------------------------------------ */

#define MR_UNARY_FN(NAME, EXPR)                                                                 \
    template <typename T> struct NAME {                                                         \
        T alpha;                                                                                \
        __device__ T operator()(T x) const { return EXPR; }                                     \
    };
MR_UNARY_FN(mr_f_relu, mr_um<T>::relu(x))
MR_UNARY_FN(mr_f_gelu, mr_um<T>::gelu(x))
MR_UNARY_FN(mr_f_tanh, mr_um<T>::tanh_(x))
MR_UNARY_FN(mr_f_sigmoid, mr_um<T>::sigmoid(x))
MR_UNARY_FN(mr_f_exp, mr_um<T>::exp_(x))
MR_UNARY_FN(mr_f_log, mr_um<T>::log_(x))
MR_UNARY_FN(mr_f_sqrt, mr_um<T>::sqrt_(x))
MR_UNARY_FN(mr_f_scale, alpha *x)

/* x, y are (n) */
template <typename T, typename F>
__global__ void mr_unary_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t n, F f) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = f(x[i]);
}

template <typename T, template <typename> class F>
static void launch_unary(const mr_op_args *a, cudaStream_t s, int64_t n) {
    F<T> f;
    f.alpha = (T)a->p.scale;
    mr_unary_kernel<T><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>((const T *)a->in[0].data, (T *)a->out[0].data, n, f);
}

template <typename T>
static mr_status unary_fwd(const mr_op_args *a, cudaStream_t s, int64_t n) {
    switch (a->op) {
    case MR_OP_RELU: launch_unary<T, mr_f_relu>(a, s, n); break;
    case MR_OP_GELU: launch_unary<T, mr_f_gelu>(a, s, n); break;
    case MR_OP_TANH: launch_unary<T, mr_f_tanh>(a, s, n); break;
    case MR_OP_SIGMOID: launch_unary<T, mr_f_sigmoid>(a, s, n); break;
    case MR_OP_EXP: launch_unary<T, mr_f_exp>(a, s, n); break;
    case MR_OP_LOG: launch_unary<T, mr_f_log>(a, s, n); break;
    case MR_OP_SQRT: launch_unary<T, mr_f_sqrt>(a, s, n); break;
    case MR_OP_SCALE: launch_unary<T, mr_f_scale>(a, s, n); break;
    default: return mr_op_error(a, "not a unary forward op");
    }
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
}

/* Element types the kernels take: f32 and f64; the message says so for any other. */
static mr_status float_dtype(const mr_op_args *a, mr_dtype dt) {
    if (dt == MR_F32 || dt == MR_F64) return MR_OK;
    return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
}

extern "C" mr_status mr_unary_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    /* x (any shape), y (x's shape) */
    int64_t n = mr_shape_numel(&a->in[0].shape);
    MR_TRY(float_dtype(a, a->in[0].dtype));
    if (n == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    return a->in[0].dtype == MR_F32 ? unary_fwd<float>(a, s, n) : unary_fwd<double>(a, s, n);
fail:
    return st;
}

/* ---- unary backward: dx = f'(x or y) * dy ------------------------------------------------------ */

/* Which saved tensor the derivative reads: the input x or the output y. */
#define MR_UNARY_GRAD(NAME, EXPR)                                                               \
    template <typename T> struct NAME {                                                         \
        T alpha;                                                                                \
        __device__ T operator()(T v, T dy) const { return EXPR; }                               \
    };
MR_UNARY_GRAD(mr_g_relu, mr_um<T>::relu_grad(v, dy))      /* v = x */
MR_UNARY_GRAD(mr_g_gelu, mr_um<T>::gelu_grad(v, dy))      /* v = x */
MR_UNARY_GRAD(mr_g_tanh, mr_um<T>::tanh_grad(v, dy))      /* v = y */
MR_UNARY_GRAD(mr_g_sigmoid, mr_um<T>::sigmoid_grad(v, dy)) /* v = y */
MR_UNARY_GRAD(mr_g_exp, mr_um<T>::exp_grad(v, dy))        /* v = y */
MR_UNARY_GRAD(mr_g_log, mr_um<T>::log_grad(v, dy))        /* v = x */
MR_UNARY_GRAD(mr_g_sqrt, mr_um<T>::sqrt_grad(v, dy))      /* v = y */

/* v (the saved x or y), dy, dx are (n) */
template <typename T, typename F>
__global__ void mr_unary_grad_kernel(const T *__restrict__ v, const T *__restrict__ dy, T *__restrict__ dx,
                                     int64_t n, F f) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = f(v[i], dy[i]);
}

/* `which` is 0 when the derivative reads x (in[0]), 1 when it reads y (in[1]). */
template <typename T, template <typename> class F>
static mr_status launch_grad(const mr_op_args *a, cudaStream_t s, int64_t n, int which) {
    const T *v = (const T *)a->in[which].data;
    if (!v) return mr_op_error(a, "needs the forward %s (in[%d])", which ? "output y" : "input x", which);
    F<T> f;
    f.alpha = (T)a->p.scale;
    mr_unary_grad_kernel<T><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(v, (const T *)a->in[2].data,
                                                                       (T *)a->out[0].data, n, f);
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
}

/* SCALE_BWD reads neither x nor y: dx = alpha * dy is the forward functor applied to dy. */
template <typename T>
static mr_status unary_bwd(const mr_op_args *a, cudaStream_t s, int64_t n) {
    switch (a->op) {
    case MR_OP_RELU_BWD: return launch_grad<T, mr_g_relu>(a, s, n, 0);
    case MR_OP_GELU_BWD: return launch_grad<T, mr_g_gelu>(a, s, n, 0);
    case MR_OP_TANH_BWD: return launch_grad<T, mr_g_tanh>(a, s, n, 1);
    case MR_OP_SIGMOID_BWD: return launch_grad<T, mr_g_sigmoid>(a, s, n, 1);
    case MR_OP_EXP_BWD: return launch_grad<T, mr_g_exp>(a, s, n, 1);
    case MR_OP_LOG_BWD: return launch_grad<T, mr_g_log>(a, s, n, 0);
    case MR_OP_SQRT_BWD: return launch_grad<T, mr_g_sqrt>(a, s, n, 1);
    case MR_OP_SCALE_BWD: {
        mr_f_scale<T> f;
        f.alpha = (T)a->p.scale;
        mr_unary_kernel<T><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>((const T *)a->in[2].data, (T *)a->out[0].data,
                                                                     n, f);
        return mr_cuda_check_launch(mr_op_get(a->op)->name);
    }
    default: return mr_op_error(a, "not a unary backward op");
    }
}

extern "C" mr_status mr_unary_bwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    /* x, y (optional as the op needs), dy, dx: all the same shape */
    int64_t n = mr_shape_numel(&a->in[2].shape);
    MR_TRY(float_dtype(a, a->in[2].dtype));
    if (!a->in[2].data || !a->out[0].data) return mr_op_error(a, "dy and dx are required");
    if (n == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    return a->in[2].dtype == MR_F32 ? unary_bwd<float>(a, s, n) : unary_bwd<double>(a, s, n);
fail:
    return st;
}

/* ---- binary forward with broadcasting -------------------------------------------------------- */

template <typename T> struct mr_b_add { __device__ T operator()(T x, T y) const { return x + y; } };
template <typename T> struct mr_b_sub { __device__ T operator()(T x, T y) const { return x - y; } };
template <typename T> struct mr_b_mul { __device__ T operator()(T x, T y) const { return x * y; } };
template <typename T> struct mr_b_div { __device__ T operator()(T x, T y) const { return x / y; } };

/* The output's dims and each input's element strides per output dim (0 where it broadcasts),
 * passed by value as a kernel argument. Dims are coalesced on the host first, so most
 * broadcasts (bias rows, scalars) end up with 1 or 2 dims. */
typedef struct mr_bcast {
    int ndim;
    int64_t dim[MR_MAX_DIMS];
    int64_t sa[MR_MAX_DIMS];
    int64_t sb[MR_MAX_DIMS];
} mr_bcast;

/* a, b, y are (n): the same shape */
template <typename T, typename F>
__global__ void mr_binary_flat_kernel(const T *__restrict__ a, const T *__restrict__ b, T *__restrict__ y,
                                      int64_t n, F f) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = f(a[i], b[i]);
}

/* y is (bc.dim...), n elements; a and b are read through bc's strides */
template <typename T, typename F>
__global__ void mr_binary_bcast_kernel(const T *__restrict__ a, const T *__restrict__ b, T *__restrict__ y,
                                       int64_t n, mr_bcast bc, F f) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i, ia = 0, ib = 0;
        for (int d = bc.ndim - 1; d >= 0; d--) {
            int64_t c = r % bc.dim[d];
            r /= bc.dim[d];
            ia += c * bc.sa[d];
            ib += c * bc.sb[d];
        }
        y[i] = f(a[ia], b[ib]);
    }
}

/* Broadcast strides of `in` against the output shape `out` (dims aligned on the right). */
static void bcast_strides(const mr_shape *in, const mr_shape *out, int64_t *st) {
    int64_t s = 1;
    for (int d = out->ndim - 1; d >= 0; d--) {
        int di = d - (out->ndim - in->ndim);
        if (di < 0 || in->dim[di] == 1) {
            st[d] = 0;
        } else {
            st[d] = s;
        }
        if (di >= 0) s *= in->dim[di];
    }
}

/* Merges adjacent dims that both inputs walk contiguously (or both broadcast), and drops
 * size-1 dims, so the kernel's index arithmetic runs over as few dims as possible. */
static mr_bcast make_bcast(const mr_shape *sa, const mr_shape *sb, const mr_shape *sy) {
    int64_t ta[MR_MAX_DIMS], tb[MR_MAX_DIMS];
    bcast_strides(sa, sy, ta);
    bcast_strides(sb, sy, tb);
    mr_bcast bc;
    bc.ndim = 0;
    for (int d = 0; d < sy->ndim; d++) {
        if (sy->dim[d] == 1) continue;
        int k = bc.ndim - 1;
        if (k >= 0 && bc.sa[k] == ta[d] * sy->dim[d] && bc.sb[k] == tb[d] * sy->dim[d]) {
            bc.dim[k] *= sy->dim[d];
            bc.sa[k] = ta[d];
            bc.sb[k] = tb[d];
            continue;
        }
        bc.dim[bc.ndim] = sy->dim[d];
        bc.sa[bc.ndim] = ta[d];
        bc.sb[bc.ndim] = tb[d];
        bc.ndim++;
    }
    return bc;
}

template <typename T, template <typename> class F>
static void launch_binary(const mr_op_args *a, cudaStream_t s, int64_t n, int same, const mr_bcast *bc) {
    const T *x = (const T *)a->in[0].data, *y = (const T *)a->in[1].data;
    T *out = (T *)a->out[0].data;
    F<T> f;
    if (same)
        mr_binary_flat_kernel<T><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(x, y, out, n, f);
    else
        mr_binary_bcast_kernel<T><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(x, y, out, n, *bc, f);
}

template <typename T>
static mr_status binary_fwd(const mr_op_args *a, cudaStream_t s, int64_t n, int same, const mr_bcast *bc) {
    switch (a->op) {
    case MR_OP_ADD: launch_binary<T, mr_b_add>(a, s, n, same, bc); break;
    case MR_OP_SUB: launch_binary<T, mr_b_sub>(a, s, n, same, bc); break;
    case MR_OP_MUL: launch_binary<T, mr_b_mul>(a, s, n, same, bc); break;
    case MR_OP_DIV: launch_binary<T, mr_b_div>(a, s, n, same, bc); break;
    default: return mr_op_error(a, "not a binary forward op");
    }
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
}

extern "C" mr_status mr_binary_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    /* a, b: any shapes that broadcast; y: the broadcast shape (validated by the check) */
    const mr_shape *sa = &a->in[0].shape, *sb = &a->in[1].shape, *sy = &a->out[0].shape;
    int64_t n = mr_shape_numel(sy);
    MR_TRY(float_dtype(a, a->out[0].dtype));
    if (n == 0) return MR_OK;
    {
        int same = mr_shape_numel(sa) == n && mr_shape_numel(sb) == n;
        mr_bcast bc = make_bcast(sa, sb, sy);
        /* everything coalesced into one contiguous dim: the flat kernel does it */
        if (bc.ndim == 1 && bc.sa[0] == 1 && bc.sb[0] == 1) same = 1;
        MR_TRY(mr_cuda_op_stream(a, &s));
        return a->out[0].dtype == MR_F32 ? binary_fwd<float>(a, s, n, same, &bc) : binary_fwd<double>(a, s, n, same, &bc);
    }
fail:
    return st;
}
