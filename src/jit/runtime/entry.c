/* entry.c - entries, the entry table, the recompile limit, the
 * dynamic-entry builder and the compile job: what em_compile (compile.c)
 * and lazy mode (lazy.c) share (entry-impl.h). */
#include "entry-impl.h"
#include "plan.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_RECOMPILE_LIMIT 8
#define DEFAULT_EAGER_CHECK 3
#define INDEX_MIN 64

/* ---- settings from the environment ---- */

int jit_env_recompile_limit(const jit_log *log) {
    char buf[64];
    const char *e = em_getenv("EMBER_RECOMPILE_LIMIT", buf, sizeof buf);
    if (!e || !*e) return DEFAULT_RECOMPILE_LIMIT;
    char *end;
    long v = strtol(e, &end, 10);
    if (*end || v < 0 || v > 1 << 20) {
        jit_logf(log, 0, "EMBER_RECOMPILE_LIMIT=%s is not a count: using %d", e,
                 DEFAULT_RECOMPILE_LIMIT);
        return DEFAULT_RECOMPILE_LIMIT;
    }
    return (int)v;
}

int jit_env_dynamic(const jit_log *log) {
    char buf[64];
    const char *e = em_getenv("EMBER_DYNAMIC", buf, sizeof buf);
    if (!e || !*e || !strcmp(e, "1") || !strcmp(e, "auto")) return 0;
    if (!strcmp(e, "0") || !strcmp(e, "off")) return -1;
    if (!strcmp(e, "force")) return 1;
    jit_logf(log, 0, "EMBER_DYNAMIC=%s is not 0, 1, auto, off or force: using auto", e);
    return 0;
}

/* An on/off switch: 1 or on true; 0, off or unset false; anything else
 * logged ("NAME=v is not 0, 1, on or off: <what> stays off") and false. */
static bool env_switch(const char *name, const char *what, const jit_log *log) {
    char buf[64];
    const char *e = em_getenv(name, buf, sizeof buf);
    if (!e || !*e || !strcmp(e, "0") || !strcmp(e, "off")) return false;
    if (!strcmp(e, "1") || !strcmp(e, "on")) return true;
    jit_logf(log, 0, "%s=%s is not 0, 1, on or off: %s off", name, e, what);
    return false;
}

bool jit_env_cuda_graphs(const jit_log *log) { return env_switch("EMBER_CUDA_GRAPHS", "graphs stay", log); }

bool jit_env_autotune(const jit_log *log) { return env_switch("EMBER_AUTOTUNE", "autotuning stays", log); }

int jit_env_eager_check(const jit_log *log) {
    char buf[64];
    const char *e = em_getenv("EMBER_EAGER_CHECK", buf, sizeof buf);
    if (!e || !*e) return DEFAULT_EAGER_CHECK;
    if (!strcmp(e, "off")) return 0;
    char *end;
    long v = strtol(e, &end, 10);
    if (*end || v < 0 || v > JIT_EAGER_CHECK_MAX) {
        jit_logf(log, 0, "EMBER_EAGER_CHECK=%s is not 0 to %d or off: using %d", e,
                 JIT_EAGER_CHECK_MAX, DEFAULT_EAGER_CHECK);
        return DEFAULT_EAGER_CHECK;
    }
    return (int)v;
}

bool jit_env_flag(const char *name) {
    char buf[64];
    const char *e = em_getenv(name, buf, sizeof buf);
    return e && *e && strcmp(e, "0") != 0;
}

/* ---- entries ---- */

jit_entry *jit_entry_new(tr_graph *g, const jit_backend *b, const kc_key *key) {
    jit_entry *e = em_calloc(1, sizeof *e);
    if (!e) return NULL;
    e->graph = g;
    e->backend = b;
    if (key) e->key = *key;
    e->keyed = key != NULL;
    return e;
}

void jit_entry_free(jit_entry *e) {
    if (!e) return;
    jit_queue_wait(e->job); /* never cancelled here: it frees its job */
    em_free(e->follow);
    if (e->state) e->backend->free(e->state);
    gd_free(e->guards);
    tr_graph_free(e->graph);
    em_free(e);
}

