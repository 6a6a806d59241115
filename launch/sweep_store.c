/* `mirror sweep`'s records (launch/sweep_impl.h): trials and their rungs, the result files of trials,
 * ASHA's promotions, and the table of results (results.csv and `mirror sweep --status`). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch/sweep_impl.h"

/* Calls fn(ctx, dotted key, value) for every scalar line of YAML as mr_experiment_to_yaml writes it
 * (two spaces per level; "name:" alone opens a section). Stops when fn returns non-zero. */
static void yaml_scalars(const char *yaml, int (*fn)(void *, const char *, const char *), void *ctx) {
    char sect[8][64] = {{0}}, key[1600], line[1024];
    for (const char *p = yaml; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
        p = nl ? nl + 1 : NULL;
        int sp = 0;
        while (line[sp] == ' ') sp++;
        int depth = sp / 2;
        char *colon = strchr(line + sp, ':');
        if (line[sp] == '#' || !line[sp] || !colon || depth >= 8) continue;
        *colon = '\0';
        const char *val = colon[1] == ' ' ? colon + 2 : colon + 1;
        if (!*val) { /* a section */
            snprintf(sect[depth], sizeof sect[depth], "%.63s", line + sp);
            continue;
        }
        key[0] = '\0';
        for (int d = 0; d < depth; d++)
            snprintf(key + strlen(key), sizeof key - strlen(key), "%s.", sect[d]);
        snprintf(key + strlen(key), sizeof key - strlen(key), "%s", line + sp);
        if (fn(ctx, key, val)) return;
    }
}

typedef struct yaml_find {
    const char *key;
    char *out;
    size_t cap;
    int found;
} yaml_find;

static int find_one(void *ctx, const char *key, const char *val) {
    yaml_find *f = ctx;
    if (strcmp(key, f->key)) return 0;
    size_t n = strlen(val);
    if (n >= 2 && val[0] == '\'' && val[n - 1] == '\'') snprintf(f->out, f->cap, "%.*s", (int)(n - 2), val + 1);
    else snprintf(f->out, f->cap, "%s", val);
    f->found = 1;
    return 1;
}

/* The value of a dotted key in to_yaml's text (quotes removed) into out; 0 when absent. */
static int yaml_value(const char *yaml, const char *key, char *out, size_t cap) {
    yaml_find f = {key, out, cap, 0};
    out[0] = '\0';
    yaml_scalars(yaml, find_one, &f);
    return f.found;
}

typedef struct yaml_cmp {
    const char *other;
    char *why;
    size_t cap;
    int n;            /* keys that differ */
    int only_missing; /* count only keys that other lacks */
} yaml_cmp;

static int cmp_one(void *ctx, const char *key, const char *val) {
    yaml_cmp *c = ctx;
    char was[512];
    int had = yaml_value(c->other, key, was, sizeof was);
    if (had && c->only_missing) return 0;
    char now[512];
    size_t n = strlen(val);
    snprintf(now, sizeof now, "%.*s", (int)(n >= 2 && val[0] == '\'' && val[n - 1] == '\'' ? n - 2 : n),
             n >= 2 && val[0] == '\'' && val[n - 1] == '\'' ? val + 1 : val);
    if (had && !strcmp(was, now)) return 0;
    if (c->n++ == 0) snprintf(c->why, c->cap, "%s: %s -> %s", key, had ? was : "(not set)", now);
    return 0;
}

/* What differs between the configuration a trial ran (old) and the one it would run now (now),
 * e.g. "train.steps: 30 -> 40 (and 1 more key)"; "" when no key differs. */
void sw_config_change(const char *old, const char *now, char *why, size_t cap) {
    yaml_cmp c = {old, why, cap, 0, 0};
    why[0] = '\0';
    yaml_scalars(now, cmp_one, &c);
    char first[600];
    snprintf(first, sizeof first, "%s", why);
    char gone[600] = "";
    yaml_cmp back = {now, gone, sizeof gone, 0, 1}; /* keys the old run had and this one lacks */
    yaml_scalars(old, cmp_one, &back);
    int more = c.n + back.n - 1;
    if (!c.n && back.n) snprintf(first, sizeof first, "%s", gone);
    if (more > 0) snprintf(why, cap, "%s (and %d more key%s)", first, more, more > 1 ? "s" : "");
    else snprintf(why, cap, "%s", first);
}

