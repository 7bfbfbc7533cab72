/* test_lazy.c - lazy mode: every op gives the values eager mode gives;
 * what defers and what computes (materialization points); errors at the
 * op; the per-structure limit; whole programs (MLP, attention) against
 * float64; graph breaks in em_compile run as segments; em_compile and lazy
 * mode share one entry machinery (the same counts for the same shapes). */
#include "testutil.h"

#include "eager.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define CPU em_cpu()

/* ---- every op, lazy against eager ---- */

enum { A, B, C, NC, IDX, ZERO, ONE, NIN };

typedef em_tensor *(*apply_fn)(em_tensor *const *in);

static em_tensor *dims1(em_tensor *(*r)(const em_tensor *, int, const int *, bool), const em_tensor *x, int d, bool keep) {
    return r(x, 1, &d, keep);
}

#define U(name, expr) static em_tensor *name(em_tensor *const *in) { return (expr); }
U(t_neg, em_neg(in[A]))
U(t_abs, em_abs(in[A]))
U(t_exp, em_exp(in[A]))
U(t_log, em_log(em_add_scalar(em_abs(in[A]), 1)))
U(t_sqrt, em_sqrt(em_abs(in[A])))
U(t_rsqrt, em_rsqrt(em_add_scalar(em_abs(in[A]), 1)))
U(t_sin, em_sin(in[A]))
U(t_cos, em_cos(in[A]))
U(t_tanh, em_tanh(in[A]))
U(t_sigmoid, em_sigmoid(in[A]))
U(t_relu, em_relu(in[A]))
U(t_gelu, em_gelu(in[A]))
U(t_gelu_tanh, em_gelu_tanh(in[A]))
U(t_erf, em_erf(in[A]))
U(t_add, em_add(in[A], in[B]))
U(t_sub, em_sub(in[A], in[B]))
U(t_mul, em_mul(in[A], in[B]))
U(t_div, em_div(in[A], em_add_scalar(em_abs(in[B]), 0.5)))
U(t_pow, em_pow(em_add_scalar(em_abs(in[A]), 1), in[B]))
U(t_maximum, em_maximum(in[A], in[B]))
U(t_minimum, em_minimum(in[A], in[B]))
U(t_bcast, em_mul(em_add(in[A], in[C]), in[C]))
U(t_noncontig, em_add(in[NC], in[A]))
U(t_scalars, em_minimum_scalar(em_maximum_scalar(em_pow_scalar(em_div_scalar(em_mul_scalar(em_sub_scalar(em_add_scalar(in[A], 1), 2), 3), 4), 2), 0.1), 3))
U(t_eq, em_eq(in[A], in[A]))
U(t_ne, em_ne(in[A], in[B]))
U(t_lt, em_lt(in[A], in[B]))
U(t_le, em_le(in[A], in[B]))
U(t_gt, em_gt(in[A], in[B]))
U(t_ge, em_ge(in[A], in[B]))
U(t_where, em_where(em_gt(in[A], in[B]), in[A], em_neg(in[B])))
U(t_cast_f64, em_mul(em_cast(in[A], EM_F64), em_cast(in[B], EM_F64)))
U(t_cast_i32, em_cast(em_mul_scalar(in[A], 10), EM_I32))
U(t_sum, dims1(em_sum, in[A], 1, false))
U(t_mean, dims1(em_mean, in[A], 0, true))
U(t_amax, dims1(em_amax, em_exp(in[A]), 1, true))
U(t_amin, dims1(em_amin, in[A], 0, false))
U(t_var, em_var(in[A], 1, (const int[]){1}, 1, false))
U(t_argmax, em_argmax(em_add(in[A], in[B]), 1, false))
U(t_reshape, em_reshape(em_exp(in[A]), 2, TU_SIZES(5, 3)))
U(t_permute, em_contiguous(em_permute(em_exp(in[A]), 2, (const int[]){1, 0})))
U(t_transpose, em_add_scalar(em_transpose(in[A], 0, 1), 1))
U(t_slice, em_slice(em_exp(in[A]), 1, 1, 5, 2))
U(t_expand, em_add(em_expand(em_unsqueeze(in[C], 0), 2, TU_SIZES(3, 5)), in[A]))
U(t_squeeze, em_squeeze(em_sum(in[A], 1, (const int[]){1}, true), 1))
U(t_contiguous, em_contiguous(em_transpose(em_exp(in[A]), 0, 1)))
U(t_cat, em_cat(3, (em_tensor *const[]){em_exp(in[A]), in[B], in[A]}, 0))
U(t_index_select, em_index_select(em_exp(in[A]), 1, in[IDX]))
U(t_embedding, em_embedding(em_tanh(em_transpose(in[NC], 0, 1)), in[IDX]))
U(t_matmul, em_matmul(em_relu(in[A]), em_transpose(in[B], 0, 1)))
U(t_softmax, em_softmax(in[A], -1))
U(t_log_softmax, em_log_softmax(in[A], 0))
U(t_layer_norm, em_layer_norm(in[A], 1, in[C], in[C], 1e-5))
U(t_zeros, em_add(em_zeros(2, TU_SIZES(3, 5), EM_F32, CPU), in[A]))
U(t_full, em_mul(em_full(1, TU_SIZES(5), 2.5, EM_F32, CPU), in[A]))
U(t_arange, em_add(em_arange(0, 5, 1, EM_F32, CPU), in[A]))
U(t_size0, em_softmax(em_add_scalar(in[ZERO], 1), -1))
U(t_size0_sum, dims1(em_sum, in[ZERO], 0, false))
U(t_size1, em_layer_norm(em_mul(in[ONE], in[C]), 1, NULL, NULL, 1e-5))
#undef U

static const struct {
    const char *name;
    apply_fn fn;
} OPS[] = {
#define O(f) {#f, f}
    O(t_neg), O(t_abs), O(t_exp), O(t_log), O(t_sqrt), O(t_rsqrt), O(t_sin), O(t_cos),
    O(t_tanh), O(t_sigmoid), O(t_relu), O(t_gelu), O(t_gelu_tanh), O(t_erf), O(t_add),
    O(t_sub), O(t_mul), O(t_div), O(t_pow), O(t_maximum), O(t_minimum), O(t_bcast),
    O(t_noncontig), O(t_scalars), O(t_eq), O(t_ne), O(t_lt), O(t_le), O(t_gt), O(t_ge),
    O(t_where), O(t_cast_f64), O(t_cast_i32), O(t_sum), O(t_mean), O(t_amax), O(t_amin),
    O(t_var), O(t_argmax), O(t_reshape), O(t_permute), O(t_transpose), O(t_slice),
    O(t_expand), O(t_squeeze), O(t_contiguous), O(t_cat), O(t_index_select),
    O(t_embedding), O(t_matmul), O(t_softmax), O(t_log_softmax), O(t_layer_norm),
    O(t_zeros), O(t_full), O(t_arange), O(t_size0), O(t_size0_sum), O(t_size1),
#undef O
};

static void make_inputs(em_tensor **in) {
    in[A] = tu_random(1, 2, TU_SIZES(3, 5), EM_F32, 1);
    in[B] = tu_random(2, 2, TU_SIZES(3, 5), EM_F32, 1);
    in[C] = tu_random(3, 1, TU_SIZES(5), EM_F32, 1);
    in[NC] = em_transpose(tu_random(4, 2, TU_SIZES(5, 3), EM_F32, 1), 0, 1);
    in[IDX] = tu_tensor((const double[]){4, 0, 2, 2}, 1, TU_SIZES(4), EM_I64);
    in[ZERO] = tu_random(5, 2, TU_SIZES(0, 5), EM_F32, 1);
    in[ONE] = tu_random(6, 2, TU_SIZES(1, 5), EM_F32, 1);
}

