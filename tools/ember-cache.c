/* ember-cache - look after Ember's compiled-artifact cache: warm it from
 * recorded graphs, list, check, prune, clear, and move it between machines
 * as one bundle file.  `ember-cache --help` and docs/cache.md describe
 * every command. */
#include "config.h"

#include "cache.h"
#include "jit.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char USAGE[] =
    "usage: ember-cache [--dir DIR] [--json] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  warmup [-j N] FILE...   compile every graph recorded in the warmup lists FILE...\n"
    "                          (EMBER_RECORD=FILE or em_compiled_save) into the cache,\n"
    "                          in N worker processes (default: one per core)\n"
    "  ls                      list the entries: key, kind, backend, size, age, last use\n"
    "  stats                   entry counts and sizes by kind\n"
    "  verify [--remove]       check every entry's header and checksum; report bad\n"
    "                          entries (exit 1), and with --remove delete them\n"
    "  prune --max-size SIZE   remove least recently used entries until the cache holds\n"
    "                          at most SIZE (500M, 2G, bytes)\n"
    "  prune --older-than AGE  remove entries not used for AGE (90s, 30m, 12h, 7d, 2w)\n"
    "  clear                   remove every entry\n"
    "  export FILE             write every good entry into one portable bundle FILE\n"
    "  import FILE             add a bundle's entries; refused when it was made for\n"
    "                          another compiler, code generator or CPU target\n"
    "  help                    this text\n"
    "\n"
    "Options:\n"
    "  --dir DIR   the cache directory (default: EMBER_CACHE_DIR, else\n"
    "              $XDG_CACHE_HOME/ember, else ~/.cache/ember)\n"
    "  --json      machine-readable output on stdout\n"
    "\n"
    "Exit status: 0 success, 1 a command failed (or found bad entries), 2 usage.\n";

typedef struct tool {
    const char *dir;
    bool json;
    kc_cache *cache;
} tool;

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "ember-cache: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(ember-cache --help lists the commands)\n");
    return 2;
}

static int fail(const char *what) {
    fprintf(stderr, "ember-cache: %s: %s\n", what, em_last_error());
    return 1;
}

/* Opens the cache; the trust checks say why a directory is refused. */
static bool open_cache(tool *t) {
    char why[600] = "";
    kc_options o = {.dir = t->dir};
    t->cache = kc_open_with(&o);
    if (!t->cache) return fail("cannot open the cache") == 0;
    if (!kc_on_disk(t->cache)) {
        const char *off = getenv("EMBER_CACHE");
        snprintf(why, sizeof why, "%s", off && !strcmp(off, "0")
                 ? "EMBER_CACHE=0 turns the disk cache off"
                 : "the cache directory is not usable (see the message above)");
        fprintf(stderr, "ember-cache: %s\n", why);
        return false;
    }
    return true;
}

/* The versions this machine's artifacts are made for: a bundle must carry
 * the same ones. */
static int machine_tags(char tags[][256], const char **ptrs) {
    int n = 0;
    snprintf(tags[n++], 256, "cache-format=%u", KC_FORMAT_VERSION);
    const char *names[] = {"cpu"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *target = jit_backend_target(jit_backend_find(names[i]));
        if (target) snprintf(tags[n++], 256, "%s=%s", names[i], target);
    }
    for (int i = 0; i < n; i++) ptrs[i] = tags[i];
    return n;
}

/* ---- small formatting helpers ---- */

static const char *human_size(uint64_t b, char *buf, size_t n) {
    const char *units = "BKMGT";
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, n, "%" PRIu64 "B", b);
    else snprintf(buf, n, "%.1f%c", v, units[u]);
    return buf;
}

static const char *human_age(int64_t seconds, char *buf, size_t n) {
    if (seconds < 0) seconds = 0;
    if (seconds < 120) snprintf(buf, n, "%" PRId64 "s", seconds);
    else if (seconds < 7200) snprintf(buf, n, "%" PRId64 "m", seconds / 60);
    else if (seconds < 172800) snprintf(buf, n, "%" PRId64 "h", seconds / 3600);
    else snprintf(buf, n, "%" PRId64 "d", seconds / 86400);
    return buf;
}

