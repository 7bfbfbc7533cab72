/* exec.c - running a compiled graph (engine-impl.h): its plan's steps in
 * order, kernels through the device's launch and the other nodes through
 * their eager ops, or the whole graph op by op.  Each intermediate is freed
 * after its last reader on every device, and its block goes back to the
 * device's allocator for the next one (the CUDA allocator caches them). */
#include "engine-impl.h"

#include <string.h>

em_tensor *jit_replay_node(const tr_node *n, em_tensor **vals) {
    em_tensor *stack[8], **ins = n->nin <= 8 ? stack : em_malloc(sizeof *ins * (size_t)n->nin);
    if (!ins) return NULL;
    for (int k = 0; k < n->nin; k++) ins[k] = vals[n->in[k]];
    em_tensor *t;
    const em_op_attrs *a = &n->attrs;
    if ((n->op == EM_OP_RAND || n->op == EM_OP_RANDN) && a->generator) {
        /* draw from the generator's current state, and advance it, as the
         * eager call would: a replayed randn is not the traced values */
        t = (n->op == EM_OP_RAND ? em_rand : em_randn)(a->generator, a->ndim, a->sizes, a->dtype,
                                                        a->device);
    } else {
        t = em_dispatch(n->op, n->nin, ins, a);
    }
    if (ins != stack) em_free(ins);
    return t;
}

/* The last node that reads each node's value; outputs get nnodes (never
 * freed).  As jit_exec, the op-by-op run frees each intermediate after
 * its last reader, as eager code's scopes would. */
static int *last_readers(const tr_graph *g) {
    int *last = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    if (!last) return NULL;
    for (int v = 0; v < g->nnodes; v++) last[v] = v;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; g->nodes[i].kind == TR_CALL && k < g->nodes[i].nin; k++) last[g->nodes[i].in[k]] = i;
    for (int o = 0; o < g->noutputs; o++) last[g->outputs[o]] = g->nnodes;
    return last;
}

/* Frees the values node i used up that this run's scope (depth) made. */
static void free_read(const tr_graph *g, em_tensor **vals, const int *last, int i, int depth) {
    const tr_node *n = &g->nodes[i];
    for (int k = -1; n->kind == TR_CALL && k < n->nin; k++) {
        int v = k < 0 ? i : n->in[k];
        if (last[v] == i && vals[v] && vals[v]->scope == depth) {
            em_tensor_discard(vals[v]);
            vals[v] = NULL;
        }
    }
}

em_status jit_exec_op_by_op(const tr_graph *g, em_tensor *const *in, em_tensor **out) {
    em_tensor **vals = em_calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof *vals);
    int *last = vals ? last_readers(g) : NULL;
    if (!last) {
        em_free(vals);
        return em_last_status();
    }
    em_status s = EM_OK;
    int depth = em_scope_begin();
    for (int i = 0; i < g->nnodes && s == EM_OK; i++) {
        const tr_node *n = &g->nodes[i];
        switch (n->kind) {
        case TR_INPUT: vals[i] = in[n->index]; break;
        case TR_CONST: vals[i] = g->consts[n->index]; break;
        case TR_CALL: vals[i] = jit_replay_node(n, vals); break;
        }
        if (!vals[i]) s = em_last_status() != EM_OK ? em_last_status() : EM_ERR_STATE;
        else free_read(g, vals, last, i, depth);
    }
    for (int i = 0; i < g->noutputs; i++) out[i] = s == EM_OK ? em_keep(vals[g->outputs[i]]) : NULL;
    em_scope_end();
    em_free(last);
    em_free(vals);
    return s;
}

/* The meta of result r (of the nouts) of plan kernel k, buffer node v:
 * the spec's (metas), the prepared copy, or the node's. */
static const em_meta *result_meta(const jit_compiled *st, const tr_graph *g, const em_meta *metas,
                                  int k, int r, int v) {
    if (metas) return &metas[v];
    return st->out_metas ? &st->out_metas[st->out_at[k] + r] : &g->nodes[v].meta;
}

