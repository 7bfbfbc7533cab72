/* split.c - the split-reduction pass: a reduction whose result has too
 * few elements to keep a device busy (the mean of a loss over a whole
 * tensor, the sums of a few long rows) becomes two reductions, as
 * Inductor's split reductions do: a partial one with many result rows,
 * then one over the partials.  Kernels run a reduction's result elements
 * in parallel (a block a row on a GPU, rows split over threads on the
 * CPU), so a reduction to one value ran in one block or one thread
 * however large its input.
 *
 * A sum, mean, amax or amin (a half sum or mean between casts to f32
 * and back: a half-typed partial would round where the one reduction
 * accumulates in f32 and rounds once) whose result
 * has fewer than rows elements (and at least one) and which reduces at
 * least SPLIT_MIN_ELEMS elements is split, its reduced dims d1 < ... < dk
 * (sizes n1..nk):
 *
 *   - over inner dims: the partial reduces dj..dk and the final d1..d(j-1)
 *     (the smallest j >= 2 whose partial has at least rows results), so
 *     that a partial row is what the unsplit reduction's row was, minus
 *     its outer dims: `mean(x[:, :1000])` of a [2048, 50257] x is the mean
 *     of 2048 row means of 1000;
 *   - else over a dim cut in two: x viewed with a reduced dim of size n as
 *     [S, n / S] (a view: any strides split so), the partial reducing the
 *     n / S part and the dims after it, the final the S partials.  S is
 *     the smallest divisor of n that gives rows partials (the largest
 *     below it when none does), the first reduced dim that has one; a
 *     reduced dim of prime size is not cut.  Graphs of dynamic sizes are
 *     not cut (the view's sizes would be attributes of the traced ones):
 *     they split over inner dims only.
 *
 * The result is the same reduction: sums of sums, maxima of maxima, and
 * means of means over equal parts.  keepdim carries through: the partial
 * keeps the op's, the final drops its dims from the partial's.
 *
 * Left whole, as passes of a kernel that keeps the row (a GPU's long
 * rows over a cluster of blocks), which a split would make read the row
 * again: a reduction whose result (or a value computed from it alone) is
 * broadcast back over a larger value, as a softmax's max and sum are over
 * its rows and a norm's statistics; and one computed from another
 * reduction of the same rows (a cross-entropy's sum of exp(x - max),
 * whose max reduces the same rows).  Also a reduction that already has a
 * quarter of rows results: its one kernel has rows enough, and a split
 * would add a launch. */
#include "trace.h"

#include <string.h>

enum { SPLIT_MIN_ELEMS = 65536 };

static bool is_half(em_dtype d) { return d == EM_F16 || d == EM_BF16; }

static bool splittable(const tr_node *n) {
    if (n->kind != TR_CALL || n->nin != 1) return false;
    return n->op == EM_OP_SUM || n->op == EM_OP_MEAN || n->op == EM_OP_AMAX || n->op == EM_OP_AMIN;
}

/* Readers of each node of g, as lists: node i's are at[start[i] ..
 * start[i + 1]) (em_malloc'd together; NULL: out of memory). */
typedef struct readers {
    int *start, *at;
} readers;

static bool readers_of(const tr_graph *g, readers *r) {
    size_t n = (size_t)g->nnodes, edges = 0;
    for (int i = 0; i < g->nnodes; i++) edges += g->nodes[i].kind == TR_CALL ? (size_t)g->nodes[i].nin : 0;
    r->start = em_calloc(2 * n + 2 + edges, sizeof(int));
    if (!r->start) return false;
    r->at = r->start + n + 1;
    int *fill = r->at + edges;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; g->nodes[i].kind == TR_CALL && k < g->nodes[i].nin; k++) r->start[g->nodes[i].in[k] + 1]++;
    for (size_t i = 0; i < n; i++) r->start[i + 1] += r->start[i];
    memcpy(fill, r->start, sizeof(int) * n);
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; g->nodes[i].kind == TR_CALL && k < g->nodes[i].nin; k++) {
            int u = g->nodes[i].in[k];
            r->at[fill[u]++] = i;
        }
    return true;
}

static int64_t numel_of(const tr_node *n) { return em_shape_numel(n->meta.ndim, n->meta.sizes); }

/* Whether node i's value, or one computed from it with no more elements,
 * meets a larger value in a reader (is broadcast back over it); seen:
 * scratch, a flag a node, cleared by the caller. */
static bool broadcast_back(const tr_graph *g, const readers *r, int i, int64_t numel, bool *seen) {
    if (seen[i]) return false;
    seen[i] = true;
    for (int e = r->start[i]; e < r->start[i + 1]; e++) {
        int j = r->at[e];
        if (numel_of(&g->nodes[j]) > numel) return true;
        if (broadcast_back(g, r, j, numel, seen)) return true;
    }
    return false;
}

static bool is_reduction(const tr_node *n) {
    return n->kind == TR_CALL && (splittable(n) || n->op == EM_OP_VAR);
}

/* Whether node i (or a node it is computed from, seen: scratch) is a
 * reduction other than node self with self's result and input sizes (the
 * same rows). */
