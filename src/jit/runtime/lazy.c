/* lazy.c - lazy mode: unmodified eager code runs through the JIT.
 *
 * With lazy mode on (em_lazy_begin, or EMBER_JIT=1 for every thread), the
 * dispatch hook does not run an op: it returns a tensor without storage
 * whose thunk (t->ext) holds the op, its attributes and references to its
 * inputs.  Pending tensors form a DAG whose leaves are real tensors.
 *
 * A tensor is computed (em_force) when its values are needed: a host read
 * (em_copy_to_host, em_item, em_print), an op that must run eagerly, em_sync,
 * an in-place write (which computes every pending tensor first, then runs),
 * or a DAG grown deeper than LZ_MAX_DEPTH ops.  Forcing t walks the DAG
 * below t (leaves become inputs), looks it up in the thread's entry table
 * (a hash index) by a 128-bit key over every op, attribute, meta and
 * output (the structural key) written during the walk, builds the graph
 * and compiles it with its device's backend (cpu or cuda, through the
 * auto backend) only on a miss (through the same kernel and plan caches
 * em_compile uses), runs it, and
 * gives t and every node someone else still holds their storage.  Nodes
 * only the graph needed stay pending: if read later they are recomputed
 * (ops are deterministic: random ops carry their Philox seed and offset).
 *
 * Errors: shape and dtype errors are found by each op's infer rule at the
 * op (dispatch runs it before the hook); only failures of the computation
 * itself (memory) surface at the read.
 *
 * Ownership: a thunk owns references to its inputs and to the thread's
 * lazy state; the state (entry table, cache) lives until its thread exits
 * and the last thunk made on it dies.  Its entries, their table, the
 * recompile limit, dynamic entries and background compiles are the
 * machinery em_compile shares (entry.c). */
#include "entry-impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LZ_MAX_DEPTH 256  /* pending ops on the longest path below a tensor before it is forced */

/* A graph structure (the cut's shape-free key): its size variants are one
 * group under the recompile limit. */
#define LZ_MAX_DYN 4
typedef struct lz_structure {
    kc_key key;          /* cut_keys' shape-free key (jit_index reads it first) */
    jit_limit limit;     /* its entries (size variants and its dynamic entry) */
    const jit_entry *first; /* its first entry (the sizes first seen), or NULL */
    /* Its dynamic entries, newest last: the first made at the second size
     * variant, each later one when sizes come that none serves (more dims
     * dynamic: the dims that changed since the newest, and its own). */
    jit_entry *dyn[LZ_MAX_DYN];
    int ndyn;
    bool dyn_refused;    /* one could not be made: other sizes stay specialized */
} lz_structure;

typedef struct lz_state {
    atomic_int refs;     /* the thread, each compile job, and the live thunks as
                            a group (one reference while nthunks > 0) */
    int64_t ops_deferred; /* under pending_lock (stats.ops_deferred is not kept) */
    int nthunks;         /* live thunks (under pending_lock): counting them here instead
                            of an atomic reference each saves ~10 ns an op */
    int depth;           /* em_lazy_begin nesting on the thread */
    em_dispatch_hook prev;
    pthread_mutex_t lock; /* the tables and the entries' compiled states (held across a
                            compile in the flush's thread) */
    pthread_mutex_t force_lock; /* held by a force (walk, run, adopt) of this state's
                            tensors: two threads reading one pending tensor must not
                            both compute it, nor one walk recipes the other's adopt
                            frees (recursive) */
    pthread_spinlock_t pending_lock; /* pending and nthunks: held for a few pointer
                            writes, by the recording thread or one releasing a
                            thunk; a mutex cost ~100 instructions an op */
    jit_table entries;   /* by the cut's key; never removed */
    jit_index structs;   /* shape-free key -> lz_structure */
    jit_index served;    /* a cut's key -> lz_served: the dynamic entry whose graph,
                            at that cut's sizes, was checked to be the cut's */
    int limit;           /* entries per structure before running eagerly */
    bool dynamic;        /* EMBER_DYNAMIC is not 0: a structure seen at a second
                            size gets a dynamic entry */
    bool async;          /* EMBER_ASYNC_COMPILE=1: new graphs compile in a thread */
    struct lz_thunk *pending; /* live thunks, for em_sync */
    jit_log log;
    jit_env env;
    char *record;        /* EMBER_RECORD: the warmup list new graphs go to, or NULL */
    bool record_failed;  /* a record could not be written (logged once) */
    jit_owner own;       /* what the entry machinery needs: lock, log, env, allocator */
    em_lazy_stats stats;
    const em_allocator *alloc;
} lz_state;

typedef struct lz_thunk {
    lz_state *st;           /* it lives in its tensor's block (freed with it) */
    em_tensor *self;     /* the tensor this thunk computes (not a reference) */
    struct lz_thunk *prev, *next; /* in st->pending */
    em_op op;
    int depth;           /* pending ops on the longest path down from this one */
    int nin;
    const em_op_attrs *attrs; /* a copy after in[] in this block, or, for an op that
                                 reads no attribute, a shared zero (saves copying
                                 200 bytes per op) */
    em_tensor *in[];     /* one reference each */
} lz_thunk;

static const em_op_attrs no_attrs;

static pthread_key_t state_key;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;

static void state_release(lz_state *st);

static void thread_exit(void *p) { state_release(p); }
static void make_key(void) { pthread_key_create(&state_key, thread_exit); }

/* ---- the thread's state ---- */

/* A graph (by its key) that a dynamic entry was shown to compute: the key
 * holds everything the graph is (its sizes and its attributes too), so a
 * cut of that key runs on the entry without a check. */
typedef struct lz_served {
    kc_key key; /* first: jit_index reads it */
    jit_entry *e;
} lz_served;

/* Past this many, a cut a dynamic entry serves is checked on every flush
 * instead of remembered (the index stays bounded in memory). */
#define LZ_MAX_SERVED 4096

