/* GPU data-movement and indexing ops against the f64 reference: EMBEDDING and EMBEDDING_BWD (the
 * GPT-2 shape with many repeated ids, a tiny vocabulary, a token in more positions than the
 * kernel sorts in shared memory, no ids at all), DROPOUT and DROPOUT_BWD (p = 0, 1 and between,
 * offsets across the 32-bit counter boundary), PERMUTE (every permutation of two 4-d tensors,
 * size-1 dims, big transposes, 8 dims), CONCAT (every dtype, absent inputs), MAXPOOL2D and
 * MAXPOOL2D_BWD (kernel/stride/padding combinations, ties, NaN, a large grid), AVGPOOL2D and
 * AVGPOOL2D_BWD (the same kinds of geometry, rows wider than the CPU kernel's chunk, a large
 * grid); f32 and f64.
 *
 * Besides the reference check (gpu_check_vs_ref: two GPU runs bit-identical, then within
 * tolerance), each op is run on the CPU backend with the same inputs and the GPU outputs must equal
 * the CPU's bit for bit: for dropout that is the promise that both backends drop the same
 * elements; for the scatter-adds (embedding_bwd, maxpool2d_bwd, avgpool2d_bwd) and the window
 * sums (avgpool2d) that the GPU sums in the CPU's order. The GPU inputs of that check start one
 * element past a 16-byte boundary half the time, so the kernels' unvectorised paths run too. Bad ids on the GPU (no sync to report them) give
 * NaN rows forward and are skipped backward, as core/cuda/embedding.cu documents.
 *
 * Without a usable GPU the program exits 77 and CTest reports it SKIPPED. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_util.h"

/* On the CUDA emulator (tests/emu/) every GPU thread is a CPU fiber: GPT-2's vocabulary and ids
 * with a narrower row, and a shorter big dropout vector (the same paths). A real GPU runs the
 * full sizes. */
#ifdef MIRROR_EMU
#define EMB_D 32
#define DROPOUT_BIG ((1 << 16) + 3)
#define AVG_BIG_C 8
#else
#define EMB_D 768
#define DROPOUT_BIG ((1 << 20) + 3)
#define AVG_BIG_C 64
#endif

