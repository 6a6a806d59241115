/* data/ pipeline: transform semantics against hand-computed sequences; determinism (the same
 * pipeline with map parallelism / OpenMP threads 1 and 8, with and without prefetch, over several
 * runs gives identical bytes); resume at every cut point (shuffle with reshuffle_each_iteration,
 * repeat, batch, shard/skip/take) equals the uninterrupted sequence; sharding is disjoint and
 * covers an epoch (uneven shards differ by one element: the first N % n shards get one more);
 * state-blob error paths; prefetch shutdown mid-stream. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "data/data.h"

/* ---- a callback source and a map ------------------------------------------------------------ */

/* element i: "id" i32 [] = i, "v" f32 [3] = (i, i/2, -i) */
static mr_status gen(void *ctx, int64_t i, void *const out[]) {
    (void)ctx;
    *(int32_t *)out[0] = (int32_t)i;
    float *v = out[1];
    v[0] = (float)i;
    v[1] = (float)i * 0.5f;
    v[2] = -(float)i;
    return MR_OK;
}

/* "id" passes through; "w" f32 [4] mixes v, the epoch and some busy work so threads interleave. */
static mr_status fmap(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)ctx;
    const float *v = in[1];
    float *w = out[1];
    *(int32_t *)out[0] = *(const int32_t *)in[0];
    double acc = 0;
    for (int k = 0; k < 200; k++) acc += sin(v[0] * 0.001 + k);
    w[0] = v[0] * 2.0f;
    w[1] = v[1] + (float)epoch;
    w[2] = (float)acc;
    w[3] = (float)index;
    return MR_OK;
}

static mr_data_spec src_spec(void) {
    mr_data_spec s = {0};
    mr_shape sc = mr_shape_make(0, NULL), s3 = mr_shape_1d(3);
    MR_ASSERT_OK(mr_data_spec_add(&s, "id", MR_I32, &sc));
    MR_ASSERT_OK(mr_data_spec_add(&s, "v", MR_F32, &s3));
    return s;
}

static mr_data_spec map_spec(void) {
    mr_data_spec s = {0};
    mr_shape sc = mr_shape_make(0, NULL), s4 = mr_shape_1d(4);
    MR_ASSERT_OK(mr_data_spec_add(&s, "id", MR_I32, &sc));
    MR_ASSERT_OK(mr_data_spec_add(&s, "w", MR_F32, &s4));
    return s;
}

static mr_dataset *source(int64_t n) {
    mr_data_spec s = src_spec();
    mr_dataset *d = NULL;
    MR_ASSERT_OK(mr_data_from_fn(&s, n, gen, NULL, &d));
    return d;
}

#define STEP TH_DATA_STEP

/* ---- collecting sequences ------------------------------------------------------------------- */

/* Everything an iterator delivered: ids of every element, batch sizes, and all bytes. */
typedef struct seq {
    int64_t nitems, nids, nbytes;
    int64_t *ids, *sizes;
    unsigned char *bytes;
} seq;

static void seq_push(seq *s, const mr_data_elem *e) {
    int64_t lead = e->shape[0].ndim ? e->shape[0].dim[0] : 1;
    s->sizes = realloc(s->sizes, sizeof(int64_t) * (size_t)(s->nitems + 1));
    s->sizes[s->nitems++] = lead;
    s->ids = realloc(s->ids, sizeof(int64_t) * (size_t)(s->nids + lead));
    for (int64_t i = 0; i < lead; i++) s->ids[s->nids++] = ((const int32_t *)e->data[0])[i];
    for (int c = 0; c < e->n; c++) {
        size_t b = (size_t)mr_shape_numel(&e->shape[c]) * mr_dtype_size(e->dtype[c]);
        s->bytes = realloc(s->bytes, (size_t)s->nbytes + b);
        memcpy(s->bytes + s->nbytes, e->data[c], b);
        s->nbytes += (int64_t)b;
    }
}

static void seq_free(seq *s) {
    free(s->ids);
    free(s->sizes);
    free(s->bytes);
    memset(s, 0, sizeof *s);
}

/* Pulls up to max items (all when max < 0) from it into s. Returns items pulled. */
static int64_t drain(mr_data_iter *it, int64_t max, seq *s) {
    int64_t n = 0;
    while (max < 0 || n < max) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        seq_push(s, &e);
        n++;
    }
    return n;
}

