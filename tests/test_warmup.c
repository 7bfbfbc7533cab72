/* test_warmup.c - the graph-level cache, warmup lists (EMBER_RECORD,
 * em_compiled_save), and the ember-cache tool end to end: record in one
 * process, warm a fresh cache with the tool, then a new process compiles
 * nothing; bundles; verify and prune on damaged entries; concurrent
 * warmups; the trust checks. */
#include "testutil.h"

#include "cache.h"
#include "jit.h"
#include "plan.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define R 6
#define C 40

/* ---- the functions compiled ---- */

static em_status softmax_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    out[0] = em_softmax(in[0], -1);
    return out[0] ? EM_OK : em_last_status();
}

/* y = relu(x @ w + 1) * 2: w is a captured constant (through ctx) */
static em_status linear_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    em_tensor *w = ctx;
    out[0] = em_mul_scalar(em_relu(em_add_scalar(em_matmul(in[0], w), 1)), 2);
    return out[0] ? EM_OK : em_last_status();
}

static double softmax_ref(const double *x, int r, int c) {
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < C; j++) m = fmax(m, x[r * C + j]);
    for (int j = 0; j < C; j++) sum += exp(x[r * C + j] - m);
    return exp(x[r * C + c] - m) / sum;
}

/* ---- helpers ---- */

typedef struct dirs {
    char root[64];
    char list[128];   /* the warmup list */
    char a[128], b[128], c[128];
} dirs;

static void make_dirs(dirs *d) {
    snprintf(d->root, sizeof d->root, "/tmp/ember-warmup-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->root));
    snprintf(d->list, sizeof d->list, "%s/graphs.txt", d->root);
    snprintf(d->a, sizeof d->a, "%s/a", d->root);
    snprintf(d->b, sizeof d->b, "%s/b", d->root);
    snprintf(d->c, sizeof d->c, "%s/c", d->root);
}

static void remove_dirs(const dirs *d) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R u+w %s 2>/dev/null; rm -rf %s", d->root, d->root);
    ck_assert_int_eq(system(cmd), 0);
}

#define tool tu_tool

typedef struct run_result {
    int64_t compiled, loaded, graphs_loaded;
    bool values_ok;
} run_result;

/* Adds f's kernel and plan counts to r and frees f (in a child). */
static void take_stats(run_result *r, em_compiled *f) {
    em_compile_stats st;
    em_compiled_stats(f, &st);
    r->compiled += st.kernels_compiled;
    r->loaded += st.kernels_loaded;
    r->graphs_loaded += st.graphs_loaded;
    em_compiled_free(f);
}

/* The run_result child pid wrote to the pipe p; the child must exit 0. */
static run_result child_result(int p[2], pid_t pid) {
    close(p[1]);
    run_result r;
    memset(&r, 0, sizeof r);
    ck_assert_int_eq(read(p[0], &r, sizeof r), (ssize_t)sizeof r);
    close(p[0]);
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return r;
}

/* In a new process with EMBER_CACHE_DIR=dir (and EMBER_RECORD=list when
 * given): compiles both functions and calls each on two shapes, checking
 * the values against float64 references.  Returns the summed stats. */
static run_result run_in_child(const char *dir, const char *list) {
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(p[0]);
        setenv("EMBER_CACHE_DIR", dir, 1);
        if (list) setenv("EMBER_RECORD", list, 1);
        else unsetenv("EMBER_RECORD");
        run_result r = {.values_ok = true};
        em_tensor *w = tu_random(7, 2, TU_SIZES(C, 5), EM_F32, 0.3);
        /* each size its own static entry, whose plan the warmup stores */
        em_compile_options so = {.ninputs = 1, .noutputs = 1, .name = "softmax", .dynamic = -1};
        em_compile_options lo = {.ninputs = 1, .noutputs = 1, .name = "linear", .dynamic = -1};
        em_compiled *fs = em_compile(softmax_fn, NULL, &so), *fl = em_compile(linear_fn, w, &lo);
        double *wv = tu_values(w);
        for (int rows = R; rows <= R + 1; rows++) {
            em_tensor *x = tu_random(11 + (uint64_t)rows, 2, TU_SIZES(rows, C), EM_F32, 2), *y, *z;
            double *xv = tu_values(x);
            /* the first call of an entry runs eagerly (capture): the
             * second runs the compiled or loaded plan, which is checked */
            if (em_call(fs, &x, NULL, &y) != EM_OK || em_call(fl, &x, NULL, &z) != EM_OK) _exit(3);
            if (em_call(fs, &x, NULL, &y) != EM_OK || em_call(fl, &x, NULL, &z) != EM_OK) _exit(3);
            double *yv = tu_values(y), *zv = tu_values(z);
            for (int i = 0; i < rows; i++) {
                for (int j = 0; j < C; j++)
                    if (fabs(yv[i * C + j] - softmax_ref(xv, i, j)) > 1e-6) r.values_ok = false;
                for (int j = 0; j < 5; j++) {
                    double acc = 1;
                    for (int k = 0; k < C; k++) acc += xv[i * C + k] * wv[k * 5 + j];
                    if (fabs(zv[i * 5 + j] - 2 * fmax(acc, 0)) > 1e-4 * (1 + fabs(acc)))
                        r.values_ok = false;
                }
            }
            free(xv);
            free(yv);
            free(zv);
        }
        free(wv);
        em_compiled *fns[2] = {fs, fl};
        for (int i = 0; i < 2; i++) {
            take_stats(&r, fns[i]);
        }
        ssize_t wr = write(p[1], &r, sizeof r);
        _exit(wr == (ssize_t)sizeof r ? 0 : 4);
    }
    return child_result(p, pid);
}

