/* test_eager_check.c - the eager check (src/jit/runtime/entry.c): the
 * calls after a CPU entry's first compiled one alternate between its
 * compiled plan and its graph op by op, timed, and the entry keeps the
 * faster.
 *
 * Which plan is faster is made certain, not left to the machine: the
 * entries run the CPU's plans through a test backend that counts its runs,
 * and the check reads a fake clock that says how long each call took
 * (one cost when the plan ran, another when op by op did).  Every call's
 * values are checked against a float64 reference, whichever plan ran it;
 * em_compile's own path, on the real clock, is checked for values and a
 * bounded count. */
#include <math.h>
#include <stdlib.h>

#include "entry-impl.h"
#include "jit.h"
#include "testutil.h"
#include "trace.h"

static const char *const GRAPH = "graph(%x: f32[3, 5]{5, 1}, %y: f32[3, 5]{5, 1}) {\n"
                                 "  %2 = add(%x, %y) : f32[3, 5]{5, 1}\n"
                                 "  %3 = exp(%2) : f32[3, 5]{5, 1}\n"
                                 "  return (%3)\n"
                                 "}\n";

/* ---- test backends over the CPU's, and a fake clock ---- */

static int plan_runs;      /* calls of the test backend's run (Check forks each test) */
static int fail_at;        /* that run fails (0: none) */
/* What the fake clock says a call took: plan_cost when the test
 * backend's run ran in it, else (op by op) eager_cost; in seconds. */
static double plan_cost, eager_cost;

static em_status test_run(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out) {
    if (++plan_runs == fail_at) return em_error(EM_ERR_ARG, "test_run: this call fails");
    return jit_cpu_backend.run(state, g, in, out);
}

/* Read twice a timed call, before and after it. */
static double fake_clock(void) {
    static double now;
    static int reads, runs_at_start;
    if (reads++ % 2 == 0) {
        runs_at_start = plan_runs;
        return now;
    }
    now += plan_runs != runs_at_start ? plan_cost : eager_cost;
    return now;
}

static void costs(double plan, double eager, int fail) {
    plan_cost = plan, eager_cost = eager, fail_at = fail;
}

static jit_backend test_backend(bool host_timed) {
    jit_backend b = {.name = "test", .compile = jit_cpu_backend.compile, .run = test_run,
                     .free = jit_cpu_backend.free, .host_timed = host_timed};
    return b;
}

typedef struct fixture {
    jit_log log;
    jit_env env;
    jit_owner own;
    jit_backend backend;
    jit_entry *e;
} fixture;

/* An entry for text on backend b, compiled and ready, checked n calls. */
static void fixture_init(fixture *fx, const char *text, jit_backend b, int n) {
    jit_log_open(&fx->log); /* EMBER_LOG=tune shows the check's times */
    fx->env = (jit_env){.log = &fx->log};
    fx->own = (jit_owner){.name = "test", .log = &fx->log, .env = &fx->env, .eager_check = n,
                          .check_clock = fake_clock};
    fx->backend = b;
    tr_graph *g = tr_parse(text, NULL, 0);
    ck_assert_msg(g != NULL, "%s", em_last_error());
    fx->e = jit_entry_new(g, &fx->backend, NULL);
    ck_assert_ptr_nonnull(fx->e);
    ck_assert_int_eq(fx->backend.compile(g, &fx->env, &fx->e->state), EM_OK);
    fx->e->ready = true;
    plan_runs = 0;
}

static void fixture_free(fixture *fx) {
    jit_entry_free(fx->e);
    jit_log_close(&fx->log);
}

/* Runs the entry once on fresh inputs and checks exp(x + y). */
static void call_and_check(fixture *fx, int call) {
    em_scope_begin();
    int64_t sz[2] = {3, 5};
    em_tensor *in[2] = {tu_random(100 + (uint64_t)call, 2, sz, EM_F32, 1),
                        tu_random(200 + (uint64_t)call, 2, sz, EM_F32, 1)};
    em_tensor *out[1] = {NULL};
    ck_assert_int_eq(jit_entry_run(&fx->own, fx->e, true, NULL, in, out), EM_OK);
    double *x = tu_values(in[0]), *y = tu_values(in[1]), ref[15];
    for (int i = 0; i < 15; i++) ref[i] = exp(x[i] + y[i]);
    tu_check_close(out[0], ref, 2, sz, 1e-6, 1e-7);
    free(x), free(y);
    em_scope_end();
}

START_TEST(a_slower_plan_gives_way_to_op_by_op) {
    fixture fx;
    costs(2e-3, 1e-3, 0);
    fixture_init(&fx, GRAPH, test_backend(true), 3);
    /* call 1 untimed, then plan, op by op, ... three of each */
    for (int call = 0; call < 7; call++) {
        ck_assert(!fx.e->eager);
        call_and_check(&fx, call);
    }
    ck_assert_int_eq(plan_runs, 4);
    ck_assert(fx.e->eager);
    for (int call = 7; call < 12; call++) call_and_check(&fx, call);
    ck_assert_int_eq(plan_runs, 4); /* op by op for good */
    fixture_free(&fx);
}
END_TEST

