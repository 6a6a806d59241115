/* PyTorch parity of the models: mr_model_build's MLP, CNN and GPT-2, with the parameters, inputs
 * and labels of tests/fixtures/<model>.bin (written by tests/gen_fixtures.py, which builds the
 * same tiny models in PyTorch), must give PyTorch's logits, loss and every parameter's gradient,
 * in f64 and in f32. The fixture's parameter names must map 1:1 onto the registry's (names and
 * shapes), which is what lets a PyTorch state_dict load into a mirror model.
 *
 * The same for a layer graph (tests/fixtures/graph.bin: conv2d, batch norm, a residual block
 * with an identity and one with a 1x1-conv shortcut, global average pooling, flatten, linear),
 * built from the YAML text the fixture holds through mr_experiment_parse, in training mode (batch
 * statistics; the updated running_mean, running_var and num_batches_tracked must be torch's too,
 * and the buffers must map 1:1 onto the state_dict's) and in evaluation mode (the running
 * statistics of the fixture).
 *
 * Fails closed: a missing fixture file, a missing tensor, a parameter or buffer on one side only
 * or a shape that differs is a failure, never a skip.
 *
 * Fixture format (see gen_fixtures.py): "MRFX1\n", u32 count, then per tensor u16 name length,
 * name, u8 dtype (0 f32, 1 f64, 2 i32, 3 u8), u8 ndim, ndim x i64 dims, raw little-endian data. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "autodiff/graph.h"
#include "autodiff/graph_impl.h"
#include "autodiff/nn.h"
#include "launch/config.h"
#include "models/models.h"

/* ---- fixture reader ---------------------------------------------------------------------------- */

typedef struct fx_tensor {
    char name[128];
    mr_dtype dt; /* MR_F32, MR_F64, MR_I32 or MR_U8 */
    mr_shape shape;
    int64_t numel;
    void *data; /* test-owned (th_alloc) */
} fx_tensor;

typedef struct fx_file {
    int n;
    fx_tensor *t;
} fx_file;

/* "<directory of this source file>/../fixtures/<name>": __FILE__ is absolute in the CMake build,
 * so the test finds its fixtures from any working directory. MIRROR_FIXTURES_DIR overrides. */
static void fx_path(const char *name, char *buf, size_t cap) {
    const char *env = getenv("MIRROR_FIXTURES_DIR");
    if (env && *env) {
        snprintf(buf, cap, "%s/%s", env, name);
        return;
    }
    const char *file = __FILE__;
    const char *slash = strrchr(file, '/');
    int dir_len = slash ? (int)(slash - file) : 1;
    snprintf(buf, cap, "%.*s/../fixtures/%s", dir_len, slash ? file : ".", name);
}

static void fx_read(FILE *f, void *dst, size_t bytes, const char *path, const char *what) {
    if (fread(dst, 1, bytes, f) != bytes) fail_msg("%s: truncated while reading %s", path, what);
}

