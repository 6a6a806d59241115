/* The emulated NCCL: communicators among the emulated GPUs of one process, with the functions of
 * nccl.h that distribute/comm_nccl.c and the GPU tests call (the real header's signatures).
 *
 * A clique is the set of communicators made from one ncclUniqueId. A communicator is ready when
 * all `nranks` have called ncclCommInitRank(Config) with that id (non-blocking communicators
 * report ncclInProgress through ncclCommGetAsyncError until then). The k-th collective of each
 * rank joins the clique's k-th operation: the emulator checks that every rank called the same
 * collective with the same count, type, operation and root (real NCCL hangs or corrupts
 * memory otherwise), that buffers are device memory of the communicator's GPU and large enough,
 * and that the stream belongs to that GPU. Each rank's part is an item on its stream that is
 * ready when every rank has queued its part; the first part to run first runs every other rank's
 * stream up to its part (the data the collective reads), then computes the result for all ranks
 * at once (reductions in double, in rank order, rounded once to the type: deterministic) and the
 * other parts become no-ops. A collective that some rank never queues is reported after 120 s;
 * one rank's calls for several GPUs outside ncclGroupStart/End that would deadlock on a GPU work
 * is reported: one thread queuing two ranks' parts of one collective outside a group.
 * Across MPI processes the fake does not move data: a clique whose ranks live in several
 * processes never becomes ready (comm_nccl.c's deadline then fails the initialisation). */
#define MR_EMU_RUNTIME 1
#include "tests/emu/emu_cuda.h"
#include "tests/emu/emu_internal.h"
#include "tests/emu/emu_runtime_impl.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <map>
#include <memory>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using mr_emu::item;

enum coll_kind { C_ALLREDUCE, C_BROADCAST, C_ALLGATHER, C_REDUCESCATTER };
const char *coll_name(coll_kind k) {
    switch (k) {
    case C_ALLREDUCE: return "ncclAllReduce";
    case C_BROADCAST: return "ncclBroadcast";
    case C_ALLGATHER: return "ncclAllGather";
    case C_REDUCESCATTER: return "ncclReduceScatter";
    }
    return "?";
}

struct clique;

struct coll {
    coll_kind kind;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int root;
    int nranks;
    int queued = 0, finished = 0;
    bool done = false, cancelled = false;
    std::vector<const void *> send;
    std::vector<void *> recv;
    std::vector<CUstream_st *> streams;
    std::vector<uint64_t> seqs;
    std::vector<bool> in;
    std::vector<pthread_t> by; /* the host thread that queued each rank's part */
};

struct clique {
    std::string id;
    int nranks;
    int joined = 0;
    std::vector<ncclComm *> ranks;
    std::map<uint64_t, std::shared_ptr<coll>> ops;
    int live = 0;
    bool aborted = false;
};

std::map<std::string, clique *> g_cliques; /* guarded by the emulator's lock */
thread_local int t_group = 0;
thread_local char t_last[512];

} // namespace

struct ncclComm {
    clique *c;
    int rank;
    int device;
    bool blocking;
    uint64_t nops = 0;
    bool aborted = false;
};

namespace {

struct lock_guard {
    lock_guard() { mr_emu::lock(); }
    ~lock_guard() { mr_emu::unlock(); }
};

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

double load(const void *p, size_t i, ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat16: return __half2float(((const __half *)p)[i]);
    case ncclBfloat16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    default: mr_emu::fatal("nccl", "data type %d is not emulated", (int)t);
    }
}

void store(void *p, size_t i, ncclDataType_t t, double v) {
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ncclFloat16: ((__half *)p)[i] = __float2half((float)v); break;
    case ncclBfloat16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16((float)v); break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    default: mr_emu::fatal("nccl", "data type %d is not emulated", (int)t);
    }
}

bool is_int(ncclDataType_t t) {
    return t == ncclInt8 || t == ncclUint8 || t == ncclInt32 || t == ncclUint32 || t == ncclInt64 || t == ncclUint64;
}

