/* `mirror doctor`: what this machine and this build of mirror consist of, and whether they compute
 * correctly. It prints mirror's version and build, the CPU (model, cores, the vector features the
 * GEMM kernels use) and the CPU GEMM provider, the MPI and HDF5 libraries actually loaded, and in
 * a CUDA build the driver, runtime, cuBLAS, cuDNN and NCCL versions and every GPU
 * (core/cuda/doctor_cuda.cu, so that this file includes no CUDA header). Then a self-check: a
 * 256x256x256 f32 GEMM through mr_op_run on the CPU and on each GPU, compared with the f64
 * reference. Meant to be the first thing to run on a new cluster node, and the first thing to
 * paste into a bug report. Exit status: 0 when every check passes, 1 otherwise, 2 for bad
 * arguments. */
#include <hdf5.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend_impl.h"
#include "core/cpu/cpu_impl.h" /* mr_cpu_gemm_bf16_provider */
#include "core/device.h"
#include "core/ops.h"
#include "core/tensor.h"

enum { GEMM_N = 256 };
/* f32 GEMM against the f64 reference: K = 256 products of values in [-1, 1) accumulate about
 * 1e-5 of rounding error; the unit tests' f32 reduction tolerance (tests/tolerances.h) leaves
 * room for any summation order but not for a wrong result or a TF32 path. */
static const double GEMM_ATOL = 1e-4, GEMM_RTOL = 1e-3;

/* The "model name" line of /proc/cpuinfo into buf ("unknown" when absent, e.g. on ARM). */
static void cpu_model(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        snprintf(buf, cap, "%s", v);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
}

static void print_libraries(void) {
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    /* one of the few MPI calls allowed before MPI_Init */
    if (MPI_Get_library_version(mpi, &len) == MPI_SUCCESS) {
        mpi[len < (int)sizeof mpi ? len : (int)sizeof mpi - 1] = '\0';
        mpi[strcspn(mpi, "\n")] = '\0';
        printf("mpi: %s (MPI %d.%d)\n", mpi, MPI_VERSION, MPI_SUBVERSION);
    } else {
        printf("mpi: version unknown (MPI_Get_library_version failed)\n");
    }
    unsigned maj = 0, min = 0, rel = 0;
    if (H5get_libversion(&maj, &min, &rel) >= 0)
        printf("hdf5: %u.%u.%u (built with %d.%d.%d)\n", maj, min, rel, H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE);
    else
        printf("hdf5: version unknown (H5get_libversion failed)\n");
}

