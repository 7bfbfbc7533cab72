/* warmlist.c - warmup lists: the file EMBER_RECORD (and em_compiled_save)
 * append captured graphs to, and ember-cache warmup reads.
 *
 * The file is a sequence of records, each
 *
 *   ember-record 1 backend=<name> name=<function name>
 *   guard ...              (zero or more: the entry's guards, for people;
 *                           "dynamic=[d, ...]" on an input's line marks the
 *                           dims of a dynamic entry, which warmup reads)
 *   follow %N ...          (zero or more: a dynamic entry's attributes that
 *                           follow its dynamic sizes, jit_sym_print's form)
 *   graph(...) {           the graph's text form, up to its closing "}"
 *     ...
 *   }
 *
 * A record is appended with one write under an exclusive flock, so several
 * processes may record into one file.  Reading is strict about the record
 * line and lenient elsewhere: blank lines and lines starting with '#'
 * between records are skipped; a malformed record is an error naming its
 * line. */
#include "jit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define RECORD_MAGIC "ember-record 1 "

/* Names go on the record line: anything but [A-Za-z0-9_.-] becomes '_'. */
static void print_token(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        fputc(ok ? c : '_', f);
    }
}

em_status jit_record_append(const char *path, const char *name, const char *backend,
                            const tr_graph *g, const gd_guards *guards, const jit_dyn *follow) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return em_error(EM_ERR_NOMEM, "recording %s: out of memory", name);
    fprintf(f, RECORD_MAGIC "backend=");
    print_token(f, backend);
    fprintf(f, " name=");
    print_token(f, name);
    fputc('\n', f);
    if (guards) gd_print(guards, f);
    for (int i = 0; follow && guards && gd_is_dynamic(guards) && i < follow->nsizes; i++)
        jit_sym_print(&follow->sizes[i], f);
    em_status s = tr_print(g, f);
    if (fclose(f) != 0 || !text) s = em_error(EM_ERR_NOMEM, "recording %s: out of memory", name);
    if (s != EM_OK) {
        free(text);
        return s;
    }
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        s = em_error(EM_ERR_IO, "recording %s: cannot open %s: %s", name, path, strerror(errno));
    } else {
        (void)flock(fd, LOCK_EX); /* one record at a time, whole */
        if (!kc_write_all(fd, text, len))
            s = em_error(EM_ERR_IO, "recording %s: cannot write %s: %s", name, path, strerror(errno));
        (void)flock(fd, LOCK_UN);
        if (close(fd) != 0 && s == EM_OK)
            s = em_error(EM_ERR_IO, "recording %s: cannot write %s: %s", name, path, strerror(errno));
    }
    free(text);
    return s;
}

/* ---- reading ---- */

static char *read_text(const char *path, size_t *n) {
    /* O_NONBLOCK: a FIFO without a writer is refused below instead of
     * blocking the open (reads of a regular file ignore the flag). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        em_error(EM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        em_error(EM_ERR_IO, "%s is not a regular file", path);
    } else if ((buf = em_malloc((size_t)st.st_size + 1))) {
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        buf[got] = '\0';
        *n = got;
        if (strlen(buf) != got) {
            em_error(EM_ERR_ARG, "%s is not a warmup list (it holds a NUL byte)", path);
            em_free(buf);
            buf = NULL;
        }
    }
    close(fd);
    return buf;
}

/* The value of "key=" in the record line [p, end), copied. */
static char *field(const char *p, const char *end, const char *key) {
    size_t kn = strlen(key);
    for (const char *q = p; q + kn < end; q++) {
        if ((q == p || q[-1] == ' ') && !strncmp(q, key, kn) && q[kn] == '=') {
            const char *v = q + kn + 1, *e = v;
            while (e < end && *e != ' ') e++;
            if (e == v) return NULL;
            char *out = em_malloc((size_t)(e - v) + 1);
            if (out) {
                memcpy(out, v, (size_t)(e - v));
                out[e - v] = '\0';
            }
            return out;
        }
    }
    return NULL;
}

static bool push(jit_record **rs, int *n, int *cap, const jit_record *r) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        jit_record *nr = em_malloc(sizeof *nr * (size_t)nc);
        if (!nr) return false;
        if (*n) memcpy(nr, *rs, sizeof *nr * (size_t)*n);
        em_free(*rs);
        *rs = nr;
        *cap = nc;
    }
    (*rs)[(*n)++] = *r;
    return true;
}

static void record_clear(jit_record *r) {
    em_free(r->div);
    em_free(r->follow);
    em_free(r->dyn);
    em_free(r->name);
    em_free(r->backend);
    em_free(r->graph);
}

/* Reads a guard line [p, end)'s dynamic dims into r: "guard input I
 * (name): ... dynamic=[0, 2] (>= 2)" (gd_print).  false: out of memory. */
