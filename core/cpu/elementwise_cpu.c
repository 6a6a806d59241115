/* Elementwise ops on the CPU: f32 fast paths (f64 runs the reference).
 *
 * Unary ops are flat vectorised loops over the per-element math of core/math/unary_math.h.
 *
 * Binary ops and their backward share one plan. The broadcast is described by the strides of
 * g (dy, contiguous), a and b over the output shape (0 on broadcast dims); adjacent dims are
 * merged when every operand is contiguous across them, so a same-shape op or one with a scalar
 * becomes one flat dim and a bias add becomes (rows, cols) with b's row stride 0. The target
 * (y, da or db) splits the merged dims into kept ones (target stride != 0) and reduced ones
 * (the backward's sum over broadcast dims). Work is cut into tiles of (kept index, column range):
 * each tile is owned by one thread and sums its reduced dims in a fixed order, so the result
 * does not depend on the thread count and no accumulation races. */
#include "core/ops_impl.h"
#include "core/math/unary_math.h"
#include "core/cpu/cpu_impl.h"

#include <math.h>
#include <string.h>

#include "core/cpu/vec_math_impl.h"

/* Elements per block of the unary loops. Blocks, not threads, fix which elements take the
 * vector body and which the scalar tail, so results do not depend on the thread count. */
#define EW_BLOCK 4096

/* Below this many elements of work a loop runs on the calling thread (thread start-up costs more). */
#define EW_PAR_MIN 32768

/* ---- unary ----------------------------------------------------------------------------------- */

/* Each unary op's block loop is compiled twice: for the baseline ISA and for AVX-512, where
 * libmvec's 16-wide expf/tanhf/logf run (GELU 2.8x faster). The AVX-512 copy is picked at run
 * time from CPUID. Both process fixed blocks, so the bits do not depend on the thread count
 * (they may differ in the last ulp between a machine with AVX-512 and one without). */
typedef void (*unary_block_fn)(const float *restrict X, const float *restrict YF, const float *restrict G,
                               float *restrict Y, int64_t b0, int64_t b1, float s);

#define DEFINE_UNARY_BLOCK(NAME, EXPR)                                                              \
    static void NAME##_def(const float *restrict X, const float *restrict YF, const float *restrict G, \
                           float *restrict Y, int64_t b0, int64_t b1, float s) {                   \
        (void)X, (void)YF, (void)G, (void)s;                                                        \
        _Pragma("omp simd") for (int64_t i = b0; i < b1; i++) Y[i] = (EXPR);                        \
    }                                                                                               \
    __attribute__((target("avx512f"))) static void NAME##_512(                                      \
        const float *restrict X, const float *restrict YF, const float *restrict G, float *restrict Y, \
        int64_t b0, int64_t b1, float s) {                                                          \
        (void)X, (void)YF, (void)G, (void)s;                                                        \
        _Pragma("omp simd") for (int64_t i = b0; i < b1; i++) Y[i] = (EXPR);                        \
    }

DEFINE_UNARY_BLOCK(relu, mr_relu_f32(X[i]))
DEFINE_UNARY_BLOCK(gelu, mr_gelu_f32(X[i]))
DEFINE_UNARY_BLOCK(tanh, mr_tanh_f32(X[i]))
DEFINE_UNARY_BLOCK(sigmoid, mr_sigmoid_f32(X[i]))
DEFINE_UNARY_BLOCK(exp, mr_exp_f32(X[i]))
DEFINE_UNARY_BLOCK(log, mr_log_f32(X[i]))
DEFINE_UNARY_BLOCK(sqrt, mr_sqrt_f32(X[i]))
DEFINE_UNARY_BLOCK(scale, s * X[i])
DEFINE_UNARY_BLOCK(relu_bwd, mr_relu_grad_f32(X[i], G[i]))
DEFINE_UNARY_BLOCK(gelu_bwd, mr_gelu_grad_f32(X[i], G[i]))
DEFINE_UNARY_BLOCK(tanh_bwd, mr_tanh_grad_f32(YF[i], G[i]))
DEFINE_UNARY_BLOCK(sigmoid_bwd, mr_sigmoid_grad_f32(YF[i], G[i]))
DEFINE_UNARY_BLOCK(exp_bwd, mr_exp_grad_f32(YF[i], G[i]))
DEFINE_UNARY_BLOCK(log_bwd, mr_log_grad_f32(X[i], G[i]))
DEFINE_UNARY_BLOCK(sqrt_bwd, mr_sqrt_grad_f32(YF[i], G[i]))
DEFINE_UNARY_BLOCK(scale_bwd, s * G[i])

