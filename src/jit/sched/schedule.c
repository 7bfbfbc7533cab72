/* schedule.c - fusion: which nodes of a graph run in which kernel.
 *
 * Every kernel is rows x columns: an outer (parallel) loop over the kept
 * dims O of an iteration space F, and inner loops over its trailing k dims
 * (the reduced dims, or for pointwise-only kernels the last dim).  A
 * kernel computes, in order: each of its reductions (one pass over the
 * row each, two for var), then the row values it must store, then, in one
 * more pass, the full-size values it must store.  Values not stored are
 * recomputed wherever they are used (pointwise ops are cheaper to redo
 * than to write and read back), so only graph outputs, inputs of
 * non-fused ops, and reductions used by later kernels go to memory.
 *
 * Ops that are not fused (matmul, cat, index_select, argmax, random, views,
 * reductions over leading dims) run eagerly between kernels; a kernel
 * closes before an eager op that reads one of its values. */
#include "schedule.h"

#include <string.h>

static bool dtype_ok(em_dtype d) {
    return d == EM_F32 || d == EM_F64 || d == EM_I32 || d == EM_I64 || d == EM_BOOL;
}

static bool same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
    return na == nb && !memcmp(a, b, sizeof(int64_t) * (size_t)na);
}

/* Numpy broadcasting of shape s to shape f (trailing alignment). */
static bool broadcasts_to(int ns, const int64_t *s, int nf, const int64_t *f) {
    if (ns > nf) return false;
    for (int i = 0; i < ns; i++) {
        int64_t a = s[ns - 1 - i], b = f[nf - 1 - i];
        if (a != 1 && a != b) return false;
    }
    return true;
}

/* Whether reduction node n reduces exactly the trailing k dims of its input. */
static int trailing_reduce(const tr_graph *g, const tr_node *n) {
    const em_meta *in = &g->nodes[n->in[0]].meta;
    int k = n->attrs.ndims;
    if (k < 1) return 0;
    for (int i = 0; i < k; i++)
        if (n->attrs.dims[i] != in->ndim - k + i) return 0;
    return k;
}

bool sc_is_reduction(const tr_node *n) {
    return n->kind == TR_CALL && (n->op == EM_OP_SUM || n->op == EM_OP_MEAN ||
                                  n->op == EM_OP_AMAX || n->op == EM_OP_AMIN || n->op == EM_OP_VAR);
}

/* Nodes a kernel can compute. */
/* Reductions to fewer than SC_MIN_ROWS rows of an input of at least
 * SC_SMALL_REDUCE elements run eagerly (see fusible). */
#define SC_MIN_ROWS 64
#define SC_SMALL_REDUCE 65536

static bool fusible(const tr_graph *g, const tr_node *n) {
    if (n->kind != TR_CALL || !dtype_ok(n->meta.dtype)) return false;
    for (int i = 0; i < n->nin; i++)
        if (!dtype_ok(g->nodes[n->in[i]].meta.dtype)) return false;
    switch (em_op_table[n->op].kind) {
    case EM_KIND_UNARY:
    case EM_KIND_BINARY:
    case EM_KIND_TERNARY:
    case EM_KIND_COPY: return true;
    case EM_KIND_CREATE: return n->op == EM_OP_FULL;
    case EM_KIND_REDUCE:
        /* a kernel's rows are its parallel loop: a reduction to fewer rows
         * than that on a large input (a whole-tensor sum) would run on one
         * thread, where the eager reduction splits its input over all */
        return sc_is_reduction(n) && trailing_reduce(g, n) > 0 &&
               g->nodes[n->in[0]].meta.ndim <= EM_MAX_DIMS &&
               (em_shape_numel(n->meta.ndim, n->meta.sizes) >= SC_MIN_ROWS ||
                em_shape_numel(g->nodes[n->in[0]].meta.ndim, g->nodes[n->in[0]].meta.sizes) <
                    SC_SMALL_REDUCE);
    default: return false;
    }
}

static void group_init(sc_group *gr, const tr_graph *g, const tr_node *n) {
    memset(gr, 0, sizeof *gr);
    gr->k = -1;
    if (sc_is_reduction(n)) {
        const em_meta *in = &g->nodes[n->in[0]].meta;
        gr->ndim = in->ndim;
        memcpy(gr->sizes, in->sizes, sizeof(int64_t) * (size_t)in->ndim);
        gr->k = trailing_reduce(g, n);
    } else {
        gr->ndim = n->meta.ndim;
        memcpy(gr->sizes, n->meta.sizes, sizeof(int64_t) * (size_t)n->meta.ndim);
    }
}

/* The keepdim-shaped row of the group: F with its trailing k dims 1. */
static bool is_row_shape(const sc_group *gr, const em_meta *m) {
    if (gr->k <= 0 || m->ndim != gr->ndim) return false;
    for (int d = 0; d < gr->ndim; d++)
        if (m->sizes[d] != (d < gr->ndim - gr->k ? gr->sizes[d] : 1)) return false;
    return true;
}

