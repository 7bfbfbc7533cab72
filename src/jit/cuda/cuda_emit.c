/* cuda_emit.c - kernel IR -> CUDA C text (cuda_emit.h says what the
 * generated kernels look like and why).
 *
 * Every value is a `const` local named v<index> defined where its
 * instruction stands; accumulators are mutable locals a<index>; buffer
 * parameter #n is p<n>, size parameter #n is s<n>.  Loops are C for-loops.
 * The text depends only on the IR, so it can be the cache key. */
#include "cuda_emit.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The helpers every kernel may use: warp and block reductions, float
 * max/min that propagate NaN, the sigmoid without overflow. */
static const char prelude[] =
    "#define EM_FULL 0xffffffffu\n"
    "template <class T> __device__ __forceinline__ T em_shfl(T v, int o) {\n"
    "  return __shfl_xor_sync(EM_FULL, v, o);\n"
    "}\n"
    "__device__ __forceinline__ bool em_shfl(bool v, int o) {\n"
    "  return __shfl_xor_sync(EM_FULL, (int)v, o) != 0;\n"
    "}\n"
    "template <class T> __device__ __forceinline__ T em_fmax(T a, T b) {\n"
    "  return (a != a || a > b) ? a : b;\n"
    "}\n"
    "template <class T> __device__ __forceinline__ T em_fmin(T a, T b) {\n"
    "  return (a != a || a < b) ? a : b;\n"
    "}\n"
    "struct em_add { template <class T> __device__ T operator()(T a, T b) const { return a + b; } };\n"
    "struct em_addb { __device__ bool operator()(bool a, bool b) const { return a || b; } };\n"
    "struct em_max { template <class T> __device__ T operator()(T a, T b) const { return em_fmax(a, b); } };\n"
    "struct em_min { template <class T> __device__ T operator()(T a, T b) const { return em_fmin(a, b); } };\n"
    "/* v combined over the block; every thread gets the result.  sh holds\n"
    "   one value per warp; the first barrier keeps a previous call's\n"
    "   readers from seeing this call's writes. */\n"
    "/* v combined over each aligned group of w lanes (w a power of 2 up to\n"
    "   32); every lane of the group gets the result. */\n"
    "template <class T, class F> __device__ __forceinline__ T em_warp_reduce(T v, F f, int w) {\n"
    "  for (int o = w >> 1; o > 0; o >>= 1) v = f(v, em_shfl(v, o));\n"
    "  return v;\n"
    "}\n"
    "template <class T, class F> __device__ __forceinline__ T em_block_reduce(T v, F f, T *sh) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v = f(v, em_shfl(v, o));\n"
    "  __syncthreads();\n"
    "  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  v = sh[0];\n"
    "  for (int w = 1; w < (int)(blockDim.x >> 5); w++) v = f(v, sh[w]);\n"
    "  return v;\n"
    "}\n"
    "__device__ __forceinline__ float em_sigmoidf(float x) {\n"
    "  float e = expf(-fabsf(x));\n"
    "  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);\n"
    "}\n"
    "__device__ __forceinline__ double em_sigmoid(double x) {\n"
    "  double e = exp(-fabs(x));\n"
    "  return (x >= 0.0 ? 1.0 : e) / (1.0 + e);\n"
    "}\n";

/* Half conversions, in kernels that have half buffers: from half exact,
 * by bits (the GPU's arithmetic would drop a NaN's sign and payload, which
 * the CPU's keeps, quieted; bf16 is f32's top half); to half rounded to
 * nearest even,
 * NaN kept quiet, overflow to inf, subnormals exact: the CPU's
 * em_float_to_half and em_float_to_bf16 (cpu_iter.c) bit for bit. */
const char cuda_half_helpers[] =
    "__device__ __forceinline__ float em_from_f16(unsigned short h) {\n"
    "  const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n"
    "  if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u));\n"
    "  if (e == 0u) return __uint_as_float(sign | __float_as_uint((float)m * 0x1p-24f));\n"
    "  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));\n"
    "}\n"
    "__device__ __forceinline__ float em_from_bf16(unsigned short h) {\n"
    "  return __uint_as_float((unsigned)h << 16);\n"
    "}\n"
    "__device__ __forceinline__ unsigned short em_to_f16(float f) {\n"
    "  const unsigned x = __float_as_uint(f), ax = x & 0x7fffffffu;\n"
    "  const unsigned short sign = (unsigned short)((x >> 16) & 0x8000u);\n"
    "  if (ax > 0x7f800000u) return sign | 0x7e00;\n"
    "  if (ax >= 0x477ff000u) return sign | 0x7c00;\n"
    "  if (ax < 0x38800000u) return sign | (unsigned short)__float2int_rn(__uint_as_float(ax) * 16777216.0f);\n"
    "  return sign | (unsigned short)((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13);\n"
    "}\n"
    "/* rounded to odd: f64 -> f32 -> half then rounds once (cpu.h) */\n"
    "__device__ __forceinline__ float em_f64_to_f32_odd(double d) {\n"
    "  const float f = __double2float_rz(d);\n"
    "  return (double)f == d || d != d ? f : __uint_as_float(__float_as_uint(f) | 1u);\n"
    "}\n"
    "__device__ __forceinline__ unsigned short em_to_bf16(float f) {\n"
    "  unsigned x = __float_as_uint(f);\n"
    "  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);\n"
    "  x += 0x7fffu + ((x >> 16) & 1u);\n"
    "  return (unsigned short)(x >> 16);\n"
    "}\n";

/* Split loops with at most this many iterations per thread are fully
 * unrolled, and their values may stay in registers across passes. */
enum { MAX_CACHED_NIT = 32 };

typedef struct egen {
    const k_kernel *k;
    const cuda_row_params *params; /* the schedule's free parameters (NULL: defaults) */
    FILE *f;
    int *match;        /* K_RANGE -> its K_END */
    int par;           /* the parallel range, or -1 */
    char extent[32];   /* its extent in the text: a constant, or a size parameter */
    cuda_shape shape;
    int threads;
    bool *split;       /* K_RANGE split over the block's threads (CU_ROWS) */
    bool *written;     /* per parameter number: stored to */
    /* CU_ROWS register cache (see plan_row_cache): per load/store its key
     * or -1; per key its element type and trip count; per store whether a
     * later pass overwrites it (then only the registers get it) */
    int *key_of, *nit_of;
    em_dtype *key_dtype;
    int *key_nit;
    bool *key_filled, *dead;
    int nkeys;
    int depth;         /* indentation */
    int inner;         /* loops open inside the parallel range */
    bool failed;
    int tpr;           /* CU_ROWS: threads per row (threads / rpb) */
    int rpb;           /* CU_ROWS: rows per block (8: a warp a row; more: a
                          part of a warp a row), else 1 */
    /* CU_ROWS vector variant (see plan_vec): per instruction, whether the
     * access moves V elements at once; the alignment of every such
     * access's row base, as base = row * c1 + c0 (mod V) */
    bool vrows;        /* emitting the vector variant */
    bool *vacc;
    int V;
    int64_t c1, c0;
    int seg;           /* split loop segment: 0 scalar or vector steps, 1 head, 2 tail */
    int lane;          /* >= 0: emitting lane `lane` of a 16-byte vector step */
    int cur_split;     /* the counted split loop being emitted, or -1 */
    char ring[8][32];  /* names handed out by nm(), reused round-robin */
    int ringi;
    /* tiled kernels (see plan_tile): the inner range; per instruction,
     * whether a staged load's index needs it (it is computed again at
     * the load phase's position) */
    int tile_j;        /* >= 0: the kernel is tiled, and this is its j range */
    bool *slice;
    bool staging;      /* emitting the compute phase: staged loads read the tile */
    int arch;          /* the target's compute capability (90: sm_90), 0 unknown */
    int64_t widest;    /* CU_ROWS: the longest constant split loop (1024 if none) */
    int scale;         /* 2 when the widest buffer is a half type, else 1: a
                          thread of a row longer than a warp's aims for
                          row_elems() * scale elements, so a bf16 thread
                          moves the bytes an f32 one does */
    int cluster;       /* CU_ROWS: blocks a row (a thread-block cluster), else 1 */
} egen;

static const char *ctype(em_dtype d) {
    switch (d) {
    case EM_F32: return "float";
    case EM_F64: return "double";
    case EM_I32: return "int";
    case EM_I64: return "long long";
    case EM_BOOL: return "bool";
    case EM_F16:
    case EM_BF16: return "unsigned short"; /* the bits: only loaded, stored, converted */
    default: return NULL;
    }
}

static const char *utype(em_dtype d) { return d == EM_I32 ? "unsigned" : "unsigned long long"; }

static bool is_float(em_dtype d) { return d == EM_F32 || d == EM_F64; }

static void indent(egen *G) {
    for (int i = 0; i < G->depth + 1; i++) fputs("  ", G->f);
}

/* The name of value i: a parameter, an accumulator or a local. */
static void name(egen *G, int i, char *buf, size_t n) {
    const k_inst *in = &G->k->insts[i];
    if (in->op == K_BUF) snprintf(buf, n, "p%" PRId64, in->ival);
    else if (in->op == K_SIZE) snprintf(buf, n, "s%" PRId64, in->ival);
    else if (in->op == K_ACC) snprintf(buf, n, "a%d", i);
    else snprintf(buf, n, "v%d", i);
}

/* Value i's name in one of the ring's slots: a statement may hold up to
 * eight names at once (function calls are sequenced, unlike a macro's
 * side effects). */
static const char *nm(egen *G, int i) {
    char *b = G->ring[G->ringi = (G->ringi + 1) % 8];
    name(G, i, b, sizeof G->ring[0]);
    return b;
}
#define NM(i) nm(G, (i))

/* A constant's exact value: floats as their bit pattern. */
static void print_const(egen *G, const k_inst *in) {
    FILE *f = G->f;
    if (in->dtype == EM_F32) {
        float x = (float)in->fval;
        uint32_t u;
        memcpy(&u, &x, 4);
        fprintf(f, "__int_as_float(0x%08" PRIx32 ")", u);
    } else if (in->dtype == EM_F64) {
        uint64_t u;
        memcpy(&u, &in->fval, 8);
        fprintf(f, "__longlong_as_double(0x%016" PRIx64 "ll)", u);
    } else if (in->dtype == EM_BOOL) {
        fputs(in->ival ? "true" : "false", f);
    } else if (in->dtype == EM_I32) {
        fprintf(f, "((int)0x%08" PRIx32 "u)", (uint32_t)in->ival);
    } else {
        fprintf(f, "((long long)0x%016" PRIx64 "ull)", (uint64_t)in->ival);
    }
}

