/* The data-parallel reducer (ddp.h): gradient buckets all-reduced while the backward goes on (host
 * memory: a communication thread; device memory: NCCL on its own stream, ordered by events), one
 * all-reduce after it (host or NCCL), or ZeRO-1's reduce-scatter / all-gather (host or NCCL). The trainer
 * (train/train.c) calls it once per step; this file knows communicators and buffers, not models:
 * the caller says where each parameter's gradient lies and when the backward finishes it. */
#include "distribute/ddp.h"
#include "core/trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum ddp_mode { DDP_SINGLE, DDP_OVERLAP, DDP_OVERLAP_DEV, DDP_ALLREDUCE, DDP_SHARD, DDP_NONE } ddp_mode;

/* A contiguous range of the gradient buffer all-reduced as one piece while the backward goes on. */
typedef struct bucket {
    int64_t off, n;  /* elements of the gradient buffer */
    int32_t ready;   /* the backward's kernels after which its gradients are final */
    int64_t ticket;
} bucket;

struct mr_ddp {
    ddp_mode mode;
    mr_comm *comm, *gcomm;
    mr_device dev;
    mr_stream *stream;
    const mr_backend *be;
    float *grads;
    int64_t n;
    int world, rank;
    bucket *b;
    int nb;
    mr_comm_queue *q;
    mr_ddp_shard sh;
    float *zbuf;   /* world * stride: the padded gradient / parameter exchange buffer */
    float *zshard; /* stride: this replica's averaged gradient shard */
    float *d_zbuf, *d_zshard; /* ZeRO-1 on a GPU: the same in device memory, moved by gcomm (the host
                               * ones then serve mr_ddp_gather_shards' host buffers) */
    mr_trace_track *trace; /* the caller's track (mr_ddp_set_trace) */
    mr_event *ev_ready;    /* overlap on the device: a bucket's gradients are written (compute stream) */
    mr_event *ev_done;     /* the buckets' all-reduces have run (the communicator's stream) */
    mr_event *ev_wait;     /* mr_comm_stream_wait's point on the compute stream (NCCL only) */
};

mr_ddp_shard mr_ddp_shard_of(int64_t n, int world, int rank) {
    mr_ddp_shard s;
    s.stride = world > 0 ? (n + world - 1) / world : n;
    s.off = (int64_t)rank * s.stride;
    s.len = n - s.off < s.stride ? n - s.off : s.stride;
    if (s.len < 0) s.len = 0;
    return s;
}

static int cmp_bucket(const void *a, const void *b) {
    const bucket *x = a, *y = b;
    return (x->ready > y->ready) - (x->ready < y->ready);
}

/* Buckets of at most cap_bytes (a parameter bigger than that is a bucket of its own) over
 * consecutive parameters, taken from the last one back (the backward produces the last layers'
 * gradients first), sorted by when they are ready. The first bucket is kept to 1 MB (PyTorch
 * DDP's rule): its all-reduce can then start early in the backward even when the whole model
 * would fit one bucket. */
static mr_status make_buckets(mr_ddp *d, const mr_ddp_param *ps, int32_t np, double cap_bytes) {
    bucket *b = calloc((size_t)(np > 0 ? np : 1), sizeof *b);
    if (!b) return mr_set_error(MR_ERR_NOMEM, "ddp: out of memory for gradient buckets");
    int k = -1;
    int64_t end = 0;
    for (int32_t i = np - 1; i >= 0; i--) {
        const int64_t off = ps[i].off, n = ps[i].n;
        const double cap = k <= 0 && cap_bytes > 1048576.0 ? 1048576.0 : cap_bytes;
        if (k < 0 || (double)(end - off) * sizeof(float) > cap) {
            k++;
            b[k].off = off;
            end = off + n;
            b[k].ready = 0;
        }
        b[k].off = off;
        b[k].n = end - off;
        if (ps[i].ready > b[k].ready) b[k].ready = ps[i].ready;
    }
    d->nb = k + 1;
    qsort(b, (size_t)d->nb, sizeof *b, cmp_bucket);
    d->b = b;
    return MR_OK;
}

