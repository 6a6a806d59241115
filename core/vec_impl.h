/* Private: the CUDA side of core/vec.h (core/cuda/vec.cu), called by core/vec.c. */
#ifndef MR_VEC_IMPL_H
#define MR_VEC_IMPL_H

#include "core/vec.h"
#include "core/math/ctl_math.h"

#ifdef __cplusplus
extern "C" {
#endif

mr_status mr_cuda_vec_axpby(int device, mr_stream *s, float *y, float a, const float *x, float b, int64_t n);
mr_status mr_cuda_vec_scale(int device, mr_stream *s, float *y, float a, int64_t n);
/* seg, bad: mr_vec_sumsq_seg's (nseg >= 1), or NULL and 0 for mr_vec_sumsq */
mr_status mr_cuda_vec_sumsq(int device, mr_stream *s, const float *x, int64_t n, const int64_t *seg, int32_t nseg,
                            int32_t *bad, double *d_scratch, double *out);
/* d_out: the total in device memory, not read back (out unused, may be NULL) */
mr_status mr_cuda_vec_sumsq_to(int device, mr_stream *s, const float *x, int64_t n, const int64_t *seg, int32_t nseg,
                               int32_t *bad, double *d_scratch, double *d_out);
mr_status mr_cuda_vec_ctl_loss(int device, mr_stream *s, mr_step_ctl *ctl, const float *loss, int64_t m,
                               int64_t accumulate);
mr_status mr_cuda_vec_ctl_check(int device, mr_stream *s, mr_step_ctl *ctl, mr_ctl_cfg k, int32_t *bad,
                                const int32_t *order);
mr_status mr_cuda_vec_ctl_clip(int device, mr_stream *s, mr_step_ctl *ctl, double max_norm, int use_clip_sumsq);
mr_status mr_cuda_vec_scale_if(int device, mr_stream *s, float *y, const float *a, const int32_t *on, int64_t n);
mr_status mr_cuda_capture_begin(int device, mr_stream *s);
mr_status mr_cuda_capture_end(int device, mr_stream *s, mr_capture **out);
mr_status mr_cuda_capture_launch(mr_capture *c, mr_stream *s);
void mr_cuda_capture_free(mr_capture *c);

#ifdef __cplusplus
}
#endif
#endif