/* Records the four graphs (2 functions x 2 shapes) into d->list, with
 * cache a. */
static void record(const dirs *d) {
    run_result r = run_in_child(d->a, d->list);
    ck_assert(r.values_ok);
    ck_assert_int_gt(r.compiled, 0);
    jit_record *rs;
    int n;
    ck_assert_int_eq(jit_records_read(d->list, &rs, &n), EM_OK);
    ck_assert_int_eq(n, 4);
    ck_assert_str_eq(rs[0].name, "softmax");
    ck_assert_str_eq(rs[1].name, "linear");
    ck_assert_str_eq(rs[0].backend, "cpu");
    jit_records_free(rs, n);
}

static int count_entries(const char *dir, const char *kind) {
    char cmd[300], buf[32];
    snprintf(cmd, sizeof cmd, "ls %s/v1/*/*.%s 2>/dev/null | wc -l", dir, kind);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(fgets(buf, sizeof buf, p));
    pclose(p);
    return atoi(buf);
}

/* ---- tests ---- */

START_TEST(record_warmup_then_a_new_process_compiles_nothing) {
    dirs d;
    make_dirs(&d);
    record(&d);
    char out[4096];
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s warmup -j 2 %s", d.b, d.list), 0);
    ck_assert_msg(strstr(out, "warmup: 4 graphs (4 records): 4 compiled, 0 already present, 0 failed"),
                  "%s", out);
    ck_assert_int_eq(count_entries(d.b, "plan"), 4);
    run_result r = run_in_child(d.b, NULL);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.compiled, 0);
    ck_assert_int_eq(r.graphs_loaded, 4);
    ck_assert_int_gt(r.loaded, 0);
    /* a second warmup finds everything present; --json says the same */
    ck_assert_int_eq(tool(out, sizeof out, "--json --dir %s warmup %s", d.b, d.list), 0);
    ck_assert_msg(strstr(out, "\"graphs\":4,\"compiled\":0,\"present\":4,\"failed\":0"), "%s", out);
    remove_dirs(&d);
}
END_TEST

/* In a new process with EMBER_CACHE_DIR=dir, EMBER_RECORD=list (when
 * given) and lazy mode on: layer-norm-like math on x [rows, C], then a
 * matmul by a weight made after x (lazy graphs meet that input between
 * their calls), for each rows in sizes; values against float64. */
static run_result run_lazy_child(const char *dir, const char *list, const int *sizes, int n) {
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(p[0]);
        setenv("EMBER_CACHE_DIR", dir, 1);
        if (list) setenv("EMBER_RECORD", list, 1);
        else unsetenv("EMBER_RECORD");
        run_result r = {.values_ok = true};
        for (int t = 0; t < n; t++) {
            int rows = sizes[t];
            em_scope_begin();
            em_tensor *x = tu_random(3 + (uint64_t)rows, 2, TU_SIZES(rows, C), EM_F32, 2);
            em_tensor *w = tu_random(9, 2, TU_SIZES(C, 5), EM_F32, 0.3);
            double *xv = tu_values(x), *wv = tu_values(w);
            if (em_lazy_begin() != EM_OK) _exit(3);
            em_tensor *c = em_sub(x, em_mean(x, 1, (int[]){1}, true));
            em_tensor *y = em_relu(em_matmul(em_mul_scalar(c, 0.5), w));
            double *yv = tu_values(y); /* forces the graph */
            if (em_lazy_end() != EM_OK || !yv) _exit(3);
            for (int i = 0; i < rows; i++) {
                double m = 0;
                for (int k = 0; k < C; k++) m += xv[i * C + k] / C;
                for (int j = 0; j < 5; j++) {
                    double acc = 0;
                    for (int k = 0; k < C; k++) acc += 0.5 * (xv[i * C + k] - m) * wv[k * 5 + j];
                    if (fabs(yv[i * 5 + j] - fmax(acc, 0)) > 1e-4 * (1 + fabs(acc))) r.values_ok = false;
                }
            }
            free(xv);
            free(wv);
            free(yv);
            em_scope_end();
        }
        em_lazy_stats st;
        em_lazy_get_stats(&st);
        r.compiled = st.kernels_compiled;
        r.loaded = st.kernels_loaded;
        ssize_t wr = write(p[1], &r, sizeof r);
        _exit(wr == (ssize_t)sizeof r ? 0 : 4);
    }
    return child_result(p, pid);
}

