/* Device selection and the backend registry. The CUDA probe runs once per process; a CUDA build
 * without a GPU falls back to the CPU and says so once. */
#include "core/backend_impl.h"
#include "core/log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static int g_cuda_count = 0;
static char g_cuda_why[512] = "mirror was built without CUDA (-DMIRROR_CUDA=OFF or nvcc not found)";

static void probe(void) {
#ifdef MIRROR_HAVE_CUDA
    mr_cuda_probe(&g_cuda_count, g_cuda_why, (int)sizeof g_cuda_why);
    /* without a driver the runtime says "CUDA driver version is insufficient for CUDA runtime
     * version", which reads as a driver that is too old: say what is the case */
    if (g_cuda_count == 0 && strstr(g_cuda_why, "driver") && access("/proc/driver/nvidia/version", F_OK) != 0)
        snprintf(g_cuda_why, sizeof g_cuda_why, "no NVIDIA driver is loaded (no /proc/driver/nvidia/version)");
#endif
}

int mr_cuda_compiled(void) {
#ifdef MIRROR_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int mr_cuda_device_count(void) {
    pthread_once(&g_probe_once, probe);
    return g_cuda_count;
}

const char *mr_cuda_unusable_reason(void) { return mr_cuda_device_count() > 0 ? "" : g_cuda_why; }

mr_status mr_backend_get(mr_device_kind kind, const mr_backend **out) {
    *out = NULL;
    if (kind == MR_DEVICE_CPU) {
        *out = mr_cpu_backend();
        return MR_OK;
    }
    if (kind == MR_DEVICE_CUDA) {
        if (mr_cuda_device_count() <= 0)
            return mr_set_error(MR_ERR_NOT_FOUND, "no usable CUDA device: %s", g_cuda_why);
#ifdef MIRROR_HAVE_CUDA
        *out = mr_cuda_backend();
        return MR_OK;
#endif
    }
    return mr_set_error(MR_ERR_INVALID, "invalid device kind %d", (int)kind);
}

static pthread_once_t g_fallback_once = PTHREAD_ONCE_INIT;
static void say_fallback(void) {
    mr_log_info("no usable GPU (%s); running on the CPU", g_cuda_why);
}

mr_device mr_device_cpu(void) {
    mr_device d = {MR_DEVICE_CPU, 0};
    return d;
}

mr_device mr_device_default(void) {
    if (mr_cuda_device_count() > 0) {
        mr_device d = {MR_DEVICE_CUDA, 0};
        return d;
    }
    if (mr_cuda_compiled()) pthread_once(&g_fallback_once, say_fallback);
    return mr_device_cpu();
}

char *mr_device_str(mr_device d, char *buf, int cap) {
    if (d.kind == MR_DEVICE_CPU) snprintf(buf, (size_t)cap, "cpu");
    else snprintf(buf, (size_t)cap, "cuda:%d", d.index);
    return buf;
}

mr_status mr_device_parse(const char *s, mr_device *out) {
    const char *rest = NULL;
    mr_device d = {MR_DEVICE_CPU, 0};
    if (!strncmp(s, "cpu", 3)) {
        rest = s + 3;
    } else if (!strncmp(s, "cuda", 4)) {
        d.kind = MR_DEVICE_CUDA;
        rest = s + 4;
    } else {
        return mr_set_error(MR_ERR_INVALID, "bad device '%s' (expected cpu, cuda or cuda:N)", s);
    }
    if (*rest == ':') {
        char *end = NULL;
        long v = strtol(rest + 1, &end, 10);
        if (end == rest + 1 || *end != '\0' || v < 0 || v > 1023)
            return mr_set_error(MR_ERR_INVALID, "bad device index in '%s' (expected cpu, cuda or cuda:N)", s);
        d.index = (int)v;
    } else if (*rest != '\0') {
        return mr_set_error(MR_ERR_INVALID, "bad device '%s' (expected cpu, cuda or cuda:N)", s);
    }
    if (d.kind == MR_DEVICE_CPU && d.index != 0)
        return mr_set_error(MR_ERR_INVALID, "bad device '%s': the CPU is device cpu:0", s);
    *out = d;
    return MR_OK;
}

/* ---- memory counters ------------------------------------------------------------------------- */

/* MR_OK when d names a usable device. */
static mr_status check_device(mr_device d) {
    char buf[32];
    if (d.kind == MR_DEVICE_CPU && d.index == 0) return MR_OK;
    if (d.kind == MR_DEVICE_CUDA && d.index >= 0 && d.index < mr_cuda_device_count()) return MR_OK;
    if (d.kind == MR_DEVICE_CUDA && mr_cuda_device_count() <= 0)
        return mr_set_error(MR_ERR_NOT_FOUND, "no usable CUDA device: %s", g_cuda_why);
    return mr_set_error(MR_ERR_NOT_FOUND, "no device %s (%d GPUs usable)", mr_device_str(d, buf, (int)sizeof buf),
                        mr_cuda_device_count());
}

mr_status mr_device_memory_stats(mr_device d, mr_memory_stats *out) {
    memset(out, 0, sizeof *out);
    mr_status st = check_device(d);
    if (st != MR_OK) return st;
    if (d.kind == MR_DEVICE_CPU) {
        mr_cpu_memory_stats(out);
        return MR_OK;
    }
#ifdef MIRROR_HAVE_CUDA
    return mr_cuda_memory_stats(d.index, out);
#else
    return mr_set_error(MR_ERR_INTERNAL, "unreachable: a CUDA device in a build without CUDA");
#endif
}

mr_status mr_device_memory_reset_peak(mr_device d) {
    mr_status st = check_device(d);
    if (st != MR_OK) return st;
    if (d.kind == MR_DEVICE_CPU) {
        mr_cpu_memory_reset_peak();
        return MR_OK;
    }
#ifdef MIRROR_HAVE_CUDA
    return mr_cuda_memory_reset_peak(d.index);
#else
    return mr_set_error(MR_ERR_INTERNAL, "unreachable: a CUDA device in a build without CUDA");
#endif
}

mr_status mr_device_memory_release_cached(mr_device d) {
    mr_status st = check_device(d);
    if (st != MR_OK || d.kind == MR_DEVICE_CPU) return st;
#ifdef MIRROR_HAVE_CUDA
    return mr_cuda_memory_release_cached(d.index);
#else
    return mr_set_error(MR_ERR_INTERNAL, "unreachable: a CUDA device in a build without CUDA");
#endif
}
