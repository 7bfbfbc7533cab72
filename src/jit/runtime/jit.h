/* jit.h - compiled functions (src/jit): entries, backends, logging.
 *
 * em_compile wraps a user function; each call either runs an entry whose
 * guards match, or traces the function into a new entry (graph + guards +
 * backend state), or, past the recompile limit or after a graph break,
 * runs it eagerly. */
#ifndef EMBER_JIT_H
#define EMBER_JIT_H

#include <pthread.h>

#include "cache.h"
#include "guards.h"
#include "trace.h"

struct jit_log;
struct jit_dyn;

/* What a backend may use while compiling: owned by the compiled function. */
typedef struct jit_env {
    kc_cache *cache;            /* compiled artifacts; NULL: none */
    const struct jit_log *log;
    int64_t compiled;           /* kernels compiled (counted by the backend) */
    int64_t loaded;             /* kernels loaded from the cache instead */
    int64_t plans_loaded;       /* graphs whose plan came from the cache */
    int64_t plans_stored;       /* graphs whose plan this env wrote to the cache */
} jit_env;

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
    em_status (*run_dynamic)(void *state, void *spec, const tr_graph *g, em_tensor *const *in,
                             em_tensor **out);
} jit_backend;

/* ---- dynamic shapes (dynamic.c) ---- */

/* An attribute size that follows a dynamic size: node's attrs.sizes[j] is
 * a * (size of dim `dim` of input `input`) + b (a reshape to [b, t, 4, 16]
 * follows b and t). */
typedef struct jit_sym_size {
    int node, j, input, dim;
    int64_t a, b;
    bool rest; /* a reshape's size that is whatever its input's element
                  count leaves (a product of sizes: [b * t, 64]) */
} jit_sym_size;

#define JIT_MAX_SYM_SIZES 32

/* What makes an entry dynamic, for its backend: the inputs' metas with
 * each dynamic size changed (probe, one per input), and the attribute
 * sizes that follow dynamic sizes. */
typedef struct jit_dyn {
    em_meta *probe;
    jit_sym_size sizes[JIT_MAX_SYM_SIZES];
    int nsizes;
} jit_dyn;

/* Whether graph g, traced with inputs in, may serve other sizes of the
 * dims its guards gs mark dynamic.  The graph's shapes must follow (they
 * are inferred again at probe sizes: dims of one traced size share one
 * probe, as Dynamo's duck sizing), and no op may carry a size, bound or
 * value the C code computed from a dynamic size: prev (the same function
 * traced at other sizes, or NULL) must equal g in everything but metas,
 * except reshape and expand sizes that follow one dynamic size as
 * a * s + b (recorded in dyn->sizes; prev_dyn: the attribute sizes that
 * already followed in prev's entry, kept while they hold); without prev,
 * conservative rules decide.  Fills dyn (probe has g->ninputs slots).  false, with the
 * reason in why: the entry must be static. */
bool jit_dyn_check(const tr_graph *g, const tr_graph *prev, const jit_dyn *prev_dyn,
                   const gd_guards *gs, em_tensor *const *in, jit_dyn *dyn, char *why,
                   size_t nwhy);
/* The metas of g's nodes (into metas) for inputs of metas inputs, with
 * the attribute sizes dyn lists set in g's nodes (a copy of the graph's
 * own) as it goes.  An error names the node whose op rejects its inputs. */
em_status jit_dyn_infer(const jit_dyn *dyn, tr_graph *g, const em_meta *inputs, em_meta *metas);
/* Only the probe metas (no check): for a graph already checked when it
 * was traced (warmup of a recorded dynamic entry).  false: too many
 * distinct dynamic sizes. */
bool jit_dyn_probe(const gd_guards *gs, em_tensor *const *in, int ninputs, em_meta *probe);

extern const jit_backend jit_replay_backend;
/* "cpu": fused kernels compiled with libgccjit (backend_cpu.c). */
extern const jit_backend jit_cpu_backend;
/* "cuda": fused NVRTC kernels and cuBLAS on the inputs' GPU (backend_cuda.c). */
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
/* Runs call node n eagerly on the values of its inputs (vals, by node);
 * random ops draw from their generator's current state, as eager code. */
em_tensor *jit_replay_node(const tr_node *n, em_tensor **vals);

/* ---- warmup lists (warmlist.c) and ahead-of-time compiles (warmup.c) ---- */
typedef struct jit_record {
    char *name;     /* the compiled function's name (informational) */
    char *backend;  /* "cpu", ... */
    char *graph;    /* the graph's text form */
    uint32_t *dyn;  /* a dynamic entry's dims per input (from its guard lines'
                       "dynamic=[...]"), ndyn of them; NULL, 0: static */
    int ndyn;
} jit_record;

/* Appends one record (graph g of function name, with its guards as
 * comments) to the warmup list at path, created 0600 if absent. */
em_status jit_record_append(const char *path, const char *name, const char *backend,
                            const tr_graph *g, const gd_guards *guards);
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
 * em_compile would on a first call.  On JIT_WARM_FAILED, why says why. */
jit_warm_result jit_warmup(const jit_record *r, kc_cache *cache, char *why, size_t nwhy);
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

/* ---- lazy mode (lazy.c) ---- */
/* Whether h is lazy mode's hook (not a recorder's). */
bool jit_lazy_hook(const em_dispatch_hook *h);
/* This thread's lazy-mode hook, whether or not lazy mode is on (fn NULL
 * when its state cannot be made): a recorder that runs ops through it
 * records without computing. */
em_dispatch_hook jit_lazy_runner(void);

/* ---- logging (EMBER_LOG, EMBER_LOG_FILE) ---- */
enum {
    JIT_LOG_GRAPH = 1 << 0,      /* each captured graph */
    JIT_LOG_GUARDS = 1 << 1,     /* each entry's guards */
    JIT_LOG_RECOMPILES = 1 << 2, /* each recompile, with the failed guard */
    JIT_LOG_BREAKS = 1 << 3,     /* each graph break */
    JIT_LOG_CODE = 1 << 4,       /* each generated kernel, as kernel IR */
    JIT_LOG_CACHE = 1 << 5       /* kernel cache hits, misses and writes */
};

typedef struct jit_log {
    unsigned flags;
    FILE *f;       /* stderr or the EMBER_LOG_FILE */
    bool own;      /* f was opened here */
} jit_log;

/* Reads EMBER_LOG and EMBER_LOG_FILE; unknown names are reported once on
 * the log itself and ignored. */
void jit_log_open(jit_log *l);
void jit_log_close(jit_log *l);
/* Prints "[ember] " + the message + newline when flag is on (flag 0:
 * always). */
void jit_logf(const jit_log *l, unsigned flag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
