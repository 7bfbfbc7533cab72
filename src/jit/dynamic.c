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
#include "jit.h"

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

/* The first node where g and prev (the same function traced at other
 * sizes) differ in more than their metas; -1: none; nnodes: the lists of
 * inputs, constants or outputs differ. */
static int first_difference(const tr_graph *g, const tr_graph *prev) {
    if (g->nnodes != prev->nnodes || g->ninputs != prev->ninputs || g->nconsts != prev->nconsts ||
        g->noutputs != prev->noutputs ||
        memcmp(g->outputs, prev->outputs, sizeof(int) * (size_t)g->noutputs) ||
        memcmp(g->consts, prev->consts, sizeof *g->consts * (size_t)g->nconsts))
        return g->nnodes;
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *a = &g->nodes[i], *b = &prev->nodes[i];
        if (a->kind != b->kind || a->meta.dtype != b->meta.dtype || a->meta.ndim != b->meta.ndim)
            return i;
        if (a->kind == TR_CALL ? !tr_same_call(a, b) : a->index != b->index) return i;
    }
    return -1;
}

bool jit_dyn_probe(const gd_guards *gs, em_tensor *const *in, int ninputs, em_meta *probe) {
    dyn_syms s = {0};
    for (int i = 0; i < ninputs; i++)
        if (!probe_input(&gs->tensors[i], in[i], &s, &probe[i])) return false;
    return true;
}

bool jit_dyn_check(const tr_graph *g, const tr_graph *prev, const gd_guards *gs,
                   em_tensor *const *in, em_meta *probe, char *why, size_t nwhy) {
    dyn_syms s = {0};
    for (int i = 0; i < g->ninputs; i++) {
        if (!probe_input(&gs->tensors[i], in[i], &s, &probe[i])) {
            snprintf(why, nwhy, "more than %d distinct dynamic sizes", NPROBES);
            return false;
        }
    }
    em_meta *metas = em_malloc(sizeof *metas * ((size_t)g->nnodes + 1));
    bool *varies = em_calloc((size_t)g->nnodes + 1, sizeof(bool));
    bool ok = metas && varies;
    if (!ok) snprintf(why, nwhy, "out of memory");
    if (ok && tr_infer_metas(g, probe, metas) != EM_OK) {
        snprintf(why, nwhy, "the graph's shapes do not follow other sizes (%s)", em_last_error());
        em_clear_error();
        ok = false;
    }
    int d = ok && prev ? first_difference(g, prev) : -1;
    if (d >= 0) {
        if (d == g->nnodes) snprintf(why, nwhy, "the graph traced at the other sizes differs");
        else
            snprintf(why, nwhy, "node %%%d (%s) differs from the trace at the other sizes",
                     d, g->nodes[d].kind == TR_CALL ? em_op_table[g->nodes[d].op].name : "input");
        ok = false;
    }
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
