/* distribute/comm: the local backend (n replicas on n threads of this process) against serial
 * references: all-reduce sum/avg bit-equal to a loop over the ranks in order (f32, f64, i64;
 * sizes 0 .. 1<<20; 1..4 replicas), broadcast from every root, allgather (also in place),
 * reduce-scatter, barrier ordering, the asynchronous queue (several requests in flight, waited out
 * of order), and the never-hang contract: a replica that does not come makes the others fail
 * with MR_ERR_COMM at the deadline naming the collective and the missing rank; calls that disagree
 * fail at once; mr_comm_abort makes the others (and their queues) fail promptly naming the rank
 * and the reason. Replica threads record failures; the main thread asserts (cmocka's asserts
 * must not run on other threads). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "core/trace.h"
#include "distribute/comm.h"

/* ---- replica threads --------------------------------------------------------------------------- */

typedef struct replica {
    mr_comm *c;
    int rank, size;
    void *arg;
    int failed;
    char msg[1024];
    mr_status st;  /* for the fault tests: the status of the collective under test */
    double secs;   /* ... and how long it took */
    char err[1024]; /* ... and its message */
} replica;

typedef void (*replica_fn)(replica *r);

typedef struct thread_arg {
    replica *r;
    replica_fn fn;
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *a = p;
    a->fn(a->r);
    return NULL;
}

