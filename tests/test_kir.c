/* test_kir.c - the kernel IR: building, the text form (golden), the
 * verifier's rejections (every rule, each naming the instruction), and the
 * ALU table against the op table. */
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
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "ended"), "%s", em_last_error());
    kir_free(k);
    /* unbalanced ranges */
    k = kir_new("k");
    kir_range(k, kir_const_i(k, EM_I64, 4), 0);
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    kir_end(k);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    kir_free(k);
    /* a nested parallel range */
    k = kir_new("k");
    n = kir_const_i(k, EM_I64, 4);
    kir_range(k, n, 0);
    kir_range(k, n, K_PARALLEL);
    kir_end(k);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    kir_free(k);
    /* a float index, a store of the wrong dtype, mixed alu dtypes */
    k = kir_new("k");
    int buf = kir_buf(k, EM_F32);
    int f = kir_const_f(k, EM_F32, 1), idx = kir_const_i(k, EM_I64, 0);
    kir_load(k, buf, f);
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    kir_free(k);
    k = kir_new("k");
    buf = kir_buf(k, EM_F32);
    idx = kir_const_i(k, EM_I64, 0);
    kir_store(k, buf, idx, kir_const_f(k, EM_F64, 1));
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    kir_free(k);
    k = kir_new("k");
    kir_alu(k, KA_ADD, kir_const_f(k, EM_F32, 1), kir_const_f(k, EM_F64, 1), -1);
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
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

/* ---- the verifier's dtype and numbering rules, one case each ---- */

/* Expects k to fail kir_verify with EM_ERR_ARG, the message naming the
 * instruction (`where`, e.g. "instruction %5 (exp)") and the rule (`why`). */
static void expect_rejected(k_kernel *k, const char *where, const char *why) {
    em_clear_error();
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    const char *e = em_last_error();
    ck_assert_msg(strstr(e, where) && strstr(e, why), "want '%s' and '%s' in: %s", where, why, e);
    kir_free(k);
}

/* kernel k(%0 = buf f32 #0, %1 = buf f32 #1)
 *   %2 = const i64 4
 *   %3 = range %2 parallel
 *     %4 = load f32 %0[%3]
 *     %5 = exp f32 %4
 *     store %1[%3] = %5
 *   end */
static k_kernel *valid_kernel(void) {
    k_kernel *k = kir_new("k");
    int x = kir_buf(k, EM_F32), y = kir_buf(k, EM_F32);
    int i = kir_range(k, kir_const_i(k, EM_I64, 4), K_PARALLEL);
    kir_store(k, y, i, kir_alu(k, KA_EXP, kir_load(k, x, i), -1, -1));
    kir_end(k);
    ck_assert_int_eq(k->n, 8);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    return k;
}

/* op applied to loads of buffers of dtype d (a select's condition: of a
 * bool buffer), stored to a buffer of dtype out:
 *   %0 = buf (c), %1 = buf d (a), %2 = buf d (b), %3 = buf out, %4 = const,
 *   %5 = range, %6..%8 = loads, %9 = op, store, end */
static k_kernel *alu_kernel(k_alu op, em_dtype d, em_dtype out) {
    k_kernel *k = kir_new("alu");
    const k_alu_info *a = kir_alu_info(op);
    int c = kir_buf(k, EM_BOOL), x = kir_buf(k, d), y = kir_buf(k, d), o = kir_buf(k, out);
    int i = kir_range(k, kir_const_i(k, EM_I64, 4), K_PARALLEL);
    int lc = kir_load(k, c, i), lx = kir_load(k, x, i), ly = kir_load(k, y, i);
    int v = a->shape == KS_SELECT ? kir_alu(k, op, lc, lx, ly)
          : a->shape == KS_UNARY  ? kir_alu(k, op, lx, -1, -1)
                                  : kir_alu(k, op, lx, ly, -1);
    ck_assert_int_eq(v, 9);
    kir_store(k, o, i, v);
    kir_end(k);
    return k;
}

