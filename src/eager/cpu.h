/* cpu.h - the CPU backend's kernel helpers (src/eager/cpu_*.c).
 *
 * Pointwise kernels run through em_iter: the output and the inputs,
 * broadcast to the output's sizes, walked together with byte strides, with
 * adjacent dims merged where every operand allows it (so a contiguous
 * tensor is one flat loop).  A kernel supplies only the inner loop. */
#ifndef EMBER_CPU_H
#define EMBER_CPU_H

#include "eager.h"

#include <math.h>
#include <string.h>

#define EM_ITER_MAX_OPS 4

typedef struct em_iter {
    int nops;                                   /* output + inputs */
    int ndim;                                   /* after merging dims; >= 1 */
    int64_t sizes[EM_MAX_DIMS];                 /* innermost dim last */
    int64_t strides[EM_ITER_MAX_OPS][EM_MAX_DIMS]; /* bytes */
    char *ptrs[EM_ITER_MAX_OPS];
    int64_t numel;
} em_iter;

/* Inner loop over n elements: ptrs[k] is operand k's first element and
 * strides[k] its byte stride (operand 0 is the output). */
typedef void (*em_loop_fn)(char **ptrs, const int64_t *strides, int64_t n,
                           const em_op_attrs *a);

/* Sets up an iteration writing out (any strides) and reading in[0..nin-1],
 * each broadcast to out's sizes (the caller checked they broadcast). */
void em_iter_init(em_iter *it, em_tensor *out, int nin, em_tensor *const *in);
/* Runs loop over every element, split across threads when large. */
void em_iter_run(const em_iter *it, em_loop_fn loop, const em_op_attrs *a);

/* Appends a dim of size s and stride t (any unit) after dims [0, *n),
 * merging it into the last one when the two are contiguous with each
 * other: how kernels collapse a view into the fewest loops. */
void em_dims_push(int64_t *sizes, int64_t *strides, int *n, int64_t s, int64_t t);

/* Below this many elements a pointwise kernel runs on one thread. */
#define EM_PARALLEL_GRAIN 32768

/* Loads element p of dtype d as double, and stores v into p as dtype d.
 * Slow generic paths (casts, printing, tests); kernels use typed loops. */
double em_load_f64(const void *p, em_dtype d);
void em_store_f64(void *p, em_dtype d, double v);
int64_t em_load_i64(const void *p, em_dtype d);

/* ---- IEEE half (f16) and bfloat16 conversions ----
 * The one helper pair per format that every kernel uses.  Round to nearest
 * even; NaN stays NaN (quiet, sign kept), +-inf stays inf, a finite value
 * past the format's range rounds to inf as IEEE 754 says (f16: from 65520,
 * halfway between its max 65504 and 65536), f16 subnormals both ways.
 * Branch-free (selects, integer and exact float operations only), inline,
 * so that gcc vectorizes the plain array loops that call them (the bulk
 * converters below).  They assume the default rounding mode, as all of
 * Ember does. */

static inline uint32_t em_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float em_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Masks instead of branches or ?: chains (which gcc does not if-convert
 * in a vector loop): all ones where c holds. */
static inline uint32_t em_mask32(bool c) { return 0u - (uint32_t)c; }
static inline uint32_t em_select32(uint32_t m, uint32_t a, uint32_t b) { return (a & m) | (b & ~m); }

static inline float em_half_to_float(uint16_t h) {
    uint32_t w = (uint32_t)h << 17; /* exponent and mantissa at the top, no sign */
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    /* normal, inf, NaN: exponent and mantissa moved into place, the
     * exponent rebiased by a multiplication by 2^-112 (exact; inf and NaN
     * stay so, a NaN comes out quiet) */
    uint32_t normal = em_f32_bits(em_bits_f32((w >> 4) + (0xe0u << 23)) * 0x1p-112f);
    /* subnormal or zero: 0.5 + m 2^-24 made by bits, minus 0.5: m 2^-24 */
    uint32_t sub = em_f32_bits(em_bits_f32((w >> 17) | (126u << 23)) - 0.5f);
    return em_bits_f32(sign | em_select32(em_mask32(w < (1u << 27)), sub, normal));
}

