/* verify.c - the graph's invariants (trace.h lists them), checked after
 * every pass in tests and debug builds, and on every parsed graph. */
#include "trace.h"

#include <string.h>

static em_status bad(int node, const char *what) {
    return em_error(EM_ERR_STATE, "graph verifier: node %%%d: %s", node, what);
}

/* A stand-in tensor carrying only a node's meta: enough for infer rules,
 * which never read data. */
static void fake_tensor(em_tensor *t, const em_meta *m) {
    memset(t, 0, sizeof *t);
    t->ndim = m->ndim;
    memcpy(t->sizes, m->sizes, sizeof(int64_t) * (size_t)m->ndim);
    memcpy(t->strides, m->strides, sizeof(int64_t) * (size_t)m->ndim);
    t->offset = m->offset;
    t->dtype = m->dtype;
    t->device = m->device;
}

static bool same_meta(const em_meta *a, const em_meta *b, bool strides) {
    if (a->ndim != b->ndim || a->dtype != b->dtype || !em_same_device(a->device, b->device))
        return false;
    if (memcmp(a->sizes, b->sizes, sizeof(int64_t) * (size_t)a->ndim)) return false;
    if (!strides) return true;
    if (a->offset != b->offset && em_shape_numel(a->ndim, a->sizes) > 0) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->sizes[d] > 1 && a->strides[d] != b->strides[d]) return false;
    return true;
}

static em_status verify_call(const tr_graph *g, int i) {
    const tr_node *n = &g->nodes[i];
    if ((unsigned)n->op >= EM_OP_COUNT) return bad(i, "invalid op");
    const em_op_info *info = &em_op_table[n->op];
    if (info->nin >= 0 ? n->nin != info->nin : n->nin < 1) return bad(i, "wrong number of inputs");
    if (n->nin > 64) return bad(i, "too many inputs");
    em_tensor fakes[64];
    em_tensor *ins[64];
    for (int k = 0; k < n->nin; k++) {
        if (n->in[k] < 0 || n->in[k] >= i) return bad(i, "an input is not an earlier node");
        fake_tensor(&fakes[k], &g->nodes[n->in[k]].meta);
        ins[k] = &fakes[k];
    }
    em_op_call c = {n->op, n->nin, ins, &n->attrs};
    em_meta m;
    memset(&m, 0, sizeof m);
    m.device = n->nin > 0 ? ins[0]->device : n->attrs.device;
    if (info->infer(&c, &m) != EM_OK) {
        char why[600];
        snprintf(why, sizeof why, "%s rejects its inputs: %s", info->name, em_last_error());
        return bad(i, why);
    }
    /* views must reproduce strides too; fresh results may have any layout */
    if (!same_meta(&m, &n->meta, info->kind == EM_KIND_VIEW || info->kind == EM_KIND_UPDATE))
        return bad(i, "its meta differs from what its op infers");
    return EM_OK;
}

/* The meta eager mode gives op n's result for inputs of metas ins (as
 * em_dispatch_eager makes it): views as inferred, a copy of a contiguous
 * tensor aliases it, anything else is a fresh contiguous tensor. */
static em_status infer_result(const tr_node *n, em_tensor *const *ins, em_meta *m) {
    const em_op_info *info = &em_op_table[n->op];
    em_op_call c = {n->op, n->nin, ins, &n->attrs};
    memset(m, 0, sizeof *m);
    m->device = n->nin > 0 ? ins[0]->device : n->attrs.device;
    if (info->infer(&c, m) != EM_OK) return em_last_status();
    if (info->kind == EM_KIND_VIEW || info->kind == EM_KIND_UPDATE) return EM_OK;
    if (info->kind == EM_KIND_COPY && em_is_contiguous(ins[0])) {
        memcpy(m->strides, ins[0]->strides, sizeof(int64_t) * (size_t)m->ndim);
        m->offset = ins[0]->offset;
        return EM_OK;
    }
    em_contiguous_strides(m->ndim, m->sizes, m->strides);
    m->offset = 0;
    return EM_OK;
}

