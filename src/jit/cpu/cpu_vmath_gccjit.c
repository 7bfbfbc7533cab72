/* cpu_vmath_gccjit.c - emission helpers, the kernel IR's scalar operations
 * (cg_alu, cg_convert: the eager kernels' semantics per dtype), and
 * vmath.h's float32 exp, log, tanh, sigmoid, erf, gelu and gelu_tanh as
 * libgccjit functions.  float64 transcendentals call libm; sqrt is gcc's
 * builtin (a vector instruction with -fno-math-errno).
 *
 * Each function is a line-by-line port of its static inline original in
 * src/eager/vmath.h (same constants, same operation order; see there for
 * the methods and error bounds): memcpy bit casts become
 * gcc_jit_context_new_bitcast, em_vm_sel becomes cg_select.  They are
 * GCC_JIT_FUNCTION_ALWAYS_INLINE, so at -O3 each call is inlined into the
 * kernel's loop, which then vectorizes like the C original.  Only the
 * functions a kernel uses are built, once per context. */
#include "cpu_gccjit_impl.h"

#include <math.h>
#include <stdio.h>

/* ---- emission helpers ---- */

void cg_types_init(cg_types *t, gcc_jit_context *ctx) {
    t->v = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_VOID);
    t->vptr = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_VOID_PTR);
    t->f32 = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_FLOAT);
    t->f64 = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_DOUBLE);
    t->u8 = gcc_jit_context_get_int_type(ctx, 1, 0);
    t->u16 = gcc_jit_context_get_int_type(ctx, 2, 0);
    t->i32 = gcc_jit_context_get_int_type(ctx, 4, 1);
    t->u32 = gcc_jit_context_get_int_type(ctx, 4, 0);
    t->i64 = gcc_jit_context_get_int_type(ctx, 8, 1);
    t->u64 = gcc_jit_context_get_int_type(ctx, 8, 0);
}

gcc_jit_lvalue *cg_local(cg *g, gcc_jit_type *ty, const char *prefix) {
    char name[32];
    snprintf(name, sizeof name, "%s%d", prefix, g->ntmp++);
    return gcc_jit_function_new_local(g->fn, NULL, ty, name);
}

gcc_jit_block *cg_block(cg *g, const char *prefix) {
    char name[32];
    snprintf(name, sizeof name, "%s%d", prefix, g->ntmp++);
    return gcc_jit_function_new_block(g->fn, name);
}

cg_val cg_let(cg *g, cg_val v) {
    gcc_jit_lvalue *l = cg_local(g, gcc_jit_rvalue_get_type(v), "t");
    gcc_jit_block_add_assignment(g->b, NULL, l, v);
    return gcc_jit_lvalue_as_rvalue(l);
}

cg_val cg_f32(cg *g, float v) {
    return gcc_jit_context_new_rvalue_from_double(g->ctx, g->t->f32, v);
}
cg_val cg_f64(cg *g, double v) {
    return gcc_jit_context_new_rvalue_from_double(g->ctx, g->t->f64, v);
}
cg_val cg_int(cg *g, gcc_jit_type *ty, int64_t v) {
    return gcc_jit_context_new_rvalue_from_long(g->ctx, ty, (long)v);
}

cg_val cg_bin(cg *g, enum gcc_jit_binary_op op, cg_val a, cg_val b) {
    return gcc_jit_context_new_binary_op(g->ctx, NULL, op, gcc_jit_rvalue_get_type(a), a, b);
}

cg_val cg_cmp(cg *g, enum gcc_jit_comparison op, cg_val a, cg_val b) {
    return gcc_jit_context_new_comparison(g->ctx, NULL, op, a, b);
}

cg_val cg_cast(cg *g, cg_val v, gcc_jit_type *ty) {
    return gcc_jit_rvalue_get_type(v) == ty ? v : gcc_jit_context_new_cast(g->ctx, NULL, v, ty);
}

cg_val cg_bitcast(cg *g, cg_val v, gcc_jit_type *ty) {
    return gcc_jit_context_new_bitcast(g->ctx, NULL, v, ty);
}

cg_val cg_neg(cg *g, cg_val v) {
    return gcc_jit_context_new_unary_op(g->ctx, NULL, GCC_JIT_UNARY_OP_MINUS,
                                        gcc_jit_rvalue_get_type(v), v);
}

cg_val cg_not(cg *g, cg_val v) {
    return gcc_jit_context_new_unary_op(g->ctx, NULL, GCC_JIT_UNARY_OP_BITWISE_NEGATE,
                                        gcc_jit_rvalue_get_type(v), v);
}

gcc_jit_type *cg_utype(cg *g, gcc_jit_type *ty) {
    const cg_types *t = g->t;
    if (ty == t->f32 || ty == t->i32 || ty == t->u32) return t->u32;
    if (ty == t->f64 || ty == t->i64 || ty == t->u64) return t->u64;
    return t->u8;
}

