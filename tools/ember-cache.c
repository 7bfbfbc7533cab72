/* ember-cache - look after Ember's compiled-artifact cache: warm it from
 * recorded graphs, list, check, prune, clear, and move it between machines
 * as one bundle file.  `ember-cache --help` and docs/cache.md describe
 * every command. */
#include "config.h"

#include "cache.h"
#include "cuda_jit.h"
#include "jit.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char USAGE[] =
    "usage: ember-cache [--dir DIR] [--json] [--target sm_XY] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  warmup [-j N] FILE...   compile every graph recorded in the warmup lists FILE...\n"
    "                          (EMBER_RECORD=FILE or em_compiled_save) into the cache,\n"
    "                          in N worker processes (default: one per core)\n"
    "  ls                      list the entries: key, kind, backend, size, age, last use\n"
    "  stats [--remote]        entry counts and sizes by kind (of the remote tier with\n"
    "                          --remote)\n"
    "  verify [--remove]       check every entry's header and checksum; report bad\n"
    "                          entries (exit 1), and with --remove delete them\n"
    "  prune --max-size SIZE   remove least recently used entries until the cache holds\n"
    "                          at most SIZE (500M, 2G, bytes)\n"
    "  prune --older-than AGE  remove entries not used for AGE (90s, 30m, 12h, 7d, 2w)\n"
    "  clear                   remove every entry\n"
    "  export FILE             write every good entry into one portable bundle FILE\n"
    "  import FILE             add a bundle's entries; refused when it was made for\n"
    "                          another compiler, code generator, CPU target or GPU\n"
    "  push [FILE]             publish every good entry (with FILE: a bundle's, imported\n"
    "                          first) to the remote tier, replacing what it holds\n"
    "  pull [FILE...]          fetch the remote tier's entries this cache lacks (with\n"
    "                          FILE...: those the warmup lists' graphs need), each\n"
    "                          checked against its signature before it is written\n"
    "  keygen FILE             write a new signing key for the remote tier to FILE\n"
    "                          (created 0600; an existing FILE is never replaced)\n"
    "  explain FILE            whether the cache holds the plan and kernels of each graph\n"
    "                          in the warmup list FILE, and why each one missed; compiles\n"
    "                          and writes nothing (exit 0 all present, 1 some missing)\n"
    "  help                    this text\n"
    "\n"
    "Options:\n"
    "  --dir DIR   the cache directory (default: EMBER_CACHE_DIR, else\n"
    "              $XDG_CACHE_HOME/ember, else ~/.cache/ember)\n"
    "  --json      machine-readable output on stdout\n"
    "  --target sm_XY  the GPU architecture CUDA entries are for (warmup compiles\n"
    "              them with NVRTC alone, no GPU needed; export and import tag and\n"
    "              check bundles with it); default: this machine's GPU, if any\n"
    "\n"
    "The remote tier (push, pull, stats --remote, and every lookup) is the Redis\n"
    "server EMBER_CACHE_REMOTE names, with the key EMBER_CACHE_KEY_FILE names.\n"
    "\n"
    "Exit status: 0 success, 1 a command failed (or found bad entries), 2 usage.\n";

typedef struct tool {
    const char *dir;  /* --dir or EMBER_CACHE_DIR; NULL: the library's default */
    const char *target; /* --target: the CUDA architecture named; NULL: this GPU's */
    bool dir_from_env;
    bool json;
    kc_cache *cache;
} tool;

/* A command line, checked whole before the cache is opened: a usage error
 * never touches a directory. */
typedef struct command {
    const char *name;
    bool remove;          /* verify --remove */
    bool remote;          /* stats --remote */
    bool by_size;         /* prune: --max-size (else --older-than) */
    uint64_t max_size;    /* prune --max-size */
    int64_t age;          /* prune --older-than, seconds */
    const char *file;     /* export, import, keygen; push (may be NULL) */
    int jobs;             /* warmup -j; 0: one per core */
    char **files;         /* warmup */
    int nfiles;
} command;

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ember-cache: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(ember-cache --help lists the commands)\n");
    va_end(ap);
    return 2;
}

static int fail(const char *what) {
    fprintf(stderr, "ember-cache: %s: %s\n", what, em_last_error());
    return 1;
}

/* Whether the cache opened where it was asked to: a command (clear,
 * prune, import) must act on that directory and never on another one the
 * library fell back to. */