static bool same_rows_above(const tr_graph *g, int i, int self, bool *seen) {
    if (seen[i]) return false;
    seen[i] = true;
    const tr_node *n = &g->nodes[i], *r = &g->nodes[self];
    if (i != self && is_reduction(n) && numel_of(n) == numel_of(r) &&
        numel_of(&g->nodes[n->in[0]]) == numel_of(&g->nodes[r->in[0]]))
        return true;
    for (int k = 0; n->kind == TR_CALL && k < n->nin; k++)
        if (same_rows_above(g, n->in[k], self, seen)) return true;
    return false;
}

/* How node n (a splittable reduction of in, its input) splits: *j (the
 * first reduced dim, in order, that the partial reduces; 0 when none) or
 * *cut (the reduced dim cut in two, -1 none) with *S parts.  false: not
 * split. */
static bool plan_split(const tr_node *n, const em_meta *in, int64_t rows, bool cuts, int *j, int *cut,
                       int64_t *S) {
    const em_op_attrs *a = &n->attrs;
    int k = a->ndims;
    if (k < 1 || in->ndim + 1 > EM_MAX_DIMS) return false;
    int64_t out = 1, red = 1;
    bool reduced[EM_MAX_DIMS] = {false};
    for (int i = 0; i < k; i++) {
        if (a->dims[i] < 0 || a->dims[i] >= in->ndim || (i > 0 && a->dims[i] <= a->dims[i - 1])) return false;
        reduced[a->dims[i]] = true;
    }
    for (int d = 0; d < in->ndim; d++) {
        if (reduced[d]) red *= in->sizes[d];
        else out *= in->sizes[d];
    }
    if (out < 1 || out * 4 > rows || red < SPLIT_MIN_ELEMS) return false;
    *j = 0, *cut = -1, *S = 0;
    int64_t outer = out; /* results of a partial that reduces dims[i..k) */
    for (int i = 1; i < k; i++) {
        outer *= in->sizes[a->dims[i - 1]];
        if (outer >= rows) {
            *j = i;
            return true;
        }
    }
    for (int i = 0; cuts && i < k && *cut < 0; i++) {
        int64_t size = in->sizes[a->dims[i]], best = 0;
        for (int64_t s = 2; s < size && s <= rows; s++) {
            if (size % s) continue;
            best = s;
            if (out * s >= rows) break;
        }
        if (best) *cut = a->dims[i], *S = best;
    }
    if (*cut >= 0) return true;
    if (k > 1 && outer > out) { /* the innermost dim alone: some parallel rows */
        *j = k - 1;
        return true;
    }
    return false;
}

/* Appends op(x) over dims (sorted, count nd) with keepdim to c, its meta
 * inferred; the node, or -1. */
static int add_reduce(tr_graph *c, em_op op, int x, const int *dims, int nd, bool keepdim) {
    em_op_attrs a;
    memset(&a, 0, sizeof a);
    a.ndims = nd;
    memcpy(a.dims, dims, sizeof(int) * (size_t)nd);
    a.keepdim = keepdim;
    em_meta m = c->nodes[x].meta; /* tr_add_call may move c's nodes */
    int i = tr_add_call(c, op, 1, &x, &a, &m);
    return i >= 0 && tr_infer_own(c, i) == EM_OK ? i : -1;
}

/* Appends cast(x) to dt to c; the node, or -1. */
static int add_cast(tr_graph *c, int x, em_dtype dt) {
    em_op_attrs a;
    memset(&a, 0, sizeof a);
    a.dtype = dt;
    em_meta m = c->nodes[x].meta;
    int i = tr_add_call(c, EM_OP_CAST, 1, &x, &a, &m);
    return i >= 0 && tr_infer_own(c, i) == EM_OK ? i : -1;
}

static int add_split_as(tr_graph *c, const tr_node *n, int x, int j, int cut, int64_t S);

/* Appends to c the split of reduction n of node x (c's), as plan_split
 * says; the final node, or -1.  A half sum or mean accumulates in f32
 * and rounds once, so its partials and final are f32 between two casts
 * (the same single rounding); maxima and minima are exact in any type. */
static int add_split(tr_graph *c, const tr_node *n, int x, int j, int cut, int64_t S) {
    em_dtype dt = n->meta.dtype;
    if (!is_half(dt) || n->op == EM_OP_AMAX || n->op == EM_OP_AMIN) return add_split_as(c, n, x, j, cut, S);
    int w = add_cast(c, x, EM_F32);
    int r = w < 0 ? -1 : add_split_as(c, n, w, j, cut, S);
    return r < 0 ? -1 : add_cast(c, r, dt);
}

