/* engine-impl.h - the engine's private declarations, shared by engine.c
 * (compiling, plan cache, dynamic shapes) and exec.c (running a plan). */
#ifndef EMBER_ENGINE_IMPL_H
#define EMBER_ENGINE_IMPL_H

#include <pthread.h>

#include "engine.h"
#include "plan.h"

/* Dynamic shapes: what a run needs for one set of input sizes: every
 * node's meta and each kernel's size arguments. */
typedef struct jit_spec {
    em_meta *in;      /* the inputs' metas it was made for */
    em_meta *metas;   /* per node */
    tr_node *nodes;   /* the graph's nodes with these metas and attribute sizes
                         (eager steps run them) */
    int64_t **sizes;  /* per plan kernel (NULL: none) */
    bool owned;       /* not in the memo: the run frees it */
    const em_allocator *alloc; /* the state owner's (specialize runs under it);
                                  a run may free it under a caller's */
} jit_spec;

/* Specs kept per dynamic state: a function called with more distinct sizes
 * than this redoes the (microsecond) check for the others on each call. */
#define JIT_SPEC_MEMO 16

/* Device graphs (graphs.c): at most this many per state (one per size of a
 * dynamic state), holding at most this much device memory in all; past
 * either, the other sizes run with plain launches. */
#define JIT_GRAPHS_MAX 8
#define JIT_GRAPHS_MAX_BYTES ((size_t)2 << 30)

/* One captured graph of a state: what its replays need (graphs.c). */
typedef struct jit_graph_slot jit_graph_slot;

/* A graph's compiled form on one device: its plan (steps, and per kernel
 * its cache key and buffers) and the loaded kernels.  No kernels: run op
 * by op.  A dynamic state also keeps each kernel as lowered for the traced
 * sizes (the model the kernels of other sizes must match, kir_match) and
 * which of its constants are size arguments. */
struct jit_compiled {
    const jit_device *dev;
    tr_graph *graph;          /* the graph the plan runs when the device's
                                 rewrites changed the caller's (fused
                                 attention), owned; NULL: the caller's */
    int index;                /* the device's index */
    jit_plan plan;
    jit_kernel **kernels;     /* by plan kernel; NULL: run op by op */
    bool *alias;              /* by plan kernel: shares an earlier kernel of the same key
                                 (engine.c), which alone is unloaded; NULL: none */
    /* What every run of the plan needs, made once (jit_exec_prepare; NULL:
     * each run makes them): the input and constant nodes, and each node's
     * last step.  A run that scanned the whole graph's nodes for them read
     * ~400 bytes a node (40 MB at 100k nodes): a cache miss a node, which
     * also evicted what the steps read next. */
    int *leaves, nleaves;
    int *last;
    /* The metas of each plan kernel's results, side by side (kernel k's
     * from out_at[k]): a static run allocates them from here, not from
     * their nodes spread over the graph (a cache miss each). */
    em_meta *out_metas;
    int *out_at;
    bool dynamic;
    k_kernel **model;         /* per plan kernel (NULL: dead) */
    int **size_of;            /* per plan kernel: instruction -> size argument or -1 */
    uint32_t *vary;           /* per node: the dims whose size varies (sc_schedule's) */
    jit_spec *memo[JIT_SPEC_MEMO];
    int nmemo;
    jit_dyn follow;           /* attribute sizes that follow the sizes (no probe) */
    char declined[192];       /* why the last sizes it could not serve were refused */
    const em_allocator *alloc; /* the one it was made under */
    /* Device graphs (graphs.c): on when the env asked and the device has
     * them.  One replay at a time (graph_lock, tried: a call that finds
     * it taken runs with plain launches); the slots and bytes under it. */
    bool graphs;
    const jit_log *log;       /* the compiling owner's: graph fallbacks are logged */
    pthread_mutex_t graph_lock;
    jit_graph_slot *slots[JIT_GRAPHS_MAX];
    int nslots;
    size_t graph_bytes;       /* device memory the slots' graphs and buffers hold */
    int64_t graphs_captured, graph_replays; /* statistics */
};

/* tune.c (engine.h's autotuning) */
/* The plan key's target when d tunes under env: target + " autotune " +
 * the device model (a tuned plan names tuned kernels, valid on that model
 * only), else target, into buf. */
void jit_tune_plan_target(const jit_device *d, int index, const jit_env *env, const char *target,
                          char *buf, size_t n);
/* Tunes the kernels ks[i] (NULL: skip) of plan p (its kernels' buffers
 * are nodes of g): each one's parameters into params[i] (left default
 * when not tuned) and its key into keys[i] and p->kernels[i].key.  Only
 * out of memory is an error; a failed timing keeps the default (logged). */
em_status jit_tune_kernels(const jit_device *d, int index, jit_env *env, const tr_graph *g,
                           jit_plan *p, k_kernel *const *ks, kc_key *keys, jit_params *params);
/* exec.c: runs st's plan for the sizes of sp (NULL: the graph as traced). */
em_status jit_exec(const jit_compiled *st, const tr_graph *g, const jit_spec *sp,
                   em_tensor *const *in, em_tensor **out);
void jit_spec_free(const jit_compiled *st, jit_spec *sp);
/* Makes st's per-run tables above for g, the graph its plan runs (out of
 * memory: none, and each run makes them). */
void jit_exec_prepare(jit_compiled *st, const tr_graph *g);
void jit_exec_unprepare(jit_compiled *st);

/* graphs.c: runs st for sp (NULL: static) as its captured device graph
 * when it has one for these sizes, or captures one when this call is due
 * (*ran true: out holds the results); *ran false: the caller runs the plan
 * (graphs off, warming up, bypassed, or the capture failed: logged, never
 * an error).  An error is one the replay itself got. */
em_status jit_graphs_run(jit_compiled *st, const tr_graph *g, jit_spec *sp, em_tensor *const *in,
                         em_tensor **out, bool *ran);
/* Frees st's graphs, their buffers and held outputs (the device memory
 * goes back to the device's allocator). */
void jit_graphs_free(jit_compiled *st);

#endif