/* f32 or f64 name of a libm-style function: expf / exp. */
static void fcall(egen *G, const char *fn, bool f32, const char *x) {
    fprintf(G->f, "%s%s(%s)", fn, f32 ? "f" : "", x);
}

static void unary(egen *G, k_alu op, em_dtype d, const char *x) {
    FILE *f = G->f;
    bool f32 = d == EM_F32;
    const char *one = f32 ? "1.0f" : "1.0";
    if (!is_float(d)) {
        const char *t = ctype(d), *ut = utype(d);
        switch (op) {
        case KA_NEG: fprintf(f, "(%s)(0u - (%s)%s)", t, ut, x); return;
        case KA_ABS: fprintf(f, "(%s < 0 ? (%s)(0u - (%s)%s) : %s)", x, t, ut, x, x); return;
        case KA_RELU: fprintf(f, "(%s < 0 ? (%s)0 : %s)", x, t, x); return;
        default: G->failed = true; return;
        }
    }
    switch (op) {
    case KA_NEG: fprintf(f, "(-%s)", x); return;
    case KA_ABS: fcall(G, "fabs", f32, x); return;
    case KA_EXP: fcall(G, "exp", f32, x); return;
    case KA_LOG: fcall(G, "log", f32, x); return;
    case KA_SQRT: fcall(G, "sqrt", f32, x); return;
    case KA_RSQRT: fprintf(f, "(%s / sqrt%s(%s))", one, f32 ? "f" : "", x); return;
    case KA_SIN: fcall(G, "sin", f32, x); return;
    case KA_COS: fcall(G, "cos", f32, x); return;
    case KA_TANH: fcall(G, "tanh", f32, x); return;
    case KA_ERF: fcall(G, "erf", f32, x); return;
    case KA_RELU: fprintf(f, "(%s < 0 ? (%s)0 : %s)", x, ctype(d), x); return;
    case KA_SIGMOID: fprintf(f, "em_sigmoid%s(%s)", f32 ? "f" : "", x); return;
    case KA_GELU: /* x/2 erfc(-x/sqrt 2): no cancellation for negative x */
        fprintf(f, f32 ? "(0.5f * %s * erfcf(%s * -0.70710678118654752f))"
                       : "(0.5 * %s * erfc(%s * -0.70710678118654752))", x, x);
        return;
    case KA_GELU_TANH: /* x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) */
        fprintf(f, f32 ? "(%s * em_sigmoidf(%s * (1.5957691216057308f + 0.07135481627260025f * %s * %s)))"
                       : "(%s * em_sigmoid(%s * (1.5957691216057308 + 0.07135481627260025 * %s * %s)))",
                x, x, x, x);
        return;
    default: G->failed = true; return;
    }
}

static void binary(egen *G, k_alu op, em_dtype d, const char *a, const char *b) {
    FILE *f = G->f;
    static const char *const cmp[KA_COUNT] = {[KA_EQ] = "==", [KA_NE] = "!=", [KA_LT] = "<",
                                              [KA_LE] = "<=", [KA_GT] = ">",  [KA_GE] = ">="};
    if (kir_alu_info(op)->shape == KS_COMPARE) {
        fprintf(f, "(%s %s %s)", a, cmp[op], b);
        return;
    }
    if (is_float(d)) {
        switch (op) {
        case KA_ADD: fprintf(f, "(%s + %s)", a, b); return;
        case KA_SUB: fprintf(f, "(%s - %s)", a, b); return;
        case KA_MUL: fprintf(f, "(%s * %s)", a, b); return;
        case KA_DIV: fprintf(f, "(%s / %s)", a, b); return;
        case KA_POW: fprintf(f, "pow%s(%s, %s)", d == EM_F32 ? "f" : "", a, b); return;
        case KA_MAX: fprintf(f, "em_fmax(%s, %s)", a, b); return;
        case KA_MIN: fprintf(f, "em_fmin(%s, %s)", a, b); return;
        default: G->failed = true; return;
        }
    }
    if (d == EM_BOOL) {
        switch (op) {
        case KA_ADD:
        case KA_MAX: fprintf(f, "(%s || %s)", a, b); return;
        case KA_MUL:
        case KA_MIN: fprintf(f, "(%s && %s)", a, b); return;
        case KA_SUB: fprintf(f, "(%s != %s)", a, b); return;
        default: G->failed = true; return;
        }
    }
    const char *t = ctype(d), *ut = utype(d);
    if (d == EM_I64 && (op == KA_ADD || op == KA_SUB || op == KA_MUL)) {
        /* i64 is index arithmetic: signed, as the CPU generator, so that
         * the compiler may assume no overflow */
        fprintf(f, "(%s %s %s)", a, op == KA_ADD ? "+" : op == KA_SUB ? "-" : "*", b);
        return;
    }
    switch (op) { /* i32 wraps, as the eager kernels */
    case KA_ADD: fprintf(f, "(%s)((%s)%s + (%s)%s)", t, ut, a, ut, b); return;
    case KA_SUB: fprintf(f, "(%s)((%s)%s - (%s)%s)", t, ut, a, ut, b); return;
    case KA_MUL: fprintf(f, "(%s)((%s)%s * (%s)%s)", t, ut, a, ut, b); return;
    case KA_MAX: fprintf(f, "(%s > %s ? %s : %s)", a, b, a, b); return;
    case KA_MIN: fprintf(f, "(%s < %s ? %s : %s)", a, b, a, b); return;
    case KA_IDIV:
    case KA_MOD: /* non-negative operands; a divisor of 0 acts as 1 */
        fprintf(f, "(%s)((%s)%s %s ((%s)%s + (%s)(%s == 0)))", t, ut, a, op == KA_IDIV ? "/" : "%",
                ut, b, ut, b);
        return;
    default: G->failed = true; return;
    }
}

/* A K_CAST.  Float to integer is a plain C conversion, as on the CPU:
 * kir_convert has already saturated the value into the integer's range. */
static void cast(egen *G, em_dtype from, em_dtype to, const char *x) {
    FILE *f = G->f;
    const char *h = to == EM_F16 || from == EM_F16 ? "f16" : "bf16";
    if (from == to) fputs(x, f);
    else if ((to == EM_F16 || to == EM_BF16) && from == EM_BOOL)
        fprintf(f, "em_to_%s(%s ? 1.0f : 0.0f)", h, x);
    else if (to == EM_F16 || to == EM_BF16) /* through f32, as the CPU converts */
        fprintf(f, from == EM_F64 ? "em_to_%s(em_f64_to_f32_odd(%s))" : "em_to_%s((float)%s)", h, x);
    else if ((from == EM_F16 || from == EM_BF16) && to == EM_BOOL)
        fprintf(f, "(em_from_%s(%s) != 0)", h, x);
    else if (from == EM_F16 || from == EM_BF16)
        fprintf(f, "(%s)em_from_%s(%s)", ctype(to), h, x);
    else if (to == EM_BOOL) fprintf(f, "(%s != 0)", x);
    else if (from == EM_BOOL) fprintf(f, "(%s)(%s ? 1 : 0)", ctype(to), x);
    else if (to == EM_I32 && from == EM_I64) fprintf(f, "(int)(unsigned)(unsigned long long)%s", x);
    else fprintf(f, "(%s)%s", ctype(to), x);
}

static void emit_seq(egen *G, int from, int to);
static void mark_filled(egen *G, int r);
static bool cache_index(const egen *G, int i, int r, int *base);
static void emit_vrange(egen *G, int r);

/* The register of key q for the split loop emitting now: rc<q>[it<r>], or
 * in a vector variant's head or tail rc<q>h[ih<r>] / rc<q>t[ih<r>]. */
static const char *rcname(egen *G, int q) {
    char *b = G->ring[G->ringi = (G->ringi + 1) % 8];
    snprintf(b, sizeof G->ring[0], "rc%d%s[%s%d]", q, G->seg == 1 ? "h" : G->seg == 2 ? "t" : "",
             G->seg ? "ih" : "it", G->cur_split);
    return b;
}

/* Whether rows of this kernel share a warp (a part of a warp a row): then
 * a warp's lanes past the last row compute a copy of it, and store nothing. */
static bool sublanes(const egen *G) { return G->shape == CU_ROWS && G->rpb > 1 && G->tpr < 32; }

/* Whether access i, in a lane of a vector step, reads its lane of the
 * vector loaded before the lanes (every access of a flat kernel; in a
 * rows kernel those plan_vec marks). */
static bool lane_vec(const egen *G, int i) { return G->lane >= 0 && (!G->vrows || G->vacc[i]); }

/* A store: at row scope in a CU_ROWS kernel only the row's thread 0 writes. */
static void emit_store(egen *G, int i, bool row_scope) {
    const k_inst *in = &G->k->insts[i];
    indent(G);
    if (sublanes(G)) fputs(row_scope ? "if (em_live && em_t == 0) " : "if (em_live) ", G->f);
    else if (row_scope) fputs("if (em_t == 0) ", G->f);
    fprintf(G->f, "%s[%s] = %s;\n", NM(in->src[0]), NM(in->src[1]), NM(in->src[2]));
}

static void emit_update(egen *G, const k_inst *in) {
    const k_inst *acc = &G->k->insts[in->src[0]];
    const char *a = NM(in->src[0]), *v = NM(in->src[1]);
    indent(G);
    fprintf(G->f, "%s = ", a);
    binary(G, acc->alu, acc->dtype, a, v);
    fputs(";\n", G->f);
}

/* Whether the current position is at row scope: directly inside the
 * parallel range of a CU_ROWS kernel, outside any inner loop. */
static bool at_row_scope(const egen *G) {
    return G->shape == CU_ROWS && G->tile_j < 0 && G->inner == 0;
}

