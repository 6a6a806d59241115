/* Inverted dropout (DROPOUT, and DROPOUT_BWD, which applies the same mask to dy): argument checks
 * and the scalar f64 reference. Element i is kept iff mr_dropout_keep(mr_philox_u32(seed, offset,
 * i), p) (core/math/dropout_math.h: its 24-bit uniform is >= p) and then scaled by 1/(1-p); so
 * the mask depends only on (seed, offset, i), never on threads or devices, and the backward needs
 * no saved mask. p == 1 drops everything (y = 0, no 1/0); p == 0 is the identity. */
#include "core/ops_impl.h"
#include "core/math/dropout_math.h"

mr_status mr_dropout_fwd_check(const mr_op_args *a) {
    if (!a->in[0].data || !a->out[0].data) return mr_op_error(a, "input and output are required");
    mr_dtype dt;
    mr_status st = mr_op_check_float(a, 0, &dt);
    if (st != MR_OK || (st = mr_op_check_all_float(a, dt)) != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->out[0], "out[0]", &a->in[0].shape)) != MR_OK) return st;
    double p = a->p.dropout.p;
    if (!(p >= 0.0 && p <= 1.0)) return mr_op_error(a, "p = %g must be in [0, 1]", p);
    return MR_OK;
}

mr_status mr_dropout_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    const mr_dropout_params *p = &a->p.dropout;
    const double *x = a->in[0].data; /* x or dy, any shape, flat (n) */
    double *y = a->out[0].data;      /* y or dx (n) */
    int64_t n = mr_shape_numel(&a->in[0].shape);
    double scale = p->p < 1.0 ? 1.0 / (1.0 - p->p) : 0.0;
    for (int64_t i = 0; i < n; i++) {
        int keep = mr_dropout_keep(mr_philox_u32(p->seed, p->offset, (uint64_t)i), p->p);
        y[i] = keep && p->p < 1.0 ? x[i] * scale : 0.0;
    }
    return MR_OK;
}
