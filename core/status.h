/* Status codes, the thread-local last-error message, and the one cleanup-path idiom.
 *
 * Library code never exits: every fallible call returns mr_status (MR_OK = 0, negative on error)
 * and records a "what: why" message that mr_last_error() returns on the same thread, and apart
 * from it the C source position that raised it (mr_last_error_where(): "file.c:line"), so that a
 * user-facing message never starts with mirror's own file names (the CLI prints the position only
 * at MIRROR_LOG=debug). Only launch/ maps a status to an exit code. */
#ifndef MR_STATUS_H
#define MR_STATUS_H

#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_status {
    MR_OK = 0,
    MR_ERR_INVALID = -1,     /* bad argument: shape, dtype, value out of range */
    MR_ERR_NOMEM = -2,       /* host or device allocation failed */
    MR_ERR_UNSUPPORTED = -3, /* the backend cannot run this op/dtype combination */
    MR_ERR_IO = -4,          /* file or stream error */
    MR_ERR_DEVICE = -5,      /* CUDA/cuBLAS/cuDNN/NCCL failure */
    MR_ERR_COMM = -6,        /* collective failure or deadline expired */
    MR_ERR_FORMAT = -7,      /* malformed input file or config */
    MR_ERR_NOT_FOUND = -8,   /* missing file, key, symbol or device */
    MR_ERR_INTERNAL = -9,    /* a bug in mirror */
    MR_ERR_NUMERIC = -10     /* a computation went non-finite (a diverging training run) */
} mr_status;

#if defined(__GNUC__) || defined(__clang__)
#define MR_WUR __attribute__((warn_unused_result))
#define MR_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MR_WUR
#define MR_PRINTF(f, a)
#endif

/* Name of a status ("MR_ERR_INVALID"); never NULL. Thread-safe. */
const char *mr_status_name(mr_status s);

/* Records the calling thread's last error: the message <formatted> (which may quote the previous
 * mr_last_error()) and, separately, the position "<basename of file>:line". Returns `s`, so
 * that `return mr_set_error(...)` and `st = mr_set_error(...)` read naturally. */
mr_status mr_set_error_at(mr_status s, const char *file, int line, const char *fmt, ...)
    MR_PRINTF(4, 5);
#define mr_set_error(s, ...) mr_set_error_at((s), __FILE__, __LINE__, __VA_ARGS__)

/* The calling thread's last error message ("" when none), without a C source position. Valid
 * until the next error on this thread. */
const char *mr_last_error(void);

/* Where in mirror's C source the calling thread's last error was raised ("trainer.c:123"; ""
 * when none): for debug logs and bug reports, not for users. */
const char *mr_last_error_where(void);

/* Clears the calling thread's last error. */
void mr_clear_error(void);

/* Run `expr` (an mr_status); on failure store it in `st` and jump to `fail`. The function must
 * declare `mr_status st = MR_OK;` and a `fail:` label. */
#define MR_TRY(expr)                                                                            \
    do {                                                                                        \
        st = (expr);                                                                            \
        if (st != MR_OK) goto fail;                                                             \
    } while (0)

/* Fail with a message when `cond` is false. */
#define MR_CHECK(cond, code, ...)                                                               \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            st = mr_set_error((code), __VA_ARGS__);                                             \
            goto fail;                                                                          \
        }                                                                                       \
    } while (0)

/* For programmer bugs only: always compiled in, aborts with the location. Never put side effects
 * in `cond`. */
#define MR_ASSERT(cond)                                                                         \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "%s:%d: mirror internal error: assertion '%s' failed\n", __FILE__,   \
                    __LINE__, #cond);                                                           \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