cg_val cg_select(cg *g, cg_val c, cg_val a, cg_val b) {
    gcc_jit_type *ty = gcc_jit_rvalue_get_type(a), *ut = cg_utype(g, ty);
    bool same = ty == ut;
    cg_val m = cg_let(g, cg_neg(g, cg_cast(g, c, ut))); /* all ones when c */
    cg_val ua = same ? a : cg_bitcast(g, a, ut), ub = same ? b : cg_bitcast(g, b, ut);
    cg_val r =
        cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_OR, cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_AND, ua, m),
               cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_AND, ub, cg_not(g, m)));
    return cg_let(g, same ? r : cg_bitcast(g, r, ty));
}

cg_val cg_fabs(cg *g, cg_val x) {
    gcc_jit_type *ty = gcc_jit_rvalue_get_type(x), *ut = cg_utype(g, ty);
    cg_val mask = ut == g->t->u32 ? cg_int(g, ut, 0x7fffffff) : cg_int(g, ut, INT64_MAX);
    return cg_let(
        g, cg_bitcast(g, cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_AND, cg_bitcast(g, x, ut), mask), ty));
}

static cg_val bool_bits(cg *g, enum gcc_jit_binary_op op, cg_val a, cg_val b) {
    cg_val r = cg_bin(g, op, cg_cast(g, a, g->t->u8), cg_cast(g, b, g->t->u8));
    return cg_cmp(g, GCC_JIT_COMPARISON_NE, r, cg_int(g, g->t->u8, 0));
}
cg_val cg_and(cg *g, cg_val a, cg_val b) {
    return bool_bits(g, GCC_JIT_BINARY_OP_BITWISE_AND, a, b);
}
cg_val cg_or(cg *g, cg_val a, cg_val b) { return bool_bits(g, GCC_JIT_BINARY_OP_BITWISE_OR, a, b); }

/* ---- shorthands for the ports below ---- */

#define F(v) cg_f32(g, (v))
#define U(v) cg_int(g, g->t->u32, (v))
#define I(v) cg_int(g, g->t->i32, (v))
#define LET(v) cg_let(g, (v))
static cg_val add(cg *g, cg_val a, cg_val b) { return cg_bin(g, GCC_JIT_BINARY_OP_PLUS, a, b); }
static cg_val sub(cg *g, cg_val a, cg_val b) { return cg_bin(g, GCC_JIT_BINARY_OP_MINUS, a, b); }
static cg_val mul(cg *g, cg_val a, cg_val b) { return cg_bin(g, GCC_JIT_BINARY_OP_MULT, a, b); }
static cg_val dvd(cg *g, cg_val a, cg_val b) { return cg_bin(g, GCC_JIT_BINARY_OP_DIVIDE, a, b); }
static cg_val band(cg *g, cg_val a, cg_val b) {
    return cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_AND, a, b);
}
static cg_val bor(cg *g, cg_val a, cg_val b) {
    return cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_OR, a, b);
}
static cg_val bxor(cg *g, cg_val a, cg_val b) {
    return cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_XOR, a, b);
}
static cg_val shl(cg *g, cg_val a, cg_val b) { return cg_bin(g, GCC_JIT_BINARY_OP_LSHIFT, a, b); }
static cg_val shr(cg *g, cg_val a, cg_val b) { return cg_bin(g, GCC_JIT_BINARY_OP_RSHIFT, a, b); }
static cg_val lt(cg *g, cg_val a, cg_val b) { return cg_cmp(g, GCC_JIT_COMPARISON_LT, a, b); }
static cg_val gt(cg *g, cg_val a, cg_val b) { return cg_cmp(g, GCC_JIT_COMPARISON_GT, a, b); }
static cg_val ge(cg *g, cg_val a, cg_val b) { return cg_cmp(g, GCC_JIT_COMPARISON_GE, a, b); }
static cg_val eq(cg *g, cg_val a, cg_val b) { return cg_cmp(g, GCC_JIT_COMPARISON_EQ, a, b); }
static cg_val bits(cg *g, cg_val x) { return cg_bitcast(g, x, g->t->u32); }
static cg_val flt(cg *g, cg_val u) { return cg_bitcast(g, u, g->t->f32); }
static cg_val sel(cg *g, cg_val c, cg_val a, cg_val b) { return cg_select(g, c, a, b); }
/* p = p * x + c */
static cg_val horner(cg *g, cg_val p, cg_val x, float c) { return LET(add(g, mul(g, p, x), F(c))); }
/* |m| with the sign of s */
static cg_val copysign_(cg *g, cg_val m, cg_val s) {
    return LET(
        flt(g, bor(g, band(g, bits(g, m), U(0x7fffffff)), band(g, bits(g, s), U(0x80000000u)))));
}

/* Starts an always-inline function float name(float x[, float y]). */
static gcc_jit_function *begin(cg *g, const char *name, int np, cg_val *args) {
    gcc_jit_param *p[2];
    static const char *const pn[2] = {"x", "y"};
    for (int i = 0; i < np; i++) p[i] = gcc_jit_context_new_param(g->ctx, NULL, g->t->f32, pn[i]);
    g->fn = gcc_jit_context_new_function(g->ctx, NULL, GCC_JIT_FUNCTION_ALWAYS_INLINE, g->t->f32,
                                         name, np, p, 0);
    if (!g->fn) return NULL;
    g->b = gcc_jit_function_new_block(g->fn, "entry");
    for (int i = 0; i < np; i++) args[i] = gcc_jit_param_as_rvalue(p[i]);
    return g->fn;
}

