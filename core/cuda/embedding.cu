/* Embedding gather, its scatter-add gradient, and inverted dropout on the GPU (MR_OP_EMBEDDING,
 * MR_OP_EMBEDDING_BWD, MR_OP_DROPOUT and MR_OP_DROPOUT_BWD in ops.h; oracles in
 * core/ref/embedding_ref.c and core/ref/dropout_ref.c). f32 and f64, as the checks accept.
 *
 * EMBEDDING_BWD is deterministic without float atomics: one block per table row sums the dy rows
 * of that row's tokens in increasing position, from 0. That is the order of the CPU kernel and of
 * the reference, so f32 results equal the CPU's bit for bit and f64 results the reference's.
 * f32 (the training path) finds each row's tokens through buckets in the op's workspace: integer
 * atomics count the positions per id, a one-block scan gives each row the start of its bucket,
 * integer atomics fill the buckets, and the row's block sorts its bucket (the fill order varies
 * from run to run; the positions are distinct, so the sorted bucket is unique). f64 (gradient
 * checks; no workspace, as for every reference-precision op) has each row's block scan all ids,
 * which costs V*n id reads but no scratch; f32 does that too for a row hit more than
 * EMB_SORT_CAP times (padding, a tiny vocabulary), at most n / EMB_SORT_CAP rows.
 *
 * Ids outside [0, V): the reference and the CPU reject them before writing; here that would need
 * a device-to-host copy and a sync per call, so the kernels handle them without one: the gather
 * fills such a token's row of y with NaN (the loss turns NaN instead of the model silently
 * training on a made-up row), and the scatter-add skips such tokens.
 *
 * DROPOUT draws its mask with core/math/philox_math.h and core/math/dropout_math.h, the code of
 * the CPU kernel and the reference, so the GPU keeps exactly the elements the CPU keeps; f32
 * values are x * (float)(1/(1-p)) as on the CPU, so the outputs match bit for bit too. */
#include <stdint.h>

#include "core/cuda/cuda_impl.h"
#include "core/math/dropout_math.h"
#include "core/ops_impl.h"

/* The NaN a gathered row of a bad id is filled with, per (vector) element type. */
template <typename V> __device__ V mr_emb_nan();
template <> __device__ float mr_emb_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ double mr_emb_nan<double>() { return __longlong_as_double(0x7ff8000000000000LL); }
template <> __device__ float4 mr_emb_nan<float4>() {
    float q = __int_as_float(0x7fc00000);
    return make_float4(q, q, q, q);
}
template <> __device__ double2 mr_emb_nan<double2>() {
    double q = __longlong_as_double(0x7ff8000000000000LL);
    return make_double2(q, q);
}

/* ---- EMBEDDING: y[i, :] = table[ids[i], :] ----------------------------------------------------- */

/* table (V, dv) and y (n, dv) of V, the element type or a 16-byte vector of it (dv = D / lanes);
 * ids (n). One block per token row (grid-stride over rows), threads across the row, so the read
 * of the table row and the write of the y row are both coalesced. */
template <typename V>
__global__ void mr_emb_fwd_kernel(const V *__restrict__ table, const int32_t *__restrict__ ids, V *__restrict__ y,
                                  int64_t n, int64_t vocab, int64_t dv) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        int32_t id = ids[i];
        V *dst = y + i * dv;
        if (id < 0 || id >= vocab) {
            for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) dst[j] = mr_emb_nan<V>();
            continue;
        }
        const V *src = table + (int64_t)id * dv;
        for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) dst[j] = src[j];
    }
}

/* Threads per block for rows of dv vectors: whole warps, at most MR_CUDA_BLOCK. */
static unsigned row_threads(int64_t dv) {
    int64_t t = (dv + 31) / 32 * 32;
    return (unsigned)(t > MR_CUDA_BLOCK ? MR_CUDA_BLOCK : t);
}

/* Blocks for a grid-stride loop over `rows` rows, one row per block per step. */
static unsigned row_grid(int64_t rows) { return (unsigned)(rows > 65536 ? 65536 : rows); }

