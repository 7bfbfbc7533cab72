/* test_remote.c - the remote cache tier against a real redis-server that
 * the suite starts itself (a free loopback port, a temporary directory,
 * killed with the suite even when it crashes): two cache directories
 * sharing one server behave as two machines of a fleet; a server killed
 * mid-run, one that accepts and never answers, tampered, truncated,
 * unsigned and misfiled entries, a wrong key, eight processes publishing
 * at once, push/pull through the tool, configuration errors, and a
 * password that never reaches a log. */
#include "config.h"

#include "testutil.h"

#include "cache.h"
#include "eager.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define C 40

/* ---- a redis-server of our own ---- */

typedef struct server {
    pid_t pid;
    int port;
    char dir[64];
    char url[96];
} server;

static const char *redis_binary(void) {
    const char *b = getenv("EMBER_REDIS_SERVER");
    return b && *b ? b : NULL;
}

/* A port no one listens on now (the kernel's choice); 0 on failure. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &n) == 0;
    if (fd >= 0) close(fd);
    return ok ? ntohs(a.sin_port) : 0;
}

/* Whether a PING on port gets +PONG (or, with a password set, -NOAUTH). */
static bool answers(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char buf[64] = "";
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              write(fd, "PING\r\n", 6) == 6 && read(fd, buf, sizeof buf - 1) > 0 &&
              (!strncmp(buf, "+PONG", 5) || !strncmp(buf, "-NOAUTH", 7));
    if (fd >= 0) close(fd);
    return ok;
}

/* Starts redis-server (with password when given); it dies with the
 * process that started it.  false when it does not come up. */
static bool server_start(server *s, const char *password) {
    memset(s, 0, sizeof s[0]);
    snprintf(s->dir, sizeof s->dir, "/tmp/ember-redis-XXXXXX");
    if (!mkdtemp(s->dir)) return false;
    for (int attempt = 0; attempt < 5; attempt++) {
        s->port = free_port();
        char port[16], log[128];
        snprintf(port, sizeof port, "%d", s->port);
        snprintf(log, sizeof log, "%s/redis.log", s->dir);
        pid_t parent = getpid();
        if (!s->port || (s->pid = fork()) < 0) return false;
        if (s->pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the suite */
            if (getppid() != parent) _exit(1);
            int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
            execl(redis_binary(), "redis-server", "--port", port, "--bind", "127.0.0.1",
                  "--save", "", "--appendonly", "no", "--dir", s->dir,
                  password ? "--requirepass" : NULL, password, (char *)NULL);
            _exit(127);
        }
        for (int i = 0; i < 500 && !answers(s->port); i++) usleep(10000);
        if (answers(s->port)) break;
        kill(s->pid, SIGKILL); /* the port was taken meanwhile: another one */
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
    snprintf(s->url, sizeof s->url, "redis://127.0.0.1:%d/0", s->port);
    return s->pid > 0;
}

static void server_stop(server *s) {
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s->dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", s->dir);
}

/* The suite's shared server: started by main; each test works in a
 * namespace of its own (EMBER_CACHE_REMOTE_PREFIX). */
static server shared;

/* ---- a test's files: cache directories, keys, a namespace ---- */

typedef struct fixture {
    char root[64];
    char key[96], key2[96]; /* two signing keys: the fleet's, and a stranger's */
    char prefix[48];
} fixture;

static void write_key(const char *path, const char *text, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ck_assert_int_eq(chmod(path, mode), 0);
}

static void fixture_make(fixture *f) {
    static int serial;
    snprintf(f->root, sizeof f->root, "/tmp/ember-remote-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->root));
    snprintf(f->key, sizeof f->key, "%s/fleet.key", f->root);
    snprintf(f->key2, sizeof f->key2, "%s/other.key", f->root);
    write_key(f->key, "0123456789abcdef0123456789abcdef\n", 0600);
    write_key(f->key2, "fedcba9876543210fedcba9876543210\n", 0600);
    snprintf(f->prefix, sizeof f->prefix, "t%d-%d:", (int)getpid(), serial++);
    setenv("EMBER_CACHE_REMOTE", shared.url, 1);
    setenv("EMBER_CACHE_KEY_FILE", f->key, 1);
    setenv("EMBER_CACHE_REMOTE_PREFIX", f->prefix, 1);
    unsetenv("EMBER_CACHE_REMOTE_TIMEOUT");
    unsetenv("EMBER_CACHE_REMOTE_PASSWORD");
    unsetenv("EMBER_LOG");
    unsetenv("EMBER_LOG_FILE");
    unsetenv("EMBER_RECORD");
}

static void fixture_free(const fixture *f) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->root);
    ck_assert_int_eq(system(cmd), 0);
}

static void path_in(const fixture *f, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s", f->root, name);
}

/* Collects a cache's warnings (kc_options.log). */
typedef struct said {
    char text[4096];
} said;

static void hear(void *ud, const char *msg) {
    said *s = ud;
    size_t n = strlen(s->text);
    snprintf(s->text + n, sizeof s->text - n, "%s\n", msg);
}

