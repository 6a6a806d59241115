/* Image augmentation as pipeline maps (data/data.h): random_crop (zero padding, then a crop at a
 * random offset), horizontal_flip (with a probability) and normalize (per-channel mean and std),
 * in the order declared. Random draws come from Philox4x32-10 (core/math/philox_math.h) with the
 * counter (source element index, source epoch) and a key from (seed, the op's place in the list):
 * element i in epoch e gets the same crop and flip whatever the thread count, the number of
 * replicas, the prefetch depth or a resume in between, like everything else in data/ (see
 * docs/DESIGN.md, "Data pipeline determinism"; the config keys: README.md, "Augmentation").
 *
 * The component augmented holds f32 images (C, H, W) (or (H, W): one channel), e.g. the
 * trainer's "x" after it scales the u8 pixels to [0, 1]; every other component passes through.
 * C11 and C++ clean. */
#ifndef MR_DATA_AUGMENT_H
#define MR_DATA_AUGMENT_H

#include <stdint.h>

#include "data/data.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_AUGMENT_MAX_OPS 8
#define MR_AUGMENT_MAX_CHANNELS 16

typedef enum mr_augment_kind {
    MR_AUG_RANDOM_CROP = 1, /* size, pad: pad every side with zeros, crop size x size at a random offset */
    MR_AUG_HFLIP = 2,       /* p: mirror the W axis with probability p */
    MR_AUG_NORMALIZE = 3    /* n, mean[c], std[c]: x = (x - mean[c]) / std[c] per channel */
} mr_augment_kind;

typedef struct mr_augment_op {
    mr_augment_kind kind;
    int64_t size, pad;  /* random_crop */
    double p;           /* horizontal_flip */
    int n;              /* normalize: channels */
    double mean[MR_AUGMENT_MAX_CHANNELS], std[MR_AUGMENT_MAX_CHANNELS];
} mr_augment_op;

/* The ops in order; n = 0: none. A value struct: zero-initialized is "no augmentation". */
typedef struct mr_augment_cfg {
    int n;
    mr_augment_op op[MR_AUGMENT_MAX_OPS];
} mr_augment_cfg;

/* Appends cfg's ops to `in` as maps over component `component` (random ones only when train is
 * non-zero: evaluation gets normalize only), each with `parallel` threads (data.h, mr_data_map).
 * seed keys the random draws. With no op to apply *out is `in`, retained. Retains `in`.
 * Errors (*out NULL, nothing retained): MR_ERR_INVALID naming the op and the value: the component
 * is missing or not f32 (C, H, W) / (H, W); a crop size other than the images' H and W (evaluation
 * sees whole images); pad < 0; p outside [0, 1]; a normalize with another number of channels than
 * C, or a std <= 0; more than MR_AUGMENT_MAX_OPS ops. MR_ERR_NOMEM. */
mr_status mr_data_augment(mr_dataset *in, const char *component, const mr_augment_cfg *cfg, int train, uint64_t seed,
                          int parallel, mr_dataset **out) MR_WUR;

/* The random draws of op number `op` (its place in the list) for element `index` of source epoch
 * `epoch`: four uniform 32-bit words. random_crop's offsets are oy = (w[0] * (2*pad + 1)) >> 32 and
 * ox = (w[1] * (2*pad + 1)) >> 32; horizontal_flip flips when (w[2] >> 8) * 2^-24 < p. */
void mr_augment_draws(uint64_t seed, int op, int64_t index, int64_t epoch, uint32_t w[4]);

#ifdef __cplusplus
}
#endif
#endif
