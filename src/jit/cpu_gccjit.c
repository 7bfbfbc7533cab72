/* cpu_gccjit.c - kernel IR -> libgccjit -> native code (see cpu_gccjit.h).
 *
 * Emission walks the linear IR once.  Every value is assigned to a fresh
 * local at its position (SSA by construction: a load keeps the value it
 * read even if a later store changes memory); gcc's SSA passes remove the
 * locals.  K_RANGE/K_END become a counted loop, condition at the top:
 *
 *     i = lo; goto cond;  cond: if (i < hi) goto body; else goto after;
 *     body: ...; i += 1; goto cond;  after:
 *
 * Reductions.  An innermost loop that updates float accumulators not read
 * inside it is emitted specially:
 *  - add: partial sums in a local array p[U] (U = 16 for f32, 8 for f64),
 *        a main loop over blocks of U iterations whose inner loop
 *        (u = 0..U-1) adds iteration jb + u into p[u], then the partial
 *        sums are added pairwise into the accumulator and a remainder loop
 *        runs the last < U iterations in order.  The inner loop is a plain
 *        element-wise loop over p, which gcc vectorizes (or unrolls and
 *        SLP-vectorizes as U independent reductions): no reassociation of
 *        any single chain is needed, so no -ffast-math.
 *  - max/min: the running value is kept as an order-preserving integer key
 *        (sign-magnitude to two's complement; NaN maps to the extreme, so
 *        it wins as the eager kernels' NaN-propagating max does) and
 *        updated with `if (k' > k) k = k'`, which gcc turns into MAX_EXPR,
 *        an integer reduction it vectorizes; converted back after the loop.
 * Integer accumulators need nothing (integer reductions vectorize). */
#include "cpu_gccjit.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_gccjit_impl.h"

/* Operations per parallel chunk below which a thread is not worth waking. */
#define GRAIN_WORK 65536.0
/* Guess for an inner loop extent unknown before the parallel loop. */
#define UNKNOWN_EXTENT 16.0
#define MAX_NAME 200

typedef int64_t (*plan_fn)(void *const *bufs, const int64_t *sizes, double *work);

struct jit_cpu_kernel {
    jit_cpu_fn fn;
    plan_fn plan;
    gcc_jit_result *result; /* in-process compile */
    void *dl;               /* load_so */
    const em_allocator *alloc;
};

/* libm and builtins called by kernels */
typedef enum ext_fn {
    X_SQRTF, X_SQRT, X_SINF, X_SIN, X_COSF, X_COS, X_POWF, X_POW,
    X_EXP, X_LOG, X_TANH, X_ERF, X_ERFC, X_COUNT
} ext_fn;

enum { ACC_PLAIN, ACC_PARTS, ACC_KEY };

typedef struct kgen {
    cg g;
    cg_types T;
    cg_math math;
    gcc_jit_function *ext[X_COUNT];
    bool uses_libm;
    const k_kernel *k;
    int *match;          /* K_RANGE -> its K_END */
    cg_val *val;         /* value of each instruction */
    gcc_jit_lvalue **acc, **part, **key;
    unsigned char *mode; /* ACC_* per K_ACC */
    int *accbuf;         /* scratch: accumulators of one loop */
    cg_val *mult;        /* scratch: the plan's extent products */
    cg_val u;            /* partial-sum index inside a split loop */
    cg_val bufs, sizes, begin, end;
} kgen;

static bool is_float(em_dtype d) { return d == EM_F32 || d == EM_F64; }
static bool is_int(em_dtype d) { return d == EM_I32 || d == EM_I64; }
static bool is_compare(k_alu a) { return a >= KA_EQ && a <= KA_GE; }

static gcc_jit_type *ty_of(kgen *G, em_dtype d) {
    switch (d) {
    case EM_F32: return G->T.f32;
    case EM_F64: return G->T.f64;
    case EM_I32: return G->T.i32;
    case EM_I64: return G->T.i64;
    default: return G->T.u8;
    }
}

/* ---- checks beyond kir_verify ---- */

static int arity(const k_inst *in) {
    switch (in->op) {
    case K_RANGE: case K_CAST: case K_ACC: return 1;
    case K_LOAD: case K_ACC_UPDATE: return 2;
    case K_STORE: return 3;
    case K_ALU:
        if (in->alu >= KA_NEG && in->alu <= KA_ERF) return 1;
        if (in->alu >= KA_ADD && in->alu <= KA_GE) return 2;
        return in->alu == KA_WHERE ? 3 : -1;
    default: return 0;
    }
}

static bool alu_supported(k_alu a, em_dtype d) {
    if (is_compare(a) || a == KA_WHERE) return true;
    if (is_float(d)) return a != KA_IDIV && a != KA_MOD;
    if (is_int(d))
        return a == KA_NEG || a == KA_ABS || a == KA_RELU || a == KA_ADD || a == KA_SUB ||
               a == KA_MUL || a == KA_MAX || a == KA_MIN || a == KA_IDIV || a == KA_MOD;
    return a == KA_ADD || a == KA_SUB || a == KA_MUL || a == KA_MAX || a == KA_MIN;
}

