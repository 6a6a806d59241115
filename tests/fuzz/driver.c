/* A stand-in for libFuzzer where there is none (gcc builds; CMake links it into every fuzz_<target>
 * it builds, tests/fuzz/run.sh keeps the libFuzzer build for clang): it runs LLVMFuzzerTestOneInput
 * on every file of the corpus directories given, then on -runs=N inputs made by seeded random
 * mutations of them (bit flips, byte sets, interesting values, inserts, erases, truncation,
 * splices of two inputs, copies within an input), stopping early after -max_total_time=S seconds.
 * Coverage-blind, so far weaker than libFuzzer, but deterministic for a seed and a run count, and
 * it runs under the build's sanitizers, so a target that no longer links, crashes on its corpus or
 * breaks the error contract fails CTest.
 *
 *   fuzz_<target> [-runs=N] [-seed=S] [-max_total_time=S] [-max_len=N] [-artifact=PATH] DIR|FILE...
 *
 * Each input is written to PATH (default ./fuzz-<pid>-input) before it runs, and the file removed
 * at a clean exit, so after a crash it holds the input that caused it (the line before names it). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    uint8_t *data;
    size_t size;
} input;

static uint64_t g_rng;
static uint64_t next_u64(void) { /* splitmix64 */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static size_t below(size_t n) { return n ? (size_t)(next_u64() % n) : 0; }

/* realloc that exits on failure (a driver without memory cannot test anything) */
static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "fuzz driver: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return q;
}

static int read_file(const char *path, input *in) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    in->size = n > 0 ? (size_t)n : 0;
    in->data = xrealloc(NULL, in->size + 1);
    int ok = fread(in->data, 1, in->size, f) == in->size;
    fclose(f);
    return ok ? 0 : -1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Appends the files of path (a file or a directory, sorted by name) to *ins. */
static void load(const char *path, input **ins, int *n, int *cap) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz driver: cannot read %s\n", path);
        exit(1);
    }
    char **names = NULL;
    int nn = 0;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            names = xrealloc(names, (size_t)(nn + 1) * sizeof *names);
            size_t len = strlen(path) + strlen(e->d_name) + 2;
            names[nn] = xrealloc(NULL, len);
            snprintf(names[nn++], len, "%s/%s", path, e->d_name);
        }
        if (d) closedir(d);
        if (nn) qsort(names, (size_t)nn, sizeof *names, cmp_str);
    } else {
        names = xrealloc(NULL, sizeof *names);
        names[nn] = xrealloc(NULL, strlen(path) + 1);
        memcpy(names[nn++], path, strlen(path) + 1);
    }
    for (int k = 0; k < nn; k++) {
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            *ins = xrealloc(*ins, (size_t)*cap * sizeof **ins);
        }
        if (read_file(names[k], &(*ins)[*n]) != 0) {
            fprintf(stderr, "fuzz driver: cannot read %s\n", names[k]);
            exit(1);
        }
        (*n)++;
        free(names[k]);
    }
    free(names);
}

static const char *g_artifact;

static void run_one(const uint8_t *data, size_t size) {
    FILE *f = fopen(g_artifact, "wb");
    if (f) {
        if (size) fwrite(data, 1, size, f);
        fclose(f);
    }
    LLVMFuzzerTestOneInput(data, size);
}

