/* Private to the CPU backend: lets the compiler vectorise expf/logf/tanhf loops.
 *
 * glibc declares its vector math library (libmvec) to the compiler only under -ffast-math, so
 * -fno-math-errno alone leaves these loops scalar (GELU and tanh ran ~4-5x slower). Declaring the
 * vector variants here vectorises them without fast-math's other effects. The vector and scalar
 * variants may differ in the last ulp, so a kernel must fix which elements take the vector body
 * independently of the thread count (whole rows, or fixed-size blocks). */
#ifndef MR_CPU_VEC_MATH_IMPL_H
#define MR_CPU_VEC_MATH_IMPL_H

#include <math.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__)
__attribute__((simd("notinbranch"))) float expf(float);
__attribute__((simd("notinbranch"))) float logf(float);
__attribute__((simd("notinbranch"))) float tanhf(float);
#endif

#endif
