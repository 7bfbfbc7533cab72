/* test_tool.c - the ember-cache tool as users fail with it (issue 21, items
 * 6, 10, 16): usage errors exit 2 and touch no directory, a destructive
 * command never acts on another directory than the one named, bundles that
 * are FIFOs, tagless, oversized or damaged are refused promptly and leave
 * nothing, and every --json output is JSON whatever the paths hold.
 *
 * Each test runs the built tool (EMBER_CACHE_TOOL) in a child with a
 * private HOME and no EMBER_CACHE_DIR, under a deadline, and reads its exit
 * status, output and peak memory (wait4). */
#include "testutil.h"

#include "cache.h"
#include "eager.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- running the tool ---- */

typedef struct run_out {
    int status;       /* exit status; -1 killed (timed out or a signal) */
    bool timed_out;
    long maxrss_kb;   /* the child's peak resident memory */
    double seconds;
    char text[16384]; /* stdout and stderr */
} run_out;

/* The environment of every run: HOME=home, nothing else naming a cache
 * unless env ("NAME=value", NULL-terminated) sets it. */
static void child_env(const char *home, const char *const *env) {
    setenv("HOME", home, 1);
    unsetenv("EMBER_CACHE_DIR");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("EMBER_CACHE_MAX_SIZE");
    unsetenv("EMBER_CACHE");
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Reads the child's output until EOF or the deadline. */
static bool drain(int fd, run_out *o, double deadline) {
    size_t n = 0;
    for (;;) {
        int ms = (int)((deadline - now_s()) * 1000);
        if (ms <= 0) return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, ms) <= 0) continue;
        char buf[4096];
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return true;
        size_t k = (size_t)r < sizeof o->text - 1 - n ? (size_t)r : sizeof o->text - 1 - n;
        memcpy(o->text + n, buf, k);
        n += k;
        o->text[n] = '\0';
    }
}

/* Whether run_tool keeps only stdout (stderr to /dev/null): for --json,
 * whose messages go to stderr. */
static bool stdout_only;

/* Runs the tool with argv (NULL-terminated, argv[0] excluded) for at most
 * timeout seconds. */
static void run_tool(run_out *o, const char *home, const char *const *env, double timeout,
                     const char *const *argv) {
    const char *exe = getenv("EMBER_CACHE_TOOL");
    ck_assert_msg(exe != NULL, "EMBER_CACHE_TOOL is not set (run through make check)");
    const char *args[32] = {exe};
    int n = 1;
    while (argv[n - 1] && n < 31) args[n] = argv[n - 1], n++;
    args[n] = NULL;
    memset(o, 0, sizeof *o);
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    double t0 = now_s();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int err = stdout_only ? open("/dev/null", O_WRONLY) : p[1];
        dup2(p[1], 1), dup2(err, 2);
        close(p[0]), close(p[1]);
        child_env(home, env);
        execv(exe, (char *const *)args);
        _exit(127);
    }
    close(p[1]);
    o->timed_out = !drain(p[0], o, t0 + timeout);
    if (o->timed_out) kill(pid, SIGKILL);
    close(p[0]);
    int st;
    struct rusage ru;
    ck_assert_int_eq(wait4(pid, &st, 0, &ru), pid);
    o->seconds = now_s() - t0;
    o->maxrss_kb = ru.ru_maxrss;
    o->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define TOOL(o, home, env, timeout, ...) \
    run_tool((o), (home), (env), (timeout), (const char *const[]){__VA_ARGS__, NULL})

/* ---- a private place per test ---- */

typedef struct place {
    char root[64];  /* everything below is removed at the end */
    char home[96];  /* HOME of every run */
    char dflt[128]; /* $HOME/.cache/ember: the default cache */
} place;