static em_status check_kernel(const k_kernel *k) {
    if (!k) return em_error_null("jit_cpu_compile", "k");
    if (!k->name || !k->name[0] || strlen(k->name) > MAX_NAME)
        return em_error(EM_ERR_ARG, "jit_cpu: kernel name missing or too long");
    for (const char *c = k->name; *c; c++)
        if (!(*c == '_' || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
              (c > k->name && *c >= '0' && *c <= '9')))
            return em_error(EM_ERR_ARG, "jit_cpu: kernel name '%s' is not a C identifier", k->name);
    if (k->n < 0 || (k->n > 0 && !k->insts)) return em_error(EM_ERR_ARG, "jit_cpu: %s: no instructions", k->name);
    /* shape first, so that kir_verify reads only what exists */
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        if ((unsigned)in->op > K_ACC_UPDATE || in->nsrc != arity(in))
            return em_error(EM_ERR_ARG, "jit_cpu: %s: instruction %%%d: bad opcode or operand count",
                            k->name, i);
    }
    char msg[512];
    if (kir_verify(k) != EM_OK) {
        snprintf(msg, sizeof msg, "%s", em_last_error());
        return em_error(EM_ERR_ARG, "%s", msg);
    }
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        const k_inst *s0 = in->nsrc > 0 ? &k->insts[in->src[0]] : NULL;
        em_dtype d = in->dtype;
        const char *bad = NULL, *unsup = NULL;
        bool has_value = in->op != K_STORE && in->op != K_END;
        if (has_value && (unsigned)d >= EM_DTYPE_COUNT) bad = "invalid dtype";
        else if (has_value && (d == EM_F16 || d == EM_BF16)) unsup = "f16/bf16 are not supported";
        else switch (in->op) {
        case K_BUF: if (in->ival < 0 || in->ival >= k->nbufs) bad = "buffer number out of range"; break;
        case K_SIZE:
            if (in->ival < 0 || in->ival >= k->nsizes) bad = "size number out of range";
            else if (d != EM_I64) bad = "size not i64";
            break;
        case K_RANGE: if (d != EM_I64) bad = "range variable not i64"; break;
        case K_LOAD: if (d != s0->dtype) bad = "load dtype differs from the buffer's"; break;
        case K_ALU: {
            em_dtype od = k->insts[in->src[in->alu == KA_WHERE ? 1 : 0]].dtype;
            if (d != (is_compare(in->alu) ? EM_BOOL : od)) bad = "alu result dtype";
            else if (!alu_supported(in->alu, od)) unsup = kir_alu_name(in->alu);
            break;
        }
        case K_CAST:
            if (s0->dtype == EM_F16 || s0->dtype == EM_BF16) unsup = "f16/bf16 are not supported";
            break;
        case K_ACC:
            if (d != s0->dtype) bad = "accumulator dtype differs from its init";
            else if (in->alu != KA_ADD && in->alu != KA_MAX && in->alu != KA_MIN) bad = "accumulator op";
            break;
        case K_ACC_UPDATE:
            if (k->insts[in->src[1]].dtype != s0->dtype) bad = "update dtype differs from the accumulator's";
            break;
        default: break;
        }
        if (bad) return em_error(EM_ERR_ARG, "jit_cpu: %s: instruction %%%d: %s", k->name, i, bad);
        if (unsup)
            return em_error(EM_ERR_UNSUPPORTED, "jit_cpu: %s: instruction %%%d: %s on %s not supported",
                            k->name, i, unsup, em_dtype_name(in->nsrc ? s0->dtype : d));
    }
    return EM_OK;
}

/* ---- calls ---- */

static cg_val ext_call(kgen *G, ext_fn f, cg_val a, cg_val b) {
    static const char *const names[X_COUNT] = {"__builtin_sqrtf", "__builtin_sqrt", "sinf", "sin",
                                               "cosf", "cos", "powf", "pow", "exp", "log", "tanh",
                                               "erf", "erfc"};
    cg *g = &G->g;
    if (!G->ext[f]) {
        if (f == X_SQRTF || f == X_SQRT) {
            G->ext[f] = gcc_jit_context_get_builtin_function(g->ctx, names[f]);
        } else {
            gcc_jit_type *t = (f == X_SINF || f == X_COSF || f == X_POWF) ? G->T.f32 : G->T.f64;
            gcc_jit_param *p[2] = {gcc_jit_context_new_param(g->ctx, NULL, t, "a"),
                                   gcc_jit_context_new_param(g->ctx, NULL, t, "b")};
            G->ext[f] = gcc_jit_context_new_function(g->ctx, NULL, GCC_JIT_FUNCTION_IMPORTED, t, names[f],
                                                     b ? 2 : 1, p, 0);
            G->uses_libm = true;
        }
    }
    cg_val args[2] = {a, b};
    return gcc_jit_context_new_call(g->ctx, NULL, G->ext[f], b ? 2 : 1, args);
}

static cg_val math_call(kgen *G, cg_mathfn f, cg_val x) {
    gcc_jit_function *fn = cg_math_get(&G->math, G->g.ctx, &G->T, f);
    return gcc_jit_context_new_call(G->g.ctx, NULL, fn, 1, &x);
}

/* ---- scalar operations ---- */

static cg_val zero_of(kgen *G, gcc_jit_type *t) { return gcc_jit_context_zero(G->g.ctx, t); }

/* float max/min that propagate NaN: (a != a || a > b) ? a : b */
static cg_val fminmax(kgen *G, bool max, cg_val a, cg_val b) {
    cg *g = &G->g;
    cg_val c = cg_or(g, cg_cmp(g, GCC_JIT_COMPARISON_NE, a, a),
                     cg_cmp(g, max ? GCC_JIT_COMPARISON_GT : GCC_JIT_COMPARISON_LT, a, b));
    return cg_select(g, c, a, b);
}

static cg_val unary_float(kgen *G, k_alu op, bool f32, cg_val x) {
    cg *g = &G->g;
    gcc_jit_type *t = f32 ? G->T.f32 : G->T.f64;
    cg_val one = gcc_jit_context_one(g->ctx, t), zero = zero_of(G, t);
    switch (op) {
    case KA_NEG: return cg_neg(g, x);
    case KA_ABS: return cg_fabs(g, x);
    case KA_EXP: return f32 ? math_call(G, CGM_EXP, x) : ext_call(G, X_EXP, x, NULL);
    case KA_LOG: return f32 ? math_call(G, CGM_LOG, x) : ext_call(G, X_LOG, x, NULL);
    case KA_SQRT: return ext_call(G, f32 ? X_SQRTF : X_SQRT, x, NULL);
    case KA_RSQRT:
        return cg_bin(g, GCC_JIT_BINARY_OP_DIVIDE, one, cg_let(g, ext_call(G, f32 ? X_SQRTF : X_SQRT, x, NULL)));
    case KA_SIN: return ext_call(G, f32 ? X_SINF : X_SIN, x, NULL);
    case KA_COS: return ext_call(G, f32 ? X_COSF : X_COS, x, NULL);
    case KA_TANH: return f32 ? math_call(G, CGM_TANH, x) : ext_call(G, X_TANH, x, NULL);
    case KA_ERF: return f32 ? math_call(G, CGM_ERF, x) : ext_call(G, X_ERF, x, NULL);
    case KA_RELU: return cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, x, zero), zero, x);
    case KA_SIGMOID:
    case KA_GELU_TANH: {
        if (f32) return math_call(G, op == KA_SIGMOID ? CGM_SIGMOID : CGM_GELU_TANH, x);
        /* x * sigmoid(y), y = 2 sqrt(2/pi) (x + 0.044715 x^3) for gelu_tanh;
         * sigmoid(y) = (y >= 0 ? 1 : e) / (1 + e), e = exp(-|y|) */
        cg_val y = x;
        if (op == KA_GELU_TANH)
            y = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_MULT, x,
                                 cg_bin(g, GCC_JIT_BINARY_OP_PLUS, cg_f64(g, 1.5957691216057308),
                                        cg_bin(g, GCC_JIT_BINARY_OP_MULT, cg_f64(g, 0.07135481627260025),
                                               cg_bin(g, GCC_JIT_BINARY_OP_MULT, x, x)))));
        cg_val e = cg_let(g, ext_call(G, X_EXP, cg_neg(g, cg_fabs(g, y)), NULL));
        cg_val num = cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_GE, y, zero), one, e);
        cg_val s = cg_bin(g, GCC_JIT_BINARY_OP_DIVIDE, num, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, one, e));
        return op == KA_SIGMOID ? s : cg_bin(g, GCC_JIT_BINARY_OP_MULT, x, s);
    }
    case KA_GELU:
        if (f32) return math_call(G, CGM_GELU, x);
        /* x/2 erfc(-x/sqrt 2): no cancellation for negative x */
        return cg_bin(g, GCC_JIT_BINARY_OP_MULT, cg_bin(g, GCC_JIT_BINARY_OP_MULT, cg_f64(g, 0.5), x),
                      ext_call(G, X_ERFC, cg_bin(g, GCC_JIT_BINARY_OP_MULT, x, cg_f64(g, -M_SQRT1_2)), NULL));
    default: return NULL;
    }
}

