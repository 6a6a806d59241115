/* Every tolerance the tests use, in one place (STYLE.md rule 6). An override carries the error
 * that was measured when it was set. Comparison: |x - ref| <= atol + rtol * |ref| per element,
 * and NMSE = sum (x-ref)^2 / sum ref^2 over the tensor. */
#ifndef MR_TOLERANCES_H
#define MR_TOLERANCES_H

/* f32 fast kernels against the f64 reference, elementwise math. */
#define TOL_F32_ATOL 1e-5
#define TOL_F32_RTOL 1e-4
#define TOL_F32_NMSE 1e-10
/* f32 kernels with long reductions (GEMM, conv, layernorm, softmax over wide rows): error grows
 * ~ sqrt(K) * eps; K <= 4096 in the tests gives <= ~4e-5 relative. */
#define TOL_F32_REDUCE_ATOL 1e-4
#define TOL_F32_REDUCE_RTOL 1e-3
#define TOL_F32_REDUCE_NMSE 1e-9
/* f64 central finite differences, step h, against the analytic f64 gradient. */
#define TOL_GRAD_H 1e-6
#define TOL_GRAD_ATOL 1e-6
#define TOL_GRAD_RTOL 1e-5

#endif
