/* The training loop (see trainer.h). */
#include "launch/trainer.h"
#include "autodiff/steps.h"
#include "core/log.h"
#include "data/data.h"
#include "core/math/philox_math.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

mr_train_cfg mr_train_cfg_default(void) {
    mr_train_cfg c;
    memset(&c, 0, sizeof c);
    c.model = mr_model_cfg_default(MR_MODEL_CNN);
    c.optim = mr_optim_cfg_default(MR_OPTIM_ADAMW);
    c.schedule.kind = MR_SCHEDULE_CONSTANT;
    c.steps = 1000;
    c.batch = 128;
    c.accumulate = 1;
    c.log_every = 50;
    c.seed = 1;
    c.token_bytes = 2;
    c.shuffle = 10000;
    return c;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- data ------------------------------------------------------------------------------------- */

/* u8 image (H,W) -> f32 x in [0,1], shaped (1,H,W) for the CNN or (H*W) for the MLP (the same
 * bytes); the label passes through. */
static mr_status normalize_image(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)index;
    (void)epoch;
    const int64_t n = *(const int64_t *)ctx;
    const uint8_t *img = in[0];
    float *x = out[0];
    for (int64_t i = 0; i < n; i++) x[i] = (float)img[i] * (1.0f / 255.0f);
    memcpy(out[1], in[1], sizeof(int32_t));
    return MR_OK;
}

typedef struct pipeline {
    mr_dataset *ds;
    mr_data_iter *it;
} pipeline;

static void pipeline_free(pipeline *p) {
    mr_data_iter_free(p->it);
    mr_data_free(p->ds);
    memset(p, 0, sizeof *p);
}

/* Runs a transform of ds into next and makes it the new ds (dropping the old reference). */
#define THEN(call)                                                                                  \
    do {                                                                                            \
        MR_TRY(call);                                                                               \
        mr_data_free(ds);                                                                           \
        ds = next;                                                                                  \
        next = NULL;                                                                                \
    } while (0)

/* images (IDX) for mlp/cnn, tokens for gpt; training pipelines shuffle and repeat forever and
 * drop the last partial batch; evaluation pipelines see every element once. */
static mr_status make_pipeline(const mr_train_cfg *c, int train, int64_t batch, int64_t *image_numel, pipeline *p) {
    mr_status st = MR_OK;
    mr_dataset *ds = NULL, *next = NULL;
    memset(p, 0, sizeof *p);
    if (c->model.type == MR_MODEL_GPT && (c->train_text || c->eval_text)) {
        const char *path = train ? c->train_text : c->eval_text;
        MR_TRY(mr_data_from_text(path, c->model.context, MR_DATA_TEXT_CHARS, &ds));
        if (c->train_text && c->eval_text && !strcmp(c->train_text, c->eval_text))
            THEN(train ? mr_data_skip(ds, MR_TEXT_HOLDOUT, &next) : mr_data_take(ds, MR_TEXT_HOLDOUT, &next));
    } else if (c->model.type == MR_MODEL_GPT) {
        const char *path = train ? c->train_tokens : c->eval_tokens;
        MR_TRY(mr_data_from_tokens(path, c->token_bytes, c->model.context, MR_DATA_TOKENS_RAW, &ds));
    } else {
        MR_TRY(mr_data_from_idx(train ? c->train_images : c->eval_images, train ? c->train_labels : c->eval_labels, &ds));
        const mr_data_spec *in = mr_data_element_spec(ds);
        *image_numel = mr_shape_numel(&in->comp[0].shape);
        mr_data_spec out;
        memset(&out, 0, sizeof out);
        mr_shape xs = c->model.type == MR_MODEL_CNN
                          ? mr_shape_3d(1, in->comp[0].shape.dim[0], in->comp[0].shape.dim[1])
                          : mr_shape_1d(*image_numel);
        mr_shape ls = mr_shape_make(0, NULL);
        MR_TRY(mr_data_spec_add(&out, "x", MR_F32, &xs));
        MR_TRY(mr_data_spec_add(&out, "label", MR_I32, &ls));
        if (train && c->shuffle > 0) THEN(mr_data_shuffle(ds, c->shuffle, c->seed, 1, &next));
        if (train) THEN(mr_data_repeat(ds, -1, &next));
        /* one map thread: the loop's compute already uses every core (helper threads would only
         * contend); prefetch hides the map behind the step */
        THEN(mr_data_map(ds, normalize_image, image_numel, &out, 1, &next));
    }
    if (c->model.type == MR_MODEL_GPT && train) {
        if (c->shuffle > 0) THEN(mr_data_shuffle(ds, c->shuffle, c->seed, 1, &next));
        THEN(mr_data_repeat(ds, -1, &next));
    }
    THEN(mr_data_batch(ds, batch, train, &next));
    if (train) THEN(mr_data_prefetch(ds, 2, &next));
    MR_TRY(mr_data_iter_new(ds, &p->it));
    p->ds = ds;
    return MR_OK;
fail:
    mr_data_free(ds);
    return st;
}