START_TEST(every_op_lazy_equals_eager) {
    em_tensor *in[NIN];
    make_inputs(in);
    for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++) {
        em_tensor *ref = OPS[i].fn(in);
        ck_assert_msg(ref, "%s eager: %s", OPS[i].name, em_last_error());
        double *rv = tu_values(ref);
        ck_assert_int_eq(em_lazy_begin(), EM_OK);
        em_tensor *y = OPS[i].fn(in);
        ck_assert_msg(y, "%s lazy: %s", OPS[i].name, em_last_error());
        ck_assert_int_eq(em_dtype_of(y), em_dtype_of(ref));
        /* each is at least partly deferred until read */
        em_lazy_stats st;
        em_lazy_get_stats(&st);
        ck_assert_msg(st.ops_deferred > 0, "%s: nothing deferred", OPS[i].name);
        int64_t sizes[EM_MAX_DIMS];
        for (int d = 0; d < em_ndim(ref); d++) sizes[d] = em_size(ref, d);
        tu_check_close(y, rv, em_ndim(ref), sizes, 2e-6, 2e-6);
        ck_assert_int_eq(em_lazy_end(), EM_OK);
        free(rv);
    }
}
END_TEST

/* ---- materialization ---- */

START_TEST(values_are_computed_when_read_and_not_before) {
    em_tensor *x = tu_random(7, 2, TU_SIZES(4, 6), EM_F32, 1);
    double *xv = tu_values(x);
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    ck_assert(em_lazy_active());
    em_lazy_stats s0, s1;
    em_lazy_get_stats(&s0);
    em_tensor *y = em_mul_scalar(em_tanh(x), 2);
    ck_assert_ptr_null(y->storage); /* deferred */
    em_lazy_get_stats(&s1);
    ck_assert_int_ge(s1.ops_deferred - s0.ops_deferred, 2);
    ck_assert_int_eq(s1.flushes, s0.flushes);
    double v;
    /* an element read computes y, and only y's graph */
    ck_assert_int_eq(em_item(em_slice(em_reshape(y, 1, TU_SIZES(24)), 0, 5, 6, 1), &v), EM_OK);
    ck_assert_double_eq_tol(v, 2 * tanh(xv[5]), 1e-6);
    em_lazy_get_stats(&s1);
    ck_assert_int_eq(s1.flushes - s0.flushes, 1);
    /* em_print and em_copy_to_host compute too */
    em_tensor *z = em_exp(x);
    ck_assert_ptr_null(z->storage);
    FILE *devnull = fopen("/dev/null", "w");
    ck_assert_int_eq(em_print(z, devnull), EM_OK);
    fclose(devnull);
    ck_assert_ptr_nonnull(z->storage);
    /* em_sync computes every pending tensor */
    em_tensor *w = em_neg(x), *u = em_sigmoid(w);
    ck_assert_ptr_null(u->storage);
    ck_assert_int_eq(em_sync(), EM_OK);
    ck_assert_ptr_nonnull(w->storage);
    ck_assert_ptr_nonnull(u->storage);
    /* the same program again finds its graphs in the table */
    em_lazy_get_stats(&s0);
    em_tensor *y2 = em_mul_scalar(em_tanh(x), 2);
    ck_assert_int_eq(em_item(em_slice(em_reshape(y2, 1, TU_SIZES(24)), 0, 5, 6, 1), &v), EM_OK);
    em_lazy_get_stats(&s1);
    ck_assert_int_eq(s1.graph_hits - s0.graph_hits, 1);
    ck_assert_int_eq(s1.graphs_compiled, s0.graphs_compiled);
    /* em_lazy_end turns lazy mode off; what is pending stays pending and is
     * computed when read, outside lazy mode */
    em_tensor *late = em_add(x, x);
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    ck_assert(!em_lazy_active());
    ck_assert_ptr_null(late->storage);
    double *lv = tu_values(late);
    ck_assert_ptr_nonnull(late->storage);
    for (int i = 0; i < 24; i++) ck_assert_double_eq_tol(lv[i], 2 * xv[i], 1e-6);
    free(lv);
    ck_assert_int_eq(em_lazy_end(), EM_ERR_STATE);
    free(xv);
}
END_TEST

START_TEST(a_tensor_never_read_stays_computable_and_keeps_its_inputs) {
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    em_tensor *x = em_keep(tu_random(8, 1, TU_SIZES(10), EM_F32, 1)); /* caller-owned */
    double *xv = tu_values(x);
    em_tensor *y = em_keep(em_exp(em_mul_scalar(x, 0.5)));
    em_tensor *z = em_keep(em_sqrt(em_abs(x)));
    em_release(x); /* y and z still need it */
    double *zv = tu_values(z); /* computes z; y stays pending */
    ck_assert_ptr_null(y->storage);
    double *yv = tu_values(y);
    for (int i = 0; i < 10; i++) {
        ck_assert_double_eq_tol(yv[i], exp(0.5 * xv[i]), 1e-6 * exp(0.5 * xv[i]));
        ck_assert_double_eq_tol(zv[i], sqrt(fabs(xv[i])), 1e-6);
    }
    em_release(y);
    em_release(z);
    /* a tensor dropped unread is never computed */
    em_lazy_stats s0, s1;
    em_scope_begin();
    em_tensor *r = tu_random(9, 1, TU_SIZES(10), EM_F32, 1);
    ck_assert_int_eq(em_sync(), EM_OK);
    em_lazy_get_stats(&s0);
    em_tensor *dead = em_exp(r);
    (void)dead;
    em_scope_end();
    ck_assert_int_eq(em_sync(), EM_OK);
    em_lazy_get_stats(&s1);
    ck_assert_int_eq(s1.flushes, s0.flushes);
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    free(xv);
    free(yv);
    free(zv);
}
END_TEST

START_TEST(a_long_chain_is_cut_and_computed_on_the_way) {
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    em_tensor *x = tu_random(10, 1, TU_SIZES(8), EM_F32, 0.1);
    double *xv = tu_values(x);
    em_tensor *y = x;
    for (int i = 0; i < 1000; i++) y = em_add_scalar(y, 0.001);
    em_lazy_stats st;
    em_lazy_get_stats(&st);
    ck_assert_int_ge(st.flushes, 3); /* cut every LZ_MAX_PENDING ops */
    double *yv = tu_values(y);
    for (int i = 0; i < 8; i++) ck_assert_double_eq_tol(yv[i], xv[i] + 1.0, 1e-4);
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    free(xv);
    free(yv);
}
END_TEST

START_TEST(errors_are_reported_at_the_op) {
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    em_tensor *a = tu_random(11, 2, TU_SIZES(3, 4), EM_F32, 1);
    em_tensor *b = tu_random(12, 2, TU_SIZES(5, 4), EM_F32, 1);
    em_tensor *la = em_exp(a);
    tu_check_fails(em_add(la, b), EM_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(em_last_error(), "add"));
    tu_check_fails(em_matmul(la, b), EM_ERR_SHAPE);
    tu_check_fails(em_softmax(la, 5), EM_ERR_DIM);
    tu_check_fails(em_exp(NULL), EM_ERR_NULL);
    tu_check_fails(em_cast(la, (em_dtype)99), EM_ERR_DTYPE);
    /* the good tensor is unaffected */
    double *v = tu_values(la), *av = tu_values(a);
    for (int i = 0; i < 12; i++) ck_assert_double_eq_tol(v[i], exp(av[i]), 1e-6 * exp(av[i]));
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    ck_assert_int_eq(em_lazy_get_stats(NULL), EM_ERR_NULL);
    free(v);
    free(av);
}
END_TEST