/* a op b for same-typed a, b of dtype d (op binary, not a comparison). */
static cg_val binary(kgen *G, k_alu op, em_dtype d, cg_val a, cg_val b) {
    cg *g = &G->g;
    gcc_jit_type *t = ty_of(G, d);
    if (is_float(d)) {
        switch (op) {
        case KA_ADD: return cg_bin(g, GCC_JIT_BINARY_OP_PLUS, a, b);
        case KA_SUB: return cg_bin(g, GCC_JIT_BINARY_OP_MINUS, a, b);
        case KA_MUL: return cg_bin(g, GCC_JIT_BINARY_OP_MULT, a, b);
        case KA_DIV: return cg_bin(g, GCC_JIT_BINARY_OP_DIVIDE, a, b);
        case KA_POW: return ext_call(G, d == EM_F32 ? X_POWF : X_POW, a, b);
        case KA_MAX: return fminmax(G, true, a, b);
        case KA_MIN: return fminmax(G, false, a, b);
        default: return NULL;
        }
    }
    if (d == EM_BOOL) {
        switch (op) {
        case KA_ADD: case KA_MAX: return cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_OR, a, b);
        case KA_MUL: case KA_MIN: return cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_AND, a, b);
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
                           cg_cast(g, cg_cmp(g, GCC_JIT_COMPARISON_EQ, b, zero_of(G, t)), ut));
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

static cg_val emit_alu(kgen *G, const k_inst *in) {
    cg *g = &G->g;
    const k_kernel *k = G->k;
    cg_val a = G->val[in->src[0]];
    cg_val b = in->nsrc > 1 ? G->val[in->src[1]] : NULL, c = in->nsrc > 2 ? G->val[in->src[2]] : NULL;
    em_dtype d = k->insts[in->src[0]].dtype;
    if (is_compare(in->alu)) {
        static const enum gcc_jit_comparison cmp[] = {GCC_JIT_COMPARISON_EQ, GCC_JIT_COMPARISON_NE,
                                                      GCC_JIT_COMPARISON_LT, GCC_JIT_COMPARISON_LE,
                                                      GCC_JIT_COMPARISON_GT, GCC_JIT_COMPARISON_GE};
        return cg_cast(g, cg_cmp(g, cmp[in->alu - KA_EQ], a, b), G->T.u8);
    }
    if (in->alu == KA_WHERE) return cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_NE, a, zero_of(G, G->T.u8)), b, c);
    if (in->nsrc == 2) return binary(G, in->alu, d, a, b);
    if (is_float(d)) return unary_float(G, in->alu, d == EM_F32, a);
    if (d == EM_BOOL) return NULL;
    gcc_jit_type *t = ty_of(G, d), *ut = cg_utype(g, t);
    cg_val zero = zero_of(G, t);
    cg_val neg = cg_cast(g, cg_neg(g, cg_cast(g, a, ut)), t); /* wraps */
    cg_val isneg = cg_cmp(g, GCC_JIT_COMPARISON_LT, a, zero);
    switch (in->alu) {
    case KA_NEG: return neg;
    case KA_ABS: return cg_select(g, isneg, cg_let(g, neg), a);
    case KA_RELU: return cg_select(g, isneg, zero, a);
    default: return NULL;
    }
}

/* Float to i32/i64 as the eager kernels do: through double, truncated,
 * saturated, NaN -> 0. */
static cg_val float_to_int(kgen *G, cg_val v, em_dtype to) {
    cg *g = &G->g;
    cg_val x = cg_let(g, cg_cast(g, v, G->T.f64));
    gcc_jit_type *t = ty_of(G, to);
    double top = to == EM_I64 ? 9223372036854775808.0 : 2147483647.0;
    double bot = to == EM_I64 ? -9223372036854775808.0 : -2147483648.0;
    cg_val hi = cg_let(g, cg_cmp(g, GCC_JIT_COMPARISON_GE, x, cg_f64(g, top)));
    cg_val lo = cg_let(g, cg_cmp(g, GCC_JIT_COMPARISON_LE, x, cg_f64(g, bot)));
    cg_val out = cg_or(g, cg_cmp(g, GCC_JIT_COMPARISON_NE, x, x), cg_or(g, hi, lo));
    cg_val safe = cg_select(g, out, cg_f64(g, 0.0), x);
    cg_val r = cg_let(g, cg_cast(g, safe, t));
    r = cg_select(g, hi, cg_int(g, t, to == EM_I64 ? INT64_MAX : INT32_MAX), r);
    return cg_select(g, lo, cg_int(g, t, to == EM_I64 ? INT64_MIN : INT32_MIN), r);
}

