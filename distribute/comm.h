/* Communicators: the collectives that keep replicas in step, behind one table per backend.
 *
 * A communicator (mr_comm) is one rank's handle on a group of `size` ranks. Three backends share
 * this API (see comm_impl.h for the table):
 *   - local: n replicas in this process, one thread each, sharing memory (mr_comm_local_new);
 *   - mpi:   one rank per process of an mpirun/srun job (mr_comm_mpi_new);
 *   - nccl:  one rank per GPU over NCCL (mr_comm_nccl_new): every GPU of this process gets a
 *            communicator, all driven from one host thread, with collectives on several of them
 *            issued as one group (mr_comm_nccl_group_begin/end). Present in builds with CUDA and
 *            NCCL; elsewhere its constructor returns MR_ERR_UNSUPPORTED.
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
 *   - Buffers are host memory (local, mpi) or device memory of the communicator's GPU (nccl),
 *     given as element counts of one dtype (never bytes). They are borrowed for the duration of
 *     the call only (nccl inside a group: until mr_comm_nccl_group_end returns).
 *   - Thread safety: one handle is used by one thread at a time; different handles (the n local
 *     replicas, or a queue's internal handle) may be used concurrently from different threads.
 *
 * C11 and C++ clean; includes no MPI, CUDA or NCCL header. */
#ifndef MR_COMM_H
#define MR_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h" /* mr_event */
#include "core/dtype.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_comm mr_comm;
struct mr_trace_track; /* core/trace.h */

typedef enum mr_comm_backend { MR_COMM_LOCAL = 0, MR_COMM_MPI = 1, MR_COMM_NCCL = 2, MR_COMM_HIER = 3 } mr_comm_backend;

/* SUM adds; AVG adds then divides by the group size (f32/f64: one IEEE division per element of
 * the sum; i32, i64: C division, truncating toward zero). nccl uses ncclAvg (see mr_comm_nccl_new). */
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

/* Creates one NCCL communicator per GPU of this process (the NCCL single-thread multi-device
 * pattern): comms[i] is rank rank_base + i of the job's world, on CUDA device devices[i], and all
 * of them are driven from one host thread. `boot` connects the processes of the job (usually the
 * mpi communicator; a local one works too, NULL for a single process): every process calls this
 * with its own n_local, the n_local of all processes are gathered over boot, rank_base is the sum
 * of n_local over the lower boot ranks (n_local * boot rank when all are equal) and the world is
 * their total; boot rank 0 makes the ncclUniqueId and broadcasts it over boot. Collective over
 * boot (and with every other process's call), using two collectives on boot, each with boot's own
 * deadline.
 * The communicators are created non-blocking where NCCL supports it (ncclConfig_t blocking = 0,
 * NCCL >= 2.14) and their initialisation is polled with the deadline timeout_s: a process that
 * never joins gives MR_ERR_COMM instead of a hang (with older NCCL, ncclGroupEnd blocks until all
 * have joined). Each communicator owns a CUDA stream of its device, created with default flags so
 * that its collectives are ordered after work on the device's legacy default stream.
 * devices: n_local distinct CUDA ordinals (each < the visible device count). n_local: 1..1024.
 * timeout_s: deadline of the creation and of every collective (> 0, finite).
 * comms: caller's array of n_local pointers, filled on success (each freed with mr_comm_free);
 * untouched on failure. Makes the last device of the list current.
 * Errors: MR_ERR_INVALID (arguments, duplicate device, boot is an nccl communicator),
 * MR_ERR_NOT_FOUND (no GPU, or a device index beyond the visible ones), MR_ERR_UNSUPPORTED (mirror
 * built without CUDA or without NCCL), MR_ERR_DEVICE (CUDA runtime failure), MR_ERR_COMM (NCCL
 * failure, deadline, or a collective on boot failed), MR_ERR_NOMEM. Not thread-safe with other
 * NCCL calls of this process's communicators.
 *
 * Collectives on nccl communicators (the generic functions below): buffers are device pointers of
 * the communicator's GPU (checked with cudaPointerGetAttributes: MR_ERR_INVALID otherwise),
 * f32/f64/i64 reduce (AVG is NCCL's ncclAvg: f32/f64 multiply each contribution by 1/size before
 * adding, so AVG may differ from SUM / size in the last bit; i64 sums then divides), any dtype
 * moves; NCCL picks the algorithm, so sums need not equal a serial loop over the ranks (every rank
 * still gets the same bits). Outside a group the call is enqueued on the communicator's stream and
 * returns once it has completed on the GPU or the deadline passed (stream and NCCL error state
 * polled; on expiry or any NCCL error: ncclCommAbort, MR_ERR_COMM naming the collective, its
 * number, size and rank). Outside a group, a communicator whose process has n_local > 1 rejects
 * collectives with MR_ERR_INVALID (the other local GPUs could never join: use a group). Barrier
 * is a one-element all-reduce. mr_comm_set_max_piece_bytes is ignored; mr_comm_queue_new returns
 * MR_ERR_UNSUPPORTED (use a group instead). */