static void place_make(place *pl) {
    snprintf(pl->root, sizeof pl->root, "/tmp/ember-tool-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(pl->root));
    snprintf(pl->home, sizeof pl->home, "%s/home", pl->root);
    snprintf(pl->dflt, sizeof pl->dflt, "%s/.cache/ember", pl->home);
    ck_assert_int_eq(mkdir(pl->home, 0700), 0);
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    (void)chmod(p, 0700);
    return remove(p);
}

static void place_remove(const place *pl) { nftw(pl->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static kc_key key_of(int i) {
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_u64(&h, (uint64_t)i);
    return kc_hasher_digest(&h);
}

/* Puts n small entries into the cache at dir. */
static void fill(const char *dir, int n) {
    kc_cache *c = kc_open(dir, 0);
    ck_assert(c && kc_on_disk(c));
    for (int i = 0; i < n; i++) {
        char data[64];
        int len = snprintf(data, sizeof data, "artifact %d", i);
        kc_key k = key_of(i);
        ck_assert_int_eq(kc_put(c, &k, "so", data, (size_t)len), EM_OK);
    }
    kc_close(c);
}

/* Entries in the cache at dir (which must exist: kc_open would make it). */
static size_t entries(const char *dir) {
    struct stat st;
    ck_assert_msg(stat(dir, &st) == 0, "%s is gone", dir);
    kc_cache *c = kc_open(dir, 0);
    ck_assert(c && kc_on_disk(c));
    kc_entry_info *es;
    size_t n;
    ck_assert_int_eq(kc_list(c, &es, &n), EM_OK);
    em_free(es);
    kc_close(c);
    return n;
}

static int count_file(const char *p, const struct stat *st, int flag, struct FTW *f);
static int nfiles_seen;
static int count_file(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)p, (void)f;
    if (flag == FTW_F && S_ISREG(st->st_mode)) nfiles_seen++;
    return 0;
}

/* Regular files anywhere under dir: payloads, headers, temporaries. */
static int files_under(const char *dir) {
    nfiles_seen = 0;
    nftw(dir, count_file, 16, FTW_PHYS);
    return nfiles_seen;
}

static bool exists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

/* ---- item 6: usage errors, and no fallback directory ---- */

START_TEST(an_empty_dir_is_a_usage_error_and_the_default_cache_stays) {
    place pl;
    place_make(&pl);
    fill(pl.dflt, 3);
    run_out o;
    TOOL(&o, pl.home, NULL, 30, "--dir", "", "clear");
    ck_assert_msg(o.status == 2, "--dir '' clear: exit %d: %s", o.status, o.text);
    TOOL(&o, pl.home, NULL, 30, "clear", "--dir=");
    ck_assert_msg(o.status == 2, "clear --dir=: exit %d: %s", o.status, o.text);
    TOOL(&o, pl.home, NULL, 30, "--json", "--dir", "", "prune", "--max-size", "0");
    ck_assert_msg(o.status == 2, "--dir '' prune: exit %d: %s", o.status, o.text);
    ck_assert_uint_eq(entries(pl.dflt), 3);
    /* the default itself still works when asked for by omission */
    TOOL(&o, pl.home, NULL, 30, "ls");
    ck_assert_msg(o.status == 0, "ls: exit %d: %s", o.status, o.text);
    place_remove(&pl);
}
END_TEST

START_TEST(an_unusable_EMBER_CACHE_DIR_never_becomes_the_default) {
    place pl;
    place_make(&pl);
    fill(pl.dflt, 2);
    static char env[5000] = "EMBER_CACHE_DIR=/tmp/";
    size_t k = strlen(env);
    memset(env + k, 'x', sizeof env - k - 1); /* longer than PATH_MAX */
    run_out o;
    const char *const envs[] = {env, NULL};
    TOOL(&o, pl.home, envs, 30, "clear");
    ck_assert_msg(o.status == 1 || o.status == 2, "clear: exit %d: %s", o.status, o.text);
    ck_assert_uint_eq(entries(pl.dflt), 2);
    place_remove(&pl);
}
END_TEST

/* Every malformed command line: exit 2, and the named directory is never
 * created (the line is checked before the cache is opened). */
START_TEST(usage_errors_exit_2_and_touch_nothing) {
    place pl;
    place_make(&pl);
    char dir[160];
    snprintf(dir, sizeof dir, "%s/cache", pl.root);
    const char *const lines[][8] = {
        {"warmup", "-j"},
        {"warmup", "-j", "0", "list.txt"},
        {"warmup", "-j", "65", "list.txt"},
        {"warmup", "-j", " 4", "list.txt"},
        {"warmup", "-jx", "list.txt"},
        {"warmup", "--fast", "list.txt"},
        {"warmup", ""},
        {"warmup"},
        {"ls", "extra"},
        {"stats", "--remove"},
        {"clear", "all"},
        {"verify", "--remove", "now"},
        {"verify", "-r"},
        {"prune"},
        {"prune", "--max-size"},
        {"prune", "--max-size", ""},
        {"prune", "--max-size", "-1"},
        {"prune", "--max-size", "12Q"},
        {"prune", "--older-than", "+5"},
        {"prune", "--older-than", " 5"},
        {"prune", "--older-than", "5y"},
        {"prune", "--older-than", "99999999999999999999"},
        {"prune", "--older-than", "1d", "--max-size", "1"},
        {"prune", "--keep", "1"},
        {"export"},
        {"export", ""},
        {"export", "a", "b"},
        {"import"},
        {"import", ""},
        {"import", "a", "b"},
        {"frobnicate"},
        {"--verbose", "ls"},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        const char *argv[12] = {"--dir", dir};
        for (int j = 0; j < 8 && lines[i][j]; j++) argv[2 + j] = lines[i][j];
        run_out o;
        run_tool(&o, pl.home, NULL, 30, argv);
        ck_assert_msg(o.status == 2, "'%s %s %s': exit %d: %s", argv[2], argv[3] ? argv[3] : "",
                      argv[3] && argv[4] ? argv[4] : "", o.status, o.text);
        ck_assert_msg(strstr(o.text, "ember-cache: "), "'%s': no message: %s", argv[2], o.text);
        ck_assert_msg(!exists(dir), "'%s %s': the usage error created %s", argv[2],
                      argv[3] ? argv[3] : "", dir);
    }
    /* the global options' own errors */
    const char *const globals[][6] = {
        {"--dir"}, {"ls", "--dir"}, {"--dir", "--json", "ls"}, {"--dir", "a", "--dir", "b", "ls"},
        {"--json"}, {"-x", "ls"},
    };
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++) {
        run_out o;
        run_tool(&o, pl.home, NULL, 30, globals[i]);
        ck_assert_msg(o.status == 2, "'%s %s': exit %d: %s", globals[i][0],
                      globals[i][1] ? globals[i][1] : "", o.status, o.text);
    }
    ck_assert(!exists(pl.dflt));
    place_remove(&pl);
}
END_TEST

/* ---- item 10: bundles ---- */

/* The whole file at path (malloc'd, NUL-terminated). */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)len + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void spit(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

/* A bundle of this machine, made by the tool from a cache of n entries. */
/* b without its lines that start with prefix. */
static size_t drop_lines(char *b, size_t n, const char *prefix) {
    size_t out = 0, pl = strlen(prefix);
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(b + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (b + i)) + 1 : n - i;
        if (!(len >= pl && !memcmp(b + i, prefix, pl))) memmove(b + out, b + i, len), out += len;
        i += len;
    }
    return out;
}

