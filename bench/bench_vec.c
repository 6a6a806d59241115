/* The trainer's finite check (core/vec.h): mr_vec_sumsq, the one sum the step made before issue
 * 18's overflow reports, against mr_vec_sumsq_seg, which also flags each parameter's gradient in
 * the same pass, on gradient buffers laid out like two models' registries:
 *   cnn   421,642 floats in 8 parameters (configs/cnn.yaml)
 *   gpt   124,439,808 floats in 148 parameters (GPT-2 small's sizes), or --small: 12.4M in 148
 * Method: per size, the two calls alternate (so load from other processes falls on both), each
 * timed R times after 3 warm-up calls; the medians, their ratio, and the bytes read per second.
 * Then the same with one inf in the buffer (the rare path: the segments of the non-finite block
 * or thread are walked). On the CPU, and on cuda:0 when there is a GPU.
 * Usage: bench_vec [--runs R] [--small]        (R 31) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/vec.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CHECK(call)                                                                                                     \
    do {                                                                                                                \
        mr_status st_ = (call);                                                                                         \
        if (st_ != MR_OK) {                                                                                             \
            fprintf(stderr, "bench_vec: %s\n", mr_last_error());                                                        \
            exit(1);                                                                                                    \
        }                                                                                                               \
    } while (0)

/* One layout on device d: x (n floats), seg and bad (nseg) and scratch in d's memory. */
static void bench(const char *name, mr_device d, const mr_backend *be, int64_t n, const int64_t *h_seg, int32_t nseg,
                  int runs) {
    const mr_copy_kind h2d = d.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D;
    float *h = malloc(sizeof *h * (size_t)n), *x = NULL;
    int64_t *seg = NULL;
    int32_t *bad = NULL;
    double *scratch = NULL, *tp = malloc(sizeof *tp * (size_t)runs), *ts = malloc(sizeof *ts * (size_t)runs);
    if (!h || !tp || !ts) exit(1);
    for (int64_t i = 0; i < n; i++) h[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    CHECK(be->alloc(d.index, sizeof *x * (size_t)n, (void **)&x));
    CHECK(be->alloc(d.index, sizeof *seg * (size_t)nseg, (void **)&seg));
    CHECK(be->alloc(d.index, sizeof *bad * (size_t)nseg, (void **)&bad));
    CHECK(be->alloc(d.index, sizeof *scratch * MR_VEC_SCRATCH, (void **)&scratch));
    CHECK(be->copy(d.index, x, h, sizeof *x * (size_t)n, h2d, NULL));
    CHECK(be->copy(d.index, seg, h_seg, sizeof *seg * (size_t)nseg, h2d, NULL));
    CHECK(be->memset_zero(d.index, bad, sizeof *bad * (size_t)nseg, NULL));
    CHECK(be->stream_sync(NULL));
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { /* one inf in the middle: the rare path */
            const float inf = INFINITY;
            CHECK(be->copy(d.index, x + n / 2, &inf, sizeof inf, h2d, NULL));
            CHECK(be->stream_sync(NULL));
        }
        double sp = 0, ss = 0;
        for (int r = -3; r < runs; r++) {
            double t0 = now_s();
            CHECK(mr_vec_sumsq(d, NULL, x, n, scratch, &sp));
            double t1 = now_s();
            CHECK(mr_vec_sumsq_seg(d, NULL, x, n, seg, nseg, bad, scratch, &ss));
            double t2 = now_s();
            if (r >= 0) tp[r] = t1 - t0, ts[r] = t2 - t1;
        }
        if (memcmp(&sp, &ss, sizeof sp) != 0 && !(isnan(sp) && isnan(ss))) {
            fprintf(stderr, "bench_vec: the sums differ (%.17g, %.17g)\n", sp, ss);
            exit(1);
        }
        const double mp = median(tp, runs), ms = median(ts, runs);
        printf("| %s | %s | %lld | %d | %s | %.3f | %.3f | %.3f | %.1f |\n", d.kind == MR_DEVICE_CPU ? "cpu" : "cuda:0",
               name, (long long)n, (int)nseg, pass ? "one inf" : "finite", mp * 1e3, ms * 1e3, ms / mp,
               4.0 * (double)n / ms * 1e-9);
    }
    be->free(d.index, x);
    be->free(d.index, seg);
    be->free(d.index, bad);
    be->free(d.index, scratch);
    free(h);
    free(tp);
    free(ts);
}

/* nseg segment starts for parameters of the given sizes (64-byte aligned, as autodiff/nn.h lays
 * them out); *n gets the buffer's length. */
static int64_t *layout(const int64_t *sizes, int32_t nseg, int64_t *n) {
    int64_t *seg = malloc(sizeof *seg * (size_t)nseg), off = 0;
    if (!seg) exit(1);
    for (int32_t i = 0; i < nseg; i++) {
        seg[i] = off;
        off += (sizes[i] + 15) / 16 * 16;
    }
    *n = off;
    return seg;
}

int main(int argc, char **argv) {
    int runs = 31, small = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--small")) small = 1;
        else {
            fprintf(stderr, "usage: bench_vec [--runs R] [--small]\n");
            return 2;
        }
    }
    if (runs < 1) runs = 1;
    /* cnn: conv1, conv2, fc1, fc2 weights and biases */
    static const int64_t cnn[8] = {288, 32, 18432, 64, 401408, 128, 1280, 10};
    /* GPT-2 small: wte, wpe, 12 blocks of 12, ln_f (2) */
    int64_t gpt[148];
    const int64_t e = 768, v = 50257, ctx = 1024, scale = small ? 10 : 1;
    gpt[0] = v * e / scale, gpt[1] = ctx * e / scale;
    for (int b = 0; b < 12; b++) {
        const int64_t blk[12] = {e, e, e * 3 * e / scale, 3 * e, e * e / scale, e, e, e, e * 4 * e / scale, 4 * e,
                                 4 * e * e / scale, e};
        memcpy(gpt + 2 + 12 * b, blk, sizeof blk);
    }
    gpt[146] = e, gpt[147] = e;
    printf("| device | layout | floats | parameters | gradient | mr_vec_sumsq ms | mr_vec_sumsq_seg ms | ratio | "
           "seg GB/s |\n|---|---|---|---|---|---|---|---|---|\n");
    int ndev = mr_cuda_device_count() > 0 ? 2 : 1;
    for (int k = 0; k < ndev; k++) {
        mr_device d = k == 0 ? mr_device_cpu() : (mr_device){MR_DEVICE_CUDA, 0};
        const mr_backend *be = NULL;
        CHECK(mr_backend_get(d.kind, &be));
        int64_t n = 0, *seg = layout(cnn, 8, &n);
        bench("cnn", d, be, n, seg, 8, runs);
        free(seg);
        seg = layout(gpt, 148, &n);
        bench(small ? "gpt (1/10)" : "gpt", d, be, n, seg, 148, runs);
        free(seg);
    }
    if (ndev == 1) printf("(no GPU: cuda:0 not measured)\n");
    return 0;
}
