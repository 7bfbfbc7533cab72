/* compile.c - em_compile and em_call: entries, guards, recompiles, the
 * recompile limit, graph breaks.
 *
 * Ownership: a compiled function owns its entries; an entry owns its graph
 * (and through it references to captured constants), its guards and its
 * backend state.  em_compiled_free releases everything. */
#include "jit.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 64
#define DEFAULT_RECOMPILE_LIMIT 8

typedef struct jit_entry {
    tr_graph *graph;
    gd_guards *guards;
    void *state;          /* the backend's */
} jit_entry;

struct em_compiled {
    em_fn fn;
    void *ctx;
    int ninputs, nscalars, noutputs;
    char *name;
    char **input_names;
    em_tensor *const **watch;
    int nwatch;
    int limit;
    bool verify;          /* run the graph verifier after every pass (EMBER_VERIFY=1) */
    const jit_backend *backend;
    jit_entry **entries;  /* most recently used first */
    int nentries;
    bool limit_logged;
    em_compile_stats stats;
    jit_log log;
    jit_env env;          /* the kernel cache and compile counters */
    pthread_mutex_t lock; /* entries and stats; held while tracing */
    const em_allocator *alloc;
};

/* ---- creation ---- */

static char *dup_str(const char *s) {
    char *d = em_malloc(strlen(s) + 1);
    if (d) strcpy(d, s);
    return d;
}

static bool is_identifier(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_')) return false;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_')) return false;
    return true;
}

static em_status check_options(em_fn fn, const em_compile_options *o) {
    if (!fn) return em_error(EM_ERR_NULL, "em_compile: fn is NULL");
    if (!o) return em_error(EM_ERR_NULL, "em_compile: options are NULL");
    if (o->ninputs < 0 || o->ninputs > MAX_ARGS || o->nscalars < 0 || o->nscalars > MAX_ARGS)
        return em_error(EM_ERR_ARG, "em_compile: %d inputs and %d scalars (each 0..%d)",
                        o->ninputs, o->nscalars, MAX_ARGS);
    if (o->noutputs < 1 || o->noutputs > MAX_ARGS)
        return em_error(EM_ERR_ARG, "em_compile: %d outputs (1..%d)", o->noutputs, MAX_ARGS);
    if (o->recompile_limit < 0)
        return em_error(EM_ERR_ARG, "em_compile: recompile_limit %d is negative",
                        o->recompile_limit);
    if (o->backend && !jit_backend_find(o->backend))
        return em_error(EM_ERR_ARG, "em_compile: unknown backend '%s' (available: auto, cpu, cuda, replay)",
                        o->backend);
    if (o->name && !o->name[0]) return em_error(EM_ERR_ARG, "em_compile: empty name");
    for (int i = 0; o->input_names && i < o->ninputs; i++) {
        if (!is_identifier(o->input_names[i]))
            return em_error(EM_ERR_ARG, "em_compile: input name %d is not an identifier", i);
        for (int j = 0; j < i; j++)
            if (!strcmp(o->input_names[i], o->input_names[j]))
                return em_error(EM_ERR_ARG, "em_compile: input name '%s' is repeated",
                                o->input_names[i]);
    }
    if (o->nwatch < 0 || (o->nwatch > 0 && !o->watch))
        return em_error(EM_ERR_ARG, "em_compile: %d watched slots but no array", o->nwatch);
    for (int i = 0; i < o->nwatch; i++)
        if (!o->watch[i]) return em_error(EM_ERR_NULL, "em_compile: watched slot %d is NULL", i);
    return EM_OK;
}

/* EMBER_RECOMPILE_LIMIT, or the default when unset or not a count. */
static int env_limit(const jit_log *log) {
    const char *e = getenv("EMBER_RECOMPILE_LIMIT");
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

em_compiled *em_compile(em_fn fn, void *ctx, const em_compile_options *opts) {
    if (check_options(fn, opts) != EM_OK) return NULL;
    em_compiled *f = em_calloc(1, sizeof *f);
    if (!f) return NULL;
    f->fn = fn;
    f->ctx = ctx;
    f->ninputs = opts->ninputs;
    f->nscalars = opts->nscalars;
    f->noutputs = opts->noutputs;
    f->backend = jit_backend_find(opts->backend);
    f->alloc = em_get_allocator();
    jit_log_open(&f->log);
    f->limit = opts->recompile_limit ? opts->recompile_limit : env_limit(&f->log);
    f->env.log = &f->log;
    const char *v = getenv("EMBER_VERIFY");
    f->verify = v && *v && strcmp(v, "0") != 0;
    if (f->backend != &jit_replay_backend) f->env.cache = kc_open(NULL, 0);
    f->name = dup_str(opts->name ? opts->name : "fn");
    f->input_names = em_calloc((size_t)(f->ninputs ? f->ninputs : 1), sizeof(char *));
    f->watch = em_calloc((size_t)(opts->nwatch ? opts->nwatch : 1), sizeof *f->watch);
    f->entries = em_calloc((size_t)(f->limit ? f->limit : 1), sizeof *f->entries);
    bool ok = f->name && f->input_names && f->watch && f->entries;
    for (int i = 0; ok && i < f->ninputs; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "in%d", i);
        ok = (f->input_names[i] = dup_str(opts->input_names ? opts->input_names[i] : buf)) != NULL;
    }
    if (ok) {
        f->nwatch = opts->nwatch;
        memcpy(f->watch, opts->watch, sizeof *f->watch * (size_t)opts->nwatch);
        ok = pthread_mutex_init(&f->lock, NULL) == 0;
    }
    if (!ok) {
        f->nentries = 0;
        jit_log_close(&f->log);
        for (int i = 0; f->input_names && i < f->ninputs; i++) em_free(f->input_names[i]);
        em_free(f->input_names);
        em_free(f->watch);
        em_free(f->entries);
        em_free(f->name);
        kc_close(f->env.cache);
        em_free(f);
        return NULL;
    }
    return f;
}

