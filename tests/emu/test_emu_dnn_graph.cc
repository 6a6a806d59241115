/* emu.test_emu_dnn_graph: the emulated cuDNN backend graph API (tests/emu/emu_dnn_graph.cc)
 * called directly through cudnn_graph_v9.h: a non-causal SDPA forward graph (the node sequence
 * core/cuda/attention_cudnn.cu builds) run on device memory against a double loop written here;
 * the same graph with a head dim of 12 gets no engine, and so does a graph of another shape; then
 * misuse cases, each in a forked child that must die with "mirror-emu: cudnn": an attribute of
 * the wrong type or count, a set after finalize, dims and strides of different counts, one uid
 * for two tensors, a virtual tensor in the variant pack, a tensor missing from it, host memory
 * for a device tensor, a workspace smaller than the plan's, a descriptor used after destroy or
 * destroyed twice, an operation naming a tensor that was never finalized. Plain checks, no
 * framework: prints each failure, exits 1 on any. */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
/* destroyed descriptors and handles are kept (marked dead) by the fakes, on purpose */
extern "C" const char *__lsan_default_suppressions(void) {
    return "leak:cudnnCreate\nleak:cudnnBackendCreateDescriptor\n";
}
#endif

static int g_checks, g_fail;

static void check(bool ok, const char *what) {
    g_checks++;
    if (!ok) {
        g_fail++;
        fprintf(stderr, "FAIL %s\n", what);
    }
}