START_TEST(lazy_mode_records_and_a_warmed_process_compiles_nothing) {
    dirs d;
    make_dirs(&d);
    /* three sizes: a static entry, then a dynamic one serving the others */
    const int sizes[] = {6, 7, 9};
    run_result a = run_lazy_child(d.a, d.list, sizes, 3);
    ck_assert(a.values_ok);
    ck_assert_int_gt(a.compiled, 0);
    jit_record *rs;
    int n;
    ck_assert_int_eq(jit_records_read(d.list, &rs, &n), EM_OK);
    ck_assert_int_ge(n, 2);
    bool dynamic = false;
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(rs[i].name, "lazy");
        ck_assert_str_eq(rs[i].backend, "cpu");
        dynamic = dynamic || rs[i].ndyn > 0;
    }
    ck_assert_msg(dynamic, "the dynamic entry was not recorded");
    jit_records_free(rs, n);
    char out[4096];
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s warmup %s", d.b, d.list), 0);
    ck_assert_msg(strstr(out, " 0 failed"), "%s", out);
    /* a new process on the warmed cache: the recorded sizes and one never seen */
    const int again[] = {6, 7, 9, 13};
    run_result b = run_lazy_child(d.b, NULL, again, 4);
    ck_assert(b.values_ok);
    ck_assert_int_eq(b.compiled, 0);
    ck_assert_int_gt(b.loaded, 0);
    remove_dirs(&d);
}
END_TEST

START_TEST(a_bad_plan_is_a_miss_and_values_stay_right) {
    dirs d;
    make_dirs(&d);
    record(&d);
    /* every plan replaced by garbage: checksums fail, the graphs compile again */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "for f in %s/v1/*/*.plan; do printf 'ember-plan 1\\nsteps 99\\n' > \"$f\"; done", d.a);
    ck_assert_int_eq(system(cmd), 0);
    run_result r = run_in_child(d.a, NULL);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.graphs_loaded, 0);
    ck_assert_int_eq(r.compiled, 0); /* the kernels themselves were still good */
    remove_dirs(&d);
}
END_TEST

START_TEST(plan_parser_rejects_what_does_not_fit_the_graph) {
    tr_graph *g = tr_parse("graph(%x: f32[4]{1}) {\n  %1 = exp(%x) : f32[4]{1}\n  return (%1)\n}\n", NULL, 0);
    ck_assert_ptr_nonnull(g);
    const char *key = "0123456789abcdef0123456789abcdef";
    const char *gkey = "fedcba9876543210fedcba9876543210";
    kc_key gk, other;
    ck_assert(kc_key_from_hex(gkey, &gk));
    ck_assert(kc_key_from_hex(key, &other));
    char good[256], text[256];
    snprintf(good, sizeof good, "ember-plan 3\ngraph %s\nsteps 1\nk 0\nkernels 1\nkernel %s 00000000000000000000000000000000 2 1 0 1\n",
             gkey, key);
    jit_plan p;
    ck_assert(jit_plan_parse(good, strlen(good), g, &gk, &p));
    ck_assert_int_eq(p.nkernels, 1);
    ck_assert_int_eq(p.kernels[0].bufs[1], 1);
    size_t n;
    char *again = jit_plan_format(&p, &n);
    ck_assert_str_eq(again, good);
    em_free(again);
    jit_plan_clear(&p);
    /* the same text looked up under another key: filed under the wrong key */
    ck_assert(!jit_plan_parse(good, strlen(good), g, &other, &p));
    const char *bad[] = {
        "ember-plan 1\ngraph %s\nsteps 1\nk 0\nkernels 1\nkernel %s 00000000000000000000000000000000 2 1 0 1\n",  /* version */
        "ember-plan 3\nsteps 1\nk 0\nkernels 1\nkernel %s 00000000000000000000000000000000 2 1 0 1\n%s",         /* no key */
        "ember-plan 3\ngraph %s\nsteps 1\nk 1\nkernels 1\nkernel %s 00000000000000000000000000000000 2 1 0 1\n",  /* no kernel 1 */
        "ember-plan 3\ngraph %s\nsteps 1\ne 0\nkernels 1\nkernel %s 00000000000000000000000000000000 2 1 0 1\n",  /* node 0 is an input */
        "ember-plan 3\ngraph %s\nsteps 1\nk 0\nkernels 1\nkernel %s 00000000000000000000000000000000 2 1 0 7\n",  /* node 7 */
        "ember-plan 3\ngraph %s\nsteps 1\nk 0\nkernels 1\nkernel %s 00000000000000000000000000000000 2 1 1 0\n",  /* result is the input */
        "ember-plan 3\ngraph %s\nsteps 1\nk 0\nkernels 1\nkernel %s 00000000000000000000000000000000 2 3 0 1\n",  /* nouts > nbufs */
        "ember-plan 3\ngraph %s\nsteps 1\nk 0\nkernels 1\nkernel %s 00000000000000000000000000000000 0 0\n",      /* runs a dead kernel */
        "ember-plan 3\ngraph %s\nsteps 1\nk 0\nkernels 1\nkernel %s 00000000000000000000000000000000 2 1 0 1\nx", /* trailing */
        "ember-plan 3\ngraph %s\nsteps 1\nk 0\nkernels 1\nkernel %s 00000000000000000000000000000000 2 1 0",      /* truncated */
        "ember-plan 3\ngraph %s\nsteps -1\n%s",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, bad[i], gkey, key);
        ck_assert_msg(!jit_plan_parse(text, strlen(text), g, &gk, &p), "accepted bad plan %zu", i);
    }
    tr_graph_free(g);
}
END_TEST

