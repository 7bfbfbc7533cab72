/* jit.h - compiled functions (src/jit): entries, backends, logging.
 *
 * em_compile wraps a user function; each call either runs an entry whose
 * guards match, or traces the function into a new entry (graph + guards +
 * backend state), or, past the recompile limit or after a graph break,
 * runs it eagerly. */
#ifndef EMBER_JIT_H
#define EMBER_JIT_H

#include <pthread.h>

#include "engine.h"

/* ---- backends: how an entry's graph runs ----
 * compile builds the backend's state for g (which outlives it); run
 * computes the graph's outputs from its inputs (new tensors, owned as any
 * op result); free releases the state.  All three are required. */
typedef struct jit_backend {
    const char *name;
    em_status (*compile)(const tr_graph *g, jit_env *env, void **state);
    em_status (*run)(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out);
    void (*free)(void *state);
    /* Optional: native kernels the state holds (for statistics). */
    int (*kernels)(const void *state);
    /* Optional: device graphs the state captured and calls it replayed
     * through them (for statistics). */
    void (*graph_stats)(void *state, int64_t *captured, int64_t *replays);
    /* Optional: what the artifacts depend on besides the graph (compiler,
     * generator and options versions); NULL: no artifacts (nothing to
     * record or warm up). */
    const char *(*target)(void);
    /* Optional, dynamic shapes (dynamic.c): compile g so that one state
     * serves inputs whose sizes differ from the traced ones where
     * dyn->probe (the inputs' metas with each dynamic size changed)
     * differs; dyn->sizes: attribute sizes that follow them.  When
     * the backend cannot, it compiles g for its traced sizes only, sets
     * *dynamic false and explains in why.  NULL: the backend cannot. */
    em_status (*compile_dynamic)(const tr_graph *g, const struct jit_dyn *dyn, jit_env *env,
                                 void **state, bool *dynamic, char *why, size_t nwhy);
    /* Optional, with compile_dynamic: whether a dynamic state can serve the
     * inputs in (which passed the entry's guards), and what its run needs
     * for them in *spec, for run_dynamic (called under the compiled
     * function's lock; NULL: the state serves every input its guards
     * pass, with run). */
    bool (*specialize)(void *state, const tr_graph *g, em_tensor *const *in, void **spec);
    /* Optional, with specialize: why it last refused (a sentence, "" if never). */
    const char *(*declined)(const void *state);
    em_status (*run_dynamic)(void *state, void *spec, const tr_graph *g, em_tensor *const *in,
                             em_tensor **out);
    /* The engine's device it compiles for (NULL: replay, auto). */
    const jit_device *device;
    /* A run returns when its work is done (the CPU): its wall time is its
     * cost, so the eager check (entry.c) may compare it with op by op. */
    bool host_timed;
} jit_backend;

extern const jit_backend jit_replay_backend;
/* "cpu", "cuda": the engine (engine.h) on that device (backends.c). */
extern const jit_backend jit_cpu_backend;
extern const jit_backend jit_cuda_backend;
/* "auto", the default: "cuda" for a graph on a CUDA device, else "cpu". */
extern const jit_backend jit_auto_backend;
/* The backend that compiles g under b: b itself, or for "auto" the
 * backend of g's device ("cuda" or "cpu"). */
const jit_backend *jit_backend_for_graph(const jit_backend *b, const tr_graph *g);
/* Whether b (or, for "auto", the cpu backend) has artifacts to record
 * and warm up. */
bool jit_backend_has_artifacts(const jit_backend *b);
/* The backend called name (NULL: the default, "auto"), or NULL. */
const jit_backend *jit_backend_find(const char *name);

/* ---- warmup lists (warmlist.c) and ahead-of-time compiles (warmup.c) ---- */
typedef struct jit_record {
    char *name;     /* the compiled function's name (informational) */
    char *backend;  /* "cpu", ... */
    char *graph;    /* the graph's text form */
    uint32_t *dyn;  /* a dynamic entry's dims per input (from its guard lines'
                       "dynamic=[...]"), ndyn of them; NULL, 0: static */
    int ndyn;
    jit_sym_size *follow; /* the attributes that follow its dynamic sizes (its
                             "follow" lines), nfollow of them */
    int nfollow;
    /* divisors of dynamic dims (its guard lines' "divisible=D:Q"): input,
     * dim, q; ndiv of them */
    struct jit_record_div { int input, dim; int64_t q; } *div;
    int ndiv;
} jit_record;