/* Computes the collective for every rank (lock held; every rank's stream is at its part). */
void compute(coll &c) {
    size_t es = type_size(c.type);
    int n = c.nranks;
    std::vector<std::vector<unsigned char>> in((size_t)n);
    size_t in_count = c.kind == C_REDUCESCATTER ? c.count * (size_t)n : c.count;
    for (int r = 0; r < n; r++) {
        const unsigned char *s = (const unsigned char *)c.send[(size_t)r];
        if (c.kind == C_BROADCAST && r != c.root) continue;
        in[(size_t)r].assign(s, s + in_count * es);
    }
    if (c.kind == C_BROADCAST) {
        for (int r = 0; r < n; r++) memcpy(c.recv[(size_t)r], in[(size_t)c.root].data(), c.count * es);
        return;
    }
    if (c.kind == C_ALLGATHER) {
        for (int r = 0; r < n; r++)
            for (int q = 0; q < n; q++)
                memcpy((unsigned char *)c.recv[(size_t)r] + (size_t)q * c.count * es, in[(size_t)q].data(), c.count * es);
        return;
    }
    /* reductions: in rank order, in double (integers exact below 2^53) */
    std::vector<double> acc(in_count);
    for (size_t i = 0; i < in_count; i++) {
        double a = load(in[0].data(), i, c.type);
        for (int r = 1; r < n; r++) {
            double v = load(in[(size_t)r].data(), i, c.type);
            switch (c.op) {
            case ncclSum: case ncclAvg: a += v; break;
            case ncclProd: a *= v; break;
            case ncclMax: a = v > a ? v : a; break;
            case ncclMin: a = v < a ? v : a; break;
            default: mr_emu::fatal("nccl", "reduction operation %d is not emulated", (int)c.op);
            }
        }
        if (c.op == ncclAvg) a = is_int(c.type) ? (double)((int64_t)a / n) : a / n;
        acc[i] = a;
    }
    for (int r = 0; r < n; r++) {
        if (c.kind == C_ALLREDUCE)
            for (size_t i = 0; i < c.count; i++) store(c.recv[(size_t)r], i, c.type, acc[i]);
        else
            for (size_t i = 0; i < c.count; i++) store(c.recv[(size_t)r], i, c.type, acc[(size_t)r * c.count + i]);
    }
}

/* One rank's part, run in its stream order (lock held). */
void run_part(const std::shared_ptr<coll> &cp, int rank) {
    coll &c = *cp;
    if (!c.done && !c.cancelled) {
        /* the other ranks' streams up to their parts (the item's pre hook did it; this is cheap
         * then): the data this collective reads */
        for (int r = 0; r < c.nranks; r++)
            if (r != rank && c.seqs[(size_t)r] > 1) mr_emu::run_until(c.streams[(size_t)r], c.seqs[(size_t)r] - 1, false);
        /* again: those runs may have released the lock, and another rank's part computed it */
        if (!c.done && !c.cancelled) {
            compute(c);
            c.done = true;
        }
    }
    c.finished++;
}

ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last, sizeof t_last, fmt, ap);
    va_end(ap);
    return r;
}

bool check_buf(const void *p, size_t bytes, int device, const char *fn, const char *which, int rank) {
    int d = -1;
    if (!mr_emu::device_range(p, bytes, &d))
        mr_emu::fatal("nccl", "%s on rank %d: %s %p (%zu bytes) is not inside one device allocation", fn, rank, which, p,
                      bytes);
    if (d != device)
        mr_emu::fatal("nccl", "%s on rank %d: %s is memory of cuda:%d, the communicator's GPU is cuda:%d", fn, rank, which, d,
                      device);
    return true;
}

