/* The experiment config: one table of keys (dotted path, kind, offset, range) drives parsing,
 * validation, --set, to_yaml (and so the hash) and sweeps, so a key added to the table is
 * parsed, checked, overridable, saved and sweepable at once.
 *
 * YAML is loaded with libyaml's document API (nodes carry line/column marks). A mapping at path P
 * accepts a key K when "P.K" is a table key (the value goes to the key's setter) or a prefix of
 * one (a section: recurse). --set parses its value as a one-node YAML document and calls the same
 * setters; sweeps apply their values through the same scalar setter. */
#include "launch/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "core/log.h"
#include "launch/config_impl.h"

/* The key table itself is launch/config_keys.c. */
#define FIELDS mr_cfg_fields
#define OFF(m) offsetof(mr_experiment, m)
/* an enum key's value in words */
static const char *enum_name(const char *path, int v) { return mr_cfg_find_field(path)->names[v]; }

/* Set while a config is loaded and then overridden (mr_experiment_defer_file_checks): a path in
 * the file that --set replaces need not exist. Per thread, like the error message. */
static _Thread_local int g_defer_files;

void mr_experiment_defer_file_checks(int on) { g_defer_files = on; }
#define N_FIELDS mr_cfg_n_fields

/* Common names from other frameworks, offered as did-you-mean targets (alias -> our key). */
static const char *const ALIASES[][2] = {
    {"learning_rate", "lr"}, {"batch_size", "batch"}, {"max_steps", "steps"}, {"num_steps", "steps"},
    {"iterations", "steps"}, {"wd", "weight_decay"}, {"max_grad_norm", "grad_clip"}, {"clip_grad_norm", "grad_clip"},
    {"warmup_steps", "warmup"}, {"num_classes", "classes"}, {"n_layer", "layers"}, {"n_head", "heads"},
    {"n_embd", "embd"}, {"vocab_size", "vocab"}, {"block_size", "context"}, {"epsilon", "eps"},
    {"grad_accum", "accumulate"}, {"gradient_accumulation_steps", "accumulate"}, {"save_every", "every"},
    {"optim", "optimizer"}, {"scheduler", "schedule"}, {"lr_schedule", "schedule"}, {"dataset", "data"},
};

const field *mr_cfg_find_field(const char *path) {
    for (int i = 0; i < N_FIELDS; i++)
        if (!strcmp(FIELDS[i].path, path)) return &FIELDS[i];
    return NULL;
}

/* Is `path` a section (a strict prefix, at a dot, of some key)? "" is the root. */
static int is_section(const char *path) {
    size_t n = strlen(path);
    if (n == 0) return 1;
    for (int i = 0; i < N_FIELDS; i++)
        if (!strncmp(FIELDS[i].path, path, n) && FIELDS[i].path[n] == '.') return 1;
    return 0;
}

int mr_cfg_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

/* Best candidate for `key`: considers `cand` itself and the aliases that point at it. */
static void consider(const char *key, const char *cand, const char **best, int *best_d) {
    int d = mr_cfg_edit_distance(key, cand);
    if (d < *best_d) { *best_d = d; *best = cand; }
    for (size_t a = 0; a < sizeof ALIASES / sizeof ALIASES[0]; a++)
        if (!strcmp(ALIASES[a][1], cand)) {
            d = mr_cfg_edit_distance(key, ALIASES[a][0]);
            if (d < *best_d) { *best_d = d; *best = cand; }
        }
}

static int close_enough(const char *key, int d) { return d <= 2 || d <= (int)strlen(key) / 3; }

/* The valid child key of section `sec` nearest to `key`, copied to buf, or NULL. */
static const char *suggest_child(const char *sec, const char *key, char *buf, size_t cap) {
    size_t n = strlen(sec);
    int best_d = 99;
    char child[MR_CFG_NAME_MAX];
    for (int i = 0; i < N_FIELDS; i++) {
        const char *p = FIELDS[i].path;
        if (n) {
            if (strncmp(p, sec, n) || p[n] != '.') continue;
            p += n + 1;
        }
        size_t len = strcspn(p, ".");
        if (len >= sizeof child) continue;
        memcpy(child, p, len);
        child[len] = '\0';
        const char *b = NULL;
        int d = best_d;
        consider(key, child, &b, &d);
        if (b) {
            best_d = d;
            snprintf(buf, cap, "%s", child);
        }
    }
    return best_d < 99 && close_enough(key, best_d) ? buf : NULL;
}

/* The full key nearest to `key` (for --set and sweep.params). */
static const char *suggest_path(const char *key) {
    const char *best = NULL;
    int best_d = 99;
    for (int i = 0; i < N_FIELDS; i++) {
        if (FIELDS[i].k == K_PARAMS) continue;
        consider(key, FIELDS[i].path, &best, &best_d);
        const char *leaf = strrchr(FIELDS[i].path, '.');
        const char *kl = strrchr(key, '.');
        /* a typo in the leaf only: compare leaves when the sections match */
        if (leaf && kl && kl - key == leaf - FIELDS[i].path && !strncmp(key, FIELDS[i].path, (size_t)(kl - key))) {
            int d = 99;
            const char *b = NULL;
            consider(kl + 1, leaf + 1, &b, &d);
            if (d < best_d) { best_d = d; best = FIELDS[i].path; }
        }
    }
    return best && close_enough(key, best_d) ? best : NULL;
}

/* ---- errors with a position ------------------------------------------------------------------- */

static pos at_mark(const char *name, yaml_mark_t m) { return (pos){name, (int)m.line + 1, (int)m.column + 1}; }

/* The message is "<name>:<line>:<col>: ..." ("--set:<col>: ..." without a line; "<name>: ..."
 * when col is 0: no position known); the C position (file, line) goes apart (mr_last_error_where). */