/* Reads a whole (small) file into a malloc'd string; NULL when it cannot be read. */
char *sw_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    char chunk[4096];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + got + 1 > cap) {
            cap = 2 * (len + got + 1);
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        memcpy(buf + len, chunk, got);
        len += got;
    }
    fclose(f);
    if (!buf && !(buf = malloc(1))) return NULL;
    buf[len] = '\0';
    return buf;
}

/* Moves a trial directory of another configuration aside, to <dir>.old-N (the first free N), so
 * that its checkpoints are neither resumed nor pruned by the new run. The new name in moved. */
mr_status sw_move_aside(const char *dir, char *moved, size_t cap) {
    struct stat sb;
    for (int k = 1; k < 10000; k++) {
        snprintf(moved, cap, "%s.old-%d", dir, k);
        if (stat(moved, &sb) == 0) continue;
        if (rename(dir, moved) != 0)
            return mr_set_error(MR_ERR_IO, "cannot move '%s' to '%s': %s", dir, moved, strerror(errno));
        return MR_OK;
    }
    return mr_set_error(MR_ERR_IO, "cannot move '%s' aside: %s.old-1 to -9999 all exist", dir, dir);
}



/* ---- trials and rungs -------------------------------------------------------------------------- */

mr_status sw_trials_init(const mr_experiment *base, sw_trials *t) {
    mr_status st = MR_OK;
    memset(t, 0, sizeof *t);
    t->base = base;
    snprintf(t->dir, sizeof t->dir, "%s", base->checkpoint.dir[0] ? base->checkpoint.dir : "runs/sweep");
    const int64_t last = base->sweep.scheduler.max_steps ? base->sweep.scheduler.max_steps : base->train.steps;
    sw_sched *sc = &t->sc;
    sc->asha = base->sweep.scheduler.type == MR_SCHED_ASHA;
    sc->reduction = base->sweep.scheduler.reduction;
    if (sc->asha) { /* min_steps * reduction^k below the last rung, then the last */
        for (int64_t s = base->sweep.scheduler.min_steps; s < last && sc->n < SW_MAX_RUNGS - 1; s *= sc->reduction)
            sc->steps[sc->n++] = s;
    }
    sc->steps[sc->n++] = last;
    MR_TRY(mr_sweep_expand(base, &t->trials, &t->n));
    t->yamls = calloc((size_t)t->n, sizeof *t->yamls);
    t->hash = calloc((size_t)t->n, sizeof *t->hash);
    MR_CHECK(t->yamls && t->hash, MR_ERR_NOMEM, "sweep: out of memory for %d trials", t->n);
    for (int i = 0; i < t->n; i++) {
        if (sc->asha) t->trials[i].train.steps = last; /* the schedule's length: rungs stop short of it */
        MR_TRY(mr_experiment_to_yaml(&t->trials[i], &t->yamls[i]));
        MR_TRY(mr_experiment_hash(&t->trials[i], &t->hash[i]));
    }
    return MR_OK;
fail:
    sw_trials_deinit(t);
    return st;
}

void sw_trials_deinit(sw_trials *t) {
    if (t->yamls)
        for (int i = 0; i < t->n; i++) free(t->yamls[i]);
    free(t->yamls);
    free(t->hash);
    mr_sweep_free(t->trials, t->n);
    t->yamls = NULL;
    t->hash = NULL;
    t->trials = NULL;
    t->n = 0;
}

void sw_trial_dir(const sw_trials *t, int trial, char *out, size_t cap) {
    snprintf(out, cap, "%s/trial-%03d", t->dir, trial);
}

void sw_result_path(const sw_trials *t, int trial, int rung, char *out, size_t cap) {
    if (t->sc.asha) snprintf(out, cap, "%s/trial-%03d/rung-%d.txt", t->dir, trial, rung);
    else snprintf(out, cap, "%s/trial-%03d/result.txt", t->dir, trial);
}

static const char *const STATUS_NAMES[] = {"none", "done", "early_stop", "diverged", "failed"};

const char *sw_status_name(sw_status s) { return STATUS_NAMES[s]; }

/* ---- result files ------------------------------------------------------------------------------ */

