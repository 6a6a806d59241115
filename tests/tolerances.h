/* Every tolerance the tests use, in one place (docs/STYLE.md rule 6). An override carries the error
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
/* mixed_bfloat16 (every GEMM but the tied head's on bf16-rounded operands, f32 elsewhere) against
 * torch f32, the GPT fixture (test_models_parity.c): logits and loss measured max abs 8.4e-3, max rel
 * 1.1e-1 (a logit near 0), NMSE 6.7e-6; gradients max abs 1.5e-3, NMSE 6.0e-5 (AMX build). */
#define TOL_PARITY_BF16_ATOL 3e-2
#define TOL_PARITY_BF16_RTOL 3e-2
#define TOL_PARITY_BF16_NMSE 3e-5
#define TOL_PARITY_BF16_GRAD_ATOL 5e-3
#define TOL_PARITY_BF16_GRAD_RTOL 3e-2
#define TOL_PARITY_BF16_GRAD_NMSE 3e-4

/* GPU (cuBLAS) GEMM in bf16/f16 with f32 accumulation against the f64 reference on the same
 * rounded inputs in [-1,1), K <= 256. NOT YET MEASURED ON A GPU: set from the output rounding
 * (bf16: 2^-9 relative, f16: 2^-12) plus cuBLAS's split-K reductions, which may round partial
 * sums to the output type. Re-measure on the first GPU run and tighten. On the CUDA emulator
 * (tests/emu/, 2026-12-01) the GEMM is the cuBLASLt fake's f64 product rounded once, so it
 * measures only mirror's side (layouts, transposes, epilogues, output rounding): all GEMM cases of
 * test_gpu_ops within these bounds, worst NMSE 7.3e-6 (bf16 out). It says nothing about cuBLAS. */
#define GPU_BF16_GEMM_ATOL 2e-2
#define GPU_BF16_GEMM_RTOL 1e-2
#define GPU_BF16_GEMM_NMSE 1e-5
#define GPU_F16_GEMM_ATOL 5e-3
#define GPU_F16_GEMM_RTOL 5e-3
#define GPU_F16_GEMM_NMSE 1e-6
/* GPU f32 GEMM with the GELU epilogue (cuBLASLt's GELU_* epilogues, tests/gpu/test_gpu_ops.c),
 * K <= 33, |pre| up to ~4. NOT YET MEASURED ON A GPU: cuBLASLt's GELU may evaluate tanh with the
 * hardware approximation (tanh.approx.f32, relative error ~2^-11), which moves gelu(x) by up to
 * ~0.5*|x|*2^-11 ~ 1e-3 absolute; the plain f32 GEMM bound would not hold. Re-measure. */
#define GPU_F32_GEMM_GELU_ATOL 2e-3
#define GPU_F32_GEMM_GELU_RTOL 1e-3
#define GPU_F32_GEMM_GELU_NMSE 1e-7
/* GPU f32 GEMM with allow_tf32 (CUBLAS_COMPUTE_32F_FAST_TF32), inputs in [-1,1), K <= 64.
 * NOT YET MEASURED ON A GPU: TF32 keeps 10 mantissa bits, so each product errs by up to ~2^-10
 * relative; K random-signed products of rms 1/3 give ~sqrt(K)/3 * 2^-10 ~ 2.6e-3 rms at K = 64,
 * plus the GELU term above. Re-measure and tighten. */
#define GPU_TF32_GEMM_ATOL 2e-2
#define GPU_TF32_GEMM_RTOL 1e-2
#define GPU_TF32_GEMM_NMSE 1e-5

