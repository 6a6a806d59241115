/* The trace window of a training run (mr_train_cfg.trace_first .. trace_last; README.md "Tracing
 * steps"; the recorder: core/trace.h).
 *
 * Every replica records into its own recorder (pid = its global replica index) on up to three
 * tracks: the training thread (step, data_wait, forward, backward, exchange, wait_buckets,
 * optimizer, report, evaluate, checkpoint_save; its collectives; per-op spans with trace_ops),
 * the communication thread (each bucket's all-reduce with its bytes, and a flow from the moment
 * the bucket was queued) and the data prefetch thread (each round it materializes). The tracks
 * and the modules' pointers to them are set up when the run starts (tr_trace_init), but buffers
 * are reserved only just before the window opens, so a run whose window lies far ahead holds no
 * trace memory and the steps outside the window pay one relaxed load per span point.
 *
 * Opening (tr_trace_step_begin, before the window's first step): buffers sized from the step's
 * kernels, buckets and micro-batches, bounded by MIRROR_TRACE_MB (64 MiB per replica; beyond it
 * spans are dropped, counted and reported); the replicas' identities (host, kernel boot id, OS
 * pid) allgathered; rank 0's clock measured against one replica of each other process
 * (mr_comm_clock_offset, best of CLOCK_ROUNDS ping-pongs).
 * Closing (tr_trace_step_end, after the window's last step, or the step the run ended or was
 * stopped at): the clocks measured again, every replica's events packed and sent to replica 0
 * (one broadcast from each replica in turn, so no replica holds more than its own and the
 * largest other part), which writes <run_dir>/trace.json atomically. Collective: every replica
 * opens and closes at the same step (the window and the stop are agreed). A run that fails inside
 * the window writes replica 0's own part (no collectives: the others may be gone).
 *
 * Clocks. Replicas of one process share its clock exactly (shift 0). Processes on one kernel
 * (the same /proc/sys/kernel/random/boot_id) share CLOCK_MONOTONIC too: their shift is 0 unless
 * the measurement contradicts it (|offset| beyond its error bound: a time namespace) or
 * MIRROR_TRACE_CLOCK=measured asks for the measured one. Other processes get the measured
 * offsets, interpolated between the window's start and end (a drifting clock). The trace's
 * otherData holds every measurement, its error bound and the shift applied. */
#include "train/train_impl.h"
#include "core/log.h"
#include "core/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef MIRROR_VERSION
#define MIRROR_VERSION "unknown"
#endif

#define CLOCK_ROUNDS 10
#define DEFAULT_BOUND_MB 64
enum { TID_TRAIN = 1, TID_COMM = 2, TID_DATA = 3 };

/* What tells two replicas' clocks apart (allgathered at the window's start). */
struct tr_trace_ident {
    char host[64];
    char boot[48]; /* the kernel's boot id ("" when unknown) */
    int64_t os_pid;
};

/* Rank 0's measurement of one other process's clock (at the window's start [0] and end [1]). */
struct tr_trace_clock {
    int rep;                  /* the replica measured: the process's first */
    int64_t at[2];            /* rank 0's clock when measured */
    int64_t offset[2], err[2]; /* the process's clock minus rank 0's, and the bound */
};

static void read_ident(tr_trace_ident *id) {
    memset(id, 0, sizeof *id);
    if (gethostname(id->host, sizeof id->host - 1) != 0) snprintf(id->host, sizeof id->host, "?");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(id->boot, sizeof id->boot, f)) id->boot[0] = '\0';
        fclose(f);
        id->boot[strcspn(id->boot, "\n")] = '\0';
    }
    id->os_pid = (int64_t)getpid();
}

static int same_process(const tr_trace_ident *a, const tr_trace_ident *b) {
    return a->os_pid == b->os_pid && !strcmp(a->host, b->host) && !strcmp(a->boot, b->boot);
}

static int same_kernel(const tr_trace_ident *a, const tr_trace_ident *b) {
    return a->boot[0] && !strcmp(a->boot, b->boot);
}

