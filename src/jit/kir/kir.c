/* kir.c - building, printing and verifying kernel IR. */
#include "kir.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the ALU table (kir_alu.def) ---- */

static const k_alu_info alu_table[KA_COUNT] = {
    [KA_NONE] = {"none", KS_NONE, 0, 0, 0},
#define ALU(NAME, name, shape, dtypes, cost)                                                    \
    [KA_##NAME] = {name, shape, shape == KS_UNARY ? 1 : shape == KS_SELECT ? 3 : 2, dtypes, cost},
#include "kir_alu.def"
#undef ALU
};

/* A new ALU op needs a case in each generator's switch: this catches a
 * row added without them. */
_Static_assert(KA_COUNT == 31,
               "kir_alu.def changed: update both generators' switches, the tests and this count");

static const k_alu_info invalid_alu = {"invalid", KS_NONE, 0, 0, 0};

const k_alu_info *kir_alu_info(k_alu a) {
    return (unsigned)a < KA_COUNT ? &alu_table[a] : &invalid_alu;
}

const char *kir_alu_name(k_alu a) { return kir_alu_info(a)->name; }

unsigned kir_dtype_class(em_dtype d) {
    if ((unsigned)d >= EM_DTYPE_COUNT) return 0;
    if (em_dtype_is_float(d)) return KD_FLOAT;
    return d == EM_BOOL ? KD_BOOL : KD_INT;
}

bool kir_alu_accepts(k_alu a, em_dtype d) {
    return (kir_alu_info(a)->dtypes & kir_dtype_class(d)) != 0;
}

em_dtype kir_alu_result(k_alu a, em_dtype d) {
    return kir_alu_info(a)->shape == KS_COMPARE ? EM_BOOL : d;
}

/* The op table's alu column (ops.def). */
static const k_alu alu_of_op[EM_OP_COUNT] = {
#define OP(NAME, name, kind, nin, attrs, infer, cpu, alu) [EM_OP_##NAME] = KA_##alu,
#include "ops.def"
};

k_alu kir_alu_of_op(em_op op) { return (unsigned)op < EM_OP_COUNT ? alu_of_op[op] : KA_NONE; }

k_kernel *kir_new(const char *name) {
    k_kernel *k = em_calloc(1, sizeof *k);
    if (!k) return NULL;
    k->name = em_malloc(strlen(name) + 1);
    if (!k->name) {
        em_free(k);
        return NULL;
    }
    strcpy(k->name, name);
    return k;
}

void kir_free(k_kernel *k) {
    if (!k) return;
    em_free(k->insts);
    em_free(k->name);
    em_free(k);
}

static int push(k_kernel *k, k_inst in) {
    if (k->n == k->cap) {
        int cap = k->cap ? 2 * k->cap : 64;
        k_inst *p = em_malloc(sizeof *p * (size_t)cap);
        if (!p) {
            k->failed = true;
            return -1;
        }
        if (k->insts) memcpy(p, k->insts, sizeof *p * (size_t)k->n);
        em_free(k->insts);
        k->insts = p;
        k->cap = cap;
    }
    /* field by field over zeroed memory: no uninitialised padding, so that
     * an instruction array can be written out as bytes (compile workers) */
    k_inst *d = &k->insts[k->n];
    memset(d, 0, sizeof *d);
    d->op = in.op;
    d->alu = in.alu;
    d->dtype = in.dtype;
    d->nsrc = in.nsrc;
    memcpy(d->src, in.src, sizeof d->src);
    d->fval = in.fval;
    d->ival = in.ival;
    d->flags = in.flags;
    return k->n++;
}

/* An operand must exist: builders given -1 (a failed earlier build) fail. */
static bool ok(const k_kernel *k, int v) { return v >= 0 && v < k->n; }

/* A builder's failure: the kernel is incomplete from here on.  The first
 * error is kept (an undefined operand is the -1 of an earlier failure,
 * which said why). */
static int fail(k_kernel *k, const char *what) {
    if (!k->failed) em_error(EM_ERR_ARG, "kernel IR: %s", what);
    k->failed = true;
    return -1;
}

int kir_buf(k_kernel *k, em_dtype elem) {
    return push(k, (k_inst){.op = K_BUF, .dtype = elem, .ival = k->nbufs++});
}

int kir_size(k_kernel *k) {
    return push(k, (k_inst){.op = K_SIZE, .dtype = EM_I64, .ival = k->nsizes++});
}

int kir_const_f(k_kernel *k, em_dtype d, double v) {
    return push(k, (k_inst){.op = K_CONST, .dtype = d, .fval = v, .ival = (int64_t)0});
}

int kir_const_i(k_kernel *k, em_dtype d, int64_t v) {
    return push(k, (k_inst){.op = K_CONST, .dtype = d, .ival = v, .fval = (double)v});
}

int kir_range(k_kernel *k, int extent, unsigned flags) {
    if (!ok(k, extent)) return fail(k, "range of an undefined extent");
    return push(k, (k_inst){.op = K_RANGE, .dtype = EM_I64, .nsrc = 1, .src = {extent},
                            .flags = flags});
}

int kir_end(k_kernel *k) { return push(k, (k_inst){.op = K_END, .dtype = EM_DTYPE_COUNT}); }

int kir_range_tiled(k_kernel *k, int extent, int rows) {
    if (!ok(k, extent) || !ok(k, rows)) return fail(k, "tiled range of an undefined extent");
    return push(k, (k_inst){.op = K_RANGE, .dtype = EM_I64, .nsrc = 2, .src = {extent, rows},
                            .flags = K_PARALLEL | K_TILE});
}

int kir_stage(k_kernel *k, int load) {
    if (!ok(k, load) || k->insts[load].op != K_LOAD) return fail(k, "staging a non-load");
    k->insts[load].flags |= K_STAGED;
    return load;
}

int kir_load(k_kernel *k, int buf, int index) {
    if (!ok(k, buf) || !ok(k, index)) return fail(k, "load of undefined operands");
    return push(k, (k_inst){.op = K_LOAD, .dtype = k->insts[buf].dtype, .nsrc = 2,
                            .src = {buf, index}});
}

int kir_store(k_kernel *k, int buf, int index, int value) {
    if (!ok(k, buf) || !ok(k, index) || !ok(k, value))
        return fail(k, "store of undefined operands");
    return push(k, (k_inst){.op = K_STORE, .dtype = EM_DTYPE_COUNT, .nsrc = 3,
                            .src = {buf, index, value}});
}

int kir_alu(k_kernel *k, k_alu op, int a, int b, int c) {
    const k_alu_info *info = kir_alu_info(op);
    int n = info->nsrc;
    int src[3] = {a, b, c};
    if (n == 0) return fail(k, "invalid alu op");
    for (int i = 0; i < n; i++)
        if (!ok(k, src[i])) return fail(k, "alu of undefined operands");
    em_dtype d = kir_alu_result(op, k->insts[info->shape == KS_SELECT ? b : a].dtype);
    return push(k, (k_inst){.op = K_ALU, .alu = op, .dtype = d, .nsrc = n, .src = {a, b, c}});
}

/* A half value widened to f32 and narrowed back is the value itself: f32
 * holds every half value, so the narrowing is exact (a bf16 NaN keeps its
 * bits both ways; an f16 NaN comes back as the one f16 NaN a conversion
 * makes, the same bits when the value was itself converted).  Lowering
 * makes such pairs where a half node feeds a store or another half cast;
 * their rounding was a sixth of a bf16 softmax kernel's instructions on
 * the H200 (docs/benchmarks.md). */
static int narrowed_back(const k_kernel *k, int value, em_dtype d) {
    const k_inst *in = &k->insts[value];
    if ((d != EM_BF16 && d != EM_F16) || in->op != K_CAST || in->dtype != EM_F32) return -1;
    const k_inst *w = &k->insts[in->src[0]];
    return w->dtype == d && (d == EM_BF16 || w->op == K_CAST) ? in->src[0] : -1;
}

int kir_cast(k_kernel *k, int value, em_dtype d) {
    if (!ok(k, value)) return fail(k, "cast of an undefined operand");
    int same = narrowed_back(k, value, d);
    if (same >= 0) return same;
    return push(k, (k_inst){.op = K_CAST, .dtype = d, .nsrc = 1, .src = {value}});
}

/* Float x to i32/i64: y = max(x < 2^b ? x : 0, -2^b) is in range and not
 * NaN (NaN < 2^b is false), so its K_CAST is defined; x >= 2^b then
 * selects the integer's maximum.  -2^b converts exactly to the minimum. */
int kir_convert(k_kernel *k, int value, em_dtype d) {
    if (!ok(k, value)) return fail(k, "conversion of an undefined operand");
    em_dtype from = k->insts[value].dtype;
    if ((from != EM_F32 && from != EM_F64) || (d != EM_I32 && d != EM_I64))
        return kir_cast(k, value, d);
    double lim = d == EM_I32 ? 0x1p31 : 0x1p63;
    int top = kir_const_f(k, from, lim);
    int below = kir_alu(k, KA_LT, value, top, -1);
    int y = kir_alu(k, KA_WHERE, below, value, kir_const_f(k, from, 0.0));
    y = kir_alu(k, KA_MAX, y, kir_const_f(k, from, -lim), -1);
    int r = kir_cast(k, y, d);
    int big = kir_alu(k, KA_GE, value, top, -1);
    return kir_alu(k, KA_WHERE, big, kir_const_i(k, d, d == EM_I32 ? INT32_MAX : INT64_MAX), r);
}

int kir_acc(k_kernel *k, k_alu combine, int init) {
    if (!ok(k, init) || k->insts[init].op != K_CONST)
        return fail(k, "accumulator without a constant");
    if (combine != KA_ADD && combine != KA_MAX && combine != KA_MIN)
        return fail(k, "accumulators combine with add, max or min");
    return push(k, (k_inst){.op = K_ACC, .alu = combine, .dtype = k->insts[init].dtype,
                            .nsrc = 1, .src = {init}});
}

int kir_acc_update(k_kernel *k, int acc, int value) {
    if (!ok(k, acc) || !ok(k, value) || k->insts[acc].op != K_ACC)
        return fail(k, "update of something that is not an accumulator");
    return push(k, (k_inst){.op = K_ACC_UPDATE, .dtype = k->insts[acc].dtype, .nsrc = 2,
                            .src = {acc, value}});
}

/* ---- text form ---- */

static void print_const(const k_inst *in, FILE *f) {
    if (em_dtype_is_float(in->dtype)) {
        if (isnan(in->fval)) fputs("nan", f);
        else if (isinf(in->fval)) fputs(in->fval > 0 ? "inf" : "-inf", f);
        else fprintf(f, "%.17g", in->fval);
    } else {
        fprintf(f, "%lld", (long long)in->ival);
    }
}

em_status kir_print(const k_kernel *k, FILE *f) {
    if (!k || !f) return em_error(EM_ERR_NULL, "kir_print: NULL argument");
    fprintf(f, "kernel %s(", k->name);
    bool first = true;
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op != K_BUF && in->op != K_SIZE) continue;
        fprintf(f, "%s%%%d = %s %s #%lld", first ? "" : ", ", i, in->op == K_BUF ? "buf" : "size",
                em_dtype_name(in->dtype), (long long)in->ival);
        first = false;
    }
    fputs(")\n", f);
    int depth = 1;
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        if (in->op == K_BUF || in->op == K_SIZE) continue;
        if (in->op == K_END) depth--;
        fprintf(f, "%*s", 2 * (depth > 0 ? depth : 0), "");
        switch (in->op) {
        case K_CONST:
            fprintf(f, "%%%d = const %s ", i, em_dtype_name(in->dtype));
            print_const(in, f);
            break;
        case K_RANGE:
            fprintf(f, "%%%d = range %%%d%s", i, in->src[0], in->flags & K_PARALLEL ? " parallel" : "");
            if (in->flags & K_TILE) fprintf(f, " tile %%%d", in->src[1]);
            break;
        case K_END: fputs("end", f); break;
        case K_LOAD:
            fprintf(f, "%%%d = load %s %%%d[%%%d]%s", i, em_dtype_name(in->dtype), in->src[0],
                    in->src[1], in->flags & K_STAGED ? " staged" : "");
            break;
        case K_STORE: fprintf(f, "store %%%d[%%%d] = %%%d", in->src[0], in->src[1], in->src[2]); break;
        case K_ALU:
            fprintf(f, "%%%d = %s %s", i, kir_alu_name(in->alu), em_dtype_name(in->dtype));
            for (int s = 0; s < in->nsrc; s++) fprintf(f, "%s%%%d", s ? ", " : " ", in->src[s]);
            break;
        case K_CAST:
            fprintf(f, "%%%d = cast %s %%%d", i, em_dtype_name(in->dtype), in->src[0]);
            break;
        case K_ACC:
            fprintf(f, "%%%d = acc %s %s %%%d", i, em_dtype_name(in->dtype), kir_alu_name(in->alu),
                    in->src[0]);
            break;
        case K_ACC_UPDATE: fprintf(f, "%%%d <- %%%d", in->src[0], in->src[1]); break;
        default: fprintf(f, "?%d", (int)in->op);
        }
        fputc('\n', f);
        if (in->op == K_RANGE) depth++;
    }
    return EM_OK;
}

