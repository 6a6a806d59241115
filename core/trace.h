/* Spans on a timeline: the recorder behind <run_dir>/trace.json (README.md "Tracing steps";
 * docs/DESIGN.md "Tracing").
 *
 * A recorder (mr_trace) is one replica's part of a trace, the Chrome trace format's "process":
 * a pid (the global replica index) and a name ("rank 1"). It holds up to MR_TRACE_MAX_TRACKS
 * tracks, the format's "threads" ("training", "communication", "data prefetch"): each an event
 * buffer written by one thread. Events are complete spans (a name, start and end, up to two
 * integer arguments: the bytes of an all-reduce, the node of an op), instants and the two ends of
 * a flow (an arrow from the thread that queued a collective to the one that ran it).
 *
 * The window. Nothing is recorded until mr_trace_start and after mr_trace_stop. Outside the
 * window mr_trace_begin is a NULL test and one relaxed atomic load, and the mr_trace_end family
 * compares its t0 with 0: nothing is written, nothing allocated (bench/bench_trace.c measures it).
 * Inside, a span is two clock reads (CLOCK_MONOTONIC through the vDSO) and one 64-byte store into
 * the track's buffer, reserved beforehand (mr_trace_reserve): recording never allocates, locks or
 * makes a system call. A full buffer drops the event and counts it (mr_trace_stats: dropped), so a
 * window too big for its buffers loses its last spans, never the run. A span is recorded when it
 * began inside the window (t0 != 0), even when it ends after mr_trace_stop.
 *
 * Use:
 *     const int64_t t0 = mr_trace_begin(k);     // 0 outside the window
 *     ... the work ...
 *     mr_trace_end1(k, t0, "allreduce", "bytes", n * 4);
 *
 * Names and argument keys are borrowed for the recorder's life: string literals or other static
 * strings (the op table's names, core/op_table.c). A recorder made by mr_trace_unpack owns them.
 *
 * Threads: a track is written by one thread at a time (handing it to another thread needs a
 * happens-before, such as a mutex both take). mr_trace_start, mr_trace_stop, mr_trace_stats,
 * mr_trace_pack and mr_trace_write_json may run on any thread while writers run: they see the
 * events published so far (each event is published with a release store of the track's count).
 * mr_trace_add_track, mr_trace_reserve and mr_trace_free need every writer quiet (outside the
 * window with no span in flight, or joined).
 *
 * Timestamps are nanoseconds of CLOCK_MONOTONIC (mr_trace_now_ns): one clock per kernel boot,
 * shared by every thread and process of a host. C11 and C++ clean. */
#ifndef MR_TRACE_H
#define MR_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_TRACE_MAX_TRACKS 8

typedef struct mr_trace mr_trace;
typedef struct mr_trace_track mr_trace_track;

/* Nanoseconds of CLOCK_MONOTONIC, never 0. Thread-safe. */
int64_t mr_trace_now_ns(void);

/* A recorder with no tracks: pid (>= 0, the Chrome pid), name (copied; "rank 1"). label: a
 * second line shown with the process ("host node07, pid 4711"), copied; may be NULL.
 * Errors: MR_ERR_INVALID (pid < 0, name NULL), MR_ERR_NOMEM. */
mr_status mr_trace_new(int pid, const char *name, const char *label, mr_trace **out) MR_WUR;
/* NULL is a no-op. Every writer must be quiet (joined, or outside the window with no span open). */
void mr_trace_free(mr_trace *t);

/* Adds a track named name (copied) with thread id tid (> 0, unique in t; the tracks are shown in
 * tid order); it holds no buffer until mr_trace_reserve. *out: owned by t.
 * Errors: MR_ERR_INVALID (a repeated tid, more than MR_TRACE_MAX_TRACKS tracks), MR_ERR_NOMEM. */
mr_status mr_trace_add_track(mr_trace *t, const char *name, int tid, mr_trace_track **out) MR_WUR;

/* Gives k room for `events` events (64 bytes each), allocated and touched now, so the window
 * takes no page faults; the track's events and dropped count start over. Writers quiet.
 * Errors: MR_ERR_INVALID (events < 0), MR_ERR_NOMEM (the old buffer is kept). */
mr_status mr_trace_reserve(mr_trace_track *k, int64_t events) MR_WUR;

/* Opens / closes the window on every track of t. Thread-safe. */
void mr_trace_start(mr_trace *t);
void mr_trace_stop(mr_trace *t);

/* Non-zero inside the window (k NULL: 0). One relaxed load. */
int mr_trace_on(const mr_trace_track *k);

/* The start of a span: mr_trace_now_ns() inside the window, 0 outside it or when k is NULL. */
int64_t mr_trace_begin(const mr_trace_track *k);

/* Records the span [t0, t1] (ns) named name on k, with up to two arguments (a NULL key: none).
 * Nothing when t0 == 0 or k is NULL. The event is dropped and counted when the buffer is full. */