/* The process's first replica: the one whose clock stands for all of them. */
static int rep_of(const tr_trace *tt, int r) {
    for (int q = 0; q < r; q++)
        if (same_process(&tt->ids[q], &tt->ids[r])) return q;
    return r;
}

/* "rank 1", "replica 1", "replica 3 (rank 1)": what the process is called in the viewer. */
static void part_name(const trainer *t, char *out, size_t cap) {
    const mr_comm_backend b = t->comm ? mr_comm_backend_of(t->comm) : MR_COMM_LOCAL;
    const int n_local = t->c.replicas > 1 ? t->c.replicas : 1;
    if (b == MR_COMM_MPI) snprintf(out, cap, "rank %d", t->rank);
    else if (b == MR_COMM_HIER) snprintf(out, cap, "replica %d (rank %d)", t->rank, t->rank / n_local);
    else snprintf(out, cap, "replica %d", t->rank);
}

mr_status tr_trace_init(trainer *t, const mr_step *s, int job_has_run_dir) {
    mr_status st = MR_OK;
    tr_trace *tt = &t->trace;
    const mr_train_cfg *c = &t->c;
    memset(tt, 0, sizeof *tt);
    if (c->trace_first <= 0 || c->trace_last < c->trace_first || !job_has_run_dir || t->step >= c->trace_last ||
        t->step >= c->steps)
        return MR_OK; /* no window, nowhere to write it, or a resumed run already past it */
    char name[64], label[160];
    tr_trace_ident me;
    read_ident(&me);
    part_name(t, name, sizeof name);
    snprintf(label, sizeof label, "host %s, pid %lld", me.host, (long long)me.os_pid);
    MR_TRY(mr_trace_new(t->rank, name, label, &tt->rec));
    MR_TRY(mr_trace_add_track(tt->rec, "training", TID_TRAIN, &tt->train));
    if (mr_ddp_overlaps(t->ddp)) MR_TRY(mr_trace_add_track(tt->rec, "communication", TID_COMM, &tt->comm));
    MR_TRY(mr_trace_add_track(tt->rec, "data prefetch", TID_DATA, &tt->data));
    /* the modules' pointers, set once: outside the window they cost one relaxed load */
    mr_comm_set_trace(t->comm, tt->train);
    if (t->dv.gcomm && t->dv.gcomm != t->comm) mr_comm_set_trace(t->dv.gcomm, tt->train);
    mr_ddp_set_trace(t->ddp, tt->train, tt->comm);
    mr_data_iter_set_trace(t->train.it, tt->data);
    if (c->trace_ops) mr_plan_set_trace(s->plan, tt->train);
    tt->kernels = mr_plan_num_kernels(s->plan);
    /* the environment is read now, not when the window opens hours later */
    tt->bound_mb = DEFAULT_BOUND_MB;
    const char *env = getenv("MIRROR_TRACE_MB");
    if (env && *env) {
        char *end = NULL;
        const double v = strtod(env, &end);
        MR_CHECK(end && *end == '\0' && v > 0 && v <= 1048576, MR_ERR_INVALID,
                 "MIRROR_TRACE_MB: '%s' is not a size in MiB (> 0, up to 1048576); HINT: unset it for the default of %d",
                 env, DEFAULT_BOUND_MB);
        tt->bound_mb = v;
    }
    const char *clk = getenv("MIRROR_TRACE_CLOCK");
    tt->force_measured = clk && !strcmp(clk, "measured");
    tt->want = 1;
    return MR_OK;
fail:
    tr_trace_free(t);
    return st;
}

void tr_trace_free(trainer *t) {
    tr_trace *tt = &t->trace;
    /* the modules that hold the tracks (queue, prefetch thread) are freed before this */
    mr_trace_free(tt->rec);
    free(tt->ids);
    free(tt->clocks);
    memset(tt, 0, sizeof *tt);
}

/* The measurements of the other processes' clocks (k: 0 at the start, 1 at the end). Collective
 * over the replicas. With replicas x ranks (the hierarchical backend) the ping-pong runs between
 * the processes' first replicas over the job's MPI communicator (t->c.comm, which only they use),
 * not through the local stages of the hierarchical one, whose thread hand-offs would widen the
 * round trip (measured: 2 ms against 1 us); the other replicas wait at their next collective. */