static cg_val emit_cast(kgen *G, const k_inst *in) {
    cg *g = &G->g;
    em_dtype from = G->k->insts[in->src[0]].dtype, to = in->dtype;
    cg_val v = G->val[in->src[0]];
    if (from == to) return v;
    if (to == EM_BOOL)
        return cg_cast(g, cg_cmp(g, GCC_JIT_COMPARISON_NE, v, zero_of(G, ty_of(G, from))), G->T.u8);
    if (is_float(from) && is_int(to)) return float_to_int(G, v, to);
    return cg_cast(g, v, ty_of(G, to));
}

/* ---- accumulators ---- */

/* Integer key of a float whose order is the float order; NaN -> the top
 * (max) or bottom (min) key so that it wins. */
static cg_val fkey(kgen *G, cg_val v, bool max) {
    cg *g = &G->g;
    bool f32 = gcc_jit_rvalue_get_type(v) == G->T.f32;
    gcc_jit_type *it = f32 ? G->T.i32 : G->T.i64, *ut = f32 ? G->T.u32 : G->T.u64;
    cg_val b = cg_let(g, cg_bitcast(g, v, it));
    cg_val s = cg_bin(g, GCC_JIT_BINARY_OP_RSHIFT, cg_cast(g, cg_bin(g, GCC_JIT_BINARY_OP_RSHIFT, b, cg_int(g, it, f32 ? 31 : 63)), ut),
                      cg_int(g, ut, 1));
    cg_val key = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_XOR, b, cg_cast(g, s, it)));
    int64_t ext = max ? (f32 ? INT32_MAX : INT64_MAX) : (f32 ? INT32_MIN : INT64_MIN);
    return cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_NE, v, v), cg_int(g, it, ext), key);
}

static cg_val funkey(kgen *G, cg_val key, gcc_jit_type *ft) {
    cg *g = &G->g;
    bool f32 = ft == G->T.f32;
    gcc_jit_type *it = f32 ? G->T.i32 : G->T.i64, *ut = f32 ? G->T.u32 : G->T.u64;
    cg_val s = cg_bin(g, GCC_JIT_BINARY_OP_RSHIFT, cg_cast(g, cg_bin(g, GCC_JIT_BINARY_OP_RSHIFT, key, cg_int(g, it, f32 ? 31 : 63)), ut),
                      cg_int(g, ut, 1));
    return cg_bitcast(g, cg_bin(g, GCC_JIT_BINARY_OP_BITWISE_XOR, key, cg_cast(g, s, it)), ft);
}

/* if (v CMP l) l = v;  (gcc's phiopt makes it a MAX_EXPR/MIN_EXPR) */
static void if_replace(kgen *G, gcc_jit_lvalue *l, cg_val v, bool max) {
    cg *g = &G->g;
    gcc_jit_block *then = cg_block(g, "upd"), *join = cg_block(g, "join");
    cg_val c = cg_cmp(g, max ? GCC_JIT_COMPARISON_GT : GCC_JIT_COMPARISON_LT, v, gcc_jit_lvalue_as_rvalue(l));
    gcc_jit_block_end_with_conditional(g->b, NULL, c, then, join);
    gcc_jit_block_add_assignment(then, NULL, l, v);
    gcc_jit_block_end_with_jump(then, NULL, join);
    g->b = join;
}

static void emit_update(kgen *G, const k_inst *in) {
    cg *g = &G->g;
    int a = in->src[0];
    const k_inst *acc = &G->k->insts[a];
    cg_val v = G->val[in->src[1]];
    bool max = acc->alu == KA_MAX;
    if (G->mode[a] == ACC_PARTS) {
        gcc_jit_lvalue *p = gcc_jit_context_new_array_access(g->ctx, NULL, gcc_jit_lvalue_as_rvalue(G->part[a]), G->u);
        gcc_jit_block_add_assignment_op(g->b, NULL, p, GCC_JIT_BINARY_OP_PLUS, v);
    } else if (G->mode[a] == ACC_KEY) {
        if_replace(G, G->key[a], cg_let(g, fkey(G, v, max)), max);
    } else if (is_int(acc->dtype) && acc->alu != KA_ADD) {
        if_replace(G, G->acc[a], v, max);
    } else {
        cg_val r = binary(G, acc->alu, acc->dtype, gcc_jit_lvalue_as_rvalue(G->acc[a]), v);
        gcc_jit_block_add_assignment(g->b, NULL, G->acc[a], r);
    }
}

/* ---- instructions and loops ---- */

static void emit_inst(kgen *G, int i) {
    cg *g = &G->g;
    const k_inst *in = &G->k->insts[i];
    cg_val *val = G->val;
    switch (in->op) {
    case K_BUF: {
        cg_val p = gcc_jit_lvalue_as_rvalue(gcc_jit_context_new_array_access(g->ctx, NULL, G->bufs, cg_int(g, G->T.i64, in->ival)));
        val[i] = cg_let(g, cg_cast(g, p, gcc_jit_type_get_pointer(ty_of(G, in->dtype))));
        break;
    }
    case K_SIZE:
        val[i] = cg_let(g, gcc_jit_lvalue_as_rvalue(gcc_jit_context_new_array_access(g->ctx, NULL, G->sizes, cg_int(g, G->T.i64, in->ival))));
        break;
    case K_CONST:
        if (is_float(in->dtype)) val[i] = gcc_jit_context_new_rvalue_from_double(g->ctx, ty_of(G, in->dtype), in->fval);
        else val[i] = cg_int(g, ty_of(G, in->dtype), in->dtype == EM_BOOL ? in->ival != 0 : in->ival);
        break;
    case K_LOAD:
        val[i] = cg_let(g, gcc_jit_lvalue_as_rvalue(gcc_jit_context_new_array_access(g->ctx, NULL, val[in->src[0]], val[in->src[1]])));
        break;
    case K_STORE:
        gcc_jit_block_add_assignment(g->b, NULL, gcc_jit_context_new_array_access(g->ctx, NULL, val[in->src[0]], val[in->src[1]]),
                                     val[in->src[2]]);
        break;
    case K_ALU: val[i] = cg_let(g, emit_alu(G, in)); break;
    case K_CAST: val[i] = cg_let(g, emit_cast(G, in)); break;
    case K_ACC:
        G->acc[i] = cg_local(g, ty_of(G, in->dtype), "acc");
        gcc_jit_block_add_assignment(g->b, NULL, G->acc[i], val[in->src[0]]);
        val[i] = gcc_jit_lvalue_as_rvalue(G->acc[i]);
        G->mode[i] = ACC_PLAIN;
        break;
    case K_ACC_UPDATE: emit_update(G, in); break;
    default: break;
    }
}

