/* test_tune.c - autotuning with remembered choices (src/jit/engine/tune.c).
 *
 * The CPU proposes no variants of its own, so the engine's mechanism is
 * driven through a test device: the CPU device's table with a variants
 * hook that proposes three candidate schedules of every kernel.  The
 * candidates compile to the CPU's kernel (the schedule changes nothing on
 * the CPU), each filed under its own variant key; the test device's load
 * maps that key back to the key the shared object embeds.  Timing is a
 * fixed stub (deterministic choices) or the CPU's real timer.  Results of
 * the tuned graphs are checked against float64 references; the CUDA
 * candidates' texts compile with NVRTC in test_cuda_emit. */
#include <ftw.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cpu_jit.h"
#include "engine-impl.h"
#include "jit.h"
#include "testutil.h"
#include "trace.h"

/* ---- the test device ---- */

enum { NCANDS = 3, MAXMAP = 64 };
/* A budget no test reaches: the CPU's candidates compile one by one, in
 * ~100 ms each (several seconds under valgrind), where a GPU's compile in
 * parallel in ~50 ms. */
#define NO_LIMIT 1e9

/* Variant key -> the key its shared object embeds (per test process:
 * Check forks each test). */
typedef struct key_pair {
    kc_key variant, plain;
} key_pair;
static key_pair key_map[MAXMAP];
static int nmap;

static int test_variants(int index, const k_kernel *k, jit_params *out, int max) {
    (void)index, (void)k;
    int n = max < NCANDS ? max : NCANDS;
    for (int i = 0; i < n; i++) out[i] = (jit_params){{i, 0, 0, 0}};
    return n;
}

static em_status test_compile(int index, const char *target, k_kernel *const *ks, const kc_key *keys,
                              const jit_params *params, int n, jit_env *env, jit_artifact *out) {
    (void)params; /* the CPU's kernel serves every candidate */
    for (int i = 0; i < n; i++) {
        kc_key plain;
        if (!ks[i] || !jit_cpu_device.key(ks[i], target, &plain, NULL)) continue;
        if (nmap < MAXMAP) key_map[nmap++] = (key_pair){keys[i], plain};
    }
    /* one by one: the candidates are one kernel, which a compile unit of
     * several would define twice */
    em_status s = EM_OK;
    for (int i = 0; s == EM_OK && i < n; i++)
        if (ks[i]) s = jit_cpu_device.compile(index, target, &ks[i], &keys[i], NULL, 1, env, &out[i]);
    return s;
}

static em_status test_load(int index, const jit_blob *b, const kc_key *key, jit_kernel **out) {
    const kc_key *embedded = key;
    for (int i = 0; i < nmap; i++)
        if (kc_key_equal(&key_map[i].variant, key)) embedded = &key_map[i].plain;
    return jit_cpu_device.load(index, b, embedded, out);
}

static bool test_model(int index, char *buf, size_t n) {
    (void)index;
    snprintf(buf, n, "test device");
    return true;
}

static jit_device test_device(void) {
    jit_device d = jit_cpu_device;
    d.name = "tunetest";
    d.variants = test_variants;
    d.compile = test_compile;
    d.load = test_load;
    d.model = test_model;
    d.split_rows = 0; /* one long row stays one kernel, the one tuned */
    return d;
}

/* The timing stub: fixed times by candidate, calls counted. */
typedef struct stub {
    double t[NCANDS];
    int calls;
} stub;

static double stub_time(void *ctx, const k_kernel *k, int i, const jit_params *p) {
    (void)k;
    stub *s = ctx;
    s->calls++;
    ck_assert_int_eq(p->v[0], i); /* the candidate's own parameters */
    return s->t[i];
}

/* ---- fixture: a cache directory ---- */

static char dir[64];