void mr_trace_span(mr_trace_track *k, const char *name, int64_t t0, int64_t t1, const char *k1, int64_t v1,
                   const char *k2, int64_t v2);

/* Ends a span begun with mr_trace_begin, now. A no-op (not even a clock read) when t0 == 0. */
static inline void mr_trace_end(mr_trace_track *k, int64_t t0, const char *name) {
    if (t0) mr_trace_span(k, name, t0, mr_trace_now_ns(), NULL, 0, NULL, 0);
}
static inline void mr_trace_end1(mr_trace_track *k, int64_t t0, const char *name, const char *k1, int64_t v1) {
    if (t0) mr_trace_span(k, name, t0, mr_trace_now_ns(), k1, v1, NULL, 0);
}
static inline void mr_trace_end2(mr_trace_track *k, int64_t t0, const char *name, const char *k1, int64_t v1,
                                 const char *k2, int64_t v2) {
    if (t0) mr_trace_span(k, name, t0, mr_trace_now_ns(), k1, v1, k2, v2);
}

/* A moment on k's timeline (now), with up to one argument; only inside the window. */
void mr_trace_instant(mr_trace_track *k, const char *name, const char *k1, int64_t v1);

/* One end of a flow at time ts (ns; 0: now): start = 1 on the thread that hands work over, 0 on
 * the one that takes it up (ts inside the span doing it). The two ends share name and id (unique
 * within the recorder; the writer makes it unique across recorders). Only inside the window. */
void mr_trace_flow(mr_trace_track *k, int start, const char *name, int64_t id, int64_t ts);

/* Counts over every track (track < 0) or track number `track` (0-based, in the order added):
 * events held, dropped (the buffer was full), capacity (events), bytes reserved. */
typedef struct mr_trace_stats {
    int64_t events, dropped, capacity;
    size_t bytes;
} mr_trace_stats;
mr_trace_stats mr_trace_stats_of(const mr_trace *t, int track);
int mr_trace_num_tracks(const mr_trace *t);
const char *mr_trace_track_name(const mr_trace *t, int track); /* NULL when out of range */
int mr_trace_pid(const mr_trace *t);
const char *mr_trace_name(const mr_trace *t);

/* One recorded event, as mr_trace_event_get reads it back. ph: 'X' a span [t0, t1]; 'i' an
 * instant at t0; 's'/'f' a flow's start/end at t0, its id in v1. k1/k2 NULL: no argument. */
typedef struct mr_trace_event {
    char ph;
    const char *name, *k1, *k2;
    int64_t t0, t1, v1, v2;
} mr_trace_event;
/* Event i of track `track` (in the order recorded: a span when it ended) into *out: 1, or 0 when
 * i is not a published event. The strings are t's. */
int mr_trace_event_get(const mr_trace *t, int track, int64_t i, mr_trace_event *out);

/* Every published event of t (names as strings) in one byte string, for another process:
 * *blob is malloc'd (free()), *bytes its length. Errors: MR_ERR_NOMEM. */
mr_status mr_trace_pack(const mr_trace *t, void **blob, size_t *bytes) MR_WUR;
/* The recorder packed in blob (bytes long), owning its strings; it records nothing (no window).
 * Errors: MR_ERR_FORMAT (not a packed trace of this version, or truncated: naming the byte
 * offset), MR_ERR_NOMEM. */
mr_status mr_trace_unpack(const void *blob, size_t bytes, mr_trace **out) MR_WUR;

/* How one recorder's clock maps onto the trace's: its timestamps t get shift(t) added, linear
 * between (at0, shift0) and (at1, shift1) and extended past them (two measurements bound a
 * drifting clock); at1 == at0: a constant shift0. All nanoseconds. */
typedef struct mr_trace_clock {
    int64_t at0, shift0, at1, shift1;
} mr_trace_clock;

/* Writes parts[0..n) as one trace in the Chrome trace event format (JSON object form: opens in
 * Perfetto and chrome://tracing) to path, atomically (path.tmp.<pid>, fsync, rename): one process
 * per part (process_name = its name; its label; sorted by pid), one thread per track (sorted by
 * tid), complete events ("X") in microseconds with three decimals since the earliest event,
 * instants ("i") and flows ("s"/"f"; ids made unique per part). clocks: one per part, NULL: no
 * shift. meta: members of a JSON object (`"key": value, ...`, may be NULL or ""), written with the
 * origin into "otherData". Errors: MR_ERR_IO (naming the path), MR_ERR_INVALID, MR_ERR_NOMEM. */
mr_status mr_trace_write_json(const char *path, mr_trace *const *parts, const mr_trace_clock *clocks, int n,
                              const char *meta) MR_WUR;

#ifdef __cplusplus
}
#endif
#endif
