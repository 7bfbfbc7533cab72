/* cpu_gccjit_emit.c - the kernel IR as libgccjit functions: the kernel
 * NAME and its plan NAME__plan (see cpu_gccjit.h for what they do).
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
#include <stdio.h>
#include <string.h>

#include "cpu_gccjit_impl.h"

/* Guess for an inner loop extent unknown before the parallel loop. */
#define UNKNOWN_EXTENT 16.0

enum { ACC_PLAIN, ACC_PARTS, ACC_KEY };

typedef struct kgen {
    cg g;
    cg_types T;
    cg_lib *lib; /* the context's vmath functions and libm imports (shared by its kernels) */
    const k_kernel *k;
    int *match;  /* K_RANGE -> its K_END */
    cg_val *val; /* value of each instruction */
    gcc_jit_lvalue **acc, **part, **key;
    unsigned char *mode; /* ACC_* per K_ACC */
    int *accbuf;         /* scratch: accumulators of one loop */
    cg_val *mult;        /* scratch: the plan's extent products */
    cg_val u;            /* partial-sum index inside a split loop */
    int *seg;            /* scratch: blocked loops' segment of each instruction */
    gcc_jit_lvalue **arr; /* blocked loops: a value's array of CG_BLOCK elements */
    unsigned char *cross; /* scratch: blocked loops' values that need an array */
    unsigned char *remat; /* scratch: blocked loops' values recomputed where used */
    int *stamp;           /* scratch: 1 + the segment whose code holds val[i] */
    cg_val bufs, sizes, begin, end;
} kgen;

static gcc_jit_type *ty_of(kgen *G, em_dtype d) { return cg_dtype(&G->T, d); }

/* ---- accumulators ---- */

