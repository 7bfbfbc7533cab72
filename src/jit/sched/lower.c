/* lower.c - a fused group to kernel IR.
 *
 *   for o in [0, O) parallel           O: the product of the kept dims
 *     (o's multi-index, each buffer's row offset: on first use)
 *     for each reduction r:             one pass over the row (var: two)
 *       acc = init; for j...: acc <- value(input of r at (o, j)); end
 *     store each stored row value at o
 *     for j...: store each stored full value at (o, j); end
 *
 * value(node) emits the node's computation at the current position,
 * recursively; buffers (graph inputs, constants, results of eager ops and
 * of earlier kernels) are loaded with strides known at compile time (the
 * guards fix them).  Dims that every buffer walks contiguously are merged
 * first, so a pointwise kernel over contiguous tensors is one flat loop. */
#include "schedule.h"

#include <math.h>
#include <string.h>

/* Per-node tables shared by every sc_lower of one schedule, each call
 * leaving them as it found them (buf_of and row_val -1 again; full_val
 * valid only where full_pass is the current pass; seen valid where it is
 * the current call): lowering a group then costs the group's size. */
struct sc_lower_tables {
    int *buf_of;    /* per node: its buffer index or -1 */
    int *row_val;   /* per node: value emitted in row scope, or -1 */
    int *full_val;  /* per node: value emitted in the current inner pass */
    unsigned *full_pass, pass; /* full_val[v] is valid iff full_pass[v] == pass */
    unsigned *seen, call;      /* collect's marks: seen[v] == call */
    int *row_set, nrow;        /* the nodes whose row_val is set */
};

struct sc_lower_tables *sc_lower_tables_new(int n) {
    struct sc_lower_tables *t = em_calloc(1, sizeof *t);
    if (!t) return NULL;
    size_t m = (size_t)n + 1;
    t->buf_of = em_malloc(sizeof(int) * m);
    t->row_val = em_malloc(sizeof(int) * m);
    t->full_val = em_malloc(sizeof(int) * m);
    t->full_pass = em_calloc(m, sizeof(unsigned));
    t->seen = em_calloc(m, sizeof(unsigned));
    t->row_set = em_malloc(sizeof(int) * m);
    if (!t->buf_of || !t->row_val || !t->full_val || !t->full_pass || !t->seen || !t->row_set) {
        sc_lower_tables_free(t);
        return NULL;
    }
    for (size_t i = 0; i < m; i++) t->buf_of[i] = t->row_val[i] = -1;
    return t;
}

void sc_lower_tables_free(struct sc_lower_tables *t) {
    if (!t) return;
    em_free(t->buf_of);
    em_free(t->row_val);
    em_free(t->full_val);
    em_free(t->full_pass);
    em_free(t->seen);
    em_free(t->row_set);
    em_free(t);
}

typedef struct lower {
    const sc_schedule *s;
    const tr_graph *g;
    int gi;
    k_kernel *k;
    /* iteration space after merging: dims [0, no) outer, [no, nd) inner */
    int nd, no;
    int64_t sizes[EM_MAX_DIMS];
    int *bufs;               /* buffer parameter -> node */
    int nbufs;
    int64_t (*strides)[EM_MAX_DIMS]; /* per buffer, per merged dim (elements) */
    int *param;              /* per buffer: its K_BUF instruction */
    struct sc_lower_tables *t; /* per node: buffer index, values emitted (above) */
    const int *members;      /* the group's nodes, in order */
    int nmembers;
    int *row_base;           /* per buffer: row offset instruction or -1 */
    int o;                   /* the outer loop variable (or a constant 0) */
    int oidx[EM_MAX_DIMS];   /* o's multi-index over the outer dims */
    int j[EM_MAX_DIMS];      /* the inner loop variables (valid inside) */
    bool inner;              /* emitting inside the inner loops */
    bool failed;
    /* The last reduction's input, computed in its pass, is kept in a stored
     * output's memory for the final pass to read back instead of
     * recomputing (softmax: one exp per element, not two). -1: none. */
    int stash_node, stash_buf;
    bool stash_pending;
    /* The first reduction's input, kept the same way (in the same buffer,
     * element by element) for the passes up to the last one: the
     * expression before a softmax is computed once, not once per pass.
     * early_state: 0 none, 1 to be stored, 2 stored. */
    int early_node, early_state;
    /* A pointwise kernel over (o, j) whose operands disagree on which of
     * the two innermost dims is contiguous: its parallel range carries the
     * tile hint and such operands' loads are staged (kir.h, K_TILE). */
    bool tile;
    /* The kernel computes values at positions of their own (views, lead
     * values: value_at); its loops are then F's dims, unmerged, so that
     * each dim of F has its index.  memo: the values made at a position. */
    bool positional;
    struct at_memo *memo;
    int nmemo, capmemo;
} lower;

/* A position in a node's own index space: per dim, an i64 value, or
 * AT_ZERO (index 0: a unit dim) or AT_NONE (an inner index, outside the
 * inner loops). */
enum { AT_ZERO = -1, AT_NONE = -2 };
typedef struct at_pos {
    int n;
    int at[EM_MAX_DIMS];
} at_pos;

/* A value emitted at a position (valid in its pass when made inside the
 * inner loops, for the row otherwise). */
struct at_memo {
    int v, val;
    at_pos p;
    unsigned pass;
    bool inner;
};

/* Whether v is a lead value of this kernel (schedule.h): a row value laid
 * along F's leading dims. */
static bool is_lead(const lower *L, int v) { return L->s->group[v] == L->gi && L->s->lead[v]; }

