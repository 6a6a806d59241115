/* The parameter registry and the nn layers (see nn.h). */
#include "autodiff/nn.h"
#include "autodiff/graph_impl.h"
#include "core/log.h"
#include "core/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct param_entry {
    char name[MR_NAME_MAX];
    mr_shape shape;
    mr_init_kind init;
    double arg;
    int64_t offset, numel;
} param_entry;

struct mr_params {
    param_entry *e;
    int32_t n, cap;
    float *data, *grad;
    int64_t buf_numel;
    mr_params *bufs; /* the buffers' registry (NULL inside it) */
};

mr_status mr_params_new(mr_params **out) {
    mr_params *ps = calloc(1, sizeof *ps);
    if (ps) ps->bufs = calloc(1, sizeof *ps->bufs);
    if (!ps || !ps->bufs) {
        free(ps);
        *out = NULL;
        return mr_set_error(MR_ERR_NOMEM, "params: out of memory");
    }
    *out = ps;
    return MR_OK;
}

void mr_params_free(mr_params *ps) {
    if (!ps) return;
    mr_params_free(ps->bufs);
    free(ps->e);
    free(ps->data);
    free(ps->grad);
    free(ps);
}

mr_params *mr_params_bufs(const mr_params *ps) { return ps->bufs; }

int32_t mr_params_find(const mr_params *ps, const char *name) {
    for (int32_t i = 0; i < ps->n; i++)
        if (!strcmp(ps->e[i].name, name)) return i;
    return -1;
}

mr_status mr_params_add(mr_params *ps, const char *name, mr_shape shape, mr_init_kind init, double arg,
                        int32_t *index) {
    if (ps->data) return mr_set_error(MR_ERR_INVALID, "params: cannot add '%s' after allocation", name);
    if (!name || !*name || strlen(name) >= MR_NAME_MAX)
        return mr_set_error(MR_ERR_INVALID, "params: a name needs 1 to %d characters", MR_NAME_MAX - 1);
    if (mr_params_find(ps, name) >= 0) return mr_set_error(MR_ERR_INVALID, "params: '%s' is registered twice", name);
    for (int i = 0; i < shape.ndim; i++)
        if (shape.dim[i] < 0) return mr_set_error(MR_ERR_INVALID, "params: '%s' has a negative dim", name);
    if (ps->n == ps->cap) {
        int32_t cap = ps->cap ? ps->cap * 2 : 32;
        param_entry *e = realloc(ps->e, (size_t)cap * sizeof *e);
        if (!e) return mr_set_error(MR_ERR_NOMEM, "params: out of memory");
        ps->e = e;
        ps->cap = cap;
    }
    param_entry *p = &ps->e[ps->n];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->shape = shape;
    p->init = init;
    p->arg = arg;
    p->numel = mr_shape_numel(&shape);
    p->offset = ps->buf_numel;
    ps->buf_numel += (p->numel + 15) / 16 * 16; /* 64-byte aligned starts */
    if (index) *index = ps->n;
    ps->n++;
    return MR_OK;
}

mr_status mr_params_alloc(mr_params *ps) {
    if (ps->data) return MR_OK;
    if (ps->bufs) {
        mr_status st = mr_params_alloc(ps->bufs);
        if (st != MR_OK) return st;
    }
    size_t bytes = (size_t)(ps->buf_numel ? ps->buf_numel : 16) * sizeof(float);
    ps->data = aligned_alloc(64, bytes);
    ps->grad = aligned_alloc(64, bytes);
    if (!ps->data || !ps->grad) {
        free(ps->data);
        free(ps->grad);
        ps->data = ps->grad = NULL;
        return mr_set_error(MR_ERR_NOMEM, "params: out of memory for %zu bytes of parameters", bytes);
    }
    memset(ps->data, 0, bytes);
    memset(ps->grad, 0, bytes);
    return MR_OK;
}

int mr_params_allocated(const mr_params *ps) { return ps->data != NULL; }

