/* trace.h - Ember's graph IR (src/trace): the one header every pass and
 * every consumer of captured graphs includes.
 *
 * A graph is a list of nodes in topological order, in the spirit of
 * torch.fx: inputs (placeholders), constants (tensors captured by
 * reference), and calls of ops from the op table; then the list of output
 * nodes.  Each node records its result's meta (dtype, device, sizes,
 * strides, offset), as the trace saw it.
 *
 * Ownership: a graph owns its nodes, names and node input arrays, and one
 * reference to each constant tensor; tr_graph_free releases all of it, and
 * must run under the allocator (em_set_allocator) that built the graph. */
#ifndef EMBER_TRACE_H
#define EMBER_TRACE_H

#include <stdio.h>

#include "eager.h"

typedef enum tr_kind {
    TR_INPUT, /* the index-th input tensor of the function */
    TR_CONST, /* the index-th constant of the graph */
    TR_CALL   /* op(in...) with attrs */
} tr_kind;

typedef struct tr_node {
    tr_kind kind;
    em_op op;          /* TR_CALL */
    int nin;           /* TR_CALL: number of inputs */
    int *in;           /* TR_CALL: indices of earlier nodes */
    em_op_attrs attrs; /* TR_CALL: only the fields em_op_table[op].attrs names
                          are meaningful; attrs.generator is borrowed */
    em_meta meta;      /* the result: dtype, device, sizes, strides, offset */
    int index;         /* TR_INPUT: input number; TR_CONST: constant number */
    char *name;        /* TR_INPUT: the input's name (unique in the graph) */
} tr_node;

typedef struct tr_graph {
    tr_node *nodes;
    int nnodes, capnodes;
    int ninputs;       /* TR_INPUT nodes, numbered 0..ninputs-1 */
    em_tensor **consts; /* one reference each */
    int nconsts, capconsts;
    int *outputs;      /* node indices */
    int noutputs;
} tr_graph;

/* ---- graph.c: building ---- */
tr_graph *tr_graph_new(void);
void tr_graph_free(tr_graph *g);
/* A deep copy of g (its own nodes, names and input arrays; one more
 * reference to each constant), or NULL (out of memory). */
tr_graph *tr_graph_copy(const tr_graph *g);
/* Readers of each node of g, outputs counted (em_calloc'd, g->nnodes + 1
 * slots; NULL: out of memory): what rewriting passes ask of a value. */
int *tr_count_uses(const tr_graph *g);
/* A rewriting pass's result: a copy of g with rewrite(copy, i, ctx)
 * applied to each node i where hit[i], then the dead nodes dropped
 * (tr_dce_map, with map); NULL when out of memory or a rewrite failed. */
typedef bool (*tr_rewrite_fn)(tr_graph *g, int i, void *ctx);
tr_graph *tr_copy_rewritten(const tr_graph *g, const bool *hit, tr_rewrite_fn rewrite, void *ctx, int *map);
/* Each returns the new node's index, or -1 (error set). */
int tr_add_input(tr_graph *g, const char *name, const em_meta *m);
int tr_add_const(tr_graph *g, em_tensor *t); /* takes a new reference to t */
int tr_add_call(tr_graph *g, em_op op, int nin, const int *in, const em_op_attrs *a,
                const em_meta *m);
em_status tr_set_outputs(tr_graph *g, int n, const int *nodes);
/* The meta of tensor t (sizes, strides, offset, dtype, device). */
void tr_meta_of(const em_tensor *t, em_meta *m);
/* Whether two nodes compute the same thing from the same inputs: same op,
 * inputs and (meaningful) attrs. */
bool tr_same_call(const tr_node *a, const tr_node *b);
/* A hash of what tr_same_call compares. */
uint64_t tr_call_hash(const tr_node *n);
/* Whether removing or merging n would change what the program does beyond
 * its result (rand/randn advance their generator; empty has no value; an
 * update such as index_copy_ writes its input). */
bool tr_has_effect(const tr_node *n);

