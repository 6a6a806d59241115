/* The kernel side of mirror's CUDA emulator: force-included (g++ -include) into every .cu file of
 * core/cuda/ after tests/emu/emu_rewrite.c has rewritten its three pieces of CUDA-only syntax, so the
 * same kernels that nvcc compiles run as host C++ on the CPU.
 *
 *   kernel<<<grid, block, smem, stream>>>(args)   ->  launch_at(call kernel, cfg(...)) ^ pack(args)
 *   __shared__ T name[N][M];                      ->  a reference into the block's shared arena
 *   __global__ ... name(...) {                    ->  + MR_EMU_KERNEL_ENTRY(line) (the census)
 *
 * Each block's threads run as fibers (tests/emu/emu_exec.cc). threadIdx/blockIdx/blockDim/gridDim
 * read the running fiber; __syncthreads() and the warp operations suspend it until the operation
 * can complete with the exact CUDA rules (every live thread at the same barrier; every lane of the
 * mask at the same warp operation), and report a misuse with the source file and line. The CUDA
 * headers' own types (dim3, uint3, __half, __nv_bfloat16) are used as they are: in a host build
 * they compile to plain C++ with host conversions. */
#ifndef MR_EMU_CUDA_H
#define MR_EMU_CUDA_H

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <functional>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <tuple>
#include <type_traits>