/* Runs fn on a new thread (a fresh lazy state, which reads the
 * environment) and returns what it returned. */
static void *on_thread(void *(*fn)(void *), void *arg) {
    pthread_t th;
    void *ret = NULL;
    ck_assert_int_eq(pthread_create(&th, NULL, fn, arg), 0);
    ck_assert_int_eq(pthread_join(th, &ret), 0);
    return ret;
}

static void *limit_body(void *arg) {
    (void)arg;
    em_tensor *xs[10];
    double *xv[10];
    em_scope_begin();
    for (int rows = 3; rows <= 9; rows += 2) { /* made before lazy mode: only softmax defers */
        xs[rows] = tu_random((uint64_t)rows, 2, TU_SIZES(rows, 4), EM_F32, 1);
        xv[rows] = tu_values(xs[rows]);
    }
    em_lazy_begin();
    em_lazy_stats st;
    bool ok = true;
    for (int rows = 3; rows <= 9; rows += 2) {
        float yv[40];
        ok &= em_copy_to_host(em_softmax(xs[rows], -1), yv, sizeof yv) == EM_OK;
        for (int r = 0; r < rows; r++) {
            const double *x = xv[rows] + r * 4;
            double m = fmax(fmax(x[0], x[1]), fmax(x[2], x[3])), sum = 0;
            for (int c = 0; c < 4; c++) sum += exp(x[c] - m);
            for (int c = 0; c < 4; c++) ok &= fabs(yv[r * 4 + c] - exp(x[c] - m) / sum) < 1e-6;
        }
        free(xv[rows]);
    }
    em_lazy_get_stats(&st);
    ok &= st.eager_graphs == 2; /* 4 sizes of one structure, limit 2 */
    /* another structure still compiles */
    int64_t before = st.graphs_compiled;
    float v[12];
    ok &= em_copy_to_host(em_exp(xs[3]), v, sizeof v) == EM_OK;
    em_lazy_get_stats(&st);
    ok &= st.graphs_compiled == before + 1;
    em_lazy_end();
    em_scope_end();
    return ok ? (void *)1 : NULL;
}

START_TEST(the_recompile_limit_applies_per_structure) {
    setenv("EMBER_RECOMPILE_LIMIT", "2", 1);
    setenv("EMBER_DYNAMIC", "0", 1); /* else the second size makes a dynamic entry */
    void *ok = on_thread(limit_body, NULL);
    unsetenv("EMBER_RECOMPILE_LIMIT");
    unsetenv("EMBER_DYNAMIC");
    ck_assert_ptr_nonnull(ok);
}
END_TEST

/* 70 structures (the scalar is part of a structure) at 2 sizes each: 140
 * entries and 70 structures, past the tables' first sizes (64 entries, 16
 * structures, 128 index slots), so both hash indexes grow and probe past
 * occupied slots.  With the limit at 0 nothing compiles (every entry runs
 * op by op, exactly as eager): the test is about the tables. */
#define NSTRUCT 70

static void *many_body(void *arg) {
    (void)arg;
    em_scope_begin();
    em_tensor *xs[2] = {tu_random(11, 2, TU_SIZES(2, 3), EM_F32, 1), tu_random(12, 2, TU_SIZES(3, 3), EM_F32, 1)};
    double *xv[2] = {tu_values(xs[0]), tu_values(xs[1])};
    em_lazy_begin();
    bool ok = true;
    em_lazy_stats st0, st;
    em_lazy_get_stats(&st0);
    for (int pass = 0; pass < 2; pass++) {
        for (int s = 0; s < NSTRUCT; s++) {
            for (int z = 0; z < 2; z++) {
                em_scope_begin();
                float y[9];
                em_tensor *t = em_mul_scalar(em_add_scalar(xs[z], s), 2);
                ok &= t && !t->storage && em_copy_to_host(t, y, sizeof y) == EM_OK;
                for (int i = 0; i < 3 * (z + 2); i++) ok &= y[i] == ((float)xv[z][i] + (float)s) * 2.0f;
                em_scope_end();
            }
        }
        em_lazy_get_stats(&st);
        /* the first pass adds every entry, the second finds every one */
        ok &= st.eager_graphs - st0.eager_graphs == 2 * NSTRUCT;
        ok &= st.graph_hits - st0.graph_hits == (pass ? 2 * NSTRUCT : 0);
        ok &= st.graphs_compiled == st0.graphs_compiled;
    }
    em_lazy_end();
    free(xv[0]);
    free(xv[1]);
    em_scope_end();
    return ok ? (void *)1 : NULL;
}

START_TEST(many_structures_and_sizes_grow_the_tables_and_are_found_again) {
    setenv("EMBER_RECOMPILE_LIMIT", "0", 1);
    setenv("EMBER_DYNAMIC", "0", 1);
    void *ok = on_thread(many_body, NULL);
    unsetenv("EMBER_RECOMPILE_LIMIT");
    unsetenv("EMBER_DYNAMIC");
    ck_assert_ptr_nonnull(ok);
}
END_TEST

/* ---- memory: a whole-program graph frees its intermediates as it runs ---- */

typedef struct live_bytes {
    size_t live, peak;
    em_allocator hook; /* outlives the thread: its lazy state frees with it at exit */
} live_bytes;

static void *live_alloc(void *ud, size_t size, size_t align) {
    live_bytes *c = ud;
    void *p = NULL;
    if (align > 64 || posix_memalign(&p, 64, size + 64) != 0) return NULL;
    *(size_t *)p = size;
    c->live += size;
    if (c->live > c->peak) c->peak = c->live;
    return (char *)p + 64;
}

static void live_free(void *ud, void *ptr) {
    live_bytes *c = ud;
    char *p = (char *)ptr - 64;
    c->live -= *(size_t *)p;
    free(p);
}

/* 8 layers of relu(x @ w), each in its own scope as a model's layers are
 * (MiniLM's encoder): one graph in lazy mode.  Its run must not hold all
 * 16 intermediates at once, as eager mode never does. */
static em_tensor *layers(em_tensor *x, em_tensor *w) {
    for (int i = 0; i < 8; i++) {
        em_scope_begin();
        em_tensor *y = em_relu(em_matmul(x, w));
        x = em_keep(y);
        em_scope_end();
    }
    return x;
}

static void *memory_body(void *arg) {
    live_bytes *c = arg;
    em_set_allocator(&c->hook);
    em_scope_begin();
    em_tensor *x = tu_random(21, 2, TU_SIZES(256, 256), EM_F32, 1), *w = tu_random(22, 2, TU_SIZES(256, 256), EM_F32, 1);
    em_tensor *w2 = em_mul_scalar(w, 0.0625); /* keeps the values in range */
    em_lazy_begin();
    bool ok = em_realize(layers(x, w2)) == EM_OK; /* compiles */
    size_t before = c->live;
    c->peak = c->live;
    em_tensor *y = layers(x, w2);
    ok &= em_realize(y) == EM_OK;
    c->peak -= before;
    em_lazy_end();
    em_scope_end();
    return ok ? (void *)1 : NULL;
}