static mr_status measure_clocks(trainer *t, int k) {
    mr_status st = MR_OK;
    tr_trace *tt = &t->trace;
    mr_comm *via = t->comm;
    int per_process = 1;
    if (t->c.comm && t->comm != t->c.comm && t->c.replicas > 1) {
        if (t->rank % t->c.replicas != 0) return MR_OK;
        via = t->c.comm;
        per_process = t->c.replicas; /* replica r of rank p is p * replicas + r */
    }
    for (int i = 0; i < tt->nclocks; i++) {
        tr_trace_clock *m = &tt->clocks[i];
        MR_TRY(mr_comm_clock_offset(via, m->rep / per_process, CLOCK_ROUNDS, &m->offset[k], &m->err[k]));
        m->at[k] = mr_trace_now_ns();
    }
fail:
    return st;
}

/* The start of the window: buffers, identities, the first clock measurement. Collective. */
static mr_status open_window(trainer *t) {
    mr_status st = MR_OK;
    tr_trace *tt = &t->trace;
    const mr_train_cfg *c = &t->c;
    tt->first = t->step + 1;
    tt->last = c->trace_last < c->steps ? c->trace_last : c->steps;
    /* the events of the window's steps, with room to spare (64 bytes each) */
    const int64_t W = tt->last - tt->first + 1, A = c->accumulate, nb = mr_ddp_num_buckets(t->ddp);
    const int64_t K = tt->kernels * (c->trace_ops ? 2 : 1); /* op spans; a sync hook's all-reduce each */
    int64_t need[3] = {W * (32 + A * (8 + nb + K)), W * (4 + 2 * nb), W * (8 + 2 * A)};
    mr_trace_track *tracks[3] = {tt->train, tt->comm, tt->data};
    double want_mb = 0;
    for (int i = 0; i < 3; i++) {
        need[i] = tracks[i] ? need[i] + need[i] / 4 + 256 : 0;
        want_mb += (double)need[i] * 64.0 / 1048576.0;
    }
    const double bound_mb = tt->bound_mb;
    if (want_mb > bound_mb) {
        for (int i = 0; i < 3; i++) need[i] = (int64_t)((double)need[i] * bound_mb / want_mb);
        if (t->rank == 0)
            mr_log_warn("log.trace: steps %lld..%lld need about %.0f MiB of span buffers per replica, over the bound of "
                        "%g MiB: the spans past it are dropped and counted; HINT: a shorter window, log.trace_ops: "
                        "false, or MIRROR_TRACE_MB=%.0f",
                        (long long)tt->first, (long long)tt->last, want_mb, bound_mb, ceil(want_mb));
    }
    for (int i = 0; i < 3; i++)
        if (tracks[i]) MR_TRY(mr_trace_reserve(tracks[i], need[i]));
    /* who shares whose clock, and rank 0's first look at the others */
    tt->ids = calloc((size_t)t->world, sizeof *tt->ids);
    tt->clocks = calloc((size_t)t->world, sizeof *tt->clocks);
    MR_CHECK(tt->ids && tt->clocks, MR_ERR_NOMEM, "log.trace: out of memory");
    tr_trace_ident me;
    read_ident(&me);
    if (t->comm) MR_TRY(mr_comm_allgather(t->comm, &me, tt->ids, (int64_t)sizeof me, MR_U8));
    else tt->ids[0] = me;
    tt->nclocks = 0;
    for (int r = 1; r < t->world; r++)
        if (rep_of(tt, r) == r && !same_process(&tt->ids[0], &tt->ids[r])) tt->clocks[tt->nclocks++].rep = r;
    MR_TRY(measure_clocks(t, 0));
    tt->open = 1;
    if (t->rank == 0 && !c->quiet)
        mr_log_info("trace: recording steps %lld..%lld into %s/trace.json (%.1f MiB of span buffers per replica%s)",
                    (long long)tt->first, (long long)tt->last, c->run_dir, want_mb < bound_mb ? want_mb : bound_mb,
                    c->trace_ops ? ", per-op spans" : "");
    mr_trace_start(tt->rec);
fail:
    return st;
}