/* Whether e's kernels take the sizes of in (which passed its guards). */
static bool kernels_serve(const jit_owner *o, jit_entry *e, em_tensor *const *in, void **spec) {
    *spec = NULL;
    if (!(e->ready && e->dynamic && e->backend->specialize)) return true;
    const em_allocator *caller = em_get_allocator();
    em_set_allocator(o->alloc); /* the state keeps what it makes */
    bool serves = e->backend->specialize(e->state, e->graph, in, spec);
    em_set_allocator(caller);
    return serves;
}

bool jit_entry_serves(const jit_owner *o, jit_entry *e, em_tensor *const *in,
                      const double *scalars, void **spec) {
    *spec = NULL;
    return (!e->guards || gd_check(e->guards, in, scalars)) && kernels_serve(o, e, in, spec);
}

/* ---- the eager check ----
 * A compiled plan is meant to beat its graph run op by op, but a graph
 * that is mostly matmuls can lose: its fused kernels between the BLAS
 * calls may cost more than the eager ops they replace (on the H200's
 * 16-core host, the compiled bf16 mlp ran 0.89x eager).  So the calls of
 * a new CPU entry after its first compiled one alternate between the plan
 * and op by op, o->eager_check of each, timed; if op by op's median is
 * lower, the entry runs op by op from then on (for good: timing again
 * would let results switch between the two roundings), and EMBER_LOG=tune
 * says so either way.  Only static entries of host-timed backends (the
 * CPU) and graphs without effects are checked: a CUDA call's time is its
 * launches', not its kernels'; a dynamic entry's calls differ in size;
 * and a graph that draws random numbers or writes an input must run the
 * same way on every call.  The
 * two plans compute the same ops, so a result differs between them only
 * by rounding (fused kernels round as the eager ops do, compile.md). */

static bool check_wanted(const jit_owner *o, const jit_entry *e) {
    if (o->eager_check <= 0 || e->dynamic || !e->backend->host_timed) return false;
    for (int i = 0; i < e->graph->nnodes; i++)
        if (tr_has_effect(&e->graph->nodes[i])) return false;
    return true;
}

/* The check's slot for this call: -1 none (over, or not checked); 0 the
 * untimed first compiled call (it pays first touches: page faults, a
 * BLAS's first-call setup); 1, 2, ... timed, odd the plan, even op by op.
 * Atomic, not under the owner's lock: a call may run inside a trace that
 * holds it. */
static int check_slot(const jit_owner *o, jit_entry *e) {
    int slot = __atomic_fetch_add(&e->check_calls, 1, __ATOMIC_ACQ_REL);
    if (slot == 0 && !check_wanted(o, e)) __atomic_store_n(&e->check_over, true, __ATOMIC_RELEASE);
    if (slot > 2 * o->eager_check || __atomic_load_n(&e->check_over, __ATOMIC_ACQUIRE)) return -1;
    return slot;
}

