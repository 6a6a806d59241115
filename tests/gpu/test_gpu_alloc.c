/* The CUDA caching allocator and pinned host buffers on a real GPU: a loop of mr_tensor_new/free
 * of planned sizes makes no driver allocation after the first round; the memory counters move by
 * exactly what was asked; release_cached hands segments back; a block freed while a stream still
 * writes into it is not given to new work before that write ends; host_alloc/host_free round trip
 * with asynchronous copies on a stream. Without a usable GPU the program exits 77 (SKIPPED). With
 * MIRROR_CUDA_CACHE=0 the cache checks are skipped (everything is a cudaMalloc then). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"

static const mr_device g_dev = {MR_DEVICE_CUDA, 0};

static int cache_off(void) {
    const char *v = getenv("MIRROR_CUDA_CACHE");
    return v && (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "false"));
}

static mr_memory_stats stats(void) {
    mr_memory_stats s;
    MR_ASSERT_OK(mr_device_memory_stats(g_dev, &s));
    return s;
}

/* What a planned training step does: the same tensors every step. */
static void test_tensor_loop_no_raw_allocs(void **state) {
    (void)state;
    if (cache_off()) {
        printf("MIRROR_CUDA_CACHE=0: not checking the cache\n");
        return;
    }
    static const int64_t numel[] = {1, 1000, 65536, 256 * 256, 3 << 20, 17, 1 << 18, (5 << 20) + 7, 300000};
    enum { N = sizeof numel / sizeof *numel, ROUNDS = 50 };
    mr_tensor *t[N];
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    mr_memory_stats s0 = stats(), s1 = s0;
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < N; i++) {
            mr_shape s = mr_shape_1d(numel[i]);
            MR_ASSERT_OK(mr_tensor_zeros(g_dev, MR_F32, &s, &t[i])); /* a kernel touches each one */
        }
        for (int i = N - 1; i >= 0; i--) mr_tensor_free(t[i]);
        /* a step ends by reading its loss: the device is idle, every freed block ready, so each
         * round starts from the same free segments */
        MR_ASSERT_OK(be->stream_sync(NULL));
        mr_memory_stats s = stats();
        assert_int_equal(s.in_use, s0.in_use);
        assert_int_equal(s.requested, s0.requested);
        if (round == 0) {
            s1 = s;
            printf("first round: %lld driver allocations, %.1f MiB reserved\n", (long long)(s.raw_allocs - s0.raw_allocs),
                   (double)s.reserved / (1 << 20));
        } else {
            assert_int_equal(s.raw_allocs, s1.raw_allocs);
            assert_int_equal(s.raw_frees, s1.raw_frees);
            assert_int_equal(s.reserved, s1.reserved);
        }
    }
    mr_memory_stats s = stats();
    assert_int_equal(s.allocs - s0.allocs, (int64_t)N * ROUNDS);
    assert_int_equal(s.cache_hits - s1.cache_hits, (int64_t)N * (ROUNDS - 1));
    gpu_free_all();
}

/* The counters move by what was asked, and release_cached gives entirely free segments back. */
static void test_stats_move(void **state) {
    (void)state;
    if (cache_off()) return;
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    MR_ASSERT_OK(mr_device_memory_release_cached(g_dev));
    mr_memory_stats s0 = stats();
    assert_true(s0.reserved >= s0.in_use);
    const size_t bytes = (size_t)3 << 20; /* large: a 4 MiB segment, the 1 MiB rest unsplit */
    void *p = NULL;
    MR_ASSERT_OK(be->alloc(0, bytes, &p));
    mr_memory_stats s1 = stats();
    assert_int_equal(s1.requested - s0.requested, bytes);
    assert_int_equal(s1.in_use - s0.in_use, (size_t)4 << 20);
    assert_int_equal(s1.allocs - s0.allocs, 1);
    assert_int_equal(s1.raw_allocs - s0.raw_allocs, 1); /* the cache was just emptied */
    assert_int_equal(s1.reserved - s0.reserved, (size_t)4 << 20);
    assert_true(s1.peak_in_use >= s1.in_use);
    assert_true(s1.peak_reserved >= s1.reserved);
    be->free(0, p);
    mr_memory_stats s2 = stats();
    assert_int_equal(s2.in_use, s0.in_use);
    assert_int_equal(s2.requested, s0.requested);
    assert_int_equal(s2.reserved, s1.reserved); /* cached */
    MR_ASSERT_OK(mr_device_memory_reset_peak(g_dev));
    s2 = stats();
    assert_int_equal(s2.peak_in_use, s2.in_use);
    assert_int_equal(s2.peak_reserved, s2.reserved);
    /* the same size again: from the cache */
    MR_ASSERT_OK(be->alloc(0, bytes, &p));
    mr_memory_stats s3 = stats();
    assert_int_equal(s3.raw_allocs, s2.raw_allocs);
    assert_int_equal(s3.cache_hits - s2.cache_hits, 1);
    be->free(0, p);
    MR_ASSERT_OK(mr_device_memory_release_cached(g_dev));
    mr_memory_stats s4 = stats();
    assert_int_equal(s4.reserved, s0.reserved);
    assert_int_equal(s4.raw_frees - s3.raw_frees, 1);
    gpu_free_all();
}