static kc_cache *open_cache(const fixture *f, const char *dir_name, said *s) {
    char dir[128];
    path_in(f, dir_name, dir, sizeof dir);
    kc_options o = {.dir = dir, .log = s ? hear : NULL, .log_ud = s};
    kc_cache *c = kc_open_with(&o);
    ck_assert_ptr_nonnull(c);
    return c;
}

static kc_key key_of(const char *text) {
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, text);
    return kc_hasher_digest(&h);
}

static kc_counters counters(kc_cache *c) {
    kc_counters k;
    ck_assert_int_eq(kc_stats(c, &k), EM_OK);
    return k;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* The remote name of (k, kind). */
static void name_of(const kc_key *k, const char *kind, char *out, size_t n) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(k, hex);
    snprintf(out, n, "%s.%s", hex, kind);
}

/* A raw connection to the shared server, in f's namespace. */
static kc_remote *raw(const fixture *f) {
    char why[256];
    kc_remote *r = kc_remote_open(shared.url, NULL, f->prefix, 1000, why, sizeof why);
    ck_assert_msg(r != NULL, "%s", why);
    return r;
}

/* ---- a compiled program, run in a child process: one "machine" ---- */

static em_status softmax_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    out[0] = em_softmax(em_mul_scalar(in[0], 0.5), -1);
    return out[0] ? EM_OK : em_last_status();
}

typedef struct run_result {
    int64_t compiled, loaded, graphs_loaded;
    bool values_ok;
    double ms;
} run_result;

/* Compiles softmax(x / 2) and calls it twice on rows x C, checking the
 * values against float64; in a child with EMBER_CACHE_DIR=root/dir_name. */
