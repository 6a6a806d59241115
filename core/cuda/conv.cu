/* 2-d convolution on the GPU through cuDNN: the forward (MR_OP_CONV2D, with the optional bias),
 * the data gradient and the filter gradient with the optional bias gradient. Semantics in ops.h,
 * oracle core/ref/conv_ref.c; the check functions there have validated dtypes and shapes.
 *
 * Why cuDNN and not our own im2col + cuBLAS GEMM (the CPU path): on the GPU an explicit im2col
 * buffer is C*KH*KW times the input (9x for a 3x3 layer) written and read again every pass, and
 * the filter gradient would need either that buffer per image or atomics (not deterministic).
 * cuDNN's implicit-GEMM, Winograd and FFT kernels gather the patches on the fly, are tuned per
 * layer shape and GPU, and come in deterministic variants for all three passes.
 * Max pooling is not here: core/cuda/pool.cu is our own one-pass kernel, because ops.h's argmax
 * output (and -1 for a window of only padding) is something cuDNN's pooling does not give.
 *
 * Handles: one cudnnHandle_t per (device, cudaStream_t), created on first use, bound to that
 * stream for life (cudnnSetStream once) and kept to the end of the process, in a list under a
 * mutex (mr_stream in cuda_impl.h has no slot for one). A cuDNN handle must not be used by two
 * threads at once, so each has its own mutex, held while a call uses it.
 * Plans: the descriptors and the algorithm are made once per (pass, device, stream, dtype, shape,
 * params, workspace limit) and cached (CONV_PLANS entries, never evicted, so a plan in use is
 * never freed; with the cache full a plan is made for one call and freed after it). After the
 * first step a training step calls no cuDNN heuristics and allocates nothing.
 * Algorithm: cudnnGet*Algorithm_v7 (heuristics, no benchmark runs), the first result that
 * succeeded, is deterministic (mirror promises bit-identical reruns) and whose workspace fits in
 * the op's workspace (a->workspace_bytes: mr_conv2d_*_workspace is sized for the CPU im2col
 * kernel, and is 0 for f64; 0 when a->workspace is NULL); if none does, the pass's implicit-GEMM
 * algorithm (FWD_IMPLICIT_GEMM, BWD_DATA_ALGO_1, BWD_FILTER_ALGO_1: deterministic, normally no
 * workspace) if it fits. Last resort, since cuDNN does not promise any deterministic algorithm
 * runs without workspace: the usable one needing the least, in a buffer the plan allocates once
 * and owns (the stream in the key keeps it to one stream's order). The choice depends on the
 * workspace size, which depends on the CPU thread count at planning time: two machines may run
 * different (each deterministic) algorithms.
 * Math: f32 runs with CUDNN_FMA_MATH, because CUDNN_DEFAULT_MATH lets cuDNN use TF32 tensor cores
 * (10-bit mantissa) for f32 on Ampere and later; f64 uses CUDNN_DEFAULT_MATH; f16/bf16 (which
 * the conv checks do not accept today) would accumulate in f32 with CUDNN_TENSOR_OP_MATH.
 * cudnnAddTensor (bias) and cudnnConvolutionBackwardBias are not among the routines cuDNN's
 * reproducibility notes list as non-deterministic (those use atomics: BWD_FILTER_ALGO_0/3,
 * BWD_DATA_ALGO_0, which the determinism filter excludes). */
#include "core/cuda/cuda_impl.h"
#include "core/ops_impl.h"

#ifdef MIRROR_HAVE_CUDNN

#include "core/cuda/cudnn_impl.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