static void state_release(lz_state *st) {
    if (!st || atomic_fetch_sub(&st->refs, 1) != 1) return;
    const em_allocator *saved = em_get_allocator();
    em_set_allocator(st->alloc);
    jit_table_free(&st->entries);
    for (int i = 0; i < st->structs.cap; i++) {
        lz_structure *sg = (lz_structure *)st->structs.slots[i];
        if (!sg) continue;
        for (int k = 0; k < sg->ndyn; k++) jit_entry_free(sg->dyn[k]);
        em_free(sg);
    }
    jit_index_free(&st->structs);
    for (int i = 0; i < st->served.cap; i++) em_free((void *)st->served.slots[i]);
    jit_index_free(&st->served);
    kc_close(st->env.cache);
    jit_log_close(&st->log);
    em_free(st->record);
    pthread_mutex_destroy(&st->lock);
    pthread_mutex_destroy(&st->force_lock);
    pthread_spin_destroy(&st->pending_lock);
    em_free(st);
    em_set_allocator(saved);
}

/* EMBER_RECORD's file (em_malloc'd), or NULL: lazy graphs are recorded
 * as em_compile's entries are, so any program can be warmed up. */
static char *record_path(void) {
    char buf[EM_ENV_MAX];
    const char *p = em_getenv("EMBER_RECORD", buf, sizeof buf);
    size_t n = p ? strlen(p) : 0;
    char *d = n ? em_malloc(n + 1) : NULL;
    if (d) memcpy(d, p, n + 1);
    return d;
}

static bool recursive_mutex_init(pthread_mutex_t *m) {
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a) != 0) return false;
    bool ok = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE) == 0 &&
              pthread_mutex_init(m, &a) == 0;
    pthread_mutexattr_destroy(&a);
    return ok;
}

/* ---- what the entry machinery (entry.c) calls back ---- */

static lz_state *owner_state(const jit_owner *o) {
    return (lz_state *)((char *)o - offsetof(lz_state, own));
}

/* A background compile holds a reference to the state. */
static void state_hold(jit_owner *o) { atomic_fetch_add(&owner_state(o)->refs, 1); }
static void state_drop(jit_owner *o) { state_release(owner_state(o)); }

/* Counts one graph compiled and its kernels (under the lock).  A
 * structure's dynamic entry is counted by lookup, once it is kept. */
static void count_compile(jit_owner *o, jit_entry *e, jit_compile_end how) {
    lz_state *st = owner_state(o);
    if (how == JIT_COMPILE_CANCELLED || e->guards) return;
    st->stats.graphs_compiled++;
    st->stats.kernels_compiled += e->kernels_compiled;
    st->stats.kernels_loaded += e->kernels_loaded;
}

static void log_dynamic(const jit_owner *o, const jit_entry *e, bool compiled, const char *why) {
    (void)e;
    if (why)
        jit_logf(o->log, JIT_LOG_RECOMPILES, "lazy mode: a graph structure stays specialized "
                 "to its sizes: %s", why);
    else if (compiled)
        jit_logf(o->log, JIT_LOG_RECOMPILES, "lazy mode: a graph structure seen at a second "
                 "size has a dynamic entry now");
}

static lz_state *state_get(bool create) {
    pthread_once(&state_once, make_key);
    lz_state *st = pthread_getspecific(state_key);
    if (st || !create) return st;
    st = em_calloc(1, sizeof *st);
    if (!st) return NULL;
    atomic_init(&st->refs, 1);
    st->alloc = em_get_allocator();
    jit_log_open(&st->log);
    /* the same settings as em_compile ("force" acts as "auto" here) */
    st->limit = jit_env_recompile_limit(&st->log);
    st->async = jit_env_flag("EMBER_ASYNC_COMPILE");
    st->dynamic = jit_env_dynamic(&st->log) >= 0;
    st->env.log = &st->log;
    st->env.autotune = jit_env_autotune(&st->log);
    st->env.cache = jit_cache_open(&st->log);
    st->record = record_path();
    bool spin = pthread_spin_init(&st->pending_lock, PTHREAD_PROCESS_PRIVATE) == 0;
    bool locked = spin && pthread_mutex_init(&st->lock, NULL) == 0;
    bool forcing = locked && recursive_mutex_init(&st->force_lock);
    st->own = (jit_owner){.name = "lazy mode", .lock = &st->lock, .log = &st->log,
                          .env = &st->env, .alloc = st->alloc, .async = st->async,
                          .hold = state_hold, .drop = state_drop, .compiled = count_compile,
                          .log_dynamic = log_dynamic,
                          .eager_check = jit_env_eager_check(&st->log)};
    if (!forcing || pthread_setspecific(state_key, st) != 0) {
        if (forcing) pthread_mutex_destroy(&st->force_lock);
        if (locked) pthread_mutex_destroy(&st->lock);
        if (spin) pthread_spin_destroy(&st->pending_lock);
        kc_close(st->env.cache);
        jit_log_close(&st->log);
        em_free(st->record);
        em_free(st);
        em_error(EM_ERR_NOMEM, "lazy mode: cannot set up the thread's state");
        return NULL;
    }
    return st;
}

/* ---- thunks ---- */

static void pending_unlink(lz_thunk *k) {
    if (k->prev) k->prev->next = k->next;
    else k->st->pending = k->next;
    if (k->next) k->next->prev = k->prev;
    k->prev = k->next = NULL;
}

/* The tensor is dying, or has its values: drop the recipe. */
static void thunk_free(void *p) {
    lz_thunk *k = p;
    if (!k) return;
    lz_state *st = k->st;
    pthread_spin_lock(&st->pending_lock);
    pending_unlink(k);
    bool last = --st->nthunks == 0;
    pthread_spin_unlock(&st->pending_lock);
    for (int i = 0; i < k->nin; i++) em_release(k->in[i]);
    k->nin = 0;
    /* the group's reference: a thunk made meanwhile took a new one (0 -> 1
     * under the lock), so this one is still ours to drop */
    if (last) state_release(st);
}

/* Another thread may be adopting t's values meanwhile (adopt publishes
 * the storage last, then clears the recipe): the loads pair with its
 * stores, so a thread that sees the storage sees the strides too. */
static lz_thunk *thunk_of(const em_tensor *t) {
    if (!t || __atomic_load_n(&t->storage, __ATOMIC_ACQUIRE)) return NULL;
    if (__atomic_load_n(&t->ext_free, __ATOMIC_ACQUIRE) != thunk_free) return NULL;
    return __atomic_load_n(&t->ext, __ATOMIC_ACQUIRE);
}

/* ---- the cut: the pending DAG below some tensors ---- */

