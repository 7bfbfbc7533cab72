/* attention.c - the attention pass: hand-written attention and
 * em_scaled_dot_product_attention's decomposition, as captured, become one
 * attention node (ops.def), as Inductor's fuse_attention.py rewrites them
 * into scaled_dot_product_attention.
 *
 * Matched, from the second matmul back (P = softmax(X) along the last dim,
 * as em_softmax records it: div(exp(sub(X, amax(X))), sum(exp(...)))):
 *
 *   out = matmul(P, v)
 *   X   = where(future, -inf, S') | where(keep, S', -inf)   causal, at most once
 *       | add(S', mask) | add(mask, S')                      at most once, before any scale
 *       | mul(S', c) | mul(c, S') | div(S', c)                c a one-element full()
 *   S   = matmul(q', permute(k', last two dims swapped))      q', k' may carry scales too
 *
 * where future is j > i and keep j <= i for i = unsqueeze(arange(0, Tq), 1)
 * and j = unsqueeze(arange(0, Tk), 0) (gt/lt/le/ge either way round), as
 * GPT-2 code and the decomposition build them.  A scale applied to the
 * masked scores ((S + m) * c) is not the kernel's formula, and a -inf fill
 * stays -inf only under a positive scale: both are left alone.  Every
 * value between S and out must have no other reader and not be an
 * output (the probabilities returned, the scores reused): then nothing is
 * fused, since the unfused values would be computed anyway.  q, k, v,
 * the mask and out share one dtype: f32, or f16/bf16 where the device's
 * fused op takes it (tr_fuse_attention_for), whose softmax em_softmax
 * computes in f32 between two casts, both matched too:
 *
 *   out = matmul(cast(P, half), v),  P = softmax(cast(X, f32)),  X half
 *
 * The fused kernel keeps the scores in f32 (FlashAttention's rounding,
 * not the graph's, which rounds S, its scaling and masking to half).
 * Under autocast an f32 program's matmuls cast their operands, so k^T is
 * cast(permute(k)) and the causal fill cast(full(-inf)): matched too, the
 * cast (read by the scores only) rewritten into the cast of k itself,
 * the fused node's k.  The attention node takes out's place (its inputs
 * all come before it) and tr_dce drops what died. */
#include "trace.h"

#include <math.h>
#include <string.h>

/* What a match found: the fused node's inputs and attributes. */
typedef struct attn_match {
    int q, k, v, mask; /* mask -1: none */
    em_dtype dt;       /* of q, k, v, the mask and out */
    int kcast;         /* autocast's cast(permute(k)) to dt, or -1 (k is k) */
    double scale;
    bool causal;
    bool scaled;       /* a scale was seen (walking from the softmax back) */
    int steps;         /* nodes walked: the walk recurses, and a graph can
                          chain 100k scalings (MAX_STEPS bounds the stack) */
} attn_match;

#define MAX_STEPS 64

typedef struct attn_graph {
    const tr_graph *g;
    int *uses;         /* readers of each node, outputs counted */
    tr_attention_takes takes; /* half attention (NULL: f32 only) */
    void *ctx;         /* takes' */
} attn_graph;

static const tr_node *node(const attn_graph *a, int i) { return &a->g->nodes[i]; }

static bool is_call(const attn_graph *a, int i, em_op op) {
    return node(a, i)->kind == TR_CALL && node(a, i)->op == op;
}

/* Whether node i is read only by the chain (readers times) and is not an
 * output. */
static bool private_value(const attn_graph *a, int i, int readers) { return a->uses[i] == readers; }

static bool same_sizes(const em_meta *x, const em_meta *y) {
    return x->ndim == y->ndim && !memcmp(x->sizes, y->sizes, sizeof(int64_t) * (size_t)x->ndim);
}

