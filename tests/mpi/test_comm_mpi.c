/* distribute/comm over MPI, run under mpirun (CTest: mpi.comm_np2, mpi.comm_np4).
 *
 *   test_comm_mpi            correctness: all-reduce sum/avg (f32, f64, i64; 0 .. 1<<20 elements,
 *                            through MPI_Iallreduce and the ring)
 *                            on rank-dependent data whose sums are exact in any order, compared
 *                            with the serial sums; bit-identical results on every rank for
 *                            inexact data; a 40 MB all-reduce (split into 16 MB pieces); broadcast
 *                            from every root; allgather and reduce-scatter, also split into small
 *                            pieces; barrier; the queue (requests in flight, waited out of order,
 *                            beside direct collectives of 4 B to 16 KB, each checked). Exit 0 pass, 1 fail (each failure printed).
 *   test_comm_mpi serialized the same, with MPI initialised by the caller at MPI_THREAD_SERIALIZED
 *                            (the module then serialises its MPI calls under one lock: the queue's
 *                            thread and direct collectives run concurrently), finalised by the caller.
 *                            Both also measure every rank's clock offset from rank 0 by ping-pong
 *                            (mr_comm_clock_offset): one host, one clock, so the measured offset
 *                            must lie within its own error bound; the bounds are printed.
 *   test_comm_mpi hang|hangring|hangfrag|die|fail [tag]
 *                            fault drills for tests/mpi/faults.sh, with a 2 s deadline: rank 1
 *                            skips an all-reduce (sleeps; of 1000 f32, of 1<<20 f32 for the
 *                            ring path, or of 4096 f32 for the recursive doubling's fragmented
 *                            messages), kills itself with SIGKILL, or calls
 *                            mr_comm_abort. The job must end non-zero, naming the collective or
 *                            the rank. `tag` is ignored (faults.sh finds leftover processes by it).
 *
 * Plain C with its own main (no CMocka: every rank must run every collective, whatever fails). */
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "distribute/comm.h"

static int g_rank, g_size, g_fails;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            g_fails++;                                                                            \
            fprintf(stderr, "FAILED rank %d line %d: ", g_rank, __LINE__);                        \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
        }                                                                                         \
    } while (0)

/* A failed collective leaves the communicator broken: stop the whole job now. */
#define OK(c, expr)                                                                               \
    do {                                                                                          \
        mr_status s_ = (expr);                                                                    \
        if (s_ != MR_OK) {                                                                        \
            fprintf(stderr, "FAILED rank %d line %d: %s -> %s: %s\n", g_rank, __LINE__, #expr,    \
                    mr_status_name(s_), mr_last_error());                                         \
            mr_comm_abort((c), 1, "test_comm_mpi: a collective failed");                          \
        }                                                                                         \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Element i of rank r's data: multiples of 1/8 below 2^10 in magnitude (f32, f64) or large
 * integers (i64), so every sum over <= 64 ranks is exact in any order. */
static double exact_val(int r, int64_t i, uint64_t seed) {
    return (double)((int64_t)((uint64_t)(i * 7 + r * 13 + (int64_t)seed * 31) % 8001) - 4000) * 0.125;
}
static int64_t exact_i64(int r, int64_t i, uint64_t seed) {
    return ((int64_t)r + 1) * 1000000007LL * (i % 1000 - 500) + (int64_t)seed + i;
}

static void fill_exact(void *buf, int64_t n, mr_dtype dt, int r, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == MR_F32) ((float *)buf)[i] = (float)exact_val(r, i, seed);
        else if (dt == MR_F64) ((double *)buf)[i] = exact_val(r, i, seed);
        else ((int64_t *)buf)[i] = exact_i64(r, i, seed);
    }
}

