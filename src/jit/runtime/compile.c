/* compile.c - em_compile and em_call: guards, recompiles, graph breaks.
 * The entries, their table, the recompile limit, dynamic entries and
 * background compiles are the shared machinery of entry.c.
 *
 * Ownership: a compiled function owns its entries (entry-impl.h says what
 * an entry owns).  em_compiled_free releases everything. */
#include "entry-impl.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 64

struct em_compiled {
    em_fn fn;
    void *ctx;
    int ninputs, nscalars, noutputs;
    char *name;
    char **input_names;
    em_tensor *const **watch;
    int nwatch;
    bool verify;          /* run the graph verifier after every pass (EMBER_VERIFY=1) */
    const jit_backend *backend;
    jit_table entries;    /* jit_table_recent(0): the most recently used */
    jit_limit limit;      /* the recompile limit: limit.entries == entries.n */
    jit_owner own;        /* what the entry machinery needs: lock, log, env, allocator */
    em_compile_stats stats;
    jit_log log;
    jit_env env;          /* the kernel cache and compile counters */
    pthread_mutex_t lock; /* entries and stats; held while tracing */
    const em_allocator *alloc;
    char *record;         /* EMBER_RECORD: the warmup list new entries go to */
    bool record_failed;   /* a record could not be written (logged once) */
    int dynamic;          /* -1 off, 0 automatic, 1 forced (em_compile_options.dynamic) */
    bool async;           /* compile new entries in background threads */
    int lazy_trace;       /* em_compile_options.lazy_trace */
    em_dtype autocast;    /* em_compile_options.autocast: EM_F32 (none), f16, bf16 */
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
    if (o->autocast != EM_F32 && o->autocast != EM_F16 && o->autocast != EM_BF16)
        return em_error(EM_ERR_ARG, "em_compile: autocast is EM_F16, EM_BF16 or EM_F32 (none), not %d",
                        (int)o->autocast);
    if (o->dynamic < -1 || o->dynamic > 1 || o->async_compile < -1 || o->async_compile > 1 ||
        o->lazy_trace < -1 || o->lazy_trace > 1 || o->cuda_graphs < -1 || o->cuda_graphs > 1 ||
        o->autotune < -1 || o->autotune > 1)
        return em_error(EM_ERR_ARG, "em_compile: dynamic (%d), async_compile (%d), lazy_trace (%d), "
                        "cuda_graphs (%d) and autotune (%d) are -1, 0 or 1", o->dynamic, o->async_compile,
                        o->lazy_trace, o->cuda_graphs, o->autotune);
    if (o->eager_check < -1 || o->eager_check > JIT_EAGER_CHECK_MAX)
        return em_error(EM_ERR_ARG, "em_compile: eager_check is -1 (off), 0 (EMBER_EAGER_CHECK) or "
                        "1 to %d calls, not %d", JIT_EAGER_CHECK_MAX, o->eager_check);
    if (o->nwatch < 0 || (o->nwatch > 0 && !o->watch))
        return em_error(EM_ERR_ARG, "em_compile: %d watched slots but no array", o->nwatch);
    for (int i = 0; i < o->nwatch; i++)
        if (!o->watch[i]) return em_error(EM_ERR_NULL, "em_compile: watched slot %d is NULL", i);
    return EM_OK;
}

/* ---- what the entry machinery (entry.c) calls back ---- */

static em_compiled *owner_fn(const jit_owner *o) {
    return (em_compiled *)((char *)o - offsetof(em_compiled, own));
}

/* "x[0], w[1]": the dynamic dims of gs, for logs. */
static void dims_str(const gd_guards *gs, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < gs->ntensors; i++)
        for (int d = 0; d < gs->tensors[i].ndim; d++)
            if ((gs->tensors[i].dyn >> d & 1) && len < n)
                len += (size_t)snprintf(buf + len, n - len, "%s%s[%d]", len ? ", " : "",
                                        gs->names[i], d);
}

/* EMBER_LOG=recompiles: the dims a new entry makes dynamic (once its graph
 * is checked), or why it is static. */
static void log_dynamic(const jit_owner *o, const jit_entry *e, bool compiled, const char *why) {
    const em_compiled *f = owner_fn(o);
    if (why) {
        jit_logf(&f->log, JIT_LOG_RECOMPILES, "%s: the new entry is static: %s", f->name, why);
    } else if (!compiled) {
        char dims[256];
        dims_str(e->guards, dims, sizeof dims);
        jit_logf(&f->log, JIT_LOG_RECOMPILES, "%s: dynamic dims %s%s", f->name, dims,
                 e->follows ? " (sizes, bounds or values of ops follow them)" : "");
    }
}

