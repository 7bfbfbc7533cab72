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

/* What a backend may use while compiling: owned by the compiled function. */
typedef struct jit_env {
    kc_cache *cache;            /* compiled artifacts; NULL: none */
    const struct jit_log *log;
    int64_t compiled;           /* kernels compiled (counted by the backend) */
    int64_t loaded;             /* kernels loaded from the cache instead */
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
} jit_backend;

extern const jit_backend jit_replay_backend;
/* "cpu": fused kernels compiled with libgccjit (backend_cpu.c). */
extern const jit_backend jit_cpu_backend;
/* "cuda": fused NVRTC kernels and cuBLAS on the inputs' GPU (backend_cuda.c). */
extern const jit_backend jit_cuda_backend;
/* "auto", the default: "cuda" for a graph on a CUDA device, else "cpu". */
extern const jit_backend jit_auto_backend;
/* The backend called name (NULL: the default, "auto"), or NULL. */
const jit_backend *jit_backend_find(const char *name);
/* Runs call node n eagerly on the values of its inputs (vals, by node);
 * random ops draw from their generator's current state, as eager code. */
em_tensor *jit_replay_node(const tr_node *n, em_tensor **vals);

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
