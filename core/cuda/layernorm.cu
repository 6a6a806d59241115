/* Layer norm over the last axis on the GPU, forward and backward (see ops.h; the oracle is
 * core/ref/layernorm_ref.c).
 *
 * Forward and dx: one row group per row (core/cuda/rows_impl.h: a warp for D <= 1024, 4 rows to
 * a block; 256 or 1024 threads for wider rows). The forward makes two reduction passes (mean,
 * then the variance as sum (x - mean)^2: the one-pass E[x^2] - E[x]^2 loses everything when
 * |mean| >> std) and a write pass; the re-reads hit L1/L2. The backward's dx reduces
 * sum(dy * gamma) and sum(dy * gamma * xhat) per row the same way.
 *
 * dgamma and dbeta sum over rows. Without scratch memory the deterministic way is to give each
 * column to one thread column of a block: a block owns 8 adjacent columns (one 32-byte sector of
 * f32 per row, so the loads stay fully used) and 64 row lanes that stride over the rows; the 64
 * partial sums of a column are then added in lane order. The order depends only on the shape.
 * Its parallelism is D / 8 blocks (96 for D = 768): enough to stream dy and x for GPT-sized D;
 * a two-pass split over rows would need a workspace.
 *
 * Statistics accumulate in f32 for f32 data and f64 for f64. The per-element steps are
 * core/math/layernorm_math.h, shared with the CPU kernels and the reference. */
#include "core/cuda/cuda_impl.h"
#include "core/cuda/rows_impl.h"
#include "core/math/layernorm_math.h"
#include "core/ops_impl.h"

/* The math of layernorm_math.h by type, so one template serves f32 and f64. */
template <typename T> struct mr_ln;
#define MR_LN_TRAITS(T, S)                                                                      \
    template <> struct mr_ln<T> {                                                               \
        static __device__ T y(T x, T m, T r, T g, T b) { return mr_layernorm_y_##S(x, m, r, g, b); } \
        static __device__ T dx(T x, T m, T r, T dy, T g, T sg, T sgx) {                         \
            return mr_layernorm_dx_##S(x, m, r, dy, g, sg, sgx);                                \
        }                                                                                       \
    };
MR_LN_TRAITS(float, f32)
MR_LN_TRAITS(double, f64)

/* x, y are (rows, cols); gamma, beta (cols); mean, rstd (rows) */
template <typename T, int NX, int RY>
__global__ void __launch_bounds__(NX *RY)
    mr_layernorm_fwd_kernel(const T *__restrict__ x, const T *__restrict__ gamma, const T *__restrict__ beta,
                            T *__restrict__ y, T *__restrict__ mean, T *__restrict__ rstd, int64_t rows, int64_t cols,
                            T eps) {
    __shared__ T sh[32];
    for (int64_t base = (int64_t)blockIdx.x * RY; base < rows; base += (int64_t)gridDim.x * RY) {
        const int64_t row = base + threadIdx.y;
        const bool ok = row < rows; /* the block stays together through the reductions */
        const int64_t n = ok ? cols : 0;
        const T *xr = x + (ok ? row : 0) * cols;
        T s = 0;
        for (int64_t j = threadIdx.x; j < n; j += NX) s += xr[j];
        const T m = mr_row_reduce<NX>(s, sh, mr_op_sum<T>()) / (T)cols;
        T v = 0;
        for (int64_t j = threadIdx.x; j < n; j += NX) v += (xr[j] - m) * (xr[j] - m);
        v = mr_row_reduce<NX>(v, sh, mr_op_sum<T>());
        if (!ok) continue;
        const T r = (T)1 / mr_dsqrt(v / (T)cols + eps);
        T *yr = y + row * cols;
        for (int64_t j = threadIdx.x; j < cols; j += NX) yr[j] = mr_ln<T>::y(xr[j], m, r, gamma[j], beta[j]);
        if (threadIdx.x == 0) {
            mean[row] = m;
            rstd[row] = r;
        }
    }
}

/* x, dy, dx are (rows, cols); gamma (cols); mean, rstd (rows) */
template <typename T, int NX, int RY>
__global__ void __launch_bounds__(NX *RY)
    mr_layernorm_dx_kernel(const T *__restrict__ x, const T *__restrict__ gamma, const T *__restrict__ mean,
                           const T *__restrict__ rstd, const T *__restrict__ dy, T *__restrict__ dx, int64_t rows,
                           int64_t cols) {
    __shared__ T sh[32];
    for (int64_t base = (int64_t)blockIdx.x * RY; base < rows; base += (int64_t)gridDim.x * RY) {
        const int64_t row = base + threadIdx.y;
        const bool ok = row < rows;
        const int64_t n = ok ? cols : 0;
        const T *xr = x + (ok ? row : 0) * cols, *gr = dy + (ok ? row : 0) * cols;
        const T m = ok ? mean[row] : (T)0, r = ok ? rstd[row] : (T)0;
        T sg = 0, sgx = 0;
        for (int64_t j = threadIdx.x; j < n; j += NX) {
            T g = gr[j] * gamma[j];
            sg += g;
            sgx += g * (xr[j] - m) * r;
        }
        sg = mr_row_reduce<NX>(sg, sh, mr_op_sum<T>()) / (T)cols;
        sgx = mr_row_reduce<NX>(sgx, sh, mr_op_sum<T>()) / (T)cols;
        if (!ok) continue;
        T *dr = dx + row * cols;
        for (int64_t j = threadIdx.x; j < cols; j += NX) dr[j] = mr_ln<T>::dx(xr[j], m, r, gr[j], gamma[j], sg, sgx);
    }
}

/* Columns per block and row lanes of the dgamma/dbeta kernel (see the file comment). */
#define MR_LN_COLS 8
#define MR_LN_LANES 64

/* x, dy are (rows, cols); mean, rstd (rows); dgamma, dbeta (cols), each optional (NULL) */
template <typename T>
__global__ void __launch_bounds__(MR_LN_COLS *MR_LN_LANES)
    mr_layernorm_dgb_kernel(const T *__restrict__ x, const T *__restrict__ mean, const T *__restrict__ rstd,
                            const T *__restrict__ dy, T *__restrict__ dgamma, T *__restrict__ dbeta, int64_t rows,
                            int64_t cols) {
    __shared__ T sg[MR_LN_LANES][MR_LN_COLS], sb[MR_LN_LANES][MR_LN_COLS];
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t c0 = (int64_t)blockIdx.x * MR_LN_COLS; c0 < cols; c0 += (int64_t)gridDim.x * MR_LN_COLS) {
        const int64_t j = c0 + tx;
        T g = 0, b = 0;
        if (j < cols) {
#pragma unroll 4
            for (int64_t i = ty; i < rows; i += MR_LN_LANES) {
                const T d = dy[i * cols + j];
                g += d * (x[i * cols + j] - mean[i]) * rstd[i];
                b += d;
            }
        }
        sg[ty][tx] = g;
        sb[ty][tx] = b;
        __syncthreads();
        if (ty == 0 && j < cols) {
            T tg = sg[0][tx], tb = sb[0][tx];
            for (int k = 1; k < MR_LN_LANES; k++) {
                tg += sg[k][tx];
                tb += sb[k][tx];
            }
            if (dgamma) dgamma[j] = tg;
            if (dbeta) dbeta[j] = tb;
        }
        __syncthreads(); /* sg/sb are rewritten by the next column block */
    }
}