/* A reduction of i's input over its last dim only, keeping it. */
static bool last_dim_reduce(const attn_graph *a, int i, em_op op, int x) {
    const tr_node *n = node(a, i);
    return is_call(a, i, op) && n->in[0] == x && n->attrs.ndims == 1 && n->attrs.keepdim &&
           n->attrs.dims[0] == node(a, x)->meta.ndim - 1;
}

/* P = softmax(X) over the last dim, its intermediates private: *x = X. */
static bool softmax_of(const attn_graph *a, int p, int *x) {
    if (!is_call(a, p, EM_OP_DIV) || !private_value(a, p, 1)) return false;
    int e = node(a, p)->in[0], s = node(a, p)->in[1];
    if (!is_call(a, e, EM_OP_EXP) || !private_value(a, e, 2) || !private_value(a, s, 1)) return false;
    int d = node(a, e)->in[0];
    if (!is_call(a, d, EM_OP_SUB) || !private_value(a, d, 1)) return false;
    int xx = node(a, d)->in[0], m = node(a, d)->in[1];
    if (!last_dim_reduce(a, m, EM_OP_AMAX, xx) || !private_value(a, m, 1) ||
        !last_dim_reduce(a, s, EM_OP_SUM, e))
        return false;
    *x = xx;
    return true;
}

/* The value of a one-element full() node, or NAN when i is not one. */
static double scalar_value(const attn_graph *a, int i) {
    const tr_node *n = node(a, i);
    if (!is_call(a, i, EM_OP_FULL) || em_shape_numel(n->meta.ndim, n->meta.sizes) != 1) return NAN;
    return n->attrs.value;
}

/* A where's fill: scalar_value, or an infinite one through a cast
 * (autocast's of the -inf fill, which any float type keeps). */
static double fill_value(const attn_graph *a, int i) {
    if (!is_call(a, i, EM_OP_CAST)) return scalar_value(a, i);
    double v = scalar_value(a, node(a, i)->in[0]);
    return isinf(v) && em_dtype_is_float(node(a, i)->meta.dtype) ? v : NAN;
}

/* unsqueeze(arange(0, n, 1), dim): the index along dim (0: a row of key
 * indices [1, n], 1: a column of query indices [n, 1]); its n or -1. */
static int64_t index_vector(const attn_graph *a, int i, int dim) {
    const tr_node *n = node(a, i);
    if (!is_call(a, i, EM_OP_UNSQUEEZE) || n->attrs.dim != dim) return -1;
    int r = n->in[0];
    const tr_node *ar = node(a, r);
    if (!is_call(a, r, EM_OP_ARANGE) || ar->attrs.fstart != 0 || ar->attrs.fstep != 1 ||
        ar->meta.ndim != 1 || ar->meta.sizes[0] > (1 << 24)) /* exact in any dtype */
        return -1;
    return ar->meta.sizes[0];
}

/* +1: c is j > i (the future keys), -1: j <= i (the kept ones), 0:
 * neither; for i over Tq queries and j over Tk keys. */
static int causal_kind(const attn_graph *a, int c, int64_t Tq, int64_t Tk) {
    const tr_node *n = node(a, c);
    if (n->kind != TR_CALL || n->nin != 2) return 0;
    int x = n->in[0], y = n->in[1];
    bool ji = index_vector(a, x, 0) == Tk && index_vector(a, y, 1) == Tq; /* op(j, i) */
    bool ij = index_vector(a, x, 1) == Tq && index_vector(a, y, 0) == Tk; /* op(i, j) */
    switch (n->op) {
    case EM_OP_GT: return ji ? 1 : 0;  /* j > i */
    case EM_OP_LT: return ij ? 1 : 0;  /* i < j */
    case EM_OP_LE: return ji ? -1 : 0; /* j <= i */
    case EM_OP_GE: return ij ? -1 : 0; /* i >= j */
    default: return 0;
    }
}

static bool is_dtype(const attn_graph *a, int i, em_dtype dt) { return node(a, i)->meta.dtype == dt; }

