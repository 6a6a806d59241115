/* emu_rewrite IN.cu OUT.cc KERNELS.txt: the build step that turns a .cu file of core/cuda/ into
 * host C++ for the CUDA emulator (tests/emu/emu_cuda.h explains the target syntax). nvcc compiles
 * the original file untouched; this tool rewrites only three constructs and keeps every line
 * where it was (a "#line 1" names the original file), so compiler errors, __FILE__/__LINE__ in
 * emulator reports and sanitizer stacks all point at the real source:
 *
 *   K<<<a, b, c, d>>>(args)  -> ::mr_emu_k::launch_at([=](auto... x) { K(x...); },
 *                                  ::mr_emu_k::cfg(__FILE__, __LINE__, a, b, c, d)) ^ ::mr_emu_k::pack(args)
 *                               (the kernel's template arguments are deduced from args as nvcc does)
 *   __shared__ T n[X][Y], m[Z];    -> T (&n)[X][Y] = MR_EMU_SHARED(T[X][Y], ...); T (&m)[Z] = ...;
 *   extern __shared__ T n[];       -> T *n = (T *)::mr_emu_k::dyn_shared();
 *   __global__ ... name(...) {     -> ... { MR_EMU_KERNEL_ENTRY(line);   (and "file:line name" in KERNELS.txt)
 *
 * Comments and string/char literals are copied as they are and never rewritten. Exits non-zero
 * with a message on anything it cannot parse, so a construct it does not know fails the build. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_in;
static int is_id(char c) { return isalnum((unsigned char)c) || c == '_'; }

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emu_rewrite: %s: ", g_in);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open");
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (!b || fread(b, 1, (size_t)sz, f) != (size_t)sz) die("cannot read");
    b[sz] = 0;
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* Length of the comment or literal starting at s[i] (0 when none starts there). */
static size_t skip_len(const char *s, size_t i, size_t n) {
    if (s[i] == '/' && i + 1 < n && s[i + 1] == '/') {
        size_t j = i;
        while (j < n && s[j] != '\n') j++;
        return j - i;
    }
    if (s[i] == '/' && i + 1 < n && s[i + 1] == '*') {
        const char *e = strstr(s + i + 2, "*/");
        if (!e) die("unterminated comment");
        return (size_t)(e + 2 - (s + i));
    }
    if (s[i] == '"' || s[i] == '\'') {
        char q = s[i];
        size_t j = i + 1;
        while (j < n && s[j] != q) {
            if (s[j] == '\\') j++;
            j++;
        }
        if (j >= n) die("unterminated literal");
        return j + 1 - i;
    }
    return 0;
}

/* The output, kept in memory so a launch can take back the kernel expression it follows. */
static char *g_out;
static size_t g_len, g_cap;
static void out_n(const char *p, size_t n) {
    if (g_len + n + 1 > g_cap) {
        g_cap = (g_len + n + 1) * 2;
        g_out = realloc(g_out, g_cap);
        if (!g_out) die("out of memory");
    }
    memcpy(g_out + g_len, p, n);
    g_len += n;
}
static void out_s(const char *p) { out_n(p, strlen(p)); }
static void out_c(char c) { out_n(&c, 1); }
static void out_f(const char *fmt, ...) {
    char b[2048];
    va_list ap;
    va_start(ap, fmt);
    int l = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (l < 0 || (size_t)l >= sizeof b) die("output line too long");
    out_n(b, (size_t)l);
}

/* Takes the kernel expression (a name, possibly qualified, possibly with template arguments)
 * off the end of the output and returns it in k. */
static void take_kernel(char *k, size_t cap, int line) {
    size_t e = g_len;
    while (e > 0 && (g_out[e - 1] == ' ' || g_out[e - 1] == '\t')) e--;
    size_t b = e;
    if (b > 0 && g_out[b - 1] == '>') {
        int depth = 0;
        while (b > 0) {
            char c = g_out[b - 1];
            if (c == '>') depth++;
            if (c == '<') depth--;
            b--;
            if (depth == 0) break;
        }
        if (depth != 0) die("line %d: unbalanced template arguments before <<<", line);
    }
    while (b > 0 && (is_id(g_out[b - 1]) || g_out[b - 1] == ':')) b--;
    if (b == e || e - b >= cap) die("line %d: cannot find the kernel before <<<", line);
    memcpy(k, g_out + b, e - b);
    k[e - b] = 0;
    g_len = b;
}


