/* The NCCL backend: one rank per GPU; all GPUs of a process are driven from one host thread (the
 * NCCL single-thread multi-device pattern), and collectives on several of them are issued as one
 * ncclGroupStart/End group (mr_comm_nccl_group_begin/end). Compiled only in a build with CUDA and
 * NCCL (MIRROR_HAVE_NCCL); comm.c holds the MR_ERR_UNSUPPORTED stubs for the others.
 *
 * Bootstrap: the processes of the job agree on the ranks and the ncclUniqueId over a host
 * communicator (`boot`, usually mpi): an allgather of each process's GPU count, then a broadcast
 * of boot rank 0's id (with a flag, so that a failed ncclGetUniqueId fails every process at once
 * instead of at the deadline). Both use boot's own deadline.
 *
 * Deadlines: communicators are created non-blocking (ncclConfig_t blocking = 0, NCCL >= 2.14), so
 * no NCCL call waits for another rank: ncclCommInitRankConfig, the collectives and ncclGroupEnd may
 * return ncclInProgress, and wait_done() polls ncclCommGetAsyncError until the communicator is
 * past that, then cudaStreamQuery on its stream (still checking the NCCL error state, where a
 * remote failure shows up) until the work has completed, or until timeout_s passes. On expiry
 * or any error every communicator of the process's family (the ones made by one
 * mr_comm_nccl_new) is aborted with ncclCommAbort, which also stops kernels waiting for a
 * peer, and the call returns MR_ERR_COMM naming the collective, its number, size and rank, like
 * comm_mpi.c. With NCCL < 2.14 the communicators are blocking: creation and the first collective
 * on a connection may then wait for the other ranks without a deadline (the GPU work is still
 * polled with one).
 *
 * Threads: NCCL keeps its group state per thread, so this file does too (t_group_n, the only
 * mutable static). A family's mutex guards its handles against mr_comm_abort from another thread;
 * while the owner thread has a group open, such an abort only marks the family failed, and the
 * owner aborts the handles right after its ncclGroupEnd (NCCL's group refers to them until then).
 *
 * Teardown: mr_comm_free starts ncclCommFinalize on its communicator; the last one freed of a
 * family waits for all of them (up to timeout_s, then ncclCommAbort) and destroys them, so a
 * finalize that needs the other local GPUs cannot wait for a free that comes later. */
#include "distribute/comm_impl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cuda/cuda_impl.h" /* MR_TRY_CUDA */

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
/* HINT for the error below: update NCCL, or configure with -DMIRROR_CUDA=OFF */
#error "mirror's NCCL backend needs NCCL >= 2.10 (ncclAvg, ncclBfloat16)"
#endif
#ifndef MR_NCCL_NONBLOCKING
#define MR_NCCL_NONBLOCKING (NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0))
#endif

enum { POLL_HOT = 256, POLL_SLEEP_NS = 20000, MAX_LOCAL = 1024, MAX_GROUP_OPS = 2048 };
#define POLL_SPIN_S 0.01

/* MR_ERR_COMM with NCCL's text for r (ncclGetLastError ignores its argument). */
static mr_status nccl_error(ncclResult_t r, const char *call) {
    const char *last = ncclGetLastError(NULL);
    return mr_set_error(MR_ERR_COMM, "%s failed: %s%s%s", call, ncclGetErrorString(r), last && *last ? ": " : "",
                        last ? last : "");
}

/* Runs one NCCL call; ncclInProgress (a non-blocking communicator still working) is not an error
 * here, the caller polls. On failure sets st and jumps to fail. */
