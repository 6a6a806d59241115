/* The resolved config's way out: to_yaml (every table key that applies to the experiment's
 * choices, in table order, so the text is complete and canonical), the hash over that text, and sweep expansion (trials get their values
 * through the same setter as --set). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/math/philox_math.h"
#include "launch/config_impl.h"

#define find_field mr_cfg_find_field
#define set_scalar mr_cfg_set_scalar
#define FIELDS mr_cfg_fields
#define N_FIELDS mr_cfg_n_fields

/* ---- to_yaml and hash ------------------------------------------------------------------------- */

typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) MR_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = 1; return; }
        if (b->p && b->n + (size_t)k < b->cap) { b->n += (size_t)k; return; }
        size_t nc = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
        char *q = realloc(b->p, nc);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = nc;
    }
}

/* Shortest %g that reads back to the same double. */
static void fmt_num(char *buf, size_t cap, double x) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        double ax = fabs(x);
        int plain_range = ax == 0 || (ax >= 1e-5 && ax < 1e16);
        if (strtod(buf, NULL) == x && !(plain_range && strchr(buf, 'e'))) break;
    }
    if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

static void sb_quoted(sbuf *b, const char *s) {
    sb_printf(b, "'");
    for (; *s; s++) {
        if (*s == '\'') sb_printf(b, "''");
        else sb_printf(b, "%c", *s);
    }
    sb_printf(b, "'");
}

static void emit_input(sbuf *b, const mr_layer_graph *g) {
    if (g->tokens) {
        sb_printf(b, "tokens");
        return;
    }
    sb_printf(b, "[");
    for (int i = 0; i < g->n_input; i++) sb_printf(b, "%s%lld", i ? ", " : "", (long long)g->input[i]);
    sb_printf(b, "]");
}

/* ", " before every argument but the first. */
static void arg_sep(sbuf *b, int *n) { sb_printf(b, "%s", (*n)++ ? ", " : ""); }

/* key: a number that parses back to the same double. */
static void emit_num(sbuf *b, int *n, const char *key, double v) {
    char num[64];
    fmt_num(num, sizeof num, v);
    arg_sep(b, n);
    sb_printf(b, "%s: %s", key, num);
}

/* Layers [first, first + n) in flow style, only the arguments that differ from the defaults. */
static void emit_layers(sbuf *b, const mr_layer_graph *g, int32_t first, int32_t n) {
    sb_printf(b, "[");
    for (int32_t i = 0; i < n; i++) {
        const mr_layer *l = &g->l[first + i], d = mr_layer_default(l->kind);
        sb_printf(b, "%s{%s: {", i ? ", " : "", mr_layer_kind_name(l->kind));
        int na = 0;
        const int64_t iv[] = {l->out, l->kernel, l->stride, l->pad, l->vocab, l->dim, l->context, l->heads, l->mlp, l->times};
        const int64_t dv[] = {d.out, d.kernel, d.stride, d.pad, d.vocab, d.dim, d.context, d.heads, d.mlp, d.times};
        static const char *const in[] = {"out", "kernel", "stride", "pad", "vocab", "dim", "context", "heads", "mlp", "times"};
        for (int k = 0; k < 10; k++)
            if (iv[k] != dv[k]) arg_sep(b, &na), sb_printf(b, "%s: %lld", in[k], (long long)iv[k]);
        if (l->bias != d.bias) arg_sep(b, &na), sb_printf(b, "bias: %s", l->bias ? "true" : "false");
        if (l->affine != d.affine) arg_sep(b, &na), sb_printf(b, "affine: %s", l->affine ? "true" : "false");
        if (l->sync != d.sync) arg_sep(b, &na), sb_printf(b, "sync: %s", l->sync ? "true" : "false");
        if (l->p != d.p) emit_num(b, &na, l->kind == MR_LAYER_TRANSFORMER ? "dropout" : "p", l->p);
        if (l->eps != d.eps) emit_num(b, &na, "eps", l->eps);
        if (l->momentum != d.momentum) emit_num(b, &na, "momentum", l->momentum);
        if (l->std != d.std) emit_num(b, &na, "std", l->std);
        if (l->tied[0]) arg_sep(b, &na), sb_printf(b, "tied: "), sb_quoted(b, l->tied);
        if (l->n_shape) {
            arg_sep(b, &na), sb_printf(b, "shape: [");
            for (int k = 0; k < l->n_shape; k++) sb_printf(b, "%s%lld", k ? ", " : "", (long long)l->shape[k]);
            sb_printf(b, "]");
        }
        if (l->n_body) arg_sep(b, &na), sb_printf(b, "body: "), emit_layers(b, g, l->body, l->n_body);
        if (l->n_shortcut) arg_sep(b, &na), sb_printf(b, "shortcut: "), emit_layers(b, g, l->shortcut, l->n_shortcut);
        sb_printf(b, "}");
        if (l->name[0]) {
            sb_printf(b, ", name: ");
            sb_quoted(b, l->name);
        }
        sb_printf(b, "}");
    }
    sb_printf(b, "]");
}