#define PICK(NAME) (mr_cpu_caps_get()->avx512f ? NAME##_512 : NAME##_def)

/* Runs fn over [0, n) in EW_BLOCK blocks shared out by OpenMP. */
static void unary_run(unary_block_fn fn, const float *X, const float *YF, const float *G, float *Y, int64_t n,
                      float s) {
#pragma omp parallel for schedule(static) if (n > EW_PAR_MIN)
    for (int64_t b0 = 0; b0 < n; b0 += EW_BLOCK) fn(X, YF, G, Y, b0, n - b0 < EW_BLOCK ? n : b0 + EW_BLOCK, s);
}

static mr_status f32_only(const mr_op_args *a, mr_dtype dt) {
    return mr_op_error(a, "the CPU kernel takes f32 or f64, got %s", mr_dtype_name(dt));
}

/* x (n) -> y (n) */
mr_status mr_unary_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_unary_fwd_ref(a);
    if (a->in[0].dtype != MR_F32) return f32_only(a, a->in[0].dtype);
    unary_block_fn fn;
    switch (a->op) {
    case MR_OP_RELU: fn = PICK(relu); break;
    case MR_OP_GELU: fn = PICK(gelu); break;
    case MR_OP_TANH: fn = PICK(tanh); break;
    case MR_OP_SIGMOID: fn = PICK(sigmoid); break;
    case MR_OP_EXP: fn = PICK(exp); break;
    case MR_OP_LOG: fn = PICK(log); break;
    case MR_OP_SQRT: fn = PICK(sqrt); break;
    default: fn = PICK(scale); break;
    }
    unary_run(fn, a->in[0].data, NULL, NULL, a->out[0].data, mr_shape_numel(&a->in[0].shape), (float)a->p.scale);
    return MR_OK;
}

/* x, y, dy (n) -> dx (n); x or y may be absent when the op does not read it */
mr_status mr_unary_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_unary_bwd_ref(a);
    if (a->in[2].dtype != MR_F32) return f32_only(a, a->in[2].dtype);
    unary_block_fn fn;
    switch (a->op) {
    case MR_OP_RELU_BWD: fn = PICK(relu_bwd); break;
    case MR_OP_GELU_BWD: fn = PICK(gelu_bwd); break;
    case MR_OP_TANH_BWD: fn = PICK(tanh_bwd); break;
    case MR_OP_SIGMOID_BWD: fn = PICK(sigmoid_bwd); break;
    case MR_OP_EXP_BWD: fn = PICK(exp_bwd); break;
    case MR_OP_LOG_BWD: fn = PICK(log_bwd); break;
    case MR_OP_SQRT_BWD: fn = PICK(sqrt_bwd); break;
    default: fn = PICK(scale_bwd); break;
    }
    unary_run(fn, a->in[0].data, a->in[1].data, a->in[2].data, a->out[0].data, mr_shape_numel(&a->in[2].shape),
              (float)a->p.scale);
    return MR_OK;
}

/* ---- the binary plan --------------------------------------------------------------------------- */

enum { OP_G = 0, OP_A = 1, OP_B = 2, OP_T = 3 };

typedef struct ew_plan {
    int64_t len;                       /* innermost merged dim */
    int64_t in_a, in_b;                /* innermost strides of a and b: 0 or 1 (g's is 1) */
    int inner_kept;                    /* innermost dim kept in the target (else summed) */
    int nk, nr;                        /* outer kept / reduced dims */
    int64_t kdim[MR_MAX_DIMS], kst[4][MR_MAX_DIMS];
    int64_t rdim[MR_MAX_DIMS], rst[3][MR_MAX_DIMS];
    int64_t nq, ns;                    /* products of kept / reduced outer dims */
    int64_t tile;                      /* columns per tile when inner_kept */
} ew_plan;

static void aligned_strides(const mr_shape *s, int nd, int64_t st[MR_MAX_DIMS]) {
    int64_t own[MR_MAX_DIMS];
    mr_shape_strides(s, own);
    int off = nd - s->ndim;
    for (int i = 0; i < nd; i++) {
        int j = i - off;
        st[i] = (j >= 0 && s->dim[j] != 1) ? own[j] : 0;
    }
}

/* Builds the plan over output shape o (sa, sb: a's and b's shapes); the target is operand
 * `target` (OP_G for the forward output, OP_A or OP_B for a gradient). */
