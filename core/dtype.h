/* Element types and scalar conversions.
 *
 * f64 exists on the CPU for references and gradient checks; f16/bf16 are storage and compute
 * types for mixed precision; i32/i64/u8 hold labels, token ids, masks and raw bytes. */
#ifndef MR_DTYPE_H
#define MR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mr_dtype {
    MR_F32 = 0,
    MR_F64 = 1,
    MR_F16 = 2,
    MR_BF16 = 3,
    MR_I32 = 4,
    MR_I64 = 5,
    MR_U8 = 6,
    MR_DTYPE_COUNT = 7
} mr_dtype;

/* Bytes per element; 0 for an invalid dtype. */
size_t mr_dtype_size(mr_dtype t);
/* "f32", "bf16", ...; "?" for an invalid dtype. */
const char *mr_dtype_name(mr_dtype t);
/* Parses a name from mr_dtype_name; MR_ERR_INVALID (message names the string) if unknown. */
mr_status mr_dtype_parse(const char *name, mr_dtype *out) MR_WUR;
/* Non-zero for f32, f64, f16, bf16. */
int mr_dtype_is_float(mr_dtype t);

/* Scalar conversions (round to nearest even, see core/math/half_math.h). */
uint16_t mr_float_to_f16(float f);
float mr_f16_to_float(uint16_t h);
uint16_t mr_float_to_bf16(float f);
float mr_bf16_to_float(uint16_t h);

/* Reads element i of a buffer of type t as a double / writes double v into element i
 * (float types round as the cast op does; integers truncate toward zero). */
double mr_dtype_get(const void *buf, mr_dtype t, int64_t i);
void mr_dtype_set(void *buf, mr_dtype t, int64_t i, double v);

#ifdef __cplusplus
}
#endif
#endif
