/* The compiled-step cache (see steps.h). */
#include "autodiff/steps.h"
#include "autodiff/graph_impl.h"
#include "core/log.h"

#include <stdlib.h>
#include <string.h>

#define MR_TRY_BIND(v, mem)                                   \
    do {                                                      \
        mr_status bst_ = mr_plan_bind(step->plan, (v), (mem)); \
        if (bst_ != MR_OK) return bst_;                       \
    } while (0)

struct mr_steps {
    mr_step_build_fn build;
    const void *ctx;
    mr_params *ps;
    mr_device_kind kind;
    mr_dtype compute;
    /* mr_steps_set_device: plans on dev/stream, parameters and gradients in caller buffers laid
     * out as the registry's, the loss scale read from d_loss_scale */
    int allow_tf32;
    int on_device;
    mr_device dev;
    mr_stream *stream;
    float *d_params, *d_grads, *d_loss_scale;
    float *d_bufs; /* the buffers on the device (mr_steps_set_device_bufs); NULL: none set */
    const mr_hook *sync; /* batch norm's statistics over the replicas (mr_steps_set_sync) */
    mr_step **steps;
    int n, cap, compilations;
};

mr_status mr_steps_new(mr_step_build_fn build, const void *ctx, mr_params *ps, mr_device_kind kind,
                       mr_steps **out) {
    *out = NULL;
    if (!build || !ps) return mr_set_error(MR_ERR_INVALID, "steps: a build function and a registry are required");
    mr_steps *s = calloc(1, sizeof *s);
    if (!s) return mr_set_error(MR_ERR_NOMEM, "steps: out of memory");
    s->build = build;
    s->ctx = ctx;
    s->ps = ps;
    s->kind = kind;
    *out = s;
    return MR_OK;
}

static void step_free(mr_step *st) {
    if (!st) return;
    mr_plan_free(st->plan);
    mr_graph_free(st->g);
    free(st);
}

void mr_steps_free(mr_steps *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) step_free(s->steps[i]);
    free(s->steps);
    free(s);
}

int mr_steps_compilations(const mr_steps *s) { return s->compilations; }

void mr_steps_set_compute(mr_steps *s, mr_dtype compute) { s->compute = compute; }

void mr_steps_set_allow_tf32(mr_steps *s, int on) { s->allow_tf32 = on; }

mr_status mr_steps_set_device(mr_steps *s, mr_device dev, mr_stream *stream, float *d_params, float *d_grads,
                              float *d_loss_scale) {
    if (s->n > 0) return mr_set_error(MR_ERR_INVALID, "steps: the device must be set before the first compilation");
    if (!d_params || !d_grads || !d_loss_scale)
        return mr_set_error(MR_ERR_INVALID, "steps: device parameter, gradient and loss-scale buffers are required");
    s->on_device = 1;
    s->dev = dev;
    s->kind = dev.kind;
    s->stream = stream;
    s->d_params = d_params;
    s->d_grads = d_grads;
    s->d_loss_scale = d_loss_scale;
    return MR_OK;
}

mr_status mr_steps_set_device_bufs(mr_steps *s, float *d_bufs) {
    if (s->n > 0) return mr_set_error(MR_ERR_INVALID, "steps: the device must be set before the first compilation");
    if (!s->on_device) return mr_set_error(MR_ERR_INVALID, "steps: mr_steps_set_device_bufs after mr_steps_set_device");
    s->d_bufs = d_bufs;
    return MR_OK;
}

mr_status mr_steps_set_sync(mr_steps *s, const mr_hook *sync) {
    if (s->n > 0) return mr_set_error(MR_ERR_INVALID, "steps: the sync hook must be set before the first compilation");
    if (sync && s->on_device && s->dev.kind != MR_DEVICE_CPU)
        return mr_set_error(MR_ERR_UNSUPPORTED, "batchnorm sync: the hook sums host memory, not on GPU replicas yet; HINT: "
                                                "sync: false, or CPU replicas");
    s->sync = sync;
    return MR_OK;
}

mr_status mr_steps_register(mr_steps *s, int64_t batch) {
    mr_status st = MR_OK;
    mr_step_io io;
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    memset(&io, 0, sizeof io);
    MR_TRY(mr_graph_new(&nn.g));
    nn.ps = s->ps;
    nn.dtype = MR_F32;
    nn.compute = s->compute;
    nn.device = s->kind;
    nn.training = 1;
    MR_TRY(s->build(s->ctx, &nn, batch, &io));
    MR_TRY(mr_graph_status(nn.g));
    if (!mr_params_allocated(s->ps)) MR_TRY(mr_params_alloc(s->ps));
fail:
    mr_graph_free(nn.g);
    return st;
}

/* Non-zero when gradient value v is computed by the step's kernels: a node output, or a view of
 * one covering all its bytes (a bias gradient reduced with kept dims and reshaped), which binding
 * redirects to the viewed node. Constants (zero gradients) and views of inputs are not. */