/* n NaNs: outputs start as NaN so an element a kernel fails to write shows up. */
static double *nan_vals(int64_t n) {
    double *x = th_alloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

static mr_view nan_view(mr_shape s) { return gpu_f64_view(nan_vals(mr_shape_numel(&s)), s); }

static int is_float(mr_dtype dt) { return dt == MR_F32 || dt == MR_F64 || dt == MR_F16 || dt == MR_BF16; }

/* A host buffer of v's values in dtype t (float views converted, integer views copied). */
static void *host_as(const mr_view *v, mr_dtype t) {
    int64_t n = mr_shape_numel(&v->shape);
    void *h = th_alloc((size_t)(n ? n : 1) * mr_dtype_size(t));
    for (int64_t i = 0; i < n; i++) mr_dtype_set(h, t, i, mr_dtype_get(v->data, v->dtype, i));
    return h;
}

/* A GPU view of shape s and dtype t holding h's values; with shift, it starts one element into
 * its buffer (so not 16-byte aligned). *buf_out (if not NULL) gets the buffer's tensor. */
static mr_view gpu_view_at(const void *h, mr_dtype t, mr_shape s, int shift, mr_tensor **buf_out) {
    int64_t n = mr_shape_numel(&s);
    size_t es = mr_dtype_size(t);
    mr_tensor *buf = gpu_alloc(t, mr_shape_1d(n + shift));
    char *tmp = th_alloc((size_t)(n + shift) * es + 1);
    memset(tmp, 0, (size_t)shift * es);
    memcpy(tmp + (size_t)shift * es, h, (size_t)n * es);
    MR_ASSERT_OK(mr_tensor_copy_from_host(buf, tmp, (size_t)(n + shift) * es));
    mr_view v = mr_tensor_as_view(buf);
    v.data = (char *)v.data + (size_t)shift * es;
    v.shape = s;
    if (buf_out) *buf_out = buf;
    return v;
}

/* Runs r's op (reference args: f64 float views, integer views as they are) on the CPU backend and
 * on the GPU with float views in dt, on the same values, and asserts every GPU output equals the
 * CPU's byte for byte. shift: the GPU views start one element past an aligned address. */
static void gpu_vs_cpu_bits(const char *what, const mr_op_args *r, mr_dtype dt, int shift) {
    mr_op_args c = *r, g = *r;
    mr_tensor *gout[MR_OP_MAX_IO] = {0};
    for (int i = 0; i < r->n_in; i++) {
        if (!r->in[i].data) continue;
        mr_dtype t = is_float(r->in[i].dtype) ? dt : r->in[i].dtype;
        c.in[i].data = host_as(&r->in[i], t);
        c.in[i].dtype = t;
        g.in[i] = gpu_view_at(c.in[i].data, t, r->in[i].shape, shift, NULL);
    }
    for (int i = 0; i < r->n_out; i++) {
        if (!r->out[i].data) continue;
        /* both start from r's output values (NaN or zeros): the ops write every element */
        mr_dtype t = is_float(r->out[i].dtype) ? dt : r->out[i].dtype;
        c.out[i].data = host_as(&r->out[i], t);
        c.out[i].dtype = t;
        g.out[i] = gpu_view_at(c.out[i].data, t, r->out[i].shape, shift, &gout[i]);
    }
    th_give_workspace(&c);
    g.stream = NULL;
    g.device = 0;
    g.workspace_bytes = mr_op_workspace_bytes(&g);
    g.workspace = g.workspace_bytes ? mr_tensor_data(gpu_alloc(MR_U8, mr_shape_1d((int64_t)g.workspace_bytes))) : NULL;
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &c));
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CUDA, &g));
    for (int i = 0; i < r->n_out; i++) {
        if (!gout[i]) continue;
        int64_t n = mr_shape_numel(&r->out[i].shape);
        size_t es = mr_dtype_size(c.out[i].dtype), all = mr_tensor_nbytes(gout[i]);
        /* the buffer holds `shift` elements before the view */
        char *h = th_alloc(all + 1);
        MR_ASSERT_OK(mr_tensor_copy_to_host(gout[i], h, all));
        const char *gv = h + (size_t)shift * es, *cv = c.out[i].data;
        for (int64_t j = 0; j < n; j++)
            if (memcmp(gv + (size_t)j * es, cv + (size_t)j * es, es) != 0)
                fail_msg("%s (%s%s): out[%d][%lld]: GPU %.9g, CPU %.9g differ in their bits", what, mr_dtype_name(dt),
                         shift ? ", unaligned" : "", i, (long long)j, mr_dtype_get(gv, c.out[i].dtype, j),
                         mr_dtype_get(cv, c.out[i].dtype, j));
    }
}

/* ---- embedding -------------------------------------------------------------------------------- */

/* n ids in [0, vocab): with `hot` > 0, that share of them is id hot_id (a token in many
 * positions), and half of the rest come from the first 50 ids (as frequent tokens do). */
static mr_view make_ids(mr_shape s, int64_t vocab, double hot, int32_t hot_id, uint64_t seed) {
    int64_t n = mr_shape_numel(&s);
    mr_view v = th_view(MR_I32, s);
    int32_t *ids = v.data;
    double *u = th_alloc((size_t)(n ? n : 1) * sizeof(double));
    th_fill_uniform_f64(u, n, 0, 1, seed);
    th_fill_int32(ids, n, 0, (int32_t)vocab, seed + 1);
    int32_t few = vocab < 50 ? (int32_t)vocab : 50;
    for (int64_t i = 0; i < n; i++) {
        if (u[i] < hot)
            ids[i] = hot_id;
        else if (u[i] < hot + (1 - hot) / 2)
            ids[i] = ids[i] % few;
    }
    return v;
}

static mr_shape with_d(mr_shape s, int64_t d) {
    s.dim[s.ndim++] = d;
    return s;
}

typedef struct emb_case {
    int64_t vocab, d;
    mr_shape ids;
    double hot;
} emb_case;

