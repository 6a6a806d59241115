/* The MPI backend: one rank per process, over a duplicate of MPI_COMM_WORLD.
 *
 * Deadlines: every collective is posted with nonblocking calls (MPI_Iallreduce, MPI_Ibcast, ...,
 * or MPI_Isend/MPI_Irecv for the ring below) and polled with MPI_Testall until it completes or
 * timeout_s passes without completion, so a dead, hung or out-of-step rank turns into MR_ERR_COMM
 * with a message naming the collective, its number, its size and this rank, instead of a hang.
 * Polling spins POLL_HOT tests (a small collective is done by then), then yields the core between
 * tests for POLL_SPIN_S seconds (Open MPI progresses nonblocking operations only inside MPI calls,
 * so a sleep there costs bandwidth), then sleeps POLL_SLEEP_NS between tests while waiting for a
 * late rank. A timed-out request cannot be cancelled: the communicator (and every duplicate of
 * it) is broken from then on and MPI is not finalised (MPI_Finalize would wait for the request).
 *
 * Large collectives are split into pieces of at most c->piece_bytes (16 MB by default: above it
 * Open MPI 4.1's MPI_Iallreduce dropped from 2.3 to 0.9 GB/s and MPI_Allreduce from 5.9 to
 * 2.7 GB/s on 2 ranks, bench/bench_comm.c); the pieces also keep every count within MPI's int.
 * Allgather and reduce-scatter pieces go through a scratch buffer (the piece of each rank's block
 * is not contiguous).
 *
 * All-reduce pieces of >= RING_MIN_BYTES run as a ring (reduce-scatter then allgather) over
 * MPI_Isend/MPI_Irecv, each step polled with the deadline: MPI_Iallreduce (libnbc) runs in place,
 * and with < 4 ranks always, as a binomial tree through rank 0, and reached 2.7 GB/s where the
 * blocking MPI_Allreduce reaches 6 GB/s (2 ranks, 1-16 MB); the ring matches the blocking call.
 * Smaller pieces, where latency rules, run as a recursive doubling over the same calls (rd_allreduce),
 * each message in fragments small enough for MPI's eager protocol (rd_exchange); an empty one
 * (n == 0) and a 1-rank communicator still call MPI_Iallreduce.
 *
 * Errors: the communicator has MPI_ERRORS_RETURN; MR_TRY_MPI turns a failing call into
 * MR_ERR_COMM with MPI_Error_string's text. Thread level: MPI_THREAD_MULTIPLE is requested; when
 * MPI grants less, every MPI call of this file is made under one lock (the queue's thread and the
 * caller's both call MPI; polling releases the lock between tests, so neither starves).
 *
 * MPI's state is per process, so the count of live communicators and the lock are too (the only
 * globals of the module). */
#include "distribute/comm_impl.h"

#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"

enum { POLL_HOT = 64, POLL_SLEEP_NS = 50000, RING_TAG = 0x6d72, RD_TAG = 0x6d73, RING_MIN_BYTES = 65536 };
/* The recursive doubling's messages (rd_exchange): fragments of at most RD_FRAG_BYTES, below
 * Open MPI's 4 KB shared-memory eager limit less a generous 128-byte header; at most RD_MAX_FRAGS
 * per message (17 suffice below RING_MIN_BYTES). */
enum { RD_FRAG_BYTES = 3968, RD_MAX_FRAGS = 32 };
#define POLL_SPIN_S 0.05

/* ---- process-wide MPI state -------------------------------------------------------------------- */

static pthread_mutex_t g_state_mu = PTHREAD_MUTEX_INITIALIZER; /* guards the three below */
static int g_live;                                             /* MPI communicators alive */
static int g_we_initialised;                                   /* this module called MPI_Init_thread */
static int g_any_failed;                                       /* a collective failed: never finalise */
static atomic_int g_serialise;                                 /* MPI gave < MPI_THREAD_MULTIPLE */
static pthread_mutex_t g_call_mu = PTHREAD_MUTEX_INITIALIZER;  /* serialises MPI calls then */

