/* test_dynamic.c - automatic dynamic shapes in em_compile: a function
 * called with many sizes compiles twice (one static entry, one dynamic),
 * sizes 0 and 1 stay specialized, graphs whose attributes may carry a size
 * stay static, EMBER_DYNAMIC=0 and the forced mode; every call's values
 * against float64 references computed here. */
#include "testutil.h"

#include <string.h>
#include <unistd.h>

#include "cpu_gccjit.h"
#include "jit.h"

/* ---- float64 references ---- */

static void ref_softmax(const double *x, int64_t rows, int64_t cols, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        const double *a = x + r * cols;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < cols; c++) m = a[c] > m ? a[c] : m;
        for (int64_t c = 0; c < cols; c++) s += exp(a[c] - m);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = exp(a[c] - m) / s;
    }
}

static void ref_layer_norm(const double *x, const double *w, const double *b, int64_t rows,
                           int64_t cols, double eps, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        const double *a = x + r * cols;
        double mean = 0, var = 0;
        for (int64_t c = 0; c < cols; c++) mean += a[c] / (double)cols;
        for (int64_t c = 0; c < cols; c++) var += (a[c] - mean) * (a[c] - mean) / (double)cols;
        for (int64_t c = 0; c < cols; c++)
            y[r * cols + c] = (a[c] - mean) / sqrt(var + eps) * w[c] + b[c];
    }
}

/* y[r, :] = act(x[r, :] @ w + b) */
static void ref_linear(const double *x, const double *w, const double *b, int64_t rows, int64_t k,
                       int64_t n, bool relu, double *y) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            double s = b[j];
            for (int64_t i = 0; i < k; i++) s += x[r * k + i] * w[i * n + j];
            y[r * n + j] = relu && s < 0 ? 0 : s;
        }
}

/* ---- functions under test ---- */

static em_status softmax_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    out[0] = em_softmax(in[0], -1);
    return out[0] ? EM_OK : em_last_status();
}

static em_status layer_norm_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    out[0] = em_layer_norm(in[0], 1, in[1], in[2], 1e-5);
    return out[0] ? EM_OK : em_last_status();
}

typedef struct mlp {
    em_tensor *w1, *b1, *w2, *b2;
} mlp;

/* relu(x @ w1 + b1) @ w2 + b2, weights captured through ctx */
static em_status mlp_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    const mlp *m = ctx;
    out[0] = em_add(em_matmul(em_relu(em_add(em_matmul(in[0], m->w1), m->b1)), m->w2), m->b2);
    return out[0] ? EM_OK : em_last_status();
}

/* sum over pairs of columns: a reshape whose sizes hold the batch */
static em_status pairs_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    int64_t b = em_size(in[0], 0), c = em_size(in[0], 1);
    em_tensor *r = em_reshape(in[0], 3, TU_SIZES(b, c / 2, 2));
    out[0] = em_exp(em_sum(r, 1, (const int[]){2}, false));
    return out[0] ? EM_OK : em_last_status();
}

/* x + a created [b, 1] tensor: a creation op's sizes hold the batch */
static em_status created_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *c = em_full(2, TU_SIZES(em_size(in[0], 0), 1), 0.75, EM_F32, em_cpu());
    out[0] = em_sigmoid(em_add(in[0], c));
    return out[0] ? EM_OK : em_last_status();
}

/* a created [b * b] tensor: sizes that are not a multiple of the batch */
static em_status square_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    int64_t b = em_size(in[0], 0);
    out[0] = em_mul_scalar(em_full(1, TU_SIZES(b * b), 0.5, EM_F32, em_cpu()), 2.0);
    return out[0] ? EM_OK : em_last_status();
}

/* x / batch: a value computed from the batch size */
static em_status per_row_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    out[0] = em_tanh(em_mul_scalar(in[0], 1.0 / (double)em_size(in[0], 0)));
    return out[0] ? EM_OK : em_last_status();
}

static em_compile_options options(const char *name, int nin, int dynamic) {
    static const char *names[] = {"x", "w", "b"};
    return (em_compile_options){.ninputs = nin, .noutputs = 1, .name = name,
                                .input_names = names, .dynamic = dynamic};
}

static em_compile_stats stats_of(const em_compiled *f) {
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    return st;
}

/* What em_compiled_print prints of f's entry (0: the most recently
 * used); the caller frees it. */
static char *printed(const em_compiled *f, int entry) {
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(em_compiled_print(f, entry, false, fp), EM_OK);
    fclose(fp);
    return text;
}

/* f called on a random x [b, cols] (seed b, into *x); its result. */
static em_tensor *call_at(em_compiled *f, int64_t b, int64_t cols, em_tensor **x) {
    em_tensor *y = NULL;
    *x = tu_random((uint64_t)b, 2, TU_SIZES(b, cols), EM_F32, 1);
    ck_assert_msg(em_call(f, x, NULL, &y) == EM_OK, "%s", em_last_error());
    return y;
}

/* Asserts f's trace and dynamic-entry counts, then frees it. */
static void expect_entries(em_compiled *f, int64_t traces, int dynamic) {
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, traces);
    ck_assert_int_eq(st.dynamic_entries, dynamic);
    em_compiled_free(f);
}

/* Calls softmax_fn's compiled form on x and checks the values. */
static void check_softmax_call(em_compiled *f, em_tensor *x) {
    em_tensor *y;
    ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
    int64_t rows = em_size(x, 0), cols = em_size(x, 1);
    double *xv = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(rows * cols + 1));
    ref_softmax(xv, rows, cols, ref);
    tu_check_close(y, ref, 2, TU_SIZES(rows, cols), 1e-5, 1e-6);
    free(xv);
    free(ref);
}

static void check_layer_norm_call(em_compiled *f, int64_t rows, int64_t cols, uint64_t seed) {
    em_tensor *in[3] = {tu_random(seed, 2, TU_SIZES(rows, cols), EM_F32, 2),
                        tu_random(seed + 1, 1, TU_SIZES(cols), EM_F32, 1),
                        tu_random(seed + 2, 1, TU_SIZES(cols), EM_F32, 1)}, *y;
    ck_assert_msg(em_call(f, in, NULL, &y) == EM_OK, "%s", em_last_error());
    double *x = tu_values(in[0]), *w = tu_values(in[1]), *b = tu_values(in[2]);
    double *ref = malloc(sizeof(double) * (size_t)(rows * cols));
    ref_layer_norm(x, w, b, rows, cols, 1e-5, ref);
    tu_check_close(y, ref, 2, TU_SIZES(rows, cols), 1e-4, 1e-4);
    free(x), free(w), free(b), free(ref);
}

/* ---- the compile counts ---- */

