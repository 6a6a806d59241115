/* Vector kernels and graph capture (see vec.h): the CPU loops, and dispatch to core/cuda/vec.cu. */
#include "core/vec.h"
#include "core/vec_impl.h"
#include "core/math/seg_math.h"
#include "core/math/ctl_math.h"

#include <math.h>


static mr_status check(const char *what, const void *y, int64_t n) {
    if (n < 0) return mr_set_error(MR_ERR_INVALID, "%s: %lld elements", what, (long long)n);
    if (n > 0 && !y) return mr_set_error(MR_ERR_INVALID, "%s: NULL buffer for %lld elements", what, (long long)n);
    return MR_OK;
}

#ifdef MIRROR_HAVE_CUDA
#define CUDA_OR(call) return (call)
#else
#define CUDA_OR(call) return mr_set_error(MR_ERR_NOT_FOUND, "vec: mirror was built without CUDA")
#endif

mr_status mr_vec_axpby(mr_device d, mr_stream *s, float *y, float a, const float *x, float b, int64_t n) {
    mr_status st = check("vec_axpby", y, n);
    if (st == MR_OK) st = check("vec_axpby", x, n);
    if (st != MR_OK) return st;
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_vec_axpby(d.index, s, y, a, x, b, n));
    /* the trainer's host loops: acc = w * g, then acc += w * g */
    if (a == 0.0f) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) y[i] = b * x[i];
    } else if (a == 1.0f) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) y[i] += b * x[i];
    } else {
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) y[i] = a * y[i] + b * x[i];
    }
    return MR_OK;
}

mr_status mr_vec_scale(mr_device d, mr_stream *s, float *y, float a, int64_t n) {
    mr_status st = check("vec_scale", y, n);
    if (st != MR_OK) return st;
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_vec_scale(d.index, s, y, a, n));
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) y[i] *= a;
    return MR_OK;
}

enum { BLOCK = 8192, GROUP = 512 };

/* The segments (seg, nseg) of x[lo, hi) that hold an inf or a NaN get bad[k] = 1: only for a block
 * whose sum is not finite, so one lookup, then a walk. */
static void mark_bad(const float *x, int64_t lo, int64_t hi, const int64_t *seg, int32_t nseg, int32_t *bad) {
    int32_t k = mr_seg_of(seg, nseg, lo);
    for (int64_t i = lo; i < hi; i++) {
        while (k + 1 < nseg && seg[k + 1] <= i) k++;
        if (!isfinite(x[i])) bad[k] = 1;
    }
}

/* mr_vec_sumsq on the CPU, and with seg the per-segment check of mr_vec_sumsq_seg. */
static void sumsq_cpu(const float *x, int64_t n, const int64_t *seg, int32_t nseg, int32_t *bad, double *out) {
    /* per-block sums in double, added in block order: the same bits for any thread count; blocks
     * go in groups so the partials fit on the stack (no allocation, no failure). A block's sum is
     * not finite exactly when one of its elements is not (squares of floats cannot overflow a
     * double), so only those blocks are walked for their segments, after the parallel loop (no
     * two threads write bad). */
    const int64_t nb = (n + BLOCK - 1) / BLOCK;
    double total = 0.0;
    for (int64_t g0 = 0; g0 < nb; g0 += GROUP) {
        double part[GROUP];
        const int64_t ng = nb - g0 < GROUP ? nb - g0 : GROUP;
#pragma omp parallel for schedule(static) if (ng > 4)
        for (int64_t b = 0; b < ng; b++) {
            double sum = 0.0;
            const int64_t lo = (g0 + b) * BLOCK, hi = lo + BLOCK < n ? lo + BLOCK : n;
            for (int64_t i = lo; i < hi; i++) sum += (double)x[i] * x[i];
            part[b] = sum;
        }
        for (int64_t b = 0; b < ng; b++) {
            total += part[b];
            if (seg && !isfinite(part[b])) {
                const int64_t lo = (g0 + b) * BLOCK, hi = lo + BLOCK < n ? lo + BLOCK : n;
                mark_bad(x, lo, hi, seg, nseg, bad);
            }
        }
    }
    *out = total;
}

mr_status mr_vec_sumsq(mr_device d, mr_stream *s, const float *x, int64_t n, double *d_scratch, double *out) {
    mr_status st = check("vec_sumsq", x, n);
    if (st != MR_OK) return st;
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_vec_sumsq(d.index, s, x, n, NULL, 0, NULL, d_scratch, out));
    sumsq_cpu(x, n, NULL, 0, NULL, out);
    return MR_OK;
}

mr_status mr_vec_sumsq_seg(mr_device d, mr_stream *s, const float *x, int64_t n, const int64_t *seg, int32_t nseg,
                           int32_t *bad, double *d_scratch, double *out) {
    mr_status st = check("vec_sumsq_seg", x, n);
    if (st != MR_OK) return st;
    if (nseg < 1 || !seg || !bad)
        return mr_set_error(MR_ERR_INVALID, "vec_sumsq_seg: %d segments (starts %p, flags %p)", (int)nseg,
                            (const void *)seg, (void *)bad);
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_vec_sumsq(d.index, s, x, n, seg, nseg, bad, d_scratch, out));
    if (seg[0] != 0)
        return mr_set_error(MR_ERR_INVALID, "vec_sumsq_seg: the first segment starts at %lld, not 0",
                            (long long)seg[0]);
    sumsq_cpu(x, n, seg, nseg, bad, out);
    return MR_OK;
}