static void emit_value(sbuf *b, const mr_experiment *e, const field *f) {
    const char *base = (const char *)e + f->off;
    char num[64];
    switch (f->k) {
    case K_INT:
        if (f->off == offsetof(mr_experiment, model.layers) && e->model.type == MR_MODEL_GRAPH) {
            emit_layers(b, &e->model.graph, e->model.graph.top, e->model.graph.n_top);
            break;
        }
        { int64_t v; memcpy(&v, base, sizeof v); sb_printf(b, "%lld", (long long)v); break; }
    case K_NUM: { double v; memcpy(&v, base, sizeof v); fmt_num(num, sizeof num, v); sb_printf(b, "%s", num); break; }
    case K_BOOL: { int v; memcpy(&v, base, sizeof v); sb_printf(b, "%s", v ? "true" : "false"); break; }
    case K_ENUM: { int v; memcpy(&v, base, sizeof v); sb_printf(b, "%s", f->names[v]); break; }
    case K_STR:
        if (!strchr(base, '\n')) { sb_quoted(b, base); break; }
        sb_printf(b, "["); /* a list of data files (config_data.c) */
        for (const char *q = base; *q; q += strcspn(q, "\n") + (q[strcspn(q, "\n")] != 0)) {
            char one[MR_CFG_PATH_MAX];
            snprintf(one, sizeof one, "%.*s", (int)strcspn(q, "\n"), q);
            sb_printf(b, "%s", q == base ? "" : ", ");
            sb_quoted(b, one);
        }
        sb_printf(b, "]");
        break;
    case K_SIZES:
        sb_printf(b, "[");
        for (int i = 0; i < e->model.n_sizes; i++) sb_printf(b, "%s%lld", i ? ", " : "", (long long)e->model.sizes[i]);
        sb_printf(b, "]");
        break;
    case K_CHANNELS: sb_printf(b, "[%lld, %lld]", (long long)e->model.ch1, (long long)e->model.ch2); break;
    case K_INPUT:
        if (e->model.type == MR_MODEL_GRAPH) emit_input(b, &e->model.graph);
        else sb_printf(b, "[%lld, %lld, %lld]", (long long)e->model.in_channels, (long long)e->model.height, (long long)e->model.width);
        break;
    case K_DEVICES:
        if (!e->distribute.n_devices) { sb_printf(b, "auto"); break; }
        sb_printf(b, "[");
        for (int i = 0; i < e->distribute.n_devices; i++) { sb_printf(b, "%s", i ? ", " : ""); sb_quoted(b, e->distribute.devices[i]); }
        sb_printf(b, "]");
        break;
    case K_AUGMENT: {
        char t[4096];
        mr_cfg_augment_text((const mr_augment_cfg *)base, t, sizeof t);
        sb_printf(b, "%s", t);
        break;
    }
    case K_SHAPE: {
        mr_cfg_shape s;
        memcpy(&s, base, sizeof s);
        sb_printf(b, "[");
        for (int64_t i = 0; i < s.n; i++) sb_printf(b, "%s%lld", i ? ", " : "", (long long)s.dim[i]);
        sb_printf(b, "]");
        break;
    }
    case K_WINDOW: {
        int64_t v[2];
        memcpy(v, base, sizeof v);
        if (v[0] > 0) sb_printf(b, "[%lld, %lld]", (long long)v[0], (long long)v[1]);
        else sb_printf(b, "none");
        break;
    }
    case K_PARAMS:
        if (!e->sweep.n_params) { sb_printf(b, "{}"); break; }
        for (int i = 0; i < e->sweep.n_params; i++) {
            const mr_sweep_param *sp = &e->sweep.params[i];
            sb_printf(b, "\n    ");
            sb_quoted(b, sp->key);
            if (sp->n_values) {
                sb_printf(b, ": [");
                for (int j = 0; j < sp->n_values; j++) { sb_printf(b, "%s", j ? ", " : ""); sb_quoted(b, sp->values[j]); }
                sb_printf(b, "]");
            } else {
                char lo[64], hi[64];
                fmt_num(lo, sizeof lo, sp->min);
                fmt_num(hi, sizeof hi, sp->max);
                sb_printf(b, ": {min: %s, max: %s, log: %s}", lo, hi, sp->log ? "true" : "false");
            }
        }
        break;
    }
}