static void setup(void) {
    tu_setup();
    strcpy(dir, "/tmp/ember-test-tune-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    nmap = 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void teardown(void) {
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    tu_teardown();
}

/* ---- the graph: sum(exp(x + b), dim 1), b broadcast over rows ---- */

static em_status row_exp_sum(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_sum(em_exp(em_add(in[0], in[1])), 1, (int[]){1}, false);
    return out[0] ? EM_OK : em_last_status();
}

/* x [rows, cols] (transposed from [cols, rows] storage when transposed)
 * and b [cols]. */
typedef struct inputs {
    em_tensor *in[2];
    int64_t rows, cols;
} inputs;

static inputs make_inputs(int64_t rows, int64_t cols, bool transposed, uint64_t seed) {
    inputs x = {.rows = rows, .cols = cols};
    if (transposed) x.in[0] = em_transpose(tu_random(seed, 2, TU_SIZES(cols, rows), EM_F32, 0.5), 0, 1);
    else x.in[0] = tu_random(seed, 2, TU_SIZES(rows, cols), EM_F32, 0.5);
    x.in[1] = tu_random(seed + 1, 1, TU_SIZES(cols), EM_F32, 0.5);
    ck_assert_ptr_nonnull(x.in[0]);
    ck_assert_ptr_nonnull(x.in[1]);
    return x;
}

static tr_graph *record(const inputs *x, const char *const *names) {
    em_tensor *out[1] = {0};
    tr_recorder *r = tr_record_begin(2, x->in, names);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(row_exp_sum(NULL, x->in, NULL, out), EM_OK);
    char why[256] = "";
    tr_graph *g = tr_record_end(r, 1, out, why, sizeof why);
    ck_assert_msg(g != NULL, "%s %s", why, em_last_error());
    ck_assert_int_eq(tr_optimize(g, true), EM_OK);
    return g;
}

/* Runs st on x and checks the result against float64. */
static void check_result(jit_compiled *st, const tr_graph *g, const inputs *x) {
    em_tensor *out[1] = {0};
    ck_assert_msg(jit_engine_run(st, NULL, g, x->in, out) == EM_OK, "%s", em_last_error());
    double *xv = tu_values(x->in[0]), *bv = tu_values(x->in[1]);
    double *ref = malloc(sizeof(double) * (size_t)x->rows);
    for (int64_t r = 0; r < x->rows; r++) {
        ref[r] = 0;
        for (int64_t c = 0; c < x->cols; c++) ref[r] += exp(xv[r * x->cols + c] + bv[c]);
    }
    tu_check_close(out[0], ref, 1, (int64_t[]){x->rows}, 1e-4, 1e-4);
    free(xv), free(bv), free(ref);
}

/* The one kernel of st's plan (the graph fuses into one). */
static const jit_plan_kernel *only_kernel(const jit_compiled *st) {
    ck_assert_int_eq(st->plan.nkernels, 1);
    return &st->plan.kernels[0];
}

/* Compiles g on d with env; the state. */
static jit_compiled *compile(const jit_device *d, const tr_graph *g, jit_env *env) {
    jit_compiled *st = NULL;
    ck_assert_msg(jit_engine_compile(d, g, env, &st) == EM_OK, "%s", em_last_error());
    ck_assert_ptr_nonnull(st);
    ck_assert_int_eq(jit_engine_kernels(st), 1);
    return st;
}

/* An env that tunes with cache c under the timing stub s, unbounded. */
static jit_env tuning(kc_cache *c, stub *s) {
    return (jit_env){.cache = c, .autotune = true, .tune_budget = NO_LIMIT, .tune_time = stub_time,
                     .tune_ctx = s};
}

/* Compiles g on d with env and checks its result on x; its kernel's key. */
static kc_key compile_and_check(const jit_device *d, const tr_graph *g, const inputs *x, jit_env *env) {
    jit_compiled *st = compile(d, g, env);
    kc_key key = only_kernel(st)->key;
    check_result(st, g, x);
    jit_engine_free(st);
    return key;
}

/* The key the kernel of g has untuned on d (tuning off, no cache). */
static kc_key plain_key(const jit_device *d, const tr_graph *g) {
    jit_env env = {0};
    jit_compiled *st = compile(d, g, &env);
    kc_key k = only_kernel(st)->key;
    jit_engine_free(st);
    return k;
}

/* ---- tests ---- */

/* A fixed timing stub decides: the fastest candidate is chosen, its key
 * is the plan's, and the log names each candidate and the choice. */
START_TEST(stub_chooses_fastest) {
    jit_device d = test_device();
    inputs x = make_inputs(513, 641, false, 1); /* 1.3 MB: odd sizes */
    tr_graph *g = record(&x, NULL);
    kc_key plain = plain_key(&d, g);
    stub s = {{3e-3, 1e-3, 2e-3}, 0};
    char *logtext = NULL;
    size_t loglen = 0;
    jit_log log = {.flags = JIT_LOG_TUNE, .f = open_memstream(&logtext, &loglen)};
    kc_cache *c = kc_open(dir, 0);
    jit_env env = {.cache = c, .log = &log, .autotune = true, .tune_budget = NO_LIMIT,
                   .tune_time = stub_time, .tune_ctx = &s};
    jit_compiled *st = compile(&d, g, &env);
    fclose(log.f);
    ck_assert_msg(s.calls == NCANDS, "%s", logtext);
    ck_assert_int_eq(env.timed, NCANDS);
    ck_assert_int_eq(env.tuned, 1);
    ck_assert_int_eq(env.tune_hits, 0);
    kc_key want = jit_tune_key(&plain, &(jit_params){{1, 0, 0, 0}});
    ck_assert(!kc_key_equal(&want, &plain));
    ck_assert(kc_key_equal(&only_kernel(st)->key, &want));
    ck_assert_msg(strstr(logtext, "candidate 0 [0 0 0 0]: 3.0000 ms"), "%s", logtext);
    ck_assert_msg(strstr(logtext, "candidate 2 [2 0 0 0]: 2.0000 ms"), "%s", logtext);
    ck_assert_msg(strstr(logtext, "chose candidate 1 of 3"), "%s", logtext);
    check_result(st, g, &x);
    jit_engine_free(st);
    free(logtext);
    /* ties go to the earlier candidate: the default */
    kc_close(c);
    c = kc_open(dir, 0);
    stub tie = {{1e-3, 1e-3, 1e-3}, 0};
    inputs y = make_inputs(600, 700, false, 3);
    tr_graph *g2 = record(&y, NULL);
    kc_key plain2 = plain_key(&d, g2);
    jit_env env2 = tuning(c, &tie);
    kc_key got_env2 = compile_and_check(&d, g2, &y, &env2);
    ck_assert_int_eq(env2.tuned, 1);
    ck_assert(kc_key_equal(&got_env2, &plain2));
    kc_close(c);
    tr_graph_free(g);
    tr_graph_free(g2);
}
END_TEST

/* The choice is stored: a fresh cache handle on the same directory (as
 * another process) reuses it without timing, through the plan (a plan
 * hit) and through the tune record (a graph whose plan differs but whose
 * kernel is the same). */
START_TEST(choice_is_reused) {
    jit_device d = test_device();
    inputs x = make_inputs(512, 700, true, 5); /* non-contiguous x */
    tr_graph *g = record(&x, NULL);
    stub s = {{2e-3, 3e-3, 1e-3}, 0};
    kc_cache *c = kc_open(dir, 0);
    jit_env env = tuning(c, &s);
    kc_key chosen = compile_and_check(&d, g, &x, &env);
    ck_assert_int_eq(env.tuned, 1);
    kc_close(c);

    c = kc_open(dir, 0);
    s.calls = 0;
    jit_env again = tuning(c, &s);
    kc_key got_again = compile_and_check(&d, g, &x, &again);
    ck_assert_int_eq(again.plans_loaded, 1); /* the plan names the chosen kernel */
    ck_assert_int_eq(again.timed, 0);
    ck_assert_int_eq(again.tuned, 0);
    ck_assert(kc_key_equal(&got_again, &chosen));

    /* the same kernel in another graph (its inputs named): a plan miss,
     * the record gives the choice */
    tr_graph *named = record(&x, (const char *const[]){"a", "b"});
    jit_env other = tuning(c, &s);
    kc_key got_other = compile_and_check(&d, named, &x, &other);
    ck_assert_int_eq(other.plans_loaded, 0);
    ck_assert_int_eq(other.tune_hits, 1);
    ck_assert_int_eq(other.timed, 0);
    ck_assert_int_eq(s.calls, 0);
    ck_assert(kc_key_equal(&got_other, &chosen));
    kc_close(c);
    tr_graph_free(g);
    tr_graph_free(named);
}
END_TEST

/* Writes text as the tune record of g's kernel on d, then compiles g with
 * a stub that must not be called: the default kernel runs, correctly. */
static void bad_record_gives_default(const jit_device *d, const char *text) {
    inputs x = make_inputs(700, 513, false, 9);
    tr_graph *g = record(&x, NULL);
    kc_key plain = plain_key(d, g);
    kc_cache *c = kc_open(dir, 0);
    kc_key rk = jit_tune_record_key(d, "test device", &plain);
    ck_assert_int_eq(kc_put(c, &rk, "tune", text, strlen(text)), EM_OK);
    kc_close(c);
    c = kc_open(dir, 0);
    stub s = {{3e-3, 2e-3, 1e-3}, 0};
    jit_env env = tuning(c, &s);
    kc_key got = compile_and_check(d, g, &x, &env);
    ck_assert_int_eq(s.calls, 0);
    ck_assert_int_eq(env.tune_hits, 0);
    ck_assert_int_eq(env.tuned, 0);
    ck_assert(kc_key_equal(&got, &plain));
    kc_close(c);
    tr_graph_free(g);
    /* a clean directory for the next record */
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
}

/* Corrupt or foreign records are never trusted. */
START_TEST(bad_records_give_default) {
    jit_device d = test_device();
    bad_record_gives_default(&d, "garbage");
    bad_record_gives_default(&d, "");
    /* another kernel's record, filed under this kernel's key */
    bad_record_gives_default(&d, "ember-tune 1\nkernel 00000000000000000000000000000000\nmodel test device\n"
                                 "choice 1 of 3\nparams 1 0 0 0\n");
    /* the candidate index out of range, then parameters that are not the
     * candidate's, then another model: the kernel hex is filled in below */
    inputs x = make_inputs(700, 513, false, 9);
    tr_graph *g = record(&x, NULL);
    kc_key plain = plain_key(&d, g);
    tr_graph_free(g);
    char hex[KC_KEY_HEX_SIZE], text[256];
    kc_key_hex(&plain, hex);
    const char *tails[] = {"model test device\nchoice 7 of 3\nparams 1 0 0 0\n",
                           "model test device\nchoice -1 of 3\nparams 1 0 0 0\n",
                           "model test device\nchoice 1 of 3\nparams 2 0 0 0\n",
                           "model test device\nchoice 1 of 2\nparams 1 0 0 0\n",
                           "model another device\nchoice 1 of 3\nparams 1 0 0 0\n"};
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        snprintf(text, sizeof text, "ember-tune 1\nkernel %s\n%s", hex, tails[i]);
        bad_record_gives_default(&d, text);
    }
    /* the well-formed record is taken (the check above is not vacuous) */
    snprintf(text, sizeof text, "ember-tune 1\nkernel %s\nmodel test device\nchoice 1 of 3\nparams 1 0 0 0\n",
             hex);
    g = record(&x, NULL);
    kc_cache *c = kc_open(dir, 0);
    kc_key rk = jit_tune_record_key(&d, "test device", &plain);
    ck_assert_int_eq(kc_put(c, &rk, "tune", text, strlen(text)), EM_OK);
    stub any = {{1, 1, 1}, 0};
    jit_env env = tuning(c, &any);
    jit_compiled *st = compile(&d, g, &env);
    ck_assert_int_eq(env.tune_hits, 1);
    kc_key want = jit_tune_key(&plain, &(jit_params){{1, 0, 0, 0}});
    ck_assert(kc_key_equal(&only_kernel(st)->key, &want));
    check_result(st, g, &x);
    jit_engine_free(st);
    kc_close(c);
    tr_graph_free(g);
}
END_TEST

