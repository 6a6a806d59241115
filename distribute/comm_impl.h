/* Private: the communicator backend table and what comm.c shares with the backends.
 *
 * comm.c owns the public entry points: it checks arguments, numbers each collective, fails fast
 * on a broken communicator and then calls the backend's `collective` slot with one descriptor
 * (mr_coll). Backends (comm_local.c, comm_mpi.c, comm_nccl.c) only move and reduce data and keep deadlines;
 * their per-communicator state lives behind `ctx`. */
#ifndef MR_COMM_IMPL_H
#define MR_COMM_IMPL_H

#include <stdint.h>

#include "distribute/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_coll_kind {
    MR_COLL_ALLREDUCE = 0,
    MR_COLL_BROADCAST = 1,
    MR_COLL_ALLGATHER = 2,
    MR_COLL_REDUCE_SCATTER = 3,
    MR_COLL_BARRIER = 4,
    MR_COLL_DUP = 5 /* a new communicator over the same group (for queues) */
} mr_coll_kind;

/* One collective call, as checked by comm.c. */
typedef struct mr_coll {
    mr_coll_kind kind;
    int64_t seq;      /* 1-based number of this call on its communicator (equal on every rank) */
    const void *send; /* allgather: n elements; reduce_scatter: size * n elements */
    void *buf;        /* allreduce, broadcast: n elements in/out; allgather: size * n out;
                         reduce_scatter: n out */
    int64_t n;
    mr_dtype dt;
    mr_reduce_op op;
    int root;
    mr_comm **dup_out; /* MR_COLL_DUP: receives the new communicator */
    int nowait;        /* nccl: enqueue only (mr_comm_nccl_allreduce_async) */
} mr_coll;

typedef struct mr_comm_vtable {
    const char *name; /* "local", "mpi", "nccl" */
    /* Runs one collective (arguments already checked). On failure returns a status and sets the
     * error message (comm.c marks the communicator broken on MR_ERR_COMM). */
    mr_status (*collective)(mr_comm *c, const mr_coll *op);
    /* See mr_comm_abort. For mpi never returns. */
    void (*abort)(mr_comm *c, int code, const char *why);
    /* Releases ctx (not c itself). */
    void (*destroy)(mr_comm *c);
} mr_comm_vtable;

struct mr_comm {
    const mr_comm_vtable *vt;
    mr_comm_backend backend;
    int rank, size;
    double timeout_s;
    int64_t seq;         /* collectives issued so far */
    int queue;           /* 1 for a queue's private duplicate (named "queued" in messages) */
    int broken;          /* a collective failed with MR_ERR_COMM */
    size_t piece_bytes;  /* mr_comm_set_max_piece_bytes */
    struct mr_trace_track *trace; /* spans of this handle's collectives (mr_comm_set_trace; NULL: none) */
    char broken_msg[512];
    void *ctx;
};

/* A new communicator shell (calloc'd; vt, backend, rank, size, timeout_s, piece_bytes set) or
 * NULL when out of memory. */
mr_comm *mr_comm_alloc(const mr_comm_vtable *vt, mr_comm_backend backend, int rank, int size, double timeout_s);

/* "allreduce #17 (4194304 f32)", "queued broadcast #3 (10 u8 from rank 0)", "barrier #2". */
void mr_coll_describe(const mr_comm *c, const mr_coll *op, char *out, size_t cap);

/* Name of a collective kind ("allreduce"). */
const char *mr_coll_name(mr_coll_kind k);

/* Adds src into dst elementwise (n elements of dt: f32, f64 or i64, i64 wrapping). */
void mr_comm_add_into(void *dst, const void *src, int64_t n, mr_dtype dt);
/* Divides n elements of dt by d (AVG). */
void mr_comm_div(void *buf, int64_t n, mr_dtype dt, int d);

/* The text of an error message without its "file:line: " prefix, for nesting one message in
 * another. */
const char *mr_comm_strip_loc(const char *msg);

/* Seconds on a monotonic clock. */
double mr_comm_now(void);

/* MPI_Comm_split of an MPI communicator (comm_mpi.c) into a new family; mr_comm_split (comm.c)
 * has already gathered the colors with a deadline, so every rank is known to be there. */
mr_status mr_comm_mpi_split(mr_comm *c, int color, mr_comm **out) MR_WUR;

/* The hint every deadline message ends with. */
#define MR_COMM_HINT "HINT: another rank died, hung or is at a different step (compare the collective numbers)"

#ifdef __cplusplus
}
#endif
#endif