static em_status run_kernel(const jit_compiled *st, const tr_graph *g, const em_meta *metas,
                            int k, const jit_kernel *kernel, const int64_t *sizes, em_tensor **vals) {
    const jit_plan_kernel *pk = &st->plan.kernels[k];
    void *stack[16], **ptrs = pk->nbufs <= 16 ? stack : em_malloc(sizeof(void *) * (size_t)pk->nbufs);
    if (!ptrs) return em_last_status();
    em_status s = EM_OK;
    int first = pk->nbufs - pk->nouts;
    for (int b = 0; b < pk->nbufs && s == EM_OK; b++) {
        int v = pk->bufs[b];
        if (b >= first) {
            vals[v] = em_tensor_alloc(result_meta(st, g, metas, k, b - first, v));
            if (!vals[v]) s = em_last_status();
        } else if (!vals[v]) {
            s = em_error(EM_ERR_STATE, "%s: kernel input %%%d is not computed yet", st->dev->name, v);
        }
        if (s == EM_OK) ptrs[b] = em_data(vals[v]);
    }
    if (s == EM_OK) s = st->dev->launch(kernel, ptrs, sizes);
    if (ptrs != stack) em_free(ptrs);
    return s;
}

/* The node a non-kernel step runs (its attributes and sizes those of sp
 * when given). */
static const tr_node *step_node(const tr_graph *g, const jit_spec *sp, const sc_step *step) {
    return sp ? &sp->nodes[step->node] : &g->nodes[step->node];
}

/* The last step that reads or writes each node's value; graph outputs get
 * nsteps (never freed).  jit_exec frees an intermediate after its last
 * step, as eager code's scopes do: holding every value until the end made
 * a whole-model graph (lazy mode makes those) take several times eager
 * mode's memory, and the fresh pages (page faults, zeroing) cost more than
 * fusion saved (MiniLM under EMBER_JIT=1). */
static int *last_steps(const jit_compiled *st, const tr_graph *g, const jit_spec *sp, int *last) {
    for (int v = 0; v < g->nnodes; v++) last[v] = -1;
    for (int i = 0; i < st->plan.nsteps; i++) {
        const sc_step *step = &st->plan.steps[i];
        if (step->kind == SC_KERNEL) {
            const jit_plan_kernel *pk = &st->plan.kernels[step->group];
            for (int b = 0; b < pk->nbufs; b++) last[pk->bufs[b]] = i;
            continue;
        }
        const tr_node *n = step_node(g, sp, step);
        for (int k = 0; k < n->nin; k++) last[n->in[k]] = i;
        last[step->node] = i;
    }
    for (int o = 0; o < g->noutputs; o++) last[g->outputs[o]] = st->plan.nsteps;
    return last;
}

/* Frees node v's value if step i was its last and jit_exec's scope (depth)
 * made it (inputs and constants belong to others). */
static void free_if_done(em_tensor **vals, const int *last, int v, int i, int depth) {
    if (last[v] == i && vals[v] && vals[v]->scope == depth) {
        em_tensor_discard(vals[v]);
        vals[v] = NULL;
    }
}

/* Frees the values step i used up. */
static void free_used(const jit_compiled *st, const tr_graph *g, const jit_spec *sp, em_tensor **vals,
                      const int *last, int i, int depth) {
    const sc_step *step = &st->plan.steps[i];
    if (step->kind == SC_KERNEL) {
        const jit_plan_kernel *pk = &st->plan.kernels[step->group];
        for (int b = 0; b < pk->nbufs; b++) free_if_done(vals, last, pk->bufs[b], i, depth);
        return;
    }
    const tr_node *n = step_node(g, sp, step);
    for (int k = 0; k < n->nin; k++) free_if_done(vals, last, n->in[k], i, depth);
    free_if_done(vals, last, step->node, i, depth);
}

/* The results' metas of every plan kernel, side by side (out_metas). */
static bool copy_result_metas(jit_compiled *st, const tr_graph *g) {
    const jit_plan *p = &st->plan;
    size_t n = 0;
    for (int k = 0; k < p->nkernels; k++) n += (size_t)p->kernels[k].nouts;
    st->out_at = em_malloc(sizeof(int) * ((size_t)p->nkernels + 1));
    st->out_metas = em_malloc(sizeof(em_meta) * (n + 1));
    if (!st->out_at || !st->out_metas) return false;
    int at = 0;
    for (int k = 0; k < p->nkernels; k++) {
        const jit_plan_kernel *pk = &p->kernels[k];
        st->out_at[k] = at;
        for (int b = pk->nbufs - pk->nouts; b < pk->nbufs; b++)
            st->out_metas[at++] = g->nodes[pk->bufs[b]].meta;
    }
    return true;
}

