/* Communicators: the public entry points (argument checks, sequence numbers, the broken state)
 * that dispatch to a backend's table (comm_impl.h), and the asynchronous queue that runs
 * collectives on a communication thread.
 *
 * Every check a backend would otherwise repeat lives here, so comm_local.c and comm_mpi.c only
 * move data and keep deadlines. A queue owns a private duplicate of its communicator, so its
 * collectives can never interleave with the caller's direct ones on the same handle. */
#include "distribute/comm_impl.h"
#include "core/trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- shared helpers ---------------------------------------------------------------------------- */

double mr_comm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

mr_comm *mr_comm_alloc(const mr_comm_vtable *vt, mr_comm_backend backend, int rank, int size, double timeout_s) {
    mr_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->vt = vt;
    c->backend = backend;
    c->rank = rank;
    c->size = size;
    c->timeout_s = timeout_s;
    c->piece_bytes = MR_COMM_DEFAULT_PIECE_BYTES;
    return c;
}

const char *mr_coll_name(mr_coll_kind k) {
    switch (k) {
    case MR_COLL_ALLREDUCE: return "allreduce";
    case MR_COLL_BROADCAST: return "broadcast";
    case MR_COLL_ALLGATHER: return "allgather";
    case MR_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case MR_COLL_BARRIER: return "barrier";
    case MR_COLL_DUP: return "dup";
    }
    return "?";
}

void mr_coll_describe(const mr_comm *c, const mr_coll *op, char *out, size_t cap) {
    const char *pre = c && c->queue ? "queued " : "";
    const char *name = mr_coll_name(op->kind);
    const char *dt = mr_dtype_name(op->dt);
    const char *opn = op->op == MR_REDUCE_AVG ? "avg" : "sum";
    switch (op->kind) {
    case MR_COLL_ALLREDUCE:
    case MR_COLL_REDUCE_SCATTER:
        snprintf(out, cap, "%s%s #%lld (%lld %s %s)", pre, name, (long long)op->seq, (long long)op->n, dt, opn);
        break;
    case MR_COLL_ALLGATHER:
        snprintf(out, cap, "%s%s #%lld (%lld %s)", pre, name, (long long)op->seq, (long long)op->n, dt);
        break;
    case MR_COLL_BROADCAST:
        snprintf(out, cap, "%s%s #%lld (%lld %s from rank %d)", pre, name, (long long)op->seq, (long long)op->n, dt,
                 op->root);
        break;
    default: snprintf(out, cap, "%s%s #%lld", pre, name, (long long)op->seq); break;
    }
}

void mr_comm_add_into(void *dst, const void *src, int64_t n, mr_dtype dt) {
    if (dt == MR_F32) {
        float *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
    } else if (dt == MR_F64) {
        double *d = dst;
        const double *s = src;
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
    } else if (dt == MR_I32) { /* integers wrap around like MPI's instead of overflowing (undefined in C) */
        uint32_t *d = dst;
        const uint32_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
    } else { /* i64 */
        uint64_t *d = dst;
        const uint64_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
    }
}

void mr_comm_div(void *buf, int64_t n, mr_dtype dt, int d) {
    if (dt == MR_F32) {
        float *x = buf, fd = (float)d;
        for (int64_t i = 0; i < n; i++) x[i] = x[i] / fd;
    } else if (dt == MR_F64) {
        double *x = buf, dd = (double)d;
        for (int64_t i = 0; i < n; i++) x[i] = x[i] / dd;
    } else if (dt == MR_I32) {
        int32_t *x = buf;
        for (int64_t i = 0; i < n; i++) x[i] = x[i] / d;
    } else {
        int64_t *x = buf;
        for (int64_t i = 0; i < n; i++) x[i] = x[i] / d;
    }
}

const char *mr_comm_strip_loc(const char *msg) {
    const char *p = strchr(msg, ':');
    if (!p || p == msg) return msg;
    const char *q = p + 1;
    if (*q < '0' || *q > '9') return msg;
    while (*q >= '0' && *q <= '9') q++;
    return (q[0] == ':' && q[1] == ' ') ? q + 2 : msg;
}

/* ---- checks and dispatch ----------------------------------------------------------------------- */

