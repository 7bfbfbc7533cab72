#include "testutil.h"

#include <ftw.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static double uniform(uint64_t *s) { return ((xorshift(s) >> 11) + 0.5) / 9007199254740992.0; }

em_tensor *tu_random(uint64_t seed, int ndim, const int64_t *sizes, em_dtype dtype,
                     double scale) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= sizes[i];
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        double u1 = uniform(&s), u2 = uniform(&s);
        v[i] = scale * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
        if (!em_dtype_is_float(dtype)) v[i] = round(v[i]);
    }
    em_tensor *t = tu_tensor(v, ndim, sizes, dtype);
    free(v);
    return t;
}

em_tensor *tu_tensor(const double *v, int ndim, const int64_t *sizes, em_dtype dtype) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= sizes[i];
    em_tensor *d = em_from_data(v, EM_F64, ndim, sizes, em_cpu());
    ck_assert_msg(d != NULL, "tu_tensor: %s", em_last_error());
    if (dtype == EM_F64) return d;
    em_tensor *t = em_cast(d, dtype);
    ck_assert_msg(t != NULL, "tu_tensor cast: %s", em_last_error());
    (void)n;
    return t;
}

double *tu_values(const em_tensor *t) {
    em_tensor *d = em_cast(t, EM_F64);
    ck_assert_msg(d != NULL, "tu_values: %s", em_last_error());
    int64_t n = em_numel(d);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    ck_assert_int_eq(em_copy_to_host(d, v, sizeof(double) * (size_t)n), EM_OK);
    return v;
}

