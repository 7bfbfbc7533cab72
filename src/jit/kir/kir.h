/* kir.h - the loop-level kernel IR, shared by the CPU (libgccjit) and CUDA
 * (NVRTC) code generators.
 *
 * A kernel is a linear list of instructions in SSA form, like tinygrad's
 * linearized uops: each instruction defines at most one value, named by its
 * index, and uses only values defined before it.  Loops are brackets:
 * K_RANGE opens one (its value is the loop variable) and K_END closes the
 * innermost.  Accumulators (K_ACC) are the only mutable values: defined
 * with an initial value before a loop, updated inside (K_ACC_UPDATE), read
 * after it by using the K_ACC instruction as an operand.
 *
 * Parameters: buffers (K_BUF: a typed pointer, numbered in order) and int64
 * sizes (K_SIZE: the kernel's size arguments, numbered in order; dynamic
 * shapes pass sizes here).  The outermost K_RANGE may be marked parallel:
 * the generated function then takes [begin, end) of that loop and the
 * runtime splits its extent over threads (CPU) or blocks (CUDA).
 *
 *   kernel softmax_rows(%0 = buf f32 #0, %1 = buf f32 #1, %2 = size #0)
 *     %3 = const i64 1024
 *     %4 = range %2 parallel
 *     %5 = mul i64 %4, %3
 *     %6 = acc f32 max -inf
 *     %7 = range %3
 *     ...
 *     end
 *     end
 *
 * Ownership: a kernel owns its instruction array and name; kir_free
 * releases both. */
#ifndef EMBER_KIR_H
#define EMBER_KIR_H

#include <stdio.h>

#include "eager.h"

typedef enum k_opcode {
    K_BUF,        /* buffer parameter ival (dtype: element type) */
    K_SIZE,       /* int64 size parameter ival */
    K_CONST,      /* constant: fval for floats, ival for integers and bool */
    K_RANGE,      /* for v in [0, src0): opens a loop; flags K_PARALLEL, K_TILE (then
                     src1: the tile's row extent, below) */
    K_END,        /* closes the innermost open loop */
    K_LOAD,       /* src0 (a K_BUF) [src1 (i64 element index)]; flag K_STAGED */
    K_STORE,      /* src0 (a K_BUF) [src1] = src2 */
    K_ALU,        /* alu(src0[, src1[, src2]]) */
    K_CAST,       /* src0 converted to dtype; float to integer only for values in the
                     integer's range (not NaN): kir_convert makes them so */
    K_ACC,        /* accumulator of dtype with initial value src0 (a K_CONST); alu is
                     the combining op (add, max, min) */
    K_ACC_UPDATE, /* src0 (a K_ACC) = alu_of(src0)(src0, src1) */
} k_opcode;

/* Scalar operations (kir_alu.def, the one list: names, shapes, dtype
 * rules): the op table's pointwise ops, each named by its row's alu column
 * (ops.def), plus index arithmetic.  Every code generator implements each
 * of them; float transcendental ones use vmath.h's approximations on the
 * CPU. */
typedef enum k_alu {
    KA_NONE,
#define ALU(NAME, name, shape, dtypes, cost) KA_##NAME,
#include "kir_alu.def"
#undef ALU
    KA_COUNT
} k_alu;

/* An ALU op's operands and result (kir_alu.def's shape column). */
typedef enum k_alu_shape {
    KS_NONE,    /* KA_NONE and invalid values */
    KS_UNARY,   /* op(a) */
    KS_BINARY,  /* op(a, b), a and b of one dtype */
    KS_COMPARE, /* op(a, b), a and b of one dtype; result bool */
    KS_SELECT   /* c ? a : b, c bool, a and b of one dtype */
} k_alu_shape;

/* Dtype classes (kir_alu.def's dtypes column). */
enum {
    KD_FLOAT = 1 << 0, /* f32, f64, f16, bf16 */
    KD_INT = 1 << 1,   /* i32, i64 */
    KD_BOOL = 1 << 2,
    KD_NUM = KD_FLOAT | KD_INT,
    KD_ANY = KD_NUM | KD_BOOL
};

