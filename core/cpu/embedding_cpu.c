/* Embedding gather and scatter-add, CPU fast path (f32; f64 runs the reference).
 * The gather is parallel over tokens. The scatter-add is parallel over blocks of the D columns:
 * each thread owns whole columns of dtable and walks all tokens in order, so repeated ids never
 * race and every element is summed in token order whatever the thread count (no workspace, no
 * atomics). */
#include "core/ops_impl.h"

#include <string.h>

#define EMB_PAR_MIN 32768
/* Columns per block in the scatter-add: wide enough for vector loads, narrow enough to split D. */
#define EMB_COL_BLOCK 32

/* Serial scan so the error names the first bad position, as the reference does. */
static mr_status emb_check_ids(const mr_op_args *a, const int32_t *ids, int64_t n, int64_t vocab) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return mr_op_error(a, "ids[%lld] = %d is outside [0, %lld)", (long long)i, (int)ids[i], (long long)vocab);
    return MR_OK;
}

mr_status mr_embedding_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_embedding_fwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    /* table (V,D); ids (n) flattened; y (n,D) */
    const float *table = a->in[0].data;
    const int32_t *ids = a->in[1].data;
    float *y = a->out[0].data;
    int64_t vocab = a->in[0].shape.dim[0], d = a->in[0].shape.dim[1], n = mr_shape_numel(&a->in[1].shape);
    mr_status st = emb_check_ids(a, ids, n, vocab);
    if (st != MR_OK) return st;
#pragma omp parallel for schedule(static) if (n * d > EMB_PAR_MIN)
    for (int64_t i = 0; i < n; i++) memcpy(y + i * d, table + (int64_t)ids[i] * d, (size_t)d * sizeof(float));
    return MR_OK;
}

mr_status mr_embedding_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_embedding_bwd_ref(a);
    if (a->in[1].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[1].dtype));
    /* ids (n) flattened; dy (n,D); dtable (V,D) */
    const int32_t *ids = a->in[0].data;
    const float *dy = a->in[1].data;
    float *dtable = a->out[0].data;
    int64_t vocab = a->out[0].shape.dim[0], d = a->out[0].shape.dim[1], n = mr_shape_numel(&a->in[0].shape);
    mr_status st = emb_check_ids(a, ids, n, vocab);
    if (st != MR_OK) return st;
    int64_t nblk = (d + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK;
    int par = (vocab + n) * d > EMB_PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t v = 0; v < vocab; v++) memset(dtable + v * d, 0, (size_t)d * sizeof(float));
#pragma omp parallel for schedule(static) if (par && nblk > 1)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t j0 = b * EMB_COL_BLOCK, j1 = j0 + EMB_COL_BLOCK < d ? j0 + EMB_COL_BLOCK : d;
        for (int64_t i = 0; i < n; i++) {
            float *restrict dst = dtable + (int64_t)ids[i] * d;
            const float *restrict src = dy + i * d;
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) dst[j] += src[j];
        }
    }
    return MR_OK;
}