/* Counters of a finished compile, under the lock.  One that failed in the
 * caller's thread leaves no entry: only its kernels count. */
static void count_compile(jit_owner *o, jit_entry *e, jit_compile_end how) {
    em_compiled *f = owner_fn(o);
    f->env.compiled += e->kernels_compiled;
    f->env.loaded += e->kernels_loaded;
    f->env.plans_loaded += e->plans_loaded;
    f->env.plans_stored += e->plans_stored;
    f->env.lowered += e->lowered;
    f->env.tuned += e->tuned;
    f->env.tune_hits += e->tune_hits;
    if (how == JIT_COMPILED_NOW && e->failed) return;
    f->stats.kernels = e->backend->kernels && e->state ? e->backend->kernels(e->state) : 0;
    f->stats.kernels_compiled = f->env.compiled;
    f->stats.kernels_loaded = f->env.loaded;
    f->stats.graphs_loaded = f->env.plans_loaded;
    f->stats.graphs_lowered = f->env.lowered;
    f->stats.kernels_tuned = f->env.tuned;
    f->stats.tune_hits = f->env.tune_hits;
    f->stats.dynamic_entries += e->dynamic;
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
    f->limit.limit = opts->recompile_limit ? opts->recompile_limit
                                           : jit_env_recompile_limit(&f->log);
    f->dynamic = opts->dynamic ? opts->dynamic : jit_env_dynamic(&f->log);
    f->async = opts->async_compile ? opts->async_compile > 0 : jit_env_flag("EMBER_ASYNC_COMPILE");
    f->lazy_trace = opts->lazy_trace;
    f->autocast = opts->autocast;
    f->env.log = &f->log;
    f->env.graphs = opts->cuda_graphs ? opts->cuda_graphs > 0 : jit_env_cuda_graphs(&f->log);
    f->env.autotune = opts->autotune ? opts->autotune > 0 : jit_env_autotune(&f->log);
    f->verify = jit_env_flag("EMBER_VERIFY");
    if (f->backend != &jit_replay_backend) f->env.cache = jit_cache_open(&f->log);
    char rbuf[EM_ENV_MAX];
    const char *rec = em_getenv("EMBER_RECORD", rbuf, sizeof rbuf);
    if (rec && *rec && jit_backend_has_artifacts(f->backend)) f->record = dup_str(rec);
    f->name = dup_str(opts->name ? opts->name : "fn");
    f->input_names = em_calloc((size_t)(f->ninputs ? f->ninputs : 1), sizeof(char *));
    f->watch = em_calloc((size_t)(opts->nwatch ? opts->nwatch : 1), sizeof *f->watch);
    bool ok = f->name && f->input_names && f->watch && (f->record || !rec || !*rec ||
                                                       !jit_backend_has_artifacts(f->backend));
    for (int i = 0; ok && i < f->ninputs; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "in%d", i);
        ok = (f->input_names[i] = dup_str(opts->input_names ? opts->input_names[i] : buf)) != NULL;
    }
    if (ok) {
        f->nwatch = opts->nwatch;
        em_copy_bytes(f->watch, opts->watch, sizeof *f->watch * (size_t)opts->nwatch);
        ok = pthread_mutex_init(&f->lock, NULL) == 0 ||
             (em_error(EM_ERR_NOMEM, "em_compile: cannot make the function's lock"), false);
    }
    if (!ok) {
        jit_log_close(&f->log);
        for (int i = 0; f->input_names && i < f->ninputs; i++) em_free(f->input_names[i]);
        em_free(f->input_names);
        em_free(f->watch);
        em_free(f->name);
        em_free(f->record);
        kc_close(f->env.cache);
        em_free(f);
        return NULL;
    }
    f->own = (jit_owner){.name = f->name, .lock = &f->lock, .log = &f->log, .env = &f->env,
                         .alloc = f->alloc, .async = f->async, .compiled = count_compile,
                         .log_dynamic = log_dynamic,
                         .eager_check = opts->eager_check < 0   ? 0
                                        : opts->eager_check > 0 ? opts->eager_check
                                                                : jit_env_eager_check(&f->log)};
    return f;
}

