/* GEMM: argument check and the scalar reference (f64, the oracle for every backend), with the
 * optional bias and GELU epilogue (see MR_OP_GEMM in ops.h). */
#include "core/ops_impl.h"
#include "core/math/half_math.h"
#include "core/math/unary_math.h"

/* Resolves batch, m, n, k from the views; see MR_OP_GEMM in ops.h. */
static mr_status gemm_dims(const mr_op_args *a, int64_t *batch, int64_t *m, int64_t *n, int64_t *k, int *b_shared) {
    const mr_shape *sa = &a->in[0].shape, *sb = &a->in[1].shape, *sc = &a->out[0].shape;
    const mr_gemm_params *p = &a->p.gemm;
    char b1[96], b2[96], b3[96];
    if (sa->ndim < 2 || sb->ndim < 2 || sc->ndim < 2)
        return mr_op_error(a, "A %s, B %s and C %s must have at least 2 dims", mr_shape_str(sa, b1, 96),
                           mr_shape_str(sb, b2, 96), mr_shape_str(sc, b3, 96));
    int64_t ba = 1, bb = 1, bc = 1;
    for (int i = 0; i < sa->ndim - 2; i++) ba *= sa->dim[i];
    for (int i = 0; i < sb->ndim - 2; i++) bb *= sb->dim[i];
    for (int i = 0; i < sc->ndim - 2; i++) bc *= sc->dim[i];
    int64_t ar = sa->dim[sa->ndim - 2], ac = sa->dim[sa->ndim - 1];
    int64_t br = sb->dim[sb->ndim - 2], bcl = sb->dim[sb->ndim - 1];
    *m = p->trans_a ? ac : ar;
    *k = p->trans_a ? ar : ac;
    int64_t kb = p->trans_b ? bcl : br;
    *n = p->trans_b ? br : bcl;
    *b_shared = sb->ndim == 2 && ba > 1;
    if (kb != *k || (bb != ba && !*b_shared) || bc != ba || sc->dim[sc->ndim - 2] != *m || sc->dim[sc->ndim - 1] != *n)
        return mr_op_error(a, "shapes do not agree: A %s%s, B %s%s, C %s", mr_shape_str(sa, b1, 96),
                           p->trans_a ? "^T" : "", mr_shape_str(sb, b2, 96), p->trans_b ? "^T" : "",
                           mr_shape_str(sc, b3, 96));
    *batch = ba;
    return MR_OK;
}

/* The dtype rule, {A, B, C}: {f32,f32,f32}, {f64,f64,f64}, and for mixed precision bf16 or f16
 * inputs with f32 accumulation and an f32 C ({bf16,bf16,f32}, {f16,f16,f32}); a C of the input's
 * own half type ({bf16,bf16,bf16}, {f16,f16,f16}) is kept for the CUDA kernel, which stores it
 * (the CPU kernel rejects it). Written out here because mr_op_check_float rejects mixed dtypes. */
static int gemm_dtypes_ok(mr_dtype ta, mr_dtype tb, mr_dtype tc) {
    if (ta != tb) return 0;
    if (ta == MR_F32 || ta == MR_F64) return tc == ta;
    if (ta == MR_BF16 || ta == MR_F16) return tc == ta || tc == MR_F32;
    return 0;
}

/* The epilogue's views: the bias (N) and the pre-activation (C's shape) have C's dtype, so one
 * rule covers every backend (cuBLASLt's bias and GELU aux default to the output type) and mixed
 * precision (half A and B, f32 C) gets an f32 bias, which is how the f32 master bias is kept. */
mr_status mr_gemm_fwd_check(const mr_op_args *a) {
    int64_t batch, m, n, k;
    int shared;
    const mr_gemm_params *p = &a->p.gemm;
    if (a->n_in != 3 || a->n_out != 2)
        return mr_op_error(a, "takes 3 inputs (A, B, bias) and 2 outputs (C, pre), got %d and %d", a->n_in, a->n_out);
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "A, B and C are required");
    mr_dtype ta = a->in[0].dtype, tb = a->in[1].dtype, tc = a->out[0].dtype;
    if (!gemm_dtypes_ok(ta, tb, tc))
        return mr_op_error(a, "A is %s, B %s, C %s; expected {A,B,C} of {f32,f32,f32}, {f64,f64,f64}, "
                              "{bf16,bf16,f32} or {f16,f16,f32}",
                           mr_dtype_name(ta), mr_dtype_name(tb), mr_dtype_name(tc));
    mr_status st = gemm_dims(a, &batch, &m, &n, &k, &shared);
    if (st != MR_OK) return st;
    if (p->epilogue != MR_GEMM_EPI_NONE && p->epilogue != MR_GEMM_EPI_GELU)
        return mr_op_error(a, "epilogue %d is not MR_GEMM_EPI_NONE (0) or MR_GEMM_EPI_GELU (1)", p->epilogue);
    if (p->epilogue == MR_GEMM_EPI_GELU && p->beta != 0.0)
        return mr_op_error(a, "the GELU epilogue takes beta 0, got %g (gelu(alpha*AB + beta*C) would read the C it "
                              "overwrites; accumulate before the activation instead)",
                           p->beta);
    if (a->in[2].data) {
        mr_shape sn = mr_shape_1d(n);
        if (a->in[2].dtype != tc)
            return mr_op_error(a, "bias is %s; it must have C's dtype %s", mr_dtype_name(a->in[2].dtype),
                               mr_dtype_name(tc));
        if ((st = mr_op_check_shape(a, &a->in[2], "bias (in[2])", &sn)) != MR_OK) return st;
    }
    if (a->out[1].data) {
        if (p->epilogue != MR_GEMM_EPI_GELU)
            return mr_op_error(a, "pre (out[1]) is only written with the GELU epilogue; leave it out (data NULL)");
        if (a->out[1].dtype != tc)
            return mr_op_error(a, "pre (out[1]) is %s; it must have C's dtype %s", mr_dtype_name(a->out[1].dtype),
                               mr_dtype_name(tc));
        if ((st = mr_op_check_shape(a, &a->out[1], "pre (out[1])", &a->out[0].shape)) != MR_OK) return st;
    }
    return MR_OK;
}

