/* schedule.h - fusion (schedule.c) and lowering of fused groups to kernel IR
 * (lower.c), used by the CPU backend (backend_cpu.c). */
#ifndef EMBER_SCHEDULE_H
#define EMBER_SCHEDULE_H

#include "kir.h"
#include "trace.h"

/* A fused group's iteration space F (sizes) and its k trailing inner dims
 * (-1 until a reduction sets it: then pointwise-only). */
typedef struct sc_group {
    int ndim;
    int64_t sizes[EM_MAX_DIMS];
    int k;
} sc_group;

typedef enum sc_step_kind { SC_EAGER, SC_KERNEL } sc_step_kind;

typedef struct sc_step {
    sc_step_kind kind;
    int node;  /* SC_EAGER: the node, run with the eager op */
    int group; /* SC_KERNEL: the group */
} sc_step;

typedef struct sc_schedule {
    const tr_graph *g;   /* borrowed */
    bool *fusible;       /* per node */
    bool *materialized;  /* per node: its value goes to memory */
    /* per node: a value of its group's row (the group's kept dims) laid
     * along F's leading dims, as a reduction without keepdim and what is
     * computed from such reductions alone: F=[R, C] holds mean(x, -1) of
     * sizes [R] as row values, not broadcast along C */
    bool *lead;
    int *group;          /* per node: its group, or -1 */
    sc_group *groups;
    int ngroups;
    sc_step *steps;      /* in execution order */
    int nsteps, capsteps;
    /* group gi's nodes, in node order: members[member_start[gi] ..
     * member_start[gi + 1]) (passes over one group need not scan the graph) */
    int *members, *member_start;
    /* sc_lower's per-node tables, allocated once for the schedule so that
     * lowering a group costs its own size, not the graph's: sc_lower
     * leaves them as it found them.  One sc_lower at a time per schedule. */
    struct sc_lower_tables *tables;
    /* Per node (NULL: none, the default), dims whose size may vary: a
     * dynamic kernel's.  At size 1 such a dim is lowered as at any other
     * size (kept as a loop, with its real strides) rather than dropped as
     * a broadcast, so that the kernel a dynamic entry compiled for sizes
     * >= 2 takes size 1 as well.  Borrowed; set by the caller. */
    const uint32_t *vary;
} sc_schedule;

sc_schedule *sc_build(const tr_graph *g);
/* The same, fusing f16 and bf16 values too when half is set: for a device
 * whose generator takes them (the lowering computes them in f32); with
 * sc_build they run as eager steps. */
sc_schedule *sc_build_for(const tr_graph *g, bool half);
void sc_free(sc_schedule *s);
bool sc_is_reduction(const tr_node *n);
/* A view op (reshape, permute, slice, expand, squeeze, unsqueeze). */
bool sc_is_view(const tr_node *n);
/* Whether view node v only adds or drops dims of size 1 (its other sizes
 * are its input's, in order): then map[d] is the input dim that v's dim d
 * is, or -1 for a new unit dim. */
bool sc_view_unit_map(const tr_graph *g, int v, int *map);

/* Version of what schedule.c and lower.c make of a graph: part of the
 * graph-level plan's key (plan.c), so that a plan written by an older
 * scheduler is not reused after a change (it would still be correct, but
 * not the new schedule).  Bump it with any change to either file's output. */
#define SC_VERSION 9 /* 9: views of fused values recomputed, not stored (fusible views), rows of reductions without keepdim fused; 8: values that read no memory are not stored across updates; 7: in-place updates are fences (issue 20) */

/* The symbol of every kernel lower.c makes (see there). */
#define JIT_KERNEL_NAME "k"

/* ---- lower.c ----
 * The kernel of group gi: its buffer parameters are the nodes in
 * bufs[0..*nbufs) (inputs first, then the *nouts stored nodes, last).
 * bufs has room for one entry per graph node.  NULL with an error when the
 * group cannot be lowered (the backend then runs the graph eagerly). */
k_kernel *sc_lower(const sc_schedule *s, int gi, int *bufs, int *nbufs, int *nouts);
/* The tables sc_lower uses for a graph of n nodes (sc_build makes them). */
struct sc_lower_tables *sc_lower_tables_new(int n);
void sc_lower_tables_free(struct sc_lower_tables *t);

#endif
