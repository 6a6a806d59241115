/* Communicators: the collectives that keep replicas in step, behind one table per backend.
 *
 * A communicator (mr_comm) is one rank's handle on a group of `size` ranks. Three backends share
 * this API (see comm_impl.h for the table):
 *   - local: n replicas in this process, one thread each, sharing memory (mr_comm_local_new);
 *   - mpi:   one rank per process of an mpirun/srun job (mr_comm_mpi_new);
 *   - nccl:  reserved for the GPU strategy (no constructor yet).
 *
 * Collective contract (every backend):
 *   - Every rank of the group calls the same collectives in the same order with the same n, dtype,
 *     op and root. The local backend checks this and fails with MR_ERR_COMM naming both calls when
 *     ranks disagree; MPI cannot always tell, and a mismatch then ends in the deadline below.
 *   - Never hang: every collective has a deadline (timeout_s given at creation). When a rank does
 *     not take part within it (it died, hung, or is at a different step), the collective returns
 *     MR_ERR_COMM with a message naming the collective, its sequence number (#k, counted per
 *     communicator from 1, equal on every rank), its size, this rank and, where known, the
 *     missing rank, plus a HINT. After any MR_ERR_COMM the communicator is broken: later
 *     collectives on it (and on communicators made from it, see mr_comm_queue_new) fail at once.
 *     The caller should then call mr_comm_abort so that every rank stops.
 *   - Buffers are host memory, given as element counts of one dtype (never bytes). They are
 *     borrowed for the duration of the call only.
 *   - Thread safety: one handle is used by one thread at a time; different handles (the n local
 *     replicas, or a queue's internal handle) may be used concurrently from different threads.
 *
 * C11 and C++ clean; includes no MPI header. */
#ifndef MR_COMM_H
#define MR_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_comm mr_comm;

typedef enum mr_comm_backend { MR_COMM_LOCAL = 0, MR_COMM_MPI = 1, MR_COMM_NCCL = 2 } mr_comm_backend;

/* SUM adds; AVG adds then divides by the group size (f32/f64: one IEEE division per element of
 * the sum; i64: C division, truncating toward zero). */
typedef enum mr_reduce_op { MR_REDUCE_SUM = 0, MR_REDUCE_AVG = 1 } mr_reduce_op;

/* The default largest piece, in bytes, that one MPI collective call moves (see
 * mr_comm_set_max_piece_bytes): Open MPI 4.1's MPI_Allreduce and MPI_Iallreduce ran 2.2-2.6x
 * slower per byte above it (2 ranks, shared memory; bench/bench_comm.c). */
#define MR_COMM_DEFAULT_PIECE_BYTES ((size_t)16 << 20)

/* ---- creation ------------------------------------------------------------------------------ */

/* Creates n communicators for n replicas in this process that share memory: comms[r] is rank r of
 * a group of size n. Every collective must then be called by all n, each from its own thread.
 * Reductions add the contributions in rank order 0..n-1 (each element in the dtype itself), so
 * every replica gets bit-identical results that equal a serial loop over the ranks.
 * n: 1..4096. timeout_s: every collective's deadline in seconds (> 0, finite).
 * comms: caller's array of n pointers, filled on success (each freed with mr_comm_free; the group
 * lives until the last is freed); untouched on failure.
 * Errors: MR_ERR_INVALID (n, timeout_s, comms), MR_ERR_NOMEM. Thread-safe. */
mr_status mr_comm_local_new(int n, double timeout_s, mr_comm **comms) MR_WUR;