#define MR_TRY_NCCL(call)                                                                         \
    do {                                                                                          \
        ncclResult_t mr_r_ = (call);                                                              \
        if (mr_r_ != ncclSuccess && mr_r_ != ncclInProgress) {                                    \
            st = nccl_error(mr_r_, #call);                                                        \
            goto fail;                                                                            \
        }                                                                                         \
    } while (0)

/* The communicators of one mr_comm_nccl_new: aborted together, destroyed together. */
typedef struct nccl_family {
    pthread_mutex_t mu; /* guards everything below */
    int n;              /* communicators made */
    int live;           /* not yet freed */
    int open_groups;    /* groups open on members (an abort from another thread is deferred) */
    double timeout_s;
    ncclComm_t *h;      /* [n]; NULL once aborted or destroyed */
    int failed;
    char why[400];
} nccl_family;

typedef struct nccl_ctx {
    nccl_family *fam;
    int idx; /* in fam->h */
    int device;
    int has_stream;
    cudaStream_t stream;
    void *d_scratch; /* 8 bytes: the barrier's element, and a non-NULL pointer for empty calls */
    int grouped;     /* in an open group (owner thread only) */
    int mark;        /* scratch flag for the group functions */
    int stage;       /* wait_done: 0 NCCL in progress, 1 stream running, 2 done */
    int64_t g_ops, g_last_seq;
    char g_first[160]; /* the group's first collective on this communicator */
} nccl_ctx;

/* Communicators in this thread's open group (0: none): NCCL's group state is per thread. */
static _Thread_local int t_group_n;

static const mr_comm_vtable nccl_vtable;

/* Marks f failed with `why` (first reason wins) and aborts its handles, unless another thread has
 * a group open on it and we are not that thread (owner == 0): then the owner aborts them after
 * its ncclGroupEnd. */
static void family_fail(nccl_family *f, const char *why, int owner) {
    pthread_mutex_lock(&f->mu);
    if (!f->failed) {
        f->failed = 1;
        snprintf(f->why, sizeof f->why, "%s", why);
    }
    if (owner || f->open_groups == 0)
        for (int i = 0; i < f->n; i++)
            if (f->h[i]) {
                (void)ncclCommAbort(f->h[i]);
                f->h[i] = NULL;
            }
    pthread_mutex_unlock(&f->mu);
}

static void ctx_release(nccl_ctx *x) {
    if (cudaSetDevice(x->device) == cudaSuccess) {
        if (x->has_stream) (void)cudaStreamDestroy(x->stream);
        if (x->d_scratch) (void)cudaFree(x->d_scratch);
    }
    (void)cudaGetLastError();
    x->has_stream = 0;
    x->d_scratch = NULL;
}

/* Waits for every handle's finalize (up to the family's deadline) and destroys it, aborting the
 * ones that do not finish; frees f. */
static void family_close(nccl_family *f) {
#if MR_NCCL_NONBLOCKING
    double t0 = mr_comm_now();
#endif
    for (int i = 0; i < f->n; i++) {
        if (!f->h[i]) continue;
        ncclResult_t r = ncclSuccess;
#if MR_NCCL_NONBLOCKING
        for (;;) {
            if (ncclCommGetAsyncError(f->h[i], &r) != ncclSuccess) r = ncclInternalError;
            if (r != ncclInProgress || mr_comm_now() - t0 > f->timeout_s) break;
            struct timespec ts = {0, POLL_SLEEP_NS};
            nanosleep(&ts, NULL);
        }
#endif
        if (r == ncclSuccess)
            (void)ncclCommDestroy(f->h[i]);
        else
            (void)ncclCommAbort(f->h[i]);
        f->h[i] = NULL;
    }
    pthread_mutex_destroy(&f->mu);
    free(f->h);
    free(f);
}

/* Polls the n communicators until each is past ncclInProgress and (streams) its stream has
 * drained (with ev: until the event ev has completed; n is 1 then), an error shows, or timeout_s
 * passes. On failure returns MR_ERR_COMM with the reason (the caller adds which collective) and
 * *bad = the index of the communicator concerned. */
static mr_status wait_done_ev(mr_comm *const *cs, int n, double timeout_s, int streams, cudaEvent_t ev, int *bad) {
    for (int i = 0; i < n; i++) ((nccl_ctx *)cs[i]->ctx)->stage = 0;
    double t0 = mr_comm_now();
    for (long polls = 0;; polls++) {
        int first_pending = -1;
        for (int i = 0; i < n; i++) {
            nccl_ctx *x = cs[i]->ctx;
            if (x->stage == 2) continue;
            ncclResult_t r = ncclSuccess;
            cudaError_t ce = cudaSuccess;
            char why[400] = "";
            pthread_mutex_lock(&x->fam->mu);
            ncclComm_t h = x->fam->h[x->idx];
            if (!h) {
                snprintf(why, sizeof why, "%s", x->fam->failed ? x->fam->why : "the communicator was destroyed");
            } else {
                ncclResult_t q = ncclCommGetAsyncError(h, &r);
                if (q != ncclSuccess) r = q;
                if (r == ncclSuccess && x->stage == 0) x->stage = streams ? 1 : 2;
                if (r == ncclSuccess && x->stage == 1) {
                    ce = ev ? cudaEventQuery(ev) : cudaStreamQuery(x->stream);
                    if (ce == cudaSuccess) x->stage = 2;
                    if (ce == cudaErrorNotReady) ce = cudaSuccess;
                }
            }
            pthread_mutex_unlock(&x->fam->mu);
            if (!h) {
                *bad = i;
                return mr_set_error(MR_ERR_COMM, "aborted: %s", why);
            }
            if (r != ncclSuccess && r != ncclInProgress) {
                *bad = i;
                const char *last = ncclGetLastError(NULL);
                return mr_set_error(MR_ERR_COMM, "NCCL reported an error on cuda:%d: %s%s%s", x->device,
                                    ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
            }
            if (ce != cudaSuccess) {
                *bad = i;
                (void)cudaGetLastError();
                return mr_set_error(MR_ERR_COMM, "%s on cuda:%d failed: %s (%s)",
                                    ev ? "cudaEventQuery" : "cudaStreamQuery", x->device, cudaGetErrorString(ce),
                                    cudaGetErrorName(ce));
            }
            if (x->stage != 2 && first_pending < 0) first_pending = i;
        }
        if (first_pending < 0) return MR_OK;
        if (polls < POLL_HOT) continue; /* a small collective completes within these */
        double waited = mr_comm_now() - t0;
        if (waited > timeout_s) {
            nccl_ctx *x = cs[first_pending]->ctx;
            *bad = first_pending;
            return mr_set_error(MR_ERR_COMM, "no progress for %g s (%s on cuda:%d); %s", timeout_s,
                                x->stage == 0 ? "NCCL still setting up" : "GPU work not finished", x->device,
                                MR_COMM_HINT);
        }
        if (waited < POLL_SPIN_S) {
            sched_yield();
        } else {
            struct timespec ts = {0, POLL_SLEEP_NS};
            nanosleep(&ts, NULL);
        }
    }
}

static mr_status wait_done(mr_comm *const *cs, int n, double timeout_s, int streams, int *bad) {
    return wait_done_ev(cs, n, timeout_s, streams, NULL, bad);
}

/* Re-sets the last error as "<what> on rank R: <message>"; returns st. */
static mr_status with_context(mr_status st, const char *what, int rank) {
    char inner[800];
    snprintf(inner, sizeof inner, "%s", mr_comm_strip_loc(mr_last_error()));
    return mr_set_error(st, "%s on rank %d: %s", what, rank, inner);
}

/* ---- creation ---------------------------------------------------------------------------------- */

/* Frees what mr_comm_nccl_new made so far (handles aborted). */
static void discard(nccl_family *f, mr_comm **made, int n) {
    if (f) {
        for (int i = 0; i < f->n; i++)
            if (f->h[i]) (void)ncclCommAbort(f->h[i]);
        pthread_mutex_destroy(&f->mu);
        free(f->h);
        free(f);
    }
    for (int i = 0; made && i < n; i++) {
        if (!made[i]) continue;
        if (made[i]->ctx) {
            ctx_release(made[i]->ctx);
            free(made[i]->ctx);
        }
        free(made[i]);
    }
}

mr_status mr_comm_nccl_new(const int *devices, int n_local, mr_comm *boot, double timeout_s, mr_comm **comms) {
    mr_status st = MR_OK;
    nccl_family *fam = NULL;
    mr_comm **made = NULL;
    int64_t *counts = NULL;
    int in_group = 0, ndev = 0, world = n_local, base = 0, brank = 0, bad = 0;
    int multi = boot && boot->size > 1;
    struct {
        int64_t ok;
        ncclUniqueId id;
    } msg;
    MR_CHECK(devices && comms, MR_ERR_INVALID, "mr_comm_nccl_new: %s is NULL", devices ? "comms" : "devices");
    MR_CHECK(n_local >= 1 && n_local <= MAX_LOCAL, MR_ERR_INVALID, "mr_comm_nccl_new: n_local %d (1..%d)", n_local,
             MAX_LOCAL);
    MR_CHECK(timeout_s > 0 && timeout_s < 1e9, MR_ERR_INVALID, "mr_comm_nccl_new: timeout %g s (must be > 0)",
             timeout_s);
    MR_CHECK(!boot || boot->backend != MR_COMM_NCCL, MR_ERR_INVALID,
             "mr_comm_nccl_new: boot must be a host communicator (mpi or local), not an nccl one");
    for (int i = 0; i < n_local; i++)
        for (int j = 0; j < i; j++)
            MR_CHECK(devices[i] != devices[j], MR_ERR_INVALID,
                     "mr_comm_nccl_new: cuda:%d is listed twice (NCCL needs one rank per GPU)", devices[i]);
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev <= 0) {
        (void)cudaGetLastError();
        MR_CHECK(0, MR_ERR_NOT_FOUND, "mr_comm_nccl_new: no usable GPU (%s)",
                 ce != cudaSuccess ? cudaGetErrorString(ce) : "the CUDA runtime sees no device");
    }
    for (int i = 0; i < n_local; i++)
        MR_CHECK(devices[i] >= 0 && devices[i] < ndev, MR_ERR_NOT_FOUND,
                 "mr_comm_nccl_new: cuda:%d does not exist (%d visible; check CUDA_VISIBLE_DEVICES)", devices[i],
                 ndev);

    /* ranks: this process's GPUs follow those of the lower boot ranks */
    if (multi) {
        brank = boot->rank;
        counts = calloc((size_t)boot->size, sizeof *counts);
        MR_CHECK(counts, MR_ERR_NOMEM, "mr_comm_nccl_new: out of memory");
        counts[brank] = n_local;
        st = mr_comm_allgather(boot, counts + brank, counts, 1, MR_I64);
        if (st != MR_OK) {
            st = with_context(st, "mr_comm_nccl_new (gathering each process's GPU count over boot)", brank);
            goto fail;
        }
        world = 0;
        for (int q = 0; q < boot->size; q++) {
            MR_CHECK(counts[q] >= 1 && counts[q] <= MAX_LOCAL, MR_ERR_COMM,
                     "mr_comm_nccl_new: boot rank %d reports %lld GPUs (1..%d)", q, (long long)counts[q], MAX_LOCAL);
            if (q < brank) base += (int)counts[q];
            world += (int)counts[q];
        }
    }
    memset(&msg, 0, sizeof msg);
    ncclResult_t idr = ncclSuccess;
    if (brank == 0) {
        idr = ncclGetUniqueId(&msg.id);
        msg.ok = idr == ncclSuccess;
    }
    if (multi) {
        st = mr_comm_broadcast(boot, &msg, (int64_t)sizeof msg, MR_U8, 0);
        if (st != MR_OK) {
            st = with_context(st, "mr_comm_nccl_new (broadcasting the ncclUniqueId over boot)", brank);
            goto fail;
        }
    }
    if (!msg.ok) {
        if (brank == 0) {
            st = nccl_error(idr, "mr_comm_nccl_new: ncclGetUniqueId");
            goto fail;
        }
        MR_CHECK(0, MR_ERR_COMM, "mr_comm_nccl_new: boot rank 0 could not create the ncclUniqueId (see its error)");
    }

    fam = calloc(1, sizeof *fam);
    MR_CHECK(fam, MR_ERR_NOMEM, "mr_comm_nccl_new: out of memory");
    fam->h = calloc((size_t)n_local, sizeof *fam->h);
    if (!fam->h || pthread_mutex_init(&fam->mu, NULL) != 0) {
        free(fam->h);
        free(fam);
        fam = NULL;
        MR_CHECK(0, MR_ERR_NOMEM, "mr_comm_nccl_new: out of memory");
    }
    fam->n = n_local;
    fam->timeout_s = timeout_s;
    made = calloc((size_t)n_local, sizeof *made);
    MR_CHECK(made, MR_ERR_NOMEM, "mr_comm_nccl_new: out of memory");
    for (int i = 0; i < n_local; i++) {
        made[i] = mr_comm_alloc(&nccl_vtable, MR_COMM_NCCL, base + i, world, timeout_s);
        MR_CHECK(made[i], MR_ERR_NOMEM, "mr_comm_nccl_new: out of memory");
        nccl_ctx *x = calloc(1, sizeof *x);
        MR_CHECK(x, MR_ERR_NOMEM, "mr_comm_nccl_new: out of memory");
        made[i]->ctx = x;
        x->fam = fam;
        x->idx = i;
        x->device = devices[i];
        MR_TRY_CUDA(cudaSetDevice(devices[i]));
        MR_TRY_CUDA(cudaStreamCreateWithFlags(&x->stream, cudaStreamDefault));
        x->has_stream = 1;
        MR_TRY_CUDA(cudaMalloc(&x->d_scratch, 8));
    }

#if MR_NCCL_NONBLOCKING
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
#endif
    MR_TRY_NCCL(ncclGroupStart());
    in_group = 1;
    for (int i = 0; i < n_local; i++) {
        MR_TRY_CUDA(cudaSetDevice(devices[i]));
#if MR_NCCL_NONBLOCKING
        MR_TRY_NCCL(ncclCommInitRankConfig(&fam->h[i], world, msg.id, base + i, &cfg));
#else
        MR_TRY_NCCL(ncclCommInitRank(&fam->h[i], world, msg.id, base + i));
#endif
    }
    in_group = 0;
    MR_TRY_NCCL(ncclGroupEnd());
    st = wait_done(made, n_local, timeout_s, 0, &bad);
    if (st != MR_OK) {
        char what[160];
        snprintf(what, sizeof what, "mr_comm_nccl_new (NCCL initialisation on cuda:%d, world of %d)", devices[bad],
                 world);
        st = with_context(st, what, base + bad);
        goto fail;
    }
    fam->live = n_local;
    for (int i = 0; i < n_local; i++) comms[i] = made[i];
    free(made);
    free(counts);
    return MR_OK;
fail:
    if (in_group) (void)ncclGroupEnd();
    discard(fam, made, n_local);
    free(made);
    free(counts);
    return st;
}

/* ---- collectives ------------------------------------------------------------------------------- */

static ncclDataType_t nccl_type(mr_dtype dt) {
    switch (dt) {
    case MR_F32: return ncclFloat32;
    case MR_F64: return ncclFloat64;
    case MR_F16: return ncclFloat16;
    case MR_BF16: return ncclBfloat16;
    case MR_I32: return ncclInt32;
    case MR_I64: return ncclInt64;
    default: return ncclUint8;
    }
}

/* MR_ERR_INVALID unless p (for n > 0 elements) is device (or managed) memory of x's GPU. */
static mr_status check_ptr(const nccl_ctx *x, const void *p, const char *name, const char *arg) {
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mr_set_error(MR_ERR_INVALID, "%s: %s %p is not CUDA memory (%s)", name, arg, p, cudaGetErrorString(e));
    }
    if (a.type == cudaMemoryTypeManaged) return MR_OK;
    if (a.type != cudaMemoryTypeDevice)
        return mr_set_error(MR_ERR_INVALID,
                            "%s: %s %p is host memory, not device memory of cuda:%d; HINT: nccl collectives take "
                            "device pointers",
                            name, arg, p, x->device);
    if (a.device != x->device)
        return mr_set_error(MR_ERR_INVALID, "%s: %s %p is on cuda:%d but the communicator is on cuda:%d", name, arg, p,
                            a.device, x->device);
    return MR_OK;
}

