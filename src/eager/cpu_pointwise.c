/* cpu_pointwise.c - the CPU's pointwise kernels: unary and binary math,
 * comparisons, where, cast and contiguous.
 *
 * Every kernel runs through em_iter (cpu.h), which walks the output and the
 * broadcast inputs and hands an inner loop runs of n elements with byte
 * strides.  The inner loops are generated per dtype by one macro per arity;
 * each has a contiguous fast path (plain indexed loops gcc vectorizes, with
 * `omp simd` to lift -O2's cost model when OpenMP is on), fast paths for a
 * broadcast scalar operand (binary ops), and a strided path.
 *
 * A kernel picks its loop by dtype from a small table indexed by em_dtype;
 * a dtype without a loop is an EM_ERR_DTYPE error (the infer rules should
 * have rejected it already: this is defensive).
 *
 * Integer arithmetic goes through unsigned types so that overflow wraps
 * instead of being undefined; float-to-integer conversions clamp (NaN -> 0). */
#include "cpu.h"

#include <math.h>
#include <string.h>

#if defined(_OPENMP)
#define EM_SIMD _Pragma("omp simd")
#else
#define EM_SIMD
#endif

typedef uint8_t em_bool_t; /* EM_BOOL storage: one byte, 0 or 1 */

/* ---- Scalar functions used by the loop macros ---- */

/* sigmoid, stable for large |x|: never exp of a large positive number. */
static inline float sc_sigmoid_f32(float x) {
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}
static inline double sc_sigmoid_f64(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static inline float sc_rsqrt_f32(float x) { return 1.0f / sqrtf(x); }
static inline double sc_rsqrt_f64(double x) { return 1.0 / sqrt(x); }
static inline float sc_gelu_f32(float x) { return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2)); }
static inline double sc_gelu_f64(double x) { return 0.5 * x * (1.0 + erf(x * M_SQRT1_2)); }
/* sqrt(2/pi) */
#define EM_SQRT_2_PI 0.79788456080286535587989211986876
static inline float sc_gelu_tanh_f32(float x) {
    return 0.5f * x * (1.0f + tanhf((float)EM_SQRT_2_PI * (x + 0.044715f * x * x * x)));
}
static inline double sc_gelu_tanh_f64(double x) {
    return 0.5 * x * (1.0 + tanh(EM_SQRT_2_PI * (x + 0.044715 * x * x * x)));
}

/* neg, abs, relu: relu keeps NaN (NaN < 0 is false). */
#define NEG_F(x) (-(x))
#define ABS_F32(x) fabsf(x)
#define ABS_F64(x) fabs(x)
#define RELU(x) ((x) < 0 ? 0 : (x))
#define NEG_I(T, UT, x) ((T)(0u - (UT)(x)))
#define ABS_I(T, UT, x) ((x) < 0 ? NEG_I(T, UT, x) : (x))

/* Binary: wrapping integer arithmetic; maximum/minimum propagate NaN. */
#define ADD_F(x, y) ((x) + (y))
#define SUB_F(x, y) ((x) - (y))
#define MUL_F(x, y) ((x) * (y))
#define DIV_F(x, y) ((x) / (y))
#define ADD_I(T, UT, x, y) ((T)((UT)(x) + (UT)(y)))
#define SUB_I(T, UT, x, y) ((T)((UT)(x) - (UT)(y)))
#define MUL_I(T, UT, x, y) ((T)((UT)(x) * (UT)(y)))
#define MAX_F(x, y) (((x) != (x) || (x) > (y)) ? (x) : (y))
#define MIN_F(x, y) (((x) != (x) || (x) < (y)) ? (x) : (y))
#define MAX_I(x, y) ((x) > (y) ? (x) : (y))
#define MIN_I(x, y) ((x) < (y) ? (x) : (y))

/* ---- Loop generators, one per arity ----
 * UNARY_LOOP(fn, T_OUT, T_IN, EXPR): o = EXPR of v (the input element).
 * BINARY_LOOP(fn, T_OUT, T_IN, EXPR): o = EXPR of x, y. */

