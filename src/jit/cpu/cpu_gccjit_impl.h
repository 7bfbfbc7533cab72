/* cpu_gccjit_impl.h - internals shared by the libgccjit code generator
 * (cpu_gccjit.c: kernel IR to gccjit) and its math library
 * (cpu_vmath_gccjit.c: vmath.h's float32 approximations as gccjit
 * functions, and the scalar semantics of every kernel IR op).  Not for
 * other rooms: it includes libgccjit.h.
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

#include "kir.h"

typedef gcc_jit_rvalue *cg_val;

/* Longest kernel name; the plan function is NAME CG_PLAN_SUFFIX. */
#define CG_MAX_NAME 200
#define CG_PLAN_SUFFIX "__plan"

struct cg_lib;

/* ---- cpu_gccjit_emit.c ----
 * Adds the kernel's two functions (see cpu_gccjit.h), named sym and
 * sym CG_PLAN_SUFFIX, to ctx; k has passed the generator's checks.  lib is
 * the context's (zeroed with it, shared by every kernel emitted into it:
 * a compile unit).  Errors of gccjit itself are left on the context. */
em_status cg_emit_kernel(gcc_jit_context *ctx, struct cg_lib *lib, const k_kernel *k, const char *sym);

/* The scalar types of one context. */
typedef struct cg_types {
    gcc_jit_type *v, *vptr;
    gcc_jit_type *f32, *f64, *u8, *u16, *i32, *u32, *i64, *u64;
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
cg_val cg_bin(cg *g, enum gcc_jit_binary_op op, cg_val a, cg_val b);  /* type of a */
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

static inline bool cg_is_float(em_dtype d) { return d == EM_F32 || d == EM_F64; }
static inline bool cg_is_int(em_dtype d) { return d == EM_I32 || d == EM_I64; }

static inline bool cg_is_half(em_dtype d) { return d == EM_F16 || d == EM_BF16; }

/* The value type of a dtype: float, double, int32, int64; bool is uint8
 * 0/1; f16 and bf16 their bits in a uint16 (only loaded, stored and
 * converted: the lowering computes them in f32). */
gcc_jit_type *cg_dtype(const cg_types *t, em_dtype d);

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

/* ---- cpu_vmath_gccjit.c: the kernel IR's scalar operations ---- */

/* libm functions and gcc builtins kernels call */
typedef enum cg_extfn {
    CGX_SQRTF, CGX_SQRT, CGX_SINF, CGX_SIN, CGX_COSF, CGX_COS, CGX_POWF, CGX_POW,
    CGX_EXP, CGX_LOG, CGX_TANH, CGX_ERF, CGX_ERFC, CGX_COUNT
} cg_extfn;

/* What one context's kernels have called so far: each function is made
 * once per context, whichever of its kernels needs it first. */
typedef struct cg_lib {
    cg_math math;
    gcc_jit_function *ext[CGX_COUNT];
    gcc_jit_function *blk[CGM_COUNT]; /* void f_blk(float *p, int64_t m) (cpu_gccjit_emit.c) */
    bool uses_libm; /* link with -lm */
} cg_lib;

/* op (a[, b[, c]]) on operands of dtype d (for where: of b and c), a
 * combination kir_verify accepts: the result has dtype d, or bool (uint8)
 * for comparisons.  Semantics are the eager CPU kernels' (see
 * cpu_gccjit.h). */
cg_val cg_alu(cg *g, cg_lib *lib, k_alu op, em_dtype d, cg_val a, cg_val b, cg_val c);
/* v converted from dtype from to dtype to (to and from the half types
 * through f32, rounding to nearest even, NaN kept quiet, as the eager
 * conversions: em_float_to_half, em_float_to_bf16). */
cg_val cg_convert(cg *g, cg_val v, em_dtype from, em_dtype to);
/* The order-preserving integer key of a float (int32 for float, int64 for
 * double): x < y iff key(x) < key(y), -0 < +0, and NaN maps to the top key
 * (max) or the bottom one (min) so that it wins; and its inverse. */
cg_val cg_fkey(cg *g, cg_val v, bool max);
cg_val cg_funkey(cg *g, cg_val key, gcc_jit_type *ft);

#endif