/* An argument error found here: the call was not issued, so it does not keep its number (every
 * rank's numbers stay equal). */
static mr_status not_issued(mr_comm *c, mr_status st) {
    c->seq--;
    return st;
}

static mr_status nccl_collective(mr_comm *c, const mr_coll *op) {
    mr_status st = MR_OK;
    nccl_ctx *x = c->ctx;
    nccl_family *f = x->fam;
    const char *name = mr_coll_name(op->kind);
    char what[200];
    if (op->kind == MR_COLL_DUP)
        return not_issued(c, mr_set_error(MR_ERR_UNSUPPORTED, "communication queues are not supported on nccl "
                                                              "communicators; HINT: group the collectives with "
                                                              "mr_comm_nccl_group_begin/end instead"));
    if (x->grouped && t_group_n == 0)
        return not_issued(c, mr_set_error(MR_ERR_INVALID, "%s: the communicator is in a group opened by another "
                                                          "thread",
                                          name));
    if (!x->grouped && t_group_n != 0)
        return not_issued(c, mr_set_error(MR_ERR_INVALID, "%s: rank %d is not in this thread's open group (groups "
                                                          "do not nest)",
                                          name, c->rank));
    if (!x->grouped && f->n > 1)
        return not_issued(c, mr_set_error(MR_ERR_INVALID, "%s: rank %d shares its process with %d other GPUs, which "
                                                          "could never join; HINT: call it inside "
                                                          "mr_comm_nccl_group_begin/end on all of them",
                                          name, c->rank, f->n - 1));
    if (x->grouped && x->g_ops >= MAX_GROUP_OPS)
        return not_issued(c, mr_set_error(MR_ERR_INVALID, "%s: more than %d collectives in one group (NCCL's limit)",
                                          name, MAX_GROUP_OPS));
    if (op->n > 0 && op->kind != MR_COLL_BARRIER) {
        st = check_ptr(x, op->buf, name, op->kind == MR_COLL_ALLGATHER || op->kind == MR_COLL_REDUCE_SCATTER ?
                                           "recv" : "buf");
        if (st == MR_OK && op->send) st = check_ptr(x, op->send, name, "send");
        if (st != MR_OK) return not_issued(c, st);
    }

    const ncclDataType_t T = nccl_type(op->dt);
    const ncclRedOp_t R = op->op == MR_REDUCE_AVG ? ncclAvg : ncclSum;
    const size_t n = (size_t)op->n;
    void *buf = op->n ? op->buf : x->d_scratch; /* NCCL rejects NULL even for 0 elements */
    const void *send = op->n && op->send ? op->send : buf;
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&f->mu);
    ncclComm_t h = f->failed ? NULL : f->h[x->idx]; /* failed: an abort may be deferred (open group) */
    if (h) switch (op->kind) {
        case MR_COLL_ALLREDUCE: r = ncclAllReduce(buf, buf, n, T, R, h, x->stream); break;
        case MR_COLL_BROADCAST: r = ncclBroadcast(buf, buf, n, T, op->root, h, x->stream); break;
        case MR_COLL_ALLGATHER: r = ncclAllGather(send, buf, n, T, h, x->stream); break;
        case MR_COLL_REDUCE_SCATTER: r = ncclReduceScatter(send, buf, n, T, R, h, x->stream); break;
        case MR_COLL_BARRIER:
            r = ncclAllReduce(x->d_scratch, x->d_scratch, 1, ncclFloat32, ncclSum, h, x->stream);
            break;
        case MR_COLL_DUP: break;
        }
    pthread_mutex_unlock(&f->mu);
    if (!h) {
        char why[400];
        pthread_mutex_lock(&f->mu);
        snprintf(why, sizeof why, "%s", f->why);
        pthread_mutex_unlock(&f->mu);
        mr_coll_describe(c, op, what, sizeof what);
        return mr_set_error(MR_ERR_COMM, "%s on rank %d: not run, this process's NCCL communicators failed earlier: "
                            "%s",
                            what, c->rank, why);
    }
    if (r != ncclSuccess && r != ncclInProgress) {
        st = nccl_error(r, name);
        goto fail;
    }
    if (x->grouped) { /* issued by ncclGroupEnd, waited for by mr_comm_nccl_group_end */
        if (x->g_ops++ == 0) mr_coll_describe(c, op, x->g_first, sizeof x->g_first);
        x->g_last_seq = op->seq;
        return MR_OK;
    }
    int bad = 0;
    MR_TRY(wait_done(&c, 1, c->timeout_s, !op->nowait, &bad)); /* nowait: accepted, not completed */
    return MR_OK;
