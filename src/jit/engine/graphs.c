/* graphs.c - device graphs: a compiled state's plan captured once per set
 * of sizes through the device's capture hooks (engine.h; CUDA graphs on
 * the GPU) and replayed with one launch per call, so an entry of many
 * small kernels costs one launch of host time instead of one per kernel.
 * Everything here is device-independent: when to capture, what a replay
 * needs (its inputs where the graph reads them, its outputs handed out),
 * the bounds, the fallbacks.  The device only records and replays.
 *
 * The rules, and why:
 *  - When: a size's second run is captured, its first runs with plain
 *    launches (a warm-up, as torch's: kernels an eager step loads on first
 *    use, cuBLAS's handle, a module's shared-memory opt-in are made
 *    outside the capture, where they may synchronize).
 *  - Memory: what the plan allocates while it is captured comes from the
 *    capture's pool and stays the graph's until the state is freed (a
 *    replay writes those addresses again); the plan frees each
 *    intermediate after its last reader as always, into that pool, so a
 *    graph holds its run's peak, not its sum.
 *  - Inputs are read where the caller's tensors are: the graph bakes each
 *    input's address, and a call whose inputs are all there replays at no
 *    extra cost (a caller that refills one buffer, a persistent cache, or
 *    the allocator handing the same block back for a tensor made anew
 *    each call).  An input found at another address is staged from then
 *    on: the graph is captured again reading a buffer it owns, and each
 *    call copies that input in first (one device copy, as torch's static
 *    inputs).  Staging only where addresses move keeps the common case
 *    copy-free and bounds recaptures by the number of inputs.  A staged
 *    input the graph writes in place (index_copy_) is copied back after
 *    each replay, so the caller's tensor is written as eagerly.  A moving
 *    input that is not contiguous is not staged: that size runs with plain
 *    launches from then on.
 *  - Outputs: the graph writes the same blocks on every replay, and a
 *    caller may keep an output across calls (torch.compile's
 *    reduce-overhead mode makes that an error instead, "overwritten by a
 *    subsequent run").  A replay hands out views of the graph's own output
 *    blocks as long as the caller dropped the previous call's outputs
 *    before the next call (no copy: what a loop that consumes each result
 *    does); the storage's reference count says so exactly, since no other
 *    tensor can reach those blocks.  The first time a call finds an output
 *    of an earlier replay still held (kept in a list, a view of it made,
 *    passed back in as an input), that output stays the caller's: the
 *    graph is captured again with blocks of its own, and from then on each
 *    call copies its outputs out into fresh tensors (one allocation and
 *    one device copy per output: about 6 us of host time on the H200,
 *    docs/benchmarks.md).  Either way a kept output is never written again.
 *  - Never captured: graphs that draw random numbers (the generator moves
 *    on each call; a replay would repeat the draw), graphs whose output is
 *    an input or a constant, the sizes of a dynamic state past its memo
 *    (no stable spec to key the graph by), anything the device refuses
 *    (a copy with the host, an op on the host path), or past the bounds
 *    (JIT_GRAPHS_MAX graphs, JIT_GRAPHS_MAX_BYTES of device memory per
 *    state).  Each is logged once (EMBER_LOG=cudagraphs) and that size runs
 *    with plain launches, the result the same.
 *  - One replay at a time per state (the staging buffers and held outputs
 *    are shared): a call that finds another thread replaying runs with
 *    plain launches. */
#include "engine-impl.h"

#include <stdatomic.h>
#include <string.h>

struct jit_graph_slot {
    const jit_spec *spec;   /* the sizes it serves (NULL: a static state) */
    int runs;               /* plain runs so far (the first warms up) */
    bool off;               /* these sizes run with plain launches for good */
    jit_graph *graph;       /* the device's graph, or NULL */
    size_t bytes;           /* device memory of the graph and its staging buffers */
    int ninputs, noutputs;
    bool copy_out;          /* outputs are copied out (a caller kept one) */
    void **addr;            /* per input: the address the graph reads (unstaged inputs) */
    em_tensor **stage;      /* per input: its staging buffer, or NULL */
    bool *written;          /* per input: the graph writes it in place (a staged
                               one is copied back after each replay) */
    em_tensor **outs;       /* per output: the tensor the graph writes, held */
};

/* ---- slots ---- */