static void call_lock(void) {
    if (atomic_load_explicit(&g_serialise, memory_order_relaxed)) pthread_mutex_lock(&g_call_mu);
}
static void call_unlock(void) {
    if (atomic_load_explicit(&g_serialise, memory_order_relaxed)) pthread_mutex_unlock(&g_call_mu);
}

/* MR_ERR_COMM with MPI's text for rc. */
static mr_status mpi_error(int rc, const char *call) {
    char es[MPI_MAX_ERROR_STRING + 1] = "";
    int len = 0;
    call_lock();
    if (MPI_Error_string(rc, es, &len) != MPI_SUCCESS) snprintf(es, sizeof es, "error code %d", rc);
    call_unlock();
    return mr_set_error(MR_ERR_COMM, "%s failed: %s", call, es);
}

/* Runs one MPI call (under the lock when serialising); on failure sets st and jumps to fail. */
#define MR_TRY_MPI(call)                                                                          \
    do {                                                                                          \
        call_lock();                                                                              \
        int rc_ = (call);                                                                         \
        call_unlock();                                                                            \
        if (rc_ != MPI_SUCCESS) {                                                                 \
            st = mpi_error(rc_, #call);                                                           \
            goto fail;                                                                            \
        }                                                                                         \
    } while (0)

/* ---- communicators ----------------------------------------------------------------------------- */

/* Shared by a communicator and its duplicates: one failure breaks them all. */
typedef struct mpi_family {
    int refs; /* under g_state_mu */
    atomic_int failed;
} mpi_family;

typedef struct mpi_ctx {
    MPI_Comm comm;
    mpi_family *fam;
    void *tmp; /* allgather / reduce-scatter pieces */
    size_t tmp_bytes;
} mpi_ctx;

static const mr_comm_vtable mpi_vtable;

static MPI_Datatype mpi_type(mr_dtype dt) {
    switch (dt) {
    case MR_F32: return MPI_FLOAT;
    case MR_F64: return MPI_DOUBLE;
    case MR_F16:
    case MR_BF16: return MPI_UINT16_T; /* moved, never reduced */
    case MR_I32: return MPI_INT32_T;
    case MR_I64: return MPI_INT64_T;
    default: return MPI_UINT8_T;
    }
}

/* Polls the requests until all complete; MR_ERR_COMM ("no progress for ... (in call); HINT") when
 * timeout_s passes. The caller prefixes which collective (see with_context): formatting that
 * here, on every call, would cost more than a small all-reduce. */
static mr_status wait_reqs(int count, MPI_Request *reqs, double timeout_s, const char *call) {
    mr_status st = MR_OK;
    double t0 = mr_comm_now();
    for (long polls = 0;; polls++) {
        int done = 0;
        MR_TRY_MPI(MPI_Testall(count, reqs, &done, MPI_STATUSES_IGNORE));
        if (done) return MR_OK;
        if (polls < POLL_HOT) continue; /* a small collective completes within these */
        double waited = mr_comm_now() - t0;
        if (waited > timeout_s)
            return mr_set_error(MR_ERR_COMM, "no progress for %g s (in %s); %s", timeout_s, call, MR_COMM_HINT);
        if (waited < POLL_SPIN_S) {
            sched_yield();
        } else {
            struct timespec ts = {0, POLL_SLEEP_NS};
            nanosleep(&ts, NULL);
        }
    }
fail:
    return st;
}

static mr_status wait_req(MPI_Request *req, double timeout_s, const char *call) {
    return wait_reqs(1, req, timeout_s, call);
}

/* Re-sets the last error as "<what> on rank R: <message>"; returns st. */
static mr_status with_context(mr_status st, const char *what, int rank) {
    char inner[800];
    snprintf(inner, sizeof inner, "%s", mr_comm_strip_loc(mr_last_error()));
    return mr_set_error(st, "%s on rank %d: %s", what, rank, inner);
}

/* A communicator shell around comm (which it then owns) in family fam (NULL: a new one).
 * Holds g_state_mu. */
static mr_status wrap(MPI_Comm comm, mpi_family *fam, double timeout_s, mr_comm **out) {
    mr_status st = MR_OK;
    int rank = 0, size = 0;
    mr_comm *c = NULL;
    mpi_ctx *m = NULL;
    MR_TRY_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    MR_TRY_MPI(MPI_Comm_rank(comm, &rank));
    MR_TRY_MPI(MPI_Comm_size(comm, &size));
    c = mr_comm_alloc(&mpi_vtable, MR_COMM_MPI, rank, size, timeout_s);
    m = calloc(1, sizeof *m);
    MR_CHECK(c && m, MR_ERR_NOMEM, "MPI communicator: out of memory");
    if (!fam) {
        fam = calloc(1, sizeof *fam);
        MR_CHECK(fam, MR_ERR_NOMEM, "MPI communicator: out of memory");
    }
    fam->refs++;
    m->comm = comm;
    m->fam = fam;
    c->ctx = m;
    g_live++;
    *out = c;
    return MR_OK;
fail:
    free(m);
    free(c);
    return st;
}

/* A duplicate of comm with a deadline (MPI_Comm_idup is collective). */
static mr_status dup_comm(MPI_Comm comm, double timeout_s, MPI_Comm *out) {
    mr_status st = MR_OK;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Comm nc = MPI_COMM_NULL; /* not usable (nor freeable) before the request completes */
    MR_TRY_MPI(MPI_Comm_idup(comm, &nc, &req));
    MR_TRY(wait_req(&req, timeout_s, "MPI_Comm_idup"));
    *out = nc;
fail:
    return st;
}

mr_status mr_comm_mpi_new(double timeout_s, mr_comm **out) {
    mr_status st = MR_OK;
    int locked = 0, inited = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Comm comm = MPI_COMM_NULL;
    MR_CHECK(timeout_s > 0 && timeout_s < 1e9, MR_ERR_INVALID, "mr_comm_mpi_new: timeout %g s (must be > 0)",
             timeout_s);
    MR_CHECK(out, MR_ERR_INVALID, "mr_comm_mpi_new: out is NULL");
    pthread_mutex_lock(&g_state_mu);
    locked = 1;
    MR_TRY_MPI(MPI_Finalized(&finalized));
    MR_CHECK(!finalized, MR_ERR_UNSUPPORTED,
             "mr_comm_mpi_new: MPI was already finalised in this process; HINT: keep one MPI communicator alive "
             "for the whole run");
    MR_TRY_MPI(MPI_Initialized(&inited));
    if (!inited) {
        MR_TRY_MPI(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided));
        g_we_initialised = 1;
    } else {
        MR_TRY_MPI(MPI_Query_thread(&provided));
    }
    atomic_store(&g_serialise, provided < MPI_THREAD_MULTIPLE);
    if (provided < MPI_THREAD_SERIALIZED && !inited)
        mr_log_warn("MPI granted thread level %d (< MPI_THREAD_SERIALIZED): calls from a communication queue's "
                    "thread are serialised but outside the MPI standard", provided);
    else
        mr_log_debug("MPI thread level %d (MPI_THREAD_MULTIPLE is %d)", provided, MPI_THREAD_MULTIPLE);
    int wrank = 0;
    MR_TRY_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &wrank));
    st = dup_comm(MPI_COMM_WORLD, timeout_s, &comm);
    if (st == MR_ERR_COMM) g_any_failed = 1; /* a pending MPI_Comm_idup: MPI_Finalize would wait for it */
    if (st != MR_OK) {
        st = with_context(st, "mr_comm_mpi_new (duplicating MPI_COMM_WORLD)", wrank);
        goto fail;
    }
    MR_TRY(wrap(comm, NULL, timeout_s, out));
    pthread_mutex_unlock(&g_state_mu);
    return MR_OK;
