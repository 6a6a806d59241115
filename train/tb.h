/* TensorBoard event files: <dir>/events.out.tfevents.<unix time>.<host>.<pid>, the format
 * TensorFlow's tf.summary and PyTorch's SummaryWriter write, read by TensorBoard, tbparse and
 * TensorFlow's summary_iterator.
 *
 * The file is TFRecord framing (data/tfrecord.h: length, masked CRC-32C, data, masked CRC-32C)
 * around `Event` protobufs (proto/tensorboard.proto, the subset of TensorBoard's protos mirror
 * writes; encoded by protobuf-c's generated code, not by hand). The first event names the file
 * version ("brain.Event:2"). Scalars are Summary values with simple_value (one Event per call:
 * all the scalars of a log step together); text is a string tensor for the text plugin;
 * histograms are HistogramProto over TensorFlow's default bucket limits (+-1e-12 * 1.1^k up to
 * 1e20, 0 and +-DBL_MAX), runs of empty buckets merged as TensorFlow does. The time in a new
 * file's name is past every earlier file's of the directory, so name order is run order.
 *
 * Resume. A run that starts at step S (0 when fresh, the checkpoint's step when resumed) opens a
 * new file (TensorBoard reads every file of the directory, in name order) that starts with
 * SessionLog START at step S + 1: readers drop the earlier runs' events after S (those a killed
 * run logged past its last checkpoint, which the resumed run logs again; a fresh start's
 * predecessor killed before any checkpoint), so the directory shows one curve, as metrics.jsonl
 * keeps only its lines up to S.
 *
 * Writes are buffered in the FILE and flushed by mr_tb_flush (the trainer calls it at every log
 * step, so a killed run loses at most one interval). No allocation after mr_tb_open except when
 * an event is larger than any before (the encoding buffer grows). Not thread-safe. */
#ifndef MR_TRAIN_TB_H
#define MR_TRAIN_TB_H

#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_tb mr_tb;

/* Creates dir (and parents) and a new event file in it for a run starting at start_step (the
 * SessionLog START above). MR_ERR_IO naming the path. */
mr_status mr_tb_open(const char *dir, int64_t start_step, mr_tb **out) MR_WUR;

/* One event at step with n scalars (tags[i], values[i]). MR_ERR_IO naming the file. */
mr_status mr_tb_scalars(mr_tb *tb, int64_t step, int n, const char *const *tags, const double *values) MR_WUR;

/* A text summary (TensorBoard's text plugin renders it as markdown). */
mr_status mr_tb_text(mr_tb *tb, int64_t step, const char *tag, const char *text) MR_WUR;

/* A histogram of n floats. Non-finite values are left out (num is the finite count, the sum of
 * the buckets); none finite gives no event. */
mr_status mr_tb_histogram(mr_tb *tb, int64_t step, const char *tag, const float *x, int64_t n) MR_WUR;

/* Flushes the FILE (fflush; the data is in the kernel's hands). MR_ERR_IO. */
mr_status mr_tb_flush(mr_tb *tb) MR_WUR;

/* The event file's path. */
const char *mr_tb_path(const mr_tb *tb);

/* Flushes and closes. NULL is a no-op. */
void mr_tb_close(mr_tb *tb);

#ifdef __cplusplus
}
#endif
#endif
