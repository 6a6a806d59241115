/* All-reduce bandwidth of mr_comm_allreduce against raw MPI on the same bytes.
 *
 *   mpirun -np 2 build/bench/bench_comm [max_mb [reps]]      (defaults 64, 5)
 *
 * For f32 buffers of 1 KB .. max_mb MB (every power of two to 16 KB, then of four), prints a
 * markdown table of the algorithm bandwidth (bytes / seconds per call, rank 0's clock, after a
 * barrier; the best of `reps` repetitions, 4 x reps up to 64 KB, the modes interleaved in a
 * rotating order, so that load from other processes on a shared machine shows less) of:
 *   - MPI_Allreduce (blocking, Open MPI's tuned component) on MPI_COMM_WORLD,
 *   - MPI_Iallreduce + MPI_Wait (the nonblocking path, no deadline),
 *   - mr_comm_allreduce with 16 MB pieces (the default) and with splitting off (1 GiB pieces),
 * and the ratio of mr_comm_allreduce (default) to MPI_Allreduce; then a second table: the largest
 * size with pieces of 1 .. max_mb MB, which is how the 16 MB default was chosen. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distribute/comm.h"

enum { MODE_RAW, MODE_IRAW, MODE_MR, MODE_MR_UNSPLIT, MODES };

static double run(int mode, mr_comm *c, float *x, int64_t n, int iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int it = 0; it < iters; it++) {
        if (mode == MODE_RAW) {
            MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else if (mode == MODE_IRAW) {
            MPI_Request rq;
            MPI_Iallreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &rq);
            MPI_Wait(&rq, MPI_STATUS_IGNORE);
        } else if (mr_comm_allreduce(c, x, n, MR_F32, MR_REDUCE_SUM) != MR_OK) {
            fprintf(stderr, "bench_comm: %s\n", mr_last_error());
            mr_comm_abort(c, 1, "bench_comm: allreduce failed");
        }
    }
    double t = (MPI_Wtime() - t0) / iters;
    MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return t;
}

int main(int argc, char **argv) {
    int max_mb = argc > 1 ? atoi(argv[1]) : 64, reps = argc > 2 ? atoi(argv[2]) : 5;
    if (max_mb < 1) max_mb = 64;
    if (reps < 1) reps = 5;
    mr_comm *c = NULL;
    if (mr_comm_mpi_new(120, &c) != MR_OK) {
        fprintf(stderr, "bench_comm: %s\n", mr_last_error());
        return 1;
    }
    int rank = mr_comm_rank(c), size = mr_comm_size(c), level = 0;
    MPI_Query_thread(&level);
    size_t max_bytes = (size_t)max_mb << 20;
    float *x = malloc(max_bytes);
    memset(x, 0, max_bytes); /* zeros stay zeros however often they are summed in place */
    if (rank == 0) {
        printf("all-reduce f32, %d ranks, MPI thread level %d; GB/s = bytes / seconds per call\n\n", size, level);
        printf("| bytes | MPI_Allreduce GB/s | MPI_Iallreduce+Wait GB/s | mr_comm_allreduce GB/s (16 MB pieces) | "
               "ratio mr/MPI | mr_comm_allreduce GB/s (unsplit) |\n");
        printf("|---:|---:|---:|---:|---:|---:|\n");
    }
    size_t sizes[32];
    int ns = 0;
    for (size_t b = 1024; b <= max_bytes; b *= b < 16384 ? 2 : 4) { /* 1, 2, 4, 8, 16 KB: the per-step agreement */
        sizes[ns++] = b;
        if (b * 2 <= max_bytes && b >= ((size_t)4 << 20)) sizes[ns++] = b * 2; /* 8, 32 MB around the 16 MB step */
    }
    if (sizes[ns - 1] != max_bytes) sizes[ns++] = max_bytes;
    for (int si = 0; si < ns; si++) {
        size_t bytes = sizes[si];
        int64_t n = (int64_t)(bytes / 4);
        int iters = (int)(((size_t)512 << 20) / bytes);
        if (iters > 2000) iters = 2000;
        if (iters < 5) iters = 5;
        double t[MODES];
        for (int m = 0; m < MODES; m++) t[m] = 1e30;
        /* runs of the small sizes last a few ms: on a shared machine a rank's core is then often
         * slow for a whole run (the same 2 KB call took 1.5 or 5.6 us from one run to the next,
         * MPI_Allreduce and mr_comm_allreduce alike), so they get 4x the repetitions */
        const int size_reps = bytes <= ((size_t)64 << 10) ? 4 * reps : reps;
        for (int rep = 0; rep < size_reps; rep++) {
            for (int j = 0; j < MODES; j++) {
                /* each repetition starts one mode later, so that no mode always follows the same
                 * one: on a shared machine the time slice another process takes when these ranks
                 * have run long (after the slow MPI_Iallreduce) then falls on every mode alike */
                const int m = (j + rep) % MODES;
                if (mr_comm_set_max_piece_bytes(c, m == MODE_MR_UNSPLIT ? (size_t)1 << 30 : 0) != MR_OK) return 1;
                if (rep == 0) run(m, c, x, n, 1 + iters / 10); /* warm up */
                double tm = run(m, c, x, n, iters);
                if (tm < t[m]) t[m] = tm;
            }
        }
        if (rank == 0) {
            double gb = (double)bytes / 1e9;
            char label[32];
            if (bytes >= (1 << 20)) snprintf(label, sizeof label, "%zu MB", bytes >> 20);
            else snprintf(label, sizeof label, "%zu KB", bytes >> 10);
            printf("| %s | %.3f | %.3f | %.3f | %.2f | %.3f |\n", label, gb / t[MODE_RAW], gb / t[MODE_IRAW],
                   gb / t[MODE_MR], t[MODE_RAW] / t[MODE_MR], gb / t[MODE_MR_UNSPLIT]);
            fflush(stdout);
        }
    }
    /* piece size sweep at the largest size */
    if (rank == 0) {
        printf("\n%zu MB all-reduce by piece size (mr_comm_set_max_piece_bytes), best of %d\n\n", max_bytes >> 20,
               reps);
        printf("| piece | GB/s |\n|---:|---:|\n");
    }
    for (size_t piece = (size_t)1 << 20; piece <= max_bytes; piece *= 2) {
        double best = 1e30;
        if (mr_comm_set_max_piece_bytes(c, piece) != MR_OK) return 1;
        run(MODE_MR, c, x, (int64_t)(max_bytes / 4), 2);
        for (int rep = 0; rep < reps; rep++) {
            double tm = run(MODE_MR, c, x, (int64_t)(max_bytes / 4), 8);
            if (tm < best) best = tm;
        }
        if (rank == 0) printf("| %zu MB | %.3f |\n", piece >> 20, (double)max_bytes / 1e9 / best);
        fflush(stdout);
    }
    free(x);
    mr_comm_free(c);
    return 0;
}