/* "90s", "30m", "12h", "7d", "2w", or plain seconds. */
static bool parse_age(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0) return false;
    int64_t mul = 1;
    if (*end) {
        if (end[1]) return false;
        switch (*end) {
        case 's': mul = 1; break;
        case 'm': mul = 60; break;
        case 'h': mul = 3600; break;
        case 'd': mul = 86400; break;
        case 'w': mul = 604800; break;
        default: return false;
        }
    }
    if (v > INT64_MAX / mul) return false;
    *out = (int64_t)v * mul;
    return true;
}

static const char *backend_of(const char *kind) {
    if (!strcmp(kind, "so")) return "cpu";
    if (!strcmp(kind, "plan")) return "graph";
    if (!strcmp(kind, "ptx") || !strcmp(kind, "cubin")) return "cuda";
    return "-";
}

/* ---- ls, stats ---- */

static int cmd_ls(tool *t) {
    kc_entry_info *es;
    size_t n;
    if (kc_list(t->cache, &es, &n) != EM_OK) return fail("ls");
    int64_t now = (int64_t)time(NULL);
    if (t->json) printf("[");
    else if (n) printf("%-32s  %-5s  %-7s  %9s  %6s  %8s\n", "KEY", "KIND", "BACKEND", "SIZE", "AGE", "LAST USE");
    for (size_t i = 0; i < n; i++) {
        const kc_entry_info *e = &es[i];
        char hex[KC_KEY_HEX_SIZE], sz[32], age[32], used[32];
        kc_key_hex(&e->key, hex);
        if (t->json) {
            printf("%s\n {\"key\":\"%s\",\"kind\":\"%s\",\"backend\":\"%s\",\"size\":%" PRIu64
                   ",\"disk_bytes\":%" PRIu64 ",\"created\":%" PRId64 ",\"last_use\":%" PRId64
                   ",\"complete\":%s}",
                   i ? "," : "", hex, e->kind, backend_of(e->kind), e->size, e->disk_bytes,
                   e->created, e->last_use, e->has_header ? "true" : "false");
        } else {
            printf("%-32s  %-5s  %-7s  %9s  %6s  %7s%s\n", hex, e->kind, backend_of(e->kind),
                   human_size(e->disk_bytes, sz, sizeof sz),
                   e->created ? human_age(now - e->created, age, sizeof age) : "?",
                   human_age(now - e->last_use, used, sizeof used),
                   e->has_header ? " ago" : " ago (incomplete)");
        }
    }
    if (t->json) printf("%s]\n", n ? "\n" : "");
    else if (!n) printf("the cache at %s is empty\n", kc_dir(t->cache));
    em_free(es);
    return 0;
}

typedef struct kind_count {
    char kind[KC_KIND_MAX + 1];
    uint64_t n, bytes;
} kind_count;

