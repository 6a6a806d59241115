/* The NCCL communicator backend (distribute/comm_nccl.c) on every GPU of this machine, one process:
 * all-reduce (sum, avg; f32, f64, i64) against serial host sums, broadcast from every root,
 * allgather (also in place), reduce-scatter, a group of several collectives, argument errors
 * (host pointers, groups misused, bad constructor arguments), mr_comm_abort, and with two or more
 * GPUs a collective that one GPU never joins, which must end at the deadline with MR_ERR_COMM.
 *
 * With one GPU the collectives run outside a group (the direct path); with more, inside
 * mr_comm_nccl_group_begin/end (the only way one thread can drive several GPUs). Exits 77
 * (SKIPPED) when mirror was built without NCCL (mr_comm_nccl_new says MR_ERR_UNSUPPORTED, whose
 * message must name NCCL) or no GPU is visible. Built in every configuration: mirror's public API
 * only (device memory through the CUDA backend table). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#include "core/device.h"
#include "distribute/comm.h"

#define MAX_GPUS 8
#define TIMEOUT_S 120.0

static mr_comm *g_comms[MAX_GPUS];
static int g_devs[MAX_GPUS];
static int g_n;
static const mr_backend *g_be;

/* ---- device buffers ---------------------------------------------------------------------------- */

#define MAX_BUFS 64
static struct {
    int dev;
    void *p;
} g_bufs[MAX_BUFS];
static int g_nbufs;

static void *dev_alloc(int rank, size_t bytes) {
    void *p = NULL;
    MR_ASSERT_OK(g_be->alloc(g_devs[rank], bytes, &p));
    assert_true(g_nbufs < MAX_BUFS);
    g_bufs[g_nbufs].dev = g_devs[rank];
    g_bufs[g_nbufs++].p = p;
    return p;
}

static void free_all(void) {
    for (int i = 0; i < g_nbufs; i++) g_be->free(g_bufs[i].dev, g_bufs[i].p);
    g_nbufs = 0;
    th_free_all();
}

static void h2d(int rank, void *d, const void *h, size_t bytes) {
    MR_ASSERT_OK(g_be->copy(g_devs[rank], d, h, bytes, MR_COPY_H2D, NULL));
    MR_ASSERT_OK(g_be->stream_sync(NULL));
}

static void d2h(int rank, void *h, const void *d, size_t bytes) {
    MR_ASSERT_OK(g_be->copy(g_devs[rank], h, d, bytes, MR_COPY_D2H, NULL));
    MR_ASSERT_OK(g_be->stream_sync(NULL));
}

/* Inside a group when there are several GPUs (required), directly with one. */
static void begin(void) {
    if (g_n > 1) MR_ASSERT_OK(mr_comm_nccl_group_begin(g_comms, g_n));
}
static void end(void) {
    if (g_n > 1) MR_ASSERT_OK(mr_comm_nccl_group_end(g_comms, g_n));
}

/* n values of dt for rank r (deterministic: in [-1, 1) rounded to dt, or integers 0..199), in a
 * test-owned host buffer; vals (n) gets them as f64. */
static void *rank_vals(int r, int64_t n, mr_dtype dt, uint64_t seed, double *vals) {
    th_fill_uniform_f64(vals, n, -1, 1, seed * 131 + (uint64_t)r);
    void *h = th_alloc((size_t)n * mr_dtype_size(dt) + 1);
    for (int64_t i = 0; i < n; i++) {
        if (dt == MR_I64 || dt == MR_U8) vals[i] = floor((vals[i] + 1) * 100); /* 0..199 */
        mr_dtype_set(h, dt, i, vals[i]);
        vals[i] = mr_dtype_get(h, dt, i);
    }
    return h;
}

/* Asserts got (n of dt) matches ref: i64 exactly; f32 and f64 within the shared tolerances (NCCL
 * adds in its own order, so f32/f64 sums differ from the serial f64 reference by rounding only). */
