/* graph.c - building, comparing and freeing graphs. */
#include "trace.h"

#include <string.h>

tr_graph *tr_graph_new(void) {
    tr_graph *g = em_malloc(sizeof *g);
    if (g) memset(g, 0, sizeof *g);
    return g;
}

void tr_graph_free(tr_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->nnodes; i++) {
        em_free(g->nodes[i].in);
        em_free(g->nodes[i].name);
    }
    for (int i = 0; i < g->nconsts; i++) {
        em_release(g->consts[i]);
    }
    em_free(g->consts);
    em_free(g->nodes);
    em_free(g->outputs);
    em_free(g);
}

/* Grows an array of elem-sized items to hold at least n. */
static bool grow(void **items, int *cap, int n, size_t elem) {
    if (n <= *cap) return true;
    int c = *cap ? *cap * 2 : 16;
    while (c < n) c *= 2;
    void *p = em_malloc(elem * (size_t)c);
    if (!p) return false;
    if (*items) memcpy(p, *items, elem * (size_t)*cap);
    em_free(*items);
    *items = p;
    *cap = c;
    return true;
}

static tr_node *new_node(tr_graph *g, tr_kind kind) {
    if (!grow((void **)&g->nodes, &g->capnodes, g->nnodes + 1, sizeof(tr_node))) return NULL;
    tr_node *n = &g->nodes[g->nnodes++];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    return n;
}