/* The serial sum (or average) over ranks of element i, as the module must produce it. */
static void want_at(void *out, int64_t k, int64_t i, mr_dtype dt, mr_reduce_op op, uint64_t seed) {
    double s = 0;
    int64_t si = 0;
    for (int r = 0; r < g_size; r++) {
        s += exact_val(r, i, seed);
        si += exact_i64(r, i, seed);
    }
    if (dt == MR_F32) ((float *)out)[k] = op == MR_REDUCE_AVG ? (float)s / (float)g_size : (float)s;
    else if (dt == MR_F64) ((double *)out)[k] = op == MR_REDUCE_AVG ? s / g_size : s;
    else ((int64_t *)out)[k] = op == MR_REDUCE_AVG ? si / g_size : si;
}

/* Compares n elements with the serial reference of elements lo.. (prints the first mismatch). */
static int check_exact(const char *what, const void *got, int64_t lo, int64_t n, mr_dtype dt, mr_reduce_op op,
                       uint64_t seed) {
    size_t es = mr_dtype_size(dt);
    char want[8];
    for (int64_t i = 0; i < n; i++) {
        want_at(want, 0, lo + i, dt, op, seed);
        if (memcmp((const char *)got + (size_t)i * es, want, es)) {
            double g = dt == MR_I64 ? (double)((const int64_t *)got)[i] : mr_dtype_get(got, dt, i);
            double w = dt == MR_I64 ? (double)*(int64_t *)want : mr_dtype_get(want, dt, 0);
            CHECK(0, "%s %s %s: element %lld is %.17g, serial %.17g", what, mr_dtype_name(dt),
                  op ? "avg" : "sum", (long long)(lo + i), g, w);
            return 0;
        }
    }
    return 1;
}

static const mr_dtype k_types[] = {MR_F32, MR_F64, MR_I64};

static void test_allreduce(mr_comm *c) {
    /* 16411 f32 and 1000003: just above the ring threshold (64 KB), and chunks of unequal size;
     * 992 f32 (3968 bytes: one fragment of the recursive doubling's messages, comm_mpi.c
     * rd_exchange), 993 (two), 1000 f64 (three, uneven), 4095 f32 (five), 8191 f64 / 16383 f32
     * (17 fragments of 65528 / 65532 bytes, just below the ring) */
    static const int64_t sizes[] = {0, 1, 7, 992, 993, 1000, 4095, 8191, 16383, 16411, 1 << 20, 1000003};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    void *buf = malloc(((size_t)1 << 20) * 8);
    uint64_t seed = 1;
    for (int si = 0; si < NS; si++)
        for (int ti = 0; ti < 3; ti++)
            for (int op = 0; op < 2; op++, seed++) {
                fill_exact(buf, sizes[si], k_types[ti], g_rank, seed);
                OK(c, mr_comm_allreduce(c, buf, sizes[si], k_types[ti], (mr_reduce_op)op));
                check_exact("allreduce", buf, 0, sizes[si], k_types[ti], (mr_reduce_op)op, seed);
            }
    free(buf);
}

/* Inexact data (random magnitudes): every rank must still get the same bits, through the ring
 * (100000 floats) and the recursive doubling of small pieces (1 .. 16383 floats; with 3 ranks its
 * fold of the rank beyond the power of two). */
static void test_identical(mr_comm *c) {
    static const int sizes[] = {1, 7, 1000, 16383, 100000};
    enum { N = 100000 };
    float *x = malloc(N * sizeof *x), *all = malloc((size_t)g_size * N * sizeof *all);
    for (int si = 0; si < 5; si++) {
        const int n = sizes[si];
        uint64_t h = 0x12345u + (uint64_t)g_rank * 0x9e3779b97f4a7c15ULL + (uint64_t)si;
        for (int i = 0; i < n; i++) {
            h = h * 6364136223846793005ULL + 1442695040888963407ULL;
            x[i] = (float)((double)(h >> 40) / 16777216.0 - 0.5) * (float)(1 << (h >> 61));
        }
        OK(c, mr_comm_allreduce(c, x, n, MR_F32, MR_REDUCE_AVG));
        OK(c, mr_comm_allgather(c, x, all, n, MR_F32));
        for (int r = 1; r < g_size; r++)
            CHECK(!memcmp(all, all + (size_t)r * n, (size_t)n * sizeof *x),
                  "allreduce of %d floats: the results of rank 0 and rank %d differ", n, r);
    }
    free(x);
    free(all);
}