fail:
    mr_coll_describe(c, op, what, sizeof what);
    st = with_context(MR_ERR_COMM, what, c->rank);
    /* inside a group NCCL still refers to the handles until ncclGroupEnd: group_end aborts them */
    family_fail(f, mr_comm_strip_loc(mr_last_error()), !x->grouped);
    return st;
}

/* ---- stream order (comm.h: mr_comm_nccl_wait_event, mr_comm_nccl_record_event) ------------------ */

static mr_status stream_event(mr_comm *c, mr_event *e, int record) {
    mr_status st = MR_OK;
    const char *fn = record ? "mr_comm_nccl_record_event" : "mr_comm_nccl_wait_event";
    MR_CHECK(c && c->backend == MR_COMM_NCCL, MR_ERR_INVALID, "%s: not an nccl communicator", fn);
    nccl_ctx *x = c->ctx;
    MR_CHECK(e && e->device == x->device, MR_ERR_INVALID, "%s: the event is not one of cuda:%d", fn, x->device);
    MR_CHECK(!x->grouped, MR_ERR_INVALID, "%s: rank %d is in an open group", fn, c->rank);
    if (!record) {
        MR_TRY_CUDA(cudaStreamWaitEvent(x->stream, e->e, 0));
        return MR_OK;
    }
    MR_TRY_CUDA(cudaEventRecord(e->e, x->stream));
    /* NCCL's error state, without waiting: a failure reported since the last collective */
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&x->fam->mu);
    ncclComm_t h = x->fam->h[x->idx];
    if (h) {
        ncclResult_t q = ncclCommGetAsyncError(h, &r);
        if (q != ncclSuccess) r = q;
    }
    pthread_mutex_unlock(&x->fam->mu);
    MR_CHECK(h, MR_ERR_COMM, "%s on rank %d: the communicator was aborted", fn, c->rank);
    if (r != ncclSuccess && r != ncclInProgress) MR_TRY(nccl_error(r, fn));
