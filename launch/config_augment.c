/* data.train.augment (data/augment.h): a list of augmentation ops in the order they apply,
 *   augment: [random_crop: {size: 28, pad: 4}, horizontal_flip: 0.5, normalize: {mean: [0.286], std: [0.353]}]
 * each item a one-key mapping (the op: its value). [] or none: no augmentation. Errors name the
 * file, line and column of the item or value and the key path ("data.train.augment[0].random_crop.
 * size"); the checks that need the images' shape (the crop size, normalize's channels) come when the
 * pipeline is built (train/train_data.c). The inverse, mr_cfg_augment_text, writes the same list
 * for config.yaml and the experiment hash (config_out.c). */
#include <stdio.h>
#include <string.h>

#include "launch/config_impl.h"

static const char *const OPS[] = {"random_crop", "horizontal_flip", "normalize"};

#define N_OPS ((int)(sizeof OPS / sizeof OPS[0]))
#define ITEMS(n) ((int)((n)->data.sequence.items.top - (n)->data.sequence.items.start))
#define PAIRS(n) ((int)((n)->data.mapping.pairs.top - (n)->data.mapping.pairs.start))

static yaml_node_t *item(const walker *w, const yaml_node_t *seq, int i) {
    return yaml_document_get_node(w->doc, seq->data.sequence.items.start[i]);
}

/* The closest of names[0..n) to s (for "did you mean"), or NULL when none is close. */
static const char *closest(const char *s, const char *const *names, int n) {
    const char *best = NULL;
    int bd = 4;
    for (int i = 0; i < n; i++) {
        int d = mr_cfg_edit_distance(s, names[i]);
        if (!strncmp(s, names[i], strlen(names[i]))) d = 1; /* "padding" for "pad" */
        if (d < bd) bd = d, best = names[i];
    }
    return best;
}

/* A list of 1..MR_AUGMENT_MAX_CHANNELS numbers into v; *n their count. */
static mr_status number_list(const walker *w, const yaml_node_t *n, const char *key, double *v, int *count) {
    pos p = node_pos(w, n);
    if (n->type != YAML_SEQUENCE_NODE || ITEMS(n) < 1 || ITEMS(n) > MR_AUGMENT_MAX_CHANNELS)
        return perr(MR_ERR_INVALID, p, "%s: expected a list of 1 to %d numbers (one per channel), got %s", key,
                    MR_AUGMENT_MAX_CHANNELS, n->type == YAML_SEQUENCE_NODE ? "another count" : node_kind(n));
    for (int i = 0; i < ITEMS(n); i++) {
        yaml_node_t *x = item(w, n, i);
        if (x->type != YAML_SCALAR_NODE || !mr_cfg_parse_f64(SCALAR(x), &v[i]))
            return perr(MR_ERR_INVALID, node_pos(w, x), "%s[%d]: expected a number", key, i);
    }
    *count = ITEMS(n);
    return MR_OK;
}

/* The {key: value} mapping of an op: each key must be one of `keys`; *vals[k] the value node of
 * keys[k] (NULL: absent). */
static mr_status op_keys(const walker *w, const yaml_node_t *m, const char *path, const char *const *keys, int nk,
                         yaml_node_t **vals) {
    pos p = node_pos(w, m);
    for (int k = 0; k < nk; k++) vals[k] = NULL;
    if (m->type != YAML_MAPPING_NODE)
        return perr(MR_ERR_INVALID, p, "%s: expected a mapping {%s%s%s}, got %s", path, keys[0], nk > 1 ? ", " : "",
                    nk > 1 ? keys[1] : "", node_kind(m));
    for (int i = 0; i < PAIRS(m); i++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, m->data.mapping.pairs.start[i].key);
        yaml_node_t *v = yaml_document_get_node(w->doc, m->data.mapping.pairs.start[i].value);
        const char *kn = k->type == YAML_SCALAR_NODE ? SCALAR(k) : "";
        int found = -1;
        for (int j = 0; j < nk; j++)
            if (!strcmp(kn, keys[j])) found = j;
        if (found < 0) {
            const char *best = closest(kn, keys, nk);
            if (best) return perr(MR_ERR_INVALID, node_pos(w, k), "%s: unknown key '%s' (did you mean '%s'?)", path, kn, best);
            return perr(MR_ERR_INVALID, node_pos(w, k), "%s: unknown key '%s' (keys: %s%s%s)", path, kn, keys[0],
                        nk > 1 ? ", " : "", nk > 1 ? keys[1] : "");
        }
        if (vals[found]) return perr(MR_ERR_INVALID, node_pos(w, k), "%s.%s: given twice", path, kn);
        vals[found] = v;
    }
    return MR_OK;
}