void em_compiled_free(em_compiled *f) {
    if (!f) return;
    const em_allocator *saved = em_get_allocator();
    em_set_allocator(f->alloc); /* free with the allocator that made it */
    jit_table_free(&f->entries);
    for (int i = 0; i < f->ninputs; i++) em_free(f->input_names[i]);
    em_free(f->input_names);
    em_free(f->watch);
    em_free(f->name);
    em_free(f->record);
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
        /* a deferred input (lazy mode) is computed first, unless the call
         * itself is deferred (run inline under the thread's hook) */
        if (!in[i]->storage && !em_ctx()->hook.fn && em_force(in[i]) != EM_OK)
            return em_error_context("em_call(%s): input %d (%s)", f->name, i, f->input_names[i]);
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

/* A function with a graph break runs in lazy mode: the ops before each
 * read are one compiled segment (cached by structure in the thread's lazy
 * table), the read sees computed values, and the ops after it the next
 * segment.  The outputs are computed before returning. */
static em_status run_segments(const em_compiled *f, em_tensor *const *in, const double *scalars,
                              em_tensor **out) {
    if (em_lazy_begin() != EM_OK) return run_eager(f, in, scalars, out);
    em_scope_begin();
    em_status s = f->fn(f->ctx, in, scalars, out);
    for (int i = 0; s == EM_OK && i < f->noutputs; i++)
        if (out[i]) s = em_force(out[i]);
    em_status e = em_lazy_end();
    return finish_outputs(f, s == EM_OK ? e : s, out);
}

static void lock(em_compiled *f) { pthread_mutex_lock(&f->lock); }
static void unlock(em_compiled *f) { pthread_mutex_unlock(&f->lock); }

/* What f owns (entries, their graphs, guards and backend states, and what
 * those keep from later calls) is allocated with the allocator em_compile
 * ran under, whatever allocator a call runs under, so that
 * em_compiled_free frees it all with that one (docs/memory.md).  The
 * call's own tensors (fn's, the outputs) stay the caller's.  Returns the
 * caller's allocator, to restore. */
static const em_allocator *use_own_alloc(const em_compiled *f) {
    const em_allocator *caller = em_get_allocator();
    em_set_allocator(f->alloc);
    return caller;
}

static void log_entry(const em_compiled *f, const jit_entry *e) {
    if (f->log.flags & JIT_LOG_GRAPH) {
        jit_logf(&f->log, JIT_LOG_GRAPH, "captured graph of %s (entry %d):", f->name,
                 f->entries.n);
        tr_print(e->graph, f->log.f);
    }
    if (f->log.flags & JIT_LOG_GUARDS) {
        jit_logf(&f->log, JIT_LOG_GUARDS, "guards of %s (entry %d):", f->name, f->entries.n);
        gd_print(e->guards, f->log.f);
    }
    fflush(f->log.f);
}

/* EMBER_RECORD: appends a new entry to the warmup list.  A failure is
 * logged once and does not fail the call. */
static void record_entry(em_compiled *f, const jit_entry *e) {
    jit_record_entry(f->record, &f->record_failed, &f->log, f->name, e);
}

/* ---- dry traces: fn recorded at other sizes, computing nothing ---- */

/* Each op gives a tensor of its meta without storage: what fn does at
 * those sizes, at the cost of its shape inference.  A random draw is
 * refused (the generator's state must not move), so is an in-place write
 * (its tensor must change once, when the call computes), and a host read breaks
 * the recording as in any trace. */
static em_tensor *dry_op(void *ud, const em_op_call *c, const em_meta *m) {
    (void)ud;
    if (em_op_table[c->op].attrs & A_RNG) {
        em_error(EM_ERR_UNSUPPORTED, "a dry trace draws no random numbers");
        return NULL;
    }
    if (em_op_table[c->op].kind == EM_KIND_UPDATE) {
        em_error(EM_ERR_UNSUPPORTED, "a dry trace writes no tensor in place");
        return NULL;
    }
    em_meta tm = *m;
    if (em_op_table[c->op].kind != EM_KIND_VIEW) { /* a new tensor is contiguous */
        em_contiguous_strides(tm.ndim, tm.sizes, tm.strides);
        tm.offset = 0;
    }
    return em_tensor_adopt(em_tensor_meta_only(&tm));
}

typedef struct dry_call {
    em_compiled *f;
    const double *scalars;
} dry_call;

/* jit_retrace's trace for em_compile: fn run under a recorder whose ops
 * compute nothing, on inputs of metas m without storage; the graph after
 * the passes every entry's graph gets. */
static tr_graph *dry_trace(void *ud, const em_meta *m) {
    const dry_call *dc = ud;
    em_compiled *f = dc->f;
    em_tensor *in[MAX_ARGS] = {0}, *out[MAX_ARGS] = {0};
    bool ok = true;
    for (int i = 0; i < f->ninputs && ok; i++) ok = (in[i] = em_tensor_meta_only(&m[i])) != NULL;
    tr_graph *g = NULL;
    em_scope_begin();
    tr_recorder *r = ok ? tr_record_begin_with(f->ninputs, in, (const char *const *)f->input_names,
                                               (em_dispatch_hook){.fn = dry_op})
                        : NULL;
    if (r && f->fn(f->ctx, in, dc->scalars, out) == EM_OK) {
        char why[256];
        g = tr_record_end(r, f->noutputs, out, why, sizeof why);
    } else {
        tr_record_abort(r);
    }
    em_scope_end();
    for (int i = 0; i < f->ninputs; i++) em_release(in[i]);
    if (g && tr_optimize(g, f->verify) != EM_OK) {
        tr_graph_free(g);
        g = NULL;
    }
    em_clear_error(); /* what failed there is not the call's error */
    return g;
}

/* The dims of size 1 or more a dynamic hint (jit_dyn_hint_get) proposes
 * for new entry e, the function's first of its structure, into mask;
 * false: no hint, or none of those dims here. */
static bool hinted(const em_compiled *f, const jit_entry *e, em_tensor *const *in, uint32_t *mask) {
    if (!jit_dyn_hint_get(f->env.cache, e->backend->name, e->graph, mask)) return false;
    bool any = false;
    for (int i = 0; i < f->ninputs; i++) {
        uint32_t want = mask[i];
        mask[i] = 0;
        for (int d = 0; d < in[i]->ndim; d++)
            if ((want >> d & 1) && in[i]->sizes[d] >= 1) mask[i] |= 1u << d;
        any |= mask[i] != 0;
    }
    return any;
}

/* Builds an entry from a recorded graph (which it takes); the dims in mask
 * (a mask per input, or NULL) may become dynamic, prev being the entry
 * that differed only in sizes (NULL: forced).  Async: the entry is
 * returned before its compile finishes. */
static jit_entry *make_entry(em_compiled *f, tr_graph *g, em_tensor *const *in,
                             const double *scalars, const uint32_t *mask, const jit_entry *prev,
                             const int64_t *reads, int nreads) {
    jit_entry *e = jit_entry_new(g, jit_backend_for_graph(f->backend, g), NULL);
    if (!e) tr_graph_free(g);
    jit_dyn *dyn = e ? jit_dyn_new(f->ninputs) : NULL;
    if (!dyn || tr_optimize(g, f->verify) != EM_OK ||
        !(e->guards = gd_build(g, in, scalars, f->nscalars, f->watch, f->nwatch)))
        goto fail;
    dry_call dc = {f, scalars};
    jit_retrace rt = {dry_trace, &dc, reads, nreads};
    uint32_t hint[MAX_ARGS];
    if (!mask && f->dynamic == 0 && hinted(f, e, in, hint)) mask = hint;
    if (mask) jit_entry_make_dynamic(&f->own, e, in, mask, prev, &rt, dyn);
    if (jit_entry_compile(&f->own, e, dyn) == EM_OK) return e; /* it takes dyn */
    dyn = NULL;
fail:
    jit_dyn_free(dyn);
    jit_entry_free(e);
    return NULL;
}

/* Whether fn's trace records its ops without computing them (through lazy
 * mode's hook): as lazy_trace says, by default when an input is on a GPU.
 * An eager trace there compiles one NVRTC kernel for each distinct op it
 * meets (tens of milliseconds each) before the graph's fused kernels;
 * recorded lazily, the first call compiles only the fused ones.  Not with
 * async compile, whose first call must not wait for a compile. */
static bool trace_lazily(const em_compiled *f, em_tensor *const *in) {
    if (f->async || f->lazy_trace < 0) return false;
    if (f->lazy_trace > 0) return true;
    for (int i = 0; i < f->ninputs; i++)
        if (in[i]->device.type == EM_CUDA) return true;
    return false;
}

static em_status run_entry(em_compiled *f, jit_entry *e, bool ready, bool follows,
                           void *spec, em_tensor *const *in, const double *scalars,
                           em_tensor **out);

/* Whether g draws random numbers or writes a tensor in place: what its
 * trace did once already, and running it again would do twice. */
static bool has_effects(const tr_graph *g) {
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].kind == TR_CALL &&
            (g->nodes[i].op == EM_OP_RAND || g->nodes[i].op == EM_OP_RANDN ||
             em_op_table[g->nodes[i].op].kind == EM_KIND_UPDATE))
            return true;
    return false;
}

