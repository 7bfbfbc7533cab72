/* test_core.c - tensors, scopes, errors, allocation, views, host I/O. */
#include "config.h" /* EMBER_HAVE_CUDA */
#include "testutil.h"
#include "eager.h" /* em_parallel_for, the device registry */

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const em_device CPU = {EM_CPU, 0};

/* ---- errors ---- */

START_TEST(error_chain_keeps_first_error) {
    em_tensor *a = em_ones(2, TU_SIZES(2, 3), EM_F32, CPU);
    em_tensor *b = em_ones(1, TU_SIZES(4), EM_F32, CPU);
    em_tensor *r = em_exp(em_add(em_mul(a, b), a)); /* mul fails: [2,3] vs [4] */
    ck_assert_ptr_null(r);
    ck_assert_int_eq(em_last_status(), EM_ERR_SHAPE);
    ck_assert_msg(strstr(em_last_error(), "mul") && strstr(em_last_error(), "[2, 3]") &&
                      strstr(em_last_error(), "[4]"),
                  "message: %s", em_last_error());
    em_clear_error();
    ck_assert_int_eq(em_last_status(), EM_OK);
    ck_assert_str_eq(em_last_error(), "");
}
END_TEST

START_TEST(error_null_names_argument) {
    tu_check_fails(em_add(NULL, NULL), EM_ERR_NULL);
    ck_assert_msg(strstr(em_last_error(), "em_add"), "%s", em_last_error());
    tu_check_fails(em_exp(NULL), EM_ERR_NULL);
    tu_check_fails(em_reshape(NULL, 1, TU_SIZES(1)), EM_ERR_NULL);
    tu_check_fails(em_cat(1, NULL, 0), EM_ERR_NULL);
    ck_assert_int_eq(em_copy_to_host(NULL, NULL, 0), EM_ERR_NULL);
    double v;
    ck_assert_int_eq(em_item(NULL, &v), EM_ERR_NULL);
    ck_assert_int_eq(em_print(NULL, stdout), EM_ERR_NULL);
    ck_assert_int_eq(em_ndim(NULL), -1);
    ck_assert_int_eq(em_numel(NULL), -1);
    em_release(NULL);
    ck_assert_ptr_null(em_keep(NULL));
}
END_TEST

/* Context added to an error keeps the old message whole (issue 21, item
 * 13: copy_out formatted em_last_error() into the buffer it read from,
 * giving "em_copy_to_host: em_copy_to_host: ex 5 is out of range..."). */
START_TEST(error_context_prepends_safely) {
    em_error(EM_ERR_INDEX, "index %d is out of range for dim %d of size %d", 5, 1, 3);
    ck_assert_int_eq(em_error_context("em_copy_to_host"), EM_ERR_INDEX);
    ck_assert_str_eq(em_last_error(), "em_copy_to_host: index 5 is out of range for dim 1 of size 3");
    ck_assert_int_eq(em_error_context("outer %d", 2), EM_ERR_INDEX);
    ck_assert_str_eq(em_last_error(),
                     "outer 2: em_copy_to_host: index 5 is out of range for dim 1 of size 3");
    /* em_error itself may be given the pending message */
    ck_assert_int_eq(em_error(EM_ERR_IO, "again: %s", em_last_error()), EM_ERR_IO);
    ck_assert_str_eq(em_last_error(),
                     "again: outer 2: em_copy_to_host: index 5 is out of range for dim 1 of size 3");
    /* a message that fills the buffer is cut, never overrun */
    char big[2048];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    em_error(EM_ERR_ARG, "%s", big);
    ck_assert_int_eq(em_error_context("ctx"), EM_ERR_ARG);
    ck_assert(strncmp(em_last_error(), "ctx: xxx", 8) == 0);
    /* no pending error: the caller still failed, and says so */
    em_clear_error();
    ck_assert_int_eq(em_error_context("step"), EM_ERR_STATE);
    ck_assert(strncmp(em_last_error(), "step: ", 6) == 0);
    em_clear_error();
}
END_TEST

/* The same through the library: a lazy index_select with a bad index fails
 * when its value is read (em_copy_to_host) or used by an eager op. */
START_TEST(error_context_of_deferred_failures) {
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    em_tensor *x = em_ones(2, TU_SIZES(2, 3), EM_F32, CPU);
    int64_t bad = 5;
    em_tensor *idx = em_from_data(&bad, EM_I64, 1, TU_SIZES(1), CPU);
    em_tensor *y = em_index_select(x, 1, idx);
    ck_assert_ptr_nonnull(y);
    float buf[2];
    em_clear_error();
    ck_assert_int_eq(em_copy_to_host(y, buf, sizeof buf), EM_ERR_INDEX);
    const char *m = em_last_error();
    ck_assert_msg(strncmp(m, "em_copy_to_host: ", 17) == 0 && !strstr(m + 1, "em_copy_to_host") &&
                      strstr(m, "index 5 is out of range for dim 1 of size 3"),
                  "message: %s", m);
    em_tensor *z = em_index_select(x, 1, idx);
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    em_clear_error();
    ck_assert_ptr_null(em_exp(z));
    m = em_last_error();
    ck_assert_msg(strstr(m, "exp: input 0: ") == m && strstr(m, "index 5 is out of range"),
                  "message: %s", m);
    em_clear_error();
}
END_TEST

/* Shapes whose strides overflow int64 are refused even when they hold no
 * element (issue 21, item 17: UBSan found signed overflow computing the
 * strides of such a tensor); size sums of cat are checked too.  Under
 * make check-asan the old code fails here with a UBSan report. */