static int is_reducible(mr_dtype dt) { return dt == MR_F32 || dt == MR_F64 || dt == MR_I32 || dt == MR_I64; }

static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return na && nb && pa < pb + nb && pb < pa + na;
}

/* Checks op's arguments against c (nothing runs). */
static mr_status check(const mr_comm *c, const mr_coll *op) {
    mr_status st = MR_OK;
    const char *name = mr_coll_name(op->kind);
    MR_CHECK(c, MR_ERR_INVALID, "%s: communicator is NULL", name);
    if (op->kind == MR_COLL_BARRIER || op->kind == MR_COLL_DUP) return MR_OK;
    MR_CHECK(op->n >= 0, MR_ERR_INVALID, "%s: negative element count %lld", name, (long long)op->n);
    MR_CHECK((unsigned)op->dt < MR_DTYPE_COUNT, MR_ERR_INVALID, "%s: invalid dtype %d", name, (int)op->dt);
    size_t es = mr_dtype_size(op->dt);
    int64_t blocks = (op->kind == MR_COLL_ALLGATHER || op->kind == MR_COLL_REDUCE_SCATTER) ? c->size : 1;
    MR_CHECK(op->n <= INT64_MAX / blocks / (int64_t)es, MR_ERR_INVALID, "%s: %lld x %lld elements of %s overflow",
             name, (long long)blocks, (long long)op->n, mr_dtype_name(op->dt));
    size_t bytes = (size_t)op->n * es;
    if (op->kind == MR_COLL_ALLREDUCE || op->kind == MR_COLL_REDUCE_SCATTER) {
        MR_CHECK(op->op == MR_REDUCE_SUM || op->op == MR_REDUCE_AVG, MR_ERR_INVALID, "%s: invalid reduce op %d", name,
                 (int)op->op);
        MR_CHECK(is_reducible(op->dt), MR_ERR_UNSUPPORTED, "%s: cannot reduce %s (f32, f64, i32 and i64 only)", name,
                 mr_dtype_name(op->dt));
    }
    if (op->kind == MR_COLL_BROADCAST)
        MR_CHECK(op->root >= 0 && op->root < c->size, MR_ERR_INVALID,
                 "broadcast: root %d is not a rank of a group of %d", op->root, c->size);
    if (op->n == 0) return MR_OK;
    MR_CHECK(op->buf, MR_ERR_INVALID, "%s: NULL buffer for %lld elements", name, (long long)op->n);
    if (op->kind == MR_COLL_ALLGATHER) {
        MR_CHECK(op->send, MR_ERR_INVALID, "allgather: NULL send buffer for %lld elements", (long long)op->n);
        const char *in_place = (const char *)op->buf + (size_t)c->rank * bytes;
        MR_CHECK(op->send == in_place || !overlaps(op->send, bytes, op->buf, bytes * (size_t)c->size), MR_ERR_INVALID,
                 "allgather: send overlaps recv other than at recv + rank * n (in place)");
    }
    if (op->kind == MR_COLL_REDUCE_SCATTER) {
        MR_CHECK(op->send, MR_ERR_INVALID, "reduce_scatter: NULL send buffer for %lld elements", (long long)op->n);
        MR_CHECK(!overlaps(op->send, bytes * (size_t)c->size, op->buf, bytes), MR_ERR_INVALID,
                 "reduce_scatter: send and recv overlap");
    }
fail:
    return st;
}

/* The bytes a collective hands back on this rank (a trace span's "bytes"): the reduced or
 * broadcast buffer, the gathered one, the scattered input. */
static int64_t coll_bytes(const mr_comm *c, const mr_coll *op) {
    if (op->kind == MR_COLL_BARRIER || op->kind == MR_COLL_DUP) return 0;
    const int64_t b = op->n * (int64_t)mr_dtype_size(op->dt);
    return op->kind == MR_COLL_ALLGATHER || op->kind == MR_COLL_REDUCE_SCATTER ? b * c->size : b;
}

