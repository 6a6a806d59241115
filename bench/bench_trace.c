/* What a span point costs (core/trace.h), in nanoseconds per span (mr_trace_begin + mr_trace_end1):
 *
 *   build/bench/bench_trace [millions]      (default 2 million spans per measurement)
 *
 *   not traced        the track pointer is NULL (a run without log.trace)
 *   outside window    a track with buffers, the window closed (the steps before and after it)
 *   inside window     recorded: two clock reads and one 64-byte event
 *   span, given times mr_trace_span with t0/t1 the caller read (per-op spans: plan.c reads the
 *                     clock around each kernel itself)
 *   clock read        mr_trace_now_ns alone (CLOCK_MONOTONIC through the vDSO)
 * Each is the median of 5 runs after one warm-up run, on one thread. The trainer has about 10 span
 * points per step plus one per bucket (and two clock reads per kernel with log.trace_ops): multiply
 * to get a step's cost, and compare with the step times of metrics.jsonl (README "Tracing steps"). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/trace.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { MODE_NULL, MODE_OFF, MODE_ON, MODE_GIVEN, MODE_CLOCK, MODES };
static const char *const mode_name[MODES] = {"not traced", "outside window", "inside window", "span, given times",
                                             "clock read"};

static volatile int64_t g_sink;

static double run(int mode, mr_trace *t, mr_trace_track *k, int64_t n) {
    if (mode == MODE_ON || mode == MODE_GIVEN) {
        if (mr_trace_reserve(k, n) != MR_OK) { /* room for every span: none dropped */
            fprintf(stderr, "bench_trace: %s\n", mr_last_error());
            exit(1);
        }
        mr_trace_start(t);
    }
    mr_trace_track *use = mode == MODE_NULL ? NULL : k;
    const double t0 = now_s();
    int64_t sink = 0;
    for (int64_t i = 0; i < n; i++) {
        if (mode == MODE_CLOCK) {
            sink += mr_trace_now_ns();
        } else if (mode == MODE_GIVEN) {
            mr_trace_span(use, "gemm", 1 + i, 2 + i, "node", i, NULL, 0);
        } else {
            const int64_t s = mr_trace_begin(use);
            mr_trace_end1(use, s, "forward", "micro", i);
            sink += s;
        }
    }
    const double dt = now_s() - t0;
    g_sink = sink;
    mr_trace_stop(t);
    if (mode == MODE_ON || mode == MODE_GIVEN) {
        const mr_trace_stats st = mr_trace_stats_of(t, 0);
        if (st.events != n || st.dropped != 0) {
            fprintf(stderr, "bench_trace: %lld events, %lld dropped of %lld\n", (long long)st.events,
                    (long long)st.dropped, (long long)n);
            exit(1);
        }
    }
    return dt * 1e9 / (double)n;
}

int main(int argc, char **argv) {
    const int64_t n = (int64_t)((argc > 1 ? atof(argv[1]) : 2.0) * 1e6);
    if (n < 1) {
        fprintf(stderr, "usage: %s [millions of spans]\n", argv[0]);
        return 2;
    }
    mr_trace *t = NULL;
    mr_trace_track *k = NULL;
    if (mr_trace_new(0, "bench", NULL, &t) != MR_OK || mr_trace_add_track(t, "training", 1, &k) != MR_OK ||
        mr_trace_reserve(k, 16) != MR_OK) {
        fprintf(stderr, "bench_trace: %s\n", mr_last_error());
        return 1;
    }
    printf("| span point | ns per span (median of 5, %lld spans each) |\n|---|---|\n", (long long)n);
    for (int mode = 0; mode < MODES; mode++) {
        double r[6];
        for (int i = 0; i < 6; i++) r[i] = run(mode, t, k, n);
        qsort(r + 1, 5, sizeof *r, cmp); /* r[0] was the warm-up */
        printf("| %s | %.2f |\n", mode_name[mode], r[3]);
    }
    mr_trace_free(t);
    return 0;
}