static cg_val call(cg *g, cg_math *m, cg_mathfn f, int n, cg_val a, cg_val b) {
    gcc_jit_function *fn = cg_math_get(m, g->ctx, g->t, f);
    cg_val args[2] = {a, b};
    return fn ? LET(gcc_jit_context_new_call(g->ctx, NULL, fn, n, args)) : NULL;
}

/* ---- the ports (vmath.h) ---- */

static void build_exp_lo(cg *g, cg_val x, cg_val lo) {
    /* below -104: exp(0), then 0 (vmath.h says why) */
    cg_val under = LET(lt(g, x, F(-104.0f)));
    cg_val xc = sel(g, gt(g, x, F(88.8f)), F(88.8f), x);
    xc = sel(g, under, F(0.0f), xc);
    cg_val kf = LET(add(g, mul(g, xc, F(0x1.715476p+0f)), F(0x1.8p23f)));
    cg_val n = LET(sub(g, kf, F(0x1.8p23f)));
    cg_val ni = LET(cg_cast(g, sub(g, bits(g, kf), U(0x4b400000u)), g->t->i32));
    cg_val r = LET(sub(g, xc, mul(g, n, F(0.693359375f))));
    r = LET(sub(g, r, mul(g, n, F(-2.12194440e-4f))));
    r = LET(add(g, r, lo));
    cg_val r2 = LET(mul(g, r, r));
    cg_val p = F(1.9875691500e-4f);
    p = horner(g, p, r, 1.3981999507e-3f);
    p = horner(g, p, r, 8.3334519073e-3f);
    p = horner(g, p, r, 4.1665795894e-2f);
    p = horner(g, p, r, 1.6666665459e-1f);
    p = horner(g, p, r, 5.0000001201e-1f);
    p = LET(add(g, add(g, mul(g, p, r2), r), F(1.0f)));
    cg_val n1 = LET(shr(g, ni, I(1))), n2 = LET(sub(g, ni, n1));
    cg_val s1 = LET(flt(g, shl(g, cg_cast(g, add(g, n1, I(127)), g->t->u32), U(23))));
    cg_val s2 = LET(flt(g, shl(g, cg_cast(g, add(g, n2, I(127)), g->t->u32), U(23))));
    gcc_jit_block_end_with_return(g->b, NULL, sel(g, under, F(0.0f), mul(g, mul(g, p, s1), s2)));
}

static void build_log(cg *g, cg_val x) {
    cg_val sub_ = LET(lt(g, bits(g, x), U(0x00800000u)));
    cg_val xs = sel(g, sub_, mul(g, x, F(0x1p23f)), x);
    cg_val k0 = sel(g, sub_, I(-23), I(0));
    cg_val ix = LET(add(g, bits(g, xs), U(0x3f800000u - 0x3f3504f3u)));
    cg_val k = LET(sub(g, add(g, k0, cg_cast(g, shr(g, ix, U(23)), g->t->i32)), I(127)));
    cg_val f = LET(sub(g, flt(g, add(g, band(g, ix, U(0x007fffffu)), U(0x3f3504f3u))), F(1.0f)));
    cg_val s = LET(dvd(g, f, add(g, F(2.0f), f)));
    cg_val z = LET(mul(g, s, s)), w = LET(mul(g, z, z));
    cg_val t1 = LET(mul(g, w, add(g, F(0.40000972152f), mul(g, w, F(0.24279078841f)))));
    cg_val t2 = LET(mul(g, z, add(g, F(0.66666662693f), mul(g, w, F(0.28498786688f)))));
    cg_val R = LET(add(g, t2, t1));
    cg_val hfsq = LET(mul(g, mul(g, F(0.5f), f), f));
    cg_val dk = LET(cg_cast(g, k, g->t->f32));
    cg_val y = mul(g, s, add(g, hfsq, R));
    y = add(g, y, mul(g, dk, F(9.0580006145e-06f)));
    y = sub(g, y, hfsq);
    y = add(g, y, f);
    y = LET(add(g, y, mul(g, dk, F(6.9313812256e-01f))));
    cg_val inf = LET(flt(g, U(0x7f800000u)));
    cg_val special = sel(g, eq(g, x, F(0.0f)), cg_neg(g, inf),
                         sel(g, lt(g, x, F(0.0f)), flt(g, U(0x7fc00000u)), x));
    cg_val ok = cg_and(g, gt(g, x, F(0.0f)), lt(g, x, inf));
    gcc_jit_block_end_with_return(g->b, NULL, sel(g, ok, y, special));
}