mr_status mr_cfg_perr_at(const char *file, int line, mr_status s, pos p, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *base = strrchr(p.name, '/');
    base = base ? base + 1 : p.name;
    if (p.line > 0) return mr_set_error_at(s, file, line, "%s:%d:%d: %s", base, p.line, p.col, msg);
    if (p.col > 0) return mr_set_error_at(s, file, line, "%s:%d: %s", base, p.col, msg);
    return mr_set_error_at(s, file, line, "%s: %s", base, msg);
}

/* An F_FILE value must name an existing file (when set); an F_RESUME value is auto, never or one. */
static mr_status file_check(const field *f, const char *s, pos p) {
    if ((f->flags & F_FILE) && s[0]) return mr_cfg_check_files(f, s, p); /* globs, lists: config_data.c */
    if ((f->flags & F_RESUME) && s[0] && strcmp(s, "auto") && strcmp(s, "never") && access(s, F_OK) != 0)
        return perr(MR_ERR_NOT_FOUND, p, "%s: expected auto, never or an existing checkpoint, got '%s' (no such file)",
                    f->path, s);
    return MR_OK;
}

/* ---- scalar setters (shared by YAML, --set and sweeps) ----------------------------------------- */

int mr_cfg_parse_i64(const char *s, int64_t *v) {
    if (!*s || isspace((unsigned char)*s)) return 0;
    errno = 0;
    char *end;
    long long x = strtoll(s, &end, 10);
    if (*end || errno) return 0;
    *v = x;
    return 1;
}

int mr_cfg_parse_f64(const char *s, double *v) {
    if (!*s || isspace((unsigned char)*s)) return 0;
    char *end;
    double x = strtod(s, &end);
    if (*end || !isfinite(x)) return 0;
    *v = x;
    return 1;
}

int mr_cfg_parse_bool(const char *s, int *v) {
    static const char *const T[] = {"true", "True", "TRUE", "yes", "on"}, *const F[] = {"false", "False", "FALSE", "no", "off"};
    for (int i = 0; i < 5; i++) {
        if (!strcmp(s, T[i])) { *v = 1; return 1; }
        if (!strcmp(s, F[i])) { *v = 0; return 1; }
    }
    return 0;
}

static mr_status range_check(const field *f, double x, pos p, const char *shown) {
    int lo_bad = (f->flags & F_LO_EXCL) ? !(x > f->lo) : !(x >= f->lo);
    int hi_bad = (f->flags & F_HI_EXCL) ? !(x < f->hi) : !(x <= f->hi);
    if (lo_bad) return perr(MR_ERR_INVALID, p, "%s: must be %s %g, got %s", f->path, (f->flags & F_LO_EXCL) ? ">" : ">=", f->lo, shown);
    if (hi_bad) return perr(MR_ERR_INVALID, p, "%s: must be %s %g, got %s", f->path, (f->flags & F_HI_EXCL) ? "<" : "<=", f->hi, shown);
    return MR_OK;
}

mr_status mr_cfg_set_scalar(mr_experiment *e, const field *f, const char *s, pos p) {
    char *base = (char *)e + f->off;
    switch (f->k) {
    case K_INT: {
        int64_t v;
        if (!mr_cfg_parse_i64(s, &v)) return perr(MR_ERR_INVALID, p, "%s: expected an integer, got '%s'", f->path, s);
        mr_status st = range_check(f, (double)v, p, s);
        if (st) return st;
        if (strstr(f->path, "token_bytes") && v != 2 && v != 4)
            return perr(MR_ERR_INVALID, p, "%s: must be 2 or 4, got %s", f->path, s);
        memcpy(base, &v, sizeof v);
        return MR_OK;
    }
    case K_NUM: {
        double v;
        if (!mr_cfg_parse_f64(s, &v)) return perr(MR_ERR_INVALID, p, "%s: expected a number, got '%s'", f->path, s);
        mr_status st = range_check(f, v, p, s);
        if (st) return st;
        memcpy(base, &v, sizeof v);
        return MR_OK;
    }
    case K_BOOL: {
        int v;
        if (!mr_cfg_parse_bool(s, &v)) return perr(MR_ERR_INVALID, p, "%s: expected true or false, got '%s'", f->path, s);
        memcpy(base, &v, sizeof v);
        return MR_OK;
    }
    case K_ENUM: {
        const char *best = NULL;
        int best_d = 99, n = 0;
        char list[256] = "";
        for (int i = 0; f->names[i]; i++, n++) {
            if (!strcmp(s, f->names[i])) { memcpy(base, &i, sizeof i); return MR_OK; }
            consider(s, f->names[i], &best, &best_d);
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", f->names[i]);
        }
        if (best && close_enough(s, best_d))
            return perr(MR_ERR_INVALID, p, "%s: expected one of %s, got '%s' (did you mean '%s'?)", f->path, list, s, best);
        return perr(MR_ERR_INVALID, p, "%s: expected one of %s, got '%s'", f->path, list, s);
    }
    case K_STR: {
        size_t n = strlen(s);
        if (n >= f->size) return perr(MR_ERR_INVALID, p, "%s: longer than %zu characters", f->path, f->size - 1);
        if ((f->flags & F_NONEMPTY) && n == 0) return perr(MR_ERR_INVALID, p, "%s: must not be empty", f->path);
        if (!g_defer_files) {
            mr_status fs = file_check(f, s, p);
            if (fs) return fs;
        }
        memset(base, 0, f->size);
        memcpy(base, s, n);
        return MR_OK;
    }
    default:
        return perr(MR_ERR_INVALID, p, "%s: expected a list, got '%s'", f->path, s);
    }
}

/* ---- node setters ------------------------------------------------------------------------------ */

/* Where each key was seen (for the cross-key messages after the walk). */
struct key_mark { char path[96]; int line, col; };
typedef struct key_marks {
    int n;
    struct key_mark at[256];
} key_marks;

static int is_overridden(const mr_experiment *e, const char *key) {
    const field *f = mr_cfg_find_field(key);
    if (!f) return 0;
    int i = (int)(f - FIELDS);
    return (e->overridden[i / 8] >> (i % 8)) & 1;
}