ncclResult_t collective(coll_kind kind, const void *send, void *recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm *comm, cudaStream_t stream) {
    const char *fn = coll_name(kind);
    if (!comm) return fail(ncclInvalidArgument, "%s: NULL communicator", fn);
    size_t es = type_size(type);
    if (es == 0) return fail(ncclInvalidArgument, "%s: invalid data type %d", fn, (int)type);
    if (kind != C_BROADCAST && kind != C_ALLGATHER && (op < ncclSum || op > ncclAvg))
        return fail(ncclInvalidArgument, "%s: invalid reduction %d", fn, (int)op);
    mr_emu::count_library_call();
    lock_guard lk;
    clique *q = comm->c;
    if (comm->aborted || q->aborted) return fail(ncclInvalidUsage, "%s: the communicator was aborted", fn);
    if (q->joined < q->nranks)
        mr_emu::fatal("nccl", "%s on rank %d before every rank has joined the communicator (poll ncclCommGetAsyncError "
                              "until it is no longer ncclInProgress)", fn, comm->rank);
    int n = q->nranks;
    size_t send_n = kind == C_REDUCESCATTER ? count * (size_t)n : count;
    size_t recv_n = kind == C_ALLGATHER ? count * (size_t)n : count;
    if (count > 0 && (kind != C_BROADCAST || comm->rank == root)) check_buf(send, send_n * es, comm->device, fn, "sendbuff", comm->rank);
    if (count > 0) check_buf(recv, recv_n * es, comm->device, fn, "recvbuff", comm->rank);
    if (kind == C_ALLGATHER && count > 0 && send != recv && (const unsigned char *)send != (unsigned char *)recv + (size_t)comm->rank * count * es) {
        /* out of place: the two must not overlap */
        const unsigned char *s = (const unsigned char *)send, *r = (const unsigned char *)recv;
        if (s < r + recv_n * es && r < s + send_n * es)
            mr_emu::fatal("nccl", "ncclAllGather on rank %d: sendbuff overlaps recvbuff but is not its rank-th slice", comm->rank);
    }
    if (!stream) mr_emu::fatal("nccl", "%s on rank %d: the legacy default stream (mirror always passes its own)", fn, comm->rank);
    if (mr_emu::stream_device(stream) != comm->device)
        mr_emu::fatal("nccl", "%s on rank %d: the stream belongs to cuda:%d, the communicator to cuda:%d", fn, comm->rank,
                      mr_emu::stream_device(stream), comm->device);
    uint64_t k = comm->nops++;
    std::shared_ptr<coll> &slot = q->ops[k];
    if (!slot) {
        slot = std::make_shared<coll>();
        slot->kind = kind;
        slot->count = count;
        slot->type = type;
        slot->op = op;
        slot->root = root;
        slot->nranks = n;
        slot->send.assign((size_t)n, nullptr);
        slot->recv.assign((size_t)n, nullptr);
        slot->streams.assign((size_t)n, nullptr);
        slot->seqs.assign((size_t)n, 0);
        slot->in.assign((size_t)n, false);
        slot->by.assign((size_t)n, pthread_t());
    } else if (slot->kind != kind || slot->count != count || slot->type != type ||
               (kind != C_BROADCAST && kind != C_ALLGATHER && slot->op != op) || (kind == C_BROADCAST && slot->root != root)) {
        mr_emu::fatal("nccl", "collective #%llu: rank %d calls %s(count %zu, type %d, op %d, root %d) but another rank "
                              "called %s(count %zu, type %d, op %d, root %d): on a GPU this hangs or corrupts memory",
                      (unsigned long long)k, comm->rank, fn, count, (int)type, (int)op, root, coll_name(slot->kind),
                      slot->count, (int)slot->type, (int)slot->op, slot->root);
    }
    std::shared_ptr<coll> cp = slot;
    if (t_group == 0)
        for (int r = 0; r < n; r++)
            if (r != comm->rank && cp->in[(size_t)r] && pthread_equal(cp->by[(size_t)r], pthread_self()))
                mr_emu::fatal("nccl", "%s #%llu: one host thread queued ranks %d and %d outside ncclGroupStart/End; on "
                                      "a GPU the first call waits for the other ranks and this thread never makes the "
                                      "second (deadlock): group the calls", fn, (unsigned long long)k, r, comm->rank);
    cp->by[(size_t)comm->rank] = pthread_self();
    cp->send[(size_t)comm->rank] = send;
    cp->recv[(size_t)comm->rank] = recv;
    int rank = comm->rank;
    item it;
    it.what = fn;
    it.fn = [cp, rank]() { run_part(cp, rank); };
    it.ready = [cp]() { return cp->queued == cp->nranks || cp->cancelled; };
    it.pre = [cp, rank](bool nonblocking) {
        for (int r = 0; r < cp->nranks && !cp->done && !cp->cancelled; r++)
            if (r != rank && cp->seqs[(size_t)r] > 1 &&
                !mr_emu::run_until(cp->streams[(size_t)r], cp->seqs[(size_t)r] - 1, nonblocking))
                return false;
        return true;
    };
    CUstream_st *s = nullptr;
    uint64_t seq = 0;
    /* NCCL launches on the communicator's GPU whatever the caller's current device, and restores it */
    int caller_dev = mr_emu::current_device();
    (void)cudaSetDevice(comm->device);
    cudaError_t e = mr_emu::enqueue_item(stream, std::move(it), &s, &seq);
    (void)cudaSetDevice(caller_dev);
    if (e != cudaSuccess) return fail(ncclUnhandledCudaError, "%s: %s", fn, cudaGetErrorString(e));
    if (seq == 0) mr_emu::fatal("nccl", "%s inside a CUDA graph capture is not emulated", fn);
    cp->streams[(size_t)rank] = s;
    cp->seqs[(size_t)rank] = seq;
    cp->in[(size_t)rank] = true;
    cp->queued++;
    if (cp->queued == n) q->ops.erase(k); /* every part holds it now */
    return ncclSuccess;
}

