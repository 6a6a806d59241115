/* Test helpers (see harness.h). */
#include "harness.h"
#include "train/train.h"

#include <fcntl.h>
#include <unistd.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/math/philox_math.h"

static char g_tmpdir[64];

int th_tmpdir_setup(void **state) {
    (void)state;
    strcpy(g_tmpdir, "/tmp/mirror_test_XXXXXX");
    return mkdtemp(g_tmpdir) ? 0 : -1;
}

int th_tmpdir_teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

const char *th_tmp_dir(void) { return g_tmpdir; }

const char *th_tmp_path(const char *name) {
    static char buf[4][160];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_tmpdir, name);
    return buf[k];
}

int th_quick(void) {
#if defined(__SANITIZE_ADDRESS__)
    return 1;
#else
    const char *e = getenv("MIRROR_TEST_QUICK");
    return e && *e && strcmp(e, "0") != 0;
#endif
}

void th_fill_uniform_f64(double *x, int64_t n, double lo, double hi, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (double)mr_u32_to_unit_f32(mr_philox_u32(seed, 0, (uint64_t)i));
}

void th_fill_uniform_f32(float *x, int64_t n, float lo, float hi, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * mr_u32_to_unit_f32(mr_philox_u32(seed, 0, (uint64_t)i));
}

void th_fill_int32(int32_t *x, int64_t n, int32_t lo, int32_t hi, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = lo + (int32_t)(mr_philox_u32(seed, 1, (uint64_t)i) % (uint32_t)(hi - lo));
}

void th_f64_to_f32(const double *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
}

void th_f32_to_f64(const float *x, double *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i];
}

static void **g_bufs;
static size_t g_nbufs, g_cap;

void *th_alloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    assert_non_null(p);
    if (g_nbufs == g_cap) {
        g_cap = g_cap ? g_cap * 2 : 64;
        g_bufs = realloc(g_bufs, g_cap * sizeof *g_bufs);
        assert_non_null(g_bufs);
    }
    g_bufs[g_nbufs++] = p;
    return p;
}

void th_free_all(void) {
    for (size_t i = 0; i < g_nbufs; i++) free(g_bufs[i]);
    free(g_bufs);
    g_bufs = NULL;
    g_nbufs = g_cap = 0;
}

mr_view th_view(mr_dtype dt, mr_shape s) {
    mr_view v;
    v.dtype = dt;
    v.shape = s;
    v.data = th_alloc((size_t)mr_shape_numel(&s) * mr_dtype_size(dt));
    return v;
}

int th_compare(const char *what, const void *x, mr_dtype dt, const double *ref, int64_t n, double atol,
               double rtol, double nmse_max) {
    double se = 0.0, sr = 0.0, max_abs = 0.0, max_rel = 0.0;
    int bad = 0;
    /* fails closed on a comparison that cannot have been meant: a negative count or a missing
     * buffer. n = 0 passes: an empty tensor (a zero-sized dimension) has no element to differ,
     * and the op tests check such tensors on purpose */
    if (n < 0 || (n > 0 && (!x || !ref))) {
        fprintf(stderr, "%s: nothing to compare (n %lld, value %p, reference %p)\n", what, (long long)n, x, (const void *)ref);
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        double v = dt == MR_F64 ? ((const double *)x)[i] : (double)((const float *)x)[i];
        double r = ref[i];
        if (isnan(v) && isnan(r)) continue;
        if (isinf(r) && v == r) continue;
        double e = fabs(v - r);
        if (e > max_abs) max_abs = e;
        if (fabs(r) > 1e-3 && e / fabs(r) > max_rel) max_rel = e / fabs(r);
        /* an infinite reference is met only exactly (it continued above): rtol * |inf| would
         * otherwise accept any value, even the opposite infinity */
        if (isinf(r) || !(e <= atol + rtol * fabs(r))) {
            if (bad < 10)
                fprintf(stderr, "%s: mismatch at [%lld]: value %.9g ref %.9g abs err %.3g rel err %.3g\n", what,
                        (long long)i, v, r, e, e / (fabs(r) > 0 ? fabs(r) : 1.0));
            bad++;
        }
        if (isfinite(e)) {
            se += e * e;
            sr += r * r;
        }
    }
    double nmse = sr > 0 ? se / sr : se;
    /* TH_REPORT=1: the measured errors of every comparison, for setting tolerances (tests/tolerances.h) */
    const char *rep = getenv("TH_REPORT");
    if (rep && *rep == '1')
        fprintf(stderr, "th_compare: %s: n %lld max abs %.3g max rel (|ref| > 1e-3) %.3g NMSE %.3g\n", what,
                (long long)n, max_abs, max_rel, nmse);
    if (nmse > nmse_max) {
        fprintf(stderr, "%s: NMSE %.3g exceeds %.3g\n", what, nmse, nmse_max);
        bad++;
    }
    if (bad) fprintf(stderr, "%s: %d of %lld elements out of tolerance (atol %g rtol %g)\n", what, bad,
                     (long long)n, atol, rtol);
    return bad == 0;
}

