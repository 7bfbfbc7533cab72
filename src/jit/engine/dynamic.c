/* dynamic.c - automatic dynamic shapes: may a graph traced at one set of
 * sizes serve others?
 *
 * C code computes sizes as plain integers: a size read from an input
 * (em_size) and passed on to an op (a reshape, a creation, a slice bound,
 * a fill value) is baked into the graph's attributes, and nothing says it
 * came from the input.  Two ways to tell:
 *  - automatic mode has two traces at different sizes (the entry that
 *    differed only in sizes, and the new one): every attribute and every
 *    node must be the same in both, so nothing the C code computed from
 *    the sizes changed between them (Dynamo learns the same from its
 *    symbolic sizes; a number that happens to be equal at both sizes is
 *    the limit, docs/compile.md);
 *  - forced mode has one trace: conservative rules (node_rule) that a
 *    false alarm only costs one more static entry.
 * Either way the graph's shapes must follow other sizes (inferred again at
 * probe sizes), and kernels are checked again for every new set of sizes
 * (backend_cpu.c). */
#include "engine.h"

#include <math.h>
#include <string.h>

/* Probe sizes: primes, unlikely to equal a static size of the graph.  A
 * coincidence only makes a kernel constant look static: the per-call
 * check (kir_match) then declines those sizes. */
static const int64_t probes[] = {97, 89, 83, 79, 73, 71, 67, 61, 59, 53, 47, 43, 41, 37, 31, 29};
#define NPROBES (int)(sizeof probes / sizeof probes[0])

typedef struct dyn_syms {
    int n;
    int64_t traced[NPROBES]; /* the traced size of each symbol */
    int64_t probe[NPROBES];
} dyn_syms;

/* A probe for a symbol of traced size v: distinct from every traced size
 * and every other probe, and a multiple of q (a divisor the guard
 * checks). */
static int64_t pick_probe(const dyn_syms *s, int64_t v, int64_t q) {
    for (int64_t j = 0;; j++) {
        int64_t c = (j < NPROBES ? probes[j] : 1000 + j) * (q > 1 ? q : 1);
        bool taken = c == v;
        for (int i = 0; i < s->n && !taken; i++) taken = c == s->traced[i] || c == s->probe[i];
        if (!taken) return c;
    }
}

/* The symbol of traced size v (one per distinct size: duck sizing), or -1
 * when there are too many. */
static int symbol_of(dyn_syms *s, int64_t v, int64_t q) {
    for (int i = 0; i < s->n; i++)
        if (s->traced[i] == v) return q > 1 && s->probe[i] % q ? -1 : i;
    if (s->n == NPROBES) return -1;
    s->probe[s->n] = pick_probe(s, v, q);
    s->traced[s->n] = v;
    return s->n++;
}

/* Input i's meta with its dynamic sizes replaced by their probes, laid out
 * as the guard will accept (dense: the same dim order; else the traced
 * strides). */
static void lay_out(const gd_tensor *gt, em_meta *m) {
    int64_t st = 1;
    for (int i = gt->dense ? gt->norder - 1 : -1; i >= 0; i--) {
        m->strides[gt->order[i]] = st;
        st *= m->sizes[gt->order[i]];
    }
}

static bool probe_input(const gd_tensor *gt, const em_tensor *t, dyn_syms *s, em_meta *m) {
    tr_meta_of(t, m);
    for (int d = 0; d < m->ndim; d++) {
        if (!(gt->dyn >> d & 1)) continue;
        int k = symbol_of(s, t->sizes[d], gt->div[d]);
        if (k < 0) return false;
        m->sizes[d] = s->probe[k];
    }
    lay_out(gt, m);
    return true;
}

/* Whether x could be a number computed from size s (s, 1/s, sqrt(s),
 * 1/sqrt(s)), in float32 or float64 rounding. */
static bool near(double x, double y) { return fabs(x - y) <= 1e-6 * fabs(y); }
static bool from_size(double x, const dyn_syms *s) {
    for (int i = 0; i < s->n; i++) {
        double v = (double)s->traced[i];
        if (near(x, v) || near(x, 1 / v) || near(x, sqrt(v)) || near(x, 1 / sqrt(v)))
            return true;
    }
    return false;
}

static bool is_traced_size(int64_t x, const dyn_syms *s) {
    for (int i = 0; i < s->n; i++)
        if (x == s->traced[i]) return true;
    return false;
}