void tr_meta_of(const em_tensor *t, em_meta *m) {
    memset(m, 0, sizeof *m);
    m->ndim = t->ndim;
    memcpy(m->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    memcpy(m->strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
    m->offset = t->offset;
    m->dtype = t->dtype;
    m->device = t->device;
}

int tr_add_input(tr_graph *g, const char *name, const em_meta *m) {
    char buf[32];
    if (!name) {
        snprintf(buf, sizeof buf, "in%d", g->ninputs);
        name = buf;
    }
    char *copy = em_malloc(strlen(name) + 1);
    if (!copy) return -1;
    strcpy(copy, name);
    tr_node *n = new_node(g, TR_INPUT);
    if (!n) {
        em_free(copy);
        return -1;
    }
    n->meta = *m;
    n->index = g->ninputs++;
    n->name = copy;
    return g->nnodes - 1;
}

int tr_add_const(tr_graph *g, em_tensor *t) {
    if (!grow((void **)&g->consts, &g->capconsts, g->nconsts + 1, sizeof(em_tensor *))) return -1;
    tr_node *n = new_node(g, TR_CONST);
    if (!n) return -1;
    tr_meta_of(t, &n->meta);
    n->index = g->nconsts;
    g->consts[g->nconsts++] = em_retain(t);
    return g->nnodes - 1;
}

int tr_add_call(tr_graph *g, em_op op, int nin, const int *in, const em_op_attrs *a,
                const em_meta *m) {
    int *ins = NULL;
    if (nin > 0) {
        ins = em_malloc(sizeof(int) * (size_t)nin);
        if (!ins) return -1;
        memcpy(ins, in, sizeof(int) * (size_t)nin);
    }
    tr_node *n = new_node(g, TR_CALL);
    if (!n) {
        em_free(ins);
        return -1;
    }
    n->op = op;
    n->nin = nin;
    n->in = ins;
    memset(&n->attrs, 0, sizeof n->attrs);
    if (a) n->attrs = *a;
    n->meta = *m;
    return g->nnodes - 1;
}

em_status tr_set_outputs(tr_graph *g, int n, const int *nodes) {
    int *o = em_malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    if (!o) return em_last_status();
    if (n > 0) memcpy(o, nodes, sizeof(int) * (size_t)n);
    em_free(g->outputs);
    g->outputs = o;
    g->noutputs = n;
    return EM_OK;
}

void tr_compact(tr_graph *g, const bool *keep) {
    int *map = em_malloc(sizeof(int) * (size_t)(g->nnodes ? g->nnodes : 1));
    if (!map) return; /* leaves the graph as it was: still correct */
    int k = 0;
    for (int i = 0; i < g->nnodes; i++) {
        if (!keep[i]) {
            em_free(g->nodes[i].in);
            em_free(g->nodes[i].name);
            map[i] = -1;
            continue;
        }
        map[i] = k;
        tr_node n = g->nodes[i];
        for (int j = 0; j < n.nin; j++) n.in[j] = map[n.in[j]];
        g->nodes[k++] = n;
    }
    g->nnodes = k;
    for (int i = 0; i < g->noutputs; i++) g->outputs[i] = map[g->outputs[i]];
    em_free(map);
}

/* ---- comparing calls ---- */

static bool same_attrs(const em_op_attrs *a, const em_op_attrs *b, unsigned mask) {
    if ((mask & A_SIZES) && (a->ndim != b->ndim ||
                             memcmp(a->sizes, b->sizes, sizeof(int64_t) * (size_t)a->ndim)))
        return false;
    if ((mask & A_DIMS) &&
        (a->ndims != b->ndims || memcmp(a->dims, b->dims, sizeof(int) * (size_t)a->ndims)))
        return false;
    if ((mask & A_DIM) && a->dim != b->dim) return false;
    if ((mask & A_RANGE) && (a->start != b->start || a->end != b->end || a->step != b->step))
        return false;
    /* bitwise, so that NaN equals NaN and -0 differs from 0 */
    if ((mask & A_VALUE) && memcmp(&a->value, &b->value, sizeof a->value)) return false;
    if ((mask & A_ARANGE) &&
        (memcmp(&a->fstart, &b->fstart, sizeof(double)) || memcmp(&a->fstep, &b->fstep, sizeof(double))))
        return false;
    if ((mask & A_CORRECTION) && a->correction != b->correction) return false;
    if ((mask & A_KEEPDIM) && a->keepdim != b->keepdim) return false;
    if ((mask & A_CAUSAL) && a->causal != b->causal) return false;
    if ((mask & A_ACT) && a->act != b->act) return false;
    if ((mask & A_DTYPE) && a->dtype != b->dtype) return false;
    if ((mask & A_DEVICE) && !em_same_device(a->device, b->device)) return false;
    if ((mask & A_RNG) && (a->seed != b->seed || a->offset != b->offset || a->generator != b->generator))
        return false;
    return true;
}

bool tr_same_call(const tr_node *a, const tr_node *b) {
    if (a->kind != TR_CALL || b->kind != TR_CALL || a->op != b->op || a->nin != b->nin)
        return false;
    for (int i = 0; i < a->nin; i++)
        if (a->in[i] != b->in[i]) return false;
    return same_attrs(&a->attrs, &b->attrs, em_op_table[a->op].attrs);
}

/* FNV-1a over the bytes of what tr_same_call compares. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t tr_call_hash(const tr_node *n) {
    uint64_t h = 0xcbf29ce484222325ull;
    const em_op_attrs *a = &n->attrs;
    unsigned mask = em_op_table[n->op].attrs;
    h = fnv(h, &n->op, sizeof n->op);
    h = fnv(h, n->in, sizeof(int) * (size_t)n->nin);
    if (mask & A_SIZES) h = fnv(h, a->sizes, sizeof(int64_t) * (size_t)a->ndim);
    if (mask & A_DIMS) h = fnv(h, a->dims, sizeof(int) * (size_t)a->ndims);
    if (mask & A_DIM) h = fnv(h, &a->dim, sizeof a->dim);
    if (mask & A_RANGE) h = fnv(h, &a->start, sizeof a->start);
    if (mask & A_VALUE) h = fnv(h, &a->value, sizeof a->value);
    if (mask & A_DTYPE) h = fnv(h, &a->dtype, sizeof a->dtype);
    if (mask & A_ACT) h = fnv(h, &a->act, sizeof a->act);
    return h;
}

bool tr_has_effect(const tr_node *n) {
    return n->kind == TR_CALL && (n->op == EM_OP_RAND || n->op == EM_OP_RANDN ||
                                  n->op == EM_OP_EMPTY || em_op_table[n->op].kind == EM_KIND_UPDATE);
}

/* Copies n bytes from src into a new em_malloc'd block (NULL for n 0). */
static bool dup_bytes(void **dst, const void *src, size_t n) {
    *dst = NULL;
    if (n == 0) return true;
    if (!(*dst = em_malloc(n))) return false;
    memcpy(*dst, src, n);
    return true;
}

tr_graph *tr_graph_copy(const tr_graph *g) {
    tr_graph *c = tr_graph_new();
    if (!c) return NULL;
    bool ok = dup_bytes((void **)&c->nodes, g->nodes, sizeof(tr_node) * (size_t)g->nnodes) &&
              dup_bytes((void **)&c->consts, g->consts, sizeof(em_tensor *) * (size_t)g->nconsts) &&
              dup_bytes((void **)&c->outputs, g->outputs, sizeof(int) * (size_t)g->noutputs);
    if (!ok) { /* nothing of g's is owned yet: free the arrays alone */
        em_free(c->nodes);
        em_free(c->consts);
        em_free(c->outputs);
        em_free(c);
        return NULL;
    }
    c->capnodes = c->nnodes = g->nnodes;
    c->capconsts = c->nconsts = g->nconsts;
    c->noutputs = g->noutputs;
    c->ninputs = g->ninputs;
    for (int i = 0; i < c->nconsts; i++) em_retain(c->consts[i]);
    for (int i = 0; i < c->nnodes; i++) { /* per node arrays: cleared first, so a failure frees */
        c->nodes[i].in = NULL;
        c->nodes[i].name = NULL;
    }
    for (int i = 0; ok && i < c->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        ok = dup_bytes((void **)&c->nodes[i].in, n->in, sizeof(int) * (size_t)n->nin) &&
             (!n->name || dup_bytes((void **)&c->nodes[i].name, n->name, strlen(n->name) + 1));
    }
    if (!ok) {
        tr_graph_free(c);
        return NULL;
    }
    return c;
}

int *tr_count_uses(const tr_graph *g) {
    int *uses = em_calloc((size_t)g->nnodes + 1, sizeof *uses);
    if (!uses) return NULL;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; g->nodes[i].kind == TR_CALL && k < g->nodes[i].nin; k++) uses[g->nodes[i].in[k]]++;
    for (int o = 0; o < g->noutputs; o++) uses[g->outputs[o]]++;
    return uses;
}

tr_graph *tr_copy_rewritten(const tr_graph *g, const bool *hit, tr_rewrite_fn rewrite, void *ctx, int *map) {
    tr_graph *c = tr_graph_copy(g);
    for (int i = 0; c && i < g->nnodes; i++)
        if (hit[i] && !rewrite(c, i, ctx)) {
            tr_graph_free(c);
            c = NULL;
        }
    if (c && tr_dce_map(c, map) < 0) {
        tr_graph_free(c);
        c = NULL;
    }
    return c;
}
