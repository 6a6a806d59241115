/* Writes the seed inputs of the HDF5 fuzz targets (tests/fuzz/corpus/ckpt/, corpus/hdf5/) with
 * mirror's own writers, so the seeds are files mirror reads: a small checkpoint (f32, f64, i32, i64
 * datasets in groups, a blob, string/integer/float attributes) and HDF5 data files for
 * mr_data_from_hdf5 (images + labels, /x, /g/tokens; written with the HDF5 API). Kept tiny (a few KB): the fuzzers mutate them.
 *   fuzz_make_h5_corpus tests/fuzz/corpus   (built by CMake with the tests; run by hand) */
#include <stdio.h>
#include <string.h>

#include <hdf5.h>

#include "checkpoint/ckpt.h"
#include "data/data.h"

#define TRY(call)                                                                \
    do {                                                                         \
        if ((call) != MR_OK) {                                                   \
            fprintf(stderr, "make_h5_corpus: %s: %s\n", #call, mr_last_error()); \
            return 1;                                                            \
        }                                                                        \
    } while (0)

/* A data file with the raw HDF5 API: contiguous datasets (mr_data_write_hdf5 writes ~1 MiB
 * chunks, too big for a seed). Dataset c is names[c] with dims {count, per-element dims}. */
static int write_data(const char *path, int n, const char *const names[], const mr_dtype dts[], const mr_shape shapes[],
                      const void *const arrays[], int64_t count) {
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return fprintf(stderr, "make_h5_corpus: cannot create %s\n", path), 1;
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    int bad = 0;
    for (int c = 0; c < n; c++) {
        hsize_t dims[MR_MAX_DIMS + 1];
        dims[0] = (hsize_t)count;
        for (int d = 0; d < shapes[c].ndim; d++) dims[d + 1] = (hsize_t)shapes[c].dim[d];
        hid_t type = dts[c] == MR_F32 ? H5T_IEEE_F32LE : dts[c] == MR_I32 ? H5T_STD_I32LE
                   : dts[c] == MR_I64 ? H5T_STD_I64LE : H5T_STD_U8LE;
        hid_t mem = dts[c] == MR_F32 ? H5T_NATIVE_FLOAT : dts[c] == MR_I32 ? H5T_NATIVE_INT32
                  : dts[c] == MR_I64 ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT8;
        hid_t space = H5Screate_simple(shapes[c].ndim + 1, dims, NULL);
        hid_t ds = H5Dcreate2(f, names[c], type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
        if (ds < 0 || H5Dwrite(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, arrays[c]) < 0) bad = 1;
        if (ds >= 0) H5Dclose(ds);
        H5Sclose(space);
    }
    H5Pclose(lcpl);
    if (H5Fclose(f) < 0) bad = 1;
    if (bad) fprintf(stderr, "make_h5_corpus: writing %s failed\n", path);
    return bad;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_make_h5_corpus CORPUS_DIR (tests/fuzz/corpus)\n");
        return 2;
    }
    char path[1024];
    float w[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    double v[3] = {0.25, -1, 1e300};
    int32_t i32[4] = {0, 1, -5, 1 << 30};
    int64_t i64[2] = {-1, (int64_t)1 << 40};
    unsigned char blob[5] = {'m', 'r', 0, 255, 7};
    mr_ckpt_writer *cw = NULL;
    TRY(mr_ckpt_writer_new(&cw));
    mr_shape s23 = mr_shape_2d(2, 3), s3 = mr_shape_1d(3), s4 = mr_shape_1d(4), s2 = mr_shape_1d(2);
    TRY(mr_ckpt_writer_add(cw, "params/fc1.weight", MR_F32, &s23, w));
    TRY(mr_ckpt_writer_add(cw, "params/fc1.bias", MR_F64, &s3, v));
    TRY(mr_ckpt_writer_add(cw, "optimizer/fc1.weight/exp_avg", MR_I32, &s4, i32));
    TRY(mr_ckpt_writer_add(cw, "state/count", MR_I64, &s2, i64));
    TRY(mr_ckpt_writer_add_blob(cw, "state/data_iter/0", blob, sizeof blob));
    TRY(mr_ckpt_writer_attr_str(cw, "model", "mlp"));
    TRY(mr_ckpt_writer_attr_i64(cw, "step", 500));
    TRY(mr_ckpt_writer_attr_f64(cw, "loss_scale", 32768.0));
    snprintf(path, sizeof path, "%s/ckpt/seed_ckpt_small.h5", argv[1]);
    mr_status st = mr_ckpt_writer_write(cw, path);
    mr_ckpt_writer_free(cw);
    TRY(st);

    unsigned char images[4 * 2 * 2] = {0, 1, 2, 3, 255, 254, 253, 252, 9, 8, 7, 6, 5, 4, 3, 2};
    int32_t labels[4] = {0, 9, 3, 1};
    const char *const n2[2] = {"/images", "/labels"};
    const mr_dtype d2[2] = {MR_U8, MR_I32};
    const mr_shape sh2[2] = {mr_shape_2d(2, 2), mr_shape_make(0, NULL)};
    const void *const a2[2] = {images, labels};
    snprintf(path, sizeof path, "%s/hdf5/seed_images_labels.h5", argv[1]);
    if (write_data(path, 2, n2, d2, sh2, a2, 4)) return 1;
    const char *const nx[1] = {"/x"};
    const mr_dtype dx[1] = {MR_F32};
    const mr_shape shx[1] = {mr_shape_1d(3)};
    const void *const ax[1] = {w};
    snprintf(path, sizeof path, "%s/hdf5/seed_x_f32.h5", argv[1]);
    if (write_data(path, 1, nx, dx, shx, ax, 2)) return 1;
    const char *const nt[1] = {"/g/tokens"};
    const mr_dtype dt[1] = {MR_I64};
    const mr_shape sht[1] = {mr_shape_1d(1)};
    const void *const at[1] = {i64};
    snprintf(path, sizeof path, "%s/hdf5/seed_g_tokens_i64.h5", argv[1]);
    if (write_data(path, 1, nt, dt, sht, at, 2)) return 1;
    /* a data file handed to the checkpoint reader: foreign (no "format" attribute) */
    snprintf(path, sizeof path, "%s/ckpt/seed_foreign_data.h5", argv[1]);
    if (write_data(path, 2, n2, d2, sh2, a2, 4)) return 1;
    return 0;
}