/* After a lazy trace: the first call's outputs from the new entry e, in
 * place of the pending ones in out (never computed then).  Left pending,
 * for lazy mode to compute when read, where e would not give them exactly
 * as an eager run: random draws and in-place writes (made once already,
 * while tracing) or a dynamic entry. */
static void outputs_from_entry(em_compiled *f, jit_entry *e, em_tensor *const *in,
                               const double *scalars, em_tensor **out) {
    if (!e->ready || e->dynamic || has_effects(e->graph)) return;
    em_tensor *res[MAX_ARGS];
    if (run_entry(f, e, true, e->follows, NULL, in, scalars, res) != EM_OK) {
        em_clear_error(); /* the pending outputs still hold the values' recipe */
        return;
    }
    for (int i = 0; i < f->noutputs; i++) out[i] = res[i];
}

/* Computes the outputs a lazy trace left pending: em_call returns values,
 * and an error shows at the call. */
static em_status realize_outputs(const em_compiled *f, em_tensor **out) {
    em_status s = EM_OK;
    for (int i = 0; i < f->noutputs && s == EM_OK; i++)
        if (out[i] && !out[i]->storage) s = em_realize(out[i]);
    return s;
}

/* Whether a trace on these inputs is dry: its ops are recorded without
 * being computed (dry_op, as in a retrace at other sizes) and the call's
 * results come from the new entry, so that the trace holds none of fn's
 * intermediates (an eager trace of a 10,000-node chain on [64, 256] kept
 * 650 MB of them alive until the call returned) and nothing is computed
 * twice.  The default for CPU inputs (lazy_trace 0; a GPU's is the lazy
 * trace); a dry trace that reads a value, draws random numbers or fails
 * is done again eagerly (fn then runs twice). */
