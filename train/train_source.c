/* The trainer's data sources (train/train_source_impl.h): from the config's source kind and paths to one
 * random-access dataset that looks exactly like mr_data_from_idx's ("image" u8, "label" i32), so
 * make_pipeline (train/train.c) builds the same transforms on top and an HDF5, .npy or TFRecord
 * copy of IDX data trains to the same bits (tests/e2e/data_sources.sh). Sharded sets: every path
 * may be a glob or a list; each file is opened alone, checked and converted (mr_data_as_classes),
 * and the files are concatenated in order (mr_data_concat), which keeps the set random-access by
 * element index, so shuffle, shard and resume never see the file boundaries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/sources.h"
#include "train/train_source_impl.h"

/* Opens file k of the set (path, and lpath: the labels file of a two-file source, or NULL). */
static mr_status open_one(const mr_train_cfg *c, int train, const char *path, const char *lpath, mr_dataset **out) {
    const char *xds = train ? c->train_x_dataset : c->eval_x_dataset, *yds = train ? c->train_y_dataset : c->eval_y_dataset;
    switch (c->data_source) {
    case MR_TRAIN_SRC_IDX: return mr_data_from_idx(path, lpath, out);
    case MR_TRAIN_SRC_HDF5: {
        const char *names[2] = {xds, yds};
        return mr_data_from_hdf5(path, names, 2, out);
    }
    case MR_TRAIN_SRC_NPY: {
        const char *paths[2] = {path, lpath ? lpath : path};
        const char *members[2] = {xds, yds};
        const char *names[2] = {"image", "label"};
        return mr_data_from_npy(paths, lpath ? NULL : members, names, 2, out);
    }
    case MR_TRAIN_SRC_TFRECORD: {
        const int64_t *shape = train ? c->train_image_shape : c->eval_image_shape;
        mr_shape is = shape[0] ? mr_shape_make((int)shape[0], shape + 1) : mr_model_sample_shape(&c->model);
        mr_tfrecord_feature f[2] = {{xds, "image", MR_U8, is},
                                    {yds, "label", (train ? c->train_label_i32 : c->eval_label_i32) ? MR_I32 : MR_I64,
                                     {.ndim = -1}}};
        return mr_data_from_tfrecord(path, f, 2, out);
    }
    default:
        return mr_set_error(MR_ERR_UNSUPPORTED, "data: source kind %d is not read by the trainer", c->data_source);
    }
}

static int same_spec(const mr_data_spec *a, const mr_data_spec *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->comp[i].dtype != b->comp[i].dtype || !mr_shape_eq(&a->comp[i].shape, &b->comp[i].shape)) return 0;
    return 1;
}

/* Opens every file of the set (paths[k], lpaths[k] or NULL) with open_fn-like dispatch, checks the
 * specs agree (naming the first file that differs) and concatenates them. */
static mr_status open_set(const mr_train_cfg *c, int train, char **paths, char **lpaths, int n, int classes, int64_t window,
                          mr_dataset **out) {
    mr_status st = MR_OK;
    mr_dataset **parts = calloc((size_t)n, sizeof *parts);
    int got = 0;
    *out = NULL;
    MR_CHECK(parts, MR_ERR_NOMEM, "data: out of memory");
    for (; got < n; got++) {
        mr_dataset *raw = NULL;
        if (classes) {
            MR_TRY(open_one(c, train, paths[got], lpaths ? lpaths[got] : NULL, &raw));
            st = mr_data_as_classes(raw, paths[got], &parts[got]);
            mr_data_free(raw);
            if (st) goto fail;
        } else {
            MR_TRY(mr_data_from_tokens(paths[got], c->token_bytes, window, MR_DATA_TOKENS_RAW, &parts[got]));
        }
        const mr_data_spec *s0 = mr_data_element_spec(parts[0]), *sk = mr_data_element_spec(parts[got]);
        MR_CHECK(same_spec(s0, sk), MR_ERR_FORMAT,
                 "%s: its elements differ from %s's (dtype or shape of the %s); HINT: every file of a sharded set "
                 "holds elements of one shape and dtype", paths[got], paths[0],
                 s0->comp[0].dtype != sk->comp[0].dtype || !mr_shape_eq(&s0->comp[0].shape, &sk->comp[0].shape)
                     ? s0->comp[0].name : s0->comp[1].name);
    }
    st = mr_data_concat(parts, n, out);
fail:
    for (int k = 0; k < n && parts; k++) mr_data_free(parts[k]);
    free(parts);
    return st;
}

mr_status tr_open_source(const mr_train_cfg *c, int train, mr_dataset **out) {
    mr_status st = MR_OK;
    char **paths = NULL, **lpaths = NULL;
    int n = 0, nl = 0;
    *out = NULL;
    const char *images = train ? c->train_images : c->eval_images;
    const char *labels = train ? c->train_labels : c->eval_labels;
    /* two files per element (IDX, .npy) unless an archive with members names both */
    const int two = c->data_source == MR_TRAIN_SRC_IDX || (c->data_source == MR_TRAIN_SRC_NPY && !(train ? c->train_x_dataset : c->eval_x_dataset));
    MR_CHECK(images, MR_ERR_INVALID, "data.%s: no files", train ? "train" : "eval");
    MR_TRY(mr_data_expand_paths(images, &paths, &n));
    if (two && labels) {
        MR_TRY(mr_data_expand_paths(labels, &lpaths, &nl));
        MR_CHECK(nl == n, MR_ERR_FORMAT,
                 "data.%s.labels: %d files but data.%s.images has %d; HINT: one labels file per images file, in the "
                 "same (sorted) order", train ? "train" : "eval", nl, train ? "train" : "eval", n);
    }
    MR_TRY(open_set(c, train, paths, lpaths, n, 1, 0, out));
fail:
    mr_data_paths_free(paths, n);
    mr_data_paths_free(lpaths, nl);
    return st;
}

mr_status tr_open_tokens(const mr_train_cfg *c, int train, int64_t window, mr_dataset **out) {
    mr_status st = MR_OK;
    char **paths = NULL;
    int n = 0;
    *out = NULL;
    const char *tokens = train ? c->train_tokens : c->eval_tokens;
    MR_CHECK(tokens, MR_ERR_INVALID, "data.%s.path: no token file", train ? "train" : "eval");
    MR_TRY(mr_data_expand_paths(tokens, &paths, &n));
    MR_TRY(open_set(c, train, paths, NULL, n, 0, window, out));
fail:
    mr_data_paths_free(paths, n);
    return st;
}
