/* Tensors over refcounted storage (see tensor.h). */
#include "core/tensor.h"
#include "core/backend_impl.h"

#include <stdatomic.h>
#include <string.h>

typedef struct mr_storage {
    atomic_int refs;
    mr_device dev;
    const mr_backend *be;
    void *data;
    size_t bytes;
} mr_storage;

struct mr_tensor {
    mr_storage *st;
    int64_t offset; /* elements */
    mr_dtype dtype;
    mr_shape shape;
};

static atomic_llong g_allocs;

int64_t mr_tensor_alloc_count(void) { return (int64_t)atomic_load(&g_allocs); }

static mr_status check_shape(const mr_shape *s) {
    if (s->ndim < 0 || s->ndim > MR_MAX_DIMS)
        return mr_set_error(MR_ERR_INVALID, "tensor: ndim %d out of range [0, %d]", s->ndim, MR_MAX_DIMS);
    for (int i = 0; i < s->ndim; i++)
        if (s->dim[i] < 0)
            return mr_set_error(MR_ERR_INVALID, "tensor: dim %d is negative (%lld)", i, (long long)s->dim[i]);
    return MR_OK;
}

mr_status mr_tensor_new(mr_device dev, mr_dtype dtype, const mr_shape *shape, mr_tensor **out) {
    mr_status st = MR_OK;
    mr_storage *s = NULL;
    mr_tensor *t = NULL;
    const mr_backend *be = NULL;
    *out = NULL;
    MR_TRY(check_shape(shape));
    MR_CHECK(mr_dtype_size(dtype) > 0, MR_ERR_INVALID, "tensor: invalid dtype %d", (int)dtype);
    MR_TRY(mr_backend_get(dev.kind, &be));
    int64_t n = mr_shape_numel(shape);
    MR_CHECK(n <= (int64_t)(SIZE_MAX / 2 / mr_dtype_size(dtype)), MR_ERR_INVALID, "tensor: %lld elements is too many",
             (long long)n);
    s = calloc(1, sizeof *s);
    t = calloc(1, sizeof *t);
    MR_CHECK(s && t, MR_ERR_NOMEM, "tensor: out of host memory");
    s->bytes = (size_t)n * mr_dtype_size(dtype);
    s->dev = dev;
    s->be = be;
    MR_TRY(be->alloc(dev.index, s->bytes, &s->data));
    atomic_fetch_add(&g_allocs, 1);
    atomic_init(&s->refs, 1);
    t->st = s;
    t->dtype = dtype;
    t->shape = *shape;
    *out = t;
    return MR_OK;
fail:
    free(s);
    free(t);
    return st;
}