fail:
    if (comm != MPI_COMM_NULL) {
        call_lock();
        MPI_Comm_free(&comm);
        call_unlock();
    }
    if (locked) pthread_mutex_unlock(&g_state_mu);
    return st;
}

mr_status mr_comm_mpi_split(mr_comm *c, int color, mr_comm **out) {
    mr_status st = MR_OK;
    mpi_ctx *m = c->ctx;
    MPI_Comm nc = MPI_COMM_NULL;
    MR_TRY_MPI(MPI_Comm_split(m->comm, color, c->rank, &nc));
    pthread_mutex_lock(&g_state_mu);
    st = wrap(nc, NULL, c->timeout_s, out);
    pthread_mutex_unlock(&g_state_mu);
    if (st != MR_OK) {
        call_lock();
        MPI_Comm_free(&nc);
        call_unlock();
    }
fail:
    return st;
}

/* ---- collectives ------------------------------------------------------------------------------- */

static mr_status tmp_reserve(mpi_ctx *m, size_t bytes) {
    if (bytes <= m->tmp_bytes) return MR_OK;
    void *t = malloc(bytes);
    if (!t) return mr_set_error(MR_ERR_NOMEM, "out of memory for a %zu-byte collective buffer", bytes);
    free(m->tmp);
    m->tmp = t;
    m->tmp_bytes = bytes;
    return MR_OK;
}