/* A bundle of n CPU entries, as this machine exports it, without the
 * optional CUDA tags a GPU machine adds (their check would ask the GPU,
 * whose driver alone takes ~140 MB: the memory bounds below are about
 * the bundle, not the driver). */
static char *exported(const place *pl, int n, size_t *len) {
    char src[160], bundle[160];
    snprintf(src, sizeof src, "%s/src", pl->root);
    snprintf(bundle, sizeof bundle, "%s/good.ember", pl->root);
    fill(src, n);
    run_out o;
    TOOL(&o, pl->home, NULL, 30, "--dir", src, "export", bundle);
    ck_assert_msg(o.status == 0, "export: %s", o.text);
    char *b = slurp(bundle, len);
    *len = drop_lines(b, *len, "tag cuda=");
    *len = drop_lines(b, *len, "tag nvrtc=");
    return b;
}

START_TEST(import_of_a_fifo_returns_at_once) {
    place pl;
    place_make(&pl);
    char fifo[160], dir[160];
    snprintf(fifo, sizeof fifo, "%s/bundle.fifo", pl.root);
    snprintf(dir, sizeof dir, "%s/cache", pl.root);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    run_out o;
    TOOL(&o, pl.home, NULL, 10, "--dir", dir, "import", fifo);
    ck_assert_msg(!o.timed_out, "import of a FIFO still blocked after 10 s");
    ck_assert_msg(o.status == 1, "exit %d: %s", o.status, o.text);
    ck_assert_msg(strstr(o.text, "not a regular file"), "%s", o.text);
    TOOL(&o, pl.home, NULL, 10, "--dir", dir, "import", pl.root); /* a directory */
    ck_assert_msg(o.status == 1 && strstr(o.text, "not a regular file"), "%s", o.text);
    /* a warmup list that is a FIFO: the same */
    TOOL(&o, pl.home, NULL, 10, "--dir", dir, "warmup", fifo);
    ck_assert_msg(!o.timed_out, "warmup of a FIFO still blocked after 10 s");
    ck_assert_msg(o.status == 1 && strstr(o.text, "not a regular file"), "%d: %s", o.status, o.text);
    place_remove(&pl);
}
END_TEST