static void emit_inst(egen *G, int i) {
    const k_inst *in = &G->k->insts[i];
    FILE *f = G->f;
    switch (in->op) {
    case K_BUF:
    case K_SIZE: return; /* parameters */
    case K_CONST:
        indent(G);
        fprintf(f, "const %s %s = ", ctype(in->dtype), NM(i));
        print_const(G, in);
        fputs(";\n", f);
        return;
    case K_LOAD:
        indent(G);
        if (lane_vec(G, i) && em_dtype_size(in->dtype) == 2) /* 2 halves a word */
            fprintf(f, "const unsigned short %s = (unsigned short)(L%d.%c >> %d);\n", NM(i), i,
                    "xyzw"[G->lane / 2], 16 * (G->lane % 2));
        else if (lane_vec(G, i)) /* from the vector loaded before the lanes */
            fprintf(f, "const %s %s = L%d.%c;\n", ctype(in->dtype), NM(i), i, "xyzw"[G->lane]);
        else if (G->staging && (in->flags & K_STAGED)) /* transposed through the tile */
            fprintf(f, "const %s %s = em_tl%d[em_x][em_y + em_k];\n", ctype(in->dtype), NM(i), i);
        else if (G->key_of && G->key_of[i] >= 0 && G->key_filled[G->key_of[i]])
            fprintf(f, "const %s %s = %s;\n", ctype(in->dtype), NM(i), rcname(G, G->key_of[i]));
        else if (G->key_of && G->key_of[i] >= 0)
            fprintf(f, "const %s %s = %s[%s]; %s = %s;\n", ctype(in->dtype), NM(i),
                    NM(in->src[0]), NM(in->src[1]), rcname(G, G->key_of[i]), NM(i));
        else
            fprintf(f, "const %s %s = %s[%s];\n", ctype(in->dtype), NM(i), NM(in->src[0]), NM(in->src[1]));
        return;
    case K_STORE:
        if (lane_vec(G, i) && em_dtype_size(G->k->insts[in->src[0]].dtype) == 2) {
            indent(G); /* even lanes start their word, odd lanes complete it */
            fprintf(f, G->lane % 2 ? "S%d.%c |= (unsigned)%s << 16;\n" : "S%d.%c = %s;\n", i,
                    "xyzw"[G->lane / 2], NM(in->src[2]));
            return;
        }
        if (lane_vec(G, i)) {
            indent(G);
            fprintf(f, "S%d.%c = %s;\n", i, "xyzw"[G->lane], NM(in->src[2]));
            return;
        }
        if (G->key_of && G->key_of[i] >= 0) {
            indent(G);
            fprintf(f, "%s = %s;\n", rcname(G, G->key_of[i]), NM(in->src[2]));
            if (G->dead[i]) return; /* a later pass stores here */
        }
        emit_store(G, i, at_row_scope(G));
        return;
    case K_ALU: {
        const k_inst *a = &G->k->insts[in->src[0]];
        em_dtype d = in->alu == KA_WHERE ? G->k->insts[in->src[1]].dtype : a->dtype;
        indent(G);
        fprintf(f, "const %s %s = ", ctype(in->dtype), NM(i));
        if (in->alu == KA_WHERE) {
            const char *c = NM(in->src[0]), *x = NM(in->src[1]), *y = NM(in->src[2]);
            fprintf(f, "(%s ? %s : %s)", c, x, y);
        } else if (in->nsrc == 1) {
            unary(G, in->alu, d, NM(in->src[0]));
        } else {
            const char *x = NM(in->src[0]), *y = NM(in->src[1]);
            binary(G, in->alu, d, x, y);
        }
        fputs(";\n", f);
        return;
    }
    case K_CAST:
        indent(G);
        fprintf(f, "const %s %s = ", ctype(in->dtype), NM(i));
        cast(G, G->k->insts[in->src[0]].dtype, in->dtype, NM(in->src[0]));
        fputs(";\n", f);
        return;
    case K_ACC:
        indent(G);
        fprintf(f, "%s %s = %s;\n", ctype(in->dtype), NM(i), NM(in->src[0]));
        return;
    case K_ACC_UPDATE: emit_update(G, in); return;
    default: G->failed = true; return;
    }
}

/* After a split loop: every accumulator it updated becomes the block's. */
static void emit_block_reductions(egen *G, int r) {
    const k_kernel *k = G->k;
    for (int i = r + 1; i < G->match[r]; i++) {
        const k_inst *u = &k->insts[i];
        if (u->op != K_ACC_UPDATE) continue;
        int a = u->src[0];
        bool first = true; /* reduce each accumulator once */
        for (int j = r + 1; j < i; j++)
            if (k->insts[j].op == K_ACC_UPDATE && k->insts[j].src[0] == a) first = false;
        if (!first || a > r) continue; /* declared inside: per thread only */
        const k_inst *acc = &k->insts[a];
        const char *fn = acc->alu == KA_ADD ? (acc->dtype == EM_BOOL ? "em_addb" : "em_add")
                                            : acc->alu == KA_MAX ? "em_max" : "em_min";
        indent(G);
        if (G->rpb > 1) /* a warp a row: shuffles only, no barrier */
            fprintf(G->f, "%s = em_warp_reduce(%s, %s(), %d);\n", NM(a), NM(a), fn, G->tpr);
        else if (G->cluster > 1) /* the block's, then the cluster's */
            fprintf(G->f, "%s = em_cluster_reduce(%s, %s(), (%s *)em_sh, em_csh, em_cp, %d);\n", NM(a),
                    NM(a), fn, ctype(acc->dtype), G->cluster);
        else
            fprintf(G->f, "%s = em_block_reduce(%s, %s(), (%s *)em_sh);\n", NM(a), NM(a), fn,
                    ctype(acc->dtype));
    }
}

static void emit_range(egen *G, int r) {
    if (G->vrows && G->split[r]) {
        emit_vrange(G, r);
        return;
    }
    const k_inst *in = &G->k->insts[r];
    const char *v = NM(r), *ext = NM(in->src[0]);
    const k_inst *e = &G->k->insts[in->src[0]];
    int T = G->tpr;
    bool counted = G->split[r] && e->op == K_CONST; /* a trip count the compiler sees */
    bool guard = false;
    indent(G);
    if (counted) {
        /* j = tid + it*T for it < ceil(E/T): a constant trip count, so the
         * loads of a pass are unrolled and in flight together */
        int64_t nit = (e->ival + T - 1) / T;
        guard = e->ival % T != 0;
        fprintf(G->f, "#pragma unroll %d\n", nit <= MAX_CACHED_NIT ? (int)nit : 4);
        indent(G);
        fprintf(G->f, "for (int it%d = 0; it%d < %" PRId64 "; it%d++) {\n", r, r, nit, r);
        G->depth++;
        indent(G);
        fprintf(G->f, "const long long %s = em_t + (long long)it%d * %d;\n", v, r, T);
        if (guard) {
            indent(G);
            fprintf(G->f, "if (%s < %s) {\n", v, ext);
        }
    } else if (G->split[r]) {
        fprintf(G->f, "for (long long %s = em_t; %s < %s; %s += %d) {\n", v, v, ext, v, T);
    } else {
        fprintf(G->f, "for (long long %s = 0; %s < %s; %s++) {\n", v, v, ext, v);
    }
    G->depth++;
    G->inner++;
    int outer_split = G->cur_split;
    G->cur_split = counted ? r : -1;
    emit_seq(G, r + 1, G->match[r]);
    G->cur_split = outer_split;
    G->inner--;
    G->depth--;
    if (guard) {
        indent(G);
        fputs("}\n", G->f);
    }
    if (counted) G->depth--;
    indent(G);
    fputs("}\n", G->f);
    if (G->split[r]) emit_block_reductions(G, r);
    if (G->key_of) mark_filled(G, r);
}

/* ---- CU_ROWS vector variant: V elements a step ----
 * NAME_v4 of a rows kernel (the launch picks it when every buffer is
 * 16-byte aligned) splits each pass's j over the row's threads by steps
 * of V elements (16 bytes of the widest buffer: 4 floats, 8 halves): step
 * c covers j = h + cV .. h + cV + V - 1, loaded and stored as one vector
 * per buffer, and each lane of the step runs the body with its own j.
 * h (0 to V - 1, the same for every access: plan_vec) is where the row's
 * first aligned vector starts; the h elements before it (the head) and
 * the fewer than V after the last whole step (the tail) run one element a
 * thread.  A row kept in registers is kept as vectors (rc<q>[it]) and the
 * head's and tail's elements (rc<q>h, rc<q>t). */

enum { MAX_CACHED_VEC = 8 }; /* vector steps a thread keeps: 128 bytes a key */

static const char *vtype_n(em_dtype d, int V) {
    if (em_dtype_size(d) == 2) return V == 8 ? "uint4" : "uint2"; /* 2 halves a word */
    return d == EM_F32 ? "float4" : "int4";
}

/* The vector of access i at step em_c<r>: &buf[base + h] as a vector
 * pointer (base + h is a multiple of V). */
static void vec_ptr(egen *G, int i, int base, bool store) {
    const k_inst *in = &G->k->insts[i];
    em_dtype d = G->k->insts[in->src[0]].dtype;
    fprintf(G->f, "reinterpret_cast<%s%s *>(%s + (%s + em_h))[em_c%d]", store ? "" : "const ",
            vtype_n(d, G->V), NM(in->src[0]), base >= 0 ? NM(base) : "0", G->cur_split);
}

/* The head (seg 1) or the tail (seg 2) of split loop r: at most V - 1
 * elements, one a thread. */
static void emit_vends(egen *G, int r, int seg, int64_t E) {
    FILE *f = G->f;
    int T = G->tpr, nh = (G->V - 1 + T - 1) / T;
    G->seg = seg;
    indent(G);
    fprintf(f, "#pragma unroll\n");
    indent(G);
    fprintf(f, "for (int ih%d = 0; ih%d < %d; ih%d++) {\n", r, r, nh, r);
    G->depth++;
    indent(G);
    if (seg == 1)
        fprintf(f, "const long long v%d = em_t + (long long)ih%d * %d;\n", r, r, T);
    else
        fprintf(f, "const long long v%d = em_h + em_nv%d * %d + em_t + (long long)ih%d * %d;\n", r, r,
                G->V, r, T);
    indent(G);
    if (seg == 1) fprintf(f, "if (v%d < em_h && v%d < %" PRId64 ") {\n", r, r, E);
    else fprintf(f, "if (v%d < %" PRId64 ") {\n", r, E);
    G->depth++;
    emit_seq(G, r + 1, G->match[r]);
    G->depth--;
    indent(G);
    fputs("}\n", f);
    G->depth--;
    indent(G);
    fputs("}\n", f);
    G->seg = 0;
}

