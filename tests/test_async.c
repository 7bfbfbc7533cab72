/* test_async.c - async compile in em_compile: calls run op by op while a
 * new entry compiles in a background thread, then switch to the compiled
 * entry; values equal before and after; freeing while compiling. */
#include "testutil.h"

#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jit.h"

static void ref_softmax(const double *x, int64_t rows, int64_t cols, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        const double *a = x + r * cols;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < cols; c++) m = a[c] > m ? a[c] : m;
        for (int64_t c = 0; c < cols; c++) s += exp(a[c] - m);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = exp(a[c] - m) / s;
    }
}

/* softmax(x * 2 + 1) over the last dim, then tanh: two kernels */
static em_status fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *t = em_softmax(em_add_scalar(em_mul_scalar(in[0], 2), 1), -1);
    out[0] = em_tanh(em_add(t, em_sum(t, 1, (const int[]){0}, true)));
    return out[0] ? EM_OK : em_last_status();
}

static double *reference(const em_tensor *x) {
    int64_t rows = em_size(x, 0), cols = em_size(x, 1);
    double *xv = tu_values(x), *y = malloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) xv[i] = 2 * xv[i] + 1;
    ref_softmax(xv, rows, cols, y);
    for (int64_t c = 0; c < cols; c++) {
        double s = 0;
        for (int64_t r = 0; r < rows; r++) s += y[r * cols + c];
        for (int64_t r = 0; r < rows; r++) xv[r * cols + c] = tanh(y[r * cols + c] + s);
    }
    free(y);
    return xv;
}

static void call_and_check(em_compiled *f, em_tensor *x) {
    em_tensor *y;
    ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
    double *ref = reference(x);
    tu_check_close(y, ref, 2, em_sizes(x), 1e-5, 1e-6);
    free(ref);
    em_release(y);
}

static em_compile_stats stats_of(const em_compiled *f) {
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    return st;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Calls f on x until a call is served by the compiled entry (hits beyond
 * the pending ones), at most for limit seconds; returns the calls made. */
static int64_t call_until_compiled(em_compiled *f, em_tensor *x, double limit) {
    int64_t calls = 0;
    double end = now() + limit;
    em_compile_stats st = stats_of(f);
    int64_t served = st.hits - st.pending;
    while (stats_of(f).hits - stats_of(f).pending == served && now() < end) {
        call_and_check(f, x);
        calls++;
        usleep(2000);
    }
    st = stats_of(f);
    ck_assert_msg(st.hits - st.pending > served, "no call reached the compiled entry in %.0f s",
                  limit);
    return calls;
}

static em_compile_options options(int async) {
    return (em_compile_options){.ninputs = 1, .noutputs = 1, .name = "f", .async_compile = async};
}

START_TEST(calls_switch_to_the_compiled_entry) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(fn, NULL, &o);
    em_tensor *x = tu_random(1, 2, TU_SIZES(64, 48), EM_F32, 1);
    call_and_check(f, x); /* traces (eagerly) and starts the compile */
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.entries, 1);
    call_until_compiled(f, x, 60);
    /* from now on the compiled entry serves, with the same values */
    st = stats_of(f);
    int64_t pending = st.pending;
    ck_assert_int_gt(st.kernels, 0);
    ck_assert_int_gt(st.kernels_compiled + st.kernels_loaded, 0);
    for (int i = 0; i < 3; i++) call_and_check(f, x);
    st = stats_of(f);
    ck_assert_int_eq(st.pending, pending);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.calls, st.hits + 1);
    em_compiled_free(f);
}
END_TEST

START_TEST(compiled_values_equal_the_op_by_op_ones) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(fn, NULL, &o);
    em_tensor *x = tu_random(2, 2, TU_SIZES(16, 40), EM_F32, 2), *before, *after;
    ck_assert_int_eq(em_call(f, &x, NULL, &before), EM_OK); /* the eager trace */
    call_until_compiled(f, x, 60);
    ck_assert_int_eq(em_call(f, &x, NULL, &after), EM_OK);
    double *a = tu_values(before);
    tu_check_close(after, a, 2, TU_SIZES(16, 40), 1e-6, 1e-7);
    free(a);
    em_compiled_free(f);
}
END_TEST