static int cmd_stats(tool *t) {
    kc_entry_info *es;
    size_t n;
    if (kc_list(t->cache, &es, &n) != EM_OK) return fail("stats");
    kind_count kinds[16];
    int nk = 0;
    uint64_t total = 0, incomplete = 0;
    for (size_t i = 0; i < n; i++) {
        int k = 0;
        while (k < nk && strcmp(kinds[k].kind, es[i].kind)) k++;
        if (k == nk && nk < 16) {
            memset(&kinds[nk], 0, sizeof kinds[nk]);
            memcpy(kinds[nk++].kind, es[i].kind, sizeof kinds[0].kind);
        }
        if (k < nk) {
            kinds[k].n++;
            kinds[k].bytes += es[i].disk_bytes;
        }
        total += es[i].disk_bytes;
        incomplete += !es[i].has_header;
    }
    char sz[32];
    if (t->json) {
        printf("{\"dir\":\"%s\",\"entries\":%zu,\"bytes\":%" PRIu64 ",\"incomplete\":%" PRIu64
               ",\"hits\":null,\"kinds\":{", kc_dir(t->cache), n, total, incomplete);
        for (int k = 0; k < nk; k++)
            printf("%s\"%s\":{\"entries\":%" PRIu64 ",\"bytes\":%" PRIu64 "}", k ? "," : "",
                   kinds[k].kind, kinds[k].n, kinds[k].bytes);
        printf("}}\n");
    } else {
        printf("cache %s: %zu entries, %s\n", kc_dir(t->cache), n, human_size(total, sz, sizeof sz));
        for (int k = 0; k < nk; k++)
            printf("  %-6s %-7s %6" PRIu64 " entries  %9s\n", kinds[k].kind,
                   backend_of(kinds[k].kind), kinds[k].n, human_size(kinds[k].bytes, sz, sizeof sz));
        if (incomplete) printf("  %" PRIu64 " incomplete entries (ember-cache verify --remove)\n", incomplete);
        printf("  hits: counted per process (EMBER_LOG=cache), not kept on disk\n");
    }
    em_free(es);
    return 0;
}

/* ---- verify, prune, clear ---- */

static int cmd_verify(tool *t, bool remove) {
    kc_entry_info *es;
    size_t n;
    if (kc_list(t->cache, &es, &n) != EM_OK) return fail("verify");
    uint64_t bad = 0, removed = 0;
    if (t->json) printf("{\"bad\":[");
    for (size_t i = 0; i < n; i++) {
        char why[1024], hex[KC_KEY_HEX_SIZE];
        kc_read r = kc_verify(t->cache, &es[i], why, sizeof why);
        if (r == KC_READ_OK) continue;
        kc_key_hex(&es[i].key, hex);
        bool gone = remove && kc_remove(t->cache, &es[i].key, es[i].kind) == EM_OK;
        removed += gone;
        if (t->json)
            printf("%s{\"key\":\"%s\",\"kind\":\"%s\",\"problem\":\"%s\",\"removed\":%s}",
                   bad ? "," : "", hex, es[i].kind,
                   r == KC_READ_REFUSED ? "untrusted" : r == KC_READ_NOMEM ? "out of memory" : "corrupt",
                   gone ? "true" : "false");
        else
            printf("bad: %s.%s: %s%s\n", hex, es[i].kind, why[0] ? why : "unreadable",
                   gone ? " (removed)" : "");
        bad++;
    }
    if (t->json)
        printf("],\"entries\":%zu,\"good\":%" PRIu64 ",\"removed\":%" PRIu64 "}\n", n, n - bad, removed);
    else
        printf("verify: %zu entries: %" PRIu64 " good, %" PRIu64 " bad%s\n", n, n - bad, bad,
               remove ? (removed == bad ? ", all removed" : ", not all could be removed") : "");
    em_free(es);
    return bad && (!remove || removed != bad) ? 1 : 0;
}

static int print_removed(tool *t, const char *what, uint64_t removed) {
    if (t->json) printf("{\"removed\":%" PRIu64 "}\n", removed);
    else printf("%s: removed %" PRIu64 " entries\n", what, removed);
    return 0;
}

static int cmd_prune(tool *t, int argc, char **argv) {
    if (argc != 2) return usage_error("prune takes --max-size SIZE or --older-than AGE%s", "");
    uint64_t removed = 0;
    if (!strcmp(argv[0], "--max-size")) {
        uint64_t max;
        if (kc_parse_size(argv[1], &max) != EM_OK) return usage_error("bad size '%s'", argv[1]);
        kc_entry_info *es;
        size_t before = 0, after = 0;
        if (kc_list(t->cache, &es, &before) != EM_OK) return fail("prune");
        em_free(es);
        if (kc_prune(t->cache, max) != EM_OK) return fail("prune");
        if (kc_list(t->cache, &es, &after) != EM_OK) return fail("prune");
        em_free(es);
        removed = before > after ? before - after : 0;
    } else if (!strcmp(argv[0], "--older-than")) {
        int64_t age;
        if (!parse_age(argv[1], &age)) return usage_error("bad age '%s' (e.g. 90s, 30m, 12h, 7d, 2w)", argv[1]);
        if (kc_prune_older(t->cache, age, &removed) != EM_OK) return fail("prune");
    } else {
        return usage_error("prune: unknown option '%s'", argv[0]);
    }
    return print_removed(t, "prune", removed);
}