/* if (v CMP l) l = v;  (gcc's phiopt makes it a MAX_EXPR/MIN_EXPR) */
static void if_replace(kgen *G, gcc_jit_lvalue *l, cg_val v, bool max) {
    cg *g = &G->g;
    gcc_jit_block *then = cg_block(g, "upd"), *join = cg_block(g, "join");
    cg_val c = cg_cmp(g, max ? GCC_JIT_COMPARISON_GT : GCC_JIT_COMPARISON_LT, v,
                      gcc_jit_lvalue_as_rvalue(l));
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
        gcc_jit_lvalue *p = gcc_jit_context_new_array_access(
            g->ctx, NULL, gcc_jit_lvalue_as_rvalue(G->part[a]), G->u);
        gcc_jit_block_add_assignment_op(g->b, NULL, p, GCC_JIT_BINARY_OP_PLUS, v);
    } else if (G->mode[a] == ACC_KEY) {
        if_replace(G, G->key[a], cg_let(g, cg_fkey(g, v, max)), max);
    } else if (cg_is_int(acc->dtype) && acc->alu != KA_ADD) {
        if_replace(G, G->acc[a], v, max);
    } else {
        cg_val r =
            cg_alu(g, G->lib, acc->alu, acc->dtype, gcc_jit_lvalue_as_rvalue(G->acc[a]), v, NULL);
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
        cg_val p = gcc_jit_lvalue_as_rvalue(
            gcc_jit_context_new_array_access(g->ctx, NULL, G->bufs, cg_int(g, G->T.i64, in->ival)));
        val[i] = cg_let(g, cg_cast(g, p, gcc_jit_type_get_pointer(ty_of(G, in->dtype))));
        break;
    }
    case K_SIZE:
        val[i] = cg_let(g, gcc_jit_lvalue_as_rvalue(gcc_jit_context_new_array_access(
                               g->ctx, NULL, G->sizes, cg_int(g, G->T.i64, in->ival))));
        break;
    case K_CONST:
        if (cg_is_float(in->dtype))
            val[i] = gcc_jit_context_new_rvalue_from_double(g->ctx, ty_of(G, in->dtype), in->fval);
        else
            val[i] =
                cg_int(g, ty_of(G, in->dtype), in->dtype == EM_BOOL ? in->ival != 0 : in->ival);
        break;
    case K_LOAD:
        val[i] = cg_let(g, gcc_jit_lvalue_as_rvalue(gcc_jit_context_new_array_access(
                               g->ctx, NULL, val[in->src[0]], val[in->src[1]])));
        break;
    case K_STORE:
        gcc_jit_block_add_assignment(
            g->b, NULL,
            gcc_jit_context_new_array_access(g->ctx, NULL, val[in->src[0]], val[in->src[1]]),
            val[in->src[2]]);
        break;
    case K_ALU: {
        const k_inst *a = &G->k->insts[in->src[0]];
        em_dtype d = in->alu == KA_WHERE ? G->k->insts[in->src[1]].dtype : a->dtype;
        cg_val b = in->nsrc > 1 ? val[in->src[1]] : NULL, c = in->nsrc > 2 ? val[in->src[2]] : NULL;
        val[i] = cg_let(g, cg_alu(g, G->lib, in->alu, d, val[in->src[0]], b, c));
        break;
    }
    case K_CAST:
        val[i] =
            cg_let(g, cg_convert(g, val[in->src[0]], G->k->insts[in->src[0]].dtype, in->dtype));
        break;
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
    gcc_jit_block *cond = cg_block(g, "cond"), *body = cg_block(g, "body"),
                  *after = cg_block(g, "after");
    gcc_jit_block_add_assignment(g->b, NULL, iv, lo);
    gcc_jit_block_end_with_jump(g->b, NULL, cond);
    gcc_jit_block_end_with_conditional(
        cond, NULL, cg_cmp(g, GCC_JIT_COMPARISON_LT, gcc_jit_lvalue_as_rvalue(iv), hi), body,
        after);
    g->b = body;
    G->val[r] = gcc_jit_lvalue_as_rvalue(iv);
    emit_seq(G, r + 1, G->match[r]);
    gcc_jit_block_add_assignment_op(g->b, NULL, iv, GCC_JIT_BINARY_OP_PLUS,
                                    gcc_jit_context_one(g->ctx, G->T.i64));
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
                gcc_jit_block_add_assignment(
                    g->b, NULL,
                    gcc_jit_context_new_array_access(
                        g->ctx, NULL, gcc_jit_lvalue_as_rvalue(G->part[a]), cg_int(g, G->T.i64, u)),
                    gcc_jit_context_new_rvalue_from_double(g->ctx, t, -0.0));
            G->mode[a] = ACC_PARTS;
        } else {
            G->key[a] = cg_local(g, in->dtype == EM_F32 ? G->T.i32 : G->T.i64, "key");
            gcc_jit_block_add_assignment(
                g->b, NULL, G->key[a],
                cg_fkey(g, gcc_jit_lvalue_as_rvalue(G->acc[a]), in->alu == KA_MAX));
            G->mode[a] = ACC_KEY;
        }
    }
    if (parts) {
        /* for (jb = lo; hi - jb >= U; jb += U) for (u = 0; u < U; u++) body(jb + u) */
        gcc_jit_lvalue *jb = cg_local(g, G->T.i64, "jb"), *u = cg_local(g, G->T.i64, "u");
        gcc_jit_block *c1 = cg_block(g, "blk"), *pre = cg_block(g, "pre"),
                      *c2 = cg_block(g, "ucond"), *body = cg_block(g, "ubody"),
                      *step = cg_block(g, "step"), *rem = cg_block(g, "rem");
        cg_val jbv = gcc_jit_lvalue_as_rvalue(jb), uv = gcc_jit_lvalue_as_rvalue(u);
        cg_val Uv = cg_int(g, G->T.i64, U);
        gcc_jit_block_add_assignment(g->b, NULL, jb, lo);
        gcc_jit_block_end_with_jump(g->b, NULL, c1);
        gcc_jit_block_end_with_conditional(
            c1, NULL,
            cg_cmp(g, GCC_JIT_COMPARISON_GE, cg_bin(g, GCC_JIT_BINARY_OP_MINUS, hi, jbv), Uv), pre,
            rem);
        gcc_jit_block_add_assignment(pre, NULL, u, gcc_jit_context_zero(g->ctx, G->T.i64));
        gcc_jit_block_end_with_jump(pre, NULL, c2);
        gcc_jit_block_end_with_conditional(c2, NULL, cg_cmp(g, GCC_JIT_COMPARISON_LT, uv, Uv), body,
                                           step);
        g->b = body;
        G->u = uv;
        G->val[r] = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, jbv, uv));
        emit_seq(G, r + 1, G->match[r]);
        gcc_jit_block_add_assignment_op(g->b, NULL, u, GCC_JIT_BINARY_OP_PLUS,
                                        gcc_jit_context_one(g->ctx, G->T.i64));
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
                s[i] = gcc_jit_lvalue_as_rvalue(gcc_jit_context_new_array_access(
                    g->ctx, NULL, gcc_jit_lvalue_as_rvalue(G->part[a]), cg_int(g, G->T.i64, i)));
            for (int n = U; n > 1; n /= 2)
                for (int i = 0; i < n / 2; i++)
                    s[i] = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, s[2 * i], s[2 * i + 1]));
            gcc_jit_block_add_assignment_op(g->b, NULL, G->acc[a], GCC_JIT_BINARY_OP_PLUS, s[0]);
            G->mode[a] = ACC_PLAIN;
        }
        lo = cg_let(g, jbv);
    }
    emit_loop(G, r, lo, hi);
    for (int j = 0; j < na; j++) {
        int a = accs[j];
        if (G->mode[a] != ACC_KEY) continue;
        gcc_jit_block_add_assignment(
            g->b, NULL, G->acc[a],
            cg_funkey(g, gcc_jit_lvalue_as_rvalue(G->key[a]), ty_of(G, k->insts[a].dtype)));
        G->mode[a] = ACC_PLAIN;
    }
}