START_TEST(ten_batch_sizes_of_softmax_compile_twice) {
    em_compile_options o = options("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    int64_t after_second = -1;
    for (int64_t b = 2; b <= 11; b++) {
        check_softmax_call(f, tu_random((uint64_t)b, 2, TU_SIZES(b, 24), EM_F32, 3));
        em_compile_stats st = stats_of(f);
        if (b == 3) after_second = st.kernels_compiled + st.kernels_loaded;
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.entries, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    ck_assert_int_eq(st.hits, 8);
    ck_assert_int_eq(st.eager, 0);
    /* every kernel came from the first two compiles */
    ck_assert_int_eq(st.kernels_compiled + st.kernels_loaded, after_second);
    ck_assert_int_gt(st.kernels, 0);
    /* the entry the later calls used prints its dynamic dim: the batch,
     * which changed (the width, which the function never reads, is not
     * widened: it keeps its static kernels) */
    char *text = printed(f, 0);
    ck_assert_msg(strstr(text, "dynamic=[0] (dim 0 >= 1)"), "%s", text);
    free(text);
    em_compiled_free(f);
}
END_TEST

START_TEST(layer_norm_over_batch_and_hidden_sizes) {
    em_compile_options o = options("ln", 3, 0);
    em_compiled *f = em_compile(layer_norm_fn, NULL, &o);
    for (int64_t b = 2; b <= 11; b++) check_layer_norm_call(f, b, 32, (uint64_t)(10 * b));
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    em_compiled_free(f);
    /* the normalized dim itself: the kernel's row length and the mean's
     * count become size arguments */
    f = em_compile(layer_norm_fn, NULL, &o);
    for (int64_t h = 8; h <= 17; h++) check_layer_norm_call(f, 4, h, (uint64_t)(7 * h));
    st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    em_compiled_free(f);
}
END_TEST

START_TEST(mlp_with_weights_compiles_twice) {
    mlp m = {tu_random(1, 2, TU_SIZES(16, 32), EM_F32, 0.3), tu_random(2, 1, TU_SIZES(32), EM_F32, 0.1),
             tu_random(3, 2, TU_SIZES(32, 8), EM_F32, 0.3), tu_random(4, 1, TU_SIZES(8), EM_F32, 0.1)};
    double *w1 = tu_values(m.w1), *b1 = tu_values(m.b1), *w2 = tu_values(m.w2), *b2 = tu_values(m.b2);
    em_compile_options o = options("mlp", 1, 0);
    em_compiled *f = em_compile(mlp_fn, &m, &o);
    for (int64_t b = 2; b <= 11; b++) {
        em_tensor *x = tu_random((uint64_t)(100 + b), 2, TU_SIZES(b, 16), EM_F32, 1), *y;
        ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
        double *xv = tu_values(x), h[11 * 32], ref[11 * 8];
        ref_linear(xv, w1, b1, b, 16, 32, true, h);
        ref_linear(h, w2, b2, b, 32, 8, false, ref);
        tu_check_close(y, ref, 2, TU_SIZES(b, 8), 1e-4, 1e-4);
        free(xv);
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.entries, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    em_compiled_free(f);
    free(w1), free(b1), free(w2), free(b2);
}
END_TEST

START_TEST(size_one_joins_a_dynamic_entry_size_zero_stays_specialized) {
    em_compile_options o = options("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    check_softmax_call(f, tu_random(1, 2, TU_SIZES(4, 8), EM_F32, 1));
    check_softmax_call(f, tu_random(2, 2, TU_SIZES(5, 8), EM_F32, 1)); /* dim 0 dynamic */
    ck_assert_int_eq(stats_of(f).entries, 2);
    /* a dry trace at 1 gave the same graph: the dynamic entry takes 1 */
    check_softmax_call(f, tu_random(3, 2, TU_SIZES(1, 8), EM_F32, 1));
    ck_assert_int_eq(stats_of(f).entries, 2);
    check_softmax_call(f, tu_random(4, 2, TU_SIZES(0, 8), EM_F32, 1)); /* its own entry */
    ck_assert_int_eq(stats_of(f).entries, 3);
    check_softmax_call(f, tu_random(5, 2, TU_SIZES(9, 8), EM_F32, 1)); /* the dynamic entry */
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.entries, 3);
    ck_assert_int_eq(st.dynamic_entries, 1);
    ck_assert_int_eq(st.hits, 2);
    char *text = printed(f, 0);
    ck_assert_msg(strstr(text, "dynamic=[0] (dim 0 >= 1)"), "%s", text);
    free(text);
    em_compiled_free(f);
}
END_TEST

/* softmax, doubled when there is one row: the C code branches on a size,
 * so the graph at 1 is another graph. */
static em_status branch_at_one_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    em_tensor *y = em_softmax(in[0], -1);
    out[0] = y && em_size(in[0], 0) == 1 ? em_mul_scalar(y, 2) : y;
    return out[0] ? EM_OK : em_last_status();
}

static em_status product_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    out[0] = em_mul(in[0], in[1]);
    return out[0] ? EM_OK : em_last_status();
}

/* x * y for x [rx, 3] and y [ry, 3], checked against float64. */
static void check_product(em_compiled *f, int64_t rx, int64_t ry, uint64_t seed) {
    em_tensor *in[2] = {tu_random(seed, 2, TU_SIZES(rx, 3), EM_F32, 1),
                        tu_random(seed + 1, 2, TU_SIZES(ry, 3), EM_F32, 1)}, *y;
    ck_assert_msg(em_call(f, in, NULL, &y) == EM_OK, "%s", em_last_error());
    int64_t r = rx > ry ? rx : ry;
    double *a = tu_values(in[0]), *b = tu_values(in[1]), ref[8 * 3];
    for (int64_t i = 0; i < r * 3; i++) ref[i] = a[(rx == 1 ? 0 : i / 3) * 3 + i % 3] * b[(ry == 1 ? 0 : i / 3) * 3 + i % 3];
    tu_check_close(y, ref, 2, TU_SIZES(r, 3), 1e-6, 1e-7);
    free(a), free(b);
}

START_TEST(dims_of_one_symbol_are_tied_by_a_guard) {
    em_compile_options o = options("product", 2, 0);
    em_compiled *f = em_compile(product_fn, NULL, &o);
    check_product(f, 4, 4, 1);
    check_product(f, 5, 5, 3); /* dynamic in both rows, one symbol */
    check_product(f, 1, 1, 5); /* size 1 joined */
    ck_assert_int_eq(stats_of(f).traces, 2);
    char *text = printed(f, 0);
    ck_assert_msg(strstr(text, "guard w[0] (input 1 dim 0) == x[0] (input 0 dim 0)\n"), "%s", text);
    free(text);
    /* a broadcast of y's rows is not the traced graph: the tie refuses it,
     * with the reason, and the call gets an entry of its own */
    check_product(f, 7, 1, 7);
    ck_assert_msg(strstr(stats_of(f).last_failure, "w[0] (input 1 dim 0) must equal x[0] (input 0 "
                         "dim 0), got 1 and 7"), "%s", stats_of(f).last_failure);
    check_product(f, 6, 6, 9); /* the dynamic entry again */
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 3);
    ck_assert_int_eq(st.hits, 2);
    em_compiled_free(f);
}
END_TEST

/* An arange over every element of x [b, t], its count from em_numel (not
 * a size read Ember sees), and exp(x). */
static em_status count_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    out[0] = em_arange(0, (double)em_numel(in[0]), 1, EM_F32, em_cpu());
    out[1] = em_exp(in[0]);
    return out[0] && out[1] ? EM_OK : em_last_status();
}

START_TEST(a_size_of_two_symbols_follows_their_product) {
    em_compile_options o = options("count", 1, 0);
    o.noutputs = 2;
    em_compiled *f = em_compile(count_fn, NULL, &o);
    /* [3, 5] makes b dynamic with the count 5 * b; [3, 7] moves t with b
     * at 3 in both traces, where 3 * t fits too: only a dry trace that
     * moves both tells it is b * t */
    static const int64_t bt[][2] = {{2, 5}, {3, 5}, {3, 7}, {4, 6}, {5, 9}, {1, 4}};
    for (int i = 0; i < 6; i++) {
        int64_t b = bt[i][0], t = bt[i][1];
        em_tensor *x = tu_random((uint64_t)(30 + i), 2, TU_SIZES(b, t), EM_F32, 1), *y[2];
        ck_assert_msg(em_call(f, &x, NULL, y) == EM_OK, "%s", em_last_error());
        double ref[64], *xv = tu_values(x);
        for (int64_t k = 0; k < b * t; k++) ref[k] = (double)k;
        tu_check_close(y[0], ref, 1, TU_SIZES(b * t), 0, 0);
        for (int64_t k = 0; k < b * t; k++) ref[k] = exp(xv[k]);
        tu_check_close(y[1], ref, 2, TU_SIZES(b, t), 1e-6, 1e-7);
        free(xv);
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.eager, 0);
    ck_assert_int_eq(st.traces, 3);
    ck_assert_int_eq(st.hits, 3);
    em_compiled_free(f);
}
END_TEST

START_TEST(a_function_that_branches_at_one_keeps_one_specialized) {
    em_compile_options o = options("branch", 1, 0);
    em_compiled *f = em_compile(branch_at_one_fn, NULL, &o);
    int64_t rows[] = {4, 5, 1, 7, 1};
    for (int i = 0; i < 5; i++) {
        em_tensor *x = tu_random((uint64_t)(10 + i), 2, TU_SIZES(rows[i], 6), EM_F32, 1), *y;
        ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
        double *xv = tu_values(x), ref[7 * 6];
        ref_softmax(xv, rows[i], 6, ref);
        for (int k = 0; rows[i] == 1 && k < 6; k++) ref[k] *= 2;
        tu_check_close(y, ref, 2, TU_SIZES(rows[i], 6), 1e-5, 1e-6);
        free(xv);
        /* the dynamic entry's guard says why 1 is not its size */
        if (i == 2)
            ck_assert_msg(strstr(stats_of(f).last_failure, "size at dynamic dim 0 is 1 (0 and 1 are "
                                 "specialized"), "%s", stats_of(f).last_failure);
    }
    /* [4] static, [5] dynamic (not at 1), [1] its own entry, found again */
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.entries, 3);
    ck_assert_int_eq(st.dynamic_entries, 1);
    ck_assert_int_eq(st.hits, 2);
    char *text = printed(f, 1);
    ck_assert_msg(strstr(text, "dynamic=[0] (>= 2)"), "%s", text);
    free(text);
    em_compiled_free(f);
}
END_TEST