static void emit_range(kgen *G, int r);

static void emit_seq(kgen *G, int from, int to) {
    for (int i = from; i < to; i++) {
        if (G->k->insts[i].op == K_RANGE) {
            emit_range(G, i);
            i = G->match[i];
        } else {
            emit_inst(G, i);
        }
    }
}

/* for (i = lo; i < hi; i++) body of range r */
static void emit_loop(kgen *G, int r, cg_val lo, cg_val hi) {
    cg *g = &G->g;
    gcc_jit_lvalue *iv = cg_local(g, G->T.i64, "i");
    gcc_jit_block *cond = cg_block(g, "cond"), *body = cg_block(g, "body"), *after = cg_block(g, "after");
    gcc_jit_block_add_assignment(g->b, NULL, iv, lo);
    gcc_jit_block_end_with_jump(g->b, NULL, cond);
    gcc_jit_block_end_with_conditional(cond, NULL, cg_cmp(g, GCC_JIT_COMPARISON_LT, gcc_jit_lvalue_as_rvalue(iv), hi), body, after);
    g->b = body;
    G->val[r] = gcc_jit_lvalue_as_rvalue(iv);
    emit_seq(G, r + 1, G->match[r]);
    gcc_jit_block_add_assignment_op(g->b, NULL, iv, GCC_JIT_BINARY_OP_PLUS, gcc_jit_context_one(g->ctx, G->T.i64));
    gcc_jit_block_end_with_jump(g->b, NULL, cond);
    g->b = after;
}

/* Is accumulator a read inside (r, end) other than as its own update's target? */
static bool acc_read_in(const k_kernel *k, int a, int r, int end) {
    for (int i = r + 1; i < end; i++)
        for (int s = 0; s < k->insts[i].nsrc; s++)
            if (k->insts[i].src[s] == a && !(k->insts[i].op == K_ACC_UPDATE && s == 0)) return true;
    return false;
}

/* The innermost loop r with float reductions (see the file comment). */
static void emit_reduction_loop(kgen *G, int r, cg_val lo, cg_val hi, const int *accs, int na) {
    cg *g = &G->g;
    const k_kernel *k = G->k;
    int U = 8;
    bool parts = false;
    for (int j = 0; j < na; j++) {
        const k_inst *a = &k->insts[accs[j]];
        if (a->alu == KA_ADD) {
            parts = true;
            if (a->dtype == EM_F32) U = 16;
        }
    }
    for (int j = 0; j < na; j++) {
        int a = accs[j];
        const k_inst *in = &k->insts[a];
        gcc_jit_type *t = ty_of(G, in->dtype);
        if (in->alu == KA_ADD) {
            G->part[a] = cg_local(g, gcc_jit_context_new_array_type(g->ctx, NULL, t, U), "part");
            for (int u = 0; u < U; u++)
                gcc_jit_block_add_assignment(g->b, NULL,
                                             gcc_jit_context_new_array_access(g->ctx, NULL, gcc_jit_lvalue_as_rvalue(G->part[a]), cg_int(g, G->T.i64, u)),
                                             gcc_jit_context_new_rvalue_from_double(g->ctx, t, -0.0));
            G->mode[a] = ACC_PARTS;
        } else {
            G->key[a] = cg_local(g, in->dtype == EM_F32 ? G->T.i32 : G->T.i64, "key");
            gcc_jit_block_add_assignment(g->b, NULL, G->key[a], fkey(G, gcc_jit_lvalue_as_rvalue(G->acc[a]), in->alu == KA_MAX));
            G->mode[a] = ACC_KEY;
        }
    }
    if (parts) {
        /* for (jb = lo; hi - jb >= U; jb += U) for (u = 0; u < U; u++) body(jb + u) */
        gcc_jit_lvalue *jb = cg_local(g, G->T.i64, "jb"), *u = cg_local(g, G->T.i64, "u");
        gcc_jit_block *c1 = cg_block(g, "blk"), *pre = cg_block(g, "pre"), *c2 = cg_block(g, "ucond"),
                      *body = cg_block(g, "ubody"), *step = cg_block(g, "step"), *rem = cg_block(g, "rem");
        cg_val jbv = gcc_jit_lvalue_as_rvalue(jb), uv = gcc_jit_lvalue_as_rvalue(u);
        cg_val Uv = cg_int(g, G->T.i64, U);
        gcc_jit_block_add_assignment(g->b, NULL, jb, lo);
        gcc_jit_block_end_with_jump(g->b, NULL, c1);
        gcc_jit_block_end_with_conditional(c1, NULL, cg_cmp(g, GCC_JIT_COMPARISON_GE, cg_bin(g, GCC_JIT_BINARY_OP_MINUS, hi, jbv), Uv), pre, rem);
        gcc_jit_block_add_assignment(pre, NULL, u, zero_of(G, G->T.i64));
        gcc_jit_block_end_with_jump(pre, NULL, c2);
        gcc_jit_block_end_with_conditional(c2, NULL, cg_cmp(g, GCC_JIT_COMPARISON_LT, uv, Uv), body, step);
        g->b = body;
        G->u = uv;
        G->val[r] = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, jbv, uv));
        emit_seq(G, r + 1, G->match[r]);
        gcc_jit_block_add_assignment_op(g->b, NULL, u, GCC_JIT_BINARY_OP_PLUS, gcc_jit_context_one(g->ctx, G->T.i64));
        gcc_jit_block_end_with_jump(g->b, NULL, c2);
        gcc_jit_block_add_assignment_op(step, NULL, jb, GCC_JIT_BINARY_OP_PLUS, Uv);
        gcc_jit_block_end_with_jump(step, NULL, c1);
        g->b = rem;
        G->u = NULL;
        /* acc += ((p0 + p1) + (p2 + p3)) + ... */
        for (int j = 0; j < na; j++) {
            int a = accs[j];
            if (G->mode[a] != ACC_PARTS) continue;
            cg_val s[16];
            for (int i = 0; i < U; i++)
                s[i] = gcc_jit_lvalue_as_rvalue(gcc_jit_context_new_array_access(g->ctx, NULL, gcc_jit_lvalue_as_rvalue(G->part[a]), cg_int(g, G->T.i64, i)));
            for (int n = U; n > 1; n /= 2)
                for (int i = 0; i < n / 2; i++) s[i] = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, s[2 * i], s[2 * i + 1]));
            gcc_jit_block_add_assignment_op(g->b, NULL, G->acc[a], GCC_JIT_BINARY_OP_PLUS, s[0]);
            G->mode[a] = ACC_PLAIN;
        }
        lo = cg_let(g, jbv);
    }
    emit_loop(G, r, lo, hi);
    for (int j = 0; j < na; j++) {
        int a = accs[j];
        if (G->mode[a] != ACC_KEY) continue;
        gcc_jit_block_add_assignment(g->b, NULL, G->acc[a], funkey(G, gcc_jit_lvalue_as_rvalue(G->key[a]), ty_of(G, k->insts[a].dtype)));
        G->mode[a] = ACC_PLAIN;
    }
}