static bool opened_where_asked(const tool *t) {
    if (!t->dir) return true; /* the library's default is what was asked */
    char *want = realpath(t->dir, NULL);
    bool same = want && !strcmp(want, kc_dir(t->cache));
    if (!same)
        fprintf(stderr, "ember-cache: the cache opened at %s, not at %s%s: stopping\n",
                kc_dir(t->cache), t->dir, t->dir_from_env ? " (EMBER_CACHE_DIR)" : "");
    free(want);
    return same;
}

/* Opens the cache; the trust checks say why a directory is refused. */
static bool open_cache(tool *t, const command *c) {
    /* explain reports on this directory alone: a lookup through the remote
     * tier would fetch (write) what it finds */
    kc_options o = {.dir = t->dir, .flags = !strcmp(c->name, "explain") ? KC_NO_REMOTE : 0};
    t->cache = kc_open_with(&o);
    if (!t->cache) return fail("cannot open the cache") == 0;
    if (!kc_on_disk(t->cache)) {
        const char *off = getenv("EMBER_CACHE");
        fprintf(stderr, "ember-cache: %s\n", off && !strcmp(off, "0")
                ? "EMBER_CACHE=0 turns the disk cache off"
                : "the cache directory is not usable (see the message above)");
        return false;
    }
    return opened_where_asked(t);
}

/* The versions this machine's artifacts are made for: a bundle must carry
 * the same ones.  The CUDA ones (with a GPU here, or --target): the
 * target (architecture, generator, the NVRTC Ember is built for) and the
 * NVRTC version as loaded here, which made the images. */
/* Whether the bundle at path has a "tag <prefix>..." line among its
 * first lines (a peek: kc_import reads and checks it for real). */
static bool bundle_has_tag(const char *path, const char *prefix) {
    /* never blocks on a FIFO: only a regular file is read (kc_import
     * refuses the others with its own message) */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        fd = -1;
    }
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (fd >= 0 && !f) close(fd);
    char line[512];
    bool found = false;
    for (int i = 0; f && !found && i < 16 && fgets(line, sizeof line, f); i++)
        found = !strncmp(line, "tag ", 4) && !strncmp(line + 4, prefix, strlen(prefix));
    if (f) fclose(f);
    return found;
}

/* import: the bundle's path, whose CUDA tags (if any) decide whether the
 * GPU is asked for its architecture (initializing the driver costs about
 * 100 MB: a CPU-only bundle's import does not pay it); NULL: export. */
static int machine_tags(const tool *t, const char *import, char tags[][256], const char **ptrs) {
    int n = 0;
    snprintf(tags[n++], 256, "cache-format=%u", KC_FORMAT_VERSION);
    const char *cpu = jit_backend_target(&jit_cpu_backend);
    if (cpu) snprintf(tags[n++], 256, "cpu=%s", cpu);
    char cuda[200];
    jit_env env = {.target = t->target};
    bool ask = !import || t->target || bundle_has_tag(import, "cuda=") || bundle_has_tag(import, "nvrtc=");
    if (ask && jit_cuda_device.target(0, &env, cuda, sizeof cuda)) {
        /* a bundle without CUDA entries (made without a GPU) may lack them */
        snprintf(tags[n++], 256, "%scuda=%s", import ? "?" : "", cuda);
        const char *nv = jit_cuda_nvrtc_version();
        if (nv) snprintf(tags[n++], 256, "%snvrtc=%s", import ? "?" : "", nv);
    }
    em_clear_error();
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

/* Digits only (no sign, no spaces: strtol's leniency would take " 5" and
 * "+5"), at most max; false on anything else. */
static bool parse_count(const char *s, int64_t max, int64_t *out) {
    int64_t v = 0;
    if (!*s) return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (max - (*s - '0')) / 10) return false;
        v = v * 10 + (*s - '0');
    }
    *out = v;
    return true;
}

/* "90s", "30m", "12h", "7d", "2w", or plain seconds. */
static bool parse_age(const char *s, int64_t *out) {
    size_t n = strlen(s);
    int64_t mul = 1;
    char num[32];
    if (n == 0 || n >= sizeof num) return false;
    memcpy(num, s, n + 1);
    switch (num[n - 1]) {
    case 's': mul = 1; break;
    case 'm': mul = 60; break;
    case 'h': mul = 3600; break;
    case 'd': mul = 86400; break;
    case 'w': mul = 604800; break;
    default: mul = 0; break;
    }
    if (mul) num[n - 1] = '\0';
    else mul = 1;
    return parse_count(num, INT64_MAX / mul, out) && (*out *= mul, true);
}

/* ---- JSON ---- */

/* The length of the UTF-8 sequence at p (1-4), or 0 when it is not one
 * (overlong, a surrogate, past U+10FFFF, a stray continuation byte). */
