/* Throughput of the FULL training step, input pipeline included: mr_train (train/train.h) fed
 * from real files, the same models, batches and optimizers as bench/torch_bench.py and
 * bench_models.c, next to bench/peer_torch_train.py (the same work through torch.utils.data),
 * which bench/run_train.sh runs in the same session for ratios.
 *   mlp  784-1024-1024-10, batch 256, SGD(lr 0.01, momentum 0.9)    Fashion-MNIST IDX, shuffle 10000
 *   cnn  1x28x28 -> conv32 -> pool -> conv64 -> pool -> fc128 -> fc10, batch 128, SGD(momentum 0.9)
 *                                                                   Fashion-MNIST IDX, shuffle 10000
 *   gpt  vocab from the text, context 128, 4 layers, 4 heads, width 128, batch 32,
 *        AdamW(lr 3e-4, wd 0.1)        a text file as characters (--text), shuffle 10000
 * Method: one mr_train per run of the workload, (1 + R) * S steps with log_every S and no
 * evaluation; the first log interval is the warm-up (first-touch of the arena, the shuffle buffer
 * filling, the prefetch thread starting) and is dropped; the other R intervals' samples_per_s
 * (from <tmp run_dir>/metrics.jsonl, which the trainer computes from its own clock around the
 * whole loop: data wait + forward + backward + optimizer + bookkeeping) give the median, as
 * torch_bench's R runs of S steps do. The step-time split (data_wait / forward / backward /
 * optimizer, averaged over the timed intervals) and the setup time outside the loop (decoding
 * the files, compiling the step, initialising the parameters) are printed too.
 * Usage: bench_train [--models mlp,cnn,gpt] [--bf16] [--steps S] [--runs R] [--text PATH]
 *                    [--data DIR] [--json OUT]
 * Defaults: S 30, R 3, --text runs/data/kjv.txt (launch/prepare_kjv.sh; gpt is skipped with a
 * message when it is missing), --data /usr/share/datasets/fashion-mnist. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/ops.h"
#include "core/status.h"
#include "train/train.h"
#include "bench_util.h"

typedef struct bench_args {
    const char *models, *text, *data, *json;
    int steps, runs;
    mr_dtype compute;
} bench_args;

/* One workload's measurement. */
typedef struct bench_result {
    const char *name;
    int64_t batch, context;    /* context 1 for the classifiers */
    int runs;
    double sps[64];            /* samples/s of each timed interval, in run order */
    double sps_median;
    double split_ms[4];        /* data_wait, forward, backward, optimizer: ms a step, mean of timed intervals */
    double setup_s;            /* mr_train's wall time outside its loop */
    double loss;
    int64_t vocab;
} bench_result;

/* Value of "key": in a metrics.jsonl line; 0 with *ok cleared when absent. */
static double json_num(const char *line, const char *key, int *ok) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    if (!p) {
        *ok = 0;
        return 0;
    }
    return strtod(p + strlen(pat), NULL);
}

/* Reads the per-interval metrics of one run: interval 0 is the warm-up; fills the timed ones
 * into r. Returns the number of intervals read, -1 when the file cannot be opened. */
static int read_metrics(const char *path, bench_result *r, int runs) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    int k = 0;
    double split[4] = {0, 0, 0, 0};
    static const char *keys[4] = {"data_wait_s", "forward_s", "backward_s", "optimizer_s"};
    while (fgets(line, sizeof line, f)) {
        int ok = 1;
        double sps = json_num(line, "samples_per_s", &ok);
        if (!ok) continue; /* an evaluation line (none are requested) */
        if (k >= 1 && k <= runs) {
            r->sps[k - 1] = sps;
            for (int i = 0; i < 4; i++) split[i] += json_num(line, keys[i], &ok);
        }
        k++;
    }
    fclose(f);
    for (int i = 0; i < 4; i++) r->split_ms[i] = runs > 0 ? 1e3 * split[i] / runs : 0;
    return k;
}

/* Runs mr_train for one workload with (1 + runs) * steps steps, logging every `steps`, into a
 * fresh temporary run directory (removed afterwards). 0 on success; prints why and returns 1 on
 * failure. */