START_TEST(shape_overflow_is_an_error) {
    const int64_t huge[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
    ck_assert_int_eq(em_shape_numel(3, huge), -1);
    int64_t st[3];
    em_contiguous_strides(3, huge, st); /* saturates: no UB for an unchecked shape */
    ck_assert(st[2] == 1 && st[1] == (int64_t)1 << 40 && st[0] == INT64_MAX);
    tu_check_fails(em_empty(3, huge, EM_F32, CPU), EM_ERR_OVERFLOW);
    tu_check_fails(em_zeros(3, huge, EM_I64, CPU), EM_ERR_OVERFLOW);
    em_tensor *e = em_empty(2, TU_SIZES(0, 4), EM_F32, CPU);
    tu_check_fails(em_reshape(e, 3, huge), EM_ERR_SHAPE);
    const int64_t big[2] = {(int64_t)1 << 62, 0}; /* empty, strides fit */
    em_tensor *b = em_empty(2, big, EM_F32, CPU);
    ck_assert_ptr_nonnull(b);
    tu_check_fails(em_cat(3, (em_tensor *[]){b, b, b}, 0), EM_ERR_OVERFLOW);
    /* the largest valid empty shape still works */
    const int64_t ok[3] = {0, (int64_t)1 << 31, (int64_t)1 << 31};
    ck_assert_ptr_nonnull(em_empty(3, ok, EM_F32, CPU));
}
END_TEST

/* An em_compile without watched slots (watch NULL, nwatch 0) and a graph
 * without steps or constants: UBSan reported NULL passed to memcpy and
 * memcmp with a count of 0 (compile.c, backend_cpu.c, dynamic.c). */
static em_status twice_fn(void *ctx, em_tensor *const *in, const double *sc, em_tensor **out) {
    (void)ctx, (void)sc;
    out[0] = em_add(in[0], in[0]);
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(compile_with_empty_arrays) {
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .backend = "cpu"};
    em_compiled *f = em_compile(twice_fn, NULL, &o);
    ck_assert_ptr_nonnull(f);
    for (int64_t n = 2; n <= 4; n++) { /* a second size makes a dynamic entry */
        em_tensor *in[1] = {em_ones(1, &n, EM_F32, CPU)}, *out[1];
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "%s", em_last_error());
        double v;
        ck_assert_int_eq(em_item(em_slice(out[0], 0, 0, 1, 1), &v), EM_OK);
        ck_assert(v == 2.0);
    }
    em_compiled_free(f);
}
END_TEST

START_TEST(status_names) {
    ck_assert_str_eq(em_status_name(EM_OK), "EM_OK");
    ck_assert_str_eq(em_status_name(EM_ERR_INDEX), "EM_ERR_INDEX");
    ck_assert_str_eq(em_status_name((em_status)-99), "EM_ERR_UNKNOWN");
}
END_TEST

START_TEST(creation_errors) {
    tu_check_fails(em_zeros(-1, TU_SIZES(1), EM_F32, CPU), EM_ERR_DIM);
    tu_check_fails(em_zeros(9, TU_SIZES(1, 1, 1, 1, 1, 1, 1, 1, 1), EM_F32, CPU), EM_ERR_DIM);
    tu_check_fails(em_zeros(2, TU_SIZES(2, -3), EM_F32, CPU), EM_ERR_ARG);
    tu_check_fails(em_zeros(2, NULL, EM_F32, CPU), EM_ERR_NULL);
    tu_check_fails(em_zeros(1, TU_SIZES(2), (em_dtype)42, CPU), EM_ERR_DTYPE);
    tu_check_fails(em_zeros(3, TU_SIZES(1 << 30, 1 << 30, 1 << 30), EM_F32, CPU),
                   EM_ERR_OVERFLOW);
    tu_check_fails(em_zeros(1, TU_SIZES(INT64_MAX / 2), EM_F64, CPU), EM_ERR_OVERFLOW);
    if (!em_device_available(em_cuda(0))) /* a build and machine without CUDA */
        tu_check_fails(em_zeros(1, TU_SIZES(2), EM_F32, em_cuda(0)), EM_ERR_DEVICE);
    tu_check_fails(em_zeros(1, TU_SIZES(2), EM_F32, em_cuda(1000)), EM_ERR_DEVICE);
    tu_check_fails(em_zeros(1, TU_SIZES(2), EM_F32, ((em_device){(em_device_type)7, 0})),
                   EM_ERR_DEVICE);
    ck_assert(!em_device_available(em_cuda(1000)));
    ck_assert(em_device_available(em_cpu()));
}
END_TEST

/* ---- metadata ---- */

START_TEST(metadata) {
    em_tensor *t = em_zeros(3, TU_SIZES(2, 3, 4), EM_F64, CPU);
    ck_assert_int_eq(em_ndim(t), 3);
    ck_assert_int_eq(em_size(t, 0), 2);
    ck_assert_int_eq(em_size(t, -1), 4);
    ck_assert_int_eq(em_size(t, 3), -1);
    ck_assert_int_eq(em_stride(t, 0), 12);
    ck_assert_int_eq(em_stride(t, -1), 1);
    ck_assert_int_eq(em_numel(t), 24);
    ck_assert_int_eq(em_dtype_of(t), EM_F64);
    ck_assert_int_eq(em_device_of(t).type, EM_CPU);
    ck_assert(em_is_contiguous(t));
    ck_assert_int_eq(em_offset(t), 0);
    em_tensor *s = em_scalar(3.5, EM_F32, CPU);
    ck_assert_int_eq(em_ndim(s), 0);
    ck_assert_int_eq(em_numel(s), 1);
    em_tensor *z = em_zeros(2, TU_SIZES(3, 0), EM_F32, CPU);
    ck_assert_int_eq(em_numel(z), 0);
    ck_assert(em_is_contiguous(z));
}
END_TEST