mr_status mr_cudnn_error(cudnnStatus_t e, const char *call, const char *file, int line) {
    char detail[256];
    detail[0] = '\0';
    cudnnGetLastErrorString(detail, sizeof detail);
    mr_status s = MR_ERR_DEVICE;
    if (e == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
        e == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        s = MR_ERR_NOMEM;
    else if (CUDNN_STATUS_CATEGORY(e) == CUDNN_STATUS_NOT_SUPPORTED)
        s = MR_ERR_UNSUPPORTED;
    return mr_set_error_at(s, file, line, "%s failed: %s (%d)%s%s", call, cudnnGetErrorString(e), (int)e,
                           detail[0] ? ": " : "", detail);
}

/* ---- handles: one per (device, stream) --------------------------------------------------------- */

typedef struct dnn_handle {
    int device;
    cudaStream_t s;
    cudnnHandle_t h;
    pthread_mutex_t mu; /* held while a call uses h */
    struct dnn_handle *next;
} dnn_handle;

static pthread_mutex_t g_dnn_mu = PTHREAD_MUTEX_INITIALIZER; /* guards g_dnn_handles */
static dnn_handle *g_dnn_handles;

/* The handle of (device, s), created and bound to s on first use; `device` must be current.
 * Thread-safe; the entry lives to the end of the process. On error changes nothing. */
static mr_status dnn_handle_get(int device, cudaStream_t s, dnn_handle **out) {
    mr_status st = MR_OK;
    dnn_handle *d = NULL;
    cudnnHandle_t h = NULL;
    pthread_mutex_lock(&g_dnn_mu);
    for (dnn_handle *e = g_dnn_handles; e; e = e->next)
        if (e->device == device && e->s == s) {
            *out = e;
            pthread_mutex_unlock(&g_dnn_mu);
            return MR_OK;
        }
    d = (dnn_handle *)calloc(1, sizeof *d);
    MR_CHECK(d, MR_ERR_NOMEM, "cuDNN: out of host memory for a handle");
    MR_TRY_CUDNN(cudnnCreate(&h));
    MR_TRY_CUDNN(cudnnSetStream(h, s));
    d->device = device;
    d->s = s;
    d->h = h;
    pthread_mutex_init(&d->mu, NULL);
    d->next = g_dnn_handles;
    g_dnn_handles = d;
    pthread_mutex_unlock(&g_dnn_mu);
    *out = d;
    return MR_OK;
fail:
    if (h) (void)cudnnDestroy(h);
    free(d);
    pthread_mutex_unlock(&g_dnn_mu);
    return st;
}

mr_status mr_cudnn_handle(int device, cudaStream_t s, cudnnHandle_t *h, pthread_mutex_t **mu) {
    dnn_handle *d = NULL;
    mr_status st = dnn_handle_get(device, s, &d);
    if (st != MR_OK) return st;
    *h = d->h;
    *mu = &d->mu;
    return MR_OK;
}

/* ---- geometry and plans ------------------------------------------------------------------------ */

enum { CONV_FWD = 0, CONV_BWD_DATA = 1, CONV_BWD_FILTER = 2 };

/* One pass's geometry in cuDNN's int: x (N,C,H,W), w (O,C,KH,KW), y (N,O,OH,OW). */
typedef struct conv_dims {
    int pass;
    mr_dtype dt;
    int n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw;
} conv_dims;

#define CONV_KEY_LEN 18
#define CONV_PLANS 128

typedef struct conv_plan {
    int64_t key[CONV_KEY_LEN];         /* conv_key() of what it was made for */
    cudnnTensorDescriptor_t x, y, b;   /* x (N,C,H,W) or dx, y (N,O,OH,OW) or dy, bias (1,O,1,1) */
    cudnnFilterDescriptor_t w;         /* w (O,C,KH,KW) or dw */
    cudnnConvolutionDescriptor_t conv;
    int algo;                          /* a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, by pass */
    size_t ws;                         /* workspace bytes the algorithm needs */
    int own;                           /* 1: ws exceeds the key's limit; the plan owns own_ws */
    void *own_ws;                      /* device buffer of ws bytes when own (one stream's: see key) */
} conv_plan;

static pthread_mutex_t g_plan_mu = PTHREAD_MUTEX_INITIALIZER; /* guards g_plans, g_n_plans */
static conv_plan *g_plans[CONV_PLANS];
static int g_n_plans;

static void conv_key(const conv_dims *g, int device, cudaStream_t s, size_t limit, int64_t *key) {
    const int64_t k[CONV_KEY_LEN] = {g->pass, device, (int64_t)(uintptr_t)s, (int64_t)g->dt, g->n, g->c,
                                     g->h, g->w, g->o, g->kh, g->kw, g->oh, g->ow, g->sh, g->sw, g->ph, g->pw,
                                     (int64_t)limit};
    memcpy(key, k, sizeof k);
}

/* The views of a pass by role: x (N,C,H,W), w (O,C,KH,KW), y (N,O,OH,OW); for the gradients
 * dx, dw and dy take the places of x, w and y. */
static void conv_views(const mr_op_args *a, int pass, const mr_view **x, const mr_view **w, const mr_view **y) {
    switch (pass) {
    case CONV_FWD: *x = &a->in[0]; *w = &a->in[1]; *y = &a->out[0]; break;
    case CONV_BWD_DATA: *x = &a->out[0]; *w = &a->in[0]; *y = &a->in[1]; break;
    default: *x = &a->in[0]; *w = &a->out[0]; *y = &a->in[1]; break;
    }
}

/* The geometry of the (checked) args; MR_ERR_UNSUPPORTED when a size exceeds cuDNN's int. */
static mr_status conv_dims_get(const mr_op_args *a, int pass, conv_dims *g) {
    const mr_view *x, *w, *y;
    conv_views(a, pass, &x, &w, &y);
    const int64_t *xd = x->shape.dim, *wd = w->shape.dim, *yd = y->shape.dim;
    const mr_conv_params *p = &a->p.conv;
    const int64_t v[9] = {xd[0], xd[1], xd[2], xd[3], wd[0], wd[2], wd[3], yd[2], yd[3]};
    for (int i = 0; i < 9; i++)
        if (v[i] > INT_MAX) {
            char b1[128], b2[128];
            return mr_set_error(MR_ERR_UNSUPPORTED, "%s: x %s, w %s: a dimension exceeds cuDNN's int range",
                                mr_op_get(a->op)->name, mr_shape_str(&x->shape, b1, 128),
                                mr_shape_str(&w->shape, b2, 128));
        }
    const conv_dims d = {pass,      x->dtype,  (int)v[0], (int)v[1],   (int)v[2],   (int)v[3], (int)v[4], (int)v[5],
                         (int)v[6], (int)v[7], (int)v[8], p->stride_h, p->stride_w, p->pad_h,  p->pad_w};
    *g = d;
    return MR_OK;
}

/* cuDNN's element type, the convolution's compute type and math type for dt. */
static mr_status dnn_types(mr_dtype dt, cudnnDataType_t *t, cudnnDataType_t *compute, cudnnMathType_t *math) {
    switch (dt) {
    case MR_F32: *t = CUDNN_DATA_FLOAT; *compute = CUDNN_DATA_FLOAT; *math = CUDNN_FMA_MATH; return MR_OK;
    case MR_F64: *t = CUDNN_DATA_DOUBLE; *compute = CUDNN_DATA_DOUBLE; *math = CUDNN_DEFAULT_MATH; return MR_OK;
    case MR_F16: *t = CUDNN_DATA_HALF; *compute = CUDNN_DATA_FLOAT; *math = CUDNN_TENSOR_OP_MATH; return MR_OK;
    case MR_BF16: *t = CUDNN_DATA_BFLOAT16; *compute = CUDNN_DATA_FLOAT; *math = CUDNN_TENSOR_OP_MATH; return MR_OK;
    default:
        return mr_set_error(MR_ERR_UNSUPPORTED, "conv2d: cuDNN takes f32, f64, f16 or bf16, got %s", mr_dtype_name(dt));
    }
}

static int dnn_is_half(mr_dtype dt) { return dt == MR_F16 || dt == MR_BF16; }

/* What the three passes differ in for the algorithm choice: the perf struct, the heuristics
 * query, the workspace query and the zero-workspace fallback. */
struct pass_fwd {
    typedef cudnnConvolutionFwdAlgoPerf_t perf;
    static const int count = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    static const int fallback = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    static cudnnStatus_t find(cudnnHandle_t h, const conv_plan *p, int *n, perf *r) {
        return cudnnGetConvolutionForwardAlgorithm_v7(h, p->x, p->w, p->conv, p->y, count, n, r);
    }
    static cudnnStatus_t ws(cudnnHandle_t h, const conv_plan *p, int algo, size_t *bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->conv, p->y, (cudnnConvolutionFwdAlgo_t)algo,
                                                       bytes);
    }
};

