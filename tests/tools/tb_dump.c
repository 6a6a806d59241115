/* tb_dump DIR: the TensorBoard events of a directory as TensorBoard shows them, one JSON object
 * a line, for tests/e2e/tensorboard.sh (the check that needs no Python packages).
 *
 * Reads every events.out.tfevents.* file of DIR in name order (as TensorBoard's directory loader
 * does), each record checked (data/tfrecord.h: CRCs, truncation) and decoded with protobuf-c, and
 * applies what TensorBoard's EventAccumulator does with file_version "brain.Event:2": a SessionLog
 * START at step S drops every event seen so far with step >= S. Prints, in file order:
 *   {"file_version": "brain.Event:2"}                         (once per file)
 *   {"step": S, "tag": "train/loss", "value": V}               scalars (simple_value)
 *   {"step": S, "tag": T, "text": "..."}                        text summaries (string tensors)
 *   {"step": S, "tag": T, "num": N, "min": A, "max": B, "sum": X, "sum_squares": Y,
 *    "buckets": K, "bucket_sum": C, "limits_sorted": true}      histograms
 *   {"starts": K}                                               at the end: SessionLog STARTs seen
 * Exit 1 with a message on any unreadable file or record, on an event of a kind it does not know,
 * and when DIR has no event file (fail closed). */
#include <dirent.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tfrecord.h"
#include "proto/tensorboard.pb-c.h"

#define MAX_FILES 256

typedef struct item { int64_t step; char *line; } item;
static item *g_items;
static size_t g_n, g_cap;

static void add(int64_t step, char *line) {
    if (g_n == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 1024;
        g_items = realloc(g_items, g_cap * sizeof *g_items);
        if (!g_items) exit(2);
    }
    g_items[g_n++] = (item){step, line};
}

/* A START at step s: TensorBoard drops what it holds at steps >= s. */
static void purge(int64_t s) {
    size_t k = 0;
    for (size_t i = 0; i < g_n; i++) {
        if (g_items[i].step >= 0 && g_items[i].step >= s) free(g_items[i].line);
        else g_items[k++] = g_items[i];
    }
    g_n = k;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    if (vasprintf(&s, f, ap) < 0) exit(2);
    va_end(ap);
    return s;
}

/* JSON string escape of n bytes (control characters as \u00XX). */
static char *json_str(const uint8_t *p, size_t n) {
    char *o = malloc(6 * n + 3), *q = o;
    if (!o) exit(2);
    *q++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned c = p[i];
        if (c == '"' || c == '\\') *q++ = '\\', *q++ = (char)c;
        else if (c == '\n') *q++ = '\\', *q++ = 'n';
        else if (c < 0x20) q += sprintf(q, "\\u%04x", c);
        else *q++ = (char)c;
    }
    *q++ = '"';
    *q = '\0';
    return o;
}