/* Ring all-reduce of one piece (k >= size elements of dt, summed in place in buf) over
 * nonblocking point-to-point: size-1 reduce-scatter steps (send chunk r-s to the right, receive
 * chunk r-s-1 from the left and add it in), then size-1 allgather steps. Each chunk is summed once,
 * along the ring, and then copied, so every rank gets the same bits. Each step has the deadline. */
static mr_status ring_allreduce(mr_comm *c, mpi_ctx *m, char *buf, int64_t k, mr_dtype dt) {
    mr_status st = MR_OK;
    const int p = c->size, r = c->rank, right = (r + 1) % p, left = (r + p - 1) % p;
    const size_t es = mr_dtype_size(dt);
    const MPI_Datatype T = mpi_type(dt);
    const int64_t base = k / p, rem = k % p;
#define CHUNK_LO(q) ((q) * base + ((q) < rem ? (q) : rem))
#define CHUNK_N(q) (base + ((q) < rem ? 1 : 0))
    MR_TRY(tmp_reserve(m, (size_t)(base + 1) * es));
    for (int s = 0; s < 2 * (p - 1); s++) {
        int rs = s < p - 1; /* reduce-scatter phase, else allgather */
        int t = rs ? s : s - (p - 1);
        int sq = ((rs ? r - t : r + 1 - t) % p + p) % p, rq = ((rs ? r - t - 1 : r - t) % p + p) % p;
        char *into = rs ? (char *)m->tmp : buf + (size_t)CHUNK_LO(rq) * es;
        MPI_Request rqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        MR_TRY_MPI(MPI_Irecv(into, (int)CHUNK_N(rq), T, left, RING_TAG, m->comm, &rqs[0]));
        MR_TRY_MPI(MPI_Isend(buf + (size_t)CHUNK_LO(sq) * es, (int)CHUNK_N(sq), T, right, RING_TAG, m->comm, &rqs[1]));
        MR_TRY(wait_reqs(2, rqs, c->timeout_s,
                         rs ? "ring reduce-scatter MPI_Isend/MPI_Irecv" : "ring allgather MPI_Isend/MPI_Irecv"));
        if (rs) mr_comm_add_into(buf + (size_t)CHUNK_LO(rq) * es, m->tmp, CHUNK_N(rq), dt);
    }
#undef CHUNK_LO
#undef CHUNK_N
fail:
    return st;
}

/* One step of the recursive doubling: receives k elements of dt from `from` into recv and sends k
 * from send to `to` (either may be NULL: that half is skipped), all posted before one wait with the
 * deadline. Each half goes as f = ceil(bytes / RD_FRAG_BYTES) messages of equal size (at most
 * RD_MAX_FRAGS): Open MPI 4.1's shared-memory transport (btl vader) sends a message of up to its
 * 4 KB eager limit, header included (4032 bytes of payload measured), by copying it into the
 * peer's memory at once, and anything bigger by a rendezvous (a request, the peer's match, a
 * single copy and a reply) that needs both ranks inside MPI calls at the same time. Sent whole,
 * a 4 KB all-reduce was a rendezvous per step and ran a median 0.88x the blocking MPI_Allreduce
 * (12 runs, 2 ranks on a loaded 2-core machine, bench/bench_comm.c); in fragments the medians are
 * 1.22x at 4 KB, 1.69x at 8 KB and 2.07x at 16 KB, where MPI_Allreduce's own messages are
 * rendezvous.
 * MPI's non-overtaking rule matches the fragments of one sender to the receives in the order they
 * were posted, so fragment i lands at its own offset. */