struct pass_bwd_data {
    typedef cudnnConvolutionBwdDataAlgoPerf_t perf;
    static const int count = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    static const int fallback = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    /* w, dy (p->y), dx (p->x) */
    static cudnnStatus_t find(cudnnHandle_t h, const conv_plan *p, int *n, perf *r) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->w, p->y, p->conv, p->x, count, n, r);
    }
    static cudnnStatus_t ws(cudnnHandle_t h, const conv_plan *p, int algo, size_t *bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->y, p->conv, p->x,
                                                            (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    }
};

struct pass_bwd_filter {
    typedef cudnnConvolutionBwdFilterAlgoPerf_t perf;
    static const int count = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
    static const int fallback = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    /* x, dy (p->y), dw (p->w) */
    static cudnnStatus_t find(cudnnHandle_t h, const conv_plan *p, int *n, perf *r) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p->x, p->y, p->conv, p->w, count, n, r);
    }
    static cudnnStatus_t ws(cudnnHandle_t h, const conv_plan *p, int algo, size_t *bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->x, p->y, p->conv, p->w,
                                                              (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
    }
};

/* A heuristics result we may run: it succeeded, is deterministic, and for f32/f64 is no
 * tensor-op (TF32 or down-converting) variant. */
template <typename Perf> static int perf_usable(const Perf *r, mr_dtype dt) {
    if (r->status != CUDNN_STATUS_SUCCESS || r->determinism != CUDNN_DETERMINISTIC) return 0;
    if (dnn_is_half(dt)) return 1;
    return r->mathType != CUDNN_TENSOR_OP_MATH && r->mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

/* Sets p->algo and p->ws: the first usable heuristics result whose workspace fits in `limit`,
 * else the pass's fallback if it fits. Else (cuDNN may want workspace even for the fallback, and
 * f64 ops plan none) the usable algorithm needing the least, with p->own set: the plan gets its
 * own buffer. MR_ERR_UNSUPPORTED with a HINT when nothing usable is left. */
template <typename P>
static mr_status pick_algo(cudnnHandle_t h, conv_plan *p, const conv_dims *g, cudnnMathType_t math, size_t limit,
                           const char *name) {
    mr_status st = MR_OK;
    typename P::perf r[P::count];
    int n = 0, least = -1; /* least: the algorithm needing the least workspace so far */
    size_t need = 0, least_need = 0;
    cudnnMathType_t least_math = math;
    MR_TRY_CUDNN(P::find(h, p, &n, r));
    for (int i = 0; i < n && i < P::count; i++) {
        if (!perf_usable(&r[i], g->dt)) continue;
        /* half types run the math variant the heuristics scored, tensor-op or not */
        if (dnn_is_half(g->dt)) MR_TRY_CUDNN(cudnnSetConvolutionMathType(p->conv, r[i].mathType));
        /* not supported for this configuration after all: try the next */
        if (P::ws(h, p, (int)r[i].algo, &need) != CUDNN_STATUS_SUCCESS) continue;
        if (need <= limit) {
            p->algo = (int)r[i].algo;
            p->ws = need;
            return MR_OK;
        }
        if (least < 0 || need < least_need) {
            least = (int)r[i].algo;
            least_need = need;
            least_math = r[i].mathType;
        }
    }
    if (dnn_is_half(g->dt)) MR_TRY_CUDNN(cudnnSetConvolutionMathType(p->conv, math));
    if (P::ws(h, p, P::fallback, &need) == CUDNN_STATUS_SUCCESS) {
        if (need <= limit) {
            p->algo = P::fallback;
            p->ws = need;
            return MR_OK;
        }
        if (least < 0 || need < least_need) {
            least = P::fallback;
            least_need = need;
            least_math = math;
        }
    }
    if (least >= 0) {
        if (dnn_is_half(g->dt)) MR_TRY_CUDNN(cudnnSetConvolutionMathType(p->conv, least_math));
        p->algo = least;
        p->ws = least_need;
        p->own = 1;
        return MR_OK;
    }
    return mr_set_error(MR_ERR_UNSUPPORTED,
                        "%s: cuDNN has no deterministic algorithm for x (%d,%d,%d,%d), w (%d,%d,%d,%d), "
                        "stride (%d,%d), padding (%d,%d), %s; HINT: run this convolution on the CPU",
                        name, g->n, g->c, g->h, g->w, g->o, g->c, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                        mr_dtype_name(g->dt));
fail:
    return st;
}

/* free(NULL)-style: destroys what was made. */
static void plan_free(conv_plan *p) {
    if (!p) return;
    if (p->own_ws) (void)cudaFree(p->own_ws);
    if (p->x) (void)cudnnDestroyTensorDescriptor(p->x);
    if (p->y) (void)cudnnDestroyTensorDescriptor(p->y);
    if (p->b) (void)cudnnDestroyTensorDescriptor(p->b);
    if (p->w) (void)cudnnDestroyFilterDescriptor(p->w);
    if (p->conv) (void)cudnnDestroyConvolutionDescriptor(p->conv);
    free(p);
}

/* A new plan for g: descriptors, and the algorithm chosen with handle h for a workspace of at
 * most `limit` bytes, or the plan's own workspace. */
static mr_status plan_new(cudnnHandle_t h, const conv_dims *g, size_t limit, const char *name, conv_plan **out) {
    mr_status st = MR_OK;
    cudnnDataType_t t, ct;
    cudnnMathType_t math;
    int dn = 0, dc = 0, dh = 0, dw = 0;
    conv_plan *p = (conv_plan *)calloc(1, sizeof *p);
    MR_CHECK(p, MR_ERR_NOMEM, "%s: out of host memory for a cuDNN plan", name);
    MR_TRY(dnn_types(g->dt, &t, &ct, &math));
    MR_TRY_CUDNN(cudnnCreateTensorDescriptor(&p->x));
    MR_TRY_CUDNN(cudnnCreateTensorDescriptor(&p->y));
    MR_TRY_CUDNN(cudnnCreateTensorDescriptor(&p->b));
    MR_TRY_CUDNN(cudnnCreateFilterDescriptor(&p->w));
    MR_TRY_CUDNN(cudnnCreateConvolutionDescriptor(&p->conv));
    MR_TRY_CUDNN(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, t, g->n, g->c, g->h, g->w));
    MR_TRY_CUDNN(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, t, g->n, g->o, g->oh, g->ow));
    MR_TRY_CUDNN(cudnnSetTensor4dDescriptor(p->b, CUDNN_TENSOR_NCHW, t, 1, g->o, 1, 1));
    MR_TRY_CUDNN(cudnnSetFilter4dDescriptor(p->w, t, CUDNN_TENSOR_NCHW, g->o, g->c, g->kh, g->kw));
    /* cross-correlation (no kernel flip), as PyTorch and the reference; no dilation */
    MR_TRY_CUDNN(
        cudnnSetConvolution2dDescriptor(p->conv, g->ph, g->pw, g->sh, g->sw, 1, 1, CUDNN_CROSS_CORRELATION, ct));
    MR_TRY_CUDNN(cudnnSetConvolutionMathType(p->conv, math));
    /* cuDNN's output shape must be ours (same floor rule), or the descriptors disagree */
    MR_TRY_CUDNN(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &dn, &dc, &dh, &dw));
    MR_CHECK(dn == g->n && dc == g->o && dh == g->oh && dw == g->ow, MR_ERR_INTERNAL,
             "%s: cuDNN's output shape (%d,%d,%d,%d) is not (%d,%d,%d,%d)", name, dn, dc, dh, dw, g->n, g->o, g->oh,
             g->ow);
    switch (g->pass) {
    case CONV_FWD: MR_TRY(pick_algo<pass_fwd>(h, p, g, math, limit, name)); break;
    case CONV_BWD_DATA: MR_TRY(pick_algo<pass_bwd_data>(h, p, g, math, limit, name)); break;
    default: MR_TRY(pick_algo<pass_bwd_filter>(h, p, g, math, limit, name)); break;
    }
    /* allocated once, with the plan: steady-state steps still allocate nothing */
    if (p->own && p->ws) MR_TRY_CUDA(cudaMalloc(&p->own_ws, p->ws));
    *out = p;
    return MR_OK;