START_TEST(a_whole_program_graph_frees_its_intermediates_as_it_runs) {
    live_bytes c = {0, 0, {live_alloc, live_free, NULL}};
    c.hook.ud = &c;
    ck_assert_ptr_nonnull(on_thread(memory_body, &c));
    size_t one = 256 * 256 * sizeof(float);
    /* the result, and at most a matmul's input, output and a relu's output
     * besides; holding every intermediate to the end took 16 */
    ck_assert_msg(c.peak <= 5 * one, "peak %zu bytes over the graph's run: %.1f buffers", c.peak,
                  (double)c.peak / (double)one);
    /* the same graph run op by op (past the recompile limit: the replay
     * backend) frees as it goes too */
    live_bytes r = {0, 0, {live_alloc, live_free, NULL}};
    r.hook.ud = &r;
    setenv("EMBER_RECOMPILE_LIMIT", "0", 1);
    void *ok = on_thread(memory_body, &r);
    unsetenv("EMBER_RECOMPILE_LIMIT");
    ck_assert_ptr_nonnull(ok);
    ck_assert_msg(r.peak <= 5 * one, "replayed: peak %zu bytes: %.1f buffers", r.peak,
                  (double)r.peak / (double)one);
}
END_TEST

static void *autostart_body(void *arg) {
    em_tensor *x = arg;
    em_scope_begin();
    em_tensor *y = em_exp(x); /* the thread's first op starts lazy mode */
    bool ok = em_lazy_active() && y && !y->storage;
    double *v = tu_values(y);
    ok &= v && fabs(v[0] - exp(0.5)) < 1e-6;
    free(v);
    em_scope_end();
    em_lazy_end();
    return ok ? (void *)1 : NULL;
}

/* A tensor made in lazy mode on one thread, read on another (not lazy). */
static void *reader_body(void *arg) {
    em_scope_begin(); /* a new thread has no scope: tu_values' cast needs one */
    double *v = tu_values(arg);
    em_scope_end();
    bool ok = v && fabs(v[0] - 2 * tanh(0.5)) < 1e-6;
    free(v);
    return ok ? (void *)1 : NULL;
}

START_TEST(ember_jit_starts_lazy_mode_on_every_thread_and_reads_cross_threads) {
    em_tensor *x = em_keep(em_full(1, TU_SIZES(3), 0.5, EM_F32, CPU));
    setenv("EMBER_JIT", "1", 1);
    void *ok = on_thread(autostart_body, x);
    unsetenv("EMBER_JIT");
    ck_assert_ptr_nonnull(ok);
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    em_tensor *y = em_keep(em_mul_scalar(em_tanh(x), 2));
    ck_assert_int_eq(em_lazy_end(), EM_OK); /* computes y... */
    em_tensor *z = NULL;
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    z = em_keep(em_mul_scalar(em_tanh(x), 2));
    ck_assert_ptr_null(z->storage);
    ck_assert_ptr_nonnull(on_thread(reader_body, z)); /* ...and z is computed by the reader */
    ck_assert_ptr_nonnull(on_thread(reader_body, y));
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    em_release(x);
    em_release(y);
    em_release(z);
}
END_TEST

/* ---- pending tensors across threads ---- */

static void *maker_body(void *arg) {
    em_lazy_begin();
    em_scope_begin();
    em_tensor *y = em_keep(em_mul_scalar(em_tanh(arg), 2)); /* the caller's */
    em_scope_end();
    em_lazy_end();
    return y; /* pending, and its thread (and lazy state's thread reference) ends */
}

typedef struct drop_job {
    em_tensor **ts;
    int n;
} drop_job;

static void *dropper_body(void *arg) {
    drop_job *j = arg;
    for (int i = 0; i < j->n; i++) em_release(j->ts[i]);
    return em_last_status() == EM_OK ? (void *)1 : NULL; /* each was the caller's to release */
}

START_TEST(pending_tensors_outlive_their_thread_and_die_on_any_thread) {
    em_tensor *x = em_keep(em_full(1, TU_SIZES(3), 0.5, EM_F32, CPU));
    em_tensor *y = on_thread(maker_body, x);
    ck_assert_ptr_nonnull(y);
    ck_assert_ptr_null(y->storage);
    double *v = tu_values(y); /* computed here, by the dead thread's recipe */
    for (int i = 0; i < 3; i++) ck_assert_double_eq_tol(v[i], 2 * tanh(0.5), 1e-6);
    free(v);
    em_release(y); /* the last thunk of that thread's lazy state: frees it */
    /* another thread drops pending tensors while this one records more */
    enum { N = 300 };
    em_tensor *ts[N];
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    for (int i = 0; i < N; i++) ts[i] = em_keep(em_add_scalar(x, i));
    drop_job j = {ts, N};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, dropper_body, &j), 0);
    em_scope_begin();
    em_tensor *acc = x;
    for (int i = 0; i < N; i++) acc = em_add_scalar(em_mul_scalar(acc, 0.5), 1);
    void *ok = NULL;
    pthread_join(th, &ok);
    ck_assert_ptr_nonnull(ok);
    ck_assert_int_eq(em_sync(), EM_OK);
    double want = 0.5;
    for (int i = 0; i < N; i++) want = want * 0.5 + 1;
    v = tu_values(acc);
    for (int i = 0; i < 3; i++) ck_assert_double_eq_tol(v[i], want, 1e-5);
    free(v);
    em_scope_end();
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    em_release(x);
}
END_TEST

/* softmax and layer_norm of 10 batch sizes in lazy mode: compiled twice
 * (the first size, then one dynamic entry), unless EMBER_DYNAMIC=0 */
static void *batch_body(void *arg) {
    bool want_dynamic = arg != NULL;
    em_tensor *xs[12], *w = NULL;
    double *xv[12];
    em_scope_begin();
    w = tu_random(99, 1, TU_SIZES(24), EM_F32, 1);
    double *wv = tu_values(w);
    for (int b = 2; b < 12; b++) {
        xs[b] = tu_random(50 + (uint64_t)b, 2, TU_SIZES(b, 24), EM_F32, 2);
        xv[b] = tu_values(xs[b]);
    }
    em_lazy_begin();
    bool ok = true;
    for (int b = 2; b < 12; b++) {
        float y[11 * 24];
        ok &= em_copy_to_host(em_mul(em_softmax(xs[b], -1), w), y, sizeof y) == EM_OK;
        for (int r = 0; r < b; r++) {
            const double *x = xv[b] + r * 24;
            double m = -INFINITY, sum = 0;
            for (int c = 0; c < 24; c++) m = fmax(m, x[c]);
            for (int c = 0; c < 24; c++) sum += exp(x[c] - m);
            for (int c = 0; c < 24; c++)
                ok &= fabs(y[r * 24 + c] - exp(x[c] - m) / sum * wv[c]) < 1e-6 * (1 + fabs(wv[c]));
        }
        free(xv[b]);
    }
    em_lazy_stats st;
    em_lazy_get_stats(&st);
    if (want_dynamic) ok &= st.graphs_compiled == 2 && st.dynamic_graphs == 1 && st.eager_graphs == 0;
    else ok &= st.graphs_compiled == 8 && st.dynamic_graphs == 0 && st.eager_graphs == 2;
    em_lazy_end();
    em_scope_end();
    free(wv);
    return ok ? (void *)1 : NULL;
}

START_TEST(ten_batch_sizes_compile_twice_in_lazy_mode) {
    ck_assert_ptr_nonnull(on_thread(batch_body, (void *)1));
    setenv("EMBER_DYNAMIC", "0", 1);
    void *ok = on_thread(batch_body, NULL);
    unsetenv("EMBER_DYNAMIC");
    ck_assert_ptr_nonnull(ok);
}
END_TEST