static void build_tanh(cg *g, cg_math *m, cg_val x) {
    cg_val ax = cg_fabs(g, x);
    cg_val x2 = LET(mul(g, x, x));
    cg_val p = F(0x1.3837c4p-9f);
    p = horner(g, p, x2, -0x1.14726ep-7f);
    p = horner(g, p, x2, 0x1.6534a2p-6f);
    p = horner(g, p, x2, -0x1.ba12b2p-5f);
    p = horner(g, p, x2, 0x1.111108p-3f);
    p = horner(g, p, x2, -0x1.555556p-2f);
    cg_val small = LET(add(g, x, mul(g, mul(g, x, x2), p)));
    cg_val e = call(g, m, CGM_EXP, 1, LET(mul(g, F(-2.0f), ax)), NULL);
    if (!e) return;
    cg_val big = LET(dvd(g, sub(g, F(1.0f), e), add(g, F(1.0f), e)));
    gcc_jit_block_end_with_return(g->b, NULL,
                                  copysign_(g, sel(g, lt(g, ax, F(0.625f)), small, big), x));
}

static void build_sigmoid(cg *g, cg_math *m, cg_val x) {
    cg_val e = call(g, m, CGM_EXP, 1, LET(cg_neg(g, cg_fabs(g, x))), NULL);
    if (!e) return;
    cg_val num = sel(g, ge(g, x, F(0.0f)), F(1.0f), e);
    gcc_jit_block_end_with_return(g->b, NULL, dvd(g, num, add(g, F(1.0f), e)));
}

static void build_erf_small(cg *g, cg_val x) {
    cg_val x2 = LET(mul(g, x, x));
    cg_val p = F(0x1.6e4ee2p-14f);
    p = horner(g, p, x2, -0x1.afd1ccp-11f);
    p = horner(g, p, x2, 0x1.557092p-8f);
    p = horner(g, p, x2, -0x1.b82096p-6f);
    p = horner(g, p, x2, 0x1.ce2ee0p-4f);
    p = horner(g, p, x2, -0x1.812746p-2f);
    p = horner(g, p, x2, 0x1.06eba8p-3f);
    gcc_jit_block_end_with_return(g->b, NULL, add(g, x, mul(g, x, p)));
}

static void build_erfc_mid(cg *g, cg_math *m, cg_val x) {
    cg_val t = LET(sub(g, cg_fabs(g, x), F(0.921875f)));
    cg_val q = F(0x1.5a0d04p-20f);
    q = horner(g, q, t, -0x1.028b54p-15f);
    q = horner(g, q, t, 0x1.56c316p-12f);
    q = horner(g, q, t, -0x1.1e8b38p-9f);
    q = horner(g, q, t, 0x1.64b292p-7f);
    q = horner(g, q, t, -0x1.6f50aap-5f);
    q = horner(g, q, t, -0x1.aa7d36p-1f);
    q = horner(g, q, t, -0x1.410690p+1f);
    q = horner(g, q, t, -0x1.a60826p+0f);
    cg_val e = call(g, m, CGM_EXP, 1, q, NULL);
    if (e) gcc_jit_block_end_with_return(g->b, NULL, e);
}

static void build_erf(cg *g, cg_math *m, cg_val x) {
    cg_val small = call(g, m, CGM_ERF_SMALL, 1, x, NULL);
    cg_val ec = call(g, m, CGM_ERFC_MID, 1, x, NULL);
    if (!small || !ec) return;
    cg_val ax = cg_fabs(g, x);
    cg_val big = sel(g, gt(g, ax, F(3.925f)), F(1.0f), sub(g, F(1.0f), ec));
    big = copysign_(g, big, x);
    gcc_jit_block_end_with_return(g->b, NULL, sel(g, lt(g, ax, F(0.921875f)), small, big));
}

static void build_gelu(cg *g, cg_math *m, cg_val x) {
    cg_val z = LET(mul(g, x, F(0x1.6a09e6p-1f)));
    cg_val small = call(g, m, CGM_ERF_SMALL, 1, z, NULL);
    cg_val ec = call(g, m, CGM_ERFC_MID, 1, z, NULL);
    if (!small || !ec) return;
    cg_val az = cg_fabs(g, z);
    cg_val far = LET(gt(g, az, F(3.925f)));
    cg_val pos = sel(g, far, F(2.0f), sub(g, F(2.0f), ec));
    cg_val neg = sel(g, far, F(0.0f), ec);
    cg_val c = sel(g, gt(g, z, F(0.0f)), pos, neg);
    c = sel(g, lt(g, az, F(0.921875f)), add(g, F(1.0f), small), c);
    gcc_jit_block_end_with_return(g->b, NULL, mul(g, mul(g, F(0.5f), x), c));
}

