/* Which keys of the experiment config apply to the choices made (launch/config_impl.h): a key
 * that has no effect for the chosen model, optimizer, schedule, precision or data source is an
 * error when given (config.c) and is left out of config.yaml and the hash (config_out.c). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "launch/config_impl.h"

/* ---- which keys apply -------------------------------------------------------------------------- */

/* The value names of an enum key, from the key table (config.c). */
static const char *const *names_of(const char *key) { return mr_cfg_find_field(key)->names; }

/* Is `leaf` one of the space-separated words of `list`? */
static int in_list(const char *list, const char *leaf) {
    size_t n = strlen(leaf);
    for (const char *p = list; (p = strstr(p, leaf)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

/* Each rule: keys (leaves under a section) that only a choice of a selector key uses. */
static int unused_by(const char *leaf, const char *keys, const char *const *names, int chosen, const char *users,
                     const char *selector, char *why, size_t cap) {
    if (!in_list(keys, leaf) || in_list(users, names[chosen])) return 0;
    snprintf(why, cap, "with %s %s (only %s use%s it)", selector, names[chosen], users, strchr(users, ' ') ? "" : "s");
    return 1;
}

int mr_cfg_unused(const mr_experiment *e, const field *f, char *why, size_t cap) {
    const char *path = f->path, *leaf = strrchr(path, '.');
    leaf = leaf ? leaf + 1 : path;
    why[0] = '\0';
    if (!strncmp(path, "model.", 6)) {
        int t = (int)e->model.type;
        const char *const *types = names_of("model.type");
        if (e->model.type == MR_MODEL_GRAPH && !e->model.graph.tokens && (!strcmp(leaf, "vocab") || !strcmp(leaf, "context"))) {
            snprintf(why, cap, "with model.input %s (only a language model, model.input: tokens, uses it)",
                     e->model.graph.n_input ? "a sample shape" : "not given");
            return 1;
        }
        return unused_by(leaf, "sizes", types, t, "mlp", "model.type", why, cap) ||
               unused_by(leaf, "channels hidden classes", types, t, "cnn", "model.type", why, cap) ||
               unused_by(leaf, "input", types, t, "cnn graph", "model.type", why, cap) ||
               unused_by(leaf, "vocab context layers", types, t, "gpt graph", "model.type", why, cap) ||
               unused_by(leaf, "heads embd dropout", types, t, "gpt", "model.type", why, cap);
    }
    if (!strcmp(path, "data.train.augment") &&
        (e->model.type == MR_MODEL_MLP || e->model.type == MR_MODEL_GPT || (e->model.type == MR_MODEL_GRAPH && e->model.graph.tokens))) {
        snprintf(why, cap, "with model.type %s (only image models use it: cnn, or graph with model.input [C, H, W])",
                 names_of("model.type")[e->model.type]);
        return 1;
    }
    if (!strncmp(path, "data.", 5)) {
        const int train = !strncmp(path, "data.train.", 11);
        const mr_data_cfg *d = train ? &e->data.train : &e->data.eval;
        const char *sel = train ? "data.train.source" : "data.eval.source";
        int s = (int)d->source;
        if (!strcmp(leaf, "source")) return 0;
        if (!strcmp(leaf, "seed")) {
            snprintf(why, cap, "(the shuffle is seeded by the top-level seed)");
            return 1;
        }
        if (!train && !strcmp(leaf, "shuffle")) {
            snprintf(why, cap, "(evaluation reads its data in order)");
            return 1;
        }
        if (!train && !strcmp(leaf, "token_bytes")) { /* the evaluation source is of the training kind */
            snprintf(why, cap, "(evaluation tokens are read with data.train.token_bytes)");
            return 1;
        }
        if (d->source == MR_SRC_NONE) {
            snprintf(why, cap, "with %s none", sel);
            return 1;
        }
        return unused_by(leaf, "images labels", names_of("data.train.source"), s, "idx npy", sel, why, cap) ||
               unused_by(leaf, "path", names_of("data.train.source"), s, "tokens text hdf5 npy tfrecord", sel, why, cap) ||
               unused_by(leaf, "x_dataset y_dataset", names_of("data.train.source"), s, "hdf5 npy", sel, why, cap) ||
               unused_by(leaf, "key dtype shape", names_of("data.train.source"), s, "tfrecord", sel, why, cap) ||
               unused_by(leaf, "context", names_of("data.train.source"), s, "tokens text", sel, why, cap) ||
               unused_by(leaf, "token_bytes", names_of("data.train.source"), s, "tokens", sel, why, cap) ||
               unused_by(leaf, "augment", names_of("data.train.source"), s, "idx hdf5 npy tfrecord", sel, why, cap);
    }
    if (!strncmp(path, "optimizer.", 10)) {
        int t = (int)e->optimizer.type;
        return unused_by(leaf, "momentum nesterov", names_of("optimizer.type"), t, "sgd", "optimizer.type", why, cap) ||
               unused_by(leaf, "beta1 beta2 eps", names_of("optimizer.type"), t, "adam adamw", "optimizer.type", why, cap);
    }
    if (!strncmp(path, "schedule.", 9)) {
        int t = (int)e->schedule.type;
        return unused_by(leaf, "step_size gamma", names_of("schedule.type"), t, "step", "schedule.type", why, cap) ||
               unused_by(leaf, "min_lr", names_of("schedule.type"), t, "cosine linear", "schedule.type", why, cap);
    }
    if (!strncmp(path, "precision.loss_scale.", 21))
        return unused_by(leaf, leaf, names_of("precision.policy"), (int)e->precision.policy, "mixed_float16", "precision.policy", why, cap);
    if (!strcmp(path, "log.histogram_every") && !e->log.tensorboard) {
        snprintf(why, cap, "with log.tensorboard false (histograms go to TensorBoard)");
        return 1;
    }
    if (!strncmp(path, "train.early_stop.", 17) && strcmp(path, "train.early_stop.patience") &&
        e->train.early_stop.patience == 0) {
        snprintf(why, cap, "with train.early_stop.patience 0 (early stopping off)");
        return 1;
    }
    if (!strcmp(path, "log.trace_ops") && e->log.trace[0] == 0) {
        snprintf(why, cap, "without a log.trace window (per-op spans are part of the trace)");
        return 1;
    }
    if (!strncmp(path, "sweep.", 6)) {
        int m = (int)e->sweep.method;
        return unused_by(leaf, "trials seed", names_of("sweep.method"), m, "random", "sweep.method", why, cap) ||
               unused_by(leaf, "metric goal", names_of("sweep.method"), m, "grid random", "sweep.method", why, cap);
    }
    return 0;
}

/* The key whose value decides whether f applies ("model.type"), or NULL. */
const char *mr_cfg_selector_of(const field *f) {
    static const char *const sel[][2] = {{"model.", "model.type"}, {"data.train.", "data.train.source"},
                                         {"data.eval.", "data.eval.source"}, {"optimizer.", "optimizer.type"},
                                         {"schedule.", "schedule.type"}, {"precision.loss_scale.", "precision.policy"},
                                         {"sweep.", "sweep.method"}, {"log.histogram_every", "log.tensorboard"},
                                         {"log.trace_ops", "log.trace"},
                                         {"train.early_stop.metric", "train.early_stop.patience"},
                                         {"train.early_stop.mode", "train.early_stop.patience"},
                                         {"train.early_stop.min_delta", "train.early_stop.patience"}};
    for (size_t i = 0; i < sizeof sel / sizeof sel[0]; i++)
        if (!strncmp(f->path, sel[i][0], strlen(sel[i][0]))) return sel[i][1];
    return NULL;
}

/* Does e's sweep vary the key that decides whether f applies (then f may apply to some trials)? */
int mr_cfg_selector_swept(const mr_experiment *e, const field *f) {
    const char *s = mr_cfg_selector_of(f);
    for (int i = 0; s && i < e->sweep.n_params; i++)
        if (!strcmp(e->sweep.params[i].key, s)) return 1;
    return 0;
}