static void test_embedding(void **state) {
    (void)state;
    const emb_case cases[] = {
        {50257, EMB_D, mr_shape_2d(8, 1024), 0.0}, /* GPT-2: 8192 ids, frequent ones repeat ~80 times */
        {65, 64, mr_shape_2d(4, 64), 0.0},       /* char-level vocabulary: every row hit ~4 times */
        {65, 96, mr_shape_1d(5000), 0.4},        /* one token in ~2000 positions: the rescan path */
        {7, 3, mr_shape_3d(2, 5, 11), 0.0},      /* odd D (scalar path) */
        {1, 1, mr_shape_1d(1), 0.0},
        {1000, 130, mr_shape_1d(3), 0.0},        /* most rows get no id: zeros */
        {10, 4, mr_shape_1d(0), 0.0},            /* no ids: dtable all zeros */
        {33, 32, mr_shape_1d(3000), 1.0},        /* every position the same id */
    };
    const mr_dtype dts[2] = {MR_F32, MR_F64};
    uint64_t seed = 1000;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (int di = 0; di < 2; di++) {
            const emb_case *c = &cases[k];
            mr_dtype dt = dts[di];
            /* the GPT-2 shape in f32 only: f64 runs the same code on 40M-element host copies */
            if (k == 0 && dt == MR_F64) continue;
            char what[128];
            mr_view ids = make_ids(c->ids, c->vocab, c->hot, (int32_t)(c->vocab / 2), seed++);
            mr_shape ts = mr_shape_2d(c->vocab, c->d), ys = with_d(c->ids, c->d);
            mr_op_args f;
            mr_op_args_init(&f, MR_OP_EMBEDDING);
            f.in[0] = gpu_f64_view(gpu_rand(mr_shape_numel(&ts), -1, 1, seed++, dt), ts);
            f.in[1] = ids;
            f.out[0] = nan_view(ys);
            snprintf(what, sizeof what, "embedding V%lld D%lld case %zu %s", (long long)c->vocab, (long long)c->d, k,
                     mr_dtype_name(dt));
            gpu_check_vs_ref(what, &f, dt, dt, 0.0, 0.0, 0.0);
            gpu_vs_cpu_bits(what, &f, dt, (int)(k & 1));
            mr_op_args b;
            mr_op_args_init(&b, MR_OP_EMBEDDING_BWD);
            b.in[0] = ids;
            b.in[1] = gpu_f64_view(gpu_rand(mr_shape_numel(&ys), -1, 1, seed++, dt), ys);
            b.out[0] = nan_view(ts);
            snprintf(what, sizeof what, "embedding_bwd V%lld D%lld case %zu %s", (long long)c->vocab,
                     (long long)c->d, k, mr_dtype_name(dt));
            /* f64 sums in the reference's order: exact; f32 sums round in f32 */
            if (dt == MR_F64)
                gpu_check_vs_ref(what, &b, dt, dt, 0.0, 0.0, 0.0);
            else
                gpu_check_vs_ref(what, &b, dt, dt, TOL_F32_REDUCE_ATOL, TOL_F32_REDUCE_RTOL, TOL_F32_REDUCE_NMSE);
            gpu_vs_cpu_bits(what, &b, dt, (int)(k & 1));
            gpu_free_all();
        }
}

/* Ids outside [0, V) on the GPU: the gather fills their rows with NaN and the scatter-add skips
 * them (no sync to report them); the other rows are exact. */
