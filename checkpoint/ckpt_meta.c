/* Checkpoint reader, the metadata half: opening (and recognising a mirror checkpoint by its
 * "format" and "format_version" attributes), closing, where objects are, listing datasets and
 * reading root attributes. The dataset half (info, read with shape/crc checks, verify) is
 * ckpt_read.c; both share the reader struct and helpers through ckpt_impl.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/ckpt_impl.h"

/* The object type at path (lock held): H5O_TYPE_UNKNOWN when nothing is there. Checks each
 * prefix first, since HDF5 fails rather than answers "no" for a missing intermediate group. */
H5O_type_t ckpt_obj_type(hid_t file, const char *path) {
    size_t n = strlen(path);
    char *buf = malloc(n + 1);
    if (!buf) return H5O_TYPE_UNKNOWN;
    memcpy(buf, path, n + 1);
    H5O_type_t t = H5O_TYPE_UNKNOWN;
    for (size_t i = 0; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        htri_t ex = i == 0 ? 0 : H5Lexists(file, buf, H5P_DEFAULT);
        buf[i] = c;
        if (ex <= 0) goto out;
    }
    H5O_info_t info;
    if (H5Oget_info_by_name2(file, path, &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0) t = info.type;
out:
    free(buf);
    return t;
}

/* ---- open / close ---------------------------------------------------------------------------- */

mr_status mr_ckpt_open(const char *path, int flags, mr_ckpt_reader **out) {
    mr_status st = MR_OK;
    char h5e[256];
    mr_ckpt_reader *r = NULL;
    hid_t fapl = -1;
    char *fmt = NULL;
    struct stat sb;
    if (!out) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_open: out is NULL");
    *out = NULL;
    if (!path || (flags & ~MR_CKPT_FOREIGN))
        return mr_set_error(MR_ERR_INVALID, "mr_ckpt_open: NULL path or unknown flags 0x%x", (unsigned)flags);
    if (stat(path, &sb) != 0)
        return mr_set_error(errno == ENOENT ? MR_ERR_NOT_FOUND : MR_ERR_IO, "%s: cannot open checkpoint: %s", path,
                            strerror(errno));
    if (S_ISDIR(sb.st_mode)) return mr_set_error(MR_ERR_FORMAT, "%s: is a directory, not a checkpoint file", path);
    FILE *probe = fopen(path, "rb");
    if (!probe) return mr_set_error(MR_ERR_IO, "%s: cannot open checkpoint: %s", path, strerror(errno));
    fclose(probe);
    r = calloc(1, sizeof *r + strlen(path) + 1);
    if (!r) return mr_set_error(MR_ERR_NOMEM, "%s: out of memory", path);
    strcpy(r->path, path);
    r->flags = flags;
    r->file = -1;
    mr_h5_enter();
    MR_CHECK(H5Fis_hdf5(path) > 0, MR_ERR_FORMAT, "%s: not an HDF5 file (no HDF5 signature; empty or not a checkpoint)",
             path);
    fapl = ckpt_h5_fapl();
    MR_TRY_H5(fapl, MR_ERR_INTERNAL, "%s: file access properties", path);
    r->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    MR_TRY_H5(r->file, MR_ERR_FORMAT, "%s: cannot open as HDF5 (truncated or corrupt file?)", path);
    if (!(flags & MR_CKPT_FOREIGN)) {
        st = ckpt_attr_get_str(r->file, path, "format", &fmt);
        if (st == MR_ERR_NOT_FOUND || st == MR_ERR_INVALID)
            st = mr_set_error(MR_ERR_FORMAT, "%s: not a mirror checkpoint (no string attribute 'format'); HINT: an HDF5 "
                              "file from another tool (a PyTorch state_dict saved with h5py) can start a run as "
                              "checkpoint.init_from", path);
        if (st != MR_OK) goto fail;
        MR_CHECK(!strcmp(fmt, MR_CKPT_FORMAT), MR_ERR_FORMAT, "%s: not a mirror checkpoint (format '%s', expected '%s')",
                 path, fmt, MR_CKPT_FORMAT);
        int64_t v = 0;
        st = ckpt_attr_get_num(r->file, path, "format_version", H5T_NATIVE_INT64, 0, &v);
        if (st != MR_OK && st != MR_ERR_NOMEM)
            st = mr_set_error(MR_ERR_FORMAT, "%s: mirror checkpoint without an integer 'format_version'", path);
        if (st != MR_OK) goto fail;
        MR_CHECK(v >= 1 && v <= MR_CKPT_FORMAT_VERSION, MR_ERR_FORMAT, "%s: checkpoint format_version %lld is not "
                 "supported (this mirror reads 1..%d); HINT: read it with a newer mirror", path, (long long)v,
                 MR_CKPT_FORMAT_VERSION);
    }
    H5Pclose(fapl);
    mr_h5_leave();
    free(fmt);
    *out = r;
    return MR_OK;
fail:
    if (r->file >= 0) H5Fclose(r->file);
    if (fapl >= 0) H5Pclose(fapl);
    mr_h5_leave();
    free(fmt);
    free(r);
    return st;
}

void mr_ckpt_close(mr_ckpt_reader *r) {
    if (!r) return;
    mr_h5_enter();
    if (r->file >= 0) H5Fclose(r->file);
    mr_h5_leave();
    free(r);
}

/* ---- listing --------------------------------------------------------------------------------- */

typedef struct name_list {
    char **v;
    int n, cap, nomem;
} name_list;

static int push_name(name_list *l, const char *s) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        char **v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v) return l->nomem = 1, -1;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(s))) return l->nomem = 1, -1;
    l->n++;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void mr_ckpt_names_free(char **names, int n) {
    if (!names) return;
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* Hands the list out sorted, or frees it on error. */
static mr_status finish_list(mr_status st, name_list *l, char ***names, int *n) {
    if (st != MR_OK) {
        mr_ckpt_names_free(l->v, l->n);
        return st;
    }
    if (l->n > 1) qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_str);
    *names = l->v;
    *n = l->n;
    return MR_OK;
}

