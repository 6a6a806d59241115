/* data_copy: writes copies of an IDX image/label pair in the other formats the trainer reads, so
 * tests/e2e/data_sources.sh can train from each and compare the loss lines with IDX's, without
 * Python or TensorFlow. The first N elements (all when N is 0), split into S shards of
 * consecutive elements (S > 1: OUT-00000-of-0000S.EXT, ...; S = 1: OUT.EXT):
 *   idx       OUT.images.idx and OUT.labels.idx (uncompressed)
 *   hdf5      datasets /x (u8, N H W) and /y (u8 labels, as IDX has them) via mr_data_write_hdf5
 *   npy       OUT.x.npy (|u1) and OUT.y.npy (<i8: a wider label type than IDX's)
 *   npz       OUT.npz: members x.npy and y.npy, stored (np.savez's layout)
 *   tfrecord  OUT.tfrecord: tf.train.Example {image/encoded_raw: bytes, label: int64}
 * Usage: data_copy FORMAT IMAGES.idx LABELS.idx OUT [N] [S] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "data/data.h"
#include "data/tfrecord.h"
#include "proto/example.pb-c.h"

static int die(const char *what) {
    fprintf(stderr, "data_copy: %s: %s\n", what, mr_last_error());
    return 1;
}

/* A .npy image of (n, dims...) with descr into *buf (malloc'd); returns its size. */
static size_t npy_bytes(const char *descr, int64_t n, const int64_t *dims, int nd, const void *data, size_t bytes,
                        unsigned char **buf) {
    char hdr[256];
    int L = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,", descr, (long long)n);
    for (int d = 0; d < nd; d++) L += snprintf(hdr + L, sizeof hdr - (size_t)L, "%s%lld", d ? ", " : " ", (long long)dims[d]);
    L += snprintf(hdr + L, sizeof hdr - (size_t)L, "), }");
    size_t total = 10 + (size_t)L + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hl = (size_t)L + pad + 1;
    *buf = malloc(10 + hl + bytes);
    if (!*buf) return 0;
    memcpy(*buf, "\x93NUMPY\x01\x00", 8);
    (*buf)[8] = (unsigned char)(hl & 0xff), (*buf)[9] = (unsigned char)(hl >> 8);
    memcpy(*buf + 10, hdr, (size_t)L);
    memset(*buf + 10 + L, ' ', pad);
    (*buf)[10 + hl - 1] = '\n';
    memcpy(*buf + 10 + hl, data, bytes);
    return 10 + hl + bytes;
}