static void compare(const char *what, const void *got, mr_dtype dt, const double *ref, int64_t n) {
    if (dt == MR_I64) {
        for (int64_t i = 0; i < n; i++)
            if ((double)((const int64_t *)got)[i] != ref[i])
                fail_msg("%s: mismatch at [%lld]: value %lld ref %.17g", what, (long long)i,
                         (long long)((const int64_t *)got)[i], ref[i]);
        return;
    }
    int ok = dt == MR_F32 ? th_compare(what, got, dt, ref, n, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE)
                          : th_compare(what, got, dt, ref, n, TOL_PARITY_F64_ATOL, TOL_PARITY_F64_RTOL,
                                       TOL_PARITY_F64_NMSE);
    assert_true(ok);
}

/* ---- collectives ------------------------------------------------------------------------------- */

static void check_allreduce(mr_dtype dt, mr_reduce_op op, int64_t n, uint64_t seed) {
    size_t bytes = (size_t)n * mr_dtype_size(dt);
    double *ref = th_alloc((size_t)n * sizeof(double)), *v = th_alloc((size_t)n * sizeof(double));
    void *d[MAX_GPUS];
    for (int r = 0; r < g_n; r++) {
        void *h = rank_vals(r, n, dt, seed, v);
        for (int64_t i = 0; i < n; i++) ref[i] += v[i]; /* serial sum in f64 */
        d[r] = dev_alloc(r, bytes);
        h2d(r, d[r], h, bytes);
    }
    if (op == MR_REDUCE_AVG)
        for (int64_t i = 0; i < n; i++) ref[i] /= g_n;
    begin();
    for (int r = 0; r < g_n; r++) MR_ASSERT_OK(mr_comm_allreduce(g_comms[r], d[r], n, dt, op));
    end();
    void *first = th_alloc(bytes), *got = th_alloc(bytes);
    char what[64];
    for (int r = 0; r < g_n; r++) {
        d2h(r, r ? got : first, d[r], bytes);
        snprintf(what, sizeof what, "allreduce %s %s rank %d", mr_dtype_name(dt), op ? "avg" : "sum", r);
        compare(what, r ? got : first, dt, ref, n);
        if (r) assert_memory_equal(got, first, bytes); /* every rank gets the same bits */
    }
    free_all();
}

static void test_allreduce(void **state) {
    (void)state;
    check_allreduce(MR_F32, MR_REDUCE_SUM, 4099, 1);
    check_allreduce(MR_F32, MR_REDUCE_AVG, 4099, 2);
    check_allreduce(MR_F64, MR_REDUCE_SUM, 1 << 16, 3);
    check_allreduce(MR_F64, MR_REDUCE_AVG, 3, 4);
    check_allreduce(MR_I64, MR_REDUCE_SUM, 1000, 5);
    check_allreduce(MR_F32, MR_REDUCE_SUM, 1 << 20, 6); /* large enough for NCCL's bandwidth path */
    check_allreduce(MR_F32, MR_REDUCE_SUM, 0, 7);       /* empty: NULL-free, still numbered */
}

static void test_broadcast(void **state) {
    (void)state;
    const mr_dtype dts[2] = {MR_F32, MR_U8};
    for (int k = 0; k < 2; k++)
        for (int root = 0; root < g_n; root++) {
            mr_dtype dt = dts[k];
            int64_t n = 1000 + root;
            size_t bytes = (size_t)n * mr_dtype_size(dt);
            double *v = th_alloc((size_t)n * sizeof(double));
            void *d[MAX_GPUS], *want = NULL;
            for (int r = 0; r < g_n; r++) {
                void *h = rank_vals(r, n, dt, 10 + (uint64_t)root, v);
                if (r == root) want = h;
                d[r] = dev_alloc(r, bytes);
                h2d(r, d[r], h, bytes);
            }
            begin();
            for (int r = 0; r < g_n; r++) MR_ASSERT_OK(mr_comm_broadcast(g_comms[r], d[r], n, dt, root));
            end();
            void *got = th_alloc(bytes);
            for (int r = 0; r < g_n; r++) {
                d2h(r, got, d[r], bytes);
                assert_memory_equal(got, want, bytes);
            }
            free_all();
        }
}