static bool is_leaf(const lower *L, int v) {
    const tr_node *n = &L->g->nodes[v];
    if (n->kind != TR_CALL || !L->s->fusible[v]) return true;
    /* values of earlier kernels: stored ones are loaded, others recomputed */
    return L->s->group[v] != L->gi && L->s->materialized[v];
}

static void fail(lower *L, const char *why) {
    if (!L->failed) em_error(EM_ERR_UNSUPPORTED, "lowering group %d: %s", L->gi, why);
    L->failed = true;
}

/* ---- collecting buffers and their strides over the group's dims ---- */

static int add_buf(lower *L, int v) {
    if (L->t->buf_of[v] >= 0) return L->t->buf_of[v];
    L->bufs[L->nbufs] = v;
    L->t->buf_of[v] = L->nbufs;
    return L->nbufs++;
}

static void collect(lower *L, int v) {
    if (L->t->seen[v] == L->t->call) return;
    L->t->seen[v] = L->t->call;
    if (is_leaf(L, v)) {
        add_buf(L, v);
        return;
    }
    const tr_node *n = &L->g->nodes[v];
    if (sc_is_view(n) || (is_lead(L, v) && !sc_is_reduction(n))) L->positional = true;
    for (int i = 0; i < n->nin; i++) collect(L, n->in[i]);
}

/* Whether node v's dim md is of size 1 only at these sizes (sc_schedule's
 * vary): not a broadcast. */
static bool unit_varies(const lower *L, int v, int md) {
    return L->s->vary && (L->s->vary[v] >> md & 1);
}

/* The strides of node v's value in memory: a view a kernel stored is
 * contiguous (em_tensor_alloc), whatever strides the view had. */
static const int64_t *mem_strides(const lower *L, int v, int64_t *cont) {
    const em_meta *m = &L->g->nodes[v].meta;
    bool stored = L->s->group[v] >= 0 && L->s->materialized[v];
    if (!stored || !sc_is_view(&L->g->nodes[v])) return m->strides;
    em_contiguous_strides(m->ndim, m->sizes, cont);
    return cont;
}

/* Strides of buffer b's tensor over the group's dims F (numpy trailing
 * alignment; 0 where b broadcasts), or for stored values, of the
 * contiguous result.  Where a dim of size 1 varies, keep[d] is set. */
static void buf_strides(const lower *L, int b, const sc_group *gr, int64_t *st, bool *keep) {
    const em_meta *m = &L->g->nodes[L->bufs[b]].meta;
    int64_t cont[EM_MAX_DIMS], mem[EM_MAX_DIMS];
    em_contiguous_strides(m->ndim, m->sizes, cont);
    const int64_t *strides = mem_strides(L, L->bufs[b], mem);
    bool stored = L->s->group[L->bufs[b]] == L->gi;
    /* a lead value (a reduction without keepdim) has the outer dims only:
     * it lines up with F's leading dims, not (as numpy broadcasting would)
     * its last */
    bool leading = stored && L->s->lead[L->bufs[b]];
    int shift = leading ? 0 : gr->ndim - m->ndim;
    for (int d = 0; d < gr->ndim; d++) {
        int md = d - shift;
        /* only where the group's dim is 1 too: a size-1 dim against a
         * longer one is a broadcast, whatever sizes it takes elsewhere */
        bool unit = md >= 0 && md < m->ndim && m->sizes[md] == 1 && gr->sizes[d] == 1 &&
                    unit_varies(L, L->bufs[b], md);
        if (unit) keep[d] = true;
        if (md < 0 || md >= m->ndim || (m->sizes[md] == 1 && !unit)) st[d] = 0;
        else st[d] = stored ? cont[md] : strides[md];
    }
}

/* Merges adjacent dims that every buffer walks as one, within the outer
 * dims and within the k inner ones; size-1 dims walk nowhere and go,
 * unless their size varies (keep). */
static void merge_dims(lower *L, const sc_group *gr, int k, const bool *keep) {
    if (L->positional) { /* every dim of F, as it is: value_at indexes them */
        L->nd = gr->ndim;
        L->no = gr->ndim - k;
        memcpy(L->sizes, gr->sizes, sizeof(int64_t) * (size_t)gr->ndim);
        return;
    }
    int nd = 0, no = 0;
    bool last_outer = true;
    for (int d = 0; d < gr->ndim; d++) {
        bool outer = d < gr->ndim - k;
        if (gr->sizes[d] == 1 && !keep[d]) continue;
        bool merge = nd > 0 && last_outer == outer;
        for (int b = 0; merge && b < L->nbufs; b++)
            if (L->strides[b][nd - 1] != L->strides[b][d] * gr->sizes[d]) merge = false;
        if (merge) {
            L->sizes[nd - 1] *= gr->sizes[d];
            for (int b = 0; b < L->nbufs; b++) L->strides[b][nd - 1] = L->strides[b][d];
            continue;
        }
        L->sizes[nd] = gr->sizes[d];
        for (int b = 0; b < L->nbufs; b++) L->strides[b][nd] = L->strides[b][d];
        nd++;
        if (outer) no = nd;
        last_outer = outer;
    }
    L->nd = nd;
    L->no = no;
}

/* ---- emitting ---- */

static int ci(lower *L, int64_t v) { return kir_const_i(L->k, EM_I64, v); }

/* The dtype a value of dtype d is computed in: f32 for the half types
 * (a load converts up, a store rounds once, as torch computes them), d
 * otherwise. */
static bool is_half(em_dtype d) { return d == EM_F16 || d == EM_BF16; }
static em_dtype compute_dtype(em_dtype d) { return is_half(d) ? EM_F32 : d; }

