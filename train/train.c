/* The training loop (see train.h): pipelines, compiled steps, evaluation, metrics and
 * checkpoints around the step (train_step.c: next batch, forward/backward with the overlapped
 * reduction, agreement, unscale/clip/update; the exchange itself: distribute/ddp.h). Checkpoint
 * contents: train_ckpt.c; the device path: train_device.c; replicas: train_dist.c. */
#include "train/train_impl.h"
#include "train/train_source_impl.h"
#include "checkpoint/ckpt.h"
#include "core/log.h"
#include "core/math/philox_math.h"

#include <pthread.h>
#include <signal.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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
    c.tensorboard = 1; /* with a run_dir, as the CLI (log.tensorboard) */
    c.seed = 1;
    c.token_bytes = 2;
    c.shuffle = 10000;
    c.gpus[0] = -1; /* a GPU replica under MPI: the rank's local index */
    c.cuda_graphs = 1;
    return c;
}

/* Progress rewritten in place ("\r") only on a terminal of this process's own: under mpirun the
 * ranks' stdout is a pseudo-terminal even when mpirun writes to a file, and srun forwards it too,
 * so a launched rank writes one line per log step. */
static int progress_on_tty(void) {
    static const char *const launcher[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE",
                                           "SLURM_STEP_ID"};
    if (!isatty(STDOUT_FILENO)) return 0;
    for (size_t i = 0; i < sizeof launcher / sizeof launcher[0]; i++)
        if (getenv(launcher[i])) return 0;
    return 1;
}

/* ---- data ------------------------------------------------------------------------------------- */

/* u8 image (H,W) -> f32 x in [0,1], shaped as the model's sample (mr_model_sample_shape: the same
 * element count, so the same bytes); the label passes through. */
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

typedef tr_pipeline pipeline;

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

/* Samples for the model's task: IDX images and labels for a classifier (shaped as its sample:
 * mr_model_sample_shape), tokens or text for a language model. fit (the training pipeline's
 * model, NULL for the others) is first fitted to the data (mr_model_fit_data: the images' shape;
 * the text's vocabulary). Training pipelines shuffle and repeat forever and drop the last partial
 * batch; evaluation pipelines see every element once. With world > 1 replicas, replica `rank`
 * keeps every world-th element: for training after the shuffle and repeat (every replica shuffles
 * the same indices), so the global sample sequence is the pipeline before the shard, whatever the
 * world, and the world's micro-batches of one step are exactly the elements one replica with the
 * global batch would take (their checkpointed position resumes on any world:
 * mr_data_iter_save_global); for evaluation right after the source. */
