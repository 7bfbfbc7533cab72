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
 * non-fused ops, reductions used by later kernels, and values the cost
 * model below stores go to memory.
 *
 * Recomputation has a price: a pass that recomputes a long chain, or a
 * kernel that recomputes what an earlier kernel computed, repeats the
 * chain's ops and its code.  The cost model (below) stores a value once
 * redoing it costs more than writing and reading it back, and a bound on
 * each kernel's size (SC_MAX_KERNEL_WEIGHT) splits larger groups where the
 * fewest bytes cross the cut: kernel code then grows linearly with the
 * graph, and each kernel's compile time stays about constant.
 *
 * Ops that are not fused (matmul, cat, index_select, argmax, random,
 * reductions over leading dims, views of what no kernel computes) run
 * eagerly between kernels; views of fused values are looked through
 * (choose_views), and reductions without keepdim stay row values of their
 * kernel (lead values: compatible); a kernel
 * closes before an eager op that reads one of its values, and before any
 * in-place write (index_copy_), which is a fence (store_across_updates).
 *
 * Everything here is linear in the graph's size but for the walks of
 * cones, each bounded by a group's size (itself bounded) or by a cost
 * budget. */
#include "schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cost model's constants ---- */

/* One more recomputation of a value costs its cone's ALU ops (kir_alu.def's
 * cost column: vector-lane operations) per element; storing the value
 * once and loading it back costs 2 * its element size in bytes.  The
 * 2-core CPU machine does ~2 cores x 16 lanes x ~2 ops per cycle at ~3 GHz
 * (~200 G lane-ops/s) against ~32 GB/s of memory bandwidth (TOOLCHAIN.md's
 * triad): ~6 ops per byte; 4 keeps a margin for cache misses of the
 * recomputed inputs.  An f32 value is stored once recomputing it costs
 * more than 32 ops: what Inductor's realize_opcount_threshold (30) does. */
#define SC_OPS_PER_BYTE 4

/* The most a kernel may hold: SC_MAX_KERNEL_WEIGHT units of node_weight
 * (each member, and each node a pass or a look-through recomputes).
 * Measured on the 2-core machine (libgccjit 12, -O3, one kernel per
 * compile worker; docs/benchmarks.md, issue 22): a chain of plain ops
 * costs ~1.5 ms of compile per node (0.36 s at 256 nodes, 1.6 s at 1,024,
 * 3.6 s at 2,048: slightly worse than linear, and the worker's memory
 * grows ~65 KB a node), a transcendental 20 ms (among other ops) to 50 ms
 * (chained): SC_INLINED_WEIGHT 24 units.  384 units keep any kernel's
 * compile near 0.5 s, ~15x the fixed cost of a compile (splitting further
 * would mostly add fixed costs and memory traffic), at most 16
 * transcendentals, far from gcc's inlining limit (~36), and let a large
 * graph's kernels compile in parallel workers.  EMBER_KERNEL_MAX_WEIGHT
 * overrides it (the tests split small graphs with it). */
#define SC_MAX_KERNEL_WEIGHT 384
#define SC_INLINED_WEIGHT 24

/* A cut is looked for among the positions where the group held at least
 * this fraction of the bound: smaller kernels would waste compiles. */
#define SC_CUT_WINDOW_DIV 2

/* ---- helpers on shapes and nodes ---- */

