/* Shared test helpers: deterministic random buffers, f32/f64 conversion, comparison with
 * atol/rtol and NMSE (printing index, value, reference, abs and rel error on failure), and
 * central finite differences for gradient checks. Include after cmocka's prerequisites. */
#ifndef MR_TEST_HARNESS_H
#define MR_TEST_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/ops.h"
#include "core/tensor.h"
#include "tolerances.h"

/* Asserts an mr_status is MR_OK, printing mr_last_error() otherwise. */
#define MR_ASSERT_OK(expr)                                                                       \
    do {                                                                                         \
        mr_status st_ = (expr);                                                                  \
        if (st_ != MR_OK) fail_msg("%s -> %s: %s", #expr, mr_status_name(st_), mr_last_error()); \
    } while (0)

/* Non-zero when exhaustive loops should sample instead (sanitizer builds, which run ~10x slower,
 * and MIRROR_TEST_QUICK=1, which tests/valgrind.sh sets): tests then check a documented subset. */
int th_quick(void);

/* For data-pipeline tests: d = the result of `call` (which writes its output to nd_), dropping
 * the caller's handle on the input d; asserts the call succeeded. */
#define TH_DATA_STEP(d, call)                                                                     \
    do {                                                                                         \
        mr_dataset *nd_ = NULL;                                                                  \
        MR_ASSERT_OK(call);                                                                      \
        mr_data_free(d);                                                                         \
        d = nd_;                                                                                 \
    } while (0)

/* A scratch directory for the test binary (mkdtemp under /tmp), as a cmocka group setup and
 * teardown (the teardown removes it with everything in it), and "<scratch>/<name>" paths in
 * rotating static buffers (each valid for the next 3 calls). */
int th_tmpdir_setup(void **state);
int th_tmpdir_teardown(void **state);
const char *th_tmp_path(const char *name);
const char *th_tmp_dir(void);

/* The whole file at path (malloc'd, one spare byte; its size in *n) / path written with b[0..n):
 * either fails the test on any I/O error. */
unsigned char *th_read_file(const char *path, size_t *n);
void th_write_file(const char *path, const void *b, size_t n);
/* Fails the test unless got == want and mr_last_error() contains n1 and n2 (each may be NULL). */
void th_expect_error(mr_status got, mr_status want, const char *n1, const char *n2);

/* ---- trainer tests ----------------------------------------------------------------------------- */

struct mr_train_cfg;
struct mr_train_result;
/* mr_train(c, r) with stderr captured: *log gets what it wrote (freed by th_free_all; also echoed
 * to the real stderr between "---- captured log ----" lines); mr_last_error() is mr_train's. */
mr_status th_train_logged(const struct mr_train_cfg *c, struct mr_train_result *r, char **log);
/* Non-zero when Debian's Fashion-MNIST (dataset-fashion-mnist) is installed. */
int th_have_fashion_mnist(void);
/* A small trainer config on Fashion-MNIST: MLP 784-hidden-10, AdamW lr 2e-3, `steps` steps of
 * batch `batch`, shuffle buffer 1000, log every 50, evaluation on the test set, quiet, no run
 * directory. Tests adjust what they need. (A function so the header needs no trainer include.) */
void th_fashion_mlp(struct mr_train_cfg *c, int64_t hidden, int64_t steps, int64_t batch);

/* "<scratch>/text.txt": a small generated text (400 numbered lines) for character-GPT tests that
 * need no dataset, written on first use (needs th_tmpdir_setup). */
const char *th_tiny_text(void);

/* Turns c (other settings kept) into a tiny character GPT on th_tiny_text(): 2 layers, 2 heads,
 * width embd, the given context and dropout, batch 8, the text for training and evaluation, no
 * sample (sample_chars 0). */
void th_tiny_gpt(struct mr_train_cfg *c, int64_t context, int64_t embd, double dropout);

/* Deterministic uniform values in [lo, hi) from Philox (seed, stream position). */
void th_fill_uniform_f64(double *x, int64_t n, double lo, double hi, uint64_t seed);
void th_fill_uniform_f32(float *x, int64_t n, float lo, float hi, uint64_t seed);
/* Integers in [lo, hi). */
void th_fill_int32(int32_t *x, int64_t n, int32_t lo, int32_t hi, uint64_t seed);

void th_f64_to_f32(const double *x, float *y, int64_t n);
void th_f32_to_f64(const float *x, double *y, int64_t n);

/* Test-owned buffers (freed with th_free_all at the end of a test; calloc'd, so zeroed). */
void *th_alloc(size_t bytes);
void th_free_all(void);
/* A view with fresh zeroed storage. */
mr_view th_view(mr_dtype dt, mr_shape s);

/* Compares x (f32 or f64, as dt) with the f64 reference; returns 1 when within
 * |x-ref| <= atol + rtol*|ref| everywhere and NMSE <= nmse_max, else prints up to 10 failing
 * elements (index, value, ref, abs err, rel err) and the NMSE, and returns 0. NaN in both at
 * the same index counts as equal (a mean of an empty tensor is NaN in both). n < 0 or a NULL
 * buffer with n > 0 returns 0; n = 0 (an empty tensor) returns 1: there is no element to differ.
 * A caller that must compare something checks that itself (th_check_cpu_vs_ref fails when the
 * op has no output at all). tests/unit/test_harness.c checks these rules. */
int th_compare(const char *what, const void *x, mr_dtype dt, const double *ref, int64_t n, double atol,
               double rtol, double nmse_max);

/* Central finite differences: for each of the n entries of x (perturbed in place and restored),
 * numeric[i] = (loss(x+h) - loss(x-h)) / 2h. loss is called with ctx. */
void th_numeric_grad(double *x, int64_t n, double h, double (*loss)(void *ctx), void *ctx, double *numeric);

/* ---- op checks shared by the op tests ------------------------------------------------------ */

/* A view (test-owned, see th_alloc) of dtype dt (MR_F32 or MR_F64) and shape s filled by
 * th_fill_uniform_f64/_f32 with values in [lo, hi). */
mr_view th_rand_view(mr_dtype dt, mr_shape s, double lo, double hi, uint64_t seed);

/* A shape of nd dims (0..4) from the first nd of d0..d3 (the rest ignored), for case tables. */
mr_shape th_shp(int nd, int64_t d0, int64_t d1, int64_t d2, int64_t d3);

/* Bytes of v's data (numel * dtype size). */
size_t th_view_bytes(const mr_view *v);

/* Gives args the workspace their op asks for (mr_op_workspace_bytes; test-owned, NULL when 0). */
void th_give_workspace(mr_op_args *a);

/* A copy of a with fresh zeroed test-owned outputs of the same dtypes and shapes in place of
 * every output that has data (to run the same inputs again and compare). */
mr_op_args th_fresh_outputs(const mr_op_args *a);

/* The f64 twin of f32 args: F32 inputs widened into fresh test-owned F64 views (so both see the
 * same rounded values), integer and F64 inputs shared; fresh outputs (F32 ones as F64, integer
 * ones of their dtype); no workspace. */
mr_op_args th_widen_args(const mr_op_args *a);

/* Largest f32-vs-reference errors seen by th_check_cpu_vs_ref since the test last reset them
 * (abs err over all elements; rel err over elements with |ref| > 1e-3), for the summaries the
 * tests print. Start at 0; the tests reset them. */
extern double th_max_abs_err, th_max_rel_err;

/* Runs an op three ways on the same values and compares every output:
 *   - the f64 reference (mr_op_run_ref),
 *   - the CPU in f32 on the inputs rounded to f32,
 *   - the CPU in f64.
 * `a` holds the inputs and outputs in one float precision:
 *   - F32 args: a's outputs receive the CPU f32 results; F32 inputs are widened for the f64 runs.
 *   - F64 args: a's outputs receive the reference results; F64 inputs are rounded to f32 IN PLACE
 *     first (so all three runs see the same values).
 * Integer inputs (ids, labels, argmax) are shared; absent outputs (data NULL) stay absent. The
 * f32 runs get the workspace their op asks for (with F32 args, a itself gets it).
 * Asserts: every f32 float output within |x-ref| <= atol + rtol*|ref| and NMSE <= nmse (see
 * th_compare; also tracked in th_max_abs_err/th_max_rel_err); every integer output of the f32
 * run equal to the reference's; every output of the CPU f64 run bit-identical to the reference.
 * Returns the reference args (f64 inputs, outputs filled; test-owned) for further checks. */
mr_op_args th_check_cpu_vs_ref(const char *what, mr_op_args *a, double atol, double rtol, double nmse);

/* Runs args on the CPU (fresh outputs each time, see th_fresh_outputs) with 1 and with 2 threads
 * and asserts bit-identical outputs; restores the thread count. a is not modified. */
void th_check_thread_invariant(const mr_op_args *a);

/* Gradient check of input k of the f64 forward args fwd: central differences (step TOL_GRAD_H,
 * each entry perturbed in place and restored, fwd rerun on the reference) of the loss
 * sum(fwd.out[0] * r) with respect to every entry of fwd.in[k], against `analytic` (as many
 * values as fwd.in[k]). Asserts |analytic-numeric| <= TOL_GRAD_ATOL + TOL_GRAD_RTOL*|numeric| and
 * NMSE <= nmse. fwd.out[0] is overwritten; r must not alias it. */
void th_check_grad(const char *what, mr_op_args *fwd, int k, const double *r, const double *analytic, double nmse);

/* Asserts the CPU rejects args with MR_ERR_INVALID and an error message naming opname (fails
 * with the caller's line). */
#define th_expect_invalid(a, opname) th_expect_invalid_at((a), (opname), __LINE__)
void th_expect_invalid_at(const mr_op_args *a, const char *opname, int line);
/* The same for ops with an f64 reference that takes these args: the CPU rejects them with
 * MR_ERR_INVALID and a message naming `name`, and the reference returns MR_ERR_INVALID too. */
void th_expect_invalid_cpu_ref(const mr_op_args *a, const char *name);

#endif