static int cmd_clear(tool *t) {
    uint64_t removed;
    if (kc_clear(t->cache, &removed) != EM_OK) return fail("clear");
    return print_removed(t, "clear", removed);
}

/* ---- export, import ---- */

static int cmd_export(tool *t, const char *path) {
    char tags[8][256];
    const char *ptrs[8];
    int nt = machine_tags(tags, ptrs);
    uint64_t done, skipped;
    if (kc_export(t->cache, path, ptrs, nt, &done, &skipped) != EM_OK) return fail("export");
    if (t->json)
        printf("{\"file\":\"%s\",\"exported\":%" PRIu64 ",\"skipped\":%" PRIu64 "}\n", path, done, skipped);
    else
        printf("export: %" PRIu64 " entries to %s%s\n", done, path,
               skipped ? " (bad entries skipped: ember-cache verify)" : "");
    return 0;
}

static int cmd_import(tool *t, const char *path) {
    char tags[8][256];
    const char *ptrs[8];
    int nt = machine_tags(tags, ptrs);
    uint64_t done;
    if (kc_import(t->cache, path, ptrs, nt, &done) != EM_OK) return fail("import");
    if (t->json) printf("{\"file\":\"%s\",\"imported\":%" PRIu64 "}\n", path, done);
    else printf("import: %" PRIu64 " entries from %s\n", done, path);
    return 0;
}

/* ---- warmup ---- */

typedef struct warm_set {
    jit_record *rs; /* every record of every file */
    int n, nrecords;
    int *todo;      /* distinct graphs: indices into rs */
    int ntodo;
    int counts[3];  /* by jit_warm_result */
} warm_set;

static bool same_graph(const jit_record *a, const jit_record *b) {
    /* a dynamic entry's kernels differ from the static one's of its graph */
    return !strcmp(a->backend, b->backend) && !strcmp(a->graph, b->graph) && a->ndyn == b->ndyn &&
           (!a->ndyn || !memcmp(a->dyn, b->dyn, sizeof *a->dyn * (size_t)a->ndyn));
}

static bool load_lists(warm_set *w, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        jit_record *rs;
        int n;
        if (jit_records_read(argv[i], &rs, &n) != EM_OK) return fail("warmup") == 0;
        jit_record *all = em_malloc(sizeof *all * (size_t)(w->n + n + 1));
        if (!all) return false;
        if (w->n) memcpy(all, w->rs, sizeof *all * (size_t)w->n);
        if (n) memcpy(all + w->n, rs, sizeof *all * (size_t)n);
        em_free(rs); /* the strings moved to all */
        em_free(w->rs);
        w->rs = all;
        w->n += n;
    }
    w->todo = em_malloc(sizeof(int) * (size_t)(w->n + 1));
    if (!w->todo) return false;
    for (int i = 0; i < w->n; i++) { /* one compile per distinct graph */
        int j = 0;
        while (j < w->ntodo && !same_graph(&w->rs[w->todo[j]], &w->rs[i])) j++;
        if (j == w->ntodo) w->todo[w->ntodo++] = i;
    }
    return true;
}

static void progress(const tool *t, const warm_set *w, int done) {
    if (t->json || !isatty(STDERR_FILENO)) return;
    int width = 30, fill = w->ntodo ? done * width / w->ntodo : width;
    fprintf(stderr, "\r[%.*s%*s] %d/%d graphs", fill, "##############################",
            width - fill, "", done, w->ntodo);
    if (done == w->ntodo) fputc('\n', stderr);
    fflush(stderr);
}