START_TEST(save_api_and_warmup_list_errors) {
    dirs d;
    make_dirs(&d);
    em_tensor *x = tu_random(3, 2, TU_SIZES(2, C), EM_F32, 1), *y;
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "sm"};
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
    ck_assert_int_eq(em_compiled_save(f, d.list), EM_OK);
    jit_record *rs;
    int n;
    ck_assert_int_eq(jit_records_read(d.list, &rs, &n), EM_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(rs[0].name, "sm");
    ck_assert_ptr_nonnull(strstr(rs[0].graph, "softmax") ? rs[0].graph : strstr(rs[0].graph, "exp"));
    jit_records_free(rs, n);
    struct stat st;
    ck_assert_int_eq(stat(d.list, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(em_compiled_save(NULL, d.list), EM_ERR_NULL);
    ck_assert_int_eq(em_compiled_save(f, NULL), EM_ERR_NULL);
    ck_assert_int_eq(em_compiled_save(f, ""), EM_ERR_ARG);
    ck_assert_int_eq(em_compiled_save(f, "/nonexistent-dir/x/list.txt"), EM_ERR_IO);
    ck_assert_ptr_nonnull(strstr(em_last_error(), "/nonexistent-dir/x/list.txt"));
    em_compiled_free(f);
    o.backend = "replay";
    f = em_compile(softmax_fn, NULL, &o);
    ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
    ck_assert_int_eq(em_compiled_save(f, d.list), EM_ERR_UNSUPPORTED);
    em_compiled_free(f);
    /* malformed lists: the error names the line */
    const char *bad[] = {
        "hello\n",
        "ember-record 1 backend=cpu\ngraph(%x: f32[1]{1}) {\n  return (%x)\n}\n",
        "ember-record 1 backend=cpu name=f\ngraph(%x: f32[1]{1}) {\n  return (%x)\n",
        "# ok\n\nember-record 1 backend=cpu name=f\nguard input 0\nnot a graph\n}\n",
    };
    const char *line[] = {":1:", ":1:", ":1:", ":3:"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *fp = fopen(d.list, "w");
        fputs(bad[i], fp);
        fclose(fp);
        ck_assert_int_eq(jit_records_read(d.list, &rs, &n), EM_ERR_ARG);
        ck_assert_msg(strstr(em_last_error(), line[i]), "case %zu: %s", i, em_last_error());
    }
    ck_assert_int_eq(jit_records_read("/nonexistent-ember-list", &rs, &n), EM_ERR_IO);
    /* a record whose graph does not parse fails in warmup, the others work */
    FILE *fp = fopen(d.list, "w");
    fputs("ember-record 1 backend=cpu name=bad\ngraph(%x: f32[1]{1}) {\n  %1 = nosuchop(%x) : f32[1]{1}\n"
          "  return (%1)\n}\nember-record 1 backend=replay name=r\ngraph(%x: f32[1]{1}) {\n"
          "  return (%x)\n}\n", fp);
    fclose(fp);
    char out[4096];
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s warmup %s", d.b, d.list), 1);
    ck_assert_msg(strstr(out, "0 compiled, 0 already present, 2 failed"), "%s", out);
    ck_assert_msg(strstr(out, "unknown op 'nosuchop'"), "%s", out);
    ck_assert_msg(strstr(out, "nothing to compile ahead of time"), "%s", out);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s warmup /nonexistent-ember-list", d.b), 1);
    ck_assert_msg(strstr(out, "cannot open /nonexistent-ember-list"), "%s", out);
    remove_dirs(&d);
}
END_TEST

START_TEST(export_import_round_trip_and_refusals) {
    dirs d;
    make_dirs(&d);
    record(&d);
    char out[8192], bundle[200], other[200], cmd[2048];
    snprintf(bundle, sizeof bundle, "%s/bundle.ember", d.root);
    snprintf(other, sizeof other, "%s/other.ember", d.root);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s export %s", d.a, bundle), 0);
    ck_assert_msg(strstr(out, "export: "), "%s", out);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s import %s", d.c, bundle), 0);
    run_result r = run_in_child(d.c, NULL);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.compiled, 0);
    ck_assert_int_eq(r.graphs_loaded, 4);
    /* made for another CPU target: refused, nothing imported */
    snprintf(cmd, sizeof cmd, "sed 's/^tag cpu=.*/tag cpu=libgccjit 99.0.0 codegen 1 -march=armv9/' %s > %s",
             bundle, other);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s/d import %s", d.root, other), 1);
    ck_assert_msg(strstr(out, "the bundle was made for cpu=libgccjit 99.0.0"), "%s", out);
    ck_assert_msg(strstr(out, "but this machine has cpu="), "%s", out);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s/d --json stats", d.root), 0);
    ck_assert_msg(strstr(out, "\"entries\":0,"), "%s", out);
    /* a tag this machine lacks */
    snprintf(cmd, sizeof cmd, "sed 's/^tag cpu=/tag tpu=v5 /' %s > %s", bundle, other);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s/d import %s", d.root, other), 1);
    ck_assert_msg(strstr(out, "which this machine does not have"), "%s", out);
    /* truncated, and a flipped byte inside an entry */
    snprintf(cmd, sizeof cmd, "head -c 3000 %s > %s", bundle, other);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s/e import %s", d.root, other), 1);
    ck_assert_msg(strstr(out, "truncated"), "%s", out);
    snprintf(cmd, sizeof cmd, "cp %s %s && printf 'Z' | dd of=%s bs=1 seek=2000 conv=notrunc 2>/dev/null",
             bundle, other, other);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s/e import %s", d.root, other), 1);
    ck_assert_msg(strstr(out, "checksum") || strstr(out, "malformed"), "%s", out);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s/e import %s/nope", d.root, d.root), 1);
    ck_assert_msg(strstr(out, "cannot open"), "%s", out);
    snprintf(cmd, sizeof cmd, "printf 'not a bundle\\n' > %s", other);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s/e import %s", d.root, other), 1);
    ck_assert_msg(strstr(out, "is not an Ember cache bundle"), "%s", out);
    remove_dirs(&d);
}
END_TEST

/* Lists the payload files of a cache, one path per line, into paths. */
static int payloads(const char *dir, char paths[][300], int max) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls %s/v1/*/*.so %s/v1/*/*.plan 2>/dev/null", dir, dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int n = 0;
    while (n < max && fgets(paths[n], 300, p)) {
        paths[n][strcspn(paths[n], "\n")] = '\0';
        n++;
    }
    pclose(p);
    return n;
}