START_TEST(a_bundle_missing_a_tag_is_refused) {
    place pl;
    place_make(&pl);
    size_t n;
    char *good = exported(&pl, 3, &n);
    char path[160], dir[160];
    snprintf(path, sizeof path, "%s/bad.ember", pl.root);
    snprintf(dir, sizeof dir, "%s/dst", pl.root);
    /* the control: the bundle as exported imports */
    run_out o;
    snprintf(path, sizeof path, "%s/good.ember", pl.root);
    TOOL(&o, pl.home, NULL, 30, "--dir", dir, "import", path);
    ck_assert_msg(o.status == 0 && strstr(o.text, "import: 3 entries"), "%s", o.text);
    snprintf(path, sizeof path, "%s/bad.ember", pl.root);
    const char *drops[] = {"tag ", "tag cpu=", "tag cache-format="};
    for (size_t i = 0; i < sizeof drops / sizeof drops[0]; i++) {
        char *b = malloc(n);
        memcpy(b, good, n);
        spit(path, b, drop_lines(b, n, drops[i]));
        free(b);
        char d[200];
        snprintf(d, sizeof d, "%s/dst%zu", pl.root, i);
        TOOL(&o, pl.home, NULL, 30, "--dir", d, "import", path);
        ck_assert_msg(o.status == 1, "without '%s' lines: exit %d: %s", drops[i], o.status, o.text);
        ck_assert_msg(strstr(o.text, "refusing") && strstr(o.text, "has no"), "%s", o.text);
        ck_assert_uint_eq(entries(d), 0);
    }
    free(good);
    place_remove(&pl);
}
END_TEST

/* A bundle whose one entry claims size bytes of zeros (a sparse file: no
 * disk), with checksum sum (32 hex), this machine's tags from a real
 * export. */
static void sparse_bundle(const place *pl, const char *path, uint64_t size, const char *sum) {
    size_t n;
    char *good = exported(pl, 1, &n);
    char *end = strstr(good, "\nentry "); /* the header and tag lines end there */
    ck_assert_ptr_nonnull(end);
    end++;
    char head[2048];
    int hn = snprintf(head, sizeof head, "%.*sentry 0123456789abcdef0123456789abcdef so %" PRIu64
                      " %s\n", (int)(end - good), good, size, sum);
    free(good);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, head, (size_t)hn), hn);
    ck_assert_int_eq(ftruncate(fd, hn + (off_t)size), 0);
    ck_assert_int_eq(lseek(fd, 0, SEEK_END), hn + (off_t)size);
    ck_assert_int_eq(write(fd, "\nend 1\n", 7), 7);
    close(fd);
}

