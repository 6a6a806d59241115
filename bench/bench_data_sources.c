/* Input-pipeline throughput per file format (issue 17, item 5): the Fashion-MNIST training
 * pipeline of bench/bench_data.c from each source the trainer reads, on copies of the 60000
 * training images that tests/tools/data_copy writes into DIR (bench/run_data.sh makes them):
 *   idx       DIR/tr.images.idx + tr.labels.idx (uncompressed, read into memory)
 *   hdf5      DIR/tr.h5 (/x u8, /y u8; read in cached blocks)
 *   npy       DIR/tr.x.npy + tr.y.npy (memory-mapped)
 *   tfrecord  DIR/tr.tfrecord (tf.train.Example: image/encoded_raw bytes, label int64; indexed,
 *             CRC-checked and protobuf-decoded per element)
 *   tfrecord_sharded  DIR/sh-*.tfrecord (8 files: a sharded set, concatenated)
 * each as source -> mr_data_as_classes -> map normalize u8 -> f32 (parallel 1, as the trainer's
 * make_pipeline: train/train.c; --parallel 0 for MR_DATA_AUTO) -> shuffle(10000) -> batch(128) ->
 * prefetch(AUTO), whole epochs with a consumer that does nothing,
 * one warm-up epoch, the median of --runs. bench/peer_tfdata_sources.py does the same with tf.data
 * on the same files. Output lines: "source NAME: X elements/s (...)", parsed by run_data.sh.
 * Usage: bench_data_sources --dir DIR [--runs R] [--parallel P] [--sources idx,hdf5,npy,tfrecord,tfrecord_sharded] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/sources.h"

#define BENCH_PROG "bench_data_sources"
#include "bench_data_util.h"

/* The source `name` in dir (the trainer's calls: train/train_source.c). */
static mr_dataset *open_source(const char *dir, const char *name) {
    char a[1024], b[1024];
    mr_dataset *raw = NULL, *cl = NULL;
    mr_status st = MR_OK;
    const char *names[2] = {"image", "label"};
    mr_tfrecord_feature f[2] = {{"image/encoded_raw", "image", MR_U8, mr_shape_2d(28, 28)},
                                {"label", "label", MR_I64, {.ndim = -1}}};
    if (!strcmp(name, "idx")) {
        snprintf(a, sizeof a, "%s/tr.images.idx", dir), snprintf(b, sizeof b, "%s/tr.labels.idx", dir);
        st = mr_data_from_idx(a, b, &raw);
    } else if (!strcmp(name, "hdf5")) {
        const char *ds[2] = {"/x", "/y"};
        snprintf(a, sizeof a, "%s/tr.h5", dir);
        st = mr_data_from_hdf5(a, ds, 2, &raw);
    } else if (!strcmp(name, "npy")) {
        snprintf(a, sizeof a, "%s/tr.x.npy", dir), snprintf(b, sizeof b, "%s/tr.y.npy", dir);
        const char *paths[2] = {a, b};
        st = mr_data_from_npy(paths, NULL, names, 2, &raw);
    } else if (!strcmp(name, "tfrecord")) {
        snprintf(a, sizeof a, "%s/tr.tfrecord", dir);
        st = mr_data_from_tfrecord(a, f, 2, &raw);
    } else if (!strcmp(name, "tfrecord_sharded")) {
        char **paths = NULL;
        int n = 0;
        snprintf(a, sizeof a, "%s/sh-*.tfrecord", dir);
        if (mr_data_expand_paths(a, &paths, &n) != MR_OK) die(a);
        mr_dataset *parts[64] = {0};
        if (n > 64) die("more than 64 shards");
        for (int k = 0; k < n; k++)
            if (mr_data_from_tfrecord(paths[k], f, 2, &parts[k]) != MR_OK) die(paths[k]);
        st = mr_data_concat(parts, n, &raw);
        for (int k = 0; k < n; k++) mr_data_free(parts[k]);
        mr_data_paths_free(paths, n);
    } else {
        fprintf(stderr, "bench_data_sources: unknown source %s\nHINT: idx, hdf5, npy, tfrecord, tfrecord_sharded\n", name);
        exit(2);
    }
    if (st != MR_OK) die(name);
    if (mr_data_as_classes(raw, name, &cl) != MR_OK) die(name);
    mr_data_free(raw);
    return cl;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *sources = "idx,hdf5,npy,tfrecord,tfrecord_sharded";
    int runs = 3, par = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sources") && i + 1 < argc) sources = argv[++i];
        else if (!strcmp(argv[i], "--parallel") && i + 1 < argc) par = atoi(argv[++i]);
        else {
            fprintf(stderr, "bench_data_sources: unknown flag %s\nHINT: --dir DIR --runs R --parallel P --sources a,b\n", argv[i]);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "bench_data_sources: --dir is required\nHINT: bench/run_data.sh writes the copies and passes it\n");
        return 2;
    }
    if (runs < 1 || runs > 100) runs = 3;
    mr_data_spec out = {0};
    mr_shape s28 = mr_shape_2d(28, 28), sc = mr_shape_make(0, NULL);
    if (mr_data_spec_add(&out, "image", MR_F32, &s28) || mr_data_spec_add(&out, "label", MR_I32, &sc)) die("spec");
    char list[256];
    snprintf(list, sizeof list, "%s", sources);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        double t0 = now_s();
        mr_dataset *src = open_source(dir, name), *d = NULL;
        double open_s = now_s() - t0;
        if (mr_data_map(src, normalize, NULL, &out, par < 0 ? 1 : par, &d) != MR_OK) die("map");
        STEP(d, mr_data_shuffle(d, 10000, 42, 1, &nd_));
        STEP(d, mr_data_batch(d, 128, 0, &nd_));
        STEP(d, mr_data_prefetch(d, MR_DATA_AUTO, &nd_));
        int64_t n = 0;
        mr_data_stats st;
        bench_epoch(d, &st, &n); /* warm-up: page cache, the HDF5 block cache, thread pools */
        double *rate = malloc(sizeof(double) * (size_t)runs);
        for (int r = 0; r < runs; r++) rate[r] = (double)n / bench_epoch(d, &st, &n);
        qsort(rate, (size_t)runs, sizeof(double), cmp_double);
        printf("source %s: %.0f elements/s (median of %d epochs of %lld; open %.3f s; P in use %d, prefetch depth %lld)\n",
               name, rate[runs / 2], runs, (long long)n, open_s, st.map_parallel, (long long)st.prefetch);
        fflush(stdout);
        free(rate);
        mr_data_free(d);
        mr_data_free(src);
    }
    return 0;
}