static inline uint16_t em_float_to_half(float f) {
    uint32_t x = em_f32_bits(f), ax = x & 0x7fffffffu;
    uint32_t sign = (x >> 16) & 0x8000u;
    /* normal range: rebias by -112 and round to even on the 13 dropped
     * bits (a carry into the exponent is the right result, up to inf) */
    uint32_t rounded = (ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13;
    /* below 2^-14: adding 0.5 (2^-1) leaves the value's 2^-24 units in the
     * low mantissa bits, rounded to even by the float addition itself */
    uint32_t sub = em_f32_bits(em_bits_f32(ax) + 0.5f) - 0x3f000000u;
    uint32_t r = em_select32(em_mask32(ax < 0x38800000u), sub, rounded);
    r = em_select32(em_mask32(ax >= 0x477ff000u), 0x7c00u, r); /* rounds to inf */
    r = em_select32(em_mask32(ax > 0x7f800000u), 0x7e00u, r);  /* NaN: quiet */
    return (uint16_t)(sign | r);
}

static inline float em_bf16_to_float(uint16_t h) { return em_bits_f32((uint32_t)h << 16); }

static inline uint16_t em_float_to_bf16(float f) {
    uint32_t x = em_f32_bits(f);
    uint32_t nan = (x >> 16) | 0x40u; /* quiet NaN, payload's top bits kept */
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (uint16_t)em_select32(em_mask32((x & 0x7fffffffu) > 0x7f800000u), nan, rounded);
}

/* double to float rounded to odd: an inexact result gets its last bit set.
 * Rounding that float again to a format with at least two fewer mantissa
 * bits (f16: 13 fewer, bf16: 16) gives the correctly rounded result of the
 * double, where a plain (float) cast would round twice. */
static inline float em_f64_to_f32_odd(double d) {
    float f = (float)d;
    uint32_t u = em_f32_bits(f);
    bool inexact = (double)f != d && d == d && !isinf(f);
    if (inexact && !(u & 1u)) {
        /* move one ulp toward d: the neighbour on d's side is odd */
        bool up = ((double)f < d) == !(u >> 31);
        u = up ? u + 1 : u - 1;
    }
    return em_bits_f32(u);
}
static inline uint16_t em_double_to_half(double d) { return em_float_to_half(em_f64_to_f32_odd(d)); }
static inline uint16_t em_double_to_bf16(double d) { return em_float_to_bf16(em_f64_to_f32_odd(d)); }

/* Bulk conversions of n elements between half type h (f16 or bf16) and
 * f32: src / dst strided by sb bytes (2: contiguous), the f32 side
 * contiguous.  Plain loops gcc vectorizes (cpu_iter.c). */
void em_half_to_f32_n(em_dtype h, const char *src, int64_t sb, float *dst, int64_t n);
void em_f32_to_half_n(em_dtype h, const float *src, char *dst, int64_t sb, int64_t n);

/* ---- cpu_matmul.c: the BLAS core OpenBLAS chose ---- */

/* The instruction sets a CPU or a BLAS kernel set uses, in order. */
typedef enum em_isa { EM_ISA_SSE, EM_ISA_AVX, EM_ISA_AVX2, EM_ISA_AVX512 } em_isa;

/* The ISA of one of OpenBLAS's x86-64 cores, by the name
 * openblas_get_corename gives ("Prescott", "Haswell", "SkylakeX", "Zen",
 * ...); an unknown name counts as SSE (a generic core). */
em_isa em_blas_core_isa(const char *core);
/* What this machine's CPU can run (cpuid). */
em_isa em_cpu_isa(void);
/* When OpenBLAS runs core on a CPU of ISA cpu and that wastes it (its
 * kernels are below AVX2 on an AVX2 or AVX-512 CPU: several times slower
 * for every matmul), the sentence that says so, with the OPENBLAS_CORETYPE
 * that fixes it, into buf; else false. */
bool em_blas_core_warning(const char *core, em_isa cpu, char *buf, size_t n);

/* The BLAS matmuls run on. */
typedef enum em_blas_lib { EM_BLAS_NONE, EM_BLAS_OPENBLAS, EM_BLAS_BLIS, EM_BLAS_ONEDNN } em_blas_lib;
/* Which cblas library to use (f64 products, small f32 ones, and every f32
 * one where oneDNN is not used), from EMBER_BLAS (want: NULL or "auto",
 * "onednn", "openblas", "blis"), the core OpenBLAS chose (NULL: no
 * OpenBLAS), whether the user set OPENBLAS_CORETYPE, the CPU's ISA and
 * whether BLIS loads.  Auto (and onednn) takes OpenBLAS unless it runs a
 * generic core below the CPU (em_blas_core_warning) that nobody chose, and
 * then BLIS, which picks its kernels at run time.  msg: what to say once,
 * or empty. */
em_blas_lib em_blas_choose(const char *want, const char *core, bool coretype_set, em_isa cpu,
                           bool have_blis, char *msg, size_t n);
/* Whether f32 products run on oneDNN's sgemm, when it loads (have_onednn):
 * EMBER_BLAS (want, as above) onednn, or auto on a CPU with AVX-512, or on
 * one with AVX2 whose cblas library has no kernels for it (cblas_native
 * false: no library, or OpenBLAS on a generic core).  On AVX2 a native
 * OpenBLAS or BLIS stays: oneDNN's AVX2 sgemm ran wide products
 * (256x512x2048, 128x768x3072) at half OpenBLAS's rate on an AMD EPYC
 * (docs/benchmarks.md).  msg: what to say once (onednn asked for and
 * missing), or left as it was. */
bool em_blas_choose_onednn(const char *want, em_isa cpu, bool cblas_native, bool have_onednn,
                           char *msg, size_t n);
/* The BLAS matmuls run on in this process and the kernels it runs (a
 * core or arch name), into buf; loads it if no matmul did yet. */
em_blas_lib em_blas_in_use(char *buf, size_t n);

/* Whether products of dtype dt (f32 or f64) have a BLAS, loaded and
 * usable (it loads at the first call). */
bool em_blas_ready(em_dtype dt);
/* c[m x n] = alpha * a' @ b' + beta * c, row-major, where a' is a [m x k]
 * or, with ta, a [k x m] transposed, and b' is b [k x n] or, with tb,
 * b [n x k] transposed: one single-threaded product on the BLAS in use
 * (em_blas_in_use), for code that splits work over Ember's thread pool
 * (cpu_matmul.c, cpu_attention.c).  Only after em_blas_ready(dt) said true. */
void em_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);
void em_dgemm(bool ta, bool tb, int m, int n, int k, double alpha, const double *a, int lda,
              const double *b, int ldb, double beta, double *c, int ldc);