fail:
    return st;
}

mr_status mr_comm_nccl_wait_event(mr_comm *c, mr_event *e) { return stream_event(c, e, 0); }
mr_status mr_comm_nccl_record_event(mr_comm *c, mr_event *e) { return stream_event(c, e, 1); }

mr_status mr_comm_nccl_host_wait(mr_comm *c, mr_event *e, const char *what) {
    mr_status st = MR_OK;
    MR_CHECK(c && c->backend == MR_COMM_NCCL, MR_ERR_INVALID, "mr_comm_nccl_host_wait: not an nccl communicator");
    nccl_ctx *x = c->ctx;
    MR_CHECK(e && e->device == x->device, MR_ERR_INVALID, "mr_comm_nccl_host_wait: the event is not one of cuda:%d",
             x->device);
    MR_CHECK(!x->grouped, MR_ERR_INVALID, "mr_comm_nccl_host_wait: rank %d is in an open group", c->rank);
    int bad = 0;
    if (wait_done_ev(&c, 1, c->timeout_s, 1, e->e, &bad) == MR_OK) return MR_OK;
    char inner[800];
    snprintf(inner, sizeof inner, "%s", mr_comm_strip_loc(mr_last_error()));
    st = mr_set_error(MR_ERR_COMM, "waiting for %s on rank %d: %s", what ? what : "the GPU", c->rank, inner);
    /* the kernels waiting for a peer stop only when the communicators are aborted */
    family_fail(x->fam, mr_comm_strip_loc(mr_last_error()), 1);
fail:
    return st;
}

