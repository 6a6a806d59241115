/* The training loop: a model's compiled steps (autodiff/steps.h) fed by the input pipeline
 * (data/data.h), updated by optim/, evaluated periodically, reporting where the time goes.
 *
 * Every log step it prints one line (or a one-line progress display on a terminal) and appends a
 * JSON object to <run_dir>/metrics.jsonl: step, time (s since the start), loss, lr, loss_scale,
 * samples_per_s, and the step time split into data_wait_s, forward_s, backward_s,
 * communication_s and optimizer_s (averages over the log interval). Every evaluation appends
 * step, time, eval_loss and eval_accuracy (classifiers) or eval_perplexity (language models).
 * Library code: it reports through mr_status; the CLI maps that to an exit code. */
#ifndef MR_TRAINER_H
#define MR_TRAINER_H

#include <stdint.h>
#include "models/models.h"
#include "optim/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_TEXT_HOLDOUT 64

typedef struct mr_train_cfg {
    mr_model_cfg model;
    mr_optim_cfg optim;
    mr_schedule_cfg schedule;   /* schedule.total is set to steps when 0 */
    double grad_clip;           /* global-norm clipping; 0: off */
    int64_t steps, batch;       /* optimizer steps; global batch (per step, over all micro-batches) */
    int64_t accumulate;         /* micro-batches per step (batch must divide by it); >= 1 */
    int64_t eval_every, log_every; /* 0: only at the end / never */
    uint64_t seed;              /* parameter init, shuffling */
    /* data: IDX image/label files for mlp and cnn; a token file for gpt */
    const char *train_images, *train_labels, *eval_images, *eval_labels;
    const char *train_tokens, *eval_tokens;
    int token_bytes;            /* 2 or 4 */
    /* or a text file read as UTF-8 characters (gpt; model.vocab becomes the text's character
     * count). When eval_text names the same file, its first MR_TEXT_HOLDOUT windows are held out
     * for evaluation and training skips them. */
    const char *train_text, *eval_text;
    int64_t sample_chars;       /* text gpt: characters generated after training (0: none) */
    int64_t shuffle;            /* shuffle buffer; 0: no shuffling */
    const char *run_dir;        /* metrics.jsonl goes there (created); NULL: no files */
    int quiet;                  /* no progress output */
    mr_dtype compute;           /* MR_F32, or MR_BF16 for mixed_bfloat16 (f32 master weights) */
} mr_train_cfg;

typedef struct mr_train_result {
    int64_t steps;
    double seconds;
    double last_loss;          /* mean training loss of the last log interval */
    double eval_loss, eval_accuracy, eval_perplexity; /* the final evaluation (NaN when none) */
    int compilations;
    char sample[2048];         /* the generated text (UTF-8), when sample_chars > 0 */
} mr_train_result;

/* Defaults: 1000 steps, batch 128, AdamW 1e-3, constant schedule, log every 50, eval at the end. */
mr_train_cfg mr_train_cfg_default(void);

/* mkdir -p: creates dir and its missing parents. MR_ERR_IO naming the path that failed. */
mr_status mr_mkdirs(const char *dir) MR_WUR;

/* Trains from scratch. MR_ERR_INVALID (a bad config, naming the field), MR_ERR_NOT_FOUND / IO /
 * FORMAT (data), MR_ERR_INVALID "non-finite loss at step N" when training diverges. */
mr_status mr_train(const mr_train_cfg *cfg, mr_train_result *res) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