static int aligned16(const void *p, const void *q) { return (((uintptr_t)p | (uintptr_t)q) & 15u) == 0; }

template <typename T, typename V>
static void launch_emb_fwd(const mr_op_args *a, cudaStream_t s, int64_t n, int64_t vocab, int64_t d) {
    int64_t dv = d / (int64_t)(sizeof(V) / sizeof(T));
    mr_emb_fwd_kernel<V><<<row_grid(n), row_threads(dv), 0, s>>>((const V *)a->in[0].data,
                                                                   (const int32_t *)a->in[1].data,
                                                                   (V *)a->out[0].data, n, vocab, dv);
}

extern "C" mr_status mr_embedding_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    /* table (V,D); ids (...) i32, n of them; y (..., D) */
    mr_dtype dt = a->in[0].dtype;
    int64_t vocab = a->in[0].shape.dim[0], d = a->in[0].shape.dim[1], n = mr_shape_numel(&a->in[1].shape);
    const void *table = a->in[0].data, *y = a->out[0].data;
    if (dt != MR_F32 && dt != MR_F64)
        return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
    if (n == 0 || d == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    /* 16-byte vectors when every row starts 16-byte aligned */
    if (dt == MR_F32) {
        if (d % 4 == 0 && aligned16(table, y))
            launch_emb_fwd<float, float4>(a, s, n, vocab, d);
        else
            launch_emb_fwd<float, float>(a, s, n, vocab, d);
    } else {
        if (d % 2 == 0 && aligned16(table, y))
            launch_emb_fwd<double, double2>(a, s, n, vocab, d);
        else
            launch_emb_fwd<double, double>(a, s, n, vocab, d);
    }
    return mr_cuda_check_launch("embedding");
fail:
    return st;
}

/* ---- EMBEDDING_BWD: dtable[v, :] = sum over i with ids[i] == v of dy[i, :] ---------------------- */

/* Threads of the row-sum kernel, and the largest bucket it sorts in shared memory (8 KiB for the
 * two copies). A bigger bucket (a token in more than EMB_SORT_CAP positions: padding, or a tiny
 * vocabulary) is found by rescanning the ids instead; at most n / EMB_SORT_CAP rows do that, so
 * the rescans cost at most n * n / EMB_SORT_CAP id reads. */
#define EMB_SUM_BLOCK 256
#define EMB_SORT_CAP 1024
static_assert(EMB_SORT_CAP >= EMB_SUM_BLOCK, "a rescanned chunk's hits go into the sort buffer");
/* Threads of the one-block scan over the V+1 row counts. */
#define EMB_SCAN_BLOCK 1024

/* ids (n); cnt (V+1) zeroed: cnt[v] += 1 for each valid id v. Integer atomics: the counts do not
 * depend on the order. */
__global__ void mr_emb_count_kernel(const int32_t *__restrict__ ids, int64_t n, int64_t vocab, int32_t *cnt) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int32_t id = ids[i];
        if (id >= 0 && id < vocab) atomicAdd(&cnt[id], 1);
    }
}

/* start (m = V+1): the counts in, their exclusive prefix sum out (start[V] = the valid ids);
 * cursor (V) gets a copy of the first V starts (the fill kernel's per-row write positions).
 * One block: thread t scans its chunk of ceil(m / blockDim) counts serially, a warp-shuffle scan
 * of the chunk totals gives each chunk its base. The sums fit i32: they are at most n <= 2^31-1. */
