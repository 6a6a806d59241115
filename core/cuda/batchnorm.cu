/* Batch norm on the GPU, forward (training and evaluation) and backward (see ops.h; the oracle
 * is core/ref/batchnorm_ref.c). x (N, C, S...) is walked as (N, C, S): channel c's M = N*S
 * elements are x[(n*C + c)*S + s].
 *
 * Training forward and the backward: one block of MR_BN_THREADS threads per channel (a
 * block-uniform grid-stride loop over channels). Each thread walks the channel's flat index
 * i = n*S + s with stride MR_BN_THREADS in a fixed order and the block combines the partial sums
 * with mr_row_reduce (core/cuda/rows_impl.h), so results are bit-identical from run to run. The
 * forward makes two reduction passes, the mean and then sum((x - mean)^2) (the biased variance;
 * E[x^2] - E[x]^2 cancels when |mean| >> std), and a write pass; the backward one pass for
 * sum(dy) and sum(dy * xhat) (dbeta, dgamma) and one for dx. Sums accumulate in f64 for f32 data
 * too, so they stay accurate to ~1e-7 relative for M up to millions. Parallelism is C blocks:
 * fine for C >= the SM count; a split over N for few wide channels would need a workspace.
 *
 * Evaluation forward: elementwise, a grid-stride loop over every element.
 *
 * The per-element steps are core/math/batchnorm_math.h (mean as hi + lo parts for f32), shared
 * with the CPU kernels and the reference. */
#include "core/cuda/cuda_impl.h"
#include "core/cuda/rows_impl.h"
#include "core/math/batchnorm_math.h"
#include "core/ops_impl.h"

#define MR_BN_THREADS 256

/* The math of batchnorm_math.h by type, so one template serves f32 and f64. */
template <typename T> struct mr_bn;
#define MR_BN_TRAITS(T, S)                                                                      \
    template <> struct mr_bn<T> {                                                               \
        static __device__ T xhat(T x, T mh, T ml, T r) { return mr_batchnorm_xhat_##S(x, mh, ml, r); } \
        static __device__ T y(T x, T mh, T ml, T k, T b) { return mr_batchnorm_y_##S(x, mh, ml, k, b); } \
        static __device__ T dx(T x, T mh, T ml, T r, T k, T dy, T ta, T tb) {                   \
            return mr_batchnorm_dx_##S(x, mh, ml, r, k, dy, ta, tb);                            \
        }                                                                                       \
    };
MR_BN_TRAITS(float, f32)
MR_BN_TRAITS(double, f64)

/* Flat channel index i = n*S + s -> offset of x[n, c, s]. */
__device__ __forceinline__ int64_t mr_bn_at(int64_t i, int64_t c, int64_t C, int64_t S) {
    const int64_t n = i / S;
    return (n * C + c) * S + (i - n * S);
}

/* x, y (N,C,S); gamma, beta (C) optional (NULL); mean, var (C) */
template <typename T>
__global__ void __launch_bounds__(MR_BN_THREADS)
    mr_batchnorm_train_kernel(const T *__restrict__ x, const T *__restrict__ gamma, const T *__restrict__ beta,
                              T *__restrict__ y, T *__restrict__ mean, T *__restrict__ var, int64_t N, int64_t C,
                              int64_t S, double eps) {
    __shared__ double sh[32];
    const int64_t M = N * S;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        double s = 0;
        for (int64_t i = threadIdx.x; i < M; i += MR_BN_THREADS) s += (double)x[mr_bn_at(i, c, C, S)];
        const double m = mr_row_reduce<MR_BN_THREADS>(s, sh, mr_op_sum<double>()) / (double)M;
        double v = 0;
        for (int64_t i = threadIdx.x; i < M; i += MR_BN_THREADS) {
            const double d = (double)x[mr_bn_at(i, c, C, S)] - m;
            v += d * d;
        }
        v = mr_row_reduce<MR_BN_THREADS>(v, sh, mr_op_sum<double>()) / (double)M;
        const T mh = (T)m, ml = (T)(m - (double)mh);
        const T k = (T)((gamma ? (double)gamma[c] : 1.0) / sqrt(v + eps)), b = beta ? beta[c] : (T)0;
        for (int64_t i = threadIdx.x; i < M; i += MR_BN_THREADS) {
            const int64_t o = mr_bn_at(i, c, C, S);
            y[o] = mr_bn<T>::y(x[o], mh, ml, k, b);
        }
        if (threadIdx.x == 0) {
            mean[c] = (T)m;
            var[c] = (T)v;
        }
    }
}

/* x, y (N,C,S); gamma, beta (C) optional; rmean, rvar (C); mean, var (C) optional copies of them */
template <typename T>
__global__ void __launch_bounds__(MR_CUDA_BLOCK)
    mr_batchnorm_eval_kernel(const T *__restrict__ x, const T *__restrict__ gamma, const T *__restrict__ beta,
                             const T *__restrict__ rmean, const T *__restrict__ rvar, T *__restrict__ y,
                             T *__restrict__ mean, T *__restrict__ var, int64_t N, int64_t C, int64_t S, double eps) {
    const int64_t n = N * C * S, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n || i < C; i += stride) {
        if (i < C) {
            if (mean) mean[i] = rmean[i];
            if (var) var[i] = rvar[i];
        }
        if (i >= n) continue;
        const int64_t c = (i / S) % C;
        const T k = (T)((gamma ? (double)gamma[c] : 1.0) / sqrt((double)rvar[c] + eps)), b = beta ? beta[c] : (T)0;
        y[i] = mr_bn<T>::y(x[i], rmean[c], (T)0, k, b);
    }
}

