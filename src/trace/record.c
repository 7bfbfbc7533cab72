/* record.c - capturing a graph while code runs eagerly.
 *
 * The recorder installs itself as the thread's dispatch hook.  Each op the
 * traced code calls runs eagerly (so the trace's results are real) and
 * appends a node.  A tensor the graph has not seen, used as an input, is a
 * constant: a weight reached through the function's context, or data made
 * with em_from_data inside it.  A host read (em_item, em_copy_to_host,
 * em_print) is a graph break: the values it reads can steer what the code
 * does next, which one graph cannot express.  An in-place write (an
 * EM_KIND_UPDATE op) rebinds the written tensor to the write's node, so
 * that the ops after it read the new value, as eagerly. */
#include "trace.h"

#include <string.h>

struct tr_recorder {
    tr_graph *g;
    em_dispatch_hook prev;   /* restored at the end */
    em_dispatch_hook run;    /* runs each op (fn NULL: eagerly) */
    /* tensor -> node: open addressing on the pointer.  Every key holds a
     * reference, so no tensor of the trace can die and have its address
     * reused by another while recording. */
    em_tensor **keys;
    int *vals;
    int cap, count;
    bool broken;
    char why[256];
    /* the distinct sizes the code read with em_size (TR_MAX_SIZE_READS at
     * most): what it computes with, a hint of which dims it is written for */
    int64_t reads[TR_MAX_SIZE_READS];
    int nreads;
    /* The allocator current at tr_record_begin: the recorder, its map and
     * its graph are allocated (and freed) with it whatever allocator the
     * traced code runs under, so the graph's owner can free it with one. */
    const em_allocator *alloc;
};

/* Switches to r's allocator; returns the traced code's, to restore. */
static const em_allocator *own_alloc(const tr_recorder *r) {
    const em_allocator *caller = em_get_allocator();
    em_set_allocator(r->alloc);
    return caller;
}

static size_t slot_of(const tr_recorder *r, const em_tensor *t) {
    uint64_t h = (uint64_t)(uintptr_t)t * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (size_t)(r->cap - 1);
}

static int map_get(const tr_recorder *r, const em_tensor *t) {
    for (size_t i = slot_of(r, t);; i = (i + 1) & (size_t)(r->cap - 1)) {
        if (!r->keys[i]) return -1;
        if (r->keys[i] == t) return r->vals[i];
    }
}

static bool map_put(tr_recorder *r, em_tensor *t, int node) {
    if (2 * (r->count + 1) > r->cap) {
        int cap = r->cap * 2;
        em_tensor **keys = em_calloc((size_t)cap, sizeof *keys);
        int *vals = em_malloc(sizeof *vals * (size_t)cap);
        if (!keys || !vals) {
            em_free(keys);
            em_free(vals);
            return false;
        }
        em_tensor **ok = r->keys;
        int *ov = r->vals, oc = r->cap;
        r->keys = keys;
        r->vals = vals;
        r->cap = cap;
        for (int i = 0; i < oc; i++) {
            if (!ok[i]) continue;
            size_t j = slot_of(r, ok[i]);
            while (keys[j]) j = (j + 1) & (size_t)(cap - 1);
            keys[j] = ok[i];
            vals[j] = ov[i];
        }
        em_free(ok);
        em_free(ov);
    }
    size_t i = slot_of(r, t);
    while (r->keys[i] && r->keys[i] != t) i = (i + 1) & (size_t)(r->cap - 1);
    if (!r->keys[i]) {
        r->keys[i] = em_retain(t);
        r->count++;
    }
    r->vals[i] = node;
    return true;
}

static void set_break(tr_recorder *r, const char *why) {
    if (r->broken) return;
    r->broken = true;
    snprintf(r->why, sizeof r->why, "%s", why);
}

/* The node of tensor t, adding it as a constant when the graph has not
 * seen it.  A constant is a value: a pending tensor (lazy mode) from
 * outside the trace is computed first, as eager code would compute it
 * once, so that every run of the graph reads its values.  (Inputs are
 * placeholders whatever their state: they are in the map from the
 * start.) */
static int node_of(tr_recorder *r, em_tensor *t) {
    int n = map_get(r, t);
    if (n >= 0) return n;
    if (!t->storage && em_force(t) != EM_OK) return -1; /* the values: the code's */
    const em_allocator *caller = own_alloc(r);
    n = tr_add_const(r->g, t);
    bool ok = n >= 0 && map_put(r, t, n);
    em_set_allocator(caller);
    return ok ? n : -1;
}

/* Whether node v may be written in place in a graph: an input or a
 * constant, or an earlier write of one.  A value the graph computes may
 * live in a kernel's buffer or be recomputed where it is read, so a write
 * into it would not reach every reader; a write through a view would leave
 * the base's node standing for both its old and new values (CSE would
 * merge a read before the write with one after). */
static bool writable(const tr_graph *g, int v) {
    while (g->nodes[v].kind == TR_CALL && em_op_table[g->nodes[v].op].kind == EM_KIND_UPDATE)
        v = g->nodes[v].in[0];
    return g->nodes[v].kind != TR_CALL;
}

