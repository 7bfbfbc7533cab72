/* linear.c - the linear pass: a matmul whose one reader adds a bias along
 * its rows becomes one linear node (ops.def: a @ w + bias), for a device
 * whose matmul kernel adds the bias as it writes the product, so that the
 * add needs no kernel of its own (PyTorch's addmm).
 *
 * Matched: add(matmul(a, w), bias) or add(bias, matmul(a, w)) where the
 * matmul is read by the add alone and is not an output, bias has sizes 1
 * but its last (em_is_row_bias), all three have the add's dtype, and the
 * add's result has the matmul's sizes (the bias widens nothing).  want,
 * the device's choice, sees each match: a device that adds the bias only
 * in some of its matmul kernels (CUDA: the skinny ones) leaves the others
 * alone, where the add fuses with its readers instead.  The linear node
 * takes the add's place (its inputs all come before it) and tr_dce drops
 * the matmul.
 *
 * The activation: when such an add's one reader is relu or gelu_tanh (the
 * add no output, the act of the add's dtype), want is first asked with
 * that activation, and a yes makes the act node the linear node, with
 * attrs.act set (tr_dce drops the add too): a device whose matmul epilogue
 * applies it (cuBLASLt's RELU_BIAS, GELU_BIAS) saves the act's pass over
 * the product.  gelu with erf has no such epilogue and is never folded. */
#include "trace.h"

#include <string.h>

static bool is_call(const tr_graph *g, int i, em_op op) {
    return g->nodes[i].kind == TR_CALL && g->nodes[i].op == op;
}

/* Whether add node i is matmul m plus bias b, as the file's comment says
 * (uses: each node's readers, outputs counted). */
static bool match_at(const tr_graph *g, const int *uses, int i, int *m, int *b) {
    const tr_node *n = &g->nodes[i];
    if (!is_call(g, i, EM_OP_ADD)) return false;
    for (int side = 0; side < 2; side++) {
        *m = n->in[side], *b = n->in[1 - side];
        const tr_node *mm = &g->nodes[*m], *bias = &g->nodes[*b];
        if (!is_call(g, *m, EM_OP_MATMUL) || uses[*m] != 1 || *m == *b) continue;
        if (mm->meta.dtype != n->meta.dtype || bias->meta.dtype != n->meta.dtype) continue;
        if (mm->meta.ndim != n->meta.ndim ||
            memcmp(mm->meta.sizes, n->meta.sizes, sizeof(int64_t) * (size_t)n->meta.ndim))
            continue;
        if (em_is_row_bias(&mm->meta, bias->meta.ndim, bias->meta.sizes)) return true;
    }
    return false;
}

/* What the linear node made at node i stands for: matmul m, bias b and
 * the activation act. */
typedef struct lin_pick {
    int m, b;
    em_act act;
} lin_pick;

/* tr_rewrite_fn: node i of g (the add, or the act reading it) made
 * linear(matmul's operands, bias, act) as pick[i] says (ctx: pick). */
static bool rewrite(tr_graph *g, int i, void *ctx) {
    const lin_pick *p = &((const lin_pick *)ctx)[i];
    tr_node *n = &g->nodes[i];
    int *in = em_malloc(sizeof(int) * 3);
    if (!in) return false;
    in[0] = g->nodes[p->m].in[0], in[1] = g->nodes[p->m].in[1], in[2] = p->b;
    em_free(n->in);
    n->in = in;
    n->nin = 3;
    n->op = EM_OP_LINEAR;
    memset(&n->attrs, 0, sizeof n->attrs);
    n->attrs.act = p->act;
    return true;
}

/* The activation node j applies when it reads a matched add alone (the
 * add not an output), or EM_ACT_NONE: relu, gelu_tanh or gelu of the add's
 * dtype (matched[k]: whether add k matched). */
static em_act act_at(const tr_graph *g, const int *uses, const bool *matched, int j) {
    const tr_node *n = &g->nodes[j];
    em_act act = is_call(g, j, EM_OP_RELU)        ? EM_ACT_RELU
                 : is_call(g, j, EM_OP_GELU_TANH) ? EM_ACT_GELU_TANH
                 : is_call(g, j, EM_OP_GELU)      ? EM_ACT_GELU
                                                  : EM_ACT_NONE;
    if (act == EM_ACT_NONE || n->nin != 1) return EM_ACT_NONE;
    int i = n->in[0];
    if (!matched[i] || uses[i] != 1 || g->nodes[i].meta.dtype != n->meta.dtype) return EM_ACT_NONE;
    return act;
}

/* Marks the linear nodes of g in hit and pick (matched: scratch, a flag a
 * node); returns how many. */
static int find(const tr_graph *g, const int *uses, tr_linear_want want, void *ctx, bool *matched,
                lin_pick *pick, bool *hit) {
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) {
        pick[i].act = EM_ACT_NONE;
        matched[i] = match_at(g, uses, i, &pick[i].m, &pick[i].b);
        em_act act = act_at(g, uses, matched, i);
        if (act == EM_ACT_NONE) continue;
        const lin_pick *add = &pick[g->nodes[i].in[0]];
        if (want && !want(ctx, g, add->m, add->b, act)) continue;
        pick[i] = (lin_pick){add->m, add->b, act};
        matched[g->nodes[i].in[0]] = false; /* folded into node i */
        hit[i] = true;
        n++;
    }
    for (int i = 0; i < g->nnodes; i++) {
        if (!matched[i] || (want && !want(ctx, g, pick[i].m, pick[i].b, EM_ACT_NONE))) continue;
        hit[i] = true;
        n++;
    }
    return n;
}

tr_graph *tr_fuse_linear_map(const tr_graph *g, tr_linear_want want, void *ctx, int *nfused, int *map) {
    *nfused = -1;
    size_t slots = (size_t)g->nnodes + 1;
    int *uses = tr_count_uses(g);
    lin_pick *pick = uses ? em_malloc(sizeof *pick * slots) : NULL;
    bool *hit = pick ? em_calloc(slots, sizeof *hit) : NULL;
    bool *matched = hit ? em_calloc(slots, sizeof *matched) : NULL;
    tr_graph *c = NULL;
    int n = matched ? find(g, uses, want, ctx, matched, pick, hit) : 0;
    if (matched) *nfused = n;
    if (n > 0) c = tr_copy_rewritten(g, hit, rewrite, pick, map);
    if (n > 0 && !c) *nfused = -1;
    em_free(uses);
    em_free(pick);
    em_free(hit);
    em_free(matched);
    return c;
}