static int add_split_as(tr_graph *c, const tr_node *n, int x, int j, int cut, int64_t S) {
    const em_op_attrs *a = &n->attrs;
    if (cut < 0) {
        int p = add_reduce(c, n->op, x, a->dims + j, a->ndims - j, a->keepdim);
        return p < 0 ? -1 : add_reduce(c, n->op, p, a->dims, j, a->keepdim);
    }
    em_meta mx = c->nodes[x].meta, *m = &mx; /* tr_add_call may move c's nodes */
    em_op_attrs v;
    memset(&v, 0, sizeof v);
    v.ndim = m->ndim + 1;
    for (int d = 0, o = 0; d < m->ndim; d++) {
        if (d == cut) {
            v.sizes[o++] = S;
            v.sizes[o++] = m->sizes[d] / S;
        } else {
            v.sizes[o++] = m->sizes[d];
        }
    }
    int y = tr_add_call(c, EM_OP_RESHAPE, 1, &x, &v, m);
    if (y < 0 || tr_infer_own(c, y) != EM_OK) return -1;
    int dims[EM_MAX_DIMS], nd = 0;
    for (int i = 0; i < a->ndims; i++) dims[nd++] = a->dims[i] + (a->dims[i] >= cut ? 1 : 0);
    /* the partial keeps the S dim at cut, less the reduced dims before it
     * when it drops them; the final drops it */
    int p = add_reduce(c, n->op, y, dims, nd, a->keepdim);
    int fin[1] = {cut};
    if (!a->keepdim)
        for (int i = 0; i < a->ndims; i++) fin[0] -= a->dims[i] < cut;
    return p < 0 ? -1 : add_reduce(c, n->op, p, fin, 1, false);
}

/* Copies node i of g into c with its inputs renumbered by map; the node,
 * or -1. */
static int copy_node(tr_graph *c, const tr_graph *g, int i, const int *map) {
    const tr_node *n = &g->nodes[i];
    if (n->kind == TR_INPUT) return n->index == c->ninputs ? tr_add_input(c, n->name, &n->meta) : -1;
    if (n->kind == TR_CONST) return tr_add_const(c, g->consts[n->index]);
    int in[64];
    if (n->nin > 64) return -1;
    for (int k = 0; k < n->nin; k++) in[k] = map[n->in[k]];
    return tr_add_call(c, n->op, n->nin, in, &n->attrs, &n->meta);
}

/* Marks in hit the nodes of g to split (seen: scratch); how many, or -1
 * (out of memory). */
static int find(const tr_graph *g, int64_t rows, bool cuts, bool *hit, bool *seen) {
    int j, cut, n = 0;
    int64_t S;
    readers r = {NULL, NULL};
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *nd = &g->nodes[i];
        if (!splittable(nd) || !plan_split(nd, &g->nodes[nd->in[0]].meta, rows, cuts, &j, &cut, &S)) continue;
        if (!r.start && !readers_of(g, &r)) return -1;
        memset(seen, 0, sizeof(bool) * (size_t)g->nnodes);
        hit[i] = !broadcast_back(g, &r, i, numel_of(nd), seen);
        memset(seen, 0, sizeof(bool) * (size_t)g->nnodes);
        hit[i] = hit[i] && !same_rows_above(g, i, i, seen);
        n += hit[i];
    }
    em_free(r.start);
    return n;
}

tr_graph *tr_split_reductions(const tr_graph *g, int64_t rows, bool cuts, int *nsplit, int *where) {
    *nsplit = 0;
    int j, cut;
    int64_t S;
    size_t slots = (size_t)g->nnodes + 1;
    bool *hit = em_calloc(2 * slots, sizeof(bool));
    int found = hit ? find(g, rows, cuts, hit, hit + slots) : -1;
    if (found <= 0) {
        *nsplit = found;
        em_free(hit);
        return NULL;
    }
    tr_graph *c = tr_graph_new();
    int *map = c ? em_malloc(sizeof(int) * slots) : NULL;
    bool ok = map != NULL;
    for (int i = 0; ok && i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        map[i] = -1;
        if (hit[i] && plan_split(n, &g->nodes[n->in[0]].meta, rows, cuts, &j, &cut, &S)) {
            map[i] = add_split(c, n, map[n->in[0]], j, cut, S);
            /* the split must give the node's own result, or it is not made */
            if (map[i] >= 0 && (c->nodes[map[i]].meta.ndim != n->meta.ndim ||
                                memcmp(c->nodes[map[i]].meta.sizes, n->meta.sizes,
                                       sizeof(int64_t) * (size_t)n->meta.ndim)))
                map[i] = -1;
            if (map[i] >= 0) (*nsplit)++;
        }
        if (map[i] < 0) map[i] = copy_node(c, g, i, map);
        ok = map[i] >= 0;
    }
    int outs[64];
    ok = ok && g->noutputs <= 64;
    for (int k = 0; ok && k < g->noutputs; k++) outs[k] = map[g->outputs[k]];
    ok = ok && tr_set_outputs(c, g->noutputs, outs) == EM_OK;
    int *dead = ok ? em_malloc(sizeof(int) * ((size_t)c->nnodes + 1)) : NULL;
    ok = dead && tr_dce_map(c, dead) >= 0;
    for (int i = 0; ok && where && i < g->nnodes; i++) where[i] = map[i] < 0 ? -1 : dead[map[i]];
    em_free(dead);
    em_free(map);
    em_free(hit);
    if (!ok || *nsplit == 0) {
        if (!ok) *nsplit = -1;
        tr_graph_free(c);
        return NULL;
    }
    return c;
}
