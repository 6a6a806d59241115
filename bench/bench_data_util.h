/* What the data benchmarks share (bench_data.c, bench_data_sources.c): the pipeline-building step
 * macro and one epoch through a fresh iterator. Each includer defines die(const char *what) (which
 * prints mr_last_error() and exits) before including this header. */
#ifndef MR_BENCH_DATA_UTIL_H
#define MR_BENCH_DATA_UTIL_H

#include "bench_util.h"
#include "data/data.h"

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