/* Element i of a float view as a double: exact for every float type (bf16 and f16 widen exactly). */
static double ld(const mr_view *v, int64_t i) {
    switch (v->dtype) {
    case MR_F64: return ((const double *)v->data)[i];
    case MR_F32: return ((const float *)v->data)[i];
    case MR_BF16: return mr_bf16_to_f32(((const uint16_t *)v->data)[i]);
    case MR_F16: return mr_f16_to_f32(((const uint16_t *)v->data)[i]);
    default: return 0.0;
    }
}

/* The oracle: sums in f64. Inputs of any float type are read exactly (tests give it f64 copies of
 * the bf16-rounded values, or the bf16 values themselves); C in f64 is the usual use, an f32 C is
 * rounded once at the end (a half C via f32). */
/* Stores r as element i of a float view (an f32 view rounds once, a half view via f32). */
static void st_elem(const mr_view *v, int64_t i, double r) {
    switch (v->dtype) {
    case MR_F64: ((double *)v->data)[i] = r; break;
    case MR_F32: ((float *)v->data)[i] = (float)r; break;
    case MR_BF16: ((uint16_t *)v->data)[i] = mr_f32_to_bf16((float)r); break;
    case MR_F16: ((uint16_t *)v->data)[i] = mr_f32_to_f16((float)r); break;
    default: break;
    }
}

/* The epilogue on one exact f64 result s = alpha*op(A)op(B) + beta*C of column j, element ci:
 * adds the bias, stores the pre-activation when asked and returns the value C receives. */
static double epilogue(const mr_op_args *a, double s, int64_t j, int64_t ci) {
    if (a->in[2].data) s += ld(&a->in[2], j);
    if (a->p.gemm.epilogue != MR_GEMM_EPI_GELU) return s;
    if (a->out[1].data) st_elem(&a->out[1], ci, s);
    return mr_gelu_f64(s);
}

mr_status mr_gemm_fwd_ref(const mr_op_args *a) {
    int64_t batch, m, n, k;
    int shared;
    mr_status st = gemm_dims(a, &batch, &m, &n, &k, &shared);
    if (st != MR_OK) return st;
    const mr_view *va = &a->in[0], *vb = &a->in[1], *vc = &a->out[0];
    const mr_gemm_params *p = &a->p.gemm;
    int plain = !a->in[2].data && p->epilogue == MR_GEMM_EPI_NONE;
    if (va->dtype == MR_F64 && vb->dtype == MR_F64 && vc->dtype == MR_F64) {
        /* the common case (every f64 test and autodiff check), without per-element dispatch */
        const double *A = va->data, *B = vb->data;
        double *C = vc->data;
        for (int64_t bi = 0; bi < batch; bi++) {
            const double *Ab = A + bi * m * k, *Bb = B + (shared ? 0 : bi * k * n);
            double *Cb = C + bi * m * n;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double s = 0.0;
                    for (int64_t l = 0; l < k; l++)
                        s += (p->trans_a ? Ab[l * m + i] : Ab[i * k + l]) * (p->trans_b ? Bb[j * k + l] : Bb[l * n + j]);
                    double r = p->alpha * s + (p->beta != 0.0 ? p->beta * Cb[i * n + j] : 0.0);
                    Cb[i * n + j] = plain ? r : epilogue(a, r, j, bi * m * n + i * n + j);
                }
        }
        return MR_OK;
    }
    for (int64_t bi = 0; bi < batch; bi++) {
        int64_t ao = bi * m * k, bo = shared ? 0 : bi * k * n, co = bi * m * n;
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < n; j++) {
                double s = 0.0;
                for (int64_t l = 0; l < k; l++) {
                    double x = ld(va, ao + (p->trans_a ? l * m + i : i * k + l));
                    double y = ld(vb, bo + (p->trans_b ? j * k + l : l * n + j));
                    s += x * y;
                }
                /* beta == 0 ignores C entirely, so NaN garbage in C does not leak (BLAS rule) */
                int64_t ci = co + i * n + j;
                double r = p->alpha * s + (p->beta != 0.0 ? p->beta * ld(vc, ci) : 0.0);
                st_elem(vc, ci, plain ? r : epilogue(a, r, j, ci));
            }
        }
    }
    return MR_OK;
}