/* The checksum of n zero bytes, as 32 hex digits. */
static void zeros_sum(uint64_t n, char hex[KC_KEY_HEX_SIZE]) {
    char tmp[] = "/tmp/ember-zeros-XXXXXX";
    int fd = mkstemp(tmp);
    ck_assert_int_ge(fd, 0);
    unlink(tmp);
    ck_assert_int_eq(ftruncate(fd, (off_t)n), 0);
    kc_sum s;
    uint64_t got;
    ck_assert(kc_checksum_fd(fd, &s, &got));
    ck_assert_uint_eq(got, n);
    close(fd);
    kc_key k;
    memcpy(k.bytes, s.bytes, 16);
    kc_key_hex(&k, hex);
}

/* The tool's peak memory doing nothing much, for the bounds below. */
static long base_rss(const place *pl, const char *dir) {
    run_out o;
    TOOL(&o, pl->home, NULL, 30, "--dir", dir, "stats");
    ck_assert_int_eq(o.status, 0);
    return o.maxrss_kb;
}

START_TEST(a_huge_entry_is_refused_before_it_is_read) {
    place pl;
    place_make(&pl);
    char path[160], dir[160];
    snprintf(path, sizeof path, "%s/huge.ember", pl.root);
    snprintf(dir, sizeof dir, "%s/dst", pl.root);
    sparse_bundle(&pl, path, (uint64_t)1 << 30, "00000000000000000000000000000000");
    long base = base_rss(&pl, dir);
    run_out o;
    TOOL(&o, pl.home, NULL, 60, "--dir", dir, "import", path);
    ck_assert_msg(o.status == 1, "exit %d: %s", o.status, o.text);
    ck_assert_msg(strstr(o.text, "over the limit"), "%s", o.text);
    /* refused from its size alone: no GiB read into memory */
    ck_assert_msg(o.maxrss_kb < base + 16 * 1024, "peak %ld kB (idle: %ld kB)", o.maxrss_kb, base);
    ck_assert_int_eq(files_under(dir), 0);
    /* and the cache's own size limit bounds an entry further */
    char sum[KC_KEY_HEX_SIZE];
    zeros_sum((uint64_t)2 << 20, sum);
    sparse_bundle(&pl, path, (uint64_t)2 << 20, sum);
    const char *const limit[] = {"EMBER_CACHE_MAX_SIZE=1M", NULL};
    TOOL(&o, pl.home, limit, 30, "--dir", dir, "import", path);
    ck_assert_msg(o.status == 1 && strstr(o.text, "over the limit"), "%d: %s", o.status, o.text);
    ck_assert_int_eq(files_under(dir), 0);
    TOOL(&o, pl.home, NULL, 30, "--dir", dir, "import", path); /* no limit: it fits */
    ck_assert_msg(o.status == 0, "%d: %s", o.status, o.text);
    ck_assert_uint_eq(entries(dir), 1);
    place_remove(&pl);
}
END_TEST