static mr_status rd_exchange(const mr_comm *c, mpi_ctx *m, const char *send, int to, char *recv, int from, int64_t k,
                             mr_dtype dt, const char *call) {
    mr_status st = MR_OK;
    const size_t es = mr_dtype_size(dt);
    const MPI_Datatype T = mpi_type(dt);
    int64_t f = ((int64_t)((size_t)k * es) + RD_FRAG_BYTES - 1) / RD_FRAG_BYTES;
    if (f < 1) f = 1;
    if (f > RD_MAX_FRAGS) f = RD_MAX_FRAGS; /* bigger fragments: only pieces that take the ring are that big */
    const int64_t base = k / f, rem = k % f;
    MPI_Request rqs[2 * RD_MAX_FRAGS];
    int nr = 0;
    for (int half = 0; half < 2; half++) {
        char *p = half == 0 ? recv : (char *)send;
        if (!p) continue;
        for (int64_t i = 0, off = 0; i < f; i++) {
            const int64_t n = base + (i < rem ? 1 : 0);
            if (half == 0) MR_TRY_MPI(MPI_Irecv(p + (size_t)off * es, (int)n, T, from, RD_TAG, m->comm, &rqs[nr]));
            else MR_TRY_MPI(MPI_Isend(p + (size_t)off * es, (int)n, T, to, RD_TAG, m->comm, &rqs[nr]));
            nr++;
            off += n;
        }
    }
    MR_TRY(wait_reqs(nr, rqs, c->timeout_s, call));
fail:
    return st;
}

/* Recursive-doubling all-reduce of one small piece (k elements of dt, summed in place in buf), for
 * the latency-bound sizes below RING_MIN_BYTES (the trainer's per-step agreement: loss, finite
 * flag, stop request, norms). MPI_Iallreduce (libnbc) took 3 to 30 times the blocking
 * MPI_Allreduce's time at 1-16 KB (bench/bench_comm.c); this is one exchange per doubling step over
 * MPI_Isend/MPI_Irecv (rd_exchange: in fragments below the eager limit), each step polled with the
 * deadline, log2(p) steps. With p not a power of two
 * the ranks from p2 (the largest power of two <= p) up first hand their values to rank r - p2 and
 * get the result back at the end. In each step both partners add the same two operands (x + y and
 * y + x are the same IEEE sum), so every rank gets the same bits; NaN payloads aside. */
static mr_status rd_allreduce(mr_comm *c, mpi_ctx *m, char *buf, int64_t k, mr_dtype dt) {
    mr_status st = MR_OK;
    const int p = c->size, r = c->rank;
    const size_t es = mr_dtype_size(dt);
    int p2 = 1;
    while (p2 * 2 <= p) p2 *= 2;
    MR_TRY(tmp_reserve(m, (size_t)(k > 0 ? k : 1) * es));
    if (r >= p2) { /* fold in: give my value to r - p2, then take the result from it */
        MR_TRY(rd_exchange(c, m, buf, r - p2, NULL, 0, k, dt, "recursive-doubling MPI_Isend"));
        MR_TRY(rd_exchange(c, m, NULL, 0, buf, r - p2, k, dt, "recursive-doubling MPI_Irecv"));
        return MR_OK;
    }
    if (r + p2 < p) {
        MR_TRY(rd_exchange(c, m, NULL, 0, m->tmp, r + p2, k, dt, "recursive-doubling MPI_Irecv"));
        mr_comm_add_into(buf, m->tmp, k, dt);
    }
    for (int mask = 1; mask < p2; mask <<= 1) {
        const int partner = r ^ mask;
        MR_TRY(rd_exchange(c, m, buf, partner, m->tmp, partner, k, dt, "recursive-doubling MPI_Isend/MPI_Irecv"));
        mr_comm_add_into(buf, m->tmp, k, dt);
    }
    if (r + p2 < p) /* fold out */
        MR_TRY(rd_exchange(c, m, buf, r + p2, NULL, 0, k, dt, "recursive-doubling MPI_Isend"));
fail:
    return st;
}

