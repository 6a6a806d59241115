/* The clock offset between two ranks (comm.h mr_comm_clock_offset), measured with the
 * collectives every backend has: broadcasts from rank 0 and from the peer make a ping-pong. The
 * trace of a run (train/trace.c) uses it to put every rank's spans on rank 0's clock; the bound
 * it returns is the trace's stated alignment error. */
#include "distribute/comm.h"
#include "core/trace.h"

mr_status mr_comm_clock_offset(mr_comm *c, int peer, int rounds, int64_t *offset_ns, int64_t *error_ns) {
    mr_status st = MR_OK;
    *offset_ns = *error_ns = 0;
    MR_CHECK(c, MR_ERR_INVALID, "clock offset: communicator is NULL");
    const int rank = mr_comm_rank(c), size = mr_comm_size(c);
    MR_CHECK(peer > 0 && peer < size, MR_ERR_INVALID, "clock offset: peer %d is not a rank other than 0 of a group of %d",
             peer, size);
    MR_CHECK(rounds >= 1 && rounds <= 1000, MR_ERR_INVALID, "clock offset: %d rounds (1..1000)", rounds);
    int64_t best_rtt = INT64_MAX, best = 0;
    for (int i = 0; i < rounds; i++) {
        int64_t v = 0;
        MR_TRY(mr_comm_barrier(c)); /* both ends start the round together, neither asleep in a poll */
        const int64_t t0 = mr_trace_now_ns();
        MR_TRY(mr_comm_broadcast(c, &v, 1, MR_I64, 0));
        if (rank == peer) v = mr_trace_now_ns();
        MR_TRY(mr_comm_broadcast(c, &v, 1, MR_I64, peer));
        const int64_t t1 = mr_trace_now_ns();
        if (rank == 0 && t1 - t0 < best_rtt) {
            best_rtt = t1 - t0;
            best = v - (t0 + best_rtt / 2);
        }
    }
    if (rank == 0) {
        *offset_ns = best;
        *error_ns = (best_rtt + 1) / 2; /* the midpoint's distance from either end, rounded up */
    }
fail:
    return st;
}