static void entry_free(const em_compiled *f, jit_entry *e) {
    if (!e) return;
    if (e->state) f->backend->free(e->state);
    gd_free(e->guards);
    tr_graph_free(e->graph);
    em_free(e);
}

void em_compiled_free(em_compiled *f) {
    if (!f) return;
    const em_allocator *saved = em_get_allocator();
    em_set_allocator(f->alloc); /* free with the allocator that made it */
    for (int i = 0; i < f->nentries; i++) entry_free(f, f->entries[i]);
    for (int i = 0; i < f->ninputs; i++) em_free(f->input_names[i]);
    em_free(f->input_names);
    em_free(f->watch);
    em_free(f->entries);
    em_free(f->name);
    kc_close(f->env.cache);
    jit_log_close(&f->log);
    pthread_mutex_destroy(&f->lock);
    em_free(f);
    em_set_allocator(saved);
}

/* ---- calls ---- */

static em_status check_call(const em_compiled *f, em_tensor *const *in, const double *scalars,
                            em_tensor **out) {
    if (!f) return em_error(EM_ERR_NULL, "em_call: the compiled function is NULL");
    if (!out) return em_error(EM_ERR_NULL, "em_call(%s): out is NULL", f->name);
    for (int i = 0; i < f->noutputs; i++) out[i] = NULL;
    if (f->ninputs > 0 && !in) return em_error(EM_ERR_NULL, "em_call(%s): in is NULL", f->name);
    if (f->nscalars > 0 && !scalars)
        return em_error(EM_ERR_NULL, "em_call(%s): scalars is NULL", f->name);
    for (int i = 0; i < f->ninputs; i++) {
        if (!in[i]) return em_error_null(f->name, f->input_names[i]);
        if (!in[i]->storage)
            return em_error(EM_ERR_STATE, "em_call(%s): input %d (%s) has no data", f->name, i,
                            f->input_names[i]);
    }
    return EM_OK;
}

/* Moves fn's outputs out of the call's scope, or drops them on failure. */
static em_status finish_outputs(const em_compiled *f, em_status s, em_tensor **out) {
    for (int i = 0; s == EM_OK && i < f->noutputs; i++)
        if (!out[i])
            s = em_error(EM_ERR_NULL, "em_call(%s): the function left output %d NULL", f->name, i);
    for (int i = 0; i < f->noutputs; i++) out[i] = s == EM_OK ? em_keep(out[i]) : NULL;
    em_scope_end();
    return s;
}

/* Runs fn itself: no recording, no entry. */
static em_status run_eager(const em_compiled *f, em_tensor *const *in, const double *scalars,
                           em_tensor **out) {
    em_scope_begin();
    em_status s = f->fn(f->ctx, in, scalars, out);
    return finish_outputs(f, s, out);
}

static void lock(em_compiled *f) { pthread_mutex_lock(&f->lock); }
static void unlock(em_compiled *f) { pthread_mutex_unlock(&f->lock); }

/* Moves entry i to the front (most recently used). */
static void touch(em_compiled *f, int i) {
    jit_entry *e = f->entries[i];
    memmove(&f->entries[1], &f->entries[0], sizeof *f->entries * (size_t)i);
    f->entries[0] = e;
}

static void log_entry(const em_compiled *f, const jit_entry *e) {
    if (f->log.flags & JIT_LOG_GRAPH) {
        jit_logf(&f->log, JIT_LOG_GRAPH, "captured graph of %s (entry %d):", f->name,
                 f->nentries);
        tr_print(e->graph, f->log.f);
    }
    if (f->log.flags & JIT_LOG_GUARDS) {
        jit_logf(&f->log, JIT_LOG_GUARDS, "guards of %s (entry %d):", f->name, f->nentries);
        gd_print(e->guards, f->log.f);
    }
    fflush(f->log.f);
}

/* Builds an entry from a recorded graph (which it takes). */
static jit_entry *make_entry(em_compiled *f, tr_graph *g, em_tensor *const *in,
                             const double *scalars) {
    jit_entry *e = em_calloc(1, sizeof *e);
    if (!e) {
        tr_graph_free(g);
        return NULL;
    }
    e->graph = g;
    if (tr_optimize(g, f->verify) != EM_OK ||
        !(e->guards = gd_build(g, in, scalars, f->nscalars, f->watch, f->nwatch)) ||
        f->backend->compile(g, &f->env, &e->state) != EM_OK) {
        entry_free(f, e);
        return NULL;
    }
    return e;
}