/* Stream safety: s1 keeps writing into X; X is freed from the host at once; new work on another
 * stream writes into a block of the same size and reads it back. Were X handed out before s1 is
 * done, s1's copies would overwrite the new contents. */
static void test_free_while_stream_writes(void **state) {
    (void)state;
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    const size_t n = (size_t)64 << 20;
    unsigned char *h_new = th_alloc(n), *h_back = th_alloc(n);
    memset(h_new, 0x5a, n);
    mr_stream *s1 = NULL, *s2 = NULL;
    MR_ASSERT_OK(be->stream_new(0, &s1));
    MR_ASSERT_OK(be->stream_new(0, &s2));
    for (int round = 0; round < 4; round++) {
        void *src = NULL, *x = NULL, *y = NULL;
        MR_ASSERT_OK(be->alloc(0, n, &src));
        MR_ASSERT_OK(be->memset_zero(0, src, n, s1));
        MR_ASSERT_OK(be->alloc(0, n, &x));
        for (int k = 0; k < 32; k++) MR_ASSERT_OK(be->copy(0, x, src, n, MR_COPY_D2D, s1));
        be->free(0, x);
        MR_ASSERT_OK(be->alloc(0, n, &y));
        MR_ASSERT_OK(be->copy(0, y, h_new, n, MR_COPY_H2D, s2));
        MR_ASSERT_OK(be->copy(0, h_back, y, n, MR_COPY_D2H, s2));
        MR_ASSERT_OK(be->stream_sync(s2));
        MR_ASSERT_OK(be->stream_sync(s1));
        assert_memory_equal(h_new, h_back, n);
        /* and once s1 is done, the bytes read through y are still the new ones */
        MR_ASSERT_OK(be->copy(0, h_back, y, n, MR_COPY_D2H, NULL));
        MR_ASSERT_OK(be->stream_sync(NULL));
        assert_memory_equal(h_new, h_back, n);
        be->free(0, y);
        be->free(0, src);
    }
    be->stream_free(s1);
    be->stream_free(s2);
    gpu_free_all();
}

/* Pinned buffers: H2D and D2H asynchronously on a stream, then synchronise and compare. */
static void test_host_alloc_roundtrip(void **state) {
    (void)state;
    const mr_backend *be = NULL;
    MR_ASSERT_OK(mr_backend_get(MR_DEVICE_CUDA, &be));
    const size_t n = (size_t)8 << 20;
    unsigned char *h_in = NULL, *h_out = NULL, *h_zero = NULL;
    void *d = NULL;
    mr_stream *s = NULL;
    MR_ASSERT_OK(be->host_alloc(n, (void **)&h_in));
    MR_ASSERT_OK(be->host_alloc(n, (void **)&h_out));
    MR_ASSERT_OK(be->host_alloc(0, (void **)&h_zero));
    assert_non_null(h_zero);
    for (size_t i = 0; i < n; i++) h_in[i] = (unsigned char)(i * 131u + 7u);
    memset(h_out, 0, n);
    MR_ASSERT_OK(be->alloc(0, n, &d));
    MR_ASSERT_OK(be->stream_new(0, &s));
    for (int round = 0; round < 3; round++) {
        h_in[round] ^= 0xff; /* new contents each round */
        MR_ASSERT_OK(be->copy(0, d, h_in, n, MR_COPY_H2D, s));
        MR_ASSERT_OK(be->copy(0, h_out, d, n, MR_COPY_D2H, s));
        MR_ASSERT_OK(be->stream_sync(s));
        assert_memory_equal(h_in, h_out, n);
    }
    be->stream_free(s);
    be->free(0, d);
    be->host_free(h_in);
    be->host_free(h_out);
    be->host_free(h_zero);
    be->host_free(NULL);
    gpu_free_all();
}

int main(void) {
    if (gpu_none()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_loop_no_raw_allocs),
        cmocka_unit_test(test_stats_move),
        cmocka_unit_test(test_free_while_stream_writes),
        cmocka_unit_test(test_host_alloc_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