/* Checks, numbers and runs one collective on c; a failure with MR_ERR_COMM breaks c. */
static mr_status run(mr_comm *c, mr_coll *op) {
    mr_status st = check(c, op);
    if (st != MR_OK) return st;
    op->seq = ++c->seq;
    if (c->broken) {
        char d[160];
        mr_coll_describe(c, op, d, sizeof d);
        return mr_set_error(MR_ERR_COMM, "%s on rank %d: not run, the communicator failed earlier: %s", d, c->rank,
                            c->broken_msg);
    }
    const int64_t t0 = mr_trace_begin(c->trace);
    st = c->vt->collective(c, op);
    mr_trace_end2(c->trace, t0, mr_coll_name(op->kind), "bytes", coll_bytes(c, op), "seq", op->seq);
    if (st == MR_ERR_COMM) {
        c->broken = 1;
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s", mr_comm_strip_loc(mr_last_error()));
    }
    return st;
}

/* ---- public API -------------------------------------------------------------------------------- */

void mr_comm_free(mr_comm *c) {
    if (!c) return;
    c->vt->destroy(c);
    free(c);
}

void mr_comm_set_trace(mr_comm *c, struct mr_trace_track *k) {
    if (c) c->trace = k;
}

int mr_comm_rank(const mr_comm *c) { return c ? c->rank : 0; }
int mr_comm_size(const mr_comm *c) { return c ? c->size : 0; }
mr_comm_backend mr_comm_backend_of(const mr_comm *c) { return c ? c->backend : MR_COMM_LOCAL; }
double mr_comm_timeout(const mr_comm *c) { return c ? c->timeout_s : 0; }

mr_status mr_comm_set_max_piece_bytes(mr_comm *c, size_t bytes) {
    if (!c) return mr_set_error(MR_ERR_INVALID, "mr_comm_set_max_piece_bytes: communicator is NULL");
    if (bytes == 0) bytes = MR_COMM_DEFAULT_PIECE_BYTES;
    if (bytes < 4096) bytes = 4096;
    if (bytes > ((size_t)1 << 30)) bytes = (size_t)1 << 30;
    c->piece_bytes = bytes;
    return MR_OK;
}

mr_status mr_comm_allreduce(mr_comm *c, void *buf, int64_t n, mr_dtype dt, mr_reduce_op op) {
    mr_coll o = {.kind = MR_COLL_ALLREDUCE, .buf = buf, .n = n, .dt = dt, .op = op};
    return run(c, &o);
}

mr_status mr_comm_nccl_allreduce_async(mr_comm *c, void *buf, int64_t n, mr_dtype dt, mr_reduce_op op) {
    if (!c || c->backend != MR_COMM_NCCL)
        return mr_set_error(MR_ERR_INVALID, "mr_comm_nccl_allreduce_async: not an nccl communicator");
    mr_coll o = {.kind = MR_COLL_ALLREDUCE, .buf = buf, .n = n, .dt = dt, .op = op, .nowait = 1};
    return run(c, &o);
}

mr_status mr_comm_broadcast(mr_comm *c, void *buf, int64_t n, mr_dtype dt, int root) {
    mr_coll o = {.kind = MR_COLL_BROADCAST, .buf = buf, .n = n, .dt = dt, .root = root};
    return run(c, &o);
}

mr_status mr_comm_allgather(mr_comm *c, const void *send, void *recv, int64_t n, mr_dtype dt) {
    mr_coll o = {.kind = MR_COLL_ALLGATHER, .send = send, .buf = recv, .n = n, .dt = dt};
    return run(c, &o);
}

mr_status mr_comm_reduce_scatter(mr_comm *c, const void *send, void *recv, int64_t n, mr_dtype dt, mr_reduce_op op) {
    mr_coll o = {.kind = MR_COLL_REDUCE_SCATTER, .send = send, .buf = recv, .n = n, .dt = dt, .op = op};
    return run(c, &o);
}

mr_status mr_comm_barrier(mr_comm *c) {
    mr_coll o = {.kind = MR_COLL_BARRIER};
    return run(c, &o);
}

