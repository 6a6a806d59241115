/* Private to tests/emu/: the emulated runtime's stream items and lock, shared by emu_runtime.cc
 * (streams, memory, launches), emu_cudart.cc (the cuda_runtime_api.h functions) and emu_nccl.cc
 * (collectives, which must drive several streams). */
#ifndef MR_EMU_RUNTIME_IMPL_H
#define MR_EMU_RUNTIME_IMPL_H

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <stdint.h>

namespace mr_emu {

/* One piece of stream work: a function to run, a wait for a point of another stream, or an
 * event's timestamp. `ready` (optional) says whether the item can start now; a collective is ready
 * when every rank has queued its part. */
struct item {
    enum kind_t { WORK, WAIT, TIME } kind = WORK;
    const char *what = "";
    uint64_t seq = 0;
    std::function<void()> fn;
    std::function<bool()> ready;
    CUstream_st *ws = nullptr;
    uint64_t wseq = 0;
    std::shared_ptr<double> t_slot; /* TIME: where the host time goes */
    /* optional, run before the item is taken (a collective brings the other ranks' streams to
     * their parts); false: it would block and nonblocking was asked */
    std::function<bool(bool nonblocking)> pre;
    /* the launch site of a kernel (the enqueue/execution log's name for it); NULL for the rest */
    const char *file = nullptr;
    int line = 0;
    uint64_t log_id = 0; /* its entry in the enqueue/execution log (0: not logged) */
};

/* The emulator's one lock. Public entry points take it; items run with it held. */
void lock(void);
void unlock(void);

/* Runs stream s up to and including its point `seq` on this thread (lock held). With nonblocking,
 * returns false instead of waiting when the next item is not ready. */
bool run_until(CUstream_st *s, uint64_t seq, bool nonblocking);

/* Waits (lock held; released while waiting) until pred() holds; reports after 120 s. */
void wait_until(const std::function<bool()> &pred, const char *what);

/* Queues an item on s (NULL: the legacy stream of the current device); *s_out and *seq_out (if
 * non-NULL) get the stream and the item's point (0 while capturing). */
cudaError_t enqueue_item(cudaStream_t s, item it, CUstream_st **s_out, uint64_t *seq_out);

/* True when [p, p + bytes) lies in pinned host memory from cudaHostAlloc (lock held). */
bool pinned_range(const void *p, size_t bytes);

void count_host_sync(void);
int device_count(void);

} // namespace mr_emu

#endif