/* ---- blocked loops ----
 * An innermost loop that calls two or more of vmath's functions (each
 * inlined, at -O3, into both the vectorized loop and gcc's scalar copy of
 * it: the alias-check fallback and epilogue) runs over blocks of CG_BLOCK
 * elements instead, as a sequence of loops over the block split at the
 * calls (their "levels": a call's input computed in one loop, its result
 * used in a later one; independent calls share levels):
 *
 *     for (jb = lo; jb < hi; jb += CG_BLOCK) {
 *         m = min(CG_BLOCK, hi - jb);
 *         for (u = 0; u < m; u++) { level 0 (i = jb + u); a[u] = tanh's input; b[u] = ... }
 *         em_jit_blk3(a, m);        a[u] = tanh(a[u]) for u < m
 *         em_jit_blk3(b, m);
 *         for (u = 0; u < m; u++) { level 1, reading a[u], b[u]; ... }
 *     }
 *
 * Values used at a later level live in local arrays (at most
 * CG_BLOCK_STACK bytes, else the loop stays plain), except index
 * arithmetic and invariants, which each level recomputes (blk_remat).
 * Each vmath function
 * is built once per kernel as em_jit_blkN(float *p, int64_t m), not
 * inlined (CODE_OPTIONS): its loop, in place over one pointer, vectorizes
 * with no alias check, so a kernel holds one vectorized and one scalar
 * copy of each function it uses instead of two per use.  Measured
 * (docs/benchmarks.md, issue 22): a graph of one kernel of 13 tanh makes
 * its first call in 0.13 s instead of 0.26 s; wide 10k's cold call
 * 16.7 s instead of 58.4 s (medians, loaded machine).  Per
 * element the operations and their order are those of the plain loop
 * (bitwise the same results); only their order across the elements of a
 * block changes, as vectorization changes it. */

#define CG_BLOCK 128
/* The most stack a blocked loop's arrays may take (else the loop stays
 * plain): far below a thread's stack, within L2. */
#define CG_BLOCK_STACK (64 * 1024)
/* Calls to vmath functions from which an innermost loop is blocked. */
#define CG_BLOCK_MIN_CALLS 2

/* The vmath function instruction i calls (f32 transcendentals), or -1. */
static int blk_math(const k_kernel *k, int i) {
    const k_inst *in = &k->insts[i];
    if (in->op != K_ALU || in->nsrc != 1 || k->insts[in->src[0]].dtype != EM_F32) return -1;
    switch (in->alu) {
    case KA_EXP: return CGM_EXP;
    case KA_LOG: return CGM_LOG;
    case KA_TANH: return CGM_TANH;
    case KA_ERF: return CGM_ERF;
    case KA_SIGMOID: return CGM_SIGMOID;
    case KA_GELU: return CGM_GELU;
    case KA_GELU_TANH: return CGM_GELU_TANH;
    default: return -1;
    }
}