/* ---- groups ------------------------------------------------------------------------------------ */

/* MR_ERR_INVALID unless every comms[i] is a distinct nccl communicator (uses the mark flags). */
static mr_status check_list(mr_comm *const *comms, int n, const char *fn) {
    mr_status st = MR_OK;
    int marked = 0;
    MR_CHECK(comms && n >= 1, MR_ERR_INVALID, "%s: %s", fn, comms ? "n < 1" : "comms is NULL");
    for (; marked < n; marked++) {
        mr_comm *c = comms[marked];
        MR_CHECK(c && c->backend == MR_COMM_NCCL, MR_ERR_INVALID, "%s: comms[%d] is %s", fn, marked,
                 c ? "not an nccl communicator" : "NULL");
        nccl_ctx *x = c->ctx;
        MR_CHECK(!x->mark, MR_ERR_INVALID, "%s: rank %d is listed twice", fn, c->rank);
        x->mark = 1;
    }
fail:
    for (int i = 0; i < marked; i++) ((nccl_ctx *)comms[i]->ctx)->mark = 0;
    return st;
}

mr_status mr_comm_nccl_group_begin(mr_comm *const *comms, int n) {
    mr_status st = MR_OK;
    const char *fn = "mr_comm_nccl_group_begin";
    MR_CHECK(t_group_n == 0, MR_ERR_INVALID, "%s: a group is already open on this thread (groups do not nest)", fn);
    MR_TRY(check_list(comms, n, fn));
    for (int i = 0; i < n; i++) {
        mr_comm *c = comms[i];
        nccl_ctx *x = c->ctx;
        MR_CHECK(!x->grouped, MR_ERR_INVALID, "%s: rank %d is already in an open group", fn, c->rank);
        MR_CHECK(!c->broken, MR_ERR_COMM, "%s: rank %d failed earlier: %s", fn, c->rank, c->broken_msg);
        pthread_mutex_lock(&x->fam->mu);
        int failed = x->fam->failed;
        char why[400];
        snprintf(why, sizeof why, "%s", x->fam->why);
        pthread_mutex_unlock(&x->fam->mu);
        MR_CHECK(!failed, MR_ERR_COMM, "%s: rank %d: this process's NCCL communicators failed earlier: %s", fn, c->rank,
                 why);
    }
    MR_TRY_NCCL(ncclGroupStart());
    for (int i = 0; i < n; i++) {
        nccl_ctx *x = comms[i]->ctx;
        x->grouped = 1;
        x->g_ops = 0;
        x->g_first[0] = '\0';
        pthread_mutex_lock(&x->fam->mu);
        x->fam->open_groups++;
        pthread_mutex_unlock(&x->fam->mu);
    }
    t_group_n = n;
fail:
    return st;
}