static bool dtype_ok(em_dtype d, bool half) {
    return d == EM_F32 || d == EM_F64 || d == EM_I32 || d == EM_I64 || d == EM_BOOL ||
           (half && (d == EM_F16 || d == EM_BF16));
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

bool sc_is_view(const tr_node *n) {
    return n->kind == TR_CALL && em_op_table[n->op].kind == EM_KIND_VIEW;
}

bool sc_view_unit_map(const tr_graph *g, int v, int *map) {
    const tr_node *n = &g->nodes[v];
    if (!sc_is_view(n) || (n->op != EM_OP_RESHAPE && n->op != EM_OP_SQUEEZE && n->op != EM_OP_UNSQUEEZE))
        return false;
    const em_meta *in = &g->nodes[n->in[0]].meta, *m = &n->meta;
    int du = 0;
    for (int d = 0; d < m->ndim; d++) {
        map[d] = -1;
        if (m->sizes[d] == 1) continue;
        while (du < in->ndim && in->sizes[du] == 1) du++;
        if (du == in->ndim || in->sizes[du] != m->sizes[d]) return false;
        map[d] = du++;
    }
    while (du < in->ndim && in->sizes[du] == 1) du++;
    return du == in->ndim;
}

/* Nodes a kernel can compute. */
/* Reductions to fewer than SC_MIN_ROWS rows of an input of at least
 * SC_SMALL_REDUCE elements run eagerly (see fusible). */
#define SC_MIN_ROWS 64
#define SC_SMALL_REDUCE 65536

static bool fusible(const tr_graph *g, const tr_node *n, bool half) {
    if (n->kind != TR_CALL || !dtype_ok(n->meta.dtype, half)) return false;
    for (int i = 0; i < n->nin; i++)
        if (!dtype_ok(g->nodes[n->in[i]].meta.dtype, half)) return false;
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

/* The ALU cost of computing node n once per element (kir_alu.def). */
static int node_ops(const tr_node *n) {
    if (n->op == EM_OP_FULL || n->op == EM_OP_CONTIGUOUS || sc_is_view(n)) return 0;
    if (n->op == EM_OP_CAST) return 1;
    k_alu a = kir_alu_of_op(n->op);
    return a == KA_NONE ? 1 : kir_alu_info(a)->cost;
}

/* What node n adds to a kernel's size (the bound's unit, about 1.5 ms of
 * libgccjit time): 1, or SC_INLINED_WEIGHT for a transcendental (ALU cost
 * 10), whose vectorizable approximation (vmath.h) is inlined at every
 * use: measured, 20-50 ms of compile each, and about 36 in one function
 * exceed gcc's inlining limits (large-function-growth): such a kernel
 * fails to compile and its graph runs op by op. */
static int node_weight(const tr_node *n) {
    return node_ops(n) >= 10 ? SC_INLINED_WEIGHT : 1;
}

static double numel_of(const tr_node *n) { return (double)em_shape_numel(n->meta.ndim, n->meta.sizes); }

/* Bytes of v's value in memory (0 on overflow: an empty or absurd value). */
static int64_t value_bytes(const tr_node *n) {
    int64_t e = em_shape_numel(n->meta.ndim, n->meta.sizes);
    return e < 0 ? 0 : e * (int64_t)em_dtype_size(n->meta.dtype);
}

/* What storing and reloading one element of v costs, in ALU ops. */
static int64_t traffic_ops(const tr_node *n) {
    return SC_OPS_PER_BYTE * 2 * (int64_t)em_dtype_size(n->meta.dtype);
}

/* ---- groups ---- */

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

/* Whether node v (of a group) can be stored by its kernel: values of the
 * full or the row shape; a smaller broadcast value cannot. */
static bool storable(const sc_schedule *s, int v) {
    const sc_group *gr = &s->groups[s->group[v]];
    const em_meta *m = &s->g->nodes[v].meta;
    return same_shape(m->ndim, m->sizes, gr->ndim, gr->sizes) || is_row_shape(gr, m) ||
           sc_is_reduction(&s->g->nodes[v]) || s->lead[v];
}

/* Whether m has the sizes of the group's kept dims (a lead value's). */
static bool is_outer_shape(const sc_group *gr, const em_meta *m) {
    return gr->k > 0 && m->ndim == gr->ndim - gr->k && same_shape(m->ndim, m->sizes, m->ndim, gr->sizes);
}

/* The dim of F each dim of node v lies along (-1: a unit dim, index 0):
 * F's leading dims for a lead value, else numpy's trailing alignment. */
static void placement(const sc_schedule *s, const sc_group *gr, int v, bool lead, int *at) {
    const em_meta *m = &s->g->nodes[v].meta;
    int shift = lead ? 0 : gr->ndim - m->ndim;
    for (int d = 0; d < m->ndim; d++) at[d] = m->sizes[d] == 1 || d + shift < 0 ? -1 : d + shift;
}

/* Whether a value of node i's shape fits the group as a pointwise value:
 * of the full or the row shape, or a smaller broadcast one never stored. */
static bool fits(const sc_schedule *s, const sc_group *gr, int i) {
    const em_meta *m = &s->g->nodes[i].meta;
    if (same_shape(m->ndim, m->sizes, gr->ndim, gr->sizes) || is_row_shape(gr, m)) return true;
    return !s->materialized[i] && broadcasts_to(m->ndim, m->sizes, gr->ndim, gr->sizes);
}

/* View i of a value of the open group: it joins only when it lays that
 * value's elements where they already are (a unit dim added or dropped:
 * mean(x, -1) without keepdim, unsqueezed), as a lead value when its dims
 * are F's leading ones.  Any other view of the group's values starts a
 * kernel of its own, which recomputes them at the positions it reads. */
static bool view_fits(const sc_schedule *s, const sc_group *gr, int i, bool *lead) {
    const tr_node *n = &s->g->nodes[i];
    int map[EM_MAX_DIMS], at_in[EM_MAX_DIMS], at[EM_MAX_DIMS], want[EM_MAX_DIMS];
    if (!sc_view_unit_map(s->g, i, map)) return false;
    placement(s, gr, n->in[0], s->lead[n->in[0]], at_in);
    for (int d = 0; d < n->meta.ndim; d++) at[d] = map[d] < 0 ? -1 : at_in[map[d]];
    size_t bytes = sizeof(int) * (size_t)n->meta.ndim;
    placement(s, gr, i, false, want);
    if (!memcmp(at, want, bytes)) return fits(s, gr, i);
    placement(s, gr, i, true, want);
    *lead = is_outer_shape(gr, &n->meta) && !memcmp(at, want, bytes);
    return *lead;
}

/* Whether node i can join group gr; *lead: as a lead value.  A value
 * computed from lead values alone is one (mean(x, -1) + var(x, -1), both
 * without keepdim, is a row value of their kernel); one that mixes them
 * with values of the group laid along F cannot broadcast inside it. */
static bool compatible(const sc_schedule *s, const sc_group *gr, int i, bool *lead) {
    const tr_graph *g = s->g;
    const tr_node *n = &g->nodes[i];
    bool lead_in = false, placed_in = false;
    *lead = false;
    for (int k = 0; k < n->nin; k++) {
        int u = n->in[k];
        /* a value of one element laid along F (an epsilon) sits anywhere */
        if (s->group[u] != s->ngroups || (!s->lead[u] && numel_of(&g->nodes[u]) == 1)) continue;
        lead_in |= s->lead[u];
        placed_in |= !s->lead[u];
    }
    if (sc_is_view(n) && (lead_in || placed_in)) return view_fits(s, gr, i, lead);
    if (sc_is_reduction(n)) {
        const em_meta *in = &g->nodes[n->in[0]].meta;
        int k = trailing_reduce(g, n);
        if (lead_in || !same_shape(in->ndim, in->sizes, gr->ndim, gr->sizes)) return false;
        *lead = !n->attrs.keepdim;
        return gr->k < 0 || gr->k == k;
    }
    if (lead_in) {
        *lead = !placed_in && is_outer_shape(gr, &n->meta);
        return *lead;
    }
    return fits(s, gr, i);
}

/* ---- the builder's state (one per sc_build call) ---- */

typedef struct builder {
    sc_schedule *s;
    int n;
    bool open;          /* group s->ngroups is open */
    int start;          /* the open group's first member */
    /* cone walks: a node is visited once per walk (walk_mark[v] == walk) */
    int *walk_mark, walk, *stack;
    /* need_earlier: a node is looked at once per group (seen_by[v] == group + 1) */
    int *seen_by;
    int *passed;        /* per node: group + 1 of the last group one of whose
                           reduction passes computes it */
    int *recomputes;    /* per node: how many later groups recompute it */
    /* the bound */
    int64_t est;        /* the open group's size (node_weight units) */
    int64_t max_weight;
    int *lastuse;       /* per node: its last reader (n: a graph output) */
    int *bucket, *next; /* nodes by last reader: bucket[i] -> next[] -> -1 */
    int64_t live;       /* bytes of the open group's values read at or after i */
    int cut, *steps_at; /* the best cut so far (-1: none); steps before node i */
    int64_t cut_live;
} builder;

/* Whether a pass of group gi computes node w again (rather than loading
 * it or reading a row value): pointwise values of gi, and those of
 * earlier groups that are not stored. */
static bool recomputed(const sc_schedule *s, int w, int gi) {
    const tr_node *n = &s->g->nodes[w];
    if (n->kind != TR_CALL || !s->fusible[w] || sc_is_reduction(n) || s->group[w] < 0) return false;
    return s->group[w] == gi || !s->materialized[w];
}

typedef struct cone {
    int64_t ops;        /* ALU ops of the cone, per element */
    int64_t passed_ops; /* of which already computed by a pass of the group */
    int64_t weight;     /* its size for the bound (node_weight) */
} cone;

/* Walks the cone of v that a pass of group gi computes, each node once:
 * with mark, marks every node as computed by a pass of gi; a walk stops
 * once ops passes stop (stop < 0: never). */
static cone cone_walk(builder *b, int v, int gi, int64_t stop, bool mark) {
    const sc_schedule *s = b->s;
    cone c = {0, 0, 0};
    if (!recomputed(s, v, gi)) return c;
    int top = 0;
    b->walk++;
    b->walk_mark[v] = b->walk;
    b->stack[top++] = v;
    while (top > 0 && (stop < 0 || c.ops <= stop)) {
        int w = b->stack[--top];
        const tr_node *n = &s->g->nodes[w];
        c.ops += node_ops(n);
        c.weight += node_weight(n);
        if (b->passed[w] == gi + 1) c.passed_ops += node_ops(n);
        if (mark) b->passed[w] = gi + 1;
        for (int k = 0; k < n->nin; k++) {
            int u = n->in[k];
            if (b->walk_mark[u] == b->walk || !recomputed(s, u, gi)) continue;
            b->walk_mark[u] = b->walk;
            b->stack[top++] = u;
        }
    }
    return c;
}

/* Whether recomputing v `times` more times in group gi costs more than
 * storing it once and loading it back, where each recomputation computes
 * a fraction `part` of v's elements (a view's reader: a slice of 1,000 of
 * a row's 50,257 recomputes 2% of v; a broadcast may recompute more than
 * all of it). */
static bool worth_storing(builder *b, int v, int gi, int times, double part) {
    if (times < 1 || !storable(b->s, v)) return false;
    double budget = (double)traffic_ops(&b->s->g->nodes[v]), per = times * part;
    int64_t stop = per > 0 ? (int64_t)(budget / per) : -1;
    return (double)cone_walk(b, v, gi, stop, false).ops * per > budget;
}

/* The fraction of node u's elements that its reader n reads: less than 1
 * for a view that narrows it (slice), more for one that broadcasts it. */
static double part_read(const tr_node *n, const tr_node *u) {
    if (!sc_is_view(n)) return 1;
    int64_t all = em_shape_numel(u->meta.ndim, u->meta.sizes), read = em_shape_numel(n->meta.ndim, n->meta.sizes);
    return all > 0 && read >= 0 ? (double)read / (double)all : 1;
}

/* Reductions of earlier kernels that node i's value needs are read from
 * memory: mark them stored.  Pointwise values of earlier kernels are
 * recomputed, unless the cost model stores them; look through the others.
 * Returns the weight of what is recomputed (for the bound). */
static int need_earlier(builder *b, int i, int gi) {
    sc_schedule *s = b->s;
    const tr_node *n = &s->g->nodes[i];
    int looked = 0;
    for (int k = 0; k < n->nin; k++) {
        int u = n->in[k];
        /* a view reads u at positions of its own: each view is one more
         * recomputation of (part of) u */
        if ((b->seen_by[u] == gi + 1 && !sc_is_view(n)) || !s->fusible[u] || s->group[u] == gi) continue;
        b->seen_by[u] = gi + 1;
        if (sc_is_reduction(&s->g->nodes[u]) || s->materialized[u]) {
            s->materialized[u] = true;
            continue;
        }
        b->recomputes[u]++;
        if (worth_storing(b, u, gi, b->recomputes[u], part_read(n, &s->g->nodes[u]))) {
            s->materialized[u] = true;
            continue;
        }
        looked += node_weight(&s->g->nodes[u]) + need_earlier(b, u, gi);
    }
    return looked;
}

/* Whether node i, joining the open group gi, would recompute more than is
 * worth: a reduction whose pass redoes what an earlier pass computed, or a
 * value read again after the pass that computed it (in the final pass). */
static bool recompute_too_costly(builder *b, int i, int gi) {
    const sc_schedule *s = b->s;
    const tr_node *n = &s->g->nodes[i];
    if (sc_is_reduction(n)) {
        int u = n->in[0];
        if (!recomputed(s, u, gi) || !storable(s, u)) return false;
        cone c = cone_walk(b, u, gi, -1, false);
        return c.passed_ops > traffic_ops(&s->g->nodes[u]);
    }
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        if (b->passed[v] == gi + 1 && storable(s, v) && worth_storing(b, v, gi, 1, 1)) return true;
    }
    return false;
}

/* ---- steps ---- */

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

/* Closes the open group and adds its step.  Whether a later kernel reads
 * anything it computes is known only at the end (the cost model may store
 * a value of it for a later group): drop_dead_steps then removes the steps
 * of groups with nothing to do. */
static em_status close_group(builder *b) {
    if (!b->open) return EM_OK;
    b->open = false;
    int gi = b->s->ngroups++;
    return add_step(b->s, (sc_step){.kind = SC_KERNEL, .group = gi});
}

/* A group is live when a later kernel may read something it computes: a
 * stored value, or a reduction (stored when a later group needs it).  A
 * dead group keeps its number (its nodes refer to it) but gets no step:
 * the backend neither compiles nor runs it. */
static em_status drop_dead_steps(sc_schedule *s) {
    bool *live = em_calloc((size_t)s->ngroups + 1, sizeof(bool));
    if (!live) return em_last_status();
    for (int i = 0; i < s->g->nnodes; i++)
        if (s->group[i] >= 0 && (s->materialized[i] || sc_is_reduction(&s->g->nodes[i])))
            live[s->group[i]] = true;
    int m = 0;
    for (int i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind != SC_KERNEL || live[s->steps[i].group]) s->steps[m++] = s->steps[i];
    s->nsteps = m;
    em_free(live);
    return EM_OK;
}

/* ---- the bound: cutting a group that grew too large ---- */

/* Each node's last reader, and the nodes listed by it (bucket, next). */
static void last_uses(builder *b) {
    const tr_graph *g = b->s->g;
    for (int i = 0; i < b->n; i++) {
        b->lastuse[i] = i;
        b->bucket[i] = -1;
    }
    for (int i = 0; i < b->n; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) b->lastuse[g->nodes[i].in[k]] = i;
    for (int i = 0; i < g->noutputs; i++) b->lastuse[g->outputs[i]] = b->n;
    for (int v = 0; v < b->n; v++) {
        b->next[v] = -1;
        if (b->lastuse[v] < b->n) {
            b->next[v] = b->bucket[b->lastuse[v]];
            b->bucket[b->lastuse[v]] = v;
        }
    }
}

/* Node i is a place to cut the open group before: once the group holds
 * half the bound, the one with the fewest live bytes (the open group's
 * values read by i or later: what a cut there stores and reloads) is
 * kept, the latest of equals.  Only a node that iterates over the whole
 * space F can begin the next group: one of a row's or a broadcast shape
 * would give it a smaller space, which the values after it do not fit. */
static void consider_cut(builder *b, int i) {
    const sc_group *gr = &b->s->groups[b->s->ngroups];
    const tr_node *n = &b->s->g->nodes[i];
    const em_meta *m = sc_is_reduction(n) ? &b->s->g->nodes[n->in[0]].meta : &n->meta;
    if (i == b->start || b->est * SC_CUT_WINDOW_DIV < b->max_weight ||
        !same_shape(m->ndim, m->sizes, gr->ndim, gr->sizes))
        return;
    if (b->cut < 0 || b->live <= b->cut_live) {
        b->cut = i;
        b->cut_live = b->live;
    }
}

/* Takes nodes [p, i] out of the open group and closes it (the caller goes
 * on from p, which opens the next group).  The eager steps added since p
 * go too: they are added again. */
static em_status cut_at(builder *b, int p, int i) {
    sc_schedule *s = b->s;
    int gi = s->ngroups;
    sc_group *gr = &s->groups[gi];
    for (int m = p; m <= i; m++)
        if (s->group[m] == gi) {
            s->group[m] = -1;
            s->lead[m] = false;
        }
    gr->k = -1; /* a reduction left in the group sets it again */
    for (int m = b->start; m < p && gr->k < 0; m++)
        if (s->group[m] == gi && sc_is_reduction(&s->g->nodes[m])) gr->k = trailing_reduce(s->g, &s->g->nodes[m]);
    s->nsteps = b->steps_at[p];
    return close_group(b);
}

/* ---- building ---- */

static void open_group(builder *b, int i) {
    group_init(&b->s->groups[b->s->ngroups], b->s->g, &b->s->g->nodes[i]);
    b->open = true;
    b->start = i;
    b->est = 0;
    b->live = 0;
    b->cut = -1;
}

/* Node i joins the open group; its size grows by i, what i recomputes of
 * earlier groups, and a reduction's pass. */
static void join(builder *b, int i) {
    sc_schedule *s = b->s;
    const tr_node *nd = &s->g->nodes[i];
    int gi = s->ngroups;
    sc_group *gr = &s->groups[gi];
    if (sc_is_reduction(nd) && gr->k < 0) gr->k = trailing_reduce(s->g, nd);
    s->group[i] = gi;
    b->est += node_weight(nd) + need_earlier(b, i, gi);
    if (sc_is_reduction(nd)) b->est += cone_walk(b, nd->in[0], gi, -1, true).weight;
    if (b->lastuse[i] > i) b->live += value_bytes(nd);
}

/* Fusible node i: joins the open group or opens the next.  Returns the
 * node to go on from (i + 1, or a cut before i). */
static int place(builder *b, int i, em_status *st) {
    sc_schedule *s = b->s;
    const tr_node *n = &s->g->nodes[i];
    int gi = s->ngroups;
    bool lead = false;
    if (b->open && (!compatible(s, &s->groups[gi], i, &lead) || recompute_too_costly(b, i, gi)))
        if ((*st = close_group(b)) != EM_OK) return i + 1;
    if (!b->open) {
        open_group(b, i);
        lead = sc_is_reduction(n) && !n->attrs.keepdim;
    }
    s->lead[i] = lead;
    consider_cut(b, i);
    join(b, i);
    if (b->est <= b->max_weight || b->start == i) return i + 1;
    int p = b->cut >= 0 ? b->cut : i;
    *st = cut_at(b, p, i);
    return p;
}

/* The nodes of the open group whose last reader is i are no longer live. */
static void retire(builder *b, int i) {
    if (!b->open) return;
    for (int v = b->bucket[i]; v >= 0; v = b->next[v])
        if (b->s->group[v] == b->s->ngroups) b->live -= value_bytes(&b->s->g->nodes[v]);
}

static int64_t max_weight(void) {
    char buf[32];
    if (em_getenv("EMBER_KERNEL_MAX_WEIGHT", buf, sizeof buf)) {
        long long v = atoll(buf);
        if (v > 0) return v;
    }
    return SC_MAX_KERNEL_WEIGHT;
}

static bool builder_init(builder *b, sc_schedule *s) {
    int n = s->g->nnodes;
    *b = (builder){.s = s, .n = n, .cut = -1, .max_weight = max_weight()};
    size_t m = (size_t)n + 1;
    b->walk_mark = em_calloc(m, sizeof(int));
    b->stack = em_malloc(m * sizeof(int));
    b->seen_by = em_calloc(m, sizeof(int));
    b->passed = em_calloc(m, sizeof(int));
    b->recomputes = em_calloc(m, sizeof(int));
    b->lastuse = em_malloc(m * sizeof(int));
    b->bucket = em_malloc(m * sizeof(int));
    b->next = em_malloc(m * sizeof(int));
    b->steps_at = em_malloc(m * sizeof(int));
    if (!b->walk_mark || !b->stack || !b->seen_by || !b->passed || !b->recomputes || !b->lastuse ||
        !b->bucket || !b->next || !b->steps_at)
        return false;
    last_uses(b);
    return true;
}

static void builder_free(builder *b) {
    em_free(b->walk_mark);
    em_free(b->stack);
    em_free(b->seen_by);
    em_free(b->passed);
    em_free(b->recomputes);
    em_free(b->lastuse);
    em_free(b->bucket);
    em_free(b->next);
    em_free(b->steps_at);
}

/* Node i, an op the kernels do not compute: an eager step, after closing
 * the open group when i reads one of its values. */
static em_status eager_step(builder *b, int i) {
    sc_schedule *s = b->s;
    const tr_node *nd = &s->g->nodes[i];
    /* an update is a fence: what comes before it in the graph runs before it */
    bool fence = em_op_table[nd->op].kind == EM_KIND_UPDATE;
    for (int k = 0; b->open && k < nd->nin; k++)
        if (fence || s->group[nd->in[k]] == s->ngroups) {
            em_status st = close_group(b);
            if (st != EM_OK) return st;
        }
    return add_step(s, (sc_step){.kind = SC_EAGER, .node = i});
}

/* In-place writes (EM_KIND_UPDATE, eager steps) keep the graph's order of
 * reads and writes: eager_step closes the open group before one, and a
 * value computed before one and read after it is stored, since computing
 * it again after the write could read what the write changed -- unless it
 * reads no memory at all (a fill, an arange, arithmetic on them: layer
 * norm's epsilon), which any kernel recomputes for free.  reads: scratch,
 * one per node. */
static void store_across_updates(builder *b, bool *reads) {
    sc_schedule *s = b->s;
    const tr_graph *g = s->g;
    for (int v = 0; v < b->n; v++) { /* nodes are in topological order */
        const tr_node *nd = &g->nodes[v];
        reads[v] = nd->kind != TR_CALL || !s->fusible[v];
        for (int k = 0; k < nd->nin && !reads[v]; k++) reads[v] = reads[nd->in[k]];
    }
    int next = b->n; /* the first update after node v */
    for (int v = b->n - 1; v >= 0; v--) {
        if (s->fusible[v] && reads[v] && b->lastuse[v] > next) s->materialized[v] = true;
        const tr_node *nd = &s->g->nodes[v];
        if (nd->kind == TR_CALL && em_op_table[nd->op].kind == EM_KIND_UPDATE) next = v;
    }
}

static em_status build_groups(builder *b) {
    sc_schedule *s = b->s;
    const tr_graph *g = s->g;
    em_status st = EM_OK;
    for (int i = 0; i < b->n && st == EM_OK;) {
        b->steps_at[i] = s->nsteps;
        int next = i + 1;
        if (g->nodes[i].kind == TR_CALL)
            next = s->fusible[i] ? place(b, i, &st) : (st = eager_step(b, i), i + 1);
        if (next == i + 1) retire(b, i);
        i = next;
    }
    if (st == EM_OK) st = close_group(b);
    if (st == EM_OK) st = drop_dead_steps(s);
    return st;
}

/* Lists each group's nodes (a counting sort by group, stable). */
static em_status list_members(sc_schedule *s) {
    int n = s->g->nnodes;
    s->members = em_malloc(sizeof(int) * ((size_t)n + 1));
    s->member_start = em_calloc((size_t)s->ngroups + 2, sizeof(int));
    if (!s->members || !s->member_start) return em_last_status();
    for (int i = 0; i < n; i++)
        if (s->group[i] >= 0) s->member_start[s->group[i] + 2]++;
    for (int gi = 0; gi < s->ngroups; gi++) s->member_start[gi + 2] += s->member_start[gi + 1];
    for (int i = 0; i < n; i++) /* member_start[gi + 1]: the next free slot of gi */
        if (s->group[i] >= 0) s->members[s->member_start[s->group[i] + 1]++] = i;
    return EM_OK;
}

/* The input of the views that end at view v: what v's elements are. */
static int view_base(const sc_schedule *s, int v) {
    while (sc_is_view(&s->g->nodes[v]) && s->fusible[v]) v = s->g->nodes[v].in[0];
    return v;
}

/* Makes view v and the fused views below it eager steps: their base is
 * stored. */
static void unfuse_views(sc_schedule *s, int v) {
    for (; sc_is_view(&s->g->nodes[v]) && s->fusible[v]; v = s->g->nodes[v].in[0]) s->fusible[v] = false;
}

/* A fused view that an op which is not fused reads must be in memory:
 * either stored by a kernel (contiguous) or made eagerly from its stored
 * base.  Storing it saves bytes only when it narrows its base and the
 * views of that base read so are, together, smaller than the base (q, k
 * and v, three slices that cover a qkv projection, cost no less than the
 * projection) and the base is not stored anyway (an output, an operand
 * of a matmul); a reshape, permute or expand never does.  need: scratch,
 * one per node, zeroed.  Readers come after their inputs, so backward
 * walks settle chains of views. */
static void settle_eager_views(sc_schedule *s, double *need) {
    const tr_graph *g = s->g;
    for (int i = g->nnodes - 1; i >= 0; i--)
        for (int k = 0; g->nodes[i].kind == TR_CALL && !s->fusible[i] && k < g->nodes[i].nin; k++) {
            int u = g->nodes[i].in[k];
            if (sc_is_view(&g->nodes[u]) && s->fusible[u] &&
                numel_of(&g->nodes[u]) >= numel_of(&g->nodes[view_base(s, u)]))
                s->fusible[u] = false;
        }
    for (int o = 0; o < g->noutputs; o++) need[g->outputs[o]] = INFINITY;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; g->nodes[i].kind == TR_CALL && !s->fusible[i] && k < g->nodes[i].nin; k++) {
            int u = g->nodes[i].in[k];
            bool view = sc_is_view(&g->nodes[u]) && s->fusible[u];
            need[view ? view_base(s, u) : u] += view ? numel_of(&g->nodes[u]) : INFINITY;
        }
    for (int i = g->nnodes - 1; i >= 0; i--)
        for (int k = 0; g->nodes[i].kind == TR_CALL && !s->fusible[i] && k < g->nodes[i].nin; k++) {
            int u = g->nodes[i].in[k];
            if (!sc_is_view(&g->nodes[u]) || !s->fusible[u]) continue;
            int base = view_base(s, u);
            if (need[base] >= numel_of(&g->nodes[base])) unfuse_views(s, u);
        }
}