static run_result run_child(const fixture *f, const char *dir_name, int rows) {
    char dir[128];
    path_in(f, dir_name, dir, sizeof dir);
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(p[0]);
        setenv("EMBER_CACHE_DIR", dir, 1);
        run_result r = {.values_ok = true};
        double t0 = now_ms();
        em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "softmax", .dynamic = -1};
        em_compiled *fn = em_compile(softmax_fn, NULL, &o);
        em_tensor *x = tu_random(5 + (uint64_t)rows, 2, TU_SIZES(rows, C), EM_F32, 2), *y = NULL;
        for (int i = 0; i < 2; i++)
            if (!fn || em_call(fn, &x, NULL, &y) != EM_OK) _exit(3);
        double *xv = tu_values(x), *yv = tu_values(y);
        for (int i = 0; i < rows; i++) {
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < C; j++) m = fmax(m, 0.5 * xv[i * C + j]);
            for (int j = 0; j < C; j++) sum += exp(0.5 * xv[i * C + j] - m);
            for (int j = 0; j < C; j++)
                if (fabs(yv[i * C + j] - exp(0.5 * xv[i * C + j] - m) / sum) > 1e-6) r.values_ok = false;
        }
        free(xv);
        free(yv);
        em_compile_stats st;
        em_compiled_stats(fn, &st);
        r.compiled = st.kernels_compiled;
        r.loaded = st.kernels_loaded;
        r.graphs_loaded = st.graphs_loaded;
        r.ms = now_ms() - t0;
        em_compiled_free(fn);
        _exit(write(p[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 4);
    }
    close(p[1]);
    run_result r;
    memset(&r, 0, sizeof r);
    ssize_t got = read(p[0], &r, sizeof r);
    close(p[0]);
    int status;
    waitpid(pid, &status, 0);
    ck_assert_msg(got == (ssize_t)sizeof r && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the child failed (status %d)", status);
    return r;
}

static char *read_file(const char *path) {
    FILE *fp = fopen(path, "r");
    static char buf[1 << 16];
    size_t n = fp ? fread(buf, 1, sizeof buf - 1, fp) : 0;
    buf[n] = '\0';
    if (fp) fclose(fp);
    return buf;
}

/* ---- tests ---- */

START_TEST(two_cache_dirs_sharing_a_server_are_two_machines) {
    fixture f;
    fixture_make(&f);
    run_result a = run_child(&f, "a", 6);
    ck_assert(a.values_ok);
    ck_assert_int_gt(a.compiled, 0);
    /* the second machine: its own empty directory, the same server */
    run_result b = run_child(&f, "b", 6);
    ck_assert(b.values_ok);
    ck_assert_int_eq(b.compiled, 0);
    ck_assert_int_eq(b.loaded, a.compiled);
    ck_assert_int_eq(b.graphs_loaded, 1);
    /* what it fetched is now on its disk: a third run needs no server */
    kc_cache *c = open_cache(&f, "b", NULL);
    kc_entry_info *es;
    size_t n;
    ck_assert_int_eq(kc_list(c, &es, &n), EM_OK);
    ck_assert_uint_eq(n, (size_t)a.compiled + 1); /* its kernels and the plan */
    em_free(es);
    kc_remote_info info;
    ck_assert_int_eq(kc_remote_stats(c, &info), EM_OK);
    ck_assert_uint_eq(info.entries, 2 * n); /* and their key manifests (why_*) */
    kc_close(c);
    setenv("EMBER_CACHE_REMOTE", "", 1);
    run_result b2 = run_child(&f, "b", 6);
    ck_assert(b2.values_ok);
    ck_assert_int_eq(b2.compiled, 0);
    fixture_free(&f);
}
END_TEST

START_TEST(lookup_order_and_counters) {
    fixture f;
    fixture_make(&f);
    kc_cache *a = open_cache(&f, "a", NULL), *b = open_cache(&f, "b", NULL);
    ck_assert_str_eq(kc_remote_url(a), shared.url);
    kc_key k = key_of("lookup order");
    ck_assert_int_eq(kc_put(a, &k, "so", "kernel bytes", 12), EM_OK);
    ck_assert_uint_eq(counters(a).remote_writes, 1);
    void *d;
    size_t n;
    ck_assert_int_eq(kc_get(b, &k, "so", &d, &n), EM_OK);
    ck_assert_ptr_nonnull(d);
    ck_assert_mem_eq(d, "kernel bytes", 12);
    em_free(d);
    kc_counters cb = counters(b);
    ck_assert_uint_eq(cb.remote_hits, 1);
    ck_assert_uint_eq(cb.misses, 0);
    ck_assert_uint_eq(cb.writes, 1); /* written to b's disk */
    /* the second lookup is local */
    int fd;
    ck_assert_int_eq(kc_get_fd(b, &k, "so", &fd), EM_OK);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_uint_eq(counters(b).remote_hits, 1);
    /* a key no one has: a remote miss, then the caller compiles */
    kc_key none = key_of("never stored");
    char *path;
    ck_assert_int_eq(kc_get_file(b, &none, "so", &path), EM_OK);
    ck_assert_ptr_null(path);
    ck_assert_uint_eq(counters(b).remote_misses, 1);
    ck_assert_uint_eq(counters(b).misses, 1);
    /* a fresh cache gets a file through kc_get_file too */
    kc_cache *c = open_cache(&f, "c", NULL);
    ck_assert_int_eq(kc_get_file(c, &k, "so", &path), EM_OK);
    ck_assert_ptr_nonnull(path);
    ck_assert_str_eq(read_file(path), "kernel bytes");
    em_free(path);
    kc_close(a);
    kc_close(b);
    kc_close(c);
    fixture_free(&f);
}
END_TEST

/* Replaces the server's copy of (k, kind) with what edit makes of it. */
typedef void (*edit_fn)(char *env, size_t *n);

static void flip_payload(char *env, size_t *n) { env[*n - 1] ^= 1; }
static void truncate_payload(char *env, size_t *n) { (void)env, *n -= 3; }
static void flip_header(char *env, size_t *n) {
    (void)n;
    char *p = strstr(env, "size ");
    p[5] = p[5] == '9' ? '8' : '9';
}
static void unsigned_bytes(char *env, size_t *n) {
    strcpy(env, "kernel bytes");
    *n = 12;
}

START_TEST(tampered_truncated_and_unsigned_entries_are_misses) {
    fixture f;
    fixture_make(&f);
    edit_fn edits[] = {flip_payload, truncate_payload, flip_header, unsigned_bytes};
    kc_remote *r = raw(&f);
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        char a_name[8], b_name[8], name[64], why[256];
        snprintf(a_name, sizeof a_name, "a%zu", e);
        snprintf(b_name, sizeof b_name, "b%zu", e);
        kc_cache *a = open_cache(&f, a_name, NULL);
        said heard = {""};
        kc_cache *b = open_cache(&f, b_name, &heard);
        char text[32];
        snprintf(text, sizeof text, "entry %zu", e);
        kc_key k = key_of(text);
        ck_assert_int_eq(kc_put(a, &k, "so", "0123456789kernel", 16), EM_OK);
        name_of(&k, "so", name, sizeof name);
        void *env;
        size_t n;
        ck_assert_int_eq(kc_remote_get(r, name, &env, &n, why, sizeof why), KC_REMOTE_OK);
        char *copy = malloc(n + 1);
        memcpy(copy, env, n);
        copy[n] = '\0';
        edits[e](copy, &n);
        ck_assert_int_eq(kc_remote_set(r, name, copy, n, true, why, sizeof why), KC_REMOTE_OK);
        free(copy);
        em_free(env);
        void *d;
        ck_assert_int_eq(kc_get(b, &k, "so", &d, &n), EM_OK);
        ck_assert_ptr_null(d);
        ck_assert_uint_eq(counters(b).remote_rejected, 1);
        ck_assert_uint_eq(counters(b).writes, 0); /* nothing reached b's disk */
        ck_assert_msg(strstr(heard.text, "rejected"), "%s", heard.text);
        /* b compiles and puts: the damaged server copy is replaced */
        ck_assert_int_eq(kc_put(b, &k, "so", "0123456789kernel", 16), EM_OK);
        kc_cache *c = open_cache(&f, "c", NULL);
        ck_assert_int_eq(kc_get(c, &k, "so", &d, &n), EM_OK);
        ck_assert_ptr_nonnull(d);
        ck_assert_mem_eq(d, "0123456789kernel", 16);
        em_free(d);
        kc_close(a);
        kc_close(b);
        kc_close(c);
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s/c", f.root);
        ck_assert_int_eq(system(cmd), 0);
    }
    /* a signed envelope copied under another key's name */
    kc_cache *a = open_cache(&f, "m", NULL), *b = open_cache(&f, "n", NULL);
    kc_key k1 = key_of("one"), k2 = key_of("two");
    ck_assert_int_eq(kc_put(a, &k1, "so", "one", 3), EM_OK);
    char n1[64], n2[64], why[256];
    name_of(&k1, "so", n1, sizeof n1);
    name_of(&k2, "so", n2, sizeof n2);
    void *env, *d;
    size_t n;
    ck_assert_int_eq(kc_remote_get(r, n1, &env, &n, why, sizeof why), KC_REMOTE_OK);
    ck_assert_int_eq(kc_remote_set(r, n2, env, n, true, why, sizeof why), KC_REMOTE_OK);
    em_free(env);
    ck_assert_int_eq(kc_get(b, &k2, "so", &d, &n), EM_OK);
    ck_assert_ptr_null(d);
    ck_assert_uint_eq(counters(b).remote_rejected, 1);
    kc_close(a);
    kc_close(b);
    kc_remote_close(r);
    fixture_free(&f);
}
END_TEST