/* Reads a whole fixture (little-endian host assumed, as everywhere mirror runs). */
static fx_file fx_load(const char *name) {
    char path[1024];
    fx_path(name, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open fixture %s (HINT: tests/gen_fixtures.py writes it; its header says how)", path);
    char magic[6];
    fx_read(f, magic, 6, path, "the magic");
    if (memcmp(magic, "MRFX1\n", 6)) fail_msg("%s: bad magic, not an MRFX1 fixture", path);
    uint32_t count;
    fx_read(f, &count, 4, path, "the count");
    if (count == 0 || count > 100000) fail_msg("%s: implausible tensor count %u", path, count);
    fx_file fx = {.n = (int)count, .t = th_alloc(sizeof(fx_tensor) * count)};
    for (uint32_t i = 0; i < count; i++) {
        fx_tensor *t = &fx.t[i];
        uint16_t len;
        fx_read(f, &len, 2, path, "a name length");
        if (len == 0 || len >= sizeof t->name) fail_msg("%s: tensor %u has a name of %u bytes", path, i, len);
        fx_read(f, t->name, len, path, "a name");
        t->name[len] = 0;
        uint8_t code, ndim;
        fx_read(f, &code, 1, path, t->name);
        fx_read(f, &ndim, 1, path, t->name);
        if (code > 3 || ndim > MR_MAX_DIMS) fail_msg("%s: '%s' has dtype code %u, ndim %u", path, t->name, code, ndim);
        t->dt = code == 0 ? MR_F32 : code == 1 ? MR_F64 : code == 2 ? MR_I32 : MR_U8;
        int64_t dims[MR_MAX_DIMS];
        fx_read(f, dims, sizeof(int64_t) * ndim, path, t->name);
        t->shape = mr_shape_make(ndim, dims);
        t->numel = mr_shape_numel(&t->shape);
        size_t bytes = (size_t)t->numel * mr_dtype_size(t->dt);
        t->data = th_alloc(bytes);
        fx_read(f, t->data, bytes, path, t->name);
    }
    char extra;
    if (fread(&extra, 1, 1, f) != 0) fail_msg("%s: trailing bytes after %u tensors", path, count);
    fclose(f);
    return fx;
}

static const fx_tensor *fx_find(const fx_file *fx, const char *name) {
    for (int i = 0; i < fx->n; i++)
        if (!strcmp(fx->t[i].name, name)) return &fx->t[i];
    return NULL;
}

static const fx_tensor *fx_get(const fx_file *fx, const char *name) {
    const fx_tensor *t = fx_find(fx, name);
    if (!t) fail_msg("fixture has no tensor '%s'", name);
    return t;
}

/* A fixture tensor's values as f64 (test-owned). */
static double *fx_f64(const fx_tensor *t) {
    if (t->dt == MR_U8) fail_msg("fixture tensor '%s' is u8 (text), not numbers", t->name);
    double *d = th_alloc(sizeof(double) * (size_t)(t->numel ? t->numel : 1));
    for (int64_t i = 0; i < t->numel; i++)
        d[i] = t->dt == MR_F32 ? ((const float *)t->data)[i]
             : t->dt == MR_F64 ? ((const double *)t->data)[i]
                               : ((const int32_t *)t->data)[i];
    return d;
}

/* Parameters are every tensor without a prefix ("f64/", "f32/", "buffers/": torch's names have no
 * '/') other than x, y and yaml. */
static int fx_is_param(const fx_tensor *t) {
    return !strchr(t->name, '/') && strcmp(t->name, "x") && strcmp(t->name, "y") && strcmp(t->name, "yaml");
}

/* The fixture tensor that registry entry `name` maps to: "<pfx><name>" when pfx is a prefix
 * ("buffers/"), else `name` itself if it is a parameter. */
static const fx_tensor *fx_entry(const fx_file *fx, const char *pfx, const char *name) {
    char full[256];
    snprintf(full, sizeof full, "%s%s", pfx, name);
    const fx_tensor *t = fx_find(fx, full);
    return t && (*pfx || fx_is_param(t)) ? t : NULL;
}

/* The fixture's entries of that kind: "<pfx>..." tensors, or the parameters when pfx is "". */
static const char *fx_entry_name(const fx_tensor *t, const char *pfx) {
    if (!*pfx) return fx_is_param(t) ? t->name : NULL;
    return strncmp(t->name, pfx, strlen(pfx)) ? NULL : t->name + strlen(pfx);
}

/* Registry r's names and shapes must map 1:1 onto the fixture's f32 entries (pfx as fx_entry):
 * fails the test with every mismatch listed otherwise. */
static void check_map(const char *what, const mr_params *r, const fx_file *fx, const char *pfx) {
    const int np = mr_params_count(r);
    char msg[4096] = "";
    size_t ml = 0;
    int bad = 0;
    for (int32_t i = 0; i < np; i++) {
        const fx_tensor *t = fx_entry(fx, pfx, mr_params_name(r, i));
        mr_shape s = mr_params_shape(r, i);
        char b1[128], b2[128];
        if (!t) {
            ml += (size_t)snprintf(msg + ml, sizeof msg - ml, "\n  '%s' %s: in the model, not in the fixture",
                                   mr_params_name(r, i), mr_shape_str(&s, b1, 128));
            bad++;
        } else if (!mr_shape_eq(&s, &t->shape) || t->dt != MR_F32) {
            ml += (size_t)snprintf(msg + ml, sizeof msg - ml, "\n  '%s': model %s, fixture %s %s", t->name,
                                   mr_shape_str(&s, b1, 128), mr_dtype_name(t->dt), mr_shape_str(&t->shape, b2, 128));
            bad++;
        }
        if (ml >= sizeof msg) ml = sizeof msg - 1;
    }
    int n_fx = 0;
    for (int i = 0; i < fx->n; i++) {
        const char *name = fx_entry_name(&fx->t[i], pfx);
        if (!name) continue;
        n_fx++;
        if (mr_params_find(r, name) < 0) {
            char b[128];
            ml += (size_t)snprintf(msg + ml, sizeof msg - ml, "\n  '%s' %s: in the fixture, not in the model",
                                   fx->t[i].name, mr_shape_str(&fx->t[i].shape, b, 128));
            bad++;
        }
        if (ml >= sizeof msg) ml = sizeof msg - 1;
    }
    if (bad) fail_msg("%s: %d %s do not map 1:1 (model %d, fixture %d):%s", what, bad, *pfx ? "buffer(s)" : "parameter(s)",
                      np, n_fx, msg);
}

/* ---- comparison ---------------------------------------------------------------------------------- */

typedef struct errs {
    double abs, rel, nmse; /* max |x-ref|, max |x-ref|/|ref| over |ref| > 1e-3, max NMSE of a tensor */
} errs;

/* Updates the running maxima (for the summary and the tolerance comments). */
static void track(const void *x, mr_dtype dt, const fx_tensor *ref_t, errs *e) {
    const double *ref = fx_f64(ref_t);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < ref_t->numel; i++) {
        double v = dt == MR_F32 ? ((const float *)x)[i] : ((const double *)x)[i];
        double d = fabs(v - ref[i]);
        if (d > e->abs) e->abs = d;
        if (fabs(ref[i]) > 1e-3 && d / fabs(ref[i]) > e->rel) e->rel = d / fabs(ref[i]);
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (den > 0 && num / den > e->nmse) e->nmse = num / den;
}

/* th_compare plus the running maxima. */
static int cmp_track(const char *what, const void *x, mr_dtype dt, const fx_tensor *ref_t, double atol, double rtol,
                     double nmse, errs *e) {
    track(x, dt, ref_t, e);
    return th_compare(what, x, dt, fx_f64(ref_t), ref_t->numel, atol, rtol, nmse);
}

typedef struct tols {
    double atol, rtol, nmse;        /* logits and loss */
    double g_atol, g_rtol, g_nmse;  /* gradients */
} tols;

/* ---- one model, one dtype ------------------------------------------------------------------------ */

/* The GEMM nodes of g with bf16 operands, and all of them (mixed precision: which ran in bf16). */
static void count_gemms(const mr_graph *g, int *bf16, int *all) {
    *bf16 = *all = 0;
    for (int32_t i = 0; i < g->nnodes; i++) {
        const mr_gnode *nd = &g->nodes[i];
        if (nd->op != MR_OP_GEMM) continue;
        (*all)++;
        *bf16 += g->vals[nd->in[0]].dtype == MR_BF16 && g->vals[nd->in[1]].dtype == MR_BF16;
    }
}

/* The mixed GPT's fusions (autodiff/nn.c, grad.c): no CAST reads a softmax's probabilities or its
 * gradient (the softmax writes bf16 probabilities, its backward a bf16 gradient), the attention's
 * permutes write bf16 q, k, v and c_proj's input, and every biased linear's dC, bias gradient and
 * GELU gradient come from one GEMM_DC (no GELU_BWD or SUM nodes are left). */
static void check_mixed_fusions(const mr_graph *g, int layers) {
    int casts = 0, sm_bf = 0, smb_bf = 0, perm_bf = 0, dc = 0, gelu_bwd = 0, sums = 0;
    for (int32_t i = 0; i < g->nnodes; i++) {
        const mr_gnode *nd = &g->nodes[i];
        const mr_dtype out = g->vals[nd->out[0]].dtype;
        if (nd->op == MR_OP_CAST) {
            casts++;
            const mr_gval *x = &g->vals[nd->in[0]];
            const mr_op_id from = x->kind == MR_VAL_NODE ? g->nodes[x->node].op : MR_OP_NONE;
            if (from == MR_OP_SOFTMAX || from == MR_OP_SOFTMAX_BWD)
                fail_msg("node %d: a CAST of a %s output", i, mr_op_get(from)->name);
        }
        sm_bf += nd->op == MR_OP_SOFTMAX && out == MR_BF16;
        smb_bf += nd->op == MR_OP_SOFTMAX_BWD && out == MR_BF16;
        perm_bf += nd->op == MR_OP_PERMUTE && out == MR_BF16;
        dc += nd->op == MR_OP_GEMM_DC;
        gelu_bwd += nd->op == MR_OP_GELU_BWD;
        sums += nd->op == MR_OP_SUM;
    }
    printf("gpt mixed bf16: %d casts, %d bf16 softmax, %d bf16 softmax_bwd, %d bf16 permutes, %d gemm_dc, %d gelu_bwd, "
           "%d sum\n", casts, sm_bf, smb_bf, perm_bf, dc, gelu_bwd, sums);
    assert_int_equal(sm_bf, layers);
    assert_int_equal(smb_bf, layers);
    assert_int_equal(perm_bf, 2 * layers);
    assert_int_equal(dc, 4 * layers); /* c_attn, c_proj, fc (GELU), proj */
    assert_int_equal(gelu_bwd, 0);
    assert_int_equal(sums, 0);
}

/* compute: MR_BF16 runs the f32 model under mixed_bfloat16 (mr_nn.compute) against torch's f32
 * numbers; else dt's own precision. */
static void parity_compute(const char *model, const mr_model_cfg *cfg, int64_t batch, mr_dtype dt, mr_dtype compute,
                           tols tol) {
    char file[64];
    snprintf(file, sizeof file, "%s.bin", model);
    fx_file fx = fx_load(file);
    const char *tag = dt == MR_F64 ? "f64" : "f32";

    mr_graph *g = NULL;
    mr_params *ps = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    MR_ASSERT_OK(mr_params_new(&ps));
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    nn.g = g;
    nn.ps = ps;
    nn.dtype = dt;
    nn.compute = compute;
    mr_model_io io;
    MR_ASSERT_OK(mr_model_build(&nn, cfg, batch, &io));

    /* names and shapes must map 1:1 */
    char what[64];
    snprintf(what, sizeof what, "%s %s%s", model, tag, compute == MR_BF16 ? " mixed bf16" : "");
    check_map(what, ps, &fx, "");
    const int np = mr_params_count(ps);

    /* gradients over every registry parameter, in registry order */
    mr_val *params = th_alloc(sizeof(mr_val) * (size_t)np);
    mr_val *grads = th_alloc(sizeof(mr_val) * (size_t)np);
    for (int32_t i = 0; i < np; i++) {
        params[i] = mr_graph_find(g, mr_params_name(ps, i));
        assert_int_not_equal(params[i].id, 0);
        assert_int_equal(mr_graph_kind(g, params[i]), MR_VAL_PARAM);
    }
    mr_status gst = mr_graph_grad(g, io.loss, params, np, grads);
    if (compute == MR_BF16 && gst == MR_OK) {
        int nbf = 0, nall = 0;
        count_gemms(g, &nbf, &nall);
        printf("%s mixed bf16: %d of %d GEMMs in bf16\n", model, nbf, nall);
        /* the GPT: all but the tied head's three (f32: its weight is the embedding's) */
        if (cfg->type == MR_MODEL_GPT) assert_int_equal(nbf, nall - 3);
        if (cfg->type == MR_MODEL_GPT) check_mixed_fusions(g, (int)cfg->layers);
    }
    char grad_err[1024] = "";
    if (gst != MR_OK) /* keep going: the forward parity is still checked and reported */
        snprintf(grad_err, sizeof grad_err, "%s: %s", mr_status_name(gst), mr_last_error());

    /* values: the registry's f32 buffers; f64 copies of them for an f64 graph */
    MR_ASSERT_OK(mr_params_alloc(ps));
    void **pdata = th_alloc(sizeof(void *) * (size_t)np);
    for (int32_t i = 0; i < np; i++) {
        const fx_tensor *t = fx_get(&fx, mr_params_name(ps, i));
        memcpy(mr_params_data(ps, i), t->data, sizeof(float) * (size_t)t->numel);
        pdata[i] = dt == MR_F32 ? (void *)mr_params_data(ps, i) : (void *)fx_f64(t);
    }

    int n_keep = 0;
    mr_val *keep = th_alloc(sizeof(mr_val) * (size_t)(np + 2));
    keep[n_keep++] = io.loss;
    keep[n_keep++] = io.logits;
    if (gst == MR_OK)
        for (int32_t i = 0; i < np; i++) keep[n_keep++] = grads[i];
    mr_plan *plan = NULL;
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, keep, n_keep, &plan));
    for (int32_t i = 0; i < np; i++) MR_ASSERT_OK(mr_plan_bind(plan, params[i], pdata[i]));
    /* f32: the gradients land straight in the registry's gradient buffer, as in training */
    if (gst == MR_OK && dt == MR_F32)
        for (int32_t i = 0; i < np; i++) MR_ASSERT_OK(mr_plan_bind(plan, grads[i], mr_params_grad(ps, i)));

    const fx_tensor *x = fx_get(&fx, "x"), *y = fx_get(&fx, "y");
    void *xdata = x->data;
    if (x->dt == MR_F32 && dt == MR_F64) xdata = fx_f64(x);
    mr_shape xs = mr_graph_shape(g, io.x), ys = mr_graph_shape(g, io.y);
    assert_true(mr_shape_eq(&xs, &x->shape));
    assert_true(mr_shape_eq(&ys, &y->shape));
    assert_int_equal(mr_graph_dtype(g, io.x), x->dt == MR_I32 ? MR_I32 : dt);
    assert_int_equal(y->dt, MR_I32);
    MR_ASSERT_OK(mr_plan_bind(plan, io.x, xdata));
    MR_ASSERT_OK(mr_plan_bind(plan, io.y, y->data));
    MR_ASSERT_OK(mr_plan_run(plan));

    char name[192];
    errs ef = {0, 0, 0}, eg = {0, 0, 0}, e64 = {0, 0, 0}; /* e64: f32 run against torch f64, printed only */
    int ok = 1;
    snprintf(name, sizeof name, "%s/logits", tag);
    const fx_tensor *rl = fx_get(&fx, name);
    mr_shape ls = mr_graph_shape(g, io.logits);
    assert_true(mr_shape_eq(&ls, &rl->shape));
    snprintf(name, sizeof name, "%s %s logits", model, tag);
    ok &= cmp_track(name, mr_plan_data(plan, io.logits), dt, rl, tol.atol, tol.rtol, tol.nmse, &ef);
    if (dt == MR_F32) track(mr_plan_data(plan, io.logits), dt, fx_get(&fx, "f64/logits"), &e64);
    snprintf(name, sizeof name, "%s/loss", tag);
    const fx_tensor *rloss = fx_get(&fx, name);
    snprintf(name, sizeof name, "%s %s loss", model, tag);
    ok &= cmp_track(name, mr_plan_data(plan, io.loss), dt, rloss, tol.atol, tol.rtol, tol.nmse, &ef);
    const void *lp = mr_plan_data(plan, io.loss);
    double loss = dt == MR_F32 ? *(const float *)lp : *(const double *)lp;
    if (gst == MR_OK) {
        for (int32_t i = 0; i < np; i++) {
            snprintf(name, sizeof name, "%s/%s.grad", tag, mr_params_name(ps, i));
            const fx_tensor *rg = fx_get(&fx, name);
            const void *d = mr_plan_data(plan, grads[i]);
            if (dt == MR_F32) assert_ptr_equal(d, mr_params_grad(ps, i));
            snprintf(name, sizeof name, "%s %s d loss / d %s", model, tag, mr_params_name(ps, i));
            ok &= cmp_track(name, d, dt, rg, tol.g_atol, tol.g_rtol, tol.g_nmse, &eg);
            if (dt == MR_F32) {
                snprintf(name, sizeof name, "f64/%s.grad", mr_params_name(ps, i));
                track(d, dt, fx_get(&fx, name), &e64);
            }
        }
    }
    printf("%s %s: loss %.10f (torch %.10f); logits+loss max abs %.2e rel %.2e nmse %.1e; %d grads max abs %.2e "
           "rel %.2e nmse %.1e\n",
           model, tag, loss, fx_f64(rloss)[0], ef.abs, ef.rel, ef.nmse, gst == MR_OK ? np : 0, eg.abs, eg.rel, eg.nmse);
    if (dt == MR_F32)
        printf("%s f32 against torch f64 (information): logits and grads max abs %.2e rel %.2e nmse %.1e\n", model,
               e64.abs, e64.rel, e64.nmse);

    mr_plan_free(plan);
    mr_params_free(ps);
    mr_graph_free(g);
    th_free_all();
    if (gst != MR_OK)
        fail_msg("%s %s: forward %s, but mr_graph_grad failed: %s", model, tag, ok ? "matches" : "differs", grad_err);
    assert_true(ok);
}