/* Views of values that kernels compute are fused too: a kernel that reads
 * one computes the viewed value at the positions the view maps to
 * (lower.c), so log_softmax(x)[:, :1000] recomputes the 1,000 columns it
 * keeps instead of storing all 50,257 (the cost model, with the fraction
 * a view reads, decides).  A view stays an eager step (with its input
 * stored, as before) when it is an output (its caller gets its strides),
 * when no kernel computes its input, or when an op that is not fused
 * reads it and storing it would not save bytes (settle_eager_views). */
static em_status choose_views(sc_schedule *s, bool half) {
    const tr_graph *g = s->g;
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        s->fusible[i] |= sc_is_view(n) && dtype_ok(n->meta.dtype, half) && s->fusible[n->in[0]];
    }
    for (int o = 0; o < g->noutputs; o++)
        if (sc_is_view(&g->nodes[g->outputs[o]])) s->fusible[g->outputs[o]] = false;
    double *need = em_calloc((size_t)g->nnodes + 1, sizeof(double));
    if (!need) return em_last_status();
    settle_eager_views(s, need);
    em_free(need);
    return EM_OK;
}

sc_schedule *sc_build(const tr_graph *g) { return sc_build_for(g, false); }

sc_schedule *sc_build_for(const tr_graph *g, bool half) {
    sc_schedule *s = em_calloc(1, sizeof *s);
    if (!s) return NULL;
    int n = g->nnodes;
    s->g = g;
    s->fusible = em_calloc((size_t)n + 1, sizeof(bool));
    s->materialized = em_calloc((size_t)n + 1, sizeof(bool));
    s->lead = em_calloc((size_t)n + 1, sizeof(bool));
    s->group = em_malloc(sizeof(int) * ((size_t)n + 1));
    s->groups = em_calloc((size_t)n + 1, sizeof(sc_group));
    builder b;
    bool ok = builder_init(&b, s) && s->fusible && s->materialized && s->lead && s->group && s->groups;
    for (int i = 0; ok && i < n; i++) {
        s->group[i] = -1;
        s->fusible[i] = fusible(g, &g->nodes[i], half);
    }
    ok = ok && choose_views(s, half) == EM_OK;
    /* what must be in memory: outputs, and inputs of ops that are not fused */
    for (int i = 0; ok && i < g->noutputs; i++) s->materialized[g->outputs[i]] = true;
    for (int i = 0; ok && i < n; i++)
        if (!s->fusible[i])
            for (int k = 0; k < g->nodes[i].nin; k++) s->materialized[g->nodes[i].in[k]] = true;
    bool *reads = ok ? em_malloc((size_t)n + 1) : NULL;
    ok = ok && reads;
    if (ok) store_across_updates(&b, reads);
    em_free(reads);
    ok = ok && build_groups(&b) == EM_OK && list_members(s) == EM_OK &&
         (s->tables = sc_lower_tables_new(n)) != NULL;
    builder_free(&b);
    if (ok) return s;
    sc_free(s);
    return NULL;
}

void sc_free(sc_schedule *s) {
    if (!s) return;
    em_free(s->fusible);
    em_free(s->materialized);
    em_free(s->lead);
    em_free(s->group);
    em_free(s->groups);
    em_free(s->steps);
    em_free(s->members);
    em_free(s->member_start);
    sc_lower_tables_free(s->tables);
    em_free(s);
}