START_TEST(a_second_dim_joins_the_dynamic_ones) {
    em_compile_options o = options("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    check_softmax_call(f, tu_random(1, 2, TU_SIZES(4, 8), EM_F32, 1));
    check_softmax_call(f, tu_random(2, 2, TU_SIZES(6, 8), EM_F32, 1)); /* [s0, 8] */
    check_softmax_call(f, tu_random(3, 2, TU_SIZES(6, 12), EM_F32, 1)); /* [s0, s1] */
    for (int64_t i = 0; i < 6; i++)
        check_softmax_call(f, tu_random(4 + (uint64_t)i, 2, TU_SIZES(3 + i, 5 + 3 * i), EM_F32, 2));
    em_compile_stats st = stats_of(f);
    /* the width is not widened at the second call: softmax_fn never reads it */
    ck_assert_int_eq(st.traces, 3);
    ck_assert_int_eq(st.dynamic_entries, 2);
    ck_assert_int_eq(st.hits, 6);
    em_compiled_free(f);
}
END_TEST

static void one_entry_per_size(em_compiled *f) {
    for (int64_t b = 2; b <= 7; b++)
        check_softmax_call(f, tu_random((uint64_t)b, 2, TU_SIZES(b, 8), EM_F32, 1));
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 4); /* the limit */
    ck_assert_int_eq(st.eager, 2);
    ck_assert_int_eq(st.dynamic_entries, 0);
    em_compiled_free(f);
}

START_TEST(dynamic_off_gives_one_entry_per_size) {
    em_compile_options o = options("softmax", 1, -1);
    o.recompile_limit = 4;
    one_entry_per_size(em_compile(softmax_fn, NULL, &o));
    setenv("EMBER_DYNAMIC", "0", 1);
    o.dynamic = 0;
    one_entry_per_size(em_compile(softmax_fn, NULL, &o));
    unsetenv("EMBER_DYNAMIC");
}
END_TEST

START_TEST(forced_dynamic_compiles_once) {
    em_compile_options o = options("softmax", 1, 1);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    for (int64_t b = 2; b <= 11; b++)
        check_softmax_call(f, tu_random((uint64_t)b, 2, TU_SIZES(b, 4 + b), EM_F32, 2));
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.dynamic_entries, 1);
    ck_assert_int_eq(st.hits, 9);
    em_compiled_free(f);
    setenv("EMBER_DYNAMIC", "force", 1);
    o.dynamic = 0;
    f = em_compile(softmax_fn, NULL, &o);
    for (int64_t b = 2; b <= 5; b++)
        check_softmax_call(f, tu_random((uint64_t)b, 2, TU_SIZES(b, 8), EM_F32, 2));
    ck_assert_int_eq(stats_of(f).traces, 1);
    em_compiled_free(f);
    unsetenv("EMBER_DYNAMIC");
}
END_TEST

START_TEST(more_sizes_than_an_entry_remembers) {
    /* past 16 sizes, a dynamic entry checks its kernels on every call */
    em_compile_options o = options("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    for (int round = 0; round < 2; round++)
        for (int64_t b = 2; b <= 25; b++)
            check_softmax_call(f, tu_random((uint64_t)(b + 100 * round), 2, TU_SIZES(b, 12), EM_F32, 2));
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.hits, 46);
    em_compiled_free(f);
}
END_TEST

static em_status add_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    out[0] = em_exp(em_add(in[0], in[1]));
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(inputs_sharing_a_dynamic_size) {
    em_compile_options o = options("add", 2, 0);
    em_compiled *f = em_compile(add_fn, NULL, &o);
    for (int64_t b = 2; b <= 6; b++) {
        em_tensor *in[2] = {tu_random((uint64_t)b, 2, TU_SIZES(b, 16), EM_F32, 1),
                            tu_random((uint64_t)(50 + b), 2, TU_SIZES(b, 16), EM_F32, 1)}, *y;
        ck_assert_msg(em_call(f, in, NULL, &y) == EM_OK, "%s", em_last_error());
        double *x0 = tu_values(in[0]), *x1 = tu_values(in[1]), ref[6 * 16];
        for (int64_t i = 0; i < b * 16; i++) ref[i] = exp(x0[i] + x1[i]);
        tu_check_close(y, ref, 2, TU_SIZES(b, 16), 1e-6, 1e-7);
        free(x0), free(x1);
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    /* sizes that pass each input's guards but not the tie between them
     * (they do not broadcast either): no entry serves the call, and the
     * function's own error comes back when it runs */
    em_tensor *bad[2] = {tu_random(1, 2, TU_SIZES(3, 16), EM_F32, 1),
                         tu_random(2, 2, TU_SIZES(5, 16), EM_F32, 1)}, *y;
    em_clear_error();
    ck_assert_int_eq(em_call(f, bad, NULL, &y), EM_ERR_SHAPE);
    st = stats_of(f);
    ck_assert_int_eq(st.entries, 2);
    /* the tie says why */
    ck_assert_msg(strstr(st.last_failure, "w[0] (input 1 dim 0) must equal x[0] (input 0 dim 0), "
                         "got 5 and 3"), "%s", st.last_failure);
    em_compiled_free(f);
}
END_TEST

/* ---- reshapes whose sizes follow the dynamic ones ---- */

enum { HEADS = 2, HDIM = 8, EMB = HEADS * HDIM };

/* [b, t, EMB] -> [b, HEADS, t, HDIM] */
static em_tensor *split_heads(em_tensor *x) {
    int64_t b = em_size(x, 0), t = em_size(x, 1);
    return em_transpose(em_reshape(x, 4, TU_SIZES(b, t, HEADS, HDIM)), 1, 2);
}

/* self-attention over in[0] ([b, t, EMB]) with weights in[1] ([EMB, 3 EMB]),
 * then a layer norm: reshapes to sizes computed from b and t */
static em_status attention_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *x = in[0];
    int64_t b = em_size(x, 0), t = em_size(x, 1);
    em_tensor *qkv = em_matmul(x, in[1]);
    em_tensor *q = split_heads(em_slice(qkv, 2, 0, EMB, 1));
    em_tensor *k = split_heads(em_slice(qkv, 2, EMB, 2 * EMB, 1));
    em_tensor *v = split_heads(em_slice(qkv, 2, 2 * EMB, 3 * EMB, 1));
    em_tensor *att = em_softmax(em_mul_scalar(em_matmul(q, em_transpose(k, 2, 3)), 0.35), -1);
    em_tensor *y = em_reshape(em_contiguous(em_transpose(em_matmul(att, v), 1, 2)), 2,
                              TU_SIZES(b * t, EMB));
    out[0] = em_layer_norm(em_add(y, em_reshape(x, 2, TU_SIZES(b * t, EMB))), 1, NULL, NULL, 1e-5);
    return out[0] ? EM_OK : em_last_status();
}

/* Causal self-attention over in[0] ([b, t, EMB], 2 heads) with in[1]
 * ([EMB, 3 EMB]): the mask is built inside from em_arange(t), as GPT code
 * does, so its sizes come from the sequence length. */
static em_status causal_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *x = in[0];
    int64_t b = em_size(x, 0), t = em_size(x, 1);
    em_tensor *qkv = em_matmul(x, in[1]);
    em_tensor *q = split_heads(em_slice(qkv, 2, 0, EMB, 1));
    em_tensor *k = split_heads(em_slice(qkv, 2, EMB, 2 * EMB, 1));
    em_tensor *v = split_heads(em_slice(qkv, 2, 2 * EMB, 3 * EMB, 1));
    em_tensor *pos = em_arange(0, (double)t, 1, EM_I64, em_cpu());
    em_tensor *future = em_gt(em_unsqueeze(pos, 0), em_unsqueeze(pos, 1));
    em_tensor *att = em_mul_scalar(em_matmul(q, em_transpose(k, 2, 3)), 0.35);
    att = em_softmax(em_where(future, em_scalar(-INFINITY, EM_F32, em_cpu()), att), -1);
    out[0] = em_reshape(em_transpose(em_matmul(att, v), 1, 2), 3, TU_SIZES(b, t, EMB));
    return out[0] ? EM_OK : em_last_status();
}