START_TEST(verify_and_prune_on_damaged_entries) {
    dirs d;
    make_dirs(&d);
    record(&d);
    char out[8192], cmd[4096], paths[64][300];
    int n = payloads(d.a, paths, 64);
    ck_assert_int_ge(n, 6);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s verify", d.a), 0);
    /* corrupted, truncated, a foreign header (another entry's), a payload
     * without its header, and an entry writable by others */
    snprintf(cmd, sizeof cmd,
             "printf garbage > %s && truncate -s 10 %s && cp %s.meta %s.meta && rm %s.meta && "
             "chmod 0666 %s",
             paths[0], paths[1], paths[3], paths[2], paths[4], paths[5]);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s verify", d.a), 1);
    ck_assert_msg(strstr(out, " 5 bad"), "%s", out);
    ck_assert_msg(strstr(out, "without its header"), "%s", out);
    ck_assert_msg(strstr(out, "writable"), "%s", out);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s --json verify --remove", d.a), 0);
    ck_assert_msg(strstr(out, "\"removed\":5}"), "%s", out);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s verify", d.a), 0);
    ck_assert_msg(strstr(out, " 0 bad"), "%s", out);
    /* the good entries still serve a new process; the rest compile */
    run_result r = run_in_child(d.a, NULL);
    ck_assert(r.values_ok);
    /* prune by age: entries last used two days ago go */
    n = payloads(d.a, paths, 64);
    snprintf(cmd, sizeof cmd, "touch -m -d '2 days ago' %s.meta %s.meta", paths[0], paths[1]);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s prune --older-than 1d", d.a), 0);
    ck_assert_msg(strstr(out, "prune: removed 2 entries"), "%s", out);
    ck_assert_int_eq(payloads(d.a, paths, 64), n - 2);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s prune --max-size 0", d.a), 0);
    ck_assert_int_eq(payloads(d.a, paths, 64), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s prune --older-than soon", d.a), 2);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s prune --max-size lots", d.a), 2);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s prune", d.a), 2);
    remove_dirs(&d);
}
END_TEST

START_TEST(two_concurrent_warmups_of_one_cache) {
    dirs d;
    make_dirs(&d);
    record(&d);
    const char *exe = getenv("EMBER_CACHE_TOOL");
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "%s --dir %s warmup %s > %s/w1 2>&1 & %s --dir %s warmup %s > %s/w2 2>&1 & "
             "wait %%1 && wait %%2",
             exe, d.b, d.list, d.root, exe, d.b, d.list, d.root);
    ck_assert_int_eq(system(cmd), 0);
    char out[4096];
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s verify", d.b), 0);
    ck_assert_msg(strstr(out, " 0 bad"), "%s", out);
    run_result r = run_in_child(d.b, NULL);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.compiled, 0);
    ck_assert_int_eq(r.graphs_loaded, 4);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s clear", d.b), 0);
    ck_assert_msg(strstr(out, "clear: removed"), "%s", out);
    ck_assert_int_eq(count_entries(d.b, "so") + count_entries(d.b, "plan"), 0);
    remove_dirs(&d);
}
END_TEST