START_TEST(a_compiled_program_never_loads_a_tampered_kernel) {
    fixture f;
    fixture_make(&f);
    run_result a = run_child(&f, "a", 5);
    ck_assert_int_gt(a.compiled, 0);
    /* every kernel on the server damaged, the plans left intact */
    kc_cache *c = open_cache(&f, "a", NULL);
    kc_entry_info *es;
    size_t ne;
    ck_assert_int_eq(kc_list(c, &es, &ne), EM_OK);
    kc_remote *r = raw(&f);
    int damaged = 0;
    for (size_t i = 0; i < ne; i++) {
        if (strcmp(es[i].kind, "so") != 0) continue;
        char name[64], why[256];
        name_of(&es[i].key, "so", name, sizeof name);
        void *env;
        size_t n;
        ck_assert_int_eq(kc_remote_get(r, name, &env, &n, why, sizeof why), KC_REMOTE_OK);
        ((char *)env)[n - 100] ^= 0x40;
        ck_assert_int_eq(kc_remote_set(r, name, env, n, true, why, sizeof why), KC_REMOTE_OK);
        em_free(env);
        damaged++;
    }
    ck_assert_int_gt(damaged, 0);
    em_free(es);
    kc_close(c);
    run_result b = run_child(&f, "b", 5);
    ck_assert(b.values_ok);
    ck_assert_int_eq(b.compiled, a.compiled); /* all compiled again, none loaded */
    ck_assert_int_eq(b.loaded, 0);
    /* and its compiles repaired the server: a third machine loads them */
    run_result c3 = run_child(&f, "c", 5);
    ck_assert(c3.values_ok);
    ck_assert_int_eq(c3.compiled, 0);
    kc_remote_close(r);
    fixture_free(&f);
}
END_TEST

START_TEST(a_wrong_key_is_a_miss_and_replaces_nothing) {
    fixture f;
    fixture_make(&f);
    kc_cache *a = open_cache(&f, "a", NULL);
    kc_key k = key_of("fleet entry");
    ck_assert_int_eq(kc_put(a, &k, "plan", "plan text", 9), EM_OK);
    setenv("EMBER_CACHE_KEY_FILE", f.key2, 1);
    said heard = {""};
    kc_cache *b = open_cache(&f, "b", &heard);
    void *d;
    size_t n;
    ck_assert_int_eq(kc_get(b, &k, "plan", &d, &n), EM_OK);
    ck_assert_ptr_null(d);
    ck_assert_uint_eq(counters(b).remote_rejected, 1);
    ck_assert_msg(strstr(heard.text, "signed with another key"), "%s", heard.text);
    /* b's own put does not replace the fleet's entry */
    ck_assert_int_eq(kc_put(b, &k, "plan", "other text", 10), EM_OK);
    ck_assert_uint_eq(counters(b).remote_writes, 0);
    setenv("EMBER_CACHE_KEY_FILE", f.key, 1);
    kc_cache *c = open_cache(&f, "c", NULL);
    ck_assert_int_eq(kc_get(c, &k, "plan", &d, &n), EM_OK);
    ck_assert_ptr_nonnull(d);
    ck_assert_mem_eq(d, "plan text", 9);
    em_free(d);
    kc_close(a);
    kc_close(b);
    kc_close(c);
    fixture_free(&f);
}
END_TEST