/* Whether buffer b walks the last outer dim (a) more contiguously than
 * the inner one (j) that the stores walk: a transposed operand (x.T + y),
 * whose loads along j would each touch another 32-byte sector.  Read
 * along a instead (through a tile), at least two lanes share a sector;
 * when a is strided too (x.permute(2, 1, 0)) a tile would not help. */
static bool transposed(const lower *L, int b) {
    if (L->nd < 2 || L->no != L->nd - 1) return false;
    int64_t sa = L->strides[b][L->nd - 2], sj = L->strides[b][L->nd - 1];
    sa = sa < 0 ? -sa : sa, sj = sj < 0 ? -sj : sj;
    size_t elem = em_dtype_size(L->g->nodes[L->bufs[b]].meta.dtype);
    return sa != 0 && sa < sj && (size_t)sa * elem <= 16;
}

/* Buffer b's element at off, in its compute dtype. */
static int load(lower *L, int b, int off) {
    int x = kir_load(L->k, L->param[b], off);
    if (L->tile && L->inner && transposed(L, b)) kir_stage(L->k, x);
    em_dtype d = L->g->nodes[L->bufs[b]].meta.dtype;
    return is_half(d) ? kir_convert(L->k, x, EM_F32) : x;
}

/* Stores x (in the compute dtype) at off of buffer b, rounded to a half
 * buffer's dtype. */
static void store(lower *L, int b, int off, int x) {
    em_dtype d = L->g->nodes[L->bufs[b]].meta.dtype;
    kir_store(L->k, L->param[b], off, is_half(d) ? kir_convert(L->k, x, d) : x);
}

/* Buffer b's element offset at the current position: its row offset
 * (emitted once per row, see emit) plus the inner loop terms. */
static int offset(lower *L, int b) {
    int off = L->row_base[b];
    for (int d = L->no; L->inner && d < L->nd; d++) {
        if (L->strides[b][d] == 0) continue;
        int t = L->strides[b][d] == 1 ? L->j[d]
                                      : kir_alu(L->k, KA_MUL, L->j[d], ci(L, L->strides[b][d]), -1);
        off = kir_alu(L->k, KA_ADD, off, t, -1);
    }
    return off;
}

/* Whether node v varies along the inner dims (then it cannot be computed
 * in row scope). */
static bool varies_inner(const lower *L, int v) {
    const em_meta *m = &L->g->nodes[v].meta;
    const sc_group *gr = &L->s->groups[L->gi];
    int k = gr->k > 0 ? gr->k : 0;
    int shift = gr->ndim - m->ndim;
    if (L->s->group[v] == L->gi && (sc_is_reduction(&L->g->nodes[v]) || L->s->lead[v]))
        return false; /* per row */
    for (int d = gr->ndim - k; d < gr->ndim; d++) {
        int md = d - shift;
        if (md >= 0 && (m->sizes[md] != 1 || (gr->sizes[d] == 1 && unit_varies(L, v, md))))
            return true;
    }
    return k == 0 && L->nd > L->no; /* pointwise kernels: everything is inner */
}

static int value(lower *L, int v);

/* The value of v emitted in row scope, or in the current inner pass; -1. */
static int row_get(const lower *L, int v) { return L->t->row_val[v]; }

static int full_get(const lower *L, int v) {
    return L->t->full_pass[v] == L->t->pass ? L->t->full_val[v] : -1;
}

static void row_put(lower *L, int v, int r) {
    if (r < 0) return; /* a failure: nothing to remember */
    if (L->t->row_val[v] < 0) L->t->row_set[L->t->nrow++] = v;
    L->t->row_val[v] = r;
}

static void full_put(lower *L, int v, int r) {
    L->t->full_pass[v] = L->t->pass;
    L->t->full_val[v] = r;
}

/* ---- values at positions of their own (views, lead values) ---- */

static int value_at(lower *L, int v, const at_pos *p);

/* The index of F's dim d here: the outer loop's multi-index, an inner
 * loop's variable, or AT_NONE outside the inner loops (positional
 * kernels: F's dims are the loops' dims). */
static int f_index(const lower *L, int d) {
    if (d < L->no) return L->oidx[d];
    return L->inner ? L->j[d] : AT_NONE;
}

/* Node v's position at the kernel's current position: F's leading dims
 * for a lead value, else numpy's trailing alignment (index 0 where v is
 * broadcast). */
static void default_pos(const lower *L, int v, at_pos *p) {
    const em_meta *m = &L->g->nodes[v].meta;
    const sc_group *gr = &L->s->groups[L->gi];
    int shift = is_lead(L, v) ? 0 : gr->ndim - m->ndim;
    p->n = m->ndim;
    for (int md = 0; md < m->ndim; md++) {
        int d = md + shift;
        bool in = d >= 0 && d < gr->ndim;
        bool unit = m->sizes[md] == 1 && !(in && gr->sizes[d] == 1 && unit_varies(L, v, md));
        p->at[md] = !in || unit ? AT_ZERO : f_index(L, d);
    }
}

static bool same_pos(const at_pos *a, const at_pos *b) {
    return a->n == b->n && !memcmp(a->at, b->at, sizeof(int) * (size_t)a->n);
}

/* Operand u = in[k] of pointwise node v at q, for v at p: numpy's
 * trailing alignment, index 0 where u is broadcast. */
static void align_pos(const lower *L, int v, int k, const at_pos *p, at_pos *q) {
    const em_meta *vm = &L->g->nodes[v].meta, *um = &L->g->nodes[L->g->nodes[v].in[k]].meta;
    int shift = vm->ndim - um->ndim;
    q->n = um->ndim;
    for (int md = 0; md < um->ndim; md++)
        q->at[md] = um->sizes[md] == 1 && vm->sizes[md + shift] != 1 ? AT_ZERO : p->at[md + shift];
}