static void build_gelu_tanh(cg *g, cg_math *m, cg_val x) {
    cg_val xd = LET(cg_cast(g, x, g->t->f64));
    cg_val yd = LET(mul(g, xd,
                        add(g, cg_f64(g, 1.5957691216057308),
                            mul(g, cg_f64(g, 0.07135481627260025), mul(g, xd, xd)))));
    cg_val hi = LET(cg_cast(g, yd, g->t->f32));
    cg_val lo = LET(cg_cast(g, sub(g, yd, cg_cast(g, hi, g->t->f64)), g->t->f32));
    cg_val ahi = cg_fabs(g, hi);
    lo = sel(g, lt(g, ahi, F(128.0f)), lo, F(0.0f));
    cg_val lo2 = LET(flt(g, bxor(g, bits(g, lo), band(g, cg_not(g, bits(g, hi)), U(0x80000000u)))));
    cg_val e = call(g, m, CGM_EXP_LO, 2, LET(cg_neg(g, ahi)), lo2);
    if (!e) return;
    cg_val num = sel(g, ge(g, hi, F(0.0f)), F(1.0f), e);
    gcc_jit_block_end_with_return(g->b, NULL, mul(g, x, dvd(g, num, add(g, F(1.0f), e))));
}

gcc_jit_function *cg_math_get(cg_math *m, gcc_jit_context *ctx, const cg_types *t, cg_mathfn f) {
    static const char *const names[CGM_COUNT] = {
        "em_jit_exp_lo",    "em_jit_expf",     "em_jit_logf", "em_jit_tanhf", "em_jit_sigmoidf",
        "em_jit_erf_small", "em_jit_erfc_mid", "em_jit_erff", "em_jit_geluf", "em_jit_gelu_tanhf"};
    if ((unsigned)f >= CGM_COUNT) return NULL;
    if (m->fn[f]) return m->fn[f];
    cg g = {.ctx = ctx, .t = t};
    cg_val a[2];
    if (!begin(&g, names[f], f == CGM_EXP_LO ? 2 : 1, a)) return NULL;
    /* Stored before the body: a dependency built while emitting it never
     * needs this one (the graph is acyclic). */
    m->fn[f] = g.fn;
    switch (f) {
    case CGM_EXP_LO: build_exp_lo(&g, a[0], a[1]); break;
    case CGM_EXP: {
        cg_val e = call(&g, m, CGM_EXP_LO, 2, a[0], cg_f32(&g, -0.0f));
        if (e) gcc_jit_block_end_with_return(g.b, NULL, e);
        break;
    }
    case CGM_LOG: build_log(&g, a[0]); break;
    case CGM_TANH: build_tanh(&g, m, a[0]); break;
    case CGM_SIGMOID: build_sigmoid(&g, m, a[0]); break;
    case CGM_ERF_SMALL: build_erf_small(&g, a[0]); break;
    case CGM_ERFC_MID: build_erfc_mid(&g, m, a[0]); break;
    case CGM_ERF: build_erf(&g, m, a[0]); break;
    case CGM_GELU: build_gelu(&g, m, a[0]); break;
    case CGM_GELU_TANH: build_gelu_tanh(&g, m, a[0]); break;
    default: break;
    }
    return m->fn[f];
}

gcc_jit_type *cg_dtype(const cg_types *t, em_dtype d) {
    switch (d) {
    case EM_F32: return t->f32;
    case EM_F64: return t->f64;
    case EM_I32: return t->i32;
    case EM_I64: return t->i64;
    case EM_F16:
    case EM_BF16: return t->u16;
    default: return t->u8;
    }
}

/* ---- scalar operations of the kernel IR ---- */

static cg_val ext_call(cg *g, cg_lib *lib, cg_extfn f, cg_val a, cg_val b) {
    static const char *const names[CGX_COUNT] = {
        "__builtin_sqrtf", "__builtin_sqrt", "sinf", "sin", "cosf", "cos", "powf",
        "pow", "exp", "log", "tanh", "erf", "erfc"};
    if (!lib->ext[f]) {
        if (f == CGX_SQRTF || f == CGX_SQRT) {
            lib->ext[f] = gcc_jit_context_get_builtin_function(g->ctx, names[f]);
        } else {
            gcc_jit_type *t =
                (f == CGX_SINF || f == CGX_COSF || f == CGX_POWF) ? g->t->f32 : g->t->f64;
            gcc_jit_param *p[2] = {gcc_jit_context_new_param(g->ctx, NULL, t, "a"),
                                   gcc_jit_context_new_param(g->ctx, NULL, t, "b")};
            lib->ext[f] = gcc_jit_context_new_function(g->ctx, NULL, GCC_JIT_FUNCTION_IMPORTED, t,
                                                       names[f], b ? 2 : 1, p, 0);
            lib->uses_libm = true;
        }
    }
    cg_val args[2] = {a, b};
    return gcc_jit_context_new_call(g->ctx, NULL, lib->ext[f], b ? 2 : 1, args);
}

static cg_val math_call(cg *g, cg_lib *lib, cg_mathfn f, cg_val x) {
    gcc_jit_function *fn = cg_math_get(&lib->math, g->ctx, g->t, f);
    return gcc_jit_context_new_call(g->ctx, NULL, fn, 1, &x);
}

static cg_val zero_of(cg *g, gcc_jit_type *t) { return gcc_jit_context_zero(g->ctx, t); }

