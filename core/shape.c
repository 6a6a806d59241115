/* Shape arithmetic: numel, strides, broadcasting, printing. */
#include "core/shape.h"

#include <stdio.h>
#include <string.h>

mr_shape mr_shape_make(int n, const int64_t *dims) {
    MR_ASSERT(n >= 0 && n <= MR_MAX_DIMS);
    mr_shape s;
    memset(&s, 0, sizeof s);
    s.ndim = n;
    for (int i = 0; i < n; i++) s.dim[i] = dims[i];
    return s;
}

mr_shape mr_shape_1d(int64_t d0) { return mr_shape_make(1, (int64_t[]){d0}); }
mr_shape mr_shape_2d(int64_t d0, int64_t d1) { return mr_shape_make(2, (int64_t[]){d0, d1}); }
mr_shape mr_shape_3d(int64_t d0, int64_t d1, int64_t d2) { return mr_shape_make(3, (int64_t[]){d0, d1, d2}); }
mr_shape mr_shape_4d(int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return mr_shape_make(4, (int64_t[]){d0, d1, d2, d3});
}

int64_t mr_shape_numel(const mr_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->dim[i];
    return n;
}

int mr_shape_eq(const mr_shape *a, const mr_shape *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dim[i] != b->dim[i]) return 0;
    return 1;
}

char *mr_shape_str(const mr_shape *s, char *buf, int cap) {
    int n = snprintf(buf, (size_t)cap, "[");
    for (int i = 0; i < s->ndim && n < cap; i++)
        n += snprintf(buf + n, (size_t)(cap - n), i ? ", %lld" : "%lld", (long long)s->dim[i]);
    if (n < cap) snprintf(buf + n, (size_t)(cap - n), "]");
    return buf;
}

void mr_shape_strides(const mr_shape *s, int64_t strides[MR_MAX_DIMS]) {
    int64_t st = 1;
    for (int i = MR_MAX_DIMS - 1; i >= 0; i--) {
        if (i >= s->ndim) {
            strides[i] = 0;
            continue;
        }
        strides[i] = st;
        st *= s->dim[i];
    }
}

mr_status mr_shape_broadcast(const mr_shape *a, const mr_shape *b, mr_shape *out) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    mr_shape r;
    memset(&r, 0, sizeof r);
    r.ndim = n;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
        int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char s1[128], s2[128];
            return mr_set_error(MR_ERR_INVALID, "shapes %s and %s do not broadcast (dim %d: %lld vs %lld)",
                                mr_shape_str(a, s1, sizeof s1), mr_shape_str(b, s2, sizeof s2), i,
                                (long long)da, (long long)db);
        }
        r.dim[i] = da == 1 ? db : da;
    }
    *out = r;
    return MR_OK;
}

void mr_shape_rows_cols(const mr_shape *s, int64_t *rows, int64_t *cols) {
    if (s->ndim == 0) {
        *rows = 1;
        *cols = 1;
        return;
    }
    *cols = s->dim[s->ndim - 1];
    int64_t r = 1;
    for (int i = 0; i < s->ndim - 1; i++) r *= s->dim[i];
    *rows = r;
}