namespace mr_emu_k {

/* ---- thread geometry ------------------------------------------------------------------------ */
const uint3 &thread_idx(void);
const uint3 &block_idx(void);
const dim3 &block_dim(void);
const dim3 &grid_dim(void);

/* ---- barriers and warp operations (emu_exec.cc) ----------------------------------------------- */
enum warp_kind { W_SHFL_IDX, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_ANY, W_ALL, W_SYNCWARP };
void syncthreads(const char *file, int line);
/* One lane's part of a warp operation: waits until every lane of `mask` has arrived at the same
 * operation, then writes this lane's result (`size` bytes) to `out`. */
void warp_op(warp_kind k, const char *file, int line, unsigned mask, const void *val, int size, int arg, int width,
             void *out);

template <class T> static inline T shfl_(warp_kind k, const char *f, int l, unsigned m, T v, int arg, int w) {
    static_assert(sizeof(T) <= 16, "shuffle of a type wider than 16 bytes");
    T out;
    warp_op(k, f, l, m, &v, (int)sizeof(T), arg, w, &out);
    return out;
}
template <class T> T shfl_sync_(const char *f, int l, unsigned m, T v, int src, int w = 32) {
    return shfl_(W_SHFL_IDX, f, l, m, v, src, w);
}
template <class T> T shfl_up_sync_(const char *f, int l, unsigned m, T v, unsigned d, int w = 32) {
    return shfl_(W_SHFL_UP, f, l, m, v, (int)d, w);
}
template <class T> T shfl_down_sync_(const char *f, int l, unsigned m, T v, unsigned d, int w = 32) {
    return shfl_(W_SHFL_DOWN, f, l, m, v, (int)d, w);
}
template <class T> T shfl_xor_sync_(const char *f, int l, unsigned m, T v, int x, int w = 32) {
    return shfl_(W_SHFL_XOR, f, l, m, v, x, w);
}
static inline unsigned vote_(warp_kind k, const char *f, int l, unsigned m, int pred) {
    int p = pred != 0;
    unsigned out;
    warp_op(k, f, l, m, &p, (int)sizeof p, 0, 32, &out);
    return out;
}
static inline void syncwarp_(const char *f, int l, unsigned m = 0xffffffffu) {
    unsigned out;
    int z = 0;
    warp_op(W_SYNCWARP, f, l, m, &z, (int)sizeof z, 0, 32, &out);
}

/* ---- shared memory -------------------------------------------------------------------------- */
/* The block's copy of the __shared__ variable identified by `key` (one per declaration and
 * template instantiation): carved from the block's arena on the first thread's call, filled with
 * 0xFF bytes (NaN as a float) so a read of what no thread wrote shows. */
void *shared_alloc(const void *key, size_t bytes, size_t align, const char *file, int line);
void *dyn_shared(void);
template <class A, class Tag> A *shared_(Tag, const char *file, int line) {
    static char key;
    return (A *)shared_alloc(&key, sizeof(A), alignof(A) > 16 ? alignof(A) : 16, file, line);
}

/* ---- the kernel census ------------------------------------------------------------------------ */
struct census_site {
    census_site(const char *file, int line, const char *name);
};
void kernel_entry(const char *pretty, const char *file, int line);

/* ---- launches ----------------------------------------------------------------------------------- */
struct cfg {
    const char *file;
    int line;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    cfg(const char *f, int l, dim3 g, dim3 b, size_t sm = 0, cudaStream_t s = 0)
        : file(f), line(l), grid(g), block(b), smem(sm), stream(s) {}
};
/* Validates the geometry (cudaGetLastError reports a bad one, as the runtime does) and enqueues
 * the grid on the stream; `thread_body` runs one thread's kernel function. */
void launch(const cfg &c, std::function<void()> thread_body);
[[noreturn]] void null_arg_misuse(long v);

/* launch_at(call, cfg) ^ pack(args): `call` is a generic lambda that calls the kernel with the
 * argument values, so a kernel template's arguments are deduced from them as nvcc does. The
 * values are copied once at launch (kernel parameters are passed by value) and every thread
 * calls the kernel with its own copies. */
template <class L> struct launcher {
    L call;
    cfg c;
};
template <class L> launcher<L> launch_at(L call, const cfg &c) { return launcher<L>{call, c}; }
/* g++'s NULL is a long (__null) and would lose its null-pointer-ness in a tuple: a long argument
 * is kept in a wrapper that converts back to long (and so to any arithmetic type) or, when it is
 * zero, to a null pointer of any type. */
struct long_arg {
    long v;
    operator long() const { return v; }
    template <class T> operator T *() const {
        if (v != 0) null_arg_misuse(v);
        return nullptr;
    }
};
template <class A> struct arg_t { typedef typename std::decay<A>::type T; };
template <> struct arg_t<long> { typedef long_arg T; };
template <> struct arg_t<long &> { typedef long_arg T; };
template <> struct arg_t<const long &> { typedef long_arg T; };
template <class A> typename arg_t<A>::T pass_(A &&a) {
    return typename arg_t<A>::T{std::forward<A>(a)};
}
template <class... A> std::tuple<typename arg_t<A>::T...> pack(A &&...a) {
    return std::tuple<typename arg_t<A>::T...>(pass_(std::forward<A>(a))...);
}
template <class L, class... A> void operator^(const launcher<L> &l, std::tuple<A...> args) {
    L call = l.call;
    launch(l.c, [call, args]() { std::apply(call, args); });
}

/* ---- atomics (blocks of one grid run one at a time on one host thread; __atomic for the rest) -- */
template <class T> static inline T atomic_add_int_(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
template <class T> static inline T atomic_add_fp_(T *p, T v) {
    T old, nv;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
        nv = old + v;
    } while (!__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}

} // namespace mr_emu_k

/* ---- the CUDA names kernels use (not in the emulator's own files, which define MR_EMU_RUNTIME) -- */
#ifndef MR_EMU_RUNTIME
#define __launch_bounds__(...)
#define threadIdx (::mr_emu_k::thread_idx())
#define blockIdx (::mr_emu_k::block_idx())
#define blockDim (::mr_emu_k::block_dim())
#define gridDim (::mr_emu_k::grid_dim())
static constexpr int warpSize = 32; /* a variable, as on the device: prop.warpSize still works */
#define __syncthreads() ::mr_emu_k::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::mr_emu_k::syncwarp_(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...) ::mr_emu_k::shfl_sync_(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::mr_emu_k::shfl_up_sync_(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::mr_emu_k::shfl_down_sync_(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) ::mr_emu_k::shfl_xor_sync_(__FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(m, p) ::mr_emu_k::vote_(::mr_emu_k::W_BALLOT, __FILE__, __LINE__, (m), (p))
#define __any_sync(m, p) ((int)::mr_emu_k::vote_(::mr_emu_k::W_ANY, __FILE__, __LINE__, (m), (p)))
#define __all_sync(m, p) ((int)::mr_emu_k::vote_(::mr_emu_k::W_ALL, __FILE__, __LINE__, (m), (p)))
#define MR_EMU_KERNEL_ENTRY(line)                                                                 \
    static ::mr_emu_k::census_site mr_emu_site_(__FILE__, line, __PRETTY_FUNCTION__);             \
    ::mr_emu_k::kernel_entry(__PRETTY_FUNCTION__, __FILE__, line)
#define MR_EMU_SHARED(A, file, line) (*::mr_emu_k::shared_<A>([] {}, file, line))

static inline int atomicAdd(int *p, int v) { return ::mr_emu_k::atomic_add_int_(p, v); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return ::mr_emu_k::atomic_add_int_(p, v); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return ::mr_emu_k::atomic_add_int_(p, v);
}
static inline float atomicAdd(float *p, float v) { return ::mr_emu_k::atomic_add_fp_(p, v); }
static inline double atomicAdd(double *p, double v) { return ::mr_emu_k::atomic_add_fp_(p, v); }

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float f) { int x; memcpy(&x, &f, 4); return x; }
static inline unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
static inline long long __double_as_longlong(double d) { long long x; memcpy(&x, &d, 8); return x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fdividef(float a, float b) { return a / b; }
template <class T> static inline T __ldg(const T *p) { return *p; }
/* CUDA's device min/max overloads for integers and floats */
using std::max;
using std::min;
#endif /* MR_EMU_RUNTIME */

#endif
