/* The 2x2 max pool fused into the CPU convolution (issue 19; plain convolutions in
 * core/cpu/conv_cpu.c, the geometry and helpers both share in core/cpu/conv_impl.h).
 *
 * CONV2D_MAXPOOL (core/ops.h): the forward of conv_cpu.c into a per-thread stage that stays in
 * cache, pooled 2x2/stride 2 from there (mr_cpu_maxpool22_plane, MAXPOOL2D's kernel): the full
 * conv output is never stored (on the CNN it is 12.8 MB per layer at batch 128, written once and
 * read back by MAXPOOL2D). Each conv element is computed as by CONV2D (its sum order is fixed by
 * K, not by batching or threads), so y and argmax equal CONV2D then MAXPOOL2D bit for bit. The
 * stage holds whole images: one (O, OHW) for the direct forward, a batch of them for im2col +
 * GEMM. Workspace: [widened w (direct, bf16)] then per thread [slot (GEMM path)] [stage].
 *
 * The backward: CONV2D_BWD_DATA and CONV2D_BWD_FILTER with p.conv.pool (conv_cpu.c) take the
 * pooled dy and the argmax and scatter each plane with mr_cpu_conv_pool_scatter (end of file)
 * where they copy dy anyway, so no full-size gradient of the conv output is stored either. */
#include "core/cpu/conv_impl.h"
#include "core/cpu/cpu_impl.h"
#include "core/math/half_math.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
#endif

static int64_t conv_pool_stage_floats(const mr_conv_dims *g) {
    return (mr_cpu_conv_fwd_direct(g) ? 1 : mr_cpu_conv_batch(g)) * g->o * g->ohw;
}

/* Floats before the per-thread parts, and of one thread's part. */
static void conv_pool_ws(const mr_conv_dims *g, int64_t *fixed, int64_t *per) {
    int direct = mr_cpu_conv_fwd_direct(g);
    *fixed = direct && g->bf16 ? g->o * g->ckk : 0;
    *per = (direct ? 0 : (int64_t)mr_cpu_conv_slot_floats(g)) + conv_pool_stage_floats(g);
}

size_t mr_conv2d_maxpool_fwd_workspace(const mr_op_args *a) {
    mr_conv_dims g;
    if (mr_op_is_f64(a) || !mr_cpu_conv_dims_get(a, &a->in[0], &a->in[1], &g)) return 0;
    int64_t fixed, per;
    conv_pool_ws(&g, &fixed, &per);
    return ((size_t)fixed + mr_cpu_conv_threads() * (size_t)per) * sizeof(float);
}

/* Pools the conv output of images [n0, n0 + nb), stage (nb, O, OH, OW), into y and argmax
 * (N, O, OH/2, OW/2). */
static void conv_pool_batch(const mr_conv_dims *g, const float *stage, int64_t n0, int64_t nb, float *y, int32_t *am,
                            int par) {
    int64_t ph = g->oh / 2, pw = g->ow / 2, planes = nb * g->o;
#pragma omp parallel for schedule(static) if (par && planes * g->ohw > CONV_PAR_MIN / 4)
    for (int64_t u = 0; u < planes; u++) {
        int64_t at = (n0 * g->o + u) * ph * pw;
        mr_cpu_maxpool22_plane(stage + u * g->ohw, y + at, am + at, g->ow, ph, pw, g->relu);
    }
}

mr_status mr_conv2d_maxpool_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_conv2d_maxpool_fwd_ref(a);
    if (!mr_cpu_conv_dtype_ok(a)) return mr_cpu_conv_f32_only(a, a->in[0].dtype);
    mr_conv_dims g;
    if (!mr_cpu_conv_dims_get(a, &a->in[0], &a->in[1], &g)) return mr_op_error(a, "invalid geometry");
    /* x (N,C,H,W); w (O,CKK); bias (O) or NULL; y, argmax (N,O,OH/2,OW/2) */
    const char *x = a->in[0].data;
    const void *w = a->in[1].data;
    const float *bias = a->in[2].data;
    float *y = a->out[0].data, *ws = a->workspace;
    int32_t *am = a->out[1].data;
    int64_t es = g.xes, chw = g.c * g.h * g.w, fixed, per;
    conv_pool_ws(&g, &fixed, &per);
    int64_t have = ws ? (int64_t)(a->workspace_bytes / sizeof(float)) : 0;
    int64_t slots = have >= fixed + per ? (have - fixed) / per : 0;
    if (slots > (int64_t)mr_cpu_conv_threads()) slots = (int64_t)mr_cpu_conv_threads();
    if (slots < 1) return mr_cpu_conv_no_workspace(a);
