/* backend_replay.c - the replay backend: runs a graph node by node with
 * the eager kernels.  It proves capture and guards independently of code
 * generation, and is the reference the compiling backends are tested
 * against: its results equal eager mode's bit for bit. */
#include "jit.h"

#include <string.h>

static em_status replay_compile(const tr_graph *g, jit_env *env, void **state) {
    (void)g;
    (void)env;
    *state = NULL; /* nothing to prepare: the graph is the program */
    return EM_OK;
}

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
 * freed).  As in the cpu backend's run_plan, replay frees each
 * intermediate after its last reader, as eager code's scopes would. */
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
static void free_used(const tr_graph *g, em_tensor **vals, const int *last, int i, int depth) {
    const tr_node *n = &g->nodes[i];
    for (int k = -1; n->kind == TR_CALL && k < n->nin; k++) {
        int v = k < 0 ? i : n->in[k];
        if (last[v] == i && vals[v] && vals[v]->scope == depth) {
            em_tensor_discard(vals[v]);
            vals[v] = NULL;
        }
    }
}

static em_status replay_run(void *state, const tr_graph *g, em_tensor *const *in,
                            em_tensor **out) {
    (void)state;
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
        else free_used(g, vals, last, i, depth);
    }
    for (int i = 0; i < g->noutputs; i++) out[i] = s == EM_OK ? em_keep(vals[g->outputs[i]]) : NULL;
    em_scope_end();
    em_free(last);
    em_free(vals);
    return s;
}

static void replay_free(void *state) { (void)state; }

/* Every op re-infers its shapes when it runs: any sizes jit_dyn_check
 * allowed are served as they are, unless attribute sizes must follow
 * them (the graph is replayed as recorded). */
static em_status replay_compile_dynamic(const tr_graph *g, const jit_dyn *dyn, jit_env *env,
                                        void **state, bool *dynamic, char *why, size_t nwhy) {
    *dynamic = dyn->nsizes == 0;
    if (!*dynamic) snprintf(why, nwhy, "replayed reshape or expand sizes cannot follow the sizes");
    return replay_compile(g, env, state);
}

const jit_backend jit_replay_backend = {
    .name = "replay",
    .compile = replay_compile,
    .run = replay_run,
    .free = replay_free,
    .compile_dynamic = replay_compile_dynamic,
};

const jit_backend *jit_backend_find(const char *name) {
    static const jit_backend *const all[] = {&jit_auto_backend, &jit_cpu_backend,
                                             &jit_cuda_backend, &jit_replay_backend};
    if (!name) return all[0];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(all[i]->name, name)) return all[i];
    return NULL;
}
