/* The training pipeline's augmentation maps (data.train.augment, data/augment.h), and which
 * samples a run consumed.
 *
 * Which samples a run consumed, for tests and debugging: with MIRROR_DATA_LOG=<path> in the
 * environment each replica appends to "<path>.<replica>" one line per sample it trains on or
 * evaluates:
 *   train <global position> <source index> <source epoch>
 *   eval <step> <source index> <source epoch>
 * The global position of a training sample is its place in the global sample sequence (the
 * training pipeline before the shard, train.c make_pipeline): step s, micro-batch m, element j of
 * replica r of W with micro-batches of b and `accumulate` A is ((s*A + m)*b + j)*W + r, so the
 * logs of every replica, sorted by position, are the sequence one replica with the global batch
 * reads. tests/unit/test_data_order.c and tests/mpi/data_order.sh compare these logs across
 * replica counts and resumes (docs/DESIGN.md, "Data pipeline determinism"). Unset, nothing is
 * opened or written. Lines are written whole with one fprintf into a per-replica file, so replicas
 * (threads or processes) never interleave. */
#include "train/train_impl.h"

#include <stdlib.h>

#include "core/log.h"

FILE *tr_data_log_open(int rank) {
    const char *base = getenv("MIRROR_DATA_LOG");
    if (!base || !*base) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", base, rank);
    FILE *f = fopen(path, "a");
    if (!f) mr_log_warn("MIRROR_DATA_LOG: cannot open %s: no sample log", path);
    return f;
}

void tr_data_log_batch(FILE *f, const char *tag, const mr_data_iter *it, int64_t pos0, int64_t stride) {
    if (!f) return;
    const int64_t n = mr_data_iter_last_indices(it, NULL, NULL, 0);
    int64_t *idx = malloc(sizeof *idx * (size_t)(n ? n : 1)), *epoch = malloc(sizeof *epoch * (size_t)(n ? n : 1));
    if (idx && epoch) {
        mr_data_iter_last_indices(it, idx, epoch, n);
        for (int64_t j = 0; j < n; j++)
            fprintf(f, "%s %lld %lld %lld\n", tag, (long long)(pos0 + j * stride), (long long)idx[j], (long long)epoch[j]);
        fflush(f);
    } else {
        fprintf(f, "%s: out of memory for the sample log\n", tag);
    }
    free(idx);
    free(epoch);
}

mr_status tr_data_augment(const mr_train_cfg *c, int train, mr_dataset **ds) {
    mr_status st = MR_OK;
    mr_dataset *next = NULL;
    if (c->augment.n == 0) return MR_OK;
    MR_CHECK(mr_model_task(&c->model) == MR_TASK_CLASSIFY, MR_ERR_INVALID,
             "data.train.augment: image augmentation for a language model; HINT: remove data.train.augment");
    /* one map thread like the image map (train.c make_pipeline): prefetch hides it behind the step */
    st = mr_data_augment(*ds, "x", &c->augment, train, c->seed, 1, &next);
    if (st != MR_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", mr_last_error());
        return mr_set_error(st, "data.train.augment: %s", msg);
    }
    mr_data_free(*ds);
    *ds = next;
fail:
    return st;
}