mr_status mr_comm_nccl_new(const int *devices, int n_local, mr_comm *boot, double timeout_s, mr_comm **comms) MR_WUR;

/* Opens a group on n nccl communicators of this process (usually all n_local from one
 * mr_comm_nccl_new): until mr_comm_nccl_group_end, the generic collectives on them only enqueue
 * their NCCL call (inside ncclGroupStart/End) and return MR_OK, or an argument error; the calls
 * are issued and waited for, with the deadline, by mr_comm_nccl_group_end. Each rank's calls are
 * the usual collective sequence (the same collectives in the same order on every rank of the
 * world). At most 2048 collectives per group (NCCL's limit). Call begin, the collectives and end
 * from one thread; groups do not nest, and while one is open this thread may not use another nccl
 * communicator outside it. Errors: MR_ERR_INVALID (comms NULL, n < 1, a NULL, non-nccl or repeated
 * communicator, one already in a group, a group already open on this thread), MR_ERR_COMM (one
 * failed earlier), MR_ERR_UNSUPPORTED (built without NCCL). On error no group is open. */
mr_status mr_comm_nccl_group_begin(mr_comm *const *comms, int n) MR_WUR;

/* Closes the group opened by mr_comm_nccl_group_begin on the same comms (same n, any order):
 * ncclGroupEnd, then waits until every collective of the group has completed on every GPU or the
 * deadline (the smallest timeout_s of the comms) passed. The group is closed whatever the result.
 * Errors: MR_ERR_INVALID (comms do not match the open group; the group stays open),
 * MR_ERR_COMM (a collective of the group failed to enqueue, NCCL reported an error, or the deadline
 * passed: every communicator of the group is then aborted (ncclCommAbort) and broken, and the
 * message names the first collective of the stuck communicator, its number, size and rank),
 * MR_ERR_UNSUPPORTED (built without NCCL). */
mr_status mr_comm_nccl_group_end(mr_comm *const *comms, int n) MR_WUR;

/* Stream-ordered use of an nccl communicator, for work overlapped with a compute stream (the
 * gradient buckets of distribute/ddp.c): the communicator's own stream waits for a point of the
 * compute stream, collectives are enqueued on it without a host wait, and the compute stream
 * waits for a point of it.
 *   mr_comm_nccl_wait_event    the communicator's stream waits for e (an event of its GPU, recorded
 *                              on the stream that writes what the next collectives read);
 *   mr_comm_nccl_allreduce_async  the all-reduce of mr_comm_allreduce (same checks, same numbering,
 *                              same NCCL call, so the same bits), enqueued on the communicator's
 *                              stream; returns once NCCL has accepted it (a non-blocking
 *                              communicator is polled past ncclInProgress, with the deadline), not
 *                              when it completed: buf must not be touched until a stream that waits
 *                              for mr_comm_nccl_record_event's point has passed it;
 *   mr_comm_nccl_record_event  records e on the communicator's stream after everything enqueued
 *                              so far, and checks NCCL's error state without waiting.
 * Outside a group only, one thread per communicator (n_local 1). The deadline covers enqueuing,
 * not completion: a peer that never joins blocks the stream that waits for the record, not this
 * call; the host waits for such a stream with mr_comm_nccl_host_wait, which has the deadline.
 *   mr_comm_nccl_host_wait     the host waits for e (recorded by the caller on a stream of the
 *                              communicator's GPU, which may wait for its collectives) with the
 *                              communicator's deadline (timeout_s from the call: the work before
 *                              e is at most the few steps CUDA's launch queue holds), polling
 *                              cudaEventQuery and NCCL's error state. On expiry or an NCCL error
 *                              this process's communicators are aborted (the kernels waiting for a
 *                              peer stop, so the stream drains) and it returns MR_ERR_COMM naming
 *                              `what` (e.g. "step 40's results").
 * Errors: MR_ERR_INVALID (not an nccl communicator, an event
 * of another GPU), MR_ERR_COMM (as the collectives), MR_ERR_DEVICE (the CUDA runtime),
 * MR_ERR_UNSUPPORTED (built without NCCL). */
mr_status mr_comm_nccl_wait_event(mr_comm *c, mr_event *e) MR_WUR;
mr_status mr_comm_nccl_allreduce_async(mr_comm *c, void *buf, int64_t n, mr_dtype dt, mr_reduce_op op) MR_WUR;
mr_status mr_comm_nccl_record_event(mr_comm *c, mr_event *e) MR_WUR;
mr_status mr_comm_nccl_host_wait(mr_comm *c, mr_event *e, const char *what) MR_WUR;

/* The host waits for everything enqueued on stream s of device `device` (backend be). With an nccl
 * communicator c the stream may wait for its collectives, so the wait has c's deadline
 * (mr_comm_nccl_host_wait on an event recorded on s: *ev, made on first use, the caller frees it);
 * with any other c, or none, it is be->stream_sync. */
mr_status mr_comm_stream_wait(mr_comm *c, const mr_backend *be, int device, mr_stream *s, mr_event **ev,
                              const char *what) MR_WUR;