static void check_allgather(int in_place) {
    const int64_t n = 777;
    const size_t bytes = (size_t)n * sizeof(double);
    double *want = th_alloc(bytes * (size_t)g_n);
    void *send[MAX_GPUS], *recv[MAX_GPUS];
    for (int r = 0; r < g_n; r++) {
        void *h = rank_vals(r, n, MR_F64, 20, want + (size_t)r * (size_t)n);
        recv[r] = dev_alloc(r, bytes * (size_t)g_n);
        send[r] = in_place ? (char *)recv[r] + (size_t)r * bytes : dev_alloc(r, bytes);
        h2d(r, send[r], h, bytes);
    }
    begin();
    for (int r = 0; r < g_n; r++) MR_ASSERT_OK(mr_comm_allgather(g_comms[r], send[r], recv[r], n, MR_F64));
    end();
    double *got = th_alloc(bytes * (size_t)g_n);
    for (int r = 0; r < g_n; r++) {
        d2h(r, got, recv[r], bytes * (size_t)g_n);
        assert_memory_equal(got, want, bytes * (size_t)g_n);
    }
    free_all();
}

static void test_allgather(void **state) {
    (void)state;
    check_allgather(0);
    check_allgather(1);
}

static void check_reduce_scatter(mr_dtype dt, mr_reduce_op op) {
    const int64_t n = 513; /* per rank */
    const int64_t total = n * g_n;
    size_t es = mr_dtype_size(dt);
    double *ref = th_alloc((size_t)total * sizeof(double)), *v = th_alloc((size_t)total * sizeof(double));
    void *send[MAX_GPUS], *recv[MAX_GPUS];
    for (int r = 0; r < g_n; r++) {
        void *h = rank_vals(r, total, dt, 30 + (uint64_t)op, v);
        for (int64_t i = 0; i < total; i++) ref[i] += v[i];
        send[r] = dev_alloc(r, (size_t)total * es);
        recv[r] = dev_alloc(r, (size_t)n * es);
        h2d(r, send[r], h, (size_t)total * es);
    }
    if (op == MR_REDUCE_AVG)
        for (int64_t i = 0; i < total; i++) ref[i] /= g_n;
    begin();
    for (int r = 0; r < g_n; r++) MR_ASSERT_OK(mr_comm_reduce_scatter(g_comms[r], send[r], recv[r], n, dt, op));
    end();
    void *got = th_alloc((size_t)n * es);
    char what[64];
    for (int r = 0; r < g_n; r++) {
        d2h(r, got, recv[r], (size_t)n * es);
        snprintf(what, sizeof what, "reduce_scatter %s rank %d", mr_dtype_name(dt), r);
        compare(what, got, dt, ref + (size_t)r * (size_t)n, n);
    }
    free_all();
}

static void test_reduce_scatter(void **state) {
    (void)state;
    check_reduce_scatter(MR_F32, MR_REDUCE_SUM);
    check_reduce_scatter(MR_F64, MR_REDUCE_AVG);
}

/* Several all-reduces (different sizes and dtypes) and a barrier in one group, always grouped
 * (also with one GPU). */
static void test_group(void **state) {
    (void)state;
    enum { K = 4 };
    const int64_t ns[K] = {1, 1000, 65537, 17};
    const mr_dtype dts[K] = {MR_F32, MR_F64, MR_F32, MR_I64};
    double *ref[K], *v = th_alloc(65537 * sizeof(double));
    void *d[K][MAX_GPUS];
    for (int k = 0; k < K; k++) {
        ref[k] = th_alloc((size_t)ns[k] * sizeof(double));
        for (int r = 0; r < g_n; r++) {
            void *h = rank_vals(r, ns[k], dts[k], 40 + (uint64_t)k, v);
            for (int64_t i = 0; i < ns[k]; i++) ref[k][i] += v[i];
            d[k][r] = dev_alloc(r, (size_t)ns[k] * mr_dtype_size(dts[k]));
            h2d(r, d[k][r], h, (size_t)ns[k] * mr_dtype_size(dts[k]));
        }
    }
    MR_ASSERT_OK(mr_comm_nccl_group_begin(g_comms, g_n));
    for (int k = 0; k < K; k++)
        for (int r = 0; r < g_n; r++)
            MR_ASSERT_OK(mr_comm_allreduce(g_comms[r], d[k][r], ns[k], dts[k], MR_REDUCE_SUM));
    for (int r = 0; r < g_n; r++) MR_ASSERT_OK(mr_comm_barrier(g_comms[r]));
    MR_ASSERT_OK(mr_comm_nccl_group_end(g_comms, g_n));
    for (int k = 0; k < K; k++) {
        void *got = th_alloc((size_t)ns[k] * mr_dtype_size(dts[k]));
        for (int r = 0; r < g_n; r++) {
            d2h(r, got, d[k][r], (size_t)ns[k] * mr_dtype_size(dts[k]));
            compare("grouped allreduce", got, dts[k], ref[k], ns[k]);
        }
    }
    free_all();
}

