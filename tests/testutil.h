/* testutil.h - helpers shared by Ember's Check tests.
 *
 * References are computed in the tests in float64 from the inputs' values,
 * read back densely (row-major) with tu_values.  Nothing here calls Ember's
 * ops: only creation, em_copy_to_host, em_cast and metadata getters. */
#ifndef EMBER_TESTUTIL_H
#define EMBER_TESTUTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "ember.h"

/* Standard-normal values scaled by scale, from a seeded xorshift (so the
 * tests do not depend on em_randn), as a tensor of dtype. */
em_tensor *tu_random(uint64_t seed, int ndim, const int64_t *sizes, em_dtype dtype,
                     double scale);
/* A tensor holding v[0..numel) of dtype (converted from double). */
em_tensor *tu_tensor(const double *v, int ndim, const int64_t *sizes, em_dtype dtype);
/* t's values in row-major order as doubles (malloc'd, caller frees). */
double *tu_values(const em_tensor *t);
/* The value of one element of dtype d at p, decoded here (f16 and bf16
 * included), independently of em_cast. */
double tu_decode(const unsigned char *p, em_dtype d);
/* t's values in row-major order, read as raw bytes with em_copy_to_host and
 * decoded with tu_decode (malloc'd, caller frees). */
double *tu_raw_values(const em_tensor *t);
/* Index of the row-major position of multi-index idx in sizes. */
int64_t tu_flat(int ndim, const int64_t *sizes, const int64_t *idx);
/* Advances a multi-index; returns 0 after the last. */
int tu_next(int ndim, const int64_t *sizes, int64_t *idx);
/* Broadcast read: value of a row-major array of shape (andim, asizes) at the
 * output multi-index idx of rank ndim (numpy broadcasting). */
double tu_bcast_get(const double *a, int andim, const int64_t *asizes, int ndim,
                    const int64_t *idx);

/* Asserts t has sizes (ndim, sizes), and every value within
 * atol + rtol*|ref| of ref (NaN must meet NaN, inf the same inf). */
void tu_check_close_at(const char *file, int line, const em_tensor *t, const double *ref,
                       int ndim, const int64_t *sizes, double rtol, double atol);
#define tu_check_close(t, ref, ndim, sizes, rtol, atol) \
    tu_check_close_at(__FILE__, __LINE__, (t), (ref), (ndim), (sizes), (rtol), (atol))

/* Asserts that expr returned NULL and set status s. */
#define tu_check_fails(expr, s)                                                        \
    do {                                                                               \
        em_clear_error();                                                              \
        em_tensor *tu_r_ = (expr);                                                     \
        ck_assert_msg(tu_r_ == NULL, "%s: expected failure", #expr);                   \
        ck_assert_msg(em_last_status() == (s), "%s: status %s (%s), expected %s", #expr, \
                      em_status_name(em_last_status()), em_last_error(),               \
                      em_status_name(s));                                              \
        ck_assert_msg(em_last_error()[0] != '\0', "%s: empty error message", #expr);   \
    } while (0)

/* A suite of one TCase per test, each with tu_setup/tu_teardown and the
 * given timeout (seconds). */
typedef struct tu_test {
    const char *name;
    const TTest *test;
} tu_test;
Suite *tu_suite(const char *name, const tu_test *tests, size_t n, double timeout);

/* Runs a suite (CK_ENV verbosity) and returns the process exit status. */
int tu_run(Suite *s);

/* EMBER_LOG capture: tu_log_begin sets EMBER_LOG to what and
 * EMBER_LOG_FILE to a new empty temporary file, its path in path (n >=
 * 32); tu_log_end unsets both; tu_log_take returns the file's text
 * (malloc'd: the caller frees) and removes the file. */
void tu_log_begin(const char *what, char *path, size_t n);
void tu_log_end(void);
char *tu_log_take(const char *path);

/* Runs the built ember-cache (EMBER_CACHE_TOOL, set by make check) with
 * the arguments fmt makes; its exit status, and its stdout and stderr in
 * out. */
int tu_tool(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Per-test scope: every tensor a test makes is released at teardown. */
/* Whether cuda:0 works, asked in a child process so that the caller never
 * initializes CUDA (Check forks a process per test, and a forked child
 * cannot use CUDA); why gets the reason when it does not. */
bool tu_probe_gpu(char *why, size_t n);
void tu_setup(void);
void tu_teardown(void);

#define TU_SIZES(...) ((const int64_t[]){__VA_ARGS__})

/* An allocator whose blocks carry its tag (tu_tagged_alloc/free with ud a
 * tu_tagged): a block freed through another tagged allocator is counted in
 * that one's `foreign` (and leaked), not a crash, so tests can check that
 * objects free with the allocator that made them. */
typedef struct tu_tagged {
    unsigned tag;
    _Atomic long live;    /* its blocks not yet freed */
    _Atomic long foreign; /* blocks of another allocator handed to its free */
} tu_tagged;
void *tu_tagged_alloc(void *ud, size_t size, size_t align);
void tu_tagged_free(void *ud, void *p);

#endif