/* The reason node i rules dynamic sizes out, or NULL. */
static const char *node_rule(const tr_graph *g, int i, const bool *varies, const dyn_syms *s) {
    const tr_node *n = &g->nodes[i];
    const em_op_info *info = &em_op_table[n->op];
    bool dyn_in = false;
    for (int k = 0; k < n->nin; k++) dyn_in |= varies[n->in[k]];
    if (info->attrs & A_SIZES) {
        bool sized = false;
        for (int d = 0; d < n->attrs.ndim; d++) {
            sized |= n->attrs.sizes[d] >= 2;
            if (is_traced_size(n->attrs.sizes[d], s)) return "its sizes contain a dynamic size";
        }
        if (sized && info->kind == EM_KIND_CREATE)
            return "it creates a tensor whose sizes may come from a dynamic size";
        if (sized && dyn_in) return "its target sizes apply to a tensor with a dynamic dim";
    }
    if (info->attrs & A_RANGE) {
        if (dyn_in) return "its bounds apply to a tensor with a dynamic dim";
        if (is_traced_size(n->attrs.start, s) || is_traced_size(n->attrs.end, s))
            return "a bound equals a dynamic size";
    }
    if ((info->attrs & A_VALUE) && from_size(n->attrs.value, s))
        return "its value may be computed from a dynamic size";
    if ((info->attrs & A_ARANGE) && (from_size(n->attrs.fstart, s) || from_size(n->attrs.fstep, s)))
        return "its start or step may be computed from a dynamic size";
    return NULL;
}

static bool meta_sizes_differ(const em_meta *a, const em_meta *b) {
    return a->ndim != b->ndim || memcmp(a->sizes, b->sizes, sizeof(int64_t) * (size_t)a->ndim);
}

/* The graph's input node of input i. */
static const tr_node *input_node(const tr_graph *g, int i) {
    for (int k = 0; k < g->nnodes; k++)
        if (g->nodes[k].kind == TR_INPUT && g->nodes[k].index == i) return &g->nodes[k];
    return NULL;
}

/* Whether g and prev have the same lists of inputs, constants and
 * outputs. */
static bool same_lists(const tr_graph *g, const tr_graph *prev) {
    return g->nnodes == prev->nnodes && g->ninputs == prev->ninputs &&
           g->nconsts == prev->nconsts && g->noutputs == prev->noutputs &&
           em_same_bytes(g->outputs, prev->outputs, sizeof(int) * (size_t)g->noutputs) &&
           em_same_bytes(g->consts, prev->consts, sizeof *g->consts * (size_t)g->nconsts);
}

/* ---- attributes that follow the sizes ---- */

/* What comparing two traces of one function reads: the new trace g (made
 * with inputs in, guarded by gs), the one at other sizes, and the
 * attributes that already followed in prev's entry. */
typedef struct follow_ctx {
    const tr_graph *g, *prev;
    const jit_dyn *prev_dyn;
    const gd_guards *gs;
    em_tensor *const *in;
} follow_ctx;

static const char *const field_names[] = {"size", "start", "end", "value"};
static const char *const form_names[] = {"times", "over", "times_sqrt", "over_sqrt"};

/* Node n's integer attribute field (index j of the sizes). */
static int64_t *int_attr(em_op_attrs *a, jit_sym_field field, int j) {
    return field == JIT_SYM_SIZE ? &a->sizes[j] : field == JIT_SYM_START ? &a->start : &a->end;
}

static double form_of(jit_sym_form form, double s) {
    switch (form) {
    case JIT_SYM_TIMES: return s;
    case JIT_SYM_OVER: return 1 / s;
    case JIT_SYM_TIMES_SQRT: return sqrt(s);
    default: return 1 / sqrt(s);
    }
}

/* z's value at size s, exactly as C computes 1.0 / sqrt(s) when f is 1. */
static double value_at(const jit_sym_size *z, double s) {
    switch (z->form) {
    case JIT_SYM_TIMES: return z->f * s;
    case JIT_SYM_OVER: return z->f / s;
    case JIT_SYM_TIMES_SQRT: return z->f * sqrt(s);
    default: return z->f / sqrt(s);
    }
}

/* How plain a fit is (lower: plainer): a size that is a multiple of the
 * symbol, then a positive slope; a value with coefficient 1. */
static int plainness(const jit_sym_size *z) {
    if (z->field == JIT_SYM_VALUE) return z->f != 1;
    return 4 * z->product + 2 * (z->b != 0) + (z->a < 0);
}

/* The dynamic dims of gs as (input, dim) pairs, one per symbol of g (the
 * first dim of each traced size), into ids; how many. */
static int symbols(const tr_graph *g, const gd_guards *gs, int (*ids)[2], int max) {
    int n = 0;
    for (int i = 0; i < gs->ntensors; i++) {
        const em_meta *m = &input_node(g, i)->meta;
        for (int d = 0; d < m->ndim && n < max; d++) {
            if (!(gs->tensors[i].dyn >> d & 1)) continue;
            bool seen = false;
            for (int k = 0; k < n && !seen; k++)
                seen = input_node(g, ids[k][0])->meta.sizes[ids[k][1]] == m->sizes[d];
            if (!seen) ids[n][0] = i, ids[n][1] = d, n++;
        }
    }
    return n;
}

/* Fits z as a * s1 * s2 for two distinct symbols s1, s2 (an arange over
 * b * t positions), from v in g and vp in prev: a exact at both.  Only
 * where no one-symbol fit exists; two pairs that fit make it ambiguous
 * (false). */