__global__ void __launch_bounds__(EMB_SCAN_BLOCK) mr_emb_scan_kernel(int32_t *start, int32_t *cursor, int64_t m) {
    __shared__ int32_t warp_sum[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    int64_t per = (m + blockDim.x - 1) / blockDim.x;
    int64_t b = (int64_t)threadIdx.x * per, e = b + per < m ? b + per : m;
    int32_t sum = 0;
    for (int64_t k = b; k < e; k++) sum += start[k];
    int32_t incl = sum; /* inclusive scan of the chunk totals within the warp */
    for (int o = 1; o < 32; o <<= 1) {
        int32_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    if (lane == 31) warp_sum[warp] = incl;
    __syncthreads();
    if (warp == 0) { /* inclusive scan of the warp totals */
        int32_t w = lane < nwarps ? warp_sum[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int32_t t = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += t;
        }
        warp_sum[lane] = w;
    }
    __syncthreads();
    int32_t run = (warp > 0 ? warp_sum[warp - 1] : 0) + incl - sum;
    for (int64_t k = b; k < e; k++) {
        int32_t c = start[k];
        start[k] = run;
        if (k < m - 1) cursor[k] = run;
        run += c;
    }
}

/* ids (n); cursor (V); pos (n): each valid position i goes into its id's bucket, at a slot the
 * atomics hand out in whatever order the threads arrive (the sum kernel sorts the bucket). */
__global__ void mr_emb_fill_kernel(const int32_t *__restrict__ ids, int64_t n, int64_t vocab, int32_t *cursor,
                                   int32_t *pos) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int32_t id = ids[i];
        if (id >= 0 && id < vocab) pos[atomicAdd(&cursor[id], 1)] = (int32_t)i;
    }
}

/* Block `tid`'s part of dtable row v (row (D)) = the sum, in increasing position, of the dy rows
 * (dy (n, D)) of the tokens with id v, found by scanning all ids (n) in chunks of EMB_SUM_BLOCK:
 * a ballot compacts each chunk's hits in order into s_hit, then thread j adds them to column j
 * of the row, which only it touches (so the row holds the running sum, in the same order and
 * rounding as a register would). Every thread of the block must call it (it synchronises). */
template <typename T>
__device__ void mr_emb_rescan_row(const int32_t *__restrict__ ids, const T *__restrict__ dy, T *row, int64_t n,
                                  int64_t v, int64_t d, int32_t *s_hit, int32_t *s_warp_hits) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int64_t j = tid; j < d; j += EMB_SUM_BLOCK) row[j] = (T)0;
    for (int64_t i0 = 0; i0 < n; i0 += EMB_SUM_BLOCK) {
        int64_t i = i0 + tid;
        int hit = i < n && ids[i] == v;
        unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) s_warp_hits[warp] = __popc(m);
        __syncthreads();
        int32_t before = 0, total = 0;
        for (int w = 0; w < EMB_SUM_BLOCK / 32; w++) {
            if (w < warp) before += s_warp_hits[w];
            total += s_warp_hits[w];
        }
        if (hit) s_hit[before + __popc(m & ((1u << lane) - 1u))] = (int32_t)i;
        __syncthreads();
        if (total > 0)
            for (int64_t j = tid; j < d; j += EMB_SUM_BLOCK) {
                T acc = row[j];
                for (int32_t k = 0; k < total; k++) acc += dy[(int64_t)s_hit[k] * d + j];
                row[j] = acc;
            }
        __syncthreads(); /* s_warp_hits and s_hit are rewritten for the next chunk */
    }
}

/* ids (n); dy (n, D); dtable (V, D), every row written. One block per table row (grid-stride
 * over rows). BUCKETS (f32, with the workspace): start (V+1) and pos (n) hold the buckets; a row
 * whose bucket has at most EMB_SORT_CAP positions sorts it in shared memory by rank (rank = how
 * many bucket entries are smaller; the entries are distinct) and thread j sums column j over it
 * in that order, reading dy rows coalesced; a bigger bucket, or every row without BUCKETS (f64,
 * no workspace), goes through mr_emb_rescan_row. Either way the sum runs in increasing
 * position from 0. */