/* Runs fn while recording; on success adds an entry.  Holds f's lock. */
static em_status trace(em_compiled *f, em_tensor *const *in, const double *scalars,
                       em_tensor **out) {
    em_scope_begin();
    tr_recorder *r = tr_record_begin(f->ninputs, in, (const char *const *)f->input_names);
    if (!r) {
        em_scope_end();
        return em_last_status();
    }
    em_status s = f->fn(f->ctx, in, scalars, out);
    if (s != EM_OK) {
        tr_record_abort(r);
        return finish_outputs(f, s, out);
    }
    char why[256];
    tr_graph *g = tr_record_end(r, f->noutputs, out, why, sizeof why);
    if (!g && why[0]) {
        /* the function ran eagerly to the end: its results are valid */
        f->stats.broken = true;
        f->stats.eager++;
        jit_logf(&f->log, JIT_LOG_BREAKS, "graph break in %s: %s; %s runs eagerly from now on",
                 f->name, why, f->name);
        return finish_outputs(f, EM_OK, out);
    }
    jit_entry *e = g ? make_entry(f, g, in, scalars) : NULL;
    if (!e) return finish_outputs(f, em_last_status() ? em_last_status() : EM_ERR_STATE, out);
    memmove(&f->entries[1], &f->entries[0], sizeof *f->entries * (size_t)f->nentries);
    f->entries[0] = e;
    f->nentries++;
    f->stats.traces++;
    f->stats.entries = f->nentries;
    f->stats.kernels = f->backend->kernels ? f->backend->kernels(e->state) : 0;
    f->stats.kernels_compiled = f->env.compiled;
    f->stats.kernels_loaded = f->env.loaded;
    log_entry(f, e);
    return finish_outputs(f, EM_OK, out);
}

em_status em_call(em_compiled *f, em_tensor *const *in, const double *scalars, em_tensor **out) {
    em_status s = check_call(f, in, scalars, out);
    if (s != EM_OK) return s;
    /* Called while this thread records or defers ops (inside another
     * traced function): run fn inline, so the outer graph sees its ops. */
    if (em_ctx()->hook.fn) return run_eager(f, in, scalars, out);
    lock(f);
    f->stats.calls++;
    if (f->stats.broken) {
        f->stats.eager++;
        unlock(f);
        return run_eager(f, in, scalars, out);
    }
    for (int i = 0; i < f->nentries; i++) {
        if (!gd_check(f->entries[i]->guards, in, scalars)) continue;
        touch(f, i);
        f->stats.hits++;
        jit_entry *e = f->entries[0];
        unlock(f); /* entries live until em_compiled_free: safe to run unlocked */
        return f->backend->run(e->state, e->graph, in, out);
    }
    /* explain with the entry that came closest to matching */
    for (int i = 0, best = -1; i < f->nentries; i++) {
        char why[sizeof f->stats.last_failure];
        int passed = gd_explain(f->entries[i]->guards, in, scalars, why, sizeof why);
        if (passed > best) {
            best = passed;
            memcpy(f->stats.last_failure, why, sizeof why);
        }
    }
    if (f->nentries >= f->limit) {
        f->stats.eager++;
        if (!f->limit_logged) {
            f->limit_logged = true;
            jit_logf(&f->log, 0, "%s hit the recompile limit (%d entries); calls that match no "
                     "entry run eagerly. Last failure: %s", f->name, f->limit,
                     f->stats.last_failure[0] ? f->stats.last_failure : "none");
        }
        unlock(f);
        return run_eager(f, in, scalars, out);
    }
    if (f->nentries > 0)
        jit_logf(&f->log, JIT_LOG_RECOMPILES, "recompiling %s (entry %d of at most %d): %s",
                 f->name, f->nentries + 1, f->limit, f->stats.last_failure);
    s = trace(f, in, scalars, out);
    unlock(f);
    return s;
}

em_status em_compiled_stats(const em_compiled *f, em_compile_stats *out) {
    if (!f) return em_error(EM_ERR_NULL, "em_compiled_stats: the compiled function is NULL");
    if (!out) return em_error(EM_ERR_NULL, "em_compiled_stats: out is NULL");
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    *out = f->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return EM_OK;
}

em_status em_compiled_print(const em_compiled *f, int entry, bool dot, FILE *out) {
    if (!f) return em_error(EM_ERR_NULL, "em_compiled_print: the compiled function is NULL");
    if (!out) return em_error(EM_ERR_NULL, "em_compiled_print: out is NULL");
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    em_status s;
    if (entry < 0 || entry >= f->nentries) {
        s = em_error(EM_ERR_INDEX, "em_compiled_print: entry %d of %d", entry, f->nentries);
    } else {
        const jit_entry *e = f->entries[entry];
        s = dot ? tr_print_dot(e->graph, out) : tr_print(e->graph, out);
        if (s == EM_OK && !dot) gd_print(e->guards, out);
    }
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return s;
}
