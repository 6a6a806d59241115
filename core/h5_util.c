/* The shared HDF5 lock and error text (see h5_impl.h). */
#include "core/h5_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The process's only HDF5 lock: a global because the library under it is global. */
static pthread_mutex_t g_h5_mu;
static pthread_once_t g_h5_once = PTHREAD_ONCE_INIT;

static void h5_init(void) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g_h5_mu, &a);
    pthread_mutexattr_destroy(&a);
}

void mr_h5_enter(void) {
    pthread_once(&g_h5_once, h5_init);
    pthread_mutex_lock(&g_h5_mu);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* errors become MR_ERR_* messages, not stderr dumps */
}

void mr_h5_leave(void) { pthread_mutex_unlock(&g_h5_mu); }

typedef struct h5_walk_ctx {
    char *buf;
    int err; /* the first errno found in the stack, 0 if none */
} h5_walk_ctx;

static herr_t h5_walk(unsigned n, const H5E_error2_t *e, void *p) {
    h5_walk_ctx *c = p;
    if (!e->desc) return 0;
    if (n == 0) snprintf(c->buf, 256, "%s", e->desc);
    const char *s = strstr(e->desc, "errno = ");
    if (s && !c->err) c->err = atoi(s + 8);
    return 0;
}

const char *mr_h5_reason(char buf[256]) {
    h5_walk_ctx c = {buf, 0};
    buf[0] = '\0';
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5_walk, &c); /* innermost (most specific) first */
    if (c.err > 0) snprintf(buf, 256, "%s", strerror(c.err));
    else if (!buf[0]) snprintf(buf, 256, "unknown HDF5 error");
    return buf;
}
