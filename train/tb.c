/* TensorBoard event files (train/tb.h). */
#include "train/tb.h"

#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/tfrecord.h"
#include "proto/tensorboard.pb-c.h"
#include "train/train.h"

#define TB_MAX_SCALARS 32
#define TB_NLIMITS 1600 /* TensorFlow's default histogram: 1551 limits (775 a side and 0) */

struct mr_tb {
    FILE *f;
    char path[4096];
    uint8_t *buf; /* the framed event being written */
    size_t cap;
    int n_limits;
    double limits[TB_NLIMITS];
    double counts[TB_NLIMITS];
};

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* TensorFlow's default bucket limits (tensorflow/core/lib/histogram/histogram.cc): -DBL_MAX,
 * -1e20 .. -1e-12, 0, 1e-12 .. 1e20 growing by 1.1, and DBL_MAX (1551 limits). */
static int default_limits(double *out, int cap) {
    double pos[TB_NLIMITS / 2];
    int np = 0;
    for (double v = 1e-12; v < 1e20 && np < TB_NLIMITS / 2; v *= 1.1) pos[np++] = v;
    int n = 0;
    out[n++] = -DBL_MAX;
    for (int i = np - 1; i >= 0 && n < cap; i--) out[n++] = -pos[i];
    out[n++] = 0;
    for (int i = 0; i < np && n < cap; i++) out[n++] = pos[i];
    out[n++] = DBL_MAX;
    return n;
}

/* Packs ev, frames it and appends it to the file. */
static mr_status write_event(mr_tb *tb, Tensorboard__Event *ev) {
    size_t n = tensorboard__event__get_packed_size(ev);
    if (2 * n + 16 > tb->cap) {
        size_t cap = 2 * n + 16 > 2 * tb->cap ? 2 * n + 16 : 2 * tb->cap;
        uint8_t *b = realloc(tb->buf, cap);
        if (!b) return mr_set_error(MR_ERR_NOMEM, "%s: out of memory for an event of %zu bytes", tb->path, n);
        tb->buf = b, tb->cap = cap;
    }
    uint8_t *packed = tb->buf + n + 16; /* the second half: the frame is built in the first */
    size_t got = tensorboard__event__pack(ev, packed);
    if (got != n) return mr_set_error(MR_ERR_INTERNAL, "%s: an event packed to %zu bytes, not %zu", tb->path, got, n);
    size_t framed = mr_tfrecord_frame(packed, n, tb->buf, n + 16);
    if (fwrite(tb->buf, 1, framed, tb->f) != framed)
        return mr_set_error(MR_ERR_IO, "%s: cannot write: %s", tb->path, strerror(errno ? errno : EIO));
    return MR_OK;
}

static void event_init(Tensorboard__Event *ev, int64_t step) {
    tensorboard__event__init(ev);
    ev->wall_time = wall_now();
    ev->step = step;
}

/* now, or one second past the newest events.out.tfevents.<time>.* file in dir when that is not
 * earlier than now. */
static long long next_time(const char *dir, long long now) {
    DIR *d = opendir(dir);
    if (!d) return now;
    long long newest = -1;
    for (struct dirent *e; (e = readdir(d));) {
        long long t = 0;
        if (sscanf(e->d_name, "events.out.tfevents.%lld.", &t) == 1 && t > newest) newest = t;
    }
    closedir(d);
    return newest >= now ? newest + 1 : now;
}

mr_status mr_tb_open(const char *dir, int64_t start_step, mr_tb **out) {
    mr_status st = MR_OK;
    *out = NULL;
    mr_tb *tb = calloc(1, sizeof *tb);
    MR_CHECK(tb != NULL, MR_ERR_NOMEM, "%s: out of memory", dir);
    MR_TRY(mr_mkdirs(dir));
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    /* readers take the files in name order, and a run's START must come after the runs before it:
     * the time in the name is past every earlier file's (a restart within the same second gets
     * the next one), and a name already there is never overwritten */
    const long long when = next_time(dir, (long long)time(NULL));
    int n = snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%010lld.%s.%ld", dir, when, host, (long)getpid());
    MR_CHECK(n > 0 && (size_t)n < sizeof tb->path, MR_ERR_INVALID, "%s: the path of the event file is too long", dir);
    tb->f = fopen(tb->path, "wbx");
    MR_CHECK(tb->f != NULL, MR_ERR_IO, "%s: cannot create: %s; HINT: make the run directory writable or set "
             "log.tensorboard: false", tb->path, strerror(errno));
    tb->n_limits = default_limits(tb->limits, TB_NLIMITS);
    Tensorboard__Event ev;
    event_init(&ev, 0);
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)"brain.Event:2";
    MR_TRY(write_event(tb, &ev));
    Tensorboard__SessionLog sl;
    tensorboard__session_log__init(&sl);
    sl.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
    event_init(&ev, start_step + 1);
    ev.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
    ev.session_log = &sl;
    MR_TRY(write_event(tb, &ev));
    MR_TRY(mr_tb_flush(tb));
    *out = tb;
    return MR_OK;
fail:
    mr_tb_close(tb);
    return st;
}