mr_status mr_comm_split(mr_comm *c, int color, mr_comm **out) {
    mr_status st = MR_OK;
    int64_t mine = color, *all = NULL;
    MR_CHECK(c && out, MR_ERR_INVALID, "mr_comm_split: NULL %s", c ? "out" : "communicator");
    MR_CHECK(color >= 0, MR_ERR_INVALID, "mr_comm_split: color %d (must be >= 0)", color);
    MR_CHECK(c->backend == MR_COMM_MPI, MR_ERR_UNSUPPORTED, "mr_comm_split: a %s communicator cannot be split (MPI only)",
             c->vt->name);
    all = calloc((size_t)c->size, sizeof *all);
    MR_CHECK(all, MR_ERR_NOMEM, "mr_comm_split: out of memory");
    MR_TRY(mr_comm_allgather(c, &mine, all, 1, MR_I64)); /* everyone is there: MPI_Comm_split cannot hang */
    MR_TRY(mr_comm_mpi_split(c, color, out));
    (*out)->piece_bytes = c->piece_bytes;
fail:
    free(all);
    return st;
}

mr_status mr_comm_stream_wait(mr_comm *c, const mr_backend *be, int device, mr_stream *s, mr_event **ev,
                              const char *what) {
    mr_status st = MR_OK;
    if (!c || mr_comm_backend_of(c) != MR_COMM_NCCL) return be->stream_sync(s);
    if (!*ev) MR_TRY(be->event_new(device, ev));
    MR_TRY(be->event_record(*ev, s));
    MR_TRY(mr_comm_nccl_host_wait(c, *ev, what));
fail:
    return st;
}

void mr_comm_abort(mr_comm *c, int code, const char *why) {
    if (!c) return;
    c->vt->abort(c, code, why ? why : "(no reason given)");
}

/* ---- the queue --------------------------------------------------------------------------------- */

struct mr_comm_queue {
    mr_comm *c; /* private duplicate of the caller's communicator; used by the thread only */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    /* Requests not yet finished: tickets completed+1 .. submitted, ticket t at ring[t % cap]. */
    mr_coll *ring;
    int64_t cap, submitted, completed;
    /* The first failed ticket (0: none); every later one fails without running. */
    int64_t failed_ticket;
    mr_status failed_st;
    char failed_msg[768];
    double busy_s;
    int stop;
    /* mr_comm_queue_set_trace (under mu): spans on the queue's thread, flow starts on the caller's */
    struct mr_trace_track *trace, *caller_trace;
};

static void *queue_main(void *arg) {
    mr_comm_queue *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->completed == q->submitted && !q->stop) pthread_cond_wait(&q->work, &q->mu);
        if (q->completed == q->submitted) break; /* stop, and nothing left */
        int64_t t = q->completed + 1;
        mr_coll op = q->ring[t % q->cap];
        int skip = q->failed_ticket != 0;
        mr_trace_track *k = q->trace;
        pthread_mutex_unlock(&q->mu);

        mr_status st = MR_OK;
        double t0 = mr_comm_now();
        const int64_t s0 = skip ? 0 : mr_trace_begin(k);
        if (s0) mr_trace_flow(k, 0, "queued", t, s0); /* the arrow from the submit ends here */
        if (!skip) st = run(q->c, &op);
        mr_trace_end2(k, s0, mr_coll_name(op.kind), "bytes", coll_bytes(q->c, &op), "seq", op.seq);
        double dt = mr_comm_now() - t0;

        pthread_mutex_lock(&q->mu);
        q->busy_s += dt;
        if (st != MR_OK && !q->failed_ticket) {
            q->failed_ticket = t;
            q->failed_st = st;
            snprintf(q->failed_msg, sizeof q->failed_msg, "%s", mr_comm_strip_loc(mr_last_error()));
        }
        q->completed = t;
        pthread_cond_broadcast(&q->done);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