/* The vector step's loads before its lanes, and its stores after them. */
static void emit_vloads(egen *G, int r) {
    const k_kernel *k = G->k;
    for (int i = r + 1; i < G->match[r]; i++) {
        const k_inst *in = &k->insts[i];
        if (!G->vacc[i]) continue;
        em_dtype d = k->insts[in->src[0]].dtype;
        int base, q = G->key_of[i];
        cache_index(G, i, r, &base);
        indent(G);
        if (in->op == K_STORE) {
            fprintf(G->f, "%s S%d;\n", vtype_n(d, G->V), i);
        } else if (q >= 0 && G->key_filled[q]) {
            fprintf(G->f, "const %s L%d = %s;\n", vtype_n(d, G->V), i, rcname(G, q));
        } else {
            fprintf(G->f, "const %s L%d = ", vtype_n(d, G->V), i);
            vec_ptr(G, i, base, false);
            fputs(";\n", G->f);
            if (q >= 0) {
                indent(G);
                fprintf(G->f, "%s = L%d;\n", rcname(G, q), i);
            }
        }
    }
}

static void emit_vstores(egen *G, int r) {
    const k_kernel *k = G->k;
    for (int i = r + 1; i < G->match[r]; i++) {
        if (!G->vacc[i] || k->insts[i].op != K_STORE) continue;
        int base, q = G->key_of[i];
        cache_index(G, i, r, &base);
        if (q >= 0) {
            indent(G);
            fprintf(G->f, "%s = S%d;\n", rcname(G, q), i);
            if (G->dead[i]) continue;
        }
        indent(G);
        if (sublanes(G)) fputs("if (em_live) ", G->f);
        vec_ptr(G, i, base, true);
        fprintf(G->f, " = S%d;\n", i);
    }
}

static void emit_vrange(egen *G, int r) {
    FILE *f = G->f;
    const k_kernel *k = G->k;
    int T = G->tpr, V = G->V;
    int64_t E = k->insts[k->insts[r].src[0]].ival, nitv = (E / V + T - 1) / T;
    bool ends = G->c1 % V != 0 || G->c0 % V != 0 || E % V != 0; /* a head or a tail */
    int outer = G->cur_split;
    G->cur_split = r;
    G->inner++;
    indent(G);
    fprintf(f, "const long long em_nv%d = %" PRId64 " > em_h ? (%" PRId64 " - em_h) / %d : 0;\n", r, E,
            E, V);
    if (ends) emit_vends(G, r, 1, E);
    indent(G);
    fprintf(f, "#pragma unroll %d\n", nitv <= MAX_CACHED_VEC ? (int)nitv : 4);
    indent(G);
    fprintf(f, "for (int it%d = 0; it%d < %" PRId64 "; it%d++) {\n", r, r, nitv, r);
    G->depth++;
    indent(G);
    fprintf(f, "const long long em_c%d = em_t + (long long)it%d * %d;\n", r, r, T);
    indent(G);
    fprintf(f, "if (em_c%d < em_nv%d) {\n", r, r);
    G->depth++;
    emit_vloads(G, r);
    for (int lane = 0; lane < V; lane++) {
        indent(G);
        fprintf(f, "{\n");
        G->depth++;
        indent(G);
        fprintf(f, "const long long v%d = em_h + em_c%d * %d + %d;\n", r, r, V, lane);
        G->lane = lane;
        emit_seq(G, r + 1, G->match[r]);
        G->lane = -1;
        G->depth--;
        indent(G);
        fputs("}\n", f);
    }
    emit_vstores(G, r);
    G->depth--;
    indent(G);
    fputs("}\n", f);
    G->depth--;
    indent(G);
    fputs("}\n", f);
    if (ends) emit_vends(G, r, 2, E);
    G->inner--;
    G->cur_split = outer;
    emit_block_reductions(G, r);
    mark_filled(G, r);
}

static void emit_seq(egen *G, int from, int to) {
    for (int i = from; i < to && !G->failed; i++) {
        if (G->k->insts[i].op == K_RANGE) {
            emit_range(G, i);
            i = G->match[i];
        } else {
            emit_inst(G, i);
        }
    }
}


/* ---- tiled kernels: transposed operands through shared memory ----
 * A parallel range with lower.c's tile hint (K_TILE: v = (b, a), a = v % A)
 * around one range j, a pointwise body: every store walks j contiguously,
 * the staged loads walk a.  A block of 32 x 8 threads takes a 32 x 32 tile
 * of (a, j) (grid-stride over the tiles of every b): first each staged
 * load is read with the warp's lanes along a (coalesced) into a padded
 * [32][33] array, so that the lanes' later reads along j fall in 32
 * different banks; then, after a barrier, each thread computes 4 elements
 * j = j0 + lane, a = a0 + warp + 8k, reading the staged values from the
 * tile and everything else (stores included) along j, coalesced.  A load
 * phase needs the staged loads' indices at its own (a, j): the
 * instructions they depend on (the slice) are printed again there with v
 * and j bound to that position. */

enum { TILE = 32, TILE_ROWS = 8, TILE_SMEM = 32 * 1024 };

/* Marks in G->slice what instruction i depends on inside the parallel
 * range (after P, except j); false if that includes a load or an
 * accumulator (not pure index arithmetic). */
static bool mark_slice(egen *G, int i) {
    const k_inst *in = &G->k->insts[i];
    if (i <= G->par || i == G->tile_j || G->slice[i]) return true;
    if (in->op == K_LOAD || in->op == K_ACC || in->op == K_ACC_UPDATE) return false;
    G->slice[i] = true;
    for (int s = 0; s < in->nsrc; s++)
        if (!mark_slice(G, in->src[s])) return false;
    return true;
}

/* Whether the kernel can run tiled: the hint, one innermost range j whose
 * extent is known before the loop, nothing but pure arithmetic, loads and
 * stores inside, staged loads' indices pure arithmetic, and their tiles
 * within TILE_SMEM. */
static bool plan_tile(egen *G) {
    const k_kernel *k = G->k;
    int P = G->par;
    if (P < 0 || !(k->insts[P].flags & K_TILE)) return false;
    int j = -1, bytes = 0;
    for (int i = P + 1; i < G->match[P]; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op == K_ACC || in->op == K_ACC_UPDATE) return false;
        if (in->op == K_RANGE && (j >= 0 || G->match[i] != G->match[P] - 1)) return false;
        if (in->op == K_RANGE) j = i;
        if (in->op == K_STORE && j < 0) return false;
    }
    if (j < 0) return false;
    const k_inst *ej = &k->insts[k->insts[j].src[0]], *ea = &k->insts[k->insts[P].src[1]];
    if ((ej->op != K_CONST && ej->op != K_SIZE) || (ea->op != K_CONST && ea->op != K_SIZE)) return false;
    G->tile_j = j;
    int staged = 0;
    for (int i = j + 1; i < G->match[j]; i++) {
        const k_inst *in = &k->insts[i];
        if (!(in->op == K_LOAD && (in->flags & K_STAGED))) continue;
        staged++;
        bytes += TILE * (TILE + 1) * (int)em_dtype_size(in->dtype);
        if (!mark_slice(G, in->src[1]) || bytes > TILE_SMEM) staged = -1000;
    }
    if (staged <= 0) G->tile_j = -1;
    return staged > 0;
}

/* The tile's loop over k (4 rows a thread) at the position (a, j) given as
 * C expressions, with v and j bound there; the body follows. */
static void open_tile_rows(egen *G, const char *a, const char *j) {
    FILE *f = G->f;
    fprintf(f, "#pragma unroll\n    for (int em_k = 0; em_k < %d; em_k += %d) {\n", TILE, TILE_ROWS);
    fprintf(f, "      const long long em_a = em_a0 + %s, em_j = em_j0 + %s;\n", a, j);
    fputs("      if (em_a < em_A && em_j < em_B) {\n", f);
    fprintf(f, "        const long long v%d = em_o0 + em_a;\n", G->par);
    fprintf(f, "        const long long v%d = em_j;\n", G->tile_j);
    G->depth = 3;
}

/* Load phase: each staged load into its tile, lanes along a. */
static void emit_tile_loads(egen *G) {
    const k_kernel *k = G->k;
    open_tile_rows(G, "em_x", "em_y + em_k");
    for (int i = G->par + 1; i < G->match[G->tile_j]; i++)
        if (G->slice[i]) emit_inst(G, i);
    for (int i = G->tile_j + 1; i < G->match[G->tile_j]; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op != K_LOAD || !(in->flags & K_STAGED)) continue;
        indent(G);
        fprintf(G->f, "em_tl%d[em_y + em_k][em_x] = %s[%s];\n", i, NM(in->src[0]), NM(in->src[1]));
    }
    fputs("      }\n    }\n    __syncthreads();\n", G->f);
}

static void emit_tile(egen *G) {
    FILE *f = G->f;
    const k_kernel *k = G->k;
    int P = G->par, J = G->tile_j;
    for (int i = J + 1; i < G->match[J]; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op == K_LOAD && (in->flags & K_STAGED))
            fprintf(f, "  __shared__ %s em_tl%d[%d][%d];\n", ctype(in->dtype), i, TILE, TILE + 1);
    }
    /* j's extent may be a constant defined inside the parallel range */
    fprintf(f, "  const long long em_A = %s, em_B = ", NM(k->insts[P].src[1]));
    const k_inst *ej = &k->insts[k->insts[J].src[0]];
    if (ej->op == K_CONST) print_const(G, ej);
    else fputs(NM(k->insts[J].src[0]), f);
    fputs(";\n", f);
    fprintf(f, "  const long long em_na = (em_A + %d) / %d, em_nb = (em_B + %d) / %d;\n", TILE - 1, TILE,
            TILE - 1, TILE);
    fprintf(f, "  const long long em_nt = em_A > 0 ? %s / em_A * em_na * em_nb : 0;\n", G->extent);
    fputs("  const int em_x = threadIdx.x & 31, em_y = threadIdx.x >> 5;\n", f);
    fputs("  for (long long em_t = blockIdx.x; em_t < em_nt; em_t += gridDim.x) {\n", f);
    fprintf(f, "    const long long em_j0 = em_t %% em_nb * %d, em_r = em_t / em_nb;\n", TILE);
    fprintf(f, "    const long long em_a0 = em_r %% em_na * %d, em_o0 = em_r / em_na * em_A;\n", TILE);
    emit_tile_loads(G);
    open_tile_rows(G, "em_y + em_k", "em_x");
    G->staging = true;
    emit_seq(G, P + 1, J);
    emit_seq(G, J + 1, G->match[J]);
    G->staging = false;
    fputs("      }\n    }\n    __syncthreads(); /* the next tile's loads overwrite this one */\n  }\n", f);
}