/* start + step * x, for a slice (x an index or AT_ZERO). */
static int sliced(lower *L, int x, int64_t start, int64_t step) {
    if (x == AT_ZERO) return start ? ci(L, start) : AT_ZERO;
    if (step != 1) x = kir_alu(L->k, KA_MUL, x, ci(L, step), -1);
    return start ? kir_alu(L->k, KA_ADD, x, ci(L, start), -1) : x;
}

/* A reshape that is not only unit dims: the row-major linear index of p,
 * taken apart over the input's sizes. */
static bool reshape_linear(lower *L, int v, const at_pos *p, at_pos *q) {
    const em_meta *m = &L->g->nodes[v].meta, *um = &L->g->nodes[L->g->nodes[v].in[0]].meta;
    int64_t cv[EM_MAX_DIMS], cu[EM_MAX_DIMS];
    em_contiguous_strides(m->ndim, m->sizes, cv);
    em_contiguous_strides(um->ndim, um->sizes, cu);
    int lin = -1;
    for (int d = 0; d < m->ndim; d++) {
        if (p->at[d] == AT_NONE) return false;
        if (p->at[d] == AT_ZERO) continue;
        int t = cv[d] == 1 ? p->at[d] : kir_alu(L->k, KA_MUL, p->at[d], ci(L, cv[d]), -1);
        lin = lin < 0 ? t : kir_alu(L->k, KA_ADD, lin, t, -1);
    }
    if (lin < 0) lin = ci(L, 0);
    q->n = um->ndim;
    for (int d = 0; d < um->ndim; d++) {
        if (um->sizes[d] == 1) {
            q->at[d] = AT_ZERO;
            continue;
        }
        int x = cu[d] == 1 ? lin : kir_alu(L->k, KA_IDIV, lin, ci(L, cu[d]), -1);
        q->at[d] = d == 0 ? x : kir_alu(L->k, KA_MOD, x, ci(L, um->sizes[d]), -1);
    }
    return true;
}

/* Dims [o, o2) of the reshape's result and [i, i2) of its input that
 * hold the same elements, the smallest such groups from o and i on (a
 * group of one input dim is a split, of one result dim a merge); false
 * when there is none (a size 0). */
static bool reshape_group(const em_meta *m, const em_meta *um, int o, int i, int *o2, int *i2) {
    int64_t po = 1, pi = 1;
    *o2 = o, *i2 = i;
    if (*o2 < m->ndim) po *= m->sizes[(*o2)++];
    if (*i2 < um->ndim) pi *= um->sizes[(*i2)++];
    while (po != pi) {
        if (po < pi && *o2 < m->ndim) po *= m->sizes[(*o2)++];
        else if (pi < po && *i2 < um->ndim) pi *= um->sizes[(*i2)++];
        else return false;
    }
    return po > 0;
}

/* The same as reshape_linear, a group of dims at a time (reshape_group):
 * an input dim that the reshape splits is the affine sum of its result
 * dims' indices, with no division; only dims that it merges are taken
 * apart.  (The split-reduction pass's views, [R, C] -> [R, S, C / S],
 * stay affine, so the kernel's loads stay vectorizable.) */
static bool reshape_pos(lower *L, int v, const at_pos *p, at_pos *q) {
    const em_meta *m = &L->g->nodes[v].meta, *um = &L->g->nodes[L->g->nodes[v].in[0]].meta;
    for (int d = 0; d < m->ndim; d++)
        if (p->at[d] == AT_NONE) return false;
    for (int o = 0, i = 0, o2, i2; o < m->ndim || i < um->ndim; o = o2, i = i2)
        if (!reshape_group(m, um, o, i, &o2, &i2)) return reshape_linear(L, v, p, q);
    at_pos r = {.n = um->ndim};
    for (int o = 0, i = 0, o2, i2; o < m->ndim || i < um->ndim; o = o2, i = i2) {
        reshape_group(m, um, o, i, &o2, &i2);
        int lin = -1;
        int64_t stride = 1; /* elements of the group's result dims after d */
        for (int d = o2 - 1; d >= o; d--) {
            if (p->at[d] != AT_ZERO && m->sizes[d] != 1) {
                int t = stride == 1 ? p->at[d] : kir_alu(L->k, KA_MUL, p->at[d], ci(L, stride), -1);
                lin = lin < 0 ? t : kir_alu(L->k, KA_ADD, lin, t, -1);
            }
            stride *= m->sizes[d];
        }
        int64_t below = 1; /* elements of the group's input dims after d */
        for (int d = i2 - 1; d >= i; d--) {
            if (um->sizes[d] == 1 || lin < 0) {
                r.at[d] = AT_ZERO;
            } else {
                int x = below == 1 ? lin : kir_alu(L->k, KA_IDIV, lin, ci(L, below), -1);
                r.at[d] = d == i ? x : kir_alu(L->k, KA_MOD, x, ci(L, um->sizes[d]), -1);
            }
            below *= um->sizes[d];
        }
    }
    *q = r;
    return true;
}

