/* The trainer's TensorBoard output (train/tb.h), replica 0 only: <run_dir>/tb/events.out.tfevents.*
 * with every number of metrics.jsonl (the same values: both are written from one tr_metrics),
 * the resolved config as text, and histograms of parameters and gradients every
 * histogram_every steps.
 *
 * Tags: train/{loss, lr, loss_scale, skipped_steps, samples_per_s, tokens_per_s},
 * step_time/{data_wait_s, forward_s, backward_s, communication_s, communication_hidden,
 * optimizer_s}, eval/{loss, accuracy | perplexity}, params/<name>, grads/<name>, config. A tag's
 * metrics.jsonl key is its last part ("eval/" becomes "eval_"). */
#include "train/train_impl.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"

mr_status tr_tb_open(trainer *t, int64_t start_step, mr_tb **out) {
    mr_status st = MR_OK;
    const mr_train_cfg *c = &t->c;
    char dir[4200];
    *out = NULL;
    if (!c->tensorboard || !c->run_dir || t->rank != 0) return MR_OK;
    snprintf(dir, sizeof dir, "%s/tb", c->run_dir);
    MR_TRY(mr_tb_open(dir, start_step, out));
    if (c->config_text) { /* markdown: the YAML as a code block, at the first step this run logs */
        size_t n = strlen(c->config_text) + 32;
        char *md = malloc(n);
        MR_CHECK(md != NULL, MR_ERR_NOMEM, "trainer: out of memory for the config text");
        snprintf(md, n, "```yaml\n%s\n```", c->config_text);
        st = mr_tb_text(*out, start_step + 1, "config", md);
        free(md);
        MR_TRY(st);
    }
    MR_TRY(mr_tb_flush(*out));
    if (c->histogram_every > 0 && t->zero && !c->quiet)
        mr_log_info("TensorBoard: no gradient histograms with distribute.shard_optimizer (each replica holds 1/%d "
                    "of the averaged gradient); parameter histograms are written", t->world);
fail:
    if (st != MR_OK) {
        mr_tb_close(*out);
        *out = NULL;
    }
    return st;
}

/* Histograms of every parameter and its gradient. On the device path each gradient is copied to
 * a host buffer the size of the largest parameter, made at the first histogram and kept. */
static mr_status histograms(trainer *t, mr_tb *tb, int64_t step) {
    mr_status st = MR_OK;
    const mr_params *ps = t->ps;
    MR_TRY(tr_dev_pull(t)); /* the parameters into the registry */
    const float *g = t->acc ? t->acc : t->grads;
    if (t->dv.on && !t->zero && !t->tb_grad) {
        int64_t most = 0;
        for (int32_t i = 0; i < mr_params_count(ps); i++)
            if (mr_params_numel(ps, i) > most) most = mr_params_numel(ps, i);
        t->tb_grad = malloc((size_t)(most > 0 ? most : 1) * sizeof *t->tb_grad);
        MR_CHECK(t->tb_grad != NULL, MR_ERR_NOMEM, "trainer: out of memory for gradient histograms");
    }
    char tag[300];
    for (int32_t i = 0; i < mr_params_count(ps); i++) {
        const char *name = mr_params_name(ps, i);
        const int64_t k = mr_params_numel(ps, i), off = mr_params_offset(ps, i);
        snprintf(tag, sizeof tag, "params/%s", name);
        MR_TRY(mr_tb_histogram(tb, step, tag, mr_params_data(ps, i), k));
        if (t->zero) continue;
        const float *gi = g + off;
        if (t->dv.on) { /* the gradient is in the device's memory */
            MR_TRY(t->gbe->copy(t->gdev.index, t->tb_grad, gi, (size_t)k * sizeof *t->tb_grad,
                                t->gdev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_D2H, t->stream));
            MR_TRY(tr_dev_sync(&t->dv, "a gradient histogram's values"));
            gi = t->tb_grad;
        }
        snprintf(tag, sizeof tag, "grads/%s", name);
        MR_TRY(mr_tb_histogram(tb, step, tag, gi, k));
    }
fail:
    return st;
}

mr_status tr_tb_step(trainer *t, mr_tb *tb, const tr_metrics *m) {
    mr_status st = MR_OK;
    const char *tags[16] = {"train/loss", "train/lr", "train/loss_scale", "train/skipped_steps", "train/samples_per_s",
                            "step_time/data_wait_s", "step_time/forward_s", "step_time/backward_s",
                            "step_time/communication_s", "step_time/communication_hidden", "step_time/optimizer_s",
                            "train/tokens_per_s"};
    const double v[16] = {m->loss, m->lr, m->loss_scale, (double)m->skipped, m->samples_per_s, m->data, m->fwd,
                          m->bwd, m->comm, m->hidden, m->opt, m->tokens_per_s};
    MR_TRY(mr_tb_scalars(tb, m->step, m->tokens_per_s > 0 ? 12 : 11, tags, v));
    if (t->c.histogram_every > 0 && m->step % t->c.histogram_every == 0) MR_TRY(histograms(t, tb, m->step));
    MR_TRY(mr_tb_flush(tb));
fail:
    return st;
}

mr_status tr_tb_eval(mr_tb *tb, int64_t step, int classify, const mr_train_result *r) {
    mr_status st = MR_OK;
    const char *tags[2] = {"eval/loss", classify ? "eval/accuracy" : "eval/perplexity"};
    const double v[2] = {r->eval_loss, classify ? r->eval_accuracy : r->eval_perplexity};
    MR_TRY(mr_tb_scalars(tb, step, 2, tags, v));
    MR_TRY(mr_tb_flush(tb));
fail:
    return st;
}
