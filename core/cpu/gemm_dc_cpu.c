/* GEMM_DC on the CPU (core/ops.h): a GEMM's output gradient made ready for its gradient GEMMs in
 * one pass: the GELU gradient (when the forward had the GELU epilogue), the cast to the GEMMs'
 * operand type (bf16/f16 under mixed precision) and the bias gradient, where the graph used to
 * run GELU_BWD, SUM and CAST, each a pass over the (rows, n) gradient in memory.
 *
 * Rows are taken in fixed blocks of MR_GEMM_DC_ROWS (one OpenMP task each) and columns in
 * segments of DC_SEG held in a stack buffer, so a row segment is computed once and then rounded
 * and summed while it is in L1. Each block sums its rows in row order into its own partial row of
 * the workspace; the partials are then added in block order. Which elements take the vector body
 * is fixed by the row and segment, so the bits do not depend on the thread count. f64 runs the
 * reference. */
#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"
#include "core/math/unary_math.h"
#include "core/ops_impl.h"

#include <string.h>

#include "core/cpu/vec_math_impl.h"

#define DC_SEG 512
#define DC_PAR_MIN 32768

/* One row segment: g = gelu_grad(p, d) when p, else d (then g == d, not written); h = g rounded
 * to bf16 (is_f16 0) or f16 when h; acc = g (first) or acc += g when acc. */
#define DEFINE_DC_ROW(suffix, attr)                                                                     \
    attr static void dc_row_##suffix(const float *restrict d, const float *restrict p, float *restrict g,    \
                                     uint16_t *restrict h, int is_f16, float *restrict acc, int first,       \
                                     int64_t n) {                                                            \
        const float *src = d;                                                                                \
        if (p) {                                                                                             \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) g[i] = mr_gelu_grad_f32(p[i], d[i]);         \
            src = g;                                                                                         \
        }                                                                                                    \
        if (h && !is_f16) {                                                                                  \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) h[i] = mr_f32_to_bf16(src[i]);               \
        } else if (h) {                                                                                      \
            for (int64_t i = 0; i < n; i++) h[i] = mr_f32_to_f16(src[i]);                                    \
        }                                                                                                    \
        if (acc && first) {                                                                                  \
            memcpy(acc, src, (size_t)n * sizeof(float));                                                     \
        } else if (acc) {                                                                                    \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) acc[i] += src[i];                            \
        }                                                                                                    \
    }

DEFINE_DC_ROW(def, )
DEFINE_DC_ROW(avx512, __attribute__((target("avx512f,avx512bw"))))

typedef void (*dc_row_fn)(const float *restrict, const float *restrict, float *restrict, uint16_t *restrict, int,
                          float *restrict, int, int64_t);

mr_status mr_gemm_dc_cpu(const mr_op_args *a) {
    if (a->in[0].dtype == MR_F64) return mr_gemm_dc_ref(a);
    const float *dy = a->in[0].data, *pre = a->in[1].data;
    float *db = a->out[1].data;
    const mr_dtype dct = a->out[0].dtype;
    float *dc32 = a->out[0].data && dct == MR_F32 ? a->out[0].data : NULL;
    uint16_t *dc16 = a->out[0].data && dct != MR_F32 ? a->out[0].data : NULL;
    const mr_shape *s = &a->in[0].shape;
    const int64_t n = s->dim[s->ndim - 1], rows = n > 0 ? mr_shape_numel(s) / n : 0;
    if (rows == 0 || n == 0) {
        if (db) memset(db, 0, (size_t)n * sizeof(float));
        return MR_OK;
    }
    float *part = db ? a->workspace : NULL;
    if (db && (!part || a->workspace_bytes < mr_gemm_dc_workspace(a)))
        return mr_op_error(a, "needs a workspace of %zu bytes", mr_gemm_dc_workspace(a));
    const mr_cpu_caps *caps = mr_cpu_caps_get();
    const dc_row_fn row = caps->avx512f && caps->avx512bw ? dc_row_avx512 : dc_row_def;
    const int64_t blocks = (rows + MR_GEMM_DC_ROWS - 1) / MR_GEMM_DC_ROWS;
    const int is_f16 = dct == MR_F16;
#pragma omp parallel for schedule(static) if (rows * n > DC_PAR_MIN)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * MR_GEMM_DC_ROWS, r1 = r0 + MR_GEMM_DC_ROWS < rows ? r0 + MR_GEMM_DC_ROWS : rows;
        float gbuf[DC_SEG];
        for (int64_t c0 = 0; c0 < n; c0 += DC_SEG) {
            const int64_t cn = n - c0 < DC_SEG ? n - c0 : DC_SEG;
            for (int64_t r = r0; r < r1; r++) {
                const int64_t o = r * n + c0;
                /* an f32 dc is g itself: written in place, or copied when there is no GELU */
                float *g = dc32 ? dc32 + o : gbuf;
                row(dy + o, pre ? pre + o : NULL, g, dc16 ? dc16 + o : NULL, is_f16, part ? part + b * n + c0 : NULL,
                    r == r0, cn);
                if (dc32 && !pre) memcpy(g, dy + o, (size_t)cn * sizeof(float));
            }
        }
    }
    if (db) {
#pragma omp parallel for schedule(static) if (blocks * n > DC_PAR_MIN)
        for (int64_t j = 0; j < n; j++) {
            float t = part[j];
            for (int64_t b = 1; b < blocks; b++) t += part[b * n + j];
            db[j] = t;
        }
    }
    return MR_OK;
}
