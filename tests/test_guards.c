/* test_guards.c - guard sets: a pass and a failure (with its reason) for
 * every guarded property. */
#include "testutil.h"

#include <string.h>

#include "guards.h"

static const em_device CPU = {EM_CPU, 0};

/* Records y = x * w + s for inputs x, w; returns the graph. */
static tr_graph *record_two(em_tensor *x, em_tensor *w, em_tensor *captured) {
    em_tensor *in[2] = {x, w};
    const char *names[2] = {"x", "w"};
    tr_recorder *r = tr_record_begin(2, in, names);
    ck_assert_ptr_nonnull(r);
    em_tensor *y = em_add(em_mul(x, w), captured);
    char why[64];
    tr_graph *g = tr_record_end(r, 1, &y, why, sizeof why);
    ck_assert_ptr_nonnull(g);
    return g;
}

typedef struct fixture {
    tr_graph *g;
    gd_guards *gs;
    em_tensor *x, *w, *c;
    em_tensor *slot;
} fixture;

static void make(fixture *fx, double scalar) {
    fx->x = tu_random(1, 2, TU_SIZES(4, 3), EM_F32, 1);
    fx->w = tu_random(2, 2, TU_SIZES(4, 3), EM_F32, 1);
    fx->c = tu_random(3, 1, TU_SIZES(3), EM_F32, 1);
    fx->slot = fx->c;
    fx->g = record_two(fx->x, fx->w, fx->c);
    em_tensor *in[2] = {fx->x, fx->w};
    em_tensor *const *watch[1] = {&fx->slot};
    fx->gs = gd_build(fx->g, in, &scalar, 1, watch, 1);
    ck_assert_ptr_nonnull(fx->gs);
    ck_assert_int_eq(fx->gs->nwatch, 1);
}

static void unmake(fixture *fx) {
    gd_free(fx->gs);
    tr_graph_free(fx->g);
}

/* Asserts that (x, w, scalar) fails with exactly the reason want. */
static void check_fails(fixture *fx, em_tensor *x, em_tensor *w, double scalar, const char *want) {
    em_tensor *in[2] = {x, w};
    char why[256];
    ck_assert(!gd_check(fx->gs, in, &scalar));
    gd_explain(fx->gs, in, &scalar, why, sizeof why);
    ck_assert_str_eq(why, want);
}

START_TEST(same_call_passes) {
    fixture fx;
    make(&fx, 0.5);
    em_tensor *in[2] = {fx.x, fx.w};
    double s = 0.5;
    ck_assert(gd_check(fx.gs, in, &s));
    char why[256];
    gd_explain(fx.gs, in, &s, why, sizeof why);
    ck_assert_str_eq(why, "");
    /* other tensors with the same meta pass too: guards are not identity */
    em_tensor *in2[2] = {em_zeros(2, TU_SIZES(4, 3), EM_F32, CPU),
                         em_ones(2, TU_SIZES(4, 3), EM_F32, CPU)};
    ck_assert(gd_check(fx.gs, in2, &s));
    unmake(&fx);
}
END_TEST

START_TEST(dtype_guard) {
    fixture fx;
    make(&fx, 0.5);
    check_fails(&fx, fx.x, em_cast(fx.w, EM_F64), 0.5,
                "input 1 (w): dtype mismatch: expected f32, got f64");
    unmake(&fx);
}
END_TEST

START_TEST(size_guard) {
    fixture fx;
    make(&fx, 0.5);
    check_fails(&fx, em_zeros(2, TU_SIZES(8, 3), EM_F32, CPU), fx.w, 0.5,
                "input 0 (x): size mismatch at dim 0: expected 4, got 8");
    check_fails(&fx, fx.x, em_zeros(2, TU_SIZES(4, 1), EM_F32, CPU), 0.5,
                "input 1 (w): size mismatch at dim 1: expected 3, got 1");
    unmake(&fx);
}
END_TEST

START_TEST(rank_guard) {
    fixture fx;
    make(&fx, 0.5);
    check_fails(&fx, em_zeros(3, TU_SIZES(1, 4, 3), EM_F32, CPU), fx.w, 0.5,
                "input 0 (x): rank mismatch: expected 2 dims, got 3");
    unmake(&fx);
}
END_TEST