template <typename T, bool BUCKETS>
__global__ void __launch_bounds__(EMB_SUM_BLOCK)
    mr_emb_sum_kernel(const int32_t *__restrict__ ids, const T *__restrict__ dy, const int32_t *__restrict__ start,
                      const int32_t *__restrict__ pos, T *__restrict__ dtable, int64_t n, int64_t vocab, int64_t d) {
    __shared__ int32_t s_in[EMB_SORT_CAP], s_sorted[EMB_SORT_CAP];
    __shared__ int32_t s_warp_hits[EMB_SUM_BLOCK / 32];
    const int tid = threadIdx.x;
    for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
        int32_t b = BUCKETS ? start[v] : 0, c = BUCKETS ? start[v + 1] - b : 0;
        if (!BUCKETS || c > EMB_SORT_CAP) {
            /* s_in (EMB_SORT_CAP >= EMB_SUM_BLOCK entries) holds a chunk's hits */
            mr_emb_rescan_row<T>(ids, dy, dtable + v * d, n, v, d, s_in, s_warp_hits);
            continue;
        }
        if (c > 0) {
            for (int32_t k = tid; k < c; k += EMB_SUM_BLOCK) s_in[k] = pos[b + k];
            __syncthreads();
            for (int32_t k = tid; k < c; k += EMB_SUM_BLOCK) {
                int32_t p = s_in[k], r = 0;
                for (int32_t q = 0; q < c; q++) r += s_in[q] < p;
                s_sorted[r] = p;
            }
            __syncthreads();
        }
        for (int64_t j = tid; j < d; j += EMB_SUM_BLOCK) {
            T acc = 0;
#pragma unroll 4
            for (int32_t k = 0; k < c; k++) acc += dy[(int64_t)s_sorted[k] * d + j];
            dtable[v * d + j] = acc;
        }
        __syncthreads(); /* the next row refills s_in and s_sorted */
    }
}

extern "C" mr_status mr_embedding_bwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    /* ids (...) i32, n of them; dy (..., D); dtable (V,D) */
    mr_dtype dt = a->in[1].dtype;
    int64_t vocab = a->out[0].shape.dim[0], d = a->out[0].shape.dim[1], n = mr_shape_numel(&a->in[0].shape);
    const int32_t *ids = (const int32_t *)a->in[0].data;
    size_t need = mr_embedding_bwd_workspace(a);
    unsigned grid = (unsigned)(vocab > (1 << 20) ? (1 << 20) : vocab);
    if (dt != MR_F32 && dt != MR_F64)
        return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
    if (n > INT32_MAX) return mr_op_error(a, "%lld ids: the CUDA kernel takes at most 2^31-1", (long long)n);
    if (vocab == 0 || d == 0) return MR_OK;
    if (need > 0 && (!a->workspace || a->workspace_bytes < need))
        return mr_op_error(a, "needs a device workspace of %zu bytes (mr_op_workspace_bytes)", need);
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (dt == MR_F64) {
        /* no buckets (no workspace for f64): every row rescans the ids */
        mr_emb_sum_kernel<double, false><<<grid, EMB_SUM_BLOCK, 0, s>>>(ids, (const double *)a->in[1].data, NULL, NULL,
                                                                       (double *)a->out[0].data, n, vocab, d);
        return mr_cuda_check_launch("embedding_bwd");
    }
    {
        /* workspace: start (V+1), cursor (V), pos (n), all i32 */
        int32_t *start = (int32_t *)a->workspace, *cursor = start + vocab + 1, *pos = cursor + vocab;
        MR_TRY_CUDA(cudaMemsetAsync(start, 0, (size_t)(vocab + 1) * sizeof(int32_t), s));
        if (n > 0) {
            mr_emb_count_kernel<<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(ids, n, vocab, start);
            mr_emb_scan_kernel<<<1, EMB_SCAN_BLOCK, 0, s>>>(start, cursor, vocab + 1);
            mr_emb_fill_kernel<<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(ids, n, vocab, cursor, pos);
        }
        mr_emb_sum_kernel<float, true><<<grid, EMB_SUM_BLOCK, 0, s>>>(ids, (const float *)a->in[1].data, start, pos,
                                                                      (float *)a->out[0].data, n, vocab, d);
    }
    return mr_cuda_check_launch("embedding_bwd");