static bool fit_product(const tr_graph *g, const tr_graph *prev, const gd_guards *gs, double v,
                        double vp, jit_sym_size *z) {
    int ids[EM_MAX_DIMS * 4][2];
    int n = symbols(g, gs, ids, EM_MAX_DIMS * 4), found = 0;
    for (int x = 0; x < n; x++)
        for (int y = x + 1; y < n; y++) {
            int64_t s1 = input_node(g, ids[x][0])->meta.sizes[ids[x][1]];
            int64_t s2 = input_node(g, ids[y][0])->meta.sizes[ids[y][1]];
            int64_t p1 = input_node(prev, ids[x][0])->meta.sizes[ids[x][1]];
            int64_t p2 = input_node(prev, ids[y][0])->meta.sizes[ids[y][1]];
            int64_t iv = (int64_t)v, ivp = (int64_t)vp;
            if (s1 * s2 == 0 || iv % (s1 * s2) || iv / (s1 * s2) * p1 * p2 != ivp ||
                (s1 == p1 && s2 == p2))
                continue;
            if (found++) return false;
            z->input = ids[x][0], z->dim = ids[x][1];
            z->product = true, z->input2 = ids[y][0], z->dim2 = ids[y][1];
            z->a = iv / (s1 * s2), z->b = 0;
        }
    return found == 1;
}

/* Fits z (node, field, j set) from its value v in g and vp in prev: a * s
 * + b (integers) or f times a form of s (values, where two points check
 * the one coefficient), for one dynamic size s that changed between the
 * traces; scaled: a * s only (one coefficient too: a creation op's sizes,
 * which no infer rule checks, so that [b * b] is not fitted as 5b - 6 from
 * b = 2 and 3).  Dims of equal sizes in both traces are one symbol (duck
 * sizing).  Of the symbols that fit, the plainest fit wins ([b, t, 4, 16]
 * traced at b, t = 1, 8 and 2, 7: size 0 is b, not 9 - t); two equally
 * plain fits make it ambiguous.  false: no single fit. */
static bool fit(const tr_graph *g, const tr_graph *prev, const gd_guards *gs, double v, double vp,
                bool scaled, jit_sym_size *z) {
    double s0 = -1, sp0 = -1;
    int best = -1;
    bool tie = false;
    for (int i = 0; i < gs->ntensors; i++) {
        const em_meta *m = &input_node(g, i)->meta, *mp = &input_node(prev, i)->meta;
        for (int d = 0; d < m->ndim; d++) {
            double s = (double)m->sizes[d], sp = (double)mp->sizes[d];
            if (!(gs->tensors[i].dyn >> d & 1) || s == sp || (s == s0 && sp == sp0)) continue;
            jit_sym_size c = *z;
            c.input = i, c.dim = d;
            bool ok = false;
            if (z->field != JIT_SYM_VALUE) {
                int64_t dv = (int64_t)v - (int64_t)vp, ds = (int64_t)s - (int64_t)sp;
                ok = dv % ds == 0 && (!scaled || (int64_t)v * (int64_t)sp == (int64_t)vp * (int64_t)s);
                c.a = ok ? dv / ds : 0;
                c.b = (int64_t)v - c.a * (int64_t)s;
            }
            for (int f = 0; !ok && z->field == JIT_SYM_VALUE && f < 4; f++) {
                c.form = (jit_sym_form)f;
                c.f = v / form_of(c.form, s);
                ok = c.f != 0 && near(value_at(&c, sp), vp) && near(value_at(&c, s), v);
                if (ok && near(c.f, 1)) c.f = 1; /* 1.0 / sqrt(s), as the C code wrote it */
            }
            if (!ok) continue;
            int p = plainness(&c);
            if (best >= 0 && p == best) tie = true;
            if (best >= 0 && p >= best) continue;
            best = p, tie = false;
            s0 = s, sp0 = sp;
            *z = c;
        }
    }
    if (best < 0 && z->field != JIT_SYM_VALUE) return fit_product(g, prev, gs, v, vp, z);
    return best >= 0 && !tie;
}

/* prev_dyn's follow of z's attribute, when it still holds in g (traced with
 * in); NULL otherwise.  A fit made from earlier traces beats a new one. */
static const jit_sym_size *inherited(const jit_dyn *prev_dyn, const jit_sym_size *z,
                                     const tr_graph *g, em_tensor *const *in);
static bool sym_in_graph(const jit_sym_size *z, const tr_graph *g, int64_t *s);
static bool holds_at(const jit_sym_size *z, const tr_node *n, int64_t s);

/* Appends to dyn the follow of node k's field (j) whose value changed from
 * prev (v) to g (vp); false when none fits or dyn is full. */