void th_numeric_grad(double *x, int64_t n, double h, double (*loss)(void *ctx), void *ctx, double *numeric) {
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = loss(ctx);
        x[i] = x0 - h;
        double lm = loss(ctx);
        x[i] = x0;
        numeric[i] = (lp - lm) / (2.0 * h);
    }
}

/* ---- op checks (see harness.h) ------------------------------------------------------------- */

mr_view th_rand_view(mr_dtype dt, mr_shape s, double lo, double hi, uint64_t seed) {
    mr_view v = th_view(dt, s);
    int64_t n = mr_shape_numel(&s);
    if (dt == MR_F64) th_fill_uniform_f64(v.data, n, lo, hi, seed);
    else th_fill_uniform_f32(v.data, n, (float)lo, (float)hi, seed);
    return v;
}

mr_shape th_shp(int nd, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    int64_t d[4] = {d0, d1, d2, d3};
    return mr_shape_make(nd, d);
}

size_t th_view_bytes(const mr_view *v) { return (size_t)mr_shape_numel(&v->shape) * mr_dtype_size(v->dtype); }

void th_give_workspace(mr_op_args *a) {
    size_t ws = mr_op_workspace_bytes(a);
    a->workspace = ws ? th_alloc(ws) : NULL;
    a->workspace_bytes = ws;
}

mr_op_args th_fresh_outputs(const mr_op_args *a) {
    mr_op_args b = *a;
    for (int i = 0; i < a->n_out; i++)
        if (a->out[i].data) b.out[i] = th_view(a->out[i].dtype, a->out[i].shape);
    return b;
}

static int is_float(mr_dtype dt) { return dt == MR_F32 || dt == MR_F64; }

mr_op_args th_widen_args(const mr_op_args *a) {
    mr_op_args b = *a;
    b.workspace = NULL;
    b.workspace_bytes = 0;
    for (int i = 0; i < a->n_in; i++) {
        const mr_view *v = &a->in[i];
        if (!v->data || v->dtype != MR_F32) continue;
        b.in[i] = th_view(MR_F64, v->shape);
        th_f32_to_f64(v->data, b.in[i].data, mr_shape_numel(&v->shape));
    }
    for (int i = 0; i < a->n_out; i++) {
        const mr_view *v = &a->out[i];
        if (v->data) b.out[i] = th_view(v->dtype == MR_F32 ? MR_F64 : v->dtype, v->shape);
    }
    return b;
}

double th_max_abs_err, th_max_rel_err;

static void track_err(const float *x, const double *ref, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - ref[i]);
        if (!isfinite(e)) continue;
        if (e > th_max_abs_err) th_max_abs_err = e;
        if (fabs(ref[i]) > 1e-3 && e / fabs(ref[i]) > th_max_rel_err) th_max_rel_err = e / fabs(ref[i]);
    }
}

/* 1 when the args' float views are F64 (the first float view with data decides). */
static int args_are_f64(const mr_op_args *a) {
    for (int k = 0; k < 2; k++) {
        const mr_view *v = k ? a->out : a->in;
        for (int i = 0; i < (k ? a->n_out : a->n_in); i++)
            if (v[i].data && is_float(v[i].dtype)) return v[i].dtype == MR_F64;
    }
    return 0;
}