START_TEST(a_large_entry_streams_and_a_bad_checksum_leaves_nothing) {
    place pl;
    place_make(&pl);
    char path[160], dir[160];
    snprintf(path, sizeof path, "%s/large.ember", pl.root);
    snprintf(dir, sizeof dir, "%s/dst", pl.root);
    const uint64_t size = (uint64_t)96 << 20;
    sparse_bundle(&pl, path, size, "00000000000000000000000000000000");
    long base = base_rss(&pl, dir);
    run_out o;
    TOOL(&o, pl.home, NULL, 60, "--dir", dir, "import", path);
    ck_assert_msg(o.status == 1 && strstr(o.text, "fails its checksum"), "%d: %s", o.status, o.text);
    ck_assert_msg(o.maxrss_kb < base + 32 * 1024, "peak %ld kB for a %" PRIu64 " MiB entry (idle: "
                  "%ld kB): not streamed", o.maxrss_kb, size >> 20, base);
    ck_assert_int_eq(files_under(dir), 0); /* no entry, no temporary */
    /* the same entry with its right checksum imports, in bounded memory */
    char sum[KC_KEY_HEX_SIZE];
    zeros_sum(size, sum);
    sparse_bundle(&pl, path, size, sum);
    TOOL(&o, pl.home, NULL, 60, "--dir", dir, "import", path);
    ck_assert_msg(o.status == 0, "%d: %s", o.status, o.text);
    ck_assert_msg(o.maxrss_kb < base + 32 * 1024, "peak %ld kB (idle: %ld kB)", o.maxrss_kb, base);
    ck_assert_uint_eq(entries(dir), 1);
    ck_assert_int_eq(files_under(dir), 2); /* payload and header: no temporary left */
    place_remove(&pl);
}
END_TEST

/* ---- item 16: --json is JSON ---- */

/* A strict JSON checker (RFC 8259): advances *p past one value; false on
 * anything else.  Strings must be UTF-8 without raw control characters. */
static bool json_value(const char **p, int depth);

static void json_ws(const char **p) {
    while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r') (*p)++;
}

static bool json_string(const char **p) {
    const unsigned char *s = (const unsigned char *)*p;
    if (*s++ != '"') return false;
    while (*s != '"') {
        if (*s < 0x20) return false; /* the NUL too: unterminated */
        if (*s == '\\') {
            s++;
            if (*s == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", s[i]) || !s[i]) return false;
                s += 5;
            } else if (*s && strchr("\"\\/bfnrt", *s)) {
                s++;
            } else {
                return false;
            }
        } else if (*s < 0x80) {
            s++;
        } else {
            int n = (*s & 0xe0) == 0xc0 ? 2 : (*s & 0xf0) == 0xe0 ? 3 : (*s & 0xf8) == 0xf0 ? 4 : 0;
            if (n == 0 || (n == 2 && *s < 0xc2)) return false;
            for (int i = 1; i < n; i++)
                if ((s[i] & 0xc0) != 0x80) return false;
            s += n;
        }
    }
    *p = (const char *)s + 1;
    return true;
}

static bool json_number(const char **p) {
    const char *s = *p;
    if (*s == '-') s++;
    if (*s == '0') s++;
    else if (*s >= '1' && *s <= '9') while (*s >= '0' && *s <= '9') s++;
    else return false;
    if (*s == '.') {
        if (*++s < '0' || *s > '9') return false;
        while (*s >= '0' && *s <= '9') s++;
    }
    if (*s == 'e' || *s == 'E') {
        if (*++s == '+' || *s == '-') s++;
        if (*s < '0' || *s > '9') return false;
        while (*s >= '0' && *s <= '9') s++;
    }
    *p = s;
    return true;
}

/* '[' value, ... ']' or '{' string: value, ... '}' */
static bool json_list(const char **p, int depth, char close) {
    (*p)++;
    json_ws(p);
    if (**p == close) return (*p)++, true;
    for (;;) {
        json_ws(p);
        if (close == '}') {
            if (!json_string(p)) return false;
            json_ws(p);
            if (*(*p)++ != ':') return false;
        }
        if (!json_value(p, depth + 1)) return false;
        json_ws(p);
        if (**p == close) return (*p)++, true;
        if (*(*p)++ != ',') return false;
    }
}

static bool json_value(const char **p, int depth) {
    json_ws(p);
    if (depth > 64) return false;
    switch (**p) {
    case '{': return json_list(p, depth, '}');
    case '[': return json_list(p, depth, ']');
    case '"': return json_string(p);
    case 't': return !strncmp(*p, "true", 4) && (*p += 4, true);
    case 'f': return !strncmp(*p, "false", 5) && (*p += 5, true);
    case 'n': return !strncmp(*p, "null", 4) && (*p += 4, true);
    default: return json_number(p);
    }
}