static int read_result(const char *path, sw_result *r) {
    memset(r, 0, sizeof *r);
    r->metric = r->loss = NAN;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4600];
    int fields = 0;
    r->status = SW_DONE; /* files written before statuses existed were finished runs */
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *v = strchr(line, ' ');
        if (!v) continue;
        *v++ = '\0';
        unsigned long long u = 0;
        if (!strcmp(line, "metric")) fields += sscanf(v, "%lf", &r->metric) == 1;
        else if (!strcmp(line, "loss")) fields += sscanf(v, "%lf", &r->loss) == 1;
        else if (!strcmp(line, "seconds")) fields += sscanf(v, "%lf", &r->seconds) == 1;
        else if (!strcmp(line, "config_hash") && sscanf(v, "%llx", &u) == 1) { r->hash = u; fields++; }
        else if (!strcmp(line, "run") && sscanf(v, "%llx", &u) == 1) r->run_id = u;
        else if (!strcmp(line, "steps")) r->steps = atoll(v);
        else if (!strcmp(line, "target")) r->target = atoll(v);
        else if (!strcmp(line, "checkpoint")) snprintf(r->checkpoint, sizeof r->checkpoint, "%s", v);
        else if (!strcmp(line, "error")) snprintf(r->error, sizeof r->error, "%s", v);
        else if (!strcmp(line, "status")) {
            r->status = SW_NONE;
            for (int s = SW_DONE; s <= SW_FAILED; s++)
                if (!strcmp(v, STATUS_NAMES[s])) r->status = (sw_status)s;
        }
    }
    fclose(f);
    r->have = fields == 4 && r->status != SW_NONE; /* metric, loss, seconds and the hash, a known status */
    return r->have;
}

int sw_result_get(const sw_trials *t, int trial, int rung, sw_result *r) {
    char path[4200];
    sw_result_path(t, trial, rung, path, sizeof path);
    if (!read_result(path, r)) return 0;
    if (r->hash != t->hash[trial]) return 0;
    /* a result.txt without a target predates rungs: its hash covers train.steps */
    return r->target == t->sc.steps[rung] || (!t->sc.asha && r->target == 0);
}

