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
 * and every other probe. */
static int64_t pick_probe(const dyn_syms *s, int64_t v) {
    for (int64_t j = 0;; j++) {
        int64_t c = j < NPROBES ? probes[j] : 1000 + j;
        bool taken = c == v;
        for (int i = 0; i < s->n && !taken; i++) taken = c == s->traced[i] || c == s->probe[i];
        if (!taken) return c;
    }
}

/* The symbol of traced size v (one per distinct size: duck sizing), or -1
 * when there are too many. */
static int symbol_of(dyn_syms *s, int64_t v) {
    for (int i = 0; i < s->n; i++)
        if (s->traced[i] == v) return i;
    if (s->n == NPROBES) return -1;
    s->probe[s->n] = pick_probe(s, v);
    s->traced[s->n] = v;
    return s->n++;
}

/* Input i's meta with its dynamic sizes replaced by their probes, laid out
 * as the guard will accept (dense: the same dim order; else the traced
 * strides). */
static bool probe_input(const gd_tensor *gt, const em_tensor *t, dyn_syms *s, em_meta *m) {
    tr_meta_of(t, m);
    for (int d = 0; d < m->ndim; d++) {
        if (!(gt->dyn >> d & 1)) continue;
        int k = symbol_of(s, t->sizes[d]);
        if (k < 0) return false;
        m->sizes[d] = s->probe[k];
    }
    int64_t st = 1;
    for (int i = gt->dense ? gt->norder - 1 : -1; i >= 0; i--) {
        m->strides[gt->order[i]] = st;
        st *= m->sizes[gt->order[i]];
    }
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

/* Fits attribute size j of node k, v in g and vp in prev, as a * s + b
 * for one dynamic size s that changed between the traces (s in g, sp in
 * prev).  Dims of equal sizes in both traces are one symbol (duck sizing);
 * two symbols that both fit make it ambiguous.  false: no single fit. */
static bool fit_size(const tr_graph *g, const tr_graph *prev, const gd_guards *gs, int k, int j,
                     jit_sym_size *out) {
    int64_t v = g->nodes[k].attrs.sizes[j], vp = prev->nodes[k].attrs.sizes[j];
    int64_t s0 = -1, sp0 = -1;
    for (int i = 0; i < gs->ntensors; i++) {
        const em_meta *m = &input_node(g, i)->meta, *mp = &input_node(prev, i)->meta;
        for (int d = 0; d < m->ndim; d++) {
            int64_t s = m->sizes[d], sp = mp->sizes[d];
            if (!(gs->tensors[i].dyn >> d & 1) || s == sp || (v - vp) % (s - sp)) continue;
            if (s0 >= 0 && (s != s0 || sp != sp0)) return false; /* ambiguous */
            if (s0 >= 0) continue;
            s0 = s, sp0 = sp;
            int64_t a = (v - vp) / (s - sp);
            *out = (jit_sym_size){.node = k, .j = j, .input = i, .dim = d, .a = a, .b = v - a * s};
        }
    }
    return s0 >= 0;
}

/* Whether call node k of g differs from prev's only in attribute sizes
 * that each follow one dynamic size (appended to dyn), in a reshape or an
 * expand, whose infer rules then check them against their input at every
 * size (a creation op's sizes would be unchecked). */
static bool sizes_follow(const tr_graph *g, const tr_graph *prev, const jit_dyn *prev_dyn,
                         const gd_guards *gs, int k, jit_dyn *dyn) {
    const tr_node *a = &g->nodes[k];
    tr_node b = prev->nodes[k];
    if (a->kind != TR_CALL || b.kind != TR_CALL || a->op != b.op ||
        (a->op != EM_OP_RESHAPE && a->op != EM_OP_EXPAND) || a->attrs.ndim != b.attrs.ndim)
        return false;
    memcpy(b.attrs.sizes, a->attrs.sizes, sizeof b.attrs.sizes);
    if (!tr_same_call(a, &b)) return false;
    int ndiff = 0;
    for (int j = 0; j < a->attrs.ndim; j++) ndiff += a->attrs.sizes[j] != prev->nodes[k].attrs.sizes[j];
    /* one size of a reshape may be "the rest" (torch's -1): exact whatever
     * product of sizes it is, given the others; the only size that changed
     * is, and otherwise one that no single size explains */
    int prev_rest = -1; /* the previous entry's rest size of this node stays the rest */
    for (int i = 0; prev_dyn && i < prev_dyn->nsizes; i++)
        if (prev_dyn->sizes[i].rest && prev_dyn->sizes[i].node == k) prev_rest = prev_dyn->sizes[i].j;
    bool rest = prev_rest >= 0;
    for (int j = 0; j < a->attrs.ndim; j++) {
        if (a->attrs.sizes[j] == prev->nodes[k].attrs.sizes[j]) continue;
        if (dyn->nsizes == JIT_MAX_SYM_SIZES) return false;
        jit_sym_size *z = &dyn->sizes[dyn->nsizes++];
        if (j == prev_rest) {
            *z = (jit_sym_size){.node = k, .j = j, .rest = true};
            continue;
        }
        if (a->op == EM_OP_EXPAND || ndiff > 1 || rest) {
            if (fit_size(g, prev, gs, k, j, z)) continue;
            if (rest || a->op != EM_OP_RESHAPE) return false;
        }
        *z = (jit_sym_size){.node = k, .j = j, .rest = true};
        rest = true;
    }
    return true;
}

/* The first node where g and prev (the same function traced at other
 * sizes) differ in more than their metas and the attribute sizes
 * sizes_follow accepts; -1: none; nnodes: the lists of inputs, constants
 * or outputs differ. */
static int first_difference(const tr_graph *g, const tr_graph *prev, const jit_dyn *prev_dyn,
                            const gd_guards *gs, jit_dyn *dyn) {
    if (g->nnodes != prev->nnodes || g->ninputs != prev->ninputs || g->nconsts != prev->nconsts ||
        g->noutputs != prev->noutputs ||
        !em_same_bytes(g->outputs, prev->outputs, sizeof(int) * (size_t)g->noutputs) ||
        !em_same_bytes(g->consts, prev->consts, sizeof *g->consts * (size_t)g->nconsts))
        return g->nnodes;
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *a = &g->nodes[i], *b = &prev->nodes[i];
        if (a->kind != b->kind || a->meta.dtype != b->meta.dtype || a->meta.ndim != b->meta.ndim)
            return i;
        if (a->kind != TR_CALL ? a->index != b->index
                               : !tr_same_call(a, b) && !sizes_follow(g, prev, prev_dyn, gs, i, dyn))
            return i;
    }
    return -1;
}