/* The mark of exactly `key`, or NULL. */
static const struct key_mark *mark_of(const key_marks *km, const char *key) {
    for (int i = 0; km && i < km->n; i++)
        if (!strcmp(km->at[i].path, key)) return &km->at[i];
    return NULL;
}

/* Where `key` was given: "--set" when an override set it last, else its line in the file, else
 * its nearest enclosing section's; a key given nowhere has no position ("<origin>: "). */
static pos key_pos(const mr_experiment *e, const char *origin, const key_marks *km, const char *key) {
    if (e && is_overridden(e, key)) return (pos){"--set", 0, 0};
    char k[96];
    snprintf(k, sizeof k, "%s", key);
    while (km && *k) {
        const struct key_mark *m = mark_of(km, k);
        if (m) return (pos){origin, m->line, m->col};
        char *dot = strrchr(k, '.');
        if (!dot) break;
        *dot = '\0';
    }
    return (pos){origin, 0, 0};
}

static const char *expected(const field *f) {
    switch (f->k) {
    case K_INT: return "an integer";
    case K_NUM: return "a number";
    case K_BOOL: return "true or false";
    case K_ENUM: return "a name";
    case K_STR: return "a string";
    default: return "a list";
    }
}

static mr_status set_params(const walker *w, mr_experiment *e, const yaml_node_t *n);
static mr_status set_param(const walker *w, mr_experiment *e, const char *key, pos kp, const yaml_node_t *v);

static mr_status set_node(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n) {
    pos p = node_pos(w, n);
    switch (f->k) {
    case K_SIZES: case K_CHANNELS: case K_INPUT:
        return mr_cfg_set_model_node(w, e, f, n);
    case K_DEVICES: {
        if (n->type == YAML_SCALAR_NODE) {
            if (!strcmp(SCALAR(n), "auto")) {
                e->distribute.n_devices = 0;
                memset(e->distribute.devices, 0, sizeof e->distribute.devices);
                return MR_OK;
            }
            return perr(MR_ERR_INVALID, p, "%s: expected auto or a list of devices, got '%s'", f->path, SCALAR(n));
        }
        if (n->type != YAML_SEQUENCE_NODE)
            return perr(MR_ERR_INVALID, p, "%s: expected auto or a list of devices, got %s", f->path, node_kind(n));
        int c = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
        if (c < 1 || c > MR_CFG_MAX_DEVICES)
            return perr(MR_ERR_INVALID, p, "%s: expected 1 to %d devices, got %d", f->path, MR_CFG_MAX_DEVICES, c);
        char tmp[MR_CFG_MAX_DEVICES][MR_CFG_NAME_MAX];
        memset(tmp, 0, sizeof tmp);
        for (int i = 0; i < c; i++) {
            yaml_node_t *it = yaml_document_get_node(w->doc, n->data.sequence.items.start[i]);
            if (it->type != YAML_SCALAR_NODE || !*SCALAR(it) || strlen(SCALAR(it)) >= MR_CFG_NAME_MAX)
                return perr(MR_ERR_INVALID, node_pos(w, it), "%s[%d]: expected a device name", f->path, i);
            strcpy(tmp[i], SCALAR(it));
        }
        memcpy(e->distribute.devices, tmp, sizeof tmp);
        e->distribute.n_devices = c;
        return MR_OK;
    }
    case K_PARAMS:
        return set_params(w, e, n);
    case K_WINDOW:
        return mr_cfg_set_window(w, e, f, n);
    case K_AUGMENT:
        return mr_cfg_set_augment(w, e, f, n);
    case K_SHAPE:
        return mr_cfg_set_shape(w, e, f, n); /* config_data.c */
    default:
        if (f->off == OFF(model.layers) && n->type == YAML_SEQUENCE_NODE) return mr_cfg_set_model_node(w, e, f, n);
        if ((f->flags & F_FILE) && n->type == YAML_SEQUENCE_NODE) return mr_cfg_set_file_list(w, e, f, n);
        if (n->type != YAML_SCALAR_NODE)
            return perr(MR_ERR_INVALID, p, "%s: expected %s, got %s", f->path, expected(f), node_kind(n));
        return mr_cfg_set_scalar(e, f, SCALAR(n), p);
    }
}

static int n_items(const yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE ? (int)(n->data.mapping.pairs.top - n->data.mapping.pairs.start)
                                        : (int)(n->data.sequence.items.top - n->data.sequence.items.start);
}

/* Keys of a mapping node must be scalars and unique; `sec` names the section in messages. */
static mr_status check_keys(const walker *w, const yaml_node_t *map, const char *sec) {
    int np = n_items(map);
    for (int i = 0; i < np; i++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, map->data.mapping.pairs.start[i].key);
        if (k->type != YAML_SCALAR_NODE)
            return perr(MR_ERR_INVALID, node_pos(w, k), "%s%s: keys must be names, got %s", sec, *sec ? "" : "top level",
                        node_kind(k));
        for (int j = 0; j < i; j++) {
            yaml_node_t *k2 = yaml_document_get_node(w->doc, map->data.mapping.pairs.start[j].key);
            if (!strcmp(SCALAR(k), SCALAR(k2)))
                return perr(MR_ERR_INVALID, node_pos(w, k), "duplicate key '%s' in %s (first at line %d)", SCALAR(k),
                            *sec ? sec : "the top level", (int)k2->start_mark.line + 1);
        }
    }
    return MR_OK;
}