/* Tuning off (the default), a named target, a dry run, a device without
 * variants, or a kernel too small to matter: nothing is timed. */
START_TEST(off_means_no_timing) {
    jit_device d = test_device();
    inputs x = make_inputs(1, 300001, false, 11); /* one long row: 1.2 MB */
    tr_graph *g = record(&x, NULL);
    kc_key plain = plain_key(&d, g);
    stub s = {{3e-3, 1e-3, 2e-3}, 0};
    kc_cache *c = kc_open(dir, 0);
    jit_env off = {.cache = c, .tune_time = stub_time, .tune_ctx = &s};
    kc_key got = compile_and_check(&d, g, &x, &off);
    ck_assert_int_eq(s.calls, 0);
    ck_assert_int_eq(off.timed + off.tuned + off.tune_hits, 0);
    ck_assert(kc_key_equal(&got, &plain));
    jit_env on = tuning(c, &s);
    ck_assert(jit_tune_on(&d, 0, &on));
    jit_env dry = on, target = on;
    dry.dry_run = true;
    target.target = "some target";
    ck_assert(!jit_tune_on(&d, 0, &dry));
    ck_assert(!jit_tune_on(&d, 0, &target));
    ck_assert(!jit_tune_on(&jit_cpu_device, 0, &on)); /* the CPU proposes no variants */
    jit_device nomodel = d;
    nomodel.model = NULL;
    ck_assert(!jit_tune_on(&nomodel, 0, &on));
    /* tuned, the plan differs from the untuned one's (its key names the
     * model), so the untuned plan above is not reused */
    (void)compile_and_check(&d, g, &x, &on);
    ck_assert_int_eq(on.plans_loaded, 0);
    ck_assert_int_eq(on.tuned, 1);
    ck_assert_int_eq(s.calls, NCANDS);
    /* small: not worth timing */
    inputs small = make_inputs(8, 9, false, 13);
    tr_graph *gs = record(&small, NULL);
    s.calls = 0;
    jit_env env = tuning(c, &s);
    (void)compile_and_check(&d, gs, &small, &env);
    ck_assert_int_eq(s.calls, 0);
    ck_assert_int_eq(env.tuned, 0);
    kc_close(c);
    tr_graph_free(g);
    tr_graph_free(gs);
}
END_TEST

