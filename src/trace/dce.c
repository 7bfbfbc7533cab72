/* dce.c - dead-code elimination: drop nodes no output depends on.
 * Inputs stay (they are the signature); nodes with effects stay
 * (tr_has_effect: a rand that nobody reads still advances its generator). */
#include "trace.h"

int tr_dce(tr_graph *g) {
    bool *live = em_calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof *live);
    if (!live) return 0;
    for (int i = 0; i < g->noutputs; i++) live[g->outputs[i]] = true;
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const tr_node *n = &g->nodes[i];
        if (n->kind == TR_INPUT || tr_has_effect(n)) live[i] = true;
        if (!live[i]) continue;
        for (int k = 0; k < n->nin; k++) live[n->in[k]] = true;
    }
    int removed = 0;
    for (int i = 0; i < g->nnodes; i++) removed += !live[i];
    if (removed) tr_compact(g, live);
    em_free(live);
    return removed;
}