mr_status mr_comm_nccl_group_end(mr_comm *const *comms, int n) {
    mr_status st = MR_OK;
    const char *fn = "mr_comm_nccl_group_end";
    MR_CHECK(t_group_n > 0, MR_ERR_INVALID, "%s: no group is open on this thread", fn);
    MR_CHECK(n == t_group_n, MR_ERR_INVALID, "%s: %d communicators, but the open group has %d", fn, n, t_group_n);
    MR_TRY(check_list(comms, n, fn));
    for (int i = 0; i < n; i++)
        MR_CHECK(((nccl_ctx *)comms[i]->ctx)->grouped, MR_ERR_INVALID, "%s: rank %d is not in the open group", fn,
                 comms[i]->rank);

    /* close the group whatever happens from here on */
    ncclResult_t r = ncclGroupEnd();
    double timeout_s = comms[0]->timeout_s;
    int64_t ops = 0;
    for (int i = 0; i < n; i++) {
        nccl_ctx *x = comms[i]->ctx;
        x->grouped = 0;
        ops += x->g_ops;
        if (comms[i]->timeout_s < timeout_s) timeout_s = comms[i]->timeout_s;
        pthread_mutex_lock(&x->fam->mu);
        x->fam->open_groups--;
        int failed = x->fam->failed;
        pthread_mutex_unlock(&x->fam->mu);
        if (failed) family_fail(x->fam, "", 1); /* an abort deferred while the group was open */
    }
    t_group_n = 0;

    int bad = 0;
    if (r != ncclSuccess && r != ncclInProgress) {
        st = nccl_error(r, "ncclGroupEnd");
    } else {
        for (int i = 0; i < n && st == MR_OK; i++)
            if (comms[i]->broken) { /* a collective of the group failed to enqueue */
                bad = i;
                st = mr_set_error(MR_ERR_COMM, "a collective of the group failed: %s", comms[i]->broken_msg);
            }
        if (st == MR_OK && ops > 0) st = wait_done(comms, n, timeout_s, 1, &bad);
    }
    if (st == MR_OK) return MR_OK;

    mr_comm *b = comms[bad];
    nccl_ctx *bx = b->ctx;
    char what[300];
    if (bx->g_ops > 1)
        snprintf(what, sizeof what, "group of %lld collectives (on this rank: %s, then %lld more up to #%lld)",
                 (long long)ops, bx->g_first, (long long)(bx->g_ops - 1), (long long)bx->g_last_seq);
    else if (bx->g_ops == 1)
        snprintf(what, sizeof what, "group of %lld collectives (on this rank: %s)", (long long)ops, bx->g_first);
    else
        snprintf(what, sizeof what, "group of %lld collectives", (long long)ops);
    st = with_context(MR_ERR_COMM, what, b->rank);
    const char *msg = mr_comm_strip_loc(mr_last_error());
    for (int i = 0; i < n; i++) {
        family_fail(((nccl_ctx *)comms[i]->ctx)->fam, msg, 1);
        comms[i]->broken = 1;
        snprintf(comms[i]->broken_msg, sizeof comms[i]->broken_msg, "%s", msg);
    }
fail:
    return st;
}

/* ---- abort and teardown ------------------------------------------------------------------------ */

static void nccl_abort(mr_comm *c, int code, const char *why) {
    nccl_ctx *x = c->ctx;
    char msg[400];
    snprintf(msg, sizeof msg, "rank %d aborted its NCCL communicators (code %d): %s", c->rank, code, why);
    /* c itself is marked broken by its next collective (which sees the failed family); writing
     * c->broken here could race with the thread that owns c */
    family_fail(x->fam, msg, 0);
}

static void nccl_destroy(mr_comm *c) {
    nccl_ctx *x = c->ctx;
    nccl_family *f = x->fam;
    ctx_release(x);
    pthread_mutex_lock(&f->mu);
#if MR_NCCL_NONBLOCKING
    /* returns ncclInProgress; a failure shows in family_close's polling, which then aborts */
    if (f->h[x->idx] && !f->failed) (void)ncclCommFinalize(f->h[x->idx]);
#endif
    int last = --f->live == 0;
    pthread_mutex_unlock(&f->mu);
    free(x);
    if (last) family_close(f);
}

static const mr_comm_vtable nccl_vtable = {
    .name = "nccl", .collective = nccl_collective, .abort = nccl_abort, .destroy = nccl_destroy};
