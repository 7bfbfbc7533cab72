/* test_chains.c - the scheduler's chains (issues 14 and 17): a value read
 * only through views that narrow it is recomputed by its readers, not
 * stored whole (log_softmax, then a slice of its columns); views of fused
 * values (slice, permute, expand, reshape) are looked through; consumers
 * of reductions without keepdim (unsqueezed, reshaped, or combined with
 * each other) fuse like the keepdim forms.  For each: the kernels the
 * schedule makes, the largest value they store, and the compiled values
 * against float64 references computed here. */
#include "testutil.h"

#include "schedule.h"
#include "trace.h"

#include <math.h>
#include <string.h>

typedef em_status (*fn_t)(void *, em_tensor *const *, const double *, em_tensor **);

#define RETURN(x)                                                                                  \
    do {                                                                                           \
        out[0] = (x);                                                                              \
        return out[0] ? EM_OK : em_last_status();                                                  \
    } while (0)

static int last_dim = -1;

/* ---- what the schedule makes ---- */

typedef struct plan_info {
    int kernels, eager;
    int64_t max_stored; /* elements of the largest value a kernel stores */
} plan_info;

/* Records fn on in, schedules and lowers every kernel of the graph. */
static plan_info plan_of(fn_t fn, int nin, em_tensor **in) {
    em_tensor *out = NULL;
    char why[256] = "";
    tr_recorder *r = tr_record_begin(nin, in, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(fn(NULL, in, NULL, &out), EM_OK);
    tr_graph *g = tr_record_end(r, 1, &out, why, sizeof why);
    ck_assert_msg(g != NULL, "record: %s %s", why, em_last_error());
    ck_assert_int_eq(tr_optimize(g, true), EM_OK);
    sc_schedule *s = sc_build(g);
    ck_assert_ptr_nonnull(s);
    int *bufs = malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    plan_info p = {0, 0, 0};
    for (int i = 0; i < s->nsteps; i++) {
        if (s->steps[i].kind == SC_EAGER) {
            p.eager++;
            continue;
        }
        int nbufs, nouts;
        k_kernel *k = sc_lower(s, s->steps[i].group, bufs, &nbufs, &nouts);
        ck_assert_msg(k != NULL, "sc_lower: %s", em_last_error());
        ck_assert_msg(kir_verify(k) == EM_OK, "%s", em_last_error());
        for (int b = nbufs - nouts; b < nbufs; b++) {
            const em_meta *m = &g->nodes[bufs[b]].meta;
            int64_t n = em_shape_numel(m->ndim, m->sizes);
            if (n > p.max_stored) p.max_stored = n;
        }
        kir_free(k);
        p.kernels++;
    }
    free(bufs);
    sc_free(s);
    tr_graph_free(g);
    return p;
}

/* Compiles fn (cpu backend), calls it twice and checks the compiled call
 * against ref (float64, row-major, of the result's sizes). */
static void check_values(fn_t fn, int nin, em_tensor **in, const double *ref, double tol) {
    em_compile_options o = {.ninputs = nin, .noutputs = 1, .name = "chain", .backend = "cpu"};
    em_compiled *f = em_compile(fn, NULL, &o);
    ck_assert_ptr_nonnull(f);
    em_tensor *y1, *y2;
    ck_assert_msg(em_call(f, in, NULL, &y1) == EM_OK, "%s", em_last_error());
    ck_assert_msg(em_call(f, in, NULL, &y2) == EM_OK, "%s", em_last_error());
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.hits, 1);
    tu_check_close(y2, ref, em_ndim(y2), em_sizes(y2), tol, tol);
    em_compiled_free(f);
}

/* ---- float64 references ---- */

static void ref_log_softmax(const double *x, int64_t rows, int64_t cols, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        const double *a = x + r * cols;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < cols; c++) m = a[c] > m ? a[c] : m;
        for (int64_t c = 0; c < cols; c++) s += exp(a[c] - m);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = a[c] - m - log(s);
    }
}

static double ref_row_mean(const double *a, int64_t cols) {
    double s = 0;
    for (int64_t c = 0; c < cols; c++) s += a[c];
    return s / (double)cols;
}

static double ref_row_var(const double *a, int64_t cols) {
    double m = ref_row_mean(a, cols), s = 0;
    for (int64_t c = 0; c < cols; c++) s += (a[c] - m) * (a[c] - m);
    return s / (double)(cols - 1);
}

