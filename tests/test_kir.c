/* test_kir.c - the kernel IR: building, the text form (golden), and the
 * verifier's rejections. */
#include "testutil.h"

#include <string.h>

#include "kir.h"

static char *text_of(const k_kernel *k) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_int_eq(kir_print(k, f), EM_OK);
    fclose(f);
    return buf;
}

/* y[r, c] = exp(x[r, c] - max_c x[r, c]) over rows of n columns */
static k_kernel *softmax_numerator(void) {
    k_kernel *k = kir_new("exp_shifted");
    int x = kir_buf(k, EM_F32), y = kir_buf(k, EM_F32), rows = kir_size(k), cols = kir_size(k);
    int r = kir_range(k, rows, K_PARALLEL);
    int base = kir_alu(k, KA_MUL, r, cols, -1);
    int m = kir_acc(k, KA_MAX, kir_const_f(k, EM_F32, -INFINITY));
    int c = kir_range(k, cols, 0);
    kir_acc_update(k, m, kir_load(k, x, kir_alu(k, KA_ADD, base, c, -1)));
    kir_end(k);
    int c2 = kir_range(k, cols, 0);
    int at = kir_alu(k, KA_ADD, base, c2, -1);
    kir_store(k, y, at, kir_alu(k, KA_EXP, kir_alu(k, KA_SUB, kir_load(k, x, at), m, -1), -1, -1));
    kir_end(k);
    kir_end(k);
    return k;
}

START_TEST(golden_text) {
    k_kernel *k = softmax_numerator();
    ck_assert_int_eq(kir_verify(k), EM_OK);
    ck_assert_int_eq(k->nbufs, 2);
    ck_assert_int_eq(k->nsizes, 2);
    char *t = text_of(k);
    ck_assert_str_eq(t,
                     "kernel exp_shifted(%0 = buf f32 #0, %1 = buf f32 #1, %2 = size i64 #0, "
                     "%3 = size i64 #1)\n"
                     "  %4 = range %2 parallel\n"
                     "    %5 = mul i64 %4, %3\n"
                     "    %6 = const f32 -inf\n"
                     "    %7 = acc f32 max %6\n"
                     "    %8 = range %3\n"
                     "      %9 = add i64 %5, %8\n"
                     "      %10 = load f32 %0[%9]\n"
                     "      %7 <- %10\n"
                     "    end\n"
                     "    %13 = range %3\n"
                     "      %14 = add i64 %5, %13\n"
                     "      %15 = load f32 %0[%14]\n"
                     "      %16 = sub f32 %15, %7\n"
                     "      %17 = exp f32 %16\n"
                     "      store %1[%14] = %17\n"
                     "    end\n"
                     "  end\n");
    free(t);
    kir_free(k);
}
END_TEST

START_TEST(compare_and_where_types) {
    k_kernel *k = kir_new("w");
    int a = kir_const_f(k, EM_F64, 1.5), b = kir_const_f(k, EM_F64, 2);
    int lt = kir_alu(k, KA_LT, a, b, -1);
    ck_assert_int_eq(k->insts[lt].dtype, EM_BOOL);
    int w = kir_alu(k, KA_WHERE, lt, a, b);
    ck_assert_int_eq(k->insts[w].dtype, EM_F64);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    kir_free(k);
}
END_TEST

/* Builds a kernel, lets `spoil` break it, and expects the verifier to say why. */
START_TEST(verifier_rejects) {
    k_kernel *k;
    /* a loop variable used after its loop */
    k = kir_new("k");
    int n = kir_const_i(k, EM_I64, 4);
    int i = kir_range(k, n, 0);
    kir_end(k);
    kir_alu(k, KA_ADD, i, n, -1);
    ck_assert_int_eq(kir_verify(k), EM_ERR_STATE);
    ck_assert_msg(strstr(em_last_error(), "ended"), "%s", em_last_error());
    kir_free(k);
    /* unbalanced ranges */
    k = kir_new("k");
    kir_range(k, kir_const_i(k, EM_I64, 4), 0);
    ck_assert_int_eq(kir_verify(k), EM_ERR_STATE);
    kir_end(k);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_ERR_STATE);
    kir_free(k);
    /* a nested parallel range */
    k = kir_new("k");
    n = kir_const_i(k, EM_I64, 4);
    kir_range(k, n, 0);
    kir_range(k, n, K_PARALLEL);
    kir_end(k);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_ERR_STATE);
    kir_free(k);
    /* a float index, a store of the wrong dtype, mixed alu dtypes */
    k = kir_new("k");
    int buf = kir_buf(k, EM_F32);
    int f = kir_const_f(k, EM_F32, 1), idx = kir_const_i(k, EM_I64, 0);
    kir_load(k, buf, f);
    ck_assert_int_eq(kir_verify(k), EM_ERR_STATE);
    kir_free(k);
    k = kir_new("k");
    buf = kir_buf(k, EM_F32);
    idx = kir_const_i(k, EM_I64, 0);
    kir_store(k, buf, idx, kir_const_f(k, EM_F64, 1));
    ck_assert_int_eq(kir_verify(k), EM_ERR_STATE);
    kir_free(k);
    k = kir_new("k");
    kir_alu(k, KA_ADD, kir_const_f(k, EM_F32, 1), kir_const_f(k, EM_F64, 1), -1);
    ck_assert_int_eq(kir_verify(k), EM_ERR_STATE);
    kir_free(k);
    /* builders refuse undefined operands and bad accumulators */
    k = kir_new("k");
    em_clear_error();
    ck_assert_int_eq(kir_alu(k, KA_ADD, 5, 6, -1), -1);
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    ck_assert_int_eq(kir_alu(k, KA_NONE, -1, -1, -1), -1);
    ck_assert_int_eq(kir_acc(k, KA_MUL, kir_const_f(k, EM_F32, 0)), -1);
    ck_assert_int_eq(kir_acc_update(k, 0, 0), -1);
    ck_assert_int_eq(kir_verify(NULL), EM_ERR_NULL);
    kir_free(k);
    kir_free(NULL);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("kir");
    TCase *tc = tcase_create("kir");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, golden_text);
    tcase_add_test(tc, compare_and_where_types);
    tcase_add_test(tc, verifier_rejects);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