/* ---- evaluation ------------------------------------------------------------------------------- */

typedef struct eval_out {
    double loss, accuracy, perplexity;
} eval_out;

/* Mean loss over every evaluation element (partial last batch included: its own compiled step),
 * accuracy for classifiers, perplexity for language models. */
static mr_status evaluate(const mr_train_cfg *c, mr_steps *steps, int64_t batch, eval_out *out) {
    mr_status st = MR_OK;
    pipeline p;
    int64_t numel = 0, seen = 0, correct = 0;
    double loss_sum = 0.0;
    MR_TRY(make_pipeline(c, 0, batch, &numel, &p));
    for (;;) {
        mr_data_elem e;
        int end = 0;
        MR_TRY(mr_data_iter_next(p.it, &e, &end));
        if (end) break;
        int64_t b = e.shape[0].dim[0];
        mr_step *s = NULL;
        MR_TRY(mr_steps_get(steps, b, 0, &s));
        MR_TRY(mr_plan_bind(s->plan, s->io.x, e.data[0]));
        MR_TRY(mr_plan_bind(s->plan, s->io.y, e.data[1]));
        MR_TRY(mr_plan_run(s->plan));
        loss_sum += (double)*(const float *)mr_plan_data(s->plan, s->io.loss) * (double)b;
        seen += b;
        if (c->model.type != MR_MODEL_GPT) {
            const float *logits = mr_plan_data(s->plan, s->io.out);
            const int32_t *labels = e.data[1];
            mr_shape ls = mr_graph_shape(s->g, s->io.out);
            int64_t k = ls.dim[1];
            for (int64_t i = 0; i < b; i++) {
                int64_t arg = 0;
                for (int64_t j = 1; j < k; j++)
                    if (logits[i * k + j] > logits[i * k + arg]) arg = j;
                correct += arg == labels[i];
            }
        }
    }
    out->loss = seen ? loss_sum / (double)seen : NAN;
    out->accuracy = c->model.type != MR_MODEL_GPT && seen ? (double)correct / (double)seen : NAN;
    out->perplexity = c->model.type == MR_MODEL_GPT ? exp(out->loss) : NAN;
fail:
    pipeline_free(&p);
    return st;
}

/* ---- the loop ----------------------------------------------------------------------------------- */