static void test_big(mr_comm *c) {
    const int64_t n = 10 * 1000 * 1000; /* 40 MB of f32: three pieces of at most 16 MB */
    float *x = malloc((size_t)n * sizeof *x);
    fill_exact(x, n, MR_F32, g_rank, 77);
    double t0 = now_s();
    OK(c, mr_comm_allreduce(c, x, n, MR_F32, MR_REDUCE_SUM));
    double t = now_s() - t0;
    if (g_rank == 0) printf("40 MB allreduce: %.3f s (%.2f GB/s algbw)\n", t, 4e-2 / t);
    check_exact("40 MB allreduce", x, 0, n, MR_F32, MR_REDUCE_SUM, 77);
    free(x);
}

static void test_broadcast(mr_comm *c) {
    enum { N = 100003 };
    uint8_t *b = malloc(N);
    double d[5];
    for (int root = 0; root < g_size; root++) {
        for (int i = 0; i < N; i++) b[i] = g_rank == root ? (uint8_t)(i * 31 + root) : 0;
        for (int i = 0; i < 5; i++) d[i] = g_rank == root ? root + i * 0.5 : -1;
        OK(c, mr_comm_broadcast(c, b, N, MR_U8, root));
        OK(c, mr_comm_broadcast(c, d, 5, MR_F64, root));
        int bad = 0;
        for (int i = 0; i < N; i++) bad += b[i] != (uint8_t)(i * 31 + root);
        CHECK(!bad, "broadcast u8 from %d: %d bytes wrong", root, bad);
        for (int i = 0; i < 5; i++) CHECK(d[i] == root + i * 0.5, "broadcast f64 from %d: [%d] = %g", root, i, d[i]);
    }
    free(b);
}

/* mr_comm_split: groups of two consecutive ranks (a last odd rank alone), each an independent
 * communicator ranked in the parent's order; its all-reduce sums only its members; a negative
 * color is refused. */
static void test_split(mr_comm *c) {
    mr_comm *g = NULL;
    const int color = g_rank / 2, first = 2 * color, members = first + 1 < g_size ? 2 : 1;
    OK(c, mr_comm_split(c, color, &g));
    CHECK(g && mr_comm_size(g) == members && mr_comm_rank(g) == g_rank - first, "split: rank %d of %d, want %d of %d",
          mr_comm_rank(g), mr_comm_size(g), g_rank - first, members);
    CHECK(mr_comm_backend_of(g) == MR_COMM_MPI && mr_comm_timeout(g) == mr_comm_timeout(c), "split: backend or deadline");
    int64_t v = g_rank + 1, want = 0;
    for (int r = first; r < first + members; r++) want += r + 1;
    OK(c, mr_comm_allreduce(g, &v, 1, MR_I64, MR_REDUCE_SUM));
    CHECK(v == want, "split group %d: all-reduce %lld, want %lld", color, (long long)v, (long long)want);
    mr_comm_free(g);
    mr_comm *bad = NULL;
    CHECK(mr_comm_split(c, -1, &bad) == MR_ERR_INVALID && !bad, "split: color -1 accepted");
}