static jit_graph_slot *slot_new(const tr_graph *g, const jit_spec *sp) {
    jit_graph_slot *sl = em_calloc(1, sizeof *sl);
    if (!sl) return NULL;
    sl->spec = sp;
    sl->ninputs = g->ninputs;
    sl->noutputs = g->noutputs;
    sl->addr = em_calloc((size_t)g->ninputs + 1, sizeof *sl->addr);
    sl->stage = em_calloc((size_t)g->ninputs + 1, sizeof *sl->stage);
    sl->outs = em_calloc((size_t)g->noutputs + 1, sizeof *sl->outs);
    sl->written = em_calloc((size_t)g->ninputs + 1, sizeof *sl->written);
    if (sl->addr && sl->stage && sl->outs && sl->written) {
        for (int i = 0; i < g->nnodes; i++) {
            int v = i; /* a write's base, through earlier writes (record.c's writable) */
            while (g->nodes[v].kind == TR_CALL && em_op_table[g->nodes[v].op].kind == EM_KIND_UPDATE)
                v = g->nodes[v].in[0];
            if (v != i && g->nodes[v].kind == TR_INPUT) sl->written[g->nodes[v].index] = true;
        }
        return sl;
    }
    em_free(sl->addr), em_free(sl->stage), em_free(sl->outs), em_free(sl->written), em_free(sl);
    return NULL;
}

/* Frees sl's graph and the outputs it holds (the staging buffers stay). */
static void drop_graph(jit_compiled *st, jit_graph_slot *sl) {
    if (sl->graph) st->dev->graph_free(sl->graph);
    sl->graph = NULL;
    for (int j = 0; j < sl->noutputs; j++) {
        em_release(sl->outs[j]);
        sl->outs[j] = NULL;
    }
    st->graph_bytes -= sl->bytes;
    sl->bytes = 0;
}

static void slot_free(jit_compiled *st, jit_graph_slot *sl) {
    drop_graph(st, sl);
    for (int i = 0; i < sl->ninputs; i++) em_release(sl->stage[i]);
    em_free(sl->addr), em_free(sl->stage), em_free(sl->outs), em_free(sl->written), em_free(sl);
}

void jit_graphs_free(jit_compiled *st) {
    for (int i = 0; i < st->nslots; i++) slot_free(st, st->slots[i]);
    st->nslots = 0;
}

/* The slot for sp's sizes, made when there is room (NULL: none). */
static jit_graph_slot *slot_of(jit_compiled *st, const tr_graph *g, const jit_spec *sp) {
    for (int i = 0; i < st->nslots; i++)
        if (st->slots[i]->spec == sp) return st->slots[i];
    if (st->nslots == JIT_GRAPHS_MAX) return NULL;
    jit_graph_slot *sl = slot_new(g, sp);
    if (sl) st->slots[st->nslots++] = sl;
    else em_clear_error(); /* no memory: plain launches */
    return sl;
}

/* Turns sl's sizes to plain launches for good, saying why once. */
static void turn_off(jit_compiled *st, jit_graph_slot *sl, const char *why) {
    jit_logf(st->log, JIT_LOG_DEVGRAPHS, "%s graph not used%s: %s; the entry runs with plain launches",
             st->dev->name, sl->spec ? " for these sizes" : "", why);
    drop_graph(st, sl);
    sl->off = true;
    em_clear_error();
}

/* Why g may never be replayed as a graph, or NULL. */
static const char *never(const tr_graph *g) {
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].kind == TR_CALL && (g->nodes[i].op == EM_OP_RAND || g->nodes[i].op == EM_OP_RANDN))
            return "the graph draws random numbers (a replay would repeat them)";
    for (int o = 0; o < g->noutputs; o++) {
        const tr_node *n = &g->nodes[g->outputs[o]];
        if (n->kind != TR_CALL) return "an output is an input or a constant";
        if (em_op_table[n->op].kind == EM_KIND_UPDATE) return "an output is a tensor written in place";
    }
    return NULL;
}

/* ---- capture ---- */

static size_t nbytes_of(const em_tensor *t) {
    return (size_t)em_numel(t) * em_dtype_size(t->dtype);
}

/* A staging buffer like input t (contiguous), held by the caller. */
static em_tensor *stage_like(const em_tensor *t) {
    em_meta m;
    tr_meta_of(t, &m);
    em_scope_begin();
    em_tensor *b = em_retain(em_tensor_alloc(&m));
    em_scope_end();
    return b;
}

/* Runs the plan under the device's capture with the inputs where the
 * graph will read them; the graph and the outputs it writes into sl. */
