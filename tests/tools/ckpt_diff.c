/* ckpt_diff A B: the largest absolute and relative difference between the parameters (and the
 * optimizer state) of two mirror checkpoints, for the replica-equivalence tests: prints
 * "params max_abs X max_rel Y; optimizer max_abs X" and exits 0, or 1 when the files do not hold
 * the same datasets. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt.h"

static int diff_group(mr_ckpt_reader *a, mr_ckpt_reader *b, const char *group, double *max_abs, double *max_rel) {
    char **na = NULL, **nb = NULL;
    int ca = 0, cb = 0, ok = 1;
    if (mr_ckpt_list(a, group, &na, &ca) != MR_OK || mr_ckpt_list(b, group, &nb, &cb) != MR_OK || ca != cb) {
        fprintf(stderr, "ckpt_diff: the %s groups differ: %s\n", group, mr_last_error());
        ok = 0;
    }
    for (int i = 0; ok && i < ca; i++) {
        char p[1024];
        mr_dtype dt;
        mr_shape sh;
        snprintf(p, sizeof p, "%s/%s", group, na[i]);
        if (strcmp(na[i], nb[i]) != 0 || mr_ckpt_info(a, p, &dt, &sh) != MR_OK) {
            fprintf(stderr, "ckpt_diff: %s: %s vs %s\n", p, na[i], nb[i]);
            ok = 0;
            break;
        }
        int64_t n = mr_shape_numel(&sh);
        float *x = malloc(sizeof(float) * (size_t)(n + 1)), *y = malloc(sizeof(float) * (size_t)(n + 1));
        if (!x || !y || mr_ckpt_read(a, p, MR_F32, &sh, x) != MR_OK || mr_ckpt_read(b, p, MR_F32, &sh, y) != MR_OK) {
            fprintf(stderr, "ckpt_diff: %s: %s\n", p, mr_last_error());
            ok = 0;
        }
        for (int64_t k = 0; ok && k < n; k++) {
            double d = fabs((double)x[k] - (double)y[k]);
            double r = d / (fabs((double)x[k]) > 1e-3 ? fabs((double)x[k]) : 1e-3);
            if (d > *max_abs || isnan(d)) *max_abs = isnan(d) ? INFINITY : d;
            if (r > *max_rel) *max_rel = r;
        }
        free(x);
        free(y);
    }
    mr_ckpt_names_free(na, ca);
    mr_ckpt_names_free(nb, cb);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: ckpt_diff A.h5 B.h5\n");
        return 2;
    }
    mr_ckpt_reader *a = NULL, *b = NULL;
    if (mr_ckpt_open(argv[1], 0, &a) != MR_OK || mr_ckpt_open(argv[2], 0, &b) != MR_OK) {
        fprintf(stderr, "ckpt_diff: %s\n", mr_last_error());
        return 1;
    }
    double pa = 0, pr = 0, oa = 0, orel = 0;
    int ok = diff_group(a, b, "params", &pa, &pr) && diff_group(a, b, "optimizer", &oa, &orel);
    mr_ckpt_close(a);
    mr_ckpt_close(b);
    if (!ok) return 1;
    printf("params max_abs %.3g max_rel %.3g; optimizer max_abs %.3g\n", pa, pr, oa);
    return 0;
}
