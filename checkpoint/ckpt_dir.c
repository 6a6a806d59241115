/* Directories of checkpoints: one file per step named ckpt-%08lld.h5, so names sort by step up to
 * step 99,999,999 and parse back to the step after it. `resume: auto` takes the newest file that
 * verifies (a damaged newest file costs a warning and one checkpoint interval, not the run);
 * keep-last-N deletes by name. Temp files "<name>.tmp.<pid>" are left by a writer that died
 * mid-write (kill -9, node failure); they are deleted once no process with that pid is alive. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "core/log.h"

void mr_ckpt_path(const char *dir, int64_t step, char *buf, size_t cap) {
    if (!buf || cap == 0) return;
    size_t n = dir ? strlen(dir) : 0;
    int slash = n > 0 && dir[n - 1] != '/';
    snprintf(buf, cap, "%s%sckpt-%08lld.h5", dir ? dir : "", slash ? "/" : "", (long long)step);
}

/* The step of a checkpoint file name, or -1 when the name is not exactly ckpt-<%08lld>.h5. With
 * tmp_pid set, parses "<that name>.tmp.<pid>" instead and stores the pid. */
static int64_t parse_name(const char *name, long *tmp_pid) {
    if (strncmp(name, "ckpt-", 5) != 0) return -1;
    const char *p = name + 5, *q = p;
    while (*q >= '0' && *q <= '9') q++;
    size_t nd = (size_t)(q - p);
    if (nd < 8 || nd > 18 || strncmp(q, ".h5", 3) != 0) return -1;
    int64_t step = 0;
    for (const char *c = p; c < q; c++) step = step * 10 + (*c - '0');
    char canon[32];
    snprintf(canon, sizeof canon, "%08lld", (long long)step);
    if (strlen(canon) != nd) return -1; /* extra leading zeros: not a name mr_ckpt_path writes */
    q += 3;
    if (!tmp_pid) return *q ? -1 : step;
    if (strncmp(q, ".tmp.", 5) != 0) return -1;
    q += 5;
    if (*q < '1' || *q > '9') return -1;
    char *end = NULL;
    errno = 0;
    long pid = strtol(q, &end, 10);
    if (errno || *end || pid <= 0 || pid > 0x3fffffffL) return -1; /* never kill(<= 0): groups */
    *tmp_pid = pid;
    return step;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

mr_status mr_ckpt_scan(const char *dir, int64_t **steps, int *n) {
    if (!dir || !steps || !n) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_scan: NULL argument");
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return MR_OK;
        return mr_set_error(MR_ERR_IO, "%s: cannot list the checkpoint directory: %s", dir, strerror(errno));
    }
    int64_t *v = NULL;
    int cnt = 0, cap = 0;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d))) {
        int64_t s = parse_name(e->d_name, NULL);
        if (s < 0) continue;
        if (cnt == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *nv = realloc(v, sizeof *v * (size_t)cap);
            if (!nv) {
                free(v);
                closedir(d);
                return mr_set_error(MR_ERR_NOMEM, "%s: out of memory listing checkpoints", dir);
            }
            v = nv;
        }
        v[cnt++] = s;
        errno = 0;
    }
    int err = errno;
    closedir(d);
    if (err) {
        free(v);
        return mr_set_error(MR_ERR_IO, "%s: reading the checkpoint directory failed: %s", dir, strerror(err));
    }
    if (cnt > 1) qsort(v, (size_t)cnt, sizeof *v, cmp_i64);
    *steps = v;
    *n = cnt;
    return MR_OK;
}

mr_status mr_ckpt_latest(const char *dir, char *path, size_t cap, int64_t *step, int *found) {
    if (!dir || !path || !step || !found) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_latest: NULL argument");
    *found = 0;
    int64_t *steps = NULL;
    int n = 0;
    mr_status st = mr_ckpt_scan(dir, &steps, &n);
    if (st != MR_OK) return st;
    for (int i = n - 1; i >= 0; i--) {
        char p[4096];
        mr_ckpt_path(dir, steps[i], p, sizeof p);
        if (strlen(p) + 1 > cap) {
            st = mr_set_error(MR_ERR_INVALID, "%s: path does not fit the %zu-byte buffer", p, cap);
            break;
        }
        mr_status v = mr_ckpt_verify(p);
        if (v == MR_OK) {
            strcpy(path, p);
            *step = steps[i];
            *found = 1;
            break;
        }
        if (v == MR_ERR_NOMEM) {
            st = v;
            break;
        }
        mr_log_warn("skipping checkpoint %s: %s (%s)", p, mr_last_error(), mr_status_name(v));
    }
    free(steps);
    return st;
}

mr_status mr_ckpt_prune(const char *dir, int keep) {
    if (!dir) return mr_set_error(MR_ERR_INVALID, "mr_ckpt_prune: dir is NULL");
    if (keep < 1) return mr_set_error(MR_ERR_INVALID, "%s: keep must be >= 1, got %d", dir, keep);
    int64_t *steps = NULL;
    int n = 0;
    mr_status st = mr_ckpt_scan(dir, &steps, &n), first = MR_OK;
    if (st != MR_OK) return st;
    char p[4096];
    for (int i = 0; i < n - keep; i++) {
        mr_ckpt_path(dir, steps[i], p, sizeof p);
        if (unlink(p) != 0 && errno != ENOENT && first == MR_OK) {
            first = mr_set_error(MR_ERR_IO, "%s: cannot delete an old checkpoint: %s", p, strerror(errno));
        }
    }
    free(steps);
    /* temp files of writers that are gone */
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            long pid = 0;
            if (parse_name(e->d_name, &pid) < 0) continue;
            if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to judge) */
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (unlink(p) != 0 && errno != ENOENT && first == MR_OK) {
                first = mr_set_error(MR_ERR_IO, "%s: cannot delete a stale temporary file: %s", p, strerror(errno));
            }
            mr_log_debug("deleted %s, left by process %ld which is gone", p, pid);
        }
        closedir(d);
    }
    return first; /* the first failure's message is the one kept */
}
