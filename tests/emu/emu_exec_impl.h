/* Private to tests/emu/: the kernel executor's interface to the emulated runtime. */
#ifndef MR_EMU_EXEC_IMPL_H
#define MR_EMU_EXEC_IMPL_H

#include <cuda_runtime_api.h>

#include <functional>
#include <stdint.h>

namespace mr_emu {

enum schedule { SCHED_FORWARD, SCHED_REVERSE, SCHED_RANDOM };

/* One launch: the geometry, the per-thread body, where it was launched, and its schedule. */
struct grid_job {
    dim3 grid, block;
    size_t smem;
    std::function<void()> body;
    const char *file;
    int line;
    schedule sched;
    uint64_t seed;
};

/* MR_EMU_SCHEDULE as a schedule (reports a bad value). */
schedule schedule_from_env(void);

/* Runs every block of the grid on the calling host thread. */
void run_grid(const grid_job &j);

} // namespace mr_emu

#endif
