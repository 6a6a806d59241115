/* The data section's file keys (launch/config.c's key table holds the keys; this file holds what
 * is particular to data files): a path may be a glob (data/train-*.h5) or a YAML list of paths
 * ([a.h5, b.h5]), a sharded set that the trainer reads as one dataset in a fixed order
 * (train/train_source.c). A list is kept in the key's string as '\n'-separated paths, and
 * config_out.c writes it back as a list, so the saved config and its hash round-trip. Also the
 * required keys of each source kind (mr_experiment_check). */
#include <glob.h>
#include <string.h>
#include <unistd.h>

#include "launch/config_impl.h"

const char *const MR_CFG_IMAGE_DTYPES[] = {"uint8", NULL};
const char *const MR_CFG_LABEL_DTYPES[] = {"int64", "int32", NULL};

void mr_cfg_data_default(mr_data_cfg *d) {
    strcpy(d->x_dataset, "x");
    strcpy(d->y_dataset, "y");
    strcpy(d->image_key, "image");
    strcpy(d->label_key, "label");
}

mr_status mr_cfg_set_shape(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n) {
    pos p = node_pos(w, n);
    mr_cfg_shape s;
    memset(&s, 0, sizeof s);
    if (n->type != YAML_SEQUENCE_NODE)
        return perr(MR_ERR_INVALID, p, "%s: expected a list of sizes ([28, 28, 1]) or [], got %s", f->path, node_kind(n));
    int c = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (c > MR_CFG_MAX_SHAPE) return perr(MR_ERR_INVALID, p, "%s: at most %d sizes, got %d", f->path, MR_CFG_MAX_SHAPE, c);
    for (int i = 0; i < c; i++) {
        yaml_node_t *it = yaml_document_get_node(w->doc, n->data.sequence.items.start[i]);
        int64_t v = 0;
        if (it->type != YAML_SCALAR_NODE || !mr_cfg_parse_i64(SCALAR(it), &v) || v < 1 || v > (1 << 24))
            return perr(MR_ERR_INVALID, node_pos(w, it), "%s[%d]: expected a size in 1..2^24", f->path, i);
        s.dim[s.n++] = v;
    }
    memcpy((char *)e + f->off, &s, sizeof s);
    return MR_OK;
}

mr_status mr_cfg_check_files(const field *f, const char *s, pos p) {
    char one[MR_CFG_PATH_MAX];
    for (const char *q = s; *q;) {
        const char *e = strchr(q, '\n');
        size_t len = e ? (size_t)(e - q) : strlen(q);
        if (len == 0 || len >= sizeof one) return perr(MR_ERR_INVALID, p, "%s: an empty path in the list", f->path);
        memcpy(one, q, len);
        one[len] = '\0';
        if (strpbrk(one, "*?[")) {
            glob_t g;
            int r = glob(one, 0, NULL, &g);
            globfree(&g);
            if (r != 0)
                return perr(MR_ERR_NOT_FOUND, p, "%s: no file matches '%s'; HINT: check the directory and the pattern "
                            "(*, ?, [...]); the files of a set are read in sorted order", f->path, one);
        } else if (access(one, F_OK) != 0) {
            return perr(MR_ERR_NOT_FOUND, p, "%s: no such file '%s'", f->path, one);
        }
        q = e ? e + 1 : q + len;
    }
    return MR_OK;
}

mr_status mr_cfg_set_file_list(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n) {
    pos p = node_pos(w, n);
    char buf[MR_CFG_PATH_MAX];
    size_t at = 0;
    int c = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (c < 1) return perr(MR_ERR_INVALID, p, "%s: an empty list; HINT: one path, a glob or a list of paths", f->path);
    for (int i = 0; i < c; i++) {
        yaml_node_t *it = yaml_document_get_node(w->doc, n->data.sequence.items.start[i]);
        if (it->type != YAML_SCALAR_NODE || !*SCALAR(it) || strchr(SCALAR(it), '\n'))
            return perr(MR_ERR_INVALID, node_pos(w, it), "%s[%d]: expected a path", f->path, i);
        size_t len = strlen(SCALAR(it));
        if (at + len + 1 >= sizeof buf)
            return perr(MR_ERR_INVALID, p, "%s: the list is longer than %zu characters; HINT: name the files with a "
                        "glob (data/train-*.h5)", f->path, sizeof buf - 1);
        if (i) buf[at++] = '\n';
        memcpy(buf + at, SCALAR(it), len);
        at += len;
    }
    buf[at] = '\0';
    return mr_cfg_set_scalar(e, f, buf, p);
}

mr_status mr_cfg_check_source(const mr_data_cfg *d, const char *nm, pos p) {
    switch (d->source) {
    case MR_SRC_IDX:
        if (!d->images[0]) return perr(MR_ERR_INVALID, p, "%s.images: missing required value for source idx", nm);
        if (!d->labels[0]) return perr(MR_ERR_INVALID, p, "%s.labels: missing required value for source idx", nm);
        return MR_OK;
    case MR_SRC_NPY: /* .npy files in images/labels, or a .npz in path with members x_dataset/y_dataset */
        if (d->path[0] && (d->images[0] || d->labels[0]))
            return perr(MR_ERR_INVALID, p, "%s.source: npy takes images + labels (.npy files) or path (a .npz with "
                        "members x_dataset, y_dataset), not both; HINT: drop the one you do not mean", nm);
        if (d->path[0]) return MR_OK;
        if (!d->images[0] || !d->labels[0])
            return perr(MR_ERR_INVALID, p, "%s.%s: missing required value for source npy; HINT: images and labels "
                        "(.npy files), or path (a .npz archive)", nm, d->images[0] ? "labels" : "images");
        return MR_OK;
    default:
        if (!d->path[0]) return perr(MR_ERR_INVALID, p, "%s.path: missing required value for source %s", nm, mr_cfg_find_field("data.train.source")->names[d->source]);
        return MR_OK;
    }
}
