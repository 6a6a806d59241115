/* Scaled dot-product attention on the GPU, forward and backward (MR_OP_ATTENTION, core/ops.h; the
 * oracle is core/ref/attention_ref.c).
 *
 * These are mirror's own kernels, for every dtype and head size; docs/DESIGN.md "Attention" says
 * where attention runs in the GPT. bf16/f16 calls go to cuDNN's fused flash attention first
 * (core/cuda/attention_cudnn.cu) and come here when cuDNN has no engine for the shape, or with
 * MIRROR_CUDNN_SDPA=0. One warp per query row (forward, dq) or per key row (dk, dv):
 *   - forward: the lanes stride over the keys the row sees, keep the scaled scores in shared
 *     memory, reduce the maximum and the sum of exponentials by warp butterflies, then stride over
 *     the head dim for y = sum_j p_j v_j; lse = max + log(sum) is saved.
 *   - dq: the probabilities are recomputed from lse (p_j = exp(scale q.k_j - lse)), ds_j =
 *     p_j (dy.v_j - dy.y) scale kept in shared memory, dq = sum_j ds_j k_j.
 *   - dk, dv: per key j the warp recomputes p_ij and ds_ij for every query row i that sees it (dy.y
 *     again, so no scratch is needed) and sums dv_j = sum_i p_ij dy_i, dk_j = sum_i ds_ij q_i.
 * Every sum runs in an order fixed by the shape (no atomics), so results are bit-identical from run
 * to run. The (T, S) probability matrix is never stored: shared memory holds one row of it (S
 * values; T for dk/dv, twice), which bounds S (and T) by the 48 KiB a block may use without opting
 * in (12288 for f32 accumulation, 6144 for f64); longer sequences are refused with a message.
 * Half inputs (bf16, f16) load through core/math/half_math.h and accumulate in f32; f64 in f64. */
#include "core/cuda/cuda_impl.h"
#include "core/math/attention_math.h"
#include "core/math/half_math.h"
#include "core/ops_impl.h"

#include <math.h>

/* Loads and stores by storage type: T the stored type, A the accumulation type. */
struct mr_at_f32 {
    typedef float S;
    typedef float A;
    static __device__ A get(S v) { return v; }
    static __device__ S put(A v) { return v; }
};
struct mr_at_f64 {
    typedef double S;
    typedef double A;
    static __device__ A get(S v) { return v; }
    static __device__ S put(A v) { return v; }
};
struct mr_at_bf16 {
    typedef uint16_t S;
    typedef float A;
    static __device__ A get(S v) { return mr_bf16_to_f32(v); }
    static __device__ S put(A v) { return mr_f32_to_bf16(v); }
};
struct mr_at_f16 {
    typedef uint16_t S;
    typedef float A;
    static __device__ A get(S v) { return mr_f16_to_f32(v); }
    static __device__ S put(A v) { return mr_f32_to_f16(v); }
};

__device__ __forceinline__ float mr_at_exp(float x) { return expf(x); }
__device__ __forceinline__ double mr_at_exp(double x) { return exp(x); }
__device__ __forceinline__ float mr_at_log(float x) { return logf(x); }
__device__ __forceinline__ double mr_at_log(double x) { return log(x); }

template <typename A> __device__ __forceinline__ A mr_at_warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}
template <typename A> __device__ __forceinline__ A mr_at_warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) {
        A w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return __shfl_sync(0xffffffffu, v, 0);
}

/* The dot product of two length-d rows of stored type S, in A. */
template <typename M>
__device__ __forceinline__ typename M::A mr_at_dot(const typename M::S *a, const typename M::S *b, int64_t d) {
    typename M::A s = 0;
    for (int64_t c = 0; c < d; c++) s += M::get(a[c]) * M::get(b[c]);
    return s;
}

/* q (bh,T,D), k, v (bh,S,D) -> y (bh,T,D), lse (bh,T); one warp (the block) per query row. */
template <typename M>
__global__ void __launch_bounds__(32)
    mr_attention_fwd_kernel(const typename M::S *__restrict__ q, const typename M::S *__restrict__ k,
                            const typename M::S *__restrict__ v, typename M::S *__restrict__ y,
                            typename M::A *__restrict__ lse, int64_t rows, int64_t t, int64_t s, int64_t d,
                            typename M::A scale, int causal) {
    typedef typename M::A A;
    extern __shared__ double mr_attn_fwd_sh[]; /* double: aligned for either A */
    A *p = (A *)mr_attn_fwd_sh;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t b = row / t, n = mr_attn_keys(row % t, t, s, causal);
        const typename M::S *qr = q + row * d, *kb = k + b * s * d, *vb = v + b * s * d;
        A m = -INFINITY;
        for (int64_t j = threadIdx.x; j < n; j += 32) {
            p[j] = mr_at_dot<M>(qr, kb + j * d, d) * scale;
            m = p[j] > m ? p[j] : m;
        }
        m = mr_at_warp_max(m);
        A l = 0;
        for (int64_t j = threadIdx.x; j < n; j += 32) {
            p[j] = mr_at_exp(p[j] - m);
            l += p[j];
        }
        l = mr_at_warp_sum(l);
        __syncthreads(); /* every lane's p[j] is written */
        const A inv = (A)1 / l;
        for (int64_t c = threadIdx.x; c < d; c += 32) {
            A acc = 0;
            for (int64_t j = 0; j < n; j++) acc += p[j] * M::get(vb[j * d + c]);
            y[row * d + c] = M::put(acc * inv);
        }
        if (threadIdx.x == 0) lse[row] = m + mr_at_log(l);
        __syncthreads(); /* p is read by every lane before the next row overwrites it */
    }
}

