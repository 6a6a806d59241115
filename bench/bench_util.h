/* Timing helpers shared by the benchmarks (bench_cpu.c, bench_train.c, bench_vec.c). */
#ifndef MR_BENCH_UTIL_H
#define MR_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

/* CLOCK_MONOTONIC seconds. */
static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorted in place): as Python's statistics.median, the mean of the middle
 * two when n is even. */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