static void emit_range(kgen *G, int r) {
    cg *g = &G->g;
    const k_kernel *k = G->k;
    const k_inst *in = &k->insts[r];
    int end = G->match[r];
    cg_val ext = G->val[in->src[0]], lo, hi;
    if (in->flags & K_PARALLEL) {
        /* [max(begin, 0), min(end, extent)) */
        cg_val zero = zero_of(G, G->T.i64);
        lo = cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, G->begin, zero), zero, G->begin);
        hi = cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_GT, G->end, ext), ext, G->end);
    } else {
        lo = zero_of(G, G->T.i64);
        hi = ext;
    }
    bool innermost = true;
    for (int i = r + 1; i < end; i++)
        if (k->insts[i].op == K_RANGE) innermost = false;
    int na = 0, *accs = G->accbuf;
    if (innermost)
        for (int i = r + 1; i < end; i++) {
            const k_inst *u = &k->insts[i];
            if (u->op != K_ACC_UPDATE || !is_float(k->insts[u->src[0]].dtype)) continue;
            bool seen = false;
            for (int j = 0; j < na; j++) seen |= accs[j] == u->src[0];
            if (!seen && !acc_read_in(k, u->src[0], r, end)) accs[na++] = u->src[0];
        }
    if (na > 0) emit_reduction_loop(G, r, lo, hi, accs, na);
    else emit_loop(G, r, lo, hi);
}

/* ---- the plan function ---- */

/* Index of the parallel range, or -1; *serial when the kernel cannot be
 * split (work outside the parallel loop that threads would repeat). */
static int parallel_range(const k_kernel *k, const int *match, bool *serial) {
    int p = -1;
    for (int i = 0; i < k->n; i++)
        if (k->insts[i].op == K_RANGE && (k->insts[i].flags & K_PARALLEL)) {
            p = i;
            break;
        }
    *serial = p < 0;
    if (p < 0) return -1;
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        if (i == p) {
            for (int j = p + 1; j < match[p]; j++)
                if (k->insts[j].op == K_ACC_UPDATE && k->insts[j].src[0] < p) *serial = true;
            i = match[p];
        } else if (in->op == K_RANGE || in->op == K_STORE) {
            *serial = true;
        }
    }
    return p;
}

static double inst_cost(const k_inst *in) {
    switch (in->op) {
    case K_LOAD: case K_STORE: case K_CAST: case K_ACC_UPDATE: return 1;
    case K_ALU:
        return (in->alu >= KA_EXP && in->alu <= KA_ERF && in->alu != KA_RELU && in->alu != KA_SQRT) ||
                       in->alu == KA_POW ? 10 : 1;
    default: return 0;
    }
}

static void mark_needed(const k_kernel *k, int v, bool *need) {
    if (need[v]) return;
    need[v] = true;
    for (int s = 0; s < k->insts[v].nsrc; s++) mark_needed(k, k->insts[v].src[s], need);
}

static void emit_plan(kgen *G, gcc_jit_function *fn, gcc_jit_param **prm, bool *need) {
    cg *g = &G->g;
    const k_kernel *k = G->k;
    g->fn = fn;
    g->b = gcc_jit_function_new_block(fn, "entry");
    G->bufs = gcc_jit_param_as_rvalue(prm[0]);
    G->sizes = gcc_jit_param_as_rvalue(prm[1]);
    gcc_jit_lvalue *work = gcc_jit_rvalue_dereference(gcc_jit_param_as_rvalue(prm[2]), NULL);
    bool serial;
    int p = parallel_range(k, G->match, &serial);
    if (serial) {
        gcc_jit_block_add_assignment(g->b, NULL, work, cg_f64(g, 0.0));
        gcc_jit_block_end_with_return(g->b, NULL, cg_int(g, G->T.i64, -1));
        return;
    }
    int end = G->match[p];
    mark_needed(k, k->insts[p].src[0], need);
    for (int i = p + 1; i < end; i++)
        if (k->insts[i].op == K_RANGE && k->insts[i].src[0] < p) mark_needed(k, k->insts[i].src[0], need);
    for (int i = 0; i < k->n; i++) G->val[i] = NULL;
    for (int i = 0; i < p; i++)
        if (need[i]) emit_inst(G, i);
    /* work = sum over loops R in the parallel body of cost(R's own
     * instructions) * product of the extents from the body down to R */
    cg_val *mult = G->mult;
    int depth = 0;
    mult[0] = cg_f64(g, 1.0);
    cg_val total = cg_f64(g, 0.0);
    double own = 0;
    for (int i = p + 1; i < end; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op == K_RANGE) {
            total = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, total, cg_bin(g, GCC_JIT_BINARY_OP_MULT, cg_f64(g, own), mult[depth])));
            own = 0;
            cg_val e = cg_f64(g, UNKNOWN_EXTENT);
            if (in->src[0] < p) {
                cg_val x = G->val[in->src[0]];
                e = cg_cast(g, cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, x, zero_of(G, G->T.i64)), zero_of(G, G->T.i64), x), G->T.f64);
            }
            mult[depth + 1] = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_MULT, mult[depth], e));
            depth++;
        } else if (in->op == K_END) {
            total = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, total, cg_bin(g, GCC_JIT_BINARY_OP_MULT, cg_f64(g, own), mult[depth])));
            own = 0;
            depth--;
        } else {
            own += inst_cost(in);
        }
    }
    total = cg_bin(g, GCC_JIT_BINARY_OP_PLUS, total, cg_f64(g, own));
    gcc_jit_block_add_assignment(g->b, NULL, work, total);
    cg_val ext = G->val[k->insts[p].src[0]];
    gcc_jit_block_end_with_return(g->b, NULL, cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, ext, zero_of(G, G->T.i64)), zero_of(G, G->T.i64), ext));
}