/* EMBER_ASYNC_COMPILE=1: the first flush of a new graph runs op by op
 * while it compiles in a thread; later flushes switch to the kernels */
static void *async_body(void *arg) {
    (void)arg;
    em_scope_begin();
    em_tensor *x = tu_random(77, 2, TU_SIZES(64, 33), EM_F32, 1);
    double *xv = tu_values(x);
    em_lazy_begin();
    bool ok = true;
    em_lazy_stats st = {0};
    for (int i = 0; i < 2000 && ok; i++) {
        float y[64 * 33];
        ok &= em_copy_to_host(em_tanh(em_mul_scalar(x, 0.5)), y, sizeof y) == EM_OK;
        for (int k = 0; k < 64 * 33; k++) ok &= fabs(y[k] - tanh(0.5 * xv[k])) < 1e-6;
        em_lazy_get_stats(&st);
        if (st.graphs_compiled == 1 && st.async_runs > 0 && st.flushes > st.async_runs) break;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* the first flush did not wait; a later one ran the compiled kernels */
    ok &= st.async_runs >= 1 && st.graphs_compiled == 1 && st.flushes > st.async_runs;
    em_lazy_end();
    em_scope_end();
    free(xv);
    return ok ? (void *)1 : NULL;
}

START_TEST(async_compile_runs_op_by_op_until_the_kernels_are_ready) {
    setenv("EMBER_ASYNC_COMPILE", "1", 1);
    void *ok = on_thread(async_body, NULL);
    unsetenv("EMBER_ASYNC_COMPILE");
    ck_assert_ptr_nonnull(ok);
}
END_TEST

/* ---- whole programs against float64 ---- */

#define T 6
#define D 8
#define HID 16

typedef struct model {
    em_tensor *w1, *b1, *w2, *b2, *wq, *wk, *wv, *g, *beta;
} model;

static model make_model(void) {
    model m = {
        tu_random(20, 2, TU_SIZES(D, HID), EM_F32, 0.3), tu_random(21, 1, TU_SIZES(HID), EM_F32, 0.1),
        tu_random(22, 2, TU_SIZES(HID, D), EM_F32, 0.3), tu_random(23, 1, TU_SIZES(D), EM_F32, 0.1),
        tu_random(24, 2, TU_SIZES(D, D), EM_F32, 0.3),   tu_random(25, 2, TU_SIZES(D, D), EM_F32, 0.3),
        tu_random(26, 2, TU_SIZES(D, D), EM_F32, 0.3),   tu_random(27, 1, TU_SIZES(D), EM_F32, 1),
        tu_random(28, 1, TU_SIZES(D), EM_F32, 0.1),
    };
    return m;
}

/* x + mlp(layer_norm(x + attention(x))), single head, causal mask */
static em_tensor *block(const model *m, em_tensor *x) {
    em_tensor *q = em_matmul(x, m->wq), *k = em_matmul(x, m->wk), *v = em_matmul(x, m->wv);
    em_tensor *s = em_mul_scalar(em_matmul(q, em_transpose(k, 0, 1)), 1 / sqrt(D));
    em_tensor *i = em_arange(0, T, 1, EM_F32, CPU);
    em_tensor *mask = em_gt(em_unsqueeze(i, 0), em_unsqueeze(i, 1)); /* j > i: future */
    s = em_where(mask, em_full(0, NULL, -1e9, EM_F32, CPU), s);
    em_tensor *h = em_add(x, em_matmul(em_softmax(s, -1), v));
    em_tensor *n = em_layer_norm(h, 1, m->g, m->beta, 1e-5);
    em_tensor *f = em_add(em_matmul(em_gelu(em_add(em_matmul(n, m->w1), m->b1)), m->w2), m->b2);
    return em_add(h, f);
}

static void matmul_ref(const double *a, const double *b, double *c, int n, int k, int mm) {
    for (int r = 0; r < n; r++)
        for (int j = 0; j < mm; j++) {
            double acc = 0;
            for (int t = 0; t < k; t++) acc += a[r * k + t] * b[t * mm + j];
            c[r * mm + j] = acc;
        }
}

static void block_ref(const model *m, const double *x, double *out) {
    double *wq = tu_values(m->wq), *wk = tu_values(m->wk), *wv = tu_values(m->wv);
    double *w1 = tu_values(m->w1), *b1 = tu_values(m->b1), *w2 = tu_values(m->w2);
    double *b2 = tu_values(m->b2), *g = tu_values(m->g), *be = tu_values(m->beta);
    double q[T * D], k[T * D], v[T * D], h[T * D], n[T * D], a[T * HID], f[T * D];
    matmul_ref(x, wq, q, T, D, D);
    matmul_ref(x, wk, k, T, D, D);
    matmul_ref(x, wv, v, T, D, D);
    for (int i = 0; i < T; i++) {
        double s[T], mx = -INFINITY, sum = 0;
        for (int j = 0; j < T; j++) {
            double d = 0;
            for (int c = 0; c < D; c++) d += q[i * D + c] * k[j * D + c];
            s[j] = j > i ? -1e9 : d / sqrt(D);
            mx = fmax(mx, s[j]);
        }
        for (int j = 0; j < T; j++) sum += (s[j] = exp(s[j] - mx));
        for (int c = 0; c < D; c++) {
            double acc = 0;
            for (int j = 0; j < T; j++) acc += s[j] / sum * v[j * D + c];
            h[i * D + c] = x[i * D + c] + acc;
        }
        double mean = 0, var = 0;
        for (int c = 0; c < D; c++) mean += h[i * D + c] / D;
        for (int c = 0; c < D; c++) var += (h[i * D + c] - mean) * (h[i * D + c] - mean) / D;
        for (int c = 0; c < D; c++) n[i * D + c] = (h[i * D + c] - mean) / sqrt(var + 1e-5) * g[c] + be[c];
    }
    matmul_ref(n, w1, a, T, D, HID);
    for (int i = 0; i < T * HID; i++) {
        double z = a[i] + b1[i % HID];
        a[i] = 0.5 * z * (1 + erf(z / sqrt(2)));
    }
    matmul_ref(a, w2, f, T, HID, D);
    for (int i = 0; i < T * D; i++) out[i] = h[i] + f[i] + b2[i % D];
    double *all[] = {wq, wk, wv, w1, b1, w2, b2, g, be};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

START_TEST(an_attention_block_and_mlp_in_lazy_mode_match_float64_and_eager) {
    model m = make_model();
    em_tensor *x = tu_random(30, 2, TU_SIZES(T, D), EM_F32, 1);
    double *xv = tu_values(x), ref[T * D];
    block_ref(&m, xv, ref);
    double *ev = tu_values(block(&m, x));
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    for (int rep = 0; rep < 3; rep++) { /* later reps hit the table */
        em_scope_begin();
        em_tensor *y = block(&m, x);
        ck_assert_ptr_null(y->storage);
        tu_check_close(y, ref, 2, TU_SIZES(T, D), 1e-4, 1e-4);
        double *lv = tu_values(y);
        for (int i = 0; i < T * D; i++) ck_assert_double_eq_tol(lv[i], ev[i], 1e-5 * (1 + fabs(ev[i])));
        free(lv);
        em_scope_end();
    }
    em_lazy_stats st;
    em_lazy_get_stats(&st);
    ck_assert_int_ge(st.graph_hits, 2);
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    free(xv);
    free(ev);
}
END_TEST

/* ---- graph breaks as segments ---- */

/* y = exp(x) * 2; if the sum of y (read!) exceeds 10, y - 1 else y + 1 */
static em_status reads_midway(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    em_tensor *y = em_mul_scalar(em_exp(in[0]), 2);
    double total;
    em_status st = em_item(em_sum(y, 0, NULL, false), &total);
    if (st != EM_OK) return st;
    out[0] = total > 10 ? em_sub_scalar(em_tanh(y), 1) : em_add_scalar(em_tanh(y), 1);
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(a_graph_break_splits_the_function_into_compiled_segments) {
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "reads_midway"};
    em_compiled *f = em_compile(reads_midway, NULL, &o);
    em_lazy_stats s0, s1;
    em_lazy_get_stats(&s0);
    for (int i = 0; i < 4; i++) {
        double scale = i % 2 ? 0.1 : 1.5; /* both branches */
        em_tensor *x = tu_random(40 + (uint64_t)i, 1, TU_SIZES(6), EM_F32, scale), *y;
        double *xv = tu_values(x), ref[6], total = 0;
        for (int k = 0; k < 6; k++) total += 2 * exp(xv[k]);
        for (int k = 0; k < 6; k++) ref[k] = tanh(2 * exp(xv[k])) + (total > 10 ? -1 : 1);
        ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
        ck_assert_ptr_nonnull(y->storage); /* outputs come back computed */
        tu_check_close(y, ref, 1, TU_SIZES(6), 1e-5, 1e-6);
        free(xv);
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert(st.broken);
    ck_assert_int_eq(st.eager, 1);
    ck_assert_int_eq(st.segmented, 3);
    em_lazy_get_stats(&s1);
    ck_assert_int_ge(s1.graphs_compiled - s0.graphs_compiled, 2); /* before and after the read */
    ck_assert_int_ge(s1.graph_hits - s0.graph_hits, 2);
    ck_assert(!em_lazy_active());
    em_compiled_free(f);
}
END_TEST

/* ---- the allocator travels with the object (issue 21, item 12) ---- */


typedef struct two_allocs {
    em_allocator made, reads;
    double worst;        /* largest error against float64 */
    char error[256];
} two_allocs;

/* Lazy mode's state is made under one allocator; the program then runs
 * and reads (new graphs, a dynamic entry, sizes past its memo) under
 * another; the thread's exit frees the state. */
static void *two_allocs_body(void *arg) {
    two_allocs *c = arg;
    em_set_allocator(&c->made);
    if (em_lazy_begin() != EM_OK) snprintf(c->error, sizeof c->error, "%s", em_last_error());
    em_set_allocator(&c->reads);
    for (int i = 0; i < 24 && !c->error[0]; i++) {
        em_scope_begin();
        em_tensor *x = tu_random(60 + (uint64_t)i, 2, TU_SIZES(2 + i, 7), EM_F32, 1);
        em_tensor *y = em_softmax(em_mul_scalar(x, 1.5), -1);
        double *xv = tu_values(x), *yv = tu_values(y); /* reads: computes y */
        if (!xv || !yv) snprintf(c->error, sizeof c->error, "%s", em_last_error());
        for (int r = 0; xv && yv && r < 2 + i; r++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < 7; j++) mx = fmax(mx, 1.5 * xv[r * 7 + j]);
            for (int j = 0; j < 7; j++) sum += exp(1.5 * xv[r * 7 + j] - mx);
            for (int j = 0; j < 7; j++)
                c->worst = fmax(c->worst, fabs(yv[r * 7 + j] - exp(1.5 * xv[r * 7 + j] - mx) / sum));
        }
        free(xv);
        free(yv);
        em_scope_end();
    }
    em_lazy_end();
    em_set_allocator(NULL);
    return NULL;
}

START_TEST(lazy_modes_tables_free_with_the_allocator_that_made_the_state) {
    tu_tagged ta = {0xA110CA7A, 0, 0}, tb = {0xA110CA7B, 0, 0};
    two_allocs c = {{tu_tagged_alloc, tu_tagged_free, &ta},
                    {tu_tagged_alloc, tu_tagged_free, &tb}, 0, ""};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, two_allocs_body, &c), 0);
    pthread_join(th, NULL); /* the state dies with the thread */
    ck_assert_msg(!c.error[0], "%s", c.error);
    ck_assert_msg(c.worst < 1e-5, "softmax off by %g", c.worst);
    ck_assert_msg(ta.foreign == 0 && tb.foreign == 0, "frees through the wrong allocator: %ld, %ld",
                  (long)ta.foreign, (long)tb.foreign);
    ck_assert_msg(ta.live == 0 && tb.live == 0, "blocks never freed: %ld, %ld", (long)ta.live,
                  (long)tb.live);
}
END_TEST