static void test_embedding_bad_ids(void **state) {
    (void)state;
    const int64_t vocab = 9, d = 5, n = 6;
    int32_t ids[6] = {2, -1, 8, 9, 2, 0};
    mr_view idv = th_view(MR_I32, mr_shape_1d(n));
    memcpy(idv.data, ids, sizeof ids);
    double *table = gpu_rand(vocab * d, -1, 1, 77, MR_F32), *dy = gpu_rand(n * d, -1, 1, 78, MR_F32);
    mr_view gids = gpu_view_at(idv.data, MR_I32, mr_shape_1d(n), 0, NULL);
    mr_op_args f;
    mr_op_args_init(&f, MR_OP_EMBEDDING);
    f.in[0] = mr_tensor_as_view(gpu_upload(table, MR_F32, mr_shape_2d(vocab, d)));
    f.in[1] = gids;
    mr_tensor *y = gpu_alloc(MR_F32, mr_shape_2d(n, d));
    f.out[0] = mr_tensor_as_view(y);
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CUDA, &f));
    double *hy = gpu_download(y);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < d; j++) {
            int bad = ids[i] < 0 || ids[i] >= vocab;
            if (bad ? !isnan(hy[i * d + j]) : hy[i * d + j] != table[ids[i] * d + j])
                fail_msg("embedding bad ids: y[%lld][%lld] = %g", (long long)i, (long long)j, hy[i * d + j]);
        }
    /* backward: the reference on the same ids with the bad tokens' dy zeroed and their ids made 0 */
    mr_op_args b;
    mr_op_args_init(&b, MR_OP_EMBEDDING_BWD);
    b.in[0] = gids;
    b.in[1] = mr_tensor_as_view(gpu_upload(dy, MR_F32, mr_shape_2d(n, d)));
    mr_tensor *dtab = gpu_upload(nan_vals(vocab * d), MR_F32, mr_shape_2d(vocab, d));
    b.out[0] = mr_tensor_as_view(dtab);
    b.workspace_bytes = mr_op_workspace_bytes(&b);
    b.workspace = mr_tensor_data(gpu_alloc(MR_U8, mr_shape_1d((int64_t)b.workspace_bytes)));
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CUDA, &b));
    mr_op_args r;
    mr_op_args_init(&r, MR_OP_EMBEDDING_BWD);
    r.in[0] = th_view(MR_I32, mr_shape_1d(n));
    r.in[1] = gpu_f64_view(dy, mr_shape_2d(n, d));
    r.out[0] = th_view(MR_F64, mr_shape_2d(vocab, d));
    for (int64_t i = 0; i < n; i++) {
        int bad = ids[i] < 0 || ids[i] >= vocab;
        ((int32_t *)r.in[0].data)[i] = bad ? 0 : ids[i];
        if (bad)
            for (int64_t j = 0; j < d; j++) ((double *)r.in[1].data)[i * d + j] = 0.0;
    }
    MR_ASSERT_OK(mr_op_run_ref(&r));
    assert_true(th_compare("embedding_bwd bad ids", gpu_download(dtab), MR_F64, r.out[0].data, vocab * d,
                           TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE));
    gpu_free_all();
}

/* ---- dropout ---------------------------------------------------------------------------------- */

