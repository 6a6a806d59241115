/* The trainer's replicas (MirroredStrategy over distribute/comm.h): the start of a run with
 * several replicas — one set of parameters and optimizer state for all, and a handshake that
 * catches a rank launched with another config, model or mirror build before any step runs. The
 * per-step all-reduce lives in the loop (train.c), the checkpoint's per-replica data state in
 * train_ckpt.c. */
#include "train/train_impl.h"
#include "core/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MIRROR_VERSION
#define MIRROR_VERSION "unknown"
#endif

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t fnv_str(uint64_t h, const char *s) { return fnv(h, s, strlen(s) + 1); }

enum { H_VERSION, H_CONFIG, H_PARAMS, H_COUNT };

mr_status tr_replicas_start(trainer *t) {
    mr_status st = MR_OK;
    int64_t mine[H_COUNT], *all = NULL;
    const uint64_t basis = 0xcbf29ce484222325ull;
    mine[H_VERSION] = (int64_t)fnv_str(basis, MIRROR_VERSION);
    mine[H_CONFIG] = (int64_t)fnv_str(basis, t->c.config_text ? t->c.config_text : "");
    uint64_t h = basis;
    for (int32_t i = 0; i < mr_params_count(t->ps); i++) {
        mr_shape sh = mr_params_shape(t->ps, i);
        h = fnv_str(h, mr_params_name(t->ps, i));
        h = fnv(h, &sh.ndim, sizeof sh.ndim);
        h = fnv(h, sh.dim, sizeof(int64_t) * (size_t)sh.ndim);
    }
    mine[H_PARAMS] = (int64_t)h;
    all = calloc((size_t)t->world * H_COUNT, sizeof *all);
    MR_CHECK(all, MR_ERR_NOMEM, "trainer: out of memory for the handshake");
    MR_TRY(mr_comm_allgather(t->comm, mine, all, H_COUNT, MR_I64));
    static const char *const what[H_COUNT] = {"mirror build (version)", "experiment configuration (YAML after --set)",
                                              "model parameters (names and shapes)"};
    static const char *const hint[H_COUNT] = {
        "install the same mirror build on every node", "launch every rank with the same config file and --set arguments",
        "launch every rank with the same model config and data (the data sets the input size and vocabulary)"};
    for (int k = 0; k < H_COUNT; k++) {
        char ranks[256] = "";
        int bad = 0;
        for (int r = 1; r < t->world; r++)
            if (all[r * H_COUNT + k] != all[k]) {
                if (bad < 8) snprintf(ranks + strlen(ranks), sizeof ranks - strlen(ranks), "%s%d", bad ? ", " : "", r);
                bad++;
            }
        MR_CHECK(!bad, MR_ERR_INVALID, "replicas differ: the %s of rank(s) %s%s is not rank 0's; HINT: %s", what[k],
                 ranks, bad > 8 ? " and more" : "", hint[k]);
    }
    /* replica 0's values everywhere (they agree already when seeded alike; a resumed or
     * init_from run relies on it less than on the file, but nothing may drift) */
    MR_TRY(mr_comm_broadcast(t->comm, mr_params_buffer(t->ps), t->n, MR_F32, 0));
    for (int k = 0; k < mr_optim_num_slots(t->opt) && !t->zero; k++) /* a shard is each replica's own */
        MR_TRY(mr_comm_broadcast(t->comm, mr_optim_slot(t->opt, k), t->n, MR_F32, 0));
    if (t->rank == 0 && !t->c.quiet)
        mr_log_info("%d replicas (%s backend): handshake passed, parameters broadcast from replica 0", t->world,
                    mr_comm_backend_of(t->comm) == MR_COMM_MPI ? "mpi" : "local");
fail:
    free(all);
    return st;
}

/* ---- ZeRO-1: the optimizer state sharded over the replicas -------------------------------------- */

mr_status tr_zero_init(trainer *t) {
    t->zero = 1;
    t->zshard_n = (t->n + t->world - 1) / t->world;
    t->zoff = (int64_t)t->rank * t->zshard_n;
    t->zlen = t->n - t->zoff < t->zshard_n ? t->n - t->zoff : t->zshard_n;
    if (t->zlen < 0) t->zlen = 0;
    if (t->zlen == 0)
        return mr_set_error(MR_ERR_INVALID, "distribute.shard_optimizer: %lld parameters do not shard over %d replicas",
                            (long long)t->n, t->world);
    t->zbuf = calloc((size_t)(t->zshard_n * t->world), sizeof(float));
    t->zshard = calloc((size_t)t->zshard_n, sizeof(float));
    if (!t->zbuf || !t->zshard) return mr_set_error(MR_ERR_NOMEM, "trainer: out of memory for the optimizer shard");
    if (t->rank == 0 && !t->c.quiet)
        mr_log_info("shard_optimizer: each replica keeps the optimizer state of %lld of %lld parameters",
                    (long long)t->zshard_n, (long long)t->n);
    return MR_OK;
}