/* sweep.params: {dotted.key: [values] | {min, max, log}}. Replaces the whole list. */
static mr_status set_params(const walker *w, mr_experiment *e, const yaml_node_t *n) {
    if (n->type != YAML_MAPPING_NODE)
        return perr(MR_ERR_INVALID, node_pos(w, n), "sweep.params: expected a mapping of key: [values], got %s", node_kind(n));
    mr_status st = check_keys(w, n, "sweep.params");
    if (st) return st;
    e->sweep.n_params = 0;
    memset(e->sweep.params, 0, sizeof e->sweep.params);
    for (int i = 0; i < n_items(n); i++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, n->data.mapping.pairs.start[i].key);
        yaml_node_t *v = yaml_document_get_node(w->doc, n->data.mapping.pairs.start[i].value);
        if ((st = set_param(w, e, SCALAR(k), node_pos(w, k), v))) return st;
    }
    return MR_OK;
}

/* Adds or replaces the swept key `key`; every value is validated on a scratch copy. */
static mr_status set_param(const walker *w, mr_experiment *e, const char *key, pos kp, const yaml_node_t *v) {
    const field *f = mr_cfg_find_field(key);
    if (!f) {
        const char *s = suggest_path(key);
        if (s) return perr(MR_ERR_INVALID, kp, "sweep.params: unknown key '%s' (did you mean '%s'?)", key, s);
        return perr(MR_ERR_INVALID, kp, "sweep.params: unknown key '%s'", key);
    }
    if (f->k > K_ENUM || !strncmp(key, "sweep.", 6))
        return perr(MR_ERR_INVALID, kp, "sweep.params: '%s' cannot be swept (only single values can)", key);
    if (strlen(key) >= MR_CFG_NAME_MAX) return perr(MR_ERR_INVALID, kp, "sweep.params: key '%s' too long", key);
    mr_sweep_param sp;
    memset(&sp, 0, sizeof sp);
    strcpy(sp.key, key);
    mr_experiment *scratch = malloc(sizeof *scratch);
    if (!scratch) return mr_set_error(MR_ERR_NOMEM, "sweep.params: out of memory");
    mr_status st = MR_OK;
    memcpy(scratch, e, sizeof *scratch);
    if (v->type == YAML_SEQUENCE_NODE) {
        int c = n_items(v);
        if (c < 1 || c > MR_SWEEP_MAX_VALUES) {
            st = perr(MR_ERR_INVALID, node_pos(w, v), "sweep.params.%s: expected 1 to %d values, got %d", key, MR_SWEEP_MAX_VALUES, c);
            goto fail;
        }
        for (int i = 0; i < c; i++) {
            yaml_node_t *it = yaml_document_get_node(w->doc, v->data.sequence.items.start[i]);
            if (it->type != YAML_SCALAR_NODE || strlen(SCALAR(it)) >= MR_CFG_NAME_MAX) {
                st = perr(MR_ERR_INVALID, node_pos(w, it), "sweep.params.%s[%d]: expected a single value", key, i);
                goto fail;
            }
            if ((st = mr_cfg_set_scalar(scratch, f, SCALAR(it), node_pos(w, it)))) goto fail;
            strcpy(sp.values[i], SCALAR(it));
        }
        sp.n_values = c;
    } else if (v->type == YAML_MAPPING_NODE) {
        if (f->k != K_INT && f->k != K_NUM) {
            st = perr(MR_ERR_INVALID, node_pos(w, v), "sweep.params.%s: a {min, max} range needs a numeric key", key);
            goto fail;
        }
        char sec[MR_CFG_NAME_MAX + 16];
        snprintf(sec, sizeof sec, "sweep.params.%s", key);
        if ((st = check_keys(w, v, sec))) goto fail;
        int have = 0;
        for (int i = 0; i < n_items(v); i++) {
            yaml_node_t *k = yaml_document_get_node(w->doc, v->data.mapping.pairs.start[i].key);
            yaml_node_t *x = yaml_document_get_node(w->doc, v->data.mapping.pairs.start[i].value);
            const char *kn = SCALAR(k);
            int which = !strcmp(kn, "min") ? 0 : !strcmp(kn, "max") ? 1 : !strcmp(kn, "log") ? 2 : -1;
            if (which < 0) {
                const char *best = NULL;
                int d = 99;
                consider(kn, "min", &best, &d), consider(kn, "max", &best, &d), consider(kn, "log", &best, &d);
                if (best && close_enough(kn, d))
                    st = perr(MR_ERR_INVALID, node_pos(w, k), "unknown key '%s' in %s (did you mean '%s'?)", kn, sec, best);
                else st = perr(MR_ERR_INVALID, node_pos(w, k), "unknown key '%s' in %s (valid: min, max, log)", kn, sec);
                goto fail;
            }
            const char *xs = x->type == YAML_SCALAR_NODE ? SCALAR(x) : "";
            int ok = x->type == YAML_SCALAR_NODE && (which == 2 ? mr_cfg_parse_bool(xs, &sp.log) : mr_cfg_parse_f64(xs, which ? &sp.max : &sp.min));
            if (!ok) {
                st = perr(MR_ERR_INVALID, node_pos(w, x), "%s.%s: expected %s, got '%s'", sec, kn,
                          which == 2 ? "true or false" : "a number", xs);
                goto fail;
            }
            if (which < 2) {
                char shown[64];
                double x2 = which ? sp.max : sp.min;
                if (f->k == K_INT) snprintf(shown, sizeof shown, "%.0f", x2);
                else snprintf(shown, sizeof shown, "%.17g", x2);
                if (f->k == K_INT && x2 != floor(x2)) {
                    st = perr(MR_ERR_INVALID, node_pos(w, x), "%s.%s: expected an integer, got '%s'", sec, kn, xs);
                    goto fail;
                }
                if ((st = mr_cfg_set_scalar(scratch, f, shown, node_pos(w, x)))) goto fail;
            }
            have |= which < 2 ? 1 << which : 0;
        }
        if (have != 3) { st = perr(MR_ERR_INVALID, node_pos(w, v), "%s: a range needs both min and max", sec); goto fail; }
        if (!(sp.min < sp.max)) { st = perr(MR_ERR_INVALID, node_pos(w, v), "%s: min must be < max, got %g and %g", sec, sp.min, sp.max); goto fail; }
        if (sp.log && !(sp.min > 0)) { st = perr(MR_ERR_INVALID, node_pos(w, v), "%s: log: true needs min > 0, got %g", sec, sp.min); goto fail; }
    } else {
        st = perr(MR_ERR_INVALID, node_pos(w, v), "sweep.params.%s: expected a list of values or {min, max, log}, got '%s'", key,
                  SCALAR(v));
        goto fail;
    }
    int slot = e->sweep.n_params;
    for (int i = 0; i < e->sweep.n_params; i++)
        if (!strcmp(e->sweep.params[i].key, key)) slot = i;
    if (slot == MR_SWEEP_MAX_PARAMS) { st = perr(MR_ERR_INVALID, kp, "sweep.params: more than %d keys", MR_SWEEP_MAX_PARAMS); goto fail; }
    e->sweep.params[slot] = sp;
    if (slot == e->sweep.n_params) e->sweep.n_params++;
    free(scratch);
    return MR_OK;
fail:
    free(scratch);
    return st;
}

