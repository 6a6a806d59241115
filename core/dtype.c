/* dtype sizes, names and scalar conversions. */
#include "core/dtype.h"
#include "core/math/half_math.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} g_dt[MR_DTYPE_COUNT] = {
    [MR_F32] = {"f32", 4}, [MR_F64] = {"f64", 8}, [MR_F16] = {"f16", 2}, [MR_BF16] = {"bf16", 2},
    [MR_I32] = {"i32", 4}, [MR_I64] = {"i64", 8}, [MR_U8] = {"u8", 1},
};

size_t mr_dtype_size(mr_dtype t) { return ((unsigned)t < MR_DTYPE_COUNT) ? g_dt[t].size : 0; }

const char *mr_dtype_name(mr_dtype t) { return ((unsigned)t < MR_DTYPE_COUNT) ? g_dt[t].name : "?"; }

mr_status mr_dtype_parse(const char *name, mr_dtype *out) {
    for (int i = 0; i < MR_DTYPE_COUNT; i++) {
        if (!strcmp(name, g_dt[i].name)) {
            *out = (mr_dtype)i;
            return MR_OK;
        }
    }
    if (!strcmp(name, "float32")) { *out = MR_F32; return MR_OK; }
    if (!strcmp(name, "float64")) { *out = MR_F64; return MR_OK; }
    if (!strcmp(name, "float16")) { *out = MR_F16; return MR_OK; }
    if (!strcmp(name, "bfloat16")) { *out = MR_BF16; return MR_OK; }
    return mr_set_error(MR_ERR_INVALID, "unknown dtype '%s' (expected f32, f64, f16, bf16, i32, i64 or u8)", name);
}

int mr_dtype_is_float(mr_dtype t) { return t == MR_F32 || t == MR_F64 || t == MR_F16 || t == MR_BF16; }

uint16_t mr_float_to_f16(float f) { return mr_f32_to_f16(f); }
float mr_f16_to_float(uint16_t h) { return mr_f16_to_f32(h); }
uint16_t mr_float_to_bf16(float f) { return mr_f32_to_bf16(f); }
float mr_bf16_to_float(uint16_t h) { return mr_bf16_to_f32(h); }

double mr_dtype_get(const void *buf, mr_dtype t, int64_t i) {
    switch (t) {
    case MR_F32: return ((const float *)buf)[i];
    case MR_F64: return ((const double *)buf)[i];
    case MR_F16: return mr_f16_to_f32(((const uint16_t *)buf)[i]);
    case MR_BF16: return mr_bf16_to_f32(((const uint16_t *)buf)[i]);
    case MR_I32: return ((const int32_t *)buf)[i];
    case MR_I64: return (double)((const int64_t *)buf)[i];
    case MR_U8: return ((const uint8_t *)buf)[i];
    default: return 0.0;
    }
}

void mr_dtype_set(void *buf, mr_dtype t, int64_t i, double v) {
    switch (t) {
    case MR_F32: ((float *)buf)[i] = (float)v; break;
    case MR_F64: ((double *)buf)[i] = v; break;
    /* f64 -> f16 goes through f32: double rounding can differ from a direct conversion only in
     * ties created by the first rounding, which cannot occur for values that came from f32. */
    case MR_F16: ((uint16_t *)buf)[i] = mr_f32_to_f16((float)v); break;
    case MR_BF16: ((uint16_t *)buf)[i] = mr_f32_to_bf16((float)v); break;
    case MR_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case MR_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case MR_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}
