/* Private to the trainer: opening the data source of a run from its config (train/train_source.c).
 * Kept apart from make_pipeline (train/train.c), which builds the transforms after the source. */
#ifndef MR_TRAIN_TRAIN_SOURCE_IMPL_H
#define MR_TRAIN_TRAIN_SOURCE_IMPL_H

#include "data/data.h"
#include "train/train.h"

/* The classifier's source for training (train != 0) or evaluation, as c->data_source says: a
 * dataset of ("image" u8 (H, W, ...), "label" i32 []) exactly like mr_data_from_idx's, whatever
 * the files (IDX, HDF5, .npy/.npz, TFRecord), so the rest of the pipeline and the bits it yields
 * are the same. A glob or list of files is read as one dataset in sorted-name (list) order
 * (mr_data_concat). Labels of another integer dtype or shape [1] are converted (a value outside
 * int32 fails next() naming the element); images must be u8. Errors: the source's, naming the
 * file; MR_ERR_UNSUPPORTED naming the file for a non-u8 image or a non-integer label;
 * MR_ERR_FORMAT when files of a set disagree on the element spec, or image and label lists
 * differ in length. */
mr_status tr_open_source(const mr_train_cfg *c, int train, mr_dataset **out) MR_WUR;

/* A token source (c->train_tokens / eval_tokens, maybe a glob or list) of windows of `window`
 * tokens: mr_data_from_tokens per file, concatenated. */
mr_status tr_open_tokens(const mr_train_cfg *c, int train, int64_t window, mr_dataset **out) MR_WUR;

#endif