/* Appends one record (graph g of function name, with its guards as
 * comments) to the warmup list at path, created 0600 if absent. */
em_status jit_record_append(const char *path, const char *name, const char *backend,
                            const tr_graph *g, const gd_guards *guards, const jit_dyn *follow);
/* Reads every record of the warmup list at path (*out: em_malloc'd, free
 * with jit_records_free).  A malformed file is EM_ERR_ARG naming the line. */
em_status jit_records_read(const char *path, jit_record **out, int *n);
void jit_records_free(jit_record *rs, int n);

typedef enum jit_warm_result {
    JIT_WARM_COMPILED, /* compiled now (kernels may have been present) */
    JIT_WARM_PRESENT,  /* the graph's plan and kernels were all in the cache */
    JIT_WARM_FAILED    /* bad record, unknown backend, or nothing compilable */
} jit_warm_result;

/* Compiles the recorded graph r into cache (graph plan and kernels), as
 * em_compile would on a first call.  target (NULL: the record's device
 * here) names the GPU architecture of a CUDA record ("sm_90"): its kernels
 * are then compiled with NVRTC alone and stored, without a GPU.  On
 * JIT_WARM_FAILED, why says why. */
jit_warm_result jit_warmup(const jit_record *r, kc_cache *cache, const char *target, char *why,
                           size_t nwhy);
/* What jit_explain found for a record. */
typedef struct jit_explained {
    bool dynamic;    /* a dynamic entry: kernels only, it has no plan */
    bool plan;       /* a static entry's plan is in the cache (and usable) */
    bool unusable;   /* its plan is there, but bad or some kernels are missing */
    int64_t kernels; /* kernels the graph needs */
    int64_t present; /* of which the cache holds a verified artifact */
} jit_explained;

/* Looks up what jit_warmup would store for r (its plan and kernels) in
 * cache, compiling nothing and writing no entry (a dry run: a plan miss
 * lowers the graph to key its kernels); each miss is explained on out,
 * one line "<what> (<key>): <why>" (kc_explain's paragraph).  false,
 * with why, when r cannot be looked up (what JIT_WARM_FAILED means). */
bool jit_explain(const jit_record *r, kc_cache *cache, const char *target, FILE *out,
                 jit_explained *res, char *why, size_t nwhy);
/* The target string of a backend's artifacts (part of their keys), or
 * NULL for a backend without artifacts. */
const char *jit_backend_target(const jit_backend *b);

/* ---- settings from the environment (entry.c), read by em_compile and
 * by lazy mode; bad values are logged on log and replaced by the default */
/* EMBER_RECOMPILE_LIMIT: entries before falling back to eager (default 8). */
int jit_env_recompile_limit(const struct jit_log *log);
/* EMBER_DYNAMIC: 0/off -1, force 1, else (unset, 1, auto) 0. */
int jit_env_dynamic(const struct jit_log *log);
/* Whether the variable is set to anything but "" or "0". */
bool jit_env_flag(const char *name);
/* EMBER_CUDA_GRAPHS: 1 (or on) true, 0, off or unset false (the default:
 * docs/cuda.md#cuda-graphs says why); other values are logged. */
bool jit_env_cuda_graphs(const struct jit_log *log);
/* EMBER_AUTOTUNE: 1 (or on) true, 0, off or unset false (the default:
 * a first compile then never spends time timing); other values are logged. */
bool jit_env_autotune(const struct jit_log *log);
/* EMBER_EAGER_CHECK: the calls of each plan an entry's eager check times
 * (entry.c): unset 3, 0 or off none, else 1 to 15; other values are
 * logged and mean 3. */
int jit_env_eager_check(const struct jit_log *log);

/* ---- lazy mode (lazy.c) ---- */
/* Whether h is lazy mode's hook (not a recorder's). */
bool jit_lazy_hook(const em_dispatch_hook *h);
/* This thread's lazy-mode hook, whether or not lazy mode is on (fn NULL
 * when its state cannot be made): a recorder that runs ops through it
 * records without computing. */
em_dispatch_hook jit_lazy_runner(void);

#endif