static bool follow_field(const follow_ctx *c, int k, jit_sym_field field, int j, jit_dyn *dyn) {
    const tr_graph *g = c->g, *prev = c->prev;
    if (dyn->nsizes == JIT_MAX_SYM_SIZES) return false;
    jit_sym_size z = {.node = k, .j = j, .field = field};
    const jit_sym_size *old = inherited(c->prev_dyn, &z, g, c->in);
    int64_t sp;
    /* an earlier fit counts only if the other trace agrees (it may have
     * moved a symbol the earlier traces did not) */
    if (old && !old->rest &&
        !(sym_in_graph(old, prev, &sp) && holds_at(old, &prev->nodes[k], sp)))
        old = NULL;
    if (old) {
        dyn->sizes[dyn->nsizes++] = *old;
        return true;
    }
    em_op_attrs a = g->nodes[k].attrs, ap = prev->nodes[k].attrs;
    double v = field == JIT_SYM_VALUE ? a.value : (double)*int_attr(&a, field, j);
    double vp = field == JIT_SYM_VALUE ? ap.value : (double)*int_attr(&ap, field, j);
    bool scaled = field == JIT_SYM_SIZE && em_op_table[g->nodes[k].op].kind == EM_KIND_CREATE;
    if (!fit(g, prev, c->gs, v, vp, scaled, &z)) return false;
    dyn->sizes[dyn->nsizes++] = z;
    return true;
}

/* Reshape node k's sizes that changed: each follows one dynamic size, or
 * one of them is "the rest" (torch's -1), exact whatever product of sizes
 * it is, given the others: the only size that changed is, and otherwise
 * one that no single size explains. */
static bool reshape_follows(const follow_ctx *c, int k, jit_dyn *dyn) {
    const tr_graph *g = c->g, *prev = c->prev;
    const jit_dyn *prev_dyn = c->prev_dyn;
    const em_op_attrs *a = &g->nodes[k].attrs, *ap = &prev->nodes[k].attrs;
    int ndiff = 0;
    for (int j = 0; j < a->ndim; j++) ndiff += a->sizes[j] != ap->sizes[j];
    int prev_rest = -1; /* the previous entry's rest size of this node stays the rest */
    for (int i = 0; prev_dyn && i < prev_dyn->nsizes; i++)
        if (prev_dyn->sizes[i].rest && prev_dyn->sizes[i].node == k) prev_rest = prev_dyn->sizes[i].j;
    bool rest = prev_rest >= 0;
    for (int j = 0; j < a->ndim; j++) {
        if (a->sizes[j] == ap->sizes[j]) continue;
        if (j != prev_rest && (ndiff > 1 || rest) && follow_field(c, k, JIT_SYM_SIZE, j, dyn))
            continue;
        if (dyn->nsizes == JIT_MAX_SYM_SIZES || (rest && j != prev_rest)) return false;
        dyn->sizes[dyn->nsizes++] = (jit_sym_size){.node = k, .j = j, .field = JIT_SYM_SIZE, .rest = true};
        rest = true;
    }
    return true;
}

/* Whether call node k of g differs from prev's only in attributes that
 * each follow one dynamic size (appended to dyn): the sizes of a reshape,
 * an expand or a creation op (arange's count, a mask's [t, t]), a slice's
 * bounds, a fill or scalar value.  A reshape's and an expand's infer rules
 * check their sizes against their input at every size; a creation op's
 * sizes and a value are trusted to the fit, which two traces made. */
static bool attrs_follow(const follow_ctx *c, int k, jit_dyn *dyn) {
    const tr_graph *g = c->g, *prev = c->prev;
    const tr_node *a = &g->nodes[k];
    tr_node b = prev->nodes[k];
    const em_op_info *info = &em_op_table[a->op];
    if (a->kind != TR_CALL || b.kind != TR_CALL || a->op != b.op || a->attrs.ndim != b.attrs.ndim)
        return false;
    bool sized = a->op == EM_OP_RESHAPE || a->op == EM_OP_EXPAND || info->kind == EM_KIND_CREATE;
    if (sized) memcpy(b.attrs.sizes, a->attrs.sizes, sizeof b.attrs.sizes);
    b.attrs.start = a->attrs.start, b.attrs.end = a->attrs.end, b.attrs.value = a->attrs.value;
    if (!tr_same_call(a, &b)) return false;
    const em_op_attrs *x = &a->attrs, *y = &prev->nodes[k].attrs;
    if (a->op == EM_OP_RESHAPE && !reshape_follows(c, k, dyn)) return false;
    for (int j = 0; (info->attrs & A_SIZES) && a->op != EM_OP_RESHAPE && j < x->ndim; j++)
        if (x->sizes[j] != y->sizes[j] && !follow_field(c, k, JIT_SYM_SIZE, j, dyn))
            return false;
    if ((info->attrs & A_RANGE) && x->start != y->start && !follow_field(c, k, JIT_SYM_START, 0, dyn))
        return false;
    if ((info->attrs & A_RANGE) && x->end != y->end && !follow_field(c, k, JIT_SYM_END, 0, dyn))
        return false;
    if ((info->attrs & A_VALUE) && memcmp(&x->value, &y->value, sizeof x->value) &&
        !follow_field(c, k, JIT_SYM_VALUE, 0, dyn))
        return false;
    return true;
}

/* z's symbol value for the input metas inputs: its size, or the product
 * of its two. */