#ifdef CONV_AVX512
    if (mr_cpu_conv_fwd_direct(&g)) {
        const float *wf = w;
        if (g.bf16) {
            for (int64_t i = 0; i < g.o * g.ckk; i++) ws[i] = mr_bf16_to_f32(((const uint16_t *)w)[i]);
            wf = ws;
        }
        mr_conv_taps tp;
        mr_cpu_conv_taps_get(&g, &tp);
        float *stages = ws + fixed;
#pragma omp parallel for num_threads((int)slots) schedule(static) if (g.n * g.o * g.ckk * g.ohw > CONV_PAR_MIN)
        for (int64_t n = 0; n < g.n; n++) {
            float *stage = stages + (int64_t)omp_get_thread_num() * per;
            mr_cpu_conv_fwd_direct_rows(&g, &tp, x + n * chw * es, wf, bias, stage, 0, g.oh);
            conv_pool_batch(&g, stage, n, 1, y, am, 0);
        }
        return MR_OK;
    }
#endif
    int64_t slot = (int64_t)mr_cpu_conv_slot_floats(&g), bsz, batches;
    int nt;
    mr_cpu_conv_share(&g, (int)slots, &bsz, &batches, &nt);
    if (nt < 2) {
        for (int64_t n0 = 0; n0 < g.n; n0 += bsz) {
            int64_t nb = g.n - n0 < bsz ? g.n - n0 : bsz;
            if (mr_cpu_conv_fwd_batch(&g, x + n0 * chw * es, w, bias, ws + slot, nb, ws, ws + nb * g.ohw * g.ckk, 1))
                return mr_cpu_conv_gemm_failed(a);
            conv_pool_batch(&g, ws + slot, n0, nb, y, am, 1);
        }
        return MR_OK;
    }
    int failed = 0;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t bi = 0; bi < batches; bi++) {
        float *col = ws + (int64_t)omp_get_thread_num() * per, *stage = col + slot;
        int64_t n0 = bi * bsz, nb = g.n - n0 < bsz ? g.n - n0 : bsz;
        if (mr_cpu_conv_fwd_batch(&g, x + n0 * chw * es, w, bias, stage, nb, col, col + nb * g.ohw * g.ckk, 0)) {
#pragma omp atomic write
            failed = 1;
        } else {
            conv_pool_batch(&g, stage, n0, nb, y, am, 0);
        }
    }
    return failed ? mr_cpu_conv_gemm_failed(a) : MR_OK;
}

/* ---- The pooled dy of the backward ops with p.conv.pool, scattered plane by plane. */

/* d[0, ohw) (des bytes an element) := 0, then d[am[i]] := s[i] for the phw pooled elements with
 * am[i] >= 0 (ses bytes: copied, or f32 rounded to bf16): MAXPOOL2D_BWD's 2x2 plane (each position
 * in one window; dy's bits copied, as its AVX-512 path does). 0 when some am[i] is outside [-1, ohw). */
static int pool_scatter_any(void *restrict d, int64_t des, const void *restrict s, int64_t ses,
                            const int32_t *restrict am, int64_t phw, int64_t ohw) {
    memset(d, 0, (size_t)(ohw * des));
    int ok = 1;
    for (int64_t i = 0; i < phw; i++) {
        int32_t k = am[i];
        if (k < 0 || k >= ohw) {
            ok &= k == -1;
            continue;
        }
        if (des == ses)
            memcpy((char *)d + k * des, (const char *)s + i * ses, (size_t)des);
        else
            ((uint16_t *)d)[k] = mr_f32_to_bf16(((const float *)s)[i]);
    }
    return ok;
}

/* Stage of an f32 plane scattered before rounding to bf16 (floats). */
#define CONV_SCATTER_STAGE 4096

/* pool_scatter_any for one (image, channel) plane of g's conv output, with MAXPOOL2D_BWD's AVX-512
 * plane kernel where the plane is even-sized and dy f32 (scattered straight into an f32 d, or into
 * a stage then rounded to a bf16 d): the scalar scatter measured slower than the pass it saved. */
int mr_cpu_conv_pool_scatter(const mr_conv_dims *g, void *restrict d, int64_t des, const void *restrict s,
                             int64_t ses, const int32_t *restrict am) {
#ifdef CONV_AVX512
    if (ses == 4 && g->oh % 2 == 0 && g->ow % 2 == 0) {
        if (des == 4 && mr_cpu_maxpool22_bwd_plane(am, s, d, g->oh / 2, g->ow / 2)) return 1;
        float stage[CONV_SCATTER_STAGE];
        if (des == 2 && g->avx512 && g->ohw <= CONV_SCATTER_STAGE &&
            mr_cpu_maxpool22_bwd_plane(am, s, stage, g->oh / 2, g->ow / 2)) {
            mr_cpu_conv_row_round_avx512(d, stage, g->ohw);
            return 1;
        }
    }
#endif
    return pool_scatter_any(d, des, s, ses, am, g->dyhw, g->ohw);
}
