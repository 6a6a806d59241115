/* The trainer's replicas (MirroredStrategy over distribute/comm.h): the start of a run with
 * several replicas — one set of parameters and optimizer state for all, and a handshake that
 * catches a rank launched with another config, model or mirror build before any step runs — and
 * the gradient exchange's setup (the reducer itself: distribute/ddp.h; its use per step:
 * train_step.c). The checkpoint's per-replica data state is in train_ckpt.c. */
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
    const mr_params *bufs = mr_params_bufs(t->ps);
    for (int32_t i = 0; i < mr_params_count(bufs); i++) {
        mr_shape sh = mr_params_shape(bufs, i);
        h = fnv_str(h, mr_params_name(bufs, i));
        h = fnv(h, sh.dim, sizeof(int64_t) * (size_t)sh.ndim);
    }
    mine[H_PARAMS] = (int64_t)h;
    all = calloc((size_t)t->world * H_COUNT, sizeof *all);
    MR_CHECK(all, MR_ERR_NOMEM, "trainer: out of memory for the handshake");
    MR_TRY(mr_comm_allgather(t->comm, mine, all, H_COUNT, MR_I64));
    static const char *const what[H_COUNT] = {"mirror build (version)", "experiment configuration (YAML after --set)",
                                              "model parameters and buffers (names and shapes)"};
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
    if (mr_params_buffer_numel(bufs) > 0)
        MR_TRY(mr_comm_broadcast(t->comm, mr_params_buffer(bufs), mr_params_buffer_numel(bufs), MR_F32, 0));
    for (int k = 0; k < mr_optim_num_slots(t->opt) && !t->zero; k++) /* a shard is each replica's own */
        MR_TRY(mr_comm_broadcast(t->comm, mr_optim_slot(t->opt, k), t->n, MR_F32, 0));
    if (t->rank == 0 && !t->c.quiet)
        mr_log_info("%d replicas (%s backend): handshake passed, parameters broadcast from replica 0", t->world,
                    mr_comm_backend_of(t->comm) == MR_COMM_MPI ? "mpi" : "local");
fail:
    free(all);
    return st;
}

mr_status tr_bufs_broadcast(trainer *t) {
    mr_status st = MR_OK;
    mr_params *bufs = mr_params_bufs(t->ps);
    if (!t->comm || mr_params_buffer_numel(bufs) == 0) return MR_OK;
    MR_TRY(tr_dev_bufs(t, 0));
    MR_TRY(mr_comm_broadcast(t->comm, mr_params_buffer(bufs), mr_params_buffer_numel(bufs), MR_F32, 0));
    MR_TRY(tr_dev_bufs(t, 1));
fail:
    return st;
}

/* ---- ZeRO-1 and the gradient exchange (distribute/ddp.h) -------------------------------------- */

mr_status tr_zero_init(trainer *t) {
    t->zero = 1;
    t->zsh = mr_ddp_shard_of(t->n, t->world, t->rank);
    if (t->zsh.len == 0)
        return mr_set_error(MR_ERR_INVALID, "distribute.shard_optimizer: %lld parameters do not shard over %d replicas",
                            (long long)t->n, t->world);
    if (t->rank == 0 && !t->c.quiet)
        mr_log_info("shard_optimizer: each replica keeps the optimizer state of %lld of %lld parameters",
                    (long long)t->zsh.stride, (long long)t->n);
    return MR_OK;
}

mr_status tr_ddp_new(trainer *t, const mr_step *s) {
    mr_status st = MR_OK;
    const mr_train_cfg *c = &t->c;
    const int32_t np = mr_params_count(t->ps);
    mr_ddp_param *ps = calloc((size_t)(np > 0 ? np : 1), sizeof *ps);
    MR_CHECK(ps, MR_ERR_NOMEM, "trainer: out of memory for the gradient buckets");
    for (int32_t i = 0; i < np; i++) {
        ps[i].off = mr_params_offset(t->ps, i);
        ps[i].n = mr_params_numel(t->ps, i);
        ps[i].ready = mr_plan_ready_after(s->plan, t->grads + ps[i].off, sizeof(float) * (size_t)ps[i].n);
    }
    /* bench/run_dist.sh's baseline: the same replicas with no gradient exchange at all (the
     * replicas then drift apart; never for training) */
    const char *bench = getenv("MIRROR_BENCH_NO_ALLREDUCE");
    const int no_exchange = t->comm && bench && !strcmp(bench, "1");
    if (no_exchange && t->rank == 0) mr_log_warn("MIRROR_BENCH_NO_ALLREDUCE=1: replicas do not exchange gradients");
    /* the injected overflow (a test hook) is written into the gradient after the backward, which
     * on a GPU would race with the buckets' all-reduces on the communication stream */
    const int overlap = c->accumulate == 1 && !c->no_grad_overlap && !(t->dv.dev.kind == MR_DEVICE_CUDA && c->inject_nonfinite_at > 0);
    mr_ddp_cfg dc = {.comm = t->comm,
                     .gcomm = t->dv.gcomm, /* NULL on the host path: comm */
                     .dev = t->gdev,
                     .stream = t->stream,
                     .grads = t->grads,
                     .n = t->n,
                     .params = ps,
                     .n_params = np,
                     .bucket_bytes = (c->bucket_mb > 0 ? c->bucket_mb : 16.0) * 1048576.0,
                     .overlap = overlap,
                     .shard = t->zero,
                     .no_exchange = no_exchange};
    MR_TRY(mr_ddp_new(&dc, &t->ddp));
fail:
    free(ps);
    return st;
}