static bool trace_dry(const em_compiled *f, em_tensor *const *in) {
    return !f->async && f->lazy_trace == 0 && !trace_lazily(f, in);
}

/* After a dry trace: the call's outputs from the new entry e (through
 * the table, whose match gives a dynamic entry its sizes), or from fn run
 * eagerly (not recorded) where e cannot give them. */
static em_status outputs_of_dry(em_compiled *f, jit_entry *e, em_tensor *const *in,
                                const double *scalars, em_tensor **out) {
    em_tensor *res[MAX_ARGS];
    void *spec = NULL;
    bool declined;
    if (e->ready && jit_table_find(&f->own, &f->entries, in, scalars, &spec, &declined) == e &&
        run_entry(f, e, true, e->follows, spec, in, scalars, res) == EM_OK) {
        for (int i = 0; i < f->noutputs; i++) out[i] = res[i];
        return EM_OK;
    }
    em_clear_error();
    return f->fn(f->ctx, in, scalars, out);
}

/* Runs fn while recording (lazily, dry, or eagerly: *redo set when a dry
 * recording gave no graph, and nothing done); on success adds an entry.
 * Holds f's lock. */
static em_status trace_once(em_compiled *f, em_tensor *const *in, const double *scalars,
                            em_tensor **out, const uint32_t *dyn, const jit_entry *prev, bool dry,
                            bool *redo) {
    em_scope_begin();
    bool lazily = trace_lazily(f, in);
    em_dispatch_hook runner = lazily ? jit_lazy_runner()
                              : dry  ? (em_dispatch_hook){.fn = dry_op}
                                     : (em_dispatch_hook){0};
    const em_allocator *caller = use_own_alloc(f); /* the recorder's graph becomes f's */
    tr_recorder *r = tr_record_begin_with(f->ninputs, in, (const char *const *)f->input_names,
                                          runner);
    em_set_allocator(caller);
    if (!r) {
        em_scope_end();
        return em_last_status();
    }
    em_status s = f->fn(f->ctx, in, scalars, out);
    if (s != EM_OK) {
        tr_record_abort(r);
        if (dry) goto again;
        return finish_outputs(f, s, out);
    }
    char why[256];
    const int64_t *rd;
    int64_t reads[TR_MAX_SIZE_READS];
    int nreads = tr_record_size_reads(r, &rd);
    memcpy(reads, rd, sizeof *reads * (size_t)nreads);
    tr_graph *g = tr_record_end(r, f->noutputs, out, why, sizeof why);
    if (!g && dry) goto again;
    if (!g && why[0]) {
        /* the function ran to the end (eagerly, or lazily: its outputs
         * are computed below): its results are valid */
        f->stats.broken = true;
        f->stats.eager++;
        jit_logf(&f->log, JIT_LOG_BREAKS, "graph break in %s: %s; %s runs as compiled "
                 "segments around its reads from now on (lazy mode)", f->name, why, f->name);
        return finish_outputs(f, lazily ? realize_outputs(f, out) : EM_OK, out);
    }
    caller = use_own_alloc(f);
    jit_entry *e = g ? make_entry(f, g, in, scalars, dyn, prev, reads, nreads) : NULL;
    if (e && !jit_table_add(&f->entries, e)) {
        jit_entry_free(e);
        e = NULL;
    }
    if (e) {
        f->limit.entries = f->entries.n;
        f->stats.traces++;
        f->stats.entries = f->entries.n;
        log_entry(f, e);
        record_entry(f, e);
    }
    em_set_allocator(caller);
    if (!e && em_last_status() == EM_OK)
        em_error(EM_ERR_STATE, "em_call(%s): the traced graph gave no entry", f->name);
    if (!e) return finish_outputs(f, em_last_status(), out);
    if (dry) return finish_outputs(f, outputs_of_dry(f, e, in, scalars, out), out);
    if (lazily) outputs_from_entry(f, e, in, scalars, out);
    return finish_outputs(f, lazily ? realize_outputs(f, out) : EM_OK, out);
again: /* what fn did dry is dropped with the scope; the caller traces again */
    for (int i = 0; i < f->noutputs; i++) out[i] = NULL;
    em_scope_end();
    em_clear_error();
    *redo = true;
    return EM_OK;
}

