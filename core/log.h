/* Leveled logging to stderr. The level comes from mr_log_set_level() or, at first use, from
 * the MIRROR_LOG environment variable (error|warn|info|debug). Thread-safe: one line is written
 * with one fprintf call. */
#ifndef MR_LOG_H
#define MR_LOG_H

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_log_level { MR_LOG_ERROR = 0, MR_LOG_WARN = 1, MR_LOG_INFO = 2, MR_LOG_DEBUG = 3 } mr_log_level;

void mr_log_set_level(mr_log_level level);
mr_log_level mr_log_get_level(void);
void mr_log_at(mr_log_level level, const char *file, int line, const char *fmt, ...) MR_PRINTF(4, 5);

/* Progress lines on a terminal end in "\r...", not a newline. mr_log_progress_open(1) says that
 * stdout now ends in such a line: the next message (or mr_log_progress_end) first ends it with a
 * newline, so that a message never lands in the middle of a progress line. Thread-safe. */
void mr_log_progress_open(int open);
void mr_log_progress_end(void);

#define mr_log_error(...) mr_log_at(MR_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define mr_log_warn(...) mr_log_at(MR_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define mr_log_info(...) mr_log_at(MR_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define mr_log_debug(...) mr_log_at(MR_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