/* Starts one nonblocking collective (a piece), then polls it to completion. */
#define RUN_PIECE(post, name)                                                                     \
    do {                                                                                          \
        MPI_Request req_ = MPI_REQUEST_NULL;                                                      \
        MR_TRY_MPI(post);                                                                         \
        MR_TRY(wait_req(&req_, c->timeout_s, name));                                              \
    } while (0)

static mr_status mpi_collective(mr_comm *c, const mr_coll *op) {
    mr_status st = MR_OK;
    mpi_ctx *m = c->ctx;
    char what[200];
    if (atomic_load(&m->fam->failed)) {
        mr_coll_describe(c, op, what, sizeof what);
        return mr_set_error(MR_ERR_COMM, "%s on rank %d: not run, a collective on this communicator's family "
                            "failed earlier; %s", what, c->rank, MR_COMM_HINT);
    }
    const MPI_Datatype T = mpi_type(op->dt);
    const size_t es = op->kind == MR_COLL_BARRIER || op->kind == MR_COLL_DUP ? 1 : mr_dtype_size(op->dt);
    const int64_t per = (int64_t)(c->piece_bytes / es) > 0 ? (int64_t)(c->piece_bytes / es) : 1;
    const int64_t n = op->n;
    char *buf = op->buf;
    const char *send = op->send;
    switch (op->kind) {
    case MR_COLL_ALLREDUCE: {
        int64_t off = 0;
        do { /* one call even for n == 0, so every rank makes the same MPI calls */
            int k = (int)(n - off < per ? n - off : per);
            if ((size_t)k * es >= RING_MIN_BYTES && k >= c->size && c->size > 1) /* same choice on every rank */
                MR_TRY(ring_allreduce(c, m, buf + (size_t)off * es, k, op->dt));
            else if (c->size > 1 && k > 0)
                MR_TRY(rd_allreduce(c, m, buf + (size_t)off * es, k, op->dt));
            else
                RUN_PIECE(MPI_Iallreduce(MPI_IN_PLACE, buf + (size_t)off * es, k, T, MPI_SUM, m->comm, &req_),
                          "MPI_Iallreduce");
            off += k;
        } while (off < n);
        if (op->op == MR_REDUCE_AVG) mr_comm_div(buf, n, op->dt, c->size);
        break;
    }
    case MR_COLL_BROADCAST: {
        int64_t off = 0;
        do {
            int k = (int)(n - off < per ? n - off : per);
            RUN_PIECE(MPI_Ibcast(buf + (size_t)off * es, k, T, op->root, m->comm, &req_), "MPI_Ibcast");
            off += k;
        } while (off < n);
        break;
    }
    case MR_COLL_ALLGATHER: {
        const char *mine = buf + (size_t)c->rank * (size_t)n * es;
        int in_place = send == mine;
        if (n <= per / c->size) {
            RUN_PIECE(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)n, T, buf, (int)n, T, m->comm, &req_),
                      "MPI_Iallgather");
            break;
        }
        /* pieces of k per rank: gather into tmp, then place each rank's k at q * n + off */
        int64_t k_max = per / c->size > 0 ? per / c->size : 1;
        MR_TRY(tmp_reserve(m, (size_t)k_max * (size_t)c->size * es));
        for (int64_t off = 0; off < n; off += k_max) {
            int k = (int)(n - off < k_max ? n - off : k_max);
            const char *src = (in_place ? mine : send) + (size_t)off * es;
            RUN_PIECE(MPI_Iallgather(src, k, T, m->tmp, k, T, m->comm, &req_), "MPI_Iallgather");
            for (int q = 0; q < c->size; q++)
                memcpy(buf + ((size_t)q * (size_t)n + (size_t)off) * es, (char *)m->tmp + (size_t)q * (size_t)k * es,
                       (size_t)k * es);
        }
        break;
    }
    case MR_COLL_REDUCE_SCATTER: {
        if (n <= per / c->size) {
            RUN_PIECE(MPI_Ireduce_scatter_block(send, buf, (int)n, T, MPI_SUM, m->comm, &req_),
                      "MPI_Ireduce_scatter_block");
        } else { /* pieces of k per block: pack each block's k into tmp, reduce-scatter those */
            int64_t k_max = per / c->size > 0 ? per / c->size : 1;
            MR_TRY(tmp_reserve(m, (size_t)k_max * (size_t)c->size * es));
            for (int64_t off = 0; off < n; off += k_max) {
                int k = (int)(n - off < k_max ? n - off : k_max);
                for (int q = 0; q < c->size; q++)
                    memcpy((char *)m->tmp + (size_t)q * (size_t)k * es,
                           send + ((size_t)q * (size_t)n + (size_t)off) * es, (size_t)k * es);
                RUN_PIECE(MPI_Ireduce_scatter_block(m->tmp, buf + (size_t)off * es, k, T, MPI_SUM, m->comm, &req_),
                          "MPI_Ireduce_scatter_block");
            }
        }
        if (op->op == MR_REDUCE_AVG) mr_comm_div(buf, n, op->dt, c->size);
        break;
    }
    case MR_COLL_BARRIER: RUN_PIECE(MPI_Ibarrier(m->comm, &req_), "MPI_Ibarrier"); break;
    case MR_COLL_DUP: {
        MPI_Comm nc = MPI_COMM_NULL;
        MR_TRY(dup_comm(m->comm, c->timeout_s, &nc));
        pthread_mutex_lock(&g_state_mu);
        st = wrap(nc, m->fam, c->timeout_s, op->dup_out);
        pthread_mutex_unlock(&g_state_mu);
        if (st != MR_OK) {
            call_lock();
            MPI_Comm_free(&nc);
            call_unlock();
            goto fail;
        }
        break;
    }
    }
    return MR_OK;