mr_status mr_params_init(mr_params *ps, uint64_t seed) {
    if (!ps->data) return mr_set_error(MR_ERR_INVALID, "params: mr_params_init before mr_params_alloc");
    if (ps->bufs) {
        mr_status st = mr_params_init(ps->bufs, seed);
        if (st != MR_OK) return st;
    }
    for (int32_t i = 0; i < ps->n; i++) {
        param_entry *p = &ps->e[i];
        float *d = ps->data + p->offset;
        mr_rng rng = mr_rng_init(seed);
        rng.offset = (uint64_t)i << 40;
        mr_status st = MR_OK;
        switch (p->init) {
        case MR_INIT_ZEROS:
            memset(d, 0, (size_t)p->numel * sizeof *d);
            break;
        case MR_INIT_ONES:
            for (int64_t j = 0; j < p->numel; j++) d[j] = 1.0f;
            break;
        case MR_INIT_UNIFORM:
            st = mr_rng_uniform(&rng, d, p->numel, (float)-p->arg, (float)p->arg);
            break;
        case MR_INIT_NORMAL:
            st = mr_rng_normal(&rng, d, p->numel, 0.0f, (float)p->arg);
            break;
        case MR_INIT_FAN_IN: {
            float b = p->arg > 0 ? (float)(1.0 / sqrt(p->arg)) : 0.0f;
            st = mr_rng_uniform(&rng, d, p->numel, -b, b);
            break;
        }
        }
        if (st != MR_OK) return st;
    }
    return MR_OK;
}

int32_t mr_params_count(const mr_params *ps) { return ps->n; }
const char *mr_params_name(const mr_params *ps, int32_t i) { return ps->e[i].name; }
mr_shape mr_params_shape(const mr_params *ps, int32_t i) { return ps->e[i].shape; }
int64_t mr_params_numel(const mr_params *ps, int32_t i) { return ps->e[i].numel; }
int64_t mr_params_offset(const mr_params *ps, int32_t i) { return ps->e[i].offset; }
float *mr_params_data(const mr_params *ps, int32_t i) { return ps->data ? ps->data + ps->e[i].offset : NULL; }
float *mr_params_grad(const mr_params *ps, int32_t i) { return ps->grad ? ps->grad + ps->e[i].offset : NULL; }
float *mr_params_buffer(const mr_params *ps) { return ps->data; }
float *mr_params_grad_buffer(const mr_params *ps) { return ps->grad; }
int64_t mr_params_buffer_numel(const mr_params *ps) { return ps->buf_numel; }

int64_t mr_params_total(const mr_params *ps) {
    int64_t t = 0;
    for (int32_t i = 0; i < ps->n; i++) t += ps->e[i].numel;
    return t;
}

/* ---- layers ----------------------------------------------------------------------------------- */

mr_val mr_nn_param(mr_nn *nn, const char *name, mr_shape shape, mr_init_kind init, double arg) {
    mr_graph *g = nn->g;
    if (g->err != MR_OK) return MR_VAL_NONE;
    char full[MR_NAME_MAX * 2];
    snprintf(full, sizeof full, "%s%s", nn->prefix, name);
    if (strlen(full) >= MR_NAME_MAX) {
        mr_graph_fail(g, MR_ERR_INVALID, "nn: parameter name '%s' is too long", full);
        return MR_VAL_NONE;
    }
    int32_t i = mr_params_find(nn->ps, full);
    if (i < 0) {
        if (mr_params_add(nn->ps, full, shape, init, arg, &i) != MR_OK) {
            mr_graph_fail(g, MR_ERR_INVALID, "nn: %s", mr_last_error());
            return MR_VAL_NONE;
        }
    } else {
        mr_shape have = mr_params_shape(nn->ps, i);
        if (!mr_shape_eq(&have, &shape)) {
            char b1[128], b2[128];
            mr_graph_fail(g, MR_ERR_INVALID, "nn: parameter '%s' is %s here but %s in the model", full,
                          mr_shape_str(&shape, b1, 128), mr_shape_str(&have, b2, 128));
            return MR_VAL_NONE;
        }
    }
    mr_val v = mr_graph_find(g, full);
    if (v.id) {
        if (mr_graph_kind(g, v) != MR_VAL_PARAM) {
            mr_graph_fail(g, MR_ERR_INVALID, "nn: '%s' names a graph input, not a parameter", full);
            return MR_VAL_NONE;
        }
        return v;
    }
    return mr_graph_param(g, full, nn->dtype, shape);
}

