/* entry-impl.h - the entry machinery em_compile (compile.c) and lazy mode
 * (lazy.c) share (entry.c): an entry (a graph and how it runs), the entry
 * table, the recompile limit, the dynamic-entry builder and the compile
 * job.  Private to src/jit/runtime.
 *
 * Ownership: an entry's owner (a compiled function, a thread's lazy
 * state) owns its entries; an entry owns its graph (and through it
 * references to captured constants), its guards, its dynamic description
 * and its backend state.  Everything an entry holds is allocated with the
 * owner's allocator (jit_owner.alloc), whatever allocator a call runs
 * under, so that the owner frees it all with that one (docs/memory.md). */
#ifndef EMBER_JIT_ENTRY_IMPL_H
#define EMBER_JIT_ENTRY_IMPL_H

#include "jit.h"
#include "compile_queue.h"

typedef struct jit_entry jit_entry;

/* How a compile ended, for the owner's counters. */
typedef enum jit_compile_end {
    JIT_COMPILED_NOW,        /* in the caller's thread */
    JIT_COMPILED_BACKGROUND, /* on a queue thread */
    JIT_COMPILE_CANCELLED    /* never ran: the process is exiting */
} jit_compile_end;

/* Who owns entries: what the shared machinery needs from it. */
typedef struct jit_owner {
    const char *name;           /* for log lines */
    pthread_mutex_t *lock;      /* an entry's compiled state changes only under it */
    const jit_log *log;
    jit_env *env;               /* the kernel cache (compiles count into their entry) */
    const em_allocator *alloc;  /* what entries are allocated with */
    bool async;                 /* compile new entries on the compile queue */
    /* Optional: a background compile holds the owner (hold) until it has
     * published (drop, without the lock); the entry then has no wait
     * handle.  NULL: jit_entry_free waits for the job instead. */
    void (*hold)(struct jit_owner *o);
    void (*drop)(struct jit_owner *o);
    /* A compile of e finished (how), e's state published (e->failed: it
     * failed): count it.  Under the lock. */
    void (*compiled)(struct jit_owner *o, jit_entry *e, jit_compile_end how);
    /* Optional: what the dynamic-entry builder decided for e.  why NULL: e
     * is dynamic (compiled false: its graph checked, compiled true: its
     * kernels too); else why e stays static. */
    void (*log_dynamic)(const struct jit_owner *o, const jit_entry *e, bool compiled,
                        const char *why);
    /* The eager check (entry.c): calls of each plan a new CPU entry times
     * before it keeps the faster; 0: none (jit_env_eager_check). */
    int eager_check;
    /* The check's clock in seconds; NULL: CLOCK_MONOTONIC (tests set a
     * fake, so that which plan is faster does not depend on the machine). */
    double (*check_clock)(void);
} jit_owner;

/* The most timed calls of each plan in one eager check. */
enum { JIT_EAGER_CHECK_MAX = 15 };

/* A graph and how it runs. */
struct jit_entry {
    kc_key key;                 /* lazy mode's structural key (keyed: jit_index reads
                                   it at the entry's start) */
    bool keyed;                 /* key is set: the compile queue deduplicates by it */
    tr_graph *graph;
    gd_guards *guards;          /* which calls it serves; NULL: found by key alone */
    const jit_backend *backend; /* the owner's, or for "auto" the graph's device's */
    void *state;                /* the backend's (NULL while compiling, or replay) */
    bool dynamic;               /* some dims dynamic: specialize/run_dynamic */
    bool follows;               /* some attribute sizes follow dynamic sizes (jit_dyn):
                                   the graph as recorded serves only its own sizes */
    jit_dyn *follow;            /* those sizes (no probe), for later entries to inherit */
    /* ready, failed, dynamic, follows, state and the guards change only
     * under the owner's lock; ready is published last (release) */
    bool ready;                 /* compiled: run with backend and state */
    bool failed;                /* its compile failed or was cancelled: op by op for good */
    jit_job *job;               /* its background compile's wait handle, or NULL */
    /* what its compile did (per-entry statistics) */
    int64_t kernels_compiled, kernels_loaded, plans_loaded, plans_stored, lowered;
    int64_t tuned, tune_hits;   /* autotuning: kernels timed, choices read from the cache */
    /* The eager check (entry.c), with __atomic operations: calls handed
     * out, times recorded ([0] the compiled plan's, [1] op by op's, in
     * seconds; each slot written by its call); eager: op by op won, for
     * good. */
    int check_calls, check_timed;
    bool check_over;            /* decided, or abandoned (a timed call failed) */
    double check_s[2][JIT_EAGER_CHECK_MAX];
    bool eager;
};