static void test_dropout(void **state) {
    (void)state;
    const double ps[5] = {0.0, 0.1, 0.5, 0.9, 1.0};
    const int64_t ns[5] = {1, 3, 1001, 4097, DROPOUT_BIG};
    const uint64_t offsets[3] = {0, 5, 0xFFFFFFFFull - 7}; /* the last crosses the counter's low word */
    const mr_op_id ops[2] = {MR_OP_DROPOUT, MR_OP_DROPOUT_BWD};
    const mr_dtype dts[2] = {MR_F32, MR_F64};
    uint64_t seed = 2000;
    for (int pi = 0; pi < 5; pi++)
        for (int ni = 0; ni < 5; ni++)
            for (int oi = 0; oi < 3; oi++)
                for (int di = 0; di < 2; di++) {
                    mr_op_id op = ops[(pi + ni + oi) & 1];
                    mr_dtype dt = dts[di];
                    mr_shape s = mr_shape_1d(ns[ni]);
                    mr_op_args r;
                    mr_op_args_init(&r, op);
                    r.p.dropout.p = ps[pi];
                    r.p.dropout.seed = 0x0123456789ABCDEFull + (uint64_t)ni;
                    r.p.dropout.offset = offsets[oi];
                    /* nonzero inputs, so a dropped element (0) is always visible */
                    r.in[0] = gpu_f64_view(gpu_rand(ns[ni], 0.5, 2, seed++, dt), s);
                    r.out[0] = nan_view(s);
                    char what[128];
                    snprintf(what, sizeof what, "%s p%g n%lld offset%llu %s", mr_op_get(op)->name, ps[pi],
                             (long long)ns[ni], (unsigned long long)offsets[oi], mr_dtype_name(dt));
                    gpu_check_vs_ref(what, &r, dt, dt, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
                    /* the same elements dropped as on the CPU, and the same kept values */
                    gpu_vs_cpu_bits(what, &r, dt, (ni + oi) & 1);
                    gpu_free_all();
                }
}

/* ---- permute ---------------------------------------------------------------------------------- */

static void permute_case(mr_shape xs, const int *perm, mr_dtype dt, uint64_t seed, int shift) {
    mr_op_args r;
    mr_op_args_init(&r, MR_OP_PERMUTE);
    mr_shape ys = xs;
    for (int i = 0; i < xs.ndim; i++) {
        r.p.permute.perm[i] = perm[i];
        ys.dim[i] = xs.dim[perm[i]];
    }
    r.in[0] = gpu_f64_view(gpu_rand(mr_shape_numel(&xs), -1, 1, seed, dt), xs);
    r.out[0] = nan_view(ys);
    char what[200], b[128];
    int at = snprintf(what, sizeof what, "permute %s perm", mr_shape_str(&xs, b, sizeof b));
    for (int i = 0; i < xs.ndim && at < (int)sizeof what - 4; i++)
        at += snprintf(what + at, sizeof what - (size_t)at, " %d", perm[i]);
    gpu_check_vs_ref(what, &r, dt, dt, 0.0, 0.0, 0.0);
    gpu_vs_cpu_bits(what, &r, dt, shift);
    gpu_free_all();
}

static void test_permute(void **state) {
    (void)state;
    /* every permutation of 4 dims, on a tensor whose last dim is short (element gather) and on one
     * whose last dim is long (row copies), and with size-1 dims (merged away) */
    const mr_shape shapes4[3] = {mr_shape_4d(3, 5, 7, 11), mr_shape_4d(2, 3, 4, 40), mr_shape_4d(2, 1, 33, 1)};
    uint64_t seed = 3000;
    for (int si = 0; si < 3; si++)
        for (int p = 0; p < 24; p++) {
            /* the p-th permutation of 0..3 in lexicographic order */
            int pool[4] = {0, 1, 2, 3}, perm[4], rem = p, fact[4] = {6, 2, 1, 1};
            for (int i = 0; i < 4; i++) {
                int k = rem / fact[i];
                rem %= fact[i];
                perm[i] = pool[k];
                for (int j = k; j < 3 - i; j++) pool[j] = pool[j + 1];
            }
            for (int di = 0; di < 2; di++)
                permute_case(shapes4[si], perm, di ? MR_F64 : MR_F32, seed++, p & 1);
        }
    /* big transposes: tiles with ragged edges, many tiles, a batch of them */
    const int t2[2] = {1, 0}, t3[3] = {0, 2, 1}, r3[3] = {2, 1, 0}, a4[4] = {0, 2, 1, 3};
    permute_case(mr_shape_2d(1000, 1031), t2, MR_F32, seed++, 0);
    permute_case(mr_shape_2d(1000, 1031), t2, MR_F64, seed++, 1);
    permute_case(mr_shape_3d(3, 67, 129), t3, MR_F32, seed++, 0);
    permute_case(mr_shape_3d(37, 3, 300), r3, MR_F32, seed++, 1);
    permute_case(mr_shape_2d(1, 100000), t2, MR_F32, seed++, 0); /* a row vector: a copy */
    permute_case(mr_shape_2d(100000, 2), t2, MR_F32, seed++, 0);  /* a thin transpose */
    /* attention's (B,T,H,D) -> (B,H,T,D) */
    permute_case(mr_shape_4d(4, 64, 12, 64), a4, MR_F32, seed++, 0);
    /* 8 dims, reversed and rotated */
    const int64_t d8[8] = {2, 3, 2, 3, 2, 3, 2, 5};
    const int rev8[8] = {7, 6, 5, 4, 3, 2, 1, 0}, rot8[8] = {3, 4, 5, 6, 7, 0, 1, 2};
    const int mix8[8] = {1, 0, 7, 3, 2, 5, 4, 6};
    permute_case(mr_shape_make(8, d8), rev8, MR_F32, seed++, 0);
    permute_case(mr_shape_make(8, d8), rot8, MR_F64, seed++, 1);
    permute_case(mr_shape_make(8, d8), mix8, MR_F32, seed++, 1);
}

/* The CPU's permute into a half type (core/ops.h MR_OP_PERMUTE) is refused by the CUDA kernel,
 * naming what it does not do, instead of writing f32 bytes into a half tensor. */
static void test_permute_cast_refused(void **state) {
    (void)state;
    const mr_shape xs = mr_shape_2d(4, 6), ys = mr_shape_2d(6, 4);
    mr_op_args f;
    mr_op_args_init(&f, MR_OP_PERMUTE);
    f.p.permute.perm[0] = 1;
    f.in[0] = mr_tensor_as_view(gpu_upload(gpu_rand(mr_shape_numel(&xs), -1, 1, 78, MR_F32), MR_F32, xs));
    f.out[0] = mr_tensor_as_view(gpu_alloc(MR_BF16, ys));
    f.device = 0;
    const mr_status st = mr_op_run(MR_DEVICE_CUDA, &f);
    printf("permute f32 -> bf16 on cuda:0: %s: %s\n", mr_status_name(st), mr_last_error());
    assert_int_equal(st, MR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mr_last_error(), "does not cast"));
    gpu_free_all();
}