static void parity(const char *model, const mr_model_cfg *cfg, int64_t batch, mr_dtype dt, tols tol) {
    parity_compute(model, cfg, batch, dt, dt, tol);
}

/* ---- the models (shapes as in gen_fixtures.py) --------------------------------------------------- */

static mr_model_cfg mlp_cfg(void) {
    mr_model_cfg c = mr_model_cfg_default(MR_MODEL_MLP);
    c.n_sizes = 4;
    c.sizes[0] = 6;
    c.sizes[1] = 5;
    c.sizes[2] = 4;
    c.sizes[3] = 3;
    return c;
}

static mr_model_cfg cnn_cfg(void) {
    mr_model_cfg c = mr_model_cfg_default(MR_MODEL_CNN);
    c.in_channels = 1;
    c.height = c.width = 8;
    c.ch1 = 2;
    c.ch2 = 3;
    c.hidden = 5;
    c.classes = 4;
    return c;
}

static mr_model_cfg gpt_cfg(void) {
    mr_model_cfg c = mr_model_cfg_default(MR_MODEL_GPT);
    c.vocab = 11;
    c.context = 6;
    c.layers = 2;
    c.heads = 2;
    c.embd = 8;
    c.dropout = 0.0;
    return c;
}

static const tols F64_TOLS = {TOL_PARITY_F64_ATOL, TOL_PARITY_F64_RTOL, TOL_PARITY_F64_NMSE,
                              TOL_PARITY_F64_ATOL, TOL_PARITY_F64_RTOL, TOL_PARITY_F64_NMSE};