/* causal_fn in float64, from the inputs' values. */
static double *causal_ref(const em_tensor *x, const em_tensor *w) {
    int64_t b = em_size(x, 0), t = em_size(x, 1), hd = EMB / 2;
    double *xv = tu_values(x), *wv = tu_values(w), *qkv = calloc((size_t)(b * t * 3 * EMB), 8);
    double *y = calloc((size_t)(b * t * EMB), 8), *p = calloc((size_t)t, 8);
    for (int64_t r = 0; r < b * t; r++)
        for (int64_t c = 0; c < 3 * EMB; c++)
            for (int64_t e = 0; e < EMB; e++) qkv[r * 3 * EMB + c] += xv[r * EMB + e] * wv[e * 3 * EMB + c];
    for (int64_t n = 0; n < b; n++)
        for (int64_t h = 0; h < 2; h++)
            for (int64_t i = 0; i < t; i++) {
                const double *q = &qkv[(n * t + i) * 3 * EMB + h * hd];
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *kk = &qkv[(n * t + j) * 3 * EMB + EMB + h * hd];
                    p[j] = 0;
                    for (int64_t d = 0; d < hd; d++) p[j] += q[d] * kk[d];
                    p[j] *= 0.35;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = 0; j <= i; j++) sum += p[j] = exp(p[j] - mx);
                for (int64_t j = 0; j <= i; j++)
                    for (int64_t d = 0; d < hd; d++)
                        y[(n * t + i) * EMB + h * hd + d] +=
                            p[j] / sum * qkv[(n * t + j) * 3 * EMB + 2 * EMB + h * hd + d];
            }
    free(xv), free(wv), free(qkv), free(p);
    return y;
}

/* causal_fn compiled over every t of ts for b in 1..nb (t outer, as the
 * issue's sequence), against float64; its stats. */
static em_compile_stats causal_over(const int64_t *ts, int nt, int nb) {
    em_compile_options o = options("causal", 2, 0);
    em_compiled *f = em_compile(causal_fn, NULL, &o);
    em_tensor *w = tu_random(7, 2, TU_SIZES(EMB, 3 * EMB), EM_F32, 0.3);
    for (int i = 0; i < nt; i++)
        for (int64_t b = 1; b <= nb; b++) {
            em_tensor *in[2] = {tu_random((uint64_t)(100 * i + b), 3, TU_SIZES(b, ts[i], EMB), EM_F32, 1), w},
                      *got;
            ck_assert_msg(em_call(f, in, NULL, &got) == EM_OK, "%s", em_last_error());
            double *ref = causal_ref(in[0], w);
            tu_check_close(got, ref, 3, TU_SIZES(b, ts[i], EMB), 1e-4, 1e-5);
            free(ref);
        }
    em_compile_stats st = stats_of(f);
    em_compiled_free(f);
    return st;
}

START_TEST(forced_mode_makes_the_dims_the_graph_follows_dynamic) {
    /* the causal block, forced: a dry trace finds that b, t and the width
     * follow (the slices of qkv have constant bounds, so w's width may
     * grow too): one dynamic entry for every batch and length, where the
     * conservative rules kept it static; t is not 1 (its graph there is
     * another: size-1 dims drop out) */
    em_compile_options o = options("causal", 2, 1);
    em_compiled *f = em_compile(causal_fn, NULL, &o);
    em_tensor *w = tu_random(7, 2, TU_SIZES(EMB, 3 * EMB), EM_F32, 0.3);
    static const int64_t bt[][2] = {{2, 5}, {3, 7}, {4, 6}, {2, 9}};
    for (int i = 0; i < 4; i++) {
        em_tensor *in[2] = {tu_random((uint64_t)(70 + i), 3, TU_SIZES(bt[i][0], bt[i][1], EMB), EM_F32, 1), w},
                  *got;
        ck_assert_msg(em_call(f, in, NULL, &got) == EM_OK, "%s", em_last_error());
        double *ref = causal_ref(in[0], w);
        tu_check_close(got, ref, 3, TU_SIZES(bt[i][0], bt[i][1], EMB), 1e-4, 1e-5);
        free(ref);
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.dynamic_entries, 1);
    char *text = printed(f, 0);
    ck_assert_msg(strstr(text, "guard input 0 (x): dtype=f32 device=cpu sizes=[2, 5, 16] strides=dense "
                         "dynamic=[0, 1, 2] (dim 0 >= 1, dim 1 >= 2, dim 2 >= 1)\n"), "%s", text);
    ck_assert_msg(strstr(text, "guard input 1 (w): dtype=f32 device=cpu sizes=[16, 48] strides=dense "
                         "dynamic=[0, 1] (dim 0 >= 1, dim 1 >= 2)\n"), "%s", text);
    free(text);
    em_compiled_free(f);
}
END_TEST

START_TEST(a_causal_mask_from_arange_follows_the_sequence) {
    /* before: every new length was a static entry (the arange's count
     * changed), then eager past the recompile limit */
    static const int64_t ts[] = {7, 8, 9, 16, 31};
    em_compile_stats st = causal_over(ts, 5, 4);
    ck_assert_int_eq(st.eager, 0);
    /* [1, 7] static; [2, 7] dynamic in b and (widened) t, and b may be 1
     * (a dry trace at b = 1 gives the same graph): it serves [1, 8] on */
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    ck_assert_int_eq(st.hits, 5 * 4 - 2);
}
END_TEST

START_TEST(a_trace_at_length_1_is_not_the_model_for_other_lengths) {
    /* [1, 1] and [1, 4] static (a length of 1 drops out of the graph);
     * [1, 9] is compared with [1, 4], not with [1, 1] which the call
     * before used, and is dynamic in t: 16 and 31 need nothing more */
    static const int64_t ts[] = {1, 4, 1, 9, 16, 31};
    em_compile_stats st = causal_over(ts, 6, 1);
    ck_assert_int_eq(st.eager, 0);
    ck_assert_int_eq(st.traces, 3);
    ck_assert_int_eq(st.dynamic_entries, 1);
}
END_TEST

static em_compile_stats attention_at(const int64_t (*bt)[2], int n, int mode) {
    em_compile_options o = options("attention", 2, mode);
    em_compiled *f = em_compile(attention_fn, NULL, &o);
    em_tensor *w = tu_random(5, 2, TU_SIZES(EMB, 3 * EMB), EM_F32, 0.3);
    for (int i = 0; i < n; i++) {
        em_tensor *in[2] = {tu_random((uint64_t)(60 + i), 3, TU_SIZES(bt[i][0], bt[i][1], EMB),
                                      EM_F32, 1), w}, *got, *want;
        ck_assert_msg(em_call(f, in, NULL, &got) == EM_OK, "%s", em_last_error());
        ck_assert_int_eq(attention_fn(NULL, in, NULL, &want), EM_OK);
        double *wv = tu_values(want);
        tu_check_close(got, wv, 2, em_sizes(want), 1e-4, 1e-5);
        free(wv);
    }
    em_compile_stats st = stats_of(f);
    em_compiled_free(f);
    return st;
}

START_TEST(reshapes_follow_the_batch_and_the_sequence) {
    static const int64_t batch[][2] = {{2, 5}, {3, 5}, {7, 5}, {4, 5}, {2, 5}};
    em_compile_stats st = attention_at(batch, 5, 0);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    static const int64_t seq[][2] = {{2, 4}, {2, 6}, {2, 9}, {2, 3}};
    st = attention_at(seq, 4, 0);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    /* then the batch changes too: the entry the second sequence length
     * made is dynamic in the batch already (a dry trace showed the graph
     * follows it), so no entry more */
    static const int64_t both[][2] = {{2, 4}, {2, 6}, {3, 6}, {5, 7}, {4, 2}, {6, 3}};
    st = attention_at(both, 6, 0);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    /* the replay backend replays the graph as recorded: static */
    em_compile_options o = options("attention", 2, 0);
    o.backend = "replay";
    em_compiled *f = em_compile(attention_fn, NULL, &o);
    em_tensor *w = tu_random(5, 2, TU_SIZES(EMB, 3 * EMB), EM_F32, 0.3), *y;
    for (int64_t b = 2; b <= 4; b++) {
        em_tensor *in[2] = {tu_random((uint64_t)b, 3, TU_SIZES(b, 5, EMB), EM_F32, 1), w};
        ck_assert_int_eq(em_call(f, in, NULL, &y), EM_OK);
    }
    ck_assert_int_eq(stats_of(f).traces, 3);
    ck_assert_int_eq(stats_of(f).dynamic_entries, 0);
    em_compiled_free(f);
}
END_TEST

/* ---- graphs that must stay static ---- */