fail:
    plan_free(p);
    return st;
}

/* The cached plan for (g, device, stream s, limit), made with handle h (bound to s) on first use.
 * With the cache full, a new plan that the caller frees (*one_call = 1). Thread-safe; cached plans
 * are never changed or freed, so they are used outside the lock. */
static mr_status plan_get(cudnnHandle_t h, const conv_dims *g, int device, cudaStream_t s, size_t limit,
                          const char *name, conv_plan **out, int *one_call) {
    int64_t key[CONV_KEY_LEN];
    conv_plan *p = NULL;
    conv_key(g, device, s, limit, key);
    *one_call = 0;
    pthread_mutex_lock(&g_plan_mu);
    for (int i = 0; i < g_n_plans; i++)
        if (memcmp(g_plans[i]->key, key, sizeof key) == 0) {
            *out = g_plans[i];
            pthread_mutex_unlock(&g_plan_mu);
            return MR_OK;
        }
    mr_status st = plan_new(h, g, limit, name, &p);
    if (st == MR_OK) {
        memcpy(p->key, key, sizeof key);
        if (g_n_plans < CONV_PLANS) g_plans[g_n_plans++] = p;
        else *one_call = 1;
        *out = p;
    }
    pthread_mutex_unlock(&g_plan_mu);
    return st;
}