static const tols F32_TOLS = {TOL_PARITY_F32_ATOL, TOL_PARITY_F32_RTOL, TOL_PARITY_F32_NMSE,
                              TOL_PARITY_F32_GRAD_ATOL, TOL_PARITY_F32_GRAD_RTOL, TOL_PARITY_F32_GRAD_NMSE};

static void test_mlp_f64(void **state) {
    (void)state;
    mr_model_cfg c = mlp_cfg();
    parity("mlp", &c, 4, MR_F64, F64_TOLS);
}
static void test_mlp_f32(void **state) {
    (void)state;
    mr_model_cfg c = mlp_cfg();
    parity("mlp", &c, 4, MR_F32, F32_TOLS);
}
static void test_cnn_f64(void **state) {
    (void)state;
    mr_model_cfg c = cnn_cfg();
    parity("cnn", &c, 2, MR_F64, F64_TOLS);
}
static void test_cnn_f32(void **state) {
    (void)state;
    mr_model_cfg c = cnn_cfg();
    parity("cnn", &c, 2, MR_F32, F32_TOLS);
}
static void test_gpt_f64(void **state) {
    (void)state;
    mr_model_cfg c = gpt_cfg();
    parity("gpt", &c, 2, MR_F64, F64_TOLS);
}
static void test_gpt_f32(void **state) {
    (void)state;
    mr_model_cfg c = gpt_cfg();
    parity("gpt", &c, 2, MR_F32, F32_TOLS);
}
/* mixed_bfloat16 on the CPU: every GEMM but the tied head's in bf16, the linear layers' and the
 * attention's (autodiff/nn.c), against torch's f32 numbers with bf16's tolerances */