/* ---- log_softmax, then a slice of its columns ---- */

static const int64_t SLICE_START = 3, SLICE_END = 203, SLICE_STEP = 2;

static em_status lsm_slice(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *l = em_log_softmax(in[0], -1);
    int64_t end = SLICE_END < em_size(l, 1) ? SLICE_END : em_size(l, 1);
    int64_t start = SLICE_START < end ? SLICE_START : 0;
    RETURN(em_mul_scalar(em_slice(l, 1, start, end, SLICE_STEP), 2.0));
}

static em_status lsm_slice_mean(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    RETURN(em_mean(em_slice(em_log_softmax(in[0], -1), 1, 0, 100, 1), 0, NULL, false));
}

/* The expected lsm_slice: 2 * log_softmax(x)[:, start:end:step]. */
static double *ref_lsm_slice(em_tensor *x, int64_t *n) {
    int64_t rows = em_size(x, 0), cols = em_size(x, 1);
    double *xv = tu_values(x), *l = malloc(sizeof(double) * (size_t)(rows * cols + 1));
    ref_log_softmax(xv, rows, cols, l);
    int64_t end = SLICE_END < cols ? SLICE_END : cols, start = SLICE_START < end ? SLICE_START : 0;
    int64_t w = (end - start + SLICE_STEP - 1) / SLICE_STEP;
    double *y = malloc(sizeof(double) * (size_t)(rows * w + 1));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < w; j++) y[r * w + j] = 2 * l[r * cols + start + j * SLICE_STEP];
    *n = rows * w;
    free(xv);
    free(l);
    return y;
}

/* The full log_softmax is never stored: a kernel stores the row maxima and
 * sums, the next computes the kept columns from x and them. */
START_TEST(a_slice_of_log_softmax_stores_only_its_columns) {
    int64_t sizes[][2] = {{37, 1001}, {1, 300}, {4, 5}, {2, 1}, {0, 400}, {64, 4099}};
    for (int i = 0; i < 6; i++) {
        em_tensor *x = tu_random(1 + (uint64_t)i, 2, sizes[i], EM_F32, 3.0);
        plan_info p = plan_of(lsm_slice, 1, &x);
        int64_t n;
        double *ref = ref_lsm_slice(x, &n);
        ck_assert_int_eq(p.kernels, 2);
        ck_assert_msg(p.max_stored <= (n > sizes[i][0] ? n : sizes[i][0]), "stored %lld elements",
                      (long long)p.max_stored);
        check_values(lsm_slice, 1, &x, ref, 1e-5);
        free(ref);
    }
    /* a transposed (non-contiguous) input */
    em_tensor *t = em_transpose(tu_random(9, 2, TU_SIZES(500, 33), EM_F32, 3.0), 0, 1);
    int64_t n;
    double *ref = ref_lsm_slice(t, &n);
    ck_assert_int_eq(plan_of(lsm_slice, 1, &t).kernels, 2);
    check_values(lsm_slice, 1, &t, ref, 1e-5);
    free(ref);
}
END_TEST

/* An op that is not fused (a whole-tensor mean of 70,000 elements, which
 * the eager reduction splits over threads) reading the slice: a kernel
 * stores the slice (rows x 100), not the log_softmax. */
START_TEST(a_sliced_value_read_by_an_eager_op_is_stored_narrow) {
    em_tensor *x = tu_random(11, 2, TU_SIZES(700, 1000), EM_F32, 2.0);
    plan_info p = plan_of(lsm_slice_mean, 1, &x);
    ck_assert_int_eq(p.kernels, 2);
    ck_assert_int_eq(p.eager, 1);
    ck_assert_int_eq(p.max_stored, 700 * 100);
    double *xv = tu_values(x), *l = malloc(sizeof(double) * 700 * 1000), mean = 0;
    ref_log_softmax(xv, 700, 1000, l);
    for (int r = 0; r < 700; r++)
        for (int c = 0; c < 100; c++) mean += l[r * 1000 + c] / (700.0 * 100.0);
    check_values(lsm_slice_mean, 1, &x, &mean, 1e-5);
    free(xv);
    free(l);
}
END_TEST

/* ---- consumers of reductions without keepdim ---- */

static em_status center_unsqueeze(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    RETURN(em_sub(in[0], em_unsqueeze(em_mean(in[0], 1, &last_dim, false), -1)));
}