/* ---- contexts ---- */

/* -march for the running CPU (gccjit rejects -march=native). */
static const char *march_option(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return "-march=x86-64-v4";
    if (__builtin_cpu_supports("x86-64-v3")) return "-march=x86-64-v3";
    if (__builtin_cpu_supports("x86-64-v2")) return "-march=x86-64-v2";
#endif
    return NULL;
}

static gcc_jit_context *new_context(void) {
    gcc_jit_context *ctx = gcc_jit_context_acquire();
    if (!ctx) return NULL;
    gcc_jit_context_set_int_option(ctx, GCC_JIT_INT_OPTION_OPTIMIZATION_LEVEL, 3);
    gcc_jit_context_set_bool_print_errors_to_stderr(ctx, 0);
    gcc_jit_context_set_bool_allow_unreachable_blocks(ctx, 1);
    const char *march = march_option();
    if (march) gcc_jit_context_add_command_line_option(ctx, march);
    gcc_jit_context_add_command_line_option(ctx, "-fno-math-errno");
    gcc_jit_context_add_command_line_option(ctx, "-fno-trapping-math");
    /* no crt files or default libraries: the kernel needs none (libm is
     * added when it calls libm), and linking is faster */
    gcc_jit_context_add_driver_option(ctx, "-nostdlib");
    return ctx;
}

static em_status gccjit_error(gcc_jit_context *ctx, const char *what, const char *name) {
    const char *e = gcc_jit_context_get_first_error(ctx);
    return em_error(EM_ERR_STATE, "jit_cpu: %s of kernel %s failed: %s", what, name,
                    e ? e : "libgccjit reported no error message");
}

static void plan_name(const char *name, char *out, size_t n) { snprintf(out, n, "%s__plan", name); }

/* Checks k and populates a new context with its two functions. */
static em_status gen(const k_kernel *k, gcc_jit_context **out) {
    *out = NULL;
    em_status s = check_kernel(k);
    if (s != EM_OK) return s;
    int n = k->n;
    size_t nn = (size_t)n + 1;
    kgen G = {.k = k};
    G.match = em_calloc(nn, sizeof(int));
    G.val = em_calloc(nn, sizeof(cg_val));
    G.acc = em_calloc(nn, sizeof(gcc_jit_lvalue *));
    G.part = em_calloc(nn, sizeof(gcc_jit_lvalue *));
    G.key = em_calloc(nn, sizeof(gcc_jit_lvalue *));
    G.mode = em_calloc(nn, 1);
    G.accbuf = em_calloc(nn, sizeof(int));
    G.mult = em_calloc(nn, sizeof(cg_val));
    bool *need = em_calloc(nn, sizeof(bool));
    gcc_jit_context *ctx = NULL;
    if (!G.match || !G.val || !G.acc || !G.part || !G.key || !G.mode || !G.accbuf || !G.mult || !need) {
        s = em_last_status();
        goto done;
    }
    {
        int *stack = G.accbuf, depth = 0; /* ranges are balanced: kir_verify */
        for (int i = 0; i < n; i++) {
            if (k->insts[i].op == K_RANGE) stack[depth++] = i;
            else if (k->insts[i].op == K_END) G.match[stack[--depth]] = i;
        }
    }
    ctx = new_context();
    if (!ctx) {
        s = em_error(EM_ERR_NOMEM, "jit_cpu: gcc_jit_context_acquire failed");
        goto done;
    }
    cg_types_init(&G.T, ctx);
    G.g = (cg){.ctx = ctx, .t = &G.T};
    gcc_jit_type *bufs_t = gcc_jit_type_get_pointer(G.T.vptr), *sizes_t = gcc_jit_type_get_pointer(G.T.i64);
    /* void NAME(void **bufs, int64_t *sizes, int64_t begin, int64_t end) */
    gcc_jit_param *prm[4] = {gcc_jit_context_new_param(ctx, NULL, bufs_t, "bufs"),
                             gcc_jit_context_new_param(ctx, NULL, sizes_t, "sizes"),
                             gcc_jit_context_new_param(ctx, NULL, G.T.i64, "begin"),
                             gcc_jit_context_new_param(ctx, NULL, G.T.i64, "end")};
    G.g.fn = gcc_jit_context_new_function(ctx, NULL, GCC_JIT_FUNCTION_EXPORTED, G.T.v, k->name, 4, prm, 0);
    if (G.g.fn) {
        G.g.b = gcc_jit_function_new_block(G.g.fn, "entry");
        G.bufs = gcc_jit_param_as_rvalue(prm[0]);
        G.sizes = gcc_jit_param_as_rvalue(prm[1]);
        G.begin = gcc_jit_param_as_rvalue(prm[2]);
        G.end = gcc_jit_param_as_rvalue(prm[3]);
        emit_seq(&G, 0, n);
        gcc_jit_block_end_with_void_return(G.g.b, NULL);
    }
    /* int64_t NAME__plan(void **bufs, int64_t *sizes, double *work) */
    char pname[MAX_NAME + 16];
    plan_name(k->name, pname, sizeof pname);
    gcc_jit_param *pp[3] = {gcc_jit_context_new_param(ctx, NULL, bufs_t, "bufs"),
                            gcc_jit_context_new_param(ctx, NULL, sizes_t, "sizes"),
                            gcc_jit_context_new_param(ctx, NULL, gcc_jit_type_get_pointer(G.T.f64), "work")};
    gcc_jit_function *pf = gcc_jit_context_new_function(ctx, NULL, GCC_JIT_FUNCTION_EXPORTED, G.T.i64, pname, 3, pp, 0);
    if (pf) emit_plan(&G, pf, pp, need);
    if (G.uses_libm) gcc_jit_context_add_driver_option(ctx, "-lm");
    if (gcc_jit_context_get_first_error(ctx)) {
        s = gccjit_error(ctx, "code generation", k->name);
        gcc_jit_context_release(ctx);
        ctx = NULL;
    }
done:
    em_free(G.match), em_free(G.val), em_free(G.acc), em_free(G.part), em_free(G.key);
    em_free(G.mode), em_free(G.accbuf), em_free(G.mult), em_free(need);
    *out = ctx;
    return s;
}

