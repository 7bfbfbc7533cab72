/* kir.c - building, printing and verifying kernel IR. */
#include "kir.h"

#include <math.h>
#include <string.h>

static const char *const alu_names[KA_COUNT] = {
    [KA_NONE] = "none", [KA_NEG] = "neg", [KA_ABS] = "abs", [KA_EXP] = "exp",
    [KA_LOG] = "log", [KA_SQRT] = "sqrt", [KA_RSQRT] = "rsqrt", [KA_SIN] = "sin",
    [KA_COS] = "cos", [KA_TANH] = "tanh", [KA_SIGMOID] = "sigmoid", [KA_RELU] = "relu",
    [KA_GELU] = "gelu", [KA_GELU_TANH] = "gelu_tanh", [KA_ERF] = "erf", [KA_ADD] = "add",
    [KA_SUB] = "sub", [KA_MUL] = "mul", [KA_DIV] = "div", [KA_POW] = "pow", [KA_MAX] = "max",
    [KA_MIN] = "min", [KA_IDIV] = "idiv", [KA_MOD] = "mod", [KA_EQ] = "eq", [KA_NE] = "ne",
    [KA_LT] = "lt", [KA_LE] = "le", [KA_GT] = "gt", [KA_GE] = "ge", [KA_WHERE] = "where",
};

const char *kir_alu_name(k_alu a) { return (unsigned)a < KA_COUNT ? alu_names[a] : "invalid"; }

/* Operands of an alu op: 1, 2 or 3. */
static int alu_arity(k_alu a) {
    if (a >= KA_NEG && a <= KA_ERF) return 1;
    if (a >= KA_ADD && a <= KA_GE) return 2;
    if (a == KA_WHERE) return 3;
    return 0;
}

static bool alu_is_compare(k_alu a) { return a >= KA_EQ && a <= KA_GE; }

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
        if (!p) return -1;
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

static int fail(const char *what) {
    em_error(EM_ERR_ARG, "kernel IR: %s", what);
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
    if (!ok(k, extent)) return fail("range of an undefined extent");
    return push(k, (k_inst){.op = K_RANGE, .dtype = EM_I64, .nsrc = 1, .src = {extent},
                            .flags = flags});
}

int kir_end(k_kernel *k) { return push(k, (k_inst){.op = K_END, .dtype = EM_DTYPE_COUNT}); }

int kir_load(k_kernel *k, int buf, int index) {
    if (!ok(k, buf) || !ok(k, index)) return fail("load of undefined operands");
    return push(k, (k_inst){.op = K_LOAD, .dtype = k->insts[buf].dtype, .nsrc = 2,
                            .src = {buf, index}});
}

int kir_store(k_kernel *k, int buf, int index, int value) {
    if (!ok(k, buf) || !ok(k, index) || !ok(k, value)) return fail("store of undefined operands");
    return push(k, (k_inst){.op = K_STORE, .dtype = EM_DTYPE_COUNT, .nsrc = 3,
                            .src = {buf, index, value}});
}

int kir_alu(k_kernel *k, k_alu op, int a, int b, int c) {
    int n = alu_arity(op);
    int src[3] = {a, b, c};
    if (n == 0) return fail("invalid alu op");
    for (int i = 0; i < n; i++)
        if (!ok(k, src[i])) return fail("alu of undefined operands");
    em_dtype d = k->insts[op == KA_WHERE ? b : a].dtype;
    if (alu_is_compare(op)) d = EM_BOOL;
    return push(k, (k_inst){.op = K_ALU, .alu = op, .dtype = d, .nsrc = n, .src = {a, b, c}});
}

int kir_cast(k_kernel *k, int value, em_dtype d) {
    if (!ok(k, value)) return fail("cast of an undefined operand");
    return push(k, (k_inst){.op = K_CAST, .dtype = d, .nsrc = 1, .src = {value}});
}

/* Float x to i32/i64: y = max(x < 2^b ? x : 0, -2^b) is in range and not
 * NaN (NaN < 2^b is false), so its K_CAST is defined; x >= 2^b then
 * selects the integer's maximum.  -2^b converts exactly to the minimum. */
int kir_convert(k_kernel *k, int value, em_dtype d) {
    if (!ok(k, value)) return fail("conversion of an undefined operand");
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
    if (!ok(k, init) || k->insts[init].op != K_CONST) return fail("accumulator without a constant");
    if (combine != KA_ADD && combine != KA_MAX && combine != KA_MIN)
        return fail("accumulators combine with add, max or min");
    return push(k, (k_inst){.op = K_ACC, .alu = combine, .dtype = k->insts[init].dtype,
                            .nsrc = 1, .src = {init}});
}

