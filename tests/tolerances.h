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
/* ... and the NMSE bound of those checks for the elementwise, reduce and softmax ops. */
#define TOL_GRAD_NMSE 1e-8

/* nn op gradient checks (layernorm, embedding, conv, pool, dropout, permute): NMSE of the
 * analytic f64 gradient against central differences (h = 1e-6). Measured <= 1.1e-18 for all but
 * layernorm with D = 2, 2.5e-12: there dx is ~0 (xhat = +-1 whatever x), so the NMSE is relative
 * to a tiny norm while the absolute error is 1.9e-9. */
#define TOL_NN_GRAD_NMSE 1e-8

/* Built-in models against PyTorch (tests/unit/test_models_parity.c, fixtures from
 * tests/gen_fixtures.py): logits, loss and every parameter gradient of the tiny MLP, CNN and GPT-2
 * on the same f32-representable parameters and inputs.
 * f64 against torch f64: measured max abs 1.1e-15, max rel 8.1e-14 (|ref| > 1e-3; GPT grads),
 * max NMSE per tensor 1.9e-30: the two differ only by summation order. */
#define TOL_PARITY_F64_ATOL 1e-12
#define TOL_PARITY_F64_RTOL 1e-10
#define TOL_PARITY_F64_NMSE 1e-24
/* f32 against torch f32 (both round, in different orders; worst of the plain and the sanitizer
 * build, whose CPU kernels differ). Logits and loss: measured max abs 7.2e-7, max rel 1.7e-5
 * (GPT logits), NMSE 4.1e-14. */
#define TOL_PARITY_F32_ATOL 5e-6
#define TOL_PARITY_F32_RTOL 1e-4
#define TOL_PARITY_F32_NMSE 1e-11
/* ... gradients: measured max abs 4.8e-7 (CNN), max rel 3.8e-5 (GPT), NMSE 2.5e-13 (GPT). */
#define TOL_PARITY_F32_GRAD_ATOL 5e-6
#define TOL_PARITY_F32_GRAD_RTOL 1e-4
#define TOL_PARITY_F32_GRAD_NMSE 1e-11

/* GPU (cuBLAS) GEMM in bf16/f16 with f32 accumulation against the f64 reference on the same
 * rounded inputs in [-1,1), K <= 256. NOT YET MEASURED ON A GPU: set from the output rounding
 * (bf16: 2^-9 relative, f16: 2^-12) plus cuBLAS's split-K reductions, which may round partial
 * sums to the output type. Re-measure on the first GPU run and tighten. */
#define GPU_BF16_GEMM_ATOL 2e-2
#define GPU_BF16_GEMM_RTOL 1e-2
#define GPU_BF16_GEMM_NMSE 1e-5
#define GPU_F16_GEMM_ATOL 5e-3
#define GPU_F16_GEMM_RTOL 5e-3
#define GPU_F16_GEMM_NMSE 1e-6

/* CPU GEMM with bf16 (or f16) inputs, f32 accumulation and an f32 C (tests/unit/test_gemm_bf16.c)
 * against the f64 reference on the same rounded inputs in [-1,1): the products are exact, so only
 * the f32 sums round. Bound: |x - ref| <= ATOL + ATOL_PER_K * K + RTOL * |ref| (ATOL_PER_K is the
 * f32 unit roundoff 2^-24). Measured over K = 0..4096, all transposes, batched, shared B, alpha/beta
 * (AVX512_BF16 machine): vdpbf16ps kernel max abs 1.9e-5 (K = 4096), max abs / K 3.3e-8, max rel
 * 4.2e-4 where |ref| > 1e-2 (cancellation; covered by the atol); the widen-to-f32 path (bf16 and
 * f16) max abs 2.6e-5, max abs / K 7.2e-8 (K = 1: the output rounding, inside ATOL). */
#define TOL_BF16_GEMM_ATOL 1e-6
#define TOL_BF16_GEMM_ATOL_PER_K 6e-8
#define TOL_BF16_GEMM_RTOL 1e-5
#define TOL_BF16_GEMM_NMSE 1e-10

#endif
