/* Which GPUs a CUDA build can run (core/device.h, cmake/mirror_cuda_archs.cmake). Plain C with no
 * CUDA header, so the rule is unit-tested in every build (tests/unit/test_cuda_arch.c).
 *
 * The rule is the CUDA runtime's: a cubin (SASS) for sm_XY loads on a GPU of compute capability
 * X.Z with the same major X and Z >= Y (sm_80 code runs on an sm_86 or sm_89 GPU, never on sm_90);
 * PTX for compute_XY is compiled by the GPU driver at load time for any GPU of capability >= XY
 * (slow on first start, then cached). A GPU that neither covers fails every kernel launch with
 * "no kernel image is available for execution on the device", which is why the device probe
 * refuses it up front. */
#include "core/device.h"

#include <stdio.h>
#include <stdlib.h>

/* Next number of a "80,86,90" list into *v; returns the rest, or NULL at the end. */
static const char *next_arch(const char *s, int *v) {
    while (s && *s == ',') s++;
    if (!s || !*s) return NULL;
    char *end = NULL;
    long n = strtol(s, &end, 10);
    if (end == s) return NULL; /* not a number: a malformed list covers nothing */
    *v = (int)n;
    return end;
}

mr_cuda_cover mr_cuda_arch_cover(const char *sass, const char *ptx, int cc, int *arch) {
    int best = -1, v = 0;
    /* the newest SASS of the same major that the GPU's minor reaches */
    for (const char *s = next_arch(sass, &v); s; s = next_arch(s, &v))
        if (v / 10 == cc / 10 && v <= cc && v > best) best = v;
    if (best >= 0) {
        if (arch) *arch = best;
        return MR_CUDA_COVER_SASS;
    }
    for (const char *s = next_arch(ptx, &v); s; s = next_arch(s, &v))
        if (v <= cc && v > best) best = v;
    if (best >= 0) {
        if (arch) *arch = best;
        return MR_CUDA_COVER_PTX;
    }
    if (arch) *arch = -1;
    return MR_CUDA_COVER_NONE;
}

const char *mr_cuda_build_sass(void) {
#ifdef MIRROR_CUDA_SASS
    return MIRROR_CUDA_SASS;
#else
    return "";
#endif
}

const char *mr_cuda_build_ptx(void) {
#ifdef MIRROR_CUDA_PTX
    return MIRROR_CUDA_PTX;
#else
    return "";
#endif
}

int mr_cuda_arch_refusal(char *why, int cap, int gpu, const char *name, int cc, const char *sass, const char *ptx) {
    if (mr_cuda_arch_cover(sass, ptx, cc, NULL) != MR_CUDA_COVER_NONE) return 0;
    char fix[96];
    if (cc < 80) snprintf(fix, sizeof fix, "GPUs before sm_80 are not supported (the bf16 kernels need it)");
    else snprintf(fix, sizeof fix, "rebuild with -DMIRROR_CUDA_ARCHS=native or add %d to the list", cc);
    snprintf(why, (size_t)cap, "GPU %d (%s) has compute capability %d.%d but this build has code for sm_%s (SASS) and "
             "compute_%s (PTX) only; %s", gpu, name, cc / 10, cc % 10, sass && *sass ? sass : "-",
             ptx && *ptx ? ptx : "-", fix);
    return 1;
}