mr_status mr_experiment_to_yaml(const mr_experiment *e, char **yaml_out) {
    sbuf b = {0};
    const char *prev = "";
    sb_printf(&b, "# mirror experiment (resolved)\n");
    char why[160];
    for (int i = 0; i < N_FIELDS; i++) {
        const char *path = FIELDS[i].path;
        if (mr_cfg_unused(e, &FIELDS[i], why, sizeof why)) continue; /* only what the run uses */
        /* shared leading sections with the previous key (both end at a dot) */
        size_t common = 0;
        for (size_t j = 0; path[j] && path[j] == prev[j]; j++)
            if (path[j] == '.') common = j + 1;
        int depth = 0;
        for (size_t j = 0; j < common; j++) depth += path[j] == '.';
        const char *s = path + common;
        for (const char *dot; (dot = strchr(s, '.')); s = dot + 1, depth++)
            sb_printf(&b, "%*s%.*s:\n", 2 * depth, "", (int)(dot - s), s);
        sb_printf(&b, "%*s%s:%s", 2 * depth, "", s, FIELDS[i].k == K_PARAMS && e->sweep.n_params ? "" : " ");
        emit_value(&b, e, &FIELDS[i]);
        sb_printf(&b, "\n");
        prev = path;
    }
    if (b.oom) {
        free(b.p);
        return mr_set_error(MR_ERR_NOMEM, "config: out of memory writing YAML");
    }
    *yaml_out = b.p;
    return MR_OK;
}

mr_status mr_experiment_hash(const mr_experiment *e, uint64_t *out) {
    char *y;
    mr_status st = mr_experiment_to_yaml(e, &y);
    if (st) return st;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)y; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    free(y);
    *out = h;
    return MR_OK;
}

/* ---- sweeps ----------------------------------------------------------------------------------- */

static double unit53(uint64_t seed, uint64_t trial, int word) {
    uint64_t a = mr_philox_u32(seed, trial, (uint64_t)word * 2) >> 5, b = mr_philox_u32(seed, trial, (uint64_t)word * 2 + 1) >> 6;
    return (double)(a * 67108864.0 + (double)b) * (1.0 / 9007199254740992.0);
}

