/* What a test can ask the CUDA emulator (tests/emu/): counters of the work it saw. Only in the
 * emulated build (MIRROR_EMU defined); the same test sources build for a real GPU without it. */
#ifndef MR_EMU_API_H
#define MR_EMU_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_emu_stats {
    uint64_t raw_allocs;     /* cudaMalloc calls that succeeded */
    uint64_t raw_frees;      /* cudaFree calls */
    uint64_t host_allocs;    /* cudaHostAlloc calls */
    uint64_t host_syncs;     /* host waits: stream/event/device sync, blocking or pageable copies, cudaFree */
    uint64_t launches;       /* kernel launches queued (graph replays not included) */
    uint64_t graph_launches; /* cudaGraphLaunch calls */
    uint64_t captured_items; /* pieces of work recorded into graphs */
    uint64_t library_calls;  /* cuBLAS(Lt), cuDNN and NCCL calls that queued work */
    uint64_t bytes_in_use;   /* device bytes allocated now, all devices */
} mr_emu_stats;

/* A snapshot of the counters (thread-safe). */
void mr_emu_get_stats(mr_emu_stats *out);

/* The enqueue/execution log: while it is on, every piece of stream work queued (kernels, copies,
 * library calls, waits, event records; each item of a replayed graph) gets an entry when it is
 * queued, and its execution number when it runs, so a test can check the order work was issued
 * in against the order it ran in (the overlapped gradient buckets and input copies of
 * train/train_step.c). Off by default: it then costs one branch per item. Thread-safe. */
typedef struct mr_emu_log_entry {
    uint64_t stream; /* the stream's id (unique in the process, never reused) */
    int device;
    char what[56];   /* a kernel's launch site "softmax.cu:88", a library call "ncclAllReduce",
                      * a copy "cudaMemcpyHostToDevice", "wait", "cudaEventRecord" */
    /* one clock, 1-based since mr_emu_log_start, ticks at every queuing and every execution
     * over all streams: an item queued before another ran has the smaller enq than its exec */
    uint64_t enq;    /* when it was queued */
    uint64_t exec;   /* when it ran; 0: not run (yet) */
    uint64_t waits_for; /* "wait": the id of the stream it waits for (an event's, or the legacy
                         * stream's implicit order); 0 for the rest */
} mr_emu_log_entry;
/* Clears the log and starts recording. */
void mr_emu_log_start(void);
/* Stops recording (entries already made still get their execution numbers). */
void mr_emu_log_stop(void);
/* Copies up to cap entries, in queuing order, into out (NULL with cap 0: only counts); returns the
 * number of entries recorded. */
int64_t mr_emu_log_read(mr_emu_log_entry *out, int64_t cap);

/* 1: this process runs on the CUDA emulator. */
int mr_emu_active(void);

#ifdef __cplusplus
}
#endif

#endif