static double check_median(double *x, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: n <= JIT_EAGER_CHECK_MAX */
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
            double t = x[j];
            x[j] = x[j - 1];
            x[j - 1] = t;
        }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Records slot's time (ok: the call succeeded); the call that records
 * the last time decides (every slot's time is in by then). */
static void check_record(const jit_owner *o, jit_entry *e, int slot, bool ok, double s) {
    if (!ok) { /* an error says nothing about speed: keep the plan */
        __atomic_store_n(&e->check_over, true, __ATOMIC_RELEASE);
        return;
    }
    e->check_s[slot % 2 == 0][(slot - 1) / 2] = s;
    if (__atomic_add_fetch(&e->check_timed, 1, __ATOMIC_ACQ_REL) != 2 * o->eager_check ||
        __atomic_load_n(&e->check_over, __ATOMIC_ACQUIRE))
        return;
    __atomic_store_n(&e->check_over, true, __ATOMIC_RELEASE);
    double plan = check_median(e->check_s[0], o->eager_check);
    double eager = check_median(e->check_s[1], o->eager_check);
    bool op_by_op = eager < plan;
    jit_logf(o->log, JIT_LOG_TUNE, "%s: eager check (%d calls each, medians): compiled %.4g ms, "
             "op by op %.4g ms: %s", o->name, o->eager_check, plan * 1e3, eager * 1e3,
             op_by_op ? "runs op by op from now on" : "keeps the compiled plan");
    if (op_by_op) __atomic_store_n(&e->eager, true, __ATOMIC_RELEASE);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static em_status run_plan(const jit_entry *e, void *spec, em_tensor *const *in, em_tensor **out) {
    if (e->dynamic && e->backend->run_dynamic)
        return e->backend->run_dynamic(e->state, spec, e->graph, in, out);
    return e->backend->run(e->state, e->graph, in, out);
}

em_status jit_entry_run(const jit_owner *o, jit_entry *e, bool ready, void *spec,
                        em_tensor *const *in, em_tensor **out) {
    if (!ready || __atomic_load_n(&e->eager, __ATOMIC_ACQUIRE))
        return jit_replay_backend.run(NULL, e->graph, in, out);
    /* unlocked fast path: check_over only ever turns true */
    if (o->eager_check <= 0 || __atomic_load_n(&e->check_over, __ATOMIC_ACQUIRE))
        return run_plan(e, spec, in, out);
    int slot = check_slot(o, e);
    if (slot <= 0) return run_plan(e, spec, in, out);
    bool op_by_op = slot % 2 == 0;
    double (*clock)(void) = o->check_clock ? o->check_clock : seconds;
    double t0 = clock();
    em_status s = op_by_op ? jit_replay_backend.run(NULL, e->graph, in, out)
                           : run_plan(e, spec, in, out);
    double t = clock() - t0;
    check_record(o, e, slot, s == EM_OK, t);
    return s;
}

/* ---- the key index: open addressing, linear probing ---- */

static const kc_key *rec_key(const void *rec) { return rec; }

/* The slot holding key, or the empty slot where it would go. */
static int index_probe(const jit_index *ix, const kc_key *key) {
    uint64_t h;
    memcpy(&h, key->bytes, sizeof h);
    int i = (int)(h & (uint64_t)(ix->cap - 1));
    while (ix->slots[i] && !kc_key_equal(rec_key(ix->slots[i]), key)) i = (i + 1) & (ix->cap - 1);
    return i;
}

void *jit_index_find(const jit_index *ix, const kc_key *key) {
    return ix->cap ? (void *)ix->slots[index_probe(ix, key)] : NULL;
}

bool jit_index_add(jit_index *ix, const void *rec) {
    if (2 * (ix->n + 1) > ix->cap) {
        int cap = ix->cap ? 2 * ix->cap : 2 * INDEX_MIN;
        const void **slots = em_calloc((size_t)cap, sizeof *slots);
        if (!slots) return false;
        jit_index old = *ix;
        ix->slots = slots;
        ix->cap = cap;
        for (int i = 0; i < old.cap; i++)
            if (old.slots[i]) ix->slots[index_probe(ix, rec_key(old.slots[i]))] = old.slots[i];
        em_free(old.slots);
    }
    ix->slots[index_probe(ix, rec_key(rec))] = rec;
    ix->n++;
    return true;
}

void jit_index_free(jit_index *ix) {
    em_free(ix->slots);
    *ix = (jit_index){0};
}

/* ---- the entry table ---- */

_Static_assert(offsetof(jit_entry, key) == 0, "jit_index reads an entry's key at its start");

bool jit_table_add(jit_table *t, jit_entry *e) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 8;
        jit_entry **p = em_malloc(sizeof *p * (size_t)cap);
        if (!p) return false;
        if (t->n) memcpy(p, t->entries, sizeof *p * (size_t)t->n);
        em_free(t->entries);
        t->entries = p;
        t->cap = cap;
    }
    if (e->keyed && !jit_index_add(&t->index, e)) return false;
    t->entries[t->n++] = e;
    return true;
}

jit_entry *jit_table_recent(const jit_table *t, int i) { return t->entries[t->n - 1 - i]; }

jit_entry *jit_table_find_key(const jit_table *t, const kc_key *key) {
    return jit_index_find(&t->index, key);
}

jit_entry *jit_table_find(const jit_owner *o, jit_table *t, em_tensor *const *in,
                          const double *scalars, void **spec, bool *declined) {
    *declined = false;
    for (int i = t->n - 1; i >= 0; i--) {
        jit_entry *e = t->entries[i];
        if (e->guards && !gd_check(e->guards, in, scalars)) continue;
        if (!kernels_serve(o, e, in, spec)) {
            *declined = true;
            continue;
        }
        memmove(&t->entries[i], &t->entries[i + 1], sizeof *t->entries * (size_t)(t->n - 1 - i));
        t->entries[t->n - 1] = e;
        return e;
    }
    return NULL;
}