/* ---- the kernel's shape ---- */

static int pow2_at_least(int64_t n) {
    int p = 32;
    while (p < n && p < 1024) p *= 2;
    return p;
}

/* Elements per thread a rows kernel aims for: EMBER_CUDA_ROW_ELEMS (1 to
 * 64, a forced override), else the schedule's (p->elems, 0: default),
 * else CUDA_ROW_ELEMS.  Measured on the H200, 32768 x 4096 rows
 * (fraction of copy bandwidth, softmax / layer_norm): 4: 38% / 36%,
 * 8: 84% / 64%, 16: 85% / 88%, 32: 85% / 91%. */
static int row_elems(const cuda_row_params *p) {
    char buf[32];
    const char *e = em_getenv("EMBER_CUDA_ROW_ELEMS", buf, sizeof buf);
    int v = e ? atoi(e) : 0;
    if (v >= 1 && v <= 64) return v;
    return p && p->elems >= 1 && p->elems <= 64 ? p->elems : CUDA_ROW_ELEMS;
}

/* A row a warp covers takes the fewest lanes (a power of 2) that hold it
 * at SHORT_ROW_BYTES a lane (of its widest buffer; the default of the
 * schedule's lane bytes); rows a block are bounded by the launch
 * descriptor's range (cuda_kernel.c: at most 64). */
enum { SHORT_ROW_BYTES = CUDA_ROW_LANE_BYTES, CUDA_MAX_ROWS_PER_BLOCK = 64 };

/* Bytes a lane of a short row aims for: EMBER_CUDA_ROW_LANE_BYTES (4 to
 * 4096, a forced override), else the schedule's, else SHORT_ROW_BYTES. */
static int64_t row_lane_bytes(const cuda_row_params *p) {
    char buf[32];
    const char *e = em_getenv("EMBER_CUDA_ROW_LANE_BYTES", buf, sizeof buf);
    int v = e ? atoi(e) : 0;
    if (v >= 4 && v <= 4096) return v;
    return p && p->lane_bytes >= 4 && p->lane_bytes <= 4096 ? p->lane_bytes : SHORT_ROW_BYTES;
}

/* EMBER_CUDA_ROW_VEC=0 drops rows kernels' 16-byte variant (a knob for
 * measuring it, forced over the schedule's p->vec: 0 default (on), 1 on,
 * -1 off). */
static bool row_vec(const cuda_row_params *p) {
    char buf[8];
    const char *e = em_getenv("EMBER_CUDA_ROW_VEC", buf, sizeof buf);
    if (e) return strcmp(e, "0") != 0;
    return !p || p->vec >= 0;
}

static void choose_shape(egen *G, cuda_src *out) {
    const k_kernel *k = G->k;
    G->tpr = G->rpb = G->scale = 1;
    G->par = -1;
    bool outside = false; /* loops or stores outside the parallel range */
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op == K_RANGE && (in->flags & K_PARALLEL) && G->par < 0) {
            G->par = i;
            i = G->match[i];
        } else if (in->op == K_RANGE || in->op == K_STORE || in->op == K_ACC_UPDATE) {
            outside = true;
        }
    }
    out->extent = 1;
    out->extent_size = -1;
    const k_inst *ext = G->par >= 0 ? &k->insts[k->insts[G->par].src[0]] : NULL;
    if (!ext || outside || (ext->op != K_CONST && ext->op != K_SIZE)) {
        G->shape = CU_SERIAL;
        G->threads = 1;
        return;
    }
    /* a size parameter (dynamic shapes): the launch reads it from the
     * size arguments, and the text names it */
    if (ext->op == K_SIZE) out->extent_size = (int)ext->ival;
    else out->extent = ext->ival;
    snprintf(G->extent, sizeof G->extent, ext->op == K_SIZE ? "s%" PRId64 : "%" PRId64 "ll", ext->ival);
    G->shape = CU_FLAT;
    G->threads = 256;
    int64_t widest = 0;
    size_t widest_elem = 1; /* bytes of the widest buffer the kernel accesses */
    for (int i = G->par + 1; i < G->match[G->par]; i++) {
        const k_inst *in = &k->insts[i];
        if ((in->op == K_LOAD || in->op == K_STORE) && em_dtype_size(k->insts[in->src[0]].dtype) > widest_elem)
            widest_elem = em_dtype_size(k->insts[in->src[0]].dtype);
    }
    for (int i = G->par + 1; i < G->match[G->par]; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op != K_RANGE) continue;
        G->shape = CU_ROWS;
        G->split[i] = true;
        const k_inst *e = &k->insts[in->src[0]];
        int64_t n = e->op == K_CONST ? e->ival : 1024;
        if (n > widest) widest = n;
        i = G->match[i]; /* deeper loops stay serial */
    }
    G->widest = widest;
    G->scale = widest_elem == 2 ? 2 : 1;
    /* rows: row_elems() elements per thread, from a warp up to 1024
     * threads.  Few elements per thread (4: 1024 threads, 2 rows in flight
     * per SM) left the kernels latency-bound on their passes and barriers. */
    G->tpr = G->threads, G->rpb = 1;
    if (G->shape == CU_ROWS) {
        int per = row_elems(G->params);
        G->threads = G->tpr = pow2_at_least((widest + per - 1) / per);
        /* past a warp, a thread of a half-typed row aims for twice the
         * elements: the bytes an f32 thread moves (softmax [8191, 4099]
         * bf16 on the H200: 37.9% -> 45.8% of copy, layer norm 44.5% ->
         * 55.9%).  Rows a warp covers keep their lanes: a lane of 8 half
         * vectors in a multi-pass kernel takes 160-236 registers (its
         * halves and their f32 values; ptxas), one block an SM (a bf16
         * layer norm of 1000 at 16 lanes a row: 53% -> 42%). */
        if (G->tpr > 32 && G->scale > 1) {
            int t = pow2_at_least((widest + per * G->scale - 1) / (per * G->scale));
            G->threads = G->tpr = t > 64 ? t : 64;
        }
        /* rows a warp covers: a warp each, 8 to a block, which lifts the
         * one-warp blocks' occupancy (at most 32 blocks an SM: half its
         * warps) and drops the block reductions' barriers.  Short rows
         * share a warp: 1 to 32 lanes a row, SHORT_ROW_BYTES a lane, so
         * that a warp has several rows' loads in flight (a warp a 37-wide
         * row kept 27 of its 32 lanes idle on the second load: 46% of copy
         * on the H200.  Lanes a 37-wide f32 softmax row, queued calls:
         * 4 (64 bytes a lane) 65%, 2 (128) 46%, 1 (256) 9%; the row sum
         * 86%, 75%, 53%; 8 lanes 58% (single calls), 16 lanes 30%:
         * docs/benchmarks.md) */
        if (G->tpr == 32) {
            int lanes = 1;
            int64_t lane_bytes = row_lane_bytes(G->params);
            while (lanes < 32 && lanes * lane_bytes < widest * (int64_t)widest_elem) lanes *= 2;
            G->tpr = lanes;
            G->rpb = 256 / lanes < CUDA_MAX_ROWS_PER_BLOCK ? 256 / lanes : CUDA_MAX_ROWS_PER_BLOCK;
            G->threads = G->rpb * lanes;
        }
    }
}

/* A tiled kernel launches as a rows kernel of one tile a block (unroll
 * 1: the launcher's grid is min(extent, what fills the GPU), and the
 * kernel strides over the rest): extent is the tile count, or with sizes
 * as parameters a count large enough that the grid fills the GPU. */
static void choose_tile(egen *G, cuda_src *out) {
    const k_kernel *k = G->k;
    const k_inst *eo = &k->insts[k->insts[G->par].src[0]], *ea = &k->insts[k->insts[G->par].src[1]];
    const k_inst *ej = &k->insts[k->insts[G->tile_j].src[0]];
    G->shape = CU_ROWS;
    G->threads = TILE * TILE_ROWS;
    G->tpr = G->threads, G->rpb = 1;
    for (int i = 0; i < k->n; i++) G->split[i] = false;
    out->extent_size = -1;
    if (eo->op == K_CONST && ea->op == K_CONST && ej->op == K_CONST)
        out->extent = ea->ival > 0 ? eo->ival / ea->ival * ((ea->ival + TILE - 1) / TILE) *
                                         ((ej->ival + TILE - 1) / TILE)
                                   : 0;
    else
        out->extent = (int64_t)1 << 30;
}

/* ---- the function ---- */

static void emit_params(egen *G) {
    const k_kernel *k = G->k;
    FILE *f = G->f;
    bool first = true;
    for (int p = 0; p < k->nbufs; p++) { /* in parameter order */
        for (int i = 0; i < k->n; i++) {
            const k_inst *in = &k->insts[i];
            if (in->op != K_BUF || in->ival != p) continue;
            fprintf(f, "%s%s%s *__restrict__ p%d", first ? "" : ", ", G->written[p] ? "" : "const ",
                    ctype(in->dtype), p);
            first = false;
            break;
        }
    }
    for (int p = 0; p < k->nsizes; p++) {
        fprintf(f, "%slong long s%d", first ? "" : ", ", p);
        first = false;
    }
}

/* The parallel range as a grid-stride loop over elements (CU_FLAT): a main
 * loop whose U elements per thread are all in bounds, then the tail. */
static void emit_flat(egen *G, int U) {
    FILE *f = G->f;
    int P = G->par, T = G->threads;
    fprintf(f, "  const long long n = %s;\n", G->extent);
    fprintf(f, "  const long long step = (long long)gridDim.x * %d;\n", T * U);
    fprintf(f, "  long long base = (long long)blockIdx.x * %d + threadIdx.x;\n", T * U);
    fprintf(f, "  for (; base + %d < n; base += step) {\n", (U - 1) * T);
    fprintf(f, "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n", U);
    fprintf(f, "      const long long v%d = base + (long long)u * %d;\n", P, T);
    G->depth = 2;
    emit_seq(G, P + 1, G->match[P]);
    fputs("    }\n  }\n", f);
    fprintf(f, "  for (long long v%d = base; v%d < n; v%d += %d) {\n", P, P, P, T);
    G->depth = 1;
    emit_seq(G, P + 1, G->match[P]);
    fputs("  }\n", f);
}

/* Whether the CU_FLAT kernel can step by vectors of 4 elements: every load
 * and store inside the parallel range reads or writes element v (the
 * range variable itself) of a 4-byte buffer (16-byte vectors) or a half
 * one (8 bytes: a uint2 of 4 halves). */