/* Whether innermost loop r is emitted blocked: no accumulators inside, and
 * enough calls to vmath functions. */
static bool blockable(const k_kernel *k, int r, int end) {
    int calls = 0;
    for (int i = r + 1; i < end; i++) {
        if (k->insts[i].op == K_ACC || k->insts[i].op == K_ACC_UPDATE) return false;
        calls += blk_math(k, i) >= 0;
    }
    return calls >= CG_BLOCK_MIN_CALLS;
}

/* void NAME_blk(float *p, int64_t m): p[u] = NAME(p[u]) for u < m. */
static gcc_jit_function *blk_fn(kgen *G, int f) {
    if (G->lib->blk[f]) return G->lib->blk[f];
    gcc_jit_context *ctx = G->g.ctx;
    gcc_jit_function *mf = cg_math_get(&G->lib->math, ctx, &G->T, (cg_mathfn)f);
    if (!mf) return NULL;
    gcc_jit_type *fp = gcc_jit_type_get_pointer(G->T.f32);
    gcc_jit_param *prm[2] = {gcc_jit_context_new_param(ctx, NULL, fp, "p"),
                             gcc_jit_context_new_param(ctx, NULL, G->T.i64, "m")};
    char name[32];
    snprintf(name, sizeof name, "em_jit_blk%d", f);
    gcc_jit_function *fn =
        gcc_jit_context_new_function(ctx, NULL, GCC_JIT_FUNCTION_INTERNAL, G->T.v, name, 2, prm, 0);
    if (!fn) return NULL;
    gcc_jit_lvalue *u = gcc_jit_function_new_local(fn, NULL, G->T.i64, "u");
    gcc_jit_block *entry = gcc_jit_function_new_block(fn, "entry"),
                  *cond = gcc_jit_function_new_block(fn, "cond"),
                  *body = gcc_jit_function_new_block(fn, "body"),
                  *done = gcc_jit_function_new_block(fn, "done");
    cg_val uv = gcc_jit_lvalue_as_rvalue(u);
    gcc_jit_block_add_assignment(entry, NULL, u, gcc_jit_context_zero(ctx, G->T.i64));
    gcc_jit_block_end_with_jump(entry, NULL, cond);
    gcc_jit_block_end_with_conditional(
        cond, NULL,
        gcc_jit_context_new_comparison(ctx, NULL, GCC_JIT_COMPARISON_LT, uv,
                                       gcc_jit_param_as_rvalue(prm[1])),
        body, done);
    gcc_jit_lvalue *pu = gcc_jit_context_new_array_access(ctx, NULL, gcc_jit_param_as_rvalue(prm[0]), uv);
    cg_val x = gcc_jit_lvalue_as_rvalue(pu);
    gcc_jit_block_add_assignment(body, NULL, pu, gcc_jit_context_new_call(ctx, NULL, mf, 1, &x));
    gcc_jit_block_add_assignment_op(body, NULL, u, GCC_JIT_BINARY_OP_PLUS,
                                    gcc_jit_context_one(ctx, G->T.i64));
    gcc_jit_block_end_with_jump(body, NULL, cond);
    gcc_jit_block_end_with_void_return(done, NULL);
    return G->lib->blk[f] = fn;
}

/* Values that a level recomputes where it uses them instead of reading
 * them from an array (G->remat): the invariants (constants, buffers,
 * sizes) and what is computed from them and the loop index alone (index
 * arithmetic: read back from an array, an index would make every access
 * through it a gather or scatter, and the loop scalar). */
static void blk_remat(kgen *G, int r, int end) {
    const k_kernel *k = G->k;
    for (int i = r + 1; i < end; i++) {
        const k_inst *in = &k->insts[i];
        bool re = in->op == K_CONST || in->op == K_BUF || in->op == K_SIZE;
        if ((in->op == K_ALU || in->op == K_CAST) && blk_math(k, i) < 0) {
            re = true;
            for (int s = 0; s < in->nsrc; s++) re &= in->src[s] <= r || G->remat[in->src[s]];
        }
        G->remat[i] = re;
    }
}

