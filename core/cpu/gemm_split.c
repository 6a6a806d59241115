/* What mirror's GEMM kernels (sgemm_avx512.c, gemm_bf16_avx512.c, gemm_bf16_amx.c) share: the
 * pools of packing buffers and the split of C over threads (see cpu_impl.h, mr_gemm_split). */
#include "core/cpu/cpu_impl.h"

#include <pthread.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static mr_pack_pool *g_pools; /* every pool that ever allocated, for the exit-time free */

__attribute__((destructor)) static void free_pools(void) {
    for (mr_pack_pool *p = g_pools; p; p = p->next_pool) {
        mr_pack_bufs *b = p->all;
        while (b) {
            mr_pack_bufs *next = b->next_all;
            free(b->ap);
            free(b->bp);
            free(b);
            b = next;
        }
        p->all = p->free_list = NULL;
    }
}

/* A set of buffers of the pool for the calling thread (NULL on out-of-memory). */
static mr_pack_bufs *acquire(mr_pack_pool *p) {
    pthread_mutex_lock(&g_lock);
    if (!p->registered) {
        p->next_pool = g_pools;
        g_pools = p;
        p->registered = 1;
    }
    mr_pack_bufs *b = p->free_list;
    if (b) {
        p->free_list = b->next_free;
    } else {
        b = calloc(1, sizeof *b);
        if (b) {
            b->ap = aligned_alloc(64, (p->a_bytes + 63) / 64 * 64);
            b->bp = aligned_alloc(64, (p->b_bytes + 63) / 64 * 64);
            b->next_all = p->all;
            p->all = b;
            if (!b->ap || !b->bp) b = NULL; /* stays on the all-list, freed at exit */
        }
    }
    pthread_mutex_unlock(&g_lock);
    return b;
}

static void release(mr_pack_pool *p, mr_pack_bufs *b) {
    if (!b) return;
    pthread_mutex_lock(&g_lock);
    b->next_free = p->free_list;
    p->free_list = b;
    pthread_mutex_unlock(&g_lock);
}

int mr_gemm_split(const mr_gemm_args *g, int64_t row_unit, int64_t col_unit, mr_pack_pool *pool, mr_gemm_block_fn block) {
    return mr_gemm_split_pref(g, row_unit, col_unit, 0, pool, block);
}

int mr_gemm_split_pref(const mr_gemm_args *g, int64_t row_unit, int64_t col_unit, int prefer_rows, mr_pack_pool *pool,
                       mr_gemm_block_fn block) {
    int nthreads = 1;
#ifdef _OPENMP
    /* inside any parallel region, active or not (an if clause that came out false), stay on this
     * thread: a team started there would be a nested one, which libgomp builds anew each call */
    if (omp_get_level() == 0) nthreads = omp_get_max_threads();
#endif
    /* too little work to share: one thread */
    if ((double)g->m * (double)g->n * (double)g->k < 2e6) nthreads = 1;
    int64_t col_units = (g->n + col_unit - 1) / col_unit, row_units = (g->m + row_unit - 1) / row_unit;
    int split_cols = col_units >= (int64_t)nthreads * 2 || col_units >= row_units;
    if (prefer_rows && row_units >= (int64_t)nthreads * 2 && g->m >= g->n) split_cols = 0;
    int64_t units = split_cols ? col_units : row_units;
    if (units < nthreads) nthreads = (int)units;
    if (nthreads <= 1) {
        mr_pack_bufs *bufs = acquire(pool);
        if (!bufs) return 0;
        block(g, 0, g->m, 0, g->n, bufs->ap, bufs->bp);
        release(pool, bufs);
        return 1;
    }
    /* every thread's buffers up front, so an out-of-memory leaves C untouched */
    enum { MAX_TEAM = 64 };
    mr_pack_bufs *team[MAX_TEAM];
    if (nthreads > MAX_TEAM) nthreads = MAX_TEAM;
    for (int t = 0; t < nthreads; t++) {
        team[t] = acquire(pool);
        if (!team[t]) {
            while (t-- > 0) release(pool, team[t]);
            return 0;
        }
    }
#pragma omp parallel num_threads(nthreads)
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
        if (u1 > u0) {
            if (split_cols) {
                int64_t j0 = u0 * col_unit, j1 = u1 * col_unit < g->n ? u1 * col_unit : g->n;
                block(g, 0, g->m, j0, j1, team[t]->ap, team[t]->bp);
            } else {
                int64_t i0 = u0 * row_unit, i1 = u1 * row_unit < g->m ? u1 * row_unit : g->m;
                block(g, i0, i1, 0, g->n, team[t]->ap, team[t]->bp);
            }
        }
    }
    for (int t = 0; t < nthreads; t++) release(pool, team[t]);
    return 1;
}