START_TEST(free_while_compiling_is_safe) {
    for (int i = 0; i < 3; i++) {
        em_compile_options o = options(1);
        em_compiled *f = em_compile(fn, NULL, &o);
        em_tensor *x = tu_random(3 + (uint64_t)i, 2, TU_SIZES(8, 8 + i), EM_F32, 1);
        call_and_check(f, x);
        if (i > 0) call_and_check(f, x); /* a second call, likely still op by op */
        em_compiled_free(f);             /* waits for the compile */
    }
}
END_TEST

START_TEST(async_with_dynamic_sizes) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(fn, NULL, &o);
    for (int64_t b = 2; b <= 11; b++) call_and_check(f, tu_random((uint64_t)b, 2, TU_SIZES(b, 24), EM_F32, 1));
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    call_until_compiled(f, tu_random(99, 2, TU_SIZES(13, 24), EM_F32, 1), 60);
    st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    em_compiled_free(f);
}
END_TEST

/* softmax over half rows: reshapes to sizes computed from the batch */
static em_status halves_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    int64_t b = em_size(in[0], 0), c = em_size(in[0], 1);
    em_tensor *h = em_softmax(em_reshape(in[0], 2, (const int64_t[]){2 * b, c / 2}), -1);
    out[0] = em_reshape(h, 2, (const int64_t[]){b, c});
    return out[0] ? EM_OK : em_last_status();
}

static void check_halves(em_compiled *f, em_tensor *x) {
    em_tensor *y;
    ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
    int64_t rows = em_size(x, 0), cols = em_size(x, 1);
    double *xv = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(rows * cols));
    ref_softmax(xv, 2 * rows, cols / 2, ref);
    tu_check_close(y, ref, 2, TU_SIZES(rows, cols), 1e-5, 1e-6);
    free(xv);
    free(ref);
}

START_TEST(async_with_reshapes_that_follow_the_batch) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(halves_fn, NULL, &o);
    for (int64_t b = 2; b <= 9; b++) check_halves(f, tu_random((uint64_t)b, 2, TU_SIZES(b, 12), EM_F32, 2));
    double end = now() + 60;
    em_compile_stats st = stats_of(f);
    int64_t served = st.hits - st.pending;
    for (int64_t b = 10; stats_of(f).hits - stats_of(f).pending == served && now() < end; b++) {
        check_halves(f, tu_random((uint64_t)b, 2, TU_SIZES(3 + b % 20, 12), EM_F32, 2));
        usleep(2000);
    }
    st = stats_of(f);
    ck_assert_int_gt(st.hits - st.pending, served);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    em_compiled_free(f);
}
END_TEST

START_TEST(environment_turns_it_on) {
    setenv("EMBER_ASYNC_COMPILE", "1", 1);
    em_compile_options o = options(0);
    em_compiled *f = em_compile(fn, NULL, &o);
    unsetenv("EMBER_ASYNC_COMPILE");
    em_tensor *x = tu_random(5, 2, TU_SIZES(12, 20), EM_F32, 1);
    call_and_check(f, x);
    call_until_compiled(f, x, 60);
    em_compiled_free(f);
    /* the option overrides the environment */
    setenv("EMBER_ASYNC_COMPILE", "1", 1);
    o = options(-1);
    f = em_compile(fn, NULL, &o);
    unsetenv("EMBER_ASYNC_COMPILE");
    call_and_check(f, x);
    call_and_check(f, x);
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.pending, 0); /* compiled in the first call */
    ck_assert_int_eq(st.hits, 1);
    ck_assert_int_gt(st.kernels, 0);
    em_compiled_free(f);
}
END_TEST

/* four softmaxes split by leading-dim sums (eager steps): several kernels,
 * some compiled by worker processes */
