/* Augmentation maps (data/augment.h): reference values (the Philox draws pinned, and every op
 * against a plain re-implementation here), the draw statistics, evaluation's normalize-only
 * pipeline, and the determinism contract: the same bytes whatever the thread count, the number of
 * replicas (global positions of a sharded pipeline) and a save/restore in the middle, and fresh
 * draws in each epoch. Errors name the op and the value. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "core/math/philox_math.h"
#include "data/augment.h"

#define C 2
#define H 5
#define W 5
#define NEL (C * H * W)
#define N 96

/* N elements: "x" f32 (C, H, W) with distinct values, "label" i32 = index */
static mr_dataset *images(void) {
    static float x[N * NEL];
    static int32_t lab[N];
    for (int i = 0; i < N * NEL; i++) x[i] = (float)(i % 251) * 0.01f + 0.5f;
    for (int i = 0; i < N; i++) lab[i] = i;
    mr_data_spec spec = {0};
    int64_t d[3] = {C, H, W};
    mr_shape xs = mr_shape_make(3, d), ls = mr_shape_make(0, NULL);
    MR_ASSERT_OK(mr_data_spec_add(&spec, "x", MR_F32, &xs));
    MR_ASSERT_OK(mr_data_spec_add(&spec, "label", MR_I32, &ls));
    const void *data[2] = {x, lab};
    mr_dataset *ds = NULL;
    MR_ASSERT_OK(mr_data_from_arrays(&spec, N, data, &ds));
    return ds;
}

static mr_augment_cfg full_cfg(void) {
    mr_augment_cfg a;
    memset(&a, 0, sizeof a);
    a.n = 3;
    a.op[0].kind = MR_AUG_RANDOM_CROP, a.op[0].size = H, a.op[0].pad = 2;
    a.op[1].kind = MR_AUG_HFLIP, a.op[1].p = 0.5;
    a.op[2].kind = MR_AUG_NORMALIZE, a.op[2].n = C;
    a.op[2].mean[0] = 0.25, a.op[2].std[0] = 0.5, a.op[2].mean[1] = -1, a.op[2].std[1] = 2;
    return a;
}

/* The reference: crop, flip, normalize of element (index, epoch) with plain loops. */
static void reference(const float *in, int64_t index, int64_t epoch, uint64_t seed, const mr_augment_cfg *a, float *out) {
    float t[NEL], u[NEL];
    memcpy(t, in, sizeof t);
    for (int k = 0; k < a->n; k++) {
        const mr_augment_op *o = &a->op[k];
        uint32_t r[4];
        mr_augment_draws(seed, k, index, epoch, r);
        for (int c = 0; c < C; c++)
            for (int i = 0; i < H; i++)
                for (int j = 0; j < W; j++) {
                    float v = t[(c * H + i) * W + j];
                    if (o->kind == MR_AUG_RANDOM_CROP) {
                        int span = (int)(2 * o->pad + 1);
                        int si = i + (int)(((uint64_t)r[0] * (uint64_t)span) >> 32) - (int)o->pad;
                        int sj = j + (int)(((uint64_t)r[1] * (uint64_t)span) >> 32) - (int)o->pad;
                        v = si >= 0 && si < H && sj >= 0 && sj < W ? t[(c * H + si) * W + sj] : 0.0f;
                    } else if (o->kind == MR_AUG_HFLIP) {
                        if ((double)(r[2] >> 8) / 16777216.0 < o->p) v = t[(c * H + i) * W + (W - 1 - j)];
                    } else {
                        v = (v - (float)o->mean[c]) * (float)(1.0 / o->std[c]);
                    }
                    u[(c * H + i) * W + j] = v;
                }
        memcpy(t, u, sizeof t);
    }
    memcpy(out, t, sizeof t);
}

/* Every element of `ds` (unbatched, finite), "x" then "label" bytes concatenated into *out. */
static size_t drain(mr_dataset *ds, unsigned char **out) {
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(ds, &it));
    size_t n = 0, cap = 1 << 16;
    unsigned char *b = malloc(cap);
    for (;;) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(it, &e, &end));
        if (end) break;
        size_t bx = (size_t)mr_shape_numel(&e.shape[0]) * 4, bl = (size_t)mr_shape_numel(&e.shape[1]) * 4;
        while (n + bx + bl > cap) b = realloc(b, cap *= 2);
        memcpy(b + n, e.data[0], bx);
        memcpy(b + n + bx, e.data[1], bl);
        n += bx + bl;
    }
    mr_data_iter_free(it);
    *out = b;
    return n;
}

