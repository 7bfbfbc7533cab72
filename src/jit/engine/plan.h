/* plan.h - the graph-level cache entry: how a backend runs one captured
 * graph, so that a new process that captures the same graph skips fusion,
 * lowering and code generation and only loads kernels (plan.c).
 *
 * The key hashes the graph's canonical text (which holds every input's
 * dtype, device, sizes and strides: everything the guards check), the
 * backend's name and its target (compiler, code generator and options
 * versions).  The entry, of kind "plan", is text:
 *
 *   ember-plan 3
 *   graph <32 hex: the plan's own graph-level key>
 *   steps 3
 *   e 4            run node 4 with its eager op
 *   k 0            run kernel 0
 *   k 1
 *   kernels 2
 *   kernel <32 hex: the kernel's cache key> <32 hex: its abi> <nbufs> <nouts> <node>...
 *   kernel ...
 *
 * A kernel's buffers are graph nodes, inputs first, the nouts results last
 * (allocated per run); its abi hashes the dtype, sizes and strides of each
 * buffer's node as the kernel was lowered for them.  A plan is checked
 * against the graph it is read for without scheduling or lowering it again
 * (jit_plan_check): anything malformed, out of range, computed out of
 * order, or bound to buffers of other layouts is a miss.
 * Ownership: a plan owns its arrays; jit_plan_clear frees them. */
#ifndef EMBER_PLAN_H
#define EMBER_PLAN_H

#include "cache.h"
#include "schedule.h"

typedef struct jit_plan_kernel {
    kc_key key;  /* the cache key of the kernel's artifact */
    kc_key abi;  /* jit_plan_abi: the layouts of the buffers it was lowered for */
    int *bufs;   /* node of each buffer parameter */
    int nbufs;
    int nouts;   /* the last nouts buffers are results */
} jit_plan_kernel;

typedef struct jit_plan {
    kc_key key;      /* the graph-level key it is filed under (in its text) */
    sc_step *steps;  /* in execution order */
    int nsteps;
    jit_plan_kernel *kernels;
    int nkernels;
} jit_plan;

/* The graph-level key of g for a backend and its target; m (may be NULL)
 * gets its manifest (fields what, plan_format_version, schedule_version,
 * backend, target, graph). */
bool jit_graph_key(const tr_graph *g, const char *backend, const char *target, kc_key *key,
                   kc_manifest *m);
/* The text of p (em_malloc'd; *n its length), or NULL. */
char *jit_plan_format(const jit_plan *p, size_t *n);
/* Parses a plan read for graph g under key; false (no error set) when the
 * text is not a valid plan of g, or names another key (an entry filed
 * under the wrong key).  The backend still checks that the plan is the
 * one it would make for g before it runs anything. */
bool jit_plan_parse(const char *text, size_t n, const tr_graph *g, const kc_key *key,
                    jit_plan *out);
/* The abi of kernel k of a plan for g: a hash of nbufs, nouts and each
 * buffer node's dtype, sizes and strides. */
void jit_plan_abi(const tr_graph *g, const jit_plan_kernel *k, kc_key *abi);
/* Whether plan p computes g: every step's inputs computed before it, no
 * node computed twice or over an input, every output computed, each
 * kernel's abi that of its buffers in g.  Together with the graph key the
 * plan names and the key each loaded artifact embeds, this binds a plan
 * read from disk to g without scheduling or lowering g again. */
bool jit_plan_check(const tr_graph *g, const jit_plan *p);
void jit_plan_clear(jit_plan *p);

#endif
