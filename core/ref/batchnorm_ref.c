/* Batch norm over every dim but dim 1 (core/ops.h MR_OP_BATCHNORM, MR_OP_BATCHNORM_BWD):
 * argument checks and the scalar f64 reference (the oracle for every backend).
 *
 * x is (N, C, S...) and is walked as (N, C, S) with S the product of the dims after the channel
 * dim, so channel c's M = N*S elements are the rows x[n, c, 0..S). Forward: per channel the mean
 * and then the biased variance as mean((x - mean)^2) (two passes: E[x^2] - E[x]^2 cancels when
 * |mean| >> std), rstd = 1/sqrt(var + eps), y = (x - mean) * gamma * rstd + beta. Backward
 * (PyTorch's formulas): dgamma = sum(dy * xhat), dbeta = sum(dy); in training, where mean and var
 * depend on x, dx = gamma*rstd * (dy - sum(dy)/M - xhat * sum(dy*xhat)/M); in evaluation, where
 * they are constants, dx = dy * gamma * rstd. */
#include "core/ops_impl.h"
#include "core/math/batchnorm_math.h"

#include <math.h>

/* N, C, S of x (N, C, S...): x is walked as (N, C, S). */
static void bn_dims(const mr_view *x, int64_t *n, int64_t *c, int64_t *s) {
    *n = x->shape.dim[0];
    *c = x->shape.dim[1];
    *s = 1;
    for (int i = 2; i < x->shape.ndim; i++) *s *= x->shape.dim[i];
}

/* x has rank >= 2 and C >= 1; sets the (C) shape of the per-channel vectors. */
static mr_status bn_check_x(const mr_op_args *a, const mr_view *x, mr_shape *sc) {
    char b[128];
    if (x->shape.ndim < 2 || x->shape.dim[1] < 1)
        return mr_op_error(a, "x %s must be (N, C, ...) with rank >= 2 and C >= 1",
                           mr_shape_str(&x->shape, b, sizeof b));
    *sc = mr_shape_1d(x->shape.dim[1]);
    return MR_OK;
}

static mr_status bn_check_params(const mr_op_args *a) {
    double eps = a->p.batchnorm.eps;
    if (!(eps >= 0.0) || !isfinite(eps)) return mr_op_error(a, "eps %g must be finite and >= 0", eps);
    if (a->p.batchnorm.training != 0 && a->p.batchnorm.training != 1)
        return mr_op_error(a, "training flag %d must be 0 or 1", a->p.batchnorm.training);
    return MR_OK;
}

/* Checks view v against shape s when it is present. */
static mr_status opt_shape(const mr_op_args *a, const mr_view *v, const char *role, const mr_shape *s) {
    return v->data ? mr_op_check_shape(a, v, role, s) : MR_OK;
}

mr_status mr_batchnorm_fwd_check(const mr_op_args *a) {
    mr_status st;
    if ((st = bn_check_params(a)) != MR_OK) return st;
    const int training = a->p.batchnorm.training;
    if (!a->in[0].data || !a->out[0].data) return mr_op_error(a, "x (in[0]) and y (out[0]) are required");
    if (training && (!a->out[1].data || !a->out[2].data))
        return mr_op_error(a, "training needs the mean and var outputs (out[1], out[2])");
    if (!training && (!a->in[3].data || !a->in[4].data))
        return mr_op_error(a, "evaluation needs running_mean and running_var (in[3], in[4])");
    mr_dtype dt;
    if ((st = mr_op_check_float(a, 0, &dt)) != MR_OK || (st = mr_op_check_all_float(a, dt)) != MR_OK) return st;
    mr_shape sc;
    if ((st = bn_check_x(a, &a->in[0], &sc)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->in[1], "in[1] (gamma)", &sc)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->in[2], "in[2] (beta)", &sc)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->in[3], "in[3] (running_mean)", &sc)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->in[4], "in[4] (running_var)", &sc)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->out[0], "out[0] (y)", &a->in[0].shape)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->out[1], "out[1] (mean)", &sc)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->out[2], "out[2] (var)", &sc)) != MR_OK) return st;
    int64_t n, c, s;
    bn_dims(&a->in[0], &n, &c, &s);
    if (training && n * s < 1)
        return mr_op_error(a, "training needs at least one value per channel (x has %lld)", (long long)(n * s));
    return MR_OK;
}

