/* The CUDA emulator's kernel executor: runs a grid on the calling host thread, one block at a
 * time, each block's threads as fibers (our own x86-64 context switch: six callee-saved registers,
 * MXCSR and the x87 control word; ASan is told about every switch).
 *
 * A fiber runs until it reaches a barrier, a warp operation or its end. When no fiber can run,
 * the block resolves what is waiting, with CUDA's rules made strict:
 *  - a warp operation completes when every lane of its mask has arrived at the same operation (same
 *    kind, same source line) with the same mask; a lane naming a mask without itself, a mask that
 *    names a lane that has exited or waits elsewhere, is reported with both source positions;
 *  - __syncthreads() opens when every thread of the block waits at the same barrier; a barrier
 *    reached after some threads returned, or threads at two different barriers, is reported.
 * The order in which runnable fibers (and the blocks of a grid) run is the schedule:
 * MR_EMU_SCHEDULE=forward|reverse|random (default random, seeded by MR_EMU_SEED and the launch
 * count), so a result that depends on the order between two sync points differs between schedules.
 * Shared memory comes from a per-block arena filled with 0xFF bytes, so a read of what no thread of
 * the block wrote reads NaN (floats) or -1 (integers). */
#define MR_EMU_RUNTIME 1
#include "tests/emu/emu_cuda.h"
#include "tests/emu/emu_exec_impl.h"
#include "tests/emu/emu_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define MR_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

/* void mr_emu_switch(void **save_sp, void *to_sp): saves the callee-saved state on the current
 * stack, stores the stack pointer in *save_sp and resumes the context saved at to_sp. */