START_TEST(cli_help_errors_and_trust) {
    char out[8192];
    ck_assert_int_eq(tool(out, sizeof out, "--help"), 0);
    const char *cmds[] = {"warmup", "ls", "stats", "verify", "prune", "clear", "export", "import",
                          "--json", "--dir"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        ck_assert_msg(strstr(out, cmds[i]), "--help does not mention %s", cmds[i]);
    ck_assert_int_eq(tool(out, sizeof out, "frobnicate"), 2);
    ck_assert_int_eq(tool(out, sizeof out, "%s", ""), 2);
    ck_assert_int_eq(tool(out, sizeof out, "--bogus ls"), 2);
    ck_assert_int_eq(tool(out, sizeof out, "ls extra"), 2);
    dirs d;
    make_dirs(&d);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s ls", d.a), 0);
    ck_assert_msg(strstr(out, "is empty"), "%s", out);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s --json ls", d.a), 0);
    ck_assert_str_eq(out, "[]\n");
    struct stat st;
    ck_assert_int_eq(stat(d.a, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    /* a directory others may write is refused */
    ck_assert_int_eq(chmod(d.a, 0777), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s ls", d.a), 1);
    ck_assert_msg(strstr(out, "writable"), "%s", out);
    /* and at run time the cache falls back to memory: values still right */
    run_result r = run_in_child(d.a, NULL);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.loaded, 0);
    ck_assert_int_eq(count_entries(d.a, "so"), 0);
    remove_dirs(&d);
}
END_TEST


/* ---- regressions of issue 21, item 3: entries filed under the wrong key ---- */

/* The payload files of kind under dir (paths[i]: 300 bytes each). */
static int list_kind(const char *dir, const char *kind, char paths[][300], int max) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls %s/v1/*/*.%s 2>/dev/null", dir, kind);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int n = 0;
    while (n < max && fgets(paths[n], 300, p)) {
        paths[n][strcspn(paths[n], "\n")] = '\0';
        n++;
    }
    pclose(p);
    return n;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    char *buf = malloc(1 << 22);
    *n = fread(buf, 1, 1 << 22, f);
    fclose(f);
    return buf;
}

static void spit(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(chmod(path, 0600), 0);
}

/* Writes payload path's bytes and a header that fits them exactly, under
 * the key and kind its file name says: what someone re-forging headers
 * would leave, which the header checks alone cannot tell from the real
 * thing. */
static void put_forged(const char *path, const void *data, size_t n) {
    spit(path, data, n);
    const char *base = strrchr(path, '/') + 1, *dot = strchr(base, '.');
    char hex[KC_KEY_HEX_SIZE], meta[320], text[KC_META_MAX];
    snprintf(hex, sizeof hex, "%.32s", base);
    kc_meta m = {.version = KC_FORMAT_VERSION, .size = n, .created = 1764547200};
    ck_assert(kc_key_from_hex(hex, &m.key));
    snprintf(m.kind, sizeof m.kind, "%s", dot + 1);
    m.sum = kc_checksum(data, n);
    snprintf(meta, sizeof meta, "%s.meta", path);
    spit(meta, text, kc_meta_format(&m, text));
}

/* Swaps the payloads of a and b, re-forging both headers. */
static void swap_forged(const char *a, const char *b) {
    size_t na, nb;
    char *da = slurp(a, &na), *db = slurp(b, &nb);
    put_forged(a, db, nb);
    put_forged(b, da, na);
    free(da);
    free(db);
}

/* Every pair of plans swapped (one pair per run): each run's values are
 * right, the two swapped plans are misses (their graphs come from the
 * kernel cache: nothing compiles) and are replaced. */
START_TEST(swapped_plans_are_misses_and_replaced) {
    dirs d;
    make_dirs(&d);
    record(&d);
    char plans[8][300];
    int n = list_kind(d.a, "plan", plans, 8);
    ck_assert_int_eq(n, 4);
    for (int i = 0; i < n; i++) {
        for (int j = i + 1; j < n; j++) {
            swap_forged(plans[i], plans[j]);
            run_result r = run_in_child(d.a, NULL);
            ck_assert_msg(r.values_ok, "plans %d and %d swapped: wrong values", i, j);
            ck_assert_int_eq(r.graphs_loaded, 2);
            ck_assert_int_eq(r.compiled, 0);
        }
    }
    run_result r = run_in_child(d.a, NULL);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.graphs_loaded, 4);
    remove_dirs(&d);
}
END_TEST

/* The plan text of path with its steps cut to keep (-1: all) and every
 * kernel buffer number moved by shift; whether that changed it. */
static bool damage_plan(const char *path, int keep, int shift) {
    size_t n;
    char *text = slurp(path, &n), *out = malloc(2 * n + 64), *save = NULL;
    text[n] = '\0';
    size_t at = 0;
    int step = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int count;
        if (sscanf(line, "steps %d", &count) == 1) {
            at += (size_t)sprintf(out + at, "steps %d\n", keep < 0 || keep > count ? count : keep);
        } else if ((line[0] == 'k' || line[0] == 'e') && line[1] == ' ') {
            if (keep < 0 || step < keep) at += (size_t)sprintf(out + at, "%s\n", line);
            step++;
        } else if (!strncmp(line, "kernel ", 7) && shift) {
            char key[40], abi[40];
            int nb, no, off;
            ck_assert_int_eq(sscanf(line, "kernel %39s %39s %d %d%n", key, abi, &nb, &no, &off), 4);
            at += (size_t)sprintf(out + at, "kernel %s %s %d %d", key, abi, nb, no);
            char *p = line + off;
            for (int b = 0; b < nb; b++) {
                long v = strtol(p, &p, 10);
                at += (size_t)sprintf(out + at, " %ld", v + shift > 0 ? v + shift : v);
            }
            out[at++] = '\n';
        } else {
            at += (size_t)sprintf(out + at, "%s\n", line);
        }
    }
    size_t n2;
    char *orig = slurp(path, &n2);
    bool changed = n2 != at || memcmp(orig, out, at) != 0;
    free(orig);
    put_forged(path, out, at);
    free(text);
    free(out);
    return changed;
}

/* A plan with no steps, a step dropped or its buffers shifted (under a
 * header that fits it) is a miss that is compiled again and replaced,
 * never a plan hit that fails at run time ("output 0 was not computed",
 * which em_call then papers over by running the graph eagerly). */
START_TEST(damaged_plans_are_misses) {
    dirs d;
    make_dirs(&d);
    record(&d);
    char plans[8][300];
    int n = list_kind(d.a, "plan", plans, 8);
    ck_assert_int_eq(n, 4);
    const int damage[][2] = {{0, 0}, {1, 0}, {-1, 1}, {-1, -1}};
    for (int v = 0; v < 4; v++) {
        int changed = 0;
        for (int i = 0; i < n; i++) changed += damage_plan(plans[i], damage[v][0], damage[v][1]);
        ck_assert_int_gt(changed, 0);
        run_result r = run_in_child(d.a, NULL);
        ck_assert_msg(r.values_ok, "damage %d: wrong values", v);
        ck_assert_msg(r.graphs_loaded == n - changed, "damage %d: %d of %d damaged plans used", v,
                      (int)r.graphs_loaded - (n - changed), changed);
        ck_assert_int_eq(r.compiled, 0);
    }
    remove_dirs(&d);
}
END_TEST

/* Every pair of kernels swapped (under re-forged headers): a shared object
 * filed under another kernel's key carries its own key, so loading it is a
 * miss: the values stay right, the kernels compile again and replace the
 * entries. */
START_TEST(swapped_kernels_are_misses_and_replaced) {
    dirs d;
    make_dirs(&d);
    record(&d);
    char sos[16][300];
    int n = list_kind(d.a, "so", sos, 16);
    ck_assert_int_ge(n, 2);
    for (int i = 0; i < n; i++) {
        for (int j = i + 1; j < n; j++) {
            swap_forged(sos[i], sos[j]);
            run_result r = run_in_child(d.a, NULL);
            ck_assert_msg(r.values_ok, "kernels %d and %d swapped: wrong values", i, j);
            ck_assert_int_eq(r.compiled, 2);
        }
    }
    run_result r = run_in_child(d.a, NULL);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.compiled, 0);
    ck_assert_int_eq(r.graphs_loaded, 4);
    remove_dirs(&d);
}
END_TEST