static void test_gpt_mixed_bf16(void **state) {
    (void)state;
    mr_model_cfg c = gpt_cfg();
    const tols t = {TOL_PARITY_BF16_ATOL, TOL_PARITY_BF16_RTOL, TOL_PARITY_BF16_NMSE,
                    TOL_PARITY_BF16_GRAD_ATOL, TOL_PARITY_BF16_GRAD_RTOL, TOL_PARITY_BF16_GRAD_NMSE};
    parity_compute("gpt", &c, 2, MR_F32, MR_BF16, t);
}

/* ---- the layer graph (tests/fixtures/graph.bin) -------------------------------------------------- */

/* The fixture's YAML is the model section; the parse needs a data section too, whose files are
 * never opened (the file checks are deferred while parsing). */
static const char *GRAPH_DATA = "data: {train: {source: idx, images: unused-images.gz, labels: unused-labels.gz}}\n";

/* th_compare plus the maxima, for a tensor whose reference may be all (rounding) zeros: the
 * gradient of a convolution's bias that a training-mode batch norm follows is exactly zero in
 * exact arithmetic (the batch mean takes the bias away), so both sides hold rounding noise there
 * and only the absolute tolerance means something; the NMSE (noise over noise) is not checked. */
static int cmp_maybe_zero(const char *what, const void *x, mr_dtype dt, const fx_tensor *ref_t, double atol,
                          double rtol, double nmse, errs *e, int *n_zero) {
    const double *ref = fx_f64(ref_t);
    double mx = 0.0;
    for (int64_t i = 0; i < ref_t->numel; i++) mx = fmax(mx, fabs(ref[i]));
    if (mx > atol) return cmp_track(what, x, dt, ref_t, atol, rtol, nmse, e);
    (*n_zero)++;
    errs z = {0, 0, 0};
    track(x, dt, ref_t, &z);
    if (z.abs > e->abs) e->abs = z.abs;
    return th_compare(what, x, dt, ref, ref_t->numel, atol, rtol, INFINITY);
}