START_TEST(verifier_rejects_bad_dtypes) {
    k_kernel *k;
    /* ALU ops on dtypes they do not take */
    static const struct {
        k_alu op;
        em_dtype d;
        const char *where, *why;
    } wrong[] = {
        {KA_EXP, EM_I32, "instruction %9 (exp)", "i32 operands: exp takes float ones"},
        {KA_MOD, EM_F32, "instruction %9 (mod)", "f32 operands: mod takes integer ones"},
        {KA_IDIV, EM_BOOL, "instruction %9 (idiv)", "bool operands: idiv takes integer ones"},
        {KA_DIV, EM_I64, "instruction %9 (div)", "i64 operands: div takes float ones"},
        {KA_POW, EM_I32, "instruction %9 (pow)", "i32 operands: pow takes float ones"},
        {KA_NEG, EM_BOOL, "instruction %9 (neg)", "bool operands: neg takes float or integer ones"},
        {KA_RELU, EM_BOOL, "instruction %9 (relu)",
         "bool operands: relu takes float or integer ones"},
    };
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++)
        expect_rejected(alu_kernel(wrong[i].op, wrong[i].d, wrong[i].d), wrong[i].where,
                        wrong[i].why);
    /* a result of the wrong dtype: a compare not bool, an add not its operands' */
    k = alu_kernel(KA_LT, EM_F32, EM_F32);
    k->insts[9].dtype = EM_F32;
    expect_rejected(k, "instruction %9 (lt)", "result dtype f32, not bool");
    k = alu_kernel(KA_ADD, EM_I32, EM_I64);
    k->insts[9].dtype = EM_I64;
    expect_rejected(k, "instruction %9 (add)", "result dtype i64, not i32");
    /* where: the condition must be bool, the values of one dtype */
    k = alu_kernel(KA_WHERE, EM_F32, EM_F32);
    k->insts[9].src[0] = 7; /* the f32 load */
    expect_rejected(k, "instruction %9 (where)", "the condition is f32, not bool");
    k = alu_kernel(KA_WHERE, EM_F32, EM_F32);
    k->insts[9].src[2] = 6; /* the bool load */
    expect_rejected(k, "instruction %9 (where)", "operands of different dtypes (f32, bool)");
    /* a value of no dtype */
    k = valid_kernel();
    k->insts[2].dtype = (em_dtype)99;
    expect_rejected(k, "instruction %2 (const)", "invalid dtype 99");
    /* a load of another dtype than its buffer's */
    k = valid_kernel();
    k->insts[4].dtype = EM_F64;
    expect_rejected(k, "instruction %4 (load)", "load f64 of a buffer of f32");
    /* a range variable that is not i64 */
    k = valid_kernel();
    k->insts[3].dtype = EM_I32;
    expect_rejected(k, "instruction %3 (range)", "range extent or variable not i64");
    /* a size parameter that is not i64 */
    k = kir_new("k");
    kir_size(k);
    k->insts[0].dtype = EM_I32;
    expect_rejected(k, "instruction %0 (size)", "a size of i32, not i64");
}
END_TEST

START_TEST(verifier_rejects_bad_accumulators) {
    k_kernel *k;
    /* an accumulator of another dtype than its initial value */
    k = kir_new("k");
    int acc = kir_acc(k, KA_ADD, kir_const_f(k, EM_F32, 0));
    k->insts[acc].dtype = EM_F64;
    expect_rejected(k, "instruction %1 (acc)",
                    "initial value of dtype f32 for an accumulator of f64");
    /* one that combines with something other than add, max or min */
    k = kir_new("k");
    acc = kir_acc(k, KA_MAX, kir_const_f(k, EM_F32, 0));
    k->insts[acc].alu = KA_MUL;
    expect_rejected(k, "instruction %1 (acc)", "combines with mul, not add, max or min");
    /* an update with a value of another dtype */
    k = kir_new("k");
    acc = kir_acc(k, KA_ADD, kir_const_f(k, EM_F32, 0));
    int r = kir_range(k, kir_const_i(k, EM_I64, 4), 0);
    kir_acc_update(k, acc, kir_cast(k, r, EM_F64));
    kir_end(k);
    expect_rejected(k, "instruction %5 (update)", "update of an accumulator of f32 with f64");
}
END_TEST