static bool vectorizable(const egen *G) {
    const k_kernel *k = G->k;
    int P = G->par;
    for (int i = P + 1; i < G->match[P]; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op != K_LOAD && in->op != K_STORE) continue;
        em_dtype d = k->insts[in->src[0]].dtype;
        if (in->src[1] != P || (d != EM_F32 && d != EM_I32 && d != EM_F16 && d != EM_BF16))
            return false;
    }
    return true;
}

static const char *vtype(em_dtype d) {
    return d == EM_F32 ? "float4" : d == EM_I32 ? "int4" : "uint2"; /* half: 4 in a uint2 */
}

/* NAME_v4: four consecutive elements per thread and step, loaded and
 * stored as one 16-byte vector each (the launch picks it when every
 * buffer is 16-byte aligned); the last n % 4 elements one by one. */
static void emit_flat_v4(egen *G) {
    FILE *f = G->f;
    const k_kernel *k = G->k;
    int P = G->par, T = G->threads;
    fprintf(f, "  const long long n = %s, nv = n / 4;\n", G->extent);
    fprintf(f, "  const long long step = (long long)gridDim.x * %d;\n", T);
    fprintf(f, "  for (long long q = (long long)blockIdx.x * %d + threadIdx.x; q < nv; q += step) {\n", T);
    for (int i = P + 1; i < G->match[P]; i++) {
        const k_inst *in = &k->insts[i];
        em_dtype d = in->op == K_LOAD || in->op == K_STORE ? k->insts[in->src[0]].dtype : EM_F32;
        if (in->op == K_LOAD)
            fprintf(f, "    const %s L%d = reinterpret_cast<const %s *>(%s)[q];\n", vtype(d), i,
                    vtype(d), nm(G, in->src[0]));
        else if (in->op == K_STORE)
            fprintf(f, "    %s S%d;\n", vtype(d), i);
    }
    for (int lane = 0; lane < 4; lane++) {
        fprintf(f, "    {\n      const long long v%d = q * 4 + %d;\n", P, lane);
        G->lane = lane;
        G->depth = 2;
        emit_seq(G, P + 1, G->match[P]);
        G->lane = -1;
        fputs("    }\n", f);
    }
    for (int i = P + 1; i < G->match[P]; i++) {
        const k_inst *in = &k->insts[i];
        em_dtype d = in->op == K_STORE ? k->insts[in->src[0]].dtype : EM_F32;
        if (in->op == K_STORE)
            fprintf(f, "    reinterpret_cast<%s *>(%s)[q] = S%d;\n", vtype(d), nm(G, in->src[0]), i);
    }
    fputs("  }\n", f);
    fprintf(f, "  for (long long v%d = nv * 4 + (long long)blockIdx.x * %d + threadIdx.x; v%d < n; v%d += step) {\n",
            P, T, P, P);
    G->depth = 1;
    emit_seq(G, P + 1, G->match[P]);
    fputs("  }\n", f);
}

/* ---- CU_ROWS: the row's values kept in registers across passes ----
 * Every pass of a rows kernel walks j = tid + it*T over the same row, so a
 * thread touches the same elements in each pass.  A load or store of
 * buffer b at index base + j (base fixed for the row) in such a loop (a
 * constant trip count of at most 16, fully unrolled) is keyed (b, base,
 * extent): the first access fills registers rc<key>[it], later passes read
 * them instead of memory (softmax's and layer_norm's second and third reads
 * of x), and a store that a later pass overwrites at the same place
 * (lower.c's stash) only goes to the registers.  A buffer with any other
 * access is left alone. */


/* The key-able index of access i in counted split loop r: base (or -1
 * for j itself) via *base; false when the index is anything else. */
static bool cache_index(const egen *G, int i, int r, int *base) {
    const k_kernel *k = G->k;
    int idx = k->insts[i].src[1];
    if (idx == r) {
        *base = -1;
        return true;
    }
    const k_inst *a = &k->insts[idx];
    if (a->op != K_ALU || a->alu != KA_ADD) return false;
    int o = a->src[0] == r ? a->src[1] : a->src[1] == r ? a->src[0] : -2;
    if (o < -1 || o >= r) return false; /* the base must be fixed before the loop */
    *base = o;
    return true;
}

static void plan_row_cache(egen *G, int *stack, int *kbuf, int *kbase, int64_t *kext) {
    const k_kernel *k = G->k;
    bool *bad = G->written + k->nbufs + 1; /* scratch: per buffer parameter */
    int depth = 0;
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        G->key_of[i] = -1;
        if (in->op == K_RANGE) stack[depth++] = i;
        else if (in->op == K_END) depth--;
        if (in->op != K_LOAD && in->op != K_STORE) continue;
        int b = (int)k->insts[in->src[0]].ival, r = depth ? stack[depth - 1] : -1, base;
        if (r < 0 || G->nit_of[r] <= 0 || !cache_index(G, i, r, &base) || (G->vrows && !G->vacc[i])) {
            bad[b] = true;
            continue;
        }
        int64_t ext = k->insts[k->insts[r].src[0]].ival;
        int key = -1;
        for (int q = 0; q < G->nkeys && key < 0; q++)
            if (kbuf[q] == b && kbase[q] == base && kext[q] == ext) key = q;
        if (key < 0) {
            key = G->nkeys++;
            kbuf[key] = b, kbase[key] = base, kext[key] = ext;
            G->key_dtype[key] = k->insts[in->src[0]].dtype;
            G->key_nit[key] = G->nit_of[r];
        }
        G->key_of[i] = key;
    }
    for (int q = 0; q < G->nkeys; q++) /* two keys, one buffer: they might alias */
        for (int q2 = q + 1; q2 < G->nkeys; q2++)
            if (kbuf[q] == kbuf[q2]) bad[kbuf[q]] = true;
    for (int i = 0; i < k->n; i++) { /* drop the keys of buffers used otherwise */
        const k_inst *in = &k->insts[i];
        if (G->key_of[i] >= 0 && bad[k->insts[in->src[0]].ival]) G->key_of[i] = -1;
    }
    for (int i = 0; i < k->n; i++) { /* stores a later store of the key replaces */
        if (k->insts[i].op != K_STORE || G->key_of[i] < 0) continue;
        for (int j = i + 1; j < k->n && !G->dead[i]; j++)
            if (k->insts[j].op == K_STORE && G->key_of[j] == G->key_of[i]) G->dead[i] = true;
    }
}

/* Trip counts of the split loops (in vector steps for the vector
 * variant), then the register cache's plan. */
static em_status plan_rows(egen *G, int *stack, int *kbuf, int *kbase, int64_t *kext) {
    const k_kernel *k = G->k;
    size_t nn = (size_t)k->n + 1;
    for (int i = 0; i < k->n; i++) {
        const k_inst *e = G->split[i] ? &k->insts[k->insts[i].src[0]] : NULL;
        int64_t per = G->vrows ? G->V : 1, most = G->vrows ? MAX_CACHED_VEC : MAX_CACHED_NIT;
        int64_t nit = e && e->op == K_CONST ? (e->ival / per + G->tpr - 1) / G->tpr : 0;
        G->nit_of[i] = nit <= most ? (int)nit : 0;
    }
    if (!G->key_of) {
        G->key_of = em_calloc(nn, sizeof(int));
        G->key_dtype = em_calloc(nn, sizeof(em_dtype));
        G->key_nit = em_calloc(nn, sizeof(int));
        G->key_filled = em_calloc(nn, sizeof(bool));
        G->dead = em_calloc(nn, sizeof(bool));
    }
    if (!G->key_of || !G->key_dtype || !G->key_nit || !G->key_filled || !G->dead) return em_last_status();
    /* planned again for each variant: from nothing */
    memset(G->key_filled, 0, nn * sizeof(bool));
    memset(G->dead, 0, nn * sizeof(bool));
    memset(G->written + k->nbufs + 1, 0, ((size_t)k->nbufs + 1) * sizeof(bool));
    G->nkeys = 0;
    plan_row_cache(G, stack, kbuf, kbase, kext);
    return EM_OK;
}

/* base (an instruction before the split loop, or -1 for 0) as
 * row * c1 + c0, modulo 2^64 (only its value mod V matters); false when
 * it is not such a sum of products of the row with constants. */
static bool affine(const egen *G, int o, int depth, uint64_t *c1, uint64_t *c0) {
    const k_inst *in = o >= 0 ? &G->k->insts[o] : NULL;
    uint64_t a1, a0, b1, b0;
    if (!in) *c1 = 0, *c0 = 0;
    else if (o == G->par) *c1 = 1, *c0 = 0;
    else if (in->op == K_CONST && in->dtype == EM_I64) *c1 = 0, *c0 = (uint64_t)in->ival;
    else if (depth > 8 || in->op != K_ALU || in->nsrc != 2 || (in->alu != KA_ADD && in->alu != KA_MUL))
        return false;
    else if (!affine(G, in->src[0], depth + 1, &a1, &a0) || !affine(G, in->src[1], depth + 1, &b1, &b0))
        return false;
    else if (in->alu == KA_ADD) *c1 = a1 + b1, *c0 = a0 + b0;
    else if (a1 && b1) return false; /* row * row */
    else *c1 = a1 * b0 + b1 * a0, *c0 = a0 * b0;
    return true;
}

/* Whether a rows kernel has a vector variant, and which accesses move
 * vectors (G->vacc): every split loop has a constant extent and no loop
 * inside, every store there depends on j, and no load there follows a
 * store to its buffer (a vector step loads before its lanes and stores
 * after them).  The candidates are the accesses at base + j (cache_index)
 * of 2- or 4-byte buffers with base affine in the row; V is 16 bytes of
 * the widest; those whose base is congruent mod V to the most candidates'
 * move vectors (one h then serves the row: x and the output of a row of
 * 4099, say, while a [4099] weight starts elsewhere in most rows), every
 * other access runs in each lane with its own j. */