mr_status tr_trace_step_begin(trainer *t) {
    tr_trace *tt = &t->trace;
    if (!tt->want || tt->open || tt->done || t->step + 1 < t->c.trace_first) return MR_OK;
    return open_window(t);
}

/* ---- writing --------------------------------------------------------------------------------- */

/* A growing string for otherData. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int nomem;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) MR_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->nomem) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int w = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->nomem = 1;
            return;
        }
        if (b->p && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        const size_t cap = (b->cap + (size_t)w + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->nomem = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* A JSON string of s (host names, messages): quotes, backslashes and control characters escaped. */
static void sb_str(sbuf *b, const char *s) {
    sb_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') sb_printf(b, "\\%c", *p);
        else if (*p < 0x20) sb_printf(b, "\\u%04x", *p);
        else sb_printf(b, "%c", *p);
    }
    sb_printf(b, "\"");
}

/* The shift that puts replica r's timestamps on rank 0's clock, and why (into otherData). */
static mr_trace_clock clock_of(const tr_trace *tt, int r, int measured, const tr_trace_clock **used) {
    mr_trace_clock z = {0, 0, 0, 0};
    *used = NULL;
    if (!tt->ids || same_process(&tt->ids[0], &tt->ids[r])) return z;
    const int rep = rep_of(tt, r);
    const tr_trace_clock *m = NULL;
    for (int i = 0; i < tt->nclocks; i++)
        if (tt->clocks[i].rep == rep) m = &tt->clocks[i];
    if (!m) return z;
    *used = m;
    const int k1 = measured > 1 ? 1 : 0; /* the end too, when it was measured */
    const int agrees = llabs(m->offset[0]) <= m->err[0] && llabs(m->offset[k1]) <= m->err[k1];
    if (same_kernel(&tt->ids[0], &tt->ids[r]) && agrees && !tt->force_measured) return z;
    /* on the part's own clock: rank 0's time plus the offset */
    z.at0 = m->at[0] + m->offset[0];
    z.shift0 = -m->offset[0];
    z.at1 = m->at[k1] + m->offset[k1];
    z.shift1 = -m->offset[k1];
    return z;
}

