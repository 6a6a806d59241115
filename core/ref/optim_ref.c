/* SGD_UPDATE and ADAMW_UPDATE: argument checks and the scalar references (f64).
 *
 * The per-element math (torch.optim.SGD / torch.optim.AdamW) lives once in
 * core/math/unary_math.h (mr_sgd_*, mr_adamw_*); the reference loops over it in double and
 * computes the bias corrections 1 - beta^t in double, as the CPU f32 path also does. The checks
 * reject the hyperparameters PyTorch rejects (negative lr, momentum, weight decay, eps; betas
 * outside [0,1); nesterov without momentum or with dampening) and non-finite ones. */
#include "core/ops_impl.h"

#include "core/math/unary_math.h"

#include <math.h>
#include <stdio.h>

/* Checks that the first n_req inputs are present, float, of one dtype and all of param's shape;
 * optional inputs past n_req are checked only when present. */
static mr_status check_state(const mr_op_args *a, int n_req, const char *const *names) {
    if (a->n_out != 0) return mr_op_error(a, "updates in place and takes no outputs, got %d", a->n_out);
    for (int i = 0; i < n_req; i++)
        if (!a->in[i].data) return mr_op_error(a, "%s (in[%d]) is required", names[i], i);
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK) return st;
    for (int i = 0; i < a->n_in; i++) {
        if (!a->in[i].data) continue;
        if (!mr_dtype_is_float(a->in[i].dtype))
            return mr_op_error(a, "%s (in[%d]) has dtype %s; expected f32 or f64", names[i], i,
                               mr_dtype_name(a->in[i].dtype));
        char role[64];
        snprintf(role, sizeof role, "%s (in[%d])", names[i], i);
        st = mr_op_check_shape(a, &a->in[i], role, &a->in[0].shape);
        if (st != MR_OK) return st;
    }
    return MR_OK;
}

static int finite_nonneg(double v) { return isfinite(v) && v >= 0.0; }

mr_status mr_sgd_update_check(const mr_op_args *a) {
    static const char *const names[] = {"param", "grad", "momentum_buf"};
    const mr_sgd_params *p = &a->p.sgd;
    if (a->n_in != 3) return mr_op_error(a, "takes 3 inputs (param, grad, momentum_buf), got %d", a->n_in);
    if (!finite_nonneg(p->lr)) return mr_op_error(a, "lr %g must be finite and >= 0", p->lr);
    if (!finite_nonneg(p->momentum)) return mr_op_error(a, "momentum %g must be finite and >= 0", p->momentum);
    if (!isfinite(p->dampening)) return mr_op_error(a, "dampening %g must be finite", p->dampening);
    if (!finite_nonneg(p->weight_decay))
        return mr_op_error(a, "weight_decay %g must be finite and >= 0", p->weight_decay);
    if (p->nesterov && (p->momentum <= 0.0 || p->dampening != 0.0))
        return mr_op_error(a, "nesterov needs momentum > 0 and dampening 0 (momentum %g, dampening %g)",
                           p->momentum, p->dampening);
    /* the momentum buffer is only read and written when momentum != 0 */
    return check_state(a, p->momentum != 0.0 ? 3 : 2, names);
}

mr_status mr_adamw_update_check(const mr_op_args *a) {
    static const char *const names[] = {"param", "grad", "exp_avg", "exp_avg_sq"};
    const mr_adamw_params *p = &a->p.adamw;
    if (a->n_in != 4) return mr_op_error(a, "takes 4 inputs (param, grad, exp_avg, exp_avg_sq), got %d", a->n_in);
    if (!finite_nonneg(p->lr)) return mr_op_error(a, "lr %g must be finite and >= 0", p->lr);
    if (!(p->beta1 >= 0.0 && p->beta1 < 1.0)) return mr_op_error(a, "beta1 %g must be in [0, 1)", p->beta1);
    if (!(p->beta2 >= 0.0 && p->beta2 < 1.0)) return mr_op_error(a, "beta2 %g must be in [0, 1)", p->beta2);
    if (!finite_nonneg(p->eps)) return mr_op_error(a, "eps %g must be finite and >= 0", p->eps);
    if (!finite_nonneg(p->weight_decay))
        return mr_op_error(a, "weight_decay %g must be finite and >= 0", p->weight_decay);
    if (p->step < 1) return mr_op_error(a, "step %lld must be >= 1 (it is 1-based)", (long long)p->step);
    return check_state(a, 4, names);
}

/* param (n), grad (n), momentum_buf (n, or absent when momentum == 0), all f64. */
mr_status mr_sgd_update_ref(const mr_op_args *a) {
    const mr_sgd_params *p = &a->p.sgd;
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    double *param = a->in[0].data, *buf = a->in[2].data;
    const double *grad = a->in[1].data;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    if (p->apply && !*p->apply) return MR_OK; /* by pointer: a skipped step */
    const int first = p->step ? *p->step == 1 : p->first_step;
    for (int64_t i = 0; i < n; i++) {
        double unused = 0.0;
        double *b = p->momentum != 0.0 ? &buf[i] : &unused;
        param[i] = mr_sgd_f64(param[i], grad[i], b, p->lr, p->momentum, p->dampening, p->weight_decay, p->nesterov,
                              first);
    }
    return MR_OK;
}

/* param (n), grad (n), exp_avg (n), exp_avg_sq (n), all f64. */
mr_status mr_adamw_update_ref(const mr_op_args *a) {
    const mr_adamw_params *p = &a->p.adamw;
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    double *param = a->in[0].data, *m = a->in[2].data, *v = a->in[3].data;
    const double *grad = a->in[1].data;
    int64_t n = mr_shape_numel(&a->in[0].shape);
    if (p->apply && !*p->apply) return MR_OK; /* by pointer: a skipped step */
    const mr_adamw_consts_f64 c =
        mr_adamw_prepare_f64(p->lr, p->beta1, p->beta2, p->eps, p->weight_decay, p->dstep ? *p->dstep : p->step);
    for (int64_t i = 0; i < n; i++) param[i] = mr_adamw_f64(param[i], grad[i], &m[i], &v[i], c);
    return MR_OK;
}