static int computed(const mr_graph *g, mr_val v) {
    int32_t id = v.id;
    while (g->vals[id].kind == MR_VAL_VIEW) {
        if (g->vals[id].view_off != 0) return 0;
        id = g->vals[id].base;
    }
    return g->vals[id].kind == MR_VAL_NODE &&
           mr_shape_numel(&g->vals[id].shape) * (int64_t)mr_dtype_size(g->vals[id].dtype) ==
               mr_shape_numel(&g->vals[v.id].shape) * (int64_t)mr_dtype_size(g->vals[v.id].dtype);
}

/* Where registry buffer k lives for s's plans: the host registry, or the device copy. */
static void *buf_memory(const mr_steps *s, int32_t k) {
    const mr_params *bufs = mr_params_bufs(s->ps);
    return s->on_device ? (void *)(s->d_bufs + mr_params_offset(bufs, k)) : (void *)mr_params_data(bufs, k);
}

/* Non-zero when node j reads value id v, directly or through a view. */
static int node_reads(const mr_graph *g, int32_t j, int32_t v) {
    for (int i = 0; i < g->nodes[j].n_in; i++) {
        int32_t id = g->nodes[j].in[i];
        while (id && g->vals[id].kind == MR_VAL_VIEW) id = g->vals[id].base;
        if (id == v) return 1;
    }
    return 0;
}

/* The buffer updates of a training build (mr_nn_buffer_update) write into the buffer's own
 * memory, so nothing may read the buffer after the update's node starts. Checks it, and adds the
 * updated values to keep. */
static mr_status check_updates(const mr_nn *nn, mr_val *keep, int *nkeep) {
    const mr_graph *g = nn->g;
    for (int u = 0; u < nn->n_updates; u++) {
        int32_t b = nn->upd_buf[u].id, p = g->vals[nn->upd_val[u].id].node;
        for (int32_t j = p; j < g->nnodes; j++)
            if (node_reads(g, j, b))
                return mr_set_error(MR_ERR_INTERNAL, "steps: buffer '%s' is read after its update is computed",
                                    g->vals[b].name);
        keep[(*nkeep)++] = nn->upd_val[u];
    }
    return MR_OK;
}

/* Binds every buffer input of the step to its memory and, for training, every update to it too. */
static mr_status bind_buffers(mr_steps *s, mr_step *step, const mr_nn *nn) {
    const mr_params *bufs = mr_params_bufs(s->ps);
    if (mr_params_count(bufs) == 0) return MR_OK;
    if (s->on_device && !s->d_bufs)
        return mr_set_error(MR_ERR_INVALID, "steps: the model has buffers; HINT: mr_steps_set_device_bufs");
    for (int32_t k = 0; k < mr_params_count(bufs); k++) {
        mr_val v = mr_graph_find(step->g, mr_params_name(bufs, k));
        if (v.id && mr_graph_kind(step->g, v) == MR_VAL_INPUT) MR_TRY_BIND(v, buf_memory(s, k));
    }
    for (int u = 0; u < nn->n_updates; u++) {
        int32_t k = mr_params_find(bufs, mr_graph_name(step->g, nn->upd_buf[u]));
        if (k < 0) return mr_set_error(MR_ERR_INTERNAL, "steps: update of an unregistered buffer");
        MR_TRY_BIND(nn->upd_val[u], buf_memory(s, k));
    }
    return MR_OK;
}