/* ---- several threads read one pending tensor (issue 21, item 1) ---- */

#define RACE_N 256 /* 16 x 16 */

typedef struct race {
    em_tensor *shared;   /* pending: softmax of a 60-op chain */
    double ref[RACE_N];
    atomic_int go, failures;
    char first[256];
} race;

static void *race_reader(void *arg) {
    race *r = arg;
    while (!atomic_load(&r->go)) sched_yield();
    float v[RACE_N];
    /* under EMBER_JIT=1 a fresh thread's lazy mode starts in this read */
    if (em_copy_to_host(r->shared, v, sizeof v) != EM_OK) {
        if (atomic_fetch_add(&r->failures, 1) == 0)
            snprintf(r->first, sizeof r->first, "read: %s", em_last_error());
        return NULL;
    }
    for (int i = 0; i < RACE_N; i++)
        if (fabs(v[i] - r->ref[i]) > 1e-5 * (1 + fabs(r->ref[i]))) {
            if (atomic_fetch_add(&r->failures, 1) == 0)
                snprintf(r->first, sizeof r->first, "element %d: got %.6g, want %.6g", i, v[i], r->ref[i]);
            break;
        }
    return NULL;
}

/* Rounds of a pending result read by 6 fresh threads at once. */
static void *race_rounds(void *arg) {
    race *r = arg;
    for (int it = 0; it < 100; it++) {
        em_scope_begin();
        float x[RACE_N];
        double y[RACE_N];
        for (int i = 0; i < RACE_N; i++) {
            x[i] = (float)sin(0.7 * i + it);
            y[i] = x[i];
            for (int k = 0; k < 20; k++) y[i] = tanh(y[i] * 1.1 + 0.1);
        }
        for (int row = 0; row < 16; row++) {
            double mx = -INFINITY, sum = 0, *q = &y[row * 16];
            for (int c = 0; c < 16; c++) mx = fmax(mx, q[c]);
            for (int c = 0; c < 16; c++) sum += exp(q[c] - mx);
            for (int c = 0; c < 16; c++) r->ref[row * 16 + c] = exp(q[c] - mx) / sum;
        }
        em_tensor *t = em_from_data(x, EM_F32, 2, TU_SIZES(16, 16), CPU);
        for (int k = 0; k < 20; k++) t = em_tanh(em_add_scalar(em_mul_scalar(t, 1.1), 0.1));
        r->shared = em_softmax(t, -1);
        if (!r->shared || r->shared->storage) atomic_fetch_add(&r->failures, 1); /* not pending */
        atomic_store(&r->go, 0);
        pthread_t th[6];
        for (int i = 0; i < 6; i++) pthread_create(&th[i], NULL, race_reader, r);
        atomic_store(&r->go, 1);
        for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
        em_scope_end();
    }
    return NULL;
}

/* Readers racing on one pending tensor: one computes it, the others find
 * it computed (they used to compute it too, each freeing the recipe the
 * other walked: "output 0 was not computed" or a crash), with and without
 * async compile. */