static double half_to_double(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp(m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp(m + 1024, e - 25);
    return (h >> 15) ? -v : v;
}

static double bf16_to_double(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

double tu_decode(const unsigned char *p, em_dtype d) {
    switch (d) {
    case EM_F32: { float x; memcpy(&x, p, 4); return x; }
    case EM_F64: { double x; memcpy(&x, p, 8); return x; }
    case EM_I32: { int32_t x; memcpy(&x, p, 4); return x; }
    case EM_I64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    case EM_BOOL: return p[0];
    case EM_F16: { uint16_t x; memcpy(&x, p, 2); return half_to_double(x); }
    case EM_BF16: { uint16_t x; memcpy(&x, p, 2); return bf16_to_double(x); }
    default: return NAN;
    }
}

double *tu_raw_values(const em_tensor *t) {
    ck_assert_msg(t != NULL, "tu_raw_values: NULL tensor: %s", em_last_error());
    int64_t n = em_numel(t);
    size_t es = em_dtype_size(em_dtype_of(t));
    unsigned char *buf = malloc((size_t)(n > 0 ? n : 1) * es);
    ck_assert_int_eq(em_copy_to_host(t, buf, (size_t)n * es), EM_OK);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = tu_decode(buf + (size_t)i * es, em_dtype_of(t));
    free(buf);
    return v;
}

int64_t tu_flat(int ndim, const int64_t *sizes, const int64_t *idx) {
    int64_t f = 0;
    for (int i = 0; i < ndim; i++) f = f * sizes[i] + idx[i];
    return f;
}

int tu_next(int ndim, const int64_t *sizes, int64_t *idx) {
    for (int i = ndim - 1; i >= 0; i--) {
        if (++idx[i] < sizes[i]) return 1;
        idx[i] = 0;
    }
    return 0;
}

double tu_bcast_get(const double *a, int andim, const int64_t *asizes, int ndim,
                    const int64_t *idx) {
    int64_t f = 0;
    for (int i = 0; i < andim; i++) {
        int64_t j = idx[ndim - andim + i];
        f = f * asizes[i] + (asizes[i] == 1 ? 0 : j);
    }
    return a[f];
}

void tu_check_close_at(const char *file, int line, const em_tensor *t, const double *ref,
                       int ndim, const int64_t *sizes, double rtol, double atol) {
    ck_assert_msg(t != NULL, "%s:%d: result is NULL: %s", file, line, em_last_error());
    ck_assert_msg(em_ndim(t) == ndim, "%s:%d: ndim %d, expected %d", file, line, em_ndim(t),
                  ndim);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        ck_assert_msg(em_size(t, i) == sizes[i], "%s:%d: size[%d] %lld, expected %lld", file,
                      line, i, (long long)em_size(t, i), (long long)sizes[i]);
        n *= sizes[i];
    }
    double *v = tu_values(t);
    for (int64_t i = 0; i < n; i++) {
        double a = v[i], r = ref[i];
        int ok;
        if (isnan(r)) ok = isnan(a);
        else if (isinf(r)) ok = a == r;
        else ok = fabs(a - r) <= atol + rtol * fabs(r);
        if (!ok) {
            free(v);
            ck_abort_msg("%s:%d: element %lld is %.17g, expected %.17g", file, line,
                         (long long)i, a, r);
        }
    }
    free(v);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int tu_run(Suite *s) {
    /* compiled kernels go to a private cache, not the user's */
    char dir[] = "/tmp/ember-test-XXXXXX";
    bool own = !getenv("EMBER_CACHE_DIR") && mkdtemp(dir);
    if (own) setenv("EMBER_CACHE_DIR", dir, 1);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (own) nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

Suite *tu_suite(const char *name, const tu_test *tests, size_t n, double timeout) {
    Suite *s = suite_create(name);
    for (size_t i = 0; i < n; i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
        tcase_set_timeout(tc, timeout);
        tcase_add_test(tc, tests[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

void tu_setup(void) {
    em_clear_error();
    em_scope_begin();
}

void tu_teardown(void) { em_scope_end(); }

/* Whether cuda:0 works, asked in a child so that this process never
 * initializes CUDA (Check forks); why gets the reason when it does not. */
bool tu_probe_gpu(char *why, size_t n) {
    int fd[2];
    if (pipe(fd) != 0) return snprintf(why, n, "pipe failed"), false;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]), close(fd[1]);
        return snprintf(why, n, "fork failed"), false;
    }
    if (pid == 0) {
        close(fd[0]);
        bool ok = em_device_available(em_cuda(0));
        const char *msg = ok ? "" : em_last_error();
        if (write(fd[1], msg, strlen(msg)) < 0) _exit(2);
        _exit(ok ? 0 : 1);
    }
    close(fd[1]);
    ssize_t k = read(fd[0], why, n - 1);
    why[k > 0 ? k : 0] = '\0';
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#define TAG_HEAD 64 /* keeps the 64-byte alignment Ember asks for */

void *tu_tagged_alloc(void *ud, size_t size, size_t align) {
    tu_tagged *t = ud;
    char *p;
    if (align > TAG_HEAD || posix_memalign((void **)&p, TAG_HEAD, size + TAG_HEAD)) return NULL;
    memcpy(p, &t->tag, sizeof t->tag);
    t->live++;
    return p + TAG_HEAD;
}

void tu_tagged_free(void *ud, void *q) {
    tu_tagged *t = ud;
    char *p = (char *)q - TAG_HEAD;
    unsigned tag;
    memcpy(&tag, p, sizeof tag);
    if (tag != t->tag) { /* the default allocator's, or another's: not ours to free */
        t->foreign++;
        return;
    }
    memset(p, 0, sizeof tag);
    t->live--;
    free(p);
}

int tu_tool(char *out, size_t n, const char *fmt, ...) {
    const char *exe = getenv("EMBER_CACHE_TOOL");
    ck_assert_msg(exe != NULL, "EMBER_CACHE_TOOL is not set (run through make check)");
    char args[2048], cmd[2600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", exe, args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void tu_log_begin(const char *what, char *path, size_t n) {
    ck_assert_uint_ge(n, 32);
    snprintf(path, n, "/tmp/ember-test-log-XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    setenv("EMBER_LOG", what, 1);
    setenv("EMBER_LOG_FILE", path, 1);
}

void tu_log_end(void) {
    unsetenv("EMBER_LOG");
    unsetenv("EMBER_LOG_FILE");
}

char *tu_log_take(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: cannot open the log", path);
    size_t cap = 4096, len = 0, got;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            buf = realloc(buf, cap *= 2);
            ck_assert_ptr_nonnull(buf);
        }
    }
    buf[len] = '\0';
    fclose(f);
    unlink(path);
    return buf;
}
