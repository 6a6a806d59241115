/* Private: the caching allocator (core/alloc_cache.c) that the CUDA backend puts in front of
 * cudaMalloc/cudaFree, so that a steady-state training step allocates nothing from the driver.
 *
 * It is plain C over a raw allocator given as function pointers, so the CPU unit tests
 * (tests/unit/test_alloc_cache.c) drive it with a fake one that counts calls. See alloc_cache.c
 * for the size classes, the splitting rule and why freed blocks wait for an event. */
#ifndef MR_ALLOC_CACHE_IMPL_H
#define MR_ALLOC_CACHE_IMPL_H

#include <stddef.h>
#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The allocator underneath, and the optional "freed at this point of the device's work" hooks.
 * `ctx` is passed to every hook (the CUDA backend passes the device index).
 *   alloc:  `bytes` (> 0) of device memory; MR_ERR_NOMEM when the device is out of memory
 *           (the cache then releases what it holds and retries once), any other error is final.
 *   free:   returns memory alloc gave; cannot fail.
 * The event hooks are all set or all NULL. With them, a freed block is handed out again only
 * once an event recorded at free time has completed (the device has finished every kernel that
 * could still be using it); without them, a freed block is reusable at once.
 *   event_new:    a new event object (*out non-NULL); the cache pools them.
 *   event_free:   destroys one.
 *   event_record: marks "now" in the device's work on the event. Points are marked in the order of
 *                 the frees and reached in that order on one stream, so the cache queries the
 *                 oldest first and stops at the first not reached (only conservative otherwise).
 *   event_query:  *done = 1 when the recorded point has been reached, else 0.
 *   event_wait:   blocks until it has been reached. */
typedef struct mr_alloc_raw {
    void *ctx;
    mr_status (*alloc)(void *ctx, size_t bytes, void **out);
    void (*free)(void *ctx, void *p);
    mr_status (*event_new)(void *ctx, void **out);
    void (*event_free)(void *ctx, void *ev);
    mr_status (*event_record)(void *ctx, void *ev);
    mr_status (*event_query)(void *ctx, void *ev, int *done);
    mr_status (*event_wait)(void *ctx, void *ev);
} mr_alloc_raw;

typedef struct mr_alloc_cache mr_alloc_cache;

/* Granularity and size classes (alloc_cache.c explains the choice). */
#define MR_ALLOC_ROUND ((size_t)512)                    /* every block is a multiple of this */
#define MR_ALLOC_SMALL_MAX ((size_t)1 << 20)            /* <= 1 MiB: a small block */
#define MR_ALLOC_SMALL_SEGMENT ((size_t)2 << 20)        /* small blocks are carved from 2 MiB segments */
#define MR_ALLOC_LARGE_GRANULE ((size_t)2 << 20)        /* large segments are multiples of 2 MiB */

/* A new cache over `raw` (copied). caching == 0 turns it into a counting pass-through: every
 * alloc is a raw alloc of exactly the requested bytes (1 for 0) and every free a raw free, for
 * memory checkers (MIRROR_CUDA_CACHE=0). `name` ("cuda:0", copied) prefixes error messages.
 * MR_ERR_NOMEM (host) on failure, *out NULL. */
mr_status mr_alloc_cache_new(const mr_alloc_raw *raw, int caching, const char *name, mr_alloc_cache **out) MR_WUR;

/* Waits for every pending block, returns every segment to the raw allocator (blocks still in use
 * included: the caller must be done with them) and destroys every pooled event. NULL: no-op. */
void mr_alloc_cache_free(mr_alloc_cache *c);

/* A block of at least `bytes` (0 gives a unique non-NULL pointer). Blocks start at multiples of
 * MR_ALLOC_ROUND from a segment's start, so they keep the raw allocator's alignment (cudaMalloc:
 * 256 bytes) up to 512. Served from the cache when a free block fits (best fit:
 * the smallest that does, split when the rest is worth keeping); else a new segment from the raw
 * allocator; when that runs out of memory, every cached block is released and the raw alloc
 * retried once. Errors: MR_ERR_NOMEM naming the request and the in-use / cached / peak bytes with
 * a HINT (*out NULL, nothing changed but the released cache), or the raw allocator's or event
 * hooks' errors. Thread-safe (one mutex per cache; it is held across raw calls and event waits). */
mr_status mr_alloc_cache_alloc(mr_alloc_cache *c, size_t bytes, void **out) MR_WUR;

/* Gives back a block from mr_alloc_cache_alloc (NULL: no-op). The block becomes reusable once the
 * event recorded now has completed (at once without event hooks). MR_ERR_INVALID for a pointer
 * this cache did not hand out (nothing changes); an event hook's error is returned after the block
 * was cached anyway (a failing record means the device context is broken, so later kernels fail
 * too and cannot observe the reuse). Thread-safe. */
mr_status mr_alloc_cache_dealloc(mr_alloc_cache *c, void *p) MR_WUR;

/* Waits for pending blocks and returns every segment that is entirely free to the raw allocator
 * (torch.cuda.empty_cache). Blocks in use keep their segments. An event wait's error is returned
 * after releasing what could be. Thread-safe. */
mr_status mr_alloc_cache_release_cached(mr_alloc_cache *c) MR_WUR;

/* The counters (mr_memory_stats in core/device.h). Thread-safe. */
void mr_alloc_cache_stats(mr_alloc_cache *c, mr_memory_stats *out);
/* Peak in-use and peak reserved bytes restart from the current values. Thread-safe. */
void mr_alloc_cache_reset_peak(mr_alloc_cache *c);

#ifdef __cplusplus
}
#endif
#endif
