/* The local backend: n replicas in one process, one thread each, sharing memory.
 *
 * Each collective is a generation-counted rendezvous under one mutex and condition variable:
 * every rank posts its call (mr_coll) into its slot and waits, with pthread_cond_timedwait on
 * CLOCK_MONOTONIC, until all n have arrived (phase 1); then each reads the others' buffers
 * directly, and a second rendezvous (phase 2) keeps those buffers alive until everybody is done
 * reading. Reductions add contributions in rank order 0..n-1, so every replica gets the bits of a
 * serial loop. The all-reduce splits the elements into n chunks, each rank reducing one chunk into
 * a shared scratch buffer that all copy out after phase 2, so the additions run in parallel.
 *
 * The last rank to arrive at phase 1 checks that all calls agree (kind, count, dtype, op, root)
 * and prepares shared state (scratch, duplicated groups). A timeout, a mismatch or
 * mr_comm_abort poisons the family (the group and every group duplicated from it, which share
 * the mutex): every pending and future collective then fails at once with the reason. */
#include "distribute/comm_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"

/* Shared by a group and every group duplicated from it. */
typedef struct local_family {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC; signalled on every phase completion and on poisoning */
    int groups;        /* groups alive */
    int poisoned;
    char poison[512];
} local_family;

typedef struct local_group {
    local_family *fam;
    int size;
    int comms;         /* communicators alive */
    double timeout_s;
    uint64_t gen;      /* rendezvous phases completed */
    int arrived;       /* ranks in the current phase */
    uint64_t *entered; /* [size] phases each rank has entered (rank r is in phase gen when == gen + 1) */
    mr_coll *calls;    /* [size] each rank's current (or last) collective */
    void *scratch;     /* all-reduce result, scratch_bytes */
    size_t scratch_bytes;
    /* Written by phase 1's last arrival, read by every rank before it can enter the next phase. */
    mr_status phase_st;
    char phase_msg[256];
    mr_comm **dup; /* [size] MR_COLL_DUP result */
} local_group;

static const mr_comm_vtable local_vtable;

static void group_destroy(local_group *g) {
    free(g->entered);
    free(g->calls);
    free(g->scratch);
    free(g->dup);
    free(g);
}

/* A new family (mutex, and a condition variable on CLOCK_MONOTONIC), or NULL. */
static local_family *family_new(void) {
    local_family *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) goto fail_free;
    int ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&f->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok) goto fail_free;
    if (pthread_mutex_init(&f->mu, NULL) != 0) {
        pthread_cond_destroy(&f->cv);
        goto fail_free;
    }
    return f;
fail_free:
    free(f);
    return NULL;
}

