/* Permute (a transpose as an op) and flat concatenation on the GPU (MR_OP_PERMUTE, MR_OP_CONCAT in
 * ops.h; oracles in core/ref/permute_ref.c and core/ref/concat_ref.c).
 *
 * PERMUTE first simplifies the permutation as the CPU kernel does (core/math/permute_math.h:
 * size-1 dims dropped, dims that stay adjacent and in order merged), then:
 *   - nothing left to move: one device-to-device copy;
 *   - x's last dim stays last: rows of that dim are contiguous on both sides, so a block copies a
 *     row (one index decomposition per row), or for short rows a thread copies an element;
 *   - otherwise (the last-two-dims swap of attention and NCHW<->NHWC among them): a tiled
 *     transpose between x's last dim (contiguous in x) and y's last dim (contiguous in y), through
 *     a 32x33 shared-memory tile, so both the reads and the writes are coalesced; the other dims
 *     form the batch of tiles.
 * Every kernel is a grid-stride loop (no gridDim.y/z limits) and each output element is written
 * once, so the result is deterministic. f32 and f64, as the check accepts.
 *
 * CONCAT is one cudaMemcpyAsync (device to device) per present input, in order, on the op's
 * stream: the inputs are contiguous byte ranges of one dtype, the copy engine moves them at full
 * bandwidth whatever the dtype, and there are at most MR_OP_MAX_IO of them, so a kernel would
 * only save a few launch latencies. */
#include <stdint.h>

#include "core/cuda/cuda_impl.h"
#include "core/math/permute_math.h"
#include "core/ops_impl.h"

/* Tile edge and the thread rows that sweep a tile (block = PERM_TILE x PERM_ROWS threads). */
#define PERM_TILE 32
#define PERM_ROWS 8
/* Rows at least this long are copied one block per row; shorter ones one thread per element. */
#define PERM_ROW_MIN 32

/* A gather: y dim d has size ydim[d] and x stride xstr[d]; y is contiguous. */
typedef struct mr_perm_gather {
    int nd;
    int64_t ydim[MR_MAX_DIMS];
    int64_t xstr[MR_MAX_DIMS];
} mr_perm_gather;

/* x, y (n): y[i] = x[offset of i's y coordinates]. I is uint32_t when n < 2^31 (cheaper division;
 * i + the grid stride stays below 2^32) and int64_t otherwise. */
template <typename T, typename I>
__global__ void mr_permute_gather_kernel(const T *__restrict__ x, T *__restrict__ y, I n, mr_perm_gather g) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I rem = i, off = 0;
        for (int d = g.nd - 1; d >= 0; d--) {
            I dim = (I)g.ydim[d];
            off += (rem % dim) * (I)g.xstr[d];
            rem /= dim;
        }
        y[i] = x[off];
    }
}

/* x, y: `rows` rows of `cols` elements contiguous on both sides; g describes the leading y dims
 * (the row index), xstr in elements. One block per row, threads across it. */
template <typename T>
__global__ void mr_permute_rows_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t rows, int64_t cols,
                                       mr_perm_gather g) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t rem = row, off = 0;
        for (int d = g.nd - 1; d >= 0; d--) {
            off += (rem % g.ydim[d]) * g.xstr[d];
            rem /= g.ydim[d];
        }
        const T *src = x + off;
        T *dst = y + row * cols;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dst[j] = src[j];
    }
}

/* The tiled transpose: u runs along x's last dim (lx long, x stride 1, y stride ys_u), v along
 * y's last dim (ly long, x stride xs_v, y stride 1); the batch dims (in y order) have sizes bdim
 * and strides bxs (in x) and bys (in y). */
typedef struct mr_perm_tiled {
    int nb;
    int64_t bdim[MR_MAX_DIMS], bxs[MR_MAX_DIMS], bys[MR_MAX_DIMS];
    int64_t lx, ly, xs_v, ys_u;
    int64_t tiles_u, tiles_v, batch;
} mr_perm_tiled;

/* x, y of the plan's shapes. A block (PERM_TILE, PERM_ROWS) walks tiles (batch, v tile, u tile)
 * with a grid-stride loop: it reads the tile along u (coalesced in x), and writes it along v
 * (coalesced in y) from the transposed shared tile; the +1 column keeps both shared-memory
 * passes free of bank conflicts for 4-byte elements. */
template <typename T>
__global__ void __launch_bounds__(PERM_TILE *PERM_ROWS)
    mr_permute_tiled_kernel(const T *__restrict__ x, T *__restrict__ y, mr_perm_tiled t) {
    __shared__ T tile[PERM_TILE][PERM_TILE + 1]; /* [v - v0][u - u0] */
    const int64_t per_batch = t.tiles_u * t.tiles_v, total = per_batch * t.batch;
    for (int64_t k = blockIdx.x; k < total; k += gridDim.x) {
        int64_t bi = k / per_batch, r = k % per_batch;
        int64_t u0 = (r % t.tiles_u) * PERM_TILE, v0 = (r / t.tiles_u) * PERM_TILE;
        int64_t xo = 0, yo = 0, rem = bi;
        for (int d = t.nb - 1; d >= 0; d--) {
            int64_t idx = rem % t.bdim[d];
            rem /= t.bdim[d];
            xo += idx * t.bxs[d];
            yo += idx * t.bys[d];
        }
        int64_t u = u0 + threadIdx.x;
        for (int dv = threadIdx.y; dv < PERM_TILE; dv += PERM_ROWS) {
            int64_t v = v0 + dv;
            if (u < t.lx && v < t.ly) tile[dv][threadIdx.x] = x[xo + v * t.xs_v + u];
        }
        __syncthreads();
        int64_t v = v0 + threadIdx.x;
        for (int du = threadIdx.y; du < PERM_TILE; du += PERM_ROWS) {
            int64_t uu = u0 + du;
            if (uu < t.lx && v < t.ly) y[yo + uu * t.ys_u + v] = tile[threadIdx.x][du];
        }
        __syncthreads(); /* the tile is refilled for the next k */
    }
}