static int64_t sym_in_metas(const jit_sym_size *z, const em_meta *inputs) {
    int64_t s = inputs[z->input].sizes[z->dim];
    return z->product ? s * inputs[z->input2].sizes[z->dim2] : s;
}

static int64_t sym_in_tensors(const jit_sym_size *z, em_tensor *const *in) {
    int64_t s = in[z->input]->sizes[z->dim];
    return z->product ? s * in[z->input2]->sizes[z->dim2] : s;
}

/* z's symbol value at g's input sizes; false when g has no such dims. */
static bool sym_in_graph(const jit_sym_size *z, const tr_graph *g, int64_t *s) {
    const tr_node *a = input_node(g, z->input), *b = z->product ? input_node(g, z->input2) : NULL;
    if (!a || z->dim >= a->meta.ndim || (z->product && (!b || z->dim2 >= b->meta.ndim))) return false;
    *s = a->meta.sizes[z->dim] * (b ? b->meta.sizes[z->dim2] : 1);
    return true;
}

/* Sets z's attribute in n for the input metas inputs (not a rest). */
static void apply(const jit_sym_size *z, tr_node *n, const em_meta *inputs) {
    int64_t s = sym_in_metas(z, inputs);
    if (z->field == JIT_SYM_VALUE) n->attrs.value = value_at(z, (double)s);
    else *int_attr(&n->attrs, z->field, z->j) = z->a * s + z->b;
}

/* Whether z holds for node n's attributes when its size is s. */
static bool holds_at(const jit_sym_size *z, const tr_node *n, int64_t s) {
    if (z->rest) return true;
    if (z->field == JIT_SYM_VALUE) {
        double v = value_at(z, (double)s);
        return !memcmp(&v, &n->attrs.value, sizeof v);
    }
    em_op_attrs a = n->attrs;
    return *int_attr(&a, z->field, z->j) == z->a * s + z->b;
}

/* Whether z holds for node n's attributes at the sizes of in. */
static bool holds(const jit_sym_size *z, const tr_node *n, em_tensor *const *in) {
    return z->rest || holds_at(z, n, sym_in_tensors(z, in));
}

static const jit_sym_size *inherited(const jit_dyn *prev_dyn, const jit_sym_size *z,
                                     const tr_graph *g, em_tensor *const *in) {
    for (int i = 0; prev_dyn && i < prev_dyn->nsizes; i++) {
        const jit_sym_size *o = &prev_dyn->sizes[i];
        if (o->node == z->node && o->field == z->field && o->j == z->j && !o->rest &&
            o->node < g->nnodes && holds(o, &g->nodes[o->node], in))
            return o;
    }
    return NULL;
}

bool jit_dyn_holds(const jit_dyn *dyn, const tr_graph *g) {
    for (int i = 0; i < dyn->nsizes; i++) {
        const jit_sym_size *z = &dyn->sizes[i];
        if (z->rest) continue;
        int64_t s;
        if (z->node >= g->nnodes || !sym_in_graph(z, g, &s) || !holds_at(z, &g->nodes[z->node], s))
            return false;
    }
    return true;
}

/* Whether g's nodes, at dry's input sizes with dyn's attributes
 * following them, are dry's nodes: the same ops on the same inputs with
 * the same attributes and the same inferred sizes. */
static bool same_nodes(const tr_graph *g, const tr_graph *dry, const em_meta *metas) {
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *a = &g->nodes[i], *b = &dry->nodes[i];
        if (a->kind != b->kind || metas[i].dtype != b->meta.dtype ||
            meta_sizes_differ(&metas[i], &b->meta))
            return false;
        if (a->kind == TR_CALL ? !tr_same_call(a, b) : a->index != b->index) return false;
    }
    return true;
}

bool jit_dyn_same(const jit_dyn *dyn, const tr_graph *g, const tr_graph *dry) {
    if (!same_lists(g, dry)) return false;
    em_meta *inputs = em_malloc(sizeof *inputs * ((size_t)g->ninputs + 1));
    em_meta *metas = em_malloc(sizeof *metas * ((size_t)g->nnodes + 1));
    tr_graph gx = *g;
    gx.nodes = em_malloc(sizeof *gx.nodes * ((size_t)g->nnodes + 1));
    bool ok = inputs && metas && gx.nodes;
    for (int i = 0; ok && i < g->ninputs; i++) {
        const tr_node *n = input_node(dry, i);
        ok = n != NULL;
        if (ok) inputs[i] = n->meta;
    }
    if (ok) memcpy(gx.nodes, g->nodes, sizeof *gx.nodes * (size_t)g->nnodes);
    jit_dyn none = {0};
    ok = ok && jit_dyn_infer(dyn ? dyn : &none, &gx, inputs, metas) == EM_OK &&
         same_nodes(&gx, dry, metas);
    em_clear_error(); /* sizes the graph does not take are an answer, not an error */
    em_free(inputs);
    em_free(metas);
    em_free(gx.nodes);
    return ok;
}