/* Walks mapping `map` at section `sec` ("" = root). */
static mr_status walk(const walker *w, mr_experiment *e, const yaml_node_t *map, const char *sec) {
    if (map->type != YAML_MAPPING_NODE) {
        if (!*sec) return perr(MR_ERR_INVALID, node_pos(w, map), "the config must be a mapping of sections, got %s", node_kind(map));
        return perr(MR_ERR_INVALID, node_pos(w, map), "%s: expected a mapping, got %s", sec, node_kind(map));
    }
    mr_status st = check_keys(w, map, sec);
    if (st) return st;
    for (int i = 0; i < n_items(map); i++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, map->data.mapping.pairs.start[i].key);
        yaml_node_t *v = yaml_document_get_node(w->doc, map->data.mapping.pairs.start[i].value);
        char full[256];
        snprintf(full, sizeof full, "%s%s%s", sec, *sec ? "." : "", SCALAR(k));
        if (w->marks && w->marks->n < 256 && strlen(full) < 96) {
            strcpy(w->marks->at[w->marks->n].path, full);
            w->marks->at[w->marks->n].line = (int)k->start_mark.line + 1;
            w->marks->at[w->marks->n].col = (int)k->start_mark.column + 1;
            w->marks->n++;
        }
        const field *f = mr_cfg_find_field(full);
        if (f) st = set_node(w, e, f, v);
        else if (is_section(full)) st = walk(w, e, v, full);
        else {
            char buf[MR_CFG_NAME_MAX];
            const char *s = suggest_child(sec, SCALAR(k), buf, sizeof buf);
            if (s) st = perr(MR_ERR_INVALID, node_pos(w, k), "unknown key '%s' in %s (did you mean '%s'?)", SCALAR(k),
                             *sec ? sec : "the top level", s);
            else st = perr(MR_ERR_INVALID, node_pos(w, k), "unknown key '%s' in %s", SCALAR(k), *sec ? sec : "the top level");
        }
        if (st) return st;
    }
    return MR_OK;
}

/* ---- public API ------------------------------------------------------------------------------- */

mr_experiment mr_experiment_default(void) {
    mr_experiment e;
    memset(&e, 0, sizeof e);
    e.seed = 1;
    e.model = mr_model_cfg_default(MR_MODEL_CNN);
    mr_data_cfg d;
    memset(&d, 0, sizeof d);
    mr_cfg_data_default(&d); /* the data files' keys: config_data.c */
    d.token_bytes = 2;
    e.data.train = d;
    e.data.eval = d;
    e.optimizer.type = MR_OPTIM_ADAMW;
    e.optimizer.lr = 1e-3;
    e.optimizer.momentum = 0.9;
    e.optimizer.weight_decay = 0.01;
    e.optimizer.beta1 = 0.9;
    e.optimizer.beta2 = 0.999;
    e.optimizer.eps = 1e-8;
    e.schedule.type = MR_SCHEDULE_COSINE;
    e.schedule.step_size = 1000;
    e.schedule.gamma = 0.1;
    e.precision.policy = MR_PREC_F32;
    e.precision.loss_scale.initial = 32768;
    e.distribute.cuda_graphs = 1;
    e.precision.loss_scale.growth_interval = 2000;
    e.precision.loss_scale.growth_factor = 2;
    e.precision.loss_scale.backoff_factor = 0.5;
    e.precision.loss_scale.min = 1;
    e.train.steps = 1000;
    e.train.batch = 64;
    e.train.eval_every = 0;
    e.train.log_every = 50;
    e.train.accumulate = 1;
    strcpy(e.checkpoint.dir, "runs/default");
    e.checkpoint.keep = 3;
    strcpy(e.checkpoint.resume, "auto");
    e.distribute.backend = MR_BACKEND_AUTO;
    /* Open MPI 4.1 slows sharply above 16 MB per call; smaller buckets measured no faster (README
     * "Several replicas") */
    e.distribute.bucket_mb = 16;
    e.distribute.timeout_s = 300;
    e.log.progress = 1;
    e.log.tensorboard = 1;
    e.sweep.trials = 10;
    e.sweep.scheduler.min_steps = 100;
    e.sweep.scheduler.reduction = 3;
    strcpy(e.sweep.metric, "eval_accuracy");
    return e;
}

void mr_experiment_deinit(mr_experiment *e) {
    if (!e) return;
    free(e->yaml_text);
    *e = mr_experiment_default();
}

mr_status mr_experiment_copy(mr_experiment *dst, const mr_experiment *src) {
    char *t = NULL;
    if (src->yaml_text && !(t = strdup(src->yaml_text))) return mr_set_error(MR_ERR_NOMEM, "config: out of memory");
    memcpy(dst, src, sizeof *dst);
    dst->yaml_text = t;
    return MR_OK;
}

/* Records where every key of the mapping `map` (at section `sec`) is, recursing into sections as
 * walk() does; for the checks after --set, which see only e->yaml_text. */