/* Creates this process's communicator over MPI_COMM_WORLD (a duplicate of it, with
 * MPI_ERRORS_RETURN, so the caller's own MPI use is not affected). When MPI is not initialised
 * yet, initialises it with MPI_Init_thread requesting MPI_THREAD_MULTIPLE; MPI is then finalised
 * at the mr_comm_free of the last MPI communicator (when MPI was initialised by the caller, the
 * caller finalises it). When MPI grants less than MPI_THREAD_MULTIPLE, all MPI calls of this module
 * are serialised with one lock. Collective over MPI_COMM_WORLD, with the deadline timeout_s.
 * timeout_s: every collective's deadline in seconds (> 0, finite). *out: set on success.
 * Errors: MR_ERR_INVALID (timeout_s, out), MR_ERR_UNSUPPORTED (MPI already finalised),
 * MR_ERR_COMM (MPI failure or deadline), MR_ERR_NOMEM. Thread-safe. */
mr_status mr_comm_mpi_new(double timeout_s, mr_comm **out) MR_WUR;

/* Non-zero when this process was started by a launcher with more than one rank (mpirun/mpiexec
 * of Open MPI, MPICH or MVAPICH, or srun), read from the launcher's environment variables
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE, MV2_COMM_WORLD_SIZE, SLURM_STEP_NUM_TASKS) without initialising
 * MPI. A batch script's own environment (SLURM_NTASKS without srun) does not
 * count. Thread-safe. */
int mr_comm_launched_multi(void);

/* Frees a communicator (NULL: no-op). For the last MPI communicator of the process, finalises MPI
 * when this module initialised it, unless a collective failed (a pending MPI request would make
 * MPI_Finalize wait forever; the process should abort instead; a live queue's duplicate counts
 * as an MPI communicator). Must not be called while a collective on c is in progress. */
void mr_comm_free(mr_comm *c);

/* This rank (0..size-1), the group size, and the backend. Thread-safe. */
int mr_comm_rank(const mr_comm *c);
int mr_comm_size(const mr_comm *c);
mr_comm_backend mr_comm_backend_of(const mr_comm *c);

/* The deadline given at creation, in seconds. Thread-safe. */
double mr_comm_timeout(const mr_comm *c);

/* Sets the largest number of bytes one underlying MPI call moves; bigger collectives are split
 * into pieces of at most this many bytes (each piece has its own deadline, so the deadline is
 * "no progress for timeout_s"). 0 restores MR_COMM_DEFAULT_PIECE_BYTES; values are clamped to
 * [4096, 1 GiB]. The local backend ignores it. Not a collective, but every rank should use the
 * same value. Errors: MR_ERR_INVALID (c NULL). */
mr_status mr_comm_set_max_piece_bytes(mr_comm *c, size_t bytes) MR_WUR;

/* ---- collectives --------------------------------------------------------------------------- */

/* In-place all-reduce: buf (n elements of dt) becomes the reduction over all ranks of their buf.
 * dt: MR_F32, MR_F64 or MR_I64. Every rank gets bit-identical results.
 * Errors: MR_ERR_INVALID (c NULL, n < 0, buf NULL with n > 0, op), MR_ERR_UNSUPPORTED (dtype),
 * MR_ERR_COMM (deadline, abort by another rank, mismatched calls, MPI failure; buf is then
 * unspecified). */
mr_status mr_comm_allreduce(mr_comm *c, void *buf, int64_t n, mr_dtype dt, mr_reduce_op op) MR_WUR;

/* Copies root's buf (n elements of dt) into every rank's buf. Any dtype (bytes are moved).
 * root: 0..size-1. Errors: as mr_comm_allreduce (MR_ERR_INVALID for root too). */
mr_status mr_comm_broadcast(mr_comm *c, void *buf, int64_t n, mr_dtype dt, int root) MR_WUR;

/* Gathers n elements from every rank into every rank: recv (size * n elements of dt) gets rank
 * r's send (n elements) at offset r * n. Any dtype. send may be exactly recv + rank * n (in
 * place); any other overlap is MR_ERR_INVALID. Errors: as mr_comm_allreduce. */
mr_status mr_comm_allgather(mr_comm *c, const void *send, void *recv, int64_t n, mr_dtype dt) MR_WUR;

/* Reduce-scatter: send has size * n elements of dt, seen as size blocks of n; recv (n elements)
 * gets the reduction over all ranks of their block number `rank`. dt: MR_F32, MR_F64, MR_I64.
 * send and recv must not overlap (MR_ERR_INVALID). Errors: as mr_comm_allreduce. */