/* dq (bh,T,D); one warp per query row. */
template <typename M>
__global__ void __launch_bounds__(32)
    mr_attention_dq_kernel(const typename M::S *__restrict__ q, const typename M::S *__restrict__ k,
                           const typename M::S *__restrict__ v, const typename M::S *__restrict__ y,
                           const typename M::A *__restrict__ lse, const typename M::S *__restrict__ dy,
                           typename M::S *__restrict__ dq, int64_t rows, int64_t t, int64_t s, int64_t d,
                           typename M::A scale, int causal) {
    typedef typename M::A A;
    extern __shared__ double mr_attn_dq_sh[]; /* double: aligned for either A */
    A *ds = (A *)mr_attn_dq_sh;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t b = row / t, n = mr_attn_keys(row % t, t, s, causal);
        const typename M::S *qr = q + row * d, *dyr = dy + row * d, *kb = k + b * s * d, *vb = v + b * s * d;
        A dyy = 0;
        for (int64_t c = threadIdx.x; c < d; c += 32) dyy += M::get(dyr[c]) * M::get(y[row * d + c]);
        dyy = mr_at_warp_sum(dyy);
        const A ls = lse[row];
        for (int64_t j = threadIdx.x; j < n; j += 32) {
            A pj = mr_at_exp(mr_at_dot<M>(qr, kb + j * d, d) * scale - ls);
            ds[j] = pj * (mr_at_dot<M>(dyr, vb + j * d, d) - dyy) * scale;
        }
        __syncthreads();
        for (int64_t c = threadIdx.x; c < d; c += 32) {
            A acc = 0;
            for (int64_t j = 0; j < n; j++) acc += ds[j] * M::get(kb[j * d + c]);
            dq[row * d + c] = M::put(acc);
        }
        __syncthreads();
    }
}

/* dk, dv (bh,S,D); one warp per key row j, over the query rows i that see it (i >= j - (S - T)
 * when causal). */
template <typename M>
__global__ void __launch_bounds__(32)
    mr_attention_dkdv_kernel(const typename M::S *__restrict__ q, const typename M::S *__restrict__ k,
                             const typename M::S *__restrict__ v, const typename M::S *__restrict__ y,
                             const typename M::A *__restrict__ lse, const typename M::S *__restrict__ dy,
                             typename M::S *__restrict__ dk, typename M::S *__restrict__ dv, int64_t keys,
                             int64_t t, int64_t s, int64_t d, typename M::A scale, int causal) {
    typedef typename M::A A;
    extern __shared__ double mr_attn_dkdv_sh[]; /* double: aligned for either A */
    A *pr = (A *)mr_attn_dkdv_sh, *ds = pr + t;
    for (int64_t key = blockIdx.x; key < keys; key += gridDim.x) {
        const int64_t b = key / s, j = key % s;
        const int64_t i0 = causal && j > s - t ? j - (s - t) : 0;
        const typename M::S *kr = k + key * d, *vr = v + key * d;
        for (int64_t i = i0 + threadIdx.x; i < t; i += 32) {
            const int64_t r = (b * t + i) * d;
            A pij = mr_at_exp(mr_at_dot<M>(q + r, kr, d) * scale - lse[b * t + i]);
            pr[i] = pij;
            ds[i] = pij * (mr_at_dot<M>(dy + r, vr, d) - mr_at_dot<M>(dy + r, y + r, d)) * scale;
        }
        __syncthreads();
        for (int64_t c = threadIdx.x; c < d; c += 32) {
            A ak = 0, av = 0;
            for (int64_t i = i0; i < t; i++) {
                const int64_t r = (b * t + i) * d + c;
                ak += ds[i] * M::get(q[r]);
                av += pr[i] * M::get(dy[r]);
            }
            dk[key * d + c] = M::put(ak);
            dv[key * d + c] = M::put(av);
        }
        __syncthreads();
    }
}