/* The position q of view v's input that v's position p shows. */
static bool view_pos(lower *L, int v, const at_pos *p, at_pos *q) {
    const tr_node *n = &L->g->nodes[v];
    const em_meta *um = &L->g->nodes[n->in[0]].meta;
    int map[EM_MAX_DIMS];
    q->n = um->ndim;
    if (sc_view_unit_map(L->g, v, map)) {
        for (int d = 0; d < um->ndim; d++) q->at[d] = AT_ZERO;
        for (int d = 0; d < n->meta.ndim; d++)
            if (map[d] >= 0) q->at[map[d]] = p->at[d];
        return true;
    }
    switch (n->op) {
    case EM_OP_SLICE:
        *q = *p;
        if (p->at[n->attrs.dim] == AT_NONE) return false;
        q->at[n->attrs.dim] = sliced(L, p->at[n->attrs.dim], n->attrs.start, n->attrs.step);
        return true;
    case EM_OP_PERMUTE:
        for (int d = 0; d < n->attrs.ndims; d++) q->at[n->attrs.dims[d]] = p->at[d];
        return true;
    case EM_OP_EXPAND:
        for (int d = 0; d < um->ndim; d++)
            q->at[d] = um->sizes[d] == 1 ? AT_ZERO : p->at[d + n->meta.ndim - um->ndim];
        return true;
    case EM_OP_RESHAPE: return reshape_pos(L, v, p, q);
    default: return false;
    }
}

/* Operand k of node v at the current position (p NULL), or for v at p:
 * what a view shows there, or numpy's alignment. */
static int operand(lower *L, int v, int k, const at_pos *p) {
    int u = L->g->nodes[v].in[k];
    if (!p) return value(L, u);
    at_pos q;
    if (sc_is_view(&L->g->nodes[v]) ? !view_pos(L, v, p, &q) : (align_pos(L, v, k, p, &q), false)) {
        fail(L, "a view's position is needed per row");
        return -1;
    }
    return value_at(L, u, &q);
}

static int memo_get(const lower *L, int v, const at_pos *p) {
    for (int i = L->nmemo - 1; i >= 0; i--) {
        const struct at_memo *e = &L->memo[i];
        if (e->v == v && same_pos(&e->p, p) && (!e->inner || (L->inner && e->pass == L->t->pass)))
            return e->val;
    }
    return -1;
}

static void memo_put(lower *L, int v, const at_pos *p, int val) {
    if (L->nmemo == L->capmemo) {
        int cap = L->capmemo ? 2 * L->capmemo : 32;
        struct at_memo *m = em_malloc(sizeof *m * (size_t)cap);
        if (!m) { /* no memo: the value is emitted again where needed */
            em_clear_error();
            return;
        }
        if (L->memo) memcpy(m, L->memo, sizeof *m * (size_t)L->nmemo);
        em_free(L->memo);
        L->memo = m;
        L->capmemo = cap;
    }
    L->memo[L->nmemo++] = (struct at_memo){.v = v, .val = val, .p = *p, .pass = L->t->pass, .inner = L->inner};
}

/* Buffer node v's element at p (its strides in memory). */
static int load_at(lower *L, int v, const at_pos *p) {
    int b = L->t->buf_of[v];
    int64_t mem[EM_MAX_DIMS];
    const int64_t *st = mem_strides(L, v, mem);
    int off = -1;
    for (int md = 0; md < p->n; md++) {
        if (p->at[md] == AT_ZERO || st[md] == 0) continue;
        int t = st[md] == 1 ? p->at[md] : kir_alu(L->k, KA_MUL, p->at[md], ci(L, st[md]), -1);
        off = off < 0 ? t : kir_alu(L->k, KA_ADD, off, t, -1);
    }
    int x = kir_load(L->k, L->param[b], off < 0 ? ci(L, 0) : off);
    em_dtype d = L->g->nodes[v].meta.dtype;
    return is_half(d) ? kir_convert(L->k, x, EM_F32) : x;
}

static int compute(lower *L, int v, const at_pos *p);

/* Node v's value at position p of its own: at the current position, the
 * usual value (and its caches); elsewhere, loaded there or computed
 * from its operands there.  A reduction of the kernel has its row only. */
static int value_at(lower *L, int v, const at_pos *p) {
    if (L->failed) return -1;
    at_pos here;
    default_pos(L, v, &here);
    if (same_pos(p, &here)) return value(L, v);
    int r = memo_get(L, v, p);
    if (r >= 0) return r;
    for (int md = 0; md < p->n; md++)
        if (p->at[md] == AT_NONE) {
            fail(L, "a value that varies along the row is needed per row");
            return -1;
        }
    if (is_leaf(L, v) && L->t->buf_of[v] >= 0) r = load_at(L, v, p);
    else if (is_leaf(L, v) || sc_is_reduction(&L->g->nodes[v])) fail(L, "a row value read at another row");
    else r = compute(L, v, p);
    if (r < 0) L->failed = true;
    else memo_put(L, v, p, r);
    return r;
}

/* Node v's value computed at p (NULL: the current position). */
/* Whether node v is a row statistic: a reduction, or computed from
 * reductions and constants alone (sum + eps, sqrt(var)); depth bounds the
 * walk. */
static bool row_stat(const tr_graph *g, int v, int depth) {
    const tr_node *n = &g->nodes[v];
    if (n->kind != TR_CALL || depth > 16) return false;
    if (sc_is_reduction(n)) return true;
    em_op_kind k = em_op_table[n->op].kind;
    if (k == EM_KIND_CREATE) return n->op == EM_OP_FULL;
    if (k != EM_KIND_UNARY && k != EM_KIND_BINARY && k != EM_KIND_TERNARY && k != EM_KIND_VIEW) return false;
    bool any = false; /* at least one reduction below, not constants alone */
    for (int i = 0; i < n->nin; i++) {
        const tr_node *u = &g->nodes[n->in[i]];
        if (u->kind == TR_CALL && u->op == EM_OP_FULL) continue;
        if (!row_stat(g, n->in[i], depth + 1)) return false;
        any = true;
    }
    return any;
}

