/* Image augmentation maps (data/augment.h): each op is one mr_data_map over the image component,
 * whose context (the op, the component, the shape, the seed) the map node owns (ds_map_owned).
 * The per-element work is plain loops over (C, H, W): a 28x28 crop + flip + normalize costs a few
 * microseconds, measured against the CNN step in README.md ("Augmentation"). */
#include "data/augment.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/math/philox_math.h"
#include "data/data_impl.h"

typedef struct aug_ctx {
    mr_augment_op op;
    int index;         /* the op's place in the list (keys its draws) */
    int comp, ncomp;   /* the image component; components in the spec */
    int64_t c, h, w;   /* image shape */
    uint64_t seed;
    size_t bytes[MR_DATA_MAX_COMPONENTS];
} aug_ctx;

void mr_augment_draws(uint64_t seed, int op, int64_t index, int64_t epoch, uint32_t w[4]) {
    const uint64_t key = seed + (uint64_t)(op + 1) * 0x9E3779B97F4A7C15ull;
    const uint32_t ctr[4] = {(uint32_t)(uint64_t)index, (uint32_t)((uint64_t)index >> 32), (uint32_t)(uint64_t)epoch,
                             (uint32_t)((uint64_t)epoch >> 32)};
    const uint32_t k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
    mr_philox4x32_10(ctr, k, w);
}

static mr_status aug_map(void *ctx, const void *const in[], void *const out[], int64_t index, int64_t epoch) {
    const aug_ctx *a = ctx;
    for (int c = 0; c < a->ncomp; c++)
        if (c != a->comp) memcpy(out[c], in[c], a->bytes[c]);
    const float *x = in[a->comp];
    float *y = out[a->comp];
    const int64_t C = a->c, H = a->h, W = a->w;
    uint32_t r[4] = {0, 0, 0, 0};
    if (a->op.kind != MR_AUG_NORMALIZE) mr_augment_draws(a->seed, a->index, index, epoch, r);
    switch (a->op.kind) {
    case MR_AUG_RANDOM_CROP: {
        const uint64_t span = (uint64_t)(2 * a->op.pad + 1);
        const int64_t oy = (int64_t)(((uint64_t)r[0] * span) >> 32) - a->op.pad;
        const int64_t ox = (int64_t)(((uint64_t)r[1] * span) >> 32) - a->op.pad;
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t i = 0; i < H; i++)
                for (int64_t j = 0; j < W; j++) {
                    const int64_t si = i + oy, sj = j + ox;
                    y[(ch * H + i) * W + j] = si >= 0 && si < H && sj >= 0 && sj < W ? x[(ch * H + si) * W + sj] : 0.0f;
                }
        break;
    }
    case MR_AUG_HFLIP: {
        const int flip = (double)(r[2] >> 8) * (1.0 / 16777216.0) < a->op.p;
        for (int64_t row = 0; row < C * H; row++)
            for (int64_t j = 0; j < W; j++) y[row * W + j] = x[row * W + (flip ? W - 1 - j : j)];
        break;
    }
    case MR_AUG_NORMALIZE:
        for (int64_t ch = 0; ch < C; ch++) {
            const float m = (float)a->op.mean[ch], s = (float)(1.0 / a->op.std[ch]);
            for (int64_t k = 0; k < H * W; k++) y[ch * H * W + k] = (x[ch * H * W + k] - m) * s;
        }
        break;
    }
    return MR_OK;
}

static const char *op_name(mr_augment_kind k) {
    return k == MR_AUG_RANDOM_CROP ? "random_crop" : k == MR_AUG_HFLIP ? "horizontal_flip" : "normalize";
}