void jit_table_free(jit_table *t) {
    for (int i = 0; i < t->n; i++) jit_entry_free(t->entries[i]);
    em_free(t->entries);
    jit_index_free(&t->index);
    *t = (jit_table){0};
}

/* ---- the recompile limit ---- */

bool jit_limit_room(const jit_limit *l) { return l->entries < l->limit; }

bool jit_limit_admit(jit_limit *l, const jit_log *log, const char *fmt, ...) {
    if (jit_limit_room(l)) return true;
    if (!l->logged) {
        l->logged = true;
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        jit_logf(log, 0, "%s", msg);
    }
    return false;
}

/* ---- the dynamic-entry builder ---- */

jit_dyn *jit_dyn_new(int ninputs) {
    jit_dyn *d = em_calloc(1, sizeof *d);
    if (d && !(d->probe = em_calloc((size_t)ninputs + 1, sizeof *d->probe))) {
        em_free(d);
        return NULL;
    }
    return d;
}

void jit_dyn_free(jit_dyn *d) {
    if (d) em_free(d->probe);
    em_free(d);
}

/* The sizes input i of e was traced at (its guard's, else its graph's
 * input meta), and its dynamic dims; NULL: the graph has no such input. */
static const int64_t *traced_sizes(const jit_entry *e, int i, uint32_t *dyn) {
    *dyn = 0;
    if (e->guards) {
        *dyn = e->guards->tensors[i].dyn;
        return e->guards->tensors[i].sizes;
    }
    for (int n = 0; n < e->graph->nnodes; n++)
        if (e->graph->nodes[n].kind == TR_INPUT && e->graph->nodes[n].index == i)
            return e->graph->nodes[n].meta.sizes;
    return NULL;
}

void jit_dyn_mask(const jit_entry *prev, em_tensor *const *in, int ninputs, bool ones,
                  uint32_t *mask) {
    for (int i = 0; i < ninputs; i++) {
        uint32_t dyn;
        const int64_t *sizes = traced_sizes(prev, i, &dyn);
        mask[i] = dyn;
        for (int d = 0; sizes && d < in[i]->ndim; d++)
            if (sizes[d] != in[i]->sizes[d]) mask[i] |= 1u << d;
        /* a dim at 0 or 1 here joins only as widen and allow_ones decide,
         * or (ones) as the two traces do */
        for (int d = 0; d < in[i]->ndim; d++)
            if (in[i]->sizes[d] < 2 && !(ones && in[i]->sizes[d] == 1 && (dyn >> d & 1)))
                mask[i] &= ~(1u << d);
    }
}

static void log_dynamic(const jit_owner *o, const jit_entry *e, bool compiled, const char *why) {
    if (o->log_dynamic) o->log_dynamic(o, e, compiled, why);
}

/* Whether e's graph follows the dims its guards now mark dynamic, as a dry
 * trace at their probe sizes shows (rt), into dyn (fits from that trace,
 * which changes every dynamic dim at once). */
static bool dry_check(jit_entry *e, em_tensor *const *in, const jit_entry *prev,
                      const jit_retrace *rt, jit_dyn *dyn) {
    int n = e->guards->ntensors;
    if (!jit_dyn_probe(e->guards, in, n, dyn->probe)) return false;
    tr_graph *d = rt->trace(rt->ud, dyn->probe);
    char why[256];
    bool ok = d && jit_dyn_check(e->graph, d, prev ? prev->follow : NULL, e->guards, in, dyn, why,
                                 sizeof why);
    tr_graph_free(d);
    return ok;
}

static void set_all(gd_guards *gs, const uint32_t *mask) {
    for (int i = 0; i < gs->ntensors; i++) gd_set_dynamic(gs, i, mask[i]);
}

/* Grows kept (a mask per input, set in e's guards) by the dims of cand the
 * graph follows, as dry traces at probe sizes show: each candidate with
 * every other candidate of its traced size (one symbol, as duck sizing
 * makes it: a length that x and its mask share joins in both or in
 * neither), except at size 1, which many unrelated dims have (a batch of
 * 1, a [1, C] bias): each of those alone.  e's guards end with kept.
 * Whether anything joined. */
