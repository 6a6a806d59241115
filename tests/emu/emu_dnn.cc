/* The emulated cuDNN: the legacy convolution API mirror calls (core/cuda/conv.cu, doctor_cuda.cu),
 * with the real header's signatures: handles, 4d NCHW tensor and filter descriptors, 2d
 * convolution descriptors (cross-correlation, no dilation, groups 1), the _v7 algorithm queries,
 * workspace sizes, forward, backward data, backward filter, backward bias and AddTensor (bias
 * broadcast). Results are computed in double from the stored values and rounded once, with
 * cuDNN's scaling: out = alpha * op + beta * out (beta == 0: the output is not read).
 *
 * Checked (a violation aborts with "mirror-emu: cudnn: ..."): descriptors created, set, and not
 * destroyed; one data type across x, w, y (alpha/beta float for half types, double for double);
 * the output dims equal cudnnGetConvolution2dForwardOutputDim's; the math type allowed for the
 * data type (tensor-op math only for half types, as mirror promises for f32/f64); the algorithm
 * one the heuristics returned; the workspace at least what cudnnGet*WorkspaceSize says for that
 * algorithm and in device memory; every buffer inside one device allocation of the handle's
 * stream's GPU. The heuristics return two algorithms: one that wants 1 MiB of workspace and the
 * zero-workspace fallback mirror names, so both of conv.cu's choices get exercised.
 * The backend graph API (cuDNN's fused attention) is emulated in emu_dnn_graph.cc. */
#define MR_EMU_RUNTIME 1
#include "tests/emu/emu_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <vector>