static bool plan_vec(egen *G, uint64_t *a1, uint64_t *a0) {
    const k_kernel *k = G->k;
    bool *dep = G->slice; /* scratch: depends on the split loop's j */
    size_t widest = 0;
    for (int r = G->par + 1; r < G->match[G->par]; r++) {
        if (k->insts[r].op != K_RANGE || !G->split[r]) continue;
        if (k->insts[k->insts[r].src[0]].op != K_CONST) return false;
        for (int i = r + 1; i < G->match[r]; i++) {
            const k_inst *in = &k->insts[i];
            if (in->op == K_RANGE) return false;
            dep[i] = false;
            for (int q = 0; q < in->nsrc; q++)
                if (in->src[q] == r || (in->src[q] > r && dep[in->src[q]])) dep[i] = true;
            if (in->op != K_LOAD && in->op != K_STORE) continue;
            int x = in->src[1], base;
            bool on_j = x == r || (x > r && dep[x]);
            if (!on_j && in->op == K_STORE) return false;
            for (int q = r + 1; q < i && in->op == K_LOAD; q++)
                if (k->insts[q].op == K_STORE && k->insts[k->insts[q].src[0]].ival == k->insts[in->src[0]].ival)
                    return false;
            size_t sz = em_dtype_size(k->insts[in->src[0]].dtype);
            if (!on_j || (sz != 2 && sz != 4) || !cache_index(G, i, r, &base) ||
                !affine(G, base, 0, &a1[i], &a0[i]))
                continue;
            G->vacc[i] = true; /* a candidate */
            if (sz > widest) widest = sz;
        }
        r = G->match[r];
    }
    if (widest == 0) return false;
    uint64_t V = 16 / widest;
    int best = -1, best_n = 0;
    for (int i = 0; i < k->n; i++) {
        int n = 0;
        for (int q = 0; q < k->n && G->vacc[i]; q++)
            n += G->vacc[q] && (a1[q] - a1[i]) % V == 0 && (a0[q] - a0[i]) % V == 0;
        if (n > best_n) best = i, best_n = n;
    }
    for (int q = 0; q < k->n; q++)
        if (G->vacc[q] && ((a1[q] - a1[best]) % V || (a0[q] - a0[best]) % V)) G->vacc[q] = false;
    G->V = (int)V;
    G->c1 = (int64_t)(a1[best] % V);
    G->c0 = (int64_t)(a0[best] % V);
    return true;
}

/* After split loop r: the keys it touched are in registers. */
static void mark_filled(egen *G, int r) {
    for (int i = r + 1; i < G->match[r]; i++)
        if (G->key_of[i] >= 0) G->key_filled[G->key_of[i]] = true;
}

/* ---- CU_ROWS over a thread-block cluster (sm_90 and up) ----
 * A row longer than a block keeps in registers (more than 1024 threads at
 * the elements a thread keeps: a 50257-wide f32 vocabulary) was read from
 * memory again on each pass, at about 30% of copy bandwidth on the H200.
 * Such a row is split over the C blocks of a cluster instead: the
 * cluster's threads act as one block of C x T threads (em_t = rank * T +
 * threadIdx.x, j = em_t + it * C * T), so each block keeps its part of the
 * row in registers as before (plan_row_cache, with tpr = C * T), and an
 * accumulator is combined over the block, then over the cluster through
 * distributed shared memory: one kernel, each element read once and
 * written once.  Row-scope stores are made by the cluster's thread 0. */

enum { CLUSTER_PORTABLE = 8, CLUSTER_MAX = 16 }; /* blocks; above 8 non-portable */

static const char cluster_helpers[] =
    "/* The blocks of a cluster share a row: each combines its partial over\n"
    "   its threads, then reads every block's from that block's shared\n"
    "   memory in rank order, so every block gets the same bits.  csh has\n"
    "   2 slots used in turn (cp): a slot is written again two reductions\n"
    "   later, after a cluster barrier that its readers have all passed. */\n"
    "__device__ __forceinline__ void em_cluster_sync() {\n"
    "  __cluster_barrier_arrive();\n"
    "  __cluster_barrier_wait();\n"
    "}\n"
    "template <class T, class F>\n"
    "__device__ __forceinline__ T em_cluster_reduce(T v, F f, T *sh, long long *csh, int &cp, int C) {\n"
    "  v = em_block_reduce(v, f, sh);\n"
    "  T *slot = reinterpret_cast<T *>(csh + cp);\n"
    "  if (threadIdx.x == 0) *slot = v;\n"
    "  em_cluster_sync();\n"
    "  v = *(volatile T *)__cluster_map_shared_rank(slot, 0);\n"
    "  for (int r = 1; r < C; r++) v = f(v, *(volatile T *)__cluster_map_shared_rank(slot, r));\n"
    "  cp ^= 1;\n"
    "  return v;\n"
    "}\n";

/* EMBER_CUDA_CLUSTER=0 keeps long rows in one block (a knob for
 * measuring clusters).  It changes the text, not the kernel's key (the IR
 * and the target): a kernel or plan cached under the other setting is
 * reused, so measure each setting with its own EMBER_CACHE_DIR. */
static bool cluster_wanted(void) {
    char buf[8];
    const char *e = em_getenv("EMBER_CUDA_CLUSTER", buf, sizeof buf);
    return !e || strcmp(e, "0") != 0;
}

/* Threads a block of a cluster kernel starts from:
 * EMBER_CUDA_CLUSTER_THREADS (128 to 1024, a power of 2; a tuning knob),
 * else 256.  H200, [256, 50257] f32 softmax (% of copy): 256 threads x 7
 * blocks 45%, 512 x 4 30%, 1024 x 2 40%; one block of 1024 32%
 * (docs/benchmarks.md). */
static int cluster_threads(void) {
    char buf[32];
    const char *e = em_getenv("EMBER_CUDA_CLUSTER_THREADS", buf, sizeof buf);
    int v = e ? atoi(e) : 0;
    return v >= 128 && v <= 1024 && (v & (v - 1)) == 0 ? v : 256;
}

/* A rows kernel of one block a row whose longest constant row does not
 * fit one block's registers: more than 1024 threads at the elements a
 * thread keeps (row_elems(); in a kernel with a vector variant, the
 * variant's MAX_CACHED_VEC vectors: 32 floats, 64 halves, so a bf16 row of
 * 50257 still fits one block).  It takes C blocks a row of B threads, B
 * the first of cluster_threads(), doubled up to 1024, with C <= 8 (the
 * portable cluster size; past 1024 threads up to CLUSTER_MAX blocks, the
 * rest of the row re-read each pass).  Rows of a size parameter (1024
 * assumed) keep one block: the text serves every length. */
static void choose_cluster(egen *G, cuda_src *out, bool vec) {
    G->cluster = out->cluster = 1;
    if (G->arch < 90 || G->shape != CU_ROWS || G->tile_j >= 0 || G->rpb != 1 || !cluster_wanted()) return;
    int per = vec ? MAX_CACHED_VEC * G->V : row_elems(G->params) * G->scale;
    if (per < row_elems(G->params) * G->scale) per = row_elems(G->params) * G->scale;
    int64_t need = (G->widest + per - 1) / per; /* threads the row wants */
    if (need <= 1024) return;
    int64_t B = cluster_threads(), c;
    while ((c = (need + B - 1) / B) > CLUSTER_PORTABLE && B < 1024) B *= 2;
    if (c > CLUSTER_MAX) c = CLUSTER_MAX;
    G->cluster = out->cluster = (int)c;
    G->threads = out->threads = pow2_at_least((need + c - 1) / c);
    G->tpr = G->threads * G->cluster;
}

/* The row loop of a cluster kernel: cluster blockIdx.x / C takes rows
 * blockIdx.x / C, + gridDim.x / C, ... (the launch's grid is a multiple
 * of C, and the cluster's blocks are consecutive). */
static void emit_cluster_loop(egen *G) {
    FILE *f = G->f;
    int P = G->par, C = G->cluster;
    fputs("  __shared__ double em_sh[32];\n  __shared__ long long em_csh[2];\n", f);
    fprintf(f, "  const int em_t = (int)__clusterRelativeBlockRank() * %d + (int)threadIdx.x;\n", G->threads);
    fputs("  int em_cp = 0;\n", f);
    fprintf(f, "  for (long long v%d = blockIdx.x / %d; v%d < %s; v%d += gridDim.x / %d) {\n", P, C, P,
            G->extent, P, C);
}

static void emit_rows(egen *G) {
    FILE *f = G->f;
    int P = G->par;
    if (G->rpb > 1 && G->tpr == 32) { /* warp w of the block takes rows blockIdx.x * rpb + w, ... */
        fprintf(f, "  const int em_t = threadIdx.x & 31;\n");
        fprintf(f, "  for (long long v%d = (long long)blockIdx.x * %d + (threadIdx.x >> 5); v%d < %s; "
                "v%d += (long long)gridDim.x * %d) {\n", P, G->rpb, P, G->extent, P, G->rpb);
    } else if (G->rpb > 1) {
        /* 32 / tpr rows a warp: the warp's loop is uniform (its shuffles
         * need every lane), lanes past the last row redo it, storing nothing */
        int per_warp = 32 / G->tpr;
        fprintf(f, "  const int em_t = threadIdx.x & %d, em_s = (threadIdx.x & 31) / %d;\n", G->tpr - 1,
                G->tpr);
        fprintf(f, "  for (long long em_r = (long long)blockIdx.x * %d + (threadIdx.x >> 5) * %d; em_r < %s; "
                "em_r += (long long)gridDim.x * %d) {\n", G->rpb, per_warp, G->extent, G->rpb);
        fprintf(f, "    const bool em_live = em_r + em_s < %s;\n", G->extent);
        fprintf(f, "    const long long v%d = em_live ? em_r + em_s : %s - 1;\n", P, G->extent);
    } else if (G->cluster > 1) {
        emit_cluster_loop(G);
    } else {
        fputs("  __shared__ double em_sh[32];\n  const int em_t = threadIdx.x;\n", f);
        fprintf(f, "  for (long long v%d = blockIdx.x; v%d < %s; v%d += gridDim.x) {\n", P, P,
                G->extent, P);
    }
    if (G->vrows && G->c1 == 0 && G->c0 == 0) fputs("    const int em_h = 0;\n", f);
    else if (G->vrows) /* the row's first element at a vector boundary */
        fprintf(f, "    const int em_h = (int)((%d - (v%d * %" PRId64 "ll + %" PRId64 "ll) %% %d) %% %d);\n",
                G->V, P, G->c1, G->c0, G->V, G->V);
    int nh = (G->V - 1 + G->tpr - 1) / G->tpr;
    for (int q = 0; q < G->nkeys; q++) {
        if (!G->vrows) {
            fprintf(f, "    %s rc%d[%d];\n", ctype(G->key_dtype[q]), q, G->key_nit[q]);
            continue;
        }
        fprintf(f, "    %s rc%d[%d];\n", vtype_n(G->key_dtype[q], G->V), q, G->key_nit[q]);
        fprintf(f, "    %s rc%dh[%d], rc%dt[%d];\n", ctype(G->key_dtype[q]), q, nh, q, nh);
    }
    G->depth = 1;
    G->inner = 0;
    emit_seq(G, P + 1, G->match[P]);
    fputs("  }\n", f);
    if (G->cluster > 1) /* no block leaves while the others may read its shared memory */
        fputs("  em_cluster_sync();\n", f);
}