static int measure(const char *name, mr_train_cfg cfg, const bench_args *a, bench_result *r) {
    char dir[] = "/tmp/mirror_bench_train.XXXXXX", path[256];
    if (!mkdtemp(dir)) {
        perror("bench_train: mkdtemp");
        return 1;
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    cfg.steps = (int64_t)(1 + a->runs) * a->steps;
    cfg.log_every = a->steps;
    cfg.eval_every = 0;
    cfg.run_dir = dir;
    cfg.quiet = 1;
    cfg.compute = a->compute;
    memset(r, 0, sizeof *r);
    r->name = name;
    r->batch = cfg.batch;
    r->context = cfg.model.type == MR_MODEL_GPT ? cfg.model.context : 1;
    r->runs = a->runs;
    mr_train_result res;
    double t0 = now_s();
    mr_status st = mr_train(&cfg, &res);
    double wall = now_s() - t0;
    int rc = 0;
    if (st != MR_OK) {
        fprintf(stderr, "bench_train: %s: mr_train failed: %s\n", name, mr_last_error());
        rc = 1;
        goto done;
    }
    int k = read_metrics(path, r, a->runs);
    if (k != 1 + a->runs) {
        fprintf(stderr, "bench_train: %s: expected %d log intervals in %s, read %d\n", name, 1 + a->runs, path, k);
        rc = 1;
        goto done;
    }
    double sorted[64];
    memcpy(sorted, r->sps, sizeof sorted);
    r->sps_median = median(sorted, a->runs); /* as Python's statistics.median (torch_bench, the peer) */
    r->setup_s = wall - res.seconds;
    r->loss = res.last_loss;
done:
    unlink(path);
    rmdir(dir);
    return rc;
}

static void print_result(const bench_result *r, FILE *out) {
    double ms = 1e3 * (double)r->batch / r->sps_median, parts = 0, mean_ms = 0;
    for (int i = 0; i < 4; i++) parts += r->split_ms[i];
    for (int i = 0; i < r->runs; i++) mean_ms += 1e3 * (double)r->batch / r->sps[i] / r->runs;
    fprintf(out, "%-4s batch %4lld  %10.1f samples/s  %8.2f ms/step  runs=[", r->name, (long long)r->batch,
            r->sps_median, ms);
    for (int i = 0; i < r->runs; i++) fprintf(out, "%s%.1f", i ? ", " : "", r->sps[i]);
    fprintf(out, "]  loss %.4f  setup %.2f s\n", r->loss, r->setup_s);
    if (r->context > 1) fprintf(out, "%-4s = %.0f tokens/s (vocab %lld)\n", "", r->sps_median * (double)r->context,
                                (long long)r->vocab);
    /* the split is a mean over the timed intervals, so "other" is against their mean step time */
    fprintf(out, "%-4s   step split (ms, mean of the timed steps): data_wait %.2f  forward %.2f  backward %.2f  "
            "optimizer %.2f  other %.2f\n",
            "", r->split_ms[0], r->split_ms[1], r->split_ms[2], r->split_ms[3], mean_ms - parts);
    fflush(out);
}

static void json_result(const bench_result *r, FILE *f, int first) {
    fprintf(f, "%s  {\"model\": \"%s\", \"batch\": %lld, \"samples_per_s_median\": %.1f, \"samples_per_s_runs\": [",
            first ? "" : ",\n", r->name, (long long)r->batch, r->sps_median);
    for (int i = 0; i < r->runs; i++) fprintf(f, "%s%.1f", i ? ", " : "", r->sps[i]);
    fprintf(f, "], \"ms_per_step_median\": %.3f", 1e3 * (double)r->batch / r->sps_median);
    if (r->context > 1)
        fprintf(f, ", \"tokens_per_s_median\": %.1f, \"vocab\": %lld", r->sps_median * (double)r->context,
                (long long)r->vocab);
    fprintf(f,
            ", \"split_ms\": {\"data_wait\": %.3f, \"forward\": %.3f, \"backward\": %.3f, \"optimizer\": %.3f}, "
            "\"setup_s\": %.3f, \"final_loss\": %.4f}",
            r->split_ms[0], r->split_ms[1], r->split_ms[2], r->split_ms[3], r->setup_s, r->loss);
}

/* Counts the distinct UTF-8 code points of a text file (the trainer's vocabulary), for the
 * report only; -1 when unreadable. */
static int64_t text_vocab(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static unsigned char seen[0x110000 / 8];
    memset(seen, 0, sizeof seen);
    int64_t n = 0;
    int c;
    while ((c = fgetc(f)) != EOF) {
        int32_t cp = c;
        int more = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
        if (more) cp = c & (0x3f >> more);
        for (int i = 0; i < more && (c = fgetc(f)) != EOF; i++) cp = (cp << 6) | (c & 0x3f);
        if (cp < 0 || cp >= 0x110000) continue;
        if (!(seen[cp >> 3] & (1u << (cp & 7)))) {
            seen[cp >> 3] |= (unsigned char)(1u << (cp & 7));
            n++;
        }
    }
    fclose(f);
    return n;
}

int main(int argc, char **argv) {
    bench_args a = {"mlp,cnn,gpt", "runs/data/kjv.txt", "/usr/share/datasets/fashion-mnist", NULL, 30, 3, MR_F32};
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--bf16")) {
            a.compute = MR_BF16;
            i--; /* a flag without a value */
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_train: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--models")) a.models = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) a.steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs")) a.runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--text")) a.text = argv[i + 1];
        else if (!strcmp(argv[i], "--data")) a.data = argv[i + 1];
        else if (!strcmp(argv[i], "--json")) a.json = argv[i + 1];
        else {
            fprintf(stderr,
                    "bench_train: unknown flag %s\nHINT: --models mlp,cnn,gpt --bf16 --steps S --runs R --text PATH "
                    "--data DIR --json OUT\n",
                    argv[i]);
            return 2;
        }
    }
    if (a.steps < 1 || a.runs < 1 || a.runs > 64) {
        fprintf(stderr, "bench_train: --steps must be >= 1 and --runs in 1..64\n");
        return 2;
    }
    char tr_img[1024], tr_lab[1024];
    snprintf(tr_img, sizeof tr_img, "%s/train-images-idx3-ubyte.gz", a.data);
    snprintf(tr_lab, sizeof tr_lab, "%s/train-labels-idx1-ubyte.gz", a.data);
    const char *prec = a.compute == MR_BF16 ? "bf16" : "f32";
    printf("# mirror full training step (input pipeline included), %d threads, GEMM: %s, %s, "
           "%d warm-up + %d x %d timed steps\n",
           mr_cpu_threads(), mr_cpu_gemm_provider(),
           a.compute == MR_BF16 ? "mixed_bfloat16 (linear layers and CPU convolutions in bf16)" : "float32", a.steps, a.runs, a.steps);
    fflush(stdout);

    bench_result res[3];
    int nres = 0, failed = 0;
    for (int w = 0; w < 3; w++) {
        static const char *names[3] = {"mlp", "cnn", "gpt"};
        if (!strstr(a.models, names[w])) continue;
        mr_train_cfg c = mr_train_cfg_default();
        c.seed = 1;
        c.accumulate = 1;
        c.shuffle = 10000;
        if (w < 2) {
            c.model = mr_model_cfg_default(w == 0 ? MR_MODEL_MLP : MR_MODEL_CNN);
            c.batch = w == 0 ? 256 : 128;
            c.optim = mr_optim_cfg_default(MR_OPTIM_SGD);
            c.optim.lr = 0.01;
            c.optim.momentum = 0.9;
            c.train_images = tr_img;
            c.train_labels = tr_lab;
            if (access(tr_img, R_OK) != 0 || access(tr_lab, R_OK) != 0) {
                printf("%-4s skipped: no Fashion-MNIST in %s\n", names[w], a.data);
                continue;
            }
        } else {
            if (access(a.text, R_OK) != 0) {
                printf("gpt  skipped: no text file %s\nHINT: launch/prepare_kjv.sh writes runs/data/kjv.txt\n", a.text);
                continue;
            }
            c.model = mr_model_cfg_default(MR_MODEL_GPT); /* vocab is set by the trainer from the text */
            c.batch = 32;
            c.optim = mr_optim_cfg_default(MR_OPTIM_ADAMW);
            c.optim.lr = 3e-4;
            c.optim.weight_decay = 0.1;
            c.train_text = a.text;
        }
        if (measure(names[w], c, &a, &res[nres]) != 0) {
            failed = 1;
            continue;
        }
        if (w == 2) res[nres].vocab = text_vocab(a.text);
        print_result(&res[nres], stdout);
        nres++;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("# peak RSS %.0f MiB\n", ru.ru_maxrss / 1024.0);
    if (a.json) {
        FILE *f = fopen(a.json, "w");
        if (!f) {
            perror("bench_train: --json");
            return 1;
        }
        fprintf(f,
                "{\"info\": {\"framework\": \"mirror\", \"precision\": \"%s\", \"threads\": %d, \"gemm\": \"%s\", "
                "\"steps\": %d, \"warmup\": %d, \"runs\": %d, \"peak_rss_mib\": %.0f},\n \"results\": [\n",
                prec, mr_cpu_threads(), mr_cpu_gemm_provider(), a.steps, a.steps, a.runs, ru.ru_maxrss / 1024.0);
        for (int i = 0; i < nres; i++) json_result(&res[i], f, i == 0);
        fprintf(f, "\n]}\n");
        fclose(f);
    }
    return failed;
}