em_status tr_infer_node(const tr_graph *g, int i, em_meta *metas) {
    const tr_node *n = &g->nodes[i];
    if (n->nin > 64) return bad(i, "too many inputs");
    em_tensor fakes[64];
    em_tensor *ins[64];
    for (int k = 0; k < n->nin; k++) {
        fake_tensor(&fakes[k], &metas[n->in[k]]);
        ins[k] = &fakes[k];
    }
    if (infer_result(n, ins, &metas[i]) != EM_OK) {
        char why[600];
        snprintf(why, sizeof why, "%s rejects its inputs: %s", em_op_table[n->op].name,
                 em_last_error());
        return bad(i, why);
    }
    return EM_OK;
}

em_status tr_infer_own(tr_graph *g, int i) {
    tr_node *n = &g->nodes[i];
    if (n->nin > 64) return bad(i, "too many inputs");
    em_tensor fakes[64];
    em_tensor *ins[64];
    for (int k = 0; k < n->nin; k++) {
        fake_tensor(&fakes[k], &g->nodes[n->in[k]].meta);
        ins[k] = &fakes[k];
    }
    em_meta m;
    em_status s = infer_result(n, ins, &m);
    if (s == EM_OK) n->meta = m;
    return s;
}

em_status tr_infer_metas(const tr_graph *g, const em_meta *inputs, em_meta *out) {
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        em_status s = EM_OK;
        if (n->kind == TR_INPUT) out[i] = inputs[n->index];
        else if (n->kind == TR_CONST) out[i] = n->meta;
        else s = tr_infer_node(g, i, out);
        if (s != EM_OK) return s;
    }
    return EM_OK;
}

/* Input node i (the k-th input) against the inputs before it (names[0..k),
 * their names). */
static em_status verify_input(const tr_node *n, int i, int k, const char **names) {
    if (n->index != k) return bad(i, "inputs are not numbered in order");
    if (!n->name || !n->name[0]) return bad(i, "input without a name");
    /* against the earlier inputs only: a scan of every earlier node cost
     * O(nodes) per input, where lazy mode puts inputs among the calls */
    for (int j = 0; j < k; j++)
        if (!strcmp(names[j], n->name)) return bad(i, "two inputs share a name");
    names[k] = n->name;
    return EM_OK;
}

/* Doubles the names array (*names: stack or em_malloc'd). */
static em_status grow_names(const char ***names, const char **stack, int *cap) {
    const char **p = em_malloc(sizeof *p * 2 * (size_t)*cap);
    if (!p) return em_last_status();
    memcpy(p, *names, sizeof *p * (size_t)*cap);
    if (*names != stack) em_free(*names);
    *names = p;
    *cap *= 2;
    return EM_OK;
}

em_status tr_verify(const tr_graph *g) {
    if (!g) return em_error(EM_ERR_NULL, "graph verifier: NULL graph");
    int ninputs = 0, cap = 16;
    const char *stack[16], **names = stack; /* the inputs' names, in order */
    em_status s = EM_OK;
    for (int i = 0; i < g->nnodes && s == EM_OK; i++) {
        const tr_node *n = &g->nodes[i];
        switch (n->kind) {
        case TR_INPUT:
            if (ninputs == cap && (s = grow_names(&names, stack, &cap)) != EM_OK) break;
            s = verify_input(n, i, ninputs++, names);
            break;
        case TR_CONST:
            if (n->index < 0 || n->index >= g->nconsts || !g->consts[n->index])
                s = bad(i, "constant index out of range");
            break;
        case TR_CALL: s = verify_call(g, i); break;
        default: s = bad(i, "unknown node kind");
        }
    }
    if (names != stack) em_free(names);
    if (s != EM_OK) return s;
    if (ninputs != g->ninputs) return em_error(EM_ERR_STATE, "graph verifier: input count");
    if (g->noutputs < 1) return em_error(EM_ERR_STATE, "graph verifier: no outputs");
    for (int i = 0; i < g->noutputs; i++)
        if (g->outputs[i] < 0 || g->outputs[i] >= g->nnodes)
            return em_error(EM_ERR_STATE, "graph verifier: output %d is not a node", i);
    return EM_OK;
}