static void plan_make(const mr_shape *o, const mr_shape *sa, const mr_shape *sb, int target, ew_plan *p) {
    int64_t st[3][MR_MAX_DIMS], dim[MR_MAX_DIMS], m[3][MR_MAX_DIMS];
    int nd = o->ndim, n = 0;
    mr_shape_strides(o, st[OP_G]);
    aligned_strides(sa, nd, st[OP_A]);
    aligned_strides(sb, nd, st[OP_B]);
    for (int i = 0; i < nd; i++) {
        if (o->dim[i] == 1) continue; /* size-1 dims carry no index */
        int merge = n > 0;
        for (int k = 0; k < 3 && merge; k++) merge = m[k][n - 1] == st[k][i] * o->dim[i];
        if (merge) {
            dim[n - 1] *= o->dim[i];
            for (int k = 0; k < 3; k++) m[k][n - 1] = st[k][i];
        } else {
            dim[n] = o->dim[i];
            for (int k = 0; k < 3; k++) m[k][n] = st[k][i];
            n++;
        }
    }
    memset(p, 0, sizeof *p);
    if (n == 0) { /* one element */
        dim[0] = 1;
        for (int k = 0; k < 3; k++) m[k][0] = 1;
        n = 1;
    }
    int last = n - 1;
    p->len = dim[last];
    p->in_a = m[OP_A][last] ? 1 : 0;
    p->in_b = m[OP_B][last] ? 1 : 0;
    p->inner_kept = m[target][last] != 0;
    p->nq = p->ns = 1;
    for (int i = 0; i < last; i++) {
        if (m[target][i] != 0) {
            p->kdim[p->nk] = dim[i];
            for (int k = 0; k < 3; k++) p->kst[k][p->nk] = m[k][i];
            p->nk++;
            p->nq *= dim[i];
        } else {
            p->rdim[p->nr] = dim[i];
            for (int k = 0; k < 3; k++) p->rst[k][p->nr] = m[k][i];
            p->nr++;
            p->ns *= dim[i];
        }
    }
    /* The target's own offsets: the forward output is contiguous in the output index; a
     * gradient target is contiguous in its kept index, which a's or b's strides already give. */
    for (int j = 0; j < p->nk; j++) p->kst[OP_T][j] = p->kst[target][j];
    /* wide tiles for plain elementwise work, narrow ones (that stay in L1 while rows are summed
     * into them) for reductions; the tile size changes the work split, never the sum order */
    p->tile = p->ns > 1 ? 256 : 2048;
}

/* Offsets of kept index q in g, a, b, t. */
static inline void plan_base(const ew_plan *p, int64_t q, int64_t off[4]) {
    off[0] = off[1] = off[2] = off[3] = 0;
    for (int d = p->nk - 1; d >= 0; d--) {
        int64_t c = q % p->kdim[d];
        q /= p->kdim[d];
        for (int k = 0; k < 4; k++) off[k] += c * p->kst[k][d];
    }
}

/* Offsets of reduced index s in g, a, b. */
static inline void plan_rel(const ew_plan *p, int64_t s, int64_t off[3]) {
    off[0] = off[1] = off[2] = 0;
    for (int d = p->nr - 1; d >= 0; d--) {
        int64_t c = s % p->rdim[d];
        s /= p->rdim[d];
        for (int k = 0; k < 3; k++) off[k] += c * p->rst[k][d];
    }
}

/* One inner loop of `cnt` columns, specialised on a's and b's inner strides so each variant
 * vectorises; STMT uses g, x, y (dy, a, b at column j) and j. */
#define EW_INNER(STMT)                                                                              \
    do {                                                                                            \
        if (sa && sb) {                                                                             \
            _Pragma("omp simd") for (int64_t j = 0; j < cnt; j++) {                                 \
                float g = has_g ? pg[j] : 0.0f, x = pa[j], y = pb[j];                               \
                (void)g; (void)x; (void)y;                                                          \
                STMT;                                                                               \
            }                                                                                       \
        } else if (sa) {                                                                            \
            const float y = pb[0];                                                                  \
            _Pragma("omp simd") for (int64_t j = 0; j < cnt; j++) {                                 \
                float g = has_g ? pg[j] : 0.0f, x = pa[j];                                          \
                (void)g; (void)x; (void)y;                                                          \
                STMT;                                                                               \
            }                                                                                       \
        } else if (sb) {                                                                            \
            const float x = pa[0];                                                                  \
            _Pragma("omp simd") for (int64_t j = 0; j < cnt; j++) {                                 \
                float g = has_g ? pg[j] : 0.0f, y = pb[j];                                          \
                (void)g; (void)x; (void)y;                                                          \
                STMT;                                                                               \
            }                                                                                       \
        } else {                                                                                    \
            const float x = pa[0], y = pb[0];                                                       \
            _Pragma("omp simd") for (int64_t j = 0; j < cnt; j++) {                                 \
                float g = has_g ? pg[j] : 0.0f;                                                     \
                (void)g; (void)x; (void)y;                                                          \
                STMT;                                                                               \
            }                                                                                       \
        }                                                                                           \
    } while (0)