static em_tensor *record_op(void *ud, const em_op_call *c, const em_meta *m) {
    tr_recorder *r = ud;
    /* Kernels may call ops themselves: those are not the program's. */
    em_dispatch_hook self = em_set_dispatch_hook((em_dispatch_hook){0});
    em_tensor *t = r->run.fn ? r->run.fn(r->run.ud, c, m) : em_dispatch_eager(c, m);
    em_set_dispatch_hook(self);
    if (!t || r->broken) return t;
    int stack[8], *in = c->nin <= 8 ? stack : em_malloc(sizeof(int) * (size_t)c->nin);
    bool ok = in != NULL;
    for (int i = 0; ok && i < c->nin; i++) ok = (in[i] = node_of(r, c->in[i])) >= 0;
    em_meta meta;
    tr_meta_of(t, &meta);
    const em_allocator *caller = own_alloc(r);
    bool update = ok && em_op_table[c->op].kind == EM_KIND_UPDATE;
    if (update && !writable(r->g, in[0])) {
        em_set_allocator(caller);
        set_break(r, "an in-place write into a view or a tensor the function computed (a graph "
                     "writes only inputs and tensors from outside it, such as a cache, whole)");
        if (in != stack) em_free(in);
        return t;
    }
    int n = ok ? tr_add_call(r->g, c->op, c->nin, in, c->attrs, &meta) : -1;
    ok = n >= 0 && map_put(r, t, n);
    /* the written tensor holds the new value from now on: later ops read it */
    if (ok && update) ok = map_put(r, c->in[0], n);
    em_set_allocator(caller);
    if (!ok) {
        char why[sizeof r->why];
        snprintf(why, sizeof why, "recording failed: %s", em_last_error());
        set_break(r, why);
        em_clear_error(); /* the op itself succeeded: keep its result valid */
    }
    if (in != stack) em_free(in);
    return t;
}

static void record_read(void *ud, const em_tensor *t, const char *what) {
    tr_recorder *r = ud;
    char why[256];
    int n = map_get(r, t);
    if (n >= 0)
        snprintf(why, sizeof why, "%s reads the values of %%%d (%s) while tracing", what, n,
                 r->g->nodes[n].kind == TR_CALL ? em_op_table[r->g->nodes[n].op].name : "input");
    else
        snprintf(why, sizeof why, "%s reads the values of a tensor while tracing", what);
    set_break(r, why);
}

static void record_size(void *ud, const em_tensor *t, int d) {
    tr_recorder *r = ud;
    int64_t v = t->sizes[d];
    for (int i = 0; i < r->nreads; i++)
        if (r->reads[i] == v) return;
    if (r->nreads < TR_MAX_SIZE_READS) r->reads[r->nreads++] = v;
}

int tr_record_size_reads(const tr_recorder *r, const int64_t **sizes) {
    *sizes = r->reads;
    return r->nreads;
}

tr_recorder *tr_record_begin(int ninputs, em_tensor *const *inputs, const char *const *names) {
    return tr_record_begin_with(ninputs, inputs, names, (em_dispatch_hook){0});
}

tr_recorder *tr_record_begin_with(int ninputs, em_tensor *const *inputs, const char *const *names,
                                  em_dispatch_hook run) {
    tr_recorder *r = em_malloc(sizeof *r);
    if (!r) return NULL;
    memset(r, 0, sizeof *r);
    r->alloc = em_get_allocator();
    r->run = run;
    r->cap = 64;
    r->keys = em_calloc((size_t)r->cap, sizeof *r->keys);
    r->vals = em_malloc(sizeof *r->vals * (size_t)r->cap);
    r->g = tr_graph_new();
    bool ok = r->keys && r->vals && r->g;
    for (int i = 0; ok && i < ninputs; i++) {
        em_meta m;
        tr_meta_of(inputs[i], &m);
        int n = tr_add_input(r->g, names ? names[i] : NULL, &m);
        /* the same tensor passed twice reads as the first input */
        ok = n >= 0 && (map_get(r, inputs[i]) >= 0 || map_put(r, inputs[i], n));
    }
    if (!ok) {
        r->prev = em_set_dispatch_hook((em_dispatch_hook){0});
        tr_record_abort(r);
        return NULL;
    }
    r->prev = em_set_dispatch_hook((em_dispatch_hook){record_op, r, record_read, record_size});
    return r;
}

static void recorder_free(tr_recorder *r) {
    em_set_dispatch_hook(r->prev);
    for (int i = 0; r->keys && i < r->cap; i++) em_release(r->keys[i]); /* NULL: out of memory */
    const em_allocator *a = r->alloc;
    em_free_with(a, r->keys);
    em_free_with(a, r->vals);
    em_free_with(a, r);
}

void tr_record_abort(tr_recorder *r) {
    if (!r) return;
    const em_allocator *caller = own_alloc(r);
    tr_graph_free(r->g);
    recorder_free(r);
    em_set_allocator(caller);
}

tr_graph *tr_record_end(tr_recorder *r, int nout, em_tensor *const *outs, char *why,
                        size_t whylen) {
    em_set_dispatch_hook(r->prev);
    tr_graph *g = r->g;
    int stack[16], *ids = nout <= 16 ? stack : em_malloc(sizeof(int) * (size_t)nout);
    bool ok = ids != NULL && !r->broken;
    for (int i = 0; ok && i < nout; i++) {
        if (!outs[i]) {
            em_error(EM_ERR_NULL, "the traced function left output %d NULL", i);
            ok = false;
        } else {
            ok = (ids[i] = node_of(r, outs[i])) >= 0;
        }
    }
    if (why && whylen) snprintf(why, whylen, "%s", r->broken ? r->why : "");
    const em_allocator *caller = own_alloc(r);
    if (ok) ok = tr_set_outputs(g, nout, ids) == EM_OK;
    r->g = NULL;
    recorder_free(r);
    if (!ok) tr_graph_free(g);
    em_set_allocator(caller);
    if (ids != stack) em_free(ids); /* the caller's, as it was made */
    return ok ? g : NULL;
}