mr_status tr_zero_reduce(trainer *t, const float *g) {
    memcpy(t->zbuf, g, sizeof(float) * (size_t)t->n); /* the padding past n stays zero */
    return mr_comm_reduce_scatter(t->comm, t->zbuf, t->zshard, t->zshard_n, MR_F32, MR_REDUCE_AVG);
}

mr_status tr_zero_all(trainer *t, int *finite) {
    int64_t bad = !*finite;
    mr_status st = mr_comm_allreduce(t->comm, &bad, 1, MR_I64, MR_REDUCE_SUM);
    *finite = bad == 0;
    return st;
}

mr_status tr_zero_clip(trainer *t, double max_norm) {
    double sq = 0;
    for (int64_t i = 0; i < t->zlen; i++) sq += (double)t->zshard[i] * (double)t->zshard[i];
    mr_status st = mr_comm_allreduce(t->comm, &sq, 1, MR_F64, MR_REDUCE_SUM);
    if (st != MR_OK) return st;
    double norm = sqrt(sq);
    if (isfinite(norm) && norm > max_norm) { /* as torch.nn.utils.clip_grad_norm_ */
        const float k = (float)(max_norm / (norm + 1e-6));
        for (int64_t i = 0; i < t->zlen; i++) t->zshard[i] *= k;
    }
    return MR_OK;
}

/* In-place all-gather of the shards of src (n) through zbuf, back into src. */
static mr_status gather_into(trainer *t, const float *shard, float *dst) {
    float *mine = t->zbuf + t->zoff;
    memcpy(mine, shard, sizeof(float) * (size_t)t->zlen);
    memset(mine + t->zlen, 0, sizeof(float) * (size_t)(t->zshard_n - t->zlen));
    mr_status st = mr_comm_allgather(t->comm, mine, t->zbuf, t->zshard_n, MR_F32);
    if (st == MR_OK) memcpy(dst, t->zbuf, sizeof(float) * (size_t)t->n);
    return st;
}

mr_status tr_zero_gather(trainer *t) {
    float *params = mr_params_buffer(t->ps);
    return gather_into(t, params + t->zoff, params);
}

mr_status tr_zero_full_slot(trainer *t, int k, float *out) {
    return gather_into(t, mr_optim_slot(t->opt, k), out);
}

/* ---- gradient buckets: all-reduced while the backward goes on ---------------------------------- */


static int cmp_bucket(const void *a, const void *b) {
    const bucket *x = a, *y = b;
    return (x->ready > y->ready) - (x->ready < y->ready);
}

/* Buckets of at most cap_bytes (a parameter bigger than that is a bucket of its own) over
 * consecutive parameters, taken from the last one back (the backward produces the last layers'
 * gradients first), sorted by when they are ready. The first bucket is kept to 1 MB (PyTorch
 * DDP's rule): its all-reduce can then start early in the backward even when the whole model
 * would fit one bucket. */
mr_status mr_train_make_buckets(const mr_params *ps, const mr_plan *plan, const float *grads, double cap_bytes,
                              bucket **out, int *nb) {
    const int32_t np = mr_params_count(ps);
    bucket *b = calloc((size_t)np, sizeof *b);
    if (!b) return mr_set_error(MR_ERR_NOMEM, "trainer: out of memory for gradient buckets");
    int k = -1;
    int64_t end = 0;
    for (int32_t i = np - 1; i >= 0; i--) {
        int64_t off = mr_params_offset(ps, i), n = mr_params_numel(ps, i);
        int32_t ready = mr_plan_ready_after(plan, grads + off, sizeof(float) * (size_t)n);
        double cap = k <= 0 && cap_bytes > 1048576.0 ? 1048576.0 : cap_bytes;
        if (k < 0 || (double)(end - off) * sizeof(float) > cap) {
            k++;
            b[k].off = off;
            end = off + n;
            b[k].ready = 0;
        }
        b[k].off = off;
        b[k].n = end - off;
        if (ready > b[k].ready) b[k].ready = ready;
    }
    *nb = k + 1;
    qsort(b, (size_t)*nb, sizeof *b, cmp_bucket);
    *out = b;
    return MR_OK;
}