static int utf8_len(const unsigned char *p) {
    unsigned c = p[0];
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n <= 1) return n;
    unsigned cp = c & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0; /* also stops at the NUL */
        cp = cp << 6 | (p[i] & 0x3f);
    }
    static const unsigned least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

/* Writes s as a JSON string, the one way every --json output writes text:
 * '"', '\\' and control characters escaped; JSON text is UTF-8, so a byte
 * that is not part of a UTF-8 character (a path may hold any) becomes
 * U+FFFD. */
static void json_str(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = utf8_len(p);
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p == '\n') fputs("\\n", stdout);
        else if (*p == '\t') fputs("\\t", stdout);
        else if (*p < 0x20 || *p == 0x7f) printf("\\u%04x", *p);
        else if (n == 0) fputs("\\ufffd", stdout);
        else fwrite(p, 1, (size_t)n, stdout);
        p += n ? n : 1;
    }
    putchar('"');
}

/* ,"name": (the comma unless first) */
static void json_key(bool first, const char *name) {
    printf("%s\"%s\":", first ? "" : ",", name);
}

static const char *backend_of(const char *kind) {
    if (!strcmp(kind, "so")) return "cpu";
    if (!strcmp(kind, "plan")) return "graph";
    if (!strcmp(kind, "ptx") || !strcmp(kind, "cubin")) return "cuda";
    if (!strncmp(kind, "why_", 4)) return "keyinfo"; /* a key's manifest (explain) */
    if (!strcmp(kind, "dynhint")) return "graph"; /* which dims a structure was dynamic in */
    return "-";
}

/* ---- ls, stats ---- */