static char *chain_graph(int n) {
    size_t cap = 128 + 64 * (size_t)n;
    char *t = malloc(cap);
    int len = snprintf(t, cap, "graph(%%x: f32[3, 5]{5, 1}, %%y: f32[3, 5]{5, 1}) {\n"
                               "  %%2 = add(%%x, %%y) : f32[3, 5]{5, 1}\n");
    /* tanh keeps the values in [-1, 1], so the chain stays finite */
    for (int i = 0; i < n; i++)
        len += snprintf(t + len, cap - (size_t)len, "  %%%d = tanh(%%%d) : f32[3, 5]{5, 1}\n", i + 3,
                        i + 2);
    snprintf(t + len, cap - (size_t)len, "  return (%%%d)\n}\n", n + 2);
    return t;
}

START_TEST(a_faster_plan_is_kept) {
    /* a chain of 60 tanh, op by op 1.5x the plan's time */
    enum { N = 60 };
    char *text = chain_graph(N);
    fixture fx;
    costs(1e-3, 1.5e-3, 0);
    fixture_init(&fx, text, test_backend(true), 5);
    int64_t sz[2] = {3, 5};
    for (int call = 0; call < 14; call++) {
        em_scope_begin();
        em_tensor *in[2] = {tu_random(7 + (uint64_t)call, 2, sz, EM_F32, 1),
                            tu_random(9 + (uint64_t)call, 2, sz, EM_F32, 1)};
        em_tensor *out[1] = {NULL};
        ck_assert_int_eq(jit_entry_run(&fx.own, fx.e, true, NULL, in, out), EM_OK);
        double *x = tu_values(in[0]), *y = tu_values(in[1]), ref[15];
        for (int i = 0; i < 15; i++) {
            ref[i] = x[i] + y[i];
            for (int k = 0; k < N; k++) ref[i] = tanh(ref[i]);
        }
        tu_check_close(out[0], ref, 2, sz, 1e-5, 1e-6);
        free(x), free(y);
        em_scope_end();
    }
    ck_assert(fx.e->check_over);
    ck_assert(!fx.e->eager);
    ck_assert_int_eq(plan_runs, 14 - 5); /* five calls ran op by op */
    fixture_free(&fx);
    free(text);
}
END_TEST

/* Not checked: off, a backend whose runs are not host-timed (CUDA), a
 * dynamic entry, a graph with an effect; each runs the plan every call. */
static void check_never(fixture *fx) {
    for (int call = 0; call < 9; call++) call_and_check(fx, call);
    ck_assert_int_eq(plan_runs, 9);
    ck_assert(!fx->e->eager);
    fixture_free(fx);
}

START_TEST(unchecked_entries_always_run_their_plan) {
    costs(2e-3, 1e-3, 0);
    fixture fx;
    fixture_init(&fx, GRAPH, test_backend(true), 0); /* off */
    check_never(&fx);
    fixture_init(&fx, GRAPH, test_backend(false), 3); /* not host-timed */
    check_never(&fx);
    fixture_init(&fx, GRAPH, test_backend(true), 3);
    fx.e->dynamic = true; /* no run_dynamic: run serves it */
    check_never(&fx);
}
END_TEST

START_TEST(a_graph_with_an_effect_is_not_checked) {
    static const char *const rnd =
        "graph(%x: f32[3, 5]{5, 1}) {\n"
        "  %1 = rand() [sizes=[3, 5], dtype=f32, device=cpu, seed=5, offset=0] : f32[3, 5]{5, 1}\n"
        "  %2 = add(%x, %1) : f32[3, 5]{5, 1}\n"
        "  return (%2)\n"
        "}\n";
    costs(2e-3, 1e-3, 0);
    fixture fx;
    fixture_init(&fx, rnd, test_backend(true), 3);
    int64_t sz[2] = {3, 5};
    for (int call = 0; call < 9; call++) {
        em_scope_begin();
        em_tensor *in[1] = {tu_random(3, 2, sz, EM_F32, 1)}, *out[1] = {NULL};
        ck_assert_int_eq(jit_entry_run(&fx.own, fx.e, true, NULL, in, out), EM_OK);
        em_scope_end();
    }
    ck_assert_int_eq(plan_runs, 9);
    ck_assert(!fx.e->eager);
    fixture_free(&fx);
}
END_TEST