/* ---- text.c: the text form ----
 *
 *   graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}) {
 *     %2 = constant #0 : f32[16]{1}
 *     %3 = matmul(%x, %w) : f32[4, 16]{16, 1}
 *     %4 = add(%3, %2) : f32[4, 16]{16, 1}
 *     %5 = full() [sizes=[], value=0.5, dtype=f32, device=cpu] : f32[]{}
 *     return (%4, %5)
 *   }
 *
 * Node k prints as %k, except inputs, which print as %name.  A meta is
 * dtype[sizes]{strides}, then +offset when nonzero and @device when not
 * the CPU.  Attrs print in brackets, only those the op reads (ops.def),
 * with floats in %.17g so that the text parses back to the same graph. */
em_status tr_print(const tr_graph *g, FILE *f);
/* The text form in a buffer from em_malloc (caller em_free's), or NULL. */
char *tr_to_text(const tr_graph *g);
/* Parses the text form.  consts[0..nconsts) are the tensors of the
 * constant slots (a reference is taken); a graph with more constants than
 * given is an error.  Every malformed input is an error (EM_ERR_ARG, with
 * line and column), never a crash; the result is verified. */
tr_graph *tr_parse(const char *text, em_tensor *const *consts, int nconsts);
/* Parses the text form with stand-ins for the constants: tensors of the
 * text's metas without storage (em_tensor_meta_only), for passes and
 * compilers that read only metas.  Such a graph must never run. */
tr_graph *tr_parse_placeholders(const char *text);
/* Graphviz DOT: one box per node (op, meta), edges from inputs. */
em_status tr_print_dot(const tr_graph *g, FILE *f);

/* ---- passes: one per file, run in order by tr_optimize (passes.c) ---- */
em_status tr_verify(const tr_graph *g); /* verify.c: the invariants below */
int tr_dce(tr_graph *g);                /* dce.c: returns nodes removed */
/* The same, with where each node went into map (g->nnodes slots before
 * the call: its new index, or -1 when removed); -1 when out of memory
 * (nothing removed, map untouched). */
int tr_dce_map(tr_graph *g, int *map);
/* verify.c: the metas every node of g would have for inputs of metas
 * inputs[0..ninputs) (constants keep theirs), by each op's infer rule and
 * eager mode's layout of results; out has g->nnodes slots.  An error names
 * the first node whose op rejects its inputs.  (Dynamic shapes re-run a
 * graph's shapes for another call's sizes with it.) */
em_status tr_infer_metas(const tr_graph *g, const em_meta *inputs, em_meta *out);
/* One call node's part of it: metas[i] from the metas of its inputs. */
em_status tr_infer_node(const tr_graph *g, int i, em_meta *metas);
/* Node i's meta set from its inputs' metas in g (a pass that adds a call
 * computes its result's layout so); the infer rule's error otherwise. */
em_status tr_infer_own(tr_graph *g, int i);
int tr_cse(tr_graph *g);                /* cse.c: returns nodes merged */
/* order.c: the inputs moved to the front, by input number (the order the
 * text form's parser builds), so that printing, parsing and printing again
 * gives the same text; returns the nodes moved */
int tr_inputs_first(tr_graph *g);
em_status tr_optimize(tr_graph *g, bool verify_each);
/* attention.c: each matmul(q, k^T) -> scale -> [additive mask] [causal
 * where(j > i, -inf, .)] -> softmax over the last dim -> matmul(., v)
 * chain of f32 whose intermediates nothing else reads becomes one
 * attention node (ops.def), the dead nodes dropped.  Not in tr_optimize:
 * the engine runs it for devices that run that node (jit_device's
 * fused_attention).  Returns the rewritten copy of g (caller frees) with
 * *nfused > 0; NULL with *nfused 0 when nothing matched, with -1 when
 * out of memory (error set). */
tr_graph *tr_fuse_attention(const tr_graph *g, int *nfused);
/* The same; map (g->nnodes slots, or NULL) gets where each of g's nodes
 * is in the result (-1: removed), for data that names g's nodes
 * (dynamic shapes' attribute sizes). */
tr_graph *tr_fuse_attention_map(const tr_graph *g, int *nfused, int *map);
/* The same, and f16/bf16 attention too (the softmax computed in f32
 * between two casts, as em_softmax records it for half scores: q, k, v,
 * the mask and the result of one half dtype) where takes(ctx, dtype, D,
 * Dv) says the fused op runs on such operands with head sizes D and Dv
 * (NULL: f32 only, as tr_fuse_attention_map). */
