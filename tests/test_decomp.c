/* test_decomp.c - softmax, log_softmax, layer_norm against float64
 * references computed here. */
#include "testutil.h"

static const em_device CPU = {EM_CPU, 0};

/* Reference softmax / log_softmax of a row-major [outer, n, inner] array
 * along the middle dim. */
static void ref_softmax(const double *x, double *y, int64_t outer, int64_t n, int64_t inner,
                        int log_form) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double m = -INFINITY, s = 0;
            for (int64_t k = 0; k < n; k++) m = fmax(m, x[(o * n + k) * inner + i]);
            for (int64_t k = 0; k < n; k++) s += exp(x[(o * n + k) * inner + i] - m);
            for (int64_t k = 0; k < n; k++) {
                double v = x[(o * n + k) * inner + i] - m;
                y[(o * n + k) * inner + i] = log_form ? v - log(s) : exp(v) / s;
            }
        }
}

static void check_softmax(em_tensor *x, int dim, int log_form, em_dtype dt) {
    int nd = em_ndim(x);
    int d = dim < 0 ? dim + nd : dim;
    int64_t outer = 1, inner = 1, n = em_size(x, d);
    for (int i = 0; i < d; i++) outer *= em_size(x, i);
    for (int i = d + 1; i < nd; i++) inner *= em_size(x, i);
    double *xv = tu_values(x);
    double *ref = malloc(sizeof(double) * (size_t)(outer * n * inner + 1));
    ref_softmax(xv, ref, outer, n, inner, log_form);
    em_tensor *y = log_form ? em_log_softmax(x, dim) : em_softmax(x, dim);
    double tol = dt == EM_F32 ? 2e-6 : 1e-13;
    tu_check_close(y, ref, nd, em_sizes(x), tol, tol);
    ck_assert_int_eq(em_dtype_of(y), dt);
    free(xv);
    free(ref);
}

START_TEST(softmax_every_dim) {
    for (int dt = 0; dt < 2; dt++) {
        em_dtype d = dt ? EM_F64 : EM_F32;
        em_tensor *x = tu_random(1, 3, TU_SIZES(3, 5, 7), d, 3.0);
        for (int dim = -3; dim < 3; dim++) {
            check_softmax(x, dim, 0, d);
            check_softmax(x, dim, 1, d);
        }
    }
}
END_TEST

START_TEST(softmax_non_contiguous_and_edge_sizes) {
    em_tensor *x = tu_random(2, 2, TU_SIZES(6, 8), EM_F32, 2.0);
    check_softmax(em_transpose(x, 0, 1), -1, 0, EM_F32);
    check_softmax(em_slice(x, 1, 1, 8, 3), 1, 1, EM_F32);
    check_softmax(em_expand(em_slice(x, 0, 0, 1, 1), 2, TU_SIZES(4, 8)), 0, 0, EM_F32);
    /* a row of one element is 1 (log: 0) */
    check_softmax(tu_random(3, 2, TU_SIZES(4, 1), EM_F64, 1.0), -1, 0, EM_F64);
    check_softmax(tu_random(3, 2, TU_SIZES(4, 1), EM_F64, 1.0), -1, 1, EM_F64);
    /* size-0 dims */
    em_tensor *e = em_softmax(em_zeros(2, TU_SIZES(0, 3), EM_F32, CPU), 1);
    ck_assert_int_eq(em_numel(e), 0);
    ck_assert_int_eq(em_size(e, 1), 3);
}
END_TEST

/* softmax / log_softmax over a dim of size 0: an empty result of the
 * input's sizes, as torch gives (issue 21, item 18: amax failed), eagerly,
 * compiled and in lazy mode; a size-0 dim beside the reduced one too. */
typedef struct sm_case {
    int dim, log_form;
} sm_case;
static em_status sm_fn(void *ctx, em_tensor *const *in, const double *sc, em_tensor **out) {
    (void)sc;
    const sm_case *c = ctx;
    out[0] = c->log_form ? em_log_softmax(in[0], c->dim) : em_softmax(in[0], c->dim);
    return out[0] ? EM_OK : em_last_status();
}

