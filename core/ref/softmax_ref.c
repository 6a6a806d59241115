/* Softmax, log-softmax (over the last axis) and fused softmax cross-entropy: argument checks and
 * the scalar f64 reference. All subtract the row maximum before exponentiating, so large logits
 * do not overflow. Labels are validated by the kernels (a check cannot assume it may read data
 * that lives on a device): a label outside [0, C) that is not ignore_index fails the op before
 * any output is written. */
#include "core/ops_impl.h"
#include "core/math/softmax_math.h"

#include <math.h>

/* ---- softmax, log-softmax --------------------------------------------------------------------- */

static int is_half(mr_dtype t) { return t == MR_BF16 || t == MR_F16; }

mr_status mr_softmax_fwd_check(const mr_op_args *a) {
    if (a->op != MR_OP_SOFTMAX && a->op != MR_OP_LOG_SOFTMAX) return mr_op_error(a, "not a softmax op");
    if (!a->in[0].data || !a->out[0].data) return mr_op_error(a, "x and y are required");
    mr_status st;
    if (is_half(a->out[0].dtype)) {
        /* a half y from an f32 x: the probabilities rounded as CAST rounds them (CPU only) */
        if (a->op != MR_OP_SOFTMAX || a->in[0].dtype != MR_F32)
            return mr_op_error(a, "a %s y (out[0]) needs softmax (not log-softmax) of an f32 x, got %s",
                               mr_dtype_name(a->out[0].dtype), mr_dtype_name(a->in[0].dtype));
    } else if ((st = mr_op_check_float(a, 0, NULL)) != MR_OK) {
        return st;
    }
    if (a->p.softmax.causal) {
        const mr_shape *s = &a->in[0].shape;
        char b[128];
        if (a->op != MR_OP_SOFTMAX) return mr_op_error(a, "causal masking is for softmax only");
        if (s->ndim < 2 || s->dim[s->ndim - 2] > s->dim[s->ndim - 1])
            return mr_op_error(a, "causal x %s must be (..., T, S) with T <= S", mr_shape_str(s, b, sizeof b));
    }
    return mr_op_check_shape(a, &a->out[0], "y (out[0])", &a->in[0].shape);
}

int64_t mr_softmax_causal_cols(const mr_op_args *a, int64_t row, int64_t cols) {
    if (!a->p.softmax.causal) return cols;
    const mr_shape *s = &a->in[0].shape;
    int64_t t = s->dim[s->ndim - 2];
    return row % t + 1 + (cols - t);
}

mr_status mr_softmax_bwd_check(const mr_op_args *a) {
    if (a->op != MR_OP_SOFTMAX_BWD && a->op != MR_OP_LOG_SOFTMAX_BWD) return mr_op_error(a, "not a softmax backward op");
    if (!a->in[0].data || !a->in[1].data || !a->out[0].data) return mr_op_error(a, "y, dy and dx are required");
    mr_status st;
    if (is_half(a->in[0].dtype) || is_half(a->out[0].dtype)) {
        /* a half y (the forward's half output) and/or a half dx (rounded as CAST), f32 dy (CPU only) */
        if (a->op != MR_OP_SOFTMAX_BWD || a->in[1].dtype != MR_F32 ||
            !(a->in[0].dtype == MR_F32 || is_half(a->in[0].dtype)) ||
            !(a->out[0].dtype == MR_F32 || is_half(a->out[0].dtype)))
            return mr_op_error(a, "half views need softmax_bwd with an f32 dy (in[1]) and y, dx f32 or half; got y %s, "
                                  "dy %s, dx %s",
                               mr_dtype_name(a->in[0].dtype), mr_dtype_name(a->in[1].dtype),
                               mr_dtype_name(a->out[0].dtype));
    } else if ((st = mr_op_check_float(a, 0, NULL)) != MR_OK) {
        return st;
    }
    if ((st = mr_op_check_shape(a, &a->in[1], "dy (in[1])", &a->in[0].shape)) != MR_OK) return st;
    return mr_op_check_shape(a, &a->out[0], "dx (out[0])", &a->in[0].shape);
}