static bool grow(jit_entry *e, em_tensor *const *in, uint32_t *kept, const uint32_t *cand,
                 const jit_entry *prev, const jit_retrace *rt, jit_dyn *dyn) {
    int n = e->guards->ntensors;
    bool joined = false;
    for (int i = 0; i < n; i++) {
        for (int d = 0; d < in[i]->ndim; d++) {
            if (!(cand[i] >> d & 1) || (kept[i] >> d & 1)) continue;
            uint32_t trial[64];
            for (int j = 0; j < n && j < 64; j++) {
                trial[j] = kept[j];
                for (int k = 0; k < in[j]->ndim; k++)
                    if ((cand[j] >> k & 1) && in[j]->sizes[k] == in[i]->sizes[d] &&
                        (in[j]->sizes[k] > 1 || (j == i && k == d)))
                        trial[j] |= 1u << k;
            }
            set_all(e->guards, trial);
            if (!dry_check(e, in, prev, rt, dyn)) continue;
            memcpy(kept, trial, sizeof *kept * (size_t)n);
            joined = true;
        }
    }
    set_all(e->guards, kept);
    return joined;
}

/* Forced or hinted dims (no previous trace): the dims of mask a dry trace
 * shows the graph follows, all together, else symbol by symbol (a hidden
 * size tied to a weight stays static while the batch and the length
 * join); e's guards end with those; false: none (the guards back at
 * mask, for the rules after). */
static bool dry_dims(jit_entry *e, em_tensor *const *in, const uint32_t *mask,
                     const jit_retrace *rt, jit_dyn *dyn) {
    int n = e->guards->ntensors;
    if (n > 64) return false;
    if (dry_check(e, in, NULL, rt, dyn)) return true;
    uint32_t kept[64] = {0};
    if (grow(e, in, kept, mask, NULL, rt, dyn) && dry_check(e, in, NULL, rt, dyn)) return true;
    set_all(e->guards, mask);
    return false;
}

static bool was_read(const jit_retrace *rt, int64_t size) {
    for (int i = 0; i < rt->nreads; i++)
        if (rt->reads[i] == size) return true;
    return false;
}

/* Adds to mask the dims that did not change between the
 * traces, whose sizes the function read with em_size (a length it builds
 * a mask or a reshape from; a width it never reads keeps its static
 * kernels: a row reduction over a dynamic width is much slower on the
 * GPU), but that the graph follows as well (grow), so that a function
 * called at a second batch size does not recompile again at its first new
 * sequence length.  dyn: the fits for the widened mask, from a dry trace
 * that changes every dynamic dim at once, which must hold at prev's real
 * trace too; false when nothing joined. */
static bool widen(jit_entry *e, em_tensor *const *in, uint32_t *mask, const jit_entry *prev,
                  const jit_retrace *rt, jit_dyn *dyn) {
    int n = e->guards->ntensors;
    if (n > 64) return false;
    uint32_t cand[64];
    for (int i = 0; i < n; i++) {
        cand[i] = 0;
        for (int d = 0; d < in[i]->ndim; d++)
            if (!(mask[i] >> d & 1) && in[i]->sizes[d] >= 1 && was_read(rt, in[i]->sizes[d]))
                cand[i] |= 1u << d;
    }
    return grow(e, in, mask, cand, prev, rt, dyn) && dry_check(e, in, prev, rt, dyn) &&
           jit_dyn_holds(dyn, prev->graph);
}

/* Checks the fits dyn that two traces made (prev's and e's, which may
 * differ in one symbol only) against a dry trace that moves every symbol
 * at once: a fit that named one symbol where the code used two (3 * t for
 * an arange over b * t, with b = 3 in both traces) is refitted from the
 * dry trace (and must still hold at prev's), else the entry is static.
 * No dry trace (a random draw, a host read): the two traces decide. */
static bool confirm(jit_entry *e, em_tensor *const *in, const jit_entry *prev,
                    const jit_retrace *rt, jit_dyn *dyn, char *why, size_t nwhy) {
    int n = e->guards->ntensors;
    jit_dyn *d = jit_dyn_new(n);
    bool ok = d && jit_dyn_probe(e->guards, in, n, d->probe);
    tr_graph *g = ok ? rt->trace(rt->ud, d->probe) : NULL;
    if (ok && !g) {
        jit_dyn_free(d);
        return true;
    }
    ok = ok && jit_dyn_check(e->graph, g, dyn, e->guards, in, d, why, nwhy);
    if (ok && !jit_dyn_holds(d, prev->graph)) {
        snprintf(why, nwhy, "the sizes the dry trace fits do not hold at the earlier trace");
        ok = false;
    }
    if (ok) {
        memcpy(dyn->sizes, d->sizes, sizeof d->sizes);
        dyn->nsizes = d->nsizes;
        memcpy(dyn->probe, d->probe, sizeof *dyn->probe * (size_t)n);
    }
    tr_graph_free(g);
    jit_dyn_free(d);
    return ok;
}