static em_status center_reshape(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    int64_t sz[EM_MAX_DIMS];
    int nd = em_ndim(in[0]);
    for (int d = 0; d < nd; d++) sz[d] = d < nd - 1 ? em_size(in[0], d) : 1;
    RETURN(em_sub(in[0], em_reshape(em_mean(in[0], 1, &last_dim, false), nd, sz)));
}

static em_status mean_plus_var(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    RETURN(em_add(em_mean(in[0], 1, &last_dim, false), em_var(in[0], 1, &last_dim, 1, false)));
}

/* x minus its row means, over rows of the last dim. */
static double *ref_center(em_tensor *x) {
    int64_t cols = em_size(x, em_ndim(x) - 1), n = em_numel(x), rows = cols ? n / cols : 0;
    double *v = tu_values(x);
    for (int64_t r = 0; r < rows; r++) {
        double m = ref_row_mean(v + r * cols, cols);
        for (int64_t c = 0; c < cols; c++) v[r * cols + c] -= m;
    }
    return v;
}

START_TEST(an_unsqueezed_or_reshaped_mean_fuses_with_its_reader) {
    int64_t sizes[][2] = {{5, 7}, {1, 1}, {64, 33}, {3, 1}, {1, 4099}, {0, 9}};
    for (int i = 0; i < 6; i++) {
        em_tensor *x = tu_random(20 + (uint64_t)i, 2, sizes[i], EM_F32, 2.0);
        double *ref = ref_center(x);
        if (sizes[i][0] > 0) { /* an empty graph makes no kernel at all */
            ck_assert_int_eq(plan_of(center_unsqueeze, 1, &x).kernels, 1);
            ck_assert_int_eq(plan_of(center_reshape, 1, &x).kernels, 1);
        }
        check_values(center_unsqueeze, 1, &x, ref, 1e-5);
        check_values(center_reshape, 1, &x, ref, 1e-5);
        free(ref);
    }
    /* 3-d, non-contiguous, and a broadcast (stride 0) input */
    em_tensor *x3 = em_permute(tu_random(30, 3, TU_SIZES(6, 2, 3), EM_F64, 1.0), 3, (const int[]){1, 2, 0});
    em_tensor *xb = em_expand(tu_random(31, 2, TU_SIZES(1, 13), EM_F32, 1.0), 2, TU_SIZES(9, 13));
    em_tensor *ins[2] = {x3, xb};
    for (int i = 0; i < 2; i++) {
        double *ref = ref_center(ins[i]);
        ck_assert_int_eq(plan_of(center_reshape, 1, &ins[i]).kernels, 1);
        check_values(center_unsqueeze, 1, &ins[i], ref, 1e-5);
        check_values(center_reshape, 1, &ins[i], ref, 1e-5);
        free(ref);
    }
}
END_TEST

/* layer_norm written with reductions without keepdim and an epsilon:
 * (x - mean.unsqueeze(-1)) * rsqrt(var + eps).unsqueeze(-1) */
static em_status norm_without_keepdim(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *m = em_mean(in[0], 1, &last_dim, false), *v = em_var(in[0], 1, &last_dim, 0, false);
    RETURN(em_mul(em_sub(in[0], em_unsqueeze(m, -1)), em_unsqueeze(em_rsqrt(em_add_scalar(v, 1e-5)), -1)));
}

START_TEST(a_norm_written_without_keepdim_is_one_kernel) {
    int64_t sizes[][2] = {{5, 7}, {1, 1}, {64, 33}, {2, 4099}};
    for (int i = 0; i < 4; i++) {
        em_tensor *x = tu_random(45 + (uint64_t)i, 2, sizes[i], EM_F32, 2.0);
        ck_assert_int_eq(plan_of(norm_without_keepdim, 1, &x).kernels, 1);
        int64_t R = sizes[i][0], C = sizes[i][1];
        double *ref = tu_values(x);
        for (int64_t r = 0; r < R; r++) {
            double *a = ref + r * C, m = ref_row_mean(a, C), var = 0;
            for (int64_t c = 0; c < C; c++) var += (a[c] - m) * (a[c] - m) / (double)C;
            for (int64_t c = 0; c < C; c++) a[c] = (a[c] - m) / sqrt(var + 1e-5);
        }
        check_values(norm_without_keepdim, 1, &x, ref, 1e-4);
        free(ref);
    }
}
END_TEST