/* Allgather and reduce-scatter, whole and (after shrinking the piece size) in pieces. */
static void test_gather_scatter(mr_comm *c) {
    static const int64_t sizes[] = {0, 1, 7, 5000};
    for (int pass = 0; pass < 2; pass++) {
        OK(c, mr_comm_set_max_piece_bytes(c, pass ? 4096 : 0));
        for (int si = 0; si < 4; si++)
            for (int ti = 0; ti < 3; ti++) {
                int64_t n = sizes[si];
                mr_dtype dt = k_types[ti];
                size_t es = mr_dtype_size(dt);
                char *send = malloc((size_t)(n * g_size + 1) * es), *recv = malloc((size_t)(n * g_size + 1) * es);
                char *want = malloc((size_t)(n * g_size + 1) * es);
                fill_exact(send, n, dt, g_rank, 300 + (uint64_t)ti);
                OK(c, mr_comm_allgather(c, send, recv, n, dt));
                for (int r = 0; r < g_size; r++) {
                    fill_exact(want, n, dt, r, 300 + (uint64_t)ti);
                    CHECK(!memcmp(recv + (size_t)r * (size_t)n * es, want, (size_t)n * es),
                          "allgather n=%lld %s (pass %d): block %d wrong", (long long)n, mr_dtype_name(dt), pass, r);
                }
                /* in place */
                memset(recv, 0, (size_t)n * (size_t)g_size * es);
                fill_exact(recv + (size_t)g_rank * (size_t)n * es, n, dt, g_rank, 400 + (uint64_t)ti);
                OK(c, mr_comm_allgather(c, recv + (size_t)g_rank * (size_t)n * es, recv, n, dt));
                for (int r = 0; r < g_size; r++) {
                    fill_exact(want, n, dt, r, 400 + (uint64_t)ti);
                    CHECK(!memcmp(recv + (size_t)r * (size_t)n * es, want, (size_t)n * es),
                          "in-place allgather n=%lld %s (pass %d): block %d wrong", (long long)n, mr_dtype_name(dt),
                          pass, r);
                }
                for (int op = 0; op < 2; op++) {
                    fill_exact(send, n * g_size, dt, g_rank, 500 + (uint64_t)ti);
                    OK(c, mr_comm_reduce_scatter(c, send, recv, n, dt, (mr_reduce_op)op));
                    check_exact(pass ? "reduce_scatter (pieces)" : "reduce_scatter", recv, n * g_rank, n, dt,
                                (mr_reduce_op)op, 500 + (uint64_t)ti);
                }
                free(send);
                free(recv);
                free(want);
            }
        /* a split broadcast and all-reduce too */
        int64_t n = 3000;
        double *x = malloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++) x[i] = g_rank == 1 % g_size ? (double)i : 0;
        OK(c, mr_comm_broadcast(c, x, n, MR_F64, 1 % g_size));
        int bad = 0;
        for (int64_t i = 0; i < n; i++) bad += x[i] != (double)i;
        CHECK(!bad, "split broadcast: %d wrong", bad);
        fill_exact(x, n, MR_F64, g_rank, 600);
        OK(c, mr_comm_allreduce(c, x, n, MR_F64, MR_REDUCE_SUM));
        check_exact("split allreduce", x, 0, n, MR_F64, MR_REDUCE_SUM, 600);
        free(x);
    }
    OK(c, mr_comm_set_max_piece_bytes(c, 0));
}