char *kir_to_text(const k_kernel *k) {
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    if (!f) {
        em_error(EM_ERR_NOMEM, "kir_to_text: out of memory");
        return NULL;
    }
    em_status s = kir_print(k, f);
    if (fclose(f) != 0 && s == EM_OK) s = em_error(EM_ERR_NOMEM, "kir_to_text: out of memory");
    char *out = s == EM_OK && mem ? em_malloc(len + 1) : NULL;
    if (out) {
        memcpy(out, mem, len);
        out[len] = '\0';
    } else if (s == EM_OK) {
        em_error(EM_ERR_NOMEM, "kir_to_text: out of memory");
    }
    free(mem); /* open_memstream's buffer comes from malloc */
    return out;
}

/* ---- verifier ---- */

/* Operands of each opcode (K_ALU: its op's, kir_alu_info). */
static const int opcode_nsrc[] = {
    [K_BUF] = 0,  [K_SIZE] = 0, [K_CONST] = 0, [K_RANGE] = 1, [K_END] = 0,        [K_LOAD] = 2,
    [K_STORE] = 3, [K_ALU] = 0, [K_CAST] = 1,  [K_ACC] = 1,   [K_ACC_UPDATE] = 2,
};

static const char *const opcode_names[] = {
    [K_BUF] = "buf",     [K_SIZE] = "size", [K_CONST] = "const", [K_RANGE] = "range",
    [K_END] = "end",     [K_LOAD] = "load", [K_STORE] = "store", [K_ALU] = "alu",
    [K_CAST] = "cast",   [K_ACC] = "acc",   [K_ACC_UPDATE] = "update",
};