static gcc_jit_lvalue *arr_at(kgen *G, int v, cg_val u) {
    return gcc_jit_context_new_array_access(G->g.ctx, NULL, gcc_jit_lvalue_as_rvalue(G->arr[v]), u);
}

/* Sets val[v] for a use in segment S of blocked loop r (body up to end):
 * already there (G->stamp), read from v's array, or recomputed. */
static void blk_fetch(kgen *G, int r, int end, int v, int S, cg_val u) {
    if (v <= r || v >= end || G->stamp[v] == S + 1) return;
    if (G->remat[v]) {
        const k_inst *in = &G->k->insts[v];
        for (int s = 0; s < in->nsrc; s++) blk_fetch(G, r, end, in->src[s], S, u);
        emit_inst(G, v);
    } else {
        G->val[v] = gcc_jit_lvalue_as_rvalue(arr_at(G, v, u));
    }
    G->stamp[v] = S + 1;
}

/* Level of each instruction (G->seg): segment L's loop computes the
 * values of level L; the calls of level L run after it, on inputs it
 * stored, and their values are of level L + 1 to their users.  Memory
 * operations keep their order per element (a load not before an earlier
 * store, a store not before an earlier load or store).  Returns the
 * highest level. */
static int blk_levels(kgen *G, int r, int end) {
    const k_kernel *k = G->k;
    int top = 0, last_store = 0, last_mem = 0;
    blk_remat(G, r, end);
    for (int i = r + 1; i < end; i++) {
        const k_inst *in = &k->insts[i];
        int L = 0;
        for (int s = 0; s < in->nsrc; s++) {
            int v = in->src[s];
            if (v <= r) continue;
            int lv = G->seg[v] + (blk_math(k, v) >= 0);
            if (lv > L) L = lv;
        }
        if (in->op == K_LOAD && last_store > L) L = last_store;
        if (in->op == K_STORE && last_mem > L) L = last_mem;
        if (in->op == K_LOAD || in->op == K_STORE) last_mem = L;
        if (in->op == K_STORE) last_store = L;
        G->seg[i] = L;
        G->stamp[i] = 0;
        if (L > top) top = L;
    }
    return top;
}

/* Bytes of the arrays blocked loop r needs; with alloc, creates them.  A
 * value lives in an array when it is a call's, or used at another level
 * than its own. */
static size_t blk_arrays(kgen *G, int r, int end, bool alloc) {
    cg *g = &G->g;
    const k_kernel *k = G->k;
    for (int v = r + 1; v < end; v++) G->cross[v] = blk_math(k, v) >= 0;
    for (int j = r + 1; j < end; j++)
        for (int s = 0; s < k->insts[j].nsrc; s++) {
            int v = k->insts[j].src[s];
            if (v > r && !G->remat[v] && G->seg[j] != G->seg[v]) G->cross[v] = 1;
        }
    size_t bytes = 0;
    for (int v = r + 1; v < end; v++) {
        G->arr[v] = NULL;
        if (!G->cross[v]) continue;
        em_dtype d = k->insts[v].dtype;
        bytes += (size_t)CG_BLOCK * em_dtype_size(d);
        if (alloc)
            G->arr[v] = cg_local(
                g, gcc_jit_context_new_array_type(g->ctx, NULL, ty_of(G, d), CG_BLOCK), "blk");
    }
    return bytes;
}

/* u = 0; scond: if (u < m) goto sbody; else goto *after;  sbody: (g->b) */
static gcc_jit_block *seg_open(kgen *G, int r, gcc_jit_lvalue *u, cg_val jb, cg_val m,
                               gcc_jit_block **after) {
    cg *g = &G->g;
    cg_val uv = gcc_jit_lvalue_as_rvalue(u);
    gcc_jit_block *cond = cg_block(g, "scond"), *body = cg_block(g, "sbody");
    *after = cg_block(g, "safter");
    gcc_jit_block_add_assignment(g->b, NULL, u, gcc_jit_context_zero(g->ctx, G->T.i64));
    gcc_jit_block_end_with_jump(g->b, NULL, cond);
    gcc_jit_block_end_with_conditional(cond, NULL, cg_cmp(g, GCC_JIT_COMPARISON_LT, uv, m), body,
                                       *after);
    g->b = body;
    G->val[r] = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, jb, uv));
    return cond;
}