/* GPU (cuDNN) convolution, all three passes, against the f64 reference on the same rounded inputs
 * in [-1,1) (tests/gpu/test_gpu_conv.c). NOT YET MEASURED ON A GPU: re-measure on the first GPU
 * run and tighten. The bound grows with the length K of the sum behind an output element
 * (forward C*KH*KW, data gradient O*KH*KW, filter and bias gradient N*OH*OW, up to 50176 in the
 * tests): |x - ref| <= ATOL + ATOL_PER_K * K + RTOL * |ref|. The terms have rms 1/3, so partial
 * sums reach ~sqrt(K)/3 and even a sequential sum errs by only ~0.14 * K * u rms (u = 2^-24 for
 * f32 with FMA math, no TF32; 2^-53 for f64); ATOL_PER_K (~17 u for f32, ~90 u for f64) leaves
 * room for Winograd and FFT algorithms, whose error scales with the sum of |terms| (~K/3). The
 * CUDA emulator's cuDNN fake sums in f64, so emu.test_gpu_conv measures only the layouts and the
 * plan/workspace logic of core/cuda/conv.cu (all passes within these bounds), not cuDNN. */
#define GPU_F32_CONV_ATOL 1e-5
#define GPU_F32_CONV_ATOL_PER_K 1e-6
#define GPU_F32_CONV_RTOL 1e-4
#define GPU_F32_CONV_NMSE 1e-9
#define GPU_F64_CONV_ATOL 1e-12
#define GPU_F64_CONV_ATOL_PER_K 1e-14
#define GPU_F64_CONV_RTOL 1e-10
#define GPU_F64_CONV_NMSE 1e-20

/* GPU reductions, binary backward, softmax, cross-entropy and layer norm
 * (tests/gpu/test_gpu_norm.c) against the f64 reference on the same rounded inputs, rows up to
 * 50257 and column sums over up to 70000 rows. NOT YET MEASURED ON A GPU: f32 set like
 * TOL_F32_REDUCE (f32 accumulation, error ~ sqrt(n) * 2^-24 relative to the sum of |terms|);
 * f64 from the same bound with 2^-53. Re-measure on the first GPU run and tighten. Measured on
 * the CUDA emulator (mirror's kernels as host C++, f32 accumulation in the kernels' own order;
 * TH_REPORT=1 ctest -L emu, 2026-12-01): reductions f32 max abs 1e-7, NMSE 4.3e-15; f64 max abs
 * 2.2e-16; max/max_bwd exact. The GPU's expf/logf differ from the host's by a few ulp, so a GPU
 * run may land slightly higher. */
#define GPU_F32_NORM_ATOL 1e-4
#define GPU_F32_NORM_RTOL 1e-3
#define GPU_F32_NORM_NMSE 1e-9
#define GPU_F64_NORM_ATOL 1e-10
#define GPU_F64_NORM_RTOL 1e-9
#define GPU_F64_NORM_NMSE 1e-20

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

/* Attention with bf16/f16 inputs (f32 compute, each output rounded once to the half type; CPU and
 * GPU) against the reference on the same rounded inputs: bf16's unit roundoff is 2^-8 = 3.9e-3
 * (f16 2^-11), so RTOL is twice bf16's; ATOL covers outputs that cancel to near 0. Measured on the
 * CPU (tests/unit/test_ops_attention.c prints it): bf16 max abs 3.9e-3, max rel 3.9e-3 where
 * |ref| > 1e-3; f16 max abs 4.7e-4, max rel 4.8e-4. */
#define TOL_HALF_ATTN_ATOL 1e-3
#define TOL_HALF_ATTN_RTOL 8e-3
#define TOL_HALF_ATTN_NMSE 1e-5

/* Attention through cuDNN's flash attention (tests/gpu/test_gpu_sdpa.c) against the same
 * reference: the graph rounds the probabilities P to the I/O type before the P V matmul (and dS
 * before dS^T Q, P before P^T dO in the backward), as cuDNN's fused kernels do, on top of the
 * output rounding above: two bf16 roundings (2^-8 each) where the kernels have one. Measured on
 * the emulator (the test prints it): bf16 max abs 6.9e-3 (where |ref| > 0.18: inside RTOL), f16 1.3e-3;
 * cuDNN against the kernels uses the same bounds. */
#define TOL_HALF_SDPA_ATOL 4e-3
#define TOL_HALF_SDPA_RTOL 1.6e-2
#define TOL_HALF_SDPA_NMSE 4e-5

#endif
