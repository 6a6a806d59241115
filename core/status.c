/* Thread-local error message storage for mr_status (see status.h) and the leveled logger. */
#include "core/status.h"
#include "core/log.h"

#include <stdarg.h>
#include <string.h>
#include <stdatomic.h>

static _Thread_local char tl_err[1024];
static _Thread_local char tl_where[128];

const char *mr_status_name(mr_status s) {
    switch (s) {
    case MR_OK: return "MR_OK";
    case MR_ERR_INVALID: return "MR_ERR_INVALID";
    case MR_ERR_NOMEM: return "MR_ERR_NOMEM";
    case MR_ERR_UNSUPPORTED: return "MR_ERR_UNSUPPORTED";
    case MR_ERR_IO: return "MR_ERR_IO";
    case MR_ERR_DEVICE: return "MR_ERR_DEVICE";
    case MR_ERR_COMM: return "MR_ERR_COMM";
    case MR_ERR_FORMAT: return "MR_ERR_FORMAT";
    case MR_ERR_NOT_FOUND: return "MR_ERR_NOT_FOUND";
    case MR_ERR_INTERNAL: return "MR_ERR_INTERNAL";
    case MR_ERR_NUMERIC: return "MR_ERR_NUMERIC";
    }
    return "MR_ERR_UNKNOWN";
}

mr_status mr_set_error_at(mr_status s, const char *file, int line, const char *fmt, ...) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    /* formatted aside first: the arguments may quote tl_err itself (wrapping an inner error) */
    char msg[sizeof tl_err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(tl_err, msg, sizeof tl_err);
    snprintf(tl_where, sizeof tl_where, "%s:%d", base, line);
    return s;
}

const char *mr_last_error(void) { return tl_err; }

const char *mr_last_error_where(void) { return tl_where; }

void mr_clear_error(void) { tl_err[0] = tl_where[0] = '\0'; }

/* -1 means "not read from the environment yet". */
static atomic_int g_level = -1;

void mr_log_set_level(mr_log_level level) { atomic_store(&g_level, (int)level); }

mr_log_level mr_log_get_level(void) {
    int l = atomic_load(&g_level);
    if (l < 0) {
        const char *e = getenv("MIRROR_LOG");
        l = MR_LOG_INFO;
        if (e) {
            if (!strcmp(e, "error")) l = MR_LOG_ERROR;
            else if (!strcmp(e, "warn")) l = MR_LOG_WARN;
            else if (!strcmp(e, "debug")) l = MR_LOG_DEBUG;
        }
        atomic_store(&g_level, l);
    }
    return (mr_log_level)l;
}

static atomic_int g_progress_open;

void mr_log_progress_open(int open) { atomic_store(&g_progress_open, open ? 1 : 0); }

void mr_log_progress_end(void) {
    if (atomic_exchange(&g_progress_open, 0)) {
        fputc('\n', stdout);
        fflush(stdout);
    }
}

void mr_log_at(mr_log_level level, const char *file, int line, const char *fmt, ...) {
    if ((int)level > (int)mr_log_get_level()) return;
    mr_log_progress_end(); /* a message starts on a line of its own */
    static const char *names[] = {"error", "warn", "info", "debug"};
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (level == MR_LOG_DEBUG) {
        const char *base = strrchr(file, '/');
        fprintf(stderr, "mirror %s %s:%d: %s\n", names[level], base ? base + 1 : file, line, msg);
    } else {
        fprintf(stderr, "mirror %s: %s\n", names[level], msg);
    }
}