mr_val mr_nn_buffer(mr_nn *nn, const char *name, mr_shape shape, mr_init_kind init) {
    mr_graph *g = nn->g;
    if (g->err != MR_OK) return MR_VAL_NONE;
    char full[MR_NAME_MAX * 2];
    snprintf(full, sizeof full, "%s%s", nn->prefix, name);
    if (strlen(full) >= MR_NAME_MAX) {
        mr_graph_fail(g, MR_ERR_INVALID, "nn: buffer name '%s' is too long", full);
        return MR_VAL_NONE;
    }
    mr_params *bufs = mr_params_bufs(nn->ps);
    if (mr_params_find(nn->ps, full) >= 0) {
        mr_graph_fail(g, MR_ERR_INVALID, "nn: '%s' names a parameter, not a buffer", full);
        return MR_VAL_NONE;
    }
    int32_t i = mr_params_find(bufs, full);
    if (i < 0) {
        if (mr_params_add(bufs, full, shape, init, 0, &i) != MR_OK) {
            mr_graph_fail(g, MR_ERR_INVALID, "nn: %s", mr_last_error());
            return MR_VAL_NONE;
        }
    } else {
        mr_shape have = mr_params_shape(bufs, i);
        if (!mr_shape_eq(&have, &shape)) {
            char b1[128], b2[128];
            mr_graph_fail(g, MR_ERR_INVALID, "nn: buffer '%s' is %s here but %s in the model", full,
                          mr_shape_str(&shape, b1, 128), mr_shape_str(&have, b2, 128));
            return MR_VAL_NONE;
        }
    }
    mr_val v = mr_graph_find(g, full);
    if (v.id) {
        if (mr_graph_kind(g, v) != MR_VAL_INPUT) {
            mr_graph_fail(g, MR_ERR_INVALID, "nn: '%s' names a parameter, not a buffer", full);
            return MR_VAL_NONE;
        }
        return v;
    }
    return mr_graph_input(g, full, nn->dtype, shape);
}

void mr_nn_buffer_update(mr_nn *nn, mr_val buf, mr_val value) {
    mr_graph *g = nn->g;
    if (g->err != MR_OK) return;
    if (nn->n_updates == MR_NN_MAX_UPDATES) {
        mr_graph_fail(g, MR_ERR_INVALID, "nn: more than %d buffer updates in one graph", MR_NN_MAX_UPDATES);
        return;
    }
    mr_shape sb = mr_graph_shape(g, buf), sv = mr_graph_shape(g, value);
    if (mr_graph_kind(g, buf) != MR_VAL_INPUT || mr_graph_kind(g, value) != MR_VAL_NODE || !mr_shape_eq(&sb, &sv) ||
        mr_graph_dtype(g, value) != mr_graph_dtype(g, buf)) {
        mr_graph_fail(g, MR_ERR_INVALID, "nn: the update of buffer '%s' must be a node output of its dtype and shape",
                      mr_graph_name(g, buf));
        return;
    }
    for (int i = 0; i < nn->n_updates; i++)
        if (nn->upd_buf[i].id == buf.id) {
            mr_graph_fail(g, MR_ERR_INVALID, "nn: buffer '%s' is updated twice in one graph (a layer used twice?)",
                          mr_graph_name(g, buf));
            return;
        }
    nn->upd_buf[nn->n_updates] = buf;
    nn->upd_val[nn->n_updates++] = value;
}

static int64_t last_dim(const mr_graph *g, mr_val x) {
    mr_shape s = mr_graph_shape(g, x);
    return s.ndim ? s.dim[s.ndim - 1] : 1;
}