/* Defines NAME(plan, G, A, B, T): T[kept] = sum over reduced dims of EXPR(g, x, y). Without
 * reduced dims this is the plain elementwise loop. HAS_G 0: the forward, G is NULL and unread. */
#define EW_KERNEL(NAME, HAS_G, EXPR)                                                                \
    static void NAME(const ew_plan *p, const float *G, const float *A, const float *B, float *T) {  \
        const int64_t sa = p->in_a, sb = p->in_b;                                                   \
        const int has_g = (HAS_G);                                                                  \
        const int64_t ntile = p->inner_kept ? (p->len + p->tile - 1) / p->tile : 1;                 \
        const int64_t work = p->nq * p->ns * p->len;                                                \
        _Pragma("omp parallel for schedule(static) if (work > EW_PAR_MIN)")                         \
        for (int64_t t = 0; t < p->nq * ntile; t++) {                                               \
            int64_t q = t / ntile, c0 = (t % ntile) * p->tile, base[4], rel[3];                     \
            plan_base(p, q, base);                                                                  \
            if (p->inner_kept) {                                                                    \
                const int64_t cnt = p->len - c0 < p->tile ? p->len - c0 : p->tile;                  \
                float *restrict pt = T + base[3] + c0;                                              \
                for (int64_t s = 0; s < p->ns; s++) {                                               \
                    plan_rel(p, s, rel);                                                            \
                    const float *restrict pg = has_g ? G + base[0] + rel[0] + c0 : G;               \
                    const float *restrict pa = A + base[1] + rel[1] + c0 * sa;                      \
                    const float *restrict pb = B + base[2] + rel[2] + c0 * sb;                      \
                    if (s == 0)                                                                     \
                        EW_INNER(pt[j] = (EXPR));                                                   \
                    else                                                                            \
                        EW_INNER(pt[j] += (EXPR));                                                  \
                }                                                                                   \
            } else {                                                                                \
                const int64_t cnt = p->len;                                                         \
                float acc = 0.0f;                                                                   \
                for (int64_t s = 0; s < p->ns; s++) {                                               \
                    plan_rel(p, s, rel);                                                            \
                    const float *restrict pg = has_g ? G + base[0] + rel[0] : G;                    \
                    const float *restrict pa = A + base[1] + rel[1];                                \
                    const float *restrict pb = B + base[2] + rel[2];                                \
                    float part = 0.0f;                                                              \
                    EW_INNER_SUM(EXPR);                                                             \
                    acc += part;                                                                    \
                }                                                                                   \
                T[base[3]] = acc;                                                                   \
            }                                                                                       \
        }                                                                                           \
    }

/* EW_INNER with a vectorised sum into `part` (a name: _Pragma cannot take a macro argument). */
#define EW_INNER_SUM(EXPR)                                                                          \
    do {                                                                                            \
        if (sa && sb) {                                                                             \
            _Pragma("omp simd reduction(+ : part)") for (int64_t j = 0; j < cnt; j++) {             \
                float g = has_g ? pg[j] : 0.0f, x = pa[j], y = pb[j];                               \
                (void)g; (void)x; (void)y;                                                          \
                part += (EXPR);                                                                     \
            }                                                                                       \
        } else if (sa) {                                                                            \
            const float y = pb[0];                                                                  \
            _Pragma("omp simd reduction(+ : part)") for (int64_t j = 0; j < cnt; j++) {             \
                float g = has_g ? pg[j] : 0.0f, x = pa[j];                                          \
                (void)g; (void)x; (void)y;                                                          \
                part += (EXPR);                                                                     \
            }                                                                                       \
        } else if (sb) {                                                                            \
            const float x = pa[0];                                                                  \
            _Pragma("omp simd reduction(+ : part)") for (int64_t j = 0; j < cnt; j++) {             \
                float g = has_g ? pg[j] : 0.0f, y = pb[j];                                          \
                (void)g; (void)x; (void)y;                                                          \
                part += (EXPR);                                                                     \
            }                                                                                       \
        } else {                                                                                    \
            const float x = pa[0], y = pb[0];                                                       \
            _Pragma("omp simd reduction(+ : part)") for (int64_t j = 0; j < cnt; j++) {             \
                float g = has_g ? pg[j] : 0.0f;                                                     \
                (void)g; (void)x; (void)y;                                                          \
                part += (EXPR);                                                                     \
            }                                                                                       \
        }                                                                                           \
    } while (0)

