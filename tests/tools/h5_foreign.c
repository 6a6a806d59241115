/* h5_foreign PATH KIND: writes an HDF5 file that mirror did not write, for the CLI tests of
 * `mirror inspect` and `init_from` (what h5py would write; no Python needed).
 *   KIND state_dict: /params/fc.weight (2x3 f32) and /params/fc.bias (2), no attributes
 *   KIND other:      /data (4 f64), no /params group
 * Exits 0, or 1 naming what failed. */
#include <hdf5.h>
#include <stdio.h>
#include <string.h>

static int put(hid_t loc, const char *name, hid_t type, int rank, const hsize_t *dims, const void *v) {
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t ds = sp < 0 ? -1 : H5Dcreate2(loc, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int ok = ds >= 0 && H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0;
    if (ds >= 0) H5Dclose(ds);
    if (sp >= 0) H5Sclose(sp);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[2], "state_dict") && strcmp(argv[2], "other"))) {
        fprintf(stderr, "usage: h5_foreign PATH state_dict|other\n");
        return 1;
    }
    hid_t f = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    int ok = f >= 0;
    if (ok && !strcmp(argv[2], "state_dict")) {
        const float w[6] = {1, 2, 3, 4, 5, 6}, b[2] = {0.5f, -0.5f};
        const hsize_t dw[2] = {2, 3}, db[1] = {2};
        hid_t g = H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        ok = g >= 0 && put(g, "fc.weight", H5T_NATIVE_FLOAT, 2, dw, w) && put(g, "fc.bias", H5T_NATIVE_FLOAT, 1, db, b);
        if (g >= 0) H5Gclose(g);
    } else if (ok) {
        const double d[4] = {1, 2, 3, 4};
        const hsize_t dd[1] = {4};
        ok = put(f, "data", H5T_NATIVE_DOUBLE, 1, dd, d);
    }
    if (f >= 0 && H5Fclose(f) < 0) ok = 0;
    if (!ok) fprintf(stderr, "h5_foreign: cannot write %s\n", argv[1]);
    return ok ? 0 : 1;
}