START_TEST(two_reductions_of_a_row_without_keepdim_are_one_kernel) {
    int64_t sizes[][2] = {{5, 7}, {1, 2}, {64, 33}, {2, 4099}};
    for (int i = 0; i < 4; i++) {
        em_tensor *x = tu_random(40 + (uint64_t)i, 2, sizes[i], EM_F32, 2.0);
        plan_info p = plan_of(mean_plus_var, 1, &x);
        ck_assert_int_eq(p.kernels, 1);
        ck_assert_int_eq(p.max_stored, sizes[i][0]);
        double *v = tu_values(x), *ref = malloc(sizeof(double) * (size_t)sizes[i][0]);
        for (int64_t r = 0; r < sizes[i][0]; r++)
            ref[r] = ref_row_mean(v + r * sizes[i][1], sizes[i][1]) + ref_row_var(v + r * sizes[i][1], sizes[i][1]);
        check_values(mean_plus_var, 1, &x, ref, 1e-5);
        free(v);
        free(ref);
    }
}
END_TEST

/* ---- other views of fused values ---- */

/* exp(x) read transposed, a row max broadcast by expand, and tanh(x)
 * reshaped to other sizes: each recomputed where the view reads it. */
static em_status views_of_fused(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *e = em_exp(in[0]);                                        /* [R, C] */
    em_tensor *t = em_add(em_transpose(e, 0, 1), in[1]);                 /* [C, R] */
    em_tensor *m = em_amax(in[0], 1, &last_dim, true);                   /* [R, 1] */
    em_tensor *x = em_expand(m, 2, TU_SIZES(em_size(in[0], 0), em_size(in[0], 1)));
    em_tensor *r = em_reshape(em_tanh(em_sub(in[0], x)), 2, TU_SIZES(em_size(in[0], 1), em_size(in[0], 0)));
    RETURN(em_add(t, r));
}

START_TEST(transposed_expanded_and_reshaped_views_are_recomputed) {
    int64_t sizes[][2] = {{6, 10}, {1, 1}, {7, 3}, {33, 65}};
    for (int i = 0; i < 4; i++) {
        int64_t R = sizes[i][0], C = sizes[i][1];
        em_tensor *in[2] = {tu_random(50 + (uint64_t)i, 2, sizes[i], EM_F32, 1.0),
                            tu_random(60 + (uint64_t)i, 2, TU_SIZES(C, R), EM_F32, 1.0)};
        double *x = tu_values(in[0]), *w = tu_values(in[1]), *ref = malloc(sizeof(double) * (size_t)(R * C));
        double *th = malloc(sizeof(double) * (size_t)(R * C));
        for (int64_t r = 0; r < R; r++) {
            double m = -INFINITY;
            for (int64_t c = 0; c < C; c++) m = fmax(m, x[r * C + c]);
            for (int64_t c = 0; c < C; c++) th[r * C + c] = tanh(x[r * C + c] - m);
        }
        for (int64_t a = 0; a < C; a++)
            for (int64_t b = 0; b < R; b++) ref[a * R + b] = exp(x[b * C + a]) + w[a * R + b] + th[a * R + b];
        plan_info p = plan_of(views_of_fused, 2, in);
        ck_assert_int_le(p.max_stored, R * C);
        check_values(views_of_fused, 2, in, ref, 1e-5);
        free(x), free(w), free(ref), free(th);
    }
}
END_TEST

/* A row reduction over a slice of a fused value: its pass computes the
 * value at the kept columns (one kernel for the exp and the sum). */
static em_status sum_of_slice(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *e = em_exp(in[0]);
    RETURN(em_sum(em_slice(e, 1, 1, em_size(e, 1) - 1, 1), 1, &last_dim, true));
}

START_TEST(a_row_reduction_reads_a_slice_of_a_fused_value) {
    int64_t sizes[][2] = {{70, 9}, {64, 3}, {100, 301}};
    for (int i = 0; i < 3; i++) {
        em_tensor *x = tu_random(75 + (uint64_t)i, 2, sizes[i], EM_F32, 1.0);
        int64_t R = sizes[i][0], C = sizes[i][1];
        ck_assert_int_eq(plan_of(sum_of_slice, 1, &x).max_stored, R);
        double *v = tu_values(x), *ref = malloc(sizeof(double) * (size_t)R);
        for (int64_t r = 0; r < R; r++) {
            ref[r] = 0;
            for (int64_t c = 1; c < C - 1; c++) ref[r] += exp(v[r * C + c]);
        }
        check_values(sum_of_slice, 1, &x, ref, 1e-5);
        free(v), free(ref);
    }
}
END_TEST

