/* The bodies of mirror's fuzz targets, shared by the libFuzzer entry points (tests/fuzz/fuzz_*.c,
 * built with clang by tests/fuzz/run.sh) and the corpus replay test (tests/unit/test_fuzz_corpus.c,
 * built by CMake, run by CTest under ASan in tests/run.sh). Each mr_fuzz_<target>(data, size) runs
 * one untrusted input through a whole reader: open, iterate every element, free. The contract it
 * checks: the reader either succeeds or returns a known MR_ERR_* with a non-empty mr_last_error();
 * anything else (a crash, a leak, UB, an unknown status, an empty message) aborts, which both
 * libFuzzer and CMocka report as a failure with the input that caused it.
 *
 * Inputs that need a file are written to one temporary file per process (mkstemp under $TMPDIR or
 * /tmp), rewritten for every input and removed at exit.
 *
 *   idx:    the bytes are an IDX file (gzipped when they start with 1f 8b): read as images alone,
 *           labels alone, and images + labels from the same file.
 *   tokens: the bytes are a token file: u16 and u32, raw and with an llm.c header, context 1 and
 *           3, one variant through shuffle + batch with a partial last batch.
 *   text:   the bytes are a text file: BYTES and CHARS modes, context 1 and 4, plus the vocabulary.
 *   config: the bytes (up to the first NUL) are experiment YAML: parse; on success to_yaml, parse
 *           again, hash, and expand a sweep when it has at most MR_FUZZ_MAX_TRIALS trials.
 *   ckpt:   the bytes are an HDF5 checkpoint: mr_ckpt_verify, then opened as a mirror checkpoint
 *           and as a foreign file (MR_CKPT_FOREIGN): every root attribute read as string, integer
 *           and float, every dataset listed, described (mr_ckpt_info) and read in its own dtype
 *           (and as a blob), up to MR_FUZZ_MAX_READ bytes each.
 *   hdf5:   the bytes are an HDF5 data file: mr_data_from_hdf5 with ("/images", "/labels"),
 *           ("/x") and ("/g/tokens"), each iterated.
 *   npy:    the bytes are a .npy file and a .npz archive: mr_data_from_npy as .npy, as the .npz
 *           members "x" and ("x", "y"), each iterated.
 *   tfrecord: the bytes are a TFRecord file (GZIP when they start with 1f 8b): mr_data_from_tfrecord
 *           with features as tests/gen_tfrecord.py writes them (image/encoded_raw u8, label i64 and
 *           i32, weights f32), shapes from record 0, each iterated.
 *   iterstate: the bytes are a data-iterator state (a checkpoint's /state/data_iter blobs) for a
 *           fixed pipeline (two array sources interleaved, shuffle, repeat, shard, batch,
 *           prefetch). Byte 0 picks per-replica (mr_data_iter_restore) or world-independent
 *           (mr_data_iter_restore_global) state, the replicas (1-3) and the replica; with its bit
 *           7 set the rest patches a valid saved blob (byte 1: after how many batches, bytes 2-3:
 *           where) instead of being the blob. Beyond the crash contract: a failed restore leaves
 *           the iterator at the start (its next batch is a fresh iterator's first), and an
 *           unpatched blob resumes exactly where the save was. */
#ifndef MR_TESTS_FUZZ_TARGETS_H
#define MR_TESTS_FUZZ_TARGETS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "core/status.h"
#include "data/data.h"
#include "data/sources.h"
#include "launch/config.h"

/* Elements iterated per dataset at most: an IDX images file may declare 2^31 images of a zero-size
 * dim with no data bytes at all, which the reader accepts (see tests/fuzz/README.md); iterating
 * those would turn every such input into a timeout. */
#define MR_FUZZ_MAX_ELEMS 4096
/* Sweeps with more trials than this are parsed but not expanded (each trial is a full
 * mr_experiment, ~50 KB; 100000 of them would be an out-of-memory, not a bug). */
#define MR_FUZZ_MAX_TRIALS 64
/* Datasets larger than this are described but not read (a header may declare 2^60 elements). */
#define MR_FUZZ_MAX_READ ((int64_t)1 << 24)