/* ---- entries ---- */

/* A new entry for graph g (the entry's from now on) with backend b; key
 * (or NULL) its lookup key.  NULL: no memory (g is still the caller's). */
jit_entry *jit_entry_new(tr_graph *g, const jit_backend *b, const kc_key *key);
/* Waits for e's queued compile (never cancelled here: the job frees its
 * own), then frees everything e owns.  Under the owner's allocator. */
void jit_entry_free(jit_entry *e);
/* Whether e serves the inputs in (its guards pass and, for a compiled
 * dynamic entry, its backend's specialize accepts the sizes); *spec gets
 * what its run needs.  Under the owner's lock. */
bool jit_entry_serves(const jit_owner *o, jit_entry *e, em_tensor *const *in,
                      const double *scalars, void **spec);
/* Runs e (unlocked: entries live as long as their owner, and a compiled
 * entry's state never changes again); ready: e->ready as read under the
 * lock.  Not ready (compiling, failed), or moved to op by op by its eager
 * check: op by op with the replay backend.  o: e's owner (its settings
 * and log).  The owner's lock may be held or not. */
em_status jit_entry_run(const jit_owner *o, jit_entry *e, bool ready, void *spec,
                        em_tensor *const *in, em_tensor **out);

/* ---- the entry table ---- */

/* Open addressing over records that start with their kc_key (entries,
 * lazy mode's structures): a slot holds a record, or NULL.  The key is a
 * uniform hash already, so its first bytes choose the slot. */
typedef struct jit_index {
    const void **slots;
    int cap, n;                 /* cap: a power of two, or 0 */
} jit_index;

/* The record with key, or NULL. */
void *jit_index_find(const jit_index *ix, const kc_key *key);
/* Adds rec (its key at its start); the index stays at most half full. */
bool jit_index_add(jit_index *ix, const void *rec);
void jit_index_free(jit_index *ix);

/* An owner's entries, least recently used first (the last is the one
 * that served most recently, or the newest). */
typedef struct jit_table {
    jit_entry **entries;
    int n, cap;
    jit_index index;            /* keyed entries, by key */
} jit_table;

/* Adds e as the most recent entry (keyed: also to the index).  false: no
 * memory (e not added). */
bool jit_table_add(jit_table *t, jit_entry *e);
/* The i-th most recently used entry. */
jit_entry *jit_table_recent(const jit_table *t, int i);
/* The entry with key (lazy mode), or NULL: by the 128-bit key alone, as
 * the kernel cache trusts its keys. */
jit_entry *jit_table_find_key(const jit_table *t, const kc_key *key);
/* The most recently used entry that serves the call (jit_entry_serves),
 * made the most recent; NULL: none.  *declined: some dynamic entry passed
 * its guards but not its kernels' check. */
jit_entry *jit_table_find(const jit_owner *o, jit_table *t, em_tensor *const *in,
                          const double *scalars, void **spec, bool *declined);
/* Frees every entry and the table's arrays. */
void jit_table_free(jit_table *t);

/* ---- the recompile limit (EMBER_RECOMPILE_LIMIT) ----
 * One rule for a group of entries (a compiled function's; a lazy graph
 * structure's size variants): a group takes a new entry while it holds
 * fewer than limit; past it what matches none runs eagerly, and the first
 * refusal is logged, once per group. */
typedef struct jit_limit {
    int entries;                /* entries the group holds */
    int limit;
    bool logged;
} jit_limit;