/* One row of kir_alu.def. */
typedef struct k_alu_info {
    const char *name;  /* in the text form */
    k_alu_shape shape;
    int nsrc;          /* operands: 1, 2 or 3 (0: KA_NONE, invalid values) */
    unsigned dtypes;   /* KD_* classes of the operands (select: of the values) */
    int cost;          /* vector-lane operations (transcendentals 10) */
} k_alu_info;

/* Flags.  K_PARALLEL: the range is split over threads or blocks.
 * K_TILE, on a parallel range v over [0, src0) with src1 = A: a hint that
 * v is (b, a) with a = v % A the fastest, and that the kernel is a 2-d
 * tile over (a, j) with j the one range inside (lower.c's pointwise
 * kernels whose operands disagree on which of the two is contiguous).
 * K_STAGED, on a load inside it: the load walks a contiguously, not j, so
 * a generator may read it through a tile in shared memory (cuda_emit.c);
 * both are hints: the loops mean the same with or without them, and the
 * CPU generator ignores them. */
enum { K_PARALLEL = 1, K_TILE = 2, K_STAGED = 4 };

typedef struct k_inst {
    k_opcode op;
    k_alu alu;       /* K_ALU, K_ACC */
    em_dtype dtype;  /* the value's type (K_STORE, K_END: none) */
    int nsrc;
    int src[3];      /* indices of earlier instructions */
    double fval;     /* K_CONST of a float dtype */
    int64_t ival;    /* K_CONST of an integer/bool dtype; K_BUF/K_SIZE: parameter number */
    unsigned flags;  /* K_RANGE: K_PARALLEL */
} k_inst;

typedef struct k_kernel {
    char *name;
    k_inst *insts;
    int n, cap;
    int nbufs, nsizes;   /* parameters, by number */
    bool failed;         /* a builder failed (out of memory, undefined operands):
                            the kernel is incomplete and fails kir_verify */
} k_kernel;

/* ---- kir.c: building ---- */
k_kernel *kir_new(const char *name);
void kir_free(k_kernel *k);
/* Each returns the new instruction's index, or -1 (error set, and the
 * kernel marked failed: callers may check once, at the end). */
int kir_buf(k_kernel *k, em_dtype elem);          /* next buffer parameter */
int kir_size(k_kernel *k);                        /* next size parameter */
int kir_const_f(k_kernel *k, em_dtype d, double v);
int kir_const_i(k_kernel *k, em_dtype d, int64_t v);
int kir_range(k_kernel *k, int extent, unsigned flags);
/* A parallel range with the tile hint (K_TILE): rows is the extent of its
 * fastest part a (an i64 value defined before it; extent % rows == 0). */
int kir_range_tiled(k_kernel *k, int extent, int rows);
int kir_end(k_kernel *k);
int kir_load(k_kernel *k, int buf, int index);
/* Marks load i K_STAGED (see the flags); returns i. */
int kir_stage(k_kernel *k, int load);
int kir_store(k_kernel *k, int buf, int index, int value);
int kir_alu(k_kernel *k, k_alu op, int a, int b, int c); /* unused operands: -1 */
int kir_cast(k_kernel *k, int value, em_dtype d);
/* value converted to d by Ember's rule (em_f64_to_int, eager.h): a float to
 * i32/i64 is truncated, saturated, NaN -> 0, written as compares, selects
 * and an in-range K_CAST, so every generator emits the same computation;
 * other conversions are one K_CAST. */
int kir_convert(k_kernel *k, int value, em_dtype d);
int kir_acc(k_kernel *k, k_alu combine, int init);
int kir_acc_update(k_kernel *k, int acc, int value);

/* ---- kir.c: the ALU table ---- */
/* a's row; KA_NONE and invalid values get a row of shape KS_NONE named
 * "none" or "invalid". */
