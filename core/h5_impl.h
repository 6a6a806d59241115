/* Private: what every HDF5 user in mirror (data/source_hdf5.c, checkpoint/) shares — one
 * process-wide lock and one way to turn an HDF5 failure into an mr_status message. One lock, not
 * one per module: a non-thread-safe HDF5 build has a single global state, so two modules each
 * with their own mutex would still race. Includes hdf5.h: never include it from a public header. */
#ifndef MR_H5_IMPL_H
#define MR_H5_IMPL_H

#include <stdio.h>

#include <hdf5.h>

#include "core/status.h"

/* Bracket every run of HDF5 calls: holds the process-wide HDF5 lock (recursive, so a bracketed
 * helper may call another) and silences HDF5's automatic error printing for the calling thread. */
void mr_h5_enter(void);
void mr_h5_leave(void);

/* The reason for the HDF5 failure that just happened on this thread: strerror of the errno HDF5
 * recorded ("File too large") when a system call failed, else HDF5's innermost description.
 * Call inside mr_h5_enter/leave. */
const char *mr_h5_reason(char buf[256]);

/* One wrapper for HDF5 calls: a negative result becomes `code` with the message and HDF5's reason,
 * and jumps to fail. Needs `mr_status st` and `char h5e[256]` in scope. */
#define MR_TRY_H5(expr, code, ...)                                                                 \
    do {                                                                                           \
        if ((expr) < 0) {                                                                          \
            char mr_h5_m_[512];                                                                    \
            snprintf(mr_h5_m_, sizeof mr_h5_m_, __VA_ARGS__);                                      \
            st = mr_set_error((code), "%s: %s", mr_h5_m_, mr_h5_reason(h5e));                      \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

#endif