static void family_destroy(local_family *f) {
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

/* A new group of n in family fam (NULL: a new family) with n communicator shells in comms.
 * For a new family, nothing else references it; for an existing one, the caller holds fam->mu. */
static mr_status group_new(local_family *fam, int n, double timeout_s, mr_comm **comms) {
    mr_status st = MR_OK;
    local_family *newfam = NULL;
    local_group *g = NULL;
    int r = 0;
    if (!fam) {
        newfam = family_new();
        MR_CHECK(newfam, MR_ERR_NOMEM, "local communicator: out of memory (or pthread init failed)");
        fam = newfam;
    }
    g = calloc(1, sizeof *g);
    MR_CHECK(g, MR_ERR_NOMEM, "local communicator: out of memory");
    g->fam = fam;
    g->size = n;
    g->timeout_s = timeout_s;
    g->entered = calloc((size_t)n, sizeof *g->entered);
    g->calls = calloc((size_t)n, sizeof *g->calls);
    MR_CHECK(g->entered && g->calls, MR_ERR_NOMEM, "local communicator: out of memory for %d ranks", n);
    for (r = 0; r < n; r++) {
        comms[r] = mr_comm_alloc(&local_vtable, MR_COMM_LOCAL, r, n, timeout_s);
        MR_CHECK(comms[r], MR_ERR_NOMEM, "local communicator: out of memory");
        comms[r]->ctx = g;
    }
    g->comms = n;
    fam->groups++;
    return MR_OK;
fail:
    while (r-- > 0) {
        free(comms[r]);
        comms[r] = NULL;
    }
    if (g) group_destroy(g);
    if (newfam) family_destroy(newfam);
    return st;
}

mr_status mr_comm_local_new(int n, double timeout_s, mr_comm **comms) {
    mr_status st = MR_OK;
    MR_CHECK(n >= 1 && n <= 4096, MR_ERR_INVALID, "mr_comm_local_new: %d replicas (1..4096)", n);
    MR_CHECK(timeout_s > 0 && timeout_s < 1e9, MR_ERR_INVALID, "mr_comm_local_new: timeout %g s (must be > 0)",
             timeout_s);
    MR_CHECK(comms, MR_ERR_INVALID, "mr_comm_local_new: comms is NULL");
    mr_comm **tmp = calloc((size_t)n, sizeof *tmp);
    MR_CHECK(tmp, MR_ERR_NOMEM, "mr_comm_local_new: out of memory");
    st = group_new(NULL, n, timeout_s, tmp);
    if (st == MR_OK) memcpy(comms, tmp, (size_t)n * sizeof *tmp);
    free(tmp);
fail:
    return st;
}

static void deadline_after(double s, struct timespec *ts) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    double whole = (double)(long long)s;
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((s - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

static void poison(local_family *f, const char *msg) {
    if (f->poisoned) return;
    f->poisoned = 1;
    snprintf(f->poison, sizeof f->poison, "%s", msg);
    pthread_cond_broadcast(&f->cv);
}

/* The other ranks disagree with rank 0 about this collective: describes both calls, else "". */
static void find_mismatch(const mr_comm *c, const local_group *g, char *out, size_t cap) {
    out[0] = '\0';
    const mr_coll *a = &g->calls[0];
    for (int q = 1; q < g->size; q++) {
        const mr_coll *b = &g->calls[q];
        int same = a->kind == b->kind && a->n == b->n && a->dt == b->dt;
        if (same && (a->kind == MR_COLL_ALLREDUCE || a->kind == MR_COLL_REDUCE_SCATTER)) same = a->op == b->op;
        if (same && a->kind == MR_COLL_BROADCAST) same = a->root == b->root;
        if (a->kind == b->kind && (a->kind == MR_COLL_BARRIER || a->kind == MR_COLL_DUP)) same = 1;
        if (!same) {
            char da[160], db[160];
            mr_coll_describe(c, a, da, sizeof da);
            mr_coll_describe(c, b, db, sizeof db);
            snprintf(out, cap, "collectives differ: rank 0 called %s, rank %d called %s", da, q, db);
            return;
        }
    }
}

/* Phase 1's last arrival: checks the calls agree and prepares shared state. Holds fam->mu.
 * Returns 0 when it poisoned the family. */
static int prepare(const mr_comm *c, local_group *g, const mr_coll *op) {
    char mm[400];
    find_mismatch(c, g, mm, sizeof mm);
    if (mm[0]) {
        poison(g->fam, mm);
        return 0;
    }
    g->phase_st = MR_OK;
    g->phase_msg[0] = '\0';
    if (op->kind == MR_COLL_ALLREDUCE) {
        size_t bytes = (size_t)op->n * mr_dtype_size(op->dt);
        if (bytes > g->scratch_bytes) {
            void *s = malloc(bytes);
            if (!s) {
                g->phase_st = MR_ERR_NOMEM;
                snprintf(g->phase_msg, sizeof g->phase_msg, "out of memory for a %zu-byte all-reduce buffer", bytes);
            } else {
                free(g->scratch);
                g->scratch = s;
                g->scratch_bytes = bytes;
            }
        }
    } else if (op->kind == MR_COLL_DUP) {
        free(g->dup);
        g->dup = calloc((size_t)g->size, sizeof *g->dup);
        mr_status st = g->dup ? group_new(g->fam, g->size, g->timeout_s, g->dup) : MR_ERR_NOMEM;
        if (st != MR_OK) {
            g->phase_st = MR_ERR_NOMEM;
            snprintf(g->phase_msg, sizeof g->phase_msg, "out of memory for a duplicate group of %d", g->size);
        }
    }
    return 1;
}

/* Waits until every rank of the group has entered this phase (first: phase 1 of op, whose call
 * is posted for the others to read), the family is poisoned, or the deadline passes. */
static mr_status rendezvous(mr_comm *c, const mr_coll *op, int first) {
    local_group *g = c->ctx;
    local_family *f = g->fam;
    mr_status st = MR_OK;
    char d[160];
    pthread_mutex_lock(&f->mu);
    uint64_t my = g->gen;
    if (f->poisoned) goto poisoned;
    if (first) g->calls[c->rank] = *op;
    g->entered[c->rank] = my + 1;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        if (first && !prepare(c, g, op)) goto poisoned;
        g->gen++;
        pthread_cond_broadcast(&f->cv);
    } else {
        struct timespec ts;
        deadline_after(g->timeout_s, &ts);
        while (g->gen == my && !f->poisoned) {
            int rc = pthread_cond_timedwait(&f->cv, &f->mu, &ts);
            if (rc == ETIMEDOUT && g->gen == my && !f->poisoned) {
                /* Name the ranks that have not come, and what each did last. */
                char who[256] = "", tmp[200];
                size_t len = 0;
                int missing = 0;
                for (int q = 0; q < g->size && len + 1 < sizeof who; q++) {
                    if (g->entered[q] == my + 1) continue;
                    missing++;
                    if (g->calls[q].seq == 0) {
                        snprintf(tmp, sizeof tmp, "%srank %d (no collective yet)", missing > 1 ? ", " : "", q);
                    } else {
                        char ld[120];
                        mr_coll_describe(c, &g->calls[q], ld, sizeof ld);
                        snprintf(tmp, sizeof tmp, "%srank %d (last in %s)", missing > 1 ? ", " : "", q, ld);
                    }
                    snprintf(who + len, sizeof who - len, "%s", tmp);
                    len = strlen(who);
                }
                mr_coll_describe(c, op, d, sizeof d);
                char pm[512];
                snprintf(pm, sizeof pm, "rank %d gave up on %s after %g s waiting for %s", c->rank, d, g->timeout_s,
                         who);
                poison(f, pm);
                pthread_mutex_unlock(&f->mu);
                return mr_set_error(MR_ERR_COMM, "%s on rank %d: no progress for %g s: %d of %d ranks missing: %s; %s",
                                    d, c->rank, g->timeout_s, missing, g->size, who, MR_COMM_HINT);
            }
        }
        if (g->gen == my) goto poisoned;
    }
    if (first && g->phase_st != MR_OK) {
        mr_coll_describe(c, op, d, sizeof d);
        st = mr_set_error(g->phase_st, "%s on rank %d: %s", d, c->rank, g->phase_msg);
    }
    pthread_mutex_unlock(&f->mu);
    return st;
poisoned:
    mr_coll_describe(c, op, d, sizeof d);
    st = mr_set_error(MR_ERR_COMM, "%s on rank %d: the group failed: %s", d, c->rank, f->poison);
    pthread_mutex_unlock(&f->mu);
    return st;
}

static mr_status local_collective(mr_comm *c, const mr_coll *op) {
    mr_status st = MR_OK;
    local_group *g = c->ctx;
    const int r = c->rank, n = g->size;
    const size_t es = mr_dtype_size(op->dt);
    MR_TRY(rendezvous(c, op, 1));
    /* Phase 1 done: every rank's call is in g->calls and stays valid until phase 2. */
    switch (op->kind) {
    case MR_COLL_ALLREDUCE: {
        int64_t base = op->n / n, rem = op->n % n;
        int64_t lo = base * r + (r < rem ? r : rem), hi = lo + base + (r < rem ? 1 : 0);
        char *out = (char *)g->scratch + (size_t)lo * es;
        if (hi > lo) {
            memcpy(out, (const char *)g->calls[0].buf + (size_t)lo * es, (size_t)(hi - lo) * es);
            for (int q = 1; q < n; q++)
                mr_comm_add_into(out, (const char *)g->calls[q].buf + (size_t)lo * es, hi - lo, op->dt);
            if (op->op == MR_REDUCE_AVG) mr_comm_div(out, hi - lo, op->dt, n);
        }
        MR_TRY(rendezvous(c, op, 0));
        if (op->n) memcpy(op->buf, g->scratch, (size_t)op->n * es);
        break;
    }
    case MR_COLL_BROADCAST:
        if (r != op->root && op->n) memcpy(op->buf, g->calls[op->root].buf, (size_t)op->n * es);
        MR_TRY(rendezvous(c, op, 0));
        break;
    case MR_COLL_ALLGATHER:
        for (int q = 0; q < n && op->n; q++) {
            char *dst = (char *)op->buf + (size_t)q * (size_t)op->n * es;
            if (dst != g->calls[q].send) memcpy(dst, g->calls[q].send, (size_t)op->n * es);
        }
        MR_TRY(rendezvous(c, op, 0));
        break;
    case MR_COLL_REDUCE_SCATTER:
        if (op->n) {
            size_t off = (size_t)r * (size_t)op->n * es;
            memcpy(op->buf, (const char *)g->calls[0].send + off, (size_t)op->n * es);
            for (int q = 1; q < n; q++) mr_comm_add_into(op->buf, (const char *)g->calls[q].send + off, op->n, op->dt);
            if (op->op == MR_REDUCE_AVG) mr_comm_div(op->buf, op->n, op->dt, n);
        }
        MR_TRY(rendezvous(c, op, 0));
        break;
    case MR_COLL_BARRIER: break;
    case MR_COLL_DUP:
        /* g->dup stays put until every rank has entered the next phase, i.e. has taken its own. */
        pthread_mutex_lock(&g->fam->mu);
        *op->dup_out = g->dup[r];
        g->dup[r] = NULL;
        pthread_mutex_unlock(&g->fam->mu);
        break;
    }
fail:
    return st;
}

static void local_abort(mr_comm *c, int code, const char *why) {
    local_group *g = c->ctx;
    char msg[512];
    snprintf(msg, sizeof msg, "rank %d aborted (code %d): %s", c->rank, code, why);
    mr_log_error("local communicator: %s", msg);
    pthread_mutex_lock(&g->fam->mu);
    poison(g->fam, msg);
    pthread_mutex_unlock(&g->fam->mu);
}

static void local_destroy(mr_comm *c) {
    local_group *g = c->ctx;
    local_family *f = g->fam;
    pthread_mutex_lock(&f->mu);
    int last_group = 0;
    if (--g->comms == 0) {
        /* Shells of a duplicate that some rank never took (its dup failed) go with the group. */
        if (g->dup) {
            for (int q = 0; q < g->size; q++) {
                if (!g->dup[q]) continue;
                local_group *dg = g->dup[q]->ctx;
                free(g->dup[q]);
                if (--dg->comms == 0) {
                    group_destroy(dg);
                    f->groups--;
                }
            }
        }
        group_destroy(g);
        last_group = --f->groups == 0;
    }
    pthread_mutex_unlock(&f->mu);
    if (last_group) family_destroy(f);
}

static const mr_comm_vtable local_vtable = {
    .name = "local", .collective = local_collective, .abort = local_abort, .destroy = local_destroy};