/* ---- the three passes -------------------------------------------------------------------------- */

/* cuDNN's scaling factors are double for f64 data and float otherwise. */
static const void *dnn_one(mr_dtype dt) {
    static const float f = 1.0f;
    static const double d = 1.0;
    return dt == MR_F64 ? (const void *)&d : (const void *)&f;
}
static const void *dnn_zero(mr_dtype dt) {
    static const float f = 0.0f;
    static const double d = 0.0;
    return dt == MR_F64 ? (const void *)&d : (const void *)&f;
}

/* Runs pass `pass` of the checked args `a` on a->stream. */
static mr_status conv_cuda(const mr_op_args *a, int pass) {
    mr_status st = MR_OK;
    const char *name = mr_op_get(a->op)->name;
    const mr_view *x, *w, *y; /* x (N,C,H,W), w (O,C,KH,KW), y (N,O,OH,OW), or dx, dw, dy */
    conv_dims g;
    cudaStream_t s;
    dnn_handle *dh = NULL;
    conv_plan *p = NULL;
    int one_call = 0, locked = 0;
    /* the CPU's mixed precision and fused ReLU (core/ops.h MR_OP_CONV2D): not done here, so refused
     * rather than silently computed without them (the graph sets them on the CPU only) */
    MR_CHECK(!a->p.conv.bf16 && !(pass == CONV_FWD && a->p.conv.relu) && !(pass != CONV_FWD && a->p.conv.pool),
             MR_ERR_UNSUPPORTED,
             "%s: p.conv.%s is a CPU kernel option, not supported by the CUDA kernel; HINT: build the graph for the "
             "GPU (autodiff/nn.h mr_nn.device) so it keeps convolutions in f32 with a separate ReLU",
             name, a->p.conv.bf16 ? "bf16" : pass == CONV_FWD ? "relu" : "pool");
    conv_views(a, pass, &x, &w, &y);
    MR_TRY(conv_dims_get(a, pass, &g));
    MR_TRY(mr_cuda_op_stream(a, &s));
    {
        /* Sizes cuDNN cannot describe (a 0 dimension): an empty output needs nothing; a sum over
         * nothing is zeros. */
        int64_t nx = mr_shape_numel(&x->shape), nw = mr_shape_numel(&w->shape), ny = mr_shape_numel(&y->shape);
        size_t esz = mr_dtype_size(g.dt);
        const mr_view *db = pass == CONV_BWD_FILTER ? &a->out[1] : NULL; /* dbias (O), optional */
        if (pass == CONV_FWD && ny == 0) return MR_OK;
        if (pass == CONV_BWD_DATA && nx == 0) return MR_OK;
        if (pass == CONV_BWD_DATA && ny == 0) { /* O == 0: dx (N,C,H,W) = 0 */
            MR_TRY_CUDA(cudaMemsetAsync(x->data, 0, (size_t)nx * esz, s));
            return MR_OK;
        }
        if (pass == CONV_BWD_FILTER && ny == 0) { /* N == 0 (or O == 0): dw, dbias = 0 */
            if (nw) MR_TRY_CUDA(cudaMemsetAsync(w->data, 0, (size_t)nw * esz, s));
            if (db->data && g.o) MR_TRY_CUDA(cudaMemsetAsync(db->data, 0, (size_t)g.o * esz, s));
            return MR_OK;
        }
        if (pass == CONV_BWD_FILTER && nw == 0 && !db->data) return MR_OK; /* C == 0: dw is empty */
        if (nx == 0 || nw == 0) {
            char b1[128], b2[128];
            return mr_set_error(MR_ERR_UNSUPPORTED,
                                "%s: x %s, w %s: cuDNN cannot describe an empty input (0 channels, rows or "
                                "columns); HINT: run this convolution on the CPU",
                                name, mr_shape_str(&x->shape, b1, 128), mr_shape_str(&w->shape, b2, 128));
        }
    }
    {
        int device = a->stream ? a->stream->device : a->device;
        size_t limit = a->workspace ? a->workspace_bytes : 0;
        MR_TRY(dnn_handle_get(device, s, &dh));
        pthread_mutex_lock(&dh->mu);
        locked = 1;
        MR_TRY(plan_get(dh->h, &g, device, s, limit, name, &p, &one_call));
        void *ws = p->own ? p->own_ws : p->ws ? a->workspace : NULL;
        const void *one = dnn_one(g.dt), *zero = dnn_zero(g.dt);
        /* beta = 0: cuDNN does not read the output, so it may hold anything (NaN included) */
        switch (pass) {
        case CONV_FWD:
            /* y = x (*) w, then y += bias (O) broadcast over N, OH, OW */
            MR_TRY_CUDNN(cudnnConvolutionForward(dh->h, one, p->x, x->data, p->w, w->data, p->conv,
                                                 (cudnnConvolutionFwdAlgo_t)p->algo, ws, p->ws, zero, p->y, y->data));
            if (a->in[2].data) MR_TRY_CUDNN(cudnnAddTensor(dh->h, one, p->b, a->in[2].data, one, p->y, y->data));
            break;
        case CONV_BWD_DATA:
            /* dx = the transposed convolution of dy with w */
            MR_TRY_CUDNN(cudnnConvolutionBackwardData(dh->h, one, p->w, w->data, p->y, y->data, p->conv,
                                                      (cudnnConvolutionBwdDataAlgo_t)p->algo, ws, p->ws, zero, p->x,
                                                      x->data));
            break;
        default:
            /* dw = sum over images and output positions of x patch * dy; dbias (O) = dy summed over N, OH, OW */
            MR_TRY_CUDNN(cudnnConvolutionBackwardFilter(dh->h, one, p->x, x->data, p->y, y->data, p->conv,
                                                        (cudnnConvolutionBwdFilterAlgo_t)p->algo, ws, p->ws, zero,
                                                        p->w, w->data));
            if (a->out[1].data)
                MR_TRY_CUDNN(cudnnConvolutionBackwardBias(dh->h, one, p->y, y->data, zero, p->b, a->out[1].data));
            break;
        }
    }
fail:
    if (locked) pthread_mutex_unlock(&dh->mu);
    /* a one-call plan: the host-side descriptors may go once the calls are enqueued; its own
     * workspace only once they have run */
    if (one_call && p->own_ws) (void)cudaStreamSynchronize(s);
    if (one_call) plan_free(p);
    return st;
}