/* ---- concat ----------------------------------------------------------------------------------- */

/* Values of dtype t that the dtype holds exactly. */
static mr_view concat_in(mr_dtype t, int64_t n, uint64_t seed) {
    mr_shape s = mr_shape_1d(n);
    if (is_float(t)) return gpu_f64_view(gpu_rand(n, -4, 4, seed, t), s);
    mr_view v = th_view(t, s);
    int32_t *tmp = th_alloc((size_t)(n ? n : 1) * sizeof(int32_t));
    th_fill_int32(tmp, n, t == MR_U8 ? 0 : -100000, t == MR_U8 ? 256 : 100000, seed);
    for (int64_t i = 0; i < n; i++) mr_dtype_set(v.data, t, i, (double)tmp[i]);
    return v;
}

static void test_concat(void **state) {
    (void)state;
    const mr_dtype dts[7] = {MR_F32, MR_F64, MR_F16, MR_BF16, MR_I32, MR_I64, MR_U8};
    /* element counts per input; -1: absent (data NULL) */
    const int64_t sizes[4][MR_OP_MAX_IO] = {
        {5, -1, 21, 1, -1, 1000},
        {7, -1, -1, -1, -1, -1},
        {-1, 3, 0, 4097, 2, 65537},
        {1, 1, 1, 1, 1, 1},
    };
    uint64_t seed = 4000;
    for (int di = 0; di < 7; di++)
        for (int c = 0; c < 4; c++) {
            mr_dtype t = dts[di];
            mr_op_args r;
            mr_op_args_init(&r, MR_OP_CONCAT);
            int64_t total = 0;
            for (int i = 0; i < MR_OP_MAX_IO; i++) {
                if (sizes[c][i] < 0) continue;
                r.in[i] = concat_in(t, sizes[c][i], seed++);
                total += sizes[c][i];
            }
            mr_shape ys = mr_shape_1d(total);
            r.out[0] = is_float(t) ? nan_view(ys) : th_view(t, ys);
            char what[96];
            snprintf(what, sizeof what, "concat case %d %s", c, mr_dtype_name(t));
            mr_dtype dt = is_float(t) ? t : MR_F32;
            gpu_check_vs_ref(what, &r, dt, dt, 0.0, 0.0, 0.0);
            gpu_vs_cpu_bits(what, &r, dt, c & 1);
            gpu_free_all();
        }
}

/* ---- max pooling ------------------------------------------------------------------------------ */

typedef struct pool_case {
    int64_t n, c, h, w;
    int kh, kw, sh, sw, ph, pw;
    int ties, nans;
} pool_case;

