/* Layer norm over the last axis: argument checks and the scalar f64 reference (the oracle for
 * every backend). Forward: mean and rstd = 1/sqrt(var + eps) (biased variance) per row, saved for
 * the backward; y = (x - mean) * rstd * gamma + beta. Backward with xhat = (x - mean) * rstd and
 * g = dy * gamma: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), dgamma = sum_rows dy * xhat,
 * dbeta = sum_rows dy. */
#include "core/ops_impl.h"
#include "core/math/layernorm_math.h"

#include <math.h>

/* Rows and columns of x (..., D); mean and rstd must have x's leading dims. */
static mr_status ln_dims(const mr_op_args *a, const mr_view *x, int64_t *rows, int64_t *cols) {
    char b1[128];
    if (x->shape.ndim < 1 || x->shape.dim[x->shape.ndim - 1] < 1)
        return mr_op_error(a, "x %s must have at least 1 dim and a last dim >= 1",
                           mr_shape_str(&x->shape, b1, sizeof b1));
    mr_shape_rows_cols(&x->shape, rows, cols);
    return MR_OK;
}

/* The shape of mean and rstd: x's shape without its last dim. */
static mr_shape ln_row_shape(const mr_view *x) {
    mr_shape s = x->shape;
    s.ndim--;
    s.dim[s.ndim] = 0;
    return s;
}

mr_status mr_layernorm_fwd_check(const mr_op_args *a) {
    for (int i = 0; i < 3; i++)
        if (!a->in[i].data || !a->out[i].data)
            return mr_op_error(a, "x, gamma, beta and y, mean, rstd are all required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK || (st = mr_op_check_all_float(a, dt)) != MR_OK) return st;
    int64_t rows, cols;
    if ((st = ln_dims(a, &a->in[0], &rows, &cols)) != MR_OK) return st;
    mr_shape sd = mr_shape_1d(cols), sr = ln_row_shape(&a->in[0]);
    if ((st = mr_op_check_shape(a, &a->in[1], "in[1] (gamma)", &sd)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->in[2], "in[2] (beta)", &sd)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->out[0], "out[0] (y)", &a->in[0].shape)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->out[1], "out[1] (mean)", &sr)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->out[2], "out[2] (rstd)", &sr)) != MR_OK) return st;
    double eps = a->p.layernorm.eps;
    if (!(eps >= 0.0) || !isfinite(eps)) return mr_op_error(a, "eps %g must be finite and >= 0", eps);
    return MR_OK;
}

mr_status mr_layernorm_bwd_check(const mr_op_args *a) {
    for (int i = 0; i < 5; i++)
        if (!a->in[i].data) return mr_op_error(a, "x, gamma, mean, rstd and dy are required (in[%d] is NULL)", i);
    if (!a->out[0].data) return mr_op_error(a, "dx (out[0]) is required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK || (st = mr_op_check_all_float(a, dt)) != MR_OK) return st;
    int64_t rows, cols;
    if ((st = ln_dims(a, &a->in[0], &rows, &cols)) != MR_OK) return st;
    mr_shape sd = mr_shape_1d(cols), sr = ln_row_shape(&a->in[0]);
    if ((st = mr_op_check_shape(a, &a->in[1], "in[1] (gamma)", &sd)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->in[2], "in[2] (mean)", &sr)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->in[3], "in[3] (rstd)", &sr)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->in[4], "in[4] (dy)", &a->in[0].shape)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->out[0], "out[0] (dx)", &a->in[0].shape)) != MR_OK) return st;
    if (a->out[1].data && (st = mr_op_check_shape(a, &a->out[1], "out[1] (dgamma)", &sd)) != MR_OK) return st;
    if (a->out[2].data && (st = mr_op_check_shape(a, &a->out[2], "out[2] (dbeta)", &sd)) != MR_OK) return st;
    return MR_OK;
}

mr_status mr_layernorm_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    int64_t rows, cols;
    mr_status st = ln_dims(a, &a->in[0], &rows, &cols);
    if (st != MR_OK) return st;
    /* x, y (rows,cols); gamma, beta (cols); mean, rstd (rows) */
    const double *x = a->in[0].data, *gamma = a->in[1].data, *beta = a->in[2].data;
    double *y = a->out[0].data, *mean = a->out[1].data, *rstd = a->out[2].data;
    double eps = a->p.layernorm.eps;
    for (int64_t i = 0; i < rows; i++) {
        const double *xr = x + i * cols;
        double m = 0.0, v = 0.0;
        for (int64_t j = 0; j < cols; j++) m += xr[j];
        m /= (double)cols;
        for (int64_t j = 0; j < cols; j++) v += (xr[j] - m) * (xr[j] - m);
        v /= (double)cols;
        double r = 1.0 / sqrt(v + eps);
        for (int64_t j = 0; j < cols; j++) y[i * cols + j] = mr_layernorm_y_f64(xr[j], m, r, gamma[j], beta[j]);
        mean[i] = m;
        rstd[i] = r;
    }
    return MR_OK;
}

mr_status mr_layernorm_bwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    int64_t rows, cols;
    mr_status st = ln_dims(a, &a->in[0], &rows, &cols);
    if (st != MR_OK) return st;
    /* x, dy, dx (rows,cols); gamma, dgamma, dbeta (cols); mean, rstd (rows) */
    const double *x = a->in[0].data, *gamma = a->in[1].data, *mean = a->in[2].data, *rstd = a->in[3].data;
    const double *dy = a->in[4].data;
    double *dx = a->out[0].data, *dgamma = a->out[1].data, *dbeta = a->out[2].data;
    for (int64_t i = 0; i < rows; i++) {
        const double *xr = x + i * cols, *dyr = dy + i * cols;
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = 0; j < cols; j++) {
            double xhat = (xr[j] - mean[i]) * rstd[i];
            sg += dyr[j] * gamma[j];
            sgx += dyr[j] * gamma[j] * xhat;
        }
        sg /= (double)cols;
        sgx /= (double)cols;
        for (int64_t j = 0; j < cols; j++) {
            dx[i * cols + j] = mr_layernorm_dx_f64(xr[j], mean[i], rstd[i], dyr[j], gamma[j], sg, sgx);
        }
    }
    for (int64_t j = 0; j < cols; j++) {
        double g = 0.0, b = 0.0;
        for (int64_t i = 0; i < rows; i++) {
            g += dy[i * cols + j] * (x[i * cols + j] - mean[i]) * rstd[i];
            b += dy[i * cols + j];
        }
        if (dgamma) dgamma[j] = g;
        if (dbeta) dbeta[j] = b;
    }
    return MR_OK;
}
