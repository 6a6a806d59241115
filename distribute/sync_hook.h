/* A hook (core/ops.h mr_hook) that sums a buffer over the ranks of a communicator: how
 * synchronised batch norm (autodiff/nn.h mr_nn_batchnorm with nn->sync) gets the statistics of the
 * global batch inside a replica's forward and backward. Host memory only (CPU replicas, in threads
 * or MPI ranks); the trainer refuses sync batch norm on GPU replicas (see docs/DESIGN.md "Models").
 * Every replica runs the same plan, so the hooks' collectives come in the same order everywhere;
 * they go straight to the communicator, not through the gradient queue (which has its own
 * duplicate, distribute/comm.h mr_comm_queue_new), so the two never interleave. */
#ifndef MR_SYNC_HOOK_H
#define MR_SYNC_HOOK_H

#include "core/ops.h"
#include "distribute/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_sync_hook {
    mr_hook hook; /* pass &h.hook to mr_steps_set_sync / nn->sync */
    mr_comm *comm; /* borrowed */
} mr_sync_hook;

/* Points h at comm (borrowed; must outlive the plans using the hook): y = the sum over comm's
 * ranks of x, every rank getting bit-identical results; replicas = comm's size. MR_ERR_INVALID for
 * a NULL comm, MR_ERR_UNSUPPORTED for an NCCL communicator (device memory). */
mr_status mr_sync_hook_init(mr_sync_hook *h, mr_comm *comm) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