static void check_empty_softmax(int mode, em_tensor *x, int dim, int log_form) {
    sm_case c = {dim, log_form};
    em_tensor *in[1] = {x}, *out[1] = {NULL};
    em_clear_error();
    if (mode == 0) {
        ck_assert_msg(sm_fn(&c, in, NULL, out) == EM_OK, "eager: %s", em_last_error());
    } else if (mode == 1) {
        em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "sm", .backend = "cpu"};
        em_compiled *f = em_compile(sm_fn, &c, &o);
        ck_assert_ptr_nonnull(f);
        for (int call = 0; call < 2; call++) /* the trace, then the entry */
            ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "compiled: %s", em_last_error());
        em_compiled_free(f);
    } else {
        ck_assert_int_eq(em_lazy_begin(), EM_OK);
        em_status s = sm_fn(&c, in, NULL, out);
        ck_assert_int_eq(em_lazy_end(), EM_OK);
        ck_assert_msg(s == EM_OK && em_sync() == EM_OK, "lazy: %s", em_last_error());
    }
    ck_assert_int_eq(em_ndim(out[0]), em_ndim(x));
    for (int i = 0; i < em_ndim(x); i++) ck_assert_int_eq(em_size(out[0], i), em_size(x, i));
    ck_assert_int_eq(em_numel(out[0]), 0);
    ck_assert_int_eq(em_dtype_of(out[0]), em_dtype_is_float(em_dtype_of(x)) ? em_dtype_of(x) : EM_F32);
    float none[1];
    ck_assert_int_eq(em_copy_to_host(out[0], none, 0), EM_OK);
}

START_TEST(softmax_over_empty_dims) {
    int mode = _i;
    for (int log_form = 0; log_form < 2; log_form++) {
        check_empty_softmax(mode, em_zeros(2, TU_SIZES(3, 0), EM_F32, CPU), 1, log_form);
        check_empty_softmax(mode, em_zeros(2, TU_SIZES(3, 0), EM_F32, CPU), -1, log_form);
        check_empty_softmax(mode, em_zeros(1, TU_SIZES(0), EM_F64, CPU), 0, log_form);
        check_empty_softmax(mode, em_zeros(3, TU_SIZES(2, 0, 4), EM_F32, CPU), 1, log_form);
        check_empty_softmax(mode, em_zeros(3, TU_SIZES(2, 0, 4), EM_F32, CPU), 2, log_form);
        check_empty_softmax(mode, em_zeros(2, TU_SIZES(0, 5), EM_I32, CPU), 0, log_form);
        /* non-contiguous: a transposed [0, 3] */
        check_empty_softmax(mode, em_transpose(em_zeros(2, TU_SIZES(3, 0), EM_F32, CPU), 0, 1), 0,
                            log_form);
    }
    /* a non-empty softmax still compiles and runs after the empty ones */
    if (mode == 1) check_softmax(tu_random(5, 2, TU_SIZES(2, 3), EM_F32, 1), 1, 0, EM_F32);
}
END_TEST

START_TEST(softmax_extreme_values) {
    /* large logits must not overflow; -inf entries get probability 0 */
    const double v[8] = {1000, 999, 998, -1000, -INFINITY, 0, 88.5, -INFINITY};
    em_tensor *x = tu_tensor(v, 2, TU_SIZES(2, 4), EM_F32);
    check_softmax(x, -1, 0, EM_F32);
    check_softmax(x, -1, 1, EM_F32);
    /* NaN poisons its row only */
    const double w[4] = {1, NAN, 0, 1};
    em_tensor *y = em_softmax(tu_tensor(w, 2, TU_SIZES(2, 2), EM_F64), 1);
    double ref[4] = {NAN, NAN, 1 / (1 + M_E), M_E / (1 + M_E)};
    tu_check_close(y, ref, 2, TU_SIZES(2, 2), 1e-14, 0);
}
END_TEST

START_TEST(softmax_integer_input_computes_in_f32) {
    const double v[3] = {1, 2, 3};
    em_tensor *y = em_softmax(tu_tensor(v, 1, TU_SIZES(3), EM_I32), 0);
    ck_assert_int_eq(em_dtype_of(y), EM_F32);
    double s = exp(1) + exp(2) + exp(3);
    double ref[3] = {exp(1) / s, exp(2) / s, exp(3) / s};
    tu_check_close(y, ref, 1, TU_SIZES(3), 1e-6, 0);
}
END_TEST

START_TEST(softmax_errors) {
    em_tensor *x = tu_random(1, 2, TU_SIZES(2, 3), EM_F32, 1);
    tu_check_fails(em_softmax(x, 2), EM_ERR_DIM);
    tu_check_fails(em_log_softmax(x, -3), EM_ERR_DIM);
    tu_check_fails(em_softmax(NULL, 0), EM_ERR_NULL);
    tu_check_fails(em_log_softmax(NULL, 0), EM_ERR_NULL);
}
END_TEST

