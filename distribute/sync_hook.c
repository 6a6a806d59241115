/* The summing hook of synchronised batch norm (see sync_hook.h). */
#include "distribute/sync_hook.h"
#include "core/dtype.h"

#include <string.h>

static mr_status sum_over_ranks(void *ctx, const void *x, void *y, int64_t numel, mr_dtype dt, mr_stream *stream,
                                int device) {
    (void)stream, (void)device;
    mr_comm *c = ctx;
    memcpy(y, x, (size_t)numel * mr_dtype_size(dt));
    return mr_comm_allreduce(c, y, numel, dt, MR_REDUCE_SUM);
}

mr_status mr_sync_hook_init(mr_sync_hook *h, mr_comm *comm) {
    memset(h, 0, sizeof *h);
    if (!comm) return mr_set_error(MR_ERR_INVALID, "sync batch norm: no communicator");
    if (mr_comm_backend_of(comm) == MR_COMM_NCCL)
        return mr_set_error(MR_ERR_UNSUPPORTED, "batchnorm sync: not on GPU replicas yet; HINT: sync: false (each GPU "
                                                "normalises its own micro-batch), or CPU replicas");
    h->comm = comm;
    h->hook.fn = sum_over_ranks;
    h->hook.ctx = comm;
    h->hook.replicas = mr_comm_size(comm);
    return MR_OK;
}
