/* What the library fakes (emu_blas.cc, emu_dnn.cc) share: element loads and stores by CUDA data
 * type (in double, rounded once to the stored type), and the list that keeps destroyed handles and
 * descriptors reachable. */
#define MR_EMU_RUNTIME 1
#include "tests/emu/emu_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <pthread.h>
#include <vector>

namespace mr_emu {

size_t value_size(cudaDataType t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_16F: case CUDA_R_16BF: return 2;
    default: return 0;
    }
}

double load_value(const void *p, int64_t i, cudaDataType t) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: fatal("values", "data type %d is not emulated", (int)t);
    }
}

void store_value(void *p, int64_t i, cudaDataType t, double v) {
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    case CUDA_R_64F: ((double *)p)[i] = v; break;
    /* straight from double: rounding through float first could round twice */
    case CUDA_R_16F: ((__half *)p)[i] = __double2half(v); break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __double2bfloat16(v); break;
    default: fatal("values", "data type %d is not emulated", (int)t);
    }
}

namespace {
std::vector<void *> *g_dead;
pthread_mutex_t g_dead_mu = PTHREAD_MUTEX_INITIALIZER;
} // namespace

void keep_dead(void *p) {
    pthread_mutex_lock(&g_dead_mu);
    if (!g_dead) g_dead = new std::vector<void *>();
    g_dead->push_back(p);
    pthread_mutex_unlock(&g_dead_mu);
}

} // namespace mr_emu