/* ---- dynamic hints ---- */

#define HINT_KIND "dynhint"

/* g's structure without its sizes: what two traces of one function at
 * other sizes share (the attributes that may follow a size are left out). */
static kc_key hint_key(const char *backend, const tr_graph *g) {
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "ember-dynhint-1");
    kc_hasher_update_str(&h, backend);
    kc_hasher_update_u64(&h, (uint64_t)g->nnodes);
    kc_hasher_update(&h, g->outputs, sizeof(int) * (size_t)g->noutputs);
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        int64_t v[5] = {n->kind, n->kind == TR_CALL ? (int64_t)n->op : n->index, n->nin, n->meta.dtype,
                        n->meta.ndim};
        kc_hasher_update(&h, v, sizeof v);
        if (n->kind != TR_CALL) continue;
        kc_hasher_update(&h, n->in, sizeof(int) * (size_t)n->nin);
        /* only the attributes the op has (a parsed graph has no others) */
        const em_op_attrs *a = &n->attrs;
        unsigned m = em_op_table[n->op].attrs;
        int64_t w[8] = {m & A_SIZES ? a->ndim : 0, m & A_DIMS ? a->ndims : 0, m & A_DIM ? a->dim : 0,
                        m & A_RANGE ? a->step : 0, m & A_CORRECTION ? a->correction : 0,
                        m & A_KEEPDIM ? a->keepdim : 0, m & A_DTYPE ? (int64_t)a->dtype : -1,
                        m & A_CAUSAL ? a->causal : 0};
        kc_hasher_update(&h, w, sizeof w);
        if (m & A_DIMS) kc_hasher_update(&h, a->dims, sizeof(int) * (size_t)a->ndims);
    }
    return kc_hasher_digest(&h);
}

bool jit_dyn_hint_get(kc_cache *c, const char *backend, const tr_graph *g, uint32_t *mask) {
    if (!c || !backend || g->ninputs <= 0) return false;
    kc_key k = hint_key(backend, g);
    void *data = NULL;
    size_t n = 0;
    bool ok = kc_get(c, &k, HINT_KIND, &data, &n) == EM_OK && data &&
              n == sizeof(uint32_t) * (size_t)g->ninputs;
    if (ok) memcpy(mask, data, n);
    em_free(data);
    em_clear_error(); /* a hint that cannot be read is no hint */
    return ok;
}

void jit_dyn_hint_put(kc_cache *c, const char *backend, const tr_graph *g, const gd_guards *gs) {
    if (!c || !backend || g->ninputs <= 0 || g->ninputs != gs->ntensors || g->ninputs > 64) return;
    uint32_t mask[64], old[64];
    for (int i = 0; i < g->ninputs; i++) mask[i] = gs->tensors[i].dyn;
    bool had = jit_dyn_hint_get(c, backend, g, old);
    bool same = had;
    for (int i = 0; had && i < g->ninputs; i++) {
        same &= (old[i] | mask[i]) == old[i];
        mask[i] |= old[i];
    }
    kc_key k = hint_key(backend, g);
    if (!same) (void)kc_put(c, &k, HINT_KIND, mask, sizeof(uint32_t) * (size_t)g->ninputs);
    em_clear_error(); /* a hint that cannot be written only costs a static entry */
}

void jit_sym_print(const jit_sym_size *z, FILE *f) {
    fprintf(f, "follow %%%d %s[%d] = ", z->node, field_names[z->field], z->j);
    if (z->rest) fprintf(f, "rest\n");
    else if (z->field == JIT_SYM_VALUE)
        fprintf(f, "%a %s in%d[%d]\n", z->f, form_names[z->form], z->input, z->dim);
    else if (z->product)
        fprintf(f, "%lld * in%d[%d] * in%d[%d] + %lld\n", (long long)z->a, z->input, z->dim,
                z->input2, z->dim2, (long long)z->b);
    else
        fprintf(f, "%lld * in%d[%d] + %lld\n", (long long)z->a, z->input, z->dim, (long long)z->b);
}