START_TEST(threads_reading_one_pending_tensor_at_once_get_its_values) {
    setenv("EMBER_JIT", "1", 1);
    for (int async = 0; async <= 1; async++) {
        if (async) setenv("EMBER_ASYNC_COMPILE", "1", 1);
        race *r = calloc(1, sizeof *r);
        pthread_t th; /* a fresh thread: its lazy state reads the settings */
        ck_assert_int_eq(pthread_create(&th, NULL, race_rounds, r), 0);
        pthread_join(th, NULL);
        ck_assert_msg(r->failures == 0, "async %d: %d failed reads; first: %s", async,
                      (int)r->failures, r->first);
        free(r);
    }
    unsetenv("EMBER_ASYNC_COMPILE");
    unsetenv("EMBER_JIT");
}
END_TEST

/* ---- a causal block over batch and length sizes ---- */

/* x [b, t, 8]: causal softmax(x x^T * 0.3) x as [b * t, 8], the mask made
 * inside from em_arange(t), as attention code does. */
static em_tensor *causal_block(em_tensor *x) {
    int64_t b = em_size(x, 0), t = em_size(x, 1);
    em_tensor *s = em_mul_scalar(em_matmul(x, em_transpose(x, 1, 2)), 0.3);
    em_tensor *pos = em_arange(0, (double)t, 1, EM_I64, em_cpu());
    em_tensor *future = em_gt(em_unsqueeze(pos, 0), em_unsqueeze(pos, 1));
    s = em_softmax(em_where(future, em_scalar(-INFINITY, EM_F32, em_cpu()), s), -1);
    return em_reshape(em_matmul(s, x), 2, TU_SIZES(b * t, 8));
}

static bool causal_matches(const em_tensor *y, const em_tensor *x) {
    int64_t b = em_size(x, 0), t = em_size(x, 1);
    double *xv = tu_values(x), *yv = tu_values(y), p[16];
    bool ok = xv && yv && t <= 16;
    for (int64_t n = 0; ok && n < b; n++)
        for (int64_t i = 0; i < t; i++) {
            const double *xi = xv + (n * t + i) * 8;
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= i; j++) {
                p[j] = 0;
                for (int c = 0; c < 8; c++) p[j] += 0.3 * xi[c] * xv[(n * t + j) * 8 + c];
                m = fmax(m, p[j]);
            }
            for (int64_t j = 0; j <= i; j++) sum += p[j] = exp(p[j] - m);
            for (int c = 0; c < 8; c++) {
                double want = 0;
                for (int64_t j = 0; j <= i; j++) want += p[j] / sum * xv[(n * t + j) * 8 + c];
                ok &= fabs(yv[(n * t + i) * 8 + c] - want) < 1e-5 * (1 + fabs(want));
            }
        }
    free(xv);
    free(yv);
    return ok;
}

typedef struct causal_run {
    bool ok;
    em_lazy_stats st;
} causal_run;

static void *causal_body(void *arg) {
    causal_run *r = arg;
    static const int64_t ts[] = {5, 6, 7, 9};
    r->ok = true;
    for (int i = 0; r->ok && i < 4; i++)
        for (int64_t b = 1; r->ok && b <= 3; b++) {
            em_scope_begin();
            em_tensor *x = tu_random(400 + (uint64_t)(10 * i + b), 3, TU_SIZES(b, ts[i], 8), EM_F32, 1);
            em_lazy_begin();
            em_tensor *y = causal_block(x);
            r->ok = y && em_realize(y) == EM_OK;
            em_lazy_end();
            r->ok = r->ok && causal_matches(y, x);
            em_scope_end();
        }
    em_lazy_get_stats(&r->st);
    return NULL;
}

START_TEST(a_causal_block_over_batch_and_length_compiles_few_graphs) {
    /* before: the reshape's sizes and the arange's count made each (b, t)
     * a structure of its own, 12 graphs compiled; now they are size
     * variants of one structure, served by its dynamic entries */
    causal_run r = {0};
    on_thread(causal_body, &r);
    ck_assert_msg(r.ok, "a lazy causal block differs from float64");
    ck_assert_int_eq(r.st.flushes, 12);
    ck_assert_int_eq(r.st.eager_graphs, 0);
    ck_assert_int_ge(r.st.dynamic_graphs, 1);
    ck_assert_int_le(r.st.graphs_compiled, 5);
}
END_TEST

/* A count of b * t (an arange over every element of x [b, t]) summed
 * with x's, lazily, over sizes where two traces that move one symbol
 * would fit the count to that symbol alone. */
typedef struct count_run {
    bool ok;
    em_lazy_stats st;
} count_run;

static void *count_body(void *arg) {
    count_run *r = arg;
    static const int64_t bt[][2] = {{2, 5}, {3, 5}, {3, 7}, {4, 6}, {5, 9}};
    r->ok = true;
    for (int i = 0; r->ok && i < 5; i++) {
        int64_t b = bt[i][0], t = bt[i][1];
        em_scope_begin();
        em_tensor *x = tu_random(500 + (uint64_t)i, 2, TU_SIZES(b, t), EM_F32, 1);
        em_lazy_begin();
        em_tensor *pos = em_arange(0, (double)em_numel(x), 1, EM_F32, em_cpu());
        em_tensor *y = em_add(em_sum(pos, 0, NULL, false), em_sum(x, 0, NULL, false));
        r->ok = y && em_realize(y) == EM_OK;
        em_lazy_end();
        double *xv = r->ok ? tu_values(x) : NULL, want = (double)(b * t) * (double)(b * t - 1) / 2;
        for (int64_t k = 0; xv && k < b * t; k++) want += xv[k];
        double *got = r->ok ? tu_values(y) : NULL;
        r->ok = got && fabs(got[0] - want) <= 1e-4 * fabs(want);
        free(xv);
        free(got);
        em_scope_end();
    }
    em_lazy_get_stats(&r->st);
    return NULL;
}

START_TEST(a_lazy_size_of_two_symbols_is_never_fitted_to_one) {
    count_run r = {0};
    on_thread(count_body, &r);
    ck_assert_msg(r.ok, "a lazy arange over b * t gave another sum than float64");
    ck_assert_int_eq(r.st.eager_graphs, 0);
}
END_TEST

/* ---- one entry machinery: em_compile and lazy mode count alike ---- */

/* A sequence of row counts of x [rows, 8] through y = softmax(x) * w, and
 * what it gave: entries compiled, dynamic ones among them, and sizes run
 * op by op past the recompile limit. */
typedef struct shape_run {
    const int64_t *rows;
    int n;
    em_tensor *w;
    int64_t compiled, dynamic, eager;
    bool ok;             /* every value matched float64 */
} shape_run;

#define SH_COLS 8

static em_status softmax_w(void *ctx, em_tensor *const *in, const double *scalars,
                           em_tensor **out) {
    (void)scalars;
    out[0] = em_mul(em_softmax(in[0], -1), ctx);
    return out[0] ? EM_OK : em_last_status();
}

/* Whether y (rows x SH_COLS floats) is softmax(x) * w to float rounding,
 * from x's and w's values in float64. */
static bool softmax_w_matches(const em_tensor *y, const em_tensor *x, const em_tensor *w) {
    double *yv = tu_values(y), *xv = tu_values(x), *wv = tu_values(w);
    bool ok = yv && xv && wv;
    for (int64_t r = 0; ok && r < x->sizes[0]; r++) {
        const double *xr = xv + r * SH_COLS;
        double m = -INFINITY, sum = 0;
        for (int c = 0; c < SH_COLS; c++) m = fmax(m, xr[c]);
        for (int c = 0; c < SH_COLS; c++) sum += exp(xr[c] - m);
        for (int c = 0; c < SH_COLS; c++)
            ok &= fabs(yv[r * SH_COLS + c] - exp(xr[c] - m) / sum * wv[c]) < 1e-6 * (1 + fabs(wv[c]));
    }
    free(yv);
    free(xv);
    free(wv);
    return ok;
}

