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
 * the matmul. */
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

/* tr_rewrite_fn: add node i of g made linear(matmul m's operands, bias
 * b) for pick[2i, 2i + 1] = m, b (ctx: pick). */
static bool rewrite(tr_graph *g, int i, void *ctx) {
    const int *pick = ctx;
    int m = pick[2 * i], b = pick[2 * i + 1];
    tr_node *n = &g->nodes[i];
    int *in = em_malloc(sizeof(int) * 3);
    if (!in) return false;
    in[0] = g->nodes[m].in[0], in[1] = g->nodes[m].in[1], in[2] = b;
    em_free(n->in);
    n->in = in;
    n->nin = 3;
    n->op = EM_OP_LINEAR;
    memset(&n->attrs, 0, sizeof n->attrs);
    return true;
}

tr_graph *tr_fuse_linear_map(const tr_graph *g, tr_linear_want want, void *ctx, int *nfused, int *map) {
    *nfused = -1;
    int *uses = tr_count_uses(g);
    int *pick = uses ? em_malloc(sizeof(int) * 2 * ((size_t)g->nnodes + 1)) : NULL;
    bool *hit = pick ? em_calloc((size_t)g->nnodes + 1, sizeof *hit) : NULL;
    tr_graph *c = NULL;
    int n = 0;
    for (int i = 0; hit && i < g->nnodes; i++) {
        int m, b;
        if (!match_at(g, uses, i, &m, &b) || (want && !want(ctx, g, m, b))) continue;
        pick[2 * i] = m, pick[2 * i + 1] = b;
        hit[i] = true;
        n++;
    }
    if (hit) *nfused = n;
    if (n > 0) c = tr_copy_rewritten(g, hit, rewrite, pick, map);
    if (n > 0 && !c) *nfused = -1;
    em_free(uses);
    em_free(pick);
    em_free(hit);
    return c;
}