START_TEST(verifier_rejects_bad_form) {
    k_kernel *k;
    /* buffer and size numbers outside the kernel's parameters */
    k = valid_kernel();
    k->insts[1].ival = 2;
    expect_rejected(k, "instruction %1 (buf)", "buffer number 2, not in [0, 2)");
    k = kir_new("k");
    kir_size(k);
    k->insts[0].ival = -1;
    expect_rejected(k, "instruction %0 (size)", "size number -1, not in [0, 1)");
    /* an unknown opcode, a wrong operand count, an unknown alu op: found
     * before any operand is read */
    k = valid_kernel();
    k->insts[5].op = (k_opcode)99;
    expect_rejected(k, "instruction %5 (?)", "unknown opcode 99");
    k = valid_kernel();
    k->insts[5].nsrc = 7;
    expect_rejected(k, "instruction %5 (exp)", "7 operands, not 1");
    k = valid_kernel();
    k->insts[6].nsrc = 2;
    expect_rejected(k, "instruction %6 (store)", "2 operands, not 3");
    k = valid_kernel();
    k->insts[5].alu = (k_alu)(KA_COUNT + 3);
    expect_rejected(k, "instruction %5 (invalid)", "invalid alu op");
    /* a kernel whose name cannot name a function */
    k = valid_kernel();
    k->name[0] = '-';
    em_clear_error();
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "kernel name '-' is not a C identifier"), "%s",
                  em_last_error());
    kir_free(k);
    /* a kernel one of whose builders failed is incomplete */
    k = valid_kernel();
    ck_assert_int_eq(kir_load(k, 0, 99), -1);
    ck_assert(k->failed);
    em_clear_error();
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "incomplete"), "%s", em_last_error());
    kir_free(k);
}
END_TEST

/* The tile hint (K_TILE, K_STAGED): printed, verified where it may stand,
 * and refused elsewhere. */
START_TEST(tile_hints) {
    k_kernel *k = kir_new("k");
    int x = kir_buf(k, EM_F32), y = kir_buf(k, EM_F32);
    int ext = kir_const_i(k, EM_I64, 12), rows = kir_const_i(k, EM_I64, 4);
    int o = kir_range_tiled(k, ext, rows);
    int j = kir_range(k, kir_const_i(k, EM_I64, 3), 0);
    int idx = kir_alu(k, KA_ADD, o, kir_alu(k, KA_MUL, j, kir_const_i(k, EM_I64, 12), -1), -1);
    kir_store(k, y, kir_alu(k, KA_ADD, kir_alu(k, KA_MUL, o, kir_const_i(k, EM_I64, 3), -1), j, -1),
              kir_stage(k, kir_load(k, x, idx)));
    kir_end(k);
    kir_end(k);
    ck_assert_msg(kir_verify(k) == EM_OK, "%s", em_last_error());
    char *text = kir_to_text(k);
    ck_assert_msg(strstr(text, "= range %2 parallel tile %3") && strstr(text, "] staged"), "%s", text);
    em_free(text);
    k->insts[o].flags = K_TILE; /* a tiled range that is not parallel */
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    k->insts[o].flags = K_PARALLEL; /* then its two operands are one too many */
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "2 operands, not 1"), "%s", em_last_error());
    kir_free(k);
    /* a staged load outside a tiled range, a flag on a store */
    k = kir_new("k");
    x = kir_buf(k, EM_F32), y = kir_buf(k, EM_F32);
    o = kir_range(k, kir_const_i(k, EM_I64, 4), K_PARALLEL);
    int l = kir_stage(k, kir_load(k, x, o));
    int st = kir_store(k, y, o, l);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "staged load outside"), "%s", em_last_error());
    k->insts[l].flags = 0;
    k->insts[st].flags = K_STAGED;
    ck_assert_int_eq(kir_verify(k), EM_ERR_ARG);
    ck_assert_int_eq(kir_stage(k, st), -1); /* only loads */
    kir_free(k);
}
END_TEST

/* A generator's dtype capability: the first value of a dtype outside the
 * mask, named, with EM_ERR_UNSUPPORTED. */
START_TEST(generator_dtypes) {
    k_kernel *k = kir_new("k");
    int x = kir_buf(k, EM_F32), h = kir_buf(k, EM_F16);
    int i = kir_range(k, kir_const_i(k, EM_I64, 4), K_PARALLEL);
    kir_store(k, h, i, kir_cast(k, kir_load(k, x, i), EM_F16));
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK); /* valid IR: f16 is a dtype of the IR */
    unsigned all = 0;
    for (int d = 0; d < EM_DTYPE_COUNT; d++) all |= KIR_DTYPE(d);
    ck_assert_int_eq(kir_check_dtypes(k, all, "gen"), EM_OK);
    em_clear_error();
    ck_assert_int_eq(kir_check_dtypes(k, all & ~KIR_DTYPE(EM_F16), "gen"), EM_ERR_UNSUPPORTED);
    ck_assert_str_eq(em_last_error(), "gen: k: instruction %1 (buf): f16 values are not supported");
    k->insts[h].dtype = EM_F32; /* now the cast is the first f16 value */
    ck_assert_int_eq(kir_check_dtypes(k, all & ~KIR_DTYPE(EM_F16), "gen"), EM_ERR_UNSUPPORTED);
    ck_assert_str_eq(em_last_error(),
                     "gen: k: instruction %5 (cast): f16 values are not supported");
    kir_free(k);
}
END_TEST