static int compute(lower *L, int v, const at_pos *p) {
    const tr_node *n = &L->g->nodes[v];
    /* the fill value converted as the eager kernel does (em_f64_to_int) */
    if (n->op == EM_OP_FULL) {
        em_dtype d = n->meta.dtype;
        if (is_half(d)) /* the half value, in f32 (rounded as a store would) */
            return kir_convert(L->k, kir_convert(L->k, kir_const_f(L->k, EM_F32, n->attrs.value), d),
                               EM_F32);
        return em_dtype_is_float(d) ? kir_const_f(L->k, d, n->attrs.value)
                                    : kir_const_i(L->k, d, em_f64_to_int(n->attrs.value, d));
    }
    if (n->op == EM_OP_CAST) { /* to a half type: rounded, and computed on in f32 */
        int x = kir_convert(L->k, operand(L, v, 0, p), n->meta.dtype);
        return is_half(n->meta.dtype) ? kir_convert(L->k, x, EM_F32) : x;
    }
    if (n->op == EM_OP_CONTIGUOUS || sc_is_view(n)) return operand(L, v, 0, p);
    if (sc_is_reduction(n)) {
        fail(L, "a reduction used before its pass");
        return -1;
    }
    k_alu a = kir_alu_of_op(n->op); /* the op table's alu column */
    if (a == KA_NONE) {
        fail(L, em_op_table[n->op].name);
        return -1;
    }
    int x = n->nin > 0 ? operand(L, v, 0, p) : -1, y = n->nin > 1 ? operand(L, v, 1, p) : -1,
        z = n->nin > 2 ? operand(L, v, 2, p) : -1;
    /* x / y with y a row statistic (softmax's sum): x * (1/y), whose 1/y
     * the compiler hoists out of the row's loop; a division per element
     * costs ~10x a multiply (results may differ from eager in the last
     * bit).  The choice is the node's, never the position's: a value and
     * a view of it recomputed at another position must have the same bits
     * (test_fuzz's seed 105 found x < squeeze(x) true when one position
     * took the reciprocal and the other divided). */
    if (a == KA_DIV && row_stat(L->g, n->in[1], 0))
        return kir_alu(L->k, KA_MUL, x,
                       kir_alu(L->k, KA_DIV, kir_const_f(L->k, compute_dtype(n->meta.dtype), 1.0), y, -1),
                       -1);
    return kir_alu(L->k, a, x, y, z);
}

static int value(lower *L, int v) {
    if (L->failed) return -1;
    if (row_get(L, v) >= 0) return row_get(L, v);
    if (L->inner && full_get(L, v) >= 0) return full_get(L, v);
    if (!L->inner && varies_inner(L, v)) {
        fail(L, "a value that varies along the row is needed per row");
        return -1;
    }
    int r;
    if (is_leaf(L, v)) {
        int b = L->t->buf_of[v];
        r = load(L, b, offset(L, b));
    } else if (sc_is_view(&L->g->nodes[v]) || is_lead(L, v)) {
        at_pos here; /* its operands are elsewhere than F's alignment says */
        default_pos(L, v, &here);
        r = compute(L, v, &here);
    } else {
        r = compute(L, v, NULL);
    }
    if (r < 0) L->failed = true;
    if (L->inner) full_put(L, v, r);
    else row_put(L, v, r);
    return r;
}

/* Opens the inner loops (j over each inner dim). */
static void open_inner(lower *L) {
    for (int d = L->no; d < L->nd; d++) L->j[d] = kir_range(L->k, ci(L, L->sizes[d]), 0);
    L->inner = true;
    L->t->pass++; /* forgets every value of the previous pass */
}

static void close_inner(lower *L) {
    for (int d = L->no; d < L->nd; d++) kir_end(L->k);
    L->inner = false;
}

static int64_t inner_count(const lower *L) {
    int64_t n = 1;
    for (int d = L->no; d < L->nd; d++) n *= L->sizes[d];
    return n;
}

/* One pass over the row accumulating x (a function of the position). */
static int reduce_pass(lower *L, int input, k_alu combine, em_dtype acc_dtype, int center) {
    int c;
    if (em_dtype_is_float(acc_dtype)) {
        c = kir_const_f(L->k, acc_dtype, combine == KA_ADD ? 0 : combine == KA_MAX ? -INFINITY : INFINITY);
    } else if (combine == KA_ADD) {
        c = kir_const_i(L->k, acc_dtype, 0);
    } else {
        int64_t lo = acc_dtype == EM_I32 ? INT32_MIN : acc_dtype == EM_BOOL ? 0 : INT64_MIN;
        int64_t hi = acc_dtype == EM_I32 ? INT32_MAX : acc_dtype == EM_BOOL ? 1 : INT64_MAX;
        c = kir_const_i(L->k, acc_dtype, combine == KA_MAX ? lo : hi);
    }
    int acc = kir_acc(L->k, combine, c);
    open_inner(L);
    if (L->early_state == 2) /* read back what the first pass kept */
        full_put(L, L->early_node, load(L, L->stash_buf, offset(L, L->stash_buf)));
    int x = value(L, input);
    if (L->early_state == 1 && input == L->early_node) {
        store(L, L->stash_buf, offset(L, L->stash_buf), x);
        L->early_state = 2;
    }
    if (L->stash_pending && input == L->stash_node) {
        store(L, L->stash_buf, offset(L, L->stash_buf), x);
        L->stash_pending = false;
    }
    if (compute_dtype(L->g->nodes[input].meta.dtype) != acc_dtype) x = kir_convert(L->k, x, acc_dtype);
    if (center >= 0) {
        int d = kir_alu(L->k, KA_SUB, x, center, -1);
        x = kir_alu(L->k, KA_MUL, d, d, -1);
    }
    kir_acc_update(L->k, acc, x);
    close_inner(L);
    return acc;
}