static herr_t visit_obj(hid_t obj, const char *name, const H5O_info_t *info, void *p) {
    if (info->type != H5O_TYPE_DATASET || !strcmp(name, ".")) return 0;
    return push_name(p, name);
}

mr_status mr_ckpt_list(const mr_ckpt_reader *r, const char *group, char ***names, int *n) {
    mr_status st = MR_OK;
    char h5e[256];
    name_list l = {0};
    hid_t g = -1;
    if (!r || !names || !n) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_list: NULL argument");
    *names = NULL;
    *n = 0;
    const char *gname = group ? ckpt_rel(group) : "";
    mr_h5_enter();
    if (gname[0]) {
        H5O_type_t t = ckpt_obj_type(r->file, gname);
        MR_CHECK(t != H5O_TYPE_UNKNOWN, MR_ERR_NOT_FOUND, "%s: no group '%s' in the checkpoint", r->path, gname);
        MR_CHECK(t == H5O_TYPE_GROUP, MR_ERR_INVALID, "%s: '%s' is not a group", r->path, gname);
    }
    g = H5Gopen2(r->file, gname[0] ? gname : "/", H5P_DEFAULT);
    MR_TRY_H5(g, MR_ERR_FORMAT, "%s: cannot open group '%s'", r->path, gname);
    herr_t v = H5Ovisit2(g, H5_INDEX_NAME, H5_ITER_INC, visit_obj, &l, H5O_INFO_BASIC);
    MR_CHECK(!l.nomem, MR_ERR_NOMEM, "%s: out of memory listing '%s'", r->path, gname);
    MR_TRY_H5(v, MR_ERR_FORMAT, "%s: listing group '%s' failed (corrupt file?)", r->path, gname);
fail:
    if (g >= 0) H5Gclose(g);
    mr_h5_leave();
    return finish_list(st, &l, names, n);
}

/* ---- attributes ------------------------------------------------------------------------------ */

/* Opens attribute `name` of obj, which must hold one element: its id, or negative with st set. */
static hid_t attr_open(hid_t obj, const char *file, const char *name, mr_status *st) {
    char h5e[256];
    htri_t ex = H5Aexists(obj, name);
    if (ex <= 0) {
        *st = ex == 0 ? mr_set_error(MR_ERR_NOT_FOUND, "%s: no attribute '%s'", file, name)
                      : mr_set_error(MR_ERR_FORMAT, "%s: attribute '%s': %s", file, name, mr_h5_reason(h5e));
        return -1;
    }
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t sp = a < 0 ? -1 : H5Aget_space(a);
    hssize_t np = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
    if (sp >= 0) H5Sclose(sp);
    if (np != 1) {
        *st = np < 0 ? mr_set_error(MR_ERR_FORMAT, "%s: attribute '%s': %s", file, name, mr_h5_reason(h5e))
                     : mr_set_error(MR_ERR_INVALID, "%s: attribute '%s' holds %lld values, not one", file, name,
                                    (long long)np);
        if (a >= 0) H5Aclose(a);
        return -1;
    }
    return a;
}