START_TEST(dtypes_and_promotion) {
    ck_assert_int_eq(em_dtype_size(EM_F32), 4);
    ck_assert_int_eq(em_dtype_size(EM_F64), 8);
    ck_assert_int_eq(em_dtype_size(EM_I32), 4);
    ck_assert_int_eq(em_dtype_size(EM_I64), 8);
    ck_assert_int_eq(em_dtype_size(EM_BOOL), 1);
    ck_assert_int_eq(em_dtype_size(EM_F16), 2);
    ck_assert_int_eq(em_dtype_size(EM_BF16), 2);
    ck_assert_int_eq(em_dtype_size((em_dtype)99), 0);
    ck_assert_str_eq(em_dtype_name(EM_BF16), "bf16");
    ck_assert_int_eq(em_promote_types(EM_I32, EM_F32), EM_F32);
    ck_assert_int_eq(em_promote_types(EM_I32, EM_I64), EM_I64);
    ck_assert_int_eq(em_promote_types(EM_BOOL, EM_I32), EM_I32);
    ck_assert_int_eq(em_promote_types(EM_F32, EM_F64), EM_F64);
    ck_assert_int_eq(em_promote_types(EM_F16, EM_BF16), EM_F32);
    ck_assert_int_eq(em_promote_types(EM_I64, EM_F16), EM_F16);
    ck_assert(em_dtype_is_float(EM_BF16));
    ck_assert(!em_dtype_is_float(EM_I64));
}
END_TEST

/* ---- host I/O ---- */

START_TEST(from_data_round_trip) {
    const int32_t v[6] = {1, -2, 3, -4, 5, -6};
    em_tensor *t = em_from_data(v, EM_I32, 2, TU_SIZES(2, 3), CPU);
    int32_t out[6] = {0};
    ck_assert_int_eq(em_copy_to_host(t, out, sizeof out), EM_OK);
    ck_assert_mem_eq(out, v, sizeof v);
    ck_assert_int_eq(em_copy_to_host(t, out, sizeof out - 1), EM_ERR_ARG);
    tu_check_fails(em_from_data(NULL, EM_I32, 1, TU_SIZES(2), CPU), EM_ERR_NULL);
    /* a transposed view copies out in row-major order of the view */
    em_tensor *tt = em_transpose(t, 0, 1);
    ck_assert_int_eq(em_copy_to_host(tt, out, sizeof out), EM_OK);
    const int32_t want[6] = {1, -4, -2, 5, 3, -6};
    ck_assert_mem_eq(out, want, sizeof want);
}
END_TEST

START_TEST(item_values) {
    double v;
    int64_t i;
    ck_assert_int_eq(em_item(em_scalar(-2.5, EM_F64, CPU), &v), EM_OK);
    ck_assert(v == -2.5);
    ck_assert_int_eq(em_item_i64(em_scalar(7, EM_I64, CPU), &i), EM_OK);
    ck_assert_int_eq(i, 7);
    ck_assert_int_eq(em_item(em_full(3, TU_SIZES(1, 1, 1), 4, EM_I32, CPU), &v), EM_OK);
    ck_assert(v == 4);
    ck_assert_int_eq(em_item(em_zeros(1, TU_SIZES(2), EM_F32, CPU), &v), EM_ERR_SHAPE);
    ck_assert_int_eq(em_item(em_scalar(1, EM_F32, CPU), NULL), EM_ERR_NULL);
    ck_assert_int_eq(em_item_i64(em_zeros(1, TU_SIZES(0), EM_F32, CPU), &i), EM_ERR_SHAPE);
}
END_TEST

START_TEST(print_format) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    const double v[4] = {1, 2.5, NAN, -INFINITY};
    ck_assert_int_eq(em_print(tu_tensor(v, 2, TU_SIZES(2, 2), EM_F32), f), EM_OK);
    ck_assert_int_eq(em_print(em_arange(0, 10, 1, EM_I64, CPU), f), EM_OK);
    ck_assert_int_eq(em_print(em_zeros(1, TU_SIZES(0), EM_BOOL, CPU), f), EM_OK);
    fclose(f);
    ck_assert_msg(strstr(buf, "[[1, 2.5],\n"), "%s", buf);
    ck_assert_msg(strstr(buf, "[nan, -inf]]"), "%s", buf);
    ck_assert_msg(strstr(buf, "[0, 1, 2, ..., 7, 8, 9], sizes=[10], dtype=i64"), "%s", buf);
    ck_assert_msg(strstr(buf, "tensor([], sizes=[0], dtype=bool, device=cpu)"), "%s", buf);
    free(buf);
}
END_TEST

/* ---- scopes and lifetime ---- */

START_TEST(scope_keep_moves_out) {
    em_tensor *kept = NULL;
    int depth = em_scope_begin(); /* inside the fixture's scope */
    ck_assert_int_eq(depth, 2);
    em_tensor *a = em_full(1, TU_SIZES(3), 2, EM_F32, CPU);
    em_tensor *b = em_add(em_mul(a, a), a); /* the intermediate is the scope's */
    kept = em_keep(b);
    ck_assert_ptr_eq(kept, b);
    ck_assert_int_eq(em_scope_end(), EM_OK);
    /* b survived its scope: 2*2+2 = 6 */
    double ref[3] = {6, 6, 6};
    tu_check_close(kept, ref, 1, TU_SIZES(3), 0, 0);
}
END_TEST