static bool has_half(const k_kernel *k) {
    for (int i = 0; i < k->n; i++)
        if (k->insts[i].dtype == EM_F16 || k->insts[i].dtype == EM_BF16) return true;
    return false;
}

/* The row-cache scratch that plan_rows needs, for each variant. */
typedef struct rows_scratch {
    int *stack, *kbuf, *kbase;
    int64_t *kext;
} rows_scratch;

static em_status emit_kernel(egen *G, cuda_src *out, rows_scratch *rs) {
    FILE *f = G->f;
    const k_kernel *k = G->k;
    bool rows = G->shape == CU_ROWS && G->tile_j < 0;
    em_status s;
    fputs(prelude, f);
    if (has_half(k)) fputs(cuda_half_helpers, f);
    if (G->cluster > 1) fputs(cluster_helpers, f);
    if (out->vec4) {
        fprintf(f, "extern \"C\" __global__ void __launch_bounds__(%d) %s_v4(", G->threads, k->name);
        emit_params(G);
        fputs(") {\n  EM_AFTER_PRIOR();\n", f);
        G->depth = 0;
        G->inner = 0;
        emit_seq(G, 0, G->par);
        if (rows) {
            G->vrows = true;
            if ((s = plan_rows(G, rs->stack, rs->kbuf, rs->kbase, rs->kext)) != EM_OK) return s;
            emit_rows(G);
            G->vrows = false;
        } else {
            emit_flat_v4(G);
        }
        fputs("}\n", f);
    }
    if (rows && (s = plan_rows(G, rs->stack, rs->kbuf, rs->kbase, rs->kext)) != EM_OK) return s;
    fprintf(f, "extern \"C\" __global__ void __launch_bounds__(%d) %s(", G->threads, k->name);
    emit_params(G);
    fputs(") {\n  EM_AFTER_PRIOR();\n", f);
    G->depth = 0;
    G->inner = 0;
    if (G->shape == CU_SERIAL) {
        fputs("  if (blockIdx.x != 0 || threadIdx.x != 0) return;\n", f);
        emit_seq(G, 0, k->n);
    } else {
        emit_seq(G, 0, G->par); /* constants and parameters before the loop */
        if (G->tile_j >= 0) emit_tile(G);
        else if (G->shape == CU_FLAT) emit_flat(G, out->unroll);
        else emit_rows(G);
    }
    fputs("}\n", f);
    return EM_OK;
}

/* The dtypes this generator prints (ctype's); f16 and bf16 only moved
 * and converted (kir_check_half_moved). */
#define CUDA_DTYPES                                                                                \
    (KIR_DTYPE(EM_F32) | KIR_DTYPE(EM_F64) | KIR_DTYPE(EM_I32) | KIR_DTYPE(EM_I64) |               \
     KIR_DTYPE(EM_BOOL) | KIR_DTYPE(EM_F16) | KIR_DTYPE(EM_BF16))

em_status cuda_emit(const k_kernel *k, cuda_src *out) { return cuda_emit_with(k, 0, NULL, out); }

em_status cuda_emit_for(const k_kernel *k, int arch, cuda_src *out) { return cuda_emit_with(k, arch, NULL, out); }

em_status cuda_emit_with(const k_kernel *k, int arch, const cuda_row_params *params, cuda_src *out) {
    memset(out, 0, sizeof *out);
    if (kir_verify(k) != EM_OK) return em_error_context("cuda_emit");
    em_status s = kir_check_dtypes(k, CUDA_DTYPES, "cuda_emit");
    if (s == EM_OK) s = kir_check_half_moved(k, "cuda_emit");
    if (s != EM_OK) return s;
    size_t nn = (size_t)k->n + 1;
    egen G = {.k = k, .arch = arch, .params = params};
    G.match = em_calloc(nn, sizeof(int));
    G.split = em_calloc(nn, sizeof(bool));
    G.written = em_calloc(2 * ((size_t)k->nbufs + 1), sizeof(bool)); /* + scratch */
    int *stack = em_calloc(nn, sizeof(int));
    G.nit_of = em_calloc(nn, sizeof(int));
    G.slice = em_calloc(nn, sizeof(bool));
    int *kbuf = em_calloc(nn, sizeof(int)), *kbase = em_calloc(nn, sizeof(int));
    int64_t *kext = em_calloc(nn, sizeof(int64_t));
    G.vacc = em_calloc(nn, sizeof(bool));
    uint64_t *a1 = em_calloc(nn, sizeof(uint64_t)), *a0 = em_calloc(nn, sizeof(uint64_t));
    char *text = NULL;
    size_t len = 0;
    if (!G.match || !G.split || !G.written || !stack || !G.nit_of || !G.slice || !kbuf || !kbase || !kext ||
        !G.vacc || !a1 || !a0) {
        s = em_last_status();
        goto done;
    }
    int depth = 0; /* ranges are balanced: kir_verify */
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op == K_RANGE) stack[depth++] = i;
        else if (in->op == K_END) G.match[stack[--depth]] = i;
        else if (in->op == K_STORE) G.written[k->insts[in->src[0]].ival] = true;
    }
    choose_shape(&G, out);
    G.tile_j = -1;
    if (G.shape != CU_SERIAL && plan_tile(&G)) choose_tile(&G, out);
    out->shape = G.shape;
    out->threads = G.threads;
    out->unroll = G.shape == CU_FLAT ? 4 : G.shape == CU_ROWS ? G.rpb : 1; /* rows: per block */
    out->tiled = G.tile_j >= 0;
    out->vec4 = G.shape == CU_FLAT ? vectorizable(&G) : G.shape == CU_ROWS && !out->tiled && row_vec(G.params) && plan_vec(&G, a1, a0);
    if (!out->vec4) memset(G.vacc, 0, nn * sizeof(bool));
    choose_cluster(&G, out, out->vec4 && G.shape == CU_ROWS);
    out->nbufs = k->nbufs;
    out->nsizes = k->nsizes;
    G.lane = G.cur_split = -1;
    G.f = open_memstream(&text, &len);
    if (!G.f) {
        s = em_error(EM_ERR_NOMEM, "cuda_emit: open_memstream failed");
        goto done;
    }
    rows_scratch rs = {stack, kbuf, kbase, kext};
    s = emit_kernel(&G, out, &rs);
    fclose(G.f);
    if (s != EM_OK) {
        /* plan_rows' error stands */
    } else if (G.failed) {
        s = em_error(EM_ERR_UNSUPPORTED, "cuda_emit: %s: an operation the CUDA printer lacks", k->name);
    } else if ((out->text = em_malloc(len + 1))) {
        memcpy(out->text, text, len + 1);
    } else {
        s = em_last_status();
    }
done:
    free(text);
    em_free(G.match), em_free(G.split), em_free(G.written), em_free(stack);
    em_free(G.nit_of), em_free(G.slice), em_free(kbuf), em_free(kbase), em_free(kext);
    em_free(G.vacc), em_free(a1), em_free(a0);
    em_free(G.key_of), em_free(G.key_dtype), em_free(G.key_nit), em_free(G.key_filled), em_free(G.dead);
    return s;
}

void cuda_src_free(cuda_src *s) {
    if (!s) return;
    em_free(s->text);
    s->text = NULL;
}

const char cuda_after_prior[] =
    "/* Programmatic dependent launch (sm_90 and up): wait until the kernel\n"
    " * before this one has finished and its writes are visible, then let the\n"
    " * next one start its launch.  A no-op for a plain launch. */\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
    "#define EM_AFTER_PRIOR() asm volatile(\"griddepcontrol.wait;\\n\\tgriddepcontrol.launch_dependents;\" ::: \"memory\")\n"
    "#else\n"
    "#define EM_AFTER_PRIOR() ((void)0)\n"
    "#endif\n";

/* Whether every __global__ function of text begins with EM_AFTER_PRIOR():
 * launched with programmatic dependent launch, one that did not would
 * read its inputs before the kernel writing them has finished. */
static bool waits_for_prior(const char *text) {
    static const char wait[] = "EM_AFTER_PRIOR();";
    for (const char *p = strstr(text, "__global__"); p; p = strstr(p + 1, "__global__")) {
        const char *b = strchr(p, '{');
        if (!b) return false;
        for (b++; *b == ' ' || *b == '\n' || *b == '\t'; b++) {}
        if (strncmp(b, wait, sizeof wait - 1) != 0) return false;
    }
    return true;
}

char *cuda_text_with_key(const cuda_src *src, const char *name, const uint8_t key[16]) {
    if (!waits_for_prior(src->text)) {
        em_error(EM_ERR_STATE, "cuda: a kernel of %s's text does not begin with EM_AFTER_PRIOR()", name);
        return NULL;
    }
    int cluster = src->cluster > 1 ? src->cluster : 1;
    char bytes[16 * 6 + 1];
    for (int i = 0; i < 16; i++) snprintf(bytes + 6 * i, 7, "0x%02x%s", key[i], i < 15 ? ", " : "");
    const char *fmt = "%s%s\nextern \"C\" __constant__ unsigned char %s" CUDA_KEY_SUFFIX
                      "[16] = {%s};\n"
                      "extern \"C\" __constant__ long long %s" CUDA_LAUNCH_SUFFIX
                      "[" "%d" "] = {%d, %d, %d, %" PRId64 "ll, %d, %d, %d, %d, %d};\n";
    int n = snprintf(NULL, 0, fmt, cuda_after_prior, src->text, name, bytes, name, CUDA_LAUNCH_WORDS,
                     (int)src->shape, src->threads, src->unroll, src->extent, src->extent_size,
                     (int)src->vec4, src->nbufs, src->nsizes, cluster);
    char *out = n < 0 ? NULL : em_malloc((size_t)n + 1);
    if (out)
        snprintf(out, (size_t)n + 1, fmt, cuda_after_prior, src->text, name, bytes, name, CUDA_LAUNCH_WORDS,
                 (int)src->shape, src->threads, src->unroll, src->extent, src->extent_size,
                 (int)src->vec4, src->nbufs, src->nsizes, cluster);
    return out;
}