static mr_status int_value(const walker *w, const yaml_node_t *n, const char *key, int64_t lo, int64_t hi, int64_t *v) {
    if (n->type != YAML_SCALAR_NODE || !mr_cfg_parse_i64(SCALAR(n), v) || *v < lo || *v > hi)
        return perr(MR_ERR_INVALID, node_pos(w, n), "%s: expected an integer in [%lld, %lld], got %s%s%s", key,
                    (long long)lo, (long long)hi, n->type == YAML_SCALAR_NODE ? "'" : "",
                    n->type == YAML_SCALAR_NODE ? SCALAR(n) : node_kind(n), n->type == YAML_SCALAR_NODE ? "'" : "");
    return MR_OK;
}

/* One item "op: value" of the list, at index i, into *op. */
static mr_status parse_op(const walker *w, const yaml_node_t *it, const char *path, int i, mr_augment_op *op) {
    char key[160], sub[200];
    pos p = node_pos(w, it);
    if (it->type != YAML_MAPPING_NODE || PAIRS(it) != 1)
        return perr(MR_ERR_INVALID, p, "%s[%d]: expected one 'op: value' (random_crop, horizontal_flip, normalize), got %s",
                    path, i, it->type == YAML_MAPPING_NODE ? "several keys; HINT: one op per list item" : node_kind(it));
    yaml_node_t *k = yaml_document_get_node(w->doc, it->data.mapping.pairs.start[0].key);
    yaml_node_t *v = yaml_document_get_node(w->doc, it->data.mapping.pairs.start[0].value);
    const char *name = k->type == YAML_SCALAR_NODE ? SCALAR(k) : "";
    int kind = -1;
    for (int j = 0; j < N_OPS; j++)
        if (!strcmp(name, OPS[j])) kind = j;
    if (kind < 0) {
        const char *best = closest(name, OPS, N_OPS);
        return perr(MR_ERR_INVALID, node_pos(w, k), "%s[%d]: unknown augmentation '%s' (%s%s%s)", path, i, name,
                    best ? "did you mean '" : "one of random_crop, horizontal_flip, normalize", best ? best : "",
                    best ? "'?" : "");
    }
    snprintf(key, sizeof key, "%s[%d].%s", path, i, name);
    memset(op, 0, sizeof *op);
    if (kind == 0) {
        static const char *const keys[] = {"size", "pad"};
        yaml_node_t *vals[2];
        mr_status st = op_keys(w, v, key, keys, 2, vals);
        if (st) return st;
        if (!vals[0]) return perr(MR_ERR_INVALID, node_pos(w, v), "%s: size is missing; HINT: {size: 28, pad: 4}", key);
        op->kind = MR_AUG_RANDOM_CROP;
        snprintf(sub, sizeof sub, "%s.size", key);
        if ((st = int_value(w, vals[0], sub, 1, 1 << 20, &op->size))) return st;
        snprintf(sub, sizeof sub, "%s.pad", key);
        if (vals[1] && (st = int_value(w, vals[1], sub, 0, 1 << 20, &op->pad))) return st;
        return MR_OK;
    }
    if (kind == 1) {
        op->kind = MR_AUG_HFLIP;
        if (v->type != YAML_SCALAR_NODE || !mr_cfg_parse_f64(SCALAR(v), &op->p) || op->p < 0 || op->p > 1)
            return perr(MR_ERR_INVALID, node_pos(w, v), "%s: expected a probability in [0, 1], got %s%s%s", key,
                        v->type == YAML_SCALAR_NODE ? "'" : "", v->type == YAML_SCALAR_NODE ? SCALAR(v) : node_kind(v),
                        v->type == YAML_SCALAR_NODE ? "'" : "");
        return MR_OK;
    }
    static const char *const keys[] = {"mean", "std"};
    yaml_node_t *vals[2];
    mr_status st = op_keys(w, v, key, keys, 2, vals);
    if (st) return st;
    if (!vals[0] || !vals[1])
        return perr(MR_ERR_INVALID, node_pos(w, v), "%s: %s is missing; HINT: {mean: [0.5], std: [0.25]}, one value per channel",
                    key, vals[0] ? "std" : "mean");
    op->kind = MR_AUG_NORMALIZE;
    int nm = 0, ns = 0;
    snprintf(sub, sizeof sub, "%s.mean", key);
    if ((st = number_list(w, vals[0], sub, op->mean, &nm))) return st;
    snprintf(sub, sizeof sub, "%s.std", key);
    if ((st = number_list(w, vals[1], sub, op->std, &ns))) return st;
    if (nm != ns)
        return perr(MR_ERR_INVALID, node_pos(w, vals[1]), "%s: %d std values for %d means; HINT: one of each per channel", key,
                    ns, nm);
    for (int c = 0; c < ns; c++)
        if (!(op->std[c] > 0))
            return perr(MR_ERR_INVALID, node_pos(w, item(w, vals[1], c)), "%s.std[%d]: must be > 0, got %g", key, c, op->std[c]);
    op->n = nm;
    return MR_OK;
}