static ddp_mode pick_mode(const mr_ddp_cfg *c) {
    if (!c->comm) return DDP_SINGLE;
    if (c->no_exchange) return DDP_NONE;
    if (c->shard) return DDP_SHARD;
    const int host = c->dev.kind == MR_DEVICE_CPU && (!c->gcomm || c->gcomm == c->comm);
    if (c->overlap && host && mr_comm_backend_of(c->comm) != MR_COMM_HIER) return DDP_OVERLAP;
    /* device memory moved by NCCL: the buckets go on the communicator's stream */
    if (c->overlap && c->dev.kind == MR_DEVICE_CUDA && c->gcomm && mr_comm_backend_of(c->gcomm) == MR_COMM_NCCL &&
        c->stream)
        return DDP_OVERLAP_DEV;
    return DDP_ALLREDUCE;
}

mr_status mr_ddp_new(const mr_ddp_cfg *c, mr_ddp **out) {
    mr_status st = MR_OK;
    *out = NULL;
    mr_ddp *d = calloc(1, sizeof *d);
    MR_CHECK(d, MR_ERR_NOMEM, "ddp: out of memory");
    MR_CHECK(c->n >= 0 && (c->grads || c->n == 0), MR_ERR_INVALID, "ddp: no gradient buffer");
    d->mode = pick_mode(c);
    d->comm = c->comm;
    d->gcomm = c->gcomm ? c->gcomm : c->comm;
    d->dev = c->dev;
    d->stream = c->stream;
    d->grads = c->grads;
    d->n = c->n;
    d->world = c->comm ? mr_comm_size(c->comm) : 1;
    d->rank = c->comm ? mr_comm_rank(c->comm) : 0;
    MR_TRY(mr_backend_get(c->dev.kind, &d->be));
    if (d->mode == DDP_OVERLAP || d->mode == DDP_OVERLAP_DEV)
        MR_TRY(make_buckets(d, c->params, c->n_params, (c->bucket_bytes > 0 ? c->bucket_bytes : 16.0 * 1048576.0)));
    if (d->mode == DDP_OVERLAP) MR_TRY(mr_comm_queue_new(c->comm, &d->q));
    if (d->mode == DDP_OVERLAP_DEV) {
        MR_TRY(d->be->event_new(c->dev.index, &d->ev_ready));
        MR_TRY(d->be->event_new(c->dev.index, &d->ev_done));
    }
    if (d->mode == DDP_SHARD) {
        d->sh = mr_ddp_shard_of(c->n, d->world, d->rank);
        MR_CHECK(d->sh.len > 0, MR_ERR_INVALID,
                 "distribute.shard_optimizer: %lld parameters do not shard over %d replicas", (long long)c->n, d->world);
        d->zbuf = calloc((size_t)(d->sh.stride * d->world), sizeof(float));
        d->zshard = calloc((size_t)d->sh.stride, sizeof(float));
        MR_CHECK(d->zbuf && d->zshard, MR_ERR_NOMEM, "ddp: out of memory for the optimizer shard");
        if (c->dev.kind == MR_DEVICE_CUDA) { /* zeroed: the padding past n stays zero */
            const size_t zb = sizeof(float) * (size_t)(d->sh.stride * d->world), sb = sizeof(float) * (size_t)d->sh.stride;
            MR_TRY(d->be->alloc(c->dev.index, zb, (void **)&d->d_zbuf));
            MR_TRY(d->be->alloc(c->dev.index, sb, (void **)&d->d_zshard));
            MR_TRY(d->be->memset_zero(c->dev.index, d->d_zbuf, zb, d->stream));
            MR_TRY(d->be->memset_zero(c->dev.index, d->d_zshard, sb, d->stream));
            MR_TRY(d->be->event_new(c->dev.index, &d->ev_ready));
            MR_TRY(d->be->stream_sync(d->stream));
        }
    }
    *out = d;
    return MR_OK;
fail:
    mr_ddp_free(d);
    return st;
}

void mr_ddp_free(mr_ddp *d) {
    if (!d) return;
    mr_comm_queue_free(d->q);
    if (d->ev_ready) d->be->event_free(d->ev_ready);
    if (d->ev_done) d->be->event_free(d->ev_done);
    if (d->ev_wait) d->be->event_free(d->ev_wait);
    free(d->b);
    free(d->zbuf);
    free(d->zshard);
    if (d->d_zbuf) d->be->free(d->dev.index, d->d_zbuf);
    if (d->d_zshard) d->be->free(d->dev.index, d->d_zshard);
    free(d);
}


/* Bucket b's all-reduce on the device, behind the kernels enqueued so far on the compute stream
 * (the event orders it; the host does not wait): the same NCCL call, count and operation per
 * element as the whole buffer's in mr_ddp_finish, so the same bits. */