static void put(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A stored zip of the members into f. */
static int write_zip(FILE *f, const char *const names[], unsigned char *const data[], const size_t sizes[], int n) {
    unsigned char h[64];
    uint64_t offs[4], at = 0;
    uint32_t crcs[4];
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(names[i]);
        crcs[i] = (uint32_t)crc32(0, data[i], (uInt)sizes[i]);
        offs[i] = at;
        memset(h, 0, 30);
        put(h, 0x04034b50u, 4), put(h + 4, 20, 2), put(h + 14, crcs[i], 4), put(h + 18, sizes[i], 4);
        put(h + 22, sizes[i], 4), put(h + 26, nl, 2);
        if (fwrite(h, 1, 30, f) != 30 || fwrite(names[i], 1, nl, f) != nl || fwrite(data[i], 1, sizes[i], f) != sizes[i]) return 0;
        at += 30 + nl + sizes[i];
    }
    uint64_t cd = at;
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(names[i]);
        memset(h, 0, 46);
        put(h, 0x02014b50u, 4), put(h + 4, 20, 2), put(h + 6, 20, 2), put(h + 16, crcs[i], 4);
        put(h + 20, sizes[i], 4), put(h + 24, sizes[i], 4), put(h + 28, nl, 2), put(h + 42, offs[i], 4);
        if (fwrite(h, 1, 46, f) != 46 || fwrite(names[i], 1, nl, f) != nl) return 0;
        at += 46 + nl;
    }
    memset(h, 0, 22);
    put(h, 0x06054b50u, 4), put(h + 8, (uint64_t)n, 2), put(h + 10, (uint64_t)n, 2), put(h + 12, at - cd, 4);
    put(h + 16, cd, 4);
    return fwrite(h, 1, 22, f) == 22;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: data_copy idx|hdf5|npy|npz|tfrecord IMAGES.idx LABELS.idx OUT [N] [SHARDS]\n");
        return 2;
    }
    const char *fmt = argv[1], *out = argv[4];
    int64_t want = argc > 5 ? atoll(argv[5]) : 0;
    int shards = argc > 6 ? atoi(argv[6]) : 1;
    mr_dataset *ds = NULL;
    if (mr_data_from_idx(argv[2], argv[3], &ds) != MR_OK) return die(argv[2]);
    const mr_data_spec *sp = mr_data_element_spec(ds);
    int64_t total = mr_data_source_size(ds), n = want > 0 && want < total ? want : total;
    const mr_shape image_shape = sp->comp[0].shape; /* a copy: the spec goes with ds, freed below */
    const mr_shape *is = &image_shape;
    const size_t ib = mr_data_spec_bytes(sp, 0);
    unsigned char *img = malloc((size_t)n * ib);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)n);
    mr_data_iter *it = NULL;
    if (!img || !lab || mr_data_iter_new(ds, &it) != MR_OK) return die("setup");
    for (int64_t i = 0; i < n; i++) {
        mr_data_elem e;
        int end = 0;
        if (mr_data_iter_next(it, &e, &end) != MR_OK || end) return die("reading");
        memcpy(img + (size_t)i * ib, e.data[0], ib);
        lab[i] = *(const int32_t *)e.data[1];
    }
    mr_data_iter_free(it);
    mr_data_free(ds);
    const char *ext = !strcmp(fmt, "hdf5") ? "h5" : !strcmp(fmt, "npz") ? "npz" : !strcmp(fmt, "tfrecord") ? "tfrecord" : "";
    for (int s = 0; s < shards; s++) {
        int64_t lo = n * s / shards, hi = n * (s + 1) / shards, m = hi - lo;
        char stem[1024], path[1100];
        if (shards > 1) snprintf(stem, sizeof stem, "%s-%05d-of-%05d", out, s, shards);
        else snprintf(stem, sizeof stem, "%s", out);
        if (!strcmp(fmt, "hdf5")) {
            mr_data_spec spec = {0};
            mr_shape ls = mr_shape_make(0, NULL);
            uint8_t *l8 = malloc((size_t)(m ? m : 1));
            for (int64_t i = 0; i < m; i++) l8[i] = (uint8_t)lab[lo + i];
            const void *arrs[2] = {img + (size_t)lo * ib, l8};
            mr_dataset *d = NULL;
            const char *names[2] = {"/x", "/y"};
            snprintf(path, sizeof path, "%s.%s", stem, ext);
            if (mr_data_spec_add(&spec, "x", MR_U8, is) || mr_data_spec_add(&spec, "y", MR_U8, &ls) ||
                mr_data_from_arrays(&spec, m, arrs, &d) || mr_data_write_hdf5(d, path, names))
                return die(path);
            mr_data_free(d);
            free(l8);
        } else if (!strcmp(fmt, "idx")) {
            unsigned char h[4 + 4 * MR_MAX_DIMS];
            const char *sfx[2] = {"images", "labels"};
            for (int k = 0; k < 2; k++) {
                int nd = k ? 1 : 1 + is->ndim;
                h[0] = h[1] = 0, h[2] = 0x08, h[3] = (unsigned char)nd;
                for (int d = 0; d < nd; d++) {
                    int64_t v = d == 0 ? m : is->dim[d - 1];
                    h[4 + 4 * d] = (unsigned char)(v >> 24), h[5 + 4 * d] = (unsigned char)(v >> 16);
                    h[6 + 4 * d] = (unsigned char)(v >> 8), h[7 + 4 * d] = (unsigned char)v;
                }
                snprintf(path, sizeof path, "%s.%s.idx", stem, sfx[k]);
                FILE *f = fopen(path, "wb");
                if (!f || fwrite(h, 1, 4 + 4 * (size_t)nd, f) != 4 + 4 * (size_t)nd) return die(path);
                for (int64_t i = lo; i < hi && k == 0; i++)
                    if (fwrite(img + (size_t)i * ib, 1, ib, f) != ib) return die(path);
                for (int64_t i = lo; i < hi && k == 1; i++) fputc(lab[i], f);
                if (fclose(f)) return die(path);
            }
        } else if (!strcmp(fmt, "npy") || !strcmp(fmt, "npz")) {
            int64_t *l64 = malloc(sizeof(int64_t) * (size_t)(m ? m : 1));
            for (int64_t i = 0; i < m; i++) l64[i] = lab[lo + i];
            unsigned char *bx = NULL, *by = NULL;
            size_t nx = npy_bytes("|u1", m, is->dim, is->ndim, img + (size_t)lo * ib, (size_t)m * ib, &bx);
            size_t ny = npy_bytes("<i8", m, NULL, 0, l64, sizeof(int64_t) * (size_t)m, &by);
            if (!nx || !ny) return die("out of memory");
            if (!strcmp(fmt, "npy")) {
                const char *sfx[2] = {"x", "y"};
                unsigned char *b[2] = {bx, by};
                size_t sz[2] = {nx, ny};
                for (int k = 0; k < 2; k++) {
                    snprintf(path, sizeof path, "%s.%s.npy", stem, sfx[k]);
                    FILE *f = fopen(path, "wb");
                    if (!f || fwrite(b[k], 1, sz[k], f) != sz[k] || fclose(f)) return die(path);
                }
            } else {
                snprintf(path, sizeof path, "%s.npz", stem);
                const char *names[2] = {"x.npy", "y.npy"};
                unsigned char *b[2] = {bx, by};
                size_t sz[2] = {nx, ny};
                FILE *f = fopen(path, "wb");
                if (!f || !write_zip(f, names, b, sz, 2) || fclose(f)) return die(path);
            }
            free(bx), free(by), free(l64);
        } else if (!strcmp(fmt, "tfrecord")) {
            snprintf(path, sizeof path, "%s.%s", stem, ext);
            FILE *f = fopen(path, "wb");
            if (!f) return die(path);
            for (int64_t i = lo; i < hi; i++) {
                Tensorflow__BytesList bl = TENSORFLOW__BYTES_LIST__INIT;
                ProtobufCBinaryData bd = {ib, img + (size_t)i * ib};
                bl.n_value = 1, bl.value = &bd;
                Tensorflow__Int64List il = TENSORFLOW__INT64_LIST__INIT;
                int64_t lv = lab[i];
                il.n_value = 1, il.value = &lv;
                Tensorflow__Feature fi = TENSORFLOW__FEATURE__INIT, fl = TENSORFLOW__FEATURE__INIT;
                fi.kind_case = TENSORFLOW__FEATURE__KIND_BYTES_LIST, fi.bytes_list = &bl;
                fl.kind_case = TENSORFLOW__FEATURE__KIND_INT64_LIST, fl.int64_list = &il;
                Tensorflow__Features__FeatureEntry e0 = TENSORFLOW__FEATURES__FEATURE_ENTRY__INIT, e1 = e0;
                e0.key = "image/encoded_raw", e0.value = &fi;
                e1.key = "label", e1.value = &fl;
                Tensorflow__Features__FeatureEntry *ents[2] = {&e0, &e1};
                Tensorflow__Features fs = TENSORFLOW__FEATURES__INIT;
                fs.n_feature = 2, fs.feature = ents;
                Tensorflow__Example ex = TENSORFLOW__EXAMPLE__INIT;
                ex.features = &fs;
                size_t len = tensorflow__example__get_packed_size(&ex);
                uint8_t *buf = malloc(len);
                tensorflow__example__pack(&ex, buf);
                if (mr_tfrecord_write(f, path, buf, len) != MR_OK) return die(path);
                free(buf);
            }
            if (fclose(f)) return die(path);
        } else {
            fprintf(stderr, "data_copy: unknown format %s (idx, hdf5, npy, npz, tfrecord)\n", fmt);
            return 2;
        }
    }
    free(img);
    free(lab);
    return 0;
}