/* k' of S = matmul(q', b): b is k'^T (a permute swapping the last two
 * dims), possibly scaled before or after the permute. */
static bool key_of(const attn_graph *a, int b, attn_match *m);

/* x scaled by a scalar: *inner = x, m->scale multiplied. */
static bool peel_scale(const attn_graph *a, int i, attn_match *m, int *inner) {
    const tr_node *n = node(a, i);
    if (n->kind != TR_CALL || (n->op != EM_OP_MUL && n->op != EM_OP_DIV)) return false;
    for (int s = 0; s < 2; s++) {
        if (n->op == EM_OP_DIV && s == 0) continue; /* c / x is no scale */
        int c = n->in[s], x = n->in[1 - s];
        double v = scalar_value(a, c);
        if (isnan(v) || !same_sizes(&n->meta, &node(a, x)->meta)) continue;
        if (n->op == EM_OP_DIV && (v == 0 || isinf(v))) continue;
        m->scale *= n->op == EM_OP_DIV ? 1 / v : v;
        m->scaled = true;
        *inner = x;
        return true;
    }
    return false;
}

static bool swaps_last_two(const tr_node *n) {
    int nd = n->attrs.ndims;
    if (nd < 2) return false;
    for (int d = 0; d < nd - 2; d++)
        if (n->attrs.dims[d] != d) return false;
    return n->attrs.dims[nd - 2] == nd - 1 && n->attrs.dims[nd - 1] == nd - 2;
}

/* Autocast's k^T: c = cast(permute(k), m->dt) read by the scores only,
 * k of a float type. */
static bool cast_key_of(const attn_graph *a, int c, attn_match *m) {
    if (!is_call(a, c, EM_OP_CAST) || !is_dtype(a, c, m->dt) || !private_value(a, c, 1)) return false;
    int p = node(a, c)->in[0];
    if (!is_call(a, p, EM_OP_PERMUTE) || !swaps_last_two(node(a, p))) return false;
    m->kcast = c;
    m->k = node(a, p)->in[0];
    return em_dtype_is_float(node(a, m->k)->meta.dtype);
}

static bool key_of(const attn_graph *a, int b, attn_match *m) {
    int inner;
    if (++m->steps > MAX_STEPS) return false;
    if (peel_scale(a, b, m, &inner)) return key_of(a, inner, m);
    if (is_call(a, b, EM_OP_CAST)) return cast_key_of(a, b, m);
    if (!is_call(a, b, EM_OP_PERMUTE) || !swaps_last_two(node(a, b))) return false;
    int k = node(a, b)->in[0];
    while (peel_scale(a, k, m, &inner)) k = inner;
    m->k = k;
    return true;
}

/* S = matmul(q', k'^T) with q' = q scaled or not, read readers times. */
static bool scores_of(const attn_graph *a, int s, int readers, attn_match *m) {
    if (!is_call(a, s, EM_OP_MATMUL) || !private_value(a, s, readers)) return false;
    int q = node(a, s)->in[0], inner;
    if (!key_of(a, node(a, s)->in[1], m)) return false;
    while (peel_scale(a, q, m, &inner)) q = inner;
    m->q = q;
    return node(a, q)->meta.ndim >= 2 && node(a, m->k)->meta.ndim >= 2;
}

/* The chain from x back to the scores matmul; x is read readers times
 * (the softmax's input twice: by amax and sub). */