/* x (rows, cols) -> y (rows, cols) */
mr_status mr_softmax_fwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[0].dtype));
    int64_t rows, cols;
    mr_shape_rows_cols(&a->in[0].shape, &rows, &cols);
    for (int64_t r = 0; r < rows && cols > 0; r++) {
        const double *x = (const double *)a->in[0].data + r * cols;
        double *y = (double *)a->out[0].data + r * cols;
        int64_t n = mr_softmax_causal_cols(a, r, cols); /* columns this row sees */
        double m = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
        for (int64_t j = 0; j < n; j++) s += exp(x[j] - m);
        double ls = log(s);
        for (int64_t j = 0; j < cols; j++)
            y[j] = j >= n ? 0.0 : (a->op == MR_OP_SOFTMAX ? exp(x[j] - m) / s : mr_log_softmax_f64(x[j], m, ls));
    }
    return MR_OK;
}

/* y, dy (rows, cols) -> dx (rows, cols) */
mr_status mr_softmax_bwd_ref(const mr_op_args *a) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[0].dtype));
    int64_t rows, cols;
    mr_shape_rows_cols(&a->in[0].shape, &rows, &cols);
    for (int64_t r = 0; r < rows; r++) {
        const double *y = (const double *)a->in[0].data + r * cols, *dy = (const double *)a->in[1].data + r * cols;
        double *dx = (double *)a->out[0].data + r * cols;
        double s = 0.0;
        if (a->op == MR_OP_SOFTMAX_BWD) {
            /* dx = y * (dy - <dy, y>) */
            for (int64_t j = 0; j < cols; j++) s += dy[j] * y[j];
            for (int64_t j = 0; j < cols; j++) dx[j] = mr_softmax_grad_f64(y[j], dy[j], s);
        } else {
            /* y = log p: dx = dy - p * sum(dy) */
            for (int64_t j = 0; j < cols; j++) s += dy[j];
            for (int64_t j = 0; j < cols; j++) dx[j] = mr_log_softmax_grad_f64(y[j], dy[j], s);
        }
    }
    return MR_OK;
}

/* ---- softmax cross-entropy ------------------------------------------------------------------- */

/* The checks both xent ops share: float operands; in[0] (named `what`: logits or probs) is (N,C)
 * with C >= 1; labels in[1] are i32 of shape (N), returned in *n. */
static mr_status xent_check_rows(const mr_op_args *a, const char *what, mr_shape *n) {
    const mr_view *m = &a->in[0], *lb = &a->in[1];
    char b1[128];
    mr_status st = mr_op_check_float(a, 0, NULL);
    if (st != MR_OK) return st;
    if (m->shape.ndim != 2) return mr_op_error(a, "%s %s must be (N,C)", what, mr_shape_str(&m->shape, b1, sizeof b1));
    if (m->shape.dim[1] < 1)
        return mr_op_error(a, "%s %s have no classes", what, mr_shape_str(&m->shape, b1, sizeof b1));
    if (lb->dtype != MR_I32) return mr_op_error(a, "labels have dtype %s; expected i32", mr_dtype_name(lb->dtype));
    *n = mr_shape_1d(m->shape.dim[0]);
    return mr_op_check_shape(a, lb, "labels (in[1])", n);
}

mr_status mr_xent_fwd_check(const mr_op_args *a) {
    const mr_view *lg = &a->in[0];
    if (!lg->data || !a->in[1].data || !a->out[0].data || !a->out[1].data)
        return mr_op_error(a, "logits, labels, loss and probs are required");
    mr_shape n;
    mr_status st = xent_check_rows(a, "logits", &n);
    if (st != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->out[0], "loss (out[0])", &n)) != MR_OK) return st;
    return mr_op_check_shape(a, &a->out[1], "probs (out[1])", &lg->shape);
}