/* u += 1; goto cond;  then continues at after. */
static void seg_close(kgen *G, gcc_jit_lvalue *u, gcc_jit_block *cond, gcc_jit_block *after) {
    cg *g = &G->g;
    gcc_jit_block_add_assignment_op(g->b, NULL, u, GCC_JIT_BINARY_OP_PLUS,
                                    gcc_jit_context_one(g->ctx, G->T.i64));
    gcc_jit_block_end_with_jump(g->b, NULL, cond);
    g->b = after;
}

/* Segment L of blocked loop r: its instructions, the stores of values used
 * at other levels, and the inputs of its calls. */
static void emit_segment(kgen *G, int r, int L, cg_val uv) {
    cg *g = &G->g;
    const k_kernel *k = G->k;
    int end = G->match[r];
    for (int i = r + 1; i < end; i++) {
        const k_inst *in = &k->insts[i];
        if (G->seg[i] != L || in->op == K_END || G->remat[i]) continue; /* remat: on use */
        for (int s = 0; s < in->nsrc; s++) blk_fetch(G, r, end, in->src[s], L, uv);
        G->stamp[i] = L + 1;
        if (blk_math(k, i) >= 0) {
            gcc_jit_block_add_assignment(g->b, NULL, arr_at(G, i, uv), G->val[in->src[0]]);
            continue;
        }
        emit_inst(G, i);
        if (G->arr[i]) gcc_jit_block_add_assignment(g->b, NULL, arr_at(G, i, uv), G->val[i]);
    }
}

/* The calls after segment L: NAME_blk(&a[0], m). */
static void emit_calls(kgen *G, int r, int L, cg_val m) {
    cg *g = &G->g;
    for (int i = r + 1; i < G->match[r]; i++) {
        int f = blk_math(G->k, i);
        gcc_jit_function *fn = G->seg[i] == L && f >= 0 ? blk_fn(G, f) : NULL;
        if (!fn) continue;
        cg_val args[2] = {gcc_jit_lvalue_get_address(arr_at(G, i, cg_int(g, G->T.i64, 0)), NULL),
                          m};
        gcc_jit_block_add_eval(g->b, NULL, gcc_jit_context_new_call(g->ctx, NULL, fn, 2, args));
    }
}

/* Whether blocked loop r's arrays fit in CG_BLOCK_STACK (else it stays plain). */
static bool blk_fits(kgen *G, int r, int end) {
    blk_levels(G, r, end);
    return blk_arrays(G, r, end, false) <= CG_BLOCK_STACK;
}

static void emit_blocked_loop(kgen *G, int r, cg_val lo, cg_val hi) {
    cg *g = &G->g;
    int top = blk_levels(G, r, G->match[r]);
    blk_arrays(G, r, G->match[r], true);
    gcc_jit_lvalue *jb = cg_local(g, G->T.i64, "jb"), *u = cg_local(g, G->T.i64, "u");
    cg_val jbv = gcc_jit_lvalue_as_rvalue(jb), uv = gcc_jit_lvalue_as_rvalue(u);
    cg_val B = cg_int(g, G->T.i64, CG_BLOCK);
    gcc_jit_block *c1 = cg_block(g, "bcond"), *pre = cg_block(g, "bpre"),
                  *after = cg_block(g, "bafter");
    gcc_jit_block_add_assignment(g->b, NULL, jb, lo);
    gcc_jit_block_end_with_jump(g->b, NULL, c1);
    gcc_jit_block_end_with_conditional(c1, NULL, cg_cmp(g, GCC_JIT_COMPARISON_LT, jbv, hi), pre,
                                       after);
    g->b = pre;
    cg_val left = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_MINUS, hi, jbv));
    cg_val m = cg_let(g, cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, left, B), left, B));
    for (int L = 0; L <= top; L++) {
        gcc_jit_block *sa, *sc = seg_open(G, r, u, jbv, m, &sa);
        emit_segment(G, r, L, uv);
        seg_close(G, u, sc, sa);
        emit_calls(G, r, L, m);
    }
    gcc_jit_block_add_assignment_op(g->b, NULL, jb, GCC_JIT_BINARY_OP_PLUS, B);
    gcc_jit_block_end_with_jump(g->b, NULL, c1);
    g->b = after;
}