mr_status mr_vec_sumsq_to(mr_device d, mr_stream *s, const float *x, int64_t n, const int64_t *seg, int32_t nseg,
                          int32_t *bad, double *d_scratch, double *d_out) {
    mr_status st = check("vec_sumsq_to", x, n);
    if (st != MR_OK) return st;
    if (!d_out) return mr_set_error(MR_ERR_INVALID, "vec_sumsq_to: no output");
    if (seg && (nseg < 1 || !bad))
        return mr_set_error(MR_ERR_INVALID, "vec_sumsq_to: %d segments (flags %p)", (int)nseg, (void *)bad);
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_vec_sumsq_to(d.index, s, x, n, seg, nseg, bad, d_scratch, d_out));
    if (seg && seg[0] != 0)
        return mr_set_error(MR_ERR_INVALID, "vec_sumsq_to: the first segment starts at %lld, not 0", (long long)seg[0]);
    sumsq_cpu(x, n, seg, seg ? nseg : 0, seg ? bad : NULL, d_out);
    return MR_OK;
}

mr_status mr_vec_ctl_loss(mr_device d, mr_stream *s, mr_step_ctl *ctl, const float *loss, int64_t m,
                          int64_t accumulate) {
    if (!ctl || !loss || m < 0 || m >= accumulate)
        return mr_set_error(MR_ERR_INVALID, "vec_ctl_loss: micro-batch %lld of %lld", (long long)m, (long long)accumulate);
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_vec_ctl_loss(d.index, s, ctl, loss, m, accumulate));
    mr_ctl_loss(ctl, *loss, m, accumulate);
    return MR_OK;
}

mr_status mr_vec_ctl_check(mr_device d, mr_stream *s, mr_step_ctl *ctl, const mr_ctl_cfg *k, int32_t *bad,
                           const int32_t *order) {
    if (!ctl || !k || k->nparam < 0 || (k->nparam > 0 && (!bad || !order)) || !(k->world >= 1))
        return mr_set_error(MR_ERR_INVALID, "vec_ctl_check: %d parameters (flags %p, order %p), %g replicas",
                            k ? (int)k->nparam : -1, (void *)bad, (const void *)order, k ? k->world : 0.0);
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_vec_ctl_check(d.index, s, ctl, *k, bad, order));
    mr_ctl_check(ctl, *k, bad, order);
    return MR_OK;
}

mr_status mr_vec_ctl_clip(mr_device d, mr_stream *s, mr_step_ctl *ctl, double max_norm, int use_clip_sumsq) {
    if (!ctl || !(max_norm > 0)) return mr_set_error(MR_ERR_INVALID, "vec_ctl_clip: max_norm %g", max_norm);
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_vec_ctl_clip(d.index, s, ctl, max_norm, use_clip_sumsq));
    mr_ctl_clip(ctl, max_norm, use_clip_sumsq);
    return MR_OK;
}

mr_status mr_vec_scale_if(mr_device d, mr_stream *s, float *y, const float *a, const int32_t *on, int64_t n) {
    mr_status st = check("vec_scale_if", y, n);
    if (st != MR_OK) return st;
    if (!a || !on) return mr_set_error(MR_ERR_INVALID, "vec_scale_if: NULL factor or flag");
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_vec_scale_if(d.index, s, y, a, on, n));
    if (!*on) return MR_OK;
    return mr_vec_scale(d, s, y, *a, n);
}

mr_status mr_capture_begin(mr_device d, mr_stream *s) {
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_capture_begin(d.index, s));
    return mr_set_error(MR_ERR_UNSUPPORTED, "capture: only the CUDA backend captures graphs");
}

mr_status mr_capture_end(mr_device d, mr_stream *s, mr_capture **out) {
    *out = NULL;
    if (d.kind == MR_DEVICE_CUDA) CUDA_OR(mr_cuda_capture_end(d.index, s, out));
    return mr_set_error(MR_ERR_UNSUPPORTED, "capture: only the CUDA backend captures graphs");
}

mr_status mr_capture_launch(mr_capture *c, mr_stream *s) {
    if (!c) return mr_set_error(MR_ERR_INVALID, "capture: launching a NULL graph");
#ifdef MIRROR_HAVE_CUDA
    return mr_cuda_capture_launch(c, s);
#else
    (void)s;
    return mr_set_error(MR_ERR_UNSUPPORTED, "capture: mirror was built without CUDA");
#endif
}

void mr_capture_free(mr_capture *c) {
#ifdef MIRROR_HAVE_CUDA
    mr_cuda_capture_free(c);
#else
    (void)c;
#endif
}