asm(R"(
    .text
    .globl mr_emu_switch
    .type mr_emu_switch, @function
mr_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size mr_emu_switch, .-mr_emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
extern "C" void mr_emu_switch(void **save_sp, void *to_sp);

namespace mr_emu {
namespace {

enum fstate { F_RUN, F_BAR, F_WARP, F_DONE };

struct fiber {
    void *sp;
    char *stack;
    size_t stack_size;
    fstate state;
    uint3 tid;
    int lane, warp;
    /* what it waits at */
    const char *file;
    int line;
    mr_emu_k::warp_kind kind;
    unsigned mask;
    unsigned char val[16];
    int arg, width, size;
    unsigned char result[16];
    void *fake_stack;
};

struct shared_slot {
    const void *key;
    size_t off, bytes;
};

#ifdef MR_EMU_ASAN
const size_t STACK_BYTES = 256 << 10;
#else
const size_t STACK_BYTES = 64 << 10;
#endif
const size_t SHARED_STATIC_MAX = 48 << 10;
const size_t SHARED_ARENA = 228 << 10; /* sm_90: 227 KiB a block with opt-in, + slack */

/* Per host thread: the fiber stacks (reused from block to block) and the running block. */
struct executor {
    std::vector<fiber> fibers;
    std::vector<char *> stacks;
    void *sched_sp = nullptr;
    fiber *cur = nullptr;
    const void *main_bottom = nullptr;
    size_t main_size = 0;
    /* the block */
    uint3 bid;
    dim3 bdim, gdim;
    const std::function<void()> *body = nullptr;
    const char *kernel = "?";
    const char *kernel_file = "?";
    int kernel_line = 0;
    const char *launch_file = "?";
    int launch_line = 0;
    unsigned char *shared = nullptr;
    size_t shared_static = 0, dyn_bytes = 0;
    std::vector<shared_slot> slots;
    uint64_t rng = 0;
    ~executor() {
        for (char *s : stacks) munmap(s - 4096, STACK_BYTES + 4096);
        free(shared);
    }
};
/* initial-exec: the emulator is linked into executables, and every threadIdx or shuffle reads this */
__attribute__((tls_model("initial-exec"))) thread_local executor *t_ex;

executor &ex(void) {
    if (!t_ex) t_ex = new executor(); /* one per host thread, freed at thread exit below */
    return *t_ex;
}
pthread_key_t g_ex_key;
pthread_once_t g_ex_once = PTHREAD_ONCE_INIT;
void ex_free(void *p) { delete (executor *)p; }
void ex_key_init(void) { (void)pthread_key_create(&g_ex_key, ex_free); }

executor &ex_registered(void) {
    executor &e = ex();
    static thread_local bool reg;
    if (!reg) {
        pthread_once(&g_ex_once, ex_key_init);
        (void)pthread_setspecific(g_ex_key, &e);
        reg = true;
    }
    return e;
}

fiber &cur(void) {
    executor &e = ex();
    if (!e.cur) fatal("kernel", "a device function (threadIdx, __syncthreads, a shuffle) was called outside a kernel");
    return *e.cur;
}

uint64_t next_rand(uint64_t *s) {
    uint64_t x = *s += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

[[noreturn]] void kfatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kfatal(const char *fmt, ...) {
    executor &e = ex();
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fatal("kernel", "%s\n  in %s (%s:%d), block (%u,%u,%u) of grid (%u,%u,%u) x block (%u,%u,%u), launched at %s:%d", msg,
          e.kernel, e.kernel_file, e.kernel_line, e.bid.x, e.bid.y, e.bid.z, e.gdim.x, e.gdim.y, e.gdim.z, e.bdim.x,
          e.bdim.y, e.bdim.z, e.launch_file, e.launch_line);
}

/* ---- switching ---------------------------------------------------------------------------------- */

void to_scheduler(fiber &f, bool finished) {
    executor &e = ex();
#ifdef MR_EMU_ASAN
    __sanitizer_start_switch_fiber(finished ? nullptr : &f.fake_stack, e.main_bottom, e.main_size);
#endif
    mr_emu_switch(&f.sp, e.sched_sp);
#ifdef MR_EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, &e.main_bottom, &e.main_size);
#endif
    (void)finished;
}

void fiber_main(void) {
    executor &e = ex();
#ifdef MR_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &e.main_bottom, &e.main_size);
#endif
    (*e.body)();
    fiber &f = *e.cur;
    f.state = F_DONE;
    to_scheduler(f, true);
    abort(); /* never resumed */
}

char *new_stack(void) {
    void *p = mmap(nullptr, STACK_BYTES + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fatal("runtime", "cannot map a fiber stack");
    (void)mprotect(p, 4096, PROT_NONE); /* guard page: a stack overflow faults */
    return (char *)p + 4096;
}

void start_fiber(fiber &f) {
    /* the initial frame mr_emu_switch pops: csr word, r15..rbp, return address = fiber_main, and a
     * zero "return address" for fiber_main itself; fiber_main's entry rsp is 8 mod 16 */
    uintptr_t top = ((uintptr_t)(f.stack + f.stack_size)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 16);
    *--sp = 0;
    *--sp = (uint64_t)(uintptr_t)&fiber_main;
    for (int i = 0; i < 6; i++) *--sp = 0;
    unsigned mx;
    unsigned short cw;
    asm volatile("stmxcsr %0" : "=m"(mx));
    asm volatile("fnstcw %0" : "=m"(cw));
    *--sp = (uint64_t)mx | ((uint64_t)cw << 32);
    f.sp = sp;
}

void run_fiber(executor &e, fiber &f) {
    e.cur = &f;
#ifdef MR_EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack, f.stack_size);
#endif
    mr_emu_switch(&e.sched_sp, f.sp);
#ifdef MR_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    e.cur = nullptr;
}

/* ---- resolving waits -------------------------------------------------------------------------- */

const char *kind_name(mr_emu_k::warp_kind k) {
    switch (k) {
    case mr_emu_k::W_SHFL_IDX: return "__shfl_sync";
    case mr_emu_k::W_SHFL_UP: return "__shfl_up_sync";
    case mr_emu_k::W_SHFL_DOWN: return "__shfl_down_sync";
    case mr_emu_k::W_SHFL_XOR: return "__shfl_xor_sync";
    case mr_emu_k::W_BALLOT: return "__ballot_sync";
    case mr_emu_k::W_ANY: return "__any_sync";
    case mr_emu_k::W_ALL: return "__all_sync";
    case mr_emu_k::W_SYNCWARP: return "__syncwarp";
    }
    return "?";
}

const char *where(const fiber &f, char *buf, size_t cap) {
    if (f.state == F_DONE) snprintf(buf, cap, "has returned");
    else if (f.state == F_BAR) snprintf(buf, cap, "waits at __syncthreads (%s:%d)", f.file, f.line);
    else if (f.state == F_WARP) snprintf(buf, cap, "waits at %s (%s:%d)", kind_name(f.kind), f.file, f.line);
    else snprintf(buf, cap, "runs");
    return buf;
}

/* The source lane of lane `l` for a shuffle, or -1 when the lane keeps its own value. */
int shfl_src(const fiber &f, int l) {
    int w = f.width;
    int base = l & ~(w - 1);
    switch (f.kind) {
    case mr_emu_k::W_SHFL_IDX: return base + (f.arg & (w - 1));
    case mr_emu_k::W_SHFL_UP: return (l - base) >= f.arg ? l - f.arg : -1;
    case mr_emu_k::W_SHFL_DOWN: return (l - base) + f.arg < w ? l + f.arg : -1;
    case mr_emu_k::W_SHFL_XOR: {
        /* CUDA: a group may read earlier groups; a source in a later group gives the own value */
        int s = l ^ f.arg;
        return s <= (base | (w - 1)) ? s : -1;
    }
    default: return -1;
    }
}

/* Computes the results of every lane of f's group (all waiting at f's operation, validated) and
 * makes them runnable. Returns the lanes released. */
int release_group(fiber *lanes, fiber &f) {
    int released = 0;
    unsigned bal = 0;
    for (int m = 0; m < 32; m++)
        if (f.mask >> m & 1u) {
            int p;
            memcpy(&p, lanes[m].val, sizeof p);
            if (p) bal |= 1u << m;
        }
    for (int m = 0; m < 32; m++) {
        if (!(f.mask >> m & 1u)) continue;
        fiber &g = lanes[m];
        switch (f.kind) {
        case mr_emu_k::W_BALLOT: memcpy(g.result, &bal, 4); break;
        case mr_emu_k::W_ANY: {
            unsigned r = bal != 0;
            memcpy(g.result, &r, 4);
        } break;
        case mr_emu_k::W_ALL: {
            unsigned r = bal == f.mask;
            memcpy(g.result, &r, 4);
        } break;
        case mr_emu_k::W_SYNCWARP: break;
        default: {
            int s = shfl_src(g, m);
            if (s < 0) s = m;
            if (s >= 32 || !(f.mask >> s & 1u))
                kfatal("%s at %s:%d: lane %d reads lane %d, which is not in the mask 0x%08x (undefined on a GPU)",
                       kind_name(f.kind), f.file, f.line, m, s, f.mask);
            memcpy(g.result, lanes[s].val, (size_t)g.size);
        }
        }
        g.state = F_RUN;
        released++;
    }
    return released;
}

/* Completes the warp operations every waiting lane is at; reports a mismatch. Called when no
 * fiber can run, so every lane of a waiting lane's mask must be waiting at the same operation
 * (same kind and line) with the same mask: validated for all lanes first, released after, so a
 * lane released in this pass is never taken for one still to arrive. Returns the lanes released. */
int resolve_warps(executor &e, int nthreads) {
    int released = 0;
    char b1[160];
    for (int w0 = 0; w0 < nthreads; w0 += 32) {
        fiber *lanes = &e.fibers[(size_t)w0];
        int nl = nthreads - w0 < 32 ? nthreads - w0 : 32;
        for (int l = 0; l < nl; l++) {
            fiber &f = lanes[l];
            if (f.state != F_WARP) continue;
            for (int m = 0; m < 32; m++) {
                if (!(f.mask >> m & 1u)) continue;
                if (m >= nl)
                    kfatal("%s at %s:%d: mask 0x%08x names lane %d, which does not exist in a block of %d threads",
                           kind_name(f.kind), f.file, f.line, f.mask, m, nthreads);
                fiber &g = lanes[m];
                if (g.state != F_WARP || g.kind != f.kind || g.line != f.line || g.file != f.file || g.mask != f.mask ||
                    g.width != f.width || g.size != f.size)
                    kfatal("warp %d: lane %d is at %s (%s:%d) with mask 0x%08x, but lane %d of that mask %s%s", w0 / 32, l,
                           kind_name(f.kind), f.file, f.line, f.mask, m, where(g, b1, sizeof b1),
                           g.state == F_WARP && g.line == f.line ? " with another mask, width or type" : "");
            }
        }
        for (int l = 0; l < nl; l++) {
            fiber &f = lanes[l];
            if (f.state != F_WARP) continue;
            released += release_group(lanes, f);
        }
    }
    return released;
}

/* Opens the barrier when every thread waits at it; reports a barrier that cannot open. */
int resolve_barrier(executor &e, int nthreads) {
    const fiber *first = nullptr, *done = nullptr;
    char b1[160];
    for (int t = 0; t < nthreads; t++) {
        const fiber &f = e.fibers[t];
        if (f.state == F_DONE) {
            if (!done) done = &f;
            continue;
        }
        if (f.state == F_WARP)
            kfatal("deadlock: thread (%u,%u,%u) %s, which cannot complete (its lanes are elsewhere)", f.tid.x, f.tid.y,
                   f.tid.z, where(f, b1, sizeof b1));
        if (!first) first = &f;
        else if (first->line != f.line || first->file != f.file)
            kfatal("threads wait at different barriers: thread (%u,%u,%u) at %s:%d, thread (%u,%u,%u) at %s:%d",
                   first->tid.x, first->tid.y, first->tid.z, first->file, first->line, f.tid.x, f.tid.y, f.tid.z, f.file,
                   f.line);
    }
    if (!first) return 0;
    if (done)
        kfatal("__syncthreads at %s:%d is reached after thread (%u,%u,%u) of the block returned (a barrier must be "
               "reached by every thread of the block)",
               first->file, first->line, done->tid.x, done->tid.y, done->tid.z);
    int n = 0;
    for (int t = 0; t < nthreads; t++)
        if (e.fibers[t].state == F_BAR) {
            e.fibers[t].state = F_RUN;
            n++;
        }
    return n;
}

/* Runs f, and while its warp completes a full-warp operation, runs that warp on ahead of the
 * other warps (depth first): a warp that reaches shared memory before the others leave the code
 * above it shows a missing __syncthreads, as a fast warp does on a GPU. Only full-warp groups
 * are released early; partial masks wait for the strict check in resolve_warps. */
void run_warp_ahead(executor &e, int nthreads, fiber &f) {
    run_fiber(e, f);
    fiber *lanes = &e.fibers[(size_t)(f.warp * 32)];
    int nl = nthreads - f.warp * 32 < 32 ? nthreads - f.warp * 32 : 32;
    unsigned all = nl == 32 ? 0xffffffffu : ((1u << nl) - 1u);
    while (f.state == F_WARP && f.mask == all) {
        for (int m = 0; m < nl; m++) {
            const fiber &g = lanes[m];
            if (g.state != F_WARP || g.kind != f.kind || g.line != f.line || g.file != f.file || g.mask != f.mask ||
                g.width != f.width || g.size != f.size)
                return; /* not complete (or a mismatch resolve_warps will report) */
        }
        release_group(lanes, lanes[0]);
        for (int m = 0; m < nl; m++)
            if (lanes[m].state == F_RUN) run_fiber(e, lanes[m]);
    }
}

void run_block(executor &e, int nthreads, schedule sch) {
    std::vector<int> order((size_t)nthreads);
    for (int t = 0; t < nthreads; t++) {
        fiber &f = e.fibers[t];
        f.state = F_RUN;
        f.tid.x = (unsigned)(t % (int)e.bdim.x);
        f.tid.y = (unsigned)(t / (int)e.bdim.x % (int)e.bdim.y);
        f.tid.z = (unsigned)(t / (int)(e.bdim.x * e.bdim.y));
        f.lane = t & 31;
        f.warp = t >> 5;
        f.stack = e.stacks[(size_t)t];
        f.stack_size = STACK_BYTES;
        f.fake_stack = nullptr;
#ifdef MR_EMU_ASAN
        __asan_unpoison_memory_region(f.stack, f.stack_size);
#endif
        start_fiber(f);
        order[(size_t)t] = t;
    }
    for (;;) {
        if (sch == SCHED_REVERSE) {
            for (int t = 0; t < nthreads; t++) order[(size_t)t] = nthreads - 1 - t;
        } else if (sch == SCHED_RANDOM) {
            for (int t = nthreads - 1; t > 0; t--) {
                int j = (int)(next_rand(&e.rng) % (uint64_t)(t + 1));
                std::swap(order[(size_t)t], order[(size_t)j]);
            }
        }
        for (int k = 0; k < nthreads; k++) {
            fiber &f = e.fibers[(size_t)order[(size_t)k]];
            if (f.state == F_RUN) run_warp_ahead(e, nthreads, f);
        }
        if (resolve_warps(e, nthreads) > 0) continue;
        if (resolve_barrier(e, nthreads) > 0) continue;
        break; /* every thread has returned */
    }
}

} // namespace

schedule schedule_from_env(void) {
    const char *s = getenv("MR_EMU_SCHEDULE");
    if (!s || !*s || strcmp(s, "random") == 0) return SCHED_RANDOM;
    if (strcmp(s, "forward") == 0) return SCHED_FORWARD;
    if (strcmp(s, "reverse") == 0) return SCHED_REVERSE;
    fatal("runtime", "MR_EMU_SCHEDULE='%s': expected forward, reverse or random", s);
}

void run_grid(const grid_job &j) {
    executor &e = ex_registered();
    if (e.cur) fatal("runtime", "a kernel was run from inside a kernel");
    int nthreads = (int)(j.block.x * j.block.y * j.block.z);
    while (e.stacks.size() < (size_t)nthreads) e.stacks.push_back(new_stack());
    if (e.fibers.size() < (size_t)nthreads) e.fibers.resize((size_t)nthreads);
    if (!e.shared) {
        e.shared = (unsigned char *)aligned_alloc(64, SHARED_ARENA);
        if (!e.shared) fatal("runtime", "out of memory for shared memory");
    }
    e.gdim = j.grid;
    e.bdim = j.block;
    e.body = &j.body;
    e.launch_file = j.file;
    e.launch_line = j.line;
    e.kernel = "(kernel not yet entered)";
    e.dyn_bytes = j.smem;
    e.rng = j.seed;
    uint64_t nblocks = (uint64_t)j.grid.x * j.grid.y * j.grid.z;
    std::vector<uint64_t> border;
    if (j.sched != SCHED_FORWARD) {
        border.resize((size_t)nblocks);
        for (uint64_t b = 0; b < nblocks; b++) border[b] = j.sched == SCHED_REVERSE ? nblocks - 1 - b : b;
        if (j.sched == SCHED_RANDOM)
            for (uint64_t b = nblocks; b > 1; b--) std::swap(border[b - 1], border[next_rand(&e.rng) % b]);
    }
    for (uint64_t k = 0; k < nblocks; k++) {
        uint64_t b = border.empty() ? k : border[k];
        e.bid.x = (unsigned)(b % j.grid.x);
        e.bid.y = (unsigned)(b / j.grid.x % j.grid.y);
        e.bid.z = (unsigned)(b / ((uint64_t)j.grid.x * j.grid.y));
        /* the arena: dynamic shared memory first (at offset 0, as extern __shared__ sees it), then
         * the static variables; all of it unwritten */
        size_t used = e.dyn_bytes + e.shared_static;
        memset(e.shared, 0xFF, used > 0 ? used : 64);
        e.slots.clear();
        e.shared_static = 0;
        run_block(e, nthreads, j.sched);
    }
    e.body = nullptr;
}

} // namespace mr_emu

/* ---- the kernel-side entry points (emu_cuda.h) ---------------------------------------------------- */
namespace mr_emu_k {
using namespace mr_emu;

const uint3 &thread_idx(void) { return cur().tid; }
const uint3 &block_idx(void) {
    (void)cur();
    return ex().bid;
}
const dim3 &block_dim(void) {
    (void)cur();
    return ex().bdim;
}
const dim3 &grid_dim(void) {
    (void)cur();
    return ex().gdim;
}

void syncthreads(const char *file, int line) {
    fiber &f = cur();
    f.state = F_BAR;
    f.file = file;
    f.line = line;
    to_scheduler(f, false);
}

void warp_op(warp_kind k, const char *file, int line, unsigned mask, const void *val, int size, int arg, int width,
             void *out) {
    fiber &f = cur();
    if (!(mask >> f.lane & 1u))
        kfatal("%s at %s:%d: lane %d calls it with mask 0x%08x, which leaves the lane out", kind_name(k), file, line, f.lane,
               mask);
    if (width <= 0 || width > 32 || (width & (width - 1)))
        kfatal("%s at %s:%d: width %d is not a power of two in [1, 32]", kind_name(k), file, line, width);
    f.state = F_WARP;
    f.kind = k;
    f.file = file;
    f.line = line;
    f.mask = mask;
    f.arg = arg;
    f.width = width;
    f.size = size;
    memcpy(f.val, val, (size_t)size);
    to_scheduler(f, false);
    fiber &g = cur();
    memcpy(out, g.result, (size_t)(k == W_BALLOT || k == W_ANY || k == W_ALL ? 4 : size));
}

void *shared_alloc(const void *key, size_t bytes, size_t align, const char *file, int line) {
    executor &e = ex();
    (void)cur();
    for (const shared_slot &s : e.slots)
        if (s.key == key) return e.shared + s.off;
    size_t off = (e.dyn_bytes + e.shared_static + align - 1) & ~(align - 1);
    size_t stat = off + bytes - e.dyn_bytes;
    if (stat + e.dyn_bytes > SHARED_STATIC_MAX)
        kfatal("__shared__ at %s:%d: %zu bytes of static and %zu of dynamic shared memory: more than 48 KiB a block "
               "needs cudaFuncSetAttribute's opt-in (the launch fails on sm_90)",
               file, line, stat, e.dyn_bytes);
    if (stat > SHARED_STATIC_MAX)
        kfatal("__shared__ at %s:%d: %zu bytes of static shared memory in this kernel (sm_90 allows 48 KiB; ptxas "
               "would refuse it)",
               file, line, stat);
    memset(e.shared + e.dyn_bytes + e.shared_static, 0xFF, off + bytes - e.dyn_bytes - e.shared_static);
    e.shared_static = stat;
    e.slots.push_back(shared_slot{key, off, bytes});
    return e.shared + off;
}

void *dyn_shared(void) {
    (void)cur();
    return ex().shared;
}

void kernel_entry(const char *pretty, const char *file, int line) {
    executor &e = ex();
    e.kernel = pretty;
    e.kernel_file = file;
    e.kernel_line = line;
}

void null_arg_misuse(long v) {
    fatal("kernel", "a launch passes the integer %ld where the kernel takes a pointer", v);
}

} // namespace mr_emu_k