/* The index of name in names[n], or -1. */
static int name_index(const char *name, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

bool jit_sym_parse(const char *s, jit_sym_size *z) {
    char field[16], word[16];
    int used = 0;
    memset(z, 0, sizeof *z);
    if (sscanf(s, "follow %%%d %15[a-z][%d] = %n", &z->node, field, &z->j, &used) != 3 || !used)
        return false;
    int fi = name_index(field, field_names, 4);
    if (fi < 0 || z->node < 0 || z->j < 0 || z->j >= EM_MAX_DIMS) return false;
    z->field = (jit_sym_field)fi;
    s += used;
    if (sscanf(s, "%15s", word) == 1 && !strcmp(word, "rest")) return z->rest = z->field == JIT_SYM_SIZE;
    long long a, b;
    if (z->field == JIT_SYM_VALUE) {
        if (sscanf(s, "%la %15s in%d[%d]", &z->f, word, &z->input, &z->dim) != 4) return false;
        int form = name_index(word, form_names, 4);
        if (form < 0 || !isfinite(z->f)) return false;
        z->form = (jit_sym_form)form;
    } else if (sscanf(s, "%lld * in%d[%d] * in%d[%d] + %lld", &a, &z->input, &z->dim, &z->input2,
                      &z->dim2, &b) == 6) {
        z->a = a, z->b = b, z->product = true;
        if (z->input2 < 0 || z->dim2 < 0 || z->dim2 >= EM_MAX_DIMS) return false;
    } else {
        if (sscanf(s, "%lld * in%d[%d] + %lld", &a, &z->input, &z->dim, &b) != 4) return false;
        z->a = a, z->b = b;
    }
    return z->input >= 0 && z->dim >= 0 && z->dim < EM_MAX_DIMS;
}

/* The first node where g and prev (the same function traced at other
 * sizes) differ in more than their metas and the attribute sizes
 * sizes_follow accepts; -1: none; nnodes: the lists of inputs, constants
 * or outputs differ. */
static int first_difference(const follow_ctx *c, jit_dyn *dyn) {
    const tr_graph *g = c->g, *prev = c->prev;
    if (!same_lists(g, prev)) return g->nnodes;
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *a = &g->nodes[i], *b = &prev->nodes[i];
        if (a->kind != b->kind || a->meta.dtype != b->meta.dtype || a->meta.ndim != b->meta.ndim)
            return i;
        if (a->kind != TR_CALL ? a->index != b->index
                               : !tr_same_call(a, b) && !attrs_follow(c, i, dyn))
            return i;
    }
    return -1;
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

/* Why reshape node k's rest size has no value at the sizes of inputs
 * (numel elements for the product other of its other sizes): in terms of
 * the one input dim that differs from the trace when there is one and the
 * element count is a multiple of it ("x[1] (input 0 dim 1) must be
 * divisible by 12, got 31"), else in elements. */
static em_status rest_error(const tr_graph *g, const em_meta *inputs, int k, int64_t numel,
                            int64_t other, jit_dyn *need) {
    const tr_node *in = NULL;
    int dim = -1, nchanged = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        for (int d = 0; n->kind == TR_INPUT && d < n->meta.ndim; d++)
            if (n->meta.sizes[d] != inputs[n->index].sizes[d]) nchanged++, in = n, dim = d;
    }
    int64_t s = nchanged == 1 ? inputs[in->index].sizes[dim] : 0;
    if (s > 0 && other > 0 && numel % s == 0) {
        int64_t q = other / gcd64(numel / s, other);
        if (need) need->need.input = in->index, need->need.dim = dim, need->need.q = q;
        return em_error(EM_ERR_SHAPE, "%s[%d] (input %d dim %d) must be divisible by %lld, got %lld "
                        "(node %%%d, a reshape, splits it)", in->name ? in->name : "input", dim,
                        in->index, dim, (long long)q, (long long)s, k);
    }
    return em_error(EM_ERR_SHAPE, "node %%%d (reshape): %lld elements do not fill the sizes "
                    "(their other sizes multiply to %lld)", k, (long long)numel, (long long)other);
}

/* Sets reshape node k's "rest" size from its input's element count. */
static em_status set_rest(const tr_graph *g, const em_meta *inputs, tr_node *n, int j,
                          const em_meta *in, int k, jit_dyn *need) {
    int64_t other = 1;
    for (int d = 0; d < n->attrs.ndim; d++)
        if (d != j) other *= n->attrs.sizes[d];
    int64_t numel = em_shape_numel(in->ndim, in->sizes);
    if (other <= 0 || numel % other) return rest_error(g, inputs, k, numel, other, need);
    n->attrs.sizes[j] = numel / other;
    return EM_OK;
}

/* jit_dyn_infer, telling need (when not NULL) of a divisor that would let
 * a reshape split a dim. */
static em_status infer_at(const jit_dyn *dyn, tr_graph *g, const em_meta *inputs, em_meta *metas,
                          jit_dyn *need) {
    for (int i = 0; i < dyn->nsizes; i++)
        if (!dyn->sizes[i].rest) apply(&dyn->sizes[i], &g->nodes[dyn->sizes[i].node], inputs);
    for (int i = 0; i < g->nnodes; i++) {
        tr_node *n = &g->nodes[i];
        em_status s = EM_OK;
        if (n->kind == TR_INPUT) {
            metas[i] = inputs[n->index];
            continue;
        }
        if (n->kind == TR_CONST) {
            metas[i] = n->meta;
            continue;
        }
        for (int k = 0; k < dyn->nsizes && s == EM_OK; k++)
            if (dyn->sizes[k].rest && dyn->sizes[k].node == i)
                s = set_rest(g, inputs, n, dyn->sizes[k].j, &metas[n->in[0]], i, need);
        if (s == EM_OK) s = tr_infer_node(g, i, metas);
        if (s != EM_OK) return s;
    }
    return EM_OK;
}