START_TEST(stride_guard) {
    fixture fx;
    make(&fx, 0.5);
    /* same sizes, transposed layout */
    em_tensor *t = em_transpose(em_zeros(2, TU_SIZES(3, 4), EM_F32, CPU), 0, 1);
    check_fails(&fx, t, fx.w, 0.5, "input 0 (x): stride mismatch at dim 0: expected 3, got 1");
    /* strides of size-1 dims are free */
    em_tensor *in[2];
    em_tensor *a = em_zeros(2, TU_SIZES(4, 1), EM_F32, CPU);
    em_tensor *b = em_slice(em_zeros(2, TU_SIZES(4, 5), EM_F32, CPU), 1, 2, 3, 1); /* [4,1] stride 5 */
    double s = 0.5;
    in[0] = in[1] = a;
    em_tensor *y = NULL;
    tr_recorder *r = tr_record_begin(2, in, NULL);
    y = em_add(a, a);
    tr_graph *g = tr_record_end(r, 1, &y, NULL, 0);
    gd_guards *gs = gd_build(g, in, &s, 0, NULL, 0);
    in[1] = b;
    ck_assert_int_eq(em_stride(a, 0), 1);
    ck_assert_int_eq(em_stride(b, 0), 5);
    ck_assert(!gd_check(gs, in, &s)); /* dim 0 has size 4: its stride counts */
    em_tensor *c = em_expand(em_zeros(2, TU_SIZES(1, 1), EM_F32, CPU), 2, TU_SIZES(4, 1));
    in[1] = em_contiguous(c);
    ck_assert(gd_check(gs, in, &s));
    gd_free(gs);
    tr_graph_free(g);
    unmake(&fx);
}
END_TEST

START_TEST(device_guard) {
    fixture fx;
    make(&fx, 0.5);
    /* a stand-in with a CUDA device: guards read only meta */
    em_tensor fake = *fx.x;
    fake.device = em_cuda(1);
    check_fails(&fx, &fake, fx.w, 0.5, "input 0 (x): device mismatch: expected cpu, got cuda:1");
    unmake(&fx);
}
END_TEST

START_TEST(scalar_guard) {
    fixture fx;
    make(&fx, 0.5);
    check_fails(&fx, fx.x, fx.w, 0.25, "scalar 0: value mismatch: expected 0.5, got 0.25");
    check_fails(&fx, fx.x, fx.w, -0.5, "scalar 0: value mismatch: expected 0.5, got -0.5");
    unmake(&fx);
    /* NaN guards equal to the same NaN */
    make(&fx, NAN);
    em_tensor *in[2] = {fx.x, fx.w};
    double s = NAN;
    ck_assert(gd_check(fx.gs, in, &s));
    unmake(&fx);
}
END_TEST

START_TEST(watched_constant_guard) {
    fixture fx;
    make(&fx, 0.5);
    fx.slot = em_zeros(1, TU_SIZES(3), EM_F32, CPU); /* the user swapped the weight */
    check_fails(&fx, fx.x, fx.w, 0.5,
                "a watched constant slot holds another tensor than the one captured");
    fx.slot = fx.c;
    em_tensor *in[2] = {fx.x, fx.w};
    double s = 0.5;
    ck_assert(gd_check(fx.gs, in, &s));
    unmake(&fx);
}
END_TEST

START_TEST(print_lists_every_guard) {
    fixture fx;
    make(&fx, 0.5);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_int_eq(gd_print(fx.gs, f), EM_OK);
    fclose(f);
    ck_assert_msg(strstr(buf, "guard input 0 (x): dtype=f32 device=cpu sizes=[4, 3] strides=[3, 1]\n"),
                  "%s", buf);
    ck_assert_msg(strstr(buf, "guard input 1 (w): dtype=f32"), "%s", buf);
    ck_assert_msg(strstr(buf, "guard scalar 0 == 0.5\n"), "%s", buf);
    ck_assert_msg(strstr(buf, "guard watched slot"), "%s", buf);
    free(buf);
    unmake(&fx);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("guards");
    TCase *tc = tcase_create("guards");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, same_call_passes);
    tcase_add_test(tc, dtype_guard);
    tcase_add_test(tc, size_guard);
    tcase_add_test(tc, rank_guard);
    tcase_add_test(tc, stride_guard);
    tcase_add_test(tc, device_guard);
    tcase_add_test(tc, scalar_guard);
    tcase_add_test(tc, watched_constant_guard);
    tcase_add_test(tc, print_lists_every_guard);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