/* A flush walks the DAG once, numbering its nodes as the graph would
 * (inputs of a node first) and writing the key material as it goes; the
 * tr_graph itself is built only when the table has no entry for the key
 * (a miss), so a hit costs one walk and one hash. */
typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
    bool heap;           /* p was allocated (else it is the cut's inline buffer) */
    bool failed;         /* an append could not allocate */
} bytes;

#define CUT_INLINE 64    /* nodes a cut holds before it allocates (tiny graphs never do) */
#define BYTES_INLINE 2048

typedef struct cut {
    em_tensor **keys;   /* tensor -> node, open addressing on the pointer */
    int *vals;
    int cap;            /* of the map; the node arrays hold cap / 2 */
    int nnodes;
    em_tensor **nodes;  /* node -> tensor */
    int *internal;      /* node -> references from thunks of the cut */
    em_tensor **inputs; /* the leaves, by input number */
    int ninputs;
    int *outs;          /* the graph's outputs, by node */
    int nout;
    bytes shape_free;   /* key material: ops, attributes, dtypes, ranks, edges, outputs */
    bytes sizes;        /* key material: each node's sizes, strides and offset */
    tr_graph *g;        /* built on a miss (cut_graph) */
    /* the first storage of the above, so that a small flush allocates
     * nothing for its walk */
    struct {
        em_tensor *keys[2 * CUT_INLINE];
        int vals[2 * CUT_INLINE];
        em_tensor *nodes[CUT_INLINE], *inputs[CUT_INLINE];
        int internal[CUT_INLINE];
        uint8_t shape_free[BYTES_INLINE], sizes[BYTES_INLINE];
    } first;
} cut;

static void bytes_grow(bytes *b, size_t n) {
    size_t cap = 2 * b->cap;
    while (cap < b->n + n) cap *= 2;
    uint8_t *p = em_malloc(cap);
    if (!p) {
        b->failed = true;
        return;
    }
    memcpy(p, b->p, b->n);
    if (b->heap) em_free(b->p);
    b->p = p;
    b->cap = cap;
    b->heap = true;
}