/* float max/min that propagate NaN: (a != a || a > b) ? a : b */
static cg_val fminmax(cg *g, bool max, cg_val a, cg_val b) {
    cg_val c = cg_or(g, cg_cmp(g, GCC_JIT_COMPARISON_NE, a, a),
                     cg_cmp(g, max ? GCC_JIT_COMPARISON_GT : GCC_JIT_COMPARISON_LT, a, b));
    return cg_select(g, c, a, b);
}

static cg_val unary_float(cg *g, cg_lib *lib, k_alu op, bool f32, cg_val x) {
    gcc_jit_type *t = f32 ? g->t->f32 : g->t->f64;
    cg_val one = gcc_jit_context_one(g->ctx, t), zero = zero_of(g, t);
    switch (op) {
    case KA_NEG: return cg_neg(g, x);
    case KA_ABS: return cg_fabs(g, x);
    case KA_EXP: return f32 ? math_call(g, lib, CGM_EXP, x) : ext_call(g, lib, CGX_EXP, x, NULL);
    case KA_LOG: return f32 ? math_call(g, lib, CGM_LOG, x) : ext_call(g, lib, CGX_LOG, x, NULL);
    case KA_SQRT: return ext_call(g, lib, f32 ? CGX_SQRTF : CGX_SQRT, x, NULL);
    case KA_RSQRT:
        return cg_bin(g, GCC_JIT_BINARY_OP_DIVIDE, one,
                      cg_let(g, ext_call(g, lib, f32 ? CGX_SQRTF : CGX_SQRT, x, NULL)));
    case KA_SIN: return ext_call(g, lib, f32 ? CGX_SINF : CGX_SIN, x, NULL);
    case KA_COS: return ext_call(g, lib, f32 ? CGX_COSF : CGX_COS, x, NULL);
    case KA_TANH: return f32 ? math_call(g, lib, CGM_TANH, x) : ext_call(g, lib, CGX_TANH, x, NULL);
    case KA_ERF: return f32 ? math_call(g, lib, CGM_ERF, x) : ext_call(g, lib, CGX_ERF, x, NULL);
    case KA_RELU: return cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, x, zero), zero, x);
    case KA_SIGMOID:
    case KA_GELU_TANH: {
        if (f32) return math_call(g, lib, op == KA_SIGMOID ? CGM_SIGMOID : CGM_GELU_TANH, x);
        /* x * sigmoid(y), y = 2 sqrt(2/pi) (x + 0.044715 x^3) for gelu_tanh;
         * sigmoid(y) = (y >= 0 ? 1 : e) / (1 + e), e = exp(-|y|) */
        cg_val y = x;
        if (op == KA_GELU_TANH)
            y = cg_let(
                g, cg_bin(g, GCC_JIT_BINARY_OP_MULT, x,
                          cg_bin(g, GCC_JIT_BINARY_OP_PLUS, cg_f64(g, 1.5957691216057308),
                                 cg_bin(g, GCC_JIT_BINARY_OP_MULT, cg_f64(g, 0.07135481627260025),
                                        cg_bin(g, GCC_JIT_BINARY_OP_MULT, x, x)))));
        cg_val e = cg_let(g, ext_call(g, lib, CGX_EXP, cg_neg(g, cg_fabs(g, y)), NULL));
        cg_val num = cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_GE, y, zero), one, e);
        cg_val s =
            cg_bin(g, GCC_JIT_BINARY_OP_DIVIDE, num, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, one, e));
        return op == KA_SIGMOID ? s : cg_bin(g, GCC_JIT_BINARY_OP_MULT, x, s);
    }
    case KA_GELU:
        if (f32) return math_call(g, lib, CGM_GELU, x);
        /* x/2 erfc(-x/sqrt 2): no cancellation for negative x */
        return cg_bin(g, GCC_JIT_BINARY_OP_MULT,
                      cg_bin(g, GCC_JIT_BINARY_OP_MULT, cg_f64(g, 0.5), x),
                      ext_call(g, lib, CGX_ERFC,
                               cg_bin(g, GCC_JIT_BINARY_OP_MULT, x, cg_f64(g, -M_SQRT1_2)), NULL));
    default: return NULL;
    }
}