/* Past the budget, the kernels left keep their defaults and nothing is
 * remembered: a later compile with time to spare tunes them. */
START_TEST(budget_spent) {
    jit_device d = test_device();
    inputs x = make_inputs(300, 1000, false, 19);
    tr_graph *g = record(&x, NULL);
    kc_key plain = plain_key(&d, g);
    stub s = {{3e-3, 1e-3, 2e-3}, 0};
    kc_cache *c = kc_open(dir, 0);
    jit_env tight = {.cache = c, .autotune = true, .tune_budget = 1e-9, .tune_time = stub_time,
                     .tune_ctx = &s};
    kc_key got = compile_and_check(&d, g, &x, &tight);
    ck_assert_int_eq(s.calls, 0);
    ck_assert_int_eq(tight.tuned, 0);
    ck_assert(kc_key_equal(&got, &plain));
    /* (its plan was stored: a later compile of g would reuse it; another
     * graph with the same kernel finds no record and tunes) */
    tr_graph *named = record(&x, (const char *const[]){"p", "q"});
    jit_env wide = tuning(c, &s);
    (void)compile_and_check(&d, named, &x, &wide);
    ck_assert_int_eq(wide.tune_hits, 0);
    ck_assert_int_eq(wide.tuned, 1);
    ck_assert_int_eq(s.calls, NCANDS);
    kc_close(c);
    tr_graph_free(g);
    tr_graph_free(named);
}
END_TEST