/* otherData: the window, the clocks, every part's counts. */
static void write_meta(const trainer *t, sbuf *b, mr_trace *const *parts, const mr_trace_clock *clk, int n,
                       int measured, int64_t last_step, const char *partial) {
    const tr_trace *tt = &t->trace;
    int64_t events = 0, dropped = 0, max_err = 0;
    sb_printf(b, "\"mirror_version\": \"%s\", \"steps\": [%lld, %lld], \"window\": [%lld, %lld], \"replicas\": %d, "
                 "\"trace_ops\": %s",
              MIRROR_VERSION, (long long)tt->first, (long long)last_step, (long long)t->c.trace_first,
              (long long)t->c.trace_last, t->world, t->c.trace_ops ? "true" : "false");
    if (partial) {
        sb_printf(b, ", \"partial\": ");
        sb_str(b, partial);
    }
    sb_printf(b, ", \"parts\": [");
    for (int p = 0; p < n; p++) {
        const mr_trace_stats s = mr_trace_stats_of(parts[p], -1);
        events += s.events;
        dropped += s.dropped;
        sb_printf(b, "%s{\"pid\": %d, \"name\": ", p ? ", " : "", mr_trace_pid(parts[p]));
        sb_str(b, mr_trace_name(parts[p]));
        sb_printf(b, ", \"events\": %lld, \"dropped\": %lld", (long long)s.events, (long long)s.dropped);
        if (tt->ids) {
            const tr_trace_ident *id = &tt->ids[mr_trace_pid(parts[p])];
            sb_printf(b, ", \"host\": ");
            sb_str(b, id->host);
            sb_printf(b, ", \"os_pid\": %lld", (long long)id->os_pid);
        }
        sb_printf(b, ", \"clock_shift_ns\": [%lld, %lld]}", (long long)clk[p].shift0, (long long)clk[p].shift1);
    }
    sb_printf(b, "], \"events\": %lld, \"dropped\": %lld", (long long)events, (long long)dropped);
    sb_printf(b, ", \"clock\": {\"reference\": \"replica 0's CLOCK_MONOTONIC\", \"method\": \"ping-pong of two "
                 "broadcasts over the replicas' communicator, the shortest of %d round trips, at the window's start "
                 "and end; error = half that round trip\", \"measurements\": [",
              CLOCK_ROUNDS);
    for (int i = 0; i < tt->nclocks; i++) {
        const tr_trace_clock *m = &tt->clocks[i];
        const int k1 = measured > 1 ? 1 : 0;
        for (int k = 0; k <= k1; k++) max_err = m->err[k] > max_err ? m->err[k] : max_err;
        sb_printf(b, "%s{\"replica\": %d, \"same_kernel\": %s, \"offset_ns\": [%lld, %lld], \"error_ns\": [%lld, %lld]}",
                  i ? ", " : "", m->rep, same_kernel(&tt->ids[0], &tt->ids[m->rep]) ? "true" : "false",
                  (long long)m->offset[0], (long long)m->offset[k1], (long long)m->err[0], (long long)m->err[k1]);
    }
    sb_printf(b, "], \"max_error_ns\": %lld, \"applied\": \"%s\"}", (long long)max_err,
              tt->force_measured ? "measured (MIRROR_TRACE_CLOCK=measured)"
                                 : "0 within a process, and within a kernel when the measurement agrees; else "
                                   "measured, interpolated between the window's start and end");
}

/* Replica 0: the parts into <run_dir>/trace.json, and the log lines. A failure to write is a
 * warning: the run goes on. measured: clock measurements taken (1: start only, 2: start and end);
 * last_step: the window's last step in this run (a failed one included). */
static void write_trace(trainer *t, mr_trace *const *parts, int n, int measured, int64_t last_step,
                        const char *partial) {
    const tr_trace *tt = &t->trace;
    char path[4200];
    sbuf meta = {NULL, 0, 0, 0};
    mr_trace_clock *clk = calloc((size_t)(n > 0 ? n : 1), sizeof *clk);
    snprintf(path, sizeof path, "%s/trace.json", t->c.run_dir);
    if (!clk) {
        mr_log_warn("trace: out of memory: %s not written", path);
        return;
    }
    for (int p = 0; p < n; p++) {
        const tr_trace_clock *m = NULL;
        clk[p] = clock_of(tt, mr_trace_pid(parts[p]), measured, &m);
    }
    write_meta(t, &meta, parts, clk, n, measured, last_step, partial);
    if (meta.nomem) {
        mr_log_warn("trace: out of memory: %s not written", path);
    } else if (mr_trace_write_json(path, parts, clk, n, meta.p) != MR_OK) {
        mr_log_warn("%s; the run goes on without it", mr_last_error());
    } else if (!t->c.quiet) {
        int64_t events = 0, dropped = 0, max_err = 0;
        for (int p = 0; p < n; p++) {
            const mr_trace_stats s = mr_trace_stats_of(parts[p], -1);
            events += s.events;
            dropped += s.dropped;
        }
        char clocks[160] = "one process: one clock";
        for (int i = 0; i < tt->nclocks; i++)
            for (int k = 0; k < measured; k++) max_err = tt->clocks[i].err[k] > max_err ? tt->clocks[i].err[k] : max_err;
        if (tt->nclocks > 0)
            snprintf(clocks, sizeof clocks, "%d other process%s' clocks measured to within %.1f us by ping-pong",
                     tt->nclocks, tt->nclocks > 1 ? "es" : "", 1e-3 * (double)max_err);
        mr_log_info("trace: steps %lld..%lld of %d replica%s: %lld spans in %s (%s)", (long long)tt->first,
                    (long long)last_step, n, n > 1 ? "s" : "", (long long)events, path, clocks);
        if (dropped > 0)
            mr_log_warn("trace: %lld spans dropped: their buffers were full (MIRROR_TRACE_MB bounds them); the trace "
                        "ends early on the tracks that dropped them",
                        (long long)dropped);
    }
    free(meta.p);
    free(clk);
}