/* A payload and a header that became directories: the run's values are
 * right and the entries are replaced (the next run compiles nothing);
 * verify --remove removes such entries for real. */
START_TEST(directories_at_entry_names_are_replaced_and_removable) {
    dirs d;
    make_dirs(&d);
    record(&d);
    char sos[16][300], cmd[1400], out[8192];
    int n = list_kind(d.a, "so", sos, 16);
    ck_assert_int_ge(n, 2);
    snprintf(cmd, sizeof cmd, "rm %s && mkdir -p %s/x && rm %s.meta && mkdir %s.meta", sos[0],
             sos[0], sos[1], sos[1]);
    ck_assert_int_eq(system(cmd), 0);
    run_result r = run_in_child(d.a, NULL);
    ck_assert(r.values_ok);
    r = run_in_child(d.a, NULL);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.compiled, 0);
    ck_assert_int_eq(r.graphs_loaded, 4);
    /* again, for the tool */
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s verify", d.a), 1);
    ck_assert_msg(strstr(out, " 2 bad"), "%s", out);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s verify --remove", d.a), 0);
    ck_assert_msg(strstr(out, "all removed"), "%s", out);
    struct stat st;
    snprintf(cmd, sizeof cmd, "%s.meta", sos[1]);
    ck_assert_msg(lstat(sos[0], &st) != 0, "%s is still there", sos[0]);
    ck_assert_msg(lstat(cmd, &st) != 0, "%s is still there", cmd);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s verify", d.a), 0);
    ck_assert_msg(strstr(out, " 0 bad"), "%s", out);
    remove_dirs(&d);
}
END_TEST

/* Item 4: a fan-out directory others can write holds someone else's
 * shared objects (here: every kernel rotated under re-forged headers);
 * nothing is loaded from it, the values are right. */
START_TEST(world_writable_fan_out_dirs_load_nothing) {
    dirs d;
    make_dirs(&d);
    record(&d);
    char sos[16][300], cmd[400];
    int n = list_kind(d.a, "so", sos, 16);
    ck_assert_int_ge(n, 2);
    for (int i = 0; i + 1 < n; i++) swap_forged(sos[i], sos[i + 1]);
    snprintf(cmd, sizeof cmd, "chmod 0777 %s/v1/*", d.a);
    ck_assert_int_eq(system(cmd), 0);
    run_result r = run_in_child(d.a, NULL);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.loaded, 0);
    ck_assert_int_eq(r.graphs_loaded, 0);
    remove_dirs(&d);
}
END_TEST


/* Two graphs of the same shapes whose plans and kernels differ only in
 * what they compute: a swap between them cannot be told by sizes, only by
 * the key each entry carries. */
static em_status exp2_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    out[0] = em_mul_scalar(em_exp(in[0]), 2);
    return out[0] ? EM_OK : em_last_status();
}

static em_status tanh1_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    out[0] = em_add_scalar(em_tanh(in[0]), 1);
    return out[0] ? EM_OK : em_last_status();
}

/* Whether f's result on x matches ref(x) (float64) everywhere. */
/* Twice: a first call runs the function eagerly to capture its graph, the
 * second runs what was compiled (or loaded). */