mr_op_args th_check_cpu_vs_ref(const char *what, mr_op_args *a, double atol, double rtol, double nmse) {
    int wide = args_are_f64(a);
    mr_op_args ref, f32, f64;
    if (wide) {
        ref = *a;
        f32 = *a;
        for (int i = 0; i < a->n_in; i++) {
            const mr_view *v = &a->in[i];
            if (!v->data || v->dtype != MR_F64) continue;
            int64_t n = mr_shape_numel(&v->shape);
            f32.in[i] = th_view(MR_F32, v->shape);
            th_f64_to_f32(v->data, f32.in[i].data, n);
            th_f32_to_f64(f32.in[i].data, v->data, n); /* all runs see the same rounded inputs */
        }
        for (int i = 0; i < a->n_out; i++) {
            const mr_view *v = &a->out[i];
            if (v->data) f32.out[i] = th_view(v->dtype == MR_F64 ? MR_F32 : v->dtype, v->shape);
        }
        th_give_workspace(&f32);
    } else {
        th_give_workspace(a);
        f32 = *a;
        ref = th_widen_args(a);
    }
    f64 = th_fresh_outputs(&ref);
    th_give_workspace(&f64);
    MR_ASSERT_OK(mr_op_run_ref(&ref));
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f32));
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &f64));
    char name[200];
    int checked = 0;
    for (int i = 0; i < a->n_out; i++) {
        const mr_view *x = &f32.out[i], *r = &ref.out[i];
        if (!x->data) continue;
        checked++;
        int64_t n = mr_shape_numel(&x->shape);
        assert_int_equal(mr_shape_numel(&r->shape), n); /* the reference has the same number of elements */
        if (x->dtype == MR_F32) {
            snprintf(name, sizeof name, "%s out[%d] f32", what, i);
            track_err(x->data, r->data, n);
            assert_true(th_compare(name, x->data, MR_F32, r->data, n, atol, rtol, nmse));
        } else {
            assert_memory_equal(x->data, r->data, th_view_bytes(x));
        }
        snprintf(name, sizeof name, "%s out[%d] f64", what, i);
        if (r->dtype == MR_F64) assert_true(th_compare(name, f64.out[i].data, MR_F64, r->data, n, 0, 0, 0));
        assert_memory_equal(f64.out[i].data, r->data, th_view_bytes(r));
    }
    if (!checked) fail_msg("%s: the op has no output with data: nothing was compared", what);
    return ref;
}

void th_check_thread_invariant(const mr_op_args *a) {
    mr_op_args r[2];
    int saved = mr_cpu_threads();
    for (int t = 0; t < 2; t++) {
        mr_cpu_set_threads(t + 1);
        r[t] = th_fresh_outputs(a);
        th_give_workspace(&r[t]);
        MR_ASSERT_OK(mr_op_run(MR_DEVICE_CPU, &r[t]));
    }
    mr_cpu_set_threads(saved);
    int checked = 0;
    for (int i = 0; i < a->n_out; i++)
        if (a->out[i].data) {
            assert_memory_equal(r[0].out[i].data, r[1].out[i].data, th_view_bytes(&a->out[i]));
            checked++;
        }
    if (!checked) fail_msg("thread invariance: the op has no output with data: nothing was compared");
}

typedef struct grad_ctx {
    mr_op_args *fwd;
    const double *r;
} grad_ctx;

/* sum(out[0] * r) of the forward, run on the reference. */
static double grad_loss(void *p) {
    grad_ctx *c = p;
    MR_ASSERT_OK(mr_op_run_ref(c->fwd));
    const double *y = c->fwd->out[0].data;
    double s = 0.0;
    for (int64_t i = 0; i < mr_shape_numel(&c->fwd->out[0].shape); i++) s += y[i] * c->r[i];
    return s;
}

void th_check_grad(const char *what, mr_op_args *fwd, int k, const double *r, const double *analytic, double nmse) {
    assert_true(fwd->in[k].dtype == MR_F64 && fwd->out[0].dtype == MR_F64);
    grad_ctx c = {fwd, r};
    int64_t n = mr_shape_numel(&fwd->in[k].shape);
    double *num = th_alloc((size_t)n * sizeof(double));
    th_numeric_grad(fwd->in[k].data, n, TOL_GRAD_H, grad_loss, &c, num);
    assert_true(th_compare(what, analytic, MR_F64, num, n, TOL_GRAD_ATOL, TOL_GRAD_RTOL, nmse));
}