START_TEST(scope_keep_without_outer_scope) {
    /* the fixture's scope is closed here on purpose: outside every scope
     * the caller owns what em_keep hands out */
    ck_assert_int_eq(em_scope_end(), EM_OK);
    em_scope_begin();
    em_tensor *t = em_keep(em_ones(1, TU_SIZES(2), EM_F32, CPU));
    em_scope_end();
    float v[2];
    ck_assert_int_eq(em_copy_to_host(t, v, sizeof v), EM_OK);
    ck_assert(v[0] == 1 && v[1] == 1);
    em_release(t);
    /* no scope: ops give the caller a reference */
    em_tensor *u = em_ones(1, TU_SIZES(2), EM_F32, CPU);
    em_tensor *w = em_add(u, u);
    em_release(w);
    em_release(u);
    ck_assert_int_eq(em_scope_end(), EM_ERR_STATE);
    em_scope_begin(); /* for the fixture's teardown */
}
END_TEST

START_TEST(scope_keep_of_input_adds_reference) {
    em_tensor *x = em_ones(1, TU_SIZES(2), EM_F32, CPU); /* owned by the fixture's scope */
    em_scope_begin();
    em_scope_begin();
    em_tensor *k = em_keep(x); /* not the inner scope's: the middle one gets a reference */
    ck_assert_ptr_eq(k, x);
    em_scope_end();
    em_scope_end();
    float v[2];
    ck_assert_int_eq(em_copy_to_host(x, v, sizeof v), EM_OK);
    ck_assert(v[0] == 1);
}
END_TEST

START_TEST(release_of_scope_tensor_is_refused) {
    em_tensor *x = em_ones(1, TU_SIZES(2), EM_F32, CPU);
    em_clear_error();
    em_release(x); /* the scope owns the only reference */
    ck_assert_int_eq(em_last_status(), EM_ERR_STATE);
    double v[2];
    ck_assert_int_eq(em_copy_to_host(x, v, sizeof v), EM_OK); /* still alive */
    em_retain(x);
    em_release(x); /* a reference of our own: fine */
    ck_assert_int_eq(em_copy_to_host(x, v, sizeof v), EM_OK);
}
END_TEST

START_TEST(views_outlive_base_reference) {
    ck_assert_int_eq(em_scope_end(), EM_OK); /* manage by hand */
    em_tensor *base = em_arange(0, 6, 1, EM_F32, CPU);
    em_tensor *view = em_slice(base, 0, 1, 6, 2);
    em_release(base); /* storage lives on in the view */
    double ref[3] = {1, 3, 5};
    em_scope_begin();
    tu_check_close(view, ref, 1, TU_SIZES(3), 0, 0);
    em_scope_end();
    em_release(view);
    em_scope_begin();
}
END_TEST

/* ---- allocation hook: fail the Nth allocation ---- */

typedef struct counting {
    int allocs, frees, fail_at;
} counting;

static void *count_alloc(void *ud, size_t size, size_t align) {
    counting *c = ud;
    if (++c->allocs == c->fail_at) return NULL;
    void *p = NULL;
    return posix_memalign(&p, align, size ? size : 1) ? NULL : p;
}

static void count_free(void *ud, void *p) {
    ((counting *)ud)->frees++;
    free(p);
}

/* The default allocator keeps freed blocks of 64 KiB and more (a thread's
 * cache, size classes of 64 KiB) and hands them out again, so that a
 * compiled graph's intermediates cost no page faults from the second call
 * on; more sizes than it keeps still allocate, and every block is usable. */
START_TEST(freed_big_blocks_are_handed_out_again) {
    static const size_t sizes[][2] = {{64 << 10, 64 << 10},   {100 << 10, 120 << 10},
                                      {128 << 10, 128 << 10}, {512 << 10, 500 << 10},
                                      {3 << 20, 3 << 20}};
    enum { HOLD = 40 }; /* more than the cache keeps: none of the class is left in it */
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *hold[HOLD];
        for (int h = 0; h < HOLD; h++) {
            hold[h] = em_malloc(sizes[i][0]);
            ck_assert_ptr_nonnull(hold[h]);
            ck_assert_uint_eq((uintptr_t)hold[h] % 64, 0);
            hold[h][0] = 1, hold[h][sizes[i][0] - 1] = 2;
        }
        em_free(hold[0]);
        unsigned char *q = em_malloc(sizes[i][1]); /* the same 64 KiB class */
        ck_assert_ptr_eq(q, hold[0]);              /* the kept block */
        q[sizes[i][1] - 1] = 3;
        em_free(q);
        for (int h = 1; h < HOLD; h++) em_free(hold[h]);
    }
    /* 80 sizes at once, more than the cache keeps: all usable, all freed */
    enum { N = 80 };
    unsigned char *blk[N];
    for (int i = 0; i < N; i++) {
        size_t n = ((size_t)(i + 1) << 16) + 17;
        blk[i] = em_malloc(n);
        ck_assert_ptr_nonnull(blk[i]);
        blk[i][0] = (unsigned char)i, blk[i][n - 1] = (unsigned char)(i + 1);
    }
    for (int i = 0; i < N; i++) {
        size_t n = ((size_t)(i + 1) << 16) + 17;
        ck_assert_uint_eq(blk[i][0], (unsigned char)i);
        ck_assert_uint_eq(blk[i][n - 1], (unsigned char)(i + 1));
        em_free(blk[i]);
    }
}
END_TEST