static mr_status make_pipeline(const mr_train_cfg *c, mr_model_cfg *fit, int train, int64_t batch,
                               int64_t *image_numel, int world, int rank, pipeline *p) {
    mr_status st = MR_OK;
    mr_dataset *ds = NULL, *next = NULL;
    const mr_model_cfg *model = fit ? fit : &c->model;
    memset(p, 0, sizeof *p);
    if (mr_model_task(model) == MR_TASK_LM) {
        const int64_t window = mr_model_sample_shape(model).dim[0];
        if (c->train_text || c->eval_text) {
            const char *path = train ? c->train_text : c->eval_text;
            MR_TRY(mr_data_from_text(path, window, MR_DATA_TEXT_CHARS, &ds));
            if (c->train_text && c->eval_text && !strcmp(c->train_text, c->eval_text))
                THEN(train ? mr_data_skip(ds, MR_TEXT_HOLDOUT, &next) : mr_data_take(ds, MR_TEXT_HOLDOUT, &next));
        } else {
            MR_TRY(tr_open_tokens(c, train, window, &ds)); /* train/train_source.c: a file, glob or list */
        }
        if (fit && c->train_text) {
            const int32_t *vocab = NULL;
            int64_t nvocab = 0;
            MR_TRY(mr_data_text_vocab(ds, &vocab, &nvocab));
            if (fit->vocab != nvocab && !c->quiet)
                mr_log_info("model.vocab: %lld characters in %s (the config said %lld)", (long long)nvocab,
                            c->train_text, (long long)fit->vocab);
            MR_TRY(mr_model_fit_data(fit, mr_model_sample_shape(fit), nvocab));
        }
        if (!train && world > 1) THEN(mr_data_shard(ds, world, rank, &next));
        if (train && c->shuffle > 0) THEN(mr_data_shuffle(ds, c->shuffle, c->seed, 1, &next));
        if (train) THEN(mr_data_repeat(ds, -1, &next));
        if (train && world > 1) THEN(mr_data_shard(ds, world, rank, &next));
    } else {
        MR_TRY(tr_open_source(c, train, &ds)); /* train/train_source.c: IDX, HDF5, .npy/.npz, TFRecord; sets */
        if (!train && world > 1) THEN(mr_data_shard(ds, world, rank, &next));
        const mr_data_spec *in = mr_data_element_spec(ds);
        if (fit) MR_TRY(mr_model_fit_data(fit, in->comp[0].shape, 0));
        *image_numel = mr_shape_numel(&in->comp[0].shape);
        mr_data_spec out;
        memset(&out, 0, sizeof out);
        mr_shape xs = mr_model_sample_shape(model);
        MR_CHECK(mr_shape_numel(&xs) == *image_numel, MR_ERR_INVALID,
                 "%s: images of %lld values, the model takes samples of %lld", train ? c->train_images : c->eval_images,
                 (long long)*image_numel, (long long)mr_shape_numel(&xs));
        mr_shape ls = mr_shape_make(0, NULL);
        MR_TRY(mr_data_spec_add(&out, "x", MR_F32, &xs));
        MR_TRY(mr_data_spec_add(&out, "label", MR_I32, &ls));
        if (train && c->shuffle > 0) THEN(mr_data_shuffle(ds, c->shuffle, c->seed, 1, &next));
        if (train) THEN(mr_data_repeat(ds, -1, &next));
        if (train && world > 1) THEN(mr_data_shard(ds, world, rank, &next));
        /* one map thread: the loop's compute already uses every core (helper threads would only
         * contend); prefetch hides the map behind the step */
        THEN(mr_data_map(ds, normalize_image, image_numel, &out, 1, &next));
    }
    MR_TRY(tr_data_augment(c, train, &ds)); /* data.train.augment (train_data.c) */
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

static int has_eval(const mr_train_cfg *c) {
    return mr_model_task(&c->model) == MR_TASK_LM ? c->eval_tokens || c->eval_text : c->eval_images != NULL;
}

/* Mean loss over every evaluation element (partial last batch included: its own compiled step),
 * accuracy for classifiers, perplexity for language models, into res->eval_*. With comm, every
 * replica evaluates its shard and the sums are added up. */
static mr_status evaluate(const mr_train_cfg *c, mr_steps *steps, tr_device *dv, int64_t batch, mr_comm *comm,
                          mr_train_result *res) {
    mr_status st = MR_OK;
    pipeline p;
    int64_t numel = 0, seen = 0, correct = 0;
    double loss_sum = 0.0;
    const int classify = mr_model_task(&c->model) == MR_TASK_CLASSIFY;
    const int world = comm ? mr_comm_size(comm) : 1, rank = comm ? mr_comm_rank(comm) : 0;
    FILE *log = tr_data_log_open(rank); /* MIRROR_DATA_LOG (train_data.c) */
    MR_TRY(make_pipeline(c, NULL, 0, batch, &numel, world, rank, &p));
    for (;;) {
        mr_data_elem e;
        int end = 0;
        MR_TRY(mr_data_iter_next(p.it, &e, &end));
        if (end) break;
        int64_t b = e.shape[0].dim[0];
        tr_data_log_batch(log, "eval", p.it, seen * world + rank, world); /* place in the evaluation sequence */
        mr_step *s = NULL;
        MR_TRY(mr_steps_get(steps, b, 0, &s));
        MR_TRY(tr_dev_feed(dv, s, e.data[0], e.data[1]));
        MR_TRY(mr_plan_run(s->plan));
        const void *h = NULL;
        MR_TRY(tr_dev_read(dv, s, s->io.loss, sizeof(float), &h));
        loss_sum += (double)*(const float *)h * (double)b;
        seen += b;
        if (classify) {
            const int32_t *labels = e.data[1];
            mr_shape ls = mr_graph_shape(s->g, s->io.out);
            int64_t k = ls.dim[1];
            MR_TRY(tr_dev_read(dv, s, s->io.out, (size_t)(b * k) * sizeof(float), &h));
            const float *logits = h;
            for (int64_t i = 0; i < b; i++) {
                int64_t arg = 0;
                for (int64_t j = 1; j < k; j++)
                    if (logits[i * k + j] > logits[i * k + arg]) arg = j;
                correct += arg == labels[i];
            }
        }
    }
    if (comm) {
        double sums[3] = {loss_sum, (double)correct, (double)seen};
        MR_TRY(mr_comm_allreduce(comm, sums, 3, MR_F64, MR_REDUCE_SUM));
        loss_sum = sums[0];
        correct = (int64_t)sums[1];
        seen = (int64_t)sums[2];
    }
    res->eval_samples = seen;
    res->eval_loss = seen ? loss_sum / (double)seen : NAN;
    res->eval_accuracy = classify && seen ? (double)correct / (double)seen : NAN;
    res->eval_perplexity = classify ? NAN : exp(res->eval_loss);
fail:
    if (log) fclose(log);
    pipeline_free(&p);
    return st;
}

/* TensorBoard output that failed to write (a full disk): the run goes on without it. */
static void tb_lost(mr_tb **tb) {
    mr_log_warn("%s; TensorBoard output stops here (training goes on; metrics.jsonl has every number)", mr_last_error());
    mr_tb_close(*tb);
    *tb = NULL;
}

/* An evaluation's metrics.jsonl line, TensorBoard scalars and message (replica 0). */
static void log_eval(const mr_train_cfg *c, FILE *metrics, mr_tb **tb, int64_t step, double time,
                     const mr_train_result *r) {
    const int classify = mr_model_task(&c->model) == MR_TASK_CLASSIFY;
    const char *metric = classify ? "accuracy" : "perplexity";
    const double value = classify ? r->eval_accuracy : r->eval_perplexity;
    if (metrics) {
        fprintf(metrics, classify ? "{\"step\": %lld, \"time\": %.3f, \"eval_loss\": %.6f, \"eval_%s\": %.6f}\n"
                                  : "{\"step\": %lld, \"time\": %.3f, \"eval_loss\": %.6f, \"eval_%s\": %.4f}\n",
                (long long)step, time, r->eval_loss, metric, value);
        fflush(metrics);
    }
    if (*tb && tr_tb_eval(*tb, step, classify, r) != MR_OK) tb_lost(tb); /* writes only: MR_ERR_IO or NOMEM */
    if (!c->quiet) {
        mr_log_progress_end();
        printf(classify ? "eval at step %lld: loss %.4f  %s %.4f\n" : "eval at step %lld: loss %.4f  %s %.3f\n",
               (long long)step, r->eval_loss, metric, value);
        fflush(stdout);
    }
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
static mr_status generate(const mr_train_cfg *c, mr_steps *steps, tr_device *dv, const int32_t *vocab,
                          int64_t nvocab, mr_train_result *res) {
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
    MR_TRY(make_pipeline(&from, NULL, 0, 1, &unused, 1, 0, &p));
    mr_data_elem e;
    int end = 0;
    MR_TRY(mr_data_iter_next(p.it, &e, &end));
    MR_CHECK(!end, MR_ERR_INVALID, "generate: no text to start from");
    memcpy(win, e.data[0], (size_t)T * sizeof *win);
    mr_step *s = NULL;
    MR_TRY(mr_steps_get(steps, 1, 0, &s));
    res->sample[0] = '\0';
    for (int64_t k = 0; k < c->sample_chars; k++) {
        MR_TRY(tr_dev_feed(dv, s, win, y)); /* the window moved: bind (host) or copy (device) it again */
        MR_TRY(mr_plan_run(s->plan));
        const void *h = NULL;
        MR_TRY(tr_dev_read(dv, s, s->io.out, (size_t)(T * nvocab) * sizeof(float), &h));
        const float *logits = (const float *)h + (T - 1) * nvocab;
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
    if (mr_model_task(&c->model) == MR_TASK_LM) {
        if (!c->train_tokens && !c->train_text)
            return mr_set_error(MR_ERR_INVALID, "data.train.path: a language model needs a token or text file");
    } else if (!c->train_images || (!c->train_labels && c->data_source == MR_TRAIN_SRC_IDX)) {
        return mr_set_error(MR_ERR_INVALID, "data.train: a classifier (model.type %s) needs images and labels",
                            mr_model_type_name(c->model.type));
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

/* Set from a signal handler; the only mutable global here, because a handler can reach nothing
 * else. The loop reads it between steps. */
static volatile sig_atomic_t g_stop_signal;

void mr_train_request_stop(int signo) { g_stop_signal = signo > 0 ? signo : SIGTERM; }

static void trainer_free(trainer *t) {
    tr_step_free(t);
    mr_ddp_free(t->ddp);
    tr_dev_free(t);
    pipeline_free(&t->train);
    if (t->data_log) fclose(t->data_log);
    free(t->pf_blob);
    mr_optim_free(t->opt);
    mr_steps_free(t->steps);
    mr_params_free(t->ps);
    free(t->tb_grad);
    tr_trace_free(t); /* after the queue and the prefetch thread, which write its tracks */
    memset(t, 0, sizeof *t);
}

/* Where the step works: t->dv's buffers (the device's, or the registry's on the host path). */
static void bind_work(trainer *t) {
    const tr_device *dv = &t->dv;
    t->gdev = dv->dev;
    t->gbe = dv->be;
    t->stream = dv->stream;
    t->params = dv->d_params;
    t->grads = dv->d_grads;
    t->acc = dv->d_acc;
    t->d_scratch = dv->d_scratch;
    t->wopt = dv->opt ? dv->opt : t->opt;
}

/* The model (fitted to the data), its compiled training step, initial parameters and the
 * optimizer: a run at step 0. The training pipeline is built for micro-batches. */
static mr_status trainer_init(trainer *t, const mr_train_cfg *cfg, int with_optim, mr_comm *comm) {
    mr_status st = MR_OK;
    memset(t, 0, sizeof *t);
    t->es_best = NAN; /* no evaluation yet */
    t->c = *cfg;
    mr_train_cfg *c = &t->c;
    t->comm = comm;
    t->world = comm ? mr_comm_size(comm) : 1;
    t->rank = comm ? mr_comm_rank(comm) : 0;
    MR_TRY(check_cfg(c));
    if (c->schedule.total == 0) c->schedule.total = c->steps;
    MR_CHECK(c->compute == MR_F32 || c->compute == MR_BF16 || c->compute == MR_F16, MR_ERR_UNSUPPORTED,
             "precision.policy: compute type %s is not supported by the trainer", mr_dtype_name(c->compute));
    MR_CHECK(c->batch % (c->accumulate * t->world) == 0, MR_ERR_INVALID,
             "train.batch: the global batch %lld does not split into %d replicas x %lld micro-batches; HINT: make "
             "train.batch a multiple of %lld",
             (long long)c->batch, t->world, (long long)c->accumulate, (long long)(c->accumulate * t->world));
    if (t->rank != 0) { /* rank 0 speaks and writes for the job */
        if (!c->rank_logs) c->quiet = 1;
        c->run_dir = NULL;
    }
    const int64_t micro = c->batch / (c->accumulate * t->world);
    MR_TRY(make_pipeline(c, &c->model, 1, micro, &t->image_numel, t->world, t->rank, &t->train));
    t->train_size = mr_data_source_size(t->train.ds);
    t->data_log = tr_data_log_open(t->rank);
    MR_TRY(mr_params_new(&t->ps));
    MR_TRY(mr_steps_new(mr_model_step_build, &t->c.model, t->ps, MR_DEVICE_CPU, &t->steps));
    mr_steps_set_compute(t->steps, c->compute);
    mr_steps_set_allow_tf32(t->steps, c->allow_tf32);
    if (comm && mr_model_uses_sync(&c->model)) { /* batch-norm statistics of the global batch */
        MR_CHECK(c->device_kind != MR_DEVICE_CUDA, MR_ERR_UNSUPPORTED,
                 "model.layers: batchnorm sync: not on GPU replicas yet; HINT: sync: false (each GPU normalises its own "
                 "micro-batch), or CPU replicas");
        MR_TRY(mr_sync_hook_init(&t->sync, comm));
        MR_TRY(mr_steps_set_sync(t->steps, &t->sync.hook));
    }
    /* the step's buffers follow the registry's layout: register before the first compilation */
    MR_TRY(mr_steps_register(t->steps, micro));
    t->n = mr_params_buffer_numel(t->ps);
    if (with_optim && c->shard_optimizer && t->world > 1) MR_TRY(tr_zero_init(t));
    MR_TRY(tr_dev_init(t, with_optim));
    mr_step *s = NULL;
    MR_TRY(mr_steps_get(t->steps, micro, 1, &s));
    MR_TRY(mr_params_init(t->ps, c->seed));
    if (with_optim) MR_TRY(mr_optim_new(&c->optim, t->zero ? t->zsh.len : t->n, &t->opt));
    bind_work(t);
    MR_TRY(tr_dev_push(t)); /* the same initial weights as on the host, whatever the device */
    t->scaling = c->loss_scaling > 0 || (c->loss_scaling == 0 && c->compute == MR_F16);
    t->scaler = c->loss_scaler.scale > 0 ? c->loss_scaler : mr_loss_scaler_default();
    t->scaler.good_steps = t->scaler.skipped = 0;
    return MR_OK;
fail:
    trainer_free(t);
    return st;
}

/* metrics.jsonl of a resumed run: the lines up to the checkpoint's step are kept (a run killed
 * after its last checkpoint logged steps that will be logged again), then appended to. */
static mr_status open_metrics(const char *run_dir, int64_t keep_upto, FILE **out) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    *out = NULL;
    if (keep_upto > 0) {
        FILE *in = fopen(path, "r");
        if (in) {
            snprintf(tmp, sizeof tmp, "%s.tmp", path);
            FILE *o = fopen(tmp, "w");
            if (!o) {
                fclose(in);
                return mr_set_error(MR_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
            }
            char line[4096];
            while (fgets(line, sizeof line, in)) {
                long long step = -1;
                if (sscanf(line, "{\"step\": %lld", &step) == 1 && step <= keep_upto && strchr(line, '\n'))
                    fputs(line, o);
            }
            fclose(in);
            int bad = ferror(o);
            bad |= fclose(o) != 0;
            if (bad || rename(tmp, path) != 0) {
                remove(tmp);
                return mr_set_error(MR_ERR_IO, "cannot rewrite '%s': %s", path, strerror(errno));
            }
        }
    }
    *out = fopen(path, keep_upto > 0 ? "a" : "w");
    if (!*out) return mr_set_error(MR_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    return MR_OK;
}

mr_status mr_train_check_run_dir(const mr_train_cfg *c) {
    if (c->resume && !strcmp(c->resume, "never") && c->ckpt_dir) {
        int64_t *steps = NULL;
        int n = 0;
        mr_status st = mr_ckpt_scan(c->ckpt_dir, &steps, &n);
        int64_t newest = n > 0 ? steps[n - 1] : 0;
        free(steps);
        if (st != MR_OK) return st;
        if (n > 0)
            return mr_set_error(MR_ERR_INVALID,
                                "checkpoint.resume: never, but checkpoint.dir '%s' holds %d checkpoint(s) of an earlier run "
                                "(the newest at step %lld); a fresh run there would mix the two; HINT: set checkpoint.dir to "
                                "a new directory, or checkpoint.resume: auto to continue that run",
                                c->ckpt_dir, n, (long long)newest);
    }
    return MR_OK;
}

/* The checkpoint to resume from: "auto" -> the newest complete one in ckpt_dir (none: start
 * fresh), a path -> that file, "never"/NULL/"" -> none (refused by mr_train_check_run_dir when
 * ckpt_dir holds checkpoints). */
static mr_status pick_resume(const mr_train_cfg *c, char *path, size_t cap, int *found) {
    *found = 0;
    mr_status st = mr_train_check_run_dir(c);
    if (st != MR_OK) return st;
    if (!c->resume || !*c->resume || !strcmp(c->resume, "never")) return MR_OK;
    if (!strcmp(c->resume, "auto")) {
        if (!c->ckpt_dir) return MR_OK;
        int64_t step = 0;
        return mr_ckpt_latest(c->ckpt_dir, path, cap, &step, found);
    }
    snprintf(path, cap, "%s", c->resume);
    *found = 1;
    return MR_OK;
}

/* Collective over the replicas (tr_ckpt_save); replica 0 owns the directory. */
static mr_status save_checkpoint(trainer *t, mr_train_result *res) {
    char path[4096];
    mr_status st = MR_OK;
    MR_TRY(tr_dev_pull(t)); /* the device's state into the host shadow the file is written from */
    if (t->rank == 0) MR_TRY(mr_mkdirs(t->c.ckpt_dir));
    mr_ckpt_path(t->c.ckpt_dir, t->step, path, sizeof path);
    double t0 = tr_now_s();
    MR_TRY(tr_ckpt_save(t, path));
    if (t->c.ckpt_keep > 0 && t->rank == 0) MR_TRY(mr_ckpt_prune(t->c.ckpt_dir, (int)t->c.ckpt_keep));
    snprintf(res->checkpoint, sizeof res->checkpoint, "%s", path);
    if (!t->c.quiet) mr_log_info("saved %s (%.2f s)", path, tr_now_s() - t0);
fail:
    return st;
}

/* The log interval: step-time split, throughput and the overlap of communication. */
typedef struct interval_log {
    FILE *metrics;      /* <run_dir>/metrics.jsonl (NULL: none) */
    mr_tb *tb;          /* <run_dir>/tb/ (NULL: none) */
    int tty;            /* progress rewritten in place */
    double t_start, t_last; /* the run's start and the last log line (or the end of an evaluation) */
    double busy0;       /* the exchange's busy seconds at the last log line */
    tr_times tm;        /* over the interval */
    int64_t timed;      /* steps in the interval */
} interval_log;

/* The log step's numbers over the interval. */
static tr_metrics interval_metrics(trainer *t, interval_log *L, double lr, double now) {
    const mr_train_cfg *c = &t->c;
    const double k = (double)(t->interval > 0 ? t->interval : 1);
    const double steps_timed = (double)(L->timed > 0 ? L->timed : 1), span = now - L->t_last;
    const tr_times *tm = &L->tm;
    tr_metrics m = {.step = t->step, .skipped = t->scaling ? t->scaler.skipped : 0, .time = now - t->time_origin,
                    .loss = t->interval > 0 ? t->loss_sum / k : NAN, .lr = lr,
                    .loss_scale = t->scaling ? t->scaler.scale : 1.0,
                    .samples_per_s = (double)c->batch * steps_timed / span, .data = tm->data / steps_timed,
                    .fwd = tm->fwd / steps_timed, .bwd = tm->bwd / steps_timed, .comm = tm->comm / steps_timed,
                    .opt = tm->opt / steps_timed};
    if (mr_model_task(&c->model) == MR_TASK_LM) m.tokens_per_s = m.samples_per_s * (double)c->model.context;
    /* the share of the all-reduce time that ran behind the backward (0 without overlap) */
    if (mr_ddp_overlaps(t->ddp)) {
        const double busy = mr_ddp_busy_seconds(t->ddp) - L->busy0;
        m.hidden = busy > 0 ? 1.0 - tm->comm / busy : 0;
        if (m.hidden < 0) m.hidden = 0;
        L->busy0 += busy;
    }
    return m;
}

/* The log step's metrics.jsonl line, TensorBoard scalars and progress line, then a new interval. */
static mr_status log_step(trainer *t, interval_log *L, double lr, mr_train_result *res) {
    const mr_train_cfg *c = &t->c;
    const double now = tr_now_s(), span = now - L->t_last;
    const tr_times *tm = &L->tm;
    const tr_metrics m = interval_metrics(t, L, lr, now);
    const double sps = m.samples_per_s, hidden = m.hidden;
    res->last_loss = m.loss;
    if (L->metrics) {
        char tok[48] = "";
        if (m.tokens_per_s > 0) snprintf(tok, sizeof tok, ", \"tokens_per_s\": %.1f", m.tokens_per_s);
        fprintf(L->metrics,
                "{\"step\": %lld, \"time\": %.3f, \"loss\": %.6f, \"lr\": %.6g, \"loss_scale\": %g, "
                "\"skipped_steps\": %lld, \"samples_per_s\": %.1f%s, \"data_wait_s\": %.6f, \"forward_s\": %.6f, "
                "\"backward_s\": %.6f, \"communication_s\": %.6f, \"communication_hidden\": %.3f, "
                "\"optimizer_s\": %.6f}\n",
                (long long)m.step, m.time, m.loss, m.lr, m.loss_scale, (long long)m.skipped, sps, tok, m.data, m.fwd,
                m.bwd, m.comm, hidden, m.opt);
        fflush(L->metrics);
    }
    if (L->tb) {
        mr_status st = tr_tb_step(t, L->tb, &m);
        if (st == MR_ERR_IO) tb_lost(&L->tb); /* the event file only; a device error is the run's */
        else if (st != MR_OK) return st;
    }
    if (!c->quiet && !c->no_progress) {
        const double eta = (now - L->t_start) / (double)(t->step - res->resumed_from) * (double)(c->steps - t->step);
        char scale_txt[64] = "";
        if (t->scaling)
            snprintf(scale_txt, sizeof scale_txt, "  scale %g (%lld skipped)", t->scaler.scale,
                     (long long)t->scaler.skipped);
        char comm_txt[32] = "";
        if (t->comm)
            snprintf(comm_txt, sizeof comm_txt, " comm %.0f%% (%.0f%% hidden)", 100 * tm->comm / span, 100 * hidden);
        printf("%sstep %lld/%lld  loss %.4f  lr %.3g%s  %.0f samples/s  data %.0f%% fwd %.0f%% bwd %.0f%%%s "
               "opt %.0f%%  ETA %.0fs%s",
               L->tty ? "\r" : "", (long long)t->step, (long long)c->steps, res->last_loss, lr, scale_txt, sps,
               100 * tm->data / span, 100 * tm->fwd / span, 100 * tm->bwd / span, comm_txt, 100 * tm->opt / span, eta,
               L->tty ? "   " : "\n");
        fflush(stdout);
        if (L->tty) mr_log_progress_open(1); /* the next message starts on a new line */
    }
    L->t_last = now;
    memset(&L->tm, 0, sizeof L->tm);
    L->timed = 0;
    t->loss_sum = 0;
    t->interval = 0;
    return MR_OK;
}

/* Where a run starts: a checkpoint (resume), init_from's parameters, or the seed's; then replica
 * 0's state everywhere and on the device, and the gradient exchange for step s. */
static mr_status start_run(trainer *t, mr_step *s, mr_train_result *res, char *rpath, size_t cap, int *resume) {
    mr_status st = MR_OK;
    const mr_train_cfg *c = &t->c;
    memset(rpath, 0, cap);
    *resume = 0;
    if (t->rank == 0) MR_TRY(pick_resume(c, rpath, cap, resume));
    if (t->comm) { /* replica 0 decides, so every replica loads the same file */
        MR_TRY(mr_comm_broadcast(t->comm, rpath, (int64_t)cap, MR_U8, 0));
        *resume = rpath[0] != '\0';
    }
    if (*resume) {
        const double t0 = tr_now_s();
        MR_TRY(tr_ckpt_load(t, rpath));
        res->resumed_from = t->step;
        if (!c->quiet)
            mr_log_info("resumed from %s at step %lld (loaded in %.3f s)", rpath, (long long)t->step, tr_now_s() - t0);
    } else if (c->init_from && *c->init_from) {
        int64_t unused = 0;
        MR_TRY(tr_load_params(t->ps, c->init_from, 1, &unused));
        if (!c->quiet) mr_log_info("parameters initialised from %s", c->init_from);
    }
    if (t->comm) MR_TRY(tr_replicas_start(t));
    MR_TRY(tr_dev_push(t)); /* what was loaded or broadcast */
    MR_TRY(tr_dev_comm(t));
    MR_TRY(tr_ddp_new(t, s));
    MR_TRY(tr_step_init(t, s)); /* the finite check per parameter */
fail:
    return st;
}

/* One replica's training loop (all of it when comm is NULL). */
static mr_status train_replica(const mr_train_cfg *cfg, mr_comm *comm, mr_train_result *res) {
    mr_status st = MR_OK;
    trainer tr;
    interval_log L;
    memset(&L, 0, sizeof L);
    memset(res, 0, sizeof *res);
    res->eval_loss = res->eval_accuracy = res->eval_perplexity = NAN;
    MR_TRY(trainer_init(&tr, cfg, 1, comm));
    const mr_train_cfg *c = &tr.c;
    const int64_t micro = c->batch / (c->accumulate * tr.world);
    const int32_t *vocab = NULL;
    int64_t nvocab = 0;
    if (mr_model_task(&c->model) == MR_TASK_LM && c->train_text)
        MR_TRY(mr_data_text_vocab(tr.train.ds, &vocab, &nvocab));
    mr_step *s = NULL;
    MR_TRY(mr_steps_get(tr.steps, micro, 1, &s));
    char rpath[4096];
    int resume = 0;
    MR_TRY(start_run(&tr, s, res, rpath, sizeof rpath, &resume));
    MR_TRY(tr_trace_init(&tr, s, cfg->run_dir != NULL));
    /* CUDA graphs: the step is captured at its second run (the first one creates the cuBLAS,
     * cuBLASLt and cuDNN state lazily, which may not happen inside a capture) */
    int want_graphs = tr.gdev.kind == MR_DEVICE_CUDA && c->cuda_graphs;
    if (want_graphs && mr_plan_has_dropout(s->plan)) {
        want_graphs = 0;
        if (!c->quiet) mr_log_info("CUDA graphs off: the model has dropout, whose masks change every step");
    }
    if (c->run_dir) {
        MR_TRY(mr_mkdirs(c->run_dir));
        MR_TRY(open_metrics(c->run_dir, tr.step, &L.metrics));
        MR_TRY(tr_tb_open(&tr, tr.step, &L.tb));
    }
    L.tty = progress_on_tty();
    L.t_start = L.t_last = tr_now_s();
    tr.time_origin = L.t_start - tr.elapsed_before; /* metrics "time" continues across resumes */
    if (!c->quiet && tr.rank == 0 && c->schedule.warmup > c->steps)
        mr_log_warn("schedule.warmup (%lld steps) is longer than train.steps (%lld): the learning rate rises for the "
                    "whole run and never reaches optimizer.lr", (long long)c->schedule.warmup, (long long)c->steps);
    if (!c->quiet)
        mr_log_info("training %lld parameters for %lld steps, batch %lld, %s%s, GEMM: %s",
                    (long long)mr_params_total(tr.ps), (long long)c->steps, (long long)c->batch,
                    c->compute == MR_F32 ? "float32" : c->compute == MR_BF16 ? "mixed_bfloat16" : "mixed_float16",
                    tr.scaling ? " with dynamic loss scaling" : "", mr_cpu_gemm_provider());
    /* a resume from the checkpoint of this run's early stop: nothing to train (below) */
    const int stopped_before = resume && tr.step < c->steps && tr_early_stopped(&tr);
    int early = 0;
    while (tr.step < c->steps && !stopped_before) {
        MR_TRY(tr_trace_step_begin(&tr)); /* the window opens before its first step */
        const int64_t span_step = mr_trace_begin(tr.trace.train);
        MR_TRY(tr_dev_set_loss_scale(&tr, s, tr.scaling ? (float)tr.scaler.scale : 1.0f));
        if (want_graphs && tr.step > res->resumed_from) {
            MR_TRY(mr_plan_set_graphs(s->plan, 1));
            want_graphs = 0;
        }
        /* next batch; forward and backward with the overlapped reduction */
        double loss = 0;
        float *g = NULL;
        MR_TRY(tr_step_forward_backward(&tr, s, &L.tm, &loss, &g));
        /* agree: gradients averaged, the loss and stop requests agreed, the finite check and the
         * loss scaler */
        int stop = g_stop_signal != 0, apply = 0;
        mr_ddp_part part;
        MR_TRY(tr_step_exchange(&tr, g, &loss, &stop, &part, &L.tm));
        const double t0 = tr_now_s();
        const int64_t span_opt = mr_trace_begin(tr.trace.train);
        MR_TRY(tr_step_check(&tr, loss, &part, &apply));
        /* unscale (above), clip, update */
        const double lr = mr_schedule_lr(&c->schedule, c->optim.lr, tr.step);
        if (apply) MR_TRY(tr_step_update(&tr, &part, lr));
        L.tm.opt += tr_now_s() - t0;
        mr_trace_end1(tr.trace.train, span_opt, "optimizer", "applied", tr.dv.on ? -1 : apply); /* device: unknown */
        /* report */
        const int64_t span_report = mr_trace_begin(tr.trace.train);
        if (isfinite(loss)) { /* a skipped overflow step does not poison the interval's mean (the
                               * device path: the device sums, loss is NaN here) */
            tr.loss_sum += loss;
            tr.interval++;
        }
        tr.step++;
        L.timed++;
        /* the device path reads its decisions back only here (tr_step_sync: one wait, on every
         * replica alike): before a log line, an evaluation, a checkpoint (tr_dev_pull), the end,
         * or each step for on_step */
        const int last = tr.step == c->steps;
        const int log_now = (c->log_every > 0 && tr.step % c->log_every == 0) || last;
        if (log_now && c->on_log && tr.rank == 0) {
            const mr_train_state ts0 = {tr.step, NULL, NULL, NULL, 0, NAN};
            c->on_log(c->on_log_ctx, &ts0, 0);
        }
        if (c->on_step || log_now) MR_TRY(tr_step_sync(&tr));
        if (c->on_step && tr.rank == 0) {
            MR_TRY(tr_dev_pull(&tr)); /* the callback reads the host shadow */
            if (tr.dv.on) apply = tr.last_apply, loss = tr.last_loss;
            mr_train_state ts = {tr.step, tr.ps, tr.opt, tr.scaling ? &tr.scaler : NULL, !apply, loss};
            c->on_step(c->on_step_ctx, &ts);
        }
        if (log_now) MR_TRY(log_step(&tr, &L, lr, res));
        mr_trace_end(tr.trace.train, span_report, "report");
        if (has_eval(c) && ((c->eval_every > 0 && tr.step % c->eval_every == 0) || last)) {
            const int64_t span_eval = mr_trace_begin(tr.trace.train);
            const double te = tr_now_s();
            MR_TRY(tr_step_sync(&tr)); /* a step that had to stop training fails before */
            MR_TRY(tr_bufs_broadcast(&tr)); /* replica 0's running statistics are the model's */
            MR_TRY(evaluate(c, tr.steps, &tr.dv, micro, comm, res));
            log_eval(c, L.metrics, &L.tb, tr.step, tr_now_s() - tr.time_origin, res);
            /* evaluation time is not training throughput: the interval's clock skips it (moving
             * t_last to now dropped the interval's earlier steps from the span while their
             * times and count stayed, which overstated samples/s and gave shares over 100%) */
            L.t_last += tr_now_s() - te;
            early = tr_early_stop_update(&tr, res) && !last; /* at the last step the run ends anyway */
            mr_trace_end(tr.trace.train, span_eval, "evaluate");
        }
        /* one replica stops for a signal that came at any time during the step; replicas stop on
         * the step they agreed on */
        if (!comm && g_stop_signal) stop = 1;
        /* after the evaluation: a run killed before the checkpoint redoes that evaluation */
        if (c->ckpt_dir && ((c->ckpt_every > 0 && tr.step % c->ckpt_every == 0) || last || stop || early)) {
            const double t1 = tr_now_s();
            const int64_t span_ckpt = mr_trace_begin(tr.trace.train);
            MR_TRY(save_checkpoint(&tr, res));
            mr_trace_end(tr.trace.train, span_ckpt, "checkpoint_save");
            L.t_last += tr_now_s() - t1; /* saving is not training throughput (it has its own log line) */
        }
        if (log_now) MR_TRY(tr_step_ctl_push(&tr)); /* now, not in the next step: the log step's own work */
        if (log_now && c->on_log && tr.rank == 0) {
            MR_TRY(tr_dev_pull(&tr));
            const mr_train_state ts1 = {tr.step, tr.ps, tr.opt, tr.scaling ? &tr.scaler : NULL,
                                        tr.dv.on ? !tr.last_apply : !apply, tr.dv.on ? tr.last_loss : loss};
            c->on_log(c->on_log_ctx, &ts1, 1);
        }
        mr_trace_end1(tr.trace.train, span_step, "step", "step", tr.step);
        MR_TRY(tr_trace_step_end(&tr, last || stop || early)); /* after its last step (or the run's) it closes */
        if (early) {
            char msg[512];
            tr_early_stop_message(&tr, msg, sizeof msg);
            if (!c->quiet) mr_log_info("%s", msg);
            res->early_stopped = tr.step;
            break;
        }
        if (stop) {
            res->stopped_by = g_stop_signal ? (int)g_stop_signal : SIGTERM; /* another replica's signal */
            if (!c->quiet) mr_log_info("stopping at step %lld on signal %d", (long long)tr.step, res->stopped_by);
            break;
        }
    }
    MR_TRY(tr_step_sync(&tr)); /* after a stop without a checkpoint: the scaler, the skips */
    if (resume && (res->resumed_from == c->steps || stopped_before)) {
        /* the checkpoint is the end of this run: nothing to train; report its evaluation
         * (stopped_before implies a checkpoint before train.steps) */
        if (!c->quiet && stopped_before) {
            char msg[512];
            tr_early_stop_message(&tr, msg, sizeof msg);
            mr_log_info("%s is where this run stopped early: nothing to train (%s; raise train.early_stop.patience "
                        "to go on, or set checkpoint.resume: never to start over)", rpath, msg);
        } else if (!c->quiet) {
            mr_log_info("%s is already at train.steps (%lld): nothing to train (raise train.steps to go on, or set "
                        "checkpoint.resume: never to start over)", rpath, (long long)c->steps);
        }
        if (stopped_before) res->early_stopped = tr.step;
        if (has_eval(c)) {
            MR_TRY(tr_bufs_broadcast(&tr));
            MR_TRY(evaluate(c, tr.steps, &tr.dv, micro, comm, res));
        }
    }
    res->steps = tr.step;
    res->seconds = tr_now_s() - L.t_start;
    res->skipped_steps = tr.scaling ? tr.scaler.skipped : 0;
    res->loss_scale = tr.scaling ? tr.scaler.scale : 1.0;
    res->early_stop_best = tr.es_best;
    res->early_stop_best_step = tr.es_best_step;
    if (vocab && c->sample_chars > 0 && !res->stopped_by && tr.rank == 0)
        MR_TRY(generate(c, tr.steps, &tr.dv, vocab, nvocab, res));
    res->compilations = mr_steps_compilations(tr.steps);
fail:
    mr_log_progress_end(); /* what the caller prints next starts on a line of its own */
    /* a failed GPU replica aborts its NCCL communicator now: tearing it down politely would wait
     * for peers that will never finish the collective */
    if (st != MR_OK && tr.dv.own_gcomm) mr_comm_abort(tr.dv.gcomm, 1, mr_last_error());
    if (st != MR_OK) tr_trace_fail(&tr); /* replica 0's spans up to the failure */
    if (L.metrics) fclose(L.metrics);
    mr_tb_close(L.tb);
    trainer_free(&tr);
    return st;
}

/* Local replicas: one thread each, over the local backend. A replica that fails aborts the group,
 * so the others stop at their next collective instead of waiting out the deadline. */
typedef struct local_replica {
    const mr_train_cfg *cfg;
    mr_train_cfg own; /* GPU replicas: the config with this replica's GPU as gpus[0] */
    mr_comm *comm;
    int threads; /* OpenMP threads for this replica's kernels */
    mr_train_result res;
    mr_status st;
    char err[1024];
} local_replica;

static void *local_main(void *arg) {
    local_replica *r = arg;
#ifdef _OPENMP
    omp_set_num_threads(r->threads);
#endif
    r->st = train_replica(r->cfg, r->comm, &r->res);
    if (r->st != MR_OK) {
        snprintf(r->err, sizeof r->err, "%s", mr_last_error());
        mr_comm_abort(r->comm, 1, r->err);
    }
    return NULL;
}

static mr_status train_local(const mr_train_cfg *cfg, mr_comm *job, mr_train_result *res) {
    const int n = cfg->replicas;
    mr_status st = MR_OK;
    mr_comm **comms = calloc((size_t)n, sizeof *comms);
    local_replica *reps = calloc((size_t)n, sizeof *reps);
    pthread_t *tid = calloc((size_t)n, sizeof *tid);
    int started = 0;
    MR_CHECK(comms && reps && tid, MR_ERR_NOMEM, "trainer: out of memory for %d replicas", n);
    const double timeout = cfg->comm_timeout_s > 0 ? cfg->comm_timeout_s : 300.0;
    if (job) MR_TRY(mr_comm_hier_new(job, n, timeout, comms)); /* local replicas x MPI ranks */
    else MR_TRY(mr_comm_local_new(n, timeout, comms));
    int cores = 1;
#ifdef _OPENMP
    cores = omp_get_max_threads();
#endif
    for (int r = 0; r < n; r++) {
        reps[r] = (local_replica){.cfg = cfg, .comm = comms[r], .threads = cores / n > 0 ? cores / n : 1};
        if (cfg->device_kind == MR_DEVICE_CUDA) {
            /* a thread per GPU: its kernels are asynchronous, so it needs one core at most */
            reps[r].own = *cfg;
            reps[r].own.gpus[0] = cfg->gpus[r];
            reps[r].cfg = &reps[r].own;
        }
        if (r > 0 && pthread_create(&tid[r], NULL, local_main, &reps[r]) != 0) {
            mr_comm_abort(comms[0], 1, "cannot start a replica thread");
            break;
        }
        started = r + 1;
    }
    local_main(&reps[0]); /* replica 0 runs here */
    for (int r = 1; r < started; r++) pthread_join(tid[r], NULL);
    /* report the root cause: the first replica that failed for a reason other than the abort */
    int cause = -1;
    for (int r = 0; r < n && cause < 0; r++)
        if (reps[r].st != MR_OK && reps[r].st != MR_ERR_COMM) cause = r;
    for (int r = 0; r < n && cause < 0; r++)
        if (reps[r].st != MR_OK) cause = r;
    if (started < n && cause < 0) st = mr_set_error(MR_ERR_NOMEM, "trainer: cannot start %d replica threads", n);
    if (cause >= 0) st = mr_set_error(reps[cause].st, "replica %d: %s", cause, reps[cause].err);
    *res = reps[0].res;
fail:
    if (comms)
        for (int r = 0; r < n; r++) mr_comm_free(comms[r]);
    free(comms);
    free(reps);
    free(tid);
    return st;
}

mr_status mr_train(const mr_train_cfg *cfg, mr_train_result *res) {
    g_stop_signal = 0;
    if (cfg->replicas > 1) return train_local(cfg, cfg->comm, res);
    if (cfg->comm) return train_replica(cfg, cfg->comm, res);
    return train_replica(cfg, NULL, res);
}

mr_status mr_evaluate_checkpoint(const mr_train_cfg *cfg, const char *checkpoint, mr_train_result *res) {
    mr_status st = MR_OK;
    trainer tr;
    memset(res, 0, sizeof *res);
    res->eval_loss = res->eval_accuracy = res->eval_perplexity = NAN;
    MR_TRY(trainer_init(&tr, cfg, 0, NULL));
    const mr_train_cfg *c = &tr.c;
    MR_CHECK(has_eval(c), MR_ERR_INVALID, "data.eval: the config has no evaluation data");
    mr_ckpt_reader *r = NULL;
    int foreign = mr_ckpt_open(checkpoint, 0, &r) != MR_OK;
    mr_ckpt_close(r);
    MR_TRY(tr_load_params(tr.ps, checkpoint, foreign, &res->steps));
    MR_TRY(tr_dev_push(&tr));
    double t0 = tr_now_s();
    MR_TRY(evaluate(c, tr.steps, &tr.dv, c->batch / c->accumulate, NULL, res));
    res->seconds = tr_now_s() - t0;
    res->compilations = mr_steps_compilations(tr.steps);
fail:
    trainer_free(&tr);
    return st;
}