namespace {

/* The static shared memory a block may use without opting in. */
const size_t MR_ATTN_SHARED = 48u << 10;

struct attn_geom {
    int64_t bh, t, s, d;
};

attn_geom geom_of(const mr_op_args *a) {
    const mr_shape *q = &a->in[0].shape;
    attn_geom g;
    g.t = q->dim[q->ndim - 2];
    g.d = q->dim[q->ndim - 1];
    g.s = a->in[1].shape.dim[q->ndim - 2];
    g.bh = mr_shape_numel(q) / (g.t * g.d);
    return g;
}

unsigned grid_of(int64_t rows) { return (unsigned)(rows > (1 << 20) ? (1 << 20) : rows); }

template <typename M> mr_status fwd(const mr_op_args *a, cudaStream_t st, const attn_geom &g) {
    typedef typename M::A A;
    size_t sh = (size_t)g.s * sizeof(A);
    if (sh > MR_ATTN_SHARED)
        return mr_op_error(a, "the CUDA kernel keeps a row of %lld keys in shared memory (%zu bytes, over %zu); HINT: "
                              "use a shorter context",
                           (long long)g.s, sh, MR_ATTN_SHARED);
    mr_attention_fwd_kernel<M><<<grid_of(g.bh * g.t), 32, sh, st>>>(
        (const typename M::S *)a->in[0].data, (const typename M::S *)a->in[1].data,
        (const typename M::S *)a->in[2].data, (typename M::S *)a->out[0].data, (A *)a->out[1].data, g.bh * g.t, g.t,
        g.s, g.d, (A)a->p.attention.scale, a->p.attention.causal);
    return mr_cuda_check_launch("attention");
}

template <typename M> mr_status bwd(const mr_op_args *a, cudaStream_t st, const attn_geom &g) {
    typedef typename M::A A;
    typedef typename M::S S;
    size_t sh_q = (size_t)g.s * sizeof(A), sh_k = 2 * (size_t)g.t * sizeof(A);
    if (sh_q > MR_ATTN_SHARED || sh_k > MR_ATTN_SHARED)
        return mr_op_error(a, "the CUDA kernels keep %lld keys and 2 x %lld queries in shared memory (over %zu bytes); "
                              "HINT: use a shorter context",
                           (long long)g.s, (long long)g.t, MR_ATTN_SHARED);
    const S *q = (const S *)a->in[0].data, *k = (const S *)a->in[1].data, *v = (const S *)a->in[2].data;
    const S *y = (const S *)a->in[3].data, *dy = (const S *)a->in[5].data;
    const A *lse = (const A *)a->in[4].data, scale = (A)a->p.attention.scale;
    mr_attention_dq_kernel<M><<<grid_of(g.bh * g.t), 32, sh_q, st>>>(q, k, v, y, lse, dy, (S *)a->out[0].data,
                                                                     g.bh * g.t, g.t, g.s, g.d, scale,
                                                                     a->p.attention.causal);
    mr_status r = mr_cuda_check_launch("attention_bwd dq");
    if (r != MR_OK) return r;
    mr_attention_dkdv_kernel<M><<<grid_of(g.bh * g.s), 32, sh_k, st>>>(
        q, k, v, y, lse, dy, (S *)a->out[1].data, (S *)a->out[2].data, g.bh * g.s, g.t, g.s, g.d, scale,
        a->p.attention.causal);
    return mr_cuda_check_launch("attention_bwd dk dv");
}

} // namespace

/* q (..,T,D), k, v (..,S,D) -> y (..,T,D), lse (..,T) */
extern "C" mr_status mr_attention_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    attn_geom g = geom_of(a);
    if (mr_attention_cudnn(a, 0, &st)) return st; /* bf16/f16 through cuDNN when it has an engine */
    MR_TRY(mr_cuda_op_stream(a, &s));
    switch (a->in[0].dtype) {
    case MR_F32: return fwd<mr_at_f32>(a, s, g);
    case MR_F64: return fwd<mr_at_f64>(a, s, g);
    case MR_BF16: return fwd<mr_at_bf16>(a, s, g);
    case MR_F16: return fwd<mr_at_f16>(a, s, g);
    default: return mr_op_error(a, "no CUDA kernel for %s", mr_dtype_name(a->in[0].dtype));
    }
fail:
    return st;
}

/* q, k, v, y, lse, dy -> dq, dk, dv */
extern "C" mr_status mr_attention_bwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    attn_geom g = geom_of(a);
    if (mr_attention_cudnn(a, 1, &st)) return st; /* bf16/f16 through cuDNN when it has an engine */
    MR_TRY(mr_cuda_op_stream(a, &s));
    switch (a->in[0].dtype) {
    case MR_F32: return bwd<mr_at_f32>(a, s, g);
    case MR_F64: return bwd<mr_at_f64>(a, s, g);
    case MR_BF16: return bwd<mr_at_bf16>(a, s, g);
    case MR_F16: return bwd<mr_at_f16>(a, s, g);
    default: return mr_op_error(a, "no CUDA kernel for %s", mr_dtype_name(a->in[0].dtype));
    }
fail:
    return st;
}
