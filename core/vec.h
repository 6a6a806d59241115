/* Vector kernels over one device's f32 buffers, and CUDA graph capture: the trainer's per-step
 * work outside the compiled graph (gradient accumulation, unscaling, clipping, the finite check
 * per parameter) and the replay of a fixed-shape step, for any backend.
 *
 * Buffers are memory of device d (host memory for the CPU). On the CPU every call is synchronous
 * and gives exactly the bits of the host loops in optim/optim.c (same operation order), so the
 * trainer's device path can be checked against its host path on a machine without a GPU. On CUDA
 * the calls are asynchronous on stream s (NULL: the device's default stream) except mr_vec_sumsq and
 * mr_vec_sumsq_seg, which return a host value and therefore wait for s.
 *
 * C11 and C++ clean; includes no CUDA header. Thread safety: calls on distinct buffers are
 * independent. Errors: MR_ERR_INVALID (n < 0, a NULL buffer with n > 0), MR_ERR_NOT_FOUND (the
 * backend is absent), MR_ERR_DEVICE (a CUDA failure). */
#ifndef MR_VEC_H
#define MR_VEC_H

#include <stdint.h>
#include "core/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Doubles of device scratch mr_vec_sumsq needs (the per-block partial sums). */
#define MR_VEC_SCRATCH 1024

/* y (n) = a*y + b*x (n); with a == 0, y = b*x and y is not read (so NaN garbage does not survive). */
mr_status mr_vec_axpby(mr_device d, mr_stream *s, float *y, float a, const float *x, float b, int64_t n) MR_WUR;
/* y (n) *= a. */
mr_status mr_vec_scale(mr_device d, mr_stream *s, float *y, float a, int64_t n) MR_WUR;
/* *out = sum of x[i]^2 (n) in double: inf or NaN when some x[i] is not finite (the squares of finite
 * floats cannot overflow a double), so one pass gives the clipping norm and the finite check. The
 * order is fixed (blocks of 8192 elements on the CPU, which mr_clip_grad_norm uses; a fixed grid on CUDA), so
 * the bits are the same on every run. d_scratch: MR_VEC_SCRATCH doubles of device memory (unused on
 * the CPU; may be NULL there). Waits for s. */
mr_status mr_vec_sumsq(mr_device d, mr_stream *s, const float *x, int64_t n, double *d_scratch, double *out) MR_WUR;
/* mr_vec_sumsq (the same *out, bit for bit) with a finite check per segment in the same pass: the
 * trainer's finite check, which then knows which parameters' gradients were not finite. x is cut
 * into nseg >= 1 segments: seg (nseg int64, d's memory) holds their first elements, ascending,
 * seg[0] = 0; element i is in the last segment k with seg[k] <= i (core/math/seg_math.h), so a
 * start repeated by the next segment's makes an empty segment. bad (nseg int32, d's memory): for
 * every segment that holds an inf or a NaN, bad[k] is set to 1; nothing else is written, so an
 * all-finite pass stores nothing and costs what mr_vec_sumsq costs (the segments are looked up
 * only when a block's or a thread's partial sum is not finite). The caller zeroes bad once and
 * again after it reads a non-finite result. The CPU checks seg[0] == 0; on CUDA seg is not read
 * on the host, so a bad layout is the caller's bug. Waits for s. */
mr_status mr_vec_sumsq_seg(mr_device d, mr_stream *s, const float *x, int64_t n, const int64_t *seg, int32_t nseg,
                           int32_t *bad, double *d_scratch, double *out) MR_WUR;

/* ---- the step's decisions on the device (core/math/ctl_math.h) ----
 * The trainer's step without host synchronisation (train/train_step.c): the loss, the finite
 * check, the loss scaler, the skip and the clip factor live in an mr_step_ctl in d's memory, and
 * the kernels that depend on them read them by pointer when they run. All asynchronous on s (the
 * CPU: synchronous, the same code and bits). */
/* The control block and the check's settings: core/math/ctl_math.h (not installed: the trainer's). */
typedef struct mr_step_ctl mr_step_ctl;
typedef struct mr_ctl_cfg mr_ctl_cfg;
/* *d_out (d's memory) = mr_vec_sumsq_seg's sum (seg, bad NULL and nseg 0: mr_vec_sumsq's), not read
 * back: the same bits, no wait. */
mr_status mr_vec_sumsq_to(mr_device d, mr_stream *s, const float *x, int64_t n, const int64_t *seg, int32_t nseg,
                          int32_t *bad, double *d_scratch, double *d_out) MR_WUR;
/* mr_ctl_loss with *loss (one float of d's memory: the step's loss output). */
mr_status mr_vec_ctl_loss(mr_device d, mr_stream *s, mr_step_ctl *ctl, const float *loss, int64_t m,
                          int64_t accumulate) MR_WUR;
/* mr_ctl_check with *k (host memory, copied at the call); bad and order: k->nparam int32 each in
 * d's memory (NULL when 0). */
mr_status mr_vec_ctl_check(mr_device d, mr_stream *s, mr_step_ctl *ctl, const mr_ctl_cfg *k, int32_t *bad,
                           const int32_t *order) MR_WUR;
/* mr_ctl_clip. */
mr_status mr_vec_ctl_clip(mr_device d, mr_stream *s, mr_step_ctl *ctl, double max_norm, int use_clip_sumsq) MR_WUR;
/* y (n) *= *a when *on (both d's memory, read when the kernel runs): mr_vec_scale's bits. */
mr_status mr_vec_scale_if(mr_device d, mr_stream *s, float *y, const float *a, const int32_t *on, int64_t n) MR_WUR;

/* ---- CUDA graphs ----
 * A captured sequence of asynchronous work on one stream, replayed with one launch (removes the
 * per-kernel launch cost of a step whose shapes and pointers never change). Only the CUDA backend
 * captures; the CPU returns MR_ERR_UNSUPPORTED from mr_capture_begin. Between begin and end every
 * call on s is recorded, not run, and nothing may synchronise (no copies to pageable host memory,
 * no stream_sync). Kernel arguments are frozen at capture: work whose arguments change per run
 * (dropout offsets) must not be captured. */
typedef struct mr_capture mr_capture;
mr_status mr_capture_begin(mr_device d, mr_stream *s) MR_WUR;
/* Ends the capture begun on s and instantiates it. On error the capture is ended and discarded. */
mr_status mr_capture_end(mr_device d, mr_stream *s, mr_capture **out) MR_WUR;
mr_status mr_capture_launch(mr_capture *c, mr_stream *s) MR_WUR;
void mr_capture_free(mr_capture *c); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif
#endif
