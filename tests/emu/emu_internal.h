/* Private to tests/emu/: what the emulated CUDA runtime (emu_runtime.cc) offers the emulated
 * libraries (emu_cublas.cc, emu_cudnn.cc, emu_nccl.cc) and the kernel executor (emu_exec.cc).
 *
 * Device memory is host memory: a device pointer handed out by the emulated cudaMalloc is a
 * plain host pointer (malloc'd with the exact size, filled with 0xFF bytes so that a read of
 * what nobody wrote shows up as NaN or -1, and followed by a canary checked after every piece of
 * device work). Work on a stream is deferred, as on a GPU: it runs only when the host
 * synchronizes with it (stream/event/device sync, a blocking copy, a copy to or from pageable
 * memory, cudaFree), so a host that reads a result before synchronizing reads stale bytes. */
#ifndef MR_EMU_INTERNAL_H
#define MR_EMU_INTERNAL_H

#include <cuda_runtime_api.h>
#include <library_types.h>

#include <functional>
#include <stddef.h>
#include <stdint.h>

namespace mr_emu {

/* Appends `fn` to stream `s` (NULL or cudaStreamLegacy: the legacy default stream of the current
 * device; cudaStreamPerThread is not supported). It runs in stream order when the host next
 * synchronizes with that point of the stream, on the synchronizing host thread, with the
 * emulator's lock held (fn must not call the emulated runtime). While `s` is being captured the
 * work is recorded into the graph instead and runs on each cudaGraphLaunch. `what` names the
 * work in error messages ("cublasLtMatmul", "ncclAllReduce"). Returns cudaSuccess or the error
 * the runtime would give (a bad stream, a stream of another device than the current one). */
cudaError_t enqueue(cudaStream_t s, const char *what, std::function<void()> fn);

/* True when [p, p + bytes) lies inside one live device allocation (not freed, not pinned host
 * memory); *device (if non-NULL) gets its device. bytes == 0 checks p alone. */
bool device_range(const void *p, size_t bytes, int *device);

/* The device the calling host thread has made current (cudaSetDevice; 0 by default). */
int current_device(void);

/* The device a stream belongs to (NULL/legacy: the current device); -1 for an unknown stream. */
int stream_device(cudaStream_t s);

/* Reports a misuse the emulator detected (an argument rule of a library, a kernel's barrier or
 * shuffle misuse, a corrupted canary) on stderr as "mirror-emu: <lib>: <message>" and aborts
 * the process: a test cannot pass over it. */
[[noreturn]] void fatal(const char *lib, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Element i of a buffer of CUDA data type t (f32, f64, f16, bf16) as a double, and a double stored
 * rounded once to t (emu_values.cc; other types are reported). value_size is 0 for other types. */
size_t value_size(cudaDataType t);
double load_value(const void *p, int64_t i, cudaDataType t);
void store_value(void *p, int64_t i, cudaDataType t, double v);

/* Keeps a destroyed library object (marked dead, not freed, so a later use is reported instead of
 * being undefined) reachable for LeakSanitizer. Thread-safe. */
void keep_dead(void *p);

/* Counters that tests read through mr_emu_stats (emu_api.h). */
void count_library_call(void);

} // namespace mr_emu

#endif
