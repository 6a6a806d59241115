/* distribute/ddp.h over 2 local replicas (threads), with a fake backward whose kernel k writes the
 * gradient of parameter 4 - k (the last layer first): the overlapped mode runs every kernel once
 * and in order, queues every bucket, and averages to the bits of one all-reduce after the
 * backward; the host values are agreed; ZeRO-1's mode hands each replica its shard of the average
 * and gathers the shards back, and sums the per-parameter counts of the shards (mr_ddp_sum_counts,
 * which the other modes leave as they are); a single replica moves nothing. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "distribute/ddp.h"

#define NP 5
#define PN 200
#define N (NP * PN)

typedef struct replica {
    mr_comm *comm;
    int mode; /* 0 overlap, 1 allreduce, 2 shard */
    float grads[N], params[N];
    int32_t ran[8]; /* the kernels run, in order */
    int n_ran;
    double agree[2];
    int64_t counts[3]; /* mr_ddp_sum_counts of {rank, 1, 0} */
    mr_ddp_part part;
    mr_status st;
} replica;

static mr_status backward(void *ctx, int32_t first, int32_t last) {
    replica *r = ctx;
    for (int32_t k = first; k < last; k++) {
        const int p = NP - 1 - k;
        const float w = (float)(mr_comm_rank(r->comm) + 1);
        for (int i = 0; i < PN; i++) r->grads[p * PN + i] = w * (0.1f + 0.37f * (float)i);
        r->ran[r->n_ran++] = k;
    }
    return MR_OK;
}

static void *run(void *arg) {
    replica *r = arg;
    mr_ddp_param ps[NP];
    for (int p = 0; p < NP; p++) ps[p] = (mr_ddp_param){(int64_t)p * PN, PN, NP - p};
    mr_ddp_cfg c = {.comm = r->comm, .dev = mr_device_cpu(), .grads = r->grads, .n = N, .params = ps, .n_params = NP,
                    .bucket_bytes = 2.5 * PN * sizeof(float), .overlap = r->mode == 0, .shard = r->mode == 2};
    mr_ddp *d = NULL;
    r->st = mr_ddp_new(&c, &d);
    if (r->st == MR_OK && (mr_ddp_overlaps(d) != (r->mode == 0))) r->st = MR_ERR_INTERNAL;
    if (r->st == MR_OK) r->st = mr_ddp_backward(d, backward, r, 0, NP);
    r->agree[0] = 1.5 * (mr_comm_rank(r->comm) + 1);
    r->agree[1] = mr_comm_rank(r->comm) == 1;
    if (r->st == MR_OK) r->st = mr_ddp_finish(d, r->grads, r->agree, 2, &r->part);
    r->counts[0] = mr_comm_rank(r->comm);
    r->counts[1] = 1;
    r->counts[2] = 0;
    if (r->st == MR_OK) r->st = mr_ddp_sum_counts(d, r->counts, 3);
    if (r->st == MR_OK && r->mode == 2) {
        for (int64_t i = 0; i < r->part.n; i++) r->params[r->part.off + i] = r->part.g[i];
        r->st = mr_ddp_gather(d, r->params);
    }
    mr_ddp_free(d);
    return NULL;
}

static void run_two(int mode, replica *reps) {
    mr_comm *comms[2];
    MR_ASSERT_OK(mr_comm_local_new(2, 30, comms));
    pthread_t tid;
    for (int r = 0; r < 2; r++) {
        memset(&reps[r], 0, sizeof reps[r]);
        reps[r].comm = comms[r];
        reps[r].mode = mode;
    }
    assert_int_equal(pthread_create(&tid, NULL, run, &reps[1]), 0);
    run(&reps[0]);
    pthread_join(tid, NULL);
    for (int r = 0; r < 2; r++) {
        MR_ASSERT_OK(reps[r].st);
        mr_comm_free(comms[r]);
    }
}

static void test_ddp_overlap_matches_allreduce(void **state) {
    (void)state;
    static replica ov[2], ar[2];
    run_two(0, ov);
    run_two(1, ar);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(ov[r].n_ran, NP); /* every kernel once, in order */
        for (int k = 0; k < NP; k++) assert_int_equal(ov[r].ran[k], k);
        assert_true(ov[r].agree[0] == 4.5 && ov[r].agree[1] == 1.0); /* summed over the replicas */
        assert_true(ov[r].part.g == ov[r].grads && ov[r].part.off == 0 && ov[r].part.n == N);
        assert_memory_equal(ov[r].grads, ar[r].grads, sizeof ov[r].grads);
        assert_memory_equal(ov[r].grads, ov[0].grads, sizeof ov[r].grads);
        /* every replica holds the whole gradient: its own counts are the answer */
        assert_true(ov[r].counts[0] == r && ov[r].counts[1] == 1 && ov[r].counts[2] == 0);
        assert_true(ar[r].counts[0] == r && ar[r].counts[1] == 1 && ar[r].counts[2] == 0);
    }
    const float want = (1.0f * 0.1f + 2.0f * 0.1f) / 2.0f;
    assert_true(ov[0].grads[0] == want);
}

static void test_ddp_shard(void **state) {
    (void)state;
    static replica sh[2], ar[2];
    run_two(2, sh);
    run_two(1, ar);
    mr_ddp_shard s0 = mr_ddp_shard_of(N, 2, 0), s1 = mr_ddp_shard_of(N, 2, 1);
    assert_int_equal(s0.off, 0);
    assert_int_equal(s1.off, N / 2);
    assert_int_equal(s0.len + s1.len, N);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(sh[r].part.off, r ? s1.off : s0.off);
        assert_int_equal(sh[r].part.n, r ? s1.len : s0.len);
        /* the gathered shards are the whole average */
        assert_memory_equal(sh[r].params, ar[r].grads, sizeof sh[r].params);
        assert_true(sh[r].counts[0] == 1 && sh[r].counts[1] == 2 && sh[r].counts[2] == 0); /* summed over shards */
    }
    assert_int_equal(mr_ddp_shard_of(3, 4, 3).len, 0); /* more replicas than elements: an empty shard */
}

static void test_ddp_single(void **state) {
    (void)state;
    static float g[N];
    mr_ddp_cfg c = {.dev = mr_device_cpu(), .grads = g, .n = N};
    mr_ddp *d = NULL;
    MR_ASSERT_OK(mr_ddp_new(&c, &d));
    replica r;
    memset(&r, 0, sizeof r);
    MR_ASSERT_OK(mr_comm_local_new(1, 30, &r.comm));
    MR_ASSERT_OK(mr_ddp_backward(d, backward, &r, 0, NP));
    assert_int_equal(r.n_ran, NP);
    mr_ddp_part part;
    MR_ASSERT_OK(mr_ddp_finish(d, g, NULL, 0, &part));
    assert_true(part.g == g && part.off == 0 && part.n == N);
    int flag = 0;
    double sq = 2.0;
    MR_ASSERT_OK(mr_ddp_all(d, &flag));
    MR_ASSERT_OK(mr_ddp_sumsq(d, &sq));
    assert_true(flag == 0 && sq == 2.0);
    int64_t counts[2] = {3, 0};
    MR_ASSERT_OK(mr_ddp_sum_counts(d, counts, 2));
    assert_true(counts[0] == 3 && counts[1] == 0);
    assert_true(mr_ddp_busy_seconds(d) == 0.0);
    mr_ddp_free(d);
    mr_ddp_free(NULL);
    mr_comm_free(r.comm);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ddp_overlap_matches_allreduce),
                                       cmocka_unit_test(test_ddp_shard), cmocka_unit_test(test_ddp_single)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