static seq run_all(mr_dataset *d) {
    seq s = {0};
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    drain(it, -1, &s);
    mr_data_iter_free(it);
    return s;
}

static void assert_ids(const seq *s, const int64_t *want, int64_t n) {
    assert_int_equal(s->nids, n);
    for (int64_t i = 0; i < n; i++)
        if (s->ids[i] != want[i]) fail_msg("element %lld: id %lld, expected %lld", (long long)i, (long long)s->ids[i], (long long)want[i]);
}

static void assert_seq_equal(const seq *a, const seq *b, const char *what) {
    if (a->nitems != b->nitems || a->nbytes != b->nbytes)
        fail_msg("%s: %lld items / %lld bytes vs %lld / %lld", what, (long long)a->nitems, (long long)a->nbytes,
                 (long long)b->nitems, (long long)b->nbytes);
    for (int64_t i = 0; i < a->nitems; i++) assert_int_equal(a->sizes[i], b->sizes[i]);
    for (int64_t i = 0; i < a->nbytes; i++)
        if (a->bytes[i] != b->bytes[i]) fail_msg("%s: byte %lld differs", what, (long long)i);
}

/* ---- semantics ------------------------------------------------------------------------------ */

static void test_take_skip_repeat(void **state) {
    (void)state;
    mr_dataset *d = source(10);
    STEP(d, mr_data_skip(d, 3, &nd_));
    STEP(d, mr_data_take(d, 4, &nd_));
    STEP(d, mr_data_repeat(d, 2, &nd_));
    seq s = run_all(d);
    const int64_t want[] = {3, 4, 5, 6, 3, 4, 5, 6};
    assert_ids(&s, want, 8);
    seq_free(&s);
    mr_data_free(d);

    d = source(5);
    STEP(d, mr_data_repeat(d, 0, &nd_));
    s = run_all(d);
    assert_int_equal(s.nitems, 0);
    seq_free(&s);
    mr_data_free(d);

    /* repeat over an empty input ends instead of looping */
    d = source(5);
    STEP(d, mr_data_skip(d, 10, &nd_));
    STEP(d, mr_data_repeat(d, -1, &nd_));
    s = run_all(d);
    assert_int_equal(s.nitems, 0);
    seq_free(&s);
    mr_data_free(d);

    /* repeat forever, then take */
    d = source(3);
    STEP(d, mr_data_repeat(d, -1, &nd_));
    STEP(d, mr_data_take(d, 7, &nd_));
    s = run_all(d);
    const int64_t want2[] = {0, 1, 2, 0, 1, 2, 0};
    assert_ids(&s, want2, 7);
    seq_free(&s);
    mr_data_free(d);
}