static void collect_marks(yaml_document_t *doc, const yaml_node_t *map, const char *sec, key_marks *km) {
    if (map->type != YAML_MAPPING_NODE) return;
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(doc, pr->key), *v = yaml_document_get_node(doc, pr->value);
        if (!k || !v || k->type != YAML_SCALAR_NODE) continue;
        char full[256];
        snprintf(full, sizeof full, "%s%s%s", sec, *sec ? "." : "", SCALAR(k));
        if (km->n < 256 && strlen(full) < 96) {
            strcpy(km->at[km->n].path, full);
            km->at[km->n].line = (int)k->start_mark.line + 1;
            km->at[km->n].col = (int)k->start_mark.column + 1;
            km->n++;
        }
        if (!mr_cfg_find_field(full) && is_section(full)) collect_marks(doc, v, full, km);
    }
}

/* The key marks of yaml_text (NULL when there is none or it does not parse). Caller frees. */
static key_marks *marks_of_text(const char *yaml_text) {
    if (!yaml_text) return NULL;
    yaml_parser_t parser;
    yaml_document_t doc;
    key_marks *km = calloc(1, sizeof *km);
    if (!km || !yaml_parser_initialize(&parser)) {
        free(km);
        return NULL;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml_text, strlen(yaml_text));
    if (yaml_parser_load(&parser, &doc)) {
        yaml_node_t *root = yaml_document_get_root_node(&doc);
        if (root) collect_marks(&doc, root, "", km);
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&parser);
    return km;
}

/* Keys that have no effect for e's choices. A key given by --set is an error; a key of the file
 * is an error when the file's own values make it pointless (final = 0, while parsing) and a
 * warning when a --set override did (final = 1: the file cannot be edited from the command line).
 * A key whose deciding key is swept may apply to some trials and is left alone. */
static mr_status check_unused(const mr_experiment *e, const char *origin, const key_marks *km, int final) {
    char why[160];
    for (int i = 0; i < N_FIELDS; i++) {
        const field *f = &FIELDS[i];
        const int by_set = is_overridden(e, f->path);
        const struct key_mark *m = mark_of(km, f->path);
        if ((!by_set && !m) || mr_cfg_selector_swept(e, f) || !mr_cfg_unused(e, f, why, sizeof why)) continue;
        if (by_set)
            return perr(MR_ERR_INVALID, ((pos){"--set", 0, 0}), "%s: has no effect %s; HINT: drop --set %s", f->path, why,
                        f->path);
        pos p = {origin, m->line, m->col};
        if (!final)
            return perr(MR_ERR_INVALID, p, "%s: has no effect %s; HINT: remove the key (the resolved config.yaml lists "
                                           "only the keys that apply)", f->path, why);
        const char *sel = mr_cfg_selector_of(f);
        if (!sel || !is_overridden(e, sel)) continue; /* e.g. a sweep trial: its own values decide */
        char where[MR_CFG_PATH_MAX + 32];
        const char *base = strrchr(origin, '/');
        snprintf(where, sizeof where, "%s:%d:%d", base ? base + 1 : origin, p.line, p.col);
        mr_log_warn("%s: %s: ignored: it has no effect %s (--set %s)", where, f->path, why, sel);
    }
    for (int i = 0; i < e->sweep.n_params; i++) {
        const field *f = mr_cfg_find_field(e->sweep.params[i].key);
        if (f && !mr_cfg_selector_swept(e, f) && mr_cfg_unused(e, f, why, sizeof why))
            return perr(MR_ERR_INVALID, key_pos(e, origin, km, "sweep.params"), "sweep.params.%s: has no effect %s",
                        f->path, why);
    }
    for (int i = 0; i < 2; i++) {
        const mr_data_cfg *d = i ? &e->data.eval : &e->data.train;
        const char *key = i ? "data.eval.context" : "data.train.context";
        if ((d->source == MR_SRC_TOKENS || d->source == MR_SRC_TEXT) && d->context && d->context != e->model.context)
            return perr(MR_ERR_INVALID, key_pos(e, origin, km, key),
                        "%s: must equal model.context (%lld) or be left out, got %lld (windows are model.context tokens)",
                        key, (long long)e->model.context, (long long)d->context);
    }
    return MR_OK;
}