em_status jit_dyn_infer(const jit_dyn *dyn, tr_graph *g, const em_meta *inputs, em_meta *metas) {
    return infer_at(dyn, g, inputs, metas, NULL);
}

bool jit_dyn_probe(const gd_guards *gs, em_tensor *const *in, int ninputs, em_meta *probe) {
    dyn_syms s = {0};
    for (int i = 0; i < ninputs; i++)
        if (!probe_input(&gs->tensors[i], in[i], &s, &probe[i])) return false;
    return true;
}

void jit_dyn_metas_at(const gd_guards *gs, em_tensor *const *in, int ninputs, int64_t traced,
                      int64_t size, em_meta *m) {
    for (int i = 0; i < ninputs; i++) {
        const gd_tensor *gt = &gs->tensors[i];
        tr_meta_of(in[i], &m[i]);
        for (int d = 0; d < m[i].ndim; d++)
            if ((gt->dyn >> d & 1) && in[i]->sizes[d] == traced) m[i].sizes[d] = size;
        lay_out(gt, &m[i]);
    }
}

/* Infers g's metas at the probe sizes (attribute sizes moved along). */
static bool infer_probe(const tr_graph *g, jit_dyn *dyn, em_meta *metas, char *why,
                        size_t nwhy) {
    tr_graph gp = *g;
    gp.nodes = em_malloc(sizeof *gp.nodes * ((size_t)g->nnodes + 1));
    if (!gp.nodes) {
        snprintf(why, nwhy, "out of memory");
        return false;
    }
    memcpy(gp.nodes, g->nodes, sizeof *gp.nodes * (size_t)g->nnodes);
    bool ok = infer_at(dyn, &gp, dyn->probe, metas, dyn) == EM_OK;
    if (!ok) {
        snprintf(why, nwhy, "the graph's shapes do not follow other sizes (%s)", em_last_error());
        em_clear_error();
    }
    em_free(gp.nodes);
    return ok;
}

/* Adds prev_dyn's attribute sizes that g's equal attributes still
 * follow (a size the previous entry made follow a dim that did not change
 * between the two traces); false when one no longer holds. */
static bool inherit(const tr_graph *g, const jit_dyn *prev_dyn, em_tensor *const *in,
                    jit_dyn *dyn) {
    for (int i = 0; prev_dyn && i < prev_dyn->nsizes; i++) {
        const jit_sym_size *z = &prev_dyn->sizes[i];
        bool have = false;
        for (int k = 0; k < dyn->nsizes && !have; k++)
            have = dyn->sizes[k].node == z->node && dyn->sizes[k].field == z->field &&
                   dyn->sizes[k].j == z->j;
        if (have) continue;
        if (dyn->nsizes == JIT_MAX_SYM_SIZES || z->node >= g->nnodes ||
            !holds(z, &g->nodes[z->node], in))
            return false;
        dyn->sizes[dyn->nsizes++] = *z;
    }
    return true;
}

bool jit_dyn_check(const tr_graph *g, const tr_graph *prev, const jit_dyn *prev_dyn,
                   const gd_guards *gs, em_tensor *const *in, jit_dyn *dyn, char *why,
                   size_t nwhy) {
    dyn_syms s = {0};
    dyn->nsizes = 0;
    dyn->need.q = 0;
    for (int i = 0; i < g->ninputs; i++) {
        if (!probe_input(&gs->tensors[i], in[i], &s, &dyn->probe[i])) {
            snprintf(why, nwhy, "more than %d distinct dynamic sizes", NPROBES);
            return false;
        }
    }
    follow_ctx fc = {g, prev, prev_dyn, gs, in};
    int d = prev ? first_difference(&fc, dyn) : -1;
    if (d >= 0) {
        if (d == g->nnodes) snprintf(why, nwhy, "the graph traced at the other sizes differs");
        else
            snprintf(why, nwhy, "node %%%d (%s) differs from the trace at the other sizes",
                     d, g->nodes[d].kind == TR_CALL ? em_op_table[g->nodes[d].op].name : "input");
        return false;
    }
    if (!inherit(g, prev_dyn, in, dyn)) {
        snprintf(why, nwhy, "an attribute that followed the sizes no longer does");
        return false;
    }
    em_meta *metas = em_malloc(sizeof *metas * ((size_t)g->nnodes + 1));
    bool *varies = em_calloc((size_t)g->nnodes + 1, sizeof(bool));
    bool ok = metas && varies;
    if (!ok) snprintf(why, nwhy, "out of memory");
    ok = ok && infer_probe(g, dyn, metas, why, nwhy);
    for (int i = 0; ok && !prev && i < g->nnodes; i++) {
        varies[i] = meta_sizes_differ(&metas[i], &g->nodes[i].meta);
        const char *r = g->nodes[i].kind == TR_CALL ? node_rule(g, i, varies, &s) : NULL;
        if (r) {
            snprintf(why, nwhy, "node %%%d (%s): %s", i, em_op_table[g->nodes[i].op].name, r);
            ok = false;
        }
    }
    em_free(metas);
    em_free(varies);
    return ok;
}