/* Non-zero when this process was started by a launcher with more than one rank (mpirun/mpiexec
 * of Open MPI, MPICH or MVAPICH, or srun), read from the launcher's environment variables
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE, MV2_COMM_WORLD_SIZE, SLURM_STEP_NUM_TASKS) without initialising
 * MPI. A batch script's own environment (SLURM_NTASKS without srun) does not
 * count. Thread-safe. */
/* Several replicas per MPI rank: n_local communicators for this process's replicas (one thread
 * each), over the job's MPI communicator `job` (borrowed; it must outlive them and is used by
 * comms[0]'s thread only). Replica r of rank p is rank p * n_local + r of a group of
 * size(job) * n_local. Collectives run among the local replicas, then between ranks, then back
 * (so every replica gets identical bits). No queue (mr_comm_queue_new is MR_ERR_UNSUPPORTED).
 * Every rank must use the same n_local. Errors: MR_ERR_INVALID, MR_ERR_NOMEM. */
mr_status mr_comm_hier_new(mr_comm *job, int n_local, double timeout_s, mr_comm **comms) MR_WUR;

int mr_comm_launched_multi(void);

/* Splits c into groups: the ranks that pass the same color (>= 0) form one new communicator *out,
 * ranked in c's order, with c's deadline and piece size; it fails independently of c. Collective
 * over c: the colors are gathered first with c's deadline (a dead rank fails the call instead of
 * hanging it) and every rank learns the whole split. MPI communicators only (MR_ERR_UNSUPPORTED
 * for the others); MR_ERR_INVALID for a negative color. `mirror sweep` runs trials in groups of
 * ranks this way (launch/sweep.c). */
mr_status mr_comm_split(mr_comm *c, int color, mr_comm **out) MR_WUR;

/* Frees a communicator (NULL: no-op). For the last MPI communicator of the process, finalises MPI
 * when this module initialised it, unless a collective failed (a pending MPI request would make
 * MPI_Finalize wait forever; the process should abort instead; a live queue's duplicate counts
 * as an MPI communicator). nccl: starts ncclCommFinalize; the last freed communicator of one
 * mr_comm_nccl_new waits (up to timeout_s, then ncclCommAbort) for all of them and destroys them.
 * Must not be called while a collective on c is in progress (nor while c is in an open group). */
void mr_comm_free(mr_comm *c);

/* Records a span per collective of c on trace track k (core/trace.h; NULL: none): the
 * collective's name ("allreduce"), with args bytes (what it hands back on this rank) and seq (its
 * number, equal on every rank). Call it from the thread that uses c; k must outlive c's use. */
void mr_comm_set_trace(mr_comm *c, struct mr_trace_track *k);

/* The offset of rank `peer`'s clock from rank 0's (mr_trace_now_ns, CLOCK_MONOTONIC), measured
 * by ping-pong: per round a barrier, then rank 0 reads its clock (t0) and broadcasts, the peer
 * reads its clock (tp) once the broadcast arrived and broadcasts it back, rank 0 reads its clock
 * when that arrives (t1). tp was read after t0 and before t1, so the offset lies within
 * tp - (t0 + t1) / 2 +- (t1 - t0) / 2, whatever the network or the collective's algorithm did;
 * the round with the shortest round trip is kept. On rank 0: *offset_ns = peer's clock minus rank
 * 0's, *error_ns = that bound (half the best round trip); on other ranks both 0. rounds: 1..1000.
 * Collective over c (every rank calls it with the same peer and rounds: the others take part in
 * the broadcasts). Errors: MR_ERR_INVALID (peer, rounds), those of mr_comm_broadcast. */
mr_status mr_comm_clock_offset(mr_comm *c, int peer, int rounds, int64_t *offset_ns, int64_t *error_ns) MR_WUR;

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
 * with MR_ERR_COMM naming this rank, the code and `why`; returns. nccl: ncclCommAbort on every
 * communicator of c's mr_comm_nccl_new (the other local GPUs' too), which are then broken (later
 * collectives fail at once with MR_ERR_COMM naming the code and `why`); returns; the other
 * processes' collectives fail at their deadline (also abort the mpi communicator to stop the job
 * at once). why: may be NULL. c NULL: no-op.
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
 * Errors: MR_ERR_INVALID, MR_ERR_NOMEM, MR_ERR_COMM (the duplication failed or timed out),
 * MR_ERR_UNSUPPORTED (nccl communicators: their collectives are grouped, not queued). */
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

/* Traces the queue (core/trace.h; NULL: not): a span per request on track `thread` (the queue's
 * thread: the collective's name, args bytes and seq, as mr_comm_set_trace), and a flow "queued"
 * from the submit, on track `caller` (the submitting thread's), to that span. Thread-safe; the
 * tracks must outlive the queue. */
void mr_comm_queue_set_trace(mr_comm_queue *q, struct mr_trace_track *thread, struct mr_trace_track *caller);

/* Seconds the queue's thread has spent inside collectives so far (for metrics: compare with the
 * step time to see how much communication was hidden). Thread-safe. */
double mr_comm_queue_busy_seconds(const mr_comm_queue *q);

#ifdef __cplusplus
}
#endif
#endif