static int cmd_ls(tool *t) {
    kc_entry_info *es;
    size_t n;
    if (kc_list(t->cache, &es, &n) != EM_OK) return fail("ls");
    int64_t now = (int64_t)time(NULL);
    if (t->json) printf("[");
    else if (n) printf("%-32s  %-9s  %-7s  %9s  %6s  %8s\n", "KEY", "KIND", "BACKEND", "SIZE", "AGE", "LAST USE");
    for (size_t i = 0; i < n; i++) {
        const kc_entry_info *e = &es[i];
        char hex[KC_KEY_HEX_SIZE], sz[32], age[32], used[32];
        kc_key_hex(&e->key, hex);
        if (t->json) {
            printf("%s\n {", i ? "," : "");
            json_key(true, "key"), json_str(hex);
            json_key(false, "kind"), json_str(e->kind);
            json_key(false, "backend"), json_str(backend_of(e->kind));
            printf(",\"size\":%" PRIu64 ",\"disk_bytes\":%" PRIu64 ",\"created\":%" PRId64
                   ",\"last_use\":%" PRId64 ",\"complete\":%s}", e->size, e->disk_bytes,
                   e->created, e->last_use, e->has_header ? "true" : "false");
        } else {
            printf("%-32s  %-9s  %-7s  %9s  %6s  %7s%s\n", hex, e->kind, backend_of(e->kind),
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
        printf("{");
        json_key(true, "dir"), json_str(kc_dir(t->cache));
        printf(",\"entries\":%zu,\"bytes\":%" PRIu64 ",\"incomplete\":%" PRIu64
               ",\"hits\":null,\"kinds\":{", n, total, incomplete);
        for (int k = 0; k < nk; k++) {
            printf("%s", k ? "," : "");
            json_str(kinds[k].kind);
            printf(":{\"entries\":%" PRIu64 ",\"bytes\":%" PRIu64 "}", kinds[k].n, kinds[k].bytes);
        }
        printf("}}\n");
    } else {
        printf("cache %s: %zu entries, %s\n", kc_dir(t->cache), n, human_size(total, sz, sizeof sz));
        for (int k = 0; k < nk; k++)
            printf("  %-9s %-7s %6" PRIu64 " entries  %9s\n", kinds[k].kind,
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
        if (t->json) {
            printf("%s{", bad ? "," : "");
            json_key(true, "key"), json_str(hex);
            json_key(false, "kind"), json_str(es[i].kind);
            json_key(false, "problem");
            json_str(r == KC_READ_REFUSED ? "untrusted" : r == KC_READ_NOMEM ? "out of memory" : "corrupt");
            json_key(false, "why"), json_str(why[0] ? why : "unreadable");
            printf(",\"removed\":%s}", gone ? "true" : "false");
        } else
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

static int cmd_prune(tool *t, const command *c) {
    uint64_t removed = 0;
    if (c->by_size) {
        kc_entry_info *es;
        size_t before = 0, after = 0;
        if (kc_list(t->cache, &es, &before) != EM_OK) return fail("prune");
        em_free(es);
        if (kc_prune(t->cache, c->max_size) != EM_OK) return fail("prune");
        if (kc_list(t->cache, &es, &after) != EM_OK) return fail("prune");
        em_free(es);
        removed = before > after ? before - after : 0;
    } else if (kc_prune_older(t->cache, c->age, &removed) != EM_OK) {
        return fail("prune");
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
    int nt = machine_tags(t, NULL, tags, ptrs);
    uint64_t done, skipped;
    if (kc_export(t->cache, path, ptrs, nt, &done, &skipped) != EM_OK) return fail("export");
    if (t->json) {
        printf("{");
        json_key(true, "file"), json_str(path);
        printf(",\"exported\":%" PRIu64 ",\"skipped\":%" PRIu64 "}\n", done, skipped);
    } else
        printf("export: %" PRIu64 " entries to %s%s\n", done, path,
               skipped ? " (bad entries skipped: ember-cache verify)" : "");
    return 0;
}

static int cmd_import(tool *t, const char *path) {
    char tags[8][256];
    const char *ptrs[8];
    int nt = machine_tags(t, path, tags, ptrs);
    uint64_t done;
    if (kc_import(t->cache, path, ptrs, nt, &done) != EM_OK) return fail("import");
    if (t->json) {
        printf("{");
        json_key(true, "file"), json_str(path);
        printf(",\"imported\":%" PRIu64 "}\n", done);
    } else printf("import: %" PRIu64 " entries from %s\n", done, path);
    return 0;
}

/* ---- the remote tier: stats --remote, push, pull, keygen ---- */

/* A progress bar on a terminal, for push and pull. */
typedef struct bar {
    const tool *t;
    const char *what;
    int shown; /* the last fill drawn, -1: none */
} bar;

static void bar_update(void *ud, uint64_t done, uint64_t total) {
    bar *b = ud;
    if (b->t->json || !isatty(STDERR_FILENO)) return;
    int width = 30, fill = total ? (int)(done * (uint64_t)width / total) : width;
    if (fill == b->shown && done != total) return; /* redrawn only when it moves */
    b->shown = fill;
    fprintf(stderr, "\r[%.*s%*s] %" PRIu64 "/%" PRIu64 " %s", fill,
            "##############################", width - fill, "", done, total, b->what);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

static int cmd_remote_stats(tool *t) {
    kc_remote_info r;
    if (kc_remote_stats(t->cache, &r) != EM_OK) return fail("stats --remote");
    char sz[32];
    if (t->json) {
        printf("{");
        json_key(true, "remote"), json_str(kc_remote_url(t->cache));
        json_key(false, "server"), json_str(r.server);
        printf(",\"entries\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"kinds\":{", r.entries, r.bytes);
        for (int k = 0; k < r.nkinds; k++) {
            printf("%s", k ? "," : "");
            json_str(r.kinds[k].kind);
            printf(":{\"entries\":%" PRIu64 ",\"bytes\":%" PRIu64 "}", r.kinds[k].entries,
                   r.kinds[k].bytes);
        }
        printf("}}\n");
        return 0;
    }
    printf("remote %s (Redis %s): %" PRIu64 " entries, %s\n", kc_remote_url(t->cache), r.server,
           r.entries, human_size(r.bytes, sz, sizeof sz));
    for (int k = 0; k < r.nkinds; k++)
        printf("  %-9s %-7s %6" PRIu64 " entries  %9s\n", r.kinds[k].kind,
               backend_of(r.kinds[k].kind), r.kinds[k].entries,
               human_size(r.kinds[k].bytes, sz, sizeof sz));
    return 0;
}

static int cmd_push(tool *t, const char *bundle) {
    if (bundle) {
        int rc = cmd_import(t, bundle);
        if (rc) return rc;
    }
    bar b = {t, "entries pushed", -1};
    uint64_t pushed = 0;
    em_status s = kc_push(t->cache, bar_update, &b, &pushed);
    if (s != EM_OK) return fail("push");
    if (t->json) {
        printf("{");
        json_key(true, "remote"), json_str(kc_remote_url(t->cache));
        printf(",\"pushed\":%" PRIu64 "}\n", pushed);
    } else {
        printf("push: %" PRIu64 " entries to %s\n", pushed, kc_remote_url(t->cache));
    }
    return 0;
}

/* pull FILE...: each record of the warmup lists looked up as warmup would
 * (jit_explain: a dry run), through the remote tier, which fetches what
 * this directory lacks; nothing is compiled. */
static int pull_lists(tool *t, const command *c) {
    kc_counters before, after;
    kc_stats(t->cache, &before);
    int graphs = 0, complete = 0, missing = 0, errors = 0;
    for (int f = 0; f < c->nfiles; f++) {
        jit_record *rs;
        int n;
        if (jit_records_read(c->files[f], &rs, &n) != EM_OK) return fail("pull");
        for (int i = 0; i < n; i++) {
            char why[512];
            jit_explained e;
            FILE *quiet = fopen("/dev/null", "w");
            bool ok = quiet && jit_explain(&rs[i], t->cache, t->target, quiet, &e, why, sizeof why);
            if (quiet) fclose(quiet);
            graphs++;
            if (!ok) errors++, fprintf(stderr, "ember-cache: pull: %s: %s\n", rs[i].name, why);
            else if ((!e.dynamic && !e.plan) || e.present < e.kernels) missing++;
            else complete++;
        }
        jit_records_free(rs, n);
    }
    kc_stats(t->cache, &after);
    uint64_t fetched = after.remote_hits - before.remote_hits;
    uint64_t rejected = after.remote_rejected - before.remote_rejected;
    if (t->json)
        printf("{\"graphs\":%d,\"fetched\":%" PRIu64 ",\"complete\":%d,\"missing\":%d,"
               "\"rejected\":%" PRIu64 ",\"errors\":%d}\n", graphs, fetched, complete, missing,
               rejected, errors);
    else
        printf("pull: %d graphs: %" PRIu64 " entries fetched from %s; %d complete here, %d with "
               "something the server lacks too (ember-cache warmup compiles it)%s\n", graphs,
               fetched, kc_remote_url(t->cache), complete, missing,
               rejected ? "; some entries rejected (the warning above)" : "");
    return errors ? 2 : missing || rejected ? 1 : 0;
}

static int cmd_pull(tool *t, const command *c) {
    if (c->nfiles && !kc_remote_url(t->cache)) {
        em_error(EM_ERR_STATE, "no remote tier (set EMBER_CACHE_REMOTE and EMBER_CACHE_KEY_FILE)");
        return fail("pull");
    }
    if (c->nfiles) return pull_lists(t, c);
    bar b = {t, "remote entries", -1};
    uint64_t fetched = 0, present = 0, rejected = 0;
    em_status s = kc_pull(t->cache, bar_update, &b, &fetched, &present, &rejected);
    if (s != EM_OK) return fail("pull");
    if (t->json) {
        printf("{");
        json_key(true, "remote"), json_str(kc_remote_url(t->cache));
        printf(",\"fetched\":%" PRIu64 ",\"present\":%" PRIu64 ",\"rejected\":%" PRIu64 "}\n",
               fetched, present, rejected);
    } else {
        printf("pull: %" PRIu64 " entries fetched from %s, %" PRIu64 " already here, %" PRIu64
               " rejected%s\n", fetched, kc_remote_url(t->cache), present, rejected,
               rejected ? " (not signed with this machine's key, or damaged: the warning above)" : "");
    }
    return rejected ? 1 : 0;
}

/* A new key: 32 random bytes as 64 hex digits, in a file made 0600 that
 * did not exist (a key in use is never overwritten). */
static int cmd_keygen(tool *t, const char *path) {
    uint8_t k[32];
    size_t got = 0;
    while (got < sizeof k) {
        ssize_t r = getrandom(k + got, sizeof k - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            fprintf(stderr, "ember-cache: keygen: no random bytes: %s\n", strerror(errno));
            return 1;
        }
        got += (size_t)r;
    }
    char hex[2 * sizeof k + 2];
    for (size_t i = 0; i < sizeof k; i++) snprintf(hex + 2 * i, 3, "%02x", k[i]);
    hex[2 * sizeof k] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write(fd, hex, 2 * sizeof k + 1) == (ssize_t)(2 * sizeof k + 1);
    int err = errno;
    if (fd >= 0 && close(fd) != 0 && ok) ok = false, err = errno;
    memset(k, 0, sizeof k);
    memset(hex, 0, sizeof hex);
    if (!ok) {
        fprintf(stderr, "ember-cache: keygen: cannot create %s: %s%s\n", path, strerror(err),
                err == EEXIST ? " (a key is never overwritten: remove it first)" : "");
        if (fd >= 0) unlink(path);
        return 1;
    }
    if (t->json) {
        printf("{");
        json_key(true, "key_file"), json_str(path);
        printf("}\n");
    } else {
        printf("keygen: a new key in %s: give the same file to every machine of the fleet "
               "(EMBER_CACHE_KEY_FILE)\n", path);
    }
    return 0;
}

/* ---- explain ---- */

/* explain FILE: one warmup list. */
static int parse_explain(command *c, int argc, char **argv) {
    if (argc != 1 || !argv[0][0]) return usage_error("explain takes one warmup list FILE");
    c->file = argv[0];
    return 0;
}

/* The state of a record's plan, in a word. */
static const char *plan_state(const jit_explained *e) {
    return e->dynamic ? "none" : e->plan ? "hit" : e->unusable ? "unusable" : "miss";
}

/* One record's outcome as a JSON object; lines: its misses, one a line. */
static void explain_json(int no, const jit_record *r, bool ok, const jit_explained *e,
                         const char *why, const char *lines) {
    printf("%s\n {\"entry\":%d", no > 1 ? "," : "", no);
    json_key(false, "name"), json_str(r->name);
    json_key(false, "backend"), json_str(r->backend);
    if (!ok) {
        json_key(false, "error"), json_str(why);
        printf("}");
        return;
    }
    printf(",\"dynamic\":%s,\"plan\":\"%s\",\"kernels\":%" PRId64 ",\"present\":%" PRId64
           ",\"misses\":[", e->dynamic ? "true" : "false", plan_state(e), e->kernels, e->present);
    for (const char *p = lines; *p;) {
        size_t n = strcspn(p, "\n");
        char *line = strndup(p, n);
        if (p != lines) putchar(',');
        json_str(line ? line : "");
        free(line);
        p += n + (p[n] == '\n');
    }
    printf("]}");
}

static void explain_text(int no, const jit_record *r, bool ok, const jit_explained *e,
                         const char *why, const char *lines) {
    if (!ok) {
        printf("entry %d %s (%s): cannot be looked up: %s\n", no, r->name, r->backend, why);
        return;
    }
    const char *plan = e->dynamic ? "dynamic (no plan)" : e->plan ? "plan hit"
                       : e->unusable ? "plan unusable" : "plan miss";
    printf("entry %d %s (%s, %" PRId64 " kernel%s): %s, %" PRId64 "/%" PRId64 " kernels present\n",
           no, r->name, r->backend, e->kernels, e->kernels == 1 ? "" : "s", plan, e->present,
           e->kernels);
    for (const char *p = lines; *p;) {
        size_t n = strcspn(p, "\n");
        printf("  %.*s\n", (int)n, p);
        p += n + (p[n] == '\n');
    }
}

/* Record no of the list: 0 all present, 1 something missing, 2 it
 * cannot be looked up. */
static int explain_record(const tool *t, const jit_record *r, int no) {
    char *lines = NULL, why[512];
    size_t len = 0;
    FILE *out = open_memstream(&lines, &len);
    if (!out) {
        fail("explain");
        return 2;
    }
    jit_explained e;
    bool ok = jit_explain(r, t->cache, t->target, out, &e, why, sizeof why);
    fclose(out);
    if (t->json) explain_json(no, r, ok, &e, why, lines ? lines : "");
    else explain_text(no, r, ok, &e, why, lines ? lines : "");
    free(lines);
    return !ok ? 2 : (!e.dynamic && !e.plan) || e.present < e.kernels ? 1 : 0;
}

/* explain FILE: a dry run of warmup (jit_explain), nothing compiled or
 * stored.  Exit 0 when every plan and kernel is present, 1 when something
 * is missing, 2 when the list or an entry cannot be read. */
static int cmd_explain(tool *t, const char *path) {
    jit_record *rs;
    int n, counts[3] = {0};
    if (jit_records_read(path, &rs, &n) != EM_OK) {
        fail("explain");
        return 2;
    }
    if (t->json) {
        printf("{");
        json_key(true, "file"), json_str(path);
        printf(",\"entries\":[");
    }
    for (int i = 0; i < n; i++) counts[explain_record(t, &rs[i], i + 1)]++;
    if (t->json)
        printf("%s],\"complete\":%d,\"missing\":%d,\"errors\":%d}\n", n ? "\n" : "", counts[0],
               counts[1], counts[2]);
    else
        printf("explain: %d entries: %d complete, %d with something missing, %d not looked up\n", n,
               counts[0], counts[1], counts[2]);
    jit_records_free(rs, n);
    return counts[2] ? 2 : counts[1] ? 1 : 0;
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
        int r = c ? (int)jit_warmup(&w->rs[w->todo[i]], c, t->target, why, sizeof why) : JIT_WARM_FAILED;
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

static int cmd_warmup(tool *t, const command *c) {
    int jobs = c->jobs, argc = c->nfiles;
    char **argv = c->files;
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

/* ---- the command line ---- */

static int no_args(const char *cmd, int argc, char **argv) {
    if (argc == 0) return 0;
    return usage_error("%s takes no arguments, got '%s'", cmd, argv[0]);
}

static int parse_verify(command *c, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--remove") != 0)
            return usage_error("verify: unknown argument '%s' (verify [--remove])", argv[i]);
        c->remove = true;
    }
    return 0;
}

/* pull [FILE...]: warmup lists (none: everything on the server). */
static int parse_lists(command *c, int argc, char **argv) {
    c->files = argv;
    for (int i = 0; i < argc; i++) {
        if (!argv[i][0]) return usage_error("%s: an empty file name", c->name);
        if (argv[i][0] == '-') return usage_error("%s: unknown option '%s'", c->name, argv[i]);
        c->files[c->nfiles++] = argv[i];
    }
    return 0;
}

static int parse_stats(command *c, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--remote") != 0)
            return usage_error("stats: unknown argument '%s' (stats [--remote])", argv[i]);
        c->remote = true;
    }
    return 0;
}

static int parse_prune(command *c, int argc, char **argv) {
    const char *opt = argc ? argv[0] : "";
    c->by_size = !strcmp(opt, "--max-size");
    if (!c->by_size && strcmp(opt, "--older-than") != 0)
        return argc ? usage_error("prune: unknown argument '%s' (--max-size SIZE or --older-than AGE)", opt)
                    : usage_error("prune takes --max-size SIZE or --older-than AGE");
    if (argc < 2) return usage_error("prune %s needs a value", opt);
    if (argc > 2) return usage_error("prune takes one of --max-size SIZE and --older-than AGE; "
                                     "extra argument '%s'", argv[2]);
    if (c->by_size && !kc_size_from_str(argv[1], &c->max_size))
        return usage_error("bad size '%s' (bytes, or a number with K, M, G or T: 500M, 2G)", argv[1]);
    if (!c->by_size && !parse_age(argv[1], &c->age))
        return usage_error("bad age '%s' (e.g. 90s, 30m, 12h, 7d, 2w)", argv[1]);
    return 0;
}

/* export FILE, import FILE, push FILE, keygen FILE */
static int parse_file(command *c, int argc, char **argv) {
    if (argc == 0) return usage_error("%s needs a %s", c->name, strcmp(c->name, "keygen") ? "bundle FILE" : "key FILE");
    if (argc > 1) return usage_error("%s takes one FILE; extra argument '%s'", c->name, argv[1]);
    if (!argv[0][0]) return usage_error("%s: the file name is empty", c->name);
    c->file = argv[0];
    return 0;
}

/* warmup [-j N] FILE...: -j N, -jN, anywhere; "--" ends the options. */
static int parse_warmup(command *c, int argc, char **argv) {
    c->files = argv;
    bool options = true;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (options && !strcmp(a, "--")) {
            options = false;
        } else if (options && !strncmp(a, "-j", 2)) {
            if (!(v = a[2] ? a + 2 : i + 1 < argc ? argv[++i] : NULL))
                return usage_error("warmup: -j needs a count from 1 to 64");
            int64_t n;
            if (!parse_count(v, 64, &n) || n < 1)
                return usage_error("warmup: -j takes a count from 1 to 64, not '%s'", v);
            c->jobs = (int)n;
        } else if (options && a[0] == '-' && a[1]) {
            return usage_error("warmup: unknown option '%s'", a);
        } else if (!a[0]) {
            return usage_error("warmup: an empty file name");
        } else {
            c->files[c->nfiles++] = argv[i]; /* in place: files never outrun i */
        }
    }
    if (c->nfiles == 0) return usage_error("warmup needs at least one recorded file");
    return 0;
}

/* Checks the command and its arguments into c: 0, or 2 after a message. */
static int parse_command(command *c, int argc, char **argv) {
    c->name = argv[0];
    argc--, argv++;
    if (!strcmp(c->name, "ls") || !strcmp(c->name, "clear")) return no_args(c->name, argc, argv);
    if (!strcmp(c->name, "pull")) return parse_lists(c, argc, argv);
    if (!strcmp(c->name, "stats")) return parse_stats(c, argc, argv);
    if (!strcmp(c->name, "push")) return argc ? parse_file(c, argc, argv) : 0;
    if (!strcmp(c->name, "keygen")) return parse_file(c, argc, argv);
    if (!strcmp(c->name, "verify")) return parse_verify(c, argc, argv);
    if (!strcmp(c->name, "prune")) return parse_prune(c, argc, argv);
    if (!strcmp(c->name, "export") || !strcmp(c->name, "import")) return parse_file(c, argc, argv);
    if (!strcmp(c->name, "warmup")) return parse_warmup(c, argc, argv);
    if (!strcmp(c->name, "explain")) return parse_explain(c, argc, argv);
    return usage_error("unknown command '%s'", c->name);
}

/* A cache directory as given (--dir, or EMBER_CACHE_DIR): NULL when it is
 * usable, else why not.  An empty one would mean "the default" to kc_open:
 * for a command like clear, another directory than the one named. */
static const char *bad_dir(const char *d) {
    if (!d[0]) return "is empty";
    if (strlen(d) >= PATH_MAX) return "is longer than the longest path (PATH_MAX)";
    return NULL;
}

/* The global options, anywhere on the line; the rest goes to args.
 * -1 to go on, else the exit status. */
static int parse_globals(tool *t, int argc, char **argv, char **args, int *n) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *dir = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h") || (*n == 0 && !strcmp(a, "help"))) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            t->json = true;
        } else if (!strcmp(a, "--dir") || !strncmp(a, "--dir=", 6)) {
            if (!(dir = a[5] ? a + 6 : i + 1 < argc ? argv[++i] : NULL))
                return usage_error("--dir needs a directory");
            if (t->dir) return usage_error("--dir given twice ('%s' and '%s')", t->dir, dir);
            const char *why = bad_dir(dir);
            if (why) return usage_error("--dir '%s' %s", dir, why);
            if (dir[0] == '-')
                return usage_error("--dir needs a directory, not the option '%s' (./%s names a "
                                   "directory of that name)", dir, dir);
            t->dir = dir;
        } else if (!strcmp(a, "--target") || !strncmp(a, "--target=", 9)) {
            const char *tg = a[8] ? a + 9 : i + 1 < argc ? argv[++i] : NULL;
            int arch = 0;
            char end;
            if (!tg || sscanf(tg, "sm_%d%c", &arch, &end) != 1 || arch < 10 || arch > 999)
                return usage_error("--target needs a GPU architecture such as sm_90, not '%s'",
                                   tg ? tg : "");
            if (t->target) return usage_error("--target given twice");
            t->target = tg;
        } else if (*n == 0 && a[0] == '-') {
            return usage_error("unknown option '%s'", a);
        } else {
            args[(*n)++] = argv[i];
        }
    }
    if (*n == 0) return usage_error("no command given");
    return -1;
}

/* Without --dir, a set EMBER_CACHE_DIR is used as if given (kc_open reads
 * it too): so that the checks above and opened_where_asked apply to it. */
static int dir_from_env(tool *t) {
    const char *env = getenv("EMBER_CACHE_DIR");
    if (t->dir || !env || !env[0]) return 0;
    const char *why = bad_dir(env);
    if (why) {
        fprintf(stderr, "ember-cache: EMBER_CACHE_DIR %s: not using it (nor any other directory)\n", why);
        return 1;
    }
    t->dir = env;
    t->dir_from_env = true;
    return 0;
}

static int run(tool *t, const command *c) {
    const char *n = c->name;
    if (!strcmp(n, "ls")) return cmd_ls(t);
    if (!strcmp(n, "stats")) return c->remote ? cmd_remote_stats(t) : cmd_stats(t);
    if (!strcmp(n, "push")) return cmd_push(t, c->file);
    if (!strcmp(n, "pull")) return cmd_pull(t, c);
    if (!strcmp(n, "verify")) return cmd_verify(t, c->remove);
    if (!strcmp(n, "prune")) return cmd_prune(t, c);
    if (!strcmp(n, "clear")) return cmd_clear(t);
    if (!strcmp(n, "export")) return cmd_export(t, c->file);
    if (!strcmp(n, "import")) return cmd_import(t, c->file);
    if (!strcmp(n, "explain")) return cmd_explain(t, c->file);
    return cmd_warmup(t, c);
}

int main(int argc, char **argv) {
    tool t = {0};
    command c = {0};
    char **args = calloc((size_t)argc + 1, sizeof *args);
    int n = 0;
    if (!args) return 1;
    int rc = parse_globals(&t, argc, argv, args, &n);
    if (rc < 0) rc = parse_command(&c, n, args);
    if (rc == 0 && c.name) rc = dir_from_env(&t);
    if (rc == 0 && c.name && !strcmp(c.name, "keygen")) {
        rc = cmd_keygen(&t, c.file); /* needs no cache */
    } else if (rc == 0 && c.name) {
        signal(SIGPIPE, SIG_IGN);
        rc = open_cache(&t, &c) ? run(&t, &c) : 1;
        kc_close(t.cache);
    }
    free(args);
    return rc;
}