static void test_batch_remainder(void **state) {
    (void)state;
    for (int drop = 0; drop < 2; drop++) {
        mr_dataset *d = source(10);
        STEP(d, mr_data_batch(d, 4, drop, &nd_));
        STEP(d, mr_data_repeat(d, 2, &nd_));
        assert_int_equal(mr_data_batch_size(d), 4);
        seq s = run_all(d);
        /* the remainder batch of each pass is short (or dropped); repeat restarts the batching */
        assert_int_equal(s.nitems, drop ? 4 : 6);
        const int64_t want_sizes[] = {4, 4, 2, 4, 4, 2};
        for (int64_t i = 0, k = 0; i < s.nitems; i++, k++) {
            if (drop && want_sizes[k] == 2) k++;
            assert_int_equal(s.sizes[i], want_sizes[k]);
        }
        assert_int_equal(s.ids[8], drop ? 0 : 8);
        seq_free(&s);
        mr_data_free(d);
    }
    /* batch before shuffle and take: whole batches move */
    mr_dataset *d = source(12);
    STEP(d, mr_data_batch(d, 3, 0, &nd_));
    STEP(d, mr_data_shuffle(d, 4, 5, 0, &nd_));
    STEP(d, mr_data_take(d, 3, &nd_));
    seq s = run_all(d);
    assert_int_equal(s.nitems, 3);
    for (int64_t i = 0; i < s.nitems; i++) {
        assert_int_equal(s.ids[3 * i] % 3, 0);
        assert_int_equal(s.ids[3 * i + 1], s.ids[3 * i] + 1);
    }
    seq_free(&s);
    mr_data_free(d);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* ids[off..off+n) sorted equal 0..n-1 */
static void assert_permutation(const int64_t *ids, int64_t n) {
    int64_t *c = malloc(sizeof(int64_t) * (size_t)n);
    memcpy(c, ids, sizeof(int64_t) * (size_t)n);
    qsort(c, (size_t)n, sizeof *c, cmp_i64);
    for (int64_t i = 0; i < n; i++) assert_int_equal(c[i], i);
    free(c);
}

static void test_shuffle(void **state) {
    (void)state;
    const int64_t n = 97;
    for (int resh = 0; resh < 2; resh++) {
        mr_dataset *d = source(n);
        STEP(d, mr_data_shuffle(d, 16, 1234, resh, &nd_));
        STEP(d, mr_data_repeat(d, 3, &nd_));
        seq s = run_all(d);
        assert_int_equal(s.nids, 3 * n);
        for (int e = 0; e < 3; e++) assert_permutation(s.ids + e * n, n);
        int same01 = memcmp(s.ids, s.ids + n, sizeof(int64_t) * n) == 0;
        assert_int_equal(same01, !resh);
        int64_t moved = 0;
        for (int64_t i = 0; i < n; i++) moved += s.ids[i] != i;
        assert_true(moved > n / 2);
        seq_free(&s);
        mr_data_free(d);
    }
    /* buffer 1 is the identity; another seed is another order */
    mr_dataset *d = source(20);
    STEP(d, mr_data_shuffle(d, 1, 9, 1, &nd_));
    seq s = run_all(d);
    for (int64_t i = 0; i < 20; i++) assert_int_equal(s.ids[i], i);
    seq_free(&s);
    mr_data_free(d);
    mr_dataset *a = source(50), *b = source(50);
    STEP(a, mr_data_shuffle(a, 50, 1, 0, &nd_));
    STEP(b, mr_data_shuffle(b, 50, 2, 0, &nd_));
    assert_true(mr_data_structure_hash(a) != mr_data_structure_hash(b));
    seq sa = run_all(a), sb = run_all(b);
    assert_true(memcmp(sa.ids, sb.ids, sizeof(int64_t) * 50) != 0);
    seq_free(&sa);
    seq_free(&sb);
    mr_data_free(a);
    mr_data_free(b);
}

/* ---- sharding ------------------------------------------------------------------------------- */

static void test_shard_cover(void **state) {
    (void)state;
    const int64_t N = 103;
    for (int64_t nsh = 1; nsh <= 5; nsh++) {
        int *seen = calloc((size_t)N, sizeof(int));
        for (int64_t i = 0; i < nsh; i++) {
            mr_dataset *d = source(N);
            STEP(d, mr_data_shard(d, nsh, i, &nd_));
            STEP(d, mr_data_shuffle(d, 10, 77, 1, &nd_));
            STEP(d, mr_data_batch(d, 8, 0, &nd_));
            seq s = run_all(d);
            /* shard i gets ceil(N/n) elements when i < N % n, floor(N/n) otherwise */
            assert_int_equal(s.nids, N / nsh + (i < N % nsh));
            for (int64_t k = 0; k < s.nids; k++) {
                assert_int_equal(s.ids[k] % nsh, i);
                seen[s.ids[k]]++;
            }
            seq_free(&s);
            mr_data_free(d);
        }
        for (int64_t k = 0; k < N; k++) assert_int_equal(seen[k], 1);
        free(seen);
    }
}

/* ---- determinism ---------------------------------------------------------------------------- */

static mr_dataset *det_pipeline(int parallel, int prefetch) {
    mr_dataset *d = source(3000);
    mr_data_spec ms = map_spec();
    STEP(d, mr_data_shuffle(d, 500, 42, 1, &nd_));
    STEP(d, mr_data_map(d, fmap, NULL, &ms, parallel, &nd_));
    STEP(d, mr_data_batch(d, 64, 0, &nd_));
    STEP(d, mr_data_repeat(d, 2, &nd_));
    if (prefetch) STEP(d, mr_data_prefetch(d, prefetch, &nd_));
    return d;
}

static void test_determinism(void **state) {
    (void)state;
    mr_dataset *d0 = det_pipeline(1, 0);
    omp_set_num_threads(1);
    seq ref = run_all(d0);
    assert_int_equal(ref.nids, 6000);
    assert_permutation(ref.ids, 3000);
    assert_permutation(ref.ids + 3000, 3000);
    const int pars[] = {1, 8, MR_DATA_AUTO};
    const int prefs[] = {0, 1, 4};
    for (int run = 0; run < 3; run++)
        for (int pi = 0; pi < 3; pi++)
            for (int fi = 0; fi < 3; fi++) {
                omp_set_num_threads(pars[pi] == 1 ? 1 : 8);
                mr_dataset *d = det_pipeline(pars[pi], prefs[fi]);
                assert_int_equal(mr_data_structure_hash(d) == mr_data_structure_hash(d0), 1);
                seq s = run_all(d);
                char what[96];
                snprintf(what, sizeof what, "run %d parallel %d prefetch %d", run, pars[pi], prefs[fi]);
                assert_seq_equal(&s, &ref, what);
                seq_free(&s);
                mr_data_free(d);
            }
    omp_set_num_threads(2);
    seq_free(&ref);
    mr_data_free(d0);
}

/* ---- resume --------------------------------------------------------------------------------- */

typedef mr_dataset *(*builder)(void);

static mr_dataset *resume_batched(void) {
    mr_dataset *d = source(60);
    mr_data_spec ms = map_spec();
    STEP(d, mr_data_shuffle(d, 17, 3, 1, &nd_));
    STEP(d, mr_data_map(d, fmap, NULL, &ms, 4, &nd_));
    STEP(d, mr_data_batch(d, 7, 0, &nd_));
    STEP(d, mr_data_repeat(d, 3, &nd_));
    STEP(d, mr_data_prefetch(d, 3, &nd_));
    return d;
}

static mr_dataset *resume_unbatched(void) {
    mr_dataset *d = source(50);
    STEP(d, mr_data_shard(d, 3, 1, &nd_));
    STEP(d, mr_data_shuffle(d, 6, 11, 1, &nd_));
    STEP(d, mr_data_repeat(d, -1, &nd_));
    STEP(d, mr_data_skip(d, 5, &nd_));
    STEP(d, mr_data_take(d, 70, &nd_));
    STEP(d, mr_data_batch(d, 4, 1, &nd_));
    STEP(d, mr_data_shuffle(d, 3, 12, 0, &nd_));
    return d;
}

static void check_resume(builder make) {
    mr_dataset *d = make();
    seq ref = run_all(d);
    assert_true(ref.nitems > 10);
    int64_t step = th_quick() ? 3 : 1;
    for (int64_t k = 0; k <= ref.nitems; k += step) {
        mr_data_iter *it = NULL, *it2 = NULL;
        MR_ASSERT_OK(mr_data_iter_new(d, &it));
        seq head = {0}, tail = {0};
        assert_int_equal(drain(it, k, &head), k);
        void *blob = NULL;
        size_t bytes = 0;
        MR_ASSERT_OK(mr_data_iter_save(it, &blob, &bytes));
        mr_data_iter_free(it);
        mr_dataset *d2 = make(); /* a fresh pipeline of the same structure */
        MR_ASSERT_OK(mr_data_iter_new(d2, &it2));
        MR_ASSERT_OK(mr_data_iter_restore(it2, blob, bytes));
        assert_int_equal(mr_data_iter_position(it2), k);
        drain(it2, -1, &tail);
        /* head + tail must equal the uninterrupted sequence */
        seq both = {0};
        both.nitems = head.nitems + tail.nitems;
        both.nbytes = head.nbytes + tail.nbytes;
        both.sizes = malloc(sizeof(int64_t) * (size_t)(both.nitems + 1));
        both.bytes = malloc((size_t)both.nbytes + 1);
        if (head.nitems) {
            memcpy(both.sizes, head.sizes, sizeof(int64_t) * (size_t)head.nitems);
            memcpy(both.bytes, head.bytes, (size_t)head.nbytes);
        }
        if (tail.nitems) {
            memcpy(both.sizes + head.nitems, tail.sizes, sizeof(int64_t) * (size_t)tail.nitems);
            memcpy(both.bytes + head.nbytes, tail.bytes, (size_t)tail.nbytes);
        }
        char what[64];
        snprintf(what, sizeof what, "resume at %lld", (long long)k);
        assert_seq_equal(&both, &ref, what);
        free(blob);
        seq_free(&head);
        seq_free(&tail);
        seq_free(&both);
        mr_data_iter_free(it2);
        mr_data_free(d2);
    }
    seq_free(&ref);
    mr_data_free(d);
}

static void test_resume_batched(void **state) { (void)state; check_resume(resume_batched); }
static void test_resume_unbatched(void **state) { (void)state; check_resume(resume_unbatched); }

/* Save, restore into the SAME iterator repeatedly (rewinding), and save a restored iterator. */
static void test_resume_rewind(void **state) {
    (void)state;
    mr_dataset *d = resume_batched();
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    seq a = {0}, b = {0}, c = {0};
    drain(it, 5, &a);
    void *blob = NULL, *blob2 = NULL;
    size_t n = 0, n2 = 0;
    MR_ASSERT_OK(mr_data_iter_save(it, &blob, &n));
    drain(it, 4, &b);
    MR_ASSERT_OK(mr_data_iter_restore(it, blob, n));
    MR_ASSERT_OK(mr_data_iter_save(it, &blob2, &n2));
    assert_int_equal(n, n2);
    assert_memory_equal(blob, blob2, n);
    drain(it, 4, &c);
    assert_seq_equal(&b, &c, "rewound");
    seq_free(&a);
    seq_free(&b);
    seq_free(&c);
    free(blob);
    free(blob2);
    mr_data_iter_free(it);
    mr_data_free(d);
}

/* ---- state blob errors ---------------------------------------------------------------------- */

static void expect_restore_fail(mr_data_iter *it, const void *blob, size_t n, mr_status want, const char *needle) {
    mr_status st = mr_data_iter_restore(it, blob, n);
    if (st != want) fail_msg("restore: %s (%s), expected %s", mr_status_name(st), mr_last_error(), mr_status_name(want));
    if (needle && !strstr(mr_last_error(), needle)) fail_msg("message '%s' lacks '%s'", mr_last_error(), needle);
}

static void test_restore_errors(void **state) {
    (void)state;
    mr_dataset *d = resume_unbatched();
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    seq s = {0};
    drain(it, 3, &s);
    void *blob = NULL;
    size_t n = 0;
    MR_ASSERT_OK(mr_data_iter_save(it, &blob, &n));
    unsigned char *bad = malloc(n + 8);
    /* every truncation is an error naming an offset, never a crash */
    for (size_t k = 0; k < n; k++) expect_restore_fail(it, blob, k, MR_ERR_FORMAT, "offset");
    memcpy(bad, blob, n);
    bad[0] ^= 1;
    expect_restore_fail(it, bad, n, MR_ERR_FORMAT, "magic");
    memcpy(bad, blob, n);
    bad[4] = 9;
    expect_restore_fail(it, bad, n, MR_ERR_FORMAT, "version");
    memcpy(bad, blob, n);
    bad[n] = 0;
    expect_restore_fail(it, bad, n + 1, MR_ERR_FORMAT, "trailing");
    /* a source position far out of range (first stage record starts at byte 32; pos at +8) */
    memcpy(bad, blob, n);
    bad[32 + 8 + 7] = 0x7f;
    expect_restore_fail(it, bad, n, MR_ERR_FORMAT, "out of range");
    /* after a failed restore the iterator is at the start */
    seq again = {0}, fresh = {0};
    drain(it, 3, &again);
    assert_seq_equal(&again, &s, "restart after failed restore");
    /* another pipeline: structure hash differs */
    mr_dataset *other = resume_batched();
    mr_data_iter *it2 = NULL;
    MR_ASSERT_OK(mr_data_iter_new(other, &it2));
    expect_restore_fail(it2, blob, n, MR_ERR_INVALID, "structure hash");
    mr_dataset *other2 = source(50); /* same transforms, another seed */
    STEP(other2, mr_data_shard(other2, 3, 1, &nd_));
    STEP(other2, mr_data_shuffle(other2, 6, 999, 1, &nd_));
    mr_data_iter *it3 = NULL;
    MR_ASSERT_OK(mr_data_iter_new(other2, &it3));
    expect_restore_fail(it3, blob, n, MR_ERR_INVALID, "structure hash");
    drain(it3, 2, &fresh);
    assert_int_equal(fresh.nitems, 2);
    seq_free(&s);
    seq_free(&again);
    seq_free(&fresh);
    free(bad);
    free(blob);
    mr_data_iter_free(it);
    mr_data_iter_free(it2);
    mr_data_iter_free(it3);
    mr_data_free(d);
    mr_data_free(other);
    mr_data_free(other2);
}

/* ---- prefetch lifecycle, caller buffers, sticky errors --------------------------------------- */

static void test_prefetch_shutdown(void **state) {
    (void)state;
    mr_data_spec ms = map_spec();
    for (int k = 0; k < 6; k++) {
        mr_dataset *d = source(1000);
        STEP(d, mr_data_map(d, fmap, NULL, &ms, 2, &nd_));
        STEP(d, mr_data_repeat(d, -1, &nd_));
        STEP(d, mr_data_prefetch(d, 8, &nd_));
        mr_data_iter *it = NULL;
        MR_ASSERT_OK(mr_data_iter_new(d, &it));
        seq s = {0};
        drain(it, k * 3, &s); /* k = 0: freed before the thread ever starts */
        mr_data_iter_free(it);
        seq_free(&s);
        mr_data_free(d);
    }
}

static void test_next_into(void **state) {
    (void)state;
    mr_dataset *d = source(10);
    STEP(d, mr_data_batch(d, 4, 0, &nd_));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(d, &it));
    int32_t ids[4];
    float v[4][3];
    void *bufs[2] = {ids, v};
    mr_data_elem e;
    int end = 0;
    for (int b = 0; b < 3; b++) {
        MR_ASSERT_OK(mr_data_iter_next_into(it, bufs, &e, &end));
        assert_int_equal(end, 0);
        assert_int_equal(e.shape[1].ndim, 2);
        assert_int_equal(e.shape[1].dim[1], 3);
        assert_ptr_equal(e.data[0], ids);
        for (int i = 0; i < e.shape[0].dim[0]; i++) {
            assert_int_equal(ids[i], 4 * b + i);
            assert_true(v[i][1] == 0.5f * (float)(4 * b + i));
        }
    }
    MR_ASSERT_OK(mr_data_iter_next_into(it, bufs, NULL, &end));
    assert_int_equal(end, 1);
    MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
    assert_int_equal(end, 1);
    mr_data_iter_free(it);
    mr_data_free(d);
}