START_TEST(a_server_killed_mid_run_leaves_calls_correct) {
    fixture f;
    fixture_make(&f);
    server own;
    ck_assert_msg(server_start(&own, NULL), "redis-server did not start (%s)", own.dir);
    setenv("EMBER_CACHE_REMOTE", own.url, 1);
    said heard = {""};
    kc_cache *a = open_cache(&f, "a", &heard);
    kc_key k = key_of("before");
    ck_assert_int_eq(kc_put(a, &k, "so", "x", 1), EM_OK);
    ck_assert_uint_eq(counters(a).remote_writes, 1);
    kill(own.pid, SIGKILL);
    waitpid(own.pid, NULL, 0);
    own.pid = 0;
    /* a lookup and a put on the dead server: local work, one warning */
    kc_key k2 = key_of("after");
    void *d;
    size_t n;
    double t0 = now_ms();
    ck_assert_int_eq(kc_get(a, &k2, "so", &d, &n), EM_OK);
    ck_assert_ptr_null(d);
    ck_assert_int_eq(kc_put(a, &k2, "so", "y", 1), EM_OK);
    ck_assert_int_eq(kc_get(a, &k2, "so", &d, &n), EM_OK);
    ck_assert_ptr_nonnull(d);
    em_free(d);
    ck_assert_double_lt(now_ms() - t0, 2 * KC_REMOTE_TIMEOUT_MS + 100);
    ck_assert_uint_eq(counters(a).remote_errors, 1); /* then the tier rests */
    ck_assert_msg(strstr(heard.text, "remote tier") && strstr(heard.text, "locally"), "%s", heard.text);
    kc_close(a);
    /* a whole program against the dead server: right values, compiled here */
    run_result r = run_child(&f, "b", 7);
    ck_assert(r.values_ok);
    ck_assert_int_gt(r.compiled, 0);
    server_stop(&own);
    fixture_free(&f);
}
END_TEST

START_TEST(a_server_that_never_answers_costs_one_timeout) {
    fixture f;
    fixture_make(&f);
    /* a socket that listens and never reads: connect succeeds, no reply */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", ntohs(sa.sin_port));
    setenv("EMBER_CACHE_REMOTE", url, 1);
    setenv("EMBER_CACHE_REMOTE_TIMEOUT", "150", 1);
    said heard = {""};
    kc_cache *a = open_cache(&f, "a", &heard);
    kc_key k = key_of("silence");
    void *d;
    size_t n;
    double t0 = now_ms();
    ck_assert_int_eq(kc_get(a, &k, "so", &d, &n), EM_OK);
    double first = now_ms() - t0;
    ck_assert_ptr_null(d);
    ck_assert_double_ge(first, 140);
    ck_assert_double_lt(first, 150 + 250);
    /* resting: no more waits (each would take 150 ms: 20 lookups, 3 s) */
    kc_key other = key_of("other");
    t0 = now_ms();
    for (int i = 0; i < 20; i++) ck_assert_int_eq(kc_get(a, &other, "so", &d, &n), EM_OK);
    ck_assert_double_lt(now_ms() - t0, 1000);
    ck_assert_int_eq(kc_put(a, &k, "so", "z", 1), EM_OK);
    kc_counters ka = counters(a);
    ck_assert_uint_eq(ka.remote_errors, 1);
    ck_assert_uint_eq(ka.remote_writes, 0);
    ck_assert_uint_eq(ka.remote_misses, 0);
    ck_assert_msg(strstr(heard.text, "remote tier"), "%s", heard.text);
    kc_close(a);
    run_result r = run_child(&f, "b", 3);
    ck_assert(r.values_ok);
    close(fd);
    fixture_free(&f);
}
END_TEST

START_TEST(eight_processes_publishing_the_same_keys) {
    fixture f;
    fixture_make(&f);
    enum { N = 8 };
    int go[2];
    ck_assert_int_eq(pipe(go), 0);
    pid_t pids[N];
    for (int p = 0; p < N; p++) {
        pids[p] = fork();
        ck_assert_int_ge(pids[p], 0);
        if (pids[p] == 0) {
            close(go[1]);
            char c;
            if (read(go[0], &c, 1) != 0) _exit(5); /* released together: EOF */
            char dir[8];
            snprintf(dir, sizeof dir, "p%d", p);
            run_result r = run_child(&f, dir, 4);
            _exit(r.values_ok ? 0 : 6);
        }
    }
    close(go[0]);
    close(go[1]);
    for (int p = 0; p < N; p++) {
        int status;
        waitpid(pids[p], &status, 0);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d: status %d", p, status);
    }
    run_result last = run_child(&f, "last", 4);
    ck_assert(last.values_ok);
    ck_assert_int_eq(last.compiled, 0);
    fixture_free(&f);
}
END_TEST

