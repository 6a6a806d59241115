/* See gpu_util.h. */
#include "gpu_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device.h"

#define MAX_GPU_TENSORS 256
static mr_tensor *g_gpu[MAX_GPU_TENSORS];
static int g_ngpu;

int gpu_none(void) {
    if (mr_cuda_device_count() > 0) return 0;
    const mr_backend *be = NULL;
    if (mr_backend_get(MR_DEVICE_CUDA, &be) != MR_OK)
        printf("SKIPPED: %s\n", mr_last_error());
    else
        printf("SKIPPED: no usable GPU\n");
    return 1;
}

void gpu_free_all(void) {
    for (int i = 0; i < g_ngpu; i++) mr_tensor_free(g_gpu[i]);
    g_ngpu = 0;
    th_free_all();
}

void gpu_round_to(double *x, int64_t n, mr_dtype dt) {
    if (dt == MR_F64 || n == 0) return;
    void *tmp = th_alloc((size_t)n * mr_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) mr_dtype_set(tmp, dt, i, x[i]);
    for (int64_t i = 0; i < n; i++) x[i] = mr_dtype_get(tmp, dt, i);
}

static mr_tensor *track(mr_tensor *t) {
    assert_true(g_ngpu < MAX_GPU_TENSORS);
    g_gpu[g_ngpu++] = t;
    return t;
}

mr_tensor *gpu_alloc(mr_dtype dt, mr_shape s) {
    mr_device d = {MR_DEVICE_CUDA, 0};
    mr_tensor *t = NULL;
    MR_ASSERT_OK(mr_tensor_new(d, dt, &s, &t));
    return track(t);
}

mr_tensor *gpu_upload(const double *h, mr_dtype dt, mr_shape s) {
    int64_t n = mr_shape_numel(&s);
    void *tmp = th_alloc((size_t)(n ? n : 1) * mr_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) mr_dtype_set(tmp, dt, i, h[i]);
    mr_tensor *t = gpu_alloc(dt, s);
    MR_ASSERT_OK(mr_tensor_copy_from_host(t, tmp, (size_t)n * mr_dtype_size(dt)));
    return t;
}

double *gpu_download(const mr_tensor *t) {
    int64_t n = mr_tensor_numel(t);
    mr_dtype dt = mr_tensor_dtype(t);
    void *tmp = th_alloc(mr_tensor_nbytes(t) ? mr_tensor_nbytes(t) : 1);
    double *out = th_alloc((size_t)(n ? n : 1) * sizeof(double));
    MR_ASSERT_OK(mr_tensor_copy_to_host(t, tmp, mr_tensor_nbytes(t)));
    for (int64_t i = 0; i < n; i++) out[i] = mr_dtype_get(tmp, dt, i);
    return out;
}

mr_view gpu_f64_view(const double *h, mr_shape s) {
    mr_view v = th_view(MR_F64, s);
    memcpy(v.data, h, (size_t)mr_shape_numel(&s) * sizeof(double));
    return v;
}

mr_dtype gpu_lse_dtype(mr_dtype dt) { return dt == MR_F64 ? MR_F64 : MR_F32; }

mr_op_args gpu_attention_bwd_ref(mr_op_args *r, const double *dy, mr_dtype dt) {
    const mr_shape qs = r->in[0].shape, ks = r->in[1].shape, ls = r->out[1].shape;
    double *hy = r->out[0].data, *hl = r->out[1].data;
    gpu_round_to(hy, mr_shape_numel(&qs), dt);
    gpu_round_to(hl, mr_shape_numel(&ls), gpu_lse_dtype(dt));
    mr_op_args rb;
    mr_op_args_init(&rb, MR_OP_ATTENTION_BWD);
    rb.p = r->p;
    for (int i = 0; i < 3; i++) rb.in[i] = r->in[i];
    rb.in[3] = gpu_f64_view(hy, qs);
    rb.in[4] = gpu_f64_view(hl, ls);
    rb.in[5] = gpu_f64_view(dy, qs);
    rb.out[0] = th_view(MR_F64, qs);
    rb.out[1] = th_view(MR_F64, ks);
    rb.out[2] = th_view(MR_F64, ks);
    MR_ASSERT_OK(mr_op_run_ref(&rb));
    return rb;
}