/* The graph of graph.bin in training (batch statistics, buffer updates) or evaluation mode, in dt,
 * against torch: logits, loss, every parameter's gradient and, training, every updated buffer.
 * The tolerances are the models' (tests/tolerances.h TOL_PARITY_*). Measured against torch 2.15
 * (worst of the plain and the sanitizer build): f64 logits+loss max abs 4.4e-16, rel 2.2e-14;
 * gradients abs 3.3e-16, rel 6.0e-14 (train), NMSE 2.8e-29; updated buffers abs 2.2e-16, rel
 * 6.4e-16. f32 logits+loss abs 4.8e-7, rel 1.2e-5, NMSE 2.0e-13; gradients abs 1.8e-7, rel
 * 5.7e-5 (training: batch norm divides by the batch's standard deviation), NMSE 2.1e-12; updated
 * buffers abs 6.0e-8, rel 3.4e-7. */
static void graph_parity(mr_dtype dt, int training, tols tol) {
    fx_file fx = fx_load("graph.bin");
    const char *tag = dt == MR_F64 ? "f64" : "f32", *mode = training ? "train" : "eval";
    const int64_t batch = 3;

    /* the model from the fixture's YAML text, through the config parser */
    const fx_tensor *ty = fx_get(&fx, "yaml");
    if (ty->dt != MR_U8 || ty->shape.ndim != 1 || ty->numel < 1) fail_msg("graph.bin: 'yaml' is not u8 text");
    char *text = th_alloc((size_t)ty->numel + strlen(GRAPH_DATA) + 1);
    memcpy(text, ty->data, (size_t)ty->numel);
    strcpy(text + ty->numel, GRAPH_DATA);
    mr_experiment e;
    mr_experiment_defer_file_checks(1);
    mr_status pst = mr_experiment_parse(text, "graph.bin:yaml", &e);
    mr_experiment_defer_file_checks(0);
    if (pst != MR_OK) fail_msg("graph.bin: the YAML does not parse: %s", mr_last_error());
    assert_int_equal(e.model.type, MR_MODEL_GRAPH);

    mr_graph *g = NULL;
    mr_params *ps = NULL;
    MR_ASSERT_OK(mr_graph_new(&g));
    MR_ASSERT_OK(mr_params_new(&ps));
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    nn.g = g;
    nn.ps = ps;
    nn.dtype = dt;
    nn.training = training;
    mr_model_io io;
    MR_ASSERT_OK(mr_model_build(&nn, &e.model, batch, &io));
    mr_experiment_deinit(&e);

    /* parameters and buffers map 1:1 onto torch's state_dict */
    char what[64];
    snprintf(what, sizeof what, "graph %s %s", tag, mode);
    const mr_params *bufs = mr_params_bufs(ps);
    check_map(what, ps, &fx, "");
    check_map(what, bufs, &fx, "buffers/");
    const int np = mr_params_count(ps), nb = mr_params_count(bufs);
    assert_true(nb > 0);

    /* training: every buffer is updated exactly once; evaluation: none is */
    int32_t *upd_of = th_alloc(sizeof(int32_t) * (size_t)nb); /* buffer k -> its update, -1: none */
    for (int32_t k = 0; k < nb; k++) upd_of[k] = -1;
    for (int u = 0; u < nn.n_updates; u++) {
        int32_t k = mr_params_find(bufs, mr_graph_name(g, nn.upd_buf[u]));
        if (k < 0) fail_msg("%s: update %d of '%s', which is not a buffer", what, u, mr_graph_name(g, nn.upd_buf[u]));
        if (upd_of[k] >= 0) fail_msg("%s: buffer '%s' is updated twice", what, mr_params_name(bufs, k));
        upd_of[k] = u;
    }
    if (training) {
        for (int32_t k = 0; k < nb; k++)
            if (upd_of[k] < 0) fail_msg("%s: buffer '%s' is never updated", what, mr_params_name(bufs, k));
    } else {
        assert_int_equal(nn.n_updates, 0);
    }

    mr_val *params = th_alloc(sizeof(mr_val) * (size_t)np);
    mr_val *grads = th_alloc(sizeof(mr_val) * (size_t)np);
    for (int32_t i = 0; i < np; i++) {
        params[i] = mr_graph_find(g, mr_params_name(ps, i));
        assert_int_not_equal(params[i].id, 0);
        assert_int_equal(mr_graph_kind(g, params[i]), MR_VAL_PARAM);
    }
    mr_status gst = mr_graph_grad(g, io.loss, params, np, grads);
    if (gst != MR_OK) fail_msg("%s: mr_graph_grad: %s: %s", what, mr_status_name(gst), mr_last_error());

    /* values: the registry's f32 buffers (the fixture's values); f64 copies for an f64 graph */
    MR_ASSERT_OK(mr_params_alloc(ps));
    void **pdata = th_alloc(sizeof(void *) * (size_t)np);
    for (int32_t i = 0; i < np; i++) {
        const fx_tensor *t = fx_entry(&fx, "", mr_params_name(ps, i));
        memcpy(mr_params_data(ps, i), t->data, sizeof(float) * (size_t)t->numel);
        pdata[i] = dt == MR_F32 ? (void *)mr_params_data(ps, i) : (void *)fx_f64(t);
    }
    void **bdata = th_alloc(sizeof(void *) * (size_t)nb);
    for (int32_t k = 0; k < nb; k++) {
        const fx_tensor *t = fx_entry(&fx, "buffers/", mr_params_name(bufs, k));
        memcpy(mr_params_data(bufs, k), t->data, sizeof(float) * (size_t)t->numel);
        bdata[k] = dt == MR_F32 ? (void *)mr_params_data(bufs, k) : (void *)fx_f64(t);
    }

    int n_keep = 0;
    mr_val *keep = th_alloc(sizeof(mr_val) * (size_t)(np + nb + 2));
    keep[n_keep++] = io.loss;
    keep[n_keep++] = io.logits;
    for (int32_t i = 0; i < np; i++) keep[n_keep++] = grads[i];
    for (int u = 0; u < nn.n_updates; u++) keep[n_keep++] = nn.upd_val[u];
    mr_plan *plan = NULL;
    MR_ASSERT_OK(mr_plan_new(g, MR_DEVICE_CPU, keep, n_keep, &plan));
    for (int32_t i = 0; i < np; i++) MR_ASSERT_OK(mr_plan_bind(plan, params[i], pdata[i]));
    for (int32_t k = 0; k < nb; k++) {
        mr_val v = mr_graph_find(g, mr_params_name(bufs, k));
        if (!v.id || mr_graph_kind(g, v) != MR_VAL_INPUT || mr_graph_dtype(g, v) != dt)
            fail_msg("%s: buffer '%s' is not a %s graph input", what, mr_params_name(bufs, k), tag);
        MR_ASSERT_OK(mr_plan_bind(plan, v, bdata[k]));
        /* f32, as a trainer does (autodiff/steps.c): the update lands in the buffer's own memory,
         * gradients in the registry's gradient buffer; f64 reads them from the plan */
        if (dt == MR_F32 && upd_of[k] >= 0) MR_ASSERT_OK(mr_plan_bind(plan, nn.upd_val[upd_of[k]], bdata[k]));
    }
    if (dt == MR_F32)
        for (int32_t i = 0; i < np; i++) MR_ASSERT_OK(mr_plan_bind(plan, grads[i], mr_params_grad(ps, i)));

    const fx_tensor *x = fx_get(&fx, "x"), *y = fx_get(&fx, "y");
    mr_shape xs = mr_graph_shape(g, io.x), ys = mr_graph_shape(g, io.y);
    assert_true(mr_shape_eq(&xs, &x->shape));
    assert_true(mr_shape_eq(&ys, &y->shape));
    assert_int_equal(x->dt, MR_F32);
    assert_int_equal(y->dt, MR_I32);
    assert_int_equal(mr_graph_dtype(g, io.x), dt);
    MR_ASSERT_OK(mr_plan_bind(plan, io.x, dt == MR_F64 ? (void *)fx_f64(x) : x->data));
    MR_ASSERT_OK(mr_plan_bind(plan, io.y, y->data));
    MR_ASSERT_OK(mr_plan_run(plan));

    char name[192];
    errs ef = {0, 0, 0}, eg = {0, 0, 0}, eb = {0, 0, 0};
    int ok = 1, n_zero = 0;
    snprintf(name, sizeof name, "%s/%s/logits", tag, mode);
    const fx_tensor *rl = fx_get(&fx, name);
    mr_shape ls = mr_graph_shape(g, io.logits);
    assert_true(mr_shape_eq(&ls, &rl->shape));
    snprintf(name, sizeof name, "graph %s %s logits", tag, mode);
    ok &= cmp_track(name, mr_plan_data(plan, io.logits), dt, rl, tol.atol, tol.rtol, tol.nmse, &ef);
    snprintf(name, sizeof name, "%s/%s/loss", tag, mode);
    const fx_tensor *rloss = fx_get(&fx, name);
    snprintf(name, sizeof name, "graph %s %s loss", tag, mode);
    ok &= cmp_track(name, mr_plan_data(plan, io.loss), dt, rloss, tol.atol, tol.rtol, tol.nmse, &ef);
    const void *lp = mr_plan_data(plan, io.loss);
    double loss = dt == MR_F32 ? *(const float *)lp : *(const double *)lp;
    for (int32_t i = 0; i < np; i++) {
        snprintf(name, sizeof name, "%s/%s/%s.grad", tag, mode, mr_params_name(ps, i));
        const fx_tensor *rg = fx_get(&fx, name);
        const void *d = mr_plan_data(plan, grads[i]);
        if (dt == MR_F32) assert_ptr_equal(d, mr_params_grad(ps, i));
        snprintf(name, sizeof name, "graph %s %s d loss / d %s", tag, mode, mr_params_name(ps, i));
        ok &= cmp_maybe_zero(name, d, dt, rg, tol.g_atol, tol.g_rtol, tol.g_nmse, &eg, &n_zero);
    }
    if (training) {
        for (int32_t k = 0; k < nb; k++) {
            snprintf(name, sizeof name, "%s/train/%s", tag, mr_params_name(bufs, k));
            const fx_tensor *rb = fx_get(&fx, name);
            const void *d = mr_plan_data(plan, nn.upd_val[upd_of[k]]);
            if (dt == MR_F32) assert_ptr_equal(d, mr_params_data(bufs, k));
            snprintf(name, sizeof name, "graph %s updated %s", tag, mr_params_name(bufs, k));
            ok &= cmp_track(name, d, dt, rb, tol.atol, tol.rtol, tol.nmse, &eb);
        }
    }
    printf("graph %s %s: loss %.10f (torch %.10f); logits+loss max abs %.2e rel %.2e nmse %.1e; %d grads max abs %.2e "
           "rel %.2e nmse %.1e (%d of them zero in exact arithmetic: abs only)",
           tag, mode, loss, fx_f64(rloss)[0], ef.abs, ef.rel, ef.nmse, np, eg.abs, eg.rel, eg.nmse, n_zero);
    if (training) printf("; %d updated buffers max abs %.2e rel %.2e nmse %.1e", nb, eb.abs, eb.rel, eb.nmse);
    printf("\n");

    mr_plan_free(plan);
    mr_params_free(ps);
    mr_graph_free(g);
    th_free_all();
    assert_true(ok);
}

static void test_graph_train_f64(void **state) {
    (void)state;
    graph_parity(MR_F64, 1, F64_TOLS);
}
static void test_graph_eval_f64(void **state) {
    (void)state;
    graph_parity(MR_F64, 0, F64_TOLS);
}
static void test_graph_train_f32(void **state) {
    (void)state;
    graph_parity(MR_F32, 1, F32_TOLS);
}
static void test_graph_eval_f32(void **state) {
    (void)state;
    graph_parity(MR_F32, 0, F32_TOLS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_f64), cmocka_unit_test(test_mlp_f32), cmocka_unit_test(test_cnn_f64),
        cmocka_unit_test(test_cnn_f32), cmocka_unit_test(test_gpt_f64), cmocka_unit_test(test_gpt_f32),
        cmocka_unit_test(test_gpt_mixed_bf16),
        cmocka_unit_test(test_graph_train_f64), cmocka_unit_test(test_graph_eval_f64),
        cmocka_unit_test(test_graph_train_f32), cmocka_unit_test(test_graph_eval_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
