/* MR_HD marks per-element math that compiles for host and device: `__host__ __device__` under
 * nvcc, plain C elsewhere. Every op's math header uses it so the CPU, the reference and the CUDA
 * kernels share one definition (docs/STYLE.md rule 5). */
#ifndef MR_MATH_HD_H
#define MR_MATH_HD_H
#ifdef __CUDACC__
#define MR_HD __host__ __device__
#else
#define MR_HD
#endif
#endif