/* The end of the window: the clocks again, every part to replica 0, the file. Collective. */
static mr_status close_window(trainer *t) {
    mr_status st = MR_OK;
    tr_trace *tt = &t->trace;
    void *mine = NULL;
    unsigned char *buf = NULL;
    int64_t *sizes = NULL;
    mr_trace **parts = NULL;
    size_t bytes = 0;
    mr_trace_stop(tt->rec);
    tt->open = 0;
    tt->done = 1;
    MR_TRY(measure_clocks(t, 1));
    const int n = t->world;
    parts = calloc((size_t)n, sizeof *parts);
    sizes = calloc((size_t)n, sizeof *sizes);
    MR_CHECK(parts && sizes, MR_ERR_NOMEM, "log.trace: out of memory");
    if (n > 1) {
        /* replicas other than 0 pack; one broadcast each, so memory stays one part per replica */
        int64_t me = 0;
        if (t->rank != 0) {
            MR_TRY(mr_trace_pack(tt->rec, &mine, &bytes));
            me = (int64_t)bytes;
        }
        MR_TRY(mr_comm_allgather(t->comm, &me, sizes, 1, MR_I64));
        int64_t most = 1;
        for (int r = 1; r < n; r++) most = sizes[r] > most ? sizes[r] : most;
        buf = malloc((size_t)most);
        MR_CHECK(buf, MR_ERR_NOMEM, "log.trace: out of memory for %lld bytes of another replica's spans",
                 (long long)most);
        for (int r = 1; r < n; r++) {
            if (t->rank == r) memcpy(buf, mine, bytes);
            MR_TRY(mr_comm_broadcast(t->comm, buf, sizes[r], MR_U8, r));
            if (t->rank == 0) {
                MR_TRY(mr_trace_unpack(buf, (size_t)sizes[r], &parts[r]));
                MR_CHECK(mr_trace_pid(parts[r]) == r, MR_ERR_INTERNAL, "log.trace: replica %d sent the spans of pid %d",
                         r, mr_trace_pid(parts[r]));
            }
        }
    }
    if (t->rank == 0) {
        parts[0] = tt->rec;
        write_trace(t, parts, n, 2, t->step, NULL);
        parts[0] = NULL;
    }
fail:
    if (parts)
        for (int r = 0; r < n; r++) mr_trace_free(parts[r]);
    free(parts);
    free(sizes);
    free(buf);
    free(mine);
    return st;
}

mr_status tr_trace_step_end(trainer *t, int end) {
    tr_trace *tt = &t->trace;
    if (!tt->open || (t->step < tt->last && !end)) return MR_OK;
    return close_window(t);
}

void tr_trace_fail(trainer *t) {
    tr_trace *tt = &t->trace;
    if (!tt->open) return;
    mr_trace_stop(tt->rec);
    tt->open = 0;
    tt->done = 1;
    if (t->rank != 0) return;
    /* the run's error stays the caller's: the write may set (and warn about) its own */
    char msg[1024], where[256], partial[1200];
    snprintf(msg, sizeof msg, "%s", mr_last_error());
    snprintf(where, sizeof where, "%s", mr_last_error_where());
    snprintf(partial, sizeof partial, "the run failed at step %lld: only replica 0's spans: %s",
             (long long)(t->step + 1), msg);
    mr_trace *self = tt->rec;
    write_trace(t, &self, 1, 1, t->step + 1, partial);
    const char *colon = strrchr(where, ':');
    if (colon) { /* the status is the caller's; only the message and its position are kept here */
        where[colon - where] = '\0';
        (void)mr_set_error_at(MR_ERR_INTERNAL, where, atoi(colon + 1), "%s", msg);
    } else {
        (void)mr_set_error(MR_ERR_INTERNAL, "%s", msg);
    }
}