mr_status mr_comm_queue_new(mr_comm *c, mr_comm_queue **out) {
    mr_status st = MR_OK;
    mr_comm_queue *q = NULL;
    int mu = 0, work = 0, done = 0;
    MR_CHECK(c && out, MR_ERR_INVALID, "mr_comm_queue_new: NULL %s", c ? "out" : "communicator");
    q = calloc(1, sizeof *q);
    MR_CHECK(q, MR_ERR_NOMEM, "mr_comm_queue_new: out of memory");
    q->cap = 16;
    q->ring = calloc((size_t)q->cap, sizeof *q->ring);
    MR_CHECK(q->ring, MR_ERR_NOMEM, "mr_comm_queue_new: out of memory");
    MR_CHECK(pthread_mutex_init(&q->mu, NULL) == 0, MR_ERR_NOMEM, "mr_comm_queue_new: pthread_mutex_init failed");
    mu = 1;
    MR_CHECK(pthread_cond_init(&q->work, NULL) == 0, MR_ERR_NOMEM, "mr_comm_queue_new: pthread_cond_init failed");
    work = 1;
    MR_CHECK(pthread_cond_init(&q->done, NULL) == 0, MR_ERR_NOMEM, "mr_comm_queue_new: pthread_cond_init failed");
    done = 1;
    mr_coll dup = {.kind = MR_COLL_DUP, .dup_out = &q->c};
    MR_TRY(run(c, &dup));
    q->c->queue = 1;
    q->c->piece_bytes = c->piece_bytes;
    MR_CHECK(pthread_create(&q->thread, NULL, queue_main, q) == 0, MR_ERR_NOMEM,
             "mr_comm_queue_new: cannot start the communication thread");
    *out = q;
    return MR_OK;
fail:
    if (q) {
        mr_comm_free(q->c);
        if (done) pthread_cond_destroy(&q->done);
        if (work) pthread_cond_destroy(&q->work);
        if (mu) pthread_mutex_destroy(&q->mu);
        free(q->ring);
        free(q);
    }
    return st;
}

void mr_comm_queue_free(mr_comm_queue *q) {
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    mr_comm_free(q->c);
    pthread_cond_destroy(&q->done);
    pthread_cond_destroy(&q->work);
    pthread_mutex_destroy(&q->mu);
    free(q->ring);
    free(q);
}

static mr_status queue_submit(mr_comm_queue *q, mr_coll *op, int64_t *ticket) {
    mr_status st = MR_OK;
    MR_CHECK(q && ticket, MR_ERR_INVALID, "queued %s: NULL %s", mr_coll_name(op->kind), q ? "ticket" : "queue");
    MR_TRY(check(q->c, op));
    pthread_mutex_lock(&q->mu);
    if (q->submitted - q->completed == q->cap) { /* full: double the ring, re-placing the pending ones */
        mr_coll *r = calloc((size_t)q->cap * 2, sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&q->mu);
            MR_CHECK(0, MR_ERR_NOMEM, "queued %s: out of memory for %lld pending requests", mr_coll_name(op->kind),
                     (long long)q->cap * 2);
        }
        for (int64_t t = q->completed + 1; t <= q->submitted; t++) r[t % (q->cap * 2)] = q->ring[t % q->cap];
        free(q->ring);
        q->ring = r;
        q->cap *= 2;
    }
    int64_t t = ++q->submitted;
    q->ring[t % q->cap] = *op;
    mr_trace_flow(q->caller_trace, 1, "queued", t, 0); /* before the thread can take it up */
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    *ticket = t;
fail:
    return st;
}

mr_status mr_comm_queue_allreduce(mr_comm_queue *q, void *buf, int64_t n, mr_dtype dt, mr_reduce_op op,
                                  int64_t *ticket) {
    mr_coll o = {.kind = MR_COLL_ALLREDUCE, .buf = buf, .n = n, .dt = dt, .op = op};
    return queue_submit(q, &o, ticket);
}

mr_status mr_comm_queue_reduce_scatter(mr_comm_queue *q, const void *send, void *recv, int64_t n, mr_dtype dt,
                                       mr_reduce_op op, int64_t *ticket) {
    mr_coll o = {.kind = MR_COLL_REDUCE_SCATTER, .send = send, .buf = recv, .n = n, .dt = dt, .op = op};
    return queue_submit(q, &o, ticket);
}

mr_status mr_comm_queue_allgather(mr_comm_queue *q, const void *send, void *recv, int64_t n, mr_dtype dt,
                                  int64_t *ticket) {
    mr_coll o = {.kind = MR_COLL_ALLGATHER, .send = send, .buf = recv, .n = n, .dt = dt};
    return queue_submit(q, &o, ticket);
}