/* dy, x, dx (N,C,S); gamma (C) optional; mean, var (C); dx, dgamma, dbeta optional */
template <typename T>
__global__ void __launch_bounds__(MR_BN_THREADS)
    mr_batchnorm_bwd_kernel(const T *__restrict__ dy, const T *__restrict__ x, const T *__restrict__ gamma,
                            const T *__restrict__ mean, const T *__restrict__ var, T *__restrict__ dx,
                            T *__restrict__ dgamma, T *__restrict__ dbeta, int64_t N, int64_t C, int64_t S, double eps,
                            int training) {
    __shared__ double sh[32];
    const int64_t M = N * S;
    const bool sums = training || dgamma || dbeta;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        const double rd = 1.0 / sqrt((double)var[c] + eps);
        const T m = mean[c], r = (T)rd, k = (T)((gamma ? (double)gamma[c] : 1.0) * rd);
        T ta = 0, tb = 0;
        if (sums) {
            double sdy = 0, sdyx = 0;
            for (int64_t i = threadIdx.x; i < M; i += MR_BN_THREADS) {
                const int64_t o = mr_bn_at(i, c, C, S);
                sdy += (double)dy[o];
                sdyx += (double)(dy[o] * mr_bn<T>::xhat(x[o], m, (T)0, r));
            }
            sdy = mr_row_reduce<MR_BN_THREADS>(sdy, sh, mr_op_sum<double>());
            sdyx = mr_row_reduce<MR_BN_THREADS>(sdyx, sh, mr_op_sum<double>());
            if (threadIdx.x == 0) {
                if (dgamma) dgamma[c] = (T)sdyx;
                if (dbeta) dbeta[c] = (T)sdy;
            }
            if (training && M > 0) {
                ta = (T)(sdy / (double)M);
                tb = (T)(sdyx / (double)M);
            }
        }
        if (!dx) continue;
        for (int64_t i = threadIdx.x; i < M; i += MR_BN_THREADS) {
            const int64_t o = mr_bn_at(i, c, C, S);
            dx[o] = mr_bn<T>::dx(x[o], m, (T)0, r, k, dy[o], ta, tb);
        }
    }
}

/* Element types the kernels take: f32 and f64 (the checks accept no others). */
static mr_status float_dtype(const mr_op_args *a, mr_dtype dt) {
    if (dt == MR_F32 || dt == MR_F64) return MR_OK;
    return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
}

static void bn_dims(const mr_view *x, int64_t *n, int64_t *c, int64_t *s) {
    *n = x->shape.dim[0];
    *c = x->shape.dim[1];
    *s = 1;
    for (int i = 2; i < x->shape.ndim; i++) *s *= x->shape.dim[i];
}

template <typename T>
static void batchnorm_fwd_launch(const mr_op_args *a, cudaStream_t s, int64_t N, int64_t C, int64_t S) {
    const T *x = (const T *)a->in[0].data, *gamma = (const T *)a->in[1].data, *beta = (const T *)a->in[2].data;
    T *y = (T *)a->out[0].data, *mean = (T *)a->out[1].data, *var = (T *)a->out[2].data;
    const double eps = a->p.batchnorm.eps;
    if (a->p.batchnorm.training) {
        mr_batchnorm_train_kernel<T><<<mr_row_grid(C, 1), MR_BN_THREADS, 0, s>>>(x, gamma, beta, y, mean, var, N, C,
                                                                                S, eps);
    } else {
        const int64_t n = N * C * S > C ? N * C * S : C;
        mr_batchnorm_eval_kernel<T><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(
            x, gamma, beta, (const T *)a->in[3].data, (const T *)a->in[4].data, y, mean, var, N, C, S, eps);
    }
}

/* x (N,C,S...), gamma, beta (C) optional, running_mean, running_var (C) -> y, mean, var */
extern "C" mr_status mr_batchnorm_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    int64_t N, C, S;
    MR_TRY(float_dtype(a, a->in[0].dtype));
    bn_dims(&a->in[0], &N, &C, &S);
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (a->in[0].dtype == MR_F32)
        batchnorm_fwd_launch<float>(a, s, N, C, S);
    else
        batchnorm_fwd_launch<double>(a, s, N, C, S);
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
fail:
    return st;
}

template <typename T>
static void batchnorm_bwd_launch(const mr_op_args *a, cudaStream_t s, int64_t N, int64_t C, int64_t S) {
    mr_batchnorm_bwd_kernel<T><<<mr_row_grid(C, 1), MR_BN_THREADS, 0, s>>>(
        (const T *)a->in[0].data, (const T *)a->in[1].data, (const T *)a->in[2].data, (const T *)a->in[3].data,
        (const T *)a->in[4].data, (T *)a->out[0].data, (T *)a->out[1].data, (T *)a->out[2].data, N, C, S,
        a->p.batchnorm.eps, a->p.batchnorm.training);
}

/* dy, x (N,C,S...), gamma (C) optional, mean, var (C) -> dx, dgamma, dbeta (each optional) */
extern "C" mr_status mr_batchnorm_bwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    int64_t N, C, S;
    MR_TRY(float_dtype(a, a->in[1].dtype));
    bn_dims(&a->in[1], &N, &C, &S);
    if (!a->out[0].data && !a->out[1].data && !a->out[2].data) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (a->in[1].dtype == MR_F32)
        batchnorm_bwd_launch<float>(a, s, N, C, S);
    else
        batchnorm_bwd_launch<double>(a, s, N, C, S);
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
fail:
    return st;
}