static bool pointwise_ok(em_compiled *f, em_tensor *x, double (*ref)(double)) {
    bool ok = true;
    for (int rep = 0; rep < 2 && ok; rep++) {
        em_tensor *y;
        if (em_call(f, &x, NULL, &y) != EM_OK) return false;
        double *xv = tu_values(x), *yv = tu_values(y);
        for (int i = 0; i < R * C; i++)
            ok = ok && fabs(yv[i] - ref(xv[i])) <= 1e-5 * (1 + fabs(ref(xv[i])));
        free(xv);
        free(yv);
    }
    return ok;
}

static double exp2_ref(double v) { return 2 * exp(v); }
static double tanh1_ref(double v) { return tanh(v) + 1; }

/* In a new process on cache dir: both functions called, values checked. */
static run_result run_pointwise_child(const char *dir) {
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(p[0]);
        setenv("EMBER_CACHE_DIR", dir, 1);
        unsetenv("EMBER_RECORD");
        run_result r = {.values_ok = true};
        em_compile_options o = {.ninputs = 1, .noutputs = 1, .dynamic = -1};
        em_compiled *fs[2] = {em_compile(exp2_fn, NULL, &o), em_compile(tanh1_fn, NULL, &o)};
        double (*refs[2])(double) = {exp2_ref, tanh1_ref};
        em_tensor *x = tu_random(5, 2, TU_SIZES(R, C), EM_F32, 1);
        for (int i = 0; i < 2; i++) {
            r.values_ok = r.values_ok && pointwise_ok(fs[i], x, refs[i]);
            take_stats(&r, fs[i]);
        }
        ssize_t wr = write(p[1], &r, sizeof r);
        _exit(wr == (ssize_t)sizeof r ? 0 : 4);
    }
    return child_result(p, pid);
}

/* 2 exp(x) and tanh(x) + 1 on the same shape: their plans swapped, then
 * their kernels swapped (under re-forged headers).  Each swap is a miss:
 * the values stay those of the float64 references, and the entries are
 * replaced. */
START_TEST(swapped_entries_of_same_shaped_graphs_are_misses) {
    dirs d;
    make_dirs(&d);
    run_result r = run_pointwise_child(d.a);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.compiled, 2);
    char plans[4][300], sos[4][300];
    ck_assert_int_eq(list_kind(d.a, "plan", plans, 4), 2);
    ck_assert_int_eq(list_kind(d.a, "so", sos, 4), 2);
    swap_forged(plans[0], plans[1]);
    r = run_pointwise_child(d.a);
    ck_assert_msg(r.values_ok, "swapped plans: wrong values");
    ck_assert_int_eq(r.graphs_loaded, 0);
    ck_assert_int_eq(r.compiled, 0);
    r = run_pointwise_child(d.a);
    ck_assert_int_eq(r.graphs_loaded, 2);
    swap_forged(sos[0], sos[1]);
    r = run_pointwise_child(d.a);
    ck_assert_msg(r.values_ok, "swapped kernels: wrong values");
    ck_assert_int_eq(r.compiled, 2);
    r = run_pointwise_child(d.a);
    ck_assert(r.values_ok);
    ck_assert_int_eq(r.compiled, 0);
    ck_assert_int_eq(r.graphs_loaded, 2);
    remove_dirs(&d);
}
END_TEST

int main(void) {
    /* The tool and the processes it warms for must generate for one target:
     * under valgrind this process's CPU (as valgrind shows it) lacks the
     * AVX-512 the tool, run natively, would pick, so the keys would differ. */
    setenv("EMBER_JIT_MARCH", "x86-64-v2", 1);
    const tu_test tests[] = {
        {"record_warmup_then_a_new_process_compiles_nothing", record_warmup_then_a_new_process_compiles_nothing},
        {"lazy_mode_records_and_a_warmed_process_compiles_nothing", lazy_mode_records_and_a_warmed_process_compiles_nothing},
        {"a_bad_plan_is_a_miss_and_values_stay_right", a_bad_plan_is_a_miss_and_values_stay_right},
        {"plan_parser_rejects_what_does_not_fit_the_graph", plan_parser_rejects_what_does_not_fit_the_graph},
        {"save_api_and_warmup_list_errors", save_api_and_warmup_list_errors},
        {"export_import_round_trip_and_refusals", export_import_round_trip_and_refusals},
        {"verify_and_prune_on_damaged_entries", verify_and_prune_on_damaged_entries},
        {"two_concurrent_warmups_of_one_cache", two_concurrent_warmups_of_one_cache},
        {"cli_help_errors_and_trust", cli_help_errors_and_trust},
        {"swapped_plans_are_misses_and_replaced", swapped_plans_are_misses_and_replaced},
        {"damaged_plans_are_misses", damaged_plans_are_misses},
        {"swapped_kernels_are_misses_and_replaced", swapped_kernels_are_misses_and_replaced},
        {"directories_at_entry_names_are_replaced_and_removable", directories_at_entry_names_are_replaced_and_removable},
        {"world_writable_fan_out_dirs_load_nothing", world_writable_fan_out_dirs_load_nothing},
        {"swapped_entries_of_same_shaped_graphs_are_misses", swapped_entries_of_same_shaped_graphs_are_misses},
    };
    return tu_run(tu_suite("warmup", tests, sizeof tests / sizeof tests[0], 600));
}