/* The row's element count as a float of dtype dt, minus correction,
 * at least 0.  It is an i64 constant converted in the kernel, so that with
 * dynamic shapes it can become a size parameter (kir_parametrize). */
static int row_count(lower *L, em_dtype dt, int correction) {
    int c = ci(L, inner_count(L));
    if (correction) c = kir_alu(L->k, KA_MAX, kir_alu(L->k, KA_SUB, c, ci(L, correction), -1), ci(L, 0), -1);
    return kir_cast(L->k, c, dt);
}

/* The value of a mean of v's input over the same dims, lowered earlier in
 * this kernel, or -1.  layer_norm takes the mean (to center x), then the
 * var, whose first pass is that very mean: the same accumulation of the
 * same values, divided by the same count.  Reusing it drops one pass
 * over the row (libgccjit time: the layer norms were the longest kernels
 * of the MiniLM and GPT-2 compiles), with bit-identical values. */
static int same_mean(const lower *L, int v) {
    const tr_node *n = &L->g->nodes[v];
    for (int m = 0; m < L->nmembers && L->members[m] != v; m++) {
        const tr_node *c = &L->g->nodes[L->members[m]];
        if (c->op == EM_OP_MEAN && c->in[0] == n->in[0] && c->meta.dtype == n->meta.dtype &&
            c->attrs.ndims == n->attrs.ndims && c->attrs.keepdim == n->attrs.keepdim &&
            !memcmp(c->attrs.dims, n->attrs.dims, sizeof(int) * (size_t)n->attrs.ndims))
            return row_get(L, L->members[m]);
    }
    return -1;
}

static void lower_reduction(lower *L, int v) {
    const tr_node *n = &L->g->nodes[v];
    em_dtype dt = compute_dtype(n->meta.dtype); /* half rows accumulate in f32 */
    int r;
    switch (n->op) {
    case EM_OP_AMAX: r = reduce_pass(L, n->in[0], KA_MAX, dt, -1); break;
    case EM_OP_AMIN: r = reduce_pass(L, n->in[0], KA_MIN, dt, -1); break;
    case EM_OP_SUM: r = reduce_pass(L, n->in[0], KA_ADD, dt, -1); break;
    case EM_OP_MEAN:
        r = kir_alu(L->k, KA_DIV, reduce_pass(L, n->in[0], KA_ADD, dt, -1), row_count(L, dt, 0), -1);
        break;
    default: { /* var: two passes, as the eager kernel, to avoid cancellation */
        int mean = same_mean(L, v);
        if (mean < 0)
            mean = kir_alu(L->k, KA_DIV, reduce_pass(L, n->in[0], KA_ADD, dt, -1), row_count(L, dt, 0), -1);
        r = kir_alu(L->k, KA_DIV, reduce_pass(L, n->in[0], KA_ADD, dt, mean),
                    row_count(L, dt, n->attrs.correction), -1);
    }
    }
    if (r < 0) L->failed = true;
    row_put(L, v, r);
}

/* Starts a call on the schedule's per-node tables; bufs (room for a
 * buffer per node) gets the buffer list. */
static void begin_tables(lower *L, int *bufs) {
    L->bufs = bufs;
    L->t->call++;
    L->t->nrow = 0;
}

/* The per-buffer tables, once the buffers are known (each entry is
 * written before it is read, so none is initialised here).  Sized by the
 * group's buffers, not the graph's nodes: a table per kernel of the
 * graph's size was O(nodes) per kernel (6.4 MB each at 100k nodes). */
static bool alloc_tables(lower *L) {
    size_t n = (size_t)L->nbufs + 1;
    L->strides = em_malloc(sizeof *L->strides * n);
    L->param = em_malloc(sizeof(int) * n);
    L->row_base = em_malloc(sizeof(int) * n);
    return L->strides && L->param && L->row_base;
}

/* Frees the per-buffer tables and resets what this call set in the
 * schedule's per-node ones. */
static void free_tables(lower *L) {
    for (int b = 0; b < L->nbufs; b++) L->t->buf_of[L->bufs[b]] = -1;
    for (int i = 0; i < L->t->nrow; i++) L->t->row_val[L->t->row_set[i]] = -1;
    L->t->nrow = 0;
    em_free(L->strides);
    em_free(L->param);
    em_free(L->row_base);
    em_free(L->memo);
}

/* With a stash buffer chosen: keeps the first reduction's input there too,
 * when it is another computed value that varies along the row, of the
 * buffer's dtype.  Each pass reads element i before it writes element i,
 * so the two values share the buffer. */
static void choose_early(lower *L, int last) {
    const tr_graph *g = L->g;
    int first = -1;
    for (int m = 0; m < L->nmembers && first < 0; m++)
        if (sc_is_reduction(&g->nodes[L->members[m]])) first = L->members[m];
    if (first < 0 || first == last) return;
    int f = g->nodes[first].in[0];
    if (f == L->stash_node || is_leaf(L, f) || !varies_inner(L, f) ||
        g->nodes[f].meta.dtype != g->nodes[L->stash_node].meta.dtype)
        return;
    L->early_node = f;
    L->early_state = 1;
}

/* Picks the value to keep between the last reduction pass and the final
 * pass: that reduction's input, when it is computed (not loaded), varies
 * along the row, and a full-size stored output of its dtype can hold it. */