#define UNARY_LOOP(fn, TO, TI, EXPR)                                                   \
    static void fn(char **p, const int64_t *s, int64_t n, const em_op_attrs *a) {      \
        (void)a;                                                                       \
        if (s[0] == (int64_t)sizeof(TO) && s[1] == (int64_t)sizeof(TI)) {              \
            TO *restrict o_ = (TO *)p[0];                                              \
            const TI *restrict x_ = (const TI *)p[1];                                  \
            EM_SIMD for (int64_t i = 0; i < n; i++) {                                  \
                TI v = x_[i];                                                          \
                o_[i] = (TO)(EXPR);                                                    \
            }                                                                          \
        } else {                                                                       \
            char *po = p[0];                                                           \
            const char *px = p[1];                                                     \
            for (int64_t i = 0; i < n; i++, po += s[0], px += s[1]) {                  \
                TI v = *(const TI *)px;                                                \
                *(TO *)po = (TO)(EXPR);                                                \
            }                                                                          \
        }                                                                              \
    }

#define BINARY_LOOP(fn, TO, TI, EXPR)                                                  \
    static void fn(char **p, const int64_t *s, int64_t n, const em_op_attrs *a) {      \
        (void)a;                                                                       \
        const int64_t so_ = sizeof(TO), si_ = sizeof(TI);                              \
        if (s[0] == so_ && s[1] == si_ && s[2] == si_) {                               \
            TO *restrict o_ = (TO *)p[0];                                              \
            const TI *restrict a_ = (const TI *)p[1], *restrict b_ = (const TI *)p[2]; \
            EM_SIMD for (int64_t i = 0; i < n; i++) {                                  \
                TI x = a_[i], y = b_[i];                                               \
                o_[i] = (TO)(EXPR);                                                    \
            }                                                                          \
        } else if (s[0] == so_ && s[1] == si_ && s[2] == 0) {                          \
            TO *restrict o_ = (TO *)p[0];                                              \
            const TI *restrict a_ = (const TI *)p[1];                                  \
            const TI y = *(const TI *)p[2];                                            \
            EM_SIMD for (int64_t i = 0; i < n; i++) {                                  \
                TI x = a_[i];                                                          \
                o_[i] = (TO)(EXPR);                                                    \
            }                                                                          \
        } else if (s[0] == so_ && s[1] == 0 && s[2] == si_) {                          \
            TO *restrict o_ = (TO *)p[0];                                              \
            const TI x = *(const TI *)p[1];                                            \
            const TI *restrict b_ = (const TI *)p[2];                                  \
            EM_SIMD for (int64_t i = 0; i < n; i++) {                                  \
                TI y = b_[i];                                                          \
                o_[i] = (TO)(EXPR);                                                    \
            }                                                                          \
        } else {                                                                       \
            char *po = p[0];                                                           \
            const char *pa = p[1], *pb = p[2];                                         \
            for (int64_t i = 0; i < n; i++, po += s[0], pa += s[1], pb += s[2]) {      \
                TI x = *(const TI *)pa, y = *(const TI *)pb;                           \
                *(TO *)po = (TO)(EXPR);                                                \
            }                                                                          \
        }                                                                              \
    }

/* ---- Running a kernel ---- */

static int64_t out_numel(const em_tensor *out) {
    int64_t n = 1;
    for (int i = 0; i < out->ndim; i++) n *= out->sizes[i];
    return n;
}

/* Checks that the call has nin inputs, that inputs first..nin-1 have dtype
 * want, then runs loop over out and the inputs. */
static em_status run_loop(const em_op_call *c, em_tensor *out, int nin, int first,
                          em_dtype want, em_loop_fn loop) {
    const char *name = em_op_table[c->op].name;
    if (c->nin != nin)
        return em_error(EM_ERR_ARG, "%s: CPU kernel takes %d inputs, got %d", name, nin, c->nin);
    for (int i = first; i < nin; i++)
        if (c->in[i]->dtype != want)
            return em_error(EM_ERR_DTYPE, "%s: input %d has dtype %s, the CPU kernel expects %s",
                            name, i, em_dtype_name(c->in[i]->dtype), em_dtype_name(want));
    if (out_numel(out) == 0) return EM_OK;
    em_iter it;
    em_iter_init(&it, out, nin, c->in);
    em_iter_run(&it, loop, c->attrs);
    return EM_OK;
}