static bool chain_of(const attn_graph *a, int x, int readers, attn_match *m) {
    const tr_node *n = node(a, x);
    int inner;
    if (++m->steps > MAX_STEPS) return false;
    if (is_call(a, x, EM_OP_MATMUL)) return scores_of(a, x, readers, m);
    if (!private_value(a, x, readers) || n->kind != TR_CALL) return false;
    if (peel_scale(a, x, m, &inner)) return chain_of(a, inner, 1, m);
    const em_meta *sz = &n->meta;
    if (n->op == EM_OP_ADD && m->mask < 0 && !m->scaled) {
        for (int s = 0; s < 2; s++) {
            attn_match t = *m;
            int c = n->in[1 - s], mk = n->in[s];
            t.mask = mk;
            if (is_dtype(a, mk, m->dt) && same_sizes(sz, &node(a, c)->meta) && chain_of(a, c, 1, &t)) {
                *m = t;
                return true;
            }
        }
        return false;
    }
    /* the fill stays -inf through the scales seen so far only if they are positive */
    if (n->op == EM_OP_WHERE && !m->causal && m->scale > 0 && sz->ndim >= 2) {
        int64_t Tq = sz->sizes[sz->ndim - 2], Tk = sz->sizes[sz->ndim - 1];
        int cond = n->in[0], fa = n->in[1], fb = n->in[2];
        int kind = causal_kind(a, cond, Tq, Tk);
        int chain = kind > 0 && fill_value(a, fa) == -INFINITY ? fb
                  : kind < 0 && fill_value(a, fb) == -INFINITY ? fa : -1;
        if (chain < 0 || !same_sizes(sz, &node(a, chain)->meta)) return false;
        m->causal = true;
        return chain_of(a, chain, 1, m);
    }
    return false;
}

/* A stand-in tensor with meta's shape, dtype and device (no data), for
 * the shape rule em_attention_sizes. */
static void shape_of(const em_meta *meta, em_tensor *t) {
    memset(t, 0, sizeof *t);
    t->ndim = meta->ndim;
    memcpy(t->sizes, meta->sizes, sizeof meta->sizes);
    t->dtype = meta->dtype;
    t->device = meta->device;
}

/* Whether the fused node m would have out's sizes: the two matmuls may
 * broadcast batch dims in ways the op's rule does not (a mask that widens
 * them, say). */
static bool gives_sizes_of(const attn_graph *a, const attn_match *m, int out) {
    const int ins[4] = {m->q, m->k, m->v, m->mask};
    em_tensor t[4];
    for (int i = 0; i < (m->mask >= 0 ? 4 : 3); i++) shape_of(&node(a, ins[i])->meta, &t[i]);
    em_meta want;
    if (em_attention_sizes("attention", &t[0], &t[1], &t[2], m->mask >= 0 ? &t[3] : NULL, &want) != EM_OK) {
        em_clear_error();
        return false;
    }
    return same_sizes(&want, &node(a, out)->meta);
}

/* For half out = matmul(P', v): P' = cast(P, dt) of f32 P, read once;
 * *p = P. */
static bool half_probs(const attn_graph *a, int pc, em_dtype dt, int *p) {
    if (!is_call(a, pc, EM_OP_CAST) || !is_dtype(a, pc, dt) || !private_value(a, pc, 1)) return false;
    *p = node(a, pc)->in[0];
    return is_dtype(a, *p, EM_F32);
}

/* For half scores: softmax's input xc = cast(X, f32) of X of dtype dt,
 * read twice (amax, sub); *x = X. */
static bool half_scores(const attn_graph *a, int xc, em_dtype dt, int *x) {
    if (!is_call(a, xc, EM_OP_CAST) || !private_value(a, xc, 2)) return false;
    *x = node(a, xc)->in[0];
    return is_dtype(a, *x, dt);
}

/* Whether the device takes m's half operands (the head sizes of q, v). */
static bool device_takes(const attn_graph *a, const attn_match *m) {
    const em_meta *q = &node(a, m->q)->meta, *v = &node(a, m->v)->meta;
    return a->takes(a->ctx, m->dt, q->sizes[q->ndim - 1], v->sizes[v->ndim - 1]);
}

