/* The emulator's teeth: deliberately broken kernels, each of which the CUDA emulator must report.
 * Each case runs in a forked child; the parent requires the child to die (abort, or a sanitizer's
 * exit) with the expected phrase on stderr, or, for the bugs that show in the data (a missing
 * barrier, a read of unwritten shared memory), requires the poisoned value to come out. A case
 * that runs clean fails this test, so the emulator cannot lose a check silently. A correct
 * control kernel runs clean under every schedule.
 *
 * Built only for the emulator (tests/emu/emu.cmake rewrites it like core/cuda/*.cu). */
#include <cuda_runtime.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 64

/* ---- the control: a block reduction with barriers and shuffles done right ------------------- */
__global__ void good_sum(const float *x, float *out, int n) {
    __shared__ float sh[N / 32];
    int t = threadIdx.x;
    float v = t < n ? x[t] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((t & 31) == 0) sh[t / 32] = v;
    __syncthreads();
    if (t == 0) out[0] = sh[0] + sh[1];
}

/* 1. a missing __syncthreads: thread t reads what thread N-1-t wrote, with no barrier between */
__global__ void bug_missing_sync(float *out) {
    __shared__ float sh[N];
    int t = threadIdx.x;
    sh[t] = (float)t;
    /* __syncthreads() belongs here */
    out[t] = sh[N - 1 - t];
}

/* 2. an off-by-one bound: i <= n writes one element past the end */
__global__ void bug_off_by_one(float *y, int n) {
    for (int i = threadIdx.x; i <= n; i += blockDim.x) y[i] = 1.0f;
}

/* 3. a shuffle under a divergent branch: lanes 16..31 never reach it */
__global__ void bug_divergent_shuffle(float *out) {
    int t = threadIdx.x;
    float v = (float)t;
    if (t < 16) v += __shfl_down_sync(0xffffffffu, v, 1);
    out[t] = v;
}

/* 4. a wrong stride: rows of `cols` elements walked with the row count as the stride */
__global__ void bug_wrong_stride(float *y, int rows, int cols) {
    int r = blockIdx.x, c = threadIdx.x;
    if (c < cols) y[(long)c * rows + r * cols] = 2.0f; /* should be y[r * cols + c] */
}

/* 5. a read of shared memory no thread wrote: sh[N] is read, sh[0..N-1] written */
__global__ void bug_unwritten_shared(float *out) {
    __shared__ float sh[N + 1];
    int t = threadIdx.x;
    sh[t] = 1.0f;
    __syncthreads();
    if (t == 0) {
        float s = 0;
        for (int i = 0; i <= N; i++) s += sh[i];
        out[0] = s;
    }
}

/* 6. a barrier after an early return */
__global__ void bug_return_before_sync(float *out, int n) {
    int t = threadIdx.x;
    if (t >= n) return;
    __syncthreads();
    out[t] = 1.0f;
}

/* 7. two different barriers */
__global__ void bug_two_barriers(float *out) {
    int t = threadIdx.x;
    if (t < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[t] = 0.0f;
}

/* 8. a mask that leaves the calling lane out */
__global__ void bug_mask_without_self(float *out) {
    int t = threadIdx.x;
    out[t] = __shfl_sync(0x0000ffffu, (float)t, 0);
}

/* 9. two masks at one shuffle: lanes 0..15 first call it with 0x0000ffff, lanes 16..31 with the
 *    full mask (a pairing that depends on which lanes arrive first) */
__global__ void bug_mask_pairing(float *out) {
    int t = threadIdx.x;
    float v = (float)t;
    for (int i = 0; i < (t < 16 ? 2 : 1); i++) v += __shfl_sync(i == 0 && t < 16 ? 0x0000ffffu : 0xffffffffu, v, 0);
    out[t] = v;
}

/* ---- the harness ---------------------------------------------------------------------------- */

static float *dev(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        exit(3);
    }
    return (float *)p;
}

static void sync_or_die(void) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaDeviceSynchronize: %s\n", cudaGetErrorString(e));
        exit(3);
    }
}

static void case_missing_sync(void) {
    float *d = dev(N), h[N];
    bug_missing_sync<<<1, N>>>(d);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    for (int t = 0; t < N; t++)
        if (h[t] != (float)(N - 1 - t)) {
            fprintf(stderr, "poisoned: thread %d read %g before thread %d wrote it\n", t, h[t], N - 1 - t);
            exit(4);
        }
}

static void case_off_by_one(void) {
    float *d = dev(N);
    bug_off_by_one<<<1, 32>>>(d, N);
    sync_or_die();
}

static void case_divergent_shuffle(void) {
    float *d = dev(32);
    bug_divergent_shuffle<<<1, 32>>>(d);
    sync_or_die();
}

static void case_wrong_stride(void) {
    float *d = dev(4 * 16);
    bug_wrong_stride<<<4, 16>>>(d, 4, 16);
    sync_or_die();
}

