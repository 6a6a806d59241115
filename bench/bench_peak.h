/* The machine's measured fp32 peak, shared by the benchmarks: an FMA loop with 16 independent
 * accumulator chains per thread (AVX-512, else AVX2), best of 5 runs, on `threads` threads. Every
 * "% of peak" in bench/ is against this number, measured in the same run. */
#ifndef MR_BENCH_PEAK_H
#define MR_BENCH_PEAK_H

#include <immintrin.h>
#include <time.h>

#include "core/cpu/cpu_impl.h"

static double bench_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

__attribute__((target("avx512f"))) static float fma_loop_avx512(long iters) {
    __m512 acc[16], x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
    for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    __m512 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fma_loop_avx2(long iters) {
    __m256 acc[12], x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    float out[8], s = 0;
    for (int i = 1; i < 12; i++) acc[0] = _mm256_add_ps(acc[0], acc[i]);
    _mm256_storeu_ps(out, acc[0]);
    for (int i = 0; i < 8; i++) s += out[i];
    return s;
}

/* GFLOP/s of the FMA loop on `threads` threads (best of 5). */
static double peak_fp32(int threads) {
    const mr_cpu_caps *k = mr_cpu_caps_get();
    int avx512 = k->avx512f;
    long iters = 20000000;
    double flops_per_iter = avx512 ? 16.0 * 16 * 2 : 12.0 * 8 * 2;
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = bench_now_s();
#pragma omp parallel num_threads(threads)
        {
            float r = avx512 ? fma_loop_avx512(iters) : (k->avx2 ? fma_loop_avx2(iters) : 0.0f);
#pragma omp atomic
            sink += r;
        }
        double t = bench_now_s() - t0;
        double g = flops_per_iter * (double)iters * threads / t / 1e9;
        if (g > best) best = g;
    }
    (void)sink;
    return best;
}

/* The bf16 dot-product peak: a vdpbf16ps loop (16 independent f32 accumulator chains per thread;
 * each instruction is 16 lanes x 2 bf16 products, 64 flops), best of 5. 0 without AVX512_BF16.
 * The bf16 GEMM's "% of peak" is against this, which is 2x the fp32 FMA peak on CPUs that issue
 * vdpbf16ps at the FMA rate. */
__attribute__((target("avx512f,avx512bf16"))) static float dpbf16_loop(long iters) {
    __m512 acc[16];
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x00010001);
    for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 16; i++) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
    __m512 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

/* GFLOP/s of the vdpbf16ps loop on `threads` threads (best of 5); 0 when the CPU lacks it. */
__attribute__((unused)) static double peak_bf16(int threads) {
    if (!mr_cpu_caps_get()->avx512_bf16) return 0.0;
    long iters = 20000000;
    double flops_per_iter = 16.0 * 64;
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = bench_now_s();
#pragma omp parallel num_threads(threads)
        {
            float r = dpbf16_loop(iters);
#pragma omp atomic
            sink += r;
        }
        double t = bench_now_s() - t0;
        double g = flops_per_iter * (double)iters * threads / t / 1e9;
        if (g > best) best = g;
    }
    (void)sink;
    return best;
}

#endif