/* Appends code point cp as UTF-8 to out (of cap bytes, kept NUL-terminated). */
static void put_utf8(char *out, size_t cap, int32_t cp) {
    char b[4];
    int n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (char)(0xf0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    size_t len = strlen(out);
    if (len + (size_t)n + 1 > cap) return;
    memcpy(out + len, b, (size_t)n);
    out[len + (size_t)n] = '\0';
}

/* Samples cfg->sample_chars characters from the trained language model: the window starts as the
 * first evaluation (or training) window, each step runs the forward on the last `context` tokens
 * and draws the next from softmax(logits / 0.8) with Philox (seed-determined). */
static mr_status generate(const mr_train_cfg *c, mr_steps *steps, const int32_t *vocab, int64_t nvocab,
                          mr_train_result *res) {
    mr_status st = MR_OK;
    pipeline p;
    int64_t unused = 0;
    const int64_t T = c->model.context;
    int32_t *win = calloc((size_t)T, sizeof *win), *y = calloc((size_t)T, sizeof *y);
    double *prob = calloc((size_t)nvocab, sizeof *prob);
    memset(&p, 0, sizeof p);
    MR_CHECK(win && y && prob, MR_ERR_NOMEM, "generate: out of memory");
    mr_train_cfg from = *c; /* start from the held-out text, or the training text without one */
    if (!from.eval_text) from.eval_text = from.train_text;
    MR_TRY(make_pipeline(&from, 0, 1, &unused, &p));
    mr_data_elem e;
    int end = 0;
    MR_TRY(mr_data_iter_next(p.it, &e, &end));
    MR_CHECK(!end, MR_ERR_INVALID, "generate: no text to start from");
    memcpy(win, e.data[0], (size_t)T * sizeof *win);
    mr_step *s = NULL;
    MR_TRY(mr_steps_get(steps, 1, 0, &s));
    MR_TRY(mr_plan_bind(s->plan, s->io.x, win));
    MR_TRY(mr_plan_bind(s->plan, s->io.y, y));
    res->sample[0] = '\0';
    for (int64_t k = 0; k < c->sample_chars; k++) {
        MR_TRY(mr_plan_run(s->plan));
        const float *logits = (const float *)mr_plan_data(s->plan, s->io.out) + (T - 1) * nvocab;
        double m = -INFINITY, sum = 0;
        for (int64_t v = 0; v < nvocab; v++) m = logits[v] > m ? logits[v] : m;
        for (int64_t v = 0; v < nvocab; v++) sum += prob[v] = exp((logits[v] - m) / 0.8);
        double u = (double)mr_u32_to_unit_f32(mr_philox_u32(c->seed, 0x5a4d, (uint64_t)k)) * sum;
        int64_t tok = nvocab - 1;
        for (int64_t v = 0; v < nvocab; v++) {
            if (u < prob[v]) {
                tok = v;
                break;
            }
            u -= prob[v];
        }
        memmove(win, win + 1, (size_t)(T - 1) * sizeof *win);
        win[T - 1] = (int32_t)tok;
        put_utf8(res->sample, sizeof res->sample, vocab[tok]);
    }
fail:
    pipeline_free(&p);
    free(win);
    free(y);
    free(prob);
    return st;
}

static mr_status check_cfg(const mr_train_cfg *c) {
    if (c->steps < 1) return mr_set_error(MR_ERR_INVALID, "train.steps: must be >= 1, got %lld", (long long)c->steps);
    if (c->batch < 1) return mr_set_error(MR_ERR_INVALID, "train.batch: must be >= 1, got %lld", (long long)c->batch);
    if (c->accumulate < 1 || c->batch % c->accumulate)
        return mr_set_error(MR_ERR_INVALID, "train.accumulate: %lld micro-batches do not divide the batch %lld",
                            (long long)c->accumulate, (long long)c->batch);
    if (c->grad_clip < 0) return mr_set_error(MR_ERR_INVALID, "optimizer.grad_clip: must be >= 0, got %g", c->grad_clip);
    if (c->model.type == MR_MODEL_GPT) {
        if (!c->train_tokens && !c->train_text)
            return mr_set_error(MR_ERR_INVALID, "data.train.path: a gpt needs a token or text file");
    } else if (!c->train_images || !c->train_labels) {
        return mr_set_error(MR_ERR_INVALID, "data.train: an %s needs IDX images and labels",
                            c->model.type == MR_MODEL_CNN ? "cnn" : "mlp");
    }
    return mr_schedule_check(&c->schedule);
}

mr_status mr_mkdirs(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *q = path + 1; *q; q++) {
        if (*q != '/') continue;
        *q = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return mr_set_error(MR_ERR_IO, "cannot create directory '%s': %s", path, strerror(errno));
        *q = '/';
    }
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return mr_set_error(MR_ERR_IO, "cannot create directory '%s': %s", path, strerror(errno));
    return MR_OK;
}