static em_status trace(em_compiled *f, em_tensor *const *in, const double *scalars,
                       em_tensor **out, const uint32_t *dyn, const jit_entry *prev) {
    bool redo = false;
    if (trace_dry(f, in)) {
        em_status s = trace_once(f, in, scalars, out, dyn, prev, true, &redo);
        if (!redo) return s;
    }
    return trace_once(f, in, scalars, out, dyn, prev, false, &redo);
}

/* Whether entry e's guards fail on this call only because of sizes (same
 * dtypes, devices, ranks, scalars and watched tensors). */
static bool differs_in_sizes_only(const em_compiled *f, const jit_entry *e, em_tensor *const *in,
                                  const double *scalars) {
    const gd_guards *gs = e->guards;
    for (int i = 0; i < gs->ntensors; i++) {
        const gd_tensor *g = &gs->tensors[i];
        if (in[i]->dtype != g->dtype || in[i]->ndim != g->ndim ||
            !em_same_device(in[i]->device, g->device) || in[i]->device.index != g->device.index)
            return false;
    }
    if (gs->nscalars && memcmp(gs->scalars, scalars, sizeof(double) * (size_t)gs->nscalars))
        return false;
    for (int w = 0; w < gs->nwatch; w++)
        if (*gs->watch[w].slot != gs->watch[w].expect) return false;
    return true;
}

/* Whether e was traced at size 0 or 1 in a dim whose size in differs: a
 * poor model of other sizes (such a dim broadcasts or drops out of its
 * graph), so another entry that differs only in sizes is compared first. */
static bool traced_one_where_changed(const jit_entry *e, em_tensor *const *in, int n) {
    for (int i = 0; e->guards && i < n && i < e->guards->ntensors; i++) {
        const gd_tensor *g = &e->guards->tensors[i];
        for (int d = 0; d < g->ndim && d < in[i]->ndim; d++)
            if (g->sizes[d] < 2 && g->sizes[d] != in[i]->sizes[d]) return true;
    }
    return false;
}

/* The dims a new entry makes dynamic (Dynamo's automatic_dynamic_shapes):
 * forced, every dim of size >= 2; automatic, the dims whose sizes differ
 * from the most recent entry that differs only in sizes, plus that
 * entry's own dynamic dims (*prev: that entry).  Sizes 0 and 1 stay
 * specialized.  false: none. */
