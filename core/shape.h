/* Shapes: up to MR_MAX_DIMS dimensions with int64 sizes, row-major contiguous. A small value
 * struct, passed by pointer to const or by value. */
#ifndef MR_SHAPE_H
#define MR_SHAPE_H

#include <stdint.h>
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_MAX_DIMS 8

typedef struct mr_shape {
    int ndim;                  /* 0 (a scalar) .. MR_MAX_DIMS */
    int64_t dim[MR_MAX_DIMS];  /* dim[i] >= 0; entries past ndim are 0 */
} mr_shape;

/* Builds a shape from n sizes. MR_ASSERTs 0 <= n <= MR_MAX_DIMS (a programmer bug). */
mr_shape mr_shape_make(int n, const int64_t *dims);
mr_shape mr_shape_1d(int64_t d0);
mr_shape mr_shape_2d(int64_t d0, int64_t d1);
mr_shape mr_shape_3d(int64_t d0, int64_t d1, int64_t d2);
mr_shape mr_shape_4d(int64_t d0, int64_t d1, int64_t d2, int64_t d3);

/* Number of elements (1 for a scalar). */
int64_t mr_shape_numel(const mr_shape *s);
/* Non-zero when equal in ndim and every size. */
int mr_shape_eq(const mr_shape *a, const mr_shape *b);
/* Writes "[2, 3, 4]" into buf (always NUL-terminated); returns buf. */
char *mr_shape_str(const mr_shape *s, char *buf, int cap);
/* Row-major strides in elements. */
void mr_shape_strides(const mr_shape *s, int64_t strides[MR_MAX_DIMS]);
/* Numpy broadcasting of a and b into out. MR_ERR_INVALID naming both shapes if incompatible. */
mr_status mr_shape_broadcast(const mr_shape *a, const mr_shape *b, mr_shape *out) MR_WUR;
/* Size of the last dim and product of the others (rows x cols view); for ndim 0: 1 x 1. */
void mr_shape_rows_cols(const mr_shape *s, int64_t *rows, int64_t *cols);

#ifdef __cplusplus
}
#endif
#endif