mr_status mr_comm_reduce_scatter(mr_comm *c, const void *send, void *recv, int64_t n, mr_dtype dt,
                                 mr_reduce_op op) MR_WUR;

/* Returns once every rank has entered the barrier (or the deadline passed).
 * Errors: MR_ERR_INVALID (c NULL), MR_ERR_COMM. */
mr_status mr_comm_barrier(mr_comm *c) MR_WUR;

/* Fatal error on this rank: makes every rank of the job stop instead of hanging.
 * mpi: prints "mirror: rank R aborting the job (code C): why" to stderr and calls MPI_Abort
 * (never returns; code 0 is replaced by 1). local: poisons the group, so that every other
 * replica's pending and future collectives (also on queues made from the group) fail promptly
 * with MR_ERR_COMM naming this rank, the code and `why`; returns. why: may be NULL. c NULL: no-op.
 * Thread-safe (may be called while other replicas are inside collectives). */
void mr_comm_abort(mr_comm *c, int code, const char *why);

/* ---- asynchronous collectives ---------------------------------------------------------------- */

/* A communication thread that runs collectives in submission order, so that gradient
 * all-reduces overlap with the backward pass. */
typedef struct mr_comm_queue mr_comm_queue;

/* Creates a queue on c: a private duplicate of c (so its collectives never interleave with the
 * caller's direct ones on c) and a thread that runs the requests. Collective over c: every rank
 * calls it at the same point. c is only used during this call (the queue may outlive it); the
 * duplicate shares c's failure state (see the collective contract). *out: set on success.
 * Errors: MR_ERR_INVALID, MR_ERR_NOMEM, MR_ERR_COMM (the duplication failed or timed out). */
mr_status mr_comm_queue_new(mr_comm *c, mr_comm_queue **out) MR_WUR;

/* Waits for the requests already submitted (each ends within its deadline), stops the thread
 * and frees the queue. NULL: no-op. */
void mr_comm_queue_free(mr_comm_queue *q);

/* Submits an all-reduce (as mr_comm_allreduce) and returns at once with *ticket, a number that
 * grows by one per request on this queue (the first is 1). buf must stay valid and untouched
 * until the ticket is waited for. Every rank submits the same requests in the same order.
 * Errors: argument errors as mr_comm_allreduce (nothing is submitted), MR_ERR_NOMEM.
 * Submit and wait from one thread at a time. */
mr_status mr_comm_queue_allreduce(mr_comm_queue *q, void *buf, int64_t n, mr_dtype dt, mr_reduce_op op,
                                  int64_t *ticket) MR_WUR;
/* As mr_comm_reduce_scatter, queued (send and recv stay valid until waited for). */
mr_status mr_comm_queue_reduce_scatter(mr_comm_queue *q, const void *send, void *recv, int64_t n, mr_dtype dt,
                                       mr_reduce_op op, int64_t *ticket) MR_WUR;
/* As mr_comm_allgather, queued (send and recv stay valid until waited for). */
mr_status mr_comm_queue_allgather(mr_comm_queue *q, const void *send, void *recv, int64_t n, mr_dtype dt,
                                  int64_t *ticket) MR_WUR;

/* Waits until the ticket's collective has finished and returns its status (tickets may be waited
 * in any order, and more than once). Once a request fails, every later one on the queue fails
 * without running, with a message naming the failed one. Errors: MR_ERR_INVALID (unknown ticket),
 * the request's own error. */
mr_status mr_comm_queue_wait(mr_comm_queue *q, int64_t ticket) MR_WUR;

/* Seconds the queue's thread has spent inside collectives so far (for metrics: compare with the
 * step time to see how much communication was hidden). Thread-safe. */
double mr_comm_queue_busy_seconds(const mr_comm_queue *q);

#ifdef __cplusplus
}
#endif
#endif