EW_KERNEL(ew_add, 0, x + y)
EW_KERNEL(ew_sub, 0, x - y)
EW_KERNEL(ew_mul, 0, x * y)
EW_KERNEL(ew_div, 0, x / y)
EW_KERNEL(ew_grad_id, 1, g)
EW_KERNEL(ew_grad_neg, 1, -g)
EW_KERNEL(ew_grad_mul_a, 1, g * y)
EW_KERNEL(ew_grad_mul_b, 1, g * x)
EW_KERNEL(ew_grad_div_a, 1, g / y)
EW_KERNEL(ew_grad_div_b, 1, -g * x / (y * y))

/* a (broadcastable), b (broadcastable) -> y (broadcast shape) */
mr_status mr_binary_fwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_binary_fwd_ref(a);
    if (a->in[0].dtype != MR_F32) return f32_only(a, a->in[0].dtype);
    const mr_shape *o = &a->out[0].shape;
    if (mr_shape_numel(o) == 0) return MR_OK;
    ew_plan p;
    plan_make(o, &a->in[0].shape, &a->in[1].shape, OP_G, &p);
    const float *A = a->in[0].data, *B = a->in[1].data;
    float *Y = a->out[0].data;
    switch (a->op) {
    case MR_OP_ADD: ew_add(&p, NULL, A, B, Y); break;
    case MR_OP_SUB: ew_sub(&p, NULL, A, B, Y); break;
    case MR_OP_MUL: ew_mul(&p, NULL, A, B, Y); break;
    default: ew_div(&p, NULL, A, B, Y); break;
    }
    return MR_OK;
}

/* a, b (optional for ADD/SUB), dy (broadcast shape) -> da (a's shape), db (b's shape), each optional */
mr_status mr_binary_bwd_cpu(const mr_op_args *a) {
    if (mr_op_is_f64(a)) return mr_binary_bwd_ref(a);
    if (a->in[2].dtype != MR_F32) return f32_only(a, a->in[2].dtype);
    const mr_shape *o = &a->in[2].shape, *sa = &a->in[0].shape, *sb = &a->in[1].shape;
    const float *G = a->in[2].data;
    /* ADD/SUB never read a or b; dy stands in so that no offset is applied to a null pointer
     * (a's and b's offsets never exceed dy's size) */
    const float *A = a->in[0].data ? a->in[0].data : G, *B = a->in[1].data ? a->in[1].data : G;
    float *DA = a->out[0].data, *DB = a->out[1].data;
    if (mr_shape_numel(o) == 0) { /* nothing is summed: the gradients are zero */
        if (DA) memset(DA, 0, sizeof(float) * (size_t)mr_shape_numel(sa));
        if (DB) memset(DB, 0, sizeof(float) * (size_t)mr_shape_numel(sb));
        return MR_OK;
    }
    ew_plan p;
    if (DA) {
        plan_make(o, sa, sb, OP_A, &p);
        switch (a->op) {
        case MR_OP_ADD_BWD: case MR_OP_SUB_BWD: ew_grad_id(&p, G, A, B, DA); break;
        case MR_OP_MUL_BWD: ew_grad_mul_a(&p, G, A, B, DA); break;
        default: ew_grad_div_a(&p, G, A, B, DA); break;
        }
    }
    if (DB) {
        plan_make(o, sa, sb, OP_B, &p);
        switch (a->op) {
        case MR_OP_ADD_BWD: ew_grad_id(&p, G, A, B, DB); break;
        case MR_OP_SUB_BWD: ew_grad_neg(&p, G, A, B, DB); break;
        case MR_OP_MUL_BWD: ew_grad_mul_b(&p, G, A, B, DB); break;
        default: ew_grad_div_b(&p, G, A, B, DB); break;
        }
    }
    return MR_OK;
}