static mr_status bucket_dev(mr_ddp *d, const bucket *b) {
    mr_status st = MR_OK;
    MR_TRY(d->be->event_record(d->ev_ready, d->stream));
    MR_TRY(mr_comm_nccl_wait_event(d->gcomm, d->ev_ready));
    MR_TRY(mr_comm_nccl_allreduce_async(d->gcomm, d->grads + b->off, b->n, MR_F32, MR_REDUCE_AVG));
fail:
    return st;
}

mr_status mr_ddp_backward(mr_ddp *d, mr_ddp_run_fn run, void *ctx, int32_t first, int32_t last) {
    mr_status st = MR_OK;
    int32_t at = first;
    const int overlap = d->mode == DDP_OVERLAP || d->mode == DDP_OVERLAP_DEV;
    for (int k = 0; overlap && k < d->nb; k++) {
        bucket *b = &d->b[k];
        if (b->ready > at) {
            MR_TRY(run(ctx, at, b->ready < last ? b->ready : last));
            at = b->ready < last ? b->ready : last;
        }
        mr_trace_instant(d->trace, "bucket_ready", "bucket", k);
        if (d->mode == DDP_OVERLAP_DEV) MR_TRY(bucket_dev(d, b));
        else MR_TRY(mr_comm_queue_allreduce(d->q, d->grads + b->off, b->n, MR_F32, MR_REDUCE_AVG, &b->ticket));
    }
    if (at < last) MR_TRY(run(ctx, at, last));
fail:
    return st;
}

mr_status mr_ddp_finish(mr_ddp *d, float *g, double *agree, int n_agree, mr_ddp_part *upd) {
    mr_status st = MR_OK;
    *upd = (mr_ddp_part){g, 0, d->n};
    switch (d->mode) {
    case DDP_SINGLE:
        break;
    case DDP_OVERLAP: /* what the backward did not hide */
        MR_CHECK(g == d->grads, MR_ERR_INTERNAL, "ddp: the overlapped exchange averages the gradient buffer itself");
        const int64_t t0 = mr_trace_begin(d->trace);
        for (int k = 0; k < d->nb; k++) MR_TRY(mr_comm_queue_wait(d->q, d->b[k].ticket));
        mr_trace_end1(d->trace, t0, "wait_buckets", "buckets", d->nb);
        MR_TRY(mr_comm_allreduce(d->comm, agree, n_agree, MR_F64, MR_REDUCE_SUM));
        break;
    case DDP_OVERLAP_DEV: /* the compute stream waits for the buckets; the host does not */
        MR_CHECK(g == d->grads, MR_ERR_INTERNAL, "ddp: the overlapped exchange averages the gradient buffer itself");
        MR_TRY(mr_comm_nccl_record_event(d->gcomm, d->ev_done));
        MR_TRY(d->be->stream_wait_event(d->stream, d->ev_done));
        MR_TRY(mr_comm_allreduce(d->comm, agree, n_agree, MR_F64, MR_REDUCE_SUM));
        break;
    default:
        /* the gradient collectives run on their own stream (NCCL): the accumulation and anything
         * else that wrote g must be done, and no replica may launch NCCL's spinning kernels while
         * another still allocates; the host agreement is the barrier */
        if (d->d_zbuf) /* ZeRO-1 on a GPU: the padding past n stays zero */
            MR_TRY(d->be->copy(d->dev.index, d->d_zbuf, g, sizeof(float) * (size_t)d->n, MR_COPY_D2D, d->stream));
        /* with NCCL the stream may wait for the previous step's device-side sums
         * (train/train_step.c ctl_allreduce), which a peer that died or hangs never joins: the
         * wait has the communicator's deadline */
        MR_TRY(mr_comm_stream_wait(d->gcomm, d->be, d->dev.index, d->stream, &d->ev_wait, "the step's gradients"));
        MR_TRY(mr_comm_allreduce(d->comm, agree, n_agree, MR_F64, MR_REDUCE_SUM));
        if (d->mode == DDP_ALLREDUCE) {
            MR_TRY(mr_comm_allreduce(d->gcomm, g, d->n, MR_F32, MR_REDUCE_AVG));
        } else if (d->mode == DDP_SHARD && d->d_zbuf) { /* the same collective on the device */
            MR_TRY(mr_comm_reduce_scatter(d->gcomm, d->d_zbuf, d->d_zshard, d->sh.stride, MR_F32, MR_REDUCE_AVG));
            *upd = (mr_ddp_part){d->d_zshard, d->sh.off, d->sh.len};
        } else if (d->mode == DDP_SHARD) {
            memcpy(d->zbuf, g, sizeof(float) * (size_t)d->n); /* the padding past n stays zero */
            MR_TRY(mr_comm_reduce_scatter(d->comm, d->zbuf, d->zshard, d->sh.stride, MR_F32, MR_REDUCE_AVG));
            *upd = (mr_ddp_part){d->zshard, d->sh.off, d->sh.len};
        }
        break;
    }
fail:
    return st;
}