static void test_maxpool(void **state) {
    (void)state;
    const pool_case cases[] = {
        {2, 3, 8, 8, 2, 2, 2, 2, 0, 0, 0, 0},     /* the CNN case */
        {2, 3, 8, 8, 2, 2, 2, 2, 0, 0, 1, 0},     /* ... with ties */
        {1, 2, 7, 9, 3, 3, 2, 2, 1, 1, 1, 0},     /* odd sizes, padding, overlapping windows */
        {2, 1, 5, 6, 3, 3, 1, 1, 1, 1, 1, 0},     /* stride 1: an element in up to 9 windows */
        {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},
        {3, 2, 11, 13, 3, 2, 1, 3, 1, 1, 1, 0},   /* different kernel, stride, padding per axis */
        {1, 1, 4, 4, 4, 4, 4, 4, 2, 2, 0, 0},     /* padding half the kernel */
        {1, 2, 10, 10, 2, 2, 3, 3, 0, 0, 0, 0},   /* stride > kernel: uncovered elements get 0 */
        {2, 2, 9, 7, 3, 3, 2, 2, 1, 1, 0, 1},     /* NaN wins and stays */
        {8, 64, 56, 56, 3, 3, 2, 2, 1, 1, 1, 0},  /* a large grid (ResNet's stem pool) */
    };
    const mr_dtype dts[2] = {MR_F32, MR_F64};
    uint64_t seed = 5000;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (int di = 0; di < 2; di++) {
            const pool_case *pc = &cases[k];
            mr_dtype dt = dts[di];
            mr_pool_params pp = {pc->kh, pc->kw, pc->sh, pc->sw, pc->ph, pc->pw, 0};
            int64_t oh = (pc->h + 2 * pc->ph - pc->kh) / pc->sh + 1, ow = (pc->w + 2 * pc->pw - pc->kw) / pc->sw + 1;
            mr_shape xs = mr_shape_4d(pc->n, pc->c, pc->h, pc->w), ys = mr_shape_4d(pc->n, pc->c, oh, ow);
            int64_t nx = mr_shape_numel(&xs), ny = mr_shape_numel(&ys);
            double *x = gpu_rand(nx, -2, 2, seed++, dt);
            for (int64_t i = 0; i < nx; i++) {
                if (pc->ties) x[i] = floor(x[i]); /* 4 values: windows full of ties */
                if (pc->nans && i % 7 == 3) x[i] = NAN;
            }
            mr_op_args f;
            mr_op_args_init(&f, MR_OP_MAXPOOL2D);
            f.p.pool = pp;
            f.in[0] = gpu_f64_view(x, xs);
            f.out[0] = nan_view(ys);
            f.out[1] = th_view(MR_I32, ys);
            char what[160];
            snprintf(what, sizeof what, "maxpool2d case %zu (%lld,%lld,%lld,%lld) k%dx%d s%dx%d p%dx%d %s", k,
                     (long long)pc->n, (long long)pc->c, (long long)pc->h, (long long)pc->w, pc->kh, pc->kw, pc->sh,
                     pc->sw, pc->ph, pc->pw, mr_dtype_name(dt));
            gpu_check_vs_ref(what, &f, dt, dt, 0.0, 0.0, 0.0);
            gpu_vs_cpu_bits(what, &f, dt, (int)(k & 1));
            /* the backward from the forward's argmax (f.out[1] now holds the reference's) */
            mr_op_args b;
            mr_op_args_init(&b, MR_OP_MAXPOOL2D_BWD);
            b.p.pool = pp;
            b.in[0] = f.out[1];
            b.in[1] = gpu_f64_view(gpu_rand(ny, -1, 1, seed++, dt), ys);
            b.out[0] = nan_view(xs);
            snprintf(what, sizeof what, "maxpool2d_bwd case %zu %s", k, mr_dtype_name(dt));
            /* the sums happen in the reference's order: exact in f64, f32-rounded in f32 */
            if (dt == MR_F64)
                gpu_check_vs_ref(what, &b, dt, dt, 0.0, 0.0, 0.0);
            else
                gpu_check_vs_ref(what, &b, dt, dt, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
            gpu_vs_cpu_bits(what, &b, dt, (int)(k & 1));
            gpu_free_all();
        }
}

/* The CPU's fused ReLU gradient (p.pool.relu, core/ops.h MR_OP_MAXPOOL2D) is refused by the CUDA
 * kernel, naming the option, instead of being ignored (an argmax without the ReLU's -1s). */
static void test_maxpool_relu_refused(void **state) {
    (void)state;
    mr_shape xs = mr_shape_4d(1, 2, 4, 4), ys = mr_shape_4d(1, 2, 2, 2);
    mr_op_args f;
    mr_op_args_init(&f, MR_OP_MAXPOOL2D);
    f.p.pool = (mr_pool_params){2, 2, 2, 2, 0, 0, 1};
    f.in[0] = mr_tensor_as_view(gpu_upload(gpu_rand(mr_shape_numel(&xs), -1, 1, 77, MR_F32), MR_F32, xs));
    f.out[0] = mr_tensor_as_view(gpu_alloc(MR_F32, ys));
    f.out[1] = mr_tensor_as_view(gpu_alloc(MR_I32, ys));
    f.device = 0;
    const mr_status st = mr_op_run(MR_DEVICE_CUDA, &f);
    printf("maxpool2d with p.pool.relu on cuda:0: %s: %s\n", mr_status_name(st), mr_last_error());
    assert_int_equal(st, MR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mr_last_error(), "p.pool.relu"));
    gpu_free_all();
}

/* ---- average pooling -------------------------------------------------------------------------- */