mr_status mr_tb_scalars(mr_tb *tb, int64_t step, int n, const char *const *tags, const double *values) {
    if (n > TB_MAX_SCALARS) return mr_set_error(MR_ERR_INVALID, "%s: %d scalars in one event (at most %d)", tb->path, n, TB_MAX_SCALARS);
    Tensorboard__Summary__Value vals[TB_MAX_SCALARS], *pv[TB_MAX_SCALARS];
    for (int i = 0; i < n; i++) {
        tensorboard__summary__value__init(&vals[i]);
        vals[i].tag = (char *)tags[i];
        vals[i].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        vals[i].simple_value = (float)values[i];
        pv[i] = &vals[i];
    }
    Tensorboard__Summary sum;
    tensorboard__summary__init(&sum);
    sum.n_value = (size_t)n;
    sum.value = pv;
    Tensorboard__Event ev;
    event_init(&ev, step);
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(tb, &ev);
}

/* One summary value in an event of its own. */
static mr_status write_value(mr_tb *tb, int64_t step, Tensorboard__Summary__Value *v) {
    Tensorboard__Summary sum;
    tensorboard__summary__init(&sum);
    sum.n_value = 1;
    sum.value = &v;
    Tensorboard__Event ev;
    event_init(&ev, step);
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(tb, &ev);
}

mr_status mr_tb_text(mr_tb *tb, int64_t step, const char *tag, const char *text) {
    ProtobufCBinaryData s = {strlen(text), (uint8_t *)text};
    Tensorboard__TensorShapeProto shape;
    tensorboard__tensor_shape_proto__init(&shape); /* a scalar string */
    Tensorboard__TensorProto t;
    tensorboard__tensor_proto__init(&t);
    t.dtype = TENSORBOARD__DATA_TYPE__DT_STRING;
    t.tensor_shape = &shape;
    t.n_string_val = 1;
    t.string_val = &s;
    Tensorboard__SummaryMetadata__PluginData pd;
    tensorboard__summary_metadata__plugin_data__init(&pd);
    pd.plugin_name = (char *)"text";
    Tensorboard__SummaryMetadata md;
    tensorboard__summary_metadata__init(&md);
    md.plugin_data = &pd;
    md.data_class = TENSORBOARD__DATA_CLASS__DATA_CLASS_TENSOR;
    Tensorboard__Summary__Value v;
    tensorboard__summary__value__init(&v);
    v.tag = (char *)tag;
    v.metadata = &md;
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_TENSOR;
    v.tensor = &t;
    return write_value(tb, step, &v);
}

/* The bucket of x: the first limit above it (std::upper_bound, as TensorFlow's Histogram::Add). */
static int bucket_of(const double *lim, int n, double x) {
    int lo = 0, hi = n - 1; /* lim[n-1] = DBL_MAX > every finite x */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (lim[mid] > x) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

mr_status mr_tb_histogram(mr_tb *tb, int64_t step, const char *tag, const float *x, int64_t n) {
    double mn = INFINITY, mx = -INFINITY, sum = 0, sumsq = 0, num = 0;
    memset(tb->counts, 0, sizeof tb->counts);
    for (int64_t i = 0; i < n; i++) {
        const double v = x[i];
        if (!isfinite(v)) continue;
        mn = v < mn ? v : mn, mx = v > mx ? v : mx;
        sum += v, sumsq += v * v, num++;
        tb->counts[bucket_of(tb->limits, tb->n_limits, v)]++;
    }
    if (num == 0) return MR_OK;
    /* runs of empty buckets merged into one (TensorFlow's EncodeToProto without
     * preserve_zero_buckets): limit and count arrays of the emitted buckets */
    double lim[TB_NLIMITS], cnt[TB_NLIMITS];
    size_t k = 0;
    for (int i = 0; i < tb->n_limits;) {
        double end = tb->limits[i], c = tb->counts[i];
        i++;
        if (c <= 0)
            while (i < tb->n_limits && tb->counts[i] <= 0) end = tb->limits[i], c = tb->counts[i], i++;
        lim[k] = end, cnt[k] = c, k++;
    }
    Tensorboard__HistogramProto h;
    tensorboard__histogram_proto__init(&h);
    h.min = mn, h.max = mx, h.num = num, h.sum = sum, h.sum_squares = sumsq;
    h.n_bucket_limit = h.n_bucket = k;
    h.bucket_limit = lim;
    h.bucket = cnt;
    Tensorboard__Summary__Value v;
    tensorboard__summary__value__init(&v);
    v.tag = (char *)tag;
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_HISTO;
    v.histo = &h;
    return write_value(tb, step, &v);
}

mr_status mr_tb_flush(mr_tb *tb) {
    if (fflush(tb->f) != 0) return mr_set_error(MR_ERR_IO, "%s: cannot write: %s", tb->path, strerror(errno));
    return MR_OK;
}

const char *mr_tb_path(const mr_tb *tb) { return tb->path; }

void mr_tb_close(mr_tb *tb) {
    if (!tb) return;
    if (tb->f) fclose(tb->f);
    free(tb->buf);
    free(tb);
}