/* in: x (N,C,H,W), w (O,C,KH,KW), bias (O) optional; out: y (N,O,OH,OW) */
extern "C" mr_status mr_conv2d_fwd_cuda(const mr_op_args *a) { return conv_cuda(a, CONV_FWD); }

/* in: w (O,C,KH,KW), dy (N,O,OH,OW); out: dx (N,C,H,W) */
extern "C" mr_status mr_conv2d_bwd_data_cuda(const mr_op_args *a) { return conv_cuda(a, CONV_BWD_DATA); }

/* in: x (N,C,H,W), dy (N,O,OH,OW); out: dw (O,C,KH,KW), dbias (O) optional */
extern "C" mr_status mr_conv2d_bwd_filter_cuda(const mr_op_args *a) { return conv_cuda(a, CONV_BWD_FILTER); }

#else /* no cuDNN in this build */

static mr_status conv_no_cudnn(const mr_op_args *a) {
    return mr_set_error(MR_ERR_UNSUPPORTED,
                        "%s: this build has no cuDNN; HINT: install cuDNN 9 (library and cudnn.h) and re-run cmake, "
                        "or run the convolution on the CPU",
                        mr_op_get(a->op)->name);
}

extern "C" mr_status mr_conv2d_fwd_cuda(const mr_op_args *a) { return conv_no_cudnn(a); }
extern "C" mr_status mr_conv2d_bwd_data_cuda(const mr_op_args *a) { return conv_no_cudnn(a); }
extern "C" mr_status mr_conv2d_bwd_filter_cuda(const mr_op_args *a) { return conv_no_cudnn(a); }

#endif
