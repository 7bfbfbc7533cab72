/* cse.c - common-subexpression elimination: a call identical to an
 * earlier one (same op, inputs and attrs; tr_same_call) is replaced by it.
 * One forward sweep suffices because nodes are in topological order and
 * inputs are rewritten before a node is compared. */
#include "trace.h"

#include <string.h>

int tr_cse(tr_graph *g) {
    int n = g->nnodes;
    int cap = 16;
    while (cap < 2 * n) cap *= 2;
    int *table = em_malloc(sizeof(int) * (size_t)cap);   /* hash -> node, -1 empty */
    int *repl = em_malloc(sizeof(int) * (size_t)(n ? n : 1)); /* node -> its survivor */
    bool *keep = em_malloc(sizeof(bool) * (size_t)(n ? n : 1));
    if (!table || !repl || !keep) {
        em_free(table);
        em_free(repl);
        em_free(keep);
        return 0;
    }
    memset(table, -1, sizeof(int) * (size_t)cap);
    int merged = 0;
    for (int i = 0; i < n; i++) {
        tr_node *node = &g->nodes[i];
        repl[i] = i;
        keep[i] = true;
        for (int k = 0; k < node->nin; k++) node->in[k] = repl[node->in[k]];
        if (node->kind != TR_CALL || tr_has_effect(node)) continue;
        size_t h = (size_t)tr_call_hash(node) & (size_t)(cap - 1);
        for (;; h = (h + 1) & (size_t)(cap - 1)) {
            if (table[h] < 0) {
                table[h] = i;
                break;
            }
            if (tr_same_call(&g->nodes[table[h]], node)) {
                repl[i] = table[h];
                keep[i] = false;
                merged++;
                break;
            }
        }
    }
    for (int i = 0; i < g->noutputs; i++) g->outputs[i] = repl[g->outputs[i]];
    if (merged) tr_compact(g, keep);
    em_free(table);
    em_free(repl);
    em_free(keep);
    return merged;
}
