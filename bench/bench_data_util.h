/* What the data benchmarks share (bench_data.c, bench_data_sources.c): the error exit, the
 * pipeline-building step macro, the u8 -> f32 image map and one epoch through a fresh iterator.
 * Each includer defines BENCH_PROG (its name, for messages) before including this header. */
#ifndef MR_BENCH_DATA_UTIL_H
#define MR_BENCH_DATA_UTIL_H

#include <stdio.h>

#include "bench_util.h"
#include "data/data.h"

/* Prints what failed with mr_last_error() and exits 1. */
static void die(const char *what) {
    fprintf(stderr, BENCH_PROG ": %s: %s\n", what, mr_last_error());
    exit(1);
}

/* in: "image" u8 (28,28), "label" i32 [] -> out: "image" f32 (28,28) / 255, "label" i32 [] */
static mr_status normalize(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)ctx;
    (void)index;
    (void)epoch;
    const unsigned char *x = in[0];
    float *y = out[0];
    for (int i = 0; i < 28 * 28; i++) y[i] = (float)x[i] * (1.0f / 255.0f);
    *(int32_t *)out[1] = *(const int32_t *)in[1];
    return MR_OK;
}

/* d = the dataset `call` makes into nd_ from d (d is freed); dies naming the call on an error. */
#define STEP(d, call)                                                                            \
    do {                                                                                         \
        mr_dataset *nd_ = NULL;                                                                  \
        if ((call) != MR_OK) die(#call);                                                         \
        mr_data_free(d);                                                                         \
        d = nd_;                                                                                 \
    } while (0)

/* One epoch through a fresh iterator; returns seconds, fills *st and *n (elements). */
static inline double bench_epoch(mr_dataset *d, mr_data_stats *st, int64_t *n) {
    mr_data_iter *it = NULL;
    double t0 = now_s();
    if (mr_data_iter_new(d, &it) != MR_OK) die("iterator");
    *n = 0;
    for (;;) {
        mr_data_elem e;
        int end = 0;
        if (mr_data_iter_next(it, &e, &end) != MR_OK) die("next");
        if (end) break;
        *n += e.shape[0].dim[0];
    }
    double dt = now_s() - t0;
    if (mr_data_iter_stats(it, st) != MR_OK) die("stats");
    mr_data_iter_free(it);
    return dt;
}

#endif