fail:
    return st;
}

/* ---- DROPOUT, DROPOUT_BWD: y = keep(i) ? x * 1/(1-p) : 0 --------------------------------------- */

/* x, y (n). Thread per Philox block: one mr_philox4x32_10 call gives the words of the four
 * elements 4b .. 4b+3 (block counter b + offset, as mr_philox_u32 and the CPU kernel use).
 * VEC (f32 only): x and y are 16-byte aligned, so full blocks move as one float4. x and y may be
 * the same buffer (in place): each element is read, then written, by one thread. */
template <typename T, bool VEC>
__global__ void mr_dropout_kernel(const T *x, T *y, int64_t n, uint64_t seed, uint64_t offset, double p, T scale) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    int64_t nblk = (n + 3) / 4;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblk; b += (int64_t)gridDim.x * blockDim.x) {
        uint64_t ctr64 = (uint64_t)b + offset;
        uint32_t ctr[4] = {(uint32_t)ctr64, (uint32_t)(ctr64 >> 32), 0u, 0u}, r[4];
        mr_philox4x32_10(ctr, key, r);
        int64_t i0 = b * 4;
        if constexpr (VEC) {
            if (i0 + 4 <= n) {
                float4 v = *(const float4 *)(x + i0);
                v.x = mr_dropout_keep(r[0], p) ? v.x * scale : 0.0f;
                v.y = mr_dropout_keep(r[1], p) ? v.y * scale : 0.0f;
                v.z = mr_dropout_keep(r[2], p) ? v.z * scale : 0.0f;
                v.w = mr_dropout_keep(r[3], p) ? v.w * scale : 0.0f;
                *(float4 *)(y + i0) = v;
                continue;
            }
        }
        int64_t m = n - i0 < 4 ? n - i0 : 4;
        for (int64_t l = 0; l < m; l++) y[i0 + l] = mr_dropout_keep(r[l], p) ? x[i0 + l] * scale : (T)0;
    }
}

extern "C" mr_status mr_dropout_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    const mr_dropout_params *p = &a->p.dropout;
    mr_dtype dt = a->in[0].dtype;
    /* x or dy, any shape, flat (n); y or dx (n) */
    const void *x = a->in[0].data;
    void *y = a->out[0].data;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    size_t bytes = (size_t)n * mr_dtype_size(dt);
    if (dt != MR_F32 && dt != MR_F64)
        return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
    if (n == 0) return MR_OK;
    MR_TRY(mr_cuda_op_stream(a, &s));
    /* p == 0 is the identity and p == 1 drops everything (no 1/0), as on the CPU */
    if (p->p == 0.0) {
        if (y != x) MR_TRY_CUDA(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s));
        return MR_OK;
    }
    if (p->p >= 1.0) {
        MR_TRY_CUDA(cudaMemsetAsync(y, 0, bytes, s));
        return MR_OK;
    }
    {
        unsigned grid = mr_cuda_grid((n + 3) / 4);
        if (dt == MR_F32) {
            /* the CPU kernel's f32 scale, so kept values match it bit for bit */
            float scale = (float)(1.0 / (1.0 - p->p));
            if (aligned16(x, y))
                mr_dropout_kernel<float, true><<<grid, MR_CUDA_BLOCK, 0, s>>>((const float *)x, (float *)y, n, p->seed,
                                                                              p->offset, p->p, scale);
            else
                mr_dropout_kernel<float, false><<<grid, MR_CUDA_BLOCK, 0, s>>>((const float *)x, (float *)y, n,
                                                                               p->seed, p->offset, p->p, scale);
        } else {
            mr_dropout_kernel<double, false><<<grid, MR_CUDA_BLOCK, 0, s>>>((const double *)x, (double *)y, n, p->seed,
                                                                            p->offset, p->p, 1.0 / (1.0 - p->p));
        }
    }
    return mr_cuda_check_launch(mr_op_get(a->op)->name);
fail:
    return st;
}