static void emit_range(kgen *G, int r) {
    cg *g = &G->g;
    const k_kernel *k = G->k;
    const k_inst *in = &k->insts[r];
    int end = G->match[r];
    cg_val ext = G->val[in->src[0]], lo, hi;
    if (in->flags & K_PARALLEL) {
        /* [max(begin, 0), min(end, extent)) */
        cg_val zero = gcc_jit_context_zero(g->ctx, G->T.i64);
        lo = cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, G->begin, zero), zero, G->begin);
        hi = cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_GT, G->end, ext), ext, G->end);
    } else {
        lo = gcc_jit_context_zero(g->ctx, G->T.i64);
        hi = ext;
    }
    bool innermost = true;
    for (int i = r + 1; i < end; i++)
        if (k->insts[i].op == K_RANGE) innermost = false;
    int na = 0, *accs = G->accbuf;
    if (innermost)
        for (int i = r + 1; i < end; i++) {
            const k_inst *u = &k->insts[i];
            if (u->op != K_ACC_UPDATE || !cg_is_float(k->insts[u->src[0]].dtype)) continue;
            bool seen = false;
            for (int j = 0; j < na; j++) seen |= accs[j] == u->src[0];
            if (!seen && !acc_read_in(k, u->src[0], r, end)) accs[na++] = u->src[0];
        }
    if (na > 0)
        emit_reduction_loop(G, r, lo, hi, accs, na);
    else if (innermost && blockable(k, r, end) && blk_fits(G, r, end))
        emit_blocked_loop(G, r, lo, hi);
    else
        emit_loop(G, r, lo, hi);
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

/* Rough cost in vector-lane operations (an ALU op's: kir_alu.def). */
static double inst_cost(const k_inst *in) {
    if (in->op != K_ALU)
        return in->op == K_LOAD || in->op == K_STORE || in->op == K_CAST || in->op == K_ACC_UPDATE;
    return kir_alu_info(in->alu)->cost;
}

static void mark_needed(const k_kernel *k, int v, bool *need) {
    if (need[v]) return;
    need[v] = true;
    for (int s = 0; s < k->insts[v].nsrc; s++) mark_needed(k, k->insts[v].src[s], need);
}

/* total + own * mult */
static cg_val plan_add(cg *g, cg_val total, double own, cg_val mult) {
    cg_val t = cg_bin(g, GCC_JIT_BINARY_OP_MULT, cg_f64(g, own), mult);
    return cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_PLUS, total, t));
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
        if (k->insts[i].op == K_RANGE && k->insts[i].src[0] < p)
            mark_needed(k, k->insts[i].src[0], need);
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
            total = plan_add(g, total, own, mult[depth]);
            own = 0;
            cg_val e = cg_f64(g, UNKNOWN_EXTENT);
            if (in->src[0] < p) { /* known before the parallel loop: max(extent, 0) */
                cg_val x = G->val[in->src[0]], zero = gcc_jit_context_zero(g->ctx, G->T.i64);
                e = cg_cast(g, cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, x, zero), zero, x),
                            G->T.f64);
            }
            mult[depth + 1] = cg_let(g, cg_bin(g, GCC_JIT_BINARY_OP_MULT, mult[depth], e));
            depth++;
        } else if (in->op == K_END) {
            total = plan_add(g, total, own, mult[depth]);
            own = 0;
            depth--;
        } else {
            own += inst_cost(in);
        }
    }
    total = cg_bin(g, GCC_JIT_BINARY_OP_PLUS, total, cg_f64(g, own));
    gcc_jit_block_add_assignment(g->b, NULL, work, total);
    cg_val ext = G->val[k->insts[p].src[0]];
    gcc_jit_block_end_with_return(
        g->b, NULL,
        cg_select(g, cg_cmp(g, GCC_JIT_COMPARISON_LT, ext, gcc_jit_context_zero(g->ctx, G->T.i64)),
                  gcc_jit_context_zero(g->ctx, G->T.i64), ext));
}