mr_status mr_comm_queue_wait(mr_comm_queue *q, int64_t ticket) {
    if (!q) return mr_set_error(MR_ERR_INVALID, "mr_comm_queue_wait: queue is NULL");
    mr_status st = MR_OK;
    pthread_mutex_lock(&q->mu);
    if (ticket < 1 || ticket > q->submitted) {
        st = mr_set_error(MR_ERR_INVALID, "mr_comm_queue_wait: unknown ticket %lld (1..%lld submitted)",
                          (long long)ticket, (long long)q->submitted);
    } else {
        /* No deadline here: each request ends within its own deadline. */
        while (q->completed < ticket) pthread_cond_wait(&q->done, &q->mu);
        if (q->failed_ticket && ticket == q->failed_ticket)
            st = mr_set_error(q->failed_st, "%s", q->failed_msg);
        else if (q->failed_ticket && ticket > q->failed_ticket)
            st = mr_set_error(q->failed_st, "queued request %lld not run: request %lld failed: %s", (long long)ticket,
                              (long long)q->failed_ticket, q->failed_msg);
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}

void mr_comm_queue_set_trace(mr_comm_queue *q, struct mr_trace_track *thread, struct mr_trace_track *caller) {
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->trace = thread;
    q->caller_trace = caller;
    pthread_mutex_unlock(&q->mu);
}

double mr_comm_queue_busy_seconds(const mr_comm_queue *q) {
    if (!q) return 0;
    mr_comm_queue *m = (mr_comm_queue *)q; /* the lock is not part of the logical state */
    pthread_mutex_lock(&m->mu);
    double s = m->busy_s;
    pthread_mutex_unlock(&m->mu);
    return s;
}

/* ---- the nccl backend in a build without it ---------------------------------------------------- */

#ifndef MIRROR_HAVE_NCCL
/* comm_nccl.c is compiled only in a build with CUDA and NCCL; these keep the API (and the tests
 * that skip on MR_ERR_UNSUPPORTED) the same in every build. */
#ifdef MIRROR_HAVE_CUDA
#define MR_NO_NCCL "mirror was built with CUDA but without NCCL (libnccl and nccl.h were not found at configure " \
                   "time); HINT: install NCCL next to the CUDA toolkit and reconfigure"
#else
#define MR_NO_NCCL "mirror was built without CUDA, so without NCCL; HINT: configure with -DMIRROR_CUDA=ON on a " \
                   "machine with the CUDA toolkit and NCCL"
#endif

mr_status mr_comm_nccl_new(const int *devices, int n_local, mr_comm *boot, double timeout_s, mr_comm **comms) {
    (void)devices, (void)n_local, (void)boot, (void)timeout_s, (void)comms;
    return mr_set_error(MR_ERR_UNSUPPORTED, "mr_comm_nccl_new: %s", MR_NO_NCCL);
}

mr_status mr_comm_nccl_group_begin(mr_comm *const *comms, int n) {
    (void)comms, (void)n;
    return mr_set_error(MR_ERR_UNSUPPORTED, "mr_comm_nccl_group_begin: %s", MR_NO_NCCL);
}

mr_status mr_comm_nccl_group_end(mr_comm *const *comms, int n) {
    (void)comms, (void)n;
    return mr_set_error(MR_ERR_UNSUPPORTED, "mr_comm_nccl_group_end: %s", MR_NO_NCCL);
}

mr_status mr_comm_nccl_wait_event(mr_comm *c, mr_event *e) {
    (void)c, (void)e;
    return mr_set_error(MR_ERR_UNSUPPORTED, "mr_comm_nccl_wait_event: %s", MR_NO_NCCL);
}

mr_status mr_comm_nccl_record_event(mr_comm *c, mr_event *e) {
    (void)c, (void)e;
    return mr_set_error(MR_ERR_UNSUPPORTED, "mr_comm_nccl_record_event: %s", MR_NO_NCCL);
}

mr_status mr_comm_nccl_host_wait(mr_comm *c, mr_event *e, const char *what) {
    (void)c, (void)e, (void)what;
    return mr_set_error(MR_ERR_UNSUPPORTED, "mr_comm_nccl_host_wait: %s", MR_NO_NCCL);
}
#endif