/* ---- the ALU table and the op table ---- */

/* The table's rows: shapes, arities and dtype classes as kir_alu.def's
 * comment states them, checked on a few rows written out here. */
/* A half value widened and narrowed back is the value itself, where that
 * is exact: any bf16, an f16 a conversion made (its NaN is the one
 * conversions make); a loaded f16 NaN would change its payload, so that
 * pair stays; the f32 -> half rounding of a computed f32 value stays. */
START_TEST(half_round_trips_fold) {
    k_kernel *k = kir_new("round_trip");
    int b = kir_buf(k, EM_BF16), h = kir_buf(k, EM_F16), f = kir_buf(k, EM_F32);
    int i = kir_range(k, kir_const_i(k, EM_I64, 3), K_PARALLEL);
    int lb = kir_load(k, b, i), lh = kir_load(k, h, i), lf = kir_load(k, f, i);
    ck_assert_int_eq(kir_cast(k, kir_cast(k, lb, EM_F32), EM_BF16), lb);
    int wide = kir_cast(k, lh, EM_F32), back = kir_cast(k, wide, EM_F16);
    ck_assert_int_ne(back, lh);
    ck_assert_int_eq(k->insts[back].op, K_CAST);
    int made = kir_cast(k, lf, EM_F16);
    ck_assert_int_ne(made, lf);
    ck_assert_int_eq(kir_cast(k, kir_cast(k, made, EM_F32), EM_F16), made);
    int rb = kir_cast(k, lf, EM_BF16); /* rounding, kept */
    ck_assert_int_eq(k->insts[rb].op, K_CAST);
    ck_assert_int_eq(k->insts[rb].src[0], lf);
    /* a widening to f64 is not the f32 pair */
    int d = kir_cast(k, lb, EM_F64);
    ck_assert_int_ne(kir_cast(k, d, EM_BF16), lb);
    kir_store(k, b, i, lb);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    kir_free(k);
}
END_TEST

START_TEST(alu_table_rows) {
    ck_assert_int_eq(kir_alu_info(KA_NONE)->nsrc, 0);
    ck_assert_str_eq(kir_alu_name(KA_NONE), "none");
    ck_assert_str_eq(kir_alu_name((k_alu)KA_COUNT), "invalid");
    ck_assert_str_eq(kir_alu_name((k_alu)-1), "invalid");
    for (int a = KA_NONE + 1; a < KA_COUNT; a++) {
        const k_alu_info *r = kir_alu_info((k_alu)a);
        int want = r->shape == KS_UNARY ? 1 : r->shape == KS_SELECT ? 3 : 2;
        ck_assert_msg(r->shape != KS_NONE && r->nsrc == want, "%s", r->name);
        ck_assert_msg(r->dtypes && !(r->dtypes & ~(unsigned)KD_ANY), "%s", r->name);
        ck_assert_msg(r->cost == 1 || r->cost == 10, "%s", r->name);
        for (int b = KA_NONE; b < a; b++) ck_assert_str_ne(r->name, kir_alu_name((k_alu)b));
    }
    ck_assert_int_eq(kir_alu_info(KA_GELU_TANH)->shape, KS_UNARY);
    ck_assert_int_eq(kir_alu_info(KA_GE)->shape, KS_COMPARE);
    ck_assert_int_eq(kir_alu_info(KA_WHERE)->nsrc, 3);
    ck_assert(kir_alu_accepts(KA_ADD, EM_BOOL) && kir_alu_accepts(KA_ADD, EM_BF16));
    ck_assert(!kir_alu_accepts(KA_MOD, EM_F64) && kir_alu_accepts(KA_MOD, EM_I32));
    ck_assert(!kir_alu_accepts(KA_SQRT, EM_I64) && kir_alu_accepts(KA_SQRT, EM_F16));
    ck_assert(!kir_alu_accepts(KA_ABS, EM_BOOL) && kir_alu_accepts(KA_ABS, EM_I64));
    ck_assert(!kir_alu_accepts(KA_ADD, (em_dtype)EM_DTYPE_COUNT));
    ck_assert_int_eq(kir_alu_result(KA_EQ, EM_F32), EM_BOOL);
    ck_assert_int_eq(kir_alu_result(KA_WHERE, EM_I32), EM_I32);
    ck_assert_int_eq(kir_alu_info(KA_EXP)->cost, 10);
    ck_assert_int_eq(kir_alu_info(KA_SQRT)->cost, 1);
}
END_TEST

