/* Layer norm, CPU fast path (f32; f64 runs the reference). Rows are independent, so the forward
 * and dx are parallel over rows. dgamma/dbeta reduce over rows: they are parallel over column
 * blocks instead, each column summed over rows in row order, so the result does not depend on the
 * thread count and no workspace is needed. */
#include "core/ops_impl.h"
#include "core/math/layernorm_math.h"

#include <math.h>

/* Below this many elements the loops run on one thread (team start-up would dominate). */
#define LN_PAR_MIN 32768
/* Columns per block of the dgamma/dbeta loop: a few cache lines, vectorised across the block. */
#define LN_COL_BLOCK 64

mr_status mr_layernorm_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_layernorm_fwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    int64_t rows, cols;
    mr_shape_rows_cols(&a->in[0].shape, &rows, &cols);
    /* x, y (rows,cols); gamma, beta (cols); mean, rstd (rows) */
    const float *restrict x = a->in[0].data, *restrict gamma = a->in[1].data, *restrict beta = a->in[2].data;
    float *restrict y = a->out[0].data, *restrict mean = a->out[1].data, *restrict rstd = a->out[2].data;
    float eps = (float)a->p.layernorm.eps;
    float inv_d = 1.0f / (float)cols;
#pragma omp parallel for schedule(static) if (rows * cols > LN_PAR_MIN)
    for (int64_t i = 0; i < rows; i++) {
        const float *restrict xr = x + i * cols;
        float *restrict yr = y + i * cols;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < cols; j++) s += xr[j];
        float m = s * inv_d;
        /* two passes: the one-pass E[x^2]-E[x]^2 loses everything when |mean| >> std */
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int64_t j = 0; j < cols; j++) v += (xr[j] - m) * (xr[j] - m);
        float r = 1.0f / sqrtf(v * inv_d + eps);
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) yr[j] = mr_layernorm_y_f32(xr[j], m, r, gamma[j], beta[j]);
        mean[i] = m;
        rstd[i] = r;
    }
    return MR_OK;
}

mr_status mr_layernorm_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_layernorm_bwd_ref(a);
    if (a->in[0].dtype != MR_F32)
        return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(a->in[0].dtype));
    int64_t rows, cols;
    mr_shape_rows_cols(&a->in[0].shape, &rows, &cols);
    /* x, dy, dx (rows,cols); gamma, dgamma, dbeta (cols); mean, rstd (rows) */
    const float *restrict x = a->in[0].data, *restrict gamma = a->in[1].data;
    const float *restrict mean = a->in[2].data, *restrict rstd = a->in[3].data, *restrict dy = a->in[4].data;
    float *restrict dx = a->out[0].data, *restrict dgamma = a->out[1].data, *restrict dbeta = a->out[2].data;
    float inv_d = 1.0f / (float)cols;
    int par = rows * cols > LN_PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < rows; i++) {
        const float *restrict xr = x + i * cols, *restrict dyr = dy + i * cols;
        float *restrict dxr = dx + i * cols;
        float m = mean[i], r = rstd[i], sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
        for (int64_t j = 0; j < cols; j++) {
            float g = dyr[j] * gamma[j];
            sg += g;
            sgx += g * (xr[j] - m) * r;
        }
        sg *= inv_d;
        sgx *= inv_d;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) dxr[j] = mr_layernorm_dx_f32(xr[j], m, r, dyr[j], gamma[j], sg, sgx);
    }
    if (!dgamma && !dbeta) return MR_OK;
    int64_t nblk = (cols + LN_COL_BLOCK - 1) / LN_COL_BLOCK;
#pragma omp parallel for schedule(static) if (par && nblk > 1)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t j0 = b * LN_COL_BLOCK, j1 = j0 + LN_COL_BLOCK < cols ? j0 + LN_COL_BLOCK : cols;
        float g[LN_COL_BLOCK] = {0}, s[LN_COL_BLOCK] = {0};
        for (int64_t i = 0; i < rows; i++) {
            const float *restrict xr = x + i * cols, *restrict dyr = dy + i * cols;
            float m = mean[i], r = rstd[i];
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) {
                g[j - j0] += dyr[j] * (xr[j] - m) * r;
                s[j - j0] += dyr[j];
            }
        }
        for (int64_t j = j0; j < j1; j++) {
            if (dgamma) dgamma[j] = g[j - j0];
            if (dbeta) dbeta[j] = s[j - j0];
        }
    }
    return MR_OK;
}