static em_status chain_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    const double *scale = ctx;
    em_tensor *x = in[0];
    for (int i = 0; i < 4; i++)
        x = em_add(em_softmax(em_mul_scalar(x, *scale + i), -1), em_sum(x, 1, (const int[]){0}, true));
    out[0] = x;
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(concurrent_background_compiles_finish) {
    /* three functions compiling at once, each spawning workers: a worker
     * must not inherit another's pipe (each would wait for the other) */
    static const double scales[3] = {0.5, 1.5, 2.5};
    em_compiled *f[3];
    em_tensor *x = tu_random(8, 2, TU_SIZES(6, 20), EM_F32, 1), *y[3];
    for (int i = 0; i < 3; i++) {
        em_compile_options o = options(1);
        f[i] = em_compile(chain_fn, (void *)&scales[i], &o);
        ck_assert_int_eq(em_call(f[i], &x, NULL, &y[i]), EM_OK);
    }
    for (int i = 0; i < 3; i++) {
        double *before = tu_values(y[i]);
        double end = now() + 120;
        em_compile_stats st = stats_of(f[i]);
        while (st.hits == st.pending && now() < end) {
            em_tensor *z;
            ck_assert_int_eq(em_call(f[i], &x, NULL, &z), EM_OK);
            tu_check_close(z, before, 2, TU_SIZES(6, 20), 1e-5, 1e-6);
            usleep(5000);
            st = stats_of(f[i]);
        }
        ck_assert_msg(st.hits > st.pending, "function %d never switched to its kernels", i);
        ck_assert_int_ge(st.kernels, 4);
        free(before);
    }
    for (int i = 0; i < 3; i++) em_compiled_free(f[i]);
}
END_TEST

typedef struct caller {
    em_compiled *f;
    int ok;
} caller;

static void *call_many(void *p) {
    caller *c = p;
    em_scope_begin();
    for (int i = 0; i < 40; i++) {
        em_scope_begin();
        em_tensor *x = tu_random(7, 2, TU_SIZES(10, 30), EM_F32, 1), *y;
        double *ref = reference(x), *v = NULL;
        if (em_call(c->f, &x, NULL, &y) == EM_OK && (v = tu_values(y))) {
            bool same = true;
            for (int k = 0; k < 300; k++) same &= fabs(v[k] - ref[k]) <= 1e-5 * fabs(ref[k]) + 1e-6;
            c->ok += same;
        }
        free(v);
        free(ref);
        em_scope_end();
        usleep(500);
    }
    em_scope_end();
    return NULL;
}

START_TEST(threads_call_while_it_compiles) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(fn, NULL, &o);
    pthread_t t[3];
    caller c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = (caller){f, 0};
        ck_assert_int_eq(pthread_create(&t[i], NULL, call_many, &c[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        ck_assert_int_eq(c[i].ok, 40);
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.calls, 120);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.hits, 119);
    em_compiled_free(f);
}
END_TEST

static Suite *suite(void) {
    const tu_test tests[] = {
        {"calls_switch_to_the_compiled_entry", calls_switch_to_the_compiled_entry},
        {"compiled_values_equal_the_op_by_op_ones", compiled_values_equal_the_op_by_op_ones},
        {"free_while_compiling_is_safe", free_while_compiling_is_safe},
        {"async_with_dynamic_sizes", async_with_dynamic_sizes},
        {"async_with_reshapes_that_follow_the_batch", async_with_reshapes_that_follow_the_batch},
        {"environment_turns_it_on", environment_turns_it_on},
        {"threads_call_while_it_compiles", threads_call_while_it_compiles},
        {"concurrent_background_compiles_finish", concurrent_background_compiles_finish},
    };
    return tu_suite("async", tests, sizeof tests / sizeof tests[0], 180);
}

int main(void) {
    setenv("EMBER_CACHE", "0", 1); /* memory only: every kernel really compiles */
    return tu_run(suite());
}