static void choose_stash(lower *L, int nin) {
    const tr_graph *g = L->g;
    L->stash_node = L->stash_buf = -1;
    L->stash_pending = false;
    L->early_node = -1;
    L->early_state = 0;
    int last = -1;
    for (int m = 0; m < L->nmembers; m++)
        if (sc_is_reduction(&g->nodes[L->members[m]])) last = L->members[m];
    if (last < 0 || g->nodes[last].op == EM_OP_VAR) return;
    int e = g->nodes[last].in[0];
    em_dtype d = g->nodes[e].meta.dtype;
    /* a half buffer would round what the last pass reads back */
    if (is_leaf(L, e) || !varies_inner(L, e) || !em_dtype_is_float(d) || is_half(d)) return;
    for (int b = nin; b < L->nbufs; b++) {
        int v = L->bufs[b];
        if (varies_inner(L, v) && g->nodes[v].meta.dtype == d) {
            L->stash_node = e;
            L->stash_buf = b;
            L->stash_pending = true;
            choose_early(L, last);
            return;
        }
    }
}

/* The body: the outer loop and everything inside it. */
static void emit(lower *L, int nin) {
    const tr_graph *g = L->g;
    int64_t outer = 1;
    for (int d = 0; d < L->no; d++) outer *= L->sizes[d];
    L->o = L->tile ? kir_range_tiled(L->k, ci(L, outer), ci(L, L->sizes[L->no - 1]))
                   : kir_range(L->k, ci(L, outer), K_PARALLEL);
    int rem = L->o;
    for (int d = L->no - 1; d >= 0; d--) { /* o's multi-index, innermost first */
        if (d == 0) {
            L->oidx[d] = rem;
            break;
        }
        L->oidx[d] = kir_alu(L->k, KA_MOD, rem, ci(L, L->sizes[d]), -1);
        rem = kir_alu(L->k, KA_IDIV, rem, ci(L, L->sizes[d]), -1);
    }
    /* every buffer's row offset, once per row (the compiler drops unused ones) */
    for (int b = 0; b < L->nbufs; b++) {
        int off = -1;
        for (int d = 0; d < L->no; d++) {
            if (L->strides[b][d] == 0) continue;
            int t = L->strides[b][d] == 1 ? L->oidx[d]
                                          : kir_alu(L->k, KA_MUL, L->oidx[d], ci(L, L->strides[b][d]), -1);
            off = off < 0 ? t : kir_alu(L->k, KA_ADD, off, t, -1);
        }
        L->row_base[b] = off < 0 ? ci(L, 0) : off;
    }
    choose_stash(L, nin);
    for (int m = 0; m < L->nmembers; m++)
        if (sc_is_reduction(&g->nodes[L->members[m]])) lower_reduction(L, L->members[m]);
    /* stored values: per row first, then one pass for the full ones */
    bool any_full = false;
    for (int b = nin; b < L->nbufs; b++) {
        int v = L->bufs[b];
        if (varies_inner(L, v)) {
            any_full = true;
            continue;
        }
        store(L, b, offset(L, b), value(L, v));
    }
    if (any_full) {
        open_inner(L);
        if (L->stash_node >= 0 && !L->stash_pending)
            full_put(L, L->stash_node, load(L, L->stash_buf, offset(L, L->stash_buf)));
        for (int b = nin; b < L->nbufs; b++)
            if (varies_inner(L, L->bufs[b])) store(L, b, offset(L, b), value(L, L->bufs[b]));
        close_inner(L);
    }
    kir_end(L->k);
}

k_kernel *sc_lower(const sc_schedule *s, int gi, int *bufs, int *nbufs, int *nouts) {
    lower L = {.s = s, .g = s->g, .gi = gi, .t = s->tables, .members = s->members + s->member_start[gi],
               .nmembers = s->member_start[gi + 1] - s->member_start[gi]};
    const sc_group *gr = &s->groups[gi];
    const tr_graph *g = s->g;
    k_kernel *k = NULL;
    begin_tables(&L, bufs);
    /* inputs: every leaf the stored values and the reductions read */
    for (int m = 0; m < L.nmembers; m++) {
        int v = L.members[m];
        if (s->materialized[v] || sc_is_reduction(&g->nodes[v])) {
            const tr_node *n = &g->nodes[v];
            for (int i = 0; i < n->nin; i++) collect(&L, n->in[i]);
        }
    }
    int nin = L.nbufs;
    for (int m = 0; m < L.nmembers; m++)
        if (s->materialized[L.members[m]]) add_buf(&L, L.members[m]);
    if (!alloc_tables(&L)) goto done;
    bool keep[EM_MAX_DIMS] = {0};
    for (int b = 0; b < L.nbufs; b++) buf_strides(&L, b, gr, L.strides[b], keep);
    /* a pointwise kernel merges across all its dims: when they all merge it
     * is one flat parallel loop; otherwise its last dim is the inner loop */
    merge_dims(&L, gr, gr->k > 0 ? gr->k : 0, keep);
    if (gr->k <= 0 && L.nd > 1) L.no = L.nd - 1;
    for (int b = 0; gr->k <= 0 && !L.positional && b < nin; b++) L.tile = L.tile || transposed(&L, b);
    /* Every kernel is called "k": the name is part of the kernel IR's text,
     * hence of the cache key, and a positional name ("k3") gave identical
     * kernels at different places of a graph different keys.  Each kernel
     * lives in its own shared object or module, so the names never meet. */
    L.k = k = kir_new(JIT_KERNEL_NAME);
    if (!k) goto done;
    for (int b = 0; b < L.nbufs; b++) L.param[b] = kir_buf(k, g->nodes[L.bufs[b]].meta.dtype);
    emit(&L, nin);
    /* not verified here: the code generator it goes to runs kir_verify,
     * once per kernel */
    if (L.failed || k->failed) {
        kir_free(k);
        k = NULL;
        goto done;
    }
    *nbufs = L.nbufs;
    *nouts = L.nbufs - nin;
done:
    free_tables(&L);
    return k;
}