/* ---- errors ------------------------------------------------------------------------------------ */

static void expect(mr_status got, mr_status want, const char *needle) {
    if (got != want) fail_msg("got %s, want %s: %s", mr_status_name(got), mr_status_name(want), mr_last_error());
    if (needle && !strstr(mr_last_error(), needle)) fail_msg("message lacks \"%s\": %s", needle, mr_last_error());
}

static void test_errors(void **state) {
    (void)state;
    mr_comm *c = g_comms[0], *tmp[2] = {NULL, NULL};
    assert_int_equal(mr_comm_backend_of(c), MR_COMM_NCCL);
    assert_int_equal(mr_comm_size(c), g_n);
    for (int r = 0; r < g_n; r++) assert_int_equal(mr_comm_rank(g_comms[r]), r);

    /* constructor arguments */
    int dup[2] = {g_devs[0], g_devs[0]}, far = mr_cuda_device_count();
    expect(mr_comm_nccl_new(g_devs, 1, NULL, 0, tmp), MR_ERR_INVALID, "timeout");
    expect(mr_comm_nccl_new(g_devs, 0, NULL, 1, tmp), MR_ERR_INVALID, "n_local");
    expect(mr_comm_nccl_new(NULL, 1, NULL, 1, tmp), MR_ERR_INVALID, "devices");
    expect(mr_comm_nccl_new(dup, 2, NULL, 1, tmp), MR_ERR_INVALID, "twice");
    expect(mr_comm_nccl_new(&far, 1, NULL, 1, tmp), MR_ERR_NOT_FOUND, "does not exist");
    expect(mr_comm_nccl_new(g_devs, 1, c, 1, tmp), MR_ERR_INVALID, "boot");
    assert_null(tmp[0]);

    /* collective arguments (each rejected before anything runs) */
    float h[4] = {0};
    void *d = dev_alloc(0, 64);
    begin();
    expect(mr_comm_allreduce(c, h, 4, MR_F32, MR_REDUCE_SUM), MR_ERR_INVALID, "device");
    expect(mr_comm_allreduce(c, d, -1, MR_F32, MR_REDUCE_SUM), MR_ERR_INVALID, "negative");
    expect(mr_comm_allreduce(c, d, 4, MR_U8, MR_REDUCE_SUM), MR_ERR_UNSUPPORTED, "reduce");
    expect(mr_comm_broadcast(c, d, 4, MR_F32, g_n), MR_ERR_INVALID, "root");
    expect(mr_comm_allgather(c, h, d, 1, MR_F32), MR_ERR_INVALID, "device");
    end();
    mr_comm_queue *q = NULL;
    expect(mr_comm_queue_new(c, &q), MR_ERR_UNSUPPORTED, "group");
    assert_null(q);
    if (g_n > 1) /* several GPUs of one thread can only run a collective together */
        expect(mr_comm_allreduce(c, d, 4, MR_F32, MR_REDUCE_SUM), MR_ERR_INVALID, "group");

    /* groups misused; none of these leaves a group open */
    expect(mr_comm_nccl_group_end(g_comms, g_n), MR_ERR_INVALID, "no group");
    expect(mr_comm_nccl_group_begin(NULL, 1), MR_ERR_INVALID, NULL);
    expect(mr_comm_nccl_group_begin(g_comms, 0), MR_ERR_INVALID, NULL);
    mr_comm *twice[2] = {c, c};
    expect(mr_comm_nccl_group_begin(twice, 2), MR_ERR_INVALID, "twice");
    MR_ASSERT_OK(mr_comm_nccl_group_begin(g_comms, g_n));
    expect(mr_comm_nccl_group_begin(g_comms, g_n), MR_ERR_INVALID, "nest");
    expect(mr_comm_nccl_group_end(g_comms, g_n + 1), MR_ERR_INVALID, NULL);
    MR_ASSERT_OK(mr_comm_nccl_group_end(g_comms, g_n)); /* an empty group */

    /* the communicators still work after all that */
    begin();
    for (int r = 0; r < g_n; r++) MR_ASSERT_OK(mr_comm_barrier(g_comms[r]));
    end();
    free_all();
}