static em_tensor *shape_input(const shape_run *r, int i) {
    return tu_random(300 + (uint64_t)i, 2, TU_SIZES(r->rows[i], SH_COLS), EM_F32, 1);
}

/* The sequence through em_compile (its limit and dynamic mode from the
 * environment, as lazy mode's). */
static void run_compiled(shape_run *r) {
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "softmax_w"};
    em_compiled *f = em_compile(softmax_w, r->w, &o);
    r->ok = f != NULL;
    for (int i = 0; r->ok && i < r->n; i++) {
        em_scope_begin();
        em_tensor *x = shape_input(r, i), *y = NULL;
        r->ok = em_call(f, &x, NULL, &y) == EM_OK && softmax_w_matches(y, x, r->w);
        em_release(y);
        em_scope_end();
    }
    em_compile_stats st = {0};
    em_compiled_stats(f, &st);
    r->compiled = st.traces, r->dynamic = st.dynamic_entries, r->eager = st.eager;
    em_compiled_free(f);
}

/* The sequence in lazy mode, on a fresh thread (its state reads the
 * environment). */
static void *lazy_shapes_body(void *arg) {
    shape_run *r = arg;
    r->ok = true;
    for (int i = 0; r->ok && i < r->n; i++) {
        em_scope_begin();
        em_tensor *x = shape_input(r, i); /* made before lazy mode: it is an input */
        em_lazy_begin();
        em_tensor *y = em_mul(em_softmax(x, -1), r->w);
        r->ok = y && !y->storage && em_realize(y) == EM_OK;
        em_lazy_end();
        r->ok = r->ok && softmax_w_matches(y, x, r->w);
        em_scope_end();
    }
    em_lazy_stats st;
    em_lazy_get_stats(&st);
    r->compiled = st.graphs_compiled, r->dynamic = st.dynamic_graphs, r->eager = st.eager_graphs;
    return NULL;
}

/* Runs rows through both and checks both gave the expected counts. */
static void check_shapes_alike(const int64_t *rows, int n, int64_t compiled, int64_t dynamic,
                               int64_t eager) {
    em_tensor *w = tu_random(299, 1, TU_SIZES(SH_COLS), EM_F32, 1);
    shape_run c = {rows, n, w, 0, 0, 0, false}, l = c;
    run_compiled(&c);
    on_thread(lazy_shapes_body, &l);
    em_release(w);
    ck_assert_msg(c.ok && l.ok, "values: em_compile %d, lazy mode %d", c.ok, l.ok);
    ck_assert_msg(c.compiled == compiled && c.dynamic == dynamic && c.eager == eager,
                  "em_compile: %lld compiled, %lld dynamic, %lld eager", (long long)c.compiled,
                  (long long)c.dynamic, (long long)c.eager);
    ck_assert_msg(l.compiled == compiled && l.dynamic == dynamic && l.eager == eager,
                  "lazy mode: %lld compiled, %lld dynamic, %lld eager", (long long)l.compiled,
                  (long long)l.dynamic, (long long)l.eager);
}

/* Both run on entry.c: a static entry for the first size, a dynamic one
 * at the second (promotion), which serves every later size >= 2, and 1
 * as well once the graph at 1 is shown to be its graph there (em_compile:
 * a dry trace when it becomes dynamic; lazy mode: the graph recorded at
 * 1, jit_entry_take_one). */
START_TEST(dynamic_promotion_counts_the_same_in_em_compile_and_lazy_mode) {
    static const int64_t rows[] = {2, 3, 5, 1, 7, 4, 1};
    check_shapes_alike(rows, 7, 2, 1, 0);
}
END_TEST

/* The one recompile limit: with EMBER_RECOMPILE_LIMIT=2 and no dynamic
 * shapes, two sizes compile and the next new ones run eagerly (each new
 * size once here: em_compile counts eager calls, lazy mode eager graphs). */
START_TEST(the_recompile_limit_counts_the_same_in_em_compile_and_lazy_mode) {
    static const int64_t rows[] = {2, 3, 5, 3, 1, 2};
    setenv("EMBER_RECOMPILE_LIMIT", "2", 1);
    setenv("EMBER_DYNAMIC", "0", 1);
    check_shapes_alike(rows, 6, 2, 0, 2);
    unsetenv("EMBER_RECOMPILE_LIMIT");
    unsetenv("EMBER_DYNAMIC");
}
END_TEST

int main(void) {
    const tu_test tests[] = {
        {"every_op_lazy_equals_eager", every_op_lazy_equals_eager},
        {"a_causal_block_over_batch_and_length_compiles_few_graphs",
         a_causal_block_over_batch_and_length_compiles_few_graphs},
        {"a_lazy_size_of_two_symbols_is_never_fitted_to_one", a_lazy_size_of_two_symbols_is_never_fitted_to_one},
        {"values_are_computed_when_read_and_not_before", values_are_computed_when_read_and_not_before},
        {"a_tensor_never_read_stays_computable_and_keeps_its_inputs", a_tensor_never_read_stays_computable_and_keeps_its_inputs},
        {"a_long_chain_is_cut_and_computed_on_the_way", a_long_chain_is_cut_and_computed_on_the_way},
        {"errors_are_reported_at_the_op", errors_are_reported_at_the_op},
        {"the_recompile_limit_applies_per_structure", the_recompile_limit_applies_per_structure},
        {"many_structures_and_sizes_grow_the_tables_and_are_found_again", many_structures_and_sizes_grow_the_tables_and_are_found_again},
        {"a_whole_program_graph_frees_its_intermediates_as_it_runs", a_whole_program_graph_frees_its_intermediates_as_it_runs},
        {"ten_batch_sizes_compile_twice_in_lazy_mode", ten_batch_sizes_compile_twice_in_lazy_mode},
        {"async_compile_runs_op_by_op_until_the_kernels_are_ready", async_compile_runs_op_by_op_until_the_kernels_are_ready},
        {"ember_jit_starts_lazy_mode_on_every_thread_and_reads_cross_threads", ember_jit_starts_lazy_mode_on_every_thread_and_reads_cross_threads},
        {"pending_tensors_outlive_their_thread_and_die_on_any_thread", pending_tensors_outlive_their_thread_and_die_on_any_thread},
        {"an_attention_block_and_mlp_in_lazy_mode_match_float64_and_eager", an_attention_block_and_mlp_in_lazy_mode_match_float64_and_eager},
        {"a_graph_break_splits_the_function_into_compiled_segments", a_graph_break_splits_the_function_into_compiled_segments},
        {"lazy_modes_tables_free_with_the_allocator_that_made_the_state", lazy_modes_tables_free_with_the_allocator_that_made_the_state},
        {"threads_reading_one_pending_tensor_at_once_get_its_values", threads_reading_one_pending_tensor_at_once_get_its_values},
        {"dynamic_promotion_counts_the_same_in_em_compile_and_lazy_mode", dynamic_promotion_counts_the_same_in_em_compile_and_lazy_mode},
        {"the_recompile_limit_counts_the_same_in_em_compile_and_lazy_mode", the_recompile_limit_counts_the_same_in_em_compile_and_lazy_mode},
    };
    return tu_run(tu_suite("lazy", tests, sizeof tests / sizeof tests[0], 600));
}
