/* Data-parallel gradient exchange: PyTorch DDP's reducer and ZeRO-1's sharded update, over a
 * communicator (distribute/comm.h), for one replica of a group that trains one model.
 *
 * A reducer (mr_ddp) is made once a run from the replicas' communicator, the gradient buffer
 * (all parameters' gradients in one contiguous f32 buffer, as autodiff/nn.h mr_params lays them
 * out) and, per parameter, where its gradient lies in the buffer and after how many kernels of
 * the backward it is final (autodiff/graph.h mr_plan_ready_after). Each step then:
 *   mr_ddp_backward  runs the backward range by range (the caller's run function) and, in the
 *                    overlapped mode, hands each bucket to the communication thread as soon as
 *                    its last gradient is written;
 *   mr_ddp_finish    agrees the caller's host values (the loss, a stop request) and averages the
 *                    gradient over the replicas: waits for the buckets, or all-reduces the
 *                    buffer, or (ZeRO-1) reduce-scatters it so this replica holds its shard;
 *   mr_ddp_all / mr_ddp_sumsq  agree the finite check and the clipping norm over the shards
 *                    (mr_ddp_sum_counts: which parameters were not finite, when it failed);
 *   mr_ddp_gather    all-gathers the updated parameter shards (ZeRO-1).
 * The modes (chosen by mr_ddp_new from the configuration, see mr_ddp_cfg):
 *   single    no communicator: nothing moves; finish hands back the whole buffer;
 *   overlap   buckets of bucket_bytes (the first kept to 1 MiB, DDP's rule) all-reduced on a queue
 *             (mr_comm_queue) while the backward goes on: host memory, one micro-batch per step,
 *             a backend with queues (not hier, not nccl);
 *   overlap on the device  the same buckets, device memory moved by an nccl gcomm, one micro-batch
 *             per step: as the kernel range that writes a bucket's last gradient is enqueued, an
 *             event recorded on `stream` orders the bucket's all-reduce on the communicator's
 *             stream (mr_comm_nccl_allreduce_async: the whole buffer's NCCL call per element, so
 *             the same bits), while the backward goes on; finish makes `stream` wait for the
 *             communicator's stream (an event; the host does not wait);
 *   allreduce one all-reduce of the whole buffer after the backward (on gcomm: NCCL for device
 *             memory);
 *   shard     ZeRO-1: reduce-scatter after the backward, each replica updates its shard
 *             (mr_ddp_shard_of) of the parameters and the optimizer state, all-gather after
 *             (host memory: comm; device memory: gcomm, NCCL, through a padded device buffer;
 *             mr_ddp_gather_shards stays on host buffers and comm, for checkpoints);
 *   none      MIRROR_BENCH_NO_ALLREDUCE's baseline: gradients are not exchanged (the replicas
 *             drift apart; never for training), host values are still agreed.
 * Averages are MR_REDUCE_AVG of the communicator (the local and mpi backends add in rank order:
 * the same bits on every replica and every run, whatever the bucket size).
 *
 * Errors are the communicator's (MR_ERR_COMM: the caller should mr_comm_abort), MR_ERR_INVALID,
 * MR_ERR_NOMEM. One reducer is used by one thread. C11 and C++ clean; includes no MPI, CUDA or
 * NCCL header. */
#ifndef MR_DDP_H
#define MR_DDP_H

#include <stdint.h>

#include "core/device.h"
#include "distribute/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_ddp mr_ddp;

/* One parameter's gradient: elements [off, off + n) of the gradient buffer, final after `ready`
 * kernels of the backward's plan (mr_plan_ready_after; 0: no kernel writes it). */
typedef struct mr_ddp_param {
    int64_t off, n;
    int32_t ready;
} mr_ddp_param;

typedef struct mr_ddp_cfg {
    mr_comm *comm;        /* the replicas' host communicator (borrowed; NULL: one replica) */
    mr_comm *gcomm;       /* moves the gradients (borrowed): comm for host memory, an nccl
                           * communicator for device memory; NULL: comm */
    mr_device dev;        /* where the gradients live (the CPU for host memory) */
    mr_stream *stream;    /* dev's stream that writes them (synchronised before the exchange) */
    float *grads;         /* the gradient buffer, n floats of dev's memory (borrowed) */
    int64_t n;
    const mr_ddp_param *params; /* n_params entries in buffer order (copied) */
    int32_t n_params;
    double bucket_bytes;  /* overlap: the largest bucket (a bigger parameter is a bucket of its
                           * own); 0: 16 MiB */
    int overlap;          /* the caller allows overlap (one backward per step; the buffer is the
                           * gradient finish averages) */
    int shard;            /* ZeRO-1 */
    int no_exchange;      /* the benchmark baseline: gradients are not exchanged */
} mr_ddp_cfg;