static inline void bytes_put(bytes *b, const void *data, size_t n) {
    if (b->n + n > b->cap) bytes_grow(b, n);
    if (b->failed) return;
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static inline void bytes_u64(bytes *b, uint64_t v) { bytes_put(b, &v, sizeof v); }

static size_t slot(const cut *c, const em_tensor *t) {
    uint64_t h = (uint64_t)(uintptr_t)t * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (size_t)(c->cap - 1);
}

static int cut_find(const cut *c, const em_tensor *t, size_t *at) {
    size_t i = slot(c, t);
    while (c->keys[i] && c->keys[i] != t) i = (i + 1) & (size_t)(c->cap - 1);
    *at = i;
    return c->keys[i] ? c->vals[i] : -1;
}

/* A copy of the n bytes at p in a new block of size bytes (zeroed past n);
 * the old one is freed if it was allocated. */
static void *regrow(void *p, size_t n, size_t size, bool heap) {
    void *q = em_calloc(size, 1);
    if (q && n) memcpy(q, p, n);
    if (q && heap) em_free(p);
    return q;
}

/* Room for one more node: the map at most half full. */
static bool cut_reserve(cut *c) {
    if (2 * (c->nnodes + 1) <= c->cap) return true;
    int cap = 2 * c->cap, half = c->cap / 2;
    bool heap = c->keys != c->first.keys;
    em_tensor **keys = em_calloc((size_t)cap, sizeof *keys);
    int *vals = em_malloc(sizeof(int) * (size_t)cap);
    em_tensor **nodes = NULL, **inputs = NULL;
    int *internal = NULL;
    size_t po = sizeof(void *) * (size_t)half, pn = sizeof(void *) * (size_t)c->cap;
    if (keys && vals && (nodes = regrow(c->nodes, po, pn, heap)) &&
        (internal = regrow(c->internal, sizeof(int) * (size_t)half, sizeof(int) * (size_t)c->cap, heap)) &&
        (inputs = regrow(c->inputs, po, pn, heap))) {
        c->nodes = nodes, c->internal = internal, c->inputs = inputs;
    } else { /* the arrays that moved are in place; the rest stay */
        if (nodes) c->nodes = nodes;
        if (internal) c->internal = internal;
        em_free(keys);
        em_free(vals);
        return false;
    }
    em_tensor **ok_keys = c->keys;
    int *ov = c->vals, oc = c->cap;
    c->keys = keys;
    c->vals = vals;
    c->cap = cap;
    for (int i = 0; i < oc; i++) {
        if (!ok_keys[i]) continue;
        size_t at;
        (void)cut_find(c, ok_keys[i], &at);
        keys[at] = ok_keys[i];
        vals[at] = ov[i];
    }
    if (heap) {
        em_free(ok_keys);
        em_free(ov);
    }
    return true;
}

/* Writes the attributes op reads (its attrs column), canonically, except
 * target sizes (a reshape's, an expand's, a creation op's), which
 * put_sized writes with the sizes: a graph whose reshape sizes or arange
 * count follow the batch is one structure at every size.  Slice bounds
 * and values stay: a loop over slices at other offsets, or over other
 * scalars, makes other structures, as before, not size variants of one
 * (under its recompile limit). */
static void put_attrs(bytes *b, em_op op, const em_op_attrs *a) {
    unsigned mask = em_op_table[op].attrs;
    if (mask & A_SIZES) bytes_u64(b, (uint64_t)a->ndim);
    if (mask & A_DIMS) {
        bytes_u64(b, (uint64_t)a->ndims);
        bytes_put(b, a->dims, sizeof(int) * (size_t)a->ndims);
    }
    if (mask & A_DIM) bytes_u64(b, (uint64_t)a->dim);
    if (mask & A_RANGE) {
        int64_t r[3] = {a->start, a->end, a->step};
        bytes_put(b, r, sizeof r);
    }
    if (mask & A_VALUE) bytes_put(b, &a->value, sizeof a->value);
    if (mask & A_ARANGE) {
        double r[2] = {a->fstart, a->fstep};
        bytes_put(b, r, sizeof r);
    }
    if (mask & A_CORRECTION) bytes_u64(b, (uint64_t)a->correction);
    if (mask & A_KEEPDIM) bytes_u64(b, a->keepdim);
    if (mask & A_CAUSAL) bytes_u64(b, a->causal);
    if (mask & A_ACT) bytes_u64(b, (uint64_t)a->act);
    if (mask & A_DTYPE) bytes_u64(b, a->dtype);
    if (mask & A_DEVICE) bytes_u64(b, (uint64_t)a->device.type << 32 | (uint32_t)a->device.index);
    if (mask & A_RNG) {
        uint64_t r[2] = {a->seed, a->offset};
        bytes_put(b, r, sizeof r);
    }
}

/* The attributes put_attrs leaves to the sizes' key material. */
static void put_sized(bytes *b, em_op op, const em_op_attrs *a) {
    if (em_op_table[op].attrs & A_SIZES) bytes_put(b, a->sizes, sizeof(int64_t) * (size_t)a->ndim);
}

/* Node n (tensor t, its input nodes ins) as key material: everything the
 * compiled code depends on.  The shape-free part is the structure, for the
 * per-structure recompile limit. */
static void put_node(cut *c, const em_tensor *t, const lz_thunk *k, const int *ins) {
    /* word by word: a 32-byte array copied with vector loads right after
     * its scalar stores stalled on store forwarding (a third of the walk) */
    bytes_u64(&c->shape_free, k ? 1u + (uint64_t)k->op : 0);
    bytes_u64(&c->shape_free, k ? (uint64_t)k->nin : 0);
    bytes_u64(&c->shape_free, (uint64_t)t->dtype << 32 | (uint32_t)t->device.type);
    bytes_u64(&c->shape_free, (uint64_t)(uint32_t)t->device.index << 32 | (uint32_t)t->ndim);
    if (k) {
        bytes_put(&c->shape_free, ins, sizeof(int) * (size_t)k->nin);
        put_attrs(&c->shape_free, k->op, k->attrs);
        put_sized(&c->sizes, k->op, k->attrs);
    }
    bytes_put(&c->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    bytes_put(&c->sizes, t->strides, sizeof(int64_t) * (size_t)t->ndim);
    bytes_u64(&c->sizes, (uint64_t)t->offset);
}

/* The node of t, adding t's DAG below it first.  The recursion is bounded
 * by LZ_MAX_DEPTH (deeper DAGs were forced when made). */
static int cut_add(cut *c, em_tensor *t) {
    size_t at;
    int n = cut_find(c, t, &at);
    if (n >= 0) return n;
    lz_thunk *k = thunk_of(t);
    int in[16], *ins = !k || k->nin <= 16 ? in : em_malloc(sizeof(int) * (size_t)k->nin);
    if (!ins) return -1;
    bool ok = true;
    for (int i = 0; k && ok && i < k->nin; i++) ok = (ins[i] = cut_add(c, k->in[i])) >= 0;
    ok = ok && cut_reserve(c);
    if (ok) {
        n = c->nnodes++;
        for (int i = 0; k && i < k->nin; i++) c->internal[ins[i]]++;
        if (!k) c->inputs[c->ninputs++] = t;
        put_node(c, t, k, ins);
        (void)cut_find(c, t, &at); /* the recursion may have grown the map */
        c->keys[at] = t;
        c->vals[at] = n;
        c->nodes[n] = t;
    }
    if (ins != in) em_free(ins);
    return ok ? n : -1;
}

static void cut_free(cut *c) {
    tr_graph_free(c->g);
    if (c->keys != c->first.keys) {
        em_free(c->keys);
        em_free(c->vals);
    }
    if (c->nodes != c->first.nodes) em_free(c->nodes);
    if (c->internal != c->first.internal) em_free(c->internal);
    if (c->inputs != c->first.inputs) em_free(c->inputs);
    em_free(c->outs);
    if (c->shape_free.heap) em_free(c->shape_free.p);
    if (c->sizes.heap) em_free(c->sizes.p);
}

/* Whether a value is cheap to compute again inside a later kernel. */
static bool recomputable(em_op op) {
    switch (em_op_table[op].kind) {
    case EM_KIND_UNARY: case EM_KIND_BINARY: case EM_KIND_TERNARY: case EM_KIND_VIEW:
    case EM_KIND_CREATE: return true;
    default: return false;
    }
}

/* The cut's outputs: the roots and every pending node held by someone
 * besides the cut's own thunks and its scope. */
static bool cut_outputs(cut *c, em_tensor *const *roots, int nroots) {
    c->outs = em_malloc(sizeof(int) * (size_t)(c->nnodes + 1));
    bool *root = em_calloc((size_t)c->nnodes + 1, sizeof *root);
    if (!c->outs || !root) {
        em_free(root);
        return false;
    }
    for (int r = 0; r < nroots; r++) {
        size_t at;
        int n = cut_find(c, roots[r], &at);
        if (!root[n]) c->outs[c->nout++] = n;
        root[n] = true;
    }
    for (int i = 0; i < c->nnodes; i++) {
        em_tensor *u = c->nodes[i];
        lz_thunk *k = thunk_of(u);
        if (root[i] || !k) continue;
        int refs = atomic_load(&u->refcount) - c->internal[i];
        /* held outside the cut: computed now.  Held only by its scope, it
         * may still be read (by a later cut): a cheap pointwise value is
         * then recomputed, but a matmul, reduction or gather is kept, as
         * eager mode computes each value once. */
        if (refs - (u->scope ? 1 : 0) > 0 || (refs > 0 && !recomputable(k->op)))
            c->outs[c->nout++] = i;
    }
    em_free(root);
    bytes_u64(&c->shape_free, (uint64_t)c->nout);
    bytes_put(&c->shape_free, c->outs, sizeof(int) * (size_t)c->nout);
    return true;
}

/* Walks the DAG below roots[0..nroots): nodes, inputs, outputs and the key
 * material; no graph yet. */
static bool cut_build(cut *c, em_tensor *const *roots, int nroots) {
    /* only the map needs zeroing: the rest is written before it is read */
    memset(c, 0, offsetof(cut, first));
    memset(c->first.keys, 0, sizeof c->first.keys);
    memset(c->first.internal, 0, sizeof c->first.internal);
    c->cap = 2 * CUT_INLINE;
    c->keys = c->first.keys;
    c->vals = c->first.vals;
    c->nodes = c->first.nodes;
    c->internal = c->first.internal;
    c->inputs = c->first.inputs;
    c->shape_free = (bytes){c->first.shape_free, 0, BYTES_INLINE, false, false};
    c->sizes = (bytes){c->first.sizes, 0, BYTES_INLINE, false, false};
    for (int r = 0; r < nroots; r++)
        if (cut_add(c, roots[r]) < 0) return false;
    if (!cut_outputs(c, roots, nroots)) return false;
    if (c->shape_free.failed || c->sizes.failed)
        return em_error(EM_ERR_NOMEM, "lazy mode: out of memory keying a graph"), false;
    return true;
}

/* The cut's two keys: *key over all its material, *shape_free without the
 * sizes, strides and offsets (the structure). */
static void cut_keys(const cut *c, kc_key *key, kc_key *shape_free) {
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update(&h, c->shape_free.p, c->shape_free.n);
    if (shape_free) *shape_free = kc_hasher_digest(&h);
    kc_hasher_update(&h, c->sizes.p, c->sizes.n);
    *key = kc_hasher_digest(&h);
}

/* The cut as a graph (c->g), for a miss: node i of the graph is node i of
 * the walk. */
static em_status cut_graph(cut *c) {
    if (c->g) return EM_OK;
    c->g = tr_graph_new();
    if (!c->g) return em_last_status();
    for (int i = 0; i < c->nnodes; i++) {
        em_tensor *t = c->nodes[i];
        lz_thunk *k = thunk_of(t);
        em_meta m;
        tr_meta_of(t, &m);
        int in[16], *ins = !k || k->nin <= 16 ? in : em_malloc(sizeof(int) * (size_t)k->nin);
        if (!ins) return em_last_status();
        for (int j = 0; k && j < k->nin; j++) {
            size_t at;
            ins[j] = cut_find(c, k->in[j], &at);
        }
        int n = k ? tr_add_call(c->g, k->op, k->nin, ins, k->attrs, &m) : tr_add_input(c->g, NULL, &m);
        if (ins != in) em_free(ins);
        if (n != i) return em_last_status();
    }
    return tr_set_outputs(c->g, c->nout, c->outs);
}

/* ---- the entry table ---- */

_Static_assert(offsetof(lz_structure, key) == 0, "jit_index reads a structure's key at its start");

static lz_structure *structure_of(lz_state *st, const kc_key *sk) {
    lz_structure *sg = jit_index_find(&st->structs, sk);
    if (sg) return sg;
    if (!(sg = em_calloc(1, sizeof *sg))) return NULL;
    sg->key = *sk;
    sg->limit.limit = st->limit;
    if (!jit_index_add(&st->structs, sg)) {
        em_free(sg);
        return NULL;
    }
    return sg;
}

/* A new entry for graph g (the entry's on success): compiled (on the
 * compile queue with EMBER_ASYNC_COMPILE=1), or, past the structure's
 * limit, run op by op. */
static jit_entry *entry_add(lz_state *st, tr_graph *g, const kc_key *key, const kc_key *sk) {
    lz_structure *sg = structure_of(st, sk);
    jit_entry *e = sg ? jit_entry_new(g, jit_backend_for_graph(jit_backend_find(NULL), g), key) : NULL;
    if (!e || !jit_table_add(&st->entries, e)) {
        if (e) e->graph = NULL; /* still the caller's */
        jit_entry_free(e);
        return NULL;
    }
    if (!jit_limit_admit(&sg->limit, &st->log, "lazy mode: a graph structure hit the recompile "
                         "limit (%d size variants); new sizes of it run eagerly", st->limit)) {
        e->backend = &jit_replay_backend;
        e->ready = true;
        st->stats.eager_graphs++;
    } else {
        if (sg->limit.entries++ == 0) sg->first = e;
        if (tr_optimize(g, false) != EM_OK) e->failed = true; /* op by op */
        else jit_entry_compile(&st->own, e, NULL);            /* a failure: op by op */
        em_clear_error();
        /* EMBER_RECORD: any program can be warmed, not only em_compile'd ones */
        if (!e->failed) jit_record_entry(st->record, &st->record_failed, &st->log, "lazy", e);
    }
    if (st->log.flags & JIT_LOG_GRAPH) {
        jit_logf(&st->log, JIT_LOG_GRAPH, "lazy mode: new graph (entry %d):", st->entries.n - 1);
        tr_print(g, st->log.f);
    }
    return e;
}

/* ---- forcing ---- */

/* Gives node tensors their computed values. */
static void adopt(em_tensor *t, em_tensor *v) {
    lz_thunk *k = t->ext;
    atomic_fetch_add(&v->storage->refcount, 1);
    memcpy(t->strides, v->strides, sizeof(int64_t) * (size_t)t->ndim);
    t->offset = v->offset;
    /* the storage last: a thread reading t without the force lock (em_force's
     * check, thunk_of) that sees it sees the layout; the recipe stays valid
     * until then */
    __atomic_store_n(&t->storage, v->storage, __ATOMIC_RELEASE);
    __atomic_store_n(&t->ext, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&t->ext_free, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&t->ext_force, NULL, __ATOMIC_RELEASE);
    thunk_free(k);
}

/* ---- dynamic entries ---- */

/* jit_entry_make_dynamic for e after prev: first with prev's dynamic dims
 * that are 1 in inputs kept dynamic (lazy mode has no dry trace to try
 * size 1 with: the two traces decide, and an entry then serves 1 and
 * more alike), else without them. */
static bool make_dynamic(lz_state *st, jit_entry *e, const jit_entry *prev, em_tensor *const *inputs,
                         int n, uint32_t *mask, jit_dyn *dyn) {
    jit_dyn_mask(prev, inputs, n, true, mask);
    bool any_one = false;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < inputs[i]->ndim; d++) any_one |= (mask[i] >> d & 1) && inputs[i]->sizes[d] == 1;
    if (any_one && jit_entry_make_dynamic(&st->own, e, inputs, mask, prev, NULL, dyn)) return true;
    jit_dyn_mask(prev, inputs, n, false, mask);
    return jit_entry_make_dynamic(&st->own, e, inputs, mask, prev, NULL, dyn);
}

/* Makes a dynamic entry of a structure from the cut's graph (taken on
 * success): the input dims whose sizes differ from prev (the structure's
 * first entry, or its newest dynamic one), and prev's dynamic dims, become
 * dynamic, if the graph allows it and the backend can compile it so
 * (jit_entry_make_dynamic, jit_entry_compile_now: never in the
 * background, the compile decides whether the entry is kept).  Otherwise
 * the structure stays specialized for good, and the log says why. */
static jit_entry *dyn_make(lz_state *st, const jit_entry *prev, cut *c) {
    tr_graph *g = c->g;
    int n = g->ninputs;
    jit_entry *e = jit_entry_new(g, jit_backend_for_graph(jit_backend_find(NULL), g), NULL);
    jit_dyn *dyn = e ? jit_dyn_new(n) : NULL;
    uint32_t *mask = dyn ? em_calloc((size_t)n + 1, sizeof *mask) : NULL;
    bool ok = mask && tr_optimize(g, false) == EM_OK &&
              (e->guards = gd_build(g, c->inputs, NULL, 0, NULL, 0));
    if (ok && make_dynamic(st, e, prev, c->inputs, n, mask, dyn)) {
        ok = jit_entry_compile_now(&st->own, e, dyn) == EM_OK;
        dyn = NULL;
        if (!ok)
            jit_logf(&st->log, JIT_LOG_RECOMPILES, "lazy mode: a graph structure stays "
                     "specialized to its sizes: %s", em_last_error());
        ok = ok && e->dynamic;
    } else {
        if (!ok) log_dynamic(&st->own, e, false, em_last_error());
        ok = false;
    }
    em_free(mask);
    jit_dyn_free(dyn);
    em_clear_error();
    if (ok) {
        jit_record_entry(st->record, &st->record_failed, &st->log, "lazy", e);
        c->g = NULL;
        return e;
    }
    if (e) e->graph = NULL; /* still the cut's */
    jit_entry_free(e);
    return NULL;
}

/* What a flush runs: an entry (a structure's dynamic entry with what its
 * run needs for these sizes), compiled or not. */
typedef struct lz_run {
    jit_entry *e;
    bool ready;          /* e->ready, read under the lock */
    void *spec;          /* dynamic: the backend's specialize result */
} lz_run;

/* Remembers that dynamic entry d computes the graph of key (out of
 * memory or past LZ_MAX_SERVED: it is checked again next time). */
static void served_add(lz_state *st, const kc_key *key, jit_entry *d) {
    lz_served *old = jit_index_find(&st->served, key);
    if (old) {
        old->e = d;
        return;
    }
    lz_served *v = st->served.n < LZ_MAX_SERVED ? em_malloc(sizeof *v) : NULL;
    if (v) *v = (lz_served){*key, d};
    if (v && !jit_index_add(&st->served, v)) em_free(v);
    em_clear_error();
}

/* Whether dynamic entry d, whose guards take the cut's input sizes,
 * computes the cut's graph: its attributes that follow the sizes (an
 * arange's count, a reshape's sizes) are the cut's.  Two traces fit them,
 * which cannot tell b * t from 3 * t when b was 3 in both, nor a count
 * that follows no size at all (a loop counter): the cut, recorded with
 * the program's own values, is the judge (jit_dyn_same).  The caller
 * remembers a yes by the cut's key (served_add). */
static bool computes_cut(const jit_entry *d, cut *c) {
    if (cut_graph(c) != EM_OK || tr_optimize(c->g, false) != EM_OK) {
        em_clear_error();
        return false;
    }
    return jit_dyn_same(d->follow, d->graph, c->g);
}

/* Whether one of sg's dynamic entries takes the cut's sizes once its
 * dims at 1 may be 1 (jit_entry_take_one: the cut's graph is the entry's
 * at those sizes); into run. */
static bool take_one(lz_state *st, lz_structure *sg, cut *c, const kc_key *key, lz_run *run) {
    void *spec = NULL;
    for (int k = sg ? sg->ndyn - 1 : -1; k >= 0; k--) {
        if (cut_graph(c) != EM_OK || tr_optimize(c->g, false) != EM_OK) break;
        if (!jit_entry_take_one(sg->dyn[k], c->inputs, c->g) ||
            !jit_entry_serves(&st->own, sg->dyn[k], c->inputs, NULL, &spec))
            continue;
        served_add(st, key, sg->dyn[k]);
        st->stats.graph_hits++;
        st->stats.flushes++;
        *run = (lz_run){sg->dyn[k], true, spec};
        return true;
    }
    em_clear_error();
    return false;
}

/* Finds (or makes, compiling it) what runs the cut's graph; st's lock is
 * held.  A graph the tables take leaves c->g NULL. */
static em_status lookup(lz_state *st, cut *c, lz_run *run) {
    kc_key key, sk;
    cut_keys(c, &key, &sk);
    jit_entry *e = jit_table_find_key(&st->entries, &key);
    lz_structure *sg = e ? NULL : structure_of(st, &sk);
    void *spec = NULL;
    if (!e && !sg) return em_last_status();
    lz_served *sv = sg ? jit_index_find(&st->served, &key) : NULL;
    for (int k = sg ? sg->ndyn - 1 : -1; k >= 0; k--) {
        jit_entry *d = sg->dyn[k];
        if ((sv && sv->e != d) || (d->guards && !gd_check(d->guards, c->inputs, NULL)) ||
            (!sv && !computes_cut(d, c)) || !jit_entry_serves(&st->own, d, c->inputs, NULL, &spec))
            continue;
        if (!sv) served_add(st, &key, d);
        /* one state for these sizes of the structure: runs unlocked, as entries */
        st->stats.graph_hits++;
        st->stats.flushes++;
        *run = (lz_run){d, true, spec};
        return EM_OK;
    }
    if (take_one(st, sg, c, &key, run)) return EM_OK;
    if (sg && st->dynamic && sg->ndyn < LZ_MAX_DYN && !sg->dyn_refused && sg->first &&
        jit_limit_room(&sg->limit) && cut_graph(c) == EM_OK) {
        jit_entry *d = dyn_make(st, sg->ndyn ? sg->dyn[sg->ndyn - 1] : sg->first, c);
        sg->dyn_refused = !d;
        if (d) {
            sg->dyn[sg->ndyn++] = d;
            sg->limit.entries++;
            st->stats.graphs_compiled++;
            st->stats.dynamic_graphs++;
            st->stats.kernels_compiled += d->kernels_compiled;
            st->stats.kernels_loaded += d->kernels_loaded;
        }
        if (d && jit_entry_serves(&st->own, d, c->inputs, NULL, &spec)) {
            served_add(st, &key, d); /* d's graph is the cut's */
            st->stats.flushes++;
            *run = (lz_run){d, true, spec};
            return EM_OK;
        }
    }
    if (e) {
        st->stats.graph_hits++;
    } else {
        e = cut_graph(c) == EM_OK ? entry_add(st, c->g, &key, &sk) : NULL;
        if (!e) return em_last_status();
        c->g = NULL; /* the entry has it now */
    }
    st->stats.flushes++;
    /* entries are never removed; a compiled entry never changes again, one
     * still compiling runs op by op: safe to run unlocked */
    st->stats.async_runs += !e->ready && !e->failed;
    *run = (lz_run){e, e->ready, NULL};
    return EM_OK;
}

/* Looks the cut's graph up (compiling it on a miss) and runs it: vals
 * gets one new tensor per output of the cut, in its order.  The tables,
 * their graphs and compiled states are st's: they are allocated with the
 * allocator st was made under, whatever the reading code runs under, so
 * that st frees them with that one; the values are the caller's. */
static em_status run_outputs(lz_state *st, cut *c, em_tensor **vals) {
    const em_allocator *caller = em_get_allocator();
    em_set_allocator(st->alloc);
    lz_run run = {0};
    pthread_mutex_lock(&st->lock);
    em_status s = lookup(st, c, &run);
    pthread_mutex_unlock(&st->lock);
    tr_graph_free(c->g); /* one no table took, with the allocator that built it */
    c->g = NULL;
    em_set_allocator(caller);
    if (s != EM_OK) return s;
    return jit_entry_run(&st->own, run.e, run.ready, run.spec, c->inputs, vals);
}

/* Computes the pending tensors roots[0..n) (all made on state st) in one
 * graph. */
static em_status force_all(lz_state *st, em_tensor *const *roots, int nroots) {
    cut c;
    em_status s = cut_build(&c, roots, nroots) ? EM_OK : em_last_status();
    /* remember the outputs' tensors before the graph moves to the table */
    int nout = s == EM_OK ? c.nout : 0;
    em_tensor **who = s == EM_OK ? em_malloc(sizeof *who * (size_t)(nout + 1)) : NULL;
    if (s == EM_OK && !who) s = em_last_status();
    for (int i = 0; i < nout && who; i++) who[i] = em_retain(c.nodes[c.outs[i]]);
    em_tensor **vals = s == EM_OK ? em_calloc((size_t)nout + 1, sizeof *vals) : NULL;
    if (s == EM_OK && !vals) s = em_last_status();
    /* the run's results belong to this scope (em_keep moves a backend's
     * outputs to the enclosing scope); their storage moves to the pending
     * tensors, the scope frees the rest */
    em_scope_begin();
    if (s == EM_OK) s = run_outputs(st, &c, vals);
    for (int i = 0; i < nout && who; i++) {
        if (s == EM_OK && vals[i] && !who[i]->storage) adopt(who[i], vals[i]);
        em_release(who[i]);
    }
    em_scope_end();
    em_free(who);
    em_free(vals);
    cut_free(&c);
    return s;
}

static em_status force(em_tensor *t) {
    lz_thunk *k = thunk_of(t);
    if (!k)
        return __atomic_load_n(&t->storage, __ATOMIC_ACQUIRE) ? EM_OK
                                                               : em_error(EM_ERR_STATE, "the tensor has no data");
    lz_state *st = k->st;
    /* under the state's force lock, t may have been computed meanwhile by
     * another thread reading it: then there is nothing left to do.  (The
     * reference keeps st alive past an adopt that frees its last thunk.) */
    atomic_fetch_add(&st->refs, 1);
    pthread_mutex_lock(&st->force_lock);
    em_status s = thunk_of(t) ? force_all(st, &t, 1) : EM_OK;
    pthread_mutex_unlock(&st->force_lock);
    state_release(st);
    return s;
}

static em_status thunk_force(em_tensor *t) { return force(t); }

/* ---- the dispatch hook ---- */

/* Runs the call now, on its inputs' values. */
static em_tensor *run_now(const em_op_call *c, const em_meta *m) {
    for (int i = 0; i < c->nin; i++)
        if (!c->in[i]->storage && em_force(c->in[i]) != EM_OK) return NULL;
    em_dispatch_hook saved = em_set_dispatch_hook((em_dispatch_hook){0});
    em_tensor *t = em_dispatch_eager(c, m);
    em_set_dispatch_hook(saved);
    return t;
}

/* Whether the call is deferred: ops whose inputs are all on the result's
 * device (a graph has one device, and the auto backend compiles it with
 * the cpu or cuda backend by that device), except views of tensors that
 * have their values (free to make now).  Copies between devices run now. */
static bool deferred(const em_op_call *c, const em_meta *m) {
    /* random draws run now: their Philox offset differs on every call, so a
     * graph holding one would never be found in the table again */
    if (c->op == EM_OP_RAND || c->op == EM_OP_RANDN) return false;
    if (m->device.type != EM_CPU && m->device.type != EM_CUDA) return false;
    bool any_lazy = false;
    for (int i = 0; i < c->nin; i++) {
        const em_device d = c->in[i]->device;
        if (d.type != m->device.type || d.index != m->device.index) return false;
        any_lazy |= c->in[i]->storage == NULL;
    }
    return any_lazy || em_op_table[c->op].kind != EM_KIND_VIEW;
}

static em_tensor *lazy_op(void *ud, const em_op_call *c, const em_meta *m) {
    lz_state *st = ud;
    /* an in-place write runs now, after everything pending: a pending
     * tensor could read what it writes, and would read the new values */
    if (em_op_table[c->op].kind == EM_KIND_UPDATE) return em_sync() == EM_OK ? run_now(c, m) : NULL;
    if (!deferred(c, m)) return run_now(c, m);
    em_meta tm = *m;
    if (em_op_table[c->op].kind != EM_KIND_VIEW) { /* a new tensor is contiguous */
        em_contiguous_strides(tm.ndim, tm.sizes, tm.strides);
        tm.offset = 0;
    }
    /* one block: the tensor, the thunk, its inputs, the attributes if any */
    bool has_attrs = em_op_table[c->op].attrs != 0;
    size_t head = sizeof(lz_thunk) + sizeof(em_tensor *) * (size_t)c->nin;
    void *ext;
    em_tensor *t = em_tensor_meta_only_ext(&tm, head + (has_attrs ? sizeof(em_op_attrs) : 0), &ext);
    if (!t) return NULL;
    lz_thunk *k = ext;
    k->st = st;
    k->self = t;
    k->prev = NULL;
    k->op = c->op;
    k->nin = c->nin;
    k->depth = 1;
    if (has_attrs) {
        em_op_attrs *a = (em_op_attrs *)((char *)ext + head);
        *a = *c->attrs;
        k->attrs = a;
    } else {
        k->attrs = &no_attrs;
    }
    for (int i = 0; i < c->nin; i++) {
        k->in[i] = em_retain(c->in[i]);
        lz_thunk *ki = thunk_of(c->in[i]);
        if (ki && ki->depth + 1 > k->depth) k->depth = ki->depth + 1;
    }
    pthread_spin_lock(&st->pending_lock);
    if (st->nthunks++ == 0) atomic_fetch_add(&st->refs, 1);
    k->next = st->pending;
    if (st->pending) st->pending->prev = k;
    st->pending = k;
    st->ops_deferred++;
    pthread_spin_unlock(&st->pending_lock);
    t->ext = k;
    t->ext_free = thunk_free;
    t->ext_force = thunk_force;
    t = em_tensor_adopt(t);
    /* a long chain is cut here, so that no graph (and no release of a
     * chain of thunks) grows without bound */
    if (t && k->depth > LZ_MAX_DEPTH && em_force(t) != EM_OK) return NULL;
    return t;
}

bool jit_lazy_hook(const em_dispatch_hook *h) { return h && h->fn == lazy_op; }

em_dispatch_hook jit_lazy_runner(void) {
    lz_state *st = state_get(true);
    if (!st) {
        em_clear_error();
        return (em_dispatch_hook){0};
    }
    return (em_dispatch_hook){.fn = lazy_op, .ud = st};
}

/* ---- public API ---- */

em_status em_lazy_begin(void) {
    lz_state *st = state_get(true);
    if (!st) return em_last_status();
    if (st->depth == 0) {
        /* over a recorder's hook, lazy mode would take the ops the trace
         * must see (and the trace's end would drop lazy mode again) */
        em_dispatch_hook cur = em_set_dispatch_hook((em_dispatch_hook){0});
        em_set_dispatch_hook(cur);
        if (cur.fn)
            return em_error(EM_ERR_STATE, "em_lazy_begin: a function is being traced on "
                            "this thread (em_compile): lazy mode cannot start inside it");
        st->prev = em_set_dispatch_hook((em_dispatch_hook){.fn = lazy_op, .ud = st});
    }
    st->depth++;
    return EM_OK;
}

em_status em_sync(void) {
    lz_state *st = state_get(false);
    if (!st) return EM_OK;
    /* every live pending tensor, in one graph (allocated outside the spin
     * lock; another thread may release thunks meanwhile, never add one) */
    pthread_spin_lock(&st->pending_lock);
    int cap = st->nthunks, n = 0;
    pthread_spin_unlock(&st->pending_lock);
    em_tensor **roots = em_malloc(sizeof *roots * (size_t)(cap + 1));
    if (!roots) return em_last_status();
    pthread_spin_lock(&st->pending_lock);
    /* a tensor another thread is freeing (refcount 0, not yet unlinked:
     * thunk_free waits for this lock) is skipped, not revived */
    for (lz_thunk *k = st->pending; k && n < cap; k = k->next)
        if ((roots[n] = em_retain_live(k->self))) n++;
    pthread_spin_unlock(&st->pending_lock);
    em_dispatch_hook saved = em_set_dispatch_hook((em_dispatch_hook){0});
    pthread_mutex_lock(&st->force_lock);
    em_status s = n ? force_all(st, roots, n) : EM_OK;
    pthread_mutex_unlock(&st->force_lock);
    em_set_dispatch_hook(saved);
    for (int i = 0; i < n; i++) em_release(roots[i]);
    em_free(roots);
    return s;
}

/* Pending tensors outlive lazy mode: each carries its recipe, and
 * em_force computes it wherever it is read.  So leaving computes nothing
 * (a sync here would compute every intermediate a scope still holds). */
em_status em_lazy_end(void) {
    lz_state *st = state_get(false);
    if (!st || st->depth == 0) return em_error(EM_ERR_STATE, "em_lazy_end: lazy mode is not on");
    if (--st->depth == 0) em_set_dispatch_hook(st->prev);
    return EM_OK;
}

em_status em_realize(const em_tensor *t) {
    if (!t) return em_error_null("em_realize", "tensor");
    return em_force(t);
}

bool em_lazy_active(void) {
    lz_state *st = state_get(false);
    return st && st->depth > 0;
}

em_status em_lazy_get_stats(em_lazy_stats *out) {
    if (!out) return em_error(EM_ERR_NULL, "em_lazy_get_stats: out is NULL");
    memset(out, 0, sizeof *out);
    lz_state *st = state_get(false);
    if (!st) return EM_OK;
    pthread_mutex_lock(&st->lock);
    *out = st->stats;
    pthread_mutex_unlock(&st->lock);
    pthread_spin_lock(&st->pending_lock);
    out->ops_deferred = st->ops_deferred;
    pthread_spin_unlock(&st->pending_lock);
    return EM_OK;
}

/* EMBER_JIT=1: every thread starts in lazy mode.  It starts inside
 * whatever call first touches the thread's hook; if it cannot (memory),
 * the thread runs eagerly and that call's error state is left as it was. */
static void mode_autostart(void) {
    char buf[16];
    const char *e = em_getenv("EMBER_JIT", buf, sizeof buf);
    if (!e || strcmp(e, "1") != 0) return;
    em_context *c = em_ctx();
    em_status s = c->status;
    char msg[sizeof c->message];
    memcpy(msg, c->message, sizeof msg);
    if (em_lazy_begin() == EM_OK) return;
    c->status = s;
    memcpy(c->message, msg, sizeof msg);
}

/* Registered with eager when the library is loaded (cuda_eager.c's table
 * does the same; Makefile.am's EMBER_CORE_WHOLE keeps both in static links). */
__attribute__((constructor)) static void lazy_register(void) { em_register_mode_start(mode_autostart); }
