/* emu.test_emu_arch: a GPU the build has no code for is refused up front (core/cuda/backend_cuda.cu's
 * probe, core/cuda_arch.c), not at its first kernel launch; mirror doctor says which code each GPU
 * runs. The emulated GPUs report the compute capability MR_EMU_CC asks for (tests/emu/emu_runtime.cc):
 * 90 (an H100: SASS), 120 (an RTX 5090: the PTX of the newest architecture), 75 (a T4: nothing, and
 * the reason names the capability, the build's lists and the CMake option to fix it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend_impl.h"
#include "core/device.h"

static int failures = 0;

#define CHECK(cond, ...)                                                                                             \
    do {                                                                                                             \
        if (!(cond)) {                                                                                               \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                     \
            fprintf(stderr, __VA_ARGS__);                                                                            \
            fprintf(stderr, "\n");                                                                                   \
            failures++;                                                                                              \
        }                                                                                                            \
    } while (0)

/* mr_cuda_doctor_report's text for the current MR_EMU_CC */
static void doctor_text(char *buf, size_t cap) {
    FILE *f = tmpfile();
    buf[0] = 0;
    if (!f) return;
    (void)mr_cuda_doctor_report(f);
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

static void probe_as(const char *cc, int *count, char *why, int cap) {
    setenv("MR_EMU_CC", cc, 1);
    why[0] = 0;
    mr_cuda_probe(count, why, cap);
}

int main(void) {
    char why[512], doc[8192];
    int n = -1;
    CHECK(strlen(mr_cuda_build_sass()) > 0, "the emulated build has no SASS list");

    probe_as("90", &n, why, sizeof why);
    CHECK(n == 2, "cc 9.0: %d usable GPUs (%s), expected the 2 emulated ones", n, why);
    doctor_text(doc, sizeof doc);
    CHECK(strstr(doc, "compute capability 9.0") && strstr(doc, "kernels: SASS sm_90"), "doctor at 9.0 said:\n%s", doc);

    probe_as("120", &n, why, sizeof why);
    CHECK(n == 2, "cc 12.0: %d usable GPUs (%s): the newest architecture's PTX runs it", n, why);
    doctor_text(doc, sizeof doc);
    CHECK(strstr(doc, "kernels: PTX compute_"), "doctor at 12.0 said:\n%s", doc);

    probe_as("75", &n, why, sizeof why);
    CHECK(n == 0, "cc 7.5: %d usable GPUs, expected 0", n);
    CHECK(strstr(why, "GPU 0") && strstr(why, "compute capability 7.5") && strstr(why, mr_cuda_build_sass()) &&
              strstr(why, "before sm_80 are not supported"),
          "cc 7.5: the reason does not name the GPU, its capability, the build's list and the floor: '%s'", why);
    doctor_text(doc, sizeof doc);
    CHECK(strstr(doc, "kernels: NONE in this build") && strstr(doc, "HINT: "), "doctor at 7.5 said:\n%s", doc);

    /* the process-wide probe (cached at first use) falls back to the CPU with that reason */
    CHECK(mr_cuda_device_count() == 0, "mr_cuda_device_count() = %d at cc 7.5", mr_cuda_device_count());
    CHECK(strstr(mr_cuda_unusable_reason(), "compute capability 7.5"), "unusable reason: '%s'",
          mr_cuda_unusable_reason());
    CHECK(mr_device_default().kind == MR_DEVICE_CPU, "the default device is not the CPU at cc 7.5");

    if (failures) fprintf(stderr, "test_emu_arch: %d failures\n", failures);
    else printf("test_emu_arch: all checks passed\n");
    return failures ? 1 : 0;
}