/* y = gelu?(x W^T + b) as one fused GEMM node (bias and GELU in its epilogue). */
static mr_val linear(mr_nn *nn, const char *name, mr_val x, int64_t out, int bias, int gelu, mr_init_kind winit,
                     double warg, mr_init_kind binit, double barg) {
    if (nn->g->err != MR_OK) return MR_VAL_NONE;
    int64_t in = last_dim(nn->g, x);
    char pn[MR_NAME_MAX];
    snprintf(pn, sizeof pn, "%s.weight", name);
    mr_val w = mr_nn_param(nn, pn, mr_shape_2d(out, in), winit, warg); /* weight before bias: PyTorch's order */
    mr_val b = MR_VAL_NONE;
    if (bias) {
        snprintf(pn, sizeof pn, "%s.bias", name);
        b = mr_nn_param(nn, pn, mr_shape_1d(out), binit, barg);
    }
    mr_val xi = x, wi = w;
    if ((nn->compute == MR_BF16 || nn->compute == MR_F16) && nn->dtype == MR_F32) {
        /* mixed precision: low-precision copies of the input and of the f32 master weight into a
         * GEMM that accumulates and writes f32 (the f32 bias is added in its epilogue); the
         * gradients flow back through the casts (the GEMM's dy is cast to the low type too, so an
         * f16 backward can overflow: loss scaling) */
        if (mr_graph_dtype(nn->g, x) != nn->compute) xi = mr_graph_cast(nn->g, x, nn->compute);
        wi = mr_graph_cast(nn->g, w, nn->compute);
    }
    return mr_graph_linear(nn->g, xi, wi, b, gelu);
}

mr_val mr_nn_linear_init(mr_nn *nn, const char *name, mr_val x, int64_t out, int bias, mr_init_kind winit,
                         double warg, mr_init_kind binit, double barg) {
    return linear(nn, name, x, out, bias, 0, winit, warg, binit, barg);
}

mr_val mr_nn_linear_gelu_init(mr_nn *nn, const char *name, mr_val x, int64_t out, mr_init_kind winit, double warg,
                              mr_init_kind binit, double barg) {
    return linear(nn, name, x, out, 1, 1, winit, warg, binit, barg);
}

mr_val mr_nn_linear(mr_nn *nn, const char *name, mr_val x, int64_t out, int bias) {
    double in = (double)last_dim(nn->g, x);
    return mr_nn_linear_init(nn, name, x, out, bias, MR_INIT_FAN_IN, in, MR_INIT_FAN_IN, in);
}

mr_val mr_nn_conv2d(mr_nn *nn, const char *name, mr_val x, int64_t out, int k, int stride, int pad, int bias) {
    if (nn->g->err != MR_OK) return MR_VAL_NONE;
    mr_shape sx = mr_graph_shape(nn->g, x);
    int64_t in = sx.ndim == 4 ? sx.dim[1] : 0;
    double fan_in = (double)in * k * k;
    char pn[MR_NAME_MAX];
    snprintf(pn, sizeof pn, "%s.weight", name);
    mr_val w = mr_nn_param(nn, pn, mr_shape_4d(out, in, k, k), MR_INIT_FAN_IN, fan_in);
    mr_val b = MR_VAL_NONE;
    if (bias) {
        snprintf(pn, sizeof pn, "%s.bias", name);
        b = mr_nn_param(nn, pn, mr_shape_1d(out), MR_INIT_FAN_IN, fan_in);
    }
    mr_val wi = w;
    if (nn->compute == MR_BF16 && nn->dtype == MR_F32 && nn->device == MR_DEVICE_CPU) {
        /* mixed precision on the CPU: a bf16 copy of the f32 master weight makes the convolution
         * mixed (mr_graph_conv2d): the kernel rounds x and dy to bf16 as it reads them (no cast
         * pass over the activations), accumulates and writes f32 (the f32 bias added in f32); dw
         * flows back through the cast (core/cpu/conv_cpu.c; the CUDA kernel keeps f32 here) */
        wi = mr_graph_cast(nn->g, w, MR_BF16);
    }
    return mr_graph_conv2d(nn->g, x, wi, b, stride, pad);
}

mr_val mr_nn_relu(mr_nn *nn, mr_val x) {
    if (nn->device == MR_DEVICE_CPU) return mr_graph_relu_after_conv(nn->g, x);
    return mr_graph_unary(nn->g, MR_OP_RELU, x);
}

mr_val mr_nn_layernorm(mr_nn *nn, const char *name, mr_val x) {
    if (nn->g->err != MR_OK) return MR_VAL_NONE;
    int64_t d = last_dim(nn->g, x);
    char pn[MR_NAME_MAX];
    snprintf(pn, sizeof pn, "%s.weight", name);
    mr_val w = mr_nn_param(nn, pn, mr_shape_1d(d), MR_INIT_ONES, 0);
    snprintf(pn, sizeof pn, "%s.bias", name);
    mr_val b = mr_nn_param(nn, pn, mr_shape_1d(d), MR_INIT_ZEROS, 0);
    return mr_graph_layernorm(nn->g, x, w, b, 1e-5);
}