static em_status capture_into(jit_compiled *st, jit_graph_slot *sl, const tr_graph *g, const jit_spec *sp,
                              em_tensor **ins, em_tensor **res, bool *began) {
    jit_capture *cap = NULL;
    jit_graph *graph = NULL;
    em_scope_begin(); /* the run's outputs land here; sl keeps a reference */
    em_status s = st->dev->capture_begin(st->index, &cap);
    *began = s == EM_OK;
    if (s == EM_OK) {
        em_status run = jit_exec(st, g, sp, ins, res);
        char why[256];
        snprintf(why, sizeof why, "%s", em_last_error());
        s = st->dev->capture_end(cap, run == EM_OK, &graph);
        if (run != EM_OK) s = em_error(run, "%s", why); /* the op's reason, not "failed" */
    }
    for (int j = 0; s == EM_OK && j < sl->noutputs; j++) sl->outs[j] = em_retain(res[j]);
    em_scope_end();
    sl->graph = graph;
    return s;
}

/* Captures sl's graph for inputs in (staged ones read from their
 * buffers); false (logged, sl off) when none can be made. */
static bool capture(jit_compiled *st, jit_graph_slot *sl, const tr_graph *g, const jit_spec *sp,
                    em_tensor *const *in) {
    const char *why = never(g);
    if (why) {
        turn_off(st, sl, why);
        return false;
    }
    em_tensor **ins = em_malloc(sizeof *ins * ((size_t)sl->ninputs + 1));
    em_tensor **res = em_calloc((size_t)sl->noutputs + 1, sizeof *res);
    em_status s = ins && res ? EM_OK : em_last_status();
    size_t staged = 0;
    for (int i = 0; s == EM_OK && i < sl->ninputs; i++) {
        ins[i] = sl->stage[i] ? sl->stage[i] : in[i];
        sl->addr[i] = sl->stage[i] ? NULL : em_data(in[i]);
        staged += sl->stage[i] ? nbytes_of(sl->stage[i]) : 0;
    }
    bool began = false;
    if (s == EM_OK) s = capture_into(st, sl, g, sp, ins, res, &began);
    em_free(ins);
    em_free(res);
    if (s == EM_ERR_STATE && !began) { /* another thread captures on the device: later */
        em_clear_error();
        return false;
    }
    if (s != EM_OK) {
        char msg[320];
        snprintf(msg, sizeof msg, "the capture failed: %s", em_last_error());
        turn_off(st, sl, msg);
        return false;
    }
    sl->bytes = st->dev->graph_bytes(sl->graph) + staged;
    st->graph_bytes += sl->bytes;
    if (st->graph_bytes > JIT_GRAPHS_MAX_BYTES) {
        turn_off(st, sl, "the state's graphs would hold more device memory than the bound (2 GiB)");
        return false;
    }
    st->graphs_captured++;
    jit_logf(st->log, JIT_LOG_DEVGRAPHS, "%s graph captured (%d plan steps, %zu bytes of device memory)",
             st->dev->name, st->plan.nsteps, sl->bytes);
    return true;
}

/* The first unstaged input not where sl's graph reads it, or -1. */
static int moved_input(const jit_graph_slot *sl, em_tensor *const *in) {
    for (int i = 0; i < sl->ninputs; i++)
        if (!sl->stage[i] && em_data(in[i]) != sl->addr[i]) return i;
    return -1;
}

/* Whether the caller still holds an output the graph would write: its
 * storage referenced by another tensor than sl's own. */
static bool outputs_kept(const jit_graph_slot *sl) {
    for (int j = 0; !sl->copy_out && j < sl->noutputs; j++)
        if (atomic_load(&sl->outs[j]->storage->refcount) > 1) return true;
    return false;
}

/* Stages every input that moved, then captures again; false: off. */
static bool restage(jit_compiled *st, jit_graph_slot *sl, const tr_graph *g, const jit_spec *sp,
                    em_tensor *const *in) {
    for (int i = moved_input(sl, in); i >= 0; i = moved_input(sl, in)) {
        if (!em_is_contiguous(in[i])) {
            turn_off(st, sl, "an input moved to another address and is not contiguous (it cannot be staged)");
            return false;
        }
        if (!(sl->stage[i] = stage_like(in[i]))) {
            turn_off(st, sl, "no device memory for a staging buffer");
            return false;
        }
    }
    drop_graph(st, sl);
    return capture(st, sl, g, sp, in);
}

