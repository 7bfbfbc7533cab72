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
#include "vmath.h"

#include <math.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif


typedef uint8_t em_bool_t; /* EM_BOOL storage: one byte, 0 or 1 */

/* ---- Scalar functions used by the loop macros ---- */

/* F32 exp, log, tanh, sigmoid, erf, gelu and gelu_tanh use vmath.h's
 * branch-free approximations (a few ulp, vectorized by the `omp simd`
 * loops below); F64 keeps libm. */

/* sigmoid, stable for large |x|: never exp of a large positive number. */
static inline double sc_sigmoid_f64(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static inline float sc_rsqrt_f32(float x) { return 1.0f / sqrtf(x); }
static inline double sc_rsqrt_f64(double x) { return 1.0 / sqrt(x); }
static inline double sc_gelu_f64(double x) { return 0.5 * x * (1.0 + erf(x * M_SQRT1_2)); }
/* sqrt(2/pi) */
#define EM_SQRT_2_PI 0.79788456080286535587989211986876
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

#define UNARY_LOOP(fn, TO, TI, EXPR) UNARY_LOOP_ATTR(fn, TO, TI, EXPR, )
#define UNARY_LOOP_ATTR(fn, TO, TI, EXPR, ATTR)                                        \
    ATTR static void fn(char **p, const int64_t *s, int64_t n, const em_op_attrs *a) { \
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

/* ---- Half types: f16 and bf16 run the f32 loops ----
 * A half loop upcasts each block of inputs into f32 scratch on the stack
 * (a broadcast input, stride 0, once), runs the op's own f32 loop over the
 * scratch with unit strides, and rounds the f32 results into the output
 * once; a bool result (comparisons) the f32 loop writes in place.  So a
 * half op computes exactly what the f32 op computes on the upcast values,
 * then rounds: torch's "opmath" for half types on CPU. */
#define HALF_BLOCK 512

static void half_loop(em_dtype h, bool half_out, em_loop_fn f32, int nin, char **p,
                      const int64_t *s, int64_t n, const em_op_attrs *a) {
    float buf[3][HALF_BLOCK]; /* output, then at most two inputs */
    for (int64_t i0 = 0; i0 < n; i0 += HALF_BLOCK) {
        int64_t m = n - i0 < HALF_BLOCK ? n - i0 : HALF_BLOCK;
        char *q[3];
        int64_t qs[3];
        for (int k = 1; k <= nin; k++) {
            em_half_to_f32_n(h, p[k] + i0 * s[k], s[k], buf[k], s[k] ? m : 1);
            q[k] = (char *)buf[k];
            qs[k] = s[k] ? (int64_t)sizeof(float) : 0;
        }
        q[0] = half_out ? (char *)buf[0] : p[0] + i0 * s[0];
        qs[0] = half_out ? (int64_t)sizeof(float) : s[0];
        f32(q, qs, m, a);
        if (half_out) em_f32_to_half_n(h, buf[0], p[0] + i0 * s[0], s[0], m);
    }
}

/* name_f16 and name_bf16 from name_f32 (nin inputs; half_out: the result
 * has the inputs' half type, else it is bool). */
#define HALF_LOOPS(name, nin, half_out)                                                \
    static void name##_f16(char **p, const int64_t *s, int64_t n, const em_op_attrs *a) { \
        half_loop(EM_F16, half_out, name##_f32, nin, p, s, n, a);                      \
    }                                                                                  \
    static void name##_bf16(char **p, const int64_t *s, int64_t n, const em_op_attrs *a) { \
        half_loop(EM_BF16, half_out, name##_f32, nin, p, s, n, a);                     \
    }
#define HALF_ENTRIES(name) [EM_F16] = name##_f16, [EM_BF16] = name##_bf16

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

/* Float-only unary: F32 through the float function (vmath.h or libm), F64
 * through the double one. */
#define UNARY_FLOAT(name, ff, fd) UNARY_FLOAT_ATTR(name, ff, fd, )
#define UNARY_FLOAT_ATTR(name, ff, fd, ATTR)                                           \
    UNARY_LOOP_ATTR(name##_f32, float, float, ff(v), ATTR)                             \
    UNARY_LOOP(name##_f64, double, double, fd(v))                                      \
    HALF_LOOPS(name, 1, true)                                                          \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64, HALF_ENTRIES(name)};             \
    SAME_KERNEL(name, 1)

#define UNARY_VMATH(name, ff, fd) UNARY_FLOAT_ATTR(name, ff, fd, EM_VMATH_CLONES)

/* Unary on F32, F64, I32, I64: one expression per dtype (v is the element). */
#define UNARY_NUM(name, ef32, ef64, ei32, ei64)                                        \
    UNARY_LOOP(name##_f32, float, float, ef32)                                         \
    UNARY_LOOP(name##_f64, double, double, ef64)                                       \
    UNARY_LOOP(name##_i32, int32_t, int32_t, ei32)                                     \
    UNARY_LOOP(name##_i64, int64_t, int64_t, ei64)                                     \
    HALF_LOOPS(name, 1, true)                                                          \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64,                                  \
        [EM_I32] = name##_i32, [EM_I64] = name##_i64, HALF_ENTRIES(name)};             \
    SAME_KERNEL(name, 1)

UNARY_NUM(neg, NEG_F(v), NEG_F(v), NEG_I(int32_t, uint32_t, v), NEG_I(int64_t, uint64_t, v))
UNARY_NUM(abs, ABS_F32(v), ABS_F64(v), ABS_I(int32_t, uint32_t, v), ABS_I(int64_t, uint64_t, v))
UNARY_NUM(relu, RELU(v), RELU(v), RELU(v), RELU(v))
UNARY_VMATH(exp, em_vexpf, exp)
UNARY_VMATH(log, em_vlogf, log)
UNARY_FLOAT(sqrt, sqrtf, sqrt)
UNARY_FLOAT(rsqrt, sc_rsqrt_f32, sc_rsqrt_f64)
UNARY_FLOAT(sin, sinf, sin)
UNARY_FLOAT(cos, cosf, cos)
UNARY_VMATH(tanh, em_vtanhf, tanh)
UNARY_VMATH(sigmoid, em_vsigmoidf, sc_sigmoid_f64)
UNARY_VMATH(gelu, em_vgeluf, sc_gelu_f64)
UNARY_VMATH(gelu_tanh, em_vgelu_tanhf, sc_gelu_tanh_f64)
UNARY_VMATH(erf, em_verff, erf)

/* ---- Binary ops ---- */

/* Binary on F32, F64, I32, I64 (x, y are the elements). */
#define BINARY_NUM(name, ef, ei32, ei64)                                               \
    BINARY_LOOP(name##_f32, float, float, ef)                                          \
    BINARY_LOOP(name##_f64, double, double, ef)                                        \
    BINARY_LOOP(name##_i32, int32_t, int32_t, ei32)                                    \
    BINARY_LOOP(name##_i64, int64_t, int64_t, ei64)                                    \
    HALF_LOOPS(name, 2, true)                                                          \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64,                                  \
        [EM_I32] = name##_i32, [EM_I64] = name##_i64, HALF_ENTRIES(name)};             \
    SAME_KERNEL(name, 2)

/* Float-only binary. */
#define BINARY_FLOAT(name, ef32, ef64)                                                 \
    BINARY_LOOP(name##_f32, float, float, ef32)                                        \
    BINARY_LOOP(name##_f64, double, double, ef64)                                      \
    HALF_LOOPS(name, 2, true)                                                          \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64, HALF_ENTRIES(name)};             \
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
    HALF_LOOPS(name, 2, false)                                                         \
    static const em_loop_fn name##_loops[EM_DTYPE_COUNT] = {                           \
        [EM_F32] = name##_f32, [EM_F64] = name##_f64, [EM_I32] = name##_i32,           \
        [EM_I64] = name##_i64, [EM_BOOL] = name##_bool, HALF_ENTRIES(name)};           \
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

/* Transposed inputs.  When the input's innermost (merged) dim has a large
 * stride but another dim a smaller one (a transpose, a permute), a row-by-row
 * copy reads one element per cache line and evicts each line before its
 * neighbours are used.  Instead the (that dim, innermost dim) plane is
 * copied in square blocks (64 x 64 elements, 32 x 32 for 4- and 8-byte
 * ones) whose lines stay in L1 while the block is copied; blocks (times the
 * other dims) are split across threads. */

/* Copies an na x nb block (na, nb <= TL): out(a, b) at po + a*osa + b*osb
 * from in(a, b) at pi + a*isa + b*isb (byte strides; isa is the input's
 * small stride, osb the output's).  Through a buffer, so that memory is
 * only read along a and written along b, in runs of TL elements, and the
 * transposition itself happens in L1: with large power-of-two strides, a
 * direct element-by-element transpose makes every line of a block fall in
 * the same L1 set and evicts it before its neighbours are used. */
#define TILE_COPY(fn, T, TL)                                                           \
    static void fn(char *po, const char *pi, int64_t na, int64_t nb, int64_t osa,      \
                   int64_t osb, int64_t isa, int64_t isb) {                            \
        T buf[TL * TL]; /* buf[b * TL + a] = in(a, b) */                               \
        for (int64_t b = 0; b < nb; b++) {                                             \
            const char *x = pi + b * isb;                                              \
            T *row = buf + b * TL;                                                     \
            if (isa == (int64_t)sizeof(T))                                             \
                memcpy(row, x, (size_t)na * sizeof(T));                                \
            else                                                                       \
                for (int64_t a = 0; a < na; a++) row[a] = *(const T *)(x + a * isa);   \
        }                                                                              \
        for (int64_t a = 0; a < na; a++) {                                             \
            char *o = po + a * osa;                                                    \
            const T *col = buf + a;                                                    \
            if (osb == (int64_t)sizeof(T)) {                                           \
                T *orow = (T *)o;                                                      \
                for (int64_t b = 0; b < nb; b++) orow[b] = col[b * TL];                \
            } else {                                                                   \
                for (int64_t b = 0; b < nb; b++) *(T *)(o + b * osb) = col[b * TL];    \
            }                                                                          \
        }                                                                              \
    }

TILE_COPY(tile_1, uint8_t, 64)
TILE_COPY(tile_2, uint16_t, 64)
TILE_COPY(tile_4_buf, uint32_t, 64)
TILE_COPY(tile_8, uint64_t, 32)

#if defined(__SSE2__)
/* 4-byte elements with unit small strides (a plain transpose of f32/i32):
 * 4 x 4 blocks transposed in SSE registers, 1.8x the buffered copy. */
static void tile_4(char *po, const char *pi, int64_t na, int64_t nb, int64_t osa, int64_t osb,
                   int64_t isa, int64_t isb) {
    if (isa != 4 || osb != 4) {
        tile_4_buf(po, pi, na, nb, osa, osb, isa, isb);
        return;
    }
    int64_t na4 = na & ~(int64_t)3, nb4 = nb & ~(int64_t)3;
    for (int64_t a = 0; a < na4; a += 4) {
        for (int64_t b = 0; b < nb4; b += 4) {
            const char *x = pi + a * 4 + b * isb;
            __m128 r0 = _mm_loadu_ps((const float *)x);
            __m128 r1 = _mm_loadu_ps((const float *)(x + isb));
            __m128 r2 = _mm_loadu_ps((const float *)(x + 2 * isb));
            __m128 r3 = _mm_loadu_ps((const float *)(x + 3 * isb));
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            char *o = po + a * osa + b * 4;
            _mm_storeu_ps((float *)o, r0);
            _mm_storeu_ps((float *)(o + osa), r1);
            _mm_storeu_ps((float *)(o + 2 * osa), r2);
            _mm_storeu_ps((float *)(o + 3 * osa), r3);
        }
        for (int64_t b = nb4; b < nb; b++) /* right edge */
            for (int64_t k = a; k < a + 4; k++)
                memcpy(po + k * osa + b * 4, pi + k * 4 + b * isb, 4);
    }
    for (int64_t a = na4; a < na; a++) /* bottom edge */
        for (int64_t b = 0; b < nb; b++) memcpy(po + a * osa + b * 4, pi + a * 4 + b * isb, 4);
}
#else
#define tile_4 tile_4_buf
#endif

typedef void (*tile_fn)(char *, const char *, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t);

typedef struct tile_job {
    const em_iter *it;
    int d;                    /* the plane's other dim (the smallest input stride) */
    int64_t tile;             /* block side */
    int64_t tiles_a, tiles_b; /* blocks along d and along the innermost dim */
    tile_fn copy;
} tile_job;

/* Copies blocks [begin, end): block t is (index of the dims outside the
 * plane, block along d, block along the innermost dim), the last fastest. */
static void tile_range(void *ctx, int64_t begin, int64_t end) {
    const tile_job *j = ctx;
    const em_iter *it = j->it;
    int nd = it->ndim, d = j->d, in = nd - 1;
    int64_t per_plane = j->tiles_a * j->tiles_b;
    for (int64_t t = begin; t < end; t++) {
        int64_t rest = t / per_plane, r = t % per_plane;
        int64_t a0 = r / j->tiles_b * j->tile, b0 = r % j->tiles_b * j->tile;
        char *po = it->ptrs[0];
        const char *pi = it->ptrs[1];
        for (int k = nd - 2; k >= 0; k--) {
            if (k == d) continue;
            int64_t idx = rest % it->sizes[k];
            rest /= it->sizes[k];
            po += idx * it->strides[0][k];
            pi += idx * it->strides[1][k];
        }
        int64_t na = it->sizes[d] - a0, nb = it->sizes[in] - b0;
        if (na > j->tile) na = j->tile;
        if (nb > j->tile) nb = j->tile;
        po += a0 * it->strides[0][d] + b0 * it->strides[0][in];
        pi += a0 * it->strides[1][d] + b0 * it->strides[1][in];
        j->copy(po, pi, na, nb, it->strides[0][d], it->strides[0][in], it->strides[1][d],
                it->strides[1][in]);
    }
}

static int64_t abs64(int64_t v) { return v < 0 ? -v : v; }

/* Copies in blocks when the input is transposed (see above); false when it
 * is not, leaving the copy to the iterator's row loop. */
static bool tiled_copy(const em_iter *it, size_t es) {
    int nd = it->ndim, in = nd - 1;
    if (nd < 2) return false;
    int64_t is_in = abs64(it->strides[1][in]);
    if (is_in < 64) return false; /* rows already read whole cache lines */
    int d = -1;
    for (int k = 0; k < in; k++) {
        int64_t sk = abs64(it->strides[1][k]);
        if (sk != 0 && sk < is_in && (d < 0 || sk < abs64(it->strides[1][d]))) d = k;
    }
    if (d < 0) return false;
    tile_job j = {it, d, 64, 0, 0, NULL};
    switch (es) {
    case 1: j.copy = tile_1; break;
    case 2: j.copy = tile_2; break;
    case 4: j.copy = tile_4; j.tile = 32; break;
    case 8: j.copy = tile_8; j.tile = 32; break;
    default: return false;
    }
    j.tiles_a = (it->sizes[d] + j.tile - 1) / j.tile;
    j.tiles_b = (it->sizes[in] + j.tile - 1) / j.tile;
    int64_t nt = j.tiles_a * j.tiles_b;
    for (int k = 0; k < in; k++)
        if (k != d) nt *= it->sizes[k];
    em_parallel_for(nt, EM_PARALLEL_GRAIN / (j.tile * j.tile), tile_range, &j);
    return true;
}

em_status cpu_contiguous(const em_op_call *c, em_tensor *out) {
    em_loop_fn loop;
    em_status st = pick(c, contiguous_loops, out->dtype, &loop);
    if (st != EM_OK) return st;
    if (c->nin == 1 && c->in[0]->dtype == out->dtype && out_numel(out) > 0) {
        em_iter it;
        em_iter_init(&it, out, 1, c->in);
        if (tiled_copy(&it, em_dtype_size(out->dtype))) return EM_OK;
    }
    return run_loop(c, out, 1, 0, out->dtype, loop);
}

/* ---- cast: a loop for every (source, destination) pair ----
 * Integer sources (I32, I64, BOOL) go through int64_t, exactly; F64
 * through double; F32, F16 and BF16 through float (exact for the halves).
 * Each conversion rounds once: double to a half type by em_double_to_half
 * (cpu.h), never through a float rounded first.  Float to integer by
 * Ember's one rule (em_f64_to_int, eager.h: truncated toward zero,
 * saturated, NaN -> 0).  Anything to BOOL is x != 0 (NaN -> true). */

/* Stores to each destination from int64_t (_i), double (_f), float (_h). */
static inline float st_f32_i(int64_t v) { return (float)v; }
static inline double st_f64_i(int64_t v) { return (double)v; }
static inline int32_t st_i32_i(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }
static inline int64_t st_i64_i(int64_t v) { return v; }
static inline em_bool_t st_b8_i(int64_t v) { return v != 0; }
static inline uint16_t st_f16_i(int64_t v) { return em_double_to_half((double)v); }
static inline uint16_t st_bf16_i(int64_t v) { return em_double_to_bf16((double)v); }
static inline float st_f32_f(double v) { return (float)v; }
static inline double st_f64_f(double v) { return v; }
static inline int32_t st_i32_f(double v) { return em_f64_to_i32(v); }
static inline int64_t st_i64_f(double v) { return em_f64_to_i64(v); }
static inline em_bool_t st_b8_f(double v) { return v != 0; }
static inline uint16_t st_f16_f(double v) { return em_double_to_half(v); }
static inline uint16_t st_bf16_f(double v) { return em_double_to_bf16(v); }
static inline float st_f32_h(float v) { return v; }
static inline double st_f64_h(float v) { return (double)v; }
static inline int32_t st_i32_h(float v) { return em_f64_to_i32((double)v); }
static inline int64_t st_i64_h(float v) { return em_f64_to_i64((double)v); }
static inline em_bool_t st_b8_h(float v) { return v != 0; }
static inline uint16_t st_f16_h(float v) { return em_float_to_half(v); }
static inline uint16_t st_bf16_h(float v) { return em_float_to_bf16(v); }

/* Loads from each source: ld_X(v) gives int64_t, double or float; the
 * CAST_FROM's kind (_i, _f, _h) names the store that calls for. */
#define ld_f32(v) (v)
#define ld_f64(v) (v)
#define ld_i32(v) ((int64_t)(v))
#define ld_i64(v) (v)
#define ld_b8(v) ((int64_t)((v) != 0))
#define ld_f16(v) em_half_to_float(v)
#define ld_bf16(v) em_bf16_to_float(v)

#define CAST_ONE(SN, ST, SK, DN, DT) UNARY_LOOP(cast_##SN##_##DN, DT, ST, st_##DN##_##SK(ld_##SN(v)))

/* Every destination for one source. */
#define CAST_FROM(SN, ST, SK)                                                          \
    CAST_ONE(SN, ST, SK, f32, float)                                                   \
    CAST_ONE(SN, ST, SK, f64, double)                                                  \
    CAST_ONE(SN, ST, SK, i32, int32_t)                                                 \
    CAST_ONE(SN, ST, SK, i64, int64_t)                                                 \
    CAST_ONE(SN, ST, SK, b8, em_bool_t)                                                \
    CAST_ONE(SN, ST, SK, f16, uint16_t)                                                \
    CAST_ONE(SN, ST, SK, bf16, uint16_t)

CAST_FROM(f32, float, h)
CAST_FROM(f64, double, f)
CAST_FROM(i32, int32_t, i)
CAST_FROM(i64, int64_t, i)
CAST_FROM(b8, em_bool_t, i)
CAST_FROM(f16, uint16_t, h)
CAST_FROM(bf16, uint16_t, h)

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