static void test_avgpool(void **state) {
    (void)state;
    const pool_case cases[] = {
        {2, 3, 8, 8, 2, 2, 2, 2, 0, 0, 0, 0},          /* a CNN case */
        {1, 2, 7, 9, 3, 3, 2, 2, 1, 1, 0, 0},          /* odd sizes, padding, overlapping windows */
        {2, 1, 5, 6, 3, 3, 1, 1, 1, 1, 0, 0},          /* stride 1: an element in up to 9 windows */
        {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},
        {3, 2, 11, 13, 3, 2, 1, 3, 1, 1, 0, 0},        /* different kernel, stride, padding per axis */
        {1, 1, 4, 4, 4, 4, 4, 4, 2, 2, 0, 0},          /* padding half the kernel */
        {1, 2, 10, 10, 2, 2, 3, 3, 0, 0, 0, 0},        /* stride > kernel: uncovered elements get 0 */
        {1, 2, 3, 600, 3, 3, 1, 1, 1, 1, 0, 0},        /* rows wider than the CPU's chunk */
        {1, 1, 4, 700, 2, 5, 2, 3, 1, 2, 0, 0},        /* ... with a general stride */
        {2, AVG_BIG_C, 56, 56, 3, 3, 2, 2, 1, 1, 0, 0}, /* a large grid */
    };
    const mr_dtype dts[2] = {MR_F32, MR_F64};
    uint64_t seed = 6000;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (int di = 0; di < 2; di++) {
            const pool_case *pc = &cases[k];
            mr_dtype dt = dts[di];
            mr_pool_params pp = {pc->kh, pc->kw, pc->sh, pc->sw, pc->ph, pc->pw, 0};
            int64_t oh = (pc->h + 2 * pc->ph - pc->kh) / pc->sh + 1, ow = (pc->w + 2 * pc->pw - pc->kw) / pc->sw + 1;
            mr_shape xs = mr_shape_4d(pc->n, pc->c, pc->h, pc->w), ys = mr_shape_4d(pc->n, pc->c, oh, ow);
            int64_t nx = mr_shape_numel(&xs), ny = mr_shape_numel(&ys);
            mr_op_args f;
            mr_op_args_init(&f, MR_OP_AVGPOOL2D);
            f.p.pool = pp;
            f.in[0] = gpu_f64_view(gpu_rand(nx, -2, 2, seed++, dt), xs);
            f.out[0] = nan_view(ys);
            char what[160];
            snprintf(what, sizeof what, "avgpool2d case %zu (%lld,%lld,%lld,%lld) k%dx%d s%dx%d p%dx%d %s", k,
                     (long long)pc->n, (long long)pc->c, (long long)pc->h, (long long)pc->w, pc->kh, pc->kw, pc->sh,
                     pc->sw, pc->ph, pc->pw, mr_dtype_name(dt));
            /* the window sums in the reference's order: exact in f64, f32-rounded in f32 */
            if (dt == MR_F64)
                gpu_check_vs_ref(what, &f, dt, dt, 0.0, 0.0, 0.0);
            else
                gpu_check_vs_ref(what, &f, dt, dt, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
            gpu_vs_cpu_bits(what, &f, dt, (int)(k & 1));
            mr_op_args b;
            mr_op_args_init(&b, MR_OP_AVGPOOL2D_BWD);
            b.p.pool = pp;
            b.in[0] = gpu_f64_view(gpu_rand(ny, -1, 1, seed++, dt), ys);
            b.out[0] = nan_view(xs);
            snprintf(what, sizeof what, "avgpool2d_bwd case %zu %s", k, mr_dtype_name(dt));
            if (dt == MR_F64)
                gpu_check_vs_ref(what, &b, dt, dt, 0.0, 0.0, 0.0);
            else
                gpu_check_vs_ref(what, &b, dt, dt, TOL_F32_ATOL, TOL_F32_RTOL, TOL_F32_NMSE);
            gpu_vs_cpu_bits(what, &b, dt, (int)(k & 1));
            gpu_free_all();
        }
}

int main(void) {
    if (gpu_none()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding), cmocka_unit_test(test_embedding_bad_ids), cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_permute),   cmocka_unit_test(test_permute_cast_refused), cmocka_unit_test(test_concat),            cmocka_unit_test(test_maxpool),
        cmocka_unit_test(test_maxpool_relu_refused),
        cmocka_unit_test(test_avgpool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