mr_status ckpt_attr_get_str(hid_t obj, const char *file, const char *name, char **out) {
    mr_status st = MR_OK;
    char h5e[256];
    hid_t at = -1, mt = -1, a = attr_open(obj, file, name, &st);
    char *s = NULL;
    *out = NULL;
    if (a < 0) return st;
    at = H5Aget_type(a);
    MR_TRY_H5(at, MR_ERR_FORMAT, "%s: attribute '%s': type", file, name);
    MR_CHECK(H5Tget_class(at) == H5T_STRING, MR_ERR_INVALID, "%s: attribute '%s' is not a string", file, name);
    mt = H5Tcopy(at);
    MR_TRY_H5(mt, MR_ERR_INTERNAL, "%s: attribute '%s': type", file, name);
    if (H5Tis_variable_str(at) > 0) {
        char *v = NULL;
        MR_TRY_H5(H5Aread(a, mt, &v), MR_ERR_FORMAT, "%s: attribute '%s': read failed", file, name);
        s = strdup(v ? v : "");
        H5free_memory(v);
        MR_CHECK(s, MR_ERR_NOMEM, "%s: out of memory", file);
    } else {
        size_t size = H5Tget_size(at);
        s = calloc(size + 1, 1);
        MR_CHECK(s, MR_ERR_NOMEM, "%s: out of memory", file);
        MR_TRY_H5(H5Aread(a, mt, s), MR_ERR_FORMAT, "%s: attribute '%s': read failed", file, name);
    }
    *out = s;
    s = NULL;
fail:
    free(s);
    if (mt >= 0) H5Tclose(mt);
    if (at >= 0) H5Tclose(at);
    H5Aclose(a);
    return st;
}

mr_status ckpt_attr_get_num(hid_t obj, const char *file, const char *name, hid_t mt, int allow_float, void *out) {
    mr_status st = MR_OK;
    char h5e[256];
    hid_t at = -1, a = attr_open(obj, file, name, &st);
    if (a < 0) return st;
    at = H5Aget_type(a);
    MR_TRY_H5(at, MR_ERR_FORMAT, "%s: attribute '%s': type", file, name);
    H5T_class_t c = H5Tget_class(at);
    MR_CHECK(c == H5T_INTEGER || (allow_float && c == H5T_FLOAT), MR_ERR_INVALID, "%s: attribute '%s' is not %s", file,
             name, allow_float ? "a number" : "an integer");
    MR_TRY_H5(H5Aread(a, mt, out), MR_ERR_FORMAT, "%s: attribute '%s': read failed", file, name);
fail:
    if (at >= 0) H5Tclose(at);
    H5Aclose(a);
    return st;
}

mr_status mr_ckpt_attr_str(const mr_ckpt_reader *r, const char *name, char **out) {
    if (!r || !name || !out) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_attr_str: NULL argument");
    mr_h5_enter();
    mr_status st = ckpt_attr_get_str(r->file, r->path, name, out);
    mr_h5_leave();
    return st;
}

mr_status mr_ckpt_attr_i64(const mr_ckpt_reader *r, const char *name, int64_t *out) {
    if (!r || !name || !out) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_attr_i64: NULL argument");
    mr_h5_enter();
    mr_status st = ckpt_attr_get_num(r->file, r->path, name, H5T_NATIVE_INT64, 0, out);
    mr_h5_leave();
    return st;
}

mr_status mr_ckpt_attr_f64(const mr_ckpt_reader *r, const char *name, double *out) {
    if (!r || !name || !out) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_attr_f64: NULL argument");
    mr_h5_enter();
    mr_status st = ckpt_attr_get_num(r->file, r->path, name, H5T_NATIVE_DOUBLE, 1, out);
    mr_h5_leave();
    return st;
}

static herr_t visit_attr(hid_t loc, const char *name, const H5A_info_t *info, void *p) { return push_name(p, name); }

mr_status mr_ckpt_attr_names(const mr_ckpt_reader *r, char ***names, int *n) {
    mr_status st = MR_OK;
    char h5e[256];
    name_list l = {0};
    if (!r || !names || !n) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_attr_names: NULL argument");
    *names = NULL;
    *n = 0;
    mr_h5_enter();
    herr_t v = H5Aiterate2(r->file, H5_INDEX_NAME, H5_ITER_INC, NULL, visit_attr, &l);
    MR_CHECK(!l.nomem, MR_ERR_NOMEM, "%s: out of memory listing attributes", r->path);
    MR_TRY_H5(v, MR_ERR_FORMAT, "%s: listing the root attributes failed (corrupt file?)", r->path);
fail:
    mr_h5_leave();
    return finish_list(st, &l, names, n);
}