fail:
    if (st == MR_ERR_COMM) {
        atomic_store(&m->fam->failed, 1);
        pthread_mutex_lock(&g_state_mu);
        g_any_failed = 1;
        pthread_mutex_unlock(&g_state_mu);
    }
    mr_coll_describe(c, op, what, sizeof what);
    return with_context(st, what, c->rank);
}

static void mpi_abort(mr_comm *c, int code, const char *why) {
    mpi_ctx *m = c->ctx;
    if (code == 0) code = 1;
    fprintf(stderr, "mirror: rank %d aborting the job (code %d): %s\n", c->rank, code, why);
    fflush(stderr);
    fflush(stdout);
    call_lock();
    MPI_Abort(m->comm, code);
    /* MPI_Abort does not return; if an MPI library ever does, do not let this rank go on. */
    _Exit(code);
}

static void mpi_destroy(mr_comm *c) {
    mpi_ctx *m = c->ctx;
    pthread_mutex_lock(&g_state_mu);
    int failed = atomic_load(&m->fam->failed);
    if (!failed) {
        call_lock();
        MPI_Comm_free(&m->comm);
        call_unlock();
    } /* else: a request may still be pending on it; leave it to the process's end */
    if (--m->fam->refs == 0) free(m->fam);
    free(m->tmp);
    free(m);
    if (--g_live == 0 && g_we_initialised && !g_any_failed) {
        call_lock();
        MPI_Finalize();
        call_unlock();
    }
    pthread_mutex_unlock(&g_state_mu);
}

static const mr_comm_vtable mpi_vtable = {
    .name = "mpi", .collective = mpi_collective, .abort = mpi_abort, .destroy = mpi_destroy};

/* ---- launcher detection ------------------------------------------------------------------------ */

int mr_comm_launched_multi(void) {
    /* Open MPI, MPICH/Hydra (also Intel MPI), MVAPICH, and an srun job step (not a batch script's
     * own SLURM_NTASKS, which is set without srun too). */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS",
                                       "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atol(v) > 1) return 1;
    }
    return 0;
}