/* Two row sums, the second of a matmul of the first (an eager step
 * between them: two kernels of one IR): sum(exp(x + b)), then
 * sum(exp(out0[:, None] @ zeros[1, n] + b)). */
static em_status two_sums(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_sum(em_exp(em_add(in[0], in[1])), 1, (int[]){1}, false);
    em_tensor *z = em_matmul(em_reshape(out[0], 2, (int64_t[]){em_size(out[0], 0), 1}), in[2]);
    out[1] = em_sum(em_exp(em_add(z, in[1])), 1, (int[]){1}, false);
    return out[0] && out[1] ? EM_OK : em_last_status();
}

/* Identical kernels of one graph (a model's repeated layers) are timed
 * once and take one choice. */
START_TEST(identical_kernels_tuned_once) {
    jit_device d = test_device();
    d.fuse_linear = NULL; /* z + b stays in the second kernel: the two kernels have one IR */
    enum { R = 300, C = 1001 };
    inputs x = make_inputs(R, C, false, 23);
    double *zeros = calloc(C, sizeof *zeros);
    em_tensor *in[3] = {x.in[0], x.in[1], tu_tensor(zeros, 2, TU_SIZES(1, C), EM_F32)}, *out[2] = {0};
    free(zeros);
    tr_recorder *r = tr_record_begin(3, in, NULL);
    ck_assert_int_eq(two_sums(NULL, in, NULL, out), EM_OK);
    char why[256] = "";
    tr_graph *g = tr_record_end(r, 2, out, why, sizeof why);
    ck_assert_msg(g != NULL, "%s", why);
    ck_assert_int_eq(tr_optimize(g, true), EM_OK);
    stub s = {{3e-3, 2e-3, 1e-3}, 0};
    kc_cache *c = kc_open(dir, 0);
    jit_env env = tuning(c, &s);
    jit_compiled *st = NULL;
    ck_assert_int_eq(jit_engine_compile(&d, g, &env, &st), EM_OK);
    ck_assert_int_eq(jit_engine_kernels(st), 2);
    ck_assert(kc_key_equal(&st->plan.kernels[0].key, &st->plan.kernels[1].key));
    ck_assert_int_eq(s.calls, NCANDS);
    ck_assert_int_eq(env.tuned, 1);
    em_tensor *res[2] = {0};
    ck_assert_msg(jit_engine_run(st, NULL, g, in, res) == EM_OK, "%s", em_last_error());
    double *xv = tu_values(in[0]), *bv = tu_values(in[1]), ref0[R], ref1[R];
    for (int i = 0; i < R; i++) {
        ref0[i] = ref1[i] = 0;
        for (int j = 0; j < C; j++) {
            ref0[i] += exp(xv[i * C + j] + bv[j]);
            ref1[i] += exp(bv[j]); /* out0 times zeros */
        }
    }
    tu_check_close(res[0], ref0, 1, (int64_t[]){R}, 1e-4, 1e-4);
    tu_check_close(res[1], ref1, 1, (int64_t[]){R}, 1e-4, 1e-4);
    free(xv), free(bv);
    jit_engine_free(st);
    kc_close(c);
    tr_graph_free(g);
}
END_TEST

