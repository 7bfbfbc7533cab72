/* dce.c - dead-code elimination: drop nodes no output depends on.
 * Inputs stay (they are the signature); nodes with effects stay
 * (tr_has_effect: a rand that nobody reads still advances its generator). */
#include "trace.h"

int tr_dce_map(tr_graph *g, int *map) {
    bool *live = em_calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof *live);
    if (!live) return -1;
    for (int i = 0; i < g->noutputs; i++) live[g->outputs[i]] = true;
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const tr_node *n = &g->nodes[i];
        if (n->kind == TR_INPUT || tr_has_effect(n)) live[i] = true;
        if (!live[i]) continue;
        for (int k = 0; k < n->nin; k++) live[n->in[k]] = true;
    }
    int removed = 0;
    for (int i = 0; i < g->nnodes; i++) {
        if (map) map[i] = live[i] ? i - removed : -1;
        removed += !live[i];
    }
    int before = g->nnodes;
    if (removed) tr_compact(g, live);
    if (g->nnodes != before - removed) { /* tr_compact had no memory: nothing moved */
        for (int i = 0; map && i < before; i++) map[i] = i;
        removed = 0;
    }
    em_free(live);
    return removed;
}

int tr_dce(tr_graph *g) {
    int removed = tr_dce_map(g, NULL);
    return removed > 0 ? removed : 0;
}