static mr_status failing_map(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    (void)ctx; (void)epoch;
    if (index == 13) return mr_set_error(MR_ERR_INVALID, "failing_map: element %lld is bad", (long long)index);
    *(int32_t *)out[0] = *(const int32_t *)in[0];
    memset(out[1], 0, 16);
    return MR_OK;
}

static void test_sticky_error(void **state) {
    (void)state;
    mr_data_spec ms = map_spec();
    for (int pre = 0; pre < 2; pre++) {
        mr_dataset *d = source(40);
        STEP(d, mr_data_map(d, failing_map, NULL, &ms, 4, &nd_));
        STEP(d, mr_data_batch(d, 5, 0, &nd_));
        if (pre) STEP(d, mr_data_prefetch(d, 2, &nd_));
        mr_data_iter *it = NULL;
        MR_ASSERT_OK(mr_data_iter_new(d, &it));
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        for (int k = 0; k < 2; k++) {
            assert_int_equal(mr_data_iter_next(it, &e, &end), MR_ERR_INVALID);
            assert_non_null(strstr(mr_last_error(), "element 13 is bad"));
        }
        void *blob = NULL;
        size_t n = 0;
        assert_int_equal(mr_data_iter_save(it, &blob, &n), MR_ERR_INVALID);
        mr_data_iter_free(it);
        mr_data_free(d);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_take_skip_repeat), cmocka_unit_test(test_batch_remainder),
        cmocka_unit_test(test_shuffle),          cmocka_unit_test(test_shard_cover),
        cmocka_unit_test(test_determinism),      cmocka_unit_test(test_resume_batched),
        cmocka_unit_test(test_resume_unbatched), cmocka_unit_test(test_resume_rewind),
        cmocka_unit_test(test_restore_errors),   cmocka_unit_test(test_prefetch_shutdown),
        cmocka_unit_test(test_next_into),        cmocka_unit_test(test_sticky_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