/* Whether node i can join group gr. */
static bool compatible(const sc_schedule *s, const sc_group *gr, int i) {
    const tr_graph *g = s->g;
    const tr_node *n = &g->nodes[i];
    /* a value of a reduction without keepdim has the row's shape without
     * its unit dims: it cannot broadcast against F inside the kernel */
    for (int k = 0; k < n->nin; k++) {
        int u = n->in[k];
        if (s->group[u] == s->ngroups && sc_is_reduction(&g->nodes[u]) &&
            !g->nodes[u].attrs.keepdim)
            return false;
    }
    if (sc_is_reduction(n)) {
        const em_meta *in = &g->nodes[n->in[0]].meta;
        int k = trailing_reduce(g, n);
        if (!same_shape(in->ndim, in->sizes, gr->ndim, gr->sizes)) return false;
        return gr->k < 0 || gr->k == k;
    }
    if (same_shape(n->meta.ndim, n->meta.sizes, gr->ndim, gr->sizes)) return true;
    if (is_row_shape(gr, &n->meta)) return true;
    /* a smaller broadcast value is fine as long as it is never stored */
    return !s->materialized[i] && broadcasts_to(n->meta.ndim, n->meta.sizes, gr->ndim, gr->sizes);
}

/* Reductions of earlier kernels that node i's value needs are read from
 * memory: mark them stored.  Pointwise values of earlier kernels are
 * recomputed, so look through them. */
static void need_earlier(sc_schedule *s, int i, int group, bool *seen) {
    const tr_node *n = &s->g->nodes[i];
    for (int k = 0; k < n->nin; k++) {
        int u = n->in[k];
        if (seen[u] || !s->fusible[u] || s->group[u] == group) continue;
        seen[u] = true;
        if (sc_is_reduction(&s->g->nodes[u]) || s->materialized[u]) s->materialized[u] = true;
        else need_earlier(s, u, group, seen);
    }
}

static em_status add_step(sc_schedule *s, sc_step st) {
    if (s->nsteps == s->capsteps) {
        int cap = s->capsteps ? 2 * s->capsteps : 16;
        sc_step *p = em_malloc(sizeof *p * (size_t)cap);
        if (!p) return em_last_status();
        if (s->steps) memcpy(p, s->steps, sizeof *p * (size_t)s->nsteps);
        em_free(s->steps);
        s->steps = p;
        s->capsteps = cap;
    }
    s->steps[s->nsteps++] = st;
    return EM_OK;
}

/* Whether a later kernel may read something group gi computes: a stored
 * value, or a reduction (stored when a later group needs it).  A group of
 * only pointwise values that later groups recompute has nothing to do. */
static bool group_live(const sc_schedule *s, int gi) {
    for (int i = 0; i < s->g->nnodes; i++)
        if (s->group[i] == gi && (s->materialized[i] || sc_is_reduction(&s->g->nodes[i])))
            return true;
    return false;
}

/* Closes the open group.  A dead group keeps its number (its nodes refer
 * to it) but gets no step: the backend neither compiles nor runs it. */
static em_status close_group(sc_schedule *s, bool *open) {
    if (!*open) return EM_OK;
    *open = false;
    int gi = s->ngroups++;
    return group_live(s, gi) ? add_step(s, (sc_step){.kind = SC_KERNEL, .group = gi}) : EM_OK;
}

sc_schedule *sc_build(const tr_graph *g) {
    sc_schedule *s = em_calloc(1, sizeof *s);
    if (!s) return NULL;
    int n = g->nnodes;
    s->g = g;
    s->fusible = em_calloc((size_t)n + 1, sizeof(bool));
    s->materialized = em_calloc((size_t)n + 1, sizeof(bool));
    s->group = em_malloc(sizeof(int) * ((size_t)n + 1));
    s->groups = em_calloc((size_t)n + 1, sizeof(sc_group));
    bool *seen = em_calloc((size_t)n + 1, sizeof(bool));
    if (!s->fusible || !s->materialized || !s->group || !s->groups || !seen) goto fail;
    for (int i = 0; i < n; i++) {
        s->group[i] = -1;
        s->fusible[i] = fusible(g, &g->nodes[i]);
    }
    /* what must be in memory: outputs, and inputs of ops that are not fused */
    for (int i = 0; i < g->noutputs; i++) s->materialized[g->outputs[i]] = true;
    for (int i = 0; i < n; i++)
        if (!s->fusible[i])
            for (int k = 0; k < g->nodes[i].nin; k++) s->materialized[g->nodes[i].in[k]] = true;
    bool open = false;
    for (int i = 0; i < n; i++) {
        const tr_node *nd = &g->nodes[i];
        if (nd->kind != TR_CALL) continue;
        sc_group *gr = &s->groups[s->ngroups];
        if (!s->fusible[i]) {
            for (int k = 0; open && k < nd->nin; k++)
                if (s->group[nd->in[k]] == s->ngroups && close_group(s, &open) != EM_OK) goto fail;
            if (add_step(s, (sc_step){.kind = SC_EAGER, .node = i}) != EM_OK) goto fail;
            continue;
        }
        if (open && !compatible(s, gr, i) && close_group(s, &open) != EM_OK) goto fail;
        gr = &s->groups[s->ngroups];
        if (!open) {
            group_init(gr, g, nd);
            open = true;
        }
        if (sc_is_reduction(nd) && gr->k < 0) gr->k = trailing_reduce(g, nd);
        s->group[i] = s->ngroups;
        memset(seen, 0, sizeof(bool) * (size_t)n);
        need_earlier(s, i, s->ngroups, seen);
    }
    if (close_group(s, &open) != EM_OK) goto fail;
    em_free(seen);
    return s;
fail:
    em_free(seen);
    sc_free(s);
    return NULL;
}

void sc_free(sc_schedule *s) {
    if (!s) return;
    em_free(s->fusible);
    em_free(s->materialized);
    em_free(s->group);
    em_free(s->groups);
    em_free(s->steps);
    em_free(s);
}