mr_status mr_xent_bwd_check(const mr_op_args *a) {
    const mr_view *pr = &a->in[0];
    if (!pr->data || !a->in[1].data || !a->in[2].data || !a->out[0].data)
        return mr_op_error(a, "probs, labels, dloss and dlogits are required");
    mr_shape n;
    mr_status st = xent_check_rows(a, "probs", &n);
    if (st != MR_OK) return st;
    if ((st = mr_op_check_shape(a, &a->in[2], "dloss (in[2])", &n)) != MR_OK) return st;
    return mr_op_check_shape(a, &a->out[0], "dlogits (out[0])", &pr->shape);
}

/* Rejects a label outside [0, C) that is not ignore_index, before any output is written (the CPU
 * kernels use it too; see ops_impl.h). The CUDA kernels do not call it: the labels live on the
 * device, so there a bad label's row gets a NaN loss and a NaN gradient instead (the trainer's
 * finite check catches it; core/cuda/softmax.cu). */
mr_status mr_xent_check_labels(const mr_op_args *a, const int32_t *labels, int64_t n, int64_t c) {
    int64_t ign = a->p.xent.ignore_index;
    for (int64_t i = 0; i < n; i++)
        if (labels[i] != ign && (labels[i] < 0 || labels[i] >= c))
            return mr_op_error(a, "label %d in row %lld is outside [0, %lld) and is not ignore_index %lld",
                               (int)labels[i], (long long)i, (long long)c, (long long)ign);
    return MR_OK;
}

/* What both reference cross-entropy kernels start with: f64 input, rows N and classes C of in[0],
 * labels in in[1] validated. */
static mr_status xent_ref_rows(const mr_op_args *a, int64_t *n, int64_t *c, const int32_t **lab) {
    if (a->in[0].dtype != MR_F64) return mr_op_error(a, "the reference takes f64, got %s", mr_dtype_name(a->in[0].dtype));
    *n = a->in[0].shape.dim[0];
    *c = a->in[0].shape.dim[1];
    *lab = a->in[1].data;
    return mr_xent_check_labels(a, *lab, *n, *c);
}

/* logits (N,C), labels (N) i32 -> loss (N), probs (N,C) */
mr_status mr_xent_fwd_ref(const mr_op_args *a) {
    int64_t n = 0, c = 0;
    const int32_t *lab = NULL;
    mr_status st = xent_ref_rows(a, &n, &c, &lab);
    if (st != MR_OK) return st;
    for (int64_t i = 0; i < n; i++) {
        const double *x = (const double *)a->in[0].data + i * c;
        double *p = (double *)a->out[1].data + i * c;
        double m = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < c; j++) m = x[j] > m ? x[j] : m;
        for (int64_t j = 0; j < c; j++) s += exp(x[j] - m);
        for (int64_t j = 0; j < c; j++) p[j] = exp(x[j] - m) / s;
        double *loss = (double *)a->out[0].data + i;
        *loss = lab[i] == a->p.xent.ignore_index ? 0.0 : m + log(s) - x[lab[i]];
    }
    return MR_OK;
}

/* probs (N,C), labels (N) i32, dloss (N) -> dlogits (N,C) */
mr_status mr_xent_bwd_ref(const mr_op_args *a) {
    int64_t n = 0, c = 0;
    const int32_t *lab = NULL;
    mr_status st = xent_ref_rows(a, &n, &c, &lab);
    if (st != MR_OK) return st;
    for (int64_t i = 0; i < n; i++) {
        const double *p = (const double *)a->in[0].data + i * c;
        double *dx = (double *)a->out[0].data + i * c;
        double g = ((const double *)a->in[2].data)[i];
        int ignored = lab[i] == a->p.xent.ignore_index;
        for (int64_t j = 0; j < c; j++) dx[j] = ignored ? 0.0 : mr_xent_grad_f64(g, p[j], j == lab[i]);
    }
    return MR_OK;
}
