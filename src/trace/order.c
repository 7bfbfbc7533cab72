/* order.c - inputs first: the graph's canonical node order.
 *
 * The text form numbers nodes by position and prints the inputs by name in
 * the signature, so a graph whose inputs sit between its calls (lazy mode
 * adds an input where the cut first meets it) prints with gaps in the
 * numbering, and the text parsed back (inputs first) prints differently:
 * its plan key would differ, and a warmed graph would miss.  Moving the
 * inputs to the front, by input number, keeps the topological order
 * (inputs use nothing) and makes print, parse, print an identity. */
#include "trace.h"

#include <string.h>

int tr_inputs_first(tr_graph *g) {
    int n = g->nnodes, k = 0;
    bool sorted = true;
    for (int i = 0; i < n && sorted; i++)
        sorted = g->nodes[i].kind == TR_INPUT ? i == k++ && g->nodes[i].index == i : true;
    for (int i = k; i < n && sorted; i++) sorted = g->nodes[i].kind != TR_INPUT;
    if (sorted) return 0;
    int *order = em_malloc(sizeof(int) * (size_t)n), *map = em_malloc(sizeof(int) * (size_t)n);
    tr_node *nodes = em_malloc(sizeof(tr_node) * (size_t)n); /* a copy: g->nodes stays g's block */
    if (!order || !map || !nodes) { /* the graph stays as it was: still correct */
        em_free(order), em_free(map), em_free(nodes);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (g->nodes[i].kind == TR_INPUT) order[g->nodes[i].index] = i;
    k = g->ninputs;
    for (int i = 0; i < n; i++)
        if (g->nodes[i].kind != TR_INPUT) order[k++] = i;
    int moved = 0;
    for (int i = 0; i < n; i++) {
        map[order[i]] = i;
        moved += order[i] != i;
    }
    memcpy(nodes, g->nodes, sizeof(tr_node) * (size_t)n);
    for (int i = 0; i < n; i++) {
        g->nodes[i] = nodes[order[i]];
        for (int j = 0; g->nodes[i].kind == TR_CALL && j < g->nodes[i].nin; j++)
            g->nodes[i].in[j] = map[g->nodes[i].in[j]];
    }
    for (int i = 0; i < g->noutputs; i++) g->outputs[i] = map[g->outputs[i]];
    em_free(nodes);
    em_free(order);
    em_free(map);
    return moved;
}
