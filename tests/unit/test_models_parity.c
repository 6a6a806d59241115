/* PyTorch parity of the built-in models: mr_model_build's MLP, CNN and GPT-2, with the parameters,
 * inputs and labels of tests/fixtures/<model>.bin (written by tests/gen_fixtures.py, which builds
 * the same tiny models in PyTorch), must give PyTorch's logits, loss and every parameter's
 * gradient, in f64 and in f32. The fixture's parameter names must map 1:1 onto the registry's
 * (names and shapes), which is what lets a PyTorch state_dict load into a mirror model.
 *
 * Fixture format (see gen_fixtures.py): "MRFX1\n", u32 count, then per tensor u16 name length,
 * name, u8 dtype (0 f32, 1 f64, 2 i32), u8 ndim, ndim x i64 dims, raw little-endian data. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "autodiff/graph.h"
#include "autodiff/nn.h"
#include "models/models.h"

/* ---- fixture reader ---------------------------------------------------------------------------- */

typedef struct fx_tensor {
    char name[128];
    mr_dtype dt; /* MR_F32, MR_F64 or MR_I32 */
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
    if (!f) fail_msg("cannot open fixture %s (HINT: run /usr/bin/python3 tests/gen_fixtures.py)", path);
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
        if (code > 2 || ndim > MR_MAX_DIMS) fail_msg("%s: '%s' has dtype code %u, ndim %u", path, t->name, code, ndim);
        t->dt = code == 0 ? MR_F32 : code == 1 ? MR_F64 : MR_I32;
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
    double *d = th_alloc(sizeof(double) * (size_t)(t->numel ? t->numel : 1));
    for (int64_t i = 0; i < t->numel; i++)
        d[i] = t->dt == MR_F32 ? ((const float *)t->data)[i]
             : t->dt == MR_F64 ? ((const double *)t->data)[i]
                               : ((const int32_t *)t->data)[i];
    return d;
}

/* Parameters are every tensor without a run prefix other than x and y. */
static int fx_is_param(const fx_tensor *t) {
    return strncmp(t->name, "f64/", 4) && strncmp(t->name, "f32/", 4) && strcmp(t->name, "x") && strcmp(t->name, "y");
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

static void parity(const char *model, const mr_model_cfg *cfg, int64_t batch, mr_dtype dt, tols tol) {
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
    mr_model_io io;
    MR_ASSERT_OK(mr_model_build(&nn, cfg, batch, &io));

    /* names and shapes must map 1:1 */
    const int np = mr_params_count(ps);
    char msg[4096] = "";
    size_t ml = 0;
    int bad = 0;
    for (int32_t i = 0; i < np; i++) {
        const fx_tensor *t = fx_find(&fx, mr_params_name(ps, i));
        mr_shape s = mr_params_shape(ps, i);
        char b1[128], b2[128];
        if (!t || !fx_is_param(t)) {
            ml += (size_t)snprintf(msg + ml, sizeof msg - ml, "\n  '%s' %s: in the model, not in the fixture",
                                   mr_params_name(ps, i), mr_shape_str(&s, b1, 128));
            bad++;
        } else if (!mr_shape_eq(&s, &t->shape) || t->dt != MR_F32) {
            ml += (size_t)snprintf(msg + ml, sizeof msg - ml, "\n  '%s': model %s, fixture %s %s", t->name,
                                   mr_shape_str(&s, b1, 128), mr_dtype_name(t->dt), mr_shape_str(&t->shape, b2, 128));
            bad++;
        }
        if (ml >= sizeof msg) ml = sizeof msg - 1;
    }
    int n_fx_params = 0;
    for (int i = 0; i < fx.n; i++) {
        if (!fx_is_param(&fx.t[i])) continue;
        n_fx_params++;
        if (mr_params_find(ps, fx.t[i].name) < 0) {
            char b[128];
            ml += (size_t)snprintf(msg + ml, sizeof msg - ml, "\n  '%s' %s: in the fixture, not in the model",
                                   fx.t[i].name, mr_shape_str(&fx.t[i].shape, b, 128));
            bad++;
        }
        if (ml >= sizeof msg) ml = sizeof msg - 1;
    }
    if (bad) fail_msg("%s %s: %d parameter(s) do not map 1:1 (model %d, fixture %d):%s", model, tag, bad, np,
                      n_fx_params, msg);

    /* gradients over every registry parameter, in registry order */
    mr_val *params = th_alloc(sizeof(mr_val) * (size_t)np);
    mr_val *grads = th_alloc(sizeof(mr_val) * (size_t)np);
    for (int32_t i = 0; i < np; i++) {
        params[i] = mr_graph_find(g, mr_params_name(ps, i));
        assert_int_not_equal(params[i].id, 0);
        assert_int_equal(mr_graph_kind(g, params[i]), MR_VAL_PARAM);
    }
    mr_status gst = mr_graph_grad(g, io.loss, params, np, grads);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_f64), cmocka_unit_test(test_mlp_f32), cmocka_unit_test(test_cnn_f64),
        cmocka_unit_test(test_cnn_f32), cmocka_unit_test(test_gpt_f64), cmocka_unit_test(test_gpt_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