static void test_queue(mr_comm *c) {
    enum { K = 8 };
    static const int64_t sizes[K] = {1000, 1, 300000, 0, 4096, 5000000, 17, 65536};
    void *bufs[K];
    int64_t t[K + 2];
    mr_comm_queue *q = NULL;
    OK(c, mr_comm_queue_new(c, &q));
    for (int k = 0; k < K; k++) {
        mr_dtype dt = k_types[k % 3];
        bufs[k] = malloc((size_t)sizes[k] * 8 + 8);
        fill_exact(bufs[k], sizes[k], dt, g_rank, 700 + (uint64_t)k);
        OK(c, mr_comm_queue_allreduce(q, bufs[k], sizes[k], dt, (mr_reduce_op)(k & 1), &t[k]));
        CHECK(t[k] == k + 1, "ticket %lld, want %d", (long long)t[k], k + 1);
    }
    float rs_send[64 * 3], rs_recv[3], ag_send[2], ag_recv[64 * 2];
    fill_exact(rs_send, 3 * g_size, MR_F32, g_rank, 800);
    fill_exact(ag_send, 2, MR_F32, g_rank, 801);
    OK(c, mr_comm_queue_reduce_scatter(q, rs_send, rs_recv, 3, MR_F32, MR_REDUCE_SUM, &t[K]));
    OK(c, mr_comm_queue_allgather(q, ag_send, ag_recv, 2, MR_F32, &t[K + 1]));
    /* direct collectives on the parent while the queue's thread runs (MPI_THREAD_MULTIPLE, or
     * serialised calls): one element, and the per-step agreement's sizes of 1-16 KB (recursive
     * doubling in fragments, the same tag as the queue's on its duplicate), each with its own data,
     * so that a message matched to the wrong call (the queue's, or the previous direct one) shows */
    static const int64_t direct_n[] = {1, 256, 1024, 2048, 4096};
    float *d = malloc(4096 * sizeof *d);
    for (int i = 0; i < 20; i++) {
        int64_t one = 1;
        OK(c, mr_comm_allreduce(c, &one, 1, MR_I64, MR_REDUCE_SUM));
        CHECK(one == g_size, "direct allreduce beside the queue: %lld", (long long)one);
        const int64_t n = direct_n[i % 5];
        fill_exact(d, n, MR_F32, g_rank, 900 + (uint64_t)i);
        OK(c, mr_comm_allreduce(c, d, n, MR_F32, MR_REDUCE_SUM));
        check_exact("direct allreduce beside the queue", d, 0, n, MR_F32, MR_REDUCE_SUM, 900 + (uint64_t)i);
    }
    free(d);
    for (int k = K + 1; k >= 0; k--) OK(c, mr_comm_queue_wait(q, t[k]));
    for (int k = 0; k < K; k++) {
        check_exact("queued allreduce", bufs[k], 0, sizes[k], k_types[k % 3], (mr_reduce_op)(k & 1), 700 + (uint64_t)k);
        free(bufs[k]);
    }
    check_exact("queued reduce_scatter", rs_recv, 3 * g_rank, 3, MR_F32, MR_REDUCE_SUM, 800);
    for (int r = 0; r < g_size; r++) {
        float want[2];
        fill_exact(want, 2, MR_F32, r, 801);
        CHECK(!memcmp(ag_recv + 2 * r, want, sizeof want), "queued allgather: block %d wrong", r);
    }
    double busy = mr_comm_queue_busy_seconds(q);
    CHECK(busy > 0, "queue busy seconds %g", busy);
    if (g_rank == 0) printf("queue: %d requests, %.3f s busy\n", K + 2, busy);
    mr_comm_queue_free(q);
}

/* Every rank's clock against rank 0's: the ranks of this job share a host (mpirun on one
 * machine), so CLOCK_MONOTONIC is one clock and the truth is 0: the measured offset must lie
 * within the error bound the measurement states. */
static void test_clock(mr_comm *c) {
    for (int peer = 1; peer < g_size; peer++) {
        int64_t off = -1, err = -1;
        OK(c, mr_comm_clock_offset(c, peer, 10, &off, &err));
        if (g_rank != 0) {
            CHECK(off == 0 && err == 0, "rank %d got an offset %lld +- %lld", g_rank, (long long)off, (long long)err);
            continue;
        }
        CHECK(err > 0 && err < 10000000, "peer %d: error bound %lld ns", peer, (long long)err);
        CHECK(llabs(off) <= err, "peer %d: offset %lld ns outside its error bound %lld ns (one host: the truth is 0)",
              peer, (long long)off, (long long)err);
        printf("clock of rank %d: offset %lld ns, error bound %lld ns\n", peer, (long long)off, (long long)err);
    }
}

/* ---- fault drills ------------------------------------------------------------------------------ */