namespace mr_emu {
/* A cuDNN argument misuse: "mirror-emu: cudnn: <fn>: <message>", then abort (also used by
 * emu_dnn_graph.cc). */
[[noreturn]] void dnn_bad(const char *fn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dnn_bad(const char *fn, const char *fmt, ...) {
    char m[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fatal("cudnn", "%s: %s", fn, m);
}
} // namespace mr_emu

namespace {
const uint32_t LIVE = 0xC0DECAFEu, DEAD = 0xDEADDEADu;
using mr_emu::keep_dead;
const size_t ALGO_WS = 1u << 20;
thread_local char t_last[256];
} // namespace

struct cudnnContext {
    uint32_t magic;
    cudaStream_t stream;
    int device;
};
struct cudnnTensorStruct {
    uint32_t magic;
    bool set;
    cudnnDataType_t type;
    int n, c, h, w;
};
struct cudnnFilterStruct {
    uint32_t magic;
    bool set;
    cudnnDataType_t type;
    int k, c, h, w;
};
struct cudnnConvolutionStruct {
    uint32_t magic;
    bool set;
    int ph, pw, sh, sw;
    cudnnDataType_t compute;
    cudnnMathType_t math;
};

namespace {

using mr_emu::dnn_bad;

template <class T> T *use(T *o, const char *fn, const char *what, bool need_set = true) {
    if (!o) dnn_bad(fn, "the %s is NULL", what);
    if (o->magic == DEAD) dnn_bad(fn, "the %s was used after it was destroyed", what);
    if (o->magic != LIVE) dnn_bad(fn, "the %s was never created", what);
    if (need_set && !o->set) dnn_bad(fn, "the %s was created but never set", what);
    return o;
}
cudnnContext *use_h(cudnnHandle_t h, const char *fn) {
    if (!h || h->magic != LIVE) dnn_bad(fn, "the handle is %s", h && h->magic == DEAD ? "destroyed" : "not a handle");
    return h;
}

/* cuDNN's data type as the CUDA data type the shared loads and stores take (emu_values.cc) */
cudaDataType cuda_type(cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_FLOAT: return CUDA_R_32F;
    case CUDNN_DATA_DOUBLE: return CUDA_R_64F;
    case CUDNN_DATA_HALF: return CUDA_R_16F;
    case CUDNN_DATA_BFLOAT16: return CUDA_R_16BF;
    default: return CUDA_R_8I; /* no size: refused by the descriptor setters */
    }
}
size_t esize(cudnnDataType_t t) { return mr_emu::value_size(cuda_type(t)); }
double ld(const void *p, size_t i, cudnnDataType_t t) { return mr_emu::load_value(p, (int64_t)i, cuda_type(t)); }
void st(void *p, size_t i, cudnnDataType_t t, double v) { mr_emu::store_value(p, (int64_t)i, cuda_type(t), v); }
/* alpha/beta: double for double data, float otherwise (cuDNN's scaling parameter rule) */
double scal(const void *p, cudnnDataType_t t) { return t == CUDNN_DATA_DOUBLE ? *(const double *)p : *(const float *)p; }

void in_dev(const char *fn, const char *what, const void *p, size_t bytes, int device) {
    if (bytes == 0) return;
    int d = -1;
    if (!p || !mr_emu::device_range(p, bytes, &d)) dnn_bad(fn, "%s (%zu bytes at %p) is not inside one device allocation", what, bytes, p);
    if (d != device) dnn_bad(fn, "%s is memory of cuda:%d, the handle's stream is on cuda:%d", what, d, device);
}
size_t tbytes(const cudnnTensorStruct *t) { return (size_t)t->n * t->c * t->h * t->w * esize(t->type); }
size_t fbytes(const cudnnFilterStruct *f) { return (size_t)f->k * f->c * f->h * f->w * esize(f->type); }

int out_dim(int in, int pad, int k, int s) { return (in + 2 * pad - k) / s + 1; }

/* The geometry all three passes share, checked once. */
struct geom {
    cudnnDataType_t t;
    int n, c, h, w, k, kh, kw, oh, ow, ph, pw, sh, sw;
};
geom check(const char *fn, cudnnTensorStruct *x, cudnnFilterStruct *w, cudnnConvolutionStruct *cv, cudnnTensorStruct *y) {
    if (x->type != w->type || x->type != y->type) dnn_bad(fn, "x, w and y have different data types (%d, %d, %d)", x->type, w->type, y->type);
    if (x->c != w->c) dnn_bad(fn, "x has %d channels, the filter %d", x->c, w->c);
    int oh = out_dim(x->h, cv->ph, w->h, cv->sh), ow = out_dim(x->w, cv->pw, w->w, cv->sw);
    if (y->n != x->n || y->c != w->k || y->h != oh || y->w != ow)
        dnn_bad(fn, "y is (%d,%d,%d,%d), the convolution gives (%d,%d,%d,%d)", y->n, y->c, y->h, y->w, x->n, w->k, oh, ow);
    bool half = x->type == CUDNN_DATA_HALF || x->type == CUDNN_DATA_BFLOAT16;
    if (x->type == CUDNN_DATA_DOUBLE && cv->compute != CUDNN_DATA_DOUBLE) dnn_bad(fn, "double data needs a double compute type");
    if (x->type != CUDNN_DATA_DOUBLE && cv->compute != CUDNN_DATA_FLOAT) dnn_bad(fn, "compute type %d for data type %d", cv->compute, x->type);
    if (!half && (cv->math == CUDNN_TENSOR_OP_MATH || cv->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
        dnn_bad(fn, "tensor-op math on %s data (TF32 or down-conversion: mirror promises full precision)",
            x->type == CUDNN_DATA_DOUBLE ? "double" : "float");
    return geom{x->type, x->n, x->c, x->h, x->w, w->k, w->h, w->w, oh, ow, cv->ph, cv->pw, cv->sh, cv->sw};
}

template <class Algo> Algo ws_algo(Algo fallback);
void check_ws(const char *fn, int algo, int fallback, void *ws, size_t bytes) {
    if (algo != ws_algo(fallback) && algo != fallback) dnn_bad(fn, "algorithm %d did not come from the heuristics", algo);
    size_t need = algo == fallback ? 0 : ALGO_WS;
    if (bytes < need) dnn_bad(fn, "algorithm %d needs %zu bytes of workspace, got %zu", algo, need, bytes);
    if (bytes > 0 && !mr_emu::device_range(ws, bytes, nullptr)) dnn_bad(fn, "the workspace (%zu bytes at %p) is not device memory", bytes, ws);
}

cudnnStatus_t queue(cudnnContext *h, const char *fn, std::function<void()> f) {
    mr_emu::count_library_call();
    cudaError_t e = mr_emu::enqueue(h->stream, fn, std::move(f));
    return e == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

size_t xi(const geom &g, int n, int c, int y, int x) { return (((size_t)n * g.c + c) * g.h + y) * g.w + x; }
size_t wi(const geom &g, int k, int c, int y, int x) { return (((size_t)k * g.c + c) * g.kh + y) * g.kw + x; }
size_t yi(const geom &g, int n, int k, int y, int x) { return (((size_t)n * g.k + k) * g.oh + y) * g.ow + x; }

/* Calls f(n, k, oy, ox, c, ky, kx, iy, ix) for every in-bounds tap of the convolution. */
template <class F> void taps(const geom &g, F f) {
    for (int n = 0; n < g.n; n++)
        for (int k = 0; k < g.k; k++)
            for (int oy = 0; oy < g.oh; oy++)
                for (int ox = 0; ox < g.ow; ox++)
                    for (int c = 0; c < g.c; c++)
                        for (int ky = 0; ky < g.kh; ky++) {
                            int iy = oy * g.sh - g.ph + ky;
                            if (iy < 0 || iy >= g.h) continue;
                            for (int kx = 0; kx < g.kw; kx++) {
                                int ix = ox * g.sw - g.pw + kx;
                                if (ix < 0 || ix >= g.w) continue;
                                f(n, k, oy, ox, c, ky, kx, iy, ix);
                            }
                        }
}

/* n stored values as doubles (each converted once) */
std::vector<double> widen(const void *p, size_t n, cudnnDataType_t t) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; i++) v[i] = ld(p, i, t);
    return v;
}

/* out = alpha * acc + beta * out, acc in double */
void finish(void *out, cudnnDataType_t t, const std::vector<double> &acc, double alpha, double beta) {
    for (size_t i = 0; i < acc.size(); i++) st(out, i, t, alpha * acc[i] + (beta != 0.0 ? beta * ld(out, i, t) : 0.0));
}

} // namespace

namespace {
/* ---- algorithm queries: a 1 MiB algorithm first, the zero-workspace fallback second ---------- */
/* the algorithm that wants ALGO_WS: a real enum value (UBSan checks enum loads), not the fallback */
template <class Algo> Algo ws_algo(Algo fallback) { return (Algo)(fallback == 0 ? 2 : 0); }
template <class Perf, class Algo> static void two(Perf *r, int req, int *ret, Algo fallback, cudnnMathType_t math) {
    memset(r, 0, sizeof(Perf) * (size_t)req);
    int n = 0;
    if (req > n) r[n++] = Perf{ws_algo(fallback), CUDNN_STATUS_SUCCESS, 1.0f, ALGO_WS, CUDNN_DETERMINISTIC, math, {0, 0, 0}};
    if (req > n) r[n++] = Perf{fallback, CUDNN_STATUS_SUCCESS, 2.0f, 0, CUDNN_DETERMINISTIC, math, {0, 0, 0}};
    *ret = n;
}

} // namespace

namespace mr_emu {
/* for the backend graph API (emu_dnn_graph.cc): a checked handle's stream, and the text
 * cudnnGetLastErrorString gives next on this thread */
cudaStream_t dnn_handle_stream(cudnnHandle_t h, const char *fn) { return use_h(h, fn)->stream; }
void dnn_set_last_error(const char *msg) { snprintf(t_last, sizeof t_last, "%s", msg); }
} // namespace mr_emu

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char *cudnnGetErrorString(cudnnStatus_t s) {
    switch (s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_(emulated, other)";
    }
}

void cudnnGetLastErrorString(char *message, size_t max_size) {
    if (max_size) snprintf(message, max_size, "%s", t_last);
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    *h = new cudnnContext{LIVE, (cudaStream_t)0, mr_emu::current_device()};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
    use_h(h, "cudnnDestroy")->magic = DEAD;
    keep_dead(h); /* kept so a later use is reported */
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
    cudnnContext *c = use_h(h, "cudnnSetStream");
    int d = mr_emu::stream_device(s);
    if (d != c->device) dnn_bad("cudnnSetStream", "a stream of cuda:%d for a handle created on cuda:%d", d, c->device);
    c->stream = s;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) {
    *d = new cudnnTensorStruct{LIVE, false, CUDNN_DATA_FLOAT, 0, 0, 0, 0};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
    if (d) use(d, "cudnnDestroyTensorDescriptor", "tensor descriptor", false)->magic = DEAD;
    if (d) keep_dead(d);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f, cudnnDataType_t t, int n,
                                         int c, int h, int w) {
    use(d, "cudnnSetTensor4dDescriptor", "tensor descriptor", false);
    if (f != CUDNN_TENSOR_NCHW) dnn_bad("cudnnSetTensor4dDescriptor", "format %d is not emulated (NCHW)", (int)f);
    if (esize(t) == 0) dnn_bad("cudnnSetTensor4dDescriptor", "data type %d is not emulated", (int)t);
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    *d = cudnnTensorStruct{LIVE, true, t, n, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) {
    *d = new cudnnFilterStruct{LIVE, false, CUDNN_DATA_FLOAT, 0, 0, 0, 0};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
    if (d) use(d, "cudnnDestroyFilterDescriptor", "filter descriptor", false)->magic = DEAD;
    if (d) keep_dead(d);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t, cudnnTensorFormat_t f, int k,
                                         int c, int h, int w) {
    use(d, "cudnnSetFilter4dDescriptor", "filter descriptor", false);
    if (f != CUDNN_TENSOR_NCHW) dnn_bad("cudnnSetFilter4dDescriptor", "format %d is not emulated (NCHW)", (int)f);
    if (esize(t) == 0) dnn_bad("cudnnSetFilter4dDescriptor", "data type %d is not emulated", (int)t);
    if (k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    *d = cudnnFilterStruct{LIVE, true, t, k, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d) {
    *d = new cudnnConvolutionStruct{LIVE, false, 0, 0, 1, 1, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
    if (d) use(d, "cudnnDestroyConvolutionDescriptor", "convolution descriptor", false)->magic = DEAD;
    if (d) keep_dead(d);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw, int sh, int sw, int dh,
                                              int dw, cudnnConvolutionMode_t mode, cudnnDataType_t compute) {
    use(d, "cudnnSetConvolution2dDescriptor", "convolution descriptor", false);
    if (ph < 0 || pw < 0 || sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0) return CUDNN_STATUS_BAD_PARAM;
    if (dh != 1 || dw != 1) dnn_bad("cudnnSetConvolution2dDescriptor", "dilation %dx%d is not emulated", dh, dw);
    if (mode != CUDNN_CROSS_CORRELATION) dnn_bad("cudnnSetConvolution2dDescriptor", "CUDNN_CONVOLUTION (flipped kernels) is not emulated");
    cudnnMathType_t m = d->math;
    *d = cudnnConvolutionStruct{LIVE, true, ph, pw, sh, sw, compute, m};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) {
    use(d, "cudnnSetConvolutionMathType", "convolution descriptor", false)->math = m;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t cv, const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int *n, int *c, int *h, int *wo) {
    const char *fn = "cudnnGetConvolution2dForwardOutputDim";
    use(cv, fn, "convolution descriptor");
    use(x, fn, "input descriptor");
    use(w, fn, "filter descriptor");
    if (x->c != w->c) return CUDNN_STATUS_BAD_PARAM;
    *n = x->n;
    *c = w->k;
    *h = out_dim(x->h, cv->ph, w->h, cv->sh);
    *wo = out_dim(x->w, cv->pw, w->w, cv->sw);
    return *h > 0 && *wo > 0 ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w, const cudnnConvolutionDescriptor_t cv,
                                                     const cudnnTensorDescriptor_t y, const int req, int *ret,
                                                     cudnnConvolutionFwdAlgoPerf_t *r) {
    const char *fn = "cudnnGetConvolutionForwardAlgorithm_v7";
    use_h(h, fn);
    check(fn, use(x, fn, "x descriptor"), use(w, fn, "w descriptor"), use(cv, fn, "convolution"), use(y, fn, "y descriptor"));
    two(r, req, ret, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, cv->math);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                          const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t cv,
                                                          const cudnnTensorDescriptor_t dx, const int req, int *ret,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *r) {
    const char *fn = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
    use_h(h, fn);
    check(fn, use(dx, fn, "dx descriptor"), use(w, fn, "w descriptor"), use(cv, fn, "convolution"), use(dy, fn, "dy descriptor"));
    two(r, req, ret, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, cv->math);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                            const cudnnTensorDescriptor_t dy,
                                                            const cudnnConvolutionDescriptor_t cv,
                                                            const cudnnFilterDescriptor_t dw, const int req, int *ret,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *r) {
    const char *fn = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
    use_h(h, fn);
    check(fn, use(x, fn, "x descriptor"), use(dw, fn, "dw descriptor"), use(cv, fn, "convolution"), use(dy, fn, "dy descriptor"));
    two(r, req, ret, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, cv->math);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t ws_size(int algo, int fallback, size_t *bytes) {
    if (algo == ws_algo(fallback)) *bytes = ALGO_WS;
    else if (algo == fallback) *bytes = 0;
    else return CUDNN_STATUS_NOT_SUPPORTED; /* the emulator has no such algorithm */
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w, const cudnnConvolutionDescriptor_t cv,
                                                      const cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *bytes) {
    const char *fn = "cudnnGetConvolutionForwardWorkspaceSize";
    use_h(h, fn);
    check(fn, use(x, fn, "x descriptor"), use(w, fn, "w descriptor"), use(cv, fn, "convolution"), use(y, fn, "y descriptor"));
    return ws_size((int)algo, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                           const cudnnTensorDescriptor_t dy,
                                                           const cudnnConvolutionDescriptor_t cv,
                                                           const cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t *bytes) {
    const char *fn = "cudnnGetConvolutionBackwardDataWorkspaceSize";
    use_h(h, fn);
    check(fn, use(dx, fn, "dx descriptor"), use(w, fn, "w descriptor"), use(cv, fn, "convolution"), use(dy, fn, "dy descriptor"));
    return ws_size((int)algo, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                             const cudnnTensorDescriptor_t dy,
                                                             const cudnnConvolutionDescriptor_t cv,
                                                             const cudnnFilterDescriptor_t dw,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t *bytes) {
    const char *fn = "cudnnGetConvolutionBackwardFilterWorkspaceSize";
    use_h(h, fn);
    check(fn, use(x, fn, "x descriptor"), use(dw, fn, "dw descriptor"), use(cv, fn, "convolution"), use(dy, fn, "dy descriptor"));
    return ws_size((int)algo, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, bytes);
}

/* ---- the passes ----------------------------------------------------------------------------- */

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t hh, const void *alpha, const cudnnTensorDescriptor_t xd,
                                      const void *x, const cudnnFilterDescriptor_t wd, const void *w,
                                      const cudnnConvolutionDescriptor_t cd, cudnnConvolutionFwdAlgo_t algo, void *ws,
                                      size_t ws_bytes, const void *beta, const cudnnTensorDescriptor_t yd, void *y) {
    const char *fn = "cudnnConvolutionForward";
    cudnnContext *h = use_h(hh, fn);
    geom g = check(fn, use(xd, fn, "x descriptor"), use(wd, fn, "w descriptor"), use(cd, fn, "convolution"), use(yd, fn, "y descriptor"));
    check_ws(fn, (int)algo, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, ws, ws_bytes);
    int dev = mr_emu::stream_device(h->stream);
    in_dev(fn, "x", x, tbytes(xd), dev);
    in_dev(fn, "w", w, fbytes(wd), dev);
    in_dev(fn, "y", y, tbytes(yd), dev);
    double a = scal(alpha, g.t), b = scal(beta, g.t);
    return queue(h, fn, [=]() {
        std::vector<double> acc((size_t)g.n * g.k * g.oh * g.ow, 0.0);
        std::vector<double> X = widen(x, xi(g, g.n, 0, 0, 0), g.t), W = widen(w, wi(g, g.k, 0, 0, 0), g.t);
        taps(g, [&](int n, int k, int oy, int ox, int c, int ky, int kx, int iy, int ix) {
            acc[yi(g, n, k, oy, ox)] += X[xi(g, n, c, iy, ix)] * W[wi(g, k, c, ky, kx)];
        });
        finish(y, g.t, acc, a, b);
    });
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t hh, const void *alpha, const cudnnFilterDescriptor_t wd,
                                           const void *w, const cudnnTensorDescriptor_t dyd, const void *dy,
                                           const cudnnConvolutionDescriptor_t cd, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *ws, size_t ws_bytes, const void *beta, const cudnnTensorDescriptor_t dxd,
                                           void *dx) {
    const char *fn = "cudnnConvolutionBackwardData";
    cudnnContext *h = use_h(hh, fn);
    geom g = check(fn, use(dxd, fn, "dx descriptor"), use(wd, fn, "w descriptor"), use(cd, fn, "convolution"), use(dyd, fn, "dy descriptor"));
    check_ws(fn, (int)algo, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, ws, ws_bytes);
    int dev = mr_emu::stream_device(h->stream);
    in_dev(fn, "w", w, fbytes(wd), dev);
    in_dev(fn, "dy", dy, tbytes(dyd), dev);
    in_dev(fn, "dx", dx, tbytes(dxd), dev);
    double a = scal(alpha, g.t), b = scal(beta, g.t);
    return queue(h, fn, [=]() {
        std::vector<double> acc((size_t)g.n * g.c * g.h * g.w, 0.0);
        std::vector<double> DY = widen(dy, yi(g, g.n, 0, 0, 0), g.t), W = widen(w, wi(g, g.k, 0, 0, 0), g.t);
        taps(g, [&](int n, int k, int oy, int ox, int c, int ky, int kx, int iy, int ix) {
            acc[xi(g, n, c, iy, ix)] += DY[yi(g, n, k, oy, ox)] * W[wi(g, k, c, ky, kx)];
        });
        finish(dx, g.t, acc, a, b);
    });
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t hh, const void *alpha, const cudnnTensorDescriptor_t xd,
                                             const void *x, const cudnnTensorDescriptor_t dyd, const void *dy,
                                             const cudnnConvolutionDescriptor_t cd, cudnnConvolutionBwdFilterAlgo_t algo,
                                             void *ws, size_t ws_bytes, const void *beta,
                                             const cudnnFilterDescriptor_t dwd, void *dw) {
    const char *fn = "cudnnConvolutionBackwardFilter";
    cudnnContext *h = use_h(hh, fn);
    geom g = check(fn, use(xd, fn, "x descriptor"), use(dwd, fn, "dw descriptor"), use(cd, fn, "convolution"), use(dyd, fn, "dy descriptor"));
    check_ws(fn, (int)algo, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, ws, ws_bytes);
    int dev = mr_emu::stream_device(h->stream);
    in_dev(fn, "x", x, tbytes(xd), dev);
    in_dev(fn, "dy", dy, tbytes(dyd), dev);
    in_dev(fn, "dw", dw, fbytes(dwd), dev);
    double a = scal(alpha, g.t), b = scal(beta, g.t);
    return queue(h, fn, [=]() {
        std::vector<double> acc((size_t)g.k * g.c * g.kh * g.kw, 0.0);
        std::vector<double> X = widen(x, xi(g, g.n, 0, 0, 0), g.t), DY = widen(dy, yi(g, g.n, 0, 0, 0), g.t);
        taps(g, [&](int n, int k, int oy, int ox, int c, int ky, int kx, int iy, int ix) {
            acc[wi(g, k, c, ky, kx)] += X[xi(g, n, c, iy, ix)] * DY[yi(g, n, k, oy, ox)];
        });
        finish(dw, g.t, acc, a, b);
    });
}

cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t hh, const void *alpha, const cudnnTensorDescriptor_t dyd,
                                           const void *dy, const void *beta, const cudnnTensorDescriptor_t dbd, void *db) {
    const char *fn = "cudnnConvolutionBackwardBias";
    cudnnContext *h = use_h(hh, fn);
    cudnnTensorStruct *t = use(dyd, fn, "dy descriptor"), *bt = use(dbd, fn, "db descriptor");
    if (bt->n != 1 || bt->c != t->c || bt->h != 1 || bt->w != 1 || bt->type != t->type)
        dnn_bad(fn, "db is (%d,%d,%d,%d), dy has %d channels: db must be (1,C,1,1) of dy's type", bt->n, bt->c, bt->h, bt->w, t->c);
    int dev = mr_emu::stream_device(h->stream);
    in_dev(fn, "dy", dy, tbytes(t), dev);
    in_dev(fn, "db", db, tbytes(bt), dev);
    double a = scal(alpha, t->type), b = scal(beta, t->type);
    cudnnTensorStruct T = *t;
    return queue(h, fn, [=]() {
        std::vector<double> acc((size_t)T.c, 0.0);
        for (int n = 0; n < T.n; n++)
            for (int c = 0; c < T.c; c++)
                for (int i = 0; i < T.h * T.w; i++) acc[(size_t)c] += ld(dy, ((size_t)n * T.c + c) * T.h * T.w + i, T.type);
        finish(db, T.type, acc, a, b);
    });
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t hh, const void *alpha, const cudnnTensorDescriptor_t ad, const void *A,
                             const void *beta, const cudnnTensorDescriptor_t cdd, void *C) {
    const char *fn = "cudnnAddTensor";
    cudnnContext *h = use_h(hh, fn);
    cudnnTensorStruct *at = use(ad, fn, "A descriptor"), *ct = use(cdd, fn, "C descriptor");
    /* A's dims are C's or 1 (broadcast) */
    if ((at->n != ct->n && at->n != 1) || (at->c != ct->c && at->c != 1) || (at->h != ct->h && at->h != 1) ||
        (at->w != ct->w && at->w != 1) || at->type != ct->type)
        dnn_bad(fn, "A (%d,%d,%d,%d) does not broadcast to C (%d,%d,%d,%d), or their types differ", at->n, at->c, at->h, at->w,
            ct->n, ct->c, ct->h, ct->w);
    int dev = mr_emu::stream_device(h->stream);
    in_dev(fn, "A", A, tbytes(at), dev);
    in_dev(fn, "C", C, tbytes(ct), dev);
    double a = scal(alpha, ct->type), b = scal(beta, ct->type);
    cudnnTensorStruct AT = *at, CT = *ct;
    return queue(h, fn, [=]() {
        for (int n = 0; n < CT.n; n++)
            for (int c = 0; c < CT.c; c++)
                for (int y = 0; y < CT.h; y++)
                    for (int x = 0; x < CT.w; x++) {
                        size_t ci = (((size_t)n * CT.c + c) * CT.h + y) * CT.w + x;
                        size_t ai = (((size_t)(AT.n == 1 ? 0 : n) * AT.c + (AT.c == 1 ? 0 : c)) * AT.h + (AT.h == 1 ? 0 : y)) *
                                        AT.w + (AT.w == 1 ? 0 : x);
                        /* beta == 0: C is not read (it may hold NaN), cuDNN's scaling rule */
                        st(C, ci, CT.type, a * ld(A, ai, AT.type) + (b != 0.0 ? b * ld(C, ci, CT.type) : 0.0));
                    }
    });
}

} // extern "C"