static void test_draws_pinned(void **state) {
    (void)state;
    /* Philox4x32-10 under key seed + (op + 1) * 0x9E3779B97F4A7C15, counter (index, epoch): pinned so
     * that a change to the keying (which would change every augmented run) fails here */
    uint32_t r[4];
    mr_augment_draws(7, 0, 5, 2, r);
    print_message("  draws(seed 7, op 0, index 5, epoch 2) = %08x %08x %08x %08x\n", r[0], r[1], r[2], r[3]);
    static const uint32_t want[4] = {0xe8fdd926u, 0x46980efcu, 0xc33a9957u, 0xd2ed1a1du};
    assert_memory_equal(r, want, sizeof want);
    /* ... which is the documented keying over Philox4x32-10 (its known answers: tests/unit/test_rng.c) */
    const uint64_t key = 7 + 0x9E3779B97F4A7C15ull;
    const uint32_t ctr[4] = {5, 0, 2, 0}, k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
    uint32_t direct[4];
    mr_philox4x32_10(ctr, k, direct);
    assert_memory_equal(r, direct, sizeof direct);
    uint32_t s[4];
    mr_augment_draws(7, 1, 5, 2, s); /* another op, another stream */
    assert_memory_not_equal(r, s, sizeof s);
    mr_augment_draws(7, 0, 5, 3, s); /* another epoch */
    assert_memory_not_equal(r, s, sizeof s);
    mr_augment_draws(7, 0, 6, 2, s); /* another element */
    assert_memory_not_equal(r, s, sizeof s);
}

static void test_reference_values(void **state) {
    (void)state;
    mr_augment_cfg a = full_cfg();
    mr_dataset *src = images(), *rep = NULL, *aug = NULL;
    MR_ASSERT_OK(mr_data_repeat(src, 2, &rep));
    MR_ASSERT_OK(mr_data_augment(rep, "x", &a, 1, 42, 1, &aug));
    unsigned char *got = NULL;
    size_t n = drain(aug, &got);
    assert_int_equal(n, (size_t)2 * N * (NEL + 1) * 4);
    float in[NEL], want[NEL];
    int flips = 0, shifted = 0, redrawn = 0;
    for (int64_t q = 0; q < 2 * N; q++) { /* q: position; element q % N of epoch q / N */
        const int64_t i = q % N;
        for (int k = 0; k < NEL; k++) in[k] = (float)((i * NEL + k) % 251) * 0.01f + 0.5f;
        reference(in, i, q / N, 42, &a, want);
        const unsigned char *g = got + (size_t)q * (NEL + 1) * 4;
        if (q >= N) redrawn += memcmp(g, got + (size_t)i * (NEL + 1) * 4, NEL * 4) != 0;
        for (int k = 0; k < NEL; k++) {
            float v;
            memcpy(&v, g + 4 * k, 4);
            if (v != want[k]) fail_msg("element %lld value %d: %.9g, reference %.9g", (long long)i, k, v, want[k]);
        }
        int32_t lab;
        memcpy(&lab, g + NEL * 4, 4);
        assert_int_equal(lab, i); /* the other component passes through */
        uint32_t r[4];
        mr_augment_draws(42, 1, i, q / N, r);
        flips += (double)(r[2] >> 8) / 16777216.0 < 0.5;
        mr_augment_draws(42, 0, i, q / N, r);
        shifted += (((uint64_t)r[0] * 5) >> 32) != 2 || (((uint64_t)r[1] * 5) >> 32) != 2;
    }
    print_message("  %d elements x 2 epochs: %d flipped, %d shifted, each equal to the reference; %d of the second "
                  "epoch's differ from the first's\n", N, flips, shifted, redrawn);
    assert_true(flips > 0 && flips < 2 * N && shifted > N); /* the reference exercised both branches */
    assert_true(redrawn > N / 2);                          /* each epoch draws afresh */
    /* normalize alone, by hand: (0.5 - 0.25) / 0.5 = 0.5 and (0.5 + 1) / 2 = 0.75 for element 0's first values */
    mr_augment_cfg nm = a;
    nm.n = 1;
    nm.op[0] = a.op[2];
    mr_dataset *nd = NULL;
    MR_ASSERT_OK(mr_data_augment(src, "x", &nm, 1, 42, 1, &nd));
    unsigned char *g2 = NULL;
    drain(nd, &g2);
    float v0, v1;
    memcpy(&v0, g2, 4);
    memcpy(&v1, g2 + H * W * 4, 4); /* channel 1, first pixel: input 0.5 + 0.25 = 0.75 */
    assert_true(fabsf(v0 - 0.5f) < 1e-7f);
    assert_true(fabsf(v1 - (0.75f + 1.0f) / 2.0f) < 1e-7f);
    free(g2);
    mr_data_free(nd);
    free(got);
    mr_data_free(aug);
    mr_data_free(rep);
    mr_data_free(src);
}

