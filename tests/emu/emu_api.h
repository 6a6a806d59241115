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

/* 1: this process runs on the CUDA emulator. */
int mr_emu_active(void);

#ifdef __cplusplus
}
#endif

#endif