static int value_line(int64_t step, const Tensorboard__Summary__Value *v) {
    char *tag = json_str((const uint8_t *)v->tag, strlen(v->tag));
    switch (v->value_case) {
    case TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE:
        add(step, fmt("{\"step\": %" PRId64 ", \"tag\": %s, \"value\": %.9g}", step, tag, (double)v->simple_value));
        break;
    case TENSORBOARD__SUMMARY__VALUE__VALUE_TENSOR: {
        const Tensorboard__TensorProto *t = v->tensor;
        if (t->dtype != TENSORBOARD__DATA_TYPE__DT_STRING || t->n_string_val != 1) {
            fprintf(stderr, "tb_dump: tag %s: a tensor that is not one string\n", tag);
            free(tag);
            return 1;
        }
        char *text = json_str(t->string_val[0].data, t->string_val[0].len);
        const char *plugin = v->metadata && v->metadata->plugin_data ? v->metadata->plugin_data->plugin_name : "";
        add(step, fmt("{\"step\": %" PRId64 ", \"tag\": %s, \"plugin\": \"%s\", \"text\": %s}", step, tag, plugin, text));
        free(text);
        break;
    }
    case TENSORBOARD__SUMMARY__VALUE__VALUE_HISTO: {
        const Tensorboard__HistogramProto *h = v->histo;
        double total = 0;
        int sorted = h->n_bucket == h->n_bucket_limit, zero_runs = 0;
        for (size_t i = 0; i < h->n_bucket; i++) {
            total += h->bucket[i];
            if (i && h->bucket_limit[i] <= h->bucket_limit[i - 1]) sorted = 0;
            if (i && h->bucket[i] == 0 && h->bucket[i - 1] == 0) zero_runs++;
        }
        add(step, fmt("{\"step\": %" PRId64 ", \"tag\": %s, \"num\": %.17g, \"min\": %.9g, \"max\": %.9g, \"sum\": %.9g, "
                      "\"sum_squares\": %.9g, \"buckets\": %zu, \"bucket_sum\": %.17g, \"limits_sorted\": %s, "
                      "\"adjacent_empty\": %d}",
                      step, tag, h->num, h->min, h->max, h->sum, h->sum_squares, h->n_bucket, total,
                      sorted ? "true" : "false", zero_runs));
        break;
    }
    default:
        fprintf(stderr, "tb_dump: tag %s: a summary value of kind %d\n", tag, (int)v->value_case);
        free(tag);
        return 1;
    }
    free(tag);
    return 0;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: tb_dump DIR\n");
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (!d) {
        fprintf(stderr, "tb_dump: cannot open %s\n", argv[1]);
        return 1;
    }
    char *names[MAX_FILES];
    int nf = 0;
    for (struct dirent *e; (e = readdir(d)) && nf < MAX_FILES;)
        if (strstr(e->d_name, "tfevents")) names[nf++] = strdup(e->d_name);
    closedir(d);
    if (nf == 0) {
        fprintf(stderr, "tb_dump: no events.out.tfevents.* file in %s\n", argv[1]);
        return 1;
    }
    qsort(names, (size_t)nf, sizeof names[0], cmp_names);
    int bad = 0, starts = 0;
    for (int i = 0; i < nf && !bad; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", argv[1], names[i]);
        FILE *f = fopen(path, "rb");
        if (!f) {
            fprintf(stderr, "tb_dump: cannot open %s\n", path);
            return 1;
        }
        mr_tfrecord_reader r;
        mr_tfrecord_reader_init(&r, f, path);
        for (;;) {
            const uint8_t *data;
            size_t n;
            int end = 0;
            if (mr_tfrecord_next(&r, &data, &n, &end) != MR_OK) {
                fprintf(stderr, "tb_dump: %s\n", mr_last_error());
                bad = 1;
                break;
            }
            if (end) break;
            Tensorboard__Event *ev = tensorboard__event__unpack(NULL, n, data);
            if (!ev) {
                fprintf(stderr, "tb_dump: %s: record %lld does not decode as an Event\n", path, (long long)r.index - 1);
                bad = 1;
                break;
            }
            if (ev->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION) {
                add(-1, fmt("{\"file_version\": \"%s\"}", ev->file_version));
            } else if (ev->what_case == TENSORBOARD__EVENT__WHAT_SESSION_LOG) {
                if (ev->session_log->status == TENSORBOARD__SESSION_LOG__SESSION_STATUS__START) purge(ev->step), starts++;
            } else if (ev->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY) {
                for (size_t k = 0; k < ev->summary->n_value && !bad; k++) bad = value_line(ev->step, ev->summary->value[k]);
            } else {
                fprintf(stderr, "tb_dump: %s: an event of kind %d\n", path, (int)ev->what_case);
                bad = 1;
            }
            tensorboard__event__free_unpacked(ev, NULL);
            if (bad) break;
        }
        mr_tfrecord_reader_free(&r);
        fclose(f);
    }
    for (size_t i = 0; i < g_n; i++) {
        puts(g_items[i].line);
        free(g_items[i].line);
    }
    printf("{\"starts\": %d}\n", starts);
    for (int i = 0; i < nf; i++) free(names[i]);
    free(g_items);
    return bad;
}