/* Deterministic values in [-1, 1) (xorshift64*), rounded to f32 so both runs see the same. */
static void fill(float *h32, double *h64, int64_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        double u = (double)((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
        h32[i] = (float)(2.0 * u - 1.0);
        h64[i] = h32[i];
    }
}

/* Runs C = A*B (f32) on `dev` and compares it with `ref`; prints one line, returns 1 on PASS. */
static int gemm_check(mr_device dev, const float *ha, const float *hb, const double *ref) {
    const int64_t n = GEMM_N, nn = n * n;
    mr_shape s = mr_shape_2d(n, n);
    mr_tensor *ta = NULL, *tb = NULL, *tc = NULL;
    float *hc = malloc((size_t)nn * sizeof *hc);
    char name[32], err[512] = "";
    int ok = 0;
    mr_status st = hc ? MR_OK : mr_set_error(MR_ERR_NOMEM, "out of host memory");
    mr_device_str(dev, name, (int)sizeof name);
    if (st == MR_OK) st = mr_tensor_new(dev, MR_F32, &s, &ta);
    if (st == MR_OK) st = mr_tensor_new(dev, MR_F32, &s, &tb);
    if (st == MR_OK) st = mr_tensor_new(dev, MR_F32, &s, &tc);
    if (st == MR_OK) st = mr_tensor_copy_from_host(ta, ha, (size_t)nn * sizeof(float));
    if (st == MR_OK) st = mr_tensor_copy_from_host(tb, hb, (size_t)nn * sizeof(float));
    if (st == MR_OK) {
        /* C starts as NaN: with beta = 0 a kernel that skips an element shows up */
        for (int64_t i = 0; i < nn; i++) hc[i] = NAN;
        st = mr_tensor_copy_from_host(tc, hc, (size_t)nn * sizeof(float));
    }
    if (st == MR_OK) {
        mr_op_args a;
        mr_op_args_init(&a, MR_OP_GEMM);
        a.p.gemm.alpha = 1.0;
        a.in[0] = mr_tensor_as_view(ta);
        a.in[1] = mr_tensor_as_view(tb);
        a.out[0] = mr_tensor_as_view(tc);
        a.device = dev.index;
        st = mr_op_run(dev.kind, &a);
    }
    if (st == MR_OK) st = mr_tensor_copy_to_host(tc, hc, (size_t)nn * sizeof(float));
    if (st != MR_OK) {
        snprintf(err, sizeof err, "%s", mr_last_error());
        printf("gemm %dx%dx%d f32 on %s: FAIL: %s\n", GEMM_N, GEMM_N, GEMM_N, name, err);
    } else {
        double max_abs = 0, max_rel = 0;
        int64_t bad = 0;
        for (int64_t i = 0; i < nn; i++) {
            double d = fabs((double)hc[i] - ref[i]);
            if (!(d <= GEMM_ATOL + GEMM_RTOL * fabs(ref[i]))) bad++; /* NaN counts as bad */
            if (!(d <= max_abs)) max_abs = d;
            if (fabs(ref[i]) >= 1.0 && !(d / fabs(ref[i]) <= max_rel)) max_rel = d / fabs(ref[i]);
        }
        ok = bad == 0;
        printf("gemm %dx%dx%d f32 on %s: max abs error %.2e, max rel error %.2e (where |ref| >= 1); %s", GEMM_N, GEMM_N,
               GEMM_N, name, max_abs, max_rel, ok ? "PASS\n" : "FAIL: ");
        if (!ok)
            printf("%lld of %lld elements outside %g + %g*|ref|\n", (long long)bad, (long long)nn, GEMM_ATOL,
                   GEMM_RTOL);
    }
    mr_tensor_free(ta);
    mr_tensor_free(tb);
    mr_tensor_free(tc);
    free(hc);
    return ok;
}

/* Prints one device's allocator counters after the check (CUDA: shows the cache at work). */
static void print_memory(mr_device dev) {
    mr_memory_stats m;
    char name[32];
    if (mr_device_memory_stats(dev, &m) != MR_OK) return;
    printf("%s memory: %.1f MiB in use, %.1f MiB reserved (peak %.1f), %lld allocations, %lld from the cache, "
           "%lld driver allocations\n",
           mr_device_str(dev, name, (int)sizeof name), (double)m.in_use / (1 << 20), (double)m.reserved / (1 << 20),
           (double)m.peak_reserved / (1 << 20), (long long)m.allocs, (long long)m.cache_hits,
           (long long)m.raw_allocs);
}

int mirror_doctor(int argc, char **argv) {
    (void)argv;
    if (argc > 2) {
        fprintf(stderr, "mirror: error: doctor takes no arguments\nHINT: mirror help doctor\n");
        return 2;
    }
    char model[256];
    cpu_model(model, sizeof model);
    const char *feat = mr_cpu_features();
    printf("mirror %s (CUDA backend %s)\n", MIRROR_VERSION,
           mr_cuda_compiled() ? "compiled" : "not compiled: built with -DMIRROR_CUDA=OFF or without nvcc");
    printf("cpu: %s, %ld cores online, %d threads for mirror\n", model, sysconf(_SC_NPROCESSORS_ONLN), mr_cpu_threads());
    printf("cpu features: %s\n", feat[0] ? feat : "none of sse4.2/avx/avx2/fma/avx-512/amx");
    printf("cpu gemm: %s\n", mr_cpu_gemm_provider());
    printf("cpu gemm bf16: %s (mixed_bfloat16's linear layers)\n", mr_cpu_gemm_bf16_provider());
    if (mr_cpu_caps_get()->amx_bf16 && !mr_cpu_amx_bf16_usable()) /* the CPU has AMX, mirror does not use it */
        printf("cpu amx: not used: %s\n", mr_cpu_amx_bf16_why());
    print_libraries();

    int ngpu = 0;
#ifdef MIRROR_HAVE_CUDA
    mr_cuda_doctor_report(stdout);
    ngpu = mr_cuda_device_count();
#endif
    if (ngpu == 0) printf("gpu: none usable (%s); checking the CPU only\n", mr_cuda_unusable_reason());

    /* the self-check: one f64 reference for every device */
    const int64_t nn = (int64_t)GEMM_N * GEMM_N;
    float *ha = malloc((size_t)nn * sizeof *ha), *hb = malloc((size_t)nn * sizeof *hb);
    double *a64 = malloc((size_t)nn * sizeof *a64), *b64 = malloc((size_t)nn * sizeof *b64);
    double *ref = calloc((size_t)nn, sizeof *ref);
    int failed = 0, checks = 0;
    if (!ha || !hb || !a64 || !b64 || !ref) {
        printf("self-check: FAIL: out of host memory\n");
        failed = 1;
        goto done;
    }
    fill(ha, a64, nn, 1);
    fill(hb, b64, nn, 2);
    mr_op_args r;
    mr_op_args_init(&r, MR_OP_GEMM);
    r.p.gemm.alpha = 1.0;
    r.in[0] = (mr_view){a64, MR_F64, mr_shape_2d(GEMM_N, GEMM_N)};
    r.in[1] = (mr_view){b64, MR_F64, mr_shape_2d(GEMM_N, GEMM_N)};
    r.out[0] = (mr_view){ref, MR_F64, mr_shape_2d(GEMM_N, GEMM_N)};
    if (mr_op_run_ref(&r) != MR_OK) {
        printf("self-check: FAIL: the f64 reference GEMM: %s\n", mr_last_error());
        failed = 1;
        goto done;
    }
    checks++;
    failed += !gemm_check(mr_device_cpu(), ha, hb, ref);
    for (int i = 0; i < ngpu; i++) {
        mr_device d = {MR_DEVICE_CUDA, i};
        checks++;
        failed += !gemm_check(d, ha, hb, ref);
        print_memory(d);
    }
    if (failed) printf("doctor: %d of %d checks FAILED\n", failed, checks);
    else printf("doctor: all %d checks passed\n", checks);
done:
    free(ha);
    free(hb);
    free(a64);
    free(b64);
    free(ref);
    return failed ? 1 : 0;
}