/* A costly value read through two halves of it: recomputing both halves
 * costs the whole cone once more, so the cost model stores it; one half
 * read alone is recomputed (half the cone is under the threshold). */
static em_status halves(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *y = em_tanh(em_tanh(em_tanh(em_tanh(in[0])))); /* 4 x 10 ops */
    int64_t h = em_size(y, 1) / 2;
    RETURN(em_add(em_slice(y, 1, 0, h, 1), em_slice(y, 1, h, 2 * h, 1)));
}

static em_status one_half(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *y = em_tanh(em_tanh(em_tanh(em_tanh(in[0]))));
    RETURN(em_mul_scalar(em_slice(y, 1, 0, em_size(y, 1) / 2, 1), 3.0));
}

START_TEST(the_cost_model_counts_what_a_view_reads) {
    em_tensor *x = tu_random(70, 2, TU_SIZES(16, 64), EM_F32, 1.0);
    ck_assert_int_eq(plan_of(halves, 1, &x).max_stored, 16 * 64); /* y stored */
    ck_assert_int_eq(plan_of(one_half, 1, &x).max_stored, 16 * 32);
    double *v = tu_values(x), ref2[16 * 32], ref1[16 * 32];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 32; c++) {
            double a = tanh(tanh(tanh(tanh(v[r * 64 + c])))), b = tanh(tanh(tanh(tanh(v[r * 64 + 32 + c]))));
            ref2[r * 32 + c] = a + b;
            ref1[r * 32 + c] = 3 * a;
        }
    check_values(halves, 1, &x, ref2, 1e-5);
    check_values(one_half, 1, &x, ref1, 1e-5);
    free(v);
}
END_TEST

/* A view that is a graph output keeps its strides: its input is stored
 * and the view made eagerly, as before. */
static em_status sliced_output(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    RETURN(em_slice(em_exp(in[0]), 1, 1, 4, 1));
}

/* An empty slice of a fused value, read by a fused op: nothing to do. */
static em_status empty_slice(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    RETURN(em_mul_scalar(em_slice(em_exp(in[0]), 1, 2, 2, 1), 2.0));
}

START_TEST(an_empty_slice_of_a_fused_value) {
    em_tensor *x = tu_random(81, 2, TU_SIZES(4, 6), EM_F32, 1.0);
    ck_assert_int_le(plan_of(empty_slice, 1, &x).max_stored, 0);
    double none = 0;
    check_values(empty_slice, 1, &x, &none, 0);
}
END_TEST

START_TEST(a_view_output_is_a_view_of_a_stored_value) {
    em_tensor *x = tu_random(80, 2, TU_SIZES(3, 6), EM_F32, 1.0);
    plan_info p = plan_of(sliced_output, 1, &x);
    ck_assert_int_eq(p.kernels, 1);
    ck_assert_int_eq(p.max_stored, 18);
    double *v = tu_values(x), ref[9];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++) ref[r * 3 + c] = exp(v[r * 6 + 1 + c]);
    check_values(sliced_output, 1, &x, ref, 1e-6);
    free(v);
}
END_TEST

/* Slices that together cover a fused value, each read by a matmul (q, k
 * and v of a qkv projection plus bias): storing them would cost what
 * storing the value does, so the value is stored once and the slices are
 * views of it, as before; one slice alone is stored narrow. */
static em_status qkv_products(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *qkv = em_add(in[0], in[1]); /* [T, 3E] */
    int64_t e = em_size(in[0], 1) / 3;
    em_tensor *q = em_slice(qkv, 1, 0, e, 1), *k = em_slice(qkv, 1, e, 2 * e, 1), *v = em_slice(qkv, 1, 2 * e, 3 * e, 1);
    RETURN(em_matmul(em_matmul(q, em_transpose(k, 0, 1)), v));
}

static em_status q_product(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *q = em_slice(em_add(in[0], in[1]), 1, 0, em_size(in[0], 1) / 3, 1);
    RETURN(em_matmul(q, em_transpose(q, 0, 1)));
}