void th_expect_invalid_at(const mr_op_args *a, const char *opname, int line) {
    mr_status st = mr_op_run(MR_DEVICE_CPU, a);
    if (st != MR_ERR_INVALID) fail_msg("line %d: expected MR_ERR_INVALID, got %s", line, mr_status_name(st));
    if (!strstr(mr_last_error(), opname))
        fail_msg("line %d: error \"%s\" does not name %s", line, mr_last_error(), opname);
}

void th_expect_invalid_cpu_ref(const mr_op_args *a, const char *name) {
    assert_int_equal(mr_op_run(MR_DEVICE_CPU, a), MR_ERR_INVALID);
    if (!strstr(mr_last_error(), name)) fail_msg("error '%s' does not name %s", mr_last_error(), name);
    assert_int_equal(mr_op_run_ref(a), MR_ERR_INVALID);
}

/* ---- trainer tests ----------------------------------------------------------------------------- */

#define TH_FM "/usr/share/datasets/fashion-mnist/"

int th_have_fashion_mnist(void) { return access(TH_FM "train-images-idx3-ubyte.gz", R_OK) == 0; }

const char *th_tiny_text(void) {
    const char *text = th_tmp_path("text.txt");
    if (access(text, R_OK) != 0) {
        FILE *f = fopen(text, "w");
        assert_non_null(f);
        for (int i = 0; i < 400; i++) fprintf(f, "In the beginning %d was the word; and the word was %d.\n", i, i * 7 % 13);
        assert_int_equal(fclose(f), 0);
    }
    return text;
}

void th_tiny_gpt(mr_train_cfg *c, int64_t context, int64_t embd, double dropout) {
    c->model = mr_model_cfg_default(MR_MODEL_GPT);
    c->model.context = context;
    c->model.layers = 2;
    c->model.heads = 2;
    c->model.embd = embd;
    c->model.dropout = dropout;
    c->batch = 8;
    c->train_images = c->train_labels = c->eval_images = c->eval_labels = NULL;
    c->train_text = c->eval_text = th_tiny_text();
    c->sample_chars = 0;
}

void th_fashion_mlp(mr_train_cfg *c, int64_t hidden, int64_t steps, int64_t batch) {
    *c = mr_train_cfg_default();
    c->model = mr_model_cfg_default(MR_MODEL_MLP);
    c->model.sizes[1] = hidden;
    c->model.sizes[2] = 10;
    c->model.n_sizes = 3;
    c->optim = mr_optim_cfg_default(MR_OPTIM_ADAMW);
    c->optim.lr = 2e-3;
    c->steps = steps;
    c->batch = batch;
    c->log_every = 50;
    c->shuffle = 1000;
    c->train_images = TH_FM "train-images-idx3-ubyte.gz";
    c->train_labels = TH_FM "train-labels-idx1-ubyte.gz";
    c->eval_images = TH_FM "t10k-images-idx3-ubyte.gz";
    c->eval_labels = TH_FM "t10k-labels-idx1-ubyte.gz";
    c->quiet = 1;
}

unsigned char *th_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

void th_write_file(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

void th_expect_error(mr_status got, mr_status want, const char *n1, const char *n2) {
    if (got != want) fail_msg("got %s (%s), expected %s", mr_status_name(got), mr_last_error(), mr_status_name(want));
    if (n1 && !strstr(mr_last_error(), n1)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n1);
    if (n2 && !strstr(mr_last_error(), n2)) fail_msg("message '%s' lacks '%s'", mr_last_error(), n2);
}

mr_status th_train_logged(const mr_train_cfg *c, mr_train_result *r, char **log) {
    const char *path = th_tmp_path("stderr.txt");
    fflush(stderr);
    const int saved = dup(2);
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    assert_true(dup2(fd, 2) == 2);
    close(fd);
    mr_status st = mr_train(c, r);
    char err[1024];
    snprintf(err, sizeof err, "%s", mr_last_error());
    fflush(stderr);
    assert_true(dup2(saved, 2) == 2);
    close(saved);
    size_t n = 0;
    unsigned char *b = th_read_file(path, &n);
    *log = th_alloc(n + 1);
    memcpy(*log, b, n);
    (*log)[n] = '\0';
    free(b);
    fprintf(stderr, "---- captured log ----\n%s----\n", *log);
    if (st != MR_OK) mr_set_error(st, "%s", err); /* the error as mr_train left it */
    return st;
}
