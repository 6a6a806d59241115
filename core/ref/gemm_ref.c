/* GEMM: argument check and the scalar reference (f64, the oracle for every backend). */
#include "core/ops_impl.h"

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

mr_status mr_gemm_fwd_check(const mr_op_args *a) {
    int64_t batch, m, n, k;
    int shared;
    mr_dtype dt;
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "A, B and C are required");
    mr_status st = mr_op_check_float(a, 1, &dt);
    if (st != MR_OK) return st;
    return gemm_dims(a, &batch, &m, &n, &k, &shared);
}

mr_status mr_gemm_fwd_ref(const mr_op_args *a) {
    int64_t batch, m, n, k;
    int shared;
    mr_status st = gemm_dims(a, &batch, &m, &n, &k, &shared);
    if (st != MR_OK) return st;
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64");
    const double *A = a->in[0].data, *B = a->in[1].data;
    double *C = a->out[0].data;
    const mr_gemm_params *p = &a->p.gemm;
    for (int64_t bi = 0; bi < batch; bi++) {
        const double *Ab = A + bi * m * k, *Bb = B + (shared ? 0 : bi * k * n);
        double *Cb = C + bi * m * n;
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < n; j++) {
                double s = 0.0;
                for (int64_t l = 0; l < k; l++) {
                    double x = p->trans_a ? Ab[l * m + i] : Ab[i * k + l];
                    double y = p->trans_b ? Bb[j * k + l] : Bb[l * n + j];
                    s += x * y;
                }
                /* beta == 0 ignores C entirely, so NaN garbage in C does not leak (BLAS rule) */
                Cb[i * n + j] = p->alpha * s + (p->beta != 0.0 ? p->beta * Cb[i * n + j] : 0.0);
            }
        }
    }
    return MR_OK;
}