START_TEST(slices_that_cover_a_value_read_by_matmuls_keep_it_whole) {
    const int64_t T = 5, E = 4;
    em_tensor *in[2] = {tu_random(85, 2, TU_SIZES(T, 3 * E), EM_F32, 1.0), tu_random(86, 1, TU_SIZES(3 * E), EM_F32, 1.0)};
    plan_info p = plan_of(qkv_products, 2, in);
    ck_assert_int_eq(p.kernels, 1);
    ck_assert_int_eq(p.max_stored, T * 3 * E);
    /* q and q.T, each [T, E] stored by a kernel: 2/3 of the projection */
    plan_info p1 = plan_of(q_product, 2, in);
    ck_assert_int_eq(p1.kernels, 2);
    ck_assert_int_eq(p1.max_stored, T * E);
    double *x = tu_values(in[0]), *b = tu_values(in[1]), qkv[5 * 12], att[5 * 5], ref[5 * 4], refq[5 * 5];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 3 * E; j++) qkv[t * 3 * E + j] = x[t * 3 * E + j] + b[j];
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) {
            att[i * T + j] = refq[i * T + j] = 0;
            for (int d = 0; d < E; d++) att[i * T + j] += qkv[i * 3 * E + d] * qkv[j * 3 * E + E + d];
            for (int d = 0; d < E; d++) refq[i * T + j] += qkv[i * 3 * E + d] * qkv[j * 3 * E + d];
        }
    for (int i = 0; i < T; i++)
        for (int d = 0; d < E; d++) {
            ref[i * E + d] = 0;
            for (int j = 0; j < T; j++) ref[i * E + d] += att[i * T + j] * qkv[j * 3 * E + 2 * E + d];
        }
    check_values(qkv_products, 2, in, ref, 1e-4);
    check_values(q_product, 2, in, refq, 1e-4);
    free(x), free(b);
}
END_TEST

/* ---- dynamic shapes ---- */

/* The unsqueezed mean and the slice of a log_softmax, dynamic in the rows:
 * one dynamic entry serves every row count, values right at each. */
START_TEST(chains_take_dynamic_rows) {
    fn_t fns[2] = {center_unsqueeze, lsm_slice};
    for (int f = 0; f < 2; f++) {
        em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "dyn", .backend = "cpu", .dynamic = 1};
        em_compiled *c = em_compile(fns[f], NULL, &o);
        ck_assert_ptr_nonnull(c);
        int64_t rows[] = {5, 9, 2, 17, 1};
        for (int i = 0; i < 5; i++) {
            em_tensor *x = tu_random(90 + (uint64_t)i, 2, TU_SIZES(rows[i], 301), EM_F32, 2.0), *y = NULL;
            ck_assert_msg(em_call(c, &x, NULL, &y) == EM_OK, "%s", em_last_error());
            int64_t n;
            double *ref = f == 0 ? ref_center(x) : ref_lsm_slice(x, &n);
            tu_check_close(y, ref, em_ndim(y), em_sizes(y), 1e-5, 1e-5);
            free(ref);
        }
        em_compile_stats st;
        em_compiled_stats(c, &st);
        ck_assert_int_eq(st.dynamic_entries, 1);
        em_compiled_free(c);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("chains");
    TCase *tc = tcase_create("chains");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, a_slice_of_log_softmax_stores_only_its_columns);
    tcase_add_test(tc, a_sliced_value_read_by_an_eager_op_is_stored_narrow);
    tcase_add_test(tc, an_unsqueezed_or_reshaped_mean_fuses_with_its_reader);
    tcase_add_test(tc, two_reductions_of_a_row_without_keepdim_are_one_kernel);
    tcase_add_test(tc, a_norm_written_without_keepdim_is_one_kernel);
    tcase_add_test(tc, transposed_expanded_and_reshaped_views_are_recomputed);
    tcase_add_test(tc, a_row_reduction_reads_a_slice_of_a_fused_value);
    tcase_add_test(tc, the_cost_model_counts_what_a_view_reads);
    tcase_add_test(tc, a_view_output_is_a_view_of_a_stored_value);
    tcase_add_test(tc, an_empty_slice_of_a_fused_value);
    tcase_add_test(tc, slices_that_cover_a_value_read_by_matmuls_keep_it_whole);
    tcase_add_test(tc, chains_take_dynamic_rows);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