/* A chain of ops, each allocation failing in turn: every failure must come
 * back as EM_ERR_NOMEM (or the NULL it causes), and nothing may leak. */
START_TEST(failing_allocations_are_reported_and_leak_nothing) {
    int completed = 0;
    for (int n = 1; n < 200 && !completed; n++) {
        counting c = {0, 0, n};
        em_allocator a = {count_alloc, count_free, &c};
        em_set_allocator(&a);
        em_clear_error();
        em_scope_begin();
        em_tensor *x = em_arange(0, 64, 1, EM_F32, CPU);
        em_tensor *y = em_softmax(em_reshape(em_add_scalar(x, 1), 2, TU_SIZES(8, 8)), -1);
        em_tensor *z = em_sum(em_transpose(y, 0, 1), 1, (int[]){0}, false);
        float v[8];
        if (z && em_copy_to_host(z, v, sizeof v) == EM_OK) {
            for (int i = 0; i < 8; i++) ck_assert(fabs(v[i] - 1) < 1e-5);
            completed = c.fail_at > c.allocs; /* no failure was injected */
        } else {
            ck_assert_msg(em_last_status() == EM_ERR_NOMEM, "fail at %d: %s", n, em_last_error());
        }
        em_scope_end();
        em_set_allocator(NULL);
        ck_assert_msg(c.allocs - (c.allocs >= n) == c.frees,
                      "fail at %d: %d allocations, %d frees", n, c.allocs, c.frees);
    }
    ck_assert(completed);
}
END_TEST

/* ---- views ---- */

static em_tensor *iota(int ndim, const int64_t *sizes) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= sizes[i];
    return em_reshape(em_arange(0, (double)n, 1, EM_F64, CPU), ndim, sizes);
}

START_TEST(reshape_views_when_possible) {
    em_tensor *x = iota(2, TU_SIZES(4, 6));
    em_tensor *r = em_reshape(x, 3, TU_SIZES(2, -1, 3));
    ck_assert(em_shares_storage(r, x));
    ck_assert_int_eq(em_size(r, 1), 4);
    double ref[24];
    for (int i = 0; i < 24; i++) ref[i] = i;
    tu_check_close(r, ref, 3, TU_SIZES(2, 4, 3), 0, 0);
    /* a transposed tensor cannot be flattened as a view: reshape copies */
    em_tensor *t = em_transpose(x, 0, 1);
    em_tensor *f = em_reshape(t, 1, TU_SIZES(-1));
    ck_assert(!em_shares_storage(f, x));
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) ref[i * 4 + j] = j * 6 + i;
    tu_check_close(f, ref, 1, TU_SIZES(24), 0, 0);
    /* but splitting a dim of the transposed tensor is a view */
    em_tensor *s = em_reshape(t, 3, TU_SIZES(2, 3, 4));
    ck_assert(em_shares_storage(s, x));
    tu_check_close(s, ref, 3, TU_SIZES(2, 3, 4), 0, 0);
    /* 0-d and size-0 */
    em_tensor *sc = em_reshape(em_scalar(5, EM_F32, CPU), 2, TU_SIZES(1, 1));
    double five = 5;
    tu_check_close(sc, &five, 2, TU_SIZES(1, 1), 0, 0);
    em_tensor *e = em_reshape(em_zeros(2, TU_SIZES(0, 4), EM_F32, CPU), 3, TU_SIZES(2, 0, -1));
    ck_assert_ptr_null(e); /* -1 with 0 known elements is ambiguous */
    ck_assert_int_eq(em_last_status(), EM_ERR_SHAPE);
    e = em_reshape(em_zeros(2, TU_SIZES(0, 4), EM_F32, CPU), 2, TU_SIZES(4, 0));
    ck_assert_int_eq(em_numel(e), 0);
    tu_check_fails(em_reshape(x, 2, TU_SIZES(5, 5)), EM_ERR_SHAPE);
    tu_check_fails(em_reshape(x, 2, TU_SIZES(-1, -1)), EM_ERR_ARG);
    tu_check_fails(em_reshape(x, 2, TU_SIZES(-1, 7)), EM_ERR_SHAPE);
    tu_check_fails(em_reshape(x, 9, TU_SIZES(1, 1, 1, 1, 1, 1, 1, 1, 24)), EM_ERR_DIM);
}
END_TEST

START_TEST(permute_and_transpose) {
    em_tensor *x = iota(3, TU_SIZES(2, 3, 4));
    em_tensor *p = em_permute(x, 3, (int[]){2, 0, -2});
    ck_assert(em_shares_storage(p, x));
    ck_assert(!em_is_contiguous(p));
    double ref[24];
    int64_t idx[3] = {0};
    int k = 0;
    do {
        ref[k++] = idx[1] * 12 + idx[2] * 4 + idx[0]; /* p[i,j,l] = x[j,l,i] */
    } while (tu_next(3, TU_SIZES(4, 2, 3), idx));
    tu_check_close(p, ref, 3, TU_SIZES(4, 2, 3), 0, 0);
    em_tensor *t = em_transpose(x, -1, 0);
    ck_assert_int_eq(em_size(t, 0), 4);
    ck_assert_int_eq(em_stride(t, 0), 1);
    ck_assert_int_eq(em_stride(t, 2), 12);
    tu_check_fails(em_permute(x, 3, (int[]){0, 0, 1}), EM_ERR_DIM);
    tu_check_fails(em_permute(x, 2, (int[]){0, 1}), EM_ERR_DIM);
    tu_check_fails(em_permute(x, 3, (int[]){0, 1, 3}), EM_ERR_DIM);
    tu_check_fails(em_transpose(x, 0, 3), EM_ERR_DIM);
    /* a 0-d tensor transposes to itself */
    em_tensor *s = em_transpose(em_scalar(2, EM_F32, CPU), 0, -1);
    double two = 2;
    tu_check_close(s, &two, 0, NULL, 0, 0);
}
END_TEST

