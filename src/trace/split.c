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

#include <float.h>
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

/* What the pass is asked (tr_split_reductions' arguments). */
typedef struct split_opts {
    int64_t rows, long_row;
    bool cuts;
} split_opts;

/* How a reduction splits: over inner dims from reduced dim j (j > 0), or
 * reduced dim cut (>= 0) viewed as [S, n / S]; long_row: for the length
 * of its rows (plan_long), not for their number. */
typedef struct plan {
    int j, cut;
    int64_t S;
    bool long_row;
} plan;

static bool plan_long(const tr_graph *g, const tr_node *n, const split_opts *o, plan *p);

/* How node n (a splittable reduction of in, its input) splits, into *p:
 * over inner dims (p->j > 0: the first reduced dim, in order, that the
 * partial reduces) or a reduced dim cut in two (p->cut >= 0, S parts).
 * false: not split. */
static bool plan_split(const tr_graph *g, const tr_node *n, const split_opts *o, plan *p) {
    const em_meta *in = &g->nodes[n->in[0]].meta;
    int64_t rows = o->rows;
    bool cuts = o->cuts;
    int *j = &p->j, *cut = &p->cut;
    int64_t *S = &p->S;
    p->long_row = false;
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
    if (out < 1) return false;
    *j = 0, *cut = -1, *S = 0;
    if (out * 4 > rows || red < SPLIT_MIN_ELEMS) return plan_long(g, n, o, p);
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

/* A reduction over one dim of at least long_row f32 elements' bytes (a
 * row longer than one block keeps), whatever its rows; a half row cast
 * to f32 counts as loaded, at 2 bytes an element.  The dim is cut into
 * the fewest parts of at most long_row / 4 elements (a row a block keeps
 * easily). */
static bool plan_long(const tr_graph *g, const tr_node *n, const split_opts *o, plan *p) {
    const tr_node *x = &g->nodes[n->in[0]];
    const em_meta *in = &x->meta;
    int d = n->attrs.dims[0];
    const tr_node *src = x->kind == TR_CALL && x->op == EM_OP_CAST ? &g->nodes[x->in[0]] : x;
    int64_t bytes = in->sizes[d] * (int64_t)em_dtype_size(src->meta.dtype);
    if (o->long_row <= 0 || !o->cuts || n->attrs.ndims != 1 || bytes < o->long_row * 4) return false;
    int64_t size = in->sizes[d];
    for (int64_t s = 2; s < size; s++)
        if (size % s == 0 && size / s <= o->long_row / 4) {
            p->cut = d, p->S = s, p->long_row = true;
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

/* Appends reshape(x) to sizes (nd dims) to c, or x when it has them; the
 * node, or -1. */
static int add_reshape(tr_graph *c, int x, int nd, const int64_t *sizes) {
    em_meta m = c->nodes[x].meta;
    if (m.ndim == nd && !memcmp(m.sizes, sizes, sizeof(int64_t) * (size_t)nd)) return x;
    em_op_attrs v;
    memset(&v, 0, sizeof v);
    v.ndim = nd;
    memcpy(v.sizes, sizes, sizeof(int64_t) * (size_t)nd);
    int y = tr_add_call(c, EM_OP_RESHAPE, 1, &x, &v, &m);
    return y >= 0 && tr_infer_own(c, y) == EM_OK ? y : -1;
}

/* Appends op(in[0..nin)) (pointwise) to c; the node, or -1. */
static int add_pointwise(tr_graph *c, em_op op, int nin, const int *in) {
    for (int k = 0; k < nin; k++)
        if (in[k] < 0) return -1;
    em_op_attrs a;
    memset(&a, 0, sizeof a);
    em_meta m = c->nodes[in[0]].meta;
    int i = tr_add_call(c, op, nin, in, &a, &m);
    return i >= 0 && tr_infer_own(c, i) == EM_OK ? i : -1;
}

/* Appends a 0-d full(value) of like's dtype and device to c; the node,
 * or -1. */
static int add_scalar(tr_graph *c, double value, const em_meta *like) {
    em_op_attrs a;
    memset(&a, 0, sizeof a);
    a.dtype = like->dtype;
    a.device = like->device;
    a.value = value;
    em_meta m = *like;
    m.ndim = 0;
    int i = tr_add_call(c, EM_OP_FULL, 0, NULL, &a, &m);
    return i >= 0 && tr_infer_own(c, i) == EM_OK ? i : -1;
}

static int add_partial(tr_graph *c, const tr_node *n, int x, const plan *p);
static int add_final(tr_graph *c, const tr_node *n, int part, const plan *p);

/* Appends to c the split of reduction n of node x (c's), as p says; the
 * final node, or -1.  A half sum or mean accumulates in f32 and rounds
 * once, so its partials and final are f32 between two casts (the same
 * single rounding); maxima and minima are exact in any type. */
static int add_split(tr_graph *c, const tr_node *n, int x, const plan *p) {
    bool cast = is_half(n->meta.dtype) && n->op != EM_OP_AMAX && n->op != EM_OP_AMIN;
    int w = cast ? add_cast(c, x, EM_F32) : x;
    int part = w < 0 ? -1 : add_partial(c, n, w, p);
    int r = part < 0 ? -1 : add_final(c, n, part, p);
    return r < 0 || !cast ? r : add_cast(c, r, n->meta.dtype);
}

/* The dims the final reduction of plan p for n reduces, in the
 * partial's dims (the partial drops the dims it reduces); their count. */
static int final_dims(const tr_node *n, const plan *p, int *dims) {
    if (p->cut >= 0) { /* the S dim, less the reduced dims before it */
        dims[0] = p->cut;
        for (int i = 0; i < n->attrs.ndims; i++) dims[0] -= n->attrs.dims[i] < p->cut;
        return 1;
    }
    memcpy(dims, n->attrs.dims, sizeof(int) * (size_t)p->j);
    return p->j;
}

/* The partial reduction of n over x (c's node), as p says, without
 * keepdim (so that the final's dims are trailing ones when n's are); the
 * node, or -1.  Over a cut dim, x is viewed with it as [S, n / S]. */
static int add_partial(tr_graph *c, const tr_node *n, int x, const plan *p) {
    const em_op_attrs *a = &n->attrs;
    if (p->cut < 0) return add_reduce(c, n->op, x, a->dims + p->j, a->ndims - p->j, false);
    em_meta m = c->nodes[x].meta; /* tr_add_call may move c's nodes */
    int64_t sizes[EM_MAX_DIMS];
    for (int d = 0, o = 0; d < m.ndim; d++) {
        if (d == p->cut) {
            sizes[o++] = p->S;
            sizes[o++] = m.sizes[d] / p->S;
        } else {
            sizes[o++] = m.sizes[d];
        }
    }
    int y = add_reshape(c, x, m.ndim + 1, sizes);
    int dims[EM_MAX_DIMS], nd = 0;
    for (int i = 0; i < a->ndims; i++) dims[nd++] = a->dims[i] + (a->dims[i] >= p->cut ? 1 : 0);
    return y < 0 ? -1 : add_reduce(c, n->op, y, dims, nd, false);
}

/* The final reduction of n over its partial (c's node part), with n's
 * sizes (a keepdim result as a view of the final's); the node, or -1. */
static int add_final(tr_graph *c, const tr_node *n, int part, const plan *p) {
    int fin[EM_MAX_DIMS], nf = final_dims(n, p, fin);
    int f = add_reduce(c, n->op, part, fin, nf, false);
    return f < 0 ? -1 : add_reshape(c, f, n->meta.ndim, n->meta.sizes);
}

/* ---- an online softmax's statistics ----
 * m = amax(x, D, keepdim) and s = sum(exp(x - m), D): s's terms need the
 * whole row's max, so s alone cannot split.  Split together, each part k
 * has its own max m_k and s_k = sum(exp(x - m_k)) over the part (one
 * kernel, one read of x), and the final is the max M of the m_k and
 * s = sum_k s_k * exp(m_k - M), the same sum (exp(x - M) = exp(x - m_k) *
 * exp(m_k - M)), as an online softmax computes it.  A part whose values
 * are all -inf has m_k = -inf and would make s_k NaN (-inf - -inf): its
 * shift is the lowest finite value instead, so s_k = 0 and its weight
 * exp(lowest - M) = 0; rows with a NaN, a +inf or all -inf give NaN, as
 * the unsplit s does. */

/* Whether node i of g is s = sum(exp(x - m)) (f32 or f64) over the dims
 * of m = amax(x, keepdim=true); m's node, or -1. */
static int stats_pair(const tr_graph *g, int i) {
    const tr_node *s = &g->nodes[i];
    if (s->kind != TR_CALL || s->op != EM_OP_SUM || s->nin != 1) return -1;
    if (s->meta.dtype != EM_F32 && s->meta.dtype != EM_F64) return -1;
    const tr_node *e = &g->nodes[s->in[0]];
    if (e->kind != TR_CALL || e->op != EM_OP_EXP) return -1;
    const tr_node *u = &g->nodes[e->in[0]];
    if (u->kind != TR_CALL || u->op != EM_OP_SUB) return -1;
    int mi = u->in[1];
    const tr_node *m = &g->nodes[mi];
    if (m->kind != TR_CALL || m->op != EM_OP_AMAX || m->in[0] != u->in[0] || !m->attrs.keepdim) return -1;
    if (m->attrs.ndims != s->attrs.ndims ||
        memcmp(m->attrs.dims, s->attrs.dims, sizeof(int) * (size_t)s->attrs.ndims))
        return -1;
    return mi;
}

/* Appends to c the split of m (node mi of g, over x: c's node) and of s
 * (node si), by plan p: both partials, then both finals, so that the
 * partials make one kernel (one read of x) and the finals another; m's
 * new node, *s_out s's, or -1. */
static int add_pair(tr_graph *c, const tr_graph *g, int mi, int si, int x, const plan *p, int *s_out) {
    const tr_node *m = &g->nodes[mi], *s = &g->nodes[si];
    *s_out = -1;
    int m1 = add_partial(c, m, x, p);
    if (m1 < 0) return -1;
    em_meta pm = c->nodes[m1].meta; /* the partials' sizes */
    int v = c->nodes[m1].in[0];     /* x, or its view cut in parts */
    em_meta vm = c->nodes[v].meta;
    int pdims[EM_MAX_DIMS], np = c->nodes[m1].attrs.ndims;
    memcpy(pdims, c->nodes[m1].attrs.dims, sizeof(int) * (size_t)np);
    int64_t rsizes[EM_MAX_DIMS]; /* v's, reduced dims 1: m1 kept */
    memcpy(rsizes, vm.sizes, sizeof rsizes);
    for (int k = 0; k < np; k++) rsizes[pdims[k]] = 1;
    int lo = add_scalar(c, pm.dtype == EM_F32 ? -FLT_MAX : -DBL_MAX, &pm);
    int m1k = add_reshape(c, m1, vm.ndim, rsizes);
    int shift = add_pointwise(c, EM_OP_MAXIMUM, 2, (int[]){m1k, lo});
    int e = add_pointwise(c, EM_OP_EXP, 1, (int[]){add_pointwise(c, EM_OP_SUB, 2, (int[]){v, shift})});
    int s1 = e < 0 ? -1 : add_reduce(c, EM_OP_SUM, e, pdims, np, false);
    int mf = s1 < 0 ? -1 : add_final(c, m, m1, p);
    if (mf < 0) return -1;
    int fin[EM_MAX_DIMS], nf = final_dims(s, p, fin);
    int64_t ksizes[EM_MAX_DIMS]; /* the partials', final dims 1: m's final kept */
    memcpy(ksizes, pm.sizes, sizeof ksizes);
    for (int k = 0; k < nf; k++) ksizes[fin[k]] = 1;
    int mk = add_reshape(c, mf, pm.ndim, ksizes);
    int shift2 = add_pointwise(c, EM_OP_MAXIMUM, 2, (int[]){m1, lo});
    int w = add_pointwise(c, EM_OP_EXP, 1, (int[]){add_pointwise(c, EM_OP_SUB, 2, (int[]){shift2, mk})});
    int t = add_pointwise(c, EM_OP_MUL, 2, (int[]){s1, w});
    int f = t < 0 ? -1 : add_reduce(c, EM_OP_SUM, t, fin, nf, false);
    *s_out = f < 0 ? -1 : add_reshape(c, f, s->meta.ndim, s->meta.sizes);
    return *s_out < 0 ? -1 : mf;
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

/* Whether g has a var of node i's rows (a norm's statistics): its
 * kernel keeps the row, so splitting i would read it again. */
static bool var_of_rows(const tr_graph *g, int i) {
    const tr_node *r = &g->nodes[i];
    for (int k = 0; k < g->nnodes; k++) {
        const tr_node *n = &g->nodes[k];
        if (n->kind == TR_CALL && n->op == EM_OP_VAR && numel_of(n) == numel_of(r) &&
            numel_of(&g->nodes[n->in[0]]) == numel_of(&g->nodes[r->in[0]]))
            return true;
    }
    return false;
}

/* Whether node i of g splits: 1 or 0, -1 out of memory (seen: scratch;
 * r: g's readers, made on first use; pair: its max when it splits with
 * it).  A reduction of few
 * rows splits unless its result is broadcast back over its rows (their
 * kernel keeps the row); one of long rows splits even so (such a row
 * outgrows a kernel's registers), unless a var keeps them.  Either is
 * left whole when computed from another reduction of its rows, but for
 * a softmax's sum of exp(x - max) whose max splits. */
static int splits(const tr_graph *g, int i, const split_opts *o, const bool *hit, int *pair, readers *r,
                  bool *seen) {
    const tr_node *nd = &g->nodes[i];
    plan p;
    if (!splittable(nd) || !plan_split(g, nd, o, &p)) return false;
    if (!r->start && !readers_of(g, r)) return -1;
    size_t n = (size_t)g->nnodes;
    memset(seen, 0, sizeof(bool) * n);
    if (p.long_row ? var_of_rows(g, i) : broadcast_back(g, r, i, numel_of(nd), seen)) return false;
    memset(seen, 0, sizeof(bool) * n);
    if (!same_rows_above(g, i, i, seen)) return true;
    int m = stats_pair(g, i);
    if (m < 0 || !hit[m]) return false;
    memset(seen, 0, sizeof(bool) * n);
    if (same_rows_above(g, g->nodes[m].in[0], i, seen)) return false;
    pair[i] = m;
    return true;
}

/* Marks in hit the nodes of g to split, in pair the max each sum splits
 * with (-1: none); how many, or -1 (out of memory). */
static int find(const tr_graph *g, const split_opts *o, bool *hit, int *pair) {
    int n = 0;
    readers r = {NULL, NULL};
    bool *seen = em_malloc(sizeof(bool) * ((size_t)g->nnodes + 1));
    if (!seen) return -1;
    for (int i = 0; n >= 0 && i < g->nnodes; i++) {
        pair[i] = -1;
        int k = splits(g, i, o, hit, pair, &r, seen);
        hit[i] = k > 0;
        n = k < 0 ? -1 : n + k;
    }
    em_free(r.start);
    em_free(seen);
    return n;
}

/* The pass's rewrite: pair (from find) and mate (its inverse: the sum
 * that splits with each max, -1 none); map: g's nodes in c so far;
 * done: a paired sum's node, made with its max. */
typedef struct rewrite {
    const tr_graph *g;
    tr_graph *c;
    const split_opts *o;
    const bool *hit;
    int *pair, *mate, *map, *done;
    int nsplit;
} rewrite;

/* Whether c's node r has n's sizes (a split must give the node's own
 * result, or it is not made). */
static bool same_result(const tr_graph *c, int r, const tr_node *n) {
    return r >= 0 && c->nodes[r].meta.ndim == n->meta.ndim &&
           !memcmp(c->nodes[r].meta.sizes, n->meta.sizes, sizeof(int64_t) * (size_t)n->meta.ndim);
}

/* Node i of g in c, split when hit says so (a max with its sum); the
 * node, or -1. */
static int rewrite_node(rewrite *w, int i) {
    const tr_node *n = &w->g->nodes[i];
    plan p;
    int r = -1;
    if (w->pair[i] >= 0 && w->done[i] >= 0) {
        r = w->done[i];
    } else if (w->hit[i] && w->pair[i] < 0 && plan_split(w->g, n, w->o, &p)) {
        int s = w->mate[i], sr = -1;
        r = s >= 0 ? add_pair(w->c, w->g, i, s, w->map[n->in[0]], &p, &sr) : add_split(w->c, n, w->map[n->in[0]], &p);
        if (!same_result(w->c, r, n) || (s >= 0 && !same_result(w->c, sr, &w->g->nodes[s]))) r = -1;
        if (r >= 0 && s >= 0) w->done[s] = sr;
    }
    w->nsplit += r >= 0;
    return r >= 0 ? r : copy_node(w->c, w->g, i, w->map);
}

tr_graph *tr_split_reductions(const tr_graph *g, int64_t rows, int64_t long_row, bool cuts, int *nsplit,
                              int *where) {
    *nsplit = 0;
    split_opts o = {rows, long_row, cuts};
    size_t slots = (size_t)g->nnodes + 1;
    bool *hit = em_calloc(slots, sizeof(bool));
    int *ints = hit ? em_malloc(4 * sizeof(int) * slots) : NULL; /* pair, mate, map, done */
    int found = ints ? find(g, &o, hit, ints) : -1;
    if (found <= 0) {
        *nsplit = found;
        em_free(hit);
        em_free(ints);
        return NULL;
    }
    rewrite w = {g, tr_graph_new(), &o, hit, ints, ints + slots, ints + 2 * slots, ints + 3 * slots, 0};
    for (int i = 0; i < g->nnodes; i++) w.mate[i] = w.done[i] = -1;
    for (int i = 0; i < g->nnodes; i++)
        if (w.pair[i] >= 0) w.mate[w.pair[i]] = i;
    bool ok = w.c != NULL;
    for (int i = 0; ok && i < g->nnodes; i++) {
        w.map[i] = rewrite_node(&w, i);
        ok = w.map[i] >= 0;
    }
    tr_graph *c = w.c;
    *nsplit = w.nsplit;
    int outs[64];
    ok = ok && g->noutputs <= 64;
    for (int k = 0; ok && k < g->noutputs; k++) outs[k] = w.map[g->outputs[k]];
    ok = ok && tr_set_outputs(c, g->noutputs, outs) == EM_OK;
    int *dead = ok ? em_malloc(sizeof(int) * ((size_t)c->nnodes + 1)) : NULL;
    ok = dead && tr_dce_map(c, dead) >= 0;
    for (int i = 0; ok && where && i < g->nnodes; i++) where[i] = w.map[i] < 0 ? -1 : dead[w.map[i]];
    em_free(dead);
    em_free(ints);
    em_free(hit);
    if (!ok || *nsplit == 0) {
        if (!ok) *nsplit = -1;
        tr_graph_free(c);
        return NULL;
    }
    return c;
}