/* Picks table[d], or fails with EM_ERR_DTYPE. */
static em_status pick(const em_op_call *c, const em_loop_fn *table, em_dtype d,
                      em_loop_fn *loop) {
    *loop = (unsigned)d < EM_DTYPE_COUNT ? table[d] : NULL;
    if (!*loop)
        return em_error(EM_ERR_DTYPE, "%s: no CPU kernel for dtype %s", em_op_table[c->op].name,
                        em_dtype_name(d));
    return EM_OK;
}

/* Same-dtype kernels (unary, binary arithmetic): table indexed by out's dtype. */
#define SAME_KERNEL(name, nin)                                                         \
    em_status cpu_##name(const em_op_call *c, em_tensor *out) {                        \
        em_loop_fn loop;                                                               \
        em_status st = pick(c, name##_loops, out->dtype, &loop);                       \
        if (st != EM_OK) return st;                                                    \
        return run_loop(c, out, nin, 0, out->dtype, loop);                             \
    }

/* ---- Unary ops ---- */

/* Float-only unary: F32 through the float libm function, F64 through the double one. */
#define UNARY_FLOAT(name, ff, fd)                                                      \
    UNARY_LOOP(name##_f32, float, float, ff(v))                                        \
    UNARY_LOOP(name##_f64, double, double, fd(v))                                      \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64};                                 \
    SAME_KERNEL(name, 1)

/* Unary on F32, F64, I32, I64: one expression per dtype (v is the element). */
#define UNARY_NUM(name, ef32, ef64, ei32, ei64)                                        \
    UNARY_LOOP(name##_f32, float, float, ef32)                                         \
    UNARY_LOOP(name##_f64, double, double, ef64)                                       \
    UNARY_LOOP(name##_i32, int32_t, int32_t, ei32)                                     \
    UNARY_LOOP(name##_i64, int64_t, int64_t, ei64)                                     \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64,                                  \
        [EM_I32] = name##_i32, [EM_I64] = name##_i64};                                 \
    SAME_KERNEL(name, 1)

UNARY_NUM(neg, NEG_F(v), NEG_F(v), NEG_I(int32_t, uint32_t, v), NEG_I(int64_t, uint64_t, v))
UNARY_NUM(abs, ABS_F32(v), ABS_F64(v), ABS_I(int32_t, uint32_t, v), ABS_I(int64_t, uint64_t, v))
UNARY_NUM(relu, RELU(v), RELU(v), RELU(v), RELU(v))
UNARY_FLOAT(exp, expf, exp)
UNARY_FLOAT(log, logf, log)
UNARY_FLOAT(sqrt, sqrtf, sqrt)
UNARY_FLOAT(rsqrt, sc_rsqrt_f32, sc_rsqrt_f64)
UNARY_FLOAT(sin, sinf, sin)
UNARY_FLOAT(cos, cosf, cos)
UNARY_FLOAT(tanh, tanhf, tanh)
UNARY_FLOAT(sigmoid, sc_sigmoid_f32, sc_sigmoid_f64)
UNARY_FLOAT(gelu, sc_gelu_f32, sc_gelu_f64)
UNARY_FLOAT(gelu_tanh, sc_gelu_tanh_f32, sc_gelu_tanh_f64)
UNARY_FLOAT(erf, erff, erf)

/* ---- Binary ops ---- */

/* Binary on F32, F64, I32, I64 (x, y are the elements). */
#define BINARY_NUM(name, ef, ei32, ei64)                                               \
    BINARY_LOOP(name##_f32, float, float, ef)                                          \
    BINARY_LOOP(name##_f64, double, double, ef)                                        \
    BINARY_LOOP(name##_i32, int32_t, int32_t, ei32)                                    \
    BINARY_LOOP(name##_i64, int64_t, int64_t, ei64)                                    \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64,                                  \
        [EM_I32] = name##_i32, [EM_I64] = name##_i64};                                 \
    SAME_KERNEL(name, 2)

/* Float-only binary. */
#define BINARY_FLOAT(name, ef32, ef64)                                                 \
    BINARY_LOOP(name##_f32, float, float, ef32)                                        \
    BINARY_LOOP(name##_f64, double, double, ef64)                                      \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64};                                 \
    SAME_KERNEL(name, 2)

BINARY_NUM(add, ADD_F(x, y), ADD_I(int32_t, uint32_t, x, y), ADD_I(int64_t, uint64_t, x, y))
BINARY_NUM(sub, SUB_F(x, y), SUB_I(int32_t, uint32_t, x, y), SUB_I(int64_t, uint64_t, x, y))
BINARY_NUM(mul, MUL_F(x, y), MUL_I(int32_t, uint32_t, x, y), MUL_I(int64_t, uint64_t, x, y))
BINARY_NUM(maximum, MAX_F(x, y), MAX_I(x, y), MAX_I(x, y))
BINARY_NUM(minimum, MIN_F(x, y), MIN_I(x, y), MIN_I(x, y))
BINARY_FLOAT(div, DIV_F(x, y), DIV_F(x, y))
BINARY_FLOAT(pow, powf(x, y), pow(x, y))

/* Comparisons: inputs of one dtype (table indexed by it), output BOOL. */
#define COMPARE(name, OP)                                                              \
    BINARY_LOOP(name##_f32, em_bool_t, float, (x OP y))                                \
    BINARY_LOOP(name##_f64, em_bool_t, double, (x OP y))                               \
    BINARY_LOOP(name##_i32, em_bool_t, int32_t, (x OP y))                              \
    BINARY_LOOP(name##_i64, em_bool_t, int64_t, (x OP y))                              \
    BINARY_LOOP(name##_bool, em_bool_t, em_bool_t, ((x != 0) OP (y != 0)))             \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64, [EM_I32] = name##_i32,           \
        [EM_I64] = name##_i64, [EM_BOOL] = name##_bool};                               \
    em_status cpu_##name(const em_op_call *c, em_tensor *out) {                        \
        if (c->nin != 2)                                                               \
            return em_error(EM_ERR_ARG, #name ": CPU kernel takes 2 inputs, got %d",   \
                            c->nin);                                                   \
        if (out->dtype != EM_BOOL)                                                     \
            return em_error(EM_ERR_DTYPE, #name ": result dtype %s, expected bool",    \
                            em_dtype_name(out->dtype));                                \
        em_loop_fn loop;                                                               \
        em_status st = pick(c, name##_loops, c->in[0]->dtype, &loop);                  \
        if (st != EM_OK) return st;                                                    \
        return run_loop(c, out, 2, 0, c->in[0]->dtype, loop);                          \
    }

COMPARE(eq, ==)
COMPARE(ne, !=)
COMPARE(lt, <)
COMPARE(le, <=)
COMPARE(gt, >)
COMPARE(ge, >=)

/* ---- where: selects bits, so one loop per element size serves every dtype ---- */

#define WHERE_LOOP(fn, T)                                                              \
    static void fn(char **p, const int64_t *s, int64_t n, const em_op_attrs *a) {      \
        (void)a;                                                                       \
        const int64_t e_ = sizeof(T);                                                  \
        if (s[0] == e_ && s[1] == 1 && s[2] == e_ && s[3] == e_) {                     \
            T *restrict o_ = (T *)p[0];                                                \
            const em_bool_t *restrict c_ = (const em_bool_t *)p[1];                    \
            const T *restrict x_ = (const T *)p[2], *restrict y_ = (const T *)p[3];    \
            EM_SIMD for (int64_t i = 0; i < n; i++) o_[i] = c_[i] ? x_[i] : y_[i];     \
        } else {                                                                       \
            char *po = p[0];                                                           \
            const char *pc = p[1], *px = p[2], *py = p[3];                             \
            for (int64_t i = 0; i < n; i++, po += s[0], pc += s[1], px += s[2], py += s[3]) \
                *(T *)po = *(const em_bool_t *)pc ? *(const T *)px : *(const T *)py;   \
        }                                                                              \
    }

WHERE_LOOP(where_1, uint8_t)
WHERE_LOOP(where_2, uint16_t)
WHERE_LOOP(where_4, uint32_t)
WHERE_LOOP(where_8, uint64_t)

static const em_loop_fn where_loops[EM_DTYPE_COUNT] = {
    [EM_F32] = where_4, [EM_F64] = where_8, [EM_I32] = where_4, [EM_I64] = where_8,
    [EM_BOOL] = where_1, [EM_F16] = where_2, [EM_BF16] = where_2};

em_status cpu_where(const em_op_call *c, em_tensor *out) {
    if (c->nin != 3) return em_error(EM_ERR_ARG, "where: CPU kernel takes 3 inputs, got %d", c->nin);
    if (c->in[0]->dtype != EM_BOOL)
        return em_error(EM_ERR_DTYPE, "where: condition has dtype %s, expected bool",
                        em_dtype_name(c->in[0]->dtype));
    em_loop_fn loop;
    em_status st = pick(c, where_loops, out->dtype, &loop);
    if (st != EM_OK) return st;
    return run_loop(c, out, 3, 1, out->dtype, loop);
}

/* ---- contiguous: a strided copy, one loop per element size ---- */

#define COPY_LOOP(fn, T)                                                               \
    static void fn(char **p, const int64_t *s, int64_t n, const em_op_attrs *a) {      \
        (void)a;                                                                       \
        if (s[0] == (int64_t)sizeof(T) && s[1] == (int64_t)sizeof(T)) {                \
            memcpy(p[0], p[1], (size_t)n * sizeof(T));                                 \
        } else {                                                                       \
            char *po = p[0];                                                           \
            const char *px = p[1];                                                     \
            for (int64_t i = 0; i < n; i++, po += s[0], px += s[1])                    \
                *(T *)po = *(const T *)px;                                             \
        }                                                                              \
    }

COPY_LOOP(copy_1, uint8_t)
COPY_LOOP(copy_2, uint16_t)
COPY_LOOP(copy_4, uint32_t)
COPY_LOOP(copy_8, uint64_t)

static const em_loop_fn contiguous_loops[EM_DTYPE_COUNT] = {
    [EM_F32] = copy_4, [EM_F64] = copy_8, [EM_I32] = copy_4, [EM_I64] = copy_8,
    [EM_BOOL] = copy_1, [EM_F16] = copy_2, [EM_BF16] = copy_2};

SAME_KERNEL(contiguous, 1)

/* ---- cast: a loop for every (source, destination) pair ----
 * Integer sources (I32, I64, BOOL) go through int64_t, exactly; float
 * sources (F32, F64, F16, BF16) through double.  Float to integer truncates
 * toward zero, clamped to the integer's range, NaN -> 0.  Anything to BOOL
 * is x != 0 (NaN -> true). */

static inline int64_t f64_to_i64(double d) {
    if (d != d) return 0;
    if (d >= 9223372036854775808.0) return INT64_MAX;
    if (d <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)d;
}
static inline int32_t f64_to_i32(double d) {
    if (d != d) return 0;
    if (d >= 2147483647.0) return INT32_MAX;
    if (d <= -2147483648.0) return INT32_MIN;
    return (int32_t)d;
}

/* Stores to each destination from int64_t (_i) and from double (_f). */
static inline float st_f32_i(int64_t v) { return (float)v; }
static inline double st_f64_i(int64_t v) { return (double)v; }
static inline int32_t st_i32_i(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }
static inline int64_t st_i64_i(int64_t v) { return v; }
static inline em_bool_t st_b8_i(int64_t v) { return v != 0; }
static inline uint16_t st_f16_i(int64_t v) { return em_float_to_half((float)v); }
static inline uint16_t st_bf16_i(int64_t v) { return em_float_to_bf16((float)v); }
static inline float st_f32_f(double v) { return (float)v; }
static inline double st_f64_f(double v) { return v; }
static inline int32_t st_i32_f(double v) { return f64_to_i32(v); }
static inline int64_t st_i64_f(double v) { return f64_to_i64(v); }
static inline em_bool_t st_b8_f(double v) { return v != 0; }
static inline uint16_t st_f16_f(double v) { return em_float_to_half((float)v); }
static inline uint16_t st_bf16_f(double v) { return em_float_to_bf16((float)v); }

/* Loads from each source: ld_X(v) gives int64_t for integer sources, double
 * for float ones; K_X names which store (_i or _f) that calls for. */
#define ld_f32(v) ((double)(v))
#define ld_f64(v) (v)
#define ld_i32(v) ((int64_t)(v))
#define ld_i64(v) (v)
#define ld_b8(v) ((int64_t)((v) != 0))
#define ld_f16(v) ((double)em_half_to_float(v))
#define ld_bf16(v) ((double)em_bf16_to_float(v))

#define CAST_ONE(SN, ST, SK, DN, DT) UNARY_LOOP(cast_##SN##_##DN, DT, ST, st_##DN##_##SK(ld_##SN(v)))

/* Every destination for one source. */
#define CAST_FROM(SN, ST, SK)                                                          \
    CAST_ONE(SN, ST, SK, f32, float)                                                   \
    CAST_ONE(SN, ST, SK, f64, double)                                                  \
    CAST_ONE(SN, ST, SK, i32, int32_t)                                                 \
    CAST_ONE(SN, ST, SK, i64, int64_t)                                                 \
    CAST_ONE(SN, ST, SK, b8, em_bool_t)                                              \
    CAST_ONE(SN, ST, SK, f16, uint16_t)                                                \
    CAST_ONE(SN, ST, SK, bf16, uint16_t)

CAST_FROM(f32, float, f)
CAST_FROM(f64, double, f)
CAST_FROM(i32, int32_t, i)
CAST_FROM(i64, int64_t, i)
CAST_FROM(b8, em_bool_t, i)
CAST_FROM(f16, uint16_t, f)
CAST_FROM(bf16, uint16_t, f)

#define CAST_ROW(SN)                                                                   \
    {[EM_F32] = cast_##SN##_f32, [EM_F64] = cast_##SN##_f64, [EM_I32] = cast_##SN##_i32, \
     [EM_I64] = cast_##SN##_i64, [EM_BOOL] = cast_##SN##_b8, [EM_F16] = cast_##SN##_f16, \
     [EM_BF16] = cast_##SN##_bf16}

static const em_loop_fn cast_loops[EM_DTYPE_COUNT][EM_DTYPE_COUNT] = {
    [EM_F32] = CAST_ROW(f32), [EM_F64] = CAST_ROW(f64), [EM_I32] = CAST_ROW(i32),
    [EM_I64] = CAST_ROW(i64), [EM_BOOL] = CAST_ROW(b8), [EM_F16] = CAST_ROW(f16),
    [EM_BF16] = CAST_ROW(bf16)};

em_status cpu_cast(const em_op_call *c, em_tensor *out) {
    if (c->nin != 1) return em_error(EM_ERR_ARG, "cast: CPU kernel takes 1 input, got %d", c->nin);
    em_dtype src = c->in[0]->dtype, dst = out->dtype;
    if ((unsigned)src >= EM_DTYPE_COUNT || (unsigned)dst >= EM_DTYPE_COUNT ||
        !cast_loops[src][dst])
        return em_error(EM_ERR_DTYPE, "cast: no CPU kernel from %s to %s", em_dtype_name(src),
                        em_dtype_name(dst));
    return run_loop(c, out, 1, 0, src, cast_loops[src][dst]);
}