mr_status mr_train(const mr_train_cfg *cfg, mr_train_result *res) {
    mr_status st = MR_OK;
    mr_train_cfg c = *cfg;
    mr_params *ps = NULL;
    mr_steps *steps = NULL;
    mr_optim *opt = NULL;
    pipeline train;
    FILE *metrics = NULL;
    float *acc = NULL;
    memset(&train, 0, sizeof train);
    memset(res, 0, sizeof *res);
    res->eval_loss = res->eval_accuracy = res->eval_perplexity = NAN;
    MR_TRY(check_cfg(&c));
    if (c.schedule.total == 0) c.schedule.total = c.steps;
    const int64_t micro = c.batch / c.accumulate;
    int64_t numel = 0;
    MR_TRY(make_pipeline(&c, 1, micro, &numel, &train));
    if (c.model.type == MR_MODEL_MLP) c.model.sizes[0] = numel;
    if (c.model.type == MR_MODEL_CNN) {
        const mr_data_spec *sp = mr_data_element_spec(train.ds);
        c.model.in_channels = 1;
        c.model.height = sp->comp[0].shape.dim[1];
        c.model.width = sp->comp[0].shape.dim[2];
    }
    const int32_t *vocab = NULL;
    int64_t nvocab = 0;
    if (c.model.type == MR_MODEL_GPT && c.train_text) {
        MR_TRY(mr_data_text_vocab(train.ds, &vocab, &nvocab));
        if (c.model.vocab != nvocab && !c.quiet)
            mr_log_info("model.vocab: %lld characters in %s (the config said %lld)", (long long)nvocab, c.train_text,
                        (long long)c.model.vocab);
        c.model.vocab = nvocab;
    }
    MR_TRY(mr_params_new(&ps));
    MR_TRY(mr_steps_new(mr_model_step_build, &c.model, ps, MR_DEVICE_CPU, &steps));
    MR_CHECK(c.compute == MR_F32 || c.compute == MR_BF16, MR_ERR_UNSUPPORTED,
             "precision.policy: compute type %s is not supported by the trainer", mr_dtype_name(c.compute));
    mr_steps_set_compute(steps, c.compute);
    mr_step *s = NULL;
    MR_TRY(mr_steps_get(steps, micro, 1, &s));
    MR_TRY(mr_params_init(ps, c.seed));
    const int64_t n = mr_params_buffer_numel(ps);
    MR_TRY(mr_optim_new(&c.optim, n, &opt));
    float *params = mr_params_buffer(ps), *grads = mr_params_grad_buffer(ps);
    if (c.accumulate > 1) {
        acc = calloc((size_t)n, sizeof *acc);
        MR_CHECK(acc, MR_ERR_NOMEM, "trainer: out of memory for the accumulation buffer");
    }
    if (c.run_dir) {
        MR_TRY(mr_mkdirs(c.run_dir));
        char path[4096];
        snprintf(path, sizeof path, "%s/metrics.jsonl", c.run_dir);
        metrics = fopen(path, "w");
        MR_CHECK(metrics, MR_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    }
    const int tty = isatty(STDOUT_FILENO);
    const double t_start = now_s();
    double t_data = 0, t_fwd = 0, t_bwd = 0, t_opt = 0, loss_sum = 0, t_log = t_start;
    int64_t interval = 0;
    if (!c.quiet)
        mr_log_info("training %lld parameters for %lld steps, batch %lld, GEMM: %s", (long long)mr_params_total(ps),
                    (long long)c.steps, (long long)c.batch, mr_cpu_gemm_provider());
    for (int64_t step = 0; step < c.steps; step++) {
        double step_loss = 0;
        for (int64_t m = 0; m < c.accumulate; m++) {
            mr_data_elem e;
            int end = 0;
            double t0 = now_s();
            MR_TRY(mr_data_iter_next(train.it, &e, &end));
            MR_CHECK(!end, MR_ERR_INVALID, "data.train: the training data is empty");
            double t1 = now_s();
            MR_TRY(mr_plan_bind(s->plan, s->io.x, e.data[0]));
            MR_TRY(mr_plan_bind(s->plan, s->io.y, e.data[1]));
            mr_plan_set_dropout_step(s->plan, (uint64_t)(step * c.accumulate + m)); /* fresh masks each micro-step */
            MR_TRY(mr_plan_run_range(s->plan, 0, s->n_forward));
            double t2 = now_s();
            MR_TRY(mr_plan_run_range(s->plan, s->n_forward, mr_plan_num_kernels(s->plan)));
            double t3 = now_s();
            t_data += t1 - t0;
            t_fwd += t2 - t1;
            t_bwd += t3 - t2;
            step_loss += *(const float *)mr_plan_data(s->plan, s->io.loss);
            if (acc) {
                /* the gradients of micro-batch means, averaged: the gradient of the batch mean */
                const float w = 1.0f / (float)c.accumulate;
                if (m == 0)
                    for (int64_t i = 0; i < n; i++) acc[i] = w * grads[i];
                else
                    for (int64_t i = 0; i < n; i++) acc[i] += w * grads[i];
            }
        }
        step_loss /= (double)c.accumulate;
        MR_CHECK(isfinite(step_loss), MR_ERR_INVALID,
                 "non-finite loss (%g) at step %lld; HINT: lower optimizer.lr or set optimizer.grad_clip", step_loss,
                 (long long)step);
        double t4 = now_s();
        float *g = acc ? acc : grads;
        double norm = 0;
        if (c.grad_clip > 0) mr_clip_grad_norm(g, n, c.grad_clip, &norm);
        double lr = mr_schedule_lr(&c.schedule, c.optim.lr, step);
        MR_TRY(mr_optim_step(opt, params, g, lr));
        t_opt += now_s() - t4;
        loss_sum += step_loss;
        interval++;
        int last = step + 1 == c.steps;
        if ((c.log_every > 0 && (step + 1) % c.log_every == 0) || last) {
            double t = now_s(), k = (double)interval;
            double sps = (double)(c.batch * interval) / (t - t_log);
            res->last_loss = loss_sum / k;
            if (metrics) {
                fprintf(metrics,
                        "{\"step\": %lld, \"time\": %.3f, \"loss\": %.6f, \"lr\": %.6g, \"loss_scale\": 1, "
                        "\"samples_per_s\": %.1f, \"data_wait_s\": %.6f, \"forward_s\": %.6f, \"backward_s\": %.6f, "
                        "\"communication_s\": 0, \"optimizer_s\": %.6f}\n",
                        (long long)(step + 1), t - t_start, res->last_loss, lr, sps, t_data / k, t_fwd / k, t_bwd / k,
                        t_opt / k);
                fflush(metrics);
            }
            if (!c.quiet) {
                double eta = (t - t_start) / (double)(step + 1) * (double)(c.steps - step - 1);
                printf("%sstep %lld/%lld  loss %.4f  lr %.3g  %.0f samples/s  data %.0f%% fwd %.0f%% bwd %.0f%% "
                       "opt %.0f%%  ETA %.0fs%s",
                       tty ? "\r" : "", (long long)(step + 1), (long long)c.steps, res->last_loss, lr, sps,
                       100 * t_data / (t - t_log), 100 * t_fwd / (t - t_log), 100 * t_bwd / (t - t_log),
                       100 * t_opt / (t - t_log), eta, tty ? "   " : "\n");
                fflush(stdout);
            }
            t_log = t;
            t_data = t_fwd = t_bwd = t_opt = loss_sum = 0;
            interval = 0;
        }
        if ((c.eval_every > 0 && (step + 1) % c.eval_every == 0) || last) {
            if (!(c.model.type == MR_MODEL_GPT ? (c.eval_tokens || c.eval_text) : c.eval_images != NULL)) continue;
            eval_out ev;
            MR_TRY(evaluate(&c, steps, micro, &ev));
            res->eval_loss = ev.loss;
            res->eval_accuracy = ev.accuracy;
            res->eval_perplexity = ev.perplexity;
            if (metrics) {
                if (c.model.type == MR_MODEL_GPT)
                    fprintf(metrics, "{\"step\": %lld, \"time\": %.3f, \"eval_loss\": %.6f, \"eval_perplexity\": %.4f}\n",
                            (long long)(step + 1), now_s() - t_start, ev.loss, ev.perplexity);
                else
                    fprintf(metrics, "{\"step\": %lld, \"time\": %.3f, \"eval_loss\": %.6f, \"eval_accuracy\": %.6f}\n",
                            (long long)(step + 1), now_s() - t_start, ev.loss, ev.accuracy);
                fflush(metrics);
            }
            if (!c.quiet) {
                if (c.model.type == MR_MODEL_GPT)
                    printf("%seval at step %lld: loss %.4f  perplexity %.3f\n", tty ? "\n" : "", (long long)(step + 1),
                           ev.loss, ev.perplexity);
                else
                    printf("%seval at step %lld: loss %.4f  accuracy %.4f\n", tty ? "\n" : "", (long long)(step + 1),
                           ev.loss, ev.accuracy);
                fflush(stdout);
            }
            t_log = now_s(); /* evaluation time is not training throughput */
        }
    }
    res->steps = c.steps;
    res->seconds = now_s() - t_start;
    if (vocab && c.sample_chars > 0) MR_TRY(generate(&c, steps, vocab, nvocab, res));
    res->compilations = mr_steps_compilations(steps);
fail:
    if (metrics) fclose(metrics);
    free(acc);
    pipeline_free(&train);
    mr_optim_free(opt);
    mr_steps_free(steps);
    mr_params_free(ps);
    return st;
}