/* Whether sl has a graph for these inputs now: captured when due. */
static bool ready(jit_compiled *st, jit_graph_slot *sl, const tr_graph *g, const jit_spec *sp,
                  em_tensor *const *in) {
    if (sl->off) return false;
    if (!sl->graph) return sl->runs++ >= 1 && capture(st, sl, g, sp, in);
    bool kept = outputs_kept(sl);
    if (kept) { /* those blocks are the caller's now: new ones, copied out from now on */
        sl->copy_out = true;
        jit_logf(st->log, JIT_LOG_DEVGRAPHS, "%s graph: an output is kept across calls: captured "
                 "again, its outputs copied out from now on", st->dev->name);
    }
    return (!kept && moved_input(sl, in) < 0) || restage(st, sl, g, sp, in);
}

/* ---- replay ---- */

/* A tensor of the caller's with t's values (t the graph's output): a view
 * of t's block, or with copy_out a fresh tensor. */
static em_tensor *hand_out(const em_tensor *t, bool copy_out) {
    em_meta m;
    if (!copy_out) {
        tr_meta_of(t, &m);
        return em_tensor_view(t, &m);
    }
    if (!em_is_contiguous(t)) return em_contiguous((em_tensor *)t); /* a view: a copy op */
    tr_meta_of(t, &m);
    em_tensor *c = em_tensor_alloc(&m);
    const em_backend *b = c ? em_backend_for(t->device) : NULL;
    if (b && b->copy(em_data(c), t->device, em_data(t), t->device, nbytes_of(t)) == EM_OK) return c;
    em_tensor_discard(c);
    return NULL;
}

/* Copies the staged inputs in, launches the graph, copies the staged
 * inputs it writes back out, hands the outputs out (all in order on the
 * device's queue). */
static em_status replay(jit_compiled *st, jit_graph_slot *sl, em_tensor *const *in, em_tensor **out) {
    em_status s = EM_OK;
    for (int i = 0; s == EM_OK && i < sl->ninputs; i++) {
        if (!sl->stage[i]) continue;
        const em_backend *b = em_backend_for(in[i]->device);
        s = b ? b->copy(em_data(sl->stage[i]), in[i]->device, em_data(in[i]), in[i]->device,
                        nbytes_of(in[i]))
              : em_last_status();
    }
    if (s == EM_OK) s = st->dev->graph_launch(sl->graph);
    for (int i = 0; s == EM_OK && i < sl->ninputs; i++) { /* what the graph wrote of a staged input */
        if (!sl->stage[i] || !sl->written[i]) continue;
        const em_backend *b = em_backend_for(in[i]->device);
        s = b ? b->copy(em_data(in[i]), in[i]->device, em_data(sl->stage[i]), in[i]->device,
                        nbytes_of(in[i]))
              : em_last_status();
    }
    for (int j = 0; s == EM_OK && j < sl->noutputs; j++)
        if (!(out[j] = hand_out(sl->outs[j], sl->copy_out))) s = em_last_status();
    if (s == EM_OK) return EM_OK;
    for (int j = 0; j < sl->noutputs; j++) {
        em_tensor_discard(out[j]);
        out[j] = NULL;
    }
    return s;
}

em_status jit_graphs_run(jit_compiled *st, const tr_graph *g, jit_spec *sp, em_tensor *const *in,
                         em_tensor **out, bool *ran) {
    *ran = false;
    if (!st->graphs || (sp && sp->owned)) return EM_OK;
    if (pthread_mutex_trylock(&st->graph_lock) != 0) return EM_OK; /* another thread replays */
    const em_allocator *caller = em_get_allocator();
    em_set_allocator(st->alloc); /* the slots and what they hold are the state's */
    jit_graph_slot *sl = slot_of(st, g, sp);
    bool go = sl && ready(st, sl, g, sp, in);
    em_set_allocator(caller); /* the outputs are the caller's */
    if (go) {
        em_status s = replay(st, sl, in, out);
        *ran = s == EM_OK;
        st->graph_replays += *ran;
        if (s != EM_OK) {
            char why[320];
            snprintf(why, sizeof why, "a replay failed: %s", em_last_error());
            em_set_allocator(st->alloc);
            turn_off(st, sl, why);
            em_set_allocator(caller);
        }
    }
    pthread_mutex_unlock(&st->graph_lock);
    return EM_OK;
}

void jit_engine_graph_stats(jit_compiled *st, int64_t *captured, int64_t *replays) {
    *captured = *replays = 0;
    if (!st) return;
    pthread_mutex_lock(&st->graph_lock);
    *captured = st->graphs_captured;
    *replays = st->graph_replays;
    pthread_mutex_unlock(&st->graph_lock);
}