static void test_draw_statistics(void **state) {
    (void)state;
    enum { M = 20000 };
    int counts[9] = {0}, flips = 0;
    for (int64_t i = 0; i < M; i++) {
        uint32_t r[4];
        mr_augment_draws(3, 0, i, i / 1000, r);
        counts[((uint64_t)r[0] * 9) >> 32]++;
        mr_augment_draws(3, 1, i, i / 1000, r);
        flips += (double)(r[2] >> 8) / 16777216.0 < 0.3;
    }
    for (int k = 0; k < 9; k++) /* uniform offsets: M/9 = 2222 each, 5 sigma ~ 223 */
        if (abs(counts[k] - M / 9) > 250) fail_msg("crop offset %d drawn %d times of %d", k - 4, counts[k], M);
    print_message("  flip at p 0.3: %d of %d\n", flips, M);
    assert_true(abs(flips - (int)(0.3 * M)) < 330); /* 5 sigma */
}

static void test_eval_normalize_only(void **state) {
    (void)state;
    mr_augment_cfg a = full_cfg(), nm = a;
    nm.n = 1;
    nm.op[0] = a.op[2];
    mr_dataset *src = images(), *ev = NULL, *ref = NULL;
    MR_ASSERT_OK(mr_data_augment(src, "x", &a, 0, 42, 1, &ev));
    MR_ASSERT_OK(mr_data_augment(src, "x", &nm, 1, 42, 1, &ref));
    unsigned char *x = NULL, *y = NULL;
    size_t nx = drain(ev, &x), ny = drain(ref, &y);
    assert_true(nx == ny && memcmp(x, y, nx) == 0);
    /* no op to apply: the input itself */
    mr_augment_cfg none;
    memset(&none, 0, sizeof none);
    mr_dataset *same = NULL;
    MR_ASSERT_OK(mr_data_augment(src, "x", &none, 1, 42, 1, &same));
    assert_ptr_equal(same, src);
    mr_data_free(same);
    free(x);
    free(y);
    mr_data_free(ev);
    mr_data_free(ref);
    mr_data_free(src);
}

/* shuffle -> repeat(3) -> shard(w, r) -> augment(parallel p) -> batch 4 (the trainer's order) */
static mr_data_iter *replica(int w, int r, int parallel) {
    mr_augment_cfg a = full_cfg();
    mr_dataset *s = images(), *sh = NULL, *rep = NULL, *part = NULL, *aug = NULL, *b = NULL, *pf = NULL;
    MR_ASSERT_OK(mr_data_shuffle(s, 32, 5, 1, &sh));
    MR_ASSERT_OK(mr_data_repeat(sh, 3, &rep));
    MR_ASSERT_OK(mr_data_shard(rep, w, r, &part));
    MR_ASSERT_OK(mr_data_augment(part, "x", &a, 1, 42, parallel, &aug));
    MR_ASSERT_OK(mr_data_batch(aug, 4, 1, &b));
    MR_ASSERT_OK(mr_data_prefetch(b, 3, &pf));
    mr_data_iter *it = NULL;
    MR_ASSERT_OK(mr_data_iter_new(pf, &it));
    mr_dataset *all[] = {s, sh, rep, part, aug, b, pf};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) mr_data_free(all[i]);
    return it;
}


/* w replicas in lockstep from step s0 to the end (3 epochs, global batch 4w): x of global position p into seq[p * NEL ...] */
static void run(mr_data_iter **its, int w, int s0, float *seq) {
    for (int s = s0; s < (3 * N) / (4 * w); s++)
        for (int r = 0; r < w; r++) {
            mr_data_elem e;
            int end = 1;
            MR_ASSERT_OK(mr_data_iter_next(its[r], &e, &end));
            assert_int_equal(end, 0);
            const float *x = e.data[0];
            for (int j = 0; j < 4; j++) memcpy(seq + ((size_t)((s * 4 + j) * w + r)) * NEL, x + j * NEL, NEL * sizeof(float));
        }
}

