/* The hierarchical backend: several replicas per MPI rank (local threads x ranks). Replica r of
 * process p is rank p * n_local + r of the job. Each collective runs in three stages: among the
 * process's replicas (the local backend: shared memory, rank order), between processes by the
 * local replica 0 of each (the job's MPI communicator), and back to the replicas. Sums therefore
 * add the replicas of a process first, then the processes: a fixed order, so every replica gets
 * the same bits on every run. Deadlines come from both stages; a failing stage aborts the local
 * group so the process's other replicas stop at once, and the MPI stage aborts the job. */
#include "distribute/comm_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct hier_ctx {
    mr_comm *local; /* this replica's handle on the process's local group */
    mr_comm *job;   /* the job's MPI communicator (borrowed; used by local rank 0 only) */
    int n_local, proc, procs;
} hier_ctx;

/* Runs a leader-only MPI stage: the leader reports its failure to its local group. */
static mr_status leader_stage(hier_ctx *h, mr_status st) {
    if (st != MR_OK) mr_comm_abort(h->local, 1, mr_last_error());
    return st;
}

static mr_status hier_allreduce(hier_ctx *h, void *buf, int64_t n, mr_dtype dt, int size, mr_reduce_op op) {
    mr_status st = mr_comm_allreduce(h->local, buf, n, dt, MR_REDUCE_SUM);
    if (st != MR_OK) return st;
    if (mr_comm_rank(h->local) == 0) {
        st = leader_stage(h, mr_comm_allreduce(h->job, buf, n, dt, MR_REDUCE_SUM));
        if (st != MR_OK) return st;
    }
    st = mr_comm_broadcast(h->local, buf, n, dt, 0);
    if (st == MR_OK && op == MR_REDUCE_AVG) mr_comm_div(buf, n, dt, size);
    return st;
}

static mr_status hier_collective(mr_comm *c, const mr_coll *op) {
    hier_ctx *h = c->ctx;
    const int lead = mr_comm_rank(h->local) == 0;
    const size_t es = mr_dtype_size(op->dt);
    mr_status st = MR_OK;
    switch (op->kind) {
    case MR_COLL_ALLREDUCE: return hier_allreduce(h, op->buf, op->n, op->dt, c->size, op->op);
    case MR_COLL_BROADCAST: {
        int root_proc = op->root / h->n_local, root_local = op->root % h->n_local;
        if (h->proc == root_proc) MR_TRY(mr_comm_broadcast(h->local, op->buf, op->n, op->dt, root_local));
        if (lead) MR_TRY(leader_stage(h, mr_comm_broadcast(h->job, op->buf, op->n, op->dt, root_proc)));
        return mr_comm_broadcast(h->local, op->buf, op->n, op->dt, 0);
    }
    case MR_COLL_ALLGATHER: {
        /* this process's replicas fill its segment; the leaders exchange segments */
        const int64_t seg = (int64_t)h->n_local * op->n;
        char *mine = (char *)op->buf + (size_t)(h->proc * seg) * es;
        MR_TRY(mr_comm_allgather(h->local, op->send, mine, op->n, op->dt));
        if (lead) MR_TRY(leader_stage(h, mr_comm_allgather(h->job, mine, op->buf, seg, op->dt)));
        return mr_comm_broadcast(h->local, op->buf, (int64_t)c->size * op->n, op->dt, 0);
    }
    case MR_COLL_REDUCE_SCATTER: {
        /* an all-reduce of everything, then this replica's block (simple; the trainer's ZeRO-1
         * is the only caller, once a step) */
        void *tmp = malloc((size_t)((int64_t)c->size * op->n) * es + 1);
        if (!tmp) return mr_set_error(MR_ERR_NOMEM, "hierarchical reduce_scatter: out of memory");
        memcpy(tmp, op->send, (size_t)((int64_t)c->size * op->n) * es);
        st = hier_allreduce(h, tmp, (int64_t)c->size * op->n, op->dt, c->size, op->op);
        if (st == MR_OK) memcpy(op->buf, (char *)tmp + (size_t)((int64_t)c->rank * op->n) * es, (size_t)op->n * es);
        free(tmp);
        return st;
    }
    case MR_COLL_BARRIER:
        MR_TRY(mr_comm_barrier(h->local));
        if (lead) MR_TRY(leader_stage(h, mr_comm_barrier(h->job)));
        return mr_comm_barrier(h->local);
    case MR_COLL_DUP:
        return mr_set_error(MR_ERR_UNSUPPORTED, "hierarchical communicator: no asynchronous queue (the trainer "
                                                "all-reduces synchronously with several replicas per rank)");
    }
fail:
    return st;
}

static void hier_abort(mr_comm *c, int code, const char *why) {
    hier_ctx *h = c->ctx;
    mr_comm_abort(h->local, code, why);
    mr_comm_abort(h->job, code, why); /* MPI_Abort: the whole job */
}

static void hier_destroy(mr_comm *c) {
    hier_ctx *h = c->ctx;
    if (!h) return;
    mr_comm_free(h->local);
    free(h);
}

static const mr_comm_vtable hier_vtable = {"hier", hier_collective, hier_abort, hier_destroy};

mr_status mr_comm_hier_new(mr_comm *job, int n_local, double timeout_s, mr_comm **comms) {
    mr_status st = MR_OK;
    mr_comm **local = NULL;
    MR_CHECK(job && mr_comm_backend_of(job) == MR_COMM_MPI, MR_ERR_INVALID,
             "mr_comm_hier_new: needs the job's MPI communicator");
    MR_CHECK(n_local >= 1 && n_local <= 4096, MR_ERR_INVALID, "mr_comm_hier_new: %d local replicas (1..4096)", n_local);
    MR_CHECK(comms, MR_ERR_INVALID, "mr_comm_hier_new: comms is NULL");
    local = calloc((size_t)n_local, sizeof *local);
    MR_CHECK(local, MR_ERR_NOMEM, "mr_comm_hier_new: out of memory");
    MR_TRY(mr_comm_local_new(n_local, timeout_s, local));
    const int proc = mr_comm_rank(job), procs = mr_comm_size(job);
    for (int r = 0; r < n_local; r++) {
        mr_comm *c = mr_comm_alloc(&hier_vtable, MR_COMM_HIER, proc * n_local + r, procs * n_local, timeout_s);
        hier_ctx *h = calloc(1, sizeof *h);
        if (!c || !h) {
            free(c);
            free(h);
            for (int k = 0; k < r; k++) mr_comm_free(comms[k]);
            for (int k = r; k < n_local; k++) mr_comm_free(local[k]);
            free(local);
            return mr_set_error(MR_ERR_NOMEM, "mr_comm_hier_new: out of memory");
        }
        *h = (hier_ctx){local[r], job, n_local, proc, procs};
        c->ctx = h;
        comms[r] = c;
    }
    free(local);
    return MR_OK;
fail:
    if (local)
        for (int k = 0; k < n_local; k++) mr_comm_free(local[k]);
    free(local);
    return st;
}