START_TEST(slice_python_semantics) {
    em_tensor *x = iota(2, TU_SIZES(3, 10));
    em_tensor *s = em_slice(x, 1, -8, 100, 3); /* columns 2, 5, 8 */
    ck_assert(em_shares_storage(s, x));
    ck_assert_int_eq(em_offset(s), 2);
    double ref[9];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) ref[i * 3 + j] = i * 10 + 2 + 3 * j;
    tu_check_close(s, ref, 2, TU_SIZES(3, 3), 0, 0);
    em_tensor *e = em_slice(x, 0, 2, 1, 1); /* empty */
    ck_assert_int_eq(em_size(e, 0), 0);
    em_tensor *last = em_slice(x, -1, -1, 10, 1);
    double lr[3] = {9, 19, 29};
    tu_check_close(last, lr, 2, TU_SIZES(3, 1), 0, 0);
    /* slice of a slice */
    em_tensor *ss = em_slice(em_slice(x, 1, 1, 10, 2), 1, 1, 5, 2); /* cols 3, 7 */
    double sr[6] = {3, 7, 13, 17, 23, 27};
    tu_check_close(ss, sr, 2, TU_SIZES(3, 2), 0, 0);
    tu_check_fails(em_slice(x, 1, 0, 5, 0), EM_ERR_ARG);
    tu_check_fails(em_slice(x, 1, 0, 5, -1), EM_ERR_ARG);
    tu_check_fails(em_slice(x, 2, 0, 5, 1), EM_ERR_DIM);
    tu_check_fails(em_slice(em_scalar(1, EM_F32, CPU), 0, 0, 1, 1), EM_ERR_DIM);
}
END_TEST

START_TEST(expand_squeeze_unsqueeze) {
    em_tensor *x = iota(2, TU_SIZES(3, 1));
    em_tensor *e = em_expand(x, 3, TU_SIZES(2, -1, 4));
    ck_assert(em_shares_storage(e, x));
    ck_assert_int_eq(em_stride(e, 0), 0);
    ck_assert_int_eq(em_stride(e, 2), 0);
    double ref[24];
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) ref[a * 12 + i * 4 + j] = i;
    tu_check_close(e, ref, 3, TU_SIZES(2, 3, 4), 0, 0);
    em_tensor *z = em_expand(x, 2, TU_SIZES(3, 0));
    ck_assert_int_eq(em_numel(z), 0);
    tu_check_fails(em_expand(x, 2, TU_SIZES(4, 4)), EM_ERR_SHAPE);
    tu_check_fails(em_expand(x, 1, TU_SIZES(3)), EM_ERR_DIM);
    tu_check_fails(em_expand(x, 3, TU_SIZES(-1, 3, 2)), EM_ERR_ARG);

    em_tensor *s = em_squeeze(x, -1);
    double sr[3] = {0, 1, 2};
    tu_check_close(s, sr, 1, TU_SIZES(3), 0, 0);
    tu_check_fails(em_squeeze(x, 0), EM_ERR_SHAPE);
    tu_check_fails(em_squeeze(x, 2), EM_ERR_DIM);
    em_tensor *u = em_unsqueeze(s, 0);
    tu_check_close(u, sr, 2, TU_SIZES(1, 3), 0, 0);
    u = em_unsqueeze(s, -1);
    tu_check_close(u, sr, 2, TU_SIZES(3, 1), 0, 0);
    ck_assert(em_is_contiguous(u));
    tu_check_fails(em_unsqueeze(s, 3), EM_ERR_DIM);
    em_tensor *big = em_zeros(8, TU_SIZES(1, 1, 1, 1, 1, 1, 1, 1), EM_F32, CPU);
    tu_check_fails(em_unsqueeze(big, 0), EM_ERR_DIM);
    em_tensor *u0 = em_unsqueeze(em_scalar(4, EM_I32, CPU), 0);
    double four = 4;
    tu_check_close(u0, &four, 1, TU_SIZES(1), 0, 0);
}
END_TEST

START_TEST(contiguous_aliases_or_copies) {
    em_tensor *x = iota(2, TU_SIZES(2, 3));
    em_tensor *c = em_contiguous(x);
    ck_assert(em_shares_storage(c, x)); /* already contiguous: an alias */
    em_tensor *t = em_contiguous(em_transpose(x, 0, 1));
    ck_assert(!em_shares_storage(t, x));
    ck_assert(em_is_contiguous(t));
    double ref[6] = {0, 3, 1, 4, 2, 5};
    tu_check_close(t, ref, 2, TU_SIZES(3, 2), 0, 0);
    /* an expanded (stride 0) tensor materializes */
    em_tensor *e = em_contiguous(em_expand(em_scalar(7, EM_I64, CPU), 2, TU_SIZES(2, 2)));
    double er[4] = {7, 7, 7, 7};
    tu_check_close(e, er, 2, TU_SIZES(2, 2), 0, 0);
    ck_assert_int_eq(em_stride(e, 0), 2);
}
END_TEST

/* ---- generator ---- */