/* Aborts unless st is MR_OK or a known error code with a message. */
static void mr_fuzz_check(mr_status st, const char *what) {
    if (st == MR_OK) return;
    const char *msg = mr_last_error();
    if (st < MR_ERR_INTERNAL || st > MR_ERR_INVALID || st == MR_ERR_INTERNAL || !msg || !msg[0]) {
        fprintf(stderr, "mr_fuzz: %s: status %d (%s) with message \"%s\"\n", what, (int)st, mr_status_name(st),
                msg ? msg : "(null)");
        abort();
    }
}

static char mr_fuzz_path_buf[256];

static void mr_fuzz_unlink(void) {
    if (mr_fuzz_path_buf[0]) unlink(mr_fuzz_path_buf);
}

/* Writes the input to this process's temporary file and returns its path. */
static const char *mr_fuzz_write(const uint8_t *data, size_t size) {
    if (!mr_fuzz_path_buf[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(mr_fuzz_path_buf, sizeof mr_fuzz_path_buf, "%s/mr_fuzz_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        int fd = mkstemp(mr_fuzz_path_buf);
        if (fd < 0) {
            perror("mr_fuzz: mkstemp");
            abort();
        }
        close(fd);
        atexit(mr_fuzz_unlink);
    }
    FILE *f = fopen(mr_fuzz_path_buf, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror("mr_fuzz: writing the input");
        abort();
    }
    return mr_fuzz_path_buf;
}

/* Iterates ds (consumed: freed here) through every element (up to MR_FUZZ_MAX_ELEMS), touching
 * every byte of every component so ASan sees reads past a buffer. */
static void mr_fuzz_drain(mr_dataset *ds, const char *what) {
    mr_data_iter *it = NULL;
    mr_status st = mr_data_iter_new(ds, &it);
    mr_fuzz_check(st, what);
    if (st == MR_OK) {
        volatile unsigned char sink = 0;
        for (int64_t k = 0; k < MR_FUZZ_MAX_ELEMS; k++) {
            mr_data_elem e;
            int end = 0;
            st = mr_data_iter_next(it, &e, &end);
            mr_fuzz_check(st, what);
            if (st != MR_OK || end) break;
            for (int c = 0; c < e.n; c++) {
                size_t bytes = (size_t)mr_shape_numel(&e.shape[c]) * mr_dtype_size(e.dtype[c]);
                const unsigned char *p = e.data[c];
                for (size_t b = 0; b < bytes; b++) sink ^= p[b];
            }
        }
        (void)sink;
    }
    mr_data_iter_free(it);
    mr_data_free(ds);
}

static int mr_fuzz_idx(const uint8_t *data, size_t size) {
    const char *path = mr_fuzz_write(data, size);
    const char *pairs[3][2] = {{path, NULL}, {NULL, path}, {path, path}};
    for (int k = 0; k < 3; k++) {
        mr_dataset *ds = NULL;
        mr_status st = mr_data_from_idx(pairs[k][0], pairs[k][1], &ds);
        mr_fuzz_check(st, "mr_data_from_idx");
        if (st == MR_OK) mr_fuzz_drain(ds, "idx iteration");
        else if (ds) abort(); /* the contract: *out is NULL on error */
    }
    return 0;
}

static int mr_fuzz_tokens(const uint8_t *data, size_t size) {
    const char *path = mr_fuzz_write(data, size);
    for (int v = 0; v < 8; v++) {
        int tb = (v & 1) ? 4 : 2;
        mr_data_token_header h = (v & 2) ? MR_DATA_TOKENS_LLMC : MR_DATA_TOKENS_RAW;
        int64_t context = (v & 4) ? 3 : 1;
        mr_dataset *ds = NULL;
        mr_status st = mr_data_from_tokens(path, tb, context, h, &ds);
        mr_fuzz_check(st, "mr_data_from_tokens");
        if (st != MR_OK) {
            if (ds) abort();
            continue;
        }
        if (v == 4 || v == 7) { /* one raw and one llm.c variant through shuffle + batch */
            mr_dataset *sh = NULL, *b = NULL;
            st = mr_data_shuffle(ds, 5, 1234, 1, &sh);
            mr_fuzz_check(st, "mr_data_shuffle");
            mr_data_free(ds);
            ds = NULL;
            if (st == MR_OK) {
                st = mr_data_batch(sh, 3, 0, &b);
                mr_fuzz_check(st, "mr_data_batch");
                mr_data_free(sh);
                if (st == MR_OK) ds = b;
            }
            if (!ds) continue;
        }
        mr_fuzz_drain(ds, "tokens iteration");
    }
    return 0;
}

static int mr_fuzz_text(const uint8_t *data, size_t size) {
    const char *path = mr_fuzz_write(data, size);
    for (int v = 0; v < 4; v++) {
        mr_data_text_mode mode = (v & 1) ? MR_DATA_TEXT_CHARS : MR_DATA_TEXT_BYTES;
        int64_t context = (v & 2) ? 4 : 1;
        mr_dataset *ds = NULL;
        mr_status st = mr_data_from_text(path, context, mode, &ds);
        mr_fuzz_check(st, "mr_data_from_text");
        if (st != MR_OK) {
            if (ds) abort();
            continue;
        }
        const int32_t *vocab = NULL;
        int64_t nv = 0;
        st = mr_data_text_vocab(ds, &vocab, &nv);
        mr_fuzz_check(st, "mr_data_text_vocab");
        if (st == MR_OK) {
            /* every token is a valid vocabulary index and the vocabulary is strictly ascending */
            if (nv < 1 || nv > 0x110000) abort();
            for (int64_t i = 1; i < nv; i++)
                if (vocab[i - 1] >= vocab[i]) abort();
        }
        mr_data_iter *it = NULL;
        st = mr_data_iter_new(ds, &it);
        mr_fuzz_check(st, "text iteration");
        for (int64_t k = 0; st == MR_OK && k < MR_FUZZ_MAX_ELEMS; k++) {
            mr_data_elem e;
            int end = 0;
            st = mr_data_iter_next(it, &e, &end);
            mr_fuzz_check(st, "text iteration");
            if (st != MR_OK || end) break;
            for (int c = 0; c < e.n; c++) {
                const int32_t *t = e.data[c];
                for (int64_t i = 0; i < mr_shape_numel(&e.shape[c]); i++)
                    if (t[i] < 0 || t[i] >= nv) abort();
            }
        }
        mr_data_iter_free(it);
        mr_data_free(ds);
    }
    return 0;
}

/* Number of trials mr_sweep_expand would make, saturating at MR_FUZZ_MAX_TRIALS + 1. */
static int64_t mr_fuzz_trials(const mr_experiment *e) {
    if (e->sweep.method == MR_SWEEP_RANDOM) return e->sweep.trials;
    int64_t n = 1;
    for (int p = 0; p < e->sweep.n_params && p < MR_SWEEP_MAX_PARAMS; p++) {
        int64_t v = e->sweep.params[p].n_values > 0 ? e->sweep.params[p].n_values : 1;
        n *= v;
        if (n > MR_FUZZ_MAX_TRIALS) return MR_FUZZ_MAX_TRIALS + 1;
    }
    return n;
}

static int mr_fuzz_config(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = 0;
    mr_experiment e = mr_experiment_default();
    mr_status st = mr_experiment_parse(text, "fuzz.yaml", &e);
    mr_fuzz_check(st, "mr_experiment_parse");
    free(text);
    if (st != MR_OK) {
        if (e.yaml_text) abort(); /* the contract: on error *out is the defaults */
        mr_experiment_deinit(&e);
        return 0;
    }
    char *yaml = NULL;
    st = mr_experiment_to_yaml(&e, &yaml);
    mr_fuzz_check(st, "mr_experiment_to_yaml");
    if (st == MR_OK) {
        /* the resolved config must parse back; its hash must be computable */
        mr_experiment e2 = mr_experiment_default();
        st = mr_experiment_parse(yaml, "resolved.yaml", &e2);
        if (st != MR_OK) {
            fprintf(stderr, "mr_fuzz: to_yaml output does not parse back: %s\n--- yaml ---\n%s\n", mr_last_error(), yaml);
            abort();
        }
        mr_experiment_deinit(&e2);
        free(yaml);
    }
    uint64_t h = 0;
    mr_fuzz_check(mr_experiment_hash(&e, &h), "mr_experiment_hash");
    if (e.sweep.method != MR_SWEEP_NONE && mr_fuzz_trials(&e) <= MR_FUZZ_MAX_TRIALS) {
        mr_experiment *trials = NULL;
        int n = 0;
        st = mr_sweep_expand(&e, &trials, &n);
        mr_fuzz_check(st, "mr_sweep_expand");
        if (st == MR_OK) mr_sweep_free(trials, n);
    }
    mr_experiment_deinit(&e);
    return 0;
}

static void mr_fuzz_ckpt_contents(const mr_ckpt_reader *r) {
    char **names = NULL;
    int n = 0;
    mr_status st = mr_ckpt_attr_names(r, &names, &n);
    mr_fuzz_check(st, "mr_ckpt_attr_names");
    for (int i = 0; st == MR_OK && i < n; i++) {
        char *str = NULL;
        int64_t v = 0;
        double d = 0;
        mr_fuzz_check(mr_ckpt_attr_str(r, names[i], &str), "mr_ckpt_attr_str");
        free(str);
        mr_fuzz_check(mr_ckpt_attr_i64(r, names[i], &v), "mr_ckpt_attr_i64");
        mr_fuzz_check(mr_ckpt_attr_f64(r, names[i], &d), "mr_ckpt_attr_f64");
    }
    if (st == MR_OK) mr_ckpt_names_free(names, n);
    names = NULL;
    n = 0;
    st = mr_ckpt_list(r, "/", &names, &n);
    mr_fuzz_check(st, "mr_ckpt_list");
    for (int i = 0; st == MR_OK && i < n; i++) {
        mr_dtype dt;
        mr_shape shape;
        (void)mr_ckpt_has(r, names[i]);
        mr_status si = mr_ckpt_info(r, names[i], &dt, &shape);
        mr_fuzz_check(si, "mr_ckpt_info");
        if (si != MR_OK) continue;
        int64_t numel = mr_shape_numel(&shape);
        if (numel < 0 || shape.ndim < 0 || shape.ndim > MR_MAX_DIMS) { /* info must describe it */
            fprintf(stderr, "mr_fuzz: mr_ckpt_info of '%s': ndim %d, %lld elements\n", names[i], shape.ndim,
                    (long long)numel);
            abort();
        }
        if (numel > MR_FUZZ_MAX_READ / 8) continue;
        void *buf = malloc((size_t)numel * mr_dtype_size(dt) + 1);
        if (!buf) abort();
        mr_fuzz_check(mr_ckpt_read(r, names[i], dt, &shape, buf), "mr_ckpt_read");
        free(buf);
        void *bytes = NULL;
        size_t nb = 0;
        mr_fuzz_check(mr_ckpt_read_blob(r, names[i], &bytes, &nb), "mr_ckpt_read_blob");
        free(bytes);
    }
    if (st == MR_OK) mr_ckpt_names_free(names, n);
}

static int mr_fuzz_ckpt(const uint8_t *data, size_t size) {
    const char *path = mr_fuzz_write(data, size);
    mr_fuzz_check(mr_ckpt_verify(path), "mr_ckpt_verify");
    for (int flags = 0; flags <= MR_CKPT_FOREIGN; flags += MR_CKPT_FOREIGN) {
        mr_ckpt_reader *r = NULL;
        mr_status st = mr_ckpt_open(path, flags, &r);
        mr_fuzz_check(st, "mr_ckpt_open");
        if (st != MR_OK) {
            if (r) { /* the contract: *out is NULL on error */
                fprintf(stderr, "mr_fuzz: mr_ckpt_open failed but set *out\n");
                abort();
            }
            continue;
        }
        mr_fuzz_ckpt_contents(r);
        mr_ckpt_close(r);
    }
    return 0;
}

static int mr_fuzz_hdf5(const uint8_t *data, size_t size) {
    const char *path = mr_fuzz_write(data, size);
    static const char *const sets[3][2] = {{"/images", "/labels"}, {"/x", NULL}, {"/g/tokens", NULL}};
    for (int k = 0; k < 3; k++) {
        mr_dataset *ds = NULL;
        mr_status st = mr_data_from_hdf5(path, sets[k], sets[k][1] ? 2 : 1, &ds);
        mr_fuzz_check(st, "mr_data_from_hdf5");
        if (st == MR_OK) mr_fuzz_drain(ds, "hdf5 iteration");
        else if (ds) abort();
    }
    return 0;
}

static int mr_fuzz_npy(const uint8_t *data, size_t size) {
    const char *path = mr_fuzz_write(data, size);
    const char *paths[2] = {path, path}, *names[2] = {"a", "b"}, *members[2] = {"x", "y"};
    for (int v = 0; v < 3; v++) {
        mr_dataset *ds = NULL;
        mr_status st = mr_data_from_npy(paths, v ? members : NULL, names, v == 2 ? 2 : 1, &ds);
        mr_fuzz_check(st, "mr_data_from_npy");
        if (st == MR_OK) mr_fuzz_drain(ds, "npy iteration");
        else if (ds) abort();
    }
    return 0;
}

static int mr_fuzz_tfrecord(const uint8_t *data, size_t size) {
    const char *path = mr_fuzz_write(data, size);
    const mr_tfrecord_feature sets[3][2] = {
        {{"image/encoded_raw", "image", MR_U8, {.ndim = -1}}, {"label", "label", MR_I64, {.ndim = -1}}},
        {{"label", "label", MR_I32, {.ndim = -1}}, {"weights", "w", MR_F32, {.ndim = -1}}},
        {{"image/encoded_raw", "image", MR_U8, {.ndim = 2, .dim = {3, 4}}}, {"big", "big", MR_I32, {.ndim = -1}}},
    };
    for (int v = 0; v < 3; v++) {
        mr_dataset *ds = NULL;
        mr_status st = mr_data_from_tfrecord(path, sets[v], 2, &ds);
        mr_fuzz_check(st, "mr_data_from_tfrecord");
        if (st == MR_OK) mr_fuzz_drain(ds, "tfrecord iteration");
        else if (ds) abort();
    }
    return 0;
}

/* ---- iterstate ---------------------------------------------------------------------------- */

/* The fixed pipeline: sources of 37 and 23 i32 elements (values 0.. and 1000..) interleaved
 * (cycle 2, block 3), shuffle(7, reshuffled each epoch), repeat(3), shard(world, rank) when
 * world > 1, batch(4, partial last), prefetch(2). *out is NULL on failure (which aborts: the
 * pipeline is valid). */
static mr_dataset *mr_fuzz_iter_pipeline(int world, int rank) {
    static int32_t a[37], b[23];
    for (int i = 0; i < 37; i++) a[i] = i;
    for (int i = 0; i < 23; i++) b[i] = 1000 + i;
    mr_data_spec spec = {0};
    mr_shape scalar = {0};
    mr_dataset *src[2] = {NULL, NULL}, *cur = NULL, *next = NULL;
    mr_fuzz_check(mr_data_spec_add(&spec, "x", MR_I32, &scalar), "spec");
    const void *da[1] = {a}, *db[1] = {b};
    mr_fuzz_check(mr_data_from_arrays(&spec, 37, da, &src[0]), "arrays a");
    mr_fuzz_check(mr_data_from_arrays(&spec, 23, db, &src[1]), "arrays b");
    mr_fuzz_check(mr_data_interleave(src, 2, 2, 3, &cur), "interleave");
    mr_data_free(src[0]);
    mr_data_free(src[1]);
#define MR_FUZZ_STAGE(call)              \
    do {                                 \
        mr_fuzz_check((call), #call);    \
        mr_data_free(cur);               \
        cur = next;                      \
        next = NULL;                     \
    } while (0)
    MR_FUZZ_STAGE(mr_data_shuffle(cur, 7, 99, 1, &next));
    MR_FUZZ_STAGE(mr_data_repeat(cur, 3, &next));
    if (world > 1) MR_FUZZ_STAGE(mr_data_shard(cur, world, rank, &next));
    MR_FUZZ_STAGE(mr_data_batch(cur, 4, 0, &next));
    MR_FUZZ_STAGE(mr_data_prefetch(cur, 2, &next));
#undef MR_FUZZ_STAGE
    if (!cur) abort();
    return cur;
}

/* The next batch of it into out[4] (count in *n; *n 0 at the end); aborts on an error. */
static void mr_fuzz_iter_batch(mr_data_iter *it, int32_t out[4], int64_t *n) {
    mr_data_elem e;
    int end = 0;
    mr_fuzz_check(mr_data_iter_next(it, &e, &end), "iterstate next");
    *n = 0;
    if (end) return;
    *n = e.shape[0].dim[0];
    if (*n < 1 || *n > 4) abort();
    memcpy(out, e.data[0], (size_t)*n * sizeof(int32_t));
}

static int mr_fuzz_iterstate(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int global = data[0] & 1, world = 1 + (data[0] >> 1) % 3, rank = (data[0] >> 3) % world;
    const int patch = (data[0] & 0x80) != 0;
    const uint8_t *blob = data + 1;
    size_t bytes = size - 1;
    uint8_t *owned = NULL;
    int exact = 0;      /* the blob is a save, unpatched: the resumed batches are known */
    int32_t want[4];    /* then: the batch that followed the save */
    int64_t want_n = 0;
    if (patch) {
        /* a valid blob saved after data[1] % 24 batches of the same pipeline, then the bytes after
         * data[3] written over it at offset data[2..3] (clamped, grown when past the end) */
        if (size < 4) return 0;
        const int k = data[1] % 24;
        mr_dataset *ds = mr_fuzz_iter_pipeline(world, rank);
        mr_data_iter *it = NULL;
        mr_fuzz_check(mr_data_iter_new(ds, &it), "iterstate save iter");
        int32_t tmp[4];
        int64_t n = 0;
        for (int j = 0; j < k; j++) mr_fuzz_iter_batch(it, tmp, &n);
        void *saved = NULL;
        size_t sb = 0;
        mr_fuzz_check(global ? mr_data_iter_save_global(it, &saved, &sb) : mr_data_iter_save(it, &saved, &sb), "save");
        mr_fuzz_iter_batch(it, want, &want_n);
        mr_data_iter_free(it);
        mr_data_free(ds);
        const size_t off = ((size_t)data[2] | (size_t)data[3] << 8) % (sb + 1), plen = size - 4;
        bytes = off + plen > sb ? off + plen : sb;
        owned = calloc(bytes ? bytes : 1, 1);
        if (!owned) abort();
        memcpy(owned, saved, sb);
        if (plen) memcpy(owned + off, data + 4, plen);
        exact = plen == 0 || memcmp(owned, saved, sb) == 0;
        exact = exact && bytes == sb;
        free(saved);
        blob = owned;
    }
    /* a world-independent blob restores into any world (byte 0's bits 5-6 pick it), as the same
     * replica when the world is the same, else as its last one */
    const int rworld = global ? 1 + (data[0] >> 5) % 3 : world;
    const int rrank = rank < rworld ? rank : rworld - 1;
    if (rworld != world) exact = 0; /* another world: another stream, its own next batch */
    mr_dataset *ds = mr_fuzz_iter_pipeline(rworld, rrank);
    mr_data_iter *it = NULL, *fresh = NULL;
    mr_fuzz_check(mr_data_iter_new(ds, &it), "iterstate iter");
    mr_fuzz_check(mr_data_iter_new(ds, &fresh), "iterstate fresh iter");
    mr_status st = global ? mr_data_iter_restore_global(it, blob, bytes) : mr_data_iter_restore(it, blob, bytes);
    mr_fuzz_check(st, global ? "mr_data_iter_restore_global" : "mr_data_iter_restore");
    int32_t got[4], first[4];
    int64_t n = 0, fn = 0;
    if (st != MR_OK) {
        /* the contract: the iterator is back at the start */
        if (exact) abort(); /* a valid save was refused */
        if (mr_data_iter_position(it) != 0) abort();
        mr_fuzz_iter_batch(it, got, &n);
        mr_fuzz_iter_batch(fresh, first, &fn);
        if (n != fn || memcmp(got, first, (size_t)n * sizeof(int32_t)) != 0) abort();
    } else {
        mr_fuzz_iter_batch(it, got, &n);
        if (exact && (n != want_n || memcmp(got, want, (size_t)n * sizeof(int32_t)) != 0)) abort();
        for (int j = 0; j < 64 && n > 0; j++) mr_fuzz_iter_batch(it, got, &n); /* and on to the end */
    }
    mr_data_iter_free(fresh);
    mr_data_iter_free(it);
    mr_data_free(ds);
    free(owned);
    return 0;
}

#endif