double *gpu_rand(int64_t n, double lo, double hi, uint64_t seed, mr_dtype dt) {
    double *x = th_alloc((size_t)(n ? n : 1) * sizeof(double));
    th_fill_uniform_f64(x, n, lo, hi, seed);
    gpu_round_to(x, n, dt);
    return x;
}

static int is_float(mr_dtype dt) { return dt == MR_F32 || dt == MR_F64 || dt == MR_F16 || dt == MR_BF16; }

/* The view's values as f64 (host views of the reference args: F64 or integer). */
static double *host_vals(const mr_view *v) {
    int64_t n = mr_shape_numel(&v->shape);
    double *x = th_alloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) x[i] = mr_dtype_get(v->data, v->dtype, i);
    return x;
}

/* One GPU run of r's op on fresh device copies; returns the outputs as f64 host arrays. */
static void gpu_run(const mr_op_args *r, mr_dtype dt, mr_dtype out_dt, double **outs) {
    mr_op_args g = *r;
    mr_tensor *to[MR_OP_MAX_IO] = {0};
    for (int i = 0; i < r->n_in; i++) {
        if (!r->in[i].data) continue;
        mr_dtype t = is_float(r->in[i].dtype) ? dt : r->in[i].dtype;
        g.in[i] = mr_tensor_as_view(gpu_upload(host_vals(&r->in[i]), t, r->in[i].shape));
    }
    for (int i = 0; i < r->n_out; i++) {
        if (!r->out[i].data) continue;
        mr_dtype t = is_float(r->out[i].dtype) ? out_dt : r->out[i].dtype;
        to[i] = gpu_upload(host_vals(&r->out[i]), t, r->out[i].shape);
        g.out[i] = mr_tensor_as_view(to[i]);
    }
    g.stream = NULL;
    g.device = 0;
    gpu_run_op(&g);
    for (int i = 0; i < r->n_out; i++) outs[i] = to[i] ? gpu_download(to[i]) : NULL;
}

void gpu_run_op(mr_op_args *a) {
    a->workspace = NULL;
    a->workspace_bytes = 0;
    size_t ws = mr_op_workspace_bytes(a);
    if (ws) {
        mr_tensor *w = gpu_alloc(MR_U8, mr_shape_1d((int64_t)ws));
        a->workspace = mr_tensor_data(w);
        a->workspace_bytes = ws;
    }
    MR_ASSERT_OK(mr_op_run(MR_DEVICE_CUDA, a));
}

void gpu_check_vs_ref(const char *what, mr_op_args *r, mr_dtype dt, mr_dtype out_dt, double atol, double rtol,
                      double nmse) {
    /* both runs see the same rounded float inputs */
    for (int i = 0; i < r->n_in; i++)
        if (r->in[i].data && r->in[i].dtype == MR_F64)
            gpu_round_to((double *)r->in[i].data, mr_shape_numel(&r->in[i].shape), dt);
    for (int i = 0; i < r->n_out; i++)
        if (r->out[i].data && r->out[i].dtype == MR_F64)
            gpu_round_to((double *)r->out[i].data, mr_shape_numel(&r->out[i].shape), out_dt);
    double *first[MR_OP_MAX_IO] = {0}, *second[MR_OP_MAX_IO] = {0};
    gpu_run(r, dt, out_dt, first);
    gpu_run(r, dt, out_dt, second);
    MR_ASSERT_OK(mr_op_run_ref(r));
    for (int i = 0; i < r->n_out; i++) {
        if (!first[i]) continue;
        int64_t n = mr_shape_numel(&r->out[i].shape);
        char name[240];
        snprintf(name, sizeof name, "%s: out[%d]", what, i);
        for (int64_t j = 0; j < n; j++)
            if (memcmp(&first[i][j], &second[i][j], sizeof(double)) != 0 &&
                !(isnan(first[i][j]) && isnan(second[i][j])))
                fail_msg("%s: two GPU runs differ at %lld: %.9g vs %.9g (the kernel is not deterministic)", name,
                         (long long)j, first[i][j], second[i][j]);
        if (is_float(r->out[i].dtype)) {
            assert_true(th_compare(name, first[i], MR_F64, r->out[i].data, n, atol, rtol, nmse));
        } else {
            double *ref = host_vals(&r->out[i]);
            for (int64_t j = 0; j < n; j++)
                if (first[i][j] != ref[j])
                    fail_msg("%s: index %lld: GPU %.0f, reference %.0f", name, (long long)j, first[i][j], ref[j]);
        }
    }
}