START_TEST(philox_known_answer) {
    /* Random123's known answer: philox4x32-10 of counter 0 under key 0 is
     * {0x6627e8d5, ...}; rand's first f32 is its top 24 bits over 2^24. */
    em_generator *g0 = em_generator_new(0);
    double u;
    ck_assert_int_eq(em_item(em_rand(g0, 0, NULL, EM_F32, CPU), &u), EM_OK);
    ck_assert_double_eq(u, (double)(0x6627e8d5u >> 8) / 16777216.0);
    em_generator_free(g0);
    em_generator *g = em_generator_new(1234);
    ck_assert_int_eq(em_generator_seed(g), 1234);
    ck_assert_int_eq(em_generator_offset(g), 0);
    em_tensor *a = em_rand(g, 2, TU_SIZES(3, 5), EM_F32, CPU);
    ck_assert_int_eq(em_generator_offset(g), 15);
    ck_assert_ptr_nonnull(a);
    tu_check_fails(em_rand(NULL, 1, TU_SIZES(2), EM_F32, CPU), EM_ERR_NULL);
    ck_assert_int_eq(em_generator_offset(g), 15);
    em_generator_free(g);
    em_generator_free(NULL);
}
END_TEST

/* ---- threads ---- */

START_TEST(num_threads_positive) { ck_assert_int_ge(em_num_threads(), 1); }
END_TEST

/* The pool's contract: every index runs exactly once, and no chunk runs
 * after em_parallel_for returns, even when consecutive jobs have different
 * chunk counts (a worker still looping from a 2-chunk job once took a
 * chunk of the next 16-chunk job while its fields were being written). */
typedef struct pool_job {
    atomic_int hits[64];
    int64_t n;
    atomic_int closed;  /* set after em_parallel_for returned */
    atomic_int *late;   /* chunks that ran on a closed job, or out of range */
} pool_job;

static void count_range(void *ctx, int64_t lo, int64_t hi) {
    pool_job *j = ctx;
    if (atomic_load(&j->closed) || lo < 0 || hi > j->n) {
        atomic_fetch_add(j->late, 1);
        return;
    }
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&j->hits[i], 1);
}

START_TEST(pool_runs_each_index_once) {
    static const int64_t sizes[] = {2, 64, 3, 17, 1, 40, 5};
    atomic_int late = 0;
    int wrong = 0;
    for (int it = 0; it < 700; it++) {
        pool_job *j = calloc(1, sizeof *j);
        ck_assert_ptr_nonnull(j);
        j->n = sizes[it % 7];
        j->late = &late;
        em_parallel_for(j->n, 1, count_range, j);
        atomic_store(&j->closed, 1);
        for (int64_t i = 0; i < j->n; i++) wrong += atomic_load(&j->hits[i]) != 1;
        free(j); /* a chunk still running now reads freed memory (valgrind, ASan) */
    }
    ck_assert_int_eq(wrong, 0);
    ck_assert_int_eq(atomic_load(&late), 0);
}
END_TEST

/* ---- the registry (eager.h): what src/jit plugs into eager ---- */

/* The tests link the core statically (Makefile.am's EMBER_CORE_WHOLE): the
 * files that register themselves from constructors are linked and have run. */
START_TEST(registry_holds_what_jit_registered) {
    ck_assert_ptr_eq(em_registered_device(EM_CPU), &em_cpu_backend);
    ck_assert_ptr_eq(em_backend_for(CPU), &em_cpu_backend);
    ck_assert_ptr_null(em_registered_device(EM_DEVICE_TYPE_COUNT));
    ck_assert_ptr_null(em_registered_device((em_device_type)-1));
#ifdef EMBER_HAVE_CUDA
    const em_backend *cuda = em_registered_device(EM_CUDA);
    ck_assert_ptr_nonnull(cuda);
    ck_assert_str_eq(cuda->name, "cuda");
    ck_assert_int_eq(em_register_device(EM_CUDA, cuda), EM_OK); /* idempotent */
    ck_assert_ptr_eq(em_registered_device(EM_CUDA), cuda);
    if (!em_device_available(em_cuda(0))) { /* registered, but no GPU here */
        em_clear_error();
        ck_assert_ptr_null(em_backend_for(em_cuda(0)));
        ck_assert_int_eq(em_last_status(), EM_ERR_DEVICE);
        /* the reason is the CUDA table's (no driver, no device), not the registry's */
        ck_assert_msg(!strstr(em_last_error(), "registered"), "%s", em_last_error());
    }
#else
    ck_assert_ptr_null(em_registered_device(EM_CUDA));
    ck_assert_ptr_null(em_backend_for(em_cuda(0)));
    ck_assert_msg(strstr(em_last_error(), "no CUDA backend"), "%s", em_last_error());
#endif
}
END_TEST

static bool fake_available(em_device d) {
    if (d.index == 0) return true;
    em_error(EM_ERR_DEVICE, "fake device: only index 0");
    return false;
}
static int fake_allocs, fake_frees;
static em_status fake_alloc(em_device d, size_t n, void **p) {
    fake_allocs++;
    *p = calloc(1, n ? n : 1);
    return *p ? EM_OK : em_error(EM_ERR_NOMEM, "fake device: out of memory");
}
static void fake_free(em_device d, void *p) { fake_frees++, free(p); }
static em_status fake_copy(void *dst, em_device dd, const void *src, em_device sd, size_t n) {
    memcpy(dst, src, n);
    return EM_OK;
}
static em_status fake_run(const em_op_call *c, em_tensor *out) {
    if (c->op == EM_OP_EMPTY) return EM_OK; /* its storage is all there is */
    return em_error(EM_ERR_UNSUPPORTED, "fake device: no kernels");
}
static const em_backend fake_backend = {"fake", fake_available, fake_alloc, fake_free, fake_copy, fake_run};