mr_status mr_tensor_zeros(mr_device dev, mr_dtype dtype, const mr_shape *shape, mr_tensor **out) {
    mr_status st = mr_tensor_new(dev, dtype, shape, out);
    if (st != MR_OK) return st;
    st = (*out)->st->be->memset_zero(dev.index, (*out)->st->data, (*out)->st->bytes, NULL);
    if (st != MR_OK) {
        mr_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

mr_status mr_tensor_view(const mr_tensor *t, int64_t offset, const mr_shape *shape, mr_tensor **out) {
    *out = NULL;
    mr_status st = check_shape(shape);
    if (st != MR_OK) return st;
    int64_t n = mr_shape_numel(shape), have = mr_shape_numel(&t->shape);
    if (offset < 0 || offset > have || n > have - offset) {
        char b1[128], b2[128];
        return mr_set_error(MR_ERR_INVALID, "tensor: view %s at offset %lld does not fit in a tensor of shape %s",
                            mr_shape_str(shape, b1, sizeof b1), (long long)offset,
                            mr_shape_str(&t->shape, b2, sizeof b2));
    }
    mr_tensor *v = calloc(1, sizeof *v);
    if (!v) return mr_set_error(MR_ERR_NOMEM, "tensor: out of host memory");
    atomic_fetch_add(&t->st->refs, 1);
    v->st = t->st;
    v->offset = t->offset + offset;
    v->dtype = t->dtype;
    v->shape = *shape;
    *out = v;
    return MR_OK;
}

mr_status mr_tensor_reshape(const mr_tensor *t, const mr_shape *shape, mr_tensor **out) {
    *out = NULL;
    mr_status st = check_shape(shape);
    if (st != MR_OK) return st;
    if (mr_shape_numel(shape) != mr_shape_numel(&t->shape)) {
        char b1[128], b2[128];
        return mr_set_error(MR_ERR_INVALID, "tensor: cannot reshape %s into %s (element counts differ)",
                            mr_shape_str(&t->shape, b1, sizeof b1), mr_shape_str(shape, b2, sizeof b2));
    }
    return mr_tensor_view(t, 0, shape, out);
}

void mr_tensor_free(mr_tensor *t) {
    if (!t) return;
    mr_storage *s = t->st;
    free(t);
    if (atomic_fetch_sub(&s->refs, 1) == 1) {
        s->be->free(s->dev.index, s->data);
        free(s);
    }
}

const mr_shape *mr_tensor_shape(const mr_tensor *t) { return &t->shape; }
mr_dtype mr_tensor_dtype(const mr_tensor *t) { return t->dtype; }
mr_device mr_tensor_device(const mr_tensor *t) { return t->st->dev; }
int64_t mr_tensor_numel(const mr_tensor *t) { return mr_shape_numel(&t->shape); }
size_t mr_tensor_nbytes(const mr_tensor *t) { return (size_t)mr_tensor_numel(t) * mr_dtype_size(t->dtype); }
void *mr_tensor_data(const mr_tensor *t) { return (char *)t->st->data + (size_t)t->offset * mr_dtype_size(t->dtype); }
int mr_tensor_storage_refs(const mr_tensor *t) { return atomic_load(&t->st->refs); }

mr_view mr_tensor_as_view(const mr_tensor *t) {
    mr_view v = {mr_tensor_data(t), t->dtype, t->shape};
    return v;
}

mr_status mr_tensor_copy_from_host(mr_tensor *t, const void *h_src, size_t bytes) {
    if (bytes != mr_tensor_nbytes(t))
        return mr_set_error(MR_ERR_INVALID, "tensor: copy of %zu bytes into a tensor of %zu bytes", bytes,
                            mr_tensor_nbytes(t));
    mr_copy_kind k = t->st->dev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_H2D;
    mr_status st = t->st->be->copy(t->st->dev.index, mr_tensor_data(t), h_src, bytes, k, NULL);
    if (st != MR_OK) return st;
    return t->st->be->stream_sync(NULL);
}

mr_status mr_tensor_copy_to_host(const mr_tensor *t, void *h_dst, size_t bytes) {
    if (bytes != mr_tensor_nbytes(t))
        return mr_set_error(MR_ERR_INVALID, "tensor: copy of a tensor of %zu bytes into %zu bytes",
                            mr_tensor_nbytes(t), bytes);
    mr_copy_kind k = t->st->dev.kind == MR_DEVICE_CPU ? MR_COPY_H2H : MR_COPY_D2H;
    mr_status st = t->st->be->copy(t->st->dev.index, h_dst, mr_tensor_data(t), bytes, k, NULL);
    if (st != MR_OK) return st;
    return t->st->be->stream_sync(NULL);
}

mr_status mr_tensor_to(const mr_tensor *t, mr_device dev, mr_tensor **out) {
    mr_status st = MR_OK;
    mr_tensor *r = NULL;
    void *tmp = NULL;
    *out = NULL;
    MR_TRY(mr_tensor_new(dev, t->dtype, &t->shape, &r));
    size_t bytes = mr_tensor_nbytes(t);
    if (t->st->dev.kind == MR_DEVICE_CPU) {
        MR_TRY(mr_tensor_copy_from_host(r, mr_tensor_data(t), bytes));
    } else if (dev.kind == MR_DEVICE_CPU) {
        MR_TRY(mr_tensor_copy_to_host(t, mr_tensor_data(r), bytes));
    } else {
        /* device to device through the host: correct across devices of any kind */
        tmp = malloc(bytes ? bytes : 1);
        MR_CHECK(tmp, MR_ERR_NOMEM, "tensor: out of host memory for a %zu-byte copy", bytes);
        MR_TRY(mr_tensor_copy_to_host(t, tmp, bytes));
        MR_TRY(mr_tensor_copy_from_host(r, tmp, bytes));
    }
    free(tmp);
    *out = r;
    return MR_OK;
fail:
    free(tmp);
    mr_tensor_free(r);
    return st;
}