static int drill(mr_comm *c, const char *mode) {
    /* hangring: an all-reduce big enough for the ring path (point-to-point steps); hangfrag: 16 KB,
     * the recursive doubling's messages in five fragments */
    int n = !strcmp(mode, "hangring") ? 1 << 20 : !strcmp(mode, "hangfrag") ? 4096 : 1000;
    float *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++) x[i] = (float)i;
    OK(c, mr_comm_barrier(c)); /* #1: everybody is up */
    if (g_rank == 1) {
        if (!strcmp(mode, "die")) {
            fprintf(stderr, "test_comm_mpi: rank 1 kills itself (SIGKILL)\n");
            raise(SIGKILL);
        } else if (!strcmp(mode, "fail")) {
            usleep(300000); /* rank 0 is inside the all-reduce by now */
            mr_comm_abort(c, 5, "loss is NaN at step 7 (injected)");
        } else { /* hang: skip the all-reduce, stuck in "compute" far past the deadline */
            sleep(120);
        }
    }
    mr_status st = mr_comm_allreduce(c, x, n, MR_F32, MR_REDUCE_SUM); /* #2 */
    if (st != MR_OK) {
        fprintf(stderr, "test_comm_mpi: rank %d: %s\n", g_rank, mr_last_error());
        mr_comm_abort(c, 3, mr_last_error());
    }
    /* not reached in a working drill (rank 1's fault must stop the job) */
    fprintf(stderr, "test_comm_mpi: rank %d: drill '%s' went on after the fault\n", g_rank, mode);
    free(x);
    mr_comm_free(c);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    int drilling = !strcmp(mode, "hang") || !strcmp(mode, "hangring") || !strcmp(mode, "hangfrag") || !strcmp(mode, "die") ||
                   !strcmp(mode, "fail");
    int serialized = !strcmp(mode, "serialized");
    if (*mode && !drilling && !serialized) {
        fprintf(stderr, "usage: %s [serialized | hang|hangring|hangfrag|die|fail [tag]]\n", argv[0]);
        return 2;
    }
    if (serialized) {
        int provided = 0;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
        if (provided >= MPI_THREAD_MULTIPLE) fprintf(stderr, "test_comm_mpi: asked for SERIALIZED, got MULTIPLE\n");
    }
    if (!mr_comm_launched_multi()) fprintf(stderr, "test_comm_mpi: warning: not started by mpirun with > 1 rank\n");
    mr_comm *c = NULL;
    mr_status st = mr_comm_mpi_new(drilling ? 2.0 : 60.0, &c);
    if (st != MR_OK) {
        fprintf(stderr, "test_comm_mpi: mr_comm_mpi_new: %s\n", mr_last_error());
        return 1;
    }
    g_rank = mr_comm_rank(c);
    g_size = mr_comm_size(c);
    if (drilling) return drill(c, mode);

    int level = 0;
    MPI_Query_thread(&level);
    if (g_rank == 0)
        printf("%d ranks; MPI thread level %d (MPI_THREAD_MULTIPLE = %d); launched_multi %d\n", g_size, level,
               MPI_THREAD_MULTIPLE, mr_comm_launched_multi());
    CHECK(mr_comm_backend_of(c) == MR_COMM_MPI, "backend %d", (int)mr_comm_backend_of(c));
    double t0 = now_s();
    test_allreduce(c);
    test_identical(c);
    test_big(c);
    test_broadcast(c);
    test_gather_scatter(c);
    test_queue(c);
    test_clock(c);
    test_split(c);
    OK(c, mr_comm_barrier(c));
    /* everybody's verdict, so that every rank exits with the same code */
    int64_t fails = g_fails;
    OK(c, mr_comm_allreduce(c, &fails, 1, MR_I64, MR_REDUCE_SUM));
    if (g_rank == 0)
        printf("%s: %lld failure(s) over %d ranks in %.2f s\n", fails ? "FAILED" : "passed", (long long)fails, g_size,
               now_s() - t0);
    mr_comm_free(c); /* the last MPI communicator: finalises MPI, unless the caller initialised it */
    if (serialized) MPI_Finalize();
    return fails ? 1 : 0;
}