static void report(const tool *t, warm_set *w, int idx, int result, const char *why) {
    w->counts[result]++;
    if (result == JIT_WARM_FAILED && !t->json) {
        if (isatty(STDERR_FILENO)) fputc('\n', stderr);
        fprintf(stderr, "ember-cache: warmup of %s failed: %s\n", w->rs[w->todo[idx]].name, why);
    }
}

/* A worker process: warms graphs k, k+nw, ... and writes one line per
 * graph ("<index> <result> <why>") to fd. */
static void worker(const tool *t, const warm_set *w, int k, int nw, int fd) {
    setenv("EMBER_NUM_THREADS", "1", 1); /* the parallelism is the workers */
    kc_options o = {.dir = t->dir};
    kc_cache *c = kc_open_with(&o);
    for (int i = k; i < w->ntodo; i += nw) {
        char why[400] = "no cache";
        int r = c ? (int)jit_warmup(&w->rs[w->todo[i]], c, why, sizeof why) : JIT_WARM_FAILED;
        for (char *p = why; *p; p++)
            if (*p == '\n') *p = ' ';
        dprintf(fd, "%d %d %s\n", i, r, why);
    }
    kc_close(c);
    close(fd);
    _exit(0);
}

/* Reads result lines from the workers' pipes until all close. */
static void collect(const tool *t, warm_set *w, int *fds, int nw, bool *seen) {
    char *bufs[64] = {0};
    size_t lens[64] = {0};
    int open_fds = nw, done = 0;
    while (open_fds > 0) {
        struct pollfd p[64];
        for (int i = 0; i < nw; i++) p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        if (poll(p, (nfds_t)nw, -1) < 0 && errno != EINTR) break;
        for (int i = 0; i < nw; i++) {
            if (fds[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP))) continue;
            char chunk[4096];
            ssize_t r = read(fds[i], chunk, sizeof chunk);
            if (r <= 0) {
                close(fds[i]);
                fds[i] = -1;
                open_fds--;
                continue;
            }
            char *nb = realloc(bufs[i], lens[i] + (size_t)r + 1);
            if (!nb) continue;
            bufs[i] = nb;
            memcpy(bufs[i] + lens[i], chunk, (size_t)r);
            lens[i] += (size_t)r;
            bufs[i][lens[i]] = '\0';
            char *line = bufs[i], *nl;
            while ((nl = strchr(line, '\n'))) {
                *nl = '\0';
                int idx, res, off = 0;
                if (sscanf(line, "%d %d %n", &idx, &res, &off) >= 2 && idx >= 0 && idx < w->ntodo &&
                    res >= 0 && res <= JIT_WARM_FAILED && !seen[idx]) {
                    seen[idx] = true;
                    report(t, w, idx, res, line + off);
                    progress(t, w, ++done);
                }
                line = nl + 1;
            }
            lens[i] = strlen(line);
            memmove(bufs[i], line, lens[i] + 1);
        }
    }
    for (int i = 0; i < nw; i++) free(bufs[i]);
}

static int run_workers(const tool *t, warm_set *w, int nw) {
    int fds[64];
    pid_t pids[64];
    fflush(NULL);
    int started = 0;
    for (int k = 0; k < nw; k++) {
        int p[2];
        if (pipe(p) != 0) break;
        pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            for (int j = 0; j < started; j++) close(fds[j]);
            worker(t, w, k, nw, p[1]);
        }
        close(p[1]);
        if (pid < 0) {
            close(p[0]);
            break;
        }
        fds[started] = p[0];
        pids[started++] = pid;
    }
    if (started < nw) { /* fewer workers: the missing ones' graphs fail below */
        fprintf(stderr, "ember-cache: could start only %d of %d workers\n", started, nw);
    }
    bool *seen = calloc((size_t)w->ntodo + 1, 1); /* after the forks: the workers need none */
    if (seen) collect(t, w, fds, started, seen);
    for (int k = 0; !seen && k < started; k++) close(fds[k]);
    for (int k = 0; k < started; k++) waitpid(pids[k], NULL, 0);
    if (!seen) return fail("warmup");
    for (int i = 0; i < w->ntodo; i++)
        if (!seen[i]) report(t, w, i, JIT_WARM_FAILED, "its worker process died or never started");
    free(seen);
    return 0;
}