/* Without a stub the device's timer runs (the CPU's clock): a choice is
 * made among the candidates and the result is right whichever it is. */
START_TEST(device_timer) {
    jit_device d = test_device();
    inputs x = make_inputs(400, 800, false, 17);
    tr_graph *g = record(&x, NULL);
    kc_key plain = plain_key(&d, g);
    kc_cache *c = kc_open(dir, 0);
    jit_env env = {.cache = c, .autotune = true, .tune_budget = NO_LIMIT};
    kc_key got = compile_and_check(&d, g, &x, &env);
    ck_assert_int_eq(env.tuned, 1);
    ck_assert_int_eq(env.timed, NCANDS);
    bool known = false;
    for (int i = 0; i < NCANDS; i++) {
        kc_key k = jit_tune_key(&plain, &(jit_params){{i, 0, 0, 0}});
        known |= kc_key_equal(&got, &k);
    }
    ck_assert(known);
    kc_close(c);
    tr_graph_free(g);
}
END_TEST

/* Keys and the median helper. */
START_TEST(keys_and_median) {
    kc_key base = {{1, 2, 3}};
    jit_params def = {{0, 0, 0, 0}}, one = {{1, 0, 0, 0}}, other = {{0, 1, 0, 0}};
    ck_assert(jit_params_default(&def));
    ck_assert(!jit_params_default(&other));
    kc_key a = jit_tune_key(&base, &def), b = jit_tune_key(&base, &one), e = jit_tune_key(&base, &other);
    ck_assert(kc_key_equal(&a, &base));
    ck_assert(!kc_key_equal(&b, &base) && !kc_key_equal(&b, &e));
    kc_key again = jit_tune_key(&base, &one);
    ck_assert(kc_key_equal(&b, &again));
    jit_device d = test_device();
    kc_key r1 = jit_tune_record_key(&d, "m1", &base), r2 = jit_tune_record_key(&d, "m2", &base);
    ck_assert(!kc_key_equal(&r1, &r2));
    double x[] = {5, 1, 4}, y[] = {4, 1, 3, 2}, z[] = {7};
    ck_assert_double_eq(jit_median(x, 3), 4);
    ck_assert_double_eq(jit_median(y, 4), 2.5);
    ck_assert_double_eq(jit_median(z, 1), 7);
}
END_TEST