static em_status make_kernel(jit_cpu_fn fn, plan_fn plan, gcc_jit_result *res, void *dl, jit_cpu_kernel **out) {
    jit_cpu_kernel *ck = em_calloc(1, sizeof *ck);
    if (!ck) return em_last_status();
    ck->fn = fn;
    ck->plan = plan;
    ck->result = res;
    ck->dl = dl;
    ck->alloc = em_get_allocator();
    *out = ck;
    return EM_OK;
}

em_status jit_cpu_compile(const k_kernel *k, jit_cpu_kernel **out) {
    if (!out) return em_error_null("jit_cpu_compile", "out");
    *out = NULL;
    gcc_jit_context *ctx;
    em_status s = gen(k, &ctx);
    if (s != EM_OK) return s;
    gcc_jit_result *res = gcc_jit_context_compile(ctx);
    if (!res) {
        s = gccjit_error(ctx, "compilation", k->name);
        gcc_jit_context_release(ctx);
        return s;
    }
    gcc_jit_context_release(ctx);
    char pname[MAX_NAME + 16];
    plan_name(k->name, pname, sizeof pname);
    jit_cpu_fn fn = (jit_cpu_fn)gcc_jit_result_get_code(res, k->name);
    plan_fn plan = (plan_fn)gcc_jit_result_get_code(res, pname);
    if (!fn || !plan) s = em_error(EM_ERR_STATE, "jit_cpu: %s: compiled code lacks its functions", k->name);
    else s = make_kernel(fn, plan, res, NULL, out);
    if (s != EM_OK) gcc_jit_result_release(res);
    return s;
}

em_status jit_cpu_write_so(const k_kernel *k, const char *path) {
    if (!path) return em_error_null("jit_cpu_write_so", "path");
    gcc_jit_context *ctx;
    em_status s = gen(k, &ctx);
    if (s != EM_OK) return s;
    gcc_jit_context_compile_to_file(ctx, GCC_JIT_OUTPUT_KIND_DYNAMIC_LIBRARY, path);
    if (gcc_jit_context_get_first_error(ctx)) s = gccjit_error(ctx, "compilation to a file", k->name);
    gcc_jit_context_release(ctx);
    return s;
}

em_status jit_cpu_load_so(const char *path, const char *name, jit_cpu_kernel **out) {
    if (!out) return em_error_null("jit_cpu_load_so", "out");
    *out = NULL;
    if (!path) return em_error_null("jit_cpu_load_so", "path");
    if (!name) return em_error_null("jit_cpu_load_so", "name");
    if (strlen(name) > MAX_NAME) return em_error(EM_ERR_ARG, "jit_cpu_load_so: kernel name too long");
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        return em_error(EM_ERR_ARG, "jit_cpu_load_so: %s", e ? e : path);
    }
    char pname[MAX_NAME + 16];
    plan_name(name, pname, sizeof pname);
    jit_cpu_fn fn;
    plan_fn plan;
    /* POSIX's way of turning a dlsym result into a function pointer */
    void *f = dlsym(dl, name), *p = dlsym(dl, pname);
    memcpy(&fn, &f, sizeof fn);
    memcpy(&plan, &p, sizeof plan);
    em_status s;
    if (!f || !p) s = em_error(EM_ERR_ARG, "jit_cpu_load_so: %s has no kernel %s", path, name);
    else s = make_kernel(fn, plan, NULL, dl, out);
    if (s != EM_OK) dlclose(dl);
    return s;
}

void jit_cpu_free(jit_cpu_kernel *ck) {
    if (!ck) return;
    if (ck->result) gcc_jit_result_release(ck->result);
    if (ck->dl) dlclose(ck->dl);
    em_free_with(ck->alloc, ck);
}

jit_cpu_fn jit_cpu_entry(const jit_cpu_kernel *ck) { return ck ? ck->fn : NULL; }

/* ---- running ---- */

typedef struct run_ctx {
    const jit_cpu_kernel *ck;
    void *const *bufs;
    const int64_t *sizes;
    int64_t n, nchunks; /* run_chunks: chunk c is [n c / nchunks, n (c+1) / nchunks) */
} run_ctx;

static void run_range(void *p, int64_t begin, int64_t end) {
    const run_ctx *rc = p;
    rc->ck->fn(rc->bufs, rc->sizes, begin, end);
}

static void run_chunk_range(void *p, int64_t c0, int64_t c1) {
    const run_ctx *rc = p;
    for (int64_t c = c0; c < c1; c++)
        rc->ck->fn(rc->bufs, rc->sizes, rc->n * c / rc->nchunks, rc->n * (c + 1) / rc->nchunks);
}

em_status jit_cpu_run(const jit_cpu_kernel *ck, void *const *bufs, const int64_t *sizes) {
    if (!ck) return em_error_null("jit_cpu_run", "ck");
    double work = 0;
    int64_t n = ck->plan(bufs, sizes, &work);
    if (n < 0) {
        ck->fn(bufs, sizes, 0, INT64_MAX);
        return EM_OK;
    }
    double g = GRAIN_WORK / (work > 1 ? work : 1);
    int64_t grain = g >= (double)n ? n : (int64_t)ceil(g);
    run_ctx rc = {ck, bufs, sizes, n, 1};
    em_parallel_for(n, grain, run_range, &rc);
    return EM_OK;
}

em_status jit_cpu_run_chunks(const jit_cpu_kernel *ck, void *const *bufs, const int64_t *sizes, int nchunks) {
    if (!ck) return em_error_null("jit_cpu_run_chunks", "ck");
    if (nchunks < 1) return em_error(EM_ERR_ARG, "jit_cpu_run_chunks: %d chunks", nchunks);
    double work = 0;
    int64_t n = ck->plan(bufs, sizes, &work);
    if (n < 0) {
        ck->fn(bufs, sizes, 0, INT64_MAX);
        return EM_OK;
    }
    run_ctx rc = {ck, bufs, sizes, n, nchunks};
    em_parallel_for(nchunks, 1, run_chunk_range, &rc);
    return EM_OK;
}

const char *jit_cpu_target(void) {
    static _Thread_local char buf[128];
    const char *march = march_option();
    snprintf(buf, sizeof buf, "libgccjit %d.%d.%d %s -O3 -fno-math-errno -fno-trapping-math",
             gcc_jit_version_major(), gcc_jit_version_minor(), gcc_jit_version_patchlevel(),
             march ? march : "-march=default");
    return buf;
}