/* jit_dyn_check against prev, with the divisors it asks for: a reshape
 * that splits a dynamic dim ([b, t / 2, 16] of [b, t, 8]) makes that dim
 * a multiple of its divisor in the guards, and the check runs again
 * (probes then are multiples too). */
static bool check_dividing(jit_entry *e, em_tensor *const *in, const jit_entry *prev,
                           jit_dyn *dyn, char *why, size_t nwhy) {
    for (int tries = 0; tries < EM_MAX_DIMS; tries++) {
        if (jit_dyn_check(e->graph, prev ? prev->graph : NULL, prev ? prev->follow : NULL,
                          e->guards, in, dyn, why, nwhy))
            return true;
        if (dyn->need.q < 2 || !gd_set_divisor(e->guards, dyn->need.input, dyn->need.dim, dyn->need.q))
            return false;
    }
    return false;
}

/* Lets e's dynamic dims of traced size v take the size 1 when a dry
 * trace there gives e's graph (follow: its attributes that follow the
 * sizes).  Torch specializes 1 for good; here the function is asked: a
 * block that serves batches 2 to 8 then serves 1 too. */
static void allow_one(jit_entry *e, em_tensor *const *in, int64_t v, const jit_retrace *rt,
                      const jit_dyn *follow, em_meta *m) {
    gd_guards *gs = e->guards;
    jit_dyn_metas_at(gs, in, gs->ntensors, v, 1, m);
    tr_graph *dry = rt->trace(rt->ud, m);
    bool same = dry && jit_dyn_same(follow, e->graph, dry);
    tr_graph_free(dry);
    for (int i = 0; same && i < gs->ntensors; i++) {
        uint32_t dims = 0;
        for (int d = 0; d < in[i]->ndim; d++)
            if (in[i]->sizes[d] == v && gs->tensors[i].div[d] < 2) dims |= 1u << d;
        gd_allow_one(gs, i, dims);
    }
}

/* allow_one for each symbol of e's (each traced size of its dynamic dims,
 * but those a divisor keeps from 1). */
static void allow_ones(jit_entry *e, em_tensor *const *in, const jit_retrace *rt,
                       const jit_dyn *follow) {
    gd_guards *gs = e->guards;
    em_meta *m = em_malloc(sizeof *m * ((size_t)gs->ntensors + 1));
    int64_t tried[EM_MAX_DIMS * 4];
    int ntried = 0;
    for (int i = 0; m && i < gs->ntensors; i++) {
        const gd_tensor *gt = &gs->tensors[i];
        for (int d = 0; d < gt->ndim; d++) {
            int64_t v = in[i]->sizes[d];
            bool seen = false;
            for (int k = 0; k < ntried && !seen; k++) seen = tried[k] == v;
            if (!(gt->dyn >> d & 1) || (gt->one >> d & 1) || gt->div[d] > 1 || seen ||
                ntried == (int)(sizeof tried / sizeof *tried))
                continue;
            tried[ntried++] = v;
            allow_one(e, in, v, rt, follow, m);
        }
    }
    em_free(m);
}

bool jit_entry_take_one(jit_entry *e, em_tensor *const *in, const tr_graph *g) {
    gd_guards *gs = e->guards;
    if (!e->dynamic || !gs || gs->ntensors != g->ninputs || gs->ntensors > 64) return false;
    uint32_t add[64];
    bool any = false;
    for (int i = 0; i < gs->ntensors; i++) {
        const gd_tensor *gt = &gs->tensors[i];
        add[i] = 0;
        for (int d = 0; d < gt->ndim && d < in[i]->ndim; d++)
            if ((gt->dyn >> d & 1) && !(gt->one >> d & 1) && gt->div[d] < 2 && in[i]->sizes[d] == 1)
                add[i] |= 1u << d;
        any |= add[i] != 0;
    }
    if (!any) return false;
    for (int i = 0; i < gs->ntensors; i++) gd_allow_one(gs, i, add[i]);
    if (gd_check(gs, in, NULL) && jit_dyn_same(e->follow, e->graph, g)) return true;
    for (int i = 0; i < gs->ntensors; i++) gs->tensors[i].one &= ~add[i];
    return false;
}