static bool dynamic_dims(const em_compiled *f, em_tensor *const *in, const double *scalars,
                         uint32_t *dyn, const jit_entry **prev) {
    const jit_entry *near = NULL, *unit = NULL;
    for (int i = 0; f->dynamic == 0 && !near && i < f->entries.n; i++) {
        const jit_entry *e = jit_table_recent(&f->entries, i);
        if (!differs_in_sizes_only(f, e, in, scalars)) continue;
        if (traced_one_where_changed(e, in, f->ninputs)) {
            if (!unit) unit = e;
        } else {
            near = e;
        }
    }
    if (!near) near = unit;
    if (f->dynamic < 0 || (f->dynamic == 0 && !near)) return false;
    *prev = near;
    if (near) jit_dyn_mask(near, in, f->ninputs, false, dyn);
    bool any = false;
    for (int i = 0; i < f->ninputs; i++) {
        uint32_t want = near ? dyn[i] : ~0u; /* forced: every dim */
        dyn[i] = 0;
        for (int d = 0; d < in[i]->ndim; d++)
            if ((want >> d & 1) && in[i]->sizes[d] >= 2) dyn[i] |= 1u << d;
        any |= dyn[i] != 0;
    }
    return any;
}

/* Runs entry e (the lock is released): compiled, or while its compile is
 * pending, op by op (fn itself when attribute sizes follow the sizes: the
 * recorded graph holds the traced ones). */
static em_status run_entry(em_compiled *f, jit_entry *e, bool ready, bool follows,
                           void *spec, em_tensor *const *in, const double *scalars,
                           em_tensor **out) {
    if (!ready && follows) return run_eager(f, in, scalars, out);
    return jit_entry_run(&f->own, e, ready, spec, in, out);
}

static em_status call_entries(em_compiled *f, em_tensor *const *in, const double *scalars,
                              em_tensor **out);

/* What em_call returns for status s: a failure always with
 * em_last_status() equal to it and a message, even when the function
 * returned a status without setting an error, or something after the
 * failure (a backend, a cleanup) replaced or cleared it. */
static em_status call_status(const em_compiled *f, em_status s) {
    if (s == EM_OK || (em_last_status() == s && em_last_error()[0])) return s;
    char last[256]; /* copied: em_error must not format the message into itself */
    snprintf(last, sizeof last, "%s", em_last_error());
    if (last[0])
        return em_error(s, "em_call(%s): %s (%s)", f ? f->name : "?", em_status_name(s), last);
    return em_error(s, "em_call(%s): the function failed with %s without setting an error",
                    f ? f->name : "?", em_status_name(s));
}

static em_status call_under_hook(em_compiled *f, em_tensor *const *in, const double *scalars,
                                 em_tensor **out);

/* With em_compile_options.autocast, the whole call (trace, entries, an
 * eager run) is inside that autocast scope, which the entries' guards
 * then hold. */
em_status em_call(em_compiled *f, em_tensor *const *in, const double *scalars, em_tensor **out) {
    if (!f || f->autocast == EM_F32) return call_under_hook(f, in, scalars, out);
    em_status s = em_autocast_begin(f->autocast);
    if (s != EM_OK) return s;
    s = call_under_hook(f, in, scalars, out);
    em_autocast_end();
    return s;
}

static em_status call_under_hook(em_compiled *f, em_tensor *const *in, const double *scalars,
                                 em_tensor **out) {
    /* The hook is taken through em_set_dispatch_hook, which starts the
     * thread's mode first (EMBER_JIT=1): a mode started later, inside the
     * call, would take over the trace's ops. */
    em_dispatch_hook hook = em_set_dispatch_hook((em_dispatch_hook){0});
    /* Called while this thread records ops (inside another traced
     * function): run fn inline, so the outer graph sees its ops. */
    if (hook.fn && !jit_lazy_hook(&hook)) {
        em_set_dispatch_hook(hook);
        em_status s = check_call(f, in, scalars, out);
        return call_status(f, s == EM_OK ? run_eager(f, in, scalars, out) : s);
    }
    /* In lazy mode a compiled function keeps its own entries: its inputs
     * are computed, and it runs with the lazy hook set aside. */
    em_status s = check_call(f, in, scalars, out);
    if (s == EM_OK) s = call_entries(f, in, scalars, out);
    em_set_dispatch_hook(hook);
    return call_status(f, s);
}