/* The result dtype of op table row op on inputs of dtype d, by the op's
 * own infer rule (where: a bool condition, values of d); false when eager
 * refuses d. */
static bool eager_result(em_op op, em_dtype d, em_dtype *out) {
    const em_op_info *info = &em_op_table[op];
    em_tensor *in[3];
    for (int i = 0; i < info->nin; i++)
        in[i] = em_empty(1, TU_SIZES(4), op == EM_OP_WHERE && i == 0 ? EM_BOOL : d, em_cpu());
    em_op_attrs attrs = {0};
    em_op_call c = {.op = op, .nin = info->nin, .in = in, .attrs = &attrs};
    em_meta m;
    bool ok = info->infer(&c, &m) == EM_OK;
    em_clear_error();
    *out = m.dtype;
    return ok;
}

/* Every pointwise op of the op table but cast (which lowers through
 * kir_convert) names an ALU op (its alu column) of the same name (maximum,
 * minimum: max, min) and arity; on every dtype the op's infer rule accepts,
 * the verifier accepts that ALU op, and its result dtype is the infer
 * rule's.  Other ops name none. */
START_TEST(op_table_agrees_with_alu_table) {
    int mapped = 0;
    for (int op = 0; op < EM_OP_COUNT; op++) {
        const em_op_info *info = &em_op_table[op];
        k_alu a = kir_alu_of_op((em_op)op);
        bool pointwise = info->kind == EM_KIND_UNARY || info->kind == EM_KIND_BINARY ||
                         info->kind == EM_KIND_TERNARY;
        if (!pointwise || op == EM_OP_CAST) {
            ck_assert_msg(a == KA_NONE, "%s lowers to %s", info->name, kir_alu_name(a));
            continue;
        }
        mapped++;
        const char *want = op == EM_OP_MAXIMUM ? "max" : op == EM_OP_MINIMUM ? "min" : info->name;
        ck_assert_str_eq(kir_alu_name(a), want);
        ck_assert_int_eq(kir_alu_info(a)->nsrc, info->nin);
        int accepted = 0;
        for (int d = 0; d < EM_DTYPE_COUNT; d++) {
            em_dtype r;
            if (!eager_result((em_op)op, (em_dtype)d, &r)) continue;
            accepted++;
            ck_assert_msg(kir_alu_result(a, (em_dtype)d) == r, "%s on %s", info->name,
                          em_dtype_name((em_dtype)d));
            k_kernel *k = alu_kernel(a, (em_dtype)d, r);
            ck_assert_msg(kir_verify(k) == EM_OK, "%s on %s: %s", info->name,
                          em_dtype_name((em_dtype)d), em_last_error());
            kir_free(k);
        }
        ck_assert_msg(accepted >= 2, "%s: eager accepts %d dtypes", info->name, accepted);
    }
    ck_assert_int_eq(mapped, 28);
    ck_assert_int_eq(kir_alu_of_op((em_op)EM_OP_COUNT), KA_NONE);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("kir");
    TCase *tc = tcase_create("kir");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, golden_text);
    tcase_add_test(tc, compare_and_where_types);
    tcase_add_test(tc, verifier_rejects);
    tcase_add_test(tc, verifier_rejects_bad_dtypes);
    tcase_add_test(tc, verifier_rejects_bad_accumulators);
    tcase_add_test(tc, verifier_rejects_bad_form);
    tcase_add_test(tc, generator_dtypes);
    tcase_add_test(tc, tile_hints);
    tcase_add_test(tc, half_round_trips_fold);
    tcase_add_test(tc, alu_table_rows);
    tcase_add_test(tc, op_table_agrees_with_alu_table);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