/* Builds, differentiates, plans and binds one step. */
static mr_status compile(mr_steps *s, int64_t batch, int train, mr_step **out) {
    mr_status st = MR_OK;
    mr_step *step = calloc(1, sizeof *step);
    mr_val *pv = NULL, *gv = NULL, *keep = NULL;
    MR_CHECK(step, MR_ERR_NOMEM, "steps: out of memory");
    step->batch = batch;
    step->train = train;
    step->loss_scale = 1.0f;
    MR_TRY(mr_graph_new(&step->g));
    mr_graph_set_allow_tf32(step->g, s->allow_tf32);
    mr_nn nn;
    memset(&nn, 0, sizeof nn);
    nn.g = step->g;
    nn.ps = s->ps;
    nn.dtype = MR_F32;
    nn.compute = s->compute;
    nn.device = s->kind;
    nn.training = train;
    nn.sync = s->sync;
    MR_TRY(s->build(s->ctx, &nn, batch, &step->io));
    MR_TRY(mr_graph_status(step->g));
    int32_t np = mr_graph_num_params(step->g);
    pv = calloc((size_t)np + 1, sizeof *pv);
    gv = calloc((size_t)np + 1, sizeof *gv);
    keep = calloc((size_t)np + 2 + (size_t)nn.n_updates, sizeof *keep);
    MR_CHECK(pv && gv && keep, MR_ERR_NOMEM, "steps: out of memory");
    for (int32_t i = 0; i < np; i++) pv[i] = mr_graph_param_at(step->g, i);
    int nkeep = 0;
    if (s->kind == MR_DEVICE_CPU) {
        /* a conv with a fused ReLU pooled 2x2 right after: one CONV2D_MAXPOOL node (core/ops.h), its
         * full output never stored; what this step keeps or binds stays unfused */
        keep[nkeep++] = step->io.loss;
        keep[nkeep++] = step->io.out;
        for (int u = 0; u < nn.n_updates; u++) keep[nkeep++] = nn.upd_val[u];
        if (mr_graph_fuse_conv_pool(step->g, keep, nkeep) < 0) MR_TRY(mr_graph_status(step->g));
        nkeep = 0;
    }
    step->n_forward = mr_graph_num_nodes(step->g); /* nodes are planned in creation order */
    keep[nkeep++] = step->io.loss;
    keep[nkeep++] = step->io.out;
    if (train) {
        /* differentiate loss * loss_scale: a bound scalar, so changing the scale never recompiles */
        step->io.loss_scale = mr_graph_input(step->g, "loss_scale", MR_F32, mr_graph_shape(step->g, step->io.loss));
        mr_val scaled = mr_graph_mul(step->g, step->io.loss, step->io.loss_scale);
        MR_TRY(mr_graph_status(step->g));
        MR_TRY(mr_graph_grad(step->g, scaled, pv, np, gv));
        /* Each gradient is bound to its own slot of the registry's buffer, so one value may not
         * serve two parameters (dy of `p1 + p2`) nor be the loss: such a gradient gets a copy. */
        for (int32_t i = 0; i < np; i++) {
            int shared = gv[i].id == step->io.loss.id || gv[i].id == step->io.out.id;
            for (int32_t j = 0; j < i && !shared; j++) shared = gv[j].id == gv[i].id;
            if (shared && mr_graph_kind(step->g, gv[i]) != MR_VAL_CONST) gv[i] = mr_graph_scale(step->g, gv[i], 1.0);
            /* a gradient that is a partial view of another value cannot be bound: copy it */
            if (!shared && mr_graph_kind(step->g, gv[i]) == MR_VAL_VIEW && !computed(step->g, gv[i]))
                gv[i] = mr_graph_scale(step->g, gv[i], 1.0);
        }
        MR_TRY(mr_graph_status(step->g));
        /* the gradients are bound below, so they are kept (never overwritten within a run) */
        for (int32_t i = 0; i < np; i++) keep[nkeep++] = gv[i];
        MR_TRY(check_updates(&nn, keep, &nkeep)); /* after the backward: no backward node reads a buffer either */
    }
    if (s->on_device) {
        MR_TRY(mr_plan_new_on(step->g, s->dev, s->stream, keep, nkeep, &step->plan));
        if (train) MR_TRY(mr_plan_bind(step->plan, step->io.loss_scale, s->d_loss_scale));
    } else {
        MR_TRY(mr_plan_new(step->g, s->kind, keep, nkeep, &step->plan));
        if (train) MR_TRY(mr_plan_bind(step->plan, step->io.loss_scale, &step->loss_scale));
    }
    if (!mr_params_allocated(s->ps)) MR_TRY(mr_params_alloc(s->ps));
    if (!train) nn.n_updates = 0; /* an evaluation leaves the buffers alone */
    MR_TRY(bind_buffers(s, step, &nn));
    for (int32_t i = 0; i < np; i++) {
        int32_t k = mr_params_find(s->ps, mr_graph_name(step->g, pv[i]));
        MR_CHECK(k >= 0, MR_ERR_INTERNAL, "steps: parameter '%s' is not in the registry", mr_graph_name(step->g, pv[i]));
        int64_t off = mr_params_offset(s->ps, k);
        MR_TRY(mr_plan_bind(step->plan, pv[i], s->on_device ? (void *)(s->d_params + off) : mr_params_data(s->ps, k)));
        /* a zero-filled gradient (the loss does not depend on the parameter) is a constant: the
         * registry's buffer already holds zeros for it (the device buffer is zeroed by its owner) */
        if (train && computed(step->g, gv[i]))
            MR_TRY(mr_plan_bind(step->plan, gv[i],
                                s->on_device ? (void *)(s->d_grads + off) : (void *)mr_params_grad(s->ps, k)));
    }
    s->compilations++;
    mr_log_info("compiled %s step for batch %lld (compilation %d): %d kernels, %.1f MiB of activations",
                train ? "a training" : "an evaluation", (long long)batch, s->compilations, mr_plan_num_kernels(step->plan),
                (double)mr_plan_arena_bytes(step->plan) / 1048576.0);
    free(pv);
    free(gv);
    free(keep);
    *out = step;
    return MR_OK;
fail:
    free(pv);
    free(gv);
    free(keep);
    step_free(step);
    return st;
}

mr_status mr_steps_get(mr_steps *s, int64_t batch, int train, mr_step **out) {
    *out = NULL;
    for (int i = 0; i < s->n; i++)
        if (s->steps[i]->batch == batch && s->steps[i]->train == !!train) {
            *out = s->steps[i];
            return MR_OK;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 4;
        mr_step **p = realloc(s->steps, (size_t)cap * sizeof *p);
        if (!p) return mr_set_error(MR_ERR_NOMEM, "steps: out of memory");
        s->steps = p;
        s->cap = cap;
    }
    mr_step *step = NULL;
    mr_status st = compile(s, batch, !!train, &step);
    if (st != MR_OK) return st;
    s->steps[s->n++] = step;
    *out = step;
    return MR_OK;
}