static em_status call_entries(em_compiled *f, em_tensor *const *in, const double *scalars,
                              em_tensor **out) {
    em_status s;
    lock(f);
    f->stats.calls++;
    if (f->stats.broken) {
        f->stats.segmented++;
        unlock(f);
        return run_segments(f, in, scalars, out);
    }
    void *spec = NULL;
    bool declined;
    jit_entry *e = jit_table_find(&f->own, &f->entries, in, scalars, &spec, &declined);
    if (e) {
        bool ready = e->ready, follows = e->follows;
        f->stats.hits++;
        f->stats.pending += !ready;
        unlock(f); /* entries live until em_compiled_free: safe to run unlocked */
        return run_entry(f, e, ready, follows, spec, in, scalars, out);
    }
    /* explain with the entry that came closest to matching */
    for (int i = 0, best = -1; i < f->entries.n; i++) {
        char why[sizeof f->stats.last_failure];
        const jit_entry *x = jit_table_recent(&f->entries, i);
        int passed = gd_explain(x->guards, in, scalars, why, sizeof why);
        /* the guards passed: the dynamic entry's own check refused the sizes */
        const char *d = !why[0] && x->ready && x->dynamic && x->backend->declined
                            ? x->backend->declined(x->state) : "";
        if (!why[0]) snprintf(why, sizeof why, "%s", d[0] ? d : "the sizes need kernels of another structure");
        if (passed > best) {
            best = passed;
            memcpy(f->stats.last_failure, why, sizeof why);
        }
    }
    if (!jit_limit_admit(&f->limit, &f->log, "%s hit the recompile limit (%d entries); calls "
                         "that match no entry run eagerly. Last failure: %s", f->name,
                         f->limit.limit, f->stats.last_failure[0] ? f->stats.last_failure : "none")) {
        f->stats.eager++;
        unlock(f);
        return run_eager(f, in, scalars, out);
    }
    if (f->entries.n > 0)
        jit_logf(&f->log, JIT_LOG_RECOMPILES, "recompiling %s (entry %d of at most %d): %s",
                 f->name, f->entries.n + 1, f->limit.limit, f->stats.last_failure);
    uint32_t dyn[MAX_ARGS];
    const jit_entry *prev = NULL;
    /* sizes a dynamic entry's kernels cannot take get an exact entry */
    bool any = !declined && dynamic_dims(f, in, scalars, dyn, &prev);
    s = trace(f, in, scalars, out, any ? dyn : NULL, prev);
    unlock(f);
    return s;
}

em_status em_compiled_stats(const em_compiled *f, em_compile_stats *out) {
    if (!f) return em_error(EM_ERR_NULL, "em_compiled_stats: the compiled function is NULL");
    if (!out) return em_error(EM_ERR_NULL, "em_compiled_stats: out is NULL");
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    *out = f->stats;
    for (int i = 0; i < f->entries.n; i++) { /* the states count their own replays */
        const jit_entry *e = f->entries.entries[i];
        int64_t c = 0, r = 0;
        if (e->ready && e->state && e->backend->graph_stats) e->backend->graph_stats(e->state, &c, &r);
        out->graphs_captured += c;
        out->graph_replays += r;
        out->eager_entries += __atomic_load_n(&e->eager, __ATOMIC_ACQUIRE);
    }
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return EM_OK;
}

em_status em_compiled_print(const em_compiled *f, int entry, bool dot, FILE *out) {
    if (!f) return em_error(EM_ERR_NULL, "em_compiled_print: the compiled function is NULL");
    if (!out) return em_error(EM_ERR_NULL, "em_compiled_print: out is NULL");
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    em_status s;
    if (entry < 0 || entry >= f->entries.n) {
        s = em_error(EM_ERR_INDEX, "em_compiled_print: entry %d of %d", entry, f->entries.n);
    } else {
        const jit_entry *e = jit_table_recent(&f->entries, entry);
        s = dot ? tr_print_dot(e->graph, out) : tr_print(e->graph, out);
        if (s == EM_OK && !dot) gd_print(e->guards, out);
    }
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return s;
}

em_status em_compiled_save(const em_compiled *f, const char *path) {
    if (!f) return em_error(EM_ERR_NULL, "em_compiled_save: the compiled function is NULL");
    if (!path) return em_error(EM_ERR_NULL, "em_compiled_save: path is NULL");
    if (!*path) return em_error(EM_ERR_ARG, "em_compiled_save: path is empty");
    if (!jit_backend_has_artifacts(f->backend))
        return em_error(EM_ERR_UNSUPPORTED,
                        "em_compiled_save(%s): the %s backend has nothing to compile ahead of time",
                        f->name, f->backend->name);
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    em_status s = EM_OK;
    /* oldest first, as EMBER_RECORD would have appended them; entries of a
     * backend without artifacts (replay) have nothing to warm up */
    for (int i = 0; i < f->entries.n && s == EM_OK; i++) {
        const jit_entry *e = f->entries.entries[i];
        if (e->backend->target)
            s = jit_record_append(path, f->name, e->backend->name, e->graph, e->guards, e->follow);
    }
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return s;
}