/* Whether text is exactly one JSON value (and whitespace). */
static bool is_json(const char *text) {
    const char *p = text;
    if (!json_value(&p, 0)) return false;
    json_ws(&p);
    return *p == '\0';
}

START_TEST(json_checker_knows_json) {
    const char *good[] = {"{}", "[]", "{\"a\":[1,-2.5e3,true,false,null,\"x\\\"\\\\\\u00e9\"]}\n",
                          "\"\xc3\xa9\"", "0"};
    const char *bad[] = {"{", "{\"a\":1,}", "\"a\"b\"", "\"\t\"", "\"\\x\"", "\"\xff\"", "01",
                         "{\"a\" 1}", "[1 2]", "\"abc", "{}{}", "nul"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) ck_assert_msg(is_json(good[i]), "%s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) ck_assert_msg(!is_json(bad[i]), "%s", bad[i]);
}
END_TEST

START_TEST(json_output_is_json_whatever_the_paths_hold) {
    place pl;
    place_make(&pl);
    /* a quote, a backslash, a tab, a newline, a control byte, a byte that
     * is not UTF-8, and a character that is */
    char dir[200], bundle[240];
    snprintf(dir, sizeof dir, "%s/q\"b\\s\tt\nn\x01" "c\xff" "f\xc3\xa9", pl.root);
    snprintf(bundle, sizeof bundle, "%s/b\"und\\le\x02.ember", pl.root);
    fill(dir, 2);
    /* a bad entry, so that verify names a path */
    kc_key k = key_of(0);
    char hex[KC_KEY_HEX_SIZE], payload[300];
    kc_key_hex(&k, hex);
    snprintf(payload, sizeof payload, "%s/v1/%.2s/%s.so", dir, hex, hex);
    spit(payload, "damaged", 7);
    const char *const cmds[][3] = {{"stats"}, {"ls"}, {"verify"}, {"export", bundle},
                                   {"import", bundle}, {"prune", "--max-size", "1G"}, {"clear"}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        run_out o;
        const char *argv[8] = {"--json", "--dir", dir, cmds[i][0], cmds[i][1], cmds[i][2]};
        const char *const quiet[] = {"EMBER_LOG=", NULL};
        stdout_only = true;
        run_tool(&o, pl.home, quiet, 30, argv);
        stdout_only = false;
        ck_assert_msg(o.status == 0 || (i == 2 && o.status == 1), "%s: exit %d: %s", cmds[i][0],
                      o.status, o.text);
        ck_assert_msg(is_json(o.text), "%s --json is not JSON:\n%s", cmds[i][0], o.text);
    }
    place_remove(&pl);
}
END_TEST

int main(void) {
    const tu_test tests[] = {
        {"an_empty_dir_is_a_usage_error_and_the_default_cache_stays", an_empty_dir_is_a_usage_error_and_the_default_cache_stays},
        {"an_unusable_EMBER_CACHE_DIR_never_becomes_the_default", an_unusable_EMBER_CACHE_DIR_never_becomes_the_default},
        {"usage_errors_exit_2_and_touch_nothing", usage_errors_exit_2_and_touch_nothing},
        {"import_of_a_fifo_returns_at_once", import_of_a_fifo_returns_at_once},
        {"a_bundle_missing_a_tag_is_refused", a_bundle_missing_a_tag_is_refused},
        {"a_huge_entry_is_refused_before_it_is_read", a_huge_entry_is_refused_before_it_is_read},
        {"a_large_entry_streams_and_a_bad_checksum_leaves_nothing", a_large_entry_streams_and_a_bad_checksum_leaves_nothing},
        {"json_checker_knows_json", json_checker_knows_json},
        {"json_output_is_json_whatever_the_paths_hold", json_output_is_json_whatever_the_paths_hold},
    };
    return tu_run(tu_suite("tool", tests, sizeof tests / sizeof tests[0], 120));
}