/* Element types the kernels take: f32 and f64 (the checks accept no others). */
static mr_status float_dtype(const mr_op_args *a, mr_dtype dt) {
    if (dt == MR_F32 || dt == MR_F64) return MR_OK;
    return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
}

template <typename T>
static void layernorm_fwd_launch(const mr_op_args *a, cudaStream_t s, int64_t rows, int64_t cols) {
    MR_ROWS_LAUNCH(mr_layernorm_fwd_kernel, T, cols, rows, s, (const T *)a->in[0].data, (const T *)a->in[1].data,
                   (const T *)a->in[2].data, (T *)a->out[0].data, (T *)a->out[1].data, (T *)a->out[2].data, rows, cols,
                   (T)a->p.layernorm.eps);
}

/* x (N,D), gamma (D), beta (D) -> y (N,D), mean (N), rstd (N); N is every leading dim */
extern "C" mr_status mr_layernorm_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    int64_t rows, cols;
    MR_TRY(float_dtype(a, a->in[0].dtype));
    mr_shape_rows_cols(&a->in[0].shape, &rows, &cols);
    if (rows == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (a->in[0].dtype == MR_F32)
        layernorm_fwd_launch<float>(a, s, rows, cols);
    else
        layernorm_fwd_launch<double>(a, s, rows, cols);
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
fail:
    return st;
}

template <typename T>
static mr_status layernorm_bwd_launch(const mr_op_args *a, cudaStream_t s, int64_t rows, int64_t cols) {
    const T *x = (const T *)a->in[0].data, *mean = (const T *)a->in[2].data, *rstd = (const T *)a->in[3].data;
    const T *dy = (const T *)a->in[4].data;
    T *dgamma = (T *)a->out[1].data, *dbeta = (T *)a->out[2].data;
    if (rows > 0) {
        MR_ROWS_LAUNCH(mr_layernorm_dx_kernel, T, cols, rows, s, x, (const T *)a->in[1].data, mean, rstd, dy,
                       (T *)a->out[0].data, rows, cols);
        mr_status st = mr_cuda_check_launch("layernorm_bwd (dx)");
        if (st != MR_OK) return st;
    }
    if (!dgamma && !dbeta) return MR_OK;
    /* rows == 0 still writes dgamma = dbeta = 0 (empty sums) */
    unsigned grid = mr_row_grid(cols, MR_LN_COLS);
    mr_layernorm_dgb_kernel<T><<<grid, dim3(MR_LN_COLS, MR_LN_LANES), 0, s>>>(x, mean, rstd, dy, dgamma, dbeta, rows,
                                                                               cols);
    return mr_cuda_check_launch("layernorm_bwd (dgamma, dbeta)");
}

/* x, dy (N,D), gamma (D), mean, rstd (N) -> dx (N,D), dgamma, dbeta (D) (both optional) */
extern "C" mr_status mr_layernorm_bwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    int64_t rows, cols;
    MR_TRY(float_dtype(a, a->in[0].dtype));
    mr_shape_rows_cols(&a->in[0].shape, &rows, &cols);
    MR_TRY(mr_cuda_op_stream(a, &s));
    return a->in[0].dtype == MR_F32 ? layernorm_bwd_launch<float>(a, s, rows, cols)
                                    : layernorm_bwd_launch<double>(a, s, rows, cols);
fail:
    return st;
}