/* a op b for same-typed a, b of dtype d (op binary, not a comparison). */
static cg_val binary(cg *g, cg_lib *lib, k_alu op, em_dtype d, cg_val a, cg_val b) {
    gcc_jit_type *t = cg_dtype(g->t, d);
    if (cg_is_float(d)) {
        switch (op) {
        case KA_ADD: return cg_bin(g, GCC_JIT_BINARY_OP_PLUS, a, b);
        case KA_SUB: return cg_bin(g, GCC_JIT_BINARY_OP_MINUS, a, b);
        case KA_MUL: return cg_bin(g, GCC_JIT_BINARY_OP_MULT, a, b);
        case KA_DIV: return cg_bin(g, GCC_JIT_BINARY_OP_DIVIDE, a, b);
        case KA_POW: return ext_call(g, lib, d == EM_F32 ? CGX_POWF : CGX_POW, a, b);
        case KA_MAX: return fminmax(g, true, a, b);
        case KA_MIN: return fminmax(g, false, a, b);
        default: return NULL;
        }
    }
    if (d == EM_BOOL) {
        switch (op) {
        case KA_ADD:
        case KA_MAX: return cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_OR, a, b);
        case KA_MUL:
        case KA_MIN: return cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_AND, a, b);
        case KA_SUB: return cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_XOR, a, b);
        default: return NULL;
        }
    }
    gcc_jit_type *ut = cg_utype(g, t);
    enum gcc_jit_binary_op bop;
    switch (op) {
    case KA_ADD: bop = GCC_JIT_BINARY_OP_PLUS; break;
    case KA_SUB: bop = GCC_JIT_BINARY_OP_MINUS; break;
    case KA_MUL: bop = GCC_JIT_BINARY_OP_MULT; break;
    case KA_MAX: return cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_GT, a, b), a, b);
    case KA_MIN: return cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, a, b), a, b);
    case KA_IDIV:
    case KA_MOD: {
        /* unsigned (operands are non-negative indices); a divisor of 0 acts as 1 */
        cg_val dv = cg_bin(g, GCC_JIT_BINARY_OP_PLUS, cg_cast(g, b, ut),
                           cg_cast(g, cg_cmp(g, GCC_JIT_COMPARISON_EQ, b, zero_of(g, t)), ut));
        cg_val r = cg_bin(g, op == KA_IDIV ? GCC_JIT_BINARY_OP_DIVIDE : GCC_JIT_BINARY_OP_MODULO,
                          cg_cast(g, a, ut), cg_let(g, dv));
        return cg_cast(g, r, t);
    }
    default: return NULL;
    }
    /* i64: signed (index arithmetic, where gcc's no-overflow assumption lets
     * it analyse addresses); i32: wraps like the eager kernels */
    if (d == EM_I64) return cg_bin(g, bop, a, b);
    return cg_cast(g, cg_bin(g, bop, cg_cast(g, a, ut), cg_cast(g, b, ut)), t);
}

cg_val cg_alu(cg *g, cg_lib *lib, k_alu op, em_dtype d, cg_val a, cg_val b, cg_val c) {
    k_alu_shape shape = kir_alu_info(op)->shape;
    if (shape == KS_COMPARE) {
        static const enum gcc_jit_comparison cmp[KA_COUNT] = {
            [KA_EQ] = GCC_JIT_COMPARISON_EQ, [KA_NE] = GCC_JIT_COMPARISON_NE,
            [KA_LT] = GCC_JIT_COMPARISON_LT, [KA_LE] = GCC_JIT_COMPARISON_LE,
            [KA_GT] = GCC_JIT_COMPARISON_GT, [KA_GE] = GCC_JIT_COMPARISON_GE};
        return cg_cast(g, cg_cmp(g, cmp[op], a, b), g->t->u8);
    }
    if (shape == KS_SELECT)
        return cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_NE, a, zero_of(g, g->t->u8)), b, c);
    if (shape == KS_BINARY) return binary(g, lib, op, d, a, b);
    if (cg_is_float(d)) return unary_float(g, lib, op, d == EM_F32, a);
    if (d == EM_BOOL) return NULL;
    gcc_jit_type *t = cg_dtype(g->t, d), *ut = cg_utype(g, t);
    cg_val zero = zero_of(g, t);
    cg_val neg = cg_cast(g, cg_neg(g, cg_cast(g, a, ut)), t); /* wraps */
    cg_val isneg = cg_cmp(g, GCC_JIT_COMPARISON_LT, a, zero);
    switch (op) {
    case KA_NEG: return neg;
    case KA_ABS: return cg_select(g, isneg, cg_let(g, neg), a);
    case KA_RELU: return cg_select(g, isneg, zero, a);
    default: return NULL;
    }
}

/* ---- the half types: bits in a uint16, converted through f32 ----
 * Branch-free (selects), so that loops over them still vectorize. */

/* bf16 bits h -> f32: the top half of the float's bits. */
static cg_val bf16_to_f32(cg *g, cg_val h) { return flt(g, shl(g, cg_cast(g, h, g->t->u32), U(16))); }

/* f32 -> bf16 bits, to nearest even; a NaN stays a (quiet) NaN. */
static cg_val f32_to_bf16(cg *g, cg_val x) {
    cg_val u = LET(bits(g, x));
    cg_val odd = band(g, shr(g, u, U(16)), U(1));
    cg_val r = shr(g, add(g, add(g, u, U(0x7fff)), odd), U(16));
    cg_val nan = gt(g, band(g, u, U(0x7fffffff)), U(0x7f800000));
    return cg_cast(g, sel(g, nan, bor(g, shr(g, u, U(16)), U(0x40)), r), g->t->u16);
}

/* f16 bits h -> f32: normal numbers rebiased, subnormals as their integer
 * times 2^-24 (exact), inf and NaN with the payload kept. */