/* Runs fn on n fresh local replicas (timeout_s), one thread each, then asserts none failed. */
static void run_replicas(int n, double timeout_s, replica_fn fn, void *arg, replica *out) {
    mr_comm *comms[8] = {0};
    pthread_t th[8];
    thread_arg ta[8];
    assert_true(n <= 8);
    MR_ASSERT_OK(mr_comm_local_new(n, timeout_s, comms));
    for (int r = 0; r < n; r++) {
        memset(&out[r], 0, sizeof out[r]);
        out[r].c = comms[r];
        out[r].rank = r;
        out[r].size = n;
        out[r].arg = arg;
        assert_int_equal(mr_comm_rank(comms[r]), r);
        assert_int_equal(mr_comm_size(comms[r]), n);
        assert_int_equal(mr_comm_backend_of(comms[r]), MR_COMM_LOCAL);
        ta[r] = (thread_arg){&out[r], fn};
        assert_int_equal(pthread_create(&th[r], NULL, thread_main, &ta[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) mr_comm_free(comms[r]);
    for (int r = 0; r < n; r++)
        if (out[r].failed) fail_msg("%d replicas, rank %d: %s", n, r, out[r].msg);
}

#define R_FAIL(r, ...)                                                                            \
    do {                                                                                          \
        if (!(r)->failed) {                                                                       \
            (r)->failed = 1;                                                                      \
            snprintf((r)->msg, sizeof (r)->msg, __VA_ARGS__);                                     \
        }                                                                                         \
        return;                                                                                   \
    } while (0)

#define R_OK(r, expr)                                                                             \
    do {                                                                                          \
        mr_status s_ = (expr);                                                                    \
        if (s_ != MR_OK) R_FAIL(r, "line %d: %s -> %s: %s", __LINE__, #expr, mr_status_name(s_), mr_last_error()); \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- data -------------------------------------------------------------------------------------- */

static uint64_t mix(uint64_t x) { /* splitmix64 */
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Element i of rank's data for a case: values of several magnitudes, so that the order of the
 * additions shows in the bits. */
static void put(void *buf, mr_dtype dt, int64_t i, uint64_t seed, int rank) {
    uint64_t h = mix(seed * 0x100000001b3ULL ^ mix((uint64_t)rank * 0x9e3779b9ULL ^ mix((uint64_t)i)));
    double scale = (double)(1u << (h & 7));
    if (dt == MR_F32) ((float *)buf)[i] = (float)((double)(h >> 40) / 16777216.0 * 2.0 - 1.0) * (float)scale;
    else if (dt == MR_F64) ((double *)buf)[i] = ((double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale;
    else if (dt == MR_I64) ((int64_t *)buf)[i] = (int64_t)(h >> 20) - ((int64_t)1 << 43);
    else ((uint8_t *)buf)[i] = (uint8_t)(h >> 56);
}

static void fill(void *buf, int64_t n, mr_dtype dt, uint64_t seed, int rank) {
    for (int64_t i = 0; i < n; i++) put(buf, dt, i, seed, rank);
}

/* out = rank 0's + rank 1's + ... in rank order, in dt; then / size for AVG. Elements [lo, lo+n)
 * of each rank's data. */
static void serial_reduce(void *out, int64_t lo, int64_t n, mr_dtype dt, mr_reduce_op op, uint64_t seed, int size) {
    size_t es = mr_dtype_size(dt);
    char *tmp = malloc((size_t)(lo + n) * es + 1);
    for (int q = 0; q < size; q++) {
        fill(tmp, lo + n, dt, seed, q);
        for (int64_t i = 0; i < n; i++) {
            if (dt == MR_F32) {
                float v = ((float *)tmp)[lo + i];
                ((float *)out)[i] = q ? ((float *)out)[i] + v : v;
            } else if (dt == MR_F64) {
                double v = ((double *)tmp)[lo + i];
                ((double *)out)[i] = q ? ((double *)out)[i] + v : v;
            } else {
                int64_t v = ((int64_t *)tmp)[lo + i];
                ((int64_t *)out)[i] = q ? ((int64_t *)out)[i] + v : v;
            }
        }
    }
    if (op == MR_REDUCE_AVG) {
        for (int64_t i = 0; i < n; i++) {
            if (dt == MR_F32) ((float *)out)[i] /= (float)size;
            else if (dt == MR_F64) ((double *)out)[i] /= (double)size;
            else ((int64_t *)out)[i] /= size;
        }
    }
    free(tmp);
}

/* Index of the first element whose bits differ, or -1. */
static int64_t first_diff(const void *a, const void *b, int64_t n, size_t es) {
    if (n == 0 || memcmp(a, b, (size_t)n * es) == 0) return -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es)) return i;
    return -1;
}

static double as_double(const void *buf, mr_dtype dt, int64_t i) {
    return dt == MR_I64 ? (double)((const int64_t *)buf)[i] : mr_dtype_get(buf, dt, i);
}

static const mr_dtype k_red_types[] = {MR_F32, MR_F64, MR_I64};

/* ---- allreduce --------------------------------------------------------------------------------- */

static void allreduce_body(replica *r) {
    static const int64_t sizes[] = {0, 1, 7, 1000, 1 << 20};
    int64_t big = 1 << 20;
    char *buf = malloc((size_t)big * 8 + 8), *ref = malloc((size_t)big * 8 + 8);
    if (!buf || !ref) R_FAIL(r, "out of memory");
    uint64_t seed = 1;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (int ti = 0; ti < 3; ti++) {
            for (int op = 0; op < 2; op++, seed++) {
                int64_t n = sizes[si];
                mr_dtype dt = k_red_types[ti];
                /* sanitizer builds: the 1<<20 case for f32 sum only */
                if (th_quick() && n == big && (dt != MR_F32 || op)) continue;
                fill(buf, n, dt, seed, r->rank);
                mr_status st = mr_comm_allreduce(r->c, n ? buf : NULL, n, dt, (mr_reduce_op)op);
                if (st != MR_OK) {
                    free(buf);
                    free(ref);
                    R_FAIL(r, "allreduce n=%lld %s op %d: %s", (long long)n, mr_dtype_name(dt), op, mr_last_error());
                }
                serial_reduce(ref, 0, n, dt, (mr_reduce_op)op, seed, r->size);
                int64_t i = first_diff(buf, ref, n, mr_dtype_size(dt));
                if (i >= 0) {
                    double v = as_double(buf, dt, i), e = as_double(ref, dt, i);
                    free(buf);
                    free(ref);
                    R_FAIL(r, "allreduce n=%lld %s %s: element %lld is %.17g, serial rank-order %.17g (not bit-equal)",
                           (long long)n, mr_dtype_name(dt), op ? "avg" : "sum", (long long)i, v, e);
                }
            }
        }
    }
    free(buf);
    free(ref);
}

static void test_allreduce(void **state) {
    (void)state;
    replica r[4];
    for (int n = 1; n <= 4; n++) run_replicas(n, 60, allreduce_body, NULL, r);
}

/* ---- broadcast, allgather, reduce_scatter, barrier --------------------------------------------- */

static void broadcast_body(replica *r) {
    static const mr_dtype types[] = {MR_F32, MR_F64, MR_I64, MR_U8, MR_F16, MR_I32};
    enum { N = 333 };
    char buf[N * 8], want[N * 8];
    for (int root = 0; root < r->size; root++) {
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            mr_dtype dt = types[ti];
            size_t bytes = N * mr_dtype_size(dt);
            uint64_t seed = 100 + (uint64_t)root * 10 + ti;
            /* f16 and i32 are moved as bytes: fill them as u8 */
            mr_dtype fdt = (dt == MR_F16 || dt == MR_I32) ? MR_U8 : dt;
            int64_t fn = (int64_t)(bytes / mr_dtype_size(fdt));
            if (r->rank == root) fill(buf, fn, fdt, seed, root);
            else memset(buf, 0xab, bytes);
            R_OK(r, mr_comm_broadcast(r->c, buf, N, dt, root));
            fill(want, fn, fdt, seed, root);
            if (memcmp(buf, want, bytes)) R_FAIL(r, "broadcast %s from root %d: wrong data", mr_dtype_name(dt), root);
        }
    }
    R_OK(r, mr_comm_broadcast(r->c, NULL, 0, MR_F32, r->size - 1));
}

static void test_broadcast(void **state) {
    (void)state;
    replica r[4];
    for (int n = 1; n <= 4; n++) run_replicas(n, 60, broadcast_body, NULL, r);
}

static void allgather_body(replica *r) {
    enum { N = 5 };
    for (int ti = 0; ti < 3; ti++) {
        mr_dtype dt = k_red_types[ti];
        size_t es = mr_dtype_size(dt);
        char send[N * 8], recv[4 * N * 8], want[N * 8];
        fill(send, N, dt, 200 + ti, r->rank);
        memset(recv, 0, sizeof recv);
        R_OK(r, mr_comm_allgather(r->c, send, recv, N, dt));
        for (int q = 0; q < r->size; q++) {
            fill(want, N, dt, 200 + ti, q);
            if (memcmp(recv + (size_t)q * N * es, want, N * es))
                R_FAIL(r, "allgather %s: block of rank %d wrong", mr_dtype_name(dt), q);
        }
        /* in place: this rank's block already sits at recv + rank * N */
        memset(recv, 0, sizeof recv);
        fill(recv + (size_t)r->rank * N * es, N, dt, 300 + ti, r->rank);
        R_OK(r, mr_comm_allgather(r->c, recv + (size_t)r->rank * N * es, recv, N, dt));
        for (int q = 0; q < r->size; q++) {
            fill(want, N, dt, 300 + ti, q);
            if (memcmp(recv + (size_t)q * N * es, want, N * es))
                R_FAIL(r, "in-place allgather %s: block of rank %d wrong", mr_dtype_name(dt), q);
        }
    }
    R_OK(r, mr_comm_allgather(r->c, NULL, NULL, 0, MR_U8));
}

static void test_allgather(void **state) {
    (void)state;
    replica r[4];
    for (int n = 1; n <= 4; n++) run_replicas(n, 60, allgather_body, NULL, r);
}

static void reduce_scatter_body(replica *r) {
    static const int64_t sizes[] = {0, 1, 7, 1000};
    char *send = malloc(4 * 1000 * 8), *recv = malloc(1000 * 8), *ref = malloc(1000 * 8);
    uint64_t seed = 400;
    for (size_t si = 0; si < 4; si++) {
        for (int ti = 0; ti < 3; ti++) {
            for (int op = 0; op < 2; op++, seed++) {
                int64_t n = sizes[si];
                mr_dtype dt = k_red_types[ti];
                fill(send, n * r->size, dt, seed, r->rank);
                mr_status st = mr_comm_reduce_scatter(r->c, send, recv, n, dt, (mr_reduce_op)op);
                if (st == MR_OK) {
                    serial_reduce(ref, n * r->rank, n, dt, (mr_reduce_op)op, seed, r->size);
                    int64_t i = first_diff(recv, ref, n, mr_dtype_size(dt));
                    if (i >= 0) {
                        snprintf(r->msg, sizeof r->msg,
                                 "reduce_scatter n=%lld %s op %d: element %lld is %.17g, want %.17g", (long long)n,
                                 mr_dtype_name(dt), op, (long long)i, as_double(recv, dt, i), as_double(ref, dt, i));
                        r->failed = 1;
                    }
                } else {
                    snprintf(r->msg, sizeof r->msg, "reduce_scatter: %s", mr_last_error());
                    r->failed = 1;
                }
                if (r->failed) goto out;
            }
        }
    }
out:
    free(send);
    free(recv);
    free(ref);
}

static void test_reduce_scatter(void **state) {
    (void)state;
    replica r[4];
    for (int n = 1; n <= 4; n++) run_replicas(n, 60, reduce_scatter_body, NULL, r);
}

static void barrier_body(replica *r) {
    atomic_int *count = r->arg;
    for (int k = 0; k < 20; k++) {
        if (r->rank == k % r->size) sleep_s(0.002); /* one late replica per round */
        atomic_fetch_add(count, 1);
        R_OK(r, mr_comm_barrier(r->c));
        int seen = atomic_load(count);
        if (seen < (k + 1) * r->size) R_FAIL(r, "barrier %d passed with %d of %d arrivals", k, seen, (k + 1) * r->size);
        R_OK(r, mr_comm_barrier(r->c)); /* nobody starts round k+1 before all checked round k */
    }
}

static void test_barrier(void **state) {
    (void)state;
    replica r[4];
    for (int n = 1; n <= 4; n++) {
        atomic_int count = 0;
        run_replicas(n, 60, barrier_body, &count, r);
    }
}

/* ---- the queue --------------------------------------------------------------------------------- */

static void queue_body(replica *r) {
    enum { K = 6 };
    static const int64_t sizes[K] = {1000, 1, 70000, 0, 4096, 123457};
    void *bufs[K], *ref = malloc(123457 * 8);
    int64_t tickets[K + 2];
    mr_comm_queue *q = NULL;
    R_OK(r, mr_comm_queue_new(r->c, &q));
    for (int k = 0; k < K; k++) {
        mr_dtype dt = k_red_types[k % 3];
        bufs[k] = malloc((size_t)sizes[k] * 8 + 8);
        fill(bufs[k], sizes[k], dt, 500 + k, r->rank);
        R_OK(r, mr_comm_queue_allreduce(q, bufs[k], sizes[k], dt, (mr_reduce_op)(k & 1), &tickets[k]));
        if (tickets[k] != k + 1) R_FAIL(r, "ticket %lld, want %d", (long long)tickets[k], k + 1);
    }
    /* a reduce-scatter and an allgather behind them */
    float rs_send[4 * 3], rs_recv[3], ag_send[2], ag_recv[4 * 2];
    fill(rs_send, 3 * r->size, MR_F32, 600, r->rank);
    fill(ag_send, 2, MR_F32, 601, r->rank);
    R_OK(r, mr_comm_queue_reduce_scatter(q, rs_send, rs_recv, 3, MR_F32, MR_REDUCE_SUM, &tickets[K]));
    R_OK(r, mr_comm_queue_allgather(q, ag_send, ag_recv, 2, MR_F32, &tickets[K + 1]));
    /* a direct collective on the parent communicator meanwhile: the queue has its own */
    int64_t one = 1;
    R_OK(r, mr_comm_allreduce(r->c, &one, 1, MR_I64, MR_REDUCE_SUM));
    if (one != r->size) R_FAIL(r, "direct allreduce beside the queue: %lld", (long long)one);
    int32_t flags[3] = {r->rank, 1, r->rank == 0 ? -5 : 0}; /* i32 sums: the trainer's per-parameter flags */
    R_OK(r, mr_comm_allreduce(r->c, flags, 3, MR_I32, MR_REDUCE_SUM));
    if (flags[0] != r->size * (r->size - 1) / 2 || flags[1] != r->size || flags[2] != -5)
        R_FAIL(r, "i32 allreduce: %d %d %d", (int)flags[0], (int)flags[1], (int)flags[2]);
    for (int k = K + 1; k >= 0; k--) R_OK(r, mr_comm_queue_wait(q, tickets[k])); /* out of order */
    R_OK(r, mr_comm_queue_wait(q, tickets[2])); /* waiting twice is fine */
    for (int k = 0; k < K; k++) {
        mr_dtype dt = k_red_types[k % 3];
        serial_reduce(ref, 0, sizes[k], dt, (mr_reduce_op)(k & 1), 500 + k, r->size);
        if (first_diff(bufs[k], ref, sizes[k], mr_dtype_size(dt)) >= 0)
            R_FAIL(r, "queued allreduce %d (%lld %s) wrong", k, (long long)sizes[k], mr_dtype_name(dt));
        free(bufs[k]);
    }
    serial_reduce(ref, 3 * r->rank, 3, MR_F32, MR_REDUCE_SUM, 600, r->size);
    if (memcmp(rs_recv, ref, sizeof rs_recv)) R_FAIL(r, "queued reduce_scatter wrong");
    for (int p = 0; p < r->size; p++) {
        float want[2];
        fill(want, 2, MR_F32, 601, p);
        if (memcmp(ag_recv + 2 * p, want, sizeof want)) R_FAIL(r, "queued allgather: block %d wrong", p);
    }
    if (mr_comm_queue_wait(q, K + 3) != MR_ERR_INVALID) R_FAIL(r, "waiting an unknown ticket did not fail");
    if (!(mr_comm_queue_busy_seconds(q) > 0)) R_FAIL(r, "busy seconds %g", mr_comm_queue_busy_seconds(q));
    mr_comm_queue_free(q);
    free(ref);
}

static void test_queue(void **state) {
    (void)state;
    replica r[4];
    for (int n = 1; n <= 4; n++) run_replicas(n, 60, queue_body, NULL, r);
}

/* ---- clocks and trace spans ------------------------------------------------------------------- */

/* The ping-pong on one clock (threads of one process): the measured offset lies within its own
 * error bound (the truth is 0), the bound is small, the others get zeros; bad arguments fail. */
static void clock_body(replica *r) {
    for (int peer = 1; peer < r->size; peer++) {
        int64_t off = -1, err = -1;
        R_OK(r, mr_comm_clock_offset(r->c, peer, 10, &off, &err));
        if (r->rank != 0 && (off != 0 || err != 0)) R_FAIL(r, "rank %d got %lld +- %lld", r->rank, (long long)off, (long long)err);
        if (r->rank == 0 && (err <= 0 || err > 100000000 || llabs(off) > err))
            R_FAIL(r, "peer %d: offset %lld ns outside its bound %lld ns (one clock: the truth is 0)", peer, (long long)off,
                   (long long)err);
        if (r->rank == 0 && peer == 1) snprintf(r->err, sizeof r->err, "offset %lld ns, error %lld ns", (long long)off, (long long)err);
    }
    int64_t off, err;
    if (mr_comm_clock_offset(r->c, 0, 10, &off, &err) != MR_ERR_INVALID) R_FAIL(r, "peer 0 accepted");
    if (mr_comm_clock_offset(r->c, r->size, 10, &off, &err) != MR_ERR_INVALID) R_FAIL(r, "peer %d accepted", r->size);
    if (mr_comm_clock_offset(r->c, 1, 0, &off, &err) != MR_ERR_INVALID) R_FAIL(r, "0 rounds accepted");
}

static void test_clock_offset(void **state) {
    (void)state;
    replica r[3];
    for (int n = 2; n <= 3; n++) {
        run_replicas(n, 60, clock_body, NULL, r);
        printf("%d replicas: %s\n", n, r[0].err);
    }
}

/* A traced communicator: one span per collective (name, bytes, seq) inside the window; the
 * queue's spans on its own track with a flow from each submit. */
static void trace_body(replica *r) {
    mr_trace *t = NULL;
    mr_trace_track *k = NULL, *q = NULL;
    mr_comm_queue *queue = NULL;
    R_OK(r, mr_trace_new(r->rank, "replica", NULL, &t));
    R_OK(r, mr_trace_add_track(t, "training", 1, &k));
    R_OK(r, mr_trace_add_track(t, "communication", 2, &q));
    R_OK(r, mr_trace_reserve(k, 64));
    R_OK(r, mr_trace_reserve(q, 64));
    R_OK(r, mr_comm_queue_new(r->c, &queue));
    mr_comm_set_trace(r->c, k);
    mr_comm_queue_set_trace(queue, q, k);
    float x[100] = {0}, y[40] = {0};
    R_OK(r, mr_comm_allreduce(r->c, x, 100, MR_F32, MR_REDUCE_SUM)); /* before the window: not traced */
    mr_trace_start(t);
    R_OK(r, mr_comm_allreduce(r->c, x, 100, MR_F32, MR_REDUCE_SUM));
    R_OK(r, mr_comm_allgather(r->c, x, y, 10, MR_F32));
    int64_t ticket = 0;
    R_OK(r, mr_comm_queue_allreduce(queue, x + 50, 50, MR_F32, MR_REDUCE_AVG, &ticket));
    R_OK(r, mr_comm_queue_wait(queue, ticket));
    mr_trace_stop(t);
    mr_comm_queue_free(queue); /* the queue's thread is gone: its track can be read */
    mr_trace_event e;
    if (mr_trace_stats_of(t, 0).events != 3 || mr_trace_stats_of(t, 1).events != 2)
        R_FAIL(r, "%lld training and %lld queue events, expected 3 and 2", (long long)mr_trace_stats_of(t, 0).events,
               (long long)mr_trace_stats_of(t, 1).events);
    if (!mr_trace_event_get(t, 0, 0, &e) || strcmp(e.name, "allreduce") || e.v1 != 400 || strcmp(e.k2, "seq") || e.v2 != 3)
        R_FAIL(r, "the traced all-reduce: %s bytes %lld seq %lld", e.name, (long long)e.v1, (long long)e.v2);
    if (!mr_trace_event_get(t, 0, 1, &e) || strcmp(e.name, "allgather") || e.v1 != 40 * r->size)
        R_FAIL(r, "the traced allgather: %s bytes %lld", e.name, (long long)e.v1);
    if (!mr_trace_event_get(t, 0, 2, &e) || e.ph != 's' || e.v1 != ticket) R_FAIL(r, "no flow start for the submit");
    if (!mr_trace_event_get(t, 1, 0, &e) || e.ph != 'f' || e.v1 != ticket) R_FAIL(r, "no flow end on the queue");
    const int64_t f0 = e.t0;
    if (!mr_trace_event_get(t, 1, 1, &e) || strcmp(e.name, "allreduce") || e.v1 != 200 || e.t0 != f0)
        R_FAIL(r, "the queued all-reduce: %s bytes %lld", e.name, (long long)e.v1);
    mr_comm_set_trace(r->c, NULL);
    mr_trace_free(t);
}

static void test_trace_spans(void **state) {
    (void)state;
    replica r[2];
    run_replicas(2, 60, trace_body, NULL, r);
}

/* ---- never hang -------------------------------------------------------------------------------- */

/* Rank 2 of 3 never calls the all-reduce. */
static void missing_body(replica *r) {
    float x[10] = {0};
    if (r->rank == 2) {
        sleep_s(1.0); /* well past the others' deadline */
        mr_status st = mr_comm_barrier(r->c);
        if (st != MR_ERR_COMM) R_FAIL(r, "the late rank's barrier after the failure: %s", mr_status_name(st));
        return;
    }
    double t0 = now_s();
    r->st = mr_comm_allreduce(r->c, x, 10, MR_F32, MR_REDUCE_SUM);
    r->secs = now_s() - t0;
    snprintf(r->err, sizeof r->err, "%s", mr_last_error());
    /* and the communicator stays broken, failing at once */
    t0 = now_s();
    mr_status st = mr_comm_barrier(r->c);
    if (st != MR_ERR_COMM || now_s() - t0 > 0.1) R_FAIL(r, "barrier after the failure: %s", mr_status_name(st));
}

static void test_missing_replica(void **state) {
    (void)state;
    replica r[3];
    run_replicas(3, 0.5, missing_body, NULL, r);
    for (int k = 0; k < 2; k++) {
        printf("rank %d after %.3f s: %s\n", k, r[k].secs, r[k].err);
        assert_int_equal(r[k].st, MR_ERR_COMM);
        assert_true(r[k].secs >= 0.45);
        assert_true(r[k].secs < 3.0); /* the deadline, plus slack for sanitizer builds */
        assert_non_null(strstr(r[k].err, "allreduce #1"));
        assert_non_null(strstr(r[k].err, "rank 2"));
    }
    /* the first to time out says so, with the HINT */
    assert_true(strstr(r[0].err, "no progress") || strstr(r[1].err, "no progress"));
    assert_true(strstr(r[0].err, "HINT") || strstr(r[1].err, "HINT"));
}

/* Rank 1 calls a broadcast where rank 0 calls an all-reduce. */
static void mismatch_body(replica *r) {
    float x[4] = {0};
    double t0 = now_s();
    r->st = r->rank == 0 ? mr_comm_allreduce(r->c, x, 4, MR_F32, MR_REDUCE_SUM)
                         : mr_comm_broadcast(r->c, x, 4, MR_F32, 0);
    r->secs = now_s() - t0;
    snprintf(r->err, sizeof r->err, "%s", mr_last_error());
}

static void test_mismatch(void **state) {
    (void)state;
    replica r[2];
    run_replicas(2, 30, mismatch_body, NULL, r);
    for (int k = 0; k < 2; k++) {
        printf("rank %d after %.3f s: %s\n", k, r[k].secs, r[k].err);
        assert_int_equal(r[k].st, MR_ERR_COMM);
        assert_true(r[k].secs < 1.0);
        assert_non_null(strstr(r[k].err, "collectives differ"));
        assert_non_null(strstr(r[k].err, "broadcast #1"));
    }
}

/* Rank 2 of 3 aborts while the others wait in an all-reduce, and in a queued one. */
static void abort_body(replica *r) {
    float x[10] = {0}, y[10] = {0};
    mr_comm_queue *q = NULL;
    R_OK(r, mr_comm_queue_new(r->c, &q));
    if (r->rank == 2) {
        sleep_s(0.1);
        mr_comm_abort(r->c, 3, "loss is NaN at step 7");
        mr_comm_queue_free(q);
        return;
    }
    int64_t t = 0;
    R_OK(r, mr_comm_queue_allreduce(q, y, 10, MR_F32, MR_REDUCE_SUM, &t));
    double t0 = now_s();
    r->st = mr_comm_allreduce(r->c, x, 10, MR_F32, MR_REDUCE_SUM);
    r->secs = now_s() - t0;
    snprintf(r->err, sizeof r->err, "%s", mr_last_error());
    mr_status qs = mr_comm_queue_wait(q, t);
    double qsecs = now_s() - t0;
    if (qs != MR_ERR_COMM || qsecs > 5 || !strstr(mr_last_error(), "loss is NaN"))
        R_FAIL(r, "queued allreduce after the abort: %s after %.3f s: %s", mr_status_name(qs), qsecs, mr_last_error());
    mr_comm_queue_free(q);
}

static void test_abort(void **state) {
    (void)state;
    replica r[3];
    run_replicas(3, 30, abort_body, NULL, r); /* a long deadline: failing fast must come from the abort */
    for (int k = 0; k < 2; k++) {
        printf("rank %d after %.3f s: %s\n", k, r[k].secs, r[k].err);
        assert_int_equal(r[k].st, MR_ERR_COMM);
        assert_true(r[k].secs < 2.0);
        assert_non_null(strstr(r[k].err, "allreduce #"));
        assert_non_null(strstr(r[k].err, "rank 2 aborted (code 3): loss is NaN at step 7"));
    }
}

/* ---- argument errors --------------------------------------------------------------------------- */

static void test_arguments(void **state) {
    (void)state;
    mr_comm *c = NULL;
    float x[8] = {0};
    assert_int_equal(mr_comm_local_new(0, 1, &c), MR_ERR_INVALID);
    assert_int_equal(mr_comm_local_new(1, 0, &c), MR_ERR_INVALID);
    assert_int_equal(mr_comm_local_new(1, 1, NULL), MR_ERR_INVALID);
    MR_ASSERT_OK(mr_comm_local_new(1, 1, &c));
    assert_int_equal(mr_comm_allreduce(NULL, x, 8, MR_F32, MR_REDUCE_SUM), MR_ERR_INVALID);
    assert_int_equal(mr_comm_allreduce(c, x, -1, MR_F32, MR_REDUCE_SUM), MR_ERR_INVALID);
    assert_int_equal(mr_comm_allreduce(c, NULL, 8, MR_F32, MR_REDUCE_SUM), MR_ERR_INVALID);
    assert_int_equal(mr_comm_allreduce(c, x, 8, MR_F16, MR_REDUCE_SUM), MR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mr_last_error(), "f16"));
    assert_int_equal(mr_comm_allreduce(c, x, 8, (mr_dtype)42, MR_REDUCE_SUM), MR_ERR_INVALID);
    assert_int_equal(mr_comm_allreduce(c, x, 8, MR_F32, (mr_reduce_op)7), MR_ERR_INVALID);
    assert_int_equal(mr_comm_broadcast(c, x, 8, MR_F32, 1), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "root 1"));
    assert_int_equal(mr_comm_reduce_scatter(c, x, x + 4, 8, MR_F32, MR_REDUCE_SUM), MR_ERR_INVALID);
    assert_int_equal(mr_comm_allgather(c, x + 1, x, 4, MR_F32), MR_ERR_INVALID);
    assert_int_equal(mr_comm_allreduce(c, x, INT64_MAX / 2, MR_F32, MR_REDUCE_SUM), MR_ERR_INVALID);
    /* none of those ran: the communicator still works, and numbers its first real call #1 */
    x[0] = 2;
    MR_ASSERT_OK(mr_comm_allreduce(c, x, 8, MR_F32, MR_REDUCE_AVG));
    assert_float_equal(x[0], 2, 0);
    mr_comm_queue *q = NULL;
    assert_int_equal(mr_comm_queue_new(NULL, &q), MR_ERR_INVALID);
    MR_ASSERT_OK(mr_comm_queue_new(c, &q));
    int64_t t = 0;
    assert_int_equal(mr_comm_queue_allreduce(q, x, 8, MR_BF16, MR_REDUCE_SUM, &t), MR_ERR_UNSUPPORTED);
    assert_int_equal(mr_comm_queue_wait(q, 1), MR_ERR_INVALID);
    assert_int_equal(mr_comm_queue_wait(q, 0), MR_ERR_INVALID);
    mr_comm_queue_free(q);
    mr_comm_queue_free(NULL);
    mr_comm_free(c);
    mr_comm_free(NULL);
    mr_comm_abort(NULL, 1, "x");
}

/* ---- launcher detection ------------------------------------------------------------------------ */

static void test_launched_multi(void **state) {
    (void)state;
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS",
                                       "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    assert_int_equal(mr_comm_launched_multi(), 0);
    setenv("SLURM_NTASKS", "8", 1); /* a batch script's allocation, not an srun step */
    assert_int_equal(mr_comm_launched_multi(), 0);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    assert_int_equal(mr_comm_launched_multi(), 0);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    assert_int_equal(mr_comm_launched_multi(), 1);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("PMI_SIZE", "2", 1);
    assert_int_equal(mr_comm_launched_multi(), 1);
    unsetenv("PMI_SIZE");
    setenv("SLURM_STEP_NUM_TASKS", "16", 1);
    assert_int_equal(mr_comm_launched_multi(), 1);
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),      cmocka_unit_test(test_allreduce), cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_allgather),      cmocka_unit_test(test_reduce_scatter), cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_queue),          cmocka_unit_test(test_missing_replica), cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_abort),          cmocka_unit_test(test_launched_multi),
        cmocka_unit_test(test_clock_offset),   cmocka_unit_test(test_trace_spans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