ncclResult_t init_rank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, bool blocking) {
    *out = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
    int dev = mr_emu::current_device();
    lock_guard lk;
    std::string key(id.internal, sizeof id.internal);
    clique *&q = g_cliques[key];
    if (!q) {
        q = new clique();
        q->id = key;
        q->nranks = nranks;
        q->ranks.assign((size_t)nranks, nullptr);
    }
    if (q->nranks != nranks)
        mr_emu::fatal("nccl", "ncclCommInitRank: rank %d says %d ranks, another rank of this id said %d", rank, nranks,
                      q->nranks);
    if (q->ranks[(size_t)rank]) mr_emu::fatal("nccl", "ncclCommInitRank: rank %d of this id was initialised twice", rank);
    for (ncclComm *o : q->ranks)
        if (o && o->device == dev)
            mr_emu::fatal("nccl", "ncclCommInitRank: ranks %d and %d of one communicator on the same GPU cuda:%d (NCCL "
                                  "refuses duplicate GPUs)", o->rank, rank, dev);
    ncclComm *c = new ncclComm();
    c->c = q;
    c->rank = rank;
    c->device = dev;
    c->blocking = blocking;
    q->ranks[(size_t)rank] = c;
    q->joined++;
    q->live++;
    *out = c;
    if (blocking && t_group == 0) mr_emu::wait_until([q] { return q->joined == q->nranks; }, "ncclCommInitRank");
    return blocking || q->joined == q->nranks ? ncclSuccess : ncclInProgress;
}

void release(ncclComm *c) {
    clique *q = c->c;
    q->ranks[(size_t)c->rank] = nullptr;
    if (--q->live == 0) {
        g_cliques.erase(q->id);
        delete q;
    }
    delete c;
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *v) {
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static uint64_t counter;
    lock_guard lk;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "mirror-emu-nccl %d %llu", (int)getpid(), (unsigned long long)++counter);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    bool blocking = !config || config->blocking != 0;
    return init_rank(comm, nranks, id, rank, blocking);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return init_rank(comm, nranks, id, rank, true);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *r) {
    if (!comm) return ncclInvalidArgument;
    lock_guard lk;
    if (comm->aborted) *r = ncclInvalidUsage;
    else if (comm->c->aborted) *r = ncclRemoteError;
    else *r = comm->c->joined == comm->c->nranks ? ncclSuccess : ncclInProgress;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    lock_guard lk;
    release(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    lock_guard lk;
    clique *q = comm->c;
    q->aborted = true;
    /* parts still waiting for this rank become no-ops, as an abort stops the kernels waiting for it */
    for (auto &kv : q->ops) kv.second->cancelled = true;
    release(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    *count = comm->c->nranks;
    return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    *device = comm->device;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    t_group++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (t_group == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    t_group--;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return collective(C_ALLREDUCE, send, recv, count, type, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    return collective(C_BROADCAST, send, recv, count, type, ncclSum, root, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
    return collective(C_ALLGATHER, send, recv, count, type, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    return collective(C_REDUCESCATTER, send, recv, count, type, op, 0, comm, stream);
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated)";
    case ncclSystemError: return "unhandled system error (emulated)";
    case ncclInternalError: return "internal error (emulated)";
    case ncclInvalidArgument: return "invalid argument (emulated)";
    case ncclInvalidUsage: return "invalid usage (emulated)";
    case ncclRemoteError: return "remote process exited or there was a network error (emulated)";
    case ncclInProgress: return "NCCL operation in progress (emulated)";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return t_last;
}

} // extern "C"