/* Whether the group has room for one more entry (nothing logged). */
bool jit_limit_room(const jit_limit *l);
/* jit_limit_room, logging fmt once when there is none. */
bool jit_limit_admit(jit_limit *l, const jit_log *log, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- the dynamic-entry builder ---- */

/* A dynamic description for ninputs inputs (probe zeroed), or NULL. */
jit_dyn *jit_dyn_new(int ninputs);
void jit_dyn_free(jit_dyn *d);
/* The dims a new entry after prev (the entry that differs from the call
 * only in sizes) makes dynamic (Dynamo's automatic_dynamic_shapes): those
 * whose sizes differ from prev's traced ones, plus prev's own dynamic
 * dims; a mask per input.  Dims of size 0 or 1 in the call are left out,
 * except, with ones, prev's dynamic dims of size 1 (a batch of 1 after
 * the batch became dynamic: the two traces then decide whether size 1
 * is the same graph). */
void jit_dyn_mask(const jit_entry *prev, em_tensor *const *in, int ninputs, bool ones,
                  uint32_t *mask);
/* Records the entry's function again for other input metas, computing
 * nothing (em_compile's dry trace, compile.c): the graph after the same
 * passes, or NULL when the function fails, reads a value or draws random
 * numbers there. */
typedef struct jit_retrace {
    tr_graph *(*trace)(void *ud, const em_meta *inputs);
    void *ud;
    /* the sizes the function read with em_size while it was traced: only
     * dims of those sizes are widened (the code computes with them; a
     * width it never reads stays static, with its faster kernels) */
    const int64_t *reads;
    int nreads;
} jit_retrace;

/* Marks the dims in mask (a mask per input) dynamic in e's guards, when
 * the backend has dynamic kernels and the graph allows it (jit_dyn_check
 * against prev's graph and the sizes that followed in it; prev NULL:
 * a dry trace (rt) at probe sizes, else forced mode's rules); fills dyn
 * for the compile.  With rt (and prev),
 * the other dims of size 2 or more join them where a dry trace at probe
 * sizes shows the graph follows them too.  Otherwise e's guards are
 * static again.  Logs either way (log_dynamic).  Returns e->dynamic. */
bool jit_entry_make_dynamic(const jit_owner *o, jit_entry *e, em_tensor *const *in,
                            const uint32_t *mask, const jit_entry *prev, const jit_retrace *rt,
                            jit_dyn *dyn);

/* Lets dynamic entry e take the size 1 at the dims where inputs in (which
 * fail its guards there only) have it, when g, the graph traced at those
 * sizes, is e's graph at them (jit_dyn_same): a real trace doing what
 * jit_entry_make_dynamic's dry trace at 1 does.  Whether e now takes in's
 * sizes (its kernels still check them, specialize). */
bool jit_entry_take_one(jit_entry *e, em_tensor *const *in, const tr_graph *g);

/* ---- recording (EMBER_RECORD) ---- */

/* Appends entry e of function name to the warmup list at path (NULL: not
 * recording), for ember-cache warmup: em_compile's and lazy mode's entries
 * alike.  A failure is logged once (*failed set) and never fails a call. */
void jit_record_entry(const char *path, bool *failed, const jit_log *log, const char *name,
                      const jit_entry *e);

/* ---- the compile job ---- */

/* Compiles e now (the owner's lock held), dyn (taken; NULL: static)
 * describing a dynamic entry: a backend that cannot make the kernels
 * dynamic compiles them for the traced sizes, and e's guards check the
 * traced sizes again (logged).  On failure e->failed, and the error is
 * left for the caller. */
em_status jit_entry_compile_now(jit_owner *o, jit_entry *e, jit_dyn *dyn);
/* As jit_entry_compile_now, but on the process's compile queue when the
 * owner compiles asynchronously and the job can be queued (then e is
 * returned not ready, and served op by op until the job publishes it).
 * Identical graphs (of other owners) compile one after the other, the
 * second from the cache.  At exit a job not started is cancelled: the
 * entry runs op by op.  A background compile that fails is logged. */
em_status jit_entry_compile(jit_owner *o, jit_entry *e, jit_dyn *dyn);

#endif