/* Whether bf16 products run on a bf16 gemm (oneDNN's dnnl_gemm_bf16bf16f32,
 * where oneDNN runs the f32 products and implements it on this CPU: AVX-512
 * on, natively with AVX512-BF16 or AMX); otherwise they convert their
 * operands to f32 for em_sgemm. */
bool em_bf16gemm_ready(void);
/* em_sgemm's product of bf16 operands (their bits, uint16_t) into f32 c,
 * accumulated in f32.  Only after em_bf16gemm_ready() said true. */
void em_bf16gemm(bool ta, bool tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                 const uint16_t *b, int ldb, float beta, float *c, int ldc);

/* EM_SIMD before a loop: `omp simd` (-fopenmp-simd, configure's
 * EM_OPENMP_SIMD) lifts -O2's cost model, which left loops of vmath.h's
 * functions scalar. */
#if defined(_OPENMP) || defined(EM_OPENMP_SIMD)
#define EM_SIMD _Pragma("omp simd")
#else
#define EM_SIMD
#endif

/* EM_VMATH_CLONES: the F32 loops of vmath.h's functions are compute bound:
 * on x86-64 with glibc (ifunc), gcc also builds them for AVX2 and AVX-512 and picks one
 * by the CPU at load time (2-4x the baseline SSE2 loop).  None of the
 * clones enables FMA, so every clone computes the same IEEE operations in
 * the same order: results are bitwise identical on every machine. */
/* Not under ThreadSanitizer: its instrumented ifunc resolvers run before
 * the sanitizer starts, and crash (tools/tsan-check). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \
    defined(__has_attribute) && !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define EM_VMATH_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#endif
#endif
#ifndef EM_VMATH_CLONES
#define EM_VMATH_CLONES
#endif
/* Kernels named in ops.def. */
#define X(NAME, name, kind, nin, attrs, infer, cpu) em_status cpu(const em_op_call *c, em_tensor *out);
#include "ops.def"
#undef X

#endif
