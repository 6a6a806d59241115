/* Private: how device.c finds the backend tables and their memory counters, and the CUDA part of
 * `mirror doctor`. Includes no CUDA header (launch/ uses it). */
#ifndef MR_BACKEND_IMPL_H
#define MR_BACKEND_IMPL_H

#include <stdio.h>
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

/* Memory counters behind mr_device_memory_stats and friends (core/device.c checks the device).
 * CPU: core/cpu/backend_cpu.c. CUDA: the per-device caching allocator in core/cuda/backend_cuda.cu
 * (zeros / no-ops before the device's first allocation). Thread-safe. */
void mr_cpu_memory_stats(mr_memory_stats *out);
void mr_cpu_memory_reset_peak(void);
mr_status mr_cuda_memory_stats(int device, mr_memory_stats *out);
mr_status mr_cuda_memory_reset_peak(int device);
mr_status mr_cuda_memory_release_cached(int device);

/* `mirror doctor`'s CUDA lines (core/cuda/doctor_cuda.cu): driver, runtime, cuBLAS, cuDNN and NCCL
 * versions and every GPU (name, compute capability, memory), written to f. Returns the number of
 * usable GPUs (0 with a line saying why). Only in CUDA builds (MIRROR_HAVE_CUDA). */
int mr_cuda_doctor_report(FILE *f);

#ifdef __cplusplus
}
#endif
#endif
