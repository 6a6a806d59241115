/* Helpers shared by the GPU tests (tests/gpu/test_*.c): tensors on cuda:0 owned by the current
 * test, uploads of f64 values rounded to a dtype, and one generic check that runs an op's CUDA
 * kernel against the f64 reference on the same rounded inputs. Only mirror's public API, so every
 * build compiles these; without a GPU each test's main returns 77 via gpu_skip_without_gpu. */
#ifndef MR_TEST_GPU_UTIL_H
#define MR_TEST_GPU_UTIL_H

#include "harness.h"

/* Non-zero (after printing "SKIPPED: why") when there is no usable GPU: main returns 77. */
int gpu_none(void);

/* Frees every GPU tensor the test made with gpu_upload/gpu_alloc, and th_free_all(). */
void gpu_free_all(void);

/* Rounds x (n) in place to what dt can hold. */
void gpu_round_to(double *x, int64_t n, mr_dtype dt);
/* A cuda:0 tensor of dtype dt and shape s holding h (f64, numel(s) values, converted to dt). */
mr_tensor *gpu_upload(const double *h, mr_dtype dt, mr_shape s);
/* A zeroed cuda:0 tensor of dtype dt and shape s. */
mr_tensor *gpu_alloc(mr_dtype dt, mr_shape s);
/* The tensor's values as f64 (a test-owned buffer). */
double *gpu_download(const mr_tensor *t);
/* An f64 host view over a test-owned copy of h. */
mr_view gpu_f64_view(const double *h, mr_shape s);
/* The dtype attention keeps lse in for inputs of dtype dt (f64 for f64, else f32). */
mr_dtype gpu_lse_dtype(mr_dtype dt);
/* The attention backward on the f64 reference (test-owned outputs, run): r is the forward's
 * reference args after mr_op_run_ref (q, k, v inputs; y, lse outputs), whose y and lse are first
 * rounded in place to what a GPU of dtype dt stores; dy has q's shape. */
mr_op_args gpu_attention_bwd_ref(mr_op_args *r, const double *dy, mr_dtype dt);
/* n uniform values in [lo, hi) rounded to dt (test-owned). */
double *gpu_rand(int64_t n, double lo, double hi, uint64_t seed, mr_dtype dt);

/* Runs a's op on cuda:0 with a device workspace of mr_op_workspace_bytes (the op table's size is
 * the largest any backend needs: f16 GEMM widens on the CPU) and asserts it succeeds. */
void gpu_run_op(mr_op_args *a);

/* Runs an op on the GPU and on the f64 reference and compares every output.
 * `r` holds reference args: params, F64 float inputs, I32 integer inputs (ids, labels), and
 * outputs whose views (data non-NULL) carry the values both runs start from (zeros from
 * th_view, or what an accumulating op adds to); an absent input or output (data NULL) stays
 * absent. Float inputs are rounded to `dt` in place first, so both runs see the same values;
 * float outputs are `out_dt` on the GPU (MR_F32 for mixed-precision ops with half inputs; pass
 * dt otherwise). The GPU kernel gets a device workspace of mr_op_workspace_bytes. It runs twice
 * and its outputs must be bit-identical (determinism). Asserts float outputs within
 * atol + rtol*|ref| and NMSE <= nmse, integer outputs equal. r's outputs end up holding the
 * reference results. */
void gpu_check_vs_ref(const char *what, mr_op_args *r, mr_dtype dt, mr_dtype out_dt, double atol, double rtol,
                      double nmse);

#endif