START_TEST(a_failed_call_abandons_the_check) {
    costs(2e-3, 1e-3, 2); /* op by op would win; the first timed plan call fails */
    fixture fx;
    fixture_init(&fx, GRAPH, test_backend(true), 3);
    call_and_check(&fx, 0);
    em_scope_begin();
    int64_t sz[2] = {3, 5};
    em_tensor *in[2] = {tu_random(1, 2, sz, EM_F32, 1), tu_random(2, 2, sz, EM_F32, 1)};
    em_tensor *out[1] = {NULL};
    ck_assert_int_eq(jit_entry_run(&fx.own, fx.e, true, NULL, in, out), EM_ERR_ARG);
    em_scope_end();
    for (int call = 2; call < 9; call++) call_and_check(&fx, call);
    ck_assert(fx.e->check_over);
    ck_assert(!fx.e->eager); /* abandoned: the plan stays */
    ck_assert_int_eq(plan_runs, 9);
    fixture_free(&fx);
}
END_TEST

static em_status chain_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out);

START_TEST(environment_and_option) {
    jit_log log = {0};
    unsetenv("EMBER_EAGER_CHECK");
    ck_assert_int_eq(jit_env_eager_check(&log), 3);
    setenv("EMBER_EAGER_CHECK", "off", 1);
    ck_assert_int_eq(jit_env_eager_check(&log), 0);
    setenv("EMBER_EAGER_CHECK", "0", 1);
    ck_assert_int_eq(jit_env_eager_check(&log), 0);
    setenv("EMBER_EAGER_CHECK", "7", 1);
    ck_assert_int_eq(jit_env_eager_check(&log), 7);
    setenv("EMBER_EAGER_CHECK", "16", 1); /* past JIT_EAGER_CHECK_MAX */
    ck_assert_int_eq(jit_env_eager_check(&log), 3);
    setenv("EMBER_EAGER_CHECK", "two", 1);
    ck_assert_int_eq(jit_env_eager_check(&log), 3);
    unsetenv("EMBER_EAGER_CHECK");
    /* the option's range: -1, 0 and 1..15 */
    for (int bad = -3; bad <= 20; bad += 1) {
        if (bad >= -1 && bad <= JIT_EAGER_CHECK_MAX) continue;
        em_compile_options o = {.ninputs = 1, .noutputs = 1, .eager_check = bad};
        em_clear_error();
        ck_assert_ptr_null(em_compile(chain_fn, NULL, &o));
        ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
        ck_assert_msg(strstr(em_last_error(), "eager_check") != NULL, "%s", em_last_error());
    }
}
END_TEST

/* Through em_compile: every call right, whichever plan ran it.  Which
 * plan wins is the entry-level tests' (here the machine decides: under
 * valgrind, op by op can win), so the count is only bounded, and exact
 * with the check off. */
static em_status chain_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    em_tensor *t = in[0];
    for (int i = 0; i < 40 && t; i++) t = em_tanh(t);
    out[0] = t;
    return t ? EM_OK : em_last_status();
}

static void compiled_chain(int eager_check, int *eager_entries) {
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "chain", .eager_check = eager_check};
    em_compiled *f = em_compile(chain_fn, NULL, &o);
    ck_assert_ptr_nonnull(f);
    int64_t sz[2] = {7, 33}; /* odd sizes */
    for (int call = 0; call < 12; call++) {
        em_scope_begin();
        em_tensor *x = tu_random(40 + (uint64_t)call, 2, sz, EM_F32, 2), *y = NULL;
        ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
        double *v = tu_values(x);
        double *ref = malloc(sizeof(double) * 7 * 33);
        for (int i = 0; i < 7 * 33; i++) {
            ref[i] = v[i];
            for (int k = 0; k < 40; k++) ref[i] = tanh(ref[i]);
        }
        tu_check_close(y, ref, 2, sz, 1e-5, 1e-6);
        free(v), free(ref);
        em_scope_end();
    }
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    ck_assert_int_eq(st.entries, 1);
    ck_assert_int_eq(st.hits, 11);
    *eager_entries = st.eager_entries;
    em_compiled_free(f);
}

START_TEST(compiled_functions_report_their_choice) {
    int n;
    compiled_chain(4, &n);
    ck_assert_int_ge(n, 0);
    ck_assert_int_le(n, 1);
    compiled_chain(-1, &n);
    ck_assert_int_eq(n, 0);
}
END_TEST

int main(void) {
    const tu_test tests[] = {
        {"a_slower_plan_gives_way_to_op_by_op", a_slower_plan_gives_way_to_op_by_op},
        {"a_faster_plan_is_kept", a_faster_plan_is_kept},
        {"unchecked_entries_always_run_their_plan", unchecked_entries_always_run_their_plan},
        {"a_graph_with_an_effect_is_not_checked", a_graph_with_an_effect_is_not_checked},
        {"a_failed_call_abandons_the_check", a_failed_call_abandons_the_check},
        {"environment_and_option", environment_and_option},
        {"compiled_functions_report_their_choice", compiled_functions_report_their_choice},
    };
    return tu_run(tu_suite("eager_check", tests, sizeof tests / sizeof tests[0], 120));
}