bool jit_entry_make_dynamic(const jit_owner *o, jit_entry *e, em_tensor *const *in,
                            const uint32_t *mask, const jit_entry *prev, const jit_retrace *rt,
                            jit_dyn *dyn) {
    int n = e->guards->ntensors;
    uint32_t *wide = rt && prev ? em_calloc((size_t)n + 1, sizeof *wide) : NULL;
    for (int i = 0; mask && i < n; i++) gd_set_dynamic(e->guards, i, mask[i]);
    char why[256];
    bool dynamic = false;
    if (!gd_is_dynamic(e->guards)) {
        snprintf(why, sizeof why, "no dim of size 2 or more changed its size");
    } else if (!e->backend->compile_dynamic) {
        snprintf(why, sizeof why, "the %s backend has no dynamic kernels", e->backend->name);
    } else if (!prev && rt && dry_dims(e, in, mask, rt, dyn)) {
        dynamic = true; /* forced or hinted: a dry trace is the other trace */
    } else if (check_dividing(e, in, prev, dyn, why, sizeof why)) {
        dynamic = true;
        jit_dyn *w = wide ? jit_dyn_new(n) : NULL;
        for (int i = 0; w && i < n; i++) wide[i] = e->guards->tensors[i].dyn;
        if (w && widen(e, in, wide, prev, rt, w)) {
            memcpy(dyn->sizes, w->sizes, sizeof w->sizes);
            dyn->nsizes = w->nsizes;
            memcpy(dyn->probe, w->probe, sizeof *dyn->probe * (size_t)n);
        } else if (w) { /* back to the dims that changed, and their fits */
            for (int i = 0; i < n; i++) gd_set_dynamic(e->guards, i, mask[i]);
            dynamic = jit_dyn_check(e->graph, prev->graph, prev->follow, e->guards, in, dyn, why,
                                    sizeof why) &&
                      confirm(e, in, prev, rt, dyn, why, sizeof why);
        }
        jit_dyn_free(w);
    }
    em_free(wide);
    if (dynamic && rt) allow_ones(e, in, rt, dyn);
    if (dynamic && gd_tie_dynamic(e->guards) != EM_OK) {
        dynamic = false;
        snprintf(why, sizeof why, "out of memory");
    }
    em_clear_error(); /* a dry trace's failure is not the call's */
    if (dynamic) {
        e->dynamic = true;
        e->follows = dyn->nsizes > 0;
        if (e->follows && (e->follow = em_malloc(sizeof *e->follow))) {
            *e->follow = *dyn;
            e->follow->probe = NULL;
        }
        log_dynamic(o, e, false, NULL);
        return true;
    }
    gd_make_static(e->guards);
    log_dynamic(o, e, false, why);
    return false;
}

/* ---- the compile job ---- */

/* The backend compile of e into *state, counted in env.  A dynamic entry
 * whose backend cannot make its kernels dynamic gets them for the traced
 * sizes (*dynamic false, logged). */
static em_status compile_state(const jit_owner *o, const jit_entry *e, const jit_dyn *dyn,
                               jit_env *env, void **state, bool *dynamic) {
    char why[256] = "";
    *dynamic = e->dynamic && dyn;
    if (!*dynamic) return e->backend->compile(e->graph, env, state);
    em_status s = e->backend->compile_dynamic(e->graph, dyn, env, state, dynamic, why, sizeof why);
    if (s == EM_OK && !*dynamic) log_dynamic(o, e, true, why);
    return s;
}

/* Installs a finished compile's result in e (under the owner's lock): the
 * state first, ready last, so that whoever reads ready (under the lock, or
 * with an acquire load) sees the state it goes with. */