static mr_status check_impl(const mr_experiment *e, const char *origin, const key_marks *km, int final) {
#define P(key) key_pos(e, origin, km, key)
    if (!g_defer_files) /* the final values (after --set), when the checks were deferred */
        for (int i = 0; i < mr_cfg_n_fields; i++) {
            const field *f = &FIELDS[i];
            if (f->k != K_STR || !(f->flags & (F_FILE | F_RESUME))) continue;
            mr_status fs = file_check(f, (const char *)e + f->off, P(f->path));
            if (fs) return fs;
        }
    mr_status us = check_unused(e, origin, km, final);
    if (us) return us;
    const mr_data_cfg *ds[2] = {&e->data.train, &e->data.eval};
    for (int i = 0; i < 2; i++) {
        const char *nm = i ? "data.eval" : "data.train";
        const mr_data_cfg *d = ds[i];
        if (d->source == MR_SRC_NONE) {
            if (!i) return perr(MR_ERR_INVALID, P("data.train.source"), "data.train.source: missing required value (idx, tokens, text, hdf5, npy or tfrecord)");
            continue;
        }
        mr_status ss = mr_cfg_check_source(d, nm, P(nm)); /* config_data.c */
        if (ss) return ss;
    }
    /* What the trainer cannot run, on the final values (mr_experiment_check: after --set, which may
     * still change the source; parsing alone accepts the document): an evaluation source of another
     * kind than the training data would not be read at all. */
    if (final && e->data.eval.source != MR_SRC_NONE && e->data.eval.source != e->data.train.source)
        return perr(MR_ERR_INVALID, P("data.eval.source"), "data.eval.source: must be the training source's kind (%s) or none, "
                    "got %s (the trainer reads evaluation data of the training data's kind only); HINT: set "
                    "data.eval.source: %s with files of that kind, or leave data.eval out",
                    enum_name("data.train.source", e->data.train.source), enum_name("data.eval.source", e->data.eval.source),
                    enum_name("data.train.source", e->data.train.source));
    if (e->model.type == MR_MODEL_CNN && e->model.graph.n_input && e->model.graph.n_input != 3)
        return perr(MR_ERR_INVALID, P("model.input"), "model.input: a cnn takes [channels, height, width], got %d dims",
                    e->model.graph.n_input);
    mr_status ls = mr_cfg_check_layers(e, P("model.layers"));
    if (ls) return ls;
    if (e->model.type == MR_MODEL_GPT && e->model.embd % e->model.heads)
        return perr(MR_ERR_INVALID, P("model.embd"), "model.embd: must be a multiple of model.heads (%lld), got %lld", (long long)e->model.heads,
                    (long long)e->model.embd);
    if (e->train.batch % e->train.accumulate)
        return perr(MR_ERR_INVALID, P("train.batch"), "train.batch: must be a multiple of train.accumulate (%lld), got %lld",
                    (long long)e->train.accumulate, (long long)e->train.batch);
    /* schedule.warmup > train.steps is legal (the learning rate never reaches its peak): the
     * trainer warns about it */
    if (e->precision.loss_scale.min > e->precision.loss_scale.initial)
        return perr(MR_ERR_INVALID, P("precision.loss_scale.min"), "precision.loss_scale.min: must be <= initial (%g), got %g", e->precision.loss_scale.initial,
                    e->precision.loss_scale.min);
    if (e->train.early_stop.patience > 0) { /* counted in evaluations of a metric the model reports */
        const int lm = mr_model_task(&e->model) == MR_TASK_LM, m = e->train.early_stop.metric;
        if (e->data.eval.source == MR_SRC_NONE)
            return perr(MR_ERR_INVALID, P("train.early_stop.patience"), "train.early_stop.patience: early stopping needs "
                        "evaluation data; HINT: set data.eval, or drop train.early_stop");
        if (e->train.eval_every == 0)
            return perr(MR_ERR_INVALID, P("train.early_stop.patience"), "train.early_stop.patience counts evaluations, "
                        "but train.eval_every is 0 (only one, at the end); HINT: set train.eval_every");
        if ((m == 1 && lm) || (m == 2 && !lm))
            return perr(MR_ERR_INVALID, P("train.early_stop.metric"), "train.early_stop.metric: %s is not reported by a "
                        "%s; HINT: eval_loss, or %s", enum_name("train.early_stop.metric", m), lm ? "language model" : "classifier",
                        lm ? "eval_perplexity" : "eval_accuracy");
    }
    if (e->log.tensorboard && e->log.histogram_every % e->train.log_every) /* written at log steps */
        return perr(MR_ERR_INVALID, P("log.histogram_every"), "log.histogram_every: histograms are written at log "
                    "steps, so it must be a multiple of train.log_every (%lld), got %lld; HINT: log.histogram_every=%lld",
                    (long long)e->train.log_every, (long long)e->log.histogram_every,
                    (long long)((e->log.histogram_every / e->train.log_every + 1) * e->train.log_every));
    if (e->log.trace[0] > e->train.steps)
        return perr(MR_ERR_INVALID, P("log.trace"), "log.trace: the window starts at step %lld, after train.steps (%lld): "
                    "nothing would be traced; HINT: a window inside the run, e.g. log.trace=[%lld, %lld]",
                    (long long)e->log.trace[0], (long long)e->train.steps, (long long)(e->train.steps > 10 ? e->train.steps - 9 : 1),
                    (long long)e->train.steps);
    if (e->sweep.n_params && e->sweep.method == MR_SWEEP_NONE)
        return perr(MR_ERR_INVALID, P("sweep.method"), "sweep.method: missing required value (grid or random) for sweep.params");
    if (e->sweep.method != MR_SWEEP_NONE && !e->sweep.n_params)
        return perr(MR_ERR_INVALID, P("sweep.params"), "sweep.params: missing required value for method %s", enum_name("sweep.method", e->sweep.method));
    const int64_t max_steps = e->sweep.scheduler.max_steps ? e->sweep.scheduler.max_steps : e->train.steps;
    if (e->sweep.scheduler.type == MR_SCHED_ASHA && e->sweep.scheduler.min_steps > max_steps)
        return perr(MR_ERR_INVALID, P("sweep.scheduler.min_steps"), "sweep.scheduler.min_steps: the first rung (%lld steps) "
                    "is past the last (sweep.scheduler.max_steps or train.steps: %lld); HINT: min_steps=%lld",
                    (long long)e->sweep.scheduler.min_steps, (long long)max_steps,
                    (long long)(max_steps / e->sweep.scheduler.reduction > 0 ? max_steps / e->sweep.scheduler.reduction : 1));
    for (int i = 0; i < e->sweep.n_params; i++)
        if (e->sweep.method == MR_SWEEP_GRID && !e->sweep.params[i].n_values)
            return perr(MR_ERR_INVALID, P("sweep.params"), "sweep.params.%s: a {min, max} range needs method random (grid takes lists)",
                        e->sweep.params[i].key);
    return MR_OK;
}
#undef P

mr_status mr_experiment_check(const mr_experiment *e, const char *origin) {
    key_marks *km = marks_of_text(e->yaml_text);
    mr_status st = check_impl(e, origin, km, 1);
    free(km);
    return st;
}