/* ZeRO-1's split of n elements over world replicas: replica rank owns [off, off + len), shards of
 * stride = ceil(n / world) elements (the last may be shorter; len 0 when n < world shards). */
typedef struct mr_ddp_shard {
    int64_t off, len, stride;
} mr_ddp_shard;
mr_ddp_shard mr_ddp_shard_of(int64_t n, int world, int rank);

/* Makes the reducer. Collective over cfg->comm in the overlap mode (the queue duplicates it):
 * every replica calls it at the same point with the same configuration. MR_ERR_INVALID for an
 * empty shard (naming distribute.shard_optimizer). */
mr_status mr_ddp_new(const mr_ddp_cfg *cfg, mr_ddp **out) MR_WUR;
void mr_ddp_free(mr_ddp *d); /* waits for queued buckets; NULL is a no-op */

/* Runs kernels [first, last) of the backward: run(ctx, a, b) for consecutive ranges that cover
 * them. In the overlap mode each bucket whose gradients are final is queued for its all-reduce
 * between two ranges; the buffer must then not be written until mr_ddp_finish. */
typedef mr_status (*mr_ddp_run_fn)(void *ctx, int32_t first, int32_t last);
mr_status mr_ddp_backward(mr_ddp *d, mr_ddp_run_fn run, void *ctx, int32_t first, int32_t last) MR_WUR;

/* What this replica updates after mr_ddp_finish: g[0, n) of the gradient it was given, or with
 * ZeRO-1 its averaged shard: g (len floats) for parameters [off, off + n). */
typedef struct mr_ddp_part {
    float *g;
    int64_t off, n;
} mr_ddp_part;

/* Ends a step's exchange. agree (n_agree doubles, host memory) becomes the sum over the replicas;
 * g (n floats: the gradient buffer, or an accumulation buffer in the modes without overlap)
 * becomes the replicas' average (shard: only this replica's shard, in the reducer's own buffer).
 * Order: in the overlap mode the buckets are waited for, then the host values agreed; on the device
 * the stream is made to wait for the buckets (no host wait), then the host values agreed; in the
 * others dev's stream is synchronised and the host values agreed first, which doubles as a
 * per-step barrier (a replica that failed before the exchange stops the others through the host
 * communicator, not in an NCCL kernel), then the gradient moves. Single replica: only *upd is
 * set. */
mr_status mr_ddp_finish(mr_ddp *d, float *g, double *agree, int n_agree, mr_ddp_part *upd) MR_WUR;

/* *flag becomes 1 only when it is 1 on every replica (the finite check of the shards); a no-op
 * when every replica holds the same averaged gradient. */
mr_status mr_ddp_all(mr_ddp *d, int *flag) MR_WUR;
/* *sumsq (this replica's sum of squares of its part) becomes the sum over the shards (the
 * global norm's square); a no-op when every replica holds the whole gradient. */
mr_status mr_ddp_sumsq(mr_ddp *d, double *sumsq) MR_WUR;
/* counts (n int64, host) become their sums over the shards (which parameters some shard found
 * not finite, after a failed mr_ddp_all: one all-reduce); a no-op when every replica holds the
 * whole gradient. */
mr_status mr_ddp_sum_counts(mr_ddp *d, int64_t *counts, int64_t n) MR_WUR;
/* ZeRO-1: after the update, every replica's shard of params (n floats of dev's memory) to every
 * replica. A no-op in the other modes. */
mr_status mr_ddp_gather(mr_ddp *d, float *params) MR_WUR;
/* ZeRO-1: full (n floats, host) gets every replica's shard (len floats each, host: an optimizer
 * slot), over comm. */
mr_status mr_ddp_gather_shards(mr_ddp *d, const float *shard, float *full) MR_WUR;

/* Seconds the communication thread spent in collectives so far (0 without overlap): against the
 * waited time, the share of the exchange the backward hid. */
double mr_ddp_busy_seconds(const mr_ddp *d);
/* Non-zero in the overlap mode (host memory, a communication thread). */
int mr_ddp_overlaps(const mr_ddp *d);
/* Non-zero in the overlap mode on the device (NCCL on its own stream). */
int mr_ddp_overlaps_on_device(const mr_ddp *d);
/* The buckets of the overlap modes (0 in the others). */
int mr_ddp_num_buckets(const mr_ddp *d);
/* Traces the exchange (core/trace.h; NULL: not): on `caller` (the thread calling the reducer) an
 * instant "bucket_ready" (arg bucket) as each bucket is queued and a span "wait_buckets" in
 * mr_ddp_finish; the queue's spans on `comm_thread` (mr_comm_queue_set_trace). The caller's own
 * collectives are traced through its communicator (mr_comm_set_trace). */
void mr_ddp_set_trace(mr_ddp *d, struct mr_trace_track *caller, struct mr_trace_track *comm_thread);

#ifdef __cplusplus
}
#endif
#endif