const k_alu_info *kir_alu_info(k_alu a);
const char *kir_alu_name(k_alu a);
/* The dtype class (KD_*) of d; 0 for an invalid dtype. */
unsigned kir_dtype_class(em_dtype d);
/* Whether a takes operands (select: values) of dtype d. */
bool kir_alu_accepts(k_alu a, em_dtype d);
/* The dtype of a's result on operands (select: values) of dtype d. */
em_dtype kir_alu_result(k_alu a, em_dtype d);
/* The ALU op the op table's row op lowers to (its alu column in ops.def),
 * or KA_NONE. */
k_alu kir_alu_of_op(em_op op);

/* ---- text form and checks ---- */
em_status kir_print(const k_kernel *k, FILE *f);
/* kir_print's text in a buffer from em_malloc (the caller em_free's it),
 * or NULL with the error set: what kernel cache keys hash. */
char *kir_to_text(const k_kernel *k);
/* The IR's invariants, the same for every backend; each code generator
 * runs it once on the kernel it is given.  EM_ERR_ARG, naming the
 * instruction and the rule, for a kernel that breaks one of them:
 *  - the kernel's name is a C identifier (it names the generated function);
 *  - opcodes, ALU ops and operand counts are valid; operands are defined
 *    earlier and visible (not inside a closed loop, except accumulators
 *    read after theirs); ranges are balanced; at most the first, outermost
 *    range is parallel; parameters are outside loops;
 *  - flags: K_PARALLEL only on ranges, K_TILE only on a parallel range
 *    (with its second operand, the tile's rows, an i64), K_STAGED only on
 *    loads inside a tiled range;
 *  - every value has a valid dtype; buffer and size numbers are in range;
 *    sizes, range extents and variables, load and store indices are i64;
 *    loads and stores address buffers, and have the buffer's dtype;
 *    integer constants are within their dtype's range;
 *  - ALU operands (select: values) have one dtype, one the op takes
 *    (kir_alu.def), a select's condition is bool, and the result has
 *    kir_alu_result's dtype;
 *  - an accumulator combines with add, max or min on its dtype, starts
 *    from a constant of its dtype, and is updated with values of its
 *    dtype inside its own loop. */
em_status kir_verify(const k_kernel *k);

/* ---- what a code generator implements ---- */
#define KIR_DTYPE(d) (1u << (d))
/* For a generator that implements only the dtypes in the mask `dtypes`
 * (KIR_DTYPE bits): EM_ERR_UNSUPPORTED, naming the generator and the first
 * instruction whose value has another dtype; EM_OK otherwise.  Run after
 * kir_verify. */
em_status kir_check_dtypes(const k_kernel *k, unsigned dtypes, const char *generator);
/* For a generator that takes f16/bf16 only as buffers, loads, stores and
 * conversions (the lowering computes half values in f32: sched/lower.c;
 * arithmetic in the half type would round after every op):
 * EM_ERR_UNSUPPORTED naming the first instruction that computes in one. */
em_status kir_check_half_moved(const k_kernel *k, const char *generator);

/* ---- size parameters (dynamic shapes): a kernel lowered for two sets of
 * sizes, compared instruction by instruction ----
 * kir_vary: whether a and b have the same structure (every instruction
 * equal but the values of i64 constants); vary[i] marks the constants
 * that differ (vary has a->n slots).  kir_parametrize: k with each
 * constant marked in vary replaced by a K_SIZE parameter (numbered in
 * instruction order, after the buffers); size_of[i] (k->n slots) gets the
 * parameter number of instruction i of k, or -1.  kir_match: whether k is
 * model with only the constants size_of marks changed; sizes[] gets those
 * constants' values in k: the arguments with which the parametrized
 * kernel computes exactly what k computes. */
bool kir_vary(const k_kernel *a, const k_kernel *b, bool *vary);
k_kernel *kir_parametrize(const k_kernel *k, const bool *vary, int *size_of);
bool kir_match(const k_kernel *model, const k_kernel *k, const int *size_of, int64_t *sizes);

#endif