typedef bool (*tr_attention_takes)(void *ctx, em_dtype dt, int64_t D, int64_t Dv);
tr_graph *tr_fuse_attention_for(const tr_graph *g, tr_attention_takes takes, void *ctx, int *nfused,
                                int *map);
/* linear.c: each add(matmul(a, w), bias) (either order) whose matmul
 * nothing else reads, bias of sizes 1 but its last, one dtype, becomes one
 * linear node (ops.def), where want(ctx, g, matmul node, bias node, act)
 * says yes (NULL: always); when the add's one reader is relu, gelu_tanh or
 * gelu (not an output, the same dtype), want is asked first with that
 * activation (EM_ACT_RELU, EM_ACT_GELU_TANH, EM_ACT_GELU) and a yes folds the act into
 * the node too; else with EM_ACT_NONE.  Not in tr_optimize: the engine
 * runs it for devices that add the bias in their matmul kernels
 * (jit_device's fuse_linear).  Returns the rewritten copy (caller frees)
 * with *nfused > 0 (the linear nodes made); NULL with *nfused 0 when
 * nothing matched, -1 when out of memory; map as tr_fuse_attention_map's. */
typedef bool (*tr_linear_want)(void *ctx, const tr_graph *g, int matmul, int bias, em_act act);
tr_graph *tr_fuse_linear_map(const tr_graph *g, tr_linear_want want, void *ctx, int *nfused, int *map);
/* split.c: each sum, mean, amax or amin with fewer than
 * rows result elements and at least 65536 reduced ones, or (long_row >
 * 0) over one dim of at least long_row elements, becomes a partial
 * reduction with more results and a final one over the partials (the
 * file's comment says how it splits; a softmax's sum of exp(x - max)
 * splits with its max, as an online softmax); cuts: whether a reduced dim
 * may be cut in two by a reshape view (false for graphs of dynamic
 * sizes).  Not in tr_optimize: the engine runs it for devices that ask
 * (jit_device's split_rows, split_long).  Returns the rewritten copy
 * (caller frees) with *nsplit > 0; NULL with *nsplit 0 when nothing
 * split, -1 when out of memory; map as tr_fuse_attention_map's. */
tr_graph *tr_split_reductions(const tr_graph *g, int64_t rows, int64_t long_row, bool cuts, int *nsplit,
                              int *map);
/* Invariants (tr_verify): nodes in topological order (inputs < index);
 * inputs numbered 0..ninputs-1 once each, with unique names; constants in
 * range and present; calls with a valid op, the table's arity, and a meta
 * that the op's infer rule reproduces from the inputs' metas; at least
 * one output, each a valid node. */

/* Removes the nodes keep[i] == false, renumbering inputs and outputs.
 * (No node kept may use a node removed.) */
void tr_compact(tr_graph *g, const bool *keep);

/* ---- record.c: capturing a graph while code runs eagerly ---- */
typedef struct tr_recorder tr_recorder;
/* The distinct sizes the recorded code read with em_size so far (at most
 * TR_MAX_SIZE_READS), in *sizes (valid until the recording ends); their
 * count. */
#define TR_MAX_SIZE_READS 32
int tr_record_size_reads(const tr_recorder *r, const int64_t **sizes);
/* Starts recording on this thread: ops run eagerly and append nodes.
 * inputs are the function's declared inputs (names may be NULL).  The
 * recorder and the graph are allocated with the allocator current here,
 * whatever allocator the traced code runs under (free the graph with it). */
tr_recorder *tr_record_begin(int ninputs, em_tensor *const *inputs, const char *const *names);
/* The same, but ops run through run (its fn and ud) instead of eagerly:
 * a lazy mode's hook makes the trace record ops without computing them. */
tr_recorder *tr_record_begin_with(int ninputs, em_tensor *const *inputs, const char *const *names,
                                  em_dispatch_hook run);
/* Stops recording.  Returns the graph whose outputs are outs, or NULL:
 * on a graph break (the reason is copied to why) or on error. */
tr_graph *tr_record_end(tr_recorder *r, int nout, em_tensor *const *outs, char *why,
                        size_t whylen);
/* Stops recording and drops everything (the function failed). */
void tr_record_abort(tr_recorder *r);

#endif
