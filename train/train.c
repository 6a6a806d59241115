/* The training loop (see train.h): pipelines, compiled steps, loss scaling, the optimizer,
 * evaluation, metrics and checkpoints (their contents: train_ckpt.c). */
#include "train/train_impl.h"
#include "core/vec.h"
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

/* images (IDX) for mlp/cnn, tokens for gpt; training pipelines shuffle and repeat forever and
 * drop the last partial batch; evaluation pipelines see every element once. With world > 1
 * replicas, replica `rank` keeps every world-th element: for training after the shuffle (every
 * replica shuffles the same indices), so the world's micro-batches of one step are exactly the
 * elements one replica with the global batch would take; for evaluation right after the source. */
static mr_status make_pipeline(const mr_train_cfg *c, int train, int64_t batch, int64_t *image_numel, int world,
                               int rank, pipeline *p) {
    mr_status st = MR_OK;
    mr_dataset *ds = NULL, *next = NULL;
    memset(p, 0, sizeof *p);
    if (c->model.type == MR_MODEL_GPT && (c->train_text || c->eval_text)) {
        const char *path = train ? c->train_text : c->eval_text;
        MR_TRY(mr_data_from_text(path, c->model.context, MR_DATA_TEXT_CHARS, &ds));
        if (c->train_text && c->eval_text && !strcmp(c->train_text, c->eval_text))
            THEN(train ? mr_data_skip(ds, MR_TEXT_HOLDOUT, &next) : mr_data_take(ds, MR_TEXT_HOLDOUT, &next));
        if (!train && world > 1) THEN(mr_data_shard(ds, world, rank, &next));
    } else if (c->model.type == MR_MODEL_GPT) {
        const char *path = train ? c->train_tokens : c->eval_tokens;
        MR_TRY(mr_data_from_tokens(path, c->token_bytes, c->model.context, MR_DATA_TOKENS_RAW, &ds));
        if (!train && world > 1) THEN(mr_data_shard(ds, world, rank, &next));
    } else {
        MR_TRY(mr_data_from_idx(train ? c->train_images : c->eval_images, train ? c->train_labels : c->eval_labels, &ds));
        if (!train && world > 1) THEN(mr_data_shard(ds, world, rank, &next));
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
        if (train && world > 1) THEN(mr_data_shard(ds, world, rank, &next));
        /* one map thread: the loop's compute already uses every core (helper threads would only
         * contend); prefetch hides the map behind the step */
        THEN(mr_data_map(ds, normalize_image, image_numel, &out, 1, &next));
    }
    if (c->model.type == MR_MODEL_GPT && train) {
        if (c->shuffle > 0) THEN(mr_data_shuffle(ds, c->shuffle, c->seed, 1, &next));
        THEN(mr_data_repeat(ds, -1, &next));
        if (world > 1) THEN(mr_data_shard(ds, world, rank, &next));
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
static mr_status evaluate(const mr_train_cfg *c, mr_steps *steps, tr_device *dv, int64_t batch, mr_comm *comm,
                         eval_out *out) {
    mr_status st = MR_OK;
    pipeline p;
    int64_t numel = 0, seen = 0, correct = 0;
    double loss_sum = 0.0;
    MR_TRY(make_pipeline(c, 0, batch, &numel, comm ? mr_comm_size(comm) : 1, comm ? mr_comm_rank(comm) : 0, &p));
    for (;;) {
        mr_data_elem e;
        int end = 0;
        MR_TRY(mr_data_iter_next(p.it, &e, &end));
        if (end) break;
        int64_t b = e.shape[0].dim[0];
        mr_step *s = NULL;
        MR_TRY(mr_steps_get(steps, b, 0, &s));
        MR_TRY(tr_dev_feed(dv, s, e.data[0], e.data[1]));
        MR_TRY(mr_plan_run(s->plan));
        const void *h = NULL;
        MR_TRY(tr_dev_read(dv, s, s->io.loss, sizeof(float), &h));
        loss_sum += (double)*(const float *)h * (double)b;
        seen += b;
        if (c->model.type != MR_MODEL_GPT) {
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
    if (comm) { /* every replica evaluated its shard: add them up */
        double sums[3] = {loss_sum, (double)correct, (double)seen};
        MR_TRY(mr_comm_allreduce(comm, sums, 3, MR_F64, MR_REDUCE_SUM));
        loss_sum = sums[0];
        correct = (int64_t)sums[1];
        seen = (int64_t)sums[2];
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
    MR_TRY(make_pipeline(&from, 0, 1, &unused, 1, 0, &p));
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

/* Set from a signal handler; the only mutable global here, because a handler can reach nothing
 * else. The loop reads it between steps. */
static volatile sig_atomic_t g_stop_signal;

void mr_train_request_stop(int signo) { g_stop_signal = signo > 0 ? signo : SIGTERM; }

static void trainer_free(trainer *t) {
    tr_dev_free(t);
    free(t->zbuf);
    free(t->zshard);
    pipeline_free(&t->train);
    mr_optim_free(t->opt);
    mr_steps_free(t->steps);
    mr_params_free(t->ps);
    memset(t, 0, sizeof *t);
}

/* The model (sized from the data), its compiled training step, initial parameters and the
 * optimizer: a run at step 0. The training pipeline is built for micro-batches. */
static mr_status trainer_init(trainer *t, const mr_train_cfg *cfg, int with_optim, mr_comm *comm) {
    mr_status st = MR_OK;
    memset(t, 0, sizeof *t);
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
    MR_TRY(make_pipeline(c, 1, micro, &t->image_numel, t->world, t->rank, &t->train));
    t->train_size = mr_data_source_size(t->train.ds);
    if (c->model.type == MR_MODEL_MLP) c->model.sizes[0] = t->image_numel;
    if (c->model.type == MR_MODEL_CNN) {
        const mr_data_spec *sp = mr_data_element_spec(t->train.ds);
        c->model.in_channels = 1;
        c->model.height = sp->comp[0].shape.dim[1];
        c->model.width = sp->comp[0].shape.dim[2];
    }
    if (c->model.type == MR_MODEL_GPT && c->train_text) {
        const int32_t *vocab = NULL;
        int64_t nvocab = 0;
        MR_TRY(mr_data_text_vocab(t->train.ds, &vocab, &nvocab));
        if (c->model.vocab != nvocab && !c->quiet)
            mr_log_info("model.vocab: %lld characters in %s (the config said %lld)", (long long)nvocab, c->train_text,
                        (long long)c->model.vocab);
        c->model.vocab = nvocab;
    }
    MR_TRY(mr_params_new(&t->ps));
    MR_TRY(mr_steps_new(mr_model_step_build, &t->c.model, t->ps, MR_DEVICE_CPU, &t->steps));
    mr_steps_set_compute(t->steps, c->compute);
    mr_steps_set_allow_tf32(t->steps, c->allow_tf32);
    const int device = c->device_kind == MR_DEVICE_CUDA || c->device_path;
    if (device) {
        /* the device buffers follow the registry's layout: register before the first compilation */
        MR_TRY(mr_steps_register(t->steps, micro));
        t->n = mr_params_buffer_numel(t->ps);
        if (with_optim && c->shard_optimizer && t->world > 1) MR_TRY(tr_zero_init(t));
        MR_TRY(tr_dev_init(t, with_optim));
    }
    mr_step *s = NULL;
    MR_TRY(mr_steps_get(t->steps, micro, 1, &s)); /* registers and allocates the parameters */
    MR_TRY(mr_params_init(t->ps, c->seed));
    t->n = mr_params_buffer_numel(t->ps);
    if (!device && with_optim && c->shard_optimizer && t->world > 1) MR_TRY(tr_zero_init(t));
    if (with_optim) MR_TRY(mr_optim_new(&c->optim, t->zero ? t->zlen : t->n, &t->opt));
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
    double t0 = now_s();
    MR_TRY(tr_ckpt_save(t, path));
    if (t->c.ckpt_keep > 0 && t->rank == 0) MR_TRY(mr_ckpt_prune(t->c.ckpt_dir, (int)t->c.ckpt_keep));
    snprintf(res->checkpoint, sizeof res->checkpoint, "%s", path);
    if (!t->c.quiet) mr_log_info("saved %s (%.2f s)", path, now_s() - t0);
fail:
    return st;
}

/* One replica's training loop (all of it when comm is NULL). */
static mr_status train_replica(const mr_train_cfg *cfg, mr_comm *comm, mr_train_result *res) {
    mr_status st = MR_OK;
    trainer tr;
    FILE *metrics = NULL;
    float *acc = NULL;
    bucket *buckets = NULL;
    int nbuckets = 0;
    mr_comm_queue *queue = NULL;
    memset(res, 0, sizeof *res);
    res->eval_loss = res->eval_accuracy = res->eval_perplexity = NAN;
    MR_TRY(trainer_init(&tr, cfg, 1, comm));
    const mr_train_cfg *c = &tr.c;
    const int64_t micro = c->batch / (c->accumulate * tr.world), n = tr.n;
    const int32_t *vocab = NULL;
    int64_t nvocab = 0;
    if (c->model.type == MR_MODEL_GPT && c->train_text) MR_TRY(mr_data_text_vocab(tr.train.ds, &vocab, &nvocab));
    mr_step *s = NULL;
    MR_TRY(mr_steps_get(tr.steps, micro, 1, &s));
    char rpath[4096];
    int resume = 0;
    memset(rpath, 0, sizeof rpath);
    if (tr.rank == 0) MR_TRY(pick_resume(c, rpath, sizeof rpath, &resume));
    if (comm) { /* replica 0 decides, so every replica loads the same file */
        MR_TRY(mr_comm_broadcast(comm, rpath, (int64_t)sizeof rpath, MR_U8, 0));
        resume = rpath[0] != '\0';
    }
    if (resume) {
        double t0 = now_s();
        MR_TRY(tr_ckpt_load(&tr, rpath));
        res->resumed_from = tr.step;
        if (!c->quiet) mr_log_info("resumed from %s at step %lld (loaded in %.3f s)", rpath, (long long)tr.step, now_s() - t0);
    } else if (c->init_from && *c->init_from) {
        int64_t unused = 0;
        MR_TRY(tr_load_params(tr.ps, c->init_from, 1, &unused));
        if (!c->quiet) mr_log_info("parameters initialised from %s", c->init_from);
    }
    if (comm) MR_TRY(tr_replicas_start(&tr));
    tr_device *dv = &tr.dv;
    const int dp = dv->on; /* the device path: parameters, gradients and optimizer on dv->dev */
    MR_TRY(tr_dev_push(&tr)); /* what was loaded or broadcast */
    MR_TRY(tr_dev_comm(&tr));
    float *params = dp ? dv->d_params : mr_params_buffer(tr.ps), *grads = dp ? dv->d_grads : mr_params_grad_buffer(tr.ps);
    mr_comm *gcomm = dp ? dv->gcomm : comm; /* who all-reduces the gradients */
    mr_optim *opt = dp ? dv->opt : tr.opt;
    /* with several replicas and no accumulation, each gradient bucket is all-reduced on the
     * communication thread as soon as the backward has finished it */
    /* bench/run_dist.sh's baseline: the same replicas with no gradient exchange at all (the
     * replicas then drift apart; never for training) */
    const int no_allreduce = comm && getenv("MIRROR_BENCH_NO_ALLREDUCE") && !strcmp(getenv("MIRROR_BENCH_NO_ALLREDUCE"), "1");
    if (no_allreduce && tr.rank == 0) mr_log_warn("MIRROR_BENCH_NO_ALLREDUCE=1: replicas do not exchange gradients");
    if (comm && !dp && c->accumulate == 1 && !no_allreduce && !tr.zero && mr_comm_backend_of(comm) != MR_COMM_HIER) {
        double cap = (c->bucket_mb > 0 ? c->bucket_mb : 16.0) * 1048576.0;
        MR_TRY(mr_train_make_buckets(tr.ps, s->plan, grads, cap, &buckets, &nbuckets));
        MR_TRY(mr_comm_queue_new(comm, &queue));
    }
    double busy0 = 0;
    float *d_acc = NULL; /* the accumulation buffer: host (acc) or device (dv->d_acc) */
    if (c->accumulate > 1 && dp) {
        d_acc = dv->d_acc;
    } else if (c->accumulate > 1) {
        acc = calloc((size_t)n, sizeof *acc);
        MR_CHECK(acc, MR_ERR_NOMEM, "trainer: out of memory for the accumulation buffer");
        d_acc = acc;
    }
    /* CUDA graphs: the step is captured at its second run (the first one creates the cuBLAS,
     * cuBLASLt and cuDNN state lazily, which may not happen inside a capture) */
    int want_graphs = dp && dv->dev.kind == MR_DEVICE_CUDA && c->cuda_graphs;
    if (want_graphs && mr_plan_has_dropout(s->plan)) {
        want_graphs = 0;
        if (!c->quiet) mr_log_info("CUDA graphs off: the model has dropout, whose masks change every step");
    }
    if (c->run_dir) {
        MR_TRY(mr_mkdirs(c->run_dir));
        MR_TRY(open_metrics(c->run_dir, tr.step, &metrics));
    }
    const int tty = progress_on_tty();
    const double t_start = now_s();
    tr.time_origin = t_start - tr.elapsed_before; /* metrics "time" continues across resumes */
    double t_data = 0, t_fwd = 0, t_bwd = 0, t_opt = 0, t_comm = 0, t_log = t_start;
    int64_t timed = 0; /* steps since the last log line */
    if (!c->quiet && tr.rank == 0 && c->schedule.warmup > c->steps)
        mr_log_warn("schedule.warmup (%lld steps) is longer than train.steps (%lld): the learning rate rises for the "
                    "whole run and never reaches optimizer.lr", (long long)c->schedule.warmup, (long long)c->steps);
    if (!c->quiet)
        mr_log_info("training %lld parameters for %lld steps, batch %lld, %s%s, GEMM: %s",
                    (long long)mr_params_total(tr.ps), (long long)c->steps, (long long)c->batch,
                    c->compute == MR_F32 ? "float32" : c->compute == MR_BF16 ? "mixed_bfloat16" : "mixed_float16",
                    tr.scaling ? " with dynamic loss scaling" : "", mr_cpu_gemm_provider());
    while (tr.step < c->steps) {
        const int64_t step = tr.step; /* 0-based index of this step */
        double step_loss = 0;
        MR_TRY(tr_dev_set_loss_scale(&tr, s, tr.scaling ? (float)tr.scaler.scale : 1.0f));
        if (want_graphs && step > res->resumed_from) {
            MR_TRY(mr_plan_set_graphs(s->plan, 1));
            want_graphs = 0;
        }
        for (int64_t m = 0; m < c->accumulate; m++) {
            mr_data_elem e;
            int end = 0;
            double t0 = now_s();
            MR_TRY(mr_data_iter_next(tr.train.it, &e, &end));
            MR_CHECK(!end, MR_ERR_INVALID, "data.train: the training data is empty");
            double t1 = now_s();
            MR_TRY(tr_dev_feed(dv, s, e.data[0], e.data[1]));
            mr_plan_set_dropout_step(s->plan, (uint64_t)(step * c->accumulate + m)); /* fresh masks each micro-step */
            double t2;
            if (dp) {
                /* one launch (a captured graph) or the kernels back to back; the forward and the
                 * backward are timed together (as forward_s) once the loss is back */
                MR_TRY(mr_plan_run(s->plan));
            } else {
                MR_TRY(mr_plan_run_range(s->plan, 0, s->n_forward));
            }
            t2 = now_s();
            if (queue) { /* never on the device path */
                int32_t at = s->n_forward;
                for (int b = 0; b < nbuckets; b++) {
                    if (buckets[b].ready > at) {
                        MR_TRY(mr_plan_run_range(s->plan, at, buckets[b].ready));
                        at = buckets[b].ready;
                    }
                    MR_TRY(mr_comm_queue_allreduce(queue, grads + buckets[b].off, buckets[b].n, MR_F32, MR_REDUCE_AVG,
                                                   &buckets[b].ticket));
                }
                MR_TRY(mr_plan_run_range(s->plan, at, mr_plan_num_kernels(s->plan)));
            } else if (!dp) {
                MR_TRY(mr_plan_run_range(s->plan, s->n_forward, mr_plan_num_kernels(s->plan)));
            }
            const void *hl = NULL;
            MR_TRY(tr_dev_read(dv, s, s->io.loss, sizeof(float), &hl)); /* waits for the device */
            double t3 = now_s();
            t_data += t1 - t0;
            t_fwd += (dp ? t3 : t2) - t1;
            t_bwd += dp ? 0.0 : t3 - t2;
            step_loss += *(const float *)hl;
            if (d_acc) {
                /* the gradients of micro-batch means, averaged: the gradient of the batch mean */
                const float w = 1.0f / (float)c->accumulate;
                MR_TRY(mr_vec_axpby(dp ? dv->dev : mr_device_cpu(), dv->stream, d_acc, m == 0 ? 0.0f : 1.0f, grads, w, n));
            }
        }
        step_loss /= (double)c->accumulate;
        float *g = d_acc ? d_acc : grads;
        if (c->inject_nonfinite_at == step + 1) { /* on every replica, before the exchange */
            static const float inf = INFINITY;
            if (dp) MR_TRY(dv->be->copy(dv->dev.index, g + n / 2, &inf, sizeof inf,
                                        dv->dev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D, dv->stream));
            else g[n / 2] = INFINITY;
        }
        int stop = g_stop_signal != 0;
        if (comm) {
            /* the replicas' gradients averaged (the gradient of the global batch's mean loss), and
             * the loss and any stop request agreed, so every replica takes the same decisions */
            double t5 = now_s();
            double agree[2] = {step_loss, stop};
            if (dp) {
                /* NCCL runs on its own stream: the accumulation and any injected value must be
                 * done. The host agreement goes first: it doubles as a per-step barrier, so a
                 * replica that failed before the exchange aborts the others through their host
                 * communicator instead of leaving them in an NCCL kernel until the deadline, and
                 * no replica launches NCCL's spinning kernels while another still allocates */
                MR_TRY(dv->be->stream_sync(dv->stream));
                MR_TRY(mr_comm_allreduce(comm, agree, 2, MR_F64, MR_REDUCE_SUM));
            }
            if (queue) /* what the backward did not hide */
                for (int b = 0; b < nbuckets; b++) MR_TRY(mr_comm_queue_wait(queue, buckets[b].ticket));
            else if (tr.zero)
                MR_TRY(tr_zero_reduce(&tr, g));
            else if (!no_allreduce)
                MR_TRY(mr_comm_allreduce(gcomm, g, n, MR_F32, MR_REDUCE_AVG)); /* NCCL on device memory */
            if (!dp) MR_TRY(mr_comm_allreduce(comm, agree, 2, MR_F64, MR_REDUCE_SUM));
            step_loss = agree[0] / (double)tr.world;
            stop = agree[1] > 0;
            t_comm += now_s() - t5;
        }
        double t4 = now_s();
        /* what this replica updates: everything, or with a sharded optimizer (ZeRO-1) its shard */
        float *upd_g = tr.zero ? tr.zshard : g, *upd_p = tr.zero ? params + tr.zoff : params;
        const int64_t upd_n = tr.zero ? tr.zlen : n;
        int apply = 1;
        const mr_device gdev = dp ? dv->dev : mr_device_cpu();
        double sumsq = NAN; /* the device path's sum of squares of upd_g, when known */
        if (tr.scaling) {
            /* GradScaler: a non-finite gradient (or loss) skips the update and halves the scale */
            int finite;
            if (dp) { /* one pass gives the finite check (and the norm, when nothing is unscaled) */
                MR_TRY(mr_vec_sumsq(gdev, dv->stream, upd_g, upd_n, dv->d_scratch, &sumsq));
                finite = isfinite(step_loss) && isfinite(sumsq);
            } else {
                finite = isfinite(step_loss) && mr_grads_finite(upd_g, upd_n);
            }
            if (tr.zero) MR_TRY(tr_zero_all(&tr, &finite));
            double scale = tr.scaler.scale;
            apply = mr_loss_scaler_update(&tr.scaler, finite);
            MR_CHECK(apply || scale > tr.scaler.min_scale || isfinite(step_loss), MR_ERR_NUMERIC,
                     "non-finite loss (%g) at step %lld with the loss scale at its floor (%g); HINT: lower "
                     "optimizer.lr, set optimizer.grad_clip, or use mixed_bfloat16",
                     step_loss, (long long)step, tr.scaler.min_scale);
            if (apply && dp) {
                MR_TRY(mr_vec_scale(gdev, dv->stream, upd_g, (float)(1.0 / scale), upd_n)); /* as mr_grads_unscale */
                sumsq = NAN;
            } else if (apply) {
                mr_grads_unscale(upd_g, upd_n, scale);
            }
        } else {
            MR_CHECK(isfinite(step_loss), MR_ERR_NUMERIC,
                     "non-finite loss (%g) at step %lld; HINT: lower optimizer.lr or set optimizer.grad_clip%s", step_loss,
                     (long long)step,
                     dp && dv->dev.kind == MR_DEVICE_CUDA
                         ? " (on a GPU a label or token id outside [0, classes or vocab) also gives a NaN loss)"
                         : "");
            if (c->inject_nonfinite_at == step + 1) apply = 0; /* an injected inf without a scaler: drop it */
        }
        double lr = mr_schedule_lr(&c->schedule, c->optim.lr, step);
        if (apply) {
            double norm = 0;
            if (c->grad_clip > 0 && tr.zero) {
                MR_TRY(tr_zero_clip(&tr, c->grad_clip));
            } else if (c->grad_clip > 0 && dp) {
                /* mr_clip_grad_norm's arithmetic on the device */
                if (isnan(sumsq)) MR_TRY(mr_vec_sumsq(gdev, dv->stream, g, n, dv->d_scratch, &sumsq));
                norm = sqrt(sumsq);
                if (isfinite(norm) && norm > c->grad_clip)
                    MR_TRY(mr_vec_scale(gdev, dv->stream, g, (float)(c->grad_clip / (norm + 1e-6)), n));
            } else if (c->grad_clip > 0) {
                mr_clip_grad_norm(g, n, c->grad_clip, &norm);
            }
            MR_TRY(mr_optim_step(opt, upd_p, upd_g, lr));
            if (tr.zero) MR_TRY(tr_zero_gather(&tr)); /* every replica's shard to every replica */
        }
        t_opt += now_s() - t4;
        if (isfinite(step_loss)) { /* a skipped overflow step does not poison the interval's mean */
            tr.loss_sum += step_loss;
            tr.interval++;
        }
        tr.step++;
        timed++;
        if (c->on_step && tr.rank == 0) {
            MR_TRY(tr_dev_pull(&tr)); /* the callback reads the host shadow */
            mr_train_state ts = {tr.step, tr.ps, tr.opt, tr.scaling ? &tr.scaler : NULL, !apply, step_loss};
            c->on_step(c->on_step_ctx, &ts);
        }
        int last = tr.step == c->steps;
        if ((c->log_every > 0 && tr.step % c->log_every == 0) || last) {
            double t = now_s(), k = (double)(tr.interval > 0 ? tr.interval : 1);
            double steps_timed = (double)(timed > 0 ? timed : 1);
            double sps = (double)c->batch * steps_timed / (t - t_log);
            res->last_loss = tr.interval > 0 ? tr.loss_sum / k : NAN;
            double scale_now = tr.scaling ? tr.scaler.scale : 1.0;
            /* the share of the all-reduce time that ran behind the backward (0 without overlap) */
            double hidden = 0;
            if (queue) {
                double busy = mr_comm_queue_busy_seconds(queue) - busy0;
                hidden = busy > 0 ? 1.0 - t_comm / busy : 0;
                if (hidden < 0) hidden = 0;
                busy0 += busy;
            }
            if (metrics) {
                fprintf(metrics,
                        "{\"step\": %lld, \"time\": %.3f, \"loss\": %.6f, \"lr\": %.6g, \"loss_scale\": %g, "
                        "\"skipped_steps\": %lld, \"samples_per_s\": %.1f, \"data_wait_s\": %.6f, \"forward_s\": %.6f, "
                        "\"backward_s\": %.6f, \"communication_s\": %.6f, \"communication_hidden\": %.3f, "
                        "\"optimizer_s\": %.6f}\n",
                        (long long)tr.step, t - tr.time_origin, res->last_loss, lr, scale_now,
                        (long long)(tr.scaling ? tr.scaler.skipped : 0), sps, t_data / steps_timed,
                        t_fwd / steps_timed, t_bwd / steps_timed, t_comm / steps_timed, hidden, t_opt / steps_timed);
                fflush(metrics);
            }
            if (!c->quiet && !c->no_progress) {
                double eta = (t - t_start) / (double)(tr.step - res->resumed_from) * (double)(c->steps - tr.step);
                char scale_txt[64] = "";
                if (tr.scaling)
                    snprintf(scale_txt, sizeof scale_txt, "  scale %g (%lld skipped)", tr.scaler.scale,
                             (long long)tr.scaler.skipped);
                char comm_txt[32] = "";
                if (comm)
                    snprintf(comm_txt, sizeof comm_txt, " comm %.0f%% (%.0f%% hidden)", 100 * t_comm / (t - t_log),
                             100 * hidden);
                printf("%sstep %lld/%lld  loss %.4f  lr %.3g%s  %.0f samples/s  data %.0f%% fwd %.0f%% bwd %.0f%%%s "
                       "opt %.0f%%  ETA %.0fs%s",
                       tty ? "\r" : "", (long long)tr.step, (long long)c->steps, res->last_loss, lr, scale_txt, sps,
                       100 * t_data / (t - t_log), 100 * t_fwd / (t - t_log), 100 * t_bwd / (t - t_log), comm_txt,
                       100 * t_opt / (t - t_log), eta, tty ? "   " : "\n");
                fflush(stdout);
                if (tty) mr_log_progress_open(1); /* the next message starts on a new line */
            }
            t_log = t;
            t_data = t_fwd = t_bwd = t_opt = t_comm = tr.loss_sum = 0;
            tr.interval = timed = 0;
        }
        const int have_eval = c->model.type == MR_MODEL_GPT ? (c->eval_tokens || c->eval_text) : c->eval_images != NULL;
        if (have_eval && ((c->eval_every > 0 && tr.step % c->eval_every == 0) || last)) {
            eval_out ev;
            MR_TRY(evaluate(c, tr.steps, &tr.dv, micro, comm, &ev));
            res->eval_loss = ev.loss;
            res->eval_accuracy = ev.accuracy;
            res->eval_perplexity = ev.perplexity;
            if (metrics) {
                if (c->model.type == MR_MODEL_GPT)
                    fprintf(metrics, "{\"step\": %lld, \"time\": %.3f, \"eval_loss\": %.6f, \"eval_perplexity\": %.4f}\n",
                            (long long)tr.step, now_s() - tr.time_origin, ev.loss, ev.perplexity);
                else
                    fprintf(metrics, "{\"step\": %lld, \"time\": %.3f, \"eval_loss\": %.6f, \"eval_accuracy\": %.6f}\n",
                            (long long)tr.step, now_s() - tr.time_origin, ev.loss, ev.accuracy);
                fflush(metrics);
            }
            if (!c->quiet) {
                mr_log_progress_end();
                if (c->model.type == MR_MODEL_GPT)
                    printf("eval at step %lld: loss %.4f  perplexity %.3f\n", (long long)tr.step,
                           ev.loss, ev.perplexity);
                else
                    printf("eval at step %lld: loss %.4f  accuracy %.4f\n", (long long)tr.step,
                           ev.loss, ev.accuracy);
                fflush(stdout);
            }
            t_log = now_s(); /* evaluation time is not training throughput */
        }
        /* one replica stops for a signal that came at any time during the step; replicas stop on
         * the step they agreed on */
        if (!comm && g_stop_signal) stop = 1;
        /* after the evaluation: a run killed before the checkpoint redoes that evaluation */
        if (c->ckpt_dir && ((c->ckpt_every > 0 && tr.step % c->ckpt_every == 0) || last || stop)) {
            double t0 = now_s();
            MR_TRY(save_checkpoint(&tr, res));
            t_log += now_s() - t0; /* saving is not training throughput (it has its own log line) */
        }
        if (stop) {
            res->stopped_by = g_stop_signal ? (int)g_stop_signal : SIGTERM; /* another replica's signal */
            if (!c->quiet) mr_log_info("stopping at step %lld on signal %d", (long long)tr.step, res->stopped_by);
            break;
        }
    }
    if (resume && res->resumed_from == c->steps) {
        /* the checkpoint is the end of this run: nothing to train; report its evaluation */
        const int have_eval = c->model.type == MR_MODEL_GPT ? (c->eval_tokens || c->eval_text) : c->eval_images != NULL;
        if (!c->quiet)
            mr_log_info("%s is already at train.steps (%lld): nothing to train (raise train.steps to go on, or set "
                        "checkpoint.resume: never to start over)", rpath, (long long)c->steps);
        if (have_eval) {
            eval_out ev;
            MR_TRY(evaluate(c, tr.steps, &tr.dv, micro, comm, &ev));
            res->eval_loss = ev.loss;
            res->eval_accuracy = ev.accuracy;
            res->eval_perplexity = ev.perplexity;
        }
    }
    res->steps = tr.step;
    res->seconds = now_s() - t_start;
    res->skipped_steps = tr.scaling ? tr.scaler.skipped : 0;
    res->loss_scale = tr.scaling ? tr.scaler.scale : 1.0;
    if (vocab && c->sample_chars > 0 && !res->stopped_by && tr.rank == 0)
        MR_TRY(generate(c, tr.steps, &tr.dv, vocab, nvocab, res));
    res->compilations = mr_steps_compilations(tr.steps);
fail:
    mr_log_progress_end(); /* what the caller prints next starts on a line of its own */
    /* a failed GPU replica aborts its NCCL communicator now: tearing it down politely would wait
     * for peers that will never finish the collective */
    if (st != MR_OK && tr.dv.own_gcomm) mr_comm_abort(tr.dv.gcomm, 1, mr_last_error());
    if (metrics) fclose(metrics);
    free(acc);
    mr_comm_queue_free(queue);
    free(buckets);
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
    MR_CHECK(c->model.type == MR_MODEL_GPT ? (c->eval_tokens || c->eval_text) : c->eval_images != NULL,
             MR_ERR_INVALID, "data.eval: the config has no evaluation data");
    mr_ckpt_reader *r = NULL;
    int foreign = mr_ckpt_open(checkpoint, 0, &r) != MR_OK;
    mr_ckpt_close(r);
    MR_TRY(tr_load_params(tr.ps, checkpoint, foreign, &res->steps));
    MR_TRY(tr_dev_push(&tr));
    eval_out ev;
    double t0 = now_s();
    MR_TRY(evaluate(c, tr.steps, &tr.dv, c->batch / c->accumulate, NULL, &ev));
    res->seconds = now_s() - t0;
    res->eval_loss = ev.loss;
    res->eval_accuracy = ev.accuracy;
    res->eval_perplexity = ev.perplexity;
    res->compilations = mr_steps_compilations(tr.steps);
fail:
    trainer_free(&tr);
    return st;
}