static bool opcode_valid(k_opcode op) { return (unsigned)op <= K_ACC_UPDATE; }

/* What the text form calls instruction in: "load", "exp"... */
static const char *inst_name(const k_inst *in) {
    if (!opcode_valid(in->op)) return "?";
    return in->op == K_ALU ? kir_alu_name(in->alu) : opcode_names[in->op];
}

/* Whether instruction op defines a value (and so has a dtype). */
static bool has_value(k_opcode op) { return op != K_STORE && op != K_END; }

static em_status bad(const k_kernel *k, int i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static em_status bad(const k_kernel *k, int i, const char *fmt, ...) {
    char why[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return em_error(EM_ERR_ARG, "kernel IR verifier: %s: instruction %%%d (%s): %s", k->name, i,
                    inst_name(&k->insts[i]), why);
}

static const char *class_name(unsigned dtypes) {
    switch (dtypes) {
    case KD_FLOAT: return "float";
    case KD_INT: return "integer";
    case KD_NUM: return "float or integer";
    case KD_ANY: return "any";
    default: return "some other";
    }
}

static bool is_identifier(const char *s) {
    if (!s || !*s) return false;
    for (const char *c = s; *c; c++)
        if (!(*c == '_' || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
              (c > s && *c >= '0' && *c <= '9')))
            return false;
    return true;
}

/* Instruction i's opcode, operand count, and (values) dtype, read before
 * anything reads its operands. */
static em_status check_form(const k_kernel *k, int i) {
    const k_inst *in = &k->insts[i];
    if (!opcode_valid(in->op)) return bad(k, i, "unknown opcode %d", (int)in->op);
    if (in->op == K_ALU && kir_alu_info(in->alu)->nsrc == 0)
        return bad(k, i, "invalid alu op %d", (int)in->alu);
    int n = in->op == K_ALU ? kir_alu_info(in->alu)->nsrc : opcode_nsrc[in->op];
    if (in->op == K_RANGE && (in->flags & K_TILE)) n = 2; /* + the tile's rows */
    if (in->nsrc != n) return bad(k, i, "%d operands, not %d", in->nsrc, n);
    unsigned allowed = in->op == K_RANGE ? K_PARALLEL | K_TILE : in->op == K_LOAD ? K_STAGED : 0;
    if (in->flags & ~allowed) return bad(k, i, "flags 0x%x on a %s", in->flags, inst_name(in));
    if (in->op == K_RANGE && (in->flags & K_TILE) && !(in->flags & K_PARALLEL))
        return bad(k, i, "a tiled range that is not parallel");
    if (has_value(in->op) && kir_dtype_class(in->dtype) == 0)
        return bad(k, i, "invalid dtype %d", (int)in->dtype);
    return EM_OK;
}

static em_dtype dtype_of(const k_kernel *k, const k_inst *in, int s) {
    return k->insts[in->src[s]].dtype;
}

static em_status check_alu(const k_kernel *k, int i) {
    const k_inst *in = &k->insts[i];
    const k_alu_info *a = kir_alu_info(in->alu);
    int first = a->shape == KS_SELECT ? 1 : 0; /* the first value operand */
    em_dtype d = dtype_of(k, in, first);
    if (a->shape == KS_SELECT && dtype_of(k, in, 0) != EM_BOOL)
        return bad(k, i, "the condition is %s, not bool", em_dtype_name(dtype_of(k, in, 0)));
    for (int j = first + 1; j < in->nsrc; j++)
        if (dtype_of(k, in, j) != d)
            return bad(k, i, "operands of different dtypes (%s, %s)", em_dtype_name(d),
                       em_dtype_name(dtype_of(k, in, j)));
    if (!kir_alu_accepts(in->alu, d))
        return bad(k, i, "%s operands: %s takes %s ones", em_dtype_name(d), a->name,
                   class_name(a->dtypes));
    if (in->dtype != kir_alu_result(in->alu, d))
        return bad(k, i, "result dtype %s, not %s", em_dtype_name(in->dtype),
                   em_dtype_name(kir_alu_result(in->alu, d)));
    return EM_OK;
}

static em_status check_acc(const k_kernel *k, int i) {
    const k_inst *in = &k->insts[i];
    if (k->insts[in->src[0]].op != K_CONST) return bad(k, i, "the initial value is not a constant");
    if (in->alu != KA_ADD && in->alu != KA_MAX && in->alu != KA_MIN)
        return bad(k, i, "combines with %s, not add, max or min", kir_alu_name(in->alu));
    if (!kir_alu_accepts(in->alu, in->dtype))
        return bad(k, i, "%s takes %s operands, not %s", kir_alu_name(in->alu),
                   class_name(kir_alu_info(in->alu)->dtypes), em_dtype_name(in->dtype));
    if (dtype_of(k, in, 0) != in->dtype)
        return bad(k, i, "initial value of dtype %s for an accumulator of %s",
                   em_dtype_name(dtype_of(k, in, 0)), em_dtype_name(in->dtype));
    return EM_OK;
}

static em_status check_memory(const k_kernel *k, int i) {
    const k_inst *in = &k->insts[i];
    const k_inst *buf = &k->insts[in->src[0]];
    if (buf->op != K_BUF) return bad(k, i, "the address is not a buffer");
    if (dtype_of(k, in, 1) != EM_I64)
        return bad(k, i, "the index is %s, not i64", em_dtype_name(dtype_of(k, in, 1)));
    em_dtype d = in->op == K_LOAD ? in->dtype : dtype_of(k, in, 2);
    if (d != buf->dtype)
        return bad(k, i, "%s %s of a buffer of %s", in->op == K_LOAD ? "load" : "store",
                   em_dtype_name(d), em_dtype_name(buf->dtype));
    return EM_OK;
}

/* The dtype rules of instruction i (its operands are defined and valid). */
static em_status check_types(const k_kernel *k, int i) {
    const k_inst *in = &k->insts[i];
    switch (in->op) {
    case K_BUF:
        if (in->ival < 0 || in->ival >= k->nbufs)
            return bad(k, i, "buffer number %lld, not in [0, %d)", (long long)in->ival, k->nbufs);
        return EM_OK;
    case K_SIZE:
        if (in->ival < 0 || in->ival >= k->nsizes)
            return bad(k, i, "size number %lld, not in [0, %d)", (long long)in->ival, k->nsizes);
        if (in->dtype != EM_I64)
            return bad(k, i, "a size of %s, not i64", em_dtype_name(in->dtype));
        return EM_OK;
    case K_CONST:
        if ((in->dtype == EM_I32 && (in->ival < INT32_MIN || in->ival > INT32_MAX)) ||
            (in->dtype == EM_BOOL && in->ival != 0 && in->ival != 1))
            return bad(k, i, "integer constant %lld out of %s's range", (long long)in->ival,
                       em_dtype_name(in->dtype));
        return EM_OK;
    case K_RANGE:
        if (dtype_of(k, in, 0) != EM_I64 || in->dtype != EM_I64 ||
            (in->nsrc > 1 && dtype_of(k, in, 1) != EM_I64))
            return bad(k, i, "range extent or variable not i64 (or tile rows)");
        return EM_OK;
    case K_LOAD:
    case K_STORE: return check_memory(k, i);
    case K_ALU: return check_alu(k, i);
    case K_ACC: return check_acc(k, i);
    case K_ACC_UPDATE:
        if (k->insts[in->src[0]].op != K_ACC) return bad(k, i, "update of a non-accumulator");
        if (dtype_of(k, in, 1) != dtype_of(k, in, 0) || in->dtype != dtype_of(k, in, 0))
            return bad(k, i, "update of an accumulator of %s with %s",
                       em_dtype_name(dtype_of(k, in, 0)), em_dtype_name(dtype_of(k, in, 1)));
        return EM_OK;
    default: return EM_OK; /* K_END; K_CAST converts between any two dtypes */
    }
}

/* Loop structure while verifying: open[d] is the K_RANGE of depth d;
 * depth_of[i] the depth at which value i was defined; closed_at[i] the
 * K_END after which it is dead (-1: alive). */
typedef struct scopes {
    int *open, *depth_of, *closed_at;
    int depth, nranges;
    bool tiled; /* the parallel range open (depth > 0) is tiled */
} scopes;

/* Instruction i's operands are defined, alive and values; its place in
 * the loop structure is valid (updates the structure at K_RANGE/K_END). */
static em_status check_scope(const k_kernel *k, int i, scopes *sc) {
    const k_inst *in = &k->insts[i];
    sc->depth_of[i] = sc->depth;
    sc->closed_at[i] = -1;
    for (int j = 0; j < in->nsrc; j++) {
        int v = in->src[j];
        if (v < 0 || v >= i) return bad(k, i, "operand %d not defined before", v);
        if (sc->closed_at[v] >= 0 && k->insts[v].op != K_ACC)
            return bad(k, i, "operand %%%d defined in a loop that has ended", v);
        if (!has_value(k->insts[v].op)) return bad(k, i, "operand %%%d has no value", v);
    }
    switch (in->op) {
    case K_BUF:
    case K_SIZE:
        if (sc->depth) return bad(k, i, "parameter inside a loop");
        return EM_OK;
    case K_RANGE:
        if ((in->flags & K_PARALLEL) && (sc->depth || sc->nranges))
            return bad(k, i, "only the first, outermost range may be parallel");
        if (in->flags & K_TILE) sc->tiled = true;
        sc->open[sc->depth++] = i;
        sc->nranges++;
        return EM_OK;
    case K_END:
        if (sc->depth == 0) return bad(k, i, "end without range");
        sc->depth--;
        /* every value defined inside the loop dies here */
        for (int v = sc->open[sc->depth]; v < i; v++)
            if (sc->closed_at[v] < 0 && sc->depth_of[v] > sc->depth) sc->closed_at[v] = i;
        sc->closed_at[sc->open[sc->depth]] = i;
        if (sc->depth == 0) sc->tiled = false;
        return EM_OK;
    case K_LOAD:
        if ((in->flags & K_STAGED) && !sc->tiled) return bad(k, i, "a staged load outside a tiled range");
        return EM_OK;
    case K_ACC_UPDATE:
        if (sc->depth_of[in->src[0]] > sc->depth)
            return bad(k, i, "update outside the accumulator's loop");
        return EM_OK;
    default: return EM_OK;
    }
}

em_status kir_verify(const k_kernel *k) {
    if (!k) return em_error(EM_ERR_NULL, "kir_verify: NULL kernel");
    if (!is_identifier(k->name))
        return em_error(EM_ERR_ARG, "kernel IR verifier: kernel name '%s' is not a C identifier",
                        k->name ? k->name : "(null)");
    if (k->failed)
        return em_error(EM_ERR_ARG, "kernel IR verifier: %s: incomplete (a builder failed)",
                        k->name);
    if (k->n < 0 || (k->n > 0 && !k->insts))
        return em_error(EM_ERR_ARG, "kernel IR verifier: %s: no instruction array", k->name);
    size_t n = (size_t)k->n + 1;
    scopes sc = {.open = em_calloc(n, sizeof(int)), .depth_of = em_calloc(n, sizeof(int)),
                 .closed_at = em_calloc(n, sizeof(int))};
    em_status s = sc.open && sc.depth_of && sc.closed_at ? EM_OK : em_last_status();
    for (int i = 0; i < k->n && s == EM_OK; i++) {
        s = check_form(k, i);
        if (s == EM_OK) s = check_scope(k, i, &sc);
        if (s == EM_OK) s = check_types(k, i);
    }
    if (s == EM_OK && sc.depth != 0)
        s = em_error(EM_ERR_ARG, "kernel IR verifier: %s: unclosed range", k->name);
    em_free(sc.open), em_free(sc.depth_of), em_free(sc.closed_at);
    return s;
}

/* ---- what a code generator implements ---- */

em_status kir_check_dtypes(const k_kernel *k, unsigned dtypes, const char *generator) {
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        if (has_value(in->op) && !(dtypes & KIR_DTYPE(in->dtype)))
            return em_error(EM_ERR_UNSUPPORTED,
                            "%s: %s: instruction %%%d (%s): %s values are not supported", generator,
                            k->name, i, inst_name(in), em_dtype_name(in->dtype));
    }
    return EM_OK;
}

em_status kir_check_half_moved(const k_kernel *k, const char *generator) {
    for (int i = 0; i < k->n; i++) {
        const k_inst *in = &k->insts[i];
        bool half = in->dtype == EM_F16 || in->dtype == EM_BF16;
        bool moved = in->op == K_BUF || in->op == K_LOAD || in->op == K_STORE || in->op == K_CAST;
        if (half && !moved)
            return em_error(EM_ERR_UNSUPPORTED, "%s: %s: instruction %%%d computes in %s "
                            "(half values are computed in f32)", generator, k->name, i,
                            em_dtype_name(in->dtype));
    }
    return EM_OK;
}

/* ---- kernels with size parameters (dynamic shapes) ---- */

static bool same_inst(const k_inst *a, const k_inst *b) {
    return a->op == b->op && a->alu == b->alu && a->dtype == b->dtype && a->nsrc == b->nsrc &&
           !memcmp(a->src, b->src, sizeof(int) * (size_t)a->nsrc) && a->flags == b->flags;
}

static bool same_value(const k_inst *a, const k_inst *b) {
    return a->ival == b->ival && !memcmp(&a->fval, &b->fval, sizeof a->fval);
}

bool kir_vary(const k_kernel *a, const k_kernel *b, bool *vary) {
    if (a->n != b->n || a->nbufs != b->nbufs || a->nsizes != b->nsizes) return false;
    for (int i = 0; i < a->n; i++) {
        const k_inst *x = &a->insts[i], *y = &b->insts[i];
        if (!same_inst(x, y)) return false;
        vary[i] = false;
        if (same_value(x, y) || x->op == K_BUF || x->op == K_SIZE) continue;
        if (x->op != K_CONST || x->dtype != EM_I64) return false; /* only i64 can be a size */
        vary[i] = true;
    }
    return true;
}

k_kernel *kir_parametrize(const k_kernel *k, const bool *vary, int *size_of) {
    k_kernel *p = kir_new(k->name);
    int *map = em_malloc(sizeof(int) * ((size_t)k->n + 1));
    bool ok_ = p && map;
    int nb = 0;
    while (nb < k->n && k->insts[nb].op == K_BUF) nb++;
    /* buffers keep their places; the size parameters follow them */
    for (int i = 0; ok_ && i < nb; i++) ok_ = (map[i] = push(p, k->insts[i])) >= 0;
    if (ok_) {
        p->nbufs = k->nbufs; /* push copies K_BUFs without counting them */
        p->nsizes = k->nsizes;
    }
    for (int i = 0; ok_ && i < k->n; i++) {
        size_of[i] = -1;
        if (!vary[i]) continue;
        size_of[i] = p->nsizes;
        ok_ = (map[i] = kir_size(p)) >= 0;
    }
    for (int i = nb; ok_ && i < k->n; i++) {
        if (vary[i]) continue;
        k_inst in = k->insts[i];
        for (int s = 0; s < in.nsrc; s++) in.src[s] = map[in.src[s]];
        ok_ = (map[i] = push(p, in)) >= 0;
    }
    em_free(map);
    if (!ok_) {
        kir_free(p);
        return NULL;
    }
    return p;
}

bool kir_match(const k_kernel *model, const k_kernel *k, const int *size_of, int64_t *sizes) {
    if (model->n != k->n || model->nbufs != k->nbufs || model->nsizes != k->nsizes) return false;
    for (int i = 0; i < k->n; i++) {
        const k_inst *x = &model->insts[i], *y = &k->insts[i];
        if (!same_inst(x, y)) return false;
        if (size_of[i] >= 0) sizes[size_of[i]] = y->ival;
        else if (!same_value(x, y)) return false;
    }
    return true;
}