static unsigned grid_of(int64_t blocks) { return (unsigned)(blocks > (1 << 20) ? (1 << 20) : blocks); }

template <typename T>
static mr_status permute_launch(const mr_op_args *a, cudaStream_t s, const mr_perm_plan *pl, int64_t n) {
    const T *x = (const T *)a->in[0].data;
    T *y = (T *)a->out[0].data;
    int nd = pl->nd;
    int64_t xstr[MR_MAX_DIMS] = {0}, ydim[MR_MAX_DIMS] = {0}, ystr[MR_MAX_DIMS] = {0};
    xstr[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--) xstr[d] = xstr[d + 1] * pl->xdim[d + 1];
    for (int i = 0; i < nd; i++) ydim[i] = pl->xdim[pl->perm[i]];
    ystr[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--) ystr[d] = ystr[d + 1] * ydim[d + 1];
    if (pl->perm[nd - 1] == nd - 1) {
        int64_t cols = ydim[nd - 1], rows = n / cols;
        mr_perm_gather g;
        g.nd = cols >= PERM_ROW_MIN ? nd - 1 : nd;
        for (int d = 0; d < g.nd; d++) {
            g.ydim[d] = ydim[d];
            g.xstr[d] = xstr[pl->perm[d]];
        }
        if (cols >= PERM_ROW_MIN) {
            int64_t th = (cols + 31) / 32 * 32;
            mr_permute_rows_kernel<T><<<grid_of(rows), (unsigned)(th > MR_CUDA_BLOCK ? MR_CUDA_BLOCK : th), 0, s>>>(
                x, y, rows, cols, g);
        } else if (n <= INT32_MAX) {
            mr_permute_gather_kernel<T, uint32_t><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(x, y, (uint32_t)n, g);
        } else {
            mr_permute_gather_kernel<T, int64_t><<<mr_cuda_grid(n), MR_CUDA_BLOCK, 0, s>>>(x, y, n, g);
        }
        return mr_cuda_check_launch("permute");
    }
    /* a: the y position of x's last dim; q = perm[nd-1]: the x dim that is last in y */
    int a_pos = 0, q = pl->perm[nd - 1];
    while (pl->perm[a_pos] != nd - 1) a_pos++;
    mr_perm_tiled t;
    t.nb = 0;
    t.batch = 1;
    for (int d = 0; d < nd - 1; d++) {
        if (d == a_pos) continue;
        t.bdim[t.nb] = ydim[d];
        t.bxs[t.nb] = xstr[pl->perm[d]];
        t.bys[t.nb] = ystr[d];
        t.batch *= ydim[d];
        t.nb++;
    }
    t.lx = pl->xdim[nd - 1];
    t.ly = pl->xdim[q];
    t.xs_v = xstr[q];
    t.ys_u = ystr[a_pos];
    t.tiles_u = (t.lx + PERM_TILE - 1) / PERM_TILE;
    t.tiles_v = (t.ly + PERM_TILE - 1) / PERM_TILE;
    mr_permute_tiled_kernel<T><<<grid_of(t.tiles_u * t.tiles_v * t.batch), dim3(PERM_TILE, PERM_ROWS), 0, s>>>(x, y, t);
    return mr_cuda_check_launch("permute");
}

extern "C" mr_status mr_permute_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    mr_perm_plan pl;
    /* x (any shape), y (x's dims permuted by p.permute.perm) */
    mr_dtype dt = a->in[0].dtype;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    if (dt != MR_F32 && dt != MR_F64)
        return mr_op_error(a, "the CUDA kernel takes f32 or f64, got %s", mr_dtype_name(dt));
    if (a->out[0].dtype != dt)
        return mr_set_error(MR_ERR_UNSUPPORTED,
                            "permute: the CUDA kernel does not cast: y must be %s like x, got %s (a permute into a "
                            "half type is a CPU fusion; on a GPU permute, then CAST)",
                            mr_dtype_name(dt), mr_dtype_name(a->out[0].dtype));
    if (n == 0) return MR_OK;
    mr_perm_simplify(&a->in[0].shape, a->p.permute.perm, &pl);
    MR_TRY(mr_cuda_op_stream(a, &s));
    if (pl.nd <= 1) {
        MR_TRY_CUDA(cudaMemcpyAsync(a->out[0].data, a->in[0].data, (size_t)n * mr_dtype_size(dt),
                                    cudaMemcpyDeviceToDevice, s));
        return MR_OK;
    }
    return dt == MR_F32 ? permute_launch<float>(a, s, &pl, n) : permute_launch<double>(a, s, &pl, n);
fail:
    return st;
}

extern "C" mr_status mr_concat_fwd_cuda(const mr_op_args *a) {
    mr_status st = MR_OK;
    cudaStream_t s;
    /* in[i] (any shape, numel n_i), absent ones skipped; y (sum of n_i), one dtype for all */
    char *dst = (char *)a->out[0].data;
    size_t es = mr_dtype_size(a->out[0].dtype);
    MR_TRY(mr_cuda_op_stream(a, &s));
    for (int i = 0; i < a->n_in; i++) {
        if (!a->in[i].data) continue;
        size_t bytes = (size_t)mr_shape_numel(&a->in[i].shape) * es;
        if (bytes) MR_TRY_CUDA(cudaMemcpyAsync(dst, a->in[i].data, bytes, cudaMemcpyDeviceToDevice, s));
        dst += bytes;
    }
    return MR_OK;
fail:
    return st;
}