static int word_at(const char *s, size_t i, size_t n, const char *w) {
    size_t l = strlen(w);
    if (i + l > n || strncmp(s + i, w, l) != 0) return 0;
    if (i > 0 && is_id(s[i - 1])) return 0;
    return i + l == n || !is_id(s[i + l]);
}

static int line_of(const char *s, size_t i) {
    int line = 1;
    for (size_t k = 0; k < i; k++) line += s[k] == '\n';
    return line;
}

/* Trims spaces (and line continuations) from both ends of s[a, b) into out. */
static void trim_copy(const char *s, size_t a, size_t b, char *out, size_t cap) {
    while (a < b && (isspace((unsigned char)s[a]) || s[a] == '\\')) a++;
    while (b > a && (isspace((unsigned char)s[b - 1]) || s[b - 1] == '\\')) b--;
    if (b - a >= cap) die("declaration too long");
    memcpy(out, s + a, b - a);
    out[b - a] = 0;
}

/* Rewrites one declarator "name[dims]" of a __shared__ declaration of type `type`. */
static void emit_shared_decl(const char *type, const char *decl, int line) {
    const char *br = strchr(decl, '[');
    char name[256], dims[512];
    size_t nl = br ? (size_t)(br - decl) : strlen(decl);
    while (nl > 0 && isspace((unsigned char)decl[nl - 1])) nl--;
    if (nl == 0 || nl >= sizeof name) die("line %d: cannot parse __shared__ declarator '%s'", line, decl);
    memcpy(name, decl, nl);
    name[nl] = 0;
    for (size_t k = 0; k < nl; k++)
        if (!is_id(name[k])) die("line %d: __shared__ declarator '%s' is not name[dims]", line, decl);
    snprintf(dims, sizeof dims, "%s", br ? br : "");
    if (strchr(dims, '=')) die("line %d: __shared__ variables cannot have initializers", line);
    out_f("%s (&%s)%s = MR_EMU_SHARED(%s%s, __FILE__, %d); ", type, name, dims, type, dims, line);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: emu_rewrite IN.cu OUT.cc KERNELS.txt\n");
        return 2;
    }
    g_in = argv[1];
    size_t n;
    char *s = read_all(argv[1], &n);
    FILE *o = fopen(argv[2], "wb");
    FILE *k = fopen(argv[3], "wb");
    if (!o || !k) die("cannot write the outputs");
    out_f("#line 1 \"%s\"\n", argv[1]);
    int launches = 0, kernels = 0, pending_global = 0;
    size_t global_at = 0;
    char kernel_name[256] = "";
    int paren = 0;
    for (size_t i = 0; i < n;) {
        size_t sk = skip_len(s, i, n);
        if (sk) {
            out_n(s + i, sk);
            i += sk;
            continue;
        }
        if (strncmp(s + i, "<<<", 3) == 0) {
            char kern[512];
            take_kernel(kern, sizeof kern, line_of(s, i));
            out_f("::mr_emu_k::launch_at([=](auto... mr_a_) { %s(mr_a_...); }, ::mr_emu_k::cfg(__FILE__, __LINE__, ", kern);
            i += 3;
            launches++;
            continue;
        }
        if (strncmp(s + i, ">>>", 3) == 0) {
            out_s(")) ^ ::mr_emu_k::pack");
            i += 3;
            continue;
        }
        if (word_at(s, i, n, "extern")) {
            size_t j = i + 6;
            while (j < n && isspace((unsigned char)s[j])) j++;
            if (word_at(s, j, n, "__shared__")) {
                size_t e = j;
                while (e < n && s[e] != ';') e++;
                char decl[512], type[256];
                trim_copy(s, j + 10, e, decl, sizeof decl);
                char *br = strchr(decl, '[');
                if (!br || strcmp(br, "[]") != 0) die("line %d: extern __shared__ must be 'T name[]'", line_of(s, i));
                *br = 0;
                char *nm = br;
                while (nm > decl && is_id(nm[-1])) nm--;
                snprintf(type, sizeof type, "%.*s", (int)(nm - decl), decl);
                out_f("%s *%s = (%s *)::mr_emu_k::dyn_shared()", type, nm, type);
                for (size_t q = i; q < e; q++)
                    if (s[q] == '\n') out_c('\n');
                i = e;
                continue;
            }
        }
        if (word_at(s, i, n, "__shared__")) {
            int line = line_of(s, i);
            size_t e = i + 10;
            while (e < n && s[e] != ';') e++;
            if (e >= n) die("line %d: unterminated __shared__ declaration", line);
            char all[1024];
            trim_copy(s, i + 10, e, all, sizeof all);
            /* the type is what precedes the first declarator's name */
            char *br = strchr(all, '[');
            char *end = br ? br : all + strlen(all);
            while (end > all && isspace((unsigned char)end[-1])) end--;
            char *nm = end;
            while (nm > all && is_id(nm[-1])) nm--;
            if (nm == all) die("line %d: cannot find the type of a __shared__ declaration", line);
            char type[256];
            snprintf(type, sizeof type, "%.*s", (int)(nm - all), all);
            for (char *t = type + strlen(type); t > type && isspace((unsigned char)t[-1]); t--) t[-1] = 0;
            char *p = nm;
            while (*p) {
                char decl[512];
                size_t dl = 0;
                int depth = 0;
                while (*p && (depth > 0 || *p != ',')) {
                    if (*p == '[' || *p == '(') depth++;
                    if (*p == ']' || *p == ')') depth--;
                    if (dl + 1 >= sizeof decl) die("line %d: declarator too long", line);
                    decl[dl++] = *p++;
                }
                decl[dl] = 0;
                if (*p == ',') p++;
                while (isspace((unsigned char)*p)) p++;
                char t[512];
                trim_copy(decl, 0, dl, t, sizeof t);
                emit_shared_decl(type, t, line);
            }
            for (size_t q = i; q < e; q++)
                if (s[q] == '\n') out_c('\n');
            i = e + 1; /* the ';' was emitted per declarator */
            continue;
        }
        if (word_at(s, i, n, "__global__")) {
            pending_global = 1;
            global_at = i;
            kernel_name[0] = 0;
            paren = 0;
        }
        if (pending_global) {
            char c = s[i];
            if (c == '(') {
                if (paren == 0 && !kernel_name[0]) {
                    size_t b = i;
                    while (b > 0 && isspace((unsigned char)s[b - 1])) b--;
                    size_t a = b;
                    while (a > 0 && is_id(s[a - 1])) a--;
                    if (b - a < sizeof kernel_name && strncmp(s + a, "__launch_bounds__", b - a) != 0)
                        snprintf(kernel_name, sizeof kernel_name, "%.*s", (int)(b - a), s + a);
                }
                paren++;
            } else if (c == ')') {
                paren--;
            } else if (c == ';' && paren == 0) {
                pending_global = 0; /* a declaration */
            } else if (c == '{' && paren == 0) {
                int line = line_of(s, global_at);
                if (!kernel_name[0]) die("line %d: cannot find the name of a __global__ function", line);
                out_f("{ MR_EMU_KERNEL_ENTRY(%d);", line);
                fprintf(k, "%s:%d %s\n", argv[1], line, kernel_name);
                kernels++;
                pending_global = 0;
                i++;
                continue;
            }
        }
        out_c(s[i]);
        i++;
    }
    if (fwrite(g_out, 1, g_len, o) != g_len || fclose(o) != 0 || fclose(k) != 0) die("cannot write the outputs");
    (void)launches;
    (void)kernels;
    free(s);
    return 0;
}