mr_status mr_ddp_all(mr_ddp *d, int *flag) {
    if (d->mode != DDP_SHARD) return MR_OK;
    int64_t bad = !*flag;
    mr_status st = mr_comm_allreduce(d->comm, &bad, 1, MR_I64, MR_REDUCE_SUM);
    *flag = bad == 0;
    return st;
}

mr_status mr_ddp_sumsq(mr_ddp *d, double *sumsq) {
    if (d->mode != DDP_SHARD) return MR_OK;
    return mr_comm_allreduce(d->comm, sumsq, 1, MR_F64, MR_REDUCE_SUM);
}

mr_status mr_ddp_sum_counts(mr_ddp *d, int64_t *counts, int64_t n) {
    if (d->mode != DDP_SHARD) return MR_OK;
    return mr_comm_allreduce(d->comm, counts, n, MR_I64, MR_REDUCE_SUM);
}

mr_status mr_ddp_gather_shards(mr_ddp *d, const float *shard, float *full) {
    MR_ASSERT(d->mode == DDP_SHARD);
    float *mine = d->zbuf + d->sh.off;
    memmove(mine, shard, sizeof(float) * (size_t)d->sh.len);
    memset(mine + d->sh.len, 0, sizeof(float) * (size_t)(d->sh.stride - d->sh.len));
    mr_status st = mr_comm_allgather(d->comm, mine, d->zbuf, d->sh.stride, MR_F32);
    if (st == MR_OK) memcpy(full, d->zbuf, sizeof(float) * (size_t)d->n);
    return st;
}

/* mr_ddp_gather on a GPU: the shard into its place in the device exchange buffer (compute
 * stream), NCCL's all-gather in place after it (an event orders it; the call returns when it
 * completed), the whole buffer back into params. */
static mr_status gather_dev(mr_ddp *d, float *params) {
    mr_status st = MR_OK;
    float *mine = d->d_zbuf + d->sh.off;
    MR_TRY(d->be->copy(d->dev.index, mine, params + d->sh.off, sizeof(float) * (size_t)d->sh.len, MR_COPY_D2D,
                       d->stream));
    if (d->sh.stride > d->sh.len)
        MR_TRY(d->be->memset_zero(d->dev.index, mine + d->sh.len, sizeof(float) * (size_t)(d->sh.stride - d->sh.len),
                                  d->stream));
    MR_TRY(d->be->event_record(d->ev_ready, d->stream));
    MR_TRY(mr_comm_nccl_wait_event(d->gcomm, d->ev_ready));
    MR_TRY(mr_comm_allgather(d->gcomm, mine, d->d_zbuf, d->sh.stride, MR_F32));
    MR_TRY(d->be->copy(d->dev.index, params, d->d_zbuf, sizeof(float) * (size_t)d->n, MR_COPY_D2D, d->stream));
fail:
    return st;
}

mr_status mr_ddp_gather(mr_ddp *d, float *params) {
    if (d->mode != DDP_SHARD) return MR_OK;
    if (d->d_zbuf) return gather_dev(d, params);
    return mr_ddp_gather_shards(d, params + d->sh.off, params);
}

void mr_ddp_set_trace(mr_ddp *d, mr_trace_track *caller, mr_trace_track *comm_thread) {
    if (!d) return;
    d->trace = caller;
    mr_comm_queue_set_trace(d->q, comm_thread, caller);
}

int mr_ddp_num_buckets(const mr_ddp *d) { return d ? d->nb : 0; }

int mr_ddp_overlaps_on_device(const mr_ddp *d) { return d && d->mode == DDP_OVERLAP_DEV; }

double mr_ddp_busy_seconds(const mr_ddp *d) { return d && d->q ? mr_comm_queue_busy_seconds(d->q) : 0.0; }

int mr_ddp_overlaps(const mr_ddp *d) { return d && d->mode == DDP_OVERLAP; }