START_TEST(push_pull_and_remote_stats_through_the_tool) {
    fixture f;
    fixture_make(&f);
    setenv("EMBER_CACHE_REMOTE", "", 1); /* compiled with the remote tier off */
    run_result a = run_child(&f, "a", 6);
    ck_assert_int_gt(a.compiled, 0);
    setenv("EMBER_CACHE_REMOTE", shared.url, 1);
    kc_cache *ca = open_cache(&f, "a", NULL);
    kc_entry_info *es;
    size_t ne;
    ck_assert_int_eq(kc_list(ca, &es, &ne), EM_OK);
    em_free(es);
    kc_close(ca);
    int na = (int)ne; /* kernels, plan, and their key manifests */
    ck_assert_int_eq(na, 2 * ((int)a.compiled + 1));
    char out[8192];
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/a push", f.root), 0);
    char want[192];
    snprintf(want, sizeof want, "push: %d entries to %s", na, shared.url);
    ck_assert_msg(strstr(out, want), "%s", out);
    ck_assert_int_eq(tu_tool(out, sizeof out, "--json --dir %s/a stats --remote", f.root), 0);
    snprintf(want, sizeof want, "\"entries\":%d,", na);
    ck_assert_msg(strstr(out, want), "%s", out);
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/b pull", f.root), 0);
    snprintf(want, sizeof want, "pull: %d entries fetched", na);
    ck_assert_msg(strstr(out, want), "%s", out);
    ck_assert_int_eq(tu_tool(out, sizeof out, "--json --dir %s/b pull", f.root), 0);
    snprintf(want, sizeof want, "\"fetched\":0,\"present\":%d,\"rejected\":0", na);
    ck_assert_msg(strstr(out, want), "%s", out);
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/b verify", f.root), 0);
    setenv("EMBER_CACHE_REMOTE", "", 1);
    run_result b = run_child(&f, "b", 6); /* from the pulled entries alone */
    ck_assert(b.values_ok);
    ck_assert_int_eq(b.compiled, 0);
    /* another key's pull rejects everything and says so (exit 1) */
    setenv("EMBER_CACHE_REMOTE", shared.url, 1);
    setenv("EMBER_CACHE_KEY_FILE", f.key2, 1);
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/c pull", f.root), 1);
    ck_assert_msg(strstr(out, "rejected") && strstr(out, "signed with another key"), "%s", out);
    /* no server: push fails with the reason, exit 1 */
    setenv("EMBER_CACHE_KEY_FILE", f.key, 1);
    setenv("EMBER_CACHE_REMOTE", "redis://127.0.0.1:1", 1);
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/a push", f.root), 1);
    ck_assert_msg(strstr(out, "cannot connect"), "%s", out);
    /* no remote tier configured */
    unsetenv("EMBER_CACHE_REMOTE");
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/a pull", f.root), 1);
    ck_assert_msg(strstr(out, "no remote tier"), "%s", out);
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/a stats --local", f.root), 2);
    /* keygen: a 0600 key, never overwritten */
    char kf[128];
    path_in(&f, "new.key", kf, sizeof kf);
    ck_assert_int_eq(tu_tool(out, sizeof out, "keygen %s", kf), 0);
    struct stat st;
    ck_assert_int_eq(stat(kf, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(st.st_size, 65);
    ck_assert_int_eq(tu_tool(out, sizeof out, "keygen %s", kf), 1);
    ck_assert_msg(strstr(out, "never overwritten"), "%s", out);
    fixture_free(&f);
}
END_TEST

START_TEST(pull_of_a_warmup_list_fetches_what_its_graphs_need) {
    fixture f;
    fixture_make(&f);
    char list[128];
    path_in(&f, "graphs.txt", list, sizeof list);
    setenv("EMBER_RECORD", list, 1);
    run_result a = run_child(&f, "a", 6); /* compiles, publishes, records */
    unsetenv("EMBER_RECORD");
    ck_assert_int_gt(a.compiled, 0);
    char out[8192], want[96];
    /* explain looks at the directory alone: nothing fetched, all missing */
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/c explain %s", f.root, list), 1);
    ck_assert_msg(strstr(out, "plan miss"), "%s", out);
    kc_cache *c = open_cache(&f, "c", NULL);
    kc_entry_info *es;
    size_t n;
    ck_assert_int_eq(kc_list(c, &es, &n), EM_OK);
    ck_assert_uint_eq(n, 0);
    em_free(es);
    kc_close(c);
    /* pull LIST fetches the plan and kernels, compiles nothing */
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/b pull %s", f.root, list), 0);
    snprintf(want, sizeof want, "pull: 1 graphs: %d entries fetched", (int)a.compiled + 1);
    ck_assert_msg(strstr(out, want), "%s", out);
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/b explain %s", f.root, list), 0);
    setenv("EMBER_CACHE_REMOTE", "", 1);
    run_result b = run_child(&f, "b", 6);
    ck_assert(b.values_ok);
    ck_assert_int_eq(b.compiled, 0);
    /* a namespace without them: pull says what is missing (exit 1) */
    setenv("EMBER_CACHE_REMOTE", shared.url, 1);
    setenv("EMBER_CACHE_REMOTE_PREFIX", "empty-namespace:", 1);
    ck_assert_int_eq(tu_tool(out, sizeof out, "--dir %s/d pull %s", f.root, list), 1);
    ck_assert_msg(strstr(out, "0 entries fetched") && strstr(out, "1 with something the server lacks"),
                  "%s", out);
    fixture_free(&f);
}
END_TEST

/* What a cache opened with the remote tier configured this way says. */
static void expect_off(const fixture *f, const char *url, const char *key, const char *said_text) {
    setenv("EMBER_CACHE_REMOTE", url, 1);
    if (key) setenv("EMBER_CACHE_KEY_FILE", key, 1);
    else unsetenv("EMBER_CACHE_KEY_FILE");
    said heard = {""};
    kc_cache *c = open_cache(f, "x", &heard);
    ck_assert_ptr_null(kc_remote_url(c));
    ck_assert_msg(strstr(heard.text, said_text), "wanted '%s' in: %s", said_text, heard.text);
    kc_key k = key_of("still works");
    ck_assert_int_eq(kc_put(c, &k, "so", "w", 1), EM_OK);
    kc_close(c);
}

START_TEST(configuration_errors_turn_the_tier_off_with_a_reason) {
    fixture f;
    fixture_make(&f);
    expect_off(&f, shared.url, NULL, "EMBER_CACHE_KEY_FILE is not");
    expect_off(&f, "rediss://127.0.0.1:6379", f.key, "TLS");
    expect_off(&f, "http://127.0.0.1", f.key, "not a redis://host:port/db address");
    expect_off(&f, "redis://127.0.0.1:0", f.key, "port from 1 to 65535");
    expect_off(&f, "redis://127.0.0.1:99999", f.key, "port from 1 to 65535");
    expect_off(&f, "redis://127.0.0.1:6379/x", f.key, "not a database number");
    expect_off(&f, "redis://:6379", f.key, "expected host[:port]");
    char bad[128];
    path_in(&f, "open.key", bad, sizeof bad);
    write_key(bad, "0123456789abcdef0123456789abcdef", 0644);
    expect_off(&f, shared.url, bad, "readable by everyone");
    write_key(bad, "0123456789abcdef0123456789abcdef", 0620);
    expect_off(&f, shared.url, bad, "writable by others");
    path_in(&f, "short.key", bad, sizeof bad);
    write_key(bad, "short\n", 0600);
    expect_off(&f, shared.url, bad, "a key has at least 16");
    path_in(&f, "missing.key", bad, sizeof bad);
    expect_off(&f, shared.url, bad, "cannot open the key file");
    expect_off(&f, shared.url, f.root, "not a regular file");
    setenv("EMBER_CACHE_REMOTE_PREFIX", "has space", 1);
    expect_off(&f, shared.url, f.key, "EMBER_CACHE_REMOTE_PREFIX");
    setenv("EMBER_CACHE_REMOTE_PREFIX", f.prefix, 1);
    /* a bad timeout is reported and the default used */
    setenv("EMBER_CACHE_REMOTE", shared.url, 1);
    setenv("EMBER_CACHE_KEY_FILE", f.key, 1);
    setenv("EMBER_CACHE_REMOTE_TIMEOUT", "soon", 1);
    said heard = {""};
    kc_cache *c = open_cache(&f, "y", &heard);
    ck_assert_ptr_nonnull(kc_remote_url(c));
    ck_assert_msg(strstr(heard.text, "EMBER_CACHE_REMOTE_TIMEOUT"), "%s", heard.text);
    kc_close(c);
    /* KC_NO_REMOTE and EMBER_CACHE=0 leave it off silently */
    kc_options o = {.flags = KC_NO_REMOTE};
    c = kc_open_with(&o);
    ck_assert_ptr_null(kc_remote_url(c));
    kc_close(c);
    fixture_free(&f);
}
END_TEST

START_TEST(a_password_works_and_never_reaches_a_log) {
    fixture f;
    fixture_make(&f);
    server own;
    ck_assert_msg(server_start(&own, "pw-s3cr3t"), "redis-server did not start (%s)", own.dir);
    char url[160], log[128];
    snprintf(url, sizeof url, "redis://:pw-s3cr3t@127.0.0.1:%d/2", own.port);
    path_in(&f, "log.txt", log, sizeof log);
    setenv("EMBER_CACHE_REMOTE", url, 1);
    setenv("EMBER_LOG", "cache", 1);
    setenv("EMBER_LOG_FILE", log, 1);
    run_result a = run_child(&f, "a", 6);
    ck_assert_int_gt(a.compiled, 0);
    run_result b = run_child(&f, "b", 6);
    ck_assert_int_eq(b.compiled, 0);
    const char *text = read_file(log);
    ck_assert_msg(strstr(text, "cache remote publish:"), "%s", text);
    ck_assert_msg(strstr(text, "cache remote hit:"), "%s", text);
    ck_assert_ptr_null(strstr(text, "s3cr3t"));
    /* the password from EMBER_CACHE_REMOTE_PASSWORD; a wrong one is refused */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/2", own.port);
    setenv("EMBER_CACHE_REMOTE", url, 1);
    setenv("EMBER_CACHE_REMOTE_PASSWORD", "pw-s3cr3t", 1);
    run_result c = run_child(&f, "c", 6);
    ck_assert_int_eq(c.compiled, 0);
    setenv("EMBER_CACHE_REMOTE_PASSWORD", "pw-wrong", 1);
    said heard = {""};
    kc_cache *k = open_cache(&f, "d", &heard);
    void *d;
    size_t n;
    kc_key key = key_of("x");
    ck_assert_int_eq(kc_get(k, &key, "so", &d, &n), EM_OK);
    ck_assert_ptr_null(d);
    ck_assert_msg(strstr(heard.text, "AUTH refused"), "%s", heard.text);
    ck_assert_ptr_null(strstr(heard.text, "pw-wrong"));
    kc_close(k);
    text = read_file(log);
    ck_assert_ptr_null(strstr(text, "s3cr3t"));
    ck_assert_ptr_null(strstr(text, "pw-wrong"));
    server_stop(&own);
    fixture_free(&f);
}
END_TEST

START_TEST(envelopes_round_trip_and_refuse_every_change) {
    kc_seal_key k, other;
    char why[256];
    char path[] = "/tmp/ember-seal-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "a fleet secret, 32 bytes long...\n", 33), 33);
    close(fd);
    ck_assert_msg(kc_seal_key_load(path, &k, why, sizeof why), "%s", why);
    ck_assert_uint_eq(k.n, 32); /* the newline is not part of it */
    ck_assert_uint_eq(strlen(k.id), 16);
    other = k;
    other.bytes[0] ^= 1;
    unlink(path);
    kc_key key = key_of("sealed");
    const char payload[] = "\0binary\npayload\0";
    size_t n;
    char *env = kc_seal(&k, &key, "cubin", payload, sizeof payload, &n);
    ck_assert_ptr_nonnull(env);
    const void *p;
    size_t np;
    ck_assert_int_eq(kc_unseal(&k, &key, "cubin", env, n, &p, &np, why, sizeof why), KC_READ_OK);
    ck_assert_uint_eq(np, sizeof payload);
    ck_assert_mem_eq(p, payload, sizeof payload);
    /* every single-byte change of the envelope is refused */
    for (size_t i = 0; i < n; i++) {
        env[i] ^= 0x20;
        kc_read r = kc_unseal(&k, &key, "cubin", env, n, &p, &np, why, sizeof why);
        ck_assert_msg(r != KC_READ_OK, "byte %zu changed and accepted", i);
        env[i] ^= 0x20;
    }
    /* every truncation, another kind, another key's name, another signer */
    for (size_t len = 0; len < n; len++)
        ck_assert_int_ne(kc_unseal(&k, &key, "cubin", env, len, &p, &np, why, sizeof why), KC_READ_OK);
    ck_assert_int_eq(kc_unseal(&k, &key, "so", env, n, &p, &np, why, sizeof why), KC_READ_CORRUPT);
    kc_key key2 = key_of("elsewhere");
    ck_assert_int_eq(kc_unseal(&k, &key2, "cubin", env, n, &p, &np, why, sizeof why), KC_READ_CORRUPT);
    ck_assert_int_eq(kc_unseal(&other, &key, "cubin", env, n, &p, &np, why, sizeof why), KC_READ_CORRUPT);
    ck_assert_msg(strstr(why, "signature does not match"), "%s", why);
    em_free(env);
    /* an empty payload */
    env = kc_seal(&k, &key, "plan", "", 0, &n);
    ck_assert_int_eq(kc_unseal(&k, &key, "plan", env, n, &p, &np, why, sizeof why), KC_READ_OK);
    ck_assert_uint_eq(np, 0);
    em_free(env);
}
END_TEST

int main(void) {
#ifndef EMBER_HAVE_REMOTE
    printf("SKIP: built without hiredis and libcrypto (install libhiredis-dev, libssl-dev)\n");
    return 77;
#else
    if (!redis_binary() || access(redis_binary(), X_OK) != 0) {
        printf("SKIP: no redis-server (install redis-server, then configure again)\n");
        return 77;
    }
    setenv("EMBER_JIT_MARCH", "x86-64-v2", 1); /* one target for every child */
    const tu_test tests[] = {
        {"envelopes_round_trip_and_refuse_every_change", envelopes_round_trip_and_refuse_every_change},
        {"two_cache_dirs_sharing_a_server_are_two_machines", two_cache_dirs_sharing_a_server_are_two_machines},
        {"lookup_order_and_counters", lookup_order_and_counters},
        {"tampered_truncated_and_unsigned_entries_are_misses", tampered_truncated_and_unsigned_entries_are_misses},
        {"a_compiled_program_never_loads_a_tampered_kernel", a_compiled_program_never_loads_a_tampered_kernel},
        {"a_wrong_key_is_a_miss_and_replaces_nothing", a_wrong_key_is_a_miss_and_replaces_nothing},
        {"a_server_killed_mid_run_leaves_calls_correct", a_server_killed_mid_run_leaves_calls_correct},
        {"a_server_that_never_answers_costs_one_timeout", a_server_that_never_answers_costs_one_timeout},
        {"eight_processes_publishing_the_same_keys", eight_processes_publishing_the_same_keys},
        {"push_pull_and_remote_stats_through_the_tool", push_pull_and_remote_stats_through_the_tool},
        {"pull_of_a_warmup_list_fetches_what_its_graphs_need", pull_of_a_warmup_list_fetches_what_its_graphs_need},
        {"configuration_errors_turn_the_tier_off_with_a_reason", configuration_errors_turn_the_tier_off_with_a_reason},
        {"a_password_works_and_never_reaches_a_log", a_password_works_and_never_reaches_a_log},
    };
    if (!server_start(&shared, NULL)) {
        printf("FAIL: redis-server %s did not start (see %s/redis.log)\n", redis_binary(), shared.dir);
        return 1;
    }
    int rc = tu_run(tu_suite("remote", tests, sizeof tests / sizeof tests[0], 300));
    server_stop(&shared);
    return rc;
#endif
}