static int cmd_warmup(tool *t, int argc, char **argv) {
    int jobs = 0;
    if (argc >= 2 && !strcmp(argv[0], "-j")) {
        char *end;
        long v = strtol(argv[1], &end, 10);
        if (*end || v < 1 || v > 64) return usage_error("-j takes a count from 1 to 64, not '%s'", argv[1]);
        jobs = (int)v;
        argc -= 2;
        argv += 2;
    }
    if (argc < 1) return usage_error("warmup needs at least one recorded file%s", "");
    warm_set w = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = load_lists(&w, argc, argv) ? 0 : 1;
    if (rc == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int nw = jobs ? jobs : (int)(cores > 64 ? 64 : cores > 0 ? cores : 1);
        if (nw > w.ntodo) nw = w.ntodo;
        progress(t, &w, 0);
        if (nw > 0) rc = run_workers(t, &w, nw);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (rc == 0) {
        if (t->json)
            printf("{\"records\":%d,\"graphs\":%d,\"compiled\":%d,\"present\":%d,\"failed\":%d,"
                   "\"seconds\":%.3f}\n", w.n, w.ntodo, w.counts[JIT_WARM_COMPILED],
                   w.counts[JIT_WARM_PRESENT], w.counts[JIT_WARM_FAILED], secs);
        else
            printf("warmup: %d graphs (%d records): %d compiled, %d already present, %d failed "
                   "in %.2f s\n", w.ntodo, w.n, w.counts[JIT_WARM_COMPILED],
                   w.counts[JIT_WARM_PRESENT], w.counts[JIT_WARM_FAILED], secs);
        rc = w.counts[JIT_WARM_FAILED] ? 1 : 0;
    }
    jit_records_free(w.rs, w.n);
    em_free(w.todo);
    return rc;
}

/* ---- main ---- */

static int dispatch(tool *t, const char *cmd, int argc, char **argv) {
    if (!strcmp(cmd, "ls") && argc == 0) return cmd_ls(t);
    if (!strcmp(cmd, "stats") && argc == 0) return cmd_stats(t);
    if (!strcmp(cmd, "verify") && argc == 0) return cmd_verify(t, false);
    if (!strcmp(cmd, "verify") && argc == 1 && !strcmp(argv[0], "--remove")) return cmd_verify(t, true);
    if (!strcmp(cmd, "prune")) return cmd_prune(t, argc, argv);
    if (!strcmp(cmd, "clear") && argc == 0) return cmd_clear(t);
    if (!strcmp(cmd, "export") && argc == 1) return cmd_export(t, argv[0]);
    if (!strcmp(cmd, "import") && argc == 1) return cmd_import(t, argv[0]);
    if (!strcmp(cmd, "warmup")) return cmd_warmup(t, argc, argv);
    return usage_error("unknown command or wrong arguments: '%s'", cmd);
}

int main(int argc, char **argv) {
    tool t = {0};
    /* --json, --dir and --help may come anywhere; the rest is the command */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    int n = 0;
    if (!args) return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") || !strcmp(argv[i], "help")) {
            fputs(USAGE, stdout);
            free(args);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            t.json = true;
        } else if (!strcmp(argv[i], "--dir")) {
            if (i + 1 == argc) {
                free(args);
                return usage_error("--dir needs a directory%s", "");
            }
            t.dir = argv[++i];
        } else {
            args[n++] = argv[i];
        }
    }
    if (n == 0 || args[0][0] == '-') {
        int rc = n ? usage_error("unknown option '%s'", args[0]) : usage_error("no command given%s", "");
        free(args);
        return rc;
    }
    signal(SIGPIPE, SIG_IGN);
    if (!open_cache(&t)) {
        free(args);
        return 1;
    }
    int rc = dispatch(&t, args[0], n - 1, args + 1);
    free(args);
    kc_close(t.cache);
    return rc;
}