mr_val mr_nn_embedding(mr_nn *nn, const char *name, mr_val ids, int64_t vocab, int64_t dim, double std) {
    char pn[MR_NAME_MAX];
    snprintf(pn, sizeof pn, "%s.weight", name);
    mr_val w = mr_nn_param(nn, pn, mr_shape_2d(vocab, dim), MR_INIT_NORMAL, std);
    return mr_graph_embedding(nn->g, w, ids);
}

mr_val mr_nn_dropout(mr_nn *nn, mr_val x, double p) {
    if (!nn->training || p <= 0.0 || nn->g->err != MR_OK) return x;
    mr_shape s = mr_graph_shape(nn->g, x);
    mr_val y = mr_graph_dropout(nn->g, x, p, nn->dropout_seed, nn->dropout_offset);
    nn->dropout_offset += (uint64_t)((mr_shape_numel(&s) + 3) / 4); /* Philox blocks used */
    return y;
}

int mr_nn_attention_fused(const mr_nn *nn, int64_t head_dim) {
    /* MIRROR_ATTENTION=fused|composed overrides the rule, for comparing the two on one machine */
    const char *force = getenv("MIRROR_ATTENTION");
    if (force && !strcmp(force, "fused")) return 1;
    if (force && !strcmp(force, "composed")) return 0;
    if (force && *force && strcmp(force, "auto"))
        mr_log_warn("nn: MIRROR_ATTENTION=%s is not fused, composed or auto; choosing automatically", force);
    /* on a GPU only: on the CPU the composed path's GEMMs are faster (bench/run_train.sh, GPT
     * bf16: 34.3k tokens/s composed against 14.8k fused, Zen 5, 2 cores) */
    int half = nn->compute == MR_BF16 || nn->compute == MR_F16;
    return nn->device == MR_DEVICE_CUDA && half && nn->dtype == MR_F32 && head_dim % 8 == 0 && head_dim <= 128;
}

mr_val mr_nn_causal_attention(mr_nn *nn, const char *name, mr_val x, int heads) {
    mr_graph *g = nn->g;
    if (g->err != MR_OK) return MR_VAL_NONE;
    mr_shape s = mr_graph_shape(g, x);
    if (s.ndim != 3 || heads <= 0 || s.dim[2] % heads) {
        char b[128];
        mr_graph_fail(g, MR_ERR_INVALID, "nn: attention '%s': x %s must be (B,T,C) with C divisible by %d heads", name,
                      mr_shape_str(&s, b, 128), heads);
        return MR_VAL_NONE;
    }
    const int64_t B = s.dim[0], T = s.dim[1], C = s.dim[2], H = heads, D = C / heads;
    char ln[MR_NAME_MAX];
    snprintf(ln, sizeof ln, "%s.c_attn", name);
    mr_val qkv = mr_nn_linear(nn, ln, x, 3 * C, 1);                          /* (B,T,3C) */
    mr_val q5 = mr_graph_reshape(g, qkv, mr_shape_make(5, (int64_t[]){B, T, 3, H, D}));
    const int fused = mr_nn_attention_fused(nn, D);
    /* mixed bf16 on the CPU, unfused: the four batched GEMMs of each pass in bf16 (the
     * AMX/vdpbf16ps kernels; products exact, f32 sums and results), on bf16 q, k, v and
     * probabilities, as PyTorch's autocast runs bmm; the softmax computes in f32 (docs/DESIGN.md
     * "bf16 GEMM on the GPT's shapes"). The head-splitting permute writes bf16 q, k, v itself, the
     * softmax bf16 probabilities (which its backward reads) and the head-merging permute a bf16
     * c_proj input (core/ops.h PERMUTE, SOFTMAX: no cast passes over them). */
    const int bf = !fused && nn->device == MR_DEVICE_CPU && nn->compute == MR_BF16 && nn->dtype == MR_F32;
    mr_val p5 = mr_graph_permute_to(g, q5, (int[]){2, 0, 3, 1, 4}, bf ? MR_BF16 : mr_graph_dtype(g, q5)); /* (3,B,H,T,D) */
    const int64_t one = B * H * T * D;
    mr_shape bhtd = mr_shape_4d(B, H, T, D);
    mr_val q = mr_graph_slice(g, p5, 0, bhtd), k = mr_graph_slice(g, p5, one, bhtd);
    mr_val v = mr_graph_slice(g, p5, 2 * one, bhtd);
    mr_val y;
    if (fused) {
        /* one fused node, on half casts of q, k, v under a mixed policy; y back to the model's dtype
         * (docs/DESIGN.md "Attention") */
        mr_dtype h = nn->compute == MR_BF16 || nn->compute == MR_F16 ? nn->compute : nn->dtype;
        if (h != nn->dtype) {
            q = mr_graph_cast(g, q, h);
            k = mr_graph_cast(g, k, h);
            v = mr_graph_cast(g, v, h);
        }
        y = mr_graph_attention(g, q, k, v, 1.0 / sqrt((double)D), 1);
        if (h != nn->dtype) y = mr_graph_cast(g, y, nn->dtype);
    } else {
        mr_val att = mr_graph_matmul(g, q, k, 0, 1, 1.0 / sqrt((double)D)); /* (B,H,T,T) */
        /* row t sees positions <= t; bf16 probabilities written by the softmax itself */
        att = mr_graph_causal_softmax_to(g, att, bf ? MR_BF16 : mr_graph_dtype(g, att));
        y = mr_graph_matmul(g, att, v, 0, 0, 1.0);                           /* (B,H,T,D) */
    }
    y = mr_graph_permute_to(g, y, (int[]){0, 2, 1, 3}, bf ? MR_BF16 : mr_graph_dtype(g, y)); /* (B,T,H,D) */
    y = mr_graph_reshape(g, y, mr_shape_3d(B, T, C));
    snprintf(ln, sizeof ln, "%s.c_proj", name);
    return mr_nn_linear(nn, ln, y, C, 1);
}