void jit_exec_prepare(jit_compiled *st, const tr_graph *g) {
    jit_exec_unprepare(st);
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) n += g->nodes[i].kind != TR_CALL;
    st->leaves = em_malloc(sizeof(int) * ((size_t)n + 1));
    st->last = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    if (!st->leaves || !st->last || !copy_result_metas(st, g)) {
        jit_exec_unprepare(st);
        em_clear_error(); /* each run makes them */
        return;
    }
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].kind != TR_CALL) st->leaves[st->nleaves++] = i;
    /* a spec's nodes read the same inputs (their in arrays are g's) */
    last_steps(st, g, NULL, st->last);
}

void jit_exec_unprepare(jit_compiled *st) {
    em_free(st->leaves);
    em_free(st->last);
    em_free(st->out_metas);
    em_free(st->out_at);
    st->leaves = st->last = st->out_at = NULL;
    st->out_metas = NULL;
    st->nleaves = 0;
}

/* The values of the inputs and constants: node i's, for each of st's
 * leaves (else every node is looked at). */
static void set_leaves(const jit_compiled *st, const tr_graph *g, em_tensor *const *in, em_tensor **vals) {
    int n = st->leaves ? st->nleaves : g->nnodes;
    for (int k = 0; k < n; k++) {
        int i = st->leaves ? st->leaves[k] : k;
        const tr_node *nd = &g->nodes[i];
        if (nd->kind == TR_INPUT) vals[i] = in[nd->index];
        else if (nd->kind == TR_CONST) vals[i] = g->consts[nd->index];
    }
}

/* Runs the plan, for the sizes of sp (NULL: static, the graph as
 * recorded): its nodes' metas and attributes, its kernels' size
 * arguments. */
em_status jit_exec(const jit_compiled *st, const tr_graph *g, const jit_spec *sp,
                   em_tensor *const *in, em_tensor **out) {
    const em_meta *metas = sp ? sp->metas : NULL;
    int64_t *const *sizes = sp ? sp->sizes : NULL;
    /* small graphs (tiny_chain: a few microseconds a call) allocate nothing
     * here: the values and last steps live on the stack */
    enum { STACK = 64 };
    em_tensor *vstack[STACK];
    int lstack[STACK];
    bool small = g->nnodes <= STACK;
    em_tensor **vals = small ? vstack : em_malloc(sizeof *vals * ((size_t)g->nnodes + 1));
    if (!vals) return em_last_status();
    int *own = st->last || small ? lstack : em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    if (!own) {
        em_free(vals);
        return em_last_status();
    }
    memset(vals, 0, sizeof *vals * (size_t)g->nnodes);
    const int *last = st->last ? st->last : last_steps(st, g, sp, own);
    em_status s = EM_OK;
    int depth = em_scope_begin();
    set_leaves(st, g, in, vals);
    for (int i = 0; i < st->plan.nsteps && s == EM_OK; i++) {
        const sc_step *step = &st->plan.steps[i];
        if (step->kind == SC_KERNEL) {
            s = run_kernel(st, g, metas, step->group, st->kernels[step->group],
                           sizes ? sizes[step->group] : NULL, vals);
        } else {
            const tr_node *n = step_node(g, sp, step);
            for (int k = 0; k < n->nin && s == EM_OK; k++)
                if (!vals[n->in[k]])
                    s = em_error(EM_ERR_STATE, "%s: input %%%d of %%%d is not computed yet",
                                 st->dev->name, n->in[k], step->node);
            if (s == EM_OK) vals[step->node] = jit_replay_node(n, vals);
            if (s == EM_OK && !vals[step->node]) s = em_last_status() ? em_last_status() : EM_ERR_STATE;
        }
        if (s == EM_OK) free_used(st, g, sp, vals, last, i, depth);
    }
    for (int i = 0; i < g->noutputs; i++) {
        em_tensor *v = vals[g->outputs[i]];
        if (s == EM_OK && !v) s = em_error(EM_ERR_STATE, "%s: output %d was not computed", st->dev->name, i);
        out[i] = s == EM_OK ? em_keep(v) : NULL;
    }
    em_scope_end();
    if (own != lstack) em_free(own);
    if (!small) em_free(vals);
    return s;
}