START_TEST(registry_refuses_bad_registrations) {
    ck_assert_int_eq(em_register_device(EM_CUDA, NULL), EM_ERR_NULL);
    ck_assert_msg(strstr(em_last_error(), "cuda table is NULL"), "%s", em_last_error());
    ck_assert_int_eq(em_register_device(EM_DEVICE_TYPE_COUNT, &fake_backend), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "invalid device type 2"), "%s", em_last_error());
    ck_assert_int_eq(em_register_device((em_device_type)-1, &fake_backend), EM_ERR_ARG);
    em_backend no_run = fake_backend;
    no_run.run = NULL;
    ck_assert_int_eq(em_register_device(EM_CUDA, &no_run), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "lacks a required member"), "%s", em_last_error());
    /* a type's table is written once: the CPU's is built in */
    ck_assert_int_eq(em_register_device(EM_CPU, &fake_backend), EM_ERR_STATE);
    ck_assert_msg(strstr(em_last_error(), "cpu already has a table (\"cpu\")"), "%s", em_last_error());
    ck_assert_ptr_eq(em_registered_device(EM_CPU), &em_cpu_backend);
    ck_assert_int_eq(em_register_device(EM_CPU, &em_cpu_backend), EM_OK);
    /* lazy mode's start (EMBER_JIT=1) is registered: a second one is refused */
    ck_assert_int_eq(em_register_mode_start(NULL), EM_ERR_NULL);
    ck_assert_int_eq(em_register_mode_start(em_clear_error), EM_ERR_STATE);
    ck_assert_msg(strstr(em_last_error(), "another mode start"), "%s", em_last_error());
}
END_TEST

/* A device type without a table (EM_CUDA in a build without the CUDA
 * headers) takes a table registered later; with CUDA's table there, the
 * fake one is refused and CUDA's stays. */
START_TEST(registry_finds_a_registered_device) {
    const em_backend *before = em_registered_device(EM_CUDA);
    em_status s = em_register_device(EM_CUDA, &fake_backend);
    if (before) {
        ck_assert_int_eq(s, EM_ERR_STATE);
        ck_assert_msg(strstr(em_last_error(), "\"fake\" cannot replace it"), "%s", em_last_error());
        ck_assert_ptr_eq(em_registered_device(EM_CUDA), before);
        return;
    }
    ck_assert_int_eq(s, EM_OK);
    ck_assert_ptr_eq(em_registered_device(EM_CUDA), &fake_backend);
    ck_assert(em_device_available(em_cuda(0)));
    ck_assert(!em_device_available(em_cuda(1)));
    em_tensor *t = em_empty(1, TU_SIZES(4), EM_F32, em_cuda(0));
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(em_device_of(t).type, EM_CUDA);
    ck_assert_int_eq(fake_allocs, 1);
    em_tensor_discard(t);
    ck_assert_int_eq(fake_frees, 1);
    tu_check_fails(em_empty(1, TU_SIZES(4), EM_F32, em_cuda(1)), EM_ERR_DEVICE);
    ck_assert_str_eq(em_last_error(), "fake device: only index 0");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("errors");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, error_chain_keeps_first_error);
    tcase_add_test(tc, error_null_names_argument);
    tcase_add_test(tc, status_names);
    tcase_add_test(tc, error_context_prepends_safely);
    tcase_add_test(tc, error_context_of_deferred_failures);
    tcase_add_test(tc, shape_overflow_is_an_error);
    tcase_add_test(tc, compile_with_empty_arrays);
    tcase_add_test(tc, creation_errors);
    suite_add_tcase(s, tc);
    tc = tcase_create("tensors");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, metadata);
    tcase_add_test(tc, dtypes_and_promotion);
    tcase_add_test(tc, from_data_round_trip);
    tcase_add_test(tc, item_values);
    tcase_add_test(tc, print_format);
    tcase_add_test(tc, philox_known_answer);
    tcase_add_test(tc, num_threads_positive);
    tcase_add_test(tc, pool_runs_each_index_once);
    suite_add_tcase(s, tc);
    tc = tcase_create("memory");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, scope_keep_moves_out);
    tcase_add_test(tc, scope_keep_without_outer_scope);
    tcase_add_test(tc, scope_keep_of_input_adds_reference);
    tcase_add_test(tc, release_of_scope_tensor_is_refused);
    tcase_add_test(tc, views_outlive_base_reference);
    tcase_add_test(tc, failing_allocations_are_reported_and_leak_nothing);
    tcase_add_test(tc, freed_big_blocks_are_handed_out_again);
    suite_add_tcase(s, tc);
    tc = tcase_create("views");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, reshape_views_when_possible);
    tcase_add_test(tc, permute_and_transpose);
    tcase_add_test(tc, slice_python_semantics);
    tcase_add_test(tc, expand_squeeze_unsqueeze);
    tcase_add_test(tc, contiguous_aliases_or_copies);
    suite_add_tcase(s, tc);
    /* last: without fork (valgrind), a fake device stays registered */
    tc = tcase_create("registry");
    tcase_add_test(tc, registry_holds_what_jit_registered);
    tcase_add_test(tc, registry_refuses_bad_registrations);
    tcase_add_test(tc, registry_finds_a_registered_device);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    /* more threads than this machine may have: the pool's races show only
     * with several workers (the count is read once, at first use) */
    setenv("EMBER_NUM_THREADS", "8", 0);
    return tu_run(suite());
}