static void test_threads_replicas_resume(void **state) {
    (void)state;
    const size_t total = (size_t)3 * N * NEL;
    float *ref = calloc(total, sizeof *ref), *seq = calloc(total, sizeof *seq);
    mr_data_iter *one = replica(1, 0, 1);
    run(&one, 1, 0, ref);
    mr_data_iter_free(one);
    /* 4 threads, and 3 replicas with 1 and 4 threads: the same bytes at every global position */
    const int cases[][2] = {{1, 4}, {3, 1}, {3, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int w = cases[c][0], p = cases[c][1];
        mr_data_iter *its[3];
        for (int r = 0; r < w; r++) its[r] = replica(w, r, p);
        memset(seq, 0, total * sizeof *seq);
        run(its, w, 0, seq);
        if (memcmp(seq, ref, (size_t)(3 * N / (4 * w)) * 4 * w * NEL * sizeof(float)))
            fail_msg("%d replica(s), %d thread(s): augmented bytes differ from 1 replica, 1 thread", w, p);
        print_message("  %d replica(s) x %d thread(s): the augmented global sequence equals 1 x 1, bit for bit\n", w, p);
        for (int r = 0; r < w; r++) mr_data_iter_free(its[r]);
    }
    /* resume: 3 replicas save after 5 steps, 1 replica restores and finishes */
    mr_data_iter *its[3];
    for (int r = 0; r < 3; r++) its[r] = replica(3, r, 2);
    memset(seq, 0, total * sizeof *seq);
    for (int s = 0; s < 5; s++)
        for (int r = 0; r < 3; r++) {
            mr_data_elem e;
            int end = 1;
            MR_ASSERT_OK(mr_data_iter_next(its[r], &e, &end));
            for (int j = 0; j < 4; j++)
                memcpy(seq + ((size_t)((s * 4 + j) * 3 + r)) * NEL, (const float *)e.data[0] + j * NEL, NEL * sizeof(float));
        }
    void *blob = NULL;
    size_t bytes = 0;
    MR_ASSERT_OK(mr_data_iter_save_global(its[1], &blob, &bytes));
    mr_data_iter *res = replica(1, 0, 3);
    MR_ASSERT_OK(mr_data_iter_restore_global(res, blob, bytes));
    int got = 0;
    for (int k = 5 * 12;; k += 4) {
        mr_data_elem e;
        int end = 0;
        MR_ASSERT_OK(mr_data_iter_next(res, &e, &end));
        if (end) break;
        memcpy(seq + (size_t)k * NEL, e.data[0], 4 * NEL * sizeof(float));
        got += 4;
    }
    assert_int_equal(got, 3 * N - 5 * 12);
    assert_memory_equal(seq, ref, total * sizeof *seq);
    print_message("  3 replicas saved at step 5, resumed on 1: the rest of the augmented sequence, bit for bit\n");
    free(blob);
    mr_data_iter_free(res);
    for (int r = 0; r < 3; r++) mr_data_iter_free(its[r]);
    free(ref);
    free(seq);
}

static void test_errors(void **state) {
    (void)state;
    mr_dataset *src = images(), *out = (mr_dataset *)1;
    mr_augment_cfg a = full_cfg();
    a.op[0].size = 4;
    assert_int_equal(mr_data_augment(src, "x", &a, 1, 1, 1, &out), MR_ERR_INVALID);
    assert_null(out);
    assert_non_null(strstr(mr_last_error(), "random_crop: size 4 differs from the images' 5x5"));
    assert_non_null(strstr(mr_last_error(), "HINT: size: 5"));
    a = full_cfg();
    a.op[2].n = 1;
    assert_int_equal(mr_data_augment(src, "x", &a, 1, 1, 1, &out), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "normalize: 1 mean/std values for images of 2 channels"));
    a = full_cfg();
    a.op[1].p = 1.5;
    assert_int_equal(mr_data_augment(src, "x", &a, 1, 1, 1, &out), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "horizontal_flip: p = 1.5 outside [0, 1]"));
    a = full_cfg();
    a.op[2].std[1] = 0;
    assert_int_equal(mr_data_augment(src, "x", &a, 0, 1, 1, &out), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "channel 1: std 0 must be > 0"));
    a = full_cfg();
    assert_int_equal(mr_data_augment(src, "image", &a, 1, 1, 1, &out), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "no component 'image'"));
    assert_int_equal(mr_data_augment(src, "label", &a, 1, 1, 1, &out), MR_ERR_INVALID);
    assert_non_null(strstr(mr_last_error(), "augmentation takes f32 images"));
    assert_null(out);
    mr_data_free(src);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_draws_pinned),     cmocka_unit_test(test_reference_values),
                                       cmocka_unit_test(test_draw_statistics),  cmocka_unit_test(test_eval_normalize_only),
                                       cmocka_unit_test(test_threads_replicas_resume), cmocka_unit_test(test_errors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