mr_status mr_batchnorm_bwd_check(const mr_op_args *a) {
    mr_status st;
    if ((st = bn_check_params(a)) != MR_OK) return st;
    if (!a->in[0].data || !a->in[1].data || !a->in[3].data || !a->in[4].data)
        return mr_op_error(a, "dy, x, mean and var (in[0], in[1], in[3], in[4]) are required");
    mr_dtype dt;
    if ((st = mr_op_check_float(a, 0, &dt)) != MR_OK || (st = mr_op_check_all_float(a, dt)) != MR_OK) return st;
    mr_shape sc;
    if ((st = bn_check_x(a, &a->in[1], &sc)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->in[0], "in[0] (dy)", &a->in[1].shape)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->in[2], "in[2] (gamma)", &sc)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->in[3], "in[3] (mean)", &sc)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->in[4], "in[4] (var)", &sc)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->out[0], "out[0] (dx)", &a->in[1].shape)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->out[1], "out[1] (dgamma)", &sc)) != MR_OK) return st;
    if ((st = opt_shape(a, &a->out[2], "out[2] (dbeta)", &sc)) != MR_OK) return st;
    return MR_OK;
}

mr_status mr_batchnorm_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    int64_t N, C, S;
    bn_dims(&a->in[0], &N, &C, &S);
    /* x, y (N,C,S); gamma, beta, running_mean, running_var, mean, var (C) */
    const double *x = a->in[0].data, *gamma = a->in[1].data, *beta = a->in[2].data;
    const double *rmean = a->in[3].data, *rvar = a->in[4].data;
    double *y = a->out[0].data, *mean = a->out[1].data, *var = a->out[2].data;
    const double eps = a->p.batchnorm.eps, M = (double)(N * S);
    for (int64_t c = 0; c < C; c++) {
        double m, v;
        if (a->p.batchnorm.training) {
            m = 0.0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t s = 0; s < S; s++) m += x[(n * C + c) * S + s];
            m /= M;
            v = 0.0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t s = 0; s < S; s++) {
                    double d = x[(n * C + c) * S + s] - m;
                    v += d * d;
                }
            v /= M;
        } else {
            m = rmean[c];
            v = rvar[c];
        }
        if (mean) mean[c] = m;
        if (var) var[c] = v;
        const double k = (gamma ? gamma[c] : 1.0) / sqrt(v + eps), b = beta ? beta[c] : 0.0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                y[i] = mr_batchnorm_y_f64(x[i], m, 0.0, k, b);
            }
    }
    return MR_OK;
}

mr_status mr_batchnorm_bwd_ref(const mr_op_args *a) {
    if (a->in[1].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    int64_t N, C, S;
    bn_dims(&a->in[1], &N, &C, &S);
    /* dy, x, dx (N,C,S); gamma, mean, var, dgamma, dbeta (C) */
    const double *dy = a->in[0].data, *x = a->in[1].data, *gamma = a->in[2].data;
    const double *mean = a->in[3].data, *var = a->in[4].data;
    double *dx = a->out[0].data, *dgamma = a->out[1].data, *dbeta = a->out[2].data;
    const double eps = a->p.batchnorm.eps, M = (double)(N * S);
    for (int64_t c = 0; c < C; c++) {
        const double m = mean[c], r = 1.0 / sqrt(var[c] + eps), k = (gamma ? gamma[c] : 1.0) * r;
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                sdy += dy[i];
                sdyx += dy[i] * mr_batchnorm_xhat_f64(x[i], m, 0.0, r);
            }
        if (dgamma) dgamma[c] = sdyx;
        if (dbeta) dbeta[c] = sdy;
        if (!dx) continue;
        const double ta = a->p.batchnorm.training && M > 0 ? sdy / M : 0.0;
        const double tb = a->p.batchnorm.training && M > 0 ? sdyx / M : 0.0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                dx[i] = mr_batchnorm_dx_f64(x[i], m, 0.0, r, k, dy[i], ta, tb);
            }
    }
    return MR_OK;
}