static void case_unwritten_shared(void) {
    float *d = dev(1), h = 0;
    bug_unwritten_shared<<<1, N>>>(d);
    cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    if (isnan(h)) {
        fprintf(stderr, "poisoned: the sum read unwritten shared memory (NaN)\n");
        exit(4);
    }
}

static void case_return_before_sync(void) {
    float *d = dev(N);
    bug_return_before_sync<<<1, N>>>(d, N - 3);
    sync_or_die();
}

static void case_two_barriers(void) {
    float *d = dev(N);
    bug_two_barriers<<<1, N>>>(d);
    sync_or_die();
}

static void case_mask_without_self(void) {
    float *d = dev(32);
    bug_mask_without_self<<<1, 32>>>(d);
    sync_or_die();
}

static void case_mask_pairing(void) {
    float *d = dev(32);
    bug_mask_pairing<<<1, 32>>>(d);
    sync_or_die();
}

static void case_bad_geometry(void) {
    float *d = dev(N);
    bug_two_barriers<<<1, 2048>>>(d); /* more than 1024 threads a block */
    cudaError_t e = cudaGetLastError();
    if (e == cudaErrorInvalidConfiguration) {
        fprintf(stderr, "launch refused: %s\n", cudaGetErrorName(e));
        exit(4);
    }
}

static void case_control(void) {
    float *x = dev(N), *o = dev(1), hx[N], ho = 0, want = 0;
    for (int i = 0; i < N; i++) {
        hx[i] = (float)(i % 7);
        want += hx[i];
    }
    cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice);
    good_sum<<<1, N>>>(x, o, N);
    cudaMemcpy(&ho, o, sizeof ho, cudaMemcpyDeviceToHost);
    if (ho != want) {
        fprintf(stderr, "control: %g, want %g\n", ho, want);
        exit(5);
    }
    sync_or_die();
}

struct tcase {
    const char *name;
    void (*run)(void);
    const char *expect; /* a phrase the child's stderr must hold; NULL: must run clean */
    const char *schedule;
};

/* Runs c in a child; returns 1 when it behaved as expected. */
static int run_case(const struct tcase *c) {
    int pfd[2];
    if (pipe(pfd) != 0) return 0;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]);
        if (c->schedule) setenv("MR_EMU_SCHEDULE", c->schedule, 1);
        c->run();
        fflush(stderr);
        _exit(0);
    }
    close(pfd[1]);
    char buf[16384];
    size_t len = 0;
    ssize_t r;
    while ((r = read(pfd[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)r;
    buf[len] = 0;
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    int ok;
    if (!c->expect) {
        ok = clean && len == 0;
    } else {
        /* "a|b": either phrase (the emulator's own report, or AddressSanitizer's in build-asan) */
        char alts[200];
        snprintf(alts, sizeof alts, "%s", c->expect);
        ok = 0;
        for (char *save = NULL, *a = strtok_r(alts, "|", &save); a; a = strtok_r(NULL, "|", &save))
            ok |= !clean && strstr(buf, a) != NULL;
    }
    char first[300];
    snprintf(first, sizeof first, "%s", buf);
    char *nl = strchr(first, '\n');
    if (nl) *nl = 0;
    printf("%-4s %-24s %-8s %s\n", ok ? "ok" : "FAIL", c->name, c->schedule ? c->schedule : "default",
           len ? first : (clean ? "(ran clean)" : "(died silently)"));
    if (!ok) printf("     expected %s; child status %d; stderr:\n%s\n", c->expect ? c->expect : "a clean run", status, buf);
    return ok;
}

int main(void) {
    const struct tcase cases[] = {
        {"control", case_control, NULL, "forward"},
        {"control", case_control, NULL, "reverse"},
        {"control", case_control, NULL, "random"},
        {"missing __syncthreads", case_missing_sync, "poisoned", "forward"},
        {"missing __syncthreads", case_missing_sync, "poisoned", "reverse"},
        {"off-by-one bound", case_off_by_one, "past the end|AddressSanitizer: use-after-poison", NULL},
        {"divergent shuffle", case_divergent_shuffle, "has returned", NULL},
        {"wrong stride", case_wrong_stride, "past the end|AddressSanitizer: use-after-poison", NULL},
        {"unwritten shared read", case_unwritten_shared, "poisoned", NULL},
        {"return before barrier", case_return_before_sync, "returned", NULL},
        {"two barriers", case_two_barriers, "different barriers", NULL},
        {"mask without self", case_mask_without_self, "leaves the lane out", NULL},
        {"two masks at one shuffle", case_mask_pairing, "with another mask", NULL},
        {"1024+ threads a block", case_bad_geometry, "cudaErrorInvalidConfiguration", NULL},
    };
    int n = (int)(sizeof cases / sizeof cases[0]), passed = 0;
    for (int i = 0; i < n; i++) passed += run_case(&cases[i]);
    printf("%d passed, %d failed\n", passed, n - passed);
    return passed == n ? 0 : 1;
}