/* mr_comm_abort on a communicator of its own (device 0): later collectives fail at once. */
static void test_abort(void **state) {
    (void)state;
    mr_comm *c = NULL;
    MR_ASSERT_OK(mr_comm_nccl_new(g_devs, 1, NULL, 10, &c));
    void *d = dev_alloc(0, 16);
    MR_ASSERT_OK(mr_comm_allreduce(c, d, 4, MR_F32, MR_REDUCE_SUM));
    mr_comm_abort(c, 3, "test abort");
    expect(mr_comm_allreduce(c, d, 4, MR_F32, MR_REDUCE_SUM), MR_ERR_COMM, "test abort");
    expect(mr_comm_barrier(c), MR_ERR_COMM, "failed earlier");
    mr_comm_free(c);
    free_all();
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Two GPUs, but only the first enters the all-reduce: it must end at the deadline (2 s) with
 * MR_ERR_COMM naming the collective, and both communicators are broken afterwards. */
static void test_deadline(void **state) {
    (void)state;
    if (g_n < 2) {
        printf("  (deadline test needs 2 GPUs; %d visible)\n", g_n);
        return;
    }
    mr_comm *c[2] = {NULL, NULL};
    MR_ASSERT_OK(mr_comm_nccl_new(g_devs, 2, NULL, 2.0, c));
    void *d = dev_alloc(0, 4096);
    double t0 = now_s();
    MR_ASSERT_OK(mr_comm_nccl_group_begin(c, 1));
    MR_ASSERT_OK(mr_comm_allreduce(c[0], d, 1024, MR_F32, MR_REDUCE_SUM));
    expect(mr_comm_nccl_group_end(c, 1), MR_ERR_COMM, "allreduce #1 (1024 f32 sum)");
    assert_non_null(strstr(mr_last_error(), "no progress"));
    assert_true(now_s() - t0 < 30); /* 2 s deadline, plus the abort */
    expect(mr_comm_nccl_group_begin(&c[1], 1), MR_ERR_COMM, "failed earlier");
    mr_comm_free(c[0]);
    mr_comm_free(c[1]);
    free_all();
}

int main(void) {
    int ndev = mr_cuda_device_count(), dev0 = 0;
    mr_comm *probe = NULL;
    if (ndev <= 0) {
        /* no GPU: still check that a build without NCCL says so clearly */
        mr_status st = mr_comm_nccl_new(&dev0, 1, NULL, 10, &probe);
        if (st == MR_ERR_UNSUPPORTED && !strstr(mr_last_error(), "NCCL")) {
            printf("FAILED: the stub's message does not name NCCL: %s\n", mr_last_error());
            return 1;
        }
        printf("SKIPPED: %s%s\n", st == MR_ERR_UNSUPPORTED ? "" : "no GPU visible: ", mr_last_error());
        mr_comm_free(probe);
        return 77;
    }
    g_n = ndev < MAX_GPUS ? ndev : MAX_GPUS;
    for (int i = 0; i < g_n; i++) g_devs[i] = i;
    mr_status st = mr_comm_nccl_new(g_devs, g_n, NULL, TIMEOUT_S, g_comms);
    if (st == MR_ERR_UNSUPPORTED) {
        printf("SKIPPED: %s\n", mr_last_error());
        return 77;
    }
    if (st != MR_OK) {
        printf("FAILED: mr_comm_nccl_new on %d GPUs: %s\n", g_n, mr_last_error());
        return 1;
    }
    if (mr_backend_get(MR_DEVICE_CUDA, &g_be) != MR_OK) {
        printf("FAILED: %s\n", mr_last_error());
        return 1;
    }
    printf("NCCL communicators on %d GPU(s)\n", g_n);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce), cmocka_unit_test(test_broadcast), cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_reduce_scatter), cmocka_unit_test(test_group), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_abort), cmocka_unit_test(test_deadline),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < g_n; i++) mr_comm_free(g_comms[i]);
    return rc;
}