static mr_status apply_value(mr_experiment *t, const char *key, const char *text, int trial) {
    const field *f = find_field(key);
    char where[64];
    snprintf(where, sizeof where, "sweep trial %d", trial);
    return set_scalar(t, f, text, (pos){where, 0, 1});
}

void mr_sweep_free(mr_experiment *trials, int n) {
    if (!trials) return;
    for (int i = 0; i < n; i++) free(trials[i].yaml_text);
    free(trials);
}

mr_status mr_sweep_expand(const mr_experiment *base, mr_experiment **trials, int *n) {
    mr_status st = MR_OK;
    mr_experiment *t = NULL;
    int made = 0;
    *trials = NULL;
    *n = 0;
    const int np = base->sweep.n_params;
    MR_CHECK(base->sweep.method != MR_SWEEP_NONE && np > 0, MR_ERR_INVALID, "sweep: the config has no sweep (method and params)");
    int64_t count = 1;
    if (base->sweep.method == MR_SWEEP_GRID) {
        for (int p = 0; p < np; p++) {
            MR_CHECK(base->sweep.params[p].n_values > 0, MR_ERR_INVALID, "sweep.params.%s: grid needs a list of values",
                     base->sweep.params[p].key);
            count *= base->sweep.params[p].n_values;
            MR_CHECK(count <= MR_SWEEP_MAX_TRIALS, MR_ERR_INVALID, "sweep: the grid has more than %d trials", MR_SWEEP_MAX_TRIALS);
        }
    } else {
        count = base->sweep.trials;
        MR_CHECK(count <= MR_SWEEP_MAX_TRIALS, MR_ERR_INVALID, "sweep.trials: must be <= %d, got %lld", MR_SWEEP_MAX_TRIALS,
                 (long long)count);
    }
    MR_CHECK((t = calloc((size_t)count, sizeof *t)) != NULL, MR_ERR_NOMEM, "sweep: out of memory for %lld trials", (long long)count);
    for (int64_t i = 0; i < count; i++) {
        MR_TRY(mr_experiment_copy(&t[i], base));
        made++;
        mr_experiment *x = &t[i];
        x->sweep.method = MR_SWEEP_NONE;
        x->sweep.n_params = 0;
        memset(x->sweep.params, 0, sizeof x->sweep.params);
        int64_t rest = i;
        for (int p = np - 1; p >= 0; p--) {
            const mr_sweep_param *sp = &base->sweep.params[p];
            char text[64];
            if (base->sweep.method == MR_SWEEP_GRID) {
                snprintf(text, sizeof text, "%s", sp->values[rest % sp->n_values]);
                rest /= sp->n_values;
            } else {
                double u = unit53((uint64_t)base->sweep.seed, (uint64_t)i, p);
                if (sp->n_values) {
                    int k = (int)(u * sp->n_values);
                    snprintf(text, sizeof text, "%s", sp->values[k < sp->n_values ? k : sp->n_values - 1]);
                } else if (find_field(sp->key)->k == K_INT) {
                    double v = sp->log ? exp(log(sp->min) + u * (log(sp->max + 1) - log(sp->min))) : sp->min + u * (sp->max - sp->min + 1);
                    int64_t iv = (int64_t)floor(v);
                    if (iv > (int64_t)sp->max) iv = (int64_t)sp->max;
                    snprintf(text, sizeof text, "%lld", (long long)iv);
                } else {
                    double v = sp->log ? exp(log(sp->min) + u * (log(sp->max) - log(sp->min))) : sp->min + u * (sp->max - sp->min);
                    if (v < sp->min) v = sp->min;
                    if (v > sp->max) v = sp->max;
                    snprintf(text, sizeof text, "%.17g", v);
                }
            }
            MR_TRY(apply_value(x, sp->key, text, (int)i));
        }
    }
    *trials = t;
    *n = (int)count;
    return MR_OK;
fail:
    mr_sweep_free(t, made);
    return st;
}
