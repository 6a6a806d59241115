/* Early stopping (train/train.h: early_stop_*), as Keras' EarlyStopping: after every evaluation
 * the metric either improves on the best so far by more than min_delta (in the mode's direction)
 * and resets the count, or counts one more evaluation without improvement; at patience the run
 * stops. The state is the trainer's (es_best, es_best_step, es_bad) and goes into checkpoints. */
#include "train/train_impl.h"

#include <math.h>
#include <stdio.h>

static const char *const METRICS[] = {"eval_loss", "eval_accuracy", "eval_perplexity"};

static double metric_of(const trainer *t, const mr_train_result *r) {
    const int m = t->c.early_stop_metric;
    return m == 1 ? r->eval_accuracy : m == 2 ? r->eval_perplexity : r->eval_loss;
}

/* Upwards: accuracy under mode auto, or mode max. */
static int upwards(const trainer *t) {
    return t->c.early_stop_mode == 2 || (t->c.early_stop_mode == 0 && t->c.early_stop_metric == 1);
}

int tr_early_stop_update(trainer *t, const mr_train_result *res) {
    if (t->c.early_stop_patience <= 0) return 0;
    const double v = metric_of(t, res), d = t->c.early_stop_min_delta;
    /* a non-finite value never improves; the first finite one always does */
    const int better = isfinite(v) && (isnan(t->es_best) || (upwards(t) ? v - d > t->es_best : v + d < t->es_best));
    if (better) {
        t->es_best = v;
        t->es_best_step = t->step;
        t->es_bad = 0;
    } else {
        t->es_bad++;
    }
    return tr_early_stopped(t);
}

int tr_early_stopped(const trainer *t) {
    return t->c.early_stop_patience > 0 && t->es_bad >= t->c.early_stop_patience;
}

void tr_early_stop_message(const trainer *t, char *buf, size_t cap) {
    const char *name = METRICS[t->c.early_stop_metric];
    snprintf(buf, cap, "early stopping at step %lld: %s did not %s on its best, %.6g at step %lld, by more than %g "
             "in %lld evaluations (train.early_stop.patience)", (long long)t->step, name,
             upwards(t) ? "rise" : "fall", t->es_best, (long long)t->es_best_step, t->c.early_stop_min_delta,
             (long long)t->es_bad);
}