static bool guard_dynamic(const char *p, const char *end, jit_record *r) {
    if (strncmp(p, "guard input ", 12)) return true;
    char *stop;
    long i = strtol(p + 12, &stop, 10);
    const char *d = memmem(p, (size_t)(end - p), " dynamic=[", 10);
    if (stop == p + 12 || i < 0 || i >= 64 || !d) return true; /* for people only */
    if (i >= r->ndyn) {
        uint32_t *m = em_calloc((size_t)i + 1, sizeof *m);
        if (!m) return false;
        if (r->dyn) memcpy(m, r->dyn, sizeof *m * (size_t)r->ndyn);
        em_free(r->dyn);
        r->dyn = m;
        r->ndyn = (int)i + 1;
    }
    for (const char *q = d + 10; q < end && *q != ']';) {
        long dim = strtol(q, &stop, 10);
        if (stop == q) break;
        if (dim >= 0 && dim < EM_MAX_DIMS) r->dyn[i] |= 1u << dim;
        q = stop;
        while (q < end && (*q == ',' || *q == ' ')) q++;
    }
    /* " divisible=D:Q" after it, once per dim with a divisor */
    for (const char *q = d; (q = memmem(q, (size_t)(end - q), " divisible=", 11)) != NULL;) {
        q += 11;
        long dim = strtol(q, &stop, 10);
        long long div = *stop == ':' ? strtoll(stop + 1, &stop, 10) : 0;
        if (dim < 0 || dim >= EM_MAX_DIMS || div < 2) continue;
        struct jit_record_div *v = em_malloc(sizeof *v * ((size_t)r->ndiv + 1));
        if (!v) return false;
        if (r->div) memcpy(v, r->div, sizeof *v * (size_t)r->ndiv);
        em_free(r->div);
        r->div = v;
        r->div[r->ndiv++] = (struct jit_record_div){(int)i, (int)dim, div};
    }
    return true;
}

/* Reads a follow line [p, end) into r; false (error set) when malformed
 * or out of memory. */
static bool follow_line(const char *path, int line, const char *p, const char *end, jit_record *r) {
    char buf[256];
    size_t len = (size_t)(end - p) < sizeof buf ? (size_t)(end - p) : sizeof buf - 1;
    memcpy(buf, p, len);
    buf[len] = '\0';
    jit_sym_size z;
    if (!jit_sym_parse(buf, &z) || r->nfollow == JIT_MAX_SYM_SIZES) {
        em_error(EM_ERR_ARG, "%s:%d: malformed follow line", path, line);
        return false;
    }
    jit_sym_size *f = em_malloc(sizeof *f * ((size_t)r->nfollow + 1));
    if (!f) return false;
    if (r->follow) memcpy(f, r->follow, sizeof *f * (size_t)r->nfollow);
    em_free(r->follow);
    r->follow = f;
    r->follow[r->nfollow++] = z;
    return true;
}

/* One record starting at the record line p; *next gets where the next
 * line after it starts.  NULL fields on failure (error set). */
static bool parse_record(const char *path, int line, const char *p, const char **next,
                         int *lines, jit_record *r) {
    memset(r, 0, sizeof *r);
    const char *eol = strchr(p, '\n');
    if (!eol) eol = p + strlen(p);
    r->backend = field(p, eol, "backend");
    r->name = field(p, eol, "name");
    if (!r->backend || !r->name) {
        record_clear(r);
        em_error(EM_ERR_ARG, "%s:%d: a record line needs backend= and name=", path, line);
        return false;
    }
    const char *q = *eol ? eol + 1 : eol;
    int n = 1;
    while (!strncmp(q, "guard ", 6) || !strncmp(q, "follow ", 7)) { /* the guards are for people */
        const char *e = strchr(q, '\n');
        bool ok = q[0] == 'g' ? guard_dynamic(q, e ? e : q + strlen(q), r)
                              : follow_line(path, line + n, q, e ? e : q + strlen(q), r);
        if (!ok) {
            record_clear(r);
            return false;
        }
        q = e ? e + 1 : q + strlen(q);
        n++;
    }
    const char *start = q, *end = NULL;
    while (*q) { /* the graph ends at a line that is exactly "}" */
        const char *e = strchr(q, '\n');
        size_t len = e ? (size_t)(e - q) : strlen(q);
        n++;
        if (len == 1 && q[0] == '}') {
            end = q + 1;
            q = e ? e + 1 : q + 1;
            break;
        }
        q = e ? e + 1 : q + len;
    }
    if (!end || strncmp(start, "graph(", 6) != 0) {
        em_error(EM_ERR_ARG, "%s:%d: the record of %s has no complete graph", path, line, r->name);
        record_clear(r);
        return false;
    }
    r->graph = em_malloc((size_t)(end - start) + 2);
    if (!r->graph) {
        record_clear(r);
        return false;
    }
    memcpy(r->graph, start, (size_t)(end - start));
    r->graph[end - start] = '\n';
    r->graph[end - start + 1] = '\0';
    *next = q;
    *lines = n;
    return true;
}

em_status jit_records_read(const char *path, jit_record **out, int *nout) {
    *out = NULL;
    *nout = 0;
    size_t size;
    char *text = read_text(path, &size);
    if (!text) return em_last_status();
    jit_record *rs = NULL;
    int n = 0, cap = 0, line = 1;
    em_status s = EM_OK;
    for (const char *p = text; *p && s == EM_OK;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len == 0 || p[0] == '#') {
            p += len + (eol ? 1 : 0);
            line++;
            continue;
        }
        if (len < strlen(RECORD_MAGIC) || strncmp(p, RECORD_MAGIC, strlen(RECORD_MAGIC)) != 0) {
            s = em_error(EM_ERR_ARG, "%s:%d: expected a record line ('ember-record 1 ...')", path,
                         line);
            break;
        }
        jit_record r;
        int lines;
        if (!parse_record(path, line, p, &p, &lines, &r)) {
            s = em_last_status() ? em_last_status() : EM_ERR_ARG;
            break;
        }
        if (!push(&rs, &n, &cap, &r)) {
            record_clear(&r);
            s = em_last_status();
        }
        line += lines;
    }
    em_free(text);
    if (s != EM_OK) {
        jit_records_free(rs, n);
        return s;
    }
    *out = rs;
    *nout = n;
    return EM_OK;
}

void jit_records_free(jit_record *rs, int n) {
    for (int i = 0; rs && i < n; i++) record_clear(&rs[i]);
    em_free(rs);
}