/* EMBER_AUTOTUNE and em_compile's autotune option. */
static em_status scaled(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_sum(em_mul(in[0], in[0]), 1, (int[]){0}, false);
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(env_and_option) {
    setenv("EMBER_CACHE_DIR", dir, 1);
    char *logtext = NULL;
    size_t loglen = 0;
    jit_log log = {.f = open_memstream(&logtext, &loglen)};
    unsetenv("EMBER_AUTOTUNE");
    ck_assert(!jit_env_autotune(&log));
    const char *yes[] = {"1", "on"}, *no[] = {"0", "off", ""};
    for (size_t i = 0; i < 2; i++) {
        setenv("EMBER_AUTOTUNE", yes[i], 1);
        ck_assert(jit_env_autotune(&log));
    }
    for (size_t i = 0; i < 3; i++) {
        setenv("EMBER_AUTOTUNE", no[i], 1);
        ck_assert(!jit_env_autotune(&log));
    }
    setenv("EMBER_AUTOTUNE", "yes please", 1);
    ck_assert(!jit_env_autotune(&log));
    fflush(log.f);
    ck_assert_msg(strstr(logtext, "EMBER_AUTOTUNE=yes please is not 0, 1, on or off"), "%s", logtext);
    fclose(log.f);
    free(logtext);
    unsetenv("EMBER_AUTOTUNE");
    /* the option: -1, 0 and 1, anything else refused */
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .backend = "cpu", .autotune = 2};
    ck_assert_ptr_null(em_compile(scaled, NULL, &o));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "autotune (2)"), "%s", em_last_error());
    o.autotune = -2;
    ck_assert_ptr_null(em_compile(scaled, NULL, &o));
    em_clear_error();
    for (int v = -1; v <= 1; v++) {
        o.autotune = v;
        setenv("EMBER_AUTOTUNE", "1", 1);
        em_compiled *f = em_compile(scaled, NULL, &o);
        ck_assert_msg(f != NULL, "%s", em_last_error());
        /* on the CPU (no variants) tuning changes nothing: the result is
         * the same, column sums of squares of a broadcast-free input */
        em_tensor *in[1] = {tu_random(21 + (uint64_t)v, 2, TU_SIZES(37, 5), EM_F32, 1)}, *out[1] = {0};
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "%s", em_last_error());
        double *xv = tu_values(in[0]), ref[5] = {0};
        for (int r = 0; r < 37; r++)
            for (int c = 0; c < 5; c++) ref[c] += xv[r * 5 + c] * xv[r * 5 + c];
        tu_check_close(out[0], ref, 1, (int64_t[]){5}, 1e-5, 1e-5);
        free(xv);
        em_compile_stats st;
        ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
        ck_assert_int_eq(st.kernels_tuned + st.tune_hits, 0);
        ck_assert_int_eq(st.kernels_compiled + st.kernels_loaded, 1);
        em_compiled_free(f);
        unsetenv("EMBER_AUTOTUNE");
    }
}
END_TEST

/* ---- on a GPU (not in CI: the case is added only where cuda:0 works) ---- */

static em_status softmax_rows(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_softmax(in[0], 1);
    return out[0] ? EM_OK : em_last_status();
}

/* Compiles softmax_rows on cuda:0 with autotune on (input named name),
 * calls it on x (rows x cols, host values xv), checks the result against
 * float64 and gives the function's statistics. */
