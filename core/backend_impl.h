/* Private: how device.c finds the backend tables. */
#ifndef MR_BACKEND_IMPL_H
#define MR_BACKEND_IMPL_H

#include "core/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU backend table (core/cpu/backend_cpu.c). */
const mr_backend *mr_cpu_backend(void);

/* The CUDA backend table (core/cuda/backend_cuda.cu), and the number of usable GPUs; on a
 * machine without a GPU or driver, *count is 0 and `why` says what the runtime reported. */
const mr_backend *mr_cuda_backend(void);
void mr_cuda_probe(int *count, char *why, int why_cap);

#ifdef __cplusplus
}
#endif
#endif