/* One random mutation of in (a copy of a corpus input) in buf (capacity cap); returns the size. */
static size_t mutate(uint8_t *buf, size_t size, size_t cap, const input *other) {
    static const uint64_t interesting[] = {0, 1, 0x7f, 0x80, 0xff, 0x7fff, 0x8000, 0xffff, 0x7fffffff,
                                           0x80000000u, 0xffffffffu, 0x7fffffffffffffffull, ~0ull};
    int ops = 1 + (int)below(4);
    for (int o = 0; o < ops; o++) {
        switch (below(8)) {
        case 0: /* flip a bit */
            if (size) buf[below(size)] ^= (uint8_t)(1u << below(8));
            break;
        case 1: /* set a byte */
            if (size) buf[below(size)] = (uint8_t)next_u64();
            break;
        case 2: { /* an interesting value, 1/2/4/8 bytes, either byte order */
            size_t w = (size_t)1 << below(4);
            if (size < w) break;
            uint64_t v = interesting[below(sizeof interesting / sizeof *interesting)];
            size_t at = below(size - w + 1);
            int big = (int)below(2);
            for (size_t b = 0; b < w; b++) buf[at + b] = (uint8_t)(v >> (8 * (big ? w - 1 - b : b)));
            break;
        }
        case 3: { /* insert random bytes */
            size_t k = 1 + below(16);
            if (size + k > cap) break;
            size_t at = below(size + 1);
            memmove(buf + at + k, buf + at, size - at);
            for (size_t b = 0; b < k; b++) buf[at + b] = (uint8_t)next_u64();
            size += k;
            break;
        }
        case 4: { /* erase a range */
            if (!size) break;
            size_t at = below(size), k = 1 + below(size - at < 64 ? size - at : 64);
            memmove(buf + at, buf + at + k, size - at - k);
            size -= k;
            break;
        }
        case 5: /* truncate */
            size = below(size + 1);
            break;
        case 6: { /* splice: the tail of another input from a random point */
            if (!other->size) break;
            size_t at = below(size + 1), from = below(other->size);
            size_t k = other->size - from;
            if (at + k > cap) k = cap - at;
            memcpy(buf + at, other->data + from, k);
            size = at + k;
            break;
        }
        default: { /* copy a block within the input */
            if (size < 2) break;
            size_t k = 1 + below(size / 2), from = below(size - k + 1), to = below(size - k + 1);
            memmove(buf + to, buf + from, k);
            break;
        }
        }
    }
    return size;
}

int main(int argc, char **argv) {
    long long runs = 1000, max_len = 65536;
    double max_time = 0;
    uint64_t seed = 1;
    char artifact[512];
    snprintf(artifact, sizeof artifact, "fuzz-%d-input", (int)getpid());
    input *ins = NULL;
    int n = 0, cap = 0;
    for (int a = 1; a < argc; a++) {
        const char *s = argv[a];
        if (!strncmp(s, "-runs=", 6)) runs = atoll(s + 6);
        else if (!strncmp(s, "-seed=", 6)) seed = strtoull(s + 6, NULL, 10);
        else if (!strncmp(s, "-max_total_time=", 16)) max_time = atof(s + 16);
        else if (!strncmp(s, "-max_len=", 9)) max_len = atoll(s + 9);
        else if (!strncmp(s, "-artifact=", 10)) snprintf(artifact, sizeof artifact, "%s", s + 10);
        else if (s[0] == '-') {
            fprintf(stderr, "fuzz driver: unknown option %s\n", s);
            return 2;
        } else load(s, &ins, &n, &cap);
    }
    if (n == 0) { /* fails closed: an empty corpus tests nothing */
        fprintf(stderr, "fuzz driver: no corpus inputs (give corpus directories or files)\n");
        return 1;
    }
    g_artifact = artifact;
    g_rng = seed;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int k = 0; k < n; k++) run_one(ins[k].data, ins[k].size);
    size_t cap_bytes = (size_t)max_len;
    uint8_t *buf = xrealloc(NULL, cap_bytes);
    long long done = 0;
    for (; done < runs; done++) {
        if (max_time > 0 && (done & 15) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > max_time) break;
        }
        const input *in = &ins[below((size_t)n)];
        size_t size = in->size < cap_bytes ? in->size : cap_bytes;
        memcpy(buf, in->data, size);
        size = mutate(buf, size, cap_bytes, &ins[below((size_t)n)]);
        run_one(buf, size);
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    double s = (double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec);
    printf("fuzz driver: %d corpus inputs and %lld mutations (seed %llu) in %.1f s: ok\n", n, done,
           (unsigned long long)seed, s);
    unlink(artifact);
    for (int k = 0; k < n; k++) free(ins[k].data);
    free(ins);
    free(buf);
    return 0;
}