#define OK(call)                                                                                   \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                          \
            fprintf(stderr, "FAIL %s: status %d\n", #call, (int)s_);                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef cudnnBackendDescriptor_t D;

enum { Q = 1, K, V, O, STATS, SCALE };

/* what a misuse case changes in the graph or its execution */
struct twist {
    int64_t d = 8;                /* head dim */
    bool dup_uid = false;         /* the scores get the uid of Q */
    bool virtual_in_pack = false; /* the scores' uid in the variant pack */
    bool drop_v = false;          /* V missing from the variant pack */
    bool host_q = false;          /* Q a host pointer */
    bool small_ws = false;        /* a workspace one byte short */
    bool extra_op = false;        /* an identity op after the scale: not an SDPA graph */
};

struct built {
    D plan = nullptr;
    int64_t ws = 0;
    int64_t engines = 0;
    std::string why;
};

static D mk(cudnnBackendDescriptorType_t t) {
    D d;
    OK(cudnnBackendCreateDescriptor(t, &d));
    return d;
}
static void at(D d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t c, const void *v) {
    OK(cudnnBackendSetAttribute(d, n, t, c, v));
}
static D tensor(cudnnDataType_t dt, std::vector<int64_t> dim, std::vector<int64_t> st, int64_t uid, bool virt,
                bool by_value = false) {
    D d = mk(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = 16;
    at(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    at(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, (int64_t)dim.size(), dim.data());
    at(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, (int64_t)st.size(), st.data());
    at(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    at(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    at(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) at(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    OK(cudnnBackendFinalize(d));
    return d;
}
static D pw(cudnnPointwiseMode_t m, D x, D b, D y) {
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    D p = mk(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    at(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m);
    at(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    OK(cudnnBackendFinalize(p));
    D op = mk(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    at(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
    at(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) at(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    at(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    OK(cudnnBackendFinalize(op));
    return op;
}
static D mm(D a, D b, D c) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    D m = mk(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    at(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    OK(cudnnBackendFinalize(m));
    D op = mk(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    at(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    at(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    at(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    at(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    OK(cudnnBackendFinalize(op));
    return op;
}
static D red(cudnnReduceTensorOp_t mode, D x, D y) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    D r = mk(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    at(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    at(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    OK(cudnnBackendFinalize(r));
    D op = mk(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    at(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    at(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    at(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    OK(cudnnBackendFinalize(op));
    return op;
}

/* The non-causal SDPA forward for (1, 1, T, d) x (1, 1, S, d), bf16 I/O, f32 stats. */
static built build(cudnnHandle_t h, int64_t t, int64_t s, const twist &w) {
    const int64_t d = w.d;
    int64_t uid = 100;
    auto v = [&](int64_t r, int64_t c, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
        return tensor(dt, {1, 1, r, c}, {r * c, r * c, c, 1}, uid++, true);
    };
    D q = tensor(CUDNN_DATA_BFLOAT16, {1, 1, t, d}, {t * d, t * d, d, 1}, Q, false);
    D kt = tensor(CUDNN_DATA_BFLOAT16, {1, 1, d, s}, {s * d, s * d, 1, d}, K, false);
    D vv = tensor(CUDNN_DATA_BFLOAT16, {1, 1, s, d}, {s * d, s * d, d, 1}, V, false);
    D o = tensor(CUDNN_DATA_BFLOAT16, {1, 1, t, d}, {t * d, t * d, d, 1}, O, false);
    D stats = tensor(CUDNN_DATA_FLOAT, {1, 1, t, 1}, {t, t, 1, 1}, STATS, false);
    D scale = tensor(CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, SCALE, false, true);
    D s0 = w.dup_uid ? tensor(CUDNN_DATA_FLOAT, {1, 1, t, s}, {t * s, t * s, s, 1}, Q, true) : v(t, s);
    D s1 = v(t, s), mx = v(t, 1), e0 = v(t, s), e = v(t, s), z = v(t, 1), lz = v(t, 1), p = v(t, s, CUDNN_DATA_BFLOAT16);
    std::vector<D> ops = {mm(q, kt, s0), pw(CUDNN_POINTWISE_MUL, s0, scale, s1)};
    if (w.extra_op) {
        D s2 = v(t, s);
        ops.push_back(pw(CUDNN_POINTWISE_IDENTITY, s1, nullptr, s2));
        s1 = s2;
    }
    ops.push_back(red(CUDNN_REDUCE_TENSOR_MAX, s1, mx));
    ops.push_back(pw(CUDNN_POINTWISE_SUB, s1, mx, e0));
    ops.push_back(pw(CUDNN_POINTWISE_EXP, e0, nullptr, e));
    ops.push_back(red(CUDNN_REDUCE_TENSOR_ADD, e, z));
    ops.push_back(pw(CUDNN_POINTWISE_LOG, z, nullptr, lz));
    ops.push_back(pw(CUDNN_POINTWISE_ADD, mx, lz, stats));
    ops.push_back(pw(CUDNN_POINTWISE_DIV, e, z, p));
    ops.push_back(mm(p, vv, o));
    D g = mk(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    at(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data());
    at(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    OK(cudnnBackendFinalize(g));
    D heur = mk(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    at(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
    at(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    OK(cudnnBackendFinalize(heur));
    D cfgs[4] = {mk(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR), mk(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR),
                 mk(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR), mk(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)};
    built b;
    OK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 4, &b.engines, cfgs));
    if (b.engines == 0) {
        char why[256];
        cudnnGetLastErrorString(why, sizeof why);
        b.why = why;
        return b;
    }
    /* the deterministic engine (the fake offers a non-deterministic one first) */
    D cfg = nullptr;
    for (int64_t i = 0; i < b.engines && !cfg; i++) {
        D eng = mk(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        int64_t n = 0, nn = 0;
        OK(cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng));
        OK(cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                    CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes));
        bool nondet = nn > 0 && notes[0] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
        check(nondet == (i == 0), "the fake's first engine is noted non-deterministic, the second not");
        if (!nondet) cfg = cfgs[i];
    }
    b.plan = mk(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    at(b.plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    at(b.plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    OK(cudnnBackendFinalize(b.plan));
    int64_t n = 0;
    OK(cudnnBackendGetAttribute(b.plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &b.ws));
    return b;
}

static float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

/* Runs the graph on seeded inputs and checks O and the stats against double loops. */
static void run(cudnnHandle_t h, int64_t t, int64_t s, const twist &w) {
    const int64_t d = w.d;
    built b = build(h, t, s, w);
    if (!b.plan) {
        fprintf(stderr, "FAIL no engine for a valid graph: %s\n", b.why.c_str());
        exit(1);
    }
    std::vector<__nv_bfloat16> hq(t * d), hk(s * d), hv(s * d), ho(t * d);
    std::vector<float> hs(t);
    uint32_t r = 12345;
    auto rnd = [&]() { return ((r = r * 1664525u + 1013904223u) >> 8) / 16777216.0f * 2 - 1; };
    for (auto &x : hq) x = __float2bfloat16(rnd());
    for (auto &x : hk) x = __float2bfloat16(rnd());
    for (auto &x : hv) x = __float2bfloat16(rnd());
    void *dq, *dk, *dv, *dob, *dst, *ws = nullptr;
    cudaMalloc(&dq, t * d * 2), cudaMalloc(&dk, s * d * 2), cudaMalloc(&dv, s * d * 2);
    cudaMalloc(&dob, t * d * 2), cudaMalloc(&dst, t * 4);
    if (b.ws) cudaMalloc(&ws, (size_t)b.ws - (w.small_ws ? 1 : 0));
    cudaMemcpy(dq, hq.data(), t * d * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dk, hk.data(), s * d * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, hv.data(), s * d * 2, cudaMemcpyHostToDevice);
    float scale = 0.5f;
    std::vector<int64_t> uids = {Q, K, V, O, STATS, SCALE};
    std::vector<void *> ptrs = {w.host_q ? (void *)hq.data() : dq, dk, dv, dob, dst, &scale};
    if (w.drop_v) uids.erase(uids.begin() + 2), ptrs.erase(ptrs.begin() + 2);
    if (w.virtual_in_pack) uids.push_back(100), ptrs.push_back(dob);
    D pack = mk(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    at(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data());
    at(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data());
    at(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    OK(cudnnBackendFinalize(pack));
    OK(cudnnBackendExecute(h, b.plan, pack));
    scale = 99.0f; /* a by-value scalar is read when the call is made */
    cudaMemcpy(ho.data(), dob, t * d * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(hs.data(), dst, t * 4, cudaMemcpyDeviceToHost);
    double worst_o = 0, worst_s = 0;
    for (int64_t i = 0; i < t; i++) {
        std::vector<double> sc(s);
        double m = -INFINITY, z = 0;
        for (int64_t j = 0; j < s; j++) {
            double a = 0;
            for (int64_t c = 0; c < d; c++) a += (double)__bfloat162float(hq[i * d + c]) * __bfloat162float(hk[j * d + c]);
            sc[j] = (float)((float)a * 0.5f);
            m = sc[j] > m ? sc[j] : m;
        }
        for (int64_t j = 0; j < s; j++) z += (float)exp((float)(sc[j] - m));
        worst_s = fmax(worst_s, fabs(hs[i] - (m + log(z))));
        for (int64_t c = 0; c < d; c++) {
            double y = 0;
            for (int64_t j = 0; j < s; j++) y += (double)bf((float)((float)exp((float)(sc[j] - m)) / (float)z)) * __bfloat162float(hv[j * d + c]);
            worst_o = fmax(worst_o, fabs(__bfloat162float(ho[i * d + c]) - bf((float)y)));
        }
    }
    char msg[160];
    snprintf(msg, sizeof msg, "sdpa forward graph t %lld s %lld d %lld: O off by %.3g, stats by %.3g", (long long)t,
             (long long)s, (long long)d, worst_o, worst_s);
    printf("%s %s\n", worst_o <= 8e-3 && worst_s <= 1e-5 ? "ok  " : "FAIL", msg);
    check(worst_o <= 8e-3 && worst_s <= 1e-5, msg);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dob), cudaFree(dst);
    if (ws) cudaFree(ws);
}

static void must_die(const char *name, const std::function<void()> &f) {
    int fd[2];
    fflush(stdout);
    fflush(stderr);
    if (pipe(fd) != 0) exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        signal(SIGABRT, SIG_DFL);
        f();
        cudaDeviceSynchronize();
        fprintf(stderr, "(the child returned)\n");
        fflush(stderr);
        _exit(0);
    }
    close(fd[1]);
    std::string out;
    char buf[512];
    ssize_t r;
    while ((r = read(fd[0], buf, sizeof buf)) > 0) out.append(buf, (size_t)r);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    bool died = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    size_t at_ = out.find("mirror-emu: cudnn");
    g_checks++;
    if (!died || at_ == std::string::npos) {
        g_fail++;
        fprintf(stderr, "FAIL misuse '%s': %s; its stderr:\n%s\n", name, died ? "died without the message" : "not reported",
                out.c_str());
    } else {
        size_t end = out.find('\n', at_);
        printf("ok   misuse %-40s %s\n", name, out.substr(at_, end == std::string::npos ? std::string::npos : end - at_).c_str());
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cudnnHandle_t h;
    OK(cudnnCreate(&h));
    run(h, 5, 7, twist());
    twist d64;
    d64.d = 64;
    run(h, 33, 17, d64);
    {
        twist w;
        w.d = 12;
        built b = build(h, 4, 4, w);
        check(b.engines == 0 && b.why.find("head dim") != std::string::npos, "head dim 12: no engine, saying why");
        printf("ok   head dim 12: %s\n", b.why.c_str());
        twist x;
        x.extra_op = true;
        b = build(h, 4, 4, x);
        check(b.engines == 0 && b.why.find("node sequence") != std::string::npos, "another graph: no engine");
        printf("ok   another node sequence: %s\n", b.why.c_str());
    }
    must_die("attribute of the wrong type", [&] {
        D d = mk(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        float f = 1;
        (void)cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_FLOAT, 1, &f);
    });
    must_die("attribute of the wrong count", [&] {
        D d = mk(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        int64_t u[2] = {1, 2};
        (void)cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 2, u);
    });
    must_die("set after finalize", [&] {
        D d = tensor(CUDNN_DATA_FLOAT, {1, 1, 2, 2}, {4, 4, 2, 1}, 7, false);
        int64_t u = 8;
        (void)cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &u);
    });
    must_die("dims and strides of different counts", [&] { tensor(CUDNN_DATA_FLOAT, {1, 1, 2, 2}, {4, 2, 1}, 7, false); });
    must_die("one uid for two tensors", [&] {
        twist w;
        w.dup_uid = true;
        build(h, 4, 4, w);
    });
    must_die("virtual tensor in the variant pack", [&] {
        twist w;
        w.virtual_in_pack = true;
        run(h, 4, 4, w);
    });
    must_die("tensor missing from the variant pack", [&] {
        twist w;
        w.drop_v = true;
        run(h, 4, 4, w);
    });
    must_die("host memory for a device tensor", [&] {
        twist w;
        w.host_q = true;
        run(h, 4, 4, w);
    });
    must_die("workspace smaller than the plan's", [&] {
        twist w;
        w.small_ws = true;
        run(h, 4, 4, w);
    });
    must_die("descriptor used after destroy", [&] {
        D d = mk(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        OK(cudnnBackendDestroyDescriptor(d));
        cudnnPointwiseMode_t m = CUDNN_POINTWISE_ADD;
        (void)cudnnBackendSetAttribute(d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m);
    });
    must_die("descriptor destroyed twice", [&] {
        D d = mk(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        OK(cudnnBackendDestroyDescriptor(d));
        (void)cudnnBackendDestroyDescriptor(d);
    });
    must_die("operation on a tensor never finalized", [&] {
        D x = mk(CUDNN_BACKEND_TENSOR_DESCRIPTOR), y = tensor(CUDNN_DATA_FLOAT, {1, 1, 2, 2}, {4, 4, 2, 1}, 9, true);
        pw(CUDNN_POINTWISE_EXP, x, nullptr, y);
    });
    printf("test_emu_dnn_graph: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