mr_status mr_cfg_set_augment(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n) {
    pos p = node_pos(w, n);
    mr_augment_cfg a;
    memset(&a, 0, sizeof a);
    if (n->type == YAML_SCALAR_NODE) {
        int b = 1;
        if (!strcmp(SCALAR(n), "none") || !strcmp(SCALAR(n), "[]") || (mr_cfg_parse_bool(SCALAR(n), &b) && !b)) {
            memcpy((char *)e + f->off, &a, sizeof a);
            return MR_OK;
        }
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return perr(MR_ERR_INVALID, p, "%s: expected a list of ops (or none), got %s; HINT: %s: [random_crop: {size: 28, "
                    "pad: 4}, horizontal_flip: 0.5]", f->path, node_kind(n), f->path);
    if (ITEMS(n) > MR_AUGMENT_MAX_OPS)
        return perr(MR_ERR_INVALID, p, "%s: %d ops, at most %d", f->path, ITEMS(n), MR_AUGMENT_MAX_OPS);
    for (int i = 0; i < ITEMS(n); i++) {
        mr_status st = parse_op(w, item(w, n, i), f->path, i, &a.op[i]);
        if (st) return st;
    }
    a.n = ITEMS(n);
    memcpy((char *)e + f->off, &a, sizeof a);
    return MR_OK;
}

/* The shortest of %.15g / %.17g that reads back to the same double (0.286, not 0.28599999999999998). */
static int put_num(char *b, size_t cap, double v) {
    int n = snprintf(b, cap, "%.15g", v);
    double back = 0;
    if (!mr_cfg_parse_f64(b, &back) || back != v) n = snprintf(b, cap, "%.17g", v);
    return n;
}

void mr_cfg_augment_text(const mr_augment_cfg *a, char *b, size_t cap) {
    size_t at = 0;
#define PUT(...) do { int k_ = snprintf(b + at, at < cap ? cap - at : 0, __VA_ARGS__); if (k_ > 0) at += (size_t)k_; } while (0)
    if (cap) b[0] = '\0';
    if (a->n == 0) { PUT("none"); return; }
    PUT("[");
    for (int i = 0; i < a->n; i++) {
        const mr_augment_op *op = &a->op[i];
        PUT("%s", i ? ", " : "");
        if (op->kind == MR_AUG_RANDOM_CROP) PUT("random_crop: {size: %lld, pad: %lld}", (long long)op->size, (long long)op->pad);
        if (op->kind == MR_AUG_HFLIP) {
            char v[32];
            put_num(v, sizeof v, op->p);
            PUT("horizontal_flip: %s", v);
        }
        if (op->kind == MR_AUG_NORMALIZE)
            for (int l = 0; l < 2; l++) {
                PUT(l ? "], std: [" : "normalize: {mean: [");
                for (int c = 0; c < op->n; c++) {
                    char v[32];
                    put_num(v, sizeof v, l ? op->std[c] : op->mean[c]);
                    PUT("%s%s", c ? ", " : "", v);
                }
                if (l) PUT("]}");
            }
    }
    PUT("]");
#undef PUT
}