mr_status mr_experiment_parse(const char *yaml_text, const char *name, mr_experiment *out) {
    mr_status st = MR_OK;
    yaml_parser_t parser;
    yaml_document_t doc;
    int have_doc = 0;
    key_marks *km = NULL;
    if (!name) name = "config";
    *out = mr_experiment_default();
    mr_experiment *e = malloc(sizeof *e);
    MR_CHECK(e && yaml_parser_initialize(&parser), MR_ERR_NOMEM, "%s: out of memory", name);
    *e = mr_experiment_default();
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml_text, strlen(yaml_text));
    if (!yaml_parser_load(&parser, &doc)) {
        pos p = at_mark(name, parser.problem_mark);
        if (parser.context)
            st = perr(MR_ERR_FORMAT, p, "YAML syntax error: %s %s (started at line %d)", parser.problem ? parser.problem : "", parser.context,
                      (int)parser.context_mark.line + 1);
        else st = perr(MR_ERR_FORMAT, p, "YAML syntax error: %s", parser.problem ? parser.problem : "unknown");
        yaml_parser_delete(&parser);
        goto fail;
    }
    have_doc = 1;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    km = calloc(1, sizeof *km);
    MR_CHECK(km != NULL, MR_ERR_NOMEM, "%s: out of memory", name);
    walker w = {&doc, name, 0, km};
    if (root) MR_TRY(walk(&w, e, root, ""));
    else {
        st = perr(MR_ERR_INVALID, (pos){name, 1, 1}, "the config is empty");
        goto fail_parser;
    }
    /* one document per file: a second one would be silently ignored */
    yaml_document_t doc2;
    if (yaml_parser_load(&parser, &doc2)) {
        int more = yaml_document_get_root_node(&doc2) != NULL;
        yaml_mark_t m = doc2.start_mark;
        yaml_document_delete(&doc2);
        if (more) { st = perr(MR_ERR_INVALID, at_mark(name, m), "more than one YAML document"); goto fail_parser; }
    }
    MR_TRY(check_impl(e, name, km, 0));
    MR_CHECK((e->yaml_text = strdup(yaml_text)) != NULL, MR_ERR_NOMEM, "%s: out of memory", name);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    *out = *e;
    free(e);
    free(km);
    return MR_OK;
fail_parser:
fail:
    if (have_doc) {
        yaml_document_delete(&doc);
        yaml_parser_delete(&parser);
    }
    free(e);
    free(km);
    return st;
}

mr_status mr_experiment_load(const char *path, mr_experiment *out) {
    mr_status st = MR_OK;
    char *buf = NULL;
    *out = mr_experiment_default();
    FILE *f = fopen(path, "rb");
    if (!f) return mr_set_error(errno == ENOENT ? MR_ERR_NOT_FOUND : MR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    MR_CHECK(fseek(f, 0, SEEK_END) == 0, MR_ERR_IO, "%s: cannot seek", path);
    long n = ftell(f);
    MR_CHECK(n >= 0 && fseek(f, 0, SEEK_SET) == 0, MR_ERR_IO, "%s: cannot read", path);
    MR_CHECK((buf = malloc((size_t)n + 1)) != NULL, MR_ERR_NOMEM, "%s: out of memory", path);
    MR_CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n, MR_ERR_IO, "%s: short read", path);
    buf[n] = '\0';
    MR_CHECK(strlen(buf) == (size_t)n, MR_ERR_FORMAT, "%s: contains a NUL byte", path);
    MR_TRY(mr_experiment_parse(buf, path, out));
fail:
    fclose(f);
    free(buf);
    return st;
}

mr_status mr_experiment_set(mr_experiment *e, const char *assignment) {
    mr_status st = MR_OK;
    const char *eq = strchr(assignment, '=');
    pos p = {"--set", 0, 1};
    if (!eq || eq == assignment) return perr(MR_ERR_INVALID, p, "expected key=value, got '%s'", assignment);
    char key[256];
    size_t kl = (size_t)(eq - assignment);
    if (kl >= sizeof key) return perr(MR_ERR_INVALID, p, "key too long in '%s'", assignment);
    memcpy(key, assignment, kl);
    key[kl] = '\0';
    const field *f = mr_cfg_find_field(key);
    int is_param = !f && !strncmp(key, "sweep.params.", 13) && key[13];
    if (!f && !is_param) {
        const char *s = suggest_path(key);
        if (is_section(key)) return perr(MR_ERR_INVALID, p, "'%s' is a section; set one of its keys (%s.KEY=value)", key, key);
        if (s) return perr(MR_ERR_INVALID, p, "unknown key '%s' (did you mean '%s'?)", key, s);
        return perr(MR_ERR_INVALID, p, "unknown key '%s'", key);
    }
    const char *val = eq + 1;
    yaml_parser_t parser;
    yaml_document_t doc;
    mr_experiment *tmp = malloc(sizeof *tmp);
    if (!tmp || !yaml_parser_initialize(&parser)) {
        free(tmp);
        return mr_set_error(MR_ERR_NOMEM, "--set: out of memory");
    }
    memcpy(tmp, e, sizeof *tmp);
    yaml_parser_set_input_string(&parser, (const unsigned char *)val, strlen(val));
    if (!yaml_parser_load(&parser, &doc)) {
        st = perr(MR_ERR_FORMAT, (pos){"--set", 0, (int)(kl + 2 + parser.problem_mark.column)}, "%s: YAML syntax error in the value: %s",
                  key, parser.problem ? parser.problem : "unknown");
        yaml_parser_delete(&parser);
        free(tmp);
        return st;
    }
    walker w = {&doc, "--set", 1, NULL};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) st = f ? mr_cfg_set_scalar(tmp, f, "", p) : perr(MR_ERR_INVALID, p, "%s: missing value", key);
    else if (is_param) st = set_param(&w, tmp, key + 13, p, root);
    else st = set_node(&w, tmp, f, root);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    if (st == MR_OK) {
        tmp->yaml_text = e->yaml_text;
        int i = (int)((f ? f : mr_cfg_find_field("sweep.params")) - FIELDS);
        tmp->overridden[i / 8] |= (unsigned char)(1u << (i % 8));
        memcpy(e, tmp, sizeof *e);
    }
    free(tmp);
    return st;
}
