/* Input-pipeline throughput (issue 4, Speed): the Fashion-MNIST training pipeline
 *   IDX decode (train images + labels, gzipped, read into memory once) -> map normalize u8 -> f32
 *   (/255; label passes) -> shuffle(10000, reshuffle each epoch) -> batch(128) -> prefetch(AUTO)
 * timed over whole epochs (60000 elements) with a consumer that does nothing, i.e. pure pipeline
 * throughput, for map parallel 1, 2 and AUTO. A fresh iterator per epoch, so the timing includes
 * its start and the shuffle buffer's first fill; one warm-up epoch first; the median of --runs.
 * bench/peer_tfdata.py does the same with tf.data; bench/run_data.sh prints both side by side.
 * The CNN training step's appetite (samples/s) is MIRROR_CNN_SAMPLES_PER_S, default 4300 (measured
 * on the reference machine with bench_models --models cnn), to print the headroom ratio.
 * --augment adds data/augment.h's maps after the normalize map (random_crop 28 pad 4, horizontal_flip
 * 0.5, normalize mean 0.286 std 0.353: README.md, "Augmentation"), to price them per element.
 * Usage: bench_data [--dir DIR] [--runs R] [--parallel 1,2,0] [--augment]   (0 = MR_DATA_AUTO)
 * Output lines: "parallel P: X elements/s (...)", parsed by run_data.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/augment.h"
#include "data/data.h"

#define BENCH_PROG "bench_data"
#include "bench_data_util.h"

int main(int argc, char **argv) {
    const char *dir = "/usr/share/datasets/fashion-mnist";
    const char *pars = "1,2,0";
    int runs = 3, augment = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--parallel") && i + 1 < argc) pars = argv[++i];
        else if (!strcmp(argv[i], "--augment")) augment = 1;
        else {
            fprintf(stderr, "bench_data: unknown flag %s\nHINT: --dir DIR --runs R --parallel 1,2,0 --augment\n", argv[i]);
            return 2;
        }
    }
    if (runs < 1 || runs > 100) runs = 3;
    const char *env = getenv("MIRROR_CNN_SAMPLES_PER_S");
    double cnn = env && atof(env) > 0 ? atof(env) : 4300.0;
    char img[1024], lab[1024];
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", dir);
    mr_dataset *src = NULL;
    double t0 = now_s();
    if (mr_data_from_idx(img, lab, &src) != MR_OK) {
        fprintf(stderr, "bench_data: %s\nHINT: install Debian's dataset-fashion-mnist or pass --dir\n", mr_last_error());
        return 1;
    }
    double decode_s = now_s() - t0;
    printf("decode (gunzip + IDX parse, once): %.3f s\n", decode_s);
    printf("CNN training step consumes %.0f samples/s (%s)\n", cnn,
           env ? "MIRROR_CNN_SAMPLES_PER_S" : "default constant; set MIRROR_CNN_SAMPLES_PER_S");
    mr_data_spec out = {0};
    mr_shape s28 = mr_shape_2d(28, 28), sc = mr_shape_make(0, NULL);
    if (mr_data_spec_add(&out, "image", MR_F32, &s28) || mr_data_spec_add(&out, "label", MR_I32, &sc)) die("spec");

    for (const char *p = pars; *p;) {
        int par = atoi(p);
        mr_dataset *d = NULL;
        if (mr_data_map(src, normalize, NULL, &out, par, &d) != MR_OK) die("map");
        if (augment) {
            mr_augment_cfg a;
            memset(&a, 0, sizeof a);
            a.n = 3;
            a.op[0].kind = MR_AUG_RANDOM_CROP, a.op[0].size = 28, a.op[0].pad = 4;
            a.op[1].kind = MR_AUG_HFLIP, a.op[1].p = 0.5;
            a.op[2].kind = MR_AUG_NORMALIZE, a.op[2].n = 1, a.op[2].mean[0] = 0.286, a.op[2].std[0] = 0.353;
            STEP(d, mr_data_augment(d, "image", &a, 1, 1, par, &nd_));
        }
        STEP(d, mr_data_shuffle(d, 10000, 42, 1, &nd_));
        STEP(d, mr_data_batch(d, 128, 0, &nd_));
        STEP(d, mr_data_prefetch(d, MR_DATA_AUTO, &nd_));
        mr_data_stats st;
        int64_t n = 0;
        bench_epoch(d, &st, &n); /* warm-up */
        double *rate = malloc(sizeof(double) * (size_t)runs);
        for (int r = 0; r < runs; r++) rate[r] = (double)n / bench_epoch(d, &st, &n);
        qsort(rate, (size_t)runs, sizeof(double), cmp_double);
        double med = rate[runs / 2];
        char pname[16];
        snprintf(pname, sizeof pname, par ? "%d" : "auto", par);
        printf("%sparallel %s: %.0f elements/s (median of %d epochs of %lld; producer %.0f batches/s, consumer waited "
               "%.3f s, P in use %d, prefetch depth %lld) = %.1fx the CNN step\n",
               augment ? "augment, " : "", pname, med, runs, (long long)n, st.producer_rate, st.wait_s,
               st.map_parallel, (long long)st.prefetch, med / cnn);
        free(rate);
        mr_data_free(d);
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
    mr_data_free(src);
    return 0;
}
