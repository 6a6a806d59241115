/* `mirror doctor`'s CUDA lines (core/backend_impl.h): the versions of the driver, the runtime,
 * cuBLAS, cuDNN and NCCL that this process actually loaded (which may differ from the headers it
 * was built with: both are printed where the library tells), and every visible GPU. Kept here so
 * that launch/ includes no CUDA header. Every call is read-only; errors become text on the line
 * they concern, since a diagnostic must say as much as it can rather than stop at the first
 * failure. */
#include "core/backend_impl.h"
#include "core/cuda/cuda_impl.h"

#if defined(MIRROR_HAVE_CUDNN)
#include <cudnn.h>
#endif
#if defined(MIRROR_HAVE_NCCL)
#include <nccl.h>
#endif

/* "13.0" from 13000 (the driver/runtime encoding: 1000*major + 10*minor). */
static void cuda_ver(char *buf, size_t cap, int v) { snprintf(buf, cap, "%d.%d", v / 1000, (v % 1000) / 10); }

extern "C" int mr_cuda_doctor_report(FILE *f) {
    char a[32], b[32];
    int drv = 0, rt = 0;
    cudaError_t e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || drv == 0) {
        fprintf(f, "cuda driver: none (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "no NVIDIA driver is installed");
        (void)cudaGetLastError();
    } else {
        cuda_ver(a, sizeof a, drv);
        fprintf(f, "cuda driver: %s (supports runtimes up to this version)\n", a);
    }
    e = cudaRuntimeGetVersion(&rt);
    cuda_ver(a, sizeof a, CUDART_VERSION);
    if (e == cudaSuccess) {
        cuda_ver(b, sizeof b, rt);
        fprintf(f, "cuda runtime: %s (built with %s)\n", b, a);
    } else {
        fprintf(f, "cuda runtime: unknown: %s (built with %s)\n", cudaGetErrorString(e), a);
        (void)cudaGetLastError();
    }
    fprintf(f, "cuda code: SASS sm_%s, PTX compute_%s (MIRROR_CUDA_ARCHS)\n", mr_cuda_build_sass(), mr_cuda_build_ptx());
    int major = 0, minor = 0, patch = 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        fprintf(f, "cublas: %d.%d.%d (built with %d.%d.%d)\n", major, minor, patch, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR,
                CUBLAS_VER_PATCH);
    else
        fprintf(f, "cublas: version unknown (cublasGetProperty failed)\n");
#if defined(MIRROR_HAVE_CUDNN)
    {
        /* cuDNN 9 encodes major*10000 + minor*100 + patch */
        size_t v = cudnnGetVersion();
        fprintf(f, "cudnn: %zu.%zu.%zu (built with %d.%d.%d)\n", v / 10000, (v % 10000) / 100, v % 100, CUDNN_MAJOR,
                CUDNN_MINOR, CUDNN_PATCHLEVEL);
    }
#else
    fprintf(f, "cudnn: not used by this build\n");
#endif
#if defined(MIRROR_HAVE_NCCL)
    {
        /* NCCL >= 2.9 encodes major*10000 + minor*100 + patch */
        int v = 0;
        if (ncclGetVersion(&v) == ncclSuccess)
            fprintf(f, "nccl: %d.%d.%d (built with %d.%d.%d)\n", v / 10000, (v % 10000) / 100, v % 100, NCCL_MAJOR,
                    NCCL_MINOR, NCCL_PATCH);
        else
            fprintf(f, "nccl: version unknown (ncclGetVersion failed)\n");
    }
#else
    fprintf(f, "nccl: not used by this build\n");
#endif
    int n = 0;
    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return 0;
    }
    int usable = 0;
    for (int i = 0; i < n; i++) {
        cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, i);
        if (e != cudaSuccess) {
            fprintf(f, "gpu %d: cannot read its properties: %s\n", i, cudaGetErrorString(e));
            (void)cudaGetLastError();
            continue;
        }
        size_t free_b = 0, total_b = 0;
        char mem[64] = "";
        /* cudaMemGetInfo creates the device's context: it also proves the device usable */
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
            snprintf(mem, sizeof mem, ", %.1f GiB free", (double)free_b / (1 << 30));
            usable++;
        } else {
            snprintf(mem, sizeof mem, ", unusable: %s", cudaGetErrorString(cudaGetLastError()));
        }
        /* which of this build's code the GPU runs (core/cuda_arch.c) */
        char kern[160];
        int arch = -1;
        switch (mr_cuda_arch_cover(mr_cuda_build_sass(), mr_cuda_build_ptx(), p.major * 10 + p.minor, &arch)) {
        case MR_CUDA_COVER_SASS: snprintf(kern, sizeof kern, "kernels: SASS sm_%d", arch); break;
        case MR_CUDA_COVER_PTX:
            snprintf(kern, sizeof kern, "kernels: PTX compute_%d (compiled by the driver at first start)", arch);
            break;
        default:
            snprintf(kern, sizeof kern, "kernels: NONE in this build (sm_%s); HINT: rebuild with -DMIRROR_CUDA_ARCHS=native",
                     mr_cuda_build_sass());
            break;
        }
        fprintf(f, "gpu %d: %s, compute capability %d.%d, %d SMs, %.1f GiB%s, %s\n", i, p.name, p.major, p.minor,
                p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30), mem, kern);
    }
    return usable;
}