/* ---- both functions ---- */

em_status cg_emit_kernel(gcc_jit_context *ctx, cg_lib *lib, const k_kernel *k, const char *sym) {
    int n = k->n;
    size_t nn = (size_t)n + 1;
    kgen G = {.k = k, .lib = lib};
    G.match = em_calloc(nn, sizeof(int));
    G.val = em_calloc(nn, sizeof(cg_val));
    G.acc = em_calloc(nn, sizeof(gcc_jit_lvalue *));
    G.part = em_calloc(nn, sizeof(gcc_jit_lvalue *));
    G.key = em_calloc(nn, sizeof(gcc_jit_lvalue *));
    G.mode = em_calloc(nn, 1);
    G.accbuf = em_calloc(nn, sizeof(int));
    G.mult = em_calloc(nn, sizeof(cg_val));
    bool *need = em_calloc(nn, sizeof(bool));
    G.seg = em_calloc(nn, sizeof(int));
    G.arr = em_calloc(nn, sizeof(gcc_jit_lvalue *));
    G.cross = em_calloc(nn, 1);
    G.remat = em_calloc(nn, 1);
    G.stamp = em_calloc(nn, sizeof(int));
    em_status s = EM_OK;
    if (!G.match || !G.val || !G.acc || !G.part || !G.key || !G.mode || !G.accbuf || !G.mult ||
        !need || !G.seg || !G.arr || !G.cross || !G.remat ||
        !G.stamp) {
        s = em_last_status();
        goto done;
    }
    int *stack = G.accbuf, depth = 0; /* ranges are balanced: kir_verify */
    for (int i = 0; i < n; i++) {
        if (k->insts[i].op == K_RANGE)
            stack[depth++] = i;
        else if (k->insts[i].op == K_END)
            G.match[stack[--depth]] = i;
    }
    cg_types_init(&G.T, ctx);
    G.g = (cg){.ctx = ctx, .t = &G.T};
    gcc_jit_type *bufs_t = gcc_jit_type_get_pointer(G.T.vptr);
    gcc_jit_type *sizes_t = gcc_jit_type_get_pointer(G.T.i64);
    /* void NAME(void **bufs, int64_t *sizes, int64_t begin, int64_t end) */
    gcc_jit_param *prm[4] = {gcc_jit_context_new_param(ctx, NULL, bufs_t, "bufs"),
                             gcc_jit_context_new_param(ctx, NULL, sizes_t, "sizes"),
                             gcc_jit_context_new_param(ctx, NULL, G.T.i64, "begin"),
                             gcc_jit_context_new_param(ctx, NULL, G.T.i64, "end")};
    G.g.fn = gcc_jit_context_new_function(ctx, NULL, GCC_JIT_FUNCTION_EXPORTED, G.T.v, sym, 4,
                                          prm, 0);
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
    char pname[CG_MAX_NAME + sizeof CG_PLAN_SUFFIX];
    snprintf(pname, sizeof pname, "%s" CG_PLAN_SUFFIX, sym);
    gcc_jit_param *pp[3] = {
        gcc_jit_context_new_param(ctx, NULL, bufs_t, "bufs"),
        gcc_jit_context_new_param(ctx, NULL, sizes_t, "sizes"),
        gcc_jit_context_new_param(ctx, NULL, gcc_jit_type_get_pointer(G.T.f64), "work")};
    gcc_jit_function *pf = gcc_jit_context_new_function(ctx, NULL, GCC_JIT_FUNCTION_EXPORTED,
                                                        G.T.i64, pname, 3, pp, 0);
    if (pf) emit_plan(&G, pf, pp, need);
done:
    em_free(G.match), em_free(G.val), em_free(G.acc), em_free(G.part), em_free(G.key);
    em_free(G.mode), em_free(G.accbuf), em_free(G.mult), em_free(need);
    em_free(G.seg), em_free(G.arr), em_free(G.cross);
    em_free(G.remat), em_free(G.stamp);
    return s;
}