mr_val mr_nn_xent_mean(mr_nn *nn, mr_val logits, mr_val labels) {
    mr_val l = mr_graph_softmax_xent(nn->g, logits, labels, -100);
    return mr_graph_mean(nn->g, l, 1);
}

/* A [C] vector as (1, C, 1, ...) for broadcasting against x of rank `ndim`. */
static mr_val channel_view(mr_graph *g, mr_val v, int ndim) {
    mr_shape s = mr_graph_shape(g, v);
    int64_t dims[MR_MAX_DIMS];
    for (int i = 0; i < ndim; i++) dims[i] = 1;
    dims[1] = mr_shape_numel(&s);
    return mr_graph_reshape(g, v, mr_shape_make(ndim, dims));
}

/* The mean of x over `axes`, over the global batch when nn->sync is set: each replica's sum,
 * summed over the replicas by the hook, divided by the global count. */
static mr_val batch_mean(mr_nn *nn, mr_val x, uint32_t axes, int64_t count) {
    if (!nn->sync) return mr_graph_mean(nn->g, x, axes);
    mr_val sum = mr_graph_hook(nn->g, mr_graph_sum(nn->g, x, axes), nn->sync);
    return mr_graph_scale(nn->g, sum, 1.0 / ((double)count * (double)nn->sync->replicas));
}

/* After a training run: running = (1 - momentum) running + momentum * batch, with the unbiased
 * variance var * n / (n - 1) (n values a channel, over every replica), and num_batches_tracked += 1
 * (PyTorch's BatchNorm). mean and var are the batch statistics (C). */
static void update_running(mr_nn *nn, mr_val rm, mr_val rv, mr_val nbt, mr_val mean, mr_val var, double momentum,
                           double n) {
    mr_graph *g = nn->g;
    const double unbias = n > 1 ? n / (n - 1) : 1.0;
    mr_val rm_new = mr_graph_add(g, mr_graph_scale(g, rm, 1.0 - momentum), mr_graph_scale(g, mean, momentum));
    mr_val rv_new = mr_graph_add(g, mr_graph_scale(g, rv, 1.0 - momentum), mr_graph_scale(g, var, momentum * unbias));
    mr_val nbt_new = mr_graph_add(g, mr_graph_scale(g, nbt, 1.0),
                                  mr_graph_fill(g, mr_graph_dtype(g, nbt), mr_shape_make(0, NULL), 1.0));
    mr_nn_buffer_update(nn, rm, rm_new);
    mr_nn_buffer_update(nn, rv, rv_new);
    mr_nn_buffer_update(nn, nbt, nbt_new);
}