mr_status sw_result_put(const sw_trials *t, int trial, int rung, const sw_result *r) {
    char path[4200], tmp[4300];
    sw_result_path(t, trial, rung, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return mr_set_error(MR_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    int ok = fprintf(f, "metric %.17g\nloss %.17g\nseconds %.17g\nconfig_hash %016llx\nstatus %s\nsteps %lld\n"
                        "target %lld\nrun %016llx\n", r->metric, r->loss, r->seconds, (unsigned long long)r->hash,
                     STATUS_NAMES[r->status], (long long)r->steps, (long long)t->sc.steps[rung],
                     (unsigned long long)r->run_id) > 0;
    if (r->checkpoint[0]) ok = ok && fprintf(f, "checkpoint %s\n", r->checkpoint) > 0;
    if (r->error[0]) ok = ok && fprintf(f, "error %s\n", r->error) > 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        mr_status st = mr_set_error(MR_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        unlink(tmp);
        return st;
    }
    return MR_OK;
}

/* ---- ASHA's promotions ------------------------------------------------------------------------- */

typedef struct ranked {
    int trial;
    double metric;
} ranked;

static int g_minimise; /* qsort's direction (set before each sort; the sweep is single-threaded) */

/* Better first: a NaN metric last, then ties to the lower trial number. */
static int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    const int nx = isnan(x->metric), ny = isnan(y->metric);
    if (nx != ny) return nx - ny;
    if (!nx && x->metric != y->metric)
        return (g_minimise ? x->metric > y->metric : x->metric < y->metric) ? 1 : -1;
    return (x->trial > y->trial) - (x->trial < y->trial);
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

int sw_rung_members(const sw_trials *t, int rung, int *members) {
    if (rung == 0) {
        for (int i = 0; i < t->n; i++) members[i] = i;
        return t->n;
    }
    int prev = sw_rung_members(t, rung - 1, members);
    if (prev < 0) return -1;
    ranked *rk = malloc((size_t)(prev ? prev : 1) * sizeof *rk);
    if (!rk) return -1;
    int ok = 0;
    for (int i = 0; i < prev; i++) {
        sw_result r;
        if (!sw_result_get(t, members[i], rung - 1, &r)) {
            free(rk);
            return -1; /* not finished yet */
        }
        if (r.status == SW_DONE) rk[ok++] = (ranked){members[i], r.metric};
    }
    int keep = (int)(prev / t->sc.reduction);
    if (keep < 1) keep = 1;
    if (keep > ok) keep = ok;
    g_minimise = t->base->sweep.goal == MR_GOAL_MIN;
    qsort(rk, (size_t)ok, sizeof *rk, cmp_ranked);
    for (int i = 0; i < keep; i++) members[i] = rk[i].trial;
    free(rk);
    qsort(members, (size_t)keep, sizeof *members, cmp_int);
    return keep;
}

mr_status sw_write_schedule(const sw_trials *t) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/schedule.txt", t->dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int *m = malloc((size_t)(t->n ? t->n : 1) * sizeof *m);
    FILE *f = m ? fopen(tmp, "w") : NULL;
    if (!f) {
        free(m);
        return mr_set_error(MR_ERR_IO, "cannot write '%s': %s", tmp, m ? strerror(errno) : "out of memory");
    }
    int ok = fprintf(f, "# mirror sweep: ASHA (synchronous successive halving), reduction %lld; the trials of each "
                        "rung decided so far\n", (long long)t->sc.reduction) > 0;
    for (int k = 0; k < t->sc.n && ok; k++) {
        int c = sw_rung_members(t, k, m);
        if (c < 0) break;
        ok = fprintf(f, "rung %d steps %lld trials", k, (long long)t->sc.steps[k]) > 0;
        for (int i = 0; i < c && ok; i++) ok = fprintf(f, " %d", m[i]) > 0;
        ok = ok && fputc('\n', f) != EOF;
    }
    free(m);
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        mr_status st = mr_set_error(MR_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        unlink(tmp);
        return st;
    }
    return MR_OK;
}

/* ---- the table --------------------------------------------------------------------------------- */

typedef struct trial_row {
    int index, rung; /* rung: the last one with a result (-1: none) */
    sw_result r;
    char why[600];   /* why it stopped, or what it is doing */
} trial_row;

/* Finished runs first (the deepest rung first), then by the metric, then the trial number. */
static int cmp_rows(const void *a, const void *b) {
    const trial_row *x = a, *y = b;
    if (x->rung != y->rung) return y->rung - x->rung;
    const int gx = x->r.have && (x->r.status == SW_DONE || x->r.status == SW_EARLY);
    const int gy = y->r.have && (y->r.status == SW_DONE || y->r.status == SW_EARLY);
    if (gx != gy) return gy - gx;
    ranked rx = {x->index, gx ? x->r.metric : NAN}, ry = {y->index, gy ? y->r.metric : NAN};
    return cmp_ranked(&rx, &ry);
}

/* Trial i's deepest rung with a result into *out (-1: none; out->metric NaN). */
static int deepest(const sw_trials *t, int i, sw_result *out) {
    int rung = -1;
    memset(out, 0, sizeof *out);
    out->metric = out->loss = NAN;
    for (int k = 0; k < t->sc.n; k++) {
        sw_result r;
        if (!sw_result_get(t, i, k, &r)) break;
        rung = k;
        *out = r;
    }
    return rung;
}

/* Row i: its deepest result, and why it stopped there (in_next[i]: whether it is in the next
 * rung, -1 while that is not decided). */
static void fill_row(const sw_trials *t, int i, const int *running, const int *in_next, trial_row *w) {
    memset(w, 0, sizeof *w);
    w->index = i;
    w->rung = deepest(t, i, &w->r);
    const int last = t->sc.n - 1, run = running ? running[i] : -1;
    if (run >= 0) snprintf(w->why, sizeof w->why, "running (rung %d: to step %lld)", run, (long long)t->sc.steps[run]);
    else if (w->rung < 0) snprintf(w->why, sizeof w->why, "pending");
    else if (w->r.status == SW_EARLY) snprintf(w->why, sizeof w->why, "early stop at step %lld", (long long)w->r.steps);
    else if (w->r.status == SW_DIVERGED || w->r.status == SW_FAILED)
        snprintf(w->why, sizeof w->why, "%s: %s", sw_status_name(w->r.status), w->r.error);
    else if (w->rung == last) snprintf(w->why, sizeof w->why, "completed");
    else if (in_next[i] < 0) snprintf(w->why, sizeof w->why, "waiting for rung %d to finish", w->rung);
    else if (!in_next[i]) snprintf(w->why, sizeof w->why, "stopped by asha at rung %d", w->rung);
    else snprintf(w->why, sizeof w->why, "promoted to rung %d", w->rung + 1);
}

/* One CSV field: quoted when it holds a comma, a quote or a newline. */
static void csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

mr_status sw_table(const sw_trials *t, const int *running, FILE *out, int csv, int *best, int *failed) {
    const mr_experiment *e = t->base;
    trial_row *rows = calloc((size_t)(t->n ? t->n : 1), sizeof *rows);
    int *in_next = malloc((size_t)(t->n ? t->n : 1) * sizeof *in_next), *m = malloc((size_t)(t->n ? t->n : 1) * sizeof *m);
    char (*vals)[MR_SWEEP_MAX_PARAMS][128] = calloc((size_t)(t->n ? t->n : 1), sizeof *vals);
    if (!rows || !in_next || !m || !vals) {
        free(rows), free(in_next), free(m), free(vals);
        return mr_set_error(MR_ERR_NOMEM, "sweep: out of memory for the table of %d trials", t->n);
    }
    *best = -1;
    *failed = 0;
    for (int i = 0; i < t->n; i++) {
        in_next[i] = -1;
        for (int p = 0; p < e->sweep.n_params; p++) yaml_value(t->yamls[i], e->sweep.params[p].key, vals[i][p], sizeof vals[i][p]);
    }
    for (int i = 0; i < t->n; i++) { /* is trial i in the rung after its deepest? (-1: not decided yet) */
        sw_result r;
        const int k = deepest(t, i, &r) + 1;
        if (k <= 0 || k >= t->sc.n) continue;
        int c = sw_rung_members(t, k, m);
        if (c < 0) continue;
        in_next[i] = 0;
        for (int j = 0; j < c; j++) in_next[i] |= m[j] == i;
    }
    for (int i = 0; i < t->n; i++) {
        fill_row(t, i, running, in_next, &rows[i]);
        *failed += rows[i].r.have && rows[i].r.status == SW_FAILED;
    }
    qsort(rows, (size_t)t->n, sizeof *rows, cmp_rows);
    if (t->n && rows[0].r.have && (rows[0].r.status == SW_DONE || rows[0].r.status == SW_EARLY)) *best = rows[0].index;
    if (csv) {
        fprintf(out, "trial,dir");
        for (int p = 0; p < e->sweep.n_params; p++) {
            fputc(',', out);
            csv_field(out, e->sweep.params[p].key);
        }
        fprintf(out, ",%s,loss,rung,steps,seconds,stopped\n", e->sweep.metric);
    } else {
        fprintf(out, "%-5s", "trial");
        for (int p = 0; p < e->sweep.n_params; p++) fprintf(out, " %14.14s", e->sweep.params[p].key);
        fprintf(out, " %15s %10s %4s %7s %9s  %s\n", e->sweep.metric, "loss", "rung", "steps", "seconds", "status");
    }
    for (int j = 0; j < t->n; j++) {
        const trial_row *w = &rows[j];
        char dir[4200];
        sw_trial_dir(t, w->index, dir, sizeof dir);
        if (csv) {
            fprintf(out, "%d,", w->index);
            csv_field(out, dir);
            for (int p = 0; p < e->sweep.n_params; p++) {
                fputc(',', out);
                csv_field(out, vals[w->index][p]);
            }
            fprintf(out, ",%.6g,%.6g,%d,%lld,%.6g,", w->r.metric, w->r.loss, w->rung, (long long)w->r.steps, w->r.seconds);
            csv_field(out, w->why);
            fputc('\n', out);
        } else {
            fprintf(out, "%-5d", w->index);
            for (int p = 0; p < e->sweep.n_params; p++) fprintf(out, " %14.14s", vals[w->index][p]);
            fprintf(out, " %15.6g %10.6g %4d %7lld %9.1f  %s\n", w->r.metric, w->r.loss, w->rung, (long long)w->r.steps,
                    w->r.seconds, w->why);
        }
    }
    free(rows), free(in_next), free(m), free(vals);
    return MR_OK;
}
