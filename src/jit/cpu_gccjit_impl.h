/* cpu_gccjit_impl.h - internals shared by the libgccjit code generator
 * (cpu_gccjit.c: kernel IR to gccjit) and its math library
 * (cpu_vmath_gccjit.c: vmath.h's float32 approximations as gccjit
 * functions).  Not for other rooms: it includes libgccjit.h.
 *
 * Emission helpers: every value an expression needs more than once is put
 * in a fresh local (cg_let), so that no tree is evaluated twice; gcc's SSA
 * passes remove the locals again.  Conditions are carried as gccjit bool
 * rvalues; selects are bit-mask blends (cg_select), never branches, so that
 * the vectorizer's if-conversion has nothing to refuse. */
#ifndef EMBER_CPU_GCCJIT_IMPL_H
#define EMBER_CPU_GCCJIT_IMPL_H

#include <libgccjit.h>
#include <stdbool.h>
#include <stdint.h>

typedef gcc_jit_rvalue *cg_val;

/* The scalar types of one context. */
typedef struct cg_types {
    gcc_jit_type *v, *vptr, *boolean;
    gcc_jit_type *f32, *f64, *u8, *i32, *u32, *i64, *u64;
} cg_types;

/* An emission cursor: the function and block code goes to. */
typedef struct cg {
    gcc_jit_context *ctx;
    const cg_types *t;
    gcc_jit_function *fn;
    gcc_jit_block *b;
    int ntmp; /* names of locals and blocks */
} cg;

void cg_types_init(cg_types *t, gcc_jit_context *ctx);

/* A new local of type ty holding v (assigned in the current block). */
cg_val cg_let(cg *g, cg_val v);
gcc_jit_lvalue *cg_local(cg *g, gcc_jit_type *ty, const char *prefix);
gcc_jit_block *cg_block(cg *g, const char *prefix);

cg_val cg_f32(cg *g, float v);
cg_val cg_f64(cg *g, double v);
cg_val cg_int(cg *g, gcc_jit_type *ty, int64_t v);
cg_val cg_bin(cg *g, enum gcc_jit_binary_op op, cg_val a, cg_val b); /* type of a */
cg_val cg_cmp(cg *g, enum gcc_jit_comparison op, cg_val a, cg_val b); /* bool */
cg_val cg_cast(cg *g, cg_val v, gcc_jit_type *ty);
cg_val cg_bitcast(cg *g, cg_val v, gcc_jit_type *ty);
cg_val cg_neg(cg *g, cg_val v);
cg_val cg_not(cg *g, cg_val v); /* bitwise */
/* The unsigned integer type as wide as ty (f32 -> u32, i64 -> u64...). */
gcc_jit_type *cg_utype(cg *g, gcc_jit_type *ty);
/* c ? a : b for a bool c, as a mask blend on a's bits (any scalar type). */
cg_val cg_select(cg *g, cg_val c, cg_val a, cg_val b);
/* |x| of a float (clears the sign bit). */
cg_val cg_fabs(cg *g, cg_val x);
/* bool a & b, a | b without short-circuit branches. */
cg_val cg_and(cg *g, cg_val a, cg_val b);
cg_val cg_or(cg *g, cg_val a, cg_val b);

/* ---- cpu_vmath_gccjit.c: the float32 approximations ----
 * Built once per context on first use (with the helpers they need), as
 * GCC_JIT_FUNCTION_ALWAYS_INLINE functions float f(float). */
typedef enum cg_mathfn {
    CGM_EXP_LO, /* float exp_lo(float x, float lo) */
    CGM_EXP,
    CGM_LOG,
    CGM_TANH,
    CGM_SIGMOID,
    CGM_ERF_SMALL, /* erf(x) for |x| < 0.921875 */
    CGM_ERFC_MID,  /* erfc(|x|) for 0.921875 <= |x| <= 3.925 */
    CGM_ERF,
    CGM_GELU,
    CGM_GELU_TANH,
    CGM_COUNT
} cg_mathfn;

typedef struct cg_math {
    gcc_jit_function *fn[CGM_COUNT];
} cg_math;

/* The function (built on first use), or NULL if gccjit failed (its error
 * is then on the context). */
gcc_jit_function *cg_math_get(cg_math *m, gcc_jit_context *ctx, const cg_types *t, cg_mathfn f);

#endif
