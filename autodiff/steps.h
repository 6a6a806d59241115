/* Compiled steps: a model's graphs, planned once per batch size and kept (the tf.function
 * lesson: static shapes, planned memory; a new input shape is a new trace, and retracing must be
 * visible, so every compilation is counted and logged).
 *
 * A step is the model's forward (and, for training, its backward) for one batch size, planned
 * on a backend, with every parameter bound to the registry's value buffer and, for training,
 * every gradient written straight into the registry's gradient buffer, every buffer
 * (mr_params_bufs) bound to its memory and, in training, updated there by the step. The caller binds the
 * batch (mr_plan_bind on io.x and io.y) and runs the plan. */
#ifndef MR_STEPS_H
#define MR_STEPS_H

#include "autodiff/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_step_io {
    mr_val x, y;   /* inputs "x" and labels "y" */
    mr_val out;    /* logits */
    mr_val loss;   /* scalar mean loss */
    /* Training steps: the f32 scalar input "loss_scale" (bind a float; 1 without loss scaling).
     * The backward differentiates loss * loss_scale, so the gradients come out multiplied by it
     * (dynamic loss scaling for mixed_float16, optim/optim.h mr_loss_scaler). The build function
     * leaves it alone; compilation creates it and binds it to mr_step.loss_scale. */
    mr_val loss_scale;
} mr_step_io;

/* Builds a model's forward and loss for `batch` into nn (see mr_model_build). */
typedef mr_status (*mr_step_build_fn)(const void *ctx, mr_nn *nn, int64_t batch, mr_step_io *io);

typedef struct mr_step {
    int64_t batch;
    int train;        /* forward + backward; else forward only */
    mr_graph *g;
    mr_plan *plan;
    mr_step_io io;
    int32_t n_forward; /* the plan's first n_forward kernels are the forward (mr_plan_run_range) */
    float loss_scale;  /* training: the value io.loss_scale is bound to (1 after compilation); set it
                        * before a run to scale the gradients */
} mr_step;

typedef struct mr_steps mr_steps;

/* A cache over registry ps (borrowed; parameters are registered by the first compilation and
 * must be allocated, mr_params_alloc, before a step runs). build and ctx (borrowed) describe the
 * model. */
mr_status mr_steps_new(mr_step_build_fn build, const void *ctx, mr_params *ps, mr_device_kind kind,
                       mr_steps **out) MR_WUR;
void mr_steps_free(mr_steps *s); /* frees every step; NULL is a no-op */

/* The step for (batch, train), compiled on first use: the graph is built, differentiated when
 * training, planned, and bound to the registry (allocating it if this is the first step).
 * *step stays valid until mr_steps_free. */
mr_status mr_steps_get(mr_steps *s, int64_t batch, int train, mr_step **step) MR_WUR;

/* The compute type of later compilations: MR_F32 (default), MR_BF16 (mixed_bfloat16) or MR_F16
 * (mixed_float16): linear layers multiply in the low type from f32 master weights; reductions,
 * softmax, norms and the loss stay f32. */
void mr_steps_set_compute(mr_steps *s, mr_dtype compute);

/* Registers the model's parameters (built for `batch`, training mode) and allocates the registry,
 * without compiling a step: how a caller learns the parameter layout before it allocates device
 * buffers for mr_steps_set_device. */
mr_status mr_steps_register(mr_steps *s, int64_t batch) MR_WUR;

/* Compiles later steps for device dev (before the first compilation): plans on dev and `stream`
 * (borrowed), every parameter bound to d_params + its registry offset and every gradient to
 * d_grads + offset (dev's memory, mr_params_buffer_numel floats each, owned by the caller, which
 * copies values in and out: the registry's host buffers are then the caller's shadow copy), and
 * the loss scale read from the device float d_loss_scale (mr_step.loss_scale is then unused).
 * Works with the CPU as dev too (separate host buffers), which is how the device path is tested
 * without a GPU. MR_ERR_INVALID after a compilation or with a NULL buffer. */
mr_status mr_steps_set_device(mr_steps *s, mr_device dev, mr_stream *stream, float *d_params, float *d_grads,
                              float *d_loss_scale) MR_WUR;

/* The device copy of the registry's buffers (mr_params_bufs: batch norm's running statistics),
 * laid out as the registry's, for a model that has any: after mr_steps_set_device, before the
 * first compilation. Training steps update it in place; the caller copies it in and out. */
mr_status mr_steps_set_device_bufs(mr_steps *s, float *d_bufs) MR_WUR;

/* Later compilations give the models' synchronised batch-norm layers (sync: true) this hook to sum
 * their statistics over the replicas (distribute/sync_hook.h; borrowed, it must outlive the
 * steps). NULL (the default): every batch norm normalises this replica's micro-batch. MR_ERR_INVALID
 * after a compilation, MR_ERR_UNSUPPORTED on a GPU (the hook sums host memory). */
mr_status mr_steps_set_sync(mr_steps *s, const mr_hook *sync) MR_WUR;

/* Later compilations let f32 GEMMs use TF32 on a GPU (mr_graph_set_allow_tf32). */
void mr_steps_set_allow_tf32(mr_steps *s, int on);

/* How many steps were compiled so far (each new batch size or mode adds one). */
int mr_steps_compilations(const mr_steps *s);

#ifdef __cplusplus
}
#endif
#endif
