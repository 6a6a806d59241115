/* mr_data_as_classes (data/sources.h): a source over another source that renames its components
 * to ("image", "label") and widens or narrows integer labels to i32, so every file format a
 * classifier reads yields the element spec of mr_data_from_idx. It is a source, not a map, so it
 * owns its context (the file name for messages) and frees it with the dataset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"
#include "data/sources.h"

typedef struct classes_impl {
    mr_dataset *in; /* retained source */
    mr_dtype label_dt;
    size_t label_bytes;
    char what[512];
} classes_impl;

static void classes_free(void *p) {
    classes_impl *k = p;
    if (!k) return;
    mr_data_free(k->in);
    free(k);
}

static mr_status classes_read(void *p, int64_t idx, void *const out[]) {
    const classes_impl *k = p;
    int64_t raw = 0;
    void *bufs[2] = {out[0], &raw}; /* the label (<= 8 bytes) lands in raw, the image in place */
    mr_status st = k->in->src_read(k->in->src_impl, idx, bufs);
    if (st) return st;
    int64_t v = raw;
    if (k->label_dt == MR_U8) {
        uint8_t u;
        memcpy(&u, &raw, 1);
        v = u;
    } else if (k->label_dt == MR_I32) {
        int32_t i;
        memcpy(&i, &raw, 4);
        v = i;
    }
    if (v < INT32_MIN || v > INT32_MAX)
        return mr_set_error(MR_ERR_FORMAT, "%s: element %lld: label %lld does not fit in int32", k->what, (long long)idx,
                            (long long)v);
    *(int32_t *)out[1] = (int32_t)v;
    return MR_OK;
}

mr_status mr_data_as_classes(mr_dataset *in, const char *what, mr_dataset **out) {
    mr_status st = MR_OK;
    classes_impl *k = NULL;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_data_as_classes: out is NULL");
    *out = NULL;
    MR_CHECK(in && what, MR_ERR_INVALID, "mr_data_as_classes: NULL argument");
    MR_CHECK(in->kind == DS_SOURCE, MR_ERR_UNSUPPORTED, "%s: mr_data_as_classes takes a source, not a pipeline", what);
    const mr_data_spec *s = &in->spec;
    MR_CHECK(s->n == 2, MR_ERR_FORMAT, "%s: %d components, a classifier reads 2 (image, label)", what, s->n);
    const mr_data_component *lb = &s->comp[1];
    MR_CHECK(lb->dtype == MR_U8 || lb->dtype == MR_I32 || lb->dtype == MR_I64, MR_ERR_UNSUPPORTED,
             "%s: labels of %s; class labels are integers; HINT: store the labels as an integer type", what,
             mr_dtype_name(lb->dtype));
    MR_CHECK(mr_shape_numel(&lb->shape) == 1, MR_ERR_FORMAT,
             "%s: labels of %lld values per element (one class index each is read); HINT: labels of shape (N,) or "
             "(N, 1)", what, (long long)mr_shape_numel(&lb->shape));
    if (lb->dtype == MR_I32 && lb->shape.ndim == 0 && !strcmp(s->comp[0].name, "image") && !strcmp(lb->name, "label")) {
        atomic_fetch_add(&in->refs, 1);
        *out = in;
        return MR_OK;
    }
    k = calloc(1, sizeof *k);
    MR_CHECK(k, MR_ERR_NOMEM, "%s: out of memory", what);
    k->label_dt = lb->dtype;
    snprintf(k->what, sizeof k->what, "%s", what);
    mr_data_spec o = {0};
    mr_shape scalar = mr_shape_make(0, NULL);
    MR_TRY(mr_data_spec_add(&o, "image", s->comp[0].dtype, &s->comp[0].shape));
    MR_TRY(mr_data_spec_add(&o, "label", MR_I32, &scalar));
    atomic_fetch_add(&in->refs, 1);
    k->in = in;
    st = ds_new_source(&o, in->src_n, classes_read, classes_free, k, "classes", out); /* frees k on error */
    if (st == MR_OK) (*out)->hash = ds_hash_bytes((*out)->hash, &in->hash, sizeof in->hash);
    return st;
fail:
    free(k);
    return st;
}