static cg_val f16_to_f32(cg *g, cg_val h) {
    cg_val w = LET(cg_cast(g, h, g->t->u32));
    cg_val sign = shl(g, band(g, w, U(0x8000)), U(16)), em = LET(band(g, w, U(0x7fff)));
    cg_val normal = add(g, shl(g, em, U(13)), U(112u << 23));
    cg_val special = bor(g, U(0x7f800000), shl(g, band(g, em, U(0x3ff)), U(13)));
    cg_val subn = bits(g, mul(g, cg_cast(g, em, g->t->f32), F(0x1p-24f)));
    cg_val mag = sel(g, ge(g, em, U(0x7c00)), special, sel(g, ge(g, em, U(0x400)), normal, subn));
    return flt(g, bor(g, sign, mag));
}

/* f32 -> f16 bits, to nearest even (F. Giesen's float_to_half_fast3_rtne):
 * NaN quiet, from 65520 on inf, below 2^-14 through the float add that
 * rounds to multiples of 2^-24, else the mantissa rounded in the integer. */
static cg_val f32_to_f16(cg *g, cg_val x) {
    cg_val u = LET(bits(g, x));
    cg_val sign = band(g, shr(g, u, U(16)), U(0x8000)), a = LET(band(g, u, U(0x7fffffff)));
    cg_val nan = bor(g, U(0x7e00), band(g, shr(g, a, U(13)), U(0x3ff)));
    cg_val small = sub(g, bits(g, add(g, flt(g, a), F(0.5f))), U(0x3f000000));
    cg_val odd = band(g, shr(g, a, U(13)), U(1));
    /* rebias the exponent (127 -> 15) and round: 0xc8000000 is -(112 << 23) */
    cg_val normal = shr(g, add(g, add(g, a, U(0xc8000fffu)), odd), U(13));
    cg_val mag = sel(g, gt(g, a, U(0x7f800000)), nan,
                     sel(g, ge(g, a, U(0x477ff000)), U(0x7c00),
                         sel(g, lt(g, a, U(0x38800000)), small, normal)));
    return cg_cast(g, bor(g, sign, mag), g->t->u16);
}

cg_val cg_convert(cg *g, cg_val v, em_dtype from, em_dtype to) {
    if (from == to) return v;
    if (cg_is_half(from)) { /* up to f32 first, exactly */
        cg_val f = cg_let(g, from == EM_BF16 ? bf16_to_f32(g, v) : f16_to_f32(g, v));
        return cg_convert(g, f, EM_F32, to);
    }
    if (cg_is_half(to)) { /* through f32, as torch converts (c10::Half(float(x))) */
        cg_val f = cg_let(g, cg_convert(g, v, from, EM_F32));
        return to == EM_BF16 ? f32_to_bf16(g, f) : f32_to_f16(g, f);
    }
    if (to == EM_BOOL)
        return cg_cast(g, cg_cmp(g, GCC_JIT_COMPARISON_NE, v, zero_of(g, cg_dtype(g->t, from))),
                       g->t->u8);
    /* float to integer: kir_convert has brought v into the integer's range */
    return cg_cast(g, v, cg_dtype(g->t, to));
}

/* ---- order-preserving keys (float max/min reductions) ---- */

/* Integer key of a float whose order is the float order; NaN -> the top
 * (max) or bottom (min) key so that it wins. */
cg_val cg_fkey(cg *g, cg_val v, bool max) {
    bool f32 = gcc_jit_rvalue_get_type(v) == g->t->f32;
    gcc_jit_type *it = f32 ? g->t->i32 : g->t->i64, *ut = f32 ? g->t->u32 : g->t->u64;
    cg_val b = cg_let(g, cg_bitcast(g, v, it));
    cg_val s =
        cg_bin(g, GCC_JIT_BINARY_OP_RSHIFT,
               cg_cast(g, cg_bin(g, GCC_JIT_BINARY_OP_RSHIFT, b, cg_int(g, it, f32 ? 31 : 63)), ut),
               cg_int(g, ut, 1));
    cg_val key = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_XOR, b, cg_cast(g, s, it)));
    int64_t ext = max ? (f32 ? INT32_MAX : INT64_MAX) : (f32 ? INT32_MIN : INT64_MIN);
    return cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_NE, v, v), cg_int(g, it, ext), key);
}

cg_val cg_funkey(cg *g, cg_val key, gcc_jit_type *ft) {
    bool f32 = ft == g->t->f32;
    gcc_jit_type *it = f32 ? g->t->i32 : g->t->i64, *ut = f32 ? g->t->u32 : g->t->u64;
    cg_val s = cg_bin(
        g, GCC_JIT_BINARY_OP_RSHIFT,
        cg_cast(g, cg_bin(g, GCC_JIT_BINARY_OP_RSHIFT, key, cg_int(g, it, f32 ? 31 : 63)), ut),
        cg_int(g, ut, 1));
    return cg_bitcast(g, cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_XOR, key, cg_cast(g, s, it)), ft);
}

/* if (v CMP l) l = v;  (gcc's phiopt makes it a MAX_EXPR/MIN_EXPR) */