/* The op's checks against the image shape (C, H, W). */
static mr_status check_op(const mr_augment_op *op, int64_t C, int64_t H, int64_t W) {
    switch (op->kind) {
    case MR_AUG_RANDOM_CROP:
        if (op->pad < 0) return mr_set_error(MR_ERR_INVALID, "augment random_crop: pad %lld < 0", (long long)op->pad);
        if (op->size != H || op->size != W)
            return mr_set_error(MR_ERR_INVALID,
                                "augment random_crop: size %lld differs from the images' %lldx%lld; HINT: size: %lld "
                                "(evaluation sees whole images, so the crop keeps their size; pad sets the shift)",
                                (long long)op->size, (long long)H, (long long)W, (long long)H);
        return MR_OK;
    case MR_AUG_HFLIP:
        if (!(op->p >= 0 && op->p <= 1)) return mr_set_error(MR_ERR_INVALID, "augment horizontal_flip: p = %g outside [0, 1]", op->p);
        return MR_OK;
    case MR_AUG_NORMALIZE:
        if (op->n != C)
            return mr_set_error(MR_ERR_INVALID, "augment normalize: %d mean/std values for images of %lld channel%s; HINT: "
                                "one mean and one std per channel", op->n, (long long)C, C == 1 ? "" : "s");
        for (int c = 0; c < op->n; c++)
            if (!(op->std[c] > 0) || !isfinite(op->mean[c]))
                return mr_set_error(MR_ERR_INVALID, "augment normalize: channel %d: std %g must be > 0 and mean %g finite", c,
                                    op->std[c], op->mean[c]);
        return MR_OK;
    }
    return mr_set_error(MR_ERR_INVALID, "augment: op %d is of no known kind", (int)op->kind);
}

mr_status mr_data_augment(mr_dataset *in, const char *component, const mr_augment_cfg *cfg, int train, uint64_t seed,
                          int parallel, mr_dataset **out) {
    mr_status st = MR_OK;
    mr_dataset *ds = NULL, *next = NULL;
    if (out) *out = NULL;
    MR_CHECK(in && component && cfg && out, MR_ERR_INVALID, "mr_data_augment: NULL argument");
    MR_CHECK(cfg->n >= 0 && cfg->n <= MR_AUGMENT_MAX_OPS, MR_ERR_INVALID, "augment: %d ops (at most %d)", cfg->n,
             MR_AUGMENT_MAX_OPS);
    const mr_data_spec *spec = mr_data_element_spec(in);
    int comp = -1;
    for (int c = 0; c < spec->n; c++)
        if (!strcmp(spec->comp[c].name, component)) comp = c;
    MR_CHECK(comp >= 0, MR_ERR_INVALID, "augment: the data has no component '%s'", component);
    const mr_shape *sh = &spec->comp[comp].shape;
    MR_CHECK(spec->comp[comp].dtype == MR_F32 && (sh->ndim == 2 || sh->ndim == 3), MR_ERR_INVALID,
             "augment: component '%s' is %s of %d dims; augmentation takes f32 images (C, H, W) or (H, W)", component,
             mr_dtype_name(spec->comp[comp].dtype), sh->ndim);
    const int64_t C = sh->ndim == 3 ? sh->dim[0] : 1, H = sh->dim[sh->ndim - 2], W = sh->dim[sh->ndim - 1];
    for (int k = 0; k < cfg->n; k++) MR_TRY(check_op(&cfg->op[k], C, H, W));
    ds = in;
    atomic_fetch_add(&in->refs, 1);
    for (int k = 0; k < cfg->n; k++) {
        if (!train && cfg->op[k].kind != MR_AUG_NORMALIZE) continue;
        if (cfg->op[k].kind == MR_AUG_HFLIP && cfg->op[k].p == 0) continue;
        aug_ctx *a = calloc(1, sizeof *a);
        MR_CHECK(a, MR_ERR_NOMEM, "augment %s: out of memory", op_name(cfg->op[k].kind));
        a->op = cfg->op[k];
        a->index = k;
        a->comp = comp;
        a->ncomp = spec->n;
        a->c = C, a->h = H, a->w = W;
        a->seed = seed;
        for (int c = 0; c < spec->n; c++) a->bytes[c] = mr_data_spec_bytes(spec, c);
        MR_TRY(ds_map_owned(ds, aug_map, a, free, spec, parallel, &next)); /* frees a on error */
        mr_data_free(ds);
        ds = next;
        next = NULL;
    }
    *out = ds;
    return MR_OK;
fail:
    mr_data_free(ds);
    return st;
}