/* Whether the node at out is attention, into m. */
static bool match_at(const attn_graph *a, int out, attn_match *m) {
    *m = (attn_match){.mask = -1, .kcast = -1, .scale = 1};
    if (!is_call(a, out, EM_OP_MATMUL)) return false;
    m->dt = node(a, out)->meta.dtype;
    bool half = m->dt == EM_F16 || m->dt == EM_BF16;
    if (m->dt != EM_F32 && !(half && a->takes)) return false;
    int p = node(a, out)->in[0], x;
    if (half && !half_probs(a, p, m->dt, &p)) return false;
    m->v = node(a, out)->in[1];
    if (!softmax_of(a, p, &x) || (half && !half_scores(a, x, m->dt, &x)) || !chain_of(a, x, half ? 1 : 2, m))
        return false;
    int k = m->kcast >= 0 ? m->kcast : m->k; /* the fused node's k */
    if (!is_dtype(a, m->q, m->dt) || !is_dtype(a, k, m->dt) || !is_dtype(a, m->v, m->dt) ||
        node(a, m->v)->meta.ndim < 2)
        return false;
    if (!isfinite(m->scale) || !gives_sizes_of(a, m, out)) return false;
    return !half || device_takes(a, m);
}

/* Makes the cast node c of g (autocast's, of k^T) the cast of k itself:
 * a fresh contiguous result of k's sizes, as the cast's rule gives. */
static void cast_key(tr_graph *g, int c, int k) {
    tr_node *n = &g->nodes[c];
    em_dtype dt = n->meta.dtype;
    n->in[0] = k;
    n->meta = g->nodes[k].meta;
    n->meta.dtype = dt;
    n->meta.offset = 0;
    em_contiguous_strides(n->meta.ndim, n->meta.sizes, n->meta.strides);
}

/* Makes node i of g the attention call m describes. */
static bool rewrite(tr_graph *g, int i, const attn_match *m) {
    tr_node *n = &g->nodes[i];
    int nin = m->mask >= 0 ? 4 : 3;
    int *in = em_malloc(sizeof(int) * 4);
    if (!in) return false;
    if (m->kcast >= 0) cast_key(g, m->kcast, m->k);
    in[0] = m->q, in[1] = m->kcast >= 0 ? m->kcast : m->k, in[2] = m->v, in[3] = m->mask;
    em_free(n->in);
    n->in = in;
    n->nin = nin;
    n->op = EM_OP_ATTENTION;
    memset(&n->attrs, 0, sizeof n->attrs);
    n->attrs.value = m->scale;
    n->attrs.causal = m->causal;
    return true;
}

/* tr_rewrite_fn: node i as its match (ctx: the matches by node). */
static bool rewrite_at(tr_graph *g, int i, void *ctx) { return rewrite(g, i, &((const attn_match *)ctx)[i]); }

tr_graph *tr_fuse_attention_for(const tr_graph *g, tr_attention_takes takes, void *ctx, int *nfused,
                                int *map) {
    *nfused = -1;
    attn_graph a = {g, tr_count_uses(g), takes, ctx};
    attn_match *ms = a.uses ? em_malloc(sizeof *ms * ((size_t)g->nnodes + 1)) : NULL;
    bool *hit = ms ? em_calloc((size_t)g->nnodes + 1, sizeof *hit) : NULL;
    tr_graph *c = NULL;
    int n = 0;
    for (int i = 0; hit && i < g->nnodes; i++) {
        attn_match m; /* kept only on a match: ms is touched per match, not per node */
        if (!(hit[i] = match_at(&a, i, &m))) continue;
        ms[i] = m;
        n++;
    }
    if (hit) *nfused = n;
    if (n > 0) c = tr_copy_rewritten(g, hit, rewrite_at, ms, map);
    if (n > 0 && !c) *nfused = -1;
    em_free(a.uses);
    em_free(ms);
    em_free(hit);
    return c;
}

tr_graph *tr_fuse_attention_map(const tr_graph *g, int *nfused, int *map) {
    return tr_fuse_attention_for(g, NULL, NULL, nfused, map);
}

tr_graph *tr_fuse_attention(const tr_graph *g, int *nfused) {
    return tr_fuse_attention_for(g, NULL, NULL, nfused, NULL);
}