/* Sets reshape node k's "rest" size from its input's element count. */
static em_status set_rest(tr_node *n, int j, const em_meta *in, int k) {
    int64_t other = 1;
    for (int d = 0; d < n->attrs.ndim; d++)
        if (d != j) other *= n->attrs.sizes[d];
    int64_t numel = em_shape_numel(in->ndim, in->sizes);
    if (other <= 0 || numel % other)
        return em_error(EM_ERR_SHAPE, "node %%%d (reshape): %lld elements do not fill the sizes",
                        k, (long long)numel);
    n->attrs.sizes[j] = numel / other;
    return EM_OK;
}

em_status jit_dyn_infer(const jit_dyn *dyn, tr_graph *g, const em_meta *inputs, em_meta *metas) {
    for (int i = 0; i < dyn->nsizes; i++) {
        const jit_sym_size *z = &dyn->sizes[i];
        if (!z->rest)
            g->nodes[z->node].attrs.sizes[z->j] = z->a * inputs[z->input].sizes[z->dim] + z->b;
    }
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
                s = set_rest(n, dyn->sizes[k].j, &metas[n->in[0]], i);
        if (s == EM_OK) s = tr_infer_node(g, i, metas);
        if (s != EM_OK) return s;
    }
    return EM_OK;
}

bool jit_dyn_probe(const gd_guards *gs, em_tensor *const *in, int ninputs, em_meta *probe) {
    dyn_syms s = {0};
    for (int i = 0; i < ninputs; i++)
        if (!probe_input(&gs->tensors[i], in[i], &s, &probe[i])) return false;
    return true;
}

/* Infers g's metas at the probe sizes (attribute sizes moved along). */
static bool infer_probe(const tr_graph *g, const jit_dyn *dyn, em_meta *metas, char *why,
                        size_t nwhy) {
    tr_graph gp = *g;
    gp.nodes = em_malloc(sizeof *gp.nodes * ((size_t)g->nnodes + 1));
    if (!gp.nodes) {
        snprintf(why, nwhy, "out of memory");
        return false;
    }
    memcpy(gp.nodes, g->nodes, sizeof *gp.nodes * (size_t)g->nnodes);
    bool ok = jit_dyn_infer(dyn, &gp, dyn->probe, metas) == EM_OK;
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
            have = dyn->sizes[k].node == z->node && dyn->sizes[k].j == z->j;
        if (have) continue;
        if (dyn->nsizes == JIT_MAX_SYM_SIZES ||
            (!z->rest &&
             g->nodes[z->node].attrs.sizes[z->j] != z->a * in[z->input]->sizes[z->dim] + z->b))
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
    for (int i = 0; i < g->ninputs; i++) {
        if (!probe_input(&gs->tensors[i], in[i], &s, &dyn->probe[i])) {
            snprintf(why, nwhy, "more than %d distinct dynamic sizes", NPROBES);
            return false;
        }
    }
    int d = prev ? first_difference(g, prev, prev_dyn, gs, dyn) : -1;
    if (d >= 0) {
        if (d == g->nnodes) snprintf(why, nwhy, "the graph traced at the other sizes differs");
        else
            snprintf(why, nwhy, "node %%%d (%s) differs from the trace at the other sizes",
                     d, g->nodes[d].kind == TR_CALL ? em_op_table[g->nodes[d].op].name : "input");
        return false;
    }
    if (!inherit(g, prev_dyn, in, dyn)) {
        snprintf(why, nwhy, "a reshape or expand size no longer follows the sizes");
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