/* Reference layer norm over the last `nn` dims of a row-major array. */
static void ref_layer_norm(const double *x, const double *w, const double *b, double *y,
                           int64_t rows, int64_t n, double eps) {
    for (int64_t r = 0; r < rows; r++) {
        const double *row = x + r * n;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < n; i++) mean += row[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++) var += (row[i] - mean) * (row[i] - mean);
        var /= (double)n;
        for (int64_t i = 0; i < n; i++) {
            double v = (row[i] - mean) / sqrt(var + eps);
            if (w) v *= w[i];
            if (b) v += b[i];
            y[r * n + i] = v;
        }
    }
}

static void check_layer_norm(em_tensor *x, int nn, em_tensor *w, em_tensor *b, double eps,
                             double tol) {
    int nd = em_ndim(x);
    int64_t rows = 1, n = 1;
    for (int i = 0; i < nd; i++) *(i < nd - nn ? &rows : &n) *= em_size(x, i);
    double *xv = tu_values(x), *wv = w ? tu_values(w) : NULL, *bv = b ? tu_values(b) : NULL;
    double *ref = malloc(sizeof(double) * (size_t)(rows * n + 1));
    ref_layer_norm(xv, wv, bv, ref, rows, n, eps);
    em_tensor *y = em_layer_norm(x, nn, w, b, eps);
    tu_check_close(y, ref, nd, em_sizes(x), tol, tol);
    free(xv);
    free(wv);
    free(bv);
    free(ref);
}

START_TEST(layer_norm_values) {
    em_tensor *x = tu_random(5, 3, TU_SIZES(2, 3, 16), EM_F32, 2.0);
    em_tensor *w = tu_random(6, 1, TU_SIZES(16), EM_F32, 1.0);
    em_tensor *b = tu_random(7, 1, TU_SIZES(16), EM_F32, 1.0);
    check_layer_norm(x, 1, w, b, 1e-5, 2e-5);
    check_layer_norm(x, 1, NULL, NULL, 1e-5, 2e-5);
    check_layer_norm(x, 1, w, NULL, 0.1, 2e-5);
    check_layer_norm(x, 2, NULL, tu_random(8, 2, TU_SIZES(3, 16), EM_F32, 1), 1e-5, 2e-5);
    em_tensor *xd = tu_random(9, 2, TU_SIZES(4, 33), EM_F64, 100.0);
    check_layer_norm(xd, 1, NULL, NULL, 1e-12, 1e-10);
    /* non-contiguous input, and a row of one element (normalizes to 0) */
    check_layer_norm(em_transpose(tu_random(10, 2, TU_SIZES(8, 5), EM_F32, 1), 0, 1), 1, NULL,
                     NULL, 1e-5, 2e-5);
    check_layer_norm(tu_random(11, 2, TU_SIZES(3, 1), EM_F64, 1), 1, NULL, NULL, 1e-5, 1e-12);
}
END_TEST

START_TEST(layer_norm_errors) {
    em_tensor *x = tu_random(1, 2, TU_SIZES(2, 4), EM_F32, 1);
    em_tensor *w3 = tu_random(2, 1, TU_SIZES(3), EM_F32, 1);
    tu_check_fails(em_layer_norm(NULL, 1, NULL, NULL, 1e-5), EM_ERR_NULL);
    tu_check_fails(em_layer_norm(x, 0, NULL, NULL, 1e-5), EM_ERR_DIM);
    tu_check_fails(em_layer_norm(x, 3, NULL, NULL, 1e-5), EM_ERR_DIM);
    tu_check_fails(em_layer_norm(x, 1, w3, NULL, 1e-5), EM_ERR_SHAPE);
    tu_check_fails(em_layer_norm(x, 1, NULL, w3, 1e-5), EM_ERR_SHAPE);
    tu_check_fails(em_layer_norm(x, 1, NULL, NULL, -1), EM_ERR_ARG);
    tu_check_fails(em_layer_norm(x, 1, NULL, NULL, NAN), EM_ERR_ARG);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("decomp");
    TCase *tc = tcase_create("softmax");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, softmax_every_dim);
    tcase_add_test(tc, softmax_non_contiguous_and_edge_sizes);
    tcase_add_test(tc, softmax_extreme_values);
    tcase_add_test(tc, softmax_integer_input_computes_in_f32);
    tcase_add_test(tc, softmax_errors);
    tcase_add_loop_test(tc, softmax_over_empty_dims, 0, 3);
    suite_add_tcase(s, tc);
    tc = tcase_create("layer_norm");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, layer_norm_values);
    tcase_add_test(tc, layer_norm_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