static em_compile_stats cuda_softmax(const float *xv, int64_t rows, int64_t cols, const char *name) {
    const char *names[1] = {name};
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .backend = "cuda", .autotune = 1,
                            .input_names = names};
    em_compiled *f = em_compile(softmax_rows, NULL, &o);
    ck_assert_msg(f != NULL, "%s", em_last_error());
    em_tensor *in[1] = {em_from_data(xv, EM_F32, 2, (int64_t[]){rows, cols}, em_cuda(0))}, *out[1] = {0};
    ck_assert_msg(in[0] && em_call(f, in, NULL, out) == EM_OK, "%s", em_last_error());
    float *got = malloc(sizeof(float) * (size_t)(rows * cols));
    ck_assert_int_eq(em_copy_to_host(out[0], got, sizeof(float) * (size_t)(rows * cols)), EM_OK);
    for (int64_t r = 0; r < rows; r++) {
        const float *x = xv + r * cols;
        double m = x[0], sum = 0;
        for (int64_t c = 1; c < cols; c++) m = x[c] > m ? x[c] : m;
        for (int64_t c = 0; c < cols; c++) sum += exp((double)x[c] - m);
        for (int64_t c = 0; c < cols; c++) {
            double want = exp((double)x[c] - m) / sum;
            ck_assert_msg(fabs(got[r * cols + c] - want) <= 1e-5 * want + 1e-7,
                          "row %lld col %lld: %g, want %g", (long long)r, (long long)c, got[r * cols + c],
                          want);
        }
    }
    free(got);
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    em_compiled_free(f);
    return st;
}

/* The real path: candidates timed with CUDA events, the choice stored;
 * a second function (as a second process would) takes the plan, a third
 * whose graph differs (its input named) the remembered choice. */
START_TEST(cuda_tunes_rows) {
    setenv("EMBER_CACHE_DIR", dir, 1);
    enum { ROWS = 2048, COLS = 4099 }; /* 32 MB; odd rows: head and tail steps */
    float *xv = malloc(sizeof(float) * ROWS * COLS);
    for (int64_t i = 0; i < (int64_t)ROWS * COLS; i++) xv[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f;
    em_compile_stats first = cuda_softmax(xv, ROWS, COLS, "x");
    ck_assert_int_ge(first.kernels_tuned, 1);
    ck_assert_int_eq(first.tune_hits, 0);
    em_compile_stats again = cuda_softmax(xv, ROWS, COLS, "x");
    ck_assert_int_eq(again.graphs_loaded, 1);
    ck_assert_int_eq(again.kernels_tuned, 0);
    em_compile_stats other = cuda_softmax(xv, ROWS, COLS, "y");
    ck_assert_int_eq(other.graphs_loaded, 0);
    ck_assert_int_eq(other.kernels_tuned, 0);
    ck_assert_int_eq(other.tune_hits, first.kernels_tuned);
    free(xv);
}
END_TEST

int main(void) {
    const tu_test tests[] = {
        {"stub_chooses_fastest", stub_chooses_fastest},
        {"choice_is_reused", choice_is_reused},
        {"bad_records_give_default", bad_records_give_default},
        {"off_means_no_timing", off_means_no_timing},
        {"budget_spent", budget_spent},
        {"identical_kernels_tuned_once", identical_kernels_tuned_once},
        {"device_timer", device_timer},
        {"keys_and_median", keys_and_median},
        {"env_and_option", env_and_option},
        {"cuda_tunes_rows", cuda_tunes_rows},
    };
    char why[512];
    bool gpu = tu_probe_gpu(why, sizeof why);
    if (!gpu) printf("no GPU (%s): cuda_tunes_rows not run\n", why);
    size_t n = sizeof tests / sizeof tests[0] - !gpu; /* the GPU case is the last */
    Suite *s = suite_create("tune");
    for (size_t i = 0; i < n; i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown); /* tu_setup's scope, and a cache directory */
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, tests[i].test);
        suite_add_tcase(s, tc);
    }
    return tu_run(s);
}