START_TEST(a_reshape_by_the_batch_follows_it) {
    em_compile_options o = options("pairs", 1, 0);
    em_compiled *f = em_compile(pairs_fn, NULL, &o);
    for (int64_t b = 2; b <= 6; b++) {
        em_tensor *x, *y = call_at(f, b, 8, &x);
        double *xv = tu_values(x), ref[6 * 4];
        for (int64_t i = 0; i < b * 4; i++) ref[i] = exp(xv[2 * i] + xv[2 * i + 1]);
        tu_check_close(y, ref, 2, TU_SIZES(b, 4), 1e-5, 1e-6);
        free(xv);
    }
    expect_entries(f, 2, 1);
}
END_TEST

START_TEST(a_created_tensor_of_the_batch_follows_it) {
    em_compile_options o = options("created", 1, 0);
    o.recompile_limit = 16;
    em_compiled *f = em_compile(created_fn, NULL, &o);
    for (int64_t b = 2; b <= 6; b++) {
        em_tensor *x, *y = call_at(f, b, 8, &x);
        double *xv = tu_values(x), ref[6 * 8];
        for (int64_t i = 0; i < b * 8; i++) ref[i] = 1 / (1 + exp(-(xv[i] + 0.75)));
        tu_check_close(y, ref, 2, TU_SIZES(b, 8), 1e-5, 1e-6);
        free(xv);
    }
    expect_entries(f, 2, 1);
}
END_TEST

START_TEST(a_created_tensor_of_the_batch_squared_stays_static_and_correct) {
    em_compile_options o = options("square", 1, 0);
    o.recompile_limit = 16;
    em_compiled *f = em_compile(square_fn, NULL, &o);
    for (int64_t b = 2; b <= 5; b++) {
        em_tensor *x, *y = call_at(f, b, 3, &x);
        double ref[25];
        for (int64_t i = 0; i < b * b; i++) ref[i] = 1.0;
        tu_check_close(y, ref, 1, TU_SIZES(b * b), 0, 0);
    }
    expect_entries(f, 4, 0);
}
END_TEST

START_TEST(a_value_from_the_batch_stays_static_and_correct) {
    em_compile_options o = options("per_row", 1, 0);
    o.recompile_limit = 16;
    em_compiled *f = em_compile(per_row_fn, NULL, &o);
    for (int64_t b = 2; b <= 6; b++) {
        em_tensor *x = tu_random((uint64_t)b, 2, TU_SIZES(b, 8), EM_F32, 3), *y;
        ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
        double *xv = tu_values(x), ref[6 * 8];
        for (int64_t i = 0; i < b * 8; i++) ref[i] = tanh(xv[i] / (double)b);
        tu_check_close(y, ref, 2, TU_SIZES(b, 8), 1e-5, 1e-6);
        free(xv);
    }
    ck_assert_int_eq(stats_of(f).dynamic_entries, 0);
    ck_assert_int_eq(stats_of(f).traces, 5);
    em_compiled_free(f);
}
END_TEST

/* ---- layouts ---- */