int kir_acc_update(k_kernel *k, int acc, int value) {
    if (!ok(k, acc) || !ok(k, value) || k->insts[acc].op != K_ACC)
        return fail("update of something that is not an accumulator");
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
            break;
        case K_END: fputs("end", f); break;
        case K_LOAD:
            fprintf(f, "%%%d = load %s %%%d[%%%d]", i, em_dtype_name(in->dtype), in->src[0], in->src[1]);
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

/* ---- verifier ---- */

static em_status bad(const k_kernel *k, int i, const char *what) {
    return em_error(EM_ERR_STATE, "kernel IR verifier: %s: instruction %%%d: %s", k->name, i, what);
}

em_status kir_verify(const k_kernel *k) {
    if (!k) return em_error(EM_ERR_NULL, "kir_verify: NULL kernel");
    /* scope[i]: the loop depth at which value i was defined, and whether
     * that loop is still open (a value of a closed loop is dead) */
    int *open = em_calloc((size_t)(k->n + 1), sizeof(int)); /* stack of open RANGE indices */
    int *depth_of = em_calloc((size_t)(k->n + 1), sizeof(int));
    int *closed_at = em_calloc((size_t)(k->n + 1), sizeof(int));
    if (!open || !depth_of || !closed_at) {
        em_free(open), em_free(depth_of), em_free(closed_at);
        return em_last_status();
    }
    em_status s = EM_OK;
    int depth = 0, nranges = 0;
    for (int i = 0; i < k->n && s == EM_OK; i++) {
        const k_inst *in = &k->insts[i];
        depth_of[i] = depth;
        closed_at[i] = -1;
        for (int j = 0; j < in->nsrc && s == EM_OK; j++) {
            int v = in->src[j];
            if (v < 0 || v >= i) s = bad(k, i, "operand not defined before");
            else if (closed_at[v] >= 0 && k->insts[v].op != K_ACC)
                s = bad(k, i, "operand defined in a loop that has ended");
            else if (k->insts[v].op == K_STORE || k->insts[v].op == K_END)
                s = bad(k, i, "operand has no value");
        }
        if (s != EM_OK) break;
        switch (in->op) {
        case K_BUF:
        case K_SIZE:
            if (depth) s = bad(k, i, "parameter inside a loop");
            break;
        case K_CONST:
            if ((in->dtype == EM_I32 && (in->ival < INT32_MIN || in->ival > INT32_MAX)) ||
                (in->dtype == EM_BOOL && in->ival != 0 && in->ival != 1))
                s = bad(k, i, "integer constant out of its dtype's range");
            break;
        case K_RANGE:
            if (k->insts[in->src[0]].dtype != EM_I64) s = bad(k, i, "range extent not i64");
            if ((in->flags & K_PARALLEL) && (depth || nranges))
                s = bad(k, i, "only the first, outermost range may be parallel");
            open[depth++] = i;
            nranges++;
            break;
        case K_END:
            if (depth == 0) {
                s = bad(k, i, "end without range");
                break;
            }
            depth--;
            /* every value defined inside the loop dies here */
            for (int v = open[depth]; v < i; v++)
                if (closed_at[v] < 0 && depth_of[v] > depth) closed_at[v] = i;
            closed_at[open[depth]] = i;
            break;
        case K_LOAD:
        case K_STORE:
            if (k->insts[in->src[0]].op != K_BUF) s = bad(k, i, "address is not a buffer");
            else if (k->insts[in->src[1]].dtype != EM_I64) s = bad(k, i, "index is not i64");
            else if (in->op == K_STORE && k->insts[in->src[2]].dtype != k->insts[in->src[0]].dtype)
                s = bad(k, i, "stored value's dtype differs from the buffer's");
            break;
        case K_ALU: {
            int n = alu_arity(in->alu);
            if (n == 0 || n != in->nsrc) {
                s = bad(k, i, "alu arity");
                break;
            }
            int first = in->alu == KA_WHERE ? 1 : 0;
            if (in->alu == KA_WHERE && k->insts[in->src[0]].dtype != EM_BOOL)
                s = bad(k, i, "where's condition is not bool");
            for (int j = first + 1; j < n && s == EM_OK; j++)
                if (k->insts[in->src[j]].dtype != k->insts[in->src[first]].dtype)
                    s = bad(k, i, "alu operands of different dtypes");
            break;
        }
        case K_CAST: break;
        case K_ACC:
            if (k->insts[in->src[0]].op != K_CONST) s = bad(k, i, "accumulator init not constant");
            break;
        case K_ACC_UPDATE:
            if (k->insts[in->src[0]].op != K_ACC) s = bad(k, i, "update of a non-accumulator");
            else if (k->insts[in->src[1]].dtype != in->dtype) s = bad(k, i, "update dtype");
            else if (depth_of[in->src[0]] > depth) s = bad(k, i, "update outside the accumulator's loop");
            break;
        default: s = bad(k, i, "unknown opcode");
        }
    }
    if (s == EM_OK && depth != 0) s = em_error(EM_ERR_STATE, "kernel IR verifier: %s: unclosed range", k->name);
    em_free(open), em_free(depth_of), em_free(closed_at);
    return s;
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