static void publish(jit_owner *o, jit_entry *e, em_status s, void *state, bool dynamic,
                    const jit_env *env, jit_compile_end how) {
    e->kernels_compiled += env->compiled;
    e->kernels_loaded += env->loaded;
    e->tuned += env->tuned;
    e->tune_hits += env->tune_hits;
    e->plans_loaded += env->plans_loaded;
    e->plans_stored += env->plans_stored;
    e->lowered += env->lowered;
    if (s == EM_OK) {
        if (!dynamic && e->guards) gd_make_static(e->guards);
        e->dynamic = dynamic;
        e->follows = dynamic && e->follows;
        e->state = state;
        __atomic_store_n(&e->ready, true, __ATOMIC_RELEASE);
    } else {
        if (state) e->backend->free(state);
        e->failed = true;
    }
    if (s == EM_OK && dynamic) {
        log_dynamic(o, e, true, NULL);
        /* for the next process (and lazy mode's next graph of the structure) */
        jit_dyn_hint_put(env->cache, e->backend->name, e->graph, e->guards);
    }
    o->compiled(o, e, how);
}

void jit_record_entry(const char *path, bool *failed, const jit_log *log, const char *name,
                      const jit_entry *e) {
    if (!path || *failed || !e->graph) return;
    if (!e->backend->target) return; /* nothing to compile ahead of time */
    if (jit_record_append(path, name, e->backend->name, e->graph, e->guards, e->follow) == EM_OK) return;
    *failed = true;
    jit_logf(log, 0, "EMBER_RECORD: %s; %s is no longer recorded", em_last_error(), name);
    em_clear_error();
}

em_status jit_entry_compile_now(jit_owner *o, jit_entry *e, jit_dyn *dyn) {
    jit_env env = {.cache = o->env->cache, .log = o->log, .graphs = o->env->graphs,
                   .autotune = o->env->autotune};
    void *state = NULL;
    bool dynamic;
    em_status s = compile_state(o, e, dyn, &env, &state, &dynamic);
    publish(o, e, s, state, dynamic, &env, JIT_COMPILED_NOW);
    jit_dyn_free(dyn);
    return s;
}

/* A background compile: what the queue thread needs, owned by it. */
typedef struct compile_job {
    jit_owner *o;
    jit_entry *e;
    jit_dyn *dyn;               /* dynamic entries: jit_dyn_check's result */
} compile_job;

/* The background compile of job->e, on a queue thread: e's graph, backend
 * and dynamic flag are set before the job is queued and read-only until
 * it publishes, so the compile runs unlocked.  run false: the process is
 * exiting, and the entry keeps running op by op. */
static void compile_job_run(void *arg, bool run) {
    compile_job *job = arg;
    jit_owner *o = job->o;
    jit_entry *e = job->e;
    em_set_allocator(o->alloc);
    jit_env env = {.cache = o->env->cache, .log = o->log, .graphs = o->env->graphs,
                   .autotune = o->env->autotune};
    void *state = NULL;
    bool dynamic = false;
    em_status s = run ? compile_state(o, e, job->dyn, &env, &state, &dynamic) : EM_ERR_STATE;
    pthread_mutex_lock(o->lock);
    publish(o, e, s, state, dynamic, &env, run ? JIT_COMPILED_BACKGROUND : JIT_COMPILE_CANCELLED);
    if (s != EM_OK && run)
        jit_logf(o->log, 0, "%s: background compile failed (%s); the entry runs op by op",
                 o->name, em_last_error());
    em_clear_error();
    pthread_mutex_unlock(o->lock);
    jit_dyn_free(job->dyn);
    em_free_with(o->alloc, job);
    if (o->drop) o->drop(o); /* last: it may free the owner */
}

/* Queues e's compile on the process's compile queue (the job takes dyn);
 * false when it could not be queued.  The queue never runs libgccjit on
 * its threads (jit_queue_submit refuses without a compile worker): the
 * caller then compiles in its own thread. */
static bool start_compile(jit_owner *o, jit_entry *e, jit_dyn *dyn) {
    compile_job *job = em_malloc(sizeof *job);
    if (!job) {
        em_clear_error();
        return false;
    }
    *job = (compile_job){o, e, dyn};
    kc_key key = e->key;
    bool keyed = e->keyed || jit_graph_key(e->graph, e->backend->name, "em_compile", &key, NULL);
    if (o->hold) o->hold(o);
    if (!jit_queue_submit(keyed ? &key : NULL, compile_job_run, job, o->hold ? NULL : &e->job)) {
        if (o->drop) o->drop(o);
        em_free(job);
        return false;
    }
    return true;
}

em_status jit_entry_compile(jit_owner *o, jit_entry *e, jit_dyn *dyn) {
    if (o->async && start_compile(o, e, dyn)) return EM_OK; /* the job owns dyn */
    return jit_entry_compile_now(o, e, dyn);
}