START_TEST(non_contiguous_inputs) {
    em_compile_options o = options("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    /* transposed: [b, 12] with strides [1, b], a dense layout in another order */
    for (int64_t b = 2; b <= 9; b++) {
        em_tensor *t = tu_random((uint64_t)b, 2, TU_SIZES(12, b), EM_F32, 2);
        check_softmax_call(f, em_transpose(t, 0, 1));
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    /* a contiguous input is another layout: one more entry, dynamic at
     * once (dim 0 already varies) */
    check_softmax_call(f, tu_random(50, 2, TU_SIZES(5, 12), EM_F32, 2));
    check_softmax_call(f, tu_random(51, 2, TU_SIZES(7, 12), EM_F32, 2));
    st = stats_of(f);
    ck_assert_int_eq(st.traces, 3);
    ck_assert_int_eq(st.dynamic_entries, 2);
    em_compiled_free(f);
    /* sliced: [b, 10] of [b, 16], row stride 16 whatever b is */
    f = em_compile(softmax_fn, NULL, &o);
    for (int64_t b = 2; b <= 9; b++) {
        em_tensor *t = tu_random((uint64_t)(20 + b), 2, TU_SIZES(b, 16), EM_F32, 2);
        check_softmax_call(f, em_slice(t, 1, 3, 13, 1));
    }
    st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    em_compiled_free(f);
}
END_TEST

START_TEST(replay_backend_serves_dynamic_sizes) {
    em_compile_options o = options("softmax", 1, 0);
    o.backend = "replay";
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    for (int64_t b = 2; b <= 7; b++)
        check_softmax_call(f, tu_random((uint64_t)b, 2, TU_SIZES(b, 8), EM_F32, 1));
    expect_entries(f, 2, 1);
}
END_TEST

START_TEST(recompiles_log_the_dynamic_dims) {
    char path[64];
    tu_log_begin("recompiles", path, sizeof path);
    em_compile_options o = options("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    em_compile_options p = options("square", 1, 0);
    em_compiled *g = em_compile(square_fn, NULL, &p);
    tu_log_end();
    for (int64_t b = 2; b <= 3; b++) {
        em_tensor *x = tu_random((uint64_t)b, 2, TU_SIZES(b, 8), EM_F32, 1), *y;
        ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
        ck_assert_int_eq(em_call(g, &x, NULL, &y), EM_OK);
    }
    em_compiled_free(f);
    em_compiled_free(g);
    char *buf = tu_log_take(path);
    ck_assert_msg(strstr(buf, "size mismatch at dim 0: expected 2, got 3"), "%s", buf);
    ck_assert_msg(strstr(buf, "softmax: dynamic dims x[0]"), "%s", buf);
    ck_assert_msg(strstr(buf, "square: the new entry is static: node %1 (full) differs from the "
                              "trace at the other sizes"), "%s", buf);
    free(buf);
}
END_TEST

/* ---- differential: compiled at many sizes vs the same function eagerly ---- */

static const int LAST[] = {-1}, FIRST[] = {0}, LAST2[] = {-2, -1};

static em_status d_norm(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *x = in[0], *c = em_sub(x, em_mean(x, 1, LAST, true));
    out[0] = em_mul(c, em_rsqrt(em_add_scalar(em_var(x, 1, LAST, 1, true), 1e-3)));
    return out[0] ? EM_OK : em_last_status();
}
static em_status d_rowsum(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    out[0] = em_exp(em_mul_scalar(em_sum(em_tanh(in[0]), 1, LAST, false), 0.25));
    return out[0] ? EM_OK : em_last_status();
}
static em_status d_where(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *x = em_add(in[0], in[1]); /* in[1]: [1, c], broadcast */
    em_tensor *y = em_where(em_gt(x, em_amax(x, 1, LAST, true)), x, em_mul_scalar(x, 0.1));
    out[0] = em_cast(em_sum(em_cast(y, EM_F64), 1, LAST, true), EM_F32);
    return out[0] ? EM_OK : em_last_status();
}
static em_status d_matmul(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    out[0] = em_gelu(em_matmul(em_softmax(in[0], -1), in[1])); /* in[1]: [c, 8] */
    return out[0] ? EM_OK : em_last_status();
}
static em_status d_columns(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *x = in[0]; /* a reduction over the leading dim runs eagerly */
    out[0] = em_div(em_exp(x), em_sum(em_exp(x), 1, FIRST, true));
    return out[0] ? EM_OK : em_last_status();
}
static em_status d_planes(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *x = em_unsqueeze(in[0], 1); /* [b, 1, c] + [1, 3, c] */
    em_tensor *y = em_sigmoid(em_add(x, em_unsqueeze(in[1], 0)));
    out[0] = em_sub(y, em_mean(y, 2, LAST2, true));
    return out[0] ? EM_OK : em_last_status();
}

typedef struct diff_case {
    const char *name;
    em_fn fn;
    int nin;
    int second; /* in[1]'s shape: 0 none, 1 [1, c], 2 [c, 8], 3 [3, c] */
} diff_case;

/* Runs c at each (rows, cols) of sizes, compiled (mode: opts.dynamic) and
 * eagerly, and compares; returns the compiled function's stats. */
static em_compile_stats differential(const diff_case *c, int mode, const int64_t (*sizes)[2],
                                     int n) {
    em_compile_options o = options(c->name, c->nin, mode);
    o.recompile_limit = 64;
    em_compiled *f = em_compile(c->fn, NULL, &o);
    for (int i = 0; i < n; i++) {
        int64_t b = sizes[i][0], k = sizes[i][1];
        em_tensor *in[2] = {tu_random((uint64_t)(7 * i + 1), 2, TU_SIZES(b, k), EM_F32, 1.5), NULL};
        if (c->second == 1) in[1] = tu_random((uint64_t)i, 2, TU_SIZES(1, k), EM_F32, 1);
        if (c->second == 2) in[1] = tu_random((uint64_t)i, 2, TU_SIZES(k, 8), EM_F32, 0.3);
        if (c->second == 3) in[1] = tu_random((uint64_t)i, 2, TU_SIZES(3, k), EM_F32, 1);
        em_tensor *got, *want;
        ck_assert_msg(em_call(f, in, NULL, &got) == EM_OK, "%s: %s", c->name, em_last_error());
        ck_assert_int_eq(c->fn(NULL, in, NULL, &want), EM_OK);
        double *w = tu_values(want);
        tu_check_close(got, w, em_ndim(want), em_sizes(want), 1e-4, 1e-5);
        free(w);
    }
    em_compile_stats st = stats_of(f);
    em_compiled_free(f);
    return st;
}

START_TEST(compiled_at_many_sizes_equals_eager) {
    static const diff_case cases[] = {
        {"norm", d_norm, 1, 0},     {"rowsum", d_rowsum, 1, 0},   {"where", d_where, 2, 1},
        {"matmul", d_matmul, 2, 2}, {"columns", d_columns, 1, 0}, {"planes", d_planes, 2, 3},
    };
    static const int64_t rows[][2] = {{4, 16}, {5, 16}, {9, 16}, {2, 16}, {33, 16}, {7, 16}};
    /* (forced mode's rules would keep 4 x 16 static: rowsum's 0.25 is 1/4) */
    static const int64_t both[][2] = {{5, 12}, {6, 10}, {3, 7}, {12, 33}, {2, 2}, {17, 5}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        em_compile_stats st = differential(&cases[i], 0, rows, 6);
        ck_assert_msg(st.traces == 2 && st.dynamic_entries == 1, "%s: %ld traces, %d dynamic",
                      cases[i].name, (long)st.traces, st.dynamic_entries);
        st = differential(&cases[i], 1, both, 6); /* forced: both dims vary */
        ck_assert_msg(st.traces == 1 && st.dynamic_entries == 1, "%s forced: %ld traces, %d dynamic",
                      cases[i].name, (long)st.traces, st.dynamic_entries);
    }
}
END_TEST

/* ---- warmup of a recorded dynamic entry ---- */

static void call_sizes(em_compiled *f, const int64_t *rows, int n) {
    for (int i = 0; i < n; i++)
        check_softmax_call(f, tu_random((uint64_t)(30 + i), 2, TU_SIZES(rows[i], 24), EM_F32, 2));
}

START_TEST(a_warmed_cache_serves_a_dynamic_entry_without_compiling) {
    char dir[] = "/tmp/ember-dyn-cache-XXXXXX", list[] = "/tmp/ember-dyn-list-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    int fd = mkstemp(list);
    ck_assert_int_ge(fd, 0);
    close(fd);
    em_compile_options o = options("softmax", 1, 0);
    setenv("EMBER_RECORD", list, 1);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    unsetenv("EMBER_RECORD");
    call_sizes(f, TU_SIZES(2, 3), 2); /* a static entry, then a dynamic one */
    em_compiled_free(f);
    jit_record *rs;
    int n;
    ck_assert_int_eq(jit_records_read(list, &rs, &n), EM_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(rs[0].ndyn, 0);
    ck_assert_int_eq(rs[1].ndyn, 1);
    ck_assert_int_eq(rs[1].dyn[0], 1);
    /* warm an empty disk cache, as ember-cache warmup does */
    unsetenv("EMBER_CACHE");
    kc_cache *c = kc_open(dir, 0);
    char why[256];
    for (int i = 0; i < 2; i++) ck_assert_int_eq(jit_warmup(&rs[i], c, NULL, why, sizeof why), JIT_WARM_COMPILED);
    for (int i = 0; i < 2; i++) ck_assert_int_eq(jit_warmup(&rs[i], c, NULL, why, sizeof why), JIT_WARM_PRESENT);
    kc_close(c);
    jit_records_free(rs, n);
    /* a fresh function on that cache, at other sizes, compiles nothing */
    setenv("EMBER_CACHE_DIR", dir, 1);
    f = em_compile(softmax_fn, NULL, &o);
    call_sizes(f, TU_SIZES(5, 7, 9, 4), 4);
    em_compile_stats st = stats_of(f);
    em_compiled_free(f);
    unsetenv("EMBER_CACHE_DIR");
    setenv("EMBER_CACHE", "0", 1);
    /* the warmup left a dynamic hint: the first call, at a size staging
     * never saw, is dynamic at once */
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.dynamic_entries, 1);
    ck_assert_int_eq(st.kernels_compiled, 0);
    ck_assert_int_gt(st.kernels_loaded, 0);
    ck_assert_int_eq(st.graphs_loaded, 0); /* dynamic entries have no plan entry */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, list);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ---- out of memory ---- */

typedef struct fail_state {
    int64_t left;  /* allocations that succeed before the failures */
    int64_t count; /* allocations made */
} fail_state;

static void *failing_alloc(void *ud, size_t size, size_t align) {
    fail_state *st = ud;
    st->count++;
    if (st->left-- <= 0) return NULL;
    void *p = NULL;
    return posix_memalign(&p, align, size ? size : 1) ? NULL : p;
}

static void failing_free(void *ud, void *p) { free(p); }

/* Compiles softmax, calls it at sizes 2 (static), 3 (dynamic) and 5 (a
 * new size of the dynamic entry) with every allocation after the first
 * left failing: each call succeeds or says EM_ERR_NOMEM; no crash, no leak
 * (valgrind). */
static void calls_with_failures(fail_state *st) {
    em_allocator al = {failing_alloc, failing_free, st};
    const em_allocator *old = em_get_allocator();
    em_set_allocator(&al);
    em_scope_begin();
    em_compile_options o = options("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    for (int64_t b = 2; f && b <= 5; b += 1 + (b > 2)) {
        em_tensor *x = em_ones(2, TU_SIZES(b, 16), EM_F32, em_cpu()), *y = NULL;
        em_status s = x ? em_call(f, &x, NULL, &y) : EM_ERR_NOMEM;
        ck_assert_msg(s == EM_OK || s == EM_ERR_NOMEM, "%s", em_last_error());
        em_clear_error();
    }
    em_scope_end();
    em_compiled_free(f);
    em_set_allocator(old);
}

START_TEST(a_warmed_causal_block_compiles_nothing) {
    char dir[] = "/tmp/ember-dyn-causal-XXXXXX", list[] = "/tmp/ember-dyn-clist-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    int fd = mkstemp(list);
    ck_assert_int_ge(fd, 0);
    close(fd);
    static const int64_t ts[] = {7, 8, 9, 16};
    setenv("EMBER_RECORD", list, 1);
    em_compile_stats st = causal_over(ts, 4, 3);
    unsetenv("EMBER_RECORD");
    ck_assert_int_eq(st.traces, 2);
    jit_record *rs;
    int n;
    ck_assert_int_eq(jit_records_read(list, &rs, &n), EM_OK);
    ck_assert_int_eq(n, 2);
    /* the dynamic entry carries the attributes that follow: the arange's
     * count and the reshapes' sizes */
    ck_assert_int_eq(rs[0].nfollow, 0);
    ck_assert_int_gt(rs[1].nfollow, 0);
    unsetenv("EMBER_CACHE");
    kc_cache *c = kc_open(dir, 0);
    char why[256];
    for (int i = 0; i < n; i++)
        ck_assert_msg(jit_warmup(&rs[i], c, NULL, why, sizeof why) == JIT_WARM_COMPILED, "%s", why);
    kc_close(c);
    jit_records_free(rs, n);
    /* a fresh function on that cache, at lengths and batches staging never
     * saw: the dynamic hint makes its first entry dynamic, and nothing
     * compiles */
    static const int64_t unseen[] = {10, 13, 21};
    setenv("EMBER_CACHE_DIR", dir, 1);
    st = causal_over(unseen, 3, 5);
    unsetenv("EMBER_CACHE_DIR");
    setenv("EMBER_CACHE", "0", 1);
    ck_assert_int_eq(st.eager, 0);
    ck_assert_int_eq(st.traces, 1); /* [1, 10]: dynamic in b (>= 1) and t at once */
    ck_assert_int_eq(st.kernels_compiled, 0);
    ck_assert_int_gt(st.kernels_loaded, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, list);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A dynamic hint only proposes: one that names every dim (the width, tied
 * to a weight, too) or is damaged gives correct results all the same. */
START_TEST(a_wrong_dynamic_hint_is_checked) {
    char dir[] = "/tmp/ember-dyn-hint-XXXXXX", list[] = "/tmp/ember-dyn-hlist-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    int fd = mkstemp(list);
    ck_assert_int_ge(fd, 0);
    close(fd);
    static const int64_t one[] = {7};
    setenv("EMBER_RECORD", list, 1);
    causal_over(one, 1, 1); /* one static entry, recorded */
    unsetenv("EMBER_RECORD");
    jit_record *rs;
    int n;
    ck_assert_int_eq(jit_records_read(list, &rs, &n), EM_OK);
    ck_assert_int_eq(n, 1);
    tr_graph *g = tr_parse_placeholders(rs[0].graph);
    ck_assert_ptr_nonnull(g);
    em_tensor *in[2];
    for (int i = 0, k = 0; i < g->nnodes; i++)
        if (g->nodes[i].kind == TR_INPUT) in[k++] = em_tensor_meta_only(&g->nodes[i].meta);
    gd_guards *gs = gd_build(g, in, NULL, 0, NULL, 0);
    ck_assert_ptr_nonnull(gs);
    gd_tensor *t0 = &gs->tensors[0];
    t0->dyn = 7, t0->sizes[0] = 2; /* as if traced at b = 2: every dim of x */
    unsetenv("EMBER_CACHE");
    kc_cache *c = kc_open(dir, 0);
    jit_dyn_hint_put(c, "cpu", g, gs);
    uint32_t mask[2];
    ck_assert(jit_dyn_hint_get(c, "cpu", g, mask));
    ck_assert_int_eq(mask[0], 7);
    kc_close(c);
    setenv("EMBER_CACHE_DIR", dir, 1);
    static const int64_t ts[] = {9, 12};
    em_compile_stats st = causal_over(ts, 2, 3); /* values checked against float64 */
    ck_assert_int_eq(st.eager, 0);
    /* and a hint of the wrong length is no hint */
    c = kc_open(dir, 0);
    gd_tensor keep = *t0;
    gs->ntensors = 1;
    g->ninputs = 1;
    jit_dyn_hint_put(c, "cpu", g, gs);
    g->ninputs = 2;
    gs->ntensors = 2;
    ck_assert(!jit_dyn_hint_get(c, "cpu", g, mask));
    kc_close(c);
    *t0 = keep;
    st = causal_over(ts, 2, 3);
    ck_assert_int_eq(st.eager, 0);
    unsetenv("EMBER_CACHE_DIR");
    setenv("EMBER_CACHE", "0", 1);
    gd_free(gs);
    em_release(in[0]), em_release(in[1]);
    tr_graph_free(g);
    jit_records_free(rs, n);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, list);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* x [b, t, 8] as [b, t / 2, 16]: t must be even */
static em_status pairs16_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    int64_t b = em_size(in[0], 0), t = em_size(in[0], 1);
    out[0] = em_tanh(em_reshape(in[0], 3, TU_SIZES(b, t * 8 / 16, 16)));
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(a_reshape_that_splits_a_dim_guards_its_divisor) {
    em_compile_options o = options("pairs16", 1, 0);
    em_compiled *f = em_compile(pairs16_fn, NULL, &o);
    for (int64_t t = 4; t <= 8; t += 2) {
        em_tensor *x = tu_random((uint64_t)t, 3, TU_SIZES(2, t, 8), EM_F32, 1), *y;
        ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
        double *xv = tu_values(x);
        for (int64_t i = 0; i < 2 * t * 8; i++) xv[i] = tanh(xv[i]);
        tu_check_close(y, xv, 3, TU_SIZES(2, t / 2, 16), 1e-5, 1e-6);
        free(xv);
    }
    /* one dynamic entry, whose guard asks for an even t */
    ck_assert_int_eq(stats_of(f).traces, 2);
    ck_assert_int_eq(stats_of(f).dynamic_entries, 1);
    char *text = printed(f, 0);
    ck_assert_msg(strstr(text, "dynamic=[0, 1] (dim 0 >= 1, dim 1 >= 2) divisible=1:2"), "%s", text);
    free(text);
    /* t = 7 fails that guard, with the reason (and the function itself
     * fails there, as it would eagerly) */
    em_tensor *x = tu_random(99, 3, TU_SIZES(2, 7, 8), EM_F32, 1), *y = NULL;
    ck_assert_int_ne(em_call(f, &x, NULL, &y), EM_OK);
    em_clear_error();
    em_compile_stats st = stats_of(f);
    ck_assert_msg(strstr(st.last_failure, "x[1] (input 0 dim 1) must be divisible by 2, got 7"), "%s",
                  st.last_failure);
    em_compiled_free(f);
}
END_TEST

/* x [b, t, 4] rolled by one along t (a slice to t and a cat), permuted,
 * then expanded to [2, 4, t, b] from sizes the code reads: every view op
 * with sizes that follow b and t */
static em_status roll_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *x = in[0];
    int64_t b = em_size(x, 0), t = em_size(x, 1);
    em_tensor *parts[2] = {em_slice(x, 1, 1, t, 1), em_slice(x, 1, 0, 1, 1)};
    em_tensor *r = em_permute(em_cat(2, parts, 1), 3, (const int[]){2, 1, 0}); /* [4, t, b] */
    out[0] = em_exp(em_expand(em_unsqueeze(r, 0), 4, TU_SIZES(2, 4, t, b)));
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(slices_cats_permutes_and_expands_follow_the_sizes) {
    em_compile_options o = options("roll", 1, 0);
    em_compiled *f = em_compile(roll_fn, NULL, &o);
    static const int64_t bt[][2] = {{2, 5}, {2, 7}, {3, 6}, {4, 9}, {2, 3}};
    for (int i = 0; i < 5; i++) {
        int64_t b = bt[i][0], t = bt[i][1];
        em_tensor *x = tu_random((uint64_t)(80 + i), 3, TU_SIZES(b, t, 4), EM_F32, 1), *y;
        ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
        double *xv = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(2 * 4 * t * b));
        for (int64_t e = 0; e < 2; e++)
            for (int64_t c = 0; c < 4; c++)
                for (int64_t j = 0; j < t; j++)
                    for (int64_t n = 0; n < b; n++)
                        ref[((e * 4 + c) * t + j) * b + n] = exp(xv[(n * t + (j + 1) % t) * 4 + c]);
        tu_check_close(y, ref, 4, TU_SIZES(2, 4, t, b), 1e-5, 1e-6);
        free(xv);
        free(ref);
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.eager, 0);
    ck_assert_int_eq(st.traces, 2); /* [2, 5] static, then one entry dynamic in t and b */
    ck_assert_int_eq(st.dynamic_entries, 1);
    em_compiled_free(f);
}
END_TEST

START_TEST(a_malformed_follow_line_is_refused) {
    char list[] = "/tmp/ember-dyn-flist-XXXXXX";
    int fd = mkstemp(list);
    ck_assert_int_ge(fd, 0);
    static const char text[] = "ember-record 1 backend=cpu name=f\n"
                               "follow %3 size[0] = two * in0[1] + 0\n"
                               "graph(%x: f32[2, 3]{3, 1}) {\n  return %x\n}\n";
    ck_assert_int_eq(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    jit_record *rs;
    int n;
    ck_assert_int_eq(jit_records_read(list, &rs, &n), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), ":2: malformed follow line"), "%s", em_last_error());
    em_clear_error();
    unlink(list);
    /* and the text form reads back what it printed */
    jit_sym_size z = {.node = 23, .j = 0, .field = JIT_SYM_SIZE, .input = 0, .dim = 1, .a = 2, .b = -1}, back;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    jit_sym_print(&z, f);
    z = (jit_sym_size){.node = 9, .field = JIT_SYM_VALUE, .input = 1, .dim = 0, .f = 0.5, .form = JIT_SYM_OVER_SQRT};
    jit_sym_print(&z, f);
    fclose(f);
    ck_assert_msg(strstr(buf, "follow %23 size[0] = 2 * in0[1] + -1\n"), "%s", buf);
    ck_assert(jit_sym_parse(buf, &back));
    ck_assert_int_eq(back.a, 2);
    ck_assert_int_eq(back.b, -1);
    ck_assert_int_eq(back.dim, 1);
    ck_assert(jit_sym_parse(strchr(buf, '\n') + 1, &back));
    ck_assert_int_eq(back.form, JIT_SYM_OVER_SQRT);
    ck_assert(back.f == 0.5 && back.input == 1 && back.node == 9);
    ck_assert(!jit_sym_parse("follow %1 size[99] = rest", &back));
    ck_assert(!jit_sym_parse("follow %1 width[0] = rest", &back));
    free(buf);
    /* a product of two sizes */
    z = (jit_sym_size){.node = 4, .field = JIT_SYM_SIZE, .input = 0, .dim = 0, .product = true,
                       .input2 = 1, .dim2 = 2, .a = 3};
    buf = NULL;
    f = open_memstream(&buf, &len);
    jit_sym_print(&z, f);
    fclose(f);
    ck_assert_str_eq(buf, "follow %4 size[0] = 3 * in0[0] * in1[2] + 0\n");
    ck_assert(jit_sym_parse(buf, &back));
    ck_assert(back.product && back.input == 0 && back.dim == 0 && back.input2 == 1 && back.dim2 == 2);
    ck_assert_int_eq(back.a, 3);
    ck_assert(!jit_sym_parse("follow %4 size[0] = 3 * in0[0] * in1[99] + 0", &back));
    ck_assert(jit_sym_parse("follow %4 size[0] = 3 * in0[0] + 0", &back) && !back.product);
    free(buf);
}
END_TEST

START_TEST(out_of_memory_anywhere_is_an_error) {
    char dir[] = "/tmp/ember-dyn-oom-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    unsetenv("EMBER_CACHE"); /* a disk cache: kernels compile once, then load */
    setenv("EMBER_CACHE_DIR", dir, 1);
    fail_state st = {INT64_MAX, 0};
    calls_with_failures(&st);
    int64_t total = st.count;
    ck_assert_int_gt(total, 100);
    for (int64_t n = 0; n <= total; n++) {
        st = (fail_state){n, 0};
        calls_with_failures(&st);
    }
    unsetenv("EMBER_CACHE_DIR");
    setenv("EMBER_CACHE", "0", 1);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ---- kernels with size parameters ---- */

/* out[i * stride] = in[i * stride] * 3 for i < n (stride and n constants) */
static k_kernel *scale_kernel(int64_t n, int64_t stride, double factor) {
    k_kernel *k = kir_new("scale");
    int in = kir_buf(k, EM_F32), out = kir_buf(k, EM_F32);
    int i = kir_range(k, kir_const_i(k, EM_I64, n), K_PARALLEL);
    int at = kir_alu(k, KA_MUL, i, kir_const_i(k, EM_I64, stride), -1);
    int v = kir_alu(k, KA_MUL, kir_load(k, in, at), kir_const_f(k, EM_F32, factor), -1);
    kir_store(k, out, at, v);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    return k;
}

START_TEST(kernel_constants_become_size_parameters) {
    k_kernel *a = scale_kernel(8, 2, 3), *b = scale_kernel(9, 2, 3);
    bool vary[32];
    int size_of[32];
    ck_assert(kir_vary(a, b, vary));
    int nvary = 0;
    for (int i = 0; i < a->n; i++) nvary += vary[i];
    ck_assert_int_eq(nvary, 1); /* the extent, not the stride */
    k_kernel *p = kir_parametrize(a, vary, size_of);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(p->nsizes, 1);
    ck_assert_int_eq(p->nbufs, 2);
    ck_assert_int_eq(kir_verify(p), EM_OK);
    /* a kernel of another extent matches, giving its extent as the argument */
    int64_t sizes[1] = {0};
    k_kernel *c = scale_kernel(5, 2, 3), *d = scale_kernel(5, 3, 3), *e = scale_kernel(5, 2, 4);
    ck_assert(kir_match(a, c, size_of, sizes));
    ck_assert_int_eq(sizes[0], 5);
    ck_assert(!kir_match(a, d, size_of, sizes)); /* a constant the model fixed changed */
    ck_assert(!kir_match(a, e, size_of, sizes)); /* a float constant */
    ck_assert(!kir_vary(a, e, vary));            /* floats are never parameters */
    /* compiled once, it computes what kernel c computes */
    jit_cpu_kernel *ck;
    ck_assert_int_eq(jit_cpu_compile(p, &ck), EM_OK);
    float in[16], out[16];
    for (int i = 0; i < 16; i++) in[i] = (float)i, out[i] = -1;
    void *bufs[2] = {in, out};
    ck_assert_int_eq(jit_cpu_run(ck, bufs, sizes), EM_OK);
    for (int i = 0; i < 16; i++)
        ck_assert_float_eq(out[i], i % 2 == 0 && i < 10 ? 3.0f * (float)i : -1.0f);
    jit_cpu_free(ck);
    kir_free(a), kir_free(b), kir_free(c), kir_free(d), kir_free(e), kir_free(p);
}
END_TEST

static Suite *suite(void) {
    const tu_test tests[] = {
        {"ten_batch_sizes_of_softmax_compile_twice", ten_batch_sizes_of_softmax_compile_twice},
        {"layer_norm_over_batch_and_hidden_sizes", layer_norm_over_batch_and_hidden_sizes},
        {"mlp_with_weights_compiles_twice", mlp_with_weights_compiles_twice},
        {"size_one_joins_a_dynamic_entry_size_zero_stays_specialized",
         size_one_joins_a_dynamic_entry_size_zero_stays_specialized},
        {"dims_of_one_symbol_are_tied_by_a_guard", dims_of_one_symbol_are_tied_by_a_guard},
        {"a_size_of_two_symbols_follows_their_product", a_size_of_two_symbols_follows_their_product},
        {"a_function_that_branches_at_one_keeps_one_specialized",
         a_function_that_branches_at_one_keeps_one_specialized},
        {"forced_mode_makes_the_dims_the_graph_follows_dynamic", forced_mode_makes_the_dims_the_graph_follows_dynamic},
        {"more_sizes_than_an_entry_remembers", more_sizes_than_an_entry_remembers},
        {"inputs_sharing_a_dynamic_size", inputs_sharing_a_dynamic_size},
        {"compiled_at_many_sizes_equals_eager", compiled_at_many_sizes_equals_eager},
        {"reshapes_follow_the_batch_and_the_sequence", reshapes_follow_the_batch_and_the_sequence},
        {"a_causal_mask_from_arange_follows_the_sequence", a_causal_mask_from_arange_follows_the_sequence},
        {"a_trace_at_length_1_is_not_the_model_for_other_lengths",
         a_trace_at_length_1_is_not_the_model_for_other_lengths},
        {"a_second_dim_joins_the_dynamic_ones", a_second_dim_joins_the_dynamic_ones},
        {"dynamic_off_gives_one_entry_per_size", dynamic_off_gives_one_entry_per_size},
        {"forced_dynamic_compiles_once", forced_dynamic_compiles_once},
        {"a_reshape_by_the_batch_follows_it", a_reshape_by_the_batch_follows_it},
        {"a_created_tensor_of_the_batch_follows_it", a_created_tensor_of_the_batch_follows_it},
        {"a_created_tensor_of_the_batch_squared_stays_static_and_correct",
         a_created_tensor_of_the_batch_squared_stays_static_and_correct},
        {"a_value_from_the_batch_stays_static_and_correct",
         a_value_from_the_batch_stays_static_and_correct},
        {"non_contiguous_inputs", non_contiguous_inputs},
        {"replay_backend_serves_dynamic_sizes", replay_backend_serves_dynamic_sizes},
        {"recompiles_log_the_dynamic_dims", recompiles_log_the_dynamic_dims},
        {"kernel_constants_become_size_parameters", kernel_constants_become_size_parameters},
        {"a_warmed_cache_serves_a_dynamic_entry_without_compiling",
         a_warmed_cache_serves_a_dynamic_entry_without_compiling},
        {"a_warmed_causal_block_compiles_nothing", a_warmed_causal_block_compiles_nothing},
        {"a_malformed_follow_line_is_refused", a_malformed_follow_line_is_refused},
        {"slices_cats_permutes_and_expands_follow_the_sizes", slices_cats_permutes_and_expands_follow_the_sizes},
        {"a_reshape_that_splits_a_dim_guards_its_divisor", a_reshape_that_splits_a_dim_guards_its_divisor},
        {"a_wrong_dynamic_hint_is_checked", a_wrong_dynamic_hint_is_checked},
        {"out_of_memory_anywhere_is_an_error", out_of_memory_anywhere_is_an_error},
    };
    return tu_suite("dynamic", tests, sizeof tests / sizeof tests[0], 120);
}

int main(void) {
    setenv("EMBER_CACHE", "0", 1); /* memory only: compile counts are this process's */
    return tu_run(suite());
}