/* The weight and bias of an affine batch norm (MR_VAL_NONE for both when not affine). */
static void bn_affine(mr_nn *nn, const char *name, int64_t C, int affine, mr_val *w, mr_val *b) {
    char pn[MR_NAME_MAX];
    *w = *b = MR_VAL_NONE;
    if (!affine) return;
    snprintf(pn, sizeof pn, "%s.weight", name);
    *w = mr_nn_param(nn, pn, mr_shape_1d(C), MR_INIT_ONES, 0);
    snprintf(pn, sizeof pn, "%s.bias", name);
    *b = mr_nn_param(nn, pn, mr_shape_1d(C), MR_INIT_ZEROS, 0);
}

mr_val mr_nn_batchnorm(mr_nn *nn, const char *name, mr_val x, double momentum, double eps, int affine) {
    mr_graph *g = nn->g;
    if (g->err != MR_OK) return MR_VAL_NONE;
    mr_shape s = mr_graph_shape(g, x);
    if (s.ndim < 2 || s.ndim > 4) {
        char b[128];
        mr_graph_fail(g, MR_ERR_INVALID, "nn: batchnorm '%s': x %s must be (N,C), (N,C,L) or (N,C,H,W)", name,
                      mr_shape_str(&s, b, 128));
        return MR_VAL_NONE;
    }
    const int64_t C = s.dim[1], count = mr_shape_numel(&s) / C;
    uint32_t axes = 0;
    for (int i = 0; i < s.ndim; i++)
        if (i != 1) axes |= 1u << i;
    char pn[MR_NAME_MAX];
    snprintf(pn, sizeof pn, "%s.running_mean", name);
    mr_val rm = mr_nn_buffer(nn, pn, mr_shape_1d(C), MR_INIT_ZEROS);
    snprintf(pn, sizeof pn, "%s.running_var", name);
    mr_val rv = mr_nn_buffer(nn, pn, mr_shape_1d(C), MR_INIT_ONES);
    snprintf(pn, sizeof pn, "%s.num_batches_tracked", name);
    mr_val nbt = mr_nn_buffer(nn, pn, mr_shape_make(0, NULL), MR_INIT_ZEROS);
    if (!nn->sync) {
        /* one fused node (MR_OP_BATCHNORM) whose mean and var outputs feed the running statistics */
        mr_val w, b, mean, var;
        bn_affine(nn, name, C, affine, &w, &b);
        mr_val y = mr_graph_batchnorm(g, x, w, b, rm, rv, eps, nn->training, &mean, &var);
        if (nn->training) update_running(nn, rm, rv, nbt, mean, var, momentum, (double)count);
        return y;
    }
    /* synchronised: composed from reductions, so the hook can sum each over the replicas */
    mr_val xc, var;
    if (nn->training) {
        mr_val mean = batch_mean(nn, x, axes, count);   /* (1, C, 1, 1) */
        xc = mr_graph_sub(g, x, mean);
        var = batch_mean(nn, mr_graph_mul(g, xc, xc), axes, count); /* biased */
        const double n = (double)count * (double)nn->sync->replicas;
        update_running(nn, rm, rv, nbt, mr_graph_reshape(g, mean, mr_shape_1d(C)),
                       mr_graph_reshape(g, var, mr_shape_1d(C)), momentum, n);
    } else {
        xc = mr_graph_sub(g, x, channel_view(g, rm, s.ndim));
        var = channel_view(g, rv, s.ndim);
    }
    mr_val den = mr_graph_unary(g, MR_OP_SQRT, mr_graph_add(g, var, mr_graph_fill(g, mr_graph_dtype(g, var),
                                                                                   mr_graph_shape(g, var), eps)));
    mr_val y = mr_graph_div(g, xc, den);
    if (affine) {
        mr_val w, b;
        bn_affine(nn, name, C, affine, &w, &b);
        y = mr_graph_add(g, mr_graph_mul(g, y, channel_view(g, w, s.ndim)), channel_view(g, b, s.ndim));
    }
    return y;
}
